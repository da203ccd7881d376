/* Minimal assertions for the C unit tests: report every failure, exit non-zero at the end. */
#ifndef DPS_TEST_CHECK_H
#define DPS_TEST_CHECK_H
#include <stdio.h>

static int check_failures, check_count;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        check_count++;                                                                                       \
        if (!(cond)) {                                                                                       \
            check_failures++;                                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

static int check_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}
#endif
