/* tests/fakecuda/cuda_runtime_api.h - a small host imitation of the CUDA runtime, for testing
   pipeline_cuda.h on machines without a GPU (tests/test_cuda_host.c, built with -I tests/fakecuda).

   Only what pipeline_cuda.h and its host test call. Streams are real: each one is a worker thread
   that runs its queue in order (copies, memsets, event records, event waits, host functions),
   with random small delays, so work on different streams overlaps and a missing event edge
   shows up as wrong data or, under ThreadSanitizer, as a data race. Events follow CUDA's
   rules: cudaStreamWaitEvent waits for the record that was last enqueued when it is called (a
   never-recorded event is a no-op), and recording an event on a stream of another device fails
   the way the real runtime does. "Device" memory is host memory from malloc, known to
   cudaPointerGetAttributes. FAKECUDA_DEVICES (default 4) devices exist.
   Everything is static inline: one translation unit. */
#ifndef FAKECUDA_RUNTIME_API_H
#define FAKECUDA_RUNTIME_API_H

#if !defined(_POSIX_C_SOURCE) && !defined(__cplusplus)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep under -std=c99 */
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FAKECUDA_DEVICES
#define FAKECUDA_DEVICES 4
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorPeerAccessAlreadyEnabled = 704
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

#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

typedef struct fk_event {
    int dev;
    uint64_t recorded;          /* records enqueued */
    uint64_t done;              /* records completed */
    double t;                   /* time of the last completed record */
} fk_event;
typedef fk_event* cudaEvent_t;

typedef void (*cudaHostFn_t)(void* user);

/* A "kernel" of the tests and of tests/fakenccl: runs on the stream's worker thread; a nonzero
   return is the CUDA error it raised. */
typedef int (*fakecuda_kernel)(void* user);

enum { FK_COPY, FK_SET, FK_RECORD, FK_WAIT, FK_HOST, FK_KERNEL, FK_STOP };
typedef struct fk_op {
    struct fk_op* next;
    int kind;
    void* dst;
    const void* src;
    size_t n;
    int val;
    fk_event* ev;
    uint64_t gen;
    cudaHostFn_t fn;
    fakecuda_kernel kern;
    void* user;
} fk_op;

typedef struct fk_stream {
    int dev;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fk_op *head, *tail;
    uint64_t queued, finished;
    unsigned rng;
} fk_stream;
typedef fk_stream* cudaStream_t;

/* process-wide state: allocations (for pointer attributes), events' lock */
typedef struct fk_alloc {
    struct fk_alloc* next;
    char* p;
    size_t n;
    int dev;
} fk_alloc;

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_ev_cv = PTHREAD_COND_INITIALIZER;
static fk_alloc* fk_allocs;
static __thread int fk_cur_dev;
static uint64_t fk_counts[8]; /* calls: 0 malloc, 1 free, 2 copies, 3 records, 4 waits */

static inline double fk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
static inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "fake error";
    }
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int* n) {
    *n = FAKECUDA_DEVICES;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= FAKECUDA_DEVICES) return cudaErrorInvalidDevice;
    fk_cur_dev = d;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int* d) {
    *d = fk_cur_dev;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceCanAccessPeer(int* can, int a, int b) {
    *can = a != b;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
    (void)peer;
    (void)flags;
    return cudaSuccess;
}

static inline cudaError_t cudaMalloc(void** p, size_t n) {
    fk_alloc* a = (fk_alloc*)malloc(sizeof *a);
    char* m = (char*)malloc(n ? n : 1);
    if (!a || !m) {
        free(a);
        free(m);
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xA5, n); /* cudaMalloc memory is not zeroed: neither is ours */
    a->p = m;
    a->n = n;
    a->dev = fk_cur_dev;
    pthread_mutex_lock(&fk_mu);
    a->next = fk_allocs;
    fk_allocs = a;
    fk_counts[0]++;
    pthread_mutex_unlock(&fk_mu);
    *p = m;
    return cudaSuccess;
}
static inline cudaError_t cudaFree(void* p) {
    fk_alloc **pp, *a;
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&fk_mu);
    for (pp = &fk_allocs; (a = *pp) != NULL; pp = &a->next)
        if (a->p == (char*)p) {
            *pp = a->next;
            break;
        }
    fk_counts[1]++;
    pthread_mutex_unlock(&fk_mu);
    if (!a) return cudaErrorInvalidValue;
    free(a->p);
    free(a);
    return cudaSuccess;
}
static inline cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* at, const void* p) {
    fk_alloc* a;
    memset(at, 0, sizeof *at);
    pthread_mutex_lock(&fk_mu);
    for (a = fk_allocs; a; a = a->next)
        if ((const char*)p >= a->p && (const char*)p < a->p + (a->n ? a->n : 1)) {
            at->type = cudaMemoryTypeDevice;
            at->device = a->dev;
            break;
        }
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

static inline void* fk_worker(void* arg) {
    fk_stream* s = (fk_stream*)arg;
    for (;;) {
        fk_op* op;
        pthread_mutex_lock(&s->mu);
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        op = s->head;
        s->rng = s->rng * 1103515245u + 12345u;
        pthread_mutex_unlock(&s->mu);
        if ((s->rng >> 16) % 4 == 0) { /* shake the timing: streams overlap differently each run */
            struct timespec d = {0, (long)((s->rng >> 8) % 40000)};
            nanosleep(&d, NULL);
        }
        switch (op->kind) {
        case FK_COPY: memmove(op->dst, op->src, op->n); break;
        case FK_SET: memset(op->dst, op->val, op->n); break;
        case FK_HOST: op->fn(op->user); break;
        case FK_KERNEL: (void)op->kern(op->user); break;
        case FK_RECORD:
            pthread_mutex_lock(&fk_mu);
            if (op->gen > op->ev->done) {
                op->ev->done = op->gen;
                op->ev->t = fk_now();
            }
            pthread_cond_broadcast(&fk_ev_cv);
            pthread_mutex_unlock(&fk_mu);
            break;
        case FK_WAIT:
            pthread_mutex_lock(&fk_mu);
            while (op->ev->done < op->gen) pthread_cond_wait(&fk_ev_cv, &fk_mu);
            pthread_mutex_unlock(&fk_mu);
            break;
        default: break;
        }
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->finished++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (op->kind == FK_STOP) {
            free(op);
            return NULL;
        }
        free(op);
    }
}

static inline cudaError_t fk_push(fk_stream* s, fk_op* op) {
    if (!s) return cudaErrorInvalidResourceHandle; /* the fake has no legacy default stream */
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

static inline fk_op* fk_new(int kind) {
    fk_op* op = (fk_op*)calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned flags) {
    fk_stream* s = (fk_stream*)calloc(1, sizeof *s);
    (void)flags;
    if (!s) return cudaErrorMemoryAllocation;
    s->dev = fk_cur_dev;
    s->rng = (unsigned)(uintptr_t)s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, fk_worker, s) != 0) {
        free(s);
        return cudaErrorMemoryAllocation;
    }
    *out = s;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!s) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&s->mu);
    while (s->finished < s->queued) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    fk_op* op = fk_new(FK_STOP);
    if (!s || !op) return cudaErrorInvalidValue;
    fk_push(s, op);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    fk_event* ev = (fk_event*)calloc(1, sizeof *ev);
    (void)flags;
    if (!ev) return cudaErrorMemoryAllocation;
    ev->dev = fk_cur_dev;
    *e = ev;
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    fk_op* op;
    if (!e || !s) return cudaErrorInvalidResourceHandle;
    if (e->dev != s->dev) return cudaErrorInvalidResourceHandle; /* as the real runtime */
    if (!(op = fk_new(FK_RECORD))) return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&fk_mu);
    op->ev = e;
    op->gen = ++e->recorded;
    fk_counts[3]++;
    pthread_mutex_unlock(&fk_mu);
    return fk_push(s, op);
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    fk_op* op;
    uint64_t gen;
    (void)flags;
    if (!e || !s) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&fk_mu);
    gen = e->recorded;
    fk_counts[4]++;
    pthread_mutex_unlock(&fk_mu);
    if (gen == 0) return cudaSuccess;
    if (!(op = fk_new(FK_WAIT))) return cudaErrorMemoryAllocation;
    op->ev = e;
    op->gen = gen;
    return fk_push(s, op);
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e) {
    cudaError_t r;
    pthread_mutex_lock(&fk_mu);
    r = e->done >= e->recorded ? cudaSuccess : cudaErrorNotReady;
    pthread_mutex_unlock(&fk_mu);
    return r;
}
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    pthread_mutex_lock(&fk_mu);
    *ms = (float)((b->t - a->t) * 1e3);
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
    fk_op* op = fk_new(FK_COPY);
    (void)k;
    if (!op) return cudaErrorMemoryAllocation;
    op->dst = dst;
    op->src = src;
    op->n = n;
    pthread_mutex_lock(&fk_mu);
    fk_counts[2]++;
    pthread_mutex_unlock(&fk_mu);
    return fk_push(s, op);
}
static inline cudaError_t cudaMemcpyPeerAsync(void* dst, int dd, const void* src, int sd, size_t n, cudaStream_t s) {
    (void)dd;
    (void)sd;
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
}
static inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
    fk_op* op = fk_new(FK_SET);
    if (!op) return cudaErrorMemoryAllocation;
    op->dst = p;
    op->val = v;
    op->n = n;
    return fk_push(s, op);
}
static inline cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user) {
    fk_op* op = fk_new(FK_HOST);
    if (!op) return cudaErrorMemoryAllocation;
    op->fn = fn;
    op->user = user;
    return fk_push(s, op);
}

/* ---- the imitation's own API (tests and tests/fakenccl) ---- */

/* Enqueues a "kernel" on s: fn(user) runs on the stream's worker in stream order. */
static inline cudaError_t fakecuda_launch(cudaStream_t s, fakecuda_kernel fn, void* user) {
    fk_op* op = fk_new(FK_KERNEL);
    if (!op) return cudaErrorMemoryAllocation;
    op->kern = fn;
    op->user = user;
    return fk_push(s, op);
}

/* Inside a kernel: the address through which [p, p + n) of device memory is read and written;
   NULL when the range is not inside one allocation. */
static inline void* fakecuda_dev_ptr(const void* p, size_t n) {
    fk_alloc* a;
    void* r = NULL;
    pthread_mutex_lock(&fk_mu);
    for (a = fk_allocs; a; a = a->next)
        if ((const char*)p >= a->p && (const char*)p + n <= a->p + a->n) {
            r = (void*)(uintptr_t)p;
            break;
        }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

static inline cudaError_t cudaStreamQuery(cudaStream_t s) {
    cudaError_t r;
    if (!s) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&s->mu);
    r = s->finished < s->queued ? cudaErrorNotReady : cudaSuccess;
    pthread_mutex_unlock(&s->mu);
    return r;
}

static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&fk_mu);
    while (e->done < e->recorded) pthread_cond_wait(&fk_ev_cv, &fk_mu);
    pthread_mutex_unlock(&fk_mu);
    return cudaSuccess;
}

/* Provisional synchronous copy (the caller has synchronised the streams involved). */
static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    memmove(dst, src, n);
    return cudaSuccess;
}

#endif
