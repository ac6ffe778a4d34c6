/*
 * pf_count_suite.h — runs an existing page-file suite of tests/unit over
 * the counting backend (pf_count.c): every open of the suite that asks for
 * psync gets the counting backend instead, which has psync do the work, so
 * the suite's checks hold as they are; then pfc_report checks that the
 * backend was handed the batches. A test_pf_count_*.c includes this, then
 * the suite's .c with its main renamed:
 *
 *     #include "pf_count_suite.h"
 *     #define main pfc_suite_main
 *     #include "test_pagefile_tags.c"
 *     #undef main
 *     int main(void) { return pfc_report(pfc_suite_main()); }
 */
#ifndef KVPAGE_TEST_PF_COUNT_SUITE_H
#define KVPAGE_TEST_PF_COUNT_SUITE_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kvpage/pagefile.h"
#include "pf_count.h"

static uint64_t pfc_opens; /* the suite's opens moved to the counting backend */

/* kvp_pagefile_open with backend PSYNC asked for as the counting backend. */
static int pfc_open(const char *path, const struct kvp_pagefile_opts *opts,
                    struct kvp_pagefile **out, struct kvp_error *err)
{
    struct kvp_pagefile_opts o;
    if (opts && opts->opts_size <= sizeof o &&
        opts->opts_size >= offsetof(struct kvp_pagefile_opts, backend) + sizeof o.backend &&
        opts->backend == KVP_PAGEFILE_BACKEND_PSYNC) {
        memset(&o, 0, sizeof o);
        memcpy(&o, opts, opts->opts_size);
        o.backend = KVP__PF_COUNT_ID;
        opts = &o;
        pfc_opens++;
    }
    return kvp_pagefile_open(path, opts, out, err);
}
#define kvp_pagefile_open pfc_open

#define PFC_EXPECT(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            bad++;                                                                                 \
        }                                                                                          \
    } while (0)

/* The suite's exit status, or 1 when the counting backend was not what ran
 * its psync handles: each open moved to it started it once and stopped it
 * once, and it was handed read and write batches. */
static int pfc_report(int suite_rc)
{
    const struct kvp__pf_counts *c = &kvp__pf_counts;
    int bad = 0;
    PFC_EXPECT(pfc_opens > 0);
    PFC_EXPECT(c->started > 0 && c->started <= pfc_opens);
    PFC_EXPECT(c->stopped == c->started);
    PFC_EXPECT(c->batches[0] > 0 && c->ops[0] >= c->batches[0] && c->bytes[0] > 0);
    PFC_EXPECT(c->batches[1] > 0 && c->ops[1] >= c->batches[1] && c->bytes[1] > 0);
    fprintf(stderr,
            "count backend: %llu opens, %llu started, %llu stopped; read %llu batches, %llu ops, "
            "%llu bytes; wrote %llu batches, %llu ops, %llu bytes; %llu vectored batches\n",
            (unsigned long long)pfc_opens, (unsigned long long)c->started,
            (unsigned long long)c->stopped, (unsigned long long)c->batches[0],
            (unsigned long long)c->ops[0], (unsigned long long)c->bytes[0],
            (unsigned long long)c->batches[1], (unsigned long long)c->ops[1],
            (unsigned long long)c->bytes[1], (unsigned long long)c->vec_batches);
    return suite_rc || bad ? 1 : 0;
}

#endif
