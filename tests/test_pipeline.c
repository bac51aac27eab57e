/* tests/test_pipeline.c - pipelined training steps equal the sequential reference, bit for bit.

   Every built-in schedule runs each stage's backwards in ascending micro-batch order, which is
   the order of the sequential reference, so each gradient element is the same sum of the same
   products in the same order: we compare with memcmp, not a tolerance. Each rank has its own
   gradient buffers, and a rank must leave the layers it does not own untouched (zero). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define ROWS 33
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

/* One configuration: pipelined step(s) vs reference step(s). Returns 1 when equal. */
static int run_case(pp_schedule_kind kind, int p, int v, int m, const int* first, const char* part_name,
                    const mlp_model* w, const mlp_model* gref, float loss_ref, const pp_batch* batch, int steps) {
    static hx_world W;
    mlp_model g[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    hx_sched sc;
    pp_error err;
    int ok = 1;
    char where[160];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d partition=%s", pp_schedule_name(kind), p, v, m, part_name);
    if (hx_sched_make(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule: %s", where, err.msg);
        return 0;
    }
    hx_mlp_world(&W, w, &sc.s, first, batch, steps, g, gbuf, DIMS);
    if (hx_run(&W, p, &err) != PP_OK) {
        hx_report(&W, p, where);
        ok = 0;
    }
    ok = ok && hx_mlp_grads_match(g, p, &sc.s, first, gref, 1, where);
    ok = ok && hx_loss_matches(W.stats, p, &sc.s, loss_ref, where);
    hx_mlp_free_grads(gbuf, p);
    hx_sched_free(&sc);
    if (ok) CHECK(1, "%s", where);
    return ok;
}

static void test_grid(void) {
    static const int ms[] = {1, 2, 3, 4, 7, 8, 16};
    hx_mlp f;
    pp_batch b;
    pp_error err;
    pp_model model = mlp_model_desc();
    double cost[MLP_DEPTH + 1];
    pp_tensor sample;
    int kind, p, v, mi, part, cases = 0, good = 0;
    hx_mlp_init(&f, DIMS, 42, ROWS, 7, 99);
    memset(&sample, 0, sizeof sample);
    sample.rows = ROWS;
    sample.cols = HX_IN;
    sample.dtype = PP_F32;
    CHECK(pp_model_layer_costs(&model, &f.w, &sample, cost, NULL, &err) == PP_OK, "%s", err.msg);
    for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
        int m = ms[mi];
        hx_dense_batch(&b, f.x, f.y, ROWS, HX_IN, m);
        if (hx_mlp_reference(&f, &b, 1, &err) != PP_OK) {
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
                        good += run_case((pp_schedule_kind)kind, p, v, m, first, pname, &f.w, &f.gref, f.loss, &b, 1);
                    }
                }
    }
    printf("gradient equality: %d of %d configurations bit-exact\n", good, cases);
    hx_mlp_free(&f);
}

/* Two steps accumulate: the gradient after two pipelined steps equals two reference steps. */
static void test_accumulate_two_steps(void) {
    hx_mlp f;
    pp_batch b;
    pp_error err;
    int first[5];
    hx_mlp_init(&f, DIMS, 3, ROWS, 5, 6);
    hx_dense_batch(&b, f.x, f.y, ROWS, HX_IN, 4);
    b.loss = PP_LOSS_MEAN_ROWS;
    hx_mlp_reference(&f, &b, 2, &err);
    pp_partition_uniform(f.model.n_layers, 4, first, &err);
    run_case(PP_SCHED_1F1B, 4, 1, 4, first, "uniform, 2 steps, rows-weighted loss", &f.w, &f.gref, f.loss, &b, 2);
    hx_mlp_free(&f);
}

int main(void) {
    test_grid();
    test_accumulate_two_steps();
    return TEST_DONE("pipeline");
}
