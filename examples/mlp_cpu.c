/* examples/mlp_cpu.c - START HERE: train an MLP through a pipeline of CPU threads.

   What to copy: main's pipeline part (the block "the pipeline: one desc"). One zero-initialised
   pp_pipeline_desc (model, weights, gradients, schedule, p, m), pp_pipeline_create, then per
   step a pp_batch, pp_pipeline_step, your optimizer (which zeroes the gradients), and
   pp_pipeline_destroy. The README's quick start is the same in one file, with its own layers.
   Your model takes mlp.h's place: a PP_MODEL layer list and plain forward/backward/describe
   functions over flat buffers. check_step shows how to hold a step against pp_sequential_step.
   Which example next: gpt_cpu.c (packed variable-length sequences, Adam, a partition by cost,
   a Chrome trace), gpt_cuda.cu (a GPU, one process), gpt_mpi.c and tlm_mpi.c (one process per
   rank over MPI), gpt_nccl.cu (one process per GPU over NCCL, pp x dp).

   The data is a generated classification task (a random linear teacher): the loss must fall.

     build/mlp_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p 4] [-m 8] [--steps 60]
                   [--rows 256] [--hidden 64] [--lr 0.1] [--check]

   --check: the first step's loss and gradients must equal pp_sequential_step's, bit for bit
   (exit 1 if not). */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 11
#include "mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg {
    pp_schedule_kind kind;
    const char* sched;
    int p, m, steps, rows, hidden, in, classes, check;
    float lr, momentum;
} cfg;

static void usage(void) {
    fprintf(stderr, "usage: mlp_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p P] [-m M] [--steps N]\n"
                    "               [--rows R] [--hidden H] [--lr LR] [--check]\n");
}

static int parse(int argc, char** argv, cfg* c) {
    int i;
    memset(c, 0, sizeof *c);
    c->kind = PP_SCHED_1F1B;
    c->sched = "1f1b";
    c->p = 4;
    c->m = 8;
    c->steps = 60;
    c->rows = 256;
    c->hidden = 64;
    c->in = 16;
    c->classes = 8;
    c->lr = 0.1f;
    c->momentum = 0.9f;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!val) { usage(); return 1; }
        if (!strcmp(a, "--schedule") || !strcmp(a, "-s")) {
            if (pp_schedule_kind_parse(val, &c->kind) != PP_OK) { fprintf(stderr, "unknown schedule '%s'\n", val); return 1; }
            c->sched = val;
        } else if (!strcmp(a, "-p")) c->p = atoi(val);
        else if (!strcmp(a, "-m")) c->m = atoi(val);
        else if (!strcmp(a, "--steps")) c->steps = atoi(val);
        else if (!strcmp(a, "--rows")) c->rows = atoi(val);
        else if (!strcmp(a, "--hidden")) c->hidden = atoi(val);
        else if (!strcmp(a, "--lr")) c->lr = (float)atof(val);
        else { usage(); return 1; }
        i++;
    }
    if (c->steps < 1 || c->rows < 1 || c->m < 1 || c->rows < c->m || c->hidden < 1 || c->hidden > 512) {
        fprintf(stderr, "steps, m and rows >= 1 (rows >= m), hidden in 1..512\n");
        return 1;
    }
    return 0;
}

/* SGD with momentum over the flat parameter buffer; zeroes the gradients for the next step. */
static void sgd(const cfg* c, float* w, float* g, float* mom, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        mom[i] = c->momentum * mom[i] + g[i];
        w[i] -= c->lr * mom[i];
        g[i] = 0.0f;
    }
}

/* --check: the sequential reference on the same batch, before the update, must give the same
   loss and the same gradient bits as the pipelined step. */
static int check_step(const pp_model* model, const mlp_model* w, const int* dims, pp_batch b, int m, float loss,
                      const float* g, size_t n) {
    mlp_model gref = *w, tmp;
    float *grefbuf = NULL, ref = 0;
    int same;
    free(mlp_init(&tmp, &gref, dims, 1, &grefbuf)); /* gradients in w's layout, zeroed */
    b.m = m;
    if (!grefbuf || pp_sequential_step(model, w, &gref, &b, &ref, NULL) != PP_OK) return 1;
    same = memcmp(&ref, &loss, sizeof ref) == 0 && memcmp(grefbuf, g, n * sizeof *g) == 0;
    printf("check: step 0 loss %.9g pipelined, %.9g sequential; %s\n", (double)loss, (double)ref,
           same ? "gradients bit-identical" : "DIFFERENT");
    free(grefbuf);
    return !same;
}

int main(int argc, char** argv) {
    cfg c;
    mlp_model w, g;
    float *wbuf, *gbuf, *mbuf, *x;
    int32_t* y;
    int dims[MLP_DEPTH + 1], l, step, rc = 0;
    size_t n_par;
    if (parse(argc, argv, &c)) return 2;
    dims[0] = c.in;
    for (l = 1; l < MLP_DEPTH; l++) dims[l] = c.hidden;
    dims[MLP_DEPTH] = c.classes;
    n_par = mlp_param_count(dims);
    wbuf = mlp_init(&w, &g, dims, 1234, &gbuf); /* weights, and gradients zeroed in the same layout */
    mbuf = (float*)calloc(n_par, sizeof(float));
    x = (float*)malloc((size_t)c.steps * c.rows * c.in * sizeof(float)); /* (steps, rows, in) */
    y = (int32_t*)malloc((size_t)c.steps * c.rows * sizeof(int32_t));  /* (steps, rows) */
    if (!wbuf || !mbuf || !x || !y) return 3;
    mlp_make_data(x, y, c.steps * c.rows, c.in, c.classes, 777, 4242);
    printf("mlp: %d layers, %zu parameters; %s p=%d m=%d, %d rows per step\n", MLP_DEPTH + 1, n_par, c.sched, c.p, c.m,
           c.rows);
    printf("data: %d generated rows, %d features uniform in [-1, 1), %d classes from a fixed random linear teacher\n",
           c.steps * c.rows, c.in, c.classes);
    {
        /* the pipeline: one desc, zero is a default everywhere (v, partition, timeouts, ...) */
        pp_pipeline_desc d = {
            .model = mlp_model_desc(),
            .weights = &w,
            .grads = &g,
            .schedule = c.kind,
            .p = c.p,
            .m = c.m,
        };
        pp_pipeline* pl;
        pp_step_stats st;
        pp_error err;
        float first = 0;
        double seconds = 0;
        if (pp_pipeline_create(&d, &pl, &err) != PP_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 2;
        }
        for (step = 0; step < c.steps && rc == 0; step++) {
            pp_batch b = {.input = {.data = x + (size_t)step * c.rows * c.in, .rows = c.rows, .cols = c.in, .dtype = PP_F32},
                          .targets = y + (size_t)step * c.rows,
                          .target_row_bytes = sizeof(int32_t)}; /* m 0: the pipeline's */
            if ((rc = pp_pipeline_step(pl, &b, &st)) != PP_OK) {
                fprintf(stderr, "step %d: %s\n", step, pp_pipeline_error(pl));
                break;
            }
            if (c.check && step == 0) rc = check_step(&d.model, &w, dims, b, c.m, st.loss, gbuf, n_par);
            sgd(&c, wbuf, gbuf, mbuf, n_par);
            if (step == 0) first = st.loss;
            seconds += st.t_total;
            if (step % 10 == 0 || step == c.steps - 1)
                printf("step %4d  loss %.4f  step %.2f ms\n", step, st.loss, 1e3 * st.t_total);
        }
        if (step == c.steps) /* the closing summary */
            printf("summary: loss %.4f -> %.4f over %d steps; %d rows in %.2f s: %.0f rows/s on %d stage threads; %s\n", first,
                   st.loss, c.steps, c.steps * c.rows, seconds, seconds > 0 ? c.steps * c.rows / seconds : 0.0, c.p,
                   !c.check ? "not checked (--check: step 0 against the sequential model)"
                   : rc == 0 ? "step 0 bit-identical to the sequential model"
                             : "step 0 DIFFERS from the sequential model");
        pp_pipeline_destroy(pl);
    }
    free(wbuf);
    free(gbuf);
    free(mbuf);
    free(x);
    free(y);
    return rc;
}
