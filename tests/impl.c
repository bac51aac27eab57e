/* tests/impl.c - pipeline.h's implementation alone: make compiles it once per flavour
   (build/obj/impl.o, clang-impl.o, asan-impl.o, tsan-impl.o) and links it into every test that
   uses only the library's public names (LINKED_TESTS in the Makefile); such a test compiled
   with -DPP_TEST_LINK_IMPL leaves the implementation out, and without it is one file as before. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"

/* The few private names a linked test reaches, exported under test names (tests/test_link.h
   maps the private names onto them). */
void pp_test_partition_ranks(const double* w, const double* mem, double cap, int L, const pp_schedule* s, int* first);
void pp_test_partition_ranks(const double* w, const double* mem, double cap, int L, const pp_schedule* s, int* first) {
    _pp_partition_ranks(w, mem, cap, L, s, first);
}
const int pp_test_pool_warm_steps = _PP_POOL_WARM_STEPS;
pp_result pp_test_ckpt_save_path(const pp_ckpt_desc* d, const char* path, size_t (*fault)(void*, uint64_t, size_t),
                                 void* fault_user, pp_error* err);
pp_result pp_test_ckpt_save_path(const pp_ckpt_desc* d, const char* path, size_t (*fault)(void*, uint64_t, size_t),
                                 void* fault_user, pp_error* err) {
    return _pp_ckpt_save_path(d, path, fault, fault_user, err);
}
