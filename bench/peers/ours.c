/* bench/peers/ours.c - the pipeline.h side of the peer comparison (bench/peers/run_peers.py).

   The model is the CPU example's MLP (examples/mlp.h): L dense layers, y = tanh(x W + b) except
   the last, then a softmax cross-entropy. Here the layer count is a run-time flag and the matmul
   is a choice: OpenBLAS's cblas_sgemm when built with -DPEERS_CBLAS (make bench-peers does that
   when it finds OpenBLAS), else a naive triple loop (the example's kernel). Each stage is a
   thread of the threads transport, one BLAS thread each (set OPENBLAS_NUM_THREADS=1; the driver
   does).

   The dense layers are split into p*v stages as torch's side splits them: stage s gets layers
   [s*L/S, (s+1)*L/S), and the loss goes with the last stage.

   One invocation runs one configuration and prints one line "RESULT {json}":
   - the sequential reference (all micro-batches, one thread): T_seq, median of --steps;
   - the pipeline: T_pipe = median over steps of the slowest rank's step; efficiency
     T_seq / (p * T_pipe); peak stash bytes per rank; #wrong = steps whose loss is not
     bit-identical to the sequential one;
   - host time per action: the same p, m and schedule on a width-1 model (in = hidden = 1,
     2 classes, m rows), step time / actions per rank: what the executor and transport cost
     when there is nothing to compute.
   With --lengths FILE (one line per step: the sequence lengths) the batch is packed: the
   tokens of the step's sequences, cu_seqlens, micro-batches of whole sequences balanced by
   tokens, and the MLP applied per token; the result adds tokens/s (real tokens).

     build/peers_ours [--schedule gpipe|1f1b|interleaved] [-p 4] [-v 2] [-m 32] [--layers 16]
                      [--in 64] [--hidden 256] [--classes 16] [--rows 1024] [--steps 10]
                      [--warmup 3] [--lengths FILE] [--no-overhead] */
#define PIPELINE_IMPLEMENTATION
#include "../../pipeline.h"
#include "../../examples/mlp.h" /* its loss layer (xent) and generator (splitmix) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tests/harness.h"

#ifdef PEERS_CBLAS
#include <cblas.h>
#define PEERS_KERNEL "openblas"
#else
#define PEERS_KERNEL "naive"
#endif

#define MAXL 256

typedef struct pdense {
    int in, out, tanh_act;
    float* w;               /* (in, out) */
    float* b;               /* (out) */
} pdense;

typedef struct pnet {
    int L;                  /* dense layers; layer L is the loss */
    int classes;
    pdense dense[MAXL];
} pnet;

/* ---- matmuls: C (M,N) (+)= op(A) op(B), row-major ----------------------------------------- */
/* y (M,N) = x (M,K) W (K,N) + y */
static void mm_nn(int M, int N, int K, const float* x, const float* W, float* y) {
#ifdef PEERS_CBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, x, K, W, N, 1.0f, y, N);
#else
    int r, k, n;
    for (r = 0; r < M; r++)
        for (k = 0; k < K; k++) {
            const float a = x[(size_t)r * K + k];
            const float* wk = W + (size_t)k * N;
            float* yr = y + (size_t)r * N;
            for (n = 0; n < N; n++) yr[n] += a * wk[n];
        }
#endif
}
/* gW (K,N) += x^T (K,M) dz (M,N) */
static void mm_tn(int M, int N, int K, const float* x, const float* dz, float* gW) {
#ifdef PEERS_CBLAS
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, M, 1.0f, x, K, dz, N, 1.0f, gW, N);
#else
    int r, k, n;
    for (r = 0; r < M; r++)
        for (k = 0; k < K; k++) {
            const float a = x[(size_t)r * K + k];
            const float* dr = dz + (size_t)r * N;
            float* gk = gW + (size_t)k * N;
            for (n = 0; n < N; n++) gk[n] += a * dr[n];
        }
#endif
}
/* dx (M,K) = dz (M,N) W^T (N,K) */
static void mm_nt(int M, int N, int K, const float* dz, const float* W, float* dx) {
#ifdef PEERS_CBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, N, 1.0f, dz, N, W, N, 0.0f, dx, K);
#else
    int r, k, n;
    for (r = 0; r < M; r++)
        for (k = 0; k < K; k++) {
            const float* dr = dz + (size_t)r * N;
            const float* wk = W + (size_t)k * N;
            float acc = 0;
            for (n = 0; n < N; n++) acc += dr[n] * wk[n];
            dx[(size_t)r * K + k] = acc;
        }
#endif
}

/* ---- layers -------------------------------------------------------------------------------- */
static int pdense_fwd(const pdense* p, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;     /* (rows, in) */
    float* y = (float*)io->out[0].data;                /* (rows, out) */
    int rows = (int)io->in[0].rows, r, o;
    if (io->in[0].cols != p->in) return 1;
    for (r = 0; r < rows; r++) memcpy(y + (size_t)r * p->out, p->b, sizeof(float) * (size_t)p->out);
    mm_nn(rows, p->out, p->in, x, p->w, y);
    if (p->tanh_act)
        for (r = 0; r < rows; r++)
            for (o = 0; o < p->out; o++) y[(size_t)r * p->out + o] = tanhf(y[(size_t)r * p->out + o]);
    return 0;
}

static int pdense_bwd(const pdense* p, pdense* g, pp_layer_io* io) {
    const float* x = (const float*)io->in[0].data;     /* (rows, in) */
    const float* y = (const float*)io->out[0].data;    /* (rows, out) */
    const float* dy = (const float*)io->d_out[0].data; /* (rows, out) */
    float* dx = (float*)io->d_in[0].data;              /* (rows, in), NULL on the first layer */
    int rows = (int)io->in[0].rows, r, o;
    float* dz = (float*)malloc(sizeof(float) * (size_t)rows * p->out); /* (rows, out) */
    if (!dz) return 2;
    for (r = 0; r < rows; r++)
        for (o = 0; o < p->out; o++) {
            size_t i = (size_t)r * p->out + o;
            float d = dy[i];
            if (p->tanh_act) d *= 1.0f - y[i] * y[i];
            dz[i] = d;
            g->b[o] += d;
        }
    mm_tn(rows, p->out, p->in, x, dz, g->w);
    if (dx) mm_nt(rows, p->out, p->in, dz, p->w, dx);
    free(dz);
    return 0;
}

/* The model for the library, written out by hand: its dense layers call the kernels above
   (BLAS or naive), and the loss is examples/mlp.h's. */
static int pnet_forward(const void* w_, int l, pp_layer_io* io) {
    const pnet* w = (const pnet*)w_;
    xent_params xp;
    xp.classes = w->classes;
    return l < w->L ? pdense_fwd(&w->dense[l], io) : xent_fwd(&xp, io);
}
static int pnet_backward(const void* w_, void* g_, int l, pp_layer_io* io) {
    const pnet* w = (const pnet*)w_;
    pnet* g = (pnet*)g_;
    xent_params xp;
    xp.classes = w->classes;
    return l < w->L ? pdense_bwd(&w->dense[l], &g->dense[l], io) : xent_bwd(&xp, NULL, io);
}
static void pnet_describe(const void* w_, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                          pp_layer_desc* d) {
    const pnet* w = (const pnet*)w_;
    (void)n_in;
    if (l < w->L) {
        d->n_out = 1;
        d->out[0].rows = in[0].rows;
        d->out[0].cols = w->dense[l].out;
        d->out[0].dtype = PP_F32;
        d->cost = (double)mb->rows * w->dense[l].in * w->dense[l].out * 3.0;
        d->n_params = (int64_t)w->dense[l].in * w->dense[l].out + w->dense[l].out;
    } else {
        d->n_out = 0;
        d->cost = (double)mb->rows * w->classes * 4.0;
    }
}
static const char* pnet_layer_name(int l) {
    (void)l;
    return "layer";
}

/* Weights (and zeroed gradients, same layout) for L dense layers in -> hidden ... -> classes. */
static float* pnet_init(pnet* w, pnet* g, int L, int in, int hidden, int classes, float** gbuf) {
    size_t total = 0, off = 0, i;
    float *buf, *gb;
    uint64_t seed = 1234;
    int l;
    for (l = 0; l < L; l++) {
        int a = l == 0 ? in : hidden, b = l == L - 1 ? classes : hidden;
        total += (size_t)a * b + b;
    }
    buf = (float*)malloc(total * sizeof(float));
    gb = (float*)calloc(total, sizeof(float));
    if (!buf || !gb) {
        free(buf);
        free(gb);
        return NULL;
    }
    w->L = g->L = L;
    w->classes = g->classes = classes;
    for (l = 0; l < L; l++) {
        pdense* d = &w->dense[l];
        size_t nw;
        float sc;
        d->in = l == 0 ? in : hidden;
        d->out = l == L - 1 ? classes : hidden;
        d->tanh_act = l < L - 1;
        nw = (size_t)d->in * d->out;
        sc = 1.0f / sqrtf((float)d->in);
        d->w = buf + off;
        d->b = buf + off + nw;
        for (i = 0; i < nw; i++) d->w[i] = (2.0f * splitmix_uniform(&seed) - 1.0f) * sc;
        for (i = 0; i < (size_t)d->out; i++) d->b[i] = 0;
        g->dense[l] = *d;
        g->dense[l].w = gb + off;
        g->dense[l].b = gb + off + nw;
        off += nw + (size_t)d->out;
    }
    *gbuf = gb;
    return buf;
}

/* ---- running ------------------------------------------------------------------------------- */
typedef struct cfg {
    pp_schedule_kind kind;
    int p, v, m, L, in, hidden, classes, rows, steps, warmup, overhead;
    const char* lengths;
} cfg;

/* A pipeline run over one batch per step (warm-up steps included). */
typedef struct run {
    hx_world W;
    hx_steps S;
    hx_timing T;
    hx_sched sc;
    int first[PP_MAX_RANKS + 1];
} run;

/* The run of the model over n_steps batches bs[], weights w, gradients g. */
static void run_init(run* R, pnet* w, pnet* g, const pp_batch* bs, int n_steps) {
    memset(R, 0, sizeof *R);
    R->W.model.name = "pnet";
    R->W.model.n_layers = w->L + 1;
    R->W.model.forward = pnet_forward;
    R->W.model.backward = pnet_backward;
    R->W.model.describe = pnet_describe;
    R->W.model.layer_name = pnet_layer_name;
    R->W.w = w;
    R->W.grads = g;
    R->S.first = bs;
    R->S.stride = sizeof *bs;
    R->S.timing = &R->T;
    hx_world_steps(&R->W, &R->S, n_steps);
}

static void run_free(run* R) {
    hx_timing_free(&R->T);
    hx_sched_free(&R->sc);
}

/* The partition torch's side uses: dense layers split evenly, the loss on the last stage. */
static void peer_partition(int L, int S, int* first) {
    int s;
    for (s = 0; s < S; s++) first[s] = (int)((long)s * L / S);
    first[S] = L + 1;
}

/* Runs the pipeline over the run's batches; *t_pipe = median of the slowest rank's step. */
static pp_result run_pipeline(run* R, const cfg* c, double* t_pipe) {
    pp_error err;
    pp_result rc;
    if ((rc = hx_sched_make(&R->sc, c->kind, c->p, c->v, c->m, &err)) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return rc;
    }
    if ((rc = hx_timing_init(&R->T, c->p, R->W.steps)) != PP_OK) return rc;
    peer_partition(((const pnet*)R->W.w)->L, c->p * c->v, R->first);
    R->W.sched = &R->sc.s;
    R->W.first = R->first;
    if ((rc = hx_run(&R->W, c->p, &err)) != PP_OK) {
        hx_print_errors(&R->W, c->p);
        fprintf(stderr, "%s\n", err.msg);
    }
    *t_pipe = hx_worst_median(&R->T, c->p, c->warmup);
    return rc;
}

static double now_s(void) { return _pp_now(); }

/* Reads one line of lengths per step; returns the number of steps read (up to max). */
static int read_lengths(const char* path, int32_t** lens, int* n_seqs, int max) {
    FILE* f = fopen(path, "r");
    char line[1 << 16];
    int s = 0;
    if (!f) return -1;
    while (s < max && fgets(line, sizeof line, f)) {
        int32_t tmp[4096];
        int n = 0;
        char* p = line;
        char* e;
        long v;
        while (n < 4096 && (v = strtol(p, &e, 10), e != p)) {
            tmp[n++] = (int32_t)v;
            p = e;
        }
        if (n == 0) continue;
        lens[s] = (int32_t*)malloc(sizeof(int32_t) * (size_t)n);
        if (!lens[s]) break;
        memcpy(lens[s], tmp, sizeof(int32_t) * (size_t)n);
        n_seqs[s++] = n;
    }
    fclose(f);
    return s;
}

static void usage(void) {
    fprintf(stderr, "usage: peers_ours [--schedule gpipe|1f1b|interleaved] [-p P] [-v V] [-m M] [--layers L]\n"
                    "                  [--in N] [--hidden H] [--classes C] [--rows R] [--steps N] [--warmup N]\n"
                    "                  [--lengths FILE] [--no-overhead]\n");
}

static int parse(int argc, char** argv, cfg* c) {
    int i;
    memset(c, 0, sizeof *c);
    c->kind = PP_SCHED_1F1B;
    c->p = 4;
    c->m = 32;
    c->L = 16;
    c->in = 64;
    c->hidden = 256;
    c->classes = 16;
    c->rows = 1024;
    c->steps = 10;
    c->warmup = 3;
    c->overhead = 1;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-overhead")) { c->overhead = 0; continue; }
        if (!val) { usage(); return 1; }
        if (!strcmp(a, "--schedule")) {
            if (pp_schedule_kind_parse(val, &c->kind) != PP_OK) { fprintf(stderr, "unknown schedule '%s'\n", val); return 1; }
        } else if (!strcmp(a, "-p")) c->p = atoi(val);
        else if (!strcmp(a, "-v")) c->v = atoi(val);
        else if (!strcmp(a, "-m")) c->m = atoi(val);
        else if (!strcmp(a, "--layers")) c->L = atoi(val);
        else if (!strcmp(a, "--in")) c->in = atoi(val);
        else if (!strcmp(a, "--hidden")) c->hidden = atoi(val);
        else if (!strcmp(a, "--classes")) c->classes = atoi(val);
        else if (!strcmp(a, "--rows")) c->rows = atoi(val);
        else if (!strcmp(a, "--steps")) c->steps = atoi(val);
        else if (!strcmp(a, "--warmup")) c->warmup = atoi(val);
        else if (!strcmp(a, "--lengths")) c->lengths = val;
        else { usage(); return 1; }
        i++;
    }
    if (c->v == 0) c->v = c->kind == PP_SCHED_INTERLEAVED ? 2 : 1;
    if (c->p < 1 || c->m < 1 || c->L < 1 || c->L > MAXL || c->p * c->v > c->L || c->p * c->v > PP_MAX_RANKS ||
        c->in < 1 || c->hidden < 1 || c->classes < 2 || c->rows < c->m || c->steps < 1 || c->warmup < 0) {
        fprintf(stderr, "bad sizes: need 1 <= p*v <= layers <= %d, rows >= m, classes >= 2, steps >= 1\n", MAXL);
        return 1;
    }
    return 0;
}

/* Host time per action: the same schedule on a width-1 model, one row per micro-batch. */
static double overhead_per_action(const cfg* c0) {
    cfg c = *c0;
    pnet *w, *g;
    float *wbuf, *gbuf, x[4096];
    int32_t y[4096];
    pp_batch* bs;
    static run R0;
    run* R = &R0;
    double t = 0;
    int i;
    c.in = c.hidden = 1;
    c.classes = 2;
    c.rows = c.m;
    c.steps = c.steps * 5;
    if (c.rows > 4096) return -1;
    w = (pnet*)calloc(1, sizeof *w);
    g = (pnet*)calloc(1, sizeof *g);
    if (!w || !g) return -1;
    wbuf = pnet_init(w, g, c.L, 1, 1, 2, &gbuf);
    bs = (pp_batch*)calloc((size_t)(c.steps + c.warmup), sizeof *bs);
    if (!wbuf || !bs) return -1;
    for (i = 0; i < c.rows; i++) {
        x[i] = (float)(i % 7) * 0.1f;
        y[i] = i % 2;
    }
    for (i = 0; i < c.steps + c.warmup; i++) hx_dense_batch(&bs[i], x, y, c.rows, 1, c.m);
    run_init(R, w, g, bs, c.steps + c.warmup);
    if (run_pipeline(R, &c, &t) != PP_OK) t = -1;
    else t /= R->sc.s.per_rank;
    run_free(R);
    free(bs);
    free(wbuf);
    free(gbuf);
    free(w);
    free(g);
    return t;
}

int main(int argc, char** argv) {
    cfg c;
    pnet *w, *g;
    float *wbuf, *gbuf;
    pp_batch* bs;
    float* seq_loss;
    double *ts, t_seq, t_pipe = 0, host = -1, tokens = 0, eff, theory;
    int n_total, i, r, wrong = 0, varlen;
    static run R;
    pp_error err;
    pp_result rc;
    if (parse(argc, argv, &c)) return 2;
    n_total = c.warmup + c.steps;
    w = (pnet*)calloc(1, sizeof *w);
    g = (pnet*)calloc(1, sizeof *g);
    bs = (pp_batch*)calloc((size_t)n_total, sizeof *bs);
    seq_loss = (float*)calloc((size_t)n_total, sizeof(float));
    ts = (double*)calloc((size_t)n_total, sizeof(double));
    if (!w || !g || !bs || !seq_loss || !ts) return 3;
    wbuf = pnet_init(w, g, c.L, c.in, c.hidden, c.classes, &gbuf);
    if (!wbuf) return 3;
    varlen = c.lengths != NULL;

    /* the batches: fixed rows, or one packed batch per line of the lengths file */
    for (i = 0; i < n_total; i++) {
        int64_t rows = c.rows, j;
        uint64_t seed = 99 + (uint64_t)i;
        float* x;
        int32_t* y;
        bs[i].m = c.m;
        if (varlen) {
            static int32_t* lens[4096];
            static int nseq[4096];
            static int n_read = -2;
            int32_t* cu;
            int k, s;
            if (n_read == -2) n_read = read_lengths(c.lengths, lens, nseq, 4096);
            if (n_read <= 0) {
                fprintf(stderr, "cannot read lengths from %s\n", c.lengths);
                return 2;
            }
            s = i % n_read;
            cu = (int32_t*)malloc(sizeof(int32_t) * (size_t)(nseq[s] + 1));
            if (!cu) return 3;
            cu[0] = 0;
            for (k = 0; k < nseq[s]; k++) cu[k + 1] = cu[k] + lens[s][k];
            rows = cu[nseq[s]];
            bs[i].cu_seqlens = cu;
            bs[i].n_seqs = nseq[s];
            bs[i].split = PP_SPLIT_TOKENS;
        }
        x = (float*)malloc(sizeof(float) * (size_t)rows * c.in);
        y = (int32_t*)malloc(sizeof(int32_t) * (size_t)rows);
        if (!x || !y) return 3;
        for (j = 0; j < rows * c.in; j++) x[j] = 2.0f * splitmix_uniform(&seed) - 1.0f;
        for (j = 0; j < rows; j++) y[j] = (int32_t)(splitmix_next(&seed) % (uint64_t)c.classes);
        bs[i].input.data = x;
        bs[i].input.rows = rows;
        bs[i].input.cols = c.in;
        bs[i].input.dtype = PP_F32;
        bs[i].targets = y;
        bs[i].target_row_bytes = sizeof(int32_t);
    }
    run_init(&R, w, g, bs, n_total);

    /* sequential reference: every step, losses kept for the bit-exact check */
    for (i = 0; i < n_total; i++) {
        double t0 = now_s();
        if ((rc = pp_sequential_step(&R.W.model, w, g, &bs[i], &seq_loss[i], &err)) != PP_OK) {
            fprintf(stderr, "sequential: %s\n", err.msg);
            return 2;
        }
        ts[i] = now_s() - t0;
    }
    t_seq = hx_median(ts + c.warmup, c.steps);
    for (i = c.warmup; i < n_total; i++) tokens += (double)bs[i].input.rows;
    tokens /= c.steps;

    if ((rc = run_pipeline(&R, &c, &t_pipe)) != PP_OK) return 2;
    for (i = 0; i < n_total; i++)
        if (memcmp(&R.T.loss[i], &seq_loss[i], sizeof(float)) != 0) wrong++;
    if (c.overhead && !varlen) host = overhead_per_action(&c);
    eff = t_seq / (c.p * t_pipe);
    theory = (double)(c.v * c.m) / (c.v * c.m + c.p - 1);

    printf("RESULT {\"side\": \"ours\", \"kernel\": \"%s\", \"transport\": \"threads\", \"schedule\": \"%s\", "
           "\"p\": %d, \"v\": %d, \"m\": %d, \"layers\": %d, \"in\": %d, \"hidden\": %d, \"classes\": %d, "
           "\"varlen\": %d, \"tokens_per_step\": %.1f, \"t_seq_ms\": %.4f, \"t_pipe_ms\": %.4f, "
           "\"efficiency\": %.4f, \"theory\": %.4f, \"tokens_per_s\": %.1f, \"host_us_per_action\": %.3f, "
           "\"actions_per_rank\": %d, \"peak_stash_bytes\": [",
           PEERS_KERNEL, pp_schedule_name(c.kind), c.p, c.v, c.m, c.L, c.in, c.hidden, c.classes, varlen, tokens,
           1e3 * t_seq, 1e3 * t_pipe, eff, theory, tokens / t_pipe, host > 0 ? 1e6 * host : -1.0, R.sc.s.per_rank);
    for (r = 0; r < c.p; r++) printf("%s%zu", r ? ", " : "", R.T.peak_stash[r]);
    printf("], \"peak_live\": [");
    for (r = 0; r < c.p; r++) printf("%s%d", r ? ", " : "", R.T.peak_live[r]);
    printf("], \"wrong\": %d, \"cores\": %ld}\n", wrong, sysconf(_SC_NPROCESSORS_ONLN));

    for (i = 0; i < n_total; i++) {
        free((void*)bs[i].input.data);
        free((void*)bs[i].targets);
        free((void*)bs[i].cu_seqlens);
    }
    run_free(&R);
    free(bs);
    free(seq_loss);
    free(ts);
    free(wbuf);
    free(gbuf);
    free(w);
    free(g);
    return wrong ? 1 : 0;
}
