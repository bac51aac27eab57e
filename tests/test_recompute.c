/* tests/test_recompute.c - activation recomputation (pp_stage_desc.recompute) and the plan that
   chooses it with the schedule (pp_plan_recompute).

   - Bit-identity: the MLP whose dense layers keep scratch from F to B (saved: tanh's derivative,
     and in the split model b_saved too; backward checks it is intact, weight_grad that it has
     saved and no b_saved), on every schedule kind at p = 2, 3 and 4, fused and split, with
     recomputation on every other layer, on whole stages (every even stage) and on every layer:
     gradients and loss equal the sequential reference bit for bit (memcmp).
   - Memory: each rank's pp_step_stats.peak_mem equals the simulator's peak_mem with each stage's
     recompute share (r_mem) and W share (b_free), and recomputing every layer lowers every rank's
     peak stash bytes on 1F1B at m = 2p.
   - The one-process layer (pp_pipeline_desc.stage.recompute): a step's gradients and an
     evaluation's loss equal the references'.
   - Bad flags are refused at create.
   - The planner's bounds: any finite mem_cap (1e300, DBL_MAX) is a cap, Inf and NaN refused; a
     kind at v = INT_MAX refused naming the limit, before p * v (`test_recompute planbounds`;
     built with -DPP_TEST_OLD_PLAN_BOUNDS, build/failpath-controls, it fails).
   Negative control: -DPP_TEST_NO_RECOMPUTE (the B skips the recompute: stale scratch and
   activations) fails the bit-identity checks (build/recompute-controls). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "test_link.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <math.h>

#define ROWS 24
#define ROWS_BIG 480 /* test_saves: alignment and guards a small part of each buffer */
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

/* ---- the MLP with scratch ------------------------------------------------------------------- */
/* saved (and in the split model b_saved) hold 1 - y^2 (1 where the layer has no tanh) */
static int scratch_ok(const dense_params* p, const pp_layer_io* io, const float* sc) {
    const float* y = (const float*)io->out[0].data;
    int64_t i, n = io->out[0].rows * p->out;
    if (!sc) return 0;
    for (i = 0; i < n; i++)
        if (sc[i] != (p->tanh_act ? 1.0f - y[i] * y[i] : 1.0f)) return 0;
    return 1;
}
/* test_pipeline: layer 4's forward fails on its second call for micro-batch 1 (the recompute) */
static int g_fail_second, g_calls[MLP_DEPTH][64];
static int densr_fwd(const dense_params* p, pp_layer_io* io) {
    const float* y = (const float*)io->out[0].data;
    float *sc = (float*)io->saved, *bs = (float*)io->b_saved;
    int64_t i, n = io->out[0].rows * p->out;
    int rc;
    if (g_fail_second && io->layer == 4 && io->mb->index == 1 && ++g_calls[4][1] == 2) return 9;
    rc = dense_fwd(p, io);
    if (rc || !sc) return rc ? rc : 5;
    for (i = 0; i < n; i++) sc[i] = p->tanh_act ? 1.0f - y[i] * y[i] : 1.0f;
    if (bs) memcpy(bs, sc, (size_t)n * sizeof *sc);
    return 0;
}
static int densr_bwd(const dense_params* p, dense_params* g, pp_layer_io* io) {
    if (!scratch_ok(p, io, (const float*)io->saved)) return 7; /* not (re)computed before B */
    return dense_bwd(p, g, io);
}
static int densr_bwd_in(const dense_params* p, dense_params* g, pp_layer_io* io) {
    if (!scratch_ok(p, io, (const float*)io->saved) || !scratch_ok(p, io, (const float*)io->b_saved)) return 7;
    return dense_bwd_in(p, g, io);
}
static int densr_bwd_w(const dense_params* p, dense_params* g, pp_layer_io* io) {
    if (io->b_saved || !scratch_ok(p, io, (const float*)io->saved)) return 6;
    return dense_bwd_w(p, g, io);
}
static int g_split; /* describe: b_saved_bytes too */
static void densr_desc(const dense_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    dense_desc(p, mb, in, n_in, d);
    d->saved_bytes = (size_t)in[0].rows * (size_t)p->out * sizeof(float);
    d->b_saved_bytes = g_split ? d->saved_bytes : 0;
}
#define MLPRF_LAYERS(X)                                              \
    X(dense, dense_params, densr_fwd, densr_bwd, densr_desc, MLP_DEPTH) \
    X(xent, xent_params, xent_fwd, xent_bwd, xent_desc, 1)
PP_MODEL(mlprf, MLPRF_LAYERS)
#define MLPRS_LAYERS(X)                                                                 \
    X(dense, dense_params, densr_fwd, densr_bwd_in, densr_bwd_w, densr_desc, MLP_DEPTH) \
    X(xent, xent_params, xent_fwd, xent_bwd, PP_NO_WGRAD, xent_desc, 1)
PP_MODEL_SPLIT(mlprs, MLPRS_LAYERS)

/* ---- the executor's layout, for the simulator's shares ---------------------------------------- */
#define A64(x) (((size_t)(x) + 63) & ~(size_t)63)
/* bytes of boundary j (the input of layer j) on a micro-batch of `rows` rows; the loss has none */
static size_t bnd_bytes(int j, int64_t rows) { return j <= MLP_DEPTH ? A64(rows * DIMS[j] * 4) : 0; }

/* Stage st's W share (b_free) and recompute share (r_mem) of its whole stash, as the executor lays
   it out (LOCAL shapes, guards left out): the input where the previous stage is another rank's,
   the boundaries after it (one between two recomputed layers dropped), each dense layer's saved
   scratch (and b_saved: in its own block, or with a recomputed layer in the recompute block's part
   that B gives back). */
static void shares(const pp_schedule* s, const int* first, int st, int64_t rows, const unsigned char* rc, double* bfree,
                   double* rmem) {
    size_t kept = 0, bb = 0, dropped = 0, rbb = 0;
    int a = first[st], b = first[st + 1], l, ra = -1, rb;
    if (st > 0) pp_schedule_stage_to_rank(s, st - 1, &ra, NULL);
    pp_schedule_stage_to_rank(s, st, &rb, NULL);
    if (st > 0 && ra != rb) kept += bnd_bytes(a, rows);
    for (l = a + 1; l <= b; l++) {
        int drop = l < b && rc && rc[l - 1] && rc[l];
        *(drop ? &dropped : &kept) += bnd_bytes(l, rows);
    }
    for (l = a; l < b && l < MLP_DEPTH; l++) {
        size_t n = A64(rows * DIMS[l + 1] * 4);
        if (rc && rc[l]) dropped += n * (g_split ? 2 : 1), rbb += g_split ? n : 0;
        else kept += n, bb += g_split ? n : 0;
    }
    /* B frees the B-only scratch, the recomputed layers' too (in the recompute block's part 2) */
    *bfree = bb + rbb ? (double)(bb + rbb) / (double)(kept + bb + dropped) : 0;
    *rmem = dropped ? (double)dropped / (double)(kept + bb + dropped) : 0;
}

/* ---- runs ----------------------------------------------------------------------------------- */
/* The runs' shape policy, and device blocks (host memory behind pp_device_ops, fresh blocks
   filled with a NaN pattern: a byte the recompute leaves unwritten shows in the gradients) */
static pp_shape_policy g_shapes = PP_SHAPES_LOCAL;
static int g_device;
static void* d_alloc(void* user, size_t bytes) {
    void* p = malloc(bytes);
    (void)user;
    if (p) memset(p, 0xFF, bytes);
    return p;
}
static void d_free(void* user, void* ptr) {
    (void)user;
    free(ptr);
}
static pp_result d_zero(void* user, void* ptr, size_t bytes) {
    (void)user;
    memset(ptr, 0, bytes);
    return PP_OK;
}

static const pp_schedule_kind KINDS[] = {PP_SCHED_GPIPE, PP_SCHED_1F1B,  PP_SCHED_INTERLEAVED, PP_SCHED_INTERLEAVED_MEM,
                                         PP_SCHED_ZB_H1, PP_SCHED_ZB_H2, PP_SCHED_ZB_V,        PP_SCHED_V_HALF,
                                         PP_SCHED_V_MIN, PP_SCHED_DUALPIPE_V};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0], MAX_S = 8 };

typedef struct setup {
    mlp_model w, g;             /* weights, the reference gradient */
    mlpz_model wz;
    float loss;
    pp_batch b;
    int rows;
} setup;

/* One run of kind k at p with m micro-batches (a uniform partition), recompute flags rc (NULL:
   none); gradients and loss against the reference, peak_mem against the simulator's. Fills
   peak_bytes[r] (may be NULL). */
static int run(const setup* U, pp_schedule_kind k, int p, int m, const unsigned char* rc, const char* policy,
               size_t* peak_bytes) {
    static hx_world W;
    mlp_model g[PP_MAX_RANKS];
    mlpz_model gz[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    double bfree[MAX_S], rmem[MAX_S];
    int v = pp_schedule_kind_v(k, 2), S = p * v, first[MAX_S + 1], r, st, ok = 1;
    char what[160];
    hx_sched hs;
    pp_error err;
    pp_sim_cost c;
    pp_sim_result sim;
    snprintf(what, sizeof what, "%s p=%d m=%d %s, recompute %s, shapes %d%s", pp_schedule_name(k), p, m,
             g_split ? "split" : "fused", policy, (int)g_shapes, g_device ? ", device blocks" : "");
    if (hx_sched_make(&hs, k, p, v, m, &err) != PP_OK || pp_partition_uniform(MLP_DEPTH + 1, S, first, &err) != PP_OK) {
        CHECK(0, "%s: %s", what, err.msg);
        return 0;
    }
    memset(&W, 0, sizeof W);
    W.model = g_split ? mlprs_model_desc() : mlprf_model_desc();
    W.w = g_split ? (const void*)&U->wz : (const void*)&U->w;
    W.sched = &hs.s;
    W.first = first;
    W.batch = &U->b;
    W.stage.timeout_s = 20;
    W.stage.recompute = rc;
    W.stage.shapes = g_shapes;
    if (g_device) W.stage.device.alloc = d_alloc, W.stage.device.free = d_free, W.stage.device.zero = d_zero;
    ok = hx_mlp_run(&W, p, g_split, g, gz, gbuf, DIMS, what);
    ok = ok && hx_mlp_grads_match(g, p, &hs.s, first, &U->g, 0, what) && hx_loss_matches(W.stats, p, &hs.s, U->loss, what);
    /* the simulator's peak_mem with the same shares (a stash lives until W only where the model
       defers it: the split model) */
    for (st = 0; st < S; st++) shares(&hs.s, first, st, U->rows / m, rc, &bfree[st], &rmem[st]);
    /* (AUTO keeps room for its trailer after every activation: other shares) */
    memset(&c, 0, sizeof c);
    c.b_free_stage = bfree;
    c.r_mem_stage = rmem;
    if (ok && g_shapes != PP_SHAPES_AUTO && (g_split || !pp_schedule_has_w(&hs.s)) && pp_simulate(&hs.s, &c, &sim, NULL, &err) == PP_OK)
        for (r = 0; r < p; r++)
            if (fabs(W.stats[r].peak_mem - sim.peak_mem[r]) > 1e-9) {
                CHECK(0, "%s: rank %d executor peak_mem %.6f, simulator %.6f", what, r, W.stats[r].peak_mem, sim.peak_mem[r]);
                ok = 0;
            }
    for (r = 0; peak_bytes && r < p; r++) peak_bytes[r] = W.stats[r].peak_stash_bytes;
    hx_mlp_free_grads(gbuf, p);
    hx_sched_free(&hs);
    CHECK(ok, "%s", what);
    return ok;
}

/* The reference: the sequential MLP (fused; the scratch models give the same bits). */
static void make_setup(setup* U, float* x, int32_t* y, int rows, int m, float** wbuf, float** gbuf) {
    pp_model fused = mlp_model_desc();
    pp_error err;
    memset(U, 0, sizeof *U);
    *wbuf = mlp_init(&U->w, &U->g, DIMS, 29, gbuf);
    mlpz_from_mlp(&U->wz, &U->w);
    mlp_make_data(x, y, rows, HX_IN, HX_CLASSES, 7, 8);
    hx_dense_batch(&U->b, x, y, rows, HX_IN, m);
    U->rows = rows;
    memset(*gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
    CHECK(pp_sequential_step(&fused, &U->w, &U->g, &U->b, &U->loss, &err) == PP_OK, "%s", err.msg);
}

static void test_identity(void) {
    static setup U;
    float x[ROWS * HX_IN], *wbuf, *gbuf;
    int32_t y[ROWS];
    unsigned char rc[MLP_DEPTH + 1];
    int p, k, pol, split, cases = 0, good = 0, l, m = 6;
    make_setup(&U, x, y, ROWS, m, &wbuf, &gbuf);
    for (split = 0; split < 2; split++)
        for (p = 2; p <= 4; p++)
            for (k = 0; k < N_KINDS; k++)
                for (pol = 0; pol < 3; pol++) {
                    static const char* const names[] = {"every other layer", "every even stage", "every layer"};
                    int v = pp_schedule_kind_v(KINDS[k], 2), first[MAX_S + 1], st;
                    pp_partition_uniform(MLP_DEPTH + 1, p * v, first, NULL);
                    for (l = 0; l <= MLP_DEPTH; l++) rc[l] = (unsigned char)(pol == 0 ? l % 2 : pol == 2);
                    for (st = 0; pol == 1 && st < p * v; st++)
                        for (l = first[st]; l < first[st + 1]; l++) rc[l] = (unsigned char)(st % 2 == 0);
                    g_split = split;
                    cases++;
                    good += run(&U, KINDS[k], p, m, rc, names[pol], NULL);
                }
    /* the other shape policies, and device blocks */
    for (pol = 0; pol < 4; pol++)
        for (p = 2; p <= 3; p++)
            for (k = 0; k < 2; k++) {
                pp_schedule_kind kind = k ? PP_SCHED_ZB_V : PP_SCHED_1F1B;
                for (l = 0; l <= MLP_DEPTH; l++) rc[l] = (unsigned char)(l % 3 != 0);
                g_shapes = pol < 3 ? (pp_shape_policy)(pol + 1) : PP_SHAPES_LOCAL;
                g_device = pol == 3;
                g_split = k;
                cases++;
                good += run(&U, kind, p, m, rc, "two layers of three", NULL);
            }
    g_shapes = PP_SHAPES_LOCAL;
    g_device = 0;
    g_split = 0;
    printf("recompute: %d of %d runs bit-identical to the sequential reference, peak_mem as simulated\n", good, cases);
    free(wbuf);
    free(gbuf);
}

/* Recomputing every layer lowers the stash peak of every rank that holds two stashes or more at
   once (1F1B, m = 2p: all but the last): there a stash keeps the stage's input and output, and one
   recompute block at a time holds the rest (with a second copy of the output: _pp_rc_carve's
   shadow). The last rank holds one stash and its recompute block: a little more than without. */
static void test_saves(void) {
    static setup U;
    static float x[ROWS_BIG * HX_IN];
    static int32_t y[ROWS_BIG];
    float *wbuf, *gbuf;
    unsigned char rc[MLP_DEPTH + 1];
    size_t with[PP_MAX_RANKS], without[PP_MAX_RANKS];
    int p, r;
    memset(rc, 1, sizeof rc);
    for (p = 2; p <= 4; p++) {
        make_setup(&U, x, y, ROWS_BIG, 2 * p, &wbuf, &gbuf);
        run(&U, PP_SCHED_1F1B, p, 2 * p, NULL, "none", without);
        run(&U, PP_SCHED_1F1B, p, 2 * p, rc, "all", with);
        for (r = 0; r < p - 1; r++)
            CHECK(with[r] < without[r], "1f1b p=%d rank %d: peak stash %zu bytes recomputing, %zu not", p, r, with[r],
                  without[r]);
        if (p == 4) printf("recompute: 1f1b p=4 m=8 rank 0 peak stash %zu bytes recomputing every layer, %zu not\n", with[0],
                           without[0]);
        free(wbuf);
        free(gbuf);
    }
}

/* The one-process layer: pp_pipeline_desc.stage.recompute reaches every rank (copied at create:
   the caller's flags may go), a step's gradients equal the reference's, and an evaluation (whose
   stashes go once the output left) equals pp_sequential_eval's loss and peaks at one stash. */
static void test_pipeline(void) {
    static setup U;
    float x[ROWS * HX_IN], *wbuf, *gbuf, *ref, loss_eval = 0;
    int32_t y[ROWS];
    unsigned char* rc = (unsigned char*)malloc(MLP_DEPTH + 1);
    size_t n = mlp_param_count(DIMS) * sizeof(float);
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats stats;
    pp_error err;
    pp_model fused = mlp_model_desc();
    int k;
    make_setup(&U, x, y, ROWS, 6, &wbuf, &gbuf);
    ref = (float*)malloc(n);
    memcpy(ref, gbuf, n);
    CHECK(pp_sequential_eval(&fused, &U.w, &U.b, &loss_eval, NULL, &err) == PP_OK, "%s", err.msg);
    for (k = 0; k < 2; k++) {
        memset(rc, 1, MLP_DEPTH + 1);
        memset(&d, 0, sizeof d);
        d.model = mlprf_model_desc();
        d.weights = &U.w;
        d.grads = &U.g;
        d.schedule = k ? PP_SCHED_ZB_V : PP_SCHED_1F1B;
        d.p = 3;
        d.m = 6;
        d.stage.recompute = rc;
        CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
        memset(rc, 0, MLP_DEPTH + 1); /* copied at create */
        memset(gbuf, 0, n);
        CHECK(pl && pp_pipeline_step(pl, &U.b, &stats) == PP_OK, "%s", pl ? pp_pipeline_error(pl) : "no pipeline");
        CHECK(memcmp(gbuf, ref, n) == 0 && stats.loss == U.loss, "%s: pipeline with recompute: gradients or loss differ",
              pp_schedule_name(d.schedule));
        CHECK(pl && pp_pipeline_eval(pl, &U.b, NULL, &stats) == PP_OK, "%s", pl ? pp_pipeline_error(pl) : "no pipeline");
        CHECK(stats.loss == loss_eval && stats.peak_live <= 2, "%s: evaluation loss %g (reference %g), peak %d",
              pp_schedule_name(d.schedule), (double)stats.loss, (double)loss_eval, stats.peak_live);
        if (k == 0) { /* a recomputed forward that fails fails the step, naming the B; the next step runs */
            g_fail_second = 1;
            memset(g_calls, 0, sizeof g_calls);
            CHECK(pp_pipeline_step(pl, &U.b, &stats) == PP_ERR_LAYER && strstr(pp_pipeline_error(pl), "B1.0") &&
                      strstr(pp_pipeline_error(pl), "layer 4 (dense) forward returned 9 on micro-batch 1 (recomputed"),
                  "a failed recompute: %s", pp_pipeline_error(pl));
            printf("recompute: a failed recompute says: %s\n", pp_pipeline_error(pl));
            g_fail_second = 0;
            memset(gbuf, 0, n);
            CHECK(pp_pipeline_step(pl, &U.b, &stats) == PP_OK && memcmp(gbuf, ref, n) == 0, "the step after: %s",
                  pp_pipeline_error(pl));
        }
        pp_pipeline_destroy(pl);
        pl = NULL;
    }
    free(rc);
    free(ref);
    free(wbuf);
    free(gbuf);
}

static void test_bad_flags(void) {
    static setup U;
    float x[ROWS * HX_IN], *wbuf, *gbuf;
    int32_t y[ROWS];
    unsigned char rc[MLP_DEPTH + 1];
    hx_sched hs;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    int first[3];
    make_setup(&U, x, y, ROWS, 2, &wbuf, &gbuf);
    memset(rc, 0, sizeof rc);
    rc[3] = 2;
    CHECK(hx_sched_make(&hs, PP_SCHED_1F1B, 1, 1, 2, &err) == PP_OK, "%s", err.msg);
    pp_partition_uniform(MLP_DEPTH + 1, 1, first, NULL);
    memset(&d, 0, sizeof d);
    d.model = mlprf_model_desc();
    d.weights = &U.w;
    d.grads = &U.g;
    d.schedule = &hs.s;
    d.partition = first;
    d.recompute = rc;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_INVALID && strstr(err.msg, "recompute[3] = 2"),
          "a flag of 2 is refused: %s", err.msg);
    hx_sched_free(&hs);
    free(wbuf);
    free(gbuf);
}

/* pp_plan_recompute on GPT-like cost lists (an embedding, n blocks whose scratch is `ratio`
   times their output, a head): at every p and cap, its plan is no slower than the best hand choice
   among {nothing, every layer recomputed} x every kind that fits, and fits whenever one does; a
   cap nothing meets gives fits 0 and the least memory. -DPLAN_SLACK=0.9 (the plan must be 10%
   faster than the hand choices) is the negative control of the comparison. */
#ifndef PLAN_SLACK
#define PLAN_SLACK 1.0
#endif
static void test_plan(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE, PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_INTERLEAVED,
                                             PP_SCHED_INTERLEAVED_MEM, PP_SCHED_INTERLEAVED_MEM, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_H2, PP_SCHED_ZB_V, PP_SCHED_V_HALF, PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V};
    static const int kv[] = {1, 1, 2, 4, 2, 4, 1, 1, 2, 2, 2, 2};
    pp_layer_cost lc[26];
    unsigned char rc[26];
    int first[4 * 4 + 1], p, ci, k, all, l, cases = 0, good = 0, better = 0;
    memset(lc, 0, sizeof lc);
    for (l = 0; l < 26; l++) {
        int block = l > 0 && l < 25;
        lc[l].f = block ? 1 : l == 0 ? 0.1 : 1.5;
        lc[l].b = block ? 1.1 : lc[l].f;
        lc[l].w = block ? 0.9 : 0;
        lc[l].out = l < 25 ? 1 : 0;
        lc[l].mem = lc[l].out + (block ? 16 + (l % 3) : l == 25 ? 6 : 0);
    }
    for (p = 2; p <= 4; p++)
        for (ci = 0; ci < 4; ci++) {
            static const double caps[] = {0, 400, 200, 90};
            pp_plan_desc d;
            pp_plan h, best, plan;
            pp_error err;
            int have = 0;
            if (!test_quick_pick(p * 4 + ci, 3)) continue; /* make quick: a third of the (p, cap) cases */
            memset(&d, 0, sizeof d);
            memset(&best, 0, sizeof best);
            d.layers = lc, d.n_layers = 26, d.p = p, d.m = 2 * p, d.mem_cap = caps[ci] / p;
            for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
                for (all = 0; all < 2; all++) {
                    memset(rc, all, sizeof rc);
                    if (pp_plan_try(&d, kinds[k], kv[k], rc, &h, NULL, &err) != PP_OK) continue;
                    if (h.fits && (!have || h.makespan < best.makespan)) best = h, have = 1;
                }
            cases++;
            if (pp_plan_recompute(&d, &plan, first, rc, &err) != PP_OK) {
                CHECK(0, "p=%d cap %g: %s", p, d.mem_cap, err.msg);
                continue;
            }
            CHECK(pp_partition_check(first, 26, p * plan.v, &err) == PP_OK, "p=%d: the plan's partition: %s", p, err.msg);
            for (l = 0, all = 0; l < 26; l++) all += rc[l];
            CHECK(all == plan.n_recompute, "p=%d: %d flags set, n_recompute %d", p, all, plan.n_recompute);
            if (have) {
                int ok = plan.fits && plan.makespan <= best.makespan * PLAN_SLACK * (1 + 1e-12);
                CHECK(ok, "p=%d cap %g: plan %s v=%d %.4g (fits %d) vs best hand %s v=%d %.4g", p, d.mem_cap,
                      pp_schedule_name(plan.kind), plan.v, plan.makespan, plan.fits, pp_schedule_name(best.kind), best.v,
                      best.makespan);
                good += ok;
                better += plan.makespan < best.makespan * (1 - 1e-9);
            } else {
                good++;
            }
        }
    printf("recompute plan: %d of %d cases no slower than the best hand choice that fits, %d strictly faster\n", good,
           cases, better);
    {   /* a cap nothing meets */
        pp_plan_desc d;
        pp_plan plan;
        pp_error err;
        memset(&d, 0, sizeof d);
        d.layers = lc, d.n_layers = 26, d.p = 2, d.m = 4, d.mem_cap = 0.5;
        CHECK(pp_plan_recompute(&d, &plan, first, rc, &err) == PP_OK && !plan.fits && plan.peak_mem > 0.5,
              "an impossible cap: fits %d, peak %g", plan.fits, plan.peak_mem);
        lc[3].out = lc[3].mem + 1;
        CHECK(pp_plan_recompute(&d, &plan, first, rc, &err) == PP_ERR_INVALID && strstr(err.msg, "layer 3"),
              "out > mem is refused: %s", err.msg);
        lc[3].out = 1;
    }
    {   /* the B-only share (bonly): on ZB-H1, B frees it while the rest waits for W */
        pp_plan_desc d;
        pp_plan a, b;
        pp_error err;
        memset(&d, 0, sizeof d);
        memset(rc, 1, sizeof rc);
        d.layers = lc, d.n_layers = 26, d.p = 4, d.m = 8;
        CHECK(pp_plan_try(&d, PP_SCHED_ZB_H1, 1, rc, &a, NULL, &err) == PP_OK, "%s", err.msg);
        for (l = 1; l < 25; l++) lc[l].bonly = 10;
        CHECK(pp_plan_try(&d, PP_SCHED_ZB_H1, 1, rc, &b, NULL, &err) == PP_OK, "%s", err.msg);
        CHECK(b.peak_mem < a.peak_mem && b.makespan == a.makespan, "zb-h1 recomputing all: peak %g with a B-only share, %g without",
              b.peak_mem, a.peak_mem);
        lc[2].bonly = lc[2].mem; /* out + bonly > mem */
        CHECK(pp_plan_try(&d, PP_SCHED_ZB_H1, 1, rc, &b, NULL, &err) == PP_ERR_INVALID && strstr(err.msg, "layer 2"),
              "out + bonly > mem is refused: %s", err.msg);
        for (l = 1; l < 25; l++) lc[l].bonly = 0;
    }
}

/* ---- the planner's input bounds ----------------------------------------------------------------
   Every finite mem_cap is a cap (1e300, DBL_MAX); Inf and NaN are refused. An interleaved kind at
   v = INT_MAX is refused before p * v is computed, naming the limit, by pp_plan_try and by
   pp_plan_recompute (kinds given), with no signed overflow (the ASan+UBSan build). */
#include <float.h>
#include <limits.h>
static void test_plan_bounds(void) {
    pp_layer_cost lc[8];
    pp_plan_desc d;
    pp_plan out;
    pp_error err;
    pp_result r;
    unsigned char rc[8];
    int first[4 * 4 + 1], l, i;
    pp_schedule_kind kind = PP_SCHED_INTERLEAVED;
    int kv = INT_MAX;
    static const double caps[4] = {1e300, DBL_MAX, HUGE_VAL, NAN};
    memset(lc, 0, sizeof lc);
    memset(rc, 0, sizeof rc);
    for (l = 0; l < 8; l++) lc[l].f = lc[l].b = lc[l].w = lc[l].mem = lc[l].out = 1;
    memset(&d, 0, sizeof d);
    d.layers = lc, d.n_layers = 8, d.p = 4, d.m = 8;
    for (i = 0; i < 4; i++) {
        d.mem_cap = caps[i];
        r = pp_plan_try(&d, PP_SCHED_1F1B, 1, rc, &out, first, &err);
        if (i < 2) CHECK(r == PP_OK && out.fits, "mem_cap %g: %s (%s)", caps[i], pp_result_str(r), err.msg);
        else CHECK(r == PP_ERR_INVALID && strstr(err.msg, "mem_cap"), "mem_cap %g: %s (%s)", caps[i], pp_result_str(r), err.msg);
        r = pp_plan_recompute(&d, &out, first, rc, &err);
        if (i < 2) CHECK(r == PP_OK && out.fits, "plan, mem_cap %g: %s (%s)", caps[i], pp_result_str(r), err.msg);
        else CHECK(r == PP_ERR_INVALID, "plan, mem_cap %g: %s (%s)", caps[i], pp_result_str(r), err.msg);
    }
    d.mem_cap = 0;
    r = pp_plan_try(&d, PP_SCHED_INTERLEAVED, INT_MAX, rc, &out, first, &err);
    CHECK(r == PP_ERR_INVALID && strstr(err.msg, "p*v = 4*2147483647"), "pp_plan_try interleaved v = INT_MAX: %s (%s)",
          pp_result_str(r), err.msg);
    printf("  pp_plan_try, interleaved at v = INT_MAX: %s\n", err.msg);
    d.kinds = &kind, d.kinds_v = &kv, d.n_kinds = 1;
    r = pp_plan_recompute(&d, &out, first, rc, &err);
    CHECK(r == PP_ERR_INVALID && strstr(err.msg, "kinds[0]") && strstr(err.msg, "p*v = 4*2147483647"),
          "pp_plan_recompute interleaved v = INT_MAX: %s (%s)", pp_result_str(r), err.msg);
    printf("  pp_plan_recompute, kinds {interleaved}, v {INT_MAX}: %s\n", err.msg);
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "planbounds")) { /* what build/failpath-controls runs */
        test_plan_bounds();
        return TEST_DONE("recompute");
    }
    test_plan_bounds();
    test_plan();
    test_identity();
    test_saves();
    test_pipeline();
    test_bad_flags();
    return TEST_DONE("recompute");
}
