/*
 * mono.h — the unit tests' clock: milliseconds of the monotonic clock, and a
 * sleep of whole milliseconds that a signal does not cut short.
 */
#ifndef KVP_TEST_MONO_H
#define KVP_TEST_MONO_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

#endif
