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
   - boundary: boundaries split across the TP group (pp_stage_desc.tp): every schedule kind,
     p = 1..4, tp 1, 2, 4, dense and packed batches of odd row counts, LOCAL and BROADCAST shapes,
     replicated boundaries (split, gathered) and sharded ones (sequence parallel: as they are),
     in half the cases three tensors a boundary (i32 positions each layer checks, an f32 side path):
     losses and gradients bit-identical to the run with the split off, the bytes each rank sends
     between stages exactly its slices' (pp_tp_boundary_bytes; the transports' counters and
     pp_step_stats), the gathers' bytes exact. A sample (test_pick), all under PP_TEST_FULL.
     Refusals: a split under AUTO or PER_MESSAGE, an out_tp that is no layout. A grid with one
     rank not splitting: every rank fails the step (the plan check names the split). The
     simulator and pp_plan_try: a split transfer costs comm / tp + tp_gather.
   Negative controls (build/tp-controls): -DPP_TEST_TP_UNORDERED lets each rank sum every copy
   itself, its own first: at tp = 4 the ranks' bits differ ("coll" fails); -DPP_TEST_TP_SPLIT_NO_DP
   colours pp_grid_tp_split by stage alone ("grid" fails wherever dp > 1 and tp > 1);
   -DPP_TEST_TP_NO_GATHER skips the boundary gather, -DPP_TEST_TP_EVEN_SLICE cuts rows / tp per
   rank and drops the remainder ("boundary" fails: gradients, and bytes with odd row counts);
   -DPP_TEST_TP_NO_STEP_TAG keeps the fixed TP tags inside a step ("stale" fails: wrong, PP_OK).
   - stale: after a step failed mid-TP traffic, the next step over the same TP world (below).
   Usage: test_tp [grid|coll|refuse|layer|boundary|stale]. */
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
    int undeclared;            /* 1: the stage is not given the group (pp_stage_desc.tp NULL) */
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
    d.tp = L->undeclared ? NULL : &L->ctx[r].tp; /* the stage agrees its outcome over the group */
    d.tp_whole = 1;           /* the boundaries whole, as these layers' checks take them */
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

/* The same layers, the group only in the layer context (pp_stage_desc.tp NULL): the stage could
   not agree its outcome over the group, so a layer failing on one TP rank after its last
   collective would leave the other pipeline returning PP_OK. The layers' first TP collective is
   refused on every rank instead, naming pp_stage_desc.tp, and no rank hangs. The control
   tp-ctl-undeclared-ok (PP_TEST_TP_UNDECLARED_OK: allowed, as before) runs the step to PP_OK. */
static void undeclared_checks(void) {
    static pp_action acts[64];
    static layer_world L;
    pp_error err;
    int r, named = 0;
    memset(&L, 0, sizeof L);
    L.undeclared = 1;
    for (r = 0; r < 4; r++) memset(&L.w[r], 0, sizeof L.w[r]);
    L.first[0] = 0, L.first[1] = 1, L.first[2] = 3;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 2, 1, LM, acts, 64, &L.sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_threads_create(4, &L.tpw, &err) == PP_OK && pp_threads_create(2, &L.pipes[0], &err) == PP_OK &&
              pp_threads_create(2, &L.pipes[1], &err) == PP_OK,
          "threads");
    pp_threads_run(4, layer_rank, &L, &err);
    for (r = 0; r < 4; r++) {
        CHECK(L.rc[r] != PP_OK, "undeclared: world rank %d's step returned PP_OK with its stage given no TP group", r);
        named += strstr(L.msg[r], "pp_stage_desc.tp") != NULL;
    }
    CHECK(named >= 2, "undeclared: the refusal names pp_stage_desc.tp on both TP ranks of the first stage: %s / %s",
          L.msg[0], L.msg[1]);
    pp_threads_destroy(L.tpw);
    pp_threads_destroy(L.pipes[0]);
    pp_threads_destroy(L.pipes[1]);
}

/* ---- boundaries split across the TP group (pp_stage_desc.tp, pp_layer_desc.out_tp) ------------- */
/* BN hidden layers, each a row-parallel linear over the TP group (x (rows, BK) -> y (rows, BK), W
   split by rows, the partial products all-reduced), then a squared-error loss. With sp (sequence
   parallelism) every hidden layer's output is SHARDED: the partial products reduce-scattered,
   each TP rank keeping its elements' block (pp_tp_block over rows * BK: a [len, 1] tensor), which
   the next layer all-gathers first; else REPLICATED, which the pipeline splits when
   pp_stage_desc.tp is set. Each case runs twice, the split on and off: losses and gradient bits
   must agree, and the bytes each rank sent between stages must be exactly its slices' (the
   transports' counters and pp_step_stats), the gathers' bytes exactly pp_tp_boundary_bytes'. */
#include "tp_boundary.h"

#define BMAXW 16
typedef struct bnd_world {
    int p, tp, split, sp, extra;
    int off_rank;  /* >= 0: this world rank leaves the split off (a misconfigured grid) */
    double to;     /* deadlines (0: 20 s) */
    pp_shape_policy shapes;
    pp_threads* tpw;
    pp_threads* pipes[4];
    pp_schedule sc;
    int first[2 * 4 + 2];
    pp_batch b;
    bw w[BMAXW], g[BMAXW];
    tpb_ctx ctx[BMAXW];
    pp_step_stats stats[BMAXW];
    float eval_loss[BMAXW];     /* an evaluation after the step (pp_stage_eval) */
    uint64_t step_sent[BMAXW];  /* the pipe transport's counter after the training step */
    int group[BMAXW][4];
    pp_result rc[BMAXW];
    char msg[BMAXW][sizeof(((pp_error*)0)->msg)];
} bnd_world;

/* World rank r's TP group (over tpt, NULL: none; its members the ranks of its stage) in its layer
   context, and the stage desc every mode gives it: its model, weights, gradients, schedule,
   partition, pipe transport and deadline to. */
static void bnd_desc(bnd_world* W, int r, const pp_transport* tpt, double to, pp_stage_desc* d) {
    int pr = r / W->tp, t = r % W->tp, i;
    for (i = 0; i < W->tp; i++) W->group[r][i] = pr * W->tp + i;
    W->ctx[r].tp.t = tpt;
    W->ctx[r].tp.ranks = W->group[r];
    W->ctx[r].tp.n_ranks = W->tp;
    W->ctx[r].tp.timeout_s = to;
    W->ctx[r].tp_rank = t;
    memset(d, 0, sizeof *d);
    b_model(&d->model);
    d->weights = &W->w[r];
    d->grads = &W->g[r];
    d->schedule = &W->sc;
    d->partition = W->first;
    d->rank = pr;
    d->transport = pp_threads_transport(W->pipes[t], pr);
    d->timeout_s = to;
    d->layer_ctx = &W->ctx[r];
}

static pp_result bnd_rank(int r, void* user) {
    bnd_world* W = (bnd_world*)user;
    int pr = r / W->tp, t = r % W->tp;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_transport tpt = pp_threads_transport(W->tpw, r);
    pp_error err;
    pp_result rc;
    bnd_desc(W, r, W->tp > 1 ? &tpt : NULL, W->to > 0 ? W->to : 20, &d);
    d.shapes = W->shapes;
    d.tp = &W->ctx[r].tp; /* off (or this rank misconfigured): boundaries whole, the outcome still agreed */
    d.tp_whole = !W->split || r == W->off_rank;
    d.allow_nonfinite_loss = 1; /* a broken split (the negative controls) gives wrong numbers, not a failed step */
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        snprintf(W->msg[r], sizeof W->msg[r], "%s", err.msg);
        return W->rc[r] = rc;
    }
    if ((rc = pp_stage_step(st, &W->b, &W->stats[r])) != PP_OK)
        snprintf(W->msg[r], sizeof W->msg[r], "%s", pp_stage_error(st));
    pp_threads_counters(W->pipes[t], pr, &W->step_sent[r], NULL);
    if (rc == PP_OK && W->off_rank < 0) {
        pp_step_stats es;
        if ((rc = pp_stage_eval(st, &W->b, NULL, &es)) != PP_OK)
            snprintf(W->msg[r], sizeof W->msg[r], "eval: %.480s", pp_stage_error(st));
        W->eval_loss[r] = es.loss;
    }
    pp_stage_destroy(st);
    return W->rc[r] = rc;
}

/* One run; the pipes' transport counters (bytes each pipeline rank sent in the training step)
   into sent[r]. */
static int bnd_run(bnd_world* W, uint64_t* sent, const char* what) {
    int world = W->p * W->tp, r, t, ok = 1;
    pp_error err;
    memset(W->g, 0, sizeof W->g);
    memset(W->rc, 0, sizeof W->rc);
    for (r = 0; r < world; r++) {
        b_weights(&W->w[r], W->tp, r % W->tp, W->sp);
        W->w[r].extra = W->extra;
    }
    if (pp_threads_create(world, &W->tpw, &err) != PP_OK) return 0;
    for (t = 0; t < W->tp; t++)
        if (pp_threads_create(W->p, &W->pipes[t], &err) != PP_OK) return 0;
    if (pp_threads_run(world, bnd_rank, W, &err) != PP_OK) ok = 0;
    for (r = 0; r < world; r++) {
        sent[r] = W->step_sent[r];
        if (W->rc[r] != PP_OK && W->off_rank < 0) {
            ok = 0;
            CHECK(0, "%s: world rank %d: %s", what, r, W->msg[r]);
        }
    }
    pp_threads_destroy(W->tpw);
    for (t = 0; t < W->tp; t++) pp_threads_destroy(W->pipes[t]);
    return ok;
}

/* Refused with a message: a split under AUTO or PER_MESSAGE shapes (create), a describe whose
   out_tp is neither layout (the step). */
static void boundary_refusals(void) {
    static bw w, g;
    static pp_action acts[64];
    pp_threads* tw = NULL;
    pp_transport tt;
    pp_group grp;
    int ranks[2] = {0, 1}, first[2] = {0, BN + 1}, pol;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_schedule sc;
    pp_step_stats stats;
    pp_batch b;
    pp_error err;
    pp_result rc;
    tp_ctx c;
    CHECK(pp_threads_create(2, &tw, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 1, 1, 2, acts, 64, &sc, &err) == PP_OK, "%s", err.msg);
    tt = pp_threads_transport(tw, 0);
    grp.t = &tt, grp.ranks = ranks, grp.n_ranks = 2, grp.timeout_s = 5;
    memset(&c, 0, sizeof c);
    w.tp = 1, w.tp_rank = 0, w.sp = 0;
    memset(&d, 0, sizeof d);
    b_model(&d.model);
    d.weights = &w;
    d.grads = &g;
    d.schedule = &sc;
    d.partition = first;
    d.layer_ctx = &c;
    d.tp = &grp;
    for (pol = PP_SHAPES_PER_MESSAGE; pol <= PP_SHAPES_AUTO; pol++) {
        d.shapes = (pp_shape_policy)pol;
        err.msg[0] = 0;
        rc = pp_stage_create(&d, &st, &err);
        CHECK(rc == PP_ERR_UNSUPPORTED && strstr(err.msg, "LOCAL or BROADCAST"), "shapes %d with a TP split: %s (%s)", pol,
              pp_result_str(rc), err.msg);
        if (rc == PP_OK) pp_stage_destroy(st);
    }
    d.shapes = PP_SHAPES_LOCAL;
    d.tp = NULL;
    b_batch(&b, 2, 6);
    CHECK(pp_stage_create(&d, &st, &err) == PP_OK, "%s", err.msg);
    if (st) {
        b_bad_out_tp = 7;
        rc = pp_stage_step(st, &b, &stats);
        b_bad_out_tp = 0;
        CHECK(rc == PP_ERR_INVALID && strstr(pp_stage_error(st), "out_tp = 7"), "out_tp 7: %s (%s)", pp_result_str(rc),
              pp_stage_error(st));
        pp_stage_destroy(st);
    }
    {   /* pp_pipeline: the template's tp would be every rank's: refused, set in rank_setup */
        pp_pipeline_desc pd;
        pp_pipeline* pl = NULL;
        memset(&pd, 0, sizeof pd);
        b_model(&pd.model);
        pd.weights = &w;
        pd.grads = &g;
        pd.p = 1;
        pd.m = 2;
        pd.stage.tp = &grp;
        err.msg[0] = 0;
        rc = pp_pipeline_create(&pd, &pl, &err);
        CHECK(rc == PP_ERR_INVALID && strstr(err.msg, "rank_setup"), "pp_pipeline with stage.tp: %s (%s)", pp_result_str(rc),
              err.msg);
        if (rc == PP_OK) pp_pipeline_destroy(pl);
    }
    pp_threads_destroy(tw);
}

/* The simulator and the planner count a split transfer as comm / tp + tp_gather; tp 0 and 1 as comm. */
static void boundary_cost_checks(void) {
    static pp_action acts[512];
    static pp_layer_cost lc[8];
    pp_schedule sc;
    pp_sim_cost c;
    pp_sim_result a, b;
    pp_plan_desc pd;
    pp_plan pa, pb;
    int first[9], l, tp;
    double m0 = 0;
    pp_error err;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 4, 1, 8, acts, 512, &sc, &err) == PP_OK, "%s", err.msg);
    for (tp = 0; tp <= 4; tp++) {
        memset(&c, 0, sizeof c);
        c.comm = 3.0;
        c.tp = tp;
        c.tp_gather = 0.25;
        CHECK(pp_simulate(&sc, &c, &a, NULL, &err) == PP_OK, "%s", err.msg);
        c.comm = tp > 1 ? 3.0 / tp + 0.25 : 3.0;
        c.tp = 0;
        c.tp_gather = 0;
        CHECK(pp_simulate(&sc, &c, &b, NULL, &err) == PP_OK, "%s", err.msg);
        CHECK(a.makespan == b.makespan && a.bubble == b.bubble, "tp %d: makespan %g, with comm %g %g", tp, a.makespan,
              c.comm, b.makespan);
        if (tp == 0) m0 = a.makespan;
    }
    CHECK(a.makespan < m0, "tp 4: a shorter step (%g) than unsplit (%g)", a.makespan, m0);
    memset(&c, 0, sizeof c);
    c.tp = -1;
    CHECK(pp_simulate(&sc, &c, &a, NULL, &err) == PP_ERR_INVALID, "tp -1 refused");
    c.tp = 2, c.tp_gather = -1;
    CHECK(pp_simulate(&sc, &c, &a, NULL, &err) == PP_ERR_INVALID, "tp_gather -1 refused");
    for (l = 0; l < 8; l++) lc[l].f = 1, lc[l].b = 2, lc[l].mem = 1, lc[l].out = 1;
    memset(&pd, 0, sizeof pd);
    pd.layers = lc, pd.n_layers = 8, pd.p = 4, pd.m = 8, pd.comm = 2.0, pd.tp = 2, pd.tp_gather = 0.5;
    CHECK(pp_plan_try(&pd, PP_SCHED_1F1B, 1, NULL, &pa, first, &err) == PP_OK, "%s", err.msg);
    pd.comm = 1.5, pd.tp = 0, pd.tp_gather = 0;
    CHECK(pp_plan_try(&pd, PP_SCHED_1F1B, 1, NULL, &pb, first, &err) == PP_OK, "%s", err.msg);
    CHECK(pa.makespan == pb.makespan, "plan: tp 2 comm 2 gather 0.5 %g, comm 1.5 %g", pa.makespan, pb.makespan);
}

/* pp 2 x tp 2 where world rank 3 (stage rank 1, TP rank 1) leaves the split off: its neighbour sees
   it in the plan check, and every rank fails the step (none hangs, none reports success). */
static void boundary_mismatch(void) {
    static bnd_world W;
    static pp_action acts[64];
    uint64_t sent[BMAXW];
    pp_error err;
    int r, n_tp = 0;
    memset(&W, 0, sizeof W);
    W.p = 2, W.tp = 2, W.split = 1, W.off_rank = 3, W.to = 1;
    W.shapes = PP_SHAPES_LOCAL;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 64, &W.sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(BN + 1, 2, W.first, &err) == PP_OK, "%s", err.msg);
    b_batch(&W.b, 4, 13);
    bnd_run(&W, sent, "mismatch");
    for (r = 0; r < 4; r++) {
        CHECK(W.rc[r] != PP_OK, "world rank %d: the step succeeded with a neighbour that does not split", r);
        n_tp += strstr(W.msg[r], "differently across TP") != NULL;
    }
    if (getenv("PP_TEST_VERBOSE"))
        for (r = 0; r < 4; r++) printf("mismatch: world rank %d: %s: %s\n", r, pp_result_str(W.rc[r]), W.msg[r]);
    CHECK(n_tp >= 1, "the plan check names the TP split: %s / %s / %s / %s", W.msg[0], W.msg[1], W.msg[2], W.msg[3]);
}

static void boundary_checks(void) {
    static bnd_world W;
    static bw g_off[BMAXW];
    static pp_step_stats s_off[BMAXW];
    static float e_off[BMAXW];
    static pp_action acts[4096];
    static const int tps[3] = {1, 2, 4};
    uint64_t sent_on[BMAXW], sent_off[BMAXW];
    int32_t cu[BMAXR + 1], cub[BMAXR + 16];
    pp_microbatch mbs[16];
    pp_error err;
    long i = 0, ran = 0, fails0 = _t_fail, split_cases = 0;
    int kind, p, ti, packed, shp, sp, r, k, l;
    b_fill();
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p++)
            for (ti = 0; ti < 3; ti++)
                for (packed = 0; packed < 2; packed++)
                    for (shp = 0; shp < 2; shp++)
                        for (sp = 0; sp < 2; sp++) {
                            int tp = tps[ti], v = pp_schedule_kind_v((pp_schedule_kind)kind, 2), m = 2 * p, world = p * tp;
                            int rows, n_seqs = 0, S, t, mb;
                            char what[160];
                            size_t need;
                            if (sp && tp == 1) continue;
                            if (!test_pick(i++, TEST_SANITIZED ? 13 : 7)) continue; /* coprime to the 20 cases of a (kind, p) */
                            need = pp_schedule_size((pp_schedule_kind)kind, p, v, m);
                            if (need == 0 || need > sizeof acts / sizeof acts[0] || p * v > BN) continue;
                            if (_t_fail > fails0) break; /* one failed case says it (and a control ends soon) */
                            memset(&W, 0, sizeof W);
                            W.off_rank = -1;
                            W.p = p, W.tp = tp, W.sp = sp;
                            W.extra = (kind + p + packed) % 2; /* half the cases: three tensors a boundary */
                            W.shapes = shp ? PP_SHAPES_BROADCAST : PP_SHAPES_LOCAL;
                            if (pp_schedule_make((pp_schedule_kind)kind, p, v, m, acts, need, &W.sc, &err) != PP_OK) {
                                CHECK(0, "schedule %s p %d: %s", pp_schedule_name((pp_schedule_kind)kind), p, err.msg);
                                continue;
                            }
                            S = W.sc.n_stages;
                            CHECK(pp_partition_uniform(BN + 1, S, W.first, &err) == PP_OK, "%s", err.msg);
                            /* odd row counts: dense 4m + 3 or m + 1 rows; packed 2m + 1 sequences of 1 .. 5 tokens */
                            if (packed) {
                                n_seqs = 2 * m + 1;
                                cu[0] = 0;
                                for (k = 0; k < n_seqs; k++) cu[k + 1] = cu[k] + 1 + (k * 3 + p) % 5;
                                rows = cu[n_seqs];
                            } else {
                                rows = kind % 2 ? 4 * m + 3 : m + 1; /* 1 or 2 rows a micro-batch: empty slices at tp 4 */
                            }
                            b_batch(&W.b, m, rows);
                            W.b.cu_seqlens = packed ? cu : NULL;
                            W.b.n_seqs = n_seqs;
                            W.b.split = PP_SPLIT_TOKENS;
                            CHECK(pp_batch_split(&W.b, mbs, cub, &err) == PP_OK, "%s", err.msg);
                            snprintf(what, sizeof what, "%s p %d tp %d %s %s%s, %d rows", pp_schedule_name((pp_schedule_kind)kind),
                                     p, tp, packed ? "packed" : "dense", shp ? "BROADCAST" : "LOCAL", sp ? " sharded" : "", rows);
                            W.split = 0;
                            if (!bnd_run(&W, sent_off, what)) continue;
                            memcpy(g_off, W.g, sizeof g_off);
                            memcpy(s_off, W.stats, sizeof s_off);
                            memcpy(e_off, W.eval_loss, sizeof e_off);
                            W.split = 1;
                            if (!bnd_run(&W, sent_on, what)) continue;
                            ran++;
                            split_cases += tp > 1 && !sp;
                            for (r = 0; r < world; r++) {
                                const pp_action* la = pp_schedule_rank(&W.sc, r / tp);
                                uint64_t want_on = 0, want_off = 0, want_g = 0;
                                size_t a_on, a_off, g_on, len;
                                t = r % tp;
                                CHECK(memcmp(W.g[r].w, g_off[r].w, sizeof W.g[r].w) == 0,
                                      "%s: world rank %d (stage rank %d, TP rank %d): gradients differ with the split", what, r,
                                      r / tp, t);
                                for (k = 0, l = 0; k < (int)(sizeof W.g[r].w / sizeof(float)); k++) l += (&W.g[r].w[0][0])[k] != 0;
                                CHECK(l > 0 || W.first[S - 1] == BN, "%s: world rank %d: no gradient at all", what, r);
                                CHECK(!W.stats[r].has_loss || W.stats[r].loss > 0, "%s: world rank %d: loss %g", what, r,
                                      (double)W.stats[r].loss);
                                CHECK(memcmp(&W.eval_loss[r], &e_off[r], sizeof(float)) == 0 &&
                                          (!W.stats[r].has_loss || W.eval_loss[r] > 0),
                                      "%s: world rank %d: evaluation loss %.9g with the split, %.9g without", what, r,
                                      (double)W.eval_loss[r], (double)e_off[r]);
                                CHECK(W.stats[r].has_loss == s_off[r].has_loss &&
                                          memcmp(&W.stats[r].loss, &s_off[r].loss, sizeof(float)) == 0,
                                      "%s: world rank %d: loss %.9g with the split, %.9g without", what, r,
                                      (double)W.stats[r].loss, (double)s_off[r].loss);
                                /* every transfer of micro-batch mb: its slice (or shard) */
                                for (k = 0; k < W.sc.per_rank; k++) {
                                    const pp_action* a = &la[k];
                                    int snd = (a->op == PP_OP_F && a->stage < S - 1 && a->next_rank != r / tp) ||
                                              (a->op == PP_OP_B && a->stage > 0 && a->prev_rank != r / tp);
                                    int rcv = (a->op == PP_OP_F && a->stage > 0 && a->prev_rank != r / tp) ||
                                              (a->op == PP_OP_B && a->stage < S - 1 && a->next_rank != r / tp);
                                    mb = a->mb;
                                    if (sp) {
                                        len = b_shard(mbs[mb].rows, tp, t, NULL) * sizeof(float);
                                        a_on = a_off = len, g_on = 0;
                                    } else {
                                        pp_tp_boundary_bytes(mbs[mb].rows, BK * sizeof(float), tp, t, &a_on, &g_on);
                                        pp_tp_boundary_bytes(mbs[mb].rows, BK * sizeof(float), 1, 0, &a_off, NULL);
                                    }
                                    if (W.extra) { /* positions (F only: no gradient) and the side path */
                                        size_t x_on, x_off, x_g;
                                        if (a->op == PP_OP_F) {
                                            pp_tp_boundary_bytes(mbs[mb].rows, 3 * sizeof(int32_t), tp, t, &x_on, &x_g);
                                            pp_tp_boundary_bytes(mbs[mb].rows, 3 * sizeof(int32_t), 1, 0, &x_off, NULL);
                                            a_on += x_on, a_off += x_off, g_on += x_g;
                                        }
                                        pp_tp_boundary_bytes(mbs[mb].rows, 2 * sizeof(float), tp, t, &x_on, &x_g);
                                        pp_tp_boundary_bytes(mbs[mb].rows, 2 * sizeof(float), 1, 0, &x_off, NULL);
                                        a_on += x_on, a_off += x_off, g_on += x_g;
                                    }
                                    if (snd) want_on += a_on, want_off += a_off;
                                    if (rcv) want_g += g_on;
                                }
                                CHECK(sent_on[r] - sent_off[r] == want_on - want_off &&
                                          W.stats[r].bytes_sent - W.stats[r].meta_bytes_sent - W.stats[r].agree_bytes == want_on &&
                                          s_off[r].bytes_sent - s_off[r].meta_bytes_sent - s_off[r].agree_bytes == want_off,
                                      "%s: world rank %d: sent %llu bytes between stages with the split (transport %llu), "
                                      "%llu without (transport %llu); want %llu and %llu",
                                      what, r, (unsigned long long)(W.stats[r].bytes_sent - W.stats[r].meta_bytes_sent -
                                                                    W.stats[r].agree_bytes),
                                      (unsigned long long)sent_on[r],
                                      (unsigned long long)(s_off[r].bytes_sent - s_off[r].meta_bytes_sent - s_off[r].agree_bytes),
                                      (unsigned long long)sent_off[r], (unsigned long long)want_on, (unsigned long long)want_off);
                                CHECK(W.stats[r].meta_msgs_sent == s_off[r].meta_msgs_sent &&
                                          W.stats[r].meta_bytes_sent == s_off[r].meta_bytes_sent &&
                                          (shp || W.stats[r].meta_msgs_sent == 0),
                                      "%s: world rank %d: %llu shape messages with the split, %llu without (LOCAL: none)", what,
                                      r, (unsigned long long)W.stats[r].meta_msgs_sent,
                                      (unsigned long long)s_off[r].meta_msgs_sent);
                                CHECK(W.stats[r].tp_gather_bytes == want_g && s_off[r].tp_gather_bytes == 0,
                                      "%s: world rank %d: %llu bytes sent gathering, want %llu", what, r,
                                      (unsigned long long)W.stats[r].tp_gather_bytes, (unsigned long long)want_g);
                            }
                        }
    printf("boundary: %ld of %ld (kind, p, tp, packing, shapes, sharding) cases bit-identical with the split on and off, "
           "exact bytes (%ld split)%s\n", ran, i, split_cases, _t_fail > fails0 ? " - FAILED" : "");
    CHECK(ran > 0 && split_cases > 0, "the sample ran %ld cases, %ld of them split", ran, split_cases);
    boundary_refusals();
    boundary_cost_checks();
    boundary_mismatch();
}

/* ---- stale ------------------------------------------------------------------------------------
   A failed step's TP leftovers: pp 2 x tp 2 over threads (one world for the TP groups, one per
   pipeline), boundaries split. Step 1: world rank 1 (stage rank 0, TP rank 1) fails in the last
   layer of its stage, forward of micro-batch 1, after that layer's all-reduce; its pipeline
   aborts, and its TP peers go on until their TP deadline: the all-reduce blocks and gather
   slices they sent it (and stage 1's TP rank 1) stay queued in the TP world. As after any failed
   step the pipelines' worlds are reset; the TP world, never aborted, is not. Step 2 (no fault)
   must fail on every rank or equal a clean first step bit for bit: the library tags a step's TP
   messages with the step (pp_stage_step), so it does, and it must. -DPP_TEST_TP_NO_STEP_TAG
   keeps the fixed tags: step 2 takes the leftovers and reports wrong gradients as PP_OK. */
static pp_stage* SST[BMAXW];
static pp_transport STP[BMAXW];

static pp_result stale_rank(int r, void* user) {
    bnd_world* W = (bnd_world*)user;
    pp_result rc;
    if (!SST[r]) {
        pp_stage_desc d;
        pp_error err;
        STP[r] = pp_threads_transport(W->tpw, r);
        bnd_desc(W, r, &STP[r], W->to, &d);
        d.shapes = PP_SHAPES_LOCAL;
        d.tp = &W->ctx[r].tp;
        d.allow_nonfinite_loss = 1;
        if ((rc = pp_stage_create(&d, &SST[r], &err)) != PP_OK) {
            snprintf(W->msg[r], sizeof W->msg[r], "%s", err.msg);
            return W->rc[r] = rc;
        }
    }
    W->msg[r][0] = 0;
    if ((rc = pp_stage_step(SST[r], &W->b, &W->stats[r])) != PP_OK)
        snprintf(W->msg[r], sizeof W->msg[r], "%s", pp_stage_error(SST[r]));
    return W->rc[r] = rc;
}

static void stale_checks(void) {
    static bnd_world W;
    static bw g_ref[BMAXW];
    static pp_step_stats s_ref[BMAXW];
    static pp_action acts[64];
    static const char* what[4] = {"", "the gathers' slices", "the next layer's all-reduce blocks", "nothing"};
    pp_error err;
    int run, r, t, world = 4, n_ok, n_ok1, same;
    b_fill();
    memset(&W, 0, sizeof W);
    W.p = 2, W.tp = 2, W.split = 1, W.off_rank = -1, W.to = 1;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 64, &W.sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(BN + 1, 2, W.first, &err) == PP_OK, "%s", err.msg);
    b_batch(&W.b, 4, 16); /* 4 rows a micro-batch: every message of a kind the same size */
    /* 0: the reference, one clean step. Then a failed step and a clean one, the fault in world
       rank 1's last layer of stage 0 (left behind: gather slices sent to it and to stage 1's TP
       rank 1), or in its layer 1 (world rank 0's layer 2 all-reduce block to it). Run 3: the
       fault in world rank 1's layer 0 backward of the last micro-batch, after every TP message
       of its step: the other pipeline finished the step, and must still fail it (the TP group's
       verdict, _pp_tp_agree; PP_TEST_NO_TP_AGREE: PP_OK there, build/tp-controls). */
    for (run = 0; run < 4; run++) {
        memset(W.g, 0, sizeof W.g);
        memset(W.rc, 0, sizeof W.rc);
        for (r = 0; r < world; r++) b_weights(&W.w[r], W.tp, r % W.tp, 0);
        CHECK(pp_threads_create(world, &W.tpw, &err) == PP_OK, "%s", err.msg);
        for (t = 0; t < W.tp; t++) CHECK(pp_threads_create(W.p, &W.pipes[t], &err) == PP_OK, "%s", err.msg);
        n_ok1 = 0;
        if (run > 0) {
            if (run < 3) W.w[1].fail_layer = run == 1 ? W.first[1] - 1 : 1, W.w[1].fail_mb = 1;
            else W.w[1].fail_bwd = 1, W.w[1].fail_mb = 3;
            pp_threads_run(world, stale_rank, &W, &err);
            for (r = 0; r < world; r++) {
                n_ok1 += W.rc[r] == PP_OK;
                if (getenv("PP_TEST_VERBOSE")) printf("stale %d: step 1: world rank %d: %s: %s\n", run, r, pp_result_str(W.rc[r]), W.msg[r]);
            }
            CHECK(W.rc[1] == PP_ERR_LAYER, "stale %d: step 1 on world rank 1: %s (%s), want the layer's error", run,
                  pp_result_str(W.rc[1]), W.msg[1]);
            CHECK(n_ok1 == 0, "stale %d: the failed step returned PP_OK on %d of %d ranks (another pipeline of the TP group "
                  "failed it)", run, n_ok1, world);
            for (t = 0; t < W.tp; t++) pp_threads_reset(W.pipes[t]); /* not the TP world: never aborted */
            W.w[1].fail_layer = W.w[1].fail_bwd = 0;
            memset(W.g, 0, sizeof W.g);
            memset(W.rc, 0, sizeof W.rc);
            memset(W.stats, 0, sizeof W.stats);
        }
        pp_threads_run(world, stale_rank, &W, &err);
        for (r = 0; r < world; r++) {
            pp_stage_destroy(SST[r]);
            SST[r] = NULL;
        }
        pp_threads_destroy(W.tpw);
        for (t = 0; t < W.tp; t++) pp_threads_destroy(W.pipes[t]);
        if (run == 0) {
            for (r = 0; r < world; r++) CHECK(W.rc[r] == PP_OK, "stale: the reference step, world rank %d: %s", r, W.msg[r]);
            memcpy(g_ref, W.g, sizeof g_ref);
            memcpy(s_ref, W.stats, sizeof s_ref);
            continue;
        }
        for (r = 0, n_ok = 0, same = 1; r < world; r++) {
            int eq = memcmp(W.g[r].w, g_ref[r].w, sizeof W.g[r].w) == 0 && W.stats[r].has_loss == s_ref[r].has_loss &&
                     memcmp(&W.stats[r].loss, &s_ref[r].loss, sizeof(float)) == 0;
            n_ok += W.rc[r] == PP_OK;
            same &= eq;
            CHECK(W.rc[r] != PP_OK || eq,
                  "stale %d: the step after the failed one returned PP_OK on world rank %d (stage rank %d, TP rank %d) with "
                  "other gradients or loss than a clean step's (loss %.9g, want %.9g): the failed step's %s were taken",
                  run, r, r / W.tp, r % W.tp, (double)W.stats[r].loss, (double)s_ref[r].loss, what[run]);
            CHECK(W.rc[r] == PP_OK, "stale %d: the step after the failed one, world rank %d: %s (%s)", run, r,
                  pp_result_str(W.rc[r]), W.msg[r]);
        }
        CHECK(n_ok == 0 || n_ok == world, "stale %d: the step after the failed one: PP_OK on %d of %d ranks", run, n_ok, world);
        printf("stale: a layer failing on TP rank 1 leaves %s behind: step 1 failed on %d of %d ranks, step 2 PP_OK on %d, "
               "%s\n", what[run], world - n_ok1, world, n_ok, n_ok == world && same ? "bit-exact" : n_ok ? "WRONG" : "failed");
    }
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "grid")) grid_checks();
    if (!only || !strcmp(only, "coll")) coll_checks();
    if (!only || !strcmp(only, "refuse")) refuse_checks();
    if (!only || !strcmp(only, "layer")) layer_checks();
    if (!only || !strcmp(only, "undeclared")) undeclared_checks();
    if (!only || !strcmp(only, "boundary")) boundary_checks();
    if (!only || !strcmp(only, "stale")) stale_checks();
    return TEST_DONE("test_tp");
}
