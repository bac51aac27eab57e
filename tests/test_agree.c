/* tests/test_agree.c - every rank agrees on every step (pipeline.h >>impl-stage-agree).

   Each rank gets its own copy of the weights struct (the same parameter buffers), so a layer
   hook can tell the ranks apart and misbehave on one of them:
   - describe disagrees between the two sides of a boundary (a dtype, a tensor count): both
     ranks fail at once (no deadline), the message names both views, and the next consistent
     step is bit-exact (nothing the broken step left queued is consumed);
   - a layer fails on one rank after the others finished their lists: no rank returns PP_OK (and
     on ZB-V, where the turn of the V hands blocks over, the next step is exact again);
   - a rank that skips a step: the others fail it (their deadline), and from the next step that
     every rank calls on, the ranks run together again, bit-exact;
   - a message of the agreement itself that cannot be posted or sent (on any rank, in any of its
     phases): every rank fails at once, says why, and the next step is exact.
   - ranks whose cu_seqlens differ at the same rows per micro-batch fail at once (LOCAL: the
     plan check; PER_MESSAGE and AUTO: the header), saying what differs.
   Negative controls (build/agree-controls, part of make test): the library built with
   -DPP_TEST_NO_PLAN_CHECK -DPP_TEST_NO_GEN (a failed step's leftovers are taken by the next) or
   -DPP_TEST_NO_PLAN_CHECK -DPP_TEST_NO_AGREE (ranks return PP_OK for a step another rank failed)
   or -DPP_TEST_NO_MB_CHECK (a layer sees a micro-batch that is not its input's) fails
   `test_agree controls`; -DPP_TEST_NO_GO (each rank keeps its own count of steps: after a
   skipped step they never agree again) fails `test_agree skew`; -DPP_TEST_NO_AGREE_ABORT (a
   rank whose agreement message failed does not stop the others) fails `test_agree fault`; -DPP_TEST_NO_SEQ_HASH (the plan check
   without the layouts) fails `test_agree seqbounds`. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <time.h>

#define ROWS 24
#define IN 4
#define CLASSES 3
#define MAXP 4
static const int DIMS[MLP_DEPTH + 1] = {IN, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, CLASSES};

/* --- hooks ---------------------------------------------------------------------------------- */
enum { ODD_NONE, ODD_DTYPE, ODD_COUNT };
static const void* g_odd_w;       /* the weights pointer of the rank that misbehaves */
static int g_odd_layer = -1, g_odd_mode = ODD_NONE;
static const void* g_fail_w;
static int g_fail_layer = -1, g_fail_mb = -1, g_fail_op = -1; /* op: 0 F, 1 B, 2 W */
static pp_model g_base;
static double g_deadline = 20.0; /* every world's timeout_s */

static void hook_describe(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    g_base.describe(w, l, mb, in, n_in, d);
    if (w != g_odd_w || l != g_odd_layer) return;
    if (g_odd_mode == ODD_DTYPE) d->out[0].dtype = PP_I32; /* same bytes, another type */
    if (g_odd_mode == ODD_COUNT) {
        d->out[1] = d->out[0];
        d->n_out = 2;
    }
}

static int hook_forward(const void* w, int l, pp_layer_io* io) {
    if (w == g_fail_w && l == g_fail_layer && io->mb->index == g_fail_mb && g_fail_op == 0) return 7;
    return g_base.forward(w, l, io);
}

static int hook_backward(const void* w, void* g, int l, pp_layer_io* io) {
    if (w == g_fail_w && l == g_fail_layer && io->mb->index == g_fail_mb && g_fail_op == 1) return 8;
    if (io->n_out > 0 && !io->d_out[0].data) return 0; /* an integer output: no gradient comes */
    return g_base.backward(w, g, l, io);
}

static int hook_wgrad(const void* w, void* g, int l, pp_layer_io* io) {
    if (w == g_fail_w && l == g_fail_layer && io->mb->index == g_fail_mb && g_fail_op == 2) return 9;
    if (io->n_out > 0 && !io->d_out[0].data) return 0;
    return g_base.weight_grad(w, g, l, io);
}

static void hooks_off(void) {
    g_odd_w = g_fail_w = NULL;
    g_odd_layer = g_fail_layer = g_fail_mb = g_fail_op = -1;
    g_odd_mode = ODD_NONE;
}

/* --- a world of p ranks on threads ---------------------------------------------------------- */
typedef struct world {
    int p, m;
    mlp_model w, wr[MAXP], g[MAXP];
    mlpz_model wz[MAXP], gz[MAXP];
    float* wbuf;
    float* gbuf[MAXP];
    float x[ROWS * IN];
    int32_t y[ROWS];
    pp_batch b;
    pp_action acts[512];
    pp_schedule sched;
    int first[MAXP * 2 + 1];
    pp_threads* threads;
    pp_stage* st[MAXP];
    pp_result rc[MAXP];
    pp_step_stats stats[MAXP];
    char msg[MAXP][512];
    double t_ret[MAXP];
    double t0;
    int steps[MAXP];  /* steps a rank runs per world_step (1 normally) */
    const pp_batch* b_of[MAXP]; /* a rank's own batch, where set */
} world;

static void world_init(world* W, pp_schedule_kind kind, int p, int v, int m, pp_shape_policy shapes, double timeout_s) {
    pp_error err;
    int r, split = kind == PP_SCHED_ZB_H1 || kind == PP_SCHED_ZB_V;
    memset(W, 0, sizeof *W);
    W->p = p;
    W->m = m;
    W->wbuf = mlp_init(&W->w, NULL, DIMS, 11, NULL);
    hx_mlp_rank_grads(W->g, W->gbuf, p, DIMS);
    for (r = 0; r < p; r++) {
        W->wr[r] = W->w; /* the same parameters, a pointer of its own */
        mlpz_from_mlp(&W->wz[r], &W->wr[r]);
        mlpz_from_mlp(&W->gz[r], &W->g[r]);
        W->steps[r] = 1;
    }
    mlp_make_data(W->x, W->y, ROWS, IN, CLASSES, 3, 4);
    W->b.m = m;
    W->b.input.data = W->x;
    W->b.input.rows = ROWS;
    W->b.input.cols = IN;
    W->b.input.dtype = PP_F32;
    W->b.targets = W->y;
    W->b.target_row_bytes = sizeof(int32_t);
    CHECK(pp_schedule_make(kind, p, v, m, W->acts, 512, &W->sched, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(MLP_DEPTH + 1, W->sched.n_stages, W->first, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_threads_create(p, &W->threads, &err) == PP_OK, "%s", err.msg);
    g_base = split ? mlpz_model_desc() : mlp_model_desc();
    for (r = 0; r < p; r++) {
        pp_stage_desc d;
        memset(&d, 0, sizeof d);
        d.model = g_base;
        d.model.describe = hook_describe;
        d.model.forward = hook_forward;
        d.model.backward = hook_backward;
        if (split) d.model.weight_grad = hook_wgrad;
        d.weights = split ? (const void*)&W->wz[r] : (const void*)&W->wr[r];
        d.grads = split ? (void*)&W->gz[r] : (void*)&W->g[r];
        d.schedule = &W->sched;
        d.partition = W->first;
        d.rank = r;
        d.shapes = shapes;
        d.transport = pp_threads_transport(W->threads, r);
        d.timeout_s = timeout_s;
        CHECK(pp_stage_create(&d, &W->st[r], &err) == PP_OK, "%s", err.msg);
    }
}

static const void* world_weights(world* W, int r) {
    return W->sched.kind == PP_SCHED_ZB_H1 || W->sched.kind == PP_SCHED_ZB_V ? (const void*)&W->wz[r]
                                                                             : (const void*)&W->wr[r];
}

static void world_free(world* W) {
    int r;
    for (r = 0; r < W->p; r++) {
        pp_stage_destroy(W->st[r]);
        free(W->gbuf[r]);
    }
    free(W->wbuf);
    pp_threads_destroy(W->threads);
}

static pp_result rank_step(int rank, void* user) {
    world* W = (world*)user;
    int i;
    for (i = 0; i < W->steps[rank]; i++)
        W->rc[rank] = pp_stage_step(W->st[rank], W->b_of[rank] ? W->b_of[rank] : &W->b, &W->stats[rank]);
    W->t_ret[rank] = _pp_now() - W->t0;
    snprintf(W->msg[rank], sizeof W->msg[rank], "%s", pp_stage_error(W->st[rank]));
    return W->rc[rank];
}

static void world_step(world* W) {
    pp_error err;
    W->t0 = _pp_now();
    pp_threads_run(W->p, rank_step, W, &err);
}

static void zero_grads(world* W) {
    int r;
    for (r = 0; r < W->p; r++) memset(W->gbuf[r], 0, mlp_param_count(DIMS) * sizeof(float));
}

/* Gradients summed over ranks against the sequential reference of one step. */
static int world_grads_exact(world* W) {
    pp_error err;
    int same = hx_mlp_sum_is_reference(&W->w, DIMS, 11, &W->b, W->gbuf, W->p, &err);
    CHECK(same >= 0, "%s", err.msg);
    return same == 1;
}

static int all_failed(const world* W) {
    int r;
    for (r = 0; r < W->p; r++)
        if (W->rc[r] == PP_OK) return 0;
    return 1;
}

static int all_ok(const world* W) {
    int r;
    for (r = 0; r < W->p; r++)
        if (W->rc[r] != PP_OK) return 0;
    return 1;
}

static double latest_return(const world* W) {
    double t = 0;
    int r;
    for (r = 0; r < W->p; r++)
        if (W->t_ret[r] > t) t = W->t_ret[r];
    return t;
}

static const char* first_msg(const world* W, const char* needle) {
    int r;
    for (r = 0; r < W->p; r++)
        if (strstr(W->msg[r], needle)) return W->msg[r];
    return NULL;
}

/* --- 1, 3: the two sides of a boundary disagree ---------------------------------------------- */
/* rank `odd` describes the boundary between stage 0 and 1 its own way (mode); every rank must
   fail within a second (the deadline is 20 s), and the next step, consistent again, must be
   bit-exact: nothing left queued by the broken step may be taken for its messages. */
static void test_disagree(pp_schedule_kind kind, int p, int v, int m, pp_shape_policy shapes, int odd, int mode) {
    world W;
    int r, step;
    char where[96];
    snprintf(where, sizeof where, "%s p=%d m=%d shapes=%d, rank %d %s", pp_schedule_name(kind), p, m, (int)shapes, odd,
             mode == ODD_DTYPE ? "says i32" : "says 2 tensors");
    world_init(&W, kind, p, v, m, shapes, g_deadline);
    for (step = 0; step < 3; step++) {
        hooks_off();
        if (step == 0) {
            g_odd_w = world_weights(&W, odd);
            g_odd_layer = W.first[1] - 1; /* the last layer of stage 0: its output crosses */
            g_odd_mode = mode;
        }
        zero_grads(&W);
        world_step(&W);
        if (step == 0) {
            const char* both = first_msg(&W, "describe the tensors from stage 0 to stage 1");
            CHECK(all_failed(&W), "%s: the disagreeing step returned PP_OK on a rank: %s | %s", where, W.msg[0], W.msg[1]);
            CHECK(latest_return(&W) < 1.0, "%s: the last rank returned after %.2f s", where, latest_return(&W));
#ifndef PP_TEST_NO_PLAN_CHECK
            CHECK(both && strstr(both, mode == ODD_DTYPE ? "i32" : "2 tensors") && strstr(both, "1 tensor f32"),
                  "%s: no message names both views: %s | %s", where, W.msg[0], W.msg[1]);
            for (r = 0; r < p; r++) /* the ranks that saw it say PP_ERR_SIZE, the others were stopped */
                if (W.rc[r] != PP_ERR_ABORTED && W.rc[r] != PP_ERR_SIZE) break;
            CHECK(r == p, "%s: rank %d: %s", where, r < p ? r : 0, W.msg[r < p ? r : 0]);
#else
            (void)both, (void)r;
#endif
            pp_threads_reset(W.threads);
        } else {
            CHECK(all_ok(&W), "%s: step %d after it: %s | %s", where, step, W.msg[0], W.msg[1]);
            CHECK(world_grads_exact(&W), "%s: step %d after it: gradients differ from the reference", where, step);
        }
    }
    world_free(&W);
}

/* A disagreement the plan check does not see (the library built without it), or a message left
   over for any reason: the agreement's message counts catch it at step end, on every rank, and
   the tags' generation keeps the leftovers out of the next step. Here without a reset between
   the steps: what the broken step left stays queued in the transport. */
static void test_leftover_kept(void) {
    world W;
    int step;
    world_init(&W, PP_SCHED_1F1B, 2, 1, 2, PP_SHAPES_LOCAL, g_deadline);
    for (step = 0; step < 3; step++) {
        hooks_off();
        if (step == 0) {
            g_odd_w = world_weights(&W, 0); /* the sender says i32: it takes no gradient back */
            g_odd_layer = W.first[1] - 1;
            g_odd_mode = ODD_DTYPE;
        }
        mlp_make_data(W.x, W.y, ROWS, IN, CLASSES, 3 + step, 4); /* a stale gradient is a wrong one */
        zero_grads(&W);
        world_step(&W);
        if (step == 0) {
            CHECK(all_failed(&W), "leftover: the disagreeing step returned PP_OK: %s | %s", W.msg[0], W.msg[1]);
            CHECK(latest_return(&W) < 1.0, "leftover: returned after %.2f s", latest_return(&W));
            /* PP_ERR_SIZE from the plan check or rank 0's verdict; PP_ERR_ABORTED where the other rank was first */
            CHECK((W.rc[0] == PP_ERR_SIZE || W.rc[0] == PP_ERR_ABORTED) && (W.rc[1] == PP_ERR_SIZE || W.rc[1] == PP_ERR_ABORTED),
                  "leftover: %s | %s", W.msg[0], W.msg[1]);
        } else {
            CHECK(all_ok(&W), "leftover: step %d: %s | %s", step, W.msg[0], W.msg[1]);
            CHECK(world_grads_exact(&W), "leftover: step %d: gradients differ from the reference (a stale message "
                  "was taken)", step);
        }
#ifndef PP_TEST_NO_PLAN_CHECK
        if (step == 0) pp_threads_reset(W.threads); /* the plan check aborted the world */
#endif
    }
    world_free(&W);
}

/* --- 2: a failure after the other ranks finished their lists --------------------------------- */
static void test_late_failure(pp_schedule_kind kind, int p, int m, int fail_rank, int op, int layer, int mb, int runs) {
    world W;
    int run, bad = 0, slow = 0;
    char where[96];
    snprintf(where, sizeof where, "%s p=%d m=%d: %c%d fails on rank %d (layer %d)", pp_schedule_name(kind), p, m,
             "FBW"[op], mb, fail_rank, layer);
    world_init(&W, kind, p, pp_schedule_size(kind, p, 1, m) ? 1 : 2, m, PP_SHAPES_LOCAL, g_deadline);
    for (run = 0; run < runs; run++) {
        hooks_off();
        g_fail_w = world_weights(&W, fail_rank);
        g_fail_layer = layer;
        g_fail_mb = mb;
        g_fail_op = op;
        zero_grads(&W);
        world_step(&W);
        if (!all_failed(&W)) {
            if (!bad) CHECK(0, "%s: run %d: a rank returned PP_OK: %s | %s", where, run, W.msg[0], W.msg[p - 1]);
            bad++;
        }
        if (latest_return(&W) > 1.0) slow++;
        pp_threads_reset(W.threads);
    }
    CHECK(bad == 0, "%s: %d of %d runs had a rank return PP_OK", where, bad, runs);
    CHECK(slow == 0, "%s: %d of %d runs took more than a second", where, slow, runs);
    hooks_off();
    zero_grads(&W);
    world_step(&W);
    CHECK(all_ok(&W) && world_grads_exact(&W), "%s: the step after: %s", where, W.msg[0]);
    world_free(&W);
}

/* --- ranks at different steps: they resynchronise ------------------------------------------ */
/* A rank skips a step (its caller did not call): the others run into their deadline, as they
   must. From then on the ranks' own counts differ, but the step's identity comes from rank 0
   at every step start (_pp_go): the next step that every rank calls runs, bit-exact, and so do
   the ones after it. Whichever rank skipped (rank 0 too), on every shape policy. */
static void test_step_skew(pp_schedule_kind kind, int p, pp_shape_policy shapes, int skipper) {
    world W;
    int step, r;
    char where[96];
    snprintf(where, sizeof where, "skew: %s p=%d shapes=%d, rank %d skips step 0", pp_schedule_name(kind), p, (int)shapes,
             skipper);
    world_init(&W, kind, p, pp_schedule_size(kind, p, 1, 4) ? 1 : 2, 4, shapes, 0.3);
    W.steps[skipper] = 0;
    world_step(&W);
    for (r = 0; r < p; r++)
        if (r != skipper) CHECK(W.rc[r] != PP_OK, "%s: rank %d returned PP_OK", where, r);
    pp_threads_reset(W.threads);
    W.steps[skipper] = 1;
    for (step = 1; step < 4; step++) {
        mlp_make_data(W.x, W.y, ROWS, IN, CLASSES, 3 + step, 4);
        zero_grads(&W);
        world_step(&W);
        CHECK(all_ok(&W), "%s: step %d: %s | %s", where, step, W.msg[0], W.msg[p - 1]);
        if (all_ok(&W)) CHECK(world_grads_exact(&W), "%s: step %d: gradients differ from the reference", where, step);
        if (!all_ok(&W)) pp_threads_reset(W.threads);
    }
    world_free(&W);
}

/* --- the agreement's own messages fail --------------------------------------------------------- */
/* A transport that fails one operation once: on rank g_fl_rank, a send (op 0) or a receive post
   (op 1) of tag g_fl_tag. Every rank must fail the step within a second (none waits into the
   deadline of 20 s), the message must say what failed, and the next step must be exact. */
typedef struct flaky {
    pp_transport inner;
} flaky;
static int g_fl_rank = -1, g_fl_tag, g_fl_op;
static pthread_mutex_t g_fl_mu = PTHREAD_MUTEX_INITIALIZER;
static int fl_fire(int rank, int tag, int op) {
    int hit;
    pthread_mutex_lock(&g_fl_mu);
    hit = rank == g_fl_rank && tag == g_fl_tag && op == g_fl_op;
    if (hit) g_fl_rank = -1;
    pthread_mutex_unlock(&g_fl_mu);
    return hit;
}
static pp_result fl_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    flaky* f = (flaky*)self;
    if (fl_fire(f->inner.rank, tag, 0)) {
        memset(req, 0, sizeof *req);
        return PP_ERR_NOMEM;
    }
    return f->inner.isend(f->inner.self, peer, tag, buf, bytes, req);
}
static pp_result fl_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    flaky* f = (flaky*)self;
    if (fl_fire(f->inner.rank, tag, 1)) {
        memset(req, 0, sizeof *req);
        return PP_ERR_NOMEM;
    }
    return f->inner.irecv(f->inner.self, peer, tag, buf, bytes, req);
}

static void test_agree_fault(int rank, int tag, int op, const char* needle) {
    world W;
    flaky fl[MAXP];
    int r, step;
    char where[96];
    snprintf(where, sizeof where, "fault: rank %d %s tag %#x", rank, op ? "posts the receive of" : "sends", tag);
    world_init(&W, PP_SCHED_1F1B, 4, 1, 8, PP_SHAPES_PER_MESSAGE, g_deadline);
    for (r = 0; r < W.p; r++) { /* the stages' transports, wrapped */
        pp_transport* t = &W.st[r]->d.transport;
        fl[r].inner = *t;
        t->self = &fl[r];
        t->isend = fl_isend;
        t->irecv = fl_irecv;
        t->wait = hx_fw_wait;
        t->test = hx_fw_test;
        t->abort = hx_fw_abort;
        t->cancel = hx_fw_cancel;
        t->abort_reason = hx_fw_abort_reason;
        t->flight_note = NULL;
        t->flight_get = NULL;
    }
    for (step = 0; step < 3; step++) {
        if (step == 0) {
            pthread_mutex_lock(&g_fl_mu);
            g_fl_rank = rank;
            g_fl_tag = tag;
            g_fl_op = op;
            pthread_mutex_unlock(&g_fl_mu);
        }
        zero_grads(&W);
        world_step(&W);
        if (step == 0) {
            CHECK(all_failed(&W), "%s: a rank returned PP_OK: %s | %s | %s | %s", where, W.msg[0], W.msg[1], W.msg[2], W.msg[3]);
            CHECK(latest_return(&W) < 1.0, "%s: the last rank returned after %.2f s", where, latest_return(&W));
            CHECK(first_msg(&W, needle) != NULL, "%s: no message says \"%s\": %s | %s | %s | %s", where, needle, W.msg[0],
                  W.msg[1], W.msg[2], W.msg[3]);
            for (r = 0; r < W.p; r++) {
                const char* c = strrchr(W.msg[r], ':');
                CHECK(c && c[1] == ' ' && c[2], "%s: rank %d's message ends empty: %s", where, r, W.msg[r]);
            }
        } else {
            CHECK(all_ok(&W), "%s: step %d after it: %s | %s", where, step, W.msg[0], W.msg[1]);
            if (all_ok(&W)) CHECK(world_grads_exact(&W), "%s: step %d after it: gradients differ", where, step);
        }
        pp_threads_reset(W.threads);
    }
    world_free(&W);
}

/* --- 4: PER_MESSAGE / AUTO: the receiver's micro-batch must be the sender's ---------------- */
/* Rank 1 gets the batch without cu_seqlens (its micro-batches split by rows, not sequences):
   its layers would see an io->mb that disagrees with the activations. Every rank must fail,
   naming the two layouts; with the same batch on both ranks the step is exact. */
static void test_mb_view(pp_shape_policy shapes) {
    static const int32_t cu[4] = {0, 5, 13, ROWS};
    world W;
    pp_batch flat;
    world_init(&W, PP_SCHED_1F1B, 2, 1, 2, shapes, g_deadline);
    W.b.cu_seqlens = cu;
    W.b.n_seqs = 3;
    flat = W.b;
    flat.cu_seqlens = NULL;
    flat.n_seqs = 0;
    W.b_of[1] = &flat;
    world_step(&W);
    CHECK(all_failed(&W) && first_msg(&W, "sent it as") && first_msg(&W, "(no cu_seqlens)"),
          "shapes=%d: a micro-batch other than the sender's: %s | %s", (int)shapes, W.msg[0], W.msg[1]);
    pp_threads_reset(W.threads);
    W.b_of[1] = NULL;
    zero_grads(&W);
    world_step(&W);
    CHECK(all_ok(&W) && world_grads_exact(&W), "shapes=%d: the same batch: %s | %s", (int)shapes, W.msg[0], W.msg[1]);
    world_free(&W);
}

/* --- 5: ranks that split the batch into other sequences, with the same rows ------------------ */
/* Rank `odd` holds cu_seqlens {0, 2, 4, 9, 10, 24}, the others {0, 3, 4, 9, 10, 24}: micro-batch
   0 is 9 rows in 3 sequences on every rank, so every boundary's shapes agree, but the odd rank's
   layers would read other sequence bounds. Every rank must fail at once (the deadline is 20 s),
   a message naming both ranks, the micro-batch and both layouts; with the same cu_seqlens the
   step is bit-exact. LOCAL: the plan check carries each micro-batch's layout (negative control
   build/agree-ctl-noseqhash: -DPP_TEST_NO_SEQ_HASH, the shapes only, and every rank returned
   PP_OK); PER_MESSAGE: the header's, whose message showed both sides alike ("9 rows, 3 sequences
   here, rank 0 sent it as 9 rows, 3 sequences"). */
static void test_seq_bounds(pp_schedule_kind kind, int p, int odd, pp_shape_policy shapes) {
    static const int32_t cu[6] = {0, 3, 4, 9, 10, ROWS}, cu_odd[6] = {0, 2, 4, 9, 10, ROWS};
    world W;
    pp_batch other;
    const char* msg;
    int r;
    char where[64], both[32];
    snprintf(where, sizeof where, "%s p=%d shapes=%d, rank %d's cu_seqlens", pp_schedule_name(kind), p, (int)shapes, odd);
    world_init(&W, kind, p, pp_schedule_kind_v(kind, 2), 2, shapes, g_deadline);
    W.b.cu_seqlens = cu;
    W.b.n_seqs = 5;
    other = W.b;
    other.cu_seqlens = cu_odd;
    W.b_of[odd] = &other;
    world_step(&W);
    CHECK(all_failed(&W), "%s: a rank returned PP_OK: %s | %s", where, W.msg[0], W.msg[p - 1]);
    CHECK(latest_return(&W) < 1.0, "%s: the last rank returned after %.2f s", where, latest_return(&W));
    for (r = 0; r < p; r++) /* the ranks that saw it say PP_ERR_INVALID, the others were stopped */
        CHECK(W.rc[r] == PP_ERR_INVALID || W.rc[r] == PP_ERR_ABORTED, "%s: rank %d: %s", where, r, W.msg[r]);
    if (shapes == PP_SHAPES_LOCAL) {
        int named = 0, k;
        msg = first_msg(&W, "disagree on the sequence bounds of micro-batch 0");
        for (k = 0; k < 4 && msg; k++) { /* "ranks 2 and 1", "ranks 1 and 2", ... */
            int nb = k & 1 ? odd + 1 : odd - 1;
            snprintf(both, sizeof both, "ranks %d and %d", k & 2 ? nb : odd, k & 2 ? odd : nb);
            named |= nb >= 0 && nb < p && strstr(msg, both) != NULL;
        }
        CHECK(msg && named && strstr(msg, "(the same 9 rows)") &&
                  (strstr(msg, "3 sequences {0, 2, 4, 9}") || strstr(msg, "3 sequences {0, 3, 4, 9}")) &&
                  strstr(msg, "3 sequences at other bounds"),
              "%s: no message names both ranks, the micro-batch and both layouts: %s | %s", where, W.msg[0], W.msg[p - 1]);
    } else {
        msg = first_msg(&W, "9 rows, 3 sequences at other bounds");
        CHECK(msg && strstr(msg, "micro-batch 0 is 9 rows, 3 sequences {0, ") && strstr(msg, ", 4, 9} here"),
              "%s: the message does not say what differs: %s | %s", where, W.msg[0], W.msg[p - 1]);
    }
    pp_threads_reset(W.threads);
    W.b_of[odd] = NULL;
    zero_grads(&W);
    world_step(&W);
    CHECK(all_ok(&W) && world_grads_exact(&W), "%s: the same cu_seqlens: %s | %s", where, W.msg[0], W.msg[p - 1]);
    world_free(&W);
}

/* --- the cost: messages per step ------------------------------------------------------------- */
static void test_cost(void) {
    world W;
    int r;
    uint64_t msgs = 0;
    world_init(&W, PP_SCHED_1F1B, 4, 1, 8, PP_SHAPES_LOCAL, 20.0);
    world_step(&W);
    for (r = 0; r < 4; r++) msgs += W.stats[r].agree_msgs;
    /* plan check: one per neighbour pair and direction, 2 (p - 1); the step identity from rank 0,
       p - 1; agreement: 2 (p - 1) */
    CHECK(all_ok(&W) && msgs == 15, "cost: %llu agreement messages per step at p = 4, want 15",
          (unsigned long long)msgs);
    world_free(&W);
}

int main(int argc, char** argv) {
    int odd;
    if (argc > 1 && !strcmp(argv[1], "seqbounds")) { /* what build/agree-ctl-noseqhash runs */
        test_seq_bounds(PP_SCHED_1F1B, 2, 1, PP_SHAPES_LOCAL);
        return TEST_DONE("agree (sequence bounds)");
    }
    if (argc > 1 && !strcmp(argv[1], "controls")) { /* the quick part the negative controls run */
        g_deadline = 1.0; /* a broken library runs into deadlines: keep them short */
        test_leftover_kept();
        test_late_failure(PP_SCHED_ZB_H1, 4, 4, 0, 2, 0, 3, 3);
        test_mb_view(PP_SHAPES_PER_MESSAGE);
        return TEST_DONE("agree (controls part)");
    }
    if (argc > 1 && !strcmp(argv[1], "skew")) { /* the control without the step identity (PP_TEST_NO_GO) */
        test_step_skew(PP_SCHED_1F1B, 3, PP_SHAPES_PER_MESSAGE, 2);
        test_step_skew(PP_SCHED_1F1B, 3, PP_SHAPES_LOCAL, 0);
        return TEST_DONE("agree (skew)");
    }
    if (argc > 1 && !strcmp(argv[1], "fault")) { /* the control without the agreement's abort */
        g_deadline = 2.0;
        test_agree_fault(2, _PP_TAG_AGREE, 0, "sending this rank's outcome");
        test_agree_fault(0, _PP_TAG_AGREE, 1, "could not post the receive of");
        return TEST_DONE("agree (fault)");
    }
    for (odd = 0; odd < 2; odd++) {
        test_disagree(PP_SCHED_1F1B, 2, 1, 2, PP_SHAPES_LOCAL, odd, ODD_DTYPE);
        test_disagree(PP_SCHED_1F1B, 2, 1, 2, PP_SHAPES_LOCAL, odd, ODD_COUNT);
        test_disagree(PP_SCHED_GPIPE, 3, 1, 4, PP_SHAPES_BROADCAST, odd, ODD_DTYPE);
        test_disagree(PP_SCHED_ZB_H1, 4, 1, 4, PP_SHAPES_LOCAL, odd, ODD_COUNT);
        test_disagree(PP_SCHED_INTERLEAVED, 2, 2, 4, PP_SHAPES_LOCAL, odd, ODD_DTYPE);
    }
    test_leftover_kept();
    /* ZB-H1: rank 0's last W (layer 0, the last micro-batch) fails after ranks 1..3 are done */
    test_late_failure(PP_SCHED_ZB_H1, 4, 4, 0, 2, 0, 3, 30);
    /* 1F1B p=3: B of micro-batch 2 fails on rank 0 (layer 1) */
    test_late_failure(PP_SCHED_1F1B, 3, 4, 0, 1, 1, 2, 90);
    test_late_failure(PP_SCHED_GPIPE, 2, 2, 1, 0, MLP_DEPTH, 1, 30);
    /* ZB-V p=2: on rank 1, which holds the turn of the V (stages 1 and 2), while blocks are
       handed over between them: stage 1's B (layer 4) and stage 2's W (layer 7) */
    test_late_failure(PP_SCHED_ZB_V, 2, 4, 1, 1, 4, 2, 10);
    test_late_failure(PP_SCHED_ZB_V, 2, 4, 1, 2, 7, 3, 10);
    {
        static const pp_shape_policy pols[] = {PP_SHAPES_LOCAL, PP_SHAPES_BROADCAST, PP_SHAPES_PER_MESSAGE, PP_SHAPES_AUTO};
        int i;
        for (i = 0; i < 4; i++) {
            test_step_skew(PP_SCHED_GPIPE, 2, pols[i], 1);
            test_step_skew(PP_SCHED_1F1B, 3, pols[i], 2);
            test_step_skew(PP_SCHED_1F1B, 3, pols[i], 0);
        }
        test_step_skew(PP_SCHED_ZB_V, 2, PP_SHAPES_AUTO, 1);
    }
    /* the agreement's own messages: a record not sent, a verdict receive not posted, a verdict
       not sent, a record receive not posted on rank 0, the step identity not sent or taken */
    test_agree_fault(2, _PP_TAG_AGREE, 0, "sending this rank's outcome");
    test_agree_fault(1, _PP_TAG_VERDICT, 1, "posting the receive of the verdict");
    test_agree_fault(0, _PP_TAG_VERDICT, 0, "could not send rank 1 the step's outcome");
    test_agree_fault(0, _PP_TAG_AGREE, 1, "could not post the receive of");
    test_agree_fault(0, _PP_TAG_GO, 0, "sending the step's identity");
    test_agree_fault(3, _PP_TAG_GO, 1, "posting the receive of the step's identity");
    test_mb_view(PP_SHAPES_PER_MESSAGE);
    test_mb_view(PP_SHAPES_AUTO);
    for (odd = 0; odd < 2; odd++) test_seq_bounds(PP_SCHED_1F1B, 2, odd, PP_SHAPES_LOCAL);
    test_seq_bounds(PP_SCHED_1F1B, 4, 2, PP_SHAPES_LOCAL);
    test_seq_bounds(PP_SCHED_INTERLEAVED, 2, 1, PP_SHAPES_LOCAL);
    test_seq_bounds(PP_SCHED_1F1B, 2, 1, PP_SHAPES_PER_MESSAGE);
    test_seq_bounds(PP_SCHED_1F1B, 4, 2, PP_SHAPES_AUTO);
    test_cost();
    return TEST_DONE("agree");
}
