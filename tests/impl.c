/* tests/impl.c - pipeline.h's implementation alone: make compiles it once per flavour
   (build/obj/impl.o, clang-impl.o, asan-impl.o, tsan-impl.o) and links it into every test that
   uses only the library's public names (LINKED_TESTS in the Makefile); such a test compiled
   with -DPP_TEST_LINK_IMPL leaves the implementation out, and without it is one file as before. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
