/* tools/pp_sched.c - pp-sched: print a pipeline schedule, simulate it, draw it; read a
   hand-written schedule table; rank the schedules for a model.

       pp-sched KIND -p P -m M [-v V] [--f F] [--b B] [--w W] [--comm C] [--b-free X] [--width W]
                [--trace FILE.json] [--table] [--eval]
       pp-sched load FILE [--f F] [--b B] [--w W] [--comm C] [--width W] [--trace FILE.json] [--eval]
       pp-sched rank -p P -m M (--layers N | --costs LIST | --costs @FILE) [--f F --b B --w W]
                [--comm C] [--mem-cap X] [--recompute]

   KIND is gpipe, 1f1b, interleaved or interleaved-mem (v >= 2 chunks per rank), zb-h1, zb-h2,
   zb-v, v-half, v-min or dualpipev. The zero-bubble kinds but zb-h1 are generated for the costs
   given (--f --b --w --comm, pp_schedule_make_cost; dualpipev: its own order, polished for them);
   the others are fixed patterns. Prints the parameters, every rank's action list as a table, an ASCII timeline, the makespan, the
   simulated bubble next to the closed form where there is one, and each rank's peak of stashed
   activations. --table prints only the table, in the format `load` (and pp_schedule_parse)
   reads back: edit it by hand and load it. --eval takes the schedule's forward-only list instead
   (what an evaluation runs, pp_schedule_make_eval). --trace writes Chrome trace JSON
   (ui.perfetto.dev, chrome://tracing).
   Costs are per action of one chunk, in arbitrary units: f forward, b input gradient, w weight
   gradient (defaults 1, 1, 1); a schedule without W actions runs b + w in its B.
   `rank` answers "which schedule should I use?": per-layer costs (N equal layers of f/b/w, or a
   list "f:b:w[:mem],..." or a file of lines "f b w [mem]"; mem is the layer's stashed
   activation per micro-batch, default 1), p ranks and m micro-batches; every schedule is
   partitioned (min-max over f+b+w), simulated, and ranked by step time among those whose peak
   stash per rank fits --mem-cap, then by peak memory. With --mem-cap (or --recompute; not with
   --no-recompute) the schedule, the
   partition and the layers to recompute are chosen together (pp_plan_recompute): a layer's
   entry "f:b:w:mem:out" also says which part of mem is its output (what recomputing it keeps
   unless the next layer is recomputed too), and the table shows every kind without and with
   every layer recomputed next to the plan.
   Exit status: 0 ok, 1 the schedule failed (invalid parameters, malformed table, deadlock),
   2 bad command line.

   Build: cc -std=c99 -O2 -I. tools/pp_sched.c -o pp-sched -lpthread -lm */
#define PIPELINE_IMPLEMENTATION
#include "pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE* f) {
    fprintf(f,
            "usage: pp-sched KIND -p P -m M [-v V] [--f F] [--b B] [--w W] [--comm C] [--b-free X] [--width W]\n"
            "                [--trace FILE.json] [--table] [--eval]\n"
            "       pp-sched load FILE [--f F] [--b B] [--w W] [--comm C] [--width W] [--trace FILE.json] [--eval]\n"
            "       pp-sched rank -p P -m M (--layers N | --costs LIST | --costs @FILE) [--f F --b B --w W]\n"
            "                [--comm C] [--mem-cap X] [--recompute | --no-recompute]\n"
            "  KIND        gpipe | 1f1b | interleaved | interleaved-mem | zb-h1 | zb-h2 | zb-v | v-half | v-min |\n"
            "              dualpipev\n"
            "  -p P        ranks\n"
            "  -m M        micro-batches\n"
            "  -v V        chunks per rank (interleaved, interleaved-mem >= 2, default 2; zb-v, v-half, v-min,\n"
            "              dualpipev 2; others 1)\n"
            "  --f F       forward time of one chunk (default 1)\n"
            "  --b B       input-gradient time of one chunk (default 1)\n"
            "  --w W       weight-gradient time of one chunk (default 1; without W actions B costs b+w)\n"
            "  --comm C    time of one transfer between ranks (default 0)\n"
            "  --b-free X  share of a stash its B frees, W needs the rest (0 .. 1, default 0: W needs it all);\n"
            "              the simulator's peak mem and the zero-bubble generators count with it\n"
            "  --width W   timeline columns (default: wide enough to label the shortest action,\n"
            "              at most 240)\n"
            "  --trace F   also write a Chrome trace (1 cost unit = 1 ms)\n"
            "  --table     print only the schedule as a text table (what `load` reads)\n"
            "  --eval      the schedule's forward-only list (an evaluation's: F actions only)\n"
            "  load FILE   read a schedule table (see pipeline.h, pp_schedule_parse), prove and draw it\n"
            "  rank        rank every schedule for a model: --layers N equal layers (costs --f/--b/--w),\n"
            "              or --costs \"f:b:w[:mem],...\" per layer, or --costs @FILE (lines \"f b w [mem]\");\n"
            "              --mem-cap X: most stashed activation (sum of mem) a rank may hold;\n"
            "              --recompute (the default with --mem-cap; --no-recompute: the ranked table\n"
            "              alone): choose the schedule, the partition and the layers to recompute\n"
            "              together (pp_plan_recompute; \":out\" after mem: the layer's output within mem,\n"
            "              default mem, then \":bonly\": the part only B reads, default 0; a stage's input\n"
            "              counts too), next to every kind without and with every layer recomputed\n");
}

static int parse_int(const char* s, int* out) {
    char* end;
    long v;
    if (!s || !*s) return 0;
    v = strtol(s, &end, 10);
    if (*end || v < -2147483647L || v > 2147483647L) return 0;
    *out = (int)v;
    return 1;
}

static int parse_cost(const char* s, double* out) {
    char* end;
    double v;
    if (!s || !*s) return 0;
    v = strtod(s, &end);
    if (*end || !(v >= 0) || v > 1e300) return 0;
    *out = v;
    return 1;
}

static char* read_file(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    char* buf = NULL;
    size_t cap = 0, n = 0, got;
    if (!f) return NULL;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char* nb;
            cap = (n + 4096 + 1) * 2;
            nb = (char*)realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- rank: which schedule should I use? ------------------------------------------------------ */

typedef pp_layer_cost layer_cost; /* f, b, w, mem, out, bonly */

/* "f:b:w[:mem[:out[:bonly]]],..." or the text of a file, "f b w [mem [out [bonly]]]" per line
   (out, the layer's output within mem, defaults to mem; bonly, the part only B reads, to 0).
   Returns the layer count. */
static int parse_layers(const char* s, layer_cost* out, int cap) {
    int n = 0;
    while (*s) {
        double v[6] = {0, 0, 0, 1, -1, 0};
        int k = 0;
        char* end;
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == ',') s++;
        if (!*s) break;
        if (*s == '#') {
            while (*s && *s != '\n') s++;
            continue;
        }
        for (k = 0; k < 6; k++) {
            double x = strtod(s, &end);
            if (end == s) break;
            if (!(x >= 0) || x > 1e300) return -1;
            v[k] = x;
            s = end;
            if (*s == ':' || *s == ' ' || *s == '\t') s++;
            else {
                k++;
                break;
            }
        }
        if (k < 3 || n >= cap) return -1;
        out[n].f = v[0];
        out[n].b = v[1];
        out[n].w = v[2];
        out[n].mem = v[3];
        out[n].out = v[4] < 0 ? v[3] : v[4];
        out[n].bonly = v[5];
        if (out[n].out + out[n].bonly > out[n].mem) return -1;
        n++;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s && *s != ',' && *s != '\n') return -1;
    }
    return n;
}

typedef struct candidate {
    pp_schedule_kind kind;
    int v, ok;
    int few_layers;             /* not ok because the model has fewer layers than the kind's stages */
    double makespan, bubble, peak_mem;
    char why[sizeof(((pp_error*)0)->msg)];
} candidate;

/* Stash memory a rank holds at its worst: walk its list, + mem at F, - at B (W when the
   schedule has W actions): the simulator's peak_live weighted by the stage's activation. */
static double peak_memory(const pp_schedule* s, const double* stage_mem) {
    int r, i, has_w = pp_schedule_has_w(s);
    double worst = 0;
    for (r = 0; r < s->p; r++) {
        const pp_action* a = pp_schedule_rank(s, r);
        double live = 0;
        for (i = 0; i < s->per_rank; i++) {
            if (a[i].op == PP_OP_F) live += stage_mem[a[i].stage];
            else if (a[i].op == (has_w ? PP_OP_W : PP_OP_B)) live -= stage_mem[a[i].stage];
            if (live > worst) worst = live;
        }
    }
    return worst;
}

static void try_candidate(candidate* c, const layer_cost* lc, int L, int p, int m, double comm) {
    int S = p * c->v, st, l, *first = NULL;
    double *wt = NULL, *fs = NULL, *bs = NULL, *ws = NULL, *ms = NULL;
    size_t n = pp_schedule_size(c->kind, p, c->v, m);
    pp_action* acts = NULL;
    pp_schedule s;
    pp_sim_cost cost;
    pp_sim_result res;
    pp_error err;
    c->ok = 0;
    if (n == 0) { /* no such schedule: the generator says why (before p * v is used) */
        pp_action one;
        if (pp_schedule_make(c->kind, p, c->v, m, &one, 0, &s, &err) != PP_OK) snprintf(c->why, sizeof c->why, "%s", err.msg);
        else snprintf(c->why, sizeof c->why, "no schedule at p=%d v=%d m=%d", p, c->v, m);
        return;
    }
    if (L < S) {
        snprintf(c->why, sizeof c->why, "needs %d stages, the model has %d layers", S, L);
        c->few_layers = 1;
        return;
    }
    first = (int*)calloc((size_t)S + 1, sizeof *first);
    wt = (double*)calloc((size_t)L, sizeof *wt);
    fs = (double*)calloc((size_t)S, sizeof *fs);
    bs = (double*)calloc((size_t)S, sizeof *bs);
    ws = (double*)calloc((size_t)S, sizeof *ws);
    ms = (double*)calloc((size_t)S, sizeof *ms);
    acts = (pp_action*)calloc(n ? n : 1, sizeof *acts);
    if (!first || !wt || !fs || !bs || !ws || !ms || !acts) {
        snprintf(c->why, sizeof c->why, "out of memory (%zu actions)", n);
        goto done;
    }
    for (l = 0; l < L; l++) wt[l] = lc[l].f + lc[l].b + lc[l].w;
    if (pp_partition_balanced(wt, L, S, first, &err) != PP_OK) {
        snprintf(c->why, sizeof c->why, "%s", err.msg);
        goto done;
    }
    for (st = 0; st < S; st++)
        for (l = first[st]; l < first[st + 1]; l++) {
            fs[st] += lc[l].f;
            bs[st] += lc[l].b;
            ws[st] += lc[l].w;
            ms[st] += lc[l].mem;
        }
    memset(&cost, 0, sizeof cost);
    cost.f_stage = fs;
    cost.b_stage = bs;
    cost.w_stage = ws;
    cost.comm = comm;
    cost.f = cost.b = cost.w = 1; /* unused: the per-stage arrays win */
    /* generated for these stage costs (the cost-aware kinds), then simulated with them */
    if (pp_schedule_make_cost(c->kind, p, c->v, m, &cost, acts, n, &s, &err) != PP_OK ||
        pp_simulate(&s, &cost, &res, NULL, &err) != PP_OK) {
        snprintf(c->why, sizeof c->why, "%s", err.msg);
        goto done;
    }
    c->makespan = res.makespan;
    c->bubble = res.bubble;
    c->peak_mem = peak_memory(&s, ms);
    c->ok = 1;
done:
    free(first);
    free(wt);
    free(fs);
    free(bs);
    free(ws);
    free(ms);
    free(acts);
}

static int rank_schedules(int p, int m, const layer_cost* lc, int L, double comm, double mem_cap) {
    candidate c[16];
    int n = 0, i, j, order[16], best = -1;
    double base = 0;
    /* every kind (the interleaved ones at two depths) */
    const struct { pp_schedule_kind k; int v; } list[] = {
        {PP_SCHED_GPIPE, 1},           {PP_SCHED_1F1B, 1},           {PP_SCHED_INTERLEAVED, 2}, {PP_SCHED_INTERLEAVED, 4},
        {PP_SCHED_INTERLEAVED_MEM, 2}, {PP_SCHED_INTERLEAVED_MEM, 4}, {PP_SCHED_ZB_H1, 1},       {PP_SCHED_ZB_H2, 1},
        {PP_SCHED_ZB_V, 2},            {PP_SCHED_V_HALF, 2},          {PP_SCHED_V_MIN, 2},       {PP_SCHED_DUALPIPE_V, 2}};
    for (i = 0; i < (int)(sizeof list / sizeof list[0]); i++) {
        memset(&c[n], 0, sizeof c[n]);
        c[n].kind = list[i].k;
        c[n].v = list[i].v;
        try_candidate(&c[n], lc, L, p, m, comm);
        if (c[n].kind == PP_SCHED_1F1B && c[n].ok) base = c[n].makespan;
        order[n] = n;
        n++;
    }
    /* fits the cap first, then step time, then memory (insertion sort: a dozen entries) */
    for (i = 1; i < n; i++)
        for (j = i; j > 0; j--) {
            const candidate *a = &c[order[j - 1]], *b = &c[order[j]];
            int fa = a->ok && (mem_cap <= 0 || a->peak_mem <= mem_cap), fb = b->ok && (mem_cap <= 0 || b->peak_mem <= mem_cap);
            int swap = fb > fa || (fb == fa && fa &&
                                   (b->makespan < a->makespan - 1e-12 ||
                                    (fabs(b->makespan - a->makespan) <= 1e-12 && b->peak_mem < a->peak_mem)));
            if (swap) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        }
    {
        double F = 0, B = 0, W = 0;
        for (i = 0; i < L; i++) F += lc[i].f, B += lc[i].b, W += lc[i].w;
        printf("model      %d layers, per micro-batch f=%g b=%g w=%g; p=%d m=%d comm=%g", L, F, B, W, p, m, comm);
    }
    if (mem_cap > 0) printf(" mem-cap=%g", mem_cap);
    printf("\n\n  #  schedule         v  step time  vs 1f1b  bubble  peak stash  fits\n");
    for (i = 0; i < n; i++) {
        const candidate* x = &c[order[i]];
        int fits = x->ok && (mem_cap <= 0 || x->peak_mem <= mem_cap);
        if (!x->ok) {
            printf("  -  %-15s %2d  (%s)\n", pp_schedule_name(x->kind), x->v, x->why);
            continue;
        }
        printf(" %2d  %-15s %2d  %9.4g  %6.3fx  %6.3f  %10.4g  %s\n", i + 1, pp_schedule_name(x->kind), x->v, x->makespan,
               base > 0 ? x->makespan / base : 0.0, x->bubble, x->peak_mem, fits ? "yes" : "NO");
        if (fits && best < 0) best = order[i];
    }
    if (best < 0) {
        int any_ok = 0, all_layers = 1, fail = -1;
        for (i = 0; i < n; i++) {
            any_ok |= c[i].ok;
            all_layers &= !c[i].ok && c[i].few_layers;
            if (!c[i].ok && !c[i].few_layers && fail < 0) fail = i;
        }
        /* the verdict names what stopped every kind: the cap only where one was given and some ran */
        if (any_ok && mem_cap > 0)
            printf("\nanswer     no schedule fits mem-cap %g: raise it, use more ranks, or fewer micro-batches in flight\n",
                   mem_cap);
        else if (all_layers)
            printf("\nanswer     no schedule: p=%d ranks need at least %d stages, the model has %d layer%s: use at most %d "
                   "rank%s, or more layers\n", p, p, L, L == 1 ? "" : "s", L, L == 1 ? "" : "s");
        else if (fail >= 0)
            printf("\nanswer     no schedule: no kind could be made or simulated (%s %d: %s)\n", pp_schedule_name(c[fail].kind),
                   c[fail].v, c[fail].why);
        else
            printf("\nanswer     no schedule\n");
        return 1;
    }
    printf("\nanswer     %s (v=%d): step time %.4g, %.3fx of 1f1b's, peak stash %.4g per rank\n",
           pp_schedule_name(c[best].kind), c[best].v, c[best].makespan, base > 0 ? c[best].makespan / base : 0.0,
           c[best].peak_mem);
    return 0;
}

/* rank --recompute: every kind without and with recomputing every layer (the hand choices), then
   pp_plan_recompute's plan (schedule, partition and recomputed layers chosen together). */
static void print_flags(const unsigned char* rc, int L) {
    int l, run, any = 0;
    for (l = 0; l < L; l = run) {
        for (run = l + 1; rc[l] && run < L && rc[run]; run++) {}
        if (!rc[l]) continue;
        printf("%s%d", any++ ? "," : "", l);
        if (run - l > 1) printf("-%d", run - 1);
    }
    if (!any) printf("none");
}

static int plan_rank(int p, int m, const layer_cost* lc, int L, double comm, double mem_cap) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_GPIPE, PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_INTERLEAVED,
                                             PP_SCHED_INTERLEAVED_MEM, PP_SCHED_INTERLEAVED_MEM, PP_SCHED_ZB_H1,
                                             PP_SCHED_ZB_H2, PP_SCHED_ZB_V, PP_SCHED_V_HALF, PP_SCHED_V_MIN,
                                             PP_SCHED_DUALPIPE_V};
    static const int kv[] = {1, 1, 2, 4, 2, 4, 1, 1, 2, 2, 2, 2};
    pp_plan_desc d;
    pp_plan pl, hand, best_hand;
    pp_error err;
    unsigned char* rc = (unsigned char*)calloc((size_t)L, 1);
    int k, all, first[4 * PP_MAX_RANKS + 1], st, hk = -1, ha = 0;
    if (!rc) return 1;
    memset(&d, 0, sizeof d);
    memset(&best_hand, 0, sizeof best_hand);
    d.layers = lc, d.n_layers = L, d.p = p, d.m = m, d.comm = comm, d.mem_cap = mem_cap;
    printf("model      %d layers; p=%d m=%d comm=%g", L, p, m, comm);
    if (mem_cap > 0) printf(" mem-cap=%g", mem_cap);
    printf("\n\nhand choices: every kind, nothing or every layer recomputed\n");
    printf("  schedule         v  recompute  step time  peak stash  fits\n");
    for (k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
        for (all = 0; all < 2; all++) {
            memset(rc, all, (size_t)L);
            if (pp_plan_try(&d, kinds[k], kv[k], rc, &hand, NULL, &err) != PP_OK) {
                if (!all) printf("  %-15s %2d  (%s)\n", pp_schedule_name(kinds[k]), kv[k], err.msg);
                continue;
            }
            printf("  %-15s %2d  %-9s  %9.4g  %10.4g  %s\n", pp_schedule_name(kinds[k]), hand.v, all ? "all" : "none",
                   hand.makespan, hand.peak_mem, hand.fits ? "yes" : "NO");
            if (hand.fits && (hk < 0 || hand.makespan < best_hand.makespan)) best_hand = hand, hk = k, ha = all;
        }
    if (pp_plan_recompute(&d, &pl, first, rc, &err) != PP_OK) {
        printf("\nplan       failed: %s\n", err.msg);
        free(rc);
        return 1;
    }
    printf("\nplan       %s (v=%d), %d plans simulated: step time %.4g, peak stash %.4g per rank%s\n",
           pp_schedule_name(pl.kind), pl.v, pl.tried, pl.makespan, pl.peak_mem, pl.fits ? "" : " (over the cap)");
    printf("           recompute %d of %d layers: ", pl.n_recompute, L);
    print_flags(rc, L);
    printf("\n           partition first[] =");
    for (st = 0; st <= p * pl.v; st++) printf(" %d", first[st]);
    printf("\n");
    if (hk >= 0)
        printf("answer     %s (v=%d), recompute %d layers: %.4fx the step time of the best hand choice, %s (v=%d) "
               "recomputing %s (%.4g)\n",
               pp_schedule_name(pl.kind), pl.v, pl.n_recompute, pl.makespan / best_hand.makespan,
               pp_schedule_name(best_hand.kind), best_hand.v, ha ? "every layer" : "nothing", best_hand.makespan);
    else if (pl.fits)
        printf("answer     %s (v=%d), recompute %d layers: no hand choice fits the cap\n", pp_schedule_name(pl.kind), pl.v,
               pl.n_recompute);
    else
        printf("answer     nothing fits mem-cap %g: raise it, use more ranks, or fewer micro-batches in flight\n", mem_cap);
    free(rc);
    return pl.fits ? 0 : 1;
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char** argv) {
    pp_schedule_kind kind = PP_SCHED_1F1B;
    int p = 0, m = 0, v = 0, width = 0, i, r, rc = 1, have_p = 0, have_m = 0, table_only = 0, eval_only = 0, n_layers = 0;
    int mode_load = 0, mode_rank = 0, argi = 2, recompute = -1; /* -1: with --mem-cap */
    double f = 1, b = 1, w = 1, comm = 0, theory = -1, min_cost, mem_cap = 0, b_free = 0;
    const char *trace = NULL, *load = NULL, *costs = NULL;
    char* text = NULL;
    pp_action* acts = NULL;
    pp_event* ev = NULL;
    pp_schedule s;
    pp_sim_cost cost;
    pp_sim_result res;
    pp_error err;
    pp_result pr;
    size_t n = 0;

    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "load")) {
        mode_load = 1;
        if (argc < 3) {
            fprintf(stderr, "pp-sched: load needs a FILE\n");
            return 2;
        }
        load = argv[2];
        argi = 3;
    } else if (!strcmp(argv[1], "rank")) {
        mode_rank = 1;
    } else if (pp_schedule_kind_parse(argv[1], &kind) != PP_OK) {
        fprintf(stderr,
                "pp-sched: unknown schedule kind '%s' (gpipe, 1f1b, interleaved, interleaved-mem, zb-h1, zb-h2, zb-v, "
                "v-half, v-min, dualpipev, load, rank)\n",
                argv[1]);
        return 2;
    }
    for (i = argi; i < argc; i++) {
        /* "--opt value" and "--opt=value" both work */
        const char* arg = argv[i];
        const char* opt = arg;
        const char* val = NULL;
        char name[32];
        const char* eq = strncmp(opt, "--", 2) == 0 ? strchr(opt, '=') : NULL;
        int ok;
        if (!strcmp(opt, "--table")) {
            table_only = 1;
            continue;
        }
        if (!strcmp(opt, "--eval")) {
            eval_only = 1;
            continue;
        }
        if (!strcmp(opt, "--recompute") || !strcmp(opt, "--no-recompute")) {
            recompute = opt[2] == 'r';
            continue;
        }
        if (eq) {
            size_t len = (size_t)(eq - opt);
            if (len >= sizeof name) len = sizeof name - 1;
            memcpy(name, opt, len);
            name[len] = 0;
            opt = name;
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        }
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help")) { usage(stdout); return 0; }
        if (!strcmp(opt, "-p")) ok = have_p = parse_int(val, &p);
        else if (!strcmp(opt, "-m")) ok = have_m = parse_int(val, &m);
        else if (!strcmp(opt, "-v")) ok = parse_int(val, &v);
        else if (!strcmp(opt, "--width")) ok = parse_int(val, &width) && width > 0;
        else if (!strcmp(opt, "--f")) ok = parse_cost(val, &f) && f > 0;
        else if (!strcmp(opt, "--b")) ok = parse_cost(val, &b) && b > 0;
        else if (!strcmp(opt, "--w")) ok = parse_cost(val, &w);
        else if (!strcmp(opt, "--comm")) ok = parse_cost(val, &comm);
        else if (!strcmp(opt, "--mem-cap")) ok = parse_cost(val, &mem_cap);
        else if (!strcmp(opt, "--b-free")) ok = parse_cost(val, &b_free) && b_free <= 1;
        else if (!strcmp(opt, "--layers")) ok = parse_int(val, &n_layers) && n_layers > 0 && n_layers <= 100000;
        else if (!strcmp(opt, "--costs")) ok = (costs = val) != NULL && *val;
        else if (!strcmp(opt, "--trace")) ok = (trace = val) != NULL && *val;
        else {
            fprintf(stderr, "pp-sched: unknown option '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            const char* want = "an integer";
            if (!strcmp(opt, "--trace")) want = "a file name";
            else if (!strcmp(opt, "--costs")) want = "a list or @file";
            else if (!strcmp(opt, "--width") || !strcmp(opt, "--layers")) want = "a positive integer";
            else if (!strcmp(opt, "--comm") || !strcmp(opt, "--w") || !strcmp(opt, "--mem-cap")) want = "a number >= 0";
            else if (!strcmp(opt, "--b-free")) want = "a number from 0 to 1";
            else if (opt[1] == '-') want = "a number > 0";
            fprintf(stderr, "pp-sched: option %s needs %s, got '%s'\n", opt, want, val ? val : "(nothing)");
            return 2;
        }
    }
    memset(&err, 0, sizeof err);

    if (mode_rank) {
        layer_cost* lc;
        int L;
        if (!have_p || !have_m || (!n_layers && !costs) || (n_layers && costs)) {
            fprintf(stderr, "pp-sched: rank needs -p, -m and one of --layers or --costs\n");
            return 2;
        }
        if (p < 1 || p > PP_MAX_RANKS || m < 1) {
            fprintf(stderr, "pp-sched: rank needs 1 <= p <= %d and m >= 1\n", (int)PP_MAX_RANKS);
            return 2;
        }
        lc = (layer_cost*)calloc(100000, sizeof *lc);
        if (!lc) return 1;
        if (n_layers) {
            for (L = 0; L < n_layers; L++) lc[L].f = f, lc[L].b = b, lc[L].w = w, lc[L].mem = lc[L].out = 1;
        } else {
            size_t len;
            char* src = costs[0] == '@' ? read_file(costs + 1, &len) : NULL;
            if (costs[0] == '@' && !src) {
                fprintf(stderr, "pp-sched: cannot read %s\n", costs + 1);
                free(lc);
                return 2;
            }
            L = parse_layers(src ? src : costs, lc, 100000);
            free(src);
            if (L <= 0) {
                fprintf(stderr, "pp-sched: --costs wants \"f:b:w[:mem[:out[:bonly]]],...\" (numbers >= 0, out + bonly <= mem), "
                        "or @FILE with lines \"f b w [mem [out [bonly]]]\"\n");
                free(lc);
                return 2;
            }
        }
        if (recompute < 0) recompute = mem_cap > 0;
        rc = recompute ? plan_rank(p, m, lc, L, comm, mem_cap) : rank_schedules(p, m, lc, L, comm, mem_cap);
        free(lc);
        return rc;
    }

    /* the cost model: what the cost-aware kinds are generated for, and what the simulator runs */
    memset(&cost, 0, sizeof cost);
    cost.f = f;
    cost.b = b;
    cost.w = w;
    cost.comm = comm;
    cost.b_free = b_free;
    if (mode_load) {
        size_t len = 0;
        text = read_file(load, &len);
        if (!text) {
            fprintf(stderr, "pp-sched: cannot read %s\n", load);
            return 2;
        }
        pr = pp_schedule_parse(text, len, NULL, 0, &n, &s, &err);
        if (pr == PP_ERR_SIZE) { /* the syntax is right: room for the actions, then the whole check */
            acts = (pp_action*)malloc((n ? n : 1) * sizeof *acts);
            if (!acts) {
                fprintf(stderr, "pp-sched: %s: out of memory for %zu actions\n", load, n);
                goto done;
            }
            pr = pp_schedule_parse(text, len, acts, n, &n, &s, &err);
        }
        if (pr != PP_OK) {
            fprintf(stderr, "pp-sched: %s: %s\n", load, err.msg);
            goto done;
        }
        p = s.p, v = s.v, m = s.m, kind = PP_SCHED_CUSTOM;
    } else {
        if (!have_p || !have_m) {
            fprintf(stderr, "pp-sched: -p and -m are required\n");
            usage(stderr);
            return 2;
        }
        if (v == 0) v = pp_schedule_size(kind, p, 1, m) ? 1 : 2;
        n = pp_schedule_size(kind, p, v, m);
        acts = (pp_action*)malloc((n ? n : 1) * sizeof *acts);
        if (!acts) {
            fprintf(stderr, "pp-sched: out of memory\n");
            goto done;
        }
        /* generated for the costs given (the zero-bubble kinds); pp_schedule_make_cost validates
           (n == 0 for bad parameters) and says why */
        pr = pp_schedule_make_cost(kind, p, v, m, &cost, acts, n, &s, &err);
        if (pr != PP_OK) {
            fprintf(stderr, "pp-sched: %s\n", err.msg);
            goto done;
        }
    }
    if (eval_only && !s.forward_only) { /* the forward-only list of the schedule */
        size_t ne = pp_schedule_eval_size(&s);
        pp_action* ea = (pp_action*)malloc((ne ? ne : 1) * sizeof *ea);
        pp_schedule es;
        if (!ea || pp_schedule_make_eval(&s, ea, ne, &es, &err) != PP_OK) {
            fprintf(stderr, "pp-sched: %s\n", ea ? err.msg : "out of memory");
            free(ea);
            goto done;
        }
        free(acts);
        acts = ea;
        s = es;
        n = ne;
    }
    if (table_only) {
        pp_schedule_write(stdout, &s);
        rc = 0;
        goto done;
    }
    ev = (pp_event*)malloc((n ? n : 1) * sizeof *ev);
    if (!ev) {
        fprintf(stderr, "pp-sched: out of memory\n");
        goto done;
    }

    pr = pp_simulate(&s, &cost, &res, ev, &err);

    printf("schedule   %s  p=%d v=%d m=%d  (%d stages, %d actions per rank%s)\n", pp_schedule_name(kind), p, v, m,
           s.n_stages, s.per_rank, s.map == PP_MAP_V ? ", V map: rank r holds stages r and 2p-1-r" : "");
    printf("cost       f=%g b=%g w=%g comm=%g per chunk%s\n", f, b, w, comm,
           pp_schedule_has_w(&s) || s.forward_only ? "" : " (no W actions: B costs b+w)");
    printf("table\n");
    pp_schedule_write(stdout, &s);
    if (pr != PP_OK) {
        fprintf(stderr, "pp-sched: %s\n", err.msg);
        goto done;
    }

    if (width == 0) {
        /* enough columns for the shortest action to show "F<mb>[.<chunk>]" */
        int digits = 1, label;
        for (i = m - 1; i >= 10; i /= 10) digits++;
        label = 1 + digits + (v > 1 ? 2 : 0);
        min_cost = f < b ? f : b;
        if (pp_schedule_has_w(&s) && w > 0 && w < min_cost) min_cost = w;
        width = (int)ceil(res.makespan / min_cost * label);
        if (width > 240) width = 240;
        if (width < 20) width = 20;
    }
    printf("timeline\n");
    pp_timeline_ascii(stdout, ev, n, p, width);

    printf("makespan   %g\n", res.makespan);
    if (s.forward_only) kind = PP_SCHED_CUSTOM; /* no closed form below: the simulated bubble */
    if (kind == PP_SCHED_INTERLEAVED || (kind == PP_SCHED_INTERLEAVED_MEM && m % p == 0)) theory = (double)(p - 1) / (double)(v * m + p - 1);
    else if (kind == PP_SCHED_GPIPE || kind == PP_SCHED_1F1B) theory = (double)(p - 1) / (double)(m + p - 1);
    else if (kind == PP_SCHED_ZB_H1) theory = (double)(p - 1) / (double)(3 * m + p - 1);
    if (theory >= 0)
        printf("bubble     %.4f simulated, %.4f theory %s%s\n", res.bubble, theory,
               kind == PP_SCHED_INTERLEAVED || kind == PP_SCHED_INTERLEAVED_MEM ? "(p-1)/(v*m+p-1)"
               : kind == PP_SCHED_ZB_H1     ? "(p-1)/(3m+p-1) with f = b = w"
                                            : "(p-1)/(m+p-1)",
               comm > 0                                               ? " (theory assumes comm = 0)"
               : kind == PP_SCHED_ZB_H1 && !(f == b && b == w)        ? " (theory assumes f = b = w)"
               : (kind == PP_SCHED_INTERLEAVED || kind == PP_SCHED_ZB_H1) && m < p ? " (theory assumes m >= p)"
                                                                      : "");
    else if (kind == PP_SCHED_CUSTOM)
        printf("bubble     %.4f simulated\n", res.bubble);
    else if (kind == PP_SCHED_INTERLEAVED_MEM)
        printf("bubble     %.4f simulated (p does not divide m: no closed form; stash cap %d chunks, interleaved's at "
               "m = %d)\n", res.bubble, pp_schedule_stash_cap(kind, p, v, m), (m + p - 1) / p * p);
    else
        printf("bubble     %.4f simulated (%s: generated for these costs, no closed form; stash cap %d %s)\n",
               res.bubble, pp_schedule_name(kind), pp_schedule_stash_cap(kind, p, v, m),
               kind == PP_SCHED_ZB_V     ? "chunks = 2*min(p,m), 1f1b's memory"
               : kind == PP_SCHED_ZB_H2  ? "stages = 2*min(p,m), twice 1f1b's"
               : kind == PP_SCHED_V_HALF ? "chunks = min(p,m)+2, half of 1f1b's + 2 chunks"
               : kind == PP_SCHED_V_MIN  ? "chunks = 2*floor((min(p,m)+1)/3)+2, a third of 1f1b's + 2 chunks"
               : kind == PP_SCHED_DUALPIPE_V ? "chunks = min(2p+1, 2m), 1f1b's + 1 chunk"
                                         : "");
    printf("peak live ");
    for (r = 0; r < p; r++) printf(" r%d=%d", r, res.peak_live[r]);
    printf("  (activations stashed at once%s)\n", s.forward_only ? ", each for its F (to the next F at a turn)"
                                                 : pp_schedule_has_w(&s) ? ", F to W" : "");
    if (b_free > 0) {
        printf("peak mem  ");
        for (r = 0; r < p; r++) printf(" r%d=%.3g", r, res.peak_mem[r]);
        printf("  (stashes, B frees %g of each, W the rest)\n", b_free);
    }

    if (trace) {
        FILE* tf = fopen(trace, "w");
        if (!tf) {
            fprintf(stderr, "pp-sched: cannot write %s\n", trace);
            goto done;
        }
        pp_timeline_chrome(tf, ev, n, 1000.0); /* 1 cost unit = 1 ms */
        if (fclose(tf) != 0) {
            fprintf(stderr, "pp-sched: cannot write %s\n", trace);
            goto done;
        }
        printf("trace      %s (open in ui.perfetto.dev)\n", trace);
    }
    rc = 0;
done:
    free(text);
    free(acts);
    free(ev);
    return rc;
}
