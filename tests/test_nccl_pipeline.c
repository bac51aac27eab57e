/* tests/test_nccl_pipeline.c - pipeline_nccl.h with the real executor, through the NCCL
   imitation (tests/fakenccl over tests/fakecuda), without a GPU.

   Why it runs about a minute in every build (make test's run, 2026-12-07, three tests at a time:
   TSan 88 s, ASan 70 s, gcc 64 s, clang 53 s; gcc alone 50 s, of which 34 s on a core): much of
   it is waiting, not computing. The imitation delays every
   kernel launch by a millisecond (launch_delay_s, so that a missing stream order shows), the
   tables that must hang are run until their 1.5 s deadline, and the drained failures wait for
   their peers; the sanitizers' builds already take a rotation of the heavy cases (test_heavy).

   Every rank is a thread on its own imitation device with its own communicator (NCCL refuses
   two ranks of one communicator on one device), a one-rank pp_cuda for the device block pool
   and the compute stream, and a pp_nccl transport. The MLP (split backward) runs as imitation
   kernels on the compute stream. Checked, bit for bit against pp_sequential_step:
   - every built-in schedule (GPipe, 1F1B, interleaved v = 2 and 3, ZB-H1, ZB-V, and the 1F1B
     table written out by hand) x p in {2, 3, 4} x m in {1, p - 1, p, 2p + 1} x LOCAL and
     BROADCAST shapes, in rendezvous mode (a send completes only when its receive runs) and
     with eager small messages, with blocking and non-blocking communicators, and p = 8 once;
     ZB-H2, V-Half, V-Min, DualPipeV and interleaved-mem the same with LOCAL shapes; a schedule
     pp_nccl_check_order refuses is skipped (counted);
   - evaluations (pp_stage_eval, test_eval): train, evaluate, train bit-exact, the outputs the
     sequential evaluation's, every kind, p 2 to 4, rendezvous sends;
   - activation recomputation (pp_stage_desc.recompute, `recompute`): every other layer and every
     layer on 1F1B, interleaved, ZB-H1 and ZB-V at p = 2, 3, bit-exact;
   - a failing layer: every rank returns an error (the communicators are aborted), and a new
     communicator, transport and stage give a bit-exact next step;
   - a layer slower than the executor's block probes (2 s against 1 s) under a 5 s timeout: no
     probe aborts the communicator;
   - the transport alone: a host wait for a send whose group recorded no completion event
     returns only once the send is done, and a probe of it gives up at once where only a later
     group could answer; a receive into a block the stage released waits for the block's last
     reader on the compute stream (`sends`; negative controls build/nccl-ctl-eventless-done and
     build/nccl-ctl-released-now; build/nccl-ctl-zero-received, the executor zeroing received
     bytes before the receive, fails the matrix's interleaved p = 2).
   Negative controls: built with -DPP_NCCL_TEST_LATE_SENDS the transport issues sends only at its
   next wait (the deadlock the imitation found in the first NCCL transport), and with one channel
   instead of two (op->ch = 0 in pipeline_nccl.h) interleaved's neighbours wait for each other:
   the matrix fails either way (46 and 9 failures on 2026-11-26). PP_TEST_NCCL_ONE="KIND P V M"
   runs one case (as does `one KIND P V M [RUNS]`, RUNS times), PP_TEST_NCCL_RENDEZVOUS=1 the rendezvous check's tests alone;
   PP_TEST_NCCL_TIMEOUT sets the stage timeout (default 5 s). */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#ifdef PP_TEST_DEEP /* `p8`: every kind at p = 8, two chunks a rank: 16 stages need 16 layers or more */
#define MLP_DEPTH 17
#else
#define MLP_DEPTH 11
#endif
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"
#if defined(PP_TEST_REAL_CUDA) || defined(PP_TEST_STAGED_LAYERS)
#include "layer_staged.h" /* the layers as copies and host functions on the stream: runs on a GPU */
#else
#include "fakecuda/layer_kernels.h"
#endif
#ifndef FAKENCCL
/* Built against real NCCL and the CUDA runtime (make gpu-nccl: test_nccl_pipeline-gpu): the ranks
   are threads on the devices there are (several on one GPU: NCCL >= 2.30 with
   NCCL_MULTI_RANK_GPU_ENABLE=1), NCCL's own protocols (small sends complete eagerly) and lazy
   set-up; the imitation's switches and counters are not there. */
typedef struct fakenccl_options {
    size_t eager_bytes;
    int serialize_kernels;
    double launch_delay_s;
} fakenccl_options;
static void fakenccl_set_options(const fakenccl_options* o) { (void)o; }
static uint64_t fakenccl_thread_connects(void) { return 0; }
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 37
#define MAXP 8
#ifdef PP_TEST_DEEP
static const int DIMS[MLP_DEPTH + 1] = {HX_IN, 8, 7, 8, 9, 8, 6, 8, 8, 7, 8, 7, 8, 6, 8, 9, 8, HX_CLASSES};
#else
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
#endif

static float X[ROWS * HX_IN];
static int32_t Y[ROWS];
static mlp_model W0;
static mlpz_model W;
static float* WBUF;
static size_t NPAR;
static mlpz_model G[MAXP];
static float* GBUF[MAXP];
static float* GREF;
static int g_fail_rank = -1, g_fail_armed, g_slow_ms; /* set before the rank threads start */
static int g_fail_op;      /* where g_fail_rank's layer fails: 0 forward, 1 backward, 2 weight_grad */
static int g_channels;     /* pp_nccl_desc.channels (0: the transport's default, 8) */
/* `gpu P`, `gpu-matrix P` (tools/gpu_nccl.sh on one GPU): at most P ranks in a test (0: as many
   as each wants); g_say_times prints each case's step time (ranks are threads of one process,
   the only step times worth reading when ranks share a GPU) */
static int g_gpu_p, g_say_times;
static pp_model g_model; /* made once: layer_kernels_model keeps its base in a global */
static int g_skipped, g_eager, g_no_check; /* g_no_check: the stage skips the transport's schedule check */
static double g_timeout = 5;
static const unsigned char* g_rc; /* every rank's pp_stage_desc.recompute (test_recompute_nccl) */

typedef struct world {
    int p, m, blocking, steps;
    pp_shape_policy shapes;
    const pp_schedule* sched;
    ncclUniqueId id, id2;
    pp_result rc[MAXP][8];
    char msg[MAXP][800];
    int after_fail;             /* run a failing step, reset, then a clean one */
    int zero_after_fail;        /* after a failed step, zero the gradients and go on (drained) */
    double t_step[MAXP][8];     /* seconds each rank's step took */
    size_t pool_need[MAXP];     /* the last step's pp_step_stats.pool_need */
    int chans[MAXP], chans0[MAXP]; /* pp_nccl_channels after pp_stage_create, and before it */
    uint64_t late_connects[MAXP]; /* connection set-ups after pp_stage_create (fakenccl_thread_connects) */
    pp_nccl_stats nst[MAXP];    /* pp_nccl_get_stats after pp_stage_create */
    int skip_step_end;          /* pp_nccl_step_end after the last step only */
    int eval;                   /* after step 0: an evaluation (pp_stage_eval), outputs to ev_rank */
    int ev_rank;
    pp_result ev_rc[MAXP];
    int ev_peak[MAXP];
    char ev_msg[MAXP][800];
} world;

/* the evaluation's outputs (the logits), on w->ev_rank */
static float EV_OUT[ROWS * HX_CLASSES];

typedef struct rank_arg {
    world* w;
    int r;
} rank_arg;

/* 1 once: g_fail_rank's first call of operation op on micro-batch 0 (that rank's thread alone) */
static int fail_now(const pp_layer_io* io, int op) {
    const pp_cuda_layer_ctx* lc = (const pp_cuda_layer_ctx*)io->ctx;
    if (lc->rank != g_fail_rank || io->mb->index != 0 || !g_fail_armed || g_fail_op != op) return 0;
    g_fail_armed = 0;
    return 1;
}
/* PP_TEST_DEVICE_DELAY_US: every forward layer of rank 0 first holds its compute stream that
   long (a host function on the stream), so rank 0's compute stream runs behind the gradients
   rank 1 sends it: what nccl-ctl-zero-received needs to fail every time rather than by chance
   (its zeros, enqueued behind the forwards, then land after the gradient they must not wipe). */
static long g_dev_delay_us;
static void dev_delay(void* u) {
    struct timespec ts;
    (void)u;
    ts.tv_sec = g_dev_delay_us / 1000000L;
    ts.tv_nsec = (g_dev_delay_us % 1000000L) * 1000L;
    nanosleep(&ts, NULL);
}
static int fail_bwd(const void* w, void* g, int l, pp_layer_io* io) { return fail_now(io, 1) ? 7 : lk_bwd(w, g, l, io); }
static int fail_wgrad(const void* w, void* g, int l, pp_layer_io* io) { return fail_now(io, 2) ? 7 : lk_wgrad(w, g, l, io); }

static int slow_fwd(const void* w, int l, pp_layer_io* io) {
    if (fail_now(io, 0)) {
        return 7;
    }
    if (g_dev_delay_us && ((const pp_cuda_layer_ctx*)io->ctx)->rank == 0)
        cudaLaunchHostFunc(((const pp_cuda_layer_ctx*)io->ctx)->stream, dev_delay, NULL);
    if (g_slow_ms && l == 0 && io->mb->index == 0) { /* longer than the executor's 1 s probe */
        struct timespec ts;
        ts.tv_sec = g_slow_ms / 1000;
        ts.tv_nsec = (long)(g_slow_ms % 1000) * 1000000L;
        nanosleep(&ts, NULL);
    }
    return lk_fwd(w, l, io);
}

static pp_batch batch(int m) {
    pp_batch b;
    hx_dense_batch(&b, X, Y, ROWS, HX_IN, m);
    return b;
}

static void* rank_main(void* arg) {
    rank_arg* a = (rank_arg*)arg;
    world* w = a->w;
    int r = a->r, dev = r, first[64], s, ndev = 1;
    ncclComm_t comm = NULL;
    pp_cuda* c = NULL;
    pp_nccl* t = NULL;
    pp_stage* st = NULL;
    pp_error err;
    pp_cuda_desc cd;
    pp_nccl_desc nd;
    pp_stage_desc d;
    pp_cuda_layer_ctx lc;
    pp_batch b = batch(w->m);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    pp_result rc;
    err.msg[0] = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    dev = r % ndev; /* the imitation has eight; a GPU machine may have one */
    cudaSetDevice(dev);
    cfg.blocking = w->blocking;
    if (ncclCommInitRankConfig(&comm, w->p, w->id, r, &cfg) != ncclSuccess && !comm) {
        w->rc[r][0] = PP_ERR_TRANSPORT;
        snprintf(w->msg[r], sizeof w->msg[r], "ncclCommInitRankConfig failed");
        return NULL;
    }
    if (!w->blocking) {
        ncclResult_t as = ncclInProgress;
        while (ncclCommGetAsyncError(comm, &as) == ncclSuccess && as == ncclInProgress) {
        }
    }
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.devices = &dev;
    rc = pp_cuda_create(&cd, &c, &err);
    if (rc == PP_OK) rc = pp_cuda_bind(c, 0, &err);
    memset(&nd, 0, sizeof nd);
    nd.comm = comm;
    nd.compute = c ? pp_cuda_stream(c, 0) : NULL;
    nd.own_comm = 1;
    nd.channels = g_channels;
    if (rc == PP_OK) {
        rc = pp_nccl_create(&nd, &t, &err);
        /* refused: the communicator is still ours (after a failed set-up it was aborted) */
        if (rc != PP_OK && rc != PP_ERR_TIMEOUT && rc != PP_ERR_TRANSPORT) ncclCommDestroy(comm);
    } else {
        ncclCommDestroy(comm);
    }
    memset(&lc, 0, sizeof lc);
    lc.stream = nd.compute;
    lc.rank = r;
    lc.device = dev;
    memset(&d, 0, sizeof d);
    d.model = g_model;
    d.weights = &W;
    d.grads = &G[r];
    d.schedule = w->sched;
    d.rank = r;
    d.transport = pp_nccl_transport(t);
    if (g_no_check) d.transport.check_schedule = NULL;
    d.device = pp_cuda_device_ops(c, 0);
    d.layer_ctx = &lc;
    d.shapes = w->shapes;
    d.timeout_s = g_timeout;
    d.recompute = g_rc;
    d.partition = first;
    if (rc == PP_OK) rc = pp_partition_uniform(d.model.n_layers, w->sched->n_stages, first, &err);
    w->chans0[r] = pp_nccl_channels(t);
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    w->chans[r] = pp_nccl_channels(t);
    pp_nccl_get_stats(rc == PP_OK ? t : NULL, &w->nst[r]);
    if (rc != PP_OK) {
        w->rc[r][0] = rc;
        snprintf(w->msg[r], sizeof w->msg[r], "setup: %s", err.msg);
    } else {
        uint64_t connects0 = fakenccl_thread_connects();
        for (s = 0; s < w->steps; s++) {
            double t0 = hx_now();
            pp_step_stats stats;
            memset(&stats, 0, sizeof stats);
            rc = pp_stage_step(st, &b, &stats);
            w->pool_need[r] = stats.pool_need;
            if (rc == PP_OK && (!w->skip_step_end || s == w->steps - 1)) rc = pp_nccl_step_end(t, g_timeout, &err);
            else (void)pp_nccl_step_end(t, g_timeout, NULL);
            w->t_step[r][s] = hx_now() - t0;
            w->rc[r][s] = rc;
            if (w->eval && s == 0 && rc == PP_OK) { /* an evaluation between the two training steps */
                pp_eval_out o;
                memset(&o, 0, sizeof o);
                o.rank = w->ev_rank;
                o.data[0] = r == w->ev_rank ? EV_OUT : NULL;
                o.cap[0] = sizeof EV_OUT;
                w->ev_rc[r] = pp_stage_eval(st, &b, &o, &stats);
                w->ev_peak[r] = stats.peak_live;
                if (w->ev_rc[r] == PP_OK) w->ev_rc[r] = pp_nccl_step_end(t, g_timeout, &err);
                else (void)pp_nccl_step_end(t, g_timeout, NULL);
                if (w->ev_rc[r] != PP_OK) snprintf(w->ev_msg[r], sizeof w->ev_msg[r], "%.600s [transport: %.100s]", pp_stage_error(st), pp_nccl_error(t));
            }
            if (rc != PP_OK && w->zero_after_fail) memset(GBUF[r], 0, NPAR * sizeof(float));
            if (rc != PP_OK) snprintf(w->msg[r], sizeof w->msg[r], "step %d: %s [transport: %.100s]", s, pp_stage_error(st), pp_nccl_error(t));
            if (!w->after_fail) w->late_connects[r] = fakenccl_thread_connects() - connects0;
            if (w->after_fail && s == 0) {
                /* every rank comes here (the step failed everywhere, the communicators are
                   aborted): a new communicator from a new id, a new transport and stage */
                pp_result rr;
                ncclComm_t c2 = NULL;
                pp_stage_destroy(st);
                st = NULL;
                pp_nccl_destroy(t);
                t = NULL;
                memset(GBUF[r], 0, NPAR * sizeof(float));
                rr = ncclCommInitRank(&c2, w->p, w->id2, r) == ncclSuccess ? PP_OK : PP_ERR_TRANSPORT;
                nd.comm = c2;
                if (rr == PP_OK) rr = pp_nccl_create(&nd, &t, &err);
                d.transport = pp_nccl_transport(t);
                if (rr == PP_OK) rr = pp_stage_create(&d, &st, &err);
                if (rr != PP_OK) {
                    w->rc[r][1] = rr;
                    snprintf(w->msg[r], sizeof w->msg[r], "recreate: %s", err.msg);
                    break;
                }
            }
        }
    }
    pp_stage_destroy(st);
    pp_nccl_destroy(t);
    pp_cuda_destroy(c);
    return NULL;
}

/* runs the world; 1 when every rank's every step returned PP_OK */
static int run_world(world* w) {
    pthread_t th[MAXP];
    rank_arg arg[MAXP];
    int r, s, ok = 1;
    memset(w->rc, 0, sizeof w->rc);
    for (r = 0; r < w->p; r++) memset(GBUF[r], 0, NPAR * sizeof(float));
    ncclGetUniqueId(&w->id);
    ncclGetUniqueId(&w->id2);
    for (r = 0; r < w->p; r++) {
        arg[r].w = w;
        arg[r].r = r;
        pthread_create(&th[r], NULL, rank_main, &arg[r]);
    }
    for (r = 0; r < w->p; r++) pthread_join(th[r], NULL);
    for (r = 0; r < w->p; r++)
        for (s = 0; s < w->steps; s++)
            if (w->rc[r][s] != PP_OK) ok = 0;
    return ok;
}

static int grads_equal(int p) {
    size_t i;
    for (i = 0; i < NPAR; i++) {
        float s = 0;
        int r;
        for (r = 0; r < p; r++) s += GBUF[r][i];
        if (memcmp(&s, &GREF[i], sizeof s) != 0) return 0;
    }
    return 1;
}

/* the reference: `steps` sequential steps of m micro-batches */
static void reference(int m, int steps) {
    pp_model model = mlpz_model_desc();
    mlpz_model g;
    pp_batch b = batch(m);
    pp_error err;
    float loss;
    int s;
    g = G[MAXP - 1];
    memset(GBUF[MAXP - 1], 0, NPAR * sizeof(float));
    for (s = 0; s < steps; s++) pp_sequential_step(&model, &W, &g, &b, &loss, &err);
    memcpy(GREF, GBUF[MAXP - 1], NPAR * sizeof(float));
}

/* The fewest channels (1, 2, 4, 8; at most 4 with two ranks) whose order and rendezvous checks
   the schedule passes: what the transport's default picks. */
static int g_chans_used[9];
static int fewest_channels(const pp_schedule* sc, int p) {
    int n, most = p > 2 ? 8 : 4;
    for (n = 1; n < most; n *= 2)
        if (_ppn_check_channels(sc, n, NULL) == PP_OK) break;
    return n;
}

static void run_case(pp_schedule_kind kind, int p, int v, int m, pp_shape_policy shapes, int blocking, const pp_schedule* custom) {
    world w;
    pp_action* acts = NULL;
    pp_schedule sc;
    pp_error err;
    char where[160];
    size_t n;
    int r, ok;
    memset(&w, 0, sizeof w);
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s %s%s", custom ? "table" : pp_schedule_name(kind), p, v, m,
             shapes == PP_SHAPES_LOCAL ? "LOCAL" : "BROADCAST", blocking ? "blocking" : "non-blocking",
             g_eager ? " eager" : "");
    if (custom) {
        sc = *custom;
    } else {
        n = pp_schedule_size(kind, p, v, m);
        acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
        if (!acts || pp_schedule_make(kind, p, v, m, acts, n, &sc, &err) != PP_OK) {
            free(acts);
            return; /* not a schedule (m too small for the kind): nothing to run */
        }
    }
    if (pp_nccl_check_order(&sc, &err) != PP_OK) {
        g_skipped++;
        free(acts);
        return;
    }
    if (getenv("PP_TEST_NCCL_SAY")) printf("case %s\n", where);
    w.p = p;
    w.m = m;
    w.shapes = shapes;
    w.blocking = blocking;
    w.sched = &sc;
    w.steps = 2;
    reference(m, w.steps);
    ok = run_world(&w);
    for (r = 0; r < p && !ok; r++)
        if (w.rc[r][0] != PP_OK || w.rc[r][1] != PP_OK) {
            CHECK(0, "%s: rank %d: %s", where, r, w.msg[r]);
            break;
        }
    if (ok) CHECK(grads_equal(p), "%s: gradients differ from the sequential run", where);
    if (ok && g_say_times) {
        double slow = 0;
        for (r = 0; r < p; r++) slow = w.t_step[r][1] > slow ? w.t_step[r][1] : slow;
        printf("nccl-pipeline: %s: second step %.2f ms (slowest rank; ranks are threads of one process)\n", where, 1e3 * slow);
    }
    for (r = 0; r < p; r++) /* NCCL's lazy set-up: every pair was connected at create (pipeline_nccl.h, _ppn_connect) */
        CHECK(w.late_connects[r] == 0, "%s: rank %d set up %llu connections during its steps", where, r,
              (unsigned long long)w.late_connects[r]);
    if (!g_channels) { /* the default: the fewest channels the schedule passes over, on every rank */
        int want = fewest_channels(&sc, p);
        for (r = 0; r < p; r++)
            CHECK(w.chans[r] == want && w.chans0[r] == (p > 2 ? 8 : 4), "%s: rank %d runs %d channels (%d before the check), want %d",
                  where, r, w.chans[r], w.chans0[r], want);
        g_chans_used[want]++;
    }
    if (ok && kind == PP_SCHED_1F1B && !custom && !g_channels) /* connections only where used (issue 42) */
        for (r = 0; r < p; r++) {
            /* one channel; the neighbours both ways (activations, gradients, the plan check) and the
               step agreement's star around rank 0 (pipeline.h >>impl-stage-agree): nothing else */
            int peers = r == 0 ? p - 1 : (r > 1) + (r < p - 1) + 1;
            const pp_nccl_stats* ns = &w.nst[r];
            CHECK(ns->comms == 1 && ns->p2p_send == peers && ns->p2p_recv == peers && ns->p2p_send_ch[0] == peers &&
                      ns->p2p_lazy == 0 && ns->colls_warmed == 2 && ns->coll_recv == 1 &&
                      ns->conn_bytes == (uint64_t)(peers + 1) * PP_NCCL_CONN_BYTES,
                  "%s: rank %d holds %d communicators, %d + %d connections (%d made lazily), %d warm-ups, %llu bytes: want 1, "
                  "%d + %d (the neighbours and rank 0's star), 0, 2", where, r, ns->comms, ns->p2p_send, ns->p2p_recv,
                  ns->p2p_lazy, ns->colls_warmed, (unsigned long long)ns->conn_bytes, peers, peers);
        }
    if (ok && kind == PP_SCHED_1F1B && !custom && !g_channels && p == 8 && getenv("PP_TEST_NCCL_SAY_MEM"))
        for (r = 0; r < p; r++) /* before issue 42: eight communicators, every pair on two of them each way, no ring */
            printf("nccl-pipeline: 1F1B p = 8, rank %d: %d communicator(s), %d + %d connections, %.1f MiB (before: 8, %d + %d, "
                   "%.1f MiB)\n", r, w.nst[r].comms, w.nst[r].p2p_send, w.nst[r].p2p_recv, (double)w.nst[r].conn_bytes / 1048576.0,
                   2 * (p - 1), 2 * (p - 1), (double)(2 * (p - 1)) * PP_NCCL_CONN_BYTES / 1048576.0);
    free(acts);
}

/* Until the streams earlier cases destroyed are gone (the imitation releases a stream's queue
   once its work is done, on its own thread): at most 2 s. */
static void streams_settle(void) {
    fakecuda_stats a, b;
    int i, still = 0; /* 20 ms without a change */
    fakecuda_stats_get(&a);
    for (i = 0; i < 2000 && still < 20; i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        fakecuda_stats_get(&b);
        still = b.streams_live == a.streams_live ? still + 1 : 0;
        a = b;
    }
}

/* Hardware queues, NCCL's own streams counted. Each channel's communicator has two streams of
   NCCL's (deviceStream, which waits for every kernel of it, and hostStream; the imitation makes
   them, tests/fakenccl), so n channels take 1 + 3n queues. With CUDA_DEVICE_MAX_CONNECTIONS=1
   (as Megatron-LM sets it) every stream shares one queue and the device runs the transport's
   kernels one after another in launch order, which the imitation's serialize_kernels = 2 also
   imposes: every kind at p = 2 and 4 (m = 2p + 1) either runs bit-exact over one channel or is
   refused at pp_stage_create on every rank, naming the kinds that run there; 1F1B, GPipe, ZB-H1
   and ZB-H2 run. At CUDA's default 8 queues the default makes 2 channels and a schedule that
   needs 4 is refused the same way. Negative control: build/nccl-ctl-old-queues (NCCL's streams
   not counted: 4 channels on 8 queues) hangs until its deadline. */
static void one_queue_case(pp_schedule_kind kind, int p, int m, const char* queues, int* ran, int* refused) {
    world w;
    uint64_t shared0, made0[MAXP];
    pp_action* acts;
    pp_schedule sc;
    pp_error err;
    size_t n = pp_schedule_size(kind, p, pp_schedule_kind_v(kind, 2), m);
    int r, fit = !strcmp(queues, "1") || getenv("NCCL_LAUNCH_ORDER_IMPLICIT") ? 1 : 2, runs;
    const char* why = getenv("NCCL_LAUNCH_ORDER_IMPLICIT") ? "NCCL_LAUNCH_ORDER_IMPLICIT" : "CUDA_DEVICE_MAX_CONNECTIONS";
    acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
    if (!acts || pp_schedule_make(kind, p, pp_schedule_kind_v(kind, 2), m, acts, n, &sc, &err) != PP_OK ||
        pp_nccl_check_order(&sc, &err) != PP_OK) {
        free(acts);
        return;
    }
    runs = fewest_channels(&sc, p) <= fit;
    memset(&w, 0, sizeof w);
    w.p = p, w.m = m, w.shapes = PP_SHAPES_LOCAL, w.blocking = 1, w.sched = &sc, w.steps = 2;
    reference(m, w.steps);
    streams_settle();
    shared0 = fakecuda_queue_shared();
    for (r = 0; r < p; r++) made0[r] = fakecuda_streams_made(r); /* rank r's device is r (run_world) */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", queues, 1);
    (void)run_world(&w);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
    /* every stream a rank made (the compute stream, each channel's, NCCL's two per communicator:
       _ppn_queues_need) on a queue of its own. A stream more took a queue of another at two
       channels on 8 queues: a host receive's copy stream and pp_cuda's unused side stream, and
       steps hung by chance (build/nccl-ctl-copy-stream, build/nccl-ctl-eager-side) */
    if (runs && strcmp(queues, "1")) {
        CHECK(fakecuda_queue_shared() == shared0, "%s p=%d m=%d on %s queues: %llu stream(s) made onto a hardware queue another "
              "stream held", pp_schedule_name(kind), p, m, queues, (unsigned long long)(fakecuda_queue_shared() - shared0));
        for (r = 0; r < p; r++)
            CHECK(fakecuda_streams_made(r) - made0[r] == (uint64_t)(1 + 3 * w.chans[r]),
                  "%s p=%d m=%d on %s queues: rank %d made %llu streams on its device over %d channel(s); the queue count "
                  "allows 1 + 3 per channel", pp_schedule_name(kind), p, m, queues, r,
                  (unsigned long long)(fakecuda_streams_made(r) - made0[r]), w.chans[r]);
    }
    for (r = 0; r < p; r++) {
        if (runs) {
            CHECK(w.rc[r][0] == PP_OK && w.rc[r][1] == PP_OK && w.chans[r] <= fit,
                  "%s p=%d m=%d on %s queue(s): rank %d must run over at most %d channels (%d): %s", pp_schedule_name(kind), p, m,
                  queues, r, fit, w.chans[r], w.msg[r]);
        } else {
            CHECK(w.rc[r][0] == PP_ERR_UNSUPPORTED && strstr(w.msg[r], why) &&
                      strstr(w.msg[r], "these run over") && strstr(w.msg[r], "1f1b"),
                  "%s p=%d m=%d on %s queue(s): rank %d must be refused at pp_stage_create naming what runs: %s: %s",
                  pp_schedule_name(kind), p, m, queues, r, pp_result_str(w.rc[r][0]), w.msg[r]);
        }
    }
    if (runs && w.rc[0][0] == PP_OK && w.rc[0][1] == PP_OK)
        CHECK(grads_equal(p), "%s p=%d m=%d on %s queue(s): gradients differ from the sequential run", pp_schedule_name(kind), p, m,
              queues);
    *ran += runs;
    *refused += !runs;
    free(acts);
}

static void test_one_queue(void) {
    fakenccl_options o;
    int k, p, ran = 0, refused = 0, ran8 = 0, refused8 = 0, ran_o = 0, refused_o = 0;
    memset(&o, 0, sizeof o);
    o.serialize_kernels = 2;
    o.launch_delay_s = 0.001;
    fakenccl_set_options(&o);
    g_channels = 0;
    for (p = 2; p <= 4; p += 2)
        for (k = 0; k < PP_SCHED_KIND_COUNT; k++) {
            if (getenv("PP_QUICK") && p == 4) continue;
            one_queue_case((pp_schedule_kind)k, p, 2 * p + 1, "1", &ran, &refused);
        }
    /* NCCL_LAUNCH_ORDER_IMPLICIT=1 with every stream on a queue of its own: the same verdicts */
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 1);
    for (k = 0; k < PP_SCHED_KIND_COUNT; k++) one_queue_case((pp_schedule_kind)k, 2, 5, "32", &ran_o, &refused_o);
    unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    memset(&o, 0, sizeof o);
    o.launch_delay_s = 0.001;
    fakenccl_set_options(&o);
    for (k = 0; k < PP_SCHED_KIND_COUNT; k++) one_queue_case((pp_schedule_kind)k, 4, 9, "8", &ran8, &refused8);
    memset(&o, 0, sizeof o);
    fakenccl_set_options(&o);
    printf("nccl-pipeline: one hardware queue, kernels one at a time in launch order: %d ran, %d refused naming what runs; "
           "NCCL_LAUNCH_ORDER_IMPLICIT=1 (p=2): %d ran, %d refused; 8 queues (p=4): %d ran, %d refused\n", ran, refused, ran_o,
           refused_o, ran8, refused8);
    CHECK(ran >= 4 && refused > 0 && ran8 > 0 && ran_o >= 4 && refused_o > 0, "one queue: %d ran, %d refused", ran, refused);
}

/* build/nccl-ctl-old-queues: NCCL's streams not counted, interleaved p = 2 on four channels at
   CUDA's default 8 queues: the channels' streams share queues with NCCL's deviceStreams, and the
   steps hang on the device. Its hosts must still come back by their deadlines (build/nccl-no-host-
   hang runs it under a watchdog: 18 s); built with the host receive's copy a blocking cudaMemcpy
   (build/nccl-ctl-unstage-blocking), one host waits behind the stuck queue for good. */
static void test_old_queues(void) {
    world w;
    static pp_action acts[4096];
    pp_schedule sc;
    pp_error err;
    int r;
    CHECK(pp_schedule_make(PP_SCHED_INTERLEAVED, 2, 2, 5, acts, 4096, &sc, &err) == PP_OK, "%s", err.msg);
    memset(&w, 0, sizeof w);
    w.p = 2, w.m = 5, w.shapes = PP_SHAPES_LOCAL, w.blocking = 1, w.sched = &sc, w.steps = 2;
    reference(5, 2);
    g_channels = 4;
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    (void)run_world(&w);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
    g_channels = 0;
    for (r = 0; r < 2; r++)
        CHECK(w.rc[r][0] == PP_ERR_UNSUPPORTED && strstr(w.msg[r], "CUDA_DEVICE_MAX_CONNECTIONS"),
              "four channels at 8 queues: rank %d must be refused (13 queues needed): %s: %s", r, pp_result_str(w.rc[r][0]), w.msg[r]);
}

/* The pipeline transport at 1F1B p = 8 (issue 42): one communicator, each rank connected to its
   neighbours and rank 0 (the agreement's star), nothing set up in a step (run_case's checks). */
static void test_neighbours(void) { run_case(PP_SCHED_1F1B, 8, 1, 8, PP_SHAPES_LOCAL, 1, NULL); }

/* Evaluations over NCCL (rendezvous sends): every kind, p 2 to 4, m = p and 2p + 1, LOCAL (and
   BROADCAST for 1F1B and interleaved): train, evaluate, train gives the two sequential steps'
   gradients bit for bit; the outputs (sent to rank (kind + m) % p after the lists where that is
   not the last stage's rank) are pp_sequential_eval's byte for byte; each rank's peak stash is
   the simulator's for the forward-only list (at most 2); the forward-only list, checked by the
   transport at pp_stage_create, leaves the channels where the training list put them. */
static void eval_case(pp_schedule_kind kind, int p, int m, pp_shape_policy shapes) {
    world w;
    pp_action *acts = NULL, *eacts = NULL;
    pp_schedule sc, e;
    pp_sim_result* sim = (pp_sim_result*)calloc(1, sizeof *sim);
    pp_eval_out ref;
    pp_model model = mlpz_model_desc();
    pp_batch b = batch(m);
    static float ev_ref[ROWS * HX_CLASSES];
    pp_error err;
    char where[160];
    size_t n;
    int r, ok, v = pp_schedule_kind_v(kind, 2);
    snprintf(where, sizeof where, "eval %s p=%d m=%d %s", pp_schedule_name(kind), p, m, shapes == PP_SHAPES_LOCAL ? "LOCAL" : "BROADCAST");
    n = pp_schedule_size(kind, p, v, m);
    acts = (pp_action*)malloc(sizeof(pp_action) * (n ? n : 1));
    eacts = (pp_action*)malloc(sizeof(pp_action) * (size_t)p * v * m);
    if (!acts || !eacts || pp_schedule_make(kind, p, v, m, acts, n, &sc, &err) != PP_OK || pp_nccl_check_order(&sc, &err) != PP_OK) {
        g_skipped++;
        free(acts);
        free(eacts);
        free(sim);
        return;
    }
    memset(&w, 0, sizeof w);
    w.p = p;
    w.m = m;
    w.shapes = shapes;
    w.blocking = (p + m) % 2;
    w.sched = &sc;
    w.steps = 2;
    w.eval = 1;
    w.ev_rank = (int)(kind + m) % p;
    memset(&ref, 0, sizeof ref);
    ref.data[0] = ev_ref;
    ref.cap[0] = sizeof ev_ref;
    CHECK(pp_sequential_eval(&model, &W, &b, NULL, &ref, &err) == PP_OK, "%s: %s", where, err.msg);
    CHECK(pp_schedule_make_eval(&sc, eacts, (size_t)p * v * m, &e, &err) == PP_OK && pp_simulate(&e, NULL, sim, NULL, &err) == PP_OK,
          "%s: %s", where, err.msg);
    memset(EV_OUT, 0, sizeof EV_OUT);
    reference(m, 2);
    ok = run_world(&w);
    for (r = 0; r < p; r++) {
        if (w.rc[r][0] != PP_OK || w.rc[r][1] != PP_OK) {
            CHECK(0, "%s: rank %d: %s", where, r, w.msg[r]);
            ok = 0;
            break;
        }
        if (w.ev_rc[r] != PP_OK) {
            CHECK(0, "%s: rank %d: evaluation: %s", where, r, w.ev_msg[r]);
            ok = 0;
            break;
        }
        CHECK(w.ev_peak[r] == sim->peak_live[r] && w.ev_peak[r] <= 2, "%s: rank %d held %d stashes, the simulator says %d", where, r,
              w.ev_peak[r], sim->peak_live[r]);
    }
    if (ok) {
        CHECK(grads_equal(p), "%s: train, evaluate, train: the gradients differ from two sequential steps", where);
        CHECK(memcmp(EV_OUT, ev_ref, ref.bytes[0]) == 0, "%s: the outputs on rank %d differ from the sequential's", where, w.ev_rank);
    }
    if (!g_channels)
        for (r = 0; r < p; r++)
            CHECK(w.chans[r] == fewest_channels(&sc, p), "%s: rank %d runs %d channels, the training list needs %d", where, r,
                  w.chans[r], fewest_channels(&sc, p));
    free(acts);
    free(eacts);
    free(sim);
}

static void test_eval(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE,  PP_SCHED_1F1B,  PP_SCHED_INTERLEAVED, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_V,   PP_SCHED_ZB_H2, PP_SCHED_V_HALF,      PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V, PP_SCHED_INTERLEAVED_MEM};
    fakenccl_options o;
    int p, k, mi;
    memset(&o, 0, sizeof o);
    o.launch_delay_s = 0.001;
    fakenccl_set_options(&o); /* rendezvous: a send completes only when its receive runs */
    for (p = 2; p <= 4; p++)
        for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
            for (mi = 0; mi < 2; mi++) {
                int m = mi ? 2 * p + 1 : p;
                if (getenv("PP_QUICK") && (p == 3 || mi == 0)) continue; /* make quick: p = 2 and 4, m = 2p + 1 */
                eval_case(kinds[k], p, m, PP_SHAPES_LOCAL);
                if (k == 1 || k == 2) eval_case(kinds[k], p, m, PP_SHAPES_BROADCAST);
            }
    memset(&o, 0, sizeof o);
    fakenccl_set_options(&o);
}

static void test_matrix(void) {
    /* the first five in every combination; the rest (added later) with LOCAL shapes, and in make
       quick at m = p and 2p + 1 only */
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE,  PP_SCHED_1F1B,  PP_SCHED_INTERLEAVED, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_V,   PP_SCHED_ZB_H2, PP_SCHED_V_HALF,      PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V, PP_SCHED_INTERLEAVED_MEM};
    int p, k, mi, sh, eager;
    for (eager = 0; eager <= (getenv("PP_QUICK") ? 0 : 1); eager++) { /* make quick: rendezvous only */
        fakenccl_options o;
        memset(&o, 0, sizeof o);
        o.eager_bytes = eager ? 256 : 0;
        g_eager = eager;
        o.launch_delay_s = 0.001;
        fakenccl_set_options(&o);
        for (p = 2; p <= 4; p++)
            for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
                for (mi = 0; mi < 4; mi++) {
                    int ms[4] = {1, p - 1, p, 2 * p + 1}, m = ms[mi];
                    int v = pp_schedule_kind_v(kinds[k], 2);
                    if (m < 1 || (mi == 1 && p - 1 == 1)) continue;
                    /* heavy cases (tests/test.h): the later kinds' small m, and the eager pass */
                    if (k >= 5 && mi < 2 && !test_heavy(p * 64 + k * 4 + mi, 2)) continue;
                    if (eager && !test_heavy(p * 64 + k * 4 + mi + 1, 2)) continue;
                    if (!test_quick_pick(p * 64 + k * 4 + mi, 2)) continue; /* make quick: half, rotating */
                    for (sh = 0; sh < (k < 5 ? 2 : 1); sh++)
                        run_case(kinds[k], p, v, m, sh ? PP_SHAPES_BROADCAST : PP_SHAPES_LOCAL, (p + mi + sh) % 2, NULL);
                    if (kinds[k] == PP_SCHED_INTERLEAVED && p * 3 <= MLP_DEPTH + 1)
                        run_case(kinds[k], p, 3, m, PP_SHAPES_LOCAL, 1, NULL);
                    if (kinds[k] == PP_SCHED_INTERLEAVED && mi == 3) /* and an even m: 2p */
                        run_case(kinds[k], p, 2, 2 * p, PP_SHAPES_LOCAL, 1, NULL);
                }
    }
    {
        fakenccl_options o;
        memset(&o, 0, sizeof o);
        fakenccl_set_options(&o);
    }
    run_case(PP_SCHED_1F1B, 8, 1, 9, PP_SHAPES_LOCAL, 1, NULL);
    /* p = 8, the kinds with one chunk per rank (twelve layers: two per rank do not fit), both
       kinds of communicator: every pair was set up at create, so no lazy set-up can cycle */
    run_case(PP_SCHED_GPIPE, 8, 1, 8, PP_SHAPES_LOCAL, 0, NULL);
    run_case(PP_SCHED_ZB_H1, 8, 1, 8, PP_SHAPES_BROADCAST, 1, NULL);
    run_case(PP_SCHED_ZB_H2, 8, 1, 8, PP_SHAPES_LOCAL, 0, NULL);
    /* a table written out by hand: 1F1B p=2 m=3 */
    {
        const char* text = "schedule p=2 v=1 m=3 map=loop\n"
                           "r0: F0.0 F1.0 B0.0 F2.0 B1.0 B2.0\n"
                           "r1: F0.0 B0.0 F1.0 B1.0 F2.0 B2.0\n";
        pp_action acts[64];
        pp_schedule sc;
        pp_error err;
        pp_result rc = pp_schedule_parse(text, strlen(text), acts, 64, NULL, &sc, &err);
        CHECK(rc == PP_OK, "table: %s", err.msg);
        if (rc == PP_OK) run_case(PP_SCHED_1F1B, 2, 1, 3, PP_SHAPES_LOCAL, 1, &sc);
    }
    printf("nccl-pipeline: %d schedules refused by pp_nccl_check_order were skipped\n", g_skipped);
    printf("nccl-pipeline: runs on the default channels used 1: %d, 2: %d, 4: %d, 8: %d\n", g_chans_used[1],
           g_chans_used[2], g_chans_used[4], g_chans_used[8]);
    CHECK(g_chans_used[1] > 0 && g_chans_used[2] + g_chans_used[4] > 0, "the default must pick one channel for some lists, more for others");
}

/* Activation recomputation over NCCL and device blocks (`recompute`): every other layer, then
   every layer recomputed, on 1F1B, interleaved, ZB-H1 and ZB-V at p = 2 and 3, m = 2p + 1:
   gradients bit for bit the sequential run's. */
static void test_recompute_nccl(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_ZB_H1, PP_SCHED_ZB_V};
    unsigned char rc[MLP_DEPTH + 1];
    int p, k, pol, l;
    for (pol = 0; pol < 2; pol++) {
        for (l = 0; l <= MLP_DEPTH; l++) rc[l] = (unsigned char)(pol || l % 2);
        g_rc = rc;
        for (p = 2; p <= 3; p++)
            for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
                run_case(kinds[k], p, pp_schedule_kind_v(kinds[k], 2), 2 * p + 1, PP_SHAPES_LOCAL, p % 2, NULL);
    }
    g_rc = NULL;
}

/* The matrix for a real GPU (`gpu`): every kind at p = 2, 3, 4 with m = 2p + 1, blocking and
   non-blocking communicators in turn, BROADCAST shapes for the first five kinds at p = 3,
   interleaved v = 3 at p = 3, 1F1B at p = 8: each world makes its communicators anew (on a GPU
   tens of milliseconds each), so fewer cases than over the imitation. */
static void test_matrix_gpu(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE,  PP_SCHED_1F1B,  PP_SCHED_INTERLEAVED, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_V,   PP_SCHED_ZB_H2, PP_SCHED_V_HALF,      PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V, PP_SCHED_INTERLEAVED_MEM};
    int p, k, n = 0;
    for (p = 2; p <= 4; p++)
        for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]) && (!g_gpu_p || p == g_gpu_p); k++) {
            int v = pp_schedule_kind_v(kinds[k], 2);
            run_case(kinds[k], p, v, 2 * p + 1, p == 3 && k < 5 ? PP_SHAPES_BROADCAST : PP_SHAPES_LOCAL, n++ % 2, NULL);
        }
    if (!g_gpu_p || g_gpu_p == 3) run_case(PP_SCHED_INTERLEAVED, 3, 3, 7, PP_SHAPES_LOCAL, 1, NULL);
    if (!g_gpu_p) run_case(PP_SCHED_1F1B, 8, 1, 9, PP_SHAPES_LOCAL, 1, NULL);
}

/* `p8` (build/deep-test_nccl_pipeline, eighteen layers): every schedule kind at p = 8, m = 8
   and 17, blocking and non-blocking communicators in turn, LOCAL shapes, bit-exact with NCCL's
   lazy set-up and CUDA's shared hardware queues imitated; every kind must make a schedule. */
static void test_p8(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE,  PP_SCHED_1F1B,  PP_SCHED_INTERLEAVED, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_V,   PP_SCHED_ZB_H2, PP_SCHED_V_HALF,      PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V, PP_SCHED_INTERLEAVED_MEM};
    static pp_action acts[8192];
    int k, mi, n = 0;
    for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
        for (mi = 0; mi < 2; mi++) {
            int m = mi ? 17 : 8, v = pp_schedule_kind_v(kinds[k], 2);
            pp_schedule sc;
            pp_error err;
            CHECK(pp_schedule_make(kinds[k], 8, v, m, acts, 8192, &sc, &err) == PP_OK, "%s p=8 m=%d: %s",
                  pp_schedule_name(kinds[k]), m, err.msg);
            run_case(kinds[k], 8, v, m, PP_SHAPES_LOCAL, n++ % 2, NULL);
        }
    printf("nccl-pipeline: p = 8: %d of %d lists run, %d refused by pp_nccl_check_order\n", n - g_skipped, n, g_skipped);
}

/* A 1F1B world of p ranks, m micro-batches, `steps` steps, LOCAL shapes, blocking
   communicators, with the reference of `ref_steps` sequential steps. */
static void world_of(world* w, pp_schedule* sc, pp_action* acts, size_t cap, pp_schedule_kind kind, int p, int v, int m,
                     int steps, int ref_steps) {
    pp_error err;
    memset(w, 0, sizeof *w);
    CHECK(pp_schedule_make(kind, p, v, m, acts, cap, sc, &err) == PP_OK, "%s", err.msg);
    w->p = p;
    w->m = m;
    w->sched = sc;
    w->shapes = PP_SHAPES_LOCAL;
    w->blocking = 1;
    w->steps = steps;
    reference(m, ref_steps);
}
static void world_1f1b(world* w, pp_schedule* sc, pp_action* acts, size_t cap, int p, int m, int steps, int ref_steps) {
    world_of(w, sc, acts, cap, PP_SCHED_1F1B, p, 1, m, steps, ref_steps);
}

/* A failing layer on the last rank: every rank's step fails; with new communicators, a new
   transport and new stages the next step is bit-exact (the way back after a failure that aborts
   the communicators: a timeout or an NCCL error; a layer's failure is drained, below). p = 4
   (make quick: p = 2). */
static void test_failure(void) {
    world w;
    pp_action acts[256];
    pp_schedule sc;
    int r, p = getenv("PP_QUICK") ? 2 : 4;
    if (g_gpu_p && p > g_gpu_p) p = g_gpu_p;
    world_1f1b(&w, &sc, acts, 256, p, 6, 2, 1);
    w.after_fail = 1;
    g_fail_rank = p - 1; /* its first layer call fails, once */
    g_fail_armed = 1;
    g_timeout = 2;
    run_world(&w);
    g_timeout = 5;
    g_fail_rank = -1;
    for (r = 0; r < p; r++) {
        CHECK(w.rc[r][0] != PP_OK, "rank %d returned OK for the failed step", r);
        CHECK(w.rc[r][1] == PP_OK, "rank %d after the reset: %s", r, w.msg[r]);
    }
    CHECK(grads_equal(p), "the step after a failure and a reset differs from the sequential run");
}

/* A failing layer, drained (pp_transport.abort_local): the failing rank runs the rest of its
   list without computing and sends zeros, so no rank waits for its deadline (20 s here): every
   rank returns non-OK for the step within 2 s, the failing one its layer's error, the others
   PP_ERR_ABORTED; the communicators stay up, and the next step on the same stages is bit-exact.
   Cases (p = 4; make quick: p = 3): 1F1B with the last rank's forward failing; with a middle
   rank's forward failing, BROADCAST shapes; with a middle rank's backward failing; ZB-H1 with
   the first rank's deferred weight gradient failing.
   Negative control: built with -DPP_TEST_NO_DRAIN the stage aborts as before and the peers
   wait for their deadline (build/nccl-controls, with PP_TEST_DRAIN_DEADLINE=3). */
static void test_failure_drain(void) {
    world w;
    pp_action acts[256];
    pp_schedule sc;
    int r, p = getenv("PP_QUICK") ? 3 : 4, which;
    if (g_gpu_p && p > g_gpu_p) p = g_gpu_p;
    for (which = 0; which < 4; which++) {
        int fail_rank = which == 0 ? p - 1 : which == 3 ? 0 : 1;
        world_1f1b(&w, &sc, acts, 256, p, 6, 2, 1);
        if (which == 3) CHECK(pp_schedule_make(PP_SCHED_ZB_H1, p, 1, 6, acts, 256, &sc, NULL) == PP_OK, "zb-h1");
        if (which == 1) w.shapes = PP_SHAPES_BROADCAST;
        w.zero_after_fail = 1;
        g_fail_rank = fail_rank;
        g_fail_op = which == 2 ? 1 : which == 3 ? 2 : 0;
        g_fail_armed = 1;
        g_timeout = getenv("PP_TEST_DRAIN_DEADLINE") ? atof(getenv("PP_TEST_DRAIN_DEADLINE")) : 20;
        run_world(&w);
        if (getenv("PP_TEST_DRAIN_SAY"))
            for (r = 0; r < p; r++) printf("drain: rank %d: %.3f s: %s\n", r, w.t_step[r][0], w.msg[r]);
        g_timeout = 5;
        g_fail_rank = -1;
        g_fail_op = 0;
        CHECK(!g_fail_armed, "drain case %d: the failure was not injected", which);
        for (r = 0; r < p; r++) {
            CHECK(w.rc[r][0] != PP_OK, "drain: rank %d returned OK for the failed step", r);
            CHECK(r == fail_rank ? w.rc[r][0] != PP_ERR_ABORTED : w.rc[r][0] == PP_ERR_ABORTED,
                  "drain: rank %d returned %s (rank %d failed)", r, pp_result_str(w.rc[r][0]), fail_rank);
            CHECK(w.t_step[r][0] < 2.0, "drain: rank %d took %.2f s to learn of rank %d's failure (deadline 20 s)", r,
                  w.t_step[r][0], fail_rank);
            CHECK(w.rc[r][1] == PP_OK, "drain: rank %d's next step on the same communicators: %s", r, w.msg[r]);
        }
        CHECK(grads_equal(p), "drain: the step after a drained failure differs from the sequential run");
    }
}

/* A layer of 2 s, longer than the executor's probes of retiring blocks (1 s), under a 5 s
   timeout: no probe aborts the communicator. */
static void test_slow(void) {
    world w;
    pp_action acts[256];
    pp_schedule sc;
    int r;
    world_1f1b(&w, &sc, acts, 256, 2, 3, 1, 1);
    g_slow_ms = 2000; /* the first layer of the first micro-batch: 2 s, host side */
    run_world(&w);
    g_slow_ms = 0;
    for (r = 0; r < 2; r++) CHECK(w.rc[r][0] == PP_OK, "rank %d with slow layers: %s", r, w.msg[r]);
    CHECK(grads_equal(2), "slow layers: gradients differ");
}

/* Interleaved over NCCL (two channels): the first and the last rank send to one side on a
   channel that carries no receive of theirs, so no wait of their compute stream orders those
   sends; they are done once the compute stream waited for a later message of the same peer
   (pipeline_nccl.h, _ppn_proven). Without that their blocks came back only at the step's end
   and the pool held them all: p = 4, v = 2, m = 16, the most bytes the last step's blocks held
   at once on ranks 0 and 3 must stay within twice the middle ranks'. Negative control:
   build/nccl-ctl-no-proof. */
/* Interleaved p = 2 with rank 0's compute stream behind (PP_TEST_DEVICE_DELAY_US, 5 ms per
   forward layer): the gradients rank 1 sends land in workspaces rank 0 has not zeroed yet, and
   must survive the zeros (the executor zeroes only after the received bytes). Bit-exact.
   Negative controls: build/nccl-ctl-zero-received (the received bytes zeroed too, the executor's
   debug check compiled out: wrong gradients) and build/nccl-ctl-zero-caught (the same with the
   check: the step fails naming the bytes zeroed between the block's take and its receive). */
static void test_late_zeros(void) {
    g_dev_delay_us = 5000;
    run_case(PP_SCHED_INTERLEAVED, 2, 2, 4, PP_SHAPES_LOCAL, 1, NULL);
    g_dev_delay_us = 0;
}

/* NCCL_COMM_SPLIT_SHARE_RESOURCES=1 makes every ncclCommSplit child share its parent's launch
   queue (tests/fakenccl, shared resources): the transport's channels would run one after another
   and interleaved p = 2 would hang. With the default channels every rank's pp_nccl_create refuses
   within 1 s, naming the variable; with pp_nccl_desc.channels = 1 (no split) 1F1B p = 3 runs
   bit-exact. Negative control: build/nccl-ctl-share-unchecked (the check off: interleaved p = 2
   runs on the shared queue and every rank times out). */
static void test_share(void) {
    world w;
    pp_action acts[256];
    pp_schedule sc;
    double t0;
    int r;
    setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1", 1);
    world_of(&w, &sc, acts, 256, PP_SCHED_INTERLEAVED, 2, 2, 4, 1, 1);
    t0 = hx_now();
    run_world(&w);
    t0 = hx_now() - t0;
    for (r = 0; r < 2; r++)
        CHECK(w.rc[r][0] == PP_ERR_UNSUPPORTED && strstr(w.msg[r], "NCCL_COMM_SPLIT_SHARE_RESOURCES"),
              "shared resources: rank %d must refuse at create: %s: %s", r, pp_result_str(w.rc[r][0]), w.msg[r]);
    CHECK(t0 < 1.0, "shared resources: refused after %.2f s", t0);
    g_channels = 1;
    run_case(PP_SCHED_1F1B, g_gpu_p && g_gpu_p < 3 ? 2 : 3, 1, 5, PP_SHAPES_LOCAL, 1, NULL);
    g_channels = 0;
    unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
}

/* A caller that skips pp_nccl_step_end between steps: the transport resets its send proofs itself
   at the step agreement's verdict, so interleaved p = 4 (PP_TEST_NO_STEP_END="P M" for others),
   whose end ranks' sends are done by proofs, stays bit-exact over eight steps with rank 0's
   device held back (5 ms per forward layer). No negative control: with the reset left to
   pp_nccl_step_end, stale proofs gave no wrong gradient in any case tried (interleaved p = 2 and
   4, 0 to 5 ms of delay; the schedule's own dependencies kept each receive ahead of the reuse). */
static void test_no_step_end(void) {
    world w;
    pp_action acts[512];
    pp_schedule sc;
    int r, s;
    int p = 4, m = 8;
    if (getenv("PP_TEST_NO_STEP_END")) sscanf(getenv("PP_TEST_NO_STEP_END"), "%d %d", &p, &m);
    if (g_gpu_p && p > g_gpu_p) p = g_gpu_p, m = 2 * g_gpu_p;
    world_of(&w, &sc, acts, 512, PP_SCHED_INTERLEAVED, p, 2, m, 8, 8); /* past the block pool's four-step warm-up */
    w.skip_step_end = 1;
    g_dev_delay_us = getenv("PP_TEST_DEVICE_DELAY_US") ? g_dev_delay_us : 5000;
    run_world(&w);
    g_dev_delay_us = 0;
    for (r = 0; r < w.p; r++)
        for (s = 0; s < w.steps; s++) CHECK(w.rc[r][s] == PP_OK, "no step_end, rank %d step %d: %s", r, s, w.msg[r]);
    CHECK(grads_equal(w.p), "no step_end between steps: gradients differ from the sequential run");
}

/* A rank that never makes its transport: the others' connection set-up at pp_nccl_create waits for
   it until pp_nccl_desc.timeout_s (1 s here) and fails with PP_ERR_TIMEOUT, saying so, its
   communicator aborted (one channel: no split to wait for first; non-blocking communicators:
   with a blocking one NCCL holds the host inside ncclGroupEnd). */
typedef struct connect_arg {
    int r, n;
    ncclUniqueId id;
    pp_result rc;
    double took;
    char msg[sizeof(((pp_error*)0)->msg) + 8];
} connect_arg;
static pthread_mutex_t g_connect_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_connect_cv = PTHREAD_COND_INITIALIZER;
static int g_connect_done; /* the other ranks returned from pp_nccl_create */
static void* connect_rank(void* arg) {
    connect_arg* a = (connect_arg*)arg;
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclInProgress;
    pp_nccl* t = NULL;
    pp_nccl_desc nd;
    pp_error err;
    cudaStream_t s = NULL;
    double t0;
    int ndev = 1;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    cudaSetDevice(a->r % ndev);
    cfg.blocking = 0;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ncclCommInitRankConfig(&comm, a->n, a->id, a->r, &cfg) != ncclSuccess && !comm) {
        a->rc = PP_ERR_TRANSPORT;
        return NULL;
    }
    while (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress) {
    }
    if (a->r == a->n - 1) { /* never makes a transport: waits for the others, then goes */
        pthread_mutex_lock(&g_connect_mu);
        while (!g_connect_done) pthread_cond_wait(&g_connect_cv, &g_connect_mu);
        pthread_mutex_unlock(&g_connect_mu);
        ncclCommAbort(comm);
        a->rc = PP_OK;
    } else {
        memset(&nd, 0, sizeof nd);
        nd.comm = comm;
        nd.compute = s;
        nd.own_comm = 1;
        nd.channels = 1;
        nd.timeout_s = 1;
        t0 = hx_now();
        a->rc = pp_nccl_create(&nd, &t, &err);
        a->took = hx_now() - t0;
        snprintf(a->msg, sizeof a->msg, "%s", a->rc == PP_OK ? "" : err.msg);
        if (t) pp_nccl_destroy(t);
    }
    cudaStreamDestroy(s);
    return NULL;
}
static void test_connect_fail(void) {
    pthread_t th[3];
    connect_arg a[3];
    ncclUniqueId id;
    int r, n = g_gpu_p && g_gpu_p < 3 ? 2 : 3; /* the last one missing */
    ncclGetUniqueId(&id);
    g_connect_done = 0;
    for (r = 0; r < n; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].r = r;
        a[r].n = n;
        a[r].id = id;
        pthread_create(&th[r], NULL, connect_rank, &a[r]);
    }
    for (r = 0; r < n - 1; r++) pthread_join(th[r], NULL);
    pthread_mutex_lock(&g_connect_mu);
    g_connect_done = 1;
    pthread_cond_broadcast(&g_connect_cv);
    pthread_mutex_unlock(&g_connect_mu);
    pthread_join(th[n - 1], NULL);
    for (r = 0; r < n - 1; r++)
        CHECK(a[r].rc == PP_ERR_TIMEOUT && a[r].took < 3.0 && strstr(a[r].msg, "connection set-up"),
              "rank %d of %d with rank %d missing: pp_nccl_create must time out in about 1 s: %s after %.2f s: %s", r, n,
              n - 1, pp_result_str(a[r].rc), a[r].took, a[r].msg);
}

static void test_pool_ends(void) {
    world w;
    pp_action acts[512];
    pp_schedule sc;
    int r, s;
    size_t ends, mid;
    world_of(&w, &sc, acts, 512, PP_SCHED_INTERLEAVED, 4, 2, 16, 6, 6); /* the pool grows in its first four steps */
    run_world(&w);
    for (r = 0; r < w.p; r++)
        for (s = 0; s < w.steps; s++) CHECK(w.rc[r][s] == PP_OK, "pool test, rank %d step %d: %s", r, s, w.msg[r]);
    CHECK(grads_equal(w.p), "pool test: gradients differ");
    ends = w.pool_need[0] > w.pool_need[3] ? w.pool_need[0] : w.pool_need[3];
    mid = w.pool_need[1] > w.pool_need[2] ? w.pool_need[1] : w.pool_need[2];
    CHECK(ends <= 2 * mid, "interleaved p=4 m=16 over NCCL: the first and last ranks' blocks held %zu and %zu bytes at once, the "
          "middle ranks' %zu and %zu", w.pool_need[0], w.pool_need[3], w.pool_need[1], w.pool_need[2]);
}

/* >>sends: a group of device sends alone records no completion event (pipeline_nccl.h,
   _ppn_flush); a host wait for one of its sends must still return only once the send is done.
   Rank 0 sends a message in a group of its own, then another with a receive in one group (which
   records an event); rank 1 posts its receives and its send only after 0.3 s (in rendezvous
   mode a send is done when its receive has run). Rank 0's probe of the first send (a wait of
   0.5 s, what the executor's block pool does) gives up at once: only the later group could
   answer. Its full wait (answered by the later group's event) must not return before rank 1
   posted the receives, and all data must arrive. Negative control:
   build/nccl-ctl-eventless-done (such a group is done as soon as it is asked). */
/* Rank r of two (its own device): a communicator from id and a pp_nccl on it over `channels`
   channels, with the compute stream; NULL and a message on failure. */
static pp_nccl* two_rank_nccl(int r, const ncclUniqueId* id, int channels, cudaStream_t compute, char* msg, size_t cap) {
    ncclComm_t comm = NULL;
    pp_nccl* t = NULL;
    pp_nccl_desc nd;
    pp_error err;
    if (ncclCommInitRank(&comm, 2, *id, r) != ncclSuccess) {
        snprintf(msg, cap, "ncclCommInitRank failed");
        return NULL;
    }
    memset(&nd, 0, sizeof nd);
    nd.comm = comm;
    nd.compute = compute;
    nd.own_comm = 1;
    nd.channels = channels;
    nd.connect_all = 1; /* isend/irecv used directly: every pair set up here, not at the first message */
    if (pp_nccl_create(&nd, &t, &err) != PP_OK) {
        snprintf(msg, cap, "pp_nccl_create: %.150s", err.msg);
        ncclCommDestroy(comm);
        return NULL;
    }
    return t;
}

/* Runs fn(&args[r]) for r = 0, 1 in two threads, in rendezvous mode; args[r] start with their
   rank and a shared id (two_rank_arg). */
typedef struct two_rank_arg {
    int r;
    ncclUniqueId id;
} two_rank_arg;
static void two_ranks(void* (*fn)(void*), void* args, size_t size) {
    pthread_t th[2];
    fakenccl_options o;
    ncclUniqueId id;
    int r;
    memset(&o, 0, sizeof o); /* rendezvous: every send waits for its receive */
    fakenccl_set_options(&o);
    ncclGetUniqueId(&id);
    for (r = 0; r < 2; r++) {
        two_rank_arg* a = (two_rank_arg*)((char*)args + (size_t)r * size);
        a->r = r;
        a->id = id;
        pthread_create(&th[r], NULL, fn, a);
    }
    for (r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

typedef struct send_arg {
    two_rank_arg h;
    double t_posted, t_returned, probe_s;
    pp_result probe_rc, wait_rc, end_rc;
    int data_ok;
    char msg[200];
} send_arg;

static void* send_rank(void* arg) {
    send_arg* a = (send_arg*)arg;
    cudaStream_t compute = NULL;
    pp_nccl* t;
    pp_transport tr;
    pp_request q[3];
    pp_error err;
    float host[3][64], *dev[3] = {NULL, NULL, NULL};
    int k, i;
    cudaSetDevice(a->h.r);
    memset(q, 0, sizeof q);
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    for (k = 0; k < 3; k++) {
        for (i = 0; i < 64; i++) host[k][i] = (a->h.r == 0) == (k < 2) ? (float)(100 * k + i) : -1.0f;
        cudaMalloc((void**)&dev[k], sizeof host[k]);
        cudaMemcpy(dev[k], host[k], sizeof host[k], cudaMemcpyHostToDevice);
    }
    cudaDeviceSynchronize(); /* the legacy stream's copies, before the non-blocking streams use the buffers */
    if (!(t = two_rank_nccl(a->h.r, &a->h.id, 1, compute, a->msg, sizeof a->msg))) return NULL;
    tr = pp_nccl_transport(t);
    if (a->h.r == 0) {
        double t0;
        for (k = 0; k < 2; k++) { /* a group of one send; a group of a send and a receive */
            tr.group_start(tr.self);
            if (k == 1) tr.irecv(tr.self, 1, 7, dev[2], sizeof host[2], &q[2]);
            tr.isend(tr.self, 1, 5 + k, dev[k], sizeof host[k], &q[k]);
            tr.group_end(tr.self);
        }
        t0 = hx_now();
        a->probe_rc = tr.wait(tr.self, &q[0], 0.5, &err);
        a->probe_s = hx_now() - t0;
        a->wait_rc = tr.wait(tr.self, &q[0], 10, &err);
        a->t_returned = hx_now();
        if (a->wait_rc != PP_OK) snprintf(a->msg, sizeof a->msg, "wait: %.150s", err.msg);
        for (k = 1; k < 3; k++)
            if (tr.wait(tr.self, &q[k], 10, &err) != PP_OK) a->wait_rc = PP_ERR_TRANSPORT;
    } else {
        struct timespec ts = {0, 300000000L};
        nanosleep(&ts, NULL);
        a->t_posted = hx_now();
        for (k = 0; k < 2; k++) tr.irecv(tr.self, 0, 5 + k, dev[k], sizeof host[k], &q[k]);
        tr.isend(tr.self, 0, 7, dev[2], sizeof host[2], &q[2]);
        for (k = 0; k < 3; k++)
            if ((a->wait_rc = tr.wait(tr.self, &q[k], 10, &err)) != PP_OK) break;
    }
    cudaStreamSynchronize(compute); /* the receives' waits are the compute stream's */
    a->data_ok = 1;
    for (k = 0; k < 3; k++) {
        cudaMemcpy(host[k], dev[k], sizeof host[k], cudaMemcpyDeviceToHost);
        for (i = 0; i < 64; i++)
            if (host[k][i] != (float)(100 * k + i)) a->data_ok = 0;
    }
    a->end_rc = pp_nccl_step_end(t, 10, &err);
    pp_nccl_destroy(t);
    for (k = 0; k < 3; k++) cudaFree(dev[k]);
    cudaStreamDestroy(compute);
    return NULL;
}

static void test_send_completion(void) {
    send_arg a[2];
    memset(a, 0, sizeof a);
    two_ranks(send_rank, a, sizeof a[0]);
    CHECK(!a[0].msg[0] && !a[1].msg[0], "send completion: %s %s", a[0].msg, a[1].msg);
    CHECK(a[0].probe_rc == PP_ERR_TIMEOUT && a[0].probe_s < 0.25, "a probe of a send only a later group could answer: %s after %.3f s",
          pp_result_str(a[0].probe_rc), a[0].probe_s);
    CHECK(a[0].wait_rc == PP_OK && a[1].wait_rc == PP_OK, "send completion: waits %s %s", pp_result_str(a[0].wait_rc),
          pp_result_str(a[1].wait_rc));
    CHECK(a[0].t_returned >= a[1].t_posted, "the wait for a send returned %.3f s before its receive was posted",
          a[1].t_posted - a[0].t_returned);
    CHECK(a[0].data_ok && a[1].data_ok, "the messages' data did not arrive (rank 0 %d, rank 1 %d)", a[0].data_ok, a[1].data_ok);
    CHECK(a[0].end_rc == PP_OK && a[1].end_rc == PP_OK, "step end: %s %s", pp_result_str(a[0].end_rc), pp_result_str(a[1].end_rc));
}

/* A block the stage released (pp_transport.released) may take a receive without its channel
   waiting for the compute stream again, but only once the channel waited for a record of the
   compute stream made after the release: before it, the block's last reader may still run.
   Rank 0's channel from rank 1 first waits for the compute stream (a receive into a fresh
   buffer); then the compute stream reads block X slowly (a host function of 0.2 s, then a copy
   of X), X is released, and a receive into X is posted and waited for. Rank 1 sends at once.
   The slow copy must still see X's old bytes. Negative control: build/nccl-ctl-released-now
   (a released block counts as free from the compute stream's last record before the release:
   the receive overwrites X under its reader). */
static void sleep_host(void* u) {
    struct timespec ts = {0, 200000000L};
    (void)u;
    nanosleep(&ts, NULL);
}

typedef struct rel_arg {
    two_rank_arg h;
    int ok;
    char msg[200];
} rel_arg;

static void* released_rank(void* arg) {
    rel_arg* a = (rel_arg*)arg;
    cudaStream_t compute = NULL;
    pp_nccl* t;
    pp_transport tr;
    pp_request q[2];
    pp_error err;
    float host[64], *x = NULL, *y = NULL, *check = NULL;
    int i, k;
    cudaSetDevice(a->h.r);
    memset(q, 0, sizeof q);
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    cudaMalloc((void**)&x, sizeof host);
    cudaMalloc((void**)&y, sizeof host);
    cudaMalloc((void**)&check, sizeof host);
    for (i = 0; i < 64; i++) host[i] = a->h.r == 0 ? 1.0f : 2.0f; /* rank 0's old bytes, rank 1's new ones */
    cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice);
    cudaMemcpy(y, host, sizeof host, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    if (!(t = two_rank_nccl(a->h.r, &a->h.id, 2, compute, a->msg, sizeof a->msg))) return NULL;
    tr = pp_nccl_transport(t);
    a->ok = 1;
    if (a->h.r == 0) {
        tr.irecv(tr.self, 1, 1, y, sizeof host, &q[0]); /* a fresh buffer: the channel waits for the compute stream */
        if (tr.wait(tr.self, &q[0], 10, &err) != PP_OK) a->ok = 0;
        cudaLaunchHostFunc(compute, sleep_host, NULL); /* X's last reader: slow */
        cudaMemcpyAsync(check, x, sizeof host, cudaMemcpyDeviceToDevice, compute);
        tr.released(tr.self, x, sizeof host);
        tr.irecv(tr.self, 1, 2, x, sizeof host, &q[1]);
        if (tr.wait(tr.self, &q[1], 10, &err) != PP_OK) a->ok = 0;
        cudaStreamSynchronize(compute);
        cudaMemcpy(host, check, sizeof host, cudaMemcpyDeviceToHost);
        for (i = 0; i < 64; i++)
            if (host[i] != 1.0f) a->ok = 0;
        if (!a->ok) snprintf(a->msg, sizeof a->msg, "the reader of a released block saw %g, not its old 1", (double)host[0]);
    } else {
        for (k = 0; k < 2; k++) tr.isend(tr.self, 0, 1 + k, k ? x : y, sizeof host, &q[k]);
        for (k = 0; k < 2; k++)
            if (tr.wait(tr.self, &q[k], 10, &err) != PP_OK) a->ok = 0;
    }
    if (pp_nccl_step_end(t, 10, &err) != PP_OK) a->ok = 0;
    pp_nccl_destroy(t);
    cudaFree(x);
    cudaFree(y);
    cudaFree(check);
    cudaStreamDestroy(compute);
    return NULL;
}

static void test_released(void) {
    rel_arg a[2];
    int r;
    memset(a, 0, sizeof a);
    two_ranks(released_rank, a, sizeof a[0]);
    for (r = 0; r < 2; r++) CHECK(a[r].ok, "released block, rank %d: %s", r, a[r].msg);
}

/* >>rendezvous: pp_nccl_check_rendezvous, and the imitation agreeing with it. */

/* A random valid table: a random execution of every (op, micro-batch, stage) under the
   simulator's dependencies, each rank's list in that order, where a receiving action may run
   only when its message is the oldest unreceived one of its pair (pp_nccl_check_order holds).
   Each stage's B and W go in micro-batch order, as in the built-in schedules, so that the
   gradients add up in the reference's order (bit-exact). */
#define RT_MAXS 10
#define RT_MAXM 6
static int random_table(uint64_t* seed, int p, int v, int m, int vmap, int with_w, char* txt, size_t cap) {
    pp_schedule map;
    int S = p * v, n, no = 0, total = m * S * (with_w ? 3 : 2), r, op, mb, s, rk, ch, peer, c2;
    int done[3][RT_MAXM][RT_MAXS], head[MAXP][MAXP], tail[MAXP][MAXP];
    int q[MAXP][MAXP][2 * RT_MAXM * RT_MAXS], cand[3 * RT_MAXM * RT_MAXS], order[3 * RT_MAXM * RT_MAXS][3];
    size_t len;
    memset(&map, 0, sizeof map);
    map.p = p;
    map.v = v;
    map.n_stages = S;
    map.map = vmap ? PP_MAP_V : PP_MAP_LOOP;
    memset(done, 0, sizeof done);
    memset(head, 0, sizeof head);
    memset(tail, 0, sizeof tail);
    for (n = 0; n < total; n++) {
        int nc = 0, k;
        for (op = 0; op < (with_w ? 3 : 2); op++)
            for (mb = 0; mb < m; mb++)
                for (s = 0; s < S; s++) {
                    int ok, rs = op == PP_OP_F ? s - 1 : s + 1, msg = op == PP_OP_F ? (mb * S + s) * 2 : (mb * S + s + 1) * 2 + 1;
                    if (done[op][mb][s]) continue;
                    if (op == PP_OP_F) ok = s == 0 || done[0][mb][s - 1];
                    else if (op == PP_OP_B) ok = done[0][mb][s] && (s == S - 1 || done[1][mb][s + 1]);
                    else ok = done[1][mb][s];
                    if (op != PP_OP_F && mb > 0 && !done[op][mb - 1][s]) ok = 0; /* gradients add up in order: bit-exact */
                    pp_schedule_stage_to_rank(&map, s, &rk, &ch);
                    if (ok && op != PP_OP_W && rs >= 0 && rs < S) {
                        pp_schedule_stage_to_rank(&map, rs, &peer, &c2);
                        if (peer != rk && (head[peer][rk] == tail[peer][rk] || q[peer][rk][head[peer][rk]] != msg)) ok = 0;
                    }
                    if (ok) cand[nc++] = (op * RT_MAXM + mb) * RT_MAXS + s;
                }
        if (!nc) return -1;
        k = cand[mlp_rng_next(seed) % (uint64_t)nc];
        op = k / (RT_MAXM * RT_MAXS);
        mb = k / RT_MAXS % RT_MAXM;
        s = k % RT_MAXS;
        done[op][mb][s] = 1;
        pp_schedule_stage_to_rank(&map, s, &rk, &ch);
        order[no][0] = rk;
        order[no][1] = k;
        order[no++][2] = ch;
        if (op != PP_OP_W) { /* what it received leaves its pair's queue, what it sends joins one */
            int rs = op == PP_OP_F ? s - 1 : s + 1, ss = op == PP_OP_F ? s + 1 : s - 1;
            if (rs >= 0 && rs < S) {
                pp_schedule_stage_to_rank(&map, rs, &peer, &c2);
                if (peer != rk) head[peer][rk]++;
            }
            if (ss >= 0 && ss < S) {
                pp_schedule_stage_to_rank(&map, ss, &peer, &c2);
                if (peer != rk) q[rk][peer][tail[rk][peer]++] = op == PP_OP_F ? (mb * S + s + 1) * 2 : (mb * S + s) * 2 + 1;
            }
        }
    }
    len = (size_t)snprintf(txt, cap, "schedule p=%d v=%d m=%d map=%s\n", p, v, m, vmap ? "v" : "loop");
    for (r = 0; r < p && len < cap; r++) {
        len += (size_t)snprintf(txt + len, cap - len, "r%d:", r);
        for (n = 0; n < no && len < cap; n++)
            if (order[n][0] == r)
                len += (size_t)snprintf(txt + len, cap - len, " %c%d.%d", "FBW"[order[n][1] / (RT_MAXM * RT_MAXS)],
                                        order[n][1] / RT_MAXS % RT_MAXM, order[n][2]);
        if (len < cap) len += (size_t)snprintf(txt + len, cap - len, "\n");
    }
    return len < cap ? 0 : -1;
}

/* Runs sc over the imitation (2 steps; 1 without the check); 1 when every rank's every step
   returned PP_OK and the gradients are the reference's. */
static int run_table(const pp_schedule* sc, int check, double timeout_s, world* w) {
    int ok;
    memset(w, 0, sizeof *w);
    w->p = sc->p;
    w->m = sc->m;
    w->sched = sc;
    w->shapes = PP_SHAPES_LOCAL;
    w->blocking = 1;
    w->steps = check ? 2 : 1;
    reference(sc->m, w->steps);
    g_no_check = !check;
    g_timeout = timeout_s;
    ok = run_world(w);
    g_no_check = 0;
    g_timeout = 5;
    return ok && grads_equal(sc->p);
}

/* 1 when some rank's first step timed out: the ranks waited for each other. */
static int timed_out(const world* w) {
    int r;
    for (r = 0; r < w->p; r++)
        if (w->rc[r][0] == PP_ERR_TIMEOUT) return 1;
    return 0;
}

/* 1. Every built-in list passes over the transport's eight channels (over four, some lists of the
   later kinds would cycle: DualPipeV below m = 2p at p >= 6, for one; counted). One channel fails
   interleaved p = 2 as the imitation does (the negative control in the header comment).
   2. A 1F1B-like table (p = 4, m = 4) that pp_simulate and pp_nccl_check_order accept, but
   whose NCCL groups wait in a cycle over four channels: rank 1's compute stream waits for the
   group holding its send of activation 1 (paired with the receive of activation 2), which rank 2
   receives only after the gradient of micro-batch 0 left it, which rank 1 receives only after
   that wait. Refused at pp_stage_create (PP_ERR_DEADLOCK on every rank), and without the check
   the imitation hangs on it until the timeout: the model and the transport agree. Over eight
   channels (the send and the receive then go on channels of their own) it runs.
   3. Random valid tables over four channels: the check's verdicts on a sample, run through the
   imitation, agree (those it passes run bit-exact, those it refuses hang; over eight channels
   they run); p = 2 never cycles (each channel then carries one direction of the only pair). */
/* Eight channels' streams and the compute stream need nine hardware work queues: at CUDA's default
   eight (CUDA_DEVICE_MAX_CONNECTIONS unset; tests/fakecuda shares queues the same way) every rank
   refuses the crafted table over eight channels at pp_stage_create, naming the variable; with 16
   it runs. Negative control: build/nccl-ctl-queues-unchecked (the check off: it runs on shared
   queues). */
static void test_queues(const pp_schedule* sc) {
    world w;
    int r;
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    (void)run_table(sc, 1, 5, &w);
    for (r = 0; r < sc->p; r++)
        CHECK(w.rc[r][0] == PP_ERR_UNSUPPORTED && strstr(w.msg[r], "CUDA_DEVICE_MAX_CONNECTIONS"),
              "eight channels at the default eight queues: rank %d must refuse at pp_stage_create: %s: %s", r,
              pp_result_str(w.rc[r][0]), w.msg[r]);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
}

static void test_rendezvous(void) {
    /* its backwards out of micro-batch order (the cycle needs them so): order=any */
    static const char* crafted = "schedule p=4 v=1 m=4 map=loop order=any\n"
                                 "r0: F0 F3 F1 F2 B0 B3 B1 B2\n"
                                 "r1: F0 F3 F1 F2 B0 B3 B1 B2\n"
                                 "r2: F0 F3 B0 B3 F1 F2 B1 B2\n"
                                 "r3: F0 B0 F3 B3 F1 B1 F2 B2\n";
    static pp_action acts[4096];
    static char txt[8192];
    pp_schedule sc;
    pp_error err;
    world w;
    uint64_t seed = 2026;
    int k, p, v, m, r, n_ok = 0, n_cycle = 0, ran_ok = 0, ran_cycle = 0, i, quick = getenv("PP_QUICK") != NULL;
    int n_rand = quick ? 150 : 3000, n_kind_cycle = 0, n_ok8 = 0, ran8 = 0;
    for (k = 0; k < PP_SCHED_KIND_COUNT; k++)
        for (p = 2; p <= MAXP; p++)
            for (v = 1; v <= 3; v++)
                for (m = 1; m <= 2 * p + 3; m++) {
                    if (quick && p > 4 && (p < MAXP || m != 2 * p + 3)) continue; /* quick: p <= 4, one p = 8 */
                    if (pp_schedule_make((pp_schedule_kind)k, p, v, m, acts, 4096, &sc, &err) != PP_OK ||
                        pp_nccl_check_order(&sc, &err) != PP_OK)
                        continue;
                    CHECK(pp_nccl_check_rendezvous(&sc, 8, &err) == PP_OK, "%s", err.msg);
                    n_kind_cycle += pp_nccl_check_rendezvous(&sc, 4, &err) != PP_OK;
                }
    printf("nccl-pipeline: every built-in list passes over eight channels; %d would cycle over four\n", n_kind_cycle);
    CHECK(pp_schedule_make(PP_SCHED_INTERLEAVED, 2, 2, 4, acts, 4096, &sc, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_nccl_check_rendezvous(&sc, 1, &err) == PP_ERR_DEADLOCK, "interleaved p=2 on one channel must cycle");

    g_channels = 4; /* the model and the imitation agree on cycles: over four channels some tables have them */
    CHECK(pp_schedule_parse(crafted, strlen(crafted), acts, 4096, NULL, &sc, &err) == PP_OK, "crafted table: %s", err.msg);
    CHECK(pp_simulate(&sc, NULL, NULL, NULL, &err) == PP_OK && pp_nccl_check_order(&sc, &err) == PP_OK,
          "the crafted table is valid for the simulator and NCCL's order: %s", err.msg);
    err.msg[0] = 0;
    CHECK(pp_nccl_check_rendezvous(&sc, 4, &err) == PP_ERR_DEADLOCK && strstr(err.msg, "cycle") &&
              strstr(err.msg, "r1 ch0#3 sends act mb1"),
          "the crafted table must be refused, naming the cycle: %s", err.msg);
    CHECK(!run_table(&sc, 1, 5, &w), "the crafted table must not run");
    for (r = 0; r < 4; r++)
        CHECK(w.rc[r][0] == PP_ERR_DEADLOCK && strstr(w.msg[r], "setup") && strstr(w.msg[r], "cycle"),
              "rank %d must refuse the crafted table at pp_stage_create: %s", r, w.msg[r]);
    CHECK(!run_table(&sc, 0, 1.5, &w) && timed_out(&w), "without the check the crafted table must hang in the imitation: %s",
          w.msg[0]);
    g_channels = 0; /* the default, eight: the pairs of its cycle no longer share a channel */
    CHECK(pp_nccl_check_rendezvous(&sc, 8, &err) == PP_OK, "the crafted table over eight channels: %s", err.msg);
    test_queues(&sc);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1); /* eight channels' streams need 25 queues (NCCL's own counted) */
    (void)run_table(&sc, 1, 5, &w); /* its micro-batches out of order: the sums round otherwise than the reference's */
    for (r = 0; r < 4; r++)
        CHECK(w.rc[r][0] == PP_OK && w.rc[r][1] == PP_OK && w.chans[r] == 8,
              "the crafted table over eight channels (the default picks them) must run: rank %d (%d channels): %s", r, w.chans[r],
              w.msg[r]);
    (void)run_table(&sc, 0, 5, &w); /* the default without the check: all eight channels, so it runs */
    for (r = 0; r < 4; r++)
        CHECK(w.rc[r][0] == PP_OK && w.chans[r] == 8, "the crafted table without the check must run on eight channels: rank %d "
              "(%d channels): %s", r, w.chans[r], w.msg[r]);
    g_channels = 4;

    for (i = 0; i < n_rand; i++) {
        int vmap, with_w, rc, cyc;
        p = 2 + (int)(mlp_rng_next(&seed) % 4);
        vmap = mlp_rng_next(&seed) % 3 == 0;
        v = vmap ? 2 : 1 + (int)(mlp_rng_next(&seed) % 2);
        m = 1 + (int)(mlp_rng_next(&seed) % RT_MAXM);
        with_w = (int)(mlp_rng_next(&seed) % 2);
        if (p * v > RT_MAXS || p * v > MLP_DEPTH + 1) continue;
        CHECK(random_table(&seed, p, v, m, vmap, with_w, txt, sizeof txt) == 0, "random table %d", i);
        if (i >= 400 && !test_heavy(i, 4)) continue; /* beyond make quick's 400: heavy cases */
        rc = pp_schedule_parse(txt, strlen(txt), acts, 4096, NULL, &sc, &err);
        CHECK(rc == PP_OK, "random table %d does not parse: %s\n%s", i, err.msg, txt);
        if (rc != PP_OK) continue;
        CHECK(pp_nccl_check_order(&sc, &err) == PP_OK, "random table %d: %s", i, err.msg);
        rc = pp_nccl_check_rendezvous(&sc, 4, &err);
        CHECK(rc == PP_OK || rc == PP_ERR_DEADLOCK, "random table %d: %s", i, err.msg);
        cyc = rc == PP_ERR_DEADLOCK;
        n_cycle += cyc;
        n_ok += !cyc;
        if (p == 2) CHECK(!cyc, "p = 2 cannot cycle over four channels: %s\n%s", err.msg, txt);
        if (!cyc && p >= 3 && ran_ok < (quick ? 3 : 12)) {
            ran_ok++;
            CHECK(run_table(&sc, 1, 5, &w), "random table %d passes the check but fails in the imitation: %s | %s\n%s", i,
                  w.msg[0], w.msg[sc.p - 1], txt);
        }
        if (cyc && ran_cycle < (quick ? 1 : 4)) {
            ran_cycle++;
            CHECK(!run_table(&sc, 0, 1.5, &w) && timed_out(&w), "random table %d fails the check but does not hang in the "
                  "imitation: %s\n%s", i, w.msg[0], txt);
        }
        rc = pp_nccl_check_rendezvous(&sc, 8, &err);
        n_ok8 += rc == PP_OK;
        if (cyc && rc == PP_OK && ran8 < (quick ? 1 : 4)) { /* over the default eight channels it runs */
            ran8++;
            g_channels = 0;
            setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
            CHECK(run_table(&sc, 1, 5, &w), "random table %d cycles over four channels, not over eight, but fails in the "
                  "imitation: %s\n%s", i, w.msg[0], txt);
            g_channels = 4;
        }
    }
    g_channels = 0;
    CHECK(n_cycle > 0 && n_ok > 0, "random tables: %d pass, %d cycle", n_ok, n_cycle);
    printf("nccl-pipeline: rendezvous check: of %d random valid tables %d would cycle over four NCCL channels, %d over "
           "eight (the default)\n", n_ok + n_cycle, n_cycle, n_ok + n_cycle - n_ok8);
}

#ifdef FAKENCCL
/* >>deadlines: every host wait of pp_nccl ends by pp_nccl_desc.timeout_s, or at once when NCCL
   reports a failure (the imitation's switches: not in the gpu mode). Two ranks in threads, each
   test under a watchdog (a control that waits for the old deadlines, or forever, fails at 6 s;
   `deadlines N` runs case N alone):
   - connect: rank 1 aborts its communicator 0.2 s after rank 0 issued its set-up's empty messages
     (fakenccl_stats.pending), rank 0 is past the host's set-up
     (connections made at init, fakenccl_options.eager_connect) and waits for its empty messages;
     NCCL tells it (abort_seen: ncclRemoteError): pp_nccl_create must fail well before its 5 s.
     Control build/nccl-ctl-connect-no-async (the loop asks the stream only: 5 s).
   - flush: a group's launch that does not settle (the imitation's launch delay raised to 100 s
     after create) ends at timeout_s = 1, not at PP_DEFAULT_TIMEOUT_S. Control
     build/nccl-ctl-flush-default-timeout.
   - destroy: rank 0 sends, rank 1 never receives, rank 0 destroys its transport without
     pp_nccl_step_end: done in about timeout_s = 1 (the send aborted). Control
     build/nccl-ctl-destroy-unbounded (cudaStreamSynchronize: forever). The same with the
     caller's communicator (own_comm = 0, not the transport's to abort) and a host send: done in
     1 s, its staging buffer left to the send (cudaFree waits for every stream of the device);
     control build/nccl-ctl-destroy-frees (freed: forever). */
typedef struct dl_arg {
    int r, which;
    ncclUniqueId id;
    ncclComm_t comm;
    pp_result rc;
    double took;
    char msg[sizeof(((pp_error*)0)->msg) + 8];
} dl_arg;
static pthread_barrier_t g_dl_bar;
static pthread_mutex_t g_dl_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_dl_done; /* under g_dl_mu: the case returned, the watchdog may go */
static int dl_done(int set) {
    int d;
    pthread_mutex_lock(&g_dl_mu);
    if (set >= 0) g_dl_done = set;
    d = g_dl_done;
    pthread_mutex_unlock(&g_dl_mu);
    return d;
}

static pp_nccl* dl_nccl(dl_arg* a, double timeout_s, cudaStream_t* s) {
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclInProgress;
    pp_nccl_desc nd;
    pp_nccl* t = NULL;
    pp_error err;
    cfg.blocking = 0;
    cudaSetDevice(a->r);
    cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
    if (ncclCommInitRankConfig(&comm, 2, a->id, a->r, &cfg) != ncclSuccess && !comm) return NULL;
    while (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress) {
    }
    if ((a->which == 0 || a->which == 4) && a->r == 1) { /* connect (4: the warm-up): the peer that fails, once rank 0's
                                                            empty messages (all-reduce) are issued */
        struct timespec ts = {0, 10000000L};
        fakenccl_stats st;
        double t0 = hx_now();
        do {
            nanosleep(&ts, NULL);
            fakenccl_stats_get(&st);
        } while (st.pending == 0 && hx_now() - t0 < 5.0);
        ts.tv_nsec = 200000000L;
        nanosleep(&ts, NULL);
        ncclCommAbort(comm);
        return NULL;
    }
    memset(&nd, 0, sizeof nd);
    nd.comm = a->comm = comm;
    nd.compute = *s;
    nd.own_comm = a->which != 3;
    nd.channels = 1;
    nd.timeout_s = timeout_s;
    nd.connect_all = a->which != 4; /* every pair at create: the set-up under test, and the later sends need none */
    a->took = hx_now();
    a->rc = pp_nccl_create(&nd, &t, &err);
    a->took = hx_now() - a->took;
    if (a->rc != PP_OK) snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return t;
}

static void* dl_rank(void* arg) {
    dl_arg* a = (dl_arg*)arg;
    cudaStream_t s = NULL;
    pp_nccl* t = dl_nccl(a, a->which == 0 || a->which == 4 ? 5.0 : 1.0, &s);
    if (a->which != 0) pthread_barrier_wait(&g_dl_bar); /* both made (or failed to make) their transport */
    if (t && a->r == 0 && a->which != 0) {
        pp_transport tr = pp_nccl_transport(t);
        pp_request q;
        pp_error err;
        void* dev = NULL;
        cudaMalloc(&dev, 256);
        memset(&q, 0, sizeof q);
        if (a->which == 1) { /* flush: the launch never settles */
            fakenccl_options o = fakenccl_get_options();
            o.launch_delay_s = 100;
            fakenccl_set_options(&o);
        }
        static float host[64]; /* which 3: a host send, staged through the transport's own device buffer */
        a->took = hx_now();
        tr.group_start(tr.self);
        tr.isend(tr.self, 1, 5, a->which == 3 ? (void*)host : dev, 256, &q);
        a->rc = tr.group_end(tr.self);
        if (a->rc != PP_OK) snprintf(err.msg, sizeof err.msg, "%s", pp_nccl_error(t));
        if (a->which == 1) {
            a->took = hx_now() - a->took;
            if (a->rc != PP_OK) snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        }
        if (a->which >= 2) {
            a->took = hx_now();
            pp_nccl_destroy(t);
            a->took = hx_now() - a->took;
            t = NULL;
            if (a->which == 3) ncclCommAbort(a->comm); /* the caller's communicator: its work is the caller's to end */
        }
        if (t) pp_nccl_destroy(t);
        t = NULL;
        cudaFree(dev);
    }
    if (a->which != 0) pthread_barrier_wait(&g_dl_bar); /* rank 1 destroys after rank 0 */
    if (t) pp_nccl_destroy(t);
    if (t && a->which == 3) ncclCommDestroy(a->comm); /* rank 1's, the caller's */
    cudaStreamDestroy(s);
    return NULL;
}

static void dl_run(int which) {
    pthread_t th[2];
    dl_arg a[2];
    fakenccl_options o, o0 = fakenccl_get_options();
    ncclUniqueId id;
    double t0 = hx_now();
    int r;
    memset(&o, 0, sizeof o); /* rendezvous */
    o.launch_delay_s = 0.004;
    o.eager_connect = which == 0 || which == 4;
    o.abort_seen = which == 0 || which == 4;
    fakenccl_set_options(&o);
    ncclGetUniqueId(&id);
    pthread_barrier_init(&g_dl_bar, NULL, 2);
    for (r = 0; r < 2; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].r = r;
        a[r].which = which;
        a[r].id = id;
        pthread_create(&th[r], NULL, dl_rank, &a[r]);
    }
    for (r = 0; r < 2; r++) pthread_join(th[r], NULL);
    fakenccl_set_options(&o0);
    pthread_barrier_destroy(&g_dl_bar);
    if (which == 0 || which == 4)
        CHECK(a[0].rc == PP_ERR_TRANSPORT && a[0].took < 2.0 && strstr(a[0].msg, "connection set-up"),
              "a peer failed during connection set-up: rank 0 must return at once, not at its 5 s deadline: %s after %.2f s: %s",
              pp_result_str(a[0].rc), a[0].took, a[0].msg);
    if (which == 1)
        CHECK(a[0].rc == PP_ERR_TIMEOUT && a[0].took < 3.0, "a launch that never settles, timeout_s = 1: %s after %.2f s: %s",
              pp_result_str(a[0].rc), a[0].took, a[0].msg);
    if (which == 2 || which == 3)
        CHECK(a[0].rc == PP_OK && a[0].took < 3.0, "pp_nccl_destroy with a send never received, timeout_s = 1%s: %.2f s (%s)",
              which == 3 ? ", the caller's communicator, a host send" : "", a[0].took, pp_result_str(a[0].rc));
    printf("nccl-pipeline: deadline %s: %.2f s (%.2f s in all)\n",
           which == 0 ? "connect" : which == 4 ? "warm-up" : which == 1 ? "flush" : which == 2 ? "destroy" : "destroy (caller's communicator)", a[0].took,
           hx_now() - t0);
}

static void* dl_watchdog(void* arg) {
    double t0 = hx_now();
    (void)arg;
    while (!dl_done(-1)) {
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
        if (hx_now() - t0 > 6.0) {
            printf("FAIL deadlines: a host wait still runs after 6 s\n");
            fflush(stdout);
            _exit(1);
        }
    }
    return NULL;
}

static void test_deadlines(int only) { /* only: one case (0 .. 4), or -1 for all */
    int which;
    for (which = 0; which < 5; which++) {
        if (only >= 0 && which != only) continue;
        pthread_t wd;
        dl_done(0);
        pthread_create(&wd, NULL, dl_watchdog, NULL);
        dl_run(which);
        dl_done(1);
        pthread_join(wd, NULL);
    }
}
#endif

int main(int argc, char** argv) {
    uint64_t seed = 99;
    size_t i;
    int r;
    /* eight channels make 25 streams a rank (NCCL's two per communicator counted): as many
       queues as CUDA has, unless a test or the caller says otherwise */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    WBUF = mlp_init(&W0, NULL, DIMS, 7, NULL);
    mlpz_from_mlp(&W, &W0);
    for (i = 0, NPAR = 0; i < MLP_DEPTH; i++) NPAR += (size_t)DIMS[i] * DIMS[i + 1] + DIMS[i + 1];
    for (r = 0; r < MAXP; r++) {
        mlp_model g;
        size_t off = 0;
        int l;
        GBUF[r] = (float*)calloc(NPAR, sizeof(float));
        for (l = 0; l < MLP_DEPTH; l++) {
            g.dense[l] = W0.dense[l];
            g.dense[l].w = GBUF[r] + off;
            g.dense[l].b = GBUF[r] + off + (size_t)DIMS[l] * DIMS[l + 1];
            off += (size_t)DIMS[l] * DIMS[l + 1] + DIMS[l + 1];
        }
        g.xent[0] = W0.xent[0];
        mlpz_from_mlp(&G[r], &g);
    }
    GREF = (float*)calloc(NPAR, sizeof(float));
    g_model = layer_kernels_model(mlpz_model_desc());
    g_model.forward = slow_fwd;
    g_model.backward = fail_bwd;
    if (g_model.weight_grad) g_model.weight_grad = fail_wgrad;
    for (i = 0; i < ROWS * HX_IN; i++) X[i] = 2.0f * mlp_rng_uniform(&seed) - 1.0f;
    for (i = 0; i < ROWS; i++) Y[i] = (int32_t)(mlp_rng_next(&seed) % HX_CLASSES);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("PP_TEST_NCCL_TIMEOUT")) g_timeout = atof(getenv("PP_TEST_NCCL_TIMEOUT"));
    if (getenv("PP_TEST_DEVICE_DELAY_US")) g_dev_delay_us = atol(getenv("PP_TEST_DEVICE_DELAY_US"));
    if (getenv("PP_TEST_NCCL_ONE")) { /* one case while debugging: KIND P V M */
        char k[32];
        int p = 2, v = 1, m = 3;
        pp_schedule_kind kind = PP_SCHED_1F1B;
        if (sscanf(getenv("PP_TEST_NCCL_ONE"), "%31s %d %d %d", k, &p, &v, &m) == 4) pp_schedule_kind_parse(k, &kind);
        run_case(kind, p, v, m, PP_SHAPES_LOCAL, 1, NULL);
    } else if (getenv("PP_TEST_NCCL_RENDEZVOUS")) { /* the rendezvous check alone */
        test_rendezvous();
    } else if ((argc == 6 || argc == 7) && !strcmp(argv[1], "one")) { /* one KIND P V M [RUNS] (what a negative control runs) */
        pp_schedule_kind kind = PP_SCHED_1F1B;
        int n = argc == 7 ? atoi(argv[6]) : 1;
        pp_schedule_kind_parse(argv[2], &kind);
        while (n-- > 0) run_case(kind, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), PP_SHAPES_LOCAL, 1, NULL);
    } else if (argc > 1 && !strcmp(argv[1], "no-step-end")) { /* what the negative control runs */
        test_no_step_end();
    } else if (argc > 1 && !strcmp(argv[1], "eval")) {
        test_eval();
    } else if (argc > 1 && !strcmp(argv[1], "queues")) { /* what the negative control runs */
        test_old_queues();
        test_one_queue();

    } else if (argc > 1 && !strcmp(argv[1], "recompute")) {
        test_recompute_nccl();
    } else if (argc > 1 && !strcmp(argv[1], "neighbours")) {
        test_neighbours();
    } else if (argc > 1 && !strcmp(argv[1], "p8")) {
        test_p8();
    } else if (argc > 1 && !strcmp(argv[1], "connect-fail")) {
        test_connect_fail();
#ifdef FAKENCCL
    } else if (argc > 1 && !strcmp(argv[1], "deadlines")) { /* [CASE]: what the negative controls run */
        test_deadlines(argc > 2 ? atoi(argv[2]) : -1);
#endif
    } else if (argc > 1 && !strcmp(argv[1], "share")) { /* what the negative control runs */
        test_share();
    } else if (argc > 1 && !strcmp(argv[1], "drain")) { /* what the negative control runs */
        test_failure_drain();
    } else if (argc > 1 && !strcmp(argv[1], "sends")) { /* what the negative controls run */
        test_send_completion();
        test_released();
        test_pool_ends();
    } else if (argc > 1 && !strcmp(argv[1], "nccl-version")) { /* tools/gpu_nccl.sh: the NCCL this binary loads */
        int ver = 0;
        ncclGetVersion(&ver);
        printf("nccl-version: the loaded NCCL is %d (%d.%d.%d), built against %d\n", ver, ver / 10000, ver / 100 % 100, ver % 100,
               NCCL_VERSION_CODE);
        return ver >= 23003 ? 0 : 2; /* 2.30.3: the first with NCCL_MULTI_RANK_GPU_ENABLE (src/init.cc) */
    } else if (argc == 3 && !strcmp(argv[1], "gpu-matrix")) { /* the schedules at p = argv[2] alone, timed */
        g_gpu_p = atoi(argv[2]);
        g_say_times = 1;
        test_matrix_gpu();
    } else if (argc > 1 && !strcmp(argv[1], "gpu")) { /* real NCCL: what does not lean on the imitation's rendezvous
                                                        (over the imitation with staged layers in make test);
                                                        `gpu 2`: no test with more than two ranks, timed */
        if (argc > 2) g_gpu_p = atoi(argv[2]), g_say_times = 1;
        test_late_zeros();
        test_share();
        test_no_step_end();
        test_connect_fail();
        test_matrix_gpu();
        test_failure();
        test_failure_drain();
    } else {
        test_send_completion();
        test_released();
        test_pool_ends();
        test_late_zeros();
        test_share();
        test_no_step_end();
        test_connect_fail();
#ifdef FAKENCCL
        test_deadlines(-1);
#endif
        test_rendezvous();
        test_old_queues();
        test_one_queue();

        test_neighbours();
        test_matrix();
        test_recompute_nccl();
        test_eval();
        test_failure();
        test_failure_drain();
        test_slow();
    }
    for (r = 0; r < MAXP; r++) free(GBUF[r]);
    free(GREF);
    free(WBUF);
#if defined(PP_TEST_REAL_CUDA) || defined(PP_TEST_STAGED_LAYERS)
    layer_staged_free();
#endif
    return TEST_DONE("nccl-pipeline");
}
