/* tests/test_reliability.c - what a hang or a failure tells you, and what it leaves behind.

   Covers: the flight record (every rank's recent actions; a timeout names this rank, the action,
   the awaited peer, and the last action each rank completed; the same with a transport that
   cannot see other ranks, from what this rank last heard); the NaN/Inf check (PP_ERR_NONFINITE
   on the checking rank, PP_ERR_ABORTED elsewhere, and a negative control without it); a failed
   step leaves no posted receive and, after pp_threads_reset, no message behind, and the next step
   equals the sequential reference bit for bit; a rejected batch on one rank stops the others. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <time.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

#define ROWS 24
#define IN 4
#define CLASSES 3
#define MAXP 3
static const int DIMS[MLP_DEPTH + 1] = {IN, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, CLASSES};

static void sleep_s(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* Layer hooks a test arms: stall (sleep) or fail or poison one (rank's layer, micro-batch). */
static int g_stall_layer = -1, g_stall_mb = -1;
static double g_stall_s = 0;
static int g_fail_layer = -1, g_fail_mb = -1;
static int g_nan_layer = -1, g_nan_mb = -1;     /* forward: a NaN at row 1, col 1 of its output, or its loss */
static int g_nan_b_layer = -1, g_nan_b_mb = -1; /* backward: a NaN at row 1, col 1 of its input gradient */
static int g_allow_nan_loss;                    /* world_init: pp_stage_desc.allow_nonfinite_loss per rank (bits) */

static int hooked_forward(const void* w, int l, pp_layer_io* io) {
    int rc;
    if (l == g_stall_layer && io->mb->index == g_stall_mb) sleep_s(g_stall_s);
    if (l == g_fail_layer && io->mb->index == g_fail_mb) return 7;
    rc = mlp_forward(w, l, io);
    if (rc == 0 && l == g_nan_layer && io->mb->index == g_nan_mb) {
        if (io->n_out > 0) ((float*)io->out[0].data)[io->out[0].cols + 1] = NAN; /* row 1, col 1 */
        else io->loss = NAN;
    }
    return rc;
}

static int hooked_backward(const void* w, void* g, int l, pp_layer_io* io) {
    int rc = mlp_backward(w, g, l, io);
    if (rc == 0 && l == g_nan_b_layer && io->mb->index == g_nan_b_mb && io->d_in[0].data)
        ((float*)io->d_in[0].data)[io->d_in[0].cols + 1] = NAN;
    return rc;
}

static void hooks_off(void) {
    g_stall_layer = g_stall_mb = g_fail_layer = g_fail_mb = g_nan_layer = g_nan_mb = g_nan_b_layer = g_nan_b_mb = -1;
    g_stall_s = 0;
}

typedef struct world {
    int p, m;
    mlp_model w, g[MAXP];
    float* wbuf;
    float* gbuf[MAXP];
    float x[ROWS * IN];
    int32_t y[ROWS];
    pp_batch b;
    pp_action acts[256];
    pp_schedule sched;
    int first[MAXP + 1];
    pp_threads* threads;
    hx_stages S;        /* the ranks' stages, results, messages, return times */
} world;

static void note_and_signal(void* self, const pp_flight_entry* e); /* test_flight_signal */

/* flight: 1 the threads transport's record hooks, 0 none (as a multi-process transport), 2 the
   threads hooks with a signal raised while a rank writes its record (test_flight_signal). */
static void world_init(world* W, int p, int m, double timeout_s, int flight, int check_finite) {
    pp_error err;
    int r;
    memset(W, 0, sizeof *W);
    W->p = p;
    W->m = m;
    W->wbuf = mlp_init(&W->w, NULL, DIMS, 11, NULL);
    hx_mlp_rank_grads(W->g, W->gbuf, p, DIMS);
    mlp_make_data(W->x, W->y, ROWS, IN, CLASSES, 3, 4);
    hx_dense_batch(&W->b, W->x, W->y, ROWS, IN, m);
    W->S.p = p;
    W->S.batch = &W->b;
    CHECK(pp_schedule_make(PP_SCHED_1F1B, p, 1, m, W->acts, 256, &W->sched, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_partition_uniform(MLP_DEPTH + 1, p, W->first, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_threads_create(p, &W->threads, &err) == PP_OK, "%s", err.msg);
    for (r = 0; r < p; r++) {
        pp_stage_desc d;
        memset(&d, 0, sizeof d);
        d.model = mlp_model_desc();
        d.model.forward = hooked_forward;
        d.model.backward = hooked_backward;
        d.weights = &W->w;
        d.grads = &W->g[r];
        d.schedule = &W->sched;
        d.partition = W->first;
        d.rank = r;
        d.transport = pp_threads_transport(W->threads, r);
        if (!flight) d.transport.flight_note = NULL, d.transport.flight_get = NULL;
        if (flight == 2) d.transport.flight_note = note_and_signal;
        d.timeout_s = timeout_s;
        d.check_finite = (check_finite >> r) & 1;
        d.allow_nonfinite_loss = (g_allow_nan_loss >> r) & 1;
        CHECK(pp_stage_create(&d, &W->S.st[r], &err) == PP_OK, "%s", err.msg);
    }
}

static void world_free(world* W) {
    int r;
    for (r = 0; r < W->p; r++) {
        pp_stage_destroy(W->S.st[r]);
        free(W->gbuf[r]);
    }
    free(W->wbuf);
    pp_threads_destroy(W->threads);
}

static void world_step(world* W) {
    pp_error err;
    hx_stages_step(&W->S, &err);
}

/* Gradients summed over ranks (each rank writes only its own layers) against the reference. */
static int world_grads_equal_reference(world* W) {
    pp_error err;
    int same = hx_mlp_sum_is_reference(&W->w, DIMS, 11, &W->b, W->gbuf, W->p, &err);
    CHECK(same >= 0, "%s", err.msg);
    return same == 1;
}

static void zero_grads(world* W) {
    int r;
    for (r = 0; r < W->p; r++) memset(W->gbuf[r], 0, mlp_param_count(DIMS) * sizeof(float));
}

/* The step after a failed one (and pp_threads_reset): clean on every rank, and its gradients
   equal the reference. */
static void world_step_clean(world* W, const char* what) {
    int r, bad = -1;
    zero_grads(W);
    world_step(W);
    for (r = W->p - 1; r >= 0; r--)
        if (W->S.rc[r] != PP_OK) bad = r;
    CHECK(bad < 0, "%s: rank %d: %s", what, bad, bad < 0 ? "" : W->S.msg[bad]);
    CHECK(world_grads_equal_reference(W), "%s: gradients differ from the reference", what);
}

static int posted_receives(pp_threads* t) {
    int r, n = 0;
    for (r = 0; r < t->n; r++) {
        _pp_post* p;
        pthread_mutex_lock(&t->box[r].mu);
        for (p = t->box[r].posted; p; p = p->next) n++;
        pthread_mutex_unlock(&t->box[r].mu);
    }
    return n;
}

/* --- a peer that stalls: the timeout names everything --------------------------------------- */
static void test_timeout_flight(int flight) {
    world W;
    pp_flight f;
    const pp_flight_entry* e;
    const double deadline = 0.25;
    char buf[8192];
    FILE* tmp;
    size_t n;
    world_init(&W, 2, 4, deadline, flight, 0);
    /* rank 0 (F0 F1 B0 F2 ...) stalls in its first layer on micro-batch 2 for 4 deadlines:
       rank 1 (F0 B0 F1 B1 F2 ...) times out waiting for F2.0's activation */
    hooks_off();
    g_stall_layer = 0;
    g_stall_mb = 2;
    g_stall_s = 4 * deadline;
    world_step(&W);
    CHECK(W.S.rc[1] == PP_ERR_TIMEOUT, "rank 1: %s (%s)", pp_result_str(W.S.rc[1]), W.S.msg[1]);
    CHECK(strstr(W.S.msg[1], "rank 1 at F2.0 (stage 1)") != NULL, "names this rank and the action: %s", W.S.msg[1]);
    CHECK(strstr(W.S.msg[1], "for rank 0") != NULL, "names the peer: %s", W.S.msg[1]);
    if (flight) {
        CHECK(strstr(W.S.msg[1], "last completed: rank 0: B0.0 (stage 0)") != NULL,
              "names the peer's last completed action: %s", W.S.msg[1]);
        CHECK(strstr(W.S.msg[1], "rank 1: B1.0 (stage 1)") != NULL, "and this rank's: %s", W.S.msg[1]);
    } else {
        CHECK(strstr(W.S.msg[1], "last completed: rank 1: B1.0 (stage 1)") != NULL, "this rank's last action: %s",
              W.S.msg[1]);
        CHECK(strstr(W.S.msg[1], "last heard from rank 0: its F1.0 (stage 0)") != NULL, "what it last heard: %s",
              W.S.msg[1]);
    }
    CHECK(W.S.rc[0] == PP_ERR_ABORTED, "the stalled rank is told when it wakes: %s (%s)", pp_result_str(W.S.rc[0]),
          W.S.msg[0]);
    /* rank 1's own record: ... B1 done, F2 started awaiting rank 0, F2 failed */
    CHECK(pp_stage_flight(W.S.st[1], &f) == PP_OK, "stage flight");
    e = pp_flight_last(&f, -1);
    CHECK(e && e->state == PP_FLIGHT_FAILED && e->a.op == PP_OP_F && e->a.mb == 2, "last entry: F2 failed");
    e = pp_flight_last(&f, PP_FLIGHT_START);
    CHECK(e && e->a.mb == 2 && e->peer == 0 && e->step == 1, "F2 started awaiting rank 0 in step 1");
    if (e) {
        /* from the start of the wait (the flight record's timestamp) to the step's return */
        double waited = W.S.t0 + W.S.t_ret[1] - e->t;
        CHECK(waited >= 0.95 * deadline && waited < 2 * deadline, "rank 1 waited %.3f s for a %.2f s deadline", waited,
              deadline);
    }
    e = pp_flight_last(&f, PP_FLIGHT_DONE);
    CHECK(e && e->a.op == PP_OP_B && e->a.mb == 1, "last done B1");
    CHECK(f.heard[0].peer == 0 && f.heard[0].a.mb == 1 && f.heard[0].a.stage == 0, "heard rank 0's F1");
    /* printed on demand */
    tmp = tmpfile();
    if (tmp) {
        if (flight)
            pp_threads_flight_print(tmp, W.threads);
        else if (pp_stage_flight(W.S.st[1], &f) == PP_OK)
            pp_flight_print(tmp, &f);
        rewind(tmp);
        n = fread(buf, 1, sizeof buf - 1, tmp);
        buf[n] = 0;
        fclose(tmp);
        CHECK(strstr(buf, "rank 1: flight record") && strstr(buf, "FAILED F2.0 (stage 1)"), "printed record:\n%s", buf);
        CHECK(!flight || strstr(buf, "rank 0: flight record"), "every rank printed:\n%s", buf);
        CHECK(strstr(buf, "last heard from rank 0 (previous stage): its F1.0 (stage 0)") != NULL, "heard:\n%s", buf);
    }
    /* the next step, after reset, is clean and exact */
    hooks_off();
    pp_threads_reset(W.threads);
    CHECK(pp_threads_pending(W.threads) == 0, "nothing pending after reset");
    world_step_clean(&W, "the step after a timeout");
    world_free(&W);
}

/* --- a failure mid-pipeline leaves no stale posting, and no message after reset ------------ */
static void test_no_stale(int cancel) {
    world W;
    int r, posted;
    world_init(&W, 3, 6, 5, 1, 0);
    if (!cancel)
        for (r = 0; r < 3; r++) pp_stage_destroy(W.S.st[r]), W.S.st[r] = NULL;
    if (!cancel) {
        /* negative control: a transport without cancel leaves the middle rank's posting */
        pp_error err;
        for (r = 0; r < 3; r++) {
            pp_stage_desc d;
            memset(&d, 0, sizeof d);
            d.model = mlp_model_desc();
            d.model.forward = hooked_forward;
        d.model.backward = hooked_backward;
            d.weights = &W.w;
            d.grads = &W.g[r];
            d.schedule = &W.sched;
            d.partition = W.first;
            d.rank = r;
            d.transport = pp_threads_transport(W.threads, r);
            d.transport.cancel = NULL;
            d.timeout_s = 5;
            CHECK(pp_stage_create(&d, &W.S.st[r], &err) == PP_OK, "%s", err.msg);
        }
    }
    /* rank 0 (F0 F1 F2 B0 ...) stalls in F2; the loss layer (rank 2) fails on micro-batch 0:
       rank 1 (F0 F1 B0 F2 ...) is then waiting for B0's gradient with the receive of F2's
       activation posted, and is aborted */
    hooks_off();
    g_stall_layer = 0;
    g_stall_mb = 2;
    g_stall_s = 0.2;
    g_fail_layer = MLP_DEPTH;
    g_fail_mb = 0;
    world_step(&W);
    CHECK(W.S.rc[2] == PP_ERR_LAYER, "failing rank: %s", W.S.msg[2]);
    CHECK(W.S.rc[0] == PP_ERR_ABORTED && W.S.rc[1] == PP_ERR_ABORTED, "others told: %s / %s", W.S.msg[0], W.S.msg[1]);
    posted = posted_receives(W.threads);
    if (cancel) {
        /* until the user resets, every step stops at once instead of mixing with the old one */
        double t = hx_now();
        hooks_off();
        world_step(&W);
        t = hx_now() - t;
        CHECK(W.S.rc[0] == PP_ERR_ABORTED && W.S.rc[1] == PP_ERR_ABORTED && W.S.rc[2] == PP_ERR_ABORTED && t < 2,
              "a step before the reset: %s / %s / %s in %.2f s", W.S.msg[0], W.S.msg[1], W.S.msg[2], t);
        zero_grads(&W);
    }
    if (cancel) {
        CHECK(posted == 0, "a failed step leaves %d posted receives", posted);
    } else {
        CHECK(posted > 0, "negative control: without cancel a posting stays behind (%d)", posted);
    }
    pp_threads_reset(W.threads);
    CHECK(pp_threads_pending(W.threads) == 0, "reset leaves %zu messages", pp_threads_pending(W.threads));
    hooks_off();
    world_step_clean(&W, "the step after an abort");
    CHECK(pp_threads_pending(W.threads) == 0, "a clean step leaves nothing queued");
    world_free(&W);
}

/* --- NaN/Inf checks ---------------------------------------------------------------------------- */
/* A NaN loss fails the step by default, on every rank, naming the micro-batch; allow_nonfinite_loss
   lets it pass. check_finite names the layer that first wrote a NaN (forward or backward), not
   the stage's output. Negative controls: build/errors-controls (-DPP_TEST_NO_LOSS_CHECK: the
   default loss check off; -DPP_TEST_NO_LAYER_SCAN: only the stage's output and the input
   gradient it sends are scanned). */
static void test_nonfinite(void) {
    world W;
    float loss;
    /* rank 0 checks; its last layer writes a NaN on micro-batch 2 */
    world_init(&W, 2, 4, 5, 1, 1);
    hooks_off();
    g_nan_layer = W.first[1] - 1;
    g_nan_mb = 2;
    world_step(&W);
    CHECK(W.S.rc[0] == PP_ERR_NONFINITE, "checking rank: %s (%s)", pp_result_str(W.S.rc[0]), W.S.msg[0]);
    CHECK(strstr(W.S.msg[0], "F2.0 (stage 0)") && strstr(W.S.msg[0], "row 1, col 1") && strstr(W.S.msg[0], "micro-batch 2"),
          "names action and place: %s", W.S.msg[0]);
    CHECK(W.S.rc[1] == PP_ERR_ABORTED, "other rank: %s (%s)", pp_result_str(W.S.rc[1]), W.S.msg[1]);
    hooks_off();
    pp_threads_reset(W.threads);
    world_step_clean(&W, "the step after a NaN step");

    /* the NaN comes from layer 1, inside the stage: the message names layer 1, not the stage's
       output (layers 2 .. 5 carried the NaN on) */
    g_nan_layer = 1;
    g_nan_mb = 0;
    world_step(&W);
    CHECK(W.S.rc[0] == PP_ERR_NONFINITE && strstr(W.S.msg[0], "layer 1 (dense) forward wrote a NaN or Inf: output 0 [6 x 6] f32, "
                                                              "row 1, col 1, micro-batch 0"),
          "the layer that made it: %s", W.S.msg[0]);
    hooks_off();
    pp_threads_reset(W.threads);
    world_step_clean(&W, "the step after a NaN step");

    /* backward: layer 2's input gradient (layers 1 and 0 carry it to the stage's input) */
    g_nan_b_layer = 2;
    g_nan_b_mb = 3;
    world_step(&W);
    CHECK(W.S.rc[0] == PP_ERR_NONFINITE && strstr(W.S.msg[0], "B3.0 (stage 0)") &&
              strstr(W.S.msg[0], "layer 2 (dense) backward wrote a NaN or Inf: input gradient 0 [6 x 6] f32, row 1, col 1"),
          "backward: the layer that made it: %s", W.S.msg[0]);
    hooks_off();
    pp_threads_reset(W.threads);
    world_free(&W);

    /* rank 1 checks everything: the NaN from rank 0 reaches it in its input */
    world_init(&W, 2, 4, 5, 1, 2);
    g_nan_layer = 0;
    g_nan_mb = 3;
    world_step(&W);
    CHECK(W.S.rc[1] == PP_ERR_NONFINITE && strstr(W.S.msg[1], "F3.0") && strstr(W.S.msg[1], "the input from stage 0"),
          "last stage: %s", W.S.msg[1]);
    CHECK(W.S.rc[0] == PP_ERR_ABORTED, "first stage told: %s", W.S.msg[0]);
    hooks_off();
    pp_threads_reset(W.threads);
    /* the loss layer itself makes the NaN from finite logits */
    g_nan_layer = MLP_DEPTH;
    g_nan_mb = 1;
    world_step(&W);
    CHECK(W.S.rc[1] == PP_ERR_NONFINITE && strstr(W.S.msg[1], "the loss of micro-batch 1 is nan: layer 11 (xent) made it"),
          "the loss layer: %s", W.S.msg[1]);
    hooks_off();
    world_free(&W);

    /* by default (no check_finite) the loss is checked: every rank fails, naming the micro-batch */
    world_init(&W, 2, 4, 5, 1, 0);
    g_nan_layer = 0;
    g_nan_mb = 3;
    world_step(&W);
    CHECK(W.S.rc[1] == PP_ERR_NONFINITE && strstr(W.S.msg[1], "F3.0 (stage 1): the loss of micro-batch 3 is nan") &&
              strstr(W.S.msg[1], "allow_nonfinite_loss"),
          "default loss check, last stage: %s: %s", pp_result_str(W.S.rc[1]), W.S.msg[1]);
    CHECK(W.S.rc[0] == PP_ERR_ABORTED && strstr(W.S.msg[0], "the loss of micro-batch 3"), "default loss check, rank 0: %s: %s",
          pp_result_str(W.S.rc[0]), W.S.msg[0]);
    hooks_off();
    pp_threads_reset(W.threads);
    world_step_clean(&W, "the step after a NaN loss");
    world_free(&W);

    /* allow_nonfinite_loss: the step runs and its loss is NaN */
    g_allow_nan_loss = 3;
    world_init(&W, 2, 4, 5, 1, 0);
    g_allow_nan_loss = 0;
    g_nan_layer = 0;
    g_nan_mb = 3;
    W.S.keep_stats = 1;
    world_step(&W);
    loss = W.S.stats[1].loss;
    CHECK(W.S.rc[0] == PP_OK && W.S.rc[1] == PP_OK && W.S.stats[1].has_loss && loss != loss,
          "allowed: the step runs with a NaN loss (%s / %s, loss %g)", W.S.msg[0], W.S.msg[1], (double)loss);
    hooks_off();
    world_free(&W);
}

/* --- a batch one rank rejects stops the others at once ------------------------------------- */
static void test_rejected_batch(void) {
    world W;
    pp_batch bad;
    world_init(&W, 2, 4, 30, 1, 0);
    hooks_off();
    bad = W.b;
    bad.targets = NULL; /* the last stage needs targets */
    W.S.batch_of[1] = &bad;
    world_step(&W);
    W.S.batch_of[1] = NULL;
    CHECK(W.S.rc[1] == PP_ERR_INVALID, "rejecting rank: %s", W.S.msg[1]);
    CHECK(W.S.rc[0] == PP_ERR_ABORTED && W.S.t_ret[0] < 5, "other rank told in %.2f s (deadline 30): %s", W.S.t_ret[0],
          W.S.msg[0]);
    pp_threads_reset(W.threads);
    world_step_clean(&W, "the step after a rejected batch");
    world_free(&W);
}

/* --- BROADCAST: the root never sends the step metadata ------------------------------------ */
static void test_broadcast_timeout(void) {
    world W;
    pp_stage_desc d;
    pp_stage* st;
    pp_error err;
    pp_result rc;
    double t;
    world_init(&W, 2, 4, 0.2, 1, 0);
    hx_stage_desc(&d, NULL, mlp_model_desc(), &W.w, &W.g[1], &W.sched, W.first, 1, pp_threads_transport(W.threads, 1));
    d.timeout_s = 0.2;
    d.shapes = PP_SHAPES_BROADCAST;
    CHECK(pp_stage_create(&d, &st, &err) == PP_OK, "%s", err.msg);
    t = hx_now();
    rc = pp_stage_step(st, &W.b, NULL); /* rank 0 never steps */
    t = hx_now() - t;
    CHECK(rc == PP_ERR_TIMEOUT && t < 0.4, "%s after %.3f s: %s", pp_result_str(rc), t, pp_stage_error(st));
    CHECK(strstr(pp_stage_error(st), "step's identity") && strstr(pp_stage_error(st), "rank 0: nothing yet"),
          "names what it waited for: %s", pp_stage_error(st));
    /* the transport's timeout message, quoted, loses its code and this rank: each said once */
    CHECK(strncmp(pp_stage_error(st), "wait timed out: rank 1: waiting for the step's identity from rank 0: waited 0.2 s "
                  "for rank 0", 92) == 0 && !strstr(pp_stage_error(st) + 1, "wait timed out"),
          "one prefix: %s", pp_stage_error(st));
    pp_stage_destroy(st);
    world_free(&W);
}

/* --- the flight record printed from a signal handler, while the steps run ------------------ */
/* The handler prints every rank's record with pp_threads_flight_print_fd. Signals come from a
   thread (to whichever rank thread runs) and from the ranks themselves, raised in the middle of
   writing their record. locked = 1 is the negative control: the record's writer holds a lock
   that the handler takes too, as pp_threads_flight_print did before it was lock-free; the first
   raised signal then deadlocks. Everything runs in a child under alarm(), so a deadlock is a
   failure here, not a hang. */
static pp_threads* volatile g_sig_world;
static int g_sig_fd = -1, g_sig_locked;
static int g_sig_handled;
static pthread_mutex_t g_old_mu = PTHREAD_MUTEX_INITIALIZER;
static long g_notes;
static int g_sig_stop;

static void on_usr1(int sig) {
    int saved = errno;
    (void)sig;
    if (g_sig_locked) pthread_mutex_lock(&g_old_mu);
    pp_threads_flight_print_fd(g_sig_fd, g_sig_world);
    if (g_sig_locked) pthread_mutex_unlock(&g_old_mu);
    __atomic_add_fetch(&g_sig_handled, 1, __ATOMIC_RELAXED);
    errno = saved;
}

static void note_and_signal(void* self, const pp_flight_entry* e) {
    if (g_sig_locked) pthread_mutex_lock(&g_old_mu);
    _pp_threads_flight_note(self, e);
    if (__atomic_add_fetch(&g_notes, 1, __ATOMIC_RELAXED) % 16 == 0) raise(SIGUSR1);
    if (g_sig_locked) pthread_mutex_unlock(&g_old_mu);
}

static void* signaller(void* arg) {
    int n = 0;
    (void)arg;
    while (!__atomic_load_n(&g_sig_stop, __ATOMIC_ACQUIRE)) {
        if (n++ < 500) kill(getpid(), SIGUSR1); /* at most 500, however slow the steps (valgrind) */
        sleep_s(300e-6);
    }
    return NULL;
}

/* Rank threads take SIGUSR1; the main and signalling threads block it (the ranks inherit the
   block from main and lift it here). */
static pp_result rank_step_sig(int rank, void* user) {
    sigset_t s;
    pp_result rc;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    rc = hx_stages_rank(rank, &((world*)user)->S);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    return rc;
}

static int flight_signal_child(int locked, int fd) {
    world W;
    pthread_t th;
    struct sigaction sa;
    sigset_t s;
    pp_error err;
    int step, bad = 0;
    g_sig_locked = locked;
    g_sig_fd = fd;
    world_init(&W, 3, 6, 10, 2, 0);
    g_sig_world = W.threads;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    pthread_create(&th, NULL, signaller, NULL);
    hooks_off();
    for (step = 0; step < 60; step++) {
        W.S.t0 = hx_now();
        pp_threads_run(W.p, rank_step_sig, &W, &err);
        if (W.S.rc[0] != PP_OK || W.S.rc[1] != PP_OK || W.S.rc[2] != PP_OK) bad++;
    }
    __atomic_store_n(&g_sig_stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    zero_grads(&W);
    world_step(&W);
    if (!world_grads_equal_reference(&W)) bad++;
    world_free(&W);
    return bad ? 1 : __atomic_load_n(&g_sig_handled, __ATOMIC_RELAXED) > 0 ? 0 : 2;
}

static void test_flight_signal(int locked) {
    FILE* out = tmpfile();
    pid_t pid;
    int status = 0, prints = 0, lines = 0, odd = 0;
    char line[256];
    CHECK(out != NULL, "tmpfile");
    if (!out) return;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        alarm(locked ? 3 : 60);
        _exit(flight_signal_child(locked, fileno(out)));
    }
    CHECK(pid > 0, "fork");
    waitpid(pid, &status, 0);
    if (locked) {
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM,
              "negative control: a handler that takes the writer's lock deadlocks (status %#x)", status);
        fclose(out);
        return;
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "60 steps under SIGUSR1 finish, OK and exact, and the handler ran (%s %d)",
          WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    rewind(out);
    while (fgets(line, sizeof line, out)) {
        lines++;
        if (strncmp(line, "rank 0: flight record, last ", 28) == 0) prints++;
        else if (!(strncmp(line, "rank ", 5) == 0 || strncmp(line, "  step ", 7) == 0 ||
                   strncmp(line, "  last heard from rank ", 23) == 0 ||
                   strcmp(line, "  (entry overwritten while read)\n") == 0))
            if (odd++ == 0) printf("first odd line: %s", line);
    }
    fclose(out);
    printf("flight record printed %d times from SIGUSR1 during 60 steps (%d lines)\n", prints, lines);
    CHECK(prints >= 20, "the handler printed the record %d times", prints);
    CHECK(odd == 0, "every printed line is a header, an entry or a heard line");
}

/* The exact case of a signal that interrupts a rank while it writes its record: its lock held,
   the entry half written. The print skips that entry and returns; taking the lock would hang. */
static void test_flight_print_interrupted(void) {
    world W;
    FILE* out = tmpfile();
    char buf[16384];
    size_t n;
    _pp_fslot* fs;
    uint64_t i;
    world_init(&W, 2, 4, 10, 1, 0);
    hooks_off();
    world_step(&W);
    world_step(&W);
    world_step(&W);
    fs = &W.threads->flight[1];
    i = fs->n;
    CHECK(i > PP_FLIGHT_LEN, "the ring wrapped (%llu entries)", (unsigned long long)i);
    pthread_mutex_lock(&fs->mu);                  /* the interrupted writer holds it ... */
    fs->ring[i % PP_FLIGHT_LEN].seq = 2 * i + 1; /* ... and is writing entry i over entry i - LEN */
    if (out) {
        pid_t pid;
        int status = 0;
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            alarm(5);
            pp_threads_flight_print_fd(fileno(out), W.threads);
            _exit(0);
        }
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the print returns while the writer holds its lock (%#x)",
              status);
        rewind(out);
        n = fread(buf, 1, sizeof buf - 1, out);
        buf[n] = 0;
        fclose(out);
        CHECK(strstr(buf, "rank 0: flight record") && strstr(buf, "rank 1: flight record"), "both ranks:\n%s", buf);
        CHECK(strstr(buf, "rank 1: flight record, last 32 of ") && strstr(buf, "  (entry overwritten while read)\n"),
              "the entry being written is skipped:\n%s", buf);
    }
    fs->ring[i % PP_FLIGHT_LEN].seq = 2 * (i - PP_FLIGHT_LEN) + 2;
    pthread_mutex_unlock(&fs->mu);
    world_free(&W);
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "nonfinite")) { /* what the negative controls run */
        test_nonfinite();
        return TEST_DONE("reliability nonfinite");
    }
    test_timeout_flight(1);
    test_timeout_flight(0);
    test_no_stale(1);
    test_no_stale(0);
    test_nonfinite();
    test_rejected_batch();
    test_broadcast_timeout();
    test_flight_print_interrupted();
    test_flight_signal(0);
    test_flight_signal(1);
    return TEST_DONE("reliability");
}
