/* tests/test_tp_nccl.c - the TP collectives over pipeline_nccl.h's transport, on the NCCL
   imitation (tests/fakenccl over tests/fakecuda), without a GPU. Four rank threads, each on its
   own imitation device, make one communicator (pp_nccl_comm_init) and a transport over it; then
   pp_tp_allreduce, pp_tp_reducescatter and pp_tp_allgather of host memory (staged through the
   device by the transport) over the four ranks (tp = 4) and over two groups of two at once
   ({0, 2} and {1, 3}: a TP group as a subset of the transport's ranks): f32, f64, f16, bf16,
   counts 0 .. 1001, every rank's result with the sequential sum's bits (tests/tp_data.h), the
   same bits as the threads and MPI transports give. Then over pp_nccl_grid_create_tp's g.tp
   (every pair connected at create: the collectives set nothing up)
   (pp 2 x tp 2, pp 1 x tp 4): the same, and the stream-ordered collectives of device memory
   (pp_nccl_tp_*, dev_group below). Not yet run on real NCCL and a GPU. */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#include "test.h"
#include "tp_data.h"
#include "harness.h"

#define NR 4
#define OUTSZ (MAXC * 8)

typedef struct world {
    ncclUniqueId id;
    int bad[NR];
    pp_result rc[NR];
    char msg[NR][sizeof(((pp_error*)0)->msg)];
} world;

/* One group's collectives for every dtype and count; group member i's inputs are fill(seed0 + i). */
/* r: the calling thread's world rank (its slot of the buffers). */
static int run_group(const pp_group* grp, int r, int me, int n, int seed0, char* msg, size_t msg_n) {
    static unsigned char a[NR][OUTSZ], b[NR][OUTSZ], ref[NR][OUTSZ];
    int d, ci, i, seeds[MAXN];
    pp_error err;
    for (i = 0; i < n; i++) seeds[i] = seed0 + i;
    for (d = 0; d < 4; d++)
        for (ci = 0; ci < (int)NCOUNTS; ci++) {
            size_t cnt = COUNTS[ci], es = pp_dtype_size(DTYPES[d]), off, len;
            pp_tp_block(cnt, n, me, &off, &len);
            reference(ref[r], DTYPES[d], seeds, n, cnt);
            fill(a[r], DTYPES[d], seed0 + me, cnt);
            if (pp_tp_allreduce(grp, a[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(a[r], ref[r], cnt * es) != 0) {
                snprintf(msg, msg_n, "all-reduce %s count %zu (tp %d): not the sequential sum", pp_dtype_name(DTYPES[d]),
                         cnt, n);
                return 1;
            }
            fill(a[r], DTYPES[d], seed0 + me, cnt);
            if (pp_tp_reducescatter(grp, a[r], b[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(b[r], ref[r] + off * es, len * es) != 0) {
                snprintf(msg, msg_n, "reduce-scatter %s count %zu (tp %d) differs", pp_dtype_name(DTYPES[d]), cnt, n);
                return 1;
            }
            memset(a[r], 0xee, OUTSZ);
            if (pp_tp_allgather(grp, b[r], a[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(a[r], ref[r], cnt * es) != 0) {
                snprintf(msg, msg_n, "all-gather %s count %zu (tp %d) differs", pp_dtype_name(DTYPES[d]), cnt, n);
                return 1;
            }
        }
    return 0;
fail:
    snprintf(msg, msg_n, "%s", err.msg);
    return 1;
}

/* pipeline_nccl.h's stream-ordered TP collectives of device memory (pp_nccl_tp_*) over the grid's
   g.tp, on a stream of the rank's own:
   - f32 and f64 all-reduce, reduce-scatter and all-gather at counts that split into tp blocks,
     f16 and bf16 all-gather (the imitation reduces no half type; NCCL does): the sequential
     sum's bits, as the imitation sums in rank order (NCCL's own order differs on a GPU);
   - in stream order and without a host wait: a kernel enqueued before the all-reduce writes its
     input and waits until this rank's call has returned (a gate the host opens after it). A call
     that waited for the collective would wait for that kernel: the gate times out (the control
     tp-ctl-nccl-host-wait, PP_NCCL_TEST_TP_HOST_WAIT);
   - a count that does not split (reduce-scatter) and host memory are refused, naming the rule;
   - last, the last TP rank never calls: the others' pp_nccl_step_end(g.tp) is PP_ERR_TIMEOUT
     within its deadline, the TP communicator aborted, and their stream runs on (the collective
     ended). The control tp-ctl-nccl-unwaited, whose step end does not wait for them, fails. */
typedef struct gate {
    float* dev;
    size_t n;
    int seed;
    int open, timed_out; /* the host opens it, the kernel's thread reads it: __atomic */
} gate;
static int gate_kernel(void* user) {
    gate* gk = (gate*)user;
    float* q = (float*)fakecuda_dev_ptr(gk->dev, gk->n * sizeof(float));
    double t0 = hx_now();
    size_t j;
    if (!q) return 1;
    while (!__atomic_load_n(&gk->open, __ATOMIC_ACQUIRE) && hx_now() - t0 < 5.0) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    __atomic_store_n(&gk->timed_out, !__atomic_load_n(&gk->open, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    for (j = 0; j < gk->n; j++) q[j] = (float)value(gk->seed, j);
    return 0;
}

static int dev_group(const pp_group* grp, int r, int me, int n, int seed0, char* msg, size_t msg_n) {
    static unsigned char ref[NR][OUTSZ], h[NR][OUTSZ];
    static gate gates[NR];
    const size_t counts[4] = {0, (size_t)n, (size_t)n * 3, (size_t)n * 250};
    int seeds[MAXN], d, ci, i, bad = 0;
    void *a = NULL, *b = NULL;
    cudaStream_t st = NULL;
    pp_error err;
    uint64_t c0 = fakenccl_thread_connects();
    for (i = 0; i < n; i++) seeds[i] = seed0 + i;
    err.msg[0] = 0;
    if (cudaStreamCreate(&st) != cudaSuccess || cudaMalloc(&a, OUTSZ) != cudaSuccess || cudaMalloc(&b, OUTSZ) != cudaSuccess) {
        snprintf(msg, msg_n, "device TP: set-up");
        bad = 1;
    }
    for (d = 0; d < 4 && !bad; d++)
        for (ci = 0; ci < 4 && !bad; ci++) {
            pp_dtype dt = DTYPES[d];
            size_t cnt = counts[ci], es = pp_dtype_size(dt), per = cnt / (size_t)n;
            int reduce = dt == PP_F32 || dt == PP_F64;
            reference(ref[r], dt, seeds, n, cnt);
            fill(h[r], dt, seed0 + me, cnt);
            if (reduce) {
                bad = cudaMemcpy(a, h[r], cnt * es, cudaMemcpyHostToDevice) != cudaSuccess ||
                      pp_nccl_tp_allreduce(grp, a, cnt, dt, st, &err) != PP_OK || cudaStreamSynchronize(st) != cudaSuccess ||
                      cudaMemcpy(h[r], a, cnt * es, cudaMemcpyDeviceToHost) != cudaSuccess;
                if (!bad && memcmp(h[r], ref[r], cnt * es) != 0)
                    snprintf(err.msg, sizeof err.msg, "all-reduce: not the sequential sum"), bad = 1;
                fill(h[r], dt, seed0 + me, cnt);
                bad = bad || cudaMemcpy(a, h[r], cnt * es, cudaMemcpyHostToDevice) != cudaSuccess ||
                      pp_nccl_tp_reducescatter(grp, a, b, cnt, dt, st, &err) != PP_OK || cudaStreamSynchronize(st) != cudaSuccess ||
                      cudaMemcpy(h[r], b, per * es, cudaMemcpyDeviceToHost) != cudaSuccess;
                if (!bad && memcmp(h[r], ref[r] + (size_t)me * per * es, per * es) != 0)
                    snprintf(err.msg, sizeof err.msg, "reduce-scatter: not this member's block of the sum"), bad = 1;
            } else { /* this member's block of the reference, gathered */
                memcpy(h[r], ref[r] + (size_t)me * per * es, per * es);
            }
            bad = bad || cudaMemcpy(b, h[r], per * es, cudaMemcpyHostToDevice) != cudaSuccess || cudaMemset(a, 0xee, OUTSZ) != cudaSuccess ||
                  pp_nccl_tp_allgather(grp, b, a, cnt, dt, st, &err) != PP_OK || cudaStreamSynchronize(st) != cudaSuccess ||
                  cudaMemcpy(h[r], a, cnt * es, cudaMemcpyDeviceToHost) != cudaSuccess;
            if (!bad && memcmp(h[r], ref[r], cnt * es) != 0)
                snprintf(err.msg, sizeof err.msg, "all-gather: not every member's block in order"), bad = 1;
            if (bad) snprintf(msg, msg_n, "device TP %s count %zu (tp %d): %.400s", pp_dtype_name(dt), cnt, n, err.msg);
        }
    if (!bad) { /* stream order, no host wait: the gate opens only after the call returned */
        gate* gk = &gates[r];
        float want, got[64];
        int j;
        gk->dev = (float*)a;
        gk->n = 64;
        gk->seed = seed0 + me;
        __atomic_store_n(&gk->open, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&gk->timed_out, 0, __ATOMIC_RELEASE);
        bad = fakecuda_launch(st, gate_kernel, gk) != cudaSuccess || pp_nccl_tp_allreduce(grp, a, 64, PP_F32, st, &err) != PP_OK;
        __atomic_store_n(&gk->open, 1, __ATOMIC_RELEASE);
        bad = bad || cudaStreamSynchronize(st) != cudaSuccess || cudaMemcpy(got, a, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess;
        if (bad || __atomic_load_n(&gk->timed_out, __ATOMIC_ACQUIRE)) {
            snprintf(msg, msg_n, "device TP (tp %d): %.400s", n, bad ? err.msg : "the call waited for the collective (and so for the "
                     "kernel before it on the stream, whose gate opens after the call): the host must not wait");
            bad = 1;
        }
        for (j = 0; j < 64 && !bad; j++) {
            for (want = 0, i = 0; i < n; i++) want += (float)value(seed0 + i, (size_t)j);
            if (got[j] != want) {
                snprintf(msg, msg_n, "device TP (tp %d): element %d is %g, not %g: the sum read its input before the "
                         "kernel before it on the stream wrote it", n, j, got[j], want);
                bad = 1;
            }
        }
    }
    if (!bad) { /* refusals: no message sent, nothing aborted */
        void* hostp = h[r];
        if (pp_nccl_tp_reducescatter(grp, a, b, (size_t)n + 1, PP_F32, st, &err) != PP_ERR_INVALID || !strstr(err.msg, "equal blocks"))
            snprintf(msg, msg_n, "device TP: %d + 1 elements reduce-scattered over %d: %.400s", n, n, err.msg), bad = 1;
        else if (pp_nccl_tp_allreduce(grp, hostp, 8, PP_F32, st, &err) != PP_ERR_INVALID || !strstr(err.msg, "host memory"))
            snprintf(msg, msg_n, "device TP: host memory all-reduced: %.400s", err.msg), bad = 1;
    }
    if (!bad && fakenccl_thread_connects() != c0) { /* the grid's warm-up all-reduce set the ring up at create */
        snprintf(msg, msg_n, "device TP (tp %d): the collectives set up %llu connections inside the run", n,
                 (unsigned long long)(fakenccl_thread_connects() - c0));
        bad = 1;
    }
    if (st) cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b);
    return bad;
}

/* The last TP rank never calls: the others' step end times out and aborts the TP communicator. */
static int dev_missing(const pp_group* grp, pp_nccl* tp, int me, int n, char* msg, size_t msg_n) {
    void* a = NULL;
    cudaStream_t st = NULL;
    pp_error err;
    double t0;
    pp_result rc;
    int bad = 0;
    err.msg[0] = 0;
    if (me == n - 1) return 0;
    if (cudaStreamCreate(&st) != cudaSuccess || cudaMalloc(&a, 64 * sizeof(float)) != cudaSuccess ||
        cudaMemset(a, 0, 64 * sizeof(float)) != cudaSuccess || pp_nccl_tp_allreduce(grp, a, 64, PP_F32, st, &err) != PP_OK) {
        snprintf(msg, msg_n, "device TP, a member missing: set-up: %.400s", err.msg);
        bad = 1;
    }
    t0 = hx_now();
    rc = bad ? PP_OK : pp_nccl_step_end(tp, 1.0, &err);
    if (!bad && (rc != PP_ERR_TIMEOUT || hx_now() - t0 > 10.0)) {
        snprintf(msg, msg_n, "device TP, TP rank %d never calls: pp_nccl_step_end gave %s after %.1f s (want PP_ERR_TIMEOUT "
                 "within its 1 s deadline): %.300s", n - 1, pp_result_str(rc), hx_now() - t0, err.msg);
        bad = 1;
    }
    if (!bad && cudaStreamSynchronize(st) == cudaErrorNotReady) { /* the abort ended the collective: the stream ran on */
        snprintf(msg, msg_n, "device TP: the stream is stuck after the abort");
        bad = 1;
    }
    if (st) cudaStreamDestroy(st);
    (void)cudaGetLastError();
    if (!bad) cudaFree(a);
    return bad;
}

static pp_result rank_main(int r, void* user) {
    world* W = (world*)user;
    pp_launch L;
    pp_nccl_desc nd;
    pp_nccl* t = NULL;
    ncclComm_t comm = NULL;
    pp_transport tr;
    pp_group grp;
    pp_error err;
    int pairs[2][2] = {{0, 2}, {1, 3}}, k;
    pp_result rc;
    memset(&L, 0, sizeof L);
    L.rank = r;
    L.world = NR;
    L.local_rank = r;
    rc = pp_nccl_comm_init(&L, &W->id, 20, &comm, &err);
    if (rc == PP_OK) {
        memset(&nd, 0, sizeof nd);
        nd.comm = comm;
        nd.own_comm = 0; /* the grids below split it too */
        nd.channels = 1;
        nd.timeout_s = 20;
        rc = pp_nccl_create(&nd, &t, &err);
    }
    if (rc != PP_OK) {
        snprintf(W->msg[r], sizeof W->msg[r], "%s", err.msg);
        return W->rc[r] = rc;
    }
    tr = pp_nccl_transport(t);
    grp.t = &tr;
    grp.ranks = NULL; /* all four: tp = 4 */
    grp.n_ranks = 0;
    grp.timeout_s = 20;
    W->bad[r] += run_group(&grp, r, r, NR, 300, W->msg[r], sizeof W->msg[r]);
    grp.ranks = pairs[r % 2]; /* {0, 2} and {1, 3} at once */
    grp.n_ranks = 2;
    if (!W->bad[r]) W->bad[r] += run_group(&grp, r, r / 2, 2, 400 + 10 * (r % 2), W->msg[r], sizeof W->msg[r]);
    pp_nccl_destroy(t);
    /* pp_nccl_grid_create_tp: pp 2 x tp 2, then pp 1 x tp 4; g.tp's ranks are the TP ranks */
    for (k = 0; k < 2 && !W->bad[r]; k++) {
        pp_nccl_grid g;
        int tp = k == 0 ? 2 : 4;
        pp_transport gt;
        if ((rc = pp_nccl_grid_create_tp(comm, NR / tp, tp, PP_GRID_DP_INNER, 0, 20, &g, &err)) != PP_OK) {
            snprintf(W->msg[r], sizeof W->msg[r], "%.400s (grid tp %d)", err.msg, tp);
            W->bad[r]++;
            break;
        }
        if (!g.tp || g.grid.tp != tp) {
            snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: no TP transport", tp);
            W->bad[r]++;
        } else {
            gt = pp_nccl_transport(g.tp);
            grp.t = &gt;
            grp.ranks = NULL;
            grp.n_ranks = 0;
            if (gt.rank != g.grid.tp_rank || gt.size != tp) {
                snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: transport rank %d of %d", tp, gt.rank, gt.size);
                W->bad[r]++;
            } else {
                uint64_t c0 = fakenccl_thread_connects();
                W->bad[r] += run_group(&grp, r, g.grid.tp_rank, tp, 500 + 10 * (g.grid.pp_rank * g.grid.dp + g.grid.dp_rank),
                                       W->msg[r], sizeof W->msg[r]);
                if (!W->bad[r] && fakenccl_thread_connects() != c0) { /* every pair was connected at create */
                    snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: the collectives set up %llu connections", tp,
                             (unsigned long long)(fakenccl_thread_connects() - c0));
                    W->bad[r]++;
                }
                if (!W->bad[r])
                    W->bad[r] += dev_group(&grp, r, g.grid.tp_rank, tp, 700 + 10 * (g.grid.pp_rank * g.grid.dp + g.grid.dp_rank),
                                           W->msg[r], sizeof W->msg[r]);
                if (!W->bad[r]) W->bad[r] += dev_missing(&grp, g.tp, g.grid.tp_rank, tp, W->msg[r], sizeof W->msg[r]);
            }
        }
        pp_nccl_grid_destroy(&g);
    }
    ncclCommDestroy(comm);
    return W->rc[r] = PP_OK;
}

int main(void) {
    static world W;
    pp_error err;
    int r;
    memset(&W, 0, sizeof W);
    ncclGetUniqueId(&W.id);
    CHECK(pp_threads_run(NR, rank_main, &W, &err) == PP_OK, "%s", err.msg);
    for (r = 0; r < NR; r++) {
        CHECK(W.rc[r] == PP_OK, "rank %d: %s", r, W.msg[r]);
        CHECK(W.bad[r] == 0, "rank %d: %s", r, W.msg[r]);
    }
    printf("test_tp_nccl: host pp_tp_* over the transport and the grid's g.tp; device pp_nccl_tp_* over g.tp at tp 2 and 4: "
           "the sequential sum's bits, in stream order with no host wait, a member that never calls a timeout at step end\n");
    return TEST_DONE("test_tp_nccl");
}
