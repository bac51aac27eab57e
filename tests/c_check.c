/* Compiles every header's declarations as C99, as a file that is not the implementation file
   sees them (the tests compile the implementation as C with gcc and clang). */
#include "../pipeline.h"
#include "../pipeline.h" /* a second include is harmless */

int pp_c_check(const pp_stage_desc* d, pp_flight* f);
int pp_c_check(const pp_stage_desc* d, pp_flight* f) {
    return d->check_finite + (int)f->n + PP_VERSION;
}
