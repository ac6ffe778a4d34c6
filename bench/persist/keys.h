/* The keys of the bench/persist programs: key i as 64 lowercase hex
 * characters (what an engine's sha256 keys look like), the same in each. */
#ifndef KVP_BENCH_PERSIST_KEYS_H
#define KVP_BENCH_PERSIST_KEYS_H
#include <stdint.h>

static void key_of(uint64_t i, char *out)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull;
    for (int j = 0; j < 64; j++) {
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        out[j] = "0123456789abcdef"[(x >> 60) & 15];
    }
}
#endif
