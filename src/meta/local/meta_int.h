/*
 * Internal structures of the in-process engine, the backend of the mem: and
 * file: locations (src/meta/local/local.c, its side of persistence in
 * src/meta/local/local_persist.c, pins.c and hashidx.c). Nothing else but their tests reads
 * it: the log (src/meta/local/persist.c) sees the state only through struct
 * kvp__persist_ops, and each namespace's journal through its struct
 * kvp__jrnl.
 */
#ifndef KVP_META_INT_H
#define KVP_META_INT_H

#include <pthread.h>
#include <stdint.h>
#include "kvpage/meta.h"
#include "meta/backend.h"
#include "meta/local/mem.h"

#define KVP_NONE UINT32_MAX /* "no page" in uint32 page links and key slots */
#define KVP_MAX_RANKS_PER_NS 65535

enum kvp__pstate { KVP_PFREE = 0, KVP_PRESERVED = 1, KVP_PHELD = 2 };

/*
 * A key of a namespace. One allocation: the header, one page slot per rank
 * slot of the namespace (grown lazily when ranks are added), then the key
 * bytes. Kept small on purpose: the per-key memory budget is 150 bytes (a
 * key's lineage is kept beside it, in its namespace's struct kvp__lintab).
 */
struct kvp__key {
    struct kvp__key *next; /* hash chain */
    uint32_t hash;         /* low 32 bits of the xxh3 hash: bucket bits and a tag */
    uint16_t len;          /* key length, 1..1024 */
    uint16_t cap;          /* number of slots in pages[] */
    uint16_t nheld;        /* slots with a page */
    uint16_t tag;          /* bits 48..63 of the hash, made odd (never 0): see kvp__bucket */
    uint32_t pages[];      /* per rank slot: page or KVP_NONE; key bytes follow */
};

/*
 * A bucket of the key index: the head of a chain of entries, the tags of its
 * first three entries (0 past the chain's end) and its length (saturating at
 * UINT16_MAX, which means "count the chain"). A lookup of an absent key in a
 * chain of up to three entries reads only the bucket, never an entry; 16
 * bytes, a quarter of a cache line.
 */
#define KVP_BUCKET_TAGS 3
struct kvp__bucket {
    struct kvp__key *head;
    uint16_t tag[KVP_BUCKET_TAGS];
    uint16_t n;
};

static inline const char *kvp__key_bytes(const struct kvp__key *k)
{
    return (const char *)(k->pages + k->cap);
}

/*
 * What the last accepted confirmation of a key that named them said of its
 * lineage (kvp_meta_confirm_ex): its tokens and its parent's key. One
 * allocation, never changed once kept (a snapshot thread may read it): a
 * later confirmation naming either puts a new one in its place.
 */
struct kvp__lin {
    struct kvp__lin *next_kept; /* on its namespace's kept list (kept_lin) */
    uint32_t ntokens;           /* 0..KVP_MAX_PAGE_TOKENS */
    uint16_t plen;              /* 0: no parent known */
    uint32_t tok[];             /* ntokens tokens; then the parent's plen bytes */
};

static inline const char *kvp__lin_parent(const struct kvp__lin *l)
{
    return (const char *)(l->tok + l->ntokens);
}

/*
 * The lineages of a namespace's keys, by key entry (src/meta/local/lineage.c):
 * beside the entries, not in them, so that keys confirmed without one cost
 * nothing (a pointer in every entry took 8 bytes a key: 153.8 against 145.4
 * bytes, past the budget). Open addressing on the entry's address; v NULL
 * until the first lineage.
 */
struct kvp__linent {
    const struct kvp__key *key; /* NULL: a free slot */
    struct kvp__lin *lin;
};
struct kvp__lintab {
    struct kvp__linent *v;
    uint64_t cap, n; /* cap: a power of two, or 0 */
};

/*
 * One page slot. Its state decides which list prev/next link it into:
 * FREE pages outside the rank's untouched range [hwm, ceil) are on the free
 * list, RESERVED pages on the reservation FIFO (lease order), HELD pages on
 * the LRU list.
 */
struct kvp__page {
    struct kvp__key *owner; /* HELD: the key; else NULL */
    uint64_t t;             /* RESERVED: lease deadline; HELD: end of read grace (ms) */
    uint32_t prev, next;
    uint32_t mark; /* request stamp that returned this page to its caller */
    uint8_t state; /* enum kvp__pstate */
};

struct kvp__list {
    uint32_t head, tail; /* head = newest (LRU: most recent); KVP_NONE when empty */
    uint64_t count;
};

struct kvp__rank {
    uint32_t id;   /* the rank number clients use */
    uint32_t slot; /* index into the namespace's slot table and keys' pages[] */
    uint32_t num_pages;
    /* The free pages in the order the engines' reference servers keep them
     * (protocol-notes, "The order of free pages"): the untouched range
     * [hwm, ceil), whose FREE pages were never handed out from the free
     * list, ascending, then the free list in release order (its head the
     * newest). vLLM's routes take from the front, SGLang's from the back. */
    uint32_t hwm;      /* pages < hwm were handed out from the bottom */
    uint32_t ceil;     /* pages >= ceil were handed out from the top */
    uint32_t bot, top; /* no page outside [bot, top) was HELD since the array
                        * was installed (a snapshot thread copies the range) */
    uint32_t stamp;
    struct kvp__page *pages;
    struct kvp__list free, reserved, lru;
    uint64_t nfree;             /* free-list pages plus FREE pages in [hwm, ceil) */
    struct kvp__populate ahead; /* backs the page array ahead of hwm */
    uint64_t hits, misses, allocations, evictions, expired, release_held;
    struct kvp__rank *next_dead; /* on its namespace's dead list (kvp_meta_drop) */
};

/*
 * A namespace's journal (src/meta/local/persist.c), embedded in it and guarded by
 * its lock: the hooks below take it, never the namespace.
 */
struct kvp__persist;
struct kvp__jrnl {
    struct kvp__persist *const *persist; /* the engine's log (*persist NULL: none) */
    uint32_t ns;                         /* the namespace's number in the records */
    /* Log records of the operation in progress, framed, appended to the
     * log in one piece by kvp__jrnl_commit. */
    uint8_t *buf;
    size_t len, cap;
    /* A page freed by a FREE or CLEAR record may be handed out again only
     * in a reply that waits until that record is durable: otherwise a crash
     * would bring back the old key on a page its new writer has overwritten.
     * freed: the staged records free pages; free_lsn: the log position
     * that makes the latest freeing durable. */
    int freed;
    uint64_t free_lsn;
    /* Log room reserved by the operation in progress (kvp__jrnl_reserve),
     * given back at kvp__jrnl_commit. */
    uint64_t res;
    /* The log position that makes the operation in progress durable: the
     * end of its records, or an earlier freeing it depends on (returned and
     * reset by kvp__jrnl_commit). */
    uint64_t lsn;
};

struct kvp__lns {
    struct kvp_ns pub;         /* the handle callers hold (first: a cast converts) */
    uint32_t id;               /* creation order; names the namespace in log records */
    struct kvp__lns *next;     /* registry hash chain */
    struct kvp__lns *next_all; /* creation order */
    struct kvp__local *meta;
    char *deployment, *pool;
    pthread_mutex_t lock;
    struct kvp__rank **slots; /* by slot */
    struct kvp__rank **by_id; /* sorted by rank id */
    uint32_t nranks, cap_ranks;
    struct kvp__bucket *buckets;
    uint64_t nbuckets, nkeys;
    struct kvp__bucket *old;   /* while the index grows: the table being emptied */
    uint64_t nold, mpos;       /* its size; its buckets below mpos are moved */
    struct kvp__bucket *grown; /* the next, bigger table while it is being backed */
    uint64_t ngrown;
    struct kvp__populate grow_job;
    struct kvp__slab keys_mem; /* the key entries */
    struct kvp__jrnl jrnl;     /* its log records (guarded by lock) */
    /* While a snapshot thread encodes from a copy of the page arrays (whose
     * owners point at key entries), dropped entries are kept here, linked
     * through next, instead of being reused (guarded by lock). */
    int keep_keys;
    struct kvp__key *kept;
    uint64_t nkept;
    struct kvp__lin *kept_lin; /* the lineages dropped meanwhile, as kept */
    struct kvp__lintab lins;   /* its keys' lineages (lineage.c; guarded by lock) */
    /* Dropped (kvp_meta_drop): no ranks, no keys, left out of the figures
     * and found only to be created again; an entry stays so that the log's
     * namespace numbers keep their meaning. The next rank initialized
     * brings it back (guarded by lock; read atomically by lo_ns). */
    int dropped;
    /* Ranks dropped while the prefault thread may still hold their page
     * job (ahead): freed once it is done, or at close (guarded by lock). */
    struct kvp__rank *dead;
    /* Pins (src/meta/local/pins.c): NULL until the first (guarded by lock). */
    struct kvp__pins *pins;
    /* The index of block hashes per enum kvp_hash_form (hashidx.c): NULL
     * until the first query by hashes in that form (guarded by lock). */
    struct kvp__hx *hx[2];
};

struct kvp__local {
    struct kvp_meta *front; /* the handle callers hold */
    struct kvp_meta_opts opts;
    pthread_rwlock_t ns_lock; /* guards the registry only */
    struct kvp__lns **ns_buckets;
    struct kvp__lns *ns_first, *ns_last;
    uint64_t ns_count;
    struct kvp__lns **ns_by_id;
    struct kvp__persist *persist; /* NULL: in memory only */
    struct kvp__mempool pool;     /* pre-faulted pieces for the key entries */
    /* kvp_meta_watch: told of every page a key gets or loses (NULL: none).
     * Set while no other thread uses the handle; read under namespace locks. */
    kvp_meta_change_fn watch;
    void *watch_arg;
};

/* Journal: called under the namespace lock before the change is applied.
 * All are no-ops without persistence, and while recovery applies records
 * (src/meta/local/persist.c). */
/* A new namespace's journal (its number id) over the engine's log. */
void kvp__jrnl_start(struct kvp__jrnl *j, struct kvp__persist *const *persist, uint32_t id);
/* Returns the log position at which the namespace's record is durable. */
uint64_t kvp__jrnl_ns(struct kvp__jrnl *j, const char *deployment, const char *pool);
void kvp__jrnl_init(struct kvp__jrnl *j, uint32_t rank, uint32_t num_pages);
void kvp__jrnl_hold(struct kvp__jrnl *j, uint32_t rank, uint32_t page, const char *key,
                    uint16_t klen);
/* The lineage a confirmation on rank gave the key (after its HOLD). */
void kvp__jrnl_lin(struct kvp__jrnl *j, uint32_t rank, const char *key, uint16_t klen,
                   const struct kvp__lin *l);
void kvp__jrnl_free(struct kvp__jrnl *j, uint32_t rank, uint32_t page);
void kvp__jrnl_clear(struct kvp__jrnl *j, int64_t rank);
void kvp__jrnl_drop(struct kvp__jrnl *j);
/* Recovery's DROP record: drops the namespace (takes its lock). */
void kvp__replay_drop(struct kvp__lns *ns);
/* Appends the records staged by the calls above; before the lock is released.
 * Returns the log position at which the operation is durable (0: now). */
uint64_t kvp__jrnl_commit(struct kvp__jrnl *j);
/*
 * Log space for an operation's records, taken before it changes anything
 * (protocol-notes: a full disk): the log's file space for keep more bytes
 * (the most its records can take) is made certain and held until
 * kvp__jrnl_commit; probe more bytes must fit as well but are not held
 * (allocate: the confirmations it lets clients make). 0, or a negative errno
 * with err (KVP_RULE_IO, msg naming the directory and the cause): -ENOSPC or
 * -EDQUOT when there is no space, another when the log cannot be written;
 * the caller then changes nothing. No-ops without persistence.
 */
int kvp__jrnl_reserve(struct kvp__jrnl *j, uint64_t keep, uint64_t probe, struct kvp_error *err);
/* The same for a change outside a namespace lock (namespace creation);
 * kvp__jrnl_unspace gives the room back after the append. */
int kvp__jrnl_space(struct kvp__local *m, uint64_t keep, uint64_t probe, struct kvp_error *err);
void kvp__jrnl_unspace(struct kvp__local *m, uint64_t bytes);
/* Upper bounds of the log bytes (header included) of each record type. */
#define KVP_JRNL_HDR 12u /* KVP_WAL_HDR */
#define KVP_JRNL_NS(dl, pl) (KVP_JRNL_HDR + 7u + (uint64_t)(dl) + (uint64_t)(pl))
#define KVP_JRNL_INIT (KVP_JRNL_HDR + 13u)
#define KVP_JRNL_HOLD(klen) (KVP_JRNL_HDR + 15u + (uint64_t)(klen))
#define KVP_JRNL_LIN(klen, plen, ntok)                                                             \
    (KVP_JRNL_HDR + 17u + (uint64_t)(klen) + (uint64_t)(plen) + 4u * (uint64_t)(ntok))
#define KVP_JRNL_FREE (KVP_JRNL_HDR + 13u)
#define KVP_JRNL_CLEAR (KVP_JRNL_HDR + 9u)
#define KVP_JRNL_DROP KVP_JRNL_CLEAR /* the same fields: namespace, every rank */
/* The most an allocate probes for the confirmations it enables. */
#define KVP_JRNL_PROBE_MAX ((uint64_t)256 << 10)
/* The operation hands out a FREE page: its reply waits until the newest
 * freeing of the namespace is durable (with the lock held). */
void kvp__jrnl_reuse(struct kvp__jrnl *j);

/* Persistence lifetime, called by the backend's open and close. ops: the
 * engine's side of it (src/meta/local/persist.h), through which alone persist.c
 * reaches the state. */
struct kvp__persist_ops;
int kvp__persist_open(struct kvp__local *m, const struct kvp__persist_ops *ops);
void kvp__persist_close(struct kvp__local *m);
/* The backend's operations that the log serves (src/meta/local/persist.c). */
int kvp__persist_wait(struct kvp__local *m, uint64_t lsn, struct kvp_error *err);
int kvp__persist_when_durable(struct kvp__local *m, uint64_t lsn, kvp_meta_durable_fn fn,
                              void *arg);
int kvp__persist_values(struct kvp__local *m, kvp_meta_value_fn fn, void *arg);
int kvp__persist_health(struct kvp__local *m, char *why, size_t len);
int kvp__persist_snapshot(struct kvp__local *m);

/* Recovery: apply one change without logging it (for local_persist.c). -EUCLEAN when it
 * contradicts the state (msg says how). */
int kvp__replay_hold(struct kvp__lns *ns, uint32_t rank, uint32_t page, const struct kvp_str *key,
                     char *msg, size_t msglen);
int kvp__replay_free(struct kvp__lns *ns, uint32_t rank, uint32_t page, char *msg, size_t msglen);
/* The lineage of a key that holds a page (tok: ntokens little-endian
 * uint32s, as the log has them). */
int kvp__replay_lin(struct kvp__lns *ns, const struct kvp_str *key, const char *parent,
                    uint32_t plen, const uint8_t *tok, uint32_t ntokens, char *msg, size_t msglen);
struct kvp__lns *kvp__meta_ns_by_id(struct kvp__local *m, uint32_t id);
/* Sizes the key index for nkeys at once (recovery knows the count). */
void kvp__meta_reserve_keys(struct kvp__lns *ns, uint64_t nkeys);
/*
 * keep != 0: from now on the key entries the namespace drops (delete,
 * eviction, clear, an entry grown into a new one) are kept as they are, not
 * freed or reused, so that a snapshot thread may read the bytes of every
 * entry that existed when keeping began. keep == 0: frees the kept ones.
 * Returns how many were kept. Caller holds ns->lock.
 */
uint64_t kvp__meta_keep_keys(struct kvp__lns *ns, int keep);

/* Pins (src/meta/local/pins.c). kvp__pin_active: whether key e is pinned at now
 * (caller holds ns->lock); the others are the backend's operations. */
int kvp__pin_active(struct kvp__lns *ns, const struct kvp__key *e, uint64_t now);
void kvp__pins_free(struct kvp__lns *ns);
void kvp__pins_load(struct kvp__local *m);
int kvp__lo_pin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err);
int kvp__lo_unpin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t *released,
                  struct kvp_error *err);
int kvp__lo_pinned(struct kvp_ns *pub, int64_t rank, uint64_t *keys, uint64_t *refs,
                   struct kvp_error *err);
int kvp__lo_exists_hashes(struct kvp_ns *pub, const uint64_t *hashes, size_t n, int form,
                          const uint32_t *ranks, size_t nranks, uint8_t *out,
                          struct kvp_error *err);
/* The index of block hashes (src/meta/local/hashidx.c), with ns->lock held.
 * kvp__hx_lookup: out[j] = 1 for each slot slots[j] on which a key whose
 * engine hash in form (kvpage/meta.h, enum kvp_hash_form) is v holds a page
 * (others left as they are), the form's index built first if there is
 * none; 0 or -ENOMEM. kvp__hx_note: the key
 * index's one call into it, where entry from becomes to (NULL from: to was
 * created; NULL to: from is unlinked, its bytes still readable); costs a
 * test when nothing was ever queried by hashes. kvp__hx_free: forgets it
 * (every entry dropped at once, or the namespace closed). */
struct kvp__hx;
int kvp__hx_lookup(struct kvp__lns *ns, int form, uint64_t v, const uint32_t *slots, size_t nslots,
                   uint8_t *out);
void kvp__hx_change(struct kvp__lns *ns, struct kvp__key *from, struct kvp__key *to);
static inline void kvp__hx_note(struct kvp__lns *ns, struct kvp__key *from, struct kvp__key *to)
{
    if (__builtin_expect(ns->hx[0] != NULL || ns->hx[1] != NULL, 0))
        kvp__hx_change(ns, from, to);
}
void kvp__hx_free(struct kvp__lns *ns);
/* Lineages (src/meta/local/lineage.c), with ns->lock held. kvp__lin_get: key
 * e's in table t (the namespace's, or a snapshot's copy), or NULL.
 * kvp__lin_reserve: room for more lineages set without failing; 0 or
 * -ENOMEM. kvp__lin_set: e's becomes l (its old one goes; room reserved).
 * kvp__lin_note: the key index's call, where entry from becomes to (NULL:
 * from is unlinked; its lineage goes); a test when none was ever kept.
 * kvp__lin_free: a lineage no key has (NULL: none), kept while a snapshot
 * thread may read it (kvp__meta_keep_keys). kvp__lin_drop_all: every one
 * of the namespace goes. */
struct kvp__lin *kvp__lin_get(const struct kvp__lintab *t, const struct kvp__key *e);
int kvp__lin_reserve(struct kvp__lns *ns, uint64_t more);
void kvp__lin_set(struct kvp__lns *ns, const struct kvp__key *e, struct kvp__lin *l);
void kvp__lin_change(struct kvp__lns *ns, const struct kvp__key *from, const struct kvp__key *to);
static inline void kvp__lin_note(struct kvp__lns *ns, const struct kvp__key *from,
                                 const struct kvp__key *to)
{
    if (__builtin_expect(ns->lins.n != 0, 0))
        kvp__lin_change(ns, from, to);
}
void kvp__lin_free(struct kvp__lns *ns, struct kvp__lin *l);
void kvp__lin_drop_all(struct kvp__lns *ns);
/* For pins.c, with ns->lock held: the rank (NULL: not initialized) and the
 * page of key on it (KVP_NONE: none). */
struct kvp__rank *kvp__rank_of(struct kvp__lns *ns, uint32_t rank);
uint32_t kvp__key_page_locked(struct kvp__lns *ns, const struct kvp__rank *r,
                              const struct kvp_str *key);

/* Test and tool helpers (not part of the public API). */

/* The key's page on the rank without touching it; -1 none, -2 rank unknown
 * (a namespace of a mem: or file: location). */
int64_t kvp__meta_peek(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *key);
/* The engine behind a mem: or file: handle. */
struct kvp__local *kvp__local_of(struct kvp_meta *m);
/* When set, a THREAD or MANUAL snapshot calls it once it has copied the
 * state and released the locks, before the log's rotation is finished and
 * the snapshot written (tests change the state there). Set it only while no
 * snapshot runs. */
extern void (*kvp__snapshot_test_hook)(void *arg);
extern void *kvp__snapshot_test_hook_arg;
#endif
