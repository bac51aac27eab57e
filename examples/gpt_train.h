/* examples/gpt_train.h - what the two CPU GPT programs share: their options, the packed batches
   of every step, and the optimizer. examples/gpt_cpu.c runs them through threads in one
   process (pp_pipeline), examples/gpt_mpi.c with one process per rank (pp_stage over MPI).
   What to copy: an elementwise optimizer over one flat parameter buffer, applied whole (one
   process) or to the layers a rank owns (one process per rank): the same bits either way; a
   learning rate that is a function of the step alone (warm-up, then cosine), so that a resumed
   run continues it from the checkpoint's step; a held-out split evaluated with forward-only
   steps. docs/training.md walks through the loop. Include after gpt.h and gpt_data.h.
   Everything is static inline. */
#ifndef PP_EXAMPLE_GPT_TRAIN_H
#define PP_EXAMPLE_GPT_TRAIN_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_loop.h"
#include "gpt_traffic.h"

typedef struct gpt_opts {
    pp_schedule_kind kind;
    int p, v, m, steps, seqs, max_len, dim, heads, layers;
    float lr;               /* --lr: the peak learning rate */
    float lr_min;           /* --lr-min X: where the cosine ends (default --lr: no decay) */
    int warmup;             /* --warmup N: linear warm-up over the first N steps (0: none) */
    float wd;               /* --wd X: decoupled weight decay on the matrices (AdamW; 0: none) */
    int sgd;                /* 0: Adam, 1: SGD with momentum 0.9 */
    float clip;             /* --clip X: clip the global gradient norm at X before the update (0: off) */
    pp_dtype dtype;         /* --dtype f32|bf16: the activations between layers and their gradients
                               (gpt_set_act); weights and optimizer state are f32 either way */
    const char* text;
    const char* trace;      /* gpt_cpu: Chrome trace of the last step */
    const char* save;       /* --save FILE: a checkpoint after the last step */
    const char* resume;     /* --resume FILE: start from a checkpoint, at its step */
    int generated, check;
    int check_resume;       /* gpt_cpu --check-resume */
    int eval_every;         /* --eval-every N: the held-out loss every N steps and after the last (0: off) */
    int eval_seqs;          /* --eval-seqs N: held-out documents per evaluation (default 128) */
    int recompute;          /* --recompute K: recompute every K-th block's activations (0: none) */
    pp_split_policy split;
    int tp;                 /* --tp N: tensor-parallel ranks per stage (gpt_mpi; 0: not given, as 1) */
    int tp_whole;           /* --tp-whole (gpt_mpi): every boundary whole to each TP rank, not split */
} gpt_opts;

/* The GPT for a schedule: blocks with their backward split into B and W (gptz, examples/gpt.h)
   where the schedule has W actions (the zero-bubble and controllable-memory kinds), so that W
   can fill the bubbles and the attention probabilities go at B; else the fused blocks. */
static inline pp_model gpt_model_for(pp_schedule_kind kind, int layers) {
    int v = pp_schedule_kind_v(kind, 2);
    int has_w = v > 0 && pp_schedule_size(kind, 2, v, 2) == (size_t)(3 * 2 * v * 2);
    return has_w ? gptz_model_desc_depth(layers) : gpt_model_desc_depth(layers);
}

static inline void gpt_opts_usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v|zb-h2|v-half|v-min|dualpipev] [-p P] [-v V]\n"
            "       [-m M] [--steps N]\n"
            "       [--text FILE | --generated] [--seqs-per-step S] [--max-len L] [--dim C] [--heads H]\n"
            "       [--layers N] [--lr LR] [--lr-min LR] [--warmup N] [--wd X] [--optim adam|sgd] [--clip X]\n"
            "       [--eval-every N] [--eval-seqs N] [--split seqs|tokens|cost] [--dtype f32|bf16] [--trace FILE]\n"
            "       [--recompute K] [--check] [--save FILE] [--resume FILE] [--check-resume] [--tp N]\n"
            "       [--tp-whole]\n",
            prog);
}

/* Options; 0 on success. p may change afterwards (gpt_mpi: the number of processes); then call
   gpt_opts_check, which also picks the default depth. */
static inline int gpt_opts_parse(int argc, char** argv, gpt_opts* c) {
    static const gpt_opts defaults = {.kind = PP_SCHED_1F1B, .p = 4, .m = 8, .steps = 60, .seqs = 32, .max_len = 128,
                                      .dim = 64, .heads = 4, .eval_seqs = 128, .split = PP_SPLIT_TOKENS,
                                      .lr = -1, .lr_min = -1}; /* set below: from the optimizer, and from lr */
    int i;
    *c = defaults;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!strcmp(a, "--generated")) { c->generated = 1; continue; }
        if (!strcmp(a, "--check-resume")) { c->check_resume = 1; continue; }
        if (!strcmp(a, "--tp-whole")) { c->tp_whole = 1; continue; }
        if (!val) return 1;
        if (!strcmp(a, "--schedule") || !strcmp(a, "-s")) {
            if (pp_schedule_kind_parse(val, &c->kind) != PP_OK) { fprintf(stderr, "unknown schedule '%s'\n", val); return 1; }
        } else if (!strcmp(a, "-p")) c->p = atoi(val);
        else if (!strcmp(a, "-v")) c->v = atoi(val);
        else if (!strcmp(a, "-m")) c->m = atoi(val);
        else if (!strcmp(a, "--steps")) c->steps = atoi(val);
        else if (!strcmp(a, "--text")) c->text = val;
        else if (!strcmp(a, "--trace")) c->trace = val;
        else if (!strcmp(a, "--save")) c->save = val;
        else if (!strcmp(a, "--resume")) c->resume = val;
        else if (!strcmp(a, "--seqs-per-step")) c->seqs = atoi(val);
        else if (!strcmp(a, "--max-len")) c->max_len = atoi(val);
        else if (!strcmp(a, "--dim")) c->dim = atoi(val);
        else if (!strcmp(a, "--heads")) c->heads = atoi(val);
        else if (!strcmp(a, "--layers")) c->layers = atoi(val);
        else if (!strcmp(a, "--lr")) c->lr = (float)atof(val);
        else if (!strcmp(a, "--clip")) c->clip = (float)atof(val);
        else if (!strcmp(a, "--lr-min")) c->lr_min = (float)atof(val);
        else if (!strcmp(a, "--warmup")) c->warmup = atoi(val);
        else if (!strcmp(a, "--wd")) c->wd = (float)atof(val);
        else if (!strcmp(a, "--eval-every")) c->eval_every = atoi(val);
        else if (!strcmp(a, "--eval-seqs")) c->eval_seqs = atoi(val);
        else if (!strcmp(a, "--recompute")) c->recompute = atoi(val);
        else if (!strcmp(a, "--tp")) c->tp = atoi(val);
        else if (!strcmp(a, "--optim")) {
            if (!strcmp(val, "adam")) c->sgd = 0;
            else if (!strcmp(val, "sgd")) c->sgd = 1;
            else { fprintf(stderr, "unknown optimizer '%s'\n", val); return 1; }
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(val, "f32")) c->dtype = PP_F32;
            else if (!strcmp(val, "bf16")) c->dtype = PP_BF16;
            else { fprintf(stderr, "unknown --dtype '%s' (f32 or bf16)\n", val); return 1; }
        } else if (!strcmp(a, "--split")) {
            if (!strcmp(val, "seqs")) c->split = PP_SPLIT_SEQS;
            else if (!strcmp(val, "tokens")) c->split = PP_SPLIT_TOKENS;
            else if (!strcmp(val, "cost")) c->split = PP_SPLIT_COST;
            else { fprintf(stderr, "unknown split '%s'\n", val); return 1; }
        } else return 1;
        i++;
    }
    if (c->lr < 0) c->lr = c->sgd ? 0.1f : 3e-3f;
    if (c->lr_min < 0) c->lr_min = c->lr;
    return gpt_loop_check(c->lr_min, c->warmup, c->wd, c->clip, c->eval_every, c->eval_seqs);
}

/* v from the schedule, the depth (4 blocks, or enough for p*v stages), and the ranges. */
static inline int gpt_opts_check(gpt_opts* c) {
    c->v = pp_schedule_kind_v(c->kind, c->v == 0 ? 2 : c->v);
    if (c->layers == 0) c->layers = c->p * c->v - 2 > 4 ? c->p * c->v - 2 : 4;
    if (c->p < 1 || c->v < 1 || c->p * c->v > PP_MAX_RANKS || c->m < 1 || c->steps < 1 || c->max_len < 12 ||
        c->recompute < 0) {
        fprintf(stderr, "need p, v, m, steps >= 1 (p*v <= %d), max-len >= 12 and --recompute >= 0\n", PP_MAX_RANKS);
        return 1;
    }
    if (c->seqs < c->m) {
        fprintf(stderr, "--seqs-per-step %d < m = %d: every micro-batch needs a whole sequence\n", c->seqs, c->m);
        return 1;
    }
    if (c->layers < 1 || c->layers > GPT_MAX_BLOCK || c->dim < 1 || c->heads < 1 || c->dim % c->heads) {
        fprintf(stderr, "--layers must be 1..%d and --dim a multiple of --heads\n", GPT_MAX_BLOCK);
        return 1;
    }
    if (c->tp < 0 || c->tp > PP_MAX_RANKS || (c->tp > 1 && (c->heads % c->tp || GPT_DATA_VOCAB % c->tp))) {
        fprintf(stderr, "--tp %d: the heads (--heads %d) and the vocabulary (%d) must split evenly over the TP ranks (1..%d)\n",
                c->tp, c->heads, GPT_DATA_VOCAB, PP_MAX_RANKS);
        return 1;
    }
    if (c->layers + 2 < c->p * c->v) {
        fprintf(stderr, "%d stages (p*v) need at least %d layers: use --layers %d or more\n", c->p * c->v, c->p * c->v,
                c->p * c->v - 2);
        return 1;
    }
    return 0;
}

/* The text: --text FILE, else README.md in the current directory, else the generated task. */
static inline int gpt_opts_corpus(const gpt_opts* c, gpt_corpus* corpus) {
    memset(corpus, 0, sizeof *corpus);
    errno = 0;
    if (c->text) {
        if (!gpt_corpus_load(corpus, c->text, c->max_len, 7)) return 0;
        fprintf(stderr, "cannot use '%s': %s\n", c->text, errno ? strerror(errno) : "no document of 2+ bytes");
        return 1;
    }
    if (!c->generated && !gpt_corpus_load(corpus, "README.md", c->max_len, 7)) return 0;
    if (!gpt_corpus_generate(corpus, 4000, c->max_len, 7)) return 0;
    fprintf(stderr, "cannot generate the corpus\n");
    return 1;
}

/* One step's packed batch, and what its split into micro-batches saves against padding. */
typedef struct gpt_step {
    int32_t* tokens;        /* (T) */
    int32_t* targets;       /* (T) */
    int32_t* cu;            /* (n_seqs + 1) */
    int T, n_seqs;
    int64_t pad_saved;      /* sum over micro-batches of n_seqs * max_seqlen - rows */
    int64_t padded;         /* sum over micro-batches of n_seqs * max_seqlen */
    double imbalance;       /* max / mean tokens over micro-batches */
} gpt_step;

static inline pp_batch gpt_step_batch(const gpt_opts* c, const gpt_step* sd) {
    pp_batch b;
    memset(&b, 0, sizeof b);
    b.m = c->m;
    b.input.data = sd->tokens;
    b.input.rows = sd->T;
    b.input.cols = 1;
    b.input.dtype = PP_I32;
    b.targets = sd->targets;
    b.target_row_bytes = sizeof(int32_t);
    b.cu_seqlens = sd->cu;
    b.n_seqs = sd->n_seqs;
    b.loss = PP_LOSS_MEAN_ROWS; /* micro-batches weigh by tokens, not equally */
    b.split = c->split;
    return b;
}

static inline void gpt_steps_free(gpt_step* s, int n) {
    int i;
    for (i = 0; s && i < n; i++) {
        free(s[i].tokens);
        free(s[i].targets);
        free(s[i].cu);
    }
    free(s);
}

/* Packs every step's batch up front and measures its split; NULL when out of memory. */
static inline gpt_step* gpt_steps_make(const gpt_opts* c, const gpt_corpus* corpus) {
    gpt_step* steps = (gpt_step*)calloc((size_t)c->steps, sizeof *steps);
    pp_microbatch* mbs = (pp_microbatch*)calloc((size_t)c->m, sizeof *mbs);
    int32_t* cu = (int32_t*)calloc((size_t)(c->seqs + c->m), sizeof *cu);
    uint64_t rng = 2024;
    pp_error err;
    int step, i, ok = steps && mbs && cu;
    for (step = 0; ok && step < c->steps; step++) {
        gpt_step* sd = &steps[step];
        pp_batch b;
        int64_t mx = 0;
        sd->tokens = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->seqs * (size_t)c->max_len);
        sd->targets = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->seqs * (size_t)c->max_len);
        sd->cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(c->seqs + 1));
        if (!(ok = sd->tokens && sd->targets && sd->cu)) break;
        sd->T = gpt_pack(corpus, &rng, c->seqs, sd->tokens, sd->targets, sd->cu);
        sd->n_seqs = c->seqs;
        b = gpt_step_batch(c, sd);
        if (!(ok = pp_batch_split(&b, mbs, cu, &err) == PP_OK)) {
            fprintf(stderr, "split: %s\n", err.msg);
            break;
        }
        for (i = 0; i < c->m; i++) {
            sd->padded += (int64_t)mbs[i].n_seqs * mbs[i].max_seqlen;
            sd->pad_saved += (int64_t)mbs[i].n_seqs * mbs[i].max_seqlen - mbs[i].rows;
            if (mbs[i].rows > mx) mx = mbs[i].rows;
        }
        sd->imbalance = (double)mx / ((double)sd->T / c->m);
    }
    free(mbs);
    free(cu);
    if (!ok) {
        gpt_steps_free(steps, c->steps);
        return NULL;
    }
    return steps;
}

/* The learning rate of step (counted from 0): gpt_lr_at (examples/gpt_loop.h) with --lr,
   --lr-min, --warmup and --steps (the whole run's, also when resuming). The defaults (no
   warm-up, --lr-min = --lr) give every step --lr, bit for bit. */
static inline float gpt_lr(const gpt_opts* c, int step) {
    return gpt_lr_at(c->lr, c->lr_min, c->warmup, c->steps, step);
}

/* Adam (or SGD with momentum) on n parameters w with gradients g and moments m1, m2 at step
   (from 0; its rate is gpt_lr's), with AdamW's decoupled weight decay (--wd) where decay[i] is
   set (NULL: nowhere): w *= 1 - lr * wd before the update, as torch.optim.AdamW does. Zeroes g
   for the next step. Elementwise, so updating a buffer in pieces (the layers a rank owns)
   gives the same bits as updating it whole. */
static inline void gpt_optimize(const gpt_opts* c, float* w, float* g, float* m1, float* m2, const unsigned char* decay,
                                size_t n, int step) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
    const float lr = gpt_lr(c, step), keep = 1.0f - lr * c->wd;
    const int wd = c->wd > 0 && decay;
    size_t i;
    for (i = 0; i < n; i++) {
        if (wd && decay[i]) w[i] *= keep;
        if (c->sgd) {
            m1[i] = 0.9f * m1[i] + g[i];
            w[i] -= lr * m1[i];
        } else {
            m1[i] = b1 * m1[i] + (1.0f - b1) * g[i];
            m2[i] = b2 * m2[i] + (1.0f - b2) * g[i] * g[i];
            w[i] -= lr * (m1[i] / c1) / (sqrtf(m2[i] / c2) + eps);
        }
        g[i] = 0.0f;
    }
}

/* The summary both programs print: first and last losses, tokens per second, packing. */
static inline void gpt_report(const gpt_opts* c, const gpt_step* steps, const float* loss, double wall) {
    int64_t tokens = 0, saved = 0, padded = 0;
    double imb = 0, first = 0, last = 0;
    int step, s = c->steps < 5 ? c->steps : 5;
    for (step = 0; step < c->steps; step++) {
        tokens += steps[step].T;
        saved += steps[step].pad_saved;
        padded += steps[step].padded;
        imb += steps[step].imbalance / c->steps;
    }
    for (step = 0; step < s; step++) {
        first += loss[step] / s;
        last += loss[c->steps - 1 - step] / s;
    }
    printf("loss %.4f -> %.4f (mean of the first and last %d steps)\n", first, last, s);
    printf("%lld tokens in %.2f s: %.0f tokens/s; packing saved %lld of %lld padded tokens (%.1f%%); "
           "micro-batch tokens max/mean %.3f on average\n",
           (long long)tokens, wall, (double)tokens / wall, (long long)saved, (long long)padded,
           padded ? 100.0 * (double)saved / (double)padded : 0.0, imb);
}

/* One step's progress line (printed by whoever holds the loss): the step of --steps, the loss,
   the rate it trained at, tokens and tokens/s of the step (t_step: its wall time), what packing
   saved, and the gradient norm before clipping where norm >= 0 (--clip). */
static inline void gpt_step_print(const gpt_opts* c, int step, float loss, const gpt_step* sd, double t_step, double norm) {
    gpt_loop_print_step(step, c->steps, loss, gpt_lr(c, step), sd->T, t_step);
    printf("  padding saved %5lld of %5lld (%4.1f%%)  mb tokens max/mean %.2f", (long long)sd->pad_saved, (long long)sd->padded,
           sd->padded ? 100.0 * (double)sd->pad_saved / (double)sd->padded : 0.0, sd->imbalance);
    if (norm >= 0) printf("  grad norm %.4f", norm);
    printf("\n");
    fflush(stdout);
}


/* What both programs set up the same way: the text, every step's batch, the model's weights,
   gradients (gpt_init's layout), the optimizer's moments, and the partition's sample. */
typedef struct gpt_trainer {
    gpt_config gc;
    gpt_corpus corpus;          /* the training documents: the text's, less the held-out ones */
    gpt_corpus held;            /* the held-out split: every GPT_HOLD_OUT-th document, never trained on */
    gpt_step* steps;
    gpt_step* val;              /* (n_val) --eval-every: the held-out batches, documents in order */
    float* val_loss;            /* (n_val) each held-out batch's loss in the last evaluation */
    int n_val, val_docs;
    gpt_model w, g, gref;
    gpt_model mw1, mw2;         /* the optimizer's moments m1, m2 bound like the weights (checkpoints) */
    const void* moments[2];     /* &mw1, &mw2 */
    float *wbuf, *gbuf, *grefbuf, *m1, *m2;
    unsigned char* decay;       /* (n_params) 1 where --wd decays: gpt_decay_mask */
    float* loss;                /* (steps) */
    float ref_loss;             /* --check: the sequential reference's step-0 loss */
    size_t n_params;
    double mean_len, attn_len;
    pp_tensor sample;           /* one sequence of the corpus' attention length (the cost partition) */
    int tp, tp_rank;            /* tensor parallelism (gpt_trainer_init_tp): every buffer above is TP
                                   rank tp_rank's shard layout (gpt_bind_tp); 1, 0 without */
} gpt_trainer;

static inline void gpt_trainer_free(gpt_trainer* T, const gpt_opts* c) {
    gpt_steps_free(T->steps, c->steps);
    gpt_steps_free(T->val, T->n_val);
    free(T->val_loss);
    free(T->decay);
    free(T->wbuf);
    free(T->gbuf);
    free(T->grefbuf);
    free(T->m1);
    free(T->m2);
    free(T->loss);
    gpt_corpus_free(&T->corpus);
    gpt_corpus_free(&T->held);
    memset(T, 0, sizeof *T);
}

/* Where --wd decays: the matrices (token and position embeddings, attention and MLP weights,
   the LM head), not the biases and LayerNorm gains, as llm.c and GPT-2's recipes do. One flag
   per parameter of gpt_init's layout. */
static inline void gpt_decay_mask(const gpt_trainer* T, unsigned char* mask) {
    const gpt_model* w = &T->w;
    const size_t C = (size_t)T->gc.C, V = (size_t)T->gc.vocab;
    const size_t Cl = C / (size_t)(T->tp > 1 ? T->tp : 1); /* a TP rank's share (tp 0: a T set up by hand) */
    int b;
#define GPT_DECAY(ptr, n) memset(mask + ((ptr) - T->wbuf), 1, (n))
    memset(mask, 0, T->n_params);
    GPT_DECAY(w->embed[0].wte, V * C);
    GPT_DECAY(w->embed[0].wpe, (size_t)T->gc.max_T * C);
    for (b = 0; b < T->gc.n_block; b++) {
        GPT_DECAY(w->block[b].qkv_w, 3 * C * Cl);
        GPT_DECAY(w->block[b].proj_w, Cl * C);
        GPT_DECAY(w->block[b].fc_w, 4 * C * Cl);
        GPT_DECAY(w->block[b].fcproj_w, 4 * Cl * C);
    }
    GPT_DECAY(w->head[0].lm_w, C * (V / (size_t)(T->tp > 1 ? T->tp : 1))); /* vocabulary-parallel with TP */
#undef GPT_DECAY
}

/* --eval-every: the held-out batches (gpt_val_batches: the first --eval-seqs documents of the
   split in batches of about --seqs-per-step). 0 on success, 1 with a message. */
static inline int gpt_val_make(gpt_trainer* T, const gpt_opts* c) {
    int n = c->eval_seqs < T->held.n_docs ? c->eval_seqs : T->held.n_docs, nb = gpt_val_batches(n, c->seqs), i;
    if (n < c->m) {
        fprintf(stderr, "--eval-every: %d held-out documents, fewer than m = %d (--eval-seqs, or a longer text)\n", n,
                c->m);
        return 1;
    }
    if (!(T->val = (gpt_step*)calloc((size_t)nb, sizeof *T->val)) ||
        !(T->val_loss = (float*)calloc((size_t)nb, sizeof(float)))) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    T->n_val = nb;
    T->val_docs = n;
    for (i = 0; i < nb; i++) {
        gpt_step* sd = &T->val[i];
        int a, k;
        gpt_val_range(n, nb, i, &a, &k);
        sd->tokens = (int32_t*)malloc(sizeof(int32_t) * (size_t)k * (size_t)c->max_len);
        sd->targets = (int32_t*)malloc(sizeof(int32_t) * (size_t)k * (size_t)c->max_len);
        sd->cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(k + 1));
        if (!sd->tokens || !sd->targets || !sd->cu) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        sd->T = gpt_pack_docs(&T->held, a, k, sd->tokens, sd->targets, sd->cu);
        sd->n_seqs = k;
    }
    return 0;
}

/* 0 on success; on failure a message is printed and T is freed. gpt_trainer_init_tp: TP rank
   tp_rank of c->tp (weights, gradients and moments its shards: gpt_init_tp). */
static inline int gpt_trainer_init_tp(gpt_trainer* T, const gpt_opts* c, int tp_rank) {
    memset(T, 0, sizeof *T);
    T->tp = c->tp > 1 ? c->tp : 1;
    T->tp_rank = T->tp > 1 ? tp_rank : 0;
    if (gpt_opts_corpus(c, &T->corpus)) return 1;
    if (gpt_corpus_hold_out(&T->corpus, GPT_HOLD_OUT, &T->held)) {
        fprintf(stderr, "out of memory\n");
        gpt_trainer_free(T, c);
        return 1;
    }
    gpt_corpus_lengths(&T->corpus, &T->mean_len, &T->attn_len);
    T->gc.vocab = GPT_DATA_VOCAB;
    T->gc.max_T = c->max_len;
    T->gc.C = c->dim;
    T->gc.n_head = c->heads;
    T->gc.n_block = c->layers;
    T->n_params = gpt_param_count_tp(&T->gc, T->tp);
    T->wbuf = gpt_init_tp(&T->w, &T->g, &T->gc, T->tp, T->tp_rank, 1234, &T->gbuf);
    T->m1 = (float*)calloc(T->n_params, sizeof(float));
    T->m2 = (float*)calloc(T->n_params, sizeof(float));
    T->loss = (float*)calloc((size_t)c->steps, sizeof(float));
    T->decay = (unsigned char*)malloc(T->n_params);
    if (!T->wbuf || !T->m1 || !T->m2 || !T->loss || !T->decay || !(T->steps = gpt_steps_make(c, &T->corpus))) {
        fprintf(stderr, "out of memory\n");
        gpt_trainer_free(T, c);
        return 1;
    }
    if (c->eval_every > 0 && gpt_val_make(T, c)) {
        gpt_trainer_free(T, c);
        return 1;
    }
    gpt_set_act(&T->w, c->dtype); /* the options allow f32 and bf16 */
    gpt_decay_mask(T, T->decay);
    gpt_bind_tp(&T->mw1, &T->gc, T->tp, T->tp_rank, T->m1);
    gpt_bind_tp(&T->mw2, &T->gc, T->tp, T->tp_rank, T->m2);
    T->moments[0] = &T->mw1;
    T->moments[1] = &T->mw2;
    T->sample.rows = T->attn_len > 1 ? (int64_t)(T->attn_len + 0.5) : 1;
    T->sample.cols = 1;
    T->sample.dtype = PP_I32;
    return 0;
}
static inline int gpt_trainer_init(gpt_trainer* T, const gpt_opts* c) { return gpt_trainer_init_tp(T, c, 0); }

/* What both programs print before training: the text and its held-out split, the optimizer and
   its rate schedule, the evaluations. */
static inline void gpt_trainer_print(const gpt_trainer* T, const gpt_opts* c) {
    printf("text: %s, %d documents of mean length %.1f (max %d) to train on, %d held out (every %dth)\n",
           T->corpus.source, T->corpus.n_docs, T->mean_len, c->max_len, T->held.n_docs, GPT_HOLD_OUT);
    gpt_loop_print_optim(c->sgd ? "sgd+momentum" : "adam", c->lr, c->lr_min, c->warmup, c->steps, c->wd, c->clip);
    if (c->dtype != PP_F32)
        printf("activations and their gradients between layers: %s (rounded to nearest even; f32 arithmetic inside "
               "the layers, f32 weights and optimizer state)\n",
               pp_dtype_name(c->dtype));
    if (c->eval_every > 0)
        printf("evaluation: every %d steps and after the last, %d held-out documents in %d batch%s\n", c->eval_every,
               T->val_docs, T->n_val, T->n_val == 1 ? "" : "es");
}

/* --clip: the gradient buffers (pipeline.h >>grad) of layers [l0, l1), one per layer (its span
   of gpt_init's layout in T->gbuf), appended to out[*n]. */
static inline void gpt_grad_bufs(const gpt_trainer* T, int l0, int l1, pp_grad_buf* out, int* n) {
    int l;
    for (l = l0; l < l1; l++) {
        pp_grad_buf* b = &out[(*n)++];
        size_t cnt, off = (size_t)(gpt_layer_params(&T->w, &T->gc, l, &cnt) - T->wbuf);
        memset(b, 0, sizeof *b);
        b->layer = l;
        b->data = T->gbuf + off;
        b->count = cnt;
        b->dtype = PP_F32;
    }
}

/* The same with tensor parallelism: one buffer per parameter of each block and of the head
   (gpt_block_param_list, gpt_head_param_list on the gradients), tp_sharded where it is a TP
   shard (gpt_block_param_sharded, gpt_head_param_sharded), so that pp_stage_grad_norm_tp counts
   a shard's squares once per rank and a whole parameter once; the embedding whole, one buffer.
   out needs room for 12 per block + 5. */
static inline void gpt_grad_bufs_tp(const gpt_trainer* T, int l0, int l1, pp_grad_buf* out, int* n) {
    int l, i, k, head;
    for (l = l0; l < l1; l++) {
        pp_param ps[12];
        if (l == 0) {
            gpt_grad_bufs(T, l, l + 1, out, n);
            continue;
        }
        head = l == T->gc.n_block + 1;
        k = head ? gpt_head_param_list(&T->g.head[0], ps, 12) : gpt_block_param_list(&T->g.block[l - 1], ps, 12);
        for (i = 0; i < k; i++) {
            pp_grad_buf* b = &out[(*n)++];
            memset(b, 0, sizeof *b);
            b->layer = l;
            b->data = ps[i].data;
            b->count = (size_t)ps[i].count;
            b->dtype = PP_F32;
            b->tp_sharded = T->tp > 1 && (head ? gpt_head_param_sharded(i) : gpt_block_param_sharded(i));
        }
    }
}

/* --check: the sequential reference of batch b (before any update) into T->gref; 0 on success. */
static inline int gpt_trainer_reference(gpt_trainer* T, const pp_model* m, const pp_batch* b) {
    pp_error err;
    if (!(T->grefbuf = (float*)calloc(T->n_params, sizeof(float)))) return 1;
    gpt_bind_tp(&T->gref, &T->gc, T->tp, T->tp_rank, T->grefbuf);
    if (pp_sequential_step(m, &T->w, &T->gref, b, &T->ref_loss, &err) != PP_OK) {
        fprintf(stderr, "reference: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* --check: layer l's gradient against the reference's; 1 (and a message) when they differ. */
static inline int gpt_trainer_differs(const gpt_trainer* T, const pp_model* m, int l) {
    size_t n, off = (size_t)(gpt_layer_params(&T->w, &T->gc, l, &n) - T->wbuf);
    if (memcmp(T->gbuf + off, T->grefbuf + off, n * sizeof(float)) == 0) return 0;
    fprintf(stderr, "check: layer %d (%s): gradient differs from the reference\n", l, pp_model_layer_name(m, l));
    return 1;
}

/* --check's verdict on the first step: 0 when loss and gradients were bit-identical. */
static inline int gpt_trainer_verdict(const gpt_trainer* T, int bad_layers) {
    int same = memcmp(&T->ref_loss, &T->loss[0], sizeof(float)) == 0;
    printf("check: step 0 loss  sequential %.9g  pipelined %.9g  %s; gradients: %d layers differ\n", (double)T->ref_loss,
           (double)T->loss[0], same ? "bit-identical" : "DIFFERENT", bad_layers);
    return !same || bad_layers;
}

/* ---- tensor parallelism against tp = 1 (--tp N --check) ------------------------------------------
   A TP run is the tp = 1 model with its partial sums added in another order: its loss and every
   gradient buffer within GPT_TP_TOL (relative) of tp = 1's on the same batch. */
#define GPT_TP_TOL 1e-5

/* The tp = 1 model (gpt_init, the trainers' seed) through pp_sequential_step on each of the nb
   batches b (nb > 1: gpt_cpu --dp's shares, the gradients added in batch order and times 1 / nb,
   the loss likewise), no TP group: the whole gradient (gpt_init's layout) into a buffer it
   returns, bound to *fg (gpt_bind), the loss in *loss. NULL when out of memory or a step failed. */
static inline float* gpt_tp1_reference(const gpt_trainer* T, const gpt_opts* c, const pp_batch* b, int nb, gpt_model* fg,
                                       float* loss) {
    pp_model m1 = gpt_model_for(c->kind, c->layers); /* no TP group: the blocks are whole */
    gpt_model fw, g1;
    float *fbuf, *gbuf = NULL, *acc = NULL, l1 = 0;
    size_t n = gpt_param_count(&T->gc), j;
    pp_error err;
    int i, ok = 1;
    if (!(fbuf = gpt_init(&fw, &g1, &T->gc, 1234, &gbuf))) return NULL;
    gpt_set_act(&fw, c->dtype);
    if (nb > 1 && !(acc = (float*)calloc(n, sizeof(float)))) ok = 0;
    *loss = 0;
    for (i = 0; i < nb && ok; i++) {
        if (nb > 1) memset(gbuf, 0, n * sizeof(float));
        if (pp_sequential_step(&m1, &fw, &g1, &b[i], &l1, &err) != PP_OK) {
            fprintf(stderr, "check: tp 1 reference: %s\n", err.msg);
            ok = 0;
            break;
        }
        for (j = 0; acc && j < n; j++) acc[j] = i ? acc[j] + gbuf[j] : gbuf[j];
        *loss = i ? *loss + l1 : l1;
    }
    if (ok && acc) {
        for (j = 0; j < n; j++) gbuf[j] = acc[j] * (float)(1.0 / nb);
        *loss /= (float)nb;
    }
    free(fbuf);
    free(acc);
    if (!ok) {
        free(gbuf);
        return NULL;
    }
    gpt_bind(fg, &T->gc, gbuf);
    return gbuf;
}

/* T's TP reference (T->gref, T->ref_loss: pp_sequential_step at T's tp) against the tp = 1
   one (fg, loss1), fg sharded as T's rank: the loss's relative difference in *loss_rel, the
   largest of the gradient buffers' (gpt_rel_diff) in *worst if larger, and its name. 0, or 1
   when out of memory. */
static inline int gpt_tp1_compare(const gpt_trainer* T, const gpt_model* fg, float loss1, double* loss_rel, double* worst,
                                  char* worst_name, size_t name_cap) {
    gpt_model sg;
    float* sbuf = (float*)calloc(T->n_params, sizeof(float));
    double d;
    int l, i;
    if (!sbuf) return 1;
    gpt_bind_tp(&sg, &T->gc, T->tp, T->tp_rank, sbuf);
    gpt_tp_shard(&sg, fg, &T->gc);
    d = fabs((double)T->ref_loss - loss1) / fabs((double)loss1);
    if (d > *loss_rel) *loss_rel = d;
    for (l = 0; l < T->gc.n_block + 2; l++) {
        pp_param a[12], r[12];
        int n;
        if (l == 0) {
            n = gpt_embed_param_list(&T->gref.embed[0], a, 12);
            gpt_embed_param_list(&sg.embed[0], r, 12);
        } else if (l <= T->gc.n_block) {
            n = gpt_block_param_list(&T->gref.block[l - 1], a, 12);
            gpt_block_param_list(&sg.block[l - 1], r, 12);
        } else {
            n = gpt_head_param_list(&T->gref.head[0], a, 12);
            gpt_head_param_list(&sg.head[0], r, 12);
        }
        for (i = 0; i < n; i++) {
            d = gpt_rel_diff((const float*)a[i].data, (const float*)r[i].data, a[i].count);
            if (d > *worst) {
                *worst = d;
                snprintf(worst_name, name_cap, "tp rank %d layer %d buffer %d", T->tp_rank, l, i);
            }
        }
    }
    free(sbuf);
    return 0;
}

/* ---- evaluation: --eval-every N ------------------------------------------------------------------
   After every N-th step and after the last, the held-out batches through the pipeline's
   forward-only step (pp_pipeline_eval, pp_stage_eval); an evaluation touches no gradient, so the
   training goes on bit for bit as without it. */
static inline int gpt_eval_due(const gpt_opts* c, int step, int last) {
    return gpt_eval_due_at(c->eval_every, step, last);
}

/* The held-out loss of the last evaluation (per_batch: T->val_loss, or a reference's): the
   batches' losses weighted by their tokens, as a step weighs its micro-batches
   (PP_LOSS_MEAN_ROWS), summed in double in batch order. */
static inline double gpt_val_mean(const gpt_trainer* T, const float* per_batch) {
    double s = 0, n = 0;
    int i;
    for (i = 0; i < T->n_val; i++) {
        s += (double)per_batch[i] * T->val[i].T;
        n += T->val[i].T;
    }
    return n > 0 ? s / n : 0.0;
}

/* The line of an evaluation after steps_done steps that took secs. */
static inline void gpt_val_print(const gpt_trainer* T, int steps_done, double secs) {
    int64_t tokens = 0;
    int i;
    for (i = 0; i < T->n_val; i++) tokens += T->val[i].T;
    gpt_loop_print_val(gpt_val_mean(T, T->val_loss), steps_done, T->val_docs, (long long)tokens, T->n_val, secs);
}

/* --check on the first evaluation: pp_sequential_eval of every held-out batch with the weights
   in T->w (all of them current: one process, or gathered), against T->val_loss; 0 when every
   batch's loss is the same bits, else 1 (and the batches that differ). */
static inline int gpt_val_check_say(const gpt_trainer* T, const gpt_opts* c, const pp_model* m, int steps_done, int say) {
    double s = 0, n = 0;
    int i, differ = 0;
    for (i = 0; i < T->n_val; i++) {
        pp_batch b = gpt_step_batch(c, &T->val[i]);
        pp_error err;
        float r = 0;
        if (pp_sequential_eval(m, &T->w, &b, &r, NULL, &err) != PP_OK) {
            fprintf(stderr, "check: sequential evaluation: %s\n", err.msg);
            return 1;
        }
        if (memcmp(&r, &T->val_loss[i], sizeof r) != 0) {
            fprintf(stderr, "check: held-out batch %d: sequential %.9g, pipelined %.9g\n", i, (double)r,
                    (double)T->val_loss[i]);
            differ++;
        }
        s += (double)r * T->val[i].T; /* gpt_val_mean's sum */
        n += T->val[i].T;
    }
    if (say)
        printf("check: val loss after %d steps  sequential %.9g  pipelined %.9g  %s (%d of %d batches differ)\n",
               steps_done, n > 0 ? s / n : 0.0, gpt_val_mean(T, T->val_loss), differ ? "DIFFERENT" : "bit-identical",
               differ, T->n_val);
    return differ != 0;
}
/* (gpt_val_check_say with say 0 prints no line: gpt_cpu --tp's TP ranks but the first.) */
static inline int gpt_val_check(const gpt_trainer* T, const gpt_opts* c, const pp_model* m, int steps_done) {
    return gpt_val_check_say(T, c, m, steps_done, 1);
}

/* ---- checkpoints: --save FILE, --resume FILE ----------------------------------------------------
   A checkpoint holds the weights, the optimizer's two moment buffers (Adam's m and v; SGD keeps
   its momentum in the first) and the steps done; the batches come from the options, so resume
   with the same data options (--text, --seqs-per-step, --max-len, --steps at least as many; the
   same --steps, --warmup, --lr and --lr-min for the same learning rates: the step alone places
   a resumed run on the schedule). It
   depends on neither the schedule nor p, v or the partition: save at p = 4 interleaved, resume at
   p = 2 1F1B. own: the layers this process saves or loads (NULL: all of them). Both the fused and
   the split GPT are saved as "gpt": one layout. */
static inline pp_ckpt_desc gpt_trainer_ckpt(gpt_trainer* T, const pp_model* m, int steps_done, const unsigned char* own) {
    return gpt_ckpt_of(m, "gpt", &T->w, T->moments, own, steps_done);
}

/* One process saves every layer (gpt_ckpt_save_path: a new name, renamed when complete). 0 on
   success. (gpt_mpi does the same with every rank writing.) */
static inline int gpt_trainer_save(gpt_trainer* T, const pp_model* m, int steps_done, const char* path) {
    pp_ckpt_desc k = gpt_trainer_ckpt(T, m, steps_done, NULL);
    return gpt_ckpt_save_path(&k, path);
}

/* Loads the layers in own (NULL: all) and the steps done (*step); 0 on success. */
static inline int gpt_trainer_resume(gpt_trainer* T, const pp_model* m, const char* path, const unsigned char* own, int* step) {
    pp_ckpt_desc k = gpt_trainer_ckpt(T, m, 0, own);
    return gpt_ckpt_load_path(&k, path, step);
}

/* --save / --resume with --tp > 1: the weights and the optimizer's two moments whole, in the
   tp = 1 layout (gpt_bind), which the checkpoint holds whatever tp wrote it. */
typedef struct gpt_full {
    float* buf;
    gpt_model w, m[2];
    const void* moments[2];
} gpt_full;

static inline int gpt_full_alloc(gpt_full* f, const gpt_trainer* T) {
    const size_t n = gpt_param_count(&T->gc);
    if (!(f->buf = (float*)calloc(3 * n, sizeof(float)))) return 1;
    gpt_bind(&f->w, &T->gc, f->buf);
    gpt_bind(&f->m[0], &T->gc, f->buf + n);
    gpt_bind(&f->m[1], &T->gc, f->buf + 2 * n);
    f->moments[0] = &f->m[0];
    f->moments[1] = &f->m[1];
    return 0;
}

/* T's shard of f's weights and moments (gpt_tp_shard), or with back set T's into their places
   in f (gpt_tp_unshard: every TP rank's in turn make f whole). */
static inline void gpt_full_shard(gpt_trainer* T, gpt_full* f, int back) {
    if (back) {
        gpt_tp_unshard(&T->w, &f->w, &T->gc);
        gpt_tp_unshard(&T->mw1, &f->m[0], &T->gc);
        gpt_tp_unshard(&T->mw2, &f->m[1], &T->gc);
    } else {
        gpt_tp_shard(&T->w, &f->w, &T->gc);
        gpt_tp_shard(&T->mw1, &f->m[0], &T->gc);
        gpt_tp_shard(&T->mw2, &f->m[1], &T->gc);
    }
}

static inline double gpt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
