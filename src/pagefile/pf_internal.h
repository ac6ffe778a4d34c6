/*
 * pf_internal.h — what the pagefile front end (pagefile.c) and its backends
 * share: the handle, the backend struct every backend fills (psync.c,
 * uring.c, usrbio.c) and their table (pf_table.c), and the helpers below the backends (pf_io.c: the
 * plain transfer, the EAGAIN pause, the fault-injection hook the tests use; pf_map.c: mmap reads).
 * A backend calls only those helpers, never the front end. kvp__ names: internal, reachable from
 * tests through kvpage_internal.
 *
 * Adding a backend: a file with its struct kvp__pf_backend (its id, name,
 * AUTO claims and picks, and its own per-handle state behind a void *), one
 * row in pf_backends.def, and its id in pagefile.h
 * (docs/adding-a-backend.md, "A page-I/O backend").
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

/* The sites, by backend: one numbering the tests name (a new backend adds
 * its own at the end). */
enum kvp__pf_site {
    KVP__PF_PREAD = 1,     /* psync, before each pread attempt */
    KVP__PF_PWRITE,        /* psync, before each pwrite attempt */
    KVP__PF_URING_READ,    /* uring, when a read SQE is prepared */
    KVP__PF_URING_WRITE,   /* uring, when a write SQE is prepared */
    KVP__PF_URING_SUBMIT,  /* uring, before io_uring_submit_and_wait (offset, len: 0) */
    KVP__PF_URING_INIT,    /* uring, before io_uring_queue_init (offset, len: 0) */
    KVP__PF_USRBIO_READ,   /* usrbio, when a read is prepared */
    KVP__PF_USRBIO_WRITE,  /* usrbio, when a write is prepared */
    KVP__PF_USRBIO_INIT,   /* usrbio, before a ring's staging iov is created (offset, len: 0) */
    KVP__PF_USRBIO_SUBMIT, /* usrbio, before hf3fs_submit_ios (offset, len: 0): an error breaks
                              the ring */
};

/*
 * Called at each site with the range about to be transferred. Returns
 * 0 to proceed normally, a positive byte count to shorten the transfer to
 * that many bytes (a short read or write), or a negative errno to make the
 * attempt fail with it without doing the I/O (for URING_READ/WRITE the
 * error comes back as the completion's result; for USRBIO_READ/WRITE it is
 * the op's result and the op is not prepared). May be called from any
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

/* The segments of a vectored op (kvp_pagefile_readv/writev) as psync moves
 * them: one preadv/pwritev; n == 0 for a plain op. */
struct kvp__pf_vec {
    const struct iovec *iov;
    int n;
};

/* One batch as the backends see it: already validated. */
struct kvp__pf_batch {
    const struct kvp_pagefile_op *ops;
    int64_t *results; /* filled by the backend: bytes or -errno per op */
    size_t n;
    int write;
    /* NULL, or per op its segments (ops[i].buf then unused when vec[i].n):
     * only given to psync, which moves such an op whole, never in pieces. */
    const struct kvp__pf_vec *vec;
    /* Integrity tags (pf_tags.c): NULL, or the ops whose digest is wanted
     * (tag_want[i]). A backend hashes such an op's bytes where they are hot
     * in the cache (a write's before it moves them, a read's right after),
     * with kvp__pf_tag_piece, in pieces from any thread; the front end
     * hashes what a backend did not (tag_bytes[i] short of the op's size). */
    const uint8_t *tag_want;
    uint64_t *tag_digest, *tag_bytes;
};

/* Hashes bytes [start, start + len) of op i of b (p: their first byte;
 * start a multiple of KVP__PF_TAG_BLOCK) into its digest, if it is wanted. */
void kvp__pf_tag_piece(const struct kvp__pf_batch *b, size_t i, const void *p, uint64_t start,
                       uint64_t len);
/* After a read batch of uring or usrbio (its ring released): the reads that
 * completed and are not hashed yet, hashed on the calling thread and the
 * handle's helper thread when they are 1 MiB or more (else, and for
 * whatever else is left, the front end's kvp__pf_tags_fill). */
void kvp__pf_tags_tail(struct kvp_pagefile *pf, const struct kvp__pf_batch *b);
/* Copies len bytes to dst from src (a staged op i of b) and, when op i's
 * digest is wanted and len is its size, hashes dst's bytes into it block by
 * block, each right after its copy (while it is in L1). */
void kvp__pf_tag_copy(const struct kvp__pf_batch *b, size_t i, void *dst, const void *src,
                      uint64_t len);

struct kvp_pagefile;

/*
 * How an operation's bytes move, [0] reads, [1] writes: the plain transfer
 * (kvp__pf_pio on the handle's fd) or, for reads with
 * KVP_PAGEFILE_MMAP_READS, the copy out of the mapping. Set at open; the
 * psync pool calls it for each piece. Returns as kvp__pf_pio.
 */
typedef int64_t (*kvp__pf_xfer_fn)(const struct kvp_pagefile *pf, int write, void *buf,
                                   uint64_t len, int64_t off);

/* kvp__pf_backend.auto_for: the cells of AUTO's choice, [direct][write],
 * where the backend is the faster one (bench/io); a cell no row claims goes
 * to the default row (the first of pf_backends.def). */
#define KVP__PF_AUTO_CELL(direct, write) (1u << ((direct)*2 + (write)))

/* kvp__pf_backend.caps: what the front end may hand the backend. */
enum {
    /* b->vec: a vectored op moves whole, from its segments (else the front
     * end splits it into plain ops, or stages it). */
    KVP__PF_CAP_VEC = 1,
    /* Moves bytes with the handle's kvp__pf_xfer_fn (pf->xfer), so
     * KVP_PAGEFILE_MMAP_READS reads can run on it. */
    KVP__PF_CAP_XFER = 2,
};

/*
 * A page-I/O backend. The front end picks one per direction at open, starts
 * each backend it picked once (both directions may share it), hands it the
 * validated batches of its directions, and stops it at close. What start
 * sets up for the handle is the backend's own: a void * (*state) the front
 * end keeps and hands back to every other call, never looks into.
 */
struct kvp__pf_backend {
    int id;           /* KVP_PAGEFILE_BACKEND_* (test backends: from 100, tests/backends) */
    const char *name; /* kvp_pagefile_backend_name: "psync", "uring" */
    /* One line for people (kvp_pagefile_backend_description, kvpage
     * backends, bench io --help): how it moves pages, and what it wants. */
    const char *description;
    /* What may be unavailable, for messages ("io_uring"), or NULL when the
     * backend is always there (the default row: the fallback of the others). */
    const char *what;
    unsigned auto_for; /* KVP__PF_AUTO_CELL bits: AUTO picks it there */
    unsigned caps;     /* KVP__PF_CAP_* */
    /* Under AUTO: 1 when this backend wants the file (usrbio: the file is on
     * 3FS), asked before auto_for; NULL for never. */
    int (*claims)(const struct kvp_pagefile *pf);
    /*
     * Sets the backend up for pf from the handle's options, its state in
     * *state. Returns 0, or a -errno with why (NUL-terminated, at most whylen
     * bytes) saying what failed: with `what` set, the cause
     * ("io_uring_queue_init: ..."), which the front end words as "WHAT is
     * unavailable (CAUSE)"; else the whole message. On failure nothing is
     * left to stop.
     */
    int (*start)(struct kvp_pagefile *pf, void **state, char *why, size_t whylen);
    void (*stop)(struct kvp_pagefile *pf, void *state); /* what start set up */
    void (*run)(struct kvp_pagefile *pf, void *state, struct kvp__pf_batch *b); /* fills results */
    /* Registers the caller's regions (already checked non-empty), replacing
     * any earlier ones; NULL when the backend has nothing to register. */
    int (*reg)(struct kvp_pagefile *pf, void *state, const struct kvp_pagefile_buf *bufs, size_t n,
               struct kvp_error *err);
    void (*unreg)(struct kvp_pagefile *pf, void *state);
    /* Memory for kvp_pagefile_alloc that the backend can do I/O on without a
     * copy (NULL: the front end's aligned malloc); free returns 1 when ptr was
     * the backend's (and frees it), else 0. */
    void *(*alloc)(struct kvp_pagefile *pf, void *state, uint64_t size, struct kvp_error *err);
    int (*free)(struct kvp_pagefile *pf, void *state, void *ptr);
    /* Adds what the backend knows to info (threads, queues, registered buffers). */
    void (*info)(const struct kvp_pagefile *pf, void *state, struct kvp_pagefile_info *info);
};

/* The table (pf_table.c, from pf_backends.def): every backend, the default
 * row first, NULL-terminated. */
extern const struct kvp__pf_backend *const kvp__pf_backends[];

struct kvp__pf_tags; /* pf_tags.c */

struct kvp_pagefile {
    int fd;
    char *path;
    uint64_t size, file_size, bytes_per_page, chunk_bytes;
    uint32_t entries, flags, mode, threads_asked, queues_asked;
    int backend_req;
    const struct kvp__pf_backend *be[2];      /* [0] reads, [1] writes */
    void *be_state[2];                        /* the state of be[0], be[1] */
    const struct kvp__pf_backend *started[2]; /* the distinct backends started, in order */
    void *state[2];                           /* their states (start's *state) */
    kvp__pf_xfer_fn xfer[2];                  /* [0] reads, [1] writes */
    uint32_t mem_align, off_align;
    char *map;                 /* KVP_PAGEFILE_MMAP_READS: [0, size) mapped read-only, or NULL */
    uint64_t map_page;         /* the page size mincore counts in */
    struct kvp__pf_tags *tags; /* integrity tags, NULL when off */
    int tags_mode;             /* kvp_pagefile_info.tags: 0 off, 1 on, 2 legacy */
    char note[256];
};

/* The front end's error filler and note (pagefile.c), for the modules below it. */
__attribute__((format(printf, 6, 7))) int kvp__pf_fail(struct kvp_error *err, int code, int rule,
                                                       int64_t index, int64_t value,
                                                       const char *fmt, ...);
__attribute__((format(printf, 2, 3))) void kvp__pf_note(struct kvp_pagefile *pf, const char *fmt,
                                                        ...);

/* ---- integrity tags (pf_tags.c) ----------------------------------------- */

/* A digest is the XOR of XXH3 over blocks of this many bytes of the op. */
#define KVP__PF_TAG_BLOCK ((uint64_t)64 << 10)

/* psync moves an op whose digest is wanted in steps of this many bytes,
 * each hashed right after it moved, while in the cache (a multiple of
 * KVP__PF_TAG_BLOCK). bench/io/tags_cpu.c, 2 MiB buffered reads, CPU-bound
 * speed with tags over without: 128 KiB steps 0.77, 256 KiB 0.83, 512 KiB
 * 0.80, 1 MiB 0.73. */
#define KVP__PF_TAG_STEP ((uint64_t)256 << 10)

/* Why a read was rejected. */
enum {
    KVP__PF_TAG_DIGEST = 1,
    KVP__PF_TAG_KEY,
    KVP__PF_TAG_LEN,
    KVP__PF_TAG_START,
    KVP__PF_TAG_NOTZERO,
    KVP__PF_TAG_NOKEY,
    KVP__PF_TAG_UNTAGGED,
    KVP__PF_TAG_BAD,
    KVP__PF_TAG_DAMAGED,
};

/* The first op of a batch the tags rejected (index -1: none). */
struct kvp__pf_reject {
    int64_t index;
    uint64_t slot;
    int why;
};

/* The digest part of an op of oplen bytes: the blocks of [from, from + len),
 * from a multiple of KVP__PF_TAG_BLOCK, p its first byte. Parts XOR together. */
uint64_t kvp__pf_tag_blocks(const void *p, uint64_t oplen, uint64_t from, uint64_t len);
const char *kvp__pf_tag_why(int why);
/* Opens (creating when needed) the sidecar of pf, or none with tags off;
 * created: this open created the page file. *made: the sidecar is this
 * open's (kvp__pf_tags_close(pf, 1) then removes it). */
int kvp__pf_tags_open(struct kvp_pagefile *pf, int created, int *made, struct kvp_error *err);
void kvp__pf_tags_close(struct kvp_pagefile *pf, int remove);
int kvp__pf_tags_sync(struct kvp_pagefile *pf, struct kvp_error *err);
/* Before a batch: a write's slots become BAD; want[i] = 1 for the ops whose
 * digest the batch needs (a write's whole-slot ops; a read's ops of a
 * TAGGED slot that match it). */
void kvp__pf_tags_begin(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                        int write, uint8_t *want);
/* The digests of the wanted ops not (fully) hashed by the backend (vops: the
 * vectored ops whose whole ranges are ops, or NULL). */
void kvp__pf_tags_fill(const struct kvp_pagefile_op *ops, const struct kvp_pagefile_vop *vops,
                       size_t n, const uint8_t *want, uint64_t *digests, const uint64_t *bytes);
/* After a write batch: its ops' tags. */
void kvp__pf_tags_wend(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                       const char *const *keys, size_t n, const int64_t *results,
                       const uint8_t *want, const uint64_t *digests);
/* After a read batch: rejected ops' results become -EBADMSG. digests[i]:
 * op i's, when want[i]. */
void kvp__pf_tags_rcheck(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                         const struct kvp_pagefile_vop *vops, const char *const *keys, size_t n,
                         int64_t *results, const uint8_t *want, const uint64_t *digests,
                         struct kvp__pf_reject *rej);
void kvp__pf_tags_info(const struct kvp_pagefile *pf, struct kvp_pagefile_info *info);

/* ---- below the backends (pf_io.c) ---------------------------------------- */

/* How many EAGAIN in a row a transfer tolerates before reporting it; past
 * KVP__PF_AGAIN_SPIN of them it sleeps 100 us between attempts (~0.1 s in all). */
#define KVP__PF_MAX_AGAIN 1000
/* Rings (batches in flight at once) of uring, and of usrbio each way, when
 * opts.queues is 0 (kvpage/pagefile.h). */
#define KVP__PF_DEFAULT_QUEUES 4u
#define KVP__PF_AGAIN_SPIN 100

/* The pause before the n-th retry of an EAGAIN. */
void kvp__pf_again_pause(unsigned n);

/*
 * Transfers [off, off + len) with pread/pwrite until complete, retrying
 * EINTR and EAGAIN. Returns bytes done (< len only at end of file) or -errno.
 */
int64_t kvp__pf_pio(int fd, int write, void *buf, uint64_t len, int64_t off);

/* kvp__pf_pio for the segments iov[0..n) laid back to back from off, len
 * bytes in all: one preadv/pwritev, the rest of a short transfer segment by
 * segment (and every segment by itself while a fault hook is installed). */
struct iovec;
int64_t kvp__pf_piov(int fd, int write, const struct iovec *iov, int n, uint64_t len, int64_t off);

/* kvp__pf_pio on the handle's fd: the plain kvp__pf_xfer_fn. */
int64_t kvp__pf_xfer_plain(const struct kvp_pagefile *pf, int write, void *buf, uint64_t len,
                           int64_t off);

/* Runs a whole batch on the calling thread, one op after the other. */
void kvp__pf_run_inline(struct kvp_pagefile *pf, struct kvp__pf_batch *b);

/* CPUs online, at least 1: the psync threads by default, and how many copy at once. */
static inline uint32_t kvp__pf_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (uint32_t)n;
}

/* Tags: 256 KiB claims of digests hashed by the helper thread so far (for the tests). */
uint64_t kvp__pf_tags_helped(void);

/* psync: pieces run by pool workers so far, by every handle (for the tests). */
uint64_t kvp__pf_pool_helped(void);

/* KVP_PAGEFILE_MMAP_READS (pf_map.c): map_open returns 0 or -errno of mmap. */
int kvp__pf_map_open(struct kvp_pagefile *pf);
void kvp__pf_map_close(struct kvp_pagefile *pf);
/* The read strategy of a mapped handle (a kvp__pf_xfer_fn for reads only):
 * [off, off + len) out of the mapping, or with pread where a page is not in
 * the page cache; returns as kvp__pf_pio. */
int64_t kvp__pf_map_read(const struct kvp_pagefile *pf, int write, void *buf, uint64_t len,
                         int64_t off);
/* Reads served out of a mapping so far, by every handle of the process (for the tests). */
uint64_t kvp__pf_map_copies(void);

/* Direct I/O alignment of fd from statx, or 0 when the kernel does not say. */
void kvp__pf_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align);

#endif
