/* Minimal test helpers: count checks, report failures with file:line, and
 * print the closing "N passed, N failed" line that CI reads. The one check
 * framework of the unit tests (pagefile_test.h and the tests with checks of
 * their own count through it). The counters are atomic, so that a check may
 * run on any thread.
 *
 * The other helpers the tests share, each once: rng.h (random numbers from
 * a seed), scratch.h (a scratch directory), mono.h (milliseconds, sleep),
 * meta_test.h (a namespace, a key, one put, the invariants), meta_diff.h and
 * meta_drop.h (suites every metadata backend runs), store_test.h, and
 * pagefile_test.h (the page-file tests' options, buffers and backends). */
#ifndef KVP_TEST_CHECK_H
#define KVP_TEST_CHECK_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int check_passed, check_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ == b_) {                                                                            \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a,    \
                    a_, #b, b_);                                                                   \
        }                                                                                          \
    } while (0)

/* Two C strings equal (NULL equals nothing). */
#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ && b_ && strcmp(a_, b_) == 0) {                                                     \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: %s\n  got      \"%s\"\n  expected \"%s\"\n", __FILE__,         \
                    __LINE__, #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                         \
        }                                                                                          \
    } while (0)

/* For checks that say more than CHECK can: one passed, or one failed with
 * the message (printf's format; the line ends here). */
static inline void check_pass(void)
{
    check_passed++;
}

__attribute__((format(printf, 1, 2), unused)) static void check_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    check_failed++;
}

static inline int check_report(void)
{
    int passed = check_passed, failed = check_failed;
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif
