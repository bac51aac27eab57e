/* bench/bench_overlap.c - the data-parallel gradient reduction overlapped with the pipeline's
   cool-down (pp_dp_overlap), against the same reduction after the step, in the same run.

       make bench-overlap        (MPI: mpirun -np 8 build/bench_overlap_mpi, pp = 4 x dp = 2;
                                  the NCCL imitation: build/bench_overlap_nccl, 8 rank threads)
       build/bench_overlap_nccl [--pp 4] [--dp 2] [--width 384] [--rows 16] [--m 8] [--reps 15] [--kind 1]
                                [--coalesce 0|1]

   Model: examples/mlp.h with 8 dense layers of `width` units (tanh) and the loss, uniform over
   pp stages: each stage holds two layers' gradients (width^2 + width floats each), the same
   bytes everywhere. Each replica's batch: m micro-batches of `rows` rows of its own data.
   Three modes, alternated step by step, each mode first, second and third of a round in turn
   (so the machine's load and what the step before left hit them alike), after one warm-up
   round: "none" reduces nothing (the step alone); "after" creates the stage without the
   gradients-final hook, so pp_dp_overlap_wait does every bucket after pp_stage_step returned
   (what pp_grad_allreduce after the step does, bucket for bucket); "overlap" sets the hook
   (pp_dp_overlap_hook): each stage's buckets go when its gradients are final, and the wait is
   left the rest.
   Columns, per pp rank (the median over steps of the slowest dp replica; ms):
     wait        from pp_stage_step's return to the gradients reduced (pp_dp_overlap_wait; for
                 the NCCL imitation also pp_nccl_step_end and pp_cuda_step_end, in every mode)
     in-step     time the hooks spent reducing inside the step
     final       when the rank's gradients were final, from its step's start (t_grads_final)
     step        pp_stage_step's start to the gradients reduced
     exposed     step - the "none" step: what the reduction added to this rank's step
   A rank's reduction inside the step is hidden only where the rank would otherwise wait (the
   cool-down, the step's agreement, which waits for the last rank) and the resources it uses
   (cores, links) are idle then: with more ranks than cores nothing is idle, and exposed stays.
   The last rows: wait and exposed averaged over the pp ranks, overlap against after (the goal:
   about 1/pp, every stage's reduction hidden but the one that finishes last), and the largest
   rank's exposed. exposed is the difference of two steps of the same size: under load it is
   the noisier of the two (wait is measured directly).
   #wrong: gradient floats whose bits differ between after and overlap (same weights, same data:
   must be 0). The footer says OK or FAILED; the exit code agrees. */
#define PIPELINE_IMPLEMENTATION
#ifdef BENCH_MPI
#include "pipeline.h"
#include "pipeline_mpi.h"
#else
#include "pipeline_nccl.h" /* and pipeline_cuda.h: built with -Itests/fakenccl -Itests/fakecuda */
#endif
#define MLP_DEPTH 8
#include "examples/mlp.h"
#ifndef BENCH_MPI
#include "tests/fakecuda/layer_kernels.h"
#endif
#include "tests/harness.h"

#include <pthread.h>

#define MAX_REPS 64
#define MAX_PP 16

typedef struct bench_cfg {
    int pp, dp, width, rows, m, reps, kind;
    int coalesce;               /* --coalesce 0|1 (default 1): a layer's weight and bias, and a
                                   stage's layers, in one all-reduce (pp_dp_overlap_desc.coalesce) */
} bench_cfg;

#define MODES 3 /* none, after, overlap */

/* One rank's medians, per mode: wait, in-step, final, step (ms). */
typedef struct rank_result {
    double ms[MODES][4];
    long wrong;
    int ok;
} rank_result;

/* What a rank needs from its transport's world. */
typedef struct rank_env {
    const bench_cfg* cfg;
    int pp_rank, dp_rank;
    pp_transport pipe, dp;
    pp_stage_desc tmpl;         /* device and layer_ctx (the NCCL imitation) */
    pp_model model;
    void (*barrier)(struct rank_env* e);
    pp_result (*step_end)(struct rank_env* e, pp_error* err); /* may be NULL */
    void* user;
} rank_env;

static double median_of(double* v, int n) { return hx_median(v, n); }

/* Runs both modes on this rank; 0 on success. */
static int bench_rank(rank_env* e, rank_result* out) {
    const bench_cfg* c = e->cfg;
    int dims[MLP_DEPTH + 1], l, mode, rep, i, k, nb = 0, first[MAX_PP + 1];
    size_t n;
    mlp_model w, g;
    float *gbuf = NULL, *wbuf, *gsave = NULL, *gover = NULL, *x;
    int32_t* y;
    pp_batch b;
    pp_schedule sc;
    pp_action* acts = NULL;
    pp_grad_buf bufs[2 * MLP_DEPTH];
    pp_stage* st[MODES] = {NULL, NULL, NULL};
    pp_dp_overlap* ov[MODES] = {NULL, NULL, NULL};
    pp_error err;
    pp_result rc;
    double t[MODES][4][MAX_REPS];
    size_t na;
    for (l = 0; l <= MLP_DEPTH; l++) dims[l] = c->width;
    wbuf = mlp_init(&w, &g, dims, 7, &gbuf);
    n = mlp_param_count(dims);
    x = (float*)malloc(sizeof(float) * (size_t)c->rows * (size_t)c->m * (size_t)c->width);
    y = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->rows * (size_t)c->m);
    gsave = (float*)malloc(n * sizeof(float));
    gover = (float*)malloc(n * sizeof(float));
    na = pp_schedule_size((pp_schedule_kind)c->kind, c->pp, 1, c->m);
    acts = (pp_action*)malloc(na * sizeof *acts);
    err.msg[0] = 0;
    if (!wbuf || !x || !y || !gsave || !gover || !acts) return 1;
    mlp_make_data(x, y, c->rows * c->m, c->width, c->width, 100u + (uint64_t)e->dp_rank, 5);
    hx_dense_batch(&b, x, y, c->rows * c->m, c->width, c->m);
    rc = pp_schedule_make((pp_schedule_kind)c->kind, c->pp, 1, c->m, acts, na, &sc, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(MLP_DEPTH + 1, c->pp, first, &err);
    for (l = 0; l < MLP_DEPTH && rc == PP_OK; l++) {
        if (pp_schedule_layer_rank(&sc, first, l) != e->pp_rank) continue;
        memset(&bufs[nb], 0, 2 * sizeof bufs[0]);
        bufs[nb].layer = bufs[nb + 1].layer = l;
        bufs[nb].dtype = bufs[nb + 1].dtype = PP_F32;
        bufs[nb].data = g.dense[l].w;
        bufs[nb].count = (size_t)dims[l] * (size_t)dims[l + 1];
        bufs[nb + 1].data = g.dense[l].b;
        bufs[nb + 1].count = (size_t)dims[l + 1];
        nb += 2;
    }
    for (mode = 0; mode < MODES && rc == PP_OK; mode++) {
        pp_dp_overlap_desc od;
        pp_stage_desc d;
        memset(&od, 0, sizeof od);
        od.dp.t = &e->dp;
        od.dp.timeout_s = 60;
        od.bucket_bytes = (size_t)1 << 20;
        od.bufs = bufs;
        od.n_bufs = nb;
        od.partition = first;
        od.n_stages = sc.n_stages;
        od.coalesce = c->coalesce; /* one arena (mlp_init), the same offsets on every replica */
        rc = pp_dp_overlap_create(&od, &ov[mode], &err);
        hx_stage_desc(&d, &e->tmpl, e->model, &w, &g, &sc, first, e->pp_rank, e->pipe);
        d.timeout_s = 60;
        if (mode == 2) {
            d.grads_final = pp_dp_overlap_hook;
            d.grads_final_user = ov[mode];
        }
        if (rc == PP_OK) rc = pp_stage_create(&d, &st[mode], &err);
    }
    out->wrong = 0;
    for (rep = 0; rep <= c->reps && rc == PP_OK; rep++)
        for (k = 0; k < MODES && rc == PP_OK; k++) {
            pp_step_stats ss;
            pp_dp_overlap_stats os;
            double t0, t1, t2;
            mode = (rep + k) % MODES; /* each mode in each place of the round in turn */
            memset(gbuf, 0, n * sizeof(float));
            e->barrier(e);
            t0 = _pp_now();
            rc = pp_stage_step(st[mode], &b, &ss);
            if (rc != PP_OK) {
                snprintf(err.msg, sizeof err.msg, "%s", pp_stage_error(st[mode]));
                break;
            }
            t1 = _pp_now();
            if (e->step_end) rc = e->step_end(e, &err);
            memset(&os, 0, sizeof os);
            if (rc == PP_OK && mode > 0) rc = pp_dp_overlap_wait(ov[mode], &os, &err);
            t2 = _pp_now();
            if (rc != PP_OK) break;
            if (rep > 0) {
                t[mode][0][rep - 1] = (t2 - t1) * 1e3;
                t[mode][1][rep - 1] = os.t_hook * 1e3;
                t[mode][2][rep - 1] = ss.t_grads_final * 1e3;
                t[mode][3][rep - 1] = (t2 - t0) * 1e3;
            }
            if (mode == 1) memcpy(gsave, gbuf, n * sizeof(float));
            else if (mode == 2) memcpy(gover, gbuf, n * sizeof(float));
        }
    if (rc != PP_OK) fprintf(stderr, "rank (pp %d, dp %d): %s\n", e->pp_rank, e->dp_rank, err.msg);
    for (i = 0; i < (int)n && rc == PP_OK; i++) out->wrong += memcmp(&gsave[i], &gover[i], sizeof(float)) != 0;
    for (mode = 0; mode < MODES; mode++) {
        for (i = 0; i < 4 && rc == PP_OK; i++) out->ms[mode][i] = median_of(t[mode][i], c->reps);
        pp_stage_destroy(st[mode]);
        pp_dp_overlap_destroy(ov[mode]);
    }
    out->ok = rc == PP_OK;
    free(wbuf);
    free(gbuf);
    free(gsave);
    free(gover);
    free(x);
    free(y);
    free(acts);
    return rc != PP_OK;
}

/* The table from every rank's results (world rank pp_rank * dp + dp_rank). */
static int report(const bench_cfg* c, const rank_result* res, const char* transport) {
    static const char* const mode_name[MODES] = {"none", "after", "overlap"};
    double mean[MODES] = {0, 0, 0}, worst[MODES] = {0, 0, 0}, left[MODES] = {0, 0, 0};
    long wrong = 0;
    int r, d, mode, ok = 1;
    printf("bench_overlap over %s: pp = %d x dp = %d, %s, m = %d, %d dense layers of %d units (%.2f MB of "
           "gradients per stage), %d steps per mode\n",
           transport, c->pp, c->dp, pp_schedule_name((pp_schedule_kind)c->kind), c->m, MLP_DEPTH, c->width,
           (double)MLP_DEPTH / c->pp * ((double)c->width * c->width + c->width) * 4 / 1e6, c->reps);
    printf("%-8s %-7s %10s %10s %10s %10s %10s\n", "pp rank", "mode", "wait", "in-step", "final", "step", "exposed");
    for (r = 0; r < c->pp; r++) {
        double none = 0;
        for (mode = 0; mode < MODES; mode++) {
            double v[4] = {0, 0, 0, 0};
            int k;
            for (d = 0; d < c->dp; d++) {
                const rank_result* x = &res[r * c->dp + d];
                ok &= x->ok;
                for (k = 0; k < 4; k++)
                    if (x->ms[mode][k] > v[k]) v[k] = x->ms[mode][k];
                if (mode == 0) wrong += x->wrong;
            }
            if (mode == 0) none = v[3];
            left[mode] += v[0] / c->pp;
            mean[mode] += (v[3] - none) / c->pp;
            if (v[3] - none > worst[mode]) worst[mode] = v[3] - none;
            printf("%-8d %-7s %10.3f %10.3f %10.3f %10.3f %10.3f\n", r, mode_name[mode], v[0], v[1], v[2], v[3], v[3] - none);
        }
    }
    printf("reduction left after the step (wait), mean over pp ranks: after %.3f ms, overlap %.3f ms: ratio %.2f "
           "(goal about 1/pp = %.2f)\n",
           left[1], left[2], left[1] > 0 ? left[2] / left[1] : 0, 1.0 / c->pp);
    printf("exposed reduction (step - the step without one), mean over pp ranks: after %.3f ms, overlap %.3f ms: "
           "ratio %.2f (goal about 1/pp = %.2f)\n",
           mean[1], mean[2], mean[1] > 0 ? mean[2] / mean[1] : 0, 1.0 / c->pp);
    printf("the largest rank's: after %.3f ms, overlap %.3f ms: ratio %.2f\n", worst[1], worst[2],
           worst[1] > 0 ? worst[2] / worst[1] : 0);
    printf("#wrong %ld\n%s\n", wrong, ok && wrong == 0 ? "OK" : "FAILED");
    return ok && wrong == 0 ? 0 : 1;
}

static void read_cfg(bench_cfg* c, int argc, char** argv) {
    c->pp = hx_arg_int(argc, argv, "--pp", 4);
    c->dp = hx_arg_int(argc, argv, "--dp", 2);
    c->width = hx_arg_int(argc, argv, "--width", 384);
    c->rows = hx_arg_int(argc, argv, "--rows", 16);
    c->m = hx_arg_int(argc, argv, "--m", 8);
    c->reps = hx_arg_int(argc, argv, "--reps", 15);
    c->kind = hx_arg_int(argc, argv, "--kind", (int)PP_SCHED_1F1B);
    c->coalesce = hx_arg_int(argc, argv, "--coalesce", 1);
    if (c->reps > MAX_REPS) c->reps = MAX_REPS;
    if (c->reps < 1) c->reps = 1;
}

#ifdef BENCH_MPI
/* MPI: one process per rank; the grid's pipeline and dp communicators (pp_mpi_grid). */
static void mpi_barrier(rank_env* e) {
    (void)e;
    hx_quiet_barrier();
}

int main(int argc, char** argv) {
    bench_cfg c;
    rank_env e;
    pp_mpi_grid g;
    pp_error err;
    rank_result mine, *all = NULL;
    int world, rank, bad = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    read_cfg(&c, argc, argv);
    c.dp = world / c.pp;
    if (c.pp < 1 || c.pp > MAX_PP || world % c.pp || pp_mpi_grid_create(MPI_COMM_WORLD, c.pp, PP_GRID_DP_INNER, &g, &err) != PP_OK) {
        if (rank == 0) fprintf(stderr, "bench_overlap: %d processes do not make a pp = %d grid\n", world, c.pp);
        MPI_Finalize();
        return 1;
    }
    memset(&e, 0, sizeof e);
    memset(&mine, 0, sizeof mine);
    e.cfg = &c;
    e.pp_rank = g.grid.pp_rank;
    e.dp_rank = g.grid.dp_rank;
    e.pipe = pp_mpi_transport(g.pipe);
    e.dp = pp_mpi_transport(g.dp);
    e.model = mlp_model_desc();
    e.barrier = mpi_barrier;
    bad = bench_rank(&e, &mine);
    if (rank == 0) all = (rank_result*)calloc((size_t)world, sizeof *all);
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank == 0) bad = report(&c, all, "MPI") || bad;
    free(all);
    pp_mpi_grid_destroy(&g);
    MPI_Finalize();
    return bad;
}
#else
/* The NCCL imitation: one thread per rank, each on its own imitation device, a world
   communicator split into the grid's pipeline and dp communicators (pp_nccl_grid). */
typedef struct nccl_world {
    bench_cfg c;
    ncclUniqueId id;
    pp_model model;
    pthread_barrier_t bar;
    rank_result res[MAX_PP * 8];
} nccl_world;

typedef struct nccl_rank {
    nccl_world* W;
    int r;
    pp_nccl_grid g;
    pp_cuda* cu;
    cudaStream_t stream;
} nccl_rank;

static void nccl_barrier(rank_env* e) { pthread_barrier_wait(&((nccl_rank*)e->user)->W->bar); }

static pp_result nccl_step_end(rank_env* e, pp_error* err) {
    nccl_rank* R = (nccl_rank*)e->user;
    pp_result rc = pp_nccl_step_end(R->g.pipe, 60, err);
    return rc == PP_OK ? pp_cuda_step_end(R->cu, NULL, err) : rc;
}

static void* nccl_rank_main(void* arg) {
    nccl_rank* R = (nccl_rank*)arg;
    nccl_world* W = R->W;
    int ndev = 1, dev;
    pp_launch L;
    pp_cuda_desc cd;
    ncclComm_t comm = NULL;
    pp_error err;
    rank_env e;
    pp_result rc;
    int have_grid = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    dev = R->r % ndev;
    memset(&L, 0, sizeof L);
    L.rank = R->r;
    L.world = W->c.pp * W->c.dp;
    L.local_rank = dev;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.devices = &dev;
    rc = pp_nccl_comm_init(&L, &W->id, 60, &comm, &err);
    if (rc == PP_OK) rc = pp_cuda_create(&cd, &R->cu, &err);
    if (rc == PP_OK) rc = pp_cuda_bind(R->cu, 0, &err);
    if (rc == PP_OK) rc = pp_nccl_grid_create(comm, W->c.pp, PP_GRID_DP_INNER, pp_cuda_stream(R->cu, 0), 60, &R->g, &err);
    have_grid = rc == PP_OK;
    if (rc == PP_OK) {
        memset(&e, 0, sizeof e);
        e.cfg = &W->c;
        e.pp_rank = R->g.grid.pp_rank;
        e.dp_rank = R->g.grid.dp_rank;
        e.pipe = pp_nccl_transport(R->g.pipe);
        e.dp = pp_nccl_transport(R->g.dp);
        R->stream = pp_cuda_stream(R->cu, 0);
        e.tmpl.device = pp_cuda_device_ops(R->cu, 0);
        e.tmpl.layer_ctx = &R->stream;
        e.model = W->model;
        e.barrier = nccl_barrier;
        e.step_end = nccl_step_end;
        e.user = R;
        bench_rank(&e, &W->res[R->g.grid.pp_rank * W->c.dp + R->g.grid.dp_rank]);
    } else {
        fprintf(stderr, "rank %d: %s\n", R->r, err.msg);
    }
    if (have_grid) pp_nccl_grid_destroy(&R->g);
    if (comm) ncclCommDestroy(comm);
    pp_cuda_destroy(R->cu);
    return NULL;
}

int main(int argc, char** argv) {
    static nccl_world W;
    nccl_rank R[MAX_PP * 8];
    pthread_t th[MAX_PP * 8];
    int r, n;
    read_cfg(&W.c, argc, argv);
    n = W.c.pp * W.c.dp;
    if (W.c.pp < 1 || W.c.pp > MAX_PP || W.c.dp < 1 || n > MAX_PP * 8) {
        fprintf(stderr, "bench_overlap: pp = %d x dp = %d is too large\n", W.c.pp, W.c.dp);
        return 1;
    }
    W.model = layer_kernels_model(mlp_model_desc());
    ncclGetUniqueId(&W.id);
    pthread_barrier_init(&W.bar, NULL, (unsigned)n);
    for (r = 0; r < n; r++) {
        memset(&R[r], 0, sizeof R[r]);
        R[r].W = &W;
        R[r].r = r;
        pthread_create(&th[r], NULL, nccl_rank_main, &R[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&W.bar);
    return report(&W.c, W.res, "the NCCL imitation");
}
#endif
