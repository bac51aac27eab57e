/* examples/gpt_cuda.cu - a small GPT trained through a pipeline of CUDA streams (pipeline_cuda.h).

   What to copy: pp_cuda_pipeline_create (pipeline.h's one-process layer with every rank a
   stream: the same desc as mlp_cpu.c's, plus the GPUs), weights per GPU and gradients per rank
   (rank_weights, rank_grads), the step between host work on the legacy stream and the
   optimizer, and the model in examples/gpt_cuda.h (layers on io->ctx's stream, the run's shared
   state as the model's context). Start from mlp_cpu.c; gpt_nccl.cu is this model with one
   process per GPU.

   The model of examples/gpt.h on the GPU: token + position embedding (the position restarts at
   every packed sequence), pre-LN transformer blocks (causal attention that never crosses a
   sequence boundary, MLP C -> 4C -> GELU -> C), a final LayerNorm and an LM head TIED to the
   token embedding. Trained on packed variable-length documents of bundled text (README.md by
   default) with AdamW. Every rank is a host thread that enqueues its stages' kernels on its own
   stream; the library moves activations between streams (and GPUs) with event-ordered copies.

     build/gpt_cuda [--schedule gpipe|1f1b|interleaved] [-p 4] [-v 2] [-m 8] [--steps 40]
                    [--gpus N] [--text FILE | --generated] [--seqs-per-step 64] [--max-len 128]
                    [--dim 128] [--heads 4] [--layers 4] [--lr 1e-3] [--lr-min X] [--warmup N] [--wd X]
                    [--clip X] [--eval-every N] [--eval-seqs 128] [--save FILE] [--resume FILE]
                    [--dtype f32|bf16] [--recompute K] [--trace FILE] [--check] [--check-resume] [--bench]
                    [--cpu] [--gradcheck] [--gemm cublas|naive] [--vs-naive]

   Prints per step: the step, loss, learning rate, tokens, tokens/s, the measured bubble (CUDA
   event timeline) and with --clip the gradient norm; at the end, tokens/s over the run and the
   GPU memory each stage's block pool holds next to the parameter and gradient bytes.
   The training options mean what they mean in gpt_cpu (examples/gpt_loop.h, docs/training.md
   section 10): --lr-min/--warmup (warm-up, then cosine to --lr-min at --steps), --wd (AdamW's
   decoupled decay on the matrices), --clip (the global gradient norm, pp_pipeline_grad_clip),
   --eval-every N/--eval-seqs N (the held-out split, every 10th document, through
   pp_pipeline_eval: "val loss"), --save/--resume (pp_ckpt_* of weights, Adam's moments and the
   step; any p and schedule, the same file as gpt_nccl's), --recompute K (every K-th block's
   activations recomputed right before its B, pp_stage_desc.recompute: the same bits, less
   stashed; the closing "activations:" line gives the most stash bytes one rank held).
   --check-resume half the steps at the configured p, saved, the rest resumed at p = 2 1F1B:
                  losses and final weights BIT-IDENTICAL to p = 2 uninterrupted (exit 1 if not)
   --gpus N       spreads rank r over GPU r % N (default 1: every stage on one GPU)
   --check        trains the same steps unpipelined (p = 1, one stream) from the same start and
                  requires the loss curve and final weights to be BIT-IDENTICAL (exit 1 if not):
                  the kernels are deterministic (one thread per output, fixed summation order, no
                  atomics; cuBLAS with atomics off computes the same bits for the same shapes, and
                  a micro-batch has the same shapes pipelined or not) and gradients accumulate in
                  ascending micro-batch order on every schedule
   --dtype bf16   the activations between layers and their gradients in bf16 (half the bytes
                  between stages; each layer widens them to f32, computes in f32, rounds its output
                  to nearest even); weights, gradients and Adam's moments stay f32. --check then
                  compares the bf16 pipelined run with the bf16 unpipelined one, bit for bit
   --gemm naive   the matrix products as plain kernels (one thread per output) instead of cuBLAS
                  (cublasSgemm, full fp32: the default on a GPU)
   --vs-naive     trains again with --gemm naive and compares the loss curves: the largest
                  relative difference must stay under 1e-4 (exit 1 if not)
   --bench        times steps at the configured p against p = 1 on the same GPU and prints the ratio
   --trace FILE   Chrome trace JSON (ui.perfetto.dev) of the last step, one track per rank
   --cpu          runs the same layer code on the host (threads transport, host blocks): the
                  kernels are __host__ __device__ functors, so the math is testable without a GPU
   --gradcheck    (with --cpu) compares every layer kind's gradients with finite differences (f32 only)

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
#include <unistd.h>

#include "gpt_cuda.h" /* the model: kernels, layout, layer callbacks, memory helpers */

/* ---- training ---------------------------------------------------------------------------------- */
typedef struct cfg : gptc_opts { /* the options gpt_nccl shares, and gpt_cuda's own */
    int p, gpus;
    const char* trace;
    int check, bench, gradcheck, cpu;
    int naive;                  /* --gemm naive: the matrix products as plain kernels, not cuBLAS */
    int vs_naive;               /* --vs-naive: the same run with the naive kernels, losses compared */
    int check_resume;           /* --check-resume: saved halfway at the configured p, resumed at p = 2
                                   1F1B, against p = 2 uninterrupted */
    int stop;                   /* train: stop (and --save) after this many steps (0: --steps) */
} cfg;

typedef struct run_out {
    float loss[1024];
    double tok_s, step_s, bubble;
    float* final_params;        /* host copy, n params */
    size_t n_params;
    size_t pool_bytes[PP_MAX_RANKS];
    int pool_allocs_first[PP_MAX_RANKS], pool_allocs[PP_MAX_RANKS];
    double step_time_mean;      /* seconds, steps after the first two */
    gpt_traffic traffic;        /* what the steps sent between stages */
} run_out;

typedef struct trainer {
    cfg c;
    int p, v, n_dev, cpu;
    gptc_run run;               /* the model's context: sizes, per-device tables, cpu */
    pp_model model;
    pp_pipeline* pl;
    size_t peak_stash;          /* the most stash bytes one rank held in a step */
    /* per device */
    float* wbuf[GPTC_MAX_DEV];
    gptc_model w[GPTC_MAX_DEV];
    int32_t *tok[GPTC_MAX_DEV], *tgt[GPTC_MAX_DEV], *pos[GPTC_MAX_DEV], *sst[GPTC_MAX_DEV], *sen[GPTC_MAX_DEV];
    /* per rank */
    int dev[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    gptc_model* g;              /* [p] */
    const void* wptr[PP_MAX_RANKS];
    void* gptr[PP_MAX_RANKS];
    int last_rank;              /* owns the head: its device holds the losses */
    /* optimizer on device 0 */
    float *gsum, *gtmp, *m1, *m2;
    unsigned char* decay;       /* (n_par) 1 where --wd decays (gptc_decay_mask) */
    gptc_model mw1, mw2;        /* the moments bound like the weights (checkpoints) */
    const void* moments[2];     /* &mw1, &mw2 */
    size_t n_par, n_grad;
    pp_batch batch;
    int cap_rows, cap_seqs;
    int32_t *h_tok, *h_tgt, *h_cu, *h_pos, *h_sst, *h_sen;
} trainer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_device(const trainer* t, int d) {
    if (!t->cpu) cudaSetDevice(d);
}

/* The batch's buffers: tokens, targets and the per-row tables on the host (and cu_seqlens) and
   on every device; freed (and NULL), or allocated for cap rows (0, or 1 out of memory). */
static void tables_free(trainer* t) {
    int32_t** h[6] = {&t->h_tok, &t->h_tgt, &t->h_pos, &t->h_sst, &t->h_sen, &t->h_cu};
    for (int k = 0; k < 6; k++) {
        free(*h[k]);
        *h[k] = NULL;
    }
    for (int d = 0; d < t->n_dev; d++) {
        int32_t** g[5] = {&t->tok[d], &t->tgt[d], &t->pos[d], &t->sst[d], &t->sen[d]};
        set_device(t, d);
        for (int k = 0; k < 5; k++) {
            gptc_free(t->cpu, *g[k]);
            *g[k] = NULL;
        }
    }
}
static int tables_alloc(trainer* t, int cap) {
    int32_t** h[5] = {&t->h_tok, &t->h_tgt, &t->h_pos, &t->h_sst, &t->h_sen};
    tables_free(t);
    for (int k = 0; k < 5; k++)
        if (!(*h[k] = (int32_t*)malloc(sizeof(int32_t) * (size_t)cap))) return 1;
    if (!(t->h_cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(t->cap_seqs + 1)))) return 1;
    for (int d = 0; d < t->n_dev; d++) {
        int32_t** g[5] = {&t->tok[d], &t->tgt[d], &t->pos[d], &t->sst[d], &t->sen[d]};
        set_device(t, d);
        for (int k = 0; k < 5; k++)
            if (!(*g[k] = (int32_t*)gptc_alloc(t->cpu, sizeof(int32_t) * (size_t)cap))) return 1;
    }
    return 0;
}

static void trainer_free(trainer* t) {
    if (!t->cpu) cudaDeviceSynchronize();
    gptc_blas_destroy(t->run.blas); /* before the streams its handles are bound to */
    t->run.blas = NULL;
    pp_pipeline_destroy(t->pl);
    for (int r = 0; r < t->p; r++) {
        set_device(t, t->dev[r]);
        gptc_free(t->cpu, t->gbuf[r]);
    }
    tables_free(t);
    for (int d = 0; d < t->n_dev; d++) {
        set_device(t, d);
        gptc_free(t->cpu, t->wbuf[d]);
        gptc_free(t->cpu, t->run.tab[d].mb_loss);
    }
    set_device(t, 0);
    gptc_free(t->cpu, t->gsum);
    gptc_free(t->cpu, t->gtmp);
    gptc_free(t->cpu, t->m1);
    gptc_free(t->cpu, t->m2);
    gptc_free(t->cpu, t->decay);
    free(t->g);
}

static int trainer_init(trainer* t, const cfg* c, int p, pp_schedule_kind kind, int v, int n_dev) {
    pp_error err;
    int chunk;
    memset(t, 0, sizeof *t);
    t->c = *c;
    t->p = p;
    t->v = v;
    t->n_dev = n_dev;
    t->cpu = c->cpu;
    t->run.cpu = c->cpu;
    if (!c->cpu && !c->naive && !(t->run.blas = gptc_blas_create())) return 1;
    t->run.cfg = gptc_opts_config(c);
    t->model = gptc_model_desc_depth(&t->run);
    t->n_par = gptc_numel(&t->run.cfg);
    t->n_grad = t->n_par + (size_t)t->run.cfg.V * t->run.cfg.C;
    /* identical initial weights on every device */
    {
        float* h = (float*)malloc(sizeof(float) * t->n_par);
        if (!h) return 1;
        gptc_init_weights(&t->run.cfg, h);
        for (int d = 0; d < n_dev; d++) {
            set_device(t, d);
            if (!(t->wbuf[d] = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_par)) ||
                gptc_copy(t->cpu, t->wbuf[d], h, sizeof(float) * t->n_par) ||
                !(t->run.tab[d].mb_loss = (float*)gptc_alloc(t->cpu, sizeof(float) * 1024))) {
                free(h);
                fprintf(stderr, "device %d: weights\n", d);
                return 1;
            }
            gptc_bind(&t->w[d], &t->run.cfg, t->wbuf[d], 0);
        }
        free(h);
    }
    set_device(t, 0);
    if (!(t->gsum = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_grad)) ||
        !(t->gtmp = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_grad)) ||
        !(t->m1 = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_par)) ||
        !(t->m2 = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_par)) || !(t->g = (gptc_model*)calloc((size_t)p, sizeof *t->g)) ||
        !(t->decay = (unsigned char*)gptc_alloc(t->cpu, t->n_par)))
        return 1;
    gptc_bind(&t->mw1, &t->run.cfg, t->m1, 0);
    gptc_bind(&t->mw2, &t->run.cfg, t->m2, 0);
    t->moments[0] = &t->mw1;
    t->moments[1] = &t->mw2;
    {
        unsigned char* h = (unsigned char*)malloc(t->n_par);
        int bad = !h || gptc_decay_mask(&t->run.cfg, h) || gptc_copy(t->cpu, t->decay, h, t->n_par);
        free(h);
        if (bad) return 1;
    }
    /* each rank its own gradients on its GPU; weights: its device's copy */
    for (int r = 0; r < p; r++) {
        t->dev[r] = r % n_dev;
        set_device(t, t->dev[r]);
        if (!(t->gbuf[r] = (float*)gptc_alloc(t->cpu, sizeof(float) * t->n_grad))) return 1;
        gptc_bind(&t->g[r], &t->run.cfg, t->gbuf[r], 1);
        t->wptr[r] = &t->w[t->dev[r]];
        t->gptr[r] = &t->g[r];
    }
    /* the pipeline: host threads with --cpu, else CUDA streams on the ranks' GPUs */
    {
        pp_pipeline_desc d;
        unsigned char rflags[GPTC_MAX_BLOCK + 2]; /* --recompute (copied at create) */
        memset(&d, 0, sizeof d);
        d.model = t->model;
        d.rank_weights = t->wptr;
        d.rank_grads = t->gptr;
        d.schedule = kind;
        d.p = p;
        d.v = v;
        d.m = c->m;
        d.stage.timeout_s = 120;
        d.stage.recompute = gpt_recompute_flags(c->recompute, t->model.n_layers, rflags);
        if (t->cpu) {
            if (pp_pipeline_create(&d, &t->pl, &err) != PP_OK) {
                fprintf(stderr, "pipeline: %s\n", err.msg);
                return 1;
            }
        } else {
            pp_cuda_desc cd;
            memset(&cd, 0, sizeof cd);
            cd.devices = t->dev;
            cd.timeline = 1;
            if (pp_cuda_pipeline_create(&d, &cd, &t->pl, &err) != PP_OK) {
                fprintf(stderr, "pipeline: %s\n", err.msg);
                return 1;
            }
        }
    }
    pp_schedule_stage_to_rank(pp_pipeline_schedule(t->pl), p * v - 1, &t->last_rank, &chunk);
    return 0;
}

/* Room in the tables for a batch of n_seqs documents; 0, or 1 out of memory. */
static int tables_room(trainer* t, int n_seqs) {
    if (n_seqs <= t->cap_seqs) return 0;
    t->cap_seqs = n_seqs;
    t->cap_rows = n_seqs * t->c.max_len;
    return tables_alloc(t, t->cap_rows);
}

/* Copies the packed batch in the host tables (T rows, n_seqs documents) to every device. */
static int upload_batch(trainer* t, int T, int n_seqs) {
    gpt_row_tables(t->h_cu, n_seqs, t->h_pos, t->h_sst, t->h_sen);
    for (int d = 0; d < t->n_dev; d++) {
        size_t b = sizeof(int32_t) * (size_t)T;
        set_device(t, d);
        if (gptc_copy(t->cpu, t->tok[d], t->h_tok, b) || gptc_copy(t->cpu, t->tgt[d], t->h_tgt, b) ||
            gptc_copy(t->cpu, t->pos[d], t->h_pos, b) || gptc_copy(t->cpu, t->sst[d], t->h_sst, b) ||
            gptc_copy(t->cpu, t->sen[d], t->h_sen, b))
            return 1;
        t->run.tab[d].pos = t->pos[d];
        t->run.tab[d].sstart = t->sst[d];
        t->run.tab[d].send = t->sen[d];
    }
    /* one batch for all ranks: the first stage's rank reads the tokens, the last's the targets,
       each on its own device */
    memset(&t->batch, 0, sizeof t->batch);
    t->batch.input.data = t->tok[t->dev[0]];
    t->batch.input.rows = T;
    t->batch.input.cols = 1;
    t->batch.input.dtype = PP_I32;
    t->batch.targets = t->tgt[t->dev[t->last_rank]];
    t->batch.target_row_bytes = sizeof(int32_t);
    t->batch.cu_seqlens = t->h_cu;
    t->batch.n_seqs = n_seqs;
    t->batch.split = PP_SPLIT_TOKENS;
    return 0;
}

/* Packs the step's documents and copies the per-row tables to every device. */
static int load_batch(trainer* t, const gpt_corpus* corp, uint64_t* rng, int* T_out) {
    if (tables_room(t, t->c.seqs)) return 1;
    *T_out = gpt_pack(corp, rng, t->c.seqs, t->h_tok, t->h_tgt, t->h_cu);
    return upload_batch(t, *T_out, t->c.seqs);
}

/* The step's loss from the last stage's micro-batch losses on its device: their mean. */
static int read_loss(trainer* t, float* loss) {
    float mbl[1024];
    double acc = 0;
    set_device(t, t->dev[t->last_rank]);
    if (gptc_copy(t->cpu, mbl, t->run.tab[t->dev[t->last_rank]].mb_loss, sizeof(float) * (size_t)t->c.m)) return 1;
    for (int i = 0; i < t->c.m; i++) acc += (double)(float)(1.0 / t->c.m) * (double)mbl[i];
    *loss = (float)acc;
    return 0;
}

/* Device 0's weights to the other devices' replicas. */
static int replicate(trainer* t) {
    if (!t->cpu && cudaStreamSynchronize(0) != cudaSuccess) return 1;
    for (int d = 1; d < t->n_dev; d++)
        if (cudaMemcpyPeer(t->wbuf[d], d, t->wbuf[0], 0, sizeof(float) * t->n_par) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess)
            return 1;
    return 0;
}

/* The zeroing and the batch upload ran on the legacy stream, which the stage streams
   (non-blocking) do not wait for: finish them before a step (between steps, not inside). */
static int settle(const trainer* t) {
    for (int d = 0; d < t->n_dev && !t->cpu; d++)
        if (cudaSetDevice(d) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 1;
    return 0;
}

static void step_failed(trainer* t) {
    fprintf(stderr, "%s\n", pp_pipeline_error(t->pl));
    for (int r = 0; r < t->p && !t->cpu; r++)
        if (pp_cuda_error(pp_cuda_pipeline_world(t->pl), r)[0])
            fprintf(stderr, "rank %d: %s\n", r, pp_cuda_error(pp_cuda_pipeline_world(t->pl), r));
}

/* --clip: the step's gradient (t->gsum on device 0, the tied wte's sum in the embedding's slot)
   clipped at the global norm c.clip over every layer's buffers (pp_pipeline_grad_clip, read
   through rank 0's device copy, which is device 0); *norm gets the norm before. */
static int clip_grads(trainer* t, double* norm) {
    static pp_grad_buf bufs[12 * GPTC_MAX_BLOCK + 5];
    pp_device_ops ops;
    pp_error err;
    int n;
    memset(&ops, 0, sizeof ops);
    if (!t->cpu) ops = pp_cuda_device_ops(pp_cuda_pipeline_world(t->pl), 0);
    n = gptc_grad_bufs(&t->run.cfg, t->gsum, NULL, -1, t->cpu ? NULL : &ops, bufs);
    if (settle(t) || pp_pipeline_grad_clip(t->pl, bufs, n, t->c.clip, norm, &err) != PP_OK) {
        fprintf(stderr, "--clip: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* One training step: pipeline, then the gradient sum in rank order, tied wte, clipping, AdamW at
   the step's rate (gpt_lr_at), replicas. *norm: the gradient norm before clipping (-1: no --clip). */
static int train_step(trainer* t, int step, float* loss, pp_cuda_step_info* info, gpt_traffic* tr, double* norm) {
    pp_step_stats ss;
    int cpu = t->cpu;
    const cfg* c = &t->c;
    const float lr = gpt_lr_at(c->lr, c->lr_min, c->warmup, c->steps, step);
    *norm = -1;
    for (int r = 0; r < t->p; r++) {
        set_device(t, t->dev[r]);
        if (gptc_zero(cpu, t->gbuf[r], sizeof(float) * t->n_grad)) return 1;
    }
    if (settle(t)) return 1;
    if (pp_pipeline_step(t->pl, &t->batch, &ss) != PP_OK) {
        step_failed(t);
        return 1;
    }
    gpt_traffic_add(tr, &ss);
    gpt_pipeline_peak(t->pl, t->p, &t->peak_stash);
    if (cpu) memset(info, 0, sizeof *info);
    else *info = *pp_cuda_pipeline_info(t->pl);
    /* gradient of the step: sum over ranks in rank order (others' slots are zero) */
    set_device(t, 0);
    if (gptc_zero(cpu, t->gsum, sizeof(float) * t->n_grad)) return 1;
    for (int r = 0; r < t->p; r++) {
        const float* src = t->gbuf[r];
        if (!cpu && t->dev[r] != 0) {
            if (cudaMemcpyPeer(t->gtmp, 0, t->gbuf[r], t->dev[r], sizeof(float) * t->n_grad) != cudaSuccess ||
                cudaDeviceSynchronize() != cudaSuccess)
                return 1;
            src = t->gtmp;
        }
        if (gptc_op<gptc_acc_op>(cpu, (cudaStream_t)0, (int)t->n_grad, t->gsum, src)) return 1;
    }
    /* tied: wte's gradient = embedding share + head share */
    if (gptc_op<gptc_acc_op>(cpu, (cudaStream_t)0, t->run.cfg.V * t->run.cfg.C, t->gsum, (const float*)(t->gsum + t->n_par))) return 1;
    set_device(t, 0);
    if (c->clip > 0 && clip_grads(t, norm)) return 1;
    set_device(t, 0);
    {
        float bc1 = 1.0f - powf(0.9f, (float)(step + 1)), bc2 = 1.0f - powf(0.999f, (float)(step + 1));
        if (gptc_op<gptc_adamw_op>(cpu, (cudaStream_t)0, (int)t->n_par, t->wbuf[0], (const float*)t->gsum, t->m1, t->m2,
                                   (const unsigned char*)t->decay, 1.0f - lr * c->wd, lr, bc1, bc2))
            return 1;
    }
    return replicate(t) || read_loss(t, loss);
}

/* --eval-every: the held-out batches (gpt_val_batches of the first --eval-seqs documents of held)
   through pp_pipeline_eval, forward only: no gradient is touched, so the training goes on bit
   for bit as without it. Prints "val loss" (gpt_loop_print_val): the batches' losses weighted by
   their tokens. */
static int evaluate(trainer* t, const gpt_corpus* held, int steps_done) {
    int n = t->c.eval_seqs < held->n_docs ? t->c.eval_seqs : held->n_docs, nb = gpt_val_batches(n, t->c.seqs);
    double s = 0, w = 0, t0 = now_s();
    if (n < t->c.m) {
        fprintf(stderr, "--eval-every: %d held-out documents, fewer than m = %d (--eval-seqs, or a longer text)\n", n, t->c.m);
        return 1;
    }
    for (int i = 0; i < nb; i++) {
        int a, k, T;
        float loss;
        gpt_val_range(n, nb, i, &a, &k);
        if (tables_room(t, k)) return 1;
        T = gpt_pack_docs(held, a, k, t->h_tok, t->h_tgt, t->h_cu);
        if (upload_batch(t, T, k) || settle(t)) return 1;
        if (pp_pipeline_eval(t->pl, &t->batch, NULL, NULL) != PP_OK) {
            step_failed(t);
            return 1;
        }
        if (read_loss(t, &loss)) return 1;
        s += (double)loss * T;
        w += T;
    }
    gpt_loop_print_val(w > 0 ? s / w : 0.0, steps_done, n, (long long)w, nb, now_s() - t0);
    return 0;
}

/* The text, less its held-out split (every GPT_HOLD_OUT-th document, set aside in held whether
   or not --eval-every reads it, as gpt_cpu does). */
static int load_corpus(const cfg* c, gpt_corpus* corp, gpt_corpus* held) {
    const char* bad = gptc_opts_corpus(c, corp);
    if (!bad && gpt_corpus_hold_out(corp, GPT_HOLD_OUT, held)) bad = "out of memory";
    if (bad) fprintf(stderr, "gpt_cuda: %s\n", bad);
    return bad != NULL;
}

/* --save, --resume: device 0's weights and moments (gptc_ckpt), every layer. */
static int save_ckpt(trainer* t, int steps_done, const char* path) {
    pp_ckpt_desc k = gptc_ckpt(&t->model, &t->w[0], t->moments, NULL, steps_done, &t->cpu);
    set_device(t, 0);
    return settle(t) || gpt_ckpt_save_path(&k, path);
}
static int resume_ckpt(trainer* t, const char* path, int* from) {
    pp_ckpt_desc k = gptc_ckpt(&t->model, &t->w[0], t->moments, NULL, 0, &t->cpu);
#ifdef PP_TEST_NO_CKPT_STATE /* negative control (build/cuda-trainer-controls): the weights alone, Adam's moments left at 0 */
    k.n_state = 0;
#endif
    set_device(t, 0);
    return gpt_ckpt_load_path(&k, path, from) || replicate(t);
}

/* Trains c->steps steps at (p, kind, v); fills out. verbose prints per step. */
static int train(const cfg* c, int p, pp_schedule_kind kind, int v, int n_dev, int verbose, run_out* out) {
    static trainer t;
    gpt_corpus corp, held;
    uint64_t rng = 777;
    double t_sum = 0, t_run = now_s();
    int64_t tokens = 0;
    int n_t = 0, rc = 0, from = 0;
    memset(out, 0, sizeof *out);
    if (load_corpus(c, &corp, &held)) return 1;
    if (trainer_init(&t, c, p, kind, v, n_dev) || (c->resume && resume_ckpt(&t, c->resume, &from))) {
        trainer_free(&t);
        gpt_corpus_free(&corp);
        gpt_corpus_free(&held);
        return 1;
    }
    if (verbose) {
        printf("gpt_cuda: %s p=%d v=%d m=%d on %d %s, %d blocks, C=%d, %zu parameters, %s activations\n",
               pp_schedule_name(kind), p, v, c->m, c->cpu ? 0 : n_dev, c->cpu ? "GPUs (--cpu: host)" : "GPU(s)", c->layers, c->dim,
               t.n_par, c->bf16 ? "bf16" : "f32");
        printf("text: %s, %d documents to train on, %d held out (every %dth)\n", corp.source, corp.n_docs, held.n_docs,
               GPT_HOLD_OUT);
        gpt_loop_print_optim("adam", c->lr, c->lr_min, c->warmup, c->steps, c->wd, c->clip);
        if (from) printf("resumed from %s at step %d\n", c->resume, from);
    }
    for (int s = 0; s < (c->stop ? c->stop : c->steps) && s < 1024; s++) {
        int T = 0;
        float loss = 0;
        double norm = -1;
        pp_cuda_step_info info;
        double t0;
        if (load_batch(&t, &corp, &rng, &T)) { /* before the resumed step too: the same batches follow */
            rc = 1;
            break;
        }
        if (s < from) continue;
        t0 = now_s();
        if (train_step(&t, s, &loss, &info, &out->traffic, &norm)) {
            rc = 1;
            break;
        }
        {
            double dt = now_s() - t0;
            out->loss[s] = loss;
            out->tok_s = T / dt;
            out->bubble = info.bubble;
            tokens += T;
            if (s >= 2) {
                t_sum += c->cpu ? dt : info.span;
                n_t++;
            }
            if (verbose) {
                gpt_loop_print_step(s, c->steps, loss, gpt_lr_at(c->lr, c->lr_min, c->warmup, c->steps, s), T, dt);
                printf("  bubble %5.1f%%  span %.2f ms", 100.0 * info.bubble, 1e3 * info.span);
                if (norm >= 0) printf("  grad norm %.4f", norm);
                printf("\n");
                fflush(stdout);
            }
        }
        if (verbose && gpt_eval_due_at(c->eval_every, s, c->steps - 1) && evaluate(&t, &held, s + 1)) {
            rc = 1;
            break;
        }
        for (int r = 0; r < p && !c->cpu; r++)
            pp_cuda_memory(pp_cuda_pipeline_world(t.pl), r, &out->pool_bytes[r],
                           s == 0 ? &out->pool_allocs_first[r] : &out->pool_allocs[r]);
    }
    out->step_time_mean = n_t ? t_sum / n_t : 0;
    if (rc == 0 && verbose) {
        double wall = now_s() - t_run;
        printf("%lld tokens in %.2f s: %.0f tokens/s\n", (long long)tokens, wall, wall > 0 ? (double)tokens / wall : 0.0);
    }
    if (rc == 0 && c->save) rc = save_ckpt(&t, c->stop ? c->stop : c->steps, c->save);
    if (rc == 0) {
        out->n_params = t.n_par;
        out->final_params = (float*)malloc(sizeof(float) * t.n_par);
        set_device(&t, 0);
        if (!out->final_params || gptc_copy(c->cpu, out->final_params, t.wbuf[0], sizeof(float) * t.n_par)) rc = 1;
    }
    if (rc == 0 && verbose) {
        gpt_traffic_print("", &out->traffic, c->bf16 ? PP_BF16 : PP_F32);
        gpt_loop_print_peak(t.peak_stash, c->recompute, t.model.n_layers);
    }
    if (rc == 0 && verbose && !c->cpu) {
        size_t pb = sizeof(float) * t.n_par;
        printf("memory per stage (GPU block pool: stashes, received activations, gradient workspaces):\n");
        for (int r = 0; r < p; r++) {
            int stg = pp_schedule_rank_to_stage(pp_pipeline_schedule(t.pl), r, 0);
            printf("  rank %d (GPU %d, first stage %d): pool %.2f MiB in %d cudaMalloc (%d after step 0), parameters %.2f MiB, gradients %.2f MiB\n",
                   r, t.dev[r], stg, out->pool_bytes[r] / 1048576.0, out->pool_allocs[r] ? out->pool_allocs[r] : out->pool_allocs_first[r],
                   (out->pool_allocs[r] ? out->pool_allocs[r] : out->pool_allocs_first[r]) - out->pool_allocs_first[r], pb / 1048576.0,
                   sizeof(float) * t.n_grad / 1048576.0);
        }
    }
    if (rc == 0 && c->trace && !c->cpu && verbose) {
        size_t n = pp_cuda_timeline(pp_cuda_pipeline_world(t.pl), NULL, 0);
        pp_event* ev = (pp_event*)malloc(sizeof(pp_event) * (n ? n : 1));
        FILE* f = fopen(c->trace, "w");
        if (ev && f) {
            pp_cuda_timeline(pp_cuda_pipeline_world(t.pl), ev, n);
            pp_timeline_chrome(f, ev, n, 1e6);
            printf("timeline of the last step: %s (%zu actions)\n", c->trace, n);
        }
        if (f) fclose(f);
        free(ev);
    }
    trainer_free(&t);
    gpt_corpus_free(&corp);
    gpt_corpus_free(&held);
    return rc;
}

/* --cpu --gradcheck: analytic gradients of one micro-batch against central differences. */
static int gradcheck(const cfg* c0) {
    cfg c = *c0;
    static trainer t;
    gpt_corpus corp, held;
    uint64_t rng = 5;
    int T, bad = 0, n_checked = 0;
    pp_error err;
    c.m = 1;
    c.seqs = 3;
    if (load_corpus(&c, &corp, &held) || trainer_init(&t, &c, 1, PP_SCHED_GPIPE, 1, 1) || load_batch(&t, &corp, &rng, &T)) {
        printf("gradcheck: setup failed\n");
        return 1;
    }
    /* analytic: one step's gradient, without the update */
    memset(t.gbuf[0], 0, sizeof(float) * t.n_grad);
    if (pp_pipeline_step(t.pl, &t.batch, NULL) != PP_OK) {
        printf("gradcheck: %s\n", pp_pipeline_error(t.pl));
        return 1;
    }
    {
        float* g = t.gbuf[0];
        float* w = t.wbuf[0];
        const float* wte_head = g + t.n_par; /* the head's share of the tied wte gradient */
        uint64_t pick = 99;
        for (size_t i = 0; i < (size_t)t.run.cfg.V * t.run.cfg.C; i++) g[i] += wte_head[i];
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
            pp_pipeline_step(t.pl, &t.batch, NULL);
            lp = t.run.tab[0].mb_loss[0];
            w[i] = keep - eps;
            pp_pipeline_step(t.pl, &t.batch, NULL);
            lm = t.run.tab[0].mb_loss[0];
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
    gpt_corpus_free(&held);
    return bad > 0 || n_checked < 50;
}

/* --check-resume: --steps / 2 steps at the configured schedule and p, saved (--save FILE, else a
   file in $TMPDIR); the rest resumed from it at p = 2 1F1B; against the whole run at p = 2 1F1B
   uninterrupted: the losses after the resume and the final weights must be bit-identical (the
   moments and the step, which places the run on the rate schedule, come from the file too). */
static int check_resume(const cfg* c0) {
    cfg a = *c0, b = *c0, u = *c0;
    run_out ra, rb, ru;
    char tmp[256];
    const char* dir = getenv("TMPDIR");
    int half = c0->steps / 2, same_loss = 1, same_w, rc;
    if (half < 1 || c0->steps > 1024) {
        fprintf(stderr, "--check-resume needs 2 .. 1024 --steps\n");
        return 2;
    }
    snprintf(tmp, sizeof tmp, "%s/gpt_cuda-resume.%ld", dir && *dir ? dir : "/tmp", (long)getpid());
    a.stop = half;
    a.save = c0->save ? c0->save : tmp;
    b.resume = a.save;
    b.save = u.save = NULL;
    if (train(&a, c0->p, c0->kind, c0->v, c0->gpus, 0, &ra)) return 1;
    rc = train(&b, 2, PP_SCHED_1F1B, 1, 1, 0, &rb) || train(&u, 2, PP_SCHED_1F1B, 1, 1, 0, &ru);
    if (!c0->save) remove(tmp);
    if (rc) return 1;
    for (int s = half; s < c0->steps; s++)
        if (memcmp(&rb.loss[s], &ru.loss[s], sizeof(float)) != 0) {
            if (same_loss) printf("check-resume: step %d loss %.9g resumed, %.9g uninterrupted\n", s, rb.loss[s], ru.loss[s]);
            same_loss = 0;
        }
    same_w = memcmp(rb.final_params, ru.final_params, sizeof(float) * ru.n_params) == 0;
    printf("check-resume: %d steps at %s p=%d, saved, resumed at 1f1b p=2 for %d more: losses %s, final weights %s "
           "against p=2 uninterrupted -> %s\n",
           half, pp_schedule_name(c0->kind), c0->p, c0->steps - half, same_loss ? "bit-identical" : "DIFFER",
           same_w ? "bit-identical" : "DIFFER", same_loss && same_w ? "OK" : "FAILED");
    free(ra.final_params);
    free(rb.final_params);
    free(ru.final_params);
    return !(same_loss && same_w);
}

static int usage(void) {
    fprintf(stderr, "usage: gpt_cuda [--schedule gpipe|1f1b|interleaved] [-p N] [-v N] [-m N] [--steps N] [--gpus N]\n"
                    "                [--text FILE | --generated] [--seqs-per-step N] [--max-len N] [--dim N] [--heads N]\n"
                    "                [--layers N] [--lr X] [--lr-min X] [--warmup N] [--wd X] [--clip X] [--eval-every N]\n"
                    "                [--eval-seqs N] [--save FILE] [--resume FILE] [--dtype f32|bf16] [--recompute K]\n"
                    "                [--trace FILE] [--check] [--check-resume] [--bench] [--cpu] [--gradcheck]\n"
                    "                [--gemm cublas|naive] [--vs-naive]\n");
    return 2;
}

int main(int argc, char** argv) {
    cfg c;
    int ndev = 0, rc = 0;
    memset(&c, 0, sizeof c); /* its own options */
    gptc_opts_default(&c);
    c.p = 4;
    c.gpus = 1;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* n = i + 1 < argc ? argv[i + 1] : NULL;
        int shared = gptc_opts_arg(&c, argc, argv, &i);
#define ARG(s) (!strcmp(a, s) && n && ++i)
        if (shared < 0) return usage();
        if (shared) continue;
        if (ARG("-p")) c.p = atoi(n);
        else if (ARG("--gpus")) c.gpus = atoi(n);
        else if (ARG("--trace")) c.trace = n;
        else if (ARG("--gemm")) {
            if (strcmp(n, "naive") && strcmp(n, "cublas")) return usage();
            c.naive = !strcmp(n, "naive");
        } else if (!strcmp(a, "--vs-naive")) c.vs_naive = 1;
        else if (!strcmp(a, "--check")) c.check = 1;
        else if (!strcmp(a, "--bench")) c.bench = 1;
        else if (!strcmp(a, "--cpu")) c.cpu = 1;
        else if (!strcmp(a, "--gradcheck")) c.gradcheck = 1;
        else if (!strcmp(a, "--check-resume")) c.check_resume = 1;
        else return usage();
#undef ARG
    }
    if (gptc_opts_check(&c) || c.p < 1 || c.p > 64 || c.gpus < 1 || c.gpus > GPTC_MAX_DEV) return usage();
    if (c.layers < c.p * c.v - 2) c.layers = c.p * c.v - 2;
    if (c.layers > GPTC_MAX_BLOCK) {
        fprintf(stderr, "gpt_cuda: p*v = %d stages need %d blocks, at most %d\n", c.p * c.v, c.layers, GPTC_MAX_BLOCK);
        return 2;
    }
    if (!c.cpu && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
        printf("gpt_cuda: no CUDA device; run with --cpu to execute the same layers on the host\n");
        return 0;
    }
    if (!c.cpu && c.gpus > ndev) c.gpus = ndev;
    if (c.cpu) c.gpus = 1;
    if (c.gradcheck) {
        if (!c.cpu) {
            fprintf(stderr, "--gradcheck needs --cpu (it reads losses on the host)\n");
            return 2;
        }
        if (c.bf16) { /* the rounding between layers is far coarser than its differences */
            fprintf(stderr, "--gradcheck runs in f32 (finite differences do not see through bf16 rounding)\n");
            return 2;
        }
        return gradcheck(&c);
    }
    if (c.bench) {
        run_out a, b;
        cfg cb = c;
        int rounds = c.steps < 8 ? 8 : c.steps;
        cb.steps = rounds;
        cb.save = NULL;
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
    if (c.check_resume) return check_resume(&c);
    if (c.vs_naive && !c.cpu) {
        run_out a, b;
        cfg cn = c;
        double worst = 0;
        cn.naive = 1;
        cn.save = NULL;
        c.naive = 0;
        if (train(&c, c.p, c.kind, c.v, c.gpus, 0, &a) || train(&cn, c.p, c.kind, c.v, c.gpus, 0, &b)) return 1;
        for (int s = 0; s < c.steps && s < 1024; s++) {
            double d = fabs((double)a.loss[s] - (double)b.loss[s]) / (fabs((double)b.loss[s]) + 1e-12);
            if (d > worst) worst = d;
        }
        printf("vs-naive: %d steps, cuBLAS %.3f ms/step, naive %.3f ms/step (%.2fx), final loss %.6f vs %.6f, largest relative "
               "loss difference %.2e -> %s\n",
               c.steps, 1e3 * a.step_time_mean, 1e3 * b.step_time_mean,
               a.step_time_mean > 0 ? b.step_time_mean / a.step_time_mean : 0.0, a.loss[c.steps - 1], b.loss[c.steps - 1], worst,
               worst <= 1e-4 ? "OK" : "FAILED");
        free(a.final_params);
        free(b.final_params);
        return worst <= 1e-4 ? 0 : 1;
    }
    {
        run_out a;
        if (train(&c, c.p, c.kind, c.v, c.gpus, 1, &a)) return 1;
        if (c.check) {
            run_out b;
            int same_loss = 1, same_w;
            cfg c1 = c;
            c1.save = NULL; /* the pipelined run's file */
            printf("check: the same %d steps unpipelined (p=1, one stream)...\n", c.steps);
            if (train(&c1, 1, PP_SCHED_GPIPE, 1, 1, 0, &b)) return 1;
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
