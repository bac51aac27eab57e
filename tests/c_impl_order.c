/* The implementation compiles whatever the file included before it: here the C library's
   headers first, under -std=c99 -pedantic, which fixes the feature set without POSIX (so
   <time.h> has no clock_gettime of its own). Built by make check-c with gcc and clang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"

int pp_c_impl_order(void);
int pp_c_impl_order(void) { return _pp_now() > 0.0; }
