/* bench/bench_overhead.c - what the executor costs, and how close a real model gets to theory.

   Table 1: host overhead per action. Layers that do nothing, one-float activations, threads
   transport; time per step / actions per rank. This is the executor's bookkeeping, the
   transport's matching and the thread hand-offs, with no compute to hide them.
   Table 2: pipeline efficiency T_seq / (p * T_pipe) of the example MLP against the schedule's
   theory m / (m + p - 1) (1F1B/GPipe) or v*m / (v*m + p - 1) (interleaved). T_seq is the
   sequential reference on one thread, T_pipe the slowest rank's step. Warm-up steps are
   excluded; medians over the timed steps. #wrong counts steps whose pipelined loss is not
   bit-identical to the sequential one.

     build/bench_overhead [--steps N] [--hidden H] [--rows R]

   Efficiency needs one core per rank: rows with p above the machine's cores are printed, and
   marked, but cannot reach theory. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 15
#include "../examples/mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- an empty model: 16 layers that move one float ---------------------------------------- */
typedef struct nop_params {
    int unused;
} nop_params;
static int nop_fwd(const nop_params* p, pp_layer_io* io) {
    (void)p;
    io->loss = 0;
    return 0;
}
static int nop_bwd(const nop_params* p, nop_params* g, pp_layer_io* io) {
    (void)p;
    (void)g;
    (void)io;
    return 0;
}
static void nop_desc(const nop_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)p;
    (void)mb;
    (void)n_in;
    d->n_out = 1;
    d->out[0] = in[0];
}
static void nop_loss_desc(const nop_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)p;
    (void)mb;
    (void)in;
    (void)n_in;
    d->n_out = 0;
}
#define NOP_LAYERS(X)                                           \
    X(nop, nop_params, nop_fwd, nop_bwd, nop_desc, 15)          \
    X(nop_loss, nop_params, nop_fwd, nop_bwd, nop_loss_desc, 1)
PP_MODEL(nopnet, NOP_LAYERS)

/* --- running p ranks for a number of steps ---------------------------------------------- */
typedef struct run {
    pp_model model;
    const void* w;
    void* g;
    pp_schedule sched;
    int first[PP_MAX_RANKS + 1];
    pp_threads* threads;
    const pp_batch* batch;
    int steps;
    double* t_step;            /* [rank][steps] */
    float* loss;               /* [steps] */
    int last_rank;
    pp_result rc;
} run;

static pp_result run_rank(int rank, void* user) {
    run* R = (run*)user;
    pp_stage_desc d;
    pp_stage* st;
    pp_step_stats ss;
    pp_error err;
    pp_result rc;
    int i;
    memset(&d, 0, sizeof d);
    d.model = R->model;
    d.weights = R->w;
    d.grads = R->g;
    d.schedule = &R->sched;
    d.partition = R->first;
    d.rank = rank;
    d.transport = pp_threads_transport(R->threads, rank);
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return rc;
    }
    for (i = 0; i < R->steps; i++) {
        if ((rc = pp_stage_step(st, R->batch, &ss)) != PP_OK) {
            fprintf(stderr, "%s\n", pp_stage_error(st));
            break;
        }
        R->t_step[rank * R->steps + i] = ss.t_total;
        if (ss.has_loss) R->loss[i] = ss.loss;
    }
    pp_stage_destroy(st);
    return rc;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs warm-up + steps; *t gets the median over steps of the slowest rank's step time. */
static pp_result run_pipeline(run* R, pp_schedule_kind k, int p, int v, int m, int warm, int steps, double* t) {
    pp_action* acts;
    pp_error err;
    pp_result rc;
    size_t n = pp_schedule_size(k, p, v, m);
    double* worst;
    int i, r, chunk;
    acts = (pp_action*)malloc(n * sizeof *acts);
    if (!acts) return PP_ERR_NOMEM;
    if ((rc = pp_schedule_make(k, p, v, m, acts, n, &R->sched, &err)) != PP_OK ||
        (rc = pp_partition_uniform(R->model.n_layers, p * v, R->first, &err)) != PP_OK ||
        (rc = pp_threads_create(p, &R->threads, &err)) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        free(acts);
        return rc;
    }
    R->steps = warm + steps;
    R->t_step = (double*)calloc((size_t)p * R->steps, sizeof(double));
    R->loss = (float*)calloc((size_t)R->steps, sizeof(float));
    worst = (double*)calloc((size_t)steps, sizeof(double));
    pp_schedule_stage_rank(&R->sched, p * v - 1, &R->last_rank, &chunk);
    rc = pp_threads_run(p, run_rank, R, &err);
    for (i = 0; i < steps; i++)
        for (r = 0; r < p; r++)
            if (R->t_step[r * R->steps + warm + i] > worst[i]) worst[i] = R->t_step[r * R->steps + warm + i];
    *t = median(worst, steps);
    pp_threads_destroy(R->threads);
    free(worst);
    free(R->t_step);
    free(acts);
    return rc;
}

int main(int argc, char** argv) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE, PP_SCHED_1F1B, PP_SCHED_INTERLEAVED};
    int steps = 20, hidden = 256, rows = 1024, i, wrong_total = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) hidden = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
    }
    if (steps < 1 || hidden < 1 || hidden > 512 || rows < 32) {
        fprintf(stderr, "usage: bench_overhead [--steps N>=1] [--hidden 1..512] [--rows >=32]\n");
        return 2;
    }
    printf("# pipeline.h bench_overhead  (%ld cores, %d timed steps after 3 warm-up)\n", cores, steps);

    /* ---- table 1: empty layers ---- */
    {
        static const int ps[] = {1, 2, 4};
        nopnet_model w, g;
        float x[64];
        float y[64];
        pp_batch b;
        memset(&w, 0, sizeof w);
        memset(&g, 0, sizeof g);
        memset(x, 0, sizeof x);
        memset(y, 0, sizeof y);
        memset(&b, 0, sizeof b);
        b.m = 32;
        b.input.data = x;
        b.input.rows = 32;
        b.input.cols = 1;
        b.input.dtype = PP_F32;
        b.targets = y;
        b.target_row_bytes = sizeof(float);
        printf("\n# host overhead per action: 16 empty layers, [1 x 1] f32 activations, 1f1b, m=32\n");
        printf("%4s %4s %12s %12s %14s\n", "p", "m", "step_us", "actions/rk", "ns/action");
        for (i = 0; i < 3; i++) {
            run R;
            double t = 0;
            memset(&R, 0, sizeof R);
            R.model = nopnet_model_desc();
            R.w = &w;
            R.g = &g;
            R.batch = &b;
            if (run_pipeline(&R, PP_SCHED_1F1B, ps[i], 1, 32, 3, steps * 10, &t) != PP_OK) {
                wrong_total++;
                continue;
            }
            printf("%4d %4d %12.1f %12d %14.0f\n", ps[i], 32, 1e6 * t, R.sched.per_rank, 1e9 * t / R.sched.per_rank);
            free(R.loss);
        }
    }

    /* ---- table 2: efficiency of the MLP ---- */
    {
        static const int ps[] = {2, 4};
        mlp_model w, g;
        float *wbuf, *gbuf, *x;
        int32_t* y;
        int dims[MLP_DEPTH + 1], l, pi, ki;
        pp_model model = mlp_model_desc();
        pp_batch b;
        pp_error err;
        double t_seq;
        float loss_seq = 0;
        dims[0] = 64;
        for (l = 1; l < MLP_DEPTH; l++) dims[l] = hidden;
        dims[MLP_DEPTH] = 16;
        memset(&w, 0, sizeof w);
        wbuf = mlp_init(&w, &g, dims, 9, &gbuf);
        x = (float*)malloc((size_t)rows * 64 * sizeof(float));
        y = (int32_t*)malloc((size_t)rows * sizeof(int32_t));
        if (!wbuf || !x || !y) return 3;
        mlp_make_data(x, y, rows, 64, 16, 3, 4);
        memset(&b, 0, sizeof b);
        b.m = 32;
        b.input.data = x;
        b.input.rows = rows;
        b.input.cols = 64;
        b.input.dtype = PP_F32;
        b.targets = y;
        b.target_row_bytes = sizeof(int32_t);
        {
            double* ts = (double*)calloc((size_t)steps, sizeof(double));
            for (i = 0; i < steps + 3; i++) {
                double t0 = _pp_now();
                pp_sequential_step(&model, &w, &g, &b, &loss_seq, &err);
                if (i >= 3) ts[i - 3] = _pp_now() - t0;
            }
            t_seq = median(ts, steps);
            free(ts);
        }
        printf("\n# pipeline efficiency: MLP %d layers x %d hidden, %d rows, m=32, T_seq = %.2f ms\n",
               model.n_layers, hidden, rows, 1e3 * t_seq);
        printf("%-12s %3s %3s %4s %10s %10s %10s %7s %6s %s\n", "schedule", "p", "v", "m", "T_pipe_ms", "efficiency",
               "theory", "ratio", "#wrong", "");
        for (ki = 0; ki < 3; ki++)
            for (pi = 0; pi < 2; pi++) {
                run R;
                double t = 0, eff, theory;
                int p = ps[pi], v = kinds[ki] == PP_SCHED_INTERLEAVED ? 2 : 1, wrong = 0, s;
                memset(&R, 0, sizeof R);
                R.model = model;
                R.w = &w;
                R.g = &g;
                R.batch = &b;
                if (run_pipeline(&R, kinds[ki], p, v, 32, 3, steps, &t) != PP_OK) {
                    wrong_total++;
                    continue;
                }
                /* gradients keep accumulating across steps, the loss does not depend on them */
                for (s = 0; s < R.steps; s++)
                    if (memcmp(&R.loss[s], &loss_seq, sizeof(float)) != 0) wrong++;
                wrong_total += wrong;
                eff = t_seq / (p * t);
                theory = (double)(v * 32) / (v * 32 + p - 1);
                printf("%-12s %3d %3d %4d %10.2f %10.3f %10.3f %7.3f %6d %s\n", pp_schedule_name(kinds[ki]), p, v, 32,
                       1e3 * t, eff, theory, eff / theory, wrong, p > cores ? "(p > cores)" : "");
                free(R.loss);
            }
        free(wbuf);
        free(gbuf);
        free(x);
        free(y);
    }
    printf("\n%s\n", wrong_total ? "FAILED" : "OK");
    return wrong_total ? 1 : 0;
}
