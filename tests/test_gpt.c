/* tests/test_gpt.c - the tiny GPT of examples/gpt.h on packed variable-length sequences.

   (a) every layer kind's backward against central finite differences of its forward;
   (b) attention and positions never cross a sequence boundary: a sequence's activations and
       per-token losses are bit-identical whatever is packed around it, and a negative control
       shows the comparison does catch mixing;
   (c) pipelined steps on threads (GPipe and 1F1B at p = 2 and 4, interleaved v = 2 at p = 2 and
       4) give the loss and gradients of pp_sequential_step bit for bit, on a packed batch of
       random lengths split into micro-batches of whole sequences; so does the GPT whose blocks
       split their backward (gptz) on every schedule with W actions, its B-only scratch freed at B;
   and describe() reads only config fields and charges the quadratic attention term; the corpus
   splits at blank lines and packs documents without padding, and its held-out split takes every
   10th document out of the training set; the trainers' learning rate (warm-up, then cosine) at
   chosen steps, AdamW's decoupled decay and the parameters it decays (examples/gpt_train.h). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/gpt.h"
#include "../examples/gpt_data.h"
#include "../examples/gpt_train.h"
#include "test.h"
#include "harness.h"

/* Random values for every parameter of a model (weights are small at init; the checks want
   every path, LayerNorm gains and biases included, to carry signal). */
static void randomize(float* buf, size_t n, uint64_t seed, float sd) {
    gpt_fill(buf, n, sd, &seed);
}

/* Runs layer l forward (and backward when d_out or the loss is wanted) on one micro-batch.
   Buffers come from describe(), as the library would size them. */
typedef struct layer_run {
    pp_layer_desc d;
    pp_layer_io io;
    float* out;     /* (T, C) or NULL for the loss layer */
    float* din;     /* (T, C) or NULL for token ids */
    void* saved;
} layer_run;

static void run_alloc(layer_run* r, const pp_model* m, const gpt_model* w, int l, const pp_microbatch* mb,
                      const pp_tensor* in) {
    memset(r, 0, sizeof *r);
    r->d.model = m; /* the dispatchers number layers over the model's counts in use */
    m->describe(w, l, mb, in, 1, &r->d);
    r->out = r->d.n_out ? (float*)calloc((size_t)pp_tensor_bytes(&r->d.out[0]), 1) : NULL;
    r->din = pp_dtype_is_float(in->dtype) ? (float*)calloc((size_t)pp_tensor_bytes(in), 1) : NULL;
    r->saved = malloc(r->d.saved_bytes ? r->d.saved_bytes : 1);
    r->io.mb = mb;
    r->io.model = m;
    r->io.layer = l;
    r->io.n_in = 1;
    r->io.n_out = r->d.n_out;
    r->io.in[0] = *in;
    if (r->d.n_out) {
        r->io.out[0] = r->d.out[0];
        r->io.out[0].data = r->out;
        r->io.d_out[0] = r->d.out[0];
    }
    r->io.d_in[0] = *in;
    r->io.d_in[0].data = r->din;
    r->io.saved = r->saved;
    r->io.saved_bytes = r->d.saved_bytes;
}

static void run_free(layer_run* r) {
    free(r->out);
    free(r->din);
    free(r->saved);
}

/* The scalar the finite differences look at: sum(out * probe) for a layer with an output, the
   loss for the head. Accumulated in double so that only the layer's own float rounding is noise. */
static double objective(const pp_model* m, const gpt_model* w, layer_run* r, const float* probe) {
    int64_t k, n;
    double f = 0;
    if (m->forward(w, r->io.layer, &r->io) != 0) return NAN;
    if (!r->d.n_out) return r->io.loss;
    n = r->d.out[0].rows * r->d.out[0].cols;
    for (k = 0; k < n; k++) f += (double)r->out[k] * probe[k];
    return f;
}

/* Compares the analytic gradient a[0..n) with central differences of objective() in x[0..n).
   Pass: |a - num| <= ATOL + RTOL * |num| for every element. Returns the worst ratio
   |a - num| / (ATOL + RTOL * |num|) (<= 1 passes). */
#define FD_EPS 1e-2f
#define FD_ATOL 2e-3
#define FD_RTOL 2e-2
static double fd_compare(const pp_model* m, const gpt_model* w, layer_run* r, const float* probe, float* x,
                         const float* a, size_t n, size_t stride) {
    double worst = 0;
    size_t k;
    for (k = 0; k < n; k += stride) {
        const float keep = x[k];
        double fp, fm, num, err;
        x[k] = keep + FD_EPS;
        fp = objective(m, w, r, probe);
        x[k] = keep - FD_EPS;
        fm = objective(m, w, r, probe);
        x[k] = keep;
        num = (fp - fm) / (2.0 * (double)FD_EPS);
        err = fabs((double)a[k] - num) / (FD_ATOL + FD_RTOL * fabs(num));
        if (!(err <= worst)) worst = err; /* NaN propagates as a failure */
    }
    return worst;
}

/* The micro-batch of the layer tests: three sequences of lengths 3, 1 (no target at all) and 4
   (g_cu, g_tok), their next-token targets in tgt (8). */
static const int32_t g_cu[4] = {0, 3, 4, 8};
static const int32_t g_tok[8] = {1, 5, 9, 2, 10, 0, 7, 3};
static void small_batch(pp_microbatch* mb, int32_t* tgt) {
    int s, i;
    for (s = 0; s < 3; s++)
        for (i = g_cu[s]; i < g_cu[s + 1]; i++) tgt[i] = i + 1 < g_cu[s + 1] ? g_tok[i + 1] : -1;
    memset(mb, 0, sizeof *mb);
    mb->count = 1;
    mb->rows = 8;
    mb->cu_seqlens = g_cu;
    mb->n_seqs = 3;
    mb->max_seqlen = 4;
    mb->targets = tgt;
    mb->loss_scale = 1.0f;
}

/* bf16 activations (gpt_set_act): each layer on bf16 tensors gives, bit for bit, the f32 layer's
   results on the widened values rounded to bf16 (output, input gradient), the same loss and the
   same parameter gradients; describe() says bf16; an f32 tensor is refused. */
static void test_bf16(void) {
    const int32_t* tok = g_tok;
    int32_t tgt[8];
    gpt_config c = {11, 8, 8, 2, 1};
    pp_model m = gpt_model_desc_depth(1);
    gpt_model w, w16, g;
    float *wbuf, *gbuf, *g32, x32[64], dy32[64];
    uint16_t x16[64], dy16[64];
    pp_microbatch mb;
    pp_tensor tin, xin32, xin16;
    size_t np = gpt_param_count(&c);
    int l, i;
    uint64_t sd = 7;
    wbuf = gpt_init(&w, &g, &c, 3, &gbuf);
    g32 = (float*)malloc(np * sizeof(float));
    randomize(wbuf, np, 11, 0.3f);
    gpt_bind(&w16, &c, wbuf);
    CHECK(gpt_set_act(&w16, PP_F16) == -1 && w16.block[0].act == PP_F32, "gpt_set_act refuses f16");
    CHECK(gpt_set_act(&w16, PP_BF16) == 0 && w16.embed[0].act == PP_BF16 && w16.head[0].act == PP_BF16, "bf16 set");
    small_batch(&mb, tgt);
    for (i = 0; i < 64; i++) { /* values bf16 holds exactly */
        x16[i] = pp_f32_to_bf16(gpt_rng_sym(&sd, 1.0f));
        dy16[i] = pp_f32_to_bf16(gpt_rng_sym(&sd, 1.0f));
        x32[i] = pp_bf16_to_f32(x16[i]);
        dy32[i] = pp_bf16_to_f32(dy16[i]);
    }
    memset(&tin, 0, sizeof tin);
    tin.data = (void*)tok;
    tin.rows = 8;
    tin.cols = 1;
    tin.dtype = PP_I32;
    xin32 = tin;
    xin32.data = x32;
    xin32.cols = c.C;
    xin32.dtype = PP_F32;
    xin16 = xin32;
    xin16.data = x16;
    xin16.dtype = PP_BF16;
    for (l = 0; l < m.n_layers; l++) {
        const char* name = pp_model_layer_name(&m, l);
        layer_run a, b;
        size_t bad_out = 0, bad_din = 0, k;
        int rc32, rc16;
        run_alloc(&a, &m, &w, l, &mb, l == 0 ? &tin : &xin32);
        run_alloc(&b, &m, &w16, l, &mb, l == 0 ? &tin : &xin16);
        CHECK(b.d.n_out == a.d.n_out && (!b.d.n_out || b.d.out[0].dtype == PP_BF16), "%s: describe says bf16", name);
        if (a.d.n_out) {
            a.io.d_out[0].data = dy32;
            b.io.d_out[0].data = dy16;
        }
        memset(gbuf, 0, np * sizeof(float));
        rc32 = m.forward(&w, l, &a.io) || m.backward(&w, &g, l, &a.io);
        memcpy(g32, gbuf, np * sizeof(float));
        memset(gbuf, 0, np * sizeof(float));
        rc16 = m.forward(&w16, l, &b.io) || m.backward(&w16, &g, l, &b.io);
        CHECK(rc32 == 0 && rc16 == 0, "%s: f32 and bf16 forward and backward run", name);
        for (k = 0; a.d.n_out && k < 64; k++) bad_out += ((uint16_t*)b.out)[k] != pp_f32_to_bf16(a.out[k]);
        for (k = 0; a.din && k < 64; k++) bad_din += ((uint16_t*)b.din)[k] != pp_f32_to_bf16(a.din[k]);
        CHECK(bad_out == 0 && bad_din == 0, "%s: bf16 output and input gradient = the f32 layer's rounded (%zu, %zu of 64 differ)",
              name, bad_out, bad_din);
        CHECK(memcmp(&a.io.loss, &b.io.loss, sizeof(float)) == 0 && memcmp(g32, gbuf, np * sizeof(float)) == 0,
              "%s: the same loss and parameter gradients", name);
        if (l > 0) { /* an f32 input where describe promised bf16 */
            b.io.in[0] = xin32;
            CHECK(m.forward(&w16, l, &b.io) == GPT_ESHAPE, "%s: an f32 input to a bf16 layer is GPT_ESHAPE", name);
        }
        run_free(&a);
        run_free(&b);
    }
    free(g32);
    free(wbuf);
    free(gbuf);
}

/* (a) ------------------------------------------------------------------------------------------- */
static void test_finite_differences(void) {
    const int32_t* tok = g_tok; /* small_batch's micro-batch */
    int32_t tgt[8];
    gpt_config c = {11, 8, 8, 2, 1};    /* vocab 11, max_T 8, C 8, 2 heads, 1 block */
    pp_model m = gpt_model_desc_depth(1);
    gpt_model w, g;
    float *wbuf, *gbuf, *x, *probe;
    pp_microbatch mb;
    pp_tensor tin, xin;
    size_t np = gpt_param_count(&c), n;
    int l, i;
    const char* names[3] = {"embed", "block", "head"};
    wbuf = gpt_init(&w, &g, &c, 3, &gbuf);
    randomize(wbuf, np, 11, 0.3f);
    for (i = 0; i < c.C; i++) {
        w.block[0].ln1_g[i] += 1.0f;
        w.block[0].ln2_g[i] += 1.0f;
        w.head[0].lnf_g[i] += 1.0f;
    }
    small_batch(&mb, tgt);
    x = (float*)malloc(sizeof(float) * 8 * (size_t)c.C);
    probe = (float*)malloc(sizeof(float) * 8 * (size_t)c.C);
    {
        uint64_t sd = 99;
        for (i = 0; i < 8 * c.C; i++) {
            x[i] = gpt_rng_sym(&sd, 1.0f);
            probe[i] = gpt_rng_sym(&sd, 1.0f);
        }
    }
    memset(&tin, 0, sizeof tin);
    tin.data = (void*)tok;
    tin.rows = 8;
    tin.cols = 1;
    tin.dtype = PP_I32;
    memset(&xin, 0, sizeof xin);
    xin.data = x;
    xin.rows = 8;
    xin.cols = c.C;
    xin.dtype = PP_F32;
    for (l = 0; l < m.n_layers; l++) {
        layer_run r;
        float* wl = gpt_layer_params(&w, &c, l, &n);
        float* gl = gbuf + (wl - wbuf);
        double ew, ex = 0;
        int rc;
        run_alloc(&r, &m, &w, l, &mb, l == 0 ? &tin : &xin);
        r.io.d_out[0].data = probe;
        memset(gbuf, 0, np * sizeof(float));
        rc = m.forward(&w, l, &r.io);
        CHECK(rc == 0, "%s forward returned %d", names[l], rc);
        rc = m.backward(&w, &g, l, &r.io);
        CHECK(rc == 0, "%s backward returned %d", names[l], rc);
        ew = fd_compare(&m, &w, &r, probe, wl, gl, n, 1);
        if (r.din) ex = fd_compare(&m, &w, &r, probe, x, r.din, (size_t)8 * c.C, 1);
        CHECK(ew <= 1.0 && ex <= 1.0, "%s: gradient off by %.2f (parameters) and %.2f (input) of the tolerance",
              names[l], ew, ex);
        printf("finite differences, %-5s: %zu parameters, worst error %.3f of tolerance (input %.3f)\n", names[l], n,
               ew, ex);
        /* backward adds: a second call doubles the parameter gradient (up to rounding, measured
           against the layer's largest element; an overwrite would be off by that element) */
        {
            float* once = (float*)malloc(n * sizeof(float));
            float big = 0.0f;
            size_t k, bad = 0;
            memcpy(once, gl, n * sizeof(float));
            for (k = 0; k < n; k++) big = fabsf(once[k]) > big ? fabsf(once[k]) : big;
            m.forward(&w, l, &r.io);
            if (r.din) memset(r.din, 0, (size_t)8 * c.C * sizeof(float));
            m.backward(&w, &g, l, &r.io);
            for (k = 0; k < n; k++) bad += fabsf(gl[k] - 2.0f * once[k]) > 1e-5f * big;
            CHECK(bad == 0, "%s: backward does not accumulate into grads (%zu of %zu differ)", names[l], bad, n);
            free(once);
        }
        run_free(&r);
    }
    /* loss_scale scales the head's gradient and nothing else */
    {
        layer_run r;
        float* wl = gpt_layer_params(&w, &c, 2, &n);
        float* gl = gbuf + (wl - wbuf);
        float *g1 = (float*)malloc(n * sizeof(float)), *d1 = (float*)malloc(sizeof(float) * 8 * (size_t)c.C);
        size_t k, bad = 0;
        run_alloc(&r, &m, &w, 2, &mb, &xin);
        memset(gbuf, 0, np * sizeof(float));
        m.forward(&w, 2, &r.io);
        m.backward(&w, &g, 2, &r.io);
        memcpy(g1, gl, n * sizeof(float));
        memcpy(d1, r.din, sizeof(float) * 8 * (size_t)c.C);
        mb.loss_scale = 0.25f;
        memset(gbuf, 0, np * sizeof(float));
        memset(r.din, 0, sizeof(float) * 8 * (size_t)c.C);
        m.forward(&w, 2, &r.io);
        m.backward(&w, &g, 2, &r.io);
        for (k = 0; k < n; k++) bad += fabsf(gl[k] - 0.25f * g1[k]) > 1e-6f * (1.0f + fabsf(g1[k]));
        for (k = 0; k < (size_t)8 * c.C; k++) bad += fabsf(r.din[k] - 0.25f * d1[k]) > 1e-6f * (1.0f + fabsf(d1[k]));
        CHECK(bad == 0, "head: loss_scale 0.25 should scale every gradient by 0.25 (%zu differ)", bad);
        mb.loss_scale = 1.0f;
        free(g1);
        free(d1);
        run_free(&r);
    }
    free(x);
    free(probe);
    free(wbuf);
    free(gbuf);
}

/* (b) ------------------------------------------------------------------------------------------- */
/* The whole model forward on one micro-batch: the last block's output (T, C) and the head's
   per-token losses (T) are copied out. */
static void forward_all(const pp_model* m, const gpt_model* w, const pp_microbatch* mb, const int32_t* tok,
                        float* xlast, float* tloss) {
    pp_tensor t;
    layer_run prev, r;
    int l, rc;
    memset(&t, 0, sizeof t);
    t.data = (void*)tok;
    t.rows = mb->rows;
    t.cols = 1;
    t.dtype = PP_I32;
    memset(&prev, 0, sizeof prev);
    for (l = 0; l < m->n_layers; l++) {
        run_alloc(&r, m, w, l, mb, &t);
        rc = m->forward(w, l, &r.io);
        CHECK(rc == 0, "layer %d forward returned %d", l, rc);
        if (l == m->n_layers - 2) memcpy(xlast, r.out, pp_tensor_bytes(&r.d.out[0]));
        if (l == m->n_layers - 1) memcpy(tloss, gpt_head_token_loss(r.saved), sizeof(float) * (size_t)mb->rows);
        run_free(&prev);
        prev = r;
        if (r.d.n_out) {
            t = r.d.out[0];
            t.data = r.out;
        }
    }
    run_free(&prev);
}

static void make_targets(const int32_t* tok, const int32_t* cu, int n_seqs, int32_t* tgt) {
    int s, i;
    for (s = 0; s < n_seqs; s++)
        for (i = cu[s]; i < cu[s + 1]; i++) tgt[i] = i + 1 < cu[s + 1] ? tok[i + 1] : -1;
}

static void test_boundaries(void) {
    /* A (5 tokens), B (7), C (4) packed as [A B C]. B sits at rows [5, 12). Causal attention only
       looks back, so for a missing sequence mask to show at all, the changed sequence must come
       before B: we change A (and C, which must not reach back into B either). */
    enum { LA = 5, LB = 7, LC = 4, T = LA + LB + LC };
    static const int32_t cu[4] = {0, LA, LA + LB, T};
    static const int32_t cu_b[2] = {0, LB};
    int32_t tok1[T], tok2[T], tgt1[T], tgt2[T], tok_b[LB], tgt_b[LB];
    gpt_config c = {16, 16, 16, 2, 2};
    pp_model m = gpt_model_desc_depth(2);
    gpt_model w;
    float *wbuf, *x1, *x2, *xb, *l1, *l2, *lb;
    pp_microbatch mb1, mb2, mbb;
    uint64_t rng = 5;
    int i, C = c.C;
    wbuf = gpt_init(&w, NULL, &c, 8, NULL);
    randomize(wbuf, gpt_param_count(&c), 17, 0.3f);
    for (i = 0; i < T; i++) {
        tok1[i] = (int32_t)(gpt_rng_next(&rng) % 16);
        tok2[i] = tok1[i];
    }
    for (i = 0; i < LA; i++) tok2[i] = (tok1[i] + 1 + i) % 16;              /* A changes */
    for (i = LA + LB; i < T; i++) tok2[i] = (tok1[i] + 3) % 16;             /* C changes */
    for (i = 0; i < LB; i++) tok_b[i] = tok1[LA + i];
    make_targets(tok1, cu, 3, tgt1);
    make_targets(tok2, cu, 3, tgt2);
    make_targets(tok_b, cu_b, 1, tgt_b);
    x1 = (float*)malloc(sizeof(float) * T * C);
    x2 = (float*)malloc(sizeof(float) * T * C);
    xb = (float*)malloc(sizeof(float) * LB * C);
    l1 = (float*)malloc(sizeof(float) * T);
    l2 = (float*)malloc(sizeof(float) * T);
    lb = (float*)malloc(sizeof(float) * LB);
    memset(&mb1, 0, sizeof mb1);
    mb1.count = 1;
    mb1.rows = T;
    mb1.cu_seqlens = cu;
    mb1.n_seqs = 3;
    mb1.max_seqlen = LB;
    mb1.loss_scale = 1.0f;
    mb2 = mb1;
    mb1.targets = tgt1;
    mb2.targets = tgt2;
    mbb = mb1;
    mbb.rows = LB;
    mbb.cu_seqlens = cu_b;
    mbb.n_seqs = 1;
    mbb.targets = tgt_b;

    forward_all(&m, &w, &mb1, tok1, x1, l1);
    forward_all(&m, &w, &mb2, tok2, x2, l2);
    forward_all(&m, &w, &mbb, tok_b, xb, lb);
    CHECK(memcmp(x1 + LA * C, x2 + LA * C, sizeof(float) * LB * C) == 0,
          "changing sequences A and C changed the activations of B");
    CHECK(memcmp(l1 + LA, l2 + LA, sizeof(float) * LB) == 0, "changing sequences A and C changed B's token losses");
    CHECK(memcmp(x1 + LA * C, xb, sizeof(float) * LB * C) == 0,
          "B packed after A differs from B alone (positions must restart, attention must not reach A)");
    CHECK(memcmp(l1 + LA, lb, sizeof(float) * LB) == 0, "B's token losses differ between packed and alone");
    CHECK(memcmp(x1, x2, sizeof(float) * LA * C) != 0, "changing A's tokens left A's activations unchanged");

    /* Negative control: the same comparison with the mask removed, i.e. the micro-batch taken as
       one sequence (cu_seqlens NULL, which the layers treat as "attend to everything before").
       Then B's activations must change with A: if they did not, the checks above could not
       catch a model that ignores the sequence boundaries. */
    mb1.cu_seqlens = mb2.cu_seqlens = NULL;
    mb1.n_seqs = mb2.n_seqs = 0;
    forward_all(&m, &w, &mb1, tok1, x1, l1);
    forward_all(&m, &w, &mb2, tok2, x2, l2);
    CHECK(memcmp(x1 + LA * C, x2 + LA * C, sizeof(float) * LB * C) != 0,
          "negative control: without the mask A's change should reach B, and the check should see it");
    free(x1);
    free(x2);
    free(xb);
    free(l1);
    free(l2);
    free(lb);
    free(wbuf);
}

/* describe() must not read weight data (every rank describes every layer) and must charge
   attention by the sum of squared sequence lengths. */
static void test_describe(void) {
    static const int32_t cu_one[2] = {0, 12}, cu_three[4] = {0, 4, 8, 12};
    gpt_config c = {16, 16, 8, 2, 3};
    gpt_model bare;     /* config fields only: every parameter pointer is NULL */
    pp_model m = gpt_model_desc_depth(3);
    pp_microbatch a, b;
    pp_tensor in;
    pp_layer_desc d1, d2;
    gpt_bind(&bare, &c, NULL);
    memset(&a, 0, sizeof a);
    a.rows = 12;
    a.cu_seqlens = cu_one;
    a.n_seqs = 1;
    b = a;
    b.cu_seqlens = cu_three;
    b.n_seqs = 3;
    memset(&in, 0, sizeof in);
    in.rows = 12;
    in.cols = c.C;
    in.dtype = PP_F32;
    memset(&d1, 0, sizeof d1);
    memset(&d2, 0, sizeof d2);
    m.describe(&bare, 1, &a, &in, 1, &d1);
    m.describe(&bare, 1, &b, &in, 1, &d2);
    CHECK(d1.n_out == 1 && d1.out[0].rows == 12 && d1.out[0].cols == c.C && d1.out[0].dtype == PP_F32,
          "block output must be [rows, C] f32");
    CHECK(d1.cost > d2.cost && d1.saved_bytes - d2.saved_bytes == sizeof(float) * 2 * (144 - 48),
          "one sequence of 12 must cost more than three of 4 (attention 144 vs 48 per head): cost %g vs %g, "
          "saved %zu vs %zu",
          d1.cost, d2.cost, d1.saved_bytes, d2.saved_bytes);
    CHECK(d1.n_params == (int64_t)gpt_block_numel(&c), "block n_params %lld", (long long)d1.n_params);
    memset(&d1, 0, sizeof d1);
    d1.model = &m; /* a depth-3 model: its last layer is the head, not the list's fourth block */
    m.describe(&bare, m.n_layers - 1, &a, &in, 1, &d1);
    CHECK(d1.n_out == 0 && d1.n_params == (int64_t)gpt_head_numel(&c), "head is the loss layer (n_out 0)");
    in.cols = 1;
    in.dtype = PP_I32;
    memset(&d1, 0, sizeof d1);
    m.describe(&bare, 0, &a, &in, 1, &d1);
    CHECK(d1.n_out == 1 && d1.out[0].cols == c.C && d1.n_params == (int64_t)gpt_embed_numel(&c), "embed describe");
    CHECK(m.n_layers == 5 && !strcmp(pp_model_layer_name(&m, 0), "embed") && !strcmp(pp_model_layer_name(&m, 3), "block") &&
              !strcmp(pp_model_layer_name(&m, 4), "head"),
          "depth 3: layers embed, block x3, head");
}

/* The corpus: paragraphs become documents (a long one cut to max_len pieces), and a packed
   batch has next-token targets inside each document and -1 on each document's last token. */
static void test_data(void) {
    static const char text[] = "first paragraph\nstill first\n\nsecond\n\n\nx\n\n"
                               "a rather long third paragraph that must be cut into pieces of at most 16 bytes\n";
    gpt_corpus c;
    int32_t tok[8 * 16], tgt[8 * 16], cu[9];
    uint64_t rng = 1;
    int d, s, i, T, bad = 0, total = 0;
    CHECK(gpt_corpus_from_text(&c, text, sizeof text - 1, 16, 3) == 0, "corpus from text");
    CHECK(c.n_docs >= 7 && c.doc_len[0] == 16 && c.doc_len[1] == 12, "paragraph 1 is 28 bytes: 16 + 12, got %d docs, %d %d",
          c.n_docs, c.doc_len[0], c.doc_len[1]);
    CHECK(c.doc_len[2] == 7 && !memcmp(c.text + c.doc_start[2], "second\n", 7), "paragraph 2 is \"second\\n\"");
    CHECK(c.doc_len[3] == 2 && c.text[c.doc_start[3]] == 'x', "a 2-byte paragraph is a document");
    for (d = 0; d < c.n_docs; d++) {
        bad += c.doc_len[d] < 2 || c.doc_len[d] > 16;
        total += c.doc_len[d];
    }
    CHECK(bad == 0, "every document 2..16 bytes");
    CHECK(total >= (int)sizeof text - 1 - 8, "documents cover the text but its blank lines (%d of %d bytes)", total,
          (int)sizeof text - 1);
    T = gpt_pack(&c, &rng, 8, tok, tgt, cu);
    CHECK(cu[0] == 0 && cu[8] == T, "cu_seqlens spans the %d packed tokens", T);
    for (s = 0, bad = 0; s < 8; s++) {
        bad += cu[s + 1] - cu[s] < 2;
        for (i = cu[s]; i < cu[s + 1]; i++) bad += tgt[i] != (i + 1 < cu[s + 1] ? tok[i + 1] : -1);
    }
    CHECK(bad == 0, "targets are the next token inside each document, -1 on its last");
    gpt_corpus_free(&c);
    CHECK(gpt_corpus_generate(&c, 200, 64, 9) == 0 && c.n_docs == 200, "generated corpus");
    for (d = 0, bad = 0; d < c.n_docs; d++) {
        const unsigned char* t = c.text + c.doc_start[d];
        int k = 0;
        while (t[k] != '=') k++;
        for (i = k + 1; i < c.doc_len[d]; i++) bad += t[i] != t[(i - k - 1) % k];
        bad += c.doc_len[d] > 64;
    }
    CHECK(bad == 0, "generated documents are key=key repeated, at most max_len");
    gpt_corpus_free(&c);
}

/* The held-out split: every 10th document moves, bytes and all, and the training set keeps the
   others in their order; fewer than 10 documents hold none out. */
static void test_hold_out(void) {
    gpt_corpus c, all, held;
    int d, k = 0, bad = 0;
    CHECK(gpt_corpus_generate(&c, 205, 32, 5) == 0 && gpt_corpus_generate(&all, 205, 32, 5) == 0, "two equal corpora");
    CHECK(gpt_corpus_hold_out(&c, 10, &held) == 0, "hold out every 10th");
    CHECK(held.n_docs == 20 && c.n_docs == 185, "20 held out, 185 kept; got %d, %d", held.n_docs, c.n_docs);
    for (d = 0; d < all.n_docs; d++) {
        const unsigned char* src = all.text + all.doc_start[d];
        if (d % 10 == 9) {
            const int j = d / 10;
            bad += held.doc_len[j] != all.doc_len[d] || memcmp(held.text + held.doc_start[j], src, (size_t)all.doc_len[d]);
        } else {
            bad += c.doc_len[k] != all.doc_len[d] || memcmp(c.text + c.doc_start[k], src, (size_t)all.doc_len[d]);
            k++;
        }
    }
    CHECK(bad == 0 && k == c.n_docs, "documents 9, 19, ... held out, the rest kept in order (%d differ)", bad);
    gpt_corpus_free(&held);
    gpt_corpus_free(&c);
    gpt_corpus_free(&all);
    CHECK(gpt_corpus_generate(&c, 9, 32, 5) == 0 && gpt_corpus_hold_out(&c, 10, &held) == 0 && held.n_docs == 0 &&
              c.n_docs == 9,
          "nine documents: none held out");
    CHECK(gpt_corpus_hold_out(&c, 1, &held) == -1 && c.n_docs == 9, "every = 1 is refused, the corpus unchanged");
    gpt_corpus_free(&c);
}

/* The trainers' learning rate and AdamW (examples/gpt_train.h). */
static void test_train_schedule(void) {
    char* argv0[] = {(char*)"gpt", NULL};
    char* argv1[] = {(char*)"gpt", (char*)"--lr", (char*)"1e-3", (char*)"--lr-min", (char*)"1e-4", (char*)"--warmup",
                     (char*)"4", (char*)"--steps", (char*)"20", (char*)"--wd", (char*)"0.1", NULL};
    gpt_opts c;
    gpt_trainer T;
    float w[2] = {1.0f, 1.0f}, g[2] = {0, 0}, m1[2] = {0, 0}, m2[2] = {0, 0};
    const unsigned char decay[2] = {1, 0};
    size_t n, want;
    int s, bad = 0;
    double mid, last;
    CHECK(gpt_opts_parse(1, argv0, &c) == 0, "default options");
    for (s = 0; s < c.steps; s++) bad += memcmp(&c.lr, &(float){gpt_lr(&c, s)}, sizeof(float)) != 0;
    CHECK(bad == 0 && c.warmup == 0 && c.lr_min == c.lr && c.wd == 0,
          "defaults: no warm-up, no decay, every step at --lr bit for bit (%d differ)", bad);
    CHECK(gpt_opts_parse(11, argv1, &c) == 0, "--lr 1e-3 --lr-min 1e-4 --warmup 4 --steps 20 --wd 0.1");
    CHECK(gpt_lr(&c, 0) == (float)(1e-3f * 0.25) && gpt_lr(&c, 1) == (float)(1e-3f * 0.5) && gpt_lr(&c, 3) == c.lr,
          "warm-up: lr (s + 1) / 4: %g %g %g", (double)gpt_lr(&c, 0), (double)gpt_lr(&c, 1), (double)gpt_lr(&c, 3));
    CHECK(gpt_lr(&c, 4) == c.lr, "the cosine starts at lr after the warm-up: %g", (double)gpt_lr(&c, 4));
    mid = 0.5 * ((double)c.lr + (double)c.lr_min); /* step 12: half way through the 16 steps of decay */
    CHECK(fabs(gpt_lr(&c, 12) - mid) < 1e-9, "half way: (lr + lr_min) / 2 = %g, got %g", mid, (double)gpt_lr(&c, 12));
    last = (double)c.lr_min + 0.5 * ((double)c.lr - (double)c.lr_min) * (1.0 + cos(GPT_PI * 15.0 / 16.0));
    CHECK(fabs(gpt_lr(&c, 19) - last) < 1e-10 && gpt_lr(&c, 19) > c.lr_min,
          "the last step: lr_min + (lr - lr_min) (1 + cos(15 pi / 16)) / 2 = %g, got %g", last, (double)gpt_lr(&c, 19));
    for (s = 4, bad = 0; s < 19; s++) bad += !(gpt_lr(&c, s + 1) < gpt_lr(&c, s));
    CHECK(bad == 0 && gpt_lr(&c, 20) == c.lr_min, "falling every step after the warm-up, lr_min at --steps");
    /* AdamW: a zero gradient moves nothing but the decay, w (1 - lr wd), where the mask says */
    gpt_optimize(&c, w, g, m1, m2, decay, 2, 3);
    CHECK(w[0] == 1.0f - c.lr * 0.1f && w[1] == 1.0f, "decoupled decay: %.9g (want %.9g), undecayed %.9g", (double)w[0],
          (double)(1.0f - c.lr * 0.1f), (double)w[1]);
    /* the decay's mask: the matrices (embeddings, attention, MLP, LM head), not the biases and gains */
    memset(&T, 0, sizeof T);
    T.gc.vocab = 256;
    T.gc.max_T = 24;
    T.gc.C = 16;
    T.gc.n_head = 2;
    T.gc.n_block = 3;
    T.n_params = gpt_param_count(&T.gc);
    T.wbuf = gpt_init(&T.w, NULL, &T.gc, 1, NULL);
    T.decay = (unsigned char*)malloc(T.n_params);
    CHECK(T.wbuf && T.decay, "a 3-block GPT");
    if (!T.wbuf || !T.decay) return;
    gpt_decay_mask(&T, T.decay);
    for (n = 0, s = 0; n < T.n_params; n++) s += T.decay[n];
    want = (size_t)(256 + 24) * 16 + 3 * (size_t)12 * 16 * 16 + (size_t)16 * 256;
    CHECK((size_t)s == want && T.decay[0] && !T.decay[T.w.block[1].ln1_g - T.wbuf] &&
              T.decay[T.w.block[1].fc_w - T.wbuf] && !T.decay[T.w.block[1].fc_b - T.wbuf] &&
              !T.decay[T.n_params - 1],
          "%d of %zu parameters decay, want %zu", s, T.n_params, want);
    free(T.wbuf);
    free(T.decay);
}

/* (c) ------------------------------------------------------------------------------------------- */
#define NB 6            /* blocks: 8 layers, enough for p*v = 8 stages */
#define NSEQ 13
#define MAXLEN 24

static int g_split = 0; /* run_case: the GPT with its blocks' backward split (gptz) */
static pp_step_stats g_stats[4];

static void run_case(pp_schedule_kind kind, int p, int v, const int* first, const char* part, pp_shape_policy shapes,
                     const gpt_config* c, const gpt_model* w, const float* wbuf, const float* gref, float loss_ref,
                     const pp_batch* b) {
    static hx_world W;
    gpt_model g[4];
    float* gbuf[4];
    hx_sched sc;
    pp_error err;
    size_t np = gpt_param_count(c);
    int r, l, ok = 1, chunk;
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d, %s%s", pp_schedule_name(kind), p, v, b->m, part,
             g_split ? ", split blocks" : "");
    if (hx_sched_make(&sc, kind, p, v, b->m, &err) != PP_OK) {
        CHECK(0, "%s: schedule: %s", where, err.msg);
        return;
    }
    memset(&W, 0, sizeof W);
    W.model = g_split ? gptz_model_desc_depth(NB) : gpt_model_desc_depth(NB);
    W.w = w;
    W.sched = &sc.s;
    W.first = first;
    W.batch = b;
    W.stage.timeout_s = 20;
    W.stage.shapes = shapes;
    for (r = 0; r < p; r++) {
        gbuf[r] = (float*)calloc(np, sizeof(float));
        gpt_bind(&g[r], c, gbuf[r]);
        W.g[r] = &g[r];
    }
    if (hx_run(&W, p, &err) != PP_OK) {
        hx_report(&W, p, where);
        ok = 0;
    }
    memcpy(g_stats, W.stats, sizeof g_stats);
    for (l = 0; ok && l < W.model.n_layers; l++) {
        int s = 0, owner;
        size_t nl, off;
        const float* wl = gpt_layer_params(w, c, l, &nl);
        off = (size_t)(wl - wbuf);
        while (l >= first[s + 1]) s++;
        pp_schedule_stage_to_rank(&sc.s, s, &owner, &chunk);
        if (memcmp(gbuf[owner] + off, gref + off, nl * sizeof(float)) != 0) {
            CHECK(0, "%s: layer %d (%s, stage %d, rank %d): gradient differs from pp_sequential_step", where, l,
                  pp_model_layer_name(&W.model, l), s, owner);
            ok = 0;
        }
        for (r = 0; r < p; r++)
            if (r != owner && !hx_all_zero(gbuf[r] + off, nl)) {
                CHECK(0, "%s: rank %d wrote gradients of layer %d, owned by rank %d", where, r, l, owner);
                ok = 0;
            }
    }
    ok = ok && hx_loss_matches(W.stats, p, &sc.s, loss_ref, where);
    if (ok) CHECK(1, "%s", where);
    printf("pipelined = sequential, bit for bit: %-58s %s\n", where, ok ? "yes" : "NO");
    for (r = 0; r < p; r++) free(gbuf[r]);
    hx_sched_free(&sc);
}

static void test_pipelined_equals_sequential(void) {
    gpt_config c = {32, MAXLEN, 16, 2, NB};
    pp_model m = gpt_model_desc_depth(NB);
    gpt_model w, gref;
    float *wbuf, *gbuf, loss_ref = 0;
    int32_t tok[NSEQ * MAXLEN], tgt[NSEQ * MAXLEN], cu[NSEQ + 1];
    pp_batch b;
    pp_error err;
    pp_tensor sample;
    uint64_t rng = 77;
    int s, i, T = 0, first_u[9], first_c[9], var;
    /* random lengths, one of them 1 (a sequence with no target at all) */
    cu[0] = 0;
    for (s = 0; s < NSEQ; s++) {
        int L = s == 5 ? 1 : 1 + (int)(gpt_rng_next(&rng) % MAXLEN);
        for (i = 0; i < L; i++) tok[T + i] = (int32_t)(gpt_rng_next(&rng) % (uint64_t)c.vocab);
        T += L;
        cu[s + 1] = T;
    }
    make_targets(tok, cu, NSEQ, tgt);
    wbuf = gpt_init(&w, &gref, &c, 21, &gbuf);
    randomize(wbuf, gpt_param_count(&c), 23, 0.2f);
    memset(&sample, 0, sizeof sample);
    sample.rows = T / NSEQ;
    sample.cols = 1;
    sample.dtype = PP_I32;
    /* variant 0: every schedule, uniform and cost partitions, micro-batches of equal sequence
       counts, loss weighted by rows; then one configuration for each other split policy, loss
       reduction and shape policy */
    for (var = 0; var < 6; var++) {
        hx_token_batch(&b, tok, tgt, cu, NSEQ, 4, var == 1 ? PP_SPLIT_TOKENS : var == 2 ? PP_SPLIT_COST : PP_SPLIT_SEQS);
        b.loss = var == 3 ? PP_LOSS_MEAN_MICROBATCH : PP_LOSS_MEAN_ROWS;
        memset(gbuf, 0, gpt_param_count(&c) * sizeof(float));
        if (pp_sequential_step(&m, &w, &gref, &b, &loss_ref, &err) != PP_OK) {
            CHECK(0, "reference: %s", err.msg);
            break;
        }
        CHECK(loss_ref > 0 && loss_ref < 10, "reference loss %g", (double)loss_ref);
        if (var > 0) {
            static const char* const what[6] = {"", "uniform, split by tokens", "uniform, split by cost",
                                                "uniform, mean over micro-batches", "uniform, shapes broadcast",
                                                "uniform, shapes auto"};
            pp_shape_policy sp = var == 4 ? PP_SHAPES_BROADCAST : var == 5 ? PP_SHAPES_AUTO : PP_SHAPES_LOCAL;
            pp_partition_uniform(m.n_layers, 4, first_u, &err);
            run_case(PP_SCHED_1F1B, 4, 1, first_u, what[var], sp, &c, &w, wbuf, gbuf, loss_ref, &b);
            continue;
        }
        {
            static const struct { pp_schedule_kind k; int p, v; } cases[] = {
                {PP_SCHED_GPIPE, 2, 1}, {PP_SCHED_GPIPE, 4, 1}, {PP_SCHED_1F1B, 2, 1},
                {PP_SCHED_1F1B, 4, 1}, {PP_SCHED_INTERLEAVED, 2, 2}, {PP_SCHED_INTERLEAVED, 4, 2}};
            int k;
            for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
                pp_partition_desc pd;
                int S = cases[k].p * cases[k].v;
                memset(&pd, 0, sizeof pd);
                pd.policy = PP_PARTITION_COST;
                pd.n_stages = S;
                pd.sample = &sample;
                pp_partition_uniform(m.n_layers, S, first_u, &err);
                run_case(cases[k].k, cases[k].p, cases[k].v, first_u, "uniform", PP_SHAPES_LOCAL, &c, &w, wbuf, gbuf,
                         loss_ref, &b);
                if (S < m.n_layers && pp_partition_model(&m, &w, &pd, first_c, NULL, &err) == PP_OK)
                    run_case(cases[k].k, cases[k].p, cases[k].v, first_c, "cost", PP_SHAPES_LOCAL, &c, &w, wbuf,
                             gbuf, loss_ref, &b);
            }
        }
        {   /* the blocks' backward split (gptz): every schedule with W actions, and 1F1B (W inside B),
               against the fused reference; the B-only scratch (attention probabilities, qkv, pre-GELU)
               freed at B shows in the stash peak */
            static const struct { pp_schedule_kind k; int p, v; } zcases[] = {
                {PP_SCHED_1F1B, 2, 1}, {PP_SCHED_ZB_H1, 2, 1}, {PP_SCHED_ZB_H1, 4, 1}, {PP_SCHED_ZB_H2, 4, 1},
                {PP_SCHED_ZB_V, 2, 2}, {PP_SCHED_V_HALF, 2, 2}, {PP_SCHED_V_MIN, 2, 2}, {PP_SCHED_DUALPIPE_V, 2, 2}};
            pp_model mz = gptz_model_desc_depth(NB);
            int k, less = 0;
            char peaks[160] = "";
            CHECK(mz.weight_grad != NULL && mz.n_layers == m.n_layers && sizeof(gptz_model) == sizeof(gpt_model),
                  "gptz: split, same layers and layout as gpt");
            {   /* its sequential run equals the fused one bit for bit */
                float* g2 = (float*)calloc(gpt_param_count(&c), sizeof(float));
                gpt_model gz;
                float lz = 0;
                gpt_bind(&gz, &c, g2);
                CHECK(pp_sequential_step(&mz, &w, &gz, &b, &lz, &err) == PP_OK, "gptz reference: %s", err.msg);
                CHECK(lz == loss_ref && memcmp(g2, gbuf, gpt_param_count(&c) * sizeof(float)) == 0,
                      "gptz's sequential step differs from gpt's");
                free(g2);
            }
            g_split = 1;
            for (k = 0; k < (int)(sizeof zcases / sizeof zcases[0]); k++) {
                pp_partition_uniform(m.n_layers, zcases[k].p * zcases[k].v, first_u, &err);
                run_case(zcases[k].k, zcases[k].p, zcases[k].v, first_u, "uniform", PP_SHAPES_LOCAL, &c, &w, wbuf, gbuf,
                         loss_ref, &b);
                if (zcases[k].k == PP_SCHED_ZB_H2) { /* W waits: the B-only share is freed early */
                    int r;
                    for (r = 0; r < 4; r++) {
                        size_t n = strlen(peaks);
                        less += g_stats[r].peak_mem < g_stats[r].peak_live - 1e-9;
                        snprintf(peaks + n, sizeof peaks - n, " r%d %d/%.2f", r, g_stats[r].peak_live, g_stats[r].peak_mem);
                    }
                }
            }
            g_split = 0;
            CHECK(less > 0, "gptz zb-h2: no rank's stash peak gained from the B-only scratch");
            printf("gpt, blocks split, zb-h2 p=4 m=4: stashes alive / their memory in stashes at the peak (B-only "
                   "scratch freed at B):%s\n", peaks);
        }
    }
    free(wbuf);
    free(gbuf);
}

int main(void) {
    test_finite_differences();
    test_bf16();
    test_boundaries();
    test_describe();
    test_data();
    test_hold_out();
    test_train_schedule();
    test_pipelined_equals_sequential();
    return TEST_DONE("gpt");
}
