/* tests/test_convenience.c - the one-process layer (pp_pipeline) over threads.

   Checked: every schedule, p = 1..4, one shared gradient struct and one per rank, uniform /
   cost / explicit partitions and a parsed custom schedule all give the sequential reference's
   gradients and loss bit for bit, step after step; the zero desc's defaults (p 1, GPipe, v from
   the kind, m = 4p); bad descs and batches are refused with messages that say what and which
   rank; a layer failing on one rank fails the step on every rank, names that rank, and the next
   step is right again; rank_setup wraps a rank's transport (counting, and a failing send);
   merged and per-rank stats, timelines, and an empty threads world after each step. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <string.h>

#define ROWS 37
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

static float X[ROWS * HX_IN];
static int32_t Y[ROWS];
static mlp_model W, GREF;
static float *WBUF, *GREFBUF;
static size_t NPAR;

static pp_batch batch(int m) {
    pp_batch b;
    hx_dense_batch(&b, X, Y, ROWS, HX_IN, m);
    return b;
}

/* The reference: `steps` sequential steps of m micro-batches (gradients accumulate). */
static float reference(int m, int steps) {
    pp_model model = mlp_model_desc();
    pp_batch b = batch(m);
    pp_error err;
    float loss = 0;
    int i;
    memset(GREFBUF, 0, NPAR * sizeof(float));
    for (i = 0; i < steps; i++) CHECK(pp_sequential_step(&model, &W, &GREF, &b, &loss, &err) == PP_OK, "%s", err.msg);
    return loss;
}

/* Gradients: one struct shared by all ranks, or one per rank, summed for the comparison. */
typedef struct grads {
    mlp_model g[PP_MAX_RANKS];
    float* buf[PP_MAX_RANKS];
    void* ptr[PP_MAX_RANKS];
    int n;
} grads;

static void grads_make(grads* G, int n) {
    int r;
    G->n = n;
    for (r = 0; r < n; r++) {
        mlp_model tmp;
        G->g[r] = W;
        free(mlp_init(&tmp, &G->g[r], DIMS, 1, &G->buf[r]));
        G->ptr[r] = &G->g[r];
    }
}
static void grads_free(grads* G) {
    int r;
    for (r = 0; r < G->n; r++) free(G->buf[r]);
}
/* 1 when the ranks' gradients add up to the reference's, bit for bit (a rank's layers are only
   its own: the others' stay zero, so the sum is exact). */
static int grads_equal(const grads* G) {
    size_t i;
    int r;
    for (i = 0; i < NPAR; i++) {
        float s = 0;
        for (r = 0; r < G->n; r++) s += G->buf[r][i];
        if (memcmp(&s, &GREFBUF[i], sizeof s) != 0) return 0;
    }
    return 1;
}

static pp_pipeline_desc desc(pp_schedule_kind kind, int p, int m) {
    pp_pipeline_desc d;
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &W;
    d.schedule = kind;
    d.p = p;
    d.m = m;
    d.stage.timeout_s = 20;
    return d;
}

/* Runs `steps` steps; 1 when loss and gradients equal the reference's. */
static int run(pp_pipeline_desc d, int per_rank, int steps, float lref, const char* what) {
    grads G;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    pp_batch b;
    int i, ok = 1, p;
    grads_make(&G, per_rank ? (d.p ? d.p : 1) : 1);
    if (per_rank) d.rank_grads = G.ptr;
    else d.grads = G.ptr[0];
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s: %s", what, err.msg);
        grads_free(&G);
        return 0;
    }
    p = pp_pipeline_schedule(pl)->p;
    b = batch(0); /* the pipeline's m */
    for (i = 0; i < steps && ok; i++) {
        ok = pp_pipeline_step(pl, &b, &st) == PP_OK;
        CHECK(ok, "%s: step %d: %s", what, i, pp_pipeline_error(pl));
    }
    if (ok) {
        CHECK(st.has_loss && memcmp(&st.loss, &lref, sizeof lref) == 0, "%s: loss %.9g, reference %.9g", what, (double)st.loss,
              (double)lref);
        ok = grads_equal(&G);
        CHECK(ok, "%s: gradients differ from the reference", what);
        CHECK(pp_threads_pending(pp_pipeline_threads(pl)) == 0, "%s: messages left in the threads world", what);
        CHECK(st.n_actions == p * pp_pipeline_schedule(pl)->per_rank, "%s: %d actions", what, st.n_actions);
    }
    pp_pipeline_destroy(pl);
    grads_free(&G);
    return ok;
}

static void test_equal(void) {
    const int m = 6, steps = 2;
    float lref = reference(m, steps);
    char what[128];
    int kind, p, per_rank, policy;
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p++)
            for (per_rank = 0; per_rank < 2; per_rank++) {
                pp_pipeline_desc d = desc((pp_schedule_kind)kind, p, m);
                snprintf(what, sizeof what, "%s p=%d %s grads", pp_schedule_name((pp_schedule_kind)kind), p,
                         per_rank ? "per-rank" : "shared");
                run(d, per_rank, steps, lref, what);
            }
    for (policy = PP_PARTITION_UNIFORM; policy <= PP_PARTITION_EXPLICIT; policy++) {
        static const int first[5] = {0, 2, 3, 9, 12};
        pp_tensor sample;
        pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4, m);
        memset(&sample, 0, sizeof sample);
        sample.rows = ROWS / m;
        sample.cols = HX_IN;
        sample.dtype = PP_F32;
        d.partition.policy = (pp_partition_policy)policy;
        d.partition.sample = &sample;
        d.partition.explicit_first = first;
        snprintf(what, sizeof what, "1f1b p=4, partition policy %d", policy);
        run(d, 1, steps, lref, what);
    }
}

/* The zero desc: p 1, GPipe, m 4p, v from the kind. */
static void test_defaults(void) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    const pp_schedule* s;
    pp_error err;
    grads G;
    grads_make(&G, 1);
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &W;
    d.grads = G.ptr[0];
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    s = pp_pipeline_schedule(pl);
    CHECK(s && s->kind == PP_SCHED_GPIPE && s->p == 1 && s->v == 1 && s->m == 4, "zero desc: %s p=%d v=%d m=%d",
          s ? pp_schedule_name(s->kind) : "?", s ? s->p : 0, s ? s->v : 0, s ? s->m : 0);
    CHECK(pp_pipeline_partition(pl)[0] == 0 && pp_pipeline_partition(pl)[1] == MLP_DEPTH + 1, "one stage of every layer");
    pp_pipeline_destroy(pl);
    d.schedule = PP_SCHED_INTERLEAVED;
    d.p = 3;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    s = pp_pipeline_schedule(pl);
    CHECK(s && s->v == 2 && s->m == 12 && s->n_stages == 6, "interleaved p=3: v=%d m=%d", s ? s->v : 0, s ? s->m : 0);
    pp_pipeline_destroy(pl);
    d.schedule = PP_SCHED_ZB_V;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK && pp_pipeline_schedule(pl)->v == 2, "%s", err.msg);
    pp_pipeline_destroy(pl);
    grads_free(&G);
}

/* A schedule parsed from text, used as it is. */
static void test_custom(void) {
    static const char text[] = "schedule p=2 v=1 m=3\n"
                               "r0: F0 F1 B0 F2 B1 B2\n"
                               "r1: F0 B0 F1 B1 F2 B2\n";
    pp_action acts[12];
    pp_schedule s;
    pp_pipeline_desc d = desc(PP_SCHED_ZB_V, 0, 0); /* kind ignored */
    pp_pipeline* pl = NULL;
    pp_error err;
    size_t need = 0;
    float lref = reference(3, 2);
    grads G;
    CHECK(pp_schedule_parse(text, sizeof text - 1, acts, 12, &need, &s, &err) == PP_OK, "%s", err.msg);
    d.custom = &s;
    run(d, 0, 2, lref, "custom table p=2 m=3");
    d.m = 4;
    grads_make(&G, 1);
    d.grads = G.ptr[0];
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && !pl && strstr(err.msg, "custom schedule's 2, 1, 3"), "%s",
          err.msg);
    grads_free(&G);
}

/* The ordering rule (docs/schedules.md): a layer adds its weight gradients in its B (or W), so a
   stage that runs B1 before B0 adds them in another order than the sequential reference. Such a
   table is refused by pp_schedule_parse and, made by hand, by create, naming the stage and the
   two micro-batches; order=any accepts it (and then it is not bit-exact: the reason for the
   rule); forwards in any order with backwards ascending run bit-exact. Negative control:
   build/errors-controls (-DPP_TEST_NO_ORDER_CHECK: the out-of-order tables are accepted). */
static pp_result parse(const char* text, pp_action* acts, size_t cap, pp_schedule* s, pp_error* err) {
    size_t need = 0;
    memset(err, 0, sizeof *err);
    return pp_schedule_parse(text, strlen(text), acts, cap, &need, s, err);
}
static void test_table_order(void) {
    static const char bad[] = "schedule p=2 v=1 m=2\n"
                              "r0: F0 F1 B1 B0\n"
                              "r1: F0 F1 B1 B0\n";
    static const char bad_w[] = "schedule p=1 v=1 m=3\n"
                                "r0: F0 F1 F2 B0 B1 B2 W0 W2 W1\n";
    static const char any[] = "schedule p=2 v=1 m=2 order=any\n"
                              "r0: F0 F1 B1 B0\n"
                              "r1: F0 F1 B1 B0\n";
    static const char fwd_any[] = "schedule p=2 v=1 m=3\n"
                                  "r0: F2 F0 F1 B0 B1 B2\n"
                                  "r1: F2 F0 B0 F1 B1 B2\n";
    pp_action acts[16];
    pp_schedule s;
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 0, 0);
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch(2);
    grads G;
    char text[256];
    FILE* f;
    pp_result rc;
    float lref;

    rc = parse(bad, acts, 16, &s, &err);
    CHECK(rc == PP_ERR_SCHEDULE && strstr(err.msg, "rejected (rank r is the line 'rN:'): stage 0 (rank 0, chunk 0) runs B0 after B1") &&
              strstr(err.msg, "not bit-identical") && strstr(err.msg, "order=any"),
          "F0 F1 B1 B0: %s (%s)", pp_result_str(rc), err.msg);
    rc = parse(bad_w, acts, 16, &s, &err);
    CHECK(rc == PP_ERR_SCHEDULE && strstr(err.msg, "stage 0 (rank 0, chunk 0) runs W1 after W2"), "W2 W1: %s (%s)",
          pp_result_str(rc), err.msg);

    /* accepted with order=any, written back with it; it runs, and its gradients are not the
       reference's */
    rc = parse(any, acts, 16, &s, &err);
    CHECK(rc == PP_OK && s.any_order == 1, "order=any: %s (%s)", pp_result_str(rc), err.msg);
    if (rc == PP_OK && (f = fmemopen(text, sizeof text, "w")) != NULL) {
        pp_schedule s2;
        pp_action acts2[16];
        pp_schedule_write(f, &s);
        fclose(f);
        CHECK(strstr(text, "order=any") && parse(text, acts2, 16, &s2, &err) == PP_OK && s2.any_order == 1 &&
                  memcmp(acts, acts2, 8 * sizeof *acts) == 0,
              "written back: %s (%s)", text, err.msg);
    }
    if (rc == PP_OK) {
        reference(2, 1);
        grads_make(&G, 1);
        d.grads = G.ptr[0];
        d.custom = &s;
        CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
        CHECK(pl && pp_pipeline_step(pl, &b, NULL) == PP_OK, "order=any runs: %s", pl ? pp_pipeline_error(pl) : "");
        {
            size_t i, differ = 0;
            for (i = 0; i < NPAR; i++) differ += memcmp(&G.buf[0][i], &GREFBUF[i], sizeof(float)) != 0;
            printf("convenience: order=any, F0 F1 B1 B0 at p = 2, m = 2: %zu of %zu gradient values differ from the reference\n",
                   differ, NPAR);
            CHECK(differ > 0, "order=any: the gradients are the reference's bit for bit (the rule has no reason)");
        }
        pp_pipeline_destroy(pl);
        pl = NULL;

        /* the same lists made by hand, any_order 0: create refuses them */
        s.any_order = 0;
        memset(&err, 0, sizeof err);
        rc = pp_pipeline_create(&d, &pl, &err);
        CHECK(rc == PP_ERR_SCHEDULE && !pl && strstr(err.msg, "runs B0 after B1"), "by hand: %s (%s)", pp_result_str(rc),
              err.msg);
        pp_pipeline_destroy(pl);
        pl = NULL;
        s.any_order = 7;
        memset(&err, 0, sizeof err);
        CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && !pl && strstr(err.msg, "any_order = 7"), "%s",
              err.msg);
        grads_free(&G);
    }

    /* forwards in any order, backwards ascending: bit-exact */
    rc = parse(fwd_any, acts, 16, &s, &err);
    CHECK(rc == PP_OK && s.any_order == 0, "F2 F0 F1: %s (%s)", pp_result_str(rc), err.msg);
    if (rc == PP_OK) {
        lref = reference(3, 2);
        d.custom = &s;
        d.grads = NULL;
        run(d, 0, 2, lref, "forwards out of order, backwards ascending");
    }
}

/* Bad descs: refused at create, saying what. */
static void test_bad_desc(void) {
    grads G;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    void* grads_with_hole[2];
    pp_action dummy;
    grads_make(&G, 2);
    grads_with_hole[0] = G.ptr[0];
    grads_with_hole[1] = NULL;
#define REFUSED(code, needle)                                                                               \
    do {                                                                                                    \
        pl = (pp_pipeline*)&dummy;                                                                          \
        err.msg[0] = 0;                                                                                     \
        CHECK(pp_pipeline_create(&d, &pl, &err) == (code) && pl == NULL && strstr(err.msg, needle), "%s", err.msg); \
        pp_pipeline_destroy(pl);                                                                            \
    } while (0)
    d = desc(PP_SCHED_1F1B, 2, 4);
    REFUSED(PP_ERR_INVALID, "neither is");
    d.grads = G.ptr[0];
    d.rank_grads = G.ptr;
    REFUSED(PP_ERR_INVALID, "both are set");
    d.grads = NULL;
    d.rank_grads = grads_with_hole;
    REFUSED(PP_ERR_INVALID, "rank 1: rank_grads[1] is NULL");
    d.rank_grads = NULL;
    d.grads = G.ptr[0];
    d.stage.schedule = (const pp_schedule*)&dummy;
    REFUSED(PP_ERR_INVALID, "leave them zero");
    d.stage.schedule = NULL;
    d.p = 13; /* 12 layers */
    REFUSED(PP_ERR_INVALID, "cannot split 12 layers into 13 stages");
    d.p = 2;
    d.v = 3;
    REFUSED(PP_ERR_INVALID, "1f1b needs v = 1 chunk per rank (got v = 3)"); /* the kind's constraint */
    d.v = 0;
    d.stage.shapes = (pp_shape_policy)9;
    REFUSED(PP_ERR_INVALID, "rank 0: unknown shape policy 9");
    d.stage.shapes = PP_SHAPES_LOCAL;
    d.model.n_layers = 3;
    REFUSED(PP_ERR_INVALID, "n_layers = 3");
    d.model = mlp_model_desc();
    d.partition.n_stages = 3;
    REFUSED(PP_ERR_INVALID, "partition.n_stages = 3");
    d.partition.n_stages = 0;
    CHECK(pp_pipeline_create(NULL, &pl, &err) == PP_ERR_INVALID && pl == NULL, "NULL desc");
    CHECK(pp_pipeline_create(&d, NULL, &err) == PP_ERR_INVALID, "NULL out");
#undef REFUSED
    /* a batch with the wrong m */
    {
        pp_batch b = batch(3);
        CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_ERR_INVALID && strstr(pp_pipeline_error(pl), "m = 3"), "%s",
              pp_pipeline_error(pl));
        CHECK(pp_pipeline_step(pl, NULL, NULL) == PP_ERR_INVALID, "NULL batch");
        b.m = 4;
        CHECK(pp_pipeline_step(pl, &b, NULL) == PP_OK && pp_pipeline_error(pl)[0] == 0, "%s", pp_pipeline_error(pl));
        pp_pipeline_destroy(pl);
    }
    grads_free(&G);
}

/* Two threads step one pipeline: the second call, made while the first step runs (its first
   forward held 0.3 s), returns PP_ERR_INVALID at once, and so does pp_stage_step on one of its
   stages; the first step is bit-exact; no abort.
   Negative control: build/errors-controls (-DPP_TEST_NO_STEP_GUARD: the second step runs into
   the first, and an internal assertion aborts the process). */
static volatile int g_hold_ms;
static int held_forward(const void* w, int l, pp_layer_io* io) {
    if (g_hold_ms && l == 0 && io->mb->index == 0) {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)g_hold_ms * 1000000L;
        nanosleep(&ts, NULL);
    }
    return mlp_forward(w, l, io);
}
typedef struct step_arg {
    pp_pipeline* pl;
    pp_batch b;
    pp_result rc;
    float loss;
} step_arg;
static void* step_thread(void* u) {
    step_arg* a = (step_arg*)u;
    pp_step_stats st;
    a->rc = pp_pipeline_step(a->pl, &a->b, &st);
    a->loss = st.loss;
    return NULL;
}
static void test_concurrent_step(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 2, 4);
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_step_stats st;
    step_arg a;
    pthread_t th;
    float lref = reference(4, 1);
    double t0, t1;
    pp_result rc2, rc3;
    grads G;
    grads_make(&G, 2);
    d.model.forward = held_forward;
    d.rank_grads = G.ptr;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    if (!pl) return;
    a.pl = pl;
    a.b = batch(0);
    g_hold_ms = 300;
    pthread_create(&th, NULL, step_thread, &a);
    nanosleep(&(struct timespec){0, 50000000L}, NULL);
    t0 = _pp_now();
    rc2 = pp_pipeline_step(pl, &a.b, &st);
    t0 = _pp_now() - t0;
    t1 = _pp_now();
    rc3 = pp_stage_step(pl->st[1], &a.b, &st); /* the per-rank API, on a stage whose step runs */
    t1 = _pp_now() - t1;
    pthread_join(th, NULL);
    g_hold_ms = 0;
    CHECK(rc2 == PP_ERR_INVALID && t0 < 0.1, "a second step while one runs: %s after %.3f s", pp_result_str(rc2), t0);
    CHECK(rc3 == PP_ERR_INVALID && t1 < 0.1, "pp_stage_step on a stage whose step runs: %s after %.3f s", pp_result_str(rc3),
          t1);
    CHECK(a.rc == PP_OK && memcmp(&a.loss, &lref, sizeof lref) == 0 && grads_equal(&G), "the running step: %s, loss %g (%g)",
          pp_result_str(a.rc), a.loss, lref);
    pp_pipeline_destroy(pl);
    grads_free(&G);
}

/* A layer fails on one rank: every rank stops, the step names that rank, the next step is right. */
static volatile int g_fail_layer = -1;
static int failing_forward(const void* w, int l, pp_layer_io* io) {
    if (l == g_fail_layer && io->mb->index == 1) return 42;
    return mlp_forward(w, l, io);
}

static void test_failure(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4, 4);
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch(0);
    pp_step_stats st;
    float lref = reference(4, 1);
    grads G;
    int r, owner = -1, s;
    grads_make(&G, 4);
    d.model.forward = failing_forward;
    d.rank_grads = G.ptr;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    if (!pl) return;
    g_fail_layer = 7;
    for (s = 0; s < pp_pipeline_schedule(pl)->n_stages; s++)
        if (7 >= pp_pipeline_partition(pl)[s] && 7 < pp_pipeline_partition(pl)[s + 1]) {
            int c;
            pp_schedule_stage_to_rank(pp_pipeline_schedule(pl), s, &owner, &c);
        }
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_ERR_LAYER, "a failing layer: %s", pp_pipeline_error(pl));
    {
        char needle[64];
        snprintf(needle, sizeof needle, "rank %d of 4 failed first", owner);
        CHECK(strstr(pp_pipeline_error(pl), needle) && strstr(pp_pipeline_error(pl), "returned 42"), "%s",
              pp_pipeline_error(pl));
    }
    CHECK(!st.has_loss, "a failed step has no loss");
    for (r = 0; r < 4; r++) {
        pp_result rr = pp_pipeline_rank_result(pl, r, NULL);
        CHECK(r == owner ? rr == PP_ERR_LAYER : rr == PP_ERR_ABORTED, "rank %d returned %s", r, pp_result_str(rr));
    }
    g_fail_layer = -1;
    for (r = 0; r < 4; r++) memset(G.buf[r], 0, NPAR * sizeof(float));
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "the step after a failure: %s", pp_pipeline_error(pl));
    CHECK(grads_equal(&G) && memcmp(&st.loss, &lref, sizeof lref) == 0, "the step after a failure is not the reference's");
    CHECK(pp_pipeline_error(pl)[0] == 0, "error cleared by a good step");
    pp_pipeline_destroy(pl);
    grads_free(&G);
}

/* rank_setup: wrap a rank's transport. Here it counts sends, and on request fails them. */
typedef struct wrap {
    pp_transport inner;
    int sends, fail, no_cancel;
} wrap;
static wrap g_wrap[4];
static pp_result w_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    wrap* w = (wrap*)self;
    w->sends++;
    if (w->fail) return PP_ERR_TRANSPORT;
    return w->inner.isend(w->inner.self, peer, tag, buf, bytes, req);
}
static pp_result w_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    wrap* w = (wrap*)self;
    return w->inner.irecv(w->inner.self, peer, tag, buf, bytes, req);
}
/* A wrapper replaces self, so every function it keeps must be its own: the rest become NULL
   (optional ones), or forward (abort and cancel, which a failed step needs). */
static pp_result wrap_rank(void* user, int rank, pp_stage_desc* d) {
    wrap* w = &((wrap*)user)[rank];
    if (rank == 3 && w->fail == 2) return PP_ERR_UNSUPPORTED;
    w->inner = d->transport;
    memset(&d->transport, 0, sizeof d->transport);
    d->transport.self = w;
    d->transport.rank = w->inner.rank;
    d->transport.size = w->inner.size;
    d->transport.isend = w_isend;
    d->transport.irecv = w_irecv;
    d->transport.wait = hx_fw_wait;
    d->transport.abort = hx_fw_abort;
    d->transport.cancel = w->no_cancel ? NULL : hx_fw_cancel;
    return PP_OK;
}

static void test_rank_setup(void) {
    pp_pipeline_desc d = desc(PP_SCHED_1F1B, 4, 4);
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch(0);
    pp_step_stats st, rs;
    size_t n = 0;
    const pp_event* ev;
    float lref = reference(4, 1);
    grads G;
    int r;
    uint64_t bytes = 0;
    grads_make(&G, 1);
    memset(g_wrap, 0, sizeof g_wrap);
    d.grads = G.ptr[0];
    d.rank_setup = wrap_rank;
    d.user = g_wrap;
    d.stage.record_timeline = 1;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    if (!pl) return;
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "%s", pp_pipeline_error(pl));
    CHECK(grads_equal(&G) && memcmp(&st.loss, &lref, sizeof lref) == 0, "wrapped transports: not the reference");
    for (r = 0; r < 4; r++) {
        CHECK(pp_pipeline_rank_result(pl, r, &rs) == PP_OK, "rank %d", r);
        CHECK((uint64_t)g_wrap[r].sends == rs.msgs_sent, "rank %d: %d sends through the wrapper, stats say %llu", r,
              g_wrap[r].sends, (unsigned long long)rs.msgs_sent);
        CHECK(rs.t_total <= st.t_total, "t_total is the slowest rank's");
        bytes += rs.bytes_sent;
    }
    CHECK(bytes == st.bytes_sent && st.bytes_sent == st.bytes_recv && st.bytes_sent > 0, "bytes summed over ranks: %llu, %llu sent, %llu received", (unsigned long long)bytes, (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_recv);
    CHECK(pp_pipeline_rank_result(pl, 4, NULL) == PP_ERR_INVALID, "rank 4 of 4");
    ev = pp_pipeline_timeline(pl, &n);
    CHECK(ev && n == (size_t)4 * pp_pipeline_schedule(pl)->per_rank && ev[0].rank == 0 && ev[n - 1].rank == 3,
          "timeline: %zu events", n);
    CHECK(pp_pipeline_stage(pl, 2) != NULL && pp_pipeline_stage(pl, 4) == NULL, "stage access");
    /* a send that fails on rank 2 */
    g_wrap[2].fail = 1;
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_ERR_TRANSPORT &&
              strncmp(pp_pipeline_error(pl), "transport error: rank 2 of 4 failed first", 41) == 0 &&
              !strstr(pp_pipeline_error(pl) + 20, "rank 2 ") && !strstr(pp_pipeline_error(pl) + 20, "transport error"),
          "one code, rank 2 once: %s", pp_pipeline_error(pl));
    g_wrap[2].fail = 0;
    memset(G.buf[0], 0, NPAR * sizeof(float));
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK && grads_equal(&G), "after the failed send: %s", pp_pipeline_error(pl));
    pp_pipeline_destroy(pl);
    /* a transport that cannot withdraw receives: after a failed step the pipeline stops. Rank 0
       fails its first send, before it posted any receive (F actions of the first stage receive
       nothing), so no receive is left behind that only a cancel could free. */
    memset(g_wrap, 0, sizeof g_wrap);
    g_wrap[0].no_cancel = 1;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "%s", pp_pipeline_error(pl));
    g_wrap[0].fail = 1;
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_ERR_TRANSPORT, "%s", pp_pipeline_error(pl));
    g_wrap[0].fail = 0;
    CHECK(pp_pipeline_step(pl, &b, &st) == PP_ERR_UNSUPPORTED && strstr(pp_pipeline_error(pl), "rank 0's transport cannot"),
          "%s", pp_pipeline_error(pl));
    pp_pipeline_destroy(pl);
    /* a rank_setup that refuses */
    g_wrap[3].fail = 2;
    CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_UNSUPPORTED && !pl && strstr(err.msg, "rank 3: rank_setup"), "%s",
          err.msg);
    grads_free(&G);
}

int main(int argc, char** argv) {
    uint64_t seed = 3;
    int i, order_only = argc > 1 && !strcmp(argv[1], "order"); /* what the negative control runs */
    WBUF = mlp_init(&W, &GREF, DIMS, 21, &GREFBUF);
    NPAR = mlp_param_count(DIMS);
    mlp_make_data(X, Y, ROWS, HX_IN, HX_CLASSES, 8, 9);
    for (i = 0; i < ROWS * HX_IN; i++) X[i] += 0.01f * mlp_rng_uniform(&seed);
    if (!order_only) {
        test_equal();
        test_defaults();
        test_custom();
    }
    test_table_order();
    if (!order_only) {
        test_bad_desc();
        test_failure();
        test_concurrent_step();
        test_rank_setup();
    }
    free(WBUF);
    free(GREFBUF);
    return TEST_DONE(order_only ? "convenience order" : "convenience");
}
