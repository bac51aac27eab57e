/* tests/test_gptc_tp.cu - tensor parallelism in examples/gpt_cuda.h's model (the GPT that
   gpt_cuda and gpt_nccl train), checked on the host: the same layer code as the GPU's, run as
   host loops (gptc_run.cpu), in pipeline.h's one-process pipeline with tp (threads; io->tp the
   layers' TP group, pp_tp_allreduce the sum).

   The whole model (tp 1) takes one step at p = 2 (1F1B) on packed sequences; then the same
   weights cut by gptc_tp_shard into tp = 2 and tp = 4 shards take it at p = 2, on 1F1B, GPipe
   and interleaved. Checked:
   - the loss (TP rank 0's micro-batch losses) and every gradient buffer of every rank are
     within 1e-5 (relative) of the whole model's, cut the same way (the partial sums of the
     row-parallel products add in another order);
   - at fixed tp 1F1B, GPipe and interleaved (v = 2: a layer a chunk) give the same gradient bits
     on every rank;
   - the TP ranks' replicated gradients (LayerNorms, the row-parallel biases, the embedding
     and head) are bit-identical across the TP group.
   - gptc_tp_unshard of every TP rank's shard rebuilds the whole weights byte for byte;
   - the gradient norm over the pipeline and the TP group (pp_grad_norm_tp over gptc_grad_bufs'
     lists, the shards flagged tp_sharded: gpt_nccl --tp --clip's) is the same on every rank and
     within 1e-5 of tp 1's.
   Its negative controls (build/gptc-tp-ctl-norow: the attention projection's all-reduce dropped,
   PP_TEST_GPTC_TP_NO_ROW_REDUCE; gptc-tp-ctl-unsharded: no buffer flagged a shard, so the norm
   takes TP rank 0's shards only) must fail. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_cuda.h"
#include "test.h"
#include "harness.h"

#include "../examples/gpt_cuda.h"

#define NSEQ 8
#define MAXROWS (NSEQ * 12)
#define P 2
#define M 4
#define MAXTP 4
#define TOL 1e-5

static const int V = 32, MAXT = 16, C = 16, H = 4, NB = 2;
static int32_t TOK[MAXROWS], TGT[MAXROWS], CU[NSEQ + 1], POS[MAXROWS], SST[MAXROWS], SEN[MAXROWS];

/* ||a - b|| / ||b|| over n floats (||a - b|| where b is zero) */
static double rel_diff(const float* a, const float* b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* 8 packed sequences of 3 .. 12 tokens (harness.h's), each target the next token, and their
   per-row tables. */
static void make_batch(pp_batch* b) {
    (void)hx_token_seqs(TOK, TGT, CU, NSEQ, V);
    gpt_row_tables(CU, NSEQ, POS, SST, SEN);
    hx_token_batch(b, TOK, TGT, CU, NSEQ, 0, PP_SPLIT_TOKENS); /* m: the pipeline's */
}

typedef struct result {
    float loss;
    float* g[P * MAXTP];        /* each world rank's gradients (gptc_numel + V * C floats) */
    size_t n;                   /* floats in each */
} result;

/* One step of the model at tp over P stages, from whole (tp 1 weights) cut per TP rank. */
static int step(int tp, pp_schedule_kind kind, const float* whole, result* out) {
    gptc_run run;
    float mb_loss[M] = {0};
    float* wsh[MAXTP] = {0};
    gptc_model w[MAXTP], g[P * MAXTP];
    const void* wptr[P * MAXTP];
    void* gptr[P * MAXTP];
    pp_pipeline* pl = NULL;
    pp_pipeline_desc d;
    pp_batch b;
    pp_step_stats st;
    pp_error err;
    int nr = P * tp, rc = 0;
    memset(&run, 0, sizeof run);
    run.cfg.V = V, run.cfg.maxT = MAXT, run.cfg.C = C, run.cfg.H = H, run.cfg.nb = NB, run.cfg.tp = tp;
    run.cpu = 1;
    run.tab[0].pos = POS, run.tab[0].sstart = SST, run.tab[0].send = SEN, run.tab[0].mb_loss = mb_loss;
    make_batch(&b);
    size_t np = gptc_numel(&run.cfg);
    out->n = np + (size_t)V * C;
    for (int t = 0; t < tp; t++) {
        wsh[t] = (float*)calloc(np, sizeof(float));
        if (tp > 1) gptc_tp_shard(&run.cfg, t, whole, wsh[t], 0);
        else memcpy(wsh[t], whole, np * sizeof(float));
        gptc_bind(&w[t], &run.cfg, wsh[t], 0);
    }
    for (int r = 0; r < nr; r++) { /* world rank r = pp_rank * tp + tp_rank */
        out->g[r] = (float*)calloc(out->n, sizeof(float));
        gptc_bind(&g[r], &run.cfg, out->g[r], 1);
        wptr[r] = &w[r % tp];
        gptr[r] = &g[r];
    }
    memset(&d, 0, sizeof d);
    d.model = gptc_model_desc_depth(&run);
    d.rank_weights = wptr;
    d.rank_grads = gptr;
    d.schedule = kind;
    d.p = P;
    d.v = pp_schedule_kind_v(kind, 2); /* interleaved: two chunks a rank, a layer each */
    d.m = M;
    d.tp = tp;
    d.stage.timeout_s = 30;
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK || pp_pipeline_step(pl, &b, &st) != PP_OK) {
        printf("tp %d %s: %s\n", tp, pp_schedule_name(kind), pl ? pp_pipeline_error(pl) : err.msg);
        rc = 1;
    }
    out->loss = 0;
    for (int k = 0; k < M; k++) out->loss += mb_loss[k] / M;
    pp_pipeline_destroy(pl);
    for (int t = 0; t < tp; t++) free(wsh[t]);
    return rc;
}

/* The gradient norm of a step's result: tp 1 over its pipeline (pp_grad_norm), tp > 1 over each
   TP rank's pipeline and each stage's TP group (pp_grad_norm_tp), from gptc_grad_bufs' lists (the
   shards flagged tp_sharded), every rank at once on threads worlds. */
typedef struct normrun {
    gptc_config cfg;
    const result* res;
    int first[P + 1];
    pp_threads *pipes[MAXTP], *tps[P];
    double norm[P * MAXTP];
    pp_result rc[P * MAXTP];
} normrun;
static pp_result norm_rank(int r, void* user) {
    static pp_grad_buf bufs[P * MAXTP][12 * GPTC_MAX_BLOCK + 5];
    normrun* N = (normrun*)user;
    int tp = gptc_tpn(&N->cfg), pr = r / tp, t = r % tp, n;
    unsigned char own[GPTC_MAX_BLOCK + 2];
    pp_transport pt = pp_threads_transport(N->pipes[t], pr), tt;
    pp_group pg = {&pt, NULL, 0, 10.0}, tg = {&tt, NULL, 0, 10.0};
    pp_error err;
    for (int l = 0; l < NB + 2; l++) own[l] = l >= N->first[pr] && l < N->first[pr + 1];
    n = gptc_grad_bufs(&N->cfg, N->res->g[r], own, -1, NULL, bufs[r]);
    if (tp > 1) {
        tt = pp_threads_transport(N->tps[pr], t);
        N->rc[r] = pp_grad_norm_tp(&pg, &tg, NB + 2, bufs[r], n, &N->norm[r], &err);
    } else
        N->rc[r] = pp_grad_norm(&pg, NB + 2, bufs[r], n, &N->norm[r], &err);
    return PP_OK;
}
static double grad_norm(const gptc_config* cfg, const result* res) {
    normrun* N = (normrun*)calloc(1, sizeof *N);
    pp_error err;
    int tp = gptc_tpn(cfg), ok = 1;
    double v;
    N->cfg = *cfg;
    N->res = res;
    pp_partition_uniform(NB + 2, P, N->first, &err);
    for (int t = 0; t < tp; t++) pp_threads_create(P, &N->pipes[t], &err);
    for (int p = 0; p < P && tp > 1; p++) pp_threads_create(tp, &N->tps[p], &err);
    pp_threads_run(P * tp, norm_rank, N, &err);
    for (int r = 0; r < P * tp; r++) ok &= N->rc[r] == PP_OK && !memcmp(&N->norm[r], &N->norm[0], sizeof(double));
    CHECK(ok, "tp %d: the norm failed or differs between ranks", tp);
    v = N->norm[0];
    for (int t = 0; t < tp; t++) pp_threads_destroy(N->pipes[t]);
    for (int p = 0; p < P && tp > 1; p++) pp_threads_destroy(N->tps[p]);
    free(N);
    return v;
}

static void result_free(result* r, int nr) {
    for (int k = 0; k < nr; k++) free(r->g[k]);
}

int main(void) {
    gptc_config whole_cfg;
    memset(&whole_cfg, 0, sizeof whole_cfg);
    whole_cfg.V = V, whole_cfg.maxT = MAXT, whole_cfg.C = C, whole_cfg.H = H, whole_cfg.nb = NB;
    size_t np1 = gptc_numel(&whole_cfg);
    float* whole = (float*)malloc(np1 * sizeof(float));
    result ref;
    gptc_init_weights(&whole_cfg, whole);
    CHECK(step(1, PP_SCHED_1F1B, whole, &ref) == 0, "tp 1: the step");
    double norm1 = grad_norm(&whole_cfg, &ref);
    for (int tp = 2; tp <= MAXTP; tp *= 2) {
        const pp_schedule_kind kinds[3] = {PP_SCHED_1F1B, PP_SCHED_GPIPE, PP_SCHED_INTERLEAVED};
        result res[3];
        double worst = 0, lrel;
        gptc_config cfg = whole_cfg;
        cfg.tp = tp;
        { /* the shards put back (gptc_tp_unshard, TP rank 0's whole parts last written by rank tp - 1:
             the same bytes) are the whole model, byte for byte: a checkpoint of the tp = 1 layout */
            size_t npt = gptc_numel(&cfg);
            float *part = (float*)malloc(npt * sizeof(float)), *back = (float*)calloc(np1, sizeof(float));
            for (int t = 0; t < tp; t++) {
                gptc_tp_shard(&cfg, t, whole, part, 0);
                gptc_tp_unshard(&cfg, t, part, back, 0);
            }
            CHECK(memcmp(back, whole, np1 * sizeof(float)) == 0, "tp %d: the shards put back differ from the whole model", tp);
            free(part);
            free(back);
        }
        for (int k = 0; k < 3; k++) CHECK(step(tp, kinds[k], whole, &res[k]) == 0, "tp %d %s: the step", tp, pp_schedule_name(kinds[k]));
        lrel = fabs((double)res[0].loss - ref.loss) / fabs((double)ref.loss);
        CHECK(lrel <= TOL, "tp %d: loss %.9g against tp 1's %.9g (%.3g relative)", tp, res[0].loss, ref.loss, lrel);
        for (int r = 0; r < P * tp; r++) {
            int pr = r / tp, t = r % tp;
            float* cut = (float*)calloc(res[0].n, sizeof(float));
            gptc_model a, e;
            gptc_tp_shard(&cfg, t, ref.g[pr], cut, 1); /* tp 1's rank pr, cut as TP rank t holds it */
            gptc_bind(&a, &cfg, res[0].g[r], 1);
            gptc_bind(&e, &cfg, cut, 1);
            for (int l = 0; l < NB + 2; l++) {
                float *pa[12], *pe[12];
                int64_t na[12];
                unsigned char dec[12];
                int n = gptc_layer_buffers(&cfg, &a, l, pa, na, dec);
                gptc_layer_buffers(&cfg, &e, l, pe, na, dec);
                for (int k = 0; k < n; k++) {
                    double dlt = rel_diff(pa[k], pe[k], na[k]);
                    if (dlt > worst) worst = dlt;
                    CHECK(dlt <= TOL, "tp %d: world rank %d, layer %d, buffer %d: %.3g relative to tp 1's", tp, r, l, k, dlt);
                }
            }
            {
                double dw = rel_diff(a.head[0].wte, e.head[0].wte, (int64_t)V * C);
                CHECK(dw <= TOL, "tp %d: world rank %d: the head's wte share, %.3g relative to tp 1's", tp, r, dw);
            }
            if (pr == 0) /* each kind's gradients of TP rank t, gathered from the pipeline ranks that own
                            the layers (the others hold zeros there: x + 0 is exact) */
                for (int k = 1; k < 3; k++) {
                    int same = 1;
                    for (size_t i = 0; i < res[0].n && same; i++) {
                        float a0 = 0, ak = 0;
                        for (int q = 0; q < P; q++) a0 += res[0].g[q * tp + t][i], ak += res[k].g[q * tp + t][i];
                        same = !memcmp(&a0, &ak, sizeof a0);
                    }
                    CHECK(same, "tp %d: TP rank %d: 1F1B and %s gradients differ", tp, t, pp_schedule_name(kinds[k]));
                }
            if (t > 0) { /* the replicated buffers: the same bits on every TP rank */
                gptc_model z;
                gptc_bind(&z, &cfg, res[0].g[r - t], 1);
                for (int l = 0; l < NB; l++) {
                    const gptc_block_p *x = &a.block[l], *y = &z.block[l];
                    CHECK(!memcmp(x->ln1_g, y->ln1_g, C * sizeof(float)) && !memcmp(x->ln2_b, y->ln2_b, C * sizeof(float)) &&
                              !memcmp(x->proj_b, y->proj_b, C * sizeof(float)) && !memcmp(x->fcp_b, y->fcp_b, C * sizeof(float)),
                          "tp %d: world rank %d, block %d: replicated gradients differ from TP rank 0's", tp, r, l);
                }
                CHECK(!memcmp(a.embed[0].wte, z.embed[0].wte, (size_t)V * C * sizeof(float)) &&
                          !memcmp(a.head[0].lnf_g, z.head[0].lnf_g, C * sizeof(float)),
                      "tp %d: world rank %d: the embedding's or head's gradients differ from TP rank 0's", tp, r);
            }
            free(cut);
        }
        {
            double nt = grad_norm(&cfg, &res[0]), nrel = fabs(nt - norm1) / norm1;
            CHECK(nrel <= TOL, "tp %d: gradient norm %.9g against tp 1's %.9g (%.3g relative): shards once, the rest once",
                  tp, nt, norm1, nrel);
            printf("test_gptc_tp: tp %d x p %d on the host: loss %.9g (tp 1: %.9g, %.3g relative), gradients within %.3g "
                   "of tp 1's, norm %.9g (tp 1: %.9g); 1F1B, GPipe and interleaved bit-identical\n", tp, P, res[0].loss, ref.loss, lrel,
                   worst, nt, norm1);
        }
        for (int k = 0; k < 3; k++) result_free(&res[k], P * tp);
    }
    result_free(&ref, P);
    free(whole);
    return TEST_DONE("test_gptc_tp");
}
