/* tests/test_pipeline.c - pipelined training steps equal the sequential reference, bit for bit.

   Every built-in schedule runs each stage's backwards in ascending micro-batch order, which is
   the order of the sequential reference, so each gradient element is the same sum of the same
   products in the same order: we compare with memcmp, not a tolerance. Each rank has its own
   gradient buffers, and a rank must leave the layers it does not own untouched (zero). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"

#define ROWS 33
#define IN 6
#define CLASSES 5
static const int DIMS[MLP_DEPTH + 1] = {IN, 8, 7, 8, 9, 8, 6, 8, 8, 7, 8, CLASSES};

typedef struct world {
    pp_model model;
    const mlp_model* w;
    mlp_model g[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    const pp_schedule* sched;
    const int* first;
    pp_threads* threads;
    const pp_batch* batch;
    int steps;
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
    d.transport = pp_threads_transport(W->threads, rank);
    d.timeout_s = 20;
    rc = pp_stage_create(&d, &st, &err);
    if (rc != PP_OK) {
        snprintf(W->msg[rank], sizeof W->msg[rank], "%s", err.msg);
        W->rc[rank] = rc;
        return rc;
    }
    for (i = 0; i < W->steps && rc == PP_OK; i++) rc = pp_stage_step(st, W->batch, &W->stats[rank]);
    if (rc != PP_OK) snprintf(W->msg[rank], sizeof W->msg[rank], "%s", pp_stage_error(st));
    W->rc[rank] = rc;
    pp_stage_destroy(st);
    return rc;
}

/* Which stage owns layer l. */
static int owner_stage(const int* first, int S, int l) {
    int s;
    for (s = 0; s < S; s++)
        if (l >= first[s] && l < first[s + 1]) return s;
    return -1;
}

static int bits_equal(const float* a, const float* b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static int all_zero(const float* a, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (a[i] != 0.0f) return 0;
    return 1;
}

/* One configuration: pipelined step(s) vs reference step(s). Returns 1 when equal. */
static int run_case(pp_schedule_kind kind, int p, int v, int m, const int* first, const char* part_name,
                    const mlp_model* w, const mlp_model* gref, float loss_ref, const pp_batch* batch, int steps) {
    static world W;
    pp_action* acts;
    pp_schedule sched;
    pp_error err;
    size_t n = pp_schedule_size(kind, p, v, m);
    int r, l, ok = 1, S = p * v;
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d partition=%s", pp_schedule_name(kind), p, v, m, part_name);
    acts = (pp_action*)malloc(n * sizeof *acts);
    if (pp_schedule_make(kind, p, v, m, acts, n, &sched, &err) != PP_OK) {
        CHECK(0, "%s: schedule: %s", where, err.msg);
        free(acts);
        return 0;
    }
    memset(&W, 0, sizeof W);
    W.model = mlp_model_desc();
    W.w = w;
    W.sched = &sched;
    W.first = first;
    W.batch = batch;
    W.steps = steps;
    pp_threads_create(p, &W.threads, &err);
    for (r = 0; r < p; r++) {
        mlp_model tmp;
        memset(&tmp, 0, sizeof tmp);
        W.g[r] = *w;
        /* same shapes as w, own zeroed buffers */
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
        if (!bits_equal(W.g[rank].dense[l].w, gref->dense[l].w, nw) || !bits_equal(W.g[rank].dense[l].b, gref->dense[l].b, nb)) {
            CHECK(0, "%s: layer %d (stage %d, rank %d) gradient differs from the reference", where, l, s, rank);
            ok = 0;
        }
        for (r = 0; r < p; r++)
            if (r != rank && (!all_zero(W.g[r].dense[l].w, nw) || !all_zero(W.g[r].dense[l].b, nb))) {
                CHECK(0, "%s: rank %d wrote gradients of layer %d, which rank %d owns", where, r, l, rank);
                ok = 0;
            }
    }
    if (ok) {
        int last_rank, chunk;
        pp_schedule_stage_rank(&sched, S - 1, &last_rank, &chunk);
        if (!W.stats[last_rank].has_loss || memcmp(&W.stats[last_rank].loss, &loss_ref, sizeof(float)) != 0) {
            CHECK(0, "%s: loss %.9g != reference %.9g", where, W.stats[last_rank].loss, loss_ref);
            ok = 0;
        }
        for (r = 0; r < p; r++)
            if (r != last_rank && W.stats[r].has_loss) {
                CHECK(0, "%s: rank %d claims a loss", where, r);
                ok = 0;
            }
    }
    for (r = 0; r < p; r++) free(W.gbuf[r]);
    pp_threads_destroy(W.threads);
    free(acts);
    if (ok) CHECK(1, "%s", where);
    return ok;
}

static void test_grid(void) {
    static const int ms[] = {1, 2, 3, 4, 7, 8, 16};
    mlp_model w, gref;
    float *wbuf, *gbuf, x[ROWS * IN], loss_ref = 0;
    int32_t y[ROWS];
    pp_batch b;
    pp_error err;
    pp_model model = mlp_model_desc();
    double cost[MLP_DEPTH + 1];
    pp_tensor sample;
    int kind, p, v, mi, part, cases = 0, good = 0;
    memset(&w, 0, sizeof w);
    memset(&gref, 0, sizeof gref);
    wbuf = mlp_init(&w, &gref, DIMS, 42, &gbuf);
    mlp_make_data(x, y, ROWS, IN, CLASSES, 7, 99);
    memset(&sample, 0, sizeof sample);
    sample.rows = ROWS;
    sample.cols = IN;
    sample.dtype = PP_F32;
    CHECK(pp_model_layer_costs(&model, &w, &sample, cost, NULL, &err) == PP_OK, "%s", err.msg);
    for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
        int m = ms[mi];
        memset(&b, 0, sizeof b);
        b.m = m;
        b.input.data = x;
        b.input.rows = ROWS;
        b.input.cols = IN;
        b.input.dtype = PP_F32;
        b.targets = y;
        b.target_row_bytes = sizeof(int32_t);
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        if (pp_sequential_step(&model, &w, &gref, &b, &loss_ref, &err) != PP_OK) {
            CHECK(0, "reference m=%d: %s", m, err.msg);
            continue;
        }
        for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
            for (p = 1; p <= 4; p++)
                for (v = 1; v <= 3; v++) {
                    int S = p * v, first[16];
                    if (!pp_schedule_size((pp_schedule_kind)kind, p, v, 4)) continue; /* not a v this kind runs */
                    for (part = 0; part < 3; part++) {
                        const char* pname = part == 0 ? "uniform" : part == 1 ? "cost" : "skewed";
                        int s;
                        if (part == 0) pp_partition_uniform(model.n_layers, S, first, &err);
                        else if (part == 1) pp_partition_balanced(cost, model.n_layers, S, first, &err);
                        else {
                            /* first stage takes everything but one layer per other stage */
                            first[0] = 0;
                            for (s = 1; s <= S; s++) first[s] = model.n_layers - (S - s);
                        }
                        if (S == 1 && part > 0) continue;
                        cases++;
                        good += run_case((pp_schedule_kind)kind, p, v, m, first, pname, &w, &gref, loss_ref, &b, 1);
                    }
                }
    }
    printf("gradient equality: %d of %d configurations bit-exact\n", good, cases);
    free(wbuf);
    free(gbuf);
}

/* Two steps accumulate: the gradient after two pipelined steps equals two reference steps. */
static void test_accumulate_two_steps(void) {
    mlp_model w, gref;
    float *wbuf, *gbuf, x[ROWS * IN], loss_ref = 0;
    int32_t y[ROWS];
    pp_batch b;
    pp_error err;
    pp_model model = mlp_model_desc();
    int first[5];
    memset(&w, 0, sizeof w);
    wbuf = mlp_init(&w, &gref, DIMS, 3, &gbuf);
    mlp_make_data(x, y, ROWS, IN, CLASSES, 5, 6);
    memset(&b, 0, sizeof b);
    b.m = 4;
    b.input.data = x;
    b.input.rows = ROWS;
    b.input.cols = IN;
    b.input.dtype = PP_F32;
    b.targets = y;
    b.target_row_bytes = sizeof(int32_t);
    b.loss = PP_LOSS_MEAN_ROWS;
    pp_sequential_step(&model, &w, &gref, &b, &loss_ref, &err);
    pp_sequential_step(&model, &w, &gref, &b, &loss_ref, &err);
    pp_partition_uniform(model.n_layers, 4, first, &err);
    run_case(PP_SCHED_1F1B, 4, 1, 4, first, "uniform, 2 steps, rows-weighted loss", &w, &gref, loss_ref, &b, 2);
    free(wbuf);
    free(gbuf);
}

int main(void) {
    test_grid();
    test_accumulate_two_steps();
    return TEST_DONE("pipeline");
}
