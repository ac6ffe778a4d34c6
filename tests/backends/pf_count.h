/*
 * pf_count.h — the counting page-I/O backend of the tests (pf_count.c):
 * its id and what it counted, by every handle of the process.
 */
#ifndef KVPAGE_TEST_PF_COUNT_H
#define KVPAGE_TEST_PF_COUNT_H

#include <stdatomic.h>

/* Test backends take ids from 100: never a public KVP_PAGEFILE_BACKEND_*
 * (the next real backend takes the next public one), and never met by a
 * loop over the public ones, which stops at the first "?". */
#define KVP__PF_COUNT_ID 100

struct kvp__pf_counts {
    atomic_uint_fast64_t started, stopped; /* handles it was started and stopped for */
    atomic_uint_fast64_t batches[2];       /* [0] reads, [1] writes */
    atomic_uint_fast64_t ops[2], bytes[2]; /* the batches' operations and their sizes */
    atomic_uint_fast64_t vec_batches;      /* batches with vectored ops (b->vec) */
};

extern struct kvp__pf_counts kvp__pf_counts;

#endif
