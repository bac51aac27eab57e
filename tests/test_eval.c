/* tests/test_eval.c - evaluations (forward-only steps): pp_schedule_make_eval, pp_stage_eval,
   pp_pipeline_eval, pp_sequential_eval.

   Checked:
   - lists: for every kind, p 1..4, its v's and m 1..9, the forward-only list covers every
     (micro-batch, stage) once on the rank and chunk the training list runs it, in ascending
     micro-batch order per stage, the simulator proves it and finds each rank's peak at most 2
     (1 where no stage of the rank feeds another); written as a table it parses back; the
     simulator refuses a B in it, the parser an F-only table without eval=1, pp_stage_create a
     forward-only schedule.
   - grid: every kind x p 1..4 x its v's x m x dense and packed batches, outputs to each rank in
     turn: the loss equals pp_sequential_eval's bit for bit (which equals pp_sequential_step's),
     the outputs (the last layer's input: logits) byte for byte, every gradient stays zero, and
     each rank's peak stash equals the simulator's for the forward-only list (at most 2).
   - between: training, evaluation, training accumulates the same gradient bits as training,
     training (1F1B, interleaved, ZB-V, DualPipeV at p = 4; the split model on ZB-H1).
   - shapes: BROADCAST, AUTO and PER_MESSAGE, training steps of other shapes in between: the
     loss, and outputs on the last stage's rank; to another rank BROADCAST gives them, AUTO and
     PER_MESSAGE refuse (PP_ERR_UNSUPPORTED).
   - errors: a buffer too small (PP_ERR_SIZE, nothing written, the next evaluation fine), an
     output rank outside the pipeline (PP_ERR_INVALID); a layer failing in an evaluation, with
     the transport's abort and drained (abort_local, as over NCCL): every rank fails, the next
     evaluation and training step are exact.
   - sync: over the per-rank API, a rank that runs a training step while the others evaluate
     (or wants the outputs on another rank) fails the step on every rank at once, naming both
     kinds; the next training step is bit-exact.
   - a bad output rank on one rank only (pp_stage_eval, pp_eval_out.rank 7, -1 or p): every rank
     fails at once, that one with PP_ERR_INVALID naming it (`test_eval badrank`).
   Negative controls (build/eval-controls): -DPP_TEST_NO_EVAL_FREE keeps every stash to the
   step's end (the grid's peak check fails); -DPP_TEST_NO_EVAL_SYNC leaves the step's kind out
   of the step's identity (the sync case runs into its deadline and fails); (build/failpath-controls)
   -DPP_TEST_EVAL_RANK_EARLY refuses a bad output rank alone, before the step (the others run
   into their deadline: badrank fails). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#define ROWS 41
#define NSEQ 9
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
static const int32_t CU[NSEQ + 1] = {0, 3, 4, 11, 20, 22, 30, 31, 40, 41};

static hx_mlp F;

/* 1 when some stage of rank r feeds another stage of r (the turn of the V; every boundary at p = 1). */
static int has_turn(const pp_schedule* s, int r) {
    int st, a, b;
    for (st = 1; st < s->n_stages; st++) {
        pp_schedule_stage_to_rank(s, st - 1, &a, NULL);
        pp_schedule_stage_to_rank(s, st, &b, NULL);
        if (a == r && b == r) return 1;
    }
    return 0;
}

/* ---- lists ------------------------------------------------------------------------------------ */
static void check_list(pp_schedule_kind kind, int p, int v, int m) {
    hx_sched sc;
    pp_schedule e;
    pp_action* acts;
    pp_sim_result* res = (pp_sim_result*)calloc(1, sizeof *res);
    pp_error err;
    char where[96];
    size_t n;
    int r, i, ok = 1;
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d", pp_schedule_name(kind), p, v, m);
    if (hx_sched_make(&sc, kind, p, v, m, &err) != PP_OK) {
        CHECK(0, "%s: schedule: %s", where, err.msg);
        free(res);
        return;
    }
    n = pp_schedule_eval_size(&sc.s);
    CHECK(n == (size_t)p * v * m, "%s: eval size %zu", where, n);
    acts = (pp_action*)calloc(n, sizeof *acts);
    CHECK(pp_schedule_make_eval(&sc.s, acts, n - 1, &e, &err) == PP_ERR_SIZE, "%s: a short array is refused", where);
    if (pp_schedule_make_eval(&sc.s, acts, n, &e, &err) != PP_OK) {
        CHECK(0, "%s: make_eval: %s", where, err.msg);
        ok = 0;
    }
    if (ok) {
        int last[64 * 8];
        CHECK(e.forward_only == 1 && e.per_rank == m * v && e.map == sc.s.map && e.kind == kind, "%s: header", where);
        for (i = 0; i < p * v; i++) last[i] = -1;
        for (r = 0; r < p; r++) {
            const pp_action* l = pp_schedule_rank(&e, r);
            for (i = 0; i < e.per_rank; i++) {
                int rr, cc;
                pp_schedule_stage_to_rank(&sc.s, l[i].stage, &rr, &cc);
                if (l[i].op != PP_OP_F || rr != r || cc != l[i].chunk || l[i].mb <= last[l[i].stage]) {
                    CHECK(0, "%s: rank %d action %d: op %d mb %d stage %d chunk %d (training: rank %d chunk %d, after mb %d)",
                          where, r, i, l[i].op, l[i].mb, l[i].stage, l[i].chunk, rr, cc, last[l[i].stage]);
                    ok = 0;
                    break;
                }
                last[l[i].stage] = l[i].mb;
            }
        }
        if (pp_simulate(&e, NULL, res, NULL, &err) != PP_OK) {
            CHECK(0, "%s: simulate: %s", where, err.msg);
            ok = 0;
        }
        for (r = 0; ok && r < p; r++) {
            int want = has_turn(&e, r) ? 2 : 1; /* a turn: the fed stage's F reads the feeder's stash */
            if (res->peak_live[r] != want) {
                CHECK(0, "%s: rank %d peak %d, want %d", where, r, res->peak_live[r], want);
                ok = 0;
            }
        }
        if (ok) { /* as a table, read back */
            char* text = NULL;
            size_t len = 0, need = 0;
            FILE* f = open_memstream(&text, &len);
            pp_action* back = (pp_action*)calloc(n, sizeof *back);
            pp_schedule t;
            pp_schedule_write(f, &e);
            fclose(f);
            if (pp_schedule_parse(text, len, back, n, &need, &t, &err) != PP_OK) {
                CHECK(0, "%s: the table does not parse back: %s\n%s", where, err.msg, text);
                ok = 0;
            } else {
                CHECK(t.forward_only == 1 && t.per_rank == e.per_rank && memcmp(back, acts, n * sizeof *back) == 0,
                      "%s: the table reads back another list", where);
            }
            free(back);
            free(text);
        }
    }
    if (ok) CHECK(1, "%s", where);
    free(acts);
    free(res);
    hx_sched_free(&sc);
}

static void test_lists(void) {
    int kind, p, v, m;
    pp_error err;
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p++)
            for (v = 1; v <= 3; v++) {
                if (!pp_schedule_size((pp_schedule_kind)kind, p, v, 4)) continue;
                for (m = 1; m <= 9; m++) check_list((pp_schedule_kind)kind, p, v, m);
            }
    { /* what is refused */
        static const char f_only[] = "schedule p=2 v=1 m=2\nr0: F0 F1\nr1: F0 F1\n";
        static const char f_eval[] = "schedule p=2 v=1 m=2 eval=1\nr0: F0 F1\nr1: F0 F1\n";
        static const char b_eval[] = "schedule p=2 v=1 m=1 eval=1\nr0: F0\nr1: B0\n";
        pp_action acts[8];
        pp_schedule s;
        size_t need;
        pp_stage* st = NULL;
        pp_stage_desc d;
        int first[3] = {0, 6, MLP_DEPTH + 1};
        CHECK(pp_schedule_parse(f_only, sizeof f_only - 1, acts, 8, &need, &s, &err) == PP_ERR_SCHEDULE &&
                  strstr(err.msg, "eval=1"),
              "an F-only table without eval=1: %s", err.msg);
        CHECK(pp_schedule_parse(b_eval, sizeof b_eval - 1, acts, 8, &need, &s, &err) == PP_ERR_SCHEDULE &&
                  strstr(err.msg, "forward-only"),
              "a B in a forward-only table: %s", err.msg);
        CHECK(pp_schedule_parse(f_eval, sizeof f_eval - 1, acts, 8, &need, &s, &err) == PP_OK && s.forward_only == 1,
              "an F-only table with eval=1: %s", err.msg);
        memset(&d, 0, sizeof d);
        d.model = F.model;
        d.weights = &F.w;
        d.grads = &F.gref;
        d.schedule = &s;
        d.partition = first;
        CHECK(pp_stage_create(&d, &st, &err) == PP_ERR_INVALID && strstr(err.msg, "forward-only"),
              "a stage on a forward-only list: %s", err.msg);
        pp_stage_destroy(st);
    }
}

/* ---- the grid --------------------------------------------------------------------------------- */
#define OUT_CAP (ROWS * HX_CLASSES)
static float REF_OUT[OUT_CAP], OUT[OUT_CAP];

/* Outputs of an evaluation that go to rank `rank`: output 0 into buf (cap bytes), no others. */
static pp_eval_out eval_out(int rank, void* buf, size_t cap) {
    pp_eval_out o;
    memset(&o, 0, sizeof o);
    o.rank = rank;
    o.data[0] = buf;
    o.cap[0] = cap;
    return o;
}

/* The pipeline's simulated per-rank peak for its forward-only list. */
static void eval_peaks(const pp_schedule* s, int* peak) {
    size_t n = pp_schedule_eval_size(s);
    pp_action* acts = (pp_action*)calloc(n, sizeof *acts);
    pp_sim_result* res = (pp_sim_result*)calloc(1, sizeof *res);
    pp_schedule e;
    int r;
    for (r = 0; r < s->p; r++) peak[r] = -1;
    if (pp_schedule_make_eval(s, acts, n, &e, NULL) == PP_OK && pp_simulate(&e, NULL, res, NULL, NULL) == PP_OK)
        for (r = 0; r < s->p; r++) peak[r] = res->peak_live[r];
    free(acts);
    free(res);
}

/* One evaluation on a pipeline of kind/p/v/m over b, outputs to out_rank (-1: none), against
   the sequential evaluation. */
static int run_eval(pp_schedule_kind kind, int p, int v, int m, const pp_batch* b0, int out_rank, const char* bname) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_eval_out out, ref;
    pp_step_stats st;
    pp_batch b = *b0;
    pp_error err;
    float loss_ref = 0, loss_train = 0;
    int r, ok = 1, peak[PP_MAX_RANKS];
    char where[128];
    snprintf(where, sizeof where, "%s p=%d v=%d m=%d %s outputs to %d", pp_schedule_name(kind), p, v, m, bname, out_rank);
    b.m = m;
    ref = eval_out(0, REF_OUT, sizeof REF_OUT);
    memset(REF_OUT, 0, sizeof REF_OUT);
    if (pp_sequential_eval(&F.model, &F.w, &b, &loss_ref, &ref, &err) != PP_OK) {
        CHECK(0, "%s: sequential eval: %s", where, err.msg);
        return 0;
    }
    memset(F.gbuf, 0, F.n_params * sizeof(float));
    if (pp_sequential_step(&F.model, &F.w, &F.gref, &b, &loss_train, &err) != PP_OK ||
        memcmp(&loss_train, &loss_ref, sizeof(float)) != 0) {
        CHECK(0, "%s: the sequential evaluation's loss %.9g, the training step's %.9g", where, loss_ref, loss_train);
        ok = 0;
    }
    memset(F.gbuf, 0, F.n_params * sizeof(float));
    hx_pipeline_desc(&d, F.model, &F.w, &F.gref, kind, p, v, m); /* the gradients must stay zero */
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s: create: %s", where, err.msg);
        return 0;
    }
    memset(OUT, 0xa5, sizeof OUT);
    out = eval_out(out_rank < 0 ? 0 : out_rank, OUT, sizeof OUT);
    if (pp_pipeline_eval(pl, &b, out_rank < 0 ? NULL : &out, &st) != PP_OK) {
        CHECK(0, "%s: eval: %s", where, pp_pipeline_error(pl));
        ok = 0;
    } else {
        if (!st.has_loss || memcmp(&st.loss, &loss_ref, sizeof(float)) != 0) {
            CHECK(0, "%s: loss %.9g, sequential %.9g", where, st.loss, loss_ref);
            ok = 0;
        }
        if (out_rank >= 0 && (out.n != 1 || out.bytes[0] != ref.bytes[0] || out.t[0].rows != ROWS ||
                              out.t[0].cols != HX_CLASSES || memcmp(OUT, REF_OUT, ref.bytes[0]) != 0)) {
            CHECK(0, "%s: outputs differ (n %d, %zu bytes, [%lld x %lld]; sequential %zu bytes)", where, out.n, out.bytes[0],
                  (long long)out.t[0].rows, (long long)out.t[0].cols, ref.bytes[0]);
            ok = 0;
        }
        if (!hx_all_zero(F.gbuf, F.n_params)) {
            CHECK(0, "%s: an evaluation wrote gradients", where);
            ok = 0;
        }
        eval_peaks(pp_pipeline_schedule(pl), peak);
        for (r = 0; r < p; r++) {
            pp_step_stats rs;
            pp_pipeline_rank_result(pl, r, &rs);
            if (rs.peak_live != peak[r] || rs.peak_live > 2 || (!has_turn(pp_pipeline_schedule(pl), r) && rs.peak_live > 1)) {
                CHECK(0, "%s: rank %d held %d stashes at once, the simulator's forward-only list %d", where, r, rs.peak_live,
                      peak[r]);
                ok = 0;
            }
            if (rs.n_actions != m * v) {
                CHECK(0, "%s: rank %d ran %d actions, want %d", where, r, rs.n_actions, m * v);
                ok = 0;
            }
        }
    }
    pp_pipeline_destroy(pl);
    if (ok) CHECK(1, "%s", where);
    return ok;
}

static void test_grid(void) {
    static const int ms[] = {1, 3, 8};
    pp_batch dense, packed;
    int kind, p, v, mi, cases = 0, good = 0;
    hx_dense_batch(&dense, F.x, F.y, ROWS, HX_IN, 1);
    hx_packed_batch(&packed, F.x, F.y, CU, NSEQ, HX_IN, 1, PP_SPLIT_TOKENS);
    packed.loss = PP_LOSS_MEAN_ROWS;
    for (kind = 0; kind < PP_SCHED_KIND_COUNT; kind++)
        for (p = 1; p <= 4; p++)
            for (v = 1; v <= 3; v++) {
                if (!pp_schedule_size((pp_schedule_kind)kind, p, v, 4)) continue;
                for (mi = 0; mi < 3; mi++) {
                    int m = ms[mi], out_rank = (kind + p + mi) % (p + 1) - 1; /* -1 (none), 0 .. p-1 in turn */
                    cases += 2;
                    good += run_eval((pp_schedule_kind)kind, p, v, m, &dense, out_rank, "dense");
                    good += run_eval((pp_schedule_kind)kind, p, v, m, &packed, p - 1 - (out_rank < 0 ? 0 : out_rank), "packed");
                }
            }
    printf("evaluation equals the sequential forward: %d of %d configurations bit-exact\n", good, cases);
}

/* ---- an evaluation between training steps ----------------------------------------------------- */
static void test_between(pp_schedule_kind kind, int split) {
    pp_pipeline_desc d;
    pp_pipeline* pl[2] = {NULL, NULL};
    mlpz_model wz, gz[2];
    mlp_model g[2];
    float* gb[2];
    pp_batch b, e;
    pp_step_stats st;
    pp_error err;
    int i, k, ok = 1;
    char where[96];
    snprintf(where, sizeof where, "between: %s%s", pp_schedule_name(kind), split ? " (split model)" : "");
    hx_packed_batch(&b, F.x, F.y, CU, NSEQ, HX_IN, 8, PP_SPLIT_SEQS);
    hx_dense_batch(&e, F.x + 5 * HX_IN, F.y + 5, 30, HX_IN, 8); /* another batch for the evaluation */
    mlpz_from_mlp(&wz, &F.w);
    for (i = 0; i < 2; i++) {
        mlp_model unused;
        memset(&g[i], 0, sizeof g[i]);
        free(mlp_init(&unused, &g[i], DIMS, 1, &gb[i]));
        mlpz_from_mlp(&gz[i], &g[i]);
        memset(&d, 0, sizeof d);
        d.model = split ? mlpz_model_desc() : F.model;
        d.weights = split ? (const void*)&wz : (const void*)&F.w;
        d.grads = split ? (void*)&gz[i] : (void*)&g[i];
        d.schedule = kind;
        d.p = 4;
        d.m = 8;
        d.stage.timeout_s = 20;
        if (pp_pipeline_create(&d, &pl[i], &err) != PP_OK) {
            CHECK(0, "%s: create: %s", where, err.msg);
            ok = 0;
        }
    }
    for (k = 0; ok && k < 2; k++) {
        /* pipeline 0: train, train; pipeline 1: train, evaluate, train (twice, the second time
           with outputs) */
        ok = pp_pipeline_step(pl[0], &b, &st) == PP_OK && pp_pipeline_step(pl[1], &b, &st) == PP_OK;
        if (ok) {
            pp_eval_out out = eval_out(1, OUT, sizeof OUT);
            ok = pp_pipeline_eval(pl[1], &e, k ? &out : NULL, &st) == PP_OK;
            CHECK(ok, "%s: eval: %s", where, pp_pipeline_error(pl[1]));
        }
        ok = ok && pp_pipeline_step(pl[0], &b, &st) == PP_OK && pp_pipeline_step(pl[1], &b, &st) == PP_OK;
        CHECK(ok, "%s: steps: %s %s", where, pp_pipeline_error(pl[0]), pp_pipeline_error(pl[1]));
    }
    if (ok)
        CHECK(memcmp(gb[0], gb[1], F.n_params * sizeof(float)) == 0,
              "%s: the gradients after train, evaluate, train differ from train, train", where);
    for (i = 0; i < 2; i++) {
        pp_pipeline_destroy(pl[i]);
        free(gb[i]);
    }
}

/* ---- shape policies --------------------------------------------------------------------------- */
static void test_shapes(void) {
    static const pp_shape_policy pol[3] = {PP_SHAPES_BROADCAST, PP_SHAPES_AUTO, PP_SHAPES_PER_MESSAGE};
    static const char* const names[3] = {"broadcast", "auto", "per-message"};
    static const pp_schedule_kind kinds[3] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_ZB_V};
    pp_batch b;
    pp_error err;
    float loss_ref;
    int i, k, rep;
    pp_eval_out ref;
    pp_batch tb;
    hx_packed_batch(&b, F.x, F.y, CU, NSEQ, HX_IN, 6, PP_SPLIT_TOKENS);
    hx_dense_batch(&tb, F.x, F.y, 30, HX_IN, 6);
    ref = eval_out(0, REF_OUT, sizeof REF_OUT);
    CHECK(pp_sequential_eval(&F.model, &F.w, &b, &loss_ref, &ref, &err) == PP_OK, "%s", err.msg);
    for (i = 0; i < 3; i++)
        for (k = 0; k < 3; k++) {
            pp_pipeline_desc d;
            pp_pipeline* pl = NULL;
            pp_step_stats st;
            pp_eval_out out;
            int last;
            hx_pipeline_desc(&d, F.model, &F.w, &F.gref, kinds[k], 3, 0, 6);
            d.stage.shapes = pol[i];
            if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
                CHECK(0, "%s %s: create: %s", names[i], pp_schedule_name(kinds[k]), err.msg);
                continue;
            }
            pp_schedule_stage_to_rank(pp_pipeline_schedule(pl), pp_pipeline_schedule(pl)->n_stages - 1, &last, NULL);
            for (rep = 0; rep < 2; rep++) { /* the second time AUTO knows the shapes */
                pp_result rc;
                memset(OUT, 0, sizeof OUT);
                out = eval_out(last, OUT, sizeof OUT);
                rc = pp_pipeline_eval(pl, &b, &out, &st);
                CHECK(rc == PP_OK && memcmp(&st.loss, &loss_ref, sizeof(float)) == 0 && memcmp(OUT, REF_OUT, ref.bytes[0]) == 0 &&
                          out.bytes[0] == ref.bytes[0],
                      "%s %s (%d): loss %.9g (sequential %.9g), outputs to the last stage's rank %d: %s", names[i],
                      pp_schedule_name(kinds[k]), rep, st.loss, loss_ref, last, pp_pipeline_error(pl));
                out.rank = (last + 1) % 3;
                rc = pp_pipeline_eval(pl, &b, &out, &st);
                if (pol[i] == PP_SHAPES_BROADCAST)
                    CHECK(rc == PP_OK && memcmp(OUT, REF_OUT, ref.bytes[0]) == 0, "%s %s: outputs to rank %d: %s", names[i],
                          pp_schedule_name(kinds[k]), out.rank, pp_pipeline_error(pl));
                else
                    CHECK(rc == PP_ERR_UNSUPPORTED && strstr(pp_pipeline_error(pl), "LOCAL or BROADCAST"),
                          "%s %s: outputs to rank %d: %s", names[i], pp_schedule_name(kinds[k]), out.rank, pp_pipeline_error(pl));
                /* a training step of other shapes in between: AUTO's senders tell the change */
                CHECK(pp_pipeline_step(pl, &tb, &st) == PP_OK, "%s %s: a training step after: %s", names[i],
                      pp_schedule_name(kinds[k]), pp_pipeline_error(pl));
            }
            pp_pipeline_destroy(pl);
        }
    memset(F.gbuf, 0, F.n_params * sizeof(float));
}

/* ---- errors ----------------------------------------------------------------------------------- */
static void test_errors(void) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_eval_out out;
    pp_batch b;
    pp_error err;
    pp_result rc;
    hx_dense_batch(&b, F.x, F.y, ROWS, HX_IN, 4);
    hx_pipeline_desc(&d, F.model, &F.w, &F.gref, PP_SCHED_1F1B, 3, 0, 4);
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "create: %s", err.msg);
        return;
    }
    memset(OUT, 0x5a, sizeof OUT);
    out = eval_out(0, OUT, sizeof OUT - 4);
    rc = pp_pipeline_eval(pl, &b, &out, &st);
    CHECK(rc == PP_ERR_SIZE && strstr(pp_pipeline_error(pl), "cap[0]"), "a short buffer: %s (%s)", pp_result_str(rc),
          pp_pipeline_error(pl));
    CHECK(((unsigned char*)OUT)[0] == 0x5a && ((unsigned char*)OUT)[sizeof OUT - 5] == 0x5a, "a short buffer was written");
    out.rank = 3;
    rc = pp_pipeline_eval(pl, &b, &out, &st);
    CHECK(rc == PP_ERR_INVALID && strstr(pp_pipeline_error(pl), "pp_eval_out.rank = 3"), "rank 3 of 3: %s (%s)",
          pp_result_str(rc), pp_pipeline_error(pl));
    out.rank = 0;
    out.cap[0] = sizeof OUT;
    rc = pp_pipeline_eval(pl, &b, &out, &st);
    CHECK(rc == PP_OK, "after the errors: %s", pp_pipeline_error(pl));
    pp_pipeline_destroy(pl);
}

/* ---- a failing layer ---------------------------------------------------------------------------
   Layer 6's forward fails on micro-batch 1 during an evaluation: the evaluation fails on every
   rank (PP_ERR_LAYER first), with the transport's abort, and with abort_local (what
   pipeline_nccl.h says: the stage drains the step instead, runs the rest of its list without
   computing and sends zeros, the outputs too, and reports at the end); the next evaluation and
   training step are exact. */
static volatile int g_fail_eval;
static int fail_fwd(const void* w, int l, pp_layer_io* io) {
    if (g_fail_eval && l == 6 && io->mb->index == 1) return 9;
    return mlp_forward(w, l, io);
}
static pp_result local_abort(void* user, int rank, pp_stage_desc* d) {
    (void)user;
    (void)rank;
    d->transport.abort_local = 1;
    return PP_OK;
}

static void test_failure(void) {
    int drain;
    for (drain = 0; drain < 2; drain++) {
        pp_pipeline_desc d;
        pp_pipeline* pl = NULL;
        pp_step_stats st;
        pp_eval_out out = eval_out(0, OUT, sizeof OUT); /* the last stage is rank 2's: the outputs travel */
        pp_batch b;
        pp_error err;
        pp_result rc;
        float loss_ref;
        pp_eval_out ref = eval_out(0, REF_OUT, sizeof REF_OUT);
        int r;
        hx_packed_batch(&b, F.x, F.y, CU, NSEQ, HX_IN, 4, PP_SPLIT_TOKENS);
        CHECK(pp_sequential_eval(&F.model, &F.w, &b, &loss_ref, &ref, &err) == PP_OK, "%s", err.msg);
        hx_pipeline_desc(&d, F.model, &F.w, &F.gref, PP_SCHED_INTERLEAVED, 3, 0, 4);
        d.model.forward = fail_fwd;
        if (drain) d.rank_setup = local_abort;
        if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
            CHECK(0, "failure: create: %s", err.msg);
            continue;
        }
        g_fail_eval = 1;
        rc = pp_pipeline_eval(pl, &b, &out, &st);
        g_fail_eval = 0;
        CHECK(rc == PP_ERR_LAYER && strstr(pp_pipeline_error(pl), "layer 6 (dense) forward returned 9 on micro-batch 1"),
              "failure%s: %s (%s)", drain ? " (drained)" : "", pp_result_str(rc), pp_pipeline_error(pl));
        for (r = 0; r < 3; r++) CHECK(pp_pipeline_rank_result(pl, r, NULL) != PP_OK, "failure%s: rank %d returned PP_OK", drain ? " (drained)" : "", r);
        memset(OUT, 0, sizeof OUT);
        rc = pp_pipeline_eval(pl, &b, &out, &st);
        CHECK(rc == PP_OK && memcmp(&st.loss, &loss_ref, sizeof loss_ref) == 0 && memcmp(OUT, REF_OUT, ref.bytes[0]) == 0,
              "failure%s: the evaluation after: %s", drain ? " (drained)" : "", pp_pipeline_error(pl));
        CHECK(hx_all_zero(F.gbuf, F.n_params), "failure%s: gradients touched", drain ? " (drained)" : "");
        rc = pp_pipeline_step(pl, &b, &st);
        CHECK(rc == PP_OK, "failure%s: the training step after: %s", drain ? " (drained)" : "", pp_pipeline_error(pl));
        if (rc == PP_OK) {
            float* g = (float*)malloc(F.n_params * sizeof(float));
            memcpy(g, F.gbuf, F.n_params * sizeof(float));
            CHECK(hx_mlp_reference(&F, &b, 1, &err) == PP_OK && memcmp(g, F.gbuf, F.n_params * sizeof(float)) == 0,
                  "failure%s: the training step after differs from the reference", drain ? " (drained)" : "");
            free(g);
        }
        memset(F.gbuf, 0, F.n_params * sizeof(float));
        pp_pipeline_destroy(pl);
    }
}

/* ---- sync: a rank that runs another kind of step ---------------------------------------------- */
typedef struct sync_world {
    pp_threads* th;
    pp_stage* st[4];
    const pp_batch* b;
    int mode[4];                    /* 0: pp_stage_step, 1: pp_stage_eval with outputs to rank out[r] */
    int out[4];
    pp_result rc[4];
    char msg[4][512];
    mlp_model g[4];
    float* gb[4];
} sync_world;

static pp_result sync_rank(int r, void* user) {
    sync_world* W = (sync_world*)user;
    pp_eval_out o = eval_out(W->out[r], W->out[r] == r ? OUT : NULL, sizeof OUT);
    pp_step_stats st;
    W->rc[r] = W->mode[r] ? pp_stage_eval(W->st[r], W->b, &o, &st) : pp_stage_step(W->st[r], W->b, &st);
    snprintf(W->msg[r], sizeof W->msg[r], "%s", pp_stage_error(W->st[r]));
    return PP_OK;
}

/* rounds [r0, r1): 0 and 1 as below; 2 .. 4 one rank's pp_eval_out.rank outside the pipeline
   (rank 1 asks for 7, rank 0 for -1, rank 3 for 4 at p = 4): every rank fails at once, that one
   with PP_ERR_INVALID naming it */
static const int BAD_RANK[5][2] = {{0, 0}, {0, 0}, {1, 7}, {0, -1}, {3, 4}};
static void test_sync(int r0, int r1) {
    static sync_world W;
    hx_sched sc;
    pp_batch b;
    pp_error err;
    int first[5], r, round;
    double t0;
    memset(&W, 0, sizeof W);
    hx_dense_batch(&b, F.x, F.y, ROWS, HX_IN, 4);
    W.b = &b;
    if (hx_sched_make(&sc, PP_SCHED_1F1B, 4, 1, 4, &err) != PP_OK || pp_threads_create(4, &W.th, &err) != PP_OK) {
        CHECK(0, "sync: %s", err.msg);
        return;
    }
    pp_partition_uniform(F.model.n_layers, 4, first, &err);
    hx_mlp_rank_grads(W.g, W.gb, 4, DIMS);
    for (r = 0; r < 4; r++) {
        pp_stage_desc d;
        hx_stage_desc(&d, NULL, F.model, &F.w, &W.g[r], &sc.s, first, r, pp_threads_transport(W.th, r));
        d.timeout_s = 10;
        CHECK(pp_stage_create(&d, &W.st[r], &err) == PP_OK, "sync: stage %d: %s", r, err.msg);
    }
    for (round = r0; round < r1; round++) {
        /* round 0: rank 2 trains while the others evaluate; round 1: rank 1 wants the outputs on rank 1 */
        char want[64];
        for (r = 0; r < 4; r++) {
            W.mode[r] = round == 0 ? r != 2 : 1;
            W.out[r] = round == 1 && r == 1 ? 1 : 3;
        }
        if (round >= 2) W.out[BAD_RANK[round][0]] = BAD_RANK[round][1];
        snprintf(want, sizeof want, "pp_eval_out.rank = %d", BAD_RANK[round][1]);
        t0 = hx_now();
        pp_threads_run(4, sync_rank, &W, &err);
        for (r = 0; r < 4; r++) CHECK(W.rc[r] != PP_OK, "sync round %d: rank %d returned PP_OK", round, r);
        r = round == 0 ? 2 : round == 1 ? 1 : BAD_RANK[round][0];
        CHECK(W.rc[r] == PP_ERR_INVALID && strstr(W.msg[r], round == 0   ? "rank 0 runs an evaluation with outputs to rank 3, "
                                                                          "this rank a training step"
                                                           : round == 1 ? "this rank an evaluation with outputs to rank 1"
                                                                        : want),
              "sync round %d: rank %d says: %s", round, r, W.msg[r]);
        if (round >= 2)
            printf("  pp_eval_out.rank = %d on rank %d: every rank failed in %.3g s (deadline 10 s); rank %d: %s\n",
                   BAD_RANK[round][1], r, hx_now() - t0, (r + 1) % 4, W.msg[(r + 1) % 4]);
        CHECK(hx_now() - t0 < 5, "sync round %d: the ranks took %.3g s to fail (their deadline is 10 s)", round, hx_now() - t0);
        pp_threads_reset(W.th);
    }
    /* then a training step on every rank is the reference's */
    for (r = 0; r < 4; r++) memset(W.gb[r], 0, F.n_params * sizeof(float));
    for (r = 0; r < 4; r++) W.mode[r] = 0;
    pp_threads_run(4, sync_rank, &W, &err);
    for (r = 0; r < 4; r++) CHECK(W.rc[r] == PP_OK, "sync: the training step after: rank %d: %s", r, W.msg[r]);
    CHECK(hx_mlp_reference(&F, &b, 1, &err) == PP_OK, "%s", err.msg);
    CHECK(hx_mlp_grads_match(W.g, 4, &sc.s, first, &F.gref, 1, "sync: the training step after"), "sync");
    memset(F.gbuf, 0, F.n_params * sizeof(float));
    for (r = 0; r < 4; r++) pp_stage_destroy(W.st[r]);
    pp_threads_destroy(W.th);
    hx_mlp_free_grads(W.gb, 4);
    hx_sched_free(&sc);
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : NULL;
    if (!hx_mlp_init(&F, DIMS, 42, ROWS, 7, 99)) return 1;
    if (!only || !strcmp(only, "lists")) test_lists();
    if (!only || !strcmp(only, "grid")) test_grid();
    if (!only || !strcmp(only, "between")) {
        test_between(PP_SCHED_1F1B, 0);
        test_between(PP_SCHED_INTERLEAVED, 0);
        test_between(PP_SCHED_ZB_V, 0);
        test_between(PP_SCHED_DUALPIPE_V, 0);
        test_between(PP_SCHED_ZB_H1, 1);
    }
    if (!only || !strcmp(only, "shapes")) test_shapes();
    if (!only || !strcmp(only, "errors")) {
        test_errors();
        test_failure();
    }
    if (!only || !strcmp(only, "sync")) test_sync(0, 5);
    if (only && !strcmp(only, "badrank")) test_sync(2, 5); /* what build/failpath-controls runs */
    hx_mlp_free(&F);
    return TEST_DONE("eval");
}
