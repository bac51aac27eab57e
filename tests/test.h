/* tests/test.h - the tests' small harness: CHECK counts, the closing line "N passed, N failed". */
#ifndef PP_TEST_H
#define PP_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int _t_pass, _t_fail;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            _t_pass++;                                                        \
        } else {                                                              \
            _t_fail++;                                                        \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
        }                                                                     \
    } while (0)

/* Sampled sweeps, a rotation: PP_TEST_SEED=N picks the cases of this run (make test sets a new
   seed each run and prints it; the closing line of a failed test repeats it), PP_TEST_FULL=1
   runs every case (make test-full). test_pick(i, R): case i of a sweep runs when i % R equals
   the seed % R, so every case runs within R consecutive seeds, whatever the seed. */
static inline unsigned long test_seed(void) {
    const char* s = getenv("PP_TEST_SEED");
    return s && *s ? strtoul(s, NULL, 10) : 0;
}
static inline int test_full(void) {
    const char* s = getenv("PP_TEST_FULL");
    return s && *s && strcmp(s, "0") != 0;
}
static inline int test_pick(long i, long R) {
    return test_full() || R <= 1 || i % R == (long)(test_seed() % (unsigned long)R);
}

/* 1 in the ASan+UBSan and TSan builds: they run a sweep's heavy cases as a rotation too (they look
   for memory and thread errors, which the first cases of a kind show as well as the last). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

/* 1 in the clang builds of make test (-DPP_TEST_SECOND_BUILD): the second compiler is there for
   its warnings and its code, which a sweep's first cases of each kind exercise as well as its
   largest; the gcc build runs every case. */
#ifdef PP_TEST_SECOND_BUILD
#define TEST_SECOND 1
#else
#define TEST_SECOND 0
#endif

/* A sweep's heavy case i (the largest sizes): run in the gcc build and under PP_TEST_FULL, as a
   rotation of one in R in the sanitizers' and the second compiler's builds (test_pick), never
   under PP_QUICK. */
static inline int test_heavy(long i, long R) {
    if (test_full()) return 1;
    if (getenv("PP_QUICK")) return 0;
    return !(TEST_SANITIZED || TEST_SECOND) || test_pick(i, R);
}

/* make quick's share of a sweep (PP_QUICK): case i runs when test_pick(i, R) says so, so the
   edit loop covers the whole sweep within R runs; every case outside make quick. */
static inline int test_quick_pick(long i, long R) {
    return !getenv("PP_QUICK") || test_pick(i, R);
}

/* Closing line, and the exit code that agrees with it (a failure names the seed to rerun it). */
#define TEST_DONE(name)                                                                          \
    (_t_fail ? printf("%s: rerun with PP_TEST_SEED=%lu%s\n", name, test_seed(),                \
                      test_full() ? " PP_TEST_FULL=1" : "")                                      \
             : 0,                                                                                \
     printf("%s: %d passed, %d failed\n", name, _t_pass, _t_fail), _t_fail ? 1 : 0)

/* One test on its own, when argv[1] names it (what a negative control runs): 1 after fn ran,
   0 when there is no argv[1] or it names another. */
static inline int test_only(int argc, char** argv, const char* name, void (*fn)(void)) {
    if (argc < 2 || strcmp(argv[1], name) != 0) return 0;
    fn();
    return 1;
}

#endif
