/* tests/test_nccl_grid.c - a pp = 2 x dp = 2 grid over pipeline_nccl.h and the NCCL imitation
   (tests/fakenccl over tests/fakecuda), without a GPU: what examples/gpt_nccl.cu does on four GPUs.

   Four rank threads, each on its own imitation device, make a world communicator from one id
   (pp_nccl_comm_init: non-blocking, polled), split it with pp_nccl_grid_create into the pipeline,
   data-parallel and tied-pair transports, and train the tied-embedding LM (examples/tlm.h, its
   layers as imitation kernels on the rank's compute stream, device blocks from a one-rank
   pp_cuda): the head's copy of the embedding starts wrong and pp_tied_sync_weights fixes it, then
   every step pp_stage_step, pp_nccl_step_end, pp_tied_sum_grads over the tied pair and
   pp_grad_allreduce (mean) over the data-parallel group. Each rank's gradients of the layers it
   owns equal the sequential reference (every replica, tied sums, mean) bit for bit, and after
   SGD steps the tied copies and the replicas stay bit-identical. GPipe, 1F1B and ZB-H1; p = 2
   carries both directions between one pair of ranks. 1F1B and ZB-H1 again with the
   data-parallel reduction overlapped with the cool-down (pp_dp_overlap from the gradients-final
   hook over the dp communicator, the tied layers after the tied sum in pp_dp_overlap_wait): the
   same bits, and every bucket of the hooks was started (the dp transport's iallreduce_sum) and
   completed by the wait; then one started all-reduce of device memory (and, in the last run, of
   host memory) that a slow kernel on the compute stream writes: the sum of every replica's. */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#include "../examples/tlm.h"
#include "test.h"
#include "harness.h"
#ifdef PP_TEST_REAL_CUDA /* real NCCL and CUDA (make gpu-nccl: test_nccl_grid-gpu), ranks on the devices there are */
#include "layer_staged.h"
#else
#include "fakecuda/layer_kernels.h"
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PP 2
#define DP 2
#define NR (PP * DP)
#include "tlm_grid.h"


/* A layer failing on one replica (issue 39, item 1 over NCCL): world rank FAIL_WR's forward of
   micro-batch 0 at step FAIL_STEP; the steps of the run with the fault. */
#define FAIL_WR 2   /* DP_INNER: pp rank 1, replica 0 */
#define FAIL_STEP 1
#define FSTEPS 4
static cudaStream_t g_streams[NR]; /* each rank's compute stream: the layers' ctx, which rank runs */
static int g_step[NR];
static int g_fault;
static pp_model g_inner;
static int fault_fwd(const void* w, int l, pp_layer_io* io) {
    int wr = (int)((const cudaStream_t*)io->ctx - g_streams);
    if (g_fault && wr == FAIL_WR && g_step[wr] == FAIL_STEP && io->mb->index == 0) return 42;
    return g_inner.forward(w, l, io);
}

typedef struct world {
    ncclUniqueId id;
    pp_model model;             /* the LM's layers as imitation kernels (made once) */
    pp_schedule sc;
    int first[PP * 2 + 1];
    int m;
    int overlap;                /* 1: pp_dp_overlap (2: its direct check on host memory); 0: pp_grad_allreduce after the step */
    int refused;                /* 1: every rank's pp_stage_create must refuse the schedule (queues_run) */
    float* w[NR];               /* each rank's weights and gradients, host memory */
    float* g[NR];
    float* wref;
    int bad[NR];
    int fault;                  /* 1: FAIL_WR's layer fails at FAIL_STEP; FSTEPS steps, each rank's outcomes kept */
    pp_result out[NR][FSTEPS];
    char omsg[NR][FSTEPS][sizeof(((pp_error*)0)->msg)];
    pp_result rc[NR];
    char msg[NR][700];
    pp_nccl_stats nst[NR][3];   /* after pp_stage_create: the pipeline, dp and tied transports' */
#ifndef PP_TEST_REAL_CUDA
    fakenccl_conn_stats fc[NR]; /* what the rank's NCCL calls set up by then (the imitation's count) */
    uint64_t step_setups[NR][STEPS]; /* set-ups from a step's start to its all-reduces' end */
#endif
} world;

typedef struct rank_arg {
    world* W;
    int r;
} rank_arg;

static int owner(const world* W, int layer) { return pp_schedule_layer_rank(&W->sc, W->first, layer); }
#define layer_range tlm_grid_layer_range

/* What pipeline_nccl.h sets up on one rank of one transport (issue 42): communicators,
   point-to-point connections (one direction, one peer, one channel), ring connections, and the
   device bytes NCCL's rule gives them (pp_nccl_stats.conn_bytes), from the library's own rules:
   the channel count its schedule check picks (_ppn_check_channels), the pairs it connects
   (_ppn_schedule_want) and their channels (_ppn_channel_of). sc NULL: a transport that only
   all-reduces (pp_nccl_desc.collective_only). old: before issue 42: 8 channels (4 for two ranks)
   made at create, every pair both ways on each channel a message of either kind takes, no
   warm-up (a ring set up at the first all-reduce, where there is one: rings). */
typedef struct grid_plan {
    int comms, p2p_send, p2p_recv, rings;
    uint64_t bytes;
} grid_plan;
static void transport_plan(const pp_schedule* sc, int me, int n, int old, int rings, grid_plan* out) {
    static unsigned char want[PP_MAX_RANKS];
    int nch = 1, ch, q, d, k;
    memset(out, 0, sizeof *out);
    out->comms = 1;
    if (n < 2) return;
    if (old) nch = n > 2 ? 8 : 4;
    else if (sc)
        while (nch < (n > 2 ? 8 : 4) && _ppn_check_channels(sc, nch, NULL) != PP_OK) nch *= 2;
    out->comms = nch;
    memset(want, 0, sizeof want);
    if (sc && !old) _ppn_schedule_want(sc, me, n, want);
    for (ch = 0; ch < nch && (old || sc); ch++)
        for (q = 0; q < n; q++)
            for (d = 0; d < 2 && q != me; d++) {
                int used = 0;
                for (k = 0; k < 2; k++)
                    used |= (old || (want[q] >> (2 * k + d) & 1)) && _ppn_channel_of(nch, me, d, q, k) == ch;
                if (used && d) out->p2p_recv++;
                else if (used) out->p2p_send++;
            }
    out->rings = old ? rings : 1;
    out->bytes = (uint64_t)(out->p2p_recv + out->rings) * PP_NCCL_CONN_BYTES;
}
/* The pipeline transport's plan for pipeline rank pr under sc matches what it set up. */
static int plan_matches(const pp_schedule* sc, int pr, const pp_nccl_stats* ps) {
    grid_plan p;
    transport_plan(sc, pr, sc->p, 0, 0, &p);
    return p.comms == ps[0].comms && p.p2p_send == ps[0].p2p_send && p.p2p_recv == ps[0].p2p_recv && p.rings == ps[0].coll_recv &&
           p.bytes == ps[0].conn_bytes;
}
static void grid_plan_rank(const pp_schedule* sc, int pr, int old, char* buf, size_t cap) {
    grid_plan p;
    transport_plan(sc, pr, sc->p, old, 0, &p);
    snprintf(buf, cap, "%d comms, %d + %d p2p, %d ring", p.comms, p.p2p_send, p.p2p_recv, p.rings);
}

/* docs/multiprocess.md's table: a pp x dp grid of 1F1B (m = 2 pp), DP_INNER, the rank that holds
   the most (the first stage's: the agreement's star and the tied pair), before and after. The
   pipeline transport all-reduces only in pp_dp_overlap_wait's vote: before, no ring on it. */
static void grid_table(void) {
    static const int pps[] = {2, 4, 8}, dps[] = {1, 8, 64};
    static pp_action acts[8 * 64 * 4];
    int i, j, old, pr;
    printf("| pp x dp | communicators per rank, before | after | connections per rank, before | after | MiB per rank, before | after |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (i = 0; i < 3; i++)
        for (j = 0; j < 3; j++) {
            int pp = pps[i], dp = dps[j], comms[2] = {0, 0}, conns[2] = {0, 0};
            uint64_t bytes[2] = {0, 0};
            pp_schedule sc;
            pp_error err;
            if (pp_schedule_make(PP_SCHED_1F1B, pp, 1, 2 * pp, acts, sizeof acts / sizeof acts[0], &sc, &err) != PP_OK) {
                CHECK(0, "table: %s", err.msg);
                return;
            }
            for (old = 0; old < 2; old++)
                for (pr = 0; pr < pp; pr++) {
                    grid_plan a, b, c;
                    transport_plan(&sc, pr, pp, old, 0, &a);
                    transport_plan(NULL, 0, dp, old, 1, &b);
                    memset(&c, 0, sizeof c);
                    if (pr == 0 || pr == pp - 1) transport_plan(NULL, pr == 0 ? 0 : 1, 2, old, 1, &c);
                    if (a.bytes + b.bytes + c.bytes > bytes[old]) {
                        bytes[old] = a.bytes + b.bytes + c.bytes;
                        comms[old] = a.comms + b.comms + c.comms;
                        conns[old] = a.p2p_send + a.p2p_recv + b.p2p_send + b.p2p_recv + c.p2p_send + c.p2p_recv +
                                     2 * (a.rings + b.rings + c.rings);
                    }
                }
            printf("| %d x %d | %d | %d | %d | %d | %.0f | %.0f |\n", pp, dp, comms[1], comms[0], conns[1], conns[0],
                   (double)bytes[1] / 1048576.0, (double)bytes[0] / 1048576.0);
        }
}

static uint64_t shard_seed(int step, int replica) { return 500u + 13u * (uint64_t)step + (uint64_t)replica; }
static void reference(const float* wa, float* gref, int step, int m) { tlm_grid_reference(wa, gref, step, m, DP, shard_seed); }

#ifndef PP_TEST_REAL_CUDA
/* Gradients through the dp transport's started all-reduce (pipeline_nccl.h iallreduce_sum): a
   slow kernel on the compute stream writes this replica's values into device memory (then, a
   second time, into host memory, as the imitation's layers write host gradients), the
   all-reduce is started right after it is enqueued (as the gradients-final hook does), and the
   wait's result holds every replica's values summed. An all-reduce that does not wait for the
   compute stream reads the bytes before the kernel wrote them (the control
   PP_NCCL_TEST_DP_UNORDERED). */
#define DEVN 300
typedef struct dev_fill {
    float* p; /* device memory, or host memory where host */
    int replica, host;
} dev_fill;
static int dev_fill_kernel(void* user) {
    dev_fill* f = (dev_fill*)user;
    float* q = f->host ? f->p : (float*)fakecuda_dev_ptr(f->p, DEVN * sizeof(float));
    struct timespec ts = {0, 20 * 1000 * 1000}; /* a backward that is still running */
    int i;
    if (!q) return 1;
    nanosleep(&ts, NULL);
    for (i = 0; i < DEVN; i++) q[i] = (float)((f->replica + 1) * (i + 1)) * 0.25f;
    return 0;
}
static void dp_device_check(world* W, int wr, const pp_transport* dpt, cudaStream_t cs, int replica, int host) {
    static dev_fill fills[NR];
    static float hbuf[NR][DEVN];
    float* d = NULL;
    float h[DEVN];
    int all[DP], i, k;
    pp_request req;
    pp_error err;
    pp_result rc;
    for (k = 0; k < DP; k++) all[k] = k;
    err.msg[0] = 0;
    if (host) {
        d = hbuf[wr];
        memset(d, 0, sizeof h);
    } else if (cudaMalloc((void**)&d, sizeof h) != cudaSuccess) {
        W->bad[wr]++;
        snprintf(W->msg[wr], sizeof W->msg[wr], "device check: cudaMalloc");
        return;
    }
    fills[wr].p = d;
    fills[wr].replica = replica;
    fills[wr].host = host;
    rc = fakecuda_launch(cs, dev_fill_kernel, &fills[wr]) == cudaSuccess ? PP_OK : PP_ERR_TRANSPORT;
    if (rc == PP_OK) rc = dpt->iallreduce_sum(dpt->self, d, DEVN, PP_F32, all, DP, &req);
    if (rc == PP_OK) rc = dpt->wait(dpt->self, &req, 20, &err);
    if (rc == PP_OK && cudaMemcpy(h, d, sizeof h, cudaMemcpyDefault) != cudaSuccess) rc = PP_ERR_TRANSPORT;
    for (i = 0; rc == PP_OK && i < DEVN; i++) {
        float want = 0;
        for (k = 0; k < DP; k++) want += (float)((k + 1) * (i + 1)) * 0.25f;
        if (h[i] != want) {
            W->bad[wr]++;
            snprintf(W->msg[wr], sizeof W->msg[wr], "%s all-reduce: element %d is %g, not %g", host ? "host" : "device", i, h[i],
                     want);
            break;
        }
    }
    if (rc != PP_OK) {
        W->bad[wr]++;
        snprintf(W->msg[wr], sizeof W->msg[wr], "%s all-reduce: %s %s", host ? "host" : "device", pp_result_str(rc), err.msg);
    }
    if (!host) cudaFree(d);
}
#endif

static void* rank_main(void* arg) {
    rank_arg* a = (rank_arg*)arg;
    world* W = a->W;
    int wr = a->r, dev = 0, step;
    pp_error err;
    ncclComm_t comm = NULL;
    pp_nccl_grid g;
    pp_cuda* c = NULL;
    pp_stage* st = NULL;
    pp_stage_desc d;
    pp_dp_overlap* ov = NULL;
    pp_grad_buf bufs[2 * TLM_DEPTH + 2];
    pp_transport pipe, tied, dpt;
    memset(&pipe, 0, sizeof pipe);
    memset(&tied, 0, sizeof tied);
    memset(&dpt, 0, sizeof dpt);
    tlm_model w, gw;
    size_t n = tlm_param_count(VOCAB, DIM), nE = (size_t)VOCAB * DIM;
    float* gref = (float*)malloc(n * sizeof(float));
    float* wref = (float*)malloc(n * sizeof(float));
    int pair[2] = {0, 1}, have_grid = 0;
    shard s;
    pp_result rc;
    err.msg[0] = 0;
    /* device wr modulo the devices there are: several ranks on one GPU need NCCL >= 2.30 with
       NCCL_MULTI_RANK_GPU_ENABLE=1 */
    rc = hx_nccl_rank(wr, NR, &W->id, 20, &dev, &comm, &c, &err);
    if (rc == PP_OK) rc = pp_nccl_grid_create(comm, PP, PP_GRID_DP_INNER, pp_cuda_stream(c, 0), 20, &g, &err);
    have_grid = rc == PP_OK;
    if (have_grid) {
        pipe = pp_nccl_transport(g.pipe);
        tied = pp_nccl_transport(g.tied);
        dpt = pp_nccl_transport(g.dp);
    }
    tlm_layout(&w, W->w[wr], VOCAB, DIM, 0);
    tlm_layout(&gw, W->g[wr], VOCAB, DIM, 0);
    memcpy(wref, W->wref, n * sizeof(float));
    if (rc == PP_OK && g.tied) /* the head's copy of E starts wrong: the first stage's replaces it */
        rc = pp_tied_sync_weights(&tied, pair, g.grid.pp_rank == 0 ? w.embed[0].E : NULL,
                                  g.grid.pp_rank == PP - 1 ? w.head[0].E : NULL, nE * sizeof(float), 20, &err);
    hx_stage_desc(&d, NULL, W->model, &w, &gw, &W->sc, W->first, have_grid ? g.grid.pp_rank : 0, pipe);
    d.device = pp_cuda_device_ops(c, 0);
    g_streams[wr] = pp_cuda_stream(c, 0);
    d.layer_ctx = &g_streams[wr];
    d.timeout_s = 20;
    if (rc == PP_OK && W->overlap) {
        pp_dp_overlap_desc od;
        tlm_overlap_desc(&od, &gw, &W->sc, W->first, g.grid.pp_rank, g.tied ? &tied : NULL, pair, bufs);
        od.dp.t = &dpt;
        od.dp.timeout_s = W->fault ? 3 : 20; /* the fault run's controls fail within it */
        od.bucket_bytes = 64;
        rc = tlm_grid_hook_overlap(&od, &d, &ov, &err);
    }
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    if (rc == PP_OK) {
        pp_nccl_get_stats(g.pipe, &W->nst[wr][0]);
        pp_nccl_get_stats(g.dp, &W->nst[wr][1]);
        pp_nccl_get_stats(g.tied, &W->nst[wr][2]);
#ifndef PP_TEST_REAL_CUDA
        fakenccl_thread_connections(&W->fc[wr]);
#endif
    }
    /* the fault run: every rank ends every step with pp_dp_overlap_wait, whatever its step
       returned; where the wait fails (on every rank: the grid's vote) the recovery of
       docs/errors.md: pp_dp_overlap_reset, the gradients zeroed (each step starts so), no update
       (nor on the reference); nothing to make again here: a layer's failure over NCCL drains the
       step, no communicator is aborted (an aborted one would fail every later step, named) */
    for (step = 0; W->fault && step < FSTEPS && rc == PP_OK; step++) {
        pp_result sr, w2;
        pp_error e2;
        e2.msg[0] = 0;
        g_step[wr] = step;
        sr = tlm_grid_stage_step(st, W->g[wr], &s, shard_seed(step, g.grid.dp_rank), W->m, NULL, &err);
        w2 = pp_nccl_step_end(g.pipe, 20, &e2);
        if (sr == PP_OK && w2 != PP_OK) {
            sr = w2;
            snprintf(err.msg, sizeof err.msg, "%s", e2.msg);
        }
        if (pp_cuda_step_end(c, NULL, &e2) != PP_OK && sr == PP_OK) sr = PP_ERR_TRANSPORT;
        w2 = pp_dp_overlap_wait(ov, NULL, &e2);
        W->out[wr][step] = w2;
        snprintf(W->omsg[wr][step], sizeof W->omsg[wr][step], "%s", w2 == PP_OK ? "" : e2.msg);
        reference(wref, gref, step, W->m);
        if (w2 != PP_OK) {
            pp_dp_overlap_reset(ov);
            continue;
        }
        tlm_grid_check_sgd(W->w[wr], W->g[wr], wref, gref, &W->sc, W->first, g.grid.pp_rank, step, &W->bad[wr], W->msg[wr],
                           sizeof W->msg[wr]);
    }
    /* a blocking all-reduce of host memory (the vote's) whose peer never comes: an error at its
       deadline, not a host stuck in the copy back (pageable memory: that copy waits for NCCL) */
    if (W->fault && rc == PP_OK && g.grid.dp_rank == 0) {
        float x[8] = {0};
        int both[DP] = {0, 1};
        double t0 = hx_now(), dt;
        pp_error e3;
        pp_result ar = dpt.allreduce_sum(dpt.self, x, 8, PP_F32, both, DP, 1.0, &e3);
        dt = hx_now() - t0;
        if (ar == PP_OK || dt > 3.0) {
            W->bad[wr]++;
            snprintf(W->msg[wr], sizeof W->msg[wr], "an all-reduce with no peer: %s after %.1f s (deadline 1 s)", pp_result_str(ar), dt);
        }
    }
    if (W->fault && rc == PP_OK && g.grid.dp_rank != 0) { /* the peer stays until that deadline has passed */
        struct timespec ts = {1, 500 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (step = 0; !W->fault && step < STEPS && rc == PP_OK; step++) {
#ifndef PP_TEST_REAL_CUDA
        uint64_t setups0 = fakenccl_thread_connects();
#endif
        if ((rc = tlm_grid_stage_step(st, W->g[wr], &s, shard_seed(step, g.grid.dp_rank), W->m, NULL, &err)) != PP_OK) break;
        if ((rc = pp_nccl_step_end(g.pipe, 20, &err)) != PP_OK) break;
        if ((rc = pp_cuda_step_end(c, NULL, &err)) != PP_OK) break; /* the kernels wrote the host gradients */
        if (W->overlap) {
            pp_dp_overlap_stats os;
            if ((rc = pp_dp_overlap_wait(ov, &os, &err)) == PP_OK && os.buckets_hook < 1) {
                W->bad[wr]++;
                snprintf(W->msg[wr], sizeof W->msg[wr], "step %d: overlap: no bucket reduced in the hook (%d after)", step,
                         os.buckets_wait);
            } else if (rc == PP_OK && os.buckets_started != os.buckets_hook) { /* pipeline_nccl.h's iallreduce_sum */
                W->bad[wr]++;
                snprintf(W->msg[wr], sizeof W->msg[wr], "step %d: overlap: %d of the hook's %d buckets were started, the others "
                         "blocked the hook", step, os.buckets_started, os.buckets_hook);
            }
        } else {
            if (g.tied)
                rc = pp_tied_sum_grads(&tied, pair, g.grid.pp_rank == 0 ? gw.embed[0].E : NULL,
                                       g.grid.pp_rank == PP - 1 ? gw.head[0].E : NULL, nE, PP_F32, 20, &err);
            if (rc == PP_OK) rc = pp_grad_allreduce(&dpt, NULL, 0, W->g[wr], n, PP_F32, 1.0 / DP, 20, &err);
        }
        if (rc != PP_OK) break;
#ifndef PP_TEST_REAL_CUDA
        W->step_setups[wr][step] = fakenccl_thread_connects() - setups0;
#endif
        reference(wref, gref, step, W->m);
        tlm_grid_check_sgd(W->w[wr], W->g[wr], wref, gref, &W->sc, W->first, g.grid.pp_rank, step, &W->bad[wr], W->msg[wr],
                           sizeof W->msg[wr]);
    }
#ifndef PP_TEST_REAL_CUDA
    if (rc == PP_OK && W->overlap && !W->fault) dp_device_check(W, wr, &dpt, pp_cuda_stream(c, 0), g.grid.dp_rank, W->overlap == 2);
#endif
    if (rc != PP_OK) snprintf(W->msg[wr], sizeof W->msg[wr], "%s", err.msg);
    W->rc[wr] = rc;
    pp_stage_destroy(st);
    pp_dp_overlap_destroy(ov);
    if (have_grid) pp_nccl_grid_destroy(&g);
    if (comm) ncclCommDestroy(comm);
    pp_cuda_destroy(c);
    free(gref);
    free(wref);
    return NULL;
}

/* Every rank of the grid a thread running rank_main over W, to the end. */
static void run_ranks(world* W) {
    pthread_t th[NR];
    rank_arg arg[NR];
    int r;
    for (r = 0; r < NR; r++) {
        arg[r].W = W;
        arg[r].r = r;
        pthread_create(&th[r], NULL, rank_main, &arg[r]);
    }
    for (r = 0; r < NR; r++) pthread_join(th[r], NULL);
}

static void grid_run_v(pp_schedule_kind kind, int v, int m, int overlap, int refused) {
    static pp_action acts[PP * 2 * 2 * 16];
    world W;
    pp_error err;
    size_t nE = (size_t)VOCAB * DIM, hoff, hn;
    int r, d;
    pp_result rc;
    memset(&W, 0, sizeof W);
    W.model = layer_kernels_model(tlm_model_desc());
    W.m = m;
    W.overlap = overlap;
    W.refused = refused;
    rc = pp_schedule_make(kind, PP, v, m, acts, sizeof acts / sizeof acts[0], &W.sc, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(W.model.n_layers, PP * v, W.first, &err);
    CHECK(rc == PP_OK, "setup: %s", err.msg);
    if (rc != PP_OK) return;
    CHECK(owner(&W, TLM_EMBED_LAYER) == 0 && owner(&W, TLM_HEAD_LAYER) == PP - 1, "the tied pair is {0, %d}", PP - 1);
    ncclGetUniqueId(&W.id);
    W.wref = tlm_grid_weights(W.w, W.g, NR);
    layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    run_ranks(&W);
    for (r = 0; refused && r < NR; r++) /* the same refusal on every rank, naming the variable and what fits */
        CHECK(W.rc[r] == PP_ERR_UNSUPPORTED && strstr(W.msg[r], "CUDA_DEVICE_MAX_CONNECTIONS=") &&
                  strstr(W.msg[r], "queues_held"), "%s: world rank %d: %s (want the queues' refusal)",
              pp_schedule_name(kind), r, W.rc[r] == PP_OK ? "PP_OK" : W.msg[r]);
    if (refused) {
        tlm_grid_free(W.wref, W.w, W.g, NR);
        return;
    }
    for (r = 0; r < NR; r++) {
        CHECK(W.rc[r] == PP_OK, "%s: world rank %d: %s", pp_schedule_name(kind), r, W.msg[r]);
        CHECK(W.bad[r] == 0, "%s: world rank %d: %s", pp_schedule_name(kind), r, W.msg[r]);
    }
    for (r = 0; r < NR && W.rc[r] == PP_OK; r++) { /* connections only where used (issue 42) */
        const pp_nccl_stats* ps = W.nst[r];
        char want[160];
        int k, pr = r / DP; /* DP_INNER */
        /* dp: one communicator and a ring's connections (one send, one receive per NCCL channel:
           src/transport/generic.cc ncclTransportRingConnect), nothing else. tied: the same, and the
           one connection pp_tied_sync_weights' copy (first stage to last, a send and its receive)
           makes at its first use, before the first step */
        for (k = 1; k < 3; k++)
            CHECK(ps[k].comms == (k == 2 && pr != 0 && pr != PP - 1 ? 0 : 1) &&
                      ps[k].p2p_send + ps[k].p2p_recv == (k == 2 && ps[k].comms ? 1 : 0) && ps[k].p2p_lazy == ps[k].p2p_send + ps[k].p2p_recv &&
                      ps[k].coll_send + ps[k].coll_recv <= 2 && ps[k].conn_bytes <= (uint64_t)(1 + ps[k].p2p_recv) * PP_NCCL_CONN_BYTES,
                  "%s: world rank %d: the %s transport holds %d communicators, %d + %d point-to-point and %d + %d ring "
                  "connections (%llu bytes): want 1, none (tied: the weights' copy), at most 1 + 1",
                  pp_schedule_name(kind), r, k == 1 ? "data-parallel" : "tied", ps[k].comms, ps[k].p2p_send, ps[k].p2p_recv,
                  ps[k].coll_send, ps[k].coll_recv, (unsigned long long)ps[k].conn_bytes);
        grid_plan_rank(&W.sc, pr, 0, want, sizeof want);
        CHECK(plan_matches(&W.sc, pr, ps), "%s: world rank %d: the pipeline transport's connections are not the plan's "
              "(%d comms, %d + %d p2p, %d + %d ring; want %s)", pp_schedule_name(kind), r, ps[0].comms, ps[0].p2p_send,
              ps[0].p2p_recv, ps[0].coll_send, ps[0].coll_recv, want);
#ifndef PP_TEST_REAL_CUDA
        {
            uint64_t mine = ps[0].conn_bytes + ps[1].conn_bytes + ps[2].conn_bytes, s0 = 0;
            CHECK(W.fc[r].bytes == mine && W.fc[r].p2p_recv == (uint64_t)(ps[0].p2p_recv + ps[1].p2p_recv + ps[2].p2p_recv),
                  "%s: world rank %d: the imitation counts %llu bytes (%llu point-to-point receives) set up, pp_nccl_get_stats %llu",
                  pp_schedule_name(kind), r, (unsigned long long)W.fc[r].bytes, (unsigned long long)W.fc[r].p2p_recv,
                  (unsigned long long)mine);
            for (k = 0; k < STEPS; k++) s0 += W.step_setups[r][k];
            CHECK(W.step_setups[r][0] == 0 && s0 == 0, "%s: world rank %d: %llu connection set-ups in step 0, %llu in all steps "
                  "(create sets up everything a step uses)", pp_schedule_name(kind), r, (unsigned long long)W.step_setups[r][0],
                  (unsigned long long)s0);
        }
#endif
    }
    for (d = 0; d < DP; d++) { /* DP_INNER: world rank = pp_rank * DP + dp_rank */
        int ra = 0 * DP + d, rb = (PP - 1) * DP + d;
        CHECK(memcmp(W.w[ra], W.w[rb] + hoff, nE * sizeof(float)) == 0, "%s: replica %d: tied copies differ after %d steps",
              pp_schedule_name(kind), d, STEPS);
        CHECK(memcmp(W.w[ra], W.w[0], nE * sizeof(float)) == 0, "%s: replicas differ", pp_schedule_name(kind));
    }
    tlm_grid_free(W.wref, W.w, W.g, NR);
}

static void grid_run(pp_schedule_kind kind, int m, int overlap) { grid_run_v(kind, 1, m, overlap, 0); }

#ifndef PP_TEST_REAL_CUDA
/* The grid's hardware queues. A rank holds, besides its pipe's streams, the world communicator's
   two NCCL streams and the dp and tied transports' (each its stream and NCCL's two): 8 more
   (pp_nccl_grid_create's queues_held). Interleaved p = 2, m = 4 runs over 2 channels: 1 + 8 +
   2 * 3 = 15 streams. At 15 queues it runs, every stream on a queue of its own and exactly 15
   made per device; at 14 every rank refuses it at pp_stage_create (the pipe counted only its own
   7 before, took 2 channels at 8 queues, and a channel's stream waited behind another
   communicator's work). 1F1B at 8 runs on one channel, which needs no queue of its own. */
static void queues_run(void) {
    const char* was = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    char keep[32];
    uint64_t made[NR], shared;
    int r;
    snprintf(keep, sizeof keep, "%s", was ? was : "");
    for (r = 0; r < NR; r++) made[r] = fakecuda_streams_made(r);
    shared = fakecuda_queue_shared();
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "15", 1);
    grid_run_v(PP_SCHED_INTERLEAVED, 2, 4, 0, 0);
    for (r = 0; r < NR; r++)
        CHECK(fakecuda_streams_made(r) - made[r] == 15, "queues: device %d: %llu streams made for interleaved p=2 over a "
              "grid, want 15 (1 + 8 held + 2 channels x 3)", r, (unsigned long long)(fakecuda_streams_made(r) - made[r]));
    CHECK(fakecuda_queue_shared() == shared, "queues: %llu streams made onto a held queue at 15 queues",
          (unsigned long long)(fakecuda_queue_shared() - shared));
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "14", 1);
    grid_run_v(PP_SCHED_INTERLEAVED, 2, 4, 0, 1);
    CHECK(fakecuda_queue_shared() == shared, "queues: %llu streams made onto a held queue at 14 queues",
          (unsigned long long)(fakecuda_queue_shared() - shared));
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8", 1);
    grid_run(PP_SCHED_1F1B, 5, 1);
    if (was) setenv("CUDA_DEVICE_MAX_CONNECTIONS", keep, 1);
    else unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("nccl-grid queues: interleaved p=2 at 15 queues runs (15 streams a device), at 14 refused; 1F1B at 8 runs\n");
}
#endif

/* Issue 39, item 1 over NCCL: pp 2 x dp 2 with the overlapped reduction (1F1B), a layer failing
   on replica 0 at step 1, the documented recovery. Step 1 fails on every rank of the grid, each
   naming an error; steps 0, 2 and 3 are bit-exact on every rank (the updates of the good steps
   only, on the reference too), and the replicas' weights end identical. Without the grid's vote
   replica 1 took the step's sums (replica 0's drained zeros in them) as PP_OK (the control
   -DPP_TEST_NO_DP_AGREE); where the failed replica skipped its wait's all-reduces and went
   straight to the vote, the collectives met out of order (NCCL has no tags) and the grid hung to
   its deadline, then failed for good (-DPP_TEST_NO_DP_SAME_ORDER). */
static void fault_run(void) {
    static pp_action acts[PP * 2 * 2 * 16];
    world W;
    pp_error err;
    size_t nE = (size_t)VOCAB * DIM;
    int r, step;
    pp_result rc;
    memset(&W, 0, sizeof W);
    g_inner = layer_kernels_model(tlm_model_desc());
    W.model = g_inner;
    W.model.forward = fault_fwd;
    W.m = 5;
    W.overlap = 1;
    W.fault = g_fault = 1;
    rc = pp_schedule_make(PP_SCHED_1F1B, PP, 1, W.m, acts, sizeof acts / sizeof acts[0], &W.sc, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(W.model.n_layers, PP, W.first, &err);
    CHECK(rc == PP_OK, "fault setup: %s", err.msg);
    if (rc != PP_OK) return;
    ncclGetUniqueId(&W.id);
    W.wref = tlm_grid_weights(W.w, W.g, NR);
    run_ranks(&W);
    for (r = 0; r < NR; r++) {
        CHECK(W.rc[r] == PP_OK, "fault: world rank %d: %s", r, W.msg[r]);
        CHECK(W.bad[r] == 0, "fault: world rank %d returned PP_OK with gradients other than the reference's: %s", r, W.msg[r]);
        for (step = 0; step < FSTEPS; step++) {
            if (step == FAIL_STEP)
                CHECK(W.out[r][step] != PP_OK && strstr(W.omsg[r][step], pp_result_str(W.out[r][step])),
                      "fault: step %d: world rank %d: %s (every rank fails the step, naming its error)", step, r,
                      W.out[r][step] == PP_OK ? "PP_OK" : W.omsg[r][step]);
            else
                CHECK(W.out[r][step] == PP_OK, "fault: step %d: world rank %d: %s", step, r, W.omsg[r][step]);
        }
    }
    printf("nccl-grid fault: step %d: %s | %s | %s | %s\n", FAIL_STEP, W.omsg[0][FAIL_STEP], W.omsg[1][FAIL_STEP],
           W.omsg[2][FAIL_STEP], W.omsg[3][FAIL_STEP]);
    /* DP_INNER: world rank = pp_rank * DP + dp_rank; replica 1's ranks against replica 0's */
    CHECK(memcmp(W.w[0], W.w[1], nE * sizeof(float)) == 0, "fault: the replicas' embeddings differ after the run");
    CHECK(memcmp(W.w[0], W.w[DP] + (tlm_param_count(VOCAB, DIM) - nE), nE * sizeof(float)) == 0,
          "fault: replica 0's tied copies differ after the run");
    g_fault = 0;
    tlm_grid_free(W.wref, W.w, W.g, NR);
}

int main(int argc, char** argv) {
#ifndef PP_TEST_REAL_CUDA
    uint64_t shared0;
#endif
    if (argc > 1 && !strcmp(argv[1], "table")) { /* docs/multiprocess.md: connections and memory per rank */
        grid_table();
        return TEST_DONE("nccl-grid table");
    }
#ifndef PP_TEST_REAL_CUDA
    if (argc > 1 && !strcmp(argv[1], "queues")) { /* the queues run alone (the control) */
        setvbuf(stdout, NULL, _IOLBF, 0);
        queues_run();
        return TEST_DONE("nccl-grid queues");
    }
#endif
    if (argc > 1 && !strcmp(argv[1], "fault")) { /* the fault run alone (the controls) */
        setvbuf(stdout, NULL, _IOLBF, 0);
        fault_run();
        return TEST_DONE("nccl-grid fault");
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifndef PP_TEST_REAL_CUDA
    /* a grid rank's streams (the compute stream, the world's, the pipe's, dp's, the tied pair's:
       12 and more) outnumber CUDA's default 8 queues, and the library's count is per transport:
       the imitation then shares queues (60 streams on held ones, before), which can hang a step
       by chance. As many queues as the streams, unless the caller says otherwise */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    queues_run(); /* first: after the other runs a stream per device is still live (4 shared at 15
                     queues); it restores the variable, and its 1F1B at 8 queues shares them */
    shared0 = fakecuda_queue_shared();
#endif
    grid_run(PP_SCHED_GPIPE, 4, 0);
    grid_run(PP_SCHED_1F1B, 5, 0);
    grid_run(PP_SCHED_ZB_H1, 4, 0);
    grid_run(PP_SCHED_1F1B, 5, 1);
    grid_run(PP_SCHED_ZB_H1, 4, 2); /* and host memory in the direct check */
#ifndef PP_TEST_REAL_CUDA
    fault_run();
    /* negative control (build/nccl-controls): CUDA_DEVICE_MAX_CONNECTIONS=8, CUDA's default */
    CHECK(fakecuda_queue_shared() == shared0, "%llu streams made onto a hardware queue another stream held (%s queues)",
          (unsigned long long)(fakecuda_queue_shared() - shared0), getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
#endif
#ifdef PP_TEST_REAL_CUDA
    layer_staged_free();
#endif
    return TEST_DONE("nccl-grid");
}
