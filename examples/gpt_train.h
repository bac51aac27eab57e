/* examples/gpt_train.h - what the two CPU GPT programs share: their options, the packed batches
   of every step, and the optimizer. examples/gpt_cpu.c runs them through threads in one
   process (pp_pipeline), examples/gpt_mpi.c with one process per rank (pp_stage over MPI).
   What to copy: an elementwise optimizer over one flat parameter buffer, applied whole (one
   process) or to the layers a rank owns (one process per rank): the same bits either way.
   Include after gpt.h and gpt_data.h. Everything is static. */
#ifndef PP_EXAMPLE_GPT_TRAIN_H
#define PP_EXAMPLE_GPT_TRAIN_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gpt_opts {
    pp_schedule_kind kind;
    int p, v, m, steps, seqs, max_len, dim, heads, layers;
    float lr;
    int sgd;                /* 0: Adam, 1: SGD with momentum 0.9 */
    float clip;             /* --clip X: clip the global gradient norm at X before the update (0: off) */
    const char* text;
    const char* trace;      /* gpt_cpu: Chrome trace of the last step */
    const char* save;       /* --save FILE: a checkpoint after the last step */
    const char* resume;     /* --resume FILE: start from a checkpoint, at its step */
    int generated, check;
    int check_resume;       /* gpt_cpu --check-resume */
    pp_split_policy split;
} gpt_opts;

/* The GPT for a schedule: blocks with their backward split into B and W (gptz, examples/gpt.h)
   where the schedule has W actions (the zero-bubble and controllable-memory kinds), so that W
   can fill the bubbles and the attention probabilities go at B; else the fused blocks. */
static pp_model gpt_model_for(pp_schedule_kind kind, int layers) {
    int v = pp_schedule_kind_v(kind, 2);
    int has_w = v > 0 && pp_schedule_size(kind, 2, v, 2) == (size_t)(3 * 2 * v * 2);
    return has_w ? gptz_model_desc_depth(layers) : gpt_model_desc_depth(layers);
}

static void gpt_opts_usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v|zb-h2|v-half|v-min|dualpipev] [-p P] [-v V]\n"
            "       [-m M] [--steps N]\n"
            "       [--text FILE | --generated] [--seqs-per-step S] [--max-len L] [--dim C] [--heads H]\n"
            "       [--layers N] [--lr LR] [--optim adam|sgd] [--clip X] [--split seqs|tokens|cost] [--trace FILE]\n"
            "       [--check] [--save FILE] [--resume FILE] [--check-resume]\n",
            prog);
}

/* Options; 0 on success. p may change afterwards (gpt_mpi: the number of processes); then call
   gpt_opts_check, which also picks the default depth. */
static int gpt_opts_parse(int argc, char** argv, gpt_opts* c) {
    int i;
    memset(c, 0, sizeof *c);
    c->kind = PP_SCHED_1F1B;
    c->p = 4;
    c->m = 8;
    c->steps = 60;
    c->seqs = 32;
    c->max_len = 128;
    c->dim = 64;
    c->heads = 4;
    c->lr = -1;
    c->split = PP_SPLIT_TOKENS;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!strcmp(a, "--generated")) { c->generated = 1; continue; }
        if (!strcmp(a, "--check-resume")) { c->check_resume = 1; continue; }
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
        else if (!strcmp(a, "--optim")) {
            if (!strcmp(val, "adam")) c->sgd = 0;
            else if (!strcmp(val, "sgd")) c->sgd = 1;
            else { fprintf(stderr, "unknown optimizer '%s'\n", val); return 1; }
        } else if (!strcmp(a, "--split")) {
            if (!strcmp(val, "seqs")) c->split = PP_SPLIT_SEQS;
            else if (!strcmp(val, "tokens")) c->split = PP_SPLIT_TOKENS;
            else if (!strcmp(val, "cost")) c->split = PP_SPLIT_COST;
            else { fprintf(stderr, "unknown split '%s'\n", val); return 1; }
        } else return 1;
        i++;
    }
    if (c->lr < 0) c->lr = c->sgd ? 0.1f : 3e-3f;
    if (!(c->clip >= 0)) {
        fprintf(stderr, "--clip wants a norm >= 0 (0: off)\n");
        return 1;
    }
    return 0;
}

/* v from the schedule, the depth (4 blocks, or enough for p*v stages), and the ranges. */
static int gpt_opts_check(gpt_opts* c) {
    c->v = pp_schedule_kind_v(c->kind, c->v == 0 ? 2 : c->v);
    if (c->layers == 0) c->layers = c->p * c->v - 2 > 4 ? c->p * c->v - 2 : 4;
    if (c->p < 1 || c->v < 1 || c->p * c->v > PP_MAX_RANKS || c->m < 1 || c->steps < 1 || c->max_len < 12) {
        fprintf(stderr, "need p, v, m, steps >= 1 (p*v <= %d) and max-len >= 12\n", PP_MAX_RANKS);
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
    if (c->layers + 2 < c->p * c->v) {
        fprintf(stderr, "%d stages (p*v) need at least %d layers: use --layers %d or more\n", c->p * c->v, c->p * c->v,
                c->p * c->v - 2);
        return 1;
    }
    return 0;
}

/* The text: --text FILE, else README.md in the current directory, else the generated task. */
static int gpt_opts_corpus(const gpt_opts* c, gpt_corpus* corpus) {
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
    int T;
    int64_t pad_saved;      /* sum over micro-batches of n_seqs * max_seqlen - rows */
    int64_t padded;         /* sum over micro-batches of n_seqs * max_seqlen */
    double imbalance;       /* max / mean tokens over micro-batches */
} gpt_step;

static pp_batch gpt_step_batch(const gpt_opts* c, const gpt_step* sd) {
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
    b.n_seqs = c->seqs;
    b.loss = PP_LOSS_MEAN_ROWS; /* micro-batches weigh by tokens, not equally */
    b.split = c->split;
    return b;
}

static void gpt_steps_free(gpt_step* s, int n) {
    int i;
    for (i = 0; s && i < n; i++) {
        free(s[i].tokens);
        free(s[i].targets);
        free(s[i].cu);
    }
    free(s);
}

/* Packs every step's batch up front and measures its split; NULL when out of memory. */
static gpt_step* gpt_steps_make(const gpt_opts* c, const gpt_corpus* corpus) {
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

/* Adam (or SGD with momentum) on n parameters w with gradients g and moments m1, m2 (step counts
   from 0); zeroes g for the next step. Elementwise, so updating a buffer in pieces (the layers a
   rank owns) gives the same bits as updating it whole. */
static void gpt_optimize(const gpt_opts* c, float* w, float* g, float* m1, float* m2, size_t n, int step) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
    size_t i;
    for (i = 0; i < n; i++) {
        if (c->sgd) {
            m1[i] = 0.9f * m1[i] + g[i];
            w[i] -= c->lr * m1[i];
        } else {
            m1[i] = b1 * m1[i] + (1.0f - b1) * g[i];
            m2[i] = b2 * m2[i] + (1.0f - b2) * g[i] * g[i];
            w[i] -= c->lr * (m1[i] / c1) / (sqrtf(m2[i] / c2) + eps);
        }
        g[i] = 0.0f;
    }
}

/* The summary both programs print: first and last losses, tokens per second, packing. */
static void gpt_report(const gpt_opts* c, const gpt_step* steps, const float* loss, double wall) {
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

/* One step's line (printed by whoever holds the loss), with the gradient norm before clipping
   where norm >= 0 (--clip). */
static void gpt_step_print(int step, float loss, const gpt_step* sd, double t_step, double norm) {
    printf("step %3d  loss %.4f  %5d tokens  %7.0f tok/s  padding saved %5lld of %5lld (%4.1f%%)  mb tokens max/mean %.2f",
           step, loss, sd->T, t_step > 0 ? sd->T / t_step : 0.0, (long long)sd->pad_saved, (long long)sd->padded,
           sd->padded ? 100.0 * (double)sd->pad_saved / (double)sd->padded : 0.0, sd->imbalance);
    if (norm >= 0) printf("  grad norm %.4f", norm);
    printf("\n");
    fflush(stdout);
}


/* What both programs set up the same way: the text, every step's batch, the model's weights,
   gradients (gpt_init's layout), the optimizer's moments, and the partition's sample. */
typedef struct gpt_trainer {
    gpt_config gc;
    gpt_corpus corpus;
    gpt_step* steps;
    gpt_model w, g, gref;
    gpt_model mw1, mw2;         /* the optimizer's moments m1, m2 bound like the weights (checkpoints) */
    const void* moments[2];     /* &mw1, &mw2 */
    float *wbuf, *gbuf, *grefbuf, *m1, *m2;
    float* loss;                /* (steps) */
    float ref_loss;             /* --check: the sequential reference's step-0 loss */
    size_t n_params;
    double mean_len, attn_len;
    pp_tensor sample;           /* one sequence of the corpus' attention length (the cost partition) */
} gpt_trainer;

static void gpt_trainer_free(gpt_trainer* T, const gpt_opts* c) {
    gpt_steps_free(T->steps, c->steps);
    free(T->wbuf);
    free(T->gbuf);
    free(T->grefbuf);
    free(T->m1);
    free(T->m2);
    free(T->loss);
    gpt_corpus_free(&T->corpus);
    memset(T, 0, sizeof *T);
}

/* 0 on success; on failure a message is printed and T is freed. */
static int gpt_trainer_init(gpt_trainer* T, const gpt_opts* c) {
    memset(T, 0, sizeof *T);
    if (gpt_opts_corpus(c, &T->corpus)) return 1;
    gpt_corpus_lengths(&T->corpus, &T->mean_len, &T->attn_len);
    T->gc.vocab = GPT_DATA_VOCAB;
    T->gc.max_T = c->max_len;
    T->gc.C = c->dim;
    T->gc.n_head = c->heads;
    T->gc.n_block = c->layers;
    T->n_params = gpt_param_count(&T->gc);
    T->wbuf = gpt_init(&T->w, &T->g, &T->gc, 1234, &T->gbuf);
    T->m1 = (float*)calloc(T->n_params, sizeof(float));
    T->m2 = (float*)calloc(T->n_params, sizeof(float));
    T->loss = (float*)calloc((size_t)c->steps, sizeof(float));
    if (!T->wbuf || !T->m1 || !T->m2 || !T->loss || !(T->steps = gpt_steps_make(c, &T->corpus))) {
        fprintf(stderr, "out of memory\n");
        gpt_trainer_free(T, c);
        return 1;
    }
    gpt_bind(&T->mw1, &T->gc, T->m1);
    gpt_bind(&T->mw2, &T->gc, T->m2);
    T->moments[0] = &T->mw1;
    T->moments[1] = &T->mw2;
    T->sample.rows = T->attn_len > 1 ? (int64_t)(T->attn_len + 0.5) : 1;
    T->sample.cols = 1;
    T->sample.dtype = PP_I32;
    return 0;
}

/* --clip: the gradient buffers (pipeline.h >>grad) of layers [l0, l1), one per layer (its span
   of gpt_init's layout in T->gbuf), appended to out[*n]. */
static void gpt_grad_bufs(const gpt_trainer* T, int l0, int l1, pp_grad_buf* out, int* n) {
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

/* --check: the sequential reference of batch b (before any update) into T->gref; 0 on success. */
static int gpt_trainer_reference(gpt_trainer* T, const pp_model* m, const pp_batch* b) {
    pp_error err;
    if (!(T->grefbuf = (float*)calloc(T->n_params, sizeof(float)))) return 1;
    gpt_bind(&T->gref, &T->gc, T->grefbuf);
    if (pp_sequential_step(m, &T->w, &T->gref, b, &T->ref_loss, &err) != PP_OK) {
        fprintf(stderr, "reference: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* --check: layer l's gradient against the reference's; 1 (and a message) when they differ. */
static int gpt_trainer_differs(const gpt_trainer* T, const pp_model* m, int l) {
    size_t n, off = (size_t)(gpt_layer_params(&T->w, &T->gc, l, &n) - T->wbuf);
    if (memcmp(T->gbuf + off, T->grefbuf + off, n * sizeof(float)) == 0) return 0;
    fprintf(stderr, "check: layer %d (%s): gradient differs from the reference\n", l, pp_model_layer_name(m, l));
    return 1;
}

/* --check's verdict on the first step: 0 when loss and gradients were bit-identical. */
static int gpt_trainer_verdict(const gpt_trainer* T, int bad_layers) {
    int same = memcmp(&T->ref_loss, &T->loss[0], sizeof(float)) == 0;
    printf("check: step 0 loss  sequential %.9g  pipelined %.9g  %s; gradients: %d layers differ\n", (double)T->ref_loss,
           (double)T->loss[0], same ? "bit-identical" : "DIFFERENT", bad_layers);
    return !same || bad_layers;
}

/* ---- checkpoints: --save FILE, --resume FILE ----------------------------------------------------
   A checkpoint holds the weights, the optimizer's two moment buffers (Adam's m and v; SGD keeps
   its momentum in the first) and the steps done; the batches come from the options, so resume
   with the same data options (--text, --seqs-per-step, --max-len, --steps at least as many). It
   depends on neither the schedule nor p, v or the partition: save at p = 4 interleaved, resume at
   p = 2 1F1B. own: the layers this process saves or loads (NULL: all of them). Both the fused and
   the split GPT are saved as "gpt": one layout. */
static pp_ckpt_desc gpt_trainer_ckpt(gpt_trainer* T, const pp_model* m, int steps_done, const unsigned char* own) {
    static const char* const names[2] = {"m", "v"};
    pp_ckpt_desc k;
    memset(&k, 0, sizeof k);
    k.model = *m;
    k.name = "gpt";
    k.weights = &T->w;
    k.n_state = 2;
    k.state = T->moments;
    k.state_names = names;
    k.own = own;
    k.step = steps_done;
    return k;
}

/* One process saves every layer: into path.tmp, renamed to path when complete (a crash keeps the
   last good checkpoint). 0 on success. (gpt_mpi does the same with every rank writing.) */
static inline int gpt_trainer_save(gpt_trainer* T, const pp_model* m, int steps_done, const char* path) {
    pp_ckpt_desc k = gpt_trainer_ckpt(T, m, steps_done, NULL);
    size_t n = strlen(path) + 5;
    char* tmp = (char*)malloc(n);
    pp_error err;
    int rc = 1;
    if (!tmp) return 1;
    snprintf(tmp, n, "%s.tmp", path);
    if (pp_ckpt_save_file(&k, tmp, &err) != PP_OK) fprintf(stderr, "--save %s: %s\n", path, err.msg);
    else if (rename(tmp, path) != 0) fprintf(stderr, "--save: renaming %s to %s: %s\n", tmp, path, strerror(errno));
    else rc = 0;
    if (rc == 0) printf("saved %s after %d steps\n", path, steps_done);
    free(tmp);
    return rc;
}

/* Loads the layers in own (NULL: all) and the steps done (*step); 0 on success. */
static int gpt_trainer_resume(gpt_trainer* T, const pp_model* m, const char* path, const unsigned char* own, int* step) {
    pp_ckpt_desc k = gpt_trainer_ckpt(T, m, 0, own);
    pp_ckpt_info info;
    pp_error err;
    if (pp_ckpt_load_file(&k, path, &info, &err) != PP_OK) {
        fprintf(stderr, "--resume %s: %s\n", path, err.msg);
        return 1;
    }
    *step = (int)info.step;
    return 0;
}

static double gpt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
