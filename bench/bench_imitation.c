/* bench/bench_imitation.c - a GPU transport's host overhead, measured on the CUDA imitation.

   Without a GPU the time a GPU step takes cannot be measured here, but what the host does for it
   can: every CUDA runtime call and every host wait on device work is counted by tests/fakecuda.
   For each transport and schedule this runs the example MLP for a few warm-up steps (the block
   pool grows), then counts, over the measured steps, inside pp_stage_step on every rank:
     calls/transfer   CUDA runtime calls of the transport (its functions and the block-reuse hook,
                      which exists for transfers), per message moved
     hooks/action     calls of the other device hooks (gradient zeroing, timeline marks, pool
                      growth), per action; the layers' own kernel launches are not counted
     waits/action     host waits on device work (stream/event/device synchronisation, copies
                      to host memory, cudaFree), per action
   Below each row: NCCL's own calls (inside ncclGroupEnd) apart from the transport's; how many
   transfers carry data (the others are the library's own host-memory messages) and the
   transport's calls per data transfer, all of them counted against the data; of the
   transport's, the queries that found the work not done yet (probes, polling waits); and the
   transport waits that waited for the device (blocking or polling), per action, split by where
   (during the actions, from before the first action's layers to the last's; or at the step's
   end) and by the message (the executor's data, or the library's own step messages: the plan
   check before the first receive from each neighbour, the agreement).
   The last line of a row is the steady path: each configuration runs again with 4m
   micro-batches, and the difference between the two runs, divided by the difference in data
   transfers, is what one more micro-batch's transfers cost, with the per-step costs (the plan
   check, the agreement, warm-up and cool-down groups, the host's wait at the step's end) left
   out: the transport's calls per data transfer, of them the queries that found the work not
   done yet, and host waits on data in the actions per added action.
   The goal for a GPU transport on the steady path: at most 4 calls per transfer and no host
   wait on data in the actions. #wrong counts layers whose gradient is not bit-identical to
   pp_sequential_step's; the footer says OK or FAILED and the exit code agrees.

     build/bench_imitation [--steps N] [--warmup N] [--smoke]

   A transport is one entry of the table `transports` below: create a world for p ranks, bind a
   rank (in its own thread: transport, device hooks, compute stream), begin and end a step,
   destroy. Built with -Itests/fakecuda (and -Itests/fakenccl for NCCL transports). */
#define PIPELINE_IMPLEMENTATION
#include "pipeline_nccl.h" /* and pipeline_cuda.h: built with -Itests/fakenccl -Itests/fakecuda */
#include "examples/mlp.h"
#include "tests/fakecuda/layer_kernels.h"
#include "tests/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 64
#define IN 8
#define CLASSES 5
static const int DIMS[MLP_DEPTH + 1] = {IN, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, CLASSES};

/* ---- transports ------------------------------------------------------------------------------- */

typedef struct bench_env {
    pp_transport transport;
    pp_device_ops device;
    cudaStream_t stream;        /* the rank's compute stream: layers launch there */
} bench_env;

typedef struct bench_transport {
    const char* name;
    void* (*create)(int p, const int* devices, pp_error* err);
    pp_result (*bind)(void* world, int rank, bench_env* env, pp_error* err); /* in the rank's thread */
    pp_result (*step_begin)(void* world, pp_error* err);
    pp_result (*step_end)(void* world, pp_error* err);
    void (*destroy)(void* world);
} bench_transport;

static void* cuda_create(int p, const int* devices, pp_error* err) {
    pp_cuda* c = NULL;
    pp_cuda_desc d;
    memset(&d, 0, sizeof d);
    d.n_ranks = p;
    d.devices = devices;
    return pp_cuda_create(&d, &c, err) == PP_OK ? c : NULL;
}
static pp_result cuda_bind(void* w, int rank, bench_env* env, pp_error* err) {
    pp_cuda* c = (pp_cuda*)w;
    env->transport = pp_cuda_transport(c, rank);
    env->device = pp_cuda_device_ops(c, rank);
    env->stream = pp_cuda_stream(c, rank);
    return pp_cuda_bind(c, rank, err);
}
static pp_result cuda_step_begin(void* w, pp_error* err) { return pp_cuda_step_begin((pp_cuda*)w, err); }
static pp_result cuda_step_end(void* w, pp_error* err) { return pp_cuda_step_end((pp_cuda*)w, NULL, err); }
static void cuda_destroy(void* w) { pp_cuda_destroy((pp_cuda*)w); }

/* pp_nccl: every rank its own device, communicator (made at the first bind, in the rank threads
   together) and one-rank pp_cuda for the block pool and the compute stream */
typedef struct nccl_world {
    int p, devs[PP_MAX_RANKS];
    ncclUniqueId id;
    pp_cuda* c[PP_MAX_RANKS];
    pp_nccl* t[PP_MAX_RANKS];
} nccl_world;
static void* nccl_create(int p, const int* devices, pp_error* err) {
    nccl_world* w = (nccl_world*)calloc(1, sizeof *w);
    int r;
    if (!w) return NULL;
    w->p = p;
    for (r = 0; r < p; r++) w->devs[r] = devices[r];
    if (ncclGetUniqueId(&w->id) != ncclSuccess) {
        free(w);
        snprintf(err->msg, sizeof err->msg, "ncclGetUniqueId failed");
        return NULL;
    }
    return w;
}
static pp_result nccl_bind(void* wv, int rank, bench_env* env, pp_error* err) {
    nccl_world* w = (nccl_world*)wv;
    pp_result rc = PP_OK;
    if (!w->t[rank]) {
        ncclComm_t comm = NULL;
        pp_cuda_desc cd;
        pp_nccl_desc nd;
        memset(&cd, 0, sizeof cd);
        cd.n_ranks = 1;
        cd.devices = &w->devs[rank];
        cudaSetDevice(w->devs[rank]);
        if (ncclCommInitRank(&comm, w->p, w->id, rank) != ncclSuccess) return _pp_fail(err, PP_ERR_TRANSPORT, "ncclCommInitRank");
        rc = pp_cuda_create(&cd, &w->c[rank], err);
        memset(&nd, 0, sizeof nd);
        nd.comm = comm;
        nd.compute = w->c[rank] ? pp_cuda_stream(w->c[rank], 0) : NULL;
        nd.own_comm = 1;
        if (rc == PP_OK) rc = pp_nccl_create(&nd, &w->t[rank], err);
        if (rc != PP_OK) return rc;
    }
    env->transport = pp_nccl_transport(w->t[rank]);
    env->device = pp_cuda_device_ops(w->c[rank], 0);
    env->stream = pp_cuda_stream(w->c[rank], 0);
    return pp_cuda_bind(w->c[rank], 0, err);
}
static pp_result nccl_step_begin(void* wv, pp_error* err) {
    nccl_world* w = (nccl_world*)wv;
    pp_result rc = PP_OK;
    int r;
    for (r = 0; r < w->p && rc == PP_OK; r++) rc = pp_cuda_step_begin(w->c[r], err);
    return rc;
}
static pp_result nccl_step_end(void* wv, pp_error* err) {
    nccl_world* w = (nccl_world*)wv;
    pp_result rc = PP_OK;
    int r;
    for (r = 0; r < w->p && rc == PP_OK; r++) {
        cudaSetDevice(w->devs[r]);
        rc = pp_nccl_step_end(w->t[r], 30, err);
        if (rc == PP_OK) rc = pp_cuda_step_end(w->c[r], NULL, err);
    }
    return rc;
}
static void nccl_destroy(void* wv) {
    nccl_world* w = (nccl_world*)wv;
    int r;
    for (r = 0; r < w->p; r++) {
        cudaSetDevice(w->devs[r]);
        pp_nccl_destroy(w->t[r]);
        pp_cuda_destroy(w->c[r]);
    }
    free(w);
}

static const bench_transport transports[] = {
    {"pp_cuda", cuda_create, cuda_bind, cuda_step_begin, cuda_step_end, cuda_destroy},
    {"pp_nccl", nccl_create, nccl_bind, nccl_step_begin, nccl_step_end, nccl_destroy},
};

/* ---- one configuration -------------------------------------------------------------------------- */

/* the device hooks other than reuse, counted (calls of the calling thread); the mark hook also
   tells the actions from the step's start and end for the host waits of the transport */
typedef struct hook_count {
    pp_device_ops inner;
    uint64_t calls;
    uint64_t pend[2];           /* transport waits that waited, since the last action began: data, the step's own */
    uint64_t in_actions[2];     /* ... moved here when an action begins */
    uint64_t own_sent;          /* the library's own messages sent (plan check, agreement) */
    /* between actions (after one action's layers, before the next one's): the transport's calls
       (hooks' and NCCL's own left out) and its not-ready queries; gap: the thread's counters
       when the last action's layers ended, or gap_open 0 before the step's first action */
    int gap_open;
    uint64_t gap_at[4];         /* thread calls, hooks' calls, NCCL's own calls, not-ready queries */
    uint64_t between_calls, between_polls;
} hook_count;
static void* hc_alloc(void* u, size_t n) {
    hook_count* h = (hook_count*)u;
    uint64_t a = fakecuda_thread_calls();
    void* p = h->inner.alloc(h->inner.user, n);
    h->calls += fakecuda_thread_calls() - a;
    return p;
}
static void hc_free(void* u, void* p) {
    hook_count* h = (hook_count*)u;
    uint64_t a = fakecuda_thread_calls();
    h->inner.free(h->inner.user, p);
    h->calls += fakecuda_thread_calls() - a;
}
static pp_result hc_zero(void* u, void* p, size_t n) {
    hook_count* h = (hook_count*)u;
    uint64_t a = fakecuda_thread_calls();
    pp_result rc = h->inner.zero(h->inner.user, p, n);
    h->calls += fakecuda_thread_calls() - a;
    return rc;
}
static void hc_mark(void* u, const pp_action* x, int idx, int phase) {
    hook_count* h = (hook_count*)u;
    uint64_t a = fakecuda_thread_calls();
    if (phase == 0) { /* what waited before this action's layers ran was on the actions' path */
        h->in_actions[0] += h->pend[0];
        h->in_actions[1] += h->pend[1];
        h->pend[0] = h->pend[1] = 0;
        if (h->gap_open) {
            h->between_calls += (a - h->gap_at[0]) - (h->calls - h->gap_at[1]) - (fakenccl_thread_cuda_calls() - h->gap_at[2]);
            h->between_polls += fakecuda_thread_polls() - h->gap_at[3];
        }
    }
    if (h->inner.mark) h->inner.mark(h->inner.user, x, idx, phase);
    h->calls += fakecuda_thread_calls() - a;
    if (phase == 1) {
        h->gap_open = 1;
        h->gap_at[0] = fakecuda_thread_calls();
        h->gap_at[1] = h->calls;
        h->gap_at[2] = fakenccl_thread_cuda_calls();
        h->gap_at[3] = fakecuda_thread_polls();
    }
}
static void hc_reuse(void* u, void* p, size_t n) { /* part of the transfers: not counted here */
    hook_count* h = (hook_count*)u;
    if (h->inner.reuse) h->inner.reuse(h->inner.user, p, n);
}
/* The transport's isend, irecv and wait, wrapped in the rank's thread: a wait that waited for
   the device (a host wait or a not-ready query inside it, fakecuda_thread_waits) counts for the
   message's kind, the executor's data or the library's own step messages (reserved tags: the
   plan check and the agreement). The request's kind is remembered at its post. */
#define WC_SLOTS 4096
typedef struct wait_count {
    pp_transport inner;
    hook_count* h;
    const pp_request* req[WC_SLOTS];
    unsigned char own[WC_SLOTS];
} wait_count;
static __thread wait_count* t_wc; /* the rank's, set in its thread before the stage runs */
static int wc_slot(wait_count* w, const pp_request* r) {
    size_t h = (size_t)(((uint64_t)(uintptr_t)r * 0x9E3779B97F4A7C15ull) >> 40) % WC_SLOTS, i;
    for (i = 0; i < WC_SLOTS; i++, h = (h + 1) % WC_SLOTS)
        if (w->req[h] == r || !w->req[h]) return (int)h;
    return -1;
}
static void wc_note(pp_request* req, int tag) {
    int k = t_wc ? wc_slot(t_wc, req) : -1;
    if (k < 0) return;
    t_wc->req[k] = req;
    t_wc->own[k] = tag >= _PP_TAG_RESERVED;
}
static pp_result wc_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    wc_note(req, tag);
    if (tag >= _PP_TAG_RESERVED) t_wc->h->own_sent++;
    return t_wc->inner.isend(self, peer, tag, buf, bytes, req);
}
static pp_result wc_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    wc_note(req, tag);
    return t_wc->inner.irecv(self, peer, tag, buf, bytes, req);
}
static pp_result wc_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    int k = wc_slot(t_wc, req), own = k >= 0 && t_wc->req[k] == req && t_wc->own[k];
    uint64_t a = fakecuda_thread_waits();
    pp_result rc = t_wc->inner.wait(self, req, timeout_s, err);
    if (fakecuda_thread_waits() > a) t_wc->h->pend[own]++;
    return rc;
}
static pp_transport wait_counting(wait_count* w, hook_count* h, pp_transport inner) {
    pp_transport o = inner;
    memset(w, 0, sizeof *w);
    w->inner = inner;
    w->h = h;
    o.isend = wc_isend;
    o.irecv = wc_irecv;
    o.wait = wc_wait;
    return o;
}

static pp_device_ops hook_counting(hook_count* h, pp_device_ops inner) {
    pp_device_ops o = inner;
    memset(h, 0, sizeof *h);
    h->inner = inner;
    o.alloc = hc_alloc;
    o.free = hc_free;
    o.zero = hc_zero;
    o.mark = hc_mark;
    o.reuse = hc_reuse;
    o.user = h;
    return o;
}

typedef struct run {
    const bench_transport* tr;
    void* world;
    int p;
    pp_stage* st[PP_MAX_RANKS];
    bench_env env[PP_MAX_RANKS];
    hook_count hooks[PP_MAX_RANKS];
    wait_count waits[PP_MAX_RANKS];
    uint64_t at_end[PP_MAX_RANKS][2]; /* transport waits that waited after the step's last action began */
    uint64_t step_calls[PP_MAX_RANKS]; /* runtime calls of the rank's thread inside pp_stage_step */
    pp_stage_desc desc[PP_MAX_RANKS];
    mlp_model g[PP_MAX_RANKS];
    const pp_batch* b;
    pp_result rc[PP_MAX_RANKS];
    pp_step_stats stats[PP_MAX_RANKS];
    pp_error err[PP_MAX_RANKS];
} run;

/* The ranks' counters summed: runtime calls inside pp_stage_step, calls of the device-op hooks,
   sends of the library's own, runtime calls and polls between actions, transport waits that
   waited in an action (tw[0..1]) and after the last one began (tw[2..3]). Taken before and after
   a step, their difference is the step's. */
typedef struct rank_counts {
    uint64_t step, hooks, own, between[2], tw[4];
} rank_counts;
static rank_counts sum_counts(const run* R, int p) {
    rank_counts c;
    int r, k;
    memset(&c, 0, sizeof c);
    for (r = 0; r < p; r++) {
        c.step += R->step_calls[r];
        c.hooks += R->hooks[r].calls;
        c.own += R->hooks[r].own_sent;
        c.between[0] += R->hooks[r].between_calls;
        c.between[1] += R->hooks[r].between_polls;
        for (k = 0; k < 2; k++) {
            c.tw[k] += R->hooks[r].in_actions[k];
            c.tw[2 + k] += R->at_end[r][k];
        }
    }
    return c;
}

static pp_result rank_setup(int rank, void* user) {
    run* R = (run*)user;
    pp_result rc = R->tr->bind(R->world, rank, &R->env[rank], &R->err[rank]);
    if (rc != PP_OK) return R->rc[rank] = rc;
    R->desc[rank].device = hook_counting(&R->hooks[rank], R->env[rank].device);
    R->desc[rank].transport = wait_counting(&R->waits[rank], &R->hooks[rank], R->env[rank].transport);
    t_wc = &R->waits[rank];
    R->desc[rank].layer_ctx = &R->env[rank].stream;
    rc = pp_stage_create(&R->desc[rank], &R->st[rank], &R->err[rank]);
    return R->rc[rank] = rc;
}

static pp_result rank_step(int rank, void* user) {
    run* R = (run*)user;
    pp_result rc = R->tr->bind(R->world, rank, &R->env[rank], &R->err[rank]);
    uint64_t a = fakecuda_thread_calls();
    hook_count* h = &R->hooks[rank];
    t_wc = &R->waits[rank];
    h->gap_open = 0;
    if (rc == PP_OK) rc = pp_stage_step(R->st[rank], R->b, &R->stats[rank]);
    R->step_calls[rank] += fakecuda_thread_calls() - a;
    R->at_end[rank][0] += h->pend[0]; /* after the last action's layers: the step's end */
    R->at_end[rank][1] += h->pend[1];
    h->pend[0] = h->pend[1] = 0;
    return R->rc[rank] = rc;
}

typedef struct result {
    double transfers, actions, calls, transport, hooks, waits, blocked, polls;
    double tw_act[2], tw_end[2]; /* transport waits that waited: in the actions, at the step's end; data, own */
    double nccl_own;                /* of transport: the imitated NCCL's own calls inside its group ends */
    double between, between_polls;  /* the transport's calls between actions (hook_count), not-ready among them */
    double own_msgs;                /* of transfers: the library's own messages */
    double kinds[FAKECUDA_CALL_KINDS];
    int wrong, failed;
    char why[600];
} result;

static void run_config(const bench_transport* tr, pp_schedule_kind kind, int p, int v, int m, int warmup, int steps,
                       const mlp_model* w, const mlp_model* gref, const pp_batch* b, result* out) {
    static run R;
    static float* gbuf[PP_MAX_RANKS];
    pp_schedule sched;
    pp_action* acts;
    pp_error err;
    int devs[PP_MAX_RANKS], first[64], r, s, l, k;
    size_t n = pp_schedule_size(kind, p, v, m);
    memset(out, 0, sizeof *out);
    memset(&R, 0, sizeof R);
    acts = (pp_action*)malloc(n * sizeof *acts);
    if (!acts || pp_schedule_make(kind, p, v, m, acts, n, &sched, &err) != PP_OK ||
        pp_partition_uniform(MLP_DEPTH + 1, p * v, first, &err) != PP_OK) {
        snprintf(out->why, sizeof out->why, "schedule: %s", err.msg);
        out->failed = 1;
        free(acts);
        return;
    }
    for (r = 0; r < p; r++) devs[r] = r % FAKECUDA_DEVICES;
    R.tr = tr;
    R.p = p;
    R.b = b;
    if (!(R.world = tr->create(p, devs, &err))) {
        snprintf(out->why, sizeof out->why, "%s: %s", tr->name, err.msg);
        out->failed = 1;
        free(acts);
        return;
    }
    hx_mlp_rank_grads(R.g, gbuf, p, DIMS);
    for (r = 0; r < p; r++) {
        R.desc[r].model = layer_kernels_model(mlp_model_desc());
        R.desc[r].weights = w;
        R.desc[r].grads = &R.g[r];
        R.desc[r].schedule = &sched;
        R.desc[r].partition = first;
        R.desc[r].rank = r;
        R.desc[r].timeout_s = 30;
    }
    if (pp_threads_run(p, rank_setup, &R, &err) != PP_OK) {
        for (r = 0; r < p && R.rc[r] == PP_OK; r++) {
        }
        snprintf(out->why, sizeof out->why, "setup rank %d: %s", r < p ? r : 0, r < p ? R.err[r].msg : err.msg);
        out->failed = 1;
    }
    for (s = 0; s < warmup + steps && !out->failed; s++) {
        fakecuda_stats a, z;
        fakenccl_stats na, nz;
        uint64_t launched0, sent = 0;
        rank_counts c0, c1;
        pp_result rc = tr->step_begin(R.world, &err);
        fakecuda_stats_get(&a);
        fakenccl_stats_get(&na);
        launched0 = layer_kernels_launched();
        c0 = sum_counts(&R, p);
        if (rc == PP_OK) rc = pp_threads_run(p, rank_step, &R, &err);
        fakecuda_stats_get(&z);
        fakenccl_stats_get(&nz);
        c1 = sum_counts(&R, p);
        if (rc == PP_OK) rc = tr->step_end(R.world, &err);
        if (rc != PP_OK) {
            for (r = 0; r < p && R.rc[r] == PP_OK; r++) {
            }
            snprintf(out->why, sizeof out->why, "step %d: %s", s, r < p ? pp_stage_error(R.st[r]) : err.msg);
            out->failed = 1;
            break;
        }
        if (s < warmup) continue;
        for (r = 0; r < p; r++) sent += R.stats[r].msgs_sent;
        out->transfers += (double)sent;
        out->actions += (double)p * sched.per_rank;
        for (k = 0; k < FAKECUDA_CALL_KINDS; k++) out->kinds[k] += (double)(z.calls[k] - a.calls[k]);
        out->kinds[FAKECUDA_CALL_LAUNCH] -= (double)(layer_kernels_launched() - launched0); /* the model's, not ours */
        out->hooks += (double)(c1.hooks - c0.hooks);
        out->own_msgs += (double)(c1.own - c0.own);
        out->between += (double)(c1.between[0] - c0.between[0]);
        out->between_polls += (double)(c1.between[1] - c0.between[1]);
        for (k = 0; k < 2; k++) {
            out->tw_act[k] += (double)(c1.tw[k] - c0.tw[k]);
            out->tw_end[k] += (double)(c1.tw[2 + k] - c0.tw[2 + k]);
        }
        out->transport += (double)(c1.step - c0.step) - (double)(c1.hooks - c0.hooks) - (double)(layer_kernels_launched() - launched0);
        out->nccl_own += (double)(nz.cuda_calls - na.cuda_calls);
        out->waits += (double)(z.host_waits - a.host_waits);
        out->blocked += (double)(z.host_blocked - a.host_blocked);
        out->polls += (double)(z.polls_not_ready - a.polls_not_ready);
    }
    for (k = 0; k < FAKECUDA_CALL_KINDS; k++) out->calls += out->kinds[k];
    for (l = 0; !out->failed && l < MLP_DEPTH; l++) {
        int stg, rank = hx_layer_owner(&sched, first, l, &stg);
        out->wrong += rank < 0 || !hx_mlp_layer_equal(&R.g[rank], gref, l);
    }
    for (r = 0; r < p; r++) pp_stage_destroy(R.st[r]);
    tr->destroy(R.world);
    hx_mlp_free_grads(gbuf, p);
    free(acts);
}

int main(int argc, char** argv) {
    static const struct {
        pp_schedule_kind kind;
        int p, v, m;
    } configs[] = {{PP_SCHED_1F1B, 4, 1, 8}, {PP_SCHED_INTERLEAVED, 4, 2, 8}};
    hx_mlp f;
    pp_batch b;
    pp_error err;
    int steps = 3, warmup = 4, i, t, c, ok = 0, bad = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--smoke")) steps = warmup = 1;
        else {
            fprintf(stderr, "usage: %s [--steps N] [--warmup N] [--smoke]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    if (warmup < 1) warmup = 1; /* the first step grows the pool: never measured */
    hx_mlp_init(&f, DIMS, 21, ROWS, 8, 9);
    hx_dense_batch(&b, f.x, f.y, ROWS, IN, 8); /* host memory: the imitation's kernels read it directly */
    if (hx_mlp_reference(&f, &b, warmup + steps, &err) != PP_OK) {
        fprintf(stderr, "sequential reference: %s\n", err.msg);
        return 1;
    }
    printf("GPU transports' host work per step on the CUDA imitation (%d measured steps after %d warm-up)\n", steps, warmup);
    printf("%-10s %-12s %2s %2s %2s %10s %8s %14s %13s %13s %7s\n", "transport", "schedule", "p", "v", "m", "transfers/step",
           "actions", "calls/transfer", "hooks/action", "waits/action", "#wrong");
    for (t = 0; t < (int)(sizeof transports / sizeof transports[0]); t++)
        for (c = 0; c < (int)(sizeof configs / sizeof configs[0]); c++) {
            result res;
            double tr_per, k;
            int kk;
            b.m = configs[c].m;
            run_config(&transports[t], configs[c].kind, configs[c].p, configs[c].v, configs[c].m, warmup, steps, &f.w,
                       &f.gref, &b, &res);
            if (res.failed) {
                printf("%-10s %-12s %2d %2d %2d  FAILED: %s\n", transports[t].name, pp_schedule_name(configs[c].kind),
                       configs[c].p, configs[c].v, configs[c].m, res.why);
                bad++;
                continue;
            }
            tr_per = res.transfers > 0 ? res.transport / res.transfers : 0;
            printf("%-10s %-12s %2d %2d %2d %14.0f %8.0f %14.2f %13.2f %13.3f %7d\n", transports[t].name,
                   pp_schedule_name(configs[c].kind), configs[c].p, configs[c].v, configs[c].m, res.transfers / steps,
                   res.actions / steps, tr_per, res.actions > 0 ? res.hooks / res.actions : 0,
                   res.actions > 0 ? res.waits / res.actions : 0, res.wrong);
            printf("%-10s   every call in the steps, per transfer (%.2f):", "", res.calls / (res.transfers > 0 ? res.transfers : 1));
            for (kk = 0; kk < FAKECUDA_CALL_KINDS; kk++)
                if ((k = res.kinds[kk]) > 0) printf(" %s %.2f", fakecuda_call_name(kk), k / (res.transfers > 0 ? res.transfers : 1));
            printf("\n");
            if (res.nccl_own > 0)
                printf("%-10s   of the calls/transfer, NCCL's own (device switches and launches in ncclGroupEnd) %.2f, "
                       "the transport's %.2f\n",
                       "", res.nccl_own / res.transfers, (res.transport - res.nccl_own) / res.transfers);
            if (res.transfers > res.own_msgs)
                printf("%-10s   %.0f of the %.0f transfers a step carry data, the rest are the library's own host-memory "
                       "messages (plan check, agreement); the transport's calls per data transfer, all counted against "
                       "the data: %.2f\n",
                       "", (res.transfers - res.own_msgs) / steps, res.transfers / steps,
                       (res.transport - res.nccl_own) / (res.transfers - res.own_msgs));
            if (res.transfers > 0 && res.actions > 0)
                printf("%-10s   of the transport's, queries that found the work not done yet (probes and polling waits) %.2f; the "
                       "rest, %.2f, moved the transfers; %.2f such queries per action\n",
                       "", res.polls / res.transfers, (res.transport - res.nccl_own - res.polls) / res.transfers,
                       res.polls / res.actions);
            if (res.actions > 0)
                printf("%-10s   transport waits that waited for the device, per action: in the actions %.3f on data, %.3f "
                       "on the step's own messages; at the step's end %.3f on data, %.3f on its own\n",
                       "", res.tw_act[0] / res.actions, res.tw_act[1] / res.actions, res.tw_end[0] / res.actions,
                       res.tw_end[1] / res.actions);
            {   /* the steady path: the same again with 4m micro-batches, the difference */
                result big;
                double dd, dtr, dpoll;
                b.m = 4 * configs[c].m;
                run_config(&transports[t], configs[c].kind, configs[c].p, configs[c].v, b.m, warmup, steps, &f.w, &f.gref, &b,
                           &big);
                dd = (big.transfers - big.own_msgs) - (res.transfers - res.own_msgs);
                dtr = big.between - res.between;
                dpoll = big.between_polls - res.between_polls;
                if (big.failed || big.wrong || dd <= 0) {
                    printf("%-10s   steady path, m %d -> %d: FAILED: %s\n", "", configs[c].m, b.m,
                           big.failed ? big.why : big.wrong ? "gradients differ" : "no more transfers");
                    bad++;
                    continue;
                }
                printf("%-10s   steady path, m %d -> %d (what each added data transfer costs between actions): the "
                       "transport's calls %.2f, of them not-ready queries %.2f; all its calls in the step %.2f; host waits "
                       "on data in the actions %.3f per added action\n",
                       "", configs[c].m, b.m, dtr / dd, dpoll / dd < 0.005 ? 0.0 : dpoll / dd, /* timing: no -0.00 */
                       ((big.transport - big.nccl_own) - (res.transport - res.nccl_own)) / dd,
                       big.actions > res.actions && big.tw_act[0] > res.tw_act[0]
                           ? (big.tw_act[0] - res.tw_act[0]) / (big.actions - res.actions)
                           : 0.0);
            }
            if (res.wrong) bad++;
            else ok++;
        }
    printf("%s\nbench_imitation: %d passed, %d failed\n", bad ? "FAILED" : "OK", ok, bad);
    hx_mlp_free(&f);
    return bad ? 1 : 0;
}
