/* tests/fuzz/fuzz_ckpt.c - libFuzzer target: the checkpoint loader (pp_ckpt_load_mem) on damaged
   files. The input is a recipe applied to a valid checkpoint of a small model (three layers:
   f32 buffers, none, an f64 buffer; two states; five user bytes): byte 0 holds flags - bit 0:
   after the changes, recompute the header's checksum, so that the tables themselves are what
   the loader meets; bit 1: cut the image to (bytes 1-2) modulo its length; bit 2: the rest of
   the input is the whole file instead - then (offset u16, xor u8) triples, offsets modulo the
   image's length. Any input: the load returns an error with its message and leaves every byte of
   the weights, the states and the user bytes as it was, or PP_OK with the weights equal to the
   saved ones (and, where the header kept its own checksum, the states and user bytes too). */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../../pipeline.h"
#define FUZZ_NAME "fuzz_ckpt"
#include "fuzz.h"

typedef struct fzm {
    float a[6], b[3];
    double c[2];
} fzm;

static int fz_params(const pp_model* m, const void* w_, int l, pp_param* out, int cap) {
    const fzm* w = (const fzm*)w_;
    (void)m;
    if (l == 0) {
        if (cap >= 2) {
            out[0] = pp_param_of((void*)(uintptr_t)w->a, 6, PP_F32);
            out[1] = pp_param_of((void*)(uintptr_t)w->b, 3, PP_F32);
        }
        return 2;
    }
    if (l == 1) return 0;
    if (l == 2) {
        if (cap >= 1) out[0] = pp_param_of((void*)(uintptr_t)w->c, 2, PP_F64);
        return 1;
    }
    return -1;
}
static int fz_fwd(const void* w, int l, pp_layer_io* io) {
    (void)w, (void)l, (void)io;
    return 0;
}
static int fz_bwd(const void* w, void* g, int l, pp_layer_io* io) {
    (void)w, (void)g, (void)l, (void)io;
    return 0;
}
static void fz_desc(const void* w, int l, const pp_microbatch* mb, const pp_tensor* in, int n_in, pp_layer_desc* d) {
    (void)w, (void)l, (void)mb, (void)in, (void)n_in, (void)d;
}

static void fz_fill(fzm* w, float base) { /* padding included: the checks compare whole structs */
    int i;
    memset(w, 0, sizeof *w);
    for (i = 0; i < 6; i++) w->a[i] = base + (float)i;
    for (i = 0; i < 3; i++) w->b[i] = base * 2 + (float)i;
    for (i = 0; i < 2; i++) w->c[i] = (double)base / 3 + i;
}

static pp_ckpt_desc fz_ckdesc(fzm* w, fzm* m, fzm* v, const void** st, char* user) {
    static const char* const names[2] = {"m", "v"};
    pp_ckpt_desc c;
    memset(&c, 0, sizeof c);
    c.model.name = "fuzz";
    c.model.n_layers = 3;
    c.model.forward = fz_fwd;
    c.model.backward = fz_bwd;
    c.model.describe = fz_desc;
    c.model.params = fz_params;
    c.weights = w;
    st[0] = m;
    st[1] = v;
    c.n_state = 2;
    c.state = st;
    c.state_names = names;
    c.user = user;
    c.user_bytes = 5;
    c.step = 77;
    return c;
}

static uint64_t fz_fnv(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static uint8_t img[4096], file[4096];
    static size_t img_n;
    static fzm W, M, V;
    static char U[5] = "user";
    fzm w, m, v, w0, m0, v0;
    char u[5], u0[5];
    const void* st[2];
    pp_ckpt_desc c;
    pp_error err;
    pp_result rc;
    size_t n, i, at = 1;
    uint32_t flags = size ? data[0] : 0;
    if (!img_n) { /* the valid checkpoint, once */
        uint64_t need = 0;
        fz_fill(&W, 1.5f);
        fz_fill(&M, -2.0f);
        fz_fill(&V, 0.25f);
        c = fz_ckdesc(&W, &M, &V, st, U);
        FZ_CHECK(pp_ckpt_size(&c, &need, &err) == PP_OK && need <= sizeof img, "%s", err.msg);
        FZ_CHECK(pp_ckpt_save_mem(&c, img, sizeof img, &err) == PP_OK, "%s", err.msg);
        img_n = (size_t)need;
    }
    if (flags & 4) {
        n = size - 1 < sizeof file ? size - 1 : sizeof file;
        if (size) memcpy(file, data + 1, n);
    } else {
        memcpy(file, img, img_n);
        n = img_n;
        if (flags & 2) {
            n = (size_t)((size > 2 ? data[1] | (uint32_t)data[2] << 8 : 0) % (img_n + 1));
            at = 3;
        }
        for (i = at; n > 0 && i + 2 < size; i += 3) file[(data[i] | (size_t)data[i + 1] << 8) % n] ^= data[i + 2];
        if ((flags & 1) && n >= 80) {
            uint64_t H = 0;
            int k;
            for (k = 7; k >= 0; k--) H = H << 8 | file[16 + k];
            if (H >= 80 && H <= n) {
                uint64_t h;
                memset(file + 72, 0, 8);
                h = fz_fnv(file, (size_t)H);
                for (k = 0; k < 8; k++) file[72 + k] = (uint8_t)(h >> (8 * k));
            }
        }
    }
    /* the target: other bytes everywhere */
    fz_fill(&w, 9.0f);
    fz_fill(&m, 8.0f);
    fz_fill(&v, 7.0f);
    memcpy(u, "XXXXX", 5);
    memcpy(&w0, &w, sizeof w);
    memcpy(&m0, &m, sizeof m);
    memcpy(&v0, &v, sizeof v);
    memcpy(u0, u, 5);
    c = fz_ckdesc(&w, &m, &v, st, u);
    memset(&err, 0, sizeof err);
    rc = pp_ckpt_load_mem(&c, file, n, NULL, &err);
    if (rc != PP_OK) {
        FZ_CHECK(err.msg[0] != 0 && err.code == rc, "%s without a message", pp_result_str(rc));
        FZ_CHECK(!memcmp(&w, &w0, sizeof w) && !memcmp(&m, &m0, sizeof m) && !memcmp(&v, &v0, sizeof v) &&
                     !memcmp(u, u0, 5),
                 "refused (%s) but wrote into the buffers", err.msg);
        return 0;
    }
    FZ_CHECK(!memcmp(&w, &W, sizeof w), "loaded weights differ from the saved ones");
    if (!(flags & 5))
        FZ_CHECK(!memcmp(&m, &M, sizeof m) && !memcmp(&v, &V, sizeof v) && !memcmp(u, U, 5),
                 "loaded states or user bytes differ from the saved ones");
    return 0;
}
