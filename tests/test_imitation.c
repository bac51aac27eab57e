/* tests/test_imitation.c - the imitations themselves: tests/fakenccl (NCCL) and tests/fakecuda
   (the CUDA runtime), each rule shown to bite.

   Built with -Itests/fakenccl -Itests/fakecuda. For every rule a correct client passes and a
   known-bad client (the bug that rule exists to catch) fails: wrong data where a GPU would give
   wrong data, a hang where a GPU would hang. A hang is observed the only way a client can: a
   wait with a deadline that expires (cudaEventQuery polled); the test then aborts the
   communicators so the streams drain. Ranks are threads, each on its own imitation device. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "test.h"

#define HANG_S 0.3   /* how long a client waits before it calls an operation stuck */
#define LONG_S 20.0  /* how long a client waits for an operation that must complete */
#define NF 64        /* floats per message */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec d;
    d.tv_sec = (time_t)s;
    d.tv_nsec = (long)((s - (double)d.tv_sec) * 1e9);
    nanosleep(&d, NULL);
}

/* A client's wait: 1 when the event completed before the deadline, 0 when it timed out. */
static int wait_event(cudaEvent_t e, double timeout_s) {
    double end = now_s() + timeout_s;
    for (;;) {
        cudaError_t r = cudaEventQuery(e);
        if (r == cudaSuccess) return 1;
        if (r != cudaErrorNotReady || now_s() > end) return 0;
        sleep_s(0.0005);
    }
}

/* Records an event on s and waits for it. */
static int wait_stream(cudaStream_t s, double timeout_s) {
    cudaEvent_t e = NULL;
    int ok;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return 0;
    ok = cudaEventRecord(e, s) == cudaSuccess && wait_event(e, timeout_s);
    cudaEventDestroy(e); /* released once its record completed, if ever */
    return ok;
}

/* Polls a non-blocking communicator until its state is no longer ncclInProgress. */
static ncclResult_t poll_ready(ncclComm_t c) {
    ncclResult_t st = ncclInProgress;
    double end = now_s() + LONG_S;
    while (ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclInProgress && now_s() < end) sleep_s(0.0002);
    return st;
}

static float* dev_floats(int n) {
    void* p = NULL;
    return cudaMalloc(&p, sizeof(float) * (size_t)n) == cudaSuccess ? (float*)p : NULL;
}

/* device <- host, fenced for the non-blocking streams (cudaMemcpy from pageable memory returns
   before the bytes land, on the legacy stream, which non-blocking streams do not wait for); and
   host <- device after the caller synchronised the stream that wrote it */
static void put_floats(float* d, float v0, int n) {
    float h[4 * NF];
    int i;
    for (i = 0; i < n; i++) h[i] = v0 + (float)i;
    cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
    cudaStreamSynchronize(0);
}
static int is_floats(const float* d, float v0, int n) {
    float h[4 * NF];
    int i;
    cudaMemcpy(h, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost);
    for (i = 0; i < n; i++)
        if (h[i] != v0 + (float)i) return 0;
    return 1;
}

/* ---- ranks as threads ------------------------------------------------------------------------ */
typedef struct world world;
typedef void (*rank_fn)(world* w, int rank);
struct world {
    int n;
    int dev[8];
    rank_fn fn;
    ncclUniqueId id, id2;
    ncclComm_t comm[8], comm2[8];
    cudaStream_t s[8], s2[8];
    float *a[8], *b[8], *c[8];
    ncclResult_t rc[8], rc2[8];
    int ok[8], ok2[8], flag[8];
    char msg[8][256];
    void* user;
};

typedef struct rank_arg {
    world* w;
    int rank;
} rank_arg;

static void* rank_main(void* p) {
    rank_arg* a = (rank_arg*)p;
    cudaSetDevice(a->w->dev[a->rank]);
    a->w->fn(a->w, a->rank);
    return NULL;
}

static void run_ranks(world* w, rank_fn fn) {
    pthread_t th[8];
    rank_arg arg[8];
    int r;
    w->fn = fn;
    for (r = 0; r < w->n; r++) {
        arg[r].w = w;
        arg[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &arg[r]);
    }
    for (r = 0; r < w->n; r++) pthread_join(th[r], NULL);
}

static void world_init(world* w, int n) {
    int r;
    memset(w, 0, sizeof *w);
    w->n = n;
    for (r = 0; r < n; r++) w->dev[r] = r;
    ncclGetUniqueId(&w->id);
    ncclGetUniqueId(&w->id2);
}

/* Sets up every pair of c both ways before a test (what pipeline_nccl.h does at create): NCCL
   connects a pair on its first exchange, holding the host in ncclGroupEnd until the peer's host
   gets there (tests/fakenccl, lazy connection set-up), which the tests of other rules do not
   look at; and a first collective the same way. Every rank calls it, in the same place. */
static ncclResult_t connect_all(ncclComm_t c, int n, int r) {
    cudaStream_t s = NULL;
    ncclResult_t rc;
    float* one = dev_floats(1);
    int q;
    if (!one || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaFree(one);
        return ncclUnhandledCudaError;
    }
    ncclGroupStart();
    for (q = 0; q < n; q++)
        if (q != r) {
            ncclSend(NULL, 0, ncclUint8, q, c, s);
            ncclRecv(NULL, 0, ncclUint8, q, c, s);
        }
    rc = ncclGroupEnd();
    if (rc == ncclInProgress) rc = poll_ready(c);
    if (rc == ncclSuccess) rc = ncclAllReduce(one, one, 1, ncclFloat, ncclSum, c, s);
    if (rc == ncclInProgress) rc = poll_ready(c);
    if (rc == ncclSuccess && !wait_stream(s, LONG_S)) rc = ncclSystemError;
    cudaStreamDestroy(s);
    cudaFree(one);
    return rc;
}

/* comm, streams and three message buffers for each rank (in its own thread), every pair connected */
static void rank_setup(world* w, int r) {
    w->rc[r] = ncclCommInitRank(&w->comm[r], w->n, w->id, r);
    if (w->rc[r] == ncclSuccess) w->rc[r] = connect_all(w->comm[r], w->n, r);
    cudaStreamCreateWithFlags(&w->s[r], cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&w->s2[r], cudaStreamNonBlocking);
    w->a[r] = dev_floats(4 * NF);
    w->b[r] = dev_floats(4 * NF);
    w->c[r] = dev_floats(4 * NF);
}

/* after the ranks joined: streams and buffers go; comms were destroyed or aborted by the test */
static void world_free(world* w) {
    int r;
    for (r = 0; r < w->n; r++) {
        cudaSetDevice(w->dev[r]);
        if (w->s[r]) cudaStreamDestroy(w->s[r]);
        if (w->s2[r]) cudaStreamDestroy(w->s2[r]);
        cudaFree(w->a[r]);
        cudaFree(w->b[r]);
        cudaFree(w->c[r]);
    }
    cudaSetDevice(0);
}

/* A rank's end: its communicators destroyed when its operations completed, else aborted (the
   only way out of a stuck operation) and its streams drained; e destroyed. */
static void rank_finish(world* w, int r, int done, cudaEvent_t e) {
    if (done) {
        ncclCommDestroy(w->comm[r]);
        if (w->comm2[r]) ncclCommDestroy(w->comm2[r]);
    } else {
        ncclCommAbort(w->comm[r]);
        if (w->comm2[r]) ncclCommAbort(w->comm2[r]);
        cudaStreamSynchronize(w->s[r]);
        cudaStreamSynchronize(w->s2[r]);
    }
    if (e) cudaEventDestroy(e);
}

static void set_options(size_t eager, int serialize, double delay) {
    fakenccl_options o;
    memset(&o, 0, sizeof o);
    o.eager_bytes = eager;
    o.serialize_kernels = serialize;
    o.launch_delay_s = delay;
    fakenccl_set_options(&o);
}

/* ---- communicators ------------------------------------------------------------------------------ */

static void r_init(world* w, int r) {
    int n = -1, me = -1, dev = -1;
    w->rc[r] = ncclCommInitRank(&w->comm[r], w->n, w->id, r);
    if (w->rc[r] != ncclSuccess) return;
    w->ok[r] = ncclCommCount(w->comm[r], &n) == ncclSuccess && n == w->n && ncclCommUserRank(w->comm[r], &me) == ncclSuccess &&
               me == r && ncclCommCuDevice(w->comm[r], &dev) == ncclSuccess && dev == w->dev[r];
    snprintf(w->msg[r], sizeof w->msg[r], "%s", ncclGetLastError(w->comm[r]));
    ncclCommDestroy(w->comm[r]);
}

/* [UG: Creating a Communicator]: one rank per device; the same device twice is refused, unless
   NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL 2.30, src/init.cc), when three ranks on one device init. */
static void test_init_and_duplicate_gpu(void) {
    world w;
    int r, v = 0;
    CHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE && v == 23007, "version %d", v);
    world_init(&w, 4);
    run_ranks(&w, r_init);
    for (r = 0; r < 4; r++) CHECK(w.rc[r] == ncclSuccess && w.ok[r], "rank %d: init %d, count/rank/device ok %d", r, (int)w.rc[r], w.ok[r]);
    /* known-bad: ranks 0 and 2 on one device */
    world_init(&w, 3);
    w.dev[2] = 0;
    run_ranks(&w, r_init);
    for (r = 0; r < 3; r++) {
        CHECK(w.rc[r] == ncclInvalidUsage, "duplicate GPU: rank %d got %d (%s)", r, (int)w.rc[r], ncclGetErrorString(w.rc[r]));
        if (w.comm[r]) {
            CHECK(strstr(ncclGetLastError(w.comm[r]), "NCCL_MULTI_RANK_GPU_ENABLE=1") != NULL, "rank %d: %s", r,
                  ncclGetLastError(w.comm[r]));
            ncclCommDestroy(w.comm[r]);
        }
    }
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
    world_init(&w, 3);
    w.dev[1] = w.dev[2] = 0;
    run_ranks(&w, r_init);
    for (r = 0; r < 3; r++)
        CHECK(w.rc[r] == ncclSuccess && w.ok[r], "NCCL_MULTI_RANK_GPU_ENABLE=1: rank %d on device %d: %d %s", r, w.dev[r],
              (int)w.rc[r], w.msg[r]);
    unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
    {
        ncclComm_t c = NULL;
        ncclConfig_t cfg;
        memset(&cfg, 0, sizeof cfg); /* not from NCCL_CONFIG_INITIALIZER */
        CHECK(ncclCommInitRankConfig(&c, 1, w.id, 0, &cfg) == ncclInvalidArgument && c == NULL, "uninitialised config accepted");
    }
}

static void r_nonblocking_init(world* w, int r) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int n = -1;
    cfg.blocking = 0;
    w->rc[r] = ncclCommInitRankConfig(&w->comm[r], w->n, w->id, r, &cfg);
    if (r == 0) {
        /* known-bad client: reads the communicator before its state is ncclSuccess */
        w->rc2[r] = ncclCommCount(w->comm[r], &n);
        w->ok2[r] = n;
    }
    w->ok[r] = poll_ready(w->comm[r]) == ncclSuccess && ncclCommCount(w->comm[r], &n) == ncclSuccess && n == w->n;
    ncclCommDestroy(w->comm[r]);
}

/* [UG: ncclCommInitRankConfig, ncclCommGetAsyncError]: a non-blocking init returns
   ncclInProgress; the communicator is usable only once its state is ncclSuccess. */
static void test_nonblocking_init(void) {
    world w;
    int r;
    set_options(0, 0, 0.2);
    world_init(&w, 2);
    run_ranks(&w, r_nonblocking_init);
    for (r = 0; r < 2; r++) {
        CHECK(w.rc[r] == ncclInProgress, "rank %d: non-blocking init returned %d, not ncclInProgress", r, (int)w.rc[r]);
        CHECK(w.ok[r], "rank %d: the polled communicator does not work", r);
    }
    CHECK(w.rc2[0] == ncclInvalidArgument && w.ok2[0] == -1, "a communicator read before it was ready answered %d (count %d)",
          (int)w.rc2[0], w.ok2[0]);
    set_options(0, 0, 0.004);
}

static void r_split(world* w, int r) {
    int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, n = -1, me = -1;
    ncclComm_t child = NULL;
    w->rc[r] = ncclCommInitRank(&w->comm[r], w->n, w->id, r);
    w->rc2[r] = ncclCommSplit(w->comm[r], color, 10 - r, &child, NULL);
    w->ok[r] = child ? (ncclCommCount(child, &n) == ncclSuccess && ncclCommUserRank(child, &me) == ncclSuccess) : 0;
    w->flag[r] = child ? n * 10 + me : -1;
    ncclCommDestroy(child);
    ncclCommDestroy(w->comm[r]);
}

static void r_split_nonblocking(world* w, int r) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t child = NULL;
    float* x = dev_floats(NF);
    cudaStream_t s = NULL;
    cfg.blocking = 0;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    w->rc[r] = ncclCommInitRankConfig(&w->comm[r], w->n, w->id, r, &cfg);
    poll_ready(w->comm[r]);
    w->rc2[r] = ncclCommSplit(w->comm[r], 0, 0, &child, NULL); /* NULL config: inherits non-blocking */
    w->ok[r] = poll_ready(w->comm[r]) == ncclSuccess && child != NULL && poll_ready(child) == ncclSuccess;
    if (child) {
        /* a non-blocking child: an operation outside a group returns ncclInProgress */
        w->flag[r] = ncclAllReduce(x, x, NF, ncclFloat, ncclSum, child, s);
        poll_ready(child);
        w->ok2[r] = wait_stream(s, LONG_S);
        ncclCommDestroy(child);
    }
    ncclCommDestroy(w->comm[r]);
    cudaStreamDestroy(s);
    cudaFree(x);
}

/* A non-blocking parent: the child pointer is written only once the parent is seen settled
   [NCCL issue 1472]. The known-bad client polls the child straight after the split (as
   pp_nccl_grid_create did: "internal error" on an H200, then a crash when NCCL wrote the
   pointer into a returned stack frame); the good one polls the parent first. */
/* A non-blocking world (w->comm[r], settled), then, delay_s later, its split of colour 0, key r
   into *child: the caller's, which NCCL writes once the parent settles (not this frame's). */
static void nb_split(world* w, int r, double delay_s, ncclComm_t* child) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    *child = NULL;
    w->rc[r] = ncclCommInitRankConfig(&w->comm[r], w->n, w->id, r, &cfg);
    poll_ready(w->comm[r]);
    if (delay_s > 0) sleep_s(delay_s);
    w->rc2[r] = ncclCommSplit(w->comm[r], 0, r, child, NULL);
}

static void r_split_child_first(world* w, int r) {
    ncclComm_t child;
    ncclResult_t st = ncclSuccess;
    nb_split(w, r, 0, &child);
    /* bad: the child straight away */
    w->flag[r] = child == NULL && ncclCommGetAsyncError(child, &st) != ncclSuccess;
    /* good: the parent, then the child */
    w->ok[r] = poll_ready(w->comm[r]) == ncclSuccess && child != NULL && poll_ready(child) == ncclSuccess;
    if (child) ncclCommDestroy(child);
    ncclCommDestroy(w->comm[r]);
}

/* A member that called the split and then aborted its parent (its deadline ran out): the
   others' children fail with ncclRemoteError, as NCCL's bootstrap of the child fails when that
   member's sockets close [src: bootstrap.cc]. Rank 1 aborts at once; rank 0 splits last, so its
   call completes the split. The known-bad expectation (the child usable) must fail. */
static void r_split_member_aborts(world* w, int r) {
    ncclComm_t child;
    ncclResult_t st = ncclSuccess;
    nb_split(w, r, r == 0 ? 0.05 : 0, &child);
    if (r == 1) {
        ncclCommAbort(w->comm[r]);
        return;
    }
    w->ok[r] = poll_ready(w->comm[r]) == ncclSuccess && child != NULL; /* the parent settles, the child is written */
    w->flag[r] = child ? (int)poll_ready(child) : -1;
    w->ok2[r] = child && ncclCommGetAsyncError(child, &st) == ncclSuccess && st == ncclSuccess; /* known-bad: usable */
    if (child) ncclCommAbort(child);
    ncclCommDestroy(w->comm[r]);
}

/* [UG: ncclCommSplit]: colour groups, order by key then parent rank, NOCOLOR -> NULL, a NULL
   config inherits the parent's. */
static void test_split(void) {
    world w;
    int r;
    world_init(&w, 4);
    run_ranks(&w, r_split);
    /* colour 0: parent ranks 0 (key 10) and 2 (key 8) -> child ranks 1 and 0; colour 1: rank 1 */
    CHECK(w.flag[0] == 21 && w.flag[2] == 20 && w.flag[1] == 10 && w.flag[3] == -1, "split layout %d %d %d %d", w.flag[0],
          w.flag[1], w.flag[2], w.flag[3]);
    for (r = 0; r < 4; r++) CHECK(w.rc[r] == ncclSuccess && w.rc2[r] == ncclSuccess, "rank %d: %d %d", r, (int)w.rc[r], (int)w.rc2[r]);
    world_init(&w, 2);
    run_ranks(&w, r_split_nonblocking);
    for (r = 0; r < 2; r++) {
        CHECK(w.rc2[r] == ncclInProgress && w.ok[r], "rank %d: non-blocking split %d, ready %d", r, (int)w.rc2[r], w.ok[r]);
        CHECK(w.flag[r] == ncclInProgress && w.ok2[r], "rank %d: the child is not non-blocking (%d) or its all-reduce hung", r, w.flag[r]);
    }
    world_init(&w, 2);
    run_ranks(&w, r_split_member_aborts);
    CHECK(w.ok[0] && w.flag[0] == ncclRemoteError, "a split whose other member aborted its parent: parent settled %d, "
          "child state %d (want ncclRemoteError)", w.ok[0], w.flag[0]);
    CHECK(!w.ok2[0], "known-bad: the child of a split whose other member aborted was usable");
    for (int n = 1; n <= 2; n++) {
        world_init(&w, n);
        run_ranks(&w, r_split_child_first);
        for (r = 0; r < n; r++) {
            CHECK(w.flag[r], "world %d rank %d: the child was usable before its parent settled", n, r);
            CHECK(w.ok[r], "world %d rank %d: polling the parent, then the child, did not give a child", n, r);
        }
    }
}

/* ---- point-to-point ---------------------------------------------------------------------------- */

/* rank 0 sends a (NF floats from 100) then b (nb floats from 200); rank 1 receives them in its
   own order (swap = the other order) into a and b */
typedef struct order_case {
    int swap, nb;
} order_case;

static void r_order(world* w, int r) {
    const order_case* oc = (const order_case*)w->user;
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r == 0) {
        put_floats(w->a[0], 100, NF);
        put_floats(w->b[0], 200, oc->nb);
        ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        ncclSend(w->b[0], (size_t)oc->nb, ncclFloat, 1, w->comm[0], w->s[0]);
    } else {
        ncclGroupStart();
        if (oc->swap) {
            ncclRecv(w->b[1], (size_t)oc->nb, ncclFloat, 0, w->comm[1], w->s[1]);
            ncclRecv(w->a[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        } else {
            ncclRecv(w->a[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
            ncclRecv(w->b[1], (size_t)oc->nb, ncclFloat, 0, w->comm[1], w->s[1]);
        }
        ncclGroupEnd();
    }
    cudaEventRecord(e, w->s[r]);
    w->ok[r] = wait_event(e, oc->nb == NF ? LONG_S : HANG_S);
    if (r == 1 && w->ok[1]) w->ok2[1] = is_floats(w->a[1], 100, NF) && is_floats(w->b[1], 200, oc->nb);
    rank_finish(w, r, w->ok[r], e);
}

/* [UG: Point-to-point communication]: sends and receives of one pair match in issue order. */
static void test_p2p_order(void) {
    world w;
    order_case oc;
    char why[256];
    world_init(&w, 2);
    oc.swap = 0;
    oc.nb = NF;
    w.user = &oc;
    run_ranks(&w, r_order);
    CHECK(w.ok[0] && w.ok[1] && w.ok2[1], "in-order receives: done %d %d, data %d", w.ok[0], w.ok[1], w.ok2[1]);
    world_free(&w);
    /* known-bad: the receiver posts its receives out of the sender's order -> swapped data */
    world_init(&w, 2);
    oc.swap = 1;
    w.user = &oc;
    run_ranks(&w, r_order);
    CHECK(w.ok[0] && w.ok[1] && !w.ok2[1], "out-of-order receives of equal size must swap the data (done %d %d, data ok %d)",
          w.ok[0], w.ok[1], w.ok2[1]);
    world_free(&w);
    /* known-bad, sizes differ: NCCL does not check, both sides hang */
    world_init(&w, 2);
    oc.nb = NF / 2;
    w.user = &oc;
    run_ranks(&w, r_order);
    fakenccl_problem(why, sizeof why);
    CHECK(!w.ok[0] && !w.ok[1], "mismatched sizes must hang (done %d %d)", w.ok[0], w.ok[1]);
    CHECK(strstr(why, "receives 128") != NULL, "the imitation names the mismatch: '%s'", why);
    world_free(&w);
}

/* each rank sends nf floats to the other and receives nf; grouped or as two separate calls */
typedef struct swap_case {
    int grouped, nf, expect_done;
} swap_case;

static void r_swap(world* w, int r) {
    const swap_case* sc = (const swap_case*)w->user;
    cudaEvent_t e = NULL;
    int peer = 1 - r;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    put_floats(w->a[r], (float)(1000 * r), sc->nf);
    if (sc->grouped) ncclGroupStart();
    ncclSend(w->a[r], (size_t)sc->nf, ncclFloat, peer, w->comm[r], w->s[r]);
    ncclRecv(w->b[r], (size_t)sc->nf, ncclFloat, peer, w->comm[r], w->s[r]);
    if (sc->grouped) ncclGroupEnd();
    cudaEventRecord(e, w->s[r]);
    w->ok[r] = wait_event(e, sc->expect_done ? LONG_S : HANG_S);
    if (w->ok[r]) w->ok2[r] = is_floats(w->b[r], (float)(1000 * peer), sc->nf);
    rank_finish(w, r, w->ok[r], e);
}

static void swap_run(int grouped, int nf, size_t eager, int expect_done, const char* what) {
    world w;
    swap_case sc;
    set_options(eager, 0, 0.004);
    world_init(&w, 2);
    sc.grouped = grouped;
    sc.nf = nf;
    sc.expect_done = expect_done;
    w.user = &sc;
    run_ranks(&w, r_swap);
    if (expect_done) CHECK(w.ok[0] && w.ok[1] && w.ok2[0] && w.ok2[1], "%s: done %d %d data %d %d", what, w.ok[0], w.ok[1], w.ok2[0], w.ok2[1]);
    else CHECK(!w.ok[0] && !w.ok[1], "%s must hang: done %d %d", what, w.ok[0], w.ok[1]);
    world_free(&w);
    set_options(0, 0, 0.004);
}

/* Rendezvous [UG: ncclSend, "blocking for the GPU"; Group Calls]: a send completes only when
   its receive runs. Send-then-receive as separate calls on both ranks deadlocks; in one group it
   completes; eager small messages complete without the peer. */
static void test_rendezvous(void) {
    swap_run(1, NF, 0, 1, "send and receive in one group");
    swap_run(0, NF, 0, 0, "known-bad: send then receive as two kernels on both ranks (rendezvous)");
    swap_run(0, NF, 1024, 1, "send then receive, eager 1024 bytes, 256-byte messages");
    swap_run(0, 4 * NF, 512, 0, "send then receive, eager 512 bytes, 1 KiB messages");
}

/* The deadlock of issue 14 finding 1: each rank keeps its send queued until it has waited for
   its next receive (a host wait with a deadline), so neither send is ever issued. */
static void r_send_at_next_wait(world* w, int r) {
    const int* good = (const int*)w->user;
    cudaEvent_t e = NULL;
    int peer = 1 - r, done;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    put_floats(w->a[r], (float)r, NF);
    if (*good) { /* the send leaves with the next receive, in one group */
        ncclGroupStart();
        ncclSend(w->a[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
        ncclRecv(w->b[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
        ncclGroupEnd();
        cudaEventRecord(e, w->s[r]);
        w->ok[r] = wait_event(e, LONG_S);
    } else {
        ncclRecv(w->b[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
        cudaEventRecord(e, w->s[r]);
        w->ok[r] = wait_event(e, HANG_S); /* the queued send would go after this wait */
        if (w->ok[r]) ncclSend(w->a[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
    }
    done = w->ok[r];
    if (done) w->ok[r] = wait_stream(w->s[r], LONG_S) && is_floats(w->b[r], (float)peer, NF);
    rank_finish(w, r, done, e);
}

static void test_sends_at_next_wait(void) {
    world w;
    int good;
    world_init(&w, 2);
    good = 1;
    w.user = &good;
    run_ranks(&w, r_send_at_next_wait);
    CHECK(w.ok[0] && w.ok[1], "sends issued with the next receives: %d %d", w.ok[0], w.ok[1]);
    world_free(&w);
    world_init(&w, 2);
    good = 0;
    w.user = &good;
    run_ranks(&w, r_send_at_next_wait);
    CHECK(!w.ok[0] && !w.ok[1], "known-bad: sends held until the next receive completed must hang: %d %d", w.ok[0], w.ok[1]);
    world_free(&w);
}

/* ---- groups and streams --------------------------------------------------------------------- */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;

static int k_gate(void* u) {
    (void)u;
    pthread_mutex_lock(&gate_mu);
    while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    return 0;
}

static void set_gate(int open) {
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* rank 1's receive waits behind a closed gate on its stream; rank 0's completion event is
   recorded either after ncclGroupEnd (correct) or inside the group (known-bad) */
static void r_group_defer(world* w, int r) {
    const int* bad = (const int*)w->user;
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r == 0) {
        put_floats(w->a[0], 5, NF);
        ncclGroupStart();
        ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        if (*bad) cudaEventRecord(e, w->s[0]); /* the send is not on the stream yet */
        ncclGroupEnd();
        if (!*bad) cudaEventRecord(e, w->s[0]);
        /* the receive cannot run yet: a completed event would claim a send that did not happen */
        w->ok[0] = !wait_event(e, HANG_S);
        set_gate(1);
        w->ok2[0] = wait_event(e, LONG_S);
    } else {
        fakecuda_launch(w->s[1], k_gate, NULL);
        ncclRecv(w->b[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        w->ok[1] = wait_stream(w->s[1], LONG_S) && is_floats(w->b[1], 5, NF);
    }
    cudaEventDestroy(e);
    ncclCommDestroy(w->comm[r]);
}

/* [UG: Group Calls]: calls inside a group are issued at the outermost ncclGroupEnd. */
static void test_group_defers(void) {
    world w;
    int bad = 0;
    fakenccl_stats st0, st1;
    ncclComm_t c;
    set_gate(0);
    world_init(&w, 2);
    w.user = &bad;
    run_ranks(&w, r_group_defer);
    CHECK(w.ok[0] && w.ok2[0] && w.ok[1], "event after ncclGroupEnd: pending %d, done %d, data %d", w.ok[0], w.ok2[0], w.ok[1]);
    world_free(&w);
    set_gate(0);
    bad = 1;
    world_init(&w, 2);
    w.user = &bad;
    run_ranks(&w, r_group_defer);
    CHECK(!w.ok[0], "known-bad: an event recorded inside the group must complete before the send ran");
    CHECK(w.ok[1], "the data still arrives");
    world_free(&w);
    /* nesting: only the outermost end issues */
    {
        float* x = dev_floats(NF);
        cudaStream_t s = NULL;
        ncclUniqueId id;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        ncclGetUniqueId(&id);
        ncclCommInitRank(&c, 1, id, 0);
        fakenccl_stats_get(&st0);
        ncclGroupStart();
        ncclGroupStart();
        ncclAllReduce(x, x, NF, ncclFloat, ncclSum, c, s);
        ncclGroupEnd();
        fakenccl_stats_get(&st1);
        CHECK(st1.kernels == st0.kernels, "an inner ncclGroupEnd issued a kernel");
        ncclGroupEnd();
        fakenccl_stats_get(&st1);
        CHECK(st1.kernels == st0.kernels + 1, "the outer ncclGroupEnd issued %llu kernels", (unsigned long long)(st1.kernels - st0.kernels));
        CHECK(wait_stream(s, LONG_S), "one-rank all-reduce");
        CHECK(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without a group accepted");
        ncclCommDestroy(c);
        cudaStreamDestroy(s);
        cudaFree(x);
    }
}

/* A group on two streams is one kernel: it starts once both streams reached it. Rank 0's
   group {send on s, receive on s2} with s2 gated: rank 1's receive must not complete. */
static void r_two_streams(world* w, int r) {
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    put_floats(w->a[r], (float)(10 * r), NF);
    if (r == 0) {
        fakecuda_launch(w->s2[0], k_gate, NULL);
        ncclGroupStart();
        ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        ncclRecv(w->b[0], NF, ncclFloat, 1, w->comm[0], w->s2[0]);
        ncclGroupEnd();
        cudaEventRecord(e, w->s[0]);
        w->ok[0] = wait_event(e, LONG_S); /* s waits for the whole group */
        w->ok2[0] = wait_stream(w->s2[0], LONG_S) && is_floats(w->b[0], 10, NF);
    } else {
        ncclRecv(w->b[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        cudaEventRecord(e, w->s[1]);
        w->ok2[1] = !wait_event(e, HANG_S); /* the send has not started: s2 of rank 0 is gated */
        set_gate(1);
        w->ok[1] = wait_event(e, LONG_S) && is_floats(w->b[1], 0, NF);
        ncclSend(w->a[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        wait_stream(w->s[1], LONG_S);
    }
    cudaEventDestroy(e);
    ncclCommDestroy(w->comm[r]);
}

/* [UG: Mixing Multiple Streams within the same ncclGroupStart/End() group] */
static void test_group_streams(void) {
    world w;
    set_gate(0);
    world_init(&w, 2);
    run_ranks(&w, r_two_streams);
    CHECK(w.ok2[1], "a group started before all its streams reached it");
    CHECK(w.ok[0] && w.ok2[0] && w.ok[1], "two-stream group: %d %d %d", w.ok[0], w.ok2[0], w.ok[1]);
    world_free(&w);
}

/* A communicator's kernels run in issue order whatever their streams. Rank 0 issues a receive
   on s, then a send on s2; rank 1 receives first, then sends: the known-bad client expects s2's
   send to run while s's receive waits. */
static void r_comm_order(world* w, int r) {
    const int* good = (const int*)w->user;
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    put_floats(w->a[r], (float)(7 * r), NF);
    if (r == 0) {
        if (*good) ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s2[0]);
        ncclRecv(w->b[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        if (!*good) ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s2[0]);
        cudaEventRecord(e, w->s2[0]);
    } else {
        ncclRecv(w->b[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        ncclSend(w->a[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        cudaEventRecord(e, w->s[1]);
    }
    w->ok[r] = wait_event(e, *good ? LONG_S : HANG_S);
    rank_finish(w, r, w->ok[r], e);
}

static void test_comm_order(void) {
    world w;
    int good = 1;
    world_init(&w, 2);
    w.user = &good;
    run_ranks(&w, r_comm_order);
    CHECK(w.ok[0] && w.ok[1], "matching issue order: %d %d", w.ok[0], w.ok[1]);
    world_free(&w);
    good = 0;
    world_init(&w, 2);
    w.user = &good;
    run_ranks(&w, r_comm_order);
    CHECK(!w.ok[0] && !w.ok[1], "known-bad: a later kernel of the communicator on another stream overtook an earlier one");
    world_free(&w);
}

/* Stream semantics [UG: CUDA Stream Semantics]: the send waits for work enqueued before it on
   its stream (a slow writer); the consumer waits for the receive through an event. */
typedef struct fill_k {
    float* p;
    float v0;
    double delay;
} fill_k;
static int k_fill(void* u) {
    fill_k* k = (fill_k*)u;
    float* q = (float*)fakecuda_dev_ptr(k->p, sizeof(float) * NF);
    int i;
    sleep_s(k->delay);
    for (i = 0; q && i < NF; i++) q[i] = k->v0 + (float)i;
    free(k);
    return q ? 0 : (int)cudaErrorIllegalAddress;
}
typedef struct copy_k {
    float *dst, *src;
} copy_k;
static int k_copy(void* u) {
    copy_k* k = (copy_k*)u;
    float* d = (float*)fakecuda_dev_ptr(k->dst, sizeof(float) * NF);
    const float* s = (const float*)fakecuda_dev_ptr(k->src, sizeof(float) * NF);
    if (d && s) memcpy(d, s, sizeof(float) * NF);
    free(k);
    return d && s ? 0 : (int)cudaErrorIllegalAddress;
}

static void r_streams(world* w, int r) {
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r == 0) {
        fill_k* k = (fill_k*)malloc(sizeof *k);
        put_floats(w->a[0], 0, NF);
        k->p = w->a[0];
        k->v0 = 77;
        k->delay = 0.05;
        fakecuda_launch(w->s[0], k_fill, k);
        ncclSend(w->a[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        w->ok[0] = wait_stream(w->s[0], LONG_S);
    } else {
        copy_k* k = (copy_k*)malloc(sizeof *k);
        ncclRecv(w->b[1], NF, ncclFloat, 0, w->comm[1], w->s[1]); /* s: communication */
        cudaEventRecord(e, w->s[1]);
        cudaStreamWaitEvent(w->s2[1], e, 0); /* s2: compute, consumes the receive */
        k->dst = w->c[1];
        k->src = w->b[1];
        fakecuda_launch(w->s2[1], k_copy, k);
        w->ok[1] = wait_stream(w->s2[1], LONG_S) && is_floats(w->c[1], 77, NF);
    }
    cudaEventDestroy(e);
    ncclCommDestroy(w->comm[r]);
}

static void test_stream_semantics(void) {
    world w;
    world_init(&w, 2);
    run_ranks(&w, r_streams);
    CHECK(w.ok[0] && w.ok[1], "stream order before the send, event order after the receive: %d %d", w.ok[0], w.ok[1]);
    world_free(&w);
}

/* [UG: Nonblocking Group Operation]: ncclGroupEnd returns ncclInProgress; the kernels reach
   the stream only when the state turns ncclSuccess. The known-bad client records its event at
   once and reads its receive buffer after that event. */
static void r_nonblocking_group(world* w, int r) {
    const int* bad = (const int*)w->user;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cudaEvent_t e = NULL;
    int peer = 1 - r;
    cfg.blocking = 0;
    w->rc[r] = ncclCommInitRankConfig(&w->comm[r], w->n, w->id, r, &cfg);
    poll_ready(w->comm[r]);
    cudaStreamCreateWithFlags(&w->s[r], cudaStreamNonBlocking);
    w->a[r] = dev_floats(NF);
    w->b[r] = dev_floats(NF);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    put_floats(w->a[r], (float)(50 * r), NF);
    put_floats(w->b[r], -1, NF);
    ncclGroupStart();
    ncclSend(w->a[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
    ncclRecv(w->b[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
    w->rc2[r] = ncclGroupEnd();
    if (*bad) {
        /* known-bad: also uses the communicator again before it is ready */
        w->flag[r] = ncclSend(w->a[r], NF, ncclFloat, peer, w->comm[r], w->s[r]);
        cudaEventRecord(e, w->s[r]);
        w->ok[r] = wait_event(e, LONG_S) && is_floats(w->b[r], (float)(50 * peer), NF);
        poll_ready(w->comm[r]);
    } else {
        poll_ready(w->comm[r]);
        cudaEventRecord(e, w->s[r]);
        w->ok[r] = wait_event(e, LONG_S) && is_floats(w->b[r], (float)(50 * peer), NF);
    }
    wait_stream(w->s[r], LONG_S);
    cudaEventDestroy(e);
    ncclCommDestroy(w->comm[r]);
}

static void test_nonblocking_group(void) {
    world w;
    int bad = 0, r;
    set_options(0, 0, 0.2);
    world_init(&w, 2);
    w.user = &bad;
    run_ranks(&w, r_nonblocking_group);
    for (r = 0; r < 2; r++)
        CHECK(w.rc2[r] == ncclInProgress && w.ok[r], "rank %d: ncclGroupEnd %d, data after polling %d", r, (int)w.rc2[r], w.ok[r]);
    world_free(&w);
    bad = 1;
    world_init(&w, 2);
    w.user = &bad;
    run_ranks(&w, r_nonblocking_group);
    for (r = 0; r < 2; r++) {
        CHECK(!w.ok[r], "known-bad rank %d: an event recorded before the group was launched covered the receive", r);
        CHECK(w.flag[r] == ncclInvalidArgument, "known-bad rank %d: using the communicator while ncclInProgress gave %d", r, w.flag[r]);
    }
    world_free(&w);
    set_options(0, 0, 0.004);
}

/* ---- collectives ------------------------------------------------------------------------------- */

static void r_allreduce(world* w, int r) {
    float hf[NF], of[NF];
    double hd[NF], od[NF];
    void *dd = NULL, *de = NULL;
    int i, k;
    rank_setup(w, r);
    cudaMalloc(&dd, sizeof hd);
    cudaMalloc(&de, sizeof hd);
    for (i = 0; i < NF; i++) {
        hf[i] = 0.1f * (float)(r + 1) + (float)i;
        hd[i] = 0.01 * (double)(r + 1) * (double)i;
    }
    cudaMemcpy(w->a[r], hf, sizeof hf, cudaMemcpyHostToDevice);
    cudaMemcpy(dd, hd, sizeof hd, cudaMemcpyHostToDevice);
    cudaStreamSynchronize(0);
    ncclGroupStart();
    ncclAllReduce(w->a[r], w->b[r], NF, ncclFloat, ncclSum, w->comm[r], w->s[r]); /* out of place */
    ncclAllReduce(dd, dd, NF, ncclDouble, ncclSum, w->comm[r], w->s[r]);          /* in place */
    ncclGroupEnd();
    ncclAllReduce(w->a[r], de, NF / 2, ncclDouble, ncclMax, w->comm[r], w->s[r]);
    w->ok[r] = wait_stream(w->s[r], LONG_S);
    cudaMemcpy(of, w->b[r], sizeof of, cudaMemcpyDeviceToHost);
    cudaMemcpy(od, dd, sizeof od, cudaMemcpyDeviceToHost);
    for (i = 0; i < NF; i++) {
        float sf = 0;
        double sd = 0;
        for (k = 0; k < w->n; k++) {
            sf += 0.1f * (float)(k + 1) + (float)i;
            sd += 0.01 * (double)(k + 1) * (double)i;
        }
        if (of[i] != sf || od[i] != sd) w->ok[r] = 0;
    }
    ncclCommDestroy(w->comm[r]);
    cudaFree(dd);
    cudaFree(de);
}

static void test_allreduce(void) {
    world w;
    int r;
    world_init(&w, 4);
    run_ranks(&w, r_allreduce);
    for (r = 0; r < 4; r++) CHECK(w.ok[r], "rank %d: all-reduce sums differ from the rank-order sum", r);
    world_free(&w);
}

/* ---- abort ---------------------------------------------------------------------------------------- */

/* Rank 0: a receive from rank 2 (who never sends), then a receive from rank 1. Rank 1 sends to
   rank 0. Rank 0 aborts: its stream drains; rank 1's send stays pending until rank 1 aborts. */
static void r_abort(world* w, int r) {
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r == 0) {
        ncclRecv(w->b[0], NF, ncclFloat, 2, w->comm[0], w->s[0]);
        ncclRecv(w->c[0], NF, ncclFloat, 1, w->comm[0], w->s[0]);
        cudaEventRecord(e, w->s[0]);
        w->ok[0] = !wait_event(e, HANG_S); /* stuck is never complete */
        ncclCommAbort(w->comm[0]);
        w->ok2[0] = wait_event(e, LONG_S); /* abort releases the stream */
        w->flag[0] = 1;
    } else if (r == 1) {
        ncclSend(w->a[1], NF, ncclFloat, 0, w->comm[1], w->s[1]);
        cudaEventRecord(e, w->s[1]);
        w->ok[1] = !wait_event(e, 2 * HANG_S);
        w->ok[1] = w->ok[1] && !wait_event(e, HANG_S); /* after rank 0's abort: still pending */
        ncclCommAbort(w->comm[1]);
        w->ok2[1] = wait_event(e, LONG_S);
    } else {
        w->ok[2] = w->ok2[2] = 1;
        sleep_s(HANG_S);
        ncclCommAbort(w->comm[2]);
    }
    cudaEventDestroy(e);
}

static void test_abort(void) {
    world w;
    int r;
    world_init(&w, 3);
    run_ranks(&w, r_abort);
    for (r = 0; r < 3; r++) CHECK(w.ok[r] && w.ok2[r], "abort, rank %d: pending %d, released %d", r, w.ok[r], w.ok2[r]);
    world_free(&w);
}

/* ---- several communicators ---------------------------------------------------------------------- */

/* [UG: Using multiple NCCL communicators concurrently]: two communicators used in opposite
   orders on two ranks, each on its own stream, work only while the GPU runs both kernels at
   once; the correct client orders them the same way on every rank, through one stream. */
static void r_two_comms(world* w, int r) {
    const int* opposite = (const int*)w->user;
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    w->rc2[r] = ncclCommInitRank(&w->comm2[r], w->n, w->id2, r);
    if (w->rc2[r] == ncclSuccess) w->rc2[r] = connect_all(w->comm2[r], w->n, r);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (!*opposite) {
        ncclAllReduce(w->a[r], w->a[r], NF, ncclFloat, ncclSum, w->comm[r], w->s[r]);
        ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s[r]);
    } else if (r == 0) { /* the second is issued once the first kernel runs */
        ncclAllReduce(w->a[r], w->a[r], NF, ncclFloat, ncclSum, w->comm[r], w->s[r]);
        sleep_s(0.05);
        ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s2[r]);
    } else {
        ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s2[r]);
        sleep_s(0.05);
        ncclAllReduce(w->a[r], w->a[r], NF, ncclFloat, ncclSum, w->comm[r], w->s[r]);
    }
    cudaEventRecord(e, w->s[r]);
    w->ok[r] = wait_event(e, HANG_S * 3) && wait_stream(w->s2[r], HANG_S);
    rank_finish(w, r, w->ok[r], NULL);
    cudaEventDestroy(e);
}

/* Two ranks run fn (r_two_comms, r_p2p_coll) with opposite (w.user) and serialized kernels or
   not; expect: whether both complete. fn that checks its result sets ok2 (sums). */
static void two_comms_run(void (*fn)(world*, int), int opposite, int serialize, int expect, int sums, const char* what) {
    world w;
    set_options(0, serialize, 0.004);
    world_init(&w, 2);
    w.user = &opposite;
    run_ranks(&w, fn);
    CHECK((w.ok[0] && w.ok[1]) == expect, "%s: %d %d", what, w.ok[0], w.ok[1]);
    if (expect && sums) CHECK(w.ok2[0] && w.ok2[1], "%s: the all-reduce's sum", what);
    world_free(&w);
    set_options(0, 0, 0.004);
}
static void two_comms(int opposite, int serialize, int expect, const char* what) {
    two_comms_run(r_two_comms, opposite, serialize, expect, 0, what);
}

/* pipeline_nccl.h's overlapped data-parallel reduction: a point-to-point exchange on one
   communicator (the pipeline's) on one stream, and an all-reduce on another (the data-parallel
   one) on a second stream, started while the exchange runs. Kernels of different communicators
   are not ordered against each other [src: enqueue.cc, ncclLaunchPrepare: a launch waits only for
   its own communicator's sharedRes->deviceStream, and for the device's context->launchOrder only
   under NCCL_LAUNCH_ORDER_IMPLICIT=1]: with kernels running concurrently any order works. With
   one kernel per device at a time (a full GPU, or that implicit order) every rank must issue the
   two in one order (the overlap's hooks come at the same point of the same list on every
   replica); the known-bad client issues them in opposite orders and deadlocks. */
static void r_p2p_coll(world* w, int r) {
    const int* opposite = (const int*)w->user;
    int first_coll = *opposite && r == 1;
    rank_setup(w, r);
    w->rc2[r] = ncclCommInitRank(&w->comm2[r], w->n, w->id2, r);
    put_floats(w->b[r], (float)(r + 1), NF);
    if (first_coll) {
        ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s2[r]);
        sleep_s(0.05);
    }
    if (r == 0) ncclSend(w->a[r], NF, ncclFloat, 1, w->comm[r], w->s[r]);
    else ncclRecv(w->a[r], NF, ncclFloat, 0, w->comm[r], w->s[r]);
    if (!first_coll) {
        sleep_s(0.05); /* the exchange's kernel is running (or waiting for its peer) */
        ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s2[r]);
    }
    w->ok[r] = wait_stream(w->s[r], HANG_S * 3) && wait_stream(w->s2[r], HANG_S);
    if (w->ok[r]) {
        float h[NF];
        cudaMemcpy(h, w->b[r], sizeof h, cudaMemcpyDeviceToHost);
        w->ok2[r] = h[0] == 3.0f && h[NF - 1] == 3.0f + 2.0f * (NF - 1); /* (1 + i) + (2 + i) */
    }
    rank_finish(w, r, w->ok[r], NULL);
}

static void p2p_coll(int opposite, int serialize, int expect, const char* what) {
    two_comms_run(r_p2p_coll, opposite, serialize, expect, 1, what);
}

static void test_two_comms(void) {
    p2p_coll(0, 0, 1, "an all-reduce on a second communicator and stream during a point-to-point exchange");
    p2p_coll(0, 1, 1, "the same, one order on both ranks, one kernel per device");
    p2p_coll(1, 1, 0, "known-bad: all-reduce and exchange in opposite orders must deadlock with one kernel per device");

    two_comms(0, 1, 1, "same order on both ranks through one stream, one kernel per device");
    two_comms(1, 0, 1, "opposite orders, kernels concurrent");
    two_comms(1, 1, 0, "known-bad: opposite orders must deadlock with one kernel per device");
}

/* serialize_kernels = 2: a device runs NCCL kernels one at a time in launch order, whatever
   their communicator (one hardware queue). Rank 0 launches a send on communicator A, then a
   receive on B; rank 1 the receive on A, then the send on B: the same order on both, so it runs.
   The known-bad client (rank 1 launches its send on B first) deadlocks, deterministically, with
   no sleep to arrange it; with kernels concurrent it runs. */
static void r_launch_order(world* w, int r) {
    const int* opposite = (const int*)w->user;
    rank_setup(w, r);
    w->rc2[r] = ncclCommInitRank(&w->comm2[r], w->n, w->id2, r);
    if (w->rc2[r] == ncclSuccess) w->rc2[r] = connect_all(w->comm2[r], w->n, r);
    if (r == 0) {
        ncclSend(w->a[r], NF, ncclFloat, 1, w->comm[r], w->s[r]);
        ncclRecv(w->b[r], NF, ncclFloat, 1, w->comm2[r], w->s2[r]);
    } else if (!*opposite) {
        ncclRecv(w->a[r], NF, ncclFloat, 0, w->comm[r], w->s[r]);
        ncclSend(w->b[r], NF, ncclFloat, 0, w->comm2[r], w->s2[r]);
    } else {
        ncclSend(w->b[r], NF, ncclFloat, 0, w->comm2[r], w->s2[r]);
        ncclRecv(w->a[r], NF, ncclFloat, 0, w->comm[r], w->s[r]);
    }
    w->ok[r] = wait_stream(w->s[r], HANG_S * 3) && wait_stream(w->s2[r], HANG_S);
    rank_finish(w, r, w->ok[r], NULL);
}

/* NCCL's deviceStream waits for every kernel of its communicator: work a client puts on it (or
   on a stream sharing its hardware queue) waits for the kernel. Rank 0 sends (no receive posted
   yet): an event recorded on its communicator's deviceStream stays incomplete until rank 1
   receives. Without the streams (no_internal_streams, not NCCL's way) there is nothing to wait
   on: the known-bad imitation misses the rule. */
static int g_is_go; /* rank 0 sent: rank 1 may post its receive (atomics: read and written by both ranks' threads) */
static void r_internal_streams(world* w, int r) {
    cudaStream_t ds = NULL, hs = NULL;
    cudaEvent_t e = NULL;
    rank_setup(w, r);
    if (r == 0) {
        ncclSend(w->a[r], NF, ncclFloat, 1, w->comm[r], w->s[r]);
        fakenccl_comm_streams(w->comm[r], &ds, &hs);
        w->ok2[r] = ds != NULL && hs != NULL;
        if (ds) {
            cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
            cudaEventRecord(e, ds);
            sleep_s(0.1);
            w->ok2[r] = w->ok2[r] && cudaEventQuery(e) == cudaErrorNotReady; /* behind the kernel's end */
        }
        __atomic_store_n(&g_is_go, 1, __ATOMIC_SEQ_CST);
        w->ok[r] = wait_stream(w->s[r], LONG_S) && (!e || wait_event(e, LONG_S));
    } else {
        while (!__atomic_load_n(&g_is_go, __ATOMIC_SEQ_CST)) sleep_s(0.005);
        ncclRecv(w->a[r], NF, ncclFloat, 0, w->comm[r], w->s[r]);
        w->ok[r] = wait_stream(w->s[r], LONG_S);
        w->ok2[r] = 1;
    }
    rank_finish(w, r, w->ok[r], e);
}

static void test_launch_order(void) {
    world w;
    int opposite, serialize;
    for (serialize = 0; serialize <= 2; serialize += 2)
        for (opposite = 0; opposite <= 1; opposite++) {
            int expect = !(serialize && opposite);
            set_options(0, serialize, 0.004);
            world_init(&w, 2);
            w.user = &opposite;
            run_ranks(&w, r_launch_order);
            CHECK((w.ok[0] && w.ok[1]) == expect, "launch order: %s orders, %s: %d %d (want %s)", opposite ? "opposite" : "one",
                  serialize ? "one kernel at a time in launch order" : "kernels concurrent", w.ok[0], w.ok[1],
                  expect ? "both done" : "a deadlock");
            world_free(&w);
        }
    set_options(0, 0, 0.004);
    {
        fakenccl_options o;
        int bad;
        for (bad = 0; bad <= 1; bad++) {
            memset(&o, 0, sizeof o);
            o.launch_delay_s = 0.004;
            o.no_internal_streams = bad;
            fakenccl_set_options(&o);
            world_init(&w, 2);
            g_is_go = 0;
            run_ranks(&w, r_internal_streams);
            CHECK(w.ok[0] && w.ok[1], "internal streams%s: the exchange completes", bad ? " (none)" : "");
            CHECK(w.ok2[0] == !bad, "internal streams%s: an event on deviceStream %s until the kernel ends", bad ? " (none)" : "",
                  bad ? "cannot wait (known-bad: no deviceStream)" : "must wait");
            world_free(&w);
        }
        set_options(0, 0, 0.004);
    }
}

/* ---- lazy connection set-up [src: enqueue.cc p2pTaskAppend, group.cc groupLaunch,
   transport.cc ncclTransportP2pSetup] ------------------------------------------------------------ */

enum { LZ_CONNECTED, LZ_TWO_COMMS, LZ_TWO_COMMS_NB, LZ_RING3, LZ_HALVES };
typedef struct lazy_case {
    int mode;
    double t_end[8];            /* how long each rank's host stayed in its first group end */
} lazy_case;

/* Two communicators (channels) of the same ranks, streams, buffers; nothing connected unless
   the case says so. */
static void lazy_setup(world* w, int r, int blocking, int connect) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    w->rc[r] = ncclCommInitRankConfig(&w->comm[r], w->n, w->id, r, &cfg);
    w->rc2[r] = ncclCommInitRankConfig(&w->comm2[r], w->n, w->id2, r, &cfg);
    poll_ready(w->comm[r]);
    poll_ready(w->comm2[r]);
    if (connect) {
        connect_all(w->comm[r], w->n, r);
        connect_all(w->comm2[r], w->n, r);
    }
    cudaStreamCreateWithFlags(&w->s[r], cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&w->s2[r], cudaStreamNonBlocking);
    w->a[r] = dev_floats(4 * NF);
    w->b[r] = dev_floats(4 * NF);
    w->c[r] = dev_floats(4 * NF);
    put_floats(w->a[r], (float)(100 * r), NF);
}

static void r_lazy(world* w, int r) {
    lazy_case* lc = (lazy_case*)w->user;
    int n = w->n, blocking = lc->mode != LZ_TWO_COMMS_NB;
    ncclResult_t e1, e2 = ncclSuccess;
    double t0;
    lazy_setup(w, r, blocking, lc->mode == LZ_CONNECTED);
    t0 = now_s();
    if (lc->mode == LZ_RING3) {
        /* one communicator, three ranks: each first receives from its right, then sends left */
        e1 = ncclRecv(w->b[r], NF, ncclFloat, (r + 1) % n, w->comm[r], w->s[r]);
        lc->t_end[r] = now_s() - t0;
        if (e1 == ncclSuccess) e2 = ncclSend(w->a[r], NF, ncclFloat, (r + n - 1) % n, w->comm[r], w->s[r]);
    } else if (lc->mode == LZ_HALVES) {
        /* two ranks whose first exchange is a send each, the receives after */
        e1 = ncclSend(w->a[r], NF, ncclFloat, 1 - r, w->comm[r], w->s[r]);
        lc->t_end[r] = now_s() - t0;
        if (e1 == ncclSuccess) e2 = ncclRecv(w->b[r], NF, ncclFloat, 1 - r, w->comm[r], w->s[r]);
    } else {
        /* the agreement's shape: rank 0 first receives on channel 1 (comm2), then sends on channel 0;
           rank 1 first receives on channel 0, then sends on channel 1 */
        if (r == 0) e1 = ncclRecv(w->b[r], NF, ncclFloat, 1, w->comm2[r], w->s[r]);
        else e1 = ncclRecv(w->b[r], NF, ncclFloat, 0, w->comm[r], w->s[r]);
        if (e1 == ncclInProgress) { /* non-blocking: the state says when the set-up is done */
            e1 = poll_ready(r == 0 ? w->comm2[r] : w->comm[r]) == ncclSuccess ? ncclSuccess : ncclInProgress;
            if (now_s() - t0 < HANG_S) e1 = ncclSuccess; /* it finished early */
        }
        lc->t_end[r] = now_s() - t0;
        if (e1 == ncclSuccess) {
            if (r == 0) e2 = ncclSend(w->a[r], NF, ncclFloat, 1, w->comm[r], w->s2[r]);
            else e2 = ncclSend(w->a[r], NF, ncclFloat, 0, w->comm2[r], w->s2[r]);
            if (e2 == ncclInProgress) e2 = poll_ready(r == 0 ? w->comm[r] : w->comm2[r]);
        }
    }
    w->rc[r] = e1;
    w->rc2[r] = e2;
    w->ok[r] = e1 == ncclSuccess && e2 == ncclSuccess && wait_stream(w->s[r], LONG_S) && wait_stream(w->s2[r], LONG_S) &&
               is_floats(w->b[r], (float)(100 * (lc->mode == LZ_RING3 ? (r + 1) % n : 1 - r)), NF);
    snprintf(w->msg[r], sizeof w->msg[r], "%s", ncclGetLastError(w->comm[r]));
    rank_finish(w, r, w->ok[r], NULL);
}

static int g_lz_ok[8];
static ncclResult_t g_lz_rc[8];
static void lazy_run(int mode, int n, lazy_case* lc) {
    world w;
    memset(lc, 0, sizeof *lc);
    lc->mode = mode;
    world_init(&w, n);
    w.user = lc;
    run_ranks(&w, r_lazy);
    memcpy(g_lz_ok, w.ok, sizeof w.ok);
    memcpy(g_lz_rc, w.rc, sizeof w.rc);
    world_free(&w);
}

/* NCCL sets a pair up on its first exchange, with the host held in the outermost group end until
   the peer's host sets up the mirror connection. Correct: every pair set up first, in the same
   place on every rank (what pipeline_nccl.h does at create), then the cross pattern runs.
   Known-bad (pipeline_nccl.h's agreement before the fix, reduced): two ranks whose first
   exchanges are on two channels in opposite orders; blocking, each host waits in ncclGroupEnd
   for the other (here until the imitation's connect timeout, 0.5 s: the call fails and
   fakenccl_problem names it); non-blocking, the state stays ncclInProgress. Known-bad on one
   communicator: three ranks that each first receive, then send (a cycle through the set-up);
   two ranks whose first exchanges are both sends: the halves exchanged do not mirror. */
static void test_lazy_connect(void) {
    lazy_case lc;
    fakenccl_stats st0, st1;
    fakenccl_options o = fakenccl_get_options();
    char why[256];
    o.connect_timeout_s = 0.5;
    fakenccl_set_options(&o);
    fakenccl_problem(why, sizeof why); /* clear */
    fakenccl_stats_get(&st0);
    lazy_run(LZ_CONNECTED, 2, &lc);
    fakenccl_stats_get(&st1);
    CHECK(g_lz_ok[0] && g_lz_ok[1], "set up first: the cross pattern must run: %d %d", g_lz_ok[0], g_lz_ok[1]);
    CHECK(st1.connects - st0.connects == 8, "eight set-ups (point-to-point and collective, two communicators, two ranks), then none: %llu",
          (unsigned long long)(st1.connects - st0.connects));
    lazy_run(LZ_TWO_COMMS, 2, &lc);
    fakenccl_problem(why, sizeof why);
    CHECK(!g_lz_ok[0] && !g_lz_ok[1] && g_lz_rc[0] == ncclSystemError && g_lz_rc[1] == ncclSystemError &&
              lc.t_end[0] >= 0.5 && lc.t_end[1] >= 0.5 && strstr(why, "lazy-connection"),
          "known-bad: first exchanges on two channels in opposite orders must hold both hosts: %d %d %s", g_lz_rc[0], g_lz_rc[1], why);
    lazy_run(LZ_TWO_COMMS_NB, 2, &lc);
    CHECK(!g_lz_ok[0] && !g_lz_ok[1] && lc.t_end[0] >= HANG_S && lc.t_end[1] >= HANG_S,
          "known-bad, non-blocking: the state must stay ncclInProgress: %d %d %.2f %.2f", g_lz_ok[0], g_lz_ok[1], lc.t_end[0],
          lc.t_end[1]);
    lazy_run(LZ_RING3, 3, &lc);
    fakenccl_problem(why, sizeof why);
    CHECK(!g_lz_ok[0] && !g_lz_ok[1] && !g_lz_ok[2] && strstr(why, "lazy-connection"),
          "known-bad: three ranks that first receive from the right must wait in a cycle: %s", why);
    lazy_run(LZ_HALVES, 2, &lc);
    fakenccl_problem(why, sizeof why);
    CHECK(!g_lz_ok[0] && !g_lz_ok[1] && g_lz_rc[0] == ncclInternalError && strstr(why, "do not match"),
          "known-bad: two first sends exchange halves that do not mirror: %d %s", g_lz_rc[0], why);
    o.connect_timeout_s = 0;
    fakenccl_set_options(&o);
}

/* A communicator's first collective sets up its connections inside the outermost group end,
   the host held until every member gets there [src: group.cc ncclPrepareTasksAndCollPreconnectFunc
   -> ncclCollPreconnect; init.cc runtimeConn, NCCL_RUNTIME_CONNECT default 1]. Two ranks, two
   communicators (two transports: pipeline_nccl.h's pipeline and data-parallel), a "step" that
   all-reduces on both. Correct (what pipeline_nccl.h's create does, _ppn_warm): one all-reduce
   per communicator first, in one order on every rank; the step then sets up nothing, even with
   its all-reduces in opposite orders on the two ranks, and fakenccl_thread_connections counts one
   ring per communicator (FAKENCCL_CONN_BYTES each, received on). Known-bad: a client that warms
   nothing sets up inside its step (the set-up count says so), and with the step's first
   collectives in opposite orders the two hosts wait for each other (here until the connect
   timeout, 0.5 s; NCCL waits forever). */
enum { CW_WARM, CW_COLD, CW_OPPOSITE };
typedef struct coll_case {
    int mode;
    uint64_t step_setups[8];    /* fakenccl_thread_connects across the step */
    fakenccl_conn_stats cs[8];  /* what the rank set up before the step */
    double t_end[8];            /* how long its host stayed in the step's first group end */
} coll_case;
static void r_coll_warm(world* w, int r) {
    coll_case* cc = (coll_case*)w->user;
    ncclResult_t e1 = ncclSuccess, e2 = ncclSuccess;
    uint64_t s0;
    double t0;
    lazy_setup(w, r, 1, 0);
    if (cc->mode == CW_WARM) {
        e1 = ncclAllReduce(w->c[r], w->c[r], 1, ncclFloat, ncclSum, w->comm[r], w->s[r]);
        if (e1 == ncclSuccess) e1 = ncclAllReduce(w->c[r], w->c[r], 1, ncclFloat, ncclSum, w->comm2[r], w->s[r]);
        if (e1 == ncclSuccess && !wait_stream(w->s[r], LONG_S)) e1 = ncclSystemError;
    }
    fakenccl_thread_connections(&cc->cs[r]);
    s0 = fakenccl_thread_connects();
    t0 = now_s();
    if (e1 == ncclSuccess) {
        /* the step: the cold client in one order on both ranks; the others rank 0 on comm first,
           rank 1 on comm2 first */
        ncclComm_t first = (cc->mode == CW_COLD || r == 0) ? w->comm[r] : w->comm2[r];
        ncclComm_t second = first == w->comm[r] ? w->comm2[r] : w->comm[r];
        e1 = ncclAllReduce(w->a[r], w->a[r], NF, ncclFloat, ncclSum, first, w->s[r]);
        cc->t_end[r] = now_s() - t0;
        if (e1 == ncclSuccess) e2 = ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, second, w->s2[r]);
    }
    cc->step_setups[r] = fakenccl_thread_connects() - s0;
    w->rc[r] = e1;
    w->rc2[r] = e2;
    w->ok[r] = e1 == ncclSuccess && e2 == ncclSuccess && wait_stream(w->s[r], LONG_S) && wait_stream(w->s2[r], LONG_S);
    rank_finish(w, r, w->ok[r], NULL);
}
static void coll_warm_run(int mode, coll_case* cc, world* w) {
    memset(cc, 0, sizeof *cc);
    cc->mode = mode;
    world_init(w, 2);
    w->user = cc;
    run_ranks(w, r_coll_warm);
    world_free(w);
}
static void test_coll_warmup(void) {
    coll_case cc;
    world w;
    char why[256];
    int r;
    fakenccl_options o = fakenccl_get_options();
    o.connect_timeout_s = 0.5;
    fakenccl_set_options(&o);
    fakenccl_problem(why, sizeof why); /* clear */
    coll_warm_run(CW_WARM, &cc, &w);
    for (r = 0; r < 2; r++)
        CHECK(w.ok[r] && cc.step_setups[r] == 0 && cc.cs[r].colls == 2 && cc.cs[r].p2p_send + cc.cs[r].p2p_recv == 0 &&
                  cc.cs[r].bytes == 2 * FAKENCCL_CONN_BYTES,
              "warmed: rank %d: %s, %llu set-ups in the step, %llu collective set-ups before (%llu bytes): want 0 and 2",
              r, w.ok[r] ? "ran" : "failed", (unsigned long long)cc.step_setups[r], (unsigned long long)cc.cs[r].colls,
              (unsigned long long)cc.cs[r].bytes);
    coll_warm_run(CW_COLD, &cc, &w);
    for (r = 0; r < 2; r++)
        CHECK(w.ok[r] && cc.step_setups[r] == 2 && cc.cs[r].colls == 0,
              "known-bad, nothing warmed: rank %d must set up both communicators inside its step: %s, %llu set-ups", r,
              w.ok[r] ? "ran" : "failed", (unsigned long long)cc.step_setups[r]);
    coll_warm_run(CW_OPPOSITE, &cc, &w);
    fakenccl_problem(why, sizeof why);
    CHECK(!w.ok[0] && !w.ok[1] && w.rc[0] == ncclSystemError && w.rc[1] == ncclSystemError && cc.t_end[0] >= 0.5 &&
              cc.t_end[1] >= 0.5 && strstr(why, "lazy-connection"),
          "known-bad: first collectives on two communicators in opposite orders must hold both hosts: %d %d %.2f %.2f %s", w.rc[0],
          w.rc[1], cc.t_end[0], cc.t_end[1], why);
    o.connect_timeout_s = 0;
    fakenccl_set_options(&o);
}

/* ---- shared resources [src: init.cc ncclCommSplit, commAlloc, envConfigOverride; enqueue.cc
   ncclLaunchPrepare] --------------------------------------------------------------------------------- */

/* Two splits X and Y of a parent, two ranks, each split's kernels on streams of their own: rank 0
   receives on X, then sends on Y; rank 1 receives on Y, then sends on X. That runs only while the
   splits' kernels may run at the same time: with their own resources they may; sharing the
   parent's (its config.splitShare = 1, or NCCL_COMM_SPLIT_SHARE_RESOURCES=1 over any config) each
   launch waits for the previous kernel of the parent's queue, and the two ranks wait for each
   other. `how`: 0 splitShare unset, 1 the parent's config 1, 2 the variable 1, 3 the parent's
   config 1 and the variable 0, 4 the parent's 0 and the children's 1 (the parent's decides). */
static void r_share(world* w, int r) {
    int how = *(const int*)w->user;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER, ccfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t parent = NULL, x = NULL, y = NULL;
    cfg.splitShare = how == 1 || how == 3 ? 1 : how == 4 ? 0 : NCCL_CONFIG_UNDEF_INT;
    ccfg.splitShare = how == 4 ? 1 : NCCL_CONFIG_UNDEF_INT;
    w->rc[r] = ncclCommInitRankConfig(&parent, w->n, w->id, r, &cfg);
    if (w->rc[r] == ncclSuccess) w->rc[r] = ncclCommSplit(parent, 0, r, &x, how == 4 ? &ccfg : NULL);
    if (w->rc[r] == ncclSuccess) w->rc[r] = ncclCommSplit(parent, 0, r, &y, how == 4 ? &ccfg : NULL);
    if (w->rc[r] == ncclSuccess) w->rc[r] = connect_all(x, w->n, r);
    if (w->rc[r] == ncclSuccess) w->rc[r] = connect_all(y, w->n, r);
    cudaStreamCreateWithFlags(&w->s[r], cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&w->s2[r], cudaStreamNonBlocking);
    w->a[r] = dev_floats(NF);
    w->b[r] = dev_floats(NF);
    put_floats(w->a[r], (float)(10 * r), NF);
    if (w->rc[r] == ncclSuccess) {
        ncclRecv(w->b[r], NF, ncclFloat, 1 - r, r == 0 ? x : y, w->s[r]);
        sleep_s(0.02);
        ncclSend(w->a[r], NF, ncclFloat, 1 - r, r == 0 ? y : x, w->s2[r]);
        w->ok[r] = wait_stream(w->s[r], HANG_S * 3) && wait_stream(w->s2[r], HANG_S) && is_floats(w->b[r], (float)(10 * (1 - r)), NF);
    }
    if (w->ok[r]) {
        ncclCommDestroy(y);
        ncclCommDestroy(x);
        ncclCommDestroy(parent);
    } else {
        ncclCommAbort(y);
        ncclCommAbort(x);
        ncclCommAbort(parent);
        cudaStreamSynchronize(w->s[r]);
        cudaStreamSynchronize(w->s2[r]);
    }
}

static void share_case(int how, int expect, const char* env, const char* what) {
    world w;
    if (env) setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", env, 1);
    world_init(&w, 2);
    w.user = &how;
    run_ranks(&w, r_share);
    CHECK(w.rc[0] == ncclSuccess && w.rc[1] == ncclSuccess, "%s: set-up failed", what);
    CHECK((w.ok[0] && w.ok[1]) == expect, "%s: %d %d", what, w.ok[0], w.ok[1]);
    world_free(&w);
    unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
}

static void test_split_share(void) {
    share_case(0, 1, NULL, "splits with resources of their own run at the same time");
    share_case(4, 1, NULL, "the children's splitShare = 1 does not make them share (the parent's decides)");
    share_case(3, 1, "0", "NCCL_COMM_SPLIT_SHARE_RESOURCES=0 over a parent's splitShare = 1");
    share_case(1, 0, NULL, "known-bad: splits of a parent with splitShare = 1 must queue behind each other");
    share_case(0, 0, "1", "known-bad: NCCL_COMM_SPLIT_SHARE_RESOURCES=1 must make the splits queue behind each other");
}

/* ---- misc ----------------------------------------------------------------------------------------- */

static void r_misc(world* w, int r) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    float host[NF];
    rank_setup(w, r);
    cfg.blocking = 0;
    w->rc2[r] = ncclCommInitRankConfig(&w->comm2[r], w->n, w->id2, r, &cfg);
    poll_ready(w->comm2[r]);
    /* a blocking and a non-blocking communicator in one group: refused, nothing issued */
    ncclGroupStart();
    ncclAllReduce(w->a[r], w->a[r], NF, ncclFloat, ncclSum, w->comm[r], w->s[r]);
    w->flag[r] = ncclAllReduce(w->b[r], w->b[r], NF, ncclFloat, ncclSum, w->comm2[r], w->s[r]);
    w->rc[r] = ncclGroupEnd();
    ncclCommDestroy(w->comm2[r]);
    if (r == 0) {
        ncclResult_t st = ncclSuccess;
        /* a host buffer: the kernel faults */
        memset(host, 0, sizeof host);
        ncclSend(host, NF, ncclFloat, 1, w->comm[0], w->s[0]);
        wait_stream(w->s[0], LONG_S);
        ncclCommGetAsyncError(w->comm[0], &st);
        w->ok[0] = st == ncclUnhandledCudaError;
        snprintf(w->msg[0], sizeof w->msg[0], "%s", ncclGetLastError(w->comm[0]));
        ncclCommAbort(w->comm[0]);
    } else {
        ncclCommAbort(w->comm[1]);
        w->ok[1] = 1;
    }
}

static void test_misc(void) {
    world w;
    int r;
    world_init(&w, 2);
    run_ranks(&w, r_misc);
    for (r = 0; r < 2; r++)
        CHECK(w.flag[r] == ncclInvalidArgument && w.rc[r] == ncclInvalidArgument,
              "rank %d: mixing blocking and non-blocking in a group: call %d, end %d", r, w.flag[r], (int)w.rc[r]);
    CHECK(w.ok[0] && strstr(w.msg[0], "not device memory"), "a host buffer must fault the kernel: %s", w.msg[0]);
    fakecuda_clear_error(0);
    CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0, "error string");
    world_free(&w);
}

/* ---- the CUDA imitation -------------------------------------------------------------------------- */

/* Device memory cannot be read by the host (in a child process: the read must fault). */
static void test_device_memory_not_host(void) {
    void* d = NULL;
    int st = 0;
    char h[64] = {0};
    pid_t pid;
    CHECK(cudaMalloc(&d, 64) == cudaSuccess, "cudaMalloc");
    cudaMemcpy(d, "device", 7, cudaMemcpyHostToDevice);
    cudaMemcpy(h, d, 7, cudaMemcpyDeviceToHost);
    CHECK(strcmp(h, "device") == 0, "through cudaMemcpy: '%s'", h);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        h[0] = *(volatile const char*)d; /* must fault */
        _exit(h[0] == 'd' ? 0 : 3);
    }
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && !(WIFEXITED(st) && WEXITSTATUS(st) == 0),
          "the host dereferenced device memory (child status %d)", st);
    cudaFree(d);
}

static int k_set_flag(void* u) {
    int* f = (int*)u;
    pthread_mutex_lock(&gate_mu);
    *f = 1;
    pthread_mutex_unlock(&gate_mu);
    return 0;
}

static int get_flag(const int* f) {
    int v;
    pthread_mutex_lock(&gate_mu);
    v = *f;
    pthread_mutex_unlock(&gate_mu);
    return v;
}

/* cudaEventDestroy of an event with work pending: the record and the waits on it still work,
   and the event is released only once they ran [RT: cudaEventDestroy]. */
static void test_event_destroy_deferred(void) {
    cudaStream_t s1 = NULL, s2 = NULL;
    cudaEvent_t e = NULL;
    fakecuda_stats a, b, c;
    int flag = 0;
    set_gate(0);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    fakecuda_launch(s1, k_gate, NULL);
    fakecuda_stats_get(&a);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, s1);
    cudaStreamWaitEvent(s2, e, 0);
    fakecuda_launch(s2, k_set_flag, &flag);
    CHECK(cudaEventDestroy(e) == cudaSuccess, "destroy");
    fakecuda_stats_get(&b);
    sleep_s(0.05);
    CHECK(!get_flag(&flag), "a wait on a destroyed event did not wait");
    CHECK(b.events_live == a.events_live + 1, "an event with a pending record was released at once (%llu live, %llu before)",
          (unsigned long long)b.events_live, (unsigned long long)a.events_live);
    set_gate(1);
    cudaStreamSynchronize(s2);
    fakecuda_stats_get(&c);
    CHECK(get_flag(&flag) && c.events_live == a.events_live, "after the record: flag %d, %llu live", get_flag(&flag),
          (unsigned long long)c.events_live);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
}

typedef struct gate_later {
    double after;
    int opened;
} gate_later;
static void* open_gate_later(void* u) {
    gate_later* g = (gate_later*)u;
    sleep_s(g->after);
    pthread_mutex_lock(&gate_mu);
    g->opened = 1;
    gate_open = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    return NULL;
}

/* Device to pageable host: cudaMemcpyAsync returns only once the copy is done; to pinned host
   memory it returns at once [RT: API synchronization behavior]. */
static void test_d2h_pageable_sync(void) {
    cudaStream_t s = NULL;
    float* d = dev_floats(NF);
    float h[NF], *pinned = NULL;
    pthread_t th;
    gate_later g;
    put_floats(d, 3, NF);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMallocHost((void**)&pinned, sizeof h);
    set_gate(0);
    fakecuda_launch(s, k_gate, NULL);
    memset(pinned, 0, sizeof h);
    CHECK(cudaMemcpyAsync(pinned, d, sizeof h, cudaMemcpyDeviceToHost, s) == cudaSuccess, "pinned copy");
    CHECK(pinned[5] == 0, "a copy to pinned memory ran before its stream got there");
    g.after = 0.05;
    g.opened = 0;
    pthread_create(&th, NULL, open_gate_later, &g);
    memset(h, 0, sizeof h);
    cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    CHECK(get_flag(&g.opened) && h[5] == 8.0f, "cudaMemcpyAsync to pageable memory returned before the copy (gate %d, h[5] %g)",
          get_flag(&g.opened), (double)h[5]);
    pthread_join(th, NULL);
    cudaStreamSynchronize(s);
    CHECK(pinned[5] == 8.0f, "pinned copy after the sync");
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
    cudaFree(d);
}

/* The legacy default stream [PG: Default Stream, Implicit Synchronization]. */
static void test_legacy_stream(void) {
    cudaStream_t blk = NULL, nb = NULL;
    float* d = dev_floats(NF);
    int flag_b = 0, flag_nb = 0;
    cudaStreamCreate(&blk);
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    /* work on the legacy stream waits for a blocking stream, not for a non-blocking one */
    put_floats(d, 0, NF);
    set_gate(0);
    fakecuda_launch(blk, k_gate, NULL);
    cudaMemset(d, 0, sizeof(float) * NF);
    fakecuda_launch(0, k_set_flag, &flag_b);
    sleep_s(0.05);
    CHECK(!get_flag(&flag_b), "the legacy stream ran past a blocking stream's earlier work");
    set_gate(1);
    cudaDeviceSynchronize();
    CHECK(get_flag(&flag_b), "the legacy stream's work after the blocking stream");
    set_gate(0);
    fakecuda_launch(nb, k_gate, NULL);
    fakecuda_launch(0, k_set_flag, &flag_nb);
    CHECK(cudaStreamSynchronize(0) == cudaSuccess && get_flag(&flag_nb), "the legacy stream waited for a non-blocking stream");
    set_gate(1);
    cudaStreamSynchronize(nb);
    /* a blocking stream waits for the legacy stream; a non-blocking one does not */
    flag_b = flag_nb = 0;
    set_gate(0);
    fakecuda_launch(0, k_gate, NULL);
    fakecuda_launch(blk, k_set_flag, &flag_b);
    fakecuda_launch(nb, k_set_flag, &flag_nb);
    CHECK(cudaStreamSynchronize(nb) == cudaSuccess && get_flag(&flag_nb), "a non-blocking stream waited for the legacy stream");
    sleep_s(0.05);
    CHECK(!get_flag(&flag_b), "a blocking stream ran past the legacy stream's earlier work");
    set_gate(1);
    cudaStreamSynchronize(blk);
    CHECK(get_flag(&flag_b), "the blocking stream's work after the legacy stream");
    /* cudaMemcpy from pageable memory returns before the bytes land (issue 14 finding 9) */
    set_gate(0);
    put_floats(d, 0, NF);
    fakecuda_launch(blk, k_gate, NULL);
    {
        float h[NF], got[NF];
        int i;
        for (i = 0; i < NF; i++) h[i] = 1;
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice); /* queued behind blk's gate */
        cudaMemcpyAsync(got, d, sizeof got, cudaMemcpyDeviceToHost, nb);
        CHECK(got[0] == 0.0f, "a non-blocking stream saw a cudaMemcpy that could not have landed (%g)", (double)got[0]);
        set_gate(1);
        cudaDeviceSynchronize();
        cudaMemcpyAsync(got, d, sizeof got, cudaMemcpyDeviceToHost, nb);
        CHECK(got[0] == 1.0f, "after the fence: %g", (double)got[0]);
    }
    cudaStreamDestroy(blk);
    cudaStreamDestroy(nb);
    cudaFree(d);
}

/* cudaFree waits for the device's streams [PG: Stream-Ordered Memory Allocator]. */
static void test_free_synchronizes(void) {
    cudaStream_t s = NULL;
    void* d = NULL;
    pthread_t th;
    gate_later g;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc(&d, 64);
    set_gate(0);
    fakecuda_launch(s, k_gate, NULL);
    g.after = 0.05;
    g.opened = 0;
    pthread_create(&th, NULL, open_gate_later, &g);
    cudaFree(d);
    CHECK(get_flag(&g.opened), "cudaFree returned while a stream of its device was busy");
    pthread_join(th, NULL);
    cudaStreamDestroy(s);
}

static int k_fault(void* u) {
    (void)u;
    return (int)cudaErrorIllegalAddress;
}
static void host_fn_calls_cuda(void* u) {
    int dev = -1;
    *(cudaError_t*)u = cudaGetDevice(&dev);
}

/* A faulting kernel poisons its device; other devices go on. */
static void test_sticky_errors(void) {
    cudaStream_t s = NULL;
    void* p = NULL;
    cudaError_t inside = cudaSuccess;
    cudaSetDevice(3);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaLaunchHostFunc(s, host_fn_calls_cuda, &inside);
    cudaStreamSynchronize(s);
    CHECK(inside == cudaErrorNotPermitted, "a host function called CUDA: %d", (int)inside);
    fakecuda_launch(s, k_fault, NULL);
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress, "the fault is reported");
    CHECK(cudaMalloc(&p, 16) == cudaErrorIllegalAddress && cudaGetLastError() == cudaErrorIllegalAddress &&
              cudaGetLastError() == cudaErrorIllegalAddress,
          "the error is sticky");
    cudaSetDevice(0);
    CHECK(cudaMalloc(&p, 16) == cudaSuccess, "another device goes on");
    cudaGetLastError(); /* the thread's last error, from the refused cudaMalloc above */
    cudaFree(p);
    CHECK(cudaSetDevice(-1) == cudaErrorInvalidDevice && cudaGetLastError() == cudaErrorInvalidDevice &&
              cudaGetLastError() == cudaSuccess,
          "a non-sticky error is read once");
    fakecuda_clear_error(3);
    cudaStreamDestroy(s);
}

/* [PG: Stream and Event Behavior]: what works on another device's stream. */
static void test_cross_device(void) {
    cudaStream_t s1 = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float* d = dev_floats(NF);
    float h[NF];
    int flag = 0;
    cudaSetDevice(1);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e1, cudaEventDisableTiming);
    cudaSetDevice(0);
    cudaEventCreateWithFlags(&e0, cudaEventDisableTiming);
    CHECK(fakecuda_launch(s1, k_set_flag, &flag) == cudaErrorInvalidResourceHandle, "a launch on another device's stream");
    cudaGetLastError();
    CHECK(cudaEventRecord(e0, s1) == cudaErrorInvalidResourceHandle, "a record of a device-0 event on a device-1 stream");
    cudaGetLastError();
    CHECK(cudaEventRecord(e1, s1) == cudaSuccess, "a record of a device-1 event on its stream, device 0 current");
    CHECK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s1) == cudaSuccess, "a copy on another device's stream");
    CHECK(cudaStreamWaitEvent(s1, e0, 0) == cudaSuccess && cudaStreamWaitEvent(0, e1, 0) == cudaSuccess, "cross-device waits");
    CHECK(cudaEventSynchronize(e1) == cudaSuccess && cudaEventQuery(e1) == cudaSuccess, "query and sync across devices");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s1);
    cudaFree(d);
}

/* The counters the benches read. */
static void test_counters(void) {
    cudaStream_t s = NULL;
    cudaEvent_t e = NULL;
    fakecuda_stats st;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    fakecuda_stats_reset();
    cudaEventRecord(e, s);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(s, e, 0);
    cudaStreamSynchronize(s);
    fakecuda_stats_get(&st);
    CHECK(st.calls[FAKECUDA_CALL_EVENT_RECORD] == 2 && st.calls[FAKECUDA_CALL_STREAM_WAIT_EVENT] == 1 &&
              st.calls[FAKECUDA_CALL_STREAM_SYNC] == 1 && fakecuda_stats_calls(&st) == 4 && st.host_waits == 1,
          "counters: %llu calls, %llu waits", (unsigned long long)fakecuda_stats_calls(&st), (unsigned long long)st.host_waits);
    CHECK(strcmp(fakecuda_call_name(FAKECUDA_CALL_EVENT_RECORD), "cudaEventRecord") == 0, "call names");
    { /* the thread's waits: a query that finds work pending counts, one that finds it done does not */
        uint64_t w0 = fakecuda_thread_waits();
        set_gate(0);
        fakecuda_launch(s, k_gate, NULL);
        cudaEventRecord(e, s);
        CHECK(cudaEventQuery(e) == cudaErrorNotReady && fakecuda_thread_waits() == w0 + 1, "a pending query is a wait");
        set_gate(1);
        CHECK(cudaEventSynchronize(e) == cudaSuccess && fakecuda_thread_waits() == w0 + 2, "a sync is a wait");
        CHECK(cudaEventQuery(e) == cudaSuccess && fakecuda_thread_waits() == w0 + 2, "a query of done work is not");
    }
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
}

int main(void) {
    test_device_memory_not_host(); /* first: it forks, and no other thread may exist yet */
    test_event_destroy_deferred();
    test_d2h_pageable_sync();
    test_legacy_stream();
    test_free_synchronizes();
    test_sticky_errors();
    test_cross_device();
    test_counters();
    test_init_and_duplicate_gpu();
    test_nonblocking_init();
    test_split();
    test_p2p_order();
    test_rendezvous();
    test_sends_at_next_wait();
    test_group_defers();
    test_group_streams();
    test_comm_order();
    test_stream_semantics();
    test_nonblocking_group();
    test_allreduce();
    test_abort();
    test_two_comms();
    test_launch_order();
    test_lazy_connect();
    test_coll_warmup();
    test_split_share();
    test_misc();
    return TEST_DONE("imitation");
}
