/*
 * tests/integration/faultshim.c — test-only fault injection, never installed:
 * an LD_PRELOAD library for the real server (test_disk.py builds it), and
 * linked into tests/unit/test_diskfull.c. While the file named by $KVP_FAULT_CTL
 * exists, it makes the log's and the snapshots' file operations fail. Each
 * line of that file is "<point> <ERRNO>" with ERRNO one of ENOSPC, EDQUOT,
 * EIO, and point one of
 *   zero       pwrite of zeros to a wal-* file (the space written ahead)
 *   append     pwrite of records to a wal-* file
 *   fdatasync  fdatasync of a wal-* file
 *   rotate     creating a wal-* file (a new segment)
 *   snapshot   write to a snap-* file (in the snapshot child)
 * Other files (stderr, sockets, the pipe of libmicrohttpd) are never touched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* Reads the control file with raw system calls (no recursion into the shim). */
static int fault_for(const char *point)
{
    const char *ctl = getenv("KVP_FAULT_CTL");
    if (!ctl)
        return 0;
    int saved = errno;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, ctl, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved;
        return 0;
    }
    char buf[512];
    ssize_t n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    errno = saved;
    if (n <= 0)
        return 0;
    buf[n] = 0;
    size_t pl = strlen(point);
    for (char *line = buf; line && *line;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        if (!strncmp(line, point, pl) && line[pl] == ' ') {
            const char *e = line + pl + 1;
            if (!strncmp(e, "ENOSPC", 6))
                return ENOSPC;
            if (!strncmp(e, "EDQUOT", 6))
                return EDQUOT;
            if (!strncmp(e, "EIO", 3))
                return EIO;
        }
        line = next;
    }
    return 0;
}

/* 1 when fd is a file whose name starts with prefix ("wal-", "snap-"). */
static int fd_is(int fd, const char *prefix)
{
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int saved = errno;
    ssize_t n = readlink(link, path, sizeof path - 1);
    errno = saved;
    if (n <= 0)
        return 0;
    path[n] = 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return !strncmp(base, prefix, strlen(prefix));
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    return n == 0 || (b[0] == 0 && memcmp(b, b + 1, n - 1) == 0);
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    int e = 0;
    if (fd_is(fd, "wal-"))
        e = fault_for(all_zero(buf, n) ? "zero" : "append");
    if (e) {
        errno = e;
        return -1;
    }
    return NEXT(pwrite)(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    return pwrite(fd, buf, n, off);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    int e = fd > 2 && fd_is(fd, "snap-") ? fault_for("snapshot") : 0;
    if (e) {
        errno = e;
        return -1;
    }
    return NEXT(write)(fd, buf, n);
}

int fdatasync(int fd)
{
    int e = fd_is(fd, "wal-") ? fault_for("fdatasync") : 0;
    if (e) {
        errno = e;
        return -1;
    }
    return NEXT(fdatasync)(fd);
}

int openat(int dirfd, const char *name, int flags, ...)
{
    mode_t mode = 0;
    if (flags & O_CREAT) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    int e = (flags & O_CREAT) && !strncmp(base, "wal-", 4) ? fault_for("rotate") : 0;
    if (e) {
        errno = e;
        return -1;
    }
    return NEXT(openat)(dirfd, name, flags, mode);
}
