/* tests/fakenccl/nccl.h - an imitation of NCCL for tests on machines without GPUs.

   A test includes it instead of the real <nccl.h> (build with -Itests/fakenccl -Itests/fakecuda):
   the ranks of a communicator are threads of one process, each on its own imitation device
   (cudaSetDevice before ncclCommInitRank), and every NCCL operation is a "kernel" on the CUDA
   imitation's streams (tests/fakecuda), so events, stream waits and host synchronisation behave
   around it as they would on a GPU. The rules are NCCL's documented ones (NCCL user guide, cited
   as [UG: section]; where the guide is silent, the behaviour of NCCL's source, cited as [src:
   file]), chosen so that a client that only works by luck on a GPU fails or hangs here:

   Communicators
   - ncclGetUniqueId / ncclCommInitRank / ncclCommInitRankConfig / ncclCommInitAll: the ranks
     meet by unique id; a blocking init returns when all nranks have joined [UG: Creating a
     Communicator]. Non-blocking (config.blocking = 0): the call returns ncclInProgress and the
     state, read with ncclCommGetAsyncError, stays ncclInProgress for a while after the last
     rank joined [UG: Creating a communication with options; ncclCommGetAsyncError]. Any call on
     a communicator whose state is ncclInProgress fails with ncclInvalidArgument ("Attempt to use
     communicator before the previous operation returned ncclSuccess") [src: init.cc,
     ncclCommEnsureReady]. A config not made with NCCL_CONFIG_INITIALIZER is refused.
   - Two ranks of one communicator on one device: every rank's init fails with ncclInvalidUsage
     [UG: Creating a Communicator: "Using the same CUDA device multiple times as different ranks of
     the same NCCL communicator is not supported"], unless NCCL_MULTI_RANK_GPU_ENABLE is set to a
     non-zero number, which NCCL 2.30 allows [src: init.cc: "Multiple Ranks are using the same
     GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration."; 2.28 says
     "Duplicate GPU detected" and has no such variable].
   - ncclCommSplit: collective over the parent; ranks of one colour form a communicator ordered
     by key, then by parent rank; NCCL_SPLIT_NOCOLOR gives NULL; a NULL config inherits the
     parent's (blocking and splitShare included) [UG: ncclCommSplit; src: init.cc commGetSplitInfo,
     copyCommConfig]. A non-blocking parent returns ncclInProgress; *newcomm is written when the
     split completes. Shared resources [src: init.cc ncclCommSplit: shareResources = the
     parent's config.splitShare; commAlloc: the child takes the parent's sharedRes, its launch
     queue among them; envConfigOverride: NCCL_COMM_SPLIT_SHARE_RESOURCES replaces every
     communicator's splitShare]: the children of a parent whose splitShare is 1 launch on the
     parent's queue (below), one kernel after another with the parent's and each other's.
   - ncclCommFinalize / ncclCommDestroy wait for the communicator's operations to complete
     [UG: Finalizing a communicator; Destroying a communicator]: a stuck operation makes them hang.
   - ncclCommAbort [UG: Error handling and communicator abort]: the communicator's pending
     operations stop at once (their stream work completes, data undefined), so no stream stays
     blocked. Abort is local: the peers' matching operations stay pending and hang until their
     own abort, as within one node. fakenccl_options.abort_seen instead gives the peers
     ncclRemoteError as their asynchronous error, their operations still pending: what NCCL
     reports when its transport sees a peer fail [UG: api/types, ncclRemoteError: "a network
     error or a remote process exiting prematurely"; src: misc/socket.cc, a closed connection].

   Operations and groups
   - Every call is deferred while a group is open and issued at the outermost ncclGroupEnd;
     groups nest [UG: Group Calls]. Outside a group a call is a group of its own.
   - One issued group makes one "kernel" per communicator, enqueued on the streams its
     operations name (several streams: it starts once every one of them reached it and holds
     all of them until it completes) [UG: CUDA Stream Semantics, Mixing Multiple Streams within
     the same ncclGroupStart/End() group]. Its operations progress together and it completes as
     a whole. A communicator's kernels run one after another, in issue order, whatever streams
     they are on [src: enqueue.cc, ncclLaunchPrepare: the launch stream waits for
     sharedRes->deviceStream; ncclLaunchFinish: deviceStream advances to the kernel's end]: one
     launch queue per sharedRes, which split children may share (above).
   - Lazy connection set-up [src: enqueue.cc p2pTaskAppend; group.cc groupLaunch;
     transport.cc ncclTransportP2pSetup; bootstrap.cc]: the first send to a peer (receive from
     it) on a communicator is connected in the outermost ncclGroupEnd, before any kernel, with
     the host held until the peer's host sets up the mirror side (non-blocking: the state stays
     ncclInProgress); each direction once. Two ranks whose first exchanges are in different
     orders wait for each other at the host. fakenccl_options.connect_timeout_s (30 s; real NCCL
     waits forever) turns that into ncclSystemError and fakenccl_problem() says why. A
     communicator's first collective waits the same way for every rank: the host posts its part
     to every member, then stays in the group end until it has every member's (fn_setup_build);
     two communicators whose first collectives come in opposite orders on two ranks wait for each
     other there. The code below (fn_connect) cites the details. fakenccl_stats.connects counts
     set-ups, p2p_conns and coll_setups what they made; fakenccl_thread_connections gives one
     rank's (its thread's groups), with the device memory that holds by NCCL's buffer rule
     (FAKENCCL_CONN_BYTES per connection received on).
   - ncclSend/ncclRecv [UG: Point-to-point communication]: the k-th send from rank a to rank b
     on a communicator matches the k-th receive of b from a. A send completes only when its
     receive is running (its kernel started on the receiver's stream): rendezvous, the strictest
     behaviour NCCL allows ("This operation is blocking for the GPU"). fakenccl_options.eager_bytes
     (or FAKENCCL_EAGER=<bytes>) lets a send of at most that many bytes complete without its
     receive while the connection's buffer (that many bytes) has room, as NCCL's internal buffers
     do for small messages.
   - Send and receive sizes that differ are not reported by NCCL: each side moves its own byte
     count through the connection's FIFO [src: device/sendrecv.h, runSend/runRecv], so the longer
     side waits for bytes that never come or leaves bytes that shift every later message. Here
     both operations, and everything after them on that connection, never complete (a hang the
     client can only end by its own timeout); fakenccl_stats.mismatches and fakenccl_problem()
     name it for the test.
   - Collectives (all-reduce, broadcast, reduce, all-gather, reduce-scatter) match by issue
     order on the communicator and complete when every rank's is running. Reductions: int8 to
     float64 (not half, bfloat16 or fp8: ncclInvalidArgument).
   - Non-blocking communicators [UG: Group Calls, Nonblocking Group Operation]: ncclGroupEnd (and
     a call outside a group) returns ncclInProgress and the kernels reach the streams later, from
     a background thread; the state is ncclInProgress until they are enqueued. Work the client
     enqueues before that (a completion event) runs before the communication.
   - Buffers must be device memory of the imitation: a host pointer faults the kernel
     (ncclUnhandledCudaError as the asynchronous error).
   - "Using multiple NCCL communicators concurrently" [UG]: kernels of different communicators
     may not run concurrently on one device. fakenccl_options.serialize_kernels (or
     FAKENCCL_SERIALIZE=1) runs at most one kernel per device at a time, so a client that
     orders two communicators differently on two ranks deadlocks here as it may on a GPU.
     Without it kernels of different communicators are not ordered against each other, whatever
     streams they are on [src: enqueue.cc, ncclLaunchPrepare: a launch waits for its own
     communicator's sharedRes->deviceStream and, only under NCCL_LAUNCH_ORDER_IMPLICIT=1
     (getImplicitOrder; off by default), for the device's context->launchOrder, every
     communicator's launches in host order], so a collective on one communicator issued on a
     second stream while another communicator's point-to-point kernel waits for its peer runs
     and completes (pipeline_nccl.h's data-parallel all-reduce during the pipeline's cool-down;
     tests/test_imitation.c p2p_coll, with its known-bad client in opposite orders). What reads
     a buffer another stream wrote must wait for it (an event): a kernel runs in its stream's
     order only [UG: CUDA Stream Semantics].

   - NCCL's own streams [src: init.cc, ncclStrongStreamConstruct(&sharedRes->deviceStream) and
     (&sharedRes->hostStream): cudaStreamCreateWithFlags]: two per communicator (per parent under
     splitShare), made here at its first call once ready (fn_ready) or launch. Before a kernel its launch stream waits for
     deviceStream, after it deviceStream waits for the kernel's end [src: enqueue.cc,
     ncclLaunchPrepare: ncclStreamWaitStream; ncclLaunchFinish: ncclStreamAdvanceToEvent, a
     cudaStreamWaitEvent outside graph capture]. They take hardware queues like the client's
     (tests/fakecuda, CUDA_DEVICE_MAX_CONNECTIONS), so a client stream that shares a queue with
     a deviceStream runs nothing past that wait until the kernel ends: a client that counts only
     its own streams against the queues hangs (tests/test_imitation.c internal_streams;
     fakenccl_options.no_internal_streams turns them off). fakenccl_options.serialize_kernels = 2
     (FAKENCCL_SERIALIZE=2) runs a device's kernels one at a time in the order they were
     launched, whatever their communicator (and so does NCCL_LAUNCH_ORDER_IMPLICIT=1, as NCCL
     does before CUDA 12.3 [src: enqueue.cc, getImplicitOrder: ncclImplicitOrderSerial; from
     12.3 a launch waits only for the previous one's start]): what one hardware queue does
     (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron-LM sets it) and what [UG: Using multiple NCCL
     communicators concurrently] asks a client to survive: "applications should ensure
     operations are submitted in the same order across ranks".

   What it is not: no timing model, no network, no CUDA graphs, no user buffer registration; one
   process. Everything is static inline: include it in one translation unit. */
#ifndef FAKENCCL_NCCL_H
#define FAKENCCL_NCCL_H

#include <cuda_runtime_api.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKENCCL 1
#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

/* The fields of NCCL's config (2.28's, which 2.30 keeps in front), in its order; blocking and
   splitShare change behaviour here. */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char* netName;
    int splitShare;
    int trafficClass;
    const char* commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define FAKENCCL_CONFIG_MAGIC 0xcafebeef
#define NCCL_CONFIG_INITIALIZER                                                                               \
    {                                                                                                         \
        sizeof(ncclConfig_t), FAKENCCL_CONFIG_MAGIC, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
            NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,       \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                                      \
    }

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

/* ---- the imitation's own API ------------------------------------------------------------------ */

typedef struct fakenccl_options {
    size_t eager_bytes;         /* 0 (default): every send waits for its receive to run */
    int serialize_kernels;      /* 1: at most one NCCL kernel runs per device at a time; 2: and
                                   they start in the order they were launched on the device */
    int no_internal_streams;    /* 1: communicators make no streams of their own (not NCCL's way) */
    double launch_delay_s;      /* non-blocking init/split/launch finish this long (half to all of
                                   it, at random) after they could; default 4 ms */
    int eager_connect;          /* 1: connections exist from init (no lazy set-up; not NCCL's way) */
    double connect_timeout_s;   /* a set-up that waited this long for a peer's host fails (NCCL waits
                                   forever); 0: 30 s, or FAKENCCL_CONNECT_TIMEOUT */
    int abort_seen;             /* 1: ncclCommAbort gives every other member of the communicator
                                   ncclRemoteError as its asynchronous error (a peer that failed, as
                                   NCCL reports one its transport saw); 0: the peers are not told */
} fakenccl_options;

enum {
    FAKENCCL_CALL_SEND, FAKENCCL_CALL_RECV, FAKENCCL_CALL_COLL, FAKENCCL_CALL_GROUP_START, FAKENCCL_CALL_GROUP_END,
    FAKENCCL_CALL_INIT, FAKENCCL_CALL_SPLIT, FAKENCCL_CALL_FINALIZE, FAKENCCL_CALL_DESTROY, FAKENCCL_CALL_ABORT,
    FAKENCCL_CALL_ASYNC_ERROR, FAKENCCL_CALL_OTHER, FAKENCCL_CALL_KINDS
};

typedef struct fakenccl_stats {
    uint64_t calls[FAKENCCL_CALL_KINDS];  /* API calls by kind (fakenccl_call_name) */
    uint64_t kernels;           /* launches: one per communicator per issued group */
    uint64_t cuda_calls;        /* CUDA runtime calls NCCL made itself: the device switches around
                                   a group's launch, and the launches */
    uint64_t sends, recvs, colls; /* operations completed */
    uint64_t eager;             /* sends that completed before their receive ran */
    uint64_t mismatches;        /* send/receive pairs whose sizes differ (stuck for good) */
    uint64_t pending;           /* operations issued and neither complete nor aborted, now */
    uint64_t connects;          /* connection set-ups run (a communicator's, in a group end) */
    uint64_t p2p_conns;         /* point-to-point connections they made: one direction, one peer, one communicator */
    uint64_t coll_setups;       /* communicators whose collective connections they made */
} fakenccl_stats;

/* What the groups one thread (a rank) issued set up, and the device memory that holds by NCCL's
   rule: a connection is one direction to one peer on one communicator and one NCCL channel (the
   imitation has one; NCCL runs p2pnChannelsPerPeer per peer, src/graph/paths.cc
   ncclTopoComputeP2pChannels, and comm->nChannels rings, src/transport/generic.cc
   ncclTransportRingConnect), holding the LL, LL128 and SIMPLE buffers on the receiving GPU
   [src: transport/p2p.cc p2pRecvSetup; init.cc computeBuffSizes, their defaults:
   NCCL_LL_LINES_PER_THREAD 8 x NCCL_LL_MAX_NTHREADS 512 x NCCL_STEPS 8 x 16-byte lines,
   NCCL_LL128_ELEMS_PER_THREAD 120 x NCCL_LL128_MAX_NTHREADS 640 x 8 x 8 bytes, 4 MiB]. A
   collective's set-up counts as a ring: a send to the next rank and a receive from the previous. */
#define FAKENCCL_CONN_BYTES ((uint64_t)8 * 512 * 8 * 16 + (uint64_t)120 * 640 * 8 * 8 + ((uint64_t)1 << 22))
typedef struct fakenccl_conn_stats {
    uint64_t setups;            /* set-ups run (fakenccl_thread_connects) */
    uint64_t p2p_send, p2p_recv; /* point-to-point connections */
    uint64_t colls;             /* collective set-ups (a ring each: one send, one receive) */
    uint64_t bytes;             /* FAKENCCL_CONN_BYTES per connection received on: (p2p_recv + colls) */
} fakenccl_conn_stats;

#ifdef __cplusplus
extern "C" {
#endif

/* ---- internals ------------------------------------------------------------------------------- */

enum { FN_SEND, FN_RECV, FN_ALLREDUCE, FN_BROADCAST, FN_REDUCE, FN_ALLGATHER, FN_REDUCESCATTER };

struct fn_unit;
struct fn_coll;

typedef struct fn_op {
    struct fn_op* qnext;        /* in its connection's queue */
    struct fn_unit* u;
    struct fn_coll* rec;        /* a running collective: its record */
    int kind, peer;             /* peer: the other rank of a send/receive, the root of a collective */
    const void* sbuf;
    void* rbuf;
    const unsigned char* s_rw;  /* the buffers as the kernel reads and writes them */
    unsigned char* r_rw;
    size_t count, bytes;        /* bytes: what a send/receive moves */
    ncclDataType_t dt;
    ncclRedOp_t red;
    int running, done, queued;
    uint64_t seq;               /* a collective's place in its communicator's issue order */
    unsigned char* stage;       /* an eager send's bytes, waiting for its receive */
} fn_op;

typedef struct fn_conn {
    fn_op *sh, *st;             /* sends from src to dst, in issue order, not yet taken */
    fn_op *rh, *rt;             /* receives of dst from src, in issue order, not yet filled */
    size_t staged;              /* eager bytes in the buffer */
    int broken;                 /* a size mismatch: nothing moves on this connection any more */
} fn_conn;

typedef struct fn_coll {
    struct fn_coll* next;
    uint64_t seq;               /* the collective's place in each rank's issue order */
    int n_in, broken;
    fn_op** ops;                /* [n]: each rank's, once its kernel runs */
} fn_coll;

typedef struct fn_split {
    struct fn_split* next;
    uint64_t seq;
    int arrived, done;
    int *color, *key, *blocking, *share; /* share: each child's own config.splitShare */
    ncclComm_t** out;           /* [n] each rank's newcomm argument */
    ncclComm_t* child;          /* [n] made, not yet written (non-blocking parents) */
} fn_split;

/* A split and its arrays (any of them NULL, as a failed allocation leaves them). */
static inline void fn_split_free(fn_split* s) {
    if (!s) return;
    free(s->color);
    free(s->key);
    free(s->blocking);
    free(s->share);
    free(s->out);
    free(s->child);
    free(s);
}

/* A launch order: NCCL's sharedRes->deviceStream. Every launch waits for the previous kernel on
   it to finish [src: enqueue.cc, ncclLaunchPrepare: the launch stream waits on deviceStream;
   ncclLaunchFinish: deviceStream advances to the kernel's finished event]. A communicator has
   its own, unless it is a split of a parent that shares resources (below). */
typedef struct fn_queue {
    struct fn_unit *head, *tail; /* units not yet done, in issue order */
    int refs;                   /* communicators and units that use it */
    /* NCCL's own streams of the shared resources (fn_internal_streams): deviceStream, which
       waits for every kernel, and hostStream; made = 1 once they exist, -1 where making them
       failed (then no waits) */
    cudaStream_t dev_stream, host_stream;
    cudaEvent_t scratch;
    int made;
} fn_queue;

/* A bootstrap message of the connection set-up [src: bootstrap.cc, bootstrapSend: returns once
   the bytes are on the socket; bootstrapRecv: blocks until the message of that peer and tag]. */
typedef struct fn_boot {
    struct fn_boot* next;
    int src, dst, tag;
    int ns, nr;                 /* the sender's connections to set up with dst: sends, receives */
} fn_boot;

typedef struct fn_clique {
    struct fn_clique* next;     /* cliques still gathering ranks */
    char id[NCCL_UNIQUE_ID_BYTES];
    int n, joined, complete, live;
    struct ncclComm** comms;    /* [n], NULL once freed */
    fn_conn* conn;              /* [n * n]: conn[src * n + dst] */
    fn_coll* colls;
    fn_split* splits;
    fn_boot *boot, *boot_tail;  /* set-up messages posted and not yet received, oldest first */
} fn_clique;

struct ncclComm {
    fn_clique* cl;
    int rank, n, dev, blocking;
    ncclResult_t state;         /* once ready_at has passed and nothing below is under way */
    double ready_at;
    int jobs;                   /* background launches holding this communicator */
    int finalizing;
    fn_split* split;            /* a non-blocking split this rank takes part in */
    uint64_t coll_seq, split_seq;
    fn_queue* q;                /* its launch order, shared with its parent under splitShare */
    int split_share;            /* config.splitShare after NCCL_COMM_SPLIT_SHARE_RESOURCES */
    unsigned char* seen;        /* [2n]: a send to peer (2 peer) or a receive from it (2 peer + 1)
                                   was issued once: its connection is set up or being set up */
    int coll_seen;              /* a collective was issued once: its connections too */
    struct fn_unit* units;      /* launched and not yet freed */
    char err[256];
};

typedef struct fn_unit {
    struct fn_unit* cnext;      /* in its communicator's list */
    struct ncclComm* comm;      /* NULL once the communicator is freed */
    fn_clique* cl;
    int rank, dev;
    fn_queue* q;                /* starts once it heads its launch order */
    struct fn_unit* qnext;
    fn_op** ops;
    int n_ops, n_open;
    cudaStream_t* streams;
    int n_streams, launched, arrived, left;
    int started, done, fault, holds_dev, queued;
    int launching;              /* the issuing thread still enqueues its kernels */
    struct fn_unit* dnext;      /* its device's launch order (serialize_kernels = 2) */
    int in_devq;
} fn_unit;

typedef struct fn_task {
    struct fn_task* next;
    int kind, peer;
    struct ncclComm* comm;
    cudaStream_t stream;
    const void* sbuf;
    void* rbuf;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t red;
} fn_task;

static pthread_mutex_t fn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fn_cv = PTHREAD_COND_INITIALIZER;
static fakenccl_options fn_opt;
static int fn_opt_set;
static fakenccl_stats fn_st;
static uint64_t fn_next_id;
static unsigned fn_rng = 2463534242u;
static char fn_problem_msg[256];
static char fn_last_err[256];
static fn_clique* fn_joining;
static int fn_dev_busy[FAKECUDA_DEVICES];
static struct fn_unit *fn_devq_head[FAKECUDA_DEVICES], *fn_devq_tail[FAKECUDA_DEVICES]; /* launch order per device */

/* the calling thread's open group */
static __thread int fn_depth;
static __thread fn_task *fn_tasks, *fn_tasks_tail;
static __thread ncclResult_t fn_group_err;
static __thread int fn_group_blocking = -1;
static __thread struct ncclComm* fn_group_inits[64];
static __thread int fn_n_group_inits;
static __thread uint64_t fn_thread_cuda_calls; /* fakenccl_thread_cuda_calls */
static __thread fakenccl_conn_stats fn_thread_conn; /* fakenccl_thread_connects, fakenccl_thread_connections */

static inline double fn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void fn_sleep(double s) {
    struct timespec d;
    if (s <= 0) return;
    d.tv_sec = (time_t)s;
    d.tv_nsec = (long)((s - (double)d.tv_sec) * 1e9);
    nanosleep(&d, NULL);
}

/* lock held */
static inline const fakenccl_options* fn_options(void) {
    if (!fn_opt_set) {
        const char* e = getenv("FAKENCCL_EAGER");
        const char* z = getenv("FAKENCCL_SERIALIZE");
        fn_opt.eager_bytes = e ? (size_t)strtoull(e, NULL, 10) : 0;
        fn_opt.serialize_kernels = z ? atoi(z) : 0;
        /* [src: enqueue.cc, getImplicitOrder: NCCL_LAUNCH_ORDER_IMPLICIT=1 makes every launch on a
           device wait for the device's previous one (context->launchOrder), in host order: for
           its end before CUDA 12.3 (ncclImplicitOrderSerial, imitated here), its start after] */
        if (getenv("NCCL_LAUNCH_ORDER_IMPLICIT") && atoi(getenv("NCCL_LAUNCH_ORDER_IMPLICIT")) != 0) fn_opt.serialize_kernels = 2;
        fn_opt.launch_delay_s = 0.004;
        fn_opt.connect_timeout_s = getenv("FAKENCCL_CONNECT_TIMEOUT") ? atof(getenv("FAKENCCL_CONNECT_TIMEOUT")) : 0;
        fn_opt_set = 1;
    }
    return &fn_opt;
}

/* lock held: how long a non-blocking operation takes to finish after it could */
static inline double fn_delay(void) {
    fn_rng = fn_rng * 1103515245u + 12345u;
    return fn_options()->launch_delay_s * (0.5 + 0.5 * (double)((fn_rng >> 8) % 1000) / 999.0);
}

static inline void fn_call(int kind) {
    pthread_mutex_lock(&fn_mu);
    fn_st.calls[kind]++;
    pthread_mutex_unlock(&fn_mu);
}

/* lock held: the reason something is stuck, for the test */
static inline void fn_problem(const char* msg) {
    snprintf(fn_problem_msg, sizeof fn_problem_msg, "%s", msg);
}

static inline ncclResult_t fn_fail(struct ncclComm* c, ncclResult_t r, const char* msg) {
    pthread_mutex_lock(&fn_mu);
    if (c) snprintf(c->err, sizeof c->err, "%s", msg);
    snprintf(fn_last_err, sizeof fn_last_err, "%s", msg);
    pthread_mutex_unlock(&fn_mu);
    return r;
}

/* lock held: the state ncclCommGetAsyncError reports now */
static inline ncclResult_t fn_state(struct ncclComm* c) {
    fn_unit* u;
    if (c->state == ncclInProgress || c->jobs > 0 || fn_now() < c->ready_at) return ncclInProgress;
    if (c->split) {
        if (!c->split->done) return ncclInProgress;
        /* "the ptr value of child comm will not be filled until the state of parent comm is
           ncclSuccess" [NCCL issue 1472; init.cc: the split is a job of the parent]: written now */
        if (c->split->child[c->rank]) *c->split->out[c->rank] = c->split->child[c->rank];
        c->split = NULL; /* the record stays with the clique */
    }
    if (c->finalizing)
        for (u = c->units; u; u = u->cnext)
            if (!u->done) return ncclInProgress;
    return c->state;
}

/* "comm must be ready, or error will be reported" [src: init.cc, ncclCommEnsureReady] */
static inline void fn_internal_streams(struct ncclComm* c);
static inline ncclResult_t fn_ready(struct ncclComm* c) {
    ncclResult_t r;
    if (!c) return fn_fail(NULL, ncclInvalidArgument, "comm argument is NULL");
    pthread_mutex_lock(&fn_mu);
    r = fn_state(c);
    pthread_mutex_unlock(&fn_mu);
    if (r == ncclSuccess) fn_internal_streams(c); /* NCCL made them at init: here by the first call after it */
    if (r == ncclInProgress)
        return fn_fail(c, ncclInvalidArgument, "Attempt to use communicator before the previous operation returned ncclSuccess");
    return r;
}

static inline size_t fn_type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

/* ---- connections, collectives, kernels (lock held throughout) ---- */

static inline void fn_queue_remove(fn_op** head, fn_op** tail, fn_op* op) {
    fn_op **pp, *prev = NULL;
    for (pp = head; *pp; prev = *pp, pp = &(*pp)->qnext)
        if (*pp == op) {
            *pp = op->qnext;
            if (*tail == op) *tail = prev;
            op->qnext = NULL;
            return;
        }
}

/* lock held: a communicator or unit lets go of its launch order */
static inline void fn_queue_put(fn_queue* q) {
    if (q && --q->refs == 0) {
        if (q->made == 1) { /* the streams' queued work is the kernels' waits: nothing blocks on them */
            (void)cudaStreamDestroy(q->dev_stream);
            (void)cudaStreamDestroy(q->host_stream);
            (void)cudaEventDestroy(q->scratch);
        }
        free(q);
    }
}

/* lock held: a unit leaves its launch order once done, so the next one may start */
static inline void fn_queue_leave(fn_unit* u) {
    fn_unit **pp, *prev = NULL;
    if (!u->q) return;
    for (pp = &u->q->head; *pp; prev = *pp, pp = &(*pp)->qnext)
        if (*pp == u) {
            *pp = u->qnext;
            if (u->q->tail == u) u->q->tail = prev;
            u->qnext = NULL;
            return;
        }
}

/* lock held: a unit leaves its device's launch order (done, killed or freed) */
static inline void fn_devq_leave(fn_unit* u) {
    fn_unit **pp, *prev = NULL;
    if (!u->in_devq) return;
    u->in_devq = 0;
    for (pp = &fn_devq_head[u->dev]; *pp; prev = *pp, pp = &(*pp)->dnext)
        if (*pp == u) {
            *pp = u->dnext;
            if (fn_devq_tail[u->dev] == u) fn_devq_tail[u->dev] = prev;
            u->dnext = NULL;
            return;
        }
}

static inline void fn_unit_free(fn_unit* u) {
    int i;
    fn_devq_leave(u);
    fn_queue_leave(u);
    fn_queue_put(u->q);
    if (u->comm) {
        fn_unit** pp;
        for (pp = &u->comm->units; *pp; pp = &(*pp)->cnext)
            if (*pp == u) {
                *pp = u->cnext;
                break;
            }
    }
    for (i = 0; i < u->n_ops; i++) {
        free(u->ops[i]->stage);
        free(u->ops[i]);
    }
    free(u->ops);
    free(u->streams);
    free(u);
}

/* A unit goes once it is complete, every stream left it and no queue holds one of its ops. */
static inline void fn_unit_try_free(fn_unit* u) {
    if (u->done && !u->launching && u->left == u->launched && u->queued == 0) fn_unit_free(u);
}

static inline void fn_unit_finish(fn_unit* u) {
    u->done = 1;
    if (u->holds_dev) fn_dev_busy[u->dev] = 0;
    u->holds_dev = 0;
    fn_queue_leave(u);
    fn_devq_leave(u);
    pthread_cond_broadcast(&fn_cv);
}

static inline void fn_op_done(fn_op* op) {
    op->done = 1;
    fn_st.pending--;
    if (op->kind == FN_SEND) fn_st.sends++;
    else if (op->kind == FN_RECV) fn_st.recvs++;
    else fn_st.colls++;
    if (--op->u->n_open == 0 && op->u->started) fn_unit_finish(op->u);
}

/* Stops a unit: its pending operations leave the queues and records (the peers' matching ones
   then never complete), the unit counts as done. Abort, a fault, a failed launch. */
static inline void fn_unit_kill(fn_unit* u) {
    int i;
    if (u->done) return;
    for (i = 0; i < u->n_ops; i++) {
        fn_op* op = u->ops[i];
        if (op->done) continue;
        if (op->queued && u->cl) {
            fn_conn* c = op->kind == FN_SEND ? &u->cl->conn[u->rank * u->cl->n + op->peer]
                                             : &u->cl->conn[op->peer * u->cl->n + u->rank];
            if (op->kind == FN_SEND) fn_queue_remove(&c->sh, &c->st, op);
            else fn_queue_remove(&c->rh, &c->rt, op);
            op->queued = 0;
            u->queued--;
        }
        if (op->rec) {
            op->rec->ops[u->rank] = NULL;
            op->rec->n_in--;
            op->rec = NULL;
        }
        op->done = 1;
        fn_st.pending--;
    }
    u->n_open = 0;
    fn_unit_finish(u);
}

static inline void fn_pop(fn_unit* u, fn_op** head, fn_op** tail) {
    fn_op* op = *head;
    *head = op->qnext;
    if (!*head) *tail = NULL;
    op->qnext = NULL;
    op->queued = 0;
    u->queued--;
}

/* Moves what can move on the connection src -> dst. */
static inline void fn_progress(fn_clique* cl, int src, int dst) {
    fn_conn* c = &cl->conn[src * cl->n + dst];
    size_t eager = fn_options()->eager_bytes;
    fn_op *s, *r;
    /* eager sends: into the connection's buffer, in order, while they fit */
    for (s = c->sh; eager && s && !c->broken; s = s->qnext) {
        if (s->stage) continue;
        if (!s->running || s->bytes > eager || c->staged + s->bytes > eager) break;
        s->stage = (unsigned char*)malloc(s->bytes ? s->bytes : 1);
        if (!s->stage) break;
        if (s->bytes) memcpy(s->stage, s->s_rw, s->bytes);
        c->staged += s->bytes;
        fn_st.eager++;
        fn_op_done(s);
    }
    while ((s = c->sh) != NULL && (r = c->rh) != NULL && !c->broken) {
        fn_unit *su = s->u, *ru = r->u;
        if (!r->running || !(s->running || s->stage)) break;
        if (s->bytes != r->bytes) {
            char msg[200];
            c->broken = 1;
            fn_st.mismatches++;
            snprintf(msg, sizeof msg,
                     "rank %d sends %zu bytes to rank %d, which receives %zu: both wait forever (NCCL does not check)",
                     src, s->bytes, dst, r->bytes);
            fn_problem(msg);
            break;
        }
        if (s->bytes) memcpy(r->r_rw, s->stage ? s->stage : s->s_rw, s->bytes);
        fn_pop(su, &c->sh, &c->st);
        fn_pop(ru, &c->rh, &c->rt);
        if (s->stage) {
            c->staged -= s->bytes;
            free(s->stage);
            s->stage = NULL;
        } else {
            fn_op_done(s);
        }
        fn_op_done(r);
        if (su != ru) fn_unit_try_free(su);
        fn_unit_try_free(ru);
    }
}

#define FN_REDUCE_TYPE(T)                                                                  \
    {                                                                                      \
        T* a = (T*)acc;                                                                    \
        const T* b = (const T*)x;                                                          \
        for (i = 0; i < n; i++)                                                            \
            switch (red) {                                                                 \
            case ncclSum: case ncclAvg: a[i] = (T)(a[i] + b[i]); break;                    \
            case ncclProd: a[i] = (T)(a[i] * b[i]); break;                                 \
            case ncclMax: a[i] = b[i] > a[i] ? b[i] : a[i]; break;                         \
            default: a[i] = b[i] < a[i] ? b[i] : a[i]; break;                              \
            }                                                                              \
    }                                                                                      \
    break;
#define FN_DIVIDE_TYPE(T)                                                                  \
    {                                                                                      \
        T* a = (T*)acc;                                                                    \
        for (i = 0; i < n; i++) a[i] = (T)(a[i] / (T)k);                                   \
    }                                                                                      \
    break;

static inline void fn_reduce(void* acc, const void* x, size_t n, ncclDataType_t dt, ncclRedOp_t red) {
    size_t i;
    switch (dt) {
    case ncclInt8: FN_REDUCE_TYPE(int8_t)
    case ncclUint8: FN_REDUCE_TYPE(uint8_t)
    case ncclInt32: FN_REDUCE_TYPE(int32_t)
    case ncclUint32: FN_REDUCE_TYPE(uint32_t)
    case ncclInt64: FN_REDUCE_TYPE(int64_t)
    case ncclUint64: FN_REDUCE_TYPE(uint64_t)
    case ncclFloat32: FN_REDUCE_TYPE(float)
    case ncclFloat64: FN_REDUCE_TYPE(double)
    default: break;
    }
}

static inline void fn_divide(void* acc, size_t n, ncclDataType_t dt, int k) {
    size_t i;
    switch (dt) {
    case ncclInt8: FN_DIVIDE_TYPE(int8_t)
    case ncclUint8: FN_DIVIDE_TYPE(uint8_t)
    case ncclInt32: FN_DIVIDE_TYPE(int32_t)
    case ncclUint32: FN_DIVIDE_TYPE(uint32_t)
    case ncclInt64: FN_DIVIDE_TYPE(int64_t)
    case ncclUint64: FN_DIVIDE_TYPE(uint64_t)
    case ncclFloat32: FN_DIVIDE_TYPE(float)
    case ncclFloat64: FN_DIVIDE_TYPE(double)
    default: break;
    }
}

/* Every rank's collective is running: check they agree, compute, complete them all. */
static inline void fn_coll_progress(fn_clique* cl, fn_coll* rec) {
    int n = cl->n, i;
    fn_op* o0 = rec->ops[0];
    size_t ts, cb;
    unsigned char* tmp;
    fn_coll** pp;
    if (rec->n_in < n || rec->broken) return;
    for (i = 1; i < n; i++) {
        fn_op* o = rec->ops[i];
        if (o->kind != o0->kind || o->count != o0->count || o->dt != o0->dt || o->red != o0->red || o->peer != o0->peer) {
            char msg[200];
            rec->broken = 1;
            fn_st.mismatches++;
            snprintf(msg, sizeof msg, "collective %llu: rank 0 and rank %d called different collectives or sizes: all wait forever",
                     (unsigned long long)rec->seq, i);
            fn_problem(msg);
            return;
        }
    }
    ts = fn_type_size(o0->dt);
    cb = o0->count * ts;
    switch (o0->kind) {
    case FN_ALLREDUCE:
    case FN_REDUCE:
        tmp = (unsigned char*)malloc(cb ? cb : 1);
        if (!tmp) return;
        if (cb) memcpy(tmp, rec->ops[0]->s_rw, cb);
        for (i = 1; i < n; i++) fn_reduce(tmp, rec->ops[i]->s_rw, o0->count, o0->dt, o0->red);
        if (o0->red == ncclAvg) fn_divide(tmp, o0->count, o0->dt, n);
        for (i = 0; i < n && cb; i++)
            if (o0->kind == FN_ALLREDUCE || i == o0->peer) memcpy(rec->ops[i]->r_rw, tmp, cb);
        free(tmp);
        break;
    case FN_BROADCAST:
        for (i = 0; i < n && cb; i++)
            if (i != o0->peer) memcpy(rec->ops[i]->r_rw, rec->ops[o0->peer]->s_rw, cb);
        if (cb) memmove(rec->ops[o0->peer]->r_rw, rec->ops[o0->peer]->s_rw, cb);
        break;
    case FN_ALLGATHER:
        tmp = (unsigned char*)malloc(cb * (size_t)n + 1);
        if (!tmp) return;
        for (i = 0; i < n; i++) memcpy(tmp + (size_t)i * cb, rec->ops[i]->s_rw, cb);
        for (i = 0; i < n; i++) memcpy(rec->ops[i]->r_rw, tmp, cb * (size_t)n);
        free(tmp);
        break;
    default: /* FN_REDUCESCATTER: count is each rank's share */
        tmp = (unsigned char*)malloc(cb * (size_t)n + 1);
        if (!tmp) return;
        memcpy(tmp, rec->ops[0]->s_rw, cb * (size_t)n);
        for (i = 1; i < n; i++) fn_reduce(tmp, rec->ops[i]->s_rw, o0->count * (size_t)n, o0->dt, o0->red);
        if (o0->red == ncclAvg) fn_divide(tmp, o0->count * (size_t)n, o0->dt, n);
        for (i = 0; i < n; i++) memcpy(rec->ops[i]->r_rw, tmp + (size_t)i * cb, cb);
        free(tmp);
        break;
    }
    for (pp = &cl->colls; *pp; pp = &(*pp)->next)
        if (*pp == rec) {
            *pp = rec->next;
            break;
        }
    for (i = 0; i < n; i++) {
        fn_op* o = rec->ops[i];
        o->rec = NULL;
        fn_op_done(o);
    }
    free(rec->ops);
    free(rec);
}

/* The bytes an operation reads and writes, as (buffer, size) pairs. */
static inline void fn_op_extent(const fn_op* op, int n, size_t* sb, size_t* rb) {
    size_t cb = op->count * fn_type_size(op->dt);
    *sb = *rb = cb;
    if (op->kind == FN_SEND) *rb = 0;
    else if (op->kind == FN_RECV) *sb = 0;
    else if (op->kind == FN_ALLGATHER) *rb = cb * (size_t)n;
    else if (op->kind == FN_REDUCESCATTER) *sb = cb * (size_t)n;
}

static inline int fn_can_start(const fn_unit* u) {
    return !u->started && !u->done && u->launched == u->n_streams && u->arrived == u->n_streams && u->comm &&
           u->q && u->q->head == u && !(fn_options()->serialize_kernels && fn_dev_busy[u->dev]) &&
           !(fn_options()->serialize_kernels >= 2 && fn_devq_head[u->dev] != u);
}

static inline void fn_start(fn_unit* u) {
    int i, n = u->cl->n;
    u->started = 1;
    if (fn_options()->serialize_kernels) {
        fn_dev_busy[u->dev] = 1;
        u->holds_dev = 1;
    }
    /* the kernel touches only device memory */
    for (i = 0; i < u->n_ops; i++) {
        fn_op* op = u->ops[i];
        size_t sb, rb;
        fn_op_extent(op, n, &sb, &rb);
        op->s_rw = sb ? (const unsigned char*)fakecuda_dev_ptr(op->sbuf, sb) : NULL;
        op->r_rw = rb ? (unsigned char*)fakecuda_dev_ptr(op->rbuf, rb) : NULL;
        if (op->kind == FN_REDUCE && u->rank != op->peer) op->r_rw = NULL; /* only the root writes */
        if ((sb && !op->s_rw && !(op->kind == FN_BROADCAST && u->rank != op->peer)) ||
            (rb && !op->r_rw && !(op->kind == FN_REDUCE && u->rank != op->peer))) {
            u->fault = 1;
            if (u->comm) {
                u->comm->state = ncclUnhandledCudaError;
                snprintf(u->comm->err, sizeof u->comm->err,
                         "rank %d: a buffer of a %s is not device memory of the imitation (illegal address)", u->rank,
                         op->kind == FN_SEND ? "send" : op->kind == FN_RECV ? "receive" : "collective");
            }
            fn_unit_kill(u);
            return;
        }
    }
    for (i = 0; i < u->n_ops; i++) {
        fn_op* op = u->ops[i];
        op->running = 1;
        if (op->kind != FN_SEND && op->kind != FN_RECV) {
            fn_coll* rec;
            for (rec = u->cl->colls; rec && rec->seq != op->seq; rec = rec->next) {
            }
            if (!rec) {
                rec = (fn_coll*)calloc(1, sizeof *rec);
                if (rec) rec->ops = (fn_op**)calloc((size_t)n, sizeof(fn_op*));
                if (!rec || !rec->ops) {
                    free(rec);
                    continue; /* out of memory: this collective never completes */
                }
                rec->seq = op->seq;
                rec->next = u->cl->colls;
                u->cl->colls = rec;
            }
            rec->ops[u->rank] = op;
            rec->n_in++;
            op->rec = rec;
        }
    }
    for (i = 0; i < u->n_ops && !u->done; i++) {
        fn_op* op = u->ops[i];
        if (op->done) continue;
        if (op->kind == FN_SEND) fn_progress(u->cl, u->rank, op->peer);
        else if (op->kind == FN_RECV) fn_progress(u->cl, op->peer, u->rank);
        else if (op->rec) fn_coll_progress(u->cl, op->rec);
    }
    if (u->n_open == 0 && !u->done) fn_unit_finish(u);
}

/* The kernel, on each of the unit's streams: arrive, start the unit when it may, wait for it. */
static inline int fn_kernel(void* arg) {
    fn_unit* u = (fn_unit*)arg;
    int fault;
    pthread_mutex_lock(&fn_mu);
    u->arrived++;
    pthread_cond_broadcast(&fn_cv);
    while (!u->done) {
        if (fn_can_start(u)) fn_start(u);
        else pthread_cond_wait(&fn_cv, &fn_mu);
    }
    fault = u->fault;
    u->left++;
    fn_unit_try_free(u);
    pthread_mutex_unlock(&fn_mu);
    return fault ? (int)cudaErrorIllegalAddress : 0;
}

/* NCCL's own streams [src: init.cc, commAlloc/sharedRes: ncclStrongStreamConstruct(&deviceStream),
   (&hostStream); misc/strongstream.cc, ncclStrongStreamConstruct: cudaStreamCreateWithFlags], one
   pair per shared resources (split children under splitShare use their parent's). NCCL makes
   them at init; the imitation at the first call on the communicator once its init is done
   (fn_ready: ncclCommCount and the other queries, a split), or at its first launch if that
   comes first, on its device, lock not held. So they take their queues before the client's
   streams made after (a grid's streams: tests/test_nccl_grid.c counts them). They take hardware queues like any stream
   (fakecuda: CUDA_DEVICE_MAX_CONNECTIONS), and deviceStream holds a wait for every kernel of
   its communicator (fn_launch): a stream sharing its queue runs nothing past it until the
   kernel ends. */
static inline void fn_internal_streams(struct ncclComm* c) {
    fn_queue* q = c->q;
    cudaStream_t ds = NULL, hs = NULL;
    cudaEvent_t ev = NULL;
    int made, old_dev = 0;
    pthread_mutex_lock(&fn_mu);
    made = q->made || fn_options()->no_internal_streams;
    pthread_mutex_unlock(&fn_mu);
    if (made) return;
    if (cudaGetDevice(&old_dev) != cudaSuccess) old_dev = c->dev;
    made = cudaSetDevice(c->dev) == cudaSuccess && cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking) == cudaSuccess &&
           cudaStreamCreateWithFlags(&hs, cudaStreamNonBlocking) == cudaSuccess &&
           cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess;
    (void)cudaSetDevice(old_dev);
    pthread_mutex_lock(&fn_mu);
    fn_st.cuda_calls += 6; /* get, set, two streams, an event, set back */
    fn_thread_cuda_calls += 6;
    if (!q->made) {
        q->made = made ? 1 : -1;
        q->dev_stream = ds, q->host_stream = hs, q->scratch = ev;
        ds = hs = NULL, ev = NULL;
    }
    pthread_mutex_unlock(&fn_mu);
    if (ds) (void)cudaStreamDestroy(ds);
    if (hs) (void)cudaStreamDestroy(hs);
    if (ev) (void)cudaEventDestroy(ev);
}

/* Issues a group's operations: one unit per communicator, in order of first use. */
static inline ncclResult_t fn_launch(fn_task* tasks) {
    ncclResult_t res = ncclSuccess;
    fn_task* t;
    for (t = tasks; t; t = t->next) {
        struct ncclComm* c = t->comm;
        fn_task* x;
        fn_unit* u;
        int n_ops = 0, i, n_streams, old_dev = 0;
        cudaError_t e = cudaSuccess;
        if (!c) continue; /* already issued with an earlier task of its communicator */
        fn_internal_streams(c);
        for (x = t; x; x = x->next) n_ops += x->comm == c;
        u = (fn_unit*)calloc(1, sizeof *u);
        if (u) {
            u->ops = (fn_op**)calloc((size_t)n_ops, sizeof(fn_op*));
            u->streams = (cudaStream_t*)calloc((size_t)n_ops, sizeof(cudaStream_t));
        }
        if (!u || !u->ops || !u->streams) {
            if (u) {
                free(u->ops);
                free(u->streams);
            }
            free(u);
            return ncclSystemError;
        }
        pthread_mutex_lock(&fn_mu);
        u->comm = c;
        u->cl = c->cl;
        u->rank = c->rank;
        u->dev = c->dev;
        u->q = c->q; /* joins the end of its communicator's launch order, and its device's */
        u->in_devq = 1;
        if (fn_devq_tail[u->dev]) fn_devq_tail[u->dev]->dnext = u;
        else fn_devq_head[u->dev] = u;
        fn_devq_tail[u->dev] = u;
        c->q->refs++;
        if (c->q->tail) c->q->tail->qnext = u;
        else c->q->head = u;
        c->q->tail = u;
        for (x = t; x; x = x->next) {
            fn_op* op;
            int k;
            if (x->comm != c) continue;
            x->comm = NULL;
            op = (fn_op*)calloc(1, sizeof *op);
            if (!op) continue;
            op->u = u;
            op->kind = x->kind;
            op->peer = x->peer;
            op->sbuf = x->sbuf;
            op->rbuf = x->rbuf;
            op->count = x->count;
            op->dt = x->dt;
            op->red = x->red;
            op->bytes = x->count * fn_type_size(x->dt);
            if (op->kind == FN_SEND || op->kind == FN_RECV) {
                fn_conn* cn = op->kind == FN_SEND ? &c->cl->conn[c->rank * c->n + op->peer]
                                                  : &c->cl->conn[op->peer * c->n + c->rank];
                fn_op** head = op->kind == FN_SEND ? &cn->sh : &cn->rh;
                fn_op** tail = op->kind == FN_SEND ? &cn->st : &cn->rt;
                if (*tail) (*tail)->qnext = op;
                else *head = op;
                *tail = op;
                op->queued = 1;
                u->queued++;
            } else {
                op->seq = c->coll_seq++;
            }
            u->ops[u->n_ops++] = op;
            fn_st.pending++;
            for (k = 0; k < u->n_streams && u->streams[k] != x->stream; k++) {
            }
            if (k == u->n_streams) u->streams[u->n_streams++] = x->stream;
        }
        u->n_open = u->n_ops;
        u->launching = 1;
        n_streams = u->n_streams;
        u->cnext = c->units;
        c->units = u;
        fn_st.kernels++;
        pthread_mutex_unlock(&fn_mu);
        /* NCCL launches on the communicator's device */
        if (cudaGetDevice(&old_dev) != cudaSuccess) old_dev = c->dev;
        e = cudaSetDevice(c->dev);
        /* [src: enqueue.cc, ncclLaunchPrepare: the launch stream waits for deviceStream
           (ncclStreamWaitStream); ncclLaunchFinish: deviceStream waits for the kernel's end
           (ncclStreamAdvanceToEvent: cudaStreamWaitEvent outside graph capture)] */
        if (e == cudaSuccess && c->q->made == 1 && cudaEventRecord(c->q->scratch, c->q->dev_stream) == cudaSuccess)
            e = cudaStreamWaitEvent(u->streams[0], c->q->scratch, 0);
        for (i = 0; i < n_streams && e == cudaSuccess; i++) {
            e = fakecuda_launch(u->streams[i], fn_kernel, u);
            if (e == cudaSuccess) {
                pthread_mutex_lock(&fn_mu);
                u->launched++;
                pthread_mutex_unlock(&fn_mu);
            }
        }
        if (e == cudaSuccess && c->q->made == 1 && cudaEventRecord(c->q->scratch, u->streams[0]) == cudaSuccess)
            (void)cudaStreamWaitEvent(c->q->dev_stream, c->q->scratch, 0);
        (void)cudaSetDevice(old_dev);
        pthread_mutex_lock(&fn_mu);
        /* get, set, launches, restore; the record and wait before and after on deviceStream */
        fn_st.cuda_calls += 3 + (uint64_t)u->launched + (e != cudaSuccess) + (c->q->made == 1 ? 4 : 0);
        fn_thread_cuda_calls += 3 + (uint64_t)u->launched + (e != cudaSuccess) + (c->q->made == 1 ? 4 : 0);
        u->launching = 0;
        if (e != cudaSuccess) {
            u->n_streams = u->launched;
            u->fault = 1;
            c->state = ncclUnhandledCudaError;
            snprintf(c->err, sizeof c->err, "rank %d: launching on a stream failed: %s", c->rank, cudaGetErrorString(e));
            fn_unit_kill(u);
            res = ncclUnhandledCudaError;
        }
        pthread_cond_broadcast(&fn_cv);
        fn_unit_try_free(u);
        pthread_mutex_unlock(&fn_mu);
    }
    return res;
}

/* ---- lazy connection set-up (lock held unless said) ----
   NCCL connects a pair the first time it talks, not at init [src: enqueue.cc, p2pTaskAppend:
   the first send to a peer (receive from it) on a communicator sets connectSend[peer]
   (connectRecv[peer]) and queues the communicator for pre-connection]. The outermost
   ncclGroupEnd runs the set-up of every such communicator, at once, before it launches
   anything [src: group.cc, groupLaunch: ncclP2PPreconnectFunc jobs, asyncJobLaunch waits for
   all]: transport.cc, ncclTransportP2pSetup, for i = 1 .. n-1 with recvPeer = rank - i and
   sendPeer = rank + i: post this rank's halves to recvPeer and sendPeer, then block receiving
   the peers' halves (bootstrapRecv, same tag i << 8); one exchange where the two are the same
   rank. Then a second round, the same peers, empty messages (tag (i << 8) + 128): no rank
   leaves before its peers connected. So the host is held in ncclGroupEnd (a non-blocking
   communicator: its state stays ncclInProgress) until each new peer's host reaches its own
   set-up of the mirror connection; two ranks whose first exchanges are in different orders wait
   for each other forever. The masks are cleared after: each direction is set up once.
   Collectives connect the same way on first use of an algorithm [src: init.cc: runtimeConn =
   cuMemSupport && NCCL_RUNTIME_CONNECT (default 1); enqueue.cc, ncclPrepareTasks: algoNeedConnect;
   group.cc, ncclCollPreconnect: ncclTransportRingConnect, ...]; the imitation makes the first
   collective of a communicator wait for every rank's (a ring or a tree waits for its
   neighbours, and they for theirs). */
#define FN_TAG_COLL (-1)

typedef struct fn_step { int post, peer, tag, ns, nr; } fn_step;
typedef struct fn_setup {
    struct ncclComm* c;
    fn_step* st;
    int n, pc;
    ncclResult_t rc;
} fn_setup;

static inline void fn_setup_add(fn_setup* u, int post, int peer, int tag, int ns, int nr) {
    fn_step* x = &u->st[u->n++];
    x->post = post;
    x->peer = peer;
    x->tag = tag;
    x->ns = ns;
    x->nr = nr;
}

/* The program of ncclTransportP2pSetup for masks snd/rcv ([n], 1 where new), and of the first
   collective's connection. st holds 8n + 2n steps. */
static inline void fn_setup_build(fn_setup* u, const unsigned char* snd, const unsigned char* rcv, int coll) {
    int n = u->c->n, r = u->c->rank, i, round;
    for (round = 0; round < 2; round++)
        for (i = 1; i < n; i++) {
            int rp = (r - i + n) % n, sp = (r + i) % n, tag = (i << 8) + (round ? 128 : 0);
            int rm = rcv[rp], sm = snd[sp];
            if (sp == rp) {
                /* one peer both ways: one exchange of both halves [sendPeer == recvPeer] */
                if (rm || sm) {
                    fn_setup_add(u, 1, sp, tag, sm, rm);
                    fn_setup_add(u, 0, sp, tag, sm, rm);
                }
            } else {
                if (rm) fn_setup_add(u, 1, rp, tag, 0, 1);
                if (sm) fn_setup_add(u, 1, sp, tag, 1, 0);
                if (sm) fn_setup_add(u, 0, sp, tag, 1, 0);
                if (rm) fn_setup_add(u, 0, rp, tag, 0, 1);
            }
        }
    if (coll) {
        for (i = 0; i < n; i++)
            if (i != r) fn_setup_add(u, 1, i, FN_TAG_COLL, 0, 0);
        for (i = 0; i < n; i++)
            if (i != r) fn_setup_add(u, 0, i, FN_TAG_COLL, 0, 0);
    }
}

/* Runs one step if it can: 1 when it ran (or failed), 0 when it waits for a peer. */
static inline int fn_setup_step(fn_setup* u) {
    fn_step* x = &u->st[u->pc];
    fn_clique* cl = u->c->cl;
    fn_boot *m, *prev = NULL;
    if (x->post) {
        if (!(m = (fn_boot*)calloc(1, sizeof *m))) {
            u->rc = ncclSystemError;
            return 1;
        }
        m->src = u->c->rank;
        m->dst = x->peer;
        m->tag = x->tag;
        m->ns = x->ns;
        m->nr = x->nr;
        if (cl->boot_tail) cl->boot_tail->next = m;
        else cl->boot = m;
        cl->boot_tail = m;
        pthread_cond_broadcast(&fn_cv);
        u->pc++;
        return 1;
    }
    /* the oldest message of that peer and tag [src: bootstrap.cc, unexpectedDequeue] */
    for (m = cl->boot; m && !(m->dst == u->c->rank && m->src == x->peer && m->tag == x->tag); prev = m, m = m->next) {
    }
    if (!m) return 0;
    if (prev) prev->next = m->next;
    else cl->boot = m->next;
    if (cl->boot_tail == m) cl->boot_tail = prev;
    if (x->tag != FN_TAG_COLL && (x->tag & 128) == 0 &&
        (u->c->rank + (x->tag >> 8)) % u->c->n == (u->c->rank - (x->tag >> 8) + u->c->n) % u->c->n) {
        /* one peer both ways, data round: "Message truncated" if it sent more halves than this
           rank expects [src: bootstrap.cc, socketRecv]; halves that do not mirror this rank's
           would be read as the other direction's (sendData[p] = data[p]), which NCCL does not
           check: refused here */
        if (m->ns + m->nr > x->ns + x->nr || m->ns != x->nr || m->nr != x->ns) {
            char msg[240];
            snprintf(msg, sizeof msg,
                     "connection set-up: rank %d sets up %s rank %d while rank %d sets up %s it: the exchanged halves do not match",
                     u->c->rank, x->ns && x->nr ? "both ways with" : x->ns ? "a send to" : "a receive from", x->peer, x->peer,
                     m->ns && m->nr ? "both ways with" : m->ns ? "a send to" : "a receive from");
            fn_problem(msg);
            snprintf(u->c->err, sizeof u->c->err, "%s", msg);
            u->rc = ncclInternalError;
        }
    }
    free(m);
    u->pc++;
    return 1;
}

/* The connection set-up an outermost group end runs before it launches anything: every
   communicator of the group with a pair (or a collective) it has not used before, at once.
   Lock not held. ncclSuccess when all connected. */
static inline ncclResult_t fn_connect(fn_task* tasks, fakenccl_conn_stats* thread_count) {
    fn_setup su[64];
    int k = 0, i, left;
    fn_task* t;
    ncclResult_t res = ncclSuccess;
    double deadline, limit;
    pthread_mutex_lock(&fn_mu);
    if (fn_options()->eager_connect) {
        pthread_mutex_unlock(&fn_mu);
        return ncclSuccess;
    }
    limit = fn_options()->connect_timeout_s > 0 ? fn_options()->connect_timeout_s : 30.0;
    for (t = tasks; t && res == ncclSuccess; t = t->next) {
        struct ncclComm* c = t->comm;
        int n, found = 0, any = 0, coll = 0;
        unsigned char* mask;
        fn_task* x;
        if (!c || c->n < 2) continue;
        for (i = 0; i < k; i++) found |= su[i].c == c;
        if (found || k == 64) continue;
        n = c->n;
        if (!(mask = (unsigned char*)calloc(2 * (size_t)n, 1))) {
            res = ncclSystemError;
            break;
        }
        memset(&su[k], 0, sizeof su[k]);
        su[k].c = c;
        for (x = t; x; x = x->next) {
            if (x->comm != c) continue;
            if (x->kind == FN_SEND || x->kind == FN_RECV) {
                int d = x->kind == FN_RECV;
                if (x->peer != c->rank && !c->seen[2 * x->peer + d]) {
                    c->seen[2 * x->peer + d] = 1;
                    mask[d * n + x->peer] = 1;
                    any = 1;
                    fn_st.p2p_conns++;
                    if (d) thread_count->p2p_recv++;
                    else thread_count->p2p_send++;
                    thread_count->bytes += d ? FAKENCCL_CONN_BYTES : 0;
                }
            } else if (!c->coll_seen) {
                c->coll_seen = 1;
                coll = any = 1;
                fn_st.coll_setups++;
                thread_count->colls++;
                thread_count->bytes += FAKENCCL_CONN_BYTES;
            }
        }
        if (any && !(su[k].st = (fn_step*)calloc(10 * (size_t)n, sizeof(fn_step)))) res = ncclSystemError;
        if (any && su[k].st) {
            fn_setup_build(&su[k], mask, mask + n, coll);
            fn_st.connects++;
            thread_count->setups++;
            k++;
        }
        free(mask);
    }
    deadline = fn_now() + limit;
    for (;;) {
        int moved = 0;
        left = 0;
        for (i = 0; i < k; i++) {
            fn_setup* u = &su[i];
            while (u->pc < u->n && u->rc == ncclSuccess) {
                if (u->c->state == ncclRemoteError) u->rc = ncclRemoteError; /* aborted meanwhile */
                else if (fn_setup_step(u)) moved = 1;
                else break;
            }
            if (u->pc < u->n && u->rc == ncclSuccess) left++;
        }
        if (!left) break;
        if (moved) continue;
        if (fn_now() > deadline) {
            char msg[240];
            for (i = 0; i < k; i++)
                if (su[i].pc < su[i].n && su[i].rc == ncclSuccess) {
                    snprintf(msg, sizeof msg,
                             "connection set-up: rank %d's host waited %.3g s in ncclGroupEnd for rank %d to set up its side "
                             "(NCCL waits forever: a lazy-connection deadlock)",
                             su[i].c->rank, limit, su[i].st[su[i].pc].peer);
                    fn_problem(msg);
                    snprintf(su[i].c->err, sizeof su[i].c->err, "%s", msg);
                    su[i].rc = ncclSystemError;
                }
            continue;
        }
        {
            struct timespec ts; /* woken by any post; at the latest in 20 ms, for the deadline */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&fn_cv, &fn_mu, &ts);
        }
    }
    for (i = 0; i < k; i++) {
        if (su[i].rc != ncclSuccess && res == ncclSuccess) res = su[i].rc;
        free(su[i].st);
    }
    pthread_mutex_unlock(&fn_mu);
    return res;
}

static inline void fn_tasks_free(fn_task* t) {
    while (t) {
        fn_task* nx = t->next;
        free(t);
        t = nx;
    }
}

typedef struct fn_job {
    fn_task* tasks;
    fakenccl_conn_stats* connects; /* the issuing thread's fn_thread_conn */
    struct ncclComm* comms[64];
    int n;
    double delay;
} fn_job;

/* A non-blocking group's launch, in the background [UG: Nonblocking Group Operation]. Its delay
   ends early once a communicator of the group is aborted: NCCL's abort can be called at any
   point and stops what is under way [UG: Fault Tolerance, "ncclCommAbort can be called at any
   point"], it does not wait for the launch. */
static inline void* fn_job_main(void* arg) {
    fn_job* j = (fn_job*)arg;
    fn_task* t;
    int i;
    ncclResult_t cr;
    double end = fn_now() + j->delay;
    for (;;) {
        int stop = 0;
        double left = end - fn_now();
        pthread_mutex_lock(&fn_mu);
        for (i = 0; i < j->n; i++) stop |= j->comms[i]->state == ncclRemoteError; /* ncclCommAbort's mark */
        pthread_mutex_unlock(&fn_mu);
        if (stop || left <= 0) break;
        fn_sleep(left < 0.002 ? left : 0.002);
    }
    cr = fn_connect(j->tasks, j->connects); /* the host side of the set-up runs in the background too */
    pthread_mutex_lock(&fn_mu);
    for (t = j->tasks; t; t = t->next) {
        if (t->comm && cr != ncclSuccess && t->comm->state == ncclSuccess) t->comm->state = cr;
        if (t->comm && t->comm->state != ncclSuccess) t->comm = NULL; /* aborted meanwhile, or failed */
    }
    pthread_mutex_unlock(&fn_mu);
    (void)fn_launch(j->tasks);
    pthread_mutex_lock(&fn_mu);
    for (i = 0; i < j->n; i++) j->comms[i]->jobs--;
    pthread_cond_broadcast(&fn_cv);
    pthread_mutex_unlock(&fn_mu);
    fn_tasks_free(j->tasks);
    free(j);
    return NULL;
}

/* The outermost ncclGroupEnd: wait for inits of this group, issue the operations. */
static inline ncclResult_t fn_group_run(void) {
    fn_task* tasks = fn_tasks;
    ncclResult_t err = fn_group_err, res = ncclSuccess;
    int blocking = fn_group_blocking, i, n_inits = fn_n_group_inits;
    struct ncclComm* inits[64];
    memcpy(inits, fn_group_inits, sizeof(struct ncclComm*) * (size_t)n_inits);
    fn_tasks = fn_tasks_tail = NULL;
    fn_group_err = ncclSuccess;
    fn_group_blocking = -1;
    fn_n_group_inits = 0;
    if (err != ncclSuccess) {
        fn_tasks_free(tasks);
        return err;
    }
    pthread_mutex_lock(&fn_mu);
    for (i = 0; i < n_inits; i++) {
        struct ncclComm* c = inits[i];
        if (!c->blocking) {
            res = ncclInProgress;
            continue;
        }
        while (!c->cl->complete) pthread_cond_wait(&fn_cv, &fn_mu);
        if (c->state != ncclSuccess && res == ncclSuccess) res = c->state;
    }
    pthread_mutex_unlock(&fn_mu);
    if (!tasks) return res;
    if (blocking != 0) {
        ncclResult_t r = fn_connect(tasks, &fn_thread_conn); /* the host is held here until the peers set up theirs */
        if (r == ncclSuccess) r = fn_launch(tasks);
        fn_tasks_free(tasks);
        return r;
    } else {
        fn_job* j = (fn_job*)calloc(1, sizeof *j);
        fn_task* t;
        pthread_t th;
        if (!j) {
            fn_tasks_free(tasks);
            return ncclSystemError;
        }
        j->tasks = tasks;
        j->connects = &fn_thread_conn;
        pthread_mutex_lock(&fn_mu);
        for (t = tasks; t; t = t->next) {
            int k;
            for (k = 0; k < j->n && j->comms[k] != t->comm; k++) {
            }
            if (k == j->n && j->n < 64) {
                j->comms[j->n++] = t->comm;
                t->comm->jobs++;
            }
        }
        j->delay = fn_delay();
        pthread_mutex_unlock(&fn_mu);
        if (pthread_create(&th, NULL, fn_job_main, j) != 0) {
            fn_job_main(j); /* no thread: launch here */
            return ncclSuccess;
        }
        pthread_detach(th);
        return ncclInProgress;
    }
}

static inline ncclResult_t fn_group_error(ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress && fn_group_err == ncclSuccess) fn_group_err = r;
    return r;
}

static inline ncclResult_t fn_enqueue(int kind, const void* sbuf, void* rbuf, size_t count, ncclDataType_t dt,
                                      ncclRedOp_t red, int peer, struct ncclComm* c, cudaStream_t stream) {
    fn_task* t;
    ncclResult_t r;
    fn_call(kind == FN_SEND ? FAKENCCL_CALL_SEND : kind == FN_RECV ? FAKENCCL_CALL_RECV : FAKENCCL_CALL_COLL);
    if ((r = fn_ready(c)) != ncclSuccess) return fn_group_error(r);
    if ((unsigned)dt >= (unsigned)ncclNumTypes || (unsigned)red >= (unsigned)ncclNumOps)
        return fn_group_error(fn_fail(c, ncclInvalidArgument, "invalid datatype or reduction"));
    if (kind != FN_SEND && kind != FN_RECV && kind != FN_BROADCAST && kind != FN_ALLGATHER &&
        (dt == ncclFloat16 || dt == ncclBfloat16 || dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2))
        return fn_group_error(fn_fail(c, ncclInvalidArgument, "the imitation reduces int8 to float64 only"));
    if (peer < 0 || peer >= c->n)
        return fn_group_error(fn_fail(c, ncclInvalidArgument, kind == FN_SEND || kind == FN_RECV ? "peer out of range" : "root out of range"));
    if (count && ((kind != FN_RECV && !sbuf && !(kind == FN_BROADCAST && c->rank != peer)) ||
                  (kind != FN_SEND && !rbuf && !(kind == FN_REDUCE && c->rank != peer))))
        return fn_group_error(fn_fail(c, ncclInvalidArgument, "NULL buffer"));
    if (fn_group_blocking == -1) fn_group_blocking = c->blocking;
    else if (fn_group_blocking != c->blocking)
        return fn_group_error(fn_fail(c, ncclInvalidArgument, "Blocking and nonblocking communicators are not allowed in the same group."));
    if (!(t = (fn_task*)calloc(1, sizeof *t))) return fn_group_error(ncclSystemError);
    t->kind = kind;
    t->peer = peer;
    t->comm = c;
    t->stream = stream;
    t->sbuf = sbuf;
    t->rbuf = rbuf;
    t->count = count;
    t->dt = dt;
    t->red = red;
    if (fn_tasks_tail) fn_tasks_tail->next = t;
    else fn_tasks = t;
    fn_tasks_tail = t;
    if (fn_depth > 0) return ncclSuccess;
    return fn_group_run();
}

/* NCCL_MULTI_RANK_GPU_ENABLE set to a non-zero number: several ranks may share a device (2.30) */
static inline int fn_multi_rank_gpu(void) {
    const char* e = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    return e && atoi(e) != 0;
}

/* lock held: every rank joined; the duplicate-GPU check, then the states */
static inline void fn_clique_done(fn_clique* cl) {
    int i, j, di = -1, dj = -1;
    double now = fn_now();
    fn_clique** pp;
    for (pp = &fn_joining; *pp; pp = &(*pp)->next)
        if (*pp == cl) {
            *pp = cl->next;
            break;
        }
    cl->next = NULL;
    cl->complete = 1;
    for (i = 0; i < cl->n && di < 0 && !fn_multi_rank_gpu(); i++)
        for (j = i + 1; j < cl->n; j++)
            if (cl->comms[i]->dev == cl->comms[j]->dev) {
                di = i;
                dj = j;
                break;
            }
    for (i = 0; i < cl->n; i++) {
        struct ncclComm* c = cl->comms[i];
        if (di >= 0) {
            c->state = ncclInvalidUsage;
            snprintf(c->err, sizeof c->err,
                     "Multiple Ranks are using the same GPU/Partition (ranks %d and %d on CUDA device %d). Set "
                     "NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.",
                     di, dj, cl->comms[di]->dev);
        } else {
            c->state = ncclSuccess;
        }
        c->ready_at = c->blocking ? 0 : now + fn_delay();
    }
    pthread_cond_broadcast(&fn_cv);
}

/* lock held */
static inline fn_clique* fn_clique_new(int n) {
    fn_clique* cl = (fn_clique*)calloc(1, sizeof *cl);
    if (!cl) return NULL;
    cl->comms = (struct ncclComm**)calloc((size_t)n, sizeof(struct ncclComm*));
    cl->conn = (fn_conn*)calloc((size_t)n * (size_t)n, sizeof(fn_conn));
    if (!cl->comms || !cl->conn) {
        free(cl->comms);
        free(cl->conn);
        free(cl);
        return NULL;
    }
    cl->n = n;
    return cl;
}

/* lock held: the last communicator of a clique is gone */
static inline void fn_clique_free(fn_clique* cl) {
    int i;
    fn_clique** pp;
    for (pp = &fn_joining; *pp; pp = &(*pp)->next)
        if (*pp == cl) {
            *pp = cl->next;
            break;
        }
    for (i = 0; i < cl->n * cl->n; i++) {
        fn_conn* c = &cl->conn[i];
        while (c->sh) {
            fn_unit* u = c->sh->u;
            fn_pop(u, &c->sh, &c->st);
            u->cl = NULL;
            fn_unit_try_free(u);
        }
        while (c->rh) {
            fn_unit* u = c->rh->u;
            fn_pop(u, &c->rh, &c->rt);
            u->cl = NULL;
            fn_unit_try_free(u);
        }
    }
    while (cl->colls) {
        fn_coll* r = cl->colls;
        cl->colls = r->next;
        for (i = 0; i < cl->n; i++)
            if (r->ops[i]) r->ops[i]->rec = NULL;
        free(r->ops);
        free(r);
    }
    while (cl->splits) {
        fn_split* s = cl->splits;
        cl->splits = s->next;
        fn_split_free(s);
    }
    while (cl->boot) {
        fn_boot* m = cl->boot;
        cl->boot = m->next;
        free(m);
    }
    free(cl->comms);
    free(cl->conn);
    free(cl);
}

/* lock held: the handle goes; what other ranks still need of the clique stays */
static inline void fn_comm_free(struct ncclComm* c) {
    fn_unit* u;
    fn_clique* cl = c->cl;
    while ((u = c->units) != NULL) {
        c->units = u->cnext;
        u->comm = NULL;
        fn_unit_try_free(u);
    }
    c->split = NULL;
    fn_queue_put(c->q);
    free(c->seen);
    if (cl) {
        cl->comms[c->rank] = NULL;
        if (!cl->complete) cl->joined--;
        if (--cl->live == 0) fn_clique_free(cl);
    }
    free(c);
}

/* lock held: share, a launch order to share (a split of a parent that shares resources), or NULL
   for a new one */
static inline struct ncclComm* fn_comm_new(fn_clique* cl, int rank, int dev, int blocking, int split_share, fn_queue* share) {
    struct ncclComm* c = (struct ncclComm*)calloc(1, sizeof *c);
    if (!c) return NULL;
    c->seen = (unsigned char*)calloc(2 * (size_t)cl->n, 1);
    c->q = share ? share : (fn_queue*)calloc(1, sizeof(fn_queue));
    if (!c->seen || !c->q) {
        free(c->seen);
        if (!share) free(c->q);
        free(c);
        return NULL;
    }
    c->q->refs++;
    c->split_share = split_share;
    c->cl = cl;
    c->rank = rank;
    c->n = cl->n;
    c->dev = dev;
    c->blocking = blocking;
    c->state = ncclInProgress;
    cl->comms[rank] = c;
    cl->live++;
    return c;
}

static inline int fn_config_blocking(const ncclConfig_t* cfg, int inherit, ncclResult_t* r) {
    *r = ncclSuccess;
    if (!cfg) return inherit;
    if (cfg->magic != FAKENCCL_CONFIG_MAGIC || cfg->size < sizeof(size_t) + 2 * sizeof(unsigned) + sizeof(int)) {
        *r = ncclInvalidArgument; /* "Not initialized config will result in NCCL error" */
        return 1;
    }
    return cfg->blocking == NCCL_CONFIG_UNDEF_INT ? 1 : cfg->blocking != 0;
}

/* config.splitShare as NCCL settles it: the config's (0 when unset), a NULL config the parent's
   (inherit), and NCCL_COMM_SPLIT_SHARE_RESOURCES over either [src: init.cc, envConfigOverride,
   run for every new communicator, splits included]. NCCL reads the variable once per process;
   the imitation at every init and split, so that a test can set it. */
static inline int fn_config_split_share(const ncclConfig_t* cfg, int inherit) {
    const char* e = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
    int v = cfg ? (cfg->splitShare == NCCL_CONFIG_UNDEF_INT ? 0 : cfg->splitShare != 0) : inherit;
    if (e && *e) v = atoi(e) != 0;
    return v;
}

/* ---- the API ---------------------------------------------------------------------------------- */

static inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

static inline const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->err : fn_last_err; }

static inline ncclResult_t ncclGetVersion(int* version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    uint64_t k;
    if (!id) return ncclInvalidArgument;
    pthread_mutex_lock(&fn_mu);
    fn_st.calls[FAKENCCL_CALL_OTHER]++;
    k = ++fn_next_id;
    pthread_mutex_unlock(&fn_mu);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "fakenccl", 8);
    memcpy(id->internal + 8, &k, sizeof k);
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    ncclResult_t r;
    int blocking, dev = 0;
    fn_clique* cl;
    struct ncclComm* c;
    fn_call(FAKENCCL_CALL_INIT);
    if (!comm) return fn_fail(NULL, ncclInvalidArgument, "comm argument is NULL");
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) return fn_fail(NULL, ncclInvalidArgument, "invalid rank or nranks");
    blocking = fn_config_blocking(config, 1, &r);
    if (r != ncclSuccess) return fn_fail(NULL, r, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    if (memcmp(id.internal, "fakenccl", 8) != 0) return fn_fail(NULL, ncclInvalidArgument, "not a unique id from ncclGetUniqueId");
    (void)cudaGetDevice(&dev);
    pthread_mutex_lock(&fn_mu);
    for (cl = fn_joining; cl && memcmp(cl->id, id.internal, NCCL_UNIQUE_ID_BYTES) != 0; cl = cl->next) {
    }
    if (cl && (cl->n != nranks || cl->comms[rank])) {
        pthread_mutex_unlock(&fn_mu);
        return fn_fail(NULL, ncclInvalidUsage, cl->n != nranks ? "ranks disagree on nranks" : "a rank joined twice");
    }
    if (!cl) {
        if (!(cl = fn_clique_new(nranks))) {
            pthread_mutex_unlock(&fn_mu);
            return ncclSystemError;
        }
        memcpy(cl->id, id.internal, NCCL_UNIQUE_ID_BYTES);
        cl->next = fn_joining;
        fn_joining = cl;
    }
    if (!(c = fn_comm_new(cl, rank, dev, blocking, fn_config_split_share(config, 0), NULL))) {
        if (cl->live == 0) fn_clique_free(cl);
        pthread_mutex_unlock(&fn_mu);
        return ncclSystemError;
    }
    *comm = c;
    if (++cl->joined == cl->n) fn_clique_done(cl);
    if (fn_depth > 0) {
        if (fn_n_group_inits < 64) fn_group_inits[fn_n_group_inits++] = c;
        pthread_mutex_unlock(&fn_mu);
        return ncclSuccess;
    }
    if (!blocking) {
        pthread_mutex_unlock(&fn_mu);
        return ncclInProgress;
    }
    while (!cl->complete) pthread_cond_wait(&fn_cv, &fn_mu);
    r = c->state;
    pthread_mutex_unlock(&fn_mu);
    return r;
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

static inline ncclResult_t ncclGroupStart(void) {
    fn_call(FAKENCCL_CALL_GROUP_START);
    fn_depth++;
    return ncclSuccess;
}

static inline ncclResult_t ncclGroupEnd(void) {
    fn_call(FAKENCCL_CALL_GROUP_END);
    if (fn_depth == 0) return fn_fail(NULL, ncclInvalidUsage, "ncclGroupEnd: not in a group call.");
    if (--fn_depth > 0) return ncclSuccess;
    return fn_group_run();
}

static inline ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
    ncclUniqueId id;
    int i, j, old = 0;
    ncclResult_t r;
    if (!comms || ndev < 1) return ncclInvalidArgument;
    for (i = 0; devlist && i < ndev; i++)
        for (j = 0; j < i; j++)
            if (devlist[i] == devlist[j] && !fn_multi_rank_gpu())
                return fn_fail(NULL, ncclInvalidUsage, "duplicate device in devlist (NCCL_MULTI_RANK_GPU_ENABLE=1 allows it)");
    if ((r = ncclGetUniqueId(&id)) != ncclSuccess) return r;
    (void)cudaGetDevice(&old);
    ncclGroupStart();
    for (i = 0; i < ndev; i++) {
        if (cudaSetDevice(devlist ? devlist[i] : i) != cudaSuccess) {
            fn_group_error(ncclInvalidArgument);
            continue;
        }
        fn_group_error(ncclCommInitRank(comms + i, ndev, id, i));
    }
    r = ncclGroupEnd();
    (void)cudaSetDevice(old);
    return r;
}

/* lock held: every parent rank called the split */
static inline void fn_split_done(fn_clique* parent, fn_split* s) {
    int n = parent->n, i, j;
    int* order = (int*)malloc(sizeof(int) * (size_t)n);
    if (!order) return;
    for (i = 0; i < n; i++) {
        int col = s->color[i], m = 0, first = 1, gone = 0;
        fn_clique* cl;
        if (col == NCCL_SPLIT_NOCOLOR) continue;
        for (j = 0; j < i; j++)
            if (s->color[j] == col) first = 0;
        if (!first) continue;
        /* members of this colour, by key, equal keys by parent rank */
        for (j = 0; j < n; j++) {
            int at;
            if (s->color[j] != col) continue;
            for (at = m; at > 0 && s->key[order[at - 1]] > s->key[j]; at--) order[at] = order[at - 1];
            order[at] = j;
            m++;
        }
        if (!(cl = fn_clique_new(m))) continue;
        for (j = 0; j < m; j++) {
            int pr = order[j];
            /* "comm->shareResources = ... comm->config.splitShare": the parent's setting decides
               whether the child takes the parent's sharedRes, and so its deviceStream [src:
               init.cc, ncclCommSplit and commAlloc] */
            struct ncclComm* pc = parent->comms[pr];
            struct ncclComm* c;
            if (!pc) { /* that rank called the split, then aborted its parent: its child never joins (below) */
                gone = 1;
                continue;
            }
            c = fn_comm_new(cl, j, pc->dev, s->blocking[pr], s->share[pr], pc->split_share ? pc->q : NULL);
            /* a blocking parent returns with *newcomm set; a non-blocking one gets it written
               when its own state is next seen leaving ncclInProgress (fn_state) */
            if (c && parent->comms[pr]->blocking) *s->out[pr] = c;
            else s->child[pr] = c;
        }
        cl->joined = m;
        for (j = 0; j < m && cl->comms[j]; j++) {
        }
        if (j == m) fn_clique_done(cl);
        else { /* out of memory, or a member that aborted its parent (its part of the split's bootstrap
                  never answers: NCCL's bootstrap fails the others [src: bootstrap.cc, a closed
                  socket]): the ranks made so far fail */
            for (j = 0; j < m; j++)
                if (cl->comms[j]) {
                    cl->comms[j]->state = gone ? ncclRemoteError : ncclSystemError;
                    if (gone) snprintf(cl->comms[j]->err, sizeof cl->comms[j]->err, "a member of the split aborted its parent");
                }
            cl->complete = 1;
        }
    }
    free(order);
    s->done = 1;
    pthread_cond_broadcast(&fn_cv);
}

static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    ncclResult_t r;
    fn_split* s;
    fn_clique* cl;
    int child_blocking, n;
    fn_call(FAKENCCL_CALL_SPLIT);
    if (!newcomm) return fn_fail(comm, ncclInvalidArgument, "newcomm argument is NULL");
    if ((r = fn_ready(comm)) != ncclSuccess) return r;
    child_blocking = fn_config_blocking(config, comm->blocking, &r);
    if (r != ncclSuccess) return fn_fail(comm, r, "ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
    *newcomm = NULL;
    cl = comm->cl;
    n = cl->n;
    pthread_mutex_lock(&fn_mu);
    for (s = cl->splits; s && s->seq != comm->split_seq; s = s->next) {
    }
    if (!s) {
        s = (fn_split*)calloc(1, sizeof *s);
        if (s) {
            s->color = (int*)calloc((size_t)n, sizeof(int));
            s->key = (int*)calloc((size_t)n, sizeof(int));
            s->blocking = (int*)calloc((size_t)n, sizeof(int));
            s->share = (int*)calloc((size_t)n, sizeof(int));
            s->out = (ncclComm_t**)calloc((size_t)n, sizeof(ncclComm_t*));
            s->child = (ncclComm_t*)calloc((size_t)n, sizeof(ncclComm_t));
        }
        if (!s || !s->color || !s->key || !s->blocking || !s->share || !s->out || !s->child) {
            fn_split_free(s);
            pthread_mutex_unlock(&fn_mu);
            return ncclSystemError;
        }
        s->seq = comm->split_seq;
        s->next = cl->splits;
        cl->splits = s;
    }
    comm->split_seq++;
    s->color[comm->rank] = color < 0 ? NCCL_SPLIT_NOCOLOR : color;
    s->key[comm->rank] = key;
    s->blocking[comm->rank] = child_blocking;
    s->share[comm->rank] = fn_config_split_share(config, comm->split_share);
    s->out[comm->rank] = newcomm;
    if (++s->arrived == n) fn_split_done(cl, s);
    if (!comm->blocking) {
        comm->split = s;
        comm->ready_at = fn_now() + fn_delay();
        pthread_mutex_unlock(&fn_mu);
        return ncclInProgress;
    }
    while (!s->done) pthread_cond_wait(&fn_cv, &fn_mu);
    r = *newcomm ? (*newcomm)->state : ncclSuccess;
    pthread_mutex_unlock(&fn_mu);
    return r == ncclInProgress ? ncclSuccess : r;
}

static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (!comm || !asyncError) return ncclInvalidArgument;
    pthread_mutex_lock(&fn_mu);
    fn_st.calls[FAKENCCL_CALL_ASYNC_ERROR]++;
    *asyncError = fn_state(comm);
    pthread_mutex_unlock(&fn_mu);
    return ncclSuccess;
}

/* The queries (ncclCommCount, ncclCommCuDevice, ncclCommUserRank): counted, the pointer
   checked, the communicator ready (fn_ready); then *out is its size, device or rank. */
enum { FN_Q_COUNT, FN_Q_DEVICE, FN_Q_RANK };
static inline ncclResult_t fn_comm_query(const ncclComm_t comm, int* out, int what) {
    ncclResult_t r;
    fn_call(FAKENCCL_CALL_OTHER);
    if (!out) return ncclInvalidArgument;
    if ((r = fn_ready(comm)) != ncclSuccess) return r;
    *out = what == FN_Q_COUNT ? comm->n : what == FN_Q_DEVICE ? comm->dev : comm->rank;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    return fn_comm_query(comm, count, FN_Q_COUNT);
}
static inline ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    return fn_comm_query(comm, device, FN_Q_DEVICE);
}
static inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    return fn_comm_query(comm, rank, FN_Q_RANK);
}

/* lock held: the communicator's kernels are all done */
static inline int fn_comm_quiet(const struct ncclComm* c) {
    const fn_unit* u;
    if (c->jobs > 0) return 0;
    for (u = c->units; u; u = u->cnext)
        if (!u->done) return 0;
    return 1;
}

/* Flushes the communicator's operations: blocking, it returns when they completed. */
static inline ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    fn_call(FAKENCCL_CALL_FINALIZE);
    if (!comm) return ncclInvalidArgument;
    pthread_mutex_lock(&fn_mu);
    comm->finalizing = 1;
    if (!comm->blocking) {
        pthread_mutex_unlock(&fn_mu);
        return ncclInProgress;
    }
    while (!fn_comm_quiet(comm)) pthread_cond_wait(&fn_cv, &fn_mu);
    pthread_mutex_unlock(&fn_mu);
    return ncclSuccess;
}

/* Waits for the communicator's operations (a stuck one: forever), then frees it. */
static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    fn_call(FAKENCCL_CALL_DESTROY);
    if (!comm) return ncclSuccess;
    pthread_mutex_lock(&fn_mu);
    while (!comm->cl->complete || !fn_comm_quiet(comm)) pthread_cond_wait(&fn_cv, &fn_mu);
    fn_comm_free(comm);
    pthread_mutex_unlock(&fn_mu);
    return ncclSuccess;
}

/* Stops the communicator's operations at once and frees it; the peers are not told. */
static inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
    fn_unit* u;
    fn_call(FAKENCCL_CALL_ABORT);
    if (!comm) return ncclSuccess;
    pthread_mutex_lock(&fn_mu);
    comm->state = ncclRemoteError; /* a background launch still pending drops its kernels */
    comm->ready_at = 0;
    if (fn_options()->abort_seen && comm->cl) {
        int j;
        for (j = 0; j < comm->cl->n; j++) {
            struct ncclComm* o = comm->cl->comms[j];
            if (!o || o == comm || o->state != ncclSuccess) continue;
            o->state = ncclRemoteError;
            snprintf(o->err, sizeof o->err, "rank %d of the communicator aborted (a peer that failed)", comm->rank);
        }
    }
    while (comm->jobs > 0) pthread_cond_wait(&fn_cv, &fn_mu);
    for (u = comm->units; u; u = u->cnext) fn_unit_kill(u);
    fn_comm_free(comm);
    pthread_cond_broadcast(&fn_cv);
    pthread_mutex_unlock(&fn_mu);
    return ncclSuccess;
}

static inline ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
    return fn_enqueue(FN_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

static inline ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                    cudaStream_t stream) {
    return fn_enqueue(FN_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

static inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return fn_enqueue(FN_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

static inline ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
    return fn_enqueue(FN_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

static inline ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    return fn_enqueue(FN_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

static inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream) {
    return fn_enqueue(FN_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

static inline ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return fn_enqueue(FN_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

/* ---- the imitation's switches and counters ---- */

/* Process-wide; set between tests, while no operation is under way. */
static inline void fakenccl_set_options(const fakenccl_options* o) {
    pthread_mutex_lock(&fn_mu);
    fn_options();
    if (o) fn_opt = *o;
    if (fn_opt.launch_delay_s < 0) fn_opt.launch_delay_s = 0;
    pthread_mutex_unlock(&fn_mu);
}

static inline fakenccl_options fakenccl_get_options(void) {
    fakenccl_options o;
    pthread_mutex_lock(&fn_mu);
    o = *fn_options();
    pthread_mutex_unlock(&fn_mu);
    return o;
}

static inline void fakenccl_stats_get(fakenccl_stats* out) {
    pthread_mutex_lock(&fn_mu);
    *out = fn_st;
    pthread_mutex_unlock(&fn_mu);
}

/* fakenccl_stats.cuda_calls made in the calling thread so far (its group ends). */
static inline uint64_t fakenccl_thread_cuda_calls(void) { return fn_thread_cuda_calls; }
/* NCCL's own streams of comm's shared resources (fn_internal_streams): NULL until its first
   call or launch once ready, or without them (no_internal_streams). For tests of the rule. */
static inline void fakenccl_comm_streams(ncclComm_t comm, cudaStream_t* dev, cudaStream_t* host) {
    pthread_mutex_lock(&fn_mu);
    *dev = comm && comm->q && comm->q->made == 1 ? comm->q->dev_stream : NULL;
    *host = comm && comm->q && comm->q->made == 1 ? comm->q->host_stream : NULL;
    pthread_mutex_unlock(&fn_mu);
}

/* Connection set-ups of groups the calling thread issued (fakenccl_stats.connects), so far. */
static inline uint64_t fakenccl_thread_connects(void) {
    uint64_t n;
    pthread_mutex_lock(&fn_mu);
    n = fn_thread_conn.setups;
    pthread_mutex_unlock(&fn_mu);
    return n;
}

/* What the groups the calling thread issued set up, so far (fakenccl_conn_stats). */
static inline void fakenccl_thread_connections(fakenccl_conn_stats* out) {
    pthread_mutex_lock(&fn_mu);
    *out = fn_thread_conn;
    pthread_mutex_unlock(&fn_mu);
}

/* Zeroes the counters (not pending, which is a state). */
static inline void fakenccl_stats_reset(void) {
    uint64_t pending;
    pthread_mutex_lock(&fn_mu);
    pending = fn_st.pending;
    memset(&fn_st, 0, sizeof fn_st);
    fn_st.pending = pending;
    pthread_mutex_unlock(&fn_mu);
}

static inline const char* fakenccl_call_name(int kind) {
    static const char* const names[FAKENCCL_CALL_KINDS] = {"ncclSend", "ncclRecv", "collective", "ncclGroupStart",
                                                           "ncclGroupEnd", "init", "ncclCommSplit", "ncclCommFinalize",
                                                           "ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError",
                                                           "other"};
    return kind >= 0 && kind < FAKENCCL_CALL_KINDS ? names[kind] : "?";
}

/* Why the last stuck operation is stuck (a size mismatch), "" if none; copied into out. */
static inline void fakenccl_problem(char* out, size_t cap) {
    if (!out || !cap) return;
    pthread_mutex_lock(&fn_mu);
    snprintf(out, cap, "%s", fn_problem_msg);
    fn_problem_msg[0] = 0;
    pthread_mutex_unlock(&fn_mu);
}

#ifdef __cplusplus
}
#endif
#endif /* FAKENCCL_NCCL_H */
