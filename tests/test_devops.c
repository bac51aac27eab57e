/* tests/test_devops.c - the stage's device-ops path (pp_stage_desc.device) on the host.

   Host hooks that count their calls stand in for GPU memory: the pipelined gradients must still
   equal the sequential reference bit for bit, blocks must be allocated only on the first step
   (the pool is reused after that), every block freed at destroy, the peak stash per rank must
   equal the simulator's peak, and mark() must bracket every action. A transport wrapper poisons
   every receive buffer before the receive is posted and checks, when the wait returns, that every
   byte was written (the same check tests/test_cuda.cu runs on the GPU). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"

#define ROWS 41
#define IN 6
#define CLASSES 5
#define NSEQ 9
static const int DIMS[MLP_DEPTH + 1] = {IN, 8, 7, 8, 9, 8, 6, 8, 8, 7, 8, CLASSES};
static const int32_t CU[NSEQ + 1] = {0, 2, 9, 10, 17, 19, 27, 28, 36, 41}; /* packed, uneven lengths */

/* Host hooks with counters. Fresh blocks are filled with 0xFF bytes (a NaN pattern) so that a
   read of a byte nobody wrote shows up in the gradients. */
typedef struct hooks {
    int allocs, frees, zeros, marks_open, marks_close, bad_marks;
    size_t bytes;
} hooks;

static void* h_alloc(void* user, size_t bytes) {
    hooks* h = (hooks*)user;
    void* p = malloc(bytes);
    if (p) memset(p, 0xFF, bytes);
    h->allocs++;
    h->bytes += bytes;
    return p;
}
static void h_free(void* user, void* ptr) {
    ((hooks*)user)->frees++;
    free(ptr);
}
static pp_result h_zero(void* user, void* ptr, size_t bytes) {
    ((hooks*)user)->zeros++;
    memset(ptr, 0, bytes);
    return PP_OK;
}
static void h_mark(void* user, const pp_action* a, int idx, int phase) {
    hooks* h = (hooks*)user;
    (void)a;
    if (idx < 0 || (phase == 1 && h->marks_open != h->marks_close + 1) || (phase == 0 && h->marks_open != h->marks_close))
        h->bad_marks++;
    if (phase == 0) h->marks_open++;
    else h->marks_close++;
}

/* The poisoning transport: wraps another one, poisons on irecv, checks on wait. */
#define POISON_MAX 64
typedef struct poison_port {
    pp_transport inner;
    const pp_request* req[POISON_MAX];
    unsigned char* buf[POISON_MAX];
    size_t bytes[POISON_MAX];
    int unwritten;      /* receives that completed with a byte still poisoned */
    int checked;
} poison_port;

/* 1 if any aligned 32-bit word of buf still holds the poison (0xFFFFFFFF: a NaN no layer writes). */
static int still_poisoned(const unsigned char* buf, size_t bytes) {
    size_t i;
    for (i = 0; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, buf + i, 4);
        if (w == 0xFFFFFFFFu) return 1;
    }
    return 0;
}

static pp_result pz_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    poison_port* p = (poison_port*)self;
    return p->inner.isend(p->inner.self, peer, tag, buf, bytes, req);
}
static pp_result pz_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    poison_port* p = (poison_port*)self;
    int i;
    memset(buf, 0xFF, bytes);
    for (i = 0; i < POISON_MAX; i++)
        if (!p->req[i]) {
            p->req[i] = req;
            p->buf[i] = (unsigned char*)buf;
            p->bytes[i] = bytes;
            break;
        }
    return p->inner.irecv(p->inner.self, peer, tag, buf, bytes, req);
}
static pp_result pz_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    poison_port* p = (poison_port*)self;
    pp_result rc = p->inner.wait(p->inner.self, req, timeout_s, err);
    int i;
    for (i = 0; i < POISON_MAX; i++)
        if (p->req[i] == req) {
            if (rc == PP_OK) {
                p->checked++;
                if (still_poisoned(p->buf[i], p->bytes[i])) p->unwritten++;
            }
            p->req[i] = NULL;
        }
    return rc;
}
static pp_result pz_test(void* self, pp_request* req, int* done) {
    poison_port* p = (poison_port*)self;
    return p->inner.test(p->inner.self, req, done);
}
static void pz_abort(void* self, pp_result why, const char* msg) {
    poison_port* p = (poison_port*)self;
    p->inner.abort(p->inner.self, why, msg);
}
static pp_result pz_cancel(void* self, pp_request* req) {
    poison_port* p = (poison_port*)self;
    return p->inner.cancel(p->inner.self, req);
}
static void pz_flight_note(void* self, const pp_flight_entry* e) {
    poison_port* p = (poison_port*)self;
    p->inner.flight_note(p->inner.self, e);
}
static int pz_flight_get(void* self, int peer, pp_flight* out) {
    poison_port* p = (poison_port*)self;
    return p->inner.flight_get(p->inner.self, peer, out);
}
static pp_transport poison_transport(poison_port* p, pp_transport inner) {
    pp_transport t = inner;
    memset(p, 0, sizeof *p);
    p->inner = inner;
    t.self = p;
    t.isend = pz_isend;
    t.irecv = pz_irecv;
    t.wait = pz_wait;
    t.test = inner.test ? pz_test : NULL;
    t.abort = inner.abort ? pz_abort : NULL;
    t.cancel = inner.cancel ? pz_cancel : NULL;
    t.flight_note = inner.flight_note ? pz_flight_note : NULL;
    t.flight_get = inner.flight_get ? pz_flight_get : NULL;
    return t;
}

typedef struct world {
    pp_model model;
    const mlp_model* w;
    mlp_model g[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    const pp_schedule* sched;
    const int* first;
    pp_threads* threads;
    const pp_batch* batch;
    int steps, use_hooks;
    hooks h[PP_MAX_RANKS];
    poison_port pz[PP_MAX_RANKS];
    int allocs_after_first[PP_MAX_RANKS];
    pp_step_stats stats[PP_MAX_RANKS];
    pp_result rc[PP_MAX_RANKS];
    char msg[PP_MAX_RANKS][512];
} world;

static pp_result rank_main(int rank, void* user) {
    world* W = (world*)user;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    pp_result rc;
    int i;
    memset(&d, 0, sizeof d);
    d.model = W->model;
    d.weights = W->w;
    d.grads = &W->g[rank];
    d.schedule = W->sched;
    d.partition = W->first;
    d.rank = rank;
    d.transport = poison_transport(&W->pz[rank], pp_threads_transport(W->threads, rank));
    d.timeout_s = 20;
    if (W->use_hooks) {
        d.device.alloc = h_alloc;
        d.device.free = h_free;
        d.device.zero = h_zero;
        d.device.mark = h_mark;
        d.device.user = &W->h[rank];
    }
    rc = pp_stage_create(&d, &st, &err);
    if (rc != PP_OK) {
        snprintf(W->msg[rank], sizeof W->msg[rank], "%s", err.msg);
        W->rc[rank] = rc;
        return rc;
    }
    for (i = 0; i < W->steps && rc == PP_OK; i++) {
        rc = pp_stage_step(st, W->batch, &W->stats[rank]);
        if (i == 0) W->allocs_after_first[rank] = W->h[rank].allocs;
    }
    if (rc != PP_OK) snprintf(W->msg[rank], sizeof W->msg[rank], "%s", pp_stage_error(st));
    W->rc[rank] = rc;
    pp_stage_destroy(st);
    return rc;
}

static int owner_stage(const int* first, int S, int l) {
    int s;
    for (s = 0; s < S; s++)
        if (l >= first[s] && l < first[s + 1]) return s;
    return -1;
}

static void run_case(pp_schedule_kind kind, int p, int v, int m, int use_hooks, const mlp_model* w,
                     const mlp_model* gref, const pp_batch* batch, int steps) {
    static world W;
    pp_action* acts;
    pp_schedule sched;
    pp_sim_result* sim = (pp_sim_result*)calloc(1, sizeof *sim);
    pp_sim_cost cost;
    pp_error err;
    size_t n = pp_schedule_size(kind, p, v, m);
    int r, l, S = p * v, first[32], ok = 1;
    /* the simulator keeps a stash until W; a fused model (no weight_grad) frees it at B, so on
       the zero-bubble kinds the simulator's peak is an upper bound */
    int zb = pp_schedule_size(kind, p, v, m) == (size_t)p * 3 * v * m; /* has W actions */
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s", pp_schedule_name(kind), p, v, m,
             use_hooks ? "host hooks" : "no hooks");
    acts = (pp_action*)malloc(n * sizeof *acts);
    if (!sim || !acts || pp_schedule_make(kind, p, v, m, acts, n, &sched, &err) != PP_OK) {
        CHECK(0, "%s: schedule", where);
        free(acts);
        free(sim);
        return;
    }
    memset(&cost, 0, sizeof cost);
    pp_simulate(&sched, &cost, sim, NULL, &err);
    memset(&W, 0, sizeof W);
    W.model = mlp_model_desc();
    W.w = w;
    W.sched = &sched;
    W.first = first;
    W.batch = batch;
    W.steps = steps;
    W.use_hooks = use_hooks;
    pp_partition_uniform(W.model.n_layers, S, first, &err);
    pp_threads_create(p, &W.threads, &err);
    for (r = 0; r < p; r++) {
        mlp_model tmp;
        memset(&tmp, 0, sizeof tmp);
        W.g[r] = *w;
        free(mlp_init(&tmp, &W.g[r], DIMS, 1, &W.gbuf[r]));
    }
    if (pp_threads_run(p, rank_main, &W, &err) != PP_OK) {
        for (r = 0; r < p; r++)
            if (W.rc[r] != PP_OK) CHECK(0, "%s: rank %d: %s", where, r, W.msg[r]);
        ok = 0;
    }
    for (l = 0; ok && l < MLP_DEPTH; l++) {
        int s = owner_stage(first, S, l), rank, chunk;
        size_t nw = (size_t)w->dense[l].in * w->dense[l].out, nb = (size_t)w->dense[l].out;
        pp_schedule_stage_rank(&sched, s, &rank, &chunk);
        if (memcmp(W.g[rank].dense[l].w, gref->dense[l].w, nw * sizeof(float)) != 0 ||
            memcmp(W.g[rank].dense[l].b, gref->dense[l].b, nb * sizeof(float)) != 0) {
            CHECK(0, "%s: layer %d (stage %d, rank %d) gradient differs from the reference", where, l, s, rank);
            ok = 0;
        }
    }
    for (r = 0; ok && r < p; r++) {
        hooks* h = &W.h[r];
        CHECK(zb ? W.stats[r].peak_live <= sim->peak_live[r] : W.stats[r].peak_live == sim->peak_live[r], "%s: rank %d peak stash %d, simulator says %d", where, r,
              W.stats[r].peak_live, sim->peak_live[r]);
        CHECK(W.pz[r].unwritten == 0, "%s: rank %d: %d of %d receives left poisoned bytes", where, r, W.pz[r].unwritten,
              W.pz[r].checked);
        CHECK(p == 1 || W.pz[r].checked > 0, "%s: rank %d checked no receive", where, r);
        if (!use_hooks) {
            CHECK(h->allocs == 0 && h->marks_open == 0, "%s: hooks called though none were set", where);
            continue;
        }
        CHECK(h->allocs > 0, "%s: rank %d allocated nothing through the hooks", where, r);
        CHECK(h->allocs == W.allocs_after_first[r], "%s: rank %d allocated %d blocks after the first step (%d then %d)",
              where, r, h->allocs - W.allocs_after_first[r], W.allocs_after_first[r], h->allocs);
        CHECK(h->frees == h->allocs, "%s: rank %d freed %d of %d blocks", where, r, h->frees, h->allocs);
        CHECK(h->zeros == m * v * steps, "%s: rank %d zeroed %d workspaces, expected %d", where, r, h->zeros, m * v * steps);
        CHECK(h->marks_open == sched.per_rank * steps && h->marks_close == h->marks_open && h->bad_marks == 0,
              "%s: rank %d marks %d/%d (bad %d), expected %d", where, r, h->marks_open, h->marks_close, h->bad_marks,
              sched.per_rank * steps);
    }
    for (r = 0; r < p; r++) free(W.gbuf[r]);
    pp_threads_destroy(W.threads);
    free(acts);
    free(sim);
    CHECK(ok, "%s", where);
}

static void test_equal_and_pooled(void) {
    mlp_model w, gref;
    float *wbuf, *gbuf, x[ROWS * IN], loss = 0;
    int32_t y[ROWS];
    pp_batch b;
    pp_error err;
    pp_model model = mlp_model_desc();
    static const int ms[] = {4, 8};
    int mi, kind, p, steps = 3, i;
    memset(&w, 0, sizeof w);
    wbuf = mlp_init(&w, &gref, DIMS, 11, &gbuf);
    mlp_make_data(x, y, ROWS, IN, CLASSES, 3, 4);
    for (mi = 0; mi < 2; mi++) {
        memset(&b, 0, sizeof b);
        b.m = ms[mi];
        b.input.data = x;
        b.input.rows = ROWS;
        b.input.cols = IN;
        b.input.dtype = PP_F32;
        b.targets = y;
        b.target_row_bytes = sizeof(int32_t);
        b.cu_seqlens = CU;
        b.n_seqs = NSEQ;
        b.split = PP_SPLIT_TOKENS;
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        for (i = 0; i < steps; i++) CHECK(pp_sequential_step(&model, &w, &gref, &b, &loss, &err) == PP_OK, "%s", err.msg);
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (p = 1; p <= 4; p *= 2) {
                int v = pp_schedule_size((pp_schedule_kind)kind, p, 1, b.m) ? 1 : 2; /* the kind's own v */
                run_case((pp_schedule_kind)kind, p, v, b.m, 1, &w, &gref, &b, steps);
                if (p == 2) run_case((pp_schedule_kind)kind, p, v, b.m, 0, &w, &gref, &b, steps);
            }
    }
    free(wbuf);
    free(gbuf);
}

static void test_validation(void) {
    mlp_model w, g;
    float *wbuf, *gbuf;
    pp_action acts[64];
    pp_schedule sched;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    hooks h;
    int first[3];
    pp_threads* th = NULL;
    memset(&w, 0, sizeof w);
    memset(&h, 0, sizeof h);
    wbuf = mlp_init(&w, &g, DIMS, 1, &gbuf);
    pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 64, &sched, &err);
    pp_threads_create(2, &th, &err);
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &w;
    d.grads = &g;
    d.schedule = &sched;
    pp_partition_uniform(d.model.n_layers, 2, first, &err);
    d.partition = first;
    d.transport = pp_threads_transport(th, 0);
    d.device.alloc = h_alloc;
    d.device.user = &h;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_INVALID && st == NULL, "alloc without free/zero accepted");
    CHECK(strstr(err.msg, "alloc, free and zero") != NULL, "message: %s", err.msg);
    d.device.free = h_free;
    d.device.zero = h_zero;
    d.shapes = PP_SHAPES_AUTO;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_UNSUPPORTED && st == NULL, "AUTO with device blocks accepted");
    CHECK(strstr(err.msg, "AUTO") != NULL, "message: %s", err.msg);
    d.shapes = PP_SHAPES_PER_MESSAGE;
    CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_UNSUPPORTED && st == NULL, "PER_MESSAGE with device blocks accepted");
    d.shapes = PP_SHAPES_BROADCAST;
    CHECK(pp_stage_create(&d, &st, &err) == PP_OK && st != NULL, "BROADCAST with device blocks refused: %s", err.msg);
    pp_stage_destroy(st);
    CHECK(h.allocs == 0 && h.frees == 0, "create/destroy without a step allocated %d blocks", h.allocs);
    pp_threads_destroy(th);
    free(wbuf);
    free(gbuf);
}

/* The poison check itself can fail: a buffer with one unwritten word is caught. */
static void test_poison_check_fires(void) {
    unsigned char buf[64];
    memset(buf, 0, sizeof buf);
    CHECK(!still_poisoned(buf, sizeof buf), "clean buffer reported poisoned");
    memset(buf + 40, 0xFF, 4);
    CHECK(still_poisoned(buf, sizeof buf), "poisoned word missed");
}

int main(void) {
    test_poison_check_fires();
    test_validation();
    test_equal_and_pooled();
    return TEST_DONE("devops");
}
