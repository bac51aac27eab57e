/* tests/fuzz/fuzz_sim.c - libFuzzer target: schedule generation and the simulator on random
   (kind, p, v, m, costs), then on the same lists with random edits (a hand-written table gone
   wrong). Built-in schedules must generate and simulate without deadlock, with a bubble in
   [0, 1], a makespan that bounds every rank's busy time and events that do not overlap; an
   edited list must come back OK or as PP_ERR_SCHEDULE/PP_ERR_DEADLOCK with a message. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../../pipeline.h"
#define FUZZ_NAME "fuzz_sim"
#include "fuzz.h"

#define MAX_ACTS 4096

static double pick_cost(uint32_t k) {
    static const double c[] = {0, 1, 2, 0.5, 3, 1e-3, 1e6, 0.25, 7, 0};
    if (k == 9) return -1;
    return c[k % 10];
}

static FILE* g_null;

static void check_result(const pp_schedule* s, const pp_sim_result* res, const pp_event* ev) {
    int r, i;
    FZ_CHECK(res->bubble >= -1e-9 && res->bubble <= 1, "bubble %g", res->bubble);
    for (r = 0; r < s->p; r++) {
        double last_end = 0;
        FZ_CHECK(res->busy[r] <= res->makespan * (1 + 1e-9) + 1e-12, "rank %d busy %g > makespan %g", r, res->busy[r],
                 res->makespan);
        FZ_CHECK(res->peak_live[r] >= 0 && res->peak_live[r] <= s->m * s->v, "rank %d peak %d", r, res->peak_live[r]);
        FZ_CHECK(res->peak_mem[r] >= -1e-9 && res->peak_mem[r] <= res->peak_live[r] + 1 + 1e-9, "rank %d peak_mem %g, peak %d",
                 r, res->peak_mem[r], res->peak_live[r]);
        for (i = 0; i < s->per_rank; i++) {
            const pp_event* e = &ev[(size_t)r * s->per_rank + i];
            FZ_CHECK(e->start >= last_end - 1e-9 * (1 + last_end) && e->end >= e->start,
                     "rank %d action %d: [%g, %g] after %g", r, i, e->start, e->end, last_end);
            last_end = e->end;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fz f = {data, size, 0};
    static pp_action acts[MAX_ACTS];
    static pp_event ev[MAX_ACTS];
    static double fst[64], bst[64], wst[64];
    pp_schedule s;
    pp_sim_cost cost;
    pp_sim_result res;
    pp_error err;
    pp_result rc;
    pp_schedule_kind kind = (pp_schedule_kind)(fz_u8(&f) % (PP_SCHED_KIND_COUNT + 1)); /* + one unknown */
    int p = 1 + (int)(fz_u8(&f) % 8), v = 1 + (int)(fz_u8(&f) % 4), m = 1 + (int)(fz_u8(&f) % 24), i, valid_cost = 1;
    size_t need = pp_schedule_size(kind, p, v, m);
    if (!g_null) g_null = fopen("/dev/null", "w");
    memset(&err, 0, sizeof err);
    memset(&cost, 0, sizeof cost);
    cost.f = pick_cost(fz_u8(&f));
    cost.b = pick_cost(fz_u8(&f));
    cost.w = pick_cost(fz_u8(&f));
    cost.comm = pick_cost(fz_u8(&f));
    if (fz_u8(&f) & 1) {
        for (i = 0; i < p * v && i < 64; i++) {
            fst[i] = pick_cost(fz_u8(&f));
            bst[i] = pick_cost(fz_u8(&f));
            wst[i] = pick_cost(fz_u8(&f));
        }
        cost.f_stage = fst;
        cost.b_stage = bst;
        cost.w_stage = wst;
        for (i = 0; i < p * v && i < 64; i++)
            if (fst[i] < 0 || bst[i] < 0 || wst[i] < 0) valid_cost = 0;
    }
    /* recomputation, from bytes already read (the corpus keeps its meaning): B takes f more, and
       0 to all of a stash goes between F and B */
    cost.r_f = m % 3 ? cost.f : 0;
    cost.r_mem = (m % 5) * 0.25;
    if (cost.f < 0 || cost.b < 0 || cost.w < 0 || cost.comm < 0) valid_cost = 0;
    rc = pp_schedule_make(kind, p, v, m, acts, MAX_ACTS, &s, &err);
    if (need == 0 || need > MAX_ACTS) {
        FZ_CHECK(rc != PP_OK && err.msg[0], "(%d, p %d, v %d, m %d) needs %zu actions but made: %s", (int)kind, p, v, m,
                 need, pp_result_str(rc));
        return 0;
    }
    FZ_CHECK(rc == PP_OK, "%s p %d v %d m %d: %s", pp_schedule_name(kind), p, v, m, err.msg);
    FZ_CHECK((size_t)s.p * (size_t)s.per_rank == need, "%d x %d actions, size said %zu", s.p, s.per_rank, need);
    rc = pp_simulate(&s, &cost, &res, ev, &err);
    if (!valid_cost) {
        FZ_CHECK(rc == PP_ERR_INVALID && err.msg[0], "negative cost accepted: %s", pp_result_str(rc));
        return 0;
    }
    FZ_CHECK(rc == PP_OK && !res.deadlock, "%s p %d v %d m %d: %s", pp_schedule_name(kind), p, v, m, err.msg);
    check_result(&s, &res, ev);
    if (g_null && (fz_u8(&f) & 7) == 0) pp_timeline_ascii(g_null, ev, need, p, 0);
    /* edits: swap two actions of a rank, or overwrite one field */
    while (fz_left(&f)) {
        uint32_t what = fz_u8(&f) % 6, r = fz_u8(&f) % (uint32_t)p, i1 = fz_u16(&f) % (uint32_t)s.per_rank,
                 i2 = fz_u16(&f) % (uint32_t)s.per_rank, val = fz_u8(&f);
        pp_action* a = &acts[r * (uint32_t)s.per_rank + i1];
        pp_action tmp;
        switch (what) {
        case 0:
        case 1:
            tmp = *a;
            *a = acts[r * (uint32_t)s.per_rank + i2];
            acts[r * (uint32_t)s.per_rank + i2] = tmp;
            break;
        case 2: a->op = (int8_t)(val % 4); break; /* 3: not an op */
        case 3: a->mb = (int32_t)(val % (uint32_t)(m + 2)) - 1; break;
        case 4: a->stage = (int16_t)((int)(val % (uint32_t)(p * v + 2)) - 1); break;
        default: a->chunk = (int8_t)(val % (uint32_t)(v + 1)); break;
        }
    }
    memset(&err, 0, sizeof err);
    rc = pp_simulate(&s, &cost, &res, ev, &err);
    if (rc == PP_OK) {
        check_result(&s, &res, ev);
    } else {
        FZ_CHECK(rc == PP_ERR_SCHEDULE || rc == PP_ERR_DEADLOCK, "edited list: %s (%s)", pp_result_str(rc), err.msg);
        FZ_CHECK(err.msg[0] != 0, "edited list: %s without a message", pp_result_str(rc));
        FZ_CHECK(rc != PP_ERR_DEADLOCK || (res.deadlock && res.report[0]), "deadlock without a report");
    }
    return 0;
}
