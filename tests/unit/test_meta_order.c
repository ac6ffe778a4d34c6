/*
 * The order in which allocations take FREE pages (kvpage/meta.h enum
 * kvp_page_order; docs/protocol-notes.md, "The order of free pages"), in
 * the in-process engine (mem: and file:), with read grace 0:
 *
 *   - vLLM's order: the lowest never-used page first, freed pages after
 *     them in release order (vLLM's hf3fs_metadata_server.py: a list taken
 *     from the front, releases appended at the back);
 *   - SGLang's: the most recently freed first (LIFO), then the highest
 *     never-used (mini_3fs_metadata_server.py: list.pop() from the back);
 *   - the default (the store's): the most recently freed first, then the
 *     lowest never-used (unchanged);
 *   - both dialects on one rank take from the two ends of one list;
 *   - eviction when nothing is free takes the least recently used HELD page
 *     in every order (SGLang's popitem(last=False));
 *   - a restart forgets the release order: every FREE page counts as never
 *     used; keys on the highest pages survive a snapshot (the snapshot copies
 *     the range [bot, top) of the page array);
 *   - an order outside the enum is refused.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"

/* Allocates keys (a C string of one-letter keys) in order; pages[] gets the pages. */
static void alloc(struct kvp_ns *ns, uint32_t rank, int order, const char *keys, int64_t *pages)
{
    size_t n = strlen(keys);
    struct kvp_str k[16];
    for (size_t i = 0; i < n; i++)
        k[i] = (struct kvp_str){&keys[i], 1};
    CHECK_EQ(kvp_meta_allocate_ordered(ns, rank, order, k, n, pages, NULL, NULL), 0);
}

/* Allocates the keys and checks their pages against want[] (-1: none). */
static void expect_alloc(struct kvp_ns *ns, uint32_t rank, int order, const char *keys,
                         const int64_t *want)
{
    int64_t got[16];
    alloc(ns, rank, order, keys, got);
    for (size_t i = 0; i < strlen(keys); i++) {
        if (got[i] != want[i])
            fprintf(stderr, "rank %u order %d key %c: page %lld, want %lld\n", rank, order, keys[i],
                    (long long)got[i], (long long)want[i]);
        CHECK_EQ(got[i], want[i]);
    }
}

/* Confirms each one-letter key on the page given. */
static void confirm(struct kvp_ns *ns, uint32_t rank, const char *keys, const int64_t *pages)
{
    struct kvp_str k[16];
    for (size_t i = 0; i < strlen(keys); i++)
        k[i] = (struct kvp_str){&keys[i], 1};
    CHECK_EQ(kvp_meta_confirm(ns, rank, k, pages, strlen(keys), NULL, 0, NULL), 0);
}

/* Deletes the one-letter keys one call each, in the order given. */
static void del(struct kvp_ns *ns, uint32_t rank, const char *keys)
{
    for (const char *c = keys; *c; c++) {
        struct kvp_str k = {c, 1};
        CHECK_EQ(kvp_meta_delete(ns, (int64_t)rank, &k, 1, NULL), 0);
    }
}

static void release(struct kvp_ns *ns, uint32_t rank, const int64_t *pages, size_t n)
{
    CHECK_EQ(kvp_meta_confirm(ns, rank, NULL, NULL, 0, pages, n, NULL), 0);
}

static void vllm_order(struct kvp_meta *m, struct kvp_ns *ns)
{
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "abcd", (int64_t[]){0, 1, 2, 3});
    confirm(ns, 0, "abcd", (int64_t[]){0, 1, 2, 3});
    del(ns, 0, "bd"); /* freed: 1, then 3 */
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "efgh", (int64_t[]){4, 5, 6, 7});
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "ij", (int64_t[]){1, 3});
    /* Nothing FREE: the least recently used HELD pages, a then c. */
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "kl", (int64_t[]){0, 2});
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "m", (int64_t[]){-1});
    invariants(m);
}

static void sglang_order(struct kvp_meta *m, struct kvp_ns *ns)
{
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, NULL), 0);
    expect_alloc(ns, 1, KVP_ORDER_SGLANG, "abcd", (int64_t[]){7, 6, 5, 4});
    confirm(ns, 1, "abcd", (int64_t[]){7, 6, 5, 4});
    del(ns, 1, "bd"); /* freed: 6, then 4 */
    expect_alloc(ns, 1, KVP_ORDER_SGLANG, "ef", (int64_t[]){4, 6});
    /* A released reservation is freed too: reused first. */
    release(ns, 1, (int64_t[]){4}, 1);
    expect_alloc(ns, 1, KVP_ORDER_SGLANG, "ghijk", (int64_t[]){4, 3, 2, 1, 0});
    /* A lookup touches c: the LRU is a, then c. */
    int64_t p;
    struct kvp_str kc = K("c");
    CHECK_EQ(kvp_meta_lookup(ns, 1, 0, &kc, 1, &p, NULL), 0);
    CHECK_EQ(p, 5);
    expect_alloc(ns, 1, KVP_ORDER_SGLANG, "l", (int64_t[]){7});
    expect_alloc(ns, 1, KVP_ORDER_SGLANG, "mn", (int64_t[]){5, -1});
    invariants(m);
}

static void default_order(struct kvp_meta *m, struct kvp_ns *ns)
{
    CHECK_EQ(kvp_meta_init_rank(ns, 2, 8, NULL), 0);
    expect_alloc(ns, 2, KVP_ORDER_DEFAULT, "abcd", (int64_t[]){0, 1, 2, 3});
    confirm(ns, 2, "abcd", (int64_t[]){0, 1, 2, 3});
    del(ns, 2, "bd");
    expect_alloc(ns, 2, KVP_ORDER_DEFAULT, "efg", (int64_t[]){3, 1, 4});
    /* kvp_meta_allocate is the default order. */
    struct kvp_str kh = K("h");
    int64_t p;
    CHECK_EQ(kvp_meta_allocate(ns, 2, &kh, 1, &p, NULL, NULL), 0);
    CHECK_EQ(p, 5);
    invariants(m);
}

/* Both dialects on one rank: the two ends of one list. */
static void mixed_order(struct kvp_meta *m, struct kvp_ns *ns)
{
    CHECK_EQ(kvp_meta_init_rank(ns, 3, 8, NULL), 0);
    expect_alloc(ns, 3, KVP_ORDER_VLLM, "a", (int64_t[]){0});
    expect_alloc(ns, 3, KVP_ORDER_SGLANG, "b", (int64_t[]){7});
    expect_alloc(ns, 3, KVP_ORDER_VLLM, "c", (int64_t[]){1});
    expect_alloc(ns, 3, KVP_ORDER_SGLANG, "d", (int64_t[]){6});
    release(ns, 3, (int64_t[]){0, 7, 1, 6}, 4); /* the list: 2 3 4 5 0 7 1 6 */
    expect_alloc(ns, 3, KVP_ORDER_VLLM, "e", (int64_t[]){2});
    expect_alloc(ns, 3, KVP_ORDER_SGLANG, "f", (int64_t[]){6});
    expect_alloc(ns, 3, KVP_ORDER_SGLANG, "g", (int64_t[]){1});
    expect_alloc(ns, 3, KVP_ORDER_VLLM, "hijk", (int64_t[]){3, 4, 5, 0});
    expect_alloc(ns, 3, KVP_ORDER_DEFAULT, "l", (int64_t[]){7});
    expect_alloc(ns, 3, KVP_ORDER_DEFAULT, "m", (int64_t[]){-1});
    invariants(m);
}

static void bad_order(struct kvp_ns *ns)
{
    struct kvp_str k = K("z");
    int64_t p = 99;
    struct kvp_error e = {0};
    CHECK_EQ(kvp_meta_allocate_ordered(ns, 0, 3, &k, 1, &p, NULL, &e), -EINVAL);
    CHECK_EQ(e.rule, KVP_RULE_ARG);
    CHECK_EQ(p, 99);
    CHECK_EQ(kvp_meta_allocate_ordered(ns, 0, -1, &k, 1, &p, NULL, &e), -EINVAL);
}

static struct kvp_meta *open_at(const char *loc)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.read_grace_ms = 0;
    o.snapshot_mode = KVP_SNAPSHOT_MANUAL;
    struct kvp_meta *m = NULL;
    struct kvp_error e = {0};
    if (kvp_meta_open_at(loc, &o, &m, &e) != 0)
        fprintf(stderr, "open %s: %s\n", loc, e.msg);
    CHECK(m != NULL);
    return m;
}

static void suite(const char *loc)
{
    struct kvp_meta *m = open_at(loc);
    if (!m)
        return;
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK(ns != NULL);
    vllm_order(m, ns);
    sglang_order(m, ns);
    default_order(m, ns);
    mixed_order(m, ns);
    bad_order(ns);
    kvp_meta_close(m);
}

/* After a restart every FREE page counts as never used; keys survive. */
static void restart(const char *dir, int snapshot)
{
    char loc[300];
    snprintf(loc, sizeof loc, "file:%s", dir);
    rmrf(dir);
    struct kvp_meta *m = open_at(loc);
    if (!m)
        return;
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    expect_alloc(ns, 0, KVP_ORDER_SGLANG, "abcd", (int64_t[]){7, 6, 5, 4});
    confirm(ns, 0, "abcd", (int64_t[]){7, 6, 5, 4});
    del(ns, 0, "ad"); /* freed: 7, then 4 */
    if (snapshot)
        CHECK_EQ(kvp_meta_snapshot(m), 0);
    kvp_meta_close(m);
    m = open_at(loc);
    if (!m)
        return;
    ns = ns_of(m, "default", "kv");
    invariants(m);
    int64_t p[2];
    struct kvp_str kk[2] = {K("b"), K("c")};
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, kk, 2, p, NULL), 0);
    CHECK_EQ(p[0], 6);
    CHECK_EQ(p[1], 5);
    /* Before the restart SGLang's order gave 4, 7, 3; now the highest first. */
    expect_alloc(ns, 0, KVP_ORDER_SGLANG, "efg", (int64_t[]){7, 4, 3});
    expect_alloc(ns, 0, KVP_ORDER_VLLM, "hi", (int64_t[]){0, 1});
    invariants(m);
    kvp_meta_close(m);
    rmrf(dir);
}

/* A new empty directory (its name in dir), or NULL. */
static const char *new_dir(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/kvp-order-XXXXXX");
    const char *d = mkdtemp(dir);
    CHECK(d != NULL);
    return d;
}

int main(void)
{
    suite("mem:");
    char dir[64], loc[80];
    if (new_dir(dir, sizeof dir)) {
        snprintf(loc, sizeof loc, "file:%s", dir);
        suite(loc);
        rmrf(dir);
    }
    if (new_dir(dir, sizeof dir))
        restart(dir, 0);
    if (new_dir(dir, sizeof dir))
        restart(dir, 1);
    return check_report();
}
