/* tools/pp_sched.c - pp-sched: print a pipeline schedule, simulate it, draw it.

       pp-sched KIND -p P -m M [-v V] [--f F] [--b B] [--comm C] [--width W] [--trace FILE.json]

   KIND is gpipe, 1f1b or interleaved (v >= 2 chunks per rank). Prints the parameters, every
   rank's action list, an ASCII timeline, the makespan, the simulated bubble next to the
   closed-form one, and each rank's peak of stashed activations. --trace writes Chrome trace
   JSON (ui.perfetto.dev, chrome://tracing). Costs are per action of one chunk, in arbitrary
   units (defaults f=1, b=2, comm=0). Exit status: 0 ok, 1 the schedule failed (invalid
   parameters, deadlock), 2 bad command line.

   Build: cc -std=c99 -O2 -I. tools/pp_sched.c -o pp-sched -lpthread -lm */
#define PIPELINE_IMPLEMENTATION
#include "pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE* f) {
    fprintf(f,
            "usage: pp-sched KIND -p P -m M [-v V] [--f F] [--b B] [--comm C] [--width W]\n"
            "                [--trace FILE.json]\n"
            "  KIND        gpipe | 1f1b | interleaved\n"
            "  -p P        ranks (pipeline stages per chunk)\n"
            "  -m M        micro-batches\n"
            "  -v V        chunks per rank (interleaved only, >= 2; default 1, or 2 for interleaved)\n"
            "  --f F       forward time of one chunk (default 1)\n"
            "  --b B       backward time of one chunk (default 2)\n"
            "  --comm C    time of one transfer between ranks (default 0)\n"
            "  --width W   timeline columns (default: wide enough to label the shortest action,\n"
            "              at most 240)\n"
            "  --trace F   also write a Chrome trace (1 cost unit = 1 ms)\n");
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

/* Prints rank r's list: "r0: F0 F1 B0 ..." with ".chunk" when there is more than one. */
static void print_list(const pp_schedule* s, int r) {
    const pp_action* a = pp_schedule_rank(s, r);
    int i;
    printf("  r%d:", r);
    for (i = 0; i < s->per_rank; i++) {
        char op = a[i].op == PP_OP_F ? 'F' : a[i].op == PP_OP_B ? 'B' : 'W';
        if (s->v > 1) printf(" %c%d.%d", op, (int)a[i].mb, (int)a[i].chunk);
        else printf(" %c%d", op, (int)a[i].mb);
    }
    printf("\n");
}

int main(int argc, char** argv) {
    pp_schedule_kind kind;
    int p = 0, m = 0, v = 0, width = 0, i, r, rc = 1, have_p = 0, have_m = 0;
    double f = 1, b = 2, comm = 0, theory, min_cost;
    const char* trace = NULL;
    pp_action* acts = NULL;
    pp_event* ev = NULL;
    pp_schedule s;
    pp_sim_cost cost;
    pp_sim_result res;
    pp_error err;
    pp_result pr;
    size_t n;

    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (pp_schedule_kind_parse(argv[1], &kind) != PP_OK) {
        fprintf(stderr, "pp-sched: unknown schedule kind '%s' (gpipe, 1f1b, interleaved)\n", argv[1]);
        return 2;
    }
    for (i = 2; i < argc; i++) {
        /* "--opt value" and "--opt=value" both work */
        const char* arg = argv[i];
        const char* opt = arg;
        const char* val = NULL;
        char name[32];
        const char* eq = strncmp(opt, "--", 2) == 0 ? strchr(opt, '=') : NULL;
        int ok;
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
        else if (!strcmp(opt, "--comm")) ok = parse_cost(val, &comm);
        else if (!strcmp(opt, "--trace")) ok = (trace = val) != NULL && *val;
        else {
            fprintf(stderr, "pp-sched: unknown option '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            const char* want = "an integer";
            if (!strcmp(opt, "--trace")) want = "a file name";
            else if (!strcmp(opt, "--width")) want = "a positive integer";
            else if (!strcmp(opt, "--comm")) want = "a number >= 0";
            else if (opt[1] == '-') want = "a number > 0";
            fprintf(stderr, "pp-sched: option %s needs %s, got '%s'\n", opt, want,
                    val ? val : "(nothing)");
            return 2;
        }
    }
    if (!have_p || !have_m) {
        fprintf(stderr, "pp-sched: -p and -m are required\n");
        usage(stderr);
        return 2;
    }
    if (v == 0) v = kind == PP_SCHED_INTERLEAVED ? 2 : 1;

    memset(&err, 0, sizeof err);
    n = pp_schedule_size(kind, p, v, m);
    acts = (pp_action*)malloc((n ? n : 1) * sizeof *acts);
    ev = (pp_event*)malloc((n ? n : 1) * sizeof *ev);
    if (!acts || !ev) {
        fprintf(stderr, "pp-sched: out of memory\n");
        goto done;
    }
    /* pp_schedule_make validates (n == 0 for bad parameters) and says why */
    pr = pp_schedule_make(kind, p, v, m, acts, n, &s, &err);
    if (pr != PP_OK) {
        fprintf(stderr, "pp-sched: %s\n", err.msg);
        goto done;
    }

    memset(&cost, 0, sizeof cost);
    cost.f = f;
    cost.b = b;
    cost.comm = comm;
    pr = pp_simulate(&s, &cost, &res, ev, &err);

    printf("schedule   %s  p=%d v=%d m=%d  (%d stages, %d actions per rank)\n",
           pp_schedule_name(kind), p, v, m, s.n_stages, s.per_rank);
    printf("cost       f=%g b=%g comm=%g per chunk\n", f, b, comm);
    printf("lists\n");
    for (r = 0; r < p; r++) print_list(&s, r);
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
        width = (int)ceil(res.makespan / min_cost * label);
        if (width > 240) width = 240;
        if (width < 20) width = 20;
    }
    printf("timeline\n");
    pp_timeline_ascii(stdout, ev, n, p, width);

    theory = kind == PP_SCHED_INTERLEAVED ? (double)(p - 1) / (double)(v * m + p - 1)
                                          : (double)(p - 1) / (double)(m + p - 1);
    printf("makespan   %g\n", res.makespan);
    printf("bubble     %.4f simulated, %.4f theory %s%s\n", res.bubble, theory,
           kind == PP_SCHED_INTERLEAVED ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)",
           comm > 0 ? " (theory assumes comm = 0)"
           : kind == PP_SCHED_INTERLEAVED && m < p ? " (theory assumes m >= p)"
                                                     : "");
    printf("peak live ");
    for (r = 0; r < p; r++) printf(" r%d=%d", r, res.peak_live[r]);
    printf("  (activations stashed at once)\n");

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
    free(acts);
    free(ev);
    return rc;
}
