/* tests/layer_staged.h - a host model's layers as stream work on a real GPU (or the imitation),
   for the tests that run pipeline_nccl.h over real NCCL.

   The same API as tests/fakecuda/layer_kernels.h (layer_kernels_model, lk_fwd, lk_bwd, lk_wgrad,
   layer_kernels_launched), with nothing but the CUDA runtime: a layer call enqueues, on the
   stream io->ctx points to, copies of its device tensors into pinned host memory, a host
   function (cudaLaunchHostFunc) that runs the host model's layer on those copies, and copies
   back. Stream order is the GPU's own: the layer runs after what came before it on the stream
   (a receive the stream waited for) and before what comes after (a send), as a kernel would, and
   the host returns at once. Host pointers (weights, gradients, a host batch) pass unchanged. The
   host model's arithmetic is the sequential reference's, so results stay bit-exact. Pinned
   buffers are kept on a free list (the host function returns its own; no CUDA call there) and
   freed by layer_staged_free. One base model per process. */
#ifndef PP_TESTS_LAYER_STAGED_H
#define PP_TESTS_LAYER_STAGED_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LK_SLOTS (4 * PP_MAX_TENSORS + 2)

typedef struct lk_buf {
    struct lk_buf* next;
    size_t cap;
    unsigned char* p; /* pinned */
} lk_buf;

typedef struct lk_job {
    const void* w;
    void* g;
    int layer, kind; /* 0 forward, 1 backward, 2 weight gradient */
    pp_layer_io io;  /* the executor's io is on its stack: the job keeps a copy, pointing at the buffer */
    lk_buf* buf;
} lk_job;

static pp_model lk_base;
static pthread_mutex_t lk_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t lk_launched;
static lk_buf* lk_free;      /* pinned buffers not in use */
static lk_buf* lk_all[4096]; /* every one made, for layer_staged_free */
static int lk_n_all;

/* 1 for device memory (staged), 0 for host memory (used as it is) */
static inline int lk_on_device(const void* p) {
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* the job's device regions: (device pointer, bytes, where the job's copy points) */
typedef struct lk_region {
    void** at; /* the pointer in the job's io to redirect */
    void* dev;
    size_t bytes, off;
} lk_region;

static inline int lk_regions(lk_job* j, lk_region* r) {
    int n = 0, k;
    pp_layer_io* io = &j->io;
#define LK_ADD(ptr, nbytes)                                                     \
    do {                                                                        \
        if ((ptr) && (nbytes) && lk_on_device(ptr)) {                           \
            r[n].at = (void**)&(ptr);                                           \
            r[n].dev = (void*)(ptr);                                            \
            r[n].bytes = (nbytes);                                              \
            n++;                                                                \
        }                                                                       \
    } while (0)
    for (k = 0; k < io->n_in; k++) {
        LK_ADD(io->in[k].data, pp_tensor_bytes(&io->in[k]));
        LK_ADD(io->d_in[k].data, pp_tensor_bytes(&io->d_in[k]));
    }
    for (k = 0; k < io->n_out; k++) {
        LK_ADD(io->out[k].data, pp_tensor_bytes(&io->out[k]));
        LK_ADD(io->d_out[k].data, pp_tensor_bytes(&io->d_out[k]));
    }
    LK_ADD(io->saved, io->saved_bytes);
    LK_ADD(io->b_saved, io->b_saved_bytes);
#undef LK_ADD
    return n;
}

/* the host function: the layer on the pinned copies; the buffer goes back with the job's copy-back */
static void lk_host(void* u) {
    lk_job* j = (lk_job*)u;
    if (j->kind == 0) (void)lk_base.forward(j->w, j->layer, &j->io);
    else if (j->kind == 1) (void)lk_base.backward(j->w, j->g, j->layer, &j->io);
    else (void)lk_base.weight_grad(j->w, j->g, j->layer, &j->io);
}

/* after the copy-back: the buffer and the job are free (a host function: no CUDA call) */
static void lk_release(void* u) {
    lk_job* j = (lk_job*)u;
    pthread_mutex_lock(&lk_mu);
    j->buf->next = lk_free;
    lk_free = j->buf;
    pthread_mutex_unlock(&lk_mu);
    free(j);
}

static inline lk_buf* lk_take(size_t n) {
    lk_buf **pp, *b;
    pthread_mutex_lock(&lk_mu);
    for (pp = &lk_free; (b = *pp) != NULL; pp = &b->next)
        if (b->cap >= n) {
            *pp = b->next;
            pthread_mutex_unlock(&lk_mu);
            return b;
        }
    pthread_mutex_unlock(&lk_mu);
    if (!(b = (lk_buf*)calloc(1, sizeof *b))) return NULL;
    b->cap = n < 4096 ? 4096 : n;
    if (cudaHostAlloc((void**)&b->p, b->cap, cudaHostAllocDefault) != cudaSuccess) {
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&lk_mu);
    if (lk_n_all < (int)(sizeof lk_all / sizeof lk_all[0])) lk_all[lk_n_all++] = b;
    pthread_mutex_unlock(&lk_mu);
    return b;
}

static inline int lk_enqueue(const void* w, void* g, int l, int kind, pp_layer_io* io) {
    cudaStream_t s = *(cudaStream_t*)io->ctx;
    lk_region r[LK_SLOTS];
    lk_job* j = (lk_job*)malloc(sizeof *j);
    size_t total = 0;
    int n, i, ok = 1;
    if (!j) return 1;
    j->w = w;
    j->g = g;
    j->layer = l;
    j->kind = kind;
    j->io = *io;
    n = lk_regions(j, r);
    for (i = 0; i < n; i++) {
        r[i].off = total;
        total += (r[i].bytes + 15) & ~(size_t)15;
    }
    if (!(j->buf = lk_take(total ? total : 16))) {
        free(j);
        return 1;
    }
    for (i = 0; i < n && ok; i++) {
        *r[i].at = j->buf->p + r[i].off;
        ok = cudaMemcpyAsync(j->buf->p + r[i].off, r[i].dev, r[i].bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess;
    }
    ok = ok && cudaLaunchHostFunc(s, lk_host, j) == cudaSuccess;
    for (i = 0; i < n && ok; i++)
        ok = cudaMemcpyAsync(r[i].dev, j->buf->p + r[i].off, r[i].bytes, cudaMemcpyHostToDevice, s) == cudaSuccess;
    ok = ok && cudaLaunchHostFunc(s, lk_release, j) == cudaSuccess;
    pthread_mutex_lock(&lk_mu);
    lk_launched++;
    pthread_mutex_unlock(&lk_mu);
    return ok ? 0 : 1; /* a failed enqueue leaks its job: the stream is broken anyway */
}

#include "layer_calls.h"

/* After every stream that ran layers was synchronised (or destroyed). */
static inline void layer_staged_free(void) {
    int i;
    pthread_mutex_lock(&lk_mu);
    for (i = 0; i < lk_n_all; i++) {
        cudaFreeHost(lk_all[i]->p);
        free(lk_all[i]);
    }
    lk_n_all = 0;
    lk_free = NULL;
    pthread_mutex_unlock(&lk_mu);
}

#endif
