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


typedef struct world {
    ncclUniqueId id;
    pp_model model;             /* the LM's layers as imitation kernels (made once) */
    pp_schedule sc;
    int first[PP * 2 + 1];
    int m;
    int overlap;                /* 1: pp_dp_overlap (2: its direct check on host memory); 0: pp_grad_allreduce after the step */
    float* w[NR];               /* each rank's weights and gradients, host memory */
    float* g[NR];
    float* wref;
    int bad[NR];
    pp_result rc[NR];
    char msg[NR][700];
} world;

typedef struct rank_arg {
    world* W;
    int r;
} rank_arg;

static int owner(const world* W, int layer) { return pp_schedule_layer_rank(&W->sc, W->first, layer); }
#define layer_range tlm_grid_layer_range

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
    int wr = a->r, dev = wr, step, ndev = 1;
    pp_launch L;
    pp_error err;
    ncclComm_t comm = NULL;
    pp_nccl_grid g;
    pp_cuda* c = NULL;
    pp_cuda_desc cd;
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
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    dev = wr % ndev; /* several ranks on one GPU: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 */
    memset(&L, 0, sizeof L);
    L.rank = wr;
    L.world = NR;
    L.local_rank = dev;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.devices = &dev;
    rc = pp_nccl_comm_init(&L, &W->id, 20, &comm, &err);
    if (rc == PP_OK) rc = pp_cuda_create(&cd, &c, &err);
    if (rc == PP_OK) rc = pp_cuda_bind(c, 0, &err);
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
    {
        static cudaStream_t streams[NR];
        streams[wr] = pp_cuda_stream(c, 0);
        d.layer_ctx = &streams[wr];
    }
    d.timeout_s = 20;
    if (rc == PP_OK && W->overlap) {
        pp_dp_overlap_desc od;
        tlm_overlap_desc(&od, &gw, &W->sc, W->first, g.grid.pp_rank, g.tied ? &tied : NULL, pair, bufs);
        od.dp.t = &dpt;
        od.dp.timeout_s = 20;
        od.bucket_bytes = 64;
        rc = tlm_grid_hook_overlap(&od, &d, &ov, &err);
    }
    if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
    for (step = 0; step < STEPS && rc == PP_OK; step++) {
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
        reference(wref, gref, step, W->m);
        tlm_grid_check_sgd(W->w[wr], W->g[wr], wref, gref, &W->sc, W->first, g.grid.pp_rank, step, &W->bad[wr], W->msg[wr],
                           sizeof W->msg[wr]);
    }
#ifndef PP_TEST_REAL_CUDA
    if (rc == PP_OK && W->overlap) dp_device_check(W, wr, &dpt, pp_cuda_stream(c, 0), g.grid.dp_rank, W->overlap == 2);
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

static void grid_run(pp_schedule_kind kind, int m, int overlap) {
    static pp_action acts[PP * 2 * 2 * 16];
    world W;
    pthread_t th[NR];
    rank_arg arg[NR];
    pp_error err;
    size_t nE = (size_t)VOCAB * DIM, hoff, hn;
    int r, d;
    pp_result rc;
    memset(&W, 0, sizeof W);
    W.model = layer_kernels_model(tlm_model_desc());
    W.m = m;
    W.overlap = overlap;
    rc = pp_schedule_make(kind, PP, 1, m, acts, sizeof acts / sizeof acts[0], &W.sc, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(W.model.n_layers, PP, W.first, &err);
    CHECK(rc == PP_OK, "setup: %s", err.msg);
    if (rc != PP_OK) return;
    CHECK(owner(&W, TLM_EMBED_LAYER) == 0 && owner(&W, TLM_HEAD_LAYER) == PP - 1, "the tied pair is {0, %d}", PP - 1);
    ncclGetUniqueId(&W.id);
    W.wref = tlm_grid_weights(W.w, W.g, NR);
    layer_range(TLM_HEAD_LAYER, &hoff, &hn);
    for (r = 0; r < NR; r++) {
        arg[r].W = &W;
        arg[r].r = r;
        pthread_create(&th[r], NULL, rank_main, &arg[r]);
    }
    for (r = 0; r < NR; r++) pthread_join(th[r], NULL);
    for (r = 0; r < NR; r++) {
        CHECK(W.rc[r] == PP_OK, "%s: world rank %d: %s", pp_schedule_name(kind), r, W.msg[r]);
        CHECK(W.bad[r] == 0, "%s: world rank %d: %s", pp_schedule_name(kind), r, W.msg[r]);
    }
    for (d = 0; d < DP; d++) { /* DP_INNER: world rank = pp_rank * DP + dp_rank */
        int ra = 0 * DP + d, rb = (PP - 1) * DP + d;
        CHECK(memcmp(W.w[ra], W.w[rb] + hoff, nE * sizeof(float)) == 0, "%s: replica %d: tied copies differ after %d steps",
              pp_schedule_name(kind), d, STEPS);
        CHECK(memcmp(W.w[ra], W.w[0], nE * sizeof(float)) == 0, "%s: replicas differ", pp_schedule_name(kind));
    }
    tlm_grid_free(W.wref, W.w, W.g, NR);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    grid_run(PP_SCHED_GPIPE, 4, 0);
    grid_run(PP_SCHED_1F1B, 5, 0);
    grid_run(PP_SCHED_ZB_H1, 4, 0);
    grid_run(PP_SCHED_1F1B, 5, 1);
    grid_run(PP_SCHED_ZB_H1, 4, 2); /* and host memory in the direct check */
#ifdef PP_TEST_REAL_CUDA
    layer_staged_free();
#endif
    return TEST_DONE("nccl-grid");
}
