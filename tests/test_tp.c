/* tests/test_tp.c - tensor parallelism's foundation (issue 40): the pp x dp x tp grid and the TP
   collectives (>>tp), over the threads transport.

   - grid: every rank of every (pp, dp, tp, order) with world <= 64 gets a place no other rank
     has, pp_grid_rank_tp finds it again; its pipe, dp, TP groups and tied pair are the groups
     MPI_Comm_split makes from the colours and keys (a stand-in split here: by colour, sorted by
     key), they partition the world, every member of a group holds the same list; tp stays
     innermost in PP_GRID_DP_INNER / PP_GRID_PP_INNER; with tp = 1 the old formulas hold and
     pp_grid_make is pp_grid_make_tp with tp 1. Bad input refused with a message.
   - coll: pp_tp_allreduce, pp_tp_reducescatter and pp_tp_allgather at tp = 2 and 4, f32, f64,
     f16 and bf16, counts 0 .. 1001 (most not multiples of tp): every rank's result has the bits
     of the sequential reference (x_0 + x_1 + ... in TP rank order, in f32 for the half types,
     rounded once), the same bits on a second run; the values are chosen so that another order
     of the sum changes the bits. Then two TP groups at once, strided (PP_GRID_TP_DP_PP: a TP
     group's ranks are 2 apart), on one 8-rank transport.
   - refuse: an integer dtype, NULL buffers, a rank outside the group, counts that differ between
     ranks (PP_ERR_SIZE, not a hang or a wrong sum); a NULL group is one rank (copies).
   - layer: a stage whose layer reaches its TP group through pp_stage_desc.layer_ctx (io->ctx):
     pp = 2 stages x tp = 2, the layer a row-parallel linear (each TP rank half of the inputs,
     its partial product all-reduced, and its input gradient in backward): the loss and every
     rank's weight gradient rows (stage 0's through stage 1's all-reduced input gradient) equal
     the unsplit model's bit for bit (small integer data: every sum exact).
   Negative controls (build/tp-controls): -DPP_TEST_TP_UNORDERED lets each rank sum every copy
   itself, its own first: at tp = 4 the ranks' bits differ ("coll" fails); -DPP_TEST_TP_SPLIT_NO_DP
   colours pp_grid_tp_split by stage alone ("grid" fails wherever dp > 1 and tp > 1).
   Usage: test_tp [grid|coll|refuse|layer]. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "test.h"
#include "tp_data.h"

/* ---- grid ------------------------------------------------------------------------------------- */
#define GW 64
static pp_grid G[GW];

/* The members of colour c, by key then world rank (MPI_Comm_split's order); returns their count. */
static int split_members(const int* color, const int* key, int world, int c, int* out) {
    int n = 0, i, j;
    for (i = 0; i < world; i++)
        if (color[i] == c) out[n++] = i;
    for (i = 1; i < n; i++) /* insertion sort by (key, rank) */
        for (j = i; j > 0 && (key[out[j - 1]] > key[out[j]] || (key[out[j - 1]] == key[out[j]] && out[j - 1] > out[j])); j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

/* kind 0 pipe, 1 dp, 2 tp, 3 tied: the split's groups are the grid's lists, and partition the
   world (tied: the first and last stage ranks). Returns the number of failures. */
static int check_split(int world, int kind, const char* what) {
    static int color[GW], key[GW], seen[GW], mem[GW];
    int r, i, bad = 0;
    for (r = 0; r < world; r++) {
        if (kind == 0) pp_grid_pipe_split(&G[r], &color[r], &key[r]);
        if (kind == 1) pp_grid_dp_split(&G[r], &color[r], &key[r]);
        if (kind == 2) pp_grid_tp_split(&G[r], &color[r], &key[r]);
        if (kind == 3) pp_grid_tied_split(&G[r], &color[r], &key[r]);
        seen[r] = 0;
    }
    for (r = 0; r < world; r++) {
        const pp_grid* g = &G[r];
        const int* list = kind == 0 ? g->pipe : kind == 1 ? g->dp_group : kind == 2 ? g->tp_group : g->tied;
        int want = kind == 0 ? g->pp : kind == 1 ? g->dp : kind == 2 ? g->tp : (g->pp > 1 ? 2 : 1), n;
        if (color[r] < 0) {
            if (kind != 3 || g->pp_rank == 0 || g->pp_rank == g->pp - 1) bad++;
            continue;
        }
        seen[r]++;
        n = split_members(color, key, world, color[r], mem);
        if (n != want) bad++;
        for (i = 0; i < n && i < want; i++) {
            if (mem[i] != list[i]) bad++;
            if (i > 0 && key[mem[i]] == key[mem[i - 1]]) bad++; /* keys distinct: the order is the key's */
        }
    }
    for (r = 0; r < world; r++)
        if (seen[r] != (color[r] >= 0)) bad++;
    if (bad) printf("  split %s: %d mismatches\n", what, bad);
    return bad;
}

static void grid_one(int world, int pp, int tp, int order) {
    static int where[GW];
    int dp = world / pp / tp, r, i, bad = 0;
    pp_error err;
    for (r = 0; r < world; r++) where[r] = -1;
    for (r = 0; r < world; r++) {
        pp_grid* g = &G[r];
        if (pp_grid_make_tp(world, r, pp, tp, (pp_grid_order)order, g, &err) != PP_OK) {
            CHECK(0, "world %d pp %d tp %d order %d rank %d: %s", world, pp, tp, order, r, err.msg);
            return;
        }
        if (g->world != world || g->rank != r || g->pp != pp || g->dp != dp || g->tp != tp) bad++;
        if (g->pp_rank < 0 || g->pp_rank >= pp || g->dp_rank < 0 || g->dp_rank >= dp || g->tp_rank < 0 || g->tp_rank >= tp) {
            bad++;
            continue;
        }
        i = (g->pp_rank * dp + g->dp_rank) * tp + g->tp_rank;
        if (where[i] >= 0) bad++; /* two ranks in one place */
        where[i] = r;
        if (pp_grid_rank_tp(g, g->pp_rank, g->dp_rank, g->tp_rank) != r) bad++;
        if (pp_grid_rank(g, g->pp_rank, g->dp_rank) != r) bad++;
        for (i = 0; i < pp; i++) bad += G[r].pipe[i] != pp_grid_rank_tp(g, i, g->dp_rank, g->tp_rank);
        for (i = 0; i < dp; i++) bad += G[r].dp_group[i] != pp_grid_rank_tp(g, g->pp_rank, i, g->tp_rank);
        for (i = 0; i < tp; i++) bad += G[r].tp_group[i] != pp_grid_rank_tp(g, g->pp_rank, g->dp_rank, i);
        if (g->tied[0] != g->pipe[0] || g->tied[1] != g->pipe[pp - 1]) bad++;
        if (order <= PP_GRID_PP_INNER && g->tp_group[0] != r - g->tp_rank) bad++; /* tp innermost */
        if (tp == 1 && order == PP_GRID_DP_INNER && (g->pp_rank != r / dp || g->dp_rank != r % dp)) bad++;
        if (tp == 1 && order == PP_GRID_PP_INNER && (g->pp_rank != r % pp || g->dp_rank != r / pp)) bad++;
        if (pp_grid_rank_tp(g, pp, 0, 0) != -1 || pp_grid_rank_tp(g, 0, 0, tp) != -1 || pp_grid_rank_tp(g, 0, -1, 0) != -1)
            bad++;
        if (tp == 1) {
            pp_grid o;
            pp_grid_make(world, r, pp, (pp_grid_order)order, &o, &err);
            if (memcmp(&o, g, sizeof o) != 0) bad++;
        }
    }
    /* every member of my groups holds the same lists */
    for (r = 0; r < world; r++)
        for (i = 0; i < tp; i++)
            bad += memcmp(G[G[r].tp_group[i]].tp_group, G[r].tp_group, (size_t)tp * sizeof(int)) != 0;
    for (r = 0; r < world; r++)
        for (i = 0; i < pp; i++) bad += memcmp(G[G[r].pipe[i]].pipe, G[r].pipe, (size_t)pp * sizeof(int)) != 0;
    bad += check_split(world, 0, "pipe") + check_split(world, 1, "dp") + check_split(world, 2, "tp") +
           check_split(world, 3, "tied");
    CHECK(bad == 0, "world %d = pp %d x dp %d x tp %d, order %d: %d inconsistencies", world, pp, dp, tp, order, bad);
}

static void grid_checks(void) {
    pp_grid g;
    pp_error err;
    int world, pp, tp, order, n = 0;
    for (world = 1; world <= GW; world++)
        for (pp = 1; pp <= world; pp++)
            for (tp = 1; tp <= world / pp; tp++)
                if (world % (pp * tp) == 0)
                    for (order = 0; order <= 5; order++, n++) grid_one(world, pp, tp, order);
    printf("grid: %d (world, pp, tp, order) cases\n", n);
    /* a hand-filled grid from before tp (tp 0) still answers */
    memset(&g, 0, sizeof g);
    g.pp = 2;
    g.dp = 3;
    CHECK(pp_grid_rank(&g, 1, 2) == 5, "a grid with tp = 0 counts it as 1");
    err.msg[0] = 0;
    CHECK(pp_grid_make_tp(12, 0, 2, 5, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID && strstr(err.msg, "multiple"),
          "world not a multiple of pp * tp: %s", err.msg);
    CHECK(pp_grid_make_tp(12, 0, 2, 0, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID && strstr(err.msg, "tp = 0"),
          "tp = 0: %s", err.msg);
    CHECK(pp_grid_make_tp(12, 0, 2, 2, (pp_grid_order)6, &g, &err) == PP_ERR_INVALID && strstr(err.msg, "order"),
          "unknown order: %s", err.msg);
    CHECK(pp_grid_make_tp(12, 12, 2, 2, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"),
          "rank outside: %s", err.msg);
    CHECK(pp_grid_make_tp(2 * PP_MAX_RANKS, 0, 1, 2 * PP_MAX_RANKS, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID &&
              strstr(err.msg, "PP_MAX_RANKS"),
          "tp over PP_MAX_RANKS: %s", err.msg);
    CHECK(pp_grid_make_tp(4, 0, 2, 2, PP_GRID_DP_INNER, NULL, &err) == PP_ERR_INVALID, "NULL grid");
}

/* ---- collectives -------------------------------------------------------------------------------- */
typedef struct coll_world {
    pp_threads* w;
    int world, tp;             /* world ranks; TP groups of tp (pp_grid_make_tp, pp = 1) */
    pp_grid_order order;
    /* results: [op][dtype][count][rank] */
    unsigned char* out;
    int bad[MAXN];
    char msg[MAXN][sizeof(((pp_error*)0)->msg)];
} coll_world;

#define OUTSZ (MAXC * 8)
static unsigned char* out_at(coll_world* C, int op, int d, int c, int r) {
    return C->out + ((((size_t)op * 4 + (size_t)d) * NCOUNTS + (size_t)c) * MAXN + (size_t)r) * OUTSZ;
}

static pp_result coll_rank(int r, void* user) {
    coll_world* C = (coll_world*)user;
    pp_transport t = pp_threads_transport(C->w, r);
    pp_grid g;
    pp_group grp;
    pp_error err;
    static unsigned char bufs[MAXN][2][OUTSZ];
    unsigned char* a = bufs[r][0];
    unsigned char* b = bufs[r][1];
    int d, c, seed;
    pp_result rc = pp_grid_make_tp(C->world, r, 1, C->tp, C->order, &g, &err);
    if (rc != PP_OK) return rc;
    grp.t = &t;
    grp.ranks = g.tp_group;
    grp.n_ranks = g.tp;
    grp.timeout_s = 20;
    seed = 100 * (g.dp_rank + 1) + g.tp_rank; /* each TP group its own inputs */
    for (d = 0; d < 4; d++)
        for (c = 0; c < (int)NCOUNTS; c++) {
            size_t n = COUNTS[c], es = pp_dtype_size(DTYPES[d]), off, len;
            pp_tp_block(n, g.tp, g.tp_rank, &off, &len);
            fill(a, DTYPES[d], seed, n);
            if ((rc = pp_tp_allreduce(&grp, a, n, DTYPES[d], &err)) != PP_OK) goto fail;
            memcpy(out_at(C, 0, d, c, r), a, n * es);
            fill(a, DTYPES[d], seed, n);
            memset(b, 0xee, OUTSZ);
            if ((rc = pp_tp_reducescatter(&grp, a, b, n, DTYPES[d], &err)) != PP_OK) goto fail;
            memcpy(out_at(C, 1, d, c, r), b, len * es);
            /* in place: the result into send's own block */
            if ((rc = pp_tp_reducescatter(&grp, a, a + off * es, n, DTYPES[d], &err)) != PP_OK) goto fail;
            if (memcmp(a + off * es, b, len * es) != 0) {
                snprintf(C->msg[r], sizeof C->msg[r], "reduce-scatter in place differs (%s, count %zu)",
                         pp_dtype_name(DTYPES[d]), n);
                C->bad[r]++;
            }
            /* all-gather the reduce-scatter's blocks: the all-reduce's result; and in place */
            memset(a, 0xee, OUTSZ);
            if ((rc = pp_tp_allgather(&grp, b, a, n, DTYPES[d], &err)) != PP_OK) goto fail;
            memcpy(out_at(C, 2, d, c, r), a, n * es);
            memset(a, 0xee, OUTSZ);
            memcpy(a + off * es, b, len * es);
            if ((rc = pp_tp_allgather(&grp, a + off * es, a, n, DTYPES[d], &err)) != PP_OK) goto fail;
            if (memcmp(a, out_at(C, 2, d, c, r), n * es) != 0) {
                snprintf(C->msg[r], sizeof C->msg[r], "all-gather in place differs (%s, count %zu)", pp_dtype_name(DTYPES[d]),
                         n);
                C->bad[r]++;
            }
        }
    return PP_OK;
fail:
    snprintf(C->msg[r], sizeof C->msg[r], "%s", err.msg);
    C->bad[r]++;
    return rc;
}

/* One run of every collective; the results checked against the reference. Returns the results. */
static unsigned char* coll_run(int world, int tp, pp_grid_order order) {
    static unsigned char ref[OUTSZ];
    coll_world C;
    pp_error err;
    int r, d, c, op;
    memset(&C, 0, sizeof C);
    C.world = world;
    C.tp = tp;
    C.order = order;
    C.out = (unsigned char*)calloc((size_t)3 * 4 * NCOUNTS * MAXN, OUTSZ);
    CHECK(C.out && pp_threads_create(world, &C.w, &err) == PP_OK, "setup");
    if (!C.out || !C.w) return C.out;
    CHECK(pp_threads_run(world, coll_rank, &C, &err) == PP_OK, "world %d tp %d: %s", world, tp, err.msg);
    for (r = 0; r < world; r++) CHECK(C.bad[r] == 0, "world %d tp %d rank %d: %s", world, tp, r, C.msg[r]);
    CHECK(pp_threads_pending(C.w) == 0, "world %d tp %d: messages left over", world, tp);
    pp_threads_destroy(C.w);
    for (r = 0; r < world; r++) {
        pp_grid g;
        int seeds[MAXN], i;
        pp_grid_make_tp(world, r, 1, tp, order, &g, &err);
        for (i = 0; i < tp; i++) seeds[i] = 100 * (g.dp_rank + 1) + i;
        for (d = 0; d < 4; d++)
            for (c = 0; c < (int)NCOUNTS; c++) {
                size_t n = COUNTS[c], es = pp_dtype_size(DTYPES[d]), off, len;
                reference(ref, DTYPES[d], seeds, tp, n);
                pp_tp_block(n, tp, g.tp_rank, &off, &len);
                if (g.tp_rank > 0)
                    CHECK(memcmp(out_at(&C, 0, d, c, r), out_at(&C, 0, d, c, g.tp_group[0]), n * es) == 0,
                          "all-reduce %s count %zu tp %d: world rank %d's bits differ from its TP rank 0's (%d)",
                          pp_dtype_name(DTYPES[d]), n, tp, r, g.tp_group[0]);
                for (op = 0; op < 3; op++) {
                    const unsigned char* got = out_at(&C, op, d, c, r);
                    int ok = op == 1 ? memcmp(got, ref + off * es, len * es) == 0 : memcmp(got, ref, n * es) == 0;
                    CHECK(ok, "%s %s count %zu tp %d: world rank %d (TP rank %d) differs from the sequential sum",
                          op == 0 ? "all-reduce" : op == 1 ? "reduce-scatter" : "all-gather", pp_dtype_name(DTYPES[d]), n,
                          tp, r, g.tp_rank);
                }
            }
    }
    return C.out;
}

static void coll_checks(void) {
    static const int TPS[2] = {2, 4};
    size_t off, len;
    int i;
    /* the block rule: 10 over 4 is 3, 3, 2, 2 */
    pp_tp_block(10, 4, 0, &off, &len);
    CHECK(off == 0 && len == 3, "block 0 of 10 / 4");
    pp_tp_block(10, 4, 2, &off, &len);
    CHECK(off == 6 && len == 2, "block 2 of 10 / 4");
    pp_tp_block(10, 4, 3, &off, &len);
    CHECK(off == 8 && len == 2, "block 3 of 10 / 4");
    pp_tp_block(2, 4, 3, &off, &len);
    CHECK(off == 2 && len == 0, "block 3 of 2 / 4: empty, at the end");
    for (i = 0; i < 2; i++) {
        unsigned char* first = coll_run(TPS[i], TPS[i], PP_GRID_DP_INNER);
        unsigned char* again = coll_run(TPS[i], TPS[i], PP_GRID_DP_INNER);
        CHECK(first && again && memcmp(first, again, (size_t)3 * 4 * NCOUNTS * MAXN * OUTSZ) == 0,
              "tp %d: the second run's bits differ from the first's", TPS[i]);
        free(first);
        free(again);
    }
    /* two strided TP groups of 4 at once on one transport of 8 */
    free(coll_run(8, 4, PP_GRID_TP_DP_PP));
}

/* ---- refusals ------------------------------------------------------------------------------------ */
typedef struct refuse_world {
    pp_threads* w;
    pp_result rc[2];
    char msg[2][sizeof(((pp_error*)0)->msg)];
} refuse_world;

static pp_result refuse_rank(int r, void* user) {
    refuse_world* R = (refuse_world*)user;
    pp_transport t = pp_threads_transport(R->w, r);
    pp_group g = {NULL, NULL, 0, 2};
    float buf[12] = {0};
    pp_error err;
    g.t = &t;
    err.msg[0] = 0;
    R->rc[r] = pp_tp_allreduce(&g, buf, r == 0 ? 10 : 12, PP_F32, &err);
    snprintf(R->msg[r], sizeof R->msg[r], "%s", err.msg);
    return PP_OK;
}

static void refuse_checks(void) {
    pp_threads* w = NULL;
    pp_transport t;
    pp_group g = {NULL, NULL, 0, 1};
    int32_t i32[4] = {1, 2, 3, 4};
    float f[4] = {1, 2, 3, 4}, h[4];
    int outside[2] = {0, 5}, twice[2] = {0, 0}, others[2] = {1, 2};
    refuse_world R;
    pp_error err;
    CHECK(pp_threads_create(4, &w, &err) == PP_OK, "threads");
    t = pp_threads_transport(w, 0);
    g.t = &t;
    err.msg[0] = 0;
    CHECK(pp_tp_allreduce(&g, i32, 4, PP_I32, &err) == PP_ERR_INVALID && strstr(err.msg, "i32"), "i32: %s", err.msg);
    CHECK(pp_tp_allgather(&g, f, NULL, 4, PP_F32, &err) == PP_ERR_INVALID && strstr(err.msg, "NULL"), "NULL: %s", err.msg);
    CHECK(pp_tp_reducescatter(&g, NULL, f, 4, PP_F32, &err) == PP_ERR_INVALID, "NULL send");
    CHECK(pp_tp_allreduce(&g, f, 4, (pp_dtype)99, &err) == PP_ERR_INVALID && strstr(err.msg, "unknown"), "bad dtype: %s",
          err.msg);
    CHECK(pp_tp_allreduce(&g, f, (size_t)-1, PP_F32, &err) == PP_ERR_INVALID && strstr(err.msg, "overflow"), "%s", err.msg);
    g.ranks = outside;
    g.n_ranks = 2;
    CHECK(pp_tp_allreduce(&g, f, 4, PP_F32, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"), "outside: %s", err.msg);
    g.ranks = twice;
    CHECK(pp_tp_allreduce(&g, f, 4, PP_F32, &err) == PP_ERR_INVALID && strstr(err.msg, "twice"), "twice: %s", err.msg);
    g.ranks = others;
    CHECK(pp_tp_allreduce(&g, f, 4, PP_F32, &err) == PP_ERR_INVALID && strstr(err.msg, "not in"), "not in: %s", err.msg);
    CHECK(pp_threads_pending(w) == 0, "a refusal sent nothing");
    pp_threads_destroy(w);
    /* alone: a NULL group copies */
    CHECK(pp_tp_allreduce(NULL, f, 4, PP_F32, &err) == PP_OK && f[3] == 4, "NULL group all-reduce");
    CHECK(pp_tp_reducescatter(NULL, f, h, 4, PP_F32, &err) == PP_OK && memcmp(f, h, sizeof f) == 0, "NULL group rs");
    memset(h, 0, sizeof h);
    CHECK(pp_tp_allgather(NULL, f, h, 4, PP_F32, &err) == PP_OK && memcmp(f, h, sizeof f) == 0, "NULL group ag");
    /* counts that differ between the ranks: refused by the transport's size check, no hang */
    memset(&R, 0, sizeof R);
    CHECK(pp_threads_create(2, &R.w, &err) == PP_OK, "threads");
    pp_threads_run(2, refuse_rank, &R, &err);
    CHECK(R.rc[0] == PP_ERR_SIZE && R.rc[1] == PP_ERR_SIZE, "counts 10 and 12: %s (%s) / %s (%s)", pp_result_str(R.rc[0]),
          R.msg[0], pp_result_str(R.rc[1]), R.msg[1]);
    pp_threads_destroy(R.w);
}

/* ---- a layer that reaches its TP group through pp_stage_desc.layer_ctx --------------------------- */
/* Model: layer 0 (stage 0) and layer 1 (stage 1) row-parallel linears x (rows, K) -> y (rows, N),
   W (K, N) split by rows over tp = 2 (TP rank t holds W[t * KH .. t * KH + KH), (KH, N)): each
   rank multiplies its half of x's columns by its rows of W and the partial products are
   all-reduced; backward: dW_t = x_t^T dy locally, dx = dy W_t^T on the rank's columns, zeros
   elsewhere, all-reduced. Layer 2 (stage 1) the squared error. Small integer data: every sum is
   exact, so the split model equals the unsplit one bit for bit, whatever the association. */
#define LK 4
#define LKH 2
#define LROWS 8
#define LM 2
typedef struct lw {
    float w[2][LKH * LK]; /* layers 0 and 1: this TP rank's rows of W, (KH, N = K) */
} lw;
typedef struct tp_ctx { /* what layer_ctx points to: one per rank */
    pp_group tp;
    int tp_rank;
} tp_ctx;

static int l_fwd(const void* weights, int layer, pp_layer_io* io) {
    const tp_ctx* c = (const tp_ctx*)io->ctx;
    const lw* w = (const lw*)weights;
    const float* x = (const float*)io->in[0].data; /* (rows, K) */
    int64_t r, rows = io->in[0].rows;
    int k, n;
    pp_error err;
    if (!c) return 3;
    if (layer == 2) {
        const float* t = (const float*)io->mb->targets; /* (rows, K) */
        float acc = 0;
        for (r = 0; r < rows; r++)
            for (k = 0; k < LK; k++) acc += (x[r * LK + k] - t[r * LK + k]) * (x[r * LK + k] - t[r * LK + k]);
        io->loss = acc / (float)rows;
        return 0;
    }
    {
        float* y = (float*)io->out[0].data; /* (rows, N) */
        for (r = 0; r < rows; r++)
            for (n = 0; n < LK; n++) {
                float a = 0;
                for (k = 0; k < LKH; k++) a += x[r * LK + c->tp_rank * LKH + k] * w->w[layer][k * LK + n];
                y[r * LK + n] = a;
            }
        return pp_tp_allreduce(&c->tp, y, (size_t)rows * LK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static int l_bwd(const void* weights, void* grads, int layer, pp_layer_io* io) {
    const tp_ctx* c = (const tp_ctx*)io->ctx;
    const lw* w = (const lw*)weights;
    lw* g = (lw*)grads;
    const float* x = (const float*)io->in[0].data;
    float* dx = (float*)io->d_in[0].data;
    int64_t r, rows = io->in[0].rows;
    int k, n;
    pp_error err;
    if (!c) return 3;
    if (layer == 2) {
        const float* t = (const float*)io->mb->targets;
        for (r = 0; r < rows; r++)
            for (k = 0; k < LK; k++) dx[r * LK + k] = 2.0f * (x[r * LK + k] - t[r * LK + k]) / (float)rows * io->mb->loss_scale;
        return 0;
    }
    {
        const float* dy = (const float*)io->d_out[0].data;
        for (k = 0; k < LKH; k++)
            for (n = 0; n < LK; n++) {
                float a = 0;
                for (r = 0; r < rows; r++) a += x[r * LK + c->tp_rank * LKH + k] * dy[r * LK + n];
                g->w[layer][k * LK + n] += a;
            }
        if (!dx) return 0; /* the first stage's input: no gradient (the same on every TP rank) */
        for (r = 0; r < rows; r++)
            for (k = 0; k < LK; k++) {
                float a = 0;
                int kk = k - c->tp_rank * LKH;
                if (kk >= 0 && kk < LKH)
                    for (n = 0; n < LK; n++) a += dy[r * LK + n] * w->w[layer][kk * LK + n];
                dx[r * LK + k] = a;
            }
        return pp_tp_allreduce(&c->tp, dx, (size_t)rows * LK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static void l_desc(const void* weights, int layer, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                   pp_layer_desc* d) {
    (void)weights;
    (void)mb;
    (void)n_in;
    d->n_out = layer == 2 ? 0 : 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = LK;
    d->out[0].dtype = PP_F32;
    d->n_params = layer == 2 ? 0 : LK * LK;
}

static const char* l_name(int layer) { return layer == 0 ? "rowpar0" : layer == 1 ? "rowpar1" : "loss"; }

static float LX[LROWS * LK], LT[LROWS * LK], LW[2][LK * LK];

typedef struct layer_world {
    pp_threads* tpw;           /* every TP group's messages: world ranks */
    pp_threads* pipes[2];      /* one pipeline per tp rank: stage ranks */
    pp_schedule sc;
    int first[3];
    lw w[4], g[4];
    tp_ctx ctx[4];
    float loss[4];
    pp_result rc[4];
    char msg[4][sizeof(((pp_error*)0)->msg)];
} layer_world;

static pp_result layer_rank(int r, void* user) {
    layer_world* L = (layer_world*)user;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_batch b;
    pp_step_stats stats;
    pp_transport tpt = pp_threads_transport(L->tpw, r);
    pp_grid g;
    pp_error err;
    pp_result rc = pp_grid_make_tp(4, r, 2, 2, PP_GRID_DP_INNER, &g, &err);
    if (rc != PP_OK) return L->rc[r] = rc;
    L->ctx[r].tp.t = &tpt;
    L->ctx[r].tp.ranks = g.tp_group;
    L->ctx[r].tp.n_ranks = g.tp;
    L->ctx[r].tp.timeout_s = 20;
    L->ctx[r].tp_rank = g.tp_rank;
    memset(&d, 0, sizeof d);
    d.model.name = "rowpar";
    d.model.n_layers = 3;
    d.model.forward = l_fwd;
    d.model.backward = l_bwd;
    d.model.describe = l_desc;
    d.model.layer_name = l_name;
    d.weights = &L->w[r];
    d.grads = &L->g[r];
    d.schedule = &L->sc;
    d.partition = L->first;
    d.rank = g.pp_rank;
    d.transport = pp_threads_transport(L->pipes[g.tp_rank], g.pp_rank);
    d.timeout_s = 20;
    d.layer_ctx = &L->ctx[r]; /* every layer call gets it as io->ctx */
    memset(&b, 0, sizeof b);
    b.m = LM;
    b.input.data = LX;
    b.input.rows = LROWS;
    b.input.cols = LK;
    b.input.dtype = PP_F32;
    b.targets = LT;
    b.target_row_bytes = LK * sizeof(float);
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        snprintf(L->msg[r], sizeof L->msg[r], "%s", err.msg);
        return L->rc[r] = rc;
    }
    if ((rc = pp_stage_step(st, &b, &stats)) != PP_OK) snprintf(L->msg[r], sizeof L->msg[r], "%s", pp_stage_error(st));
    L->loss[r] = stats.loss;
    pp_stage_destroy(st);
    return L->rc[r] = rc;
}

static void layer_checks(void) {
    static pp_action acts[64];
    static layer_world L;
    float h0[LROWS * LK], h1[LROWS * LK], d1[LROWS * LK], dh0[LROWS * LK], gw[2][LK * LK], loss = 0, part;
    pp_error err;
    int i, j, k, n, r, t, mb;
    memset(&L, 0, sizeof L);
    for (i = 0; i < LROWS * LK; i++) {
        LX[i] = (float)((i * 7) % 5 - 2);
        LT[i] = (float)((i * 3) % 7 - 3);
    }
    for (i = 0; i < LK * LK; i++) {
        LW[0][i] = (float)((i * 5) % 5 - 2);
        LW[1][i] = (float)((i * 3) % 5 - 2);
    }
    /* world rank r = pp_rank * 2 + tp_rank (PP_GRID_DP_INNER, dp = 1): its rows of both layers */
    for (r = 0; r < 4; r++)
        for (i = 0; i < 2; i++) memcpy(L.w[r].w[i], LW[i] + (r % 2) * LKH * LK, sizeof L.w[r].w[i]);
    L.first[0] = 0, L.first[1] = 1, L.first[2] = 3;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 2, 1, LM, acts, 64, &L.sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_threads_create(4, &L.tpw, &err) == PP_OK && pp_threads_create(2, &L.pipes[0], &err) == PP_OK &&
              pp_threads_create(2, &L.pipes[1], &err) == PP_OK,
          "threads");
    CHECK(pp_threads_run(4, layer_rank, &L, &err) == PP_OK, "pp 2 x tp 2: %s (%s / %s / %s / %s)", err.msg, L.msg[0],
          L.msg[1], L.msg[2], L.msg[3]);
    pp_threads_destroy(L.tpw);
    pp_threads_destroy(L.pipes[0]);
    pp_threads_destroy(L.pipes[1]);
    /* the unsplit model, micro-batch by micro-batch (exact: every value a small dyadic) */
    memset(gw, 0, sizeof gw);
    for (mb = 0; mb < LM; mb++) {
        const float* x = LX + mb * (LROWS / LM) * LK;
        const float* tg = LT + mb * (LROWS / LM) * LK;
        int rows = LROWS / LM;
        for (r = 0; r < rows; r++)
            for (n = 0; n < LK; n++) {
                float a = 0;
                for (k = 0; k < LK; k++) a += x[r * LK + k] * LW[0][k * LK + n];
                h0[r * LK + n] = a;
            }
        for (r = 0; r < rows; r++)
            for (n = 0; n < LK; n++) {
                float a = 0;
                for (k = 0; k < LK; k++) a += h0[r * LK + k] * LW[1][k * LK + n];
                h1[r * LK + n] = a;
            }
        part = 0;
        for (i = 0; i < rows * LK; i++) part += (h1[i] - tg[i]) * (h1[i] - tg[i]);
        loss += part / (float)rows / (float)LM;
        for (i = 0; i < rows * LK; i++) d1[i] = 2.0f * (h1[i] - tg[i]) / (float)rows * (1.0f / LM);
        for (k = 0; k < LK; k++)
            for (n = 0; n < LK; n++)
                for (r = 0; r < rows; r++) gw[1][k * LK + n] += h0[r * LK + k] * d1[r * LK + n];
        for (r = 0; r < rows; r++)
            for (k = 0; k < LK; k++) {
                float a = 0;
                for (n = 0; n < LK; n++) a += d1[r * LK + n] * LW[1][k * LK + n];
                dh0[r * LK + k] = a;
            }
        for (k = 0; k < LK; k++)
            for (n = 0; n < LK; n++)
                for (r = 0; r < rows; r++) gw[0][k * LK + n] += x[r * LK + k] * dh0[r * LK + n];
    }
    for (r = 0; r < 4; r++) {
        CHECK(L.rc[r] == PP_OK, "world rank %d: %s", r, L.msg[r]);
        t = r % 2;
        j = r / 2; /* the stage's layer: 0 on stage 0, 1 on stage 1 */
        CHECK(memcmp(L.g[r].w[j], gw[j] + t * LKH * LK, sizeof L.g[r].w[j]) == 0,
              "world rank %d (pp %d, tp %d): layer %d's gradient rows differ from the unsplit model's", r, j, t, j);
    }
    CHECK(L.loss[2] == loss && L.loss[3] == loss, "loss %g / %g, unsplit %g", (double)L.loss[2], (double)L.loss[3],
          (double)loss);
    for (i = 0, j = 0; i < LK * LK; i++) j += gw[0][i] != 0 && gw[1][i] != 0;
    CHECK(loss > 0 && j > LK, "a loss (%g) and gradients (%d non-zero pairs) that say something", (double)loss, j);
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "grid")) grid_checks();
    if (!only || !strcmp(only, "coll")) coll_checks();
    if (!only || !strcmp(only, "refuse")) refuse_checks();
    if (!only || !strcmp(only, "layer")) layer_checks();
    return TEST_DONE("test_tp");
}
