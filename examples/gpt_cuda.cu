/* examples/gpt_cuda.cu - a small GPT trained through a pipeline of CUDA streams (pipeline_cuda.h).

   The model of examples/gpt.h on the GPU: token + position embedding (the position restarts at
   every packed sequence), pre-LN transformer blocks (causal attention that never crosses a
   sequence boundary, MLP C -> 4C -> GELU -> C), a final LayerNorm and an LM head TIED to the
   token embedding. Trained on packed variable-length documents of bundled text (README.md by
   default) with Adam. Every rank is a host thread that enqueues its stages' kernels on its own
   stream; the library moves activations between streams (and GPUs) with event-ordered copies.

     build/gpt_cuda [--schedule gpipe|1f1b|interleaved] [-p 4] [-v 2] [-m 8] [--steps 40]
                    [--gpus N] [--text FILE | --generated] [--seqs-per-step 64] [--max-len 128]
                    [--dim 128] [--heads 4] [--layers 4] [--lr 1e-3] [--trace FILE]
                    [--check] [--bench] [--cpu] [--gradcheck]

   Prints per step: loss, tokens/s, the measured bubble (CUDA event timeline) and, at the end,
   the GPU memory each stage's block pool holds next to the parameter and gradient bytes.
   --gpus N       spreads rank r over GPU r % N (default 1: every stage on one GPU)
   --check        trains the same steps unpipelined (p = 1, one stream) from the same start and
                  requires the loss curve and final weights to be BIT-IDENTICAL (exit 1 if not):
                  the kernels are deterministic (one thread per output, fixed summation order, no
                  atomics) and gradients accumulate in ascending micro-batch order on every schedule
   --bench        times steps at the configured p against p = 1 on the same GPU and prints the ratio
   --trace FILE   Chrome trace JSON (ui.perfetto.dev) of the last step, one track per rank
   --cpu          runs the same layer code on the host (threads transport, host blocks): the
                  kernels are __host__ __device__ functors, so the math is testable without a GPU
   --gradcheck    (with --cpu) compares every layer kind's gradients with finite differences

   TIED HEAD. Stage 0 reads wte for the embedding and the last stage reads the same wte for the
   logits. In one process they read one buffer (one replica per GPU in use). The head writes its
   share of the wte gradient into a separate slot; after the step the step's gradient is
   (sum over ranks of the embedding share) + (sum over ranks of the head share), a fixed order,
   so p = 1 and every pipelined run add the same numbers in the same order.

   LOSS. Each micro-batch's mean cross-entropy over its tokens that have a target (every token
   but a document's last) is written on the GPU (io->loss stays 0: reading it would synchronise
   the stream); the step loss is the mean over micro-batches, read after the step. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
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

/* ---- training ---------------------------------------------------------------------------------- */
typedef struct cfg {
    pp_schedule_kind kind;
    int p, v, m, steps, seqs, max_len, dim, heads, layers, gpus;
    float lr;
    const char* text;
    const char* trace;
    int generated, check, bench, gradcheck;
} cfg;

typedef struct run_out {
    float loss[1024];
    double tok_s, step_s, bubble;
    float* final_params;        /* host copy, n params */
    size_t n_params;
    size_t pool_bytes[PP_MAX_RANKS];
    int pool_allocs_first[PP_MAX_RANKS], pool_allocs[PP_MAX_RANKS];
    double step_time_mean;      /* seconds, steps after the first two */
} run_out;

typedef struct trainer {
    cfg c;
    int p, v, n_dev, S;
    gpt shape;
    pp_model model;
    pp_action* acts;
    pp_schedule sched;
    int first[PP_MAX_RANKS * 4 + 1];
    pp_cuda* cuda;
    pp_threads* th;
    /* per device */
    float* wbuf[MAXDEV];
    gpt w[MAXDEV];
    int32_t *tok[MAXDEV], *tgt[MAXDEV], *pos[MAXDEV], *sst[MAXDEV], *sen[MAXDEV];
    /* per rank */
    int dev[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    gpt g[PP_MAX_RANKS];
    ctx cx[PP_MAX_RANKS];
    pp_stage* st[PP_MAX_RANKS];
    pp_result rc[PP_MAX_RANKS];
    /* optimizer on device 0 */
    float *gsum, *gtmp, *m1, *m2;
    size_t n_par, n_grad;
    pp_batch batch[MAXDEV];
    int cap_rows;
    int32_t *h_tok, *h_tgt, *h_cu, *h_pos, *h_sst, *h_sen;
} trainer;

static pp_result rank_fn(int rank, void* user) {
    trainer* t = (trainer*)user;
    pp_error err;
    if (!g_cpu && pp_cuda_bind(t->cuda, rank, &err) != PP_OK) return t->rc[rank] = PP_ERR_TRANSPORT;
    t->rc[rank] = pp_stage_step(t->st[rank], &t->batch[t->dev[rank]], NULL);
    return t->rc[rank];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void trainer_free(trainer* t) {
    for (int r = 0; r < t->p; r++) pp_stage_destroy(t->st[r]);
    if (t->cuda) pp_cuda_destroy(t->cuda);
    if (t->th) pp_threads_destroy(t->th);
    for (int r = 0; r < t->p; r++) {
        if (!g_cpu) cudaSetDevice(t->dev[r]);
        dfree(t->gbuf[r]);
        dfree(t->cx[r].mb_loss);
    }
    for (int d = 0; d < t->n_dev; d++) {
        if (!g_cpu) cudaSetDevice(d);
        dfree(t->wbuf[d]);
        dfree(t->tok[d]);
        dfree(t->tgt[d]);
        dfree(t->pos[d]);
        dfree(t->sst[d]);
        dfree(t->sen[d]);
    }
    if (!g_cpu) cudaSetDevice(0);
    dfree(t->gsum);
    dfree(t->gtmp);
    dfree(t->m1);
    dfree(t->m2);
    free(t->acts);
    free(t->h_tok);
    free(t->h_tgt);
    free(t->h_cu);
    free(t->h_pos);
    free(t->h_sst);
    free(t->h_sen);
}

static int trainer_init(trainer* t, const cfg* c, int p, pp_schedule_kind kind, int v, int n_dev) {
    pp_error err;
    size_t n;
    memset(t, 0, sizeof *t);
    t->c = *c;
    t->p = p;
    t->v = v;
    t->S = p * v;
    t->n_dev = n_dev;
    t->shape.V = GPT_DATA_VOCAB;
    t->shape.maxT = c->max_len;
    t->shape.C = c->dim;
    t->shape.H = c->heads;
    t->shape.nb = c->layers;
    t->model.name = "gpt_cuda";
    t->model.n_layers = c->layers + 2;
    t->model.forward = m_forward;
    t->model.backward = m_backward;
    t->model.describe = m_describe;
    t->model.layer_name = m_name;
    n = pp_schedule_size(kind, p, v, c->m);
    t->acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
    if (!t->acts || pp_schedule_make(kind, p, v, c->m, t->acts, n, &t->sched, &err) != PP_OK) {
        fprintf(stderr, "schedule: %s\n", err.msg);
        return 1;
    }
    if (pp_partition_uniform(t->model.n_layers, t->S, t->first, &err) != PP_OK) {
        fprintf(stderr, "partition: %s\n", err.msg);
        return 1;
    }
    t->n_par = gpt_numel(&t->shape);
    t->n_grad = t->n_par + (size_t)t->shape.V * t->shape.C;
    /* identical initial weights on every device */
    {
        float* h = (float*)malloc(sizeof(float) * t->n_par);
        gpt hw = t->shape;
        uint64_t rng = 1234;
        if (!h) return 1;
        gpt_bind(&hw, h, 0);
        for (size_t i = 0; i < t->n_par; i++) h[i] = (2.0f * gpt_rng_uniform(&rng) - 1.0f) * 0.035f;
        for (int l = 0; l < hw.nb; l++)
            for (int k = 0; k < hw.C; k++) {
                hw.b[l].ln1_g[k] = hw.b[l].ln2_g[k] = 1.0f;
                hw.b[l].ln1_b[k] = hw.b[l].ln2_b[k] = 0.0f;
            }
        for (int k = 0; k < hw.C; k++) {
            hw.lnf_g[k] = 1.0f;
            hw.lnf_b[k] = 0.0f;
        }
        for (int d = 0; d < n_dev; d++) {
            if (!g_cpu) cudaSetDevice(d);
            if (!(t->wbuf[d] = (float*)dalloc(sizeof(float) * t->n_par)) || dput(t->wbuf[d], h, sizeof(float) * t->n_par)) {
                free(h);
                fprintf(stderr, "device %d: weights\n", d);
                return 1;
            }
            t->w[d] = t->shape;
            gpt_bind(&t->w[d], t->wbuf[d], 0);
        }
        free(h);
    }
    if (!g_cpu) cudaSetDevice(0);
    if (!(t->gsum = (float*)dalloc(sizeof(float) * t->n_grad)) || !(t->gtmp = (float*)dalloc(sizeof(float) * t->n_grad)) ||
        !(t->m1 = (float*)dalloc(sizeof(float) * t->n_par)) || !(t->m2 = (float*)dalloc(sizeof(float) * t->n_par)))
        return 1;
    if (g_cpu) {
        if (pp_threads_create(p, &t->th, &err) != PP_OK) return 1;
    } else {
        pp_cuda_desc cd;
        int devs[PP_MAX_RANKS];
        memset(&cd, 0, sizeof cd);
        for (int r = 0; r < p; r++) devs[r] = r % n_dev;
        cd.n_ranks = p;
        cd.devices = devs;
        cd.timeline = 1;
        if (pp_cuda_create(&cd, &t->cuda, &err) != PP_OK) {
            fprintf(stderr, "pp_cuda_create: %s\n", err.msg);
            return 1;
        }
    }
    for (int r = 0; r < p; r++) {
        pp_stage_desc d;
        t->dev[r] = r % n_dev;
        if (!g_cpu) cudaSetDevice(t->dev[r]);
        if (!(t->gbuf[r] = (float*)dalloc(sizeof(float) * t->n_grad)) || !(t->cx[r].mb_loss = (float*)dalloc(sizeof(float) * 1024)))
            return 1;
        t->g[r] = t->shape;
        gpt_bind(&t->g[r], t->gbuf[r], 1);
        t->cx[r].st = g_cpu ? (cudaStream_t)0 : pp_cuda_stream(t->cuda, r);
        memset(&d, 0, sizeof d);
        d.model = t->model;
        d.weights = &t->w[t->dev[r]];
        d.grads = &t->g[r];
        d.schedule = &t->sched;
        d.partition = t->first;
        d.rank = r;
        d.layer_ctx = &t->cx[r];
        d.timeout_s = 120;
        if (g_cpu) {
            d.transport = pp_threads_transport(t->th, r);
        } else {
            d.transport = pp_cuda_transport(t->cuda, r);
            d.device = pp_cuda_device_ops(t->cuda, r);
        }
        if (pp_stage_create(&d, &t->st[r], &err) != PP_OK) {
            fprintf(stderr, "rank %d: %s\n", r, err.msg);
            return 1;
        }
    }
    return 0;
}

/* Packs the step's documents and copies the per-row tables to every device. */
static int load_batch(trainer* t, const gpt_corpus* corp, uint64_t* rng, int* T_out) {
    int cap = t->c.seqs * t->c.max_len, T;
    if (cap > t->cap_rows) {
        free(t->h_tok);
        free(t->h_tgt);
        free(t->h_pos);
        free(t->h_sst);
        free(t->h_sen);
        free(t->h_cu);
        t->h_tok = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap);
        t->h_tgt = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap);
        t->h_pos = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap);
        t->h_sst = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap);
        t->h_sen = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap);
        t->h_cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(t->c.seqs + 1));
        if (!t->h_tok || !t->h_tgt || !t->h_pos || !t->h_sst || !t->h_sen || !t->h_cu) return 1;
        for (int d = 0; d < t->n_dev; d++) {
            if (!g_cpu) cudaSetDevice(d);
            dfree(t->tok[d]);
            dfree(t->tgt[d]);
            dfree(t->pos[d]);
            dfree(t->sst[d]);
            dfree(t->sen[d]);
            t->tok[d] = (int32_t*)dalloc(sizeof(int32_t) * (size_t)cap);
            t->tgt[d] = (int32_t*)dalloc(sizeof(int32_t) * (size_t)cap);
            t->pos[d] = (int32_t*)dalloc(sizeof(int32_t) * (size_t)cap);
            t->sst[d] = (int32_t*)dalloc(sizeof(int32_t) * (size_t)cap);
            t->sen[d] = (int32_t*)dalloc(sizeof(int32_t) * (size_t)cap);
            if (!t->tok[d] || !t->tgt[d] || !t->pos[d] || !t->sst[d] || !t->sen[d]) return 1;
        }
        t->cap_rows = cap;
    }
    T = gpt_pack(corp, rng, t->c.seqs, t->h_tok, t->h_tgt, t->h_cu);
    for (int s = 0; s < t->c.seqs; s++)
        for (int r = t->h_cu[s]; r < t->h_cu[s + 1]; r++) {
            t->h_pos[r] = r - t->h_cu[s];
            t->h_sst[r] = t->h_cu[s];
            t->h_sen[r] = t->h_cu[s + 1];
        }
    for (int d = 0; d < t->n_dev; d++) {
        size_t b = sizeof(int32_t) * (size_t)T;
        pp_batch* pb = &t->batch[d];
        if (!g_cpu) cudaSetDevice(d);
        if (dput(t->tok[d], t->h_tok, b) || dput(t->tgt[d], t->h_tgt, b) || dput(t->pos[d], t->h_pos, b) ||
            dput(t->sst[d], t->h_sst, b) || dput(t->sen[d], t->h_sen, b))
            return 1;
        memset(pb, 0, sizeof *pb);
        pb->m = t->c.m;
        pb->input.data = t->tok[d];
        pb->input.rows = T;
        pb->input.cols = 1;
        pb->input.dtype = PP_I32;
        pb->targets = t->tgt[d];
        pb->target_row_bytes = sizeof(int32_t);
        pb->cu_seqlens = t->h_cu;
        pb->n_seqs = t->c.seqs;
        pb->split = PP_SPLIT_TOKENS;
    }
    for (int r = 0; r < t->p; r++) {
        t->cx[r].pos = t->pos[t->dev[r]];
        t->cx[r].sstart = t->sst[t->dev[r]];
        t->cx[r].send = t->sen[t->dev[r]];
    }
    *T_out = T;
    return 0;
}

/* One training step: pipeline, then the gradient sum in rank order, tied wte, Adam, replicas. */
static int train_step(trainer* t, int step, float* loss, pp_cuda_step_info* info) {
    pp_error err;
    int last_rank, chunk;
    float mbl[1024];
    double acc = 0;
    for (int r = 0; r < t->p; r++) {
        if (!g_cpu) cudaSetDevice(t->dev[r]);
        if (dzero(t->gbuf[r], sizeof(float) * t->n_grad)) return 1;
    }
    /* the zeroing and the batch upload ran on the legacy stream, which the stage streams
       (non-blocking) do not wait for: finish them before the step (between steps, not inside) */
    for (int d = 0; d < t->n_dev && !g_cpu; d++)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 1;
    if (!g_cpu && pp_cuda_step_begin(t->cuda, &err) != PP_OK) {
        fprintf(stderr, "step_begin: %s\n", err.msg);
        return 1;
    }
    if (pp_threads_run(t->p, rank_fn, t, &err) != PP_OK) {
        for (int r = 0; r < t->p; r++)
            if (t->rc[r] != PP_OK)
                fprintf(stderr, "rank %d: %s %s\n", r, pp_stage_error(t->st[r]), g_cpu ? "" : pp_cuda_error(t->cuda, r));
        return 1;
    }
    if (!g_cpu && pp_cuda_step_end(t->cuda, info, &err) != PP_OK) {
        fprintf(stderr, "step_end: %s\n", err.msg);
        return 1;
    }
    if (g_cpu && info) memset(info, 0, sizeof *info);
    /* gradient of the step: sum over ranks in rank order (others' slots are zero) */
    if (!g_cpu) cudaSetDevice(0);
    if (dzero(t->gsum, sizeof(float) * t->n_grad)) return 1;
    for (int r = 0; r < t->p; r++) {
        const float* src = t->gbuf[r];
        if (!g_cpu && t->dev[r] != 0) {
            if (cudaMemcpyPeer(t->gtmp, 0, t->gbuf[r], t->dev[r], sizeof(float) * t->n_grad) != cudaSuccess ||
                cudaDeviceSynchronize() != cudaSuccess)
                return 1;
            src = t->gtmp;
        }
        if (op<AccOp>((cudaStream_t)0, (int)t->n_grad, t->gsum, src)) return 1;
    }
    /* tied: wte's gradient = embedding share + head share */
    if (op<AccOp>((cudaStream_t)0, t->shape.V * t->shape.C, t->gsum, (const float*)(t->gsum + t->n_par))) return 1;
    {
        float bc1 = 1.0f - powf(0.9f, (float)(step + 1)), bc2 = 1.0f - powf(0.999f, (float)(step + 1));
        if (op<AdamOp>((cudaStream_t)0, (int)t->n_par, t->wbuf[0], (const float*)t->gsum, t->m1, t->m2, t->c.lr, bc1, bc2)) return 1;
    }
    if (!g_cpu && cudaStreamSynchronize(0) != cudaSuccess) return 1;
    for (int d = 1; d < t->n_dev; d++)
        if (cudaMemcpyPeer(t->wbuf[d], d, t->wbuf[0], 0, sizeof(float) * t->n_par) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess)
            return 1;
    pp_schedule_stage_rank(&t->sched, t->S - 1, &last_rank, &chunk);
    if (!g_cpu) cudaSetDevice(t->dev[last_rank]);
    if (g_cpu) memcpy(mbl, t->cx[last_rank].mb_loss, sizeof(float) * (size_t)t->c.m);
    else if (cudaMemcpy(mbl, t->cx[last_rank].mb_loss, sizeof(float) * (size_t)t->c.m, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    for (int i = 0; i < t->c.m; i++) acc += (double)(float)(1.0 / t->c.m) * (double)mbl[i];
    *loss = (float)acc;
    return 0;
}

static int load_corpus(const cfg* c, gpt_corpus* corp) {
    const char* path = c->text ? c->text : "README.md";
    if (!c->generated && gpt_corpus_load(corp, path, c->max_len, 42) == 0) return 0;
    if (c->text) {
        fprintf(stderr, "cannot read %s\n", c->text);
        return 1;
    }
    return gpt_corpus_generate(corp, 4000, c->max_len, 42);
}

/* Trains c->steps steps at (p, kind, v); fills out. verbose prints per step. */
static int train(const cfg* c, int p, pp_schedule_kind kind, int v, int n_dev, int verbose, run_out* out) {
    static trainer t;
    gpt_corpus corp;
    uint64_t rng = 777;
    double t_sum = 0;
    int n_t = 0, rc = 0;
    memset(out, 0, sizeof *out);
    if (load_corpus(c, &corp)) return 1;
    if (trainer_init(&t, c, p, kind, v, n_dev)) {
        trainer_free(&t);
        gpt_corpus_free(&corp);
        return 1;
    }
    if (verbose)
        printf("gpt_cuda: %s p=%d v=%d m=%d on %d %s, %d blocks, C=%d, %zu parameters, text: %s\n", pp_schedule_name(kind), p, v,
               c->m, g_cpu ? 0 : n_dev, g_cpu ? "GPUs (--cpu: host)" : "GPU(s)", c->layers, c->dim, t.n_par, corp.source);
    for (int s = 0; s < c->steps && s < 1024; s++) {
        int T = 0;
        float loss = 0;
        pp_cuda_step_info info;
        double t0;
        if (load_batch(&t, &corp, &rng, &T)) {
            rc = 1;
            break;
        }
        t0 = now_s();
        if (train_step(&t, s, &loss, &info)) {
            rc = 1;
            break;
        }
        {
            double dt = now_s() - t0;
            out->loss[s] = loss;
            out->tok_s = T / dt;
            out->bubble = info.bubble;
            if (s >= 2) {
                t_sum += g_cpu ? dt : info.span;
                n_t++;
            }
            if (verbose)
                printf("step %3d  loss %.4f  %6d tokens  %9.0f tokens/s  bubble %5.1f%%  span %.2f ms\n", s, loss, T, T / dt,
                       100.0 * info.bubble, 1e3 * info.span);
        }
        for (int r = 0; r < p && !g_cpu; r++)
            pp_cuda_memory(t.cuda, r, &out->pool_bytes[r], s == 0 ? &out->pool_allocs_first[r] : &out->pool_allocs[r]);
    }
    out->step_time_mean = n_t ? t_sum / n_t : 0;
    if (rc == 0) {
        out->n_params = t.n_par;
        out->final_params = (float*)malloc(sizeof(float) * t.n_par);
        if (!g_cpu) cudaSetDevice(0);
        if (!out->final_params || (g_cpu ? (memcpy(out->final_params, t.wbuf[0], sizeof(float) * t.n_par), 0)
                                         : cudaMemcpy(out->final_params, t.wbuf[0], sizeof(float) * t.n_par, cudaMemcpyDeviceToHost) != cudaSuccess))
            rc = 1;
    }
    if (rc == 0 && verbose && !g_cpu) {
        size_t pb = sizeof(float) * t.n_par;
        printf("memory per stage (GPU block pool: stashes, received activations, gradient workspaces):\n");
        for (int r = 0; r < p; r++) {
            int stg = pp_schedule_stage(&t.sched, r, 0);
            printf("  rank %d (GPU %d, first stage %d): pool %.2f MiB in %d cudaMalloc (%d after step 0), parameters %.2f MiB, gradients %.2f MiB\n",
                   r, t.dev[r], stg, out->pool_bytes[r] / 1048576.0, out->pool_allocs[r] ? out->pool_allocs[r] : out->pool_allocs_first[r],
                   (out->pool_allocs[r] ? out->pool_allocs[r] : out->pool_allocs_first[r]) - out->pool_allocs_first[r], pb / 1048576.0,
                   sizeof(float) * t.n_grad / 1048576.0);
        }
    }
    if (rc == 0 && c->trace && !g_cpu && verbose) {
        size_t n = pp_cuda_timeline(t.cuda, NULL, 0);
        pp_event* ev = (pp_event*)malloc(sizeof(pp_event) * (n ? n : 1));
        FILE* f = fopen(c->trace, "w");
        if (ev && f) {
            pp_cuda_timeline(t.cuda, ev, n);
            pp_timeline_chrome(f, ev, n, 1e6);
            printf("timeline of the last step: %s (%zu actions)\n", c->trace, n);
        }
        if (f) fclose(f);
        free(ev);
    }
    trainer_free(&t);
    gpt_corpus_free(&corp);
    return rc;
}

/* --cpu --gradcheck: analytic gradients of one micro-batch against central differences. */
static int gradcheck(const cfg* c0) {
    cfg c = *c0;
    static trainer t;
    gpt_corpus corp;
    uint64_t rng = 5;
    int T, bad = 0, n_checked = 0;
    pp_error err;
    c.m = 1;
    c.seqs = 3;
    if (load_corpus(&c, &corp) || trainer_init(&t, &c, 1, PP_SCHED_GPIPE, 1, 1) || load_batch(&t, &corp, &rng, &T)) {
        printf("gradcheck: setup failed\n");
        return 1;
    }
    /* analytic: one step's gradient, without the update */
    memset(t.gbuf[0], 0, sizeof(float) * t.n_grad);
    if (pp_stage_step(t.st[0], &t.batch[0], NULL) != PP_OK) {
        printf("gradcheck: %s\n", pp_stage_error(t.st[0]));
        return 1;
    }
    {
        float* g = t.gbuf[0];
        gpt gv = t.shape;
        float* w = t.wbuf[0];
        uint64_t pick = 99;
        gpt_bind(&gv, g, 1);
        for (size_t i = 0; i < (size_t)t.shape.V * t.shape.C; i++) g[i] += gv.wte_head[i];
        /* sample parameters from every region: wte, wpe, each block's tensors, lnf */
        for (int k = 0; k < 400; k++) {
            size_t i = (size_t)(gpt_rng_next(&pick) % t.n_par);
            float keep = w[i], lp, lm, eps = 1e-2f;
            double num, ana = g[i];
            /* the loss at w +- eps: a whole step (its gradients land in g and are put back) */
            float* save = (float*)malloc(sizeof(float) * t.n_grad);
            if (!save) return 1;
            memcpy(save, g, sizeof(float) * t.n_grad);
            w[i] = keep + eps;
            pp_stage_step(t.st[0], &t.batch[0], NULL);
            lp = t.cx[0].mb_loss[0];
            w[i] = keep - eps;
            pp_stage_step(t.st[0], &t.batch[0], NULL);
            lm = t.cx[0].mb_loss[0];
            memcpy(g, save, sizeof(float) * t.n_grad);
            free(save);
            w[i] = keep;
            num = ((double)lp - (double)lm) / (2.0 * eps);
            if (fabs(ana) < 1e-5 && fabs(num) < 1e-5) continue;
            n_checked++;
            if (fabs(num - ana) > 2e-4 + 0.05 * fabs(ana)) {
                if (bad < 10) printf("gradcheck: parameter %zu analytic %.6g numeric %.6g\n", i, ana, num);
                bad++;
            }
        }
    }
    (void)err;
    printf("gradcheck: %d of %d sampled parameters outside tolerance (|num - ana| <= 2e-4 + 5%% |ana|)\n", bad, n_checked);
    trainer_free(&t);
    gpt_corpus_free(&corp);
    return bad > 0 || n_checked < 50;
}

static int usage(void) {
    fprintf(stderr, "usage: gpt_cuda [--schedule gpipe|1f1b|interleaved] [-p N] [-v N] [-m N] [--steps N] [--gpus N]\n"
                    "                [--text FILE | --generated] [--seqs-per-step N] [--max-len N] [--dim N] [--heads N]\n"
                    "                [--layers N] [--lr X] [--trace FILE] [--check] [--bench] [--cpu] [--gradcheck]\n");
    return 2;
}

int main(int argc, char** argv) {
    cfg c;
    int ndev = 0, rc = 0;
    memset(&c, 0, sizeof c);
    c.kind = PP_SCHED_1F1B;
    c.p = 4;
    c.v = 2;
    c.m = 8;
    c.steps = 40;
    c.seqs = 64;
    c.max_len = 128;
    c.dim = 128;
    c.heads = 4;
    c.layers = 4;
    c.gpus = 1;
    c.lr = 1e-3f;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* n = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(s) (!strcmp(a, s) && n && ++i)
        if (ARG("--schedule")) {
            if (pp_schedule_kind_parse(n, &c.kind) != PP_OK) return usage();
        } else if (ARG("-p")) c.p = atoi(n);
        else if (ARG("-v")) c.v = atoi(n);
        else if (ARG("-m")) c.m = atoi(n);
        else if (ARG("--steps")) c.steps = atoi(n);
        else if (ARG("--gpus")) c.gpus = atoi(n);
        else if (ARG("--text")) c.text = n;
        else if (ARG("--seqs-per-step")) c.seqs = atoi(n);
        else if (ARG("--max-len")) c.max_len = atoi(n);
        else if (ARG("--dim")) c.dim = atoi(n);
        else if (ARG("--heads")) c.heads = atoi(n);
        else if (ARG("--layers")) c.layers = atoi(n);
        else if (ARG("--lr")) c.lr = (float)atof(n);
        else if (ARG("--trace")) c.trace = n;
        else if (!strcmp(a, "--generated")) c.generated = 1;
        else if (!strcmp(a, "--check")) c.check = 1;
        else if (!strcmp(a, "--bench")) c.bench = 1;
        else if (!strcmp(a, "--cpu")) g_cpu = 1;
        else if (!strcmp(a, "--gradcheck")) c.gradcheck = 1;
        else return usage();
#undef ARG
    }
    if (c.kind == PP_SCHED_ZB_V) c.v = 2;
    else if (c.kind != PP_SCHED_INTERLEAVED) c.v = 1;
    if (c.p < 1 || c.p > 64 || c.v < 1 || c.m < 1 || c.m > 1024 || c.steps < 1 || c.dim < 8 || c.heads < 1 ||
        c.dim % c.heads || c.dim / c.heads > MAXHS || c.seqs < c.m || c.max_len < 12 || c.gpus < 1 || c.gpus > MAXDEV)
        return usage();
    if (c.layers < c.p * c.v - 2) c.layers = c.p * c.v - 2;
    if (c.layers > MAXB) {
        fprintf(stderr, "gpt_cuda: p*v = %d stages need %d blocks, at most %d\n", c.p * c.v, c.layers, MAXB);
        return 2;
    }
    if (!g_cpu && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
        printf("gpt_cuda: no CUDA device; run with --cpu to execute the same layers on the host\n");
        return 0;
    }
    if (!g_cpu && c.gpus > ndev) c.gpus = ndev;
    if (g_cpu) c.gpus = 1;
    if (c.gradcheck) {
        if (!g_cpu) {
            fprintf(stderr, "--gradcheck needs --cpu (it reads losses on the host)\n");
            return 2;
        }
        return gradcheck(&c);
    }
    if (c.bench) {
        run_out a, b;
        cfg cb = c;
        int rounds = c.steps < 8 ? 8 : c.steps;
        cb.steps = rounds;
        if (train(&cb, c.p, c.kind, c.v, 1, 0, &a) || train(&cb, 1, PP_SCHED_GPIPE, 1, 1, 0, &b)) return 1;
        printf("# gpt_cuda --bench: %d blocks, C=%d, m=%d, %d steps (first 2 excluded), one GPU, GPU time per step\n", c.layers,
               c.dim, c.m, rounds);
        printf("%-28s %12s %10s\n", "configuration", "step (ms)", "bubble");
        printf("%-28s %12.3f %9.1f%%\n", "unpipelined p=1", 1e3 * b.step_time_mean, 100.0 * b.bubble);
        printf("%s p=%d v=%d%*s %12.3f %9.1f%%\n", pp_schedule_name(c.kind), c.p, c.v, (int)(28 - strlen(pp_schedule_name(c.kind)) - 8),
               "", 1e3 * a.step_time_mean, 100.0 * a.bubble);
        printf("pipelined / unpipelined step time: %.3f (goal <= 1.03)\n",
               b.step_time_mean > 0 ? a.step_time_mean / b.step_time_mean : 0.0);
        free(a.final_params);
        free(b.final_params);
        return 0;
    }
    {
        run_out a;
        if (train(&c, c.p, c.kind, c.v, c.gpus, 1, &a)) return 1;
        if (c.check) {
            run_out b;
            int same_loss = 1, same_w;
            printf("check: the same %d steps unpipelined (p=1, one stream)...\n", c.steps);
            if (train(&c, 1, PP_SCHED_GPIPE, 1, 1, 0, &b)) return 1;
            for (int s = 0; s < c.steps && s < 1024; s++)
                if (memcmp(&a.loss[s], &b.loss[s], sizeof(float)) != 0) {
                    if (same_loss) printf("check: step %d loss %.9g pipelined, %.9g unpipelined\n", s, a.loss[s], b.loss[s]);
                    same_loss = 0;
                }
            same_w = memcmp(a.final_params, b.final_params, sizeof(float) * a.n_params) == 0;
            printf("check: loss curve %s, final weights %s -> %s\n", same_loss ? "bit-identical" : "DIFFERS",
                   same_w ? "bit-identical" : "DIFFER", same_loss && same_w ? "OK" : "FAILED");
            rc = !(same_loss && same_w);
            free(b.final_params);
        }
        free(a.final_params);
    }
    return rc;
}
