// Compiles every header as C++ (and under nvcc with make check-cuda): the implementation too.
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline.h"  // a second include is harmless

int pp_cxx_check(void);
int pp_cxx_check(void) {
    pp_error err;
    pp_action acts[16];
    pp_schedule s;
    return pp_schedule_make(PP_SCHED_1F1B, 2, 1, 4, acts, 16, &s, &err) == PP_OK ? 0 : 1;
}
