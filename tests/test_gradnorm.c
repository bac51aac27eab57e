/* tests/test_gradnorm.c - pipeline.h's >>grad: the global gradient norm, clipping, f16/bf16
   gradients and the dynamic loss scaler, over the threads transport.

   - norm: the tied-embedding LM (examples/tlm.h), with its tied copies summed and without (the
     head's copy a parameter of its own), one step of every schedule kind at p = 1..4 (interleaved
     and interleaved-mem at v = 2 and 3), uniform and lopsided partitions; each rank computes the
     norm of its own layers' gradients (pp_stage_grad_norm): every rank's norm has the bits of the
     sequential model's, and after pp_stage_grad_clip every owned gradient has the bits of the
     sequential gradients clipped. Then pp x dp = {1..4} x 2 grids (the replicas' data-parallel
     mean first): the same, against the grid's reference gradients.
   - order: per-layer sums chosen so that adding them in another order than the layers' changes
     the norm (1 + 8 x 2^-53): every p gives exactly 1.
   - half: f16/bf16 conversions (every bit pattern, rounding to nearest even), pp_grad_allreduce
     and pp_tied_sum_grads on f16/bf16 accumulate in f32 (2048 + 1 + 1 is 2050, not 2048) and give
     every rank the same bits; the norm of f16 gradients within 1e-3 of the f32 norm.
   - scaler: a pp x dp = 2 x 2 grid training with pp_batch.loss_scale = the scaler's scale: an Inf
     in one rank's gradient skips the step on every rank and halves the scale everywhere (the
     world as one group, and pipeline then data-parallel groups); clean steps unscale the
     gradients to the unscaled run's bits, report the unscaled loss, and grow the scale.
   - pipeline and errors: pp_pipeline_grad_norm / _clip, and the refusals.
   - clipbound: max_norm = DBL_MAX clips nothing, a norm of DBL_MAX is finite; Inf and NaN refused.
   - tp: tensor parallelism (pp_grad_norm_tp, pp_stage_grad_clip_tp): sharded and replicated
     buffers at tp = 1, 2, 4 over every kind, p and partition: the same bits on every rank at a tp,
     within 1e-12 of the gathered norm, one clip coefficient. tpscaler: the scaler over
     pp x dp x tp = 2 x 2 x 2, a NaN on one TP rank skips every rank.
   Negative controls (make gradnorm-controls): -DPP_TEST_NO_NORM_ORDER adds each rank's layers
   first and then the ranks' totals ("order" fails); -DPP_TEST_NO_SCALER_AGREE lets each rank
   decide alone ("scaler" fails); (build/failpath-controls) -DPP_TEST_OLD_CLIP_BOUND refuses
   max_norm = DBL_MAX ("clipbound" fails); -DPP_TEST_TP_REPLICATED_EACH counts replicated
   parameters once per TP rank ("tp" fails); -DPP_TEST_TP_SCALER_NO_TP leaves the TP group out of
   the scaler's groups ("tpscaler" fails, as does "tpscaler" under -DPP_TEST_NO_SCALER_AGREE).
   Usage: test_gradnorm [norm|order|half|scaler|pipeline|clipbound|tp|tpscaler]. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#define TLM_DEPTH 10 /* 13 layers: p * v up to 12 stages */
#include "../examples/tlm.h"
#include "test.h"
#include "harness.h"

#define VOCAB 13
#define DIM 7
#define NSEQ 16
#define MAXLEN 7
#define STEPS 3
#include "tlm_grid.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define M 12            /* micro-batches: every p in 1..4 divides it */
#define MAXP 4
#define NL (TLM_DEPTH + 3)
#define MAXBUF (2 * NL + 2)

static int g_quick;

/* ---- the model's gradient buffers ------------------------------------------------------------ */
#define grad_list tlm_grid_grad_bufs

/* Floats of the arena that layer l's gradients occupy (tlm_grid_layer_range). */
static int layer_equal(const float* a, const float* b, int l) {
    size_t off, n;
    tlm_grid_layer_range(l, &off, &n);
    return n == 0 || memcmp(a + off, b + off, n * sizeof(float)) == 0;
}

static size_t npar(void) { return tlm_param_count(VOCAB, DIM); }

/* The step's batch: the same for every configuration. */
static shard g_shard;
static float* g_w;             /* weights (untied layout: the head holds a copy of E) */

/* Sequential gradients of the batch (untied), the copies summed when tied; their norm, and
   clipped at half of it. */
typedef struct refgrad {
    float* g;
    float* clipped;
    double norm, max_norm;
} refgrad;

static void reference(refgrad* R, int tied) {
    size_t n = npar(), nE = (size_t)VOCAB * DIM, hoff, hn, i;
    tlm_model w, gw;
    pp_model model = tlm_model_desc();
    pp_grad_buf bufs[MAXBUF];
    pp_error err;
    float loss;
    int nb;
    R->g = (float*)calloc(n, sizeof(float));
    R->clipped = (float*)calloc(n, sizeof(float));
    tlm_layout(&w, g_w, VOCAB, DIM, 0);
    tlm_layout(&gw, R->g, VOCAB, DIM, 0);
    CHECK(pp_sequential_step(&model, &w, &gw, &g_shard.b, &loss, &err) == PP_OK, "reference: %s", err.msg);
    tlm_grid_layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    if (tied)
        for (i = 0; i < nE; i++) R->g[i] = R->g[hoff + i] = R->g[i] + R->g[hoff + i];
    nb = grad_list(&gw, NULL, NULL, -1, tied, bufs);
    CHECK(pp_grad_norm(NULL, NL, bufs, nb, &R->norm, &err) == PP_OK && R->norm > 0, "reference norm: %s", err.msg);
    R->max_norm = R->norm * 0.5;
    memcpy(R->clipped, R->g, n * sizeof(float));
    tlm_layout(&gw, R->clipped, VOCAB, DIM, 0);
    nb = grad_list(&gw, NULL, NULL, -1, tied, bufs);
    CHECK(pp_grad_clip(bufs, nb, R->max_norm, R->norm, NULL, &err) == PP_OK, "reference clip: %s", err.msg);
}

/* ---- norm: every kind, p, v, partition, tied or not ------------------------------------------ */
typedef struct cfg {
    hx_sched sc;
    int first[MAXP * 3 + 1];
    int p, tied;
    pp_threads* th;
    float* g[MAXP];
    double norm[MAXP], norm2[MAXP];
    pp_result rc[MAXP];
    char msg[MAXP][600];
} cfg;

static pp_result cfg_rank(int rank, void* user) {
    cfg* C = (cfg*)user;
    pp_model model = tlm_model_desc();
    pp_transport t = pp_threads_transport(C->th, rank);
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    pp_grad_buf bufs[MAXBUF];
    tlm_model w, gw;
    int pair[2], nb;
    pp_result rc;
    size_t nE = (size_t)VOCAB * DIM;
    err.msg[0] = 0;
    tlm_layout(&w, g_w, VOCAB, DIM, 0);
    tlm_layout(&gw, C->g[rank], VOCAB, DIM, 0);
    hx_stage_desc(&d, NULL, model, &w, &gw, &C->sc.s, C->first, rank, t);
    d.timeout_s = 20;
    pair[0] = pp_schedule_layer_rank(&C->sc.s, C->first, TLM_EMBED_LAYER);
    pair[1] = pp_schedule_layer_rank(&C->sc.s, C->first, TLM_HEAD_LAYER);
    rc = pp_stage_create(&d, &st, &err);
    if (rc == PP_OK && (rc = pp_stage_step(st, &g_shard.b, NULL)) != PP_OK)
        snprintf(err.msg, sizeof err.msg, "%s", pp_stage_error(st));
    if (rc == PP_OK && C->tied)
        rc = pp_tied_sum_grads(&t, pair, rank == pair[0] ? gw.embed[0].E : NULL, rank == pair[1] ? gw.head[0].E : NULL,
                               nE, PP_F32, 20, &err);
    nb = grad_list(&gw, &C->sc.s, C->first, rank, C->tied, bufs);
    if (rc == PP_OK) rc = pp_stage_grad_norm(st, bufs, nb, &C->norm[rank], &err);
    if (rc == PP_OK) rc = pp_stage_grad_clip(st, bufs, nb, C->norm[rank] * 0.5, &C->norm2[rank], &err);
    if (rc != PP_OK) snprintf(C->msg[rank], sizeof C->msg[rank], "%s", err.msg);
    pp_stage_destroy(st);
    return C->rc[rank] = rc;
}

/* One configuration; returns 1 when it ran. lopsided: stages 0..S-2 one layer each, the last
   the rest. */
static int norm_case(pp_schedule_kind kind, int p, int v, int lopsided, int tied, const refgrad* R) {
    cfg C;
    pp_error err;
    size_t n = npar();
    int r, l, S = p * v;
    memset(&C, 0, sizeof C);
    if (pp_schedule_size(kind, p, v, M) == 0 || S > NL) return 0;
    C.p = p;
    C.tied = tied;
    CHECK(hx_sched_make(&C.sc, kind, p, v, M, &err) == PP_OK, "%s p=%d v=%d: %s", pp_schedule_name(kind), p, v, err.msg);
    if (lopsided) {
        for (r = 0; r < S; r++) C.first[r] = r;
        C.first[S] = NL;
    } else {
        CHECK(pp_partition_uniform(NL, S, C.first, &err) == PP_OK, "partition: %s", err.msg);
    }
    CHECK(pp_threads_create(p, &C.th, &err) == PP_OK, "threads: %s", err.msg);
    for (r = 0; r < p; r++) C.g[r] = (float*)calloc(n, sizeof(float));
    CHECK(pp_threads_run(p, cfg_rank, &C, &err) == PP_OK, "%s p=%d v=%d %s%s: %s / %s", pp_schedule_name(kind), p, v,
          lopsided ? "lopsided" : "uniform", tied ? " tied" : "", C.msg[0], C.msg[p - 1]);
    for (r = 0; r < p; r++) {
        CHECK(memcmp(&C.norm[r], &R->norm, sizeof(double)) == 0 && memcmp(&C.norm2[r], &R->norm, sizeof(double)) == 0,
              "%s p=%d v=%d %s%s: rank %d's norm %.17g (then %.17g), the sequential model's %.17g", pp_schedule_name(kind), p,
              v, lopsided ? "lopsided" : "uniform", tied ? " tied" : "", r, C.norm[r], C.norm2[r], R->norm);
        for (l = 0; l < NL; l++)
            if (pp_schedule_layer_rank(&C.sc.s, C.first, l) == r)
                CHECK(layer_equal(C.g[r], R->clipped, l), "%s p=%d v=%d%s: rank %d's clipped layer %d differs",
                      pp_schedule_name(kind), p, v, tied ? " tied" : "", r, l);
    }
    for (r = 0; r < p; r++) free(C.g[r]);
    pp_threads_destroy(C.th);
    hx_sched_free(&C.sc);
    return 1;
}

static void test_norm(void) {
    refgrad R[2];
    int tied, k, p, v, lop, runs = 0;
    for (tied = 0; tied < 2; tied++) reference(&R[tied], tied);
    CHECK(R[0].norm != R[1].norm, "the tied copies' sum changes the norm (%.17g, %.17g)", R[0].norm, R[1].norm);
    for (k = 0; k < PP_SCHED_KIND_COUNT; k++)
        for (p = 1; p <= MAXP; p++)
            for (v = 1; v <= 3; v++) {
                pp_schedule_kind kind = (pp_schedule_kind)k;
                if (pp_schedule_kind_v(kind, v) != v) continue; /* the kind's own v, or 2 and 3 where it takes any */
                for (tied = 0; tied < 2; tied++)
                    for (lop = 0; lop < 2; lop++) {
                        if (g_quick && lop != ((k + p + tied) & 1)) continue;
                        runs += norm_case(kind, p, v, lop, tied, &R[tied]);
                    }
            }
    printf("norm: %d runs (every kind, p = 1..%d, v = 2 and 3 where the kind takes it, tied and untied, uniform and "
           "lopsided partitions): every rank's norm has the sequential model's bits (%.17g tied, %.17g untied), every "
           "clipped gradient the sequential clip's\n",
           runs, MAXP, R[1].norm, R[0].norm);
    CHECK(runs >= (g_quick ? 40 : 80), "only %d runs", runs);
    for (tied = 0; tied < 2; tied++) {
        free(R[tied].g);
        free(R[tied].clipped);
    }
}

/* ---- the same over a pp x dp grid: the replicas' mean first ----------------------------------- */
#define DP 2
typedef struct grid {
    int pp;
    hx_sched sc;
    int first[MAXP * 2 + 1];
    pp_threads* pipes[DP];
    pp_threads* all;
    float* g[MAXP * DP];
    double norm[MAXP * DP];
    char msg[MAXP * DP][600];
    /* scaler mode */
    int scaler, inject_rank, two_groups;
    int skip[MAXP * DP][STEPS];
    float scale[MAXP * DP][STEPS + 1];
    float loss[MAXP * DP][STEPS];
    int bad[MAXP * DP];
} grid;

static uint64_t grid_seed(int step, int replica) { return 900u + 31u * (uint64_t)step + (uint64_t)replica; }

static pp_result grid_rank(int wr, void* user) {
    grid* G = (grid*)user;
    pp_model model = tlm_model_desc();
    pp_grid g;
    pp_error err;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_transport pipe, all;
    pp_grad_buf bufs[MAXBUF];
    pp_loss_scaler sc;
    pp_loss_scaler_desc sd;
    pp_group groups[2];
    pp_step_stats stats;
    tlm_model w, gw;
    shard s;
    size_t n = npar(), nE = (size_t)VOCAB * DIM;
    float* gref = (float*)calloc(n, sizeof(float));
    int pair[2], nb, step, l, i;
    pp_result rc = pp_grid_make(G->pp * DP, wr, G->pp, PP_GRID_DP_INNER, &g, &err);
    if (rc != PP_OK) return rc;
    pipe = pp_threads_transport(G->pipes[g.dp_rank], g.pp_rank);
    all = pp_threads_transport(G->all, wr);
    tlm_layout(&w, g_w, VOCAB, DIM, 0);
    tlm_layout(&gw, G->g[wr], VOCAB, DIM, 0);
    hx_stage_desc(&d, NULL, model, &w, &gw, &G->sc.s, G->first, g.pp_rank, pipe);
    d.timeout_s = 20;
    pair[0] = pp_schedule_layer_rank(&G->sc.s, G->first, TLM_EMBED_LAYER);
    pair[1] = pp_schedule_layer_rank(&G->sc.s, G->first, TLM_HEAD_LAYER);
    memset(&sd, 0, sizeof sd);
    sd.init_scale = 32768.0f;
    sd.growth_interval = 2;
    memset(groups, 0, sizeof groups);
    if (G->two_groups) { /* the pipeline, then the data-parallel group (pp_nccl_grid's way) */
        groups[0].t = &pipe;
        groups[1].t = &all;
        groups[1].ranks = g.dp_group;
        groups[1].n_ranks = DP;
    } else {
        groups[0].t = &all;
    }
    groups[0].timeout_s = groups[1].timeout_s = 20;
    rc = pp_loss_scaler_init(&sc, &sd, &err);
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    nb = grad_list(&gw, &G->sc.s, G->first, g.pp_rank, 1, bufs);
    for (step = 0; step < (G->scaler ? STEPS : 1) && rc == PP_OK; step++) {
        memset(G->g[wr], 0, n * sizeof(float));
        tlm_grid_shard(&s, grid_seed(step, g.dp_rank), M);
        G->scale[wr][step] = sc.scale;
        if (G->scaler) s.b.loss_scale = sc.scale;
        if ((rc = pp_stage_step(st, &s.b, &stats)) != PP_OK) {
            snprintf(err.msg, sizeof err.msg, "%s", pp_stage_error(st));
            break;
        }
        G->loss[wr][step] = stats.has_loss ? stats.loss : 0;
        rc = pp_tied_sum_grads(&pipe, pair, g.pp_rank == pair[0] ? gw.embed[0].E : NULL,
                               g.pp_rank == pair[1] ? gw.head[0].E : NULL, nE, PP_F32, 20, &err);
        if (rc == PP_OK) rc = pp_grad_allreduce(&all, g.dp_group, DP, G->g[wr], n, PP_F32, 1.0 / DP, 20, &err);
        if (rc != PP_OK) break;
        tlm_grid_reference(g_w, gref, step, M, DP, grid_seed);
        if (!G->scaler) {
            rc = pp_stage_grad_norm(st, bufs, nb, &G->norm[wr], &err);
            continue;
        }
        /* step 0: an Inf in one rank's gradient (the last layer it owns that has parameters) */
        if (step == 0 && wr == G->inject_rank)
            for (i = nb - 1; i >= 0; i--)
                if (bufs[i].count) {
                    ((float*)bufs[i].data)[bufs[i].count / 2] = INFINITY;
                    break;
                }
        rc = pp_loss_scaler_check(&sc, groups, G->two_groups ? 2 : 1, bufs, nb, &G->skip[wr][step], &err);
        if (rc == PP_OK && !G->skip[wr][step])
            for (l = 0; l < NL; l++)
                if (pp_schedule_layer_rank(&G->sc.s, G->first, l) == g.pp_rank && !layer_equal(G->g[wr], gref, l)) {
                    G->bad[wr]++;
                    snprintf(G->msg[wr], sizeof G->msg[wr], "step %d: layer %d's unscaled gradient differs from the unscaled run's",
                             step, l);
                }
    }
    G->scale[wr][step] = sc.scale;
    if (rc != PP_OK) snprintf(G->msg[wr], sizeof G->msg[wr], "%s", err.msg);
    if (!G->scaler && rc == PP_OK) {
        tlm_model rg;
        double ref;
        tlm_layout(&rg, gref, VOCAB, DIM, 0);
        nb = grad_list(&rg, NULL, NULL, -1, 1, bufs);
        rc = pp_grad_norm(NULL, NL, bufs, nb, &ref, &err);
        if (rc == PP_OK && memcmp(&ref, &G->norm[wr], sizeof ref)) {
            G->bad[wr]++;
            snprintf(G->msg[wr], sizeof G->msg[wr], "norm %.17g, the reference %.17g", G->norm[wr], ref);
        }
    }
    pp_stage_destroy(st);
    free(gref);
    return rc;
}

static void grid_setup(grid* G, int pp, pp_schedule_kind kind, int v) {
    pp_error err;
    size_t n = npar();
    int d, r;
    memset(G, 0, sizeof *G);
    G->pp = pp;
    CHECK(hx_sched_make(&G->sc, kind, pp, v, M, &err) == PP_OK, "grid schedule: %s", err.msg);
    CHECK(pp_partition_uniform(NL, pp * v, G->first, &err) == PP_OK, "grid partition: %s", err.msg);
    for (d = 0; d < DP; d++) CHECK(pp_threads_create(pp, &G->pipes[d], &err) == PP_OK, "threads: %s", err.msg);
    CHECK(pp_threads_create(pp * DP, &G->all, &err) == PP_OK, "threads: %s", err.msg);
    for (r = 0; r < pp * DP; r++) G->g[r] = (float*)calloc(n, sizeof(float));
}

static void grid_free(grid* G) {
    int d, r;
    for (d = 0; d < DP; d++) pp_threads_destroy(G->pipes[d]);
    pp_threads_destroy(G->all);
    for (r = 0; r < G->pp * DP; r++) free(G->g[r]);
    hx_sched_free(&G->sc);
}

static void test_grid(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_ZB_V};
    int k, pp, r, runs = 0;
    for (k = 0; k < 3; k++)
        for (pp = 1; pp <= MAXP; pp++) {
            grid G;
            pp_error err;
            int v = pp_schedule_kind_v(kinds[k], 2);
            if (pp * v > NL) continue;
            grid_setup(&G, pp, kinds[k], v);
            CHECK(pp_threads_run(pp * DP, grid_rank, &G, &err) == PP_OK, "grid %s pp=%d: %s (%s)", pp_schedule_name(kinds[k]),
                  pp, err.msg, G.msg[0]);
            for (r = 0; r < pp * DP; r++) {
                CHECK(G.bad[r] == 0, "grid %s pp=%d dp=%d: world rank %d: %s", pp_schedule_name(kinds[k]), pp, DP, r, G.msg[r]);
                CHECK(memcmp(&G.norm[r], &G.norm[0], sizeof(double)) == 0, "grid: world rank %d's norm %.17g, rank 0's %.17g",
                      r, G.norm[r], G.norm[0]);
            }
            grid_free(&G);
            runs++;
        }
    printf("grid: %d pp x dp = 2 grids (1f1b, interleaved, zb-v; pp = 1..%d): every rank's norm, after the tied sum and the "
           "data-parallel mean, has the reference gradients' norm bits\n",
           runs, MAXP);
}

/* ---- order: a sum whose value depends on the order ------------------------------------------- */
/* Layer 0: one element 1 (square 1); layers 1..8: two elements 2^-27 each (square sum 2^-53).
   In layer order 1 + 2^-53 rounds back to 1 each time: the norm is exactly 1. Each rank's layers
   first (rank 0 layer 0, rank 1 layers 1..8) gives 1 + 2^-50, and the norm 1 + 2^-51. */
#define ORDER_L 9
typedef struct order_run {
    pp_threads* th;
    int p;
    float data[ORDER_L][2];
    double norm[MAXP];
    pp_result rc[MAXP];
    char msg[MAXP][600];
} order_run;

static int order_owner(int p, int l) { return p == 1 || l == 0 ? 0 : 1 + (l - 1) % (p - 1); }

static pp_result order_rank(int rank, void* user) {
    order_run* O = (order_run*)user;
    pp_transport t = pp_threads_transport(O->th, rank);
    pp_group g;
    pp_grad_buf bufs[ORDER_L];
    pp_error err;
    int l, n = 0;
    memset(&g, 0, sizeof g);
    g.t = &t;
    g.timeout_s = 20;
    for (l = 0; l < ORDER_L; l++) {
        if (order_owner(O->p, l) != rank) continue;
        memset(&bufs[n], 0, sizeof bufs[n]);
        bufs[n].layer = l;
        bufs[n].data = O->data[l];
        bufs[n].count = l == 0 ? 1 : 2;
        bufs[n].dtype = PP_F32;
        n++;
    }
    err.msg[0] = 0;
    O->rc[rank] = pp_grad_norm(&g, ORDER_L, bufs, n, &O->norm[rank], &err);
    snprintf(O->msg[rank], sizeof O->msg[rank], "%s", err.msg);
    return O->rc[rank];
}

static void test_order(void) {
    int p, r, l;
    for (p = 1; p <= MAXP; p++) {
        order_run O;
        pp_error err;
        memset(&O, 0, sizeof O);
        O.p = p;
        O.data[0][0] = 1.0f;
        for (l = 1; l < ORDER_L; l++) O.data[l][0] = O.data[l][1] = ldexpf(1.0f, -27);
        CHECK(pp_threads_create(p, &O.th, &err) == PP_OK, "threads: %s", err.msg);
        CHECK(pp_threads_run(p, order_rank, &O, &err) == PP_OK, "order p=%d: %s", p, O.msg[0]);
        for (r = 0; r < p; r++)
            CHECK(O.norm[r] == 1.0, "order p=%d: rank %d's norm is 1 + %.3g, not 1: the per-layer sums were not added in layer "
                  "order", p, r, O.norm[r] - 1.0);
        pp_threads_destroy(O.th);
    }
    printf("order: per-layer sums 1, 8 x 2^-53 give the norm 1 exactly at p = 1..%d (another order gives 1 + 2^-51)\n", MAXP);
}

/* ---- half: conversions, sums in f32, norm of f16 gradients ----------------------------------- */
/* h is a nearest half of f, the even one on a tie: checked against both neighbours of the same
   sign (a result of Inf is checked on its own, with the edges). */
static int is_nearest(float f, uint16_t h, int bf) {
    float x = bf ? pp_bf16_to_f32(h) : pp_f16_to_f32(h);
    double e = fabs((double)f - (double)x);
    int k;
    if (isinf(x) || x != x) return 1;
    for (k = -1; k <= 1; k += 2) {
        uint16_t nb = (uint16_t)(h + k);
        float y;
        double ey;
        if ((h & 0x7fffu) == 0 && k < 0) continue; /* below zero: the other sign */
        y = bf ? pp_bf16_to_f32(nb) : pp_f16_to_f32(nb);
        if (y != y || (nb & 0x8000u) != (h & 0x8000u)) continue;
        ey = fabs((double)f - (double)y);
        if (ey < e || (ey == e && (h & 1u))) return 0;
    }
    return 1;
}

static int is_nan16(uint16_t h, int bf) { return bf ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

static void test_conversions(void) {
    uint32_t u;
    uint64_t seed = 12345;
    int bad16 = 0, badbf = 0, badrne = 0, i;
    for (u = 0; u < 0x10000u; u++) {
        uint16_t h = (uint16_t)u;
        float f = pp_f16_to_f32(h), b = pp_bf16_to_f32(h);
        if (f == f ? pp_f32_to_f16(f) != h : !is_nan16(pp_f32_to_f16(f), 0)) bad16++;
        if (b == b ? pp_f32_to_bf16(b) != h : !is_nan16(pp_f32_to_bf16(b), 1)) badbf++;
    }
    CHECK(bad16 == 0 && badbf == 0, "every f16 / bf16 bit pattern survives a round trip through f32 (NaN stays NaN): %d, %d "
          "did not", bad16, badbf);
    CHECK(pp_f32_to_f16(65504.0f) == 0x7bffu && pp_f32_to_f16(65519.0f) == 0x7bffu && pp_f32_to_f16(65520.0f) == 0x7c00u &&
              pp_f32_to_f16(-1e30f) == 0xfc00u && pp_f32_to_f16(ldexpf(1, -24)) == 1u && pp_f32_to_f16(ldexpf(1, -25)) == 0u &&
              pp_f32_to_f16(ldexpf(1.5f, -25)) == 1u && pp_f32_to_f16(ldexpf(1023.5f, -24)) == 0x400u &&
              pp_f32_to_f16(2049.0f) == pp_f32_to_f16(2048.0f) && pp_f32_to_f16(2051.0f) == pp_f32_to_f16(2052.0f),
          "f16 edges: the largest half, overflow to Inf, subnormals, ties to even");
    CHECK(pp_f32_to_bf16(1.0f + ldexpf(1, -8)) == pp_f32_to_bf16(1.0f) && pp_f32_to_bf16(3.4e38f) == 0x7f80u &&
              pp_bf16_to_f32(pp_f32_to_bf16(257.0f)) == 256.0f && pp_bf16_to_f32(pp_f32_to_bf16(259.0f)) == 260.0f,
          "bf16 edges: ties to even, overflow to Inf");
    for (i = 0; i < 200000; i++) { /* random floats over the halves' range and beyond */
        uint32_t r = (uint32_t)(mlp_rng_next(&seed) >> 32), x;
        float f;
        x = (r & 0x807fffffu) | ((uint32_t)(100 + (r >> 23) % 60) << 23); /* exponents 2^-27 .. 2^32 */
        memcpy(&f, &x, 4);
        if (!isinf(pp_f16_to_f32(pp_f32_to_f16(f))) && !is_nearest(f, pp_f32_to_f16(f), 0)) badrne++;
        if (!is_nearest(f, pp_f32_to_bf16(f), 1)) badrne++;
    }
    CHECK(badrne == 0, "%d random floats were not rounded to the nearest half, ties to even", badrne);
}

typedef struct half_run {
    pp_threads* th;
    int p;
    uint16_t buf[MAXP][3][64];  /* [rank][f16, bf16, tied f16][element] */
    uint16_t tied_a[64], tied_b[64];
    pp_result rc[MAXP];
    char msg[MAXP][600];
} half_run;

#define HN 64
static pp_result half_rank(int rank, void* user) {
    half_run* H = (half_run*)user;
    pp_transport t = pp_threads_transport(H->th, rank);
    pp_error err;
    int pair[2] = {0, H->p - 1};
    pp_result rc;
    err.msg[0] = 0;
    rc = pp_grad_allreduce(&t, NULL, 0, H->buf[rank][0], HN, PP_F16, 0.5, 20, &err);
    if (rc == PP_OK) rc = pp_grad_allreduce(&t, NULL, 0, H->buf[rank][1], HN, PP_BF16, 0.5, 20, &err);
    if (rc == PP_OK)
        rc = pp_tied_sum_grads(&t, pair, rank == pair[0] ? H->tied_a : NULL, rank == pair[1] ? H->tied_b : NULL, HN, PP_F16,
                               20, &err);
    snprintf(H->msg[rank], sizeof H->msg[rank], "%s", err.msg);
    return H->rc[rank] = rc;
}

static void test_half_sums(void) {
    half_run H;
    pp_error err;
    uint16_t want16[HN], wantbf[HN], wantt[HN];
    uint64_t seed = 77;
    int r, i, ok = 1;
    memset(&H, 0, sizeof H);
    H.p = 3;
    for (r = 0; r < H.p; r++)
        for (i = 0; i < HN; i++) {
            float x = (float)(mlp_rng_uniform(&seed) * 8.0 - 4.0);
            H.buf[r][0][i] = pp_f32_to_f16(x);
            H.buf[r][1][i] = pp_f32_to_bf16(x * 100.0f);
        }
    /* element 0: half accumulation loses the ones (2048 + 1 = 2048 in f16, 256 + 1 = 256 in bf16) */
    H.buf[0][0][0] = pp_f32_to_f16(2048.0f);
    H.buf[1][0][0] = H.buf[2][0][0] = pp_f32_to_f16(1.0f);
    H.buf[0][1][0] = pp_f32_to_bf16(256.0f);
    H.buf[1][1][0] = H.buf[2][1][0] = pp_f32_to_bf16(1.0f);
    for (i = 0; i < HN; i++) { /* rank order in f32, scaled, one rounding */
        float s16 = 0, sbf = 0;
        for (r = 0; r < H.p; r++) {
            s16 += pp_f16_to_f32(H.buf[r][0][i]);
            sbf += pp_bf16_to_f32(H.buf[r][1][i]);
        }
        want16[i] = pp_f32_to_f16(s16 * 0.5f);
        wantbf[i] = pp_f32_to_bf16(sbf * 0.5f);
        H.tied_a[i] = pp_f32_to_f16((float)i * 0.37f);
        H.tied_b[i] = pp_f32_to_f16(2048.0f - (float)i);
        wantt[i] = pp_f32_to_f16(pp_f16_to_f32(H.tied_a[i]) + pp_f16_to_f32(H.tied_b[i]));
    }
    CHECK(pp_threads_create(H.p, &H.th, &err) == PP_OK, "threads: %s", err.msg);
    CHECK(pp_threads_run(H.p, half_rank, &H, &err) == PP_OK, "half sums: %s", H.msg[0]);
    for (r = 0; r < H.p; r++) {
        ok &= memcmp(H.buf[r][0], want16, sizeof want16) == 0 && memcmp(H.buf[r][1], wantbf, sizeof wantbf) == 0;
    }
    CHECK(ok, "f16/bf16 all-reduce: every rank holds the f32 sum in rank order, halved, rounded once");
    CHECK(pp_f16_to_f32(H.buf[1][0][0]) == 1025.0f && pp_bf16_to_f32(H.buf[2][1][0]) == 129.0f,
          "accumulated in f32: (2048 + 1 + 1) / 2 = %g (f16), (256 + 1 + 1) / 2 = %g (bf16)", (double)pp_f16_to_f32(H.buf[1][0][0]),
          (double)pp_bf16_to_f32(H.buf[2][1][0]));
    CHECK(memcmp(H.tied_a, wantt, sizeof wantt) == 0 && memcmp(H.tied_b, wantt, sizeof wantt) == 0,
          "f16 tied sum across ranks 0 and 2: both copies hold a + b rounded once");
    pp_threads_destroy(H.th);
    { /* a rank holding both copies: the same bits locally */
        pp_threads* th;
        pp_transport t;
        int pair[2] = {0, 0};
        uint16_t a[HN], b[HN];
        for (i = 0; i < HN; i++) {
            a[i] = pp_f32_to_f16((float)i * 0.37f);
            b[i] = pp_f32_to_f16(2048.0f - (float)i);
        }
        CHECK(pp_threads_create(1, &th, &err) == PP_OK, "threads: %s", err.msg);
        t = pp_threads_transport(th, 0);
        CHECK(pp_tied_sum_grads(&t, pair, a, b, HN, PP_F16, 5, &err) == PP_OK && !memcmp(a, wantt, sizeof a) &&
                  !memcmp(b, wantt, sizeof b),
              "f16 tied sum on one rank: %s", err.msg);
        CHECK(pp_grad_allreduce(&t, NULL, 0, a, HN, PP_I32, 1, 5, &err) == PP_ERR_INVALID, "an integer gradient is refused");
        pp_threads_destroy(th);
    }
}

/* The norm of f16 and bf16 copies of real gradients, against the f32 norm. */
static void test_half_norm(void) {
    refgrad R;
    size_t n = npar(), i;
    uint16_t* h16 = (uint16_t*)calloc(n, 2);
    uint16_t* hbf = (uint16_t*)calloc(n, 2);
    tlm_model gw;
    pp_grad_buf bufs[MAXBUF];
    pp_error err;
    double n16 = 0, nbf = 0;
    int nb, k;
    reference(&R, 1);
    for (i = 0; i < n; i++) {
        h16[i] = pp_f32_to_f16(R.g[i]);
        hbf[i] = pp_f32_to_bf16(R.g[i]);
    }
    tlm_layout(&gw, R.g, VOCAB, DIM, 0);
    nb = grad_list(&gw, NULL, NULL, -1, 1, bufs);
    for (k = 0; k < nb; k++) { /* the same buffers, as halves at the same offsets */
        size_t off = (size_t)((float*)bufs[k].data - R.g);
        bufs[k].dtype = PP_F16;
        bufs[k].data = h16 + off;
    }
    CHECK(pp_grad_norm(NULL, NL, bufs, nb, &n16, &err) == PP_OK, "f16 norm: %s", err.msg);
    for (k = 0; k < nb; k++) {
        bufs[k].dtype = PP_BF16;
        bufs[k].data = hbf + ((uint16_t*)bufs[k].data - h16);
    }
    CHECK(pp_grad_norm(NULL, NL, bufs, nb, &nbf, &err) == PP_OK, "bf16 norm: %s", err.msg);
    CHECK(fabs(n16 - R.norm) <= 1e-3 * R.norm && fabs(nbf - R.norm) <= 1e-2 * R.norm,
          "the norm of f16 gradients %.9g, of bf16 %.9g, of f32 %.9g", n16, nbf, R.norm);
    printf("half: every f16/bf16 pattern round-trips, 200000 random floats round to nearest even; all-reduce and tied sums "
           "add in f32; norm of f16 gradients %.9g, bf16 %.9g, f32 %.9g (relative %.2g, %.2g)\n",
           n16, nbf, R.norm, fabs(n16 - R.norm) / R.norm, fabs(nbf - R.norm) / R.norm);
    free(h16);
    free(hbf);
    free(R.g);
    free(R.clipped);
}

/* ---- scaler ----------------------------------------------------------------------------------- */
static void test_scaler(void) {
    int two, pp = 2, r, s;
    for (two = 0; two < 2; two++) {
        grid G;
        pp_error err;
        grid_setup(&G, pp, PP_SCHED_1F1B, 1);
        G.scaler = 1;
        G.two_groups = two;
        G.inject_rank = pp * DP - 1; /* the last stage rank of replica 1 */
        CHECK(pp_threads_run(pp * DP, grid_rank, &G, &err) == PP_OK, "scaler: %s (%s)", err.msg, G.msg[0]);
        for (r = 0; r < pp * DP; r++) {
            CHECK(G.bad[r] == 0, "scaler: world rank %d: %s", r, G.msg[r]);
            CHECK(G.skip[r][0] == 1 && G.scale[r][1] == 16384.0f,
                  "%s: world rank %d: an Inf on world rank %d: skip %d, scale %g -> %g (every rank skips and halves)",
                  two ? "pipe, then dp" : "world", r, G.inject_rank, G.skip[r][0], (double)G.scale[r][0], (double)G.scale[r][1]);
            CHECK(G.skip[r][1] == 0 && G.skip[r][2] == 0 && G.scale[r][2] == 16384.0f && G.scale[r][3] == 32768.0f,
                  "world rank %d: two clean steps keep, then double the scale: %d %d, %g %g", r, G.skip[r][1], G.skip[r][2],
                  (double)G.scale[r][2], (double)G.scale[r][3]);
        }
        for (s = 0; s < STEPS; s++) { /* the reported loss is the unscaled one: compare with a run without scaling */
            float want = 0;
            tlm_model w;
            pp_model model = tlm_model_desc();
            float* g = (float*)calloc(npar(), sizeof(float));
            tlm_model gw;
            shard sh;
            tlm_layout(&w, g_w, VOCAB, DIM, 0);
            tlm_layout(&gw, g, VOCAB, DIM, 0);
            tlm_grid_shard(&sh, grid_seed(s, 0), M);
            pp_sequential_step(&model, &w, &gw, &sh.b, &want, NULL);
            int last = (pp - 1) * DP; /* the last stage's rank of replica 0 */
            CHECK(G.loss[last][s] == want, "step %d: loss %.9g with the loss scaled by %g, %.9g without", s,
                  (double)G.loss[last][s], (double)G.scale[last][s], (double)want);
            free(g);
        }
        grid_free(&G);
    }
    printf("scaler: pp x dp = 2 x 2, an Inf on world rank 3: every rank skips and halves the scale (world group; pipeline "
           "then data-parallel groups); clean steps unscale to the unscaled run's bits and grow the scale\n");
    {
        pp_loss_scaler sc;
        pp_loss_scaler_desc d;
        pp_error err;
        int skip = 0;
        float g1[3] = {2, 4, NAN};
        pp_grad_buf b;
        memset(&d, 0, sizeof d);
        CHECK(pp_loss_scaler_init(&sc, NULL, &err) == PP_OK && sc.scale == 65536.0f && sc.d.growth_interval == 2000 &&
                  sc.d.backoff_factor == 0.5f && sc.d.min_scale == 1.0f,
              "defaults: %s", err.msg);
        d.backoff_factor = 2;
        CHECK(pp_loss_scaler_init(&sc, &d, &err) == PP_ERR_INVALID, "a backoff factor above 1 is refused");
        d.backoff_factor = 0;
        d.init_scale = 2;
        d.min_scale = 1;
        CHECK(pp_loss_scaler_init(&sc, &d, &err) == PP_OK, "init: %s", err.msg);
        memset(&b, 0, sizeof b);
        b.data = g1;
        b.count = 3;
        b.dtype = PP_F32;
        CHECK(pp_loss_scaler_check(&sc, NULL, 0, &b, 1, &skip, &err) == PP_OK && skip && sc.scale == 1 && g1[0] == 2,
              "alone: a NaN skips, the scale halves, the gradients are untouched");
        CHECK(pp_loss_scaler_check(&sc, NULL, 0, &b, 1, &skip, &err) == PP_OK && skip && sc.scale == 1,
              "the scale stops at min_scale");
        g1[2] = 8;
        sc.scale = 4;
        CHECK(pp_loss_scaler_check(&sc, NULL, 0, &b, 1, &skip, &err) == PP_OK && !skip && g1[0] == 0.5f && g1[2] == 2.0f &&
                  sc.steps == 3 && sc.skipped == 2,
              "a clean step unscales");
    }
}

/* ---- pipeline, and what is refused ------------------------------------------------------------ */
static void test_pipeline(void) {
    refgrad R;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    tlm_model w, gw;
    float* g = (float*)calloc(npar(), sizeof(float));
    pp_grad_buf bufs[MAXBUF];
    size_t nE = (size_t)VOCAB * DIM, hoff, hn, i;
    double norm = 0, n2 = 0, coef = 0, want;
    int nb;
    reference(&R, 1);
    tlm_layout(&w, g_w, VOCAB, DIM, 0);
    tlm_layout(&gw, g, VOCAB, DIM, 0);
    memset(&d, 0, sizeof d);
    d.model = tlm_model_desc();
    d.weights = &w;
    d.grads = &gw; /* one struct: each rank adds into its own layers */
    d.schedule = PP_SCHED_INTERLEAVED;
    d.p = 3;
    d.v = 2;
    d.m = M;
    d.stage.timeout_s = 20;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "pipeline: %s", err.msg);
    CHECK(pp_pipeline_step(pl, &g_shard.b, NULL) == PP_OK, "step: %s", pp_pipeline_error(pl));
    tlm_grid_layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    for (i = 0; i < nE; i++) g[i] = g[hoff + i] = g[i] + g[hoff + i]; /* the tied sum, in one process */
    nb = grad_list(&gw, NULL, NULL, -1, 1, bufs);
    CHECK(pp_pipeline_grad_norm(pl, bufs, nb, &norm, &err) == PP_OK && memcmp(&norm, &R.norm, sizeof norm) == 0,
          "pp_pipeline_grad_norm %.17g, the sequential %.17g: %s", norm, R.norm, err.msg);
    CHECK(pp_pipeline_grad_clip(pl, bufs, nb, R.max_norm, &n2, &err) == PP_OK && n2 == norm &&
              memcmp(g, R.clipped, npar() * sizeof(float)) == 0,
          "pp_pipeline_grad_clip: the sequential clip's bits: %s", err.msg);
    /* a shared buffer listed twice counts once and is scaled once */
    bufs[nb] = bufs[0];
    bufs[nb].layer = TLM_HEAD_LAYER;
    bufs[nb].tied_copy = 0;
    want = R.norm * (R.max_norm / (R.norm + 1e-6));
    CHECK(pp_pipeline_grad_norm(pl, bufs, nb + 1, &n2, &err) == PP_OK && fabs(n2 - want) < 1e-6 * want,
          "an entry with an earlier entry's data is skipped: %.17g (clipped to %.17g)", n2, want);
    /* refusals */
    bufs[0].layer = NL;
    CHECK(pp_pipeline_grad_norm(pl, bufs, nb, &n2, &err) == PP_ERR_INVALID && strstr(err.msg, "layer 13"),
          "a layer outside the model: %s", err.msg);
    bufs[0].layer = 0;
    bufs[0].dtype = PP_I32;
    CHECK(pp_grad_norm(NULL, NL, bufs, nb, &n2, &err) == PP_ERR_INVALID && strstr(err.msg, "i32"), "an integer dtype: %s", err.msg);
    bufs[0].dtype = PP_F32;
    CHECK(pp_grad_clip(bufs, nb, 0, norm, &coef, &err) == PP_ERR_INVALID, "max_norm 0");
    memcpy(g, R.g, npar() * sizeof(float));
    CHECK(pp_grad_clip(bufs, nb, 1.0, NAN, &coef, &err) == PP_ERR_NONFINITE && coef == 1 &&
              memcmp(g, R.g, npar() * sizeof(float)) == 0,
          "a NaN norm: PP_ERR_NONFINITE, gradients untouched: %s", err.msg);
    CHECK(pp_grad_clip(bufs, nb, R.norm * 2, R.norm, &coef, &err) == PP_OK && coef == 1 &&
              memcmp(g, R.g, npar() * sizeof(float)) == 0,
          "below max_norm nothing changes");
    { /* a loss scale that is not one */
        pp_batch b = g_shard.b;
        float loss;
        b.loss_scale = -1;
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_INVALID && strstr(pp_pipeline_error(pl), "loss_scale"),
              "a negative loss_scale: %s", pp_pipeline_error(pl));
        b.loss_scale = NAN;
        CHECK(pp_sequential_step(&d.model, &w, &gw, &b, &loss, &err) == PP_ERR_INVALID, "a NaN loss_scale: %s", err.msg);
    }
    pp_pipeline_destroy(pl);
    { /* a layer listed by two ranks of the group: every rank refuses; a layer another rank owns */
        hx_sched sc;
        int first[3] = {0, 6, NL};
        pp_threads* th;
        pp_stage_desc sd;
        pp_stage* st = NULL;
        CHECK(hx_sched_make(&sc, PP_SCHED_1F1B, 2, 1, M, &err) == PP_OK, "schedule: %s", err.msg);
        CHECK(pp_threads_create(2, &th, &err) == PP_OK, "threads: %s", err.msg);
        hx_stage_desc(&sd, NULL, tlm_model_desc(), &w, &gw, &sc.s, first, 0, pp_threads_transport(th, 0));
        CHECK(pp_stage_create(&sd, &st, &err) == PP_OK, "stage: %s", err.msg);
        nb = grad_list(&gw, NULL, NULL, -1, 1, bufs);
        CHECK(pp_stage_grad_norm(st, bufs, nb, &n2, &err) == PP_ERR_INVALID && strstr(err.msg, "belongs to rank 1"),
              "a layer of rank 1 listed on rank 0: %s", err.msg);
        pp_stage_destroy(st);
        pp_threads_destroy(th);
        hx_sched_free(&sc);
    }
    free(g);
    free(R.g);
    free(R.clipped);
}

typedef struct twice_run {
    pp_threads* th;
    float x[2];
    pp_result rc[2];
    char msg[2][600];
} twice_run;

static pp_result twice_rank(int rank, void* user) {
    twice_run* T = (twice_run*)user;
    pp_transport t = pp_threads_transport(T->th, rank);
    pp_group g;
    pp_grad_buf b;
    pp_error err;
    double n;
    memset(&g, 0, sizeof g);
    g.t = &t;
    g.timeout_s = 10;
    memset(&b, 0, sizeof b);
    b.layer = 1;
    b.data = &T->x[rank];
    b.count = 1;
    b.dtype = PP_F32;
    err.msg[0] = 0;
    T->rc[rank] = pp_grad_norm(&g, 3, &b, 1, &n, &err);
    snprintf(T->msg[rank], sizeof T->msg[rank], "%s", err.msg);
    return PP_OK;
}

static void test_listed_twice(void) {
    twice_run T;
    pp_error err;
    memset(&T, 0, sizeof T);
    T.x[0] = T.x[1] = 1;
    CHECK(pp_threads_create(2, &T.th, &err) == PP_OK, "threads: %s", err.msg);
    CHECK(pp_threads_run(2, twice_rank, &T, &err) == PP_OK, "run");
    CHECK(T.rc[0] == PP_ERR_INVALID && T.rc[1] == PP_ERR_INVALID && strstr(T.msg[1], "listed by 2 ranks"),
          "a layer listed by both ranks of the group: every rank refuses: %s", T.msg[0]);
    pp_threads_destroy(T.th);
}

/* ---- tensor parallelism: pp_grad_norm_tp, pp_stage_grad_clip_tp, the scaler over pp x dp x tp --
   Synthetic gradients of the tlm model's NL layers: layer l has a TPR x TPC weight, sharded over
   the TP group (even layers by rows, odd layers by columns), and a bias of TPC replicated on every
   TP rank. The gathered norm is pp_grad_norm's over whole buffers; with tp = 1, 2, 4 and every
   schedule kind, p and partition, every rank of the grid gets the same bits at a given tp (the
   first run's), within 1e-12 of the gathered norm, and pp_stage_grad_clip_tp the same norm and the
   same coefficient. Negative control: -DPP_TEST_TP_REPLICATED_EACH counts the bias tp times. */
#define TPR 8
#define TPC 12
#define MAXTP 4
static float g_tpw[NL][TPR * TPC], g_tpb[NL][TPC];

static void tp_fill(void) {
    uint32_t x = 12345u;
    int l, i;
    for (l = 0; l < NL; l++) {
        double mag = ldexp(1.0, l % 5 - 2);
        for (i = 0; i < TPR * TPC; i++) {
            x = x * 1664525u + 1013904223u;
            g_tpw[l][i] = (float)(mag * ((double)(x >> 8) / 16777216.0 - 0.5));
        }
        for (i = 0; i < TPC; i++) {
            x = x * 1664525u + 1013904223u;
            g_tpb[l][i] = (float)(mag * ((double)(x >> 8) / 16777216.0 - 0.5));
        }
    }
}

/* TP rank k's shard of layer l's weight into out (rows k * TPR / tp.., or those columns of every
   row); returns its count. */
static size_t tp_shard(int l, int tp, int k, float* out) {
    size_t n = 0;
    int i, j;
    if (l % 2 == 0) {
        for (i = k * TPR / tp; i < (k + 1) * TPR / tp; i++)
            for (j = 0; j < TPC; j++) out[n++] = g_tpw[l][i * TPC + j];
    } else {
        for (i = 0; i < TPR; i++)
            for (j = k * TPC / tp; j < (k + 1) * TPC / tp; j++) out[n++] = g_tpw[l][i * TPC + j];
    }
    return n;
}

typedef struct tpcfg {
    hx_sched sc;
    int first[MAXP * 3 + 1];
    int p, tp, drop;             /* drop: TP rank 1 leaves out its first layer (refused) */
    double max_norm;
    pp_threads* pipes[MAXTP];
    pp_threads* all;             /* p * tp ranks, world rank r * tp + k: the TP groups' transport */
    float mem[MAXP * MAXTP][NL][TPR * TPC + TPC];
    double norm[MAXP * MAXTP], norm2[MAXP * MAXTP];
    pp_result rc[MAXP * MAXTP];
    int bad[MAXP * MAXTP];
    char msg[MAXP * MAXTP][600];
} tpcfg;

static int tp_bufs(tpcfg* C, int r, int k, int wr, pp_grad_buf* bufs) {
    int l, nb = 0, dropped = 0;
    for (l = 0; l < NL; l++) {
        float* m = C->mem[wr][l];
        if (pp_schedule_layer_rank(&C->sc.s, C->first, l) != r) continue;
        if (C->drop && k == 1 && !dropped) {
            dropped = 1;
            continue;
        }
        memcpy(m, g_tpb[l], sizeof g_tpb[l]);
        memset(&bufs[nb], 0, 2 * sizeof *bufs);
        bufs[nb].layer = bufs[nb + 1].layer = l;
        bufs[nb].dtype = bufs[nb + 1].dtype = PP_F32;
        bufs[nb].data = m;
        bufs[nb].count = TPC;
        bufs[nb + 1].data = m + TPC;
        bufs[nb + 1].count = tp_shard(l, C->tp, k, m + TPC);
        bufs[nb + 1].tp_sharded = 1;
        nb += 2;
    }
    return nb;
}

static pp_result tp_rank(int wr, void* user) {
    tpcfg* C = (tpcfg*)user;
    int r = wr / C->tp, k = wr % C->tp, tranks[MAXTP], i, nb;
    pp_transport pipe = pp_threads_transport(C->pipes[k], r), all = pp_threads_transport(C->all, wr);
    pp_group pg, tg;
    pp_grad_buf bufs[2 * NL];
    pp_model model = tlm_model_desc();
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    tlm_model w, gw;
    float* arena = (float*)calloc(npar(), sizeof(float));
    float orig[TPR * TPC];
    double coef;
    pp_result rc;
    err.msg[0] = 0;
    for (i = 0; i < C->tp; i++) tranks[i] = r * C->tp + i;
    memset(&pg, 0, sizeof pg);
    memset(&tg, 0, sizeof tg);
    pg.t = &pipe;
    pg.timeout_s = tg.timeout_s = 20;
    tg.t = &all;
    tg.ranks = tranks;
    tg.n_ranks = C->tp;
    nb = tp_bufs(C, r, k, wr, bufs);
    rc = C->rc[wr] = pp_grad_norm_tp(&pg, &tg, NL, bufs, nb, &C->norm[wr], &err);
    if (rc != PP_OK || C->drop) goto out;
    tlm_layout(&w, g_w, VOCAB, DIM, 0);
    tlm_layout(&gw, arena, VOCAB, DIM, 0);
    hx_stage_desc(&d, NULL, model, &w, &gw, &C->sc.s, C->first, r, pipe);
    d.timeout_s = 20;
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) goto out;
    if ((rc = pp_stage_grad_clip_tp(st, &tg, bufs, nb, C->max_norm, &C->norm2[wr], &err)) != PP_OK) goto out;
    coef = C->max_norm / (C->norm2[wr] + 1e-6);
    for (i = 0; i < nb; i++) { /* every value scaled by the one coefficient */
        size_t j, n = bufs[i].tp_sharded ? tp_shard(bufs[i].layer, C->tp, k, orig) : TPC;
        const float* o = bufs[i].tp_sharded ? orig : g_tpb[bufs[i].layer];
        for (j = 0; j < n; j++)
            if (((float*)bufs[i].data)[j] != o[j] * (float)coef && !C->bad[wr]++)
                snprintf(C->msg[wr], sizeof C->msg[wr], "layer %d: clipped %.9g, want %.9g * %.17g", bufs[i].layer,
                         (double)((float*)bufs[i].data)[j], (double)o[j], coef);
    }
out:
    if (rc != PP_OK) snprintf(C->msg[wr], sizeof C->msg[wr], "%s", err.msg);
    pp_stage_destroy(st);
    free(arena);
    return PP_OK;
}

static tpcfg* tp_setup(pp_schedule_kind kind, int p, int v, int tp, int lopsided) {
    tpcfg* C = (tpcfg*)calloc(1, sizeof *C);
    pp_error err;
    int r, S = p * v;
    C->p = p;
    C->tp = tp;
    CHECK(hx_sched_make(&C->sc, kind, p, v, M, &err) == PP_OK, "%s p=%d v=%d: %s", pp_schedule_name(kind), p, v, err.msg);
    if (lopsided) {
        for (r = 0; r < S; r++) C->first[r] = r;
        C->first[S] = NL;
    } else {
        CHECK(pp_partition_uniform(NL, S, C->first, &err) == PP_OK, "partition: %s", err.msg);
    }
    for (r = 0; r < tp; r++) CHECK(pp_threads_create(p, &C->pipes[r], &err) == PP_OK, "threads: %s", err.msg);
    CHECK(pp_threads_create(p * tp, &C->all, &err) == PP_OK, "threads: %s", err.msg);
    return C;
}

static void tp_free(tpcfg* C) {
    int r;
    for (r = 0; r < C->tp; r++) pp_threads_destroy(C->pipes[r]);
    pp_threads_destroy(C->all);
    hx_sched_free(&C->sc);
    free(C);
}

static void test_tp_norm(void) {
    pp_grad_buf bufs[2 * NL];
    pp_error err;
    double ref, first[MAXTP + 1];
    int l, tp, k, p, v, lop, r, runs = 0;
    tp_fill();
    memset(bufs, 0, sizeof bufs);
    for (l = 0; l < NL; l++) { /* the gathered gradients, pp_grad_norm as before tensor parallelism */
        bufs[2 * l].layer = bufs[2 * l + 1].layer = l;
        bufs[2 * l].dtype = bufs[2 * l + 1].dtype = PP_F32;
        bufs[2 * l].data = g_tpb[l];
        bufs[2 * l].count = TPC;
        bufs[2 * l + 1].data = g_tpw[l];
        bufs[2 * l + 1].count = TPR * TPC;
    }
    CHECK(pp_grad_norm(NULL, NL, bufs, 2 * NL, &ref, &err) == PP_OK && ref > 0, "gathered norm: %s", err.msg);
    for (tp = 1; tp <= MAXTP; tp *= 2) {
        int n = 0;
        for (k = 0; k < PP_SCHED_KIND_COUNT; k++)
            for (p = 1; p <= MAXP; p++)
                for (v = 1; v <= 3; v++) {
                    pp_schedule_kind kind = (pp_schedule_kind)k;
                    tpcfg* C;
                    if (pp_schedule_kind_v(kind, v) != v || pp_schedule_size(kind, p, v, M) == 0 || p * v > NL) continue;
                    lop = (k + p + v) & 1;
                    C = tp_setup(kind, p, v, tp, lop);
                    C->max_norm = ref * 0.5;
                    CHECK(pp_threads_run(p * tp, tp_rank, C, &err) == PP_OK, "run: %s", err.msg);
                    if (n++ == 0) first[tp] = C->norm[0];
                    for (r = 0; r < p * tp; r++) {
                        CHECK(C->rc[r] == PP_OK && C->bad[r] == 0, "tp=%d %s p=%d v=%d: world rank %d: %s", tp,
                              pp_schedule_name(kind), p, v, r, C->msg[r]);
                        CHECK(memcmp(&C->norm[r], &first[tp], sizeof(double)) == 0 &&
                                  memcmp(&C->norm2[r], &first[tp], sizeof(double)) == 0,
                              "tp=%d %s p=%d v=%d %s: world rank %d's norm %.17g (the stage's %.17g), the first run's %.17g",
                              tp, pp_schedule_name(kind), p, v, lop ? "lopsided" : "uniform", r, C->norm[r], C->norm2[r],
                              first[tp]);
                    }
                    tp_free(C);
                    runs++;
                }
        CHECK(fabs(first[tp] - ref) <= 1e-12 * ref, "tp=%d: norm %.17g, the gathered gradients' %.17g", tp, first[tp], ref);
    }
    { /* a layer listed by one TP rank and not its peer: refused on every rank */
        tpcfg* C = tp_setup(PP_SCHED_1F1B, 1, 1, 2, 0);
        C->drop = 1;
        CHECK(pp_threads_run(2, tp_rank, C, &err) == PP_OK, "run: %s", err.msg);
        CHECK(C->rc[0] == PP_ERR_INVALID && C->rc[1] == PP_ERR_INVALID && strstr(C->msg[0], "of the 2 ranks of the TP group"),
              "a layer only one TP rank lists: %s / %s", C->msg[0], C->msg[1]);
        tp_free(C);
    }
    bufs[1].tp_sharded = 2;
    CHECK(pp_grad_norm_tp(NULL, NULL, NL, bufs, 2 * NL, &first[0], &err) == PP_ERR_INVALID && strstr(err.msg, "tp_sharded = 2"),
          "tp_sharded = 2: refused (%s)", err.msg);
    bufs[1].tp_sharded = 0;
    printf("tp: %d runs (tp = 1, 2, 4; every kind, p = 1..%d, v where the kind takes it): every rank's norm the same bits "
           "at each tp (%.17g, %.17g, %.17g), within 1e-12 of the gathered %.17g; pp_stage_grad_clip_tp: the same norm, "
           "one coefficient; a layer one TP rank leaves out, and tp_sharded = 2, refused\n",
           runs, MAXP, first[1], first[2], first[4], ref);
}

/* The scaler over pp x dp x tp = 2 x 2 x 2 (one threads world, groups as rank lists): a NaN in one
   TP rank's shard skips the step on all 8 ranks with the groups pipe, dp, tp; a clean step on
   none. Negative control: -DPP_TEST_TP_SCALER_NO_TP leaves the TP group out of the list. */
typedef struct tpscal {
    pp_threads* all;
    int skip[8][2];
    float scale[8][3];
    pp_result rc[8];
} tpscal;

static pp_result tpscal_rank(int wr, void* user) {
    tpscal* T = (tpscal*)user;
    int r = wr / 4, d = (wr / 2) % 2, k = wr % 2, pr[2], dr[2], tr[2], i, step, ng = 3;
    pp_transport all = pp_threads_transport(T->all, wr);
    pp_group groups[3];
    pp_loss_scaler sc;
    pp_grad_buf b[2];
    float shard[6], bias[3];
    pp_error err;
    for (i = 0; i < 2; i++) {
        pr[i] = i * 4 + d * 2 + k;
        dr[i] = r * 4 + i * 2 + k;
        tr[i] = r * 4 + d * 2 + i;
    }
    memset(groups, 0, sizeof groups);
    for (i = 0; i < 3; i++) {
        groups[i].t = &all;
        groups[i].n_ranks = 2;
        groups[i].timeout_s = 20;
    }
    groups[0].ranks = pr;
    groups[1].ranks = dr;
    groups[2].ranks = tr;
#ifdef PP_TEST_TP_SCALER_NO_TP
    ng = 2;
#endif
    memset(b, 0, sizeof b);
    b[0].data = bias;
    b[0].count = 3;
    b[1].data = shard;
    b[1].count = 6;
    b[1].tp_sharded = 1;
    b[0].dtype = b[1].dtype = PP_F32;
    b[0].layer = b[1].layer = r;
    if ((T->rc[wr] = pp_loss_scaler_init(&sc, NULL, &err)) != PP_OK) return PP_OK;
    for (step = 0; step < 2; step++) {
        for (i = 0; i < 6; i++) shard[i] = (float)(i + k);
        for (i = 0; i < 3; i++) bias[i] = 2.0f;
        if (step == 0 && wr == 5) shard[3] = NAN; /* pipe rank 1, replica 0, TP rank 1 */
        T->scale[wr][step] = sc.scale;
        if ((T->rc[wr] = pp_loss_scaler_check(&sc, groups, ng, b, 2, &T->skip[wr][step], &err)) != PP_OK) return PP_OK;
    }
    T->scale[wr][2] = sc.scale;
    return PP_OK;
}

static void test_tp_scaler(void) {
    tpscal T;
    pp_error err;
    int r;
    memset(&T, 0, sizeof T);
    CHECK(pp_threads_create(8, &T.all, &err) == PP_OK, "threads: %s", err.msg);
    CHECK(pp_threads_run(8, tpscal_rank, &T, &err) == PP_OK, "run: %s", err.msg);
    for (r = 0; r < 8; r++)
        CHECK(T.rc[r] == PP_OK && T.skip[r][0] == 1 && T.skip[r][1] == 0 && T.scale[r][1] == 32768.0f &&
                  T.scale[r][2] == 32768.0f,
              "world rank %d (pp %d, dp %d, tp %d): a NaN on TP rank 1 of world rank 5: %s, skip %d then %d, scale %g, %g",
              r, r / 4, (r / 2) % 2, r % 2, pp_result_str(T.rc[r]), T.skip[r][0], T.skip[r][1], (double)T.scale[r][1],
              (double)T.scale[r][2]);
    pp_threads_destroy(T.all);
    printf("tpscaler: pp x dp x tp = 2 x 2 x 2, a NaN on one TP rank: all 8 ranks skip and halve the scale (groups pipe, "
           "dp, tp); the clean step after on none\n");
}

/* ---- clipping at the largest finite values ------------------------------------------------------
   max_norm = DBL_MAX is a bound like any other (nothing scaled); a norm of DBL_MAX is finite and
   scales the gradients (by max_norm / DBL_MAX); Inf and NaN stay refused. */
#include <float.h>
static void test_clip_bound(void) {
    float g[4] = {1, -2, 3, -4}, g0[4];
    pp_grad_buf b;
    pp_error err;
    pp_result rc;
    double coef = 0;
    memcpy(g0, g, sizeof g);
    memset(&b, 0, sizeof b);
    b.data = g, b.count = 4, b.dtype = PP_F32;
    rc = pp_grad_clip(&b, 1, DBL_MAX, sqrt(30.0), &coef, &err);
    CHECK(rc == PP_OK && coef == 1 && !memcmp(g, g0, sizeof g), "max_norm = DBL_MAX: %s (%s), coef %g", pp_result_str(rc),
          err.msg, coef);
    rc = pp_grad_clip(&b, 1, DBL_MAX, DBL_MAX, &coef, &err);
    CHECK(rc == PP_OK && coef == 1 && !memcmp(g, g0, sizeof g), "max_norm = norm = DBL_MAX: %s (%s), coef %g",
          pp_result_str(rc), err.msg, coef);
    rc = pp_grad_clip(&b, 1, 1e300, DBL_MAX, &coef, &err);
    CHECK(rc == PP_OK && coef > 0 && coef < 1 && g[3] < 0 && g[3] > -4, "a norm of DBL_MAX, max_norm 1e300: %s (%s), coef %g",
          pp_result_str(rc), err.msg, coef);
    CHECK(pp_grad_clip(&b, 1, HUGE_VAL, 1, &coef, &err) == PP_ERR_INVALID, "max_norm = Inf: refused");
    CHECK(pp_grad_clip(&b, 1, NAN, 1, &coef, &err) == PP_ERR_INVALID, "max_norm = NaN: refused");
    CHECK(pp_grad_clip(&b, 1, 1, HUGE_VAL, &coef, &err) == PP_ERR_NONFINITE, "norm = Inf: PP_ERR_NONFINITE");
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : NULL;
    size_t n = npar();
    g_quick = getenv("PP_QUICK") != NULL;
    g_w = (float*)malloc(n * sizeof(float));
    tlm_fill(g_w, VOCAB, DIM, 17);
    tlm_grid_shard(&g_shard, 4242, M);
    if (!only || !strcmp(only, "order")) test_order();
    if (!only || !strcmp(only, "half")) {
        test_conversions();
        test_half_sums();
        test_half_norm();
    }
    if (!only || !strcmp(only, "scaler")) test_scaler();
    if (!only || !strcmp(only, "pipeline")) {
        test_pipeline();
        test_listed_twice();
    }
    if (!only || !strcmp(only, "norm")) {
        test_norm();
        test_grid();
    }
    if (!only || !strcmp(only, "clipbound")) test_clip_bound();
    if (!only || !strcmp(only, "tp")) test_tp_norm();
    if (!only || !strcmp(only, "tpscaler")) test_tp_scaler();
    free(g_w);
    return TEST_DONE("test_gradnorm");
}
