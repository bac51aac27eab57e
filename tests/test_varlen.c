/* tests/test_varlen.c - packed variable-length micro-batches, shape policies, several tensors.

   - split policies: whole contiguous sequences, rebased cu_seqlens, token/cost balance equal
     to the brute-force optimum;
   - pipelined gradients and loss equal the sequential reference bit for bit for packed
     batches of random lengths, every schedule x every shape policy, over three steps whose
     shapes change (the last one a partial batch with fewer sequences);
   - the bytes on the wire are exactly the activations and gradients between ranks (none at
     the turn of the V), plus the policy's metadata, and the number of metadata messages is 0
     (LOCAL), p-1 per step (BROADCAST), one per activation transfer (PER_MESSAGE), and only on
     new or changed shapes (AUTO);
   - a model whose stages pass three tensors of different shapes and dtypes (two float paths,
     one per-sequence tensor, an int32 tensor that only the last layer reads). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#define MLP_DEPTH 7
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define IN 6
#define CLASSES 5
static const int DIMS[MLP_DEPTH + 1] = {IN, 8, 7, 9, 8, 6, 8, CLASSES};

/* The MLP with B-only scratch (pp_layer_desc.b_saved_bytes, sized by the micro-batch's rows):
   forward keeps tanh's derivative there, backward checks it is intact before the dense backward.
   Its gradients are the MLP's bit for bit; test_policies runs every other case on it, so the
   scratch is sized from the shapes each policy learns (a block too small overflows under ASan or
   fails the check). */
static int densv_fwd(const dense_params* p, pp_layer_io* io) {
    float* sc = (float*)io->b_saved;
    const float* y = (const float*)io->out[0].data;
    int64_t i, n = io->out[0].rows * p->out;
    int rc = dense_fwd(p, io);
    if (rc || !sc || io->b_saved_bytes != (size_t)n * sizeof(float)) return rc ? rc : 5;
    for (i = 0; i < n; i++) sc[i] = p->tanh_act ? 1.0f - y[i] * y[i] : 1.0f;
    return 0;
}
static int densv_bwd(const dense_params* p, dense_params* g, pp_layer_io* io) {
    const float* sc = (const float*)io->b_saved;
    const float* y = (const float*)io->out[0].data;
    int64_t i, n = io->out[0].rows * p->out;
    if (!sc || io->b_saved_bytes != (size_t)n * sizeof(float)) return 5;
    for (i = 0; i < n; i++)
        if (sc[i] != (p->tanh_act ? 1.0f - y[i] * y[i] : 1.0f)) return 7;
    return dense_bwd(p, g, io);
}
static void densv_desc(const dense_params* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    dense_desc(p, mb, in, n_in, d);
    d->b_saved_bytes = (size_t)in[0].rows * (size_t)p->out * sizeof(float);
}
#define MLPV_LAYERS(X)                                                 \
    X(dense, dense_params, densv_fwd, densv_bwd, densv_desc, MLP_DEPTH) \
    X(xent, xent_params, xent_fwd, xent_bwd, xent_desc, 1)
PP_MODEL(mlpv, MLPV_LAYERS)

static uint64_t g_rng = 12345;
static int rnd(int n) { return (int)(mlp_rng_next(&g_rng) % (uint64_t)n); }

/* ---- split policies ---------------------------------------------------------------------- */
static double brute_minmax(const double* w, int n, int m, int from) {
    double best = 1e300, acc = 0;
    int e;
    if (m == 1) {
        for (e = from; e < n; e++) acc += w[e];
        return acc;
    }
    for (e = from + 1; e <= n - (m - 1); e++) {
        double r;
        acc += w[e - 1];
        r = brute_minmax(w, n, m - 1, e);
        r = r > acc ? r : acc;
        if (r < best) best = r;
    }
    return best;
}

static void test_split(void) {
    int it, bad = 0;
    for (it = 0; it < 400; it++) {
        int n = 1 + rnd(10), m = 1 + rnd(n), i, j, pol = rnd(3);
        int32_t cu[16], cub[32];
        double w[16], worst = 0;
        pp_microbatch mbs[16];
        pp_batch b;
        pp_error err;
        cu[0] = 0;
        for (i = 0; i < n; i++) cu[i + 1] = cu[i] + 1 + (rnd(4) == 0 ? rnd(200) : rnd(12)); /* long-tailed */
        memset(&b, 0, sizeof b);
        b.m = m;
        b.input.rows = cu[n];
        b.input.cols = 1;
        b.input.dtype = PP_F32;
        b.cu_seqlens = cu;
        b.n_seqs = n;
        b.split = (pp_split_policy)pol;
        if (pp_batch_split(&b, mbs, cub, &err) != PP_OK) {
            CHECK(0, "split n=%d m=%d: %s", n, m, err.msg);
            continue;
        }
        /* contiguous, whole sequences, rebased */
        for (i = 0, j = 0; i < m; i++) {
            int k;
            if (mbs[i].n_seqs < 1 || mbs[i].cu_seqlens[0] != 0 || mbs[i].row0 != cu[j]) bad++;
            for (k = 0; k < mbs[i].n_seqs; k++, j++)
                if (mbs[i].cu_seqlens[k + 1] - mbs[i].cu_seqlens[k] != cu[j + 1] - cu[j]) bad++;
            if (mbs[i].rows != mbs[i].cu_seqlens[mbs[i].n_seqs]) bad++;
        }
        if (j != n) bad++;
        if (pol == PP_SPLIT_SEQS) continue;
        for (i = 0; i < n; i++) {
            double len = cu[i + 1] - cu[i];
            w[i] = pol == PP_SPLIT_TOKENS ? len : len + len * len / 64;
        }
        for (i = 0; i < m; i++) {
            double c = 0;
            int k;
            for (k = 0; k < mbs[i].n_seqs; k++) {
                double len = mbs[i].cu_seqlens[k + 1] - mbs[i].cu_seqlens[k];
                c += pol == PP_SPLIT_TOKENS ? len : len + len * len / 64;
            }
            if (c > worst) worst = c;
        }
        if (worst != brute_minmax(w, n, m, 0)) {
            bad++;
            printf("policy %d n=%d m=%d: worst %g, optimum %g\n", pol, n, m, worst, brute_minmax(w, n, m, 0));
        }
        CHECK(pp_batch_split_imbalance(&b, mbs) >= 1.0, "imbalance >= 1");
    }
    CHECK(bad == 0, "%d split properties violated", bad);
}

/* ---- pipelined runs over several steps ---------------------------------------------------- */
#define MAXROWS 400
#define MAXSEQ 40
typedef struct step_data {
    float x[MAXROWS * IN];
    int32_t y[MAXROWS];
    int32_t cu[MAXSEQ + 1];
    pp_batch b;
} step_data;

/* A run of n steps: each rank's batch of step i, and its stats. */
typedef struct vl_run {
    hx_steps S;
    pp_step_stats stats[8 * 4];   /* [rank * n_steps + step] */
} vl_run;

/* The world of n_steps steps of `steps` on p ranks. */
static void vl_world(hx_world* W, vl_run* V, pp_model model, const void* w, const pp_schedule* sched, const int* first,
                     pp_shape_policy pol, step_data* steps, int n_steps) {
    memset(W, 0, sizeof *W);
    memset(V, 0, sizeof *V);
    W->model = model;
    W->w = w;
    W->sched = sched;
    W->first = first;
    W->stage.timeout_s = 20;
    W->stage.shapes = pol;
    W->stage.max_seqs = MAXSEQ;
    V->S.first = &steps[0].b;
    V->S.stride = sizeof *steps;
    V->S.hide_meta = pol == PP_SHAPES_BROADCAST;
    V->S.stats = V->stats;
    hx_world_steps(W, &V->S, n_steps);
}

static void make_step(step_data* s, int n_seqs, int m, uint64_t seed) {
    int i;
    s->cu[0] = 0;
    for (i = 0; i < n_seqs; i++) s->cu[i + 1] = s->cu[i] + 1 + rnd(rnd(3) == 0 ? 24 : 6);
    mlp_make_data(s->x, s->y, s->cu[n_seqs], IN, CLASSES, seed, 77);
    hx_dense_batch(&s->b, s->x, s->y, s->cu[n_seqs], IN, m);
    s->b.cu_seqlens = s->cu;
    s->b.n_seqs = n_seqs;
    s->b.split = (pp_split_policy)rnd(3);
    s->b.loss = PP_LOSS_MEAN_ROWS;
}

/* Boundary s (stage s-1 to s) joins two ranks: the executor hands a boundary within one rank
   over in place (the turn of the V map, every boundary at p = 1), nothing is sent there. */
static int crosses(const pp_schedule* sc, int s) {
    int ra, rb;
    pp_schedule_stage_to_rank(sc, s - 1, &ra, NULL);
    pp_schedule_stage_to_rank(sc, s, &rb, NULL);
    return ra != rb;
}

static int n_crossing(const pp_schedule* sc) {
    int s, n = 0;
    for (s = 1; s < sc->n_stages; s++) n += crosses(sc, s);
    return n;
}

/* Bytes every rank together must send in one step: activations forward (float and integer)
   and gradients back (float only), at every boundary between two ranks, for every micro-batch. */
static uint64_t wire_bytes(const pp_model* m, const void* w, const pp_batch* b, const int* first, const pp_schedule* sc) {
    int S = sc->n_stages;
    pp_microbatch mbs[64];
    int32_t cu[MAXSEQ + 64];
    uint64_t total = 0;
    int i, l, s, k;
    pp_error err;
    pp_batch_split(b, mbs, cu, &err);
    for (i = 0; i < b->m; i++) {
        pp_tensor in[PP_MAX_TENSORS];
        int n_in = 1;
        in[0] = b->input;
        in[0].rows = mbs[i].rows;
        for (l = 0; l < m->n_layers; l++) {
            pp_layer_desc d;
            for (s = 1; s < S; s++)
                if (l == first[s] && crosses(sc, s)) /* the input of a stage's first layer crosses */
                    for (k = 0; k < n_in; k++)
                        total += pp_tensor_bytes(&in[k]) * (pp_dtype_is_float(in[k].dtype) ? 2u : 1u);
            memset(&d, 0, sizeof d);
            m->describe(w, l, &mbs[i], in, n_in, &d);
            n_in = d.n_out;
            memcpy(in, d.out, sizeof in);
        }
    }
    return total;
}

static int run_policy_case(pp_model model, const void* w, void* gref_flat_w, size_t nparams,
                           void* (*make_grads)(void** keep), pp_schedule_kind kind, int p, int v, int m,
                           pp_shape_policy pol, step_data* steps, int n_steps, const float* gref, const float* loss_ref) {
    static hx_world W;
    static vl_run V;
    pp_action acts[2 * 64 * 8];
    pp_schedule sched;
    pp_error err;
    int first[32], r, i, ok = 1, last_rank, chunk, S = p * v;
    void* keep[8];
    uint64_t sent_total = 0;
    (void)gref_flat_w;
    pp_schedule_make(kind, p, v, m, acts, sizeof acts / sizeof acts[0], &sched, &err);
    if (getenv("VERBOSE")) fprintf(stderr, "case %s p=%d v=%d m=%d policy %d\n", pp_schedule_name(kind), p, v, m, pol);
    pp_partition_uniform(model.n_layers, S, first, &err);
    vl_world(&W, &V, model, w, &sched, first, pol, steps, n_steps);
    for (r = 0; r < p; r++) W.g[r] = make_grads(&keep[r]);
    pp_threads_create(p, &W.threads, &err);
    if (hx_run(&W, p, &err) != PP_OK) {
        char where[120];
        snprintf(where, sizeof where, "%s p=%d v=%d m=%d policy %d", pp_schedule_name(kind), p, v, m, pol);
        hx_report(&W, p, where);
        ok = 0;
    }
    pp_schedule_stage_to_rank(&sched, S - 1, &last_rank, &chunk);
    if (ok) {
        /* gradients: sum of every rank's buffer (disjoint layers) equals the reference */
        size_t j;
        for (j = 0; j < nparams && ok; j++) {
            float acc = 0, zero = 0;
            int owners = 0;
            for (r = 0; r < p; r++)
                if (memcmp(&((float*)keep[r])[j], &zero, sizeof zero) != 0) {
                    acc = ((float*)keep[r])[j];
                    owners++;
                }
            if (owners > 1 || memcmp(&acc, &gref[j], sizeof(float)) != 0) {
                CHECK(0, "%s p=%d v=%d m=%d policy %d: gradient %zu differs (%g vs %g, %d owners)", pp_schedule_name(kind), p,
                      v, m, pol, j, acc, gref[j], owners);
                ok = 0;
            }
        }
        for (i = 0; i < n_steps && ok; i++)
            if (memcmp(&V.stats[last_rank * W.steps + i].loss, &loss_ref[i], sizeof(float)) != 0) {
                CHECK(0, "%s p=%d v=%d m=%d policy %d: step %d loss %.9g != %.9g", pp_schedule_name(kind), p, v, m, pol, i,
                      V.stats[last_rank * W.steps + i].loss, loss_ref[i]);
                ok = 0;
            }
    }
    /* byte and message accounting, step by step */
    for (i = 0; i < n_steps && ok; i++) {
        uint64_t data = wire_bytes(&model, w, &steps[i].b, first, &sched), sent = 0, meta = 0, agree = 0, meta_msgs = 0, expect_msgs = 0;
        for (r = 0; r < p; r++) {
            sent += V.stats[r * W.steps + i].bytes_sent;
            meta += V.stats[r * W.steps + i].meta_bytes_sent;
            agree += V.stats[r * W.steps + i].agree_bytes;
            meta_msgs += V.stats[r * W.steps + i].meta_msgs_sent;
        }
        sent_total += sent;
        if (sent - meta - agree != data) {
            CHECK(0, "policy %d step %d: %llu data bytes sent, the activations and gradients are %llu", pol, i,
                  (unsigned long long)(sent - meta), (unsigned long long)data);
            ok = 0;
        }
        switch (pol) {
        case PP_SHAPES_LOCAL: expect_msgs = 0; break;
        case PP_SHAPES_BROADCAST: expect_msgs = (uint64_t)(p - 1); break;
        case PP_SHAPES_PER_MESSAGE: expect_msgs = (uint64_t)n_crossing(&sched) * m; break;
        case PP_SHAPES_AUTO: expect_msgs = meta_msgs; break; /* checked below */
        }
        if (pol == PP_SHAPES_AUTO) {
            /* step 0 learns every boundary: one header per transfer; the trailers ride along */
            if (i == 0) expect_msgs = (uint64_t)n_crossing(&sched) * m;
        }
        if (meta_msgs != expect_msgs) {
            CHECK(0, "policy %d step %d: %llu metadata messages, want %llu", pol, i, (unsigned long long)meta_msgs,
                  (unsigned long long)expect_msgs);
            ok = 0;
        }
    }
    {
        uint64_t wire = 0;
        for (r = 0; r < p; r++) {
            uint64_t bts = 0;
            pp_threads_counters(W.threads, r, &bts, NULL);
            wire += bts;
        }
        if (ok && wire != sent_total) {
            CHECK(0, "transport saw %llu bytes, the stages reported %llu", (unsigned long long)wire,
                  (unsigned long long)sent_total);
            ok = 0;
        }
    }
    pp_threads_destroy(W.threads);
    for (r = 0; r < p; r++) free(keep[r]);
    if (ok) CHECK(1, "ok");
    return ok;
}

static mlp_model g_w;
static void* mlp_grads(void** keep) {
    static mlp_model g[8];
    static int next;
    mlp_model* gg = &g[next++ % 8];
    mlp_model tmp;
    float* buf;
    free(mlp_init(&tmp, gg, DIMS, 1, &buf));
    *keep = buf;
    return gg;
}

static void test_policies(void) {
    static step_data steps[3];
    mlp_model gref;
    float *wbuf, *gbuf, loss_ref[3];
    pp_model model = mlp_model_desc();
    pp_error err;
    int i, kind, pol, cases = 0, good = 0;
    static const int pv[][3] = {{2, 1, 0}, {4, 1, 0}, {3, 1, 0}, {2, 2, 1}, {3, 2, 1}};
    wbuf = mlp_init(&g_w, &gref, DIMS, 8, &gbuf);
    for (pol = 0; pol < 4; pol++) {
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (i = 0; i < 5; i++) {
                int p = pv[i][0], v = pv[i][1], m = 4 + rnd(4), s;
                if (!pp_schedule_size((pp_schedule_kind)kind, p, v, 4)) continue; /* not a v this kind runs */
                /* three steps: random packed lengths, other lengths, then a partial batch */
                make_step(&steps[0], 12 + rnd(20), m, 1);
                make_step(&steps[1], 12 + rnd(20), m, 2);
                make_step(&steps[2], m + rnd(3), m, 3);
                memset(gbuf, 0, sizeof(float) * mlp_param_count(DIMS));
                for (s = 0; s < 3; s++)
                    if (pp_sequential_step(&model, &g_w, &gref, &steps[s].b, &loss_ref[s], &err) != PP_OK)
                        CHECK(0, "reference: %s", err.msg);
                cases++;
                good += run_policy_case(cases % 2 ? model : mlpv_model_desc(), &g_w, NULL, mlp_param_count(DIMS), mlp_grads, (pp_schedule_kind)kind, p, v, m,
                                        (pp_shape_policy)pol, steps, 3, gbuf, loss_ref);
            }
    }
    printf("packed batches: %d of %d (schedule, p, v, policy) runs bit-exact with exact byte counts (half of them with "
           "B-only scratch)\n", good, cases);
    free(wbuf);
    free(gbuf);
}

/* AUTO sends metadata only when a shape is new or changed. */
static void test_auto_messages(void) {
    static step_data steps[4];
    static hx_world W;
    static vl_run V;
    pp_action acts[64];
    pp_schedule sched;
    pp_error err;
    mlp_model gref;
    float *wbuf, *gbuf;
    int first[3], r, i, m = 3;
    void* keep[2];
    uint64_t msgs[4] = {0, 0, 0, 0};
    wbuf = mlp_init(&g_w, &gref, DIMS, 8, &gbuf);
    make_step(&steps[0], 9, m, 1);
    steps[1] = steps[0];  /* same shapes */
    steps[1].b.input.data = steps[1].x;
    steps[1].b.targets = steps[1].y;
    steps[1].b.cu_seqlens = steps[1].cu;
    steps[2] = steps[1];
    steps[2].b.input.data = steps[2].x;
    steps[2].b.targets = steps[2].y;
    steps[2].b.cu_seqlens = steps[2].cu;
    steps[2].cu[9] -= 1;  /* the last sequence one token shorter: only micro-batch 2 changes */
    steps[2].b.input.rows -= 1;
    steps[3] = steps[2];
    steps[3].b.input.data = steps[3].x;
    steps[3].b.targets = steps[3].y;
    steps[3].b.cu_seqlens = steps[3].cu;
    for (i = 0; i < 4; i++) steps[i].b.split = PP_SPLIT_SEQS;
    pp_schedule_make(PP_SCHED_1F1B, 2, 1, m, acts, 64, &sched, &err);
    pp_partition_uniform(MLP_DEPTH + 1, 2, first, &err);
    vl_world(&W, &V, mlp_model_desc(), &g_w, &sched, first, PP_SHAPES_AUTO, steps, 4);
    for (r = 0; r < 2; r++) W.g[r] = mlp_grads(&keep[r]);
    CHECK(hx_run(&W, 2, &err) == PP_OK, "auto run: %s / %s", W.msg[0], W.msg[1]);
    for (i = 0; i < 4; i++) msgs[i] = V.stats[0 * W.steps + i].meta_msgs_sent + V.stats[1 * W.steps + i].meta_msgs_sent;
    CHECK(msgs[0] == 3, "first step: one header per micro-batch, got %llu", (unsigned long long)msgs[0]);
    CHECK(msgs[1] == 0, "same shapes: no metadata message, got %llu", (unsigned long long)msgs[1]);
    CHECK(msgs[2] == 2, "one micro-batch shorter: a resize notice and a header, got %llu", (unsigned long long)msgs[2]);
    CHECK(msgs[3] == 0, "the new shape is learned, got %llu", (unsigned long long)msgs[3]);
    for (r = 0; r < 2; r++) free(keep[r]);
    free(wbuf);
    free(gbuf);
}

/* ---- several tensors per boundary -------------------------------------------------------- */
/* Boundary after `fork`: a [T, C] f32, b [T, C] f32, s [n_seqs, 2] f32 (per sequence), pos [T, 1]
   i32 (position in its sequence). `mix` layers update a and b and pass s and pos through
   untouched; `join` (the loss) reads all four. */
typedef struct fork_p {
    int c;
} fork_p;
typedef struct mix_p {
    int c;
    float* w; /* (c) */
} mix_p;
typedef struct join_p {
    int c;
} join_p;

static void fork_desc(const fork_p* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)n_in;
    d->n_out = 4;
    d->out[0].rows = d->out[1].rows = d->out[3].rows = in[0].rows;
    d->out[0].cols = d->out[1].cols = p->c;
    d->out[0].dtype = d->out[1].dtype = d->out[2].dtype = PP_F32;
    d->out[2].rows = mb->n_seqs > 0 ? mb->n_seqs : 1;
    d->out[2].cols = 2;
    d->out[3].cols = 1;
    d->out[3].dtype = PP_I32;
}
static int fork_fwd(const fork_p* p, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data; /* (T, c) */
    float *a = (float*)io->out[0].data, *b = (float*)io->out[1].data, *s = (float*)io->out[2].data;
    int32_t* pos = (int32_t*)io->out[3].data;
    int64_t t, T = io->in[0].rows;
    int k, q;
    for (t = 0; t < T * p->c; t++) {
        a[t] = x[t];
        b[t] = 0.5f * x[t];
    }
    for (q = 0; q < (int)io->out[2].rows; q++) {
        int64_t s0 = io->mb->cu_seqlens ? io->mb->cu_seqlens[q] : 0;
        int64_t s1 = io->mb->cu_seqlens ? io->mb->cu_seqlens[q + 1] : T;
        s[2 * q] = (float)(s1 - s0);
        s[2 * q + 1] = 0;
        for (t = s0; t < s1; t++) {
            pos[t] = (int32_t)(t - s0);
            for (k = 0; k < p->c; k++) s[2 * q + 1] += x[t * p->c + k];
        }
    }
    return 0;
}
static int fork_bwd(const fork_p* p, fork_p* g, pp_layer_io* io) {
    (void)p;
    (void)g;
    (void)io; /* the model input gets no gradient */
    return 0;
}
static void mix_desc(const mix_p* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    int k;
    (void)p;
    (void)mb;
    d->n_out = n_in;
    for (k = 0; k < n_in; k++) d->out[k] = in[k];
    d->n_params = p->c;
}
static int mix_fwd(const mix_p* p, pp_layer_io* io) {
    const float *a = (const float*)io->in[0].data, *b = (const float*)io->in[1].data;
    float *a2 = (float*)io->out[0].data, *b2 = (float*)io->out[1].data;
    int64_t t, T = io->in[0].rows;
    int k;
    if (io->n_in != 4 || io->in[3].dtype != PP_I32) return 5;
    for (t = 0; t < T; t++)
        for (k = 0; k < p->c; k++) {
            a2[t * p->c + k] = tanhf(p->w[k] * a[t * p->c + k]) + b[t * p->c + k];
            b2[t * p->c + k] = b[t * p->c + k] * 0.9f + 0.1f * a[t * p->c + k];
        }
    memcpy(io->out[2].data, io->in[2].data, pp_tensor_bytes(&io->in[2]));
    memcpy(io->out[3].data, io->in[3].data, pp_tensor_bytes(&io->in[3]));
    return 0;
}
static int mix_bwd(const mix_p* p, mix_p* g, pp_layer_io* io) {
    const float *a = (const float*)io->in[0].data;
    const float *da2 = (const float*)io->d_out[0].data, *db2 = (const float*)io->d_out[1].data;
    float *da = (float*)io->d_in[0].data, *db = (float*)io->d_in[1].data;
    int64_t t, T = io->in[0].rows;
    int k;
    if (io->d_in[3].data != NULL || io->d_out[3].data != NULL) return 6; /* int32: no gradient */
    for (t = 0; t < T; t++)
        for (k = 0; k < p->c; k++) {
            int64_t i = t * p->c + k;
            float th = tanhf(p->w[k] * a[i]), dt = da2[i] * (1 - th * th);
            g->w[k] += dt * a[i];
            if (da) da[i] += dt * p->w[k] + 0.1f * db2[i];
            if (db) db[i] += da2[i] + 0.9f * db2[i];
        }
    /* s passes through: its gradient flows back unchanged */
    if (io->d_in[2].data)
        for (t = 0; t < io->in[2].rows * 2; t++) ((float*)io->d_in[2].data)[t] += ((const float*)io->d_out[2].data)[t];
    return 0;
}
static void join_desc(const join_p* p, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)p;
    (void)mb;
    (void)in;
    (void)n_in;
    d->n_out = 0;
}
/* loss = mean over tokens of (sum_k a*b) * (1 + pos/8) + mean over sequences of s1 * s0 / 100 */
static int join_fwd(const join_p* p, pp_layer_io* io) {
    const float *a = (const float*)io->in[0].data, *b = (const float*)io->in[1].data, *s = (const float*)io->in[2].data;
    const int32_t* pos = (const int32_t*)io->in[3].data;
    int64_t t, T = io->in[0].rows, q, Q = io->in[2].rows;
    double l = 0, ls = 0;
    int k;
    for (t = 0; t < T; t++)
        for (k = 0; k < p->c; k++) l += (double)a[t * p->c + k] * b[t * p->c + k] * (1 + pos[t] / 8.0);
    for (q = 0; q < Q; q++) ls += (double)s[2 * q] * s[2 * q + 1] / 100.0;
    io->loss = (float)(l / (double)T + ls / (double)Q);
    return 0;
}
static int join_bwd(const join_p* p, join_p* g, pp_layer_io* io) {
    const float *a = (const float*)io->in[0].data, *b = (const float*)io->in[1].data, *s = (const float*)io->in[2].data;
    const int32_t* pos = (const int32_t*)io->in[3].data;
    float *da = (float*)io->d_in[0].data, *db = (float*)io->d_in[1].data, *ds = (float*)io->d_in[2].data;
    int64_t t, T = io->in[0].rows, q, Q = io->in[2].rows;
    float sc = io->mb->loss_scale;
    int k;
    (void)g;
    for (t = 0; t < T; t++)
        for (k = 0; k < p->c; k++) {
            float f = sc * (1 + pos[t] / 8.0f) / (float)T;
            da[t * p->c + k] = f * b[t * p->c + k];
            db[t * p->c + k] = f * a[t * p->c + k];
        }
    for (q = 0; q < Q; q++) {
        ds[2 * q] = sc * s[2 * q + 1] / 100.0f / (float)Q;
        ds[2 * q + 1] = sc * s[2 * q] / 100.0f / (float)Q;
    }
    return 0;
}
#define DUAL_LAYERS(X)                                     \
    X(fork, fork_p, fork_fwd, fork_bwd, fork_desc, 1)      \
    X(mix, mix_p, mix_fwd, mix_bwd, mix_desc, 6)           \
    X(join, join_p, join_fwd, join_bwd, join_desc, 1)
PP_MODEL(dual, DUAL_LAYERS)

#define DC 3
static dual_model g_dual;
static float g_dual_w[6 * DC];
static void* dual_grads(void** keep) {
    static dual_model g[8];
    static int next;
    dual_model* gg = &g[next++ % 8];
    float* buf = (float*)calloc(6 * DC, sizeof(float));
    int l;
    *gg = g_dual;
    for (l = 0; l < 6; l++) gg->mix[l].w = buf + l * DC;
    *keep = buf;
    return gg;
}

static void test_multi_tensor(void) {
    static step_data steps[3];
    dual_model gref;
    float gbuf[6 * DC], loss_ref[3];
    pp_model model = dual_model_desc();
    pp_error err;
    int l, i, s, pol, cases = 0, good = 0;
    g_dual.fork[0].c = DC;
    g_dual.join[0].c = DC;
    for (l = 0; l < 6 * DC; l++) g_dual_w[l] = 0.5f + 0.1f * (float)(l % 7);
    for (l = 0; l < 6; l++) {
        g_dual.mix[l].c = DC;
        g_dual.mix[l].w = g_dual_w + l * DC;
    }
    gref = g_dual;
    for (l = 0; l < 6; l++) gref.mix[l].w = gbuf + l * DC;
    for (pol = 0; pol < 4; pol++)
        for (i = 0; i < 3; i++) {
            static const int cfg[3][3] = {{PP_SCHED_1F1B, 4, 1}, {PP_SCHED_GPIPE, 2, 1}, {PP_SCHED_INTERLEAVED, 2, 2}};
            int m = 3 + rnd(3);
            for (s = 0; s < 3; s++) {
                make_step(&steps[s], (s == 2 ? m : 10 + rnd(10)), m, (uint64_t)s + 10);
                steps[s].b.input.cols = DC; /* x is [T, 3]: reuse the generator's first columns */
            }
            memset(gbuf, 0, sizeof gbuf);
            for (s = 0; s < 3; s++)
                if (pp_sequential_step(&model, &g_dual, &gref, &steps[s].b, &loss_ref[s], &err) != PP_OK)
                    CHECK(0, "dual reference: %s", err.msg);
            cases++;
            good += run_policy_case(model, &g_dual, NULL, 6 * DC, dual_grads, (pp_schedule_kind)cfg[i][0], cfg[i][1],
                                    cfg[i][2], m, (pp_shape_policy)pol, steps, 3, gbuf, loss_ref);
        }
    printf("several tensors per boundary: %d of %d runs bit-exact\n", good, cases);
}

int main(void) {
    test_split();
    test_policies();
    test_auto_messages();
    test_multi_tensor();
    return TEST_DONE("varlen");
}
