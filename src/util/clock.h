/* The monotonic clock, in nanoseconds or milliseconds (the one clock the project reads). */
#ifndef KVP_UTIL_CLOCK_H
#define KVP_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvp__mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvp__mono_ms(void)
{
    return kvp__mono_ns() / 1000000u;
}

#endif
