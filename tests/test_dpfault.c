/* tests/test_dpfault.c - the data-parallel path's failures: a pp = 2 x dp = 2 grid over the
   threads transport (one world per pipeline, one per data-parallel group), the MLP on ZB-H1
   (deferred W), each stage's gradients reduced from its gradients-final hook (pp_dp_overlap) in
   small buckets. A fault at step 1 of 4, then the documented recovery only (pp_dp_overlap_wait
   on every rank after every step, whatever the step returned; pp_dp_overlap_reset where it
   failed, gradients zeroed, pp_threads_reset on both pipelines' worlds, never on the
   data-parallel ones). The sweep: a transport fault at every call of every rank's data-parallel
   transport (every all-reduce, every bucket, the vote's part and verdict), a failing hook on
   every rank (the step then ends with pp_dp_overlap_end), a replica late past the deadline, one
   replica's layer failing in F, B or W. After each: every rank of the grid returns the same
   outcome for the step (but where a member's wait for the vote's verdict fails after it was
   sent, which no protocol settles: then the next step fails on every rank saying the weights
   may differ), no rank returns PP_OK with gradients other than the clean run's, a failed rank
   names its error, the failing step ends within one deadline, and the next steps are bit-exact
   on every rank. `agree` runs the last 8 calls of every rank (the last bucket's reply, the vote);
   `plain` the loop without pp_dp_overlap (pp_dp_agree, then pp_grad_allreduce) with each layer fault.
   Also: after a failure, pp_dp_overlap_wait waits one deadline, not one per started bucket; a
   NaN or Inf scale is refused at create. Negative controls: build/dpfault-controls.
   The sweep is sampled: PP_TEST_FULL=1 runs every case, else those whose index % R equals
   PP_TEST_SEED % R (the seed is printed). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#define PP 2
#define DP 2
#define NR (PP * DP)
#define M 4
#define ROWS 4               /* per micro-batch */
#define STEPS 4
#define FSTEP 1              /* the step the fault hits */
#define DPT 0.2              /* the data-parallel deadline */
#define PIPET 10.0           /* the pipelines' deadline: never reached */
#define LATE (1.5 * DPT)     /* a late replica's delay */
#define SAMPLE 8             /* R: one case in R unless PP_TEST_FULL=1 (2R in make quick) */

enum { F_NONE, F_CALL, F_HOOK, F_LATE, F_LAYER };
enum { OP_F, OP_B, OP_W };

typedef struct fault {
    int kind, grank, k;      /* F_CALL: the k-th call of grank's dp transport; F_HOOK: grank's hook */
    int op, mb;              /* F_LAYER: grank's layers in op on micro-batch mb; F_LATE: grank's first F */
} fault;

/* what the layer and transport wrappers read (set before the threads start, read in them) */
static fault FAULT;
static int STEP;
static int PLAIN; /* 1: no pp_dp_overlap; after the step pp_dp_agree, then pp_grad_allreduce where it agreed */
static pp_model INNER;

typedef struct rankctx {
    int grank;
    pp_dp_overlap* ov;
    pp_transport in;         /* the dp transport under the fault wrapper */
    int calls;               /* its calls this step */
} rankctx;

static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

static int hit(const pp_layer_io* io, int op) {
    const rankctx* c = (const rankctx*)io->ctx;
    if (STEP != FSTEP || !c || c->grank != FAULT.grank) return 0;
    if (FAULT.kind == F_LATE && op == OP_F && io->mb->index == 0 && io->layer == (c->grank % PP) * 6) {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)(LATE * 1e9);
        nanosleep(&ts, NULL);
        return 0;
    }
    return FAULT.kind == F_LAYER && FAULT.op == op && io->mb->index == FAULT.mb;
}
static int wfwd(const void* w, int l, pp_layer_io* io) { return hit(io, OP_F) ? 42 : INNER.forward(w, l, io); }
static int wbwd(const void* w, void* g, int l, pp_layer_io* io) { return hit(io, OP_B) ? 43 : INNER.backward(w, g, l, io); }
static int wwg(const void* w, void* g, int l, pp_layer_io* io) { return hit(io, OP_W) ? 44 : INNER.weight_grad(w, g, l, io); }

/* the dp transport with a fault at one call */
static int fcall(rankctx* c) { return STEP == FSTEP && FAULT.kind == F_CALL && FAULT.grank == c->grank && c->calls++ == FAULT.k; }
static int fcall_count(rankctx* c) { return c->calls++ < 0; }
static int COUNT_ONLY;
static int fw_hit(rankctx* c) { return COUNT_ONLY ? fcall_count(c) : fcall(c); }
static pp_result fw_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    rankctx* c = (rankctx*)self;
    if (fw_hit(c)) return PP_ERR_TRANSPORT;
    return c->in.isend(c->in.self, peer, tag, buf, bytes, req);
}
static pp_result fw_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    rankctx* c = (rankctx*)self;
    if (fw_hit(c)) return PP_ERR_TRANSPORT;
    return c->in.irecv(c->in.self, peer, tag, buf, bytes, req);
}
static pp_result fw_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    rankctx* c = (rankctx*)self;
    if (fw_hit(c)) {
        c->in.cancel(c->in.self, req); /* what a transport's failed wait does: the receive withdrawn */
        if (err) snprintf(err->msg, sizeof err->msg, "rank %d: injected transport fault", c->grank);
        return PP_ERR_TRANSPORT;
    }
    return c->in.wait(c->in.self, req, timeout_s, err);
}
static pp_result fw_cancel(void* self, pp_request* req) {
    rankctx* c = (rankctx*)self;
    return c->in.cancel(c->in.self, req);
}
#ifdef PP_TEST_NO_DP_STEP_ID
static pp_result fw_allreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                              double timeout_s, pp_error* err);
#endif
static pp_transport fw_transport(rankctx* c) {
    pp_transport t;
    memset(&t, 0, sizeof t);
    t.self = c;
    t.rank = c->in.rank;
    t.size = c->in.size;
    t.isend = fw_isend;
    t.irecv = fw_irecv;
    t.wait = fw_wait;
    t.cancel = fw_cancel;
#ifdef PP_TEST_NO_DP_STEP_ID /* the overlap then calls allreduce_sum: the same messages, untagged */
    t.allreduce_sum = fw_allreduce;
#endif
    return t;
}
#ifdef PP_TEST_NO_DP_STEP_ID
static pp_result fw_allreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                              double timeout_s, pp_error* err) {
    pp_transport t = fw_transport((rankctx*)self);
    return pp_allreduce_p2p(&t, buf, count, dtype, ranks, n_ranks, timeout_s, err);
}
#endif

static pp_result fhook(void* user, int rank, int stage) {
    rankctx* c = (rankctx*)user;
    if (STEP == FSTEP && FAULT.kind == F_HOOK && FAULT.grank == c->grank) return PP_ERR_LAYER;
    return pp_dp_overlap_hook(c->ov, rank, stage);
}

typedef struct grid {
    pp_threads *pipes[DP], *dpw[PP];
    hx_sched sc;
    int first[PP + 1];
    mlpz_model w, g[NR];
    float* wbuf;
    float* gbuf[NR];
    size_t n;
    pp_stage* st[NR];
    rankctx ctx[NR];
    pp_batch batch[STEPS][DP];
    float* x[STEPS][DP];
    int32_t* y[STEPS][DP];
    pp_result rc[NR];
    int wrapped;             /* the hook under fhook: the step's end is pp_dp_overlap_end */
    double t[NR];
    char msg[NR][700];
} grid;

static pp_result rank_step(int r, void* user) {
    grid* G = (grid*)user;
    pp_step_stats stats;
    pp_error err;
    double t0 = hx_now();
    pp_result rc;
    pp_result w;
    G->ctx[r].calls = 0;
    rc = pp_stage_step(G->st[r], &G->batch[STEP][r / PP], &stats);
    if (rc != PP_OK) snprintf(G->msg[r], sizeof G->msg[r], "step: %s", pp_stage_error(G->st[r]));
    if (PLAIN) { /* the loop of a trainer that reduces after the step: agree, then reduce where agreed */
        pp_transport* dpt = &G->ctx[r].in;
        w = pp_dp_agree(dpt, NULL, 0, STEP, rc, DPT, &err);
        if (w == PP_OK) w = pp_grad_allreduce(dpt, NULL, 0, G->gbuf[r], G->n, PP_F32, 1.0 / DP, DPT, &err);
        if (w != PP_OK) snprintf(G->msg[r], sizeof G->msg[r], "agree or reduce: %s", err.msg);
        G->rc[r] = w;
        G->t[r] = hx_now() - t0;
        return PP_OK;
    }
    /* the step's end on every rank, whatever the step returned: the grid's outcome */
    w = G->wrapped ? pp_dp_overlap_end(G->ctx[r].ov, G->st[r], rc, NULL, &err) : pp_dp_overlap_wait(G->ctx[r].ov, NULL, &err);
    if (w != PP_OK) snprintf(G->msg[r], sizeof G->msg[r], "wait: %s", err.msg);
    if (rc != PP_OK && w == PP_OK) snprintf(G->msg[r], sizeof G->msg[r], "the wait returned PP_OK after a failed step");
    G->rc[r] = rc != PP_OK && w == PP_OK ? PP_ERR_INVALID : w;
    G->t[r] = hx_now() - t0;
    return PP_OK;
}

/* A grid; wrap: the dp transports under the fault wrapper; hook: the hook under fhook. */
static int grid_make(grid* G, int wrap, int hook) {
    pp_error err;
    mlp_model w;
    int r, s, l;
    memset(G, 0, sizeof *G);
    G->wrapped = hook;
    for (r = 0; r < DP; r++)
        if (pp_threads_create(PP, &G->pipes[r], &err) != PP_OK) return 0;
    for (r = 0; r < PP; r++)
        if (pp_threads_create(DP, &G->dpw[r], &err) != PP_OK) return 0;
    if (hx_sched_make(&G->sc, PP_SCHED_ZB_H1, PP, 1, M, &err) != PP_OK) return 0;
    if (pp_partition_uniform(MLP_DEPTH + 1, PP, G->first, &err) != PP_OK) return 0;
    G->wbuf = mlp_init(&w, NULL, DIMS, 7, NULL);
    mlpz_from_mlp(&G->w, &w);
    G->n = mlp_param_count(DIMS);
    for (s = 0; s < STEPS; s++)
        for (r = 0; r < DP; r++) {
            G->x[s][r] = (float*)malloc(sizeof(float) * M * ROWS * DIMS[0]);
            G->y[s][r] = (int32_t*)malloc(sizeof(int32_t) * M * ROWS);
            mlp_make_data(G->x[s][r], G->y[s][r], M * ROWS, DIMS[0], DIMS[MLP_DEPTH], 100u + 7u * (uint64_t)s + (uint64_t)r, 3);
            hx_dense_batch(&G->batch[s][r], G->x[s][r], G->y[s][r], M * ROWS, DIMS[0], M);
        }
    for (r = 0; r < NR; r++) {
        int rep = r / PP, pr = r % PP, nb = 0;
        mlp_model g, unused;
        pp_stage_desc d;
        pp_dp_overlap_desc od;
        pp_grad_buf bufs[2 * MLP_DEPTH];
        rankctx* c = &G->ctx[r];
        free(mlp_init(&unused, &g, DIMS, 1, &G->gbuf[r]));
        mlpz_from_mlp(&G->g[r], &g);
        for (l = G->first[pr]; l < G->first[pr + 1] && l < MLP_DEPTH; l++) {
            const dense_params* p = &G->g[r].dense[l];
            pp_grad_buf a = {0}, b = {0};
            a.layer = b.layer = l;
            a.dtype = b.dtype = PP_F32;
            a.data = p->w;
            a.count = (size_t)p->in * p->out;
            b.data = p->b;
            b.count = (size_t)p->out;
            bufs[nb++] = a;
            bufs[nb++] = b;
        }
        c->grank = r;
        c->in = pp_threads_transport(G->dpw[pr], rep);
        memset(&od, 0, sizeof od);
        od.dp.t = &c->in;
        od.dp.timeout_s = DPT;
        {
            pp_transport ft = fw_transport(c);
            if (wrap) od.dp.t = &ft;
            od.bufs = bufs;
            od.n_bufs = nb;
            od.partition = G->first;
            od.n_stages = PP;
            od.bucket_bytes = 160;
            if (pp_dp_overlap_create(&od, &c->ov, &err) != PP_OK) return 0;
        }
        hx_stage_desc(&d, NULL, INNER, &G->w, &G->g[r], &G->sc.s, G->first, pr, pp_threads_transport(G->pipes[rep], pr));
        d.model.forward = wfwd;
        d.model.backward = wbwd;
        d.model.weight_grad = wwg;
        d.timeout_s = PIPET;
        d.layer_ctx = c;
        d.grads_final = PLAIN ? NULL : hook ? fhook : pp_dp_overlap_hook;
        d.grads_final_user = PLAIN ? NULL : hook ? (void*)c : (void*)c->ov;
        if (pp_stage_create(&d, &G->st[r], &err) != PP_OK) {
            printf("stage %d: %s\n", r, err.msg);
            return 0;
        }
    }
    return 1;
}

static void grid_free(grid* G) {
    int r, s;
    for (r = 0; r < NR; r++) {
        pp_stage_destroy(G->st[r]);
        pp_dp_overlap_destroy(G->ctx[r].ov);
        free(G->gbuf[r]);
    }
    for (s = 0; s < STEPS; s++)
        for (r = 0; r < DP; r++) {
            free(G->x[s][r]);
            free(G->y[s][r]);
        }
    for (r = 0; r < DP; r++) pp_threads_destroy(G->pipes[r]);
    for (r = 0; r < PP; r++) pp_threads_destroy(G->dpw[r]);
    hx_sched_free(&G->sc);
    free(G->wbuf);
}

/* One step on every rank, then the documented recovery where it failed. Returns the ranks that failed. */
static int grid_step(grid* G, int step, float* out /* [NR][n] or NULL */) {
    pp_error err;
    int r, failed = 0;
    STEP = step;
    for (r = 0; r < NR; r++) G->msg[r][0] = 0;
    pp_threads_run(NR, rank_step, G, &err);
    for (r = 0; r < NR; r++) {
        if (out) memcpy(out + (size_t)r * G->n, G->gbuf[r], G->n * sizeof(float));
        if (G->rc[r] != PP_OK) {
            failed++;
            pp_dp_overlap_reset(G->ctx[r].ov);
        }
        memset(G->gbuf[r], 0, G->n * sizeof(float));
    }
    if (failed)
        for (r = 0; r < DP; r++) pp_threads_reset(G->pipes[r]);
    return failed;
}

static float* REF; /* [STEPS][NR][n]: the clean run */
static int CALLS[NR];

static const char* case_name(const fault* f, char* buf, size_t n) {
    static const char* ops = "FBW";
    switch (f->kind) {
    case F_CALL: snprintf(buf, n, "dp transport call %d of rank %d fails", f->k, f->grank); break;
    case F_HOOK: snprintf(buf, n, "rank %d's hook fails", f->grank); break;
    case F_LATE: snprintf(buf, n, "rank %d (replica %d) %.2g s late", f->grank, f->grank / PP, LATE); break;
    default: snprintf(buf, n, "rank %d (replica %d) fails in %c of micro-batch %d", f->grank, f->grank / PP, ops[f->op], f->mb);
    }
    return buf;
}

/* A fault the vote tolerates by design (the wait on a message that went: the verdict decides),
   and the one no protocol settles (a member's wait for the verdict, after member 0 sent it). */
static int vote_last(const fault* f, int from_end) {
    return f->kind == F_CALL && f->k == CALLS[f->grank] - from_end;
}
static int tolerated(const fault* f) { return f->grank / PP == 0 ? vote_last(f, 1) : vote_last(f, 2); }
static int unsettled(const fault* f) { return f->grank / PP != 0 && vote_last(f, 1); }

static int SPLITS; /* steps whose outcome split (the unsettled fault), each caught at the next step */

static int run_case(const fault* f, int* n_fail_steps) {
    grid G;
    char name[128];
    float* got;
    int step, r, bad = 0, split = 0;
    case_name(f, name, sizeof name);
    if (!grid_make(&G, f->kind == F_CALL, f->kind == F_HOOK)) {
        CHECK(0, "%s: grid", name);
        return 1;
    }
    got = (float*)malloc(NR * G.n * sizeof(float));
    FAULT = *f;
    for (step = 0; step < STEPS; step++) {
        int failed = grid_step(&G, step, got);
        double worst = 0;
        for (r = 0; r < NR; r++) {
            const float* ref = REF + ((size_t)step * NR + (size_t)r) * G.n;
            int same = memcmp(got + (size_t)r * G.n, ref, G.n * sizeof(float)) == 0;
            if (G.t[r] > worst) worst = G.t[r];
            if (G.rc[r] == PP_OK && !same) {
                CHECK(0, "%s: step %d: rank %d returned PP_OK with gradients other than the clean run's", name, step, r);
                bad++;
            }
            if (PLAIN && G.rc[r] == PP_ERR_TIMEOUT) { /* the agreement tells every member at once */
                CHECK(0, "%s: step %d: rank %d waited for a deadline: %s", name, step, r, G.msg[r]);
                bad++;
            }
            if (G.rc[r] != PP_OK && !strstr(G.msg[r], pp_result_str(G.rc[r]))) {
                CHECK(0, "%s: step %d: rank %d failed without naming its error: %s", name, step, r, G.msg[r]);
                bad++;
            }
        }
        /* every replica and every rank of the grid: one outcome for the step */
        if (failed && failed != NR && !(step == FSTEP && unsettled(f))) {
            CHECK(0, "%s: step %d: %d of %d ranks failed, the others returned PP_OK (rank 0: %s | rank 1: %s | rank 2: %s | "
                  "rank 3: %s)", name, step, failed, NR, G.msg[0], G.msg[1], G.msg[2], G.msg[3]);
            bad++;
        }
        if (split) { /* the step after a split outcome: fails everywhere, saying the weights may differ */
            for (r = 0; r < NR; r++)
                if (G.rc[r] == PP_OK || !strstr(G.msg[r], "may differ")) {
                    CHECK(0, "%s: step %d after a split outcome: rank %d: %s", name, step, r,
                          G.rc[r] == PP_OK ? "PP_OK" : G.msg[r]);
                    bad++;
                }
        } else if (step != FSTEP && failed) {
            CHECK(0, "%s: step %d failed on %d ranks after the recovery (rank 0: %s | rank 1: %s | rank 2: %s | rank 3: %s)",
                  name, step, failed, G.msg[0], G.msg[1], G.msg[2], G.msg[3]);
            bad++;
        }
        split = failed && failed != NR;
        SPLITS += split;
        if (step == FSTEP && tolerated(f) && failed) {
            CHECK(0, "%s: a wait on a message that went failed the step (rank 0: %s | rank 2: %s)", name, G.msg[0], G.msg[2]);
            bad++;
        }
        if (step == FSTEP && (failed || tolerated(f))) ++*n_fail_steps;
        /* one data-parallel deadline at most (and the late replica's own delay) */
        if (worst > DPT * 1.9 + (f->kind == F_LATE ? LATE : 0) + 0.25) {
            CHECK(0, "%s: step %d took %.2f s: more than one deadline of %.2g s", name, step, worst, DPT);
            bad++;
        }
    }
    for (r = 0; r < PP; r++) CHECK(pp_threads_pending(G.pipes[r % DP]) == 0, "%s: the pipelines' worlds are clean", name);
    free(got);
    grid_free(&G);
    FAULT.kind = F_NONE;
    return bad;
}

/* the clean run: the reference bits, and how many calls each rank's dp transport takes */
static void clean_run(void) {
    grid G;
    int i, r;
    CHECK(grid_make(&G, 1, 0), "clean grid");
    REF = (float*)calloc((size_t)STEPS * NR * G.n, sizeof(float));
    COUNT_ONLY = 1;
    for (i = 0; i < STEPS; i++) {
        CHECK(grid_step(&G, i, REF + (size_t)i * NR * G.n) == 0, "clean step %d: %s %s %s %s", i, G.msg[0], G.msg[1],
              G.msg[2], G.msg[3]);
        for (r = 0; r < NR; r++) CALLS[r] = G.ctx[r].calls > CALLS[r] ? G.ctx[r].calls : CALLS[r];
    }
    grid_free(&G);
    COUNT_ONLY = 0;
}

/* The end of the step on every rank: a fault at each of the last calls of each rank's dp
   transport (the last bucket's sum and its reply, the vote's part and verdict): the grid ends
   with one outcome (or, where a member's wait for the verdict fails after it was sent, the next
   step fails everywhere saying the weights may differ), then the steps are exact. */
static void agree(void) {
    int r, k, failing = 0, bad = 0, ran = 0;
    double t0 = hx_now();
    clean_run();
    for (r = 0; r < NR; r++)
        for (k = CALLS[r] - 8; k < CALLS[r]; k++) {
            fault f;
            memset(&f, 0, sizeof f);
            f.kind = F_CALL, f.grank = r, f.k = k;
            ran++;
            bad += run_case(&f, &failing) != 0;
        }
    printf("test_dpfault agree: %d cases in %.1f s, %d went wrong; %d split outcomes (allowed only where a member's "
           "wait for the verdict failed, then the next step must fail on every rank)\n", ran, hx_now() - t0, bad, SPLITS);
    CHECK(failing == ran, "every fault failed its step somewhere, or was tolerated by design (%d of %d)", failing, ran);
    free(REF);
    REF = NULL;
}

static void sweep(void) {
    int all = test_full();
    fault cases[1024];
    int n = 0, i, r, k, op, mb, ran = 0, failing = 0, bad = 0;
    double t0 = hx_now();
    clean_run();
    for (r = 0; r < NR; r++) {
        cases[n].kind = F_HOOK, cases[n].grank = r, n++;
        cases[n].kind = F_LATE, cases[n].grank = r, n++;
        for (op = OP_F; op <= OP_W; op++)
            for (mb = 0; mb < M; mb += M - 1) {
                cases[n].kind = F_LAYER, cases[n].grank = r, cases[n].op = op, cases[n].mb = mb;
                n++;
            }
    }
    for (r = 0; r < NR; r++)
        for (k = 0; k < CALLS[r] && n < 1024; k++) {
            memset(&cases[n], 0, sizeof cases[n]);
            cases[n].kind = F_CALL, cases[n].grank = r, cases[n].k = k;
            n++;
        }
    printf("test_dpfault: %d cases (calls per rank %d %d %d %d), %s, PP_TEST_SEED=%lu\n", n, CALLS[0], CALLS[1], CALLS[2],
           CALLS[3], all ? "all (PP_TEST_FULL=1)" : "1 in " "8", test_seed());
    for (i = 0; i < n; i++) {
        if (!test_pick(i, getenv("PP_QUICK") ? 2 * SAMPLE : SAMPLE)) continue; /* make quick: one in 2R */
        ran++;
        bad += run_case(&cases[i], &failing) != 0;
    }
    printf("test_dpfault: %d cases run in %.1f s, the faulty step failed in %d, %d cases went wrong\n", ran,
           hx_now() - t0, failing, bad);
    CHECK(failing == ran, "every fault failed its step somewhere, or was tolerated by design (%d of %d)", failing, ran);
    free(REF);
    REF = NULL;
}

/* A trainer's loop without pp_dp_overlap: pp_dp_agree after every step, pp_grad_allreduce where
   it agreed. One replica's layer fails in F, B or W at step 1 on each rank: every rank of the grid
   fails that step at once (no one waits for a deadline: the failed replica agrees too), naming
   its error; no rank returns PP_OK with gradients other than the clean run's (the overlap's, the
   same sums); steps 0, 2 and 3 are exact. Its control (dpfault-ctl-agree-alone: each member keeps
   its own outcome) lets the good replica reduce alone: it waits a deadline and fails, and what
   it left in the dp world gives steps 2 and 3 wrong sums with PP_OK. */
static pp_threads* AGREE_W;
static pp_result AGREE_RC[DP];
static char AGREE_MSG[DP][512];
static pp_result agree_at(int r, void* user) { /* member r at step 5 + r: not the same step */
    pp_transport t = pp_threads_transport(AGREE_W, r);
    pp_error e;
    (void)user;
    e.msg[0] = 0;
    AGREE_RC[r] = pp_dp_agree(&t, NULL, 0, 5 + r, PP_OK, 2.0, &e);
    snprintf(AGREE_MSG[r], sizeof AGREE_MSG[r], "%s", e.msg);
    return PP_OK;
}
static void plain(void) {
    int r, op, mb, ran = 0, failing = 0, bad = 0;
    double t0 = hx_now();
    pp_error err;
    pp_transport t1;
    CHECK(pp_dp_agree(NULL, NULL, 0, 0, PP_OK, 1, &err) == PP_ERR_INVALID, "pp_dp_agree: a NULL transport is refused");
    CHECK(pp_threads_create(DP, &AGREE_W, &err) == PP_OK, "%s", err.msg);
    t1 = pp_threads_transport(AGREE_W, 0);
    CHECK(pp_dp_agree(&t1, NULL, 0, 0, (pp_result)999, 1, &err) == PP_ERR_INVALID && strstr(err.msg, "999"),
          "pp_dp_agree: an outcome that is no pp_result is refused: %s", err.msg);
    pp_threads_run(DP, agree_at, NULL, &err);
    for (r = 0; r < DP; r++)
        CHECK(AGREE_RC[r] == PP_ERR_TRANSPORT && strstr(AGREE_MSG[r], "not at the same step"),
              "pp_dp_agree: members at steps 5 and 6: member %d: %s", r, AGREE_MSG[r]);
    pp_threads_destroy(AGREE_W);
    clean_run();
    PLAIN = 1;
    for (r = 0; r < NR; r++)
        for (op = OP_F; op <= OP_W; op++)
            for (mb = 0; mb < M; mb += M - 1) {
                fault f;
                memset(&f, 0, sizeof f);
                f.kind = F_LAYER, f.grank = r, f.op = op, f.mb = mb;
                ran++;
                bad += run_case(&f, &failing) != 0;
            }
    PLAIN = 0;
    printf("test_dpfault plain: %d cases (pp_dp_agree, then pp_grad_allreduce) in %.1f s, the faulty step failed in %d, "
           "%d went wrong\n", ran, hx_now() - t0, failing, bad);
    CHECK(failing == ran, "every fault failed its step (%d of %d)", failing, ran);
    free(REF);
    REF = NULL;
}

/* After a failure the wait waits one deadline, not one per started bucket: a transport whose
   started all-reduces never complete (rank 1 never comes), 8 buckets, a deadline of 0.1 s. */
static pp_threads* LONE;
static pp_result never_iallreduce(void* self, void* buf, size_t count, pp_dtype dtype, const int* ranks, int n_ranks,
                                  pp_request* req) {
    pp_transport t = pp_threads_transport(LONE, 0);
    (void)self, (void)ranks, (void)n_ranks;
    return t.irecv(t.self, 1, 5, buf, count * pp_dtype_size(dtype), req);
}

static void one_deadline(void) {
    pp_error err;
    pp_transport t;
    pp_dp_overlap_desc od;
    pp_dp_overlap* ov = NULL;
    pp_dp_overlap_stats os;
    pp_grad_buf b = {0};
    float g[32] = {0};
    int first[2] = {0, 1};
    double t0, dt;
    pp_result rc;
    CHECK(pp_threads_create(2, &LONE, &err) == PP_OK, "world: %s", err.msg);
    t = pp_threads_transport(LONE, 0);
    t.iallreduce_sum = never_iallreduce;
    b.layer = 0;
    b.data = g;
    b.count = 32;
    b.dtype = PP_F32;
    memset(&od, 0, sizeof od);
    od.dp.t = &t;
    od.dp.timeout_s = 0.1;
    od.bufs = &b;
    od.n_bufs = 1;
    od.partition = first;
    od.n_stages = 1;
    od.bucket_bytes = 16; /* 4 floats: 8 buckets */
    CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_OK, "overlap: %s", err.msg);
    CHECK(pp_dp_overlap_hook(ov, 0, 0) == PP_OK, "the hook starts the buckets: %s", pp_dp_overlap_error(ov));
    t0 = hx_now();
    rc = pp_dp_overlap_wait(ov, &os, &err);
    dt = hx_now() - t0;
    CHECK(rc == PP_ERR_TIMEOUT && strstr(err.msg, "waited"), "the wait times out: %s (%s)", pp_result_str(rc), err.msg);
    CHECK(dt < 0.1 * 1.8, "8 started buckets, a deadline of 0.1 s: the wait took %.2f s (one deadline at most)", dt);
    /* left: the verdict of the vote, sent to rank 1 at once (this rank failed) and never taken */
    CHECK(pp_threads_pending(LONE) == 1, "the other buckets' receives were withdrawn (%zu left)", pp_threads_pending(LONE));
    pp_dp_overlap_destroy(ov);
    pp_threads_destroy(LONE);
}

/* pp_dp_overlap_desc.scale NaN or Inf: refused at create, saying so. */
static void scale_checks(void) {
    pp_error err;
    pp_threads* w;
    pp_transport t;
    pp_dp_overlap_desc od;
    pp_dp_overlap* ov = NULL;
    pp_grad_buf b = {0};
    float g[4] = {0};
    int first[2] = {0, 1}, i;
    const double bad[3] = {NAN, INFINITY, -INFINITY};
    CHECK(pp_threads_create(1, &w, &err) == PP_OK, "world: %s", err.msg);
    t = pp_threads_transport(w, 0);
    b.data = g;
    b.count = 4;
    b.dtype = PP_F32;
    memset(&od, 0, sizeof od);
    od.dp.t = &t;
    od.bufs = &b;
    od.n_bufs = 1;
    od.partition = first;
    od.n_stages = 1;
    for (i = 0; i < 3; i++) {
        od.scale = bad[i];
        err.msg[0] = 0;
        CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_ERR_INVALID && !ov && strstr(err.msg, "scale") &&
                  strstr(err.msg, "finite"),
              "scale %g refused: %s", bad[i], err.msg);
        pp_dp_overlap_destroy(ov);
        ov = NULL;
    }
    od.scale = 1e308;
    CHECK(pp_dp_overlap_create(&od, &ov, &err) == PP_OK, "scale 1e308 is finite: %s", err.msg);
    pp_dp_overlap_destroy(ov);
    pp_threads_destroy(w);
}

int main(int argc, char** argv) {
    INNER = mlpz_model_desc();
    if (test_only(argc, argv, "scale", scale_checks)) return TEST_DONE("test_dpfault scale");
    if (test_only(argc, argv, "deadline", one_deadline)) return TEST_DONE("test_dpfault deadline");
    if (test_only(argc, argv, "sweep", sweep)) return TEST_DONE("test_dpfault sweep");
    if (test_only(argc, argv, "agree", agree)) return TEST_DONE("test_dpfault agree");
    if (test_only(argc, argv, "plain", plain)) return TEST_DONE("test_dpfault plain");
    scale_checks();
    one_deadline();
    agree();
    plain();
    sweep();
    return TEST_DONE("test_dpfault");
}
