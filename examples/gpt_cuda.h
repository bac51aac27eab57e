/* examples/gpt_cuda.h - the GPT of examples/gpt_cuda.cu: kernels, model and layer callbacks.

   Shared by examples/gpt_cuda.cu (every rank a host thread, pipeline_cuda.h) and
   examples/gpt_nccl.cu (one process per GPU, pipeline_nccl.h). Include it after
   pipeline_cuda.h (directly or through pipeline_nccl.h), in a .cu file: the ops are
   __host__ __device__ functors run as kernels, or as host loops when g_cpu is set (--cpu).
   What is here: the data generator hooks and gpt_data.h, the functors (embedding, LayerNorm,
   matmul, causal attention over packed sequences, tied head, cross-entropy, Adam), the
   parameter layout (gpt, gpt_numel, gpt_bind), the layer callbacks (m_forward, m_backward,
   m_describe, m_name; io->ctx is a ctx) and the memory helpers (dalloc, dput, dzero). */
#ifndef GPT_CUDA_H
#define GPT_CUDA_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* gpt_data.h's generator (the same splitmix64 as examples/gpt.h, which is C-only) */
static inline uint64_t gpt_rng_next(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float gpt_rng_uniform(uint64_t* s) { return (float)((gpt_rng_next(s) >> 40) * (1.0 / 16777216.0)); }
#include "gpt_data.h"

#define MAXB 16         /* most transformer blocks */
#define MAXDEV 8
#define MAXHS 64        /* most channels per head (attention keeps a head's row in registers) */

/* ---- launching: one functor per op, run as a kernel or as a host loop ---------------------- */
static int g_cpu = 0;   /* --cpu: every op is a host loop over the same functor */

template <typename F, typename... A>
__global__ void k_map(int n, A... a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) F::at(i, a...);
}

template <typename F, typename... A>
static int op(cudaStream_t st, int n, A... a) {
    if (n <= 0) return 0;
    if (g_cpu) {
        for (int i = 0; i < n; i++) F::at(i, a...);
        return 0;
    }
    k_map<F, A...><<<(n + 127) / 128, 128, 0, st>>>(n, a...);
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}

#define HD __host__ __device__ static inline

/* x (T, C) = wte[token] + wpe[position in its sequence]; i over T*C */
struct EmbedFwd {
    HD void at(int i, const int32_t* tok, const int32_t* pos, int row0, const float* wte, const float* wpe, float* x, int C) {
        int r = i / C, c = i % C;
        x[i] = wte[(size_t)tok[r] * C + c] + wpe[(size_t)pos[row0 + r] * C + c];
    }
};
/* one thread per channel c, rows in order: deterministic scatter-add */
struct EmbedBwd {
    HD void at(int c, const int32_t* tok, const int32_t* pos, int row0, const float* dx, float* gwte, float* gwpe, int T, int C) {
        for (int r = 0; r < T; r++) {
            float d = dx[(size_t)r * C + c];
            gwte[(size_t)tok[r] * C + c] += d;
            gwpe[(size_t)pos[row0 + r] * C + c] += d;
        }
    }
};
/* LayerNorm of row r */
struct LnFwd {
    HD void at(int r, const float* x, const float* g, const float* b, float* y, float* mean, float* rstd, int C) {
        const float* xr = x + (size_t)r * C;
        float m = 0, v = 0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= (float)C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        for (int c = 0; c < C; c++) y[(size_t)r * C + c] = (xr[c] - m) * s * g[c] + b[c];
        mean[r] = m;
        rstd[r] = s;
    }
};
/* dx[r] = resid[r] + LayerNorm backward (resid may be NULL) */
struct LnBwdX {
    HD void at(int r, const float* dy, const float* x, const float* mean, const float* rstd, const float* g,
               const float* resid, float* dx, int C) {
        const float *dyr = dy + (size_t)r * C, *xr = x + (size_t)r * C;
        float m = mean[r], s = rstd[r], a = 0, b = 0;
        for (int c = 0; c < C; c++) {
            float xh = (xr[c] - m) * s, dxh = dyr[c] * g[c];
            a += dxh;
            b += dxh * xh;
        }
        a /= (float)C;
        b /= (float)C;
        for (int c = 0; c < C; c++) {
            float xh = (xr[c] - m) * s, dxh = dyr[c] * g[c];
            float v = s * (dxh - a - xh * b);
            dx[(size_t)r * C + c] = resid ? resid[(size_t)r * C + c] + v : v;
        }
    }
};
/* LayerNorm parameter gradients: one thread per channel, rows in order */
struct LnBwdP {
    HD void at(int c, const float* dy, const float* x, const float* mean, const float* rstd, float* gg, float* gb, int T, int C) {
        float a = 0, b = 0;
        for (int r = 0; r < T; r++) {
            float xh = (x[(size_t)r * C + c] - mean[r]) * rstd[r];
            a += dy[(size_t)r * C + c] * xh;
            b += dy[(size_t)r * C + c];
        }
        gg[c] += a;
        gb[c] += b;
    }
};
/* y (T, out) = x (T, in) W (in, out) + b */
struct MmFwd {
    HD void at(int i, const float* x, const float* W, const float* b, float* y, int in, int out) {
        int r = i / out, o = i % out;
        float acc = b[o];
        for (int k = 0; k < in; k++) acc += x[(size_t)r * in + k] * W[(size_t)k * out + o];
        y[i] = acc;
    }
};
/* dx (T, in) = dy (T, out) W^T */
struct MmBwdX {
    HD void at(int i, const float* dy, const float* W, float* dx, int in, int out) {
        int r = i / in, k = i % in;
        float acc = 0;
        for (int o = 0; o < out; o++) acc += dy[(size_t)r * out + o] * W[(size_t)k * out + o];
        dx[i] = acc;
    }
};
/* gW (in, out) += x^T dy, gb (out) += column sums of dy: one thread per element, rows in order */
struct MmBwdW {
    HD void at(int i, const float* x, const float* dy, float* gW, float* gb, int T, int in, int out) {
        float acc = 0;
        if (i < in * out) {
            int k = i / out, o = i % out;
            for (int r = 0; r < T; r++) acc += x[(size_t)r * in + k] * dy[(size_t)r * out + o];
            gW[i] += acc;
        } else {
            int o = i - in * out;
            for (int r = 0; r < T; r++) acc += dy[(size_t)r * out + o];
            gb[o] += acc;
        }
    }
};
/* tied head: logits (T, V) = xn (T, C) wte^T */
struct HeadFwd {
    HD void at(int i, const float* xn, const float* wte, float* logits, int C, int V) {
        int r = i / V, v = i % V;
        float acc = 0;
        for (int c = 0; c < C; c++) acc += xn[(size_t)r * C + c] * wte[(size_t)v * C + c];
        logits[i] = acc;
    }
};
/* dxn (T, C) = dl (T, V) wte */
struct HeadBwdX {
    HD void at(int i, const float* dl, const float* wte, float* dxn, int C, int V) {
        int r = i / C, c = i % C;
        float acc = 0;
        for (int v = 0; v < V; v++) acc += dl[(size_t)r * V + v] * wte[(size_t)v * C + c];
        dxn[i] = acc;
    }
};
/* g (V, C) += dl^T xn */
struct HeadBwdW {
    HD void at(int i, const float* xn, const float* dl, float* g, int T, int C, int V) {
        int v = i / C, c = i % C;
        float acc = 0;
        for (int r = 0; r < T; r++) acc += dl[(size_t)r * V + v] * xn[(size_t)r * C + c];
        g[i] += acc;
    }
};
HD float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
HD float gelu_grad(float x) {
    float u = 0.7978845608f * (x + 0.044715f * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}
struct GeluFwd {
    HD void at(int i, const float* x, float* y) { y[i] = gelu(x[i]); }
};
struct GeluBwd {
    HD void at(int i, const float* x, float* d) { d[i] *= gelu_grad(x[i]); }
};
struct AddOp {
    HD void at(int i, const float* a, const float* b, float* y) { y[i] = a[i] + b[i]; }
};
/* causal attention of (row r, head h) over its own sequence [sstart, r]; qkv (T, 3C) = q | k | v.
   out (T, C); lse (T, H) the log-sum-exp of the scores (backward recomputes the probabilities) */
struct AttnFwd {
    HD void at(int i, const float* qkv, const int32_t* sstart, int row0, float* out, float* lse, int C, int H) {
        int r = i / H, h = i % H, hs = C / H, s0 = sstart[row0 + r] - row0;
        float scale = 1.0f / sqrtf((float)hs), acc[MAXHS], mx = -1e30f, l = 0;
        const float* q = qkv + (size_t)r * 3 * C + h * hs;
        for (int d = 0; d < hs; d++) acc[d] = 0;
        for (int j = s0; j <= r; j++) {
            const float *k = qkv + (size_t)j * 3 * C + C + h * hs, *v = k + C;
            float s = 0;
            for (int d = 0; d < hs; d++) s += q[d] * k[d];
            s *= scale;
            if (s > mx) {
                float f = expf(mx - s);
                l *= f;
                for (int d = 0; d < hs; d++) acc[d] *= f;
                mx = s;
            }
            float pj = expf(s - mx);
            l += pj;
            for (int d = 0; d < hs; d++) acc[d] += pj * v[d];
        }
        for (int d = 0; d < hs; d++) out[(size_t)r * C + h * hs + d] = acc[d] / l;
        lse[(size_t)r * H + h] = mx + logf(l);
    }
};
/* D (T, H) = rowsum(dout * out) per head */
struct AttnD {
    HD void at(int i, const float* dout, const float* out, float* D, int C, int H) {
        int r = i / H, h = i % H, hs = C / H;
        float acc = 0;
        for (int d = 0; d < hs; d++) acc += dout[(size_t)r * C + h * hs + d] * out[(size_t)r * C + h * hs + d];
        D[i] = acc;
    }
};
/* dq of (query r, head h): sum over its keys j <= r */
struct AttnDq {
    HD void at(int i, const float* qkv, const float* dout, const float* lse, const float* D, const int32_t* sstart, int row0,
               float* dqkv, int C, int H) {
        int r = i / H, h = i % H, hs = C / H, s0 = sstart[row0 + r] - row0;
        float scale = 1.0f / sqrtf((float)hs), dq[MAXHS];
        const float *q = qkv + (size_t)r * 3 * C + h * hs, *go = dout + (size_t)r * C + h * hs;
        for (int d = 0; d < hs; d++) dq[d] = 0;
        for (int j = s0; j <= r; j++) {
            const float *k = qkv + (size_t)j * 3 * C + C + h * hs, *v = k + C;
            float s = 0, dp = 0;
            for (int d = 0; d < hs; d++) {
                s += q[d] * k[d];
                dp += go[d] * v[d];
            }
            float p = expf(s * scale - lse[(size_t)r * H + h]);
            float ds = p * (dp - D[(size_t)r * H + h]) * scale;
            for (int d = 0; d < hs; d++) dq[d] += ds * k[d];
        }
        for (int d = 0; d < hs; d++) dqkv[(size_t)r * 3 * C + h * hs + d] = dq[d];
    }
};
/* dk, dv of (key j, head h): sum over the queries r >= j of its sequence */
struct AttnDkv {
    HD void at(int i, const float* qkv, const float* dout, const float* lse, const float* D, const int32_t* send, int row0,
               float* dqkv, int C, int H) {
        int j = i / H, h = i % H, hs = C / H, e = send[row0 + j] - row0;
        float scale = 1.0f / sqrtf((float)hs), dk[MAXHS], dv[MAXHS];
        const float *k = qkv + (size_t)j * 3 * C + C + h * hs, *v = k + C;
        for (int d = 0; d < hs; d++) dk[d] = dv[d] = 0;
        for (int r = j; r < e; r++) {
            const float *q = qkv + (size_t)r * 3 * C + h * hs, *go = dout + (size_t)r * C + h * hs;
            float s = 0, dp = 0;
            for (int d = 0; d < hs; d++) {
                s += q[d] * k[d];
                dp += go[d] * v[d];
            }
            float p = expf(s * scale - lse[(size_t)r * H + h]);
            float ds = p * (dp - D[(size_t)r * H + h]) * scale;
            for (int d = 0; d < hs; d++) {
                dv[d] += p * go[d];
                dk[d] += ds * q[d];
            }
        }
        for (int d = 0; d < hs; d++) {
            dqkv[(size_t)j * 3 * C + C + h * hs + d] = dk[d];
            dqkv[(size_t)j * 3 * C + 2 * C + h * hs + d] = dv[d];
        }
    }
};
/* per row: lse of the logits and the row's loss (0 without a target) */
struct XentFwd {
    HD void at(int r, const float* logits, const int32_t* tgt, float* lse, float* rowloss, int V) {
        const float* z = logits + (size_t)r * V;
        float mx = z[0], s = 0;
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < V; v++) s += expf(z[v] - mx);
        lse[r] = mx + logf(s);
        rowloss[r] = tgt[r] >= 0 ? lse[r] - z[tgt[r]] : 0.0f;
    }
};
/* one thread: the micro-batch's mean loss over rows with a target, rows in order */
struct LossSum {
    HD void at(int i, const float* rowloss, const int32_t* tgt, int T, float* out) {
        double acc = 0;
        int n = 0;
        (void)i;
        for (int r = 0; r < T; r++)
            if (tgt[r] >= 0) {
                acc += (double)rowloss[r];
                n++;
            }
        *out = n ? (float)(acc / n) : 0.0f;
    }
};
struct XentBwd {
    HD void at(int i, const float* logits, const float* lse, const int32_t* tgt, float* dl, int V, float scale) {
        int r = i / V, v = i % V, t = tgt[r];
        dl[i] = t < 0 ? 0.0f : scale * (expf(logits[i] - lse[r]) - (v == t ? 1.0f : 0.0f));
    }
};
struct AccOp {
    HD void at(int i, float* dst, const float* src) { dst[i] += src[i]; }
};
struct AdamOp {
    HD void at(int i, float* p, const float* g, float* m, float* v, float lr, float bc1, float bc2) {
        m[i] = 0.9f * m[i] + 0.1f * g[i];
        v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
        p[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + 1e-8f);
    }
};

/* ---- model: parameters in one flat buffer -------------------------------------------------- */
typedef struct blk {
    float *ln1_g, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_g, *ln2_b, *fc_w, *fc_b, *fcp_w, *fcp_b;
} blk;

typedef struct gpt {
    int V, maxT, C, H, nb;
    float *wte, *wpe;
    blk b[MAXB];
    float *lnf_g, *lnf_b;
    float* wte_head;            /* gradients only: the head's share of the tied wte gradient */
} gpt;

static size_t gpt_numel(const gpt* g) {
    size_t C = (size_t)g->C;
    return (size_t)g->V * C + (size_t)g->maxT * C + (size_t)g->nb * (4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C;
}

/* Points the parameter fields into base (grads: also the wte_head slot after them). */
static void gpt_bind(gpt* g, float* base, int grads) {
    size_t C = (size_t)g->C;
    float* p = base;
#define TAKE(f, n) (g->f = p, p += (n))
    TAKE(wte, (size_t)g->V * C);
    TAKE(wpe, (size_t)g->maxT * C);
    for (int l = 0; l < g->nb; l++) {
        TAKE(b[l].ln1_g, C);
        TAKE(b[l].ln1_b, C);
        TAKE(b[l].qkv_w, C * 3 * C);
        TAKE(b[l].qkv_b, 3 * C);
        TAKE(b[l].proj_w, C * C);
        TAKE(b[l].proj_b, C);
        TAKE(b[l].ln2_g, C);
        TAKE(b[l].ln2_b, C);
        TAKE(b[l].fc_w, C * 4 * C);
        TAKE(b[l].fc_b, 4 * C);
        TAKE(b[l].fcp_w, 4 * C * C);
        TAKE(b[l].fcp_b, C);
    }
    TAKE(lnf_g, C);
    TAKE(lnf_b, C);
#undef TAKE
    g->wte_head = grads ? p : NULL;
}

/* What a rank's layers need besides weights: its stream and the step's per-row tables. */
typedef struct ctx {
    cudaStream_t st;
    const int32_t* pos;         /* (rows of the step) position inside the sequence */
    const int32_t* sstart;      /* (rows) first row of the row's sequence */
    const int32_t* send;        /* (rows) one past its last row */
    float* mb_loss;             /* (m) each micro-batch's loss (last stage) */
} ctx;

/* scratch kept from forward to backward (io->saved), as float offsets for T rows */
typedef struct bsave {
    float *ln1, *mu1, *rs1, *qkv, *att, *lse, *xmid, *ln2, *mu2, *rs2, *fcpre, *fcact, *dxmid, *dln, *dfc, *datt, *dqkv, *D;
} bsave;
static size_t bsave_carve(bsave* s, float* p, size_t T, size_t C, size_t H) {
    float* b = p;
#define CUT(f, n) (s->f = p, p += (n))
    CUT(ln1, T * C);
    CUT(mu1, T);
    CUT(rs1, T);
    CUT(qkv, 3 * T * C);
    CUT(att, T * C);
    CUT(lse, T * H);
    CUT(xmid, T * C);
    CUT(ln2, T * C);
    CUT(mu2, T);
    CUT(rs2, T);
    CUT(fcpre, 4 * T * C);
    CUT(fcact, 4 * T * C);
    CUT(dxmid, T * C);
    CUT(dln, T * C);
    CUT(dfc, 4 * T * C);
    CUT(datt, T * C);
    CUT(dqkv, 3 * T * C);
    CUT(D, T * H);
#undef CUT
    return (size_t)(p - b) * sizeof(float);
}
typedef struct hsave {
    float *xn, *mu, *rs, *logits, *lse, *rowloss, *dl, *dxn;
} hsave;
static size_t hsave_carve(hsave* s, float* p, size_t T, size_t C, size_t V) {
    float* b = p;
#define CUT(f, n) (s->f = p, p += (n))
    CUT(xn, T * C);
    CUT(mu, T);
    CUT(rs, T);
    CUT(logits, T * V);
    CUT(lse, T);
    CUT(rowloss, T);
    CUT(dl, T * V);
    CUT(dxn, T * C);
#undef CUT
    return (size_t)(p - b) * sizeof(float);
}

#define TRY(x)                  \
    do {                        \
        int e_ = (x);           \
        if (e_) return e_;      \
    } while (0)

static int embed_fwd(const gpt* w, const ctx* cx, pp_layer_io* io) {
    int T = (int)io->mb->rows, C = w->C;
    return op<EmbedFwd>(cx->st, T * C, (const int32_t*)io->in[0].data, cx->pos, (int)io->mb->row0, (const float*)w->wte,
                        (const float*)w->wpe, (float*)io->out[0].data, C);
}
static int embed_bwd(const gpt* w, gpt* g, const ctx* cx, pp_layer_io* io) {
    int T = (int)io->mb->rows;
    return op<EmbedBwd>(cx->st, w->C, (const int32_t*)io->in[0].data, cx->pos, (int)io->mb->row0,
                        (const float*)io->d_out[0].data, g->wte, g->wpe, T, w->C);
}

static int block_fwd(const gpt* w, int l, const ctx* cx, pp_layer_io* io) {
    const blk* b = &w->b[l];
    int T = (int)io->mb->rows, C = w->C, H = w->H, row0 = (int)io->mb->row0;
    const float* x = (const float*)io->in[0].data;
    float* y = (float*)io->out[0].data;
    bsave s;
    if (bsave_carve(&s, (float*)io->saved, T, C, H) > io->saved_bytes) return 2;
    TRY(op<LnFwd>(cx->st, T, x, (const float*)b->ln1_g, (const float*)b->ln1_b, s.ln1, s.mu1, s.rs1, C));
    TRY(op<MmFwd>(cx->st, T * 3 * C, (const float*)s.ln1, (const float*)b->qkv_w, (const float*)b->qkv_b, s.qkv, C, 3 * C));
    TRY(op<AttnFwd>(cx->st, T * H, (const float*)s.qkv, cx->sstart, row0, s.att, s.lse, C, H));
    TRY(op<MmFwd>(cx->st, T * C, (const float*)s.att, (const float*)b->proj_w, (const float*)b->proj_b, s.dxmid, C, C));
    TRY(op<AddOp>(cx->st, T * C, x, (const float*)s.dxmid, s.xmid)); /* dxmid is free until backward */
    TRY(op<LnFwd>(cx->st, T, (const float*)s.xmid, (const float*)b->ln2_g, (const float*)b->ln2_b, s.ln2, s.mu2, s.rs2, C));
    TRY(op<MmFwd>(cx->st, T * 4 * C, (const float*)s.ln2, (const float*)b->fc_w, (const float*)b->fc_b, s.fcpre, C, 4 * C));
    TRY(op<GeluFwd>(cx->st, T * 4 * C, (const float*)s.fcpre, s.fcact));
    TRY(op<MmFwd>(cx->st, T * C, (const float*)s.fcact, (const float*)b->fcp_w, (const float*)b->fcp_b, s.dln, 4 * C, C));
    return op<AddOp>(cx->st, T * C, (const float*)s.xmid, (const float*)s.dln, y);
}

static int block_bwd(const gpt* w, gpt* g, int l, const ctx* cx, pp_layer_io* io) {
    const blk* b = &w->b[l];
    blk* gb = &g->b[l];
    int T = (int)io->mb->rows, C = w->C, H = w->H, row0 = (int)io->mb->row0;
    const float *x = (const float*)io->in[0].data, *dy = (const float*)io->d_out[0].data;
    float* dx = (float*)io->d_in[0].data;
    bsave s;
    if (bsave_carve(&s, (float*)io->saved, T, C, H) > io->saved_bytes) return 2;
    /* MLP: y = xmid + fcp(gelu(fc(ln2(xmid)))) */
    TRY(op<MmBwdW>(cx->st, 4 * C * C + C, (const float*)s.fcact, dy, gb->fcp_w, gb->fcp_b, T, 4 * C, C));
    TRY(op<MmBwdX>(cx->st, T * 4 * C, dy, (const float*)b->fcp_w, s.dfc, 4 * C, C));
    TRY(op<GeluBwd>(cx->st, T * 4 * C, (const float*)s.fcpre, s.dfc));
    TRY(op<MmBwdW>(cx->st, C * 4 * C + 4 * C, (const float*)s.ln2, (const float*)s.dfc, gb->fc_w, gb->fc_b, T, C, 4 * C));
    TRY(op<MmBwdX>(cx->st, T * C, (const float*)s.dfc, (const float*)b->fc_w, s.dln, C, 4 * C));
    TRY(op<LnBwdP>(cx->st, C, (const float*)s.dln, (const float*)s.xmid, (const float*)s.mu2, (const float*)s.rs2, gb->ln2_g,
                   gb->ln2_b, T, C));
    TRY(op<LnBwdX>(cx->st, T, (const float*)s.dln, (const float*)s.xmid, (const float*)s.mu2, (const float*)s.rs2,
                   (const float*)b->ln2_g, dy, s.dxmid, C));
    /* attention: xmid = x + proj(attn(qkv(ln1(x)))) */
    TRY(op<MmBwdW>(cx->st, C * C + C, (const float*)s.att, (const float*)s.dxmid, gb->proj_w, gb->proj_b, T, C, C));
    TRY(op<MmBwdX>(cx->st, T * C, (const float*)s.dxmid, (const float*)b->proj_w, s.datt, C, C));
    TRY(op<AttnD>(cx->st, T * H, (const float*)s.datt, (const float*)s.att, s.D, C, H));
    TRY(op<AttnDq>(cx->st, T * H, (const float*)s.qkv, (const float*)s.datt, (const float*)s.lse, (const float*)s.D,
                   cx->sstart, row0, s.dqkv, C, H));
    TRY(op<AttnDkv>(cx->st, T * H, (const float*)s.qkv, (const float*)s.datt, (const float*)s.lse, (const float*)s.D,
                    cx->send, row0, s.dqkv, C, H));
    TRY(op<MmBwdW>(cx->st, C * 3 * C + 3 * C, (const float*)s.ln1, (const float*)s.dqkv, gb->qkv_w, gb->qkv_b, T, C, 3 * C));
    TRY(op<MmBwdX>(cx->st, T * C, (const float*)s.dqkv, (const float*)b->qkv_w, s.dln, C, 3 * C));
    TRY(op<LnBwdP>(cx->st, C, (const float*)s.dln, x, (const float*)s.mu1, (const float*)s.rs1, gb->ln1_g, gb->ln1_b, T, C));
    if (dx)
        TRY(op<LnBwdX>(cx->st, T, (const float*)s.dln, x, (const float*)s.mu1, (const float*)s.rs1, (const float*)b->ln1_g,
                       (const float*)s.dxmid, dx, C));
    return 0;
}

static int head_fwd(const gpt* w, const ctx* cx, pp_layer_io* io) {
    int T = (int)io->mb->rows, C = w->C, V = w->V;
    const int32_t* tgt = (const int32_t*)io->mb->targets;
    hsave s;
    if (hsave_carve(&s, (float*)io->saved, T, C, V) > io->saved_bytes || !cx->mb_loss) return 2;
    TRY(op<LnFwd>(cx->st, T, (const float*)io->in[0].data, (const float*)w->lnf_g, (const float*)w->lnf_b, s.xn, s.mu, s.rs, C));
    TRY(op<HeadFwd>(cx->st, T * V, (const float*)s.xn, (const float*)w->wte, s.logits, C, V));
    TRY(op<XentFwd>(cx->st, T, (const float*)s.logits, tgt, s.lse, s.rowloss, V));
    io->loss = 0; /* on the GPU: cx->mb_loss */
    return op<LossSum>(cx->st, 1, (const float*)s.rowloss, tgt, T, &cx->mb_loss[io->mb->index]);
}

static int head_bwd(const gpt* w, gpt* g, const ctx* cx, pp_layer_io* io) {
    int T = (int)io->mb->rows, C = w->C, V = w->V, n_tgt = (int)io->mb->rows - (io->mb->cu_seqlens ? io->mb->n_seqs : 1);
    const int32_t* tgt = (const int32_t*)io->mb->targets;
    hsave s;
    if (hsave_carve(&s, (float*)io->saved, T, C, V) > io->saved_bytes) return 2;
    if (n_tgt < 1) n_tgt = 1;
    TRY(op<XentBwd>(cx->st, T * V, (const float*)s.logits, (const float*)s.lse, tgt, s.dl, V, io->mb->loss_scale / (float)n_tgt));
    TRY(op<HeadBwdW>(cx->st, V * C, (const float*)s.xn, (const float*)s.dl, g->wte_head, T, C, V));
    TRY(op<HeadBwdX>(cx->st, T * C, (const float*)s.dl, (const float*)w->wte, s.dxn, C, V));
    TRY(op<LnBwdP>(cx->st, C, (const float*)s.dxn, (const float*)io->in[0].data, (const float*)s.mu, (const float*)s.rs,
                   g->lnf_g, g->lnf_b, T, C));
    if (io->d_in[0].data)
        TRY(op<LnBwdX>(cx->st, T, (const float*)s.dxn, (const float*)io->in[0].data, (const float*)s.mu, (const float*)s.rs,
                       (const float*)w->lnf_g, (const float*)NULL, (float*)io->d_in[0].data, C));
    return 0;
}

/* pp_model callbacks: layer 0 embed, 1..nb blocks, nb+1 head */
static int m_forward(const void* wv, int l, pp_layer_io* io) {
    const gpt* w = (const gpt*)wv;
    const ctx* cx = (const ctx*)io->ctx;
    if (!cx) return 1;
    if (l == 0) return embed_fwd(w, cx, io);
    if (l <= w->nb) return block_fwd(w, l - 1, cx, io);
    return head_fwd(w, cx, io);
}
static int m_backward(const void* wv, void* gv, int l, pp_layer_io* io) {
    const gpt* w = (const gpt*)wv;
    const ctx* cx = (const ctx*)io->ctx;
    if (!cx) return 1;
    if (l == 0) return embed_bwd(w, (gpt*)gv, cx, io);
    if (l <= w->nb) return block_bwd(w, (gpt*)gv, l - 1, cx, io);
    return head_bwd(w, (gpt*)gv, cx, io);
}
static void m_describe(const void* wv, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    const gpt* w = (const gpt*)wv;
    size_t T = (size_t)mb->rows, C = (size_t)w->C;
    double attn = 0;
    (void)in;
    (void)n_in;
    for (int s = 0; mb->cu_seqlens && s < mb->n_seqs; s++) {
        double L = mb->cu_seqlens[s + 1] - mb->cu_seqlens[s];
        attn += L * L;
    }
    if (l <= w->nb) {
        d->n_out = 1;
        d->out[0].rows = mb->rows;
        d->out[0].cols = w->C;
        d->out[0].dtype = PP_F32;
    }
    if (l == 0) {
        d->cost = (double)T * C;
    } else if (l <= w->nb) {
        bsave s;
        d->saved_bytes = bsave_carve(&s, NULL, T, C, (size_t)w->H);
        d->cost = 24.0 * T * C * C + 4.0 * attn * C;
    } else {
        hsave s;
        d->saved_bytes = hsave_carve(&s, NULL, T, C, (size_t)w->V);
        d->cost = 6.0 * T * C * w->V;
    }
}
static const char* m_name(int l) { return l == 0 ? "embed" : "block/head"; }

/* ---- memory: the GPU, or the host under --cpu ----------------------------------------------- */
static void* dalloc(size_t bytes) {
    void* p = NULL;
    if (g_cpu) return calloc(bytes ? bytes : 1, 1);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (cudaMemset(p, 0, bytes) != cudaSuccess) return NULL;
    return p;
}
static void dfree(void* p) {
    if (g_cpu) free(p);
    else if (p) cudaFree(p);
}
static int dput(void* dst, const void* src, size_t n) {
    if (g_cpu) {
        memcpy(dst, src, n);
        return 0;
    }
    return cudaMemcpy(dst, src, n, cudaMemcpyDefault) != cudaSuccess;
}
static int dzero(void* p, size_t n) {
    if (g_cpu) {
        memset(p, 0, n);
        return 0;
    }
    return cudaMemset(p, 0, n) != cudaSuccess;
}

#endif /* GPT_CUDA_H */
