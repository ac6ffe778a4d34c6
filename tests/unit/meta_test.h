/*
 * meta_test.h — helpers shared by the tests of src/meta (test_meta.c,
 * test_persist.c, test_powerloss.c and others) and by meta_diff.h and
 * meta_drop.h, the suites every backend's test runs: a namespace by name, a
 * key from a C string, one key allocated and confirmed, the invariant
 * checker as a check, and removing a data directory.
 */
#ifndef KVPAGE_META_TEST_H
#define KVPAGE_META_TEST_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/meta.h"
#include "scratch.h"

/* The namespace (created when missing), or NULL and the error printed. */
static inline struct kvp_ns *ns_of(struct kvp_meta *m, const char *dep, const char *pool)
{
    struct kvp_ns *ns = NULL;
    struct kvp_error e = {0};
    if (kvp_meta_ns(m, dep, strlen(dep), pool, strlen(pool), 1, &ns, &e))
        fprintf(stderr, "ns: %s\n", e.msg);
    return ns;
}

static inline struct kvp_str K(const char *s) {
    return (struct kvp_str){s, strlen(s)};
}

/* Allocates and confirms one key on rank; its page, or -1. */
static inline int64_t
put(struct kvp_ns *ns, uint32_t rank, const char *key)
{
    struct kvp_str k = K(key);
    int64_t p;
    if (kvp_meta_allocate(ns, rank, &k, 1, &p, NULL, NULL) != 0 || p < 0)
        return -1;
    if (kvp_meta_confirm(ns, rank, &k, &p, 1, NULL, 0, NULL) != 0)
        return -1;
    return p;
}

static inline void invariants(struct kvp_meta *m)
{
    struct kvp_error e = {0};
    int rc = kvp_meta_check(m, &e);
    if (rc)
        fprintf(stderr, "invariant: %s\n", e.msg);
    CHECK_EQ(rc, 0);
}

/* Appends "key@rank<parent>[t,t] " for a stored page of the inventory
 * (kvp_meta_inventory with buf as its arg, 4096 bytes): what is kept of
 * each page's lineage (no <> or []: not known). */
static inline void inventory_lineage(const struct kvp_meta_change *c, void *buf)
{
    char *b = buf;
    size_t n = strlen(b);
    CHECK_EQ(c->kind, KVP_CHANGE_STORED);
    CHECK(!c->parent == !c->parent_len && !c->token_ids == !c->ntokens);
    n += (size_t)snprintf(b + n, 4096 - n, "%.*s@%u", (int)c->len, c->key, c->rank);
    if (c->parent && n < 4096)
        n += (size_t)snprintf(b + n, 4096 - n, "<%.*s>", (int)c->parent_len, c->parent);
    for (size_t i = 0; i < c->ntokens && i < 8 && n < 4096; i++)
        n += (size_t)snprintf(b + n, 4096 - n, "%c%u", i ? ',' : '[', c->token_ids[i]);
    if (c->ntokens > 8 && n < 4096) /* a long one: its count and its last */
        n +=
            (size_t)snprintf(b + n, 4096 - n, "..%zu:%u", c->ntokens, c->token_ids[c->ntokens - 1]);
    if (n < 4096)
        snprintf(b + n, 4096 - n, "%s ", c->ntokens ? "]" : "");
}

/* The inventory of m in that form. */
static inline const char *lineages(struct kvp_meta *m)
{
    static char buf[4096];
    buf[0] = 0;
    CHECK_EQ(kvp_meta_inventory(m, inventory_lineage, buf), 0);
    return buf;
}

/* Confirms key on rank with parent (NULL: none) and tokens t[0..nt). */
static inline int put_lin(struct kvp_ns *ns, uint32_t rank, const char *key, const char *parent,
                          const uint32_t *t, uint32_t nt)
{
    struct kvp_str k = K(key), par = parent ? K(parent) : (struct kvp_str){"", 0};
    int64_t p;
    if (kvp_meta_allocate(ns, rank, &k, 1, &p, NULL, NULL) != 0 || p < 0)
        return -1;
    struct kvp_confirm_opts co = {sizeof co, &par, &t, &nt};
    return kvp_meta_confirm_ex(ns, rank, &k, &p, 1, NULL, 0, &co, NULL);
}

/* Removes a directory and everything below it. */
static inline void rmrf(const char *dir)
{
    scratch_remove(dir);
}

#endif
