/* tests/test_devops.c - the stage's device-ops path (pp_stage_desc.device) on the host.

   Host hooks that count their calls stand in for GPU memory: the pipelined gradients must still
   equal the sequential reference bit for bit, blocks must be allocated only in the pool's warm-up
   (_PP_POOL_WARM_STEPS; the pool is reused after that), every block freed at destroy, the peak stash per rank must
   equal the simulator's peak, and mark() must bracket every action. A transport wrapper poisons
   every receive buffer before the receive is posted and checks, when the wait returns, that every
   byte was written (the same check tests/test_cuda.cu runs on the GPU). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "test_link.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define ROWS 41
#define NSEQ 9
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
static const int32_t CU[NSEQ + 1] = {0, 2, 9, 10, 17, 19, 27, 28, 36, 41}; /* packed, uneven lengths */

/* Host hooks with counters. Fresh blocks are filled with 0xFF bytes (a NaN pattern) so that a
   read of a byte nobody wrote shows up in the gradients. */
typedef struct hooks {
    int allocs, frees, zeros, marks_open, marks_close, bad_marks;
    size_t bytes;
} hooks;

static void* h_alloc(void* user, size_t bytes) {
    hooks* h = (hooks*)user;
    void* p = malloc(bytes);
    if (p) memset(p, 0xFF, bytes);
    h->allocs++;
    h->bytes += bytes;
    return p;
}
static void h_free(void* user, void* ptr) {
    ((hooks*)user)->frees++;
    free(ptr);
}
static pp_result h_zero(void* user, void* ptr, size_t bytes) {
    ((hooks*)user)->zeros++;
    memset(ptr, 0, bytes);
    return PP_OK;
}
static void h_mark(void* user, const pp_action* a, int idx, int phase) {
    hooks* h = (hooks*)user;
    (void)a;
    if (idx < 0 || (phase == 1 && h->marks_open != h->marks_close + 1) || (phase == 0 && h->marks_open != h->marks_close))
        h->bad_marks++;
    if (phase == 0) h->marks_open++;
    else h->marks_close++;
}

/* What each rank's hooks and poisoning transport saw. */
typedef struct devops {
    int use_hooks;
    hooks h[PP_MAX_RANKS];
    hx_poison pz[PP_MAX_RANKS];
    int allocs_after_first[PP_MAX_RANKS];
} devops;

static void devops_setup(hx_world* W, int rank, pp_stage_desc* d) {
    devops* D = (devops*)W->user;
    d->transport = hx_poison_transport(&D->pz[rank], d->transport);
    if (D->use_hooks) {
        d->device.alloc = h_alloc;
        d->device.free = h_free;
        d->device.zero = h_zero;
        d->device.mark = h_mark;
        d->device.user = &D->h[rank];
    }
}

static void devops_after_step(hx_world* W, int rank, int step, const pp_step_stats* s) {
    devops* D = (devops*)W->user;
    (void)s;
    if (step < _PP_POOL_WARM_STEPS) D->allocs_after_first[rank] = D->h[rank].allocs; /* the pool's warm-up */
}

static void run_case(pp_schedule_kind kind, int p, int v, int m, int use_hooks, const mlp_model* w,
                     const mlp_model* gref, const pp_batch* batch, int steps) {
    static hx_world W;
    static devops D;
    mlp_model g[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    hx_sched sc;
    pp_error err;
    int r, first[32], ok = 1;
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s", pp_schedule_name(kind), p, v, m,
             use_hooks ? "host hooks" : "no hooks");
    if (hx_sched_simulate(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule", where);
        hx_sched_free(&sc);
        return;
    }
    pp_partition_uniform(MLP_DEPTH + 1, p * v, first, &err);
    hx_mlp_world(&W, w, &sc.s, first, batch, steps, g, gbuf, DIMS);
    memset(&D, 0, sizeof D);
    D.use_hooks = use_hooks;
    W.setup = devops_setup;
    W.after_step = devops_after_step;
    W.user = &D;
    if (hx_run(&W, p, &err) != PP_OK) {
        hx_report(&W, p, where);
        ok = 0;
    }
    ok = ok && hx_mlp_grads_match(g, p, &sc.s, first, gref, 0, where);
    for (r = 0; ok && r < p; r++) {
        hooks* h = &D.h[r];
        hx_check_peak_poison(&sc, kind, r, W.stats[r].peak_live, &D.pz[r], where);
        if (!use_hooks) {
            CHECK(h->allocs == 0 && h->marks_open == 0, "%s: hooks called though none were set", where);
            continue;
        }
        CHECK(h->allocs > 0, "%s: rank %d allocated nothing through the hooks", where, r);
        CHECK(h->allocs == D.allocs_after_first[r], "%s: rank %d allocated %d blocks after the pool's warm-up (%d then %d)",
              where, r, h->allocs - D.allocs_after_first[r], D.allocs_after_first[r], h->allocs);
        CHECK(h->frees == h->allocs, "%s: rank %d freed %d of %d blocks", where, r, h->frees, h->allocs);
        CHECK(h->zeros == m * v * steps, "%s: rank %d zeroed %d workspaces, expected %d", where, r, h->zeros, m * v * steps);
        CHECK(h->marks_open == sc.s.per_rank * steps && h->marks_close == h->marks_open && h->bad_marks == 0,
              "%s: rank %d marks %d/%d (bad %d), expected %d", where, r, h->marks_open, h->marks_close, h->bad_marks,
              sc.s.per_rank * steps);
    }
    hx_mlp_free_grads(gbuf, p);
    hx_sched_free(&sc);
    CHECK(ok, "%s", where);
}

static void test_equal_and_pooled(void) {
    hx_mlp f;
    pp_batch b;
    pp_error err;
    static const int ms[] = {4, 8};
    int mi, kind, p, steps = _PP_POOL_WARM_STEPS + 2;
    hx_mlp_init(&f, DIMS, 11, ROWS, 3, 4);
    for (mi = 0; mi < 2; mi++) {
        hx_packed_batch(&b, f.x, f.y, CU, NSEQ, HX_IN, ms[mi], PP_SPLIT_TOKENS);
        CHECK(hx_mlp_reference(&f, &b, steps, &err) == PP_OK, "%s", err.msg);
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (p = 1; p <= 4; p *= 2) {
                int v = pp_schedule_size((pp_schedule_kind)kind, p, 1, b.m) ? 1 : 2; /* the kind's own v */
                run_case((pp_schedule_kind)kind, p, v, b.m, 1, &f.w, &f.gref, &b, steps);
                if (p == 2) run_case((pp_schedule_kind)kind, p, v, b.m, 0, &f.w, &f.gref, &b, steps);
            }
    }
    hx_mlp_free(&f);
}

static void test_validation(void) {
    mlp_model w, g;
    float *wbuf, *gbuf;
    pp_action acts[64];
    pp_schedule sched;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    hooks h;
    int first[3];
    pp_threads* th = NULL;
    memset(&w, 0, sizeof w);
    memset(&h, 0, sizeof h);
    wbuf = mlp_init(&w, &g, DIMS, 1, &gbuf);
    pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 64, &sched, &err);
    pp_threads_create(2, &th, &err);
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &w;
    d.grads = &g;
    d.schedule = &sched;
    pp_partition_uniform(d.model.n_layers, 2, first, &err);
    d.partition = first;
    d.transport = pp_threads_transport(th, 0);
    d.device.alloc = h_alloc;
    d.device.user = &h;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_INVALID && st == NULL, "alloc without free/zero accepted");
    CHECK(strstr(err.msg, "alloc, free and zero") != NULL, "message: %s", err.msg);
    d.device.free = h_free;
    d.device.zero = h_zero;
    d.shapes = PP_SHAPES_AUTO;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_UNSUPPORTED && st == NULL, "AUTO with device blocks accepted");
    CHECK(strstr(err.msg, "AUTO") != NULL, "message: %s", err.msg);
    d.shapes = PP_SHAPES_PER_MESSAGE;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_UNSUPPORTED && st == NULL, "PER_MESSAGE with device blocks accepted");
    d.shapes = PP_SHAPES_BROADCAST;
    CHECK(pp_stage_create(&d, &st, &err) == PP_OK && st != NULL, "BROADCAST with device blocks refused: %s", err.msg);
    pp_stage_destroy(st);
    CHECK(h.allocs == 0 && h.frees == 0, "create/destroy without a step allocated %d blocks", h.allocs);
    pp_threads_destroy(th);
    free(wbuf);
    free(gbuf);
}

/* The poison check itself can fail: a buffer with one unwritten word is caught. */
static void test_poison_check_fires(void) {
    unsigned char buf[64];
    memset(buf, 0, sizeof buf);
    CHECK(!hx_still_poisoned(buf, sizeof buf), "clean buffer reported poisoned");
    memset(buf + 40, 0xFF, 4);
    CHECK(hx_still_poisoned(buf, sizeof buf), "poisoned word missed");
}

int main(void) {
    test_poison_check_fires();
    test_validation();
    test_equal_and_pooled();
    return TEST_DONE("devops");
}
