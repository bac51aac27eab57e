/* examples/gpt_mpi.c - examples/gpt_cpu.c's GPT with one process per pipeline rank, over MPI
   (pipeline_mpi.h).

   What to copy: the per-rank API, which every multi-process transport uses. Each process
   builds the same schedule and partition, makes its one pp_stage (pp_stage_desc: model,
   weights, grads, schedule, partition, its rank and the transport), steps it, and updates only
   the layers its stages own. Start from mlp_cpu.c and gpt_cpu.c (one process); tlm_mpi.c adds
   data parallelism and a tied embedding; gpt_nccl.cu is the same on GPUs.

     mpirun -np 4 build/gpt_mpi [--schedule ...] [-v 2] [-m 8] [--steps 60] ... [--check]
     mpirun -np 8 build/gpt_mpi --tp 2 ...             (pp 4 x tp 2: TENSOR PARALLELISM below)

   Options as gpt_cpu (-p is the number of processes over --tp). The last rank prints. --check runs
   pp_sequential_step on the first batch in every process and requires the loss and the
   gradients of every layer to equal the pipelined ones bit for bit (exit 1 if not).
   --save FILE: every rank writes its own layers into one checkpoint (rank 0 creates it with the
   header first; the others write their records at offsets the layers' sizes give), which
   gpt_cpu --resume, or gpt_mpi at another process count or schedule, reads back: each rank
   loads the layers it owns (--resume FILE). The trainer's options (--wd, --warmup, --lr-min,
   --eval-every, --eval-seqs, --dtype) are gpt_cpu's: every rank runs the optimizer on its own
   layers at the step's rate, and every rank calls pp_stage_eval on the held-out batches (the last rank
   gets the loss and prints "val loss X"). With --check the first evaluation is compared with
   pp_sequential_eval on the last rank, after every rank has sent it the weights of its layers
   (a broadcast per layer from its owner: the one place the ranks' weights are gathered).

   TENSOR PARALLELISM (--tp N): world = pp x tp (dp 1), pp_mpi_grid_create_tp's grid, TP innermost:
   each stage's layers split over N processes the Megatron way (examples/gpt.h, TENSOR
   PARALLELISM: heads and MLP units split, a row-parallel all-reduce), each process holding its TP
   rank's shard of gpt_init's weights (gpt_init_tp). The layers reach their TP group through
   pp_model.ctx (a pp_group over the grid's tp transport); the pipeline runs over the grid's pipe
   transport, one pipeline per TP rank, its boundaries split over the TP group (pp_stage_desc.tp:
   each TP rank sends 1/N of a boundary's rows and the next stage all-gathers them; --tp-whole
   sends each TP rank the whole tensor, the same bits with N times the bytes between stages). --clip: pp_stage_grad_clip_tp with the block's shards
   declared tp_sharded (gpt_grad_bufs_tp). --check also runs the tp = 1 model on step 0's batch in
   every process and requires the TP loss and every gradient buffer (this rank's shard of the
   tp = 1 gradient) within 1e-5 relative of it (TP adds its partial sums in another order). With
   --tp (any N) the last rank prints every step's loss and norm to 9 digits (a "tp N losses" line)
   for comparisons across runs. --save with --tp > 1: TP rank 0 of each pipeline rank gathers its
   group's shards of the weights and of Adam's moments (MPI_Gather), puts them together in the
   tp = 1 layout (gpt_tp_unshard) and writes that rank's layers: the file is a tp = 1 file, which
   gpt_cpu, gpt_mpi at any p and tp (--resume: every rank reads the whole layers it owns and keeps
   its shard, gpt_tp_shard) read. (pipeline.h's own checkpoint shards, pp_ckpt_desc.tp, slice a
   buffer by rows, columns or flat; a TP rank's qkv columns are three ranges, q, k and v of its
   heads, which they cannot name.) */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline_mpi.h"
#include "gpt.h"
#include "gpt_data.h"
#include "gpt_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The held-out batches through every rank's forward-only step after steps_done steps; the rank
   of the last stage (has_loss) prints the line. With check: every layer's weights from the
   rank that owns it to every rank, then pp_sequential_eval on the last stage's rank (*differ
   set when it differs). 0 on success, 1 when an evaluation failed (on every rank alike). */
static int evaluate(const gpt_opts* c, gpt_trainer* T, pp_stage* st, const pp_model* m, const pp_schedule* sched,
                    const int* first, int steps_done, int check, int* differ, MPI_Comm pipe) {
    double t0 = gpt_now();
    pp_step_stats ss;
    int i, l, has_loss = 0;
    for (i = 0; i < T->n_val; i++) {
        pp_batch b = gpt_step_batch(c, &T->val[i]);
        if (pp_stage_eval(st, &b, NULL, &ss) != PP_OK) {
            fprintf(stderr, "evaluation after %d steps: %s\n", steps_done, pp_stage_error(st));
            return 1;
        }
        if ((has_loss = ss.has_loss)) T->val_loss[i] = ss.loss;
    }
    if (has_loss) gpt_val_print(T, steps_done, gpt_now() - t0);
    if (!check) return 0;
    for (l = 0; l < m->n_layers; l++) {
        size_t n;
        float* w = gpt_layer_params(&T->w, &T->gc, l, &n);
        MPI_Bcast(w, (int)n, MPI_FLOAT, pp_schedule_layer_rank(sched, first, l), pipe);
    }
    if (has_loss && gpt_val_check(T, c, m, steps_done)) *differ = 1;
    return 0;
}

/* --check with --tp > 1: the tp = 1 model (gpt_init, the same seed) through pp_sequential_step on
   batch b, in this process (gpt_tp1_reference); its loss against the TP reference's (T->ref_loss,
   which --check requires bit-identical to the pipelined loss) and each of its gradient buffers,
   sharded as this rank's, against the TP reference's (gpt_tp1_compare). *worst gets the largest
   relative difference, *loss_rel the loss's; 0, or 1 when out of memory or the step failed. */
static int check_tp1(const gpt_trainer* T, const gpt_opts* c, const pp_batch* b, double* loss_rel, double* worst,
                     char* worst_name, size_t name_cap) {
    gpt_model fg;
    float loss1 = 0, *fgbuf = gpt_tp1_reference(T, c, b, 1, &fg, &loss1);
    int rc;
    if (!fgbuf) return 1;
    *loss_rel = *worst = 0;
    rc = gpt_tp1_compare(T, &fg, loss1, loss_rel, worst, worst_name, name_cap);
    free(fgbuf);
    return rc;
}

/* Every TP rank's weights and moments to TP rank 0 of the group (tpc), which puts them into f;
   0, or 1 when out of memory (on TP rank 0; the others still take part). */
static int tp_gather(const gpt_trainer* T, gpt_full* f, MPI_Comm tpc) {
    float* src[3];
    gpt_model* dst[3];
    float* all = NULL;
    int i, k, bad = 0;
    src[0] = T->wbuf;
    src[1] = T->m1;
    src[2] = T->m2;
    dst[0] = &f->w;
    dst[1] = &f->m[0];
    dst[2] = &f->m[1];
    if (T->tp_rank == 0 && !(all = (float*)malloc((size_t)T->tp * T->n_params * sizeof(float)))) bad = 1;
    for (i = 0; i < 3; i++) {
        MPI_Gather(src[i], (int)T->n_params, MPI_FLOAT, all, (int)T->n_params, MPI_FLOAT, 0, tpc);
        for (k = 0; all && k < T->tp; k++) {
            gpt_model v;
            gpt_bind_tp(&v, &T->gc, T->tp, k, all + (size_t)k * T->n_params);
            gpt_tp_unshard(&v, dst[i], &T->gc);
        }
    }
    free(all);
    return bad;
}

int main(int argc, char** argv) {
    gpt_opts c;
    gpt_trainer T;
    double t0, wall = 0;
    size_t n_acts;
    int rank = 0, size = 1, step, chunk, l, rc = 1, bad = 0, last = 0, ok, have = 0, nb = 0, from = 0;
    int evals = 0, val_differ = 0;
    double t_eval = 0;
    double norm = -1;
    pp_grad_buf bufs[12 * GPT_MAX_BLOCK + 5]; /* --clip: one per layer, or per parameter with --tp (gpt_grad_bufs_tp) */
    int* first = NULL;
    unsigned char* own = NULL; /* the layers this rank's stages own: what it saves and loads */
    gpt_opts part;
    pp_action* acts = NULL;
    pp_schedule sched;
    pp_partition_desc pd;
    pp_mpi* mpi = NULL;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_step_stats ss;
    gpt_traffic tr = {0, 0, 0, 0, 0}; /* summed over the ranks at the end */
    unsigned char rflags[GPT_MAX_BLOCK + 2]; /* --recompute */
    unsigned long long peak = 0;             /* the most stash bytes of a step, the largest rank's at the end */
    pp_error err;
    int tp = 1, prank = 0, last_world = 0, tp_bad = 0;
    pp_grid pg;                     /* this process's place: pp_rank (prank), tp_rank */
    pp_mpi_grid grid;               /* --tp > 1: the pipe and TP transports */
    int have_grid = 0;
    pp_transport tpt;
    pp_group tpg;                   /* the TP group the layers reach through pp_model.ctx */
    MPI_Comm pipe_comm = MPI_COMM_NULL; /* this TP rank's pipeline: the evaluation's broadcasts */
    MPI_Comm tp_comm = MPI_COMM_NULL;   /* this rank's TP group: --save's gathers */
    gpt_full full;                  /* --save, --resume with --tp > 1 */
    double* norms = NULL;           /* (steps) --clip's norm of every step, for the --tp line */
    double tp_loss_rel = 0, tp_worst = 0;
    char tp_worst_name[64] = "";
    memset(&grid, 0, sizeof grid);
    memset(&full, 0, sizeof full);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (gpt_opts_parse(argc, argv, &c)) {
        if (rank == 0) gpt_opts_usage("gpt_mpi");
        MPI_Finalize();
        return 2;
    }
    tp = c.tp > 1 ? c.tp : 1;
    if (size % tp) {
        if (rank == 0) fprintf(stderr, "gpt_mpi: --tp %d does not divide %d processes\n", tp, size);
        MPI_Finalize();
        return 2;
    }
    c.p = size / tp; /* every process is one pipeline rank of one TP rank */
    if (c.check_resume) {
        if (rank == 0) fprintf(stderr, "gpt_mpi: --check-resume is gpt_cpu's (--save and --resume work here)\n");
        MPI_Finalize();
        return 2;
    }
    if (gpt_opts_check(&c) || pp_grid_make_tp(size, rank, c.p, tp, PP_GRID_DP_INNER, &pg, &err) != PP_OK) {
        MPI_Finalize();
        return 2;
    }
    prank = pg.pp_rank;
    {
        int color, key;
        pp_grid_pipe_split(&pg, &color, &key);
        MPI_Comm_split(MPI_COMM_WORLD, color, key, &pipe_comm);
        pp_grid_tp_split(&pg, &color, &key);
        MPI_Comm_split(MPI_COMM_WORLD, color, key, &tp_comm);
    }
    if (rank != size - 1 && !freopen("/dev/null", "w", stdout)) perror("freopen"); /* the last rank prints */
    /* every process builds the same data, model, schedule and partition */
    if (gpt_trainer_init_tp(&T, &c, pg.tp_rank)) goto cleanup;
    have = 1;
    norms = (double*)calloc((size_t)c.steps, sizeof(double));
    first = (int*)calloc((size_t)(c.p * c.v + 1), sizeof(int));
    own = (unsigned char*)calloc((size_t)c.layers + 2, 1);
    n_acts = pp_schedule_size(c.kind, c.p, c.v, c.m);
    acts = (pp_action*)malloc((n_acts ? n_acts : 1) * sizeof *acts);
    if (!first || !own || !acts || !norms) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        goto cleanup;
    }
    memset(&pd, 0, sizeof pd);
    pd.policy = PP_PARTITION_COST;
    pd.n_stages = c.p * c.v;
    pd.sample = &T.sample;
    memset(&d, 0, sizeof d);
    d.model = gpt_model_for(c.kind, c.layers); /* split blocks where the schedule has W */
    if (pp_schedule_make(c.kind, c.p, c.v, c.m, acts, n_acts, &sched, &err) != PP_OK ||
        pp_partition_model(&d.model, &T.w, &pd, first, NULL, &err) != PP_OK ||
        (tp == 1 && pp_mpi_create(MPI_COMM_WORLD, MPI_COMM_NULL, &mpi, &err) != PP_OK) ||
        (tp > 1 && pp_mpi_grid_create_tp(MPI_COMM_WORLD, c.p, tp, PP_GRID_DP_INNER, &grid, &err) != PP_OK)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        goto cleanup;
    }
    have_grid = tp > 1;
    if (tp > 1) { /* the layers' TP group (examples/gpt.h reads it from pp_model.ctx) */
        tpt = pp_mpi_transport(grid.tp);
        memset(&tpg, 0, sizeof tpg);
        tpg.t = &tpt;
        d.model.ctx = &tpg;
    }
    printf("gpt_mpi: %d processes (pp %d x tp %d), %s v=%d m=%d; %d layers (embed, %d blocks, head), C=%d, %zu "
           "parameters%s\n",
           size, c.p, tp, pp_schedule_name(c.kind), c.v, c.m, d.model.n_layers, c.layers, c.dim, T.n_params,
           tp > 1 ? " per TP rank" : "");
    gpt_trainer_print(&T, &c);
    pp_partition_print(stdout, &d.model, first, c.p * c.v, NULL);
    /* this process's stage */
    d.weights = &T.w;
    d.grads = &T.g;
    d.schedule = &sched;
    d.partition = first;
    d.rank = prank;
    d.transport = pp_mpi_transport(tp > 1 ? grid.pipe : mpi);
    d.recompute = gpt_recompute_flags(c.recompute, d.model.n_layers, rflags);
    /* the boundaries split over the TP group: each TP rank sends its 1/tp of the rows to its peer of
       the next stage, which all-gathers them (--tp-whole: each sends the whole tensor, as before);
       either way the step's outcome is agreed over the TP group */
    d.tp = tp > 1 ? &tpg : NULL;
    d.tp_whole = c.tp_whole;
    if (pp_stage_create(&d, &st, &err) != PP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        goto cleanup;
    }
    for (l = 0; l < d.model.n_layers; l++) own[l] = pp_schedule_layer_rank(&sched, first, l) == prank;
    if (c.resume) { /* each rank its own layers (with --tp: whole, then its shard of them); every rank must have them */
        if (tp > 1) {
            pp_ckpt_desc k;
            ok = gpt_full_alloc(&full, &T) == 0;
            if (ok) {
                k = gpt_ckpt_of(&d.model, "gpt", &full.w, full.moments, own, 0);
                ok = gpt_ckpt_load_path(&k, c.resume, &from) == 0;
            }
            if (ok) gpt_full_shard(&T, &full, 0);
        } else {
            ok = gpt_trainer_resume(&T, &d.model, c.resume, own, &from) == 0;
        }
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!ok) goto cleanup;
        if (from >= c.steps) {
            fprintf(stderr, "--resume %s: it is at step %d, --steps %d leaves nothing to do\n", c.resume, from, c.steps);
            goto cleanup;
        }
        printf("resumed from %s at step %d%s\n", c.resume, from, tp > 1 ? ", each TP rank its shard" : "");
    }
    pp_schedule_stage_to_rank(&sched, c.p * c.v - 1, &last, &chunk);
    last_world = pp_grid_rank_tp(&pg, last, 0, 0); /* holds the losses */
    for (chunk = 0; chunk < c.v; chunk++) { /* --clip: this rank's layers' gradients */
        int s = pp_schedule_rank_to_stage(&sched, prank, chunk);
        if (tp > 1) gpt_grad_bufs_tp(&T, first[s], first[s + 1], bufs, &nb);
        else gpt_grad_bufs(&T, first[s], first[s + 1], bufs, &nb);
    }
    t0 = gpt_now();
    for (step = from; step < c.steps; step++) {
        pp_batch b = gpt_step_batch(&c, &T.steps[step]);
        if (pp_stage_step(st, &b, &ss) != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, pp_stage_error(st));
            goto cleanup;
        }
        gpt_traffic_add(&tr, &ss);
        if (ss.peak_stash_bytes > peak) peak = ss.peak_stash_bytes;
        if (c.check && step == 0 && gpt_trainer_reference(&T, &d.model, &b)) goto cleanup;
        if (c.check && step == 0 && tp > 1) {
            if (check_tp1(&T, &c, &b, &tp_loss_rel, &tp_worst, tp_worst_name, sizeof tp_worst_name)) goto cleanup;
            if (tp_loss_rel > GPT_TP_TOL || tp_worst > GPT_TP_TOL) {
                fprintf(stderr,
                        "rank %d (pp %d, tp %d): against tp 1: loss %.3g, gradients %.3g (%s) relative: above %g\n",
                        rank, prank, pg.tp_rank, tp_loss_rel, tp_worst, tp_worst_name, GPT_TP_TOL);
                tp_bad = 1;
            }
        }
        /* --check compares the gradients of the layers this rank's stages own with the
           reference's; --clip clips them all by the global norm (every rank calls it, each
           with its own layers); then the optimizer on them (it zeroes their gradients) */
        for (chunk = 0; chunk < c.v && c.check && step == 0; chunk++) {
            int s = pp_schedule_rank_to_stage(&sched, prank, chunk);
            for (l = first[s]; l < first[s + 1]; l++) bad += gpt_trainer_differs(&T, &d.model, l);
        }
        if (c.clip > 0 && (tp > 1 ? pp_stage_grad_clip_tp(st, &tpg, bufs, nb, c.clip, &norm, &err)
                                  : pp_stage_grad_clip(st, bufs, nb, c.clip, &norm, &err)) != PP_OK) {
            fprintf(stderr, "rank %d: step %d: %s\n", rank, step, err.msg);
            goto cleanup;
        }
        norms[step] = norm;
        for (chunk = 0; chunk < c.v; chunk++) {
            int s = pp_schedule_rank_to_stage(&sched, prank, chunk);
            for (l = first[s]; l < first[s + 1]; l++) {
                size_t n, off = (size_t)(gpt_layer_params(&T.w, &T.gc, l, &n) - T.wbuf);
                gpt_optimize(&c, T.wbuf + off, T.gbuf + off, T.m1 + off, T.m2 + off, T.decay + off, n, step);
            }
        }
        if (ss.has_loss) {
            T.loss[step] = ss.loss;
            gpt_step_print(&c, step, ss.loss, &T.steps[step], ss.t_total, norm);
        }
        if (gpt_eval_due(&c, step, c.steps - 1)) { /* --eval-every: every rank, the weights after step + 1 steps */
            double te = gpt_now();
            if (evaluate(&c, &T, st, &d.model, &sched, first, step + 1, c.check && evals++ == 0, &val_differ,
                         pipe_comm))
                goto cleanup;
            t_eval += gpt_now() - te;
        }
    }
    wall = gpt_now() - t0 - t_eval;
    if (c.save) { /* into FILE.tmp: rank 0 makes it with the header, then every other rank adds its
                     records; renamed to FILE once all are in */
        pp_ckpt_desc k = gpt_trainer_ckpt(&T, &d.model, c.steps, own);
        char tmp[4096];
        int writer = pg.tp_rank == 0; /* with --tp > 1: TP rank 0, the group's shards put together */
        ok = (size_t)snprintf(tmp, sizeof tmp, "%s.tmp", c.save) < sizeof tmp;
        if (tp > 1) {
            if (!full.buf && gpt_full_alloc(&full, &T)) ok = 0;
            if (tp_gather(&T, &full, tp_comm)) ok = 0;
            k = gpt_ckpt_of(&d.model, "gpt", &full.w, full.moments, own, c.steps);
            if (!ok) snprintf(err.msg, sizeof err.msg, "out of memory");
        }
        if (ok && rank == 0) ok = pp_ckpt_save_file(&k, tmp, &err) == PP_OK;
        MPI_Barrier(MPI_COMM_WORLD);
        k.records_only = 1;
        if (ok && rank != 0 && writer) ok = pp_ckpt_save_file(&k, tmp, &err) == PP_OK;
        if (!ok) fprintf(stderr, "rank %d: --save %s: %s\n", rank, c.save, err.msg);
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (ok && rank == 0 && rename(tmp, c.save) != 0) {
            perror("--save: rename");
            ok = 0;
        }
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) goto cleanup;
        printf("saved %s after %d steps, every rank its own layers\n", c.save, c.steps);
    }
    rc = 0;
cleanup:
    /* every rank agrees on the outcome; the last stage's losses go to every rank */
    ok = rc == 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (ok) {
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &val_differ, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MPI_Bcast(T.loss, c.steps, MPI_FLOAT, last_world, MPI_COMM_WORLD);
        part = c;
        part.steps = c.steps - from;
        gpt_report(&part, T.steps + from, T.loss + from, wall);
        MPI_Allreduce(MPI_IN_PLACE, &tr.bytes, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD); /* gpt_cpu's sums */
        gpt_traffic_print("", &tr, c.dtype);
        MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
        gpt_loop_print_peak((size_t)peak, c.recompute, d.model.n_layers);
        if (c.check && from == 0) rc = gpt_trainer_verdict(&T, bad);
        if (val_differ) rc = 1;
        if (c.check && tp > 1) { /* every rank's comparison with tp = 1: the worst of them */
            double w[2];
            w[0] = tp_loss_rel;
            w[1] = tp_worst;
            MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &tp_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            printf("check: tp %d against tp 1 on step 0: loss %.3g, gradients %.3g relative (largest over ranks and "
                   "buffers; tolerance %g) %s\n",
                   tp, w[0], w[1], GPT_TP_TOL, tp_bad ? "DIFFERENT" : "ok");
            if (tp_bad) rc = 1;
        }
        if (c.tp) { /* every step's loss and norm to 9 digits: the same bits print the same */
            printf("tp %d losses", tp);
            for (step = from; step < c.steps; step++) printf(" %.9g", (double)T.loss[step]);
            printf(" norms");
            for (step = from; step < c.steps; step++) printf(" %.17g", norms[step]);
            printf("\n");
        }
    } else {
        rc = 1;
    }
    pp_stage_destroy(st);
    pp_mpi_destroy(mpi);
    if (have_grid) pp_mpi_grid_destroy(&grid);
    if (pipe_comm != MPI_COMM_NULL) MPI_Comm_free(&pipe_comm);
    if (tp_comm != MPI_COMM_NULL) MPI_Comm_free(&tp_comm);
    free(full.buf);
    free(norms);
    free(acts);
    free(first);
    free(own);
    if (have) gpt_trainer_free(&T, &c);
    MPI_Finalize();
    return rc;
}
