/* tests/test_model.c - PP_MODEL's runtime layer counts and the model context (pp_model.ctx).

   A small chain model: one `in` layer, up to 6 `mid` layers, a `loss` layer. The mid layers
   read a gain from the model's context, and every callback (forward, backward, weight_grad,
   describe) fails when it cannot reach that context, so a step that completes proves the
   context arrived everywhere. Checked: a list compiled with 6 mids and run with 3 in use gives
   bit for bit what a list compiled with 3 gives (sequential reference and every schedule
   through pp_pipeline); layer names follow the counts in use; bad counts are refused with a
   message naming the entry; callers that call the dispatchers themselves (io.model NULL) get
   the full list; lists without counts behave as before. */
#define PP_MAX_LAYER_KINDS 3 /* small, so that a 4-entry list exceeds it (test_max_kinds) */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CH 4        /* channels of every tensor */
#define ROWS 24
#define MAGIC 0x5eed

typedef struct chain_ctx {
    int magic;
    float gain;     /* mid layers: y = tanh(x) * a * gain */
} chain_ctx;

typedef struct chain_p {
    float* a;       /* (CH) */
    float* b;       /* (CH), in layer only */
} chain_p;

static const chain_ctx* ctx_of(const struct pp_model* m) {
    const chain_ctx* c = m ? (const chain_ctx*)m->ctx : NULL;
    return c && c->magic == MAGIC ? c : NULL;
}

static int in_fwd(const chain_p* w, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;     /* (rows, CH) */
    float* y = (float*)io->out[0].data;                /* (rows, CH) */
    int64_t r;
    int c;
    if (!ctx_of(io->model)) return 7;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < CH; c++) y[r * CH + c] = x[r * CH + c] * w->a[c] + w->b[c];
    return 0;
}
static int in_bwd(const chain_p* w, chain_p* g, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;
    const float* dy = (const float*)io->d_out[0].data;
    int64_t r;
    int c;
    (void)w;
    if (!ctx_of(io->model)) return 7;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < CH; c++) {
            g->a[c] += x[r * CH + c] * dy[r * CH + c];
            g->b[c] += dy[r * CH + c];
        }
    return 0;
}
static int mid_fwd(const chain_p* w, pp_layer_io* io) {
    const chain_ctx* cx = ctx_of(io->model);
    const float* x = (const float*)io->in[0].data;
    float* y = (float*)io->out[0].data;
    int64_t r;
    int c;
    if (!cx) return 7;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < CH; c++) y[r * CH + c] = tanhf(x[r * CH + c]) * w->a[c] * cx->gain;
    return 0;
}
/* input gradient (B) */
static int mid_bwd_in(const chain_p* w, chain_p* g, pp_layer_io* io) {
    const chain_ctx* cx = ctx_of(io->model);
    const float* x = (const float*)io->in[0].data;
    const float* dy = (const float*)io->d_out[0].data;
    float* dx = (float*)io->d_in[0].data;
    int64_t r;
    int c;
    (void)g;
    if (!cx) return 7;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < CH; c++) {
            float t = tanhf(x[r * CH + c]);
            dx[r * CH + c] = dy[r * CH + c] * w->a[c] * cx->gain * (1.0f - t * t);
        }
    return 0;
}
/* weight gradient (W) */
static int mid_wgrad(const chain_p* w, chain_p* g, pp_layer_io* io) {
    const chain_ctx* cx = ctx_of(io->model);
    const float* x = (const float*)io->in[0].data;
    const float* dy = (const float*)io->d_out[0].data;
    int64_t r;
    int c;
    (void)w;
    if (!cx) return 7;
    for (r = 0; r < io->in[0].rows; r++)
        for (c = 0; c < CH; c++) g->a[c] += tanhf(x[r * CH + c]) * cx->gain * dy[r * CH + c];
    return 0;
}
static int mid_bwd(const chain_p* w, chain_p* g, pp_layer_io* io) {
    int rc = mid_bwd_in(w, g, io);
    return rc ? rc : mid_wgrad(w, g, io);
}
static int loss_fwd(const chain_p* w, pp_layer_io* io) {
    const float* y = (const float*)io->in[0].data;
    const float* t = (const float*)io->mb->targets;     /* (rows, CH) */
    int64_t r, rows = io->in[0].rows;
    double acc = 0;
    int c;
    (void)w;
    if (!ctx_of(io->model)) return 7;
    for (r = 0; r < rows; r++)
        for (c = 0; c < CH; c++) acc += (double)(y[r * CH + c] - t[r * CH + c]) * (y[r * CH + c] - t[r * CH + c]);
    io->loss = (float)(acc / (double)rows);
    return 0;
}
static int loss_bwd(const chain_p* w, chain_p* g, pp_layer_io* io) {
    const float* y = (const float*)io->in[0].data;
    const float* t = (const float*)io->mb->targets;
    float* dy = (float*)io->d_in[0].data;
    int64_t r, rows = io->in[0].rows;
    int c;
    (void)w;
    (void)g;
    if (!ctx_of(io->model)) return 7;
    for (r = 0; r < rows; r++)
        for (c = 0; c < CH; c++) dy[r * CH + c] = 2.0f * (y[r * CH + c] - t[r * CH + c]) / (float)rows * io->mb->loss_scale;
    return 0;
}
/* Without the context a layer describes an impossible output count: the library refuses it. */
static void chain_desc(const chain_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d,
                       int loss) {
    (void)w;
    (void)n_in;
    if (!ctx_of(d->model)) {
        d->n_out = PP_MAX_TENSORS + 1;
        return;
    }
    d->n_out = loss ? 0 : 1;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = CH;
    d->out[0].dtype = PP_F32;
    d->cost = (double)mb->rows;
    d->n_params = CH;
}
static void layer_desc(const chain_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    chain_desc(w, mb, in, n_in, d, 0);
}
static void loss_desc(const chain_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    chain_desc(w, mb, in, n_in, d, 1);
}

#define MIDS 6
#define CHAIN_LAYERS(X)                                               \
    X(in, chain_p, in_fwd, in_bwd, layer_desc, 1)                     \
    X(mid, chain_p, mid_fwd, mid_bwd, layer_desc, MIDS)               \
    X(loss, chain_p, loss_fwd, loss_bwd, loss_desc, 1)
PP_MODEL(chain, CHAIN_LAYERS)

/* the same list compiled with 3 mids */
#define CHAIN3_LAYERS(X)                                              \
    X(in, chain_p, in_fwd, in_bwd, layer_desc, 1)                     \
    X(mid, chain_p, mid_fwd, mid_bwd, layer_desc, 3)                  \
    X(loss, chain_p, loss_fwd, loss_bwd, loss_desc, 1)
PP_MODEL(chain3, CHAIN3_LAYERS)

/* split backward, for the zero-bubble schedules (weight_grad must reach the context too) */
#define CHAINZ_LAYERS(X)                                                      \
    X(in, chain_p, in_fwd, in_bwd, PP_NO_WGRAD, layer_desc, 1)                \
    X(mid, chain_p, mid_fwd, mid_bwd_in, mid_wgrad, layer_desc, MIDS)         \
    X(loss, chain_p, loss_fwd, loss_bwd, PP_NO_WGRAD, loss_desc, 1)
PP_MODEL_SPLIT(chainz, CHAINZ_LAYERS)

/* four entries: one more than PP_MAX_LAYER_KINDS here */
#define CHAIN4_LAYERS(X)                                              \
    X(in, chain_p, in_fwd, in_bwd, layer_desc, 1)                     \
    X(mid, chain_p, mid_fwd, mid_bwd, layer_desc, 2)                  \
    X(mid2, chain_p, mid_fwd, mid_bwd, layer_desc, 2)                 \
    X(loss, chain_p, loss_fwd, loss_bwd, loss_desc, 1)
PP_MODEL(chain4, CHAIN4_LAYERS)

/* Parameters for n layers (in, mids, loss): buf holds 2*CH floats per layer. */
typedef struct params {
    float buf[(MIDS + 2) * 2 * CH];
    chain_p p[MIDS + 2];
} params;

static void params_init(params* P, uint64_t seed, int zero) {
    int l, c;
    for (l = 0; l < MIDS + 2; l++) {
        P->p[l].a = P->buf + l * 2 * CH;
        P->p[l].b = P->p[l].a + CH;
        for (c = 0; c < 2 * CH; c++) P->p[l].a[c] = zero ? 0.0f : 0.5f + mlp_rng_uniform(&seed);
    }
}
/* The first n_mid mids of P in a model struct (the rest stay as they are). */
static void bind_chain(chain_model* m, const params* P, int n_mid) {
    int i;
    m->in[0] = P->p[0];
    for (i = 0; i < n_mid; i++) m->mid[i] = P->p[1 + i];
    m->loss[0] = P->p[MIDS + 1];
}
/* Weights W from seed and zeroed gradients G, bound to w and g with n_mid mids. */
static void chain_pair(chain_model* w, chain_model* g, params* W, params* G, int n_mid, uint64_t seed) {
    params_init(W, seed, 0);
    params_init(G, 0, 1);
    memset(w, 0, sizeof *w);
    memset(g, 0, sizeof *g);
    bind_chain(w, W, n_mid);
    bind_chain(g, G, n_mid);
}
static void bind_chain3(chain3_model* m, const params* P) {
    int i;
    m->in[0] = P->p[0];
    for (i = 0; i < 3; i++) m->mid[i] = P->p[1 + i];
    m->loss[0] = P->p[MIDS + 1];
}
static void bind_chainz(chainz_model* m, const params* P, int n_mid) {
    int i;
    m->in[0] = P->p[0];
    for (i = 0; i < n_mid; i++) m->mid[i] = P->p[1 + i];
    m->loss[0] = P->p[MIDS + 1];
}

static float X[ROWS * CH], T[ROWS * CH];

static pp_batch make_batch(int m) {
    pp_batch b;
    uint64_t s = 99;
    int i;
    for (i = 0; i < ROWS * CH; i++) {
        X[i] = 2.0f * mlp_rng_uniform(&s) - 1.0f;
        T[i] = mlp_rng_uniform(&s);
    }
    hx_dense_batch(&b, X, NULL, ROWS, CH, m);
    b.targets = T;
    b.target_row_bytes = CH * sizeof(float);
    return b;
}

static chain_counts mids(int n) {
    chain_counts c;
    memset(&c, 0, sizeof c);
    c.mid = n;
    return c;
}

static void test_counts_api(void) {
    pp_model full = chain_model_desc(), m = chain_model_desc_counts(mids(3)), bad;
    pp_error err;
    int l;
    CHECK(full.n_layers == chain_N_LAYERS && full.n_layers == 8 && full.n_kinds == 3 && full.in_use[1] == MIDS,
          "full list: %d layers", full.n_layers);
    CHECK(full.ctx == NULL && m.ctx == NULL, "no context by default");
    for (l = 0; l < full.n_layers; l++)
        CHECK(!strcmp(pp_model_layer_name(&full, l), full.layer_name(l)), "full list: layer %d named alike", l);
    CHECK(m.n_layers == 5 && m.in_use[0] == 1 && m.in_use[1] == 3 && m.in_use[2] == 1, "3 mids: %d layers", m.n_layers);
    CHECK(pp_model_check(&m, &err) == PP_OK, "%s", err.msg);
    CHECK(!strcmp(pp_model_layer_name(&m, 0), "in") && !strcmp(pp_model_layer_name(&m, 3), "mid") &&
              !strcmp(pp_model_layer_name(&m, 4), "loss") && !strcmp(pp_model_layer_name(&m, 5), "?"),
          "names follow the counts in use");
    CHECK(!strcmp(m.layer_name(4), "mid"), "pp_model.layer_name numbers the full list (documented)");
    bad = chain_model_desc_counts(mids(MIDS + 1));
    CHECK(pp_model_check(&bad, &err) == PP_ERR_INVALID && strstr(err.msg, "7 'mid' layers") && strstr(err.msg, "holds 6"),
          "over capacity: %s", err.msg);
    bad = chain_model_desc_counts(mids(-2));
    CHECK(pp_model_check(&bad, &err) == PP_ERR_INVALID && strstr(err.msg, "-2 'mid'"), "negative: %s", err.msg);
    bad = m;
    bad.n_layers = 6;
    CHECK(pp_model_check(&bad, &err) == PP_ERR_INVALID && strstr(err.msg, "n_layers = 6") && strstr(err.msg, "use 5"),
          "n_layers changed behind the counts: %s", err.msg);
    bad = m;
    bad.kinds = NULL;
    CHECK(pp_model_check(&bad, &err) == PP_ERR_INVALID, "kinds NULL with n_kinds 3: %s", err.msg);
    /* a model made by hand has no list: nothing of this applies */
    memset(&bad, 0, sizeof bad);
    bad.name = "hand";
    bad.n_layers = 2;
    bad.forward = chain_forward;
    bad.backward = chain_backward;
    bad.describe = chain_describe;
    CHECK(pp_model_check(&bad, &err) == PP_OK, "%s", err.msg);
    CHECK(!strcmp(pp_model_layer_name(&bad, 1), "layer"), "a model without names");
}

/* A list compiled with 6 mids and run with 3 equals the list compiled with 3. */
static void test_runtime_equals_compiled(void) {
    static params W, G6, G3;
    chain_model w6, g6;
    chain3_model w3, g3;
    chain_ctx cx = {MAGIC, 1.5f};
    pp_model m6 = chain_model_desc_counts(mids(3)), m3 = chain3_model_desc();
    pp_batch b = make_batch(4);
    pp_error err;
    float l6 = 0, l3 = 1;
    chain_pair(&w6, &g6, &W, &G6, 3, 5);
    params_init(&G3, 0, 1);
    bind_chain3(&w3, &W);
    bind_chain3(&g3, &G3);
    m6.ctx = m3.ctx = &cx;
    CHECK(pp_sequential_step(&m6, &w6, &g6, &b, &l6, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_sequential_step(&m3, &w3, &g3, &b, &l3, &err) == PP_OK, "%s", err.msg);
    CHECK(memcmp(&l6, &l3, sizeof l6) == 0, "loss %.9g (3 of 6 mids) vs %.9g (3 compiled)", (double)l6, (double)l3);
    CHECK(memcmp(G6.buf, G3.buf, sizeof G6.buf) == 0, "gradients differ");
    /* the unused mids were never touched */
    CHECK(G6.p[4].a[0] == 0.0f && G6.p[6].a[CH - 1] == 0.0f, "gradient written into an unused mid");
}

/* Every schedule through pp_pipeline, with the runtime count and the context: equal to the
   sequential reference, bit for bit. The split model covers weight_grad. */
static void test_pipelined(void) {
    static params W, GR, GP;
    chain_ctx cx = {MAGIC, 0.75f};
    pp_batch b = make_batch(4);
    pp_error err;
    int kind, p, split;
    params_init(&W, 11, 0);
    for (split = 0; split < 2; split++)
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (p = 1; p <= 2; p++) {
                chain_model wc, gc, grc;
                chainz_model wz, gz, grz;
                pp_pipeline_desc d;
                pp_pipeline* pl = NULL;
                pp_step_stats st;
                float lref = 0;
                int n_mid = 4; /* 6 layers: enough for p*v = 4 stages */
                pp_model m;
                chainz_counts cz;
                memset(&cz, 0, sizeof cz);
                cz.mid = n_mid;
                m = split ? chainz_model_desc_counts(cz) : chain_model_desc_counts(mids(n_mid));
                m.ctx = &cx;
                params_init(&GR, 0, 1);
                params_init(&GP, 0, 1);
                memset(&wc, 0, sizeof wc);
                memset(&gc, 0, sizeof gc);
                memset(&grc, 0, sizeof grc);
                memset(&wz, 0, sizeof wz);
                memset(&gz, 0, sizeof gz);
                memset(&grz, 0, sizeof grz);
                bind_chain(&wc, &W, n_mid);
                bind_chain(&gc, &GP, n_mid);
                bind_chain(&grc, &GR, n_mid);
                bind_chainz(&wz, &W, n_mid);
                bind_chainz(&gz, &GP, n_mid);
                bind_chainz(&grz, &GR, n_mid);
                CHECK(pp_sequential_step(&m, split ? (const void*)&wz : (const void*)&wc, split ? (void*)&grz : (void*)&grc, &b, &lref,
                               &err) == PP_OK,
                      "%s", err.msg);
                memset(&d, 0, sizeof d);
                d.model = m;
                d.weights = split ? (const void*)&wz : (const void*)&wc;
                d.grads = split ? (void*)&gz : (void*)&gc;
                d.schedule = (pp_schedule_kind)kind;
                d.p = p;
                d.m = 4;
                if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
                    CHECK(0, "%s p=%d: %s", pp_schedule_name((pp_schedule_kind)kind), p, err.msg);
                    continue;
                }
                CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "%s", pp_pipeline_error(pl));
                CHECK(st.has_loss && memcmp(&st.loss, &lref, sizeof lref) == 0 && memcmp(GP.buf, GR.buf, sizeof GP.buf) == 0,
                      "%s p=%d %s: pipelined differs from the sequential reference (loss %.9g vs %.9g)",
                      pp_schedule_name((pp_schedule_kind)kind), p, split ? "split" : "fused", (double)st.loss, (double)lref);
                pp_pipeline_destroy(pl);
            }
}

/* Without the context every kind of call fails, with the library's message. */
static void test_ctx_required(void) {
    static params W, G;
    chain_model w, g;
    pp_model m = chain_model_desc_counts(mids(2));
    pp_batch b = make_batch(2);
    pp_error err;
    chain_ctx wrong = {1, 1.0f};
    float loss;
    chain_pair(&w, &g, &W, &G, 2, 3);
    CHECK(pp_sequential_step(&m, &w, &g, &b, &loss, &err) == PP_ERR_INVALID && strstr(err.msg, "describe gave n_out=5"),
          "describe without the context: %s", err.msg);
    m.ctx = &wrong;
    CHECK(pp_sequential_step(&m, &w, &g, &b, &loss, &err) == PP_ERR_INVALID, "a context that is not ours: %s", err.msg);
}

/* Calling the dispatchers yourself: io.model selects the counts; NULL is the full list. */
static void test_direct_call(void) {
    static params W;
    chain_model w;
    pp_model m = chain_model_desc_counts(mids(2));
    chain_ctx cx = {MAGIC, 1.0f};
    pp_layer_desc d;
    pp_microbatch mb;
    pp_tensor in;
    params_init(&W, 3, 0);
    memset(&w, 0, sizeof w);
    bind_chain(&w, &W, MIDS);
    m.ctx = &cx;
    memset(&mb, 0, sizeof mb);
    mb.rows = 3;
    memset(&in, 0, sizeof in);
    in.rows = 3;
    in.cols = CH;
    in.dtype = PP_F32;
    memset(&d, 0, sizeof d);
    d.model = &m;
    m.describe(&w, 3, &mb, &in, 1, &d); /* layer 3 of 1 + 2 + 1: the loss */
    CHECK(d.n_out == 0, "layer 3 with 2 mids in use is the loss (n_out %d)", d.n_out);
    memset(&d, 0, sizeof d);
    m.describe(&w, 3, &mb, &in, 1, &d); /* model NULL: the full list's layer 3 is a mid, and no context */
    CHECK(d.n_out == PP_MAX_TENSORS + 1, "model NULL: full list, no context (n_out %d)", d.n_out);
}

/* A list with more entries than PP_MAX_LAYER_KINDS runs at its full counts, and says so when a
   count past the limit is changed. */
static void test_max_kinds(void) {
    pp_model m = chain4_model_desc();
    chain4_counts c;
    pp_error err;
    CHECK(m.n_kinds == 4 && m.n_layers == 6, "4 entries, 6 layers: %d %d", m.n_kinds, m.n_layers);
    CHECK(pp_model_check(&m, &err) == PP_OK, "%s", err.msg);
    memset(&c, 0, sizeof c);
    c.mid = 1;
    m = chain4_model_desc_counts(c);
    CHECK(pp_model_check(&m, &err) == PP_OK && m.n_layers == 5, "entry 1 of 4 changes: %s", err.msg);
    c.loss = 1;
    m = chain4_model_desc_counts(c);
    CHECK(pp_model_check(&m, &err) == PP_ERR_INVALID && strstr(err.msg, "PP_MAX_LAYER_KINDS"), "entry 4 of 4: %s", err.msg);
}

/* A list without runtime counts, as before: the MLP's numbers and names. */
static void test_unchanged(void) {
    pp_model m = mlp_model_desc(), z = mlpz_model_desc();
    int l;
    CHECK(m.n_layers == mlp_N_LAYERS && z.n_layers == mlpz_N_LAYERS && m.ctx == NULL && m.weight_grad == NULL &&
              z.weight_grad != NULL,
          "mlp %d layers", m.n_layers);
    for (l = 0; l < m.n_layers; l++)
        CHECK(!strcmp(m.layer_name(l), l < MLP_DEPTH ? "dense" : "xent") && !strcmp(pp_model_layer_name(&m, l), m.layer_name(l)),
              "mlp layer %d", l);
}


/* ---- Any order of kinds (PP_MODEL_ORDER) and gradient lists derived from the params hook ----
   ord: dense, tanh, dense, tanh, dense, tanh, dense, sq: eight layers of three kinds in the
   order PP_MODEL_ORDER gives. fold: the same network written the old way, each dense + tanh pair
   folded into one layer (dt) of the list's order. The same float operations in the same order:
   the gradients must be the same bits. */
typedef struct dn_p {
    float* W; /* (CH, CH) */
    float* b; /* (CH) */
} dn_p;
typedef struct none_p {
    int unused;
} none_p;

static void dn_f(const dn_p* w, const float* x, float* y, int64_t rows) { /* y = x W + b */
    int64_t r;
    int i, o;
    for (r = 0; r < rows; r++)
        for (o = 0; o < CH; o++) {
            float s = w->b[o];
            for (i = 0; i < CH; i++) s += x[r * CH + i] * w->W[i * CH + o];
            y[r * CH + o] = s;
        }
}
static void dn_b(const dn_p* w, dn_p* g, const float* x, const float* dy, float* dx, int64_t rows) {
    int64_t r;
    int i, o;
    for (r = 0; r < rows; r++)
        for (o = 0; o < CH; o++) {
            g->b[o] += dy[r * CH + o];
            for (i = 0; i < CH; i++) {
                g->W[i * CH + o] += x[r * CH + i] * dy[r * CH + o];
                if (dx) dx[r * CH + i] += w->W[i * CH + o] * dy[r * CH + o];
            }
        }
}
static void th_f(const float* x, float* y, int64_t n) {
    int64_t k;
    for (k = 0; k < n; k++) y[k] = tanhf(x[k]);
}
static void th_b(const float* y, const float* dy, float* dx, int64_t n) {
    int64_t k;
    for (k = 0; k < n; k++) dx[k] += dy[k] * (1.0f - y[k] * y[k]);
}
static int dn_fwd(const dn_p* w, pp_layer_io* io) {
    dn_f(w, (const float*)io->in[0].data, (float*)io->out[0].data, io->in[0].rows);
    return 0;
}
static int dn_bwd(const dn_p* w, dn_p* g, pp_layer_io* io) {
    dn_b(w, g, (const float*)io->in[0].data, (const float*)io->d_out[0].data, (float*)io->d_in[0].data, io->in[0].rows);
    return 0;
}
static int th_fwd(const none_p* w, pp_layer_io* io) {
    (void)w;
    th_f((const float*)io->in[0].data, (float*)io->out[0].data, io->in[0].rows * CH);
    return 0;
}
static int th_bwd(const none_p* w, none_p* g, pp_layer_io* io) {
    (void)w;
    (void)g;
    th_b((const float*)io->out[0].data, (const float*)io->d_out[0].data, (float*)io->d_in[0].data, io->in[0].rows * CH);
    return 0;
}
/* dense then tanh in one layer: z = x W + b kept in io->saved, y = tanh(z) */
static int dt_fwd(const dn_p* w, pp_layer_io* io) {
    dn_f(w, (const float*)io->in[0].data, (float*)io->saved, io->in[0].rows);
    th_f((const float*)io->saved, (float*)io->out[0].data, io->in[0].rows * CH);
    return 0;
}
static int dt_bwd(const dn_p* w, dn_p* g, pp_layer_io* io) {
    float dz[ROWS * CH];
    int64_t rows = io->in[0].rows;
    if (rows > ROWS) return 9;
    memset(dz, 0, sizeof dz); /* what the library hands the tanh layer: zeroed, then added into */
    th_b((const float*)io->out[0].data, (const float*)io->d_out[0].data, dz, rows * CH);
    dn_b(w, g, (const float*)io->in[0].data, dz, (float*)io->d_in[0].data, rows);
    return 0;
}
static int sq_fwd(const none_p* w, pp_layer_io* io) {
    const float* y = (const float*)io->in[0].data;
    const float* t = (const float*)io->mb->targets;
    int64_t k, rows = io->in[0].rows;
    double acc = 0;
    (void)w;
    for (k = 0; k < rows * CH; k++) acc += 0.5 * (double)(y[k] - t[k]) * (double)(y[k] - t[k]);
    io->loss = (float)(acc / (double)rows);
    return 0;
}
static int sq_bwd(const none_p* w, none_p* g, pp_layer_io* io) {
    const float* y = (const float*)io->in[0].data;
    const float* t = (const float*)io->mb->targets;
    float* dy = (float*)io->d_in[0].data;
    int64_t k, rows = io->in[0].rows;
    float s = io->mb->loss_scale / (float)rows;
    (void)w;
    (void)g;
    for (k = 0; k < rows * CH; k++) dy[k] = s * (y[k] - t[k]);
    return 0;
}
static void out_desc(const pp_tensor* in, pp_layer_desc* d, int n_out) {
    d->n_out = n_out;
    d->out[0].rows = in[0].rows;
    d->out[0].cols = CH;
    d->out[0].dtype = PP_F32;
}
static void dn_desc(const dn_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)mb, (void)n_in;
    out_desc(in, d, 1);
    d->n_params = CH * CH + CH;
}
static void dt_desc(const dn_p* w, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    dn_desc(w, mb, in, n_in, d);
    d->saved_bytes = (size_t)in[0].rows * CH * sizeof(float);
}
PP_DESCRIBE_SAME(th_desc, none_p) /* the library's describe functions for the commonest layers */
PP_DESCRIBE_LOSS(sq_desc, none_p)
static int dn_params(const dn_p* w, pp_param* out, int cap) {
    if (cap >= 2) {
        out[0] = pp_param_of(w->W, CH * CH, PP_F32);
        out[1] = pp_param_of(w->b, CH, PP_F32);
    }
    return 2;
}
#define ORD_LAYERS(X)                                 \
    X(dn, dn_p, dn_fwd, dn_bwd, dn_desc, 4)           \
    X(th, none_p, th_fwd, th_bwd, th_desc, 3)         \
    X(sq, none_p, sq_fwd, sq_bwd, sq_desc, 1)
PP_MODEL(ord, ORD_LAYERS)
#define ORD_ORDER(X) X(dn) X(th) X(dn) X(th) X(dn) X(th) X(dn) X(sq)
PP_MODEL_ORDER(ord, ORD_ORDER)
#define ORD_PARAMS(X) X(dn, dn_params)
PP_MODEL_PARAMS(ord, ORD_PARAMS)
/* the same with every W a TP shard */
static int ordtp_params(const pp_model* m, const void* w, int l, pp_param* out, int cap) {
    int n = ord_params(m, w, l, out, cap);
    if (n == 2 && cap >= 2) out[0] = pp_param_shard(out[0].data, out[0].count, out[0].dtype);
    return n;
}

#define FOLD_LAYERS(X)                                \
    X(dt, dn_p, dt_fwd, dt_bwd, dt_desc, 3)           \
    X(dn, dn_p, dn_fwd, dn_bwd, dn_desc, 1)           \
    X(sq, none_p, sq_fwd, sq_bwd, sq_desc, 1)
PP_MODEL(fold, FOLD_LAYERS)

#define ORD_N (CH * CH + CH) /* floats per dense layer */
typedef struct dense4 {
    float buf[4 * ORD_N];
} dense4;
static void dense4_init(dense4* P, uint64_t seed) {
    int k;
    for (k = 0; k < 4 * ORD_N; k++) P->buf[k] = seed ? mlp_rng_uniform(&seed) - 0.5f : 0.0f;
}
static dn_p dense4_at(dense4* P, int i) {
    dn_p d;
    d.W = P->buf + i * ORD_N;
    d.b = d.W + CH * CH;
    return d;
}
static void bind_ord(ord_model* m, dense4* P) {
    int i;
    memset(m, 0, sizeof *m);
    for (i = 0; i < 4; i++) m->dn[i] = dense4_at(P, i);
}
static void bind_fold(fold_model* m, dense4* P) {
    int i;
    memset(m, 0, sizeof *m);
    for (i = 0; i < 3; i++) m->dt[i] = dense4_at(P, i);
    m->dn[0] = dense4_at(P, 3);
}
/* The list a trainer wrote by hand before: both buffers of every dense layer, in layer order. */
static int ord_hand_list(dense4* G, const pp_model* m, pp_grad_buf* out, int rank_only, const pp_schedule* s,
                         const int* first) {
    int l, n = 0, i = 0;
    for (l = 0; l < m->n_layers; l++) {
        if (strcmp(pp_model_layer_name(m, l), "dn") != 0) continue;
        if (rank_only < 0 || pp_schedule_layer_rank(s, first, l) == rank_only) {
            dn_p d = dense4_at(G, i);
            memset(&out[n], 0, 2 * sizeof *out);
            out[n].layer = out[n + 1].layer = l;
            out[n].data = d.W, out[n].count = CH * CH;
            out[n + 1].data = d.b, out[n + 1].count = CH;
            out[n].dtype = out[n + 1].dtype = PP_F32;
            n += 2;
        }
        i++;
    }
    return n;
}
static int gbufs_equal(const pp_grad_buf* a, const pp_grad_buf* b, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (a[i].layer != b[i].layer || a[i].data != b[i].data || a[i].count != b[i].count || a[i].dtype != b[i].dtype ||
            a[i].tied_copy != b[i].tied_copy || a[i].tp_sharded != b[i].tp_sharded || a[i].device != b[i].device)
            return 0;
    return 1;
}

/* The order: names, counts, checks; and bad orders refused. */
static void test_order_model(void) {
    static const char* want[8] = {"dn", "th", "dn", "th", "dn", "th", "dn", "sq"};
    static const int bad_kind[8] = {0, 1, 0, 1, 0, 1, 0, 3};
    static const int too_many[8] = {0, 0, 0, 0, 0, 1, 1, 2};
    pp_model m = ord_model_desc_order(), b;
    pp_error err;
    int l;
    CHECK(pp_model_check(&m, &err) == PP_OK, "%s", err.msg);
    CHECK(m.n_layers == 8 && m.in_use[0] == 4 && m.in_use[1] == 3 && m.in_use[2] == 1, "%d layers, in use %d %d %d",
          m.n_layers, m.in_use[0], m.in_use[1], m.in_use[2]);
    for (l = 0; l < 8; l++)
        CHECK(!strcmp(pp_model_layer_name(&m, l), want[l]), "layer %d is '%s', want '%s'", l, pp_model_layer_name(&m, l),
              want[l]);
    b = m;
    b.order = bad_kind;
    CHECK(pp_model_check(&b, &err) == PP_ERR_INVALID && strstr(err.msg, "order[7] = 3"), "%s", err.msg);
    b.order = too_many; /* 5 dn, 2 th: in_use says 4 and 3 */
    CHECK(pp_model_check(&b, &err) == PP_ERR_INVALID && strstr(err.msg, "the order has 5 'dn' layers"), "%s", err.msg);
    b = ord_model_desc(); /* without the order: the list's order, as before */
    CHECK(b.order == NULL && b.n_layers == 8 && !strcmp(pp_model_layer_name(&b, 1), "dn") &&
              !strcmp(pp_model_layer_name(&b, 4), "th"),
          "list order");
}

/* The ordered model's loss and gradients are the folded model's bits, sequential and pipelined. */
static void test_order_grads(void) {
    static dense4 W, GF, GO;
    static const struct {
        pp_schedule_kind kind;
        int p, v;
    } runs[] = {{PP_SCHED_1F1B, 2, 1}, {PP_SCHED_INTERLEAVED, 4, 2}, {PP_SCHED_GPIPE, 4, 1}, {PP_SCHED_ZB_H1, 2, 1}};
    pp_batch b = make_batch(4);
    ord_model wo, go;
    fold_model wf, gf;
    pp_model mo = ord_model_desc_order(), mf = fold_model_desc();
    pp_error err;
    float lf = 0, lo = 0;
    size_t i;
    dense4_init(&W, 5);
    dense4_init(&GF, 0);
    dense4_init(&GO, 0);
    bind_ord(&wo, &W);
    bind_ord(&go, &GO);
    bind_fold(&wf, &W);
    bind_fold(&gf, &GF);
    CHECK(pp_sequential_step(&mf, &wf, &gf, &b, &lf, &err) == PP_OK, "fold: %s", err.msg);
    CHECK(pp_sequential_step(&mo, &wo, &go, &b, &lo, &err) == PP_OK, "ord: %s", err.msg);
    CHECK(memcmp(&lf, &lo, sizeof lf) == 0 && memcmp(GF.buf, GO.buf, sizeof GF.buf) == 0,
          "sequential: the ordered model differs from the folded one (loss %.9g vs %.9g)", (double)lo, (double)lf);
    for (i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        pp_pipeline_desc d;
        pp_pipeline* pl = NULL;
        pp_step_stats st;
        dense4_init(&GO, 0);
        memset(&d, 0, sizeof d);
        d.model = mo;
        d.weights = &wo;
        d.grads = &go;
        d.schedule = runs[i].kind;
        d.p = runs[i].p;
        d.v = runs[i].v;
        d.m = 4;
        if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
            CHECK(0, "%s p=%d: %s", pp_schedule_name(runs[i].kind), runs[i].p, err.msg);
            continue;
        }
        CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "%s", pp_pipeline_error(pl));
        CHECK(memcmp(&st.loss, &lf, sizeof lf) == 0 && memcmp(GF.buf, GO.buf, sizeof GF.buf) == 0,
              "%s p=%d v=%d: the ordered model's gradients differ from the folded model's (loss %.9g vs %.9g)",
              pp_schedule_name(runs[i].kind), runs[i].p, runs[i].v, (double)st.loss, (double)lf);
        pp_pipeline_destroy(pl);
    }
}

/* The lists from the params hook equal the hand-built ones: entries, norm bits, clipped bits. */
static void test_derived_lists(void) {
    static dense4 W, G, GH;
    pp_grad_buf hand[16], got[16];
    pp_batch b = make_batch(4);
    ord_model w, g, gh;
    fold_model fw, fg;
    pp_model m = ord_model_desc_order(), bare;
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    double nh = -1, nd = -2, nf = -3;
    float loss;
    int n = -1, nhand, r, k;
    m.params = ord_params;
    dense4_init(&W, 7);
    dense4_init(&G, 0);
    bind_ord(&w, &W);
    bind_ord(&g, &G);
    CHECK(pp_sequential_step(&m, &w, &g, &b, &loss, &err) == PP_OK, "%s", err.msg);
    nhand = ord_hand_list(&G, &m, hand, -1, NULL, NULL);
    CHECK(pp_model_grad_bufs(&m, &g, NULL, NULL, 0, &n, &err) == PP_OK && n == 8, "count: %d (%s)", n, err.msg);
    CHECK(pp_model_grad_bufs(&m, &g, NULL, got, 16, &n, &err) == PP_OK && n == nhand && gbufs_equal(got, hand, n),
          "the model's list differs from the hand-built one (%d vs %d entries)", n, nhand);
    CHECK(pp_grad_norm(NULL, m.n_layers, hand, nhand, &nh, &err) == PP_OK &&
              pp_grad_norm(NULL, m.n_layers, got, n, &nd, &err) == PP_OK && memcmp(&nh, &nd, sizeof nh) == 0 && nh > 0,
          "norm: hand %.17g, derived %.17g", nh, nd);
    /* the folded model's hand list (5 layers, the tanh inside) gives the same norm bits */
    bind_fold(&fw, &W);
    bind_fold(&fg, &G);
    {
        pp_grad_buf fl[8];
        pp_model mf = fold_model_desc();
        int l;
        memset(fl, 0, sizeof fl);
        for (l = 0; l < 4; l++) {
            dn_p p = l < 3 ? fg.dt[l] : fg.dn[0];
            fl[2 * l].layer = fl[2 * l + 1].layer = l;
            fl[2 * l].data = p.W, fl[2 * l].count = CH * CH;
            fl[2 * l + 1].data = p.b, fl[2 * l + 1].count = CH;
            fl[2 * l].dtype = fl[2 * l + 1].dtype = PP_F32;
        }
        CHECK(pp_grad_norm(NULL, mf.n_layers, fl, 8, &nf, &err) == PP_OK && memcmp(&nf, &nd, sizeof nf) == 0,
              "folded model's norm %.17g, the ordered model's %.17g", nf, nd);
    }
    { /* own flags: layers 2 and 6 only */
        unsigned char own[8] = {0, 0, 1, 0, 0, 0, 1, 0};
        CHECK(pp_model_grad_bufs(&m, &g, own, got, 16, &n, &err) == PP_OK && n == 4 && gbufs_equal(got, hand + 2, 2) &&
                  gbufs_equal(got + 2, hand + 6, 2),
              "own: %d entries", n);
    }
    /* refusals: too small, no hook; the TP flag from pp_param_shard */
    CHECK(pp_model_grad_bufs(&m, &g, NULL, got, 7, &n, &err) == PP_ERR_INVALID && n == 8 && strstr(err.msg, "out holds 7"),
          "%s", err.msg);
    bare = ord_model_desc_order();
    CHECK(pp_model_grad_bufs(&bare, &g, NULL, got, 16, &n, &err) == PP_ERR_INVALID && strstr(err.msg, "no params hook"),
          "%s", err.msg);
    bare.params = ordtp_params;
    CHECK(pp_model_grad_bufs(&bare, &g, NULL, got, 16, &n, &err) == PP_OK && n == 8 && got[0].tp_sharded == 1 &&
              got[1].tp_sharded == 0 && got[6].tp_sharded == 1,
          "tp_sharded from pp_param_shard");
    /* a pipeline (interleaved p = 4: a layer per stage): its list, each rank's, and clipping */
    dense4_init(&GH, 0);
    memcpy(GH.buf, G.buf, sizeof G.buf);
    bind_ord(&gh, &GH);
    memset(&d, 0, sizeof d);
    d.model = m;
    d.weights = &w;
    d.grads = &g;
    d.schedule = PP_SCHED_INTERLEAVED;
    d.p = 4;
    d.v = 2;
    d.m = 4;
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    CHECK(pp_pipeline_grad_bufs(pl, got, 16, &n, &err) == PP_OK && n == nhand && gbufs_equal(got, hand, n),
          "the pipeline's list differs from the hand-built one (%d entries)", n);
    for (r = 0; r < 4; r++) {
        pp_grad_buf mine[16];
        int nm = ord_hand_list(&G, &m, mine, r, &pl->sched, pl->first);
        CHECK(pp_stage_grad_bufs(pl->st[r], got, 16, &n, &err) == PP_OK && n == nm && gbufs_equal(got, mine, n),
              "rank %d: the stage's list differs from the hand-built one (%d vs %d entries)", r, n, nm);
    }
    CHECK(pp_pipeline_grad_bufs(pl, got, 16, &n, &err) == PP_OK, "%s", err.msg);
    CHECK(pp_pipeline_grad_clip(pl, got, n, nh / 4, &nd, &err) == PP_OK, "%s", err.msg);
    ord_hand_list(&GH, &m, hand, -1, NULL, NULL);
    CHECK(pp_pipeline_grad_clip(pl, hand, nhand, nh / 4, &nf, &err) == PP_OK, "%s", err.msg);
    CHECK(memcmp(&nd, &nf, sizeof nd) == 0 && memcmp(G.buf, GH.buf, sizeof G.buf) == 0,
          "clipped through the derived list: norm %.17g vs %.17g, gradients %s", nd, nf,
          memcmp(G.buf, GH.buf, sizeof G.buf) ? "differ" : "equal");
    for (k = 0; k < 4 * ORD_N && G.buf[k] == 0; k++) {}
    CHECK(k < 4 * ORD_N, "gradients all zero");
    pp_pipeline_destroy(pl);
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : "";
    if (!strcmp(only, "order")) { /* the negative controls' parts (build/model-controls) */
        test_order_model();
        test_order_grads();
        return TEST_DONE("model order");
    }
    if (!strcmp(only, "lists")) {
        test_derived_lists();
        return TEST_DONE("model lists");
    }
    test_counts_api();
    test_runtime_equals_compiled();
    test_pipelined();
    test_ctx_required();
    test_direct_call();
    test_max_kinds();
    test_unchanged();
    test_order_model();
    test_order_grads();
    test_derived_lists();
    return TEST_DONE("model");
}
