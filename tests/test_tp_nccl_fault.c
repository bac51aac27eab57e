/* tests/test_tp_nccl_fault.c - a layer failing on one TP rank when the layers' TP collectives run
   on the GPU (pipeline_nccl.h's pp_nccl_tp_allreduce, in stream order), over the NCCL imitation
   (tests/fakenccl over tests/fakecuda), without a GPU.

   Eight rank threads, each on its own imitation device, split one world communicator into a
   pp 2 x dp 2 x tp 2 grid (pp_nccl_grid_create_tp). The model is four tensor-parallel layers and
   a loss: each TP rank scales its input by its own shard of the layer's weights, as an imitation
   kernel on the compute stream, and the layer all-reduces the product over g.tp on that stream
   (backward: the input gradient likewise; the weight gradient stays the shard's). Every step
   ends as a trainer's does: pp_nccl_step_end on the pipe and the TP transport, pp_dp_agree over
   g.dp, and where that agrees the mean over the replicas (pp_grad_allreduce); after a failed one,
   pp_nccl_grid_recover on every rank and, where it made the grid again, the stages again.
   Step 0 is clean, its gradients pp_sequential_step's at tp 2 bit for bit (the sums over host
   messages in rank order, as the imitation sums). At step 1 world rank 1 (pp 0, replica 0, TP
   rank 1) fails a layer:
   - "before": its forward of layer 1, micro-batch 0, returns before the all-reduce. Its TP
     partner's all-reduce waits for it on the GPU, and what is queued behind it on that
     communicator (the TP verdict) and on that stream (the sends to the next stage) waits too:
     the ranks of replica 0 run out their deadline, and their communicators are aborted.
     Replica 1 has nothing aborted;
   - "after": its backward of layer 1, micro-batch 3 (its last TP collective of the step), fails
     after the all-reduce: every collective met its partner, the step drains, nothing is aborted.
   Checked: every rank of the grid fails step 1 (the outcome pp_dp_agree gives) within 1.5
   deadlines of its start ("after": within one, nothing aborted); pp_nccl_grid_recover makes the
   grid again on every rank ("before") or on none ("after"); step 2, the same batch and weights,
   gives step 0's gradients bit for bit, and the mean over the replicas equals them. Negative
   controls (build/tp-controls): tp-ctl-nccl-fault-due (PP_NCCL_TEST_TP_NO_DUE: each host wait
   its own deadline, not the stuck collective's: the waits queued behind it end a deadline
   later, 4.1 s), tp-ctl-nccl-fault-full (PP_TEST_TP_VERDICT_FULL_WAIT: the failed member's
   verdict exchange a deadline of its own, not one from its failure: 4.1 s),
   tp-ctl-nccl-fault-alone (PP_NCCL_TEST_RECOVER_ALONE: each rank decides
   alone, without the vote; replica 1 keeps its grid while replica 0 splits the world again, and
   the splits fail), tp-ctl-nccl-fault-kept (the grid kept: step 2 fails), tp-ctl-nccl-fault-tell
   (PP_TEST_TP_VERDICT_TELL_ONLY: a failed member sends its verdict and takes none, so its
   partners' sends wait out their deadline and their communicators are aborted in "after") and
   tp-ctl-nccl-fault-unagreed (PP_TEST_NO_TP_AGREE: in "after" the other TP rank's pipelines
   return PP_OK). "after" runs again with the imitation's kernels one at a time per device.
   "novote": a rank that never calls pp_nccl_grid_recover (run_novote). */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#include "test.h"
#include "harness.h"

#include <stdio.h>

#define NR 8 /* pp 2 x dp 2 x tp 2, DP_INNER: world rank = (pp_rank * 2 + dp_rank) * 2 + tp_rank */
#define PP 2
#define DPN 2
#define TPN 2
#define NL 5 /* four TP layers and the loss */
#define ROWS 16
#define COLS 8
#define M 4
#define STEPS 3
#define FAIL_WR 1    /* pp rank 0, replica 0, TP rank 1 */
#define FAIL_LAYER 1 /* "before": its forward, micro-batch 0; "after": its backward, micro-batch M - 1 (step 1) */
#define DEADLINE 2.0 /* every wait of a step; the votes across replicas wait for the slowest: 3 of them */

static int g_mode; /* 0: no fault, 1: "before", 2: "after", 3: "after", then NOVOTE_WR never votes */
#define NOVOTE_WR 7
#define NOVOTE_TIMEOUT 1.0

typedef struct rank_ctx {
    cudaStream_t stream;
    int wr, step;
} rank_ctx;

typedef struct world {
    ncclUniqueId id;
    int bad[NR];
    pp_result out[NR][STEPS];   /* each rank's outcome of each step */
    double secs[NR][STEPS];     /* from the step's start to its last pp_nccl_step_end */
    int rebuilt[NR];            /* pp_nccl_grid_recover's answer after step 1 (-1: not called) */
    char msg[NR][sizeof(((pp_error*)0)->msg) + 64];
    char omsg[NR][STEPS][sizeof(((pp_error*)0)->msg)];
} world;

static float X[ROWS * COLS];
static int32_t Y[ROWS];

/* ---- the layers: out = in * w (per column) all-reduced over the TP group ------------------- */
typedef struct job {
    int kind; /* 0 forward, 1 backward */
    const float *in, *w, *d_out;
    float *out, *d_in, *g;
    int rows;
    float scale; /* the loss layer's backward: d_in = in * scale */
    int loss;
} job;

static void run_job(const job* j) {
    int r, c;
    if (j->loss) {
        for (r = 0; r < j->rows * COLS; r++) j->d_in[r] = j->in[r] * j->scale;
        return;
    }
    if (j->kind == 0) {
        for (r = 0; r < j->rows; r++)
            for (c = 0; c < COLS; c++) j->out[r * COLS + c] = j->in[r * COLS + c] * j->w[c];
        return;
    }
    for (r = 0; r < j->rows; r++)
        for (c = 0; c < COLS; c++) {
            if (j->d_in) j->d_in[r * COLS + c] = j->d_out[r * COLS + c] * j->w[c];
            j->g[c] += j->in[r * COLS + c] * j->d_out[r * COLS + c];
        }
}

static int job_kernel(void* u) {
    job* j = (job*)u;
    size_t n = (size_t)j->rows * COLS * sizeof(float);
    int ok = 1;
#define MAP(p)                                                                                                                   \
    if (p && !(*(void**)&(p) = fakecuda_kernel_ptr(p, n))) ok = 0
    MAP(j->in);
    MAP(j->out);
    MAP(j->d_in);
    MAP(j->d_out);
#undef MAP
    if (ok) run_job(j);
    free(j);
    return ok ? 0 : (int)cudaErrorIllegalAddress;
}

/* weights and gradients: [NL - 1][COLS], this TP rank's shard */
static int layer_call(int kind, const void* w, void* g, int l, pp_layer_io* io) {
    const pp_group* grp = io->tp ? io->tp : (const pp_group*)io->model->ctx; /* pp_sequential_step: model.ctx */
    rank_ctx* rc = (rank_ctx*)io->ctx;
    job jb, *j;
    pp_error err;
    size_t n = (size_t)io->mb->rows * COLS;
    memset(&jb, 0, sizeof jb);
    jb.kind = kind;
    jb.rows = (int)io->mb->rows;
    jb.in = (const float*)io->in[0].data;
    jb.loss = l == NL - 1;
    if (jb.loss && kind == 0) {
        io->loss = 0; /* the gradients are what is checked */
        return 0;
    }
    if (!jb.loss) jb.w = (const float*)w + (size_t)l * COLS;
    if (kind == 0) jb.out = (float*)io->out[0].data;
    else {
        jb.d_in = (float*)io->d_in[0].data;
        jb.d_out = jb.loss ? NULL : (const float*)io->d_out[0].data;
        jb.g = jb.loss ? NULL : (float*)g + (size_t)l * COLS;
        jb.scale = io->mb->loss_scale;
    }
    if (rc && g_mode == 1 && kind == 0 && rc->wr == FAIL_WR && rc->step == 1 && l == FAIL_LAYER && io->mb->index == 0)
        return 42; /* before anything is enqueued: the partner's all-reduce waits for this one */
    if (!rc) { /* pp_sequential_step: host memory, the sums over host messages */
        run_job(&jb);
        if (jb.loss) return 0;
        if (kind == 0) return pp_tp_allreduce(grp, jb.out, n, PP_F32, &err) == PP_OK ? 0 : 1;
        return jb.d_in && pp_tp_allreduce(grp, jb.d_in, n, PP_F32, &err) != PP_OK ? 1 : 0;
    }
    if (!(j = (job*)malloc(sizeof *j))) return 2;
    *j = jb;
    if (fakecuda_launch(rc->stream, job_kernel, j) != cudaSuccess) {
        free(j);
        return 3;
    }
    if (jb.loss) return 0;
    if (kind == 0) return pp_nccl_tp_allreduce(grp, jb.out, n, PP_F32, rc->stream, &err) == PP_OK ? 0 : 4;
    if (jb.d_in && pp_nccl_tp_allreduce(grp, jb.d_in, n, PP_F32, rc->stream, &err) != PP_OK) return 4;
    if (g_mode >= 2 && rc->wr == FAIL_WR && rc->step == 1 && l == FAIL_LAYER && io->mb->index == M - 1)
        return 43; /* after the step's last TP collective on this rank */
    return 0;
}
static int fwd(const void* w, int l, pp_layer_io* io) { return layer_call(0, w, NULL, l, io); }
static int bwd(const void* w, void* g, int l, pp_layer_io* io) { return layer_call(1, w, g, l, io); }
static void describe(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)mb, (void)n_in;
    if (l == NL - 1) return; /* the loss: no outputs */
    d->n_out = 1;
    d->out[0] = in[0];
    d->out[0].data = NULL;
}

static pp_model model(const pp_group* grp) {
    pp_model m;
    memset(&m, 0, sizeof m);
    m.name = "tp-fault";
    m.n_layers = NL;
    m.forward = fwd;
    m.backward = bwd;
    m.describe = describe;
    m.ctx = (void*)(uintptr_t)grp;
    return m;
}

/* Everything a rank makes over the grid (made again after a failed step). */
typedef struct rank_stage {
    pp_nccl_grid g;
    int have_grid;
    pp_transport tpt;
    pp_group tpg;
    pp_stage* st;
} rank_stage;

static pp_result stage_make(rank_stage* S, const pp_stage_desc* tmpl, pp_cuda* c, pp_error* err) {
    pp_stage_desc d = *tmpl;
    S->tpt = pp_nccl_transport(S->g.tp);
    memset(&S->tpg, 0, sizeof S->tpg);
    S->tpg.t = &S->tpt;
    S->tpg.timeout_s = DEADLINE;
    d.model = model(&S->tpg);
    d.tp = &S->tpg;          /* io->tp, and the step's outcome agreed over the group */
    d.tp_whole = g_mode >= 2; /* "before": the boundaries split over TP (gathered over g.tp); "after": whole */
    d.rank = S->g.grid.pp_rank;
    d.transport = pp_nccl_transport(S->g.pipe);
    d.device = pp_cuda_device_ops(c, 0);
    return pp_stage_create(&d, &S->st, err);
}

static pp_result rank_main(int r, void* user) {
    world* W = (world*)user;
    ncclComm_t comm = NULL;
    pp_cuda* c = NULL;
    rank_ctx lc;
    rank_stage S;
    int dev = 0, first[PP + 1], step, l, world_ok = 1;
    pp_action acts[64];
    pp_schedule sched;
    pp_stage_desc d;
    pp_batch b;
    float w[(NL - 1) * COLS], gr[(NL - 1) * COLS], g0[(NL - 1) * COLS], gref[(NL - 1) * COLS], mean[(NL - 1) * COLS];
    pp_error err;
    pp_result rc;
    memset(&S, 0, sizeof S);
    err.msg[0] = 0;
    W->rebuilt[r] = -1;
    hx_dense_batch(&b, X, Y, ROWS, COLS, M); /* every replica the same batch: the mean is each one's */
    for (l = 0; l < (NL - 1) * COLS; l++) /* TP rank t's shard: its own numbers */
        w[l] = 0.5f + 0.03125f * (float)((l * 7 + (r % TPN) * 5) % 17);
    rc = hx_nccl_rank(r, NR, &W->id, 20, &dev, &comm, &c, &err);
    if (rc == PP_OK) rc = pp_nccl_grid_create_tp(comm, PP, TPN, PP_GRID_DP_INNER, pp_cuda_stream(c, 0), DEADLINE, &S.g, &err);
    S.have_grid = rc == PP_OK;
    if (rc == PP_OK) rc = pp_schedule_make(PP_SCHED_1F1B, PP, 1, M, acts, 64, &sched, &err);
    if (rc == PP_OK) rc = pp_partition_uniform(NL, PP, first, &err);
    memset(&lc, 0, sizeof lc);
    lc.stream = pp_cuda_stream(c, 0);
    lc.wr = r;
    memset(&d, 0, sizeof d);
    d.weights = w;
    d.grads = gr;
    d.schedule = &sched;
    d.partition = first;
    d.layer_ctx = &lc;
    d.timeout_s = DEADLINE;
    if (rc == PP_OK) rc = stage_make(&S, &d, c, &err);
    if (rc != PP_OK) {
        snprintf(W->msg[r], sizeof W->msg[r], "set-up: %s", err.msg);
        W->bad[r]++;
        goto done;
    }
    for (step = 0; step < STEPS; step++) {
        pp_step_stats ss;
        pp_transport dpt = pp_nccl_transport(S.g.dp);
        pp_result o, e2;
        pp_error ee;
        double t0 = hx_now();
        ee.msg[0] = 0;
        memset(gr, 0, sizeof gr);
        lc.step = step;
        o = pp_stage_step(S.st, &b, &ss);
        if (o != PP_OK) snprintf(W->omsg[r][step], sizeof W->omsg[r][step], "%s", pp_stage_error(S.st));
        if ((e2 = pp_nccl_step_end(S.g.pipe, DEADLINE, &ee)) != PP_OK && o == PP_OK) {
            o = e2;
            snprintf(W->omsg[r][step], sizeof W->omsg[r][step], "%s", ee.msg);
        }
        if ((e2 = pp_nccl_step_end(S.g.tp, DEADLINE, &ee)) != PP_OK && o == PP_OK) {
            o = e2;
            snprintf(W->omsg[r][step], sizeof W->omsg[r][step], "%s", ee.msg);
        }
        if (o == PP_OK && cudaStreamSynchronize(lc.stream) != cudaSuccess) o = PP_ERR_TRANSPORT; /* the kernels wrote gr */
        /* the replicas' one outcome: the slowest replica's deadline included */
        if ((e2 = pp_dp_agree(&dpt, NULL, 0, step, o, 3 * DEADLINE, &ee)) != PP_OK && o == PP_OK) {
            o = e2;
            snprintf(W->omsg[r][step], sizeof W->omsg[r][step], "%s", ee.msg);
        }
        W->secs[r][step] = hx_now() - t0;
        W->out[r][step] = o;
        if (o == PP_OK) {
            memcpy(mean, gr, sizeof mean);
            if (pp_grad_allreduce(&dpt, NULL, 0, mean, (NL - 1) * COLS, PP_F32, 1.0 / DPN, DEADLINE, &ee) != PP_OK ||
                memcmp(mean, gr, sizeof mean) != 0) {
                snprintf(W->msg[r], sizeof W->msg[r], "step %d: the mean over the replicas: %s", step,
                         ee.msg[0] ? ee.msg : "not each replica's gradients");
                W->bad[r]++;
            }
        }
        if (step == 0 && o == PP_OK) memcpy(g0, gr, sizeof g0);
        if (o != PP_OK) {
            int again = 0;
            pp_stage_destroy(S.st);
            S.st = NULL;
            if (g_mode == 3) { /* a rank that never votes: the others' recover is PP_ERR_TIMEOUT in its deadline */
                double t1 = hx_now();
                if (r != NOVOTE_WR) {
                    rc = pp_nccl_grid_recover(comm, &S.g, pp_cuda_stream(c, 0), NOVOTE_TIMEOUT, &again, &err);
                    W->secs[r][2] = hx_now() - t1;
                    W->out[r][2] = rc;
                    snprintf(W->omsg[r][2], sizeof W->omsg[r][2], "%s", err.msg);
                }
                world_ok = 0; /* the world still runs the vote: aborted */
                goto done;
            }
#ifndef PP_TEST_FAULT_NO_REBUILD
            rc = pp_nccl_grid_recover(comm, &S.g, pp_cuda_stream(c, 0), 3 * DEADLINE, &again, &err);
#endif
            W->rebuilt[r] = again;
            if (rc == PP_OK) rc = stage_make(&S, &d, c, &err);
            if (rc != PP_OK) {
                snprintf(W->msg[r], sizeof W->msg[r], "after step %d: %s", step, err.msg);
                W->bad[r]++;
                world_ok = 0; /* the world may still run the vote or a split */
                goto done;
            }
        }
    }
    /* step 0 against the sequential step at tp 2 (host memory, io->ctx NULL), every rank at once */
    if (W->out[r][0] == PP_OK) {
        pp_model m = model(&S.tpg);
        float loss = 0;
        memset(gref, 0, sizeof gref);
        if ((rc = pp_sequential_step(&m, w, gref, &b, &loss, &err)) != PP_OK) {
            snprintf(W->msg[r], sizeof W->msg[r], "sequential step: %s", err.msg);
            W->bad[r]++;
        }
        for (l = first[S.g.grid.pp_rank]; rc == PP_OK && l < first[S.g.grid.pp_rank + 1] && l < NL - 1; l++)
            if (memcmp(g0 + l * COLS, gref + l * COLS, COLS * sizeof(float)) != 0 || hx_all_zero(g0 + l * COLS, COLS)) {
                snprintf(W->msg[r], sizeof W->msg[r], "step 0: layer %d's gradient is not the sequential step's", l);
                W->bad[r]++;
            }
    }
    if (W->out[r][STEPS - 1] == PP_OK && memcmp(gr, g0, sizeof g0) != 0) {
        snprintf(W->msg[r], sizeof W->msg[r], "step %d after the failed one: gradients differ from step 0's", STEPS - 1);
        W->bad[r]++;
    }
done:
    pp_stage_destroy(S.st);
    if (S.have_grid) pp_nccl_grid_destroy(&S.g);
    if (comm && world_ok) ncclCommDestroy(comm);
    else if (comm) ncclCommAbort(comm);
    pp_cuda_destroy(c);
    return PP_OK;
}

/* "after", then world rank NOVOTE_WR never calls pp_nccl_grid_recover: every other rank's is
   PP_ERR_TIMEOUT within its deadline (1 s), saying to abort the world, not a host held (the
   vote is the world communicator's first collective: NCCL sets it up in the call, holding the
   host until every member comes [src: enqueue.cc, group.cc], so the deadline ends it there).
   The control tp-ctl-nccl-fault-untimed (PP_NCCL_TEST_RECOVER_UNTIMED: no deadline) hangs. */
static void run_novote(void) {
    static world W;
    pp_error err;
    int r;
    memset(&W, 0, sizeof W);
    g_mode = 3;
    ncclGetUniqueId(&W.id);
    CHECK(pp_threads_run(NR, rank_main, &W, &err) == PP_OK, "%s", err.msg);
    for (r = 0; r < NR; r++) {
        if (r == NOVOTE_WR) continue;
        CHECK(W.out[r][1] != PP_OK, "novote: step 1: rank %d returned PP_OK", r);
        CHECK(W.out[r][2] == PP_ERR_TIMEOUT && strstr(W.omsg[r][2], "abort"),
              "novote: rank %d: pp_nccl_grid_recover with a rank that never votes: %s: %s", r, pp_result_str(W.out[r][2]),
              W.omsg[r][2]);
        CHECK(W.secs[r][2] < NOVOTE_TIMEOUT + 1.0, "novote: rank %d: recover took %.2f s (deadline %.1f s)", r, W.secs[r][2],
              NOVOTE_TIMEOUT);
    }
    printf("tp fault novote: rank 0: pp_nccl_grid_recover %s in %.2f s: %.120s\n", pp_result_str(W.out[0][2]), W.secs[0][2],
           W.omsg[0][2]);
}

/* One run: mode 1 ("before") or 2 ("after"); every rank must fail step 1 and pass steps 0 and 2. */
static void run(int mode) {
    static world W;
    const char* name = mode == 1 ? "before" : "after";
    pp_error err;
    int r;
    memset(&W, 0, sizeof W);
    g_mode = mode;
    ncclGetUniqueId(&W.id);
    CHECK(pp_threads_run(NR, rank_main, &W, &err) == PP_OK, "%s", err.msg);
    for (r = 0; r < NR; r++) {
        CHECK(W.bad[r] == 0, "%s: rank %d: %s", name, r, W.msg[r]);
        CHECK(W.out[r][0] == PP_OK, "%s: step 0: rank %d: %s", name, r, W.omsg[r][0]);
        CHECK(W.out[r][1] != PP_OK, "%s: step 1: rank %d returned PP_OK (world rank %d's layer failed)", name, r, FAIL_WR);
        CHECK(W.secs[r][1] < (mode == 1 ? 1.5 : 1.0) * DEADLINE, "%s: step 1: rank %d took %.1f s to fail (deadline %.0f s)",
              name, r, W.secs[r][1], DEADLINE);
        CHECK(W.out[r][2] == PP_OK, "%s: step 2: rank %d: %s", name, r, W.omsg[r][2]);
        /* "before" aborts replica 0's communicators: every rank makes the grid again; "after" none */
        CHECK(W.rebuilt[r] == (mode == 1), "%s: rank %d: pp_nccl_grid_recover's answer %d", name, r, W.rebuilt[r]);
        printf("tp fault %s: rank %d: step 1 %s in %.2f s: %.160s; grid made again: %d\n", name, r,
               pp_result_str(W.out[r][1]), W.secs[r][1], W.omsg[r][1], W.rebuilt[r]);
    }
}

int main(int argc, char** argv) {
    int r, i;
    for (i = 0; i < ROWS * COLS; i++) X[i] = (float)((i * 13) % 11) / 8.0f - 0.625f;
    for (r = 0; r < NR; r++) /* each device's legacy stream, before the run */
        CHECK(cudaSetDevice(r) == cudaSuccess && cudaStreamSynchronize(0) == cudaSuccess, "device %d: legacy stream", r);
    if (argc < 2 || !strcmp(argv[1], "before")) run(1);
    if (argc < 2 || !strcmp(argv[1], "after")) run(2);
    if (argc < 2 || !strcmp(argv[1], "novote")) run_novote();
    if (argc < 2) { /* "after" again with one kernel per device at a time [UG: Using multiple NCCL
                       communicators concurrently]: the TP collectives, the pipe's sends and
                       receives and the dp vote, on three communicators, still meet */
        fakenccl_options o = fakenccl_get_options();
        o.serialize_kernels = 1;
        fakenccl_set_options(&o);
        run(2);
    }
    return TEST_DONE("test_tp_nccl_fault");
}
