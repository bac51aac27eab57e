/* tests/tlm_grid.h - what the pp x dp grid tests share (test_grid.c over threads, test_mpi.c
   over MPI, test_nccl_grid.c over the NCCL imitation): a replica's packed shard of the
   tied-embedding LM (examples/tlm.h), where each layer's parameters sit in the arena, the
   reference gradients of a grid step, and the pieces of a rank's run (its weights, the
   overlapped reduction's hook, a stage step, the check of its gradients against the
   reference). Include after examples/tlm.h. The model and batch sizes (VOCAB, DIM, NSEQ,
   MAXLEN), the steps (STEPS) and the SGD rate (LR) default to the threads and NCCL-imitation
   grids' below; test_mpi.c defines its own before the include. */
#ifndef PP_TESTS_TLM_GRID_H
#define PP_TESTS_TLM_GRID_H

#ifndef VOCAB
#define VOCAB 11
#define DIM 6
#define NSEQ 9
#define MAXLEN 6
#endif
#define MAXROWS (NSEQ * MAXLEN)
#ifndef STEPS
#define STEPS 3
#endif
#ifndef LR
#define LR 0.25f
#endif

#include <stdlib.h>
#include <string.h>

/* A replica's shard of one step: its packed sequences. */
typedef struct shard {
    int32_t tok[NSEQ * MAXLEN], tgt[NSEQ * MAXLEN], cu[NSEQ + 1];
    pp_batch b;
} shard;

/* The shard drawn from `seed` (each test derives it from the step and the replica), in m
   micro-batches (examples/tlm.h's tlm_batch). */
static inline void tlm_grid_shard(shard* s, uint64_t seed, int m) {
    (void)tlm_batch(&s->b, s->tok, s->tgt, s->cu, NSEQ, MAXLEN, VOCAB, seed, m);
}

/* Floats of layer l's parameters in the arena (tlm_layout, untied): [*off, *off + *n). */
static inline void tlm_grid_layer_range(int l, size_t* off, size_t* n) {
    size_t nE = (size_t)VOCAB * DIM, nd = (size_t)DIM * DIM + DIM;
    *off = *n = 0;
    if (l == TLM_EMBED_LAYER) {
        *n = nE;
    } else if (l <= TLM_DEPTH) {
        *off = nE + (size_t)(l - 1) * nd;
        *n = nd;
    } else if (l == TLM_HEAD_LAYER) {
        *off = nE + (size_t)TLM_DEPTH * nd;
        *n = nE;
    }
}

/* The gradient buffers of the layers of g that `rank` owns (examples/tlm.h tlm_grad_bufs). */
static inline int tlm_grid_grad_bufs(const tlm_model* g, const pp_schedule* sc, const int* first, int rank, int tied,
                                     pp_grad_buf* out) {
    return tlm_grad_bufs(g, sc, first, rank, tied, out);
}

/* Reference gradients of one grid step: every replica's sequential step of the untied model
   (its shard from seed(step, replica)), the tied copies' sum, the replicas summed in order and
   scaled by 1/dp: what every rank's gradients must equal bit for bit. */
static inline void tlm_grid_reference(const float* wa, float* gref, int step, int m, int dp, uint64_t (*seed)(int step, int replica)) {
    size_t n = tlm_param_count(VOCAB, DIM), nE = (size_t)VOCAB * DIM, i, hoff, hn;
    float* g = (float*)calloc(n, sizeof(float));
    pp_model model = tlm_model_desc();
    tlm_model w, gw;
    shard s;
    float loss;
    int d;
    tlm_grid_layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    tlm_layout(&w, (float*)(uintptr_t)wa, VOCAB, DIM, 0);
    for (d = 0; d < dp && g; d++) {
        memset(g, 0, n * sizeof(float));
        tlm_layout(&gw, g, VOCAB, DIM, 0);
        tlm_grid_shard(&s, seed(step, d), m);
        pp_sequential_step(&model, &w, &gw, &s.b, &loss, NULL);
        for (i = 0; i < nE; i++) g[i] = g[hoff + i] = g[i] + g[hoff + i];
        for (i = 0; i < n; i++) gref[i] = d == 0 ? g[i] : gref[i] + g[i];
    }
    for (i = 0; i < n; i++) gref[i] *= 1.0f / (float)dp;
    free(g);
}


/* The weights of a grid run of n_ranks ranks: the reference's (tlm_fill, seed 3), returned, and
   each rank's copy w[r] of them with zeroed gradients g[r], in which the head's copy of the tied
   embedding starts wrong (-5): the first weight sync must fix it. Free with tlm_grid_free. */
static inline float* tlm_grid_weights(float** w, float** g, int n_ranks) {
    size_t n = tlm_param_count(VOCAB, DIM), hoff, hn, i;
    float* ref = (float*)malloc(n * sizeof(float));
    int r;
    tlm_fill(ref, VOCAB, DIM, 3);
    tlm_grid_layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    for (r = 0; r < n_ranks; r++) {
        w[r] = (float*)malloc(n * sizeof(float));
        g[r] = (float*)calloc(n, sizeof(float));
        memcpy(w[r], ref, n * sizeof(float));
        for (i = 0; i < hn; i++) w[r][hoff + i] = -5.0f;
    }
    return ref;
}
static inline void tlm_grid_free(float* ref, float** w, float** g, int n_ranks) {
    int r;
    for (r = 0; r < n_ranks; r++) {
        free(w[r]);
        free(g[r]);
    }
    free(ref);
}

/* od's overlap, made the stage's grads_final hook in d: each bucket reduces as its gradients
   become final. *ov is the overlap (NULL when it failed), for pp_dp_overlap_wait and destroy. */
static inline pp_result tlm_grid_hook_overlap(const pp_dp_overlap_desc* od, pp_stage_desc* d, pp_dp_overlap** ov,
                                              pp_error* err) {
    pp_result rc = pp_dp_overlap_create(od, ov, err);
    d->grads_final = pp_dp_overlap_hook;
    d->grads_final_user = *ov;
    return rc;
}

/* One step of a grid rank's stage: its gradient arena garena zeroed, the shard drawn from seed
   in m micro-batches, the step (stats may be NULL); on failure err holds the stage's message. */
static inline pp_result tlm_grid_stage_step(pp_stage* st, float* garena, shard* s, uint64_t seed, int m,
                                            pp_step_stats* stats, pp_error* err) {
    pp_result rc;
    memset(garena, 0, tlm_param_count(VOCAB, DIM) * sizeof(float));
    tlm_grid_shard(s, seed, m);
    if ((rc = pp_stage_step(st, &s->b, stats)) != PP_OK) snprintf(err->msg, sizeof err->msg, "%s", pp_stage_error(st));
    return rc;
}

/* After a grid step: the gradients g of the layers `rank` owns (sc, first) compared with the
   reference's gref bit for bit (each layer that differs counted in *bad, described in msg if it
   is still empty), then an SGD step of rate LR on the run's weights w and on the reference's wref. */
static inline void tlm_grid_check_sgd(float* w, const float* g, float* wref, const float* gref, const pp_schedule* sc,
                                      const int* first, int rank, int step, int* bad, char* msg, size_t cap) {
    size_t n = tlm_param_count(VOCAB, DIM), off, cnt, i;
    int l;
    for (l = 0; l <= TLM_HEAD_LAYER; l++) {
        tlm_grid_layer_range(l, &off, &cnt);
        if (cnt && pp_schedule_layer_rank(sc, first, l) == rank && memcmp(g + off, gref + off, cnt * sizeof(float))) {
            (*bad)++;
            if (!msg[0]) snprintf(msg, cap, "step %d: layer %d's gradient differs", step, l);
        }
    }
    for (i = 0; i < n; i++) {
        w[i] -= LR * g[i];
        wref[i] -= LR * gref[i];
    }
}

#endif
