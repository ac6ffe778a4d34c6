/*
 * KV events' block hashes (src/server/kvevents.c, kvp__kvev_block_hash)
 * against a reading of the engines' rules written here without the
 * server's code: SGLang's key (64 hex digits) -> its first 16 digits as a
 * signed int64 (hash_str_to_int64); vLLM's (all hex, 16 digits or more) ->
 * its last 16 as a uint64 (maybe_convert_block_hash); kvpage's vLLM tier
 * (IDENTITY:HEX) -> the last 16 digits after the last ':'; anything else ->
 * XXH3 of the key. Digits of either case, in every place, so that a fast
 * parse that mixes up a place or a case fails here.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "check.h"
#include "rng.h"
#include "server/kvevents.h"

static uint64_t digits(const char *s) /* 16 hex digits */
{
    char b[17];
    memcpy(b, s, 16);
    b[16] = 0;
    return strtoull(b, NULL, 16);
}

static void random_hex(uint64_t *seed, char *s, size_t n)
{
    static const char lower[] = "0123456789abcdef", upper[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(seed);
        s[i] = (r & 16 ? upper : lower)[r & 15];
    }
}

static void test_engine_keys(void)
{
    uint64_t seed = 38;
    char k[200];
    int sg;
    for (int round = 0; round < 20000; round++) {
        /* SGLang: 64 digits */
        random_hex(&seed, k, 64);
        CHECK_EQ(kvp__kvev_block_hash(k, 64, KVP_KVEV_HASH_AUTO, &sg), digits(k));
        CHECK_EQ(sg, 1);
        CHECK_EQ(kvp__kvev_block_hash(k, 64, KVP_KVEV_HASH_SGLANG, &sg), digits(k));
        CHECK_EQ(kvp__kvev_block_hash(k, 64, KVP_KVEV_HASH_VLLM, &sg), digits(k + 48));
        CHECK_EQ(sg, 0);
        /* vLLM: all hex, 16 digits or more, not 64 */
        size_t n = 16 + (size_t)(rng_next(&seed) % 100);
        if (n == 64)
            n = 65;
        random_hex(&seed, k, n);
        CHECK_EQ(kvp__kvev_block_hash(k, n, KVP_KVEV_HASH_AUTO, &sg), digits(k + n - 16));
        CHECK_EQ(sg, 0);
        /* kvpage's vLLM tier: IDENTITY:HEX */
        memcpy(k, "model-a:tp0:", 12);
        random_hex(&seed, k + 12, 32);
        CHECK_EQ(kvp__kvev_block_hash(k, 44, KVP_KVEV_HASH_AUTO, &sg), digits(k + 28));
        CHECK_EQ(sg, 0);
    }
}

static void test_other_keys(void)
{
    int sg;
    const char *keys[] = {"top", "g-17", "0123456789abcdeg", "0123456789abcde", "prefix:xyz"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t n = strlen(keys[i]);
        CHECK_EQ(kvp__kvev_block_hash(keys[i], n, KVP_KVEV_HASH_AUTO, &sg),
                 XXH3_64bits(keys[i], n));
        CHECK_EQ(sg, 0);
    }
}

int main(void)
{
    test_engine_keys();
    test_other_keys();
    return check_report();
}
