/* tests/test_pipeline.c - pipelined training steps equal the sequential reference, bit for bit.

   Every built-in schedule runs each stage's backwards in ascending micro-batch order, which is
   the order of the sequential reference, so each gradient element is the same sum of the same
   products in the same order: we compare with memcmp, not a tolerance. Each rank has its own
   gradient buffers, and a rank must leave the layers it does not own untouched (zero).

   grid (also alone: test_pipeline grid): pp_pipeline with dp and tp (pp_pipeline_desc.dp, .tp)
   over every kind, p = 1..3, dp and tp in {1, 2}, with a row-parallel model whose layers reach
   their TP group as io->tp. Small integers: the dp = 2 run's gradients on every rank equal the
   sequential model's on each half of the data, added and halved (dp_scale 1: added), bit for
   bit; tp = 2's rows equal the unsplit model's; the loss is the replicas' mean; the norm of
   replica 0's buffers is the sequential one's. Where dp or tp > 1 (a rotation under the
   sanitizers) a layer's failure or (p > 1) a send's is injected on one rank: the step fails
   with that rank named, every rank's result is an error, no rank waits for its deadline, and
   the next step is bit-exact. Bad dp, tp, dp_scale, shared gradients and a missing params
   hook are refused. Negative controls (build/tp-controls): -DPP_TEST_PL_NO_DP_SUM skips the dp
   sum, -DPP_TEST_PL_TP_IS_DP gives the layers the dp group as io->tp: both fail here.

   matrix (also alone: test_pipeline matrix): issue 40's, every kind, p = 1..4, two partitions,
   tp 1, 2, 4, dp 1, 2, dense and packed, real-valued data, partial sums added in a tp-dependent
   order: bit-identical within each (tp, dp, packing) and run to run, within 1e-5 of tp = 1 (one
   in 3 of the 900 configurations a run, clang 1 in 6, the sanitizers 1 in 8; PP_TEST_FULL=1 all). Its
   control (-DPP_TEST_PL_MATRIX_ORDER: ranks past the first stage sum in reverse) fails. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"
#include <math.h>
#include <time.h>

#define ROWS 33
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

/* One configuration: pipelined step(s) vs reference step(s). Returns 1 when equal. */
static int run_case(pp_schedule_kind kind, int p, int v, int m, const int* first, const char* part_name,
                    const mlp_model* w, const mlp_model* gref, float loss_ref, const pp_batch* batch, int steps) {
    static hx_world W;
    mlp_model g[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    hx_sched sc;
    pp_error err;
    int ok = 1;
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d partition=%s", pp_schedule_name(kind), p, v, m, part_name);
    if (hx_sched_make(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule: %s", where, err.msg);
        return 0;
    }
    hx_mlp_world(&W, w, &sc.s, first, batch, steps, g, gbuf, DIMS);
    if (hx_run(&W, p, &err) != PP_OK) {
        hx_report(&W, p, where);
        ok = 0;
    }
    ok = ok && hx_mlp_grads_match(g, p, &sc.s, first, gref, 1, where);
    ok = ok && hx_loss_matches(W.stats, p, &sc.s, loss_ref, where);
    hx_mlp_free_grads(gbuf, p);
    hx_sched_free(&sc);
    if (ok) CHECK(1, "%s", where);
    return ok;
}

static void test_grid(void) {
    static const int ms[] = {1, 2, 3, 4, 7, 8, 16};
    hx_mlp f;
    pp_batch b;
    pp_error err;
    pp_model model = mlp_model_desc();
    double cost[MLP_DEPTH + 1];
    pp_tensor sample;
    int kind, p, v, mi, part, cases = 0, good = 0;
    hx_mlp_init(&f, DIMS, 42, ROWS, 7, 99);
    memset(&sample, 0, sizeof sample);
    sample.rows = ROWS;
    sample.cols = HX_IN;
    sample.dtype = PP_F32;
    CHECK(pp_model_layer_costs(&model, &f.w, &sample, cost, NULL, &err) == PP_OK, "%s", err.msg);
    for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
        int m = ms[mi];
        hx_dense_batch(&b, f.x, f.y, ROWS, HX_IN, m);
        if (hx_mlp_reference(&f, &b, 1, &err) != PP_OK) {
            CHECK(0, "reference m=%d: %s", m, err.msg);
            continue;
        }
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (p = 1; p <= 4; p++)
                for (v = 1; v <= 3; v++) {
                    int S = p * v, first[16];
                    if (!pp_schedule_size((pp_schedule_kind)kind, p, v, 4)) continue; /* not a v this kind runs */
                    for (part = 0; part < 3; part++) {
                        const char* pname = part == 0 ? "uniform" : part == 1 ? "cost" : "skewed";
                        int s;
                        if (part == 0) pp_partition_uniform(model.n_layers, S, first, &err);
                        else if (part == 1) pp_partition_balanced(cost, model.n_layers, S, first, &err);
                        else {
                            /* first stage takes everything but one layer per other stage */
                            first[0] = 0;
                            for (s = 1; s <= S; s++) first[s] = model.n_layers - (S - s);
                        }
                        if (S == 1 && part > 0) continue;
                        cases++;
                        good += run_case((pp_schedule_kind)kind, p, v, m, first, pname, &f.w, &f.gref, f.loss, &b, 1);
                    }
                }
    }
    printf("gradient equality: %d of %d configurations bit-exact\n", good, cases);
    hx_mlp_free(&f);
}

/* Two steps accumulate: the gradient after two pipelined steps equals two reference steps. */
static void test_accumulate_two_steps(void) {
    hx_mlp f;
    pp_batch b;
    pp_error err;
    int first[5];
    hx_mlp_init(&f, DIMS, 3, ROWS, 5, 6);
    hx_dense_batch(&b, f.x, f.y, ROWS, HX_IN, 4);
    b.loss = PP_LOSS_MEAN_ROWS;
    hx_mlp_reference(&f, &b, 2, &err);
    pp_partition_uniform(f.model.n_layers, 4, first, &err);
    run_case(PP_SCHED_1F1B, 4, 1, 4, first, "uniform, 2 steps, rows-weighted loss", &f.w, &f.gref, f.loss, &b, 2);
    hx_mlp_free(&f);
}


/* ---- grid: the one-process pipeline with dp and tp (pp_pipeline_desc.dp, .tp) ----------------- */
/* Model: GL - 1 row-parallel linears x (rows, GK) -> y (rows, GK), then a squared error. A TP rank
   t of n holds rows [t * GK / n, (t + 1) * GK / n) of each W in its first GK / n rows; it
   multiplies its columns of x by them and all-reduces over io->tp (forward: y; backward: dx).
   With io->tp NULL (pp_sequential_step, tp = 1) it is the whole matrix. Small integers and
   dyadic scales: every sum is exact, so any association gives the same bits. */
#define GL 9
#define GK 4
#define GR 2 /* rows per micro-batch */
#define GMAXM 8
typedef struct gmodel {
    float w[GL - 1][GK * GK];
} gmodel;

static int g_fwd(const void* wv, int l, pp_layer_io* io) {
    const gmodel* w = (const gmodel*)wv;
    const float* x = (const float*)io->in[0].data; /* (rows, GK) */
    int64_t r, rows = io->in[0].rows;
    int t = pp_group_rank(io->tp), kh = GK / pp_group_size(io->tp), k, j;
    const int* fault = (const int*)io->model->ctx; /* {armed world rank, -1} */
    pp_error err;
    if (fault && io->ctx && *(const int*)io->ctx == fault[0]) return 7; /* the injected failure */
    if (l == GL - 1) {
        const float* tg = (const float*)io->mb->targets;
        float acc = 0;
        for (r = 0; r < rows * GK; r++) acc += (x[r] - tg[r]) * (x[r] - tg[r]);
        io->loss = acc / (float)rows;
        return 0;
    }
    {
        float* y = (float*)io->out[0].data;
        for (r = 0; r < rows; r++)
            for (j = 0; j < GK; j++) {
                float a = 0;
                for (k = 0; k < kh; k++) a += x[r * GK + t * kh + k] * w->w[l][k * GK + j];
                y[r * GK + j] = a;
            }
        return pp_tp_allreduce(io->tp, y, (size_t)rows * GK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static int g_bwd(const void* wv, void* gv, int l, pp_layer_io* io) {
    const gmodel* w = (const gmodel*)wv;
    gmodel* g = (gmodel*)gv;
    const float* x = (const float*)io->in[0].data;
    float* dx = (float*)io->d_in[0].data;
    int64_t r, rows = io->in[0].rows;
    int t = pp_group_rank(io->tp), kh = GK / pp_group_size(io->tp), k, j;
    pp_error err;
    if (l == GL - 1) {
        const float* tg = (const float*)io->mb->targets;
        for (r = 0; r < rows * GK; r++) dx[r] = 2.0f * (x[r] - tg[r]) / (float)rows * io->mb->loss_scale;
        return 0;
    }
    {
        const float* dy = (const float*)io->d_out[0].data;
        for (k = 0; k < kh; k++)
            for (j = 0; j < GK; j++) {
                float a = 0;
                for (r = 0; r < rows; r++) a += x[r * GK + t * kh + k] * dy[r * GK + j];
                g->w[l][k * GK + j] += a;
            }
        if (!dx) return 0;
        for (r = 0; r < rows; r++)
            for (k = 0; k < GK; k++) {
                float a = 0;
                int kk = k - t * kh;
                if (kk >= 0 && kk < kh)
                    for (j = 0; j < GK; j++) a += dy[r * GK + j] * w->w[l][kk * GK + j];
                dx[r * GK + k] = a;
            }
        return pp_tp_allreduce(io->tp, dx, (size_t)rows * GK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static void g_desc(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)mb, (void)n_in;
    d->n_out = l == GL - 1 ? 0 : 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = GK;
    d->out[0].dtype = PP_F32;
    d->n_params = l == GL - 1 ? 0 : GK * GK;
}
static const char* g_name(int l) { return l == GL - 1 ? "loss" : "rowpar"; }
static int g_params(const pp_model* m, const void* wv, int l, pp_param* out, int cap) {
    gmodel* w = (gmodel*)wv;
    (void)m;
    if (l < 0 || l >= GL) return -1;
    if (l == GL - 1) return 0;
    if (cap > 0) out[0] = pp_param_of(w ? w->w[l] : NULL, GK * GK, PP_F32);
    return 1;
}
static pp_model g_model(void) {
    pp_model m;
    memset(&m, 0, sizeof m);
    m.name = "rowpar-grid";
    m.n_layers = GL;
    m.forward = g_fwd;
    m.backward = g_bwd;
    m.describe = g_desc;
    m.layer_name = g_name;
    m.params = g_params;
    return m;
}

static float GX[2 * GMAXM * GR * GK], GT[2 * GMAXM * GR * GK];
static gmodel GW1, GWT[2][2]; /* the whole weights; [tp - 1][t]: TP rank t's rows */

static void g_init(void) {
    int i, l, k, t, n;
    for (i = 0; i < 2 * GMAXM * GR * GK; i++) {
        GX[i] = (float)((i * 7 + 3) % 5 - 2);
        GT[i] = (float)((i * 5 + 1) % 7 - 3);
    }
    memset(&GW1, 0, sizeof GW1);
    for (l = 0; l < GL - 1; l++)
        for (k = 0; k < GK; k++) {
            GW1.w[l][k * GK + (k + l) % GK] = 1;
            if (l % 2 == 0) GW1.w[l][k * GK + (k + l + 1) % GK] = (k & 1) ? -1.0f : 1.0f;
        }
    memset(GWT, 0, sizeof GWT);
    for (n = 1; n <= 2; n++)
        for (t = 0; t < n; t++)
            for (l = 0; l < GL - 1; l++)
                memcpy(GWT[n - 1][t].w[l], GW1.w[l] + t * (GK / n) * GK, sizeof(float) * (size_t)(GK / n) * GK);
}

static void g_batch(pp_batch* b, int m, int half) {
    memset(b, 0, sizeof *b);
    b->m = m;
    b->input.data = GX + (size_t)half * m * GR * GK;
    b->input.rows = m * GR;
    b->input.cols = GK;
    b->input.dtype = PP_F32;
    b->targets = GT + (size_t)half * m * GR * GK;
    b->target_row_bytes = GK * sizeof(float);
}

/* rank_setup: the world rank as layer_ctx (the injected layer failure finds its rank), and a
   transport that fails its sends while fail is set. */
typedef struct gwrap {
    pp_transport inner;
    int fail;
} gwrap;
static gwrap GWR[PP_MAX_RANKS];
static int G_SAID[2];
static int GRANK[PP_MAX_RANKS];
static pp_result gw_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    gwrap* w = (gwrap*)self;
    if (w->fail) return PP_ERR_TRANSPORT;
    return w->inner.isend(w->inner.self, peer, tag, buf, bytes, req);
}
static pp_result gw_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    gwrap* w = (gwrap*)self;
    return w->inner.irecv(w->inner.self, peer, tag, buf, bytes, req);
}
static pp_result g_setup(void* user, int rank, pp_stage_desc* d) {
    gwrap* w = &GWR[rank];
    (void)user;
    GRANK[rank] = rank;
    d->layer_ctx = &GRANK[rank];
    w->inner = d->transport;
    w->fail = 0;
    memset(&d->transport, 0, sizeof d->transport);
    d->transport.self = w;
    d->transport.rank = w->inner.rank;
    d->transport.size = w->inner.size;
    d->transport.isend = gw_isend;
    d->transport.irecv = gw_irecv;
    d->transport.wait = hx_fw_wait;
    d->transport.abort = hx_fw_abort;
    d->transport.cancel = hx_fw_cancel;
    return PP_OK;
}

/* Every rank's gradients against the expected: rank r (pp_rank, dp_rank, tp_rank as
   PP_GRID_DP_INNER places it) holds, for each layer it owns, its TP rows of exp, zeros elsewhere. */
static int g_grads_match(gmodel* G, int W, int p, int dp, int tp, const pp_schedule* s, const int* first,
                         const gmodel* exp, const char* where) {
    int r, l, ok = 1;
    for (r = 0; r < W && ok; r++) {
        int pr = r / (dp * tp), t = r % tp, kh = GK / tp;
        for (l = 0; l < GL - 1 && ok; l++) {
            float want[GK * GK];
            memset(want, 0, sizeof want);
            if (pp_schedule_layer_rank(s, first, l) == pr)
                memcpy(want, exp->w[l] + t * kh * GK, sizeof(float) * (size_t)kh * GK);
            if (memcmp(want, G[r].w[l], sizeof want) != 0) {
                int i = 0;
                while (i < GK * GK - 1 && want[i] == G[r].w[l][i]) i++;
                CHECK(0, "%s: rank %d (pp %d, dp %d, tp %d) layer %d element %d: %g, expected %g", where, r, pr,
                      r / tp % dp, t, l, i, (double)G[r].w[l][i], (double)want[i]);
                ok = 0;
            }
        }
    }
    (void)p;
    return ok;
}

static void grid_case(int kind, int p, int m, int dp, int tp, double dp_scale, int inject, int fail_rank,
                      const gmodel* exp, float loss_exp, int* good) {
    static gmodel G[PP_MAX_RANKS];
    static const void* rw[PP_MAX_RANKS];
    static void* rg[PP_MAX_RANKS];
    int fault[2] = {-1, -1};
    int W = p * dp * tp, r, ok = 1, i;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_batch b[2];
    pp_step_stats st;
    pp_error err;
    pp_result rc;
    char where[160];
    snprintf(where, sizeof where, "grid %s p=%d m=%d dp=%d tp=%d%s", pp_schedule_name((pp_schedule_kind)kind), p, m, dp, tp,
             dp_scale == 1 ? " dp_scale=1" : "");
    memset(&d, 0, sizeof d);
    d.model = g_model();
    d.model.ctx = fault;
    for (r = 0; r < W; r++) {
        rw[r] = &GWT[tp - 1][r % tp];
        rg[r] = &G[r];
    }
    memset(G, 0, sizeof G);
    d.rank_weights = rw;
    d.rank_grads = rg;
    d.schedule = (pp_schedule_kind)kind;
    d.p = p;
    d.m = m;
    d.dp = dp;
    d.tp = tp;
    d.dp_scale = dp_scale;
    d.stage.timeout_s = 20;
    d.rank_setup = g_setup;
    for (i = 0; i < dp; i++) g_batch(&b[i], m, i);
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s: create: %s", where, err.msg);
        return;
    }
    rc = pp_pipeline_step(pl, b, &st);
    CHECK(rc == PP_OK, "%s: %s", where, pp_pipeline_error(pl));
    ok = rc == PP_OK && g_grads_match(G, W, p, dp, tp, pp_pipeline_schedule(pl), pp_pipeline_partition(pl), exp, where);
    CHECK(!ok || memcmp(&st.loss, &loss_exp, sizeof loss_exp) == 0, "%s: loss %.9g, expected %.9g", where, (double)st.loss,
          (double)loss_exp);
    if (ok) { /* the norm (docs): replica 0's buffers, every TP rank's rows in TP order = exp's */
        pp_grad_buf nb[(GL - 1) * 2], eb[GL - 1];
        int n = 0, l;
        double nrm = -1, nexp = -2;
        memset(nb, 0, sizeof nb);
        memset(eb, 0, sizeof eb);
        for (l = 0; l < GL - 1; l++) {
            int pr = pp_schedule_layer_rank(pp_pipeline_schedule(pl), pp_pipeline_partition(pl), l), t;
            for (t = 0; t < tp; t++, n++) { /* world rank (pr * dp + 0) * tp + t */
                nb[n].layer = l, nb[n].dtype = PP_F32, nb[n].count = (size_t)(GK / tp) * GK;
                nb[n].data = G[pr * dp * tp + t].w[l];
            }
            eb[l].layer = l, eb[l].dtype = PP_F32, eb[l].count = GK * GK, eb[l].data = (void*)exp->w[l];
        }
        CHECK(pp_pipeline_grad_norm(pl, nb, n, &nrm, &err) == PP_OK && pp_grad_norm(NULL, GL, eb, GL - 1, &nexp, &err) == PP_OK &&
                  memcmp(&nrm, &nexp, sizeof nrm) == 0,
              "%s: norm %.17g, expected %.17g", where, nrm, nexp);
    }
    if (ok) { /* pp_pipeline_grad_bufs: replica 0's gradients at tp 1 (every entry inside the struct
                 of world rank pr * dp); refused at tp > 1, where each TP rank holds its own shards */
        pp_grad_buf lb[GL * 4];
        int nl = -1, i, inside = 1;
        rc = pp_pipeline_grad_bufs(pl, lb, GL * 4, &nl, &err);
        if (tp > 1) {
            CHECK(rc == PP_ERR_UNSUPPORTED, "%s: pp_pipeline_grad_bufs at tp %d: %s, want PP_ERR_UNSUPPORTED", where, tp,
                  pp_result_str(rc));
        } else {
            CHECK(rc == PP_OK && nl > 0, "%s: pp_pipeline_grad_bufs: %s", where, err.msg);
            for (i = 0; rc == PP_OK && i < nl; i++) {
                int pr = pp_schedule_layer_rank(pp_pipeline_schedule(pl), pp_pipeline_partition(pl), lb[i].layer);
                const char* lo = (const char*)&G[pr * dp];
                if ((const char*)lb[i].data < lo || (const char*)lb[i].data >= lo + sizeof G[0]) inside = 0;
            }
            CHECK(inside, "%s: pp_pipeline_grad_bufs lists a buffer outside replica 0's gradients", where);
        }
    }
    if (ok && inject) { /* a failure on one rank fails the step on every rank; the next step is exact */
        double t0 = hx_now();
        char want[64];
        if (inject == 2) GWR[fail_rank].fail = 1; /* its sends (p > 1) */
        else fault[0] = fail_rank;                /* its first layer call */
        memset(G, 0, sizeof G);
        rc = pp_pipeline_step(pl, b, &st);
        snprintf(want, sizeof want, "rank %d of %d", fail_rank, W);
        if (!G_SAID[inject - 1]) { /* one message of each kind, for the log */
            printf("%s, a %s failure on rank %d: %s\n", where, inject == 2 ? "send" : "layer", fail_rank, pp_pipeline_error(pl));
            G_SAID[inject - 1] = 1;
        }
        CHECK(rc == (inject == 2 ? PP_ERR_TRANSPORT : PP_ERR_LAYER) && strstr(pp_pipeline_error(pl), want),
              "%s: a %s failure on rank %d: %s, \"%s\"", where, inject == 2 ? "send" : "layer", fail_rank,
              pp_result_str(rc), pp_pipeline_error(pl));
        for (r = 0; r < W; r++)
            CHECK(pp_pipeline_rank_result(pl, r, NULL) != PP_OK, "%s: rank %d says PP_OK for a failed step", where, r);
        CHECK(hx_now() - t0 < 10, "%s: the failed step took %.1f s (a rank waited for its deadline)", where,
              hx_now() - t0);
        GWR[fail_rank].fail = 0;
        fault[0] = -1;
        memset(G, 0, sizeof G);
        rc = pp_pipeline_step(pl, b, &st);
        CHECK(rc == PP_OK, "%s: the step after the failure: %s", where, pp_pipeline_error(pl));
        ok = rc == PP_OK && g_grads_match(G, W, p, dp, tp, pp_pipeline_schedule(pl), pp_pipeline_partition(pl), exp, where);
        CHECK(!ok || memcmp(&st.loss, &loss_exp, sizeof loss_exp) == 0, "%s: loss after the failure %.9g, expected %.9g",
              where, (double)st.loss, (double)loss_exp);
    }
    pp_pipeline_destroy(pl);
    *good += ok;
}

/* Bad dp / tp, shared gradients, no params hook: refused with a message. */
static void grid_refusals(void) {
    static gmodel G[8];
    const void* rw[8];
    void* rg[8];
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    int r;
    for (r = 0; r < 8; r++) rw[r] = &GW1, rg[r] = &G[r];
    memset(&d, 0, sizeof d);
    d.model = g_model();
    d.rank_weights = rw;
    d.rank_grads = rg;
    d.p = 2;
    d.dp = -1;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "dp = -1"), "dp -1: %s", err.msg);
    d.dp = 2, d.tp = -3;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "tp = -3"), "tp -3: %s", err.msg);
    d.dp = PP_MAX_RANKS, d.tp = 2;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "ranks at most"), "too many: %s", err.msg);
    d.dp = 2, d.tp = 2, d.dp_scale = -1;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "dp_scale"), "dp_scale: %s", err.msg);
    d.dp_scale = 0;
    rg[5] = &G[0]; /* rank 5 (pp 1, dp 0, tp 1) shares rank 0's (pp 0, dp 0, tp 0) */
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "different pipelines"), "shared: %s",
          err.msg);
    rg[5] = &G[5];
    d.rank_grads = NULL, d.grads = &G[0];
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "rank_grads"), "grads: %s", err.msg);
    d.rank_grads = rg, d.grads = NULL;
    d.model.params = NULL;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && strstr(err.msg, "model.params"), "params: %s", err.msg);
    d.model.params = g_params;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "p 2 x dp 2 x tp 2: %s", err.msg);
    CHECK(pp_pipeline_stage(pl, 7) && !pp_pipeline_stage(pl, 8) && pp_pipeline_threads(pl), "8 ranks' stages");
    pp_pipeline_destroy(pl);
}

static void test_grid_dp_tp(void) {
    static const int ms[2] = {4, 8};
    gmodel ref[2][2], exp;
    float loss[2][2], loss_exp;
    pp_model model = g_model();
    pp_batch b;
    pp_error err;
    int kind, p, dp, tp, mi, h, i, cases = 0, good = 0, idx = 0, faults = 0, R = TEST_SANITIZED ? 4 : 1;
    g_init();
    grid_refusals();
    /* the references: the sequential model (tp = 1) on each half of the data, per m */
    for (mi = 0; mi < 2; mi++)
        for (h = 0; h < 2; h++) {
            memset(&ref[mi][h], 0, sizeof ref[mi][h]);
            g_batch(&b, ms[mi], h);
            CHECK(pp_sequential_step(&model, &GW1, &ref[mi][h], &b, &loss[mi][h], &err) == PP_OK, "reference: %s", err.msg);
        }
    for (i = 0, h = 0; i < GK * GK; i++) h += ref[0][0].w[0][i] != 0 && ref[0][0].w[GL - 2][i] != 0;
    CHECK(loss[0][0] > 0 && h > GK, "a loss (%g) and gradients (%d non-zero pairs) that say something", (double)loss[0][0], h);
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 3; p++)
            for (dp = 1; dp <= 2; dp++)
                for (tp = 1; tp <= 2; tp++) {
                    int v = pp_schedule_kind_v((pp_schedule_kind)kind, 2), inject, W = p * dp * tp;
                    for (mi = 0; mi < 2 && !pp_schedule_size((pp_schedule_kind)kind, p, v, ms[mi]); mi++) continue;
                    if (mi == 2 || p * v > GL) continue; /* not a shape this kind runs */
                    idx++;
                    if (!test_quick_pick(idx, 3)) continue;
                    for (i = 0; i < GL - 1; i++)
                        for (h = 0; h < GK * GK; h++)
                            exp.w[i][h] = dp == 1 ? ref[mi][0].w[i][h] : (ref[mi][0].w[i][h] + ref[mi][1].w[i][h]) * 0.5f;
                    loss_exp = dp == 1 ? loss[mi][0] : (loss[mi][0] + loss[mi][1]) / 2.0f;
                    /* the failure: a layer's or (p > 1) a send's, on a rank of the case's choosing */
                    inject = W > p && test_pick(idx + kind, R) ? (p > 1 && (idx / 2 + kind) % 2 ? 2 : 1) : 0;
                    cases++;
                    faults += inject != 0;
                    grid_case(kind, p, ms[mi], dp, tp, 0, inject, (idx * 5 + 3) % W, &exp, loss_exp, &good);
                }
    /* dp_scale 1: the sum, not the mean */
    for (i = 0; i < GL - 1; i++)
        for (h = 0; h < GK * GK; h++) exp.w[i][h] = ref[0][0].w[i][h] + ref[0][1].w[i][h];
    cases++;
    grid_case(PP_SCHED_1F1B, 2, ms[0], 2, 2, 1.0, 0, 0, &exp, (loss[0][0] + loss[0][1]) / 2.0f, &good);
    printf("grid (dp, tp): %d of %d configurations bit-exact (%d with a failure injected, then a step)\n", good, cases,
           faults);
}

/* ---- matrix: every kind, p 1-4, tp 1/2/4, dp 1/2, dense and packed, real-valued data -------- */
/* Model: ML - 1 row-parallel linears x (rows, MK) -> y (rows, MK), then a squared error weighted
   per sequence (1 / its length when packed: the loss reads mb->cu_seqlens). TP rank t of n holds
   rows [t * MK / n, (t + 1) * MK / n) of each W; its partial sums run over those MK / n columns of
   x, and pp_tp_allreduce adds the n partials in TP rank order: another association at each tp,
   so tp = 2 and 4 differ from tp = 1 in the last bits, and at a fixed tp nothing else may change
   them. Every (kind, p, partition) of one (tp, dp, packing) is compared with that group's first
   configuration (gpipe, p = 1), memcmp; that one with tp = 1's within 1e-5 (relative to the
   largest gradient, and the loss); each configuration steps twice: the same bits.
   Negative control (-DPP_TEST_PL_MATRIX_ORDER): the layers of pipeline ranks > 0 add their
   partial sums in reverse; p = 1 is unchanged, p > 1 differs from it in the last bits. */
#define ML 9
#define MK 12
#define MROWS 48 /* per replica */
#define MM 4     /* micro-batches */
typedef struct mmodel {
    float w[ML - 1][MK * MK];
} mmodel;
static float MX[2 * MROWS * MK], MT[2 * MROWS * MK];
static mmodel MW[3][4]; /* [log2 tp][t]: TP rank t's rows */
static const int32_t MCU[] = {0, 5, 14, 17, 28, 31, 38, 41, 48}; /* 8 sequences, 48 tokens */
static int MCTX[PP_MAX_RANKS][2];                                 /* {world rank, dp * tp} */

static float m_val(long i, long s) { return (float)((i * 7919 + s * 104729) % 1009) / 1009.0f - 0.5f; }

/* x's row r sum over k of a[k] * b[k]: the order the control changes */
static float m_dot(const float* a, int sa, const float* b, int sb, int n, int rev) {
    float acc = 0;
    int k;
    if (rev)
        for (k = n - 1; k >= 0; k--) acc += a[k * sa] * b[k * sb];
    else
        for (k = 0; k < n; k++) acc += a[k * sa] * b[k * sb];
    return acc;
}
static int m_rev(const pp_layer_io* io) {
#ifdef PP_TEST_PL_MATRIX_ORDER
    const int* c = (const int*)io->ctx;
    return c && c[0] / c[1] > 0;
#else
    (void)io;
    return 0;
#endif
}
/* the weight of row r in the loss: 1 / its sequence's length when packed, else 1 / rows */
static float m_rowweight(const pp_microbatch* mb, int64_t r) {
    int s;
    if (!mb->cu_seqlens) return 1.0f / (float)mb->rows;
    for (s = 0; s < mb->n_seqs && mb->cu_seqlens[s + 1] <= r; s++) continue;
    return 1.0f / (float)(mb->cu_seqlens[s + 1] - mb->cu_seqlens[s]);
}

static int m_fwd(const void* wv, int l, pp_layer_io* io) {
    const mmodel* w = (const mmodel*)wv;
    const float* x = (const float*)io->in[0].data; /* (rows, MK) */
    int64_t r, rows = io->in[0].rows;
    int t = pp_group_rank(io->tp), kh = MK / pp_group_size(io->tp), j, rev = m_rev(io);
    pp_error err;
    if (l == ML - 1) {
        const float* tg = (const float*)io->mb->targets;
        float acc = 0;
        for (r = 0; r < rows; r++) {
            float e = 0;
            for (j = 0; j < MK; j++) e += (x[r * MK + j] - tg[r * MK + j]) * (x[r * MK + j] - tg[r * MK + j]);
            acc += e * m_rowweight(io->mb, r);
        }
        io->loss = acc;
        return 0;
    }
    {
        float* y = (float*)io->out[0].data;
        for (r = 0; r < rows; r++)
            for (j = 0; j < MK; j++) y[r * MK + j] = m_dot(x + r * MK + t * kh, 1, w->w[l] + j, MK, kh, rev);
        return pp_tp_allreduce(io->tp, y, (size_t)rows * MK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static int m_bwd(const void* wv, void* gv, int l, pp_layer_io* io) {
    const mmodel* w = (const mmodel*)wv;
    mmodel* g = (mmodel*)gv;
    const float* x = (const float*)io->in[0].data;
    float* dx = (float*)io->d_in[0].data;
    int64_t r, rows = io->in[0].rows;
    int t = pp_group_rank(io->tp), kh = MK / pp_group_size(io->tp), k, j, rev = m_rev(io);
    pp_error err;
    if (l == ML - 1) {
        const float* tg = (const float*)io->mb->targets;
        for (r = 0; r < rows; r++)
            for (j = 0; j < MK; j++)
                dx[r * MK + j] = 2.0f * (x[r * MK + j] - tg[r * MK + j]) * m_rowweight(io->mb, r) * io->mb->loss_scale;
        return 0;
    }
    {
        const float* dy = (const float*)io->d_out[0].data;
        for (k = 0; k < kh; k++)
            for (j = 0; j < MK; j++) {
                float a = 0;
                for (r = 0; r < rows; r++) a += x[r * MK + t * kh + k] * dy[r * MK + j];
                g->w[l][k * MK + j] += a;
            }
        if (!dx) return 0;
        for (r = 0; r < rows; r++)
            for (k = 0; k < MK; k++) {
                int kk = k - t * kh;
                dx[r * MK + k] = kk >= 0 && kk < kh ? m_dot(dy + r * MK, 1, w->w[l] + kk * MK, 1, MK, rev) : 0.0f;
            }
        return pp_tp_allreduce(io->tp, dx, (size_t)rows * MK, PP_F32, &err) == PP_OK ? 0 : 4;
    }
}

static void m_desc(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)mb, (void)n_in;
    d->n_out = l == ML - 1 ? 0 : 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = MK;
    d->out[0].dtype = PP_F32;
    d->n_params = l == ML - 1 ? 0 : MK * MK;
}
static int m_params(const pp_model* m, const void* wv, int l, pp_param* out, int cap) {
    mmodel* w = (mmodel*)wv;
    (void)m;
    if (l < 0 || l >= ML) return -1;
    if (l == ML - 1) return 0;
    if (cap > 0) out[0] = pp_param_of(w ? w->w[l] : NULL, MK * MK, PP_F32);
    return 1;
}
static pp_model m_model(void) {
    pp_model m;
    memset(&m, 0, sizeof m);
    m.name = "rowpar-matrix";
    m.n_layers = ML;
    m.forward = m_fwd;
    m.backward = m_bwd;
    m.describe = m_desc;
    m.layer_name = g_name;
    m.params = m_params;
    return m;
}
static pp_result m_setup(void* user, int rank, pp_stage_desc* d) {
    (void)user;
    d->layer_ctx = MCTX[rank];
    return PP_OK;
}

static void m_init(void) {
    mmodel whole;
    int i, l, k, lt, t;
    for (i = 0; i < 2 * MROWS * MK; i++) MX[i] = m_val(i, 1) * 2.0f, MT[i] = m_val(i, 2);
    for (l = 0; l < ML - 1; l++) /* near the identity: the activations keep their size */
        for (k = 0; k < MK * MK; k++) whole.w[l][k] = (k % (MK + 1) == 0 ? 0.75f : 0.0f) + m_val(k + 211 * l, 3) * 0.5f;
    memset(MW, 0, sizeof MW);
    for (lt = 0; lt < 3; lt++)
        for (t = 0; t < 1 << lt; t++)
            for (l = 0; l < ML - 1; l++)
                memcpy(MW[lt][t].w[l], whole.w[l] + t * (MK >> lt) * MK, sizeof(float) * (size_t)(MK >> lt) * MK);
}

static void m_batch(pp_batch* b, int half, int packed) {
    memset(b, 0, sizeof *b);
    b->m = MM;
    b->input.data = MX + (size_t)half * MROWS * MK;
    b->input.rows = MROWS;
    b->input.cols = MK;
    b->input.dtype = PP_F32;
    b->targets = MT + (size_t)half * MROWS * MK;
    b->target_row_bytes = MK * sizeof(float);
    if (packed) {
        b->cu_seqlens = MCU;
        b->n_seqs = (int)(sizeof MCU / sizeof MCU[0]) - 1;
        b->split = PP_SPLIT_TOKENS;
    }
}

/* One configuration's result: replica 0's whole gradients (its TP ranks' rows put together) and
   the loss. Every replica's must equal replica 0's, and a rank's layers it does not own be zero. */
typedef struct mresult {
    mmodel g;
    float loss;
} mresult;

static int m_collect(const mmodel* G, int p, int dp, int tp, const pp_schedule* s, const int* first, mresult* out,
                     const char* where) {
    static const mmodel zero;
    int r, l, ok = 1, kh = MK / tp;
    for (r = 0; r < p * dp * tp; r++) {
        int pr = r / (dp * tp), d = r / tp % dp, t = r % tp;
        for (l = 0; l < ML - 1; l++) {
            size_t n = sizeof(float) * (size_t)kh * MK;
            float* dst = out->g.w[l] + t * kh * MK;
            if (pp_schedule_layer_rank(s, first, l) != pr) {
                if (memcmp(G[r].w[l], zero.w[l], sizeof zero.w[l]) != 0) {
                    CHECK(0, "%s: rank %d (pp %d) wrote layer %d, which it does not own", where, r, pr, l);
                    ok = 0;
                }
            } else if (d == 0) {
                memcpy(dst, G[r].w[l], n);
            } else if (memcmp(dst, G[r].w[l], n) != 0) {
                CHECK(0, "%s: replica %d's layer %d (TP rank %d) differs from replica 0's", where, d, l, t);
                ok = 0;
            }
        }
    }
    return ok;
}

/* Run (kind, p, partition) at (tp, dp, packing): two steps, the same bits; the first into *out. */
static int matrix_case(int kind, int p, int part, int dp, int lt, int packed, mresult* out, char* where, size_t wn) {
    static mmodel G[PP_MAX_RANKS];
    static const void* rw[PP_MAX_RANKS];
    static void* rg[PP_MAX_RANKS];
    static mresult second;
    int tp = 1 << lt, W = p * dp * tp, v = pp_schedule_kind_v((pp_schedule_kind)kind, 2), S = p * v, first[2 * 4 + 1];
    int r, step, ok = 1, s;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_batch b[2];
    pp_step_stats st;
    pp_error err;
    snprintf(where, wn, "matrix %s p=%d %s tp=%d dp=%d %s", pp_schedule_name((pp_schedule_kind)kind), p,
             part ? "skewed" : "uniform", tp, dp, packed ? "packed" : "dense");
    if (part == 0) pp_partition_uniform(ML, S, first, &err);
    else { /* the first stage takes everything but one layer per other stage */
        first[0] = 0;
        for (s = 1; s <= S; s++) first[s] = ML - (S - s);
    }
    memset(&d, 0, sizeof d);
    d.model = m_model();
    for (r = 0; r < W; r++) {
        rw[r] = &MW[lt][r % tp];
        rg[r] = &G[r];
        MCTX[r][0] = r, MCTX[r][1] = dp * tp;
    }
    d.rank_weights = rw;
    d.rank_grads = rg;
    d.schedule = (pp_schedule_kind)kind;
    d.p = p;
    d.v = v;
    d.m = MM;
    d.dp = dp;
    d.tp = tp;
    d.partition.policy = PP_PARTITION_EXPLICIT;
    d.partition.explicit_first = first;
    d.stage.timeout_s = 20;
    d.rank_setup = m_setup;
    for (r = 0; r < dp; r++) m_batch(&b[r], r, packed);
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s: create: %s", where, err.msg);
        return 0;
    }
    for (step = 0; step < 2 && ok; step++) {
        mresult* res = step ? &second : out;
        memset(G, 0, sizeof G);
        memset(res, 0, sizeof *res);
        ok = pp_pipeline_step(pl, b, &st) == PP_OK;
        CHECK(ok, "%s: step %d: %s", where, step, pp_pipeline_error(pl));
        ok = ok && m_collect(G, p, dp, tp, pp_pipeline_schedule(pl), pp_pipeline_partition(pl), res, where);
        res->loss = st.loss;
    }
    CHECK(!ok || memcmp(out, &second, sizeof second) == 0, "%s: the second step's bits differ from the first's", where);
    ok = ok && memcmp(out, &second, sizeof second) == 0;
    pp_pipeline_destroy(pl);
    return ok;
}

/* The first element where a and b differ, for the message; -1: the loss. */
#define M_N ((ML - 1) * MK * MK)
static const float* m_flat(const mresult* r) { return (const float*)(const void*)&r->g; }
static int m_first_diff(const mresult* a, const mresult* b) {
    int i;
    for (i = 0; i < M_N; i++)
        if (memcmp(m_flat(a) + i, m_flat(b) + i, sizeof(float)) != 0) return i;
    return -1;
}

/* max |a - b| over the largest |b|, gradients and (separately) the loss */
static double m_rel(const mresult* a, const mresult* b) {
    double dmax = 0, bmax = 0, dl;
    int i;
    for (i = 0; i < M_N; i++) {
        double x = m_flat(a)[i], y = m_flat(b)[i];
        if (fabs(x - y) > dmax) dmax = fabs(x - y);
        if (fabs(y) > bmax) bmax = fabs(y);
    }
    dl = fabs((double)a->loss - (double)b->loss) / fabs((double)b->loss);
    dmax = bmax > 0 ? dmax / bmax : dmax;
    return dl > dmax ? dl : dmax;
}

static void test_matrix(void) {
    static mresult ref[3][2][2], res; /* [log2 tp][dp - 1][packed]: gpipe, p = 1 */
    char where[160];
    int lt, dp, pk, kind, p, part, idx = 0, cases = 0, good = 0, R = TEST_SANITIZED ? 8 : TEST_SECOND || getenv("PP_QUICK") ? 6 : 3;
    double worst = 0, t0 = hx_now();
    pp_model model = m_model();
    pp_batch b;
    pp_error err;
    m_init();
    /* every group's reference, sampled or not: the first configuration of each (tp, dp, packing) */
    for (lt = 0; lt < 3; lt++)
        for (dp = 1; dp <= 2; dp++)
            for (pk = 0; pk < 2; pk++) {
                cases++;
                good += matrix_case(PP_SCHED_GPIPE, 1, 0, dp, lt, pk, &ref[lt][dp - 1][pk], where, sizeof where);
                if (lt == 0) continue;
                {
                    double rel = m_rel(&ref[lt][dp - 1][pk], &ref[0][dp - 1][pk]);
                    if (rel > worst) worst = rel;
                    CHECK(rel <= 1e-5, "%s: %.3g relative to tp = 1", where, rel);
                }
            }
    /* tp = 1, dp = 1 is the sequential model's step, bit for bit */
    for (pk = 0; pk < 2; pk++) {
        mmodel g;
        float loss = 0;
        memset(&g, 0, sizeof g);
        m_batch(&b, 0, pk);
        CHECK(pp_sequential_step(&model, &MW[0][0], &g, &b, &loss, &err) == PP_OK, "reference: %s", err.msg);
        CHECK(memcmp(&g, &ref[0][0][pk].g, sizeof g) == 0 && memcmp(&loss, &ref[0][0][pk].loss, sizeof loss) == 0,
              "matrix %s: the pipeline (gpipe, p 1) differs from pp_sequential_step", pk ? "packed" : "dense");
    }
    CHECK(worst > 0, "tp = 2 and 4 add in another order than tp = 1: some bits must differ (%.3g)", worst);
    for (lt = 0; lt < 3; lt++)
        for (dp = 1; dp <= 2; dp++)
            for (pk = 0; pk < 2; pk++)
                for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
                    for (p = 1; p <= 4; p++)
                        for (part = 0; part < 2; part++) {
                            int v = pp_schedule_kind_v((pp_schedule_kind)kind, 2), ok;
                            if (!pp_schedule_size((pp_schedule_kind)kind, p, v, MM) || p * v > ML) continue;
                            if ((p * v == 1 && part) || (kind == PP_SCHED_GPIPE && p == 1)) continue; /* the reference */
                            if (!test_pick(idx++, R)) continue;
                            cases++;
                            ok = matrix_case(kind, p, part, dp, lt, pk, &res, where, sizeof where);
                            if (ok && memcmp(&res, &ref[lt][dp - 1][pk], sizeof res) != 0) {
                                int i = m_first_diff(&res, &ref[lt][dp - 1][pk]);
                                CHECK(0, "%s: differs from gpipe p=1 at %s %d: %.9g, expected %.9g", where,
                                      i < 0 ? "the loss" : "gradient element", i,
                                      i < 0 ? (double)res.loss : (double)m_flat(&res)[i],
                                      i < 0 ? (double)ref[lt][dp - 1][pk].loss : (double)m_flat(&ref[lt][dp - 1][pk])[i]);
                                ok = 0;
                            }
                            good += ok;
                        }
    printf("matrix (kind, p, partition x tp 1/2/4 x dp 1/2 x dense/packed): %d of %d configurations (of %d + 12) "
           "bit-identical within their (tp, dp, packing), run to run; tp 2/4 within %.3g of tp 1; %.2f s\n",
           good, cases, idx, worst, hx_now() - t0);
}

int main(int argc, char** argv) {
    if (test_only(argc, argv, "grid", test_grid_dp_tp)) return TEST_DONE("pipeline");
    if (test_only(argc, argv, "matrix", test_matrix)) return TEST_DONE("pipeline");
    test_grid();
    test_accumulate_two_steps();
    test_grid_dp_tp();
    test_matrix();
    return TEST_DONE("pipeline");
}
