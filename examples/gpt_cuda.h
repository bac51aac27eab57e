/* examples/gpt_cuda.h - the GPT of examples/gpt_cuda.cu and examples/gpt_nccl.cu: its kernels,
   its layers as a PP_MODEL list, the parameter layout and memory helpers.

   What to copy: how a GPU model plugs into pipeline.h. A layer enqueues its kernels on the stream
   in io->ctx (a pp_cuda_layer_ctx: the rank's stream and device) and never synchronises it.
   What all layers share (sizes, the step's per-row tables, where the loss goes, whether to run
   on the host) is the model's context, a gptc_run set as pp_model.ctx and read as
   io->model->ctx (d->model->ctx in describe). The depth is chosen at run time
   (gptc_model_desc_depth: the list holds up to GPTC_MAX_BLOCK blocks). Every op is a
   __host__ __device__ functor, launched as a kernel or, with gptc_run.cpu, run as a host loop
   (gpt_cuda --cpu), so the same layers are testable without a GPU.
   Include it after pipeline_cuda.h (directly or through pipeline_nccl.h), in a .cu file. */
#ifndef GPT_CUDA_H
#define GPT_CUDA_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* gpt_data.h's generator (examples/gpt.h's, which is C-only: the same splitmix64) */
#include "splitmix.h"
static inline uint64_t gpt_rng_next(uint64_t* s) { return splitmix_next(s); }
static inline float gpt_rng_uniform(uint64_t* s) { return splitmix_uniform(s); }
#include "gpt_data.h"
#include "gpt_loop.h"
#include "gpt_traffic.h"

#define GPTC_MAX_BLOCK 32   /* the list's blocks: the most a model can use */
#define GPTC_MAX_DEV 16     /* devices a run's tables are kept for */
#define GPTC_MAX_HS 64      /* most channels per head (attention keeps a head's row in registers) */

/* ---- launching: one functor per op, run as a kernel or as a host loop ---------------------- */
template <typename F, typename... A>
__global__ void gptc_k_map(int n, A... a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) F::at(i, a...);
}

/* F::at(i, a...) for i in [0, n): a host loop when cpu is set, else a kernel on st. */
template <typename F, typename... A>
static int gptc_op(int cpu, cudaStream_t st, int n, A... a) {
    if (n <= 0) return 0;
    if (cpu) {
        for (int i = 0; i < n; i++) F::at(i, a...);
        return 0;
    }
    gptc_k_map<F, A...><<<(n + 127) / 128, 128, 0, st>>>(n, a...);
    return cudaGetLastError() == cudaSuccess ? 0 : 9;
}

#define GPTC_HD __host__ __device__ static inline

/* x (T, C) = wte[token] + wpe[position in its sequence]; i over T*C */
struct gptc_embed_fwd_op {
    GPTC_HD void at(int i, const int32_t* tok, const int32_t* pos, int row0, const float* wte, const float* wpe, float* x, int C) {
        int r = i / C, c = i % C;
        x[i] = wte[(size_t)tok[r] * C + c] + wpe[(size_t)pos[row0 + r] * C + c];
    }
};
/* one thread per channel c, rows in order: deterministic scatter-add */
struct gptc_embed_bwd_op {
    GPTC_HD void at(int c, const int32_t* tok, const int32_t* pos, int row0, const float* dx, float* gwte, float* gwpe, int T, int C) {
        for (int r = 0; r < T; r++) {
            float d = dx[(size_t)r * C + c];
            gwte[(size_t)tok[r] * C + c] += d;
            gwpe[(size_t)pos[row0 + r] * C + c] += d;
        }
    }
};
/* LayerNorm of row r */
struct gptc_ln_fwd_op {
    GPTC_HD void at(int r, const float* x, const float* g, const float* b, float* y, float* mean, float* rstd, int C) {
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
struct gptc_ln_bwd_x_op {
    GPTC_HD void at(int r, const float* dy, const float* x, const float* mean, const float* rstd, const float* g,
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
struct gptc_ln_bwd_p_op {
    GPTC_HD void at(int c, const float* dy, const float* x, const float* mean, const float* rstd, float* gg, float* gb, int T, int C) {
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
/* y (T, out) = x (T, in) W (in, out) + b (b NULL: no bias) */
struct gptc_mm_fwd_op {
    GPTC_HD void at(int i, const float* x, const float* W, const float* b, float* y, int in, int out) {
        int r = i / out, o = i % out;
        float acc = b ? b[o] : 0.0f;
        for (int k = 0; k < in; k++) acc += x[(size_t)r * in + k] * W[(size_t)k * out + o];
        y[i] = acc;
    }
};
/* dx (T, in) = dy (T, out) W^T */
struct gptc_mm_bwd_x_op {
    GPTC_HD void at(int i, const float* dy, const float* W, float* dx, int in, int out) {
        int r = i / in, k = i % in;
        float acc = 0;
        for (int o = 0; o < out; o++) acc += dy[(size_t)r * out + o] * W[(size_t)k * out + o];
        dx[i] = acc;
    }
};
/* gW (in, out) += x^T dy, gb (out) += column sums of dy: one thread per element, rows in order
   (in * out threads: gW alone) */
struct gptc_mm_bwd_w_op {
    GPTC_HD void at(int i, const float* x, const float* dy, float* gW, float* gb, int T, int in, int out) {
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
/* y (T, out) = b broadcast over rows (before a cuBLAS product adds x W) */
struct gptc_bias_fill_op {
    GPTC_HD void at(int i, const float* b, float* y, int out) { y[i] = b[i % out]; }
};
/* gb (out) += column sums of dy (T, out): one thread per column, rows in order */
struct gptc_colsum_op {
    GPTC_HD void at(int o, const float* dy, float* gb, int T, int out) {
        float acc = 0;
        for (int r = 0; r < T; r++) acc += dy[(size_t)r * out + o];
        gb[o] += acc;
    }
};
GPTC_HD float gptc_gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
GPTC_HD float gptc_gelu_grad(float x) {
    float u = 0.7978845608f * (x + 0.044715f * x * x * x), t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}
struct gptc_gelu_fwd_op {
    GPTC_HD void at(int i, const float* x, float* y) { y[i] = gptc_gelu(x[i]); }
};
struct gptc_gelu_bwd_op {
    GPTC_HD void at(int i, const float* x, float* d) { d[i] *= gptc_gelu_grad(x[i]); }
};
struct gptc_add_op {
    GPTC_HD void at(int i, const float* a, const float* b, float* y) { y[i] = a[i] + b[i]; }
};
/* causal attention of (row r, head h) over its own sequence [sstart, r]; qkv (T, 3C) = q | k | v.
   out (T, C); lse (T, H) the log-sum-exp of the scores (backward recomputes the probabilities) */
struct gptc_attn_fwd_op {
    GPTC_HD void at(int i, const float* qkv, const int32_t* sstart, int row0, float* out, float* lse, int C, int H) {
        int r = i / H, h = i % H, hs = C / H, s0 = sstart[row0 + r] - row0;
        float scale = 1.0f / sqrtf((float)hs), acc[GPTC_MAX_HS], mx = -1e30f, l = 0;
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
struct gptc_attn_d_op {
    GPTC_HD void at(int i, const float* dout, const float* out, float* D, int C, int H) {
        int r = i / H, h = i % H, hs = C / H;
        float acc = 0;
        for (int d = 0; d < hs; d++) acc += dout[(size_t)r * C + h * hs + d] * out[(size_t)r * C + h * hs + d];
        D[i] = acc;
    }
};
/* The probability of key k for query q (from the forward's log-sum-exp lse) and, in *ds, the
   gradient of their score (dp = go . v against the row's D): what dq and dk, dv both sum. */
GPTC_HD float gptc_attn_p(const float* q, const float* k, const float* v, const float* go, int hs, float scale, float lse,
                          float D, float* ds) {
    float s = 0, dp = 0;
    for (int d = 0; d < hs; d++) {
        s += q[d] * k[d];
        dp += go[d] * v[d];
    }
    float p = expf(s * scale - lse);
    *ds = p * (dp - D) * scale;
    return p;
}
/* dq of (query r, head h): sum over its keys j <= r */
struct gptc_attn_dq_op {
    GPTC_HD void at(int i, const float* qkv, const float* dout, const float* lse, const float* D, const int32_t* sstart, int row0,
               float* dqkv, int C, int H) {
        int r = i / H, h = i % H, hs = C / H, s0 = sstart[row0 + r] - row0;
        float scale = 1.0f / sqrtf((float)hs), dq[GPTC_MAX_HS];
        const float *q = qkv + (size_t)r * 3 * C + h * hs, *go = dout + (size_t)r * C + h * hs;
        for (int d = 0; d < hs; d++) dq[d] = 0;
        for (int j = s0; j <= r; j++) {
            const float* k = qkv + (size_t)j * 3 * C + C + h * hs;
            float ds;
            gptc_attn_p(q, k, k + C, go, hs, scale, lse[(size_t)r * H + h], D[(size_t)r * H + h], &ds);
            for (int d = 0; d < hs; d++) dq[d] += ds * k[d];
        }
        for (int d = 0; d < hs; d++) dqkv[(size_t)r * 3 * C + h * hs + d] = dq[d];
    }
};
/* dk, dv of (key j, head h): sum over the queries r >= j of its sequence */
struct gptc_attn_dkv_op {
    GPTC_HD void at(int i, const float* qkv, const float* dout, const float* lse, const float* D, const int32_t* send, int row0,
               float* dqkv, int C, int H) {
        int j = i / H, h = i % H, hs = C / H, e = send[row0 + j] - row0;
        float scale = 1.0f / sqrtf((float)hs), dk[GPTC_MAX_HS], dv[GPTC_MAX_HS];
        const float *k = qkv + (size_t)j * 3 * C + C + h * hs, *v = k + C;
        for (int d = 0; d < hs; d++) dk[d] = dv[d] = 0;
        for (int r = j; r < e; r++) {
            const float *q = qkv + (size_t)r * 3 * C + h * hs, *go = dout + (size_t)r * C + h * hs;
            float ds, p = gptc_attn_p(q, k, v, go, hs, scale, lse[(size_t)r * H + h], D[(size_t)r * H + h], &ds);
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
struct gptc_xent_fwd_op {
    GPTC_HD void at(int r, const float* logits, const int32_t* tgt, float* lse, float* rowloss, int V) {
        const float* z = logits + (size_t)r * V;
        float mx = z[0], s = 0;
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < V; v++) s += expf(z[v] - mx);
        lse[r] = mx + logf(s);
        rowloss[r] = tgt[r] >= 0 ? lse[r] - z[tgt[r]] : 0.0f;
    }
};
/* one thread: the micro-batch's mean loss over rows with a target, rows in order */
struct gptc_loss_sum_op {
    GPTC_HD void at(int i, const float* rowloss, const int32_t* tgt, int T, float* out) {
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
struct gptc_xent_bwd_op {
    GPTC_HD void at(int i, const float* logits, const float* lse, const int32_t* tgt, float* dl, int V, float scale) {
        int r = i / V, v = i % V, t = tgt[r];
        dl[i] = t < 0 ? 0.0f : scale * (expf(logits[i] - lse[r]) - (v == t ? 1.0f : 0.0f));
    }
};
struct gptc_acc_op {
    GPTC_HD void at(int i, float* dst, const float* src) { dst[i] += src[i]; }
};
struct gptc_adam_op {
    GPTC_HD void at(int i, float* p, const float* g, float* m, float* v, float lr, float bc1, float bc2) {
        m[i] = 0.9f * m[i] + 0.1f * g[i];
        v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
        p[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + 1e-8f);
    }
};
/* AdamW (--wd): the decoupled weight decay p *= keep = 1 - lr * wd where decay[i] is set (the
   matrices: gptc_decay_mask), before Adam's update, as torch.optim.AdamW and gpt_train.h's
   gpt_optimize do it; keep = 1 leaves p's bits alone. */
struct gptc_adamw_op {
    GPTC_HD void at(int i, float* p, const float* g, float* m, float* v, const unsigned char* decay, float keep,
                    float lr, float bc1, float bc2) {
        if (decay[i]) p[i] *= keep;
        gptc_adam_op::at(i, p, g, m, v, lr, bc1, bc2);
    }
};

/* g *= s (the data-parallel mean) */
struct gptc_scale_op {
    GPTC_HD void at(int i, float* g, float s) { g[i] *= s; }
};

/* bf16 activations (gptc_config.bf16): widened to f32 for the layer's arithmetic and rounded
   back to nearest even, the bits of pipeline.h's pp_bf16_to_f32 and pp_f32_to_bf16 */
GPTC_HD float gptc_bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
GPTC_HD uint16_t gptc_bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* a quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
struct gptc_widen_op {
    GPTC_HD void at(int i, const uint16_t* h, float* f) { f[i] = gptc_bf16_widen(h[i]); }
};
struct gptc_narrow_op {
    GPTC_HD void at(int i, const float* f, uint16_t* h) { h[i] = gptc_bf16_round(f[i]); }
};

/* ---- the model: sizes, parameters, the run's shared context ------------------------------------ */
typedef struct gptc_config {
    int V, maxT, C, H;  /* vocabulary, longest sequence, channels, heads */
    int nb;             /* blocks in use, 1 .. GPTC_MAX_BLOCK */
    int bf16;           /* 1: the activations between layers and their gradients are bf16 (--dtype
                           bf16); each layer widens what it reads into f32 scratch in io->saved and
                           rounds what it writes; weights, gradients and saved scratch stay f32 */
    int tp;             /* tensor parallelism (0 or 1: none): each block's heads and MLP units split
                           tp ways, Megatron's way (TENSOR PARALLELISM below); C and H stay the
                           whole model's, divisible by tp */
} gptc_config;

/* TENSOR PARALLELISM. With cfg.tp > 1 a TP rank (pp_group_rank(io->tp)) holds H / tp heads of
   each block (qkv's q, k and v columns of its heads: column parallel) and the matching C / tp
   rows of the attention projection (row parallel), and 4C / tp of the MLP's units (fc's columns,
   fcp's rows), as examples/gpt.h does on the host. A row-parallel product is a partial sum,
   completed by one TP all-reduce (proj and fcp in forward; the bias added by TP rank 0's); in
   backward the input gradients of qkv and fc are all-reduced before the LayerNorm under them.
   The embedding, LayerNorms and head are whole on every TP rank, and their gradients equal. The
   all-reduce is gptc_run.tp_sum (gpt_nccl: pp_nccl_tp_allreduce, NCCL's on the layer's stream),
   or on the host (--cpu) pipeline.h's pp_tp_allreduce over io->tp. gptc_tp_shard cuts a TP rank's
   weights (or gradients) out of the whole model's. */
static inline int gptc_tpn(const gptc_config* g) { return g->tp > 1 ? g->tp : 1; }

/* What gpt_cuda and gpt_nccl share of their options (each program's own options struct derives
   from this one): the schedule, the batches, the model, the optimizer and its rate schedule, the
   held-out evaluation, checkpoints, the activations' dtype. The training options mean what they
   mean in gpt_cpu (examples/gpt_train.h, through examples/gpt_loop.h). */
struct gptc_opts {
    pp_schedule_kind kind;      /* --schedule (default 1f1b) */
    int v, m, steps;            /* -v (2), -m (8), --steps (40) */
    int seqs, max_len;          /* --seqs-per-step (64), --max-len (128) */
    int dim, heads, layers;     /* --dim (128), --heads (4), --layers (4) */
    float lr;                   /* --lr (1e-3) */
    const char* text;           /* --text FILE; else README.md, else the generated task */
    int generated;              /* --generated */
    int bf16;                   /* --dtype f32|bf16 (gptc_config.bf16) */
    float lr_min;               /* --lr-min X: where the cosine ends (default --lr: no decay) */
    int warmup;                 /* --warmup N: linear warm-up over the first N steps (0: none) */
    float wd;                   /* --wd X: AdamW's decoupled weight decay on the matrices (0: none) */
    float clip;                 /* --clip X: clip the global gradient norm at X (0: off) */
    int eval_every;             /* --eval-every N: the held-out loss every N steps and after the last */
    int eval_seqs;              /* --eval-seqs N: held-out documents per evaluation (default 128) */
    const char* save;           /* --save FILE: a checkpoint after the last step */
    const char* resume;         /* --resume FILE: start from a checkpoint, at its step */
    int recompute;              /* --recompute K: every K-th block's activations recomputed before
                                   its B (gpt_recompute_flags; 0: none) */
};

static void gptc_opts_default(gptc_opts* o) {
    /* the comments' defaults; --lr-min -1: --lr's, in gptc_opts_check */
    static const gptc_opts d = {PP_SCHED_1F1B, 2, 8, 40, 64, 128, 128, 4, 4, 1e-3f, NULL, 0, 0, -1.0f, 0, 0.0f, 0.0f, 0, 128, NULL, NULL, 0};
    *o = d;
}

/* argv[*i] if it is a shared option: 1 (*i moved past its value), 0 when it is not one, -1 when
   its value is bad (a message says which). */
static int gptc_opts_arg(gptc_opts* o, int argc, char** argv, int* i) {
    const struct { const char* name; int* at; } ints[] = {{"-v", &o->v},         {"-m", &o->m},
                                                          {"--steps", &o->steps}, {"--seqs-per-step", &o->seqs},
                                                          {"--max-len", &o->max_len}, {"--dim", &o->dim},
                                                          {"--heads", &o->heads}, {"--layers", &o->layers},
                                                          {"--warmup", &o->warmup}, {"--eval-every", &o->eval_every},
                                                          {"--eval-seqs", &o->eval_seqs}, {"--recompute", &o->recompute}};
    const struct { const char* name; float* at; } floats[] = {
        {"--lr", &o->lr}, {"--lr-min", &o->lr_min}, {"--wd", &o->wd}, {"--clip", &o->clip}};
    const struct { const char* name; const char** at; } strs[] = {
        {"--text", &o->text}, {"--save", &o->save}, {"--resume", &o->resume}};
    const char* a = argv[*i];
    const char* n = *i + 1 < argc ? argv[*i + 1] : NULL;
    const int n_ints = (int)(sizeof ints / sizeof ints[0]), n_floats = (int)(sizeof floats / sizeof floats[0]);
    const int n_strs = (int)(sizeof strs / sizeof strs[0]);
    int k, f, t, known = 1;
    if (!strcmp(a, "--generated")) {
        o->generated = 1;
        return 1;
    }
    if (!n) return 0;
    for (k = 0; k < n_ints; k++)
        if (!strcmp(a, ints[k].name)) break;
    for (f = 0; f < n_floats; f++)
        if (!strcmp(a, floats[f].name)) break;
    for (t = 0; t < n_strs; t++)
        if (!strcmp(a, strs[t].name)) break;
    if (k < n_ints) *ints[k].at = atoi(n);
    else if (f < n_floats) *floats[f].at = (float)atof(n);
    else if (t < n_strs) *strs[t].at = n;
    else if (!strcmp(a, "--schedule")) known = pp_schedule_kind_parse(n, &o->kind) == PP_OK ? 1 : -1;
    else if (!strcmp(a, "--dtype")) {
        known = strcmp(n, "f32") && strcmp(n, "bf16") ? -1 : 1;
        o->bf16 = !strcmp(n, "bf16");
        if (known < 0) fprintf(stderr, "unknown --dtype '%s' (f32 or bf16)\n", n);
    } else known = 0;
    *i += known > 0;
    return known;
}

/* v from the schedule, --lr-min's default; 0 when the shared options are in range, else 1. */
static int gptc_opts_check(gptc_opts* o) {
    o->v = pp_schedule_kind_v(o->kind, o->v);
    if (o->lr_min < 0) o->lr_min = o->lr;
    if (gpt_loop_check(o->lr_min, o->warmup, o->wd, o->clip, o->eval_every, o->eval_seqs)) return 1;
    return o->recompute < 0 || o->v < 1 || o->m < 1 || o->m > 1024 || o->steps < 1 || o->dim < 8 || o->heads < 1 || o->dim % o->heads ||
           o->dim / o->heads > GPTC_MAX_HS || o->seqs < o->m || o->max_len < 12;
}

/* The model's sizes from the options (the vocabulary is gpt_data.h's bytes). */
static gptc_config gptc_opts_config(const gptc_opts* o) {
    gptc_config c;
    c.V = GPT_DATA_VOCAB;
    c.maxT = o->max_len;
    c.C = o->dim;
    c.H = o->heads;
    c.nb = o->layers;
    c.bf16 = o->bf16;
    c.tp = 0;
    return c;
}

/* The text: --text FILE, else README.md, else the generated task (--generated: that one). NULL,
   or what failed. */
static const char* gptc_opts_corpus(const gptc_opts* o, gpt_corpus* corp) {
    if (!o->generated && gpt_corpus_load(corp, o->text ? o->text : "README.md", o->max_len, 42) == 0) return NULL;
    if (o->text) return "cannot read the --text file";
    return gpt_corpus_generate(corp, 4000, o->max_len, 42) ? "cannot generate a corpus" : NULL;
}

/* A layer's parameters (or gradients: the same layout in another buffer). */
typedef struct gptc_embed_p {
    float *wte, *wpe;   /* (V, C) token and (maxT, C) position embeddings */
} gptc_embed_p;
typedef struct gptc_block_p {
    float *ln1_g, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_g, *ln2_b, *fc_w, *fc_b, *fcp_w, *fcp_b;
} gptc_block_p;
typedef struct gptc_head_p {
    float *lnf_g, *lnf_b;
    float* wte;         /* TIED: weights, the embedding's wte; gradients, the head's own share of it */
} gptc_head_p;

/* The step's per-row tables on one device, and where the last stage writes its losses. */
typedef struct gptc_tables {
    const int32_t* pos;     /* (rows of the step) position inside the sequence */
    const int32_t* sstart;  /* (rows) first row of the row's sequence */
    const int32_t* send;    /* (rows) one past its last row */
    float* mb_loss;         /* (m) each micro-batch's loss, on the GPU (io->loss would sync) */
} gptc_tables;

/* The model's context (pp_model.ctx): what every layer reads besides its parameters. */
/* cuBLAS handles, one per stream (a handle is bound to one stream and used by one thread at a
   time; each rank's layers run on the rank's thread and stream), made on first use. */
#define GPTC_MAX_HANDLES 64
typedef struct gptc_blas {
    pthread_mutex_t mu;
    int n;
    cudaStream_t st[GPTC_MAX_HANDLES];
    cublasHandle_t h[GPTC_MAX_HANDLES];
} gptc_blas;

typedef struct gptc_run {
    gptc_config cfg;
    int cpu;                        /* run every op as a host loop on host memory */
    /* cfg.tp > 1: buf (n floats, the layer's memory) summed over the layer's TP group in the
       order of st; 0 or an error code. NULL: pp_tp_allreduce over io->tp (host memory: --cpu) */
    int (*tp_sum)(const pp_layer_io* io, float* buf, size_t n, cudaStream_t st);
    gptc_tables tab[GPTC_MAX_DEV];  /* by the layer's device (pp_cuda_layer_ctx.device; 0 on the host) */
    gptc_blas* blas;                /* matrix products through cuBLAS (gptc_blas_create); NULL: the naive kernels */
} gptc_run;

static gptc_blas* gptc_blas_create(void) {
    gptc_blas* b = (gptc_blas*)calloc(1, sizeof *b);
    if (b) pthread_mutex_init(&b->mu, NULL);
    return b;
}
static void gptc_blas_destroy(gptc_blas* b) {
    if (!b) return;
    for (int i = 0; i < b->n; i++) cublasDestroy(b->h[i]);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
/* the handle for stream st, made on the calling thread's current device; NULL if none can be */
static cublasHandle_t gptc_blas_handle(gptc_blas* b, cudaStream_t st) {
    cublasHandle_t h = NULL;
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < b->n; i++)
        if (b->st[i] == st) h = b->h[i];
    if (!h && b->n < GPTC_MAX_HANDLES && cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
        /* full fp32 (no TF32), and no atomics: the same bits at every run */
        if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS || cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
            cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED) != CUBLAS_STATUS_SUCCESS) {
            cublasDestroy(h);
            h = NULL;
        } else {
            b->st[b->n] = st;
            b->h[b->n++] = h;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return h;
}

/* What one layer call works with: the run, its stream and its device's tables. */
typedef struct gptc_env {
    const gptc_run* run;
    const gptc_config* c;
    cudaStream_t st;
    const gptc_tables* tab;
    int cpu;
    cublasHandle_t blas;            /* NULL: the naive kernels (or host loops) */
} gptc_env;

static int gptc_env_of(const pp_layer_io* io, gptc_env* e) {
    const pp_cuda_layer_ctx* lc = (const pp_cuda_layer_ctx*)io->ctx;
    int dev = lc ? lc->device : 0;
    e->run = io->model ? (const gptc_run*)io->model->ctx : NULL;
    if (!e->run || dev < 0 || dev >= GPTC_MAX_DEV) return 1;
    e->c = &e->run->cfg;
    e->st = lc ? lc->stream : (cudaStream_t)0;
    e->tab = &e->run->tab[dev];
    e->cpu = e->run->cpu;
    e->blas = NULL;
    if (!e->cpu && e->run->blas && !(e->blas = gptc_blas_handle(e->run->blas, e->st))) return 1;
    return 0;
}

/* The layer's TP rank (0 without a group) and the sum over its TP group (TENSOR PARALLELISM). */
static int gptc_tp_rank(const pp_layer_io* io) { return io->tp && io->tp->t ? pp_group_rank(io->tp) : 0; }
static int gptc_tp_sum(const gptc_env* e, const pp_layer_io* io, float* buf, size_t n) {
    pp_error err;
    if (gptc_tpn(e->c) <= 1) return 0;
    if (e->run->tp_sum) return e->run->tp_sum(io, buf, n, e->st);
    if (!e->cpu || !io->tp || !io->tp->t || pp_group_size(io->tp) != gptc_tpn(e->c)) return 10;
    return pp_tp_allreduce(io->tp, buf, n, PP_F32, &err) == PP_OK ? 0 : 10;
}

/* return the error of a launch */
#define GPTC_TRY(x)             \
    do {                        \
        int e_ = (x);           \
        if (e_) return e_;      \
    } while (0)

/* ---- matrix products: cuBLAS when e->blas, else the naive kernels (or host loops) ----------
   Row-major A (r, c) is column-major (c, r) with leading dimension c: each product below is
   the column-major form of the row-major one in its comment. */
static const float gptc_one = 1.0f, gptc_fzero = 0.0f;
#define GPTC_BLAS(call) ((call) == CUBLAS_STATUS_SUCCESS ? 0 : 8)

/* y (T, out) = x (T, in) W (in, out) + b (b NULL: no bias) */
static int gptc_mm_fwd(const gptc_env* e, const float* x, const float* W, const float* b, float* y, int T, int in, int out) {
    if (!e->blas) return gptc_op<gptc_mm_fwd_op>(e->cpu, e->st, T * out, x, W, b, y, in, out);
    if (T <= 0) return 0;
    if (b) GPTC_TRY(gptc_op<gptc_bias_fill_op>(0, e->st, T * out, b, y, out));
    return GPTC_BLAS(cublasSgemm(e->blas, CUBLAS_OP_N, CUBLAS_OP_N, out, T, in, &gptc_one, W, out, x, in, b ? &gptc_one : &gptc_fzero,
                                 y, out));
}
/* dx (T, in) = dy (T, out) W^T */
static int gptc_mm_bwd_x(const gptc_env* e, const float* dy, const float* W, float* dx, int T, int in, int out) {
    if (!e->blas) return gptc_op<gptc_mm_bwd_x_op>(e->cpu, e->st, T * in, dy, W, dx, in, out);
    if (T <= 0) return 0;
    return GPTC_BLAS(cublasSgemm(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, in, T, out, &gptc_one, W, out, dy, out, &gptc_fzero, dx, in));
}
/* gW (in, out) += x^T dy, gb (out) += column sums of dy (gb NULL: gW alone) */
static int gptc_mm_bwd_w(const gptc_env* e, const float* x, const float* dy, float* gW, float* gb, int T, int in, int out) {
    if (!e->blas) return gptc_op<gptc_mm_bwd_w_op>(e->cpu, e->st, in * out + (gb ? out : 0), x, dy, gW, gb, T, in, out);
    if (T <= 0) return 0;
    GPTC_TRY(GPTC_BLAS(cublasSgemm(e->blas, CUBLAS_OP_N, CUBLAS_OP_T, out, in, T, &gptc_one, dy, out, x, in, &gptc_one, gW, out)));
    return gb ? gptc_op<gptc_colsum_op>(0, e->st, out, dy, gb, T, out) : 0;
}
/* The tied head's products are these three with wte (V, C) as the matrix: logits (T, V) = xn
   wte^T is gptc_mm_bwd_x with in = V, out = C; dxn (T, C) = dl wte is gptc_mm_fwd without bias;
   g (V, C) += dl^T xn is gptc_mm_bwd_w without gb. */

static size_t gptc_block_numel(const gptc_config* g) {
    size_t C = (size_t)g->C, L = C / (size_t)gptc_tpn(g); /* L: this TP rank's share of C */
    return 4 * C + 3 * C * L + 3 * L + L * C + C + 4 * C * L + 4 * L + 4 * L * C + C;
}
/* parameters of nb blocks; the gradients hold V * C more (the head's share of wte) */
static size_t gptc_numel(const gptc_config* g) {
    size_t C = (size_t)g->C;
    return (size_t)g->V * C + (size_t)g->maxT * C + (size_t)g->nb * gptc_block_numel(g) + 2 * C;
}

/* ---- layers ---------------------------------------------------------------------------------- */
/* scratch kept from forward to backward (io->saved), as float offsets for T rows */
typedef struct gptc_bsave {
    float *ln1, *mu1, *rs1, *qkv, *att, *lse, *xmid, *ln2, *mu2, *rs2, *fcpre, *fcact, *dxmid, *dln, *dfc, *datt, *dqkv, *D;
    float *xin, *dyf;   /* bf16 only (else 0 floats): the input widened in forward, the output gradient in backward */
} gptc_bsave;
static size_t gptc_bsave_carve(gptc_bsave* s, float* p, size_t T, size_t C, size_t H, int bf16) {
    float* b = p;
#define GPTC_CUT(f, n) (s->f = p, p += (n))
    GPTC_CUT(ln1, T * C);
    GPTC_CUT(mu1, T);
    GPTC_CUT(rs1, T);
    GPTC_CUT(qkv, 3 * T * C);
    GPTC_CUT(att, T * C);
    GPTC_CUT(lse, T * H);
    GPTC_CUT(xmid, T * C);
    GPTC_CUT(ln2, T * C);
    GPTC_CUT(mu2, T);
    GPTC_CUT(rs2, T);
    GPTC_CUT(fcpre, 4 * T * C);
    GPTC_CUT(fcact, 4 * T * C);
    GPTC_CUT(dxmid, T * C);
    GPTC_CUT(dln, T * C);
    GPTC_CUT(dfc, 4 * T * C);
    GPTC_CUT(datt, T * C);
    GPTC_CUT(dqkv, 3 * T * C);
    GPTC_CUT(D, T * H);
    GPTC_CUT(xin, bf16 ? T * C : 0);
    GPTC_CUT(dyf, bf16 ? T * C : 0);
    return (size_t)(p - b) * sizeof(float);
}
typedef struct gptc_hsave {
    float *xn, *mu, *rs, *logits, *lse, *rowloss, *dl, *dxn;
    float *xin, *dxf;   /* bf16 only (else 0 floats): the input widened in forward, the input gradient before rounding */
} gptc_hsave;
static size_t gptc_hsave_carve(gptc_hsave* s, float* p, size_t T, size_t C, size_t V, int bf16) {
    float* b = p;
    GPTC_CUT(xn, T * C);
    GPTC_CUT(mu, T);
    GPTC_CUT(rs, T);
    GPTC_CUT(logits, T * V);
    GPTC_CUT(lse, T);
    GPTC_CUT(rowloss, T);
    GPTC_CUT(dl, T * V);
    GPTC_CUT(dxn, T * C);
    GPTC_CUT(xin, bf16 ? T * C : 0);
    GPTC_CUT(dxf, bf16 ? T * C : 0);
#undef GPTC_CUT
    return (size_t)(p - b) * sizeof(float);
}

/* A tensor between layers as f32 for the layer's arithmetic: its own data, or with bf16 its
   values widened into stage (T*C floats of io->saved). */
static int gptc_act_in(const gptc_env* e, const pp_tensor* t, float* stage, const float** f) {
    if (!e->c->bf16) {
        *f = (const float*)t->data;
        return 0;
    }
    *f = stage;
    return gptc_op<gptc_widen_op>(e->cpu, e->st, (int)(t->rows * t->cols), (const uint16_t*)t->data, stage);
}
/* Where the layer writes a tensor between layers: its data, or with bf16 stage (then
   gptc_act_out rounds stage into it). */
static float* gptc_act_dst(const gptc_env* e, const pp_tensor* t, float* stage) {
    return e->c->bf16 ? stage : (float*)t->data;
}
static int gptc_act_out(const gptc_env* e, const float* stage, const pp_tensor* t) {
    if (!e->c->bf16) return 0;
    return gptc_op<gptc_narrow_op>(e->cpu, e->st, (int)(t->rows * t->cols), stage, (uint16_t*)t->data);
}
/* the embedding's io->saved: with bf16, T*C floats of staging for its output (forward) and the
   output's gradient (backward); else nothing */
static size_t gptc_esave_bytes(const gptc_config* c, size_t T) { return c->bf16 ? sizeof(float) * T * (size_t)c->C : 0; }

static int gptc_embed_fwd(const gptc_embed_p* w, pp_layer_io* io) {
    gptc_env e;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows, C = e.c->C;
    float* x = gptc_act_dst(&e, &io->out[0], (float*)io->saved);
    if (gptc_esave_bytes(e.c, (size_t)T) > io->saved_bytes) return 2;
    GPTC_TRY(gptc_op<gptc_embed_fwd_op>(e.cpu, e.st, T * C, (const int32_t*)io->in[0].data, e.tab->pos, (int)io->mb->row0,
                                        (const float*)w->wte, (const float*)w->wpe, x, C));
    return gptc_act_out(&e, x, &io->out[0]);
}
static int gptc_embed_bwd(const gptc_embed_p* w, gptc_embed_p* g, pp_layer_io* io) {
    gptc_env e;
    const float* dx;
    (void)w;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows;
    if (gptc_esave_bytes(e.c, (size_t)T) > io->saved_bytes) return 2;
    GPTC_TRY(gptc_act_in(&e, &io->d_out[0], (float*)io->saved, &dx));
    return gptc_op<gptc_embed_bwd_op>(e.cpu, e.st, e.c->C, (const int32_t*)io->in[0].data, e.tab->pos, (int)io->mb->row0, dx,
                                      g->wte, g->wpe, T, e.c->C);
}

static int gptc_block_fwd(const gptc_block_p* b, pp_layer_io* io) {
    gptc_env e;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows, C = e.c->C, H = e.c->H, row0 = (int)io->mb->row0, cpu = e.cpu;
    int L = C / gptc_tpn(e.c), HL = H / gptc_tpn(e.c), r0 = gptc_tp_rank(io) == 0; /* this TP rank's share */
    cudaStream_t st = e.st;
    const float* x;
    float* y;
    gptc_bsave s;
    if (gptc_bsave_carve(&s, (float*)io->saved, T, C, H, e.c->bf16) > io->saved_bytes) return 2;
    GPTC_TRY(gptc_act_in(&e, &io->in[0], s.xin, &x));
    y = gptc_act_dst(&e, &io->out[0], s.dxmid); /* dxmid is free again once xmid is made */
    GPTC_TRY(gptc_op<gptc_ln_fwd_op>(cpu, st, T, x, (const float*)b->ln1_g, (const float*)b->ln1_b, s.ln1, s.mu1, s.rs1, C));
    GPTC_TRY(gptc_mm_fwd(&e, (const float*)s.ln1, (const float*)b->qkv_w, (const float*)b->qkv_b, s.qkv, T, C, 3 * L));
    GPTC_TRY(gptc_op<gptc_attn_fwd_op>(cpu, st, T * HL, (const float*)s.qkv, e.tab->sstart, row0, s.att, s.lse, L, HL));
    GPTC_TRY(gptc_mm_fwd(&e, (const float*)s.att, (const float*)b->proj_w, r0 ? (const float*)b->proj_b : NULL, s.dxmid, T, L, C));
#ifndef PP_TEST_GPTC_TP_NO_ROW_REDUCE /* negative control (build/gptc-tp-ctl-norow): the heads' sums never meet */
    GPTC_TRY(gptc_tp_sum(&e, io, s.dxmid, (size_t)T * C)); /* row parallel: the heads' partial sums */
#endif
    GPTC_TRY(gptc_op<gptc_add_op>(cpu, st, T * C, x, (const float*)s.dxmid, s.xmid)); /* dxmid is free until backward */
    GPTC_TRY(gptc_op<gptc_ln_fwd_op>(cpu, st, T, (const float*)s.xmid, (const float*)b->ln2_g, (const float*)b->ln2_b, s.ln2, s.mu2,
                                     s.rs2, C));
    GPTC_TRY(gptc_mm_fwd(&e, (const float*)s.ln2, (const float*)b->fc_w, (const float*)b->fc_b, s.fcpre, T, C, 4 * L));
    GPTC_TRY(gptc_op<gptc_gelu_fwd_op>(cpu, st, T * 4 * L, (const float*)s.fcpre, s.fcact));
    GPTC_TRY(gptc_mm_fwd(&e, (const float*)s.fcact, (const float*)b->fcp_w, r0 ? (const float*)b->fcp_b : NULL, s.dln, T, 4 * L, C));
    GPTC_TRY(gptc_tp_sum(&e, io, s.dln, (size_t)T * C)); /* row parallel: the units' partial sums */
    GPTC_TRY(gptc_op<gptc_add_op>(cpu, st, T * C, (const float*)s.xmid, (const float*)s.dln, y));
    return gptc_act_out(&e, y, &io->out[0]);
}

static int gptc_block_bwd(const gptc_block_p* b, gptc_block_p* gb, pp_layer_io* io) {
    gptc_env e;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows, C = e.c->C, H = e.c->H, row0 = (int)io->mb->row0, cpu = e.cpu;
    int L = C / gptc_tpn(e.c), HL = H / gptc_tpn(e.c);
    cudaStream_t st = e.st;
    const float *x, *dy;
    float* dx;
    gptc_bsave s;
    if (gptc_bsave_carve(&s, (float*)io->saved, T, C, H, e.c->bf16) > io->saved_bytes) return 2;
    x = e.c->bf16 ? (const float*)s.xin : (const float*)io->in[0].data; /* widened in forward */
    GPTC_TRY(gptc_act_in(&e, &io->d_out[0], s.dyf, &dy));
    dx = io->d_in[0].data ? gptc_act_dst(&e, &io->d_in[0], s.datt) : NULL; /* datt is free by then */
    /* MLP: y = xmid + fcp(gelu(fc(ln2(xmid)))) */
    GPTC_TRY(gptc_mm_bwd_w(&e, (const float*)s.fcact, dy, gb->fcp_w, gb->fcp_b, T, 4 * L, C));
    GPTC_TRY(gptc_mm_bwd_x(&e, dy, (const float*)b->fcp_w, s.dfc, T, 4 * L, C));
    GPTC_TRY(gptc_op<gptc_gelu_bwd_op>(cpu, st, T * 4 * L, (const float*)s.fcpre, s.dfc));
    GPTC_TRY(gptc_mm_bwd_w(&e, (const float*)s.ln2, (const float*)s.dfc, gb->fc_w, gb->fc_b, T, C, 4 * L));
    GPTC_TRY(gptc_mm_bwd_x(&e, (const float*)s.dfc, (const float*)b->fc_w, s.dln, T, C, 4 * L));
    GPTC_TRY(gptc_tp_sum(&e, io, s.dln, (size_t)T * C)); /* column parallel: the units' shares of the input gradient */
    GPTC_TRY(gptc_op<gptc_ln_bwd_p_op>(cpu, st, C, (const float*)s.dln, (const float*)s.xmid, (const float*)s.mu2, (const float*)s.rs2,
                                       gb->ln2_g, gb->ln2_b, T, C));
    GPTC_TRY(gptc_op<gptc_ln_bwd_x_op>(cpu, st, T, (const float*)s.dln, (const float*)s.xmid, (const float*)s.mu2, (const float*)s.rs2,
                                       (const float*)b->ln2_g, dy, s.dxmid, C));
    /* attention: xmid = x + proj(attn(qkv(ln1(x)))) */
    GPTC_TRY(gptc_mm_bwd_w(&e, (const float*)s.att, (const float*)s.dxmid, gb->proj_w, gb->proj_b, T, L, C));
    GPTC_TRY(gptc_mm_bwd_x(&e, (const float*)s.dxmid, (const float*)b->proj_w, s.datt, T, L, C));
    GPTC_TRY(gptc_op<gptc_attn_d_op>(cpu, st, T * HL, (const float*)s.datt, (const float*)s.att, s.D, L, HL));
    GPTC_TRY(gptc_op<gptc_attn_dq_op>(cpu, st, T * HL, (const float*)s.qkv, (const float*)s.datt, (const float*)s.lse,
                                      (const float*)s.D, e.tab->sstart, row0, s.dqkv, L, HL));
    GPTC_TRY(gptc_op<gptc_attn_dkv_op>(cpu, st, T * HL, (const float*)s.qkv, (const float*)s.datt, (const float*)s.lse,
                                       (const float*)s.D, e.tab->send, row0, s.dqkv, L, HL));
    GPTC_TRY(gptc_mm_bwd_w(&e, (const float*)s.ln1, (const float*)s.dqkv, gb->qkv_w, gb->qkv_b, T, C, 3 * L));
    GPTC_TRY(gptc_mm_bwd_x(&e, (const float*)s.dqkv, (const float*)b->qkv_w, s.dln, T, C, 3 * L));
    GPTC_TRY(gptc_tp_sum(&e, io, s.dln, (size_t)T * C)); /* column parallel: the heads' shares of the input gradient */
    GPTC_TRY(gptc_op<gptc_ln_bwd_p_op>(cpu, st, C, (const float*)s.dln, x, (const float*)s.mu1, (const float*)s.rs1, gb->ln1_g,
                                       gb->ln1_b, T, C));
    if (!dx) return 0;
    GPTC_TRY(gptc_op<gptc_ln_bwd_x_op>(cpu, st, T, (const float*)s.dln, x, (const float*)s.mu1, (const float*)s.rs1,
                                       (const float*)b->ln1_g, (const float*)s.dxmid, dx, C));
    return gptc_act_out(&e, dx, &io->d_in[0]);
}

static int gptc_head_fwd(const gptc_head_p* w, pp_layer_io* io) {
    gptc_env e;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows, C = e.c->C, V = e.c->V, cpu = e.cpu;
    cudaStream_t st = e.st;
    const int32_t* tgt = (const int32_t*)io->mb->targets;
    const float* x;
    gptc_hsave s;
    if (gptc_hsave_carve(&s, (float*)io->saved, T, C, V, e.c->bf16) > io->saved_bytes || !e.tab->mb_loss) return 2;
    GPTC_TRY(gptc_act_in(&e, &io->in[0], s.xin, &x));
    GPTC_TRY(gptc_op<gptc_ln_fwd_op>(cpu, st, T, x, (const float*)w->lnf_g, (const float*)w->lnf_b, s.xn,
                                     s.mu, s.rs, C));
    GPTC_TRY(gptc_mm_bwd_x(&e, (const float*)s.xn, (const float*)w->wte, s.logits, T, V, C));
    GPTC_TRY(gptc_op<gptc_xent_fwd_op>(cpu, st, T, (const float*)s.logits, tgt, s.lse, s.rowloss, V));
    io->loss = 0; /* on the GPU: the tables' mb_loss (TP rank 0's: every TP rank has the same) */
    if (gptc_tp_rank(io) != 0) return 0;
    return gptc_op<gptc_loss_sum_op>(cpu, st, 1, (const float*)s.rowloss, tgt, T, &e.tab->mb_loss[io->mb->index]);
}

static int gptc_head_bwd(const gptc_head_p* w, gptc_head_p* g, pp_layer_io* io) {
    gptc_env e;
    if (gptc_env_of(io, &e)) return 1;
    int T = (int)io->mb->rows, C = e.c->C, V = e.c->V, cpu = e.cpu;
    int n_tgt = (int)io->mb->rows - (io->mb->cu_seqlens ? io->mb->n_seqs : 1);
    cudaStream_t st = e.st;
    const int32_t* tgt = (const int32_t*)io->mb->targets;
    const float* x;
    float* dx;
    gptc_hsave s;
    if (gptc_hsave_carve(&s, (float*)io->saved, T, C, V, e.c->bf16) > io->saved_bytes) return 2;
    x = e.c->bf16 ? (const float*)s.xin : (const float*)io->in[0].data; /* widened in forward */
    dx = io->d_in[0].data ? gptc_act_dst(&e, &io->d_in[0], s.dxf) : NULL;
    if (n_tgt < 1) n_tgt = 1;
    GPTC_TRY(gptc_op<gptc_xent_bwd_op>(cpu, st, T * V, (const float*)s.logits, (const float*)s.lse, tgt, s.dl, V,
                                       io->mb->loss_scale / (float)n_tgt));
    GPTC_TRY(gptc_mm_bwd_w(&e, (const float*)s.dl, (const float*)s.xn, g->wte, NULL, T, V, C));
    GPTC_TRY(gptc_mm_fwd(&e, (const float*)s.dl, (const float*)w->wte, (const float*)NULL, s.dxn, T, V, C));
    GPTC_TRY(gptc_op<gptc_ln_bwd_p_op>(cpu, st, C, (const float*)s.dxn, x, (const float*)s.mu, (const float*)s.rs, g->lnf_g,
                                       g->lnf_b, T, C));
    if (!dx) return 0;
    GPTC_TRY(gptc_op<gptc_ln_bwd_x_op>(cpu, st, T, (const float*)s.dxn, x, (const float*)s.mu, (const float*)s.rs,
                                       (const float*)w->lnf_g, (const float*)NULL, dx, C));
    return gptc_act_out(&e, dx, &io->d_in[0]);
}

/* Shapes, scratch and cost from the run's config: describe reaches the context through d->model.
   Without it the layer says it has no output, which the library refuses. */
static const gptc_config* gptc_desc_config(const pp_layer_desc* d) {
    const gptc_run* run = d->model ? (const gptc_run*)d->model->ctx : NULL;
    return run ? &run->cfg : NULL;
}
static void gptc_desc_act(const pp_microbatch* mb, const gptc_config* c, pp_layer_desc* d) {
    d->n_out = 1;
    d->out[0].rows = mb->rows;
    d->out[0].cols = c->C;
    d->out[0].dtype = c->bf16 ? PP_BF16 : PP_F32;
}
static void gptc_embed_desc(const gptc_embed_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    const gptc_config* c = gptc_desc_config(d);
    (void)w;
    (void)in;
    (void)n_in;
    if (!c) return;
    gptc_desc_act(mb, c, d);
    d->saved_bytes = gptc_esave_bytes(c, (size_t)mb->rows);
    d->cost = (double)mb->rows * c->C;
}
static void gptc_block_desc(const gptc_block_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    const gptc_config* c = gptc_desc_config(d);
    size_t T = (size_t)mb->rows, C;
    double attn = 0;
    gptc_bsave s;
    (void)w;
    (void)in;
    (void)n_in;
    if (!c) return;
    C = (size_t)c->C;
    for (int q = 0; mb->cu_seqlens && q < mb->n_seqs; q++) {
        double L = mb->cu_seqlens[q + 1] - mb->cu_seqlens[q];
        attn += L * L;
    }
    gptc_desc_act(mb, c, d);
    d->saved_bytes = gptc_bsave_carve(&s, NULL, T, C, (size_t)c->H, c->bf16);
    d->cost = 24.0 * T * C * C + 4.0 * attn * C;
}
static void gptc_head_desc(const gptc_head_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    const gptc_config* c = gptc_desc_config(d);
    gptc_hsave s;
    (void)w;
    (void)in;
    (void)n_in;
    if (!c) {
        d->n_out = 1; /* the loss layer has none: refused */
        return;
    }
    d->saved_bytes = gptc_hsave_carve(&s, NULL, (size_t)mb->rows, (size_t)c->C, (size_t)c->V, c->bf16);
    d->cost = 6.0 * (double)mb->rows * c->C * c->V;
}

/* X(layer, params, forward, backward, describe, count): embed, up to GPTC_MAX_BLOCK blocks, head */
#define GPTC_LAYERS(X)                                                                          \
    X(embed, gptc_embed_p, gptc_embed_fwd, gptc_embed_bwd, gptc_embed_desc, 1)                  \
    X(block, gptc_block_p, gptc_block_fwd, gptc_block_bwd, gptc_block_desc, GPTC_MAX_BLOCK)     \
    X(head, gptc_head_p, gptc_head_fwd, gptc_head_bwd, gptc_head_desc, 1)
PP_MODEL(gptc, GPTC_LAYERS)

static int gptc_params(const pp_model* m, const void* w, int l, pp_param* out, int cap);

/* The pp_model of run->cfg.nb blocks, with run as its context (and gptc_params: checkpoints). */
static pp_model gptc_model_desc_depth(gptc_run* run) {
    gptc_counts n;
    memset(&n, 0, sizeof n);
    n.block = run->cfg.nb >= 1 ? run->cfg.nb : -1; /* 0 would mean the list's count */
    pp_model m = gptc_model_desc_counts(n);
    m.ctx = run;
    m.params = gptc_params; /* checkpoints */
    return m;
}

/* Points m's parameters into base, layer after layer (gradients: the head's wte share after
   them, gptc_numel + V * C floats in all; weights: the head reads the embedding's wte). */
static void gptc_bind(gptc_model* m, const gptc_config* g, float* base, int grads) {
    size_t C = (size_t)g->C, L = C / (size_t)gptc_tpn(g);
    float* p = base;
    memset(m, 0, sizeof *m);
#define GPTC_TAKE(f, n) (m->f = p, p += (n))
    GPTC_TAKE(embed[0].wte, (size_t)g->V * C);
    GPTC_TAKE(embed[0].wpe, (size_t)g->maxT * C);
    for (int l = 0; l < g->nb && l < GPTC_MAX_BLOCK; l++) {
        GPTC_TAKE(block[l].ln1_g, C);
        GPTC_TAKE(block[l].ln1_b, C);
        GPTC_TAKE(block[l].qkv_w, C * 3 * L);
        GPTC_TAKE(block[l].qkv_b, 3 * L);
        GPTC_TAKE(block[l].proj_w, L * C);
        GPTC_TAKE(block[l].proj_b, C);
        GPTC_TAKE(block[l].ln2_g, C);
        GPTC_TAKE(block[l].ln2_b, C);
        GPTC_TAKE(block[l].fc_w, C * 4 * L);
        GPTC_TAKE(block[l].fc_b, 4 * L);
        GPTC_TAKE(block[l].fcp_w, 4 * L * C);
        GPTC_TAKE(block[l].fcp_b, C);
    }
    GPTC_TAKE(head[0].lnf_g, C);
    GPTC_TAKE(head[0].lnf_b, C);
#undef GPTC_TAKE
    m->head[0].wte = grads ? p : m->embed[0].wte;
}

/* Layer l's parameter buffers (0: the embedding, 1 .. nb: the blocks, nb + 1: the head, whose wte
   is the embedding's: not its own) in gptc_bind's order: pointers into w, element counts, and
   whether --wd decays them (the matrices, not the biases and LayerNorm gains, as gpt_train.h's
   gpt_decay_mask). Returns the count (at most 12), -1 for no such layer. */
static int gptc_layer_buffers(const gptc_config* g, const gptc_model* w, int l, float** ptr, int64_t* count,
                              unsigned char* decay) {
    const int64_t C = g->C, L = C / gptc_tpn(g);
    if (l == 0) {
        float* const p[2] = {w->embed[0].wte, w->embed[0].wpe};
        const int64_t n[2] = {(int64_t)g->V * C, (int64_t)g->maxT * C};
        for (int k = 0; k < 2; k++) ptr[k] = p[k], count[k] = n[k], decay[k] = 1;
        return 2;
    }
    if (l >= 1 && l <= g->nb) {
        const gptc_block_p* b = &w->block[l - 1];
        float* const p[12] = {b->ln1_g, b->ln1_b, b->qkv_w, b->qkv_b, b->proj_w, b->proj_b,
                              b->ln2_g, b->ln2_b, b->fc_w,  b->fc_b,  b->fcp_w, b->fcp_b};
        const int64_t n[12] = {C, C, C * 3 * L, 3 * L, L * C, C, C, C, C * 4 * L, 4 * L, 4 * L * C, C};
        for (int k = 0; k < 12; k++) ptr[k] = p[k], count[k] = n[k], decay[k] = k == 2 || k == 4 || k == 8 || k == 10;
        return 12;
    }
    if (l == g->nb + 1) {
        ptr[0] = w->head[0].lnf_g, ptr[1] = w->head[0].lnf_b;
        count[0] = count[1] = C;
        decay[0] = decay[1] = 0;
        return 2;
    }
    return -1;
}

/* 1 where layer l's k-th buffer (gptc_layer_buffers' order) is a TP shard (cfg.tp > 1): qkv's
   and fc's weights and biases, proj's and fcp's weights; the rest every TP rank holds whole. */
static int gptc_buffer_sharded(const gptc_config* g, int l, int k) {
#ifdef PP_TEST_GPTC_TP_UNSHARDED /* negative control (build/gptc-tp-ctl-unsharded): every buffer counted as whole */
    (void)g, (void)l, (void)k;
    return 0;
#endif
    return gptc_tpn(g) > 1 && l >= 1 && l <= g->nb && (k == 2 || k == 3 || k == 4 || k == 8 || k == 9 || k == 10);
}

/* pp_model.params (checkpoints, pp_ckpt_*): each layer's buffers, sized from the run's config. */
static int gptc_params(const pp_model* m, const void* w, int l, pp_param* out, int cap) {
    float* ptr[12];
    int64_t count[12];
    unsigned char decay[12];
    int n = gptc_layer_buffers(&((const gptc_run*)m->ctx)->cfg, (const gptc_model*)w, l, ptr, count, decay);
    for (int k = 0; k < n && k < cap; k++) out[k] = pp_param_of(ptr[k], count[k], PP_F32);
    return n;
}

/* --clip: the pp_grad_bufs (pipeline.h >>grad) of a gradient buffer g laid out like the weights
   (gptc_numel floats: gptc_bind(.., 0); the tied wte's whole gradient in the embedding's slot),
   one per parameter buffer of each layer own[] flags (NULL: every layer), in memory dev reaches
   (NULL: the host). tied_layer >= 0 adds wte again as a tied copy of that layer (the head's
   rank's copy: scaled, not counted). With cfg.tp > 1 the shards are tp_sharded (the norm adds
   every TP rank's: pp_grad_norm_tp). out: room for 12 * nb + 5; returns the count. */
static int gptc_grad_bufs(const gptc_config* g, float* grad, const unsigned char* own, int tied_layer,
                          const pp_device_ops* dev, pp_grad_buf* out) {
    gptc_model gm;
    float* ptr[13]; /* a layer's 12 at most, and the tied copy */
    int64_t count[13];
    unsigned char decay[13];
    int n = 0;
    gptc_bind(&gm, g, grad, 0);
    for (int l = 0; l < g->nb + 2; l++) {
        int k = own && !own[l] ? 0 : gptc_layer_buffers(g, &gm, l, ptr, count, decay);
        if (l == tied_layer) { /* after the layer's own buffers */
            ptr[k] = gm.embed[0].wte;
            count[k++] = (int64_t)g->V * g->C;
        }
        for (int j = 0; j < k; j++, n++) {
            memset(&out[n], 0, sizeof out[n]);
            out[n].layer = l;
            out[n].data = ptr[j];
            out[n].count = (size_t)count[j];
            out[n].dtype = PP_F32;
            out[n].tied_copy = l == tied_layer && j == k - 1;
            out[n].tp_sharded = !out[n].tied_copy && gptc_buffer_sharded(g, l, j);
            out[n].device = dev;
        }
    }
    return n;
}

/* --wd: 1 for every parameter (gptc_numel of them, host memory) that the weight decay reaches;
   0 on success, 1 out of memory. */
static int gptc_decay_mask(const gptc_config* g, unsigned char* mask) {
    gptc_model w;
    float* ptr[12];
    int64_t count[12];
    unsigned char decay[12];
    float* base = (float*)malloc(sizeof(float) * gptc_numel(g)); /* for the offsets only */
    if (!base) return 1;
    gptc_bind(&w, g, base, 0);
    memset(mask, 0, gptc_numel(g));
    for (int l = 0; l < g->nb + 2; l++) {
        int n = gptc_layer_buffers(g, &w, l, ptr, count, decay);
        for (int k = 0; k < n; k++)
            if (decay[k]) memset(mask + (ptr[k] - base), 1, (size_t)count[k]);
    }
    free(base);
    return 0;
}

/* The weights every process and device starts from (h: gptc_numel floats on the host): uniform
   in +-0.035 from a fixed seed, LayerNorm gains 1 and biases 0. */
static void gptc_init_weights(const gptc_config* g, float* h) {
    gptc_model hw;
    uint64_t rng = 1234;
    size_t n = gptc_numel(g);
    gptc_bind(&hw, g, h, 0);
    for (size_t i = 0; i < n; i++) h[i] = (2.0f * gpt_rng_uniform(&rng) - 1.0f) * 0.035f;
    for (int l = 0; l < g->nb; l++)
        for (int k = 0; k < g->C; k++) {
            hw.block[l].ln1_g[k] = hw.block[l].ln2_g[k] = 1.0f;
            hw.block[l].ln1_b[k] = hw.block[l].ln2_b[k] = 0.0f;
        }
    for (int k = 0; k < g->C; k++) {
        hw.head[0].lnf_g[k] = 1.0f;
        hw.head[0].lnf_b[k] = 0.0f;
    }
}

/* TP rank r's share (g: cfg.tp > 1) of the whole model's buffer `whole` (the same model at tp 1)
   into `part` (gptc_numel(g) floats), or back (gptc_tp_unshard: the share's elements of whole,
   the whole-model parts too, from this rank's copy); host memory. grads: gradient buffers, the
   head's V * C share of wte after them in both (gptc_bind's layout). */
static void gptc_tp_move(const gptc_config* g, int r, float* whole, float* part, int grads, int to_whole) {
    gptc_config g1 = *g;
    gptc_model a, b;
    const size_t C = (size_t)g->C, L = C / (size_t)gptc_tpn(g), VC = (size_t)g->V * C, R = (size_t)r;
#define GPTC_MV(in_part, in_whole, n) (to_whole ? memcpy((in_whole), (in_part), sizeof(float) * (n)) \
                                                : memcpy((in_part), (in_whole), sizeof(float) * (n)))
    g1.tp = 0;
    gptc_bind(&a, &g1, whole, grads);
    gptc_bind(&b, g, part, grads);
    GPTC_MV(b.embed[0].wte, a.embed[0].wte, VC);
    GPTC_MV(b.embed[0].wpe, a.embed[0].wpe, (size_t)g->maxT * C);
    for (int l = 0; l < g->nb && l < GPTC_MAX_BLOCK; l++) {
        const gptc_block_p* x = &a.block[l];
        const gptc_block_p* y = &b.block[l];
        float* const in_part[6] = {y->ln1_g, y->ln1_b, y->ln2_g, y->ln2_b, y->proj_b, y->fcp_b};
        float* const in_whole[6] = {x->ln1_g, x->ln1_b, x->ln2_g, x->ln2_b, x->proj_b, x->fcp_b};
        for (int k = 0; k < 6; k++) GPTC_MV(in_part[k], in_whole[k], C);
        for (size_t k = 0; k < C; k++) /* qkv: its heads' q, k and v columns of each row */
            for (size_t q = 0; q < 3; q++) GPTC_MV(y->qkv_w + k * 3 * L + q * L, x->qkv_w + k * 3 * C + q * C + R * L, L);
        for (size_t q = 0; q < 3; q++) GPTC_MV(y->qkv_b + q * L, x->qkv_b + q * C + R * L, L);
        GPTC_MV(y->proj_w, x->proj_w + R * L * C, L * C); /* its heads' rows */
        for (size_t k = 0; k < C; k++) GPTC_MV(y->fc_w + k * 4 * L, x->fc_w + k * 4 * C + R * 4 * L, 4 * L);
        GPTC_MV(y->fc_b, x->fc_b + R * 4 * L, 4 * L);
        GPTC_MV(y->fcp_w, x->fcp_w + R * 4 * L * C, 4 * L * C); /* its units' rows */
    }
    GPTC_MV(b.head[0].lnf_g, a.head[0].lnf_g, C);
    GPTC_MV(b.head[0].lnf_b, a.head[0].lnf_b, C);
    if (grads) GPTC_MV(b.head[0].wte, a.head[0].wte, VC);
#undef GPTC_MV
}
static void gptc_tp_shard(const gptc_config* g, int r, const float* whole, float* part, int grads) {
    gptc_tp_move(g, r, (float*)whole, part, grads, 0);
}
static void gptc_tp_unshard(const gptc_config* g, int r, const float* part, float* whole, int grads) {
    gptc_tp_move(g, r, whole, (float*)part, grads, 1);
}

/* ---- memory: the GPU, or the host when cpu is set --------------------------------------------- */
static void* gptc_alloc(int cpu, size_t bytes) {
    void* p = NULL;
    if (cpu) return calloc(bytes ? bytes : 1, 1);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (cudaMemset(p, 0, bytes) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}
static void gptc_free(int cpu, void* p) {
    if (cpu) free(p);
    else if (p) cudaFree(p);
}
/* copies n bytes between host and device (either way) */
static int gptc_copy(int cpu, void* dst, const void* src, size_t n) {
    if (cpu) {
        memcpy(dst, src, n);
        return 0;
    }
    return cudaMemcpy(dst, src, n, cudaMemcpyDefault) != cudaSuccess;
}
static int gptc_zero(int cpu, void* p, size_t n) {
    if (cpu) {
        memset(p, 0, n);
        return 0;
    }
    return cudaMemset(p, 0, n) != cudaSuccess;
}

/* ---- checkpoints: --save FILE, --resume FILE (examples/gpt_loop.h) ----------------------------
   The weights w and Adam's moments (two gptc_models bound over their buffers like the weights:
   gptc_bind(.., 0)) of the layers in own (NULL: all), through gptc_params, in GPU memory (or
   the host's with *cpu set: pp_ckpt_desc.copy). One layout for gpt_cuda and gpt_nccl, whatever
   p, v, schedule or --dtype: a file saved by one loads in the other. */
static int gptc_ckpt_copy(void* cpu, void* dst, const void* src, size_t bytes) {
    return gptc_copy(*(const int*)cpu, dst, src, bytes);
}
static pp_ckpt_desc gptc_ckpt(const pp_model* m, const gptc_model* w, const void* const* moments,
                              const unsigned char* own, int steps_done, int* cpu) {
    pp_ckpt_desc k = gpt_ckpt_of(m, "gptc", w, moments, own, steps_done);
    k.copy = gptc_ckpt_copy;
    k.copy_user = cpu;
    return k;
}

#endif /* GPT_CUDA_H */
