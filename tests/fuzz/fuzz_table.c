/* tests/fuzz/fuzz_table.c - libFuzzer target: the schedule-table parser (pp_schedule_parse) on
   arbitrary text. Any input: an error with a message, or a table the simulator proves
   (pp_simulate says OK) that pp_schedule_write prints back into text that parses to the same
   actions (and order=any). The size protocol holds: out NULL answers PP_ERR_SIZE with the count, then a buffer
   of exactly that many actions is enough. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../../pipeline.h"
#define FUZZ_NAME "fuzz_table"
#include "fuzz.h"

#define MAX_ACTS 8192

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static pp_action acts[MAX_ACTS], again[MAX_ACTS];
    static char text[1 << 18];
    const char* t = (const char*)data;
    pp_schedule s, s2;
    pp_sim_result res;
    pp_error err;
    pp_result rc;
    size_t need = 0, need2 = 0, n;
    FILE* f;
    memset(&err, 0, sizeof err);
    rc = pp_schedule_parse(t, size, NULL, 0, &need, &s, &err);
    if (rc != PP_ERR_SIZE) {
        FZ_CHECK(rc != PP_OK, "out NULL cannot succeed");
        FZ_CHECK(err.msg[0] != 0 && err.code == rc, "%s without a message", pp_result_str(rc));
        return 0;
    }
    if (need > MAX_ACTS) return 0;
    memset(&err, 0, sizeof err);
    rc = pp_schedule_parse(t, size, acts, need, &need2, &s, &err);
    if (rc != PP_OK) {
        FZ_CHECK(rc != PP_ERR_SIZE, "a buffer of the announced %zu actions is too small: %s", need, err.msg);
        FZ_CHECK(err.msg[0] != 0 && err.code == rc, "%s without a message", pp_result_str(rc));
        return 0;
    }
    FZ_CHECK(need2 == need && (size_t)s.p * (size_t)s.per_rank == need, "%zu then %zu actions, %d x %d", need, need2, s.p,
             s.per_rank);
    FZ_CHECK(pp_simulate(&s, NULL, &res, NULL, &err) == PP_OK && !res.deadlock, "accepted table fails the simulator: %s",
             err.msg);
    /* round trip */
    f = fmemopen(text, sizeof text, "w");
    if (!f) return 0;
    pp_schedule_write(f, &s);
    n = (size_t)ftell(f);
    fclose(f);
    if (n >= sizeof text - 1) return 0;
    rc = pp_schedule_parse(text, n, again, MAX_ACTS, &need2, &s2, &err);
    FZ_CHECK(rc == PP_OK, "written table does not parse back: %s\n%.*s", err.msg, (int)n, text);
    FZ_CHECK(s2.p == s.p && s2.v == s.v && s2.m == s.m && s2.per_rank == s.per_rank && s2.any_order == s.any_order &&
                 memcmp(again, acts, need * sizeof *acts) == 0,
             "round trip changed the table");
    return 0;
}
