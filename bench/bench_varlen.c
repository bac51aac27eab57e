/* bench/bench_varlen.c - packed against padded micro-batches, and what each shape policy costs.

   Lengths are long-tailed: lognormal with median 96 tokens and sigma 1.0, capped at 1024 (a
   CPU-sized version of the lognormal-capped-at-4096 mix of pretraining documents). Every step
   packs 64 sequences, split into m = 8 micro-batches, through p = 2 stage threads, 1F1B, the
   example MLP applied per token (hidden 64).
   - packed: activations are [total_tokens, hidden], micro-batches of whole sequences, balanced
     by tokens; nothing is padded.
   - padded: what a static-shape pipeline does: every sequence padded to the step's longest,
     [n_seqs * max_len, hidden]; the pad rows cost compute and bandwidth.
   Table 2 runs the packed batches under each shape policy: step time, metadata messages and
   bytes per step. #wrong: steps whose packed loss is not bit-identical to the sequential run.

     build/bench_varlen [--steps N] */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 7
#include "../examples/mlp.h"
#include "../tests/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQS 64
#define M 8
#define P 2
#define IN 16
#define HID 64
#define CLASSES 8
#define CAP 1024

typedef struct bstep {
    pp_batch b;
    float* x;
    int32_t* y;
    int32_t cu[SEQS + 1];
    int64_t real_tokens;
} bstep;
static void bstep_free(bstep* s) {
    free(s->x);
    free(s->y);
}

typedef struct brun {
    hx_world W;
    hx_steps S;
    pp_step_stats st[P * 64];   /* [rank * n + step] */
} brun;

/* Runs n steps of `steps` under policy; returns the median slowest-rank step time, and sums bytes
   and metadata. */
static double run_steps(brun* R, bstep* steps, int n, pp_shape_policy policy, uint64_t* bytes, uint64_t* meta_msgs,
                        uint64_t* meta_bytes, float* losses) {
    double worst[64];
    pp_error err;
    int i, r;
    memset(R->st, 0, sizeof R->st);
    R->W.stage.shapes = policy;
    R->W.stage.max_seqs = SEQS;
    R->S.first = &steps[0].b;
    R->S.stride = sizeof *steps;
    R->S.hide_meta = policy == PP_SHAPES_BROADCAST; /* only the first stage has the metadata */
    R->S.stats = R->st;
    hx_world_steps(&R->W, &R->S, n);
    if (hx_run(&R->W, P, &err) != PP_OK) hx_print_errors(&R->W, P);
    *bytes = *meta_msgs = *meta_bytes = 0;
    for (i = 0; i < n; i++) {
        worst[i] = 0;
        for (r = 0; r < P; r++) {
            const pp_step_stats* s = &R->st[r * n + i];
            if (s->t_total > worst[i]) worst[i] = s->t_total;
            *bytes += s->bytes_sent;
            *meta_msgs += s->meta_msgs_sent;
            *meta_bytes += s->meta_bytes_sent;
            if (s->has_loss && losses) losses[i] = s->loss;
        }
    }
    qsort(worst, (size_t)n, sizeof(double), hx_cmp_double);
    return worst[n / 2];
}

static double normal(uint64_t* s) {
    double u1 = (mlp_rng_next(s) >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
    double u2 = (mlp_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int main(int argc, char** argv) {
    static bstep packed[64], padded[64];
    int steps = 8, i, j, dims[MLP_DEPTH + 1], first[P + 1], wrong = 0;
    uint64_t seed = 2026;
    mlp_model w, g;
    float *wbuf, *gbuf = NULL, loss_seq[64], loss_pipe[64];
    pp_action acts[2 * M * P];
    pp_schedule sched;
    pp_error err;
    pp_model model = mlp_model_desc();
    brun* R = (brun*)calloc(1, sizeof *R);
    double t_packed, t_padded;
    uint64_t by_packed, by_padded, mm, mb;
    int64_t real = 0, pad_rows = 0;
    for (i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    if (steps < 1 || steps > 64 || !R) {
        fprintf(stderr, "usage: bench_varlen [--steps 1..64]\n");
        return 2;
    }
    dims[0] = IN;
    for (i = 1; i < MLP_DEPTH; i++) dims[i] = HID;
    dims[MLP_DEPTH] = CLASSES;
    wbuf = mlp_init(&w, &g, dims, 3, &gbuf);
    for (i = 0; i < steps; i++) {
        int32_t len[SEQS], mx = 0;
        bstep *pk = &packed[i], *pd = &padded[i];
        pk->cu[0] = pd->cu[0] = 0;
        for (j = 0; j < SEQS; j++) {
            double l = exp(log(96.0) + 1.0 * normal(&seed));
            len[j] = (int32_t)(l < 1 ? 1 : l > CAP ? CAP : l);
            if (len[j] > mx) mx = len[j];
            pk->cu[j + 1] = pk->cu[j] + len[j];
        }
        for (j = 0; j < SEQS; j++) pd->cu[j + 1] = pd->cu[j] + mx;
        pk->real_tokens = pd->real_tokens = pk->cu[SEQS];
        real += pk->cu[SEQS];
        pad_rows += pd->cu[SEQS];
        pk->x = (float*)malloc(sizeof(float) * (size_t)pk->cu[SEQS] * IN);
        pk->y = (int32_t*)malloc(sizeof(int32_t) * (size_t)pk->cu[SEQS]);
        pd->x = (float*)calloc((size_t)pd->cu[SEQS] * IN, sizeof(float));
        pd->y = (int32_t*)calloc((size_t)pd->cu[SEQS], sizeof(int32_t));
        mlp_make_data(pk->x, pk->y, pk->cu[SEQS], IN, CLASSES, seed + (uint64_t)i, 5);
        for (j = 0; j < SEQS; j++) { /* the same tokens, each sequence at the start of its padded slot */
            memcpy(pd->x + (size_t)pd->cu[j] * IN, pk->x + (size_t)pk->cu[j] * IN, sizeof(float) * (size_t)len[j] * IN);
            memcpy(pd->y + pd->cu[j], pk->y + pk->cu[j], sizeof(int32_t) * (size_t)len[j]);
        }
        for (j = 0; j < 2; j++) {
            bstep* s = j ? pd : pk;
            hx_dense_batch(&s->b, s->x, s->y, s->cu[SEQS], IN, M);
            s->b.cu_seqlens = s->cu;
            s->b.n_seqs = SEQS;
            s->b.split = j ? PP_SPLIT_SEQS : PP_SPLIT_TOKENS;
        }
        pp_sequential_step(&model, &w, &g, &packed[i].b, &loss_seq[i], &err);
    }
    pp_schedule_make(PP_SCHED_1F1B, P, 1, M, acts, sizeof acts / sizeof acts[0], &sched, &err);
    pp_partition_uniform(model.n_layers, P, first, &err);
    R->W.model = model;
    R->W.w = &w;
    R->W.grads = &g;
    R->W.sched = &sched;
    R->W.first = first;

    printf("# pipeline.h bench_varlen: %d sequences/step, lognormal lengths (median 96, sigma 1, cap %d),"
           " m=%d, p=%d threads, 1f1b, MLP %dx%d per token, %d steps\n",
           SEQS, CAP, M, P, MLP_DEPTH, HID, steps);
    printf("\n%-8s %12s %12s %12s %14s %9s %7s\n", "layout", "step_ms", "tokens/s", "rows/step", "MB sent/step",
           "padding", "#wrong");
    t_padded = run_steps(R, padded, steps, PP_SHAPES_LOCAL, &by_padded, &mm, &mb, NULL);
    t_packed = run_steps(R, packed, steps, PP_SHAPES_LOCAL, &by_packed, &mm, &mb, loss_pipe);
    for (i = 0; i < steps; i++) wrong += memcmp(&loss_pipe[i], &loss_seq[i], sizeof(float)) != 0;
    printf("%-8s %12.2f %12.0f %12.0f %14.3f %8.1f%% %7s\n", "padded", 1e3 * t_padded, (double)real / steps / t_padded,
           (double)pad_rows / steps, by_padded / 1e6 / steps, 100.0 * (double)(pad_rows - real) / (double)pad_rows, "-");
    printf("%-8s %12.2f %12.0f %12.0f %14.3f %8.1f%% %7d\n", "packed", 1e3 * t_packed, (double)real / steps / t_packed,
           (double)real / steps, by_packed / 1e6 / steps, 0.0, wrong);
    printf("packed/padded: %.2fx tokens/s, %.2fx bytes\n", t_padded / t_packed, (double)by_packed / (double)by_padded);

    printf("\n%-12s %10s %12s %14s %7s\n", "policy", "step_ms", "meta msgs", "meta B/step", "#wrong");
    for (j = 0; j < 4; j++) {
        static const char* names[4] = {"local", "broadcast", "per_message", "auto"};
        int bad = 0;
        double t;
        t = run_steps(R, packed, steps, (pp_shape_policy)j, &by_packed, &mm, &mb, loss_pipe);
        for (i = 0; i < steps; i++) bad += memcmp(&loss_pipe[i], &loss_seq[i], sizeof(float)) != 0;
        wrong += bad;
        printf("%-12s %10.2f %12.1f %14.0f %7d\n", names[j], 1e3 * t, (double)mm / steps, (double)mb / steps, bad);
    }
    printf("\n%s\n", wrong ? "FAILED" : "OK");
    for (i = 0; i < steps; i++) {
        bstep_free(&packed[i]);
        bstep_free(&padded[i]);
    }
    free(wbuf);
    free(gbuf);
    free(R);
    return wrong ? 1 : 0;
}
