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

/* Removes a directory and everything below it. */
static inline void rmrf(const char *dir)
{
    scratch_remove(dir);
}

#endif
