/* tests/test_cuda_host.c - pipeline_cuda.h against an imitation CUDA runtime, without a GPU.

   Built with -I tests/fakecuda, so <cuda_runtime_api.h> is tests/fakecuda/cuda_runtime_api.h:
   streams are worker threads that run their queues asynchronously (with random delays), events
   and stream waits follow CUDA's rules, and device memory cannot be touched from the host. The
   MLP's layers are enqueued on the rank's stream as imitation kernels (fakecuda_launch), exactly
   as kernels would be: if the transport's event edges were wrong, a copy would read an
   activation before its producer wrote it (wrong bits here; a data race under ThreadSanitizer). Checked for every schedule, p in {1, 2, 4}, packed variable-length
   micro-batches, ranks on one device and spread over four: gradients bit-identical to
   pp_sequential_step, no device allocation after the pool's warm-up, peak stash = simulator's,
   every received byte written (receive buffers poisoned on the stream first), one timeline
   event pair per action; BROADCAST shapes (host metadata through the same transport); error
   paths (timeout naming the peer, size mismatch, abort). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "../examples/mlp.h"
#include "fakecuda/layer_kernels.h"
#include "test.h"
#include "harness.h"

#define ROWS 57
#define NSEQ 12
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
static const int32_t CU[NSEQ + 1] = {0, 3, 4, 11, 20, 22, 30, 31, 40, 41, 47, 50, 57};

/* ---- the MLP's layers, enqueued on the rank's stream as imitation kernels ---------------- */
static pp_model async_model(void) { return layer_kernels_model(mlp_model_desc()); }

/* The tests' batch: ROWS rows packed in NSEQ sequences (CU), 6 micro-batches balanced by tokens;
   inputs in host memory (the imitation's kernels read them directly). */
static void packed_batch(pp_batch* b, float* x, int32_t* y) {
    mlp_make_data(x, y, ROWS, HX_IN, HX_CLASSES, 8, 9);
    hx_packed_batch(b, x, y, CU, NSEQ, HX_IN, 6, PP_SPLIT_TOKENS);
}

/* ---- one configuration ---------------------------------------------------------------------- */
static void run_case(pp_schedule_kind kind, int p, int v, int spread, pp_shape_policy shapes, const mlp_model* w,
                     const mlp_model* gref, const pp_batch* batch, int steps) {
    static hx_stages W;
    pp_cuda* cuda = NULL;
    static hx_poison pz[PP_MAX_RANKS];
    static mlp_model g[PP_MAX_RANKS];
    static float* gbuf[PP_MAX_RANKS];
    static cudaStream_t streams[PP_MAX_RANKS];
    hx_sched sc;
    pp_cuda_desc cd;
    pp_cuda_step_info info;
    pp_error err;
    int devs[PP_MAX_RANKS], first[32], r, s, ok = 1, S = p * v, m = batch->m;
    int allocs1[PP_MAX_RANKS];
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s%s", pp_schedule_name(kind), p, v, m,
             spread ? "spread over 4 devices" : "one device", shapes == PP_SHAPES_BROADCAST ? " BROADCAST" : "");
    memset(&W, 0, sizeof W);
    memset(pz, 0, sizeof pz);
    if (hx_sched_simulate(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule", where);
        hx_sched_free(&sc);
        return;
    }
    pp_partition_uniform(MLP_DEPTH + 1, S, first, &err);
    for (r = 0; r < p; r++) devs[r] = spread ? r % 4 : 0;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = p;
    cd.devices = devs;
    cd.timeline = 1;
    W.p = p;
    W.batch = batch;
    W.keep_stats = 1;
    if (pp_cuda_create(&cd, &cuda, &err) != PP_OK) {
        CHECK(0, "%s: pp_cuda_create: %s", where, err.msg);
        hx_sched_free(&sc);
        return;
    }
    W.user = cuda;
    hx_mlp_rank_grads(g, gbuf, p, DIMS);
    for (r = 0; r < p; r++) {
        pp_stage_desc d;
        hx_cuda_stage_desc(&d, cuda, r, async_model(), w, &g[r], &sc.s, first, &streams[r]);
        d.shapes = shapes;
        if (p > 1) d.transport = hx_cuda_poison_transport(&pz[r], d.transport, &streams[r]);
        d.timeout_s = 20;
        if (pp_stage_create(&d, &W.st[r], &err) != PP_OK) {
            CHECK(0, "%s: rank %d: %s", where, r, err.msg);
            ok = 0;
        }
    }
    for (s = 0; s < steps && ok; s++) {
        if (hx_cuda_step(&W, &info, &err) != PP_OK) {
            for (r = 0; r < p; r++)
                if (W.rc[r] != PP_OK) CHECK(0, "%s: step %d rank %d: %s (%s)", where, s, r, pp_stage_error(W.st[r]), pp_cuda_error(cuda, r));
            CHECK(0, "%s: step %d failed: %s", where, s, err.msg);
            ok = 0;
            break;
        }
        for (r = 0; r < p; r++) {
            int a;
            pp_cuda_memory(cuda, r, NULL, &a);
            if (s < _PP_POOL_WARM_STEPS) allocs1[r] = a; /* the pool grows past sends in flight while it warms up */
            else if (a != allocs1[r]) {
                CHECK(0, "%s: rank %d allocated %d blocks in step %d", where, r, a - allocs1[r], s);
                ok = 0;
            }
        }
    }
    ok = ok && hx_mlp_grads_match(g, p, &sc.s, first, gref, 0, where);
    for (r = 0; ok && r < p; r++) {
        hx_check_peak_poison(&sc, kind, r, W.stats[r].peak_live, &pz[r], where);
        CHECK(info.n_actions[r] == sc.s.per_rank, "%s: rank %d timeline %d actions of %d", where, r, info.n_actions[r],
              sc.s.per_rank);
    }
    if (ok) {
        CHECK(info.span > 0 && info.bubble >= 0 && info.bubble < 1, "%s: span %g bubble %g", where, info.span, info.bubble);
        CHECK(pp_cuda_timeline(cuda, NULL, 0) == (size_t)p * sc.s.per_rank, "%s: timeline size", where);
    }
    hx_stages_destroy(&W);
    pp_cuda_destroy(cuda);
    hx_mlp_free_grads(gbuf, p);
    hx_sched_free(&sc);
    CHECK(ok, "%s", where);
}

static void test_equal(void) {
    hx_mlp f;
    pp_batch b;
    pp_error err;
    int kind, p, steps = _PP_POOL_WARM_STEPS + 2;
    hx_mlp_init(&f, DIMS, 21, ROWS, 8, 9);
    hx_packed_batch(&b, f.x, f.y, CU, NSEQ, HX_IN, 6, PP_SPLIT_TOKENS);
    CHECK(hx_mlp_reference(&f, &b, steps, &err) == PP_OK, "%s", err.msg);
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p *= 2) {
            int v = pp_schedule_size((pp_schedule_kind)kind, p, 1, b.m) ? 1 : 2; /* the kind's own v */
            run_case((pp_schedule_kind)kind, p, v, 0, PP_SHAPES_LOCAL, &f.w, &f.gref, &b, steps);
            if (p > 1) run_case((pp_schedule_kind)kind, p, v, 1, PP_SHAPES_LOCAL, &f.w, &f.gref, &b, steps);
        }
    run_case(PP_SCHED_1F1B, 4, 1, 1, PP_SHAPES_BROADCAST, &f.w, &f.gref, &b, steps);
    hx_mlp_free(&f);
}

/* A two-rank world (devices NULL: both on device 0) and its transports; NULL on failure. */
static pp_cuda* two_ranks(const int* devices, pp_transport* t0, pp_transport* t1) {
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
    pp_error err;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 2;
    cd.devices = devices;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        CHECK(0, "pp_cuda_create: %s", err.msg);
        return NULL;
    }
    *t0 = pp_cuda_transport(c, 0);
    *t1 = pp_cuda_transport(c, 1);
    return c;
}

/* The transport alone: a size mismatch, a timeout that names the peer, an abort. */
static void test_transport_errors(void) {
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
    pp_error err;
    pp_transport t0, t1;
    pp_request a, b;
    void *x = NULL, *y = NULL;
    pp_result rc;
    if (!(c = two_ranks(NULL, &t0, &t1))) return;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 2;
    cudaMalloc(&x, 64);
    cudaMalloc(&y, 64);
    CHECK(t0.isend(t0.self, 1, 5, x, 64, &a) == PP_OK, "isend");
    CHECK(t1.irecv(t1.self, 0, 5, y, 32, &b) == PP_OK, "irecv");
    rc = t1.wait(t1.self, &b, 1, &err);
    CHECK(rc == PP_ERR_SIZE && strstr(err.msg, "64 bytes"), "size mismatch: %d %s", (int)rc, err.msg);
    rc = t0.wait(t0.self, &a, 1, &err);
    CHECK(rc == PP_ERR_SIZE, "sender sees the mismatch: %d", (int)rc);
    CHECK(t1.irecv(t1.self, 0, 6, y, 64, &b) == PP_OK, "irecv");
    rc = t1.wait(t1.self, &b, 0.2, &err);
    CHECK(rc == PP_ERR_TIMEOUT && strstr(err.msg, "rank 0"), "timeout: %d %s", (int)rc, err.msg);
    /* a receive whose wait failed is over: withdrawn, waiting again repeats the failure */
    CHECK(pp_cuda_pending(c, NULL) == 0, "a timed-out receive is still posted");
    rc = t1.wait(t1.self, &b, 5, &err);
    CHECK(rc == PP_ERR_TIMEOUT && strstr(err.msg, "already failed"), "a second wait: %d %s", (int)rc, err.msg);
    CHECK(t1.irecv(t1.self, 0, 7, y, 64, &b) == PP_OK, "irecv");
    t0.abort(t0.self, PP_ERR_LAYER, "layer failed");
    rc = t1.wait(t1.self, &b, 5, &err);
    CHECK(rc == PP_ERR_ABORTED && strstr(err.msg, "layer failed"), "abort: %d %s", (int)rc, err.msg);
    /* a receive and a send of the failed step nobody waited for */
    CHECK(t1.irecv(t1.self, 0, 6, y, 64, &b) == PP_OK && t0.isend(t0.self, 1, 9, x, 64, &a) == PP_OK, "post");
    CHECK(pp_cuda_reset(c) == PP_OK, "reset");
    /* the reset withdrew them: a late send with their tags does not land in the stale block, a
       receive does not take the stale send, and waiting on them is an error, not a hang */
    CHECK(pp_cuda_pending(c, NULL) == 0, "the reset left %zu messages posted", pp_cuda_pending(c, NULL));
    rc = t1.wait(t1.self, &b, 5, &err);
    CHECK(rc == PP_ERR_INVALID && strstr(err.msg, "withdrawn"), "a request of the failed step after the reset: %d %s", (int)rc,
          err.msg);
    CHECK(t0.isend(t0.self, 1, 6, x, 64, &a) == PP_OK, "isend");
    CHECK(t1.irecv(t1.self, 0, 6, y, 64, &b) == PP_OK, "irecv");
    CHECK(t1.wait(t1.self, &b, 5, &err) == PP_OK, "%s", err.msg);
    CHECK(t0.wait(t0.self, &a, 5, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_cuda_pending(c, NULL) == 0, "tag 9's stale send survived the reset");
    CHECK(t0.isend(t0.self, 5, 1, x, 8, &a) == PP_ERR_INVALID, "send to rank 5 of 2 accepted");
    pp_cuda_step_end(c, NULL, &err); /* the streams drain (cudaFree would wait for them on a GPU) */
    cudaFree(x);
    cudaFree(y);
    pp_cuda_destroy(c);
    {
        int bad[2] = {0, 9};
        cd.devices = bad;
        CHECK(pp_cuda_create(&cd, &c, &err) == PP_ERR_INVALID && c == NULL && strstr(err.msg, "device 9"), "%s", err.msg);
    }
}

/* cancel (what a stage does with the receives of a failed step): a withdrawn receive takes no
   later message; the next receive with the tag does. Before and after a match. */
static void test_cancel(void) {
    pp_cuda* c = NULL;
    pp_error err;
    pp_transport t0, t1;
    pp_request rs, rr, rz;
    unsigned char *x = NULL, *y = NULL, *z = NULL, hy[256], hz[256];
    size_t recvs = 9;
    int i, bad = 0;
    if (!(c = two_ranks(NULL, &t0, &t1))) return;
    CHECK(t1.cancel != NULL, "pp_cuda's transport has no cancel");
    cudaMalloc((void**)&x, 256);
    cudaMalloc((void**)&y, 256);
    cudaMalloc((void**)&z, 256);
    cudaMemset(x, 7, 256);
    cudaMemset(y, 1, 256);
    cudaMemset(z, 1, 256);
    cudaDeviceSynchronize();
    /* not yet matched */
    CHECK(t1.irecv(t1.self, 0, 3, y, 256, &rr) == PP_OK, "irecv");
    if (t1.cancel) t1.cancel(t1.self, &rr);
    pp_cuda_pending(c, &recvs);
    CHECK(recvs == 0, "a cancelled receive is still posted");
    CHECK(t0.isend(t0.self, 1, 3, x, 256, &rs) == PP_OK, "isend");
    CHECK(t1.irecv(t1.self, 0, 3, z, 256, &rz) == PP_OK, "irecv");
    CHECK(t1.wait(t1.self, &rz, 5, &err) == PP_OK && t0.wait(t0.self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    /* matched, the copy not yet enqueued: it never runs */
    CHECK(t1.irecv(t1.self, 0, 4, y, 256, &rr) == PP_OK && t0.isend(t0.self, 1, 4, x, 256, &rs) == PP_OK, "post");
    if (t1.cancel) t1.cancel(t1.self, &rr);
    CHECK(t0.wait(t0.self, &rs, 5, &err) == PP_OK, "the sender of a withdrawn receive: %s", err.msg);
    CHECK(pp_cuda_step_end(c, NULL, &err) == PP_OK, "%s", err.msg);
    cudaMemcpy(hy, y, 256, cudaMemcpyDeviceToHost);
    cudaMemcpy(hz, z, 256, cudaMemcpyDeviceToHost);
    for (i = 0; i < 256; i++) bad += hy[i] != 1 || hz[i] != 7;
    CHECK(bad == 0, "%d bytes: a cancelled receive was written, or the next one was not", bad);
    CHECK(pp_cuda_pending(c, NULL) == 0, "messages left after clean transfers");
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
    pp_cuda_destroy(c);
}

/* A sent block reused while its copy still waits (the device ops' reuse hook), then overwritten
   on the sender's stream; the receiver must still get the bytes as they were sent. Two ways:
   - the receiver's stream is busy (busy_50ms), so the copy, which waits for the receiver's
     earlier work, would run late;
   - the block is copied early, and that copy must not wait for the sender's later work (on an
     H200, DualPipeV lost a whole action per early copy when it ran on the sender's stream: 1.12x
     its ideal step). The sender's later work is a kernel that runs until the receiver's stream,
     after the data, opens a gate: behind that kernel the copy, and the receiver with it, would
     wait for the gate, which only opens at its 3 s timeout. */
static void busy_50ms(void* u) {
    struct timespec d = {0, 50000000};
    (void)u;
    nanosleep(&d, NULL);
}
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, timed_out;
} g_late = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
static int k_later_work(void* u) {
    struct timespec dl;
    (void)u;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 3;
    pthread_mutex_lock(&g_late.mu);
    while (!g_late.open && !g_late.timed_out)
        if (pthread_cond_timedwait(&g_late.cv, &g_late.mu, &dl) != 0) g_late.timed_out = 1;
    pthread_mutex_unlock(&g_late.mu);
    return 0;
}
static int k_open_late_gate(void* u) {
    (void)u;
    pthread_mutex_lock(&g_late.mu);
    g_late.open = 1;
    pthread_cond_broadcast(&g_late.cv);
    pthread_mutex_unlock(&g_late.mu);
    return 0;
}
/* One message of n bytes from rank 0 to rank 1 and a step's end, which in the pool's warm-up
   gives rank 0 a spare for early copies; returns the bytes of spares rank 0 holds. */
static size_t warm_spare(pp_cuda* c, pp_transport* t0, pp_transport* t1, size_t n) {
    pp_request rs, rr;
    pp_error err;
    void *x = NULL, *y = NULL;
    size_t held = 0;
    cudaMalloc(&x, n);
    cudaMalloc(&y, n);
    CHECK(t1->irecv(t1->self, 0, 99, y, n, &rr) == PP_OK && t0->isend(t0->self, 1, 99, x, n, &rs) == PP_OK, "warm-up message");
    CHECK(t1->wait(t1->self, &rr, 5, &err) == PP_OK && t0->wait(t0->self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_cuda_step_end(c, NULL, &err) == PP_OK, "%s", err.msg);
    pp_cuda_memory(c, 0, &held, NULL);
    cudaFree(x);
    cudaFree(y);
    return held;
}

/* behind = 0: the receiver busy; 1: the sender's later work waits for the receiver. spare: the
   sender has a spare (warm_spare), else the copy goes onto the receiver's stream at the reuse. */
static void reuse_case(int behind, int spare) {
    pp_cuda* c = NULL;
    pp_error err;
    pp_transport t0, t1;
    pp_device_ops o0;
    pp_request rs, rr;
    unsigned char *x = NULL, *y = NULL, hy[4096], hx = 0;
    int i, bad = 0;
    const char* q = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int side_fits = 2 * 2 <= (q && atoi(q) > 0 ? atoi(q) : 8); /* two ranks on one device */
    if (!(c = two_ranks(NULL, &t0, &t1))) return;
    o0 = pp_cuda_device_ops(c, 0);
    if (spare) CHECK(warm_spare(c, &t0, &t1, 4096) >= 4096, "no spare after a step of the warm-up");
    CHECK(!c->r[0].side, "rank 0's side stream was made before its first early copy");
    cudaMalloc((void**)&x, 4096);
    cudaMalloc((void**)&y, 4096);
    cudaMemset(x, 7, 4096);
    cudaMemset(y, 0, 4096);
    cudaDeviceSynchronize(); /* the legacy stream's memsets, before the non-blocking streams */
    g_late.open = g_late.timed_out = 0;
    if (!behind) cudaLaunchHostFunc(pp_cuda_stream(c, 1), busy_50ms, NULL);
    CHECK(t1.irecv(t1.self, 0, 1, y, 4096, &rr) == PP_OK, "irecv");
    CHECK(t0.isend(t0.self, 1, 1, x, 4096, &rs) == PP_OK, "isend");
    CHECK(t0.wait(t0.self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    if (behind) fakecuda_launch(pp_cuda_stream(c, 0), k_later_work, NULL); /* the sender's later work */
    o0.reuse(o0.user, x, 4096);                        /* the receiver has not pulled: early copy */
    cudaMemsetAsync(x, 9, 4096, pp_cuda_stream(c, 0)); /* the block written again */
    CHECK(t1.wait(t1.self, &rr, 5, &err) == PP_OK, "%s", err.msg);
    if (behind) fakecuda_launch(pp_cuda_stream(c, 1), k_open_late_gate, NULL); /* the receiver's next work */
    CHECK(pp_cuda_step_end(c, NULL, &err) == PP_OK, "%s", err.msg);
    CHECK(!g_late.timed_out, "the early copy waited behind the sender's later work (the receiver with it)");
    CHECK((c->r[0].side_seq > 0) == spare, "the reuse %s a spare", spare ? "did not copy into" : "copied into");
    CHECK((c->r[0].side != NULL) == (spare && side_fits), "after %s, with %s queues: rank 0 %s a side stream",
          spare ? "an early copy" : "a reuse without one", q ? q : "8", c->r[0].side ? "has" : "has no");
    cudaMemcpy(hy, y, 4096, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hx, x, 1, cudaMemcpyDeviceToHost);
    for (i = 0; i < 4096; i++) bad += hy[i] != 7;
    CHECK(bad == 0, "%d received bytes were overwritten by the sender's reuse before the copy", bad);
    CHECK(hx == 9, "the reuse write did not happen");
    cudaFree(x);
    cudaFree(y);
    pp_cuda_destroy(c);
}
static void test_reuse_waits_for_copy(void) {
    reuse_case(0, 1);
    reuse_case(0, 0);
}

static void test_early_copy_not_behind_later_work(void) {
    reuse_case(1, 1);
    reuse_case(1, 0);
}

/* Early copies go into spares, reused once the previous receiver's copy out of them is done:
   the first receiver's copy waits behind busy work on its stream, the spare is taken again by a
   second early copy meanwhile, and each receiver must still get its own bytes. The spare comes
   from the pool's warm-up (a step's end) and is the only one made. */
static void test_spare_reused_after_copy(void) {
    pp_cuda* c = NULL;
    pp_error err;
    pp_transport t0, t1;
    pp_device_ops o0;
    pp_request rs, rr1, rr2;
    unsigned char *x1 = NULL, *x2 = NULL, *y1 = NULL, *y2 = NULL, h1[4096], h2[4096];
    int i, bad1 = 0, bad2 = 0;
    size_t spare0, spare_bytes = 0;
    if (!(c = two_ranks(NULL, &t0, &t1))) return;
    o0 = pp_cuda_device_ops(c, 0);
    spare0 = warm_spare(c, &t0, &t1, 4096);
    CHECK(spare0 >= 4096 && spare0 < 8192, "rank 0 holds %zu bytes of spares after a step, want one of 4096 or a little more",
          spare0);
    cudaMalloc((void**)&x1, 4096);
    cudaMalloc((void**)&x2, 4096);
    cudaMalloc((void**)&y1, 4096);
    cudaMalloc((void**)&y2, 4096);
    cudaMemset(x1, 7, 4096);
    cudaMemset(x2, 5, 4096);
    cudaDeviceSynchronize();
    cudaLaunchHostFunc(pp_cuda_stream(c, 1), busy_50ms, NULL); /* the first copy runs late */
    CHECK(t1.irecv(t1.self, 0, 1, y1, 4096, &rr1) == PP_OK, "irecv 1");
    CHECK(t0.isend(t0.self, 1, 1, x1, 4096, &rs) == PP_OK, "isend 1");
    CHECK(t0.wait(t0.self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    o0.reuse(o0.user, x1, 4096); /* early copy 1: into a new spare */
    CHECK(t1.wait(t1.self, &rr1, 5, &err) == PP_OK, "%s", err.msg); /* its copy out of the spare: enqueued, not run */
    CHECK(t1.irecv(t1.self, 0, 2, y2, 4096, &rr2) == PP_OK, "irecv 2");
    CHECK(t0.isend(t0.self, 1, 2, x2, 4096, &rs) == PP_OK, "isend 2");
    CHECK(t0.wait(t0.self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    o0.reuse(o0.user, x2, 4096); /* early copy 2: the same spare, after copy 1 read it */
    CHECK(t1.wait(t1.self, &rr2, 5, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_cuda_step_end(c, NULL, &err) == PP_OK, "%s", err.msg);
    pp_cuda_memory(c, 0, &spare_bytes, NULL);
    CHECK(spare_bytes == spare0, "rank 0 holds %zu bytes of spares, want the one spare of %zu (reused)", spare_bytes, spare0);
    cudaMemcpy(h1, y1, 4096, cudaMemcpyDeviceToHost);
    cudaMemcpy(h2, y2, 4096, cudaMemcpyDeviceToHost);
    for (i = 0; i < 4096; i++) {
        bad1 += h1[i] != 7;
        bad2 += h2[i] != 5;
    }
    CHECK(bad1 == 0, "%d bytes of the first message were overwritten in the spare before its receiver read them", bad1);
    CHECK(bad2 == 0, "%d bytes of the second message are wrong", bad2);
    cudaFree(x1);
    cudaFree(x2);
    cudaFree(y1);
    cudaFree(y2);
    pp_cuda_destroy(c);
}

/* Side streams only while a device's streams fit its work queues (CUDA_DEVICE_MAX_CONNECTIONS,
   8 by default): n ranks on one device may make 2n streams up to 4 ranks, n beyond; and a side
   stream only at its rank's first early copy (reuse_case), since a stream takes a queue used or
   not: pp_cuda_create makes n (under pipeline_nccl.h, whose queue count has no room for side
   streams, none is ever made; before, 2n were, and NCCL's steps hung by chance). Without side
   streams early copies run on the sender's stream, and still deliver the bytes as sent. */
static int streams_made(int n) {
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
    pp_error err;
    fakecuda_stats st;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = n;
    fakecuda_stats_reset();
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) return -1;
    fakecuda_stats_get(&st);
    pp_cuda_destroy(c);
    return (int)st.calls[FAKECUDA_CALL_STREAM_CREATE];
}
static void test_side_streams(void) {
    CHECK(streams_made(4) == 4, "4 ranks on one device: %d streams, want 4 (side streams at the first early copy)",
          streams_made(4));
    CHECK(streams_made(5) == 5, "5 ranks on one device: %d streams, want 5 (no side streams)", streams_made(5));
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
    CHECK(streams_made(5) == 5, "5 ranks, 32 queues: %d streams, want 5 (side streams at the first early copy)",
          streams_made(5));
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "2", 1);
    CHECK(streams_made(2) == 2, "2 ranks, 2 queues: %d streams, want 2", streams_made(2));
    test_reuse_waits_for_copy(); /* the early copy on the sender's stream */
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

/* ---- a failed step, the reset, and steps whose shapes change (issue 14 finding 6) ------------ */
static int fail_layer = -1, fail_mb = -1; /* set between steps only */
static int fail_fwd(const void* w, int l, pp_layer_io* io) {
    if (l == fail_layer && io->mb->index == fail_mb) return 7;
    return lk_fwd(w, l, io);
}

/* One step of batch b from zeroed gradients, compared with pp_sequential_step bit for bit. */
static int fr_step_equal(hx_stages* W, const pp_schedule* sched, const int* first, mlp_model* g, const mlp_model* w,
                         const pp_batch* b, const char* what) {
    mlp_model gref, tmp;
    float *gbuf = NULL, loss = 0;
    pp_error err;
    pp_model model = mlp_model_desc();
    int r, l, ok;
    memset(&tmp, 0, sizeof tmp);
    gref = *w;
    free(mlp_init(&tmp, &gref, DIMS, 1, &gbuf)); /* gref: zeroed gradients in gbuf */
    for (r = 0; r < W->p; r++)
        for (l = 0; l < MLP_DEPTH; l++) {
            memset(g[r].dense[l].w, 0, sizeof(float) * (size_t)w->dense[l].in * (size_t)w->dense[l].out);
            memset(g[r].dense[l].b, 0, sizeof(float) * (size_t)w->dense[l].out);
        }
    W->batch = b;
    if (pp_sequential_step(&model, w, &gref, b, &loss, &err) != PP_OK || hx_cuda_step(W, NULL, &err) != PP_OK) {
        for (r = 0; r < W->p; r++)
            if (W->rc[r] != PP_OK) CHECK(0, "%s: rank %d: %s", what, r, pp_stage_error(W->st[r]));
        CHECK(0, "%s: %s", what, err.msg);
        free(gbuf);
        return 0;
    }
    ok = hx_mlp_grads_match(g, W->p, sched, first, &gref, 0, what);
    free(gbuf);
    return ok;
}

static void test_failure_reset(pp_schedule_kind kind, int v, int spread) {
    static hx_stages W;
    pp_cuda* cuda = NULL;
    static mlp_model g[PP_MAX_RANKS];
    static float* gbuf[PP_MAX_RANKS];
    static cudaStream_t streams[PP_MAX_RANKS];
    mlp_model w, gtmp;
    float *wbuf, *gdummy, x[ROWS * HX_IN], x2[40 * HX_IN];
    int32_t y[ROWS], y2[40];
    pp_batch b, b2;
    pp_schedule sched;
    pp_action acts[512];
    pp_cuda_desc cd;
    pp_error err;
    int p = 4, m = 6, r, first[32], devs[PP_MAX_RANKS], failed = 0, aborted = 0, ok = 1;
    size_t recvs = 1;
    char what[96];
    pp_model fm = layer_kernels_model(mlp_model_desc());
    fm.forward = fail_fwd;
    snprintf(what, sizeof what, "failure and reset, %s p=%d v=%d %s", pp_schedule_name(kind), p, v, spread ? "4 devices" : "1 device");
    memset(&W, 0, sizeof W);
    memset(&w, 0, sizeof w);
    wbuf = mlp_init(&w, &gtmp, DIMS, 33, &gdummy);
    mlp_make_data(x2, y2, 40, HX_IN, HX_CLASSES, 5, 9);
    packed_batch(&b, x, y);
    b2 = b; /* other shapes: 40 rows of unpacked data, split in equal parts */
    b2.input.data = x2;
    b2.input.rows = 40;
    b2.targets = y2;
    b2.cu_seqlens = NULL;
    b2.n_seqs = 0;
    b2.split = PP_SPLIT_SEQS;
    if (pp_schedule_make(kind, p, v, m, acts, sizeof acts / sizeof acts[0], &sched, &err) != PP_OK ||
        pp_partition_uniform(MLP_DEPTH + 1, p * v, first, &err) != PP_OK) {
        CHECK(0, "%s: %s", what, err.msg);
        free(wbuf);
        free(gdummy);
        return;
    }
    for (r = 0; r < p; r++) devs[r] = spread ? r : 0;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = p;
    cd.devices = devs;
    W.p = p;
    if (pp_cuda_create(&cd, &cuda, &err) != PP_OK) {
        CHECK(0, "%s: %s", what, err.msg);
        free(wbuf);
        free(gdummy);
        return;
    }
    W.user = cuda;
    hx_mlp_rank_grads(g, gbuf, p, DIMS);
    for (r = 0; r < p && ok; r++) {
        pp_stage_desc d;
        hx_cuda_stage_desc(&d, cuda, r, fm, &w, &g[r], &sched, first, &streams[r]);
        d.timeout_s = 10;
        if (pp_stage_create(&d, &W.st[r], &err) != PP_OK) {
            CHECK(0, "%s: rank %d: %s", what, r, err.msg);
            ok = 0;
        }
    }
    if (ok) ok = fr_step_equal(&W, &sched, first, g, &w, &b, "a clean first step");
    if (ok) {
        /* a layer on the middle of the pipeline fails on micro-batch 2 */
        fail_layer = MLP_DEPTH / 2;
        fail_mb = 2;
        W.batch = &b;
        W.before = hx_cuda_bind;
        pp_cuda_step_begin(cuda, &err);
        hx_stages_step(&W, &err);
        fail_layer = fail_mb = -1;
        for (r = 0; r < p; r++) {
            failed += W.rc[r] == PP_ERR_LAYER;
            aborted += W.rc[r] == PP_ERR_ABORTED;
        }
        CHECK(failed == 1 && aborted == p - 1, "%s: one rank fails (%d), the others abort (%d)", what, failed, aborted);
        pp_cuda_pending(cuda, &recvs);
        CHECK(recvs == 0, "%s: %zu receives of the failed step are still posted (no cancel?)", what, recvs);
        CHECK(pp_cuda_reset(cuda) == PP_OK && pp_cuda_pending(cuda, NULL) == 0, "%s: reset", what);
        ok = fr_step_equal(&W, &sched, first, g, &w, &b, "the step after the reset") &&
             fr_step_equal(&W, &sched, first, g, &w, &b2, "a step with other shapes") &&
             fr_step_equal(&W, &sched, first, g, &w, &b, "back to the first shapes");
    }
    hx_stages_destroy(&W);
    pp_cuda_destroy(cuda);
    hx_mlp_free_grads(gbuf, p);
    free(wbuf);
    free(gdummy);
    CHECK(ok, "%s", what);
}

/* A block freed while a copy on another GPU's stream may still read it (issue 14 finding 10):
   the free waits for that copy. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, opened_before_free_returned;
} gate;
static gate g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
static int k_gate(void* u) {
    (void)u;
    pthread_mutex_lock(&g_gate.mu);
    while (!g_gate.open) pthread_cond_wait(&g_gate.cv, &g_gate.mu);
    pthread_mutex_unlock(&g_gate.mu);
    return 0;
}
static void* open_gate_later(void* u) {
    struct timespec d = {0, 50000000};
    (void)u;
    nanosleep(&d, NULL);
    pthread_mutex_lock(&g_gate.mu);
    g_gate.open = 1;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
    return NULL;
}
static void test_free_waits_for_peer_copy(void) {
    pp_cuda* c = NULL;
    pp_error err;
    pp_transport t0, t1;
    pp_device_ops o0;
    pp_request rs, rr;
    int devs[2] = {0, 1}, i, bad = 0, opened;
    unsigned char *x, *y = NULL, hy[4096];
    pthread_t th;
    if (!(c = two_ranks(devs, &t0, &t1))) return;
    o0 = pp_cuda_device_ops(c, 0);
    pp_cuda_bind(c, 0, &err);
    x = (unsigned char*)o0.alloc(o0.user, 4096); /* a pool block of rank 0 */
    cudaMemset(x, 7, 4096);
    cudaDeviceSynchronize();
    pp_cuda_bind(c, 1, &err);
    cudaMalloc((void**)&y, 4096);
    g_gate.open = 0;
    fakecuda_launch(pp_cuda_stream(c, 1), k_gate, NULL); /* rank 1's stream is busy */
    CHECK(t1.irecv(t1.self, 0, 1, y, 4096, &rr) == PP_OK, "irecv");
    pp_cuda_bind(c, 0, &err);
    CHECK(t0.isend(t0.self, 1, 1, x, 4096, &rs) == PP_OK, "isend");
    pp_cuda_bind(c, 1, &err);
    CHECK(t1.wait(t1.self, &rr, 5, &err) == PP_OK, "%s", err.msg); /* the copy waits behind the gate */
    pp_cuda_bind(c, 0, &err);
    CHECK(t0.wait(t0.self, &rs, 5, &err) == PP_OK, "%s", err.msg);
    pthread_create(&th, NULL, open_gate_later, NULL);
    o0.free(o0.user, x);
    pthread_mutex_lock(&g_gate.mu);
    opened = g_gate.open;
    pthread_mutex_unlock(&g_gate.mu);
    CHECK(opened, "a block was freed while a copy on another device's stream had still to read it");
    pthread_join(th, NULL);
    CHECK(pp_cuda_step_end(c, NULL, &err) == PP_OK, "%s", err.msg);
    cudaMemcpy(hy, y, 4096, cudaMemcpyDeviceToHost);
    for (i = 0; i < 4096; i++) bad += hy[i] != 7;
    CHECK(bad == 0, "%d bytes of the freed block's copy are wrong", bad);
    cudaFree(y);
    pp_cuda_destroy(c);
    cudaSetDevice(0);
}

int main(int argc, char** argv) {
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS"); /* the side-stream tests count on the default, 8 queues */
    if (test_only(argc, argv, "early", test_early_copy_not_behind_later_work)) /* build/cuda-controls runs it */
        return TEST_DONE("cuda-host early");
    if (test_only(argc, argv, "spare", test_spare_reused_after_copy)) return TEST_DONE("cuda-host spare");
    test_reuse_waits_for_copy();
    test_early_copy_not_behind_later_work();
    test_spare_reused_after_copy();
    test_side_streams();
    test_free_waits_for_peer_copy();
    test_cancel();
    test_failure_reset(PP_SCHED_1F1B, 1, 1);
    test_failure_reset(PP_SCHED_INTERLEAVED, 2, 0);
    test_transport_errors();
    test_equal();
    return TEST_DONE("cuda-host");
}
