/* examples/gpt_loop.h - the parts of a training loop that every GPT program of the examples
   shares, whatever holds its weights: the learning-rate schedule (warm-up, then cosine), when to
   evaluate the held-out split, the lines a run prints (the optimizer, a step, an evaluation), and
   checkpoints through pp_ckpt_* (saved to a new name and renamed, loaded with the step).
   examples/gpt_train.h (gpt_cpu, gpt_mpi: host memory) and examples/gpt_cuda.h (gpt_cuda,
   gpt_nccl: device memory) build on it, so --lr, --lr-min, --warmup, --wd, --clip,
   --eval-every, --save and --resume mean the same in all four. Plain C99 that also compiles as
   C++ (nvcc); everything is static inline. Include after pipeline.h. */
#ifndef PP_EXAMPLE_GPT_LOOP_H
#define PP_EXAMPLE_GPT_LOOP_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT_PI 3.14159265358979323846

/* The learning rate of step (counted from 0): during the warm-up lr * (step + 1) / warmup, then
   a cosine from lr at step warmup down to lr_min at step steps (the one after the last: llm.c's
   and torch's CosineAnnealingLR's count). A function of the step alone, so a run resumed from a
   checkpoint (which holds the step) continues the schedule where the saved run stopped; steps
   is the whole run's, also when resuming. No warm-up and lr_min = lr give every step lr, bit for
   bit. */
static inline float gpt_lr_at(float lr, float lr_min, int warmup, int steps, int step) {
    double hi = lr, lo = lr_min, t;
    if (step < warmup) return (float)(hi * (double)(step + 1) / (double)warmup);
    if (step >= steps) return lr_min;
    if (lr_min == lr) return lr;
    t = (double)(step - warmup) / (double)(steps - warmup);
    return (float)(lo + 0.5 * (hi - lo) * (1.0 + cos(GPT_PI * t)));
}

/* The held-out split: every GPT_HOLD_OUT-th document of the text (gpt_corpus_hold_out), always
   set aside, so that a run with --eval-every trains on the same batches as one without. */
#define GPT_HOLD_OUT 10

/* --eval-every's batches: the first n held-out documents (--eval-seqs of them, or all if fewer),
   in order, cut into gpt_val_batches(n, seqs) batches of about seqs documents (at least seqs
   each, or one batch); batch i holds documents [*first, *first + *count). The same batches at
   every evaluation, for every p, v and schedule. */
static inline int gpt_val_batches(int n, int seqs) {
    int nb = n / seqs;
    return nb < 1 ? 1 : nb;
}
static inline void gpt_val_range(int n, int nb, int i, int* first, int* count) {
    *first = (int)((long long)i * n / nb);
    *count = (int)((long long)(i + 1) * n / nb) - *first;
}

/* --eval-every: after every every-th step (from 0) and after the last; never when every is 0. */
static inline int gpt_eval_due_at(int every, int step, int last) {
    return every > 0 && ((step + 1) % every == 0 || step == last);
}

/* --recompute K: activation recomputation (pp_stage_desc.recompute) of every K-th block from the
   first (1: every block, 2: every other one; 0: none); the embedding and the head keep their
   activations. flags has n_layers entries (embedding, blocks, head); returns flags, or NULL
   where nothing is recomputed (K = 0). A recomputed block keeps only its input from F to B and
   runs its forward again right before its B: the same bits, one forward more per block. */
static inline int gpt_recompute_layer(int every, int l, int n_layers) {
    return every > 0 && l >= 1 && l + 1 < n_layers && (l - 1) % every == 0;
}
static inline const unsigned char* gpt_recompute_flags(int every, int n_layers, unsigned char* flags) {
    int l;
    if (every <= 0) return NULL;
    for (l = 0; l < n_layers; l++) flags[l] = (unsigned char)gpt_recompute_layer(every, l, n_layers);
    return flags;
}

/* The largest rank's pp_step_stats.peak_stash_bytes of pipeline pl's last step, into *peak where
   it is larger (one process drives every rank). */
static inline void gpt_pipeline_peak(const pp_pipeline* pl, int p, size_t* peak) {
    int r;
    for (r = 0; r < p; r++) {
        pp_step_stats rs;
        pp_pipeline_rank_result(pl, r, &rs);
        if (rs.peak_stash_bytes > *peak) *peak = rs.peak_stash_bytes;
    }
}

/* The closing line on activation memory: the most bytes one rank held in stashes in one step
   (pp_step_stats.peak_stash_bytes, the largest rank's), and what --recompute K recomputed. */
static inline void gpt_loop_print_peak(size_t peak_bytes, int every, int n_layers) {
    int l, n = 0;
    for (l = 0; l < n_layers; l++) n += gpt_recompute_layer(every, l, n_layers);
    printf("activations: peak %.3f MiB stashed on one rank in one step", (double)peak_bytes / 1048576.0);
    if (every > 0) printf(", recomputing %d of %d layers (--recompute %d)", n, n_layers, every);
    printf("\n");
}

/* "--wd, --lr-min, --warmup ..." in range: 0, else 1 with a message. */
static inline int gpt_loop_check(float lr_min, int warmup, float wd, float clip, int eval_every, int eval_seqs) {
    if (!(clip >= 0)) {
        fprintf(stderr, "--clip wants a norm >= 0 (0: off)\n");
        return 1;
    }
    if (!(wd >= 0) || !(lr_min >= 0) || warmup < 0 || eval_every < 0 || eval_seqs < 1) {
        fprintf(stderr, "--wd, --lr-min, --warmup and --eval-every want values >= 0, --eval-seqs >= 1\n");
        return 1;
    }
    return 0;
}

/* The line on the optimizer and its rate schedule (name: "adam", "sgd+momentum"; "adam" with a
   weight decay prints as "adamw"). */
static inline void gpt_loop_print_optim(const char* name, float lr, float lr_min, int warmup, int steps, float wd,
                                        float clip) {
    printf("optimizer: %s, lr %g", wd > 0 && !strcmp(name, "adam") ? "adamw" : name, (double)lr);
    if (warmup > 0) printf(" after a warm-up of %d steps", warmup);
    if (lr_min != lr) printf(", cosine to %g at step %d", (double)lr_min, steps);
    if (wd > 0) printf(", weight decay %g on the matrices", (double)wd);
    if (clip > 0) printf(", gradients clipped at norm %g", (double)clip);
    printf("\n");
}

/* The start of a step's progress line: the step of steps, its loss and rate, its tokens and the
   tokens per second of secs; the program adds its own fields and the newline. */
static inline void gpt_loop_print_step(int step, int steps, float loss, float lr, int tokens, double secs) {
    printf("step %3d/%d  loss %.4f  lr %.2e  %5d tokens  %7.0f tok/s", step, steps, (double)loss, (double)lr, tokens,
           secs > 0 ? tokens / secs : 0.0);
}

/* The line of an evaluation: the held-out loss after steps_done steps, over docs documents of
   tokens tokens in batches batches that took secs. */
static inline void gpt_loop_print_val(double loss, int steps_done, int docs, long long tokens, int batches, double secs) {
    printf("val loss %.4f after %d steps  (%d held-out documents, %lld tokens in %d batch%s, %.0f tok/s)\n", loss,
           steps_done, docs, tokens, batches, batches == 1 ? "" : "es", secs > 0 ? (double)tokens / secs : 0.0);
    fflush(stdout);
}

/* ---- checkpoints: --save FILE, --resume FILE ------------------------------------------------------
   The weights, the optimizer's two moment buffers (Adam's m and v; SGD keeps its momentum in the
   first) and the steps done, layer by layer through the model's params hook: independent of the
   schedule, p, v and the partition. moments: two model structs bound like weights. own: the
   layers this process saves or loads (NULL: all). name: the model's name in the file. */
static inline pp_ckpt_desc gpt_ckpt_of(const pp_model* m, const char* name, const void* weights,
                                       const void* const* moments, const unsigned char* own, int steps_done) {
    static const char* const names[2] = {"m", "v"};
    pp_ckpt_desc k;
    memset(&k, 0, sizeof k);
    k.model = *m;
    k.name = name;
    k.weights = weights;
    k.n_state = 2;
    k.state = moments;
    k.state_names = names;
    k.own = own;
    k.step = steps_done;
    return k;
}

/* Saves every layer k names into path.tmp, renamed to path when complete (a crash keeps the last
   good checkpoint); prints "saved PATH after N steps". 0 on success, else 1 with a message. */
static inline int gpt_ckpt_save_path(const pp_ckpt_desc* k, const char* path) {
    size_t n = strlen(path) + 5;
    char* tmp = (char*)malloc(n);
    pp_error err;
    int rc = 1;
    if (!tmp) return 1;
    snprintf(tmp, n, "%s.tmp", path);
    if (pp_ckpt_save_file(k, tmp, &err) != PP_OK) fprintf(stderr, "--save %s: %s\n", path, err.msg);
    else if (rename(tmp, path) != 0) fprintf(stderr, "--save: renaming %s to %s: %s\n", tmp, path, strerror(errno));
    else rc = 0;
    if (rc == 0) printf("saved %s after %d steps\n", path, (int)k->step);
    free(tmp);
    return rc;
}

/* Loads what k names from path, and the steps done into *step; 0 on success, else 1 with a
   message (a truncated or foreign file is refused before a byte is written). */
static inline int gpt_ckpt_load_path(const pp_ckpt_desc* k, const char* path, int* step) {
    pp_ckpt_info info;
    pp_error err;
    if (pp_ckpt_load_file(k, path, &info, &err) != PP_OK) {
        fprintf(stderr, "--resume %s: %s\n", path, err.msg);
        return 1;
    }
    *step = (int)info.step;
    return 0;
}

#endif
