/* tests/test.h - the tests' small harness: CHECK counts, the closing line "N passed, N failed". */
#ifndef PP_TEST_H
#define PP_TEST_H
#include <stdio.h>
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

/* Closing line, and the exit code that agrees with it. */
#define TEST_DONE(name)                                                       \
    (printf("%s: %d passed, %d failed\n", name, _t_pass, _t_fail), _t_fail ? 1 : 0)

/* One test on its own, when argv[1] names it (what a negative control runs): 1 after fn ran,
   0 when there is no argv[1] or it names another. */
static inline int test_only(int argc, char** argv, const char* name, void (*fn)(void)) {
    if (argc < 2 || strcmp(argv[1], name) != 0) return 0;
    fn();
    return 1;
}

#endif
