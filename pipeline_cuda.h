/* pipeline_cuda.h - CUDA backend for pipeline.h: stages as streams on one or several GPUs.
   v0.1.0   public domain / MIT (see pipeline.h)

   Include after (or instead of) pipeline.h; in the one file that defines PIPELINE_IMPLEMENTATION
   it also compiles its implementation. Link with -lcudart -lpthread. The header is C99 and C++
   (nvcc, g++, gcc with the CUDA include path all work); it never launches a kernel itself.

   WHAT IT DOES
   One process, one host thread per pipeline rank (pp_threads_run), one CUDA stream per rank on
   the rank's GPU (several ranks may share a GPU: their streams run concurrently). Three pieces:
   - pp_cuda_transport(c, rank): isend/irecv/wait matched on the host like the threads transport,
     but the bytes move on the GPU, pulled by the receiver's stream: the sender records an event
     after its producing work (isend); when the receiver waits, its stream waits on that event,
     copies with cudaMemcpyPeerAsync (a plain device copy within one GPU, a peer copy between
     GPUs, peer access enabled where the hardware has it) and records a copy-done event. A wait
     therefore returns when the transfer is enqueued and ordered, not when the GPU finished it:
     the host runs ahead and enqueues whole steps, and nothing synchronises the device in the
     steady state. A send tests done once its copy is enqueued (its receiver waited for it), so
     the block pool, which grows instead of waiting in its first steps, comes to hold blocks for
     the sends in flight; a wait on a send returns once its receive is posted. The sender's
     stream waits for the copy-done event only when the block is taken from the pool again (the
     device ops' reuse hook), and not even then when it already waited for a later event of the
     receiver's stream. A sender that reuses a block before its receiver got to the wait (a pool
     still short of blocks, or shapes that change) first copies it into a spare on its own GPU,
     on a side stream of its own (after the data, ahead of its later work), and the receiver
     copies from the spare: no host thread ever waits for another, neither rank's later work
     delays the copy, and a receive enqueues nothing until its wait. Each rank's spare is made
     in pp_cuda_step_end of the pool's warm-up (the rank's largest device send plus an eighth);
     without a free one large enough the copy goes onto the receiver's stream at once. Steady
     path: 4 CUDA calls per device transfer (data-ready record, stream wait, copy, copy-done
     record), a fifth on some reuses, no host waits (bench/bench_imitation).
     Buffers in host memory (BROADCAST's step metadata) are copied at match time: they must be
     ready when isend is called. Device blocks sent through this transport must come from
     pp_cuda_device_ops (its reuse hook keeps them safe). A receive whose wait fails, or that the
     stage cancels after a failed step, is withdrawn: no later message lands in its block.
   - pp_cuda_device_ops(c, rank): pp_stage_desc.device hooks, so the stage's block pool (stashes,
     received activations, gradient workspaces) lives in GPU memory: cudaMalloc while the pool
     grows (its first four steps at most, _PP_POOL_WARM_STEPS, where it also makes room for the
     sends still in flight), never after with shapes that stay the same; cudaMemsetAsync on the
     rank's stream for zeroing; cudaMemcpyAsync on it for an evaluation's outputs (pp_stage_eval:
     into host or device memory, in place once the stream got there, e.g. after
     pp_cuda_step_end).
     Sizes come from the step plan (exact bytes of every micro-batch, variable lengths included)
     and the pool holds exactly the schedule's peak of live stashes (pp_step_stats.peak_live
     equals the simulator's peak_live). pp_cuda_memory reports the bytes each rank holds.
     Their copy hook (a copy on the rank's stream, waited for) lets pipeline.h's gradient norm,
     clipping and loss scaler (>>grad) reach gradients in GPU memory: name the rank's ops in
     pp_grad_buf.device. No kernel: each call copies the gradients to the host and, to scale
     them, back, 64Ki elements at a time.
   - a timeline: with desc.timeline set, a timed event pair brackets every action on the rank's
     stream; pp_cuda_step_end turns them into per-rank busy time, the step's span and its measured
     bubble fraction, and pp_cuda_timeline into pp_event records for pp_timeline_chrome (one
     track per rank; an interleaved rank's chunks share its track, named in each slice).
   - NVTX (PP_NVTX defined where the implementation is compiled): one range per action on the
     rank's host thread, named like the timeline's slices plus the stage ("F3.1 s2"), over the
     same span as the timeline's event pair; nsys projects it onto the kernels the action
     launched. The CUDA toolkit's header-only <nvtx3/nvToolsExt.h>; nothing to link (docs/gpu.md).

   USAGE
       pp_cuda* c; pp_cuda_desc cd = {0}; cd.n_ranks = p; cd.timeline = 1;
       pp_cuda_create(&cd, &c, &err);
       // per rank (a thread): pp_cuda_bind(c, rank, &err) first, then
       d.transport = pp_cuda_transport(c, rank);
       d.device = pp_cuda_device_ops(c, rank);
       d.layer_ctx = <your per-rank context holding pp_cuda_stream(c, rank)>;
       // layers launch their kernels on that stream (io->ctx), never synchronise it
       pp_cuda_step_begin(c, &err);   // between steps, from one thread
       ... every rank runs pp_stage_step ...
       pp_cuda_step_end(c, &info, &err);   // waits for the GPUs; span, busy, bubble
       // a step failed on some rank: every rank returned an error; then pp_cuda_reset(c)

   AFTER A FAILED STEP
   Every rank returns an error (the failing one its own, the others PP_ERR_ABORTED). Once all
   returned, pp_cuda_reset(c) waits for the GPUs, withdraws whatever the failed step left posted
   and clears the abort: the next step is as if the failed one never ran (its gradients are
   partial: zero them or start the step again). Shapes may change from step to step.

   RESTRICTIONS (each a clear error, never a crash)
   - Device blocks need PP_SHAPES_LOCAL or PP_SHAPES_BROADCAST (pp_stage_create answers
     PP_ERR_UNSUPPORTED for AUTO and PER_MESSAGE, which write headers into blocks on the host).
   - The transport has no allreduce_sum (NULL): tied layers in one process are summed by the
     caller after the step (examples/gpt_cuda.cu does).
   - The loss layer's io->loss is a host float: a GPU loss layer should write its micro-batch
     loss to device memory and let the caller read it after pp_cuda_step_end. The default NaN/Inf
     loss check (pp_stage_desc.allow_nonfinite_loss) reads io->loss when the loss layer returns:
     it catches a loss the layer hands over on the host, not one left on the device (io->loss
     stays 0); check that one after pp_cuda_step_end. check_finite (every tensor) reads blocks
     on the host and is refused with device blocks.
   - Events of different GPUs are aligned through per-rank origin events recorded at
     pp_cuda_step_begin on idle streams: the timeline is exact within a GPU, within a few
     microseconds across GPUs.

   ERRORS
   CUDA errors become pp_result values with a message naming the call, file and line
   (PP_CUDA_CHECK, pp_cuda_status); cudaErrorMemoryAllocation is PP_ERR_NOMEM, the rest
   PP_ERR_TRANSPORT; no CUDA device is PP_ERR_UNSUPPORTED at pp_cuda_create. Nothing exits.
*/
#ifndef PIPELINE_CUDA_H
#define PIPELINE_CUDA_H

#include "pipeline.h"
/* The release of pipeline.h this header belongs to. Against another, compiling stops with an
   #error naming this header's version, then an include of a file named after both versions
   ("pipeline.h is version 0.2.0 but pipeline_cuda.h is 0.1.0": no such file), since #error cannot
   print a macro's value. */
#define PP_CUDA_VERSION 100 /* 0.1.0, PP_VERSION's encoding */
#define PP_CUDA_VERSION_STRING "0.1.0"
#if !defined(PP_VERSION) || PP_VERSION != PP_CUDA_VERSION
#error "pipeline_cuda.h 0.1.0 (PP_VERSION 100) and pipeline.h differ in version: use the headers of one release (pipeline.h's version is in the next error)"
#define _PPC_SKEW2(text) #text
#define _PPC_SKEW(maj, min, pat) _PPC_SKEW2(pipeline.h is version maj.min.pat but pipeline_cuda.h is 0.1.0)
#include _PPC_SKEW(PP_VERSION_MAJOR, PP_VERSION_MINOR, PP_VERSION_PATCH)
#endif
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_cuda pp_cuda;

typedef struct pp_cuda_desc {
    int n_ranks;                /* pipeline ranks (1 .. PP_MAX_RANKS) */
    const int* devices;         /* devices[r]: GPU of rank r; NULL = every rank on device 0 */
    int timeline;               /* bracket every action with timed events (pp_cuda_step_end) */
    /* How long a host wait on a rank's GPU work may take (0: PP_DEFAULT_TIMEOUT_S): a block's
       free, the device ops' copy, pp_cuda_step_begin/step_end/reset and pp_cuda_destroy poll the
       streams against it instead of blocking in cudaStreamSynchronize, so a kernel that never
       ends (an NCCL receive whose peer died) cannot hold the host forever. After a timeout the
       rank is stuck: its later frees return at once and leak the block (cudaFree would wait for
       the same kernel), its zero and copy fail with PP_ERR_TIMEOUT, pp_cuda_error says why. */
    double timeout_s;
} pp_cuda_desc;

/* What pp_cuda_step_end measured for the step since pp_cuda_step_begin. Times in seconds. */
typedef struct pp_cuda_step_info {
    double span;                /* first action start to last action end, over all ranks */
    double bubble;              /* 1 - sum(busy) / (n_ranks * span) */
    double busy[PP_MAX_RANKS];  /* sum of the rank's action times */
    int n_actions[PP_MAX_RANKS];
} pp_cuda_step_info;

/* CUDA error -> pp_result with "CUDA error N (name: text) in <what> at file:line" in err. */
pp_result pp_cuda_status(cudaError_t e, const char* what, const char* file, int line, pp_error* err);
/* Inside a function returning pp_result: return the error of a failing CUDA call. */
#define PP_CUDA_CHECK(call, err)                                                          \
    do {                                                                                  \
        cudaError_t pp_cuda_e_ = (call);                                                  \
        if (pp_cuda_e_ != cudaSuccess) return pp_cuda_status(pp_cuda_e_, #call, __FILE__, __LINE__, (err)); \
    } while (0)

pp_result pp_cuda_create(const pp_cuda_desc* d, pp_cuda** out, pp_error* err);
void pp_cuda_destroy(pp_cuda* c);
/* Makes the rank's GPU current on the calling thread (call first in every rank thread). */
pp_result pp_cuda_bind(pp_cuda* c, int rank, pp_error* err);
pp_transport pp_cuda_transport(pp_cuda* c, int rank);
pp_device_ops pp_cuda_device_ops(pp_cuda* c, int rank);
cudaStream_t pp_cuda_stream(pp_cuda* c, int rank);
int pp_cuda_device(pp_cuda* c, int rank);
/* Bytes of GPU memory the rank's block pool holds (with the spares of its early copies), and
   cudaMalloc calls it made for them (cumulative). */
void pp_cuda_memory(pp_cuda* c, int rank, size_t* bytes, int* allocs);
/* The last CUDA error a hook or the transport met on this rank ("" if none). */
const char* pp_cuda_error(pp_cuda* c, int rank);
/* After a failed step, once every rank returned from pp_stage_step (one thread): waits for the
   GPUs, withdraws every message still posted or matched but never waited for (a request of the
   failed step is stale afterwards: waiting on it fails with PP_ERR_INVALID), and clears the
   abort, so the next step starts clean. */
pp_result pp_cuda_reset(pp_cuda* c);
/* Messages posted by one side only, and how many of them are receives (0 between clean steps;
   after a failed step the stages have withdrawn their receives, sends may remain). */
size_t pp_cuda_pending(pp_cuda* c, size_t* recvs);
/* Between steps, from one thread: waits for every rank's streams, then starts the timeline. */
pp_result pp_cuda_step_begin(pp_cuda* c, pp_error* err);
/* After every rank returned from pp_stage_step: waits for the GPUs and measures (info may be
   NULL; times are zero without desc.timeline). */
pp_result pp_cuda_step_end(pp_cuda* c, pp_cuda_step_info* info, pp_error* err);
/* The last step's actions as events (seconds from the first start), rank-major; returns how
   many there are (writes at most cap). Needs desc.timeline and pp_cuda_step_end. */
size_t pp_cuda_timeline(pp_cuda* c, pp_event* ev, size_t cap);

/* >>cuda-pipeline: pipeline.h's one-process layer (pp_pipeline) with every rank a CUDA stream.
       pp_pipeline_desc d = {0};  ... as for pp_pipeline_create ...
       pp_cuda_desc cd = {0}; cd.devices = gpus; cd.timeline = 1;
       pp_cuda_pipeline_create(&d, &cd, &pl, &err);
       pp_pipeline_step(pl, &batch, &stats);   // returns when the GPUs finished the step
   Each rank's stage gets the CUDA transport, device ops (its block pool in GPU memory) and a
   pp_cuda_layer_ctx as layer_ctx: layers launch their work on io->ctx's stream. A step binds
   every rank thread to its GPU and runs between pp_cuda_step_begin and pp_cuda_step_end. */
typedef struct pp_cuda_layer_ctx {
    cudaStream_t stream;        /* the rank's stream: enqueue the layer's work here, never synchronise it */
    int rank, device;
    void* user;                 /* the desc's stage.layer_ctx, the same for every rank */
} pp_cuda_layer_ctx;

/* cd may be NULL (every rank on device 0, no timeline); cd->n_ranks is 0 or the pipeline's p.
   d->stage.device must be zero (the pipeline's device ops hold the blocks); rank_setup sees
   each rank's filled desc and may wrap its transport. Shapes: LOCAL or BROADCAST. Linked under a
   name carrying pipeline.h's struct-sizing configuration, like pp_pipeline_create. */
#define pp_cuda_pipeline_create _PP_ABI(cuda_pipeline_create)
pp_result pp_cuda_pipeline_create(const pp_pipeline_desc* d, const pp_cuda_desc* cd, pp_pipeline** out, pp_error* err);
/* The pipeline's CUDA world (streams, pool memory, event timeline), or NULL for another pipeline. */
pp_cuda* pp_cuda_pipeline_world(pp_pipeline* pl);
/* What pp_cuda_step_end measured for the last step (zero without cd->timeline), or NULL for
   another pipeline. */
const pp_cuda_step_info* pp_cuda_pipeline_info(const pp_pipeline* pl);

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_CUDA_H */

/* >>impl-cuda ================================================================================= */
#if defined(PIPELINE_IMPLEMENTATION) && !defined(PIPELINE_CUDA_IMPLEMENTATION_DONE)
#define PIPELINE_CUDA_IMPLEMENTATION_DONE

#ifdef PP_NVTX
#include <nvtx3/nvToolsExt.h> /* the CUDA toolkit's header-only NVTX: a range per action (_ppc_nvtx) */
#endif

#ifdef __cplusplus
extern "C" {
#endif

pp_result pp_cuda_status(cudaError_t e, const char* what, const char* file, int line, pp_error* err) {
    if (e == cudaSuccess) return PP_OK;
    return _pp_fail(err, e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_TRANSPORT,
                    "CUDA error %d (%s: %s) in %s at %s:%d", (int)e, cudaGetErrorName(e), cudaGetErrorString(e),
                    what ? what : "?", file ? file : "?", line);
}

/* One message between two ranks, from the first post to the last release. */
typedef struct _ppc_msg {
    struct _ppc_msg* next;      /* in the receiver's queue, or the free list */
    struct _ppc_msg* all;       /* every message ever made, for pp_cuda_destroy */
    struct _ppc_msg* pnext;     /* in the sender's list of messages whose copy may read its block */
    uint64_t gen;               /* bumped at every reuse of the record: older requests are stale */
    int live;                   /* posted and not yet released by both sides */
    int held;                   /* on that list: not released before its block is reused */
    int src, dst, tag;
    const void* sbuf;
    void* rbuf;
    size_t sbytes, rbytes;
    int s_host, r_host;         /* buffer in host memory */
    int has_send, has_recv;
    int copying;                /* a thread is enqueueing the copy */
    int copied;                 /* the copy is enqueued (device) or done (host), or will never be */
    int dropped;                /* no copy: the receive was withdrawn, or the sizes differ */
    int send_done, recv_done;   /* each side released it */
    int side;                   /* staged early in a spare on the sender's side stream (its block was reused) */
    struct _ppc_spare* spare;   /* side: the spare holding the bytes (sbuf points into it) */
    pp_result rc;
    cudaEvent_t es;             /* sender's device: its data is ready (side: the spare is filled) */
    cudaEvent_t ec;             /* receiver's device: the copy is done */
    uint64_t es_seq, ec_seq;    /* their places among the records on their streams (side: on `side`) */
    char emsg[200];             /* what went wrong, for the side that reports it */
} _ppc_msg;

/* Device memory of a sender's GPU holding a sent block's bytes from its early copy until the
   receiver's copy has read them (_ppc_side_copy), reused after that. */
typedef struct _ppc_spare {
    struct _ppc_spare* next;
    void* p;
    size_t cap;
    cudaEvent_t done;           /* the last receiver's copy out of it (an event of rank done_rank), or NULL */
    int done_rank;
} _ppc_spare;

#define _PPC_HOST_SEEN 32 /* host buffers a rank remembers (_ppc_is_host) */

typedef struct _ppc_rank {
    pp_cuda* c;
    int rank, dev;
    cudaStream_t stream;        /* the stage's compute stream; incoming copies run on it too */
    cudaStream_t side;          /* early copies of this rank's sends (_ppc_side_copy), made at the
                                   first (owner thread); NULL: on `stream` */
    int want_side;              /* the device's work queues leave room for it (_ppc_side_streams) */
    _ppc_msg* queue;            /* messages to this rank posted by one side only */
    _ppc_msg* reading;          /* sent from this rank's device blocks; the copy may still read */
    uint64_t rec_seq;           /* transport events recorded on the stream so far (world lock) */
    uint64_t* seen;             /* [n]: the last of rank q's records this stream waited for */
    uint64_t side_seq;          /* early-copy events recorded on `side` so far (world lock) */
    _ppc_spare* spares;         /* free spares of this rank's early copies (world lock) */
    size_t spare_bytes;
    uint64_t early_fallbacks;   /* early copies that found no free spare (world lock) */
    size_t send_max;            /* the largest device send so far (owner thread) */
    uint64_t* seen_side;        /* [n]: the last of rank q's side records this stream waited for */
    cudaEvent_t* ev;            /* free sync events of this device (world lock) */
    int n_ev, cap_ev;
    /* memory: the block pool, sorted by address (tells device blocks from host buffers) */
    char** pool_p;
    size_t* pool_n;
    int n_pool, cap_pool;
    size_t pool_bytes;
    int pool_allocs;
    const void* host_seen[_PPC_HOST_SEEN]; /* buffers CUDA called host memory (the stage's plan-check and
                                   agreement buffers, step after step), the oldest replaced first;
                                   owner thread only */
    int n_host_seen;
    /* timeline */
    cudaEvent_t origin;
    cudaEvent_t* tev;           /* [2 * tcap]: start, end of action idx */
    pp_action* tact;
    int tcap, n_marked, origin_ok;
    double busy;
    int nvtx_open;              /* PP_NVTX: a range pushed by nvtx_thread is open (owner thread) */
    pthread_t nvtx_thread;
    int stuck;                  /* a host wait on this rank's streams ran into the deadline (owner thread) */
    char err[256];
} _ppc_rank;

struct pp_cuda {
    int n;
    int timeline;
    double timeout_s;           /* pp_cuda_desc.timeout_s, resolved */
    int steps_ended;            /* pp_cuda_step_end calls (spares are made in the pool's warm-up) */
    _ppc_rank* r;
    _ppc_msg* free_msgs;
    _ppc_msg* all_msgs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int aborted;
    pp_result abort_code;
    char abort_msg[256];
    /* last measured step */
    pp_event* events;
    size_t n_events, cap_events;
};

static void _ppc_note(_ppc_rank* r, cudaError_t e, const char* what) {
    snprintf(r->err, sizeof r->err, "CUDA error %d (%s) in %s on rank %d (device %d)", (int)e, cudaGetErrorString(e),
             what, r->rank, r->dev);
}

/* Host waits on the GPU poll against a deadline (the design's "every wait has a timeout"): a
   kernel that never ends, such as an NCCL receive whose peer died, would hold a
   cudaStreamSynchronize or cudaEventSynchronize forever. q is cudaStreamQuery or cudaEventQuery's
   answer; the naps grow from 2 us to 1 ms, so a short wait costs little more than a
   synchronize. Returns cudaSuccess, the work's error, or cudaErrorNotReady once the deadline passed. */
static cudaError_t _ppc_poll(cudaStream_t s, cudaEvent_t ev, double deadline) {
    long nap_ns = 2000;
    for (;;) {
        struct timespec ts;
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
        if (e != cudaErrorNotReady || _pp_now() > deadline) return e;
        ts.tv_sec = 0;
        ts.tv_nsec = nap_ns;
        nanosleep(&ts, NULL);
        if (nap_ns < 1000000L) nap_ns *= 2;
    }
}

/* The rank's stream and side stream, each until the deadline; then as _ppc_poll. */
static cudaError_t _ppc_drain(_ppc_rank* r, double deadline) {
    cudaError_t e = r->stream ? _ppc_poll(r->stream, NULL, deadline) : cudaSuccess;
    if (e == cudaSuccess && r->side) e = _ppc_poll(r->side, NULL, deadline);
    return e;
}

/* A host wait on rank r ran into its deadline: r is stuck from now on (pp_cuda_desc.timeout_s). */
static void _ppc_stuck(_ppc_rank* r, const char* what) {
    if (r->stuck) return;
    r->stuck = 1;
    (void)cudaGetLastError();
    snprintf(r->err, sizeof r->err,
             "timeout: rank %d (device %d): %s: the GPU work before it did not finish in %.3g s (a kernel that never "
             "ends, e.g. an NCCL transfer whose peer failed); blocks freed from now on are leaked",
             r->rank, r->dev, what, r->c->timeout_s);
}

/* Where a buffer lives: one of the rank's pool blocks (no runtime call), one CUDA called host
   memory before (no call either: under unified addressing the driver reserves the device
   addresses, so a host address never becomes device memory), else as CUDA says. */
static int _ppc_is_host(_ppc_rank* r, const void* p) {
    struct cudaPointerAttributes at;
    int lo = 0, hi = r->n_pool - 1, i;
    if (!p) return 1;
    for (i = 0; i < _PPC_HOST_SEEN; i++)
        if (r->host_seen[i] == p) return 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((const char*)p < r->pool_p[mid]) hi = mid - 1;
        else if ((const char*)p >= r->pool_p[mid] + r->pool_n[mid]) lo = mid + 1;
        else return 0;
    }
    memset(&at, 0, sizeof at);
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        at.type = cudaMemoryTypeUnregistered;
    }
    if (at.type != cudaMemoryTypeUnregistered && at.type != cudaMemoryTypeHost) return 0;
    r->host_seen[r->n_host_seen++ % _PPC_HOST_SEEN] = p;
    return 1;
}

/* A sync event of rank r's device, from its pool (made on r's device while the pool grows). */
static cudaError_t _ppc_ev_get(pp_cuda* c, _ppc_rank* r, cudaEvent_t* out) {
    cudaEvent_t e = NULL;
    cudaError_t err;
    int cur = -1;
    pthread_mutex_lock(&c->mu);
    if (r->n_ev > 0) e = r->ev[--r->n_ev];
    pthread_mutex_unlock(&c->mu);
    if (e) {
        *out = e;
        return cudaSuccess;
    }
    if (cudaGetDevice(&cur) != cudaSuccess || (cur != r->dev && cudaSetDevice(r->dev) != cudaSuccess)) cur = -1;
    err = cudaEventCreateWithFlags(out, cudaEventDisableTiming);
    if (cur >= 0 && cur != r->dev) (void)cudaSetDevice(cur);
    return err;
}

/* Returns an event to its rank's pool (no runtime call: any thread); world lock held. An event
   goes back once every wait on it is enqueued: a wait keeps the record it was enqueued for. */
static void _ppc_ev_put_locked(_ppc_rank* r, cudaEvent_t e) {
    if (!e) return;
    if (r->n_ev == r->cap_ev) {
        int cap = r->cap_ev ? 2 * r->cap_ev : 16;
        cudaEvent_t* nv = (cudaEvent_t*)PP_MALLOC(sizeof(cudaEvent_t) * (size_t)cap);
        if (!nv) {
            (void)cudaEventDestroy(e); /* rare: lose the pooling, not the event */
            return;
        }
        if (r->ev) memcpy(nv, r->ev, sizeof(cudaEvent_t) * (size_t)r->n_ev);
        PP_FREE(r->ev);
        r->ev = nv;
        r->cap_ev = cap;
    }
    r->ev[r->n_ev++] = e;
}

static _ppc_msg* _ppc_msg_new_locked(pp_cuda* c) {
    _ppc_msg* m = c->free_msgs;
    _ppc_msg* all;
    uint64_t gen = 0;
    if (m) {
        c->free_msgs = m->next;
        all = m->all;
        gen = m->gen;
    } else {
        if (!(m = (_ppc_msg*)PP_MALLOC(sizeof *m))) return NULL;
        all = c->all_msgs;
        c->all_msgs = m;
    }
    memset(m, 0, sizeof *m);
    m->all = all;
    m->gen = gen + 1;
    m->live = 1;
    return m;
}

/* Both sides are done (or the world was reset): give the events back and recycle the message.
   World lock held. */
static void _ppc_msg_release_locked(pp_cuda* c, _ppc_msg* m) {
    if (m->spare) { /* free again once the receiver's copy out of it is done: the spare keeps ec */
        _ppc_spare* sp = m->spare;
        if (m->ec && m->copied && !m->dropped) {
            sp->done = m->ec;
            sp->done_rank = m->dst;
            m->ec = NULL;
        }
        sp->next = c->r[m->src].spares;
        c->r[m->src].spares = sp;
        m->spare = NULL;
    }
    _ppc_ev_put_locked(&c->r[m->dst], m->ec);
    _ppc_ev_put_locked(&c->r[m->src], m->es);
    m->ec = m->es = NULL;
    m->live = 0;
    m->held = 0;
    m->gen++; /* requests of this use are stale from now on */
    m->next = c->free_msgs;
    c->free_msgs = m;
}

/* A request carries its message and the message's generation; a request that finished keeps
   its result (done, id = 2 + rc). */
static void _ppc_req_post(pp_request* req, _ppc_msg* m, int is_recv) {
    req->impl = m;
    req->id = (int64_t)(m->gen << 1) | is_recv;
    req->done = 0;
}

static void _ppc_req_finished(pp_request* req, pp_result rc) {
    req->done = 1;
    req->impl = NULL;
    req->id = 2 + (int64_t)rc;
}

/* The request's message, or NULL when pp_cuda_reset withdrew it (its record was reused). */
static _ppc_msg* _ppc_req_msg(const pp_request* req) {
    _ppc_msg* m = (_ppc_msg*)req->impl;
    return m && (int64_t)(m->gen << 1) == (req->id & ~(int64_t)1) ? m : NULL;
}

/* Enqueues a matched message's copy on the receiver's stream, after the sender's data is ready,
   and records ec after it. Any thread (CUDA allows copies, records of a stream's own device's
   events and waits on any device's events whatever the current device); the caller claimed
   m->copying. Host buffers: a host send is copied at match time (the sender may reuse its
   buffer once matched); a host receive returns with the bytes there. */
/* A device-to-device copy of m's bytes on `stream`: a plain copy within one GPU, a peer copy
   between two. */
static cudaError_t _ppc_dev_copy(const pp_cuda* c, const _ppc_msg* m, cudaStream_t stream) {
    int sdev = c->r[m->src].dev, ddev = c->r[m->dst].dev;
    if (sdev == ddev) return cudaMemcpyAsync(m->rbuf, m->sbuf, m->rbytes, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(m->rbuf, ddev, m->sbuf, sdev, m->rbytes, stream);
}

/* A copy step `what` failed with e: its message in m->emsg, the CUDA error cleared. */
static pp_result _ppc_copy_failed(_ppc_msg* m, cudaError_t e, const char* what) {
    snprintf(m->emsg, sizeof m->emsg, "CUDA error %d (%s) in %s, copying %zu bytes from rank %d to rank %d", (int)e,
             cudaGetErrorString(e), what, m->rbytes, m->src, m->dst);
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_TRANSPORT;
}

static void _ppc_do_copy(pp_cuda* c, _ppc_msg* m) {
    _ppc_rank* dst = &c->r[m->dst];
    cudaError_t e = cudaSuccess;
    const char* what = "";
    pp_result rc = PP_OK;
    size_t n = m->rbytes;
    if (n == 0) {
        /* nothing to move */
    } else if (m->s_host && m->r_host) {
        memcpy(m->rbuf, m->sbuf, n);
    } else {
        if (!m->s_host) {
            int waited;
            uint64_t* seen = m->side ? dst->seen_side : dst->seen; /* es on the sender's side stream, or its stream */
            pthread_mutex_lock(&c->mu);
            waited = seen[m->src] >= m->es_seq; /* a later record of that stream: the bytes are ready */
            pthread_mutex_unlock(&c->mu);
            what = m->side ? "cudaStreamWaitEvent(sender's early copy done)" : "cudaStreamWaitEvent(sender's data ready)";
            if (!waited) e = cudaStreamWaitEvent(dst->stream, m->es, 0);
            pthread_mutex_lock(&c->mu);
            if (e == cudaSuccess && m->es_seq > seen[m->src]) seen[m->src] = m->es_seq;
            pthread_mutex_unlock(&c->mu);
        }
        if (e == cudaSuccess) {
            if (!m->s_host && !m->r_host) {
                what = "cudaMemcpyPeerAsync";
                e = _ppc_dev_copy(c, m, dst->stream);
            } else {
                /* one side in host memory (step metadata): not the steady-state path */
                what = "cudaMemcpyAsync (host <-> device)";
                e = cudaMemcpyAsync(m->rbuf, m->sbuf, n, cudaMemcpyDefault, dst->stream);
                if (e == cudaSuccess && m->r_host) e = cudaStreamSynchronize(dst->stream);
            }
        }
        if (e == cudaSuccess && m->ec) {
            /* numbered under the lock: the numbers follow the records' order on the stream */
            what = "cudaEventRecord(copy done)";
            pthread_mutex_lock(&c->mu);
            e = cudaEventRecord(m->ec, dst->stream);
            m->ec_seq = ++dst->rec_seq;
            pthread_mutex_unlock(&c->mu);
        }
        if (e != cudaSuccess) rc = _ppc_copy_failed(m, e, what);
    }
    pthread_mutex_lock(&c->mu);
    m->rc = rc;
    m->copied = 1;
    m->copying = 0;
    if (rc != PP_OK) m->dropped = 1;
    _ppc_ev_put_locked(&c->r[m->src], m->es); /* the wait on it is enqueued */
    m->es = NULL;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* World lock held, m matched: copies it now unless another thread does; returns with m copied
   (a sender's early copy into a spare leaves it to copy after that). */
static void _ppc_copy_now_locked(pp_cuda* c, _ppc_msg* m) {
    while (!m->copied) {
        if (m->copying) { /* another thread is enqueueing it */
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        m->copying = 1;
        pthread_mutex_unlock(&c->mu);
        _ppc_do_copy(c, m);
        pthread_mutex_lock(&c->mu);
    }
}

/* World lock held: both sides are posted. The sizes must agree; a host send is copied now. */
static int _ppc_matched_locked(_ppc_msg* m) {
    if (m->sbytes != m->rbytes) {
        m->rc = PP_ERR_SIZE;
        m->copied = m->dropped = 1;
        snprintf(m->emsg, sizeof m->emsg, "rank %d sent %zu bytes with tag %d, rank %d posted a receive of %zu bytes",
                 m->src, m->sbytes, m->tag, m->dst, m->rbytes);
        return 0;
    }
    if (!m->s_host || m->copied || m->copying) return 0;
    m->copying = 1; /* the caller copies it */
    return 1;
}

/* The sender's side is over (its wait, or its test once copied). The copy may still read the
   block (it runs on the receiver's stream, when the receiver waits for it): the message stays on the
   rank's `reading` list, and the stream waits for the copy only when the block is reused
   (_ppc_reuse), so the sender never idles for its receiver. Sender's thread. */
static pp_result _ppc_send_finish(_ppc_rank* me, _ppc_msg* m) {
    pp_cuda* c = me->c;
    pp_result rc;
    pthread_mutex_lock(&c->mu);
    rc = m->rc;
    if (rc != PP_OK) snprintf(me->err, sizeof me->err, "%s", m->emsg);
    m->send_done = 1;
    if (!m->s_host && !m->dropped && m->rbytes > 0) {
        m->held = 1;
        m->pnext = me->reading;
        me->reading = m;
    } else if (m->recv_done) {
        _ppc_msg_release_locked(c, m);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The receiver's side: the copy is enqueued on its own stream (nothing more to wait for on the
   device), or was done on the host. Receiver's thread, m matched. */
static pp_result _ppc_recv_finish(_ppc_rank* me, _ppc_msg* m) {
    pp_cuda* c = me->c;
    pp_result rc;
    pthread_mutex_lock(&c->mu);
    _ppc_copy_now_locked(c, m);
    rc = m->rc;
    if (rc != PP_OK) snprintf(me->err, sizeof me->err, "%s", m->emsg);
    m->recv_done = 1;
    if (m->send_done && !m->held) _ppc_msg_release_locked(c, m);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* World lock held: m leaves its sender's `reading` list. */
static void _ppc_unhold_locked(pp_cuda* c, _ppc_msg* m) {
    _ppc_msg** pp;
    for (pp = &c->r[m->src].reading; *pp; pp = &(*pp)->pnext)
        if (*pp == m) {
            *pp = m->pnext;
            break;
        }
    m->held = 0;
    if (m->recv_done) _ppc_msg_release_locked(c, m);
}

/* Takes rank r's smallest free spare of at least n bytes, or NULL. World lock held. */
static _ppc_spare* _ppc_spare_take_locked(_ppc_rank* r, size_t n) {
    _ppc_spare *sp, **pp, **best = NULL;
    for (pp = &r->spares; (sp = *pp) != NULL; pp = &sp->next)
        if (sp->cap >= n && (!best || sp->cap < (*best)->cap)) best = pp;
    if (!best) return NULL;
    sp = *best;
    *best = sp->next;
    sp->next = NULL;
    return sp;
}

/* Frees rank r's free spares (none may still be read: streams drained), their events back to
   their pools. World lock held (or no other thread). */
static void _ppc_spares_free_locked(pp_cuda* c, _ppc_rank* r) {
    _ppc_spare* sp;
    while ((sp = r->spares) != NULL) {
        r->spares = sp->next;
        _ppc_ev_put_locked(&c->r[sp->done_rank], sp->done);
        if (cudaFree(sp->p) != cudaSuccess) (void)cudaGetLastError();
        r->spare_bytes -= sp->cap;
        PP_FREE(sp);
    }
}

/* The sender's early copy (m->copying set by the caller, world lock not held), when it reuses a
   block its receiver has not pulled yet: the bytes go into sp, a spare on this GPU, on the rank's
   side stream after the data (m->es, recorded after the producing work) and after the spare's
   last reader (the receiver of its previous use); then m->es is recorded again there (the spare
   is filled) and the rank's stream waits for it before the block is written again. The message
   now sends from the spare: its receiver copies it as usual, after that record. The receiver's
   block is not touched, so nothing waits for the receiver's work; on the rank's own stream the
   copy would queue behind everything enqueued since the data was made, and the receiver with
   it (DualPipeV on an H200: a whole action per early copy, 1.12x its ideal step). Sender's
   thread. */
static void _ppc_side_copy(pp_cuda* c, _ppc_rank* r, _ppc_msg* m, _ppc_spare* sp) {
#ifdef PP_TEST_EARLY_COPY_ON_STREAM /* the negative control of test_cuda_host's early copy test */
    cudaStream_t side = r->stream;
#else
    cudaStream_t side;
    /* made at the first early copy, not at create: a stream takes one of the device's hardware
       work queues whether used or not, and pp_cuda's device ops alone (under pipeline_nccl.h,
       whose queue count has no room for it) never make one; failing, the copy goes on `stream` */
    if (r->want_side && !r->side) {
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess || (cur != r->dev && cudaSetDevice(r->dev) != cudaSuccess) ||
            cudaStreamCreateWithFlags(&r->side, cudaStreamNonBlocking) != cudaSuccess) {
            (void)cudaGetLastError();
            r->side = NULL;
        }
        if (cur >= 0 && cur != r->dev) (void)cudaSetDevice(cur);
        r->want_side = 0; /* made, or not to be tried again */
    }
    side = r->side ? r->side : r->stream;
#endif
    int own = side == r->stream; /* no side stream: stream order already puts it after the data */
    cudaError_t e = cudaSuccess;
    const char* what = "";
    pp_result rc = PP_OK;
    if (sp->done) {
        what = "cudaStreamWaitEvent(spare free)";
#ifndef PP_CUDA_TEST_SPARE_NO_WAIT /* negative control (build/cuda-controls): the spare reused at once */
        e = cudaStreamWaitEvent(side, sp->done, 0);
#endif
    }
    if (e == cudaSuccess && !own) {
        what = "cudaStreamWaitEvent(sender's data ready, early copy)";
        e = cudaStreamWaitEvent(side, m->es, 0);
    }
    if (e == cudaSuccess) {
        what = "cudaMemcpyAsync (early copy into a spare)";
        e = cudaMemcpyAsync(sp->p, m->sbuf, m->sbytes, cudaMemcpyDeviceToDevice, side);
    }
    pthread_mutex_lock(&c->mu);
    if (sp->done) { /* its wait is enqueued */
        _ppc_ev_put_locked(&c->r[sp->done_rank], sp->done);
        sp->done = NULL;
    }
    if (e == cudaSuccess) {
        what = "cudaEventRecord(early copy done)";
        e = cudaEventRecord(m->es, side);
        m->es_seq = ++r->side_seq;
    }
    if (e == cudaSuccess && !own) {
        what = "cudaStreamWaitEvent(early copy done, before the block is reused)";
        e = cudaStreamWaitEvent(r->stream, m->es, 0);
    }
    if (e != cudaSuccess) { /* no copy will be made: the receiver gets the error */
        rc = _ppc_copy_failed(m, e, what);
        m->copied = m->dropped = 1;
        sp->next = r->spares;
        r->spares = sp;
    } else {
        m->sbuf = sp->p;
        m->spare = sp;
        m->side = 1;
    }
    m->rc = rc;
    m->copying = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Device ops reuse hook: a pooled block [ptr, ptr + bytes) is about to be written again. The
   rank's stream waits for every copy that may still read it, unless it already waited for a
   later event of the copy's stream; a copy its receiver has not yet enqueued is made now, on
   this rank's side stream (_ppc_side_copy), so no host waits for another. */
static void _ppc_reuse(void* user, void* ptr, size_t bytes) {
    _ppc_rank* r = (_ppc_rank*)user;
    pp_cuda* c = r->c;
    _ppc_msg* m;
    _ppc_spare* sp;
    const char *a = (const char*)ptr, *b = a + bytes;
    int again = 1, early;
    pthread_mutex_lock(&c->mu);
    while (again) {
        again = 0;
        for (m = r->reading; m; m = m->pnext) {
            const char* s0 = (const char*)m->sbuf;
            if (!(s0 < b && s0 + m->sbytes > a)) continue;
            early = !m->copied && !m->copying && !m->dropped && m->es && !m->side;
            if (early && (sp = _ppc_spare_take_locked(r, m->sbytes)) != NULL) {
                /* the receiver has not pulled it yet: into a spare now, on this rank's side
                   stream. On the receiver's stream the copy would wait there for this rank's
                   data ahead of work that does not need it; on this rank's own stream, behind
                   this rank's later work. */
                m->copying = 1;
                pthread_mutex_unlock(&c->mu);
                _ppc_side_copy(c, r, m, sp);
                pthread_mutex_lock(&c->mu);
            } else { /* pulled, or no spare free: the copy goes onto the receiver's stream now */
                if (early) r->early_fallbacks++;
                _ppc_copy_now_locked(c, m); /* may drop the lock: start over afterwards */
            }
            if (!m->side && !m->dropped && m->ec && r->seen[m->dst] < m->ec_seq) {
                cudaError_t e = cudaStreamWaitEvent(r->stream, m->ec, 0);
                if (e != cudaSuccess) _ppc_note(r, e, "cudaStreamWaitEvent(copy done, before a block is reused)");
                else r->seen[m->dst] = m->ec_seq;
            }
            _ppc_unhold_locked(c, m);
            again = 1;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* After every stream drained (between steps): no copy reads a block any more. */
static void _ppc_unhold_all(pp_cuda* c) {
    int i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++)
        while (c->r[i].reading) _ppc_unhold_locked(c, c->r[i].reading);
    pthread_mutex_unlock(&c->mu);
}

/* Finds the posting of the other side in `queue` (same source, tag, opposite kind: first in,
   first out) and unlinks it, or appends a new message there. World lock held. */
static _ppc_msg* _ppc_post_locked(pp_cuda* c, _ppc_msg** queue, int src, int dst, int tag, int is_recv) {
    _ppc_msg *x, **pp;
    for (pp = queue; (x = *pp) != NULL; pp = &x->next)
        if (x->src == src && x->tag == tag && (is_recv ? !x->has_recv : !x->has_send)) {
            *pp = x->next;
            x->next = NULL;
            return x;
        }
    if (!(x = _ppc_msg_new_locked(c))) return NULL;
    x->src = src;
    x->dst = dst;
    x->tag = tag;
    *pp = x; /* appended: equal (source, tag) pairs match first in first out */
    return x;
}

/* What a send and a receive check and take before they post: the arguments, *req cleared,
   whether buf is host memory (*host), and for device memory an event (*ev) for the data or the
   copy (what names the call in the rank's CUDA error). */
static pp_result _ppc_post_begin(_ppc_rank* me, int peer, const void* buf, size_t bytes, pp_request* req, int* host,
                                 cudaEvent_t* ev, const char* what) {
    cudaError_t e;
    if (!req || peer < 0 || peer >= me->c->n || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    *host = _ppc_is_host(me, buf);
    if (!*host && bytes && (e = _ppc_ev_get(me->c, me, ev)) != cudaSuccess) {
        _ppc_note(me, e, what);
        return PP_ERR_TRANSPORT;
    }
    return PP_OK;
}

static pp_result _ppc_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    cudaEvent_t es = NULL;
    cudaError_t e;
    int host, copy_now, matched;
    pp_result rc = _ppc_post_begin(me, peer, buf, bytes, req, &host, &es, "isend (an event for the data)");
    if (rc != PP_OK) return rc;
    pthread_mutex_lock(&c->mu);
    if (es && (e = cudaEventRecord(es, me->stream)) != cudaSuccess) {
        _ppc_note(me, e, "isend (recording the data-ready event)");
        _ppc_ev_put_locked(me, es);
        pthread_mutex_unlock(&c->mu);
        return PP_ERR_TRANSPORT;
    }
    if (!(m = _ppc_post_locked(c, &c->r[peer].queue, me->rank, peer, tag, 0))) {
        _ppc_ev_put_locked(me, es);
        pthread_mutex_unlock(&c->mu);
        return PP_ERR_NOMEM;
    }
    m->has_send = 1;
    m->sbuf = buf;
    m->sbytes = bytes;
    m->s_host = host;
    m->es = es;
    m->es_seq = es ? ++me->rec_seq : 0;
    if (es && bytes > me->send_max) me->send_max = bytes;
    matched = m->has_recv;
    copy_now = matched && _ppc_matched_locked(m);
    _ppc_req_post(req, m, 0);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (copy_now) _ppc_do_copy(c, m);
#ifdef PP_CUDA_TEST_SEND_DONE_AT_POST /* negative control (build/cuda-controls): done at the receive's post */
    copy_now = 1;
#endif
    if (matched && copy_now) _ppc_req_finished(req, _ppc_send_finish(me, m));
    return PP_OK;
}

static pp_result _ppc_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    cudaEvent_t ec = NULL;
    int host, copy_now;
    pp_result rc = _ppc_post_begin(me, peer, buf, bytes, req, &host, &ec, "irecv (an event for the copy)");
    if (rc != PP_OK) return rc;
    /* nothing is enqueued: only this rank's stream writes the block (the copy runs there, after
       the block's earlier uses; a sender's early copy goes into a spare) */
    pthread_mutex_lock(&c->mu);
    if (!(m = _ppc_post_locked(c, &me->queue, peer, me->rank, tag, 1))) {
        _ppc_ev_put_locked(me, ec);
        pthread_mutex_unlock(&c->mu);
        return PP_ERR_NOMEM;
    }
    m->has_recv = 1;
    m->rbuf = buf;
    m->rbytes = bytes;
    m->r_host = host;
    m->ec = ec;
    copy_now = m->has_send && _ppc_matched_locked(m);
    _ppc_req_post(req, m, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (copy_now) _ppc_do_copy(c, m);
    return PP_OK;
}

static double _ppc_now_real(struct timespec* ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    return (double)ts->tv_sec + 1e-9 * (double)ts->tv_nsec;
}

/* Waits (world lock held) until cond holds, the world aborts, or the deadline passes. */
#define _PPC_WAIT_UNTIL(c, cond, deadline)                                                       \
    do {                                                                                         \
        while (!(cond) && !(c)->aborted) {                                                       \
            struct timespec ts_;                                                                 \
            double now_ = _ppc_now_real(&ts_);                                                   \
            if (now_ >= (deadline)) break;                                                       \
            {                                                                                    \
                double nd_ = now_ + 0.05 < (deadline) ? now_ + 0.05 : (deadline);               \
                ts_.tv_sec = (time_t)nd_;                                                        \
                ts_.tv_nsec = (long)((nd_ - (double)ts_.tv_sec) * 1e9);                          \
                pthread_cond_timedwait(&(c)->cv, &(c)->mu, &ts_);                                \
            }                                                                                    \
        }                                                                                        \
    } while (0)

static pp_result _ppc_cancel(void* self, pp_request* req);

/* A send's wait returns once its receive is posted; a receive's once its copy is enqueued on this
   rank's stream (the host runs ahead: the stream, not the host, waits for the data). A send
   whose wait times out stays posted (the executor probes sends with short waits); a receive
   whose wait fails is withdrawn: its request is over, and no later message may land in its
   buffer. */
static pp_result _ppc_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    struct timespec ts;
    double deadline = _ppc_now_real(&ts) + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    int is_send, peer, tag, matched, aborted;
    pp_result rc;
    if (!req) return _pp_fail(err, PP_ERR_INVALID, "wait on a NULL request");
    if (req->done) {
        rc = req->id >= 2 ? (pp_result)(req->id - 2) : PP_OK;
        if (rc != PP_OK) return _pp_fail(err, rc, "rank %d: this request already failed (%s)", me->rank, pp_result_str(rc));
        return PP_OK;
    }
    pthread_mutex_lock(&c->mu);
    if (!(m = _ppc_req_msg(req))) {
        pthread_mutex_unlock(&c->mu);
        return _pp_fail(err, PP_ERR_INVALID, "rank %d: wait on a request that was never posted or was withdrawn by pp_cuda_reset",
                        me->rank);
    }
    is_send = !(req->id & 1);
    _PPC_WAIT_UNTIL(c, is_send ? m->has_recv : m->has_send, deadline);
    matched = m->has_send && m->has_recv;
    peer = is_send ? m->dst : m->src;
    tag = m->tag;
    aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (!matched) {
        if (!is_send) {
            _ppc_cancel(me, req);
            _ppc_req_finished(req, aborted ? PP_ERR_ABORTED : PP_ERR_TIMEOUT);
        }
        if (aborted)
            return _pp_fail(err, PP_ERR_ABORTED, "rank %d: %s rank %d aborted: %s", me->rank,
                            is_send ? "send to" : "receive from", peer, c->abort_msg);
        return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank %d to %s tag %d", me->rank, timeout_s, peer,
                        is_send ? "post the receive of" : "send", tag);
    }
    rc = is_send ? _ppc_send_finish(me, m) : _ppc_recv_finish(me, m);
    _ppc_req_finished(req, rc);
    if (rc != PP_OK) return _pp_fail(err, rc, "rank %d: %s", me->rank, me->err);
    return PP_OK;
}

/* Never enqueues anything: a message tests done only once its copy is enqueued, by the receiver's
   wait or a sender reusing its block (the executor tests sends: a block whose receiver has not
   pulled it stays out of the pool, which grows past it in its first steps instead of copying
   early later; receives it waits for). An isend whose receive was posted ahead is not done at
   once either, unless it copied at once (host memory). */
static pp_result _ppc_test(void* self, pp_request* req, int* done) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    int ready, is_send;
    pp_result rc;
    if (!req || !done) return PP_ERR_INVALID;
    *done = 0;
    if (req->done) {
        *done = 1;
        return req->id >= 2 ? (pp_result)(req->id - 2) : PP_OK;
    }
    pthread_mutex_lock(&c->mu);
    m = _ppc_req_msg(req);
    is_send = !(req->id & 1);
    ready = m && m->has_send && m->has_recv && m->copied;
#ifdef PP_CUDA_TEST_SEND_DONE_AT_POST
    ready = m && m->has_send && m->has_recv && (is_send || m->copied);
#endif
    pthread_mutex_unlock(&c->mu);
    if (!m) return PP_ERR_INVALID;
    if (!ready) return PP_OK;
    rc = is_send ? _ppc_send_finish(me, m) : _ppc_recv_finish(me, m);
    _ppc_req_finished(req, rc);
    *done = 1;
    return rc;
}

/* Withdraws a request nobody will wait for (a failed step): a receive not yet matched leaves
   the queue, so no later send can land in its block; a matched one is never copied unless its
   copy is already enqueued (then on this rank's stream, before any later use of the block). A
   send not yet matched leaves its receiver's queue. */
static pp_result _ppc_cancel(void* self, pp_request* req) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg *m, **pp;
    int is_recv;
    if (!req || req->done) return PP_OK;
    pthread_mutex_lock(&c->mu);
    if (!(m = _ppc_req_msg(req))) {
        pthread_mutex_unlock(&c->mu);
        _ppc_req_finished(req, PP_ERR_ABORTED);
        return PP_OK;
    }
    is_recv = (int)(req->id & 1);
    if (!(is_recv ? m->has_send : m->has_recv)) {
        for (pp = &c->r[m->dst].queue; *pp; pp = &(*pp)->next)
            if (*pp == m) {
                *pp = m->next;
                break;
            }
        _ppc_msg_release_locked(c, m);
    } else if (is_recv) {
        while (m->copying) pthread_cond_wait(&c->cv, &c->mu); /* a copy or a sender's early copy being enqueued */
        if (!m->copied) {
            m->copied = m->dropped = 1;
            _ppc_ev_put_locked(&c->r[m->src], m->es);
            m->es = NULL;
        }
        m->recv_done = 1;
        if (m->send_done && !m->held) _ppc_msg_release_locked(c, m);
    } else {
        pthread_mutex_unlock(&c->mu);
        _ppc_req_finished(req, _ppc_send_finish(me, m)); /* matched: the receiver copies it */
        return PP_OK;
    }
    pthread_mutex_unlock(&c->mu);
    _ppc_req_finished(req, PP_ERR_ABORTED);
    return PP_OK;
}

static void _ppc_abort(void* self, pp_result why, const char* msg) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    pthread_mutex_lock(&c->mu);
    if (!c->aborted) {
        c->aborted = 1;
        c->abort_code = why;
        snprintf(c->abort_msg, sizeof c->abort_msg, "rank %d: %s", me->rank, msg ? msg : "");
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Device ops: the stage's block pool in GPU memory. */
static void* _ppc_alloc(void* user, size_t bytes) {
    _ppc_rank* r = (_ppc_rank*)user;
    void* p = NULL;
    cudaError_t e = cudaSetDevice(r->dev);
    int i;
    if (e == cudaSuccess && r->n_pool == r->cap_pool) {
        int cap = r->cap_pool ? 2 * r->cap_pool : 16;
        char** np = (char**)PP_MALLOC(sizeof(char*) * (size_t)cap);
        size_t* nn = (size_t*)PP_MALLOC(sizeof(size_t) * (size_t)cap);
        if (!np || !nn) {
            PP_FREE(np);
            PP_FREE(nn);
            return NULL;
        }
        if (r->n_pool) {
            memcpy(np, r->pool_p, sizeof(char*) * (size_t)r->n_pool);
            memcpy(nn, r->pool_n, sizeof(size_t) * (size_t)r->n_pool);
        }
        PP_FREE(r->pool_p);
        PP_FREE(r->pool_n);
        r->pool_p = np;
        r->pool_n = nn;
        r->cap_pool = cap;
    }
    if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        _ppc_note(r, e, "cudaMalloc (block pool)");
        (void)cudaGetLastError();
        return NULL;
    }
    for (i = r->n_pool; i > 0 && r->pool_p[i - 1] > (char*)p; i--) {
        r->pool_p[i] = r->pool_p[i - 1];
        r->pool_n[i] = r->pool_n[i - 1];
    }
    r->pool_p[i] = (char*)p;
    r->pool_n[i] = bytes ? bytes : 1;
    r->n_pool++;
    r->pool_bytes += bytes;
    r->pool_allocs++;
    return p;
}

/* A block leaves the pool: every copy that may read it (on a receiver's stream, possibly on
   another GPU) and the rank's own work on it finish first. */
static void _ppc_free(void* user, void* ptr) {
    _ppc_rank* r = (_ppc_rank*)user;
    pp_cuda* c = r->c;
    _ppc_msg* m;
    int i, again = 1;
    size_t n = 1;
    double deadline = _pp_now() + c->timeout_s;
    cudaError_t e;
    for (i = 0; i < r->n_pool; i++) /* the block's extent: a message may come from any offset in it */
        if (r->pool_p[i] == (char*)ptr) n = r->pool_n[i];
    pthread_mutex_lock(&c->mu);
    while (again) {
        again = 0;
        for (m = r->reading; m; m = m->pnext) {
            const char* s0 = (const char*)m->sbuf;
            if (s0 + m->sbytes <= (const char*)ptr || s0 >= (const char*)ptr + n) continue;
            _ppc_copy_now_locked(c, m);
            if (!m->dropped && m->ec && !r->stuck) {
                cudaEvent_t ec = m->ec; /* held: the event stays with the message */
                pthread_mutex_unlock(&c->mu);
#ifndef PP_CUDA_TEST_UNBOUNDED_WAITS
                if ((e = _ppc_poll(NULL, ec, deadline)) == cudaErrorNotReady) _ppc_stuck(r, "freeing a block a copy still reads");
#else /* negative control (build/cuda-controls): the wait without a deadline */
                (void)deadline;
                e = cudaEventSynchronize(ec);
#endif
                if (e != cudaSuccess) (void)cudaGetLastError();
                pthread_mutex_lock(&c->mu);
            }
            _ppc_unhold_locked(c, m);
            again = 1;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (!r->stuck && cudaSetDevice(r->dev) == cudaSuccess) {
#ifndef PP_CUDA_TEST_UNBOUNDED_WAITS
        if ((e = _ppc_drain(r, deadline)) == cudaErrorNotReady) _ppc_stuck(r, "freeing a pool block");
#else
        (void)deadline;
        e = cudaStreamSynchronize(r->stream);
        if (r->side) (void)cudaStreamSynchronize(r->side);
#endif
        if (e != cudaSuccess) (void)cudaGetLastError();
    }
    /* A stuck rank leaks the block: the kernel that never ended may still use it, and cudaFree
       waits for every stream of the device (the CUDA guide, Stream Ordered Memory Allocator). */
    if (!r->stuck && cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
    for (i = 0; i < r->n_pool && r->pool_p[i] != (char*)ptr; i++) {
    }
    if (i < r->n_pool) {
        r->pool_bytes -= r->pool_n[i] <= r->pool_bytes ? r->pool_n[i] : r->pool_bytes;
        for (; i + 1 < r->n_pool; i++) {
            r->pool_p[i] = r->pool_p[i + 1];
            r->pool_n[i] = r->pool_n[i + 1];
        }
        r->n_pool--;
    }
}

static pp_result _ppc_zero(void* user, void* ptr, size_t bytes) {
    _ppc_rank* r = (_ppc_rank*)user;
    cudaError_t e;
    if (r->stuck) return PP_ERR_TIMEOUT; /* pp_cuda_error says where */
    e = cudaMemsetAsync(ptr, 0, bytes, r->stream);
    if (e != cudaSuccess) {
        _ppc_note(r, e, "cudaMemsetAsync (gradient workspace)");
        return PP_ERR_TRANSPORT;
    }
    return PP_OK;
}

/* pp_device_ops.copy: after the work enqueued on the rank's stream, on that stream, waited for
   (the gradient norm, clipping and the loss scaler read gradients through it: pipeline.h >>grad;
   pp_stage_eval hands out an evaluation's outputs through it, into host or device memory). */
static pp_result _ppc_copy(void* user, void* dst, const void* src, size_t bytes, int to_host) {
    _ppc_rank* r = (_ppc_rank*)user;
    cudaError_t e;
    int cur = -1;
    (void)to_host; /* the pointers say where the bytes are (unified addressing) */
    if (bytes == 0) return PP_OK;
    if (r->stuck) return PP_ERR_TIMEOUT;
    if ((e = cudaGetDevice(&cur)) == cudaSuccess && cur != r->dev) e = cudaSetDevice(r->dev);
#ifndef PP_CUDA_TEST_COPY_UNORDERED
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, r->stream);
#ifndef PP_CUDA_TEST_UNBOUNDED_WAITS
    if (e == cudaSuccess && (e = _ppc_poll(r->stream, NULL, _pp_now() + r->c->timeout_s)) == cudaErrorNotReady) {
        _ppc_stuck(r, "the device ops' copy");
        if (cur >= 0 && cur != r->dev) (void)cudaSetDevice(cur);
        return PP_ERR_TIMEOUT;
    }
#else /* negative control (build/cuda-controls) */
    if (e == cudaSuccess) e = cudaStreamSynchronize(r->stream);
#endif
#else /* negative control (build/cuda-controls): a copy not ordered after the rank's stream */
    if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
#endif
    if (cur >= 0 && cur != r->dev) (void)cudaSetDevice(cur);
    if (e != cudaSuccess) {
        _ppc_note(r, e, to_host ? "cudaMemcpyAsync (gradients to the host)" : "cudaMemcpyAsync (gradients to the device)");
        return e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_TRANSPORT;
    }
    return PP_OK;
}

#ifdef PP_NVTX
/* One NVTX range per action on the rank's host thread, named like the timeline's slices plus the
   stage ("F3.1 s2": forward of micro-batch 3, chunk 1, stage 2), coloured by kind. It spans the
   host's enqueueing of the action's work; nsys projects it onto the kernels launched inside it.
   An action that failed leaves no phase 1: the next action of the step on the same thread closes
   its range first; one still open at the step's end stays with its thread (pp_cuda_step_begin
   forgets it: a later thread may get the same id), and a thread that ends closes it. */
static void _ppc_nvtx(_ppc_rank* r, const pp_action* a, int phase) {
    static const uint32_t color[3] = {0xff3d7ed6u, 0xff3fa34du, 0xffe0892bu}; /* F blue, B green, W orange */
    nvtxEventAttributes_t ea;
    char name[48];
    int same = r->nvtx_open && pthread_equal(r->nvtx_thread, pthread_self());
    if (same) (void)nvtxRangePop();
    r->nvtx_open = 0;
    if (phase != 0) return;
    snprintf(name, sizeof name, "%c%d.%d s%d", "FBW"[a->op % 3], (int)a->mb, (int)a->chunk, (int)a->stage);
    memset(&ea, 0, sizeof ea);
    ea.version = NVTX_VERSION;
    ea.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    ea.colorType = NVTX_COLOR_ARGB;
    ea.color = color[a->op % 3];
    ea.messageType = NVTX_MESSAGE_TYPE_ASCII;
    ea.message.ascii = name;
    (void)nvtxRangePushEx(&ea); /* its nesting level, or a negative number when no tool counts them */
    r->nvtx_open = 1;
    r->nvtx_thread = pthread_self();
}
#endif

static void _ppc_mark(void* user, const pp_action* a, int idx, int phase) {
    _ppc_rank* r = (_ppc_rank*)user;
    cudaError_t e;
#ifdef PP_NVTX
    _ppc_nvtx(r, a, phase);
#endif
    if (!r->c->timeline || idx < 0 || !r->origin_ok) return;
    if (idx >= r->tcap) {
        /* grows during the first step only: the list length is fixed per schedule */
        int cap = idx + 64, i;
        cudaEvent_t* nv = (cudaEvent_t*)PP_MALLOC(sizeof(cudaEvent_t) * 2 * (size_t)cap);
        pp_action* na = (pp_action*)PP_MALLOC(sizeof(pp_action) * (size_t)cap);
        if (!nv || !na) {
            PP_FREE(nv);
            PP_FREE(na);
            return;
        }
        for (i = 0; i < 2 * cap; i++) nv[i] = NULL;
        if (r->tev) memcpy(nv, r->tev, sizeof(cudaEvent_t) * 2 * (size_t)r->tcap);
        if (r->tact) memcpy(na, r->tact, sizeof(pp_action) * (size_t)r->tcap);
        PP_FREE(r->tev);
        PP_FREE(r->tact);
        r->tev = nv;
        r->tact = na;
        r->tcap = cap;
    }
    if (!r->tev[2 * idx + phase] && (e = cudaEventCreate(&r->tev[2 * idx + phase])) != cudaSuccess) {
        _ppc_note(r, e, "cudaEventCreate (timeline)");
        r->tev[2 * idx + phase] = NULL;
        return;
    }
    if ((e = cudaEventRecord(r->tev[2 * idx + phase], r->stream)) != cudaSuccess) _ppc_note(r, e, "cudaEventRecord (timeline)");
    r->tact[idx] = *a;
    if (idx + 1 > r->n_marked) r->n_marked = idx + 1;
}

/* Whether the ranks on device `dev` get a side stream each for early copies: only while their
   streams (two per rank) fit the device's hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS,
   8 by default). Streams beyond that share queues, and work waiting on one stream then holds up
   unrelated work on another: on an H200, side streams for 8 ranks on one GPU made interleaved
   p=8 m=32 1.25x its ideal step instead of 1.03x. */
static int _ppc_side_streams(const pp_cuda* c, const pp_cuda_desc* d, int dev) {
    const char* env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int i, on_dev = 0, queues = env && atoi(env) > 0 ? atoi(env) : 8;
    for (i = 0; i < c->n; i++) on_dev += (d->devices ? d->devices[i] : 0) == dev;
    return 2 * on_dev <= queues;
}

pp_result pp_cuda_create(const pp_cuda_desc* d, pp_cuda** out, pp_error* err) {
    pp_cuda* c;
    int ndev = 0, i, j;
    cudaError_t e;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "cuda desc is NULL");
    if (d->n_ranks < 1 || d->n_ranks > PP_MAX_RANKS)
        return _pp_fail(err, PP_ERR_INVALID, "n_ranks = %d (1 .. %d allowed)", d->n_ranks, PP_MAX_RANKS);
    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        (void)cudaGetLastError();
        return _pp_fail(err, PP_ERR_UNSUPPORTED, "no CUDA device (cudaGetDeviceCount: %s, %d devices)",
                        e == cudaSuccess ? "ok" : cudaGetErrorString(e), ndev);
    }
    for (i = 0; d->devices && i < d->n_ranks; i++)
        if (d->devices[i] < 0 || d->devices[i] >= ndev)
            return _pp_fail(err, PP_ERR_INVALID, "rank %d on device %d, this machine has %d", i, d->devices[i], ndev);
    c = (pp_cuda*)_pp_calloc(1, sizeof *c);
    if (!c) return _pp_fail(err, PP_ERR_NOMEM, "cuda world");
    c->r = (_ppc_rank*)_pp_calloc((size_t)d->n_ranks, sizeof *c->r);
    if (!c->r) {
        PP_FREE(c);
        return _pp_fail(err, PP_ERR_NOMEM, "cuda world of %d ranks", d->n_ranks);
    }
    c->n = d->n_ranks;
    c->timeline = d->timeline;
    c->timeout_s = d->timeout_s > 0 ? d->timeout_s : PP_DEFAULT_TIMEOUT_S;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    *out = c; /* from here pp_cuda_destroy cleans up a half-built world */
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        r->c = c;
        r->rank = i;
        r->dev = d->devices ? d->devices[i] : 0;
        r->want_side = _ppc_side_streams(c, d, r->dev);
        if (!(r->seen = (uint64_t*)_pp_calloc((size_t)c->n, sizeof(uint64_t))) ||
            !(r->seen_side = (uint64_t*)_pp_calloc((size_t)c->n, sizeof(uint64_t)))) {
            pp_cuda_destroy(c);
            *out = NULL;
            return _pp_fail(err, PP_ERR_NOMEM, "rank %d", i);
        }
        if ((e = cudaSetDevice(r->dev)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking)) != cudaSuccess ||
#ifdef PP_CUDA_TEST_EAGER_SIDE /* negative control (build/nccl-controls): made here, used or not */
            (_ppc_side_streams(c, d, r->dev) && (e = cudaStreamCreateWithFlags(&r->side, cudaStreamNonBlocking)) != cudaSuccess) ||
#endif
            (e = cudaEventCreate(&r->origin)) != cudaSuccess) {
            pp_cuda_destroy(c);
            *out = NULL;
            return pp_cuda_status(e, "creating the streams of a rank", __FILE__, __LINE__, err);
        }
    }
    /* peer access between every pair of GPUs in use, where the hardware allows it */
    for (i = 0; i < c->n; i++)
        for (j = 0; j < c->n; j++) {
            int a = c->r[i].dev, b = c->r[j].dev, can = 0;
            if (a == b) continue;
            if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
                (void)cudaGetLastError();
                continue;
            }
            if (cudaSetDevice(a) == cudaSuccess) {
                e = cudaDeviceEnablePeerAccess(b, 0);
                if (e != cudaSuccess) (void)cudaGetLastError(); /* already enabled is fine */
            }
        }
    return PP_OK;
}

void pp_cuda_destroy(pp_cuda* c) {
    int i, k;
    _ppc_msg* m;
    if (!c) return;
    for (i = 0; i < c->n; i++) { /* bounded: a stuck rank's spares are leaked below */
        _ppc_rank* r = &c->r[i];
#ifndef PP_CUDA_TEST_UNBOUNDED_WAITS
        if (!r->stuck && cudaSetDevice(r->dev) == cudaSuccess && _ppc_drain(r, _pp_now() + c->timeout_s) == cudaErrorNotReady)
            _ppc_stuck(r, "pp_cuda_destroy");
#else /* negative control (build/cuda-controls) */
        if (cudaSetDevice(r->dev) == cudaSuccess && r->stream) (void)cudaStreamSynchronize(r->stream);
        if (r->side) (void)cudaStreamSynchronize(r->side);
#endif
    }
    /* leftovers of an aborted step (posted by one side, or never waited for): their events
       go back to the pools, which are destroyed below */
    for (m = c->all_msgs; m; m = m->all)
        if (m->live) _ppc_msg_release_locked(c, m);
    for (i = 0; i < c->n; i++) { /* the spares, their events back to the pools first */
        if (cudaSetDevice(c->r[i].dev) != cudaSuccess) (void)cudaGetLastError();
        if (!c->r[i].stuck) _ppc_spares_free_locked(c, &c->r[i]);
    }
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        if (cudaSetDevice(r->dev) != cudaSuccess) (void)cudaGetLastError();
        for (k = 0; k < r->n_ev; k++) (void)cudaEventDestroy(r->ev[k]);
        for (k = 0; r->tev && k < 2 * r->tcap; k++)
            if (r->tev[k]) (void)cudaEventDestroy(r->tev[k]);
        if (r->origin) (void)cudaEventDestroy(r->origin);
        if (r->stream) (void)cudaStreamDestroy(r->stream);
        if (r->side) (void)cudaStreamDestroy(r->side);
        PP_FREE(r->ev);
        PP_FREE(r->tev);
        PP_FREE(r->tact);
        PP_FREE(r->pool_p);
        PP_FREE(r->pool_n);
        PP_FREE(r->seen);
        PP_FREE(r->seen_side);
    }
    while ((m = c->all_msgs) != NULL) {
        c->all_msgs = m->all;
        PP_FREE(m);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    PP_FREE(c->events);
    PP_FREE(c->r);
    PP_FREE(c);
}

pp_result pp_cuda_bind(pp_cuda* c, int rank, pp_error* err) {
    if (!c || rank < 0 || rank >= c->n) return _pp_fail(err, PP_ERR_INVALID, "bind: no rank %d", rank);
    PP_CUDA_CHECK(cudaSetDevice(c->r[rank].dev), err);
    return PP_OK;
}

pp_transport pp_cuda_transport(pp_cuda* c, int rank) {
    /* in pp_transport's order (pipeline.h's pp_threads_transport names the fields) */
    static const pp_transport ops = {NULL, 0, 0, _ppc_isend, _ppc_irecv, _ppc_wait, _ppc_test, NULL, NULL, NULL,
                                     _ppc_abort, _ppc_cancel, NULL, NULL, NULL, NULL, 0, NULL, NULL};
    int ok = c && rank >= 0 && rank < c->n;
    return _pp_transport_of(&ops, ok ? &c->r[rank] : NULL, rank, ok ? c->n : 0);
}

pp_device_ops pp_cuda_device_ops(pp_cuda* c, int rank) {
    pp_device_ops o;
    memset(&o, 0, sizeof o);
    if (!c || rank < 0 || rank >= c->n) return o;
    o.alloc = _ppc_alloc;
    o.free = _ppc_free;
    o.zero = _ppc_zero;
    o.mark = _ppc_mark;
    o.reuse = _ppc_reuse;
    o.copy = _ppc_copy;
    o.user = &c->r[rank];
    return o;
}

cudaStream_t pp_cuda_stream(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].stream : NULL; }
int pp_cuda_device(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].dev : -1; }

void pp_cuda_memory(pp_cuda* c, int rank, size_t* bytes, int* allocs) {
    int ok = c && rank >= 0 && rank < c->n;
    if (bytes) *bytes = ok ? c->r[rank].pool_bytes + c->r[rank].spare_bytes : 0;
    if (allocs) *allocs = ok ? c->r[rank].pool_allocs : 0;
}

const char* pp_cuda_error(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].err : "no such rank"; }

/* Waits for every rank's stream (incoming copies run there too); then no copy reads a block
   any more. Between steps only. */
static pp_result _ppc_sync_all(pp_cuda* c, pp_error* err) {
    double deadline = _pp_now() + c->timeout_s;
    int i;
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        cudaError_t e;
        if (!r->stuck) {
            PP_CUDA_CHECK(cudaSetDevice(r->dev), err);
            if ((e = _ppc_drain(r, deadline)) == cudaErrorNotReady) _ppc_stuck(r, "waiting for the rank's streams");
            else PP_CUDA_CHECK(e, err);
        }
        if (r->stuck) return _pp_fail(err, PP_ERR_TIMEOUT, "%s", r->err);
    }
    _ppc_unhold_all(c);
    return PP_OK;
}

pp_result pp_cuda_reset(pp_cuda* c) {
    pp_error scratch;
    pp_result rc;
    _ppc_msg* m;
    int i;
    if (!c) return PP_ERR_INVALID;
    rc = _ppc_sync_all(c, &scratch);
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++) {
        c->r[i].queue = NULL;
        c->r[i].reading = NULL;
        if (rc != PP_OK) snprintf(c->r[i].err, sizeof c->r[i].err, "reset: %.200s", scratch.msg);
    }
    for (m = c->all_msgs; m; m = m->all)
        if (m->live) _ppc_msg_release_locked(c, m);
    c->aborted = 0;
    c->abort_code = PP_OK;
    c->abort_msg[0] = 0;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

size_t pp_cuda_pending(pp_cuda* c, size_t* recvs) {
    size_t n = 0, nr = 0;
    int i;
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (i = 0; i < c->n; i++) {
            const _ppc_msg* m;
            for (m = c->r[i].queue; m; m = m->next) {
                n++;
                nr += (size_t)(m->has_recv != 0);
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (recvs) *recvs = nr;
    return n;
}

/* Between steps, in the block pool's warm-up (_PP_POOL_WARM_STEPS): each rank gets a spare for
   its early copies as large as its largest device send so far (plus headroom, in the pool's
   size classes), replacing smaller free ones, so that cudaMalloc stays in the warm-up. Later an
   early copy that finds no free spare large enough copies onto the receiver's stream instead.
   A failed cudaMalloc only leaves the rank without a spare. */
static void _ppc_spares_warm(pp_cuda* c) {
    int i;
    if (c->steps_ended++ >= _PP_POOL_WARM_STEPS) return;
#ifdef PP_CUDA_TEST_NO_SPARES /* negative control (build/cuda-controls): every early copy falls back */
    return;
#endif
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        _ppc_spare* sp;
        size_t want = r->send_max ? _pp_block_class(r->send_max + r->send_max / 8) : 0, have = 0;
        for (sp = r->spares; sp; sp = sp->next)
            if (sp->cap > have) have = sp->cap;
        if (want <= have || cudaSetDevice(r->dev) != cudaSuccess) continue;
        _ppc_spares_free_locked(c, r); /* streams drained: a free spare is unread */
        if (!(sp = (_ppc_spare*)_pp_calloc(1, sizeof *sp))) continue;
        if (cudaMalloc(&sp->p, want) != cudaSuccess) {
            (void)cudaGetLastError();
            PP_FREE(sp);
            continue;
        }
        sp->cap = want;
        sp->next = r->spares;
        r->spares = sp;
        r->spare_bytes += want;
        r->pool_allocs++;
    }
}

pp_result pp_cuda_step_begin(pp_cuda* c, pp_error* err) {
    pp_result rc;
    int i;
    if (!c) return _pp_fail(err, PP_ERR_INVALID, "cuda world is NULL");
    if ((rc = _ppc_sync_all(c, err)) != PP_OK) return rc;
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        r->n_marked = 0;
        r->origin_ok = 0;
        r->nvtx_open = 0; /* a range a failed step left open stays with its thread */
        if (!c->timeline) continue;
        PP_CUDA_CHECK(cudaSetDevice(r->dev), err);
        PP_CUDA_CHECK(cudaEventRecord(r->origin, r->stream), err);
        r->origin_ok = 1;
    }
    return PP_OK;
}

pp_result pp_cuda_step_end(pp_cuda* c, pp_cuda_step_info* info, pp_error* err) {
    pp_result rc;
    double t_min = 1e300, t_max = -1e300, busy_all = 0;
    size_t n_ev = 0, need = 0;
    int i, k;
    if (!c) return _pp_fail(err, PP_ERR_INVALID, "cuda world is NULL");
    if (info) memset(info, 0, sizeof *info);
    if ((rc = _ppc_sync_all(c, err)) != PP_OK) return rc;
    pthread_mutex_lock(&c->mu);
    _ppc_spares_warm(c);
    pthread_mutex_unlock(&c->mu);
    if (!c->timeline) return PP_OK;
    for (i = 0; i < c->n; i++) need += (size_t)c->r[i].n_marked;
    if (need > c->cap_events) {
        pp_event* ne = (pp_event*)_pp_calloc(need, sizeof *ne);
        if (!ne) return _pp_fail(err, PP_ERR_NOMEM, "timeline of %zu actions", need);
        PP_FREE(c->events);
        c->events = ne;
        c->cap_events = need;
    }
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        /* ranks on one GPU share the first such rank's origin: exact relative times */
        _ppc_rank* o = r;
        for (k = 0; k < i; k++)
            if (c->r[k].dev == r->dev && c->r[k].origin_ok) {
                o = &c->r[k];
                break;
            }
        r->busy = 0;
        PP_CUDA_CHECK(cudaSetDevice(r->dev), err);
        for (k = 0; k < r->n_marked; k++) {
            float t0 = 0, t1 = 0;
            pp_event* ev = &c->events[n_ev++];
            if (!r->tev[2 * k] || !r->tev[2 * k + 1])
                return _pp_fail(err, PP_ERR_TRANSPORT, "rank %d: action %d has no timing events (%s)", i, k, r->err);
            PP_CUDA_CHECK(cudaEventElapsedTime(&t0, o->origin, r->tev[2 * k]), err);
            PP_CUDA_CHECK(cudaEventElapsedTime(&t1, o->origin, r->tev[2 * k + 1]), err);
            ev->rank = i;
            ev->a = r->tact[k];
            ev->start = 1e-3 * (double)t0;
            ev->end = 1e-3 * (double)t1;
            r->busy += ev->end - ev->start;
            if (ev->start < t_min) t_min = ev->start;
            if (ev->end > t_max) t_max = ev->end;
        }
        busy_all += r->busy;
        if (info && i < PP_MAX_RANKS) {
            info->busy[i] = r->busy;
            info->n_actions[i] = r->n_marked;
        }
    }
    c->n_events = n_ev;
    if (n_ev == 0) return PP_OK;
    for (k = 0; k < (int)n_ev; k++) {
        c->events[k].start -= t_min;
        c->events[k].end -= t_min;
    }
    if (info) {
        info->span = t_max - t_min;
        info->bubble = info->span > 0 ? 1.0 - busy_all / ((double)c->n * info->span) : 0;
    }
    return PP_OK;
}

size_t pp_cuda_timeline(pp_cuda* c, pp_event* ev, size_t cap) {
    size_t i;
    if (!c) return 0;
    for (i = 0; ev && i < c->n_events && i < cap; i++) ev[i] = c->events[i];
    return c->n_events;
}

/* >>impl-cuda-pipeline: the CUDA world of pipeline.h's one-process layer (its _pp_pl_world). */
typedef struct _ppc_pl {
    pp_cuda* c;
    pp_cuda_layer_ctx* lc;      /* [n_ranks] */
    pp_cuda_step_info info;
} _ppc_pl;

static void _ppc_pl_desc(void* self, int rank, pp_stage_desc* d) {
    _ppc_pl* w = (_ppc_pl*)self;
    pp_cuda_layer_ctx* lc = &w->lc[rank];
    lc->stream = pp_cuda_stream(w->c, rank);
    lc->rank = rank;
    lc->device = pp_cuda_device(w->c, rank);
    lc->user = d->layer_ctx;
    d->transport = pp_cuda_transport(w->c, rank);
    d->device = pp_cuda_device_ops(w->c, rank);
    d->layer_ctx = lc;
}
static pp_result _ppc_pl_enter(void* self, int rank, pp_error* err) { return pp_cuda_bind(((_ppc_pl*)self)->c, rank, err); }
static pp_result _ppc_pl_begin(void* self, pp_error* err) { return pp_cuda_step_begin(((_ppc_pl*)self)->c, err); }
static pp_result _ppc_pl_end(void* self, pp_error* err) {
    _ppc_pl* w = (_ppc_pl*)self;
    return pp_cuda_step_end(w->c, &w->info, err);
}
static void _ppc_pl_reset(void* self) { pp_cuda_reset(((_ppc_pl*)self)->c); }
static void _ppc_pl_destroy(void* self) {
    _ppc_pl* w = (_ppc_pl*)self;
    if (!w) return;
    pp_cuda_destroy(w->c);
    PP_FREE(w->lc);
    PP_FREE(w);
}

pp_result pp_cuda_pipeline_create(const pp_pipeline_desc* d, const pp_cuda_desc* cd, pp_pipeline** out, pp_error* err) {
    _pp_pl_world world;
    pp_cuda_desc c;
    _ppc_pl* w = NULL;
    pp_result rc;
    if (!out) return _pp_fail(err, PP_ERR_INVALID, "output pointer is NULL");
    *out = NULL;
    if (!d) return _pp_fail(err, PP_ERR_INVALID, "pipeline desc is NULL");
    if (d->stage.device.alloc || d->stage.device.free || d->stage.device.zero || d->stage.device.mark || d->stage.device.reuse ||
        d->stage.device.copy)
        return _pp_fail(err, PP_ERR_INVALID, "stage.device is the CUDA pipeline's (its blocks live in GPU memory): leave it zero");
    if ((rc = _pp_pipeline_new(d, out, err)) != PP_OK) goto fail;
    memset(&c, 0, sizeof c);
    if (cd) c = *cd;
    if (c.n_ranks == 0) c.n_ranks = (*out)->d.p;
    if (c.n_ranks != (*out)->d.p) {
        rc = _pp_fail(err, PP_ERR_INVALID, "cuda desc has n_ranks = %d, the pipeline p = %d (leave it 0)", c.n_ranks, (*out)->d.p);
        goto fail;
    }
    if (!(w = (_ppc_pl*)_pp_calloc(1, sizeof *w)) || !(w->lc = (pp_cuda_layer_ctx*)_pp_calloc((size_t)c.n_ranks, sizeof *w->lc))) {
        rc = _pp_fail(err, PP_ERR_NOMEM, "CUDA pipeline of %d ranks", c.n_ranks);
        goto fail;
    }
    if ((rc = pp_cuda_create(&c, &w->c, err)) != PP_OK) goto fail;
    memset(&world, 0, sizeof world);
    world.self = w;
    world.rank_desc = _ppc_pl_desc;
    world.enter = _ppc_pl_enter;
    world.begin = _ppc_pl_begin;
    world.end = _ppc_pl_end;
    world.reset = _ppc_pl_reset;
    world.destroy = _ppc_pl_destroy;
    w = NULL; /* the pipeline's from here */
    if ((rc = _pp_pipeline_start(*out, &world, err)) == PP_OK) return PP_OK;
fail:
    _ppc_pl_destroy(w);
    pp_pipeline_destroy(*out);
    *out = NULL;
    return rc;
}

pp_cuda* pp_cuda_pipeline_world(pp_pipeline* pl) {
    return pl && pl->world.destroy == _ppc_pl_destroy ? ((_ppc_pl*)pl->world.self)->c : NULL;
}

const pp_cuda_step_info* pp_cuda_pipeline_info(const pp_pipeline* pl) {
    return pl && pl->world.destroy == _ppc_pl_destroy ? &((const _ppc_pl*)pl->world.self)->info : NULL;
}

#ifdef __cplusplus
}
#endif
#endif /* PIPELINE_IMPLEMENTATION && !PIPELINE_CUDA_IMPLEMENTATION_DONE */
