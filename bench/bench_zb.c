/* bench/bench_zb.c - zero-bubble schedules (ZB-H1, ZB-H2, ZB-V, V-Half, V-Min, DualPipeV) against
   1F1B and interleaved, measured, same model, same run; and auto-partition by measurement with
   its predicted step time.

   1. Profile: pp_profile_layers times each layer's forward, input gradient (B) and weight
      gradient (W) of the split MLP (examples/mlp.h, PP_MODEL_SPLIT) on this thread.
   2. For each schedule: stages = p*v, boundaries by pp_partition_balanced over the measured
      f+b+w; the cost-aware kinds generated for the measured stage times
      (pp_schedule_make_cost); predicted step = pp_simulate with the per-stage measured times (comm = 0); measured
      step = median over the timed steps of the slowest rank's step on the threads transport
      (warm-up steps excluded). #wrong counts steps whose loss is not bit-identical to the
      sequential reference's, plus 1 if the accumulated gradients are not.

     build/bench_zb [--p P] [--m M] [--hidden H] [--rows R] [--steps N] [--costs-out FILE]

   --costs-out writes the measured per-layer times per micro-batch (ms, lines "f b w") in the
   format `pp-sched rank --costs @FILE` reads: "which schedule should I use?" for this model.

   CPU threads: each rank needs its own core for the measured figures to mean anything; with
   more ranks than cores (or other work on the machine) the measured times are noisy. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 15
#include "../examples/mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/harness.h"

int main(int argc, char** argv) {
    int p = hx_arg_int(argc, argv, "--p", 2), m = hx_arg_int(argc, argv, "--m", 8);
    int H = hx_arg_int(argc, argv, "--hidden", 128), rows = hx_arg_int(argc, argv, "--rows", 512);
    int steps = hx_arg_int(argc, argv, "--steps", 9), warm = 1, L = MLP_DEPTH + 1, cls = 10, in = 64, l, ki, i, r;
    int dims[MLP_DEPTH + 1], total_wrong = 0;
    mlp_model w, g;
    mlpz_model wz, gz;
    float *wbuf, *gbuf = NULL, *gref, *x, loss_ref = 0;
    int32_t* y;
    double tf[MLP_DEPTH + 1], tb[MLP_DEPTH + 1], tw[MLP_DEPTH + 1], wt[MLP_DEPTH + 1], t1f1b = 0;
    pp_model model = mlpz_model_desc();
    pp_batch b;
    pp_error err;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const struct { pp_schedule_kind k; int v; } kinds[8] = {
        {PP_SCHED_1F1B, 1}, {PP_SCHED_INTERLEAVED, 2}, {PP_SCHED_ZB_H1, 1}, {PP_SCHED_ZB_H2, 1},
        {PP_SCHED_ZB_V, 2}, {PP_SCHED_V_HALF, 2},      {PP_SCHED_V_MIN, 2}, {PP_SCHED_DUALPIPE_V, 2}};
    size_t np;

    if (p < 1 || p > 8 || m < 1 || H < 8 || H > 512 || rows < m || steps < 1 || L < 2 * p) {
        fprintf(stderr, "bench_zb: need 1 <= p <= 8, m >= 1, 8 <= hidden <= 512, rows >= m, 2p <= %d layers\n", L);
        return 2;
    }
    dims[0] = in;
    for (l = 1; l < MLP_DEPTH; l++) dims[l] = H;
    dims[MLP_DEPTH] = cls;
    memset(&w, 0, sizeof w);
    wbuf = mlp_init(&w, &g, dims, 7, &gbuf);
    np = mlp_param_count(dims);
    mlpz_from_mlp(&wz, &w);
    mlpz_from_mlp(&gz, &g);
    x = (float*)malloc(sizeof(float) * (size_t)rows * (size_t)in);
    y = (int32_t*)malloc(sizeof(int32_t) * (size_t)rows);
    gref = (float*)malloc(sizeof(float) * np);
    if (!wbuf || !x || !y || !gref) return 1;
    mlp_make_data(x, y, rows, in, cls, 3, 4);
    hx_dense_batch(&b, x, y, rows, in, m);

    /* the reference: loss, and the gradient of one run's warm + steps/3 steps */
    memset(gbuf, 0, np * sizeof(float));
    for (i = 0; i < warm + (steps + 2) / 3; i++)
        if (pp_sequential_step(&model, &wz, &gz, &b, &loss_ref, &err) != PP_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    memcpy(gref, gbuf, np * sizeof(float));

    /* 1. measured per-layer times */
    if (pp_profile_layers(&model, &wz, &gz, &b, 3, tf, tb, tw, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("bench_zb: split MLP, %d layers (hidden %d), %d rows, m=%d, p=%d, %d timed steps (+%d warm-up), %ld cores%s\n",
           L, H, rows, m, p, steps, warm, cores, cores < p ? "  (fewer cores than ranks: measured times are contended)" : "");
    printf("per-layer time per step, measured (ms): layer  F  B  W\n");
    for (l = 0; l < L; l++) {
        wt[l] = tf[l] + tb[l] + tw[l];
        if (l < 2 || l >= L - 2) printf("  %2d %-6s %7.3f %7.3f %7.3f\n", l, model.layer_name(l), tf[l] * 1e3, tb[l] * 1e3, tw[l] * 1e3);
        else if (l == 2) printf("  ..\n");
    }

    for (i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--costs-out")) {
            FILE* cf = fopen(argv[i + 1], "w");
            if (!cf) {
                fprintf(stderr, "bench_zb: cannot write %s\n", argv[i + 1]);
                return 2;
            }
            fprintf(cf, "# measured by bench_zb: per layer, per micro-batch, ms: f b w\n");
            for (l = 0; l < L; l++) fprintf(cf, "%.6f %.6f %.6f\n", tf[l] * 1e3 / m, tb[l] * 1e3 / m, tw[l] * 1e3 / m);
            fclose(cf);
            printf("wrote %s (pp-sched rank -p %d -m %d --costs @%s)\n", argv[i + 1], p, m, argv[i + 1]);
        }

    /* 2. each schedule: partition by measured time, predict, then run. The schedules take turns
       (rounds of steps / ROUNDS timed steps each) so that a change in the machine's load hits
       them alike; the measured figure is the median over all of a schedule's timed steps. */
    {
        enum { NK = 8, ROUNDS = 3 };
        pp_schedule sch[NK];
        pp_action* acts[NK];
        int first[NK][2 * 8 + 1], wrong[NK], peak[NK], nts[NK], per = (steps + ROUNDS - 1) / ROUNDS, rd;
        double pred[NK], bub[NK], *ts[NK];
        char part[NK][64];
        for (ki = 0; ki < NK; ki++) {
            pp_schedule_kind k = kinds[ki].k;
            int v = kinds[ki].v, S = p * v, st, off = 0;
            size_t n = pp_schedule_size(k, p, v, m);
            double fs[16], bs[16], ws[16];
            pp_sim_cost c;
            pp_sim_result res;
            acts[ki] = (pp_action*)malloc(n * sizeof *acts[ki]);
            ts[ki] = (double*)calloc((size_t)(per * ROUNDS), sizeof(double));
            nts[ki] = wrong[ki] = peak[ki] = 0;
            if (!acts[ki] || !ts[ki] || pp_partition_balanced(wt, L, S, first[ki], &err) != PP_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            for (st = 0; st < S; st++) {
                fs[st] = bs[st] = ws[st] = 0;
                for (l = first[ki][st]; l < first[ki][st + 1]; l++) {
                    fs[st] += tf[l] / m; /* per micro-batch */
                    bs[st] += tb[l] / m;
                    ws[st] += tw[l] / m;
                }
                off += snprintf(part[ki] + off, sizeof part[ki] - (size_t)off, "%s%d", st ? "," : "", first[ki][st]);
                if (off >= (int)sizeof part[ki]) off = (int)sizeof part[ki] - 1;
            }
            memset(&c, 0, sizeof c);
            c.f_stage = fs;
            c.b_stage = bs;
            c.w_stage = ws;
            /* the cost-aware kinds are generated for the measured stage times */
            if (pp_schedule_make_cost(k, p, v, m, &c, acts[ki], n, &sch[ki], &err) != PP_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            pp_simulate(&sch[ki], &c, &res, NULL, &err);
            pred[ki] = res.makespan;
            bub[ki] = res.bubble;
        }
        for (rd = 0; rd < ROUNDS; rd++)
            for (ki = 0; ki < NK; ki++) {
                static hx_world R;
                hx_timing T;
                memset(gbuf, 0, np * sizeof(float));
                if (hx_timed_world(&R, model, &wz, &gz, &sch[ki], first[ki], &b, warm + per, &T) != PP_OK ||
                    hx_run(&R, p, &err) != PP_OK) {
                    hx_print_errors(&R, p);
                    fprintf(stderr, "%s: %s\n", pp_schedule_name(kinds[ki].k), err.msg);
                    return 1;
                }
                for (i = 0; i < R.steps; i++) {
                    double worst = 0;
                    for (r = 0; r < p; r++)
                        if (T.t[r * R.steps + i] > worst) worst = T.t[r * R.steps + i];
                    if (i >= warm) ts[ki][nts[ki]++] = worst;
                    if (memcmp(&T.loss[i], &loss_ref, sizeof(float)) != 0) wrong[ki]++;
                }
                /* warm + per steps accumulated: compare with as many reference steps */
                if (memcmp(gbuf, gref, np * sizeof(float)) != 0) wrong[ki]++;
                for (r = 0; r < p; r++)
                    if (T.peak_live[r] > peak[ki]) peak[ki] = T.peak_live[r];
                hx_timing_free(&T);
            }
        printf("\n%-12s %2s  %-24s %9s %9s %8s %8s %7s %5s %6s\n", "schedule", "v", "partition (stage starts)", "pred ms",
               "meas ms", "pred/1f1b", "meas/1f1b", "bubble", "peak", "#wrong");
        for (ki = 0; ki < NK; ki++) {
            double med = hx_median(ts[ki], nts[ki]);
            if (ki == 0) t1f1b = med;
            printf("%-12s %2d  %-24s %9.2f %9.2f %8.3fx %8.3fx %7.3f %5d %6d\n", pp_schedule_name(kinds[ki].k), kinds[ki].v,
                   part[ki], pred[ki] * 1e3, med * 1e3, pred[ki] / pred[0], med / t1f1b, bub[ki], peak[ki], wrong[ki]);
            total_wrong += wrong[ki];
            free(acts[ki]);
            free(ts[ki]);
        }
    }
    printf("\npred: pp_simulate with the measured per-stage times; meas: median slowest-rank step; peak: most\n"
           "stashes alive on a rank (chunk stashes for v = 2: half a stage each)\n");
    printf("%s\n", total_wrong ? "FAILED: a pipelined loss or gradient differs from the reference" : "OK: every loss and gradient bit-identical to the reference");
    free(wbuf);
    free(gbuf);
    free(gref);
    free(x);
    free(y);
    return total_wrong ? 1 : 0;
}
