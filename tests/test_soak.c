/* tests/test_soak.c - many steps with changing packed shapes: memory stays flat, results stay
   equal to the sequential reference, nothing is left queued.

   Every step draws a new packed batch (sequence count and lengths change, so every boundary's
   shape changes), runs it through a pipeline of threads and through pp_sequential_step, and
   compares gradients (summed over ranks) and the loss bit for bit. The library's memory is
   counted through the PP_MALLOC/PP_FREE override: after a warm-up step with the largest shapes,
   the bytes the library holds between steps must not grow.
   Two pipelines: 1F1B p = 3 with LOCAL shapes, interleaved p = 2, v = 2 with AUTO shapes (its
   shape tracker resizes whenever a micro-batch's size changes).

   Before them, BROADCAST's metadata buffers with their allocation failing (test_bcast_nomem).

   build/test_soak                 the short run make test does (--steps 400; 100 with PP_QUICK set)
   build/test_soak --steps 5000    the long run
   build/test_soak nomem           the failed allocations only (nomem-msg: the message buffer's) */
#define _POSIX_C_SOURCE 200809L /* the allocator below comes before pipeline.h */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Counting allocator: a 16-byte header keeps each block's size. It fails on demand: every
   allocation of g_fail_size bytes, or call number g_fail_call (g_calls + 1 is the next). */
static pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static long long g_live_bytes, g_live_blocks, g_allocs, g_max_alloc, g_calls, g_fail_call, g_failed;
static size_t g_fail_size;
static void* soak_malloc(size_t n) {
    unsigned char* p;
    pthread_mutex_lock(&g_mem_mu);
    if (++g_calls == g_fail_call || (g_fail_size && n == g_fail_size)) {
        g_failed++;
        pthread_mutex_unlock(&g_mem_mu);
        return NULL;
    }
    pthread_mutex_unlock(&g_mem_mu);
    p = (unsigned char*)malloc(n + 16);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    pthread_mutex_lock(&g_mem_mu);
    g_live_bytes += (long long)n;
    g_live_blocks++;
    g_allocs++;
    if ((long long)n > g_max_alloc) g_max_alloc = (long long)n;
    pthread_mutex_unlock(&g_mem_mu);
    return p + 16;
}
static void soak_free(void* q) {
    unsigned char* p;
    size_t n;
    if (!q) return;
    p = (unsigned char*)q - 16;
    memcpy(&n, p, sizeof n);
    pthread_mutex_lock(&g_mem_mu);
    g_live_bytes -= (long long)n;
    g_live_blocks--;
    pthread_mutex_unlock(&g_mem_mu);
    free(p);
}
#define PP_MALLOC(sz) soak_malloc(sz)
#define PP_FREE(p) soak_free(p)
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 7
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define IN 6
#define CLASSES 5
#define NMAX 24     /* sequences per step: m .. NMAX */
#define LMAX 20     /* tokens per sequence: 1 .. LMAX */
#define MAXP 4
static const int DIMS[MLP_DEPTH + 1] = {IN, 8, 8, 8, 8, 8, 8, CLASSES};

typedef struct soak {
    int p, v, m;
    mlp_model w, g[MAXP], gref;
    float *wbuf, *gbuf[MAXP], *grefbuf;
    float x[NMAX * LMAX * IN];
    int32_t y[NMAX * LMAX];
    int32_t cu[NMAX + 1];
    pp_batch b;
    pp_action acts[512];
    pp_schedule sched;
    int first[2 * MAXP + 1];
    pp_threads* threads;
    pp_stage* st[MAXP];
    pp_result rc[MAXP];
    pp_step_stats stats[MAXP];
} soak;

static pp_result soak_rank(int rank, void* user) {
    soak* S = (soak*)user;
    S->rc[rank] = pp_stage_step(S->st[rank], &S->b, &S->stats[rank]);
    return S->rc[rank];
}

/* The batch's fixed fields: every step's make_batch fills the rest. */
static void soak_batch_init(soak* S, int m) {
    S->m = m;
    S->b.m = m;
    S->b.input.data = S->x;
    S->b.input.cols = IN;
    S->b.input.dtype = PP_F32;
    S->b.targets = S->y;
    S->b.target_row_bytes = sizeof(int32_t);
    S->b.cu_seqlens = S->cu;
}

/* Weights, one gradient set per rank and the reference's, the batch, the schedule, the
   partition and the threads; the caller makes the stages. */
static void soak_world_init(soak* S, pp_schedule_kind kind, int p, int v, int m) {
    pp_error err;
    S->p = p;
    S->v = v;
    S->wbuf = mlp_init(&S->w, &S->gref, DIMS, 7, &S->grefbuf);
    hx_mlp_rank_grads(S->g, S->gbuf, p, DIMS);
    soak_batch_init(S, m);
    CHECK(pp_schedule_make(kind, p, v, m, S->acts, 512, &S->sched, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(MLP_DEPTH + 1, p * v, S->first, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_threads_create(p, &S->threads, &err) == PP_OK, "%s", err.msg);
}

/* Zeroes every gradient and runs one pipelined step on the threads. */
static void soak_run_step(soak* S, size_t n) {
    pp_error err;
    int r;
    for (r = 0; r < S->p; r++) memset(S->gbuf[r], 0, n * sizeof(float));
    memset(S->grefbuf, 0, n * sizeof(float));
    pp_threads_run(S->p, soak_rank, S, &err);
}

/* The sequential reference's step (its loss in *loss_ref) and the ranks' gradients summed into
   sum (n floats), to compare with the reference's bit for bit. */
static void soak_reference(soak* S, const pp_model* model, float* sum, size_t n, float* loss_ref) {
    pp_error err;
    size_t i;
    int r;
    CHECK(pp_sequential_step(model, &S->w, &S->gref, &S->b, loss_ref, &err) == PP_OK, "%s", err.msg);
    memset(sum, 0, n * sizeof(float));
    for (r = 0; r < S->p; r++)
        for (i = 0; i < n; i++) sum[i] += S->gbuf[r][i];
}

/* Destroys the stages and the threads and frees the world with S itself. */
static void soak_world_free(soak* S) {
    int r;
    for (r = 0; r < S->p; r++) pp_stage_destroy(S->st[r]);
    hx_mlp_free_grads(S->gbuf, S->p);
    pp_threads_destroy(S->threads);
    free(S->wbuf);
    free(S->grefbuf);
    free(S);
}

/* Step k's batch: step 0 has the most sequences, all of the longest length. */
static void make_batch(soak* S, int k, uint64_t* rng) {
    int n = k == 0 ? NMAX : S->m + (int)(mlp_rng_next(rng) % (uint64_t)(NMAX - S->m + 1)), i;
    S->cu[0] = 0;
    for (i = 0; i < n; i++) S->cu[i + 1] = S->cu[i] + (k == 0 ? LMAX : 1 + (int)(mlp_rng_next(rng) % LMAX));
    mlp_make_data(S->x, S->y, S->cu[n], IN, CLASSES, mlp_rng_next(rng), 99);
    S->b.input.rows = S->cu[n];
    S->b.n_seqs = n;
    S->b.split = (k % 3 == 1) ? PP_SPLIT_SEQS : PP_SPLIT_TOKENS;
    S->b.loss = (k % 2) ? PP_LOSS_MEAN_ROWS : PP_LOSS_MEAN_MICROBATCH;
}

static void run_soak(pp_schedule_kind kind, int p, int v, int m, pp_shape_policy shapes, int steps) {
    soak* S = (soak*)calloc(1, sizeof *S);
    pp_error err;
    pp_model model = mlp_model_desc();
    size_t n = mlp_param_count(DIMS);
    uint64_t rng = 12345;
    long long base_bytes = 0, base_blocks = 0, max_bytes = 0, allocs0 = 0, half_bytes = 0, late_bytes = 0;
    int r, k, bad_steps = 0, first_bad = -1, last_rank, last_chunk;
    float* sum = (float*)calloc(n, sizeof(float));
    double t0 = hx_now();
    soak_world_init(S, kind, p, v, m);
    for (r = 0; r < p; r++) {
        pp_stage_desc d;
        hx_stage_desc(&d, NULL, model, &S->w, &S->g[r], &S->sched, S->first, r, pp_threads_transport(S->threads, r));
        d.shapes = shapes;
        d.timeout_s = 60;
        d.check_finite = 1;
        CHECK(pp_stage_create(&d, &S->st[r], &err) == PP_OK, "%s", err.msg);
    }
    pp_schedule_stage_to_rank(&S->sched, p * v - 1, &last_rank, &last_chunk);
    for (k = 0; k < steps; k++) {
        float loss_ref = 0;
        int ok;
        make_batch(S, k, &rng);
        soak_run_step(S, n);
        soak_reference(S, &model, sum, n, &loss_ref);
        ok = memcmp(sum, S->grefbuf, n * sizeof(float)) == 0 &&
             memcmp(&S->stats[last_rank].loss, &loss_ref, sizeof(float)) == 0 && pp_threads_pending(S->threads) == 0;
        for (r = 0; r < p; r++) ok = ok && S->rc[r] == PP_OK;
        if (!ok) {
            bad_steps++;
            if (first_bad < 0) {
                first_bad = k;
                for (r = 0; r < p; r++)
                    if (S->rc[r] != PP_OK) printf("step %d rank %d: %s\n", k, r, pp_stage_error(S->st[r]));
            }
            pp_threads_reset(S->threads);
        }
        pthread_mutex_lock(&g_mem_mu);
        if (k == 0) {
            base_bytes = g_live_bytes;
            base_blocks = g_live_blocks;
            allocs0 = g_allocs;
        }
        if (g_live_bytes > max_bytes && k > 0 && getenv("SOAK_TRACE"))
            printf("step %d: library memory %lld bytes in %lld blocks\n", k, g_live_bytes, g_live_blocks);
        if (g_live_bytes > max_bytes) max_bytes = g_live_bytes;
        if (k == steps / 2) half_bytes = max_bytes;
        if (k > steps / 2 && g_live_bytes > late_bytes) late_bytes = g_live_bytes;
        pthread_mutex_unlock(&g_mem_mu);
    }
    CHECK(bad_steps == 0, "%s p=%d v=%d %s: %d of %d steps differ from the reference (first: step %d)",
          pp_schedule_name(kind), p, v, shapes == PP_SHAPES_AUTO ? "auto" : "local", bad_steps, steps, first_bad);
    if (shapes == PP_SHAPES_LOCAL) {
        /* every block is sized from the plan, and step 1 had the largest plan: exactly flat */
        CHECK(max_bytes <= base_bytes, "library memory grew from %lld bytes after the first step to %lld", base_bytes,
              max_bytes);
    } else {
        /* AUTO's resize notices take pool blocks of the old size and a stage adds a block when
           no free one is large enough, so the pool grows ever more rarely (new highs at steps
           371 and 658 here, then 6251 and 17566 in a 30000-step run: docs/testing.md); no
           growth in the second half beyond one more block, which a leak would exceed */
        CHECK(late_bytes <= half_bytes + g_max_alloc,
              "library memory kept growing: at most %lld bytes by step %d, %lld after (largest block %lld)", half_bytes,
              steps / 2, late_bytes, g_max_alloc);
    }
    printf("soak %s p=%d v=%d m=%d shapes=%s: %d steps in %.2f s, equal to the reference; library memory %lld bytes "
           "in %lld blocks after step 1, at most %lld after; %.1f allocations per step (transient messages)\n",
           pp_schedule_name(kind), p, v, m, shapes == PP_SHAPES_AUTO ? "auto" : "local", steps, hx_now() - t0,
           base_bytes, base_blocks, max_bytes, steps > 1 ? (double)(g_allocs - allocs0) / (steps - 1) : 0.0);
    soak_world_free(S);
    free(sum);
    pthread_mutex_lock(&g_mem_mu);
    CHECK(g_live_bytes == 0 && g_live_blocks == 0, "after destroy the library still holds %lld bytes in %lld blocks",
          g_live_bytes, g_live_blocks);
    pthread_mutex_unlock(&g_mem_mu);
}

/* BROADCAST with a packed batch makes two metadata buffers at its first step (the message and
   the cu_seqlens it unpacks). One failing fails the step on every rank (PP_ERR_NOMEM where it
   failed, PP_ERR_ABORTED where another rank was first) and must leave neither: the next step is
   bit-exact and destroy frees every byte. Before, a failed cu buffer left the message buffer,
   and the next step unpacked into NULL (SEGV); a failed message buffer left the cu buffer, which
   the next step leaked. Negative control: build/soak-ctl-bc-pair (-DPP_TEST_NO_BC_PAIR), which
   crashes or leaks. */
static void test_bcast_nomem(int fail_cu) {
    enum { P = 2, M = 2, MAX_SEQS = 999 }; /* buffers of 4000 (cu) and 4088 (message) bytes */
    soak* S = (soak*)calloc(1, sizeof *S);
    pp_error err;
    pp_model model = mlp_model_desc();
    size_t n = mlp_param_count(DIMS);
    uint64_t rng = 777;
    int r, k, nomem = 0, last_rank, last_chunk;
    float* sum = (float*)calloc(n, sizeof(float));
    const char* what = fail_cu ? "cu_seqlens buffer" : "message buffer";
    soak_world_init(S, PP_SCHED_1F1B, P, 1, M);
    for (r = 0; r < P; r++) {
        pp_stage_desc d;
        hx_stage_desc(&d, NULL, model, &S->w, &S->g[r], &S->sched, S->first, r, pp_threads_transport(S->threads, r));
        d.shapes = PP_SHAPES_BROADCAST;
        d.max_seqs = MAX_SEQS;
        d.timeout_s = 20;
        CHECK(pp_stage_create(&d, &S->st[r], &err) == PP_OK, "%s", err.msg);
    }
    pp_schedule_stage_to_rank(&S->sched, P - 1, &last_rank, &last_chunk);
    for (k = 0; k < 3; k++) {
        float loss_ref = 0;
        make_batch(S, k + 1, &rng);
        g_failed = 0;
        g_fail_size = k > 0 ? 0 : fail_cu ? sizeof(int32_t) * (MAX_SEQS + 1) : 4088;
        soak_run_step(S, n);
        g_fail_size = 0;
        if (k == 0) {
            for (r = 0; r < P; r++) {
                nomem += S->rc[r] == PP_ERR_NOMEM && strstr(pp_stage_error(S->st[r]), "broadcast buffer") != NULL;
                CHECK(S->rc[r] == PP_ERR_NOMEM || S->rc[r] == PP_ERR_ABORTED, "%s failed: rank %d: %s", what, r,
                      pp_stage_error(S->st[r]));
            }
            CHECK(g_failed > 0 && nomem > 0, "%s failed %lld times; %d ranks name it: %s | %s", what, g_failed, nomem,
                  pp_stage_error(S->st[0]), pp_stage_error(S->st[1]));
            pp_threads_reset(S->threads);
            continue;
        }
        soak_reference(S, &model, sum, n, &loss_ref);
        CHECK(S->rc[0] == PP_OK && S->rc[1] == PP_OK, "step %d after the %s failed: %s | %s", k, what,
              pp_stage_error(S->st[0]), pp_stage_error(S->st[1]));
        CHECK(memcmp(sum, S->grefbuf, n * sizeof(float)) == 0 && memcmp(&S->stats[last_rank].loss, &loss_ref, sizeof(float)) == 0,
              "step %d after the %s failed: gradients or loss differ from the reference", k, what);
    }
    soak_world_free(S);
    free(sum);
    pthread_mutex_lock(&g_mem_mu);
    CHECK(g_live_bytes == 0 && g_live_blocks == 0, "%s failed: after destroy the library still holds %lld bytes in %lld blocks",
          what, g_live_bytes, g_live_blocks);
    pthread_mutex_unlock(&g_mem_mu);
}

/* pp_pipeline_step whose threads cannot be made (the step's first allocation fails): the code's
   name once in the message, and no rank's result says PP_OK (none ran); the next step runs. */
static void test_pipeline_nomem(void) {
    soak* S = (soak*)calloc(1, sizeof *S);
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    uint64_t rng = 99;
    int r, bad = 0;
    S->wbuf = mlp_init(&S->w, &S->g[0], DIMS, 7, &S->gbuf[0]);
    soak_batch_init(S, 4);
    make_batch(S, 1, &rng);
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &S->w;
    d.grads = &S->g[0];
    d.schedule = PP_SCHED_1F1B;
    d.p = 4;
    d.m = 4;
    d.stage.timeout_s = 20;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    pthread_mutex_lock(&g_mem_mu);
    g_fail_call = g_calls + 1;
    pthread_mutex_unlock(&g_mem_mu);
    CHECK(pp_pipeline_step(pl, &S->b, &st) == PP_ERR_NOMEM, "threads not made: %s", pp_pipeline_error(pl));
    g_fail_call = 0;
    CHECK(strcmp(pp_pipeline_error(pl), "out of memory: threads for 4 ranks") == 0, "threads not made: %s",
          pp_pipeline_error(pl));
    for (r = 0; r < 4; r++) bad += pp_pipeline_rank_result(pl, r, NULL) != PP_ERR_NOMEM;
    CHECK(bad == 0, "threads not made: %d ranks' results are not PP_ERR_NOMEM (rank 0: %s)", bad,
          pp_result_str(pp_pipeline_rank_result(pl, 0, NULL)));
    CHECK(pp_pipeline_step(pl, &S->b, &st) == PP_OK, "the step after: %s", pp_pipeline_error(pl));
    for (r = 0; r < 4; r++) CHECK(pp_pipeline_rank_result(pl, r, NULL) == PP_OK, "the step after: rank %d", r);
    /* a refused step ran no rank either */
    S->b.m = 3;
    CHECK(pp_pipeline_step(pl, &S->b, &st) == PP_ERR_INVALID && pp_pipeline_rank_result(pl, 2, NULL) == PP_ERR_INVALID,
          "refused step: %s, rank 2 %s", pp_pipeline_error(pl), pp_result_str(pp_pipeline_rank_result(pl, 2, NULL)));
    pp_pipeline_destroy(pl);
    free(S->wbuf);
    free(S->gbuf[0]);
    free(S);
}

int main(int argc, char** argv) {
    int steps = getenv("PP_QUICK") ? 100 : 400, i; /* make quick sets PP_QUICK */
    /* the controls' parts: nomem (both buffers, the cu buffer first), nomem-msg (the message buffer) */
    if (argc < 2 || strcmp(argv[1], "nomem-msg")) test_bcast_nomem(1);
    test_bcast_nomem(0);
    test_pipeline_nomem();
    if (argc > 1 && !strncmp(argv[1], "nomem", 5)) return TEST_DONE("soak (failed allocations)");
    for (i = 1; i < argc; i++)
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    if (steps < 2) steps = 2;
    run_soak(PP_SCHED_1F1B, 3, 1, 4, PP_SHAPES_LOCAL, steps);
    run_soak(PP_SCHED_INTERLEAVED, 2, 2, 5, PP_SHAPES_AUTO, steps / 2);
    return TEST_DONE("soak");
}
