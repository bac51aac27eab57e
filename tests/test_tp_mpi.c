/* tests/test_tp_mpi.c - the pp x dp x tp grid and the TP collectives across processes, over MPI
   (pipeline_mpi.h). Run under mpirun with 8 processes (make test: build/mpi-tp-np8); any world
   with a factor 2 runs (pp = 2, tp = 2 or 4 where it divides, dp the rest).

   - split: MPI_Comm_split with pp_grid_tp_split's (and pipe, dp, tied) colours and keys makes
     communicators whose members, in MPI's rank order, are g.tp_group (g.pipe, g.dp_group,
     g.tied): MPI's own split agrees with the grid.
   - coll: pp_tp_allreduce, pp_tp_reducescatter and pp_tp_allgather over pp_mpi_transport of
     the TP communicator (ranks NULL: the communicator's ranks are the TP ranks), f32, f64, f16,
     bf16, counts 0 .. 1001: every rank's result has the bits of the sequential sum
     (tests/tp_data.h), and TP rank 0 of each group runs the same collectives over the threads
     transport in its own process: the MPI result is bit-identical to the threads one.
   - mpi grid: pp_mpi_grid_create_tp's grid is pp_grid_make_tp's, and its g.tp transport (ranks
     by tp rank) all-reduces with the sequential sum's bits; at tp = 1, g.tp is NULL.
   - boundary: a pipeline of pp = 2 stages per (dp, tp) over g.pipe, boundaries split across
     g.tp (pp_stage_desc.tp; tests/tp_boundary.h's model, packed odd row counts, 1F1B and
     interleaved, LOCAL and BROADCAST): loss and gradients bit-identical to the split off, and
     the bytes each rank sends between stages exactly its slices' (pp_step_stats and
     pp_mpi_counters of the pipe transport).
   Each rank counts its own checks; rank 0 prints the world's totals. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline_mpi.h"
#include "test.h"
#include "tp_data.h"
#include "tp_boundary.h"

#define OUTSZ (MAXC * 8)

static int W_RANK, W_SIZE;

/* The members of comm by their rank in it, as world ranks. */
static int members(MPI_Comm comm, int* out) {
    int n = 0;
    if (comm == MPI_COMM_NULL) return 0;
    MPI_Comm_size(comm, &n);
    MPI_Allgather(&W_RANK, 1, MPI_INT, out, 1, MPI_INT, comm);
    return n;
}

static void split_checks(const pp_grid* g) {
    int c, k, i, n, m[64], kind;
    for (kind = 0; kind < 4; kind++) {
        MPI_Comm comm;
        const int* want = kind == 0 ? g->tp_group : kind == 1 ? g->pipe : kind == 2 ? g->dp_group : g->tied;
        int wn = kind == 0 ? g->tp : kind == 1 ? g->pp : kind == 2 ? g->dp : (g->pp > 1 ? 2 : 1);
        if (kind == 0) pp_grid_tp_split(g, &c, &k);
        if (kind == 1) pp_grid_pipe_split(g, &c, &k);
        if (kind == 2) pp_grid_dp_split(g, &c, &k);
        if (kind == 3) pp_grid_tied_split(g, &c, &k);
        MPI_Comm_split(MPI_COMM_WORLD, c < 0 ? MPI_UNDEFINED : c, k, &comm);
        n = members(comm, m);
        if (c < 0) {
            CHECK(comm == MPI_COMM_NULL, "rank %d: no tied colour, no communicator", W_RANK);
            continue;
        }
        CHECK(n == wn, "rank %d: split %d has %d members, the grid says %d", W_RANK, kind, n, wn);
        for (i = 0; i < n && i < wn; i++)
            CHECK(m[i] == want[i], "rank %d: split %d member %d is world rank %d, the grid says %d", W_RANK, kind, i, m[i],
                  want[i]);
        MPI_Comm_free(&comm);
    }
}

/* The threads version of one group's collectives, in this process: TP rank r's inputs are
   fill(seed0 + r); out[op] of TP rank 0. */
typedef struct th_run {
    pp_threads* w;
    int tp, seed0, d, c;
    unsigned char out[3][MAXN][OUTSZ];
    pp_result rc[MAXN];
} th_run;

static pp_result th_rank(int r, void* user) {
    th_run* T = (th_run*)user;
    pp_transport t = pp_threads_transport(T->w, r);
    pp_group g;
    pp_error err;
    unsigned char a[OUTSZ], b[OUTSZ];
    size_t n = COUNTS[T->c];
    pp_dtype dt = DTYPES[T->d];
    g.t = &t;
    g.ranks = NULL;
    g.n_ranks = 0;
    g.timeout_s = 30;
    fill(a, dt, T->seed0 + r, n);
    if ((T->rc[r] = pp_tp_allreduce(&g, a, n, dt, &err)) != PP_OK) return T->rc[r];
    memcpy(T->out[0][r], a, n * pp_dtype_size(dt));
    fill(a, dt, T->seed0 + r, n);
    if ((T->rc[r] = pp_tp_reducescatter(&g, a, b, n, dt, &err)) != PP_OK) return T->rc[r];
    memcpy(T->out[1][r], b, OUTSZ);
    if ((T->rc[r] = pp_tp_allgather(&g, b, a, n, dt, &err)) != PP_OK) return T->rc[r];
    memcpy(T->out[2][r], a, n * pp_dtype_size(dt));
    return PP_OK;
}

static void coll_checks(const pp_grid* g) {
    static unsigned char a[OUTSZ], b[OUTSZ], ref[OUTSZ], got[3][OUTSZ];
    static th_run T;
    MPI_Comm comm;
    pp_mpi* m = NULL;
    pp_transport t;
    pp_group grp;
    pp_error err;
    int c, k, d, ci, seed0 = 100 * (g->pp_rank * g->dp + g->dp_rank + 1);
    int seeds[MAXN], i;
    pp_grid_tp_split(g, &c, &k);
    MPI_Comm_split(MPI_COMM_WORLD, c, k, &comm);
    CHECK(pp_mpi_create(comm, MPI_COMM_NULL, &m, &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
    if (!m) return;
    t = pp_mpi_transport(m);
    grp.t = &t;
    grp.ranks = NULL; /* the TP communicator's ranks: its rank i is TP rank i (key = tp_rank) */
    grp.n_ranks = 0;
    grp.timeout_s = 30;
    for (i = 0; i < g->tp; i++) seeds[i] = seed0 + i;
    for (d = 0; d < 4; d++)
        for (ci = 0; ci < (int)NCOUNTS; ci++) {
            size_t n = COUNTS[ci], es = pp_dtype_size(DTYPES[d]), off, len;
            const char* dn = pp_dtype_name(DTYPES[d]);
            pp_tp_block(n, g->tp, g->tp_rank, &off, &len);
            reference(ref, DTYPES[d], seeds, g->tp, n);
            fill(a, DTYPES[d], seed0 + g->tp_rank, n);
            CHECK(pp_tp_allreduce(&grp, a, n, DTYPES[d], &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
            CHECK(memcmp(a, ref, n * es) == 0, "rank %d: all-reduce %s count %zu differs from the sequential sum", W_RANK, dn,
                  n);
            memcpy(got[0], a, n * es);
            fill(a, DTYPES[d], seed0 + g->tp_rank, n);
            CHECK(pp_tp_reducescatter(&grp, a, b, n, DTYPES[d], &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
            CHECK(memcmp(b, ref + off * es, len * es) == 0, "rank %d: reduce-scatter %s count %zu differs", W_RANK, dn, n);
            memcpy(got[1], b, len * es);
            CHECK(pp_tp_allgather(&grp, b, a, n, DTYPES[d], &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
            CHECK(memcmp(a, ref, n * es) == 0, "rank %d: all-gather %s count %zu differs", W_RANK, dn, n);
            memcpy(got[2], a, n * es);
            if (g->tp_rank == 0) { /* the threads transport, here, on the same inputs: the same bits */
                memset(&T, 0, sizeof T);
                T.tp = g->tp;
                T.seed0 = seed0;
                T.d = d;
                T.c = ci;
                CHECK(pp_threads_create(g->tp, &T.w, &err) == PP_OK && pp_threads_run(g->tp, th_rank, &T, &err) == PP_OK,
                      "rank %d: threads: %s", W_RANK, err.msg);
                CHECK(memcmp(T.out[0][0], got[0], n * es) == 0 && memcmp(T.out[1][0], got[1], len * es) == 0 &&
                          memcmp(T.out[2][0], got[2], n * es) == 0,
                      "rank %d: %s count %zu: MPI's bits differ from the threads transport's", W_RANK, dn, n);
                pp_threads_destroy(T.w);
            }
        }
    pp_mpi_destroy(m);
    MPI_Comm_free(&comm);
}

/* pp_mpi_grid_create_tp: its grid is pp_grid_make_tp's, its g.tp transport runs the collectives
   (every dtype, the largest count) with the sequential sum's bits; tp 1 leaves g.tp NULL. */
static void mpi_grid_checks(int tp, pp_grid_order order) {
    static unsigned char a[OUTSZ], ref[OUTSZ];
    pp_mpi_grid mg;
    pp_grid want;
    pp_transport t;
    pp_group grp;
    pp_error err;
    int d, i, seeds[MAXN], seed0;
    size_t n = COUNTS[NCOUNTS - 1];
    pp_grid_make_tp(W_SIZE, W_RANK, 2, tp, order, &want, &err);
    CHECK(pp_mpi_grid_create_tp(MPI_COMM_WORLD, 2, tp, order, &mg, &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
    CHECK(memcmp(&mg.grid, &want, sizeof want) == 0, "rank %d: pp_mpi_grid's grid is not pp_grid_make_tp's", W_RANK);
    CHECK((tp > 1) == (mg.tp != NULL), "rank %d: tp %d: g.tp %s", W_RANK, tp, mg.tp ? "set" : "NULL");
    if (mg.tp) {
        t = pp_mpi_transport(mg.tp);
        CHECK(t.size == tp && t.rank == want.tp_rank, "rank %d: the TP transport's rank %d of %d, tp rank %d of %d", W_RANK,
              t.rank, t.size, want.tp_rank, tp);
        grp.t = &t;
        grp.ranks = NULL;
        grp.n_ranks = 0;
        grp.timeout_s = 30;
        seed0 = 700 + 10 * (want.pp_rank * want.dp + want.dp_rank);
        for (i = 0; i < tp; i++) seeds[i] = seed0 + i;
        for (d = 0; d < 4; d++) {
            fill(a, DTYPES[d], seed0 + want.tp_rank, n);
            reference(ref, DTYPES[d], seeds, tp, n);
            CHECK(pp_tp_allreduce(&grp, a, n, DTYPES[d], &err) == PP_OK && memcmp(a, ref, n * pp_dtype_size(DTYPES[d])) == 0,
                  "rank %d: all-reduce %s over pp_mpi_grid's tp: %s", W_RANK, pp_dtype_name(DTYPES[d]), err.msg);
        }
    }
    pp_mpi_grid_destroy(&mg);
}


/* One step (and its pipe transport's bytes) with the split on or off. */
static pp_result bnd_step(pp_mpi_grid* mg, const pp_schedule* sc, const int* first, const pp_batch* b, pp_shape_policy shp,
                          int split, bw* w, bw* g, pp_step_stats* st, uint64_t* sent, char* msg, size_t msg_n) {
    pp_transport tpt = pp_mpi_transport(mg->tp);
    tpb_ctx ctx;
    pp_stage_desc d;
    pp_stage* stage = NULL;
    pp_error err;
    pp_result rc;
    uint64_t b0 = 0, b1 = 0;
    memset(&ctx, 0, sizeof ctx);
    ctx.tp.t = &tpt;
    ctx.tp.timeout_s = 30;
    ctx.tp_rank = mg->grid.tp_rank;
    memset(&d, 0, sizeof d);
    b_model(&d.model);
    d.weights = w;
    d.grads = g;
    d.schedule = sc;
    d.partition = first;
    d.rank = mg->grid.pp_rank;
    d.transport = pp_mpi_transport(mg->pipe);
    d.timeout_s = 30;
    d.shapes = shp;
    d.layer_ctx = &ctx;
    d.tp = &ctx.tp;       /* the outcome agreed over the group either way */
    d.tp_whole = !split;  /* off: every boundary whole */
    memset(g, 0, sizeof *g);
    if ((rc = pp_stage_create(&d, &stage, &err)) != PP_OK) {
        snprintf(msg, msg_n, "%s", err.msg);
        return rc;
    }
    pp_mpi_counters(mg->pipe, &b0, NULL);
    if ((rc = pp_stage_step(stage, b, st)) != PP_OK) snprintf(msg, msg_n, "%s", pp_stage_error(stage));
    pp_mpi_counters(mg->pipe, &b1, NULL);
    *sent = b1 - b0;
    pp_stage_destroy(stage);
    return rc;
}

static void boundary_checks(int tp) {
    static pp_action acts[256];
    static const pp_schedule_kind kinds[2] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED};
    pp_mpi_grid mg;
    pp_error err;
    int32_t cu[BMAXR + 1], cub[BMAXR + 16];
    pp_microbatch mbs[16];
    int ki, shp, k, m = 4, n_seqs = 2 * 4 + 1, first[6];
    CHECK(pp_mpi_grid_create_tp(MPI_COMM_WORLD, 2, tp, PP_GRID_DP_INNER, &mg, &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
    b_fill();
    cu[0] = 0;
    for (k = 0; k < n_seqs; k++) cu[k + 1] = cu[k] + 1 + (k * 3 + 2) % 5;
    for (ki = 0; ki < 2; ki++)
        for (shp = 0; shp < 2; shp++) {
            static bw w, g_on, g_off;
            pp_schedule sc;
            pp_batch b;
            pp_step_stats s_on, s_off;
            uint64_t sent_on = 0, sent_off = 0, want_on = 0, want_off = 0, d_on, d_off;
            pp_result r_on, r_off;
            char msg[2][512];
            const pp_action* la;
            int v = kinds[ki] == PP_SCHED_INTERLEAVED ? 2 : 1, S = 2 * v, t = mg.grid.tp_rank;
            msg[0][0] = msg[1][0] = 0;
            CHECK(pp_schedule_make(kinds[ki], 2, v, m, acts, 256, &sc, &err) == PP_OK, "%s", err.msg);
            CHECK(pp_partition_uniform(BN + 1, S, first, &err) == PP_OK, "%s", err.msg);
            b_batch(&b, m, cu[n_seqs]);
            b.cu_seqlens = cu;
            b.n_seqs = n_seqs;
            b.split = PP_SPLIT_TOKENS;
            CHECK(pp_batch_split(&b, mbs, cub, &err) == PP_OK, "%s", err.msg);
            b_weights(&w, tp, t, 0);
            r_off = bnd_step(&mg, &sc, first, &b, shp ? PP_SHAPES_BROADCAST : PP_SHAPES_LOCAL, 0, &w, &g_off, &s_off, &sent_off,
                             msg[0], sizeof msg[0]);
            r_on = bnd_step(&mg, &sc, first, &b, shp ? PP_SHAPES_BROADCAST : PP_SHAPES_LOCAL, 1, &w, &g_on, &s_on, &sent_on,
                            msg[1], sizeof msg[1]);
            CHECK(r_off == PP_OK && r_on == PP_OK, "rank %d, tp %d, %s: %s / %s", W_RANK, tp, pp_schedule_name(kinds[ki]), msg[0],
                  msg[1]);
            CHECK(memcmp(g_on.w, g_off.w, sizeof g_on.w) == 0 && s_on.has_loss == s_off.has_loss &&
                      memcmp(&s_on.loss, &s_off.loss, sizeof(float)) == 0,
                  "rank %d (pp %d, tp %d of %d), %s: loss %.9g / %.9g or gradients differ with the split", W_RANK,
                  mg.grid.pp_rank, t, tp, pp_schedule_name(kinds[ki]), (double)s_on.loss, (double)s_off.loss);
            la = pp_schedule_rank(&sc, mg.grid.pp_rank);
            for (k = 0; k < sc.per_rank; k++) {
                const pp_action* a = &la[k];
                size_t on, off;
                if (!((a->op == PP_OP_F && a->stage < S - 1 && a->next_rank != mg.grid.pp_rank) ||
                      (a->op == PP_OP_B && a->stage > 0 && a->prev_rank != mg.grid.pp_rank)))
                    continue;
                pp_tp_boundary_bytes(mbs[a->mb].rows, BK * sizeof(float), tp, t, &on, NULL);
                pp_tp_boundary_bytes(mbs[a->mb].rows, BK * sizeof(float), 1, 0, &off, NULL);
                want_on += on, want_off += off;
            }
            d_on = s_on.bytes_sent - s_on.meta_bytes_sent - s_on.agree_bytes;
            d_off = s_off.bytes_sent - s_off.meta_bytes_sent - s_off.agree_bytes;
            CHECK(d_on == want_on && d_off == want_off && sent_off - sent_on == want_off - want_on && want_on < want_off,
                  "rank %d (tp %d of %d), %s: %llu bytes between stages with the split (transport %llu), %llu without (%llu); "
                  "want %llu and %llu", W_RANK, t, tp, pp_schedule_name(kinds[ki]), (unsigned long long)d_on,
                  (unsigned long long)sent_on, (unsigned long long)d_off, (unsigned long long)sent_off,
                  (unsigned long long)want_on, (unsigned long long)want_off);
        }
    pp_mpi_grid_destroy(&mg);
}

/* A layer failing on one TP rank after the step's last TP message (replica 0's stage 0, TP rank 1:
   layer 0's backward of the last micro-batch, 1F1B p = 2, m = 4): every rank of that replica must
   fail the step, the other pipelines of its TP groups through the TP verdict (pp_stage_desc.tp;
   before, they returned PP_OK, and the TP group's weights would drift apart). Over MPI the
   verdicts cross processes. Last: the failed step leaves the grid's transports aborted.
   Negative control: build/tp-mpi-ctl-no-tp-agree (PP_TEST_NO_TP_AGREE). */
static void verdict_checks(int tp) {
    static pp_action acts[64];
    static bw w, g;
    pp_mpi_grid mg;
    pp_error err;
    pp_schedule sc;
    pp_batch b;
    pp_step_stats st;
    uint64_t sent = 0;
    char msg[512];
    int first[4];
    pp_result rc;
    CHECK(pp_mpi_grid_create_tp(MPI_COMM_WORLD, 2, tp, PP_GRID_DP_INNER, &mg, &err) == PP_OK, "rank %d: %s", W_RANK, err.msg);
    b_fill();
    CHECK(pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 64, &sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(BN + 1, 2, first, &err) == PP_OK, "%s", err.msg);
    b_batch(&b, 4, 16);
    b_weights(&w, tp, mg.grid.tp_rank, 0);
    w.fail_bwd = mg.grid.dp_rank == 0 && mg.grid.pp_rank == 0 && mg.grid.tp_rank == 1; /* layer 0 */
    w.fail_mb = 3;
    msg[0] = 0;
    rc = bnd_step(&mg, &sc, first, &b, PP_SHAPES_LOCAL, 1, &w, &g, &st, &sent, msg, sizeof msg);
    if (mg.grid.dp_rank == 0)
        CHECK(rc != PP_OK, "rank %d (pp %d, tp %d of %d): the step TP rank 1 of stage 0 failed after its last TP message "
              "returned PP_OK here", W_RANK, mg.grid.pp_rank, mg.grid.tp_rank, tp);
    if (getenv("PP_TEST_VERBOSE")) printf("verdict tp %d: rank %d: %s: %s\n", tp, W_RANK, pp_result_str(rc), msg);
    pp_mpi_grid_destroy(&mg);
}

int main(int argc, char** argv) {
    int tps[2] = {2, 4}, i, order, counts[2], total[2];
    pp_error err;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &W_RANK);
    MPI_Comm_size(MPI_COMM_WORLD, &W_SIZE);
    for (i = 0; i < 2; i++)
        for (order = 0; order <= 5; order++) {
            pp_grid g;
            if (W_SIZE % (2 * tps[i]) != 0) continue;
            CHECK(pp_grid_make_tp(W_SIZE, W_RANK, 2, tps[i], (pp_grid_order)order, &g, &err) == PP_OK, "%s", err.msg);
            split_checks(&g);
            if (order == PP_GRID_DP_INNER || order == PP_GRID_TP_DP_PP) {
                coll_checks(&g);
                mpi_grid_checks(tps[i], (pp_grid_order)order);
            }
        }
    if (W_SIZE % 2 == 0) mpi_grid_checks(1, PP_GRID_DP_INNER);
    for (i = 0; i < 2; i++)
        if (W_SIZE % (2 * tps[i]) == 0) boundary_checks(tps[i]);
    if (W_SIZE % 4 == 0) verdict_checks(2);
    counts[0] = _t_pass;
    counts[1] = _t_fail;
    MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (W_RANK == 0) printf("test_tp_mpi (%d processes): %d passed, %d failed\n", W_SIZE, total[0], total[1]);
    MPI_Bcast(total, 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return total[1] != 0 || total[0] == 0;
}
