/*
 * kvp_meta_drop's semantics, the same on every backend (test_meta_drop.c:
 * mem: and file:, test_meta_redis.c: redis://): the namespace and its ranks
 * go, from the figures and from kvp_meta_ns, the other namespaces keep
 * theirs, an old handle finds no rank, and the next init_rank creates it
 * again, empty.
 */
#ifndef KVPAGE_META_DROP_TEST_H
#define KVPAGE_META_DROP_TEST_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "meta_test.h"

struct drop_seen {
    int a, b;        /* namespaces d1/kv and d2/kv listed */
    size_t a_ranks;  /* ranks of d1/kv */
    uint64_t a_keys; /* keys of d1/kv */
};

static inline int drop_stats_fn(const char *dep, const char *pool,
                                const struct kvp_rank_stats *ranks, size_t nranks, void *arg)
{
    struct drop_seen *s = arg;
    if (strcmp(pool, "kv"))
        return 0;
    if (!strcmp(dep, "d1")) {
        s->a = 1;
        s->a_ranks = nranks;
        for (size_t i = 0; i < nranks; i++)
            s->a_keys += ranks[i].keys;
    } else if (!strcmp(dep, "d2")) {
        s->b = 1;
    }
    return 0;
}

static inline struct drop_seen drop_seen_of(struct kvp_meta *m)
{
    struct drop_seen s = {0};
    CHECK_EQ(kvp_meta_stats(m, drop_stats_fn, &s), 0);
    return s;
}

/* Leaves d1/kv dropped and d2/kv with rank 0 holding "b-key". */
static inline void drop_semantics(struct kvp_meta *m)
{
    struct kvp_ns *a = ns_of(m, "d1", "kv"), *b = ns_of(m, "d2", "kv");
    CHECK(a && b);
    if (!a || !b)
        return;
    CHECK_EQ(kvp_meta_init_rank(a, 0, 64, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(a, 1, 1048576, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(b, 0, 8, NULL), 0);
    CHECK(put(a, 0, "a-key") >= 0);
    CHECK(put(a, 1, "a-key") >= 0);
    CHECK(put(b, 0, "b-key") >= 0);
    struct drop_seen s = drop_seen_of(m);
    CHECK(s.a && s.b);
    CHECK_EQ(s.a_ranks, 2);
    CHECK_EQ(s.a_keys, 2);

    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_drop(m, "d1", 2, "kv", 2, &err), 0);
    s = drop_seen_of(m);
    CHECK(!s.a && s.b);
    struct kvp_ns *again = NULL;
    CHECK_EQ(kvp_meta_ns(m, "d1", 2, "kv", 2, 0, &again, NULL), -ENOENT);
    CHECK_EQ(kvp_meta_nranks(a), 0);
    struct kvp_str k = {"a-key", 5};
    int64_t page = 0;
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_lookup(a, 0, 0, &k, 1, &page, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(kvp_meta_allocate(a, 1, &k, 1, &page, NULL, NULL), -ENOENT);
    /* the other namespace keeps its key */
    struct kvp_str bk = {"b-key", 5};
    CHECK_EQ(kvp_meta_lookup(b, 0, 0, &bk, 1, &page, NULL), 0);
    CHECK(page >= 0);
    /* a drop of what is not there, or of a bad name */
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_drop(m, "d1", 2, "kv", 2, &err), -ENOENT);
    CHECK(strstr(err.msg, "d1/kv") != NULL);
    CHECK_EQ(kvp_meta_drop(m, "nope", 4, "kv", 2, NULL), -ENOENT);
    CHECK_EQ(kvp_meta_drop(m, "bad name", 8, "kv", 2, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_NAMESPACE);

    /* the next initialization creates it again, empty */
    CHECK_EQ(kvp_meta_init_rank(a, 0, 32, NULL), 0);
    s = drop_seen_of(m);
    CHECK(s.a && s.b);
    CHECK_EQ(s.a_ranks, 1);
    CHECK_EQ(s.a_keys, 0);
    CHECK_EQ(kvp_meta_ns(m, "d1", 2, "kv", 2, 0, &again, NULL), 0);
    page = 0;
    CHECK_EQ(kvp_meta_lookup(a, 0, 0, &k, 1, &page, NULL), 0);
    CHECK_EQ(page, -1);
    CHECK(put(a, 0, "a-new") >= 0);
    CHECK_EQ(kvp_meta_drop(m, "d1", 2, "kv", 2, NULL), 0);
    s = drop_seen_of(m);
    CHECK(!s.a && s.b);
}

#endif
