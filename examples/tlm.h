/* examples/tlm.h - a tiny language model with TIED embedding and output head, as a pipeline.h
   layer list: token embedding E (V, C), TLM_DEPTH tanh dense layers, a head whose logits are
   x E^T, and a cross-entropy loss. Used by tests/test_mpi.c, examples/tlm_mpi.c, bench/bench_mpi.c.
   Include after pipeline.h. All functions are static: include it from one file per program.
   What to copy: a layer list whose weights are shared by two layers on different stages.

   Tying across a pipeline: the embedding sits on the first stage and the head on the last, so
   each keeps its own copy of E (tlm_embed.E and tlm_head.E point to different buffers); the
   copies start identical (pp_tied_sync_weights) and their gradients are summed across the two
   ranks after each step (pp_tied_sum_grads), so identical optimizer updates keep them
   identical. Pointing both at one buffer (and both gradients at one buffer) gives the truly
   tied single-process model: tlm_init(..., tied = 1). */
#ifndef PP_EXAMPLE_TLM_H
#define PP_EXAMPLE_TLM_H

#include "mlp.h" /* dense_params/dense_*, xent_params/xent_*, mlp_rng_* */

#ifndef TLM_DEPTH
#define TLM_DEPTH 6
#endif

typedef struct tlm_embed_params {
    int vocab, dim;
    float* E;               /* (vocab, dim) */
    int fail_mb;            /* tests: forward of this micro-batch fails (-1: never) */
} tlm_embed_params;

typedef struct tlm_head_params {
    int vocab, dim;
    float* E;               /* (vocab, dim): the embedding's copy (or the embedding itself) */
    int fail_mb;
} tlm_head_params;

static int tlm_embed_fwd(const tlm_embed_params* p, pp_layer_io* io) {
    const int32_t* tok = (const int32_t*)io->in[0].data;   /* (rows, 1) */
    float* y = (float*)io->out[0].data;                    /* (rows, dim) */
    int64_t r;
    if (io->mb->index == p->fail_mb) return 7;
    for (r = 0; r < io->in[0].rows; r++) {
        if (tok[r] < 0 || tok[r] >= p->vocab) return 8;
        memcpy(y + r * p->dim, p->E + (size_t)tok[r] * p->dim, sizeof(float) * (size_t)p->dim);
    }
    return 0;
}

static int tlm_embed_bwd(const tlm_embed_params* p, tlm_embed_params* g, pp_layer_io* io) {
    const int32_t* tok = (const int32_t*)io->in[0].data;   /* (rows, 1) */
    const float* dy = (const float*)io->d_out[0].data;     /* (rows, dim) */
    int64_t r;
    int c;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < p->dim; c++) g->E[(size_t)tok[r] * p->dim + c] += dy[r * p->dim + c];
    return 0;
}

static void tlm_embed_desc(const tlm_embed_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                           pp_layer_desc* d) {
    (void)n_in;
    mlp_desc_out(d, in[0].rows, p->dim);
    d->cost = (double)mb->rows * p->dim;
    d->n_params = (int64_t)p->vocab * p->dim;
}

static int tlm_head_fwd(const tlm_head_params* p, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;         /* (rows, dim) */
    float* z = (float*)io->out[0].data;                    /* (rows, vocab) */
    int64_t r;
    int v, c;
    if (io->mb->index == p->fail_mb) return 9;
    for (r = 0; r < io->in[0].rows; r++)
        for (v = 0; v < p->vocab; v++) {
            float s = 0;
            for (c = 0; c < p->dim; c++) s += x[r * p->dim + c] * p->E[(size_t)v * p->dim + c];
            z[r * p->vocab + v] = s;
        }
    return 0;
}

static int tlm_head_bwd(const tlm_head_params* p, tlm_head_params* g, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;         /* (rows, dim) */
    const float* dz = (const float*)io->d_out[0].data;     /* (rows, vocab) */
    float* dx = (float*)io->d_in[0].data;                  /* (rows, dim) */
    int64_t r;
    int v, c;
    for (r = 0; r < io->in[0].rows; r++)
        for (v = 0; v < p->vocab; v++) {
            const float d = dz[r * p->vocab + v];
            for (c = 0; c < p->dim; c++) {
                g->E[(size_t)v * p->dim + c] += d * x[r * p->dim + c];
                dx[r * p->dim + c] += d * p->E[(size_t)v * p->dim + c];
            }
        }
    return 0;
}

static void tlm_head_desc(const tlm_head_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                          pp_layer_desc* d) {
    (void)n_in;
    mlp_desc_out(d, in[0].rows, p->vocab);
    d->cost = (double)mb->rows * p->dim * p->vocab * 3.0;
    d->n_params = 0; /* counted once, by the embedding */
}

#define TLM_LAYERS(X)                                                                  \
    X(embed, tlm_embed_params, tlm_embed_fwd, tlm_embed_bwd, tlm_embed_desc, 1)        \
    X(dense, dense_params, dense_fwd, dense_bwd, dense_desc, TLM_DEPTH)                \
    X(head, tlm_head_params, tlm_head_fwd, tlm_head_bwd, tlm_head_desc, 1)             \
    X(xent, xent_params, xent_fwd, xent_bwd, xent_desc, 1)
PP_MODEL(tlm, TLM_LAYERS)

enum { TLM_EMBED_LAYER = 0, TLM_HEAD_LAYER = TLM_DEPTH + 1 };

/* Floats in one parameter arena: E, the dense layers, the head's copy of E (also when tied). */
static inline size_t tlm_param_count(int vocab, int dim) {
    return (size_t)vocab * dim * 2 + (size_t)TLM_DEPTH * ((size_t)dim * dim + dim);
}

/* Lays out w over arena (tlm_param_count floats) and fills it from seed (arena NULL: layout
   only, for gradients: g gets the same layout over its own zeroed arena). tied = 1 points the
   head at the embedding's E (a single-process tied model); else the head's copy is a copy. */
static inline void tlm_layout(tlm_model* w, float* arena, int vocab, int dim, int tied) {
    size_t off = 0;
    int l;
    w->embed[0].vocab = vocab;
    w->embed[0].dim = dim;
    w->embed[0].E = arena;
    w->embed[0].fail_mb = -1;
    off += (size_t)vocab * dim;
    for (l = 0; l < TLM_DEPTH; l++) {
        w->dense[l].in = w->dense[l].out = dim;
        w->dense[l].tanh_act = 1;
        w->dense[l].w = arena + off;
        w->dense[l].b = arena + off + (size_t)dim * dim;
        off += (size_t)dim * dim + dim;
    }
    w->head[0].vocab = vocab;
    w->head[0].dim = dim;
    w->head[0].E = tied ? arena : arena + off;
    w->head[0].fail_mb = -1;
    w->xent[0].classes = vocab;
}

/* The gradient buffers (pipeline.h >>grad: pp_dp_overlap, pp_grad_norm) of the layers of g (laid
   out by tlm_layout) that `rank` owns under (sc, first), or of every layer for rank < 0, in
   layer order: the embedding's E, each dense layer's w then b, the head's E (tied = 1 marks it
   the embedding's second copy, tied_copy). out holds 2 * TLM_DEPTH + 2 entries; returns how
   many it filled. */
static inline int tlm_grad_bufs(const tlm_model* g, const pp_schedule* sc, const int* first, int rank, int tied,
                                pp_grad_buf* out) {
    int l, n = 0;
    size_t nE = (size_t)g->embed[0].vocab * g->embed[0].dim, dim = (size_t)g->embed[0].dim;
    for (l = 0; l <= TLM_HEAD_LAYER; l++) {
        pp_grad_buf b;
        if (rank >= 0 && pp_schedule_layer_rank(sc, first, l) != rank) continue;
        memset(&b, 0, sizeof b);
        b.layer = l;
        b.dtype = PP_F32;
        if (l == TLM_EMBED_LAYER || l == TLM_HEAD_LAYER) {
            b.data = l == TLM_EMBED_LAYER ? g->embed[0].E : g->head[0].E;
            b.count = nE;
            b.tied_copy = l == TLM_HEAD_LAYER && tied;
            out[n++] = b;
        } else {
            b.data = g->dense[l - 1].w;
            b.count = dim * dim;
            out[n++] = b;
            b.data = g->dense[l - 1].b;
            b.count = dim;
            out[n++] = b;
        }
    }
    return n;
}

/* A pp_dp_overlap_desc (pipeline.h >>grad) for the LM on `rank` of a pipeline under (sc, first):
   its gradient buffers (tlm_grad_bufs into bufs, 2 * TLM_DEPTH + 2 entries), and with tied
   non-NULL the embedding and the head as the tied layers, summed over tied between ranks
   pair[0] and pair[1]. Zeroed first: the data-parallel group (od->dp), the scale and the
   bucket size are the caller's to set. */
static inline void tlm_overlap_desc(pp_dp_overlap_desc* od, const tlm_model* g, const pp_schedule* sc, const int* first,
                                    int rank, const pp_transport* tied, const int* pair, pp_grad_buf* bufs) {
    memset(od, 0, sizeof *od);
    od->n_bufs = tlm_grad_bufs(g, sc, first, rank, 1, bufs);
    od->bufs = bufs;
    od->partition = first;
    od->n_stages = sc->n_stages;
    od->tied = tied;
    if (tied) {
        od->tied_pair[0] = pair[0];
        od->tied_pair[1] = pair[1];
    }
    od->tied_layers[0] = TLM_EMBED_LAYER;
    od->tied_layers[1] = TLM_HEAD_LAYER;
    od->coalesce = 1; /* every rank lays its gradients over one arena alike (tlm_layout) */
}

static inline void tlm_fill(float* arena, int vocab, int dim, uint64_t seed) {
    size_t n = tlm_param_count(vocab, dim), i, nE = (size_t)vocab * dim, off = nE;
    int l;
    for (i = 0; i < nE; i++) arena[i] = (2.0f * mlp_rng_uniform(&seed) - 1.0f) * 0.5f;
    for (l = 0; l < TLM_DEPTH; l++) {
        float sc = 1.2f / sqrtf((float)dim);
        for (i = 0; i < (size_t)dim * dim; i++) arena[off + i] = (2.0f * mlp_rng_uniform(&seed) - 1.0f) * sc;
        for (i = 0; i < (size_t)dim; i++) arena[off + (size_t)dim * dim + i] = 0.01f * (float)(i % 3);
        off += (size_t)dim * dim + dim;
    }
    for (i = 0; i < nE; i++) arena[off + i] = arena[i]; /* the head's copy starts identical */
    (void)n;
}

/* Packed sequences of a toy language: each sequence counts up from a random start modulo
   vocab, with occasional jumps; targets are the next token (the last token of a sequence
   predicts its own start, so each row has a target). lens[] from 1..max_len. Returns rows. */
static inline int tlm_make_batch(int32_t* tok, int32_t* tgt, int32_t* cu, int n_seqs, int max_len, int vocab,
                                 uint64_t seed) {
    int s, t, rows = 0;
    cu[0] = 0;
    for (s = 0; s < n_seqs; s++) {
        int len = 1 + (int)(mlp_rng_next(&seed) % (uint64_t)max_len);
        int start = (int)(mlp_rng_next(&seed) % (uint64_t)vocab), cur = start;
        for (t = 0; t < len; t++) {
            int next = (mlp_rng_next(&seed) % 8 == 0) ? (int)(mlp_rng_next(&seed) % (uint64_t)vocab) : (cur + 1) % vocab;
            tok[rows + t] = cur;
            tgt[rows + t] = t + 1 < len ? next : start;
            cur = next;
        }
        rows += len;
        cu[s + 1] = rows;
    }
    return rows;
}

/* The same batch drawn into tok/tgt/cu and described in *b: n_seqs packed sequences (int32
   tokens, one column), int32 targets, m micro-batches balanced by tokens (unequal sizes, so
   every transfer has its own). Returns rows. */
static inline int tlm_batch(pp_batch* b, int32_t* tok, int32_t* tgt, int32_t* cu, int n_seqs, int max_len, int vocab,
                            uint64_t seed, int m) {
    int rows = tlm_make_batch(tok, tgt, cu, n_seqs, max_len, vocab, seed);
    memset(b, 0, sizeof *b);
    b->m = m;
    b->input.data = tok;
    b->input.rows = rows;
    b->input.cols = 1;
    b->input.dtype = PP_I32;
    b->targets = tgt;
    b->target_row_bytes = sizeof(int32_t);
    b->cu_seqlens = cu;
    b->n_seqs = n_seqs;
    b->split = PP_SPLIT_TOKENS;
    return rows;
}

#endif
