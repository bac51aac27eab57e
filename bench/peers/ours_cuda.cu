/* bench/peers/ours_cuda.cu - the pipeline.h side of the peer comparison on one GPU.

   The model of bench/peers/torch_pp.py (and ours.c): L dense layers, y = tanh(x W + b) except
   the last, then a softmax cross-entropy, split evenly over p*v stages. Matrix products through
   cuBLAS (cublasSgemm, full fp32, atomics off), the rest as small kernels. Every rank is a CUDA
   stream of one GPU (pp_cuda_pipeline_create), as torch's --device cuda run puts every stage in
   one process on one GPU.

   Per schedule it prints the plain loop (p = 1: the same micro-batches forward and backward on
   one stream, through the same library) and the pipeline, each the median step time over
   --steps after --warmup, their ratio, and #wrong: 1 if the pipeline's gradients after one step
   are not bit-identical to the plain loop's.

     build/peers_ours_cuda [-p 4] [-m 32] [--layers 8] [--in 1024] [--hidden 1024] [--classes 16]
                           [--rows 256] [--steps 20] [--warmup 3] [--schedule all|gpipe|1f1b|interleaved]

   One line "RESULT {json}" per schedule (ratio = pipeline / plain loop), in the keys
   bench/peers/run_peers.py --gpu --ours-cuda reads. */
#define PIPELINE_IMPLEMENTATION
#include "../../pipeline_cuda.h"
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXL 64

typedef struct gd_p {
    int in, out, act;           /* act: tanh after the product */
    float *w, *b;               /* device: (in, out), (out) */
} gd_p;
typedef struct gx_p {
    int classes;
} gx_p;

typedef struct blas_set {
    cublasHandle_t h[PP_MAX_RANKS];
} blas_set;

static const float k_one = 1.0f, k_zero = 0.0f;

__global__ void k_bias(float* y, const float* b, int n, int out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = b[i % out];
}
__global__ void k_tanh(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = tanhf(y[i]);
}
__global__ void k_dz(const float* dy, const float* y, float* dz, int n, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dz[i] = act ? dy[i] * (1.0f - y[i] * y[i]) : dy[i];
}
/* one thread per column, rows in order: deterministic */
__global__ void k_colsum(const float* dz, float* gb, int rows, int out) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out) return;
    float acc = 0;
    for (int r = 0; r < rows; r++) acc += dz[(size_t)r * out + o];
    gb[o] += acc;
}
/* one thread per row: dz = scale * (softmax(z) - onehot(t)) */
__global__ void k_xent(const float* z, const int32_t* t, float* dz, int rows, int classes, float scale) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* zr = z + (size_t)r * classes;
    float mx = zr[0], sum = 0;
    for (int c = 1; c < classes; c++) mx = zr[c] > mx ? zr[c] : mx;
    for (int c = 0; c < classes; c++) sum += expf(zr[c] - mx);
    for (int c = 0; c < classes; c++) dz[(size_t)r * classes + c] = scale * (expf(zr[c] - mx) / sum - (c == t[r] ? 1.0f : 0.0f));
}
#define GRID(n) (((n) + 255) / 256), 256

static cublasHandle_t handle_of(const pp_layer_io* io, cudaStream_t* st) {
    const pp_cuda_layer_ctx* lc = (const pp_cuda_layer_ctx*)io->ctx;
    *st = lc->stream;
    return ((const blas_set*)lc->user)->h[lc->rank];
}

/* y (rows, out) = act(x (rows, in) W + b); row-major as column-major transposes */
static int gd_fwd(const gd_p* p, pp_layer_io* io) {
    cudaStream_t st;
    cublasHandle_t h = handle_of(io, &st);
    int rows = (int)io->in[0].rows, n = rows * p->out;
    float* y = (float*)io->out[0].data;
    if (rows <= 0) return 0;
    k_bias<<<GRID(n), 0, st>>>(y, p->b, n, p->out);
    if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, p->out, rows, p->in, &k_one, p->w, p->out, (const float*)io->in[0].data, p->in,
                    &k_one, y, p->out) != CUBLAS_STATUS_SUCCESS)
        return 8;
    if (p->act) k_tanh<<<GRID(n), 0, st>>>(y, n);
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}
/* dz = dy * act'(y) in the saved scratch; gW += x^T dz; gb += colsum(dz); dx = dz W^T */
static int gd_bwd(const gd_p* p, gd_p* g, pp_layer_io* io) {
    cudaStream_t st;
    cublasHandle_t h = handle_of(io, &st);
    int rows = (int)io->in[0].rows, n = rows * p->out;
    float* dz = (float*)io->saved;
    float* dx = (float*)io->d_in[0].data;
    if (rows <= 0) return 0;
    k_dz<<<GRID(n), 0, st>>>((const float*)io->d_out[0].data, (const float*)io->out[0].data, dz, n, p->act);
    if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, p->out, p->in, rows, &k_one, dz, p->out, (const float*)io->in[0].data, p->in, &k_one,
                    g->w, p->out) != CUBLAS_STATUS_SUCCESS)
        return 8;
    k_colsum<<<GRID(p->out), 0, st>>>(dz, g->b, rows, p->out);
    if (dx && cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, p->in, rows, p->out, &k_one, p->w, p->out, dz, p->out, &k_zero, dx, p->in) !=
                  CUBLAS_STATUS_SUCCESS)
        return 8;
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}
static void gd_desc(const gd_p* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)n_in;
    d->n_out = 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = p->out;
    d->out[0].dtype = PP_F32;
    d->saved_bytes = sizeof(float) * (size_t)in[0].rows * (size_t)p->out;
    d->cost = (double)mb->rows * p->in * p->out * 3.0;
    d->n_params = (int64_t)p->in * p->out + p->out;
}
static int gx_fwd(const gx_p* p, pp_layer_io* io) {
    (void)p;
    io->loss = 0; /* the loss value stays on the GPU: only gradients are compared */
    return 0;
}
static int gx_bwd(const gx_p* p, gx_p* g, pp_layer_io* io) {
    cudaStream_t st;
    int rows = (int)io->in[0].rows;
    (void)g;
    (void)handle_of(io, &st);
    if (rows <= 0) return 0;
    k_xent<<<GRID(rows), 0, st>>>((const float*)io->in[0].data, (const int32_t*)io->mb->targets, (float*)io->d_in[0].data, rows,
                                  p->classes, io->mb->loss_scale / (float)rows);
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}
static void gx_desc(const gx_p* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)in;
    (void)n_in;
    d->n_out = 0;
    d->cost = (double)mb->rows * p->classes * 4.0;
}
#define GM_LAYERS(X) X(dense, gd_p, gd_fwd, gd_bwd, gd_desc, MAXL) X(xent, gx_p, gx_fwd, gx_bwd, gx_desc, 1)
PP_MODEL(gm, GM_LAYERS)

typedef struct opts {
    int p, m, layers, in, hidden, classes, rows, steps, warmup;
    const char* schedule;
} opts;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int cmp_d(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* Runs warmup + steps of one configuration; *median gets the median step time, gout (host,
   n_grad floats) the gradients of one step from zero. */
static int run(const opts* o, pp_schedule_kind kind, int p, int v, const gm_model* w, gm_model* g, float* gbuf, size_t n_grad,
               const pp_batch* b, double* median, float* gout) {
    pp_pipeline_desc d;
    pp_cuda_desc cd;
    pp_pipeline* pl = NULL;
    pp_error err;
    blas_set bs;
    gm_counts cnt;
    double* t = (double*)calloc((size_t)o->steps, sizeof(double));
    int rc = 1, r;
    memset(&bs, 0, sizeof bs);
    memset(&d, 0, sizeof d);
    memset(&cd, 0, sizeof cd);
    memset(&cnt, 0, sizeof cnt);
    cnt.dense = o->layers;
    cnt.xent = 1;
    d.model = gm_model_desc_counts(cnt);
    d.weights = w;
    d.grads = g;
    d.schedule = kind;
    d.p = p;
    d.v = v;
    d.m = o->m;
    d.stage.layer_ctx = &bs;
    d.stage.timeout_s = 120;
    cd.n_ranks = p;
    if (!t || pp_cuda_pipeline_create(&d, &cd, &pl, &err) != PP_OK) {
        fprintf(stderr, "pipeline p=%d: %s\n", p, t ? err.msg : "out of memory");
        goto out;
    }
    for (r = 0; r < p; r++)
        if (cublasCreate(&bs.h[r]) != CUBLAS_STATUS_SUCCESS ||
            cublasSetStream(bs.h[r], pp_cuda_stream(pp_cuda_pipeline_world(pl), r)) != CUBLAS_STATUS_SUCCESS ||
            cublasSetAtomicsMode(bs.h[r], CUBLAS_ATOMICS_NOT_ALLOWED) != CUBLAS_STATUS_SUCCESS)
            goto out;
    for (int s = -o->warmup - 1; s < o->steps; s++) {
        double a;
        if (cudaMemset(gbuf, 0, sizeof(float) * n_grad) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) goto out;
        a = now_s();
        if (pp_pipeline_step(pl, b, NULL) != PP_OK) {
            fprintf(stderr, "step: %s\n", pp_pipeline_error(pl));
            goto out;
        }
        if (cudaDeviceSynchronize() != cudaSuccess) goto out;
        if (s >= 0) t[s] = now_s() - a;
        if (s == -o->warmup - 1 && cudaMemcpy(gout, gbuf, sizeof(float) * n_grad, cudaMemcpyDeviceToHost) != cudaSuccess) goto out;
    }
    qsort(t, (size_t)o->steps, sizeof(double), cmp_d);
    *median = t[o->steps / 2];
    rc = 0;
out:
    cudaDeviceSynchronize();
    for (r = 0; r < p; r++)
        if (bs.h[r]) cublasDestroy(bs.h[r]);
    pp_pipeline_destroy(pl);
    free(t);
    return rc;
}

int main(int argc, char** argv) {
    opts o = {4, 32, 8, 1024, 1024, 16, 256, 20, 3, "all"};
    static gm_model w, g;
    float *wbuf = NULL, *gbuf = NULL, *x = NULL, *g_seq, *g_pipe, *hw;
    int32_t *tg = NULL, *ht;
    size_t n = 0, off;
    int ndev = 0, fails = 0;
    pp_batch b;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(s) (!strcmp(a, s) && v && ++i)
        if (ARG("-p")) o.p = atoi(v);
        else if (ARG("-m")) o.m = atoi(v);
        else if (ARG("--layers")) o.layers = atoi(v);
        else if (ARG("--in")) o.in = atoi(v);
        else if (ARG("--hidden")) o.hidden = atoi(v);
        else if (ARG("--classes")) o.classes = atoi(v);
        else if (ARG("--rows")) o.rows = atoi(v);
        else if (ARG("--steps")) o.steps = atoi(v);
        else if (ARG("--warmup")) o.warmup = atoi(v);
        else if (ARG("--schedule")) o.schedule = v;
        else if (ARG("-v")) (void)v; /* interleaved runs v = 2, the only v run_peers.py passes */
        else if (!strcmp(a, "--no-overhead")) (void)0;
        else {
            fprintf(stderr, "usage: peers_ours_cuda [-p 4] [-m 32] [--layers 8] [--in 1024] [--hidden 1024] [--classes 16]\n"
                            "                       [--rows 256] [--steps 20] [--warmup 3] [--schedule all|gpipe|1f1b|interleaved]\n");
            return 2;
        }
#undef ARG
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* each schedule's line survives a timeout of the next */
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("peers_ours_cuda: no CUDA device, skipped\n");
        return 0;
    }
    if (o.p < 1 || o.p > PP_MAX_RANKS || o.layers < 2 * o.p || o.layers > MAXL || o.m < 1 || o.rows < o.m || o.steps < 1) {
        fprintf(stderr, "peers_ours_cuda: bad sizes (need layers >= 2p for interleaved, <= %d)\n", MAXL);
        return 2;
    }
    for (int l = 0; l < o.layers; l++) {
        int in = l ? o.hidden : o.in, out = l == o.layers - 1 ? o.classes : o.hidden;
        n += (size_t)in * out + out;
    }
    if (cudaMalloc(&wbuf, sizeof(float) * n) != cudaSuccess || cudaMalloc(&gbuf, sizeof(float) * n) != cudaSuccess ||
        cudaMalloc(&x, sizeof(float) * (size_t)o.rows * o.in) != cudaSuccess || cudaMalloc(&tg, sizeof(int32_t) * (size_t)o.rows) != cudaSuccess)
        return 1;
    hw = (float*)malloc(sizeof(float) * (n > (size_t)o.rows * o.in ? n : (size_t)o.rows * o.in));
    ht = (int32_t*)malloc(sizeof(int32_t) * (size_t)o.rows);
    g_seq = (float*)malloc(sizeof(float) * n);
    g_pipe = (float*)malloc(sizeof(float) * n);
    if (!hw || !ht || !g_seq || !g_pipe) return 1;
    {
        uint64_t s = 12345;
        off = 0;
        for (int l = 0; l < o.layers; l++) {
            int in = l ? o.hidden : o.in, out = l == o.layers - 1 ? o.classes : o.hidden;
            float sc = 1.0f / sqrtf((float)in);
            w.dense[l].in = g.dense[l].in = in;
            w.dense[l].out = g.dense[l].out = out;
            w.dense[l].act = g.dense[l].act = l < o.layers - 1;
            w.dense[l].w = wbuf + off;
            g.dense[l].w = gbuf + off;
            for (size_t k = 0; k < (size_t)in * out; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                hw[off + k] = sc * ((float)(s >> 40) / 16777216.0f * 2.0f - 1.0f);
            }
            off += (size_t)in * out;
            w.dense[l].b = wbuf + off;
            g.dense[l].b = gbuf + off;
            for (int k = 0; k < out; k++) hw[off + k] = 0.01f * (float)(k % 7);
            off += (size_t)out;
        }
        w.xent[0].classes = g.xent[0].classes = o.classes;
        if (cudaMemcpy(wbuf, hw, sizeof(float) * n, cudaMemcpyHostToDevice) != cudaSuccess) return 1;
        for (size_t k = 0; k < (size_t)o.rows * o.in; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            hw[k] = (float)(s >> 40) / 16777216.0f - 0.5f;
        }
        for (int r = 0; r < o.rows; r++) ht[r] = (int32_t)((unsigned)(r * 2654435761u) % (unsigned)o.classes);
        if (cudaMemcpy(x, hw, sizeof(float) * (size_t)o.rows * o.in, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(tg, ht, sizeof(int32_t) * (size_t)o.rows, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) /* the non-blocking streams do not wait for the legacy one */
            return 1;
    }
    memset(&b, 0, sizeof b);
    b.m = o.m;
    b.input.data = x;
    b.input.rows = o.rows;
    b.input.cols = o.in;
    b.input.dtype = PP_F32;
    b.targets = tg;
    b.target_row_bytes = sizeof(int32_t);
    printf("# peers_ours_cuda: %d dense layers (in %d, hidden %d, classes %d), %d rows in m=%d micro-batches, one GPU, cuBLAS\n",
           o.layers, o.in, o.hidden, o.classes, o.rows, o.m);
    printf("%-12s %3s %3s %4s %14s %14s %10s %7s\n", "schedule", "p", "v", "m", "plain (ms)", "pipeline (ms)", "ratio", "#wrong");
    for (int k = 0; k <= (int)PP_SCHED_INTERLEAVED; k++) {
        pp_schedule_kind kind = (pp_schedule_kind)k;
        int v = kind == PP_SCHED_INTERLEAVED ? 2 : 1, wrong;
        double t_seq = 0, t_pipe = 0;
        if (strcmp(o.schedule, "all") && strcmp(o.schedule, pp_schedule_name(kind))) continue;
        if (run(&o, PP_SCHED_GPIPE, 1, 1, &w, &g, gbuf, n, &b, &t_seq, g_seq) ||
            run(&o, kind, o.p, v, &w, &g, gbuf, n, &b, &t_pipe, g_pipe)) {
            printf("%-12s failed\n", pp_schedule_name(kind));
            fails++;
            continue;
        }
        wrong = memcmp(g_seq, g_pipe, sizeof(float) * n) != 0;
        fails += wrong;
        printf("%-12s %3d %3d %4d %14.3f %14.3f %10.3f %7d\n", pp_schedule_name(kind), o.p, v, o.m, 1e3 * t_seq, 1e3 * t_pipe,
               t_pipe / t_seq, wrong);
        printf("RESULT {\"side\": \"ours_cuda\", \"schedule\": \"%s\", \"p\": %d, \"v\": %d, \"m\": %d, \"t_seq_ms\": %.4f, "
               "\"t_pipe_ms\": %.4f, \"ratio\": %.4f, \"efficiency\": %.4f, \"host_us_per_action\": -1, \"peak_stash_bytes\": [0], "
               "\"wrong\": %d}\n",
               pp_schedule_name(kind), o.p, v, o.m, 1e3 * t_seq, 1e3 * t_pipe, t_pipe / t_seq, t_seq / (o.p * t_pipe), wrong);
    }
    cudaFree(wbuf);
    cudaFree(gbuf);
    cudaFree(x);
    cudaFree(tg);
    free(hw);
    free(ht);
    free(g_seq);
    free(g_pipe);
    return fails ? 1 : 0;
}
