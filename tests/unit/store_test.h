/*
 * store_test.h — helpers shared by the store's tests (test_store.c,
 * test_store_tags.c): a key from a C string, and the store's figures as a
 * check.
 */
#ifndef KVP_STORE_TEST_H
#define KVP_STORE_TEST_H

#include <string.h>

#include "check.h"
#include "kvpage/store.h"

static inline struct kvp_str S(const char *s) {
    return (struct kvp_str){s, strlen(s)};
}

/* The figures of s in *st; one check: they could be read. */
static inline void
get_stats(struct kvp_store *s, struct kvp_store_stats *st)
{
    memset(st, 0, sizeof *st);
    st->stats_size = sizeof *st;
    CHECK_EQ(kvp_store_stats(s, st, NULL), 0);
}

#endif
