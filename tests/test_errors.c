/* tests/test_errors.c - bad input gets an error code and a message; failures never hang.

   Covers: invalid schedules and partitions, models with NULL callbacks, stage descs that do not
   fit their schedule, bad batches and cu_seqlens, mismatched buffer sizes in the transport, a
   peer that never sends (timeout within 2x the deadline), and a layer that fails on the last
   stage (every rank's step returns an error, and the next step runs clean); schedule headers
   near INT_MAX (`test_errors overflow`: refused before any product overflows, under UBSan in the
   asan build) and the schedule paths' messages. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"
#include <limits.h>

#define ROWS 16
#define IN 4
#define CLASSES 3
static const int DIMS[MLP_DEPTH + 1] = {IN, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, CLASSES};

#define EXPECT_ERR(call, code, what)                                                                   \
    do {                                                                                             \
        pp_error e_;                                                                                 \
        pp_result r_;                                                                                \
        memset(&e_, 0, sizeof e_);                                                                   \
        r_ = (call);                                                                                 \
        CHECK(r_ == (code), "%s: got %s, want %s (%s)", what, pp_result_str(r_), pp_result_str(code), \
              e_.msg);                                                                               \
        CHECK(r_ == PP_OK || e_.msg[0] != 0, "%s: no message", what);                                \
    } while (0)
/* EXPECT_ERR's call writes its message into e_. */
#define ERR (&e_)
/* Rank 0's desc of fixture f with one change (a statement on d): pp_stage_create refuses it. */
#define EXPECT_DESC_INVALID(f, change, what)                             \
    do {                                                                 \
        d = desc_for(&(f), 0);                                           \
        change;                                                          \
        EXPECT_ERR(pp_stage_create(&d, &st, ERR), PP_ERR_INVALID, what); \
    } while (0)

static void test_schedule_args(void) {
    pp_action acts[64];
    pp_schedule s;
    EXPECT_ERR(pp_schedule_make(PP_SCHED_1F1B, 0, 1, 4, acts, 64, &s, ERR), PP_ERR_INVALID, "p = 0");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_1F1B, 2, 1, 0, acts, 64, &s, ERR), PP_ERR_INVALID, "m = 0");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_INTERLEAVED, 2, 0, 4, acts, 64, &s, ERR), PP_ERR_INVALID, "v = 0");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_GPIPE, 2, 2, 4, acts, 64, &s, ERR), PP_ERR_INVALID, "gpipe v = 2");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_INTERLEAVED, 2, 1, 4, acts, 64, &s, ERR), PP_ERR_INVALID, "interleaved v = 1");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_1F1B, 4, 1, 16, acts, 64, &s, ERR), PP_ERR_SIZE, "cap too small");
    EXPECT_ERR(pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, NULL, 64, &s, ERR), PP_ERR_INVALID, "NULL actions");
    EXPECT_ERR(pp_schedule_make((pp_schedule_kind)99, 2, 1, 4, acts, 64, &s, ERR), PP_ERR_INVALID, "unknown kind");
    CHECK(pp_schedule_size(PP_SCHED_1F1B, 0, 1, 4) == 0, "size of an invalid schedule is 0");
}

/* Headers near INT_MAX: refused (PP_ERR_INVALID), no int product of their fields computed first.
   The asan build (-fsanitize=undefined, no recovery) fails on an overflow. Negative control:
   build/errors-controls (-DPP_TEST_NO_HEADER_BOUNDS under the sanitizers: pp_simulate forms
   p * v before it refuses v). */
static void test_header_overflow(void) {
    static pp_action acts[8];
    pp_schedule s;
    pp_sim_result res;
    pp_model m = mlp_model_desc();
    mlp_model w, g;
    pp_pipeline_desc pd;
    pp_pipeline* pl = NULL;
    pp_partition_desc part;
    double wt[MLP_DEPTH + 1];
    int first[MLP_DEPTH + 2], r, c, l;
    memset(&s, 0, sizeof s);
    s.kind = PP_SCHED_CUSTOM;
    s.actions = acts;
    s.p = 2, s.v = INT_MAX, s.m = 1, s.n_stages = 2, s.per_rank = 4;
    EXPECT_ERR(pp_simulate(&s, NULL, &res, NULL, ERR), PP_ERR_INVALID, "simulate: v = INT_MAX");
    s.p = 1, s.n_stages = INT_MAX; /* p * v == n_stages: once a 2^31-stage loop over the costs */
    EXPECT_ERR(pp_simulate(&s, NULL, &res, NULL, ERR), PP_ERR_INVALID, "simulate: 2^31 - 1 stages");
    s.p = 2, s.v = 2, s.m = INT_MAX / 2 + 1, s.n_stages = 4, s.per_rank = 12;
    CHECK(!pp_schedule_has_w(&s), "has_w: 3 m v of m = 2^30");
    s.v = INT_MAX, s.m = INT_MAX;
    CHECK(!pp_schedule_has_w(&s), "has_w: 3 m v of m = v = INT_MAX");
    s.p = INT_MAX / 2 + 1, s.v = 2, s.n_stages = INT_MAX, s.map = PP_MAP_V;
    pp_schedule_stage_to_rank(&s, 1, &r, &c);
    CHECK(r == -1 && c == -1, "stage_to_rank of p = 2^30 (2p - 1 - stage): rank %d chunk %d", r, c);
    s.per_rank = -1, s.p = 2;
    CHECK(pp_schedule_rank(&s, 1) == NULL, "rank list of per_rank = -1");
    /* pp_pipeline_create: the default m, 4p, of p = INT_MAX */
    memset(&pd, 0, sizeof pd);
    memset(&w, 0, sizeof w);
    memset(&g, 0, sizeof g);
    pd.model = m;
    pd.weights = &w;
    pd.grads = &g;
    pd.p = INT_MAX;
    EXPECT_ERR(pp_pipeline_create(&pd, &pl, ERR), PP_ERR_INVALID, "pipeline: p = INT_MAX");
    CHECK(pl == NULL, "no pipeline");
    /* pp_partition_model balancing the ranks of a schedule with no rank (stage % p) */
    memset(&part, 0, sizeof part);
    for (l = 0; l <= MLP_DEPTH; l++) wt[l] = 1 + l;
    part.policy = PP_PARTITION_WEIGHTS;
    part.weight = wt;
    part.n_stages = 4;
    s.p = 0, s.v = 2, s.m = 2, s.n_stages = 4, s.per_rank = 8, s.map = PP_MAP_LOOP;
    part.schedule = &s;
    EXPECT_ERR(pp_partition_model(&m, &w, &part, first, NULL, ERR), PP_ERR_INVALID, "partition: schedule of p = 0");
}

static void test_partition_args(void) {
    int first[8];
    double w[4] = {1, 2, 3, 4}, bad[4] = {1, -1, 3, 4};
    int gap[4] = {0, 2, 2, 5}, short_end[3] = {0, 2, 4}, ok[3] = {0, 3, 5};
    EXPECT_ERR(pp_partition_uniform(3, 4, first, ERR), PP_ERR_INVALID, "more stages than layers");
    EXPECT_ERR(pp_partition_uniform(3, 0, first, ERR), PP_ERR_INVALID, "zero stages");
    EXPECT_ERR(pp_partition_balanced(w, 4, 5, first, ERR), PP_ERR_INVALID, "balanced: more stages than layers");
    EXPECT_ERR(pp_partition_balanced(bad, 4, 2, first, ERR), PP_ERR_INVALID, "negative weight");
    EXPECT_ERR(pp_partition_check(gap, 5, 3, ERR), PP_ERR_INVALID, "empty stage");
    EXPECT_ERR(pp_partition_check(short_end, 5, 2, ERR), PP_ERR_INVALID, "partition drops layers");
    EXPECT_ERR(pp_partition_check(ok, 5, 2, ERR), PP_OK, "valid partition");
    EXPECT_ERR(pp_partition_balanced(w, 4, 2, first, ERR), PP_OK, "balanced");
    CHECK(first[0] == 0 && first[1] == 3 && first[2] == 4, "balanced {1,2,3,4} into 2: [0,3) [3,4), got %d %d %d",
          first[0], first[1], first[2]);
    CHECK(pp_partition_imbalance(w, 4, first, 2) > 1.19 && pp_partition_imbalance(w, 4, first, 2) < 1.21,
          "imbalance 6/5");
}

/* pp_partition_model's weights: UNIFORM and EXPLICIT never call describe, so NULL is fine;
   COST and PARAMS do, and describe reads the parameter struct's sizes (mlp's dense_desc reads
   p->out), so NULL is refused with a message instead of a crash. Weight arrays are not needed:
   a model struct with its sizes set and no arrays partitions by cost. */
static void test_partition_weights(void) {
    pp_model m = mlp_model_desc();
    pp_partition_desc pd;
    pp_tensor sample;
    mlp_model w;
    int first[4], l, e = 0;
    memset(&pd, 0, sizeof pd);
    memset(&sample, 0, sizeof sample);
    memset(&w, 0, sizeof w);
    sample.rows = ROWS;
    sample.cols = IN;
    sample.dtype = PP_F32;
    pd.n_stages = 3;
    pd.policy = PP_PARTITION_UNIFORM;
    EXPECT_ERR(pp_partition_model(&m, NULL, &pd, first, NULL, ERR), PP_OK, "uniform, weights NULL");
    pd.policy = PP_PARTITION_COST;
    pd.sample = &sample;
    {
        pp_error e_;
        memset(&e_, 0, sizeof e_);
        CHECK(pp_partition_model(&m, NULL, &pd, first, NULL, &e_) == PP_ERR_INVALID &&
                  strcmp(e_.msg, "invalid argument: weights is NULL: describe reads each layer's parameter struct "
                                 "(its sizes, not its data); pass the model struct, its arrays may be unallocated") == 0,
              "cost, weights NULL: %s", e_.msg);
    }
    for (l = 0; l < MLP_DEPTH; l++) { /* sizes only: w.dense[l].w and .b stay NULL */
        w.dense[l].in = DIMS[l];
        w.dense[l].out = DIMS[l + 1];
    }
    EXPECT_ERR(pp_partition_model(&m, &w, &pd, first, NULL, ERR), PP_OK, "cost, sizes without arrays");
    for (l = 0; l < MLP_DEPTH; l++) e += w.dense[l].w != NULL || w.dense[l].b != NULL;
    CHECK(e == 0 && first[0] == 0 && first[3] == MLP_DEPTH + 1, "a partition of every layer");
}

/* --- stage and batch validation on a 2-rank pipeline ------------------------------------- */
typedef struct fixture {
    mlp_model w, g;
    float *wbuf, *gbuf;
    float x[ROWS * IN];
    int32_t y[ROWS];
    pp_batch b;
    pp_action acts[64];
    pp_schedule sched;
    int first[3];
    pp_threads* threads;
} fixture;

static void fixture_init(fixture* f, int m) {
    pp_error err;
    memset(f, 0, sizeof *f);
    f->wbuf = mlp_init(&f->w, &f->g, DIMS, 5, &f->gbuf);
    mlp_make_data(f->x, f->y, ROWS, IN, CLASSES, 1, 2);
    hx_dense_batch(&f->b, f->x, f->y, ROWS, IN, m);
    pp_schedule_make(PP_SCHED_1F1B, 2, 1, m, f->acts, 64, &f->sched, &err);
    pp_partition_uniform(MLP_DEPTH + 1, 2, f->first, &err);
    pp_threads_create(2, &f->threads, &err);
}

static void fixture_free(fixture* f) {
    free(f->wbuf);
    free(f->gbuf);
    pp_threads_destroy(f->threads);
}

static pp_stage_desc desc_for(fixture* f, int rank) {
    pp_stage_desc d;
    hx_stage_desc(&d, NULL, mlp_model_desc(), &f->w, &f->g, &f->sched,
                  f->first, rank, pp_threads_transport(f->threads, rank));
    d.timeout_s = 2;
    return d;
}

static void test_stage_desc(void) {
    fixture f;
    pp_stage_desc d;
    pp_stage* st = NULL;
    int bad_first[3] = {0, 12, 12};
    fixture_init(&f, 4);
    EXPECT_DESC_INVALID(f, d.model.forward = NULL, "NULL forward callback");
    EXPECT_DESC_INVALID(f, d.model.describe = NULL, "NULL describe callback");
    EXPECT_DESC_INVALID(f, d.schedule = NULL, "NULL schedule");
    EXPECT_DESC_INVALID(f, d.rank = 2, "rank outside the schedule");
    EXPECT_DESC_INVALID(f, d.partition = bad_first, "partition with an empty stage");
    EXPECT_DESC_INVALID(f, memset(&d.transport, 0, sizeof d.transport), "no transport for p = 2");
    EXPECT_DESC_INVALID(f, d.transport = pp_threads_transport(f.threads, 1), "transport of another rank");
    EXPECT_DESC_INVALID(f, d.grads = NULL, "NULL grads");
    CHECK(st == NULL, "no stage is returned on error");
    EXPECT_ERR(pp_stage_create(NULL, &st, ERR), PP_ERR_INVALID, "NULL desc");
    fixture_free(&f);
}

static void test_batches(void) {
    fixture f;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    pp_batch b;
    uint64_t bytes0 = 0, bytes1 = 0, base0 = 0, base1 = 0;
    int32_t cu_start[3] = {1, 8, 16}, cu_dec[4] = {0, 9, 8, 16}, cu_end[3] = {0, 8, 15}, cu_ok[3] = {0, 8, 16};
    int32_t cu_neg[3] = {0, -4, 16};
    float loss;
    pp_model model = mlp_model_desc();
    fixture_init(&f, 2);
    d = desc_for(&f, 0);
    CHECK(pp_stage_create(&d, &st, &err) == PP_OK, "%s", err.msg);

    b = f.b;
    b.m = 3;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID && strstr(pp_stage_error(st), "m = 3"),
          "m differs from the schedule: %s", pp_stage_error(st));
    b = f.b;
    b.input.data = NULL;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID, "first stage without input: %s", pp_stage_error(st));
    b = f.b;
    b.input.cols = 0;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID, "zero-width input: %s", pp_stage_error(st));
    b = f.b;
    b.input.cols = IN + 1;
    pp_threads_reset(f.threads); /* the step runs its first forward: the world must be up */
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_LAYER, "input width the first layer rejects: %s", pp_stage_error(st));
    pp_threads_counters(f.threads, 0, &base0, NULL); /* that step ran its plan check: the rest are rejected */
    pp_threads_counters(f.threads, 1, &base1, NULL);
    b = f.b;
    b.cu_seqlens = cu_start;
    b.n_seqs = 2;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID && strstr(pp_stage_error(st), "cu_seqlens[0]"),
          "cu_seqlens not starting at 0: %s", pp_stage_error(st));
    b.cu_seqlens = cu_dec;
    b.n_seqs = 3;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID, "decreasing cu_seqlens: %s", pp_stage_error(st));
    b.cu_seqlens = cu_neg;
    b.n_seqs = 2;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID, "negative cu_seqlens: %s", pp_stage_error(st));
    b.cu_seqlens = cu_end;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID, "cu_seqlens ending before the rows: %s", pp_stage_error(st));
    b.cu_seqlens = cu_ok; /* n_seqs + m overflowed before the check (UB: the ASan+UBSan build aborts) */
    b.n_seqs = INT_MAX;
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID && strstr(pp_stage_error(st), "cannot fit"),
          "n_seqs = INT_MAX: %s", pp_stage_error(st));
    b.cu_seqlens = cu_ok;
    b.n_seqs = 2;
    b.m = 2;
    pp_stage_destroy(st);
    st = NULL;
    /* more micro-batches than sequences, through the sequential path */
    b.m = 3;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "more micro-batches than sequences");
    b = f.b;
    b.m = ROWS + 1;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "more micro-batches than rows");
    b = f.b;
    b.targets = NULL;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "no targets");
    /* nothing was sent by any of the rejected steps */
    pp_threads_counters(f.threads, 0, &bytes0, NULL);
    pp_threads_counters(f.threads, 1, &bytes1, NULL);
    CHECK(bytes0 == base0 && bytes1 == base1, "rejected steps sent %llu + %llu bytes", (unsigned long long)(bytes0 - base0),
          (unsigned long long)(bytes1 - base1));
    fixture_free(&f);
}

/* --- the validation audit: inputs the first version let through ---------------------------- */
static int g_huge;
static void huge_describe(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    mlp_describe(w, l, mb, in, n_in, d);
    if (l == 2 && g_huge) {
        d->out[0].rows = (int64_t)1 << 40; /* 2^40 x 2^20 f32: 2^62 bytes */
        d->out[0].cols = (int64_t)1 << 20;
    }
}

static void test_validation_audit(void) {
    fixture f;
    pp_model model = mlp_model_desc();
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_batch b;
    pp_error err;
    float loss;
    pp_tensor sample;
    double cost[MLP_DEPTH + 1];
    fixture_init(&f, 2);
    EXPECT_DESC_INVALID(f, d.timeout_s = -1, "negative timeout");
    EXPECT_DESC_INVALID(f, d.timeout_s = NAN, "NaN timeout");
    EXPECT_DESC_INVALID(f, d.timeout_s = 1e300, "timeout beyond time_t");
    EXPECT_DESC_INVALID(f, d.weights = NULL, "NULL weights");
    EXPECT_DESC_INVALID(f, d.check_finite = 2, "check_finite out of range");
    EXPECT_DESC_INVALID(f, d.allow_nonfinite_loss = -1, "allow_nonfinite_loss out of range");
    EXPECT_DESC_INVALID(f, (d.check_finite = 1, d.allow_nonfinite_loss = 1), "check_finite with allow_nonfinite_loss");
    EXPECT_DESC_INVALID(f, d.shapes = (pp_shape_policy)9, "unknown shape policy");
    EXPECT_DESC_INVALID(f, d.max_seqs = -3, "negative max_seqs");
    CHECK(st == NULL, "no stage on error");
    EXPECT_ERR(pp_sequential_step(&model, NULL, &f.g, &f.b, &loss, ERR), PP_ERR_INVALID, "sequential: NULL weights");
    sample.data = NULL;
    sample.rows = 4;
    sample.cols = IN;
    sample.dtype = PP_F32;
    EXPECT_ERR(pp_model_layer_costs(&model, NULL, &sample, cost, NULL, ERR), PP_ERR_INVALID, "layer costs: NULL weights");
    /* a batch whose byte count would overflow */
    b = f.b;
    b.input.rows = (int64_t)1 << 40;
    b.input.cols = (int64_t)1 << 30;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "input of 2^70 elements");
    b = f.b;
    b.input.dtype = (pp_dtype)42;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "input of an unknown dtype");
    /* describe giving a shape of 2^62 bytes */
    model.describe = huge_describe;
    g_huge = 1;
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &f.b, &loss, ERR), PP_ERR_INVALID, "describe: 2^62-byte output");
    g_huge = 0;
    /* split weights */
    b = f.b;
    b.split = PP_SPLIT_COST;
    b.split_a = NAN;
    model = mlp_model_desc();
    EXPECT_ERR(pp_sequential_step(&model, &f.w, &f.g, &b, &loss, ERR), PP_ERR_INVALID, "NaN split weight");
    memset(&err, 0, sizeof err);
    fixture_free(&f);
}

/* --- the transport: size mismatches and a peer that never sends -------------------------- */
static void test_transport(void) {
    pp_threads* w;
    pp_transport t0, t1;
    pp_request rq, rs;
    pp_error err;
    char a[16] = "0123456789abcde", b[16];
    double t;
    pp_threads_create(2, &w, &err);
    t0 = pp_threads_transport(w, 0);
    t1 = pp_threads_transport(w, 1);
    CHECK(t0.isend != NULL && pp_threads_transport(w, 2).isend == NULL, "transport of a missing rank is empty");
    /* receive posted first, sender sends fewer bytes */
    t1.irecv(t1.self, 0, 5, b, 16, &rq);
    CHECK(t0.isend(t0.self, 1, 5, a, 8, &rs) == PP_ERR_SIZE, "sender told of the size mismatch");
    memset(&err, 0, sizeof err);
    CHECK(t1.wait(t1.self, &rq, 1, &err) == PP_ERR_SIZE && strstr(err.msg, "16"), "receiver: %s", err.msg);
    /* message first, receive of another size */
    t0.isend(t0.self, 1, 6, a, 16, &rs);
    t1.irecv(t1.self, 0, 6, b, 8, &rq);
    memset(&err, 0, sizeof err);
    CHECK(t1.wait(t1.self, &rq, 1, &err) == PP_ERR_SIZE, "unexpected message of another size: %s", err.msg);
    /* matched on tag, not order */
    t0.isend(t0.self, 1, 8, "B", 2, &rs);
    t0.isend(t0.self, 1, 7, "A", 2, &rs);
    t1.irecv(t1.self, 0, 7, b, 2, &rq);
    CHECK(t1.wait(t1.self, &rq, 1, &err) == PP_OK && b[0] == 'A', "tag 7 gets A");
    t1.irecv(t1.self, 0, 8, b, 2, &rq);
    CHECK(t1.wait(t1.self, &rq, 1, &err) == PP_OK && b[0] == 'B', "tag 8 gets B");
    /* nobody sends: timeout within 2x the deadline, naming the peer */
    t1.irecv(t1.self, 0, 9, b, 4, &rq);
    t = hx_now();
    memset(&err, 0, sizeof err);
    CHECK(t1.wait(t1.self, &rq, 0.2, &err) == PP_ERR_TIMEOUT, "timeout");
    t = hx_now() - t;
    CHECK(t >= 0.19 && t < 0.4, "timed out after %.3f s for a 0.2 s deadline", t);
    CHECK(strstr(err.msg, "rank 1") && strstr(err.msg, "rank 0"), "message names both ranks: %s", err.msg);
    pp_threads_destroy(w);
}

/* --- a layer that fails on the last stage --------------------------------------------------- */
static int g_fail_layer = -1;
static int failing_forward(const void* w, int l, pp_layer_io* io) {
    if (l == g_fail_layer && io->mb->index == 1) return 42;
    return mlp_forward(w, l, io);
}

typedef struct fail_run {
    fixture* f;
    pp_stage* st[2];
    pp_result rc[2];
    char msg[2][512];
} fail_run;

static pp_result fail_rank(int rank, void* user) {
    fail_run* R = (fail_run*)user;
    R->rc[rank] = pp_stage_step(R->st[rank], &R->f->b, NULL);
    snprintf(R->msg[rank], sizeof R->msg[rank], "%s", pp_stage_error(R->st[rank]));
    return R->rc[rank];
}

/* Two ranks over f (m = 4) whose forward fails where g_fail_layer says. */
static void fail_run_init(fixture* f, fail_run* R) {
    pp_error err;
    int r;
    fixture_init(f, 4);
    memset(R, 0, sizeof *R);
    R->f = f;
    for (r = 0; r < 2; r++) {
        pp_stage_desc d = desc_for(f, r);
        d.model.forward = failing_forward;
        d.timeout_s = 30; /* the abort, not the deadline, must end the other rank's wait */
        CHECK(pp_stage_create(&d, &R->st[r], &err) == PP_OK, "%s", err.msg);
    }
}

static void test_failing_layer(void) {
    fixture f;
    fail_run R;
    pp_error err;
    double t;
    int r;
    fail_run_init(&f, &R);
    g_fail_layer = MLP_DEPTH; /* the loss layer, on rank 1 */
    t = hx_now();
    pp_threads_run(2, fail_rank, &R, &err);
    t = hx_now() - t;
    CHECK(R.rc[1] == PP_ERR_LAYER && strstr(R.msg[1], "returned 42"), "failing rank: %s", R.msg[1]);
    CHECK(R.rc[0] == PP_ERR_ABORTED, "the other rank is told: %s (%s)", pp_result_str(R.rc[0]), R.msg[0]);
    CHECK(t < 5, "both returned in %.2f s", t);
    /* the user decides to go on: the next step runs clean */
    g_fail_layer = -1;
    pp_threads_reset(f.threads);
    pp_threads_run(2, fail_rank, &R, &err);
    CHECK(R.rc[0] == PP_OK && R.rc[1] == PP_OK, "step after an aborted one: %s / %s", R.msg[0], R.msg[1]);
    for (r = 0; r < 2; r++) pp_stage_destroy(R.st[r]);
    fixture_free(&f);
}

/* --- message shapes: one code prefix, "rank R" once, the root cause kept ------------------- */
static int count_of(const char* s, const char* what) {
    int n = 0;
    for (; (s = strstr(s, what)) != NULL; s++) n++;
    return n;
}

static int ends_with(const char* s, const char* tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static void test_message_shapes(void) {
    fixture f;
    fail_run R;
    pp_error err;
    pp_stage* st;
    pp_transport t1;
    pp_batch b;
    int r;
    char tail[600];
    fail_run_init(&f, &R);
    /* a failing layer: its rank says what failed; the other quotes that whole, after its own
       context, with one "aborted by another rank" and no "rank 0" twice */
    g_fail_layer = MLP_DEPTH;
    pp_threads_run(2, fail_rank, &R, &err);
    g_fail_layer = -1;
    CHECK(strcmp(R.msg[1], "layer callback failed: rank 1 at F1.0 (stage 1): layer 11 (xent) forward returned 42 on "
                           "micro-batch 1") == 0,
          "failing rank: %s", R.msg[1]);
    snprintf(tail, sizeof tail, ": %s", R.msg[1]);
    CHECK(strncmp(R.msg[0], "aborted by another rank: rank 0 at ", 35) == 0 && ends_with(R.msg[0], tail) &&
              count_of(R.msg[0], "aborted by another rank") == 1 && count_of(R.msg[0], "rank 0") == 1,
          "aborted rank: %s", R.msg[0]);
    pp_threads_reset(f.threads);
    /* aborted while sending: a send carries no message, the transport's abort reason does */
    t1 = pp_threads_transport(f.threads, 1);
    t1.abort(t1.self, PP_ERR_LAYER, "layer callback failed: rank 1 at F0.0 (stage 1): boom");
    CHECK(pp_stage_step(R.st[0], &f.b, NULL) == PP_ERR_ABORTED, "rank 0 after rank 1 aborted");
    CHECK(strcmp(pp_stage_error(R.st[0]), "aborted by another rank: rank 0: sending the step's identity to rank 1: "
                                          "layer callback failed: rank 1 at F0.0 (stage 1): boom") == 0,
          "aborted while sending: %s", pp_stage_error(R.st[0]));
    pp_threads_reset(f.threads);
    /* a message that does not name the rank gets it once; no message at all says so */
    t1.abort(t1.self, PP_ERR_LAYER, "optimizer failed");
    pp_stage_step(R.st[0], &f.b, NULL);
    CHECK(ends_with(pp_stage_error(R.st[0]), ": layer callback failed: rank 1: optimizer failed"), "%s",
          pp_stage_error(R.st[0]));
    pp_threads_reset(f.threads);
    t1.abort(t1.self, PP_ERR_NOMEM, NULL);
    pp_stage_step(R.st[0], &f.b, NULL);
    CHECK(ends_with(pp_stage_error(R.st[0]), ": out of memory: rank 1: gave no message"), "%s", pp_stage_error(R.st[0]));
    pp_threads_reset(f.threads);
    /* a rejected batch: the check's message with the rank, its code said once */
    b = f.b;
    b.n_seqs = 4;
    st = R.st[0];
    CHECK(pp_stage_step(st, &b, NULL) == PP_ERR_INVALID &&
              strcmp(pp_stage_error(st), "invalid argument: rank 0: n_seqs = 4 without cu_seqlens") == 0,
          "rejected batch: %s", pp_stage_error(st));
    pp_threads_reset(f.threads);
    for (r = 0; r < 2; r++) pp_stage_destroy(R.st[r]);
    fixture_free(&f);
}

/* Messages of the schedule paths: each fact once, and the constraint that refused. */
static void test_schedule_messages(void) {
    static const char* dup = "schedule p=2 v=1 m=2\nr0: F0 F1 B0 B1\nr1: F0 B0 F1 F1\n";
    static const char* no_w = "schedule p=2 v=1 m=2\nr0: F0 F1 B0 W0 B1 W1\nr1: F0 B0 F1 B1 W0\n";
    static const struct { pp_schedule_kind k; int v; const char* msg; } kinds[] = {
        {PP_SCHED_ZB_V, 3, "invalid argument: zb-v needs v = 2 chunks per rank (the two arms of the V), got v = 3"},
        {PP_SCHED_DUALPIPE_V, 1, "invalid argument: dualpipev needs v = 2 chunks per rank (the two arms of the V), got v = 1"},
        {PP_SCHED_GPIPE, 2, "invalid argument: gpipe needs v = 1 chunk per rank (got v = 2); use interleaved for v >= 2"},
        {PP_SCHED_ZB_H1, 3, "invalid argument: zb-h1 needs v = 1 chunk per rank (got v = 3); use interleaved for v >= 2"},
        {PP_SCHED_INTERLEAVED, 1, "invalid argument: interleaved needs v >= 2 chunks per rank (got v = 1); use 1f1b for v = 1"},
    };
    pp_action acts[64];
    pp_schedule s;
    pp_error err;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    mlp_model w, g;
    size_t need, i;
    /* pp_schedule_parse quoting the simulator: "invalid schedule" once */
    memset(&err, 0, sizeof err);
    CHECK(pp_schedule_parse(dup, strlen(dup), acts, 64, &need, &s, &err) == PP_ERR_SCHEDULE &&
              strcmp(err.msg, "invalid schedule: schedule table rejected (rank r is the line 'rN:'): rank 1 action #3: "
                              "duplicate F1.0 (stage 1), already at rank 1 #2") == 0,
          "parse: %s", err.msg);
    /* a missing W that changes a rank's action count: PP_ERR_SCHEDULE, as docs/errors.md says */
    memset(&err, 0, sizeof err);
    CHECK(pp_schedule_parse(no_w, strlen(no_w), acts, 64, &need, &s, &err) == PP_ERR_SCHEDULE &&
              strcmp(err.msg, "invalid schedule: schedule table line 3: rank 1 has 5 actions, rank 0 has 6") == 0,
          "parse, a missing W: %s %s", pp_result_str(err.code), err.msg);
    /* pp_pipeline_create: a kind with another v says what the kind needs */
    memset(&d, 0, sizeof d);
    memset(&w, 0, sizeof w);
    memset(&g, 0, sizeof g);
    d.model = mlp_model_desc();
    d.weights = &w;
    d.grads = &g;
    d.p = 2;
    for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        d.schedule = kinds[i].k;
        d.v = kinds[i].v;
        memset(&err, 0, sizeof err);
        CHECK(pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID && pl == NULL && strcmp(err.msg, kinds[i].msg) == 0,
              "%s v = %d: %s", pp_schedule_name(kinds[i].k), kinds[i].v, err.msg);
    }
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "overflow")) { /* what build/errors-controls runs */
        test_header_overflow();
        return TEST_DONE("errors (overflow)");
    }
    test_schedule_args();
    test_header_overflow();
    test_partition_args();
    test_partition_weights();
    test_stage_desc();
    test_batches();
    test_validation_audit();
    test_transport();
    test_failing_layer();
    test_message_shapes();
    test_schedule_messages();
    return TEST_DONE("errors");
}
