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

int main(void) {
    test_counts_api();
    test_runtime_equals_compiled();
    test_pipelined();
    test_ctx_required();
    test_direct_call();
    test_max_kinds();
    test_unchanged();
    return TEST_DONE("model");
}
