/*
 * pf_internal.h — what the pagefile front end and its two backends share,
 * plus the fault-injection hook the tests use (kvp__ names: internal,
 * reachable from tests through kvpage_internal).
 */
#ifndef KVPAGE_PF_INTERNAL_H
#define KVPAGE_PF_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include "kvpage/pagefile.h"

/* ---- fault injection -------------------------------------------------- */

enum kvp__pf_site {
    KVP__PF_PREAD = 1,    /* psync, before each pread attempt */
    KVP__PF_PWRITE,       /* psync, before each pwrite attempt */
    KVP__PF_URING_READ,   /* uring, when a read SQE is prepared */
    KVP__PF_URING_WRITE,  /* uring, when a write SQE is prepared */
    KVP__PF_URING_SUBMIT, /* uring, before io_uring_submit_and_wait (offset, len: 0) */
    KVP__PF_URING_INIT,   /* uring, before io_uring_queue_init (offset, len: 0) */
};

/*
 * Called at each site with the range about to be transferred. Returns
 * 0 to proceed normally, a positive byte count to shorten the transfer to
 * that many bytes (a short read or write), or a negative errno to make the
 * attempt fail with it without doing the I/O (for URING_READ/WRITE the
 * error comes back as the completion's result). May be called from any
 * thread at once.
 */
typedef int64_t (*kvp__pf_fault_fn)(void *arg, int site, int64_t offset, uint64_t len);

/* Installs (fn != NULL) or removes the hook for every handle of the process. */
void kvp__pagefile_set_fault(kvp__pf_fault_fn fn, void *arg);
/* The hook's verdict for a site, 0 when no hook is installed. */
int64_t kvp__pf_fault(int site, int64_t offset, uint64_t len);
/* 1 while a hook is installed. */
int kvp__pf_fault_on(void);

/* ---- the handle ------------------------------------------------------- */

/* One batch as the backends see it: already validated. */
struct kvp__pf_batch {
    const struct kvp_pagefile_op *ops;
    int64_t *results; /* filled by the backend: bytes or -errno per op */
    size_t n;
    int write;
};

struct kvp__pf_pool;   /* psync.c */
struct kvp__pf_urings; /* uring.c */

struct kvp_pagefile {
    int fd;
    char *path;
    uint64_t size, file_size, bytes_per_page, chunk_bytes;
    uint32_t entries, flags, mode, threads_asked, queues_asked;
    int backend_req;
    int backend[2]; /* [0] reads, [1] writes: PSYNC or URING */
    uint32_t mem_align, off_align;
    struct kvp__pf_pool *pool;
    struct kvp__pf_urings *urings;
    char *map;         /* KVP_PAGEFILE_MMAP_READS: [0, size) mapped read-only, or NULL */
    uint64_t map_page; /* the page size mincore counts in */
    char note[256];
};

/* How many EAGAIN in a row a transfer tolerates before reporting it; past
 * KVP__PF_AGAIN_SPIN of them it sleeps 100 us between attempts (~0.1 s in all). */
#define KVP__PF_MAX_AGAIN 1000
#define KVP__PF_AGAIN_SPIN 100

/* The pause before the n-th retry of an EAGAIN. */
void kvp__pf_again_pause(unsigned n);

/*
 * Transfers [off, off + len) with pread/pwrite until complete, retrying
 * EINTR and EAGAIN. Returns bytes done (< len only at end of file) or -errno.
 */
int64_t kvp__pf_pio(int fd, int write, void *buf, uint64_t len, int64_t off);

/* Runs a whole batch on the calling thread, one op after the other. */
void kvp__pf_run_inline(struct kvp_pagefile *pf, struct kvp__pf_batch *b);

/* psync backend */
int kvp__pf_pool_start(struct kvp_pagefile *pf, uint32_t threads);
void kvp__pf_pool_stop(struct kvp_pagefile *pf);
void kvp__pf_pool_run(struct kvp_pagefile *pf, struct kvp__pf_batch *b);
uint32_t kvp__pf_pool_threads(const struct kvp_pagefile *pf);
uint64_t kvp__pf_pool_helped(void); /* pieces run by pool workers so far (tests) */

/* CPUs online, at least 1: the psync threads by default, and how many copy at once. */
static inline uint32_t kvp__pf_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (uint32_t)n;
}

/* uring backend: start returns 0 or the -errno of io_uring setup. */
int kvp__pf_uring_start(struct kvp_pagefile *pf, uint32_t queues);
void kvp__pf_uring_stop(struct kvp_pagefile *pf);
void kvp__pf_uring_run(struct kvp_pagefile *pf, struct kvp__pf_batch *b);
uint32_t kvp__pf_uring_queues(const struct kvp_pagefile *pf);
int kvp__pf_uring_register(struct kvp_pagefile *pf, const struct kvp_pagefile_buf *bufs, size_t n,
                           struct kvp_error *err);
void kvp__pf_uring_unregister(struct kvp_pagefile *pf);
uint32_t kvp__pf_uring_nregs(const struct kvp_pagefile *pf);

/* KVP_PAGEFILE_MMAP_READS (pf_map.c): map_open returns 0 or -errno of mmap. */
int kvp__pf_map_open(struct kvp_pagefile *pf);
void kvp__pf_map_close(struct kvp_pagefile *pf);
/* Reads [off, off + len) out of the mapping, or with pread where a page is not
 * in the page cache; returns as kvp__pf_pio. */
int64_t kvp__pf_map_read(const struct kvp_pagefile *pf, void *buf, uint64_t len, int64_t off);
/* Reads served out of a mapping so far, by every handle of the process (for the tests). */
uint64_t kvp__pf_map_copies(void);

/* Direct I/O alignment of fd from statx, or 0 when the kernel does not say. */
void kvp__pf_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align);

#endif
