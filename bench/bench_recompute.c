/* bench/bench_recompute.c - activation recomputation on the CPU GPT (examples/gpt.h): peak stash
   memory per rank and step time without and with it, and the plan pp_plan_recompute chooses for
   the GPT's own costs under a memory cap against the hand choices.

   1. Measured: for GPipe and 1F1B (fused blocks) and ZB-H1 (split blocks, gptz: W deferred, so
      what W reads of a recomputed block waits for it), the GPT on the threads transport with nothing recomputed,
      every other block, and every layer recomputed (pp_stage_desc.recompute). Columns: median
      step time of the slowest rank (warm-up excluded), the largest rank's peak stash bytes
      (pp_step_stats.peak_stash_bytes), each as a ratio to the same schedule without
      recomputation, and #wrong: steps whose loss, plus runs whose accumulated gradients, are not
      bit-identical to the first run without recomputation. The three take turns in 3 rounds
      (a change in the machine's load hits them alike).
   2. Planned: the GPT's per-layer costs (pp_profile_layers' times per micro-batch; memory from
      the layers' own sizes: output and saved scratch) given to pp_plan_try for every kind without
      and with every layer recomputed (the hand choices) and to pp_plan_recompute, under a cap of
      --cap-pct percent of 1F1B's peak without recomputation. The last line: the plan's predicted
      step over the best hand choice that fits (at most 1 is what it must be).

     build/bench_recompute [--p P] [--m M] [--blocks N] [--C C] [--steps N] [--cap-pct X]

   CPU threads: each rank needs its own core for the measured times to mean anything. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/harness.h"

#define NSEQ 24
#define MAXT 96

static const struct { pp_schedule_kind k; int v; } KINDS[] = {
    {PP_SCHED_GPIPE, 1},          {PP_SCHED_1F1B, 1},           {PP_SCHED_INTERLEAVED, 2}, {PP_SCHED_INTERLEAVED_MEM, 2},
    {PP_SCHED_ZB_H1, 1},          {PP_SCHED_ZB_H2, 1},          {PP_SCHED_ZB_V, 2},        {PP_SCHED_V_HALF, 2},
    {PP_SCHED_V_MIN, 2},          {PP_SCHED_DUALPIPE_V, 2}};
enum { N_KINDS = sizeof KINDS / sizeof KINDS[0] };

int main(int argc, char** argv) {
    int p = hx_arg_int(argc, argv, "--p", 2), m = hx_arg_int(argc, argv, "--m", 8);
    int NB = hx_arg_int(argc, argv, "--blocks", 6), C = hx_arg_int(argc, argv, "--C", 64);
    int steps = hx_arg_int(argc, argv, "--steps", 4), cap_pct = hx_arg_int(argc, argv, "--cap-pct", 50), warm = 1;
    gpt_config gc;
    gpt_model w, g;
    pp_model model;
    float *wbuf, *gbuf = NULL, *gnone = NULL;
    int32_t tok[NSEQ * MAXT], tgt[NSEQ * MAXT], cu[NSEQ + 1];
    pp_batch b;
    pp_error err;
    uint64_t rng = 5;
    int s, i, r, T = 0, L, l, ki, pol, total_wrong = 0, bad = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t np;
    double tf[GPT_MAX_BLOCK + 2], tb[GPT_MAX_BLOCK + 2], tw[GPT_MAX_BLOCK + 2];
    pp_layer_cost lc[GPT_MAX_BLOCK + 2];
    pp_plan_desc d;

    if (p < 1 || p > 8 || m < 1 || NB < 1 || NB > GPT_MAX_BLOCK || C < 8 || C > 512 || C % 4 || steps < 1 ||
        NB + 2 < 2 * p || cap_pct < 1) {
        fprintf(stderr, "bench_recompute: need 1 <= p <= 8, m >= 1, 2p <= blocks + 2 <= %d, 8 <= C <= 512 (C %% 4 = 0)\n",
                GPT_MAX_BLOCK + 2);
        return 2;
    }
    gc.vocab = 128, gc.max_T = MAXT, gc.C = C, gc.n_head = 4, gc.n_block = NB;
    model = gpt_model_desc_depth(NB);
    L = model.n_layers;
    cu[0] = 0;
    for (s = 0; s < NSEQ; s++) {
        int n = MAXT / 3 + (int)(gpt_rng_next(&rng) % (uint64_t)(2 * MAXT / 3));
        for (i = 0; i < n; i++) {
            tok[T + i] = (int32_t)(gpt_rng_next(&rng) % (uint64_t)gc.vocab);
            tgt[T + i] = i + 1 < n ? (int32_t)(gpt_rng_next(&rng) % (uint64_t)gc.vocab) : -1;
        }
        T += n;
        cu[s + 1] = T;
    }
    hx_token_batch(&b, tok, tgt, cu, NSEQ, m, PP_SPLIT_TOKENS);
    wbuf = gpt_init(&w, &g, &gc, 11, &gbuf);
    np = gpt_param_count(&gc);
    gnone = (float*)malloc(np * sizeof(float));
    if (!wbuf || !gnone) return 1;
    printf("bench_recompute: GPT, %d blocks, C=%d, %d tokens in %d sequences, m=%d, p=%d, %d timed steps (+%d warm-up), "
           "%ld cores%s\n",
           NB, C, T, NSEQ, m, p, steps, warm, cores, cores < p ? "  (fewer cores than ranks: times are contended)" : "");

    /* the GPT's own costs: times per micro-batch (ms), memory of a micro-batch of T/m tokens */
    if (pp_profile_layers(&model, &w, &g, &b, 2, tf, tb, tw, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    {
        int64_t Tm = T / m, sq = (int64_t)Tm * (Tm / (NSEQ / m > 0 ? NSEQ / m : 1)); /* attention: ~T * seq length */
        memset(lc, 0, sizeof lc);
        for (l = 0; l < L; l++) {
            double out = l < L - 1 ? (double)Tm * C * 4 : 0, saved;
            if (l == 0) saved = 0;
            else if (l < L - 1) saved = (double)gpt_block_saved_floats(Tm, C, gc.n_head, sq) * 4;
            else saved = (double)gpt_head_saved_floats(Tm, C, gc.vocab) * 4;
            lc[l].f = tf[l] / m * 1e3, lc[l].b = tb[l] / m * 1e3, lc[l].w = tw[l] / m * 1e3;
            lc[l].mem = out + saved, lc[l].out = out;
        }
    }
    memset(&d, 0, sizeof d);
    d.layers = lc, d.n_layers = L, d.p = p, d.m = m;

    /* 1. measured, each policy on the partition and list pp_plan_try makes for it, beside its
       prediction */
    printf("\n%-8s %-17s %9s %9s %9s %12s %9s %9s %6s\n", "schedule", "recompute", "step ms", "vs none", "pred", "peak stash B",
           "vs none", "pred", "#wrong");
    for (ki = 0; ki < 3; ki++) {
        enum { ROUNDS = 3 };
        static const char* const names[] = {"none", "every other block", "every layer"};
        pp_schedule_kind k = ki == 2 ? PP_SCHED_ZB_H1 : ki ? PP_SCHED_1F1B : PP_SCHED_GPIPE;
        pp_model km = ki == 2 ? gptz_model_desc_depth(NB) : model; /* ZB-H1: the split blocks, W deferred */
        float loss_none[16];
        double ts[3][ROUNDS * 16], t[3];
        size_t mem[3] = {0, 0, 0};
        int wrong[3] = {0, 0, 0}, nts[3] = {0, 0, 0}, rd, per = (steps + ROUNDS - 1) / ROUNDS;
        unsigned char rcs[3][GPT_MAX_BLOCK + 2];
        hx_sched hs[3];
        pp_plan pred[3];
        int first[3][9];
        if (per > 16) per = 16;
        for (pol = 0; pol < 3; pol++) {
            pp_sim_cost c;
            double fs[8], bs[8], ws[8];
            int st;
            for (l = 0; l < L; l++) rcs[pol][l] = (unsigned char)(pol == 2 || (pol == 1 && l >= 1 && l <= NB && l % 2 == 1));
            if (pp_plan_try(&d, k, 1, rcs[pol], &pred[pol], first[pol], &err) != PP_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            /* the list pp_plan_try simulated (ZB-H1 is a fixed pattern: the costs change nothing) */
            memset(&c, 0, sizeof c);
            for (st = 0; st < p; st++)
                for (fs[st] = bs[st] = ws[st] = 0, l = first[pol][st]; l < first[pol][st + 1]; l++)
                    fs[st] += lc[l].f, bs[st] += lc[l].b + (rcs[pol][l] ? lc[l].f : 0), ws[st] += lc[l].w;
            c.f_stage = fs, c.b_stage = bs, c.w_stage = ws;
            if (hx_sched_make_cost(&hs[pol], k, p, 1, m, &c, &err) != PP_OK) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
        /* the policies take turns, per steps each, so that a change in the machine's load hits
           them alike; a figure is the median over all of a policy's timed steps */
        for (rd = 0; rd < ROUNDS; rd++)
            for (pol = 0; pol < 3; pol++) {
                static hx_world W;
                hx_timing Tm;
                pp_result ok;
                memset(gbuf, 0, np * sizeof(float));
                ok = hx_timed_world(&W, km, &w, &g, &hs[pol].s, first[pol], &b, warm + per, &Tm);
                W.stage.timeout_s = 600;
                W.stage.recompute = pol ? rcs[pol] : NULL;
                if (ok != PP_OK || hx_run(&W, p, &err) != PP_OK) {
                    hx_print_errors(&W, p);
                    fprintf(stderr, "%s: %s\n", pp_schedule_name(k), err.msg);
                    return 1;
                }
                for (i = warm; i < W.steps; i++) {
                    double worst = 0;
                    for (r = 0; r < p; r++)
                        if (Tm.t[r * W.steps + i] > worst) worst = Tm.t[r * W.steps + i];
                    ts[pol][nts[pol]++] = worst;
                }
                for (r = 0; r < p; r++)
                    if (Tm.peak_stash[r] > mem[pol]) mem[pol] = Tm.peak_stash[r];
                for (i = 0; i < W.steps; i++) {
                    if (pol == 0 && rd == 0) loss_none[i] = Tm.loss[i];
                    else wrong[pol] += memcmp(&loss_none[i], &Tm.loss[i], sizeof(float)) != 0;
                }
                if (pol == 0 && rd == 0) memcpy(gnone, gbuf, np * sizeof(float));
                else wrong[pol] += memcmp(gnone, gbuf, np * sizeof(float)) != 0;
                hx_timing_free(&Tm);
            }
        for (pol = 0; pol < 3; pol++) {
            t[pol] = hx_median(ts[pol], nts[pol]);
            printf("%-8s %-17s %9.2f %8.3fx %8.3fx %12zu %8.3fx %8.3fx %6d\n", pp_schedule_name(k), names[pol], t[pol] * 1e3,
                   t[pol] / t[0], pred[pol].makespan / pred[0].makespan, mem[pol], (double)mem[pol] / (double)mem[0],
                   pred[pol].peak_mem / pred[0].peak_mem, wrong[pol]);
            total_wrong += wrong[pol];
            hx_sched_free(&hs[pol]);
        }
    }

    /* 2. planned, on the GPT's own costs (measured above) */
    {
        pp_plan hand, best_hand, plan;
        unsigned char rc[GPT_MAX_BLOCK + 2];
        int first[4 * 8 + 1], all, have = 0;
        double base_peak;
        memset(&d, 0, sizeof d);
        d.layers = lc, d.n_layers = L, d.p = p, d.m = m;
        if (pp_plan_try(&d, PP_SCHED_1F1B, 1, NULL, &hand, NULL, &err) != PP_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        base_peak = hand.peak_mem;
        d.mem_cap = base_peak * cap_pct / 100.0;
        printf("\nplanned (ms per step, predicted; peak stash bytes per rank), cap %d%% of 1f1b's peak without "
               "recomputation = %.0f bytes\n", cap_pct, d.mem_cap);
        printf("%-16s %2s %-10s %9s %12s %5s\n", "schedule", "v", "recompute", "pred ms", "peak B", "fits");
        memset(&best_hand, 0, sizeof best_hand);
        for (ki = 0; ki < N_KINDS; ki++)
            for (all = 0; all < 2; all++) {
                memset(rc, all, sizeof rc);
                if (pp_plan_try(&d, KINDS[ki].k, KINDS[ki].v, rc, &hand, NULL, &err) != PP_OK) continue;
                printf("%-16s %2d %-10s %9.3f %12.0f %5s\n", pp_schedule_name(hand.kind), hand.v, all ? "all" : "none",
                       hand.makespan, hand.peak_mem, hand.fits ? "yes" : "no");
                if (hand.fits && (!have || hand.makespan < best_hand.makespan)) best_hand = hand, have = 1;
            }
        if (pp_plan_recompute(&d, &plan, first, rc, &err) != PP_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("%-16s %2d %-10s %9.3f %12.0f %5s  <- pp_plan_recompute (%d plans), layers", pp_schedule_name(plan.kind),
               plan.v, "plan", plan.makespan, plan.peak_mem, plan.fits ? "yes" : "no", plan.tried);
        for (l = 0; l < L; l++)
            if (rc[l]) printf(" %d", l);
        printf("\n");
        if (have) {
            printf("\nplan / best hand choice that fits (%s v=%d): %.4fx predicted step time\n",
                   pp_schedule_name(best_hand.kind), best_hand.v, plan.makespan / best_hand.makespan);
            bad = !plan.fits || plan.makespan > best_hand.makespan * (1 + 1e-9);
        } else {
            printf("\nno hand choice fits the cap; the plan %s\n", plan.fits ? "does" : "does not either");
        }
    }
    printf("%s (#wrong %d)\n", total_wrong || bad ? "FAILED" : "OK", total_wrong);
    free(wbuf);
    free(gbuf);
    free(gnone);
    return total_wrong || bad ? 1 : 0;
}
