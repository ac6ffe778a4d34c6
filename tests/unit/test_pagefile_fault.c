/*
 * test_pagefile_fault — faults injected under the library through the
 * internal hook: short transfers, -EIO, -ENOSPC, EINTR, EAGAIN, failed
 * io_uring submissions, and a file truncated behind the handle's back.
 * Per-operation results must be right, nothing may hang, and the handle must
 * keep working afterwards. Run under ASan for leaks.
 */
#include <fcntl.h>
#include <stdatomic.h>

#include "pagefile_test.h"

#define BPP (256 * 1024)
#define NPAGES 64
#define FILE_SIZE ((uint64_t)BPP * NPAGES)
#define N 8

#define SITE(s) (1u << (s))
#define ALL_IO                                                                                     \
    (SITE(KVP__PF_PREAD) | SITE(KVP__PF_PWRITE) | SITE(KVP__PF_URING_READ) |                       \
     SITE(KVP__PF_URING_WRITE) | SITE(KVP__PF_USRBIO_READ) | SITE(KVP__PF_USRBIO_WRITE))
#define NSITES 16

/* What the hook does, per site: the first `skip` calls get `first` (0: pass), then
 * `remaining` calls (-1: all) get `verdict`. Offsets outside [lo, hi) are left alone. */
static struct {
    unsigned sites;
    int64_t lo, hi;
    int64_t first[NSITES], verdict[NSITES];
    atomic_int skip[NSITES], remaining[NSITES], calls[NSITES];
} plan;

static int64_t hook(void *arg, int site, int64_t off, uint64_t len)
{
    if (!(plan.sites & SITE(site)))
        return 0;
    if (site != KVP__PF_URING_SUBMIT && (off < plan.lo || off >= plan.hi))
        return 0;
    atomic_fetch_add(&plan.calls[site], 1);
    int64_t v;
    if (atomic_load(&plan.skip[site]) > 0 && atomic_fetch_sub(&plan.skip[site], 1) > 0) {
        v = plan.first[site];
    } else {
        int left = atomic_load(&plan.remaining[site]);
        for (;;) {
            if (left == 0)
                return 0;
            if (left == -1 || atomic_compare_exchange_weak(&plan.remaining[site], &left, left - 1))
                break;
        }
        v = plan.verdict[site];
    }
    if (v > 0 && (uint64_t)v >= len)
        return 0;
    return v;
}

/* Adds a site to the plan. */
static void arm_site(int site, int64_t verdict, int times, int skip, int64_t first)
{
    plan.sites |= SITE(site);
    plan.verdict[site] = verdict;
    plan.first[site] = first;
    atomic_store(&plan.remaining[site], times);
    atomic_store(&plan.skip[site], skip);
    atomic_store(&plan.calls[site], 0);
}

/* A fresh plan: every site in `sites` gets `verdict` `times` times within [lo, hi). */
static void arm(unsigned sites, int64_t lo, int64_t hi, int64_t verdict, int times)
{
    kvp__pagefile_set_fault(NULL, NULL);
    plan.sites = 0;
    plan.lo = lo;
    plan.hi = hi;
    for (int s = 0; s < NSITES; s++)
        if (sites & SITE(s))
            arm_site(s, verdict, times, 0, 0);
    kvp__pagefile_set_fault(hook, NULL);
}

static int calls(unsigned sites)
{
    int c = 0;
    for (int s = 0; s < NSITES; s++)
        if (sites & SITE(s))
            c += atomic_load(&plan.calls[s]);
    return c;
}

static int remaining(unsigned sites)
{
    int c = 0;
    for (int s = 0; s < NSITES; s++)
        if (sites & SITE(s))
            c += atomic_load(&plan.remaining[s]);
    return c;
}

static void disarm(void)
{
    kvp__pagefile_set_fault(NULL, NULL);
}

static unsigned char *model, *bufs;
static uint64_t seed = 42;
static struct kvp_error E;

/* ops[i] covers page pages[i], buffer slot i */
static void make_ops(struct kvp_pagefile_op *ops, const int *pages, int n)
{
    for (int i = 0; i < n; i++)
        ops[i] = (struct kvp_pagefile_op){(int64_t)pages[i] * BPP, bufs + (size_t)i * BPP, BPP};
}

static const int PAGES[N] = {5, 17, 2, 40, 33, 8, 63, 0};

static int64_t page_off(int i)
{
    return (int64_t)PAGES[i] * BPP;
}

/* A clean write and read back of all 8 pages, compared with the model. */
static void healthy(struct kvp_pagefile *pf)
{
    struct kvp_pagefile_op ops[N];
    int64_t res[N];
    make_ops(ops, PAGES, N);
    pt_fill(&seed, bufs, (size_t)N * BPP);
    CHECK_EQ(kvp_pagefile_write(pf, ops, N, res, NULL), 0);
    for (int i = 0; i < N; i++)
        memcpy(model + ops[i].offset, ops[i].buf, BPP);
    memset(bufs, 0, (size_t)N * BPP);
    CHECK_EQ(kvp_pagefile_read(pf, ops, N, res, NULL), 0);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += memcmp(ops[i].buf, model + ops[i].offset, BPP) != 0 || res[i] != BPP;
    CHECK_EQ(bad, 0);
}

/* Reads all 8 pages with the current fault; checks ok ops against the model. */
static int read_all(struct kvp_pagefile *pf, int64_t *res)
{
    struct kvp_pagefile_op ops[N];
    make_ops(ops, PAGES, N);
    memset(bufs, 0, (size_t)N * BPP);
    memset(&E, 0, sizeof E);
    int rc = kvp_pagefile_read(pf, ops, N, res, &E);
    for (int i = 0; i < N; i++)
        if (res[i] == BPP)
            CHECK(memcmp(ops[i].buf, model + ops[i].offset, BPP) == 0);
    return rc;
}

static int write_all(struct kvp_pagefile *pf, int64_t *res)
{
    struct kvp_pagefile_op ops[N];
    make_ops(ops, PAGES, N);
    pt_fill(&seed, bufs, (size_t)N * BPP);
    memset(&E, 0, sizeof E);
    int rc = kvp_pagefile_write(pf, ops, N, res, &E);
    for (int i = 0; i < N; i++)
        if (res[i] == BPP)
            memcpy(model + ops[i].offset, ops[i].buf, BPP);
    return rc;
}

static void run_backend(int backend, uint32_t flags, const char *name)
{
    char path[600];
    pt_path(path, sizeof path, name);
    struct kvp_pagefile_opts o = pt_opts(FILE_SIZE, BPP, N, KVP_PAGEFILE_CREATE | flags, backend);
    /* psync: 4 pieces per page, so faults hit the middle of ops (psync cuts
     * pages only to give each of its threads a piece: 32 threads, 8 pages) */
    o.chunk_bytes = 64 << 10;
    o.threads = 4 * N;
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, name);
    if (!pf)
        return;
    const int direct = (flags & KVP_PAGEFILE_DIRECT) != 0;
    const int uring = backend == KVP_PAGEFILE_BACKEND_URING;
    const int usrbio = backend == KVP_PAGEFILE_BACKEND_USRBIO;
    const unsigned site_r = SITE(usrbio  ? KVP__PF_USRBIO_READ
                                 : uring ? KVP__PF_URING_READ
                                         : KVP__PF_PREAD);
    const unsigned site_w = SITE(usrbio  ? KVP__PF_USRBIO_WRITE
                                 : uring ? KVP__PF_URING_WRITE
                                         : KVP__PF_PWRITE);
    int64_t res[N];
    char msg[256];
    memset(model, 0, FILE_SIZE);
    healthy(pf);

    /* Short transfers everywhere: continued until complete (aligned for O_DIRECT). */
    arm(ALL_IO, 0, (int64_t)FILE_SIZE, direct ? 4096 : 4097, -1);
    CHECK_EQ(write_all(pf, res), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], BPP);
    CHECK_EQ(read_all(pf, res), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], BPP);
    CHECK(calls(ALL_IO) > 2 * N * 4); /* many continuations happened */
    disarm();
    healthy(pf);

    /* -EIO on op 3's range only: op 3 fails, the others complete. */
    arm(ALL_IO, page_off(3), page_off(3) + BPP, -EIO, -1);
    CHECK_EQ(read_all(pf, res), -EIO);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], i == 3 ? -EIO : BPP);
    CHECK_EQ(E.code, -EIO);
    CHECK_EQ(E.rule, KVP_RULE_IO);
    CHECK_EQ(E.index, 3);
    CHECK_EQ(E.value, page_off(3));
    snprintf(msg, sizeof msg,
             "op 3: read of %d bytes at offset %" PRId64 " failed: Input/output error", BPP,
             page_off(3));
    CHECK_STR(E.msg, msg);
    disarm();
    healthy(pf);

    /* -ENOSPC on the writes of op 2. */
    arm(SITE(KVP__PF_PWRITE) | SITE(KVP__PF_URING_WRITE) | SITE(KVP__PF_USRBIO_WRITE), page_off(2),
        page_off(2) + BPP, -ENOSPC, -1);
    CHECK_EQ(write_all(pf, res), -ENOSPC);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], i == 2 ? -ENOSPC : BPP);
    CHECK_EQ(E.index, 2);
    snprintf(msg, sizeof msg,
             "op 2: write of %d bytes at offset %" PRId64 " failed: No space left on device", BPP,
             page_off(2));
    CHECK_STR(E.msg, msg);
    disarm();
    /* the ops that succeeded really were written; page 2 kept its old content */
    CHECK_EQ(read_all(pf, res), 0);
    healthy(pf);

    /* A short transfer, then an error in the continuation: the error wins. */
    arm(ALL_IO, page_off(6), page_off(6) + BPP, 8192, 1);
    CHECK_EQ(read_all(pf, res), 0); /* short once, then completed */
    CHECK_EQ(res[6], BPP);
    arm(ALL_IO, page_off(6), page_off(6) + BPP, -EIO, -1);
    for (int s2 = 0; s2 < NSITES; s2++)
        if (ALL_IO & SITE(s2)) {
            atomic_store(&plan.skip[s2], 1);
            plan.first[s2] = 8192;
        }
    CHECK_EQ(read_all(pf, res), -EIO);
    CHECK_EQ(res[6], -EIO);
    disarm();

    /* EINTR and EAGAIN a few times on every op: retried, all succeed. */
    arm(ALL_IO, 0, (int64_t)FILE_SIZE, -EINTR, 12);
    CHECK_EQ(write_all(pf, res), 0);
    CHECK_EQ(remaining(site_w), 0);
    arm(ALL_IO, 0, (int64_t)FILE_SIZE, -EAGAIN, 12);
    CHECK_EQ(read_all(pf, res), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], BPP);
    CHECK_EQ(remaining(site_r), 0);
    /* EAGAIN forever on one op: reported after a bounded number of retries, no hang. */
    arm(ALL_IO, page_off(1), page_off(1) + BPP, -EAGAIN, -1);
    CHECK_EQ(read_all(pf, res), -EAGAIN);
    for (int i = 0; i < N; i++)
        CHECK_EQ(res[i], i == 1 ? -EAGAIN : BPP);
    disarm();
    healthy(pf);

    if (backend == KVP_PAGEFILE_BACKEND_URING) {
        /* Transient submit failures: retried. */
        arm(SITE(KVP__PF_URING_SUBMIT), 0, 0, -EINTR, 3);
        CHECK_EQ(write_all(pf, res), 0);
        arm(SITE(KVP__PF_URING_SUBMIT), 0, 0, -EBUSY, 3);
        CHECK_EQ(read_all(pf, res), 0);
        arm(SITE(KVP__PF_URING_SUBMIT), 0, 0, -EAGAIN, 3);
        CHECK_EQ(read_all(pf, res), 0);
        /* A hard submit failure before anything reached the kernel: every op fails with it. */
        arm(SITE(KVP__PF_URING_SUBMIT), 0, 0, -EFAULT, 1);
        CHECK_EQ(read_all(pf, res), -EFAULT);
        for (int i = 0; i < N; i++)
            CHECK_EQ(res[i], -EFAULT);
        CHECK_EQ(E.index, 0);
        disarm();
        /* the ring was rebuilt: every queue still works (4 rounds cover the 4 rings) */
        for (int k = 0; k < 4; k++)
            healthy(pf);
        /* A hard failure after the first submit, with ops waiting on continuations
         * (every read is short): those in flight are waited for, the rest fail with the
         * error, nothing hangs, and the rebuilt ring works. */
        for (int k = 1; k <= 4; k++) {
            arm(SITE(KVP__PF_URING_READ), 0, (int64_t)FILE_SIZE, direct ? 4096 : 1000, -1);
            arm_site(KVP__PF_URING_SUBMIT, -EFAULT, 1, k, 0);
            CHECK_EQ(read_all(pf, res), -EFAULT);
            int failed = 0, ok = 0;
            for (int i = 0; i < N; i++) {
                failed += res[i] == -EFAULT;
                ok += res[i] == BPP;
            }
            CHECK(failed >= 1);
            CHECK_EQ(failed + ok, N);
            disarm();
            healthy(pf);
        }
    }
    CHECK_EQ(kvp_pagefile_flush(pf, NULL), 0);

    /* The file truncated behind the handle: a read past the new end is short. */
    if (!direct) {
        int fd = open(path, O_RDWR);
        CHECK(fd >= 0);
        CHECK(ftruncate(fd, (off_t)(page_off(3) + 1000)) == 0);
        CHECK_EQ(read_all(pf, res), -EIO);
        CHECK_EQ(res[3], 1000); /* page 40 is cut after 1000 bytes */
        CHECK_EQ(res[4], BPP);  /* page 33: before the cut */
        CHECK_EQ(res[6], 0);    /* page 63: entirely past the end */
        CHECK_EQ(E.index, 3);   /* the first op that did not complete */
        CHECK(strstr(E.msg, "op 3: short read, 1000 of 262144 bytes") != NULL);
        CHECK(ftruncate(fd, (off_t)FILE_SIZE) == 0);
        close(fd);
        memset(model + page_off(3) + 1000, 0, FILE_SIZE - (uint64_t)page_off(3) - 1000);
        healthy(pf);
    }
    kvp_pagefile_close(pf);
    printf("%s: done\n", name);
}

/* A failed open (here io_uring refused with backend URING) leaves an
 * existing file as it was, never extended, and removes the file and the
 * directories it created. */
static void failed_open_changes_nothing(void)
{
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.bytes_per_page = BPP;
    o.size = FILE_SIZE;
    o.backend = KVP_PAGEFILE_BACKEND_URING;
    o.flags = KVP_PAGEFILE_CREATE | KVP_PAGEFILE_MKDIR;
    char p[600], top[600];
    pt_path(p, sizeof p, "made/below/pages.bin");
    pt_path(top, sizeof top, "made");
    struct kvp_pagefile *pf = NULL;
    struct kvp_error e = {0};
    plan.sites = 0;
    plan.lo = 0, plan.hi = INT64_MAX;
    arm_site(KVP__PF_URING_INIT, -ENOMEM, -1, 0, 0);
    kvp__pagefile_set_fault(hook, NULL);
    CHECK_EQ(kvp_pagefile_open(p, &o, &pf, &e), -ENOMEM);
    struct stat st;
    CHECK(stat(top, &st) != 0 && errno == ENOENT);
    /* an existing smaller file keeps its size and its bytes */
    pt_path(p, sizeof p, "small.bin");
    int fd = open(p, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0 && write(fd, "kept", 4) == 4);
    close(fd);
    CHECK_EQ(kvp_pagefile_open(p, &o, &pf, &e), -ENOMEM);
    char back[8] = {0};
    fd = open(p, O_RDONLY);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 4 && read(fd, back, 8) == 4);
    close(fd);
    CHECK_STR(back, "kept");
    kvp__pagefile_set_fault(NULL, NULL);
    plan.sites = 0;
    printf("failed open: nothing changed\n");
}

int main(void)
{
    pt_mkdir("fault");
    failed_open_changes_nothing();
    model = malloc(FILE_SIZE);
    bufs = pt_alloc((size_t)N * BPP);
    pt_each_mode(run_backend);
    free(model);
    free(bufs);
    pt_rmdir();
    return pt_finish();
}
