/*
 * test_pagefile_validate — opening, sizing, getters, and every batch
 * validation rule with its message, once per backend; after each rejected
 * batch no I/O happened and the handle still works.
 */
#include "pagefile_test.h"

#define GiB (1024ull * 1024 * 1024)
#define MiB (1024ull * 1024)

static struct kvp_error E;

static void reset_err(void)
{
    memset(&E, 0, sizeof E);
    E.index = -2;
}

/* The handle still reads and writes correctly, and the earlier page 0 content is intact. */
static void still_works(struct kvp_pagefile *pf, const char *page0, size_t len)
{
    char *buf = pt_alloc(len);
    int64_t res[2];
    struct kvp_pagefile_op op = {0, buf, len};
    CHECK_EQ(kvp_pagefile_read(pf, &op, 1, res, NULL), 0);
    CHECK_EQ(res[0], (int64_t)len);
    CHECK(memcmp(buf, page0, len) == 0);
    free(buf);
}

/* A rejected batch: -EINVAL (or code), the rule, the index, the exact message. */
static void expect_reject(struct kvp_pagefile *pf, int write, const struct kvp_pagefile_op *ops,
                          size_t n, int code, int rule, int64_t index, const char *msg)
{
    int64_t res[16];
    for (int i = 0; i < 16; i++)
        res[i] = 12345;
    reset_err();
    int rc =
        write ? kvp_pagefile_write(pf, ops, n, res, &E) : kvp_pagefile_read(pf, ops, n, res, &E);
    CHECK_EQ(rc, code);
    CHECK_EQ(E.code, code);
    CHECK_EQ(E.rule, rule);
    CHECK_EQ(E.index, index);
    if (msg)
        CHECK_STR(E.msg, msg);
    CHECK_EQ(res[0], 12345); /* results untouched: nothing ran */
    /* Same batch without an error struct: same code, no crash. */
    rc = write ? kvp_pagefile_write(pf, ops, n, res, NULL)
               : kvp_pagefile_read(pf, ops, n, res, NULL);
    CHECK_EQ(rc, code);
}

static void test_rules(int backend)
{
    char path[600];
    char name[32];
    snprintf(name, sizeof name, "rules_%s", kvp_pagefile_backend_name(backend));
    pt_path(path, sizeof path, name);
    /* 1 GiB sparse file, 2 MiB pages: the geometry of the message in the issue. */
    struct kvp_pagefile_opts o = pt_opts(GiB, 2 * MiB, 8, KVP_PAGEFILE_CREATE, backend);
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "validation rules");
    if (!pf)
        return;
    CHECK_EQ(kvp_pagefile_backend(pf, 0), backend);
    CHECK_EQ(kvp_pagefile_backend(pf, 1), backend);

    const size_t pg = 2 * MiB;
    char *page0 = pt_alloc(pg);
    char *buf = pt_alloc(pg);
    uint64_t seed = 7;
    pt_fill(&seed, page0, pg);
    int64_t res[16];
    struct kvp_pagefile_op w0 = {0, page0, pg};
    CHECK_EQ(kvp_pagefile_write(pf, &w0, 1, res, NULL), 0);
    CHECK_EQ(res[0], (int64_t)pg);

    /* Batches whose op 0 writes a marker page: if validation let any I/O through, page 1 changes.
     */
    char *marker = pt_alloc(pg);
    memset(marker, 0xAB, pg);
    struct kvp_pagefile_op ops[10];
    for (int i = 0; i < 10; i++)
        ops[i] = (struct kvp_pagefile_op){(int64_t)((uint64_t)(i + 1) * pg), marker, pg};

    /* n > entries */
    expect_reject(pf, 1, ops, 9, -EINVAL, KVP_RULE_TOO_MANY, -1,
                  "batch of 9 operations exceeds entries 8");
    CHECK_EQ(E.value, 9);
    CHECK_EQ(E.limit, 8);
    still_works(pf, page0, pg);

    /* negative offset */
    ops[3].offset = -4096;
    expect_reject(pf, 1, ops, 4, -EINVAL, KVP_RULE_OFFSET, 3, "op 3: offset -4096 is negative");
    CHECK_EQ(E.value, -4096);
    still_works(pf, page0, pg);

    /* beyond the end: the issue's own example */
    ops[3].offset = (int64_t)GiB;
    expect_reject(pf, 1, ops, 4, -EINVAL, KVP_RULE_OFFSET, 3,
                  "op 3: offset 1073741824 + size 2097152 exceeds file size 1073741824");
    CHECK_EQ(E.value, (int64_t)GiB);
    CHECK_EQ(E.limit, (int64_t)GiB);
    /* straddling the end, and offset + size overflowing int64 */
    ops[3].offset = (int64_t)(GiB - 4096);
    expect_reject(pf, 0, ops, 4, -EINVAL, KVP_RULE_OFFSET, 3,
                  "op 3: offset 1073737728 + size 2097152 exceeds file size 1073741824");
    ops[3].offset = INT64_MAX;
    ops[3].size = 4096;
    expect_reject(pf, 0, ops, 4, -EINVAL, KVP_RULE_OFFSET, 3, NULL);
    ops[3].size = UINT64_MAX;
    ops[3].offset = 0;
    expect_reject(pf, 0, ops, 4, -EINVAL, KVP_RULE_OFFSET, 3, NULL);
    /* the last page exactly fits */
    ops[3].offset = (int64_t)(GiB - pg);
    ops[3].size = pg;
    still_works(pf, page0, pg);

    /* size > bytes_per_page */
    ops[2].size = pg + 1;
    expect_reject(pf, 1, ops, 4, -EINVAL, KVP_RULE_SIZE, 2,
                  "op 2: size 2097153 exceeds bytes_per_page 2097152");
    CHECK_EQ(E.value, (int64_t)pg + 1);
    CHECK_EQ(E.limit, (int64_t)pg);
    ops[2].size = pg;
    still_works(pf, page0, pg);

    /* NULL buffer */
    ops[1].buf = NULL;
    expect_reject(pf, 0, ops, 4, -EINVAL, KVP_RULE_ARG, 1, "op 1: buffer is NULL for size 2097152");
    ops[1].buf = marker;
    /* NULL ops / results */
    reset_err();
    CHECK_EQ(kvp_pagefile_read(pf, NULL, 2, res, &E), -EINVAL);
    CHECK_EQ(E.rule, KVP_RULE_ARG);
    CHECK_STR(E.msg, "ops is NULL with n = 2");
    reset_err();
    CHECK_EQ(kvp_pagefile_write(pf, ops, 2, NULL, &E), -EINVAL);
    CHECK_STR(E.msg, "results is NULL with n = 2");
    reset_err();
    CHECK_EQ(kvp_pagefile_read(NULL, ops, 1, res, &E), -EINVAL);
    CHECK_STR(E.msg, "pagefile handle is NULL");
    /* an empty batch is fine (the reference rejected it) */
    CHECK_EQ(kvp_pagefile_read(pf, NULL, 0, NULL, NULL), 0);
    CHECK_EQ(kvp_pagefile_write(pf, ops, 0, res, NULL), 0);

    /* nothing above wrote the marker anywhere */
    struct kvp_pagefile_op r1 = {(int64_t)pg, buf, pg};
    CHECK_EQ(kvp_pagefile_read(pf, &r1, 1, res, NULL), 0);
    char *zero = pt_alloc(pg);
    CHECK(memcmp(buf, zero, pg) == 0);
    r1.offset = (int64_t)(4 * pg);
    CHECK_EQ(kvp_pagefile_read(pf, &r1, 1, res, NULL), 0);
    CHECK(memcmp(buf, zero, pg) == 0);

    /* a good batch of 8 then works and is read back */
    CHECK_EQ(kvp_pagefile_write(pf, ops, 8, res, &E), 0);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(res[i], (int64_t)pg);
    r1.offset = (int64_t)(8 * pg);
    CHECK_EQ(kvp_pagefile_read(pf, &r1, 1, res, NULL), 0);
    CHECK(memcmp(buf, marker, pg) == 0);
    CHECK_EQ(kvp_pagefile_flush(pf, &E), 0);
    kvp_pagefile_close(pf);

    /* KVP_PAGEFILE_ALIGNED: a page index passed as an offset is caught */
    o.flags = KVP_PAGEFILE_ALIGNED;
    pf = pt_open_or_skip(path, &o, "aligned");
    if (pf) {
        struct kvp_pagefile_op a[2] = {{0, buf, pg}, {5, buf, 4096}};
        expect_reject(pf, 0, a, 2, -EINVAL, KVP_RULE_ALIGN, 1,
                      "op 1: offset 5 is not a multiple of bytes_per_page 2097152 (a page index "
                      "passed as an offset?)");
        CHECK_EQ(E.limit, (int64_t)pg);
        a[1].offset = (int64_t)(5 * pg);
        a[1].buf = marker; /* not buf: the two reads of one batch must not share memory */
        CHECK_EQ(kvp_pagefile_read(pf, a, 2, res, &E), 0);
        still_works(pf, page0, pg);
        kvp_pagefile_close(pf);
    }

    /* O_DIRECT alignment: offset, size, buffer address */
    o.flags = KVP_PAGEFILE_DIRECT;
    pf = pt_open_or_skip(path, &o, "O_DIRECT alignment");
    if (pf) {
        uint32_t oa = kvp_pagefile_direct_offset_align(pf), ma = kvp_pagefile_direct_mem_align(pf);
        CHECK(oa >= 1 && (oa & (oa - 1)) == 0);
        CHECK(ma >= 1 && (ma & (ma - 1)) == 0);
        char msg[256];
        struct kvp_pagefile_op d[2] = {{0, buf, pg}, {(int64_t)oa + 1, buf, oa}};
        if (oa > 1) {
            snprintf(msg, sizeof msg,
                     "op 1: offset %u is not a multiple of %u, as O_DIRECT requires", oa + 1, oa);
            expect_reject(pf, 0, d, 2, -EINVAL, KVP_RULE_ALIGN, 1, msg);
            d[1].offset = oa;
            d[1].size = oa + 1;
            snprintf(msg, sizeof msg, "op 1: size %u is not a multiple of %u, as O_DIRECT requires",
                     oa + 1, oa);
            expect_reject(pf, 1, d, 2, -EINVAL, KVP_RULE_ALIGN, 1, msg);
            d[1].size = oa;
        }
        if (ma > 1) {
            d[1].buf = buf + 1;
            snprintf(msg, sizeof msg,
                     "op 1: buffer address %p is not aligned to %u bytes, as O_DIRECT requires",
                     (void *)(buf + 1), ma);
            expect_reject(pf, 0, d, 2, -EINVAL, KVP_RULE_ALIGN, 1, msg);
            d[1].buf = buf;
        }
        d[1].offset = (int64_t)(oa * 8);
        d[1].buf = marker; /* not buf: the two reads of one batch must not share memory */
        CHECK_EQ(kvp_pagefile_read(pf, d, 2, res, &E), 0);
        CHECK(memcmp(buf, page0, pg) == 0);
        still_works(pf, page0, pg);
        kvp_pagefile_close(pf);
    }

    /* read-only: writes are refused, reads work */
    o.flags = KVP_PAGEFILE_READONLY;
    pf = pt_open_or_skip(path, &o, "read-only");
    if (pf) {
        expect_reject(pf, 1, &w0, 1, -EBADF, KVP_RULE_ARG, -1,
                      "write on a handle opened with KVP_PAGEFILE_READONLY");
        still_works(pf, page0, pg);
        kvp_pagefile_close(pf);
    }
    free(page0);
    free(buf);
    free(marker);
    free(zero);
}

static void test_open(void)
{
    char path[600], sub[600];
    struct kvp_pagefile *pf = (struct kvp_pagefile *)1;
    struct kvp_pagefile_opts o = pt_opts(64 * MiB, MiB, 8, 0, KVP_PAGEFILE_BACKEND_PSYNC);
    pt_path(path, sizeof path, "open");

    reset_err();
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), -ENOENT); /* no CREATE */
    CHECK(pf == NULL);
    CHECK_EQ(E.rule, KVP_RULE_IO);
    CHECK(strstr(E.msg, "cannot open") != NULL);
    CHECK_EQ(kvp_pagefile_open(NULL, &o, &pf, &E), -EINVAL);
    CHECK_STR(E.msg, "path is NULL or empty");
    CHECK_EQ(kvp_pagefile_open(path, NULL, &pf, &E), -EINVAL);
    CHECK_EQ(E.rule, KVP_RULE_ARG);
    CHECK_EQ(kvp_pagefile_open(path, &o, NULL, &E), -EINVAL);
    struct kvp_pagefile_opts bad = o;
    bad.opts_size = 3;
    CHECK_EQ(kvp_pagefile_open(path, &bad, &pf, &E), -EINVAL);
    CHECK(strstr(E.msg, "opts_size 3 is unknown") != NULL);
    bad = o;
    bad.bytes_per_page = 0;
    CHECK_EQ(kvp_pagefile_open(path, &bad, &pf, &E), -EINVAL);
    CHECK_STR(E.msg, "bytes_per_page must be > 0");
    bad = o;
    bad.entries = 0;
    CHECK_EQ(kvp_pagefile_open(path, &bad, &pf, &E), -EINVAL);
    CHECK_STR(E.msg, "entries 0 is not in 1..1048576");
    bad = o;
    bad.flags = 0x100;
    CHECK_EQ(kvp_pagefile_open(path, &bad, &pf, &E), -EINVAL);
    CHECK_STR(E.msg, "unknown flags 0x100");
    bad = o;
    bad.backend = 7;
    CHECK_EQ(kvp_pagefile_open(path, &bad, &pf, &E), -EINVAL);
    CHECK_STR(E.msg, "unknown backend 7");

    /* CREATE alone refuses a missing directory, naming it, and makes nothing */
    snprintf(sub, sizeof sub, "%s/a/b/c/pages.bin", pt_dir);
    o.flags = KVP_PAGEFILE_CREATE;
    o.threads = 3;
    o.chunk_bytes = 300000; /* not a power of two: kept as asked for buffered I/O */
    reset_err();
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), -ENOENT);
    {
        char want[600], a[600];
        snprintf(want, sizeof want, "its directory %s/a/b/c does not exist", pt_dir);
        CHECK(strstr(E.msg, want) != NULL);
        snprintf(a, sizeof a, "%s/a", pt_dir);
        struct stat st;
        CHECK(stat(a, &st) != 0 && errno == ENOENT);
    }
    /* with MKDIR it makes the parent directories and a sparse file of size bytes */
    o.flags = KVP_PAGEFILE_CREATE | KVP_PAGEFILE_MKDIR;
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), 0);
    if (pf) {
        struct stat st;
        CHECK(stat(sub, &st) == 0 && (uint64_t)st.st_size == 64 * MiB);
        CHECK_STR(kvp_pagefile_path(pf), sub);
        CHECK_EQ(kvp_pagefile_size(pf), 64 * MiB);
        CHECK_EQ(kvp_pagefile_file_size(pf), 64 * MiB);
        CHECK_EQ(kvp_pagefile_bytes_per_page(pf), MiB);
        CHECK_EQ(kvp_pagefile_entries(pf), 8);
        CHECK_EQ(kvp_pagefile_flags(pf), KVP_PAGEFILE_CREATE | KVP_PAGEFILE_MKDIR);
        CHECK_EQ(kvp_pagefile_backend_requested(pf), KVP_PAGEFILE_BACKEND_PSYNC);
        CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_PSYNC);
        CHECK_EQ(kvp_pagefile_threads(pf), 3);
        CHECK_EQ(kvp_pagefile_queues(pf), 0);
        CHECK_EQ(kvp_pagefile_mode(pf), 0644);
        CHECK_EQ(kvp_pagefile_chunk_bytes(pf), 300000);
        CHECK_EQ(kvp_pagefile_direct_mem_align(pf), 1);
        CHECK_EQ(kvp_pagefile_direct_offset_align(pf), 1);
        CHECK_EQ(kvp_pagefile_registered_buffers(pf), 0);
        CHECK_STR(kvp_pagefile_backend_note(pf), "psync, as requested");
        CHECK_STR(kvp_pagefile_backend_name(KVP_PAGEFILE_BACKEND_URING), "uring");
        CHECK_STR(kvp_pagefile_backend_name(KVP_PAGEFILE_BACKEND_AUTO), "auto");
        CHECK_STR(kvp_pagefile_backend_name(9), "?");
        /* registering buffers with psync only is accepted and records nothing */
        char *b = pt_alloc(4096);
        struct kvp_pagefile_buf reg = {b, 4096};
        CHECK_EQ(kvp_pagefile_register_buffers(pf, &reg, 1, &E), 0);
        CHECK_EQ(kvp_pagefile_register_buffers(pf, NULL, 0, &E), -EINVAL);
        CHECK_EQ(kvp_pagefile_unregister_buffers(pf), 0);
        free(b);
        kvp_pagefile_close(pf);
    }

    /* reopening larger extends, never shrinks; a smaller size is accepted */
    o.size = 128 * MiB;
    o.flags = 0;
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_file_size(pf), 128 * MiB);
        kvp_pagefile_close(pf);
    }
    o.size = 32 * MiB;
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), 0);
    if (pf) {
        struct stat st;
        CHECK(stat(sub, &st) == 0 && (uint64_t)st.st_size == 128 * MiB);
        CHECK_EQ(kvp_pagefile_size(pf), 32 * MiB);
        CHECK_EQ(kvp_pagefile_file_size(pf), 128 * MiB);
        char *b = pt_alloc(MiB);
        int64_t r;
        struct kvp_pagefile_op op = {(int64_t)(32 * MiB), b, 1};
        reset_err();
        CHECK_EQ(kvp_pagefile_read(pf, &op, 1, &r, &E), -EINVAL); /* bound is our size */
        CHECK_STR(E.msg, "op 0: offset 33554432 + size 1 exceeds file size 33554432");
        free(b);
        kvp_pagefile_close(pf);
    }
    /* ... unless the caller insists on the exact size */
    o.flags = KVP_PAGEFILE_EXACT_SIZE;
    reset_err();
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), -EEXIST);
    char msg[800];
    snprintf(msg, sizeof msg,
             "%s is 134217728 bytes, larger than size 33554432; kvpage never shrinks a page file "
             "(the pages past 33554432 would be lost)",
             sub);
    msg[255] = '\0';
    CHECK_STR(E.msg, msg);
    CHECK_EQ(E.value, 128 * MiB);
    CHECK_EQ(E.limit, 32 * MiB);
    /* size 0: the existing file's size */
    o.flags = 0;
    o.size = 0;
    CHECK_EQ(kvp_pagefile_open(sub, &o, &pf, &E), 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_size(pf), 128 * MiB);
        kvp_pagefile_close(pf);
    }
    o.flags = KVP_PAGEFILE_CREATE;
    pt_path(path, sizeof path, "empty");
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), -EINVAL);
    CHECK(strstr(E.msg, "is empty") != NULL);
    /* a directory is not a page file */
    o.size = MiB;
    o.flags = KVP_PAGEFILE_READONLY;
    CHECK_EQ(kvp_pagefile_open(pt_dir, &o, &pf, &E), -EINVAL);
    CHECK(strstr(E.msg, "neither a regular file nor a block device") != NULL);
    kvp_pagefile_close(NULL);
    CHECK_EQ(kvp_pagefile_flush(NULL, NULL), -EINVAL);
}

static int64_t fail_init(void *arg, int site, int64_t off, uint64_t len)
{
    return site == KVP__PF_URING_INIT ? -EPERM : 0;
}

static void test_auto_and_fallback(void)
{
    char path[600];
    pt_path(path, sizeof path, "auto");
    struct kvp_pagefile_opts o =
        pt_opts(16 * MiB, MiB, 8, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_AUTO);
    struct kvp_pagefile *pf = NULL;
    reset_err();
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), 0);
    if (pf) {
        /* buffered: psync reads (copies on every core) and psync writes (on
         * the caller alone, the inode lock serializes them; bench/io); no
         * io_uring rings are set up */
        printf("auto buffered: %s\n", kvp_pagefile_backend_note(pf));
        CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_PSYNC);
        CHECK_EQ(kvp_pagefile_backend(pf, 1), KVP_PAGEFILE_BACKEND_PSYNC);
        CHECK(kvp_pagefile_threads(pf) > 0);
        CHECK_STR(kvp_pagefile_backend_note(pf),
                  "auto: psync reads, psync writes for buffered I/O (the faster per bench/io)");
        CHECK_EQ(kvp_pagefile_queues(pf), 0);
        kvp_pagefile_close(pf);
    }
    o.flags = KVP_PAGEFILE_DIRECT;
    pf = pt_open_or_skip(path, &o, "auto O_DIRECT");
    if (pf) {
        printf("auto O_DIRECT: %s\n", kvp_pagefile_backend_note(pf));
        CHECK(kvp_pagefile_backend(pf, 0) == KVP_PAGEFILE_BACKEND_URING ||
              strstr(kvp_pagefile_backend_note(pf), "io_uring is unavailable") != NULL);
        kvp_pagefile_close(pf);

        /* io_uring forbidden (as in many containers): auto falls back and says why */
        kvp__pagefile_set_fault(fail_init, NULL);
        CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), 0);
        if (pf) {
            CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_PSYNC);
            CHECK_EQ(kvp_pagefile_backend(pf, 1), KVP_PAGEFILE_BACKEND_PSYNC);
            CHECK_STR(kvp_pagefile_backend_note(pf),
                      "auto: io_uring is unavailable (io_uring_queue_init: Operation not "
                      "permitted, errno 1); using psync");
            CHECK(kvp_pagefile_threads(pf) >= 1);
            CHECK_EQ(kvp_pagefile_queues(pf), 0);
            char *b = pt_alloc(MiB);
            int64_t r;
            struct kvp_pagefile_op op = {0, b, MiB};
            CHECK_EQ(kvp_pagefile_write(pf, &op, 1, &r, NULL), 0);
            CHECK_EQ(kvp_pagefile_read(pf, &op, 1, &r, NULL), 0);
            free(b);
            kvp_pagefile_close(pf);
        }
        /* ... while asking for io_uring explicitly fails with the reason */
        o.backend = KVP_PAGEFILE_BACKEND_URING;
        reset_err();
        CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), -EPERM);
        CHECK(pf == NULL);
        CHECK_STR(E.msg, "io_uring is unavailable (io_uring_queue_init: Operation not permitted)");
        kvp__pagefile_set_fault(NULL, NULL);
    }
}

static void test_register(void)
{
    char path[600];
    pt_path(path, sizeof path, "reg");
    struct kvp_pagefile_opts o =
        pt_opts(16 * MiB, MiB, 8, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_URING);
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "register_buffers");
    if (!pf)
        return;
    CHECK_EQ(kvp_pagefile_queues(pf), 4);
    CHECK_EQ(kvp_pagefile_threads(pf), 0);
    char *pool = pt_alloc(4 * MiB);
    struct kvp_pagefile_buf regs[2] = {{pool, 2 * MiB}, {pool + 2 * MiB, 2 * MiB}};
    reset_err();
    CHECK_EQ(kvp_pagefile_register_buffers(pf, regs, 0, &E), -EINVAL);
    CHECK_STR(E.msg, "no buffers given");
    struct kvp_pagefile_buf badr[2] = {{pool, 4096}, {NULL, 4096}};
    CHECK_EQ(kvp_pagefile_register_buffers(pf, badr, 2, &E), -EINVAL);
    CHECK_EQ(E.index, 1);
    CHECK_STR(E.msg, "buffer 1 is NULL or empty");
    CHECK_EQ(kvp_pagefile_register_buffers(pf, regs, 2, &E), 0);
    CHECK_EQ(kvp_pagefile_registered_buffers(pf), 2);
    /* ops inside, straddling and outside the registered regions all work */
    char *outside = pt_alloc(MiB);
    uint64_t seed = 3;
    pt_fill(&seed, pool, 4 * MiB);
    pt_fill(&seed, outside, MiB);
    struct kvp_pagefile_op w[3] = {{0, pool, MiB},
                                   {(int64_t)MiB, pool + 2 * MiB - 4096, MiB},
                                   {(int64_t)(2 * MiB), outside, MiB}};
    int64_t res[3];
    CHECK_EQ(kvp_pagefile_write(pf, w, 3, res, &E), 0);
    char *back = pt_alloc(3 * MiB);
    struct kvp_pagefile_op r = {0, back, MiB};
    for (int i = 0; i < 3; i++) {
        r.offset = (int64_t)(i * MiB);
        CHECK_EQ(kvp_pagefile_read(pf, &r, 1, res, &E), 0);
        CHECK(memcmp(back, w[i].buf, MiB) == 0);
    }
    struct kvp_pagefile_op rr = {0, pool + MiB, MiB};
    CHECK_EQ(kvp_pagefile_read(pf, &rr, 1, res, &E), 0);
    CHECK(memcmp(pool + MiB, pool, MiB) == 0);
    CHECK_EQ(kvp_pagefile_unregister_buffers(pf), 0);
    CHECK_EQ(kvp_pagefile_registered_buffers(pf), 0);
    CHECK_EQ(kvp_pagefile_read(pf, &rr, 1, res, &E), 0);
    kvp_pagefile_close(pf);
    free(pool);
    free(outside);
    free(back);
}

/* kvp_pagefile_info answers what every getter answers, for a caller of any
 * layout size, and refuses a size smaller than the first layout. */
static void check_info(struct kvp_pagefile *pf)
{
    struct kvp_pagefile_info in;
    memset(&in, 0xab, sizeof in);
    in.info_size = sizeof in;
    CHECK_EQ(kvp_pagefile_info(pf, &in), 0);
    CHECK_EQ(in.info_size, sizeof in);
    CHECK_STR(in.path, kvp_pagefile_path(pf));
    CHECK_EQ(in.size, kvp_pagefile_size(pf));
    CHECK_EQ(in.file_size, kvp_pagefile_file_size(pf));
    CHECK_EQ(in.bytes_per_page, kvp_pagefile_bytes_per_page(pf));
    CHECK_EQ(in.chunk_bytes, kvp_pagefile_chunk_bytes(pf));
    CHECK_EQ(in.entries, kvp_pagefile_entries(pf));
    CHECK_EQ(in.flags, kvp_pagefile_flags(pf));
    CHECK_EQ(in.mode, kvp_pagefile_mode(pf));
    CHECK_EQ(in.backend_requested, kvp_pagefile_backend_requested(pf));
    CHECK_EQ(in.backend[0], kvp_pagefile_backend(pf, 0));
    CHECK_EQ(in.backend[1], kvp_pagefile_backend(pf, 1));
    CHECK_EQ(in.threads, kvp_pagefile_threads(pf));
    CHECK_EQ(in.queues, kvp_pagefile_queues(pf));
    CHECK_EQ(in.registered_buffers, kvp_pagefile_registered_buffers(pf));
    CHECK_EQ(in.direct_mem_align, kvp_pagefile_direct_mem_align(pf));
    CHECK_EQ(in.direct_offset_align, kvp_pagefile_direct_offset_align(pf));
    CHECK_STR(in.backend_note, kvp_pagefile_backend_note(pf));
    /* a caller whose struct is larger (a newer header) learns how much was filled */
    struct {
        struct kvp_pagefile_info in;
        char more[32];
    } big;
    memset(&big, 0x5a, sizeof big);
    big.in.info_size = sizeof big;
    CHECK_EQ(kvp_pagefile_info(pf, &big.in), 0);
    CHECK_EQ(big.in.info_size, sizeof big.in);
    CHECK_EQ(big.in.queues, in.queues);
    CHECK_EQ((unsigned char)big.more[0], 0x5a);
    /* too small, or no struct: -EINVAL, untouched */
    struct kvp_pagefile_info small;
    memset(&small, 0x11, sizeof small);
    small.info_size = offsetof(struct kvp_pagefile_info, backend_note);
    CHECK_EQ(kvp_pagefile_info(pf, &small), -EINVAL);
    CHECK_EQ((unsigned char)((char *)&small.path)[0], 0x11);
    CHECK_EQ(kvp_pagefile_info(pf, NULL), -EINVAL);
    CHECK_EQ(kvp_pagefile_info(NULL, &in), -EINVAL);
}

static void test_info(void)
{
    char path[600];
    pt_path(path, sizeof path, "info");
    for (int b = 0; b < PT_NBACKENDS; b++) {
        struct kvp_pagefile_opts o = pt_opts(16 * MiB, MiB, 8, KVP_PAGEFILE_CREATE, pt_backends[b]);
        struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "info");
        if (!pf)
            continue;
        check_info(pf);
        if (pt_backends[b] == KVP_PAGEFILE_BACKEND_URING) {
            char *pool = pt_alloc(2 * MiB);
            struct kvp_pagefile_buf reg = {pool, 2 * MiB};
            CHECK_EQ(kvp_pagefile_register_buffers(pf, &reg, 1, NULL), 0);
            struct kvp_pagefile_info in = {.info_size = sizeof in};
            CHECK_EQ(kvp_pagefile_info(pf, &in), 0);
            CHECK_EQ(in.registered_buffers, 1);
            CHECK_EQ(in.queues, 4);
            CHECK_EQ(in.threads, 0);
            CHECK_EQ(in.backend[1], KVP_PAGEFILE_BACKEND_URING);
            kvp_pagefile_close(pf);
            free(pool);
        } else if (pt_backends[b] == KVP_PAGEFILE_BACKEND_USRBIO) {
            struct kvp_pagefile_info in = {.info_size = sizeof in};
            CHECK_EQ(kvp_pagefile_info(pf, &in), 0);
            CHECK_EQ(in.threads, 0);
            CHECK_EQ(in.queues, 8); /* 4 rings (opts.queues 0) each way */
            CHECK_EQ(in.backend[0], KVP_PAGEFILE_BACKEND_USRBIO);
            kvp_pagefile_close(pf);
        } else {
            struct kvp_pagefile_info in = {.info_size = sizeof in};
            CHECK_EQ(kvp_pagefile_info(pf, &in), 0);
            CHECK(in.threads > 0);
            CHECK_EQ(in.queues, 0);
            CHECK_EQ(in.backend[0], KVP_PAGEFILE_BACKEND_PSYNC);
            kvp_pagefile_close(pf);
        }
    }
}

/* The VmFlags of the mapping that holds p (/proc/self/smaps), or "" if none. */
static void vm_flags(const void *p, char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, cap, "%s", line + 8);
            break;
        }
    }
    fclose(f);
}

/* kvp_pagefile_alloc: 2 MiB or more is 2 MiB aligned and asks for huge
 * pages (its mapping is marked "hg", MADV_HUGEPAGE), zeroed; less is not. */
static void test_alloc_huge_pages(void)
{
    char path[600];
    pt_path(path, sizeof path, "huge");
    struct kvp_pagefile_opts o =
        pt_opts(4 * MiB, MiB, 8, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_PSYNC);
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "alloc huge pages");
    if (!pf)
        return;
    reset_err();
    unsigned char *big = kvp_pagefile_alloc(pf, 6 * MiB + 4096, &E);
    CHECK(big != NULL);
    CHECK_EQ((uintptr_t)big % (2 * MiB), 0);
    int zero = 1;
    for (size_t i = 0; i < 6 * MiB + 4096; i += 4093)
        zero &= big[i] == 0;
    CHECK(zero);
    char flags[512];
    vm_flags(big, flags, sizeof flags);
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0)
        CHECK(strstr(flags, " hg") != NULL);
    else
        printf("SKIP huge pages: this kernel has no transparent huge pages\n");
    unsigned char *small = kvp_pagefile_alloc(pf, 64 * 1024, &E);
    CHECK(small != NULL && (uintptr_t)small % 4096 == 0);
    kvp_pagefile_free(pf, small);
    kvp_pagefile_free(pf, big);
    kvp_pagefile_close(pf);
}

int main(void)
{
    pt_mkdir("validate");
    test_open();
    for (int b = 0; b < PT_NBACKENDS; b++)
        test_rules(pt_backends[b]);
    test_auto_and_fallback();
    test_register();
    test_info();
    test_alloc_huge_pages();
    pt_rmdir();
    return pt_finish();
}
