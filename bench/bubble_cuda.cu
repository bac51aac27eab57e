/* bench/bubble_cuda.cu - how close the CUDA backend gets to the schedule's ideal, on one GPU.

   Part 1: stages made of spin kernels. Each layer's forward spins one thread block (so it holds
   one SM) for F microseconds of GPU time, its backward for 2F: the stages of all ranks really
   run at the same time on one GPU, and the step can be compared with the simulator's ideal
   makespan for the same schedule and the same F/B times (transfers cost 0 in the ideal).
   Measured = the step's span on the CUDA event timeline (first action start to last action
   end), averaged over steps after warm-up. Every schedule kind (interleaved and the V kinds with
   v = 2, F/2 per chunk; no weight_grad: W costs 0) at p in {4, 8}, m in {8, 32}. Goal: measured /
   ideal <= 1.03.

   Part 2: activation copy bandwidth through the library's transport (isend/irecv/wait between
   two ranks, event-ordered device copies) against a raw cudaMemcpyAsync of the same bytes,
   4 KiB .. 256 MiB, nccl-tests style, with a #wrong column from checking every byte moved: one
   copy at a time (latency; also against a raw copy behind the event hand-off every two-stream
   transport needs) and queued back to back (throughput). With two GPUs the same again between
   GPU 0 and GPU 1 (peer copies). --copies runs part 2 alone.

     build/bubble_cuda [--f-us 1000] [--steps 5] [--quick] [--copies] [--detail KIND P M]

   --detail runs one configuration and prints, per rank, how long the GPU sat idle and how much
   of that it waited for the host (the action started within 30 us of being enqueued), then the
   last step action by action. 
   Exit code 1 only if data moved wrongly (#wrong) or a run failed; the ratios are reported. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "../tests/harness.h"
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- spin stages ------------------------------------------------------------------------------ */
__device__ static inline unsigned long long gtimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* one block, one thread: busy for ns nanoseconds of GPU time, then touches the output; stamp
   (when given) gets the GPU clock at the start */
__global__ void k_spin(long long ns, float* out, unsigned long long* stamp) {
    unsigned long long t0 = gtimer();
    if (stamp) *stamp = t0;
    while ((long long)(gtimer() - t0) < ns) {
    }
    if (out) out[0] = 1.0f;
}

/* --detail: per action, when the host enqueued it (CLOCK_REALTIME) and when the GPU started it
   (%globaltimer, which the driver keeps close to the host's real-time clock) */
#define DETAIL_MAX 1024
typedef struct detail_log {
    unsigned long long* d_stamp;        /* [PP_MAX_RANKS][DETAIL_MAX] on the device */
    double host[PP_MAX_RANKS][DETAIL_MAX];
    char what[PP_MAX_RANKS][DETAIL_MAX];
    int n[PP_MAX_RANKS];
} detail_log;
static detail_log* g_detail;
static double real_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static unsigned long long* detail_slot(int rank, char what) {
    detail_log* D = g_detail;
    int i;
    if (!D || (i = D->n[rank]) >= DETAIL_MAX) return NULL;
    D->n[rank]++;
    D->host[rank][i] = real_s();
    D->what[rank][i] = what;
    return D->d_stamp + (size_t)rank * DETAIL_MAX + i;
}

typedef struct spin_params {
    int last;                   /* the loss layer: no output */
} spin_params;

typedef struct spin_ctx {
    cudaStream_t st;
    int rank;
    long long f_ns, b_ns;       /* per layer */
} spin_ctx;

#define ROWS 256
#define COLS 256

static int spin_fwd(const spin_params* p, pp_layer_io* io) {
    const spin_ctx* cx = (const spin_ctx*)io->ctx;
    k_spin<<<1, 1, 0, cx->st>>>(cx->f_ns, p->last ? (float*)NULL : (float*)io->out[0].data, detail_slot(cx->rank, 'F'));
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}
static int spin_bwd(const spin_params* p, spin_params* g, pp_layer_io* io) {
    const spin_ctx* cx = (const spin_ctx*)io->ctx;
    (void)p;
    (void)g;
    k_spin<<<1, 1, 0, cx->st>>>(cx->b_ns, (float*)io->d_in[0].data, detail_slot(cx->rank, 'B'));
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}
static void spin_desc(const spin_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)mb;
    (void)in;
    (void)n_in;
    d->n_out = p->last ? 0 : 1;
    d->out[0].rows = ROWS;
    d->out[0].cols = COLS;
    d->out[0].dtype = PP_F32;
    d->cost = 1;
}
#define MAX_STAGES 16
#define SPIN_LAYERS(X) X(spin, spin_params, spin_fwd, spin_bwd, spin_desc, MAX_STAGES)
PP_MODEL(spinm, SPIN_LAYERS)

/* A spin layer's time in ns: F/v per chunk forward, twice that backward. */
static long long spin_ns(double f_us, int v, char what) {
    long long f = (long long)(f_us * 1000.0 / v);
    return what == 'F' ? f : 2 * f;
}

/* One configuration: returns 0 and fills measured/ideal (seconds), or 1. */
static int run_spin(pp_schedule_kind kind, int p, int v, int m, double f_us, int steps, double* measured, double* ideal,
                    double* bub_meas, double* bub_sim) {
    static hx_stages R;
    static spinm_model w, g;
    static spin_ctx cx[PP_MAX_RANKS];
    pp_cuda_desc cd;
    pp_cuda* c = NULL;
    pp_cuda_step_info info;
    pp_sim_result* sim = (pp_sim_result*)calloc(1, sizeof *sim);
    pp_sim_cost cost;
    pp_schedule sched;
    pp_error err;
    pp_batch b;
    size_t n = pp_schedule_size(kind, p, v, m);
    pp_action* acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
    int S = p * v, first[MAX_STAGES + 1], r, rc = 1;
    float* x = NULL;
    double sum = 0;
    int counted = 0;
    long long f_ns = spin_ns(f_us, v, 'F'), b_ns = spin_ns(f_us, v, 'B');
    memset(&R, 0, sizeof R);
    if (!sim || !acts || S > MAX_STAGES || pp_schedule_make(kind, p, v, m, acts, n, &sched, &err) != PP_OK) goto done;
    /* the model has exactly S layers, one per stage; the last one is the loss */
    for (int l = 0; l < MAX_STAGES; l++) w.spin[l].last = l == S - 1;
    for (int s = 0; s <= S; s++) first[s] = s;
    memset(&cost, 0, sizeof cost);
    cost.f = (double)f_ns * 1e-9;
    cost.b = (double)b_ns * 1e-9;
    if (pp_simulate(&sched, &cost, sim, NULL, &err) != PP_OK) goto done;
    *ideal = sim->makespan;
    *bub_sim = sim->bubble;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = p;
    cd.timeline = 1;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        fprintf(stderr, "pp_cuda_create: %s\n", err.msg);
        goto done;
    }
    R.p = p;
    R.user = c;
    R.before = hx_cuda_bind;
    if (cudaMalloc(&x, sizeof(float) * ROWS * COLS * (size_t)m) != cudaSuccess) goto done;
    hx_dense_batch(&b, x, NULL, ROWS * m, COLS, m);
    b.targets = x; /* the loss layer reads nothing */
    b.target_row_bytes = 4;
    R.batch = &b;
    for (r = 0; r < p; r++) {
        pp_stage_desc d;
        spinm_counts cnt;
        pp_model model;
        memset(&cnt, 0, sizeof cnt);
        cnt.spin = S; /* the list's count is a capacity: S spin layers in use */
        model = spinm_model_desc_counts(cnt);
        cx[r].st = pp_cuda_stream(c, r);
        cx[r].f_ns = f_ns;
        cx[r].b_ns = b_ns;
        cx[r].rank = r;
        hx_stage_desc(&d, NULL, model, &w, &g, &sched, first, r, pp_cuda_transport(c, r));
        d.device = pp_cuda_device_ops(c, r);
        d.layer_ctx = &cx[r];
        d.timeout_s = 60;
        if (pp_stage_create(&d, &R.st[r], &err) != PP_OK) {
            fprintf(stderr, "stage %d: %s\n", r, err.msg);
            goto done;
        }
    }
    for (int s = 0; s < steps + 1; s++) {
        if (g_detail) memset(g_detail->n, 0, sizeof g_detail->n); /* the last step's record stays */
        if (pp_cuda_step_begin(c, &err) != PP_OK) goto done;
        if (hx_stages_step(&R, &err) != PP_OK) {
            for (r = 0; r < p; r++)
                if (R.rc[r] != PP_OK) fprintf(stderr, "rank %d: %s\n", r, pp_stage_error(R.st[r]));
            goto done;
        }
        if (pp_cuda_step_end(c, &info, &err) != PP_OK) {
            fprintf(stderr, "step_end: %s\n", err.msg);
            goto done;
        }
        if (s == 0) continue; /* warm-up: the pool grows, events are created */
        sum += info.span;
        *bub_meas = info.bubble;
        counted++;
    }
    *measured = counted ? sum / counted : 0;
    rc = 0;
done:
    for (r = 0; r < p; r++) pp_stage_destroy(R.st[r]);
    if (c) pp_cuda_destroy(c);
    if (x) cudaFree(x);
    free(acts);
    free(sim);
    return rc;
}

/* ---- copy bandwidth ------------------------------------------------------------------------ */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

__global__ void k_fill(unsigned int* p, size_t n, unsigned int seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = (unsigned int)(i * 2654435761u) ^ seed;
}
__global__ void k_verify(const unsigned int* p, size_t n, unsigned int seed, unsigned long long* wrong) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long bad = 0;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) bad += p[i] != ((unsigned int)(i * 2654435761u) ^ seed);
    if (bad) atomicAdd(wrong, bad); /* a count, not a gradient: order does not matter */
}

/* Library vs raw copies of `bytes` from rank 0 (device d0) to rank 1 (device d1), per copy:
   t[0] library, one at a time (isend, irecv, wait, then the receiver's stream synchronised);
   t[1] raw cudaMemcpyAsync on the receiver's stream, one at a time; t[2] the same raw copy after
   the least hand-off any two-stream transport needs (an event recorded on the sender's stream,
   waited on by the receiver's); t[3] library and t[4] raw with `iters` copies queued back to back
   and one synchronisation at the end (throughput, host cost hidden behind the GPU's). */
#define COPY_PASSES 5
static int copy_row(pp_cuda* c, int d0, int d1, size_t bytes, int iters, double t[COPY_PASSES], unsigned long long* wrong) {
    void *src = NULL, *dst = NULL;
    unsigned long long* dw = NULL;
    pp_transport t0 = pp_cuda_transport(c, 0), t1 = pp_cuda_transport(c, 1);
    cudaStream_t s0 = pp_cuda_stream(c, 0), s1 = pp_cuda_stream(c, 1);
    cudaEvent_t ev = NULL;
    static pp_request rs[1024], rr[1024];
    pp_error err;
    size_t words = bytes / 4;
    int rc = 1;
    if (iters > 1024) iters = 1024;
    cudaSetDevice(d0);
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        goto out;
    k_fill<<<256, 256, 0, s0>>>((unsigned int*)src, words, 77u);
    if (cudaStreamSynchronize(s0) != cudaSuccess) goto out;
    cudaSetDevice(d1);
    if (cudaMalloc(&dst, bytes) != cudaSuccess || cudaMalloc(&dw, sizeof *dw) != cudaSuccess ||
        cudaMemset(dst, 0, bytes) != cudaSuccess || cudaMemset(dw, 0, sizeof *dw) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        goto out;
    for (int pass = 0; pass < COPY_PASSES; pass++) {
        double sum = 0;
        int queued = pass >= 3;
        for (int it = -1; it < (queued ? 1 : iters); it++) { /* it = -1: warm-up */
            double a = now_s();
            int n = queued ? iters : 1;
            for (int k = 0; k < n; k++) {
                int tag = queued ? k : it & 1023;
                if (pass == 0 || pass == 3) {
                    if (t0.isend(t0.self, 1, tag, src, bytes, &rs[k]) != PP_OK ||
                        t1.irecv(t1.self, 0, tag, dst, bytes, &rr[k]) != PP_OK)
                        goto out;
                    if (pass == 0 && (t1.wait(t1.self, &rr[k], 30, &err) != PP_OK || t0.wait(t0.self, &rs[k], 30, &err) != PP_OK))
                        goto out;
                } else {
                    if (pass == 2) {
                        cudaSetDevice(d0);
                        if (cudaEventRecord(ev, s0) != cudaSuccess) goto out;
                        cudaSetDevice(d1);
                        if (cudaStreamWaitEvent(s1, ev, 0) != cudaSuccess) goto out;
                    }
                    cudaSetDevice(d1);
                    if ((d0 == d1 ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s1)
                                  : cudaMemcpyPeerAsync(dst, d1, src, d0, bytes, s1)) != cudaSuccess)
                        goto out;
                }
            }
            if (pass == 3)
                for (int k = 0; k < n; k++)
                    if (t1.wait(t1.self, &rr[k], 30, &err) != PP_OK || t0.wait(t0.self, &rs[k], 30, &err) != PP_OK) goto out;
            cudaSetDevice(d1);
            if (cudaStreamSynchronize(s1) != cudaSuccess) goto out;
            if (it >= 0) sum += now_s() - a;
        }
        t[pass] = sum / iters;
        if (pass == 0 || pass == 3) {
            /* check what the library moved; the count comes back on s1, after the check (a plain
               cudaMemcpy on the legacy stream would not wait for the non-blocking s1) */
            cudaSetDevice(d1);
            k_verify<<<256, 256, 0, s1>>>((const unsigned int*)dst, words, 77u, dw);
            if (cudaMemcpyAsync(wrong, dw, sizeof *wrong, cudaMemcpyDeviceToHost, s1) != cudaSuccess ||
                cudaStreamSynchronize(s1) != cudaSuccess)
                goto out;
        }
    }
    rc = 0;
out:
    cudaSetDevice(d0);
    if (src) cudaFree(src);
    if (ev) cudaEventDestroy(ev);
    cudaSetDevice(d1);
    if (dst) cudaFree(dst);
    if (dw) cudaFree(dw);
    return rc;
}

static int copy_table(int d0, int d1, int quick) {
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
    pp_error err;
    int devs[2] = {d0, d1}, fails = 0;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 2;
    cd.devices = devs;
    if (pp_cuda_create(&cd, &c, &err) != PP_OK) {
        fprintf(stderr, "pp_cuda_create: %s\n", err.msg);
        return 1;
    }
    printf("\n# activation copies GPU %d -> GPU %d: library (isend/irecv/wait, event-ordered) vs raw %s\n", d0, d1,
           d0 == d1 ? "cudaMemcpyAsync" : "cudaMemcpyPeerAsync");
    printf("# one at a time: lib, raw, raw+ev (raw after an event hand-off between the two streams); queued: %s\n",
           "iters copies back to back, one synchronisation (per copy)");
    printf("%10s %6s %9s %9s %9s %8s %8s | %9s %9s %8s %9s %8s\n", "size (B)", "iters", "lib (us)", "raw (us)", "raw+ev",
           "lib/raw", "lib/r+ev", "q lib", "q raw", "q l/r", "q GB/s", "#wrong");
    for (size_t bytes = 4096; bytes <= ((size_t)256 << 20); bytes *= quick ? 16 : 4) {
        int iters = bytes <= (1 << 20) ? 200 : bytes <= (32 << 20) ? 40 : 10;
        double t[COPY_PASSES] = {0};
        unsigned long long wrong = 0;
        if (copy_row(c, d0, d1, bytes, iters, t, &wrong)) {
            printf("%12zu  failed: %s\n", bytes, pp_cuda_error(c, 1));
            fails++;
            continue;
        }
        printf("%10zu %6d %9.2f %9.2f %9.2f %8.3f %8.3f | %9.2f %9.2f %8.3f %9.1f %8llu\n", bytes, iters, 1e6 * t[0],
               1e6 * t[1], 1e6 * t[2], t[0] / t[1], t[0] / t[2], 1e6 * t[3], 1e6 * t[4], t[3] / t[4], bytes / t[3] / 1e9, wrong);
        if (wrong) fails++;
    }
    pp_cuda_destroy(c);
    printf("# copies: %s\n", fails ? "FAILED" : "OK");
    return fails;
}

/* One configuration's last step, action by action: where the GPU waited, and whether for the
   host (enqueued less than 30 us before it started) or for another rank's data. */
static int detail(pp_schedule_kind kind, int p, int m, double f_us) {
    static detail_log D;
    double meas = 0, ideal = 0, bm = 0, bs = 0, t0 = 1e300;
    int v = pp_schedule_kind_v(kind, 2);
    unsigned long long* st = (unsigned long long*)malloc(sizeof(unsigned long long) * PP_MAX_RANKS * DETAIL_MAX);
    memset(&D, 0, sizeof D);
    if (!st || cudaMalloc(&D.d_stamp, sizeof(unsigned long long) * PP_MAX_RANKS * DETAIL_MAX) != cudaSuccess) return 1;
    g_detail = &D;
    if (run_spin(kind, p, v, m, f_us, 2, &meas, &ideal, &bm, &bs)) return 1;
    g_detail = NULL;
    if (cudaMemcpy(st, D.d_stamp, sizeof(unsigned long long) * PP_MAX_RANKS * DETAIL_MAX, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    for (int r = 0; r < p; r++)
        for (int i = 0; i < D.n[r]; i++) {
            double g = 1e-9 * (double)st[r * DETAIL_MAX + i];
            if (g < t0) t0 = g;
            if (D.host[r][i] < t0) t0 = D.host[r][i];
        }
    printf("# --detail %s p=%d v=%d m=%d: ideal %.3f ms, measured %.3f ms (last step); times in ms from the first event\n",
           pp_schedule_name(kind), p, v, m, 1e3 * ideal, 1e3 * meas);
    printf("# per rank: gap = GPU idle before an action; host-late = the action started < 30 us after the host\n"
           "#   enqueued it (the GPU waited for the host); lag = GPU start - host enqueue\n");
    printf("%4s %8s %12s %14s %12s %14s %12s\n", "rank", "actions", "idle (ms)", "host-late (ms)", "#host-late",
           "median lag", "min lag (us)");
    for (int r = 0; r < p; r++) {
        double idle = 0, late = 0, prev_end = -1, minlag = 1e9;
        int nlate = 0, n = D.n[r];
        double lags[DETAIL_MAX];
        for (int i = 0; i < n; i++) {
            double g = 1e-9 * (double)st[r * DETAIL_MAX + i] - t0, h = D.host[r][i] - t0;
            double dur = 1e-9 * (double)spin_ns(f_us, v, D.what[r][i]);
            double gap = prev_end >= 0 ? g - prev_end : 0, lag = g - h;
            lags[i] = lag;
            if (lag < minlag) minlag = lag;
            if (gap > 0) idle += gap;
            if (gap > 2e-6 && lag < 30e-6) {
                late += gap;
                nlate++;
            }
            prev_end = g + dur;
        }
        for (int i = 1; i < n; i++) /* insertion sort for the median */
            for (int j = i; j > 0 && lags[j - 1] > lags[j]; j--) {
                double x = lags[j];
                lags[j] = lags[j - 1];
                lags[j - 1] = x;
            }
        printf("%4d %8d %12.3f %14.3f %12d %11.1f us %12.1f\n", r, n, 1e3 * idle, 1e3 * late, nlate, n ? 1e6 * lags[n / 2] : 0,
               1e6 * minlag);
    }
    printf("# rank 0..%d action by action: what host(ms) gpu(ms) gap(us)\n", p - 1);
    for (int r = 0; r < p; r++) {
        double prev_end = -1;
        printf("r%d:", r);
        for (int i = 0; i < D.n[r]; i++) {
            double g = 1e-9 * (double)st[r * DETAIL_MAX + i] - t0, h = D.host[r][i] - t0;
            double dur = 1e-9 * (double)spin_ns(f_us, v, D.what[r][i]);
            printf(" %c %.3f %.3f %.0f;", D.what[r][i], 1e3 * h, 1e3 * g, prev_end >= 0 ? 1e6 * (g - prev_end) : 0.0);
            prev_end = g + dur;
        }
        printf("\n");
    }
    cudaFree(D.d_stamp);
    free(st);
    return 0;
}

int main(int argc, char** argv) {
    double f_us = 1000;
    int steps = 5, quick = 0, ndev = 0, fails = 0, dp = 0, dm = 0, copies_only = 0;
    pp_schedule_kind dk = PP_SCHED_1F1B;
    double worst = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--f-us") && i + 1 < argc) f_us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--copies")) copies_only = 1;
        else if (!strcmp(argv[i], "--detail") && i + 3 < argc && pp_schedule_kind_parse(argv[i + 1], &dk) == PP_OK) {
            dp = atoi(argv[i + 2]);
            dm = atoi(argv[i + 3]);
            i += 3;
        } else {
            fprintf(stderr, "usage: bubble_cuda [--f-us 1000] [--steps 5] [--quick] [--copies] [--detail KIND P M]\n");
            return 2;
        }
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("bubble_cuda: no CUDA device, skipped\n");
        return 0;
    }
    if (dp > 0) return detail(dk, dp, dm, f_us);
    if (copies_only) goto copies;
    printf("# bubble_cuda: spin stages on one GPU (one SM each), F = %.0f us per stage (F/v per chunk), B = 2F\n", f_us);
    printf("# measured = step span on the CUDA event timeline, mean of %d steps after one warm-up\n", steps);
    printf("%-12s %3s %3s %4s %12s %12s %8s %10s %10s\n", "schedule", "p", "v", "m", "ideal (ms)", "measured", "ratio",
           "bubble sim", "measured");
    for (int kind = 0; kind < PP_SCHED_KIND_COUNT; kind++) /* every kind; ZB kinds with W = 0 */
        for (int p = 4; p <= 8; p *= 2)
            for (int m = 8; m <= 32; m *= 4) {
                int v = pp_schedule_kind_v((pp_schedule_kind)kind, 2);
                double meas = 0, ideal = 0, bm = 0, bs = 0;
                if (quick && (p == 8 || m == 32)) continue;
                if (run_spin((pp_schedule_kind)kind, p, v, m, f_us, steps, &meas, &ideal, &bm, &bs)) {
                    printf("%-12s %3d %3d %4d  failed\n", pp_schedule_name((pp_schedule_kind)kind), p, v, m);
                    fails++;
                    continue;
                }
                printf("%-12s %3d %3d %4d %12.3f %12.3f %8.4f %9.1f%% %9.1f%%\n", pp_schedule_name((pp_schedule_kind)kind), p,
                       v, m, 1e3 * ideal, 1e3 * meas, meas / ideal, 100 * bs, 100 * bm);
                if (meas / ideal > worst) worst = meas / ideal;
            }
    printf("# worst measured / ideal: %.4f (goal <= 1.03: %s)\n", worst, worst <= 1.03 ? "met" : "NOT met");
copies:
    fails += copy_table(0, 0, quick);
    if (ndev >= 2) fails += copy_table(0, 1, quick);
    return fails ? 1 : 0;
}
