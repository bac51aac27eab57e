/* examples/gpt.h - a tiny GPT (decoder-only transformer) as a pipeline.h layer list, trained on
   packed variable-length sequences: no padding; positions and attention restart at every sequence.
   Used by examples/gpt_cpu.c, examples/gpt_mpi.c and tests/test_gpt.c. Include after pipeline.h;
   everything is static.
   What to copy: layers over packed sequences (io->mb->cu_seqlens), a describe() that charges
   attention's quadratic cost, a depth chosen at run time (gpt_model_desc_depth), and a block
   whose backward is split into B and W for the zero-bubble schedules, with the scratch only B
   reads declared B-only so that it goes at B (gptz_model_desc_depth, gpt_blockz_*); bf16
   tensors between layers with the layers' arithmetic in f32 (gpt_set_act, gpt_wide_*).

   LAYERS  (T = tokens of the micro-batch = io->mb->rows, C = channels, V = vocabulary)
     embed   token ids int32 (T, 1) -> x (T, C):  wte[token] + wpe[position inside its sequence]
     block   x (T, C) -> x (T, C):  x + attn(ln1(x)), then + mlp(ln2(...)); attention is causal
             and never crosses a sequence boundary; mlp is C -> 4C -> GELU -> C
     head    x (T, C) -> loss:  ln_f, logits (T, V), mean cross-entropy over the tokens whose
             target (io->mb->targets, int32 per token) is >= 0; -1 means "no target" (the last
             token of each sequence). Backward scales by io->mb->loss_scale.
   io->mb->cu_seqlens holds the micro-batch's n_seqs+1 sequence offsets, rebased to 0; NULL means
   the whole micro-batch is one sequence.

   PARAMETERS
   One flat float buffer holds every parameter (gpt_init); a layer's parameters are contiguous in
   it (gpt_layer_params gives the span, for optimizers that update only the layers a rank owns).
   Gradients use the same layout in a second buffer (gpt_bind on zeroed memory). For checkpoints
   each layer names its buffers (gpt_params, set as pp_model.params by gpt_model_desc_depth and
   gptz_model_desc_depth): an optimizer's moments bound by gpt_bind are saved the same way.

   DEPTH
   The list holds up to GPT_MAX_BLOCK blocks; gpt_model_desc_depth(n) is the pp_model that uses
   the first n of them (gpt_model_desc_counts with n blocks: n + 2 layers, layer 0 is embed,
   1..n the blocks, n+1 the head). Only those n blocks need buffers.

   SPLIT BACKWARD  gptz (PP_MODEL_SPLIT) is the same model, layout and results with each block's
   backward in two: B the input gradient, W the parameter gradients from the output gradients B
   kept in io->saved; qkv, the attention probabilities and the pre-GELU activations are B-only
   scratch (b_saved_bytes). Embedding and head do both in B.

   ACTIVATIONS IN BF16  gpt_set_act(m, PP_BF16) on the weights' model (after gpt_bind or gpt_init,
   which set PP_F32) makes every tensor between layers, x (T, C),
   and its gradient bf16: describe() says so, so the pipeline sends half the bytes of f32 between
   stages. Weights, parameter gradients and what a layer saves from forward to backward stay f32.
   Inside a layer the arithmetic is f32: on entry each bf16 tensor is widened into an f32 copy,
   the f32 layer runs on the copies, and on exit its output (forward) or input gradient
   (backward: the library's zeroed buffer plus the layer's sum) is rounded to bf16, to nearest
   even (gpt_wide_begin, gpt_wide_end). That is what bf16 costs and saves on a CPU: the bytes
   between stages, not arithmetic. With PP_F32 the layers run on io itself, as before.

   TENSOR PARALLELISM  gpt_bind_tp / gpt_init_tp give a TP rank its shard of every block (heads
   and MLP units split Megatron's way, the row-parallel partial sums all-reduced over the TP
   group in io->tp or pp_model.ctx) and of the head (vocabulary-parallel); examples/gpt_mpi.c --tp N
   and gpt_cpu.c --tp N run it. The section of that name below.

   ERRORS  forward/backward return 0, or one of the GPT_E* codes below (the library reports it
   as PP_ERR_LAYER with the layer and micro-batch). */
#ifndef PP_EXAMPLE_GPT_H
#define PP_EXAMPLE_GPT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "splitmix.h"

#define GPT_MAX_BLOCK 32
#define GPT_LN_EPS 1e-5f

enum {
    GPT_ESHAPE = 1,     /* a tensor's shape or dtype is not what describe() promised */
    GPT_ESAVED = 2,     /* io->saved is smaller than describe()'s saved_bytes */
    GPT_ETOKEN = 3,     /* a token id outside 0 .. vocab-1 */
    GPT_ELONG = 4,      /* a sequence longer than max_T (no position embedding for it) */
    GPT_ENOMEM = 5,     /* backward workspace */
    GPT_ETARGET = 6,    /* a target outside -1 .. vocab-1 */
    GPT_ESEQS = 7,      /* cu_seqlens does not cover the micro-batch's rows */
    GPT_ETP = 8         /* tensor parallelism: a TP all-reduce failed, or tp > 1 without a group */
};

typedef struct gpt_config {
    int vocab;          /* token ids 0 .. vocab-1 */
    int max_T;          /* longest sequence: rows of the position table */
    int C;              /* channels */
    int n_head;         /* heads; C % n_head == 0 */
    int n_block;        /* transformer blocks, 1 .. GPT_MAX_BLOCK */
} gpt_config;

typedef struct gpt_embed_params {
    int vocab, max_T, C;
    pp_dtype act;       /* gpt_set_act: the dtype of x and its gradient */
    float* wte;         /* (vocab, C) token embedding */
    float* wpe;         /* (max_T, C) position embedding; the position restarts at 0 per sequence */
} gpt_embed_params;

/* Matrices are stored (in, out): y = x W + b.
   With tensor parallelism (TENSOR PARALLELISM below) a block holds TP rank tp_rank's shard:
   Cl = C / tp channels (n_head / tp heads) of attention and 4 Cl of the MLP; the shapes below
   then read Cl for the inner C (qkv_w (C, 3Cl), proj_w (Cl, C), fc_w (C, 4Cl), fcproj_w (4Cl, C)). */
typedef struct gpt_block_params {
    int C, n_head;
    pp_dtype act;       /* gpt_set_act: the dtype of x in and out and of their gradients */
    float* ln1_g;       /* (C) */
    float* ln1_b;       /* (C) */
    float* qkv_w;       /* (C, 3C) columns: q | k | v, head h at [h*hs, (h+1)*hs) of each */
    float* qkv_b;       /* (3C) */
    float* proj_w;      /* (C, C) attention output projection */
    float* proj_b;      /* (C) */
    float* ln2_g;       /* (C) */
    float* ln2_b;       /* (C) */
    float* fc_w;        /* (C, 4C) */
    float* fc_b;        /* (4C) */
    float* fcproj_w;    /* (4C, C) */
    float* fcproj_b;    /* (C) */
    int tp, tp_rank;    /* tensor parallelism (gpt_bind_tp): the TP group's size (0 or 1: none) and
                           this rank's place in it */
} gpt_block_params;

typedef struct gpt_head_params {
    int C, vocab;
    pp_dtype act;       /* gpt_set_act: the dtype of x and its gradient */
    float* lnf_g;       /* (C) */
    float* lnf_b;       /* (C) */
    float* lm_w;        /* (C, vocab) own weights, not tied to wte (that would cross stages) */
    float* lm_b;        /* (vocab) */
    int tp, tp_rank;    /* tensor parallelism (gpt_bind_tp): vocabulary-parallel, lm_w's and lm_b's
                           vocab / tp columns from tp_rank * vocab / tp on this rank */
} gpt_head_params;

/* ---- sequences of a micro-batch ------------------------------------------------------------ */
static inline int gpt_seq_count(const pp_microbatch* mb) { return mb->cu_seqlens ? mb->n_seqs : 1; }
static inline int64_t gpt_seq_start(const pp_microbatch* mb, int s) { return mb->cu_seqlens ? mb->cu_seqlens[s] : 0; }
static inline int64_t gpt_seq_end(const pp_microbatch* mb, int s) {
    return mb->cu_seqlens ? mb->cu_seqlens[s + 1] : mb->rows;
}

/* Sum over sequences of len^2: the attention term of the cost and of the saved probabilities. */
static inline int64_t gpt_seq_sq_sum(const pp_microbatch* mb) {
    int64_t acc = 0;
    int s;
    for (s = 0; s < gpt_seq_count(mb); s++) {
        int64_t L = gpt_seq_end(mb, s) - gpt_seq_start(mb, s);
        acc += L * L;
    }
    return acc;
}

static inline int64_t gpt_seq_max(const pp_microbatch* mb) {
    int64_t mx = 0;
    int s;
    for (s = 0; s < gpt_seq_count(mb); s++) {
        int64_t L = gpt_seq_end(mb, s) - gpt_seq_start(mb, s);
        if (L > mx) mx = L;
    }
    return mx;
}

/* The offsets must tile [0, rows) with non-empty sequences. */
static inline int gpt_seqs_ok(const pp_microbatch* mb) {
    int s;
    if (!mb->cu_seqlens) return mb->rows > 0;
    if (mb->n_seqs <= 0 || mb->cu_seqlens[0] != 0 || mb->cu_seqlens[mb->n_seqs] != mb->rows) return 0;
    for (s = 0; s < mb->n_seqs; s++)
        if (mb->cu_seqlens[s + 1] <= mb->cu_seqlens[s]) return 0;
    return 1;
}

static inline int gpt_tensor_is(const pp_tensor* t, int64_t rows, int64_t cols, pp_dtype dt) {
    return t->data && t->rows == rows && t->cols == cols && t->dtype == dt;
}

/* ---- bf16 activations: each layer's f32 code on widened copies ----------------------------------
   gpt_wide_begin gives the f32 code its io: io itself when act is PP_F32, else a copy whose
   bf16 tensors (in, out; in backward also d_out, d_in) point at f32 buffers, holding the
   widened values of those the layer reads (in, d_out, and d_in, which it adds to). Any f32
   float tensor under act PP_BF16 is GPT_ESHAPE. gpt_wide_end rounds what the layer wrote back
   into io (out in forward, d_in in backward), copies the loss and frees the buffers. */
typedef struct gpt_wide {
    pp_layer_io* io;    /* what the f32 code runs on */
    pp_layer_io copy;
    float* buf;
    int bwd;
} gpt_wide;

/* The tensors gpt_wide converts, each with what the layer does to it: GPT_WIDE_READ (in,
   d_out, d_in), GPT_WIDE_WRITE (out in forward, d_in in backward: d_in is added to). */
#define GPT_WIDE_READ 1
#define GPT_WIDE_WRITE 2
static inline int gpt_wide_list(pp_layer_io* io, int bwd, pp_tensor** ts, int* use) {
    int n = 0, k;
    for (k = 0; k < io->n_in && k < PP_MAX_TENSORS; k++) {
        use[n] = GPT_WIDE_READ;
        ts[n++] = &io->in[k];
        if (!bwd) continue;
        use[n] = GPT_WIDE_READ | GPT_WIDE_WRITE;
        ts[n++] = &io->d_in[k];
    }
    for (k = 0; k < io->n_out && k < PP_MAX_TENSORS; k++) {
        use[n] = bwd ? 0 : GPT_WIDE_WRITE; /* backward reads no output: its copy is not filled */
        ts[n++] = &io->out[k];
        if (!bwd) continue;
        use[n] = GPT_WIDE_READ;
        ts[n++] = &io->d_out[k];
    }
    return n;
}

static inline int gpt_wide_begin(gpt_wide* w, pp_layer_io* io, pp_dtype act, int bwd) {
    pp_tensor* ts[4 * PP_MAX_TENSORS];
    int use[4 * PP_MAX_TENSORS], n, k;
    size_t total = 0, off = 0, i;
    w->io = io;
    w->buf = NULL;
    w->bwd = bwd;
    if (act == PP_F32) return 0;
    if (act != PP_BF16) return GPT_ESHAPE;
    w->copy = *io;
    n = gpt_wide_list(&w->copy, bwd, ts, use);
    for (k = 0; k < n; k++) {
        if (!ts[k]->data || !pp_dtype_is_float(ts[k]->dtype)) continue;
        if (ts[k]->dtype != PP_BF16) return GPT_ESHAPE;
        total += (size_t)(ts[k]->rows * ts[k]->cols);
    }
    if (total && !(w->buf = (float*)malloc(total * sizeof(float)))) return GPT_ENOMEM;
    for (k = 0; k < n; k++) {
        const uint16_t* h = (const uint16_t*)ts[k]->data;
        const size_t cnt = (size_t)(ts[k]->rows * ts[k]->cols);
        if (!h || ts[k]->dtype != PP_BF16) continue;
        if (use[k] & GPT_WIDE_READ)
            for (i = 0; i < cnt; i++) w->buf[off + i] = pp_bf16_to_f32(h[i]);
        ts[k]->data = w->buf + off;
        ts[k]->dtype = PP_F32;
        off += cnt;
    }
    w->io = &w->copy;
    return 0;
}

/* Rounds the f32 results into io's bf16 tensors (when rc is 0) and frees; returns rc. */
static inline int gpt_wide_end(gpt_wide* w, pp_layer_io* io, int rc) {
    pp_tensor *ts[4 * PP_MAX_TENSORS], *wide[4 * PP_MAX_TENSORS];
    int use[4 * PP_MAX_TENSORS], n, k;
    size_t i;
    if (w->io == io) return rc;
    n = gpt_wide_list(io, w->bwd, ts, use);
    gpt_wide_list(&w->copy, w->bwd, wide, use);
    for (k = 0; rc == 0 && k < n; k++) {
        uint16_t* h = (uint16_t*)ts[k]->data;
        const float* f = (const float*)wide[k]->data;
        const size_t cnt = (size_t)(ts[k]->rows * ts[k]->cols);
        if (!h || ts[k]->dtype != PP_BF16 || !(use[k] & GPT_WIDE_WRITE)) continue;
        for (i = 0; i < cnt; i++) h[i] = pp_f32_to_bf16(f[i]);
    }
    io->loss = w->copy.loss;
    free(w->buf);
    w->buf = NULL;
    return rc;
}

/* A layer's forward and backward with act from its parameters: NAME runs NAME_f32 through
   gpt_wide. */
#define GPT_ACT_FWD(NAME, P)                                                 \
    static inline int NAME(const P* p, pp_layer_io* io) {                    \
        gpt_wide w;                                                          \
        int rc = gpt_wide_begin(&w, io, p->act, 0);                          \
        return gpt_wide_end(&w, io, rc ? rc : NAME##_f32(p, w.io));          \
    }
#define GPT_ACT_BWD(NAME, P)                                                 \
    static inline int NAME(const P* p, P* g, pp_layer_io* io) {              \
        gpt_wide w;                                                          \
        int rc = gpt_wide_begin(&w, io, p->act, 1);                          \
        return gpt_wide_end(&w, io, rc ? rc : NAME##_f32(p, g, w.io));       \
    }

/* ---- kernels: plain loops over flat buffers --------------------------------------------------- */

/* The three loops below carry the matmuls. Each runs in two parts: n & ~3 elements, then the rest,
   because GCC at -O2 vectorizes only loops whose trip count is a known multiple of the vector
   width. Both parts do the same operations per element, so the split does not change results. */

/* y (n) += a x (n) */
static inline void gpt_axpy(float* restrict y, const float* restrict x, float a, int n) {
    int o, n4 = n & ~3;
    for (o = 0; o < n4; o++) y[o] += a * x[o];
    for (; o < n; o++) y[o] += a * x[o];
}

/* y0..y3 (n) += a[k] x (n): one pass over x serves four rows. */
static inline void gpt_axpy4(float* restrict y0, float* restrict y1, float* restrict y2, float* restrict y3,
                             const float* restrict x, const float* a, int n) {
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    int o, n4 = n & ~3;
    for (o = 0; o < n4; o++) {
        y0[o] += a0 * x[o];
        y1[o] += a1 * x[o];
        y2[o] += a2 * x[o];
        y3[o] += a3 * x[o];
    }
    for (; o < n; o++) {
        y0[o] += a0 * x[o];
        y1[o] += a1 * x[o];
        y2[o] += a2 * x[o];
        y3[o] += a3 * x[o];
    }
}

/* y (n) += a[0] x0 + a[1] x1 + a[2] x2 + a[3] x3, added left to right: bit for bit the same as
   four gpt_axpy calls in that order, in one pass over y. */
static inline void gpt_axpy_sum4(float* restrict y, const float* restrict x0, const float* restrict x1,
                                 const float* restrict x2, const float* restrict x3, const float* a, int n) {
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    int o, n4 = n & ~3;
    for (o = 0; o < n4; o++) y[o] = y[o] + a0 * x0[o] + a1 * x1[o] + a2 * x2[o] + a3 * x3[o];
    for (; o < n; o++) y[o] = y[o] + a0 * x0[o] + a1 * x1[o] + a2 * x2[o] + a3 * x3[o];
}

/* The matmuls walk rows in groups of four so that each row of the weight matrix is read once per
   group. Every output element still sees the same operations in the same order whatever group
   its row falls in, so a sequence's results do not depend on where it sits in the micro-batch. */

/* out (T, OC) = inp (T, IC) w (IC, OC) + b (OC); b NULL: no bias (a row-parallel partial sum) */
static inline void gpt_matmul_fwd(float* restrict out, const float* restrict inp, const float* restrict w,
                                  const float* restrict b, int64_t T, int IC, int OC) {
    int64_t t;
    int i, r;
    for (t = 0; t < T; t += 4) {
        const int nr = T - t < 4 ? (int)(T - t) : 4;
        const float* x = inp + t * IC;      /* (nr, IC) */
        float* y = out + t * OC;            /* (nr, OC) */
        for (r = 0; r < nr; r++) {
            if (b) memcpy(y + (size_t)r * OC, b, sizeof(float) * (size_t)OC);
            else memset(y + (size_t)r * OC, 0, sizeof(float) * (size_t)OC);
        }
        for (i = 0; i < IC; i++) {
            const float* wi = w + (size_t)i * OC;   /* (OC) */
            if (nr == 4) {
                const float a[4] = {x[i], x[IC + i], x[2 * IC + i], x[3 * IC + i]};
                gpt_axpy4(y, y + OC, y + 2 * OC, y + 3 * OC, wi, a, OC);
            } else {
                for (r = 0; r < nr; r++) gpt_axpy(y + (size_t)r * OC, wi, x[(size_t)r * IC + i], OC);
            }
        }
    }
}

/* dinp (T, IC) += dout w^T (skipped when dinp is NULL; wt is scratch of IC*OC floats for w
   transposed, NULL then too); dw (IC, OC) += inp^T dout and db (OC) += sum of dout rows (skipped
   when dw is NULL: the split block's B). Rows are added in ascending order, so the sums are the
   same on every run, and the same whether or not the two halves run in one call. */
static inline void gpt_matmul_bwd(float* restrict dinp, float* restrict dw, float* restrict db, float* restrict wt,
                                  const float* restrict dout, const float* restrict inp, const float* restrict w,
                                  int64_t T, int IC, int OC) {
    int64_t t;
    int i, o, r;
    if (dinp)
        for (i = 0; i < IC; i++)
            for (o = 0; o < OC; o++) wt[(size_t)o * IC + i] = w[(size_t)i * OC + o];
    for (t = 0; t < T; t += 4) {
        const int nr = T - t < 4 ? (int)(T - t) : 4;
        const float* dy = dout + t * OC;    /* (nr, OC) */
        const float* x = inp + t * IC;      /* (nr, IC) */
        for (r = 0; dw && r < nr; r++)
            for (o = 0; o < OC; o++) db[o] += dy[(size_t)r * OC + o];
        for (i = 0; dw && i < IC; i++) {
            float* dwi = dw + (size_t)i * OC;       /* (OC) */
            if (nr == 4) {
                const float a[4] = {x[i], x[IC + i], x[2 * IC + i], x[3 * IC + i]};
                gpt_axpy_sum4(dwi, dy, dy + OC, dy + 2 * OC, dy + 3 * OC, a, OC);
            } else {
                for (r = 0; r < nr; r++) gpt_axpy(dwi, dy + (size_t)r * OC, x[(size_t)r * IC + i], OC);
            }
        }
        if (dinp) {
            float* dx = dinp + t * IC;      /* (nr, IC) */
            for (o = 0; o < OC; o++) {
                const float* wto = wt + (size_t)o * IC;     /* (IC) row o of w^T */
                if (nr == 4) {
                    const float a[4] = {dy[o], dy[OC + o], dy[2 * OC + o], dy[3 * OC + o]};
                    gpt_axpy4(dx, dx + IC, dx + 2 * IC, dx + 3 * IC, wto, a, IC);
                } else {
                    for (r = 0; r < nr; r++) gpt_axpy(dx + (size_t)r * IC, wto, dy[(size_t)r * OC + o], IC);
                }
            }
        }
    }
}

/* out (T, C) = (inp - mean) * rstd * g + b, per row; mean, rstd (T) kept for backward. */
static inline void gpt_layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* g,
                                     const float* b, int64_t T, int C) {
    int64_t t;
    int i;
    for (t = 0; t < T; t++) {
        const float* x = inp + t * C;       /* (C) */
        float* y = out + t * C;             /* (C) */
        float m = 0.0f, v = 0.0f, s;
        for (i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        for (i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= (float)C;
        s = 1.0f / sqrtf(v + GPT_LN_EPS);
        for (i = 0; i < C; i++) y[i] = (x[i] - m) * s * g[i] + b[i];
        mean[t] = m;
        rstd[t] = s;
    }
}

/* dinp (T, C) += d(LN)/d(inp) dout (skipped when NULL); dg, db (C) += (skipped when dg is NULL). */
static inline void gpt_layernorm_bwd(float* dinp, float* dg, float* db, const float* dout, const float* inp,
                                     const float* mean, const float* rstd, const float* g, int64_t T, int C) {
    int64_t t;
    int i;
    for (t = 0; t < T; t++) {
        const float* dy = dout + t * C;     /* (C) */
        const float* x = inp + t * C;       /* (C) */
        const float m = mean[t], s = rstd[t];
        float dmean = 0.0f, dnorm_dot = 0.0f;   /* means of dnorm and of dnorm * norm */
        for (i = 0; i < C; i++) {
            const float norm = (x[i] - m) * s, dnorm = g[i] * dy[i];
            dmean += dnorm;
            dnorm_dot += dnorm * norm;
        }
        dmean /= (float)C;
        dnorm_dot /= (float)C;
        for (i = 0; i < C; i++) {
            const float norm = (x[i] - m) * s, dnorm = g[i] * dy[i];
            if (dg) {
                db[i] += dy[i];
                dg[i] += norm * dy[i];
            }
            if (dinp) dinp[t * C + i] += (dnorm - dmean - norm * dnorm_dot) * s;
        }
    }
}

#define GPT_GELU_K 0.7978845608f /* sqrt(2/pi) */
/* GELU, tanh approximation, and its derivative. */
static inline float gpt_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(GPT_GELU_K * (x + 0.044715f * x * x * x)));
}
static inline float gpt_gelu_grad(float x) {
    const float th = tanhf(GPT_GELU_K * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GPT_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* The rows attention walks, in order: each sequence (offset o, length L), each head h of it,
   each row i. Every token index is o + (0 .. L-1) of one sequence, so tokens of different
   sequences never meet: this walk is the sequence mask. att holds, for each sequence in order,
   NH blocks of (L, L) softmax probabilities; row i of head h starts at att + p. Start from
   gpt_attn_rows; gpt_attn_next moves to the next row and returns 0 after the last. */
typedef struct gpt_attn_row {
    int C, NH, hs;      /* channels, heads, channels per head */
    float scale;        /* 1 / sqrt(hs) */
    int s, h;           /* the sequence, the head */
    int64_t o, L, i;    /* the sequence's offset and length, the row in it */
    size_t base, p;     /* where the sequence's probabilities start in att, and the row's */
} gpt_attn_row;

static inline gpt_attn_row gpt_attn_rows(int C, int NH) {
    gpt_attn_row r;
    memset(&r, 0, sizeof r);
    r.C = C;
    r.NH = NH;
    r.hs = C / NH;
    r.scale = 1.0f / sqrtf((float)r.hs);
    r.s = -1;
    return r;
}

static inline int gpt_attn_next(gpt_attn_row* r, const pp_microbatch* mb) {
    if (r->s < 0) {
        r->s = r->h = 0;
        r->i = 0;
        r->base = 0;
    } else if (++r->i >= r->L) {
        r->i = 0;
        if (++r->h >= r->NH) {
            r->h = 0;
            r->base += (size_t)r->NH * (size_t)(r->L * r->L);
            r->s++;
        }
    }
    if (r->s >= gpt_seq_count(mb)) return 0;
    r->o = gpt_seq_start(mb, r->s);
    r->L = gpt_seq_end(mb, r->s) - r->o;
    r->p = r->base + ((size_t)r->h * (size_t)r->L + (size_t)r->i) * (size_t)r->L;
    return 1;
}

/* Where head h of row j of the sequence has its q (part 0), k (1) or v (2) in qkv (T, 3C), and
   (gpt_attn_y) its slice of the output (T, C). */
static inline int64_t gpt_attn_qkv(const gpt_attn_row* r, int64_t j, int part) {
    return (r->o + j) * 3 * r->C + part * r->C + r->h * r->hs;
}
static inline int64_t gpt_attn_y(const gpt_attn_row* r) { return (r->o + r->i) * r->C + r->h * r->hs; }

/* Causal self-attention inside each sequence of the micro-batch (gpt_attn_row's walk).
   qkv (T, 3C); out (T, C); att: the probabilities, row i nonzero only in columns 0..i. */
static inline void gpt_attention_fwd(float* out, float* att, const float* qkv, const pp_microbatch* mb, int C,
                                     int NH) {
    gpt_attn_row r = gpt_attn_rows(C, NH);
    const int hs = r.hs;
    int d;
    while (gpt_attn_next(&r, mb)) {
        const int64_t i = r.i;
        const float* q = qkv + gpt_attn_qkv(&r, i, 0);  /* (hs) */
        float* p = att + r.p;                           /* (L) row i of head h */
        float* y = out + gpt_attn_y(&r);                /* (hs) */
        float mx = -INFINITY, sum = 0.0f, inv;
        int64_t j;
        for (j = 0; j <= i; j++) {
            const float* k = qkv + gpt_attn_qkv(&r, j, 1); /* (hs) */
            float dot = 0.0f;
            for (d = 0; d < hs; d++) dot += q[d] * k[d];
            p[j] = dot * r.scale;
            if (p[j] > mx) mx = p[j];
        }
        for (j = 0; j <= i; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        inv = 1.0f / sum;
        for (j = 0; j <= i; j++) p[j] *= inv;
        for (j = i + 1; j < r.L; j++) p[j] = 0.0f;
        for (d = 0; d < hs; d++) y[d] = 0.0f;
        for (j = 0; j <= i; j++) {
            const float* v = qkv + gpt_attn_qkv(&r, j, 2); /* (hs) */
            for (d = 0; d < hs; d++) y[d] += p[j] * v[d];
        }
    }
}

/* dqkv (T, 3C) += gradient of the attention given dout (T, C); dp is scratch of max_seqlen. */
static inline void gpt_attention_bwd(float* dqkv, float* dp, const float* dout, const float* qkv, const float* att,
                                     const pp_microbatch* mb, int C, int NH) {
    gpt_attn_row r = gpt_attn_rows(C, NH);
    int d;
    while (gpt_attn_next(&r, mb)) {
        const int64_t i = r.i;
        const float* q = qkv + gpt_attn_qkv(&r, i, 0);  /* (hs) */
        float* dq = dqkv + gpt_attn_qkv(&r, i, 0);      /* (hs) */
        const float* p = att + r.p;                     /* (L) */
        const float* dy = dout + gpt_attn_y(&r);        /* (hs) */
        float pdp = 0.0f;   /* sum_j p[j] dp[j], for the softmax backward */
        int64_t j;
        for (j = 0; j <= i; j++) {
            const float* v = qkv + gpt_attn_qkv(&r, j, 2);
            float* dv = dqkv + gpt_attn_qkv(&r, j, 2);
            float dot = 0.0f;
            for (d = 0; d < r.hs; d++) {
                dot += dy[d] * v[d];
                dv[d] += p[j] * dy[d];
            }
            dp[j] = dot;
            pdp += p[j] * dot;
        }
        for (j = 0; j <= i; j++) {
            const float* k = qkv + gpt_attn_qkv(&r, j, 1);
            float* dk = dqkv + gpt_attn_qkv(&r, j, 1);
            const float dpre = p[j] * (dp[j] - pdp) * r.scale; /* d(score before scaling) */
            for (d = 0; d < r.hs; d++) {
                dq[d] += dpre * k[d];
                dk[d] += dpre * q[d];
            }
        }
    }
}

/* ---- embed -------------------------------------------------------------------------------------- */
static inline int gpt_embed_fwd_f32(const gpt_embed_params* p, pp_layer_io* io) {
    const pp_microbatch* mb = io->mb;
    const int C = p->C;
    const int32_t* tok = (const int32_t*)io->in[0].data;   /* (T, 1) */
    float* x = (float*)io->out[0].data;                     /* (T, C) */
    int s, i;
    if (!gpt_tensor_is(&io->in[0], mb->rows, 1, PP_I32) || !gpt_tensor_is(&io->out[0], mb->rows, C, PP_F32))
        return GPT_ESHAPE;
    if (!gpt_seqs_ok(mb)) return GPT_ESEQS;
    for (s = 0; s < gpt_seq_count(mb); s++) {
        const int64_t o = gpt_seq_start(mb, s), L = gpt_seq_end(mb, s) - o;
        int64_t pos;
        if (L > p->max_T) return GPT_ELONG;
        for (pos = 0; pos < L; pos++) {
            const int32_t id = tok[o + pos];
            const float *te, *pe;
            float* y = x + (o + pos) * C;                   /* (C) */
            if (id < 0 || id >= p->vocab) return GPT_ETOKEN;
            te = p->wte + (size_t)id * C;                   /* (C) */
            pe = p->wpe + (size_t)pos * C;                  /* (C) */
            for (i = 0; i < C; i++) y[i] = te[i] + pe[i];
        }
    }
    return 0;
}

static inline int gpt_embed_bwd_f32(const gpt_embed_params* p, gpt_embed_params* g, pp_layer_io* io) {
    const pp_microbatch* mb = io->mb;
    const int C = p->C;
    const int32_t* tok = (const int32_t*)io->in[0].data;   /* (T, 1) */
    const float* dx = (const float*)io->d_out[0].data;      /* (T, C) */
    int s, i;
    if (!gpt_tensor_is(&io->d_out[0], mb->rows, C, PP_F32) || !gpt_seqs_ok(mb)) return GPT_ESHAPE;
    for (s = 0; s < gpt_seq_count(mb); s++) {
        const int64_t o = gpt_seq_start(mb, s), L = gpt_seq_end(mb, s) - o;
        int64_t pos;
        for (pos = 0; pos < L; pos++) {
            float* gte = g->wte + (size_t)tok[o + pos] * C;    /* (C) */
            float* gpe = g->wpe + (size_t)pos * C;              /* (C) */
            const float* dy = dx + (o + pos) * C;               /* (C) */
            for (i = 0; i < C; i++) {
                gte[i] += dy[i];
                gpe[i] += dy[i];
            }
        }
    }
    return 0; /* token ids carry no gradient: io->d_in[0].data is NULL */
}

/* describe()'s one output: x (T, C) in the activations' dtype (embed, block). */
static inline void gpt_desc_x(pp_layer_desc* d, const pp_microbatch* mb, int C, pp_dtype act) {
    d->n_out = 1;
    d->out[0].rows = mb->rows;
    d->out[0].cols = C;
    d->out[0].dtype = act;
}

static inline void gpt_embed_desc(const gpt_embed_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                                  pp_layer_desc* d) {
    (void)in;
    (void)n_in;
    gpt_desc_x(d, mb, p->C, p->act);
    d->saved_bytes = 0;
    d->cost = 3.0 * (double)mb->rows * p->C;
    d->n_params = (int64_t)(p->vocab + p->max_T) * p->C;
}

/* ---- tensor parallelism (Megatron-style) ------------------------------------------------------------
   A block split over a TP group of tp ranks (gpt_bind_tp, gpt_init_tp): each rank holds n_head / tp
   heads and C / tp = Cl of attention's channels (qkv_w's q, k and v columns of its heads: column
   parallel; proj_w's rows of those channels: row parallel), and 4 Cl of the MLP's hidden units
   (fc_w's columns: column parallel; fcproj_w's rows: row parallel). LayerNorms, proj_b and fcproj_b
   are whole on every rank, the embedding too; the head is vocabulary-parallel (gpt_head_fwd_vp:
   each rank vocab / tp of lm's columns, the softmax's max and sums over the group). A row-parallel matmul gives a partial sum
   (T, C), which one TP all-reduce completes (Megatron's g: the forward of proj and of fcproj);
   the bias is added by TP rank 0's partial sum, so it is added once. In backward the input
   gradient of a column-parallel matmul (qkv's and fc's: each rank has its heads' or units' share)
   is all-reduced before the LayerNorm under it (Megatron's f). Every collective is
   pp_tp_allreduce, deterministic: every TP rank holds the same x, the same LayerNorm and bias
   gradients, the same input gradient, so the replicated parameters stay equal without a message.
   A tp = 2 run is the tp = 1 model (gpt_init_tp shards gpt_init's weights), its sums added in
   another order: within float rounding of tp = 1 (examples/gpt_mpi.c --tp --check measures it).
   The group: io->tp where the stage has one (pp_pipeline_desc.tp: gpt_cpu --tp), else pp_model.ctx
   pointing at the rank's pp_group (pipeline.h >>tp; the same pointer serves pp_stage_step and
   pp_sequential_step, whose io->ctx is NULL); tp > 1 without either is GPT_ETP. */
static inline int gpt_tp_size(const gpt_block_params* p) { return p->tp > 1 ? p->tp : 1; }
static inline int gpt_tp_cl(const gpt_block_params* p) { return p->C / gpt_tp_size(p); }
static inline int gpt_tp_heads(const gpt_block_params* p) { return p->n_head / gpt_tp_size(p); }

/* The layer's TP group: io->tp where the stage has one (the one-process pipeline with tp > 1,
   pp_stage_desc.tp), else pp_model.ctx (gpt_mpi, pp_sequential_step); NULL without. */
static inline const pp_group* gpt_tp_group(const pp_layer_io* io) {
    const pp_group* g = io->tp && io->tp->t ? io->tp : io->model ? (const pp_group*)io->model->ctx : NULL;
    return g && g->t ? g : NULL;
}
/* buf (n floats) summed over the TP group of tp ranks, in place; 0 or GPT_ETP. */
static inline int gpt_tp_sum_n(int tp, const pp_layer_io* io, float* buf, size_t n) {
    pp_error err;
    if (tp <= 1) return 0;
    if (!gpt_tp_group(io)) return GPT_ETP;
    return pp_tp_allreduce(gpt_tp_group(io), buf, n, PP_F32, &err) == PP_OK ? 0 : GPT_ETP;
}
/* ||a - b|| / ||b|| over n floats (||a - b|| where b is zero): how far a TP run is from tp = 1. */
static inline double gpt_rel_diff(const float* a, const float* b, int64_t n) {
    double d = 0, r = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* buf (n floats: (T, C)) summed over the block's TP group, in place; 0 or GPT_ETP. */
static inline int gpt_tp_sum(const gpt_block_params* p, const pp_layer_io* io, float* buf, size_t n) {
    return gpt_tp_sum_n(gpt_tp_size(p), io, buf, n);
}

/* ---- block -------------------------------------------------------------------------------------- */
/* What a block keeps from forward to backward, carved from io->saved (Cl: gpt_tp_cl). */
typedef struct gpt_block_saved {
    float* ln1;         /* (T, C) */
    float* ln1_mean;    /* (T) */
    float* ln1_rstd;    /* (T) */
    float* qkv;         /* (T, 3Cl) */
    float* att;         /* (sum over sequences of NH * L * L) softmax probabilities of this rank's heads */
    float* atty;        /* (T, Cl) attention output before the projection */
    float* x2;          /* (T, C) residual stream after attention */
    float* ln2;         /* (T, C) */
    float* ln2_mean;    /* (T) */
    float* ln2_rstd;    /* (T) */
    float* fch;         /* (T, 4Cl) before GELU */
    float* fcg;         /* (T, 4Cl) after GELU */
} gpt_block_saved;

/* Cl of C channels and NH of the heads on this rank (tp = 1: C and n_head). */
static inline size_t gpt_block_saved_floats_tp(int64_t T, int C, int Cl, int NH, int64_t sq_sum) {
    return (size_t)T * (size_t)(3 * C + 12 * Cl + 4) + (size_t)NH * (size_t)sq_sum;
}
static inline size_t gpt_block_saved_floats(int64_t T, int C, int NH, int64_t sq_sum) {
    return gpt_block_saved_floats_tp(T, C, C, NH, sq_sum);
}

static inline void gpt_block_saved_carve(gpt_block_saved* s, float* base, int64_t T, int C, int Cl, int NH,
                                         int64_t sq_sum) {
    s->ln1 = base;
    s->ln1_mean = s->ln1 + T * C;
    s->ln1_rstd = s->ln1_mean + T;
    s->qkv = s->ln1_rstd + T;
    s->att = s->qkv + T * 3 * Cl;
    s->atty = s->att + (size_t)NH * (size_t)sq_sum;
    s->x2 = s->atty + T * Cl;
    s->ln2 = s->x2 + T * C;
    s->ln2_mean = s->ln2 + T * C;
    s->ln2_rstd = s->ln2_mean + T;
    s->fch = s->ln2_rstd + T;
    s->fcg = s->fch + T * 4 * Cl;
}

/* Checks shapes and carves the saved area; 0 or an error code. */
static inline int gpt_block_prepare(const gpt_block_params* p, const pp_layer_io* io, gpt_block_saved* s) {
    const pp_microbatch* mb = io->mb;
    const int64_t T = mb->rows;
    const int Cl = gpt_tp_cl(p), NH = gpt_tp_heads(p);
    int64_t sq;
    if (!gpt_tensor_is(&io->in[0], T, p->C, PP_F32) || !gpt_tensor_is(&io->out[0], T, p->C, PP_F32))
        return GPT_ESHAPE;
    if (!gpt_seqs_ok(mb)) return GPT_ESEQS;
    sq = gpt_seq_sq_sum(mb);
    if (!io->saved || io->saved_bytes < gpt_block_saved_floats_tp(T, p->C, Cl, NH, sq) * sizeof(float))
        return GPT_ESAVED;
    gpt_block_saved_carve(s, (float*)io->saved, T, p->C, Cl, NH, sq);
    return 0;
}

/* The block's forward, keeping its activations where s points; 0 or GPT_ETP. With tp > 1 the
   two row-parallel outputs are partial sums until gpt_tp_sum. */
static inline int gpt_block_fwd_into(const gpt_block_params* p, const pp_layer_io* io, gpt_block_saved s) {
    const int C = p->C, Cl = gpt_tp_cl(p), lead = p->tp_rank == 0;
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;  /* (T, C) */
    float* y = (float*)io->out[0].data;             /* (T, C) */
    int64_t i;
    int rc = 0;
    gpt_layernorm_fwd(s.ln1, s.ln1_mean, s.ln1_rstd, x, p->ln1_g, p->ln1_b, T, C);
    gpt_matmul_fwd(s.qkv, s.ln1, p->qkv_w, p->qkv_b, T, C, 3 * Cl);
    gpt_attention_fwd(s.atty, s.att, s.qkv, io->mb, Cl, gpt_tp_heads(p));
    gpt_matmul_fwd(s.x2, s.atty, p->proj_w, lead ? p->proj_b : NULL, T, Cl, C);
#ifndef PP_TEST_GPT_TP_NO_ROW_REDUCE /* negative control (tests/test_gpt_tp.sh): proj's partial sum kept */
    rc = gpt_tp_sum(p, io, s.x2, (size_t)(T * C));
#endif
    for (i = 0; i < T * C; i++) s.x2[i] += x[i];
    gpt_layernorm_fwd(s.ln2, s.ln2_mean, s.ln2_rstd, s.x2, p->ln2_g, p->ln2_b, T, C);
    gpt_matmul_fwd(s.fch, s.ln2, p->fc_w, p->fc_b, T, C, 4 * Cl);
    for (i = 0; i < T * 4 * Cl; i++) s.fcg[i] = gpt_gelu(s.fch[i]);
    gpt_matmul_fwd(y, s.fcg, p->fcproj_w, lead ? p->fcproj_b : NULL, T, 4 * Cl, C);
    if (!rc) rc = gpt_tp_sum(p, io, y, (size_t)(T * C));
    for (i = 0; i < T * C; i++) y[i] += s.x2[i];
    return rc;
}

static inline int gpt_block_fwd_f32(const gpt_block_params* p, pp_layer_io* io) {
    gpt_block_saved s;
    int rc = gpt_block_prepare(p, io, &s);
    if (rc) return rc;
    return gpt_block_fwd_into(p, io, s);
}

/* Parameters of one block on one TP rank (tp = 1: 12 C^2 + 13 C). */
static inline int64_t gpt_block_numel_cl(int C, int Cl) {
    return 12 * (int64_t)C * Cl + 7 * (int64_t)Cl + 6 * (int64_t)C;
}

static inline void gpt_block_desc(const gpt_block_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                                  pp_layer_desc* d) {
    const double T = (double)mb->rows, C = (double)p->C, Cl = (double)gpt_tp_cl(p);
    const int64_t sq = gpt_seq_sq_sum(mb);
    (void)in;
    (void)n_in;
    gpt_desc_x(d, mb, p->C, p->act);
    d->saved_bytes = gpt_block_saved_floats_tp(mb->rows, p->C, gpt_tp_cl(p), gpt_tp_heads(p), sq) * sizeof(float);
    /* multiply-adds, forward + backward (3x): 12 C^2 per token in the four matmuls, and the
       quadratic attention term: q.k and p.v over the causal half of every sequence's L^2 (this
       TP rank's share: C becomes Cl in one factor) */
    d->cost = 3.0 * (12.0 * T * C * Cl + Cl * (double)sq);
    d->n_params = gpt_block_numel_cl(p->C, gpt_tp_cl(p));
}

/* ---- block, backward split in two (PP_MODEL_SPLIT: gptz below) -----------------------------------
   B (gpt_blockz_bwd_in) computes the input gradient and keeps the output gradients of the four
   matmuls and two LayerNorms in io->saved; W (gpt_blockz_bwd_w) adds the parameter gradients from
   them and the activations. qkv, the attention probabilities and the pre-GELU activations only B
   reads: they are B-only scratch (pp_layer_desc.b_saved_bytes), which a schedule with W actions
   frees at B while the rest waits for W. The fused block's backward runs the same two chains
   (gpt_block_bwd_b, gpt_block_bwd_w) back to back: the gradients are gpt_block_bwd's bit for bit.
   With tensor parallelism B holds both all-reduces (dln2, dln1: kept summed for W), W none. */
typedef struct gpt_blockz_grads {
    float* dfc;         /* (T, 4Cl) fc's output gradient (after GELU's) */
    float* dln2;        /* (T, C) ln2's output gradient */
    float* dx2;         /* (T, C) proj's output gradient (the residual stream's) */
    float* dqkv;        /* (T, 3Cl) */
    float* dln1;        /* (T, C) */
} gpt_blockz_grads;

static inline size_t gpt_blockz_grads_floats(int64_t T, int C, int Cl) { return (size_t)T * (size_t)(3 * C + 7 * Cl); }
static inline size_t gpt_blockz_kept_floats_tp(int64_t T, int C, int Cl) {
    return (size_t)T * (size_t)(3 * C + 5 * Cl + 4) + gpt_blockz_grads_floats(T, C, Cl);
}
static inline size_t gpt_blockz_kept_floats(int64_t T, int C) { return gpt_blockz_kept_floats_tp(T, C, C); }
static inline size_t gpt_blockz_bonly_floats_tp(int64_t T, int Cl, int NH, int64_t sq_sum) {
    return (size_t)T * (size_t)(7 * Cl) + (size_t)NH * (size_t)sq_sum;
}
static inline size_t gpt_blockz_bonly_floats(int64_t T, int C, int NH, int64_t sq_sum) {
    return gpt_blockz_bonly_floats_tp(T, C, NH, sq_sum);
}

/* The output gradients (gpt_blockz_grads_floats) at base. */
static inline void gpt_blockz_grads_carve(gpt_blockz_grads* gr, float* base, int64_t T, int C, int Cl) {
    gr->dfc = base;
    gr->dln2 = gr->dfc + 4 * T * Cl;
    gr->dx2 = gr->dln2 + T * C;
    gr->dqkv = gr->dx2 + T * C;
    gr->dln1 = gr->dqkv + 3 * T * Cl;
}

/* Checks shapes (and what need asks for) and carves io->saved (activations W reads, then the
   gradients B keeps for it) and io->b_saved (NULL in W: qkv, att and fch stay NULL). */
#define GPT_NEED_B 1      /* gpt_blockz_prepare: io->b_saved must be there (forward, B) */
#define GPT_NEED_DOUT 2   /* and io->d_out[0] (B, W) */
static inline int gpt_blockz_prepare(const gpt_block_params* p, const pp_layer_io* io, gpt_block_saved* s,
                                     gpt_blockz_grads* gr, int need) {
    const int64_t T = io->mb->rows, TC = T * p->C;
    const int Cl = gpt_tp_cl(p);
    const int64_t TCl = T * Cl;
    float *k, *b;
    if (!gpt_tensor_is(&io->in[0], T, p->C, PP_F32) || !gpt_tensor_is(&io->out[0], T, p->C, PP_F32) ||
        ((need & GPT_NEED_DOUT) && !gpt_tensor_is(&io->d_out[0], T, p->C, PP_F32)))
        return GPT_ESHAPE;
    if (!gpt_seqs_ok(io->mb)) return GPT_ESEQS;
    if (!io->saved || io->saved_bytes < gpt_blockz_kept_floats_tp(T, p->C, Cl) * sizeof(float)) return GPT_ESAVED;
    k = (float*)io->saved;
    s->ln1 = k;
    s->ln1_mean = s->ln1 + TC;
    s->ln1_rstd = s->ln1_mean + T;
    s->atty = s->ln1_rstd + T;
    s->x2 = s->atty + TCl;
    s->ln2 = s->x2 + TC;
    s->ln2_mean = s->ln2 + TC;
    s->ln2_rstd = s->ln2_mean + T;
    s->fcg = s->ln2_rstd + T;
    gpt_blockz_grads_carve(gr, s->fcg + 4 * TCl, T, p->C, Cl);
    s->qkv = s->att = s->fch = NULL;
    if (!io->b_saved) return need & GPT_NEED_B ? GPT_ESAVED : 0;
    if (io->b_saved_bytes < gpt_blockz_bonly_floats_tp(T, Cl, gpt_tp_heads(p), gpt_seq_sq_sum(io->mb)) * sizeof(float))
        return GPT_ESAVED;
    b = (float*)io->b_saved;
    s->qkv = b;
    s->fch = s->qkv + 3 * TCl;
    s->att = s->fch + 4 * TCl;
    return 0;
}

static inline int gpt_blockz_fwd_f32(const gpt_block_params* p, pp_layer_io* io) {
    gpt_block_saved s;
    gpt_blockz_grads gr;
    int rc = gpt_blockz_prepare(p, io, &s, &gr, GPT_NEED_B);
    if (rc) return rc;
    return gpt_block_fwd_into(p, io, s);
}

/* Scratch for a block's backward: extra floats, then T*C (the attention output's gradient),
   max_seqlen (attention's) and 4C*C (a weight matrix transposed); zeroed. NULL without memory. */
static inline float* gpt_block_bwd_ws(const pp_microbatch* mb, int C, int64_t extra) {
    return (float*)calloc((size_t)extra + (size_t)mb->rows * (size_t)C + (size_t)gpt_seq_max(mb) + (size_t)(4 * C * C),
                          sizeof(float));
}

/* The input gradient into io->d_in (when its data is not NULL) and the output gradients the
   parameter gradients need into gr (sums from zero: zeroed here); ws from gpt_block_bwd_ws.
   0 or GPT_ETP. */
static inline int gpt_block_bwd_b(const gpt_block_params* p, const pp_layer_io* io, gpt_block_saved s,
                                  gpt_blockz_grads gr, float* ws) {
    const int C = p->C, Cl = gpt_tp_cl(p);
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;      /* (T, C) */
    const float* dy = (const float*)io->d_out[0].data;  /* (T, C) */
    float* dx = (float*)io->d_in[0].data;               /* (T, C) zeroed by the library, or NULL */
    float* datty = ws;                                  /* (T, Cl) */
    float* dp = datty + T * C;                          /* (max_seqlen) */
    float* wt = dp + gpt_seq_max(io->mb);               /* (4Cl * C) a weight matrix transposed */
    int64_t i;
    int rc;
    memset(gr.dfc, 0, sizeof(float) * gpt_blockz_grads_floats(T, C, Cl));
    /* y = x2 + fcproj(gelu(fc(ln2(x2)))) */
    memcpy(gr.dx2, dy, sizeof(float) * (size_t)(T * C));
    gpt_matmul_bwd(gr.dfc, NULL, NULL, wt, dy, s.fcg, p->fcproj_w, T, 4 * Cl, C);
    for (i = 0; i < T * 4 * Cl; i++) gr.dfc[i] *= gpt_gelu_grad(s.fch[i]);
    gpt_matmul_bwd(gr.dln2, NULL, NULL, wt, gr.dfc, s.ln2, p->fc_w, T, C, 4 * Cl);
    if ((rc = gpt_tp_sum(p, io, gr.dln2, (size_t)(T * C)))) return rc; /* f: this rank's units' share */
    gpt_layernorm_bwd(gr.dx2, NULL, NULL, gr.dln2, s.x2, s.ln2_mean, s.ln2_rstd, p->ln2_g, T, C);
    /* x2 = x + proj(attn(qkv(ln1(x)))) */
    gpt_matmul_bwd(datty, NULL, NULL, wt, gr.dx2, s.atty, p->proj_w, T, Cl, C);
    gpt_attention_bwd(gr.dqkv, dp, datty, s.qkv, s.att, io->mb, Cl, gpt_tp_heads(p));
    gpt_matmul_bwd(gr.dln1, NULL, NULL, wt, gr.dqkv, s.ln1, p->qkv_w, T, C, 3 * Cl);
    if ((rc = gpt_tp_sum(p, io, gr.dln1, (size_t)(T * C)))) return rc; /* f: this rank's heads' share */
    if (dx)
        for (i = 0; i < T * C; i++) dx[i] += gr.dx2[i];
    gpt_layernorm_bwd(dx, NULL, NULL, gr.dln1, x, s.ln1_mean, s.ln1_rstd, p->ln1_g, T, C);
    return 0;
}

/* The parameter gradients into g, from the activations and gpt_block_bwd_b's output gradients. */
static inline void gpt_block_bwd_w(const gpt_block_params* p, gpt_block_params* g, const pp_layer_io* io,
                                   gpt_block_saved s, gpt_blockz_grads gr) {
    const int C = p->C, Cl = gpt_tp_cl(p);
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;      /* (T, C) */
    const float* dy = (const float*)io->d_out[0].data;  /* (T, C) */
    gpt_matmul_bwd(NULL, g->fcproj_w, g->fcproj_b, NULL, dy, s.fcg, p->fcproj_w, T, 4 * Cl, C);
    gpt_matmul_bwd(NULL, g->fc_w, g->fc_b, NULL, gr.dfc, s.ln2, p->fc_w, T, C, 4 * Cl);
    gpt_layernorm_bwd(NULL, g->ln2_g, g->ln2_b, gr.dln2, s.x2, s.ln2_mean, s.ln2_rstd, p->ln2_g, T, C);
    gpt_matmul_bwd(NULL, g->proj_w, g->proj_b, NULL, gr.dx2, s.atty, p->proj_w, T, Cl, C);
    gpt_matmul_bwd(NULL, g->qkv_w, g->qkv_b, NULL, gr.dqkv, s.ln1, p->qkv_w, T, C, 3 * Cl);
    gpt_layernorm_bwd(NULL, g->ln1_g, g->ln1_b, gr.dln1, x, s.ln1_mean, s.ln1_rstd, p->ln1_g, T, C);
}

/* The fused block's backward (split 0): B's chain then W's, the output gradients in a workspace
   that lives only for this call (not in io->saved, which would keep them from forward to
   backward). B of the split block (split 1): B's chain alone, the output gradients kept in
   io->saved for W. */
static inline int gpt_block_bwd_run(const gpt_block_params* p, gpt_block_params* g, pp_layer_io* io, int split) {
    const int64_t T = io->mb->rows;
    const int64_t keep = split ? 0 : (int64_t)gpt_blockz_grads_floats(T, p->C, gpt_tp_cl(p));
    gpt_block_saved s;
    gpt_blockz_grads gr;
    float* ws;
    int rc = split ? gpt_blockz_prepare(p, io, &s, &gr, GPT_NEED_B | GPT_NEED_DOUT) : gpt_block_prepare(p, io, &s);
    if (!rc && !gpt_tensor_is(&io->d_out[0], io->mb->rows, p->C, PP_F32)) rc = GPT_ESHAPE;
    if (rc) return rc;
    if (!(ws = gpt_block_bwd_ws(io->mb, p->C, keep))) return GPT_ENOMEM;
    if (!split) gpt_blockz_grads_carve(&gr, ws, T, p->C, gpt_tp_cl(p));
    rc = gpt_block_bwd_b(p, io, s, gr, ws + keep);
    if (!rc && !split) gpt_block_bwd_w(p, g, io, s, gr);
    free(ws);
    return rc;
}
static inline int gpt_block_bwd_f32(const gpt_block_params* p, gpt_block_params* g, pp_layer_io* io) {
    return gpt_block_bwd_run(p, g, io, 0);
}
static inline int gpt_blockz_bwd_in_f32(const gpt_block_params* p, gpt_block_params* g, pp_layer_io* io) {
    return gpt_block_bwd_run(p, g, io, 1);
}

/* W of the split block: gpt_block_bwd_w from what B kept. */
static inline int gpt_blockz_bwd_w_f32(const gpt_block_params* p, gpt_block_params* g, pp_layer_io* io) {
    gpt_block_saved s;
    gpt_blockz_grads gr;
    int rc = gpt_blockz_prepare(p, io, &s, &gr, GPT_NEED_DOUT);
    if (!rc) gpt_block_bwd_w(p, g, io, s, gr);
    return rc;
}

static inline void gpt_blockz_desc(const gpt_block_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                                   pp_layer_desc* d) {
    gpt_block_desc(p, mb, in, n_in, d);
    d->saved_bytes = gpt_blockz_kept_floats_tp(mb->rows, p->C, gpt_tp_cl(p)) * sizeof(float);
    d->b_saved_bytes =
        gpt_blockz_bonly_floats_tp(mb->rows, gpt_tp_cl(p), gpt_tp_heads(p), gpt_seq_sq_sum(mb)) * sizeof(float);
}

/* ---- head: final LayerNorm, LM head, softmax cross-entropy -------------------------------------- */
typedef struct gpt_head_saved {
    float* loss;        /* (T) per-token loss, 0 where the target is -1 */
    float* mean;        /* (T) */
    float* rstd;        /* (T) */
    float* ln;          /* (T, C) */
    float* probs;       /* (T, V) */
} gpt_head_saved;

/* V: the vocabulary columns on this rank (gpt_head_vl). */
static inline size_t gpt_head_saved_floats(int64_t T, int C, int V) { return (size_t)T * (size_t)(3 + C + V); }
static inline int gpt_head_tp(const gpt_head_params* p) { return p->tp > 1 ? p->tp : 1; }
static inline int gpt_head_vl(const gpt_head_params* p) { return p->vocab / gpt_head_tp(p); }

static inline void gpt_head_saved_carve(gpt_head_saved* s, float* base, int64_t T, int C) {
    s->loss = base;
    s->mean = s->loss + T;
    s->rstd = s->mean + T;
    s->ln = s->rstd + T;
    s->probs = s->ln + T * C;
}

/* The per-token losses the head's forward left in io->saved: (T) floats. */
static inline const float* gpt_head_token_loss(const void* saved) { return (const float*)saved; }

static inline int gpt_head_prepare(const gpt_head_params* p, const pp_layer_io* io, gpt_head_saved* s) {
    const int64_t T = io->mb->rows;
    if (!gpt_tensor_is(&io->in[0], T, p->C, PP_F32) || !io->mb->targets) return GPT_ESHAPE;
    if (!io->saved || io->saved_bytes < gpt_head_saved_floats(T, p->C, gpt_head_vl(p)) * sizeof(float)) return GPT_ESAVED;
    gpt_head_saved_carve(s, (float*)io->saved, T, p->C);
    return 0;
}

/* The vocabulary-parallel head (tp > 1), Megatron's cross-entropy over split logits: each rank
   has V / tp of the logits; the row maxima are all-gathered (a max, exact in any order), the
   exponentials' sums and the target's logit (from the rank that has its column, 0 elsewhere)
   all-reduced in one call, so every rank gets the same loss; in backward the input gradient of
   lm (this rank's columns' share) is all-reduced before ln_f's backward. The logits and their
   exponentials are tp = 1's bits; only the sums' order differs. */
static inline int gpt_head_fwd_vp(const gpt_head_params* p, pp_layer_io* io, gpt_head_saved s) {
    const int C = p->C, V = p->vocab, tp = gpt_head_tp(p), Vl = gpt_head_vl(p), v0 = p->tp_rank * Vl;
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;              /* (T, C) */
    const int32_t* tgt = (const int32_t*)io->mb->targets;       /* (T) */
    const pp_group* g = gpt_tp_group(io);
    float *red, *mx_all, *sums; /* (T) this rank's row maxima, (tp T) every rank's, (2T) sums and target logits */
    double total = 0.0;
    int64_t t, counted = 0;
    int c, k, rc = 0;
    pp_error err;
    for (t = 0; t < T; t++)
        if (tgt[t] < -1 || tgt[t] >= V) return GPT_ETARGET;
    if (!g) return GPT_ETP;
    if (!(red = (float*)malloc(sizeof(float) * (size_t)T * (size_t)(tp + 3)))) return GPT_ENOMEM;
    mx_all = red + T;
    sums = mx_all + T * tp;
    gpt_layernorm_fwd(s.ln, s.mean, s.rstd, x, p->lnf_g, p->lnf_b, T, C);
    gpt_matmul_fwd(s.probs, s.ln, p->lm_w, p->lm_b, T, C, Vl);
    for (t = 0; t < T; t++) {
        const float* z = s.probs + t * Vl;
        float mx = z[0];
        for (c = 1; c < Vl; c++) mx = z[c] > mx ? z[c] : mx;
        red[t] = mx;
    }
    if (pp_tp_allgather(g, red, mx_all, (size_t)(T * tp), PP_F32, &err) != PP_OK) rc = GPT_ETP;
    for (t = 0; !rc && t < T; t++) {
        float* z = s.probs + t * Vl;    /* (Vl) logits in, exponentials out */
        float mx = mx_all[t], sum = 0.0f;
        for (k = 1; k < tp; k++) mx = mx_all[k * T + t] > mx ? mx_all[k * T + t] : mx;
        red[t] = mx;
        sums[T + t] = tgt[t] >= v0 && tgt[t] < v0 + Vl ? z[tgt[t] - v0] : 0.0f;
        for (c = 0; c < Vl; c++) {
            z[c] = expf(z[c] - mx);
            sum += z[c];
        }
        sums[t] = sum;
    }
    if (!rc && pp_tp_allreduce(g, sums, (size_t)(2 * T), PP_F32, &err) != PP_OK) rc = GPT_ETP;
    for (t = 0; !rc && t < T; t++) {
        float* z = s.probs + t * Vl;    /* (Vl) probabilities out */
        const float sum = sums[t], inv = 1.0f / sum;
        for (c = 0; c < Vl; c++) z[c] *= inv;
        s.loss[t] = tgt[t] >= 0 ? logf(sum) + red[t] - sums[T + t] : 0.0f;
        if (tgt[t] >= 0) {
            total += (double)s.loss[t];
            counted++;
        }
    }
    free(red);
    io->loss = counted ? (float)(total / (double)counted) : 0.0f;
    return rc;
}

static inline int gpt_head_fwd_f32(const gpt_head_params* p, pp_layer_io* io) {
    const int C = p->C, V = p->vocab;
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;              /* (T, C) */
    const int32_t* tgt = (const int32_t*)io->mb->targets;       /* (T) */
    gpt_head_saved s;
    double total = 0.0;
    int64_t t, counted = 0;
    int c, rc = gpt_head_prepare(p, io, &s);
    if (rc) return rc;
    if (gpt_head_tp(p) > 1) return gpt_head_fwd_vp(p, io, s);
    gpt_layernorm_fwd(s.ln, s.mean, s.rstd, x, p->lnf_g, p->lnf_b, T, C);
    gpt_matmul_fwd(s.probs, s.ln, p->lm_w, p->lm_b, T, C, V);
    for (t = 0; t < T; t++) {
        float* z = s.probs + t * V;     /* (V) logits in, probabilities out */
        float mx = z[0], sum = 0.0f, inv, zt;
        if (tgt[t] < -1 || tgt[t] >= V) return GPT_ETARGET;
        zt = tgt[t] >= 0 ? z[tgt[t]] : 0.0f;
        for (c = 1; c < V; c++) mx = z[c] > mx ? z[c] : mx;
        for (c = 0; c < V; c++) {
            z[c] = expf(z[c] - mx);
            sum += z[c];
        }
        inv = 1.0f / sum;
        for (c = 0; c < V; c++) z[c] *= inv;
        s.loss[t] = tgt[t] >= 0 ? logf(sum) + mx - zt : 0.0f; /* log-sum-exp: no log(0) */
        if (tgt[t] >= 0) {
            total += (double)s.loss[t];
            counted++;
        }
    }
    io->loss = counted ? (float)(total / (double)counted) : 0.0f;
    return 0;
}

static inline int gpt_head_bwd_f32(const gpt_head_params* p, gpt_head_params* g, pp_layer_io* io) {
    const int C = p->C, V = gpt_head_vl(p), v0 = p->tp_rank * V; /* this rank's columns (tp 1: all) */
    const int64_t T = io->mb->rows;
    const float* x = (const float*)io->in[0].data;              /* (T, C) */
    const int32_t* tgt = (const int32_t*)io->mb->targets;       /* (T) */
    float* dx = (float*)io->d_in[0].data;                       /* (T, C) or NULL */
    float *ws, *dz, *dln, *wt;
    gpt_head_saved s;
    float scale;
    int64_t t, counted = 0;
    int c, rc = gpt_head_prepare(p, io, &s);
    if (rc) return rc;
    for (t = 0; t < T; t++) counted += tgt[t] >= 0;
    if (!counted) return 0; /* no targets: the loss is the constant 0 */
    scale = io->mb->loss_scale / (float)counted;
    ws = (float*)calloc((size_t)T * (size_t)(V + C) + (size_t)C * V, sizeof(float));
    if (!ws) return GPT_ENOMEM;
    dz = ws;                    /* (T, V) gradient of the logits; zero rows where there is no target */
    dln = dz + T * V;           /* (T, C) gradient of the normalised input */
    wt = dln + T * C;           /* (V, C) lm_w transposed */
    for (t = 0; t < T; t++) {
        const float* pr = s.probs + t * V;  /* (V) */
        if (tgt[t] < 0) continue;
        for (c = 0; c < V; c++) dz[t * V + c] = scale * (pr[c] - (c + v0 == tgt[t] ? 1.0f : 0.0f));
    }
    gpt_matmul_bwd(dln, g->lm_w, g->lm_b, wt, dz, s.ln, p->lm_w, T, C, V);
    rc = gpt_tp_sum_n(gpt_head_tp(p), io, dln, (size_t)(T * C)); /* this rank's columns' share */
    if (!rc) gpt_layernorm_bwd(dx, g->lnf_g, g->lnf_b, dln, x, s.mean, s.rstd, p->lnf_g, T, C);
    free(ws);
    return rc;
}

static inline void gpt_head_desc(const gpt_head_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                                 pp_layer_desc* d) {
    (void)in;
    (void)n_in;
    d->n_out = 0;
    d->saved_bytes = gpt_head_saved_floats(mb->rows, p->C, gpt_head_vl(p)) * sizeof(float);
    d->cost = 3.0 * (double)mb->rows * p->C * gpt_head_vl(p);
    d->n_params = 2 * (int64_t)p->C + (int64_t)p->C * gpt_head_vl(p) + gpt_head_vl(p);
}

/* ---- parameter buffers, for checkpoints (pp_model.params: gpt_params, gptz_params) ------------------
   Each layer's buffers in struct order, sized from the config fields (also where the pointers are
   NULL: a rank that does not hold the layer). */
static inline int gpt_param_fill(pp_param* out, int cap, int n, float* const* ptr, const int64_t* count) {
    int i;
    for (i = 0; i < n && i < cap; i++) out[i] = pp_param_of(ptr[i], count[i], PP_F32);
    return n;
}
static inline int gpt_embed_param_list(const gpt_embed_params* p, pp_param* out, int cap) {
    float* const ptr[2] = {p->wte, p->wpe};
    const int64_t count[2] = {(int64_t)p->vocab * p->C, (int64_t)p->max_T * p->C};
    return gpt_param_fill(out, cap, 2, ptr, count);
}
/* A block's 12 buffers; with tensor parallelism this rank's shards (Cl = gpt_tp_cl), of which
   gpt_block_param_sharded says which are split over the TP group. */
static inline int gpt_block_param_list(const gpt_block_params* p, pp_param* out, int cap) {
    const int64_t C = p->C, Cl = gpt_tp_cl(p);
    float* const ptr[12] = {p->ln1_g, p->ln1_b, p->qkv_w, p->qkv_b, p->proj_w, p->proj_b,
                            p->ln2_g, p->ln2_b, p->fc_w,  p->fc_b,  p->fcproj_w, p->fcproj_b};
    const int64_t count[12] = {C, C, C * 3 * Cl, 3 * Cl, Cl * C, C, C, C, C * 4 * Cl, 4 * Cl, 4 * Cl * C, C};
    return gpt_param_fill(out, cap, 12, ptr, count);
}
/* 1 where gpt_block_param_list's buffer i is a TP shard (qkv_w, qkv_b, proj_w, fc_w, fc_b,
   fcproj_w), 0 where every TP rank holds it whole (LayerNorms, proj_b, fcproj_b). */
static inline int gpt_block_param_sharded(int i) { return i == 2 || i == 3 || i == 4 || i == 8 || i == 9 || i == 10; }
static inline int gpt_head_param_list(const gpt_head_params* p, pp_param* out, int cap) {
    float* const ptr[4] = {p->lnf_g, p->lnf_b, p->lm_w, p->lm_b};
    const int64_t count[4] = {p->C, p->C, (int64_t)p->C * gpt_head_vl(p), gpt_head_vl(p)};
    return gpt_param_fill(out, cap, 4, ptr, count);
}
/* 1 where gpt_head_param_list's buffer i is a TP shard (lm_w, lm_b: vocabulary-parallel). */
static inline int gpt_head_param_sharded(int i) { return i == 2 || i == 3; }
#define GPT_PARAMS(X) X(embed, gpt_embed_param_list) X(block, gpt_block_param_list) X(head, gpt_head_param_list)

/* ---- the model ---------------------------------------------------------------------------------- */
/* The layers' entry points: each runs its _f32 function on io, or on widened copies (gpt_wide). */
GPT_ACT_FWD(gpt_embed_fwd, gpt_embed_params)
GPT_ACT_BWD(gpt_embed_bwd, gpt_embed_params)
GPT_ACT_FWD(gpt_block_fwd, gpt_block_params)
GPT_ACT_FWD(gpt_blockz_fwd, gpt_block_params)
GPT_ACT_BWD(gpt_block_bwd, gpt_block_params)
GPT_ACT_BWD(gpt_blockz_bwd_in, gpt_block_params)
GPT_ACT_BWD(gpt_blockz_bwd_w, gpt_block_params)
GPT_ACT_FWD(gpt_head_fwd, gpt_head_params)
GPT_ACT_BWD(gpt_head_bwd, gpt_head_params)

#define GPT_LAYERS(X)                                                                           \
    X(embed, gpt_embed_params, gpt_embed_fwd, gpt_embed_bwd, gpt_embed_desc, 1)                  \
    X(block, gpt_block_params, gpt_block_fwd, gpt_block_bwd, gpt_block_desc, GPT_MAX_BLOCK)      \
    X(head, gpt_head_params, gpt_head_fwd, gpt_head_bwd, gpt_head_desc, 1)
PP_MODEL(gpt, GPT_LAYERS)
PP_MODEL_PARAMS(gpt, GPT_PARAMS)

/* The pp_model of a GPT with n_block blocks (1 .. GPT_MAX_BLOCK): n_block + 2 layers, the
   list's blocks beyond n_block unused. Any other n_block gives a model pp_model_check refuses. */
static inline pp_model gpt_model_desc_depth(int n_block) {
    gpt_counts n = {0};
    pp_model m;
    n.block = n_block >= 1 ? n_block : -1; /* 0 would mean the list's count */
    m = gpt_model_desc_counts(n);
    m.params = gpt_params; /* checkpoints */
    return m;
}

/* The same GPT with each block's backward split into B and W (gpt_blockz_*) for the zero-bubble
   schedules; embedding and head do both in B (PP_NO_WGRAD). gptz_model has gpt_model's layout:
   gpt_bind's weights and gradients serve both. */
#define GPTZ_LAYERS(X)                                                                                          \
    X(embed, gpt_embed_params, gpt_embed_fwd, gpt_embed_bwd, PP_NO_WGRAD, gpt_embed_desc, 1)                     \
    X(block, gpt_block_params, gpt_blockz_fwd, gpt_blockz_bwd_in, gpt_blockz_bwd_w, gpt_blockz_desc, GPT_MAX_BLOCK) \
    X(head, gpt_head_params, gpt_head_fwd, gpt_head_bwd, PP_NO_WGRAD, gpt_head_desc, 1)
PP_MODEL_SPLIT(gptz, GPTZ_LAYERS)
PP_MODEL_PARAMS(gptz, GPT_PARAMS)

static inline pp_model gptz_model_desc_depth(int n_block) {
    gptz_counts n = {0};
    pp_model m;
    n.block = n_block >= 1 ? n_block : -1;
    m = gptz_model_desc_counts(n);
    m.params = gptz_params;
    return m;
}

/* ---- parameters --------------------------------------------------------------------------------- */
static inline size_t gpt_embed_numel(const gpt_config* c) { return (size_t)(c->vocab + c->max_T) * c->C; }
static inline size_t gpt_block_numel(const gpt_config* c) { return 12 * (size_t)c->C * c->C + 13 * (size_t)c->C; }
/* One TP rank's block (tp 0 or 1: gpt_block_numel). */
static inline size_t gpt_block_numel_tp(const gpt_config* c, int tp) {
    return (size_t)gpt_block_numel_cl(c->C, c->C / (tp > 1 ? tp : 1));
}
static inline size_t gpt_head_numel(const gpt_config* c) { return (size_t)(c->C + 1) * c->vocab + 2 * (size_t)c->C; }
/* One TP rank's head (vocab / tp columns of lm). */
static inline size_t gpt_head_numel_tp(const gpt_config* c, int tp) {
    return (size_t)(c->C + 1) * (size_t)(c->vocab / (tp > 1 ? tp : 1)) + 2 * (size_t)c->C;
}
static inline size_t gpt_param_count(const gpt_config* c) {
    return gpt_embed_numel(c) + (size_t)c->n_block * gpt_block_numel(c) + gpt_head_numel(c);
}
/* One TP rank's parameters (gpt_bind_tp's layout). */
static inline size_t gpt_param_count_tp(const gpt_config* c, int tp) {
    return gpt_embed_numel(c) + (size_t)c->n_block * gpt_block_numel_tp(c, tp) + gpt_head_numel_tp(c, tp);
}

static inline int gpt_config_ok(const gpt_config* c) {
    return c->vocab > 0 && c->max_T > 0 && c->C > 0 && c->n_head > 0 && c->C % c->n_head == 0 && c->n_block >= 1 &&
           c->n_block <= GPT_MAX_BLOCK;
}

/* Sets m's config fields and points its parameters into buf (gpt_param_count floats), in layer
   order: embed, block 0 .. n_block-1, head; inside a layer in struct order. Blocks past n_block
   get their config and NULL pointers. With buf NULL only the config is set, which is all that
   describe() reads. gpt_bind_tp: TP rank tp_rank of tp (n_head % tp == 0; tp 0 or 1 is
   gpt_bind): buf holds gpt_param_count_tp floats, each block's buffers its shards. */
static inline void gpt_bind_tp(gpt_model* m, const gpt_config* c, int tp, int tp_rank, float* buf) {
    const int C = c->C, Cl = c->C / (tp > 1 ? tp : 1);
    float* q = buf;
    int b;
    memset(m, 0, sizeof *m);
    m->embed[0].vocab = c->vocab;
    m->embed[0].max_T = c->max_T;
    m->embed[0].C = C;
    for (b = 0; b < GPT_MAX_BLOCK; b++) {
        m->block[b].C = C;
        m->block[b].n_head = c->n_head;
        m->block[b].tp = tp > 1 ? tp : 1;
        m->block[b].tp_rank = tp > 1 ? tp_rank : 0;
    }
    m->head[0].C = C;
    m->head[0].vocab = c->vocab;
    m->head[0].tp = tp > 1 ? tp : 1;
    m->head[0].tp_rank = tp > 1 ? tp_rank : 0;

    if (!buf) return;
    m->embed[0].wte = q;            q += (size_t)c->vocab * C;
    m->embed[0].wpe = q;            q += (size_t)c->max_T * C;
    for (b = 0; b < c->n_block && b < GPT_MAX_BLOCK; b++) {
        gpt_block_params* k = &m->block[b];
        k->ln1_g = q;               q += C;
        k->ln1_b = q;               q += C;
        k->qkv_w = q;               q += (size_t)C * 3 * Cl;
        k->qkv_b = q;               q += 3 * Cl;
        k->proj_w = q;              q += (size_t)Cl * C;
        k->proj_b = q;              q += C;
        k->ln2_g = q;               q += C;
        k->ln2_b = q;               q += C;
        k->fc_w = q;                q += (size_t)C * 4 * Cl;
        k->fc_b = q;                q += 4 * Cl;
        k->fcproj_w = q;            q += (size_t)4 * Cl * C;
        k->fcproj_b = q;            q += C;
    }
    m->head[0].lnf_g = q;           q += C;
    m->head[0].lnf_b = q;           q += C;
    m->head[0].lm_w = q;            q += (size_t)C * (size_t)(c->vocab / (tp > 1 ? tp : 1));
    m->head[0].lm_b = q;
}
static inline void gpt_bind(gpt_model* m, const gpt_config* c, float* buf) { gpt_bind_tp(m, c, 1, 0, buf); }

/* The dtype of the tensors between m's layers and of their gradients: PP_F32 (what gpt_bind
   sets) or PP_BF16 (ACTIVATIONS IN BF16 above). Set it on the weights' model, which the layers
   and describe() read; 0, or -1 for another dtype (m unchanged). */
static inline int gpt_set_act(gpt_model* m, pp_dtype act) {
    int b;
    if (act != PP_F32 && act != PP_BF16) return -1;
#ifdef PP_TEST_NO_GPT_BF16 /* negative control of tests/test_trainer.sh: --dtype bf16 stays f32 */
    act = PP_F32;
#endif
    m->embed[0].act = m->head[0].act = act;
    for (b = 0; b < GPT_MAX_BLOCK; b++) m->block[b].act = act;
    return 0;
}

/* Layer l (numbered as in gpt_model_desc_depth(n_block)) owns *n contiguous floats from the
   returned pointer; NULL for an l outside the model. Works on weights and gradients alike. */
static inline float* gpt_layer_params(const gpt_model* m, const gpt_config* c, int l, size_t* n) {
    if (l == 0) {
        *n = gpt_embed_numel(c);
        return m->embed[0].wte;
    }
    if (l >= 1 && l <= c->n_block) {
        *n = gpt_block_numel_tp(c, m->block[l - 1].tp);
        return m->block[l - 1].ln1_g;
    }
    if (l == c->n_block + 1) {
        *n = gpt_head_numel_tp(c, m->head[0].tp);
        return m->head[0].lnf_g;
    }
    *n = 0;
    return NULL;
}

/* Deterministic generator (examples/splitmix.h), so every run and rank sees the same numbers. */
static inline uint64_t gpt_rng_next(uint64_t* s) { return splitmix_next(s); }
/* Uniform in [0, 1). */
static inline float gpt_rng_uniform(uint64_t* s) { return splitmix_uniform(s); }
/* Uniform with mean 0 and standard deviation sd. */
static inline float gpt_rng_sym(uint64_t* s, float sd) { return (2.0f * gpt_rng_uniform(s) - 1.0f) * sd * 1.7320508f; }

static inline void gpt_fill(float* p, size_t n, float sd, uint64_t* rng) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = gpt_rng_sym(rng, sd);
}
static inline void gpt_fill_const(float* p, size_t n, float v) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = v;
}

/* Allocates and binds the weights (returned; the caller frees it) with a deterministic random
   init: GPT-2's, standard deviation 0.02, the residual projections scaled by 1/sqrt(2 n_block),
   LayerNorm gains 1, biases 0. If g is non-NULL it is bound to a second, zeroed buffer returned
   in *gbuf. NULL on a bad config or no memory. */
static inline float* gpt_init(gpt_model* w, gpt_model* g, const gpt_config* c, uint64_t seed, float** gbuf) {
    const size_t n = gpt_param_count(c);
    const int C = c->C;
    const float sd = 0.02f, sd_res = 0.02f / sqrtf(2.0f * (float)c->n_block);
    float* buf;
    int b;
    if (gbuf) *gbuf = NULL;
    if (!gpt_config_ok(c)) return NULL;
    buf = (float*)calloc(n, sizeof(float));
    if (!buf) return NULL;
    gpt_bind(w, c, buf);
    gpt_fill(w->embed[0].wte, (size_t)c->vocab * C, sd, &seed);
    gpt_fill(w->embed[0].wpe, (size_t)c->max_T * C, sd, &seed);
    for (b = 0; b < c->n_block; b++) {
        gpt_block_params* k = &w->block[b];
        gpt_fill_const(k->ln1_g, (size_t)C, 1.0f);
        gpt_fill_const(k->ln2_g, (size_t)C, 1.0f);
        gpt_fill(k->qkv_w, (size_t)C * 3 * C, sd, &seed);
        gpt_fill(k->proj_w, (size_t)C * C, sd_res, &seed);
        gpt_fill(k->fc_w, (size_t)C * 4 * C, sd, &seed);
        gpt_fill(k->fcproj_w, (size_t)4 * C * C, sd_res, &seed);
    }
    gpt_fill_const(w->head[0].lnf_g, (size_t)C, 1.0f);
    gpt_fill(w->head[0].lm_w, (size_t)C * c->vocab, sd, &seed);
    if (g && gbuf) {
        *gbuf = (float*)calloc(n, sizeof(float));
        if (!*gbuf) {
            free(buf);
            return NULL;
        }
        gpt_bind(g, c, *gbuf);
    }
    return buf;
}

/* rows x n floats between a (row stride astride) and b (row stride bstride): a to b, or b to a
   when back is set. */
static inline void gpt_tp_copy_block(float* b, int bstride, float* a, int astride, int rows, int n, int back) {
    int r;
    for (r = 0; r < rows; r++) {
        float *x = a + (size_t)r * astride, *y = b + (size_t)r * bstride;
        memcpy(back ? x : y, back ? y : x, sizeof(float) * (size_t)n);
    }
}

/* TP sharding: local (bound by gpt_bind_tp, its tp and tp_rank) gets its shard of full (bound by
   gpt_bind: the tp = 1 layout), weights or gradients alike. Embedding, head, LayerNorms, proj_b
   and fcproj_b are copied whole; the heads' q, k and v columns of qkv, fc's columns, and the
   matching rows of proj_w and fcproj_w are this rank's slice (TENSOR PARALLELISM above). */
/* gpt_tp_shard, or with back set its inverse: local's shard into its place in full, and the
   whole buffers (embedding, head, LayerNorms, biases) copied to full. */
static inline void gpt_tp_place(gpt_model* local, gpt_model* full, const gpt_config* c, int back) {
    const int C = c->C, tp = local->block[0].tp > 1 ? local->block[0].tp : 1, r = local->block[0].tp_rank;
    const int Cl = C / tp;
    int b, part;
    gpt_tp_copy_block(local->embed[0].wte, 0, full->embed[0].wte, 0, 1, (int)gpt_embed_numel(c), back);
    gpt_tp_copy_block(local->head[0].lnf_g, 0, full->head[0].lnf_g, 0, 1, 2 * C, back); /* lnf_g, lnf_b */
    gpt_tp_copy_block(local->head[0].lm_w, c->vocab / tp, full->head[0].lm_w + r * (c->vocab / tp), c->vocab, C,
                      c->vocab / tp, back);
    gpt_tp_copy_block(local->head[0].lm_b, 0, full->head[0].lm_b + r * (c->vocab / tp), 0, 1, c->vocab / tp, back);
    for (b = 0; b < c->n_block; b++) {
        gpt_block_params* f = &full->block[b];
        gpt_block_params* l = &local->block[b];
        gpt_tp_copy_block(l->ln1_g, 0, f->ln1_g, 0, 1, 2 * C, back);        /* ln1_g, ln1_b */
        gpt_tp_copy_block(l->proj_b, 0, f->proj_b, 0, 1, 3 * C, back);      /* proj_b, ln2_g, ln2_b */
        gpt_tp_copy_block(l->fcproj_b, 0, f->fcproj_b, 0, 1, C, back);
        for (part = 0; part < 3; part++) { /* q, k, v: this rank's heads' columns of each */
            gpt_tp_copy_block(l->qkv_w + part * Cl, 3 * Cl, f->qkv_w + part * C + r * Cl, 3 * C, C, Cl, back);
            gpt_tp_copy_block(l->qkv_b + part * Cl, 3 * Cl, f->qkv_b + part * C + r * Cl, 3 * C, 1, Cl, back);
        }
        gpt_tp_copy_block(l->proj_w, 0, f->proj_w + (size_t)r * Cl * C, 0, 1, Cl * C, back);
        gpt_tp_copy_block(l->fc_w, 4 * Cl, f->fc_w + r * 4 * Cl, 4 * C, C, 4 * Cl, back);
        gpt_tp_copy_block(l->fc_b, 4 * Cl, f->fc_b + r * 4 * Cl, 4 * C, 1, 4 * Cl, back);
        gpt_tp_copy_block(l->fcproj_w, 0, f->fcproj_w + (size_t)r * 4 * Cl * C, 0, 1, 4 * Cl * C, back);
    }
}
static inline void gpt_tp_shard(gpt_model* local, const gpt_model* full, const gpt_config* c) {
    gpt_tp_place(local, (gpt_model*)full, c, 0); /* reads full only */
}
/* The inverse: local's shard into full (bound by gpt_bind), whose other columns and rows stay. */
static inline void gpt_tp_unshard(const gpt_model* local, gpt_model* full, const gpt_config* c) {
    gpt_tp_place((gpt_model*)local, full, c, 1); /* reads local only */
}

/* gpt_init for TP rank tp_rank of tp: gpt_init's weights (the same seed: the tp = 1 model), this
   rank's shard of them (gpt_tp_shard) in a buffer of gpt_param_count_tp floats bound to w
   (gpt_bind_tp); g and *gbuf as gpt_init's. tp 0 or 1 is gpt_init. NULL on a bad config (also
   n_head not a multiple of tp) or no memory. */
static inline float* gpt_init_tp(gpt_model* w, gpt_model* g, const gpt_config* c, int tp, int tp_rank, uint64_t seed,
                                 float** gbuf) {
    gpt_model full;
    float *fbuf, *buf;
    size_t n;
    if (tp <= 1) return gpt_init(w, g, c, seed, gbuf);
    if (gbuf) *gbuf = NULL;
    if (c->n_head % tp || c->vocab % tp || tp_rank < 0 || tp_rank >= tp || !(fbuf = gpt_init(&full, NULL, c, seed, NULL))) return NULL;
    n = gpt_param_count_tp(c, tp);
    buf = (float*)calloc(n, sizeof(float));
    if (buf && g && gbuf && !(*gbuf = (float*)calloc(n, sizeof(float)))) {
        free(buf);
        buf = NULL;
    }
    if (buf) {
        gpt_bind_tp(w, c, tp, tp_rank, buf);
        gpt_tp_shard(w, &full, c);
        if (g && gbuf) gpt_bind_tp(g, c, tp, tp_rank, *gbuf);
    }
    free(fbuf);
    return buf;
}

#endif
