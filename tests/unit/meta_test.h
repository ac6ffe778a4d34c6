/*
 * meta_test.h — helpers shared by the tests of src/meta (test_meta.c,
 * test_persist.c, test_powerloss.c): a namespace by name, a key from a C
 * string, one key allocated and confirmed, the invariant checker as a check,
 * and removing a data directory.
 */
#ifndef KVPAGE_META_TEST_H
#define KVPAGE_META_TEST_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/meta.h"

/* The namespace (created when missing), or NULL. */
static inline struct kvp_ns *ns_of(struct kvp_meta *m, const char *dep, const char *pool)
{
    struct kvp_ns *ns = NULL;
    kvp_meta_ns(m, dep, strlen(dep), pool, strlen(pool), 1, &ns, NULL);
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

/* Removes a directory and the files in it (the tests' data directories are flat). */
static inline void rmrf(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

#endif
