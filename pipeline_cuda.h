/* pipeline_cuda.h - CUDA backend for pipeline.h: stages as streams on one or several GPUs.
   v0.1.0   public domain / MIT (see pipeline.h)

   Include after (or instead of) pipeline.h; in the one file that defines PIPELINE_IMPLEMENTATION
   it also compiles its implementation. Link with -lcudart -lpthread. The header is C99 and C++
   (nvcc, g++, gcc with the CUDA include path all work); it never launches a kernel itself.

   WHAT IT DOES
   One process, one host thread per pipeline rank (pp_threads_run), one CUDA stream per rank on
   the rank's GPU (several ranks may share a GPU: their streams run concurrently). Three pieces:
   - pp_cuda_transport(c, rank): isend/irecv/wait matched on the host like the threads transport,
     but the bytes move on the GPU: the sender records an event after its producing work; a copy
     stream of the receiver (one per sending rank) waits on it and on the receiver's own earlier
     work on the buffer, copies with cudaMemcpyPeerAsync (a plain device copy within one GPU, a
     peer copy between GPUs, peer access enabled where the hardware has it), and records a
     second event that the receiver's stream waits on. A wait therefore returns when the
     transfer is enqueued and ordered, not when the GPU finished it: the host runs ahead and
     enqueues whole steps, and nothing synchronises the device in the steady state. A send
     completes when its copy is enqueued; the sender's stream waits on that copy only when the
     block is taken from the pool again (the device ops' reuse hook), so the sender never idles
     for its receiver. Buffers in host memory (BROADCAST's step metadata) are copied on the host
     at match time: they must be ready when isend is called. Device blocks sent through this
     transport must come from pp_cuda_device_ops (its reuse hook keeps them safe).
   - pp_cuda_device_ops(c, rank): pp_stage_desc.device hooks, so the stage's block pool (stashes,
     received activations, gradient workspaces) lives in GPU memory: cudaMalloc while the pool
     grows (the first step), never after; cudaMemsetAsync on the rank's stream for zeroing.
     Sizes come from the step plan (exact bytes of every micro-batch, variable lengths included)
     and the pool holds exactly the schedule's peak of live stashes (pp_step_stats.peak_live
     equals the simulator's peak_live). pp_cuda_memory reports the bytes each rank holds.
   - a timeline: with desc.timeline set, a timed event pair brackets every action on the rank's
     stream; pp_cuda_step_end turns them into per-rank busy time, the step's span and its measured
     bubble fraction, and pp_cuda_timeline into pp_event records for pp_timeline_chrome (one
     track per rank; an interleaved rank's chunks share its track, named in each slice).

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

   RESTRICTIONS (each a clear error, never a crash)
   - Device blocks need PP_SHAPES_LOCAL or PP_SHAPES_BROADCAST (pp_stage_create answers
     PP_ERR_UNSUPPORTED for AUTO and PER_MESSAGE, which write headers into blocks on the host).
   - The transport has no allreduce_sum (NULL): tied layers in one process are summed by the
     caller after the step (examples/gpt_cuda.cu does).
   - The loss layer's io->loss is a host float: a GPU loss layer should write its micro-batch
     loss to device memory and let the caller read it after pp_cuda_step_end.
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
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_cuda pp_cuda;

typedef struct pp_cuda_desc {
    int n_ranks;                /* pipeline ranks (1 .. PP_MAX_RANKS) */
    const int* devices;         /* devices[r]: GPU of rank r; NULL = every rank on device 0 */
    int timeline;               /* bracket every action with timed events (pp_cuda_step_end) */
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
/* Bytes of GPU memory the rank's block pool holds, and cudaMalloc calls it made (cumulative). */
void pp_cuda_memory(pp_cuda* c, int rank, size_t* bytes, int* allocs);
/* The last CUDA error a hook or the transport met on this rank ("" if none). */
const char* pp_cuda_error(pp_cuda* c, int rank);
/* Clears an abort so the ranks can step again. */
void pp_cuda_reset(pp_cuda* c);
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
   each rank's filled desc and may wrap its transport. Shapes: LOCAL or BROADCAST. */
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
    struct _ppc_msg* pnext;     /* in the sender's list of copies that may still read its blocks */
    int live;                   /* posted and not yet released by both sides */
    int held;                   /* on that list: not released before its block is reused */
    int src, dst, tag;
    const void* sbuf;
    void* rbuf;
    size_t sbytes, rbytes;
    int s_host, r_host;         /* buffer in host memory */
    int has_send, has_recv;
    int copied;                 /* the receiver enqueued (device) or made (host) the copy */
    int send_done, recv_done;   /* each side released it */
    pp_result rc;
    cudaEvent_t es;             /* sender's device: its data is ready */
    cudaEvent_t er;             /* receiver's device: its earlier work on rbuf is done */
    cudaEvent_t ec;             /* receiver's device: the copy finished */
    char emsg[200];             /* what went wrong, for the side that reports it */
} _ppc_msg;

typedef struct _ppc_rank {
    pp_cuda* c;
    int rank, dev;
    cudaStream_t stream;        /* the stage's compute stream */
    cudaStream_t* copy_from;    /* [n] incoming copies, one stream per sender (made on first use):
                                   a late sender never holds up another link's copies */
    _ppc_msg* queue;            /* messages to this rank posted by one side only */
    _ppc_msg* reading;          /* sent from this rank's device blocks; the copy may still run */
    cudaEvent_t* ev;            /* free sync events of this device (world lock) */
    int n_ev, cap_ev;
    /* memory */
    size_t pool_bytes;
    int pool_allocs;
    /* timeline */
    cudaEvent_t origin;
    cudaEvent_t* tev;           /* [2 * tcap]: start, end of action idx */
    pp_action* tact;
    int tcap, n_marked, origin_ok;
    double busy;
    char err[256];
} _ppc_rank;

struct pp_cuda {
    int n;
    int timeline;
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

static int _ppc_is_host(const void* p) {
    struct cudaPointerAttributes at;
    if (!p) return 1;
    memset(&at, 0, sizeof at);
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    return at.type == cudaMemoryTypeUnregistered || at.type == cudaMemoryTypeHost;
}

/* A sync event of rank r's device; the caller runs on that device. NULL-event on failure. */
static cudaError_t _ppc_ev_get(pp_cuda* c, _ppc_rank* r, cudaEvent_t* out) {
    cudaEvent_t e = NULL;
    pthread_mutex_lock(&c->mu);
    if (r->n_ev > 0) e = r->ev[--r->n_ev];
    pthread_mutex_unlock(&c->mu);
    if (e) {
        *out = e;
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(out, cudaEventDisableTiming);
}

/* Returns an event to its rank's pool; caller holds the world lock. */
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
    if (m) {
        c->free_msgs = m->next;
        all = m->all;
    } else {
        if (!(m = (_ppc_msg*)PP_MALLOC(sizeof *m))) return NULL;
        all = c->all_msgs;
        c->all_msgs = m;
    }
    memset(m, 0, sizeof *m);
    m->all = all;
    m->live = 1;
    return m;
}

/* Both sides are done: give the events back and recycle the message. World lock held. */
static void _ppc_msg_release_locked(pp_cuda* c, _ppc_msg* m) {
    _ppc_ev_put_locked(&c->r[m->dst], m->er);
    _ppc_ev_put_locked(&c->r[m->dst], m->ec);
    _ppc_ev_put_locked(&c->r[m->src], m->es);
    m->er = m->ec = m->es = NULL;
    m->live = 0;
    m->next = c->free_msgs;
    c->free_msgs = m;
}

/* The stream for copies from rank src into rank dst (dst's device current). */
static cudaError_t _ppc_copy_stream(pp_cuda* c, _ppc_rank* dst, int src, cudaStream_t* out) {
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&c->mu);
    if (!dst->copy_from[src]) e = cudaStreamCreateWithFlags(&dst->copy_from[src], cudaStreamNonBlocking);
    *out = dst->copy_from[src];
    pthread_mutex_unlock(&c->mu);
    return e;
}

/* Moves a matched message's bytes. Runs on the thread that completed the match (the second of
   sender and receiver to post), outside the world lock; the copy goes on the receiver's copy
   stream after the sender's data-ready event and the receiver's buffer-free event, and ends with
   the copy-done event ec. Sets m->copied. */
static void _ppc_copy(pp_cuda* c, _ppc_msg* m) {
    _ppc_rank* dst = &c->r[m->dst];
    const _ppc_rank* src = &c->r[m->src];
    cudaError_t e = cudaSuccess;
    const char* what = "";
    pp_result rc = PP_OK;
    size_t n = m->rbytes;
    int cur = -1;
    if (m->sbytes != m->rbytes) {
        rc = PP_ERR_SIZE;
        snprintf(m->emsg, sizeof m->emsg, "rank %d sent %zu bytes with tag %d, rank %d posted a receive of %zu bytes",
                 m->src, m->sbytes, m->tag, m->dst, m->rbytes);
    } else if (n == 0) {
        /* nothing to move */
    } else if (m->s_host && m->r_host) {
        memcpy(m->rbuf, m->sbuf, n);
    } else {
        cudaStream_t cs = NULL;
        if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
        what = "cudaSetDevice";
        e = cudaSetDevice(dst->dev);
        if (e == cudaSuccess) {
            what = "cudaStreamCreate(copy)";
            e = _ppc_copy_stream(c, dst, m->src, &cs);
        }
        if (e == cudaSuccess && !m->s_host) {
            what = "cudaStreamWaitEvent(sender's data ready)";
            e = cudaStreamWaitEvent(cs, m->es, 0);
        }
        if (e == cudaSuccess && !m->r_host) {
            what = "cudaStreamWaitEvent(receiver's buffer free)";
            e = cudaStreamWaitEvent(cs, m->er, 0);
        }
        if (e == cudaSuccess) {
            if (!m->s_host && !m->r_host) {
                what = "cudaMemcpyPeerAsync";
                if (src->dev == dst->dev) e = cudaMemcpyAsync(m->rbuf, m->sbuf, n, cudaMemcpyDeviceToDevice, cs);
                else e = cudaMemcpyPeerAsync(m->rbuf, dst->dev, m->sbuf, src->dev, n, cs);
            } else {
                /* one side in host memory: a copy the host waits for (not the steady-state path) */
                what = "cudaMemcpyAsync (host <-> device)";
                e = cudaMemcpyAsync(m->rbuf, m->sbuf, n, cudaMemcpyDefault, cs);
                if (e == cudaSuccess) e = cudaStreamSynchronize(cs);
            }
        }
        if (e == cudaSuccess && m->ec) {
            what = "cudaEventRecord(copy done)";
            e = cudaEventRecord(m->ec, cs);
        }
        if (cur >= 0 && cur != dst->dev) (void)cudaSetDevice(cur);
        if (e != cudaSuccess) {
            rc = e == cudaErrorMemoryAllocation ? PP_ERR_NOMEM : PP_ERR_TRANSPORT;
            snprintf(m->emsg, sizeof m->emsg, "CUDA error %d (%s) in %s, copying %zu bytes from rank %d to rank %d",
                     (int)e, cudaGetErrorString(e), what, n, m->src, m->dst);
            (void)cudaGetLastError();
        }
    }
    pthread_mutex_lock(&c->mu);
    m->rc = rc;
    m->copied = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* The sender's side is over once the copy is enqueued. The copy may still read the block: the
   message stays on the rank's `reading` list, and the stream waits for the copy only when the
   block is reused (_ppc_reuse), so the sender never idles for its receiver. Sender's thread. */
static pp_result _ppc_send_finish(_ppc_rank* me, _ppc_msg* m) {
    pp_cuda* c = me->c;
    pp_result rc = m->rc;
    if (rc != PP_OK) snprintf(me->err, sizeof me->err, "%s", m->emsg);
    pthread_mutex_lock(&c->mu);
    m->send_done = 1;
    if (rc == PP_OK && !m->s_host && m->ec && m->rbytes > 0) {
        /* the copy may still read the block: the stream waits for it when the block is reused */
        m->held = 1;
        m->pnext = me->reading;
        me->reading = m;
    } else if (m->recv_done) {
        _ppc_msg_release_locked(c, m);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Device ops reuse hook: a pooled block [ptr, ptr + bytes) is about to be written again. The
   rank's stream waits for every copy that may still read it. Rank's thread. */
static void _ppc_reuse(void* user, void* ptr, size_t bytes) {
    _ppc_rank* r = (_ppc_rank*)user;
    pp_cuda* c = r->c;
    _ppc_msg **pp, *m;
    const char *a = (const char*)ptr, *b = a + bytes;
    pthread_mutex_lock(&c->mu);
    for (pp = &r->reading; (m = *pp) != NULL;) {
        const char* s0 = (const char*)m->sbuf;
        if (s0 < b && s0 + m->sbytes > a) {
            cudaError_t e = cudaStreamWaitEvent(r->stream, m->ec, 0);
            if (e != cudaSuccess) _ppc_note(r, e, "cudaStreamWaitEvent(copy done, before a block is reused)");
            *pp = m->pnext;
            m->held = 0;
            if (m->recv_done) _ppc_msg_release_locked(c, m);
        } else if (cudaEventQuery(m->ec) == cudaSuccess) {
            /* that copy is over: nothing to wait for, recycle the message (keeps the list short
               even when nobody calls pp_cuda_step_end) */
            *pp = m->pnext;
            m->held = 0;
            if (m->recv_done) _ppc_msg_release_locked(c, m);
        } else {
            pp = &m->pnext; /* still copying (cudaErrorNotReady, which is not a sticky error) */
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* After every stream drained (between steps): no copy reads a block any more. */
static void _ppc_unhold_all(pp_cuda* c) {
    int i;
    pthread_mutex_lock(&c->mu);
    for (i = 0; i < c->n; i++) {
        _ppc_msg* m;
        while ((m = c->r[i].reading) != NULL) {
            c->r[i].reading = m->pnext;
            m->held = 0;
            if (m->recv_done) _ppc_msg_release_locked(c, m);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* The receiver's stream waits for the copy. Receiver's thread only. */
static pp_result _ppc_recv_finish(_ppc_rank* me, _ppc_msg* m) {
    pp_cuda* c = me->c;
    pp_result rc = m->rc;
    if (rc == PP_OK && !m->r_host && m->ec && m->rbytes > 0) {
        cudaError_t e = cudaStreamWaitEvent(me->stream, m->ec, 0);
        if (e != cudaSuccess) {
            _ppc_note(me, e, "cudaStreamWaitEvent(copy done, on the receiver's stream)");
            rc = PP_ERR_TRANSPORT;
        }
    } else if (rc != PP_OK) {
        snprintf(me->err, sizeof me->err, "%s", m->emsg);
    }
    pthread_mutex_lock(&c->mu);
    m->recv_done = 1;
    if (m->send_done && !m->held) _ppc_msg_release_locked(c, m);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A request that finished inside isend/irecv keeps its result in id (2 + rc). */
static void _ppc_req_finished(pp_request* req, pp_result rc) {
    req->done = 1;
    req->impl = NULL;
    req->id = 2 + (int64_t)rc;
}

static pp_result _ppc_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg *m, *x, **pp;
    cudaEvent_t es = NULL;
    cudaError_t e;
    int host, matched;
    if (!req || peer < 0 || peer >= c->n || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    host = _ppc_is_host(buf);
    if (!host) {
        if ((e = cudaSetDevice(me->dev)) != cudaSuccess || (e = _ppc_ev_get(c, me, &es)) != cudaSuccess ||
            (e = cudaEventRecord(es, me->stream)) != cudaSuccess) {
            _ppc_note(me, e, "isend (recording the data-ready event)");
            return PP_ERR_TRANSPORT;
        }
    }
    pthread_mutex_lock(&c->mu);
    for (m = NULL, pp = &c->r[peer].queue; (x = *pp) != NULL; pp = &x->next)
        if (x->src == me->rank && x->tag == tag && !x->has_send) {
            m = x;
            *pp = x->next; /* matched: leaves the queue */
            m->next = NULL;
            break;
        }
    if (!m) {
        if (!(m = _ppc_msg_new_locked(c))) {
            _ppc_ev_put_locked(me, es);
            pthread_mutex_unlock(&c->mu);
            return PP_ERR_NOMEM;
        }
        m->src = me->rank;
        m->dst = peer;
        m->tag = tag;
        for (pp = &c->r[peer].queue; *pp; pp = &(*pp)->next) {
        }
        *pp = m; /* appended: equal (source, tag) pairs match first in first out */
    }
    m->has_send = 1;
    m->sbuf = buf;
    m->sbytes = bytes;
    m->s_host = host;
    m->es = es;
    matched = m->has_recv;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    req->impl = m;
    req->id = 0;
    if (matched) {
        _ppc_copy(c, m);
        _ppc_req_finished(req, _ppc_send_finish(me, m));
    }
    return PP_OK;
}

static pp_result _ppc_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg *m, *x, **pp;
    cudaEvent_t er = NULL, ec = NULL;
    cudaError_t e;
    int host, matched;
    if (!req || peer < 0 || peer >= c->n || (bytes && !buf)) return PP_ERR_INVALID;
    memset(req, 0, sizeof *req);
    host = _ppc_is_host(buf);
    if (!host) {
        /* the copy into buf must wait for everything this rank enqueued on buf so far */
        if ((e = cudaSetDevice(me->dev)) != cudaSuccess || (e = _ppc_ev_get(c, me, &er)) != cudaSuccess ||
            (e = _ppc_ev_get(c, me, &ec)) != cudaSuccess || (e = cudaEventRecord(er, me->stream)) != cudaSuccess) {
            _ppc_note(me, e, "irecv (recording the buffer-free event)");
            pthread_mutex_lock(&c->mu);
            _ppc_ev_put_locked(me, er);
            _ppc_ev_put_locked(me, ec);
            pthread_mutex_unlock(&c->mu);
            return PP_ERR_TRANSPORT;
        }
    }
    pthread_mutex_lock(&c->mu);
    for (m = NULL, pp = &me->queue; (x = *pp) != NULL; pp = &x->next)
        if (x->src == peer && x->tag == tag && !x->has_recv) {
            m = x;
            *pp = x->next;
            m->next = NULL;
            break;
        }
    if (!m) {
        if (!(m = _ppc_msg_new_locked(c))) {
            _ppc_ev_put_locked(me, er);
            _ppc_ev_put_locked(me, ec);
            pthread_mutex_unlock(&c->mu);
            return PP_ERR_NOMEM;
        }
        m->src = peer;
        m->dst = me->rank;
        m->tag = tag;
        for (pp = &me->queue; *pp; pp = &(*pp)->next) {
        }
        *pp = m;
    }
    m->has_recv = 1;
    m->rbuf = buf;
    m->rbytes = bytes;
    m->r_host = host;
    m->er = er;
    m->ec = ec;
    matched = m->has_send;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    req->impl = m;
    req->id = 1;
    if (matched) {
        _ppc_copy(c, m);
        _ppc_req_finished(req, _ppc_recv_finish(me, m));
    }
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

static pp_result _ppc_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    struct timespec ts;
    double deadline = _ppc_now_real(&ts) + (timeout_s > 0 ? timeout_s : PP_DEFAULT_TIMEOUT_S);
    int is_send, peer, tag, copied, posted, aborted;
    pp_result rc;
    if (!req) return _pp_fail(err, PP_ERR_INVALID, "wait on a NULL request");
    if (req->done) {
        rc = req->id >= 2 ? (pp_result)(req->id - 2) : PP_OK;
        if (rc != PP_OK) return _pp_fail(err, rc, "rank %d: %s", me->rank, me->err);
        return PP_OK;
    }
    m = (_ppc_msg*)req->impl;
    if (!m) return _pp_fail(err, PP_ERR_INVALID, "wait on a request that was never posted");
    if (cudaSetDevice(me->dev) != cudaSuccess) (void)cudaGetLastError();
    is_send = req->id == 0;
    pthread_mutex_lock(&c->mu);
    _PPC_WAIT_UNTIL(c, m->copied, deadline);
    copied = m->copied;
    posted = is_send ? m->has_recv : m->has_send;
    peer = is_send ? m->dst : m->src;
    tag = m->tag;
    aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (!copied) {
        if (aborted)
            return _pp_fail(err, PP_ERR_ABORTED, "rank %d: %s rank %d aborted: %s", me->rank,
                            is_send ? "send to" : "receive from", peer, c->abort_msg);
        return _pp_fail(err, PP_ERR_TIMEOUT, "rank %d waited %.3g s for rank %d to %s tag %d%s", me->rank, timeout_s, peer,
                        is_send ? "post the receive of" : "send", tag, posted ? " (matched, copy pending)" : "");
    }
    rc = is_send ? _ppc_send_finish(me, m) : _ppc_recv_finish(me, m);
    req->done = 1;
    req->impl = NULL;
    if (rc != PP_OK) return _pp_fail(err, rc, "rank %d: %s", me->rank, me->err);
    return PP_OK;
}

static pp_result _ppc_test(void* self, pp_request* req, int* done) {
    _ppc_rank* me = (_ppc_rank*)self;
    pp_cuda* c = me->c;
    _ppc_msg* m;
    int copied;
    pp_result rc;
    if (!req || !done) return PP_ERR_INVALID;
    *done = 0;
    if (req->done) {
        *done = 1;
        return req->id >= 2 ? (pp_result)(req->id - 2) : PP_OK;
    }
    m = (_ppc_msg*)req->impl;
    if (!m) return PP_ERR_INVALID;
    pthread_mutex_lock(&c->mu);
    copied = m->copied;
    pthread_mutex_unlock(&c->mu);
    if (!copied) return PP_OK;
    if (cudaSetDevice(me->dev) != cudaSuccess) (void)cudaGetLastError();
    rc = req->id == 0 ? _ppc_send_finish(me, m) : _ppc_recv_finish(me, m);
    _ppc_req_finished(req, rc);
    *done = 1;
    return rc;
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
    if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        _ppc_note(r, e, "cudaMalloc (block pool)");
        (void)cudaGetLastError();
        return NULL;
    }
    r->pool_bytes += bytes;
    r->pool_allocs++;
    return p;
}

static void _ppc_free(void* user, void* ptr) {
    _ppc_rank* r = (_ppc_rank*)user;
    /* the pool is freed at destroy: let the rank's work on it finish first */
    if (cudaSetDevice(r->dev) == cudaSuccess) (void)cudaStreamSynchronize(r->stream);
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

static pp_result _ppc_zero(void* user, void* ptr, size_t bytes) {
    _ppc_rank* r = (_ppc_rank*)user;
    cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, r->stream);
    if (e != cudaSuccess) {
        _ppc_note(r, e, "cudaMemsetAsync (gradient workspace)");
        return PP_ERR_TRANSPORT;
    }
    return PP_OK;
}

static void _ppc_mark(void* user, const pp_action* a, int idx, int phase) {
    _ppc_rank* r = (_ppc_rank*)user;
    cudaError_t e;
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
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    *out = c; /* from here pp_cuda_destroy cleans up a half-built world */
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        r->c = c;
        r->rank = i;
        r->dev = d->devices ? d->devices[i] : 0;
        if (!(r->copy_from = (cudaStream_t*)_pp_calloc((size_t)c->n, sizeof(cudaStream_t)))) {
            pp_cuda_destroy(c);
            *out = NULL;
            return _pp_fail(err, PP_ERR_NOMEM, "copy streams of rank %d", i);
        }
        if ((e = cudaSetDevice(r->dev)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking)) != cudaSuccess ||
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
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        if (cudaSetDevice(r->dev) != cudaSuccess) continue;
        if (r->stream) (void)cudaStreamSynchronize(r->stream);
        for (k = 0; r->copy_from && k < c->n; k++)
            if (r->copy_from[k]) (void)cudaStreamSynchronize(r->copy_from[k]);
    }
    /* leftovers of an aborted step (posted by one side, or never waited for): their events
       go back to the pools, which are destroyed below */
    for (m = c->all_msgs; m; m = m->all)
        if (m->live) _ppc_msg_release_locked(c, m);
    for (i = 0; i < c->n; i++) {
        _ppc_rank* r = &c->r[i];
        if (cudaSetDevice(r->dev) != cudaSuccess) (void)cudaGetLastError();
        for (k = 0; k < r->n_ev; k++) (void)cudaEventDestroy(r->ev[k]);
        for (k = 0; r->tev && k < 2 * r->tcap; k++)
            if (r->tev[k]) (void)cudaEventDestroy(r->tev[k]);
        if (r->origin) (void)cudaEventDestroy(r->origin);
        if (r->stream) (void)cudaStreamDestroy(r->stream);
        for (k = 0; r->copy_from && k < c->n; k++)
            if (r->copy_from[k]) (void)cudaStreamDestroy(r->copy_from[k]);
        PP_FREE(r->copy_from);
        PP_FREE(r->ev);
        PP_FREE(r->tev);
        PP_FREE(r->tact);
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
    pp_transport t;
    memset(&t, 0, sizeof t);
    if (!c || rank < 0 || rank >= c->n) return t;
    t.self = &c->r[rank];
    t.rank = rank;
    t.size = c->n;
    t.isend = _ppc_isend;
    t.irecv = _ppc_irecv;
    t.wait = _ppc_wait;
    t.test = _ppc_test;
    t.abort = _ppc_abort;
    return t;
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
    o.user = &c->r[rank];
    return o;
}

cudaStream_t pp_cuda_stream(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].stream : NULL; }
int pp_cuda_device(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].dev : -1; }

void pp_cuda_memory(pp_cuda* c, int rank, size_t* bytes, int* allocs) {
    int ok = c && rank >= 0 && rank < c->n;
    if (bytes) *bytes = ok ? c->r[rank].pool_bytes : 0;
    if (allocs) *allocs = ok ? c->r[rank].pool_allocs : 0;
}

const char* pp_cuda_error(pp_cuda* c, int rank) { return (c && rank >= 0 && rank < c->n) ? c->r[rank].err : "no such rank"; }

void pp_cuda_reset(pp_cuda* c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->aborted = 0;
    c->abort_code = PP_OK;
    c->abort_msg[0] = 0;
    pthread_mutex_unlock(&c->mu);
}

/* Waits for every stream; then no copy reads a block any more. Between steps only. */
static pp_result _ppc_sync_all(pp_cuda* c, pp_error* err) {
    int i, k;
    for (i = 0; i < c->n; i++) {
        PP_CUDA_CHECK(cudaSetDevice(c->r[i].dev), err);
        for (k = 0; k < c->n; k++)
            if (c->r[i].copy_from[k]) PP_CUDA_CHECK(cudaStreamSynchronize(c->r[i].copy_from[k]), err);
        PP_CUDA_CHECK(cudaStreamSynchronize(c->r[i].stream), err);
    }
    _ppc_unhold_all(c);
    return PP_OK;
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
    if (d->stage.device.alloc || d->stage.device.free || d->stage.device.zero || d->stage.device.mark || d->stage.device.reuse)
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
