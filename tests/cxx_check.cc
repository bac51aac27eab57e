// Compiles every header as C++ (and under nvcc with make check-cuda): the implementation too.
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline.h"  // a second include is harmless

// PP_MODEL and PP_MODEL_SPLIT expand to C++ without warnings, runtime counts included.
struct cxx_p {
    int n;
};
static int cxx_fwd(const cxx_p*, pp_layer_io*) { return 0; }
static int cxx_bwd(const cxx_p*, cxx_p*, pp_layer_io*) { return 0; }
static void cxx_desc(const cxx_p*, const pp_microbatch*, const pp_tensor*, int, pp_layer_desc*) {}
#define CXX_LAYERS(X) X(a, cxx_p, cxx_fwd, cxx_bwd, cxx_desc, 1) X(b, cxx_p, cxx_fwd, cxx_bwd, cxx_desc, 4)
#define CXXZ_LAYERS(X) X(a, cxx_p, cxx_fwd, cxx_bwd, cxx_bwd, cxx_desc, 1) X(b, cxx_p, cxx_fwd, cxx_bwd, PP_NO_WGRAD, cxx_desc, 4)
PP_MODEL(cxx, CXX_LAYERS)
PP_MODEL_SPLIT(cxxz, CXXZ_LAYERS)
// and PP_MODEL_PARAMS: a checkpoint of it, saved to memory and loaded back
static float cxx_buf[5] = {1, 2, 3, 4, 5};
static int cxx_plist(const cxx_p* p, pp_param* out, int cap) {
    if (cap >= 1) out[0] = pp_param_of(cxx_buf, p->n, PP_F32);
    return 1;
}
#define CXX_PARAMS(X) X(b, cxx_plist)
PP_MODEL_PARAMS(cxx, CXX_PARAMS)
PP_MODEL_PARAMS(cxxz, CXX_PARAMS)

// PP_MODEL_ORDER (offsetof over a local typedef), PP_DESCRIBE_SAME / _LOSS and the derived lists
#define CXX_ORDER(X) X(b) X(a) X(b)
PP_MODEL_ORDER(cxx, CXX_ORDER)
PP_MODEL_ORDER(cxxz, CXX_ORDER)
PP_DESCRIBE_SAME(cxx_same_desc, cxx_p)
PP_DESCRIBE_LOSS(cxx_loss_desc, cxx_p)
int pp_cxx_order(void);
int pp_cxx_order(void) {
    pp_model m = cxx_model_desc_order(), z = cxxz_model_desc_order();
    pp_grad_buf gb[4];
    pp_layer_desc ld = pp_layer_desc();
    pp_tensor in = pp_tensor();
    int nb = 0;
    cxx_model g = cxx_model();
    pp_error err;
    for (int i = 0; i < 4; i++) g.b[i].n = 1;
    m.params = cxx_params;
    cxx_same_desc(NULL, NULL, &in, 1, &ld);
    cxx_loss_desc(NULL, NULL, &in, 1, &ld);
    pp_param sh = pp_param_shard(cxx_buf, 1, PP_F32);
    return (pp_model_grad_bufs(&m, &g, NULL, gb, 4, &nb, &err) == PP_OK && nb == 2 ? 0 : 1) + m.order[0] + z.n_layers +
           sh.tp_sharded;
}

int pp_cxx_check(void);
int pp_cxx_check(void) {
    pp_error err;
    pp_action acts[16];
    pp_schedule s;
    cxx_counts n = cxx_counts();
    n.b = 2;
    pp_model m = cxx_model_desc_counts(n), z = cxxz_model_desc();
    pp_pipeline_desc d = pp_pipeline_desc();
    d.model = m;
    pp_pipeline* pl = NULL;
    pp_ckpt_desc c = pp_ckpt_desc();
    cxx_model w = cxx_model();
    unsigned char img[1024];
    for (int i = 0; i < 4; i++) w.b[i].n = 1;
    c.model = m;
    c.model.params = cxx_params;
    c.weights = &w;
    int ck = pp_ckpt_save_mem(&c, img, sizeof img, &err) == PP_OK && pp_ckpt_load_mem(&c, img, sizeof img, NULL, &err) == PP_OK
                 ? 0 : 1;
    return ck + (pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 16, &s, &err) == PP_OK ? 0 : 1) + m.n_layers + z.n_layers +
           (pp_pipeline_create(&d, &pl, &err) == PP_ERR_INVALID ? 0 : 1);
}
