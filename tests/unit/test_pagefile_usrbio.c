/*
 * test_pagefile_usrbio — the USRBIO backend over the emulation of 3FS's
 * library (tests/usrbio_emu, found through KVPAGE_USRBIO_LIB, which CMake
 * sets; it aborts on any breach of the header's contract): AUTO's choice,
 * the errors when the library or the mount is missing, random round trips
 * against a model with batches larger than the staging ring, zero-copy
 * buffers, short and failed completions (the emulation's and the fault
 * hook's), early completions, fewer completions than ready, and 8 threads
 * on one handle.
 */
#include <pthread.h>
#include <sys/wait.h>

#include "pagefile_test.h"

#define BPP (64 * 1024)
#define NPAGES 64
#define FSIZE ((uint64_t)BPP * NPAGES)

static struct kvp_error E;

static struct kvp_pagefile *open_usrbio(const char *path, int backend, uint32_t entries,
                                        uint32_t flags, int *rc)
{
    struct kvp_pagefile_opts o = pt_opts(FSIZE, BPP, entries, KVP_PAGEFILE_CREATE | flags, backend);
    struct kvp_pagefile *pf = NULL;
    memset(&E, 0, sizeof E);
    *rc = kvp_pagefile_open(path, &o, &pf, &E);
    return pf;
}

/* n random ops over the file, checked against model (the file's bytes). */
static void round_trips(struct kvp_pagefile *pf, unsigned char *model, int rounds, uint32_t entries,
                        uint64_t seed)
{
    char *bufs = pt_alloc((size_t)entries * BPP);
    struct kvp_pagefile_op *ops = calloc(entries, sizeof *ops);
    int64_t *res = calloc(entries, sizeof *res);
    for (int r = 0; r < rounds; r++) {
        uint32_t n = 1 + (uint32_t)pt_below(&seed, entries);
        int write = (int)pt_below(&seed, 2);
        /* distinct pages per batch: the order inside a batch is unspecified */
        uint32_t used[NPAGES] = {0};
        for (uint32_t i = 0; i < n; i++) {
            uint32_t p;
            do
                p = (uint32_t)pt_below(&seed, NPAGES);
            while (used[p]);
            used[p] = 1;
            uint64_t sz = 1 + pt_below(&seed, BPP);
            ops[i] = (struct kvp_pagefile_op){(int64_t)p * BPP, bufs + (size_t)i * BPP, sz};
            if (write)
                pt_fill(&seed, ops[i].buf, sz);
            else
                memset(ops[i].buf, 0xee, sz);
        }
        int rc = write ? kvp_pagefile_write(pf, ops, n, res, &E)
                       : kvp_pagefile_read(pf, ops, n, res, &E);
        CHECK_EQ(rc, 0);
        for (uint32_t i = 0; i < n; i++) {
            CHECK_EQ(res[i], (int64_t)ops[i].size);
            if (write)
                memcpy(model + ops[i].offset, ops[i].buf, ops[i].size);
            else if (memcmp(ops[i].buf, model + ops[i].offset, ops[i].size) != 0) {
                CHECK(!"read back what the model holds");
                break;
            }
        }
    }
    free(bufs);
    free(ops);
    free(res);
}

static void test_errors_and_auto(void)
{
    char in[600], out[600];
    pt_path(in, sizeof in, "on3fs");
    snprintf(out, sizeof out, "%s/kvp_usrbio_outside_%d",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp", (int)getpid());
    int rc;
    /* AUTO on the mount: usrbio both ways, and the note says why */
    unsetenv("KVPAGE_USRBIO");
    struct kvp_pagefile *pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_AUTO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_USRBIO);
        CHECK_EQ(kvp_pagefile_backend(pf, 1), KVP_PAGEFILE_BACKEND_USRBIO);
        CHECK_STR(kvp_pagefile_backend_note(pf),
                  "auto: usrbio reads, usrbio writes (usrbio wants this file)");
        CHECK_EQ(kvp_pagefile_queues(pf), 8); /* 4 rings (opts.queues 0) each way */
        CHECK_STR(kvp_pagefile_backend_name(KVP_PAGEFILE_BACKEND_USRBIO), "usrbio");
        /* its memory moves without a copy (what bench io's pool asks) */
        struct kvp_pagefile_info inf = {.info_size = sizeof inf};
        CHECK_EQ(kvp_pagefile_info(pf, &inf), 0);
        CHECK_EQ(inf.alloc_zero_copy, 1);
        kvp_pagefile_close(pf);
    }
    /* KVPAGE_USRBIO=0 turns AUTO's choice off */
    setenv("KVPAGE_USRBIO", "0", 1);
    pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_AUTO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_backend(pf, 1), KVP_PAGEFILE_BACKEND_PSYNC);
        kvp_pagefile_close(pf);
    }
    unsetenv("KVPAGE_USRBIO");
    /* AUTO off the mount: as without 3FS */
    pf = open_usrbio(out, KVP_PAGEFILE_BACKEND_AUTO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_backend(pf, 0), KVP_PAGEFILE_BACKEND_PSYNC);
        struct kvp_pagefile_info inf = {.info_size = sizeof inf};
        CHECK_EQ(kvp_pagefile_info(pf, &inf), 0);
        CHECK_EQ(inf.alloc_zero_copy, 0);
        kvp_pagefile_close(pf);
    }
    unlink(out);
    /* USRBIO asked for off the mount: a clear error, and no file left */
    pf = open_usrbio(out, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
    CHECK_EQ(rc, -ENOTSUP);
    CHECK(pf == NULL);
    CHECK_EQ(E.rule, KVP_RULE_IO);
    char want[900];
    snprintf(want, sizeof want,
             "USRBIO is unavailable (%s is not on a 3FS mount (hf3fs_extract_mount_point))", out);
    CHECK_STR(E.msg, want);
    CHECK(access(out, F_OK) != 0);
    /* MMAP_READS copies on psync threads */
    pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_USRBIO, 8, KVP_PAGEFILE_MMAP_READS, &rc);
    CHECK_EQ(rc, -EINVAL);
    CHECK_EQ(E.rule, KVP_RULE_ARG);
}

/* The library missing: USRBIO names what it tried; AUTO goes on without it.
 * Run in a child: the process keeps a library once loaded. */
static void test_no_library(void)
{
    char in[600];
    pt_path(in, sizeof in, "nolib");
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KVPAGE_USRBIO_LIB", "/nonexistent/libhf3fs_api_shared.so", 1);
        unsetenv("KVPAGE_USRBIO");
        int rc, bad = 0;
        struct kvp_pagefile *pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
        bad |= rc != -ENOENT || pf != NULL;
        bad |= strstr(E.msg, "USRBIO is unavailable (cannot load "
                             "KVPAGE_USRBIO_LIB=/nonexistent/libhf3fs_api_shared.so: ") != E.msg;
        if (bad)
            fprintf(stderr, "no library: rc %d msg %s\n", rc, E.msg);
        pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_AUTO, 8, 0, &rc);
        bad |= rc != 0 || !pf || kvp_pagefile_backend(pf, 1) != KVP_PAGEFILE_BACKEND_PSYNC;
        kvp_pagefile_close(pf);
        unsetenv("KVPAGE_USRBIO_LIB");
        pf = open_usrbio(in, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
        /* the default soname is not installed here */
        bad |= rc != -ENOENT ||
               strstr(E.msg, "cannot load libhf3fs_api_shared.so (3FS's USRBIO "
                             "library; KVPAGE_USRBIO_LIB names another path)") == NULL;
        if (bad)
            fprintf(stderr, "no library: rc %d msg %s\n", rc, E.msg);
        _exit(bad);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_round_trips(void)
{
    char path[600];
    pt_path(path, sizeof path, "rt");
    unsigned char *model = calloc(1, FSIZE);
    int rc;
    /* entries 64 at 64 KiB pages: the staging ring holds them all; the
     * O_DIRECT handle too (aligned sizes only, below) */
    struct kvp_pagefile *pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_USRBIO, 64, 0, &rc);
    CHECK_EQ(rc, 0);
    if (pf) {
        round_trips(pf, model, 200, 64, 1);
        kvp_pagefile_close(pf);
    }
    /* read back through another backend: the bytes are in the file */
    pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_PSYNC, 64, 0, &rc);
    if (pf) {
        round_trips(pf, model, 50, 64, 2);
        kvp_pagefile_close(pf);
    }
    free(model);
}

/* Batches larger than the staging ring: 4 slots of 64 MiB pages would be
 * 256 MiB; a ring of UB_STAGE_MAX holds 4, a batch of 6 takes two turns. */
static void test_more_ops_than_slots(void)
{
    char path[600];
    pt_path(path, sizeof path, "big");
    const uint64_t bpp = 64ull << 20;
    struct kvp_pagefile_opts o =
        pt_opts(6 * bpp, bpp, 6, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_USRBIO);
    struct kvp_pagefile *pf = NULL;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), 0);
    if (!pf)
        return;
    char *buf = pt_alloc(6 * (size_t)(1 << 20));
    struct kvp_pagefile_op ops[6];
    int64_t res[6];
    uint64_t seed = 9;
    pt_fill(&seed, buf, 6 << 20);
    for (int i = 0; i < 6; i++)
        ops[i] = (struct kvp_pagefile_op){(int64_t)(i * bpp), buf + (i << 20), 1 << 20};
    CHECK_EQ(kvp_pagefile_write(pf, ops, 6, res, &E), 0);
    char *back = pt_alloc(6 << 20);
    for (int i = 0; i < 6; i++)
        ops[i].buf = back + (i << 20);
    CHECK_EQ(kvp_pagefile_read(pf, ops, 6, res, &E), 0);
    CHECK(memcmp(buf, back, 6 << 20) == 0);
    free(buf);
    free(back);
    kvp_pagefile_close(pf);
}

/* kvp_pagefile_alloc memory, registered: I/O straight from and into it. */
static void test_zero_copy(void)
{
    char path[600];
    pt_path(path, sizeof path, "zc");
    int rc;
    struct kvp_pagefile *pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (!pf)
        return;
    char *pool = kvp_pagefile_alloc(pf, 8 * BPP, &E);
    CHECK(pool != NULL);
    if (!pool) {
        kvp_pagefile_close(pf);
        return;
    }
    CHECK_EQ(pool[0], 0);
    struct kvp_pagefile_buf reg = {pool, 8 * BPP};
    CHECK_EQ(kvp_pagefile_register_buffers(pf, &reg, 1, &E), 0);
    uint64_t seed = 5;
    pt_fill(&seed, pool, 8 * BPP);
    struct kvp_pagefile_op ops[8];
    int64_t res[8];
    for (int i = 0; i < 8; i++)
        ops[i] = (struct kvp_pagefile_op){(int64_t)(i * 3 % NPAGES) * BPP, pool + i * BPP, BPP};
    CHECK_EQ(kvp_pagefile_write(pf, ops, 8, res, &E), 0);
    char *copy = pt_alloc(8 * BPP);
    memcpy(copy, pool, 8 * BPP);
    memset(pool, 0, 8 * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, ops, 8, res, &E), 0);
    CHECK(memcmp(pool, copy, 8 * BPP) == 0);
    /* unregistered, the same memory is staged: still right */
    CHECK_EQ(kvp_pagefile_unregister_buffers(pf), 0);
    memset(pool, 0, 8 * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, ops, 8, res, &E), 0);
    CHECK(memcmp(pool, copy, 8 * BPP) == 0);
    kvp_pagefile_free(pf, pool);
    /* memory left allocated is released by close (ASan would see a leak) */
    CHECK(kvp_pagefile_alloc(pf, BPP, &E) != NULL);
    CHECK(kvp_pagefile_alloc(pf, 0, &E) == NULL);
    CHECK_EQ(E.rule, KVP_RULE_ARG);
    free(copy);
    kvp_pagefile_close(pf);
}

/* Pages 0..7: buf filled from seed, back for reading them, w and r the
 * batches writing buf and reading into back. */
struct eight {
    char *buf, *back;
    struct kvp_pagefile_op w[8], r[8];
};

static void eight_init(struct eight *e, uint64_t seed)
{
    e->buf = pt_alloc(8 * BPP);
    e->back = pt_alloc(8 * BPP);
    pt_fill(&seed, e->buf, 8 * BPP);
    for (int i = 0; i < 8; i++) {
        e->w[i] = (struct kvp_pagefile_op){(int64_t)i * BPP, e->buf + i * BPP, BPP};
        e->r[i] = (struct kvp_pagefile_op){(int64_t)i * BPP, e->back + i * BPP, BPP};
    }
}

/* A USRBIO page file of 8 entries at name (its path in path), and e8 filled
 * from seed for it; NULL after a failed check. */
static struct kvp_pagefile *open_eight(const char *name, uint64_t seed, struct eight *e8,
                                       char *path, size_t cap)
{
    pt_path(path, cap, name);
    int rc;
    struct kvp_pagefile *pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (pf)
        eight_init(e8, seed);
    return pf;
}

/* ---- faults: the hook's, and the emulation's ---- */

static int64_t fault_verdict;
static atomic_int fault_calls;
static int64_t hook(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg;
    if (site != KVP__PF_USRBIO_READ && site != KVP__PF_USRBIO_WRITE)
        return 0;
    if (off < 3 * BPP || off >= 4 * BPP)
        return 0; /* page 3 only, and the rest of it when continued */
    atomic_fetch_add(&fault_calls, 1);
    if (fault_verdict > 0 && (uint64_t)fault_verdict >= len)
        return 0;
    return fault_verdict;
}

static void test_faults(void)
{
    char path[600];
    struct eight e8;
    struct kvp_pagefile *pf = open_eight("fault", 7, &e8, path, sizeof path);
    if (!pf)
        return;
    char *buf = e8.buf, *back = e8.back;
    struct kvp_pagefile_op *w = e8.w, *r = e8.r;
    int64_t res[8];
    /* short preparations (1000 bytes at a time at page 3): continued to the end */
    fault_verdict = 1000;
    kvp__pagefile_set_fault(hook, NULL);
    CHECK_EQ(kvp_pagefile_write(pf, w, 8, res, &E), 0);
    CHECK_EQ(res[3], BPP);
    CHECK(atomic_load(&fault_calls) >= BPP / 1000);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), 0);
    CHECK(memcmp(buf, back, 8 * BPP) == 0);
    /* a failed preparation: that op's -errno, the others done */
    fault_verdict = -EIO;
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), -EIO);
    CHECK_EQ(E.index, 3);
    CHECK_EQ(res[3], -EIO);
    CHECK_EQ(res[2], BPP);
    CHECK_EQ(res[4], BPP);
    kvp__pagefile_set_fault(NULL, NULL);
    /* and the handle works on */
    memset(back, 0, 8 * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), 0);
    CHECK(memcmp(buf, back, 8 * BPP) == 0);
    kvp_pagefile_close(pf);

    /* the emulation's own faults, set before the rings are made: every 5th
     * I/O fails with -EIO, and completions come early and fewer than ready */
    setenv("KVPAGE_USRBIO_EMU_FAIL_EVERY", "5", 1);
    setenv("KVPAGE_USRBIO_EMU_EARLY", "1", 1);
    setenv("KVPAGE_USRBIO_EMU_FEW", "1", 1);
    int rc;
    pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
    unsetenv("KVPAGE_USRBIO_EMU_FAIL_EVERY");
    unsetenv("KVPAGE_USRBIO_EMU_EARLY");
    unsetenv("KVPAGE_USRBIO_EMU_FEW");
    CHECK_EQ(rc, 0);
    if (pf) {
        int failed = 0, ok = 0;
        for (int k = 0; k < 10; k++) {
            memset(back, 0, 8 * BPP);
            rc = kvp_pagefile_read(pf, r, 8, res, &E);
            for (int i = 0; i < 8; i++) {
                if (res[i] == -EIO) {
                    failed++;
                } else {
                    CHECK_EQ(res[i], BPP);
                    CHECK(memcmp(buf + i * BPP, back + i * BPP, BPP) == 0);
                    ok++;
                }
            }
            CHECK(rc == 0 || rc == -EIO);
        }
        /* 80 I/Os: the emulation failed 16 of them (its counter is process-wide) */
        CHECK(failed >= 15 && failed <= 17);
        CHECK_EQ(failed + ok, 80);
        kvp_pagefile_close(pf);
    }
    free(buf);
    free(back);
}

/* A ring that breaks (its submit fails): the ops in it fail with the error,
 * the rest of the batch and later batches of that direction run with
 * pread/pwrite, and the other direction's ring is untouched. */
static int64_t fail_submit(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg, (void)off, (void)len;
    return site == KVP__PF_USRBIO_SUBMIT ? -EFAULT : 0;
}

static void test_broken_ring(void)
{
    char path[600];
    struct eight e8;
    struct kvp_pagefile *pf = open_eight("broken", 11, &e8, path, sizeof path);
    if (!pf)
        return;
    char *buf = e8.buf, *back = e8.back;
    struct kvp_pagefile_op *w = e8.w, *r = e8.r;
    int64_t res[8];
    CHECK_EQ(kvp_pagefile_write(pf, w, 8, res, &E), 0);
    kvp__pagefile_set_fault(fail_submit, NULL);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), -EFAULT);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(res[i], -EFAULT); /* all 8 were in the ring */
    CHECK_EQ(E.index, 0);
    kvp__pagefile_set_fault(NULL, NULL);
    /* the read ring is out of use: reads go on with pread, and are right */
    memset(back, 0, 8 * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), 0);
    CHECK(memcmp(buf, back, 8 * BPP) == 0);
    /* the write ring still works */
    uint64_t seed = 12;
    pt_fill(&seed, buf, 8 * BPP);
    CHECK_EQ(kvp_pagefile_write(pf, w, 8, res, &E), 0);
    memset(back, 0, 8 * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &E), 0);
    CHECK(memcmp(buf, back, 8 * BPP) == 0);
    free(buf);
    free(back);
    kvp_pagefile_close(pf);
}

/* ---- opts.queues rings each way ---- */

/* Holds the first read preparation of a batch until another batch of reads
 * is being prepared too (3 s at most): two batches in flight at once. */
static atomic_int in_prep, overlapped, read_preps;

static int64_t hold_until_two(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg, (void)off, (void)len;
    if (site != KVP__PF_USRBIO_READ)
        return 0;
    atomic_fetch_add(&read_preps, 1);
    if (atomic_fetch_add(&in_prep, 1) + 1 >= 2)
        atomic_store(&overlapped, 1);
    for (int i = 0; i < 3000 && !atomic_load(&overlapped); i++)
        usleep(1000);
    atomic_fetch_sub(&in_prep, 1);
    return 0;
}

struct reader {
    struct kvp_pagefile *pf;
    struct kvp_pagefile_op *r;
    int rc;
};

static void *read_eight(void *arg)
{
    struct reader *rd = arg;
    int64_t res[8];
    struct kvp_error err;
    rd->rc = kvp_pagefile_read(rd->pf, rd->r, 8, res, &err);
    return NULL;
}

static int64_t count_read_preps(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg, (void)off, (void)len;
    if (site == KVP__PF_USRBIO_READ)
        atomic_fetch_add(&read_preps, 1);
    return 0;
}

static void test_rings(void)
{
    char path[600];
    pt_path(path, sizeof path, "rings");
    struct kvp_pagefile_opts o =
        pt_opts(FSIZE, BPP, 8, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_USRBIO);
    o.queues = 2;
    struct kvp_pagefile *pf = NULL;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), 0);
    if (!pf)
        return;
    CHECK_EQ(kvp_pagefile_queues(pf), 4); /* 2 each way */
    struct eight e8, f8;
    eight_init(&e8, 21);
    eight_init(&f8, 22);
    int64_t res[8];
    CHECK_EQ(kvp_pagefile_write(pf, e8.w, 8, res, &E), 0);
    /* two batches of reads at once, each on a ring of its own */
    atomic_store(&in_prep, 0);
    atomic_store(&overlapped, 0);
    kvp__pagefile_set_fault(hold_until_two, NULL);
    struct reader a = {pf, e8.r, 1}, b = {pf, f8.r, 1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, read_eight, &a);
    pthread_create(&tb, NULL, read_eight, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    kvp__pagefile_set_fault(NULL, NULL);
    CHECK_EQ(a.rc, 0);
    CHECK_EQ(b.rc, 0);
    CHECK_EQ(atomic_load(&overlapped), 1);
    CHECK(memcmp(e8.buf, e8.back, 8 * BPP) == 0);
    CHECK(memcmp(e8.buf, f8.back, 8 * BPP) == 0);
    /* a broken read ring is passed over: later reads use the other ring */
    kvp__pagefile_set_fault(fail_submit, NULL);
    CHECK_EQ(kvp_pagefile_read(pf, e8.r, 8, res, &E), -EFAULT);
    atomic_store(&read_preps, 0);
    kvp__pagefile_set_fault(count_read_preps, NULL);
    for (int k = 0; k < 4; k++) {
        memset(e8.back, 0, 8 * BPP);
        CHECK_EQ(kvp_pagefile_read(pf, e8.r, 8, res, &E), 0);
        CHECK(memcmp(e8.buf, e8.back, 8 * BPP) == 0);
    }
    kvp__pagefile_set_fault(NULL, NULL);
    CHECK_EQ(atomic_load(&read_preps), 32); /* every op through a ring, none inline */
    kvp_pagefile_close(pf);
    /* one ring each way: a broken one sends its direction to pread */
    o.queues = 1;
    o.flags = 0;
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &E), 0);
    if (pf) {
        CHECK_EQ(kvp_pagefile_queues(pf), 2);
        kvp__pagefile_set_fault(fail_submit, NULL);
        CHECK_EQ(kvp_pagefile_read(pf, e8.r, 8, res, &E), -EFAULT);
        atomic_store(&read_preps, 0);
        kvp__pagefile_set_fault(count_read_preps, NULL);
        memset(e8.back, 0, 8 * BPP);
        CHECK_EQ(kvp_pagefile_read(pf, e8.r, 8, res, &E), 0);
        kvp__pagefile_set_fault(NULL, NULL);
        CHECK(memcmp(e8.buf, e8.back, 8 * BPP) == 0);
        CHECK_EQ(atomic_load(&read_preps), 0);
        kvp_pagefile_close(pf);
    }
    free(e8.buf);
    free(e8.back);
    free(f8.buf);
    free(f8.back);
}

/* ---- 8 threads on one handle, each on its own pages ---- */

struct worker {
    struct kvp_pagefile *pf;
    int id, bad;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    char *buf = pt_alloc(BPP), *back = pt_alloc(BPP);
    uint64_t seed = (uint64_t)w->id + 100;
    for (int k = 0; k < 100; k++) {
        int64_t off = (int64_t)(w->id * 8 + (int)pt_below(&seed, 8)) * BPP, res;
        pt_fill(&seed, buf, BPP);
        struct kvp_pagefile_op op = {off, buf, BPP}, rop = {off, back, BPP};
        if (kvp_pagefile_write(w->pf, &op, 1, &res, NULL) != 0 ||
            kvp_pagefile_read(w->pf, &rop, 1, &res, NULL) != 0 || memcmp(buf, back, BPP) != 0)
            w->bad++;
    }
    free(buf);
    free(back);
    return NULL;
}

static void test_threads(void)
{
    char path[600];
    pt_path(path, sizeof path, "threads");
    int rc;
    struct kvp_pagefile *pf = open_usrbio(path, KVP_PAGEFILE_BACKEND_USRBIO, 8, 0, &rc);
    CHECK_EQ(rc, 0);
    if (!pf)
        return;
    pthread_t t[8];
    struct worker w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (struct worker){pf, i, 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].bad, 0);
    }
    kvp_pagefile_close(pf);
}

int main(void)
{
    if (!getenv("KVPAGE_USRBIO_LIB")) {
        printf("SKIP: KVPAGE_USRBIO_LIB (the emulation of tests/usrbio_emu) is not set\n");
        return 77;
    }
    pt_mkdir("usrbio");
    test_no_library();
    test_errors_and_auto();
    test_round_trips();
    test_more_ops_than_slots();
    test_zero_copy();
    test_faults();
    test_broken_ring();
    test_rings();
    test_threads();
    pt_rmdir();
    return pt_finish();
}
