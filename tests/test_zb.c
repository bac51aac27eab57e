/* tests/test_zb.c - zero-bubble schedules (ZB-H1, ZB-V), the split backward (B and W) and
   schedules as text tables.

   - ZB-H1 and ZB-V: deadlock-free over a grid, every stage's F, B and W in ascending micro-batch
     order, ZB-H1's bubble equal to its closed form with unit F = B = W, peak stashes equal to
     the theory (ZB-H1 min(p, m), ZB-V 2 min(p, m) chunk stashes: 1F1B's memory).
   - Pipelined gradients of the split MLP (examples/mlp.h, PP_MODEL_SPLIT) on the threads
     transport equal the sequential reference bit for bit (memcmp) for ZB-H1, ZB-V, a parsed
     table and the classic schedules (which run W inside B); the executor's stash peak matches
     the simulator's (stashes live until W).
   - Text tables: round trip, and malformed or deadlocking tables rejected with a message that
     names the line and column, or the rank and action. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <math.h>

#define ROWS 29
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

/* ---- schedules alone -------------------------------------------------------------------------- */

static pp_sim_cost unit3(void) {
    pp_sim_cost c;
    memset(&c, 0, sizeof c);
    c.f = c.b = c.w = 1;
    return c;
}

/* Every stage runs its F's, B's and W's each in ascending micro-batch order. */
static int ascending(const pp_schedule* s) {
    int next[3][64], r, i, st, op;
    for (op = 0; op < 3; op++)
        for (st = 0; st < s->n_stages; st++) next[op][st] = 0;
    for (r = 0; r < s->p; r++) {
        const pp_action* a = pp_schedule_rank(s, r);
        for (i = 0; i < s->per_rank; i++) {
            if (a[i].mb != next[a[i].op][a[i].stage]) return 0;
            next[a[i].op][a[i].stage]++;
        }
    }
    return 1;
}

static void test_zb_schedules(void) {
    int p, m, fails = 0, runs = 0;
    for (p = 1; p <= 8; p++)
        for (m = 1; m <= 32; m++) {
            int k;
            for (k = PP_SCHED_ZB_H1; k <= PP_SCHED_ZB_V; k++) {
                int v = k == PP_SCHED_ZB_V ? 2 : 1, r, ok = 1;
                size_t n = pp_schedule_size((pp_schedule_kind)k, p, v, m);
                pp_action* acts = (pp_action*)malloc(n * sizeof *acts);
                pp_schedule s;
                pp_sim_result res;
                pp_sim_cost cu = unit3(), cc;
                pp_error err;
                runs++;
                ok = n == (size_t)p * 3 * v * m && acts &&
                     pp_schedule_make((pp_schedule_kind)k, p, v, m, acts, n, &s, &err) == PP_OK &&
                     pp_schedule_has_w(&s) && pp_simulate(&s, &cu, &res, NULL, &err) == PP_OK;
                if (!ok) {
                    if (fails++ < 5) printf("  %s p=%d m=%d: %s\n", pp_schedule_name((pp_schedule_kind)k), p, m, err.msg);
                    free(acts);
                    continue;
                }
                ok = ascending(&s);
                if (!ok && fails++ < 5) printf("  %s p=%d m=%d: a stage runs out of order\n", pp_schedule_name(s.kind), p, m);
                if (k == PP_SCHED_ZB_H1) {
                    /* closed form: makespan 3m + p - 1, bubble (p-1)/(3m+p-1) for m >= p */
                    if (m >= p) {
                        double want = (double)(p - 1) / (double)(3 * m + p - 1);
                        if (fabs(res.bubble - want) > 1e-12 || fabs(res.makespan - (3.0 * m + p - 1)) > 1e-9) {
                            if (fails++ < 5)
                                printf("  zb-h1 p=%d m=%d: bubble %.15f want %.15f, makespan %g\n", p, m, res.bubble, want,
                                       res.makespan);
                        }
                    }
                    for (r = 0; r < p; r++)
                        if (res.peak_live[r] != (p < m ? p : m) && fails++ < 5)
                            printf("  zb-h1 p=%d m=%d rank %d: peak %d want %d\n", p, m, r, res.peak_live[r], p < m ? p : m);
                } else {
                    /* V: 2 min(p, m) chunk stashes on every rank = 1F1B's min(p, m) whole stages */
                    for (r = 0; r < p; r++)
                        if (res.peak_live[r] != 2 * (p < m ? p : m) && fails++ < 5)
                            printf("  zb-v p=%d m=%d rank %d: peak %d want %d\n", p, m, r, res.peak_live[r],
                                   2 * (p < m ? p : m));
                }
                /* costs change times, never the deadlock verdict or the peak */
                memset(&cc, 0, sizeof cc);
                cc.f = 1.3, cc.b = 0.7, cc.w = 2.1, cc.comm = 0.4;
                {
                    pp_sim_result r2;
                    if (pp_simulate(&s, &cc, &r2, NULL, &err) != PP_OK || r2.peak_live[0] != res.peak_live[0]) {
                        if (fails++ < 5) printf("  %s p=%d m=%d other costs: %s\n", pp_schedule_name(s.kind), p, m, err.msg);
                    }
                }
                free(acts);
            }
        }
    CHECK(fails == 0, "%d of %d zero-bubble schedules failed", fails, runs);
    CHECK(runs == 8 * 32 * 2, "ran %d", runs);
}

/* The bubble table of docs/schedules.md, checked: unit costs per chunk, same model (a V chunk is
   half a stage, so F = B = W = 1 per stage is 0.5 per V chunk). */
static void test_bubble_order(void) {
    int p = 4, m = 8, k;
    double mk[PP_SCHED_KIND_COUNT];
    for (k = PP_SCHED_1F1B; k < PP_SCHED_KIND_COUNT; k++) {
        int v = k == PP_SCHED_INTERLEAVED || k == PP_SCHED_ZB_V ? 2 : 1;
        size_t n = pp_schedule_size((pp_schedule_kind)k, p, v, m);
        pp_action* acts = (pp_action*)malloc(n * sizeof *acts);
        pp_schedule s;
        pp_sim_result res;
        pp_sim_cost c = unit3();
        pp_error err;
        c.f = c.b = c.w = 1.0 / v;
        CHECK(pp_schedule_make((pp_schedule_kind)k, p, v, m, acts, n, &s, &err) == PP_OK, "%s", err.msg);
        CHECK(pp_simulate(&s, &c, &res, NULL, &err) == PP_OK, "%s", err.msg);
        mk[k] = res.makespan;
        free(acts);
    }
    /* 1F1B: 3(m+p-1); interleaved: 3m + 3(p-1)/2; ZB-H1: 3m + p-1 */
    CHECK(fabs(mk[PP_SCHED_1F1B] - 3.0 * (m + p - 1)) < 1e-9, "1f1b makespan %g", mk[PP_SCHED_1F1B]);
    CHECK(fabs(mk[PP_SCHED_INTERLEAVED] - (3.0 * m + 1.5 * (p - 1))) < 1e-9, "interleaved makespan %g",
          mk[PP_SCHED_INTERLEAVED]);
    CHECK(fabs(mk[PP_SCHED_ZB_H1] - (3.0 * m + p - 1)) < 1e-9, "zb-h1 makespan %g", mk[PP_SCHED_ZB_H1]);
    CHECK(mk[PP_SCHED_ZB_V] < mk[PP_SCHED_ZB_H1], "zb-v %g not below zb-h1 %g", mk[PP_SCHED_ZB_V], mk[PP_SCHED_ZB_H1]);
}

/* ---- text tables ------------------------------------------------------------------------------ */

static pp_result parse_str(const char* txt, pp_action** acts, pp_schedule* s, pp_error* err) {
    size_t need = 0;
    pp_result rc = pp_schedule_parse(txt, strlen(txt), NULL, 0, &need, s, err);
    *acts = NULL;
    if (rc != PP_ERR_SIZE) return rc;
    *acts = (pp_action*)malloc(need * sizeof **acts);
    return pp_schedule_parse(txt, strlen(txt), *acts, need, &need, s, err);
}

static void test_round_trip(void) {
    int k;
    for (k = 0; k < PP_SCHED_KIND_COUNT; k++) {
        int p = 3, m = 5, v = k == PP_SCHED_INTERLEAVED || k == PP_SCHED_ZB_V ? 2 : 1;
        size_t n = pp_schedule_size((pp_schedule_kind)k, p, v, m), len = 0;
        pp_action *acts = (pp_action*)malloc(n * sizeof *acts), *back = NULL;
        pp_schedule s, t;
        pp_error err;
        char* buf = NULL;
        FILE* f;
        CHECK(pp_schedule_make((pp_schedule_kind)k, p, v, m, acts, n, &s, &err) == PP_OK, "%s", err.msg);
        f = open_memstream(&buf, &len);
        pp_schedule_write(f, &s);
        fclose(f);
        CHECK(parse_str(buf, &back, &t, &err) == PP_OK, "%s round trip: %s\n%s", pp_schedule_name(s.kind), err.msg, buf);
        CHECK(back && t.p == s.p && t.v == s.v && t.m == s.m && t.per_rank == s.per_rank && t.map == s.map &&
                  t.kind == PP_SCHED_CUSTOM && memcmp(back, acts, n * sizeof *acts) == 0,
              "%s: parsed table differs from the generated one", pp_schedule_name(s.kind));
        free(buf);
        free(back);
        free(acts);
    }
}

/* One bad table: rejected with code want and a message containing needle. */
static void bad_table(const char* txt, pp_result want, const char* needle) {
    pp_action* acts;
    pp_schedule s;
    pp_error err;
    pp_result rc;
    memset(&err, 0, sizeof err);
    rc = parse_str(txt, &acts, &s, &err);
    CHECK(rc == want && strstr(err.msg, needle) != NULL, "table <<%s>> gave %s '%s', want %s with '%s'", txt,
          pp_result_str(rc), err.msg, pp_result_str(want), needle);
    free(acts);
}

static void test_bad_tables(void) {
    /* a good one first */
    bad_table("# ok\nschedule p=2 v=1 m=2\nr0: F0 F1 B0 B1\nr1: F0 B0 F1 B1\n", PP_OK, "");
    bad_table("", PP_ERR_INVALID, "empty");
    bad_table("# only a comment\n", PP_ERR_INVALID, "empty");
    bad_table("sched p=2\n", PP_ERR_INVALID, "line 1, column 1: expected the header");
    bad_table("schedule p=2 m=2\nr0: F0 B0\n", PP_ERR_INVALID, "lacks v=");
    bad_table("schedule p=2 v=1 m=2 q=3\n", PP_ERR_INVALID, "line 1, column 22: unknown header field");
    bad_table("schedule p=x v=1 m=2\n", PP_ERR_INVALID, "line 1, column 12: expected p (a number), got 'x'");
    bad_table("schedule p=0 v=1 m=2\n", PP_ERR_INVALID, "out of range");
    bad_table("schedule p=1 v=1 m=99999999999\n", PP_ERR_INVALID, "too large");
    bad_table("schedule p=2 v=1 m=2 map=v\n", PP_ERR_INVALID, "map=v needs v=2");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0 B1\n", PP_ERR_INVALID, "1 rank line, the header says p=2");
    bad_table("schedule p=2 v=1 m=2\n\nr0: F0 F1 X0 B1\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID,
              "line 3, column 11: expected an action F, B or W, got 'X'");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B B1\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID,
              "line 2, column 12: expected a micro-batch (a number)");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0B1\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID, "line 2, column 13: expected a space");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0 B2\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID,
              "line 2, column 14: micro-batch 2, but m=2");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0 B1.1\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID, "chunk 1, but v=1");
    bad_table("schedule p=2 v=1 m=2\nr1: F0 F1 B0 B1\nr0: F0 B0 F1 B1\n", PP_ERR_INVALID, "line 2, column 2: rank 1 where rank 0");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0\nr1: F0 B0 F1 B1\n", PP_ERR_INVALID, "rank 0 has 3 actions");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0 B1\nr1: F0 B0 F1\n", PP_ERR_INVALID, "line 3: rank 1 has 3 actions");
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F1 B0 B1\nr1: F0 B0 F1 B1\nr2: F0\n", PP_ERR_INVALID,
              "line 4, column 1: more than p=2 rank lines");
    /* structure, found by the simulator: duplicates, missing actions, B before F, W before B */
    bad_table("schedule p=2 v=1 m=2\nr0: F0 F0 B0 B1\nr1: F0 B0 F1 B1\n", PP_ERR_SCHEDULE, "duplicate F0.0");
    bad_table("schedule p=1 v=1 m=2\nr0: B0 F0 F1 B1\n", PP_ERR_SCHEDULE, "B0.0 comes before its forward");
    bad_table("schedule p=1 v=1 m=1\nr0: F0 W0 B0\n", PP_ERR_SCHEDULE, "W0.0 comes before its backward");
    bad_table("schedule p=1 v=2 m=1\nr0: F0.0 F0.1 B0.1 B0.1\n", PP_ERR_SCHEDULE, "duplicate B0.1");
    /* a deadlock: rank 0 waits for B0 from rank 1, which waits for F1 that rank 0 runs after B0 */
    bad_table("schedule p=2 v=1 m=2\nr0: F0 B0 F1 B1\nr1: F1 F0 B0 B1\n", PP_ERR_DEADLOCK, "rank 1 waits at #0 F1.0 for rank 0");
    /* the V map: rank 0 holds stages 0 and 3 of p=2, rank 1 stages 1 and 2; the F chain runs
       r0 -> r1 -> r1 -> r0, so rank 0 must not start chunk 1 before chunk 0 (CRLF is fine) */
    bad_table("schedule p=2 v=2 m=1 map=v\r\nr0: F0.0 F0.1 B0.1 B0.0\r\nr1: F0.0 F0.1 B0.1 B0.0\r\n", PP_OK, "");
    bad_table("schedule p=2 v=2 m=1 map=v\nr0: F0.1 F0.0 B0.1 B0.0\nr1: F0.0 F0.1 B0.1 B0.0\n", PP_ERR_DEADLOCK,
              "rank 0 waits at #0 F0.1 for rank 1");
    {
        /* the size protocol: out NULL answers PP_ERR_SIZE with the count */
        const char* t = "schedule p=2 v=1 m=2\nr0: F0 F1 B0 W0 B1 W1\nr1: F0 B0 F1 B1 W0 W1\n";
        size_t need = 0;
        pp_schedule s;
        pp_action few[4];
        CHECK(pp_schedule_parse(t, strlen(t), NULL, 0, &need, &s, NULL) == PP_ERR_SIZE && need == 12, "need %lu",
              (unsigned long)need);
        CHECK(pp_schedule_parse(t, strlen(t), few, 4, &need, &s, NULL) == PP_ERR_SIZE, "cap too small");
        CHECK(pp_schedule_parse(t, 10, NULL, 0, &need, &s, NULL) == PP_ERR_INVALID, "cut short");
        CHECK(pp_schedule_parse(NULL, 5, NULL, 0, &need, &s, NULL) == PP_ERR_INVALID, "NULL text");
    }
}

/* ---- gradients on the threads transport ------------------------------------------------------- */

/* The second step's batch, when there is one. */
static const pp_batch* zb_batch_of(hx_world* W, int rank, int step, pp_batch* tmp) {
    (void)rank;
    (void)tmp;
    return step == 0 ? W->batch : (const pp_batch*)W->user;
}

typedef struct ref {
    mlp_model w;            /* weights */
    mlpz_model wz;          /* the same weights, split model's view */
    mlp_model g;            /* reference gradient */
    float loss;
} ref;

/* Runs sched on the threads transport with the split (or fused) model; compares with ref. */
static pp_shape_policy g_shapes = PP_SHAPES_LOCAL;
static const pp_batch* g_batch2 = NULL;

static int run_sched(const pp_schedule* sched, const int* first, int split, const ref* R, const pp_batch* b,
                     const char* what) {
    static hx_world W;
    mlp_model g[PP_MAX_RANKS];
    mlpz_model gz[PP_MAX_RANKS];
    float* gbuf[PP_MAX_RANKS];
    pp_error err;
    pp_sim_result sim;
    int r, ok = 1, p = sched->p;
    memset(&W, 0, sizeof W);
    W.model = split ? mlpz_model_desc() : mlp_model_desc();
    W.w = split ? (const void*)&R->wz : (const void*)&R->w;
    W.sched = sched;
    W.first = first;
    W.batch = b;
    W.stage.timeout_s = 20;
    W.stage.shapes = g_shapes;
    if (g_batch2) {
        W.steps = 2;
        W.batch_of = zb_batch_of;
        W.user = (void*)(uintptr_t)g_batch2;
    }
    hx_mlp_rank_grads(g, gbuf, p, DIMS);
    for (r = 0; r < p; r++) {
        mlpz_from_mlp(&gz[r], &g[r]);
        W.g[r] = split ? (void*)&gz[r] : (void*)&g[r];
    }
    if (hx_run(&W, p, &err) != PP_OK) {
        hx_report(&W, p, what);
        ok = 0;
    }
    ok = ok && hx_mlp_grads_match(g, p, sched, first, &R->g, 0, what);
    if (ok) {
        ok = hx_loss_matches(W.stats, p, sched, R->loss, what);
        /* the executor's stash peak is the simulator's: stashes live until W when W is deferred */
        if (split && pp_simulate(sched, NULL, &sim, NULL, &err) == PP_OK)
            for (r = 0; r < p; r++)
                if (W.stats[r].peak_live != sim.peak_live[r]) {
                    CHECK(0, "%s: rank %d executor peak %d, simulator %d", what, r, W.stats[r].peak_live, sim.peak_live[r]);
                    ok = 0;
                }
    }
    hx_mlp_free_grads(gbuf, p);
    CHECK(ok, "%s", what);
    return ok;
}

static int run_kind(pp_schedule_kind k, int p, int v, int m, const int* first, int split, const ref* R, const pp_batch* b,
                    const char* part) {
    hx_sched s;
    pp_error err;
    char what[160];
    int ok;
    snprintf(what, sizeof what, "%s p=%d v=%d m=%d %s model, %s partition", pp_schedule_name(k), p, v, m,
             split ? "split" : "fused", part);
    if (hx_sched_make(&s, k, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: %s", what, err.msg);
        return 0;
    }
    ok = run_sched(&s.s, first, split, R, b, what);
    hx_sched_free(&s);
    return ok;
}

static void make_batch(pp_batch* b, float* x, int32_t* y, int m) { hx_dense_batch(b, x, y, ROWS, HX_IN, m); }

static void test_gradients(void) {
    static const int ms[] = {1, 2, 3, 5, 8};
    static ref R;
    float *wbuf, *gbuf, x[ROWS * HX_IN];
    int32_t y[ROWS];
    pp_batch b;
    pp_error err;
    pp_model fused = mlp_model_desc(), split = mlpz_model_desc();
    int mi, p, cases = 0, good = 0;
    memset(&R, 0, sizeof R);
    wbuf = mlp_init(&R.w, &R.g, DIMS, 17, &gbuf);
    mlpz_from_mlp(&R.wz, &R.w);
    mlp_make_data(x, y, ROWS, HX_IN, HX_CLASSES, 11, 12);
    CHECK(split.weight_grad != NULL && fused.weight_grad == NULL, "PP_MODEL_SPLIT sets weight_grad, PP_MODEL does not");
    for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
        int m = ms[mi];
        mlpz_model gz;
        float loss_split;
        make_batch(&b, x, y, m);
        /* the split reference (B then W per micro-batch) equals the fused one bit for bit */
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        CHECK(pp_sequential_step(&fused, &R.w, &R.g, &b, &R.loss, &err) == PP_OK, "%s", err.msg);
        {
            float* copy = (float*)malloc(mlp_param_count(DIMS) * sizeof(float));
            memcpy(copy, gbuf, mlp_param_count(DIMS) * sizeof(float));
            memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
            mlpz_from_mlp(&gz, &R.g);
            CHECK(pp_sequential_step(&split, &R.wz, &gz, &b, &loss_split, &err) == PP_OK, "%s", err.msg);
            CHECK(memcmp(copy, gbuf, mlp_param_count(DIMS) * sizeof(float)) == 0 && loss_split == R.loss,
                  "m=%d: split reference differs from the fused one", m);
            free(copy);
        }
        for (p = 1; p <= 4; p++) {
            int first[9], part;
            for (part = 0; part < 2; part++) {
                const char* pname = part ? "skewed" : "uniform";
                int s;
                /* ZB-H1 (v = 1) */
                if (part == 0) pp_partition_uniform(MLP_DEPTH + 1, p, first, &err);
                else {
                    first[0] = 0;
                    for (s = 1; s <= p; s++) first[s] = MLP_DEPTH + 1 - (p - s);
                }
                cases += 3;
                good += run_kind(PP_SCHED_ZB_H1, p, 1, m, first, 1, &R, &b, pname);
                good += run_kind(PP_SCHED_ZB_H1, p, 1, m, first, 0, &R, &b, pname);
                good += run_kind(PP_SCHED_1F1B, p, 1, m, first, 1, &R, &b, pname); /* W inside B */
                /* ZB-V and interleaved (2p stages) */
                if (part == 0) pp_partition_uniform(MLP_DEPTH + 1, 2 * p, first, &err);
                else {
                    first[0] = 0;
                    for (s = 1; s <= 2 * p; s++) first[s] = MLP_DEPTH + 1 - (2 * p - s);
                }
                cases += 3;
                good += run_kind(PP_SCHED_ZB_V, p, 2, m, first, 1, &R, &b, pname);
                good += run_kind(PP_SCHED_ZB_V, p, 2, m, first, 0, &R, &b, pname);
                good += run_kind(PP_SCHED_INTERLEAVED, p, 2, m, first, 1, &R, &b, pname);
            }
        }
    }
    /* a hand-written table: p = 2, m = 3, W deferred on rank 1 until the end, rank 0 runs its
       second forward late */
    {
        const char* t = "# hand-tuned\n"
                        "schedule p=2 v=1 m=3   # map=loop is the default\n"
                        "r0: F0 B0 F1 F2 W0 B1 W1 B2 W2\n"
                        "r1: F0 B0 F1 B1 F2 B2 W0 W1 W2\n";
        pp_action* acts;
        pp_schedule s;
        int first[3];
        make_batch(&b, x, y, 3);
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        pp_sequential_step(&fused, &R.w, &R.g, &b, &R.loss, &err);
        CHECK(parse_str(t, &acts, &s, &err) == PP_OK, "hand table: %s", err.msg);
        pp_partition_uniform(MLP_DEPTH + 1, 2, first, &err);
        cases += 2;
        good += run_sched(&s, first, 1, &R, &b, "parsed table p=2 m=3, split model");
        good += run_sched(&s, first, 0, &R, &b, "parsed table p=2 m=3, fused model");
        free(acts);
    }
    /* a V table written by hand for p = 2, m = 2 (stages 0,3 on rank 0 and 1,2 on rank 1) */
    {
        const char* t = "schedule p=2 v=2 m=2 map=v\n"
                        "r0: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 W0.1 B0.0 W1.1 B1.0 W0.0 W1.0\n"
                        "r1: F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0 W0.1 W0.0 W1.1 W1.0\n";
        pp_action* acts;
        pp_schedule s;
        int first[5];
        make_batch(&b, x, y, 2);
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        pp_sequential_step(&fused, &R.w, &R.g, &b, &R.loss, &err);
        CHECK(parse_str(t, &acts, &s, &err) == PP_OK, "hand V table: %s", err.msg);
        pp_partition_uniform(MLP_DEPTH + 1, 4, first, &err);
        cases += 1;
        good += run_sched(&s, first, 1, &R, &b, "parsed V table p=2 m=2, split model");
        free(acts);
    }
    /* the shape policies that send metadata, with deferred W (the V's turn is a send to self) */
    {
        static const char* const pol_name[] = {"local", "broadcast", "per_message", "auto"};
        int pol, k;
        pp_batch b2;
        /* two steps whose shapes differ (the second batch has fewer rows), so AUTO re-learns */
        make_batch(&b, x, y, 5);
        make_batch(&b2, x, y, 5);
        b2.input.rows = ROWS - 6;
        memset(gbuf, 0, mlp_param_count(DIMS) * sizeof(float));
        pp_sequential_step(&fused, &R.w, &R.g, &b, &R.loss, &err);
        pp_sequential_step(&fused, &R.w, &R.g, &b2, &R.loss, &err);
        g_batch2 = &b2;
        for (pol = PP_SHAPES_BROADCAST; pol <= PP_SHAPES_AUTO; pol++)
            for (k = PP_SCHED_ZB_H1; k <= PP_SCHED_ZB_V; k++)
                for (p = 2; p <= 3; p++) {
                    int v = k == PP_SCHED_ZB_V ? 2 : 1, first[9];
                    char part[64];
                    pp_partition_uniform(MLP_DEPTH + 1, p * v, first, &err);
                    snprintf(part, sizeof part, "uniform, shapes %s", pol_name[pol]);
                    g_shapes = (pp_shape_policy)pol;
                    cases++;
                    good += run_kind((pp_schedule_kind)k, p, v, 5, first, 1, &R, &b, part);
                }
        g_shapes = PP_SHAPES_LOCAL;
        g_batch2 = NULL;
    }
    printf("gradient equality: %d of %d configurations bit-exact\n", good, cases);
    free(wbuf);
    free(gbuf);
}

/* ---- measured auto-partition --------------------------------------------------------------- */

/* Brute force: every composition of L layers into S non-empty stages. */
static double brute_capped(const double* w, const double* mem, double cap, int L, int S) {
    double best = 1e308;
    int cuts[8], k;
    for (k = 0; k < S; k++) cuts[k] = k; /* stage k starts at cuts[k] */
    for (;;) {
        double worst = 0;
        int ok = 1, st;
        for (st = 0; st < S; st++) {
            int a = cuts[st], b = st + 1 < S ? cuts[st + 1] : L, l;
            double sw = 0, sm = 0;
            for (l = a; l < b; l++) sw += w[l], sm += mem[l];
            if (sm > cap) ok = 0;
            if (sw > worst) worst = sw;
        }
        if (ok && worst < best) best = worst;
        /* next composition: advance the last cut that can move */
        for (k = S - 1; k >= 1; k--)
            if (cuts[k] < L - (S - k)) break;
        if (k < 1) break;
        cuts[k]++;
        for (st = k + 1; st < S; st++) cuts[st] = cuts[st - 1] + 1;
    }
    return best;
}

static void test_partition_capped(void) {
    uint64_t seed = 5;
    int t, fails = 0;
    double w[5] = {1, 1, 1, 1, 10}, mem[5] = {1, 1, 1, 1, 1};
    int first[9];
    pp_error err;
    CHECK(pp_partition_capped(w, mem, 3, 5, 2, first, &err) == PP_OK && first[1] == 3, "capped split at %d: %s", first[1],
          err.msg);
    CHECK(pp_partition_capped(w, mem, 2, 5, 2, first, &err) == PP_ERR_SIZE && strstr(err.msg, "no split"), "%s", err.msg);
    mem[4] = 7;
    CHECK(pp_partition_capped(w, mem, 5, 5, 2, first, &err) == PP_ERR_SIZE && strstr(err.msg, "layer 4 alone"), "%s",
          err.msg);
    for (t = 0; t < 300; t++) {
        double ww[8], mm[8], cap, want, got = -1, mx = 0;
        int L = 1 + (int)(mlp_rng_next(&seed) % 8), S = 1 + (int)(mlp_rng_next(&seed) % (uint64_t)L), l, st;
        pp_result rc;
        for (l = 0; l < L; l++) {
            ww[l] = (double)(mlp_rng_next(&seed) % 10);
            mm[l] = (double)(1 + mlp_rng_next(&seed) % 5);
            if (mm[l] > mx) mx = mm[l];
        }
        cap = mx + (double)(mlp_rng_next(&seed) % 12);
        want = brute_capped(ww, mm, cap, L, S);
        rc = pp_partition_capped(ww, mm, cap, L, S, first, &err);
        if (rc == PP_OK) {
            got = 0;
            for (st = 0; st < S; st++) {
                double sw = 0, sm = 0;
                for (l = first[st]; l < first[st + 1]; l++) sw += ww[l], sm += mm[l];
                if (sm > cap) got = 1e300;
                if (sw > got) got = sw;
            }
        }
        if ((want >= 1e308) != (rc == PP_ERR_SIZE) || (rc == PP_OK && got != want)) {
            if (fails++ < 3) printf("  capped L=%d S=%d cap=%g: got %g (%s), brute force %g\n", L, S, cap, got, pp_result_str(rc), want);
        }
    }
    CHECK(fails == 0, "%d capped partitions differ from brute force", fails);
}

static void test_profile(void) {
    mlp_model w, g, gref, tmp;
    mlpz_model wz, gz, gzref;
    float *wbuf, *gbuf, *gbuf2, x[ROWS * HX_IN], loss;
    int32_t y[ROWS];
    double tf[MLP_DEPTH + 1], tb[MLP_DEPTH + 1], tw[MLP_DEPTH + 1];
    pp_model split = mlpz_model_desc();
    pp_batch b;
    pp_error err;
    int l, ok = 1, i;
    memset(&w, 0, sizeof w);
    wbuf = mlp_init(&w, &g, DIMS, 3, &gbuf);
    free(mlp_init(&tmp, &gref, DIMS, 3, &gbuf2));
    mlpz_from_mlp(&wz, &w);
    mlpz_from_mlp(&gz, &g);
    mlpz_from_mlp(&gzref, &gref);
    mlp_make_data(x, y, ROWS, HX_IN, HX_CLASSES, 4, 5);
    make_batch(&b, x, y, 3);
    CHECK(pp_profile_layers(&split, &wz, &gz, &b, 2, tf, tb, tw, &err) == PP_OK, "%s", err.msg);
    for (l = 0; l <= MLP_DEPTH; l++) ok = ok && tf[l] >= 0 && tb[l] >= 0 && tw[l] >= 0;
    CHECK(ok, "profile times must be >= 0");
    /* the profile ran 3 steps of the sequential reference, in its order */
    for (i = 0; i < 3; i++) pp_sequential_step(&split, &wz, &gzref, &b, &loss, &err);
    CHECK(memcmp(gbuf, gbuf2, mlp_param_count(DIMS) * sizeof(float)) == 0, "profile gradients differ from 3 reference steps");
    CHECK(pp_profile_layers(&split, &wz, &gz, &b, 0, tf, tb, tw, &err) == PP_ERR_INVALID, "steps = 0");
    free(wbuf);
    free(gbuf);
    free(gbuf2);
}

int main(void) {
    test_zb_schedules();
    test_bubble_order();
    test_round_trip();
    test_bad_tables();
    test_gradients();
    test_partition_capped();
    test_profile();
    return TEST_DONE("zb");
}
