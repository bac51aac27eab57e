/* tests/test_link.h - in a test compiled with -DPP_TEST_LINK_IMPL (linked with tests/impl.c's
   object instead of compiling pipeline.h's implementation), the private names it reaches, as
   tests/impl.c exports them. Include after pipeline.h. Without PP_TEST_LINK_IMPL: nothing. */
#ifndef PP_TEST_LINK_H
#define PP_TEST_LINK_H
#ifdef PP_TEST_LINK_IMPL
#ifdef __cplusplus
extern "C" {
#endif
void pp_test_partition_ranks(const double* w, const double* mem, double cap, int L, const pp_schedule* s, int* first);
extern const int pp_test_pool_warm_steps;
pp_result pp_test_ckpt_save_path(const pp_ckpt_desc* d, const char* path, size_t (*fault)(void*, uint64_t, size_t),
                                 void* fault_user, pp_error* err);
#ifdef __cplusplus
}
#endif
#define _pp_partition_ranks pp_test_partition_ranks
#define _PP_POOL_WARM_STEPS pp_test_pool_warm_steps
#define _pp_ckpt_save_path pp_test_ckpt_save_path
#endif
#endif
