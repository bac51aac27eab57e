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

#include "../tests/harness.h"

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
/* Runs warm-up + steps of R (model, weights, grads, batch set); *t gets the median over steps of
   the slowest rank's step time, T each step's times and losses (hx_timing_free it). */
static pp_result run_pipeline(hx_world* R, hx_timing* T, pp_schedule_kind k, int p, int v, int m, int warm, int steps,
                              double* t) {
    static hx_sched sc;
    static int first[PP_MAX_RANKS + 1];
    pp_error err;
    pp_result rc;
    if ((rc = hx_sched_make(&sc, k, p, v, m, &err)) != PP_OK ||
        (rc = pp_partition_uniform(R->model.n_layers, p * v, first, &err)) != PP_OK ||
        (rc = hx_timing_init(T, p, warm + steps)) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        hx_sched_free(&sc);
        return rc;
    }
    R->sched = &sc.s;
    R->first = first;
    R->steps = warm + steps;
    R->after_step = hx_time_step;
    R->user = T;
    if ((rc = hx_run(R, p, &err)) != PP_OK) hx_print_errors(R, p);
    *t = hx_worst_median(T, p, warm);
    hx_sched_free(&sc);
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
        hx_dense_batch(&b, x, NULL, 32, 1, 32);
        b.targets = y;
        b.target_row_bytes = sizeof(float);
        printf("\n# host overhead per action: 16 empty layers, [1 x 1] f32 activations, 1f1b, m=32\n");
        /* agree: the plan check and the step agreement (pp_step_stats.t_agree, agree_msgs): rank 0,
           last to finish under 1F1B, says what they add to the step; msgs over all ranks */
        printf("%4s %4s %12s %12s %14s %12s %11s\n", "p", "m", "step_us", "actions/rk", "ns/action", "agree_us_r0",
               "agree_msgs");
        for (i = 0; i < 3; i++) {
            static hx_world R;
            hx_timing T;
            double t = 0;
            memset(&R, 0, sizeof R);
            R.model = nopnet_model_desc();
            R.w = &w;
            R.grads = &g;
            R.batch = &b;
            if (run_pipeline(&R, &T, PP_SCHED_1F1B, ps[i], 1, 32, 3, steps * 10, &t) != PP_OK) {
                hx_timing_free(&T);
                wrong_total++;
                continue;
            }
            {
                uint64_t am = 0;
                int r;
                for (r = 0; r < ps[i]; r++) am += R.stats[r].agree_msgs;
                printf("%4d %4d %12.1f %12d %14.0f %12.1f %11llu\n", ps[i], 32, 1e6 * t, R.sched->per_rank,
                       1e9 * t / R.sched->per_rank, 1e6 * R.stats[0].t_agree, (unsigned long long)am);
            }
            hx_timing_free(&T);
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
        hx_dense_batch(&b, x, y, rows, 64, 32);
        {
            double* ts = (double*)calloc((size_t)steps, sizeof(double));
            for (i = 0; i < steps + 3; i++) {
                double t0 = _pp_now();
                pp_sequential_step(&model, &w, &g, &b, &loss_seq, &err);
                if (i >= 3) ts[i - 3] = _pp_now() - t0;
            }
            t_seq = hx_median(ts, steps);
            free(ts);
        }
        printf("\n# pipeline efficiency: MLP %d layers x %d hidden, %d rows, m=32, T_seq = %.2f ms\n",
               model.n_layers, hidden, rows, 1e3 * t_seq);
        printf("%-12s %3s %3s %4s %10s %10s %10s %7s %6s %s\n", "schedule", "p", "v", "m", "T_pipe_ms", "efficiency",
               "theory", "ratio", "#wrong", "");
        for (ki = 0; ki < 3; ki++)
            for (pi = 0; pi < 2; pi++) {
                static hx_world R;
                hx_timing T;
                double t = 0, eff, theory;
                int p = ps[pi], v = kinds[ki] == PP_SCHED_INTERLEAVED ? 2 : 1, wrong = 0, s;
                memset(&R, 0, sizeof R);
                R.model = model;
                R.w = &w;
                R.grads = &g;
                R.batch = &b;
                if (run_pipeline(&R, &T, kinds[ki], p, v, 32, 3, steps, &t) != PP_OK) {
                    hx_timing_free(&T);
                    wrong_total++;
                    continue;
                }
                /* gradients keep accumulating across steps, the loss does not depend on them */
                for (s = 0; s < R.steps; s++)
                    if (memcmp(&T.loss[s], &loss_seq, sizeof(float)) != 0) wrong++;
                wrong_total += wrong;
                eff = t_seq / (p * t);
                theory = (double)(v * 32) / (v * 32 + p - 1);
                printf("%-12s %3d %3d %4d %10.2f %10.3f %10.3f %7.3f %6d %s\n", pp_schedule_name(kinds[ki]), p, v, 32,
                       1e3 * t, eff, theory, eff / theory, wrong, p > cores ? "(p > cores)" : "");
                hx_timing_free(&T);
            }
        free(wbuf);
        free(gbuf);
        free(x);
        free(y);
    }
    printf("\n%s\n", wrong_total ? "FAILED" : "OK");
    return wrong_total ? 1 : 0;
}
