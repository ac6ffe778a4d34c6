/*
 * pagefile_test.h — small helpers shared by the test_pagefile*.c programs:
 * checks with a pass/fail count, a scratch directory on a real disk, an
 * in-memory model of a page file, and buffers for O_DIRECT.
 */
#ifndef KVPAGE_PAGEFILE_TEST_H
#define KVPAGE_PAGEFILE_TEST_H

#include <ftw.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "kvpage.h"
#include "pagefile/pf_internal.h"

static int pt_passed, pt_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            pt_passed++;                                                                           \
        } else {                                                                                   \
            pt_failed++;                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                                              \
        if (a_ == b_) {                                                                            \
            pt_passed++;                                                                           \
        } else {                                                                                   \
            pt_failed++;                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s == %s (%" PRId64 " != %" PRId64 ")\n", __FILE__,       \
                    __LINE__, #a, #b, a_, b_);                                                     \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (a_ && b_ && strcmp(a_, b_) == 0) {                                                     \
            pt_passed++;                                                                           \
        } else {                                                                                   \
            pt_failed++;                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s\n  got      \"%s\"\n  expected \"%s\"\n", __FILE__,    \
                    __LINE__, #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                         \
        }                                                                                          \
    } while (0)

static inline int pt_finish(void)
{
    printf("%d passed, %d failed\n", pt_passed, pt_failed);
    return pt_failed != 0;
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

/* Not /tmp when it is tmpfs: O_DIRECT needs a real file system. */
static inline void pt_mkdir(const char *name)
{
    const char *base = getenv("KVP_TEST_DIR");
    struct statfs sf;
    if (!base)
        base = (statfs("/tmp", &sf) == 0 && sf.f_type != TMPFS_MAGIC) ? "/tmp" : "/var/tmp";
    snprintf(pt_dir, sizeof pt_dir, "%s/kvp_%s_XXXXXX", base, name);
    if (!mkdtemp(pt_dir)) {
        perror("mkdtemp");
        exit(2);
    }
    if (pt_usrbio()) {
        setenv("KVPAGE_USRBIO_EMU_MOUNT", pt_dir, 1);
        setenv("KVPAGE_USRBIO", "0", 1);
        setenv("KVPAGE_USRBIO_EMU_REG_RESULT", "dup", 1); /* as 3FS's hf3fs_reg_fd */
    }
}

static inline void pt_path(char *out, size_t cap, const char *file)
{
    snprintf(out, cap, "%s/%s", pt_dir, file);
}

static inline int pt_rm_one(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
    remove(p);
    return 0;
}

static inline void pt_rmdir(void)
{
    nftw(pt_dir, pt_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- randomness (deterministic per seed, thread-local state) --------------- */

static inline uint64_t pt_rand(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t pt_below(uint64_t *s, uint64_t n)
{
    return n ? pt_rand(s) % n : 0;
}

static inline void pt_fill(uint64_t *s, void *buf, size_t len)
{
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = pt_rand(s);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = pt_rand(s);
    for (; i < len; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

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
    fprintf(stderr, "FAIL %s: open %s: %d %s\n", what, path, rc, err.msg);
    pt_failed++;
    return NULL;
}

__attribute__((unused)) static const int pt_backends[] = {
    KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_BACKEND_USRBIO};
/* USRBIO (the last) only with the emulation: pt_usrbio() */
#define PT_NBACKENDS (pt_usrbio() ? 3 : 2)

#endif
