/*
 * tests/install/meta_check.h — the metadata half of the install test's
 * programs (hello.c through pkg-config, cxx/hello.cpp through find_package),
 * in the common subset of C11 and C++17: an in-memory store, one namespace,
 * one rank; two keys are allocated and confirmed, then asked for with a third.
 */
#ifndef KVP_INSTALL_META_CHECK_H
#define KVP_INSTALL_META_CHECK_H

#include <stdio.h>
#include <string.h>

#include <kvpage.h>

/* Prints what failed and returns 1. */
static int install_fail(const char *what, int rc, const struct kvp_error *err)
{
    printf("FAIL %s: %d (%s)%s%s\n", what, rc, kvp_strerror(rc), err && err->msg[0] ? ": " : "",
           err ? err->msg : "");
    return 1;
}

static int meta_steps(struct kvp_meta *m)
{
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    struct kvp_ns *ns = NULL;
    int rc = kvp_meta_ns(m, "hello", 5, "pool", 4, 1, &ns, &err);
    if (rc)
        return install_fail("kvp_meta_ns", rc, &err);
    rc = kvp_meta_init_rank(ns, 0, 4, &err);
    if (rc)
        return install_fail("kvp_meta_init_rank", rc, &err);

    const struct kvp_str keys[3] = {{"alpha", 5}, {"beta", 4}, {"gamma", 5}};
    int64_t pages[2] = {-1, -1};
    uint8_t existed[2] = {9, 9};
    rc = kvp_meta_allocate(ns, 0, keys, 2, pages, existed, &err);
    if (rc)
        return install_fail("kvp_meta_allocate", rc, &err);
    if (pages[0] < 0 || pages[0] >= 4 || pages[1] < 0 || pages[1] >= 4 || pages[0] == pages[1] ||
        existed[0] != 0 || existed[1] != 0) {
        printf("FAIL kvp_meta_allocate: pages %lld %lld existed %d %d (want two distinct pages "
               "in [0, 4), both new)\n",
               (long long)pages[0], (long long)pages[1], existed[0], existed[1]);
        return 1;
    }
    rc = kvp_meta_confirm(ns, 0, keys, pages, 2, NULL, 0, &err);
    if (rc)
        return install_fail("kvp_meta_confirm", rc, &err);

    uint8_t found[3] = {9, 9, 9};
    rc = kvp_meta_exists(ns, -1, keys, 3, found, &err);
    if (rc)
        return install_fail("kvp_meta_exists", rc, &err);
    if (found[0] != 1 || found[1] != 1 || found[2] != 0) {
        printf("FAIL kvp_meta_exists: %d %d %d (want 1 1 0)\n", found[0], found[1], found[2]);
        return 1;
    }
    if (kvp_meta_nranks(ns) != 1) {
        printf("FAIL kvp_meta_nranks: %zu (want 1)\n", kvp_meta_nranks(ns));
        return 1;
    }
    return 0;
}

/* 0 and an "ok" line naming the program, or 1 and a "FAIL" line. */
static int meta_check(const char *program)
{
    struct kvp_meta_opts opts;
    kvp_meta_opts_init(&opts); /* data_dir NULL: in memory only */
    struct kvp_meta *m = NULL;
    int rc = kvp_meta_open(&opts, &m);
    if (rc)
        return install_fail("kvp_meta_open", rc, NULL);
    rc = meta_steps(m);
    kvp_meta_close(m);
    if (rc == 0)
        printf("ok %s meta: allocate, confirm and exists on an in-memory store\n", program);
    return rc;
}

#endif
