/*
 * pagefile_test.h — small helpers shared by the test_pagefile*.c programs:
 * check.h's checks, a scratch directory on a real disk, rng.h's random
 * numbers, buffers for O_DIRECT, options and opening.
 */
#ifndef KVPAGE_PAGEFILE_TEST_H
#define KVPAGE_PAGEFILE_TEST_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvpage.h"
#include "pagefile/pf_internal.h"
#include "rng.h"
#include "scratch.h"

/* The checks are check.h's; these names stay for the page-file tests. */
#define pt_passed check_passed
#define pt_failed check_failed

static inline int pt_finish(void)
{
    return check_report();
}

/* ---- scratch directory ---------------------------------------------------- */

static char pt_dir[512];

/*
 * 1 when the USRBIO backend is tested too: KVPAGE_USRBIO_LIB names the
 * emulation of 3FS's library (tests/usrbio_emu; CMake sets it for the
 * page-file and store tests). pt_mkdir then makes the scratch directory the
 * emulated 3FS mount, and sets KVPAGE_USRBIO=0 so that AUTO chooses as it
 * does without 3FS (test_pagefile_usrbio tests AUTO's choice of USRBIO).
 */
static inline int pt_usrbio(void)
{
    const char *lib = getenv("KVPAGE_USRBIO_LIB");
    return lib && *lib;
}

/* On a real disk: O_DIRECT refuses tmpfs. */
static inline void pt_mkdir(const char *name)
{
    scratch_make(pt_dir, sizeof pt_dir, name, 1);
    if (pt_usrbio())
        scratch_usrbio_mount(pt_dir, 1);
}

static inline void pt_path(char *out, size_t cap, const char *file)
{
    snprintf(out, cap, "%s/%s", pt_dir, file);
}

static inline void pt_rmdir(void)
{
    scratch_remove(pt_dir);
}

/* ---- randomness: rng.h's generator under the page-file tests' names ------- */

#define pt_rand rng_next
#define pt_below rng_below
#define pt_fill rng_fill

/* ---- buffers ---------------------------------------------------------------- */

static inline void *pt_alloc(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(p, 0, len);
    return p;
}

/* ---- options ---------------------------------------------------------------- */

/*
 * Options with integrity tags off (KVP_PAGEFILE_NO_TAGS): these tests model
 * a page file as arbitrary byte ranges (a write then a read of part of it,
 * random offsets), which tags reject by design; test_pagefile_tags.c tests
 * the tags on every backend. pt_tags_opts: the same with tags on.
 */
static inline struct kvp_pagefile_opts pt_tags_opts(uint64_t size, uint64_t bpp, uint32_t entries,
                                                    uint32_t flags, int backend)
{
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.size = size;
    o.bytes_per_page = bpp;
    o.entries = entries;
    o.flags = flags;
    o.backend = backend;
    return o;
}

static inline struct kvp_pagefile_opts pt_opts(uint64_t size, uint64_t bpp, uint32_t entries,
                                               uint32_t flags, int backend)
{
    return pt_tags_opts(size, bpp, entries, flags | KVP_PAGEFILE_NO_TAGS, backend);
}

/*
 * Opens with the given options; on a refusal the test cannot help (O_DIRECT
 * on tmpfs, io_uring forbidden) prints a SKIP line and returns NULL.
 */
static inline struct kvp_pagefile *
pt_open_or_skip(const char *path, const struct kvp_pagefile_opts *o, const char *what)
{
    struct kvp_pagefile *pf = NULL;
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    int rc = kvp_pagefile_open(path, o, &pf, &err);
    if (rc == 0)
        return pf;
    if (rc == -EINVAL && (o->flags & KVP_PAGEFILE_DIRECT) && err.rule == KVP_RULE_IO) {
        printf("SKIP %s: O_DIRECT refused here (%s)\n", what, err.msg);
        return NULL;
    }
    if (o->backend == KVP_PAGEFILE_BACKEND_URING) {
        printf("SKIP %s: io_uring unavailable (%s)\n", what, err.msg);
        return NULL;
    }
    check_fail("FAIL %s: open %s: %d %s", what, path, rc, err.msg);
    return NULL;
}

__attribute__((unused)) static const int pt_backends[] = {
    KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_BACKEND_USRBIO};
/* USRBIO (the last) only with the emulation: pt_usrbio() */
#define PT_NBACKENDS (pt_usrbio() ? 3 : 2)

/* fn(backend, flags, name) for each backend buffered and with O_DIRECT, in
 * this order; USRBIO only with the emulation. */
static inline void pt_each_mode(void (*fn)(int backend, uint32_t flags, const char *name))
{
    static const struct {
        int backend;
        uint32_t flags;
        const char *name;
    } modes[] = {
        {KVP_PAGEFILE_BACKEND_PSYNC, 0, "psync_buffered"},
        {KVP_PAGEFILE_BACKEND_URING, 0, "uring_buffered"},
        {KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_DIRECT, "psync_direct"},
        {KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_DIRECT, "uring_direct"},
        {KVP_PAGEFILE_BACKEND_USRBIO, 0, "usrbio_buffered"},
        {KVP_PAGEFILE_BACKEND_USRBIO, KVP_PAGEFILE_DIRECT, "usrbio_direct"},
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (modes[i].backend != KVP_PAGEFILE_BACKEND_USRBIO || pt_usrbio())
            fn(modes[i].backend, modes[i].flags, modes[i].name);
}

#endif
