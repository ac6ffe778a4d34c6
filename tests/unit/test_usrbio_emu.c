/*
 * The USRBIO emulation (tests/usrbio_emu, libhf3fs_emu.so), loaded with dlopen
 * from $KVPAGE_USRBIO_EMU_LIB (set by CMake) and called through the function
 * types of src/pagefile/usrbio_abi.h:
 *
 *   1. mount point detection: inside, a file not created yet, outside, a
 *      sibling directory whose name starts with the mount's, a buffer too
 *      small, no mount; hf3fs_is_hf3fs;
 *   2. round trips: writes then reads of several I/Os through rings, an iov
 *      of hf3fs_iovwrap, the ring full (-EAGAIN, as 3FS), -EACCES, I/Os not
 *      run before hf3fs_submit_ios, a wait that times out with 0;
 *   3. every rule of the contract broken once in count mode: the call fails
 *      with -EINVAL, the counter goes up by one and the message names the
 *      rule; use after destroy is a violation, not a crash;
 *   4. two threads in prep_io on one ring (made certain with
 *      KVPAGE_USRBIO_EMU_PREP_DELAY_US), two in wait_for_ios; prep_io beside
 *      wait_for_ios is allowed;
 *   5. the fault modes EARLY, FEW, FAIL_EVERY and SHORT_EVERY;
 *   6. by default a violation prints its message and aborts (in a child).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "pagefile/usrbio_abi.h"
#include "scratch.h"

static struct {
    kvp__hf3fs_extract_mount_point_fn extract_mount_point;
    kvp__hf3fs_is_hf3fs_fn is_hf3fs;
    kvp__hf3fs_iovcreate_fn iovcreate;
    kvp__hf3fs_iovwrap_fn iovwrap;
    kvp__hf3fs_iovdestroy_fn iovdestroy;
    kvp__hf3fs_ior_size_fn ior_size;
    kvp__hf3fs_iorcreate4_fn iorcreate4;
    kvp__hf3fs_iordestroy_fn iordestroy;
    kvp__hf3fs_reg_fd_fn reg_fd;
    kvp__hf3fs_dereg_fd_fn dereg_fd;
    kvp__hf3fs_io_entries_fn io_entries;
    kvp__hf3fs_prep_io_fn prep_io;
    kvp__hf3fs_submit_ios_fn submit_ios;
    kvp__hf3fs_wait_for_ios_fn wait_for_ios;
    int (*violations)(void);
    const char *(*last_violation)(void);
} F;

static char mount[PATH_MAX];   /* realpath of the emulated mount */
static char outside[PATH_MAX]; /* a directory not under it */
static const size_t PG = 4096;

static void load(void)
{
    const char *path = getenv("KVPAGE_USRBIO_EMU_LIB");
    if (!path) {
        fprintf(stderr, "KVPAGE_USRBIO_EMU_LIB is not set (CMake sets it)\n");
        exit(1);
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
#define LOAD(field, name)                                                                          \
    do {                                                                                           \
        *(void **)&F.field = dlsym(lib, name);                                                     \
        if (!F.field) {                                                                            \
            fprintf(stderr, "%s: no symbol %s\n", path, name);                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
    LOAD(extract_mount_point, "hf3fs_extract_mount_point");
    LOAD(is_hf3fs, "hf3fs_is_hf3fs");
    LOAD(iovcreate, "hf3fs_iovcreate");
    LOAD(iovwrap, "hf3fs_iovwrap");
    LOAD(iovdestroy, "hf3fs_iovdestroy");
    LOAD(ior_size, "hf3fs_ior_size");
    LOAD(iorcreate4, "hf3fs_iorcreate4");
    LOAD(iordestroy, "hf3fs_iordestroy");
    LOAD(reg_fd, "hf3fs_reg_fd");
    LOAD(dereg_fd, "hf3fs_dereg_fd");
    LOAD(io_entries, "hf3fs_io_entries");
    LOAD(prep_io, "hf3fs_prep_io");
    LOAD(submit_ios, "hf3fs_submit_ios");
    LOAD(wait_for_ios, "hf3fs_wait_for_ios");
    LOAD(violations, "hf3fs_emu_violations");
    LOAD(last_violation, "hf3fs_emu_last_violation");
#undef LOAD
}

static struct timespec in_ms(long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Reaps want completions (min_results 1 a call) within 10 s; returns how many. */
static int reap(const struct hf3fs_ior *ior, struct hf3fs_cqe *out, int want)
{
    struct timespec until = in_ms(10000);
    int got = 0;
    while (got < want) {
        int n = F.wait_for_ios(ior, out + got, want - got, 1, &until);
        if (n <= 0)
            break;
        got += n;
    }
    return got;
}

/* A call that breaks a rule: -EINVAL, the counter one up, the rule named. */
#define CHECK_VIOLATION(call, what)                                                                \
    do {                                                                                           \
        int before_ = F.violations();                                                              \
        long long rc_ = (long long)(call);                                                         \
        CHECK_EQ(rc_, -EINVAL);                                                                    \
        CHECK_EQ(F.violations(), before_ + 1);                                                     \
        if (!strstr(F.last_violation(), what))                                                     \
            fprintf(stderr, "last violation: %s\n", F.last_violation());                           \
        CHECK(strstr(F.last_violation(), what) != NULL);                                           \
    } while (0)

#define CHECK_VIOLATION_VOID(stmt, what)                                                           \
    do {                                                                                           \
        int before_ = F.violations();                                                              \
        stmt;                                                                                      \
        CHECK_EQ(F.violations(), before_ + 1);                                                     \
        if (!strstr(F.last_violation(), what))                                                     \
            fprintf(stderr, "last violation: %s\n", F.last_violation());                           \
        CHECK(strstr(F.last_violation(), what) != NULL);                                           \
    } while (0)

static int open_in(const char *dir, const char *name, int flags)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, flags | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(p);
        exit(1);
    }
    return fd;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

/* ---- 6. abort by default ---------------------------------------------- */

static void test_abort_default(void)
{
    int pfd[2];
    CHECK_EQ(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("KVPAGE_USRBIO_EMU_VIOLATIONS");
        dup2(pfd[1], 2);
        struct hf3fs_ior never;
        memset(&never, 0, sizeof never);
        F.submit_ios(&never);
        _exit(0); /* not reached */
    }
    close(pfd[1]);
    char buf[1024];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(pfd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)k;
    buf[got] = '\0';
    close(pfd[0]);
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(buf, "usrbio-emu: contract violation: hf3fs_submit_ios: ior not created") != NULL);
}

/* ---- 1. mount point ---------------------------------------------------- */

static void test_mount_point(void)
{
    char buf[PATH_MAX], p[PATH_MAX + 32];
    int want = (int)strlen(mount) + 1;

    snprintf(p, sizeof p, "%s/data", mount);
    memset(buf, 'X', sizeof buf);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), want);
    CHECK(strcmp(buf, mount) == 0);
    /* the mount itself, a file not created yet, one in a subdirectory */
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, mount), want);
    snprintf(p, sizeof p, "%s/not-yet", mount);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), want);
    snprintf(p, sizeof p, "%s/sub/not-yet", mount);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), want);
    /* outside, a sibling named like the mount plus a suffix, a missing directory */
    snprintf(p, sizeof p, "%s/file", outside);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), -1);
    snprintf(p, sizeof p, "%s-sib/file", mount);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), -1);
    snprintf(p, sizeof p, "%s/no-dir/no-file", mount);
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), -1);
    /* a buffer too small: the size needed, nothing written */
    memset(buf, 'X', sizeof buf);
    snprintf(p, sizeof p, "%s/data", mount);
    CHECK_EQ(F.extract_mount_point(buf, 4, p), want);
    CHECK_EQ(F.extract_mount_point(buf, want - 1, p), want);
    int untouched = 1;
    for (int i = 0; i < want + 1; i++)
        untouched &= buf[i] == 'X';
    CHECK(untouched);
    CHECK_EQ(F.extract_mount_point(buf, want, p), want); /* exactly enough */
    CHECK(strcmp(buf, mount) == 0);
    /* no mount */
    unsetenv("KVPAGE_USRBIO_EMU_MOUNT");
    CHECK_EQ(F.extract_mount_point(buf, sizeof buf, p), -1);
    setenv("KVPAGE_USRBIO_EMU_MOUNT", mount, 1);

    int in = open_in(mount, "data", O_RDWR | O_CREAT);
    int out = open_in(outside, "file", O_RDWR | O_CREAT);
    CHECK(F.is_hf3fs(in));
    CHECK(!F.is_hf3fs(out));
    CHECK(!F.is_hf3fs(-1));
    CHECK_EQ(F.reg_fd(out, 0), EBADF); /* not on the file system */
    close(in);
    close(out);

    struct hf3fs_iov iov;
    struct hf3fs_ior ior;
    CHECK_EQ(F.iovcreate(&iov, outside, PG, 0, -1), -EINVAL);
    CHECK_EQ(F.iorcreate4(&ior, outside, 4, true, 0, 0, -1, 0), -EINVAL);
}

/* ---- 2. round trips ---------------------------------------------------- */

enum { NIO = 6 };

static void test_roundtrip(void)
{
    int fd = open_in(mount, "rt", O_RDWR | O_CREAT | O_TRUNC);
    CHECK(F.reg_fd(fd, 0) <= 0);
    CHECK_EQ(F.reg_fd(fd, 0), EINVAL); /* registered already */

    struct hf3fs_iov iov;
    CHECK_EQ(F.iovcreate(&iov, mount, 1 << 20, 0, -1), 0);
    CHECK(iov.base != NULL && iov.iovh != NULL);
    CHECK_EQ(iov.size, 1 << 20);
    CHECK_EQ(iov.block_size, 0);
    CHECK(strcmp(iov.mount_point, mount) == 0);

    struct hf3fs_ior wr, rd;
    CHECK_EQ(F.iorcreate4(&wr, mount, 8, false, 0, 0, -1, 0), 0);
    CHECK_EQ(F.iorcreate4(&rd, mount, 8, true, 0, 0, -1, HF3FS_IOR_FORBID_READ_HOLES), 0);
    CHECK_EQ(F.io_entries(&wr), 8);
    CHECK(!wr.for_read && rd.for_read);
    CHECK(strcmp(wr.mount_point, mount) == 0);
    CHECK(F.ior_size(8) > F.ior_size(4));

    /* NIO writes of one page each, at file offsets i * 2 pages */
    int tag[NIO], idx[NIO];
    fill(iov.base, NIO * PG, 1);
    for (int i = 0; i < NIO; i++) {
        tag[i] = i;
        idx[i] = F.prep_io(&wr, &iov, false, iov.base + i * PG, fd, i * 2 * PG, PG, &tag[i]);
        CHECK(idx[i] >= 0 && idx[i] < 8);
        for (int j = 0; j < i; j++)
            CHECK(idx[i] != idx[j]);
    }
    CHECK_EQ(F.submit_ios(&wr), 0);
    struct hf3fs_cqe cqe[8];
    CHECK_EQ(reap(&wr, cqe, NIO), NIO);
    int seen = 0;
    for (int i = 0; i < NIO; i++) {
        const int *t = cqe[i].userdata;
        CHECK(t >= tag && t < tag + NIO);
        if (t < tag || t >= tag + NIO)
            continue;
        CHECK_EQ(cqe[i].index, idx[*t]);
        CHECK_EQ(cqe[i].result, PG);
        seen |= 1 << *t;
    }
    CHECK_EQ(seen, (1 << NIO) - 1);
    uint8_t page[4096];
    for (int i = 0; i < NIO; i++) {
        CHECK_EQ(pread(fd, page, PG, i * 2 * PG), PG);
        CHECK(memcmp(page, iov.base + i * PG, PG) == 0);
    }

    /* read them back into another part of the iov */
    uint8_t *dst = iov.base + (512 << 10);
    memset(dst, 0, NIO * PG);
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&rd, &iov, true, dst + i * PG, fd, i * 2 * PG, PG, &tag[i]) >= 0);
    CHECK_EQ(F.submit_ios(&rd), 0);
    CHECK_EQ(reap(&rd, cqe, NIO), NIO);
    for (int i = 0; i < NIO; i++)
        CHECK_EQ(cqe[i].result, PG);
    CHECK(memcmp(dst, iov.base, NIO * PG) == 0);

    /* an iov of the caller's memory; a read past the end of the file is short */
    uint8_t *mine = aligned_alloc(PG, 4 * PG);
    struct hf3fs_iov wrap;
    uint8_t id[16] = {1, 2, 3};
    CHECK_EQ(F.iovwrap(&wrap, mine, id, mount, 4 * PG, PG, -1), 0);
    CHECK(wrap.base == mine && memcmp(wrap.id, id, 16) == 0);
    memset(mine, 0, 4 * PG);
    /* the file ends at (2 * NIO - 1) pages: half a page is left at the second offset */
    CHECK(F.prep_io(&rd, &wrap, true, mine, fd, 2 * PG, PG, &tag[0]) >= 0);
    CHECK(F.prep_io(&rd, &wrap, true, mine + PG, fd, (2 * NIO - 2) * PG + PG / 2, PG, &tag[1]) >=
          0);
    CHECK_EQ(F.submit_ios(&rd), 0);
    CHECK_EQ(reap(&rd, cqe, 2), 2);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(cqe[i].result, cqe[i].userdata == &tag[0] ? (int64_t)PG : (int64_t)PG / 2);
    CHECK(memcmp(mine, iov.base + PG, PG) == 0);
    F.iovdestroy(&wrap); /* ignored for a wrapped iov, as the library does */
    CHECK(F.prep_io(&rd, &wrap, true, mine, fd, 0, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&rd), 0);
    CHECK_EQ(reap(&rd, cqe, 1), 1);

    /* I/Os are not run before they are submitted; a wait with nothing ready times out with 0 */
    double t0 = mono_s();
    struct timespec soon = in_ms(150);
    CHECK_EQ(F.wait_for_ios(&wr, cqe, 8, 1, &soon), 0);
    CHECK(mono_s() - t0 > 0.1);
    CHECK(F.prep_io(&wr, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    soon = in_ms(200);
    CHECK_EQ(F.wait_for_ios(&wr, cqe, 8, 1, &soon), 0);
    CHECK_EQ(F.submit_ios(&wr), 0);
    CHECK_EQ(reap(&wr, cqe, 1), 1);
    CHECK_EQ(cqe[0].result, PG);
    soon = in_ms(0);
    CHECK_EQ(F.wait_for_ios(&wr, cqe, 8, 0, &soon), 0);
    CHECK_EQ(F.wait_for_ios(&wr, cqe, 0, 0, NULL), -EINVAL); /* as the library */

    /* all ready ones come back in one call (FEW is off) */
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&wr, &iov, false, iov.base + i * PG, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&wr), 0);
    usleep(300000);
    CHECK_EQ(F.wait_for_ios(&wr, cqe, 8, 1, NULL), NIO);

    /* the ring full: -EAGAIN (3FS's prep_io), not a violation; a reaped slot is free again */
    struct hf3fs_ior small;
    CHECK_EQ(F.iorcreate4(&small, mount, 4, false, 0, 0, -1, 0), 0);
    int before = F.violations();
    for (int i = 0; i < 4; i++)
        CHECK(F.prep_io(&small, &iov, false, iov.base, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.prep_io(&small, &iov, false, iov.base, fd, 0, PG, NULL), -EAGAIN);
    CHECK_EQ(F.submit_ios(&small), 0);
    CHECK_EQ(F.prep_io(&small, &iov, false, iov.base, fd, 0, PG, NULL), -EAGAIN); /* not reaped */
    CHECK_EQ(F.violations(), before);
    struct timespec until = in_ms(10000);
    CHECK_EQ(F.wait_for_ios(&small, cqe, 1, 1, &until), 1);
    CHECK(F.prep_io(&small, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&small), 0);
    CHECK_EQ(reap(&small, cqe, 4), 4);
    F.iordestroy(&small);

    /* a file opened read-only cannot be written: -EACCES, as the library */
    int ro = open_in(mount, "rt", O_RDONLY);
    CHECK(F.reg_fd(ro, 0) <= 0);
    CHECK_EQ(F.prep_io(&wr, &iov, false, iov.base, ro, 0, PG, NULL), -EACCES);
    CHECK(F.prep_io(&rd, &iov, true, iov.base, ro, 0, PG, NULL) >= 0);
    /* a registered fd may be closed: its file is still used */
    F.dereg_fd(ro);
    close(ro);
    CHECK_EQ(F.submit_ios(&rd), 0);
    CHECK_EQ(reap(&rd, cqe, 1), 1);
    CHECK_EQ(cqe[0].result, PG);

    /* io_depth 2: the worker takes exactly two at a time */
    struct hf3fs_ior d2;
    CHECK_EQ(F.iorcreate4(&d2, mount, 4, false, 2, 0, -1, 0), 0);
    CHECK(F.prep_io(&d2, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&d2), 0);
    soon = in_ms(200);
    CHECK_EQ(F.wait_for_ios(&d2, cqe, 8, 1, &soon), 0);
    CHECK(F.prep_io(&d2, &iov, false, iov.base, fd, PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&d2), 0);
    CHECK_EQ(reap(&d2, cqe, 2), 2);
    F.iordestroy(&d2);

    /* KVPAGE_USRBIO_EMU_REG_RESULT=dup: reg_fd returns -(a dup), as 3FS; both numbers work */
    int fd2 = open_in(mount, "rt", O_RDWR);
    setenv("KVPAGE_USRBIO_EMU_REG_RESULT", "dup", 1);
    int r2 = F.reg_fd(fd2, 0);
    unsetenv("KVPAGE_USRBIO_EMU_REG_RESULT");
    CHECK(r2 < 0 && -r2 != fd2);
    CHECK(F.prep_io(&rd, &iov, true, iov.base, fd2, 0, PG, NULL) >= 0);
    CHECK(F.prep_io(&rd, &iov, true, iov.base, -r2, 0, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&rd), 0);
    CHECK_EQ(reap(&rd, cqe, 2), 2);
    CHECK(cqe[0].result == PG && cqe[1].result == PG);
    F.dereg_fd(fd2);
    close(fd2);

    F.iordestroy(&wr);
    F.iordestroy(&rd);
    F.iovdestroy(&iov);
    F.dereg_fd(fd);
    close(fd);
    free(mine);
}

/* ---- 3. violations, count mode ----------------------------------------- */

static void test_violations(void)
{
    int fd = open_in(mount, "viol", O_RDWR | O_CREAT | O_TRUNC);
    int unreg = open_in(mount, "viol2", O_RDWR | O_CREAT | O_TRUNC);
    CHECK(F.reg_fd(fd, 0) <= 0);
    struct hf3fs_iov iov, blk;
    CHECK_EQ(F.iovcreate(&iov, mount, 16 * PG, 0, -1), 0);
    CHECK_EQ(F.iovcreate(&blk, mount, 16 * PG, PG, -1), 0);
    struct hf3fs_ior wr;
    CHECK_EQ(F.iorcreate4(&wr, mount, 8, false, 0, 0, -1, 0), 0);
    struct hf3fs_cqe cqe[8];
    int before = F.violations();

    /* the range inside the iov */
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base + 16 * PG - 100, fd, 0, PG, NULL),
                    "not inside the iov");
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base - 1, fd, 0, 1, NULL),
                    "not inside the iov");
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, NULL, fd, 0, 1, NULL), "not inside the iov");
    /* no block_size boundary crossed (one that ends on a boundary is fine) */
    CHECK_VIOLATION(F.prep_io(&wr, &blk, false, blk.base + PG - 100, fd, 0, 200, NULL),
                    "crosses a block_size boundary");
    CHECK_VIOLATION(F.prep_io(&wr, &blk, false, blk.base, fd, 0, 2 * PG, NULL),
                    "crosses a block_size boundary");
    CHECK_EQ(F.violations(), before + 5);
    CHECK(F.prep_io(&wr, &blk, false, blk.base + PG, fd, 0, PG, NULL) >= 0);
    CHECK(F.prep_io(&wr, &iov, false, iov.base + PG - 100, fd, 0, 200, NULL) >= 0);
    CHECK_EQ(F.violations(), before + 5);
    /* len 0, off + len overflowing */
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, fd, 0, 0, NULL), "len 0");
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, fd, SIZE_MAX - 10, PG, NULL),
                    "off+len overflows");
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, fd, INT64_MAX, 1, NULL),
                    "off+len overflows");
    /* the fd registered */
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, unreg, 0, PG, NULL), "not registered");
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, INT_MIN, 0, PG, NULL), "not registered");
    CHECK(F.reg_fd(unreg, 0) <= 0);
    F.dereg_fd(unreg);
    CHECK_VIOLATION(F.prep_io(&wr, &iov, false, iov.base, unreg, 0, PG, NULL), "not registered");
    /* read as the ring is for */
    CHECK_VIOLATION(F.prep_io(&wr, &iov, true, iov.base, fd, 0, PG, NULL), "for_read=0");
    /* an iov of the emulation: not a zeroed one, not the ring's own memory, not one changed */
    struct hf3fs_iov fake;
    memset(&fake, 0, sizeof fake);
    fake.base = iov.base;
    fake.size = iov.size;
    CHECK_VIOLATION(F.prep_io(&wr, &fake, false, iov.base, fd, 0, PG, NULL),
                    "iov not created by hf3fs_iovcreate or hf3fs_iovwrap");
    CHECK_VIOLATION(F.prep_io(&wr, &wr.iov, false, wr.iov.base, fd, 0, PG, NULL),
                    "iov not created by hf3fs_iovcreate or hf3fs_iovwrap");
    CHECK_VIOLATION(F.prep_io(&wr, NULL, false, iov.base, fd, 0, PG, NULL), "iov not created");
    struct hf3fs_iov grown = iov;
    grown.size *= 2;
    CHECK_VIOLATION(F.prep_io(&wr, &grown, false, iov.base, fd, 0, PG, NULL), "changed");

    /* a destroyed iov; one destroyed while an I/O on it is not done (the I/O still runs) */
    struct hf3fs_iov gone;
    CHECK_EQ(F.iovcreate(&gone, mount, PG, 0, -1), 0);
    F.iovdestroy(&gone);
    CHECK_VIOLATION(F.prep_io(&wr, &gone, false, gone.base, fd, 0, PG, NULL),
                    "iov used after hf3fs_iovdestroy");
    CHECK_VIOLATION_VOID(F.iovdestroy(&gone), "destroyed twice");
    CHECK_VIOLATION_VOID(F.iovdestroy(&fake), "not created by hf3fs_iovcreate");
    CHECK_EQ(F.iovcreate(&gone, mount, PG, 0, -1), 0);
    memset(gone.base, 0x5a, PG);
    CHECK(F.prep_io(&wr, &gone, false, gone.base, fd, 8 * PG, PG, NULL) >= 0);
    CHECK_VIOLATION_VOID(F.iovdestroy(&gone), "not completed");
    CHECK_EQ(F.submit_ios(&wr), 0);
    CHECK_EQ(reap(&wr, cqe, 3), 3); /* with the two good ones above */
    for (int i = 0; i < 3; i++)
        CHECK(cqe[i].result == PG || cqe[i].result == 200);
    uint8_t page[4096], want[4096];
    memset(want, 0x5a, PG);
    CHECK_EQ(pread(fd, page, PG, 8 * PG), PG);
    CHECK(memcmp(page, want, PG) == 0);

    /* ring capacity, when it is made a violation (KVPAGE_USRBIO_EMU_FULL=violation) */
    setenv("KVPAGE_USRBIO_EMU_FULL", "violation", 1);
    struct hf3fs_ior two;
    CHECK_EQ(F.iorcreate4(&two, mount, 2, false, 0, 0, -1, 0), 0);
    unsetenv("KVPAGE_USRBIO_EMU_FULL");
    CHECK(F.prep_io(&two, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    CHECK(F.prep_io(&two, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    CHECK_VIOLATION(F.prep_io(&two, &iov, false, iov.base, fd, 0, PG, NULL), "ring capacity");
    CHECK_EQ(F.submit_ios(&two), 0);
    CHECK_EQ(reap(&two, cqe, 2), 2);
    CHECK(F.prep_io(&two, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    F.iordestroy(&two); /* with an I/O never submitted: fine */

    /* a ring never created; a destroyed one: every call is a violation, not a crash */
    struct hf3fs_ior never;
    memset(&never, 0, sizeof never);
    CHECK_VIOLATION(F.prep_io(&never, &iov, false, iov.base, fd, 0, PG, NULL),
                    "ior not created by hf3fs_iorcreate4");
    CHECK_VIOLATION(F.prep_io(NULL, &iov, false, iov.base, fd, 0, PG, NULL), "ior is NULL");
    struct hf3fs_ior dead;
    CHECK_EQ(F.iorcreate4(&dead, mount, 4, true, 0, 0, -1, 0), 0);
    struct hf3fs_ior copy = dead;
    F.iordestroy(&dead);
    CHECK_VIOLATION(F.prep_io(&dead, &iov, true, iov.base, fd, 0, PG, NULL),
                    "hf3fs_prep_io: ior used after hf3fs_iordestroy");
    CHECK_VIOLATION(F.submit_ios(&copy), "hf3fs_submit_ios: ior used after hf3fs_iordestroy");
    CHECK_VIOLATION(F.wait_for_ios(&dead, cqe, 8, 0, NULL),
                    "hf3fs_wait_for_ios: ior used after hf3fs_iordestroy");
    CHECK_VIOLATION(F.io_entries(&dead), "hf3fs_io_entries: ior used after hf3fs_iordestroy");
    CHECK_VIOLATION_VOID(F.iordestroy(&dead), "hf3fs_iordestroy: ior used after");

    /* each rule once above, and nothing else counted */
    CHECK_EQ(F.violations(), before + 28);

    F.iordestroy(&wr);
    F.iovdestroy(&iov);
    F.iovdestroy(&blk);
    F.dereg_fd(fd);
    close(fd);
    close(unreg);
}

/* ---- 4. threads ---------------------------------------------------------- */

struct prep_arg {
    const struct hf3fs_ior *ior;
    const struct hf3fs_iov *iov;
    int fd;
    int rc;
};

static void *prep_thread(void *p)
{
    struct prep_arg *a = p;
    a->rc = F.prep_io(a->ior, a->iov, false, a->iov->base, a->fd, 0, PG, NULL);
    return NULL;
}

struct wait_arg {
    const struct hf3fs_ior *ior;
    long ms;
    int rc;
};

static void *wait_thread(void *p)
{
    struct wait_arg *a = p;
    struct hf3fs_cqe cqe[4];
    struct timespec until = in_ms(a->ms);
    a->rc = F.wait_for_ios(a->ior, cqe, 4, 1, &until);
    return NULL;
}

static void test_threads(void)
{
    int fd = open_in(mount, "thr", O_RDWR | O_CREAT | O_TRUNC);
    CHECK(F.reg_fd(fd, 0) <= 0);
    struct hf3fs_iov iov;
    CHECK_EQ(F.iovcreate(&iov, mount, 4 * PG, 0, -1), 0);
    struct hf3fs_ior wr;
    setenv("KVPAGE_USRBIO_EMU_PREP_DELAY_US", "400000", 1); /* each prep_io sleeps 0.4 s */
    CHECK_EQ(F.iorcreate4(&wr, mount, 8, false, 0, 0, -1, 0), 0);
    unsetenv("KVPAGE_USRBIO_EMU_PREP_DELAY_US");
    struct hf3fs_cqe cqe[8];

    /* one after the other from two threads: fine */
    int before = F.violations();
    struct prep_arg a = {&wr, &iov, fd, 0}, b = a;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, prep_thread, &a);
    pthread_join(ta, NULL);
    pthread_create(&tb, NULL, prep_thread, &b);
    pthread_join(tb, NULL);
    CHECK(a.rc >= 0 && b.rc >= 0);
    CHECK_EQ(F.violations(), before);

    /* at once: the second one (0.1 s into the first one's 0.4 s) is a violation */
    pthread_create(&ta, NULL, prep_thread, &a);
    usleep(100000);
    pthread_create(&tb, NULL, prep_thread, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.rc >= 0);
    CHECK_EQ(b.rc, -EINVAL);
    CHECK_EQ(F.violations(), before + 1);
    CHECK(strstr(F.last_violation(), "two threads in hf3fs_prep_io") != NULL);
    CHECK_EQ(F.submit_ios(&wr), 0);
    CHECK_EQ(reap(&wr, cqe, 3), 3);

    /* two threads in wait_for_ios at once */
    struct wait_arg w = {&wr, 1500, 99};
    pthread_t tw;
    pthread_create(&tw, NULL, wait_thread, &w);
    usleep(200000);
    struct timespec now = in_ms(0);
    CHECK_VIOLATION(F.wait_for_ios(&wr, cqe, 8, 0, &now), "two threads in hf3fs_wait_for_ios");
    pthread_join(tw, NULL);
    CHECK_EQ(w.rc, 0); /* timed out: nothing was submitted */

    /* prep_io and submit in one thread while another waits: allowed */
    before = F.violations();
    w.ms = 10000;
    pthread_create(&tw, NULL, wait_thread, &w);
    usleep(100000);
    CHECK(F.prep_io(&wr, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&wr), 0);
    pthread_join(tw, NULL);
    CHECK_EQ(w.rc, 1);
    CHECK_EQ(F.violations(), before);

    F.iordestroy(&wr);
    F.iovdestroy(&iov);
    F.dereg_fd(fd);
    close(fd);
}

/* ---- 5. fault modes ------------------------------------------------------ */

static void ring_with(struct hf3fs_ior *ior, const char *env, const char *val)
{
    setenv(env, val, 1);
    CHECK_EQ(F.iorcreate4(ior, mount, 8, false, 0, 0, -1, 0), 0);
    unsetenv(env);
}

static void test_faults(void)
{
    int fd = open_in(mount, "faults", O_RDWR | O_CREAT | O_TRUNC);
    CHECK(F.reg_fd(fd, 0) <= 0);
    struct hf3fs_iov iov;
    CHECK_EQ(F.iovcreate(&iov, mount, NIO * PG, 0, -1), 0);
    fill(iov.base, NIO * PG, 3);
    struct hf3fs_cqe cqe[8];
    struct hf3fs_ior r;

    /* EARLY: run without a submit */
    ring_with(&r, "KVPAGE_USRBIO_EMU_EARLY", "1");
    CHECK(F.prep_io(&r, &iov, false, iov.base, fd, 0, PG, NULL) >= 0);
    struct timespec until = in_ms(10000);
    CHECK_EQ(F.wait_for_ios(&r, cqe, 8, 1, &until), 1);
    CHECK_EQ(cqe[0].result, PG);
    F.iordestroy(&r);

    /* FEW: min_results on one call, max(min_results, 1) on the next, whatever is ready */
    ring_with(&r, "KVPAGE_USRBIO_EMU_FEW", "1");
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&r, &iov, false, iov.base + i * PG, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&r), 0);
    until = in_ms(10000);
    CHECK_EQ(F.wait_for_ios(&r, cqe, 8, 3, &until), 3);
    usleep(300000); /* the other three are done */
    CHECK_EQ(F.wait_for_ios(&r, cqe + 3, 5, 1, &until), 1);
    CHECK_EQ(F.wait_for_ios(&r, cqe + 4, 4, 0, &until), 0);
    CHECK_EQ(reap(&r, cqe + 4, 2), 2);
    for (int i = 0; i < NIO; i++)
        CHECK_EQ(cqe[i].result, PG);
    F.iordestroy(&r);

    /* FAIL_EVERY=3: two of six fail with -EIO */
    ring_with(&r, "KVPAGE_USRBIO_EMU_FAIL_EVERY", "3");
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&r, &iov, false, iov.base + i * PG, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&r), 0);
    CHECK_EQ(reap(&r, cqe, NIO), NIO);
    int eio = 0, full = 0;
    for (int i = 0; i < NIO; i++) {
        eio += cqe[i].result == -EIO;
        full += cqe[i].result == (int64_t)PG;
    }
    CHECK_EQ(eio, 2);
    CHECK_EQ(full, 4);
    F.iordestroy(&r);

    /* SHORT_EVERY=2: three of six transfer half */
    ring_with(&r, "KVPAGE_USRBIO_EMU_SHORT_EVERY", "2");
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&r, &iov, false, iov.base + i * PG, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&r), 0);
    CHECK_EQ(reap(&r, cqe, NIO), NIO);
    int half = 0;
    full = 0;
    for (int i = 0; i < NIO; i++) {
        half += cqe[i].result == (int64_t)PG / 2;
        full += cqe[i].result == (int64_t)PG;
    }
    CHECK_EQ(half, 3);
    CHECK_EQ(full, 3);
    F.iordestroy(&r);

    /* none of them set: all six whole */
    CHECK_EQ(F.iorcreate4(&r, mount, 8, false, 0, 0, -1, 0), 0);
    for (int i = 0; i < NIO; i++)
        CHECK(F.prep_io(&r, &iov, false, iov.base + i * PG, fd, i * PG, PG, NULL) >= 0);
    CHECK_EQ(F.submit_ios(&r), 0);
    CHECK_EQ(reap(&r, cqe, NIO), NIO);
    full = 0;
    for (int i = 0; i < NIO; i++)
        full += cqe[i].result == (int64_t)PG;
    CHECK_EQ(full, NIO);
    F.iordestroy(&r);

    F.iovdestroy(&iov);
    F.dereg_fd(fd);
    close(fd);
}

int main(void)
{
    load();
    char tmpl[64], tmpl2[64];
    scratch_make(tmpl, sizeof tmpl, "usrbio_emu", 0);
    scratch_make(tmpl2, sizeof tmpl2, "usrbio_out", 0);
    if (!realpath(tmpl, mount) || !realpath(tmpl2, outside)) {
        perror("realpath");
        return 1;
    }
    char sub[PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/sub", mount);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s-sib", mount);
    mkdir(sub, 0755);
    setenv("KVPAGE_USRBIO_EMU_MOUNT", mount, 1);

    test_abort_default(); /* before any ring: no threads when it forks */
    setenv("KVPAGE_USRBIO_EMU_VIOLATIONS", "count", 1);
    test_mount_point();
    int before = F.violations();
    test_roundtrip();
    CHECK_EQ(F.violations(), before); /* the round trips keep every rule */
    test_violations();
    test_threads();
    before = F.violations();
    test_faults();
    CHECK_EQ(F.violations(), before);

    scratch_remove(mount);
    scratch_remove(outside);
    scratch_remove(sub);
    return check_report();
}
