/* tests/test_grid.c - pipeline.h's grid section without MPI: launcher environments, grid
   arithmetic, and a pp = 2 x dp = 2 grid over the threads transport (one pp_threads world per
   pipeline, one for the whole grid's data-parallel sums) training the tied-embedding LM:
   gradients equal the sequential reference bit for bit after the tied sum and the
   data-parallel mean, and the tied copies stay bit-identical over SGD steps; then the same with
   the data-parallel reduction overlapped with the cool-down (pp_dp_overlap: each stage's buckets
   reduced from its gradients-final hook, the tied layers after the tied sum in the wait): the
   same bits, and the hooks did reduce (negative controls: build/overlap-controls). Runs under the
   sanitizers like every other test (the MPI version is tests/test_mpi.c). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/tlm.h"
#include "test.h"
#include "harness.h"

#include <stdlib.h>

#define PP 2
#define DP 2
#include "tlm_grid.h"

static const char* const ENV_VARS[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                                       "SLURM_LOCALID", "RANK", "WORLD_SIZE", "LOCAL_RANK"};

static void env_checks(void) {
    pp_launch L;
    pp_error err;
    int i;
    for (i = 0; i < (int)(sizeof ENV_VARS / sizeof ENV_VARS[0]); i++) unsetenv(ENV_VARS[i]);
    err.msg[0] = 0;
    CHECK(pp_launch_from_env(&L, &err) == PP_ERR_INVALID && strstr(err.msg, "OMPI_COMM_WORLD_RANK") &&
              strstr(err.msg, "SLURM_PROCID") && strstr(err.msg, "WORLD_SIZE"),
          "no launcher: a clear error naming the variables: %s", err.msg);
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    CHECK(pp_launch_from_env(&L, &err) == PP_OK && L.rank == 3 && L.world == 8 && L.local_rank == 1 &&
              !strcmp(L.source, "torchrun"),
          "torchrun variables: %s", err.msg);
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_NTASKS", "4", 1);
    CHECK(pp_launch_from_env(&L, &err) == PP_OK && L.rank == 2 && L.world == 4 && L.local_rank == 0 &&
              !strcmp(L.source, "slurm"),
          "srun's variables win over torchrun's; no SLURM_LOCALID means 0: %s", err.msg);
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    CHECK(pp_launch_from_env(&L, &err) == PP_OK && L.rank == 5 && L.world == 6 && !strcmp(L.source, "ompi"),
          "mpirun's variables first: %s", err.msg);
    setenv("OMPI_COMM_WORLD_RANK", "6", 1);
    CHECK(pp_launch_from_env(&L, &err) == PP_ERR_INVALID && strstr(err.msg, "malformed"), "rank 6 of 6: %s", err.msg);
    setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
    CHECK(pp_launch_from_env(&L, &err) == PP_ERR_INVALID, "a rank that is not a number");
    for (i = 0; i < (int)(sizeof ENV_VARS / sizeof ENV_VARS[0]); i++) unsetenv(ENV_VARS[i]);
}

static void grid_checks(void) {
    pp_grid g;
    pp_error err;
    int r, c, k, seen[12] = {0};
    for (r = 0; r < 12; r++) {
        CHECK(pp_grid_make(12, r, 3, PP_GRID_DP_INNER, &g, &err) == PP_OK, "grid: %s", err.msg);
        CHECK(g.dp == 4 && pp_grid_rank(&g, g.pp_rank, g.dp_rank) == r, "rank %d round trip", r);
        CHECK(g.pipe[g.pp_rank] == r && g.dp_group[g.dp_rank] == r, "rank %d is in its own groups", r);
        seen[g.pp_rank * 4 + g.dp_rank]++;
        pp_grid_pipe_split(&g, &c, &k);
        CHECK(c == g.dp_rank && k == g.pp_rank, "pipeline split colour");
        pp_grid_tied_split(&g, &c, &k);
        CHECK((g.pp_rank == 1) == (c == -1), "only the first and last stage ranks are in a tied pair");
        CHECK(pp_grid_make(12, r, 3, PP_GRID_PP_INNER, &g, &err) == PP_OK && g.pp_rank == r % 3 && g.dp_rank == r / 3,
              "pp-inner rank %d", r);
    }
    for (r = 0; r < 12; r++) CHECK(seen[r] == 1, "cell %d covered %d times", r, seen[r]);
    CHECK(pp_grid_make(10, 0, 3, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID && strstr(err.msg, "multiple"),
          "10 is not a multiple of 3: %s", err.msg);
    CHECK(pp_grid_make(4, -1, 2, PP_GRID_DP_INNER, &g, &err) == PP_ERR_INVALID, "negative rank");
    CHECK(pp_grid_make(4, 0, 2, (pp_grid_order)7, &g, &err) == PP_ERR_INVALID, "unknown order");
}

/* ---- a pp x dp grid over the threads transport ---- */

typedef struct world {
    pp_threads* pipes[DP];
    pp_threads* all;            /* the whole grid: data-parallel sums over its dp groups */
    pp_schedule sc;
    int first[PP * 2 + 1];
    int pair[2];
    int m;
    int overlap;                /* 1: pp_dp_overlap from the hook; 0: pp_grad_allreduce after the step */
    float* w[PP * DP];          /* each rank's weights and gradients (one arena each) */
    float* g[PP * DP];
    float* wref;                /* the reference run */
    int bad[PP * DP];           /* gradient or weight mismatches found by each rank */
    char msg[PP * DP][600];
} world;

static int owner(const world* W, int layer) { return pp_schedule_layer_rank(&W->sc, W->first, layer); }
#define layer_range tlm_grid_layer_range

static uint64_t shard_seed(int step, int replica) { return 500u + 13u * (uint64_t)step + (uint64_t)replica; }
static void reference(const float* wa, float* gref, int step, int m) { tlm_grid_reference(wa, gref, step, m, DP, shard_seed); }

static pp_result rank_main(int wr, void* user) {
    world* W = (world*)user;
    pp_grid g;
    pp_error err;
    pp_stage* st = NULL;
    pp_stage_desc d;
    pp_step_stats stats;
    pp_model model = tlm_model_desc();
    tlm_model w, gw;
    pp_transport pipe, all;
    size_t n = tlm_param_count(VOCAB, DIM), nE = (size_t)VOCAB * DIM;
    float* gref = (float*)malloc(n * sizeof(float));
    float* wref = (float*)malloc(n * sizeof(float));
    shard s;
    int step, l;
    pp_grad_buf bufs[2 * TLM_DEPTH + 2];
    pp_dp_overlap* ov = NULL;
    pp_result rc = pp_grid_make(PP * DP, wr, PP, PP_GRID_DP_INNER, &g, &err);
    if (rc != PP_OK) return rc;
    pipe = pp_threads_transport(W->pipes[g.dp_rank], g.pp_rank);
    all = pp_threads_transport(W->all, wr);
    tlm_layout(&w, W->w[wr], VOCAB, DIM, 0);
    tlm_layout(&gw, W->g[wr], VOCAB, DIM, 0);
    memcpy(wref, W->wref, n * sizeof(float));
    rc = pp_tied_sync_weights(&pipe, W->pair, g.pp_rank == W->pair[0] ? w.embed[0].E : NULL,
                              g.pp_rank == W->pair[1] ? w.head[0].E : NULL, nE * sizeof(float), 20, &err);
    hx_stage_desc(&d, NULL, model, &w, &gw, &W->sc, W->first, g.pp_rank, pipe);
    d.timeout_s = 20;
    if (rc == PP_OK && W->overlap) {
        pp_dp_overlap_desc od;
        tlm_overlap_desc(&od, &gw, &W->sc, W->first, g.pp_rank, &pipe, W->pair, bufs);
        od.dp.t = &all; /* the data-parallel group as world ranks of the grid's own transport */
        od.dp.ranks = g.dp_group;
        od.dp.n_ranks = g.dp;
        od.dp.timeout_s = 20;
        od.bucket_bytes = 40; /* several buckets per buffer: cut anywhere, the same bits */
        rc = tlm_grid_hook_overlap(&od, &d, &ov, &err);
    }
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    for (step = 0; step < STEPS && rc == PP_OK; step++) {
        if ((rc = tlm_grid_stage_step(st, W->g[wr], &s, shard_seed(step, g.dp_rank), W->m, &stats, &err)) != PP_OK) break;
        if (W->overlap) {
            pp_dp_overlap_stats os;
            if ((rc = pp_dp_overlap_wait(ov, &os, &err)) != PP_OK) break;
            /* every rank owns dense layers besides its tied one: their buckets went in the hook */
            if (os.buckets_hook < 1 || stats.t_grads_final <= 0 || stats.t_grads_final > stats.t_total) {
                W->bad[wr]++;
                snprintf(W->msg[wr], sizeof W->msg[wr],
                         "step %d: overlap: %d buckets reduced in the hook (%d after), gradients final at %g s of %g s",
                         step, os.buckets_hook, os.buckets_wait, stats.t_grads_final, stats.t_total);
            }
        } else {
            rc = pp_tied_sum_grads(&pipe, W->pair, g.pp_rank == W->pair[0] ? gw.embed[0].E : NULL,
                                   g.pp_rank == W->pair[1] ? gw.head[0].E : NULL, nE, PP_F32, 20, &err);
            /* the data-parallel group as world ranks of the grid's own transport */
            if (rc == PP_OK) rc = pp_grad_allreduce(&all, g.dp_group, g.dp, W->g[wr], n, PP_F32, 1.0 / DP, 20, &err);
        }
        if (rc != PP_OK) break;
        reference(wref, gref, step, W->m);
        tlm_grid_check_sgd(W->w[wr], W->g[wr], wref, gref, &W->sc, W->first, g.pp_rank, step, &W->bad[wr], W->msg[wr],
                           sizeof W->msg[wr]);
    }
    for (l = 0; l < model.n_layers && rc == PP_OK; l++) {
        size_t off, cnt;
        layer_range(l, &off, &cnt);
        if (cnt && owner(W, l) == g.pp_rank && memcmp(W->w[wr] + off, wref + off, cnt * sizeof(float))) {
            W->bad[wr]++;
            snprintf(W->msg[wr], sizeof W->msg[wr], "layer %d's weights differ after %d steps", l, STEPS);
        }
    }
    if (rc != PP_OK) snprintf(W->msg[wr], sizeof W->msg[wr], "%s", err.msg);
    pp_stage_destroy(st);
    pp_dp_overlap_destroy(ov);
    free(gref);
    free(wref);
    return rc;
}

static void grid_run(pp_schedule_kind kind, int v, int m, int overlap) {
    static pp_action acts[PP * 2 * 2 * 8];
    world W;
    pp_error err;
    pp_model model = tlm_model_desc();
    size_t nE = (size_t)VOCAB * DIM, hoff, hn;
    int r, d;
    pp_result rc;
    memset(&W, 0, sizeof W);
    W.m = m;
    W.overlap = overlap;
    rc = pp_schedule_make(kind, PP, v, m, acts, sizeof acts / sizeof acts[0], &W.sc, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(model.n_layers, PP * v, W.first, &err);
    for (d = 0; d < DP && rc == PP_OK; d++) rc = pp_threads_create(PP, &W.pipes[d], &err);
    if (rc == PP_OK) rc = pp_threads_create(PP * DP, &W.all, &err);
    CHECK(rc == PP_OK, "grid setup: %s", err.msg);
    W.pair[0] = owner(&W, TLM_EMBED_LAYER);
    W.pair[1] = owner(&W, TLM_HEAD_LAYER);
    W.wref = tlm_grid_weights(W.w, W.g, PP * DP);
    layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    if (rc == PP_OK) rc = pp_threads_run(PP * DP, rank_main, &W, &err);
    CHECK(rc == PP_OK, "%s pp=%d dp=%d%s: %s (%s / %s)", pp_schedule_name(kind), PP, DP, overlap ? " overlap" : "",
          err.msg, W.msg[0], W.msg[1]);
    for (r = 0; r < PP * DP; r++)
        CHECK(W.bad[r] == 0, "%s%s: world rank %d: %s", pp_schedule_name(kind), overlap ? " overlap" : "", r, W.msg[r]);
    /* the tied copies: embedding on a pair[0] rank, head on a pair[1] rank, every replica */
    for (d = 0; d < DP && rc == PP_OK; d++) {
        pp_grid g;
        int ra, rb;
        pp_grid_make(PP * DP, 0, PP, PP_GRID_DP_INNER, &g, &err);
        ra = pp_grid_rank(&g, W.pair[0], d);
        rb = pp_grid_rank(&g, W.pair[1], d);
        CHECK(memcmp(W.w[ra], W.w[rb] + hoff, nE * sizeof(float)) == 0, "%s: replica %d: tied copies differ after %d steps",
              pp_schedule_name(kind), d, STEPS);
        CHECK(memcmp(W.w[ra], W.w[pp_grid_rank(&g, W.pair[0], 0)], nE * sizeof(float)) == 0, "replicas differ");
    }
    tlm_grid_free(W.wref, W.w, W.g, PP * DP);
    for (d = 0; d < DP; d++) pp_threads_destroy(W.pipes[d]);
    pp_threads_destroy(W.all);
}

/* pp_dp_overlap alone, on a one-rank group: bad descs refused with a message, the hook once per
   stage and step, the tied layer after the tied sum, the scale on everything. */
static void overlap_checks(void) {
    pp_threads* one = NULL;
    pp_transport t;
    pp_error err;
    pp_dp_overlap* ov = NULL;
    pp_dp_overlap_desc od;
    pp_dp_overlap_stats os;
    pp_grad_buf bufs[3];
    float e[4] = {1, 2, 3, 4}, h[4] = {4, 3, 2, 1}, dense[5] = {2, 2, 2, 2, 2};
    int first[3] = {0, 2, 3}, i, ok = 1;
    CHECK(pp_threads_create(1, &one, &err) == PP_OK, "threads: %s", err.msg);
    t = pp_threads_transport(one, 0);
    memset(bufs, 0, sizeof bufs);
    bufs[0].layer = 0, bufs[0].data = e, bufs[0].count = 4, bufs[0].dtype = PP_F32;
    bufs[1].layer = 1, bufs[1].data = dense, bufs[1].count = 5, bufs[1].dtype = PP_F32;
    bufs[2].layer = 2, bufs[2].data = h, bufs[2].count = 4, bufs[2].dtype = PP_F32;
    memset(&od, 0, sizeof od);
    CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_ERR_INVALID && strstr(err.msg, "dp.t") && !ov, "empty desc: %s", err.msg);
    od.dp.t = &t;
    od.bufs = bufs;
    od.n_bufs = 3;
    od.partition = first;
    od.n_stages = 1;
    CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"), "layer 2 of 0..1: %s", err.msg);
    od.n_stages = 2;
    od.scale = 0.5;
    od.bucket_bytes = 8;
    od.tied = &t;
    od.tied_layers[1] = 2; /* pair {0, 0}: this rank holds both copies */
    CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_OK, "overlap: %s", err.msg);
    CHECK(pp_dp_overlap_hook(ov, 0, 2) == PP_ERR_INVALID && strstr(pp_dp_overlap_error(ov), "outside"), "stage 2 of 2");
    CHECK(pp_dp_overlap_hook(ov, 0, 0) == PP_OK && pp_dp_overlap_hook(ov, 0, 0) == PP_OK, "hook: %s", pp_dp_overlap_error(ov));
    CHECK(e[0] == 1 && dense[0] == 1 && dense[4] == 1, "stage 0's hook: the dense layer scaled once, the tied one left");
    CHECK(pp_dp_overlap_wait(ov, &os, &err) == PP_OK, "wait: %s", err.msg);
    for (i = 0; i < 4; i++) ok &= e[i] == 2.5f && h[i] == 2.5f; /* (e + h) * 0.5 */
    CHECK(ok && dense[0] == 1 && os.buckets_hook == 3 && os.buckets_wait == 4, "wait: tied %g %g, %d + %d buckets", e[0],
          h[0], os.buckets_hook, os.buckets_wait);
    pp_dp_overlap_destroy(ov);
    /* coalesce: a layer's weight and bias, and the next layer's, in one arena: one stage's three
       buffers go in one all-reduce (bucket_bytes 64: 12 floats, one bucket), the same scale */
    {
        float arena[12];
        pp_grad_buf ab[3];
        int f2[2] = {0, 2};
        for (i = 0; i < 12; i++) arena[i] = (float)i;
        memset(ab, 0, sizeof ab);
        ab[0].layer = 0, ab[0].data = arena, ab[0].count = 4, ab[0].dtype = PP_F32;
        ab[1].layer = 0, ab[1].data = arena + 4, ab[1].count = 2, ab[1].dtype = PP_F32;
        ab[2].layer = 1, ab[2].data = arena + 6, ab[2].count = 6, ab[2].dtype = PP_F32;
        memset(&od, 0, sizeof od);
        od.dp.t = &t;
        od.bufs = ab;
        od.n_bufs = 3;
        od.partition = f2;
        od.n_stages = 1;
        od.scale = 0.5;
        od.bucket_bytes = 64;
        od.coalesce = 1;
        CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_OK, "coalesce: %s", err.msg);
        CHECK(pp_dp_overlap_hook(ov, 0, 0) == PP_OK && pp_dp_overlap_wait(ov, &os, &err) == PP_OK, "coalesce: %s", err.msg);
        for (i = 0, ok = 1; i < 12; i++) ok &= arena[i] == 0.5f * (float)i;
        CHECK(ok && os.buckets_hook == 1 && os.buckets_wait == 0,
              "coalesce: three adjacent buffers of a stage in %d + %d all-reduces (want 1), scaled %s", os.buckets_hook,
              os.buckets_wait, ok ? "right" : "wrong");
        pp_dp_overlap_destroy(ov);
        od.coalesce = 0; /* off (the default): one all-reduce a buffer */
        CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_OK && pp_dp_overlap_hook(ov, 0, 0) == PP_OK &&
                  pp_dp_overlap_wait(ov, &os, &err) == PP_OK && os.buckets_hook == 3,
              "no coalesce: %d all-reduces (want 3)", os.buckets_hook);
        pp_dp_overlap_destroy(ov);
    }
    pp_threads_destroy(one);
}

/* pp = 1: one rank holds both tied copies; the helpers work locally, in the same order. */
static void tied_local_checks(void) {
    pp_threads* one = NULL;
    pp_transport t;
    pp_error err;
    float a[3] = {1.5f, -2.0f, 0.25f}, b[3] = {0.5f, 4.0f, 1.0f}, wa[3] = {1, 2, 3}, wb[3] = {0, 0, 0};
    int pair[2] = {0, 0}, bad_pair[2] = {0, 3};
    CHECK(pp_threads_create(1, &one, &err) == PP_OK, "threads: %s", err.msg);
    t = pp_threads_transport(one, 0);
    CHECK(pp_tied_sum_grads(&t, pair, a, b, 3, PP_F32, 1, &err) == PP_OK && a[0] == 2.0f && b[0] == 2.0f && a[1] == 2.0f &&
              b[2] == 1.25f,
          "local tied sum: %s", err.msg);
    CHECK(pp_tied_sync_weights(&t, pair, wa, wb, sizeof wa, 1, &err) == PP_OK && !memcmp(wa, wb, sizeof wa), "local sync");
    CHECK(pp_tied_sum_grads(&t, pair, a, NULL, 3, PP_F32, 1, &err) == PP_ERR_INVALID, "both copies needed: %s", err.msg);
    CHECK(pp_tied_sum_grads(&t, bad_pair, a, b, 3, PP_F32, 1, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"),
          "a pair outside the transport: %s", err.msg);
    CHECK(pp_tied_sum_grads(&t, pair, a, b, 3, PP_I32, 1, &err) == PP_ERR_INVALID, "integer gradients refused");
    CHECK(pp_grad_allreduce(&t, NULL, 0, a, 3, PP_F32, 0.5, 1, &err) == PP_OK && a[0] == 1.0f, "one-rank mean: %s", err.msg);
    { /* a group rank outside the transport: a clear message, not an empty or stale one */
        int outside[2] = {0, 5}, twice[2] = {0, 0};
        strcpy(err.msg, "stale");
        CHECK(pp_grad_allreduce(&t, outside, 2, a, 3, PP_F32, 1.0, 1, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"),
              "all-reduce over rank 5 of 1: %s", err.msg);
        strcpy(err.msg, "stale");
        CHECK(pp_allreduce_p2p(&t, a, 3, PP_F32, outside, 2, 1, &err) == PP_ERR_INVALID && strstr(err.msg, "outside"),
              "p2p all-reduce over rank 5 of 1: %s", err.msg);
        CHECK(pp_grad_allreduce(&t, twice, 2, a, 3, PP_F32, 1.0, 1, &err) == PP_ERR_INVALID && strstr(err.msg, "group"),
              "a rank twice: %s", err.msg);
    }
    pp_threads_destroy(one);
}

int main(void) {
    int ov;
    env_checks();
    tied_local_checks();
    overlap_checks();
    grid_checks();
    for (ov = 0; ov < 2; ov++) {
        grid_run(PP_SCHED_1F1B, 1, 4, ov);
        grid_run(PP_SCHED_GPIPE, 1, 3, ov);
        grid_run(PP_SCHED_INTERLEAVED, 2, 5, ov);
    }
    return TEST_DONE("test_grid");
}
