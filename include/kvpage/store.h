/*
 * kvpage/store.h — put and get KV pages by key: one rank's storage file
 * (kvp_pagefile) joined to the metadata that says which key is in which page
 * (kvp_meta), so that callers do not do the allocate → write → confirm and
 * lookup → read dance themselves.
 *
 * A store is one rank of one namespace (deployment, pool). Its file holds
 * file_size / bytes_per_page pages, and the store initializes its rank in the
 * metadata with that many. The metadata lives
 *   - in a data directory (the default: PATH.meta beside the file): embedded,
 *     persistent, owned by one process (a second process gets -EBUSY);
 *   - at http://HOST:PORT[/ns/NAME]: a kvpage serve shared by every rank of
 *     every node;
 *   - in an open kvp_meta handle the caller passes (opts.meta_handle), which
 *     several stores of one process (several ranks) may share;
 *   - or anywhere kvp_meta_open_at accepts ("mem:", "file:DIR", ...).
 * opts.meta without a scheme is a data directory (file:DIR), except that a
 * bare HOST:PORT ("127.0.0.1:18000") that is no existing directory is
 * refused (-EINVAL, KVP_RULE_ARG: "did you mean http://HOST:PORT?");
 * "file:DIR" is always a directory.
 *
 * Keys: 1..KVP_MAX_KEY_LEN bytes without NUL (kvp_key_problem), for instance
 * from kvp_page_keys (kvpage/keys.h). A key counts as there when it is
 * complete: it holds a page on every initialized rank of the namespace (with
 * one rank: when it holds a page on this rank). opts.per_rank makes this rank
 * alone count.
 *
 * Integrity (unless opts.no_tags): a put writes each page with its key
 * (kvp_pagefile_write_keyed), so that its tag binds the page's bytes to the
 * key; a get reads with the keys (kvp_pagefile_read_keyed). A page whose
 * bytes changed since its put (another writer, a torn write, a bit flip),
 * or that holds another key's page, is REJECTED: the key is a miss
 * (-ENOENT, its buffer zeroed, never the bytes), the other keys of the call
 * are unaffected; it is counted (kvp_store_stats' rejected), logged once per
 * store handle with the page's index (through opts.meta_opts->log when set,
 * else one line on stderr), and dropped from the metadata
 * (kvp_meta_delete_rejected: a kvpage serve counts it in /metrics) so that
 * the next lookup is an honest miss (a read-only store drops nothing: each
 * read of the key is rejected again). A page written without a key (by
 * kvp_pagefile_write, or by another program) is rejected too: the store
 * cannot know whose page it is.
 *
 * Durability: with opts.durable (the default) a put makes the pages it wrote
 * durable (fdatasync of the file) before it confirms them, and returns once
 * the metadata's changes are durable too, so that a key that survives a
 * power loss in the metadata never names a page whose bytes did not.
 * Without it a put waits for neither sync (embedded metadata logs its changes
 * and syncs them in its own group commit; a remote kvpage serve still answers
 * only durable changes): a crash may forget the last keys put, and a power
 * loss may leave keys naming stale pages.
 *
 * Thread safety: every call but kvp_store_close may be made by any number of
 * threads at once on one handle.
 */
#ifndef KVPAGE_STORE_H
#define KVPAGE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/error.h"
#include "kvpage/meta.h"
#include "kvpage/pagefile.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_store;

struct kvp_store_opts {
    size_t opts_size; /* sizeof(struct kvp_store_opts), set by kvp_store_opts_init */
    /* The rank's storage file. */
    const char *path;        /* required */
    uint64_t file_size;      /* bytes; 0: the existing file's size. A missing file is
                                created when file_size > 0 (its directory must exist,
                                unless mkdir). */
    uint64_t bytes_per_page; /* required: the size of one page */
    uint32_t entries;        /* most pages per page-I/O batch; default 8. Larger
                                calls are cut into batches that run in parallel. */
    const struct kvp_pagefile_opts *pagefile; /* NULL: the defaults; its size,
                                bytes_per_page and entries are the fields above */
    /* Where in the metadata. */
    uint32_t rank;                         /* default 0 */
    const char *deployment;                /* NULL: the location's /ns/NAME, else "default" */
    const char *pool;                      /* NULL: "kv" */
    const char *meta;                      /* the location (see above); NULL: PATH.meta */
    const struct kvp_meta_opts *meta_opts; /* NULL: the defaults */
    struct kvp_meta *meta_handle;          /* not NULL: use it (meta and meta_opts are then
                                              ignored); the caller closes it after the store */
    int per_rank;     /* 0 (default): exists and get count complete keys; 1: keys
                         held on this rank (SGLang's per-rank semantics) */
    int durable;      /* 1 (default): fdatasync written pages before confirming them */
    uint32_t threads; /* batches of one call run at once; 0: 4 */
    int mkdir;        /* 1: create the missing directories of a file it creates (a
                         missing directory is otherwise -ENOENT naming it; its msg ends
                         "(create it, or set mkdir)", which the CLI words as --mkdir and
                         Python as mkdir=True) */
    int readonly;     /* 1: for get and exists alone, writing nothing: no file,
                         directory or owner record is made or changed (the page file
                         must exist and is opened read-only; file_size, when given,
                         sets only the page count checked against the metadata's
                         rank); an embedded data directory is recovered
                         in memory under a shared lock (KVP_META_READONLY_SHARED:
                         a missing one is an empty state), so a get's LRU touch is
                         not kept, nor the drop of a key whose page failed its tag
                         (remote metadata: both are the server's, as before); put
                         and delete are -EROFS */
    int no_tags;      /* 1: no integrity tags (KVP_PAGEFILE_NO_TAGS): pages are written
                         untagged and read unverified. 0 (default): every put tags its
                         page with its bytes and its key, and every get checks them */
};

/* Per-key results of put (kvp_store_put results[i]). */
#define KVP_STORE_STORED 1  /* written and confirmed by this call */
#define KVP_STORE_ALREADY 0 /* the key was held already: not rewritten */
/* (otherwise a negative errno: -ENOSPC no page could be had, -EIO ...) */

/* The figures of a store: its rank's pages (from the metadata) and its own calls. */
struct kvp_store_stats {
    size_t stats_size; /* sizeof(struct kvp_store_stats): set it before the call */
    uint64_t num_pages, free, reserved, held, keys; /* the rank, now */
    uint64_t hits, misses, allocations, evictions;  /* the rank, since it began */
    uint64_t puts, gets;                            /* calls of this handle */
    uint64_t stored, already, put_failed;           /* put's per-key results */
    uint64_t read, missing, get_failed;             /* get's per-key results */
    uint64_t bytes_written, bytes_read;
    uint64_t rejected; /* get's keys whose page failed its integrity tag: reported
                          as missing (counted in missing too) and dropped */
};

/* Fills opts with the defaults written beside each field. Always succeeds. */
KVP_API void kvp_store_opts_init(struct kvp_store_opts *opts);

/*
 * Opens the store: the page file (created when missing and file_size > 0),
 * the metadata at its location, the namespace (created when missing) and the
 * rank, initialized with file_size / bytes_per_page pages.
 *
 * A page file has one owner: the metadata location (canonical, as
 * kvp_meta_location gives it; for meta_handle the handle's) and its
 * identity (kvp_meta_identity), deployment, pool and rank whose keys point
 * into it. The first open records it in PATH.owner (kvp_store_claim); an
 * open under another owner is refused. The metadata is the same when the
 * identities are (whatever the location's spelling), else, when the record
 * or the state has none, when the locations are.
 *
 * Everything is checked before anything is created or changed: the options,
 * the geometry (at least one page), the file's directory, the owner, the
 * metadata (reachable, and the rank's page count: a rank holding data keeps
 * its count). The page file is created or extended last. A refused open
 * changes nothing, and removes what it created (the file, its owner record,
 * a PATH.meta directory, with mkdir the directories); a rank or namespace it
 * registered in the metadata, empty, stays.
 * Returns 0, or:
 *   -EINVAL  a bad option (KVP_RULE_ARG, msg naming it), a bad name
 *            (KVP_RULE_NAMESPACE), fewer than one page (KVP_RULE_NUM_PAGES)
 *   -ENOENT  the file is missing and file_size is 0, or its directory is
 *            missing and mkdir is 0 (msg names the directory)
 *   -EEXIST  the metadata has this rank with another page count and holds
 *            data in it (KVP_RULE_RESIZE_HELD; msg names both counts), or the
 *            file belongs to another owner (KVP_RULE_OWNER; msg names both)
 *   -EBUSY   another process owns the metadata directory
 *   and the errors of kvp_pagefile_open and kvp_meta_open_at.
 * err (may be NULL) says what failed.
 */
KVP_API int kvp_store_open(const struct kvp_store_opts *opts, struct kvp_store **out,
                           struct kvp_error *err);

/*
 * Claims the page file at path for an owner without opening a store (what
 * an engine's page-I/O client that knows its metadata does, and what
 * kvp_store_open does itself): location as kvp_store_opts.meta (NULL: the
 * data directory PATH.meta), deployment NULL (the location's /ns/NAME, else
 * "default"), pool NULL ("kv"). When path has no owner record (or path does
 * not exist: a record left of a removed file is stale) the owner is recorded
 * in PATH.owner: text, "kvpage page-file owner 1" then location, identity
 * (a data directory's, read from it; none for other locations, which
 * kvp_store_claim does not open), deployment, pool and rank lines, never a
 * password; written to a temporary file,
 * fsynced, linked into place, the directory fsynced. A block device has no
 * record (nothing is written beside it), nor does a file in a directory
 * this process may not write (EACCES, EROFS, EPERM: the open goes on): keep
 * their owners apart yourself.
 * Returns 0 (recorded now, or the record names this owner), -EEXIST
 * (another owner: KVP_RULE_OWNER, msg naming both and the fix: the same
 * metadata, or removing PATH.owner when that metadata is gone for good),
 * -EINVAL (path empty, a bad name or rank), or -errno (KVP_RULE_IO).
 */
KVP_API int kvp_store_claim(const char *path, const char *location, const char *deployment,
                            const char *pool, uint32_t rank, struct kvp_error *err);

/*
 * Whether a program that writes a page file without a store, named writer
 * (e.g. "kvpage bench io"), may write the file at path: 0 when no owner is
 * recorded beside it (no PATH.owner, path missing, or a block device),
 * -EEXIST when one is (KVP_RULE_OWNER: msg names the owner and the writer,
 * as kvp_store_open's refusal names both, and the fix), or -errno when the
 * record cannot be read (KVP_RULE_IO). Writes nothing.
 */
KVP_API int kvp_store_check_unowned(const char *path, const char *writer, struct kvp_error *err);

/* Closes the page file (after kvp_pagefile_flush) and the metadata the store
 * opened. No other call may be running or follow. NULL is a no-op. */
KVP_API void kvp_store_close(struct kvp_store *s);

/* One caller buffer: bytes [base, base + len). */
struct kvp_store_buf {
    void *base;
    uint64_t len;
};

/*
 * Stores bufs[i] (len <= bytes_per_page) under keys[i], for i < n. One
 * allocation; only the keys not already held on this rank are written (a
 * key given twice in one call is written once, from its first buffer); one
 * confirmation covers the pages written and releases those whose write
 * failed. results[i]: KVP_STORE_STORED, KVP_STORE_ALREADY, or the key's
 * negative errno (-ENOSPC: no free or evictable page; the write's error).
 * Returns 0 when every key is stored or already there; the first failed
 * key's errno when some failed (results say which; err names the first);
 * -EINVAL for bad arguments (a bad key, a buffer over bytes_per_page or NULL:
 * nothing changed, err says which); or the metadata's error when allocation
 * or confirmation failed (every key failed, nothing is left reserved).
 */
KVP_API int kvp_store_put(struct kvp_store *s, const struct kvp_str *keys,
                          const struct kvp_store_buf *bufs, size_t n, int64_t *results,
                          struct kvp_error *err);

/*
 * Loads the pages of keys[i] into bufs[i] (len <= bytes_per_page bytes are
 * read), for i < n. results[i]: the bytes read, -ENOENT for a key that is not
 * there (or whose page failed its integrity tag: see Integrity above), or the
 * read's negative errno. A missing key's buffer is never touched (a rejected
 * one's is zeroed); a buffer whose read failed may hold part of the page.
 * Returns the number of leading keys read in full (what an engine uses:
 * results[0..ret) are all read), or -EINVAL for bad arguments (nothing read),
 * or the metadata's error (nothing read).
 */
KVP_API int64_t kvp_store_get(struct kvp_store *s, const struct kvp_str *keys,
                              const struct kvp_store_buf *bufs, size_t n, int64_t *results,
                              struct kvp_error *err);

/* One key's page as several caller buffers, laid back to back in the page
 * (bufs[0] first): a page that host memory keeps in several places. */
struct kvp_store_bufv {
    const struct kvp_store_buf *bufs;
    size_t n; /* 0 .. KVP_PAGEFILE_MAX_SEGS */
};

/*
 * kvp_store_put and kvp_store_get where key i's page comes from, or goes
 * to, the buffers bufv[i].bufs[0..bufv[i].n) instead of one buffer: the
 * page's first bufs[0].len bytes are bufs[0], the next bufs[1], ... Their
 * lengths add up to at most bytes_per_page (the key's length, as a single
 * buffer's len is in put and get: results[i] of getv is that sum). A buffer
 * of length 0 is allowed and moves nothing (its base may be NULL). The
 * same results, returns and semantics as put and get, and the same checks
 * first (nothing changed, -EINVAL, err naming key and buffer): more than
 * KVP_PAGEFILE_MAX_SEGS buffers or bufs NULL with n > 0 (KVP_RULE_ARG), a
 * buffer NULL with len > 0 (KVP_RULE_ARG), lengths over bytes_per_page
 * (KVP_RULE_SIZE).
 * The page file moves the buffers without a copy where its backend can (see
 * kvp_pagefile_readv) and through a staging copy where it cannot.
 */
KVP_API int kvp_store_putv(struct kvp_store *s, const struct kvp_str *keys,
                           const struct kvp_store_bufv *bufv, size_t n, int64_t *results,
                           struct kvp_error *err);
/*
 * kvp_store_putv telling, with each key it confirms, the key's parent and
 * tokens (opts aligned with keys: parents[i] and token_ids[i] are keys[i]'s;
 * see struct kvp_confirm_opts in kvpage/meta.h): what kvpage serve's KV
 * events then carry. opts NULL: kvp_store_putv. opts is checked with the
 * rest, before anything changes (-EINVAL, as kvp_meta_confirm_ex). A key
 * already held is not confirmed again: its opts are not told.
 */
KVP_API int kvp_store_putv_ex(struct kvp_store *s, const struct kvp_str *keys,
                              const struct kvp_store_bufv *bufv, size_t n,
                              const struct kvp_confirm_opts *opts, int64_t *results,
                              struct kvp_error *err);
KVP_API int64_t kvp_store_getv(struct kvp_store *s, const struct kvp_str *keys,
                               const struct kvp_store_bufv *bufv, size_t n, int64_t *results,
                               struct kvp_error *err);

/*
 * out[i] = 1 where keys[i] is there, else 0 (no recency change). out may be
 * NULL. Returns the number of leading keys that are there, or a negative
 * errno (-EINVAL bad key, the metadata's error).
 */
KVP_API int64_t kvp_store_exists(struct kvp_store *s, const struct kvp_str *keys, size_t n,
                                 uint8_t *out, struct kvp_error *err);

/* Forgets keys on this rank (their pages become free); unknown keys are
 * ignored. Returns 0 or a negative errno. */
KVP_API int kvp_store_delete(struct kvp_store *s, const struct kvp_str *keys, size_t n,
                             struct kvp_error *err);

/* Forgets every key of this rank and frees all its pages (its reservations
 * too: a put running meanwhile fails to confirm). Returns 0 or a negative
 * errno. */
KVP_API int kvp_store_clear(struct kvp_store *s, struct kvp_error *err);

/* Fills *st (st->stats_size set by the caller; a smaller size gets the fields
 * that fit). Returns 0 or a negative errno (the metadata's). */
KVP_API int kvp_store_stats(struct kvp_store *s, struct kvp_store_stats *st, struct kvp_error *err);

/* Getters: never fail; strings live until kvp_store_close. */
KVP_API struct kvp_pagefile *kvp_store_pagefile(const struct kvp_store *s);
KVP_API struct kvp_meta *kvp_store_meta(const struct kvp_store *s);
KVP_API struct kvp_ns *kvp_store_ns(const struct kvp_store *s);
KVP_API uint32_t kvp_store_rank(const struct kvp_store *s);
KVP_API uint64_t kvp_store_num_pages(const struct kvp_store *s);
KVP_API uint64_t kvp_store_bytes_per_page(const struct kvp_store *s);
KVP_API const char *kvp_store_location(const struct kvp_store *s); /* the metadata's */

#ifdef __cplusplus
}
#endif
#endif
