/* Unit tests of pins and the query by block hashes (src/meta/local/pins.c), on the
 * engine's clock (a fake one: expiry without sleeping) and through a
 * restart of a file: state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"

static uint64_t fake_now;
static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return fake_now;
}

static struct kvp_meta *open_at(const char *dir)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.read_grace_ms = 0;
    o.clock = fake_clock;
    o.data_dir = dir;
    struct kvp_meta *m = NULL;
    if (kvp_meta_open(&o, &m) != 0)
        abort();
    return m;
}

/* A handle on dir (NULL: in memory) at time 1000, and its default/kv. */
static struct kvp_ns *start(struct kvp_meta **m, const char *dir)
{
    fake_now = 1000;
    *m = open_at(dir);
    return ns_of(*m, "default", "kv");
}

static int held(struct kvp_ns *ns, const char *key)
{
    struct kvp_str k = K(key);
    uint8_t out = 9;
    kvp_meta_exists(ns, 0, &k, 1, &out, NULL);
    return out;
}

static int pin(struct kvp_ns *ns, const char *key, uint64_t ttl_ms, struct kvp_error *err)
{
    struct kvp_str k = K(key);
    return kvp_meta_pin(ns, &k, 1, ttl_ms, 0.5, NULL, NULL, err);
}

static uint64_t pinned(struct kvp_ns *ns, int64_t rank)
{
    uint64_t keys = 99;
    CHECK_EQ(kvp_meta_pinned(ns, rank, &keys, NULL, NULL), 0);
    return keys;
}

static void test_pins_hold_and_expire(void)
{
    struct kvp_meta *m;
    struct kvp_ns *ns = start(&m, NULL);
    struct kvp_error err = {0};
    CHECK_EQ(pin(ns, "a", 1000, &err), -ENOENT); /* no rank yet */
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    const char *keys[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        CHECK(put(ns, 0, keys[i]) >= 0);
    CHECK_EQ(pin(ns, "a", 0, &err), -EINVAL);
    struct kvp_str ab[] = {K("a"), K("b"), K("a")};
    CHECK_EQ(kvp_meta_pin(ns, ab, 2, 1000, 0, NULL, NULL, &err), -EINVAL);
    CHECK_EQ(kvp_meta_pin(ns, ab, 2, 1000, 1.5, NULL, NULL, &err), -EINVAL);
    uint64_t total = 0, limit = 0;
    CHECK_EQ(kvp_meta_pin(ns, ab, 3, 1000, 0.5, &total, &limit, &err), 0);
    CHECK_EQ(total, 2);
    CHECK_EQ(limit, 2);
    /* Over the limit: refused, nothing pinned. */
    CHECK_EQ(pin(ns, "c", 1000, &err), -ENOSPC);
    CHECK_EQ(err.rule, KVP_RULE_TOO_MANY);
    CHECK_EQ(err.value, 3);
    CHECK_EQ(err.limit, 2);
    CHECK_EQ(pinned(ns, -1), 2);
    CHECK_EQ(pinned(ns, 0), 2);
    /* Eviction passes over a and b. */
    CHECK(put(ns, 0, "e") >= 0);
    CHECK(held(ns, "a") && held(ns, "b") && !held(ns, "c") && held(ns, "d"));
    /* a has two references: one unpin leaves it pinned. */
    uint64_t released = 0;
    struct kvp_str a = K("a");
    CHECK_EQ(kvp_meta_unpin(ns, &a, 1, &released, &err), 0);
    CHECK_EQ(released, 1);
    CHECK_EQ(pinned(ns, -1), 2);
    /* At the deadline every pin ends: a and b are evicted again. */
    fake_now += 1000;
    CHECK_EQ(pinned(ns, -1), 0);
    CHECK(put(ns, 0, "f") >= 0);
    CHECK(put(ns, 0, "g") >= 0);
    CHECK(put(ns, 0, "h") >= 0);
    CHECK(!held(ns, "d") && !held(ns, "a") && !held(ns, "b") && held(ns, "e"));
    /* Every page pinned but none free: the allocation finds none, no loop. */
    const char *all[] = {"e", "f", "g", "h"};
    for (int i = 0; i < 4; i++) {
        struct kvp_str k = K(all[i]);
        CHECK_EQ(kvp_meta_pin(ns, &k, 1, 5000, 1.0, NULL, NULL, &err), 0);
    }
    struct kvp_str z = K("z");
    int64_t p = 7;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &z, 1, &p, NULL, &err), 0);
    CHECK_EQ(p, -1);
    invariants(m);
    kvp_meta_close(m);
}

static void test_exists_hashes(void)
{
    struct kvp_meta *m;
    struct kvp_ns *ns = start(&m, NULL);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, NULL), 0);
    const char *k1 = "ffeeddccbbaa99887766554433221100", *k2 = "m@00112233445566778899aabbccddeeff";
    CHECK(put(ns, 0, k1) >= 0);
    CHECK(put(ns, 1, k2) >= 0);
    CHECK(put(ns, 1, "short") >= 0);
    uint64_t h[] = {0xffeeddccbbaa9988u, 0x8899aabbccddeeffu, 0x8899aabbccddeeffu, 1};
    uint32_t ranks[] = {0, 1};
    uint8_t out[8];
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_SGLANG, ranks, 2, out, NULL), 0);
    uint8_t sgl[] = {1, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!memcmp(out, sgl, 8));
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_VLLM, ranks, 2, out, NULL), 0);
    uint8_t vll[] = {0, 0, 0, 1, 0, 1, 0, 0};
    CHECK(!memcmp(out, vll, 8));
    uint32_t bad = 5;
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_VLLM, &bad, 1, out, NULL), -ENOENT);
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, 7, ranks, 2, out, NULL), -EINVAL);
    kvp_meta_close(m);
}

/*
 * The index of block hashes (src/meta/local/hashidx.c) against a scan: keys
 * of 32 hex digits whose first and last 16 repeat (several keys per engine
 * hash), some with no hash in one form, under random confirmations,
 * evictions, deletes, clears, resizes, ranks added (entries grown) and
 * drops; the first query comes early, so the index is kept through all of
 * it and doubles several times. Every so often each hash of both forms is
 * asked on every rank and compared with what kvp_meta_exists says of the
 * keys that read as it.
 */
#define HX_KEYS 3000
#define HX_SGL (HX_KEYS / 2)
#define HX_VLL (HX_KEYS / 3)
static void hx_compare(struct kvp_ns *ns, char (*keys)[40], uint32_t nr)
{
    static struct kvp_str ks[HX_KEYS];
    static uint8_t held_by[8][HX_KEYS], want[2][HX_SGL * 8], got[HX_SGL * 8];
    static uint64_t hs[2][HX_SGL];
    uint32_t ranks[8];
    for (int i = 0; i < HX_KEYS; i++)
        ks[i] = K(keys[i]);
    for (uint32_t r = 0; r < nr; r++) {
        ranks[r] = r;
        CHECK_EQ(kvp_meta_exists(ns, r, ks, HX_KEYS, held_by[r], NULL), 0);
    }
    memset(want, 0, sizeof want);
    for (int i = 0; i < HX_SGL; i++)
        hs[0][i] = 0x1000000000000000ull + (uint64_t)i * 0x10001;
    for (int i = 0; i < HX_VLL; i++)
        hs[1][i] = 0xabc0000000000000ull + (uint64_t)i * 0x777;
    for (int i = 0; i < HX_KEYS; i++)
        for (uint32_t r = 0; r < nr; r++) {
            if (i % 7 != 0) /* these have no SGLang hash */
                want[0][(size_t)(i % HX_SGL) * nr + r] |= held_by[r][i];
            if (i % 11 != 0) /* and these no vLLM one */
                want[1][(size_t)(i % HX_VLL) * nr + r] |= held_by[r][i];
        }
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs[0], HX_SGL, KVP_HASH_SGLANG, ranks, nr, got, NULL), 0);
    CHECK(!memcmp(got, want[0], (size_t)HX_SGL * nr));
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs[1], HX_VLL, KVP_HASH_VLLM, ranks, nr, got, NULL), 0);
    CHECK(!memcmp(got, want[1], (size_t)HX_VLL * nr));
}

static void test_hash_index_random(void)
{
    static char keys[HX_KEYS][40];
    for (int i = 0; i < HX_KEYS; i++)
        snprintf(keys[i], sizeof keys[i], "%s%016llx%016llx%s", i % 7 ? "" : "g",
                 0x1000000000000000ull + (unsigned long long)(i % HX_SGL) * 0x10001,
                 0xabc0000000000000ull + (unsigned long long)(i % HX_VLL) * 0x777,
                 i % 11 ? "" : "-");
    struct kvp_meta *m;
    struct kvp_ns *ns = start(&m, NULL);
    uint32_t nr = 3, size[8];
    for (uint32_t r = 0; r < nr; r++)
        CHECK_EQ(kvp_meta_init_rank(ns, r, size[r] = 700, NULL), 0);
    hx_compare(ns, keys, nr); /* builds the index while it is empty */
    srand(38);
    for (int op = 0; op < 20000; op++) {
        int c = rand() % 1000;
        uint32_t r = (uint32_t)rand() % nr;
        struct kvp_str k = K(keys[rand() % HX_KEYS]);
        if (c < 850) {
            put(ns, r, k.ptr);
        } else if (c < 960) {
            CHECK_EQ(kvp_meta_delete(ns, rand() % 4 ? (int64_t)r : -1, &k, 1, NULL), 0);
        } else if (c < 975) { /* clear a rank, and resize it now and then */
            CHECK_EQ(kvp_meta_clear(ns, r, NULL), 0);
            if (rand() % 2)
                CHECK_EQ(kvp_meta_init_rank(ns, r, size[r] = 300 + (uint32_t)rand() % 900, NULL),
                         0);
        } else if (c < 976) {
            CHECK_EQ(kvp_meta_clear(ns, -1, NULL), 0);
        } else if (c < 977) {
            CHECK_EQ(kvp_meta_drop(m, "default", 7, "kv", 2, NULL), 0);
            ns = ns_of(m, "default", "kv");
            for (uint32_t i = 0; i < nr; i++)
                CHECK_EQ(kvp_meta_init_rank(ns, i, size[i], NULL), 0);
        }
        if (op % 2500 == 1000 && nr < 8) { /* the next confirmations grow entries */
            CHECK_EQ(kvp_meta_init_rank(ns, nr, size[nr] = 1000, NULL), 0);
            nr++;
        }
        if (op % 500 == 499) {
            hx_compare(ns, keys, nr);
            invariants(m);
        }
    }
    hx_compare(ns, keys, nr);
    kvp_meta_close(m);
}

static void test_pins_survive_reopen(void)
{
    char dir[64];
    scratch_make(dir, sizeof dir, "test_pins", 0);
    struct kvp_meta *m;
    struct kvp_ns *ns = start(&m, dir);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK(put(ns, 0, "a") >= 0);
    CHECK_EQ(pin(ns, "a", 600000, NULL), 0);
    CHECK_EQ(pin(ns, "a", 600000, NULL), 0);
    kvp_meta_close(m);
    fake_now = 50; /* the engine's clock starts again: the file's deadline is wall time */
    m = open_at(dir);
    ns = ns_of(m, "default", "kv");
    uint64_t keys = 0, refs = 0;
    CHECK_EQ(kvp_meta_pinned(ns, 0, &keys, &refs, NULL), 0);
    CHECK_EQ(keys, 1);
    CHECK_EQ(refs, 2);
    fake_now += 599000;
    CHECK_EQ(pinned(ns, -1), 1);
    fake_now += 2000;
    CHECK_EQ(pinned(ns, -1), 0);
    kvp_meta_close(m);
    rmrf(dir);
}

static void test_drop_forgets_pins(void)
{
    struct kvp_meta *m;
    struct kvp_ns *ns = start(&m, NULL);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(pin(ns, "a", 1000, NULL), 0);
    CHECK_EQ(kvp_meta_drop(m, "default", 7, "kv", 2, NULL), 0);
    ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(pinned(ns, -1), 0);
    kvp_meta_close(m);
}

int main(void)
{
    test_drop_forgets_pins();
    test_pins_hold_and_expire();
    test_exists_hashes();
    test_hash_index_random();
    test_pins_survive_reopen();
    return check_report();
}
