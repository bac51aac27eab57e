/* tests/harness.h - what the tests and the benches share, so that each says only what it checks
   (docs/testing.md). All static; include after pipeline.h (and pipeline_cuda.h for the CUDA
   helpers), tests/test.h and examples/mlp.h where the file uses them.

   - hx_world, hx_run: the per-rank world over the threads transport. Fill it (model, weights,
     one gradient struct or one per rank, schedule, partition, batch, a pp_stage_desc template)
     and hx_run(W, p, err) runs p threads; each makes its stage from the world, steps it
     W->steps times and records its result, message and last stats. Hooks change a rank's desc
     (a transport wrapper, device ops), its batch per step (hx_steps: one batch per step) or
     record each step (hx_timing: benches' step times and losses).
   - hx_stages: stages made beforehand, one per rank, stepped together (hx_cuda_step on a
     pp_cuda world).
   - hx_sched (hx_sched_make, hx_sched_simulate), hx_stage_desc, the batches (hx_dense_batch,
     hx_packed_batch, hx_token_batch, hx_hide_meta).
   - hx_poison_transport: poisons every receive buffer before the receive is posted and counts,
     when the wait returns, the receives that left a byte unwritten (hx_cuda_poison_transport:
     device buffers, on the rank's stream).
   - With tests/test.h: hx_report, hx_loss_matches, hx_check_peak_poison. With examples/mlp.h:
     the tests' MLP (HX_DIMS), hx_mlp (weights, data, the sequential reference), per-rank
     gradients (hx_mlp_world) and hx_mlp_grads_match.
   - Benches: hx_median, hx_worst_median, hx_arg_int; with <mpi.h>, hx_quiet_barrier.
   Negative control: -DHX_NEGATIVE_CONTROL makes every rank of an hx_world leave out its last
   step; the tests that compare with the reference then fail. */
#ifndef PP_TESTS_HARNESS_H
#define PP_TESTS_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on the monotonic clock (the tests' own, so that a test linked against the shared
   implementation object needs none of its private functions). */
static inline double hx_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a schedule in its own memory ------------------------------------------------------------ */
typedef struct hx_sched {
    pp_schedule s;
    pp_action* acts;
    pp_sim_result* sim;         /* hx_sched_simulate's, or NULL */
} hx_sched;

static inline pp_result hx_sched_make_cost(hx_sched* h, pp_schedule_kind k, int p, int v, int m, const pp_sim_cost* cost,
                                           pp_error* err) {
    size_t n = pp_schedule_size(k, p, v, m);
    pp_result rc;
    memset(h, 0, sizeof *h);
    if (!(h->acts = (pp_action*)malloc((n ? n : 1) * sizeof *h->acts))) {
        if (err) snprintf(err->msg, sizeof err->msg, "out of memory for %lu actions", (unsigned long)n);
        return PP_ERR_NOMEM;
    }
    if ((rc = pp_schedule_make_cost(k, p, v, m, cost, h->acts, n, &h->s, err)) != PP_OK) {
        free(h->acts);
        h->acts = NULL;
    }
    return rc;
}

static inline pp_result hx_sched_make(hx_sched* h, pp_schedule_kind k, int p, int v, int m, pp_error* err) {
    return hx_sched_make_cost(h, k, p, v, m, NULL, err);
}

/* hx_sched_make, then the simulator with zero costs (its per-rank peak stash is in h->sim). */
static inline pp_result hx_sched_simulate(hx_sched* h, pp_schedule_kind k, int p, int v, int m, pp_error* err) {
    pp_sim_cost cost;
    pp_result rc = hx_sched_make(h, k, p, v, m, err);
    if (rc != PP_OK) return rc;
    memset(&cost, 0, sizeof cost);
    if (!(h->sim = (pp_sim_result*)calloc(1, sizeof *h->sim))) return PP_ERR_NOMEM;
    return pp_simulate(&h->s, &cost, h->sim, NULL, err);
}

static inline void hx_sched_free(hx_sched* h) {
    free(h->acts);
    free(h->sim);
    h->acts = NULL;
    h->sim = NULL;
}

/* The simulator keeps a stash until W; a fused model (no weight_grad) frees it at B, so on the
   zero-bubble kinds the simulator's peak is an upper bound of the executor's, else its value. */
static inline int hx_peak_agrees(pp_schedule_kind k, int executor, int simulator) {
    int w_kinds = k == PP_SCHED_ZB_H1 || k == PP_SCHED_ZB_V || k == PP_SCHED_ZB_H2 || k == PP_SCHED_V_HALF ||
                  k == PP_SCHED_V_MIN || k == PP_SCHED_DUALPIPE_V; /* W actions: a fused model frees the stash at B */
    return w_kinds ? executor <= simulator : executor == simulator;
}

/* ---- a dense batch: x (rows, cols) floats, y (rows) int32 targets, m micro-batches ----------- */
static inline void hx_dense_batch(pp_batch* b, const float* x, const int32_t* y, int rows, int cols, int m) {
    memset(b, 0, sizeof *b);
    b->m = m;
    b->input.data = (void*)(uintptr_t)x;
    b->input.rows = rows;
    b->input.cols = cols;
    b->input.dtype = PP_F32;
    b->targets = y;
    b->target_row_bytes = sizeof(int32_t);
}

/* A packed batch: n_seqs sequences, sequence i the rows [cu[i], cu[i+1]) of x and y. */
static inline void hx_packed_batch(pp_batch* b, const float* x, const int32_t* y, const int32_t* cu, int n_seqs, int cols,
                                   int m, pp_split_policy split) {
    hx_dense_batch(b, x, y, cu[n_seqs], cols, m);
    b->cu_seqlens = cu;
    b->n_seqs = n_seqs;
    b->split = split;
}

/* A packed batch of tokens: int32 ids tok and targets tgt, one per row. */
static inline void hx_token_batch(pp_batch* b, const int32_t* tok, const int32_t* tgt, const int32_t* cu, int n_seqs, int m,
                                  pp_split_policy split) {
    hx_packed_batch(b, NULL, tgt, cu, n_seqs, 1, m, split);
    b->input.data = (void*)(uintptr_t)tok;
    b->input.dtype = PP_I32;
}

/* n_seqs packed token sequences, sequence s of 3 + (5 s mod 10) tokens, token j (7 s + 3 j) mod
   vocab, each target the next token (-1 at a sequence's end), into tok, tgt and cu (n_seqs + 1
   bounds); returns the rows (at most 12 n_seqs). */
static inline int hx_token_seqs(int32_t* tok, int32_t* tgt, int32_t* cu, int n_seqs, int vocab) {
    int s, j, n = 0;
    cu[0] = 0;
    for (s = 0; s < n_seqs; s++) {
        int len = 3 + (s * 5) % 10;
        for (j = 0; j < len; j++) {
            tok[n + j] = (s * 7 + j * 3) % vocab;
            tgt[n + j] = j + 1 < len ? (s * 7 + (j + 1) * 3) % vocab : -1;
        }
        n += len;
        cu[s + 1] = n;
    }
    return n;
}

/* 1 when a[0..n) are all zero. */
static inline int hx_all_zero(const float* a, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (a[i] != 0.0f) return 0;
    return 1;
}

/* The batch a rank without the first stage sees under PP_SHAPES_BROADCAST: no input rows, no
   cu_seqlens (it learns them from the first stage's rank). */
static inline void hx_hide_meta(pp_batch* b) {
    b->input.data = NULL;
    b->input.rows = 0;
    b->cu_seqlens = NULL;
    b->n_seqs = 0;
}

/* ---- a rank's desc ---------------------------------------------------------------------------- */
/* d from tmpl (or zeroed where tmpl is NULL: the caller adds timeouts, shapes, device ops), then
   what every stage needs. */
static inline void hx_stage_desc(pp_stage_desc* d, const pp_stage_desc* tmpl, pp_model model, const void* w, void* g,
                                 const pp_schedule* s, const int* first, int rank, pp_transport t) {
    if (tmpl) *d = *tmpl;
    else memset(d, 0, sizeof *d);
    d->model = model;
    d->weights = w;
    d->grads = g;
    d->schedule = s;
    d->partition = first;
    d->rank = rank;
    d->transport = t;
}

/* A pp_pipeline desc with what every test's pipeline needs (and a 20 s timeout, so a hang
   fails the test): the caller sets the rest (partition, shapes, rank_setup, ...). */
static inline void hx_pipeline_desc(pp_pipeline_desc* d, pp_model model, const void* w, void* g, pp_schedule_kind kind,
                                    int p, int v, int m) {
    memset(d, 0, sizeof *d);
    d->model = model;
    d->weights = w;
    d->grads = g;
    d->schedule = kind;
    d->p = p, d->v = v, d->m = m; /* ranks, chunks a rank, micro-batches */
    d->stage.timeout_s = 20;
}

/* ---- the per-rank world ---------------------------------------------------------------------- */
typedef struct hx_world hx_world;
struct hx_world {
    pp_model model;
    const void* w;              /* the weights every rank reads */
    void* grads;                /* the gradients every rank adds into, or NULL: g[rank] */
    void* g[PP_MAX_RANKS];
    const pp_schedule* sched;
    const int* first;           /* partition, first[n_stages + 1] */
    pp_threads* threads;        /* NULL: hx_run makes one for the run */
    pp_stage_desc stage;        /* what every rank's desc starts from (timeout_s, shapes, ...) */
    const pp_batch* batch;      /* every step's batch, unless batch_of says otherwise */
    int steps;                  /* pp_stage_step calls per rank (0: 1) */
    /* Optional, called on the rank's thread: change the rank's desc before its stage is made;
       the batch of step i (tmp is the rank's scratch); after every step that returned PP_OK. */
    void (*setup)(hx_world* W, int rank, pp_stage_desc* d);
    const pp_batch* (*batch_of)(hx_world* W, int rank, int step, pp_batch* tmp);
    void (*after_step)(hx_world* W, int rank, int step, const pp_step_stats* s);
    void* user;
    /* what each rank returned: its result, its message ("" when PP_OK), the last step's stats */
    pp_result rc[PP_MAX_RANKS];
    char msg[PP_MAX_RANKS][640];
    pp_step_stats stats[PP_MAX_RANKS];
};

static inline pp_result hx_rank_main(int rank, void* user) {
    hx_world* W = (hx_world*)user;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    pp_result rc;
    int i, steps = W->steps > 0 ? W->steps : 1;
#ifdef HX_NEGATIVE_CONTROL
    steps--; /* every rank leaves out its last step: the checks against the reference must fail */
#endif
    hx_stage_desc(&d, &W->stage, W->model, W->w, W->grads ? W->grads : W->g[rank], W->sched, W->first, rank,
                  pp_threads_transport(W->threads, rank));
    if (W->setup) W->setup(W, rank, &d);
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        snprintf(W->msg[rank], sizeof W->msg[rank], "%s", err.msg);
        return W->rc[rank] = rc;
    }
    for (i = 0; i < steps && rc == PP_OK; i++) {
        pp_batch tmp;
        const pp_batch* b = W->batch_of ? W->batch_of(W, rank, i, &tmp) : W->batch;
        if ((rc = pp_stage_step(st, b, &W->stats[rank])) != PP_OK)
            snprintf(W->msg[rank], sizeof W->msg[rank], "step %d: %s", i, pp_stage_error(st));
        else if (W->after_step)
            W->after_step(W, rank, i, &W->stats[rank]);
    }
    pp_stage_destroy(st);
    return W->rc[rank] = rc;
}

/* Per-step figures of a timed run: W->after_step = hx_time_step, W->user = the hx_timing. */
typedef struct hx_timing {
    int steps;
    double* t;                          /* [rank][steps]: each rank's step time (s) */
    float* loss;                        /* [steps]: the loss of each step */
    int peak_live[PP_MAX_RANKS];        /* the most over the steps */
    size_t peak_stash[PP_MAX_RANKS];
} hx_timing;

static inline pp_result hx_timing_init(hx_timing* T, int p, int steps) {
    memset(T, 0, sizeof *T);
    T->steps = steps;
    T->t = (double*)calloc((size_t)p * (size_t)steps, sizeof(double));
    T->loss = (float*)calloc((size_t)steps, sizeof(float));
    return T->t && T->loss ? PP_OK : PP_ERR_NOMEM;
}

static inline void hx_timing_free(hx_timing* T) {
    free(T->t);
    free(T->loss);
    T->t = NULL;
    T->loss = NULL;
}

static inline void hx_timing_record(hx_timing* T, int rank, int step, const pp_step_stats* s) {
    T->t[rank * T->steps + step] = s->t_total;
    if (s->has_loss) T->loss[step] = s->loss;
    if (s->peak_live > T->peak_live[rank]) T->peak_live[rank] = s->peak_live;
    if (s->peak_stash_bytes > T->peak_stash[rank]) T->peak_stash[rank] = s->peak_stash_bytes;
}

static inline void hx_time_step(hx_world* W, int rank, int step, const pp_step_stats* s) {
    hx_timing_record((hx_timing*)W->user, rank, step, s);
}

/* W zeroed, then model m with weights w and one gradient struct g (every rank adds into it) on
   schedule s and partition first, `steps` steps of b, each rank's step times and stats recorded
   in T (initialised here: hx_timing_free it). Change W->stage before hx_run. */
static inline pp_result hx_timed_world(hx_world* W, pp_model m, const void* w, void* g, const pp_schedule* s,
                                       const int* first, const pp_batch* b, int steps, hx_timing* T) {
    memset(W, 0, sizeof *W);
    W->model = m;
    W->w = w;
    W->grads = g;
    W->sched = s;
    W->first = first;
    W->batch = b;
    W->steps = steps;
    W->after_step = hx_time_step;
    W->user = T;
    return hx_timing_init(T, s->p, steps);
}

/* A different batch each step, and each step's stats: hx_world_steps(W, S) sets W's hooks. */
typedef struct hx_steps {
    const pp_batch* first;      /* step i's batch is at (const char*)first + i * stride */
    size_t stride;
    int hide_meta;              /* ranks without stage 0 see no rows, no cu_seqlens (BROADCAST) */
    pp_step_stats* stats;       /* [rank * W->steps + step], or NULL */
    hx_timing* timing;          /* or NULL */
} hx_steps;

static inline const pp_batch* hx_steps_batch(hx_world* W, int rank, int step, pp_batch* tmp) {
    hx_steps* S = (hx_steps*)W->user;
    *tmp = *(const pp_batch*)(const void*)((const char*)S->first + (size_t)step * S->stride);
    if (S->hide_meta && pp_schedule_rank_to_stage(W->sched, rank, 0) != 0) hx_hide_meta(tmp);
    return tmp;
}

static inline void hx_steps_stats(hx_world* W, int rank, int step, const pp_step_stats* s) {
    hx_steps* S = (hx_steps*)W->user;
    if (S->stats) S->stats[rank * W->steps + step] = *s;
    if (S->timing) hx_timing_record(S->timing, rank, step, s);
}

static inline void hx_world_steps(hx_world* W, hx_steps* S, int n_steps) {
    W->steps = n_steps;
    W->batch_of = hx_steps_batch;
    W->after_step = hx_steps_stats;
    W->user = S;
}

/* Runs every rank of the world on p threads: PP_OK when every rank returned PP_OK. */
static inline pp_result hx_run(hx_world* W, int p, pp_error* err) {
    int own = W->threads == NULL;
    pp_result rc;
    if (own && (rc = pp_threads_create(p, &W->threads, err)) != PP_OK) return rc;
    rc = pp_threads_run(p, hx_rank_main, W, err);
    if (own) {
        pp_threads_destroy(W->threads);
        W->threads = NULL;
    }
    return rc;
}

/* ---- stages made beforehand, stepped together ------------------------------------------------ */
typedef struct hx_stages hx_stages;
struct hx_stages {
    int p;
    pp_stage* st[PP_MAX_RANKS];
    const pp_batch* batch;                  /* every rank's batch, or batch_of[rank] */
    const pp_batch* batch_of[PP_MAX_RANKS];
    pp_result (*before)(hx_stages* S, int rank); /* optional: e.g. bind the rank's device */
    void* user;
    int keep_stats;                         /* 1: stats[rank] gets each step's stats */
    pp_result rc[PP_MAX_RANKS];
    char msg[PP_MAX_RANKS][640];
    pp_step_stats stats[PP_MAX_RANKS];
    double t0, t_ret[PP_MAX_RANKS];         /* seconds from hx_stages_step's start to each return */
};

static inline pp_result hx_stages_rank(int rank, void* user) {
    hx_stages* S = (hx_stages*)user;
    const pp_batch* b = S->batch_of[rank] ? S->batch_of[rank] : S->batch;
    pp_result rc = S->before ? S->before(S, rank) : PP_OK;
    if (rc == PP_OK) rc = pp_stage_step(S->st[rank], b, S->keep_stats ? &S->stats[rank] : NULL);
    S->t_ret[rank] = hx_now() - S->t0;
    snprintf(S->msg[rank], sizeof S->msg[rank], "%s", pp_stage_error(S->st[rank]));
    return S->rc[rank] = rc;
}

/* One step of every rank's stage on S->p threads: PP_OK when every rank returned PP_OK. */
static inline pp_result hx_stages_step(hx_stages* S, pp_error* err) {
    S->t0 = hx_now();
    return pp_threads_run(S->p, hx_stages_rank, S, err);
}

static inline void hx_stages_destroy(hx_stages* S) {
    int r;
    for (r = 0; r < S->p; r++) {
        pp_stage_destroy(S->st[r]);
        S->st[r] = NULL;
    }
}

/* ---- a poisoning transport wrapper ----------------------------------------------------------- */
/* ---- a wrapped transport's functions, forwarded ------------------------------------------------
   A wrapper whose struct begins with the transport it wraps (pp_transport inner, its first
   member, as hx_poison's) keeps these for the functions it does not change: each calls inner's
   with inner's self. */
static inline pp_result hx_fw_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    const pp_transport* in = (const pp_transport*)self;
    return in->wait(in->self, req, timeout_s, err);
}
static inline pp_result hx_fw_test(void* self, pp_request* req, int* done) {
    const pp_transport* in = (const pp_transport*)self;
    return in->test(in->self, req, done);
}
static inline void hx_fw_abort(void* self, pp_result why, const char* msg) {
    const pp_transport* in = (const pp_transport*)self;
    in->abort(in->self, why, msg);
}
static inline pp_result hx_fw_cancel(void* self, pp_request* req) {
    const pp_transport* in = (const pp_transport*)self;
    return in->cancel(in->self, req);
}
static inline void hx_fw_flight_note(void* self, const pp_flight_entry* e) {
    const pp_transport* in = (const pp_transport*)self;
    in->flight_note(in->self, e);
}
static inline int hx_fw_flight_get(void* self, int peer, pp_flight* out) {
    const pp_transport* in = (const pp_transport*)self;
    return in->flight_get(in->self, peer, out);
}
static inline int hx_fw_abort_reason(void* self, char* buf, size_t n) {
    const pp_transport* in = (const pp_transport*)self;
    return in->abort_reason(in->self, buf, n);
}

/* Every receive buffer is filled with 0xFF bytes before the receive is posted (a NaN pattern no
   layer writes); when its wait returns PP_OK, a 32-bit word still 0xFFFFFFFF counts the receive
   as unwritten. Host buffers by default; fill and read (both or neither) reach other memory:
   fill returns 1 when it poisoned buf, 0 for a buffer it leaves alone, -1 on an error; read
   copies the bytes to the host (0 on an error). */
#define HX_POISON_MAX 64
typedef struct hx_poison {
    pp_transport inner;
    int (*fill)(void* ctx, void* buf, size_t bytes);
    int (*read)(void* ctx, void* host, const void* buf, size_t bytes);
    void* ctx;
    const pp_request* req[HX_POISON_MAX];
    unsigned char* buf[HX_POISON_MAX];
    size_t bytes[HX_POISON_MAX];
    int unwritten;      /* receives that completed with a byte still poisoned */
    int checked;
    int errors;         /* fill or read failed */
} hx_poison;

/* 1 if any aligned 32-bit word of buf still holds the poison. */
static inline int hx_still_poisoned(const unsigned char* buf, size_t bytes) {
    size_t i;
    for (i = 0; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, buf + i, 4);
        if (w == 0xFFFFFFFFu) return 1;
    }
    return 0;
}

static inline pp_result hx_pz_isend(void* self, int peer, int tag, const void* buf, size_t bytes, pp_request* req) {
    hx_poison* p = (hx_poison*)self;
    return p->inner.isend(p->inner.self, peer, tag, buf, bytes, req);
}
static inline pp_result hx_pz_irecv(void* self, int peer, int tag, void* buf, size_t bytes, pp_request* req) {
    hx_poison* p = (hx_poison*)self;
    int i;
    if (p->fill) {
        int f = p->fill(p->ctx, buf, bytes);
        if (f == 0) return p->inner.irecv(p->inner.self, peer, tag, buf, bytes, req);
        p->errors += f < 0;
    } else {
        memset(buf, 0xFF, bytes);
    }
    for (i = 0; i < HX_POISON_MAX; i++)
        if (!p->req[i]) {
            p->req[i] = req;
            p->buf[i] = (unsigned char*)buf;
            p->bytes[i] = bytes;
            break;
        }
    return p->inner.irecv(p->inner.self, peer, tag, buf, bytes, req);
}
static inline pp_result hx_pz_wait(void* self, pp_request* req, double timeout_s, pp_error* err) {
    hx_poison* p = (hx_poison*)self;
    pp_result rc = p->inner.wait(p->inner.self, req, timeout_s, err);
    int i;
    for (i = 0; i < HX_POISON_MAX; i++)
        if (p->req[i] == req) {
            p->req[i] = NULL;
            if (rc != PP_OK) break;
            if (p->read) {
                unsigned char* h = (unsigned char*)malloc(p->bytes[i] + 1);
                if (!h || !p->read(p->ctx, h, p->buf[i], p->bytes[i])) {
                    p->errors++;
                    free(h);
                    break;
                }
                p->unwritten += hx_still_poisoned(h, p->bytes[i]);
                free(h);
            } else {
                p->unwritten += hx_still_poisoned(p->buf[i], p->bytes[i]);
            }
            p->checked++;
            break;
        }
    return rc;
}
static inline pp_result hx_pz_cancel(void* self, pp_request* req) {
    hx_poison* p = (hx_poison*)self;
    int i;
    for (i = 0; i < HX_POISON_MAX; i++)
        if (p->req[i] == req) p->req[i] = NULL; /* withdrawn: nothing to check */
    return p->inner.cancel(p->inner.self, req);
}

/* inner wrapped by p (zeroed first; set fill, read and ctx afterwards, before the first receive). */
static inline pp_transport hx_poison_transport(hx_poison* p, pp_transport inner) {
    pp_transport t = inner;
    memset(p, 0, sizeof *p);
    p->inner = inner;
    t.self = p;
    t.isend = hx_pz_isend;
    t.irecv = hx_pz_irecv;
    t.wait = hx_pz_wait;
    t.test = inner.test ? hx_fw_test : NULL;
    t.abort = inner.abort ? hx_fw_abort : NULL;
    t.cancel = inner.cancel ? hx_pz_cancel : NULL;
    t.flight_note = inner.flight_note ? hx_fw_flight_note : NULL;
    t.flight_get = inner.flight_get ? hx_fw_flight_get : NULL;
    t.abort_reason = inner.abort_reason ? hx_fw_abort_reason : NULL;
    t.iallreduce_sum = NULL; /* not forwarded: it would reach inner's function with our self */
    return t;
}

#ifdef PIPELINE_CUDA_H
/* Device buffers are poisoned on the rank's stream (ctx: its cudaStream_t), so the fill is
   ordered before the incoming copy; host ones (BROADCAST metadata) are not checked. */
static inline int hx_cuda_poison_fill(void* ctx, void* buf, size_t bytes) {
    struct cudaPointerAttributes at;
    memset(&at, 0, sizeof at);
    if (cudaPointerGetAttributes(&at, buf) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged) return 0;
    return cudaMemsetAsync(buf, 0xFF, bytes, *(cudaStream_t*)ctx) == cudaSuccess ? 1 : -1;
}

/* The rank's stream waits on the copy: synchronising it shows what arrived. */
static inline int hx_cuda_poison_read(void* ctx, void* host, const void* buf, size_t bytes) {
    return cudaStreamSynchronize(*(cudaStream_t*)ctx) == cudaSuccess &&
           cudaMemcpy(host, buf, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
}

/* Rank r's desc on the pp_cuda world c: its transport and device ops, and its stream (*stream,
   which must outlive the stage) as the layers' context. */
static inline void hx_cuda_stage_desc(pp_stage_desc* d, pp_cuda* c, int r, pp_model model, const void* w, void* g,
                                      const pp_schedule* s, const int* first, cudaStream_t* stream) {
    *stream = pp_cuda_stream(c, r);
    hx_stage_desc(d, NULL, model, w, g, s, first, r, pp_cuda_transport(c, r));
    d->device = pp_cuda_device_ops(c, r);
    d->layer_ctx = stream;
}

/* Stages on a pp_cuda world (S->user): each rank binds its device before its step. */
static inline pp_result hx_cuda_bind(hx_stages* S, int rank) {
    pp_error err;
    return pp_cuda_bind((pp_cuda*)S->user, rank, &err);
}

/* One step of the stages on the pp_cuda world S->user, between pp_cuda_step_begin and _end
   (info may be NULL). */
static inline pp_result hx_cuda_step(hx_stages* S, pp_cuda_step_info* info, pp_error* err) {
    pp_cuda* c = (pp_cuda*)S->user;
    pp_result rc;
    S->before = hx_cuda_bind;
    if ((rc = pp_cuda_step_begin(c, err)) != PP_OK || (rc = hx_stages_step(S, err)) != PP_OK) return rc;
    return pp_cuda_step_end(c, info, err);
}

/* inner wrapped by p, poisoning device receive buffers on *stream (which must outlive p). */
static inline pp_transport hx_cuda_poison_transport(hx_poison* p, pp_transport inner, cudaStream_t* stream) {
    pp_transport t = hx_poison_transport(p, inner);
    p->fill = hx_cuda_poison_fill;
    p->read = hx_cuda_poison_read;
    p->ctx = stream;
    return t;
}
#endif

/* ---- benches --------------------------------------------------------------------------------- */
/* Every failed rank's message, on stderr. */
static inline void hx_print_errors(const hx_world* W, int p) {
    int r;
    for (r = 0; r < p; r++)
        if (W->rc[r] != PP_OK) fprintf(stderr, "rank %d: %s\n", r, W->msg[r]);
}

static inline int hx_cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v). */
static inline double hx_median(double* v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, hx_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over steps [warm, T->steps) of the slowest of p ranks' step time. */
static inline double hx_worst_median(const hx_timing* T, int p, int warm) {
    int n = T->steps - warm, i, r;
    double* worst = (double*)calloc(n > 0 ? (size_t)n : 1, sizeof(double)), t;
    if (!worst) return 0;
    for (i = 0; i < n; i++)
        for (r = 0; r < p; r++)
            if (T->t[r * T->steps + warm + i] > worst[i]) worst[i] = T->t[r * T->steps + warm + i];
    t = hx_median(worst, n);
    free(worst);
    return t;
}

/* The integer after the argument `name`, or def. */
static inline int hx_arg_int(int argc, char** argv, const char* name, int def) {
    int i;
    for (i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return def;
}

/* ---- with tests/test.h ----------------------------------------------------------------------- */
#ifdef PP_TEST_H
/* A failed CHECK naming `where` for every rank of the world that did not return PP_OK. */
static inline void hx_report(const hx_world* W, int p, const char* where) {
    int r;
    for (r = 0; r < p; r++)
        if (W->rc[r] != PP_OK) CHECK(0, "%s: rank %d: %s (%s)", where, r, W->msg[r], pp_result_str(W->rc[r]));
}

/* Rank r's peak stash agrees with the simulator's, and its poisoned receives were all written
   (and some checked, with more than one rank). */
static inline void hx_check_peak_poison(const hx_sched* sc, pp_schedule_kind k, int r, int peak, const hx_poison* pz,
                                        const char* where) {
    CHECK(hx_peak_agrees(k, peak, sc->sim->peak_live[r]), "%s: rank %d peak stash %d, simulator says %d", where, r, peak,
          sc->sim->peak_live[r]);
    CHECK(pz->unwritten == 0 && pz->errors == 0, "%s: rank %d: %d of %d receives left poisoned bytes (%d errors)", where,
          r, pz->unwritten, pz->checked, pz->errors);
    CHECK(sc->s.p == 1 || pz->checked > 0, "%s: rank %d checked no receive", where, r);
}

/* The loss: only the rank of the last stage has one, and it equals ref bit for bit. */
static inline int hx_loss_matches(const pp_step_stats* stats, int p, const pp_schedule* s, float ref, const char* where) {
    int last, chunk, r, ok = 1;
    pp_schedule_stage_to_rank(s, s->n_stages - 1, &last, &chunk);
    if (!stats[last].has_loss || memcmp(&stats[last].loss, &ref, sizeof(float)) != 0) {
        CHECK(0, "%s: loss %.9g != reference %.9g", where, stats[last].loss, ref);
        ok = 0;
    }
    for (r = 0; r < p; r++)
        if (r != last && stats[r].has_loss) {
            CHECK(0, "%s: rank %d claims a loss", where, r);
            ok = 0;
        }
    return ok;
}
#endif

/* ---- with <mpi.h> (include it first) ----------------------------------------------------------- */
#ifdef MPI_VERSION
#include <time.h>
/* A barrier over MPI_COMM_WORLD whose waiters sleep (200 us between polls) instead of spinning,
   so the ranks still computing (or one computing alone) get the cores: benches run more ranks
   than this machine has cores. */
static inline void hx_quiet_barrier(void) {
    MPI_Request r;
    int done = 0;
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = 200000;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    for (;;) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (done) break;
        nanosleep(&ts, NULL);
    }
}
#endif

/* ---- with examples/mlp.h --------------------------------------------------------------------- */
#ifdef PP_EXAMPLE_MLP_H
/* The tests' MLP (examples/mlp.h's default depth): HX_IN inputs, ten dense layers of 6 to 9
   units, HX_CLASSES classes. static const int DIMS[MLP_DEPTH + 1] = HX_DIMS; */
#define HX_IN 6
#define HX_CLASSES 5
#define HX_DIMS {HX_IN, 8, 7, 8, 9, 8, 6, 8, 8, 7, 8, HX_CLASSES}

/* p gradient structs of the MLP with dims, each with its own zeroed buffer gbuf[r] (free them). */
static inline void hx_mlp_rank_grads(mlp_model* g, float** gbuf, int p, const int* dims) {
    int r;
    for (r = 0; r < p; r++) {
        mlp_model unused;
        memset(&g[r], 0, sizeof g[r]);
        free(mlp_init(&unused, &g[r], dims, 1, &gbuf[r]));
    }
}

/* The MLP with dims, its reference gradient, and rows of data: what most tests start from. */
typedef struct hx_mlp {
    pp_model model;
    mlp_model w, gref;      /* the weights; the reference gradient (hx_mlp_reference) */
    float *wbuf, *gbuf;     /* their buffers, n_params floats each */
    size_t n_params;
    float* x;               /* (rows, dims[0]) */
    int32_t* y;             /* (rows): classes in [0, dims[MLP_DEPTH]) */
    float loss;             /* the reference's last step */
} hx_mlp;

/* Weights drawn from wseed; x and y from mlp_make_data(dseed, teacher). 0 when out of memory. */
static inline int hx_mlp_init(hx_mlp* f, const int* dims, uint64_t wseed, int rows, uint64_t dseed, uint64_t teacher) {
    memset(f, 0, sizeof *f);
    f->model = mlp_model_desc();
    f->wbuf = mlp_init(&f->w, &f->gref, dims, wseed, &f->gbuf);
    f->n_params = mlp_param_count(dims);
    f->x = (float*)malloc(sizeof(float) * (size_t)rows * (size_t)dims[0]);
    f->y = (int32_t*)malloc(sizeof(int32_t) * (size_t)rows);
    if (!f->wbuf || !f->x || !f->y) return 0;
    mlp_make_data(f->x, f->y, rows, dims[0], dims[MLP_DEPTH], dseed, teacher);
    return 1;
}

/* gref = the gradient of `steps` sequential steps of b from zero; f->loss the last step's. */
static inline pp_result hx_mlp_reference(hx_mlp* f, const pp_batch* b, int steps, pp_error* err) {
    pp_result rc = PP_OK;
    int i;
    memset(f->gbuf, 0, f->n_params * sizeof(float));
    for (i = 0; i < steps && rc == PP_OK; i++) rc = pp_sequential_step(&f->model, &f->w, &f->gref, b, &f->loss, err);
    return rc;
}

/* 1 if the gradients the p ranks left in gbuf[r] (each rank only its own layers, the rest zero)
   sum to one sequential step of b on weights w (drawn from dims and wseed, as w was), 0 if not,
   -1 (err says why) if the sequential step failed. */
static inline int hx_mlp_sum_is_reference(const mlp_model* w, const int* dims, uint64_t wseed, const pp_batch* b,
                                          float* const* gbuf, int p, pp_error* err) {
    mlp_model wref, g;
    float* gb = NULL;
    float* wb = mlp_init(&wref, &g, dims, wseed, &gb); /* g: the layout, over zeroed gb */
    pp_model model = mlp_model_desc();
    float loss;
    size_t n = mlp_param_count(dims), i;
    int r, same = -1;
    float* sum = (float*)calloc(n, sizeof(float));
    if (pp_sequential_step(&model, w, &g, b, &loss, err) == PP_OK) {
        for (r = 0; r < p; r++)
            for (i = 0; i < n; i++) sum[i] += gbuf[r][i];
        same = memcmp(sum, gb, n * sizeof(float)) == 0;
    }
    free(sum);
    free(gb);
    free(wb);
    return same;
}

static inline void hx_mlp_free(hx_mlp* f) {
    free(f->wbuf);
    free(f->gbuf);
    free(f->x);
    free(f->y);
}

static inline void hx_mlp_free_grads(float** gbuf, int p) {
    int r;
    for (r = 0; r < p; r++) free(gbuf[r]);
}

/* W zeroed, then: the MLP with weights w on schedule s (its p ranks) and partition first, `steps`
   steps of b, 20 s deadlines, and each rank its own zeroed gradients g[r] (buffers gbuf[r]:
   hx_mlp_free_grads them). */
static inline void hx_mlp_world(hx_world* W, const mlp_model* w, const pp_schedule* s, const int* first, const pp_batch* b,
                                int steps, mlp_model* g, float** gbuf, const int* dims) {
    int r;
    memset(W, 0, sizeof *W);
    W->model = mlp_model_desc();
    W->w = w;
    W->sched = s;
    W->first = first;
    W->batch = b;
    W->steps = steps;
    W->stage.timeout_s = 20;
    hx_mlp_rank_grads(g, gbuf, s->p, dims);
    for (r = 0; r < s->p; r++) W->g[r] = &g[r];
}

/* Which rank owns dense layer l, and which stage; -1 when no stage does. */
static inline int hx_layer_owner(const pp_schedule* s, const int* first, int l, int* stage) {
    int st, rank = -1, chunk;
    for (st = 0; st < s->n_stages; st++)
        if (l >= first[st] && l < first[st + 1]) break;
    *stage = st;
    if (st < s->n_stages) pp_schedule_stage_to_rank(s, st, &rank, &chunk);
    return rank;
}

/* 1 when dense layer l of a and b holds the same bits. */
static inline int hx_mlp_layer_equal(const mlp_model* a, const mlp_model* b, int l) {
    size_t nw = (size_t)b->dense[l].in * b->dense[l].out * sizeof(float), nb = (size_t)b->dense[l].out * sizeof(float);
    return memcmp(a->dense[l].w, b->dense[l].w, nw) == 0 && memcmp(a->dense[l].b, b->dense[l].b, nb) == 0;
}

#ifdef PP_TEST_H
/* Runs W on p ranks with each rank its own zeroed MLP gradients g[r] (buffers gbuf[r]:
   hx_mlp_free_grads them), seen through the split model's struct gz[r] where split is set (W's
   model is then a PP_MODEL_SPLIT of the MLP's layout); a failure is reported (hx_report) as
   `what`. 1 when every rank returned PP_OK. */
static inline int hx_mlp_run(hx_world* W, int p, int split, mlp_model* g, mlpz_model* gz, float** gbuf, const int* dims,
                             const char* what) {
    pp_error err;
    int r;
    hx_mlp_rank_grads(g, gbuf, p, dims);
    for (r = 0; r < p; r++) {
        mlpz_from_mlp(&gz[r], &g[r]);
        W->g[r] = split ? (void*)&gz[r] : (void*)&g[r];
    }
    if (hx_run(W, p, &err) == PP_OK) return 1;
    hx_report(W, p, what);
    return 0;
}

/* Every dense layer's gradient on the rank that owns it (g[rank], one struct per rank) equals the
   reference's bit for bit; with others_zero, every other rank left that layer untouched (zero).
   A failed CHECK names the layer, its stage and rank; returns 1 when all hold. */
static inline int hx_mlp_grads_match(const mlp_model* g, int p, const pp_schedule* s, const int* first, const mlp_model* ref,
                              int others_zero, const char* where) {
    int l, r, ok = 1;
    for (l = 0; l < MLP_DEPTH; l++) {
        int st, rank = hx_layer_owner(s, first, l, &st);
        size_t nw = (size_t)ref->dense[l].in * ref->dense[l].out, nb = (size_t)ref->dense[l].out;
        if (rank < 0 || !hx_mlp_layer_equal(&g[rank], ref, l)) {
            CHECK(0, "%s: layer %d (stage %d, rank %d) gradient differs from the reference", where, l, st, rank);
            ok = 0;
            continue;
        }
        for (r = 0; others_zero && r < p; r++)
            if (r != rank && (!hx_all_zero(g[r].dense[l].w, nw) || !hx_all_zero(g[r].dense[l].b, nb))) {
                CHECK(0, "%s: rank %d wrote gradients of layer %d, which rank %d owns", where, r, l, rank);
                ok = 0;
            }
    }
    return ok;
}

#endif
#endif

/* ---- a rank of an NCCL world (tests over pipeline_nccl.h) ------------------------------------- */
#if defined(PIPELINE_NCCL_H) && defined(PIPELINE_CUDA_H)
/* World rank r of n: its device (r modulo the devices there are, into *dev, which pp_cuda keeps
   pointing at), the world communicator from id (pp_nccl_comm_init, non-blocking) and a one-rank
   pp_cuda bound to that device (the compute stream, the device block pool). */
static inline pp_result hx_nccl_rank(int r, int n, const ncclUniqueId* id, double timeout_s, int* dev, ncclComm_t* comm,
                                     pp_cuda** c, pp_error* err) {
    pp_launch L;
    pp_cuda_desc cd;
    int ndev = 1;
    pp_result rc;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) ndev = 1;
    *dev = r % ndev;
    memset(&L, 0, sizeof L);
    L.rank = r;
    L.world = n;
    L.local_rank = r;
    memset(&cd, 0, sizeof cd);
    cd.n_ranks = 1;
    cd.devices = dev;
    rc = pp_nccl_comm_init(&L, id, timeout_s, comm, err);
    if (rc == PP_OK) rc = pp_cuda_create(&cd, c, err);
    if (rc == PP_OK) rc = pp_cuda_bind(*c, 0, err);
    return rc;
}
#endif

#endif
