/*
 * kvpage/pagefile.h — batched page I/O on one storage file (the job of
 * Hf3fsClient in the engines).
 *
 * A page file is a regular file (or block device) of `size` bytes holding
 * pages of at most `bytes_per_page` bytes. An engine moves KV pages between
 * its host memory and the file with batches of up to `entries` operations,
 * each an (offset, buffer, size) triple; offsets are byte offsets, normally
 * page_index * bytes_per_page.
 *
 * A batch is validated as a whole before any I/O starts. A batch that breaks
 * a rule returns -EINVAL, performs no I/O, fills the caller's struct
 * kvp_error (which operation, which rule, a message) and leaves the handle
 * fully usable: unlike the reference client, a bad batch never closes it.
 *
 * The operations of one batch run concurrently (several threads or one
 * io_uring queue), so their order is unspecified: a batch that writes one
 * file range twice, or reads into overlapping buffers, gets one of the
 * possible outcomes. Short transfers are continued until complete; EINTR and
 * EAGAIN are retried. Regions never written read as zeros.
 *
 * Thread safety: one handle may be used by any number of threads at once for
 * kvp_pagefile_read, kvp_pagefile_write (and their vectored and keyed
 * forms), kvp_pagefile_verify, kvp_pagefile_flush,
 * kvp_pagefile_register_buffers, kvp_pagefile_unregister_buffers and every
 * getter. Only kvp_pagefile_close must not race with any other call on the
 * same handle.
 */
#ifndef KVPAGE_PAGEFILE_H
#define KVPAGE_PAGEFILE_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvp_pagefile_opts.flags */
#define KVP_PAGEFILE_CREATE 0x1u  /* create the file when missing (its directory must exist) */
#define KVP_PAGEFILE_DIRECT 0x2u  /* O_DIRECT: bypass the page cache; see the alignment getters */
#define KVP_PAGEFILE_ALIGNED 0x4u /* every offset must be a multiple of bytes_per_page */
#define KVP_PAGEFILE_EXACT_SIZE                                                                    \
    0x8u /* an existing file larger than size is an error, not accepted */
#define KVP_PAGEFILE_READONLY 0x10u /* open read-only; writes fail with -EBADF (KVP_RULE_ARG) */
/*
 * Buffered reads of pages that are in the page cache are copied out of a
 * read-only shared mapping of the file, with stores that bypass the CPU caches
 * (x86-64; elsewhere memcpy), instead of pread: the copy into cold host memory
 * skips reading every destination line first (bench/io: 1.4-1.9x the GB/s
 * of pread into a cold 1 GiB pool on 2 cores). Ranges not in the page cache
 * (mincore) use pread as before. Reads run on the psync threads (with
 * backend AUTO; URING or DIRECT with this flag is -EINVAL). The price, why it
 * is not the default: a page evicted between that check and the copy is read
 * back by a page fault, and if the device fails then, or another program
 * truncates the file, the process receives SIGBUS where pread would have
 * returned -EIO or a short read. If the file cannot be mapped, reads use
 * pread and kvp_pagefile_backend_note says why.
 */
#define KVP_PAGEFILE_MMAP_READS 0x20u
/* With KVP_PAGEFILE_CREATE: create the missing parent directories too (0755).
 * Without it a missing directory is -ENOENT naming it: a file under an
 * unmounted mount point must not land on the disk below. */
#define KVP_PAGEFILE_MKDIR 0x40u
/*
 * Integrity tags off: no sidecar PATH.tags is opened or made, every read is
 * served unverified (as before tags existed). Without this flag (the
 * default) every page written through kvpage carries a tag in the sidecar
 * and every read is checked against it: see "Integrity tags" below.
 */
#define KVP_PAGEFILE_NO_TAGS 0x80u

/* kvp_pagefile_opts.backend and the backend getters */
#define KVP_PAGEFILE_BACKEND_AUTO                                                                  \
    0 /* the faster one for this mode; psync when io_uring is unavailable */
#define KVP_PAGEFILE_BACKEND_PSYNC 1 /* a thread pool doing pread/pwrite */
#define KVP_PAGEFILE_BACKEND_URING 2 /* io_uring (liburing) with a registered file */
/*
 * 3FS's USRBIO rings (user-space I/O to the 3FS daemon, instead of its FUSE
 * mount). The library is loaded when a page file asks for it: the path in
 * the environment variable KVPAGE_USRBIO_LIB, else libhf3fs_api_shared.so
 * from the loader's path; a build of kvpage never needs 3FS. AUTO picks it
 * for both directions when that library loads and its
 * hf3fs_extract_mount_point says the file is on a 3FS mount, unless the
 * environment has KVPAGE_USRBIO=0 (then AUTO is as without 3FS; asking for
 * USRBIO still works). Pages are staged through shared memory the backend
 * creates; buffers from kvp_pagefile_alloc that lie in a region registered
 * with kvp_pagefile_register_buffers go without a copy. Tested against an
 * emulation of the library (tests/usrbio_emu), not on a 3FS cluster.
 */
#define KVP_PAGEFILE_BACKEND_USRBIO 3

/*
 * Integrity tags. Beside the page file PATH lies a sidecar PATH.tags: a
 * 4096-byte header (magic, version, slot size, legacy flag, its own check)
 * and one 32-byte record per slot, where a slot is slot_size bytes of the
 * page file (slot_size: the bytes_per_page of the handle that created the
 * sidecar; every later handle uses the header's) and an op's slot is
 * offset / slot_size. Pages keep their size and offsets; the sidecar is
 * mapped shared, so a record costs no system call.
 *
 * A write of an op that starts at a slot's start and is at most a slot
 * long marks the slot BAD, writes, and on full success records TAGGED: the
 * XXH3 digest of the bytes (per 64 KiB block, seeded with the length and the
 * block's index), the op's length and the key's hash (the *_keyed
 * functions; none otherwise). A failed or interrupted (SIGKILL, power cut)
 * write leaves BAD. Any other write (not at a slot's start, or longer than
 * a slot) leaves the slots it touches UNTAGGED.
 *
 * A read is checked against the record of its slot:
 *   TAGGED    the op must start at the slot's start, be as long as the
 *             write was, its bytes must match the digest, and a key given
 *             must be the key written; then it is counted verified.
 *   NONE      never written by a tagging handle. In a sidecar created with
 *             the page file (fresh) the bytes must be zeros, and a keyed
 *             read is rejected (no key was written there). In a sidecar made
 *             for a page file that already held data (legacy: written before
 *             tags, or with KVP_PAGEFILE_NO_TAGS) the read is served and
 *             counted unverified, keyed or not: old files keep working.
 *   UNTAGGED  served and counted unverified without a key; rejected with one.
 *   BAD       (or a record that fails its check) rejected.
 * A rejected op's result is -EBADMSG (its buffer may hold the bytes; they
 * are not the caller's), the other ops of the batch are unaffected, the
 * batch returns -EBADMSG with err->rule KVP_RULE_INTEGRITY (index = the
 * first such op, value = its slot). Counted in kvp_pagefile_info; the first
 * rejection's message is kept there (tags_note): the library prints nothing.
 *
 * Read-only handles never create or write the sidecar: with none they run
 * as legacy (every read unverified), with one they map it read-only and
 * verify. Block devices have no sidecar: tags are off there (the backend
 * note says so). Writes through a handle with KVP_PAGEFILE_NO_TAGS (or any
 * other program) do not update the sidecar: a page so rewritten fails its
 * tag afterwards, as any change behind kvpage's back does.
 */

struct kvp_pagefile;

struct kvp_pagefile_opts {
    size_t opts_size;        /* sizeof(struct kvp_pagefile_opts), set by kvp_pagefile_opts_init */
    uint64_t size;           /* file size in bytes; 0 = the existing file's size */
    uint64_t bytes_per_page; /* largest operation size, > 0 */
    uint32_t entries;        /* most operations per batch, 1 .. 1048576; default 8 */
    uint32_t flags;          /* KVP_PAGEFILE_* flags; default 0 */
    int32_t backend;         /* KVP_PAGEFILE_BACKEND_*; default AUTO */
    uint32_t threads;        /* psync worker threads besides the caller; 0 = number of CPUs
                                (with DIRECT at least min(entries, 16): the queue depth) */
    uint32_t queues;         /* io_uring rings, or USRBIO rings each way (batches in
                                flight at once); 0 = 4 */
    uint32_t mode;           /* permission bits of a created file; default 0644 */
    uint64_t chunk_bytes;    /* psync: smallest piece it cuts an operation into, when a
                                batch has fewer operations than threads; 0 = 1 MiB */
};

/* One operation of a batch: file range [offset, offset + size) <-> buf. */
struct kvp_pagefile_op {
    int64_t offset;
    void *buf;
    uint64_t size;
};

/* A host memory region for kvp_pagefile_register_buffers. */
struct kvp_pagefile_buf {
    void *base;
    uint64_t len;
};

/* Fills opts with the defaults (size and bytes_per_page 0: the caller sets them). Always succeeds.
 */
KVP_API void kvp_pagefile_opts_init(struct kvp_pagefile_opts *opts);

/*
 * Opens (and with KVP_PAGEFILE_CREATE creates) the page file at path.
 *
 * path: NUL-terminated, copied. opts: required; opts->opts_size must be set
 * (kvp_pagefile_opts_init). out: receives the handle, owned by the caller and
 * released with kvp_pagefile_close. err: may be NULL; filled on failure.
 *
 * An existing file smaller than opts->size is extended (sparse, reads as
 * zeros), under an flock so that two processes opening it at once cannot
 * shrink each other's extension. The extension is the open's last step: a
 * failed open leaves an existing file as it was, and removes the file (and
 * with KVP_PAGEFILE_MKDIR the directories) it created. A larger file is never shrunk: the handle
 * then addresses only [0, opts->size), unless KVP_PAGEFILE_EXACT_SIZE is set,
 * which turns the mismatch into -EEXIST. A block device is used as is and
 * must hold opts->size bytes.
 *
 * Backends: AUTO picks, per direction (read/write) and for this handle's
 * buffered or O_DIRECT mode, the backend the benchmark in bench/io found
 * faster; if io_uring cannot be set up it uses psync and says why in
 * kvp_pagefile_backend_note. URING fails when io_uring cannot be set up.
 *
 * Returns 0, or:
 *   -EINVAL  bad argument (KVP_RULE_ARG: opts_size unknown, bytes_per_page 0,
 *            entries out of range, unknown flag or backend, size 0 with no
 *            existing file) or O_DIRECT refused by the file system
 *            (KVP_RULE_IO, code -EINVAL, message says so)
 *   -EEXIST  KVP_PAGEFILE_EXACT_SIZE and the file is larger than size
 *   -ENOSPC  a block device smaller than size
 *   -ENOENT  the file is missing without KVP_PAGEFILE_CREATE, or its directory
 *            is missing without KVP_PAGEFILE_MKDIR (msg names the directory)
 *   -EACCES, -ENOTDIR, -EISDIR, ... from open/mkdir (KVP_RULE_IO)
 *   -ENOMEM, -EAGAIN (threads), or an io_uring setup error with backend URING
 * Thread-safe (different handles are independent).
 */
KVP_API int kvp_pagefile_open(const char *path, const struct kvp_pagefile_opts *opts,
                              struct kvp_pagefile **out, struct kvp_error *err);

/*
 * Reads a batch: for each i < n, ops[i].size bytes at file offset
 * ops[i].offset into ops[i].buf. results[i] receives the bytes read (the
 * size, unless the file was truncated under us) or a negative errno.
 *
 * Validation, before any I/O, in this order for each operation: n <= entries
 * (KVP_RULE_TOO_MANY), offset >= 0 and offset + size <= file size
 * (KVP_RULE_OFFSET), size <= bytes_per_page (KVP_RULE_SIZE), buf != NULL when
 * size > 0 (KVP_RULE_ARG), offset a multiple of bytes_per_page with
 * KVP_PAGEFILE_ALIGNED (KVP_RULE_ALIGN), and with KVP_PAGEFILE_DIRECT the
 * offset, size and buffer address aligned as the alignment getters say
 * (KVP_RULE_ALIGN). ops and results may be NULL only when n == 0.
 *
 * The buffers are borrowed for the duration of the call only.
 * Thread-safe: any number of batches may run on one handle at once.
 *
 * Returns 0 when every operation transferred its full size; -EINVAL when
 * validation failed (no I/O done, results untouched, err filled); otherwise
 * the error of the first operation that did not complete (its -errno, or -EIO
 * for a read that hit the end of the file), with err->rule KVP_RULE_IO and
 * err->index that operation; every results[i] is then valid. With tags on,
 * an op whose bytes fail their integrity tag has results[i] = -EBADMSG and,
 * when it is the first failed op, the batch returns -EBADMSG with err->rule
 * KVP_RULE_INTEGRITY (see "Integrity tags" above).
 */
KVP_API int kvp_pagefile_read(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                              int64_t *results, struct kvp_error *err);

/*
 * Writes a batch: for each i < n, ops[i].size bytes from ops[i].buf at file
 * offset ops[i].offset. Same validation, results, ownership, thread safety
 * and returns as kvp_pagefile_read, plus -EBADF (KVP_RULE_ARG) on a
 * KVP_PAGEFILE_READONLY handle and, per operation, -ENOSPC, -EIO, ... from
 * the file system. Data is durable only after kvp_pagefile_flush.
 */
KVP_API int kvp_pagefile_write(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                               int64_t *results, struct kvp_error *err);

/*
 * A vectored operation: the file range [offset, offset + the sum of the
 * segments' lengths) <-> the segments segs[0..nsegs), laid back to back
 * (segs[0] first). A page kept in host memory as several buffers moves
 * without being copied into one first.
 */
struct kvp_pagefile_vop {
    int64_t offset;
    const struct kvp_pagefile_buf *segs;
    size_t nsegs; /* 0 .. KVP_PAGEFILE_MAX_SEGS */
};

/* The most segments of one vectored operation (IOV_MAX). */
#define KVP_PAGEFILE_MAX_SEGS 1024

/*
 * Reads (kvp_pagefile_readv) or writes (kvp_pagefile_writev) a batch of
 * vectored operations: as kvp_pagefile_read / kvp_pagefile_write, where an
 * operation's size is the sum of its segments' lengths. A segment of length
 * 0 moves nothing (its base may then be NULL); a segment of length > 0 must
 * not be NULL (KVP_RULE_ARG, err->value the segment's index); nsegs over
 * KVP_PAGEFILE_MAX_SEGS or segs NULL with nsegs > 0 is KVP_RULE_ARG. With
 * KVP_PAGEFILE_DIRECT the offset and the size must be aligned (as for
 * read/write), the segments need not be. results[i]: the operation's bytes
 * (its size) or a negative errno; on a short transfer the bytes of the
 * complete leading part.
 *
 * Without a copy (one segment per SQE with io_uring, one preadv/pwritev per
 * operation with psync) where the backend can; through a staging buffer
 * inside the call where it cannot: USRBIO, reads with
 * KVP_PAGEFILE_MMAP_READS, and O_DIRECT with a segment whose address or
 * length is not aligned. A read whose transfer failed leaves its segments
 * partly written or untouched.
 * Returns as kvp_pagefile_read (-EINVAL: nothing done, results untouched).
 */
KVP_API int kvp_pagefile_readv(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                               size_t n, int64_t *results, struct kvp_error *err);
KVP_API int kvp_pagefile_writev(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                size_t n, int64_t *results, struct kvp_error *err);

/*
 * The keyed forms: keys[i] (NUL-terminated) is the key whose page op i
 * moves. A write records the key's hash in the page's tag; a read is
 * rejected (-EBADMSG, KVP_RULE_INTEGRITY) unless the page was written with
 * that key. keys NULL, or keys[i] NULL, is "key unknown" (as the unkeyed
 * functions, which are these with keys NULL). Same validation, results and
 * returns as the unkeyed functions.
 */
KVP_API int kvp_pagefile_read_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                                    const char *const *keys, size_t n, int64_t *results,
                                    struct kvp_error *err);
KVP_API int kvp_pagefile_write_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                                     const char *const *keys, size_t n, int64_t *results,
                                     struct kvp_error *err);
KVP_API int kvp_pagefile_readv_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                     const char *const *keys, size_t n, int64_t *results,
                                     struct kvp_error *err);
KVP_API int kvp_pagefile_writev_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                      const char *const *keys, size_t n, int64_t *results,
                                      struct kvp_error *err);

/* What kvp_pagefile_verify found. Set check_size to sizeof(struct
 * kvp_pagefile_verify_counts) first: the struct only grows. */
struct kvp_pagefile_verify_counts {
    size_t check_size;
    uint64_t slots;    /* slots of the handle's size */
    uint64_t tagged;   /* TAGGED and their bytes match */
    uint64_t untagged; /* UNTAGGED: written without a tag, not checkable */
    uint64_t none;     /* never written through a tagging handle (zeros in a fresh sidecar) */
    uint64_t bad;      /* fail their tag: reads of them are rejected */
};

/*
 * Checks every slot of the page file against its tag, as a read of the whole
 * page would (fsck): TAGGED slots are read and hashed, BAD and damaged
 * records are bad, NONE slots of a fresh sidecar must hold zeros (holes are
 * not read). For each bad slot calls cb(arg, slot, why) (cb may be NULL;
 * why: a sentence, valid during the call). counts: may be NULL.
 * Returns 0 when no slot is bad; -EBADMSG (KVP_RULE_INTEGRITY, value = the
 * first bad slot, msg = how many) when some are; -EINVAL (KVP_RULE_ARG) when
 * the handle has tags off; -ENOENT (KVP_RULE_ARG) when it has no sidecar (a
 * read-only handle on a file without one); an I/O error (KVP_RULE_IO).
 * Thread-safe; concurrent writes make their slots read as bad meanwhile.
 */
KVP_API int kvp_pagefile_verify(struct kvp_pagefile *pf,
                                void (*cb)(void *arg, uint64_t slot, const char *why), void *arg,
                                struct kvp_pagefile_verify_counts *counts, struct kvp_error *err);

/*
 * Registers host memory regions with every io_uring ring of the handle so
 * that O_DIRECT operations whose buffer lies inside one use fixed buffers
 * (no per-I/O page pinning). Replaces any earlier registration. Regions over
 * 1 GiB are split internally (the kernel's limit per buffer). The memory
 * stays owned by the caller and must stay mapped until
 * kvp_pagefile_unregister_buffers, another registration or close.
 * With the psync backend only, this records nothing and returns 0.
 * Thread-safe: waits for batches in flight on the rings.
 * Returns 0, -EINVAL (n == 0, NULL or empty region: KVP_RULE_ARG, index = region),
 * -ENOMEM, or the kernel's error (e.g. -ENOMEM over RLIMIT_MEMLOCK,
 * -EFAULT for an unmapped region; KVP_RULE_IO), with nothing registered.
 */
KVP_API int kvp_pagefile_register_buffers(struct kvp_pagefile *pf,
                                          const struct kvp_pagefile_buf *bufs, size_t n,
                                          struct kvp_error *err);

/* Drops the registration of kvp_pagefile_register_buffers. Thread-safe. Returns 0. */
KVP_API int kvp_pagefile_unregister_buffers(struct kvp_pagefile *pf);

/*
 * Host memory for pages, size bytes, zeroed, aligned for O_DIRECT (at least
 * 4096). With the USRBIO backend it is shared memory the 3FS daemon reads
 * and writes (an iov): ops whose buffers lie in it, and in a region
 * registered with kvp_pagefile_register_buffers, move without a copy. With
 * the other backends it is ordinary aligned memory; 2 MiB or more is aligned
 * to 2 MiB and asks for transparent huge pages (madvise MADV_HUGEPAGE: the
 * first touch of each 4 KiB page is slow on some virtual machines; the
 * README's performance note on it). Release it with
 * kvp_pagefile_free on the same handle; kvp_pagefile_close releases the
 * USRBIO memory still allocated. Thread-safe. NULL on failure, err filled
 * (KVP_RULE_ARG for size 0, KVP_RULE_IO for the allocation).
 */
KVP_API void *kvp_pagefile_alloc(struct kvp_pagefile *pf, uint64_t size, struct kvp_error *err);

/* Releases memory of kvp_pagefile_alloc on the same handle. NULL is a no-op. */
KVP_API void kvp_pagefile_free(struct kvp_pagefile *pf, void *ptr);

/*
 * fsync(2) of the file, then of its tags sidecar (msync and fsync): makes
 * every completed write and its tag durable.
 * Thread-safe. Returns 0 or the -errno of fsync (KVP_RULE_IO in err).
 */
KVP_API int kvp_pagefile_flush(struct kvp_pagefile *pf, struct kvp_error *err);

/*
 * Stops the worker threads and rings, closes the file (and its tags
 * sidecar) and frees the handle. Does not fsync (call kvp_pagefile_flush first for durability). No
 * other call on pf may be running or follow. NULL is a no-op.
 */
KVP_API void kvp_pagefile_close(struct kvp_pagefile *pf);

/*
 * Getters. Each takes a handle from kvp_pagefile_open (not NULL), is
 * thread-safe, never fails, and returns a value or a string owned by the
 * handle (valid until kvp_pagefile_close).
 */

/* The path given to kvp_pagefile_open. */
KVP_API const char *kvp_pagefile_path(const struct kvp_pagefile *pf);
/* The addressable size in bytes: opts->size, or the file's size when that was 0. */
KVP_API uint64_t kvp_pagefile_size(const struct kvp_pagefile *pf);
/* The file's size on disk at open, after any extension; may exceed kvp_pagefile_size. */
KVP_API uint64_t kvp_pagefile_file_size(const struct kvp_pagefile *pf);
/* opts->bytes_per_page: the largest size of one operation. */
KVP_API uint64_t kvp_pagefile_bytes_per_page(const struct kvp_pagefile *pf);
/* opts->entries: the most operations in one batch. */
KVP_API uint32_t kvp_pagefile_entries(const struct kvp_pagefile *pf);
/* opts->flags (KVP_PAGEFILE_*). */
KVP_API uint32_t kvp_pagefile_flags(const struct kvp_pagefile *pf);
/* The backend asked for in opts (KVP_PAGEFILE_BACKEND_*, possibly AUTO). */
KVP_API int kvp_pagefile_backend_requested(const struct kvp_pagefile *pf);
/* The backend that serves reads (write == 0) or writes (write != 0): PSYNC, URING or USRBIO. */
KVP_API int kvp_pagefile_backend(const struct kvp_pagefile *pf, int write);
/* "auto", "psync", "uring" or "usrbio" for a KVP_PAGEFILE_BACKEND_* value, "?" otherwise.
 * Static string. The values are consecutive from AUTO (0): a loop over them
 * up to the first "?" lists every backend of the library, e.g.
 *     for (int b = 0; strcmp(kvp_pagefile_backend_name(b), "?"); b++) ...
 */
KVP_API const char *kvp_pagefile_backend_name(int backend);
/* One line on a KVP_PAGEFILE_BACKEND_* value's backend for people: how it
 * moves pages and what it wants ("pread and pwrite from a pool of threads;
 * ..."); "?" for a value that is not one (as kvp_pagefile_backend_name).
 * Static string. */
KVP_API const char *kvp_pagefile_backend_description(int backend);
/* The name of one KVP_PAGEFILE_* flag without its prefix, in lower case
 * ("create", "direct", ..., "no_tags"); NULL for a value that is not exactly
 * one flag this library knows. Static string. */
KVP_API const char *kvp_pagefile_flag_name(uint32_t flag);
/* One sentence on why the backends are what they are, e.g. why io_uring was not used. */
KVP_API const char *kvp_pagefile_backend_note(const struct kvp_pagefile *pf);
/* psync worker threads started (0 when no direction uses psync). */
KVP_API uint32_t kvp_pagefile_threads(const struct kvp_pagefile *pf);
/* Rings set up: io_uring's, plus USRBIO's of both directions (0 when neither is used). */
KVP_API uint32_t kvp_pagefile_queues(const struct kvp_pagefile *pf);
/* Permission bits used when the file was created (opts->mode, default 0644). */
KVP_API uint32_t kvp_pagefile_mode(const struct kvp_pagefile *pf);
/* Piece size of the psync backend (opts->chunk_bytes rounded up to the O_DIRECT alignment). */
KVP_API uint64_t kvp_pagefile_chunk_bytes(const struct kvp_pagefile *pf);
/* O_DIRECT buffer address alignment in bytes (1 without KVP_PAGEFILE_DIRECT). */
KVP_API uint32_t kvp_pagefile_direct_mem_align(const struct kvp_pagefile *pf);
/* O_DIRECT offset and size alignment in bytes (1 without KVP_PAGEFILE_DIRECT). */
KVP_API uint32_t kvp_pagefile_direct_offset_align(const struct kvp_pagefile *pf);
/* Regions currently registered by kvp_pagefile_register_buffers, after splitting at 1 GiB. */
KVP_API uint32_t kvp_pagefile_registered_buffers(const struct kvp_pagefile *pf);

/*
 * Everything the getters above answer, in one call. Set info->info_size to
 * sizeof(struct kvp_pagefile_info) first: the struct only grows, and a
 * program built against an older header (a smaller info_size) gets the
 * fields it knows. The strings are owned by the handle (valid until
 * kvp_pagefile_close). Thread-safe.
 * Returns 0, or -EINVAL when pf or info is NULL or info_size is smaller than
 * the first published layout (info untouched).
 */
struct kvp_pagefile_info {
    size_t info_size;             /* sizeof(struct kvp_pagefile_info), set by the caller */
    const char *path;             /* kvp_pagefile_path */
    uint64_t size;                /* kvp_pagefile_size */
    uint64_t file_size;           /* kvp_pagefile_file_size */
    uint64_t bytes_per_page;      /* kvp_pagefile_bytes_per_page */
    uint64_t chunk_bytes;         /* kvp_pagefile_chunk_bytes */
    uint32_t entries;             /* kvp_pagefile_entries */
    uint32_t flags;               /* kvp_pagefile_flags */
    uint32_t mode;                /* kvp_pagefile_mode */
    int32_t backend_requested;    /* kvp_pagefile_backend_requested */
    int32_t backend[2];           /* kvp_pagefile_backend: [0] reads, [1] writes */
    uint32_t threads;             /* kvp_pagefile_threads */
    uint32_t queues;              /* kvp_pagefile_queues */
    uint32_t registered_buffers;  /* kvp_pagefile_registered_buffers */
    uint32_t direct_mem_align;    /* kvp_pagefile_direct_mem_align */
    uint32_t direct_offset_align; /* kvp_pagefile_direct_offset_align */
    const char *backend_note;     /* kvp_pagefile_backend_note */
    /* Integrity tags (see above). */
    int32_t tags;             /* 0 off (KVP_PAGEFILE_NO_TAGS, block device), 1 on, 2 legacy
                                 (a sidecar made for a file that held data, or a read-only
                                 handle without one: untagged pages are served unverified) */
    const char *tags_path;    /* the sidecar's path, "" when tags are off */
    uint64_t tags_verified;   /* reads whose tag matched (or never-written zeros) */
    uint64_t tags_rejected;   /* reads rejected (-EBADMSG) */
    uint64_t tags_unverified; /* reads served without a tag to check (legacy, UNTAGGED) */
    const char *tags_note;    /* the first rejection's message ("" before one): log it once */
    uint64_t tags_slot_size;  /* the sidecar's slot size (a page index = offset / it), 0 without */
    int32_t alloc_zero_copy;  /* 1: kvp_pagefile_alloc hands out the memory of the backend of
                                 reads or writes (USRBIO's shared memory), whose pages move
                                 without a copy once registered (kvp_pagefile_register_buffers);
                                 0: ordinary aligned memory */
};

KVP_API int kvp_pagefile_info(const struct kvp_pagefile *pf, struct kvp_pagefile_info *info);

#ifdef __cplusplus
}
#endif
#endif
