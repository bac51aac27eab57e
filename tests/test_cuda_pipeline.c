/* tests/test_cuda_pipeline.c - pipeline_cuda.h's one-process layer (pp_cuda_pipeline_create)
   against the imitation CUDA runtime (tests/fakecuda), without a GPU.

   The MLP's layers are imitation kernels on the rank's stream (io->ctx is a pp_cuda_layer_ctx),
   so they run asynchronously after the host returned and see device memory only as kernels do.
   Checked: every schedule, p in {1, 2, 4}, ranks on one device and spread over four, shared and
   per-rank gradients: bit-identical to pp_sequential_step after steps that return only when the
   streams are done; each layer saw its own rank's stream, device and the template's user
   context; the world and the step's event timeline are reachable; a failing layer fails the
   step naming its rank and the next step is right again; the descs the CUDA pipeline cannot
   take are refused (device ops given, AUTO shapes, n_ranks other than p); evaluations
   (pp_pipeline_eval, test_eval). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"
#include "fakecuda/layer_kernels.h"

#define ROWS 41
#define NSEQ 9
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
static const int32_t CU[NSEQ + 1] = {0, 3, 4, 11, 20, 22, 30, 31, 40, 41};

static float X[ROWS * HX_IN];
static int32_t Y[ROWS];
static mlp_model W, GREF;
static float *WBUF, *GREFBUF;
static size_t NPAR;
static int g_user; /* the template's layer_ctx: every layer must see its address as lc->user */
static volatile int g_bad_ctx, g_fail_layer = -1, g_nan_loss_mb = -1;

/* ---- the MLP's layers, enqueued on the rank's stream ---------------------------------------- */
/* Each layer is an imitation kernel (tests/fakecuda/layer_kernels.h): it runs on the rank's
   stream after the host returned, and reaches the device blocks only through the imitation's
   kernel mapping, as a GPU kernel would (the host cannot read device memory). The layer context
   is a pp_cuda_layer_ctx, whose first member is the stream layer_kernels.h launches on. */
static int enqueue(const void* w, void* g, int l, int bwd, pp_layer_io* io) {
    const pp_cuda_layer_ctx* lc = (const pp_cuda_layer_ctx*)io->ctx;
    int dev = -1;
    if (!lc || lc->user != &g_user || cudaGetDevice(&dev) != cudaSuccess || dev != lc->device) {
        g_bad_ctx++;
        return 1;
    }
    if (!bwd && l == g_fail_layer && io->mb->index == 1) return 42;
    /* a loss layer that hands its loss over on the host (it would read it from the device) */
    if (!bwd && io->n_out == 0 && io->mb->index == g_nan_loss_mb) io->loss = NAN;
    return bwd ? lk_bwd(w, g, l, io) : lk_fwd(w, l, io);
}
static int a_fwd(const void* w, int l, pp_layer_io* io) { return enqueue(w, NULL, l, 0, io); }
static int a_bwd(const void* w, void* g, int l, pp_layer_io* io) { return enqueue(w, g, l, 1, io); }

static pp_batch batch(void) {
    pp_batch b;
    hx_packed_batch(&b, X, Y, CU, NSEQ, HX_IN, 0, PP_SPLIT_TOKENS); /* host memory: the layers run on the host */
    return b;
}

/* The loss layer's kernel leaves each micro-batch's loss here (a GPU loss layer would write it to
   device memory; the executor's io->loss stays 0 on these stages): test_eval reduces them. */
static float g_mb_loss[16];
static int rec_fwd(const void* w, int l, pp_layer_io* io) {
    int rc = mlp_forward(w, l, io);
    if (rc == 0 && io->n_out == 0 && io->mb->index < 16) g_mb_loss[io->mb->index] = io->loss;
    return rc;
}

static pp_pipeline_desc desc(pp_schedule_kind kind, int p) {
    pp_pipeline_desc d;
    pp_model base = mlp_model_desc();
    base.forward = rec_fwd;
    memset(&d, 0, sizeof d);
    d.model = layer_kernels_model(base);
    d.model.forward = a_fwd;
    d.model.backward = a_bwd;
    d.weights = &W;
    d.schedule = kind;
    d.p = p;
    d.m = 6;
    d.stage.timeout_s = 20;
    d.stage.layer_ctx = &g_user;
    return d;
}

/* Gradient buffers per rank (host memory: the host-function layers write them). */
static mlp_model G[4];
static float* GBUF[4];
static void* GPTR[4];
static void grads_zero(void) {
    int r;
    for (r = 0; r < 4; r++) memset(GBUF[r], 0, NPAR * sizeof(float));
}
static int grads_equal(int n) {
    size_t i;
    int r;
    for (i = 0; i < NPAR; i++) {
        float s = 0;
        for (r = 0; r < n; r++) s += GBUF[r][i];
        if (memcmp(&s, &GREFBUF[i], sizeof s) != 0) return 0;
    }
    return 1;
}

/* A CUDA pipeline (NULL cuda desc: every rank on device 0) of d adding each rank's gradients
   into its own GBUF[r]; NULL, the test failed, when it cannot be made. */
static pp_pipeline* rank_grads_pipeline(pp_pipeline_desc* d) {
    pp_pipeline* pl = NULL;
    pp_error err;
    d->rank_grads = GPTR;
    CHECK(pp_cuda_pipeline_create(d, NULL, &pl, &err) == PP_OK, "%s", err.msg);
    return pl;
}

/* After a step that failed with why: every one of the p ranks says why, or that it was aborted;
   then the gradients zeroed and GREF the sequential reference of one step of b (6 micro-batches),
   what the next step must give. */
static void failed_then_reference(pp_pipeline* pl, int p, pp_result why, pp_batch b) {
    pp_model model = mlp_model_desc();
    pp_error err;
    float loss;
    int r;
    for (r = 0; r < p; r++) {
        pp_result rr = pp_pipeline_rank_result(pl, r, NULL);
        CHECK(rr == why || rr == PP_ERR_ABORTED, "rank %d: %s", r, pp_result_str(rr));
    }
    grads_zero();
    memset(GREFBUF, 0, NPAR * sizeof(float));
    b.m = 6;
    CHECK(pp_sequential_step(&model, &W, &GREF, &b, &loss, &err) == PP_OK, "%s", err.msg);
}

static void run_case(pp_schedule_kind kind, int p, int spread, int per_rank, int steps) {
    pp_pipeline_desc d = desc(kind, p);
    pp_cuda_desc cd;
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch();
    const pp_cuda_step_info* info;
    int devs[4], r, s, ok = 1;
    char where[128];
    snprintf(where, sizeof where, "%s p=%d %s, %s grads", pp_schedule_name(kind), p, spread ? "spread over 4 devices" : "one device",
             per_rank ? "per-rank" : "shared");
    for (r = 0; r < p; r++) devs[r] = spread ? 3 - r % 4 : 0; /* rank 0 not on the default device */
    memset(&cd, 0, sizeof cd);
    cd.devices = devs;
    cd.timeline = 1;
    if (per_rank) d.rank_grads = GPTR;
    else d.grads = GPTR[0];
    grads_zero();
    if (pp_cuda_pipeline_create(&d, &cd, &pl, &err) != PP_OK) {
        CHECK(0, "%s: %s", where, err.msg);
        return;
    }
    for (s = 0; s < steps && ok; s++) {
        ok = pp_pipeline_step(pl, &b, NULL) == PP_OK;
        CHECK(ok, "%s: step %d: %s", where, s, pp_pipeline_error(pl));
    }
    info = pp_cuda_pipeline_info(pl);
    if (ok) {
        CHECK(grads_equal(per_rank ? p : 1), "%s: gradients differ from the reference", where);
        CHECK(info && info->span > 0 && info->n_actions[p - 1] == pp_pipeline_schedule(pl)->per_rank, "%s: step info", where);
        CHECK(pp_cuda_timeline(pp_cuda_pipeline_world(pl), NULL, 0) == (size_t)p * pp_pipeline_schedule(pl)->per_rank,
              "%s: event timeline", where);
        CHECK(pp_pipeline_threads(pl) == NULL, "%s: no threads world", where);
    }
    pp_pipeline_destroy(pl);
}

static void test_equal(void) {
    pp_model model = mlp_model_desc();
    pp_batch b = batch();
    pp_error err;
    float loss;
    int kind, p, i, steps = 2;
    b.m = 6;
    for (i = 0; i < steps; i++) CHECK(pp_sequential_step(&model, &W, &GREF, &b, &loss, &err) == PP_OK, "%s", err.msg);
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p *= 2) {
            run_case((pp_schedule_kind)kind, p, 0, p > 1, steps);
            if (p > 1) run_case((pp_schedule_kind)kind, p, 1, kind % 2, steps);
        }
    CHECK(g_bad_ctx == 0, "%d layer calls without their rank's context", g_bad_ctx);
}

static void test_failure(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4);
    pp_pipeline* pl = rank_grads_pipeline(&d);
    pp_error err;
    pp_batch b = batch();
    if (!pl) return;
    CHECK(pp_cuda_pipeline_world(pl) != NULL && pp_cuda_device(pp_cuda_pipeline_world(pl), 3) == 0, "NULL cuda desc: device 0");
    g_fail_layer = 6;
    CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_LAYER && strstr(pp_pipeline_error(pl), "failed first") &&
              strstr(pp_pipeline_error(pl), "returned 42"),
          "%s", pp_pipeline_error(pl));
    g_fail_layer = -1;
    failed_then_reference(pl, 4, PP_ERR_LAYER, b);
    /* The next step: where the CUDA transport can withdraw the receives the failed step left
       posted (pp_transport.cancel), the same pipeline goes on; where it cannot, the pipeline
       says so instead of letting a stale receive take the next step's message. */
    if (pp_cuda_transport(pp_cuda_pipeline_world(pl), 0).cancel) {
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_OK && grads_equal(4), "the step after a failure: %s", pp_pipeline_error(pl));
    } else {
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_UNSUPPORTED && strstr(pp_pipeline_error(pl), "create it again"), "%s",
              pp_pipeline_error(pl));
        pp_pipeline_destroy(pl);
        pl = NULL;
        CHECK(pp_cuda_pipeline_create(&d, NULL, &pl, &err) == PP_OK, "%s", err.msg);
        CHECK(pl && pp_pipeline_step(pl, &b, NULL) == PP_OK && grads_equal(4), "a new pipeline after a failure: %s",
              pp_pipeline_error(pl));
    }
    pp_pipeline_destroy(pl);
}

/* The default loss check on CUDA stages: a NaN the loss layer hands over in io->loss fails the
   step on every rank, naming the micro-batch; the next step is exact; allow_nonfinite_loss lets
   it pass. Negative control: build/errors-controls (-DPP_TEST_NO_LOSS_CHECK). */
static void test_nan_loss(void) {
    pp_pipeline_desc d = desc(PP_SCHED_ZB_V, 2);
    pp_pipeline* pl;
    pp_error err;
    pp_batch b = batch();
    pp_step_stats st;
    grads_zero();
    pl = rank_grads_pipeline(&d);
    if (!pl) return;
    g_nan_loss_mb = 4;
    CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_NONFINITE && strstr(pp_pipeline_error(pl), "the loss of micro-batch 4 is nan"),
          "cuda, NaN loss: %s", pp_pipeline_error(pl));
    g_nan_loss_mb = -1;
    failed_then_reference(pl, 2, PP_ERR_NONFINITE, b);
    if (pp_cuda_transport(pp_cuda_pipeline_world(pl), 0).cancel)
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_OK && grads_equal(2), "the step after a NaN loss: %s", pp_pipeline_error(pl));
    pp_pipeline_destroy(pl);
    pl = NULL;
    d.stage.allow_nonfinite_loss = 1;
    CHECK(pp_cuda_pipeline_create(&d, NULL, &pl, &err) == PP_OK, "%s", err.msg);
    if (!pl) return;
    g_nan_loss_mb = 4;
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK && st.has_loss && st.loss != st.loss, "allowed: %s (loss %g)",
          pp_pipeline_error(pl), (double)st.loss);
    g_nan_loss_mb = -1;
    pp_pipeline_destroy(pl);
}

/* Evaluations on CUDA stages (pp_pipeline_eval over pp_cuda_pipeline_create): every kind, p in
   {1, 2, 4}, one device and four. The outputs (the logits, copied by the device ops' copy on the
   rank's stream into host memory, or device memory once) equal pp_sequential_eval's byte for
   byte, the micro-batch losses the loss kernels left reduce to its loss bit for bit, no
   gradient is touched, each rank's peak stash is the simulator's for the forward-only list;
   and train, evaluate, train accumulates the gradients of two sequential steps, bit for bit. */
static float EV_REF[ROWS * HX_CLASSES], EV_OUT[ROWS * HX_CLASSES];
static void eval_case(pp_schedule_kind kind, int p, int spread, int on_device) {
    pp_pipeline_desc d = desc(kind, p);
    pp_model model = mlp_model_desc();
    pp_cuda_desc cd;
    pp_pipeline* pl = NULL;
    pp_eval_out out, ref;
    pp_microbatch mbs[6];
    int32_t cu[NSEQ + 6];
    pp_step_stats st;
    pp_error err;
    pp_batch b = batch(), b6;
    pp_schedule e;
    pp_action* acts = NULL;
    pp_sim_result* sim = (pp_sim_result*)calloc(1, sizeof *sim);
    void* dev = NULL;
    float loss_ref = 0, loss;
    double acc = 0;
    int devs[4], r, i, ok = 1;
    char where[128];
    snprintf(where, sizeof where, "eval %s p=%d %s%s", pp_schedule_name(kind), p, spread ? "spread over 4 devices" : "one device",
             on_device ? ", outputs in device memory" : "");
    for (r = 0; r < p; r++) devs[r] = spread ? 3 - r % 4 : 0;
    memset(&cd, 0, sizeof cd);
    cd.devices = devs;
    d.rank_grads = GPTR;
    grads_zero();
    b6 = b;
    b6.m = 6;
    memset(&ref, 0, sizeof ref);
    ref.data[0] = EV_REF;
    ref.cap[0] = sizeof EV_REF;
    if (pp_sequential_eval(&model, &W, &b6, &loss_ref, &ref, &err) != PP_OK || pp_batch_split(&b6, mbs, cu, &err) != PP_OK ||
        pp_cuda_pipeline_create(&d, &cd, &pl, &err) != PP_OK) {
        CHECK(0, "%s: %s", where, err.msg);
        free(sim);
        return;
    }
    memset(&out, 0, sizeof out);
    memset(EV_OUT, 0, sizeof EV_OUT);
    out.rank = (int)(kind + p) % p;
    if (on_device && cudaMalloc(&dev, sizeof EV_OUT) != cudaSuccess) dev = NULL;
    out.data[0] = on_device ? dev : (void*)EV_OUT;
    out.cap[0] = sizeof EV_OUT;
    memset(g_mb_loss, 0, sizeof g_mb_loss);
    ok = pp_pipeline_eval(pl, &b, &out, &st) == PP_OK;
    CHECK(ok, "%s: %s", where, pp_pipeline_error(pl));
    if (ok && on_device) CHECK(dev && cudaMemcpy(EV_OUT, dev, sizeof EV_OUT, cudaMemcpyDeviceToHost) == cudaSuccess, "%s: copy back", where);
    if (ok) {
        for (i = 0; i < 6; i++) acc += (double)mbs[i].loss_scale * (double)g_mb_loss[i];
        loss = (float)acc;
        CHECK(out.bytes[0] == ref.bytes[0] && memcmp(EV_OUT, EV_REF, ref.bytes[0]) == 0, "%s: outputs differ from the sequential's", where);
        CHECK(memcmp(&loss, &loss_ref, sizeof loss) == 0, "%s: loss %.9g, sequential %.9g", where, loss, loss_ref);
        for (r = 0; r < p; r++) CHECK(hx_all_zero(GBUF[r], NPAR), "%s: rank %d's gradients were touched", where, r);
        acts = (pp_action*)calloc(pp_schedule_eval_size(pp_pipeline_schedule(pl)), sizeof *acts);
        CHECK(pp_schedule_make_eval(pp_pipeline_schedule(pl), acts, pp_schedule_eval_size(pp_pipeline_schedule(pl)), &e, &err) == PP_OK &&
                  pp_simulate(&e, NULL, sim, NULL, &err) == PP_OK, "%s: %s", where, err.msg);
        for (r = 0; r < p; r++) {
            pp_step_stats rs;
            pp_pipeline_rank_result(pl, r, &rs);
            CHECK(rs.peak_live == sim->peak_live[r] && rs.peak_live <= 2, "%s: rank %d held %d stashes, the simulator says %d", where,
                  r, rs.peak_live, sim->peak_live[r]);
        }
        /* train, evaluate, train */
        memset(GREFBUF, 0, NPAR * sizeof(float));
        for (i = 0; i < 2; i++) CHECK(pp_sequential_step(&model, &W, &GREF, &b6, &loss, &err) == PP_OK, "%s", err.msg);
        ok = pp_pipeline_step(pl, &b, NULL) == PP_OK && pp_pipeline_eval(pl, &b, NULL, NULL) == PP_OK &&
             pp_pipeline_step(pl, &b, NULL) == PP_OK;
        CHECK(ok && grads_equal(p), "%s: train, evaluate, train: %s", where, ok ? "gradients differ" : pp_pipeline_error(pl));
    }
    if (dev) cudaFree(dev);
    free(acts);
    free(sim);
    pp_pipeline_destroy(pl);
}

static void test_eval(void) {
    int kind, p;
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p *= 2) eval_case((pp_schedule_kind)kind, p, p > 1 && kind % 2, kind == PP_SCHED_INTERLEAVED && p == 4);
}

static void* host_alloc(void* user, size_t bytes) {
    (void)user;
    return malloc(bytes);
}

static void test_refused(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 2);
    pp_pipeline* pl = NULL;
    pp_cuda_desc cd;
    pp_error err;
    d.grads = GPTR[0];
    d.stage.device.alloc = host_alloc;
    CHECK(pp_cuda_pipeline_create(&d, NULL, &pl, &err) == PP_ERR_INVALID && !pl && strstr(err.msg, "stage.device"), "%s", err.msg);
    d.stage.device.alloc = NULL;
    d.stage.shapes = PP_SHAPES_AUTO;
    CHECK(pp_cuda_pipeline_create(&d, NULL, &pl, &err) == PP_ERR_UNSUPPORTED && !pl && strstr(err.msg, "rank 0: shape policy AUTO"),
          "%s", err.msg);
    d.stage.shapes = PP_SHAPES_BROADCAST;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 3;
    CHECK(pp_cuda_pipeline_create(&d, &cd, &pl, &err) == PP_ERR_INVALID && !pl && strstr(err.msg, "n_ranks = 3"), "%s", err.msg);
    cd.n_ranks = 2;
    CHECK(pp_cuda_pipeline_create(&d, &cd, &pl, &err) == PP_OK, "BROADCAST: %s", err.msg);
    pp_pipeline_destroy(pl);
    /* dp and tp are the threads pipeline's */
    d.grads = NULL;
    d.rank_grads = GPTR;
    d.tp = 2;
    pl = NULL;
    CHECK(pp_cuda_pipeline_create(&d, &cd, &pl, &err) == PP_ERR_UNSUPPORTED && !pl && strstr(err.msg, "tp = 2") &&
              strstr(err.msg, "pp_nccl_grid_create_tp"),
          "tp 2: %s (the refusal names where tp runs on GPUs)", err.msg);
    d.tp = 0;
    d.rank_grads = NULL;
    d.grads = GPTR[0];
    /* a threads pipeline is not a CUDA one */
    d.model = mlp_model_desc();
    d.stage.layer_ctx = NULL;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK && pp_cuda_pipeline_world(pl) == NULL && pp_cuda_pipeline_info(pl) == NULL,
          "%s", err.msg);
    pp_pipeline_destroy(pl);
}

/* Varlen batches repacked every step: 12 sequences of random lengths (1 to 24 rows) in 4
   micro-batches, 1F1B over 4 ranks, so every micro-batch's size changes from step to step.
   After a warm-up (VL_WARMUP steps) the device block pool allocates nothing (no cudaMalloc or
   cudaFree for the rest of the run), and no rank's pool ever holds more than twice the most its
   blocks asked for at once in its largest step. The warm-up is statistical: the pool allocates
   again when a micro-batch exceeds the largest so far by more than the headroom (40%); over
   seeds 1 to 11 and 77 the last allocation came at steps 31, 42, 54, 5, 77, 1, 0, 12, 2, 0, 320,
   119 (2026-11-26). Negative control: built with -DPP_TEST_POOL_EXACT (blocks of the size
   asked, nothing given back) the pools end at 3.4 times the need and 4 checks fail.
   Changing shapes make early copies common (a sender reusing a block its receiver has not
   pulled): they must go through the rank's spare, made in the pool's warm-up (at most one in a
   hundred onto the receiver's stream; 0 to 3 of about 3,000 in four runs here). Negative control: built with
   -DPP_CUDA_TEST_NO_SPARES every one does (build/cuda-controls, "varlen" with 200 steps).
   PP_TEST_POOL_STEPS sets the number of steps (default 1000), PP_TEST_POOL_SEED the lengths'
   seed (default 1), PP_TEST_POOL_TRACE=1 prints the steps that allocated. */
#define VL_NSEQ 12
#define VL_MAXLEN 24
#define VL_WARMUP 100
static void test_varlen_pool(void) {
    static float vx[VL_NSEQ * VL_MAXLEN * HX_IN];
    static int32_t vy[VL_NSEQ * VL_MAXLEN], cu[VL_NSEQ + 1];
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4);
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b;
    fakecuda_stats st;
    uint64_t seed = getenv("PP_TEST_POOL_SEED") ? (uint64_t)atoi(getenv("PP_TEST_POOL_SEED")) : 1, mallocs0 = 0, frees0 = 0;
    size_t need_max[4] = {0, 0, 0, 0}, held_max[4] = {0, 0, 0, 0}, held_all = 0, need_all = 0;
    uint64_t spared = 0, fell_back = 0;
    int steps = getenv("PP_TEST_POOL_STEPS") ? atoi(getenv("PP_TEST_POOL_STEPS")) : 1000, s, i, last_alloc = -1, ok = 1;
    mlp_make_data(vx, vy, VL_NSEQ * VL_MAXLEN, HX_IN, HX_CLASSES, 5, 9);
    d.rank_grads = GPTR;
    d.m = 4;
    CHECK(pp_cuda_pipeline_create(&d, NULL, &pl, &err) == PP_OK, "%s", err.msg);
    if (!pl) return;
    b = batch(); /* the same layout, over these buffers */
    b.m = 4;
    b.input.data = vx;
    b.targets = vy;
    b.cu_seqlens = cu;
    b.n_seqs = VL_NSEQ;
    b.split = PP_SPLIT_SEQS;
    for (s = 0; s < steps && ok; s++) {
        pp_step_stats ps;
        cu[0] = 0;
        for (i = 0; i < VL_NSEQ; i++) cu[i + 1] = cu[i] + 1 + (int32_t)(mlp_rng_next(&seed) % VL_MAXLEN);
        b.input.rows = cu[VL_NSEQ];
        ok = pp_pipeline_step(pl, &b, &ps) == PP_OK;
        CHECK(ok, "varlen step %d: %s", s, pp_pipeline_error(pl));
        fakecuda_stats_get(&st);
        if (s == 0 || st.calls[FAKECUDA_CALL_MALLOC] != mallocs0 || st.calls[FAKECUDA_CALL_FREE] != frees0) last_alloc = s;
        mallocs0 = st.calls[FAKECUDA_CALL_MALLOC];
        frees0 = st.calls[FAKECUDA_CALL_FREE];
        if (ps.pool_need > need_all) need_all = ps.pool_need;
        if (ps.pool_bytes > held_all) held_all = ps.pool_bytes;
        if (getenv("PP_TEST_POOL_TRACE") && last_alloc == s)
            printf("step %d: rows %d, pool %zu bytes, need %zu, allocs %d, frees %d\n", s, cu[VL_NSEQ], ps.pool_bytes, ps.pool_need,
                   ps.pool_allocs, ps.pool_frees);
        for (i = 0; i < 4; i++) { /* each rank's pool against its own largest step */
            pp_pipeline_rank_result(pl, i, &ps);
            if (ps.pool_need > need_max[i]) need_max[i] = ps.pool_need;
            if (ps.pool_bytes > held_max[i]) held_max[i] = ps.pool_bytes;
        }
    }
    for (i = 0; i < 4; i++) /* each rank's pool against its own largest step */
        CHECK(held_max[i] <= 2 * need_max[i], "rank %d's pool held %zu bytes, more than twice the %zu its largest step asked for",
              i, held_max[i], need_max[i]);
    printf("cuda-pipeline: %d varlen steps: last cudaMalloc/cudaFree at step %d, pool at most %zu bytes for a largest need of "
           "%zu (%.2fx, all ranks)\n", s, last_alloc, held_all, need_all, need_all ? (double)held_all / (double)need_all : 0.0);
    CHECK(last_alloc < VL_WARMUP, "the device pool still allocated or freed at step %d of %d (warm-up: %d steps)", last_alloc,
          s, VL_WARMUP);
    for (i = 0; i < 4; i++) {
        spared += pp_cuda_pipeline_world(pl)->r[i].side_seq;
        fell_back += pp_cuda_pipeline_world(pl)->r[i].early_fallbacks;
    }
    printf("cuda-pipeline: %llu early copies through a spare, %llu onto the receiver's stream\n", (unsigned long long)spared,
           (unsigned long long)fell_back);
    CHECK(fell_back * 100 <= spared + fell_back, "%llu of %llu early copies found no spare", (unsigned long long)fell_back,
          (unsigned long long)(spared + fell_back));
    pp_pipeline_destroy(pl);
}

/* Once the pool warmed up, a sender finds a block its receiver already pulled from: early
   copies (a sender reusing a block before its receiver got to it copies it into a spare on its
   side stream, four runtime calls more) are rare. 1F1B p = 4, m = 8 on four devices, 4 steps (the pool's
   warm-up), then 12 steps counted: at most a tenth copied early (0 of 576 in 6 of 6 runs here;
   with a warm-up of 2 steps, 0 in 11 of 12 and 12 in the other).
   Negative control: built with PP_CUDA_TEST_SEND_DONE_AT_POST (a send done, and its block back
   in the pool, once the receive is posted, as before) 112 to 126 of 576 are (build/cuda-controls). */
static void test_early_copies_rare(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4);
    pp_cuda_desc cd;
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch();
    pp_cuda* c;
    int devs[4] = {0, 1, 2, 3}, r, s, ok = 1;
    uint64_t early0 = 0, early1 = 0, transfers = 0;
    memset(&cd, 0, sizeof cd);
    cd.devices = devs;
    d.m = 8;
    d.grads = GPTR[0];
    if (pp_cuda_pipeline_create(&d, &cd, &pl, &err) != PP_OK) {
        CHECK(0, "early copies: %s", err.msg);
        return;
    }
    c = pp_cuda_pipeline_world(pl);
    for (s = 0; s < 16 && ok; s++) {
        pp_step_stats st;
        if (s == 4)
            for (r = 0; r < 4; r++) early0 += c->r[r].side_seq;
        ok = pp_pipeline_step(pl, &b, &st) == PP_OK;
        CHECK(ok, "early copies: step %d: %s", s, pp_pipeline_error(pl));
        if (s >= 4) transfers += (uint64_t)(2 * 3 * d.m); /* activations and gradients over 3 boundaries */
    }
    for (r = 0; r < 4; r++) early1 += c->r[r].side_seq;
    printf("cuda-pipeline: after the warm-up %llu of %llu device transfers copied early\n", (unsigned long long)(early1 - early0),
           (unsigned long long)transfers);
    CHECK(ok && (early1 - early0) * 10 <= transfers, "early copies after the warm-up: %llu of %llu transfers (at most 10%%)",
          (unsigned long long)(early1 - early0), (unsigned long long)transfers);
    pp_pipeline_destroy(pl);
}

/* ---- pipeline.h's gradient norm, clipping and loss scaler on gradients in device memory ------ */
/* A kernel that writes late: 20 ms on the stream, then it fills its device buffer. */
typedef struct late_fill {
    float* dev;
    size_t n;
    float v;
} late_fill;
static int late_kernel(void* user) {
    late_fill* j = (late_fill*)user;
    float* p = (float*)fakecuda_dev_ptr(j->dev, j->n * sizeof(float));
    struct timespec ts = {0, 20 * 1000000L};
    size_t i;
    if (!p) return 1;
    nanosleep(&ts, NULL);
    for (i = 0; i < j->n; i++) p[i] = j->v;
    return 0;
}

/* The MLP's gradients (host: a copy of the reference's; device: the same bytes, each layer on
   rank l % 2's GPU) plus an f16 copy of layer 0's weights: norm, clip and scaler through the
   device ops' copy give the host's bits. */
static void test_grad_device(void) {
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
    pp_device_ops ops[2], nocopy;
    pp_grad_buf hb[MLP_DEPTH + 1], db[MLP_DEPTH + 1];
    void* dptr[MLP_DEPTH + 1];
    float* host = (float*)malloc(NPAR * sizeof(float));
    float* back = (float*)malloc(NPAR * sizeof(float));
    uint16_t h16[64];
    int devs[2] = {3, 1}, l, n = MLP_DEPTH + 1, skip = -1, dskip = -1;
    double nh = 0, nd = 0;
    pp_loss_scaler hs, ds;
    pp_error err;
    late_fill job;
    float nan = NAN;
    size_t i;
    err.msg[0] = 0;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 2;
    cd.devices = devs;
    if (!host || !back || pp_cuda_create(&cd, &c, &err) != PP_OK) {
        CHECK(0, "device gradients: set-up");
        free(host);
        free(back);
        return;
    }
    memcpy(host, GREFBUF, NPAR * sizeof(float));
    for (l = 0; l < 2; l++) ops[l] = pp_cuda_device_ops(c, l);
    for (l = 0; l < MLP_DEPTH; l++) { /* a dense layer's w and b are contiguous: one buffer each */
        size_t off = (size_t)(GREF.dense[l].w - GREFBUF), cnt = (size_t)GREF.dense[l].in * GREF.dense[l].out + GREF.dense[l].out;
        memset(&hb[l], 0, sizeof hb[l]);
        hb[l].layer = l;
        hb[l].data = host + off;
        hb[l].count = cnt;
        hb[l].dtype = PP_F32;
        db[l] = hb[l];
        db[l].device = &ops[l % 2];
        dptr[l] = NULL;
        CHECK(cudaSetDevice(devs[l % 2]) == cudaSuccess && cudaMalloc(&dptr[l], cnt * sizeof(float)) == cudaSuccess &&
                  cudaMemcpy(dptr[l], host + off, cnt * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess,
              "device gradients: layer %d's upload", l);
        db[l].data = dptr[l];
    }
    for (i = 0; i < 64; i++) h16[i] = pp_f32_to_f16(host[i] * 64.0f);
    memset(&hb[MLP_DEPTH], 0, sizeof hb[0]);
    hb[MLP_DEPTH].layer = 0;
    hb[MLP_DEPTH].data = h16;
    hb[MLP_DEPTH].count = 64;
    hb[MLP_DEPTH].dtype = PP_F16;
    db[MLP_DEPTH] = hb[MLP_DEPTH];
    db[MLP_DEPTH].device = &ops[1];
    dptr[MLP_DEPTH] = NULL;
    CHECK(cudaSetDevice(devs[1]) == cudaSuccess && cudaMalloc(&dptr[MLP_DEPTH], sizeof h16) == cudaSuccess &&
              cudaMemcpy(dptr[MLP_DEPTH], h16, sizeof h16, cudaMemcpyHostToDevice) == cudaSuccess,
          "device gradients: the f16 upload");
    db[MLP_DEPTH].data = dptr[MLP_DEPTH];
    /* layer 1's weights rewritten by a late kernel on its rank's stream: the norm must wait for it */
    job.dev = (float*)dptr[1];
    job.n = (size_t)GREF.dense[1].in * GREF.dense[1].out;
    job.v = 0.25f;
    for (i = 0; i < job.n; i++) ((float*)hb[1].data)[i] = 0.25f;
    CHECK(cudaSetDevice(devs[1]) == cudaSuccess && fakecuda_launch(pp_cuda_stream(c, 1), late_kernel, &job) == cudaSuccess,
          "late kernel");
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    CHECK(pp_grad_norm(NULL, MLP_DEPTH + 1, hb, n, &nh, &err) == PP_OK, "host norm: %s", err.msg);
    CHECK(pp_grad_norm(NULL, MLP_DEPTH + 1, db, n, &nd, &err) == PP_OK && memcmp(&nh, &nd, sizeof nh) == 0,
          "device gradients: norm %.17g, on the host %.17g (after the late kernel): %s", nd, nh, err.msg);
    /* clip both by the same factor: the same bits */
    CHECK(pp_grad_clip(hb, n, nh * 0.5, nh, NULL, &err) == PP_OK && pp_grad_clip(db, n, nh * 0.5, nh, NULL, &err) == PP_OK,
          "clip: %s", err.msg);
    for (l = 0; l < n; l++) {
        size_t bytes = hb[l].count * pp_dtype_size(hb[l].dtype);
        CHECK(cudaMemcpy(back, dptr[l], bytes, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(back, hb[l].data, bytes) == 0,
              "device gradients: buffer %d clipped as on the host", l);
    }
    /* the scaler: a NaN on the device skips; then a clean check unscales as on the host */
    CHECK(pp_loss_scaler_init(&hs, NULL, &err) == PP_OK && pp_loss_scaler_init(&ds, NULL, &err) == PP_OK, "scalers");
    /* cudaMemcpy from pageable memory may return before the device has the bytes, and it is not
       ordered with the rank's (non-blocking) stream: wait for it as a caller must, on the device
       current when it was issued (0) as well as on the one holding the buffer */
    CHECK(cudaMemcpy((float*)dptr[3] + 2, &nan, sizeof nan, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess && cudaSetDevice(devs[1]) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess,
          "a NaN");
    CHECK(pp_loss_scaler_check(&ds, NULL, 0, db, n, &dskip, &err) == PP_OK && dskip == 1 && ds.scale == 32768.0f,
          "device gradients: a NaN skips the step: skip %d, scale %g: %s", dskip, (double)ds.scale, err.msg);
    CHECK(cudaMemcpy((float*)dptr[3] + 2, (float*)hb[3].data + 2, sizeof nan, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess, "undo");
    hs.scale = ds.scale;
    CHECK(pp_loss_scaler_check(&hs, NULL, 0, hb, n, &skip, &err) == PP_OK && pp_loss_scaler_check(&ds, NULL, 0, db, n, &dskip, &err) == PP_OK &&
              skip == 0 && dskip == 0,
          "clean: %s", err.msg);
    for (l = 0; l < n; l++) {
        size_t bytes = hb[l].count * pp_dtype_size(hb[l].dtype);
        CHECK(cudaMemcpy(back, dptr[l], bytes, cudaMemcpyDeviceToHost) == cudaSuccess && memcmp(back, hb[l].data, bytes) == 0,
              "device gradients: buffer %d unscaled as on the host", l);
    }
    nocopy = ops[0];
    nocopy.copy = NULL;
    db[0].device = &nocopy;
    CHECK(pp_grad_norm(NULL, MLP_DEPTH + 1, db, n, &nd, &err) == PP_ERR_INVALID && strstr(err.msg, "no copy"),
          "device ops without a copy: %s", err.msg);
    for (l = 0; l < n; l++) {
        cudaSetDevice(devs[l == MLP_DEPTH ? 1 : l % 2]);
        cudaFree(dptr[l]);
    }
    cudaSetDevice(0);
    pp_cuda_destroy(c);
    free(host);
    free(back);
}

/* >>deadline: a host wait on a rank's GPU has a deadline (pp_cuda_desc.timeout_s). The rank's
   stream is held by a host function standing in for a kernel that never ends (an NCCL receive
   whose peer died) for 6 s; freeing a pool block with a 0.5 s deadline must return within 3 s,
   leave the block (cudaFree would wait for the stream too), and say why; the rank's zero, copy
   and pp_cuda_step_begin then fail with PP_ERR_TIMEOUT at once. Negative control:
   build/cuda-ctl-unbounded-waits (the free waits in cudaStreamSynchronize and returns after 6 s). A
   fresh rank's copy behind such a kernel fails with PP_ERR_TIMEOUT by the deadline, and
   pp_cuda_destroy returns by it too (the same control: each waits the 6 s). */
static pthread_mutex_t g_hold_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_hold_go_v; /* under g_hold_mu: the stand-in kernels may end */
static int hold_go(int set) {
    int v;
    pthread_mutex_lock(&g_hold_mu);
    if (set >= 0) g_hold_go_v = set;
    v = g_hold_go_v;
    pthread_mutex_unlock(&g_hold_mu);
    return v;
}
static void hold_stream(void* u) {
    double t0 = hx_now();
    (void)u;
    while (!hold_go(-1) && hx_now() - t0 < 6.0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}
static void test_free_deadline(void) {
    pp_cuda_desc cd;
    pp_cuda* c = NULL;
    pp_error err;
    pp_device_ops ops;
    void* blk;
    float h = 1.0f;
    double t0, took;
    size_t bytes = 0;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.timeout_s = 0.5;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        CHECK(0, "pp_cuda_create: %s", err.msg);
        return;
    }
    ops = pp_cuda_device_ops(c, 0);
    blk = ops.alloc(ops.user, 4096);
    CHECK(blk != NULL, "a pool block");
    hold_go(0);
    CHECK(cudaLaunchHostFunc(pp_cuda_stream(c, 0), hold_stream, NULL) == cudaSuccess, "cudaLaunchHostFunc");
    t0 = hx_now();
    ops.free(ops.user, blk);
    took = hx_now() - t0;
    CHECK(took < 3.0, "freeing a block behind a kernel that does not end took %.2f s with a 0.5 s deadline", took);
    CHECK(strstr(pp_cuda_error(c, 0), "timeout") != NULL, "pp_cuda_error after the free: \"%s\"", pp_cuda_error(c, 0));
    pp_cuda_memory(c, 0, &bytes, NULL);
    CHECK(bytes == 0, "the block left the pool (%zu bytes held)", bytes);
    CHECK(ops.zero(ops.user, &h, sizeof h) == PP_ERR_TIMEOUT, "a stuck rank's zero");
    CHECK(ops.copy(ops.user, &h, &h, sizeof h, 1) == PP_ERR_TIMEOUT, "a stuck rank's copy");
    t0 = hx_now();
    CHECK(pp_cuda_step_begin(c, &err) == PP_ERR_TIMEOUT && strstr(err.msg, "timeout") && hx_now() - t0 < 1.0,
          "pp_cuda_step_begin on a stuck rank: %s", err.msg);
    hold_go(1);
    pp_cuda_destroy(c);
    /* fresh ranks: a copy, then a destroy, behind a kernel that does not end */
    c = NULL;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        CHECK(0, "pp_cuda_create: %s", err.msg);
        return;
    }
    ops = pp_cuda_device_ops(c, 0);
    hold_go(0);
    CHECK(cudaLaunchHostFunc(pp_cuda_stream(c, 0), hold_stream, NULL) == cudaSuccess, "cudaLaunchHostFunc");
    t0 = hx_now();
    CHECK(ops.copy(ops.user, &h, &h, sizeof h, 1) == PP_ERR_TIMEOUT && hx_now() - t0 < 3.0,
          "a copy behind a kernel that does not end, 0.5 s deadline: %.2f s", hx_now() - t0);
    hold_go(1);
    pp_cuda_destroy(c);
    c = NULL;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        CHECK(0, "pp_cuda_create: %s", err.msg);
        return;
    }
    hold_go(0);
    CHECK(cudaLaunchHostFunc(pp_cuda_stream(c, 0), hold_stream, NULL) == cudaSuccess, "cudaLaunchHostFunc");
    t0 = hx_now();
    pp_cuda_destroy(c);
    took = hx_now() - t0;
    CHECK(took < 3.0, "pp_cuda_destroy behind a kernel that does not end, 0.5 s deadline: %.2f s", took);
    hold_go(1);
}

int main(int argc, char** argv) {
    int r, all;
    WBUF = mlp_init(&W, &GREF, DIMS, 21, &GREFBUF);
    NPAR = mlp_param_count(DIMS);
    mlp_make_data(X, Y, ROWS, HX_IN, HX_CLASSES, 8, 9);
    for (r = 0; r < 4; r++) {
        mlp_model tmp;
        G[r] = W;
        free(mlp_init(&tmp, &G[r], DIMS, 1, &GBUF[r]));
        GPTR[r] = &G[r];
    }
    /* "varlen", "early", "nan", "graddev", "eval" or "deadline" alone: what the negative controls run */
    all = argc < 2 || (strcmp(argv[1], "varlen") && strcmp(argv[1], "early") && strcmp(argv[1], "nan") && strcmp(argv[1], "graddev") &&
                       strcmp(argv[1], "eval") && strcmp(argv[1], "deadline"));
    if (all) {
        test_equal();
        test_failure();
        test_refused();
    }
    if (all || !strcmp(argv[1], "deadline")) test_free_deadline();
    if (all || !strcmp(argv[1], "graddev")) test_grad_device();
    if (all || !strcmp(argv[1], "eval")) test_eval();
    if (all || !strcmp(argv[1], "nan")) test_nan_loss();
    if (all || !strcmp(argv[1], "varlen")) test_varlen_pool();
    if (all || !strcmp(argv[1], "early")) test_early_copies_rare();
    for (r = 0; r < 4; r++) free(GBUF[r]);
    free(WBUF);
    free(GREFBUF);
    if (all) return TEST_DONE("cuda-pipeline");
    if (!strcmp(argv[1], "nan")) return TEST_DONE("cuda-pipeline nan");
    if (!strcmp(argv[1], "graddev")) return TEST_DONE("cuda-pipeline graddev");
    if (!strcmp(argv[1], "eval")) return TEST_DONE("cuda-pipeline eval");
    if (!strcmp(argv[1], "deadline")) return TEST_DONE("cuda-pipeline deadline");
    return !strcmp(argv[1], "varlen") ? TEST_DONE("cuda-pipeline varlen") : TEST_DONE("cuda-pipeline early");
}
