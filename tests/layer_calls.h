/* tests/layer_calls.h - the pp_model side shared by tests/fakecuda/layer_kernels.h (imitation
   kernels) and tests/layer_staged.h (copies and host functions on a real stream): each defines
   lk_base, lk_mu, lk_launched and lk_enqueue(w, g, layer, kind, io), then includes this. */
#ifndef PP_TESTS_LAYER_CALLS_H
#define PP_TESTS_LAYER_CALLS_H

static inline int lk_fwd(const void* w, int l, pp_layer_io* io) { return lk_enqueue(w, NULL, l, 0, io); }
static inline int lk_bwd(const void* w, void* g, int l, pp_layer_io* io) { return lk_enqueue(w, g, l, 1, io); }
static inline int lk_wgrad(const void* w, void* g, int l, pp_layer_io* io) { return lk_enqueue(w, g, l, 2, io); }

/* base's layers, each call enqueued on the stream io->ctx points to */
static inline pp_model layer_kernels_model(pp_model base) {
    pp_model m = base;
    lk_base = base;
    m.forward = lk_fwd;
    m.backward = lk_bwd;
    m.weight_grad = base.weight_grad ? lk_wgrad : NULL;
    return m;
}

/* layer calls enqueued so far */
static inline uint64_t layer_kernels_launched(void) {
    uint64_t n;
    pthread_mutex_lock(&lk_mu);
    n = lk_launched;
    pthread_mutex_unlock(&lk_mu);
    return n;
}

#endif
