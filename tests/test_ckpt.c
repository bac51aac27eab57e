/* tests/test_ckpt.c - checkpoints independent of the pipeline's shape (pp_ckpt_*).

   Checked: the MLP of examples/mlp.h trained at p = 4 interleaved (v = 2) with Adam, saved by its
   four ranks into one file (each its own layers' records, rank 0 also the header) gives the same
   bytes as one call saving everything, in a file and in memory; loaded by the two ranks of a
   p = 2 1F1B partition, and into a sequential (p = 1) trainer, its weights and Adam moments are
   bit-identical, and training on from there stays bit-identical to the run that never stopped.
   The same for the packed variable-length GPT of examples/gpt.h (p = 4 interleaved, then p = 2
   ZB-H1 on the split-backward model under the same name). The file's header fields are where
   docs/api.md's table puts them. A truncated file, a flipped byte (payload, tables, record
   header), another model's file (other widths), another layer count, another name, a state the
   file lacks, a newer version and a file that is not a checkpoint are refused with their codes,
   leaving every byte of the weights and states as it was. A load of some layers (own) touches
   only those; a copy hook sees every buffer. A partial load (the weights and one of the two
   states, with the user bytes) loads. A save that is refused (a layer without data), fails at
   any of its writes (nothing written, or one byte short), meets a full disk (a file-size limit)
   or is killed (SIGKILL) after any of its writes or at random times leaves the previous file
   whole: it loads and equals what it held (`test_ckpt save` runs that part, `partial` the other).
   Negative controls (build/ckpt-controls): built with -DPP_TEST_NO_CKPT_CHECKSUM (no checksum
   compared) a flipped byte loads silently and this test fails (`test_ckpt corrupt` runs only
   that part); with -DPP_TEST_CKPT_IN_PLACE (the file truncated and written in place, the
   layers' data unchecked before) `save` fails; with -DPP_TEST_CKPT_USER_AT_DESC (the user bytes
   read after a header sized by the desc's states) `partial` fails.
   Tensor parallelism (`test_ckpt tp`): sharded parameters saved at tp = 1, 2, 4 (pp = 1, 2; memory
   and a file) give the tp = 1 bytes, and load at tp = 1, 2, 4 (test_tp's comment); its control
   -DPP_TEST_CKPT_TP_ORDER (slices in reverse rank order) fails. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../pipeline.h"
#include "../examples/mlp.h"
#include "../examples/gpt.h"
#include "../examples/gpt_data.h"
#include "test.h"
#include "harness.h"
#include "test_link.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS 32
static const int DIMS[MLP_DEPTH + 1] = HX_DIMS;
static char PATH[256];

/* What Adam walks, whichever the model: the flat buffers of the weights, the gradients and Adam's
   m and v (n floats each), and its count of steps. */
typedef struct adam_state {
    float *wbuf, *gbuf, *mbuf, *vbuf;
    size_t n;
    int step;
} adam_state;

/* ---- an MLP trainer: weights, gradients, Adam's m and v, all bound like the weights ---------- */
typedef struct trainer {
    pp_model model;
    mlp_model w, g, m, v;
    adam_state opt;
} trainer;

/* dst = src's struct with its pointers moved from src_buf into buf (the same layout). */
static void rebind(mlp_model* dst, const mlp_model* src, const float* src_buf, float* buf) {
    int l;
    *dst = *src;
    for (l = 0; l < MLP_DEPTH; l++) {
        dst->dense[l].w = buf + (src->dense[l].w - src_buf);
        dst->dense[l].b = buf + (src->dense[l].b - src_buf);
    }
}

static void trainer_init(trainer* t, const int* dims, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->model = mlp_model_desc();
    t->model.params = mlp_params;
    t->opt.wbuf = mlp_init(&t->w, &t->g, dims, seed, &t->opt.gbuf);
    t->opt.n = mlp_param_count(dims);
    t->opt.mbuf = (float*)calloc(t->opt.n, sizeof(float));
    t->opt.vbuf = (float*)calloc(t->opt.n, sizeof(float));
    if (!t->opt.wbuf || !t->opt.mbuf || !t->opt.vbuf) {
        printf("out of memory\n");
        exit(1);
    }
    rebind(&t->m, &t->w, t->opt.wbuf, t->opt.mbuf);
    rebind(&t->v, &t->w, t->opt.wbuf, t->opt.vbuf);
}

static void trainer_free(trainer* t) {
    free(t->opt.wbuf);
    free(t->opt.gbuf);
    free(t->opt.mbuf);
    free(t->opt.vbuf);
}

/* Adam, elementwise (as examples/gpt_train.h's), gradients zeroed. */
static void adam(adam_state* s) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, lr = 1e-2f;
    const float c1 = 1.0f - powf(b1, (float)(s->step + 1)), c2 = 1.0f - powf(b2, (float)(s->step + 1));
    size_t i;
    for (i = 0; i < s->n; i++) {
        float g = s->gbuf[i];
        s->mbuf[i] = b1 * s->mbuf[i] + (1.0f - b1) * g;
        s->vbuf[i] = b2 * s->vbuf[i] + (1.0f - b2) * g * g;
        s->wbuf[i] -= lr * (s->mbuf[i] / c1) / (sqrtf(s->vbuf[i] / c2) + eps);
        s->gbuf[i] = 0.0f;
    }
    s->step++;
}

static float X[ROWS * HX_IN];
static int32_t Y[ROWS];

/* Step `step`'s data: every run sees the same batches in the same order. */
static pp_batch data(int step, int m) {
    pp_batch b;
    mlp_make_data(X, Y, ROWS, HX_IN, HX_CLASSES, 1000 + (uint64_t)step, 5);
    hx_dense_batch(&b, X, Y, ROWS, HX_IN, m);
    return b;
}

/* `steps` training steps on a pipeline of (kind, p, v), or sequential steps where p is 0. */
static int train(trainer* t, pp_schedule_kind kind, int p, int v, int steps, pp_pipeline** keep) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    int i, ok = 1;
    if (p > 0) {
        hx_pipeline_desc(&d, t->model, &t->w, &t->g, kind, p, v, 8);
        if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
            CHECK(0, "create %s p=%d: %s", pp_schedule_name(kind), p, err.msg);
            return 0;
        }
    }
    for (i = 0; ok && i < steps; i++) {
        pp_batch b = data(t->opt.step, 8);
        float loss;
        if (pl) ok = pp_pipeline_step(pl, &b, &st) == PP_OK;
        else ok = pp_sequential_step(&t->model, &t->w, &t->g, &b, &loss, &err) == PP_OK;
        CHECK(ok, "step %d: %s", t->opt.step, pl ? pp_pipeline_error(pl) : err.msg);
        adam(&t->opt);
    }
    if (keep) *keep = pl;
    else pp_pipeline_destroy(pl);
    return ok;
}

/* The desc saving or loading t: weights, Adam's m and v, the step. */
static const char* const NAMES[2] = {"adam_m", "adam_v"};
static const pp_ckpt_desc ADAM_CK = {.n_state = 2, .state_names = NAMES};
static pp_ckpt_desc adam_ckdesc(pp_model model, const void* w, const void* m, const void* v, int step,
                                const void** st) {
    pp_ckpt_desc c = ADAM_CK;
    c.model = model;
    c.weights = w;
    c.state = st;
    c.step = step;
    st[0] = m;
    st[1] = v;
    return c;
}
static pp_ckpt_desc ckdesc(trainer* t, const void** st) {
    return adam_ckdesc(t->model, &t->w, &t->m, &t->v, t->opt.step, st);
}

/* The weights, m and v of a and b bit-identical. */
static int same_state(const adam_state* a, const adam_state* b) {
    size_t n = a->n * sizeof(float);
    return memcmp(a->wbuf, b->wbuf, n) == 0 && memcmp(a->mbuf, b->mbuf, n) == 0 && memcmp(a->vbuf, b->vbuf, n) == 0;
}

/* Layers rank r owns under the pipeline's schedule and partition. */
static void owned(const pp_schedule* s, const int* first, int n_layers, int rank, unsigned char* own) {
    int l;
    for (l = 0; l < n_layers; l++) own[l] = pp_schedule_layer_rank(s, first, l) == rank;
}

static unsigned char* read_all(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    unsigned char* b;
    long len;
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (unsigned char*)malloc(len > 0 ? (size_t)len : 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = b ? (size_t)len : 0;
    return b;
}

static void write_all(const char* path, const unsigned char* b, size_t n) {
    FILE* f = fopen(path, "wb");
    if (f) {
        if (n) fwrite(b, 1, n, f);
        fclose(f);
    }
}

/* ---- p = 4 interleaved -> p = 2 1F1B and p = 1, the MLP ------------------------------------ */
static unsigned char* FULL;   /* the reference image: one call, every layer */
static size_t FULL_N;

static void test_reshape(void) {
    trainer a, b, c;
    pp_pipeline* pl = NULL;
    pp_pipeline_desc d2;
    pp_pipeline* pl2 = NULL;
    const void* st[2];
    pp_ckpt_desc cd;
    pp_ckpt_info info;
    pp_error err;
    uint64_t size = 0;
    unsigned char own[MLP_DEPTH + 1], *img, *file;
    size_t file_n = 0;
    int r, L;
    trainer_init(&a, DIMS, 42);
    L = a.model.n_layers;
    if (!train(&a, PP_SCHED_INTERLEAVED, 4, 2, 3, &pl)) return;
    cd = ckdesc(&a, st);
    CHECK(pp_ckpt_size(&cd, &size, &err) == PP_OK, "%s", err.msg);
    FULL = (unsigned char*)calloc((size_t)size, 1);
    img = (unsigned char*)calloc((size_t)size, 1);
    FULL_N = (size_t)size;
    CHECK(pp_ckpt_save_mem(&cd, FULL, FULL_N, &err) == PP_OK, "save whole: %s", err.msg);
    /* the four ranks of p = 4 interleaved, each its own layers (two stages each), into one file
       and one buffer; rank 0 first: it creates the file and writes the header */
    for (r = 0; r < 4; r++) {
        owned(pp_pipeline_schedule(pl), pp_pipeline_partition(pl), L, r, own);
        cd.own = own;
        cd.records_only = r > 0;
        CHECK(pp_ckpt_save_file(&cd, PATH, &err) == PP_OK, "rank %d save file: %s", r, err.msg);
        CHECK(pp_ckpt_save_mem(&cd, img, FULL_N, &err) == PP_OK, "rank %d save mem: %s", r, err.msg);
    }
    file = read_all(PATH, &file_n);
    CHECK(file && file_n == FULL_N && memcmp(file, FULL, FULL_N) == 0,
          "the ranks' file (%zu bytes) equals one call's image (%zu bytes)", file_n, FULL_N);
    CHECK(memcmp(img, FULL, FULL_N) == 0, "the ranks' memory image equals one call's");
    free(file);
    free(img);
    /* load at p = 2 1F1B: each of its two ranks loads its own layers, into other weights */
    trainer_init(&b, DIMS, 7);
    hx_pipeline_desc(&d2, b.model, &b.w, &b.g, PP_SCHED_1F1B, 2, 0, 8);
    d2.partition.policy = PP_PARTITION_EXPLICIT;
    {
        static const int first2[3] = {0, 9, MLP_DEPTH + 1}; /* uneven: 9 layers and 3 */
        d2.partition.explicit_first = first2;
    }
    CHECK(pp_pipeline_create(&d2, &pl2, &err) == PP_OK, "%s", err.msg);
    for (r = 0; pl2 && r < 2; r++) {
        cd = ckdesc(&b, st);
        owned(pp_pipeline_schedule(pl2), pp_pipeline_partition(pl2), L, r, own);
        cd.own = own;
        memset(&info, 0, sizeof info);
        CHECK(pp_ckpt_load_file(&cd, PATH, &info, &err) == PP_OK, "rank %d load: %s", r, err.msg);
        b.opt.step = (int)info.step;
    }
    pp_pipeline_destroy(pl2);
    CHECK(info.step == 3 && info.n_layers == L && info.n_state == 2 && !strcmp(info.name, "mlp") && info.version == 1 &&
              info.file_bytes == FULL_N,
          "info: step %lld, %d layers, %d states, '%s', version %u, %llu bytes", (long long)info.step, info.n_layers,
          info.n_state, info.name, info.version, (unsigned long long)info.file_bytes);
    CHECK(same_state(&a.opt, &b.opt), "p = 4 interleaved saved, p = 2 1F1B loaded: weights, m and v bit-identical");
    /* and p = 1: one call from memory */
    trainer_init(&c, DIMS, 8);
    cd = ckdesc(&c, st);
    CHECK(pp_ckpt_load_mem(&cd, FULL, FULL_N, &info, &err) == PP_OK, "%s", err.msg);
    c.opt.step = (int)info.step;
    CHECK(same_state(&a.opt, &c.opt), "loaded sequentially: bit-identical");
    /* training on: a at p = 4 interleaved, b at p = 2 1F1B, c sequential; all three the same */
    {
        int i, ok = 1;
        for (i = 0; ok && i < 3; i++) {
            pp_batch bt = data(a.opt.step, 8);
            pp_step_stats s;
            ok = pp_pipeline_step(pl, &bt, &s) == PP_OK;
            adam(&a.opt);
        }
        CHECK(ok, "a: %s", pp_pipeline_error(pl));
    }
    train(&b, PP_SCHED_1F1B, 2, 1, 3, NULL);
    train(&c, PP_SCHED_GPIPE, 0, 1, 3, NULL);
    CHECK(a.opt.step == 6 && b.opt.step == 6 && c.opt.step == 6, "steps %d %d %d", a.opt.step, b.opt.step, c.opt.step);
    CHECK(same_state(&a.opt, &b.opt), "3 steps on: p = 2 1F1B resumed = p = 4 interleaved uninterrupted, bit for bit");
    CHECK(same_state(&a.opt, &c.opt), "3 steps on: sequential resumed = p = 4 interleaved uninterrupted, bit for bit");
    pp_pipeline_destroy(pl);
    trainer_free(&a);
    trainer_free(&b);
    trainer_free(&c);
}

/* ---- the header where docs/api.md's table puts it ------------------------------------------ */
static uint64_t get(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    int i;
    for (i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void test_format(void) {
    const unsigned char* h = FULL;
    uint64_t H, B, L, S, rec;
    if (!FULL) return;
    L = get(h + 32, 4);
    S = get(h + 36, 4);
    B = get(h + 40, 4);
    H = get(h + 16, 8);
    CHECK(memcmp(h, "PPCKPT\r\n", 8) == 0 && get(h + 8, 4) == 1 && get(h + 12, 4) == 1, "magic, version 1, little-endian");
    CHECK(L == MLP_DEPTH + 1 && S == 3 && B == 2 * MLP_DEPTH, "L %llu, S %llu, B %llu", (unsigned long long)L,
          (unsigned long long)S, (unsigned long long)B);
    CHECK(H == 128 + 16 * S + 48 * L + 16 * B && get(h + 24, 8) == FULL_N, "H %llu, file bytes", (unsigned long long)H);
    CHECK(get(h + 48, 8) == 3 && get(h + 56, 8) == 0, "step 3, no user bytes");
    CHECK(!strcmp((const char*)h + 80, "mlp") && !strcmp((const char*)h + 128, "weights") &&
              !strcmp((const char*)h + 144, "adam_m") && !strcmp((const char*)h + 160, "adam_v"),
          "model and slot names");
    CHECK(!strcmp((const char*)h + 128 + 16 * S, "dense") && get(h + 128 + 16 * S + 36, 4) == 2 &&
              get(h + 128 + 16 * S + 40, 8) == (uint64_t)(HX_IN * 8 + 8) * 4,
          "layer 0: dense, 2 buffers, its bytes");
    CHECK(!strcmp((const char*)h + 128 + 16 * S + 48 * MLP_DEPTH, "xent") &&
              get(h + 128 + 16 * S + 48 * MLP_DEPTH + 36, 4) == 0,
          "the loss layer: no buffers");
    CHECK(get(h + 128 + 16 * S + 48 * L, 4) == PP_F32 && get(h + 128 + 16 * S + 48 * L + 8, 8) == HX_IN * 8,
          "buffer 0: f32, %d elements", HX_IN * 8);
    rec = H;
    CHECK(get(h + rec, 4) == 0x31434552u && get(h + rec + 4, 4) == 0 && get(h + rec + 8, 4) == 0 &&
              get(h + rec + 16, 8) == (uint64_t)(HX_IN * 8 + 8) * 4,
          "the first record: REC1, layer 0, slot 0, its bytes");
    rec += 32 + ((HX_IN * 8 + 8) * 4 + 7) / 8 * 8;
    CHECK(get(h + rec, 4) == 0x31434552u && get(h + rec + 4, 4) == 0 && get(h + rec + 8, 4) == 1,
          "the second record: layer 0, slot 1 (adam_m)");
}

/* ---- refusals leave everything as it was --------------------------------------------------- */
static trainer T;          /* the target of every failing load, and its bytes before */
static float *W0, *M0, *V0;

static void snapshot(void) {
    memcpy(W0, T.opt.wbuf, T.opt.n * sizeof(float));
    memcpy(M0, T.opt.mbuf, T.opt.n * sizeof(float));
    memcpy(V0, T.opt.vbuf, T.opt.n * sizeof(float));
}
static int untouched(void) {
    size_t n = T.opt.n * sizeof(float);
    return memcmp(W0, T.opt.wbuf, n) == 0 && memcmp(M0, T.opt.mbuf, n) == 0 && memcmp(V0, T.opt.vbuf, n) == 0;
}

/* Loads img (n bytes) into T from memory and from a file; both must fail with `want`. */
/* pp_ckpt_io's reader over memory that may be shorter than the image: its reads come up short */
typedef struct mem_src {
    const unsigned char* p;
    size_t n;
} mem_src;
static size_t mem_read(void* ctx, uint64_t off, void* p, size_t n) {
    const mem_src* m = (const mem_src*)ctx;
    if (off >= m->n) return 0;
    if (n > m->n - off) n = (size_t)(m->n - off);
    memcpy(p, m->p + off, n);
    return n;
}

static void refused(const unsigned char* img, size_t n, pp_result want, const char* what) {
    const void* st[2];
    pp_ckpt_desc cd = ckdesc(&T, st);
    pp_error err;
    pp_result rc;
    err.msg[0] = 0;
    rc = pp_ckpt_load_mem(&cd, img, n, NULL, &err);
    CHECK(rc == want, "%s (memory): %s, expected %s: %s", what, pp_result_str(rc), pp_result_str(want), err.msg);
    CHECK(untouched(), "%s (memory): the weights and states were changed", what);
    printf("  %-44s %s\n", what, err.msg);
    write_all(PATH, img, n);
    rc = pp_ckpt_load_file(&cd, PATH, NULL, &err);
    CHECK(rc == want, "%s (file): %s, expected %s: %s", what, pp_result_str(rc), pp_result_str(want), err.msg);
    CHECK(untouched(), "%s (file): the weights and states were changed", what);
}

static void test_corrupt(void) {
    unsigned char* bad = (unsigned char*)malloc(FULL_N);
    uint64_t H = get(FULL + 16, 8);
    size_t payload = (size_t)H + 32 + 40; /* inside layer 0's weights */
    if (!bad) return;
    /* a byte flipped in each record's payload: the middle of layer 5's adam_v, the last record */
    memcpy(bad, FULL, FULL_N);
    bad[payload] ^= 0x01;
    refused(bad, FULL_N, PP_ERR_CORRUPT, "a bit flipped in layer 0's weights");
    memcpy(bad, FULL, FULL_N);
    bad[FULL_N - 3 * 32 - 8] ^= 0x80; /* before the loss layer's three empty records: layer 10's adam_v */
    refused(bad, FULL_N, PP_ERR_CORRUPT, "a bit flipped in the last payload");
    memcpy(bad, FULL, FULL_N);
    bad[200] ^= 0x10; /* the layer table */
    refused(bad, FULL_N, PP_ERR_CORRUPT, "a bit flipped in the header's tables");
    free(bad);
}

static void test_refusals(void) {
    unsigned char* bad = (unsigned char*)malloc(FULL_N);
    uint64_t H = get(FULL + 16, 8);
    const void* st[2];
    pp_ckpt_desc cd;
    pp_error err;
    pp_result rc;
    mem_src src; /* a reader over a buffer shorter than the image */
    pp_ckpt_io io;
    if (!bad) return;
    refused(FULL, FULL_N - 1, PP_ERR_CORRUPT, "truncated by one byte");
    refused(FULL, FULL_N / 2, PP_ERR_CORRUPT, "truncated to half");
    refused(FULL, 100, PP_ERR_CORRUPT, "truncated inside the header");
    refused(FULL, 0, PP_ERR_CORRUPT, "empty");
    memcpy(bad, FULL, FULL_N);
    bad[(size_t)H + 4] ^= 0x02; /* the first record says layer 2 */
    refused(bad, FULL_N, PP_ERR_CORRUPT, "a record header altered");
    memcpy(bad, FULL, FULL_N);
    bad[0] = 'X';
    refused(bad, FULL_N, PP_ERR_CORRUPT, "not a checkpoint (magic)");
    memcpy(bad, FULL, FULL_N);
    bad[8] = 2;
    refused(bad, FULL_N, PP_ERR_UNSUPPORTED, "version 2");
    /* through pp_ckpt_io, which does not know the length: short reads */
    cd = ckdesc(&T, st);
    src.p = FULL;
    src.n = FULL_N - 5;
    io.read = mem_read;
    io.write = NULL;
    io.ctx = &src;
    rc = pp_ckpt_load(&cd, &io, NULL, &err);
    CHECK(rc == PP_ERR_CORRUPT && strstr(err.msg, "truncated") && untouched(), "io, 5 bytes short: %s", err.msg);
    /* another model: other widths, another layer count, another name, a state the file lacks */
    {
        int dims[MLP_DEPTH + 1];
        trainer o;
        mlp_counts cnt;
        memcpy(dims, DIMS, sizeof dims);
        dims[4] = 10;
        trainer_init(&o, dims, 1);
        cd = ckdesc(&o, st);
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_SIZE && strstr(err.msg, "layer 3 (dense) buffer 0"), "other widths: %s", err.msg);
        printf("  %-44s %s\n", "another model (a layer 10 wide)", err.msg);
        trainer_free(&o);
        memset(&cnt, 0, sizeof cnt);
        cnt.dense = MLP_DEPTH - 2;
        cd = ckdesc(&T, st);
        cd.model = mlp_model_desc_counts(cnt);
        cd.model.params = mlp_params;
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_SIZE && strstr(err.msg, "layers") && untouched(), "fewer layers: %s", err.msg);
        printf("  %-44s %s\n", "another layer count", err.msg);
        cd = ckdesc(&T, st);
        cd.name = "mlp2";
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_INVALID && strstr(err.msg, "'mlp'") && untouched(), "another name: %s", err.msg);
        printf("  %-44s %s\n", "another name", err.msg);
        cd = ckdesc(&T, st);
        {
            static const char* const other[2] = {"adam_m", "momentum"};
            cd.state_names = other;
        }
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_INVALID && strstr(err.msg, "momentum") && untouched(), "missing state: %s", err.msg);
        printf("  %-44s %s\n", "a state the file lacks", err.msg);
        cd = ckdesc(&T, st);
        cd.user = bad;
        cd.user_bytes = 4;
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_SIZE && untouched(), "user bytes of another size: %s", err.msg);
        cd = ckdesc(&T, st);
        cd.model.params = NULL;
        rc = pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err);
        CHECK(rc == PP_ERR_INVALID && strstr(err.msg, "params") && untouched(), "no params hook: %s", err.msg);
        rc = pp_ckpt_save_mem(&cd, bad, FULL_N, &err);
        CHECK(rc == PP_ERR_INVALID, "save without a params hook: %s", err.msg);
        cd = ckdesc(&T, st);
        rc = pp_ckpt_save_mem(&cd, bad, FULL_N - 1, &err);
        CHECK(rc == PP_ERR_SIZE, "save into a buffer one byte short: %s", err.msg);
        rc = pp_ckpt_load_file(&cd, "/nonexistent/dir/x.ckpt", NULL, &err);
        CHECK(rc == PP_ERR_IO && untouched(), "no such file: %s", err.msg);
        cd.records_only = 1;
        rc = pp_ckpt_save_file(&cd, "/nonexistent/dir/x.ckpt", &err);
        CHECK(rc == PP_ERR_IO, "records into a file that is not there: %s", err.msg);
    }
    free(bad);
}

/* ---- some layers, some states, a copy hook, user bytes --------------------------------------- */
static int COPIES;
static int counting_copy(void* user, void* dst, const void* src, size_t n) {
    (void)user;
    COPIES++;
    memcpy(dst, src, n);
    return 0;
}

static void test_parts(void) {
    trainer a, b;
    const void* st[2];
    pp_ckpt_desc cd;
    pp_ckpt_info info;
    pp_error err;
    unsigned char own[MLP_DEPTH + 1], *img;
    char user[13] = "data at 4711", back[13];
    uint64_t size = 0;
    int l, ok = 1;
    trainer_init(&a, DIMS, 3);
    trainer_init(&b, DIMS, 4);
    train(&a, PP_SCHED_1F1B, 2, 1, 1, NULL);
    /* user bytes and a copy hook */
    cd = ckdesc(&a, st);
    cd.user = user;
    cd.user_bytes = sizeof user;
    cd.copy = counting_copy;
    CHECK(pp_ckpt_size(&cd, &size, &err) == PP_OK, "%s", err.msg);
    img = (unsigned char*)calloc((size_t)size, 1);
    CHECK(pp_ckpt_save_mem(&cd, img, (size_t)size, &err) == PP_OK, "%s", err.msg);
    CHECK(COPIES == 3 * 2 * MLP_DEPTH, "save: the copy hook saw %d buffers", COPIES);
    /* only the odd layers, only the weights */
    cd = ckdesc(&b, st);
    cd.n_state = 0;
    for (l = 0; l <= MLP_DEPTH; l++) own[l] = l % 2;
    cd.own = own;
    CHECK(pp_ckpt_load_mem(&cd, img, (size_t)size, &info, &err) == PP_OK, "%s", err.msg);
    CHECK(info.user_bytes == sizeof user && info.n_state == 2, "info: %llu user bytes", (unsigned long long)info.user_bytes);
    for (l = 0; l < MLP_DEPTH; l++) ok &= hx_mlp_layer_equal(&a.w, &b.w, l) == (l % 2);
    CHECK(ok, "the odd layers loaded, the even ones left alone");
    CHECK(hx_all_zero(b.opt.mbuf, b.opt.n) && hx_all_zero(b.opt.vbuf, b.opt.n), "no state loaded where none was asked for");
    /* the rest, with the states, the user bytes and the copy hook */
    cd = ckdesc(&b, st);
    COPIES = 0;
    cd.copy = counting_copy;
    cd.user = back;
    cd.user_bytes = sizeof back;
    CHECK(pp_ckpt_load_mem(&cd, img, (size_t)size, NULL, &err) == PP_OK, "%s", err.msg);
    b.opt.step = a.opt.step;
    CHECK(same_state(&a.opt, &b.opt) && !memcmp(user, back, sizeof user), "everything, then: bit-identical, user bytes back");
    CHECK(COPIES == 3 * 2 * MLP_DEPTH, "load: the copy hook saw %d buffers", COPIES);
    /* a state bound unlike the weights is refused at save */
    cd = ckdesc(&a, st);
    a.m.dense[2].out++;
    CHECK(pp_ckpt_save_mem(&cd, img, (size_t)size, &err) == PP_ERR_INVALID && strstr(err.msg, "adam_m"), "%s", err.msg);
    a.m.dense[2].out--;
    free(img);
    trainer_free(&a);
    trainer_free(&b);
}

/* ---- a partial load: the weights and the first state (not the second), with user bytes -------- */
static void test_partial(void) {
    static const char* const only_m[1] = {"adam_m"};
    static const char* const only_v[1] = {"adam_v"};
    trainer a, b;
    const void* st[2];
    pp_ckpt_desc cd;
    pp_error err;
    pp_result rc;
    char user[13] = "data at 4711", back[13];
    unsigned char* img;
    uint64_t size = 0;
    int which;
    trainer_init(&a, DIMS, 7);
    train(&a, PP_SCHED_1F1B, 2, 1, 1, NULL);
    cd = ckdesc(&a, st);
    cd.user = user;
    cd.user_bytes = sizeof user;
    CHECK(pp_ckpt_size(&cd, &size, &err) == PP_OK, "%s", err.msg);
    img = (unsigned char*)calloc((size_t)size, 1);
    if (!img) return;
    CHECK(pp_ckpt_save_mem(&cd, img, (size_t)size, &err) == PP_OK, "%s", err.msg);
    write_all(PATH, img, (size_t)size);
    for (which = 0; which < 4; which++) { /* m from memory, m from the file, v from memory, v from the file */
        trainer_init(&b, DIMS, 8);
        cd = ckdesc(&b, st);
        cd.n_state = 1;
        cd.state_names = which < 2 ? only_m : only_v;
        st[0] = which < 2 ? (const void*)&b.m : (const void*)&b.v;
        cd.user = back;
        cd.user_bytes = sizeof back;
        memset(back, 0, sizeof back);
        rc = which % 2 ? pp_ckpt_load_file(&cd, PATH, NULL, &err) : pp_ckpt_load_mem(&cd, img, (size_t)size, NULL, &err);
        CHECK(rc == PP_OK, "weights + %s + user bytes (%s): %s", which < 2 ? "adam_m" : "adam_v",
              which % 2 ? "file" : "memory", err.msg);
        CHECK(rc != PP_OK || (!memcmp(a.opt.wbuf, b.opt.wbuf, a.opt.n * sizeof(float)) &&
                              !memcmp(which < 2 ? a.opt.mbuf : a.opt.vbuf, which < 2 ? b.opt.mbuf : b.opt.vbuf,
                                      a.opt.n * sizeof(float)) &&
                              hx_all_zero(which < 2 ? b.opt.vbuf : b.opt.mbuf, b.opt.n) && !memcmp(user, back, sizeof user)),
              "weights + %s + user bytes: not what was saved, or the other state loaded", which < 2 ? "adam_m" : "adam_v");
        trainer_free(&b);
    }
    printf("  a partial load (weights, one of two states, user bytes): %s\n", rc == PP_OK ? "loads" : err.msg);
    free(img);
    trainer_free(&a);
}

/* ---- a save that is refused, fails or is killed leaves the previous file whole ---------------
   In a directory of its own: the file holds A (trainer a's checkpoint); saves of B (trainer b's)
   are refused (a layer without data), fail at every write (none of its bytes, or one byte
   short: a full disk), run into a real file-size limit (RLIMIT_FSIZE, in a child), or are killed
   (SIGKILL) after every number of writes and at random times (a child saving A and B in turn).
   After each the file loads and equals A (or, after a random kill, A or B: whichever save was
   last renamed); a failed save leaves no other file, a killed one at most its own new file. */
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

static char DIRP[256], FILEP[300];
static unsigned char *IMG_A, *IMG_B;
static size_t IMG_AN, IMG_BN;
static trainer SA, SB;

typedef struct fault_at {
    int calls, at;  /* writes seen; the one that fails (or kills) */
    int mode;       /* 0 count only, 1 nothing written, 2 one byte short, 3 SIGKILL */
} fault_at;
static size_t fault_fn(void* user, uint64_t off, size_t n) {
    fault_at* f = (fault_at*)user;
    (void)off;
    if (++f->calls != f->at) return n;
    if (f->mode == 3) raise(SIGKILL);
    return f->mode == 1 ? 0 : n - 1;
}

/* Files in DIRP other than FILEP's: removed; returns how many (one named FILEP.tmp-* counts in
   *tmps). */
static int leftovers(int* tmps) {
    DIR* dir = opendir(DIRP);
    struct dirent* e;
    int n = 0;
    char p[600], pre[64];
    *tmps = 0;
    if (!dir) return -1;
    snprintf(pre, sizeof pre, "s.ckpt.tmp-");
    while ((e = readdir(dir)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "s.ckpt")) continue;
        n++;
        *tmps += !strncmp(e->d_name, pre, strlen(pre));
        snprintf(p, sizeof p, "%s/%s", DIRP, e->d_name);
        remove(p);
    }
    closedir(dir);
    return n;
}

/* The file loads and is A (or B, where b_ok); returns 1 for A, 2 for B, 0 for neither. */
static int file_is(int b_ok, const char* what) {
    size_t n;
    unsigned char* got = read_all(FILEP, &n);
    trainer c;
    const void* st[2];
    pp_ckpt_desc cd;
    pp_error err;
    int is = 0, loads;
    if (got && n == IMG_AN && !memcmp(got, IMG_A, n)) is = 1;
    else if (b_ok && got && n == IMG_BN && !memcmp(got, IMG_B, n)) is = 2;
    free(got);
    trainer_init(&c, DIMS, 1);
    cd = ckdesc(&c, st);
    loads = pp_ckpt_load_file(&cd, FILEP, NULL, &err) == PP_OK;
    c.opt.step = is == 2 ? SB.opt.step : SA.opt.step;
    CHECK(is && loads && same_state(&c.opt, is == 2 ? &SB.opt : &SA.opt), "%s: the file is %s (%zu bytes)%s%s", what,
          is == 1 ? "A" : is == 2 ? "B" : "neither A nor B", n, loads ? "" : ", its load fails: ", loads ? "" : err.msg);
    trainer_free(&c);
    return is;
}

static int READY[2] = {-1, -1}; /* mode 4: the child's byte before its first save */
static pid_t save_child(int mode, int at, int fsize) {
    pid_t pid = fork();
    if (pid == 0) {
        const void* st[2];
        pp_ckpt_desc cd = ckdesc(&SB, st);
        pp_error err;
        fault_at f;
        memset(&f, 0, sizeof f);
        f.mode = mode;
        f.at = at;
        if (fsize >= 0) { /* a full disk: writes past fsize bytes fail (EFBIG, SIGXFSZ ignored) */
            struct rlimit rl;
            rl.rlim_cur = rl.rlim_max = (rlim_t)fsize;
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        }
        if (mode == 4) { /* random kills: A and B in turn until killed */
            pp_ckpt_desc ca = ckdesc(&SA, st);
            const void* st2[2];
            cd = ckdesc(&SB, st2);
            if (write(READY[1], "r", 1) != 1) _exit(5);
            for (;;)
                if (pp_ckpt_save_file(&cd, FILEP, &err) != PP_OK || pp_ckpt_save_file(&ca, FILEP, &err) != PP_OK) _exit(4);
        }
        _exit(_pp_ckpt_save_path(&cd, FILEP, &fault_fn, &f, &err) == PP_ERR_IO ? 0 : 2);
    }
    return pid;
}

static void test_save(void) {
    const void* st[2];
    pp_ckpt_desc cd;
    pp_error err;
    pp_result rc;
    fault_at f;
    uint64_t size = 0;
    int k, n_writes, tmps, status, bad = 0, seen[3] = {0, 0, 0};
    unsigned rng = 12345;
    double t0, t_save;
    pid_t pid;
    snprintf(DIRP, sizeof DIRP, "%s/pp_test_ckpt_save.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(DIRP)) {
        CHECK(0, "mkdtemp %s", DIRP);
        return;
    }
    snprintf(FILEP, sizeof FILEP, "%s/s.ckpt", DIRP);
    trainer_init(&SA, DIMS, 11);
    trainer_init(&SB, DIMS, 12);
    train(&SA, PP_SCHED_1F1B, 2, 1, 1, NULL);
    train(&SB, PP_SCHED_1F1B, 2, 1, 2, NULL);
    cd = ckdesc(&SA, st);
    pp_ckpt_size(&cd, &size, &err);
    IMG_AN = (size_t)size;
    IMG_A = (unsigned char*)calloc(IMG_AN, 1);
    cd = ckdesc(&SB, st);
    pp_ckpt_size(&cd, &size, &err);
    IMG_BN = (size_t)size;
    IMG_B = (unsigned char*)calloc(IMG_BN, 1);
    if (!IMG_A || !IMG_B) return;
    cd = ckdesc(&SA, st);
    CHECK(pp_ckpt_save_mem(&cd, IMG_A, IMG_AN, &err) == PP_OK, "%s", err.msg);
    cd = ckdesc(&SB, st);
    CHECK(pp_ckpt_save_mem(&cd, IMG_B, IMG_BN, &err) == PP_OK, "%s", err.msg);
    cd = ckdesc(&SA, st);
    CHECK(pp_ckpt_save_file(&cd, FILEP, &err) == PP_OK, "save A: %s", err.msg);
    file_is(0, "saved A");
    /* refused: a layer buffer without data, a bad desc; the file as it was, nothing beside it */
    cd = ckdesc(&SB, st);
    {
        float* keep = SB.w.dense[1].w;
        SB.w.dense[1].w = NULL;
        rc = pp_ckpt_save_file(&cd, FILEP, &err);
        SB.w.dense[1].w = keep;
    }
    CHECK(rc == PP_ERR_INVALID, "a layer without data: %s: %s", pp_result_str(rc), err.msg);
    printf("  a refused save (a layer without data): %s\n", err.msg);
    file_is(0, "after a refused save");
    cd.records_only = 2;
    CHECK(pp_ckpt_save_file(&cd, FILEP, &err) == PP_ERR_INVALID, "records_only = 2: %s", err.msg);
    file_is(0, "after a bad desc");
    CHECK(leftovers(&tmps) == 0, "a refused save left a file beside the checkpoint");
    /* the writes of a save of B */
    memset(&f, 0, sizeof f);
    cd = ckdesc(&SB, st);
    t0 = hx_now();
    CHECK(_pp_ckpt_save_path(&cd, FILEP, fault_fn, &f, &err) == PP_OK, "save B: %s", err.msg);
    t_save = hx_now() - t0;
    n_writes = f.calls;
    file_is(2, "saved B");
    cd = ckdesc(&SA, st);
    CHECK(pp_ckpt_save_file(&cd, FILEP, &err) == PP_OK, "save A again: %s", err.msg);
    /* a failing write at every call, and one byte short at every call */
    for (k = 1; k <= 2 * n_writes; k++) {
        char what[96];
        memset(&f, 0, sizeof f);
        f.at = (k - 1) % n_writes + 1;
        f.mode = k <= n_writes ? 1 : 2;
        cd = ckdesc(&SB, st);
        rc = _pp_ckpt_save_path(&cd, FILEP, fault_fn, &f, &err);
        snprintf(what, sizeof what, "write %d of %d %s", f.at, n_writes, f.mode == 1 ? "fails" : "one byte short");
        if (rc != PP_ERR_IO || file_is(0, what) != 1 || leftovers(&tmps) != 0) {
            CHECK(rc == PP_ERR_IO, "%s: %s (%s)", what, pp_result_str(rc), err.msg);
            if (++bad > 3) break;
        }
    }
    printf("  %d saves whose write %s fails, then as many one byte short: the file is A, nothing beside it%s\n", n_writes,
           "1, 2, ...", bad ? " (NOT)" : "");
    /* a full disk for real: a file-size limit (the writes are buffered: the flush fails) */
    {
        const int lim[4] = {0, 1, (int)IMG_BN / 2, (int)IMG_BN - 1};
        for (k = 0; k < 4; k++) {
            char what[64];
            pid = save_child(0, 0, lim[k]);
            status = -1;
            waitpid(pid, &status, 0);
            snprintf(what, sizeof what, "a file-size limit of %d bytes", lim[k]);
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the save did not fail with PP_ERR_IO (%d)", what, status);
            file_is(0, what);
            CHECK(leftovers(&tmps) == 0, "%s: a file left beside the checkpoint", what);
        }
        printf("  a full disk (RLIMIT_FSIZE 0, 1, half, all but a byte): PP_ERR_IO, the file is A\n");
    }
    /* killed after every number of writes */
    for (bad = 0, k = 1; k <= n_writes + 1; k++) {
        char what[64];
        int left;
        pid = save_child(3, k, -1);
        status = -1;
        waitpid(pid, &status, 0);
        snprintf(what, sizeof what, "killed at write %d of %d", k, n_writes);
        left = leftovers(&tmps);
        if (k <= n_writes) {
            if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) || file_is(0, what) != 1 || left != 1 || tmps != 1) {
                CHECK(0, "%s: status %d, %d files beside it", what, status, left);
                if (++bad > 3) break;
            }
        } else { /* not killed: B saved, and put back A */
            CHECK(WIFEXITED(status) && file_is(2, "the save not killed") == 2 && left == 0, "not killed: status %d", status);
            cd = ckdesc(&SA, st);
            CHECK(pp_ckpt_save_file(&cd, FILEP, &err) == PP_OK, "save A again: %s", err.msg);
        }
    }
    printf("  a save killed (SIGKILL) after each of its %d writes: the file is A, the killed save's own file beside it\n",
           n_writes);
    /* killed at random times while saving B and A in turn */
    if (pipe(READY) != 0) CHECK(0, "pipe");
    for (k = 0; k < 40; k++) {
        char what[64];
        struct timespec ts;
        double at;
        rng = rng * 1103515245u + 12345u;
        at = t_save * 4 * (double)((rng >> 8) % 1000) / 1000.0;
        pid = save_child(4, 0, -1);
        if (read(READY[0], what, 1) != 1) CHECK(0, "the saving child did not start");
        ts.tv_sec = 0;
        ts.tv_nsec = (long)(at * 1e9);
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        snprintf(what, sizeof what, "killed after %.3g ms", at * 1e3);
        seen[file_is(1, what)]++;
        leftovers(&tmps);
    }
    close(READY[0]);
    close(READY[1]);
    printf("  40 kills at random times (0 .. %.2g ms) of saves of B and A in turn: A %d times, B %d, neither %d\n",
           t_save * 4e3, seen[1], seen[2], seen[0]);
    remove(FILEP);
    rmdir(DIRP);
    free(IMG_A);
    free(IMG_B);
    trainer_free(&SA);
    trainer_free(&SB);
}

/* ---- the packed variable-length GPT ------------------------------------------------------- */
#define NB 6
#define NSEQ 16
#define MAXLEN 24
typedef struct gtrainer {
    gpt_config c;
    gpt_model w, g, m, v;
    adam_state opt;
} gtrainer;

static void gtrainer_init(gtrainer* t, uint64_t seed) {
    gpt_config c = {GPT_DATA_VOCAB, MAXLEN, 16, 2, NB};
    memset(t, 0, sizeof *t);
    t->c = c;
    t->opt.n = gpt_param_count(&c);
    t->opt.wbuf = gpt_init(&t->w, &t->g, &c, seed, &t->opt.gbuf);
    t->opt.mbuf = (float*)calloc(t->opt.n, sizeof(float));
    t->opt.vbuf = (float*)calloc(t->opt.n, sizeof(float));
    gpt_bind(&t->m, &c, t->opt.mbuf);
    gpt_bind(&t->v, &c, t->opt.vbuf);
}
static void gtrainer_free(gtrainer* t) {
    free(t->opt.wbuf);
    free(t->opt.gbuf);
    free(t->opt.mbuf);
    free(t->opt.vbuf);
}

static gpt_corpus CORPUS;
static int32_t TOK[NSEQ * MAXLEN], TGT[NSEQ * MAXLEN], CU[NSEQ + 1];

static int gtrain(gtrainer* t, pp_schedule_kind kind, int p, int v, int steps) {
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_error err;
    int i, ok;
    hx_pipeline_desc(&d, kind == PP_SCHED_ZB_H1 ? gptz_model_desc_depth(NB) : gpt_model_desc_depth(NB), &t->w, &t->g,
                     kind, p, v, 4);
    if (!(ok = pp_pipeline_create(&d, &pl, &err) == PP_OK)) CHECK(0, "gpt %s p=%d: %s", pp_schedule_name(kind), p, err.msg);
    for (i = 0; ok && i < steps; i++) {
        uint64_t rng = 500 + (uint64_t)t->opt.step;
        pp_batch b;
        gpt_pack(&CORPUS, &rng, NSEQ, TOK, TGT, CU);
        hx_token_batch(&b, TOK, TGT, CU, NSEQ, 4, PP_SPLIT_TOKENS);
        b.loss = PP_LOSS_MEAN_ROWS;
        ok = pp_pipeline_step(pl, &b, NULL) == PP_OK;
        CHECK(ok, "gpt step %d: %s", t->opt.step, pp_pipeline_error(pl));
        adam(&t->opt);
    }
    pp_pipeline_destroy(pl);
    return ok;
}

static pp_ckpt_desc gdesc(gtrainer* t, pp_model m, const void** st) {
    pp_ckpt_desc c = adam_ckdesc(m, &t->w, &t->m, &t->v, t->opt.step, st);
    c.name = "gpt"; /* gpt and gptz: one layout */
    return c;
}

/* Each rank of kind at p (v chunks a rank, 4 micro-batches, the uniform partition) saves its
   layers of t into PATH, rank 0 with the header (info NULL), or loads them from it into t (the
   split model, gptz, under ZB-H1). */
static void gpt_ckpt_ranks(gtrainer* t, pp_schedule_kind kind, int p, int v, pp_ckpt_info* info) {
    const void* st[2];
    pp_ckpt_desc cd;
    pp_error err;
    hx_sched s;
    int first[2 * PP_MAX_RANKS + 1], r;
    unsigned char own[NB + 2];
    hx_sched_make(&s, kind, p, v, 4, &err);
    pp_partition_uniform(NB + 2, p * v, first, &err);
    for (r = 0; r < p; r++) {
        cd = gdesc(t, kind == PP_SCHED_ZB_H1 ? gptz_model_desc_depth(NB) : gpt_model_desc_depth(NB), st);
        owned(&s.s, first, NB + 2, r, own);
        cd.own = own;
        if (info) {
            CHECK(pp_ckpt_load_file(&cd, PATH, info, &err) == PP_OK, "gpt load rank %d: %s", r, err.msg);
        } else {
            cd.records_only = r > 0;
            CHECK(pp_ckpt_save_file(&cd, PATH, &err) == PP_OK, "gpt rank %d: %s", r, err.msg);
        }
    }
    hx_sched_free(&s);
}

static void test_gpt(void) {
    gtrainer a, b;
    const void* st[2];
    pp_ckpt_desc cd;
    pp_ckpt_info info;
    pp_error err;
    if (gpt_corpus_generate(&CORPUS, 300, MAXLEN, 5)) {
        CHECK(0, "corpus");
        return;
    }
    gtrainer_init(&a, 11);
    gtrainer_init(&b, 12);
    if (!gtrain(&a, PP_SCHED_INTERLEAVED, 4, 2, 2)) return;
    gpt_ckpt_ranks(&a, PP_SCHED_INTERLEAVED, 4, 2, NULL); /* uniform: 8 stages of one layer */
    gpt_ckpt_ranks(&b, PP_SCHED_ZB_H1, 2, 1, &info);
    b.opt.step = (int)info.step;
    CHECK(same_state(&a.opt, &b.opt) && b.opt.step == 2, "gpt: p = 4 interleaved saved, p = 2 ZB-H1 loaded: bit-identical");
    gtrain(&a, PP_SCHED_INTERLEAVED, 4, 2, 2);
    gtrain(&b, PP_SCHED_ZB_H1, 2, 1, 2);
    CHECK(memcmp(a.opt.wbuf, b.opt.wbuf, a.opt.n * 4) == 0 && memcmp(a.opt.mbuf, b.opt.mbuf, a.opt.n * 4) == 0,
          "gpt: 2 steps on at p = 2 ZB-H1 = p = 4 interleaved uninterrupted, bit for bit");
    /* a GPT of other depth, and the MLP's file, are refused */
    {
        gtrainer o;
        gpt_config c5 = a.c;
        c5.n_block = NB - 1;
        memset(&o, 0, sizeof o);
        o.c = c5;
        o.opt.n = gpt_param_count(&c5);
        o.opt.wbuf = gpt_init(&o.w, NULL, &c5, 1, NULL);
        o.opt.mbuf = (float*)calloc(o.opt.n, sizeof(float));
        o.opt.vbuf = (float*)calloc(o.opt.n, sizeof(float));
        gpt_bind(&o.m, &c5, o.opt.mbuf);
        gpt_bind(&o.v, &c5, o.opt.vbuf);
        cd = gdesc(&o, gpt_model_desc_depth(NB - 1), st);
        CHECK(pp_ckpt_load_file(&cd, PATH, NULL, &err) == PP_ERR_SIZE, "gpt of 5 blocks: %s", err.msg);
        gtrainer_free(&o);
        cd = gdesc(&b, gpt_model_desc_depth(NB), st);
        CHECK(FULL && pp_ckpt_load_mem(&cd, FULL, FULL_N, NULL, &err) == PP_ERR_INVALID, "the MLP's file: %s", err.msg);
    }
    gtrainer_free(&a);
    gtrainer_free(&b);
    gpt_corpus_free(&CORPUS);
}

/* ---- tensor parallelism: sharded parameters saved whole (pp_ckpt_desc.tp, .shards) -------------
   A 4-layer model: layer 0 a 7 x 5 weight split by rows, layer 1 by columns, layer 2 a flat 35
   (tp = 4: slices 9, 9, 9, 8), layer 3 whole on every rank; each layer also a bias of 5 whole on
   every rank (f64 in layer 2); an optimizer state "m" split like the weights. Saved at tp = 1,
   2, 4 (pp = 1 and 2: each pipeline rank's TP group its layers, one buffer) and to a file at
   tp = 2, every image equals BYTE FOR BYTE the tp = 1 save of the whole weights; that file loaded
   at tp = 1, 2, 4 gives every rank its slices (pp = 2 through a copy hook, as device memory would).
   Refused: a slice of the wrong size, a bad shape.
   Negative control (build/ckpt-controls): -DPP_TEST_CKPT_TP_ORDER lays the slices out in reverse
   rank order (`test_ckpt tp` fails). */
#define TPL 4
#define TPMAX 4
typedef struct tpw {
    void* data[TPL][2];
    int64_t count[TPL][2];
    pp_dtype dt[TPL][2];
} tpw;

static int tp_fwd(const void* w, int l, pp_layer_io* io) { (void)w, (void)l, (void)io; return 0; }
static int tp_bwd(const void* w, void* g, int l, pp_layer_io* io) { (void)w, (void)g, (void)l, (void)io; return 0; }
static void tp_describe(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)l, (void)mb, (void)in, (void)n_in, (void)d;
}
static int tp_params(const pp_model* m, const void* weights, int l, pp_param* out, int cap) {
    const tpw* w = (const tpw*)weights;
    int i;
    (void)m;
    if (l < 0 || l >= TPL) return -1;
    for (i = 0; out && i < 2 && i < cap; i++) out[i] = pp_param_of(w->data[l][i], w->count[l][i], w->dt[l][i]);
    return 2;
}
static pp_model tp_model(void) {
    pp_model m;
    memset(&m, 0, sizeof m);
    m.name = "tpmodel";
    m.n_layers = TPL;
    m.forward = tp_fwd;
    m.backward = tp_bwd;
    m.describe = tp_describe;
    m.params = tp_params;
    return m;
}

static const pp_ckpt_shard TP_SHARDS[3] = {{0, 0, PP_SHARD_ROWS, 35, 5}, {1, 0, PP_SHARD_COLS, 35, 5}, {2, 0, PP_SHARD_FLAT, 35, 0}};
static float TPW[2][TPL][35];   /* [slot][layer]: the whole weights (slot 0) and state m (slot 1) */
static double TPB[2][TPL][5];   /* the biases, whole on every rank (layer 2's as f64, the others f32 below) */
static float TPBF[2][TPL][5];

/* The test's own reading of the rule: units [min(N, k c), min(N, (k + 1) c)), c = ceil(N / n). */
static int64_t tp_slice_of(int l, int k, int n, float* out, const float* whole) {
    int64_t N = l == 0 ? 7 : l == 1 ? 5 : 35, c = (N + n - 1) / n, a = k * c < N ? k * c : N, e = a + c < N ? a + c : N, i,
            j, m = 0;
    for (i = a; i < e && l == 2; i++) out[m++] = whole[i];
    for (i = a; i < e && l == 0; i++)
        for (j = 0; j < 5; j++) out[m++] = whole[i * 5 + j];
    for (i = 0; i < 7 && l == 1; i++)
        for (j = a; j < e; j++) out[m++] = whole[i * 5 + j];
    return m;
}

/* Rank k of n's model structs (slot 0, 1) over its storage: slices of the sharded weights. */
typedef struct tpmem {
    float w[2][TPL][35];
    float bf[2][TPL][5];
    double bd[2][TPL][5];
} tpmem;
static void tp_bind(tpw st[2], tpmem* mem, int k, int n, int fill) {
    int s, l;
    for (s = 0; s < 2; s++)
        for (l = 0; l < TPL; l++) {
            st[s].data[l][0] = mem->w[s][l];
            st[s].dt[l][0] = PP_F32;
            st[s].count[l][0] = l == 3 ? 35 : tp_slice_of(l, k, n, mem->w[s][l], TPW[s][l]);
            if (l == 3) memcpy(mem->w[s][l], TPW[s][l], sizeof TPW[s][l]);
            st[s].dt[l][1] = l == 2 ? PP_F64 : PP_F32;
            st[s].data[l][1] = l == 2 ? (void*)mem->bd[s][l] : (void*)mem->bf[s][l];
            st[s].count[l][1] = 5;
            memcpy(mem->bd[s][l], TPB[s][l], sizeof TPB[s][l]);
            memcpy(mem->bf[s][l], TPBF[s][l], sizeof TPBF[s][l]);
            if (!fill) { /* a load's target: zeros, the counts as the slices' */
                memset(mem->w[s][l], 0, sizeof mem->w[s][l]);
                memset(mem->bd[s][l], 0, sizeof mem->bd[s][l]);
                memset(mem->bf[s][l], 0, sizeof mem->bf[s][l]);
            }
        }
}

static void tp_desc(pp_ckpt_desc* d, const tpw st[2], const void** stp, const char** names) {
    memset(d, 0, sizeof *d);
    d->model = tp_model();
    d->weights = &st[0];
    stp[0] = &st[1];
    names[0] = "m";
    d->n_state = 1;
    d->state = stp;
    d->state_names = names;
    d->step = 77;
}

static int tp_copy(void* user, void* dst, const void* src, size_t bytes) { /* a device's copy, on the host */
    (*(int*)user)++;
    memcpy(dst, src, bytes);
    return 0;
}

typedef struct tprun {
    int pp, tp, load, to_file;
    int then_mem;               /* after the save, every value + 1 and a second save into img, same TP transport */
    pp_result rc2[TPMAX * TPL];
    double timeout;             /* the TP group's deadline (0: 20 s) */
    int copies[TPMAX * TPL];    /* pp > 1: through the copy hook (pp_ckpt_desc.copy), counted */
    pp_threads* all;
    unsigned char* img;         /* the save's image (shared), or the file to load */
    size_t bytes;
    const char* path;
    pp_result rc[TPMAX * TPL];
    int bad[TPMAX * TPL];
    char msg[TPMAX * TPL][600];
} tprun;

/* every value + 1: the weights a later save must write (a slice of the earlier ones is stale) */
static void tp_bump(tpmem* mem) {
    int s, l, i;
    for (s = 0; s < 2; s++)
        for (l = 0; l < TPL; l++) {
            for (i = 0; i < 35; i++) mem->w[s][l][i] += 1.0f;
            for (i = 0; i < 5; i++) mem->bd[s][l][i] += 1.0, mem->bf[s][l][i] += 1.0f;
        }
}

static pp_result tp_ckpt_rank(int wr, void* user) {
    tprun* R = (tprun*)user;
    int pr = wr / R->tp, k = wr % R->tp, ranks[TPMAX], j, l, s;
    pp_transport t = pp_threads_transport(R->all, wr);
    pp_group g;
    tpw st[2];
    tpmem* mem = (tpmem*)calloc(1, sizeof *mem);
    pp_ckpt_desc d;
    const void* stp[1];
    const char* names[1];
    unsigned char own[TPL];
    pp_error err;
    err.msg[0] = 0;
    for (j = 0; j < R->tp; j++) ranks[j] = pr * R->tp + j;
    memset(&g, 0, sizeof g);
    g.t = &t;
    g.ranks = ranks;
    g.n_ranks = R->tp;
    g.timeout_s = R->timeout > 0 ? R->timeout : 20;
    tp_bind(st, mem, k, R->tp, !R->load);
    tp_desc(&d, st, stp, names);
    for (l = 0; l < TPL; l++) own[l] = (unsigned char)(l * R->pp / TPL == pr);
    d.own = own;
    d.records_only = pr != 0;
    d.tp = &g;
    d.shards = TP_SHARDS;
    d.n_shards = 3;
    if (R->pp > 1) {
        d.copy = tp_copy;
        d.copy_user = &R->copies[wr];
    }
    if (R->load) R->rc[wr] = pp_ckpt_load_mem(&d, R->img, R->bytes, NULL, &err);
    else if (R->to_file) R->rc[wr] = pp_ckpt_save_file(&d, R->path, &err);
    else R->rc[wr] = pp_ckpt_save_mem(&d, R->img, R->bytes, &err);
    if (R->rc[wr] != PP_OK) snprintf(R->msg[wr], sizeof R->msg[wr], "%s", err.msg);
    if (R->then_mem) {
        tp_bump(mem);
        R->rc2[wr] = pp_ckpt_save_mem(&d, R->img, R->bytes, &err);
        if (R->rc2[wr] != PP_OK) snprintf(R->msg[wr], sizeof R->msg[wr], "second save: %s", err.msg);
    }
    for (s = 0; R->load && R->rc[wr] == PP_OK && s < 2; s++) /* every owned slice, every whole copy */
        for (l = 0; l < TPL; l++) {
            float want[35];
            int64_t n = l == 3 ? 35 : tp_slice_of(l, k, R->tp, want, TPW[s][l]);
            if (!own[l]) continue;
            if (l == 3) memcpy(want, TPW[s][l], sizeof want);
            if (memcmp(mem->w[s][l], want, (size_t)n * sizeof(float)) != 0 ||
                (l == 2 ? memcmp(mem->bd[s][l], TPB[s][l], sizeof TPB[s][l]) : memcmp(mem->bf[s][l], TPBF[s][l], sizeof TPBF[s][l])) != 0) {
                R->bad[wr]++;
                snprintf(R->msg[wr], sizeof R->msg[wr], "slot %d layer %d: TP rank %d of %d loaded another slice", s, l, k, R->tp);
            }
        }
    free(mem);
    return PP_OK;
}

/* R's world (R->pp * R->tp threads) made, run through tp_ckpt_rank and gone: the outcomes in R. */
static void tp_run(tprun* R) {
    pp_error err;
    err.msg[0] = 0;
    CHECK(pp_threads_create(R->pp * R->tp, &R->all, &err) == PP_OK, "threads: %s", err.msg);
    if (!R->all) return;
    CHECK(pp_threads_run(R->pp * R->tp, tp_ckpt_rank, R, &err) == PP_OK, "run: %s", err.msg);
    pp_threads_destroy(R->all);
    R->all = NULL;
}

static size_t tp_first_diff(const unsigned char* a, const unsigned char* b, size_t n) {
    size_t i;
    for (i = 0; i < n && a[i] == b[i]; i++) {
    }
    return i;
}

static void test_tp(void) {
    tpw st[2];
    tpmem* mem = (tpmem*)calloc(1, sizeof *mem);
    pp_ckpt_desc d;
    const void* stp[1];
    const char* names[1];
    pp_error err;
    uint64_t size = 0;
    unsigned char *ref, *img;
    int s, l, i, tp, pp, runs = 0;
    char path[300];
    uint32_t x = 777u;
    for (s = 0; s < 2; s++)
        for (l = 0; l < TPL; l++) {
            for (i = 0; i < 35; i++) TPW[s][l][i] = (float)(x = x * 1664525u + 1013904223u) / 4294967296.0f - 0.5f;
            for (i = 0; i < 5; i++) TPB[s][l][i] = (double)(x = x * 1664525u + 1013904223u) / 4294967296.0;
            for (i = 0; i < 5; i++) TPBF[s][l][i] = (float)(x = x * 1664525u + 1013904223u) / 4294967296.0f;
        }
    /* the reference: tp = 1, the whole weights, no shards declared (the format as before) */
    tp_bind(st, mem, 0, 1, 1);
    tp_desc(&d, st, stp, names);
    CHECK(pp_ckpt_size(&d, &size, &err) == PP_OK && size > 0, "size: %s", err.msg);
    ref = (unsigned char*)calloc((size_t)size, 1);
    img = (unsigned char*)calloc((size_t)size, 1);
    CHECK(pp_ckpt_save_mem(&d, ref, (size_t)size, &err) == PP_OK, "reference save: %s", err.msg);
    /* refused: a slice of another size, a shape that is not one */
    {
        pp_ckpt_shard bad[1] = {{0, 0, PP_SHARD_ROWS, 36, 5}};
        d.shards = bad;
        d.n_shards = 1;
        CHECK(pp_ckpt_save_mem(&d, img, (size_t)size, &err) == PP_ERR_INVALID && strstr(err.msg, "multiple of cols"),
              "36 elements in rows of 5: refused (%s)", err.msg);
        bad[0].count = 40;
        CHECK(pp_ckpt_save_mem(&d, img, (size_t)size, &err) == PP_ERR_SIZE && strstr(err.msg, "TP rank 0 of 1 holds 40"),
              "a buffer of 35 declared a shard of 40: PP_ERR_SIZE (%s)", err.msg);
        bad[0].buffer = 2;
        CHECK(pp_ckpt_save_mem(&d, img, (size_t)size, &err) == PP_ERR_INVALID && strstr(err.msg, "buffer 2"),
              "a shard of a buffer the layer lacks: refused (%s)", err.msg);
    }
    for (tp = 1; tp <= TPMAX; tp *= 2)
        for (pp = 1; pp <= TPL; pp *= 2) {
            tprun R;
            memset(&R, 0, sizeof R);
            R.pp = pp;
            R.tp = tp;
            R.img = img;
            R.bytes = (size_t)size;
            memset(img, 0xee, (size_t)size);
            tp_run(&R);
            for (i = 0; i < pp * tp; i++)
                /* copies counted at pp = 2, where every rank holds bytes to save; at pp = 4 a stage of
                   one layer may hold none on a TP rank (a whole layer, an empty last slice) */
                CHECK(R.rc[i] == PP_OK && (pp != 2 || R.copies[i] > 0),
                      "save tp=%d pp=%d: world rank %d: %s (%d copies)", tp,
                      pp, i, R.msg[i], R.copies[i]);
            CHECK(memcmp(img, ref, (size_t)size) == 0, "save tp=%d pp=%d: the image differs from tp = 1's at byte %zu of %llu",
                  tp, pp, tp_first_diff(img, ref, (size_t)size), (unsigned long long)size);
            runs++;
        }
    { /* saved at (p 4, tp 2), resumed at (p 2, tp 1) and at (p 1, tp 4): every rank's weights and
         optimizer state (the "m" slot) as saved, bit for bit */
        static const int at[2][2] = {{2, 1}, {1, 4}};
        unsigned char* img42 = (unsigned char*)calloc((size_t)size, 1);
        int k;
        for (k = -1; k < 2; k++) {
            tprun R;
            memset(&R, 0, sizeof R);
            R.pp = k < 0 ? 4 : at[k][0];
            R.tp = k < 0 ? 2 : at[k][1];
            R.load = k >= 0;
            R.img = img42;
            R.bytes = (size_t)size;
            tp_run(&R);
            for (i = 0; i < R.pp * R.tp; i++)
                CHECK(R.rc[i] == PP_OK && R.bad[i] == 0, "%s at (p %d, tp %d), saved at (p 4, tp 2): world rank %d: %s",
                      k < 0 ? "saved" : "loaded", R.pp, R.tp, i, R.msg[i]);
        }
        free(img42);
    }
    { /* a file at tp = 2: TP rank 1 leaves it alone */
        tprun R;
        FILE* f;
        size_t got;
        snprintf(path, sizeof path, "%s.tp", PATH);
        memset(&R, 0, sizeof R);
        R.pp = 1;
        R.tp = 2;
        R.to_file = 1;
        R.path = path;
        tp_run(&R);
        CHECK(R.rc[0] == PP_OK && R.rc[1] == PP_OK, "save_file tp=2: %s / %s", R.msg[0], R.msg[1]);
        memset(img, 0, (size_t)size);
        f = fopen(path, "rb");
        got = f ? fread(img, 1, (size_t)size, f) : 0;
        CHECK(f && got == size && fgetc(f) == EOF && memcmp(img, ref, (size_t)size) == 0,
              "save_file tp=2: %zu bytes, differ from tp = 1's at byte %zu", got, tp_first_diff(img, ref, got));
        if (f) fclose(f);
        remove(path);
    }
    { /* the write fails on TP rank 0 (a path in no directory): the other TP ranks, which only send,
         return its failure too (a save fails on every TP rank or none). Then every value + 1 and
         a save into memory over the same TP transport must write the new values: the failed
         save must leave no slice queued (before, TP rank 1 sent its slices unasked, and the next
         save read those: build/ckpt-ctl-tp-push) */
        tprun R;
        unsigned char* ref2 = (unsigned char*)calloc((size_t)size, 1);
        tp_bind(st, mem, 0, 1, 1);
        tp_desc(&d, st, stp, names);
        tp_bump(mem);
        CHECK(pp_ckpt_save_mem(&d, ref2, (size_t)size, &err) == PP_OK, "reference save + 1: %s", err.msg);
        memset(&R, 0, sizeof R);
        R.then_mem = 1;
        R.img = img;
        R.bytes = (size_t)size;
        memset(img, 0xee, (size_t)size);
        R.pp = 1;
        R.tp = 2;
        R.to_file = 1;
        R.timeout = 5;
        R.path = "/nonexistent-pp-test-dir/tp.ckpt";
        tp_run(&R);
        CHECK(R.rc[0] != PP_OK && R.rc[1] == R.rc[0] && strstr(R.msg[1], "TP rank 0"),
              "save_file tp=2 into no directory: TP rank 0 %s (%s), TP rank 1 %s (%s): want the same failure on both",
              pp_result_str(R.rc[0]), R.msg[0], pp_result_str(R.rc[1]), R.msg[1]);
        CHECK(R.rc2[0] == PP_OK && R.rc2[1] == PP_OK && memcmp(img, ref2, (size_t)size) == 0,
              "the save after a failed one: %s / %s; the image differs from tp = 1's at byte %zu of %llu (a stale slice)",
              pp_result_str(R.rc2[0]), pp_result_str(R.rc2[1]), tp_first_diff(img, ref2, (size_t)size), (unsigned long long)size);
        free(ref2);
    }
    for (tp = 1; tp <= TPMAX; tp *= 2)
        for (pp = 1; pp <= TPL; pp *= 2) {
            tprun R;
            memset(&R, 0, sizeof R);
            R.pp = pp;
            R.tp = tp;
            R.load = 1;
            R.img = ref;
            R.bytes = (size_t)size;
            tp_run(&R);
            for (i = 0; i < pp * tp; i++)
                CHECK(R.rc[i] == PP_OK && R.bad[i] == 0 && (pp != 2 || R.copies[i] > 0), "load tp=%d pp=%d: world rank %d: %s",
                      tp, pp, i, R.msg[i]);
        }
    printf("tp: saves at tp = 1, 2, 4 x pp = 1, 2, 4 (%d) and a file at tp = 2 equal the tp = 1 save byte for byte (%llu "
           "bytes; rows, columns, a flat split with a short last slice, whole copies, a state); loads at tp = 1, 2, 4 give "
           "each rank its slices; saved at (p 4, tp 2), loaded at (p 2, tp 1) and (p 1, tp 4) bit for bit\n",
           runs, (unsigned long long)size);
    free(ref);
    free(img);
    free(mem);
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : NULL; /* what a negative control runs */
    int corrupt_only = only && !strcmp(only, "corrupt");
    snprintf(PATH, sizeof PATH, "%s/pp_test_ckpt.%ld.ckpt", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    if (only && !strcmp(only, "tp")) {
        test_tp();
        return TEST_DONE("ckpt");
    }
    trainer_init(&T, DIMS, 99);
    W0 = (float*)malloc(T.opt.n * sizeof(float));
    M0 = (float*)malloc(T.opt.n * sizeof(float));
    V0 = (float*)malloc(T.opt.n * sizeof(float));
    {
        size_t i;
        for (i = 0; i < T.opt.n; i++) T.opt.mbuf[i] = (float)i, T.opt.vbuf[i] = 1.0f / (float)(i + 1);
    }
    snapshot();
    if (only && (!strcmp(only, "save") || !strcmp(only, "partial"))) {
        if (!strcmp(only, "save")) test_save();
        else test_partial();
        remove(PATH);
        trainer_free(&T);
        free(W0);
        free(M0);
        free(V0);
        return TEST_DONE("ckpt");
    }
    test_reshape();
    if (!corrupt_only) test_format();
    printf("refused (each leaves the weights and states untouched):\n");
    test_corrupt();
    if (!corrupt_only) {
        test_refusals();
        test_parts();
        test_partial();
        test_save();
        test_gpt();
        test_tp();
    }
    remove(PATH);
    trainer_free(&T);
    free(W0);
    free(M0);
    free(V0);
    free(FULL);
    return TEST_DONE("ckpt");
}
