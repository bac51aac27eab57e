/* examples/gpt_cpu.c - train a tiny GPT through a pipeline of CPU threads, on packed
   variable-length sequences (no padding).

   Each step draws --seqs-per-step documents, packs them back to back (token ids, next-token
   targets, cu_seqlens) and hands the batch to pipeline.h, which splits it into m micro-batches of
   whole sequences; every layer sees its micro-batch's rebased cu_seqlens in io->mb. Each rank is a
   thread that runs its stages and updates the layers it owns (Adam, or SGD with momentum).

     build/gpt_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p 4] [-v 2] [-m 8] [--steps 60]
                   [--text FILE | --generated] [--seqs-per-step 32] [--max-len 128]
                   [--dim 64] [--heads 4] [--layers 4] [--lr 3e-3] [--optim adam|sgd]
                   [--split seqs|tokens|cost] [--check]

   --layers counts transformer blocks (default 4, or p*v - 2 when the stages need more layers).
   The text is FILE, else README.md in the current directory if there is one, else a generated
   copy task (examples/gpt_data.h). Per step it prints the loss, tokens/s, the tokens that
   packing saved against padding every micro-batch to its longest sequence, and how evenly the
   split spread tokens over micro-batches (max / mean; --split seqs, equal sequence counts, shows
   how uneven a count-based split of long-tailed lengths is; the default balances tokens).
   --check runs pp_sequential_step on the first batch first and requires the pipelined loss and
   gradients to equal it bit for bit. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "gpt.h"
#include "gpt_data.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cfg {
    pp_schedule_kind kind;
    int p, v, m, steps, seqs, max_len, dim, heads, layers;
    float lr;
    int sgd;                /* 0: Adam, 1: SGD with momentum 0.9 */
    const char* text;
    int generated, check;
    pp_split_policy split;
} cfg;

typedef struct step_data {
    int32_t* tokens;        /* (T) */
    int32_t* targets;       /* (T) */
    int32_t* cu;            /* (n_seqs + 1) */
    int T;
    int64_t pad_saved;      /* sum over micro-batches of n_seqs * max_seqlen - rows */
    int64_t padded;         /* sum over micro-batches of n_seqs * max_seqlen */
    double imbalance;       /* max / mean tokens over micro-batches */
} step_data;

typedef struct trainer {
    cfg c;
    gpt_config gc;
    pp_model model;
    gpt_model w, g, gref;
    float *wbuf, *gbuf, *grefbuf, *mom1, *mom2;
    size_t n_params;
    int first[PP_MAX_RANKS + 1];
    pp_schedule sched;
    pp_threads* threads;
    step_data* steps;
    float* loss;            /* (steps) from the rank owning the head */
    float ref_loss;
    int grad_mismatch;      /* --check: layers whose gradient differs from the reference */
    pthread_mutex_t mu;
} trainer;

static void usage(void) {
    fprintf(stderr,
            "usage: gpt_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p P] [-v V] [-m M] [--steps N]\n"
            "               [--text FILE | --generated] [--seqs-per-step S] [--max-len L]\n"
            "               [--dim C] [--heads H] [--layers N] [--lr LR] [--optim adam|sgd]\n"
            "               [--split seqs|tokens|cost] [--check]\n");
}

static int parse(int argc, char** argv, cfg* c) {
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
    c->layers = 0; /* 4, or enough for p*v stages */
    c->lr = -1;
    c->split = PP_SPLIT_TOKENS;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!strcmp(a, "--generated")) { c->generated = 1; continue; }
        if (!val) { usage(); return 1; }
        if (!strcmp(a, "--schedule") || !strcmp(a, "-s")) {
            if (pp_schedule_kind_parse(val, &c->kind) != PP_OK) { fprintf(stderr, "unknown schedule '%s'\n", val); return 1; }
        } else if (!strcmp(a, "-p")) c->p = atoi(val);
        else if (!strcmp(a, "-v")) c->v = atoi(val);
        else if (!strcmp(a, "-m")) c->m = atoi(val);
        else if (!strcmp(a, "--steps")) c->steps = atoi(val);
        else if (!strcmp(a, "--text")) c->text = val;
        else if (!strcmp(a, "--seqs-per-step")) c->seqs = atoi(val);
        else if (!strcmp(a, "--max-len")) c->max_len = atoi(val);
        else if (!strcmp(a, "--dim")) c->dim = atoi(val);
        else if (!strcmp(a, "--heads")) c->heads = atoi(val);
        else if (!strcmp(a, "--layers")) c->layers = atoi(val);
        else if (!strcmp(a, "--lr")) c->lr = (float)atof(val);
        else if (!strcmp(a, "--optim")) {
            if (!strcmp(val, "adam")) c->sgd = 0;
            else if (!strcmp(val, "sgd")) c->sgd = 1;
            else { fprintf(stderr, "unknown optimizer '%s'\n", val); return 1; }
        } else if (!strcmp(a, "--split")) {
            if (!strcmp(val, "seqs")) c->split = PP_SPLIT_SEQS;
            else if (!strcmp(val, "tokens")) c->split = PP_SPLIT_TOKENS;
            else if (!strcmp(val, "cost")) c->split = PP_SPLIT_COST;
            else { fprintf(stderr, "unknown split '%s'\n", val); return 1; }
        } else { usage(); return 1; }
        i++;
    }
    if (c->v == 0) c->v = c->kind == PP_SCHED_INTERLEAVED || c->kind == PP_SCHED_ZB_V ? 2 : 1;
    if (c->layers == 0) c->layers = c->p * c->v - 2 > 4 ? c->p * c->v - 2 : 4;
    if (c->lr < 0) c->lr = c->sgd ? 0.1f : 3e-3f;
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
        fprintf(stderr, "%d stages (p*v) need at least %d layers: use --layers %d or more\n", c->p * c->v,
                c->p * c->v, c->p * c->v - 2);
        return 1;
    }
    return 0;
}

/* Adam (or SGD with momentum) on the layers of the stages this rank owns; zeroes their grads. */
static void update_owned(trainer* T, int rank, int step) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
    int chunk, l;
    for (chunk = 0; chunk < T->sched.v; chunk++) {
        int s = pp_schedule_stage(&T->sched, rank, chunk);
        for (l = T->first[s]; l < T->first[s + 1]; l++) {
            size_t n, i, off;
            float* w = gpt_layer_params(&T->w, &T->gc, l, &n);
            float* g = T->gbuf + (w - T->wbuf);
            off = (size_t)(w - T->wbuf);
            for (i = 0; i < n; i++) {
                float* m1 = &T->mom1[off + i];
                if (T->c.sgd) {
                    *m1 = 0.9f * *m1 + g[i];
                    w[i] -= T->c.lr * *m1;
                } else {
                    float* m2 = &T->mom2[off + i];
                    *m1 = b1 * *m1 + (1.0f - b1) * g[i];
                    *m2 = b2 * *m2 + (1.0f - b2) * g[i] * g[i];
                    w[i] -= T->c.lr * (*m1 / c1) / (sqrtf(*m2 / c2) + eps);
                }
                g[i] = 0.0f;
            }
        }
    }
}

/* --check: the layers this rank owns must hold the reference gradient, bit for bit. */
static void check_owned(trainer* T, int rank) {
    int chunk, l;
    for (chunk = 0; chunk < T->sched.v; chunk++) {
        int s = pp_schedule_stage(&T->sched, rank, chunk);
        for (l = T->first[s]; l < T->first[s + 1]; l++) {
            size_t n;
            float* w = gpt_layer_params(&T->w, &T->gc, l, &n);
            size_t off = (size_t)(w - T->wbuf);
            if (memcmp(T->gbuf + off, T->grefbuf + off, n * sizeof(float)) != 0) {
                pthread_mutex_lock(&T->mu);
                T->grad_mismatch++;
                pthread_mutex_unlock(&T->mu);
                fprintf(stderr, "check: layer %d (%s, stage %d, rank %d): gradient differs from the reference\n", l,
                        T->model.layer_name(l), s, rank);
            }
        }
    }
}

static void make_batch(const trainer* T, int step, pp_batch* b) {
    const step_data* sd = &T->steps[step];
    memset(b, 0, sizeof *b);
    b->m = T->c.m;
    b->input.data = sd->tokens;
    b->input.rows = sd->T;
    b->input.cols = 1;
    b->input.dtype = PP_I32;
    b->targets = sd->targets;
    b->target_row_bytes = sizeof(int32_t);
    b->cu_seqlens = sd->cu;
    b->n_seqs = T->c.seqs;
    b->loss = PP_LOSS_MEAN_ROWS; /* micro-batches weigh by tokens, not equally */
    b->split = T->c.split;
}

static pp_result rank_main(int rank, void* user) {
    trainer* T = (trainer*)user;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_step_stats ss;
    pp_error err;
    pp_result rc = PP_OK;
    int step;
    memset(&d, 0, sizeof d);
    d.model = T->model;
    d.weights = &T->w;
    d.grads = &T->g;
    d.schedule = &T->sched;
    d.partition = T->first;
    d.rank = rank;
    d.transport = pp_threads_transport(T->threads, rank);
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return rc;
    }
    for (step = 0; step < T->c.steps; step++) {
        const step_data* sd = &T->steps[step];
        pp_batch b;
        make_batch(T, step, &b);
        if ((rc = pp_stage_step(st, &b, &ss)) != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, pp_stage_error(st));
            break;
        }
        if (T->c.check && step == 0) check_owned(T, rank);
        update_owned(T, rank, step);
        if (ss.has_loss) {
            T->loss[step] = ss.loss;
            printf("step %3d  loss %.4f  %5d tokens  %7.0f tok/s  padding saved %5lld of %5lld (%4.1f%%)  "
                   "mb tokens max/mean %.2f\n",
                   step, ss.loss, sd->T, ss.t_total > 0 ? sd->T / ss.t_total : 0.0, (long long)sd->pad_saved,
                   (long long)sd->padded, sd->padded ? 100.0 * (double)sd->pad_saved / (double)sd->padded : 0.0,
                   sd->imbalance);
            fflush(stdout);
        }
    }
    pp_stage_destroy(st);
    return rc;
}

/* Packs every step's batch up front and measures its split: padding saved and imbalance. */
static int make_data(trainer* T, const gpt_corpus* corpus) {
    const cfg* c = &T->c;
    pp_microbatch* mbs = (pp_microbatch*)calloc((size_t)c->m, sizeof *mbs);
    int32_t* cu = (int32_t*)calloc((size_t)(c->seqs + c->m), sizeof *cu);
    uint64_t rng = 2024;
    int step, i;
    pp_error err;
    T->steps = (step_data*)calloc((size_t)c->steps, sizeof *T->steps);
    if (!mbs || !cu || !T->steps) goto fail;
    for (step = 0; step < c->steps; step++) {
        step_data* sd = &T->steps[step];
        pp_batch b;
        int64_t mx = 0;
        sd->tokens = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->seqs * (size_t)c->max_len);
        sd->targets = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->seqs * (size_t)c->max_len);
        sd->cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(c->seqs + 1));
        if (!sd->tokens || !sd->targets || !sd->cu) goto fail;
        sd->T = gpt_pack(corpus, &rng, c->seqs, sd->tokens, sd->targets, sd->cu);
        make_batch(T, step, &b);
        if (pp_batch_split(&b, mbs, cu, &err) != PP_OK) {
            fprintf(stderr, "split: %s\n", err.msg);
            goto fail;
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
    return 0;
fail:
    free(mbs);
    free(cu);
    return -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
    trainer* T;
    gpt_corpus corpus;
    pp_error err;
    pp_partition_desc pd;
    pp_tensor sample;
    pp_action* acts = NULL;
    size_t n_acts;
    double weights[GPT_MAX_BLOCK + 2], imbalance = 0, mean_len = 0, attn_len = 0, t0, wall;
    int64_t total_tokens = 0, total_saved = 0, total_padded = 0;
    double split_imb = 0;
    int rc = 1, step, s, threads_ok = 0;
    T = (trainer*)calloc(1, sizeof *T);
    if (!T) return 3;
    if (parse(argc, argv, &T->c)) {
        free(T);
        return 2;
    }
    /* text: --text FILE, else the project's README.md, else the generated task */
    memset(&corpus, 0, sizeof corpus);
    errno = 0;
    if (T->c.text) {
        if (gpt_corpus_load(&corpus, T->c.text, T->c.max_len, 7)) {
            fprintf(stderr, "cannot use '%s': %s\n", T->c.text, errno ? strerror(errno) : "no document of 2+ bytes");
            free(T);
            return 2;
        }
    } else if (T->c.generated || gpt_corpus_load(&corpus, "README.md", T->c.max_len, 7)) {
        if (gpt_corpus_generate(&corpus, 4000, T->c.max_len, 7)) {
            fprintf(stderr, "cannot generate the corpus\n");
            free(T);
            return 3;
        }
    }
    gpt_corpus_lengths(&corpus, &mean_len, &attn_len);

    T->gc.vocab = GPT_DATA_VOCAB;
    T->gc.max_T = T->c.max_len;
    T->gc.C = T->c.dim;
    T->gc.n_head = T->c.heads;
    T->gc.n_block = T->c.layers;
    T->model = gpt_model_desc_depth(T->c.layers);
    T->n_params = gpt_param_count(&T->gc);
    T->wbuf = gpt_init(&T->w, &T->g, &T->gc, 1234, &T->gbuf);
    T->mom1 = (float*)calloc(T->n_params, sizeof(float));
    T->mom2 = (float*)calloc(T->n_params, sizeof(float));
    T->loss = (float*)calloc((size_t)T->c.steps, sizeof(float));
    pthread_mutex_init(&T->mu, NULL);
    if (!T->wbuf || !T->mom1 || !T->mom2 || !T->loss || make_data(T, &corpus)) {
        fprintf(stderr, "out of memory\n");
        goto cleanup;
    }

    /* partition by describe()'s cost on one sample sequence of the corpus' attention length */
    memset(&pd, 0, sizeof pd);
    memset(&sample, 0, sizeof sample);
    sample.rows = attn_len > 1 ? (int64_t)(attn_len + 0.5) : 1;
    sample.cols = 1;
    sample.dtype = PP_I32;
    pd.policy = PP_PARTITION_COST;
    pd.n_stages = T->c.p * T->c.v;
    pd.sample = &sample;
    if (pp_partition_model(&T->model, &T->w, &pd, T->first, &imbalance, &err) != PP_OK ||
        pp_model_layer_costs(&T->model, &T->w, &sample, weights, NULL, &err) != PP_OK) {
        fprintf(stderr, "partition: %s\n", err.msg);
        goto cleanup;
    }
    n_acts = pp_schedule_size(T->c.kind, T->c.p, T->c.v, T->c.m);
    acts = (pp_action*)malloc((n_acts ? n_acts : 1) * sizeof *acts);
    if (!acts || pp_schedule_make(T->c.kind, T->c.p, T->c.v, T->c.m, acts, n_acts, &T->sched, &err) != PP_OK) {
        fprintf(stderr, "schedule: %s\n", acts ? err.msg : "out of memory");
        goto cleanup;
    }
    printf("gpt: %d layers (embed, %d blocks, head), C=%d, %d heads, vocab %d, %zu parameters\n",
           T->model.n_layers, T->c.layers, T->c.dim, T->c.heads, T->gc.vocab, T->n_params);
    printf("text: %s, %d documents of mean length %.1f (max %d)\n", corpus.source, corpus.n_docs, mean_len,
           T->c.max_len);
    printf("%s p=%d v=%d m=%d, %d sequences per step split by %s, %s lr %g\n", pp_schedule_name(T->c.kind), T->c.p,
           T->c.v, T->c.m, T->c.seqs, T->c.split == PP_SPLIT_SEQS ? "count" : T->c.split == PP_SPLIT_TOKENS ? "tokens" : "cost",
           T->c.sgd ? "sgd+momentum" : "adam", (double)T->c.lr);
    pp_partition_print(stdout, &T->model, T->first, T->c.p * T->c.v, weights);
    printf("partition imbalance by cost %.3f\n", imbalance);

    if (T->c.check) {
        /* the sequential reference on step 0, before any update */
        pp_batch b;
        T->grefbuf = (float*)calloc(T->n_params, sizeof(float));
        if (!T->grefbuf) goto cleanup;
        gpt_bind(&T->gref, &T->gc, T->grefbuf);
        make_batch(T, 0, &b);
        if (pp_sequential_step(&T->model, &T->w, &T->gref, &b, &T->ref_loss, &err) != PP_OK) {
            fprintf(stderr, "reference: %s\n", err.msg);
            goto cleanup;
        }
    }

    if (pp_threads_create(T->c.p, &T->threads, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        goto cleanup;
    }
    t0 = now_s();
    threads_ok = pp_threads_run(T->c.p, rank_main, T, &err) == PP_OK;
    wall = now_s() - t0;
    if (!threads_ok) {
        fprintf(stderr, "training failed: %s\n", err.msg);
        goto cleanup;
    }
    for (step = 0; step < T->c.steps; step++) {
        total_tokens += T->steps[step].T;
        total_saved += T->steps[step].pad_saved;
        total_padded += T->steps[step].padded;
        split_imb += T->steps[step].imbalance / T->c.steps;
    }
    s = T->c.steps < 5 ? T->c.steps : 5;
    {
        double first = 0, last = 0;
        for (step = 0; step < s; step++) {
            first += T->loss[step] / s;
            last += T->loss[T->c.steps - 1 - step] / s;
        }
        printf("loss %.4f -> %.4f (mean of the first and last %d steps)\n", first, last, s);
    }
    printf("%lld tokens in %.2f s: %.0f tokens/s; packing saved %lld of %lld padded tokens (%.1f%%); "
           "micro-batch tokens max/mean %.3f on average\n",
           (long long)total_tokens, wall, (double)total_tokens / wall, (long long)total_saved,
           (long long)total_padded, total_padded ? 100.0 * (double)total_saved / (double)total_padded : 0.0,
           split_imb);
    rc = 0;
    if (T->c.check) {
        int same = memcmp(&T->ref_loss, &T->loss[0], sizeof(float)) == 0;
        printf("check: step 0 loss  sequential %.9g  pipelined %.9g  %s; gradients: %d layers differ\n",
               (double)T->ref_loss, (double)T->loss[0], same ? "bit-identical" : "DIFFERENT", T->grad_mismatch);
        if (!same || T->grad_mismatch) rc = 1;
    }
cleanup:
    if (T->threads) pp_threads_destroy(T->threads);
    pthread_mutex_destroy(&T->mu);
    if (T->steps)
        for (step = 0; step < T->c.steps; step++) {
            free(T->steps[step].tokens);
            free(T->steps[step].targets);
            free(T->steps[step].cu);
        }
    free(T->steps);
    free(acts);
    free(T->wbuf);
    free(T->gbuf);
    free(T->grefbuf);
    free(T->mom1);
    free(T->mom2);
    free(T->loss);
    gpt_corpus_free(&corpus);
    free(T);
    return rc;
}
