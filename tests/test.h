/* tests/test.h - the tests' small harness: CHECK counts, the closing line "N passed, N failed". */
#ifndef PP_TEST_H
#define PP_TEST_H
#include <stdio.h>

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

#endif
