/* tests/test_cuda.cu - the CUDA backend (pipeline_cuda.h) on the GPU.

   A small MLP (dense tanh layers, softmax cross-entropy) with deterministic kernels: every output
   element is one thread summing in a fixed order, no atomics, so each micro-batch's gradient is
   the same bits whichever stream computes it, and gradients accumulate in ascending micro-batch
   order on every schedule. Hence pipelined gradients must equal the unpipelined run (p = 1, one
   stage on one stream) of the same kernels BIT FOR BIT (memcmp), for GPipe, 1F1B and interleaved,
   p in {2, 4}, packed variable-length micro-batches (a token-balanced split of uneven sequences).
   Also checked on every case: a second step allocates no device memory (the pool is reused);
   the peak of live stashes per rank equals the simulator's; every receive buffer is filled with
   a NaN pattern before the receive is posted and every byte of it was overwritten when the wait
   returns; the timeline has one event pair per action and a bubble in [0, 1). With two or more
   GPUs the ranks are also spread over them (peer copies). Without a GPU it checks the error
   paths that need none and says it skipped the rest.

   Run:  make test-cuda      (or build/test_cuda; --quick for the sanitizer runs, --probe exits 0
                              when a GPU is present) */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "test.h"
#include "harness.h"
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define DEPTH 8
#define IN 16
#define HID 32
#define CLASSES 8
#define MAX_SEQS 64

/* ---- the model: device pointers in the parameter structs --------------------------------- */
typedef struct gdense {
    int in, out, act;           /* x (rows, in) -> y (rows, out), tanh when act */
    float* w;                   /* (in, out) device */
    float* b;                   /* (out) device */
} gdense;

typedef struct gxent {
    int classes;
} gxent;

/* Per-rank context handed to the layers as io->ctx. */
typedef struct gctx {
    cudaStream_t stream;
    float* mb_loss;             /* device [m]: each micro-batch's loss (last stage) */
} gctx;

__global__ void k_dense_fwd(const float* x, const float* w, const float* b, float* y, int rows, int in, int out, int act) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * out) return;
    int r = idx / out, o = idx % out;
    float acc = b[o];
    for (int i = 0; i < in; i++) acc += x[(size_t)r * in + i] * w[(size_t)i * out + o];
    y[idx] = act ? tanhf(acc) : acc;
}

__device__ float dz_at(const float* y, const float* dy, int idx, int act) {
    float d = dy[idx];
    if (act) d *= 1.0f - y[idx] * y[idx];
    return d;
}

/* gb[o] += sum_r dz[r,o]; gw[i,o] += sum_r x[r,i] dz[r,o]: one thread per weight, rows in order. */
__global__ void k_dense_bwd_w(const float* x, const float* y, const float* dy, float* gw, float* gb, int rows, int in,
                              int out, int act) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < in * out) {
        int i = idx / out, o = idx % out;
        float acc = 0;
        for (int r = 0; r < rows; r++) acc += x[(size_t)r * in + i] * dz_at(y, dy, r * out + o, act);
        gw[idx] += acc;
    } else if (idx < in * out + out) {
        int o = idx - in * out;
        float acc = 0;
        for (int r = 0; r < rows; r++) acc += dz_at(y, dy, r * out + o, act);
        gb[o] += acc;
    }
}

/* dx[r,i] = sum_o w[i,o] dz[r,o] */
__global__ void k_dense_bwd_x(const float* w, const float* y, const float* dy, float* dx, int rows, int in, int out, int act) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * in) return;
    int r = idx / in, i = idx % in;
    float acc = 0;
    for (int o = 0; o < out; o++) acc += w[(size_t)i * out + o] * dz_at(y, dy, r * out + o, act);
    dx[idx] = acc;
}

/* One thread: the micro-batch's mean loss, rows in order. */
__global__ void k_xent_fwd(const float* z, const int32_t* t, float* loss, int rows, int classes) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double acc = 0;
    for (int r = 0; r < rows; r++) {
        const float* zr = z + (size_t)r * classes;
        float mx = zr[0], sum = 0;
        for (int c = 1; c < classes; c++) mx = zr[c] > mx ? zr[c] : mx;
        for (int c = 0; c < classes; c++) sum += expf(zr[c] - mx);
        acc += (double)(logf(sum) + mx - zr[t[r]]);
    }
    *loss = (float)(acc / (double)rows);
}

__global__ void k_xent_bwd(const float* z, const int32_t* t, float* dz, int rows, int classes, float scale) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* zr = z + (size_t)r * classes;
    float mx = zr[0], sum = 0;
    for (int c = 1; c < classes; c++) mx = zr[c] > mx ? zr[c] : mx;
    for (int c = 0; c < classes; c++) sum += expf(zr[c] - mx);
    for (int c = 0; c < classes; c++)
        dz[(size_t)r * classes + c] = scale * (expf(zr[c] - mx) / sum - (c == t[r] ? 1.0f : 0.0f));
}

static int blocks(int64_t n) { return (int)((n + 127) / 128); }
static int launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : 9; }

static int gd_fwd(const gdense* p, pp_layer_io* io) {
    const gctx* cx = (const gctx*)io->ctx;
    int rows = (int)io->in[0].rows;
    if (io->in[0].cols != p->in || !cx) return 1;
    k_dense_fwd<<<blocks((int64_t)rows * p->out), 128, 0, cx->stream>>>((const float*)io->in[0].data, p->w, p->b,
                                                                         (float*)io->out[0].data, rows, p->in, p->out, p->act);
    return launched();
}

static int gd_bwd(const gdense* p, gdense* g, pp_layer_io* io) {
    const gctx* cx = (const gctx*)io->ctx;
    int rows = (int)io->in[0].rows;
    const float *x = (const float*)io->in[0].data, *y = (const float*)io->out[0].data, *dy = (const float*)io->d_out[0].data;
    if (!cx) return 1;
    k_dense_bwd_w<<<blocks((int64_t)p->in * p->out + p->out), 128, 0, cx->stream>>>(x, y, dy, g->w, g->b, rows, p->in,
                                                                                     p->out, p->act);
    if (io->d_in[0].data)
        k_dense_bwd_x<<<blocks((int64_t)rows * p->in), 128, 0, cx->stream>>>(p->w, y, dy, (float*)io->d_in[0].data, rows,
                                                                             p->in, p->out, p->act);
    return launched();
}

static void gd_desc(const gdense* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)n_in;
    d->n_out = 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = p->out;
    d->out[0].dtype = PP_F32;
    d->cost = (double)mb->rows * p->in * p->out * 3.0;
    d->n_params = (int64_t)p->in * p->out + p->out;
}

static int gx_fwd(const gxent* p, pp_layer_io* io) {
    const gctx* cx = (const gctx*)io->ctx;
    if (!cx || !cx->mb_loss) return 1;
    k_xent_fwd<<<1, 1, 0, cx->stream>>>((const float*)io->in[0].data, (const int32_t*)io->mb->targets,
                                        &cx->mb_loss[io->mb->index], (int)io->in[0].rows, p->classes);
    io->loss = 0; /* the loss stays on the GPU: read after the step */
    return launched();
}

static int gx_bwd(const gxent* p, gxent* g, pp_layer_io* io) {
    const gctx* cx = (const gctx*)io->ctx;
    int rows = (int)io->in[0].rows;
    (void)g;
    if (!cx) return 1;
    k_xent_bwd<<<blocks(rows), 128, 0, cx->stream>>>((const float*)io->in[0].data, (const int32_t*)io->mb->targets,
                                                     (float*)io->d_in[0].data, rows, p->classes,
                                                     io->mb->loss_scale / (float)rows);
    return launched();
}

static void gx_desc(const gxent* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)in;
    (void)n_in;
    d->n_out = 0;
    d->cost = (double)mb->rows * p->classes * 4.0;
}

#define G_LAYERS(X)                                          \
    X(dense, gdense, gd_fwd, gd_bwd, gd_desc, DEPTH)         \
    X(xent, gxent, gx_fwd, gx_bwd, gx_desc, 1)
PP_MODEL(gm, G_LAYERS)

static const int DIMS[DEPTH + 1] = {IN, HID, HID, 24, HID, HID, 20, HID, CLASSES};

static size_t n_params(void) {
    size_t t = 0;
    for (int l = 0; l < DEPTH; l++) t += (size_t)DIMS[l] * DIMS[l + 1] + DIMS[l + 1];
    return t;
}

/* Points a model's parameter structs into one flat device buffer. */
static void carve(gm_model* m, float* buf) {
    size_t off = 0;
    for (int l = 0; l < DEPTH; l++) {
        m->dense[l].in = DIMS[l];
        m->dense[l].out = DIMS[l + 1];
        m->dense[l].act = l < DEPTH - 1;
        m->dense[l].w = buf + off;
        off += (size_t)DIMS[l] * DIMS[l + 1];
        m->dense[l].b = buf + off;
        off += DIMS[l + 1];
    }
    m->xent[0].classes = CLASSES;
}

static uint64_t rng_next(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_unif(uint64_t* s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct run {
    int p, steps, poison, timeline;
    const pp_schedule* sched;
    const int* first;
    const pp_batch* batch;      /* device input and targets of device 0 */
    hx_stages S;                /* the ranks' stages on the pp_cuda world (S.user), batch_of[r]:
                                   rank r's device's copy of the batch */
    hx_poison pz[PP_MAX_RANKS];
} run;

/* Per device: a copy of the weights, the batch input/targets. */
typedef struct devdata {
    float* w;
    float* x;
    int32_t* y;
    pp_batch b;
} devdata;

typedef struct outcome {
    int ok;
    float* grads;               /* host [p][n_params], rank r's gradient buffer */
    float mb_loss[64];
    int peak_live[PP_MAX_RANKS];
    int allocs1[PP_MAX_RANKS], allocs2[PP_MAX_RANKS];
    size_t pool_bytes[PP_MAX_RANKS];
    int unwritten, checked, pz_errors;
    pp_cuda_step_info info;
    size_t n_events;
} outcome;

/* Runs `steps` steps of (sched, first) on ranks placed on devs[]; gradients to o->grads. */
static void run_pipeline(const pp_schedule* sched, const int* first, const int* devs, devdata* dd, const pp_batch* hb,
                         int steps, int poison, outcome* o, const char* where) {
    static run R;
    pp_cuda_desc cd;
    pp_cuda* cuda = NULL;
    pp_error err;
    int p = sched->p, r;
    size_t np = n_params();
    float* gdev[PP_MAX_RANKS] = {0};
    gm_model w[PP_MAX_RANKS], g[PP_MAX_RANKS];
    gctx ctx[PP_MAX_RANKS];
    memset(&R, 0, sizeof R);
    memset(o, 0, sizeof *o);
    memset(ctx, 0, sizeof ctx);
    R.p = p;
    R.sched = sched;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = p;
    cd.devices = devs;
    cd.timeline = 1;
    if (pp_cuda_create(&cd, &cuda, &err) != PP_OK) {
        CHECK(0, "%s: pp_cuda_create: %s", where, err.msg);
        return;
    }
    R.S.p = p;
    R.S.user = cuda;
    R.S.before = hx_cuda_bind;
    R.S.keep_stats = 1;
    o->grads = (float*)calloc((size_t)p * np, sizeof(float));
    o->ok = 1;
    for (r = 0; r < p && o->ok; r++) {
        pp_stage_desc d;
        int dev = devs ? devs[r] : 0;
        cudaSetDevice(dev);
        memset(&w[r], 0, sizeof w[r]);
        memset(&g[r], 0, sizeof g[r]);
        carve(&w[r], dd[dev].w);
        if (cudaMalloc(&gdev[r], np * sizeof(float)) != cudaSuccess || cudaMemset(gdev[r], 0, np * sizeof(float)) != cudaSuccess ||
            cudaMalloc(&ctx[r].mb_loss, 64 * sizeof(float)) != cudaSuccess) {
            CHECK(0, "%s: cudaMalloc", where);
            o->ok = 0;
            break;
        }
        carve(&g[r], gdev[r]);
        ctx[r].stream = pp_cuda_stream(cuda, r);
        R.S.batch_of[r] = &dd[dev].b;
        hx_stage_desc(&d, NULL, gm_model_desc(), &w[r], &g[r], sched, first, r, pp_cuda_transport(cuda, r));
        if (poison && p > 1) d.transport = hx_cuda_poison_transport(&R.pz[r], d.transport, &ctx[r].stream);
        d.device = pp_cuda_device_ops(cuda, r);
        d.layer_ctx = &ctx[r];
        d.timeout_s = 60;
        if (pp_stage_create(&d, &R.S.st[r], &err) != PP_OK) {
            CHECK(0, "%s: rank %d pp_stage_create: %s", where, r, err.msg);
            o->ok = 0;
        }
    }
    (void)hb;
    /* the gradient buffers were zeroed on the legacy stream, which pp_cuda's non-blocking
       streams do not wait for: fence before the first step */
    for (r = 0; r < p && o->ok; r++) {
        cudaSetDevice(devs ? devs[r] : 0);
        cudaDeviceSynchronize();
    }
    for (int s = 0; s < steps && o->ok; s++) {
        if (pp_cuda_step_begin(cuda, &err) != PP_OK) {
            CHECK(0, "%s: step_begin: %s", where, err.msg);
            o->ok = 0;
            break;
        }
        if (hx_stages_step(&R.S, &err) != PP_OK) {
            for (r = 0; r < p; r++)
                if (R.S.rc[r] != PP_OK)
                    CHECK(0, "%s: step %d rank %d: %s (cuda: %s)", where, s, r, pp_stage_error(R.S.st[r]), pp_cuda_error(cuda, r));
            o->ok = 0;
            break;
        }
        if (pp_cuda_step_end(cuda, &o->info, &err) != PP_OK) {
            CHECK(0, "%s: step_end: %s", where, err.msg);
            o->ok = 0;
            break;
        }
        for (r = 0; r < p; r++) /* allocs1: at the end of the pool's warm-up; allocs2: after it */
            pp_cuda_memory(cuda, r, &o->pool_bytes[r], s < _PP_POOL_WARM_STEPS ? &o->allocs1[r] : &o->allocs2[r]);
    }
    if (o->ok) {
        int last_rank, chunk;
        o->n_events = pp_cuda_timeline(cuda, NULL, 0);
        pp_schedule_stage_to_rank(sched, sched->n_stages - 1, &last_rank, &chunk);
        cudaSetDevice(devs ? devs[last_rank] : 0);
        if (cudaMemcpy(o->mb_loss, ctx[last_rank].mb_loss, sizeof(float) * (size_t)sched->m, cudaMemcpyDeviceToHost) != cudaSuccess)
            o->ok = 0;
        for (r = 0; r < p; r++) {
            cudaSetDevice(devs ? devs[r] : 0);
            if (cudaMemcpy(o->grads + (size_t)r * np, gdev[r], np * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
                o->ok = 0;
            o->peak_live[r] = R.S.stats[r].peak_live;
            o->unwritten += R.pz[r].unwritten;
            o->checked += R.pz[r].checked;
            o->pz_errors += R.pz[r].errors;
        }
        CHECK(o->ok, "%s: reading results back", where);
    }
    for (r = 0; r < p; r++) {
        pp_stage_destroy(R.S.st[r]);
        cudaSetDevice(devs ? devs[r] : 0);
        if (gdev[r]) cudaFree(gdev[r]);
        if (ctx[r].mb_loss) cudaFree(ctx[r].mb_loss);
    }
    pp_cuda_destroy(cuda);
}

/* Index of the first parameter of layer l in the flat buffer. */
static size_t layer_off(int l) {
    size_t t = 0;
    for (int k = 0; k < l; k++) t += (size_t)DIMS[k] * DIMS[k + 1] + DIMS[k + 1];
    return t;
}

static int g_cases, g_exact;

static void check_case(pp_schedule_kind kind, int p, int v, int m, const int* devs, devdata* dd, const pp_batch* hb,
                       const outcome* ref, int steps, const char* tag) {
    hx_sched sc;
    pp_error err;
    outcome o;
    int S = p * v, first[32], r, ok = 1;
    size_t np = n_params();
    char where[200];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s", pp_schedule_name(kind), p, v, m, tag);
    if (hx_sched_simulate(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule", where);
        hx_sched_free(&sc);
        return;
    }
    pp_partition_uniform(DEPTH + 1, S, first, &err);
    g_cases++;
    run_pipeline(&sc.s, first, devs, dd, hb, steps, 1, &o, where);
    if (!o.ok) ok = 0;
    /* gradients: layer l's owner has exactly the reference bits, every other rank zeros */
    for (int l = 0; ok && l < DEPTH; l++) {
        int s = 0, owner, chunk;
        size_t off = layer_off(l), len = (size_t)DIMS[l] * DIMS[l + 1] + DIMS[l + 1];
        while (!(l >= first[s] && l < first[s + 1])) s++;
        pp_schedule_stage_to_rank(&sc.s, s, &owner, &chunk);
        if (memcmp(o.grads + (size_t)owner * np + off, ref->grads + off, len * sizeof(float)) != 0) {
            size_t k;
            for (k = 0; k < len; k++)
                if (memcmp(&o.grads[(size_t)owner * np + off + k], &ref->grads[off + k], sizeof(float)) != 0) break;
            CHECK(0, "%s: layer %d (stage %d, rank %d) gradient differs from p=1 at element %zu: %.9g vs %.9g", where, l, s,
                  owner, k, o.grads[(size_t)owner * np + off + k], ref->grads[off + k]);
            ok = 0;
        }
        for (r = 0; r < p; r++) {
            if (r == owner) continue;
            for (size_t k = 0; k < len; k++)
                if (o.grads[(size_t)r * np + off + k] != 0.0f) {
                    CHECK(0, "%s: rank %d wrote gradients of layer %d (owned by rank %d)", where, r, l, owner);
                    ok = 0;
                    break;
                }
        }
    }
    if (ok && memcmp(o.mb_loss, ref->mb_loss, sizeof(float) * (size_t)m) != 0) {
        CHECK(0, "%s: micro-batch losses differ from p=1", where);
        ok = 0;
    }
    for (r = 0; ok && r < p; r++) {
        CHECK(hx_peak_agrees(kind, o.peak_live[r], sc.sim->peak_live[r]), "%s: rank %d peak stash %d, simulator %d", where, r,
              o.peak_live[r], sc.sim->peak_live[r]);
        CHECK(steps <= _PP_POOL_WARM_STEPS || o.allocs2[r] == o.allocs1[r], "%s: rank %d: %d cudaMalloc calls after the pool's warm-up", where, r,
              o.allocs2[r] - o.allocs1[r]);
        CHECK(o.info.n_actions[r] == sc.s.per_rank, "%s: rank %d timeline has %d actions, list has %d", where, r,
              o.info.n_actions[r], sc.s.per_rank);
    }
    if (ok) {
        CHECK(o.unwritten == 0 && o.pz_errors == 0, "%s: %d of %d receives left poisoned bytes (%d errors)", where,
              o.unwritten, o.checked, o.pz_errors);
        CHECK(o.checked > 0, "%s: no receive was checked", where);
        CHECK(o.info.span > 0 && o.info.bubble >= 0 && o.info.bubble < 1, "%s: span %g bubble %g", where, o.info.span,
              o.info.bubble);
        CHECK(o.n_events == (size_t)p * sc.s.per_rank, "%s: %zu timeline events", where, o.n_events);
    }
    if (ok) g_exact++;
    CHECK(ok, "%s", where);
    free(o.grads);
    hx_sched_free(&sc);
}

/* Error paths that need no GPU. */
static void test_errors_no_gpu(void) {
    pp_error err;
    pp_cuda* c = (pp_cuda*)1;
    pp_cuda_desc d;
    memset(&d, 0, sizeof d);
    CHECK(pp_cuda_status(cudaErrorMemoryAllocation, "cudaMalloc(x)", "f.cu", 12, &err) == PP_ERR_NOMEM, "OOM code");
    CHECK(strstr(err.msg, "cudaMalloc(x)") && strstr(err.msg, "f.cu:12"), "message: %s", err.msg);
    CHECK(pp_cuda_status(cudaErrorInvalidValue, "k", "g.cu", 3, &err) == PP_ERR_TRANSPORT, "other code");
    CHECK(pp_cuda_status(cudaSuccess, "k", "g.cu", 3, NULL) == PP_OK, "success");
    CHECK(pp_cuda_create(&d, &c, &err) == PP_ERR_INVALID && c == NULL, "0 ranks accepted");
    CHECK(pp_cuda_create(NULL, &c, &err) == PP_ERR_INVALID, "NULL desc accepted");
    {
        pp_transport t = pp_cuda_transport(NULL, 0);
        pp_device_ops o = pp_cuda_device_ops(NULL, 0);
        CHECK(t.isend == NULL && o.alloc == NULL, "NULL world gives empty ops");
    }
}

int main(int argc, char** argv) {
    int quick = 0, ndev = 0;
    pp_error err;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        if (!strcmp(argv[i], "--probe")) return (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) ? 0 : 1;
    }
    test_errors_no_gpu();
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        pp_cuda* c = NULL;
        pp_cuda_desc d;
        memset(&d, 0, sizeof d);
        d.n_ranks = 2;
        CHECK(pp_cuda_create(&d, &c, &err) == PP_ERR_UNSUPPORTED && c == NULL, "create without a GPU: %s", err.msg);
        printf("cuda: no CUDA device, GPU tests skipped\n");
        return TEST_DONE("cuda");
    }
    /* ---- data: uneven packed sequences, token-balanced split ---- */
    int32_t cu[MAX_SEQS + 1];
    int nseq = 24, rows = 0;
    uint64_t seed = 7;
    cu[0] = 0;
    for (int i = 0; i < nseq; i++) {
        int len = 1 + (int)(rng_next(&seed) % 29);
        if (i % 7 == 3) len += 40; /* a long tail */
        cu[i + 1] = cu[i] + len;
    }
    rows = cu[nseq];
    float* hx = (float*)malloc(sizeof(float) * (size_t)rows * IN);
    int32_t* hy = (int32_t*)malloc(sizeof(int32_t) * (size_t)rows);
    float* hw = (float*)malloc(sizeof(float) * n_params());
    for (int i = 0; i < rows * IN; i++) hx[i] = rng_unif(&seed);
    for (int i = 0; i < rows; i++) hy[i] = (int32_t)(rng_next(&seed) % CLASSES);
    {
        size_t off = 0;
        for (int l = 0; l < DEPTH; l++) {
            float sc = 1.5f / sqrtf((float)DIMS[l]);
            for (int k = 0; k < DIMS[l] * DIMS[l + 1]; k++) hw[off++] = rng_unif(&seed) * sc;
            for (int k = 0; k < DIMS[l + 1]; k++) hw[off++] = 0.01f * rng_unif(&seed);
        }
    }
    int nd = ndev < 8 ? ndev : 8;
    devdata dd[8];
    memset(dd, 0, sizeof dd);
    for (int dv = 0; dv < nd; dv++) {
        cudaSetDevice(dv);
        if (cudaMalloc(&dd[dv].w, sizeof(float) * n_params()) != cudaSuccess ||
            cudaMalloc(&dd[dv].x, sizeof(float) * (size_t)rows * IN) != cudaSuccess ||
            cudaMalloc(&dd[dv].y, sizeof(int32_t) * (size_t)rows) != cudaSuccess) {
            CHECK(0, "device %d: cudaMalloc of the data", dv);
            return TEST_DONE("cuda");
        }
        cudaMemcpy(dd[dv].w, hw, sizeof(float) * n_params(), cudaMemcpyHostToDevice);
        cudaMemcpy(dd[dv].x, hx, sizeof(float) * (size_t)rows * IN, cudaMemcpyHostToDevice);
        cudaMemcpy(dd[dv].y, hy, sizeof(int32_t) * (size_t)rows, cudaMemcpyHostToDevice);
        /* copies from pageable memory return before the bytes land, on the legacy stream, which
           pp_cuda's non-blocking streams do not wait for: fence before they read them */
        cudaDeviceSynchronize();
        pp_batch* b = &dd[dv].b;
        memset(b, 0, sizeof *b);
        b->input.data = dd[dv].x; /* device pointer: the library only offsets it */
        b->input.rows = rows;
        b->input.cols = IN;
        b->input.dtype = PP_F32;
        b->targets = dd[dv].y;
        b->target_row_bytes = sizeof(int32_t);
        b->cu_seqlens = cu; /* host: the plan is built on the host */
        b->n_seqs = nseq;
        b->split = PP_SPLIT_TOKENS;
    }
    static const int ms[] = {4, 8};
    int steps = _PP_POOL_WARM_STEPS + 1; /* the last step allocates nothing */
    for (int mi = 0; mi < (quick ? 1 : 2); mi++) {
        int m = ms[mi];
        for (int dv = 0; dv < nd; dv++) dd[dv].b.m = m;
        /* the unpipelined reference: one stage, one stream, same kernels */
        pp_action acts1[256];
        pp_schedule s1;
        int first1[2] = {0, DEPTH + 1};
        outcome ref;
        char where[64];
        snprintf(where, sizeof where, "reference p=1 m=%d", m);
        pp_schedule_make(PP_SCHED_GPIPE, 1, 1, m, acts1, 256, &s1, &err);
        run_pipeline(&s1, first1, NULL, dd, &dd[0].b, steps, 0, &ref, where);
        if (!ref.ok) {
            CHECK(0, "%s failed", where);
            continue;
        }
        for (int kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (int p = 2; p <= 4; p *= 2) {
                int v = pp_schedule_size((pp_schedule_kind)kind, p, 1, m) ? 1 : 2; /* the kind's own v */
                if (quick && p == 4) continue;
                check_case((pp_schedule_kind)kind, p, v, m, NULL, dd, &dd[0].b, &ref, steps, "one GPU");
                if (nd >= 2) {
                    int devs[8];
                    for (int r = 0; r < p; r++) devs[r] = r % nd;
                    check_case((pp_schedule_kind)kind, p, v, m, devs, dd, &dd[0].b, &ref, steps, "spread over GPUs");
                }
            }
        free(ref.grads);
    }
    printf("gpu gradient equality: %d of %d configurations bit-exact with p=1 on %d GPU(s)\n", g_exact, g_cases, nd);
    for (int dv = 0; dv < nd; dv++) {
        cudaSetDevice(dv);
        cudaFree(dd[dv].w);
        cudaFree(dd[dv].x);
        cudaFree(dd[dv].y);
    }
    free(hx);
    free(hy);
    free(hw);
    return TEST_DONE("cuda");
}
