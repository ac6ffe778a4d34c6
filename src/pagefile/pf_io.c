/*
 * pf_io.c — below the backends: the plain synchronous transfer every
 * backend falls back on, the pause between EAGAIN retries, and the
 * fault-injection hook of the tests.
 */
#include <errno.h>
#include <sched.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "pagefile/pf_internal.h"

/* ---- fault injection -------------------------------------------------- */

static _Atomic(kvp__pf_fault_fn) pf_fault_fn;
static _Atomic(void *) pf_fault_arg;

void kvp__pagefile_set_fault(kvp__pf_fault_fn fn, void *arg)
{
    atomic_store(&pf_fault_arg, arg);
    atomic_store(&pf_fault_fn, fn);
}

int64_t kvp__pf_fault(int site, int64_t offset, uint64_t len)
{
    kvp__pf_fault_fn fn = atomic_load_explicit(&pf_fault_fn, memory_order_acquire);
    if (!fn)
        return 0;
    return fn(atomic_load(&pf_fault_arg), site, offset, len);
}

int kvp__pf_fault_on(void)
{
    return atomic_load_explicit(&pf_fault_fn, memory_order_acquire) != NULL;
}

/* ---- plain synchronous transfer ---------------------------------------- */

void kvp__pf_again_pause(unsigned n)
{
    if (n < KVP__PF_AGAIN_SPIN) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

int64_t kvp__pf_pio(int fd, int write, void *buf, uint64_t len, int64_t off)
{
    uint64_t done = 0;
    unsigned again = 0;
    while (done < len) {
        uint64_t want = len - done;
        int64_t f =
            kvp__pf_fault(write ? KVP__PF_PWRITE : KVP__PF_PREAD, off + (int64_t)done, want);
        ssize_t r;
        if (f < 0) {
            r = -1;
            errno = (int)-f;
        } else {
            if (f > 0 && (uint64_t)f < want)
                want = (uint64_t)f;
            r = write ? pwrite(fd, (char *)buf + done, want, off + (off_t)done)
                      : pread(fd, (char *)buf + done, want, off + (off_t)done);
        }
        if (r < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            if (e == EAGAIN && ++again < KVP__PF_MAX_AGAIN) {
                kvp__pf_again_pause(again);
                continue;
            }
            return -e;
        }
        if (r == 0)
            /* A write that makes no progress would loop forever; a read stops at EOF. */
            return write ? -EIO : (int64_t)done;
        done += (uint64_t)r;
        again = 0;
    }
    return (int64_t)done;
}

/* The segments from byte `done` on, one kvp__pf_pio each. */
static int64_t pf_piov_rest(int fd, int write, const struct iovec *iov, int n, uint64_t done,
                            int64_t off)
{
    uint64_t at = 0; /* where segment k starts */
    for (int k = 0; k < n; at += iov[k].iov_len, k++) {
        uint64_t seg = iov[k].iov_len;
        if (at + seg <= done)
            continue;
        uint64_t skip = done - at;
        int64_t r =
            kvp__pf_pio(fd, write, (char *)iov[k].iov_base + skip, seg - skip, off + (int64_t)done);
        if (r < 0)
            return r;
        done += (uint64_t)r;
        if ((uint64_t)r < seg - skip)
            break; /* end of file */
    }
    return (int64_t)done;
}

int64_t kvp__pf_piov(int fd, int write, const struct iovec *iov, int n, uint64_t len, int64_t off)
{
    uint64_t done = 0;
    if (!kvp__pf_fault_on()) {
        for (;;) {
            ssize_t r = write ? pwritev(fd, iov, n, off) : preadv(fd, iov, n, off);
            if (r >= 0) {
                done = (uint64_t)r;
                break;
            }
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -errno;
            break; /* the per-segment path retries EAGAIN with its pauses */
        }
        if (done == len)
            return (int64_t)done;
    }
    return pf_piov_rest(fd, write, iov, n, done, off);
}

int64_t kvp__pf_xfer_plain(const struct kvp_pagefile *pf, int write, void *buf, uint64_t len,
                           int64_t off)
{
    return kvp__pf_pio(pf->fd, write, buf, len, off);
}

void kvp__pf_run_inline(struct kvp_pagefile *pf, struct kvp__pf_batch *b)
{
    /* Wanted digests are hashed by the front end after this (tag_bytes
     * stays short): the inline path is a fallback, not a fast one. */
    for (size_t i = 0; i < b->n; i++)
        b->results[i] =
            b->vec && b->vec[i].n
                ? kvp__pf_piov(pf->fd, b->write, b->vec[i].iov, b->vec[i].n, b->ops[i].size,
                               b->ops[i].offset)
                : kvp__pf_pio(pf->fd, b->write, b->ops[i].buf, b->ops[i].size, b->ops[i].offset);
}
