/*
 * rng.h — the one random generator of the unit tests: splitmix64, the same
 * sequence for the same seed on every machine (a failing seed replays), any
 * seed good (0 too), its state a uint64_t the caller keeps (one per thread
 * where threads draw).
 */
#ifndef KVP_TEST_RNG_H
#define KVP_TEST_RNG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A number in [0, n); 0 when n is 0. */
static inline uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return n ? rng_next(s) % n : 0;
}

/* len bytes of the sequence. */
static inline void rng_fill(uint64_t *s, void *buf, size_t len)
{
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = rng_next(s);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = rng_next(s);
    for (; i < len; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

/* A seed from a string (FNV-1a), for bytes derived from a key. */
static inline uint64_t rng_seed_of(const char *s)
{
    uint64_t x = 1469598103934665603ull;
    for (; *s; s++)
        x = (x ^ (uint8_t)*s) * 1099511628211ull;
    return x;
}

#endif
