/* Unit tests of pins and the query by block hashes (src/meta/local/pins.c), on the
 * engine's clock (a fake one: expiry without sleeping) and through a
 * restart of a file: state. */
#include <errno.h>
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
    test_pins_survive_reopen();
    return check_report();
}
