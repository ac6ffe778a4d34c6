/*
 * test_pagefile_roundtrip — random batches of writes and reads against an
 * in-memory model of the file: both backends, buffered and O_DIRECT, with
 * and without registered buffers, psync with pieces smaller than a page, and
 * KVP_PAGEFILE_MMAP_READS (reads copied out of a mapping), including pages
 * that left the page cache, which it reads with pread.
 */
#include <fcntl.h>

#include "pagefile_test.h"

#define FILE_SIZE (24u << 20)
#define BPP (256u << 10)
#define ENTRIES 8
#define BATCHES 150

struct config {
    const char *name;
    int backend;
    uint32_t flags;
    int register_bufs;
    uint64_t chunk;
};

static unsigned char *model;

static int overlaps(const struct kvp_pagefile_op *ops, size_t n, int64_t off, uint64_t size)
{
    for (size_t i = 0; i < n; i++)
        if (off < ops[i].offset + (int64_t)ops[i].size && ops[i].offset < off + (int64_t)size)
            return 1;
    return 0;
}

static void run_config(const struct config *c, uint64_t seed)
{
    char path[600];
    pt_path(path, sizeof path, c->name);
    unlink(path);
    struct kvp_pagefile_opts o =
        pt_opts(FILE_SIZE, BPP, ENTRIES, KVP_PAGEFILE_CREATE | c->flags, c->backend);
    o.chunk_bytes = c->chunk;
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, c->name);
    if (!pf)
        return;
    memset(model, 0, FILE_SIZE);
    const int direct = (c->flags & KVP_PAGEFILE_DIRECT) != 0;
    const uint64_t al = direct ? kvp_pagefile_direct_offset_align(pf) : 1;
    const size_t slot = BPP + 4096;
    unsigned char *pool = pt_alloc(slot * ENTRIES);
    if (c->register_bufs) {
        struct kvp_pagefile_buf b = {pool, slot * ENTRIES};
        CHECK_EQ(kvp_pagefile_register_buffers(pf, &b, 1, NULL), 0);
    }
    struct kvp_pagefile_op ops[ENTRIES];
    int64_t res[ENTRIES];
    struct kvp_error err;
    int bad_batches = 0;
    for (int it = 0; it < BATCHES; it++) {
        int write = pt_below(&seed, 2);
        size_t want = 1 + pt_below(&seed, ENTRIES), n = 0;
        for (size_t k = 0; k < want; k++) {
            for (int attempt = 0; attempt < 10; attempt++) {
                uint64_t size, off;
                uint64_t kind = pt_below(&seed, 4);
                if (kind == 0)
                    size = BPP;
                else if (kind == 1)
                    size = 1 + pt_below(&seed, 8192);
                else
                    size = 1 + pt_below(&seed, BPP);
                if (direct)
                    size = (size + al - 1) / al * al;
                if (pt_below(&seed, 2))
                    off = pt_below(&seed, FILE_SIZE / BPP) * BPP;
                else
                    off = pt_below(&seed, FILE_SIZE - size + 1);
                off = off / al * al;
                if (off + size > FILE_SIZE)
                    off = FILE_SIZE - size;
                /* Concurrent ops of one batch have no order: only reads may overlap. */
                if (write && overlaps(ops, n, (int64_t)off, size))
                    continue;
                uint64_t shift = direct ? 0 : pt_below(&seed, 64);
                ops[n] = (struct kvp_pagefile_op){(int64_t)off, pool + n * slot + shift, size};
                n++;
                break;
            }
        }
        memset(&err, 0, sizeof err);
        if (write) {
            for (size_t i = 0; i < n; i++)
                pt_fill(&seed, ops[i].buf, ops[i].size);
            int rc = kvp_pagefile_write(pf, ops, n, res, &err);
            CHECK_EQ(rc, 0);
            for (size_t i = 0; i < n; i++) {
                CHECK_EQ(res[i], (int64_t)ops[i].size);
                memcpy(model + ops[i].offset, ops[i].buf, ops[i].size);
            }
        } else {
            for (size_t i = 0; i < n; i++)
                memset(ops[i].buf, 0x5A, ops[i].size);
            int rc = kvp_pagefile_read(pf, ops, n, res, &err);
            CHECK_EQ(rc, 0);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                CHECK_EQ(res[i], (int64_t)ops[i].size);
                if (memcmp(ops[i].buf, model + ops[i].offset, ops[i].size) != 0)
                    bad++;
            }
            CHECK_EQ(bad, 0);
            bad_batches += bad != 0;
        }
        if (bad_batches > 3) /* enough to diagnose */
            break;
    }
    /* The whole file, page by page, equals the model. */
    int mismatch = 0;
    for (uint64_t off = 0; off < FILE_SIZE; off += BPP * ENTRIES) {
        size_t n = 0;
        for (; n < ENTRIES && off + n * BPP < FILE_SIZE; n++)
            ops[n] = (struct kvp_pagefile_op){(int64_t)(off + n * BPP), pool + n * slot, BPP};
        CHECK_EQ(kvp_pagefile_read(pf, ops, n, res, NULL), 0);
        for (size_t i = 0; i < n; i++)
            mismatch += memcmp(ops[i].buf, model + ops[i].offset, BPP) != 0;
    }
    CHECK_EQ(mismatch, 0);
    CHECK_EQ(kvp_pagefile_flush(pf, NULL), 0);
    kvp_pagefile_close(pf);
    free(pool);
    printf("%s: %s\n", c->name, bad_batches || mismatch ? "MISMATCH" : "ok");
}

static int64_t eio_hook(void *arg, int site, int64_t offset, uint64_t len)
{
    (void)arg, (void)offset, (void)len;
    return site == KVP__PF_PREAD ? -EIO : 0;
}

/* KVP_PAGEFILE_MMAP_READS beyond the random round trips. */
static void mmap_reads_specifics(void)
{
    char path[600];
    pt_path(path, sizeof path, "mmap_specifics");
    unlink(path);
    struct kvp_error err;
    struct kvp_pagefile *pf = NULL;
    struct kvp_pagefile_opts o = pt_opts(
        4u << 20, BPP, ENTRIES, KVP_PAGEFILE_CREATE | KVP_PAGEFILE_MMAP_READS | KVP_PAGEFILE_DIRECT,
        KVP_PAGEFILE_BACKEND_AUTO);
    /* Refused with O_DIRECT and with io_uring asked for: nothing created. */
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &err), -EINVAL);
    CHECK(strstr(err.msg, "KVP_PAGEFILE_MMAP_READS is for buffered reads") != NULL);
    o.flags &= ~KVP_PAGEFILE_DIRECT;
    o.backend = KVP_PAGEFILE_BACKEND_URING;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &err), -EINVAL);
    CHECK(strstr(err.msg, "copies on the psync threads") != NULL);
    CHECK(access(path, F_OK) != 0);

    o.backend = KVP_PAGEFILE_BACKEND_AUTO;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &err), 0);
    if (!pf)
        return;
    CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_PSYNC);
    CHECK(strstr(kvp_pagefile_backend_note(pf), "mmap reads") != NULL);
    unsigned char *src = pt_alloc(BPP), *dst = pt_alloc(BPP + 64);
    uint64_t seed = 77;
    pt_fill(&seed, src, BPP);
    struct kvp_pagefile_op w = {3 * BPP, src, BPP}, r = {3 * BPP, dst + 7, BPP};
    int64_t res;
    CHECK_EQ(kvp_pagefile_write(pf, &w, 1, &res, NULL), 0);
    CHECK_EQ(kvp_pagefile_flush(pf, NULL), 0);

    /* Pages out of the page cache are read with pread, and read right. */
    int fd = open(path, O_RDONLY);
    CHECK_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    uint64_t copies = kvp__pf_map_copies();
    memset(dst, 0, BPP + 64);
    CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, NULL), 0);
    CHECK_EQ(res, BPP);
    CHECK(memcmp(dst + 7, src, BPP) == 0);
    /* (Under memory pressure the kernel may drop fewer; then the copy is counted.) */
    printf("mmap_specifics: after DONTNEED, %s\n",
           kvp__pf_map_copies() == copies ? "read with pread" : "still cached");
    /* Now cached again: copied out of the mapping. */
    copies = kvp__pf_map_copies();
    memset(dst, 0, BPP + 64);
    CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, NULL), 0);
    CHECK(memcmp(dst + 7, src, BPP) == 0);
    CHECK_EQ(kvp__pf_map_copies(), copies + 1);
    close(fd);

    /* A write through the handle is seen by the next read (one page cache). */
    pt_fill(&seed, src, BPP);
    CHECK_EQ(kvp_pagefile_write(pf, &w, 1, &res, NULL), 0);
    CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, NULL), 0);
    CHECK(memcmp(dst + 7, src, BPP) == 0);

    /* Fault injection still reaches reads: they take pread under a hook. */
    kvp__pagefile_set_fault(eio_hook, NULL);
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, &err), -EIO);
    CHECK_EQ(res, -EIO);
    kvp__pagefile_set_fault(NULL, NULL);
    CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, NULL), 0);
    kvp_pagefile_close(pf);

    /* Read-only handles map too. */
    o.flags = KVP_PAGEFILE_READONLY | KVP_PAGEFILE_MMAP_READS;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &err), 0);
    if (pf) {
        memset(dst, 0, BPP + 64);
        copies = kvp__pf_map_copies();
        CHECK_EQ(kvp_pagefile_read(pf, &r, 1, &res, NULL), 0);
        CHECK(memcmp(dst + 7, src, BPP) == 0);
        CHECK_EQ(kvp__pf_map_copies(), copies + 1);
        kvp_pagefile_close(pf);
    }
    free(src);
    free(dst);
}

int main(void)
{
    pt_mkdir("roundtrip");
    model = malloc(FILE_SIZE);
    const struct config configs[] = {
        {"psync_buffered", KVP_PAGEFILE_BACKEND_PSYNC, 0, 0, 0},
        {"psync_buffered_small_pieces", KVP_PAGEFILE_BACKEND_PSYNC, 0, 0, 20000},
        {"psync_direct", KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_DIRECT, 0, 64 << 10},
        {"uring_buffered", KVP_PAGEFILE_BACKEND_URING, 0, 0, 0},
        {"uring_buffered_registered", KVP_PAGEFILE_BACKEND_URING, 0, 1, 0},
        {"uring_direct", KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_DIRECT, 0, 0},
        {"uring_direct_registered", KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_DIRECT, 1, 0},
        {"auto_buffered", KVP_PAGEFILE_BACKEND_AUTO, 0, 0, 0},
        {"auto_direct", KVP_PAGEFILE_BACKEND_AUTO, KVP_PAGEFILE_DIRECT, 1, 0},
        {"mmap_reads", KVP_PAGEFILE_BACKEND_AUTO, KVP_PAGEFILE_MMAP_READS, 0, 0},
        {"mmap_reads_psync_small_pieces", KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_MMAP_READS, 0,
         20000},
        /* the last three only with the USRBIO emulation (pt_usrbio) */
        {"usrbio_buffered", KVP_PAGEFILE_BACKEND_USRBIO, 0, 0, 0},
        {"usrbio_buffered_registered", KVP_PAGEFILE_BACKEND_USRBIO, 0, 1, 0},
        {"usrbio_direct", KVP_PAGEFILE_BACKEND_USRBIO, KVP_PAGEFILE_DIRECT, 0, 0},
    };
    size_t nconfigs = sizeof configs / sizeof configs[0] - (pt_usrbio() ? 0 : 3);
    for (size_t i = 0; i < nconfigs; i++) {
        uint64_t copies = kvp__pf_map_copies();
        run_config(&configs[i], 1000 + i);
        /* Only the mmap configurations copy out of a mapping, and they do. */
        if (configs[i].flags & KVP_PAGEFILE_MMAP_READS)
            CHECK(kvp__pf_map_copies() > copies);
        else
            CHECK_EQ(kvp__pf_map_copies(), copies);
    }
    mmap_reads_specifics();
    free(model);
    pt_rmdir();
    return pt_finish();
}
