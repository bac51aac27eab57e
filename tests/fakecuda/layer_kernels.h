/* tests/fakecuda/layer_kernels.h - a host model's layers run as kernels of the CUDA imitation.

   layer_kernels_model(base) returns a pp_model whose forward, backward and weight_grad enqueue
   base's layer call on the stream that io->ctx points to (a cudaStream_t*), as fakecuda_launch
   kernels, exactly where a GPU model would launch its kernels: the call returns at once and the
   layer runs later on the stream's worker. The kernel sees the layer's device blocks through the
   imitation's second mapping (fakecuda_kernel_ptr); host pointers (weights, a host batch) pass
   unchanged. Include after pipeline.h and <cuda_runtime_api.h> (tests/fakecuda); one base model
   per process. layer_kernels_launched() counts the launches (benches subtract them from the
   runtime calls they charge to the library). */
#ifndef PP_TESTS_LAYER_KERNELS_H
#define PP_TESTS_LAYER_KERNELS_H

#include <stdlib.h>

typedef struct lk_job {
    const void* w;
    void* g;
    int layer, kind; /* 0 forward, 1 backward, 2 weight gradient */
    pp_layer_io io;
} lk_job;

static pp_model lk_base;
static pthread_mutex_t lk_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t lk_launched;

/* the kernel's view of a layer's tensors: device blocks through the imitation's mapping */
static inline int lk_view(pp_tensor* t, int n) {
    int k, ok = 1;
    for (k = 0; k < n; k++)
        if (t[k].data && !(t[k].data = fakecuda_kernel_ptr(t[k].data, pp_tensor_bytes(&t[k])))) ok = 0;
    return ok;
}

static inline int lk_kernel(void* u) {
    lk_job* j = (lk_job*)u;
    int rc = 0, ok = lk_view(j->io.in, j->io.n_in) & lk_view(j->io.out, j->io.n_out) & lk_view(j->io.d_in, j->io.n_in) &
                     lk_view(j->io.d_out, j->io.n_out);
    if (j->io.saved && !(j->io.saved = fakecuda_kernel_ptr(j->io.saved, j->io.saved_bytes))) ok = 0;
    if (ok) {
        if (j->kind == 0) rc = lk_base.forward(j->w, j->layer, &j->io);
        else if (j->kind == 1) rc = lk_base.backward(j->w, j->g, j->layer, &j->io);
        else rc = lk_base.weight_grad(j->w, j->g, j->layer, &j->io);
    }
    free(j);
    return !ok ? (int)cudaErrorIllegalAddress : rc ? (int)cudaErrorLaunchFailure : 0;
}

static inline int lk_enqueue(const void* w, void* g, int l, int kind, pp_layer_io* io) {
    lk_job* j = (lk_job*)malloc(sizeof *j);
    if (!j) return 1;
    j->w = w;
    j->g = g;
    j->layer = l;
    j->kind = kind;
    j->io = *io; /* the executor's io is on its stack: the job keeps a copy */
    pthread_mutex_lock(&lk_mu);
    lk_launched++;
    pthread_mutex_unlock(&lk_mu);
    if (fakecuda_launch(*(cudaStream_t*)io->ctx, lk_kernel, j) == cudaSuccess) return 0;
    free(j);
    return 1;
}

#include "../layer_calls.h"

#endif
