/* tests/fakecuda/cuda_runtime_api.h - a host imitation of the CUDA runtime, for testing
   pipeline_cuda.h, pipeline_nccl.h (with tests/fakenccl) and their clients on machines without
   a GPU. Built with -Itests/fakecuda in place of the real header. Only what those callers use.

   The rules, each from the CUDA documentation ([PG: ...] the CUDA C++ Programming Guide, [RT:
   ...] the CUDA Runtime API reference and its "API synchronization behavior" page):
   - Streams are real: each is a worker thread running its queue in order (copies, memsets,
     event records and waits, host functions, "kernels"), with small random delays, so work on
     different streams overlaps and a missing dependency shows up as wrong data or, under
     ThreadSanitizer, a data race.
   - Device memory is not host memory: cudaMalloc returns addresses in a reserved range that the
     host cannot read or write (PROT_NONE: a host dereference faults). Its bytes live in a second
     mapping that only the imitation touches: stream workers, and kernels through
     fakecuda_dev_ptr(). Freed memory is unmapped there too, so a late access faults.
   - Kernels: fakecuda_launch(stream, fn, user) runs fn(user) on the stream's worker; a nonzero
     return is the error it raised. A launch on a stream of a device other than the current one
     fails [PG: Stream and Event Behavior: "A kernel launch will fail if it is issued to a stream
     that is not associated to the current device"]; a copy there succeeds; cudaEventRecord
     fails when event and stream belong to different devices; cudaStreamWaitEvent,
     cudaEventQuery and cudaEventSynchronize work across devices.
   - Errors: a failed call sets the thread's last error (cudaGetLastError reads and clears it).
     A faulting kernel poisons its device [RT: cudaErrorIllegalAddress, "the context cannot be
     used, so it must be destroyed"]: from then on calls on that device return the error and its
     streams run nothing more (fakecuda_clear_error() is the tests' way back).
   - The legacy default stream (0, cudaStreamLegacy; cudaStreamPerThread is treated the same):
     one per device; work on it waits for all blocking streams of the device and blocking
     streams wait for it; streams made with cudaStreamNonBlocking do neither [PG: Default
     Stream, Implicit Synchronization].
   - Copies [RT: API synchronization behavior]: device to host returns only once done (any
     host memory, async or not); pageable host to device reads the host bytes before returning
     (cudaMemcpy first waits for the legacy stream) and completes on the stream later; pinned
     host memory (cudaMallocHost) is asynchronous for the Async forms; host to host is done at
     once; device to device does not block the host.
   - cudaFree waits for every stream of the memory's device [PG: Stream-Ordered Memory
     Allocator: "cudaMalloc and cudaFree causes the GPU to synchronize across all executing
     CUDA streams"] (cudaMalloc does not here). cudaEventDestroy and cudaStreamDestroy return at
     once; the resources go when the pending work completes [RT: cudaEventDestroy,
     cudaStreamDestroy]. Events follow CUDA's rules: a wait waits for the record last enqueued
     when it was called; a never-recorded event is complete.
   - Host functions (cudaLaunchHostFunc) may not call CUDA: calls from one return
     cudaErrorNotPermitted [RT: cudaLaunchHostFunc].
   - Counters (fakecuda_stats_get): runtime calls by kind, host waits on device work, polls.
   FAKECUDA_DEVICES (default 4) devices exist; FAKECUDA_ARENA_BYTES (default 4 GiB of address
   space, committed only where allocated) bounds device memory. Everything is static inline:
   one translation unit. */
#ifndef FAKECUDA_RUNTIME_API_H
#define FAKECUDA_RUNTIME_API_H

#if !defined(_POSIX_C_SOURCE) && !defined(__cplusplus)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep under -std=c99 */
#endif

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef FAKECUDA_DEVICES
#define FAKECUDA_DEVICES 4
#endif
#ifndef FAKECUDA_ARENA_BYTES
#define FAKECUDA_ARENA_BYTES ((size_t)4 << 30)
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void* devicePointer;
    void* hostPointer;
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

typedef struct fk_event fk_event;
typedef fk_event* cudaEvent_t;
typedef struct fk_stream fk_stream;
typedef fk_stream* cudaStream_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

typedef void (*cudaHostFn_t)(void* user);
/* A "kernel": runs on the stream's worker; returns 0, or the CUDA error it raised. It reaches
   device memory only through fakecuda_dev_ptr(). After a fault on its device it is not run. */
typedef int (*fakecuda_kernel)(void* user);

/* ---- counters ---- */
enum {
    FAKECUDA_CALL_MALLOC, FAKECUDA_CALL_FREE, FAKECUDA_CALL_MEMCPY, FAKECUDA_CALL_MEMCPY_ASYNC, FAKECUDA_CALL_MEMSET,
    FAKECUDA_CALL_MEMSET_ASYNC, FAKECUDA_CALL_LAUNCH, FAKECUDA_CALL_HOST_FUNC, FAKECUDA_CALL_EVENT_CREATE,
    FAKECUDA_CALL_EVENT_DESTROY, FAKECUDA_CALL_EVENT_RECORD, FAKECUDA_CALL_EVENT_QUERY, FAKECUDA_CALL_EVENT_SYNC,
    FAKECUDA_CALL_EVENT_ELAPSED, FAKECUDA_CALL_STREAM_CREATE, FAKECUDA_CALL_STREAM_DESTROY, FAKECUDA_CALL_STREAM_WAIT_EVENT,
    FAKECUDA_CALL_STREAM_SYNC, FAKECUDA_CALL_STREAM_QUERY, FAKECUDA_CALL_DEVICE_SYNC, FAKECUDA_CALL_SET_DEVICE,
    FAKECUDA_CALL_GET_DEVICE, FAKECUDA_CALL_POINTER_ATTR, FAKECUDA_CALL_GET_LAST_ERROR, FAKECUDA_CALL_OTHER,
    FAKECUDA_CALL_KINDS
};

typedef struct fakecuda_stats {
    uint64_t calls[FAKECUDA_CALL_KINDS]; /* runtime calls by kind (fakecuda_call_name) */
    uint64_t host_waits;        /* calls that block the host until device work completes */
    uint64_t host_blocked;      /* of those, the ones that found work pending */
    uint64_t polls_not_ready;   /* cudaEventQuery / cudaStreamQuery answering cudaErrorNotReady */
    uint64_t events_live, streams_live; /* not yet released (a destroyed one with pending work counts) */
    uint64_t device_bytes;      /* allocated now */
} fakecuda_stats;

#ifdef __cplusplus
extern "C" {
#endif

/* ---- internals ------------------------------------------------------------------------------- */

struct fk_event {
    int dev, flags;
    uint64_t recorded;          /* records enqueued */
    uint64_t done;              /* records completed */
    double t;                   /* when the last completed record ran */
    int refs;                   /* the handle, and every record and wait still queued */
};

enum { FK_COPY, FK_SET, FK_RECORD, FK_WAIT, FK_WAITSTREAM, FK_HOST, FK_KERNEL, FK_STOP };
typedef struct fk_op {
    struct fk_op* next;
    int kind;
    void* dst;                  /* copies and memsets: addresses the worker may touch */
    const void* src;
    void* staged;               /* a host-to-device copy's staging buffer, freed when done */
    size_t n;
    int val;
    fk_event* ev;
    uint64_t gen;
    struct fk_stream* target;   /* FK_WAITSTREAM: wait until target finished pos operations */
    uint64_t pos;
    cudaHostFn_t fn;
    fakecuda_kernel kern;
    void* user;
    struct fk_hwq* q;           /* the hardware queue it holds (FAKECUDA_MAX_CONNECTIONS), or NULL */
    uint64_t ticket;            /* its place in that queue */
} fk_op;

/* A hardware work queue (a "connection"): with FAKECUDA_MAX_CONNECTIONS=N, a device's streams
   share N queues (a new stream takes the one with the fewest live streams: up to N streams each
   have their own, beyond that they share), and a queue runs its operations one
   after another in the order they were enqueued, whatever their stream: an operation waits
   behind another stream's earlier one (an event wait, a kernel that waits for a peer) on its
   queue [PG: Implicit Synchronization, Overlapping Behavior; CUDA_DEVICE_MAX_CONNECTIONS: the
   number of work queues from the host to the device, 8 by default, streams beyond share them:
   "false dependencies"]. N is FAKECUDA_MAX_CONNECTIONS, else CUDA_DEVICE_MAX_CONNECTIONS, else
   8 (CUDA's default), read when a stream is made; FAKECUDA_MAX_CONNECTIONS=0: every stream its
   own queue. tools/conn_probe.cu asks a GPU whether it behaves so. */
typedef struct fk_hwq {
    uint64_t next, serving;
    int streams;                /* live streams on it */
} fk_hwq;

struct fk_stream {
    struct fk_stream* next;     /* every live stream */
    int dev, flags, legacy;
    fk_hwq* q;                  /* its hardware queue (FAKECUDA_MAX_CONNECTIONS), or NULL */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fk_op *head, *tail;
    uint64_t queued, finished;
    unsigned rng;
    int refs;                   /* the handle (until its worker stops) and waits of other streams */
};

typedef struct fk_alloc {
    char* p;                    /* the device address */
    size_t n, span;             /* bytes asked, bytes reserved (pages, with a guard page) */
    int dev;
} fk_alloc;

typedef struct fk_range {
    struct fk_range* next;
    size_t off, span;
} fk_range;

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;  /* everything below */
static pthread_cond_t fk_ev_cv = PTHREAD_COND_INITIALIZER; /* an event record completed */
static __thread int fk_cur_dev;
static __thread cudaError_t fk_last_err;
static __thread int fk_in_host_fn;
static __thread uint64_t fk_thread_calls;
static __thread uint64_t fk_thread_waits; /* host waits and not-ready polls of the calling thread */
static __thread uint64_t fk_thread_polls; /* not-ready polls of the calling thread */
static cudaError_t fk_sticky[FAKECUDA_DEVICES];
static fk_stream* fk_legacy[FAKECUDA_DEVICES];
static fk_stream* fk_streams;
static fakecuda_stats fk_st;
static pthread_cond_t fk_hw_cv = PTHREAD_COND_INITIALIZER; /* a hardware queue moved on */
static fk_hwq fk_hw[FAKECUDA_DEVICES][64];
static uint64_t fk_queue_shared; /* streams placed on a queue that already held a live stream */
static uint64_t fk_streams_made[FAKECUDA_DEVICES];

/* device memory: addresses in [fk_dev, fk_dev + FAKECUDA_ARENA_BYTES), bytes at the same
   offset from fk_rw */
static char *fk_dev, *fk_rw;
static int fk_zero_fd = -1;
static size_t fk_top, fk_page;
static fk_alloc* fk_al;     /* sorted by address */
static int fk_n_al, fk_cap_al;
static fk_range* fk_holes; /* freed spans, reused once the top is reached */
static void** fk_pinned;   /* cudaMallocHost blocks */
static size_t* fk_pinned_n;
static int fk_n_pinned, fk_cap_pinned;

static inline double fk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every API entry: counted; refused inside a host function. */
static inline cudaError_t fk_enter(int kind) {
    fk_thread_calls++;
    pthread_mutex_lock(&fk_mu);
    fk_st.calls[kind]++;
    pthread_mutex_unlock(&fk_mu);
    return fk_in_host_fn ? cudaErrorNotPermitted : cudaSuccess;
}

/* A call's result: a failure is also the thread's last error. */
static inline cudaError_t fk_ret(cudaError_t e) {
    if (e != cudaSuccess && e != cudaErrorNotReady) fk_last_err = e;
    return e;
}

static inline cudaError_t fk_sticky_of(int dev) {
    cudaError_t e;
    if (dev < 0 || dev >= FAKECUDA_DEVICES) return cudaSuccess;
    pthread_mutex_lock(&fk_mu);
    e = fk_sticky[dev];
    pthread_mutex_unlock(&fk_mu);
    return e;
}

/* ---- device memory (fk_mu held) ---- */

static inline int fk_arena_init(void) {
    void *d, *r;
    if (fk_dev) return 1;
    fk_page = (size_t)sysconf(_SC_PAGESIZE);
    if ((fk_zero_fd = open("/dev/zero", O_RDWR)) < 0) return 0;
    d = mmap(NULL, FAKECUDA_ARENA_BYTES, PROT_NONE, MAP_PRIVATE, fk_zero_fd, 0);
    r = mmap(NULL, FAKECUDA_ARENA_BYTES, PROT_NONE, MAP_PRIVATE, fk_zero_fd, 0);
    if (d == MAP_FAILED || r == MAP_FAILED) {
        if (d != MAP_FAILED) munmap(d, FAKECUDA_ARENA_BYTES);
        if (r != MAP_FAILED) munmap(r, FAKECUDA_ARENA_BYTES);
        return 0;
    }
    fk_dev = (char*)d;
    fk_rw = (char*)r;
    return 1;
}

/* the allocation holding [p, p + n), or NULL */
static inline fk_alloc* fk_find(const void* p, size_t n) {
    int lo = 0, hi = fk_n_al - 1;
    const char* c = (const char*)p;
    if (!fk_dev || c < fk_dev || c >= fk_dev + FAKECUDA_ARENA_BYTES) return NULL;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        fk_alloc* a = &fk_al[mid];
        if (c < a->p) hi = mid - 1;
        else if (c >= a->p + a->span) lo = mid + 1;
        else return (c + n <= a->p + a->n && c < a->p + (a->n ? a->n : 1)) ? a : NULL;
    }
    return NULL;
}

static inline int fk_in_arena(const void* p) {
    return fk_dev && (const char*)p >= fk_dev && (const char*)p < fk_dev + FAKECUDA_ARENA_BYTES;
}

static inline int fk_is_pinned(const void* p, size_t n) {
    int i;
    for (i = 0; i < fk_n_pinned; i++)
        if ((const char*)p >= (const char*)fk_pinned[i] && (const char*)p + n <= (const char*)fk_pinned[i] + fk_pinned_n[i])
            return 1;
    return 0;
}

/* ---- streams ---- */

static inline void fk_event_unref(fk_event* e) { /* fk_mu held */
    if (--e->refs == 0) {
        fk_st.events_live--;
        free(e);
    }
}

static inline void fk_stream_unref(fk_stream* s) { /* fk_mu held */
    fk_stream** pp;
    if (--s->refs > 0) return;
    for (pp = &fk_streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    fk_st.streams_live--;
    if (s->q) s->q->streams--;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static inline void* fk_worker(void* arg) {
    fk_stream* s = (fk_stream*)arg;
    for (;;) {
        fk_op* op;
        int dead, stop;
        pthread_mutex_lock(&s->mu);
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        op = s->head;
        s->rng = s->rng * 1103515245u + 12345u;
        pthread_mutex_unlock(&s->mu);
        if ((s->rng >> 16) % 4 == 0) { /* shake the timing: streams overlap differently each run */
            struct timespec d = {0, 0};
            d.tv_nsec = (long)((s->rng >> 8) % 40000);
            nanosleep(&d, NULL);
        }
        if (op->q) { /* behind the earlier operations of other streams on its hardware queue */
            pthread_mutex_lock(&fk_mu);
            while (op->q->serving != op->ticket) pthread_cond_wait(&fk_hw_cv, &fk_mu);
            pthread_mutex_unlock(&fk_mu);
        }
        dead = fk_sticky_of(s->dev) != cudaSuccess; /* a faulted device runs nothing more */
        switch (op->kind) {
        case FK_COPY:
            if (!dead) memmove(op->dst, op->src, op->n);
            free(op->staged);
            break;
        case FK_SET:
            if (!dead) memset(op->dst, op->val, op->n);
            break;
        case FK_HOST:
            if (!dead) {
                fk_in_host_fn = 1;
                op->fn(op->user);
                fk_in_host_fn = 0;
            }
            break;
        case FK_KERNEL:
            if (!dead) {
                int e = op->kern(op->user);
                if (e != 0) {
                    pthread_mutex_lock(&fk_mu);
                    if (fk_sticky[s->dev] == cudaSuccess) fk_sticky[s->dev] = (cudaError_t)e;
                    pthread_mutex_unlock(&fk_mu);
                }
            }
            break;
        case FK_RECORD:
            pthread_mutex_lock(&fk_mu);
            if (op->gen > op->ev->done) {
                op->ev->done = op->gen;
                op->ev->t = fk_now();
            }
            fk_event_unref(op->ev);
            pthread_cond_broadcast(&fk_ev_cv);
            pthread_mutex_unlock(&fk_mu);
            break;
        case FK_WAIT:
            pthread_mutex_lock(&fk_mu);
            while (op->ev->done < op->gen) pthread_cond_wait(&fk_ev_cv, &fk_mu);
            fk_event_unref(op->ev);
            pthread_mutex_unlock(&fk_mu);
            break;
        case FK_WAITSTREAM:
            pthread_mutex_lock(&op->target->mu);
            while (op->target->finished < op->pos) pthread_cond_wait(&op->target->cv, &op->target->mu);
            pthread_mutex_unlock(&op->target->mu);
            pthread_mutex_lock(&fk_mu);
            fk_stream_unref(op->target);
            pthread_mutex_unlock(&fk_mu);
            break;
        default: break;
        }
        stop = op->kind == FK_STOP;
        if (op->q) {
            pthread_mutex_lock(&fk_mu);
            op->q->serving++;
            pthread_cond_broadcast(&fk_hw_cv);
            pthread_mutex_unlock(&fk_mu);
        }
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->finished++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        free(op);
        if (stop) break;
    }
    pthread_mutex_lock(&fk_mu);
    fk_stream_unref(s); /* the handle's reference: destroyed, and its work is done */
    pthread_mutex_unlock(&fk_mu);
    return NULL;
}

/* fk_mu held */
static inline fk_stream* fk_stream_new(int dev, unsigned flags, int legacy) {
    int fk_max_conn;
    pthread_t th;
    fk_stream* s = (fk_stream*)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dev = dev;
    s->flags = (int)flags;
    s->legacy = legacy;
    {
        const char* e = getenv("FAKECUDA_MAX_CONNECTIONS");
        if (!e || !*e) e = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        fk_max_conn = e && *e ? atoi(e) : 8;
        if (fk_max_conn < 0 || fk_max_conn > 64) fk_max_conn = fk_max_conn < 0 ? 0 : 64;
    }
    if (dev >= 0 && dev < FAKECUDA_DEVICES) fk_streams_made[dev]++;
    if (fk_max_conn > 0 && dev >= 0 && dev < FAKECUDA_DEVICES) {
        int i, best = 0;
        for (i = 1; i < fk_max_conn; i++)
            if (fk_hw[dev][i].streams < fk_hw[dev][best].streams) best = i;
        s->q = &fk_hw[dev][best];
        if (s->q->streams) fk_queue_shared++;
        s->q->streams++;
    }
    s->rng = (unsigned)(uintptr_t)s;
    s->refs = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&th, NULL, fk_worker, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    pthread_detach(th);
    s->next = fk_streams;
    fk_streams = s;
    fk_st.streams_live++;
    return s;
}

/* A stream argument: 0, cudaStreamLegacy and cudaStreamPerThread are the current device's
   legacy default stream (made on first use). NULL only when out of memory. */
static inline fk_stream* fk_resolve(cudaStream_t s) {
    fk_stream* r;
    if (s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
    pthread_mutex_lock(&fk_mu);
    if (!fk_legacy[fk_cur_dev]) fk_legacy[fk_cur_dev] = fk_stream_new(fk_cur_dev, 0, 1);
    r = fk_legacy[fk_cur_dev];
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* fk_mu held, not s->mu: appends op to s; returns the position it completes at */
static inline uint64_t fk_append(fk_stream* s, fk_op* op) {
    uint64_t pos;
    op->next = NULL;
    if (s->q) { /* its place on the stream's hardware queue: enqueue order (fk_mu held) */
        op->q = s->q;
        op->ticket = s->q->next++;
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pos = ++s->queued;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return pos;
}

/* fk_mu held: s waits for everything enqueued so far on t */
static inline void fk_wait_stream_locked(fk_stream* s, fk_stream* t) {
    fk_op* w;
    uint64_t pos;
    pthread_mutex_lock(&t->mu);
    pos = t->queued;
    pthread_mutex_unlock(&t->mu);
    if (t->finished >= pos) return; /* a stale read only adds a harmless wait */
    if (!(w = (fk_op*)calloc(1, sizeof *w))) return;
    w->kind = FK_WAITSTREAM;
    w->target = t;
    w->pos = pos;
    t->refs++;
    fk_append(s, w);
}

/* Enqueues op on s with the legacy stream's implicit synchronisation; returns the position. */
static inline uint64_t fk_push(fk_stream* s, fk_op* op) {
    uint64_t pos;
    pthread_mutex_lock(&fk_mu);
    if (s->legacy) {
        fk_stream* b;
        for (b = fk_streams; b; b = b->next)
            if (b != s && b->dev == s->dev && !b->legacy && !(b->flags & cudaStreamNonBlocking)) fk_wait_stream_locked(s, b);
    } else if (!(s->flags & cudaStreamNonBlocking) && fk_legacy[s->dev]) {
        fk_wait_stream_locked(s, fk_legacy[s->dev]);
    }
    pos = fk_append(s, op);
    pthread_mutex_unlock(&fk_mu);
    return pos;
}

static inline fk_op* fk_new(int kind) {
    fk_op* op = (fk_op*)calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

/* The host waits until s finished pos operations (counted as a host wait). */
static inline void fk_host_wait(fk_stream* s, uint64_t pos) {
    int blocked;
    pthread_mutex_lock(&s->mu);
    blocked = s->finished < pos;
    while (s->finished < pos) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&fk_mu);
    fk_st.host_waits++;
    fk_thread_waits++;
    fk_st.host_blocked += (uint64_t)blocked;
    pthread_mutex_unlock(&fk_mu);
}

/* Waits for every stream of dev (a destroyed one with work left included). */
static inline void fk_device_wait(int dev) {
    fk_stream* list[256];
    uint64_t pos[256];
    int n = 0, i, blocked = 0;
    fk_stream* s;
    pthread_mutex_lock(&fk_mu);
    for (s = fk_streams; s && n < 256; s = s->next)
        if (s->dev == dev) {
            s->refs++;
            list[n] = s;
            pthread_mutex_lock(&s->mu);
            pos[n++] = s->queued;
            pthread_mutex_unlock(&s->mu);
        }
    pthread_mutex_unlock(&fk_mu);
    for (i = 0; i < n; i++) {
        pthread_mutex_lock(&list[i]->mu);
        blocked |= list[i]->finished < pos[i];
        while (list[i]->finished < pos[i]) pthread_cond_wait(&list[i]->cv, &list[i]->mu);
        pthread_mutex_unlock(&list[i]->mu);
    }
    pthread_mutex_lock(&fk_mu);
    for (i = 0; i < n; i++) fk_stream_unref(list[i]);
    fk_st.host_waits++;
    fk_thread_waits++;
    fk_st.host_blocked += (uint64_t)blocked;
    pthread_mutex_unlock(&fk_mu);
}

/* ---- the runtime API ---------------------------------------------------------------------------- */

static inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    default: return "cudaErrorUnknown";
    }
}

static inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotPermitted: return "operation not permitted";
    default: return "unknown error";
    }
}

/* The thread's last error, cleared; a device's sticky error is returned and stays. */
static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e;
    fk_enter(FAKECUDA_CALL_GET_LAST_ERROR);
    e = fk_sticky_of(fk_cur_dev);
    if (e != cudaSuccess) return e;
    e = fk_last_err;
    fk_last_err = cudaSuccess;
    return e;
}

static inline cudaError_t cudaPeekAtLastError(void) {
    cudaError_t e;
    fk_enter(FAKECUDA_CALL_GET_LAST_ERROR);
    e = fk_sticky_of(fk_cur_dev);
    return e != cudaSuccess ? e : fk_last_err;
}

static inline cudaError_t cudaGetDeviceCount(int* n) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_OTHER);
    if (e != cudaSuccess || !n) return fk_ret(e != cudaSuccess ? e : cudaErrorInvalidValue);
    *n = FAKECUDA_DEVICES;
    return cudaSuccess;
}

static inline cudaError_t cudaSetDevice(int d) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_SET_DEVICE);
    if (e != cudaSuccess) return fk_ret(e);
    if (d < 0 || d >= FAKECUDA_DEVICES) return fk_ret(cudaErrorInvalidDevice);
    fk_cur_dev = d;
    return cudaSuccess;
}

static inline cudaError_t cudaGetDevice(int* d) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_GET_DEVICE);
    if (e != cudaSuccess || !d) return fk_ret(e != cudaSuccess ? e : cudaErrorInvalidValue);
    *d = fk_cur_dev;
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceCanAccessPeer(int* can, int a, int b) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_OTHER);
    if (e != cudaSuccess) return fk_ret(e);
    if (!can || a < 0 || b < 0 || a >= FAKECUDA_DEVICES || b >= FAKECUDA_DEVICES) return fk_ret(cudaErrorInvalidDevice);
    *can = a != b;
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_OTHER);
    (void)flags;
    if (e != cudaSuccess) return fk_ret(e);
    if (peer < 0 || peer >= FAKECUDA_DEVICES || peer == fk_cur_dev) return fk_ret(cudaErrorInvalidDevice);
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceSynchronize(void) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_DEVICE_SYNC);
    if (e != cudaSuccess) return fk_ret(e);
    fk_device_wait(fk_cur_dev);
    return fk_ret(fk_sticky_of(fk_cur_dev));
}

static inline cudaError_t cudaMalloc(void** p, size_t n) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MALLOC);
    size_t span;
    size_t off = (size_t)-1;
    fk_range **hp, *h;
    int i;
    if (e != cudaSuccess) return fk_ret(e);
    if (!p) return fk_ret(cudaErrorInvalidValue);
    if ((e = fk_sticky_of(fk_cur_dev)) != cudaSuccess) return fk_ret(e);
    pthread_mutex_lock(&fk_mu);
    if (!fk_arena_init()) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorMemoryAllocation);
    }
    if (fk_n_al == fk_cap_al) {
        int cap = fk_cap_al ? 2 * fk_cap_al : 64;
        fk_alloc* na = (fk_alloc*)realloc(fk_al, sizeof(fk_alloc) * (size_t)cap);
        if (!na) {
            pthread_mutex_unlock(&fk_mu);
            return fk_ret(cudaErrorMemoryAllocation);
        }
        fk_al = na;
        fk_cap_al = cap;
    }
    span = ((n ? n : 1) + fk_page - 1) / fk_page * fk_page + fk_page; /* and a guard page */
    if (fk_top + span <= FAKECUDA_ARENA_BYTES) {
        off = fk_top;
        fk_top += span;
    } else {
        for (hp = &fk_holes; (h = *hp) != NULL; hp = &h->next)
            if (h->span >= span) {
                off = h->off;
                h->off += span;
                h->span -= span;
                if (!h->span) {
                    *hp = h->next;
                    free(h);
                }
                break;
            }
    }
    if (off == (size_t)-1) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorMemoryAllocation);
    }
    if (mprotect(fk_rw + off, span - fk_page, PROT_READ | PROT_WRITE) != 0) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorMemoryAllocation);
    }
    memset(fk_rw + off, 0xA5, n); /* cudaMalloc memory is not zeroed: neither is ours */
    for (i = fk_n_al; i > 0 && fk_al[i - 1].p > fk_dev + off; i--) fk_al[i] = fk_al[i - 1];
    fk_al[i].p = fk_dev + off;
    fk_al[i].n = n;
    fk_al[i].span = span;
    fk_al[i].dev = fk_cur_dev;
    fk_n_al++;
    fk_st.device_bytes += n;
    *p = fk_dev + off;
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

/* Waits for the memory's device, then releases it (a later access faults). */
static inline cudaError_t cudaFree(void* p) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_FREE);
    fk_alloc a;
    fk_range* h;
    int i, dev = -1;
    if (e != cudaSuccess) return fk_ret(e);
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&fk_mu);
    for (i = 0; i < fk_n_al; i++)
        if (fk_al[i].p == (char*)p) dev = fk_al[i].dev;
    pthread_mutex_unlock(&fk_mu);
    if (dev < 0) return fk_ret(cudaErrorInvalidValue);
    fk_device_wait(dev);
    pthread_mutex_lock(&fk_mu);
    for (i = 0; i < fk_n_al && fk_al[i].p != (char*)p; i++) {
    }
    if (i == fk_n_al) { /* freed twice meanwhile */
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorInvalidValue);
    }
    a = fk_al[i];
    for (; i + 1 < fk_n_al; i++) fk_al[i] = fk_al[i + 1];
    fk_n_al--;
    fk_st.device_bytes -= a.n;
    /* fresh pages, no access: the memory is given back and a late access faults */
    (void)mmap(fk_rw + (a.p - fk_dev), a.span, PROT_NONE, MAP_PRIVATE | MAP_FIXED, fk_zero_fd, 0);
    if ((h = (fk_range*)malloc(sizeof *h)) != NULL) {
        h->off = (size_t)(a.p - fk_dev);
        h->span = a.span;
        h->next = fk_holes;
        fk_holes = h;
    }
    pthread_mutex_unlock(&fk_mu);
    return fk_ret(fk_sticky_of(dev));
}

/* Pinned host memory: host-accessible, and the Async copies with it do not block. */
static inline cudaError_t cudaMallocHost(void** p, size_t n) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MALLOC);
    void* m;
    if (e != cudaSuccess) return fk_ret(e);
    if (!p) return fk_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&fk_mu);
    if (fk_n_pinned == fk_cap_pinned) {
        int cap = fk_cap_pinned ? 2 * fk_cap_pinned : 16;
        void** np = (void**)realloc(fk_pinned, sizeof(void*) * (size_t)cap);
        size_t* nn;
        if (np) fk_pinned = np;
        nn = (size_t*)realloc(fk_pinned_n, sizeof(size_t) * (size_t)cap);
        if (nn) fk_pinned_n = nn;
        if (!np || !nn) {
            pthread_mutex_unlock(&fk_mu);
            return fk_ret(cudaErrorMemoryAllocation);
        }
        fk_cap_pinned = cap;
    }
    if (!(m = malloc(n ? n : 1))) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorMemoryAllocation);
    }
    fk_pinned[fk_n_pinned] = m;
    fk_pinned_n[fk_n_pinned++] = n ? n : 1;
    pthread_mutex_unlock(&fk_mu);
    *p = m;
    return cudaSuccess;
}

static inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned flags) {
    (void)flags;
    return cudaMallocHost(p, n);
}

static inline cudaError_t cudaFreeHost(void* p) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_FREE);
    int i;
    if (e != cudaSuccess) return fk_ret(e);
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&fk_mu);
    for (i = 0; i < fk_n_pinned && fk_pinned[i] != p; i++) {
    }
    if (i == fk_n_pinned) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorInvalidValue);
    }
    fk_pinned[i] = fk_pinned[fk_n_pinned - 1];
    fk_pinned_n[i] = fk_pinned_n[fk_n_pinned - 1];
    fk_n_pinned--;
    pthread_mutex_unlock(&fk_mu);
    free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* at, const void* p) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_POINTER_ATTR);
    fk_alloc* a;
    if (e != cudaSuccess) return fk_ret(e);
    if (!at) return fk_ret(cudaErrorInvalidValue);
    memset(at, 0, sizeof *at);
    at->device = -2;
    pthread_mutex_lock(&fk_mu);
    if ((a = fk_find(p, 0)) != NULL) {
        at->type = cudaMemoryTypeDevice;
        at->device = a->dev;
        at->devicePointer = (void*)(uintptr_t)p;
    } else if (fk_is_pinned(p, 0)) {
        at->type = cudaMemoryTypeHost;
        at->device = fk_cur_dev;
        at->devicePointer = at->hostPointer = (void*)(uintptr_t)p;
    } else {
        at->hostPointer = (void*)(uintptr_t)p;
    }
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned flags) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_STREAM_CREATE);
    fk_stream* s;
    if (e != cudaSuccess) return fk_ret(e);
    if (!out) return fk_ret(cudaErrorInvalidValue);
    if ((e = fk_sticky_of(fk_cur_dev)) != cudaSuccess) return fk_ret(e);
    pthread_mutex_lock(&fk_mu);
    s = fk_stream_new(fk_cur_dev, flags, 0);
    pthread_mutex_unlock(&fk_mu);
    if (!s) return fk_ret(cudaErrorMemoryAllocation);
    *out = s;
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

/* Returns at once; the stream goes when its work is done. */
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_STREAM_DESTROY);
    fk_op* op;
    if (e != cudaSuccess) return fk_ret(e);
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread || s->legacy) return fk_ret(cudaErrorInvalidResourceHandle);
    if (!(op = fk_new(FK_STOP))) return fk_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&fk_mu);
    fk_append(s, op);
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamSynchronize(cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_STREAM_SYNC);
    fk_stream* s;
    uint64_t pos;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&s->mu);
    pos = s->queued;
    pthread_mutex_unlock(&s->mu);
    fk_host_wait(s, pos);
    return fk_ret(fk_sticky_of(s->dev));
}

static inline cudaError_t cudaStreamQuery(cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_STREAM_QUERY);
    fk_stream* s;
    int busy;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    pthread_mutex_lock(&s->mu);
    busy = s->finished < s->queued;
    pthread_mutex_unlock(&s->mu);
    if (!busy) return cudaSuccess;
    pthread_mutex_lock(&fk_mu);
    fk_st.polls_not_ready++;
    fk_thread_waits++;
    fk_thread_polls++;
    pthread_mutex_unlock(&fk_mu);
    return cudaErrorNotReady;
}

static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned flags) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_CREATE);
    fk_event* ev;
    if (e != cudaSuccess) return fk_ret(e);
    if (!out) return fk_ret(cudaErrorInvalidValue);
    if ((e = fk_sticky_of(fk_cur_dev)) != cudaSuccess) return fk_ret(e);
    if (!(ev = (fk_event*)calloc(1, sizeof *ev))) return fk_ret(cudaErrorMemoryAllocation);
    ev->dev = fk_cur_dev;
    ev->flags = (int)flags;
    ev->refs = 1;
    pthread_mutex_lock(&fk_mu);
    fk_st.events_live++;
    pthread_mutex_unlock(&fk_mu);
    *out = ev;
    return cudaSuccess;
}

static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

/* Returns at once; the event is released once its pending records and waits have run. */
static inline cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_DESTROY);
    if (e != cudaSuccess) return fk_ret(e);
    if (!ev) return fk_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fk_mu);
    fk_event_unref(ev);
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

static inline cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_RECORD);
    fk_stream* s;
    fk_op* op;
    if (e != cudaSuccess) return fk_ret(e);
    if (!ev) return fk_ret(cudaErrorInvalidResourceHandle);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    if (ev->dev != s->dev) return fk_ret(cudaErrorInvalidResourceHandle); /* [PG: Stream and Event Behavior] */
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (!(op = fk_new(FK_RECORD))) return fk_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&fk_mu);
    op->ev = ev;
    op->gen = ++ev->recorded;
    ev->refs++;
    pthread_mutex_unlock(&fk_mu);
    fk_push(s, op);
    return cudaSuccess;
}

/* s waits for the record of ev last enqueued now (none: nothing to wait for); any devices. */
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s0, cudaEvent_t ev, unsigned flags) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_STREAM_WAIT_EVENT);
    fk_stream* s;
    fk_op* op;
    (void)flags;
    if (e != cudaSuccess) return fk_ret(e);
    if (!ev) return fk_ret(cudaErrorInvalidResourceHandle);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (!(op = fk_new(FK_WAIT))) return fk_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&fk_mu);
    op->gen = ev->recorded;
    if (op->gen == 0) {
        pthread_mutex_unlock(&fk_mu);
        free(op);
        return cudaSuccess;
    }
    op->ev = ev;
    ev->refs++;
    pthread_mutex_unlock(&fk_mu);
    fk_push(s, op);
    return cudaSuccess;
}

static inline cudaError_t cudaEventQuery(cudaEvent_t ev) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_QUERY);
    int ready;
    if (e != cudaSuccess) return fk_ret(e);
    if (!ev) return fk_ret(cudaErrorInvalidResourceHandle);
    if ((e = fk_sticky_of(ev->dev)) != cudaSuccess) return fk_ret(e);
    pthread_mutex_lock(&fk_mu);
    ready = ev->done >= ev->recorded;
    if (!ready) {
        fk_st.polls_not_ready++;
        fk_thread_waits++;
        fk_thread_polls++;
    }
    pthread_mutex_unlock(&fk_mu);
    return ready ? cudaSuccess : cudaErrorNotReady;
}

static inline cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_SYNC);
    uint64_t gen;
    int blocked;
    if (e != cudaSuccess) return fk_ret(e);
    if (!ev) return fk_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fk_mu);
    gen = ev->recorded;
    blocked = ev->done < gen;
    while (ev->done < gen) pthread_cond_wait(&fk_ev_cv, &fk_mu);
    fk_st.host_waits++;
    fk_thread_waits++;
    fk_st.host_blocked += (uint64_t)blocked;
    pthread_mutex_unlock(&fk_mu);
    return fk_ret(fk_sticky_of(ev->dev));
}

static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_EVENT_ELAPSED);
    if (e != cudaSuccess) return fk_ret(e);
    if (!ms || !a || !b) return fk_ret(cudaErrorInvalidValue);
    if (a->dev != b->dev || ((a->flags | b->flags) & cudaEventDisableTiming)) return fk_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&fk_mu);
    if (a->done < a->recorded || b->done < b->recorded || !a->recorded || !b->recorded) {
        pthread_mutex_unlock(&fk_mu);
        return fk_ret(cudaErrorNotReady);
    }
    *ms = (float)((b->t - a->t) * 1e3);
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

/* Where a copy's bytes are for the worker: a device range's second mapping, or host memory.
   0 when p is in the device range but not inside one allocation. */
static inline int fk_side(const void* p, size_t n, void** rw, int* dev, int* pinned) {
    fk_alloc* a;
    int ok = 1;
    pthread_mutex_lock(&fk_mu);
    *pinned = 0;
    *dev = -1;
    if ((a = fk_find(p, n)) != NULL) {
        *rw = fk_rw + ((const char*)p - fk_dev);
        *dev = a->dev;
    } else if (fk_in_arena(p)) {
        ok = 0;
    } else {
        *rw = (void*)(uintptr_t)p;
        *pinned = fk_is_pinned(p, n);
    }
    pthread_mutex_unlock(&fk_mu);
    return ok;
}

/* A copy on stream s. sync: cudaMemcpy (the legacy stream; the host waits where CUDA does). */
static inline cudaError_t fk_copy(void* dst, const void* src, size_t n, fk_stream* s, int sync) {
    void *d, *r;
    int ddev, sdev, dpin, spin;
    fk_op* op;
    uint64_t pos;
    cudaError_t e;
    if (n == 0) return cudaSuccess;
    if (!dst || !src || !fk_side(dst, n, &d, &ddev, &dpin) || !fk_side(src, n, &r, &sdev, &spin)) return fk_ret(cudaErrorInvalidValue);
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (ddev < 0 && sdev < 0) { /* host to host: fully synchronous */
        memmove(d, r, n);
        return cudaSuccess;
    }
    if (!(op = fk_new(FK_COPY))) return fk_ret(cudaErrorMemoryAllocation);
    op->dst = d;
    op->src = r;
    op->n = n;
    if (sdev < 0 && (!spin || sync)) {
        if (!spin && sync) { /* "a stream sync is performed before the copy is initiated" */
            pthread_mutex_lock(&s->mu);
            pos = s->queued;
            pthread_mutex_unlock(&s->mu);
            fk_host_wait(s, pos);
        }
        if (!spin) { /* pageable: the bytes are read now, into a staging buffer */
            if (!(op->staged = malloc(n))) {
                free(op);
                return fk_ret(cudaErrorMemoryAllocation);
            }
            memcpy(op->staged, r, n);
            op->src = op->staged;
        }
    }
    pos = fk_push(s, op);
    /* device to host returns once done (pageable, or any host memory for cudaMemcpy); pinned
       host to device is synchronous for cudaMemcpy */
    if ((ddev < 0 && (sync || !dpin)) || (sdev < 0 && spin && sync)) fk_host_wait(s, pos);
    return fk_ret(fk_sticky_of(s->dev));
}

static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind k, cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MEMCPY_ASYNC);
    fk_stream* s;
    (void)k; /* the pointers say where the bytes are (unified addressing) */
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    return fk_copy(dst, src, n, s, 0);
}

static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind k) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MEMCPY);
    fk_stream* s;
    (void)k;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(NULL))) return fk_ret(cudaErrorMemoryAllocation);
    return fk_copy(dst, src, n, s, 1);
}

static inline cudaError_t cudaMemcpyPeerAsync(void* dst, int dd, const void* src, int sd, size_t n, cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MEMCPY_ASYNC);
    fk_stream* s;
    (void)dd;
    (void)sd;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    return fk_copy(dst, src, n, s, 0);
}

static inline cudaError_t fk_memset(void* p, int v, size_t n, fk_stream* s) {
    void* d;
    int dev, pin;
    fk_op* op;
    cudaError_t e;
    if (n == 0) return cudaSuccess;
    if (!p || !fk_side(p, n, &d, &dev, &pin) || dev < 0) return fk_ret(cudaErrorInvalidValue);
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (!(op = fk_new(FK_SET))) return fk_ret(cudaErrorMemoryAllocation);
    op->dst = d;
    op->val = v;
    op->n = n;
    fk_push(s, op);
    return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s0) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MEMSET_ASYNC);
    fk_stream* s;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    return fk_memset(p, v, n, s);
}

/* Device memory: asynchronous with respect to the host, on the legacy stream. */
static inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_MEMSET);
    fk_stream* s;
    if (e != cudaSuccess) return fk_ret(e);
    if (!(s = fk_resolve(NULL))) return fk_ret(cudaErrorMemoryAllocation);
    return fk_memset(p, v, n, s);
}

static inline cudaError_t cudaLaunchHostFunc(cudaStream_t s0, cudaHostFn_t fn, void* user) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_HOST_FUNC);
    fk_stream* s;
    fk_op* op;
    if (e != cudaSuccess) return fk_ret(e);
    if (!fn) return fk_ret(cudaErrorInvalidValue);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (!(op = fk_new(FK_HOST))) return fk_ret(cudaErrorMemoryAllocation);
    op->fn = fn;
    op->user = user;
    fk_push(s, op);
    return cudaSuccess;
}

/* ---- the imitation's own API (tests, tests/fakenccl) ---------------------------------------------- */

/* A kernel launch: fn(user) runs on s's worker, in stream order. s must belong to the current
   device. */
static inline cudaError_t fakecuda_launch(cudaStream_t s0, fakecuda_kernel fn, void* user) {
    cudaError_t e = fk_enter(FAKECUDA_CALL_LAUNCH);
    fk_stream* s;
    fk_op* op;
    if (e != cudaSuccess) return fk_ret(e);
    if (!fn) return fk_ret(cudaErrorInvalidValue);
    if (!(s = fk_resolve(s0))) return fk_ret(cudaErrorMemoryAllocation);
    if (s->dev != fk_cur_dev) return fk_ret(cudaErrorInvalidResourceHandle); /* [PG: Stream and Event Behavior] */
    if ((e = fk_sticky_of(s->dev)) != cudaSuccess) return fk_ret(e);
    if (!(op = fk_new(FK_KERNEL))) return fk_ret(cudaErrorMemoryAllocation);
    op->kern = fn;
    op->user = user;
    fk_push(s, op);
    return cudaSuccess;
}

/* Inside a kernel: the address through which [p, p + n) of device memory is read and written;
   NULL when the range is not inside one live allocation (the kernel should then fail with
   cudaErrorIllegalAddress). */
static inline void* fakecuda_dev_ptr(const void* p, size_t n) {
    void* r = NULL;
    pthread_mutex_lock(&fk_mu);
    if (fk_find(p, n)) r = fk_rw + ((const char*)p - fk_dev);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* Inside a kernel, for a pointer that may be device or host memory: device memory's address
   for the kernel (NULL when [p, p + n) is in the device range but not inside one allocation),
   any other pointer unchanged. A real kernel reads host memory only when it is pinned or
   managed; the imitation does not check that. */
static inline void* fakecuda_kernel_ptr(const void* p, size_t n) {
    void* r = (void*)(uintptr_t)p;
    pthread_mutex_lock(&fk_mu);
    if (fk_in_arena(p)) r = fk_find(p, n) ? fk_rw + ((const char*)p - fk_dev) : NULL;
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* Clears a device's sticky error (tests only; CUDA needs the context destroyed). */
static inline void fakecuda_clear_error(int dev) {
    pthread_mutex_lock(&fk_mu);
    if (dev >= 0 && dev < FAKECUDA_DEVICES) fk_sticky[dev] = cudaSuccess;
    pthread_mutex_unlock(&fk_mu);
    fk_last_err = cudaSuccess;
}

static inline void fakecuda_stats_get(fakecuda_stats* out) {
    pthread_mutex_lock(&fk_mu);
    *out = fk_st;
    pthread_mutex_unlock(&fk_mu);
}

/* Zeroes the counters of calls, waits and polls (not the live counts, which are states). */
static inline void fakecuda_stats_reset(void) {
    pthread_mutex_lock(&fk_mu);
    memset(fk_st.calls, 0, sizeof fk_st.calls);
    fk_st.host_waits = fk_st.host_blocked = fk_st.polls_not_ready = 0;
    pthread_mutex_unlock(&fk_mu);
}

/* Runtime calls the calling thread made so far (every kind). */
static inline uint64_t fakecuda_thread_calls(void) { return fk_thread_calls; }
/* Streams made so far onto a hardware queue that already held a live stream (more streams on a
   device than FAKECUDA_MAX_CONNECTIONS queues: their work then waits behind each other's). */
static inline uint64_t fakecuda_queue_shared(void) {
    uint64_t n;
    pthread_mutex_lock(&fk_mu);
    n = fk_queue_shared;
    pthread_mutex_unlock(&fk_mu);
    return n;
}
/* Streams made on device dev so far (a legacy default stream included). */
static inline uint64_t fakecuda_streams_made(int dev) {
    uint64_t n;
    if (dev < 0 || dev >= FAKECUDA_DEVICES) return 0;
    pthread_mutex_lock(&fk_mu);
    n = fk_streams_made[dev];
    pthread_mutex_unlock(&fk_mu);
    return n;
}

/* Host waits on device work (as fakecuda_stats.host_waits counts them) plus event and stream
   queries that answered cudaErrorNotReady, made by the calling thread so far: a caller that
   saw this grow across a call of its own knows the call waited for the device, by blocking or
   by polling. */
static inline uint64_t fakecuda_thread_waits(void) { return fk_thread_waits; }

/* Of those, the queries that answered cudaErrorNotReady (fakecuda_stats.polls_not_ready). */
static inline uint64_t fakecuda_thread_polls(void) { return fk_thread_polls; }

/* Runtime calls in a snapshot (every kind). */
static inline uint64_t fakecuda_stats_calls(const fakecuda_stats* st) {
    uint64_t n = 0;
    int i;
    for (i = 0; i < FAKECUDA_CALL_KINDS; i++) n += st->calls[i];
    return n;
}

static inline const char* fakecuda_call_name(int kind) {
    static const char* const names[FAKECUDA_CALL_KINDS] = {
        "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "cudaMemsetAsync", "launch",
        "cudaLaunchHostFunc", "cudaEventCreate", "cudaEventDestroy", "cudaEventRecord", "cudaEventQuery",
        "cudaEventSynchronize", "cudaEventElapsedTime", "cudaStreamCreate", "cudaStreamDestroy", "cudaStreamWaitEvent",
        "cudaStreamSynchronize", "cudaStreamQuery", "cudaDeviceSynchronize", "cudaSetDevice", "cudaGetDevice",
        "cudaPointerGetAttributes", "cudaGetLastError", "other"};
    return kind >= 0 && kind < FAKECUDA_CALL_KINDS ? names[kind] : "?";
}

#ifdef __cplusplus
}
#endif
#endif /* FAKECUDA_RUNTIME_API_H */
