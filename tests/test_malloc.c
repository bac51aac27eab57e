/* tests/test_malloc.c - PP_MALLOC fails at its k-th call, for every k, over create and a step.

   For each schedule kind (1F1B, interleaved, ZB-V, V-Min, DualPipeV) and each shape policy
   (LOCAL, BROADCAST, PER_MESSAGE, AUTO), over a packed batch (cu_seqlens), one pipeline
   (pp_pipeline, four ranks on threads) is created and stepped with the k-th allocation failing,
   for k = 1, 2, ... until create and the step both succeed with the failure armed (the k-th
   call never came). Each k must give:
   - no crash, and no leak: every allocation is freed once the pipeline is destroyed (counted
     here; the asan build's leak checker sees the rest);
   - no deadline wait: the failed step returns within a few seconds (the deadline is 30 s);
   - one outcome: PP_OK on every rank or a failure on every rank (pp_pipeline_rank_result);
   - the next step (allocations working again) bit-exact: loss and gradients equal the
     sequential reference's.
   The sweep is a rotation (tests/test.h's test_pick): a run takes every k with k % R equal to
   PP_TEST_SEED % R, R = 8 in the plain builds, 32 under the sanitizers and 64 in make quick, so every k of every
   kind and policy runs within R consecutive seeds; PP_TEST_FULL=1 takes every k (make test-full).
   `plant` shows it: an allocation failure that leaks, planted at one k, is found by exactly one
   of R consecutive seeds. `test_malloc KIND POLICY K` runs one case (indices into the lists in
   main). Negative control (build/malloc-controls): the library
   without the step's identity from rank 0 and without the agreement's abort
   (-DPP_TEST_NO_GO -DPP_TEST_NO_AGREE_ABORT) splits the ranks after a failed allocation in the
   agreement, and `test_malloc control` fails. */
#define _POSIX_C_SOURCE 200809L /* setenv (plant), before the C library's headers */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_calls, g_fail_at, g_live, g_plant; /* g_plant: the k whose failure leaks (plant) */
static int g_armed, g_fired;

static void* tm_malloc(size_t n) {
    unsigned char* p;
    int fail;
    pthread_mutex_lock(&g_mu);
    fail = g_armed && ++g_calls == g_fail_at;
    if (fail) g_fired = 1;
    if (fail && g_fail_at == g_plant) g_live++; /* the planted bug: the failure at this k "leaks" */
    pthread_mutex_unlock(&g_mu);
    if (fail) return NULL;
    p = (unsigned char*)malloc(n + 16);
    if (!p) return NULL;
    pthread_mutex_lock(&g_mu);
    g_live++;
    pthread_mutex_unlock(&g_mu);
    return p + 16;
}
static void tm_free(void* q) {
    if (!q) return;
    pthread_mutex_lock(&g_mu);
    g_live--;
    pthread_mutex_unlock(&g_mu);
    free((unsigned char*)q - 16);
}
#define PP_MALLOC(sz) tm_malloc(sz)
#define PP_FREE(p) tm_free(p)
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define P 4
#define M 8
#define NSEQ 13
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

static mlp_model W, G, GREF;
static mlpz_model WZ, GZ;
static float *WBUF, *GBUF, *GREFBUF;
static size_t NPAR;
static float X[64 * HX_IN];
static int32_t Y[64];
static int32_t CU[NSEQ + 1];
static pp_batch B;
static float LREF;

static void arm(long k) {
    pthread_mutex_lock(&g_mu);
    g_calls = 0;
    g_fail_at = k;
    g_fired = 0;
    g_armed = 1;
    pthread_mutex_unlock(&g_mu);
}
static int disarm(void) {
    int fired;
    pthread_mutex_lock(&g_mu);
    g_armed = 0;
    fired = g_fired;
    pthread_mutex_unlock(&g_mu);
    return fired;
}
static long live(void) {
    long n;
    pthread_mutex_lock(&g_mu);
    n = g_live;
    pthread_mutex_unlock(&g_mu);
    return n;
}

static double g_timeout = 30; /* the deadline of every wait ("control": 2 s) */

static int grads_exact(void) { return memcmp(GBUF, GREFBUF, NPAR * sizeof(float)) == 0; }

/* One k: 1 when create and the step both ran with the k-th call never failing (the sweep ends). */
static int one(pp_schedule_kind kind, pp_shape_policy shapes, long k, const char* what) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    pp_result rc;
    long before = live();
    double t0;
    int r, fired, n_ok = 0;
    memset(&d, 0, sizeof d);
    d.model = mlpz_model_desc();
    d.weights = &WZ;
    d.grads = &GZ;
    d.schedule = kind;
    d.p = P;
    d.m = M;
    d.stage.timeout_s = g_timeout;
    d.stage.shapes = shapes;
    d.stage.max_seqs = NSEQ;
    memset(GBUF, 0, NPAR * sizeof(float));
    arm(k);
    rc = pp_pipeline_create(&d, &pl, &err);
    if (rc != PP_OK) {
        fired = disarm();
        CHECK(fired && pl == NULL, "%s k=%ld: create failed without the failure: %s", what, k, err.msg);
        CHECK(live() == before, "%s k=%ld: create failed and left %ld allocations", what, k, live() - before);
        return 0;
    }
    t0 = hx_now();
    rc = pp_pipeline_step(pl, &B, &st);
    fired = disarm();
    CHECK(hx_now() - t0 < g_timeout / 6, "%s k=%ld: the step took %.1f s (a deadline wait)", what, k, hx_now() - t0);
    for (r = 0; r < P; r++) n_ok += pp_pipeline_rank_result(pl, r, NULL) == PP_OK;
    CHECK(n_ok == 0 || n_ok == P, "%s k=%ld: %d of %d ranks returned PP_OK (step: %s)", what, k, n_ok, P,
          pp_pipeline_error(pl));
    CHECK(rc == PP_OK || fired, "%s k=%ld: the step failed without the failure: %s", what, k, pp_pipeline_error(pl));
    CHECK(rc != PP_OK || n_ok == P, "%s k=%ld: the step returned PP_OK, a rank did not", what, k);
    CHECK(rc == PP_OK || n_ok == 0, "%s k=%ld: the step failed (%s), %d ranks say PP_OK", what, k, pp_pipeline_error(pl), n_ok);
    if (rc == PP_OK) CHECK(memcmp(&st.loss, &LREF, sizeof LREF) == 0 && grads_exact(), "%s k=%ld: an OK step is not exact", what, k);
    /* the next step, allocations working */
    memset(GBUF, 0, NPAR * sizeof(float));
    rc = pp_pipeline_step(pl, &B, &st);
    CHECK(rc == PP_OK, "%s k=%ld: the step after: %s", what, k, pp_pipeline_error(pl));
    if (rc == PP_OK)
        CHECK(memcmp(&st.loss, &LREF, sizeof LREF) == 0 && grads_exact(), "%s k=%ld: the step after is not exact (loss %.9g, reference %.9g, step 0 %s: %s)", what, k, (double)st.loss, (double)LREF, fired ? "failed" : "ok", "");
    pp_pipeline_destroy(pl);
    CHECK(live() == before, "%s k=%ld: %ld allocations left after destroy", what, k, live() - before);
    return !fired;
}

/* The k of a sweep that this run takes: every R-th, from the seed (all of them with R = 1). */
static void sweep(pp_schedule_kind kind, pp_shape_policy shapes, long R, int say) {
    char what[96];
    long k, n = 0;
    int fails = _t_fail;
    static const char* const pol_name[] = {"local", "broadcast", "per_message", "auto"};
    snprintf(what, sizeof what, "%s %s", pp_schedule_name(kind), pol_name[shapes]);
    for (k = 1; k < 100000; k++) {
        if (!test_pick(k, R)) continue;
        n++;
        if (one(kind, shapes, k, what)) break;
        if (_t_fail - fails > 3) break; /* one broken k is enough to read */
    }
    if (say) printf("  %-28s %ld values of k (to %ld)\n", what, n, k);
}

/* The rotation finds a fault at any one k: a leak planted at k = K (from the seed) is found by
   exactly one of R consecutive seeds, the one whose residue is K's. */
static void plant(long R) {
    char seed[32];
    unsigned long s0 = test_seed(), s;
    long K = 1 + (long)(s0 % 40), found_by = -1, n_found = 0; /* the 1F1B sweep has more than 40 k */
    int fail0 = _t_fail, pass0 = _t_pass, f;
    g_plant = K;
    printf("  plant: a leak planted at k = %ld (the FAIL lines that follow are meant)\n", K);
    for (s = s0; s < s0 + (unsigned long)R; s++) {
        snprintf(seed, sizeof seed, "%lu", s);
        setenv("PP_TEST_SEED", seed, 1);
        f = _t_fail;
        sweep(PP_SCHED_1F1B, PP_SHAPES_LOCAL, R, 0);
        if (_t_fail > f) n_found++, found_by = (long)s;
    }
    snprintf(seed, sizeof seed, "%lu", s0);
    setenv("PP_TEST_SEED", seed, 1);
    g_plant = 0;
    _t_fail = fail0; /* the planted leak's failures were meant */
    _t_pass = pass0;
    CHECK(n_found == 1 && found_by % R == K % R, "a leak planted at k = %ld: found by %ld of seeds %lu..%lu (last %ld)",
          K, n_found, s0, s0 + (unsigned long)R - 1, found_by);
    printf("  plant: a leak at k = %ld found by seed %ld alone of the %ld seeds from %lu\n", K, found_by, R, s0);
}

int main(int argc, char** argv) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_ZB_V, PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V};
    static const pp_shape_policy pols[] = {PP_SHAPES_LOCAL, PP_SHAPES_BROADCAST, PP_SHAPES_PER_MESSAGE, PP_SHAPES_AUTO};
    pp_model model = mlp_model_desc();
    pp_error err;
    int i, j, rows = 0;
    long R = test_full() ? 1 : getenv("PP_QUICK") ? 64 : TEST_SANITIZED || TEST_SECOND ? 32 : 8; /* make quick: 1 in 64, no plant */
    setvbuf(stdout, NULL, _IOLBF, 0);
    WBUF = mlp_init(&W, &G, DIMS, 5, &GBUF);
    {
        mlp_model tmp;
        GREF = W;
        free(mlp_init(&tmp, &GREF, DIMS, 5, &GREFBUF));
    }
    NPAR = mlp_param_count(DIMS);
    mlpz_from_mlp(&WZ, &W);
    mlpz_from_mlp(&GZ, &G);
    CU[0] = 0;
    for (i = 0; i < NSEQ; i++) CU[i + 1] = rows += 1 + (i * 5) % 7;
    mlp_make_data(X, Y, rows, HX_IN, HX_CLASSES, 9, 4);
    hx_packed_batch(&B, X, Y, CU, NSEQ, HX_IN, M, PP_SPLIT_TOKENS);
    memset(GREFBUF, 0, NPAR * sizeof(float));
    CHECK(pp_sequential_step(&model, &W, &GREF, &B, &LREF, &err) == PP_OK, "%s", err.msg);
    if (argc == 4) { /* one case: kind index, policy index, k */
        one(kinds[atoi(argv[1])], pols[atoi(argv[2])], atol(argv[3]), "one");
    } else if (argc == 2 && !strcmp(argv[1], "control")) { /* what the negative control runs */
        g_timeout = 2;
        sweep(PP_SCHED_1F1B, PP_SHAPES_LOCAL, 1, 1);
    } else if (argc == 2 && !strcmp(argv[1], "plant")) {
        plant(8);
    } else {
        printf("test_malloc: every %ld-th k from PP_TEST_SEED=%lu%s\n", R, test_seed(), R == 1 ? " (all)" : "");
        for (i = 0; i < (int)(sizeof kinds / sizeof *kinds); i++)
            for (j = 0; j < 4; j++) sweep(kinds[i], pols[j], R, 1);
        if (!TEST_SANITIZED && !TEST_SECOND && !getenv("PP_QUICK") && R > 1) plant(R);
    }
    free(WBUF);
    free(GBUF);
    free(GREFBUF);
    return TEST_DONE("test_malloc");
}
