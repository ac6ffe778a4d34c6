/*
 * pf_count.c — a page-I/O backend for the tests: it counts what the front
 * end hands it (pf_count.h) and has psync do the work, psync's state inside
 * its own. It is in the table by one row of src/pagefile/pf_backends.def,
 * KVP__PF_TEST_ROW(kvp__pf_count), built into kvpage_internal only (CMake
 * option KVP_TEST_BACKENDS), never into libkvpage.so. The test_pf_count_*
 * programs run existing suites over it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "pagefile/pf_internal.h"
#include "pf_count.h"

extern const struct kvp__pf_backend kvp__pf_psync; /* what does the work */

struct kvp__pf_counts kvp__pf_counts;

struct pfc_state {
    void *psync; /* psync's state for the handle */
};

static int pfc_start(struct kvp_pagefile *pf, void **state, char *why, size_t whylen)
{
    struct pfc_state *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    int rc = kvp__pf_psync.start(pf, &s->psync, why, whylen);
    if (rc != 0) {
        free(s);
        return rc;
    }
    atomic_fetch_add(&kvp__pf_counts.started, 1);
    *state = s;
    return 0;
}

static void pfc_stop(struct kvp_pagefile *pf, void *state)
{
    struct pfc_state *s = state;
    kvp__pf_psync.stop(pf, s->psync);
    free(s);
    atomic_fetch_add(&kvp__pf_counts.stopped, 1);
}

static void pfc_run(struct kvp_pagefile *pf, void *state, struct kvp__pf_batch *b)
{
    struct pfc_state *s = state;
    int w = b->write ? 1 : 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < b->n; i++)
        bytes += b->ops[i].size;
    atomic_fetch_add(&kvp__pf_counts.batches[w], 1);
    atomic_fetch_add(&kvp__pf_counts.ops[w], b->n);
    atomic_fetch_add(&kvp__pf_counts.bytes[w], bytes);
    if (b->vec)
        atomic_fetch_add(&kvp__pf_counts.vec_batches, 1);
    kvp__pf_psync.run(pf, s->psync, b);
}

static void pfc_info(const struct kvp_pagefile *pf, void *state, struct kvp_pagefile_info *info)
{
    struct pfc_state *s = state;
    kvp__pf_psync.info(pf, s->psync, info);
}

const struct kvp__pf_backend kvp__pf_count = {
    .id = KVP__PF_COUNT_ID,
    .name = "count",
    .description = "a test backend: counts the batches, psync does them",
    .what = NULL,                               /* there whenever psync is */
    .auto_for = 0,                              /* never AUTO's choice: only when asked for */
    .caps = KVP__PF_CAP_VEC | KVP__PF_CAP_XFER, /* psync's */
    .start = pfc_start,
    .stop = pfc_stop,
    .run = pfc_run,
    .info = pfc_info,
};
