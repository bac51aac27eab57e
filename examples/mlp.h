/* examples/mlp.h - a small MLP as a pipeline.h layer list: dense layers (tanh between them) and a
   softmax cross-entropy loss. Used by examples/mlp_cpu.c, the tests and bench/.
   Include after pipeline.h. All functions are static: include it from one file per program.
   What to copy: the smallest complete layer list (PP_MODEL), and the same layers with their
   backward split for the zero-bubble schedules (PP_MODEL_SPLIT). Its program is mlp_cpu.c. */
#ifndef PP_EXAMPLE_MLP_H
#define PP_EXAMPLE_MLP_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "splitmix.h"

typedef struct dense_params {
    int in, out;            /* x (rows, in) -> y (rows, out) */
    int tanh_act;           /* 1: y = tanh(x W + b); 0: y = x W + b */
    float* w;               /* (in, out) */
    float* b;               /* (out) */
} dense_params;

typedef struct xent_params {
    int classes;            /* logits (rows, classes); targets int32 (rows) */
} xent_params;

static int dense_fwd(const dense_params* p, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;     /* (rows, in) */
    float* y = (float*)io->out[0].data;                /* (rows, out) */
    int64_t r, rows = io->in[0].rows;
    int i, o;
    if (io->in[0].cols != p->in) return 1;
    for (r = 0; r < rows; r++) {
        const float* xr = x + r * p->in;
        float* yr = y + r * p->out;
        for (o = 0; o < p->out; o++) yr[o] = p->b[o];
        for (i = 0; i < p->in; i++) {
            const float xi = xr[i];
            const float* wi = p->w + (size_t)i * p->out;
            for (o = 0; o < p->out; o++) yr[o] += xi * wi[o];
        }
        if (p->tanh_act)
            for (o = 0; o < p->out; o++) yr[o] = tanhf(yr[o]);
    }
    return 0;
}

/* The layer's gradient at its pre-activation, row r: dz (out) = dy, through tanh where the
   layer has it (from y: an elementwise product). */
static void dense_dz(const dense_params* p, const pp_layer_io* io, int64_t r, float* dz) {
    const float* y = (const float*)io->out[0].data;    /* (rows, out) */
    const float* dy = (const float*)io->d_out[0].data; /* (rows, out) */
    int o;
    for (o = 0; o < p->out; o++) {
        float d = dy[r * p->out + o];
        if (p->tanh_act) {
            float t = y[r * p->out + o];
            d *= 1.0f - t * t;
        }
        dz[o] = d;
    }
}

/* B: only the input gradient dx = dz W^T (the split model's backward, see mlpz below). */
static int dense_bwd_in(const dense_params* p, dense_params* g, pp_layer_io* io) {
    float* dx = (float*)io->d_in[0].data;              /* (rows, in), NULL on the first layer */
    int64_t r, rows = io->in[0].rows;
    int i, o;
    float dz[512];
    (void)g;
    if (p->out > 512) return 2;
    if (!dx) return 0;
    for (r = 0; r < rows; r++) {
        dense_dz(p, io, r, dz);
        for (i = 0; i < p->in; i++) {
            const float* wi = p->w + (size_t)i * p->out;
            float acc = 0;
            for (o = 0; o < p->out; o++) acc += wi[o] * dz[o];
            dx[r * p->in + i] = acc;
        }
    }
    return 0;
}

/* W: the bias and weight gradients, added: g->b += dz, g->w += x^T dz. */
static int dense_bwd_w(const dense_params* p, dense_params* g, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;     /* (rows, in) */
    int64_t r, rows = io->in[0].rows;
    int i, o;
    float dz[512];
    if (p->out > 512) return 2;
    for (r = 0; r < rows; r++) {
        const float* xr = x + r * p->in;
        dense_dz(p, io, r, dz);
        for (o = 0; o < p->out; o++) g->b[o] += dz[o];
        for (i = 0; i < p->in; i++) {
            float* gw = g->w + (size_t)i * p->out;
            for (o = 0; o < p->out; o++) gw[o] += xr[i] * dz[o];
        }
    }
    return 0;
}

/* Both: each sum in the same order as the split pair, so the fused and split models agree bit
   for bit. */
static int dense_bwd(const dense_params* p, dense_params* g, pp_layer_io* io) {
    int rc = dense_bwd_w(p, g, io);
    return rc ? rc : dense_bwd_in(p, g, io);
}

/* A layer's one output: rows x cols floats (every layer's here, and tlm.h's). */
static void mlp_desc_out(pp_layer_desc* d, int64_t rows, int64_t cols) {
    d->n_out = 1;
    d->out[0].rows = rows;
    d->out[0].cols = cols;
    d->out[0].dtype = PP_F32;
}

static void dense_desc(const dense_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                       pp_layer_desc* d) {
    (void)n_in;
    mlp_desc_out(d, in[0].rows, p->out);
    d->cost = (double)mb->rows * p->in * p->out * 3.0; /* forward + two backward products */
    d->n_params = (int64_t)p->in * p->out + p->out;
}

/* Mean cross-entropy over the micro-batch's rows; the gradient is scaled by loss_scale. */
static int xent_fwd(const xent_params* p, pp_layer_io* io) {
    const float* z = (const float*)io->in[0].data;     /* (rows, classes) */
    const int32_t* t = (const int32_t*)io->mb->targets;/* (rows) */
    int64_t r, rows = io->in[0].rows;
    double loss = 0;
    int c;
    for (r = 0; r < rows; r++) {
        const float* zr = z + r * p->classes;
        float mx = zr[0], sum = 0;
        if (t[r] < 0 || t[r] >= p->classes) return 3;
        for (c = 1; c < p->classes; c++) mx = zr[c] > mx ? zr[c] : mx;
        for (c = 0; c < p->classes; c++) sum += expf(zr[c] - mx);
        loss += (double)(logf(sum) + mx - zr[t[r]]);
    }
    io->loss = (float)(loss / (double)rows);
    return 0;
}

static int xent_bwd(const xent_params* p, xent_params* g, pp_layer_io* io) {
    const float* z = (const float*)io->in[0].data;     /* (rows, classes) */
    const int32_t* t = (const int32_t*)io->mb->targets;
    float* dz = (float*)io->d_in[0].data;              /* (rows, classes) */
    int64_t r, rows = io->in[0].rows;
    float scale = io->mb->loss_scale / (float)rows;
    int c;
    (void)g;
    for (r = 0; r < rows; r++) {
        const float* zr = z + r * p->classes;
        float mx = zr[0], sum = 0;
        for (c = 1; c < p->classes; c++) mx = zr[c] > mx ? zr[c] : mx;
        for (c = 0; c < p->classes; c++) sum += expf(zr[c] - mx);
        for (c = 0; c < p->classes; c++)
            dz[r * p->classes + c] = scale * (expf(zr[c] - mx) / sum - (c == t[r] ? 1.0f : 0.0f));
    }
    return 0;
}

static void xent_desc(const xent_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                      pp_layer_desc* d) {
    (void)in;
    (void)n_in;
    d->n_out = 0;
    d->cost = (double)mb->rows * p->classes * 4.0;
}

/* The dense layer's parameter buffers, for checkpoints (pp_model.params through PP_MODEL_PARAMS
   below): its sizes come from in and out, so a process without the arrays still gives them. */
static int dense_param_list(const dense_params* p, pp_param* out, int cap) {
    if (cap >= 2) {
        out[0] = pp_param_of(p->w, (int64_t)p->in * p->out, PP_F32);
        out[1] = pp_param_of(p->b, p->out, PP_F32);
    }
    return 2;
}

#ifndef MLP_DEPTH
#define MLP_DEPTH 11
#endif
#define MLP_LAYERS(X)                                                        \
    X(dense, dense_params, dense_fwd, dense_bwd, dense_desc, MLP_DEPTH)      \
    X(xent, xent_params, xent_fwd, xent_bwd, xent_desc, 1)
PP_MODEL(mlp, MLP_LAYERS)

/* mlp_params, the checkpoints' view of the weights (the loss layer has none):
   pp_model m = mlp_model_desc(); m.params = mlp_params; */
#define MLP_PARAMS(X) X(dense, dense_param_list)
PP_MODEL_PARAMS(mlp, MLP_PARAMS)

/* The same MLP with the dense backward split in two (PP_MODEL_SPLIT), for the zero-bubble
   schedules: dense_bwd_in writes only the input gradient, dense_bwd_w adds the weight and bias
   gradients later (both recompute dz from y and dy: an elementwise product). The loss layer has
   no parameters and names PP_NO_WGRAD. mlpz_model has mlp_model's layout, so mlp_init's
   weights serve both: mlpz_from_mlp copies the parameter views. */
#define MLPZ_LAYERS(X)                                                                    \
    X(dense, dense_params, dense_fwd, dense_bwd_in, dense_bwd_w, dense_desc, MLP_DEPTH)   \
    X(xent, xent_params, xent_fwd, xent_bwd, PP_NO_WGRAD, xent_desc, 1)
PP_MODEL_SPLIT(mlpz, MLPZ_LAYERS)
PP_MODEL_PARAMS(mlpz, MLP_PARAMS)

static inline void mlpz_from_mlp(mlpz_model* z, const mlp_model* w) {
    int l;
    for (l = 0; l < MLP_DEPTH; l++) z->dense[l] = w->dense[l];
    z->xent[0] = w->xent[0];
}

/* Deterministic generator (examples/splitmix.h), so every run and rank sees the same numbers. */
static inline uint64_t mlp_rng_next(uint64_t* s) { return splitmix_next(s); }
static inline float mlp_rng_uniform(uint64_t* s) { return splitmix_uniform(s); }

/* Layer widths: dims[0] = input, dims[MLP_DEPTH] = classes. One flat buffer for weights (and
   one for gradients when grads is non-NULL: same layout, zeroed). Returns the buffer, which
   the caller frees, or NULL. */
static inline float* mlp_init(mlp_model* w, mlp_model* g, const int* dims, uint64_t seed, float** gbuf) {
    size_t total = 0, off = 0;
    float *buf, *gb = NULL;
    int l;
    for (l = 0; l < MLP_DEPTH; l++) total += (size_t)dims[l] * dims[l + 1] + dims[l + 1];
    buf = (float*)malloc(total * sizeof(float));
    if (!buf) return NULL;
    if (g) {
        gb = (float*)calloc(total, sizeof(float));
        if (!gb) {
            free(buf);
            return NULL;
        }
    }
    for (l = 0; l < MLP_DEPTH; l++) {
        dense_params* d = &w->dense[l];
        size_t nw = (size_t)dims[l] * dims[l + 1], i;
        float sc = 1.0f / sqrtf((float)dims[l]);
        d->in = dims[l];
        d->out = dims[l + 1];
        d->tanh_act = l < MLP_DEPTH - 1;
        d->w = buf + off;
        d->b = buf + off + nw;
        for (i = 0; i < nw; i++) d->w[i] = (2.0f * mlp_rng_uniform(&seed) - 1.0f) * sc * 1.5f;
        for (i = 0; i < (size_t)d->out; i++) d->b[i] = 0.0f;
        if (g) {
            g->dense[l] = *d;
            g->dense[l].w = gb + off;
            g->dense[l].b = gb + off + nw;
        }
        off += nw + (size_t)dims[l + 1];
    }
    w->xent[0].classes = dims[MLP_DEPTH];
    if (g) g->xent[0] = w->xent[0];
    if (gbuf) *gbuf = gb;
    return buf;
}

static inline size_t mlp_param_count(const int* dims) {
    size_t total = 0;
    int l;
    for (l = 0; l < MLP_DEPTH; l++) total += (size_t)dims[l] * dims[l + 1] + dims[l + 1];
    return total;
}

/* A learnable task: x uniform in [-1,1]^D, class = argmax of a fixed random linear teacher. */
static inline void mlp_make_data(float* x, int32_t* y, int rows, int in, int classes, uint64_t seed, uint64_t teacher_seed) {
    int r, i, c;
    for (r = 0; r < rows; r++) {
        float best = -1e30f;
        uint64_t ts = teacher_seed;
        for (i = 0; i < in; i++) x[(size_t)r * in + i] = 2.0f * mlp_rng_uniform(&seed) - 1.0f;
        y[r] = 0;
        for (c = 0; c < classes; c++) {
            float s = 0;
            for (i = 0; i < in; i++) s += (2.0f * mlp_rng_uniform(&ts) - 1.0f) * x[(size_t)r * in + i];
            if (s > best) {
                best = s;
                y[r] = c;
            }
        }
    }
}

#endif
