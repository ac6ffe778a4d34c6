/*
 * kvpage/meta.h — the metadata state machine (protocol.md §1).
 *
 * Which key lives in which page of which rank: namespaces, ranks with page
 * pools, page states FREE / RESERVED / HELD(key), leases, LRU eviction with a
 * read grace, and completeness across ranks. It knows nothing of HTTP or JSON;
 * kvpage serve's dialects translate requests into these calls.
 *
 * One interface, several backends: kvp_meta_open_at names where the state
 * lives (a location such as "mem:" or "file:/var/lib/kvpage"), and every call
 * below is checked here (keys, names, ranks, page counts) and then handed to
 * that location's backend through a table of operations. Every backend sees
 * only valid input, and every caller gets the same errors whatever the
 * backend.
 *
 * Durability: a call that changes the state returns once its change is
 * durable (as opts.fsync defines it). Its _async form returns as soon as the
 * change is applied and visible, with a ticket to wait on (kvp_meta_wait) or
 * to be called back on (kvp_meta_when_durable); kvpage serve uses it to
 * overlap many requests with one fsync.
 *
 * Thread safety: every function may be called from many threads at once. Each
 * namespace has its own lock; namespaces never block each other.
 *
 * Keys are byte strings of 1..KVP_MAX_KEY_LEN bytes without NUL, passed as
 * (ptr, len) and never retained by the caller's pointer (meta copies them).
 * Pages are indices 0 <= page < num_pages; -1 means "none".
 */
#ifndef KVPAGE_META_H
#define KVPAGE_META_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_MAX_KEY_LEN 1024
#define KVP_MAX_NAME_LEN 128
#define KVP_MAX_RANK 0x7fffffffu  /* ranks are 0 <= rank < 2^31 */
#define KVP_MAX_PAGES 0x7fffffffu /* num_pages is 1 .. 2^31-1 */

struct kvp_meta;
struct kvp_ns;

/* A byte string that is not necessarily NUL-terminated. */
struct kvp_str {
    const char *ptr;
    size_t len;
};

/* Monotonic clock in milliseconds; tests inject their own. */
typedef uint64_t (*kvp_clock_fn)(void *arg);

struct kvp_meta_opts {
    size_t opts_size;       /* sizeof(struct kvp_meta_opts), set by kvp_meta_opts_init */
    uint64_t lease_ms;      /* reservation lease; default 120000 */
    uint64_t read_grace_ms; /* no eviction this long after a lookup; default 5000 */
    kvp_clock_fn clock;     /* NULL: CLOCK_MONOTONIC */
    void *clock_arg;
    /* Persistence (protocol.md §6). NULL: state is in memory only. */
    const char *data_dir;
    int fsync; /* KVP_FSYNC_NEVER 0, KVP_FSYNC_BATCH 1 (default), KVP_FSYNC_ALWAYS 2 */
    uint64_t snapshot_bytes; /* log bytes after which a snapshot is written (not in
                              * KVP_SNAPSHOT_MANUAL); default 64 MiB */
    int readonly;            /* recover data_dir but never write it: 1 unlocked (inspect,
                              * fsck: safe beside a running server); KVP_META_READONLY_SHARED
                              * under a shared lock of its LOCK file (a process that writes
                              * it: -EBUSY either way), what kvp_store_opts.readonly uses.
                              * Changes (an LRU touch, a lease) then live in memory only
                              * and are gone at kvp_meta_close. */
    /* Where recovery and background work report (level 0 error .. 3 debug); may be NULL. */
    void (*log)(void *arg, int level, const char *msg);
    void *log_arg;
    /* How snapshots are written (with data_dir): KVP_SNAPSHOT_THREAD
     * (default), KVP_SNAPSHOT_FORK or KVP_SNAPSHOT_MANUAL, see below; 0 takes
     * the default. */
    int snapshot_mode;
    /* The http:// backend (a remote kvpage serve); the others ignore these. */
    uint32_t connect_timeout_ms; /* TCP connect; 0 takes the default, 2000 */
    uint32_t timeout_ms;         /* one whole request; 0 takes the default, 10000 */
    uint32_t retries;            /* repeats of an idempotent request (lookups, exists,
                                  * confirmations, deletes, clears) after a failed
                                  * connection, a timeout or a 5xx, with backoff; default 3
                                  * (kvp_meta_opts_init), 0: none. Allocations are never
                                  * repeated. */
    const char *token;           /* sent as "Authorization: Bearer TOKEN"; NULL: none */
};

#define KVP_META_READONLY_SHARED 2

#define KVP_FSYNC_NEVER 0
#define KVP_FSYNC_BATCH 1
#define KVP_FSYNC_ALWAYS 2

/*
 * Snapshot modes. Every snapshot takes every namespace lock, captures the
 * state at one log position, releases the locks and is then written,
 * synced and read back; calls wait only while the locks are held. The
 * three write the same bytes for the same state, so recovery and fsck do
 * not care which wrote it. What they cost the rest of the process, measured
 * with 1,000,000 keys and 4 GiB of other memory on 2 cores
 * (bench/persist/README.md, "Snapshot pauses"):
 *
 * KVP_SNAPSHOT_THREAD (the default): the library's snapshot thread copies
 * 16 bytes per page of each rank, up to its highest page held (4-7 ms for
 * 1,000,000 keys: calls wait that long), then encodes and writes from the
 * copy while calls go on: 0.8-1.3 s of the thread's time at its normal
 * priority, paced to at most half a CPU. Memory while it writes: the copy,
 * and the key entries deleted meanwhile (kept until it is written). Nothing
 * is forked; the other threads' memory is not touched.
 *
 * KVP_SNAPSHOT_FORK: a forked child writes it from its copy-on-write image
 * at idle CPU priority. Calls wait for the fork, which copies the page
 * tables of the whole process (108-124 ms with 4 GiB of other memory in
 * 4 KiB pages, 5-16 ms in huge pages, 1-3 ms for the metadata alone), and
 * for the log's rotation. While the child lives, the first write to each
 * page by any thread copies it (a thread writing its own memory ran at
 * 1/110 to 1/200 of its speed), and after it a fault per page remains (1/40
 * for the next 1.5 s). With every CPU busy the idle child waits (49 s
 * here) while the whole process is copied (4 GiB). Forking a process with
 * many threads, GPU drivers or pinned memory is the embedder's risk.
 * kvpage serve uses this mode: its process is the metadata.
 *
 * KVP_SNAPSHOT_MANUAL: as THREAD, but written only by kvp_meta_snapshot, in
 * the calling thread, and by kvp_meta_close: the log grows until then, and
 * after a failure of the log writes stay refused until kvp_meta_snapshot
 * succeeds (the other modes retry by themselves).
 *
 * In every mode the final snapshot of kvp_meta_close is written by the
 * closing thread from the live state: no call runs any more.
 */
#define KVP_SNAPSHOT_FORK 1
#define KVP_SNAPSHOT_THREAD 2
#define KVP_SNAPSHOT_MANUAL 3

/* Per-rank figures (protocol.md §4). keys == held: one key per held page. */
struct kvp_rank_stats {
    uint32_t rank;
    uint64_t num_pages, free, reserved, held, keys;
    uint64_t hits, misses, allocations, evictions;
    uint64_t expired_reservations, release_of_held_page;
};

/* Fills opts with the defaults written beside each field. Always succeeds. */
KVP_API void kvp_meta_opts_init(struct kvp_meta_opts *opts);

/*
 * Opens the metadata at a location, with opts (NULL: the defaults):
 *   NULL or ""           opts->data_dir when it is set, else in memory
 *   "mem:"               in memory only (opts->data_dir is ignored)
 *   "file:DIR", "file://DIR", or a path starting with '/' or '.'
 *                        the in-process engine with its log and snapshots in
 *                        DIR (as opts->data_dir; see kvp_meta_open)
 *   "http://HOST:PORT[/ns/NAME]"
 *                        a remote kvpage serve, through its HTTP routes
 *                        (opts->connect_timeout_ms, timeout_ms, retries,
 *                        token). With /ns/NAME only deployment NAME may be
 *                        used. Changes are durable once answered (tickets
 *                        stay 0); kvp_meta_check is -EOPNOTSUPP (run kvpage
 *                        fsck on the server), kvp_meta_snapshot -EOPNOTSUPP;
 *                        keys and pools must be valid UTF-8 (-EINVAL). A
 *                        failed connection is -ECONNREFUSED, a timeout
 *                        -ETIMEDOUT; err->msg names the route and carries
 *                        the server's detail.
 *   "redis://[USER[:PASSWORD]@]HOST:PORT[/DB][?prefix=NAME]",
 *   "redis://H1:P1,H2:P2,..." (the seed nodes of a Redis Cluster)
 *                        the state in Redis, shared by every process that
 *                        opens it (prefix, default "kvp", separates
 *                        deployments of kvpage in one Redis). Password and
 *                        user from the URL, else from KVPAGE_REDIS_PASSWORD
 *                        and KVPAGE_REDIS_USER. The same rules and errors as
 *                        the in-process engine; each rank's operation is
 *                        atomic in Redis, what spans ranks (rank < 0,
 *                        complete_only, nranks, stats) is not. Changes are
 *                        durable as Redis's AOF settings make them (tickets
 *                        stay 0); opts->connect_timeout_ms and timeout_ms
 *                        bound each command; opts->clock is not used (Redis's
 *                        TIME is). Redis unreachable or failing: a negative
 *                        errno (-ECONNREFUSED, -ETIMEDOUT, -ECONNRESET, -EIO,
 *                        -ENOSPC for Redis's maxmemory) with rule
 *                        KVP_RULE_UNAVAILABLE; later calls reconnect.
 *                        kvp_meta_snapshot is -EOPNOTSUPP.
 *   "https://...", "rediss://..."
 *                        TLS: not implemented yet (-EOPNOTSUPP, saying so)
 * An unknown scheme is -EINVAL, err naming it and the schemes there are.
 * Otherwise as kvp_meta_open; err (may be NULL) says what failed.
 */
KVP_API int kvp_meta_open_at(const char *location, const struct kvp_meta_opts *opts,
                             struct kvp_meta **out, struct kvp_error *err);

/*
 * Creates a metadata store. opts may be NULL (defaults: in memory only).
 * With opts->data_dir, the directory is created if missing and locked
 * (another process holding it: -EBUSY), the state is recovered from its
 * newest valid snapshot and the log after it (a torn or corrupt log tail is
 * dropped and reported through opts->log), and every later change is logged
 * before it becomes visible. A log record that contradicts the state stops
 * the open with -EUCLEAN and an error line naming the file and offset.
 * Returns 0, -EINVAL (opts_size unknown), -ENOMEM, -EBUSY, -EUCLEAN, or the
 * negative errno of a failed file operation. The caller owns *out and
 * releases it with kvp_meta_close (which writes a final snapshot).
 *
 * With data_dir, every call below that changes the state first makes certain
 * that the log has space for its records. When it has not, or the log cannot
 * be written, the call changes nothing and returns -ENOSPC or -EDQUOT (no
 * space), or another negative errno such as -EIO (the log failed); err then
 * has rule KVP_RULE_IO and a msg naming the directory and the cause. Such
 * refusals end by themselves once space is freed (or the log recovered,
 * through a snapshot written in the background); see docs/protocol-notes.md.
 */
KVP_API int kvp_meta_open(const struct kvp_meta_opts *opts, struct kvp_meta **out);

/* Frees everything (with data_dir, after a final snapshot written by the
 * calling thread, in every snapshot mode). No other call may be running or
 * follow. NULL is a no-op. */
KVP_API void kvp_meta_close(struct kvp_meta *m);

/* Where m's state lives, in the canonical form a page file's owner record
 * compares (kvp_store_claim): "mem:", "file:" and an absolute directory, or
 * the URL with its scheme and host in lower case, without user, password,
 * fragment or a trailing slash. Owned by m; NULL for a NULL m. */
KVP_API const char *kvp_meta_location(const struct kvp_meta *m);

/*
 * The canonical form (as kvp_meta_location gives it) of a location as a
 * store or kvp_meta_open_at takes it, without opening anything: a location
 * without a scheme is the directory file:PATH, except that HOST:PORT that is
 * no directory is refused (-EINVAL, KVP_RULE_ARG: "did you mean
 * http://HOST:PORT?"); NULL or "" is "mem:". Writes it NUL-terminated into
 * out (len bytes). Returns 0, -EINVAL, -ERANGE (out too small: value = the
 * bytes needed, limit = len) or -ENOMEM, with err set on failure.
 */
KVP_API int kvp_meta_location_canonical(const char *in, char *out, size_t len,
                                        struct kvp_error *err);

/*
 * The identity of m's state: 32 hex digits made at random when the state was
 * created, the same for every handle on that state whatever the location's
 * spelling (http://localhost:P and http://127.0.0.1:P; two kvpage serve over
 * one Redis prefix), different for two states (what a page file's owner
 * record compares, kvp_store_open). Where it lives: a data directory's
 * IDENTITY file (written with the directory; an older directory gets one at
 * its next writable open); a Redis prefix's key PREFIX:{PREFIX}:identity (SET
 * NX with its first namespace: opening a prefix writes nothing); a kvpage serve reports its
 * backend's in GET /v1/stats (server.identity; asked once, at the first call); "mem:" makes one per
 * open. NULL when the state has none: an older data directory opened read-only, a Redis prefix
 * without a namespace yet (asked again at the next call), an older server, a
 * server that cannot be reached. Owned by m.
 */
KVP_API const char *kvp_meta_identity(struct kvp_meta *m);

/*
 * Finds (or, when create != 0, creates) the namespace (deployment, pool).
 * deployment: 1..128 bytes of [A-Za-z0-9._-]; pool: 1..128 bytes, no NUL.
 * The handle stays valid until kvp_meta_close.
 * Returns 0, -EINVAL (bad name; err->rule KVP_RULE_NAMESPACE), -ENOENT (absent
 * and create == 0), -ENOMEM, or a log error when it would create one
 * (-ENOSPC, -EDQUOT, -EIO, ...: KVP_RULE_IO, see kvp_meta_open).
 */
KVP_API int kvp_meta_ns(struct kvp_meta *m, const char *deployment, size_t dlen, const char *pool,
                        size_t plen, int create, struct kvp_ns **out, struct kvp_error *err);

/*
 * Initializes a worker rank with num_pages page slots, or confirms it.
 * Same num_pages again: no change. Different num_pages: the pool is resized
 * when no page is RESERVED or HELD, else -EEXIST (KVP_RULE_RESIZE_HELD,
 * value = old, limit = new).
 * Returns 0, -EINVAL (rank or num_pages out of range), -EEXIST, -ENOMEM,
 * -ENOSPC (KVP_RULE_TOO_MANY: the namespace has 65535 ranks), or a log error
 * (KVP_RULE_IO, see kvp_meta_open).
 */
KVP_API int kvp_meta_init_rank(struct kvp_ns *ns, uint32_t rank, uint64_t num_pages,
                               struct kvp_error *err);

/*
 * Allocation (vLLM batch_allocate, SGLang reserve_and_allocate_page_indices).
 * For each key, in order: a page the key holds on this rank (a hit: touched,
 * existed[i] = 1); else the page given to the same key earlier in this call;
 * else a FREE page, evicting the least recently used evictable HELD page when
 * none is free, made RESERVED (existed[i] = 0); else -1.
 * pages[n] receives the results; existed may be NULL.
 * Returns 0, -ENOENT (rank not initialized: KVP_RULE_RANK_NOT_INIT),
 * -EINVAL (a bad key: KVP_RULE_KEY with its index; nothing changed), or a log
 * error (KVP_RULE_IO, see kvp_meta_open: also when the log could not take the
 * confirmations of the pages it would hand out; nothing changed).
 */
KVP_API int kvp_meta_allocate(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                              size_t n, int64_t *pages, uint8_t *existed, struct kvp_error *err);

/*
 * The order in which an allocation takes FREE pages (protocol-notes, "The
 * order of free pages"). A rank's free pages are kept as the engines'
 * reference servers keep their free list: the pages never handed out,
 * ascending, then the pages freed since, in the order they were freed.
 *   KVP_ORDER_DEFAULT: the most recently freed first, then the lowest never
 *     handed out (kvp_meta_allocate, the store).
 *   KVP_ORDER_VLLM: from the front, as vLLM's metadata server: the lowest
 *     never handed out first, then the freed ones, the earliest freed first.
 *   KVP_ORDER_SGLANG: from the back, as SGLang's: the most recently freed
 *     first, then the highest never handed out.
 * Eviction is the same in every order. A restart forgets the release order:
 * every FREE page then counts as never handed out. The http:// backend
 * sends the order to the server (SGLang's route with kvpage's "order"
 * field); a server older than the field answers in its own order.
 */
enum kvp_page_order { KVP_ORDER_DEFAULT = 0, KVP_ORDER_VLLM = 1, KVP_ORDER_SGLANG = 2 };

/* kvp_meta_allocate taking FREE pages in the given order; -EINVAL
 * (KVP_RULE_ARG) for an order not in enum kvp_page_order. */
KVP_API int kvp_meta_allocate_ordered(struct kvp_ns *ns, uint32_t rank, int order,
                                      const struct kvp_str *keys, size_t n, int64_t *pages,
                                      uint8_t *existed, struct kvp_error *err);

/*
 * Confirms written pages and releases unused reservations, all or nothing:
 * the whole request is validated first. confirmations are (keys[i], pages[i])
 * for i < n; release holds nrel pages.
 * Returns 0; -ENOENT (rank not initialized); -EINVAL (KVP_RULE_CONFIRM_PAGE or
 * KVP_RULE_RELEASE_PAGE: a page outside [0, num_pages), KVP_RULE_KEY);
 * -EEXIST (KVP_RULE_HELD_BY_OTHER: the page holds another key), or a log
 * error (KVP_RULE_IO, see kvp_meta_open). On error nothing changed.
 */
KVP_API int kvp_meta_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                             const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                             struct kvp_error *err);

/*
 * What a confirmation may say beyond its keys and pages: where each page
 * stands in its prefix, and the tokens it holds. Nothing of it changes the
 * state; a watcher (kvp_meta_watch, kvpage serve's KV events) hears it with
 * the page's KVP_CHANGE_STORED, as the engines' own events carry it
 * (parent_block_hash, token_ids). The in-process backend (mem:, file:) keeps
 * it with the key: the lineage of the key's last accepted confirmation that
 * names one (the parent, the tokens or both replace the whole; one naming
 * none or losing to the key's held page changes nothing), told with the
 * page by the inventory (kvp_meta_inventory) and by later confirmations of
 * the key, and, with a data directory, kept across a restart; it goes with
 * the key.
 * The http:// backend sends them to its kvpage serve (protocol.md 14.1:
 * "prefix_key" when the parents are a chain, each the key before it, else
 * "parent_keys"; "token_ids"; a parent that is not UTF-8 goes as not known);
 * redis:// keeps them with the keys stored (until they lose their pages), and
 * its inventory tells them (docs/protocol-notes.md, "Kept in Redis").
 */
struct kvp_confirm_opts {
    size_t opts_size; /* sizeof(struct kvp_confirm_opts) */
    /* parents[i]: the key of the page before keys[i] in its sequence of
     * tokens (the engine's parent block); len 0: not known (the first page
     * of a sequence has none). NULL: no parent known. */
    const struct kvp_str *parents;
    /* token_ids[i]: the ntokens[i] tokens of keys[i]'s page (at most
     * KVP_MAX_PAGE_TOKENS); ntokens[i] 0: not known. Both NULL: none known. */
    const uint32_t *const *token_ids;
    const uint32_t *ntokens;
};
#define KVP_MAX_PAGE_TOKENS 65536

/*
 * kvp_meta_confirm with opts (NULL: as kvp_meta_confirm). opts is checked
 * with the rest before anything changes: -EINVAL (KVP_RULE_ARG: opts_size not
 * a size of struct kvp_confirm_opts, token_ids[i] NULL with ntokens[i] > 0,
 * only one of token_ids and ntokens, more than KVP_MAX_PAGE_TOKENS tokens;
 * KVP_RULE_KEY: a parent that is not a valid key, index i). Otherwise the
 * same returns as kvp_meta_confirm.
 */
KVP_API int kvp_meta_confirm_ex(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                                const struct kvp_confirm_opts *opts, struct kvp_error *err);

/*
 * Existence without recency change. rank < 0: true where the key is complete
 * (holds a page on every initialized rank of the namespace: vLLM). rank >= 0:
 * true where the key holds a page on that rank (SGLang).
 * Returns 0, -ENOENT (rank >= 0 and not initialized), -EINVAL (bad key).
 */
KVP_API int kvp_meta_exists(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                            uint8_t *out, struct kvp_error *err);

/*
 * Locations on one rank: pages[i] = the key's page, or -1. complete_only != 0
 * (vLLM get_locations): -1 unless the key is complete. Hits are touched (last
 * key first) and start their read grace.
 * Returns 0, -ENOENT (rank not initialized), -EINVAL (bad key).
 */
KVP_API int kvp_meta_lookup(struct kvp_ns *ns, uint32_t rank, int complete_only,
                            const struct kvp_str *keys, size_t n, int64_t *pages,
                            struct kvp_error *err);

/*
 * Deletes keys: their pages become FREE. rank < 0: on every rank (vLLM
 * extension); rank >= 0: on that rank only (SGLang). Unknown keys are ignored.
 * Returns 0, -ENOENT (rank >= 0 and not initialized), -EINVAL (bad key), or a
 * log error (KVP_RULE_IO, see kvp_meta_open; nothing changed).
 */
KVP_API int kvp_meta_delete(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                            struct kvp_error *err);

/*
 * kvp_meta_delete of keys whose pages a reader rejected: their bytes failed
 * the page's integrity tag (kvpage/pagefile.h), so the key is forgotten and
 * its next lookup is an honest miss. The same change as kvp_meta_delete; a
 * remote kvpage serve (http://) is also told why ("reason": "integrity" in
 * the delete's body), so that it counts the keys in its /metrics
 * (kvpage_pages_rejected_total); the other backends just delete. The same
 * returns as kvp_meta_delete. A key put again meanwhile on another page is
 * forgotten too (one miss more, never wrong bytes).
 */
KVP_API int kvp_meta_delete_rejected(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys,
                                     size_t n, struct kvp_error *err);

/*
 * Clears: rank < 0, every key and reservation of the namespace (ranks stay
 * initialized, all pages FREE); rank >= 0, that rank's pages and its keys.
 * Returns 0, -ENOENT (rank >= 0 and not initialized), -ENOMEM, or a log
 * error (KVP_RULE_IO, see kvp_meta_open; nothing changed).
 */
KVP_API int kvp_meta_clear(struct kvp_ns *ns, int64_t rank, struct kvp_error *err);

/*
 * Drops the namespace (deployment, pool): every key, reservation and rank of
 * it is forgotten, and it is gone from kvp_meta_stats (so from kvpage
 * serve's status page, /v1/stats and /metrics) and from kvp_meta_ns with
 * create == 0 (-ENOENT), durably (a DROP record in the log; Redis: its keys
 * deleted). Handles to it stay valid: their calls find no rank initialized
 * (-ENOENT, KVP_RULE_RANK_NOT_INIT), and the next kvp_meta_init_rank, as
 * an engine's next initialization, creates it again, empty. The in-process
 * engine keeps a few bytes of its name so that its log's numbering holds.
 * Returns 0, -EINVAL (bad name: KVP_RULE_NAMESPACE), -ENOENT (no such
 * namespace), -EOPNOTSUPP (a backend that cannot: a kvpage serve older
 * than the route), or a log or connection error as the other changes.
 */
KVP_API int kvp_meta_drop(struct kvp_meta *m, const char *deployment, size_t dlen, const char *pool,
                          size_t plen, struct kvp_error *err);

/*
 * The _async forms: the same as the calls above, but they return once the
 * change is applied and visible to every caller, before it is durable.
 * *ticket (which the caller sets to 0 before its first call) is raised to the
 * point at which the change is durable and never lowered, so one ticket can
 * gather the calls of one request; it stays 0 when nothing needs waiting for.
 * A caller must not acknowledge the change to anyone before kvp_meta_wait
 * or kvp_meta_when_durable says it is durable.
 */
KVP_API int kvp_meta_init_rank_async(struct kvp_ns *ns, uint32_t rank, uint64_t num_pages,
                                     uint64_t *ticket, struct kvp_error *err);
KVP_API int kvp_meta_allocate_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                    size_t n, int64_t *pages, uint8_t *existed, uint64_t *ticket,
                                    struct kvp_error *err);
KVP_API int kvp_meta_allocate_ordered_async(struct kvp_ns *ns, uint32_t rank, int order,
                                            const struct kvp_str *keys, size_t n, int64_t *pages,
                                            uint8_t *existed, uint64_t *ticket,
                                            struct kvp_error *err);
KVP_API int kvp_meta_confirm_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                   const int64_t *pages, size_t n, const int64_t *release,
                                   size_t nrel, uint64_t *ticket, struct kvp_error *err);
KVP_API int kvp_meta_confirm_ex_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                      const int64_t *pages, size_t n, const int64_t *release,
                                      size_t nrel, const struct kvp_confirm_opts *opts,
                                      uint64_t *ticket, struct kvp_error *err);
KVP_API int kvp_meta_delete_async(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys,
                                  size_t n, uint64_t *ticket, struct kvp_error *err);
KVP_API int kvp_meta_clear_async(struct kvp_ns *ns, int64_t rank, uint64_t *ticket,
                                 struct kvp_error *err);
KVP_API int kvp_meta_drop_async(struct kvp_meta *m, const char *deployment, size_t dlen,
                                const char *pool, size_t plen, uint64_t *ticket,
                                struct kvp_error *err);

/*
 * Blocks until everything a ticket covers is durable. Returns 0, or the
 * negative errno the log failed with (-EIO, -ENOSPC, ...): the change is
 * applied in memory but is not durable and must not be acknowledged; err
 * (may be NULL) then has rule KVP_RULE_IO and a message naming the cause.
 * -EINVAL (KVP_RULE_ARG): the ticket is past anything this handle handed out.
 */
KVP_API int kvp_meta_wait(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err);

/*
 * Returns 1 when the ticket is durable already (fn is not called); 0 when
 * fn(arg, status) will be called once it is (status 0 or a negative errno
 * as kvp_meta_wait returns), on a thread of the library, which fn must not
 * block for long; or a negative errno when the log has failed already.
 */
typedef void (*kvp_meta_durable_fn)(void *arg, int status);
KVP_API int kvp_meta_when_durable(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn,
                                  void *arg);

/*
 * Pins (issue 38 §3): keys of the namespace that eviction passes over for a
 * time. kvp_meta_pin adds one reference to each key's pin (a key pinned
 * twice in one call gets two) and moves its deadline to now + ttl_ms when
 * that is later; the pin ends when its references are all taken back by
 * kvp_meta_unpin or at its deadline. Keys need not be stored yet: a page
 * confirmed later is pinned from then on. Delete and clear remove pinned
 * keys all the same. The pinned keys of a namespace never exceed max_ratio
 * (0 < max_ratio <= 1) of its smallest rank's pages: a pin over that limit
 * pins nothing and fails. The pins persist with a file: state (the data
 * directory's file PINS), end with a mem: one, and live in Redis with a
 * redis: one (deadlines by Redis's clock); with an http:// one they are the
 * server's (POST and DELETE /v1/pins, which never repeat a request: a pin
 * counts; the lower of max_ratio and the server's --max-pinned-ratio
 * applies; ttl_ms at most a year, the server's bound, else -EINVAL), and
 * kvp_meta_pinned reads the server's GET /v1/stats.
 *
 * kvp_meta_pin: 0 (*total = pinned keys of the namespace after it, *limit =
 * the most allowed; both may be NULL), -ENOENT (no rank initialized),
 * -ENOSPC (KVP_RULE_TOO_MANY: over the limit; err->value = the keys it
 * would make, err->limit = the limit; *total and *limit set), -EINVAL (bad
 * key, ttl_ms 0, max_ratio outside (0, 1]), -EROFS (opened read-only),
 * -EOPNOTSUPP (a backend without pins: mem:, file:, redis: and http: have
 * them; a server older than them), or
 * KVP_RULE_IO when the file cannot be written (the pin holds in memory).
 * kvp_meta_unpin: *released (may be NULL) = the references taken back (keys
 * not pinned are passed over); the same errors but -ENOENT and -ENOSPC.
 * kvp_meta_pinned: the pinned keys (*keys) and their references (*refs),
 * of the namespace (rank < 0) or of those holding a page on rank; -ENOENT
 * for a rank not initialized.
 */
KVP_API int kvp_meta_pin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                         double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err);
KVP_API int kvp_meta_unpin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n,
                           uint64_t *released, struct kvp_error *err);
KVP_API int kvp_meta_pinned(struct kvp_ns *ns, int64_t rank, uint64_t *keys, uint64_t *refs,
                            struct kvp_error *err);

/*
 * The engines' block hashes of a page key, as their KV events carry them:
 * SGLang: the key's first 16 hex digits (hash_str_to_int64, a signed int64
 * of the same bits); vLLM: its last 16 hex digits (maybe_convert_block_hash).
 */
enum kvp_hash_form { KVP_HASH_SGLANG = 0, KVP_HASH_VLLM = 1 };

/*
 * Which hashes (of form, enum kvp_hash_form) name a key that holds a page on
 * each of ranks[0..nranks): out[i * nranks + j] = 1 when hashes[i] is the
 * hash of a key held on ranks[j]. Reads every page of those ranks (no index
 * maps hashes to keys; http:// asks the server's POST /v1/query with "held").
 * Returns 0, -ENOENT (a rank not initialized), -EINVAL, -EOPNOTSUPP (mem:,
 * file:, redis: and http: have it; a server older than "held").
 */
KVP_API int kvp_meta_exists_hashes(struct kvp_ns *ns, const uint64_t *hashes, size_t n, int form,
                                   const uint32_t *ranks, size_t nranks, uint8_t *out,
                                   struct kvp_error *err);

/* Number of initialized worker ranks of the namespace. */
KVP_API size_t kvp_meta_nranks(struct kvp_ns *ns);

/*
 * Calls fn once per namespace (in creation order) with a consistent copy of
 * its ranks' figures, sorted by rank; expired reservations are reclaimed
 * first. fn runs without any lock held. A non-zero return of fn stops the walk
 * and is returned. Returns 0, -ENOMEM, or fn's value.
 */
typedef int (*kvp_meta_stats_fn)(const char *deployment, const char *pool,
                                 const struct kvp_rank_stats *ranks, size_t nranks, void *arg);
KVP_API int kvp_meta_stats(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg);

/*
 * A change of what a state holds, seen by a watcher (kvp_meta_watch) or read
 * from the inventory (kvp_meta_inventory): a key got its page on a rank
 * (KVP_CHANGE_STORED: a confirmation, or a held page of the inventory) or
 * lost it (KVP_CHANGE_REMOVED: an eviction, a delete, a clear, a drop); or
 * the watcher missed changes of that namespace and rank (KVP_CHANGE_LOST,
 * key NULL: a Redis stream of changes trimmed before the watcher read
 * them): what it was told no longer adds up to the state, and only the
 * inventory (kvp_meta_inventory) does. More kinds may come: a callback
 * passes over a kind it does not know. The strings and arrays live until
 * the callback returns; deployment and pool end in NUL, key and parent do
 * not.
 *
 * The struct grows at its end; size says how much of it the library filled:
 * a field exists when KVP_CHANGE_HAS(c, field) (a library older than size
 * filled none of it; a program that may run with one must not read past
 * len).
 */
enum kvp_change_kind { KVP_CHANGE_STORED = 1, KVP_CHANGE_REMOVED = 2, KVP_CHANGE_LOST = 3 };
struct kvp_meta_change {
    int kind; /* enum kvp_change_kind */
    struct kvp_ns *ns;
    const char *deployment, *pool;
    uint32_t rank;
    const char *key;
    size_t len;
    size_t size; /* sizeof(struct kvp_meta_change) as the library knows it */
    /* KVP_CHANGE_STORED by kvp_meta_confirm_ex, as its opts said, or from
     * an inventory that keeps them (mem:, file:, redis://; mem:/file: also
     * tell a key's kept ones with a confirmation naming none; see struct
     * kvp_confirm_opts) (else NULL and 0): the key of the page before this
     * one in its sequence (parent_len bytes), and the page's ntokens tokens. */
    const char *parent;
    size_t parent_len;
    const uint32_t *token_ids;
    size_t ntokens;
};
#define KVP_CHANGE_HAS(c, field)                                                                   \
    ((c)->size >= offsetof(struct kvp_meta_change, field) + sizeof((c)->field))
typedef void (*kvp_meta_change_fn)(const struct kvp_meta_change *c, void *arg);

/*
 * Calls fn for every page a key gets or loses from now on (kvpage serve's KV
 * events), in the order the changes are made in each namespace, with that
 * namespace's lock held: fn must be quick and must not call into m. At the
 * end of each operation that may change pages, still under the lock, fn is
 * called with c NULL (it may hand on what it was told in one piece). fn NULL
 * stops watching; one watcher at a time (a second replaces the first). Set it
 * while no other thread uses m. Over Redis (redis://, redis-sentinel://) fn
 * hears the changes every process makes to the state, on a thread of the
 * backend's, in the order of each rank's changes (ranks between them in no
 * set order), c NULL after each operation's changes of one rank, within
 * about 20 ms. Returns 0, -EINVAL (m NULL), -ENOMEM, or -EOPNOTSUPP for a
 * backend that cannot be watched (http://).
 */
KVP_API int kvp_meta_watch(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg);

/*
 * Calls fn with KVP_CHANGE_STORED for every held page of every namespace,
 * one namespace at a time with its lock held (the same rules as
 * kvp_meta_watch's fn): each namespace as it is at one moment. Over Redis,
 * rank by rank as a scan finds them: every page held throughout is told,
 * and every change after the call began is told to a watcher after that.
 * Returns 0, -EINVAL, -EOPNOTSUPP (as kvp_meta_watch), or a failure to
 * reach the state.
 */
KVP_API int kvp_meta_inventory(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg);

/*
 * A number kept with the state under name (1..KVP_MAX_COUNTER_NAME bytes),
 * for a process that keeps nothing of its own: kvpage serve --kv-events's
 * next sequence number when the state is in Redis. Atomically sets it to
 * value when it is expect or less (a number never set is 0) and *now (may be
 * NULL) to what it is after: value == expect raises it to at least value,
 * value 0 and expect 0 read it. Exact up to 2^53. Returns 0, -EINVAL, or
 * -EOPNOTSUPP for a backend that keeps none (mem:, file:: a data directory
 * keeps such numbers), or a failure to reach the state (-errno, err).
 */
#define KVP_MAX_COUNTER_NAME 256
KVP_API int kvp_meta_counter(struct kvp_meta *m, const char *name, uint64_t expect, uint64_t value,
                             uint64_t *now, struct kvp_error *err);

/*
 * A figure of the backend's own (its log, its connection, ...), beyond the
 * per-rank figures every backend has (kvp_meta_stats). kvpage serve prints
 * each in /v1/stats as section.key and in /metrics as metric, without knowing
 * the backend. The strings are static or live until fn returns.
 */
enum kvp_value_type {
    KVP_VALUE_COUNTER = 0, /* only grows while the process runs */
    KVP_VALUE_GAUGE = 1,   /* goes up and down */
    KVP_VALUE_BOOL = 2,    /* 0 or 1: JSON false / true */
};
struct kvp_meta_value {
    const char *section; /* e.g. "wal": /v1/stats groups a section's values under it */
    const char *key;     /* name within the section, e.g. "fsync_seconds" */
    const char *metric;  /* Prometheus name, e.g. "kvpage_wal_fsync_seconds_total" */
    const char *help;    /* one sentence */
    int type;            /* enum kvp_value_type */
    int decimals;        /* the figure is value / 10^decimals (9: nanoseconds as seconds) */
    uint64_t value;
    const char *label;       /* NULL, or a label name: /metrics adds {label="label_value"}, */
    const char *label_value; /* /v1/stats adds "label": "label_value" to the section */
};
typedef int (*kvp_meta_value_fn)(const struct kvp_meta_value *v, void *arg);
/* Calls fn for each value of the backend, in a fixed order; a non-zero return
 * of fn stops and is returned. Returns 0 (a backend may have none). */
KVP_API int kvp_meta_values(struct kvp_meta *m, kvp_meta_value_fn fn, void *arg);

/*
 * 0 while changes are taken. Else the negative errno that refuses them now
 * (-ENOSPC or -EDQUOT: no room for the log; another: the log cannot be
 * written; for redis:// and http://, the store does not answer) and why (may
 * be NULL) gets a sentence ("cannot write the log in DIR: No space left on
 * device", "redis 10.0.0.5:6379: Connection refused"). Whether reads are
 * served meanwhile: kvp_meta_health_scope.
 */
KVP_API int kvp_meta_health(struct kvp_meta *m, char *why, size_t len);

/*
 * As kvp_meta_health, and what the failure takes away: *scope (may be NULL)
 * gets 0 while healthy, KVP_HEALTH_WRITES when only changes are refused and
 * reads are served (the in-process engine's log on a full or failing disk),
 * or KVP_HEALTH_ALL when reads fail too (a redis:// store or a remote kvpage
 * serve that does not answer).
 */
#define KVP_HEALTH_WRITES 1
#define KVP_HEALTH_ALL 2
KVP_API int kvp_meta_health_scope(struct kvp_meta *m, int *scope, char *why, size_t len);

/*
 * Where the state is and what an acknowledged change promises, as one line
 * for a log or a status page, never with a password: "data directory DIR
 * (write-ahead log, fsync batch)", "memory only", "Redis HOST:PORT db 0,
 * prefix kvp (appendonly yes, appendfsync always: acknowledged changes
 * survive a restart of Redis)", "kvpage serve at http://HOST:PORT". Writes
 * at most len bytes with the NUL (buf may be NULL when len is 0) and returns
 * the length of the whole line, as snprintf does; -EINVAL without a handle.
 * For redis:// it asks Redis (CONFIG GET) each time.
 */
KVP_API int kvp_meta_describe(struct kvp_meta *m, char *buf, size_t len);

/*
 * What a backend is and what its state promises (kvp_meta_info), or what a
 * backend is without a handle (kvp_meta_backend_info,
 * kvp_meta_location_info): what kvpage serve, its status page, the command
 * line and Python ask instead of naming backends.
 *
 * durability is what a change promises once acknowledged (once its call,
 * or its ticket, returned 0):
 *   KVP_DURABLE_UNKNOWN  not known here (a Redis that refuses CONFIG GET; a
 *                        remote kvpage serve, which keeps its own settings;
 *                        always, without a handle)
 *   KVP_DURABLE_NONE     lost when whatever holds the state stops: "mem:",
 *                        Redis without AOF (since its last snapshot)
 *   KVP_DURABLE_PROCESS  survives a crash of the process that holds it, not
 *                        of its machine: a data directory with fsync never,
 *                        Redis with appendfsync everysec (up to about a
 *                        second)
 *   KVP_DURABLE_MACHINE  on stable storage: a data directory with fsync
 *                        batch or always, Redis with appendfsync always
 * (Redis's levels are the value kvpage_redis_durability of kvp_meta_values
 * minus 1.)
 */
#define KVP_DURABLE_UNKNOWN (-1)
#define KVP_DURABLE_NONE 0
#define KVP_DURABLE_PROCESS 1
#define KVP_DURABLE_MACHINE 2

struct kvp_meta_info {
    size_t info_size; /* the caller sets sizeof(struct kvp_meta_info); a library
                         fills only what both know of */
    /* The strings are static (they live as long as the library). */
    const char *name;           /* the backend, as messages name it: "in-process",
                                   "http", "redis", "redis-sentinel" */
    const char *scheme;         /* the location's scheme, without ':': "mem", "file",
                                   "http", "redis", "redis-sentinel" */
    const char *description;    /* one line: the location's form and what it keeps */
    int remote;                 /* 1: another process holds the state (a kvpage serve,
                                   Redis), over the network: a call may fail with
                                   KVP_RULE_UNAVAILABLE and a later one succeed; 0:
                                   this process holds it */
    const char *holder;         /* what holds the state, as a sentence names it:
                                   "this process", "Redis", "kvpage serve" */
    const char *values_section; /* the section of kvp_meta_values with the figures
                                   of the connection to it ("redis":
                                   "nodes", "failures", ...), or NULL */
    /* What an acknowledged change promises (with a handle; else UNKNOWN and
     * NULL or "", save durability_wanted and durability_source). */
    int durability;                 /* KVP_DURABLE_* */
    char durability_text[160];      /* the settings that make it: "memory only",
                                       "write-ahead log, fsync batch", "appendonly yes,
                                       appendfsync everysec", "unknown (why)" */
    const char *durability_meaning; /* the level in words, as kvp_meta_describe
                                       says it: "up to about a second of
                                       acknowledged changes may be lost", or NULL */
    const char *durability_loss;    /* what a restart of the holder loses, short:
                                       "up to about a second of changes",
                                       "everything since its last snapshot"; NULL
                                       when nothing or unknown */
    const char *durability_wanted;  /* the holder's settings that keep what
                                       opts.fsync KVP_FSYNC_BATCH and ALWAYS ask for
                                       ("appendonly yes and appendfsync always"),
                                       or NULL: the backend keeps opts.fsync itself
                                       (in-process) or is not told (http://) */
    const char *durability_source;  /* how the settings are read ("CONFIG GET"),
                                       or NULL */
};

/*
 * Fills out (out->info_size set by the caller) for the handle m: the
 * backend, the scheme m was opened with, and what m's state promises. For
 * redis:// it asks Redis (CONFIG GET). 0, or -EINVAL (m or out NULL,
 * info_size 0).
 */
KVP_API int kvp_meta_info(struct kvp_meta *m, struct kvp_meta_info *out);

/*
 * The backends there are, one scheme each, without a handle: fills out for
 * the i-th scheme (0, 1, ...: in the order errors name them) and returns 0;
 * -ENOENT past the last one (out unchanged); -EINVAL for out NULL or
 * info_size 0.
 */
KVP_API int kvp_meta_backend_info(size_t i, struct kvp_meta_info *out);

/*
 * As kvp_meta_backend_info for the backend that kvp_meta_open_at would open
 * location with (NULL or "": "mem:", or "file:" with data_dir 1), without
 * opening it: 0, or the error kvp_meta_open_at gives for a location with no
 * or an unknown scheme (-EINVAL, -EOPNOTSUPP; err may be NULL).
 */
KVP_API int kvp_meta_location_info(const char *location, int data_dir, struct kvp_meta_info *out,
                                   struct kvp_error *err);

/*
 * Writes a snapshot now, as opts.snapshot_mode says (KVP_SNAPSHOT_THREAD: by
 * the snapshot thread; KVP_SNAPSHOT_FORK: by a child forked from the calling
 * thread; KVP_SNAPSHOT_MANUAL: by the calling thread), covering every change
 * made before the call, and returns when it is durable. 0, -ENOENT (no data
 * directory, or read-only), or the negative errno that failed it.
 */
KVP_API int kvp_meta_snapshot(struct kvp_meta *m);

/*
 * The rules on names and keys, for callers that check before they call (the
 * calls above check them too). A key: 1..KVP_MAX_KEY_LEN bytes without NUL;
 * kvp_key_problem returns NULL for a valid key, else why not ("is empty",
 * "is longer than 1024 bytes", "contains a NUL byte"). A deployment:
 * 1..KVP_MAX_NAME_LEN bytes of [A-Za-z0-9._-]; a pool: 1..KVP_MAX_NAME_LEN
 * bytes without NUL. The _valid functions return 1 or 0.
 */
KVP_API const char *kvp_key_problem(const char *key, size_t len);
KVP_API int kvp_deployment_valid(const char *name, size_t len);
KVP_API int kvp_pool_valid(const char *name, size_t len);

/*
 * Checks every invariant of protocol.md §1 over all namespaces: each page in
 * exactly one state; a key's page is HELD by that key; no page held by two
 * keys; free + reserved + held == num_pages; LRU and free lists consistent.
 * Returns 0, or -EUCLEAN with err->msg naming the namespace, rank, page, key.
 */
KVP_API int kvp_meta_check(struct kvp_meta *m, struct kvp_error *err);

#ifdef __cplusplus
}
#endif
#endif
