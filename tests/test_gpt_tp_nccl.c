/* tests/test_gpt_tp_nccl.c - examples/gpt.h's GPT with Megatron-style tensor parallelism over
   pipeline_nccl.h on the NCCL imitation (tests/fakenccl over tests/fakecuda), without a GPU: four
   rank threads, each on its own imitation device, one communicator split by
   pp_nccl_grid_create_tp into pp 2 x tp 2 or pp 1 x tp 4 (the grid's pipe transport carries the
   pipeline, its tp transport the blocks' all-reduces: pipeline.h's pp_tp_allreduce of host
   memory, staged through the device), a one-rank pp_cuda for the device block pool and the
   compute stream. The layers are gpt.h's host code, staged: each call waits for its compute
   stream, copies its device tensors to the host, runs there and copies back on the stream (on
   a GPU the layers would be kernels on that stream and the all-reduce NCCL's own, in stream
   order; gpt_nccl.cu's CUDA model has no TP yet).
   Checked, for pp 2 x tp 2 on 1F1B and ZB-H1 (split backward) and pp 1 x tp 4 (GPipe): the TP
   all-reduces inside the layers, between the pipeline's sends and receives on the other
   communicator, do not hang; the pipelined step's loss and gradients are pp_sequential_step's
   at that tp (every rank, its TP group in pp_model.ctx), bit for bit; and the loss and every
   gradient buffer are within 1e-5
   (relative) of the tp 1 model's (gpt_init's, sharded by gpt_tp_shard); each device holds the
   15 streams the grid counts (queues_held). The boundaries go split over TP (pp_stage_desc.tp,
   device blocks, gathered over g.tp); 1F1B again with them whole gives the same loss, each TP
   rank sends the whole tensor bytes instead of its slice (the slices add up to it), and the
   split run's gathers move the rest. Its negative controls (build/tp-ctl-gpt-nccl-norow: the
   attention projection's row-parallel all-reduce dropped, PP_TEST_GPT_TP_NO_ROW_REDUCE;
   tp-ctl-gpt-nccl-nogather: the boundary gather dropped) must fail. */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#include "../examples/gpt.h"
#include "test.h"
#include "harness.h"

#include <stdio.h>

#define NR 4        /* ranks: pp 2 x tp 2, or pp 1 x tp 4 */
#define NSEQ 8
#define MAXROWS (NSEQ * 12)
#define TOL 1e-5

typedef struct world {
    ncclUniqueId id;
    pp_schedule_kind kind;
    int tp, pp;                 /* tp x pp = NR */
    int whole;                  /* 1: pp_stage_desc.tp_whole, every boundary whole (the bytes' comparison) */
    uint64_t sent[NR];          /* the step's tensor bytes over the pipe (bytes_sent less metadata and agreement) */
    uint64_t gathered[NR];      /* what it sent over g.tp gathering the split boundaries (tp_gather_bytes) */
    int bad[NR];
    double loss_rel[NR], grad_rel[NR];
    float loss[NR];
    char msg[NR][sizeof(((pp_error*)0)->msg) + 64];
} world;

static const gpt_config CFG = {16, 16, 16, 4, 2}; /* vocab, max_T, C, heads, blocks */
static int32_t TOK[MAXROWS], TGT[MAXROWS], CU[NSEQ + 1];

/* 8 packed sequences of 3 .. 12 tokens, each target the next token (-1 at a sequence's end). */
static void make_batch(void) { (void)hx_token_seqs(TOK, TGT, CU, NSEQ, CFG.vocab); }

static pp_batch batch(void) {
    pp_batch b;
    hx_token_batch(&b, TOK, TGT, CU, NSEQ, 4, PP_SPLIT_TOKENS);
    b.loss = PP_LOSS_MEAN_ROWS;
    return b;
}

/* gpt.h's layers are host code, and the imitation's device memory is not host memory (a host
   access faults): in a stage (io->ctx: the rank's pp_cuda_layer_ctx) a layer call waits for its
   compute stream, copies its device tensors and scratch to the host, runs the layer there (its
   TP all-reduces included: pipeline.h's, over the grid's tp transport, which stages through the
   device itself) and copies what it wrote back on the stream, before what follows there (a
   send). Weights and gradients are host memory. pp_sequential_step's io is host memory. */
static pp_model g_inner[2]; /* the fused and the split GPT */
static int on_device(const void* p) {
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}
#define SLOTS (4 * PP_MAX_TENSORS + 2)
static int staged(int split, int kind, const void* w, void* g, int l, pp_layer_io* io) {
    const pp_model* m = &g_inner[split];
    pp_layer_io h = *io;
    void** slot[SLOTS];
    void* dev[SLOTS];
    size_t bytes[SLOTS];
    int back[SLOTS], n = 0, k, rc;
    cudaStream_t st;
    if (!io->ctx)
        return kind == 0 ? m->forward(w, l, io) : kind == 1 ? m->backward(w, g, l, io) : m->weight_grad(w, g, l, io);
    st = ((const pp_cuda_layer_ctx*)io->ctx)->stream;
#define SLOT(ptr, nb, wb) (slot[n] = (void**)&(ptr), bytes[n] = (nb), back[n++] = (wb))
    for (k = 0; k < h.n_in && k < PP_MAX_TENSORS; k++) {
        SLOT(h.in[k].data, (size_t)(h.in[k].rows * h.in[k].cols) * pp_dtype_size(h.in[k].dtype), 0);
        SLOT(h.d_in[k].data, (size_t)(h.d_in[k].rows * h.d_in[k].cols) * pp_dtype_size(h.d_in[k].dtype), 1);
    }
    for (k = 0; k < h.n_out && k < PP_MAX_TENSORS; k++) {
        SLOT(h.out[k].data, (size_t)(h.out[k].rows * h.out[k].cols) * pp_dtype_size(h.out[k].dtype), 1);
        SLOT(h.d_out[k].data, (size_t)(h.d_out[k].rows * h.d_out[k].cols) * pp_dtype_size(h.d_out[k].dtype), 0);
    }
    SLOT(h.saved, h.saved_bytes, 1);
    SLOT(h.b_saved, h.b_saved_bytes, 1);
#undef SLOT
    if (cudaStreamSynchronize(st) != cudaSuccess) return 90;
    for (k = 0; k < n; k++) {
        dev[k] = *slot[k];
        if (!on_device(dev[k]) || !bytes[k]) {
            dev[k] = NULL;
            continue;
        }
        if (!(*slot[k] = malloc(bytes[k]))) return 91;
        if (cudaMemcpy(*slot[k], dev[k], bytes[k], cudaMemcpyDeviceToHost) != cudaSuccess) return 92;
    }
    rc = kind == 0 ? m->forward(w, l, &h) : kind == 1 ? m->backward(w, g, l, &h) : m->weight_grad(w, g, l, &h);
    for (k = 0; k < n; k++) {
        if (!dev[k]) continue;
        /* pageable host memory: the bytes are read before the call returns, the copy completes on st */
        if (!rc && back[k] && cudaMemcpyAsync(dev[k], *slot[k], bytes[k], cudaMemcpyHostToDevice, st) != cudaSuccess)
            rc = 93;
        free(*slot[k]);
    }
    io->loss = h.loss;
    return rc;
}
static int fwd0(const void* w, int l, pp_layer_io* io) { return staged(0, 0, w, NULL, l, io); }
static int bwd0(const void* w, void* g, int l, pp_layer_io* io) { return staged(0, 1, w, g, l, io); }
static int fwd1(const void* w, int l, pp_layer_io* io) { return staged(1, 0, w, NULL, l, io); }
static int bwd1(const void* w, void* g, int l, pp_layer_io* io) { return staged(1, 1, w, g, l, io); }
static int wg1(const void* w, void* g, int l, pp_layer_io* io) { return staged(1, 2, w, g, l, io); }

static pp_model model_for(pp_schedule_kind kind) {
    int split = kind == PP_SCHED_ZB_H1;
    pp_model m = g_inner[split];
    m.forward = split ? fwd1 : fwd0;
    m.backward = split ? bwd1 : bwd0;
    if (split) m.weight_grad = wg1;
    return m;
}

/* The largest gpt_rel_diff over the parameter buffers of a and b (both bound by gpt_bind_tp alike). */
static double worst_diff(const gpt_model* a, const gpt_model* b) {
    double worst = 0;
    int l, i;
    for (l = 0; l < CFG.n_block + 2; l++) {
        pp_param x[12], y[12];
        int n;
        if (l == 0) {
            n = gpt_embed_param_list(&a->embed[0], x, 12);
            gpt_embed_param_list(&b->embed[0], y, 12);
        } else if (l <= CFG.n_block) {
            n = gpt_block_param_list(&a->block[l - 1], x, 12);
            gpt_block_param_list(&b->block[l - 1], y, 12);
        } else {
            n = gpt_head_param_list(&a->head[0], x, 12);
            gpt_head_param_list(&b->head[0], y, 12);
        }
        for (i = 0; i < n; i++) {
            double d = gpt_rel_diff((const float*)x[i].data, (const float*)y[i].data, x[i].count);
            if (d > worst) worst = d;
        }
    }
    return worst;
}

static pp_result rank_main(int r, void* user) {
    world* W = (world*)user;
    const int TPN = W->tp, PP = W->pp;
    const size_t n = gpt_param_count_tp(&CFG, TPN);
    ncclComm_t comm = NULL;
    pp_cuda* c = NULL;
    pp_cuda_layer_ctx lc;
    pp_nccl_grid g;
    int have_grid = 0, dev = 0, first[NR + 1], l;
    pp_transport tpt;
    pp_group tpg;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_action acts[256];
    pp_schedule sched;
    pp_step_stats ss;
    pp_batch b = batch();
    gpt_model w, gr, gref, full, fullg, sh;
    float *wbuf = NULL, *gbuf = NULL, *refbuf = NULL, *fbuf = NULL, *fgbuf = NULL, *shbuf = NULL;
    float ref_loss = 0, loss1 = 0;
    pp_error err;
    pp_result rc;
    char* msg = W->msg[r];
    memset(&g, 0, sizeof g);
    err.msg[0] = 0;
    rc = hx_nccl_rank(r, NR, &W->id, 20, &dev, &comm, &c, &err);
    if (rc == PP_OK) rc = pp_nccl_grid_create_tp(comm, PP, TPN, PP_GRID_DP_INNER, pp_cuda_stream(c, 0), 20, &g, &err);
    if (rc != PP_OK) {
        snprintf(msg, sizeof W->msg[r], "set-up: %s", err.msg);
        goto done;
    }
    have_grid = 1;
    tpt = pp_nccl_transport(g.tp);
    memset(&tpg, 0, sizeof tpg);
    tpg.t = &tpt;
    tpg.timeout_s = 20;
    /* this rank's shard of gpt_init's weights, zeroed gradients */
    if (!(wbuf = gpt_init_tp(&w, &gr, &CFG, TPN, g.grid.tp_rank, 99, &gbuf)) ||
        !(refbuf = (float*)calloc(n, sizeof(float))) || !(shbuf = (float*)calloc(n, sizeof(float)))) {
        snprintf(msg, sizeof W->msg[r], "out of memory");
        rc = PP_ERR_NOMEM;
        goto done;
    }
    gpt_bind_tp(&gref, &CFG, TPN, g.grid.tp_rank, refbuf);
    gpt_bind_tp(&sh, &CFG, TPN, g.grid.tp_rank, shbuf);
    memset(&d, 0, sizeof d);
    d.model = model_for(W->kind);
    d.model.ctx = &tpg; /* the blocks' TP group */
    if ((rc = pp_schedule_make(W->kind, PP, 1, 4, acts, 256, &sched, &err)) != PP_OK ||
        (rc = pp_partition_uniform(d.model.n_layers, PP, first, &err)) != PP_OK)
        goto fail;
    memset(&lc, 0, sizeof lc);
    lc.stream = pp_cuda_stream(c, 0);
    lc.rank = g.grid.pp_rank;
    lc.device = dev;
    d.weights = &w;
    d.grads = &gr;
    d.schedule = &sched;
    d.partition = first;
    d.rank = g.grid.pp_rank;
    d.transport = pp_nccl_transport(g.pipe);
    d.device = pp_cuda_device_ops(c, 0);
    d.layer_ctx = &lc;
    d.timeout_s = 20;
    d.tp = &tpg;            /* boundaries split over TP, gathered over g.tp: device blocks */
    d.tp_whole = W->whole;  /* or whole (the group still agrees the step's outcome) */
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) goto fail;
    memset(&ss, 0, sizeof ss);
    if ((rc = pp_stage_step(st, &b, &ss)) != PP_OK) {
        snprintf(msg, sizeof W->msg[r], "step: %s", pp_stage_error(st));
        goto done;
    }
    if ((rc = pp_nccl_step_end(g.pipe, 20, &err)) != PP_OK) goto fail;
    if ((rc = pp_nccl_step_end(g.tp, 20, &err)) != PP_OK) goto fail;
    W->loss[r] = ss.has_loss ? ss.loss : 0;
    W->sent[r] = ss.bytes_sent - ss.meta_bytes_sent - ss.agree_bytes;
    W->gathered[r] = ss.tp_gather_bytes;
    /* the sequential step at tp 2 (no stream: io->ctx NULL), every rank at once */
    if ((rc = pp_sequential_step(&d.model, &w, &gref, &b, &ref_loss, &err)) != PP_OK) goto fail;
    if (ss.has_loss && memcmp(&ref_loss, &ss.loss, sizeof ref_loss) != 0) {
        snprintf(msg, sizeof W->msg[r], "pipelined loss %.9g, sequential %.9g", (double)ss.loss, (double)ref_loss);
        W->bad[r]++;
    }
    for (l = first[g.grid.pp_rank]; l < first[g.grid.pp_rank + 1]; l++) {
        size_t cnt;
        const float* a = gpt_layer_params(&gr, &CFG, l, &cnt);
        const float* e = gpt_layer_params(&gref, &CFG, l, &cnt);
        if (memcmp(a, e, cnt * sizeof(float)) != 0) {
            snprintf(msg, sizeof W->msg[r], "layer %d: pipelined gradient differs from the sequential one", l);
            W->bad[r]++;
        }
    }
    /* the tp 1 model */
    if (!(fbuf = gpt_init(&full, &fullg, &CFG, 99, &fgbuf))) {
        rc = PP_ERR_NOMEM;
        goto done;
    }
    rc = pp_sequential_step(&g_inner[W->kind == PP_SCHED_ZB_H1], &full, &fullg, &b, &loss1, &err);
    if (rc != PP_OK) goto fail;
    gpt_tp_shard(&sh, &fullg, &CFG);
    W->loss_rel[r] = fabs((double)ref_loss - loss1) / fabs((double)loss1);
    W->grad_rel[r] = worst_diff(&gref, &sh);
    if (W->loss_rel[r] > TOL || W->grad_rel[r] > TOL) {
        snprintf(msg, sizeof W->msg[r], "against tp 1: loss %.3g, gradients %.3g relative", W->loss_rel[r],
                 W->grad_rel[r]);
        W->bad[r]++;
    }
    goto done;
fail:
    snprintf(msg, sizeof W->msg[r], "%s", err.msg);
done:
    pp_stage_destroy(st);
    if (have_grid) pp_nccl_grid_destroy(&g);
    if (comm) ncclCommDestroy(comm);
    pp_cuda_destroy(c);
    free(wbuf);
    free(gbuf);
    free(refbuf);
    free(shbuf);
    free(fbuf);
    free(fgbuf);
    if (rc != PP_OK) W->bad[r]++;
    return PP_OK;
}

int main(void) {
    static world W;
    const pp_schedule_kind kinds[4] = {PP_SCHED_1F1B, PP_SCHED_ZB_H1, PP_SCHED_GPIPE, PP_SCHED_1F1B};
    const int tps[4] = {2, 2, 4, 2};
    float split_loss[NR];
    uint64_t split_sent[NR], split_gathered[NR];
    pp_error err;
    int r, k;
    make_batch();
    for (r = 0; r < NR; r++) /* each device's legacy stream (the staged layers' cudaMemcpy), before the counts */
        CHECK(cudaSetDevice(r) == cudaSuccess && cudaStreamSynchronize(0) == cudaSuccess, "device %d: legacy stream", r);
    g_inner[0] = gpt_model_desc_depth(CFG.n_block);
    g_inner[1] = gptz_model_desc_depth(CFG.n_block);
    for (k = 0; k < 4; k++) {
        double lr = 0, gr = 0;
        int bad = 0;
        memset(&W, 0, sizeof W);
        W.kind = kinds[k];
        W.tp = tps[k];
        W.pp = NR / tps[k];
        W.whole = k == 3; /* 1F1B pp 2 x tp 2 again, boundaries whole */
        uint64_t made[NR];
        ncclGetUniqueId(&W.id);
        for (r = 0; r < NR; r++) made[r] = fakecuda_streams_made(r);
        CHECK(pp_threads_run(NR, rank_main, &W, &err) == PP_OK, "%s", err.msg);
        /* the grid's queue count (pp_nccl_grid_create_tp's queues_held, 11 with tp): the compute
           stream, the world's two, and the pipe's, dp's, the tied pair's (at pp 1 the rank is
           both ends) and tp's three each: so many streams are made on each rank's device */
        for (r = 0; r < NR; r++)
            CHECK(fakecuda_streams_made(r) - made[r] == 15, "%s: device %d: %llu streams made, want 1 + 11 held + 3 for the "
                  "pipe's channel", pp_schedule_name(kinds[k]), r, (unsigned long long)(fakecuda_streams_made(r) - made[r]));
        for (r = 0; r < NR; r++) {
            CHECK(W.bad[r] == 0, "%s: rank %d: %s", pp_schedule_name(kinds[k]), r, W.msg[r]);
            bad += W.bad[r] != 0;
            if (W.loss_rel[r] > lr) lr = W.loss_rel[r];
            if (W.grad_rel[r] > gr) gr = W.grad_rel[r];
        }
        printf("gpt tp %d x pp %d over the NCCL imitation, %s, boundaries %s: against tp 1: loss %.3g, gradients %.3g "
               "relative (tolerance %g); %d of %d ranks failed a check\n",
               W.tp, W.pp, pp_schedule_name(kinds[k]), W.whole ? "whole" : "split", lr, gr, TOL, bad, NR);
        if (k == 0) {
            memcpy(split_loss, W.loss, sizeof split_loss);
            memcpy(split_sent, W.sent, sizeof split_sent);
            memcpy(split_gathered, W.gathered, sizeof split_gathered);
        }
        if (k == 3) { /* DP_INNER, dp 1: world rank = pp_rank * tp + tp_rank */
            int p;
            CHECK(memcmp(split_loss, W.loss, sizeof split_loss) == 0, "1F1B: the loss differs with the boundaries split");
            for (p = 0; p < W.pp; p++) {
                uint64_t sum = 0, got = 0;
                for (r = 0; r < W.tp; r++) {
                    sum += split_sent[p * W.tp + r];
                    got += split_gathered[p * W.tp + r];
                    CHECK(W.sent[p * W.tp + r] == W.sent[p * W.tp] && W.gathered[p * W.tp + r] == 0,
                          "pp rank %d: whole boundaries, TP ranks send alike and gather nothing", p);
                }
                /* each TP rank sends its rows' slice: the slices add up to the whole tensor, and what
                   the next stage's TP ranks gather is the rest of it, tp - 1 times over (1 at tp 2) */
                CHECK(sum == W.sent[p * W.tp] && split_sent[p * W.tp] < W.sent[p * W.tp],
                      "pp rank %d: split, the TP ranks send %llu tensor bytes in all (rank 0: %llu); whole, each %llu", p,
                      (unsigned long long)sum, (unsigned long long)split_sent[p * W.tp], (unsigned long long)W.sent[p * W.tp]);
                CHECK(got == (p == 0 ? W.sent[W.tp] : W.sent[0]), "pp rank %d: %llu bytes gathered over g.tp, want the %llu "
                      "the other stage sends whole (tp 2)", p, (unsigned long long)got,
                      (unsigned long long)(p == 0 ? W.sent[W.tp] : W.sent[0]));
                printf("gpt pp rank %d: tensor bytes a step over the pipe, TP rank 0: %llu split, %llu whole; gathered over "
                       "g.tp by its TP group: %llu\n", p, (unsigned long long)split_sent[p * W.tp], (unsigned long long)W.sent[p * W.tp],
                       (unsigned long long)got);
            }
        }
    }
    return TEST_DONE("test_gpt_tp_nccl");
}
