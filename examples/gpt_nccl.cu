/* examples/gpt_nccl.cu - the GPT of examples/gpt_cuda.cu with ONE PROCESS PER GPU over NCCL
   (pipeline_nccl.h): a pp x dp grid, any schedule, the tied embedding/head across the first
   and last pipeline ranks, the data-parallel gradient mean, AdamW, clipping, held-out evaluation
   and checkpoints.

   What to copy: the per-rank API over NCCL (pp_nccl_grid_create, pp_nccl_transport) with a
   one-rank pp_cuda for the device block pool, the tied and data-parallel gradient sums on the
   GPU. Start from mlp_cpu.c and gpt_cuda.cu (the same model in one process).

     mpirun -np 4 build/gpt_nccl -p 4                      (pp 4 x dp 1; NCCL id by MPI_Bcast)
     mpirun -np 8 build/gpt_nccl -p 4 --dp 2 --schedule interleaved -v 2 -m 8
     srun -n 8 --gpus-per-task 1 build/gpt_nccl -p 4 --dp 2 --id-file /shared/nccl.$SLURM_JOB_ID
                                                            (a build without MPI: id by file)

   Options as gpt_cuda: --schedule gpipe|1f1b|interleaved|zb-h1|zb-v, -p N (pipeline ranks,
   default world / dp), --dp N (default world / p), -v N, -m N, --steps N, --text FILE |
   --generated, --seqs-per-step N, --max-len N, --dim N, --heads N, --layers N, --lr X,
   --dtype f32|bf16 (bf16: the activations sent between stages and their gradients, half the
   bytes; f32 weights, gradients and Adam), the training options of gpt_cpu and gpt_cuda
   (examples/gpt_loop.h, docs/training.md section 10): --lr-min X, --warmup N, --wd X, --clip X
   (pp_stage_grad_clip over the pipeline, after the tied sum and the data-parallel mean),
   --eval-every N, --eval-seqs N (pp_stage_eval on every rank), --save FILE (replica 0's
   pipeline ranks write one file, each its own layers), --resume FILE (every process loads it
   all); and
   --tp N (tensor parallelism: the world is p x dp x tp, pp_nccl_grid_create_tp; each block's
   heads and MLP units split N ways as examples/gpt_cuda.h's TENSOR PARALLELISM says, the sums
   pp_nccl_tp_allreduce on the layer's stream, the boundaries split over the TP group, --clip's
   norm over pipeline and TP group, pp_stage_grad_clip_tp; --save writes the whole model, the
   tp = 1 layout, put together over the TP group, and --resume cuts this rank's share from it,
   so a file resumes at any tp; not yet run on a GPU: tests/test_gptc_tp.cu checks the split
   model, its norm and the shards put back on the host);
   --id-file PATH (the ncclUniqueId through a shared file; needed for world > 1 without MPI),
   --timeout S (every wait, default 120); --no-overlap (the data-parallel sum after the step, in
   one all-reduce), --bucket-kb N (most KiB one overlapped all-reduce carries, default 4096); --loss-log FILE (the printing rank writes every
   micro-batch's loss of every step there in hex: runs on other grids must match it bit for bit,
   tools/gpu_nccl.sh compares p = 2 and 4 with p = 1).

   Rank, world and local rank come from the launcher (pp_launch_from_env: mpirun, mpiexec,
   srun, torchrun); no launcher variables means one process (world 1). The GPU is the local
   rank modulo the GPUs visible (pp_nccl_comm_init). Each process keeps the whole parameter
   buffer (the same seed everywhere, so the replicas start identical) and updates it with
   AdamW; only the layers its stages own get gradients and are read (Adam leaves a
   zero-gradient parameter unchanged; --wd's decay shrinks the others' stale copies, which
   nothing reads, and a checkpoint takes each layer from its owner). One step:
     pp_stage_step                    (the pipeline transport, device blocks from a one-rank pp_cuda;
                                       with dp > 1 each stage's data-parallel sum starts from its
                                       gradients-final hook, pp_dp_overlap, during the cool-down)
     pp_dp_overlap_wait               (completes those sums; all but wte's)
     tied wte: pp_tied_sum_grads over the grid's tied pair (embedding share on the first stage's
               rank, head share on the last's; both end with the sum), or locally when one rank
               owns both (p = 1, ZB-V)
     pp_grad_allreduce of wte over the data-parallel group (of every gradient with --no-overlap),
               then x 1/dp
     --clip: pp_stage_grad_clip (the last stage's copy of the tied wte as a tied copy)
     AdamW over the parameters at the step's rate
   Printed by the last stage's rank of replica 0: the step, loss, rate, tokens/s (this replica),
   bubble (this rank's idle share of the step's span, CUDA events), the norm with --clip; at the
   end every rank prints its GPU memory (block pool, parameters, gradients).

   WHAT WAS RUN: on one H200 (2026-11-26, docs/gpu.md "Measured on a GPU"), -p 1 as a single
   process, directly and through --id-file, before the two-channel transport: it trained (3
   steps, 57 ms per step). Not yet run on real NCCL with several ranks: tools/gpu_nccl.sh (p = 1,
   2 and 4 on one GPU, NCCL >= 2.30, losses compared bit for bit) has not run on a GPU yet. Its
   transport runs every schedule with several ranks over the NCCL imitation in make test
   (tests/test_nccl_pipeline.c). Without a CUDA device it stops with a message (exit 1);
   gpt_cuda --cpu runs the same layers on the host. */
#define PIPELINE_IMPLEMENTATION
#ifdef PP_GPT_NCCL_MPI
#include <mpi.h>
#endif
#include "../pipeline_nccl.h"

#include "gpt_cuda.h" /* the model of gpt_cuda.cu */

typedef struct opts : gptc_opts { /* the options gpt_cuda shares, and gpt_nccl's own */
    int p, dp;
    int tp;                     /* --tp N: each block's heads and MLP units split N ways (gptc_config.tp) */
    int no_overlap;             /* --no-overlap: the data-parallel sum after the step, not from its hooks */
    int bucket_kb;              /* --bucket-kb N: most KiB one overlapped all-reduce carries (0: 4 MiB) */
    double timeout;
    const char *id_file, *loss_log;
} opts;

static int usage(void) {
    fprintf(stderr, "usage: gpt_nccl [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p N] [--dp N] [-v N] [-m N]\n"
                    "                [--steps N] [--text FILE | --generated] [--seqs-per-step N] [--max-len N]\n"
                    "                [--dim N] [--heads N] [--layers N] [--lr X] [--lr-min X] [--warmup N] [--wd X]\n"
                    "                [--clip X] [--eval-every N] [--eval-seqs N] [--save FILE] [--resume FILE]\n"
                    "                [--dtype f32|bf16] [--id-file PATH] [--timeout S] [--loss-log FILE]\n"
                    "                [--no-overlap] [--bucket-kb N] [--recompute K] [--tp N]\n");
    return 2;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Everything one process holds. */
typedef struct proc {
    pp_launch L;
    int dev, pp_rank, dp_rank, dp, p, v, cap;
    int tp, tp_rank;            /* --tp: the TP group's size and this process's place in it */
    pp_transport tpt;           /* the grid's g.tp transport (tp > 1) */
    pp_group tpg;               /* its group: pp_stage_desc.tp, the layers' io->tp */
    gptc_run run;               /* the model's context: sizes, this GPU's tables (tab[dev]) */
    gptc_model w, g;
    pp_cuda_layer_ctx lc;       /* the layers' io->ctx: the compute stream and the GPU */
    float *wbuf, *gbuf, *m1, *m2;
    float* flag;                /* (1) device: the all-reduce that agrees on an outcome (world_failures) */
    unsigned char* decay;       /* (n_par) device: 1 where --wd decays (gptc_decay_mask) */
    gptc_model mw1, mw2;        /* Adam's moments bound like the weights (checkpoints) */
    const void* moments[2];     /* &mw1, &mw2 */
    unsigned char own[GPTC_MAX_BLOCK + 2]; /* the layers this rank's stages own */
    int cap_seqs;               /* documents the batch tables hold */
    int cpu_flag;               /* 0: the buffers are GPU memory (gptc_ckpt's copies) */
    size_t n_par, n_grad;
    int32_t *tok, *tgt, *pos, *sst, *sen;       /* device */
    int32_t *h_tok, *h_tgt, *h_cu, *h_pos, *h_sst, *h_sen;
    pp_cuda* cuda;
    pp_nccl_grid grid;
    int have_grid;
    pp_dp_overlap* ov;          /* dp > 1 without --no-overlap: each stage's sum from its hook */
    pp_stage* st;
    pp_action* acts;
    pp_schedule sched;
    int first[PP_MAX_RANKS * 4 + 1];
    pp_batch batch;
} proc;

static void proc_free(proc* P) {
    if (P->run.blas) cudaDeviceSynchronize();
    gptc_blas_destroy(P->run.blas); /* before pp_cuda_destroy ends the stream its handle uses */
    P->run.blas = NULL;
    pp_stage_destroy(P->st);
    pp_dp_overlap_destroy(P->ov); /* before the grid: it withdraws what it started on dp */
    if (P->have_grid) pp_nccl_grid_destroy(&P->grid);
    if (P->cuda) pp_cuda_destroy(P->cuda);
    gptc_free(0, P->wbuf);
    gptc_free(0, P->gbuf);
    gptc_free(0, P->m1);
    gptc_free(0, P->m2);
    gptc_free(0, P->flag);
    gptc_free(0, P->decay);
    gptc_free(0, P->dev < GPTC_MAX_DEV ? P->run.tab[P->dev].mb_loss : NULL);
    gptc_free(0, P->tok);
    gptc_free(0, P->tgt);
    gptc_free(0, P->pos);
    gptc_free(0, P->sst);
    gptc_free(0, P->sen);
    free(P->h_tok);
    free(P->h_tgt);
    free(P->h_cu);
    free(P->h_pos);
    free(P->h_sst);
    free(P->h_sen);
    free(P->acts);
}

/* Uploads the per-row tables of the packed batch in the host tables (T rows, n_seqs documents). */
static int upload_batch(proc* P, const opts* o, int T, int n_seqs) {
    size_t b;
    gpt_row_tables(P->h_cu, n_seqs, P->h_pos, P->h_sst, P->h_sen);
    b = sizeof(int32_t) * (size_t)T;
    if (gptc_copy(0, P->tok, P->h_tok, b) || gptc_copy(0, P->tgt, P->h_tgt, b) || gptc_copy(0, P->pos, P->h_pos, b) || gptc_copy(0, P->sst, P->h_sst, b) ||
        gptc_copy(0, P->sen, P->h_sen, b))
        return 1;
    memset(&P->batch, 0, sizeof P->batch);
    P->batch.m = o->m;
    P->batch.input.data = P->tok;
    P->batch.input.rows = T;
    P->batch.input.cols = 1;
    P->batch.input.dtype = PP_I32;
    P->batch.targets = P->tgt;
    P->batch.target_row_bytes = sizeof(int32_t);
    P->batch.cu_seqlens = P->h_cu;
    P->batch.n_seqs = n_seqs;
    P->batch.split = PP_SPLIT_TOKENS;
    return 0;
}

/* Packs this replica's documents for the step and uploads the per-row tables. */
static int load_batch(proc* P, const opts* o, const gpt_corpus* corp, uint64_t* rng, int* T_out) {
    *T_out = gpt_pack(corp, rng, o->seqs, P->h_tok, P->h_tgt, P->h_cu);
    return upload_batch(P, o, *T_out, o->seqs);
}

/* How many processes of the world report a failure (ok 0): an all-reduce over this pipeline, then
   over the data-parallel group and the TP group, so every process gets the same count and none goes on into a step
   its peers left; -1 when the all-reduce itself fails. Also a barrier. */
static int world_failures(proc* P, const opts* o, int ok) {
    pp_error err;
    float f = ok ? 0.0f : 1.0f;
    pp_transport pt = pp_nccl_transport(P->grid.pipe), dt = pp_nccl_transport(P->grid.dp);
    if (gptc_copy(0, P->flag, &f, sizeof f) || cudaDeviceSynchronize() != cudaSuccess ||
        pp_grad_allreduce(&pt, NULL, 0, P->flag, 1, PP_F32, 1.0, o->timeout, &err) != PP_OK ||
        (P->dp > 1 && pp_grad_allreduce(&dt, NULL, 0, P->flag, 1, PP_F32, 1.0, o->timeout, &err) != PP_OK) ||
        (P->tp > 1 && pp_grad_allreduce(&P->tpt, NULL, 0, P->flag, 1, PP_F32, 1.0, o->timeout, &err) != PP_OK) ||
        cudaStreamSynchronize(pp_cuda_stream(P->cuda, 0)) != cudaSuccess || gptc_copy(0, &f, P->flag, sizeof f))
        return -1;
    return (int)f;
}

/* --tp's checkpoints hold the whole model (the tp = 1 layout: the file a tp = 1 run writes for
   the same weights), so they resume at any tp: the weights and Adam's moments put together on
   the host from the TP group's shards (gptc_tp_unshard), or cut from a loaded file. */
typedef struct whole_model {
    gptc_run run;               /* P->run at tp 1 (its cfg is what the checkpoint's params read) */
    float* buf[3];              /* host: weights, Adam's m and v, gptc_numel floats each */
    gptc_model m[3];
    const void* moments[2];
    int cpu;                    /* 1: host memory (gptc_ckpt's copies) */
} whole_model;
static void whole_free(whole_model* W) {
    for (int k = 0; k < 3; k++) free(W->buf[k]);
}
static int whole_make(const proc* P, whole_model* W) {
    memset(W, 0, sizeof *W);
    W->run = P->run;
    W->run.cfg.tp = 0;
    W->cpu = 1;
    for (int k = 0; k < 3; k++) {
        if (!(W->buf[k] = (float*)calloc(gptc_numel(&W->run.cfg), sizeof(float)))) return 1;
        gptc_bind(&W->m[k], &W->run.cfg, W->buf[k], 0);
    }
    W->moments[0] = &W->m[1];
    W->moments[1] = &W->m[2];
    return 0;
}
/* this process's weights and moments (device) into W, gathered over the TP group (TP rank 0's W
   then holds the whole model; the others' W is not read); 0 or 1 */
static int whole_gather(proc* P, whole_model* W) {
    const float* dev[3] = {P->wbuf, P->m1, P->m2};
    float *part = (float*)malloc(sizeof(float) * P->n_par), *all = (float*)malloc(sizeof(float) * P->n_par * (size_t)P->tp);
    pp_error err;
    int bad = !part || !all;
    for (int k = 0; k < 3 && !bad; k++) {
        bad = gptc_copy(0, part, dev[k], sizeof(float) * P->n_par) ||
              pp_tp_allgather(&P->tpg, part, all, P->n_par * (size_t)P->tp, PP_F32, &err) != PP_OK;
        for (int t = 0; t < P->tp && !bad; t++) gptc_tp_unshard(&P->run.cfg, t, all + (size_t)t * P->n_par, W->buf[k], 0);
    }
    free(part);
    free(all);
    return bad;
}
/* W (a loaded whole model) cut into this process's weights and moments (device); 0 or 1 */
static int whole_scatter(proc* P, const whole_model* W) {
    float* dev[3] = {P->wbuf, P->m1, P->m2};
    float* part = (float*)malloc(sizeof(float) * P->n_par);
    int bad = !part;
    for (int k = 0; k < 3 && !bad; k++) {
        gptc_tp_shard(&P->run.cfg, P->tp_rank, W->buf[k], part, 0);
        bad = gptc_copy(0, dev[k], part, sizeof(float) * P->n_par);
    }
    free(part);
    return bad;
}

/* --resume: every process loads every layer (each holds the whole parameter buffer), weights and
   Adam's moments, and the step; all agree that it went well. With --tp: the whole model on the
   host, then this TP rank's share of it. */
static int resume_ckpt(proc* P, const opts* o, int* from) {
    whole_model W;
    int ok;
    if (P->tp > 1) {
        ok = whole_make(P, &W) == 0;
        if (ok) {
            pp_model m = gptc_model_desc_depth(&W.run);
            pp_ckpt_desc k = gptc_ckpt(&m, &W.m[0], W.moments, NULL, 0, &W.cpu);
            ok = gpt_ckpt_load_path(&k, o->resume, from) == 0 && whole_scatter(P, &W) == 0;
        }
        whole_free(&W);
        return world_failures(P, o, ok) != 0;
    }
    pp_model m = gptc_model_desc_depth(&P->run);
    pp_ckpt_desc k = gptc_ckpt(&m, &P->w, P->moments, NULL, 0, &P->cpu_flag);
    ok = gpt_ckpt_load_path(&k, o->resume, from) == 0;
    return world_failures(P, o, ok) != 0;
}

/* --save: replica 0's pipeline ranks write one file together, each its own layers' records
   (pipeline rank 0 first, with the header), into FILE.tmp, renamed to FILE once all are in. */
static int save_ckpt(proc* P, const opts* o, int steps_done) {
    whole_model W;
    int gathered = P->tp > 1 && whole_make(P, &W) == 0 && whole_gather(P, &W) == 0;
    pp_model m = gptc_model_desc_depth(P->tp > 1 ? &W.run : &P->run);
    pp_ckpt_desc k = P->tp > 1 ? gptc_ckpt(&m, &W.m[0], W.moments, P->own, steps_done, &W.cpu) /* --tp: the whole model */
                               : gptc_ckpt(&m, &P->w, P->moments, P->own, steps_done, &P->cpu_flag);
    pp_error err;
    size_t n = strlen(o->save) + 5;
    char* tmp = (char*)malloc(n);
    /* mine: this rank's part went well; the writers: replica 0's pipeline ranks (TP rank 0's) */
    int ok = tmp != NULL && (P->tp == 1 || gathered), mine = ok, writer = P->dp_rank == 0 && P->tp_rank == 0;
    snprintf(err.msg, sizeof err.msg, "%s", ok ? "" : "out of memory, or the TP group's gather failed");
    if (ok) snprintf(tmp, n, "%s.tmp", o->save);
    if (ok && writer && P->pp_rank == 0) ok = mine = pp_ckpt_save_file(&k, tmp, &err) == PP_OK;
    if (world_failures(P, o, ok) != 0) ok = 0; /* the header is in the file before the others write */
    k.records_only = 1;
    if (ok && writer && P->pp_rank != 0) ok = mine = pp_ckpt_save_file(&k, tmp, &err) == PP_OK;
    if (!mine) fprintf(stderr, "gpt_nccl rank %d: --save %s: %s\n", P->L.rank, o->save, err.msg);
    if (world_failures(P, o, ok) != 0) ok = 0;
    if (ok && writer && P->pp_rank == 0) {
        if (rename(tmp, o->save) != 0) {
            fprintf(stderr, "gpt_nccl: --save: renaming %s to %s: %s\n", tmp, o->save, strerror(errno));
            ok = 0;
        } else
            printf("saved %s after %d steps, every pipeline rank its own layers%s\n", o->save, steps_done,
                   P->tp > 1 ? " (the whole model: the tp = 1 layout)" : "");
    }
    free(tmp);
    if (P->tp > 1) whole_free(&W);
    return !ok;
}

#define FAIL(...)                                                              \
    do {                                                                       \
        fprintf(stderr, "gpt_nccl rank %d: ", P->L.rank);                      \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        return 1;                                                              \
    } while (0)

/* The data-parallel sum during the cool-down (pp_dp_overlap, the default with dp > 1): the
   gradients of the layers this rank owns, but the tied wte, listed per layer; each stage's are
   summed over the replicas from its gradients-final hook, ncclAllReduce on the dp transport's
   own stream while the pipeline drains, and pp_dp_overlap_wait in update() completes them. The
   wte's sum waits for the tied sum and the fold of the head's share (update()); the mean's 1/dp
   is a kernel after the wait (the library scales on the host: scale 1). Each element is a sum of
   dp terms either way, so the gradients are those of one all-reduce after the step (dp = 2:
   bit for bit; NCCL's own order for more replicas). Called before pp_stage_create. */
static int overlap_create(proc* P, const opts* o, pp_stage_desc* d) {
    static pp_grad_buf bufs[12 * GPTC_MAX_BLOCK + 5];
    pp_transport dt = pp_nccl_transport(P->grid.dp); /* copied by the overlap */
    pp_dp_overlap_desc od;
    pp_error err;
    int n = gptc_grad_bufs(&P->run.cfg, P->gbuf, P->own, -1, NULL, bufs), k = 0;
    for (int i = 0; i < n; i++)
        if (bufs[i].data != (void*)P->g.embed[0].wte) bufs[k++] = bufs[i];
    memset(&od, 0, sizeof od);
    od.dp.t = &dt;
    od.dp.timeout_s = o->timeout;
    od.scale = 1.0;
    od.bucket_bytes = (size_t)o->bucket_kb << 10;
    od.bufs = bufs;
    od.n_bufs = k;
    od.partition = P->first;
    od.n_stages = P->sched.n_stages;
    od.coalesce = 1; /* one gradient arena, laid out alike on every replica (gptc_bind) */
    if (pp_dp_overlap_create(&od, &P->ov, &err) != PP_OK) FAIL("data-parallel overlap: %s", err.msg);
    d->grads_final = pp_dp_overlap_hook;
    d->grads_final_user = P->ov;
    return 0;
}

/* --tp: the blocks' sums over the TP group, NCCL's own on the layer's stream (gptc_run.tp_sum) */
static int tp_sum(const pp_layer_io* io, float* buf, size_t n, cudaStream_t st) {
    pp_error err;
    return pp_nccl_tp_allreduce(io->tp, buf, n, PP_F32, st, &err) == PP_OK ? 0 : 10;
}

/* Bootstrap, grid, model, stage: everything before the first step. */
static int setup(proc* P, const opts* o, int have_launch) {
    pp_error err;
    unsigned char rflags[GPTC_MAX_BLOCK + 2]; /* --recompute */
    int ndev = 0, S;
    size_t n;
    cudaError_t ce;
    ncclUniqueId id;
    ncclComm_t world = NULL;
    pp_cuda_desc cd;
    pp_stage_desc d;
    (void)have_launch;
#ifndef PP_GPT_NCCL_MPI
    if (P->L.world > 1 && !o->id_file)
        FAIL("world %d: this build has no MPI; pass --id-file PATH on a filesystem every rank sees", P->L.world);
#endif
    if ((ce = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev < 1)
        FAIL("no CUDA device (%s): gpt_nccl runs one process per GPU; examples/gpt_cuda --cpu runs the same layers on the host",
             ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    /* the NCCL id: MPI_Bcast, a shared file, or made here for a single process */
#ifdef PP_GPT_NCCL_MPI
    if (!o->id_file) {
        if (pp_nccl_unique_id_mpi(MPI_COMM_WORLD, &id, &err) != PP_OK) FAIL("NCCL id by MPI_Bcast: %s", err.msg);
    } else
#endif
        if (o->id_file) {
        if (pp_nccl_unique_id_file(o->id_file, P->L.rank, o->timeout, &id, &err) != PP_OK) FAIL("NCCL id file: %s", err.msg);
    } else if (P->L.world == 1) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) FAIL("ncclGetUniqueId: %s", ncclGetErrorString(r));
    } else
        FAIL("world %d: this build has no MPI; pass --id-file PATH on a filesystem every rank sees", P->L.world);
    if (pp_nccl_comm_init(&P->L, &id, o->timeout, &world, &err) != PP_OK) FAIL("NCCL communicator: %s", err.msg);
    if (cudaGetDevice(&P->dev) != cudaSuccess) FAIL("cudaGetDevice failed");
    /* the device block pool and compute stream: a one-rank pp_cuda on this process's GPU */
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.devices = &P->dev;
    cd.timeline = 1;
    if (pp_cuda_create(&cd, &P->cuda, &err) != PP_OK || pp_cuda_bind(P->cuda, 0, &err) != PP_OK) {
        ncclCommDestroy(world);
        FAIL("pp_cuda: %s", err.msg);
    }
    if (pp_nccl_grid_create_tp(world, o->p, o->tp, PP_GRID_DP_INNER, pp_cuda_stream(P->cuda, 0), o->timeout, &P->grid, &err) != PP_OK) {
        ncclCommDestroy(world);
        FAIL("grid p=%d tp=%d over world %d: %s", o->p, o->tp, P->L.world, err.msg);
    }
    ncclCommDestroy(world); /* the grid's split communicators live on */
    P->have_grid = 1;
    P->p = P->grid.grid.pp;
    P->dp = P->grid.grid.dp;
    P->pp_rank = P->grid.grid.pp_rank;
    P->dp_rank = P->grid.grid.dp_rank;
    P->tp = P->grid.grid.tp > 1 ? P->grid.grid.tp : 1;
    P->tp_rank = P->grid.grid.tp_rank;
    if (P->tp > 1) {
        P->tpt = pp_nccl_transport(P->grid.tp);
        memset(&P->tpg, 0, sizeof P->tpg);
        P->tpg.t = &P->tpt;
        P->tpg.timeout_s = o->timeout;
        P->run.tp_sum = tp_sum;
    }
    P->v = o->v;
    S = P->p * P->v;
    /* schedule, NCCL's message order, partition */
    n = pp_schedule_size(o->kind, P->p, P->v, o->m);
    P->acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
    if (!P->acts || pp_schedule_make(o->kind, P->p, P->v, o->m, P->acts, n, &P->sched, &err) != PP_OK) FAIL("schedule: %s", err.msg);
    if (pp_nccl_check_order(&P->sched, &err) != PP_OK) FAIL("schedule over NCCL: %s", err.msg);
    if (P->dev >= GPTC_MAX_DEV) FAIL("GPU %d: the model keeps tables for GPUs 0 .. %d", P->dev, GPTC_MAX_DEV - 1);
    if (!(P->run.blas = gptc_blas_create())) FAIL("out of memory");  /* matrix products through cuBLAS */
    P->run.cfg = gptc_opts_config(o);
    P->run.cfg.tp = P->tp;
    if (pp_partition_uniform(o->layers + 2, S, P->first, &err) != PP_OK) FAIL("partition: %s", err.msg);
    /* weights: gpt_cuda's initialisation (same seed on every process) */
    P->n_par = gptc_numel(&P->run.cfg);
    P->n_grad = P->n_par + (size_t)P->run.cfg.V * P->run.cfg.C;
    {
        gptc_config whole = P->run.cfg; /* --tp: this TP rank's share of the whole model's weights */
        whole.tp = 0;
        float* h = (float*)malloc(sizeof(float) * gptc_numel(&whole));
        float* part = P->tp > 1 ? (float*)malloc(sizeof(float) * P->n_par) : NULL;
        if (!h || (P->tp > 1 && !part)) {
            free(h);
            FAIL("out of host memory");
        }
        gptc_init_weights(&whole, h);
        if (part) {
            gptc_tp_shard(&P->run.cfg, P->tp_rank, h, part, 0);
            free(h);
            h = part;
        }
        P->wbuf = (float*)gptc_alloc(0, sizeof(float) * P->n_par);
        if (!P->wbuf || gptc_copy(0, P->wbuf, h, sizeof(float) * P->n_par)) {
            free(h);
            FAIL("weights: cudaMalloc/cudaMemcpy failed");
        }
        free(h);
    }
    P->cap_seqs = o->eval_every > 0 && o->eval_seqs > o->seqs ? o->eval_seqs : o->seqs; /* a held-out batch may hold more */
    P->cap = P->cap_seqs * o->max_len;
    P->gbuf = (float*)gptc_alloc(0, sizeof(float) * P->n_grad);
    P->m1 = (float*)gptc_alloc(0, sizeof(float) * P->n_par);
    P->m2 = (float*)gptc_alloc(0, sizeof(float) * P->n_par);
    P->run.tab[P->dev].mb_loss = (float*)gptc_alloc(0, sizeof(float) * 1024);
    P->tok = (int32_t*)gptc_alloc(0, sizeof(int32_t) * (size_t)P->cap);
    P->tgt = (int32_t*)gptc_alloc(0, sizeof(int32_t) * (size_t)P->cap);
    P->pos = (int32_t*)gptc_alloc(0, sizeof(int32_t) * (size_t)P->cap);
    P->sst = (int32_t*)gptc_alloc(0, sizeof(int32_t) * (size_t)P->cap);
    P->sen = (int32_t*)gptc_alloc(0, sizeof(int32_t) * (size_t)P->cap);
    P->h_tok = (int32_t*)malloc(sizeof(int32_t) * (size_t)P->cap);
    P->h_tgt = (int32_t*)malloc(sizeof(int32_t) * (size_t)P->cap);
    P->h_pos = (int32_t*)malloc(sizeof(int32_t) * (size_t)P->cap);
    P->h_sst = (int32_t*)malloc(sizeof(int32_t) * (size_t)P->cap);
    P->h_sen = (int32_t*)malloc(sizeof(int32_t) * (size_t)P->cap);
    P->h_cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(P->cap_seqs + 1));
    P->flag = (float*)gptc_alloc(0, sizeof(float));
    P->decay = (unsigned char*)gptc_alloc(0, P->n_par);
    if (!P->flag || !P->decay) FAIL("out of memory");
    {
        unsigned char* h = (unsigned char*)malloc(P->n_par);
        int bad = !h || gptc_decay_mask(&P->run.cfg, h) || gptc_copy(0, P->decay, h, P->n_par);
        free(h);
        if (bad) FAIL("out of memory for the weight decay's mask");
    }
    if (!P->gbuf || !P->m1 || !P->m2 || !P->run.tab[P->dev].mb_loss || !P->tok || !P->tgt || !P->pos || !P->sst || !P->sen || !P->h_tok ||
        !P->h_tgt || !P->h_pos || !P->h_sst || !P->h_sen || !P->h_cu)
        FAIL("out of memory for the model (%zu parameters)", P->n_par);
    gptc_bind(&P->w, &P->run.cfg, P->wbuf, 0);
    gptc_bind(&P->g, &P->run.cfg, P->gbuf, 1);
    gptc_bind(&P->mw1, &P->run.cfg, P->m1, 0);
    gptc_bind(&P->mw2, &P->run.cfg, P->m2, 0);
    P->moments[0] = &P->mw1;
    P->moments[1] = &P->mw2;
    for (int l = 0; l < o->layers + 2; l++) P->own[l] = pp_schedule_layer_rank(&P->sched, P->first, l) == P->pp_rank;
    P->run.tab[P->dev].pos = P->pos;
    P->run.tab[P->dev].sstart = P->sst;
    P->run.tab[P->dev].send = P->sen;
    P->lc.stream = pp_cuda_stream(P->cuda, 0);
    P->lc.device = P->dev;
    memset(&d, 0, sizeof d);
    d.model = gptc_model_desc_depth(&P->run);
    d.weights = &P->w;
    d.grads = &P->g;
    d.schedule = &P->sched;
    d.partition = P->first;
    d.rank = P->pp_rank;
    d.layer_ctx = &P->lc;
    d.timeout_s = o->timeout;
    d.transport = pp_nccl_transport(P->grid.pipe);
    d.device = pp_cuda_device_ops(P->cuda, 0);
    d.recompute = gpt_recompute_flags(o->recompute, d.model.n_layers, rflags); /* copied at create */
    if (P->tp > 1) d.tp = &P->tpg; /* boundaries split over TP, gathered over g.tp; the TP outcome agreed */
    if (P->dp > 1 && !o->no_overlap && overlap_create(P, o, &d)) return 1;
    if (pp_stage_create(&d, &P->st, &err) != PP_OK) FAIL("stage: %s", err.msg);
    return 0;
}

/* --clip: the gradients of the layers this rank owns, clipped at the global norm over the pipeline
   (pp_stage_grad_clip: every replica holds the same gradients after the data-parallel mean, and
   computes the same norm over its own pipeline), read through the device copy. The last stage's
   rank lists its copy of the tied wte's gradient (the one its AdamW reads) as a tied copy: scaled,
   not counted. *norm: the norm before. */
static int clip_grads(proc* P, const opts* o, int e_rank, int h_rank, double* norm) {
    static pp_grad_buf bufs[12 * GPTC_MAX_BLOCK + 5];
    pp_device_ops ops = pp_cuda_device_ops(P->cuda, 0);
    pp_error err;
    /* the slots AdamW reads (wte: the embedding's slot, which holds the tied sum) */
    int n = gptc_grad_bufs(&P->run.cfg, P->gbuf, P->own, e_rank != h_rank && P->pp_rank == h_rank ? o->layers + 1 : -1,
                           &ops, bufs);
    pp_result rc = P->tp > 1 ? pp_stage_grad_clip_tp(P->st, &P->tpg, bufs, n, o->clip, norm, &err) /* shards once each */
                             : pp_stage_grad_clip(P->st, bufs, n, o->clip, norm, &err);
    if (rc != PP_OK) FAIL("--clip: %s", err.msg);
    return 0;
}

/* One step after the pipeline: tied wte, data-parallel mean, clipping, AdamW at the step's rate
   (gpt_lr_at); on the compute stream. *norm: the gradient norm before clipping (-1: no --clip). */
static int update(proc* P, const opts* o, int step, int e_rank, int h_rank, double* norm) {
    pp_error err;
    const float lr = gpt_lr_at(o->lr, o->lr_min, o->warmup, o->steps, step);
    cudaStream_t cs = pp_cuda_stream(P->cuda, 0);
    int VC = P->run.cfg.V * P->run.cfg.C;
    if (P->ov && pp_dp_overlap_wait(P->ov, NULL, &err) != PP_OK) FAIL("data-parallel all-reduce (overlapped): %s", err.msg);
    if (e_rank != h_rank) {
        /* the grid's tied pair: {first stage's rank, last stage's rank} = tied ranks {0, 1} */
        pp_transport tt = pp_nccl_transport(P->grid.tied);
        int pair[2] = {0, 1};
        if (P->grid.tied &&
            pp_tied_sum_grads(&tt, pair, P->pp_rank == e_rank ? (void*)P->g.embed[0].wte : NULL,
                              P->pp_rank == h_rank ? (void*)P->g.head[0].wte : NULL,
                              (size_t)VC, PP_F32, o->timeout, &err) != PP_OK)
            FAIL("tied gradients: %s", err.msg);
    }
    /* wte's gradient = embedding share + head share (on the first rank the head share is 0,
       on the last the embedding share is; after the tied sum either holds the whole) */
    if (gptc_op<gptc_acc_op>(0, cs, VC, P->g.embed[0].wte, (const float*)P->g.head[0].wte)) FAIL("kernel launch failed");
    if (P->dp > 1) {
        pp_transport dt = pp_nccl_transport(P->grid.dp);
        /* scale 1: the library scales on the host; the buffer is on the GPU. With the overlap
           only wte is left (the rest was summed from the hooks) */
        float* buf = P->ov ? P->g.embed[0].wte : P->gbuf;
        size_t count = P->ov ? (size_t)VC : P->n_par;
        if (pp_grad_allreduce(&dt, NULL, 0, buf, count, PP_F32, 1.0, o->timeout, &err) != PP_OK)
            FAIL("data-parallel all-reduce: %s", err.msg);
        if (gptc_op<gptc_scale_op>(0, cs, (int)P->n_par, P->gbuf, 1.0f / (float)P->dp)) FAIL("kernel launch failed");
    }
    *norm = -1;
    if (o->clip > 0 && clip_grads(P, o, e_rank, h_rank, norm)) return 1;
    {
        float bc1 = 1.0f - powf(0.9f, (float)(step + 1)), bc2 = 1.0f - powf(0.999f, (float)(step + 1));
        if (gptc_op<gptc_adamw_op>(0, cs, (int)P->n_par, P->wbuf, (const float*)P->gbuf, P->m1, P->m2,
                                   (const unsigned char*)P->decay, 1.0f - lr * o->wd, lr, bc1, bc2))
            FAIL("kernel launch failed");
    }
    if (cudaStreamSynchronize(cs) != cudaSuccess) FAIL("optimizer step failed: %s", cudaGetErrorString(cudaGetLastError()));
    return 0;
}

/* The last stage's micro-batch losses of the step (on this rank's GPU) and their mean. */
static int read_losses(proc* P, const opts* o, float* mbl, float* loss) {
    double acc = 0;
    if (cudaStreamSynchronize(pp_cuda_stream(P->cuda, 0)) != cudaSuccess ||
        gptc_copy(0, mbl, P->run.tab[P->dev].mb_loss, sizeof(float) * (size_t)o->m))
        return 1;
    for (int i = 0; i < o->m; i++) acc += (double)(float)(1.0 / o->m) * (double)mbl[i];
    *loss = (float)acc;
    return 0;
}

/* --eval-every: the held-out batches (gpt_val_batches of held's first --eval-seqs documents),
   forward only through pp_stage_eval on every rank of every replica; no gradient is touched.
   The printing rank prints "val loss" (gpt_loop_print_val). */
static int evaluate(proc* P, const opts* o, const gpt_corpus* held, int steps_done, int is_printer) {
    pp_error err;
    int n = o->eval_seqs < held->n_docs ? o->eval_seqs : held->n_docs, nb = gpt_val_batches(n, o->seqs);
    double s = 0, w = 0, t0 = now_s();
    float mbl[1024], loss = 0;
    if (n < o->m) FAIL("--eval-every: %d held-out documents, fewer than m = %d", n, o->m);
    for (int i = 0; i < nb; i++) {
        int a, k, T;
        pp_cuda_step_info info;
        gpt_val_range(n, nb, i, &a, &k);
        if (k > P->cap_seqs) FAIL("held-out batch of %d documents, the tables hold %d", k, P->cap_seqs);
        T = gpt_pack_docs(held, a, k, P->h_tok, P->h_tgt, P->h_cu);
        if (upload_batch(P, o, T, k) || cudaDeviceSynchronize() != cudaSuccess) FAIL("uploading a held-out batch failed");
        if (pp_cuda_step_begin(P->cuda, &err) != PP_OK || pp_stage_eval(P->st, &P->batch, NULL, NULL) != PP_OK)
            FAIL("evaluation: %s %s %s", pp_stage_error(P->st), pp_cuda_error(P->cuda, 0), pp_nccl_error(P->grid.pipe));
        if (pp_nccl_step_end(P->grid.pipe, o->timeout, &err) != PP_OK ||
            (P->tp > 1 && pp_nccl_step_end(P->grid.tp, o->timeout, &err) != PP_OK) || pp_cuda_step_end(P->cuda, &info, &err) != PP_OK)
            FAIL("evaluation: step_end: %s", err.msg);
        if (is_printer && read_losses(P, o, mbl, &loss)) FAIL("reading the held-out losses failed");
        s += (double)loss * T;
        w += T;
    }
    if (is_printer) gpt_loop_print_val(w > 0 ? s / w : 0.0, steps_done, n, (long long)w, nb, now_s() - t0);
    return 0;
}

static int train(proc* P, const opts* o) {
    pp_error err;
    gpt_corpus corp, held;
    const char* bad;
    uint64_t rng = 777 + 1000003ull * (uint64_t)P->dp_rank; /* each replica its own documents */
    int e_rank = pp_schedule_layer_rank(&P->sched, P->first, 0), h_rank = pp_schedule_layer_rank(&P->sched, P->first, o->layers + 1);
    int last_rank, chunk, is_printer, rc = 0, from = 0;
    int64_t tokens = 0;
    double t_run = now_s();
    gpt_traffic tr;
    memset(&tr, 0, sizeof tr);
    pp_schedule_stage_to_rank(&P->sched, P->p * P->v - 1, &last_rank, &chunk);
    is_printer = P->pp_rank == last_rank && P->dp_rank == 0 && P->tp_rank == 0; /* TP rank 0 writes the losses */
    if ((bad = gptc_opts_corpus(o, &corp))) FAIL("%s", bad);
    if (gpt_corpus_hold_out(&corp, GPT_HOLD_OUT, &held)) { /* set aside whether or not --eval-every reads it */
        gpt_corpus_free(&corp);
        FAIL("out of memory");
    }
    if (e_rank != h_rank && !(e_rank == 0 && h_rank == P->p - 1)) {
        gpt_corpus_free(&corp);
        gpt_corpus_free(&held);
        FAIL("the tied embedding sits on rank %d and the head on rank %d: the grid's tied pair is ranks 0 and %d", e_rank,
             h_rank, P->p - 1);
    }
    if (P->L.rank == 0)
        printf("gpt_nccl: %d processes (%s) = pp %d x dp %d x tp %d, %s v=%d m=%d, %d blocks, C=%d, %zu parameters a "
               "process, tied wte on pipeline ranks %d and %d, text: %s\n",
               P->L.world, P->L.source ? P->L.source : "no launcher", P->p, P->dp, P->tp, pp_schedule_name(o->kind), P->v, o->m,
               o->layers, o->dim, P->n_par, e_rank, h_rank, corp.source);
    if (P->L.rank == 0) {
        printf("text: %d documents to train on, %d held out (every %dth)\n", corp.n_docs, held.n_docs, GPT_HOLD_OUT);
        gpt_loop_print_optim("adam", o->lr, o->lr_min, o->warmup, o->steps, o->wd, o->clip);
    }
    /* the weights were uploaded and the buffers zeroed on the legacy stream (cudaMemcpy from
       pageable memory returns before the bytes land), which the non-blocking streams below do
       not wait for: fence once here; the step loop fences each batch upload the same way */
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "gpt_nccl rank %d: uploading the weights failed\n", P->L.rank);
        rc = 1;
    }
    /* the copies of wte start identical (same seed); the library's sync makes it explicit */
    if (rc == 0 && e_rank != h_rank && P->grid.tied) {
        pp_transport tt = pp_nccl_transport(P->grid.tied);
        int pair[2] = {0, 1};
        if (pp_tied_sync_weights(&tt, pair, P->pp_rank == e_rank ? (void*)P->w.embed[0].wte : NULL,
                                 P->pp_rank == h_rank ? (void*)P->w.embed[0].wte : NULL, sizeof(float) * P->run.cfg.V * P->run.cfg.C,
                                 o->timeout, &err) != PP_OK) {
            fprintf(stderr, "gpt_nccl rank %d: tied weights: %s\n", P->L.rank, err.msg);
            rc = 1;
        }
    }
    /* --resume: after the tied sync, so the file's wte is what both copies hold */
    if (rc == 0 && o->resume) {
        rc = resume_ckpt(P, o, &from);
        if (rc == 0 && P->L.rank == 0) printf("resumed from %s at step %d\n", o->resume, from);
    }
    fflush(stdout);
    for (int s = 0; s < o->steps && rc == 0; s++) {
        int T = 0;
        double t0, dt, norm = -1;
        pp_cuda_step_info info;
        pp_step_stats ss;
        float mbl[1024], loss = 0;
        memset(&info, 0, sizeof info);
        if (load_batch(P, o, &corp, &rng, &T) || gptc_zero(0, P->gbuf, sizeof(float) * P->n_grad) || cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "gpt_nccl rank %d: uploading the batch failed\n", P->L.rank);
            rc = 1;
            break;
        }
        if (s < from) continue; /* the batches before the resumed step: packed, so the same ones follow */
        t0 = now_s();
        if (pp_cuda_step_begin(P->cuda, &err) != PP_OK || pp_stage_step(P->st, &P->batch, &ss) != PP_OK) {
            fprintf(stderr, "gpt_nccl rank %d: step %d: %s %s %s\n", P->L.rank, s, pp_stage_error(P->st),
                    pp_cuda_error(P->cuda, 0), pp_nccl_error(P->grid.pipe));
            rc = 1;
            break;
        }
        /* the step's transfers, with a deadline (a peer that never sends shows up here), then the GPU */
        if (pp_nccl_step_end(P->grid.pipe, o->timeout, &err) != PP_OK ||
            (P->tp > 1 && pp_nccl_step_end(P->grid.tp, o->timeout, &err) != PP_OK) || pp_cuda_step_end(P->cuda, &info, &err) != PP_OK) {
            fprintf(stderr, "gpt_nccl rank %d: step_end: %s\n", P->L.rank, err.msg);
            rc = 1;
            break;
        }
        gpt_traffic_add(&tr, &ss);
        if (update(P, o, s, e_rank, h_rank, &norm)) {
            rc = 1;
            break;
        }
        dt = now_s() - t0;
        tokens += T;
        if (is_printer) {
            if (read_losses(P, o, mbl, &loss)) {
                rc = 1;
                break;
            }
            gpt_loop_print_step(s, o->steps, loss, gpt_lr_at(o->lr, o->lr_min, o->warmup, o->steps, s), T, dt);
            printf(" (replica)  bubble %5.1f%% (this rank)  span %.2f ms", 100.0 * info.bubble, 1e3 * info.span);
            if (norm >= 0) printf("  grad norm %.4f", norm);
            printf("\n");
            fflush(stdout);
            if (o->loss_log) { /* every micro-batch's loss, exact (hex), to compare runs of other grids bit for bit */
                FILE* f = fopen(o->loss_log, s == from ? "w" : "a");
                if (!f) {
                    fprintf(stderr, "gpt_nccl: cannot write %s\n", o->loss_log);
                    rc = 1;
                    break;
                }
                fprintf(f, "step %d", s);
                for (int i = 0; i < o->m; i++) fprintf(f, " %a", (double)mbl[i]);
                fprintf(f, "\n");
                fclose(f);
            }
        }
        if (gpt_eval_due_at(o->eval_every, s, o->steps - 1) && evaluate(P, o, &held, s + 1, is_printer)) rc = 1;
    }
    if (rc == 0 && is_printer) {
        double wall = now_s() - t_run;
        printf("%lld tokens in %.2f s: %.0f tokens/s (replica)\n", (long long)tokens, wall, wall > 0 ? (double)tokens / wall : 0.0);
    }
    if (rc == 0 && o->save) rc = save_ckpt(P, o, o->steps);
    if (rc == 0) {
        size_t pool = 0;
        int allocs = 0;
        pp_cuda_memory(P->cuda, 0, &pool, &allocs);
        printf("memory: world rank %d (pp %d, dp %d, GPU %d, first stage %d): pool %.2f MiB in %d cudaMalloc, parameters %.2f MiB, "
               "gradients %.2f MiB, Adam %.2f MiB\n",
               P->L.rank, P->pp_rank, P->dp_rank, P->dev, pp_schedule_rank_to_stage(&P->sched, P->pp_rank, 0), pool / 1048576.0, allocs,
               sizeof(float) * P->n_par / 1048576.0, sizeof(float) * P->n_grad / 1048576.0, 2 * sizeof(float) * P->n_par / 1048576.0);
        {
            /* what NCCL holds for the three transports' connections (a lower bound: pp_nccl_stats) */
            pp_nccl_stats ns[3];
            pp_nccl_get_stats(P->grid.pipe, &ns[0]);
            pp_nccl_get_stats(P->grid.dp, &ns[1]);
            pp_nccl_get_stats(P->grid.tied, &ns[2]);
            printf("nccl: world rank %d: %d communicators (pipeline %d on %d channels, dp %d, tied %d), %d + %d point-to-point "
                   "and %d + %d ring connections, %.1f MiB of NCCL buffers at least\n",
                   P->L.rank, ns[0].comms + ns[1].comms + ns[2].comms, ns[0].comms, ns[0].channels, ns[1].comms, ns[2].comms,
                   ns[0].p2p_send + ns[1].p2p_send + ns[2].p2p_send, ns[0].p2p_recv + ns[1].p2p_recv + ns[2].p2p_recv,
                   ns[0].coll_send + ns[1].coll_send + ns[2].coll_send, ns[0].coll_recv + ns[1].coll_recv + ns[2].coll_recv,
                   (double)(ns[0].conn_bytes + ns[1].conn_bytes + ns[2].conn_bytes) / 1048576.0);
        }
        {
            char who[64];
            snprintf(who, sizeof who, "world rank %d: ", P->L.rank);
            gpt_traffic_print(who, &tr, o->bf16 ? PP_BF16 : PP_F32);
        }
        fflush(stdout);
    }
    gpt_corpus_free(&corp);
    gpt_corpus_free(&held);
    return rc;
}

int main(int argc, char** argv) {
    static proc P0;
    proc* P = &P0;
    opts o;
    pp_error err;
    int rc, have_launch;
    memset(&o, 0, sizeof o); /* its own options */
    gptc_opts_default(&o);
    o.p = o.dp = 0;
    o.tp = 1;
    o.timeout = 120;
#ifdef PP_GPT_NCCL_MPI
    MPI_Init(&argc, &argv);
#endif
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* n = i + 1 < argc ? argv[i + 1] : NULL;
        int shared = gptc_opts_arg(&o, argc, argv, &i);
#define ARG(s) (!strcmp(a, s) && n && ++i)
        if (shared > 0) continue;
        if (shared < 0) {
            rc = usage();
            goto done;
        }
        if (ARG("-p")) o.p = atoi(n);
        else if (ARG("--dp")) o.dp = atoi(n);
        else if (ARG("--tp")) o.tp = atoi(n);
        else if (ARG("--id-file")) o.id_file = n;
        else if (ARG("--loss-log")) o.loss_log = n;
        else if (ARG("--timeout")) o.timeout = atof(n);
        else if (ARG("--bucket-kb")) o.bucket_kb = atoi(n);
        else if (!strcmp(a, "--no-overlap")) o.no_overlap = 1;
        else {
            rc = usage();
            goto done;
        }
#undef ARG
    }
    /* who am I: the launcher's variables; none means a single process */
    have_launch = pp_launch_from_env(&P->L, &err) == PP_OK;
    if (!have_launch) {
#ifdef PP_GPT_NCCL_MPI
        MPI_Comm_rank(MPI_COMM_WORLD, &P->L.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &P->L.world);
        P->L.local_rank = P->L.rank;
        P->L.source = "MPI_COMM_WORLD";
#else
        P->L.rank = 0;
        P->L.world = 1;
        P->L.local_rank = 0;
        P->L.source = NULL;
#endif
    }
    if (gptc_opts_check(&o) || o.timeout <= 0 || o.bucket_kb < 0 || o.bucket_kb > (1 << 21)) {
        rc = usage();
        goto done;
    }
    if (o.tp < 1 || o.dim % o.tp || o.heads % o.tp) {
        if (P->L.rank == 0) fprintf(stderr, "gpt_nccl: --tp %d must divide --dim %d and --heads %d\n", o.tp, o.dim, o.heads);
        rc = 2;
        goto done;
    }
    if (o.p <= 0) o.p = o.dp > 0 ? P->L.world / (o.dp * o.tp) : P->L.world / o.tp;
    if (o.dp <= 0) o.dp = o.p > 0 ? P->L.world / (o.p * o.tp) : 0;
    if (o.p < 1 || o.p > PP_MAX_RANKS || o.dp < 1 || o.p * o.dp * o.tp != P->L.world) {
        if (P->L.rank == 0)
            fprintf(stderr, "gpt_nccl: the world has %d processes; -p %d x --dp %d x --tp %d must equal it\n", P->L.world, o.p,
                    o.dp, o.tp);
        rc = 2;
        goto done;
    }
    if (o.layers < o.p * o.v - 2) o.layers = o.p * o.v - 2;
    if (o.layers > GPTC_MAX_BLOCK) {
        if (P->L.rank == 0)
            fprintf(stderr, "gpt_nccl: p*v = %d stages need %d blocks, at most %d\n", o.p * o.v, o.layers, GPTC_MAX_BLOCK);
        rc = 2;
        goto done;
    }
    rc = setup(P, &o, have_launch);
    if (rc == 0) rc = train(P, &o);
    proc_free(P);
done:
#ifdef PP_GPT_NCCL_MPI
    if (rc && P->L.world > 1) MPI_Abort(MPI_COMM_WORLD, rc); /* the peers may wait in NCCL */
    MPI_Finalize();
#endif
    return rc;
}
