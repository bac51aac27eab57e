/* examples/gpt_cpu.c - train a tiny GPT through a pipeline of CPU threads, on packed
   variable-length sequences (no padding).

   What to copy: a batch of packed sequences (cu_seqlens, pp_batch.loss = PP_LOSS_MEAN_ROWS so
   that micro-batches weigh by tokens), a model whose depth is chosen at run time
   (gpt_model_desc_depth: PP_MODEL counts), a partition by describe()'s cost on a sample, the
   step's Chrome trace (pp_pipeline_timeline), a model with the backward split where the schedule
   has W actions (gpt_model_for), and a check of every layer's gradient against
   pp_sequential_step. Start from mlp_cpu.c if you have not; gpt_mpi.c is this program with one
   process per rank.

   Each step draws --seqs-per-step documents, packs them back to back (token ids, next-token
   targets, cu_seqlens) and hands the batch to the pipeline, which splits it into m micro-batches
   of whole sequences; every layer sees its micro-batch's rebased cu_seqlens in io->mb.

     build/gpt_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v|zb-h2|v-half|v-min|dualpipev] [-p 4]
                   [-v 2] [-m 8] [--steps 60]
                   [--text FILE | --generated] [--seqs-per-step 32] [--max-len 128]
                   [--dim 64] [--heads 4] [--layers 4] [--lr 3e-3] [--lr-min 3e-4] [--warmup 10]
                   [--wd 0.1] [--optim adam|sgd] [--clip 1.0] [--eval-every 10] [--eval-seqs 128]
                   [--split seqs|tokens|cost] [--dtype f32|bf16] [--trace FILE.json] [--check]
                   [--save FILE] [--resume FILE] [--check-resume] [--dp N] [--tp N]

   --layers counts transformer blocks (default 4, or p*v - 2 when the stages need more layers).
   The text is FILE, else README.md in the current directory if there is one, else a generated
   copy task (examples/gpt_data.h); every 10th of its documents is held out, never trained on.
   Per step it prints the step of --steps, the loss, the learning rate, tokens/s, the tokens that
   packing saved against padding every micro-batch to its longest sequence, and how evenly the
   split spread tokens over micro-batches (max / mean; --split seqs, equal sequence counts, shows
   how uneven a count-based split of long-tailed lengths is; the default balances tokens).
   --dtype bf16 sends bf16 activations and their gradients between the layers (examples/gpt.h
   gpt_set_act: f32 arithmetic inside each layer, f32 weights and Adam); after the summary it
   prints what the steps sent: all of it, and the tensors' bytes and messages (half the bytes
   in bf16). --check runs pp_sequential_step on the first batch and requires the pipelined loss and
   every layer's gradient to equal it bit for bit (exit 1 if not). --clip X clips the global
   gradient norm at X before each update (pp_pipeline_grad_clip: the sequential model's norm, bit
   for bit, whatever the schedule) and prints the norm.

   The trainer around the step (docs/training.md): Adam, or AdamW with --wd X (decoupled weight
   decay on the matrices, not the biases and LayerNorm gains); the learning rate warms up
   linearly over --warmup N steps, then follows a cosine from --lr down to --lr-min at --steps
   (defaults: no warm-up, --lr-min = --lr: a constant rate). --eval-every N evaluates the
   held-out documents (the first --eval-seqs of them) after every N-th step and after the last
   with pp_pipeline_eval (forward only) and prints "val loss X"; with --check the first
   evaluation is also run by pp_sequential_eval and must give the same bits (exit 1 if not). An
   evaluation changes nothing of the training: the weights come out bit-identical with or
   without it.

   Checkpoints (pp_ckpt_*, examples/gpt_train.h): --save FILE writes the weights, the optimizer's
   moments and the step count after the last step; --resume FILE starts from one, at its step,
   whatever schedule, p, v or partition saved it (give the same data options and --steps, the
   total). --check-resume trains the first half of --steps with the schedule, p and v given
   (say --schedule interleaved -p 4 -v 2), saves (to --save FILE, else in memory), resumes at
   p = 2 1F1B for the second half, and requires weights and moments to equal, bit for bit, those
   of all --steps uninterrupted at p = 2 1F1B on the same batches (exit 1 if not). The optimizer
   is elementwise and the gradients are bit-identical across schedules, so they must.

   --dp N: N data-parallel replicas of the pipeline in this process (pp_pipeline_desc.dp: p * N
   threads, no grid code). Each step's --seqs-per-step sequences are cut into N shares of whole
   sequences (replica i takes sequences [i S / N, (i + 1) S / N)); each replica's gradient is the
   token-weighted mean over its share, and the step leaves every replica's gradients holding the
   mean over the replicas (the dp sum inside the step, found through pp_model.params). The
   replicas read one copy of the weights; each adds into a gradient buffer of its own. With
   --check, the expected gradients are pp_sequential_step's on each share, added in replica order
   and divided by N: the pipelined loss (the replicas' mean) and every layer's gradient must
   equal them bit for bit. --dp 1 is the program without it, line for line.

   --tp N: every stage's layers split over N TP ranks the Megatron way (examples/gpt.h, TENSOR
   PARALLELISM: heads, MLP units and the vocabulary), pp_pipeline_desc.tp: p * dp * N threads,
   world rank r = (pp_rank * dp + dp_rank) * N + tp_rank; the layers reach their TP group through
   io->tp. TP rank t has a trainer of its own (gpt_trainer_init_tp: its shard of gpt_init's
   weights, its gradients and Adam's moments); every rank of TP rank t reads its weights, replica
   0's add into its gradients, replica i's into a struct of their own. The optimizer runs on each
   shard. --clip: each TP rank's buffers (gpt_grad_bufs_tp: shards declared tp_sharded) through
   pp_grad_norm_tp over a threads world of N ranks, one thread per TP rank (the replicated
   buffers counted once, as TP rank 0 holds them; each rank's shards' squares added in TP rank
   order: gpt_mpi --tp's norm, bit for bit), then each rank clips its own. --check: the
   sequential model at tp N (every TP rank's pp_sequential_step at once on those threads, its
   group in pp_model.ctx) must equal the pipelined one bit for bit, and the loss and every
   gradient buffer must be within 1e-5 (relative) of the tp = 1 model's on the same batch
   ("check: tp N against tp 1" line; exit 1 if not). --tp (any N) prints gpt_mpi's "tp N losses"
   line. --save writes the tp = 1 layout (every TP rank's shards put in place, gpt_full_shard),
   which --resume at any tp reads (each TP rank keeps its shard). --check-resume stays tp 1's. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "gpt.h"
#include "gpt_data.h"
#include "gpt_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --dp N (1: none); --tp N (c.tp; 1: none). */
static int g_dp = 1, g_tp = 1;

/* --tp N: work for each TP rank's thread (pp_threads_run over tp threads): the sequential step at
   that tp (every rank's pp_sequential_step at once, its TP group through pp_model.ctx), the first
   evaluation's check, or the norm and clipping. */
enum { TPJ_REFERENCE, TPJ_VAL_CHECK, TPJ_CLIP };
typedef struct tp_job {
    int what;                   /* TPJ_* */
    gpt_trainer* T;             /* [tp] the TP ranks' trainers */
    const gpt_opts* c;
    pp_model m[PP_MAX_RANKS];   /* [tp] the model with its TP group in ctx */
    pp_group g[PP_MAX_RANKS];   /* [tp] each rank's TP group over w */
    pp_transport t[PP_MAX_RANKS];
    pp_threads* w;              /* tp ranks */
    const pp_batch* b;          /* TPJ_REFERENCE */
    int steps_done, differ[PP_MAX_RANKS]; /* TPJ_VAL_CHECK */
    pp_grad_buf* bufs[PP_MAX_RANKS];      /* TPJ_CLIP: each rank's buffers (gpt_grad_bufs_tp) */
    int nb[PP_MAX_RANKS];
    double clip, norm[PP_MAX_RANKS];
    pp_error err[PP_MAX_RANKS];
} tp_job;

static pp_result tp_job_run(int t, void* user) {
    tp_job* j = (tp_job*)user;
    gpt_trainer* T = &j->T[t];
    pp_result rc;
    switch (j->what) {
    case TPJ_REFERENCE:
        free(T->grefbuf); /* gpt_trainer_reference allocates it anew */
        T->grefbuf = NULL;
        return gpt_trainer_reference(T, &j->m[t], j->b) ? PP_ERR_LAYER : PP_OK;
    case TPJ_VAL_CHECK:
        j->differ[t] = gpt_val_check_say(T, j->c, &j->m[t], j->steps_done, t == 0);
        return PP_OK;
    default: /* pp_grad_norm_tp over this rank's TP group (g NULL: the whole model is here) */
        rc = pp_grad_norm_tp(NULL, &j->g[t], j->m[t].n_layers, j->bufs[t], j->nb[t], &j->norm[t], &j->err[t]);
        if (rc == PP_OK) rc = pp_grad_clip(j->bufs[t], j->nb[t], j->clip, j->norm[t], NULL, &j->err[t]);
        return rc;
    }
}

/* The job's threads world and groups for model m (tp ranks); 0, or 1 with a message. */
static int tp_job_init(tp_job* j, gpt_trainer* T, const gpt_opts* c, const pp_model* m, int tp) {
    pp_error err;
    int t;
    memset(j, 0, sizeof *j);
    j->T = T;
    j->c = c;
    if (pp_threads_create(tp, &j->w, &err) != PP_OK) {
        fprintf(stderr, "--tp %d: %s\n", tp, err.msg);
        return 1;
    }
    for (t = 0; t < tp; t++) {
        j->t[t] = pp_threads_transport(j->w, t);
        j->g[t].t = &j->t[t];
        j->m[t] = *m;
        j->m[t].ctx = &j->g[t];
    }
    return 0;
}

/* Runs what on the tp ranks' threads; 0, or 1 with a message. */
static int tp_job_go(tp_job* j, int what, int tp) {
    pp_error err;
    j->what = what;
    if (pp_threads_run(tp, tp_job_run, j, &err) != PP_OK) {
        fprintf(stderr, "--tp %d: %s\n", tp, err.msg);
        return 1;
    }
    return 0;
}

/* The held-out batches through the pipeline's forward-only step after steps_done steps, and
   their line; with check, against pp_sequential_eval (*differ set when they differ; --tp: every
   TP rank's at once on its threads, j). 0 on success, 1 when an evaluation failed. */
static int evaluate(const gpt_opts* c, gpt_trainer* T, pp_pipeline* pl, const pp_model* m, int steps_done, int check,
                    int* differ, tp_job* j) {
    double t0 = gpt_now();
    pp_step_stats st;
    int i, t;
    for (i = 0; i < T->n_val; i++) {
        pp_batch b[PP_MAX_RANKS]; /* --dp: every replica evaluates the batch (their mean is its loss) */
        int k;
        for (k = 0; k < g_dp; k++) b[k] = gpt_step_batch(c, &T->val[i]);
        if (pp_pipeline_eval(pl, b, NULL, &st) != PP_OK) {
            fprintf(stderr, "evaluation after %d steps: %s\n", steps_done, pp_pipeline_error(pl));
            return 1;
        }
        T->val_loss[i] = st.loss;
    }
    gpt_val_print(T, steps_done, gpt_now() - t0);
    if (!check) return 0;
    if (g_tp == 1) {
        if (gpt_val_check(T, c, m, steps_done)) *differ = 1;
        return 0;
    }
    for (t = 1; t < g_tp; t++) memcpy(T[t].val_loss, T->val_loss, (size_t)T->n_val * sizeof(float));
    j->steps_done = steps_done;
    if (tp_job_go(j, TPJ_VAL_CHECK, g_tp)) return 1;
    for (t = 0; t < g_tp; t++)
        if (j->differ[t]) *differ = 1;
    return 0;
}

/* --dp: replica i's share of a step's packed batch: sequences [i S / dp, (i + 1) S / dp), its
   cu_seqlens rebased into cu (n_seqs / dp + 2 entries at most). */
static pp_batch replica_batch(const gpt_opts* c, const gpt_step* sd, int dp, int i, int32_t* cu) {
    pp_batch b = gpt_step_batch(c, sd);
    int s0 = (int)((int64_t)sd->n_seqs * i / dp), s1 = (int)((int64_t)sd->n_seqs * (i + 1) / dp), k;
    if (dp == 1) return b;
    for (k = s0; k <= s1; k++) cu[k - s0] = sd->cu[k] - sd->cu[s0];
    b.input.data = sd->tokens + sd->cu[s0];
    b.input.rows = sd->cu[s1] - sd->cu[s0];
    b.targets = sd->targets + sd->cu[s0];
    b.cu_seqlens = cu;
    b.n_seqs = s1 - s0;
    return b;
}

/* --check: the expected gradients of a step: pp_sequential_step on the batch (--tp: every TP rank's
   at once, j), and with --dp on each share into its own buffer, added in replica order, times
   1 / dp (the pipeline's dp sum and scale), into each TP rank's T[t].grefbuf; the loss the same
   way. 0 on success. */
static int step_reference(gpt_trainer* T, const gpt_opts* c, const pp_model* m, const gpt_step* sd, int dp, int32_t* cu,
                          tp_job* j) {
    const size_t n = T->n_params;
    float* acc = dp > 1 ? (float*)calloc(n * (size_t)g_tp, sizeof(float)) : NULL;
    float loss[PP_MAX_RANKS];
    size_t k;
    int i, t, rc = 1;
    if (dp > 1 && !acc) return 1;
    for (i = 0; i < dp; i++) {
        pp_batch b = replica_batch(c, sd, dp, i, cu);
        if (g_tp > 1) {
            j->b = &b;
            if (tp_job_go(j, TPJ_REFERENCE, g_tp)) goto done;
        } else {
            free(T->grefbuf); /* gpt_trainer_reference allocates it anew */
            T->grefbuf = NULL;
            if (gpt_trainer_reference(T, m, &b)) goto done;
        }
        for (t = 0; acc && t < g_tp; t++) {
            float *a = acc + n * (size_t)t, *g = T[t].grefbuf;
            for (k = 0; k < n; k++) a[k] = i ? a[k] + g[k] : g[k];
            loss[t] = i ? loss[t] + T[t].ref_loss : T[t].ref_loss;
        }
    }
    for (t = 0; acc && t < g_tp; t++) {
        for (k = 0; k < n; k++) T[t].grefbuf[k] = acc[n * (size_t)t + k] * (float)(1.0 / dp);
        T[t].ref_loss = loss[t] / (float)dp;
    }
    rc = 0;
done:
    free(acc);
    return rc;
}

/* --tp --check: every TP rank's reference against the tp = 1 model on the same batches (the
   step's, or --dp's shares): within GPT_TP_TOL. Prints the line; 0 when within, else 1. */
static int check_tp1(gpt_trainer* T, const gpt_opts* c, const gpt_step* sd, int dp, int32_t* cus) {
    pp_batch b[PP_MAX_RANKS];
    gpt_model fg;
    float loss1 = 0, *fgbuf;
    double loss_rel = 0, worst = 0;
    char name[64] = "";
    int i, t, bad = 0;
    for (i = 0; i < dp; i++) b[i] = replica_batch(c, sd, dp, i, cus + (size_t)i * ((size_t)c->seqs / (size_t)dp + 2));
    if (!(fgbuf = gpt_tp1_reference(T, c, b, dp, &fg, &loss1))) return 1;
    for (t = 0; t < g_tp; t++)
        if (gpt_tp1_compare(&T[t], &fg, loss1, &loss_rel, &worst, name, sizeof name)) bad = 1;
    free(fgbuf);
    bad = bad || !(loss_rel <= GPT_TP_TOL) || !(worst <= GPT_TP_TOL);
    printf("check: tp %d against tp 1 on step 0: loss %.3g, gradients %.3g (%s) relative (largest over TP ranks and "
           "buffers; tolerance %g) %s\n",
           g_tp, loss_rel, worst, name, GPT_TP_TOL, bad ? "DIFFERENT" : "ok");
    return bad;
}

/* Steps [from, to) of T's batches on a pipeline of (kind, p, v), then the summary; 0 on success.
   T: the TP ranks' trainers (g_tp of them; T[0] holds the losses). */
static int train(const gpt_opts* c, gpt_trainer* T, pp_schedule_kind kind, int p, int v, int from, int to) {
    double t0, wall, t_eval = 0;
    int step, l, rc = 1, bad = 0, nb = 0, evals = 0, val_differ = 0;
    double norm = -1;
    pp_grad_buf bufs[GPT_MAX_BLOCK + 2];
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    gpt_traffic tr;
    gpt_opts part = *c;
    unsigned char rflags[GPT_MAX_BLOCK + 2]; /* --recompute */
    size_t peak = 0;                         /* the most stash bytes one rank held in a step */
    int dp = g_dp, tp = g_tp, W = p * g_dp * g_tp, r, i, t, tp_bad = 0;
    const size_t n = T->n_params;            /* one TP rank's (all alike) */
    const void** rw = NULL;                  /* --dp, --tp: world rank r reads T[its TP rank].w */
    void** rg = NULL;                        /* replica 0 adds into T[t].g, replica i > 0 into gx[i * tp + t] */
    gpt_model* gx = NULL;
    float* gxbuf = NULL;
    int32_t* cu = NULL;                      /* --dp: a share's rebased cu_seqlens */
    int32_t* cus = NULL;                     /* --dp: every share's */
    pp_batch* bs = NULL;
    tp_job* job = NULL;                      /* --tp: the TP ranks' threads for the checks and --clip */
    pp_grad_buf* tbufs = NULL;               /* --tp --clip: each TP rank's buffers */
    double* norms = NULL;                    /* (to) --clip's norm of every step, for the --tp line */
    const size_t cus_n = ((size_t)c->seqs / (size_t)dp + 2) * (size_t)dp;
    /* the pipeline; stages partitioned by describe()'s cost on one sequence of the corpus'
       attention length */
    memset(&d, 0, sizeof d);
    memset(&tr, 0, sizeof tr);
    d.model = gpt_model_for(kind, c->layers); /* split blocks where the schedule has W */
    d.weights = &T->w;
    d.grads = &T->g;
    norms = (double*)calloc((size_t)to, sizeof *norms);
    if (!norms) {
        fprintf(stderr, "out of memory\n");
        goto cleanup;
    }
    if (W > p) { /* p * dp * tp ranks: r = (pp_rank * dp + dp_rank) * tp + tp_rank */
        rw = (const void**)calloc((size_t)W, sizeof *rw);
        rg = (void**)calloc((size_t)W, sizeof *rg);
        gx = (gpt_model*)calloc((size_t)(dp * tp), sizeof *gx);
        gxbuf = (float*)calloc(n * (size_t)((dp - 1) * tp) + 1, sizeof(float));
        cu = (int32_t*)calloc((size_t)c->seqs / (size_t)dp + 2, sizeof *cu);
        cus = (int32_t*)calloc(cus_n, sizeof *cus);
        bs = (pp_batch*)calloc((size_t)dp, sizeof *bs);
        if (!rw || !rg || !gx || !gxbuf || !cu || !cus || !bs) {
            fprintf(stderr, "out of memory\n");
            goto cleanup;
        }
        for (i = 1; i < dp; i++)
            for (t = 0; t < tp; t++) gpt_bind_tp(&gx[i * tp + t], &T->gc, tp, t, gxbuf + n * (size_t)((i - 1) * tp + t));
        for (r = 0; r < W; r++) {
            t = r % tp;
            i = r / tp % dp;
            rw[r] = &T[t].w;
            rg[r] = i ? (void*)&gx[i * tp + t] : (void*)&T[t].g;
        }
        d.weights = d.grads = NULL;
        d.rank_weights = rw;
        d.rank_grads = rg;
        d.dp = dp; /* the mean over the replicas (dp_scale 0) */
        d.tp = tp; /* the layers' TP group: io->tp (examples/gpt.h gpt_tp_group) */
    }
    if (tp > 1) {
        if (!(job = (tp_job*)malloc(sizeof *job)) || tp_job_init(job, T, c, &d.model, tp)) {
            if (!job) fprintf(stderr, "out of memory\n");
            free(job);
            job = NULL;
            goto cleanup;
        }
        if (!(tbufs = (pp_grad_buf*)calloc((size_t)tp * (12 * GPT_MAX_BLOCK + 5), sizeof *tbufs))) {
            fprintf(stderr, "out of memory\n");
            goto cleanup;
        }
        for (t = 0; t < tp; t++) { /* every layer's, tp_sharded where a TP shard */
            job->bufs[t] = tbufs + (size_t)t * (12 * GPT_MAX_BLOCK + 5);
            gpt_grad_bufs_tp(&T[t], 0, d.model.n_layers, job->bufs[t], &job->nb[t]);
        }
        job->clip = c->clip;
    }
    d.schedule = kind;
    d.p = p;
    d.v = v;
    d.m = c->m;
    d.partition.policy = PP_PARTITION_COST;
    d.partition.sample = &T->sample;
    d.stage.record_timeline = c->trace != NULL;
    d.stage.recompute = gpt_recompute_flags(c->recompute, d.model.n_layers, rflags);
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        goto cleanup;
    }
    printf("gpt: %d layers (embed, %d blocks, head), C=%d, %d heads, vocab %d, %zu parameters%s\n", d.model.n_layers,
           c->layers, c->dim, c->heads, T->gc.vocab, n, tp > 1 ? " per TP rank" : "");
    gpt_trainer_print(T, c);
    printf("%s p=%d v=%d m=%d, %d sequences per step split by %s%s\n", pp_schedule_name(kind), p,
           pp_pipeline_schedule(pl)->v, c->m, c->seqs,
           c->split == PP_SPLIT_SEQS ? "count" : c->split == PP_SPLIT_TOKENS ? "tokens" : "cost", from ? ", resumed" : "");
    if (dp > 1)
        printf("data parallel: %d replicas of the pipeline (%d threads), %d sequences each per step, gradients averaged "
               "over the replicas inside the step\n", dp, W, c->seqs / dp);
    if (tp > 1)
        printf("tensor parallel: every stage's layers split over %d TP ranks (heads, MLP units, vocabulary), %d threads "
               "in all, the TP group as io->tp\n", tp, W);
    pp_partition_print(stdout, &d.model, pp_pipeline_partition(pl), pp_pipeline_schedule(pl)->n_stages, NULL);
    gpt_grad_bufs(T, 0, d.model.n_layers, bufs, &nb); /* every layer: one process holds them all */

    t0 = gpt_now();
    for (step = from; step < to; step++) {
        pp_batch b = gpt_step_batch(c, &T->steps[step]);
        pp_result src;
        if (dp > 1) { /* replica i's share in bs[i] (its cu_seqlens are copied at the step) */
            for (i = 0; i < dp; i++) bs[i] = replica_batch(c, &T->steps[step], dp, i, cus + (size_t)i * (cus_n / (size_t)dp));
            src = pp_pipeline_step(pl, bs, &st);
        } else {
            src = pp_pipeline_step(pl, &b, &st);
        }
        if (src != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, pp_pipeline_error(pl));
            goto cleanup;
        }
        if (c->check && step == 0) {
            if (step_reference(T, c, &d.model, &T->steps[step], dp, cu, job)) goto cleanup;
            for (t = 0; t < tp; t++) {
                for (l = 0; l < d.model.n_layers; l++) bad += gpt_trainer_differs(&T[t], &d.model, l);
                if (memcmp(&T[t].ref_loss, &T->ref_loss, sizeof(float))) {
                    fprintf(stderr, "check: TP rank %d's sequential loss differs from TP rank 0's\n", t);
                    bad++;
                }
                for (i = 1; i < dp; i++) /* every replica holds the same mean */
                    if (memcmp(gxbuf + n * (size_t)((i - 1) * tp + t), T[t].gbuf, n * sizeof(float))) {
                        fprintf(stderr, "check: replica %d's gradients differ from replica 0's (TP rank %d)\n", i, t);
                        bad++;
                    }
            }
            if (tp > 1) tp_bad = check_tp1(T, c, &T->steps[step], dp, cus ? cus : cu);
        }
        if (c->clip > 0 && tp > 1) { /* every TP rank: pp_grad_norm_tp over its TP group, then its clip */
            if (tp_job_go(job, TPJ_CLIP, tp)) {
                for (t = 0; t < tp; t++)
                    if (job->err[t].msg[0]) fprintf(stderr, "step %d: TP rank %d: %s\n", step, t, job->err[t].msg);
                goto cleanup;
            }
            norm = job->norm[0];
        } else if (c->clip > 0 && pp_pipeline_grad_clip(pl, bufs, nb, c->clip, &norm, &err) != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, err.msg);
            goto cleanup;
        }
        norms[step] = norm;
        /* at gpt_lr(c, step), decaying where T->decay says; zeroes the gradients (--dp: replica 0's,
           which every replica's equal; the others' are zeroed here); --tp: every TP rank its shard */
        for (t = 0; t < tp; t++) gpt_optimize(c, T[t].wbuf, T[t].gbuf, T[t].m1, T[t].m2, T[t].decay, n, step);
        if (dp > 1) memset(gxbuf, 0, n * (size_t)((dp - 1) * tp) * sizeof(float));
        T->loss[step] = st.loss;
        gpt_traffic_add(&tr, &st);
        gpt_pipeline_peak(pl, p, &peak);
        gpt_step_print(c, step, st.loss, &T->steps[step], st.t_total, norm);
        if (gpt_eval_due(c, step, to - 1)) { /* --eval-every: the weights after step + 1 steps */
            double te = gpt_now();
            if (evaluate(c, T, pl, &d.model, step + 1, c->check && evals++ == 0, &val_differ, job)) goto cleanup;
            t_eval += gpt_now() - te;
        }
    }
    wall = gpt_now() - t0 - t_eval; /* the training's time: tokens/s leaves the evaluations out */
    part.steps = to - from;
    gpt_report(&part, T->steps + from, T->loss + from, wall);
    gpt_traffic_print("", &tr, c->dtype);
    gpt_loop_print_peak(peak, c->recompute, d.model.n_layers);
    if (c->trace) {
        FILE* f = fopen(c->trace, "w");
        size_t ne = 0;
        const pp_event* ev = pp_pipeline_timeline(pl, &ne);
        if (f) {
            pp_timeline_chrome(f, ev, ne, 1e6);
            fclose(f);
            printf("timeline of the last step: %s, %zu actions (open in ui.perfetto.dev)\n", c->trace, ne);
        }
    }
    if (c->tp) { /* --tp (any N): every step's loss and norm to 9 and 17 digits, gpt_mpi's line */
        printf("tp %d losses", tp);
        for (step = from; step < to; step++) printf(" %.9g", (double)T->loss[step]);
        printf(" norms");
        for (step = from; step < to; step++) printf(" %.17g", norms[step]);
        printf("\n");
    }
    rc = (c->check && from == 0 ? gpt_trainer_verdict(T, bad) : 0) || val_differ || tp_bad;
cleanup:
    pp_pipeline_destroy(pl);
    if (job) pp_threads_destroy(job->w);
    free(job);
    free(tbufs);
    free(norms);
    free(rw);
    free(rg);
    free(gx);
    free(gxbuf);
    free(cu);
    free(cus);
    free(bs);
    return rc;
}

/* --check-resume: half the steps on the given schedule, a checkpoint, the other half at p = 2
   1F1B from it; against all the steps at p = 2 1F1B uninterrupted. */
static int check_resume(gpt_opts* c) {
    gpt_trainer A, B, R;
    pp_model m = gpt_model_desc_depth(c->layers);
    pp_ckpt_desc k;
    pp_ckpt_info info;
    pp_error err;
    unsigned char* img = NULL;
    uint64_t size = 0;
    int half = c->steps / 2, rc = 1, have = 0, from = 0, same_w, same_m;
    size_t bytes;
    if (half < 1) {
        fprintf(stderr, "--check-resume needs --steps 2 or more\n");
        return 2;
    }
    c->check = 0;
    printf("== %d steps at %s p=%d v=%d, then a checkpoint\n", half, pp_schedule_name(c->kind), c->p, c->v);
    if (gpt_trainer_init(&A, c)) return 1;
    have = 1;
    if (train(c, &A, c->kind, c->p, c->v, 0, half)) goto cleanup;
    if (c->save) {
        if (gpt_trainer_save(&A, &m, half, c->save)) goto cleanup;
    } else {
        k = gpt_trainer_ckpt(&A, &m, half, NULL);
        if (pp_ckpt_size(&k, &size, &err) != PP_OK || !(img = (unsigned char*)malloc((size_t)size)) ||
            pp_ckpt_save_mem(&k, img, (size_t)size, &err) != PP_OK) {
            fprintf(stderr, "checkpoint: %s\n", img ? err.msg : "out of memory");
            goto cleanup;
        }
        printf("checkpoint: %llu bytes in memory\n", (unsigned long long)size);
    }
    printf("== resumed at 1f1b p=2 for steps %d .. %d\n", half, c->steps - 1);
    if (gpt_trainer_init(&B, c)) goto cleanup;
    have = 2;
    if (c->save) {
        if (gpt_trainer_resume(&B, &m, c->save, NULL, &from)) goto cleanup;
    } else {
        k = gpt_trainer_ckpt(&B, &m, 0, NULL);
        if (pp_ckpt_load_mem(&k, img, (size_t)size, &info, &err) != PP_OK) {
            fprintf(stderr, "resume: %s\n", err.msg);
            goto cleanup;
        }
        from = (int)info.step;
    }
    if (train(c, &B, PP_SCHED_1F1B, 2, 1, from, c->steps)) goto cleanup;
    printf("== the reference: %d steps at 1f1b p=2 uninterrupted\n", c->steps);
    if (gpt_trainer_init(&R, c)) goto cleanup;
    have = 3;
    if (train(c, &R, PP_SCHED_1F1B, 2, 1, 0, c->steps)) goto cleanup;
    bytes = R.n_params * sizeof(float);
    same_w = memcmp(B.wbuf, R.wbuf, bytes) == 0;
    same_m = memcmp(B.m1, R.m1, bytes) == 0 && memcmp(B.m2, R.m2, bytes) == 0;
    printf("check-resume: %d steps at %s p=%d v=%d + %d resumed at 1f1b p=2 vs %d at 1f1b p=2: weights %s, "
           "optimizer moments %s\n",
           half, pp_schedule_name(c->kind), c->p, c->v, c->steps - half, c->steps,
           same_w ? "bit-identical" : "DIFFERENT", same_m ? "bit-identical" : "DIFFERENT");
    rc = !(same_w && same_m);
cleanup:
    if (have >= 3) gpt_trainer_free(&R, c);
    if (have >= 2) gpt_trainer_free(&B, c);
    if (have >= 1) gpt_trainer_free(&A, c);
    free(img);
    return rc;
}

/* Frees the first n TP ranks' trainers and the array. */
static void trainers_free(gpt_trainer* T, int n, const gpt_opts* c) {
    int t;
    for (t = 0; t < n; t++) gpt_trainer_free(&T[t], c);
    free(T);
}

int main(int argc, char** argv) {
    gpt_opts c;
    gpt_trainer* T;
    gpt_full full;          /* --tp > 1 with --save or --resume: the tp = 1 layout */
    pp_model m;
    pp_ckpt_desc k;
    int rc, from = 0;
    int i, j, t;
    memset(&full, 0, sizeof full);
    for (i = j = 1; i < argc; i++) { /* --dp N is this program's (gpt_opts are shared with gpt_mpi) */
        if (!strcmp(argv[i], "--dp") && i + 1 < argc) g_dp = atoi(argv[++i]);
        else argv[j++] = argv[i];
    }
    argc = j;
    if (gpt_opts_parse(argc, argv, &c) || gpt_opts_check(&c)) {
        gpt_opts_usage("gpt_cpu");
        fprintf(stderr, "       [--dp N]\n");
        return 2;
    }
    if (g_dp < 1 || c.p * g_dp > PP_MAX_RANKS || c.seqs / g_dp < c.m) {
        fprintf(stderr, "--dp %d: need 1 <= dp, p * dp <= %d and --seqs-per-step / dp >= m (%d / %d < %d)\n", g_dp,
                PP_MAX_RANKS, c.seqs, g_dp > 0 ? g_dp : 1, c.m);
        return 2;
    }
    g_tp = c.tp > 1 ? c.tp : 1;
    if (c.p * g_dp * g_tp > PP_MAX_RANKS) { /* (gpt_opts_check: tp divides the heads and the vocabulary) */
        fprintf(stderr, "--tp %d: p * dp * tp = %d threads, more than %d\n", g_tp, c.p * g_dp * g_tp, PP_MAX_RANKS);
        return 2;
    }
    if (c.check_resume && g_tp > 1) {
        fprintf(stderr, "gpt_cpu: --check-resume runs at tp 1 (--save and --resume work with --tp)\n");
        return 2;
    }
    if (c.tp_whole) { /* pp_pipeline_desc.tp always splits the boundaries */
        fprintf(stderr, "gpt_cpu: --tp-whole is gpt_mpi's (the one-process pipeline splits every boundary over TP)\n");
        return 2;
    }
    if (c.check_resume) return check_resume(&c);
    if (!(T = (gpt_trainer*)calloc((size_t)g_tp, sizeof *T))) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    for (t = 0; t < g_tp; t++) /* TP rank t's shard of gpt_init's weights (tp 1: all of them) */
        if (gpt_trainer_init_tp(&T[t], &c, t)) {
            trainers_free(T, t, &c);
            return 2;
        }
    m = gpt_model_desc_depth(c.layers);
    rc = 1;
    if ((c.resume || c.save) && g_tp > 1 && gpt_full_alloc(&full, T)) {
        fprintf(stderr, "out of memory\n");
        goto done;
    }
    if (c.resume && g_tp > 1) { /* the whole layers, then every TP rank its shard */
        k = gpt_ckpt_of(&m, "gpt", &full.w, full.moments, NULL, 0);
        if (gpt_ckpt_load_path(&k, c.resume, &from)) goto done;
        for (t = 0; t < g_tp; t++) gpt_full_shard(&T[t], &full, 0);
    } else if (c.resume && gpt_trainer_resume(T, &m, c.resume, NULL, &from)) {
        goto done;
    }
    if (from >= c.steps) {
        fprintf(stderr, "--resume %s: it is at step %d, --steps %d leaves nothing to do\n", c.resume, from, c.steps);
        goto done;
    }
    if (from) printf("resumed from %s at step %d%s\n", c.resume, from, g_tp > 1 ? ", each TP rank its shard" : "");
    rc = train(&c, T, c.kind, c.p, c.v, from, c.steps);
    if (rc == 0 && c.save && g_tp > 1) { /* every TP rank's shards into their places: the tp = 1 file */
        for (t = 0; t < g_tp; t++) gpt_full_shard(&T[t], &full, 1);
        k = gpt_ckpt_of(&m, "gpt", &full.w, full.moments, NULL, c.steps);
        rc = gpt_ckpt_save_path(&k, c.save);
    } else if (rc == 0 && c.save) {
        rc = gpt_trainer_save(T, &m, c.steps, c.save);
    }
done:
    free(full.buf);
    trainers_free(T, g_tp, &c);
    return rc;
}
