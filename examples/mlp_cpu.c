/* examples/mlp_cpu.c - train an MLP through a pipeline of CPU threads.

   Each rank is a thread that sees only its own stages: it builds a pp_stage, runs the schedule
   for every step, and updates the parameters of the layers it owns (SGD with momentum). The
   data is a generated classification task (a random linear teacher), so the loss must fall.

     build/mlp_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p 4] [-v 2] [-m 8] [--steps 60]
                   [--rows 256] [--hidden 64] [--lr 0.1] [--partition uniform|cost|params]
                   [--trace trace.json] [--check]

   --check also runs the sequential reference on the first step and compares the loss. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#define MLP_DEPTH 11
#include "mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cfg {
    pp_schedule_kind kind;
    int p, v, m, steps, rows, hidden, in, classes;
    float lr, momentum;
    pp_partition_policy partition;
    const char* trace;
    int check;
} cfg;

typedef struct trainer {
    cfg c;
    pp_model model;
    mlp_model w, g, mom;
    float *wbuf, *gbuf, *mbuf;
    int first[PP_MAX_RANKS + 1];
    pp_schedule sched;
    pp_threads* threads;
    float* x;           /* (steps, rows, in) */
    int32_t* y;         /* (steps, rows) */
    pp_step_stats stats[PP_MAX_RANKS];
    double bubble_sum[PP_MAX_RANKS];
    pp_event* events;   /* last step, all ranks */
    size_t n_events;
    pthread_mutex_t mu;
} trainer;

static void usage(void) {
    fprintf(stderr, "usage: mlp_cpu [--schedule gpipe|1f1b|interleaved|zb-h1|zb-v] [-p P] [-v V] [-m M] [--steps N]\n"
                    "               [--rows R] [--hidden H] [--lr LR] [--partition uniform|cost|params]\n"
                    "               [--trace FILE.json] [--check]\n");
}

static int parse(int argc, char** argv, cfg* c) {
    int i;
    memset(c, 0, sizeof *c);
    c->kind = PP_SCHED_1F1B;
    c->p = 4;
    c->v = 0;
    c->m = 8;
    c->steps = 60;
    c->rows = 256;
    c->hidden = 64;
    c->in = 16;
    c->classes = 8;
    c->lr = 0.1f;
    c->momentum = 0.9f;
    c->partition = PP_PARTITION_COST;
    for (i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) { c->check = 1; continue; }
        if (!val) { usage(); return 1; }
        if (!strcmp(a, "--schedule") || !strcmp(a, "-s")) {
            if (pp_schedule_kind_parse(val, &c->kind) != PP_OK) { fprintf(stderr, "unknown schedule '%s'\n", val); return 1; }
        } else if (!strcmp(a, "-p")) c->p = atoi(val);
        else if (!strcmp(a, "-v")) c->v = atoi(val);
        else if (!strcmp(a, "-m")) c->m = atoi(val);
        else if (!strcmp(a, "--steps")) c->steps = atoi(val);
        else if (!strcmp(a, "--rows")) c->rows = atoi(val);
        else if (!strcmp(a, "--hidden")) c->hidden = atoi(val);
        else if (!strcmp(a, "--lr")) c->lr = (float)atof(val);
        else if (!strcmp(a, "--trace")) c->trace = val;
        else if (!strcmp(a, "--partition")) {
            if (!strcmp(val, "uniform")) c->partition = PP_PARTITION_UNIFORM;
            else if (!strcmp(val, "cost")) c->partition = PP_PARTITION_COST;
            else if (!strcmp(val, "params")) c->partition = PP_PARTITION_PARAMS;
            else { fprintf(stderr, "unknown partition '%s'\n", val); return 1; }
        } else { usage(); return 1; }
        i++;
    }
    if (c->v == 0) c->v = c->kind == PP_SCHED_INTERLEAVED || c->kind == PP_SCHED_ZB_V ? 2 : 1;
    if (c->steps < 1 || c->rows < 1 || c->hidden < 1 || c->hidden > 512) {
        fprintf(stderr, "steps and rows must be >= 1, hidden in 1..512\n");
        return 1;
    }
    return 0;
}

/* Applies SGD with momentum to the layers of stages this rank owns, then zeroes their grads. */
static void update_owned(trainer* T, int rank) {
    int chunk, l;
    for (chunk = 0; chunk < T->sched.v; chunk++) {
        int s = pp_schedule_stage(&T->sched, rank, chunk);
        for (l = T->first[s]; l < T->first[s + 1]; l++) {
            dense_params *w, *g, *mo;
            size_t n, i;
            if (l >= MLP_DEPTH) continue; /* the loss layer has no parameters */
            w = &T->w.dense[l];
            g = &T->g.dense[l];
            mo = &T->mom.dense[l];
            n = (size_t)w->in * w->out + w->out; /* w and b are adjacent in the flat buffer */
            for (i = 0; i < n; i++) {
                mo->w[i] = T->c.momentum * mo->w[i] + g->w[i];
                w->w[i] -= T->c.lr * mo->w[i];
                g->w[i] = 0;
            }
        }
    }
}

static pp_result rank_main(int rank, void* user) {
    trainer* T = (trainer*)user;
    pp_stage_desc d;
    pp_stage* st = NULL;
    pp_error err;
    pp_result rc;
    int step;
    memset(&d, 0, sizeof d);
    d.model = T->model;
    d.weights = &T->w;
    d.grads = &T->g;
    d.schedule = &T->sched;
    d.partition = T->first;
    d.rank = rank;
    d.transport = pp_threads_transport(T->threads, rank);
    d.record_timeline = T->c.trace != NULL;
    if ((rc = pp_stage_create(&d, &st, &err)) != PP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return rc;
    }
    for (step = 0; step < T->c.steps; step++) {
        pp_batch b;
        memset(&b, 0, sizeof b);
        b.m = T->c.m;
        b.input.data = T->x + (size_t)step * T->c.rows * T->c.in;
        b.input.rows = T->c.rows;
        b.input.cols = T->c.in;
        b.input.dtype = PP_F32;
        b.targets = T->y + (size_t)step * T->c.rows;
        b.target_row_bytes = sizeof(int32_t);
        rc = pp_stage_step(st, &b, &T->stats[rank]);
        if (rc != PP_OK) {
            fprintf(stderr, "step %d: %s\n", step, pp_stage_error(st));
            break;
        }
        update_owned(T, rank);
        {
            const pp_step_stats* ss = &T->stats[rank];
            double busy = ss->t_forward + ss->t_backward;
            T->bubble_sum[rank] += ss->t_total > 0 ? 1.0 - busy / ss->t_total : 0;
            if (ss->has_loss && (step % 10 == 0 || step == T->c.steps - 1))
                printf("step %4d  loss %.4f  step %.2f ms  bubble on this rank %.1f%%\n", step, ss->loss,
                       1e3 * ss->t_total, 100.0 * (ss->t_total > 0 ? 1.0 - busy / ss->t_total : 0));
        }
    }
    if (rc == PP_OK && T->c.trace) {
        size_t n, i;
        const pp_event* ev = pp_stage_timeline(st, &n);
        pthread_mutex_lock(&T->mu);
        for (i = 0; i < n; i++) T->events[T->n_events++] = ev[i];
        pthread_mutex_unlock(&T->mu);
    }
    pp_stage_destroy(st);
    return rc;
}

int main(int argc, char** argv) {
    trainer* T;
    pp_error err;
    pp_partition_desc pd;
    pp_tensor sample;
    pp_action* acts;
    size_t n_acts;
    int dims[MLP_DEPTH + 1], l, rc = 1;
    double imbalance = 0, weights[MLP_DEPTH + 1];
    T = (trainer*)calloc(1, sizeof *T);
    if (!T || parse(argc, argv, &T->c)) return 2;
    T->model = mlp_model_desc();
    dims[0] = T->c.in;
    for (l = 1; l < MLP_DEPTH; l++) dims[l] = T->c.hidden;
    dims[MLP_DEPTH] = T->c.classes;
    T->wbuf = mlp_init(&T->w, &T->g, dims, 1234, &T->gbuf);
    T->mbuf = mlp_init(&T->mom, NULL, dims, 1, NULL);
    if (!T->wbuf || !T->mbuf) return 3;
    memset(T->mbuf, 0, mlp_param_count(dims) * sizeof(float));

    /* partition the 12 layers into p*v stages */
    memset(&pd, 0, sizeof pd);
    memset(&sample, 0, sizeof sample);
    sample.rows = T->c.rows / (T->c.m > 0 ? T->c.m : 1);
    sample.cols = T->c.in;
    sample.dtype = PP_F32;
    pd.policy = T->c.partition;
    pd.n_stages = T->c.p * T->c.v;
    pd.sample = &sample;
    if (T->c.p * T->c.v > PP_MAX_RANKS ||
        pp_partition_model(&T->model, &T->w, &pd, T->first, &imbalance, &err) != PP_OK) {
        fprintf(stderr, "partition: %s\n", T->c.p * T->c.v > PP_MAX_RANKS ? "too many stages" : err.msg);
        return 2;
    }
    n_acts = pp_schedule_size(T->c.kind, T->c.p, T->c.v, T->c.m);
    acts = (pp_action*)malloc((n_acts ? n_acts : 1) * sizeof *acts);
    if (!acts || pp_schedule_make(T->c.kind, T->c.p, T->c.v, T->c.m, acts, n_acts, &T->sched, &err) != PP_OK) {
        fprintf(stderr, "schedule: %s\n", err.msg);
        return 2;
    }
    if (pp_model_layer_costs(&T->model, &T->w, &sample, weights, NULL, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    printf("mlp: %d layers, %zu parameters; %s p=%d v=%d m=%d, %d rows per step\n", T->model.n_layers,
           mlp_param_count(dims), pp_schedule_name(T->c.kind), T->c.p, T->c.v, T->c.m, T->c.rows);
    pp_partition_print(stdout, &T->model, T->first, T->c.p * T->c.v, weights);
    printf("partition imbalance %.3f (by cost: %.3f)\n", imbalance,
           pp_partition_imbalance(weights, T->model.n_layers, T->first, T->c.p * T->c.v));

    /* data: a fresh batch per step */
    T->x = (float*)malloc((size_t)T->c.steps * T->c.rows * T->c.in * sizeof(float));
    T->y = (int32_t*)malloc((size_t)T->c.steps * T->c.rows * sizeof(int32_t));
    if (!T->x || !T->y) return 3;
    mlp_make_data(T->x, T->y, T->c.steps * T->c.rows, T->c.in, T->c.classes, 777, 4242);

    if (T->c.check) {
        /* the sequential reference on step 0 must give the same loss as the pipeline will */
        pp_batch b;
        float loss = 0;
        memset(&b, 0, sizeof b);
        b.m = T->c.m;
        b.input.data = T->x;
        b.input.rows = T->c.rows;
        b.input.cols = T->c.in;
        b.input.dtype = PP_F32;
        b.targets = T->y;
        b.target_row_bytes = sizeof(int32_t);
        if (pp_sequential_step(&T->model, &T->w, &T->g, &b, &loss, &err) != PP_OK) {
            fprintf(stderr, "reference: %s\n", err.msg);
            return 2;
        }
        printf("reference step 0 loss %.6f\n", loss);
        memset(T->gbuf, 0, mlp_param_count(dims) * sizeof(float));
    }

    if (pp_threads_create(T->c.p, &T->threads, &err) != PP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    T->events = T->c.trace ? (pp_event*)calloc((size_t)T->c.p * T->sched.per_rank, sizeof(pp_event)) : NULL;
    pthread_mutex_init(&T->mu, NULL);
    if (pp_threads_run(T->c.p, rank_main, T, &err) == PP_OK) {
        /* the schedule's own bubble with equal stages, f = 1, b = 2 (this MLP does its weight
           gradients inside backward, so a W action costs nothing here) */
        static pp_sim_result sim;
        double theory = pp_simulate(&T->sched, NULL, &sim, NULL, NULL) == PP_OK ? sim.bubble : 0, bubble = 0;
        int r;
        for (r = 0; r < T->c.p; r++) bubble += T->bubble_sum[r] / T->c.steps / T->c.p;
        printf("mean measured bubble %.1f%% (schedule simulated %.1f%% with equal stages; %d ranks on %ld cores)\n",
               100.0 * bubble, 100.0 * theory, T->c.p, sysconf(_SC_NPROCESSORS_ONLN));
        if (T->c.trace) {
            FILE* f = fopen(T->c.trace, "w");
            if (f) {
                pp_timeline_chrome(f, T->events, T->n_events, 1e6);
                fclose(f);
                printf("timeline of the last step: %s (open in ui.perfetto.dev)\n", T->c.trace);
            }
        }
        rc = 0;
    } else {
        fprintf(stderr, "training failed: %s\n", err.msg);
    }
    pthread_mutex_destroy(&T->mu);
    pp_threads_destroy(T->threads);
    free(T->events);
    free(acts);
    free(T->x);
    free(T->y);
    free(T->wbuf);
    free(T->gbuf);
    free(T->mbuf);
    free(T);
    return rc;
}
