/* tests/test_nvtx.c - pipeline_cuda.h's NVTX ranges (PP_NVTX) over the CUDA imitation and its
   NVTX stand-in (tests/fakecuda/nvtx3/nvToolsExt.h), without a GPU.

   Checked, for 1F1B p = 2 and interleaved p = 2 v = 2: every action of every rank's list pushes
   one range per step, named like the timeline plus the stage ("F3.1 s2"), coloured by kind;
   every range is popped on the thread that pushed it; a step whose layer fails leaves at most
   one range per rank open (closed when its thread ends), pops nothing it did not push, and the
   next step is balanced again. Built without PP_NVTX (build/nvtx-off) it must push nothing. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"
#include "fakecuda/layer_kernels.h"
#include "fakecuda/nvtx3/nvToolsExt.h" /* the counters (pipeline_cuda.h includes it under PP_NVTX) */

#define ROWS 24
static hx_mlp F;                    /* the MLP's weights, a gradient struct (gref) and the data */
static volatile int g_fail_layer = -1;

static int a_fwd(const void* w, int l, pp_layer_io* io) {
    if (l == g_fail_layer && io->mb->index == 1) return 7;
    return lk_fwd(w, l, io);
}

/* steps of `kind` on p ranks; returns how many ranges each step should push, 0 on a failure */
static int run(pp_schedule_kind kind, int p, int v, int steps, pp_pipeline** keep) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_batch b;
    pp_error err;
    int s, ok = 1;
    memset(&d, 0, sizeof d);
    d.model = layer_kernels_model(mlp_model_desc());
    d.model.forward = a_fwd;
    d.weights = &F.w;
    d.grads = &F.gref;
    d.schedule = kind;
    d.p = p;
    d.v = v;
    d.m = 4;
    d.stage.timeout_s = 20;
    hx_dense_batch(&b, F.x, F.y, ROWS, HX_IN, 0);
    if (pp_cuda_pipeline_create(&d, NULL, &pl, &err) != PP_OK) {
        CHECK(0, "%s p=%d: %s", pp_schedule_name(kind), p, err.msg);
        return 0;
    }
    for (s = 0; s < steps && ok; s++) {
        ok = pp_pipeline_step(pl, &b, NULL) == PP_OK;
        CHECK(ok, "%s p=%d step %d: %s", pp_schedule_name(kind), p, s, pp_pipeline_error(pl));
    }
    s = ok ? pp_pipeline_schedule(pl)->per_rank * p : 0;
    if (keep) *keep = pl;
    else pp_pipeline_destroy(pl);
    return s;
}

#ifdef PP_NVTX
static int cmp_str(const void* a, const void* b) { return strcmp((const char*)a, (const char*)b); }

/* the names the schedule's actions should give, sorted, `steps` times over */
static char (*expected(const pp_schedule* sc, int steps, int* n))[48] {
    int total = sc->per_rank * sc->p, i, s;
    char(*names)[48] = (char(*)[48])calloc((size_t)(total * steps), 48);
    if (!names) return NULL;
    for (s = 0; s < steps; s++)
        for (i = 0; i < total; i++) {
            const pp_action* a = &sc->actions[i];
            snprintf(names[s * total + i], 48, "%c%d.%d s%d", "FBW"[a->op], (int)a->mb, (int)a->chunk, (int)a->stage);
        }
    *n = total * steps;
    qsort(names, (size_t)*n, 48, cmp_str);
    return names;
}

static void test_names(pp_schedule_kind kind, int p, int v) {
    pp_pipeline* pl = NULL;
    int steps = 2, per_step, n = 0, i, pushes, pops, bad, left, same = 1, colours = 1;
    char(*want)[48];
    char(*got)[48];
    fakenvtx_clear();
    per_step = run(kind, p, v, steps, &pl);
    if (!per_step) {
        pp_pipeline_destroy(pl);
        return;
    }
    fakenvtx_counts(&pushes, &pops, &bad, &left);
    CHECK(pushes == per_step * steps && pops == pushes && bad == 0 && left == 0,
          "%s p=%d: %d ranges pushed (want %d), %d popped, %d bad pops, %d left open", pp_schedule_name(kind), p, pushes,
          per_step * steps, pops, bad, left);
    want = expected(pp_pipeline_schedule(pl), steps, &n);
    got = (char(*)[48])calloc((size_t)(n > 0 ? n : 1), 48);
    for (i = 0; want && got && i < n; i++) {
        uint32_t color = 0;
        const char* name = fakenvtx_log(i, &color);
        if (!name) break;
        memcpy(got[i], name, strlen(name) < 47 ? strlen(name) + 1 : 47);
        if (color != (name[0] == 'F' ? 0xff3d7ed6u : name[0] == 'B' ? 0xff3fa34du : 0xffe0892bu)) colours = 0;
    }
    if (want && got) {
        qsort(got, (size_t)n, 48, cmp_str);
        for (i = 0; i < n && same; i++)
            if (strcmp(want[i], got[i])) {
                same = 0;
                CHECK(0, "%s p=%d: ranges differ from the schedule's actions: \"%s\" where \"%s\"", pp_schedule_name(kind), p,
                      got[i], want[i]);
            }
        CHECK(same, "%s p=%d: every action named \"F3.1 s2\"-style, once per step", pp_schedule_name(kind), p);
        CHECK(colours, "%s p=%d: F, B, W coloured by kind", pp_schedule_name(kind), p);
    }
    if (want && n > 0) printf("nvtx: %s p=%d v=%d: %d ranges per step, e.g. \"%s\" .. \"%s\"\n", pp_schedule_name(kind), p, v,
                              per_step, want[0], want[n - 1]);
    free(want);
    free(got);
    pp_pipeline_destroy(pl);
}

static void test_failure(void) {
    pp_pipeline* pl = NULL;
    pp_batch b;
    int pushes, pops, bad, left;
    hx_dense_batch(&b, F.x, F.y, ROWS, HX_IN, 0);
    if (!run(PP_SCHED_1F1B, 2, 1, 1, &pl)) {
        pp_pipeline_destroy(pl);
        return;
    }
    fakenvtx_clear();
    g_fail_layer = 3;
    CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_LAYER, "the failing layer fails the step: %s", pp_pipeline_error(pl));
    g_fail_layer = -1;
    fakenvtx_counts(&pushes, &pops, &bad, &left);
    CHECK(bad == 0 && pushes == pops + left && left <= 2, "failed step: %d pushed, %d popped, %d bad pops, %d left open", pushes,
          pops, bad, left);
    fakenvtx_clear();
    CHECK(pp_pipeline_step(pl, &b, NULL) == PP_OK, "the step after: %s", pp_pipeline_error(pl));
    fakenvtx_counts(&pushes, &pops, &bad, &left);
    CHECK(pushes == pp_pipeline_schedule(pl)->per_rank * 2 && pops == pushes && bad == 0 && left == 0,
          "the step after a failure: %d pushed, %d popped, %d bad pops, %d left open", pushes, pops, bad, left);
    pp_pipeline_destroy(pl);
}
#endif

int main(void) {
    static const int dims[MLP_DEPTH + 1] = HX_DIMS;
    if (!hx_mlp_init(&F, dims, 5, ROWS, 3, 4)) return 2;
#ifdef PP_NVTX
    test_names(PP_SCHED_1F1B, 2, 1);
    test_names(PP_SCHED_INTERLEAVED, 2, 2);
    test_failure();
#else
    {
        int pushes, pops, bad, left;
        CHECK(run(PP_SCHED_1F1B, 2, 1, 2, NULL) > 0, "steps without PP_NVTX");
        fakenvtx_counts(&pushes, &pops, &bad, &left);
        CHECK(pushes == 0 && pops == 0 && bad == 0, "without PP_NVTX: %d ranges pushed, %d popped", pushes, pops);
    }
#endif
    hx_mlp_free(&F);
    return TEST_DONE("nvtx");
}
