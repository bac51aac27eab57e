/* tests/test_validate.c - the validation layer (pipeline.h >>impl-validate): a layer that writes
   past what its describe declared is named, and nothing else is hurt.

   The tests' MLP over pp_pipeline (threads), one layer armed to write past one buffer in one
   micro-batch's call:
   - output: forward writes 16 columns (16 floats, 64 bytes) past its out[0] (1F1B and
     interleaved, p = 4);
   - saved: forward writes 16 bytes past the 40-byte saved scratch its describe declared;
   - input gradient: backward writes 16 columns past its d_in[0] (B);
   - saved in W: weight_grad writes 16 bytes past saved (the split model on ZB-H1).
   Each step returns PP_ERR_LAYER, every rank fails it and says why, the message names the layer,
   the call, the micro-batch, the buffer with its declared shape and dtype, and how many bytes
   past its end; the next step is bit-exact with the sequential reference. pp_sequential_step
   names the same breach. Under AddressSanitizer the writes go through an uninstrumented helper
   (the guards are poisoned during the call, so an instrumented write would stop the process),
   and a child process writes past with an instrumented store: it must die with a sanitizer
   report at the writing function.
   Negative control (build/validate-controls, in make test): this test built with -DPP_NO_VALIDATE
   (no guards) must fail: the steps return PP_OK, or the process crashes. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "test.h"
#include "harness.h"

#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#define ROWS 24
#define M 4                     /* 6 rows a micro-batch */
#define P 4
#define SAVED_LAYER 7           /* declares SAVED_BYTES of scratch */
#define SAVED_BYTES 40
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif
#ifdef T_ASAN
#define T_NO_ASAN __attribute__((no_sanitize_address))
#else
#define T_NO_ASAN
#endif

/* --- the armed layer --------------------------------------------------------------------------- */
enum { BAD_NONE, BAD_OUT, BAD_SAVED, BAD_DIN, BAD_W_SAVED };
static int g_bad = BAD_NONE, g_bad_layer = -1, g_bad_mb = 1, g_instrumented = 0;
static pp_model g_base;

/* n bytes from p on, as a layer's own loop would store them; not instrumented under ASan, so the
   library's guard check, not the sanitizer, sees them */
static T_NO_ASAN void store_past(void* p, const float* v, size_t n) {
    volatile unsigned char* q = (volatile unsigned char*)p;
    const unsigned char* s = (const unsigned char*)v;
    size_t i;
    for (i = 0; i < n; i++) q[i] = s[i];
}

/* the same, instrumented: the store the sanitizer must catch (the child of test_asan_report) */
static void __attribute__((noinline)) store_past_instrumented(void* p, const float* v, size_t n) {
    volatile unsigned char* q = (volatile unsigned char*)p;
    const unsigned char* s = (const unsigned char*)v;
    size_t i;
    for (i = 0; i < n; i++) q[i] = s[i];
}

/* 16 more columns than declared: values 1..16 after the end */
static void overrun(void* end, size_t bytes) {
    float v[16];
    int c;
    for (c = 0; c < 16; c++) v[c] = (float)(c + 1);
    if (g_instrumented) store_past_instrumented(end, v, bytes);
    else store_past(end, v, bytes);
}

static int armed(int kind, int l, const pp_layer_io* io) { return g_bad == kind && l == g_bad_layer && io->mb->index == g_bad_mb; }

static void v_describe(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    g_base.describe(w, l, mb, in, n_in, d);
    if (l == SAVED_LAYER) d->saved_bytes = SAVED_BYTES;
}

static int v_forward(const void* w, int l, pp_layer_io* io) {
    int rc = g_base.forward(w, l, io);
    if (l == SAVED_LAYER) memset(io->saved, 0x11, io->saved_bytes); /* its own scratch: fine */
    if (armed(BAD_OUT, l, io)) overrun((unsigned char*)io->out[0].data + pp_tensor_bytes(&io->out[0]), 64);
    if (armed(BAD_SAVED, l, io)) overrun((unsigned char*)io->saved + io->saved_bytes, 16);
    return rc;
}

static int v_backward(const void* w, void* g, int l, pp_layer_io* io) {
    int rc = g_base.backward(w, g, l, io);
    if (armed(BAD_DIN, l, io)) overrun((unsigned char*)io->d_in[0].data + pp_tensor_bytes(&io->d_in[0]), 64);
    return rc;
}

static int v_wgrad(const void* w, void* g, int l, pp_layer_io* io) {
    int rc = g_base.weight_grad(w, g, l, io);
    if (armed(BAD_W_SAVED, l, io)) overrun((unsigned char*)io->saved + io->saved_bytes, 16);
    return rc;
}

static pp_model hooked(int split) {
    pp_model m = split ? mlpz_model_desc() : mlp_model_desc();
    g_base = m;
    m.describe = v_describe;
    m.forward = v_forward;
    m.backward = v_backward;
    if (split) m.weight_grad = v_wgrad;
    return m;
}

/* --- the world --------------------------------------------------------------------------------- */
static mlp_model W, G[P];
static mlpz_model WZ, GZ[P];
static float *WBUF, *GBUF[P];
static float X[ROWS * HX_IN];
static int32_t Y[ROWS];
static void* GPTR[P];

static pp_batch batch(void) {
    pp_batch b;
    hx_dense_batch(&b, X, Y, ROWS, HX_IN, M);
    return b;
}

static void zero_grads(void) {
    int r;
    for (r = 0; r < P; r++) memset(GBUF[r], 0, mlp_param_count(DIMS) * sizeof(float));
}

typedef struct expect {
    const char* call;           /* "forward (F)" ... */
    const char* buffer;         /* "output 0 [6 x 7 f32, 168 bytes]" ... */
    const char* past;           /* "wrote 64 bytes past" ... */
} expect;

/* One armed step on a pipeline of kind (split: the mlpz model), then a clean one. */
static void run_case(const char* what, pp_schedule_kind kind, int split, int bad, int layer, const expect* e) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    pp_batch b = batch();
    pp_step_stats st;
    pp_result rc;
    char layer_s[64], mb_s[32];
    int r, same, failed = 0, told = 0;
    memset(&d, 0, sizeof d);
    d.model = hooked(split);
    d.weights = split ? (const void*)&WZ : (const void*)&W;
    for (r = 0; r < P; r++) GPTR[r] = split ? (void*)&GZ[r] : (void*)&G[r];
    d.rank_grads = GPTR;
    d.schedule = kind;
    d.p = P;
    d.m = M;
    d.stage.timeout_s = 20;
    if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
        CHECK(0, "%s: create: %s", what, err.msg);
        return;
    }
    zero_grads();
    g_bad = bad;
    g_bad_layer = layer;
    rc = pp_pipeline_step(pl, &b, &st);
    g_bad = BAD_NONE;
    snprintf(layer_s, sizeof layer_s, "layer %d (dense) %s", layer, e->call);
    snprintf(mb_s, sizeof mb_s, "on micro-batch %d", g_bad_mb);
    CHECK(rc == PP_ERR_LAYER, "%s: the step returned %s: %s", what, pp_result_str(rc), pp_pipeline_error(pl));
    printf("%s: %s\n", what, pp_pipeline_error(pl));
    CHECK(strstr(pp_pipeline_error(pl), layer_s) && strstr(pp_pipeline_error(pl), mb_s) &&
              strstr(pp_pipeline_error(pl), e->buffer) && strstr(pp_pipeline_error(pl), e->past),
          "%s: the message does not say \"%s\", \"%s\", \"%s\" and \"%s\": %s", what, layer_s, mb_s, e->buffer, e->past,
          pp_pipeline_error(pl));
    for (r = 0; r < P; r++) {
        failed += pp_pipeline_rank_result(pl, r, NULL) != PP_OK;
        /* the layer and the call: a rank that quotes others' messages may be cut at 512 bytes */
        told += strstr(pp_stage_error(pp_pipeline_stage(pl, r)), layer_s) != NULL;
    }
    CHECK(failed == P && told == P, "%s: %d of %d ranks failed the step, %d named the layer", what, failed, P, told);
    if (told != P)
        for (r = 0; r < P; r++) printf("  rank %d: %s\n", r, pp_stage_error(pp_pipeline_stage(pl, r)));
    /* the next step, nothing armed: exact */
    zero_grads();
    rc = pp_pipeline_step(pl, &b, &st);
    CHECK(rc == PP_OK, "%s: the step after: %s", what, pp_pipeline_error(pl));
    same = hx_mlp_sum_is_reference(&W, DIMS, 5, &b, GBUF, P, &err);
    CHECK(same == 1, "%s: the step after is not the sequential reference's (%d: %s)", what, same, same < 0 ? err.msg : "");
    pp_pipeline_destroy(pl);
}

static void test_pipeline_cases(void) {
    /* layer 1 (stage 0, rank 0) writes 7 columns a row; 6 rows: 168 bytes, guard to 256 */
    static const expect out = {"forward (F)", "output out[0] [6 x 7 f32, 168 bytes] as describe declared it", "wrote 64 bytes past"};
    static const expect saved = {"forward (F)", "saved scratch [40 bytes]", "wrote 16 bytes past"};
    /* layer 4's input gradient is [6 x 9]: 216 bytes, guard to 320 */
    static const expect din = {"backward (B)", "input gradient d_in[0] [6 x 9 f32, 216 bytes]", "wrote 64 bytes past"};
    static const expect wsaved = {"weight_grad (W)", "saved scratch [40 bytes]", "wrote 16 bytes past"};
    run_case("output, 1f1b", PP_SCHED_1F1B, 0, BAD_OUT, 1, &out);
    run_case("saved, 1f1b", PP_SCHED_1F1B, 0, BAD_SAVED, SAVED_LAYER, &saved);
    run_case("input gradient, 1f1b", PP_SCHED_1F1B, 0, BAD_DIN, 4, &din);
    run_case("saved in W, zb-h1", PP_SCHED_ZB_H1, 1, BAD_W_SAVED, SAVED_LAYER, &wsaved);
    run_case("output, interleaved", PP_SCHED_INTERLEAVED, 0, BAD_OUT, 1, &out);
}

/* The sequential reference names it too. */
static void test_sequential(void) {
    pp_model m = hooked(0);
    pp_batch b = batch();
    pp_error err;
    pp_result rc;
    float loss;
    zero_grads();
    g_bad = BAD_OUT;
    g_bad_layer = 1;
    rc = pp_sequential_step(&m, &W, &G[0], &b, &loss, &err);
    g_bad = BAD_NONE;
    CHECK(rc == PP_ERR_LAYER && strstr(err.msg, "layer 1 (dense) forward (F) on micro-batch 1 wrote 64 bytes past its output out[0]"),
          "sequential: %s: %s", pp_result_str(rc), err.msg);
    zero_grads();
    CHECK(pp_sequential_step(&m, &W, &G[0], &b, &loss, &err) == PP_OK, "sequential, after: %s", err.msg);
}

/* Under ASan: an instrumented store into a guard stops the process at the writing line. */
static void test_asan_report(void) {
#ifdef T_ASAN
    int fd[2], status = 0;
    char out[16384];
    size_t got = 0;
    ssize_t n;
    pid_t pid;
    fflush(stdout);
    if (pipe(fd) != 0) {
        CHECK(0, "pipe");
        return;
    }
    pid = fork();
    if (pid == 0) {
        pp_model m = hooked(0);
        pp_batch b = batch();
        pp_error err;
        float loss;
        close(fd[0]);
        dup2(fd[1], 2);
        g_instrumented = 1;
        g_bad = BAD_OUT;
        g_bad_layer = 1;
        pp_sequential_step(&m, &W, &G[0], &b, &loss, &err);
        _exit(0); /* the sanitizer did not stop it */
    }
    close(fd[1]);
    while (got + 1 < sizeof out && (n = read(fd[0], out + got, sizeof out - 1 - got)) > 0) got += (size_t)n;
    out[got] = 0;
    close(fd[0]);
    waitpid(pid, &status, 0);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "asan: the child was not stopped");
    CHECK(strstr(out, "use-after-poison") && strstr(out, "store_past_instrumented"),
          "asan: no report at the writing function: %.600s", out);
#endif
}

int main(void) {
    int r;
    WBUF = mlp_init(&W, NULL, DIMS, 5, NULL);
    mlpz_from_mlp(&WZ, &W);
    hx_mlp_rank_grads(G, GBUF, P, DIMS);
    for (r = 0; r < P; r++) mlpz_from_mlp(&GZ[r], &G[r]);
    mlp_make_data(X, Y, ROWS, HX_IN, HX_CLASSES, 3, 4);
    test_asan_report(); /* first: no thread of another test alive at the fork */
    test_sequential();
    test_pipeline_cases();
    free(WBUF);
    hx_mlp_free_grads(GBUF, P);
    return TEST_DONE("validate");
}
