/* examples/tlm_mpi.c - train the tiny tied-embedding language model (examples/tlm.h) with one
   process per rank over MPI: a pp x dp grid, packed variable-length sequences, the embedding on
   the first stage and its tied copy in the head on the last.

   What to copy: a pp x dp grid over MPI (pp_mpi_grid_create), tied weights across the first and
   last stage (pp_tied_sync_weights, pp_tied_sum_grads), the data-parallel mean reduced during
   the pipeline's cool-down (pp_dp_overlap; pp_grad_allreduce after the step with --no-overlap).
   Start from mlp_cpu.c, then gpt_mpi.c (one process per rank, no grid).

       mpicc -std=c99 -O2 -I. examples/tlm_mpi.c -o build/tlm_mpi -lm
       mpirun -np 4 build/tlm_mpi --pp 2              (pp = 2 x dp = 2)
       srun -n 8 build/tlm_mpi --pp 4 --schedule interleaved

   Options: --pp N (default: the world size), --schedule gpipe|1f1b|interleaved|zb-h1|zb-v, --m N
   (micro-batches, default 4), --steps N (default 100), --lr X (default 1.0), --check (rank 0
   also trains the same model sequentially, replicas one after another, and the run fails
   unless its embedding, which rank 0 owns, matches the sequential one bit for bit at the end;
   exact for dp <= 2, where MPI's sum of two replicas is one commutative addition),
   --no-overlap (the data-parallel reduction after the step instead of during it),
   --bucket-bytes N (the overlap's all-reduce size, default 4 MiB).
   One training step: pp_stage_step, whose gradients-final hook starts each stage's data-parallel
   all-reduce (MPI_Iallreduce, bucket by bucket) as soon as the stage's last backward is done;
   pp_dp_overlap_wait completes them, sums the tied copies (embedding + head) and reduces those,
   and takes the mean (1/dp); then SGD on the layers this rank owns. --no-overlap does the same
   after the step: pp_tied_sum_grads, then pp_grad_allreduce with scale 1/dp, the same bits. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline_mpi.h"
#include "tlm.h"

#define VOCAB 32
#define DIM 24
#define NSEQ 16
#define MAXLEN 12

static void make_batch(pp_batch* b, int32_t* tok, int32_t* tgt, int32_t* cu, int m, int step, int dp_rank) {
    tlm_batch(b, tok, tgt, cu, NSEQ, MAXLEN, VOCAB, 7u + 1000003u * (uint64_t)step + 31u * (uint64_t)dp_rank, m);
}

int main(int argc, char** argv) {
    int pp = 0, m = 4, steps = 100, check = 0, overlap = 1, i, step, l, pair[2], first[64 + 1], rank, world;
    size_t bucket_bytes = 0;
    pp_dp_overlap* ov = NULL;
    pp_grad_buf bufs[2 * TLM_DEPTH + 2];
    float lr = 1.0f;
    pp_schedule_kind kind = PP_SCHED_1F1B;
    pp_launch launch;
    pp_mpi_grid g;
    pp_error err;
    pp_schedule sc;
    pp_action* acts;
    pp_stage* st = NULL;
    pp_stage_desc d;
    pp_model model = tlm_model_desc();
    tlm_model w, gw;
    size_t n = tlm_param_count(VOCAB, DIM), nE = (size_t)VOCAB * DIM, k;
    float *warena, *garena, *ref = NULL;
    int32_t tok[NSEQ * MAXLEN], tgt[NSEQ * MAXLEN], cu[NSEQ + 1];
    pp_batch b;
    pp_transport pipe, dpt;
    pp_result rc;
    int owns[TLM_DEPTH + 3], v;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pp") && i + 1 < argc) pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc) lr = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--no-overlap")) overlap = 0;
        else if (!strcmp(argv[i], "--bucket-bytes") && i + 1 < argc) bucket_bytes = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--schedule") && i + 1 < argc) {
            if (pp_schedule_kind_parse(argv[++i], &kind) != PP_OK) {
                if (!rank) fprintf(stderr, "unknown schedule %s\n", argv[i]);
                MPI_Finalize();
                return 2;
            }
        } else {
            if (!rank)
                fprintf(stderr, "usage: %s [--pp N] [--schedule S] [--m N] [--steps N] [--lr X] [--check] [--no-overlap] "
                                "[--bucket-bytes N]\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (pp <= 0) pp = world;
    /* the launcher's environment, as a trainer without MPI (NCCL over a shared file) reads it */
    if (pp_launch_from_env(&launch, &err) == PP_OK && !rank)
        printf("launcher: %s, world %d\n", launch.source, launch.world);
    if ((rc = pp_mpi_grid_create(MPI_COMM_WORLD, pp, PP_GRID_DP_INNER, &g, &err)) != PP_OK) {
        if (!rank) fprintf(stderr, "grid: %s\n", err.msg);
        MPI_Finalize();
        return 1;
    }
    pipe = pp_mpi_transport(g.pipe);
    dpt = pp_mpi_transport(g.dp);
    v = pp_schedule_kind_v(kind, 2);
    acts = (pp_action*)malloc(pp_schedule_size(kind, pp, v, m) * sizeof *acts);
    rc = acts ? pp_schedule_make(kind, pp, v, m, acts, pp_schedule_size(kind, pp, v, m), &sc, &err) : PP_ERR_NOMEM;
    if (rc == PP_OK && pp * v > 64) rc = _pp_fail(&err, PP_ERR_INVALID, "at most 64 stages here");
    if (rc == PP_OK) rc = pp_partition_uniform(model.n_layers, pp * v, first, &err);
    if (rc != PP_OK) {
        if (!rank) fprintf(stderr, "setup: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    warena = (float*)malloc(n * sizeof(float));
    garena = (float*)calloc(n, sizeof(float));
    tlm_fill(warena, VOCAB, DIM, 1234);
    tlm_layout(&w, warena, VOCAB, DIM, 0);
    tlm_layout(&gw, garena, VOCAB, DIM, 0);
    pair[0] = pp_schedule_layer_rank(&sc, first, TLM_EMBED_LAYER);
    pair[1] = pp_schedule_layer_rank(&sc, first, TLM_HEAD_LAYER);
    for (l = 0; l < model.n_layers; l++) owns[l] = pp_schedule_layer_rank(&sc, first, l) == g.grid.pp_rank;
    if (!rank) {
        printf("tlm_mpi: %d processes = pp %d x dp %d, %s, m = %d, %d layers, tied embedding on ranks %d and %d, "
               "data-parallel reduction %s\n", world, pp, g.grid.dp, pp_schedule_name(kind), m, model.n_layers, pair[0], pair[1],
               overlap ? "during the cool-down" : "after the step");
        pp_partition_print(stdout, &model, first, pp * v, NULL);
    }
    rc = pp_tied_sync_weights(&pipe, pair, owns[TLM_EMBED_LAYER] ? w.embed[0].E : NULL,
                              owns[TLM_HEAD_LAYER] ? w.head[0].E : NULL, nE * sizeof(float), 60, &err);
    memset(&d, 0, sizeof d);
    d.model = model;
    d.weights = &w;
    d.grads = &gw;
    d.schedule = &sc;
    d.partition = first;
    d.rank = g.grid.pp_rank;
    d.transport = pipe;
    d.timeout_s = 60;
    if (rc == PP_OK && overlap) {
        /* the data-parallel reduction from the gradients-final hook, over the grid's dp
           communicator; the tied copies are summed over the pipeline first, in the wait */
        pp_dp_overlap_desc od;
        tlm_overlap_desc(&od, &gw, &sc, first, g.grid.pp_rank, &pipe, pair, bufs);
        od.dp.t = &dpt;
        od.dp.timeout_s = 60;
        od.bucket_bytes = bucket_bytes;
        rc = pp_dp_overlap_create(&od, &ov, &err); /* scale 0: the mean, 1 / dp */
        d.grads_final = pp_dp_overlap_hook;
        d.grads_final_user = ov;
    }
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    if (check && rank == 0) {
        ref = (float*)malloc(n * sizeof(float));
        memcpy(ref, warena, n * sizeof(float));
    }
    for (step = 0; step < steps && rc == PP_OK; step++) {
        pp_step_stats stats;
        memset(garena, 0, n * sizeof(float));
        make_batch(&b, tok, tgt, cu, m, step, g.grid.dp_rank);
        if ((rc = pp_stage_step(st, &b, &stats)) != PP_OK) {
            snprintf(err.msg, sizeof err.msg, "%s", pp_stage_error(st));
            break;
        }
        if (ov) {
            rc = pp_dp_overlap_wait(ov, NULL, &err);
        } else {
            rc = pp_tied_sum_grads(&pipe, pair, owns[TLM_EMBED_LAYER] ? gw.embed[0].E : NULL,
                                   owns[TLM_HEAD_LAYER] ? gw.head[0].E : NULL, nE, PP_F32, 60, &err);
            if (rc == PP_OK) rc = pp_grad_allreduce(&dpt, NULL, 0, garena, n, PP_F32, 1.0 / g.grid.dp, 60, &err);
        }
        for (k = 0; k < n; k++) warena[k] -= lr * garena[k];
        if (stats.has_loss && g.grid.dp_rank == 0 && (step % 10 == 0 || step == steps - 1))
            printf("step %3d  loss %.4f  (%.2f ms)\n", step, stats.loss, stats.t_total * 1e3);
        if (ref) {
            /* the sequential model, dp replicas one after another, same sums in the same order */
            float* gr = (float*)calloc(n, sizeof(float));
            float* gs = (float*)calloc(n, sizeof(float));
            tlm_model rw, rg;
            int r;
            float loss;
            tlm_layout(&rw, ref, VOCAB, DIM, 0);
            for (r = 0; r < g.grid.dp; r++) {
                pp_batch rb;
                int32_t rt[NSEQ * MAXLEN], rtg[NSEQ * MAXLEN], rc2[NSEQ + 1];
                memset(gs, 0, n * sizeof(float));
                tlm_layout(&rg, gs, VOCAB, DIM, 0);
                make_batch(&rb, rt, rtg, rc2, m, step, r);
                pp_sequential_step(&model, &rw, &rg, &rb, &loss, &err);
                for (k = 0; k < nE; k++) gs[k] = gs[n - nE + k] = gs[k] + gs[n - nE + k];
                for (k = 0; k < n; k++) gr[k] = r == 0 ? gs[k] : gr[k] + gs[k];
            }
            for (k = 0; k < n; k++) ref[k] -= lr * (gr[k] * (float)(1.0 / g.grid.dp));
            free(gr);
            free(gs);
        }
    }
    if (rc != PP_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, pp_result_str(rc), err.msg);
    if (ref && rc == PP_OK) {
        /* world rank 0 is stage rank 0 of replica 0: it owns the embedding (arena offset 0) */
        int bad = owns[TLM_EMBED_LAYER] && memcmp(warena, ref, nE * sizeof(float)) != 0;
        printf("check: rank 0's embedding after %d steps %s the sequential reference\n", steps,
               bad ? "DIFFERS FROM" : "equals, bit for bit,");
        if (bad) rc = PP_ERR_SIZE;
    }
    pp_stage_destroy(st);
    pp_dp_overlap_destroy(ov);
    pp_mpi_grid_destroy(&g);
    free(acts);
    free(warena);
    free(garena);
    free(ref);
    MPI_Finalize();
    return rc == PP_OK ? 0 : 1;
}
