/*
 * The log of the in-process engine, for recovery and the fuzz target.
 * Internal: not part of the public API (callers use kvp_meta_wait,
 * kvp_meta_values, kvp_meta_health and kvp_meta_snapshot).
 *
 * persist.c sits below the engine: it encodes and decodes the records and
 * drives the log (src/wal) and the snapshots, and it reaches the engine's
 * state only through the table the engine hands kvp__persist_open (struct
 * kvp__persist_ops, src/meta/local/local_persist.c) and each namespace's journal
 * (struct kvp__jrnl, which the hooks take). It calls no function of the
 * engine by name and reads none of its namespaces, ranks, keys or page
 * arrays: of the engine's handle only its options and its log pointer.
 */
#ifndef KVP_META_PERSIST_H
#define KVP_META_PERSIST_H

#include <stddef.h>
#include <stdint.h>
#include "meta/local/meta_int.h"

/*
 * Room for a copy of the state that a snapshot thread writes from
 * (KVP_SNAPSHOT_THREAD, KVP_SNAPSHOT_MANUAL): persist.c backs mem before
 * the locks are taken, the engine's freeze fills it (used, and root for
 * its walk) and its walk reads it.
 */
struct kvp__frozen {
    uint8_t *mem;
    size_t cap, used;
    const void *root;
    size_t n;
};

/* What a walk of the state tells, namespace by namespace in creation order:
 * the namespace, its ranks, then each rank's held pages from the least to
 * the most recently used. */
struct kvp__persist_visit {
    void (*ns)(void *arg, uint32_t id, const char *deployment, const char *pool, uint64_t nkeys,
               int dropped);
    void (*rank)(void *arg, uint32_t ns, uint32_t rank, uint32_t num_pages);
    void (*hold)(void *arg, uint32_t ns, uint32_t rank, uint32_t page, const char *key,
                 uint16_t klen);
    /* After a hold whose key has a lineage: it (struct kvp__lin). */
    void (*lin)(void *arg, uint32_t ns, uint32_t rank, const char *key, uint16_t klen,
                const struct kvp__lin *l);
};

/*
 * The engine's side of persistence. Recovery's ops apply one decoded record
 * without logging it: 0, -ENOMEM, or -EUCLEAN with msg (the words recovery
 * logs) when the record contradicts the state. A namespace is named by its
 * id; has_ns says whether it was created.
 */
struct kvp__persist_ops {
    int (*has_ns)(struct kvp__local *m, uint32_t ns);
    int (*ns)(struct kvp__local *m, uint32_t id, const char *dep, uint32_t dl, const char *pool,
              uint32_t pl, char *msg, size_t msglen);
    void (*keys_hint)(struct kvp__local *m, uint32_t ns, uint64_t nkeys);
    int (*init)(struct kvp__local *m, uint32_t ns, uint32_t rank, uint32_t num_pages, char *msg,
                size_t msglen);
    int (*hold)(struct kvp__local *m, uint32_t ns, uint32_t rank, uint32_t page,
                const struct kvp_str *key, char *msg, size_t msglen);
    int (*free)(struct kvp__local *m, uint32_t ns, uint32_t rank, uint32_t page, char *msg,
                size_t msglen);
    /* tok: ntokens little-endian uint32s. */
    int (*lin)(struct kvp__local *m, uint32_t ns, const struct kvp_str *key, const char *parent,
               uint32_t plen, const uint8_t *tok, uint32_t ntokens, char *msg, size_t msglen);
    void (*drop)(struct kvp__local *m, uint32_t ns);
    int (*clear)(struct kvp__local *m, uint32_t ns, uint32_t rank_or_all, char *msg, size_t msglen);
    /* Snapshots: every lock of the state, taken and released. */
    void (*lock_all)(struct kvp__local *m);
    void (*unlock_all)(struct kvp__local *m);
    /* Bytes a frozen copy takes. unlocked: the caller holds no lock (an
     * estimate); else it holds every lock (the figure). */
    size_t (*frozen_bytes)(struct kvp__local *m, int unlocked);
    /* Copies what a walk needs into fz (room for frozen_bytes) and keeps
     * every key entry dropped from now on; caller holds every lock. */
    void (*freeze)(struct kvp__local *m, struct kvp__frozen *fz);
    /* The walk of fz is done: the kept entries go. Returns how many. */
    uint64_t (*thaw)(struct kvp__local *m, const struct kvp__frozen *fz);
    /* Tells v the state: fz's copy, or the live state when fz is NULL (in a
     * forked child, or with every lock held, or with no request running). */
    void (*walk)(struct kvp__local *m, const struct kvp__frozen *fz,
                 const struct kvp__persist_visit *v, void *arg);
    /* The catalog of namespaces and ranks logged again at the start of a
     * segment: its bytes (upper bound), and staging and committing it
     * through the journal. Caller holds every lock. */
    uint64_t (*catalog_bytes)(struct kvp__local *m);
    void (*catalog)(struct kvp__local *m);
};

/* The engine's table (src/meta/local/local_persist.c). */
extern const struct kvp__persist_ops kvp__local_persist_ops;

/* "cannot write the log in DIR: <strerror(rc)>" */
void kvp__meta_log_why(struct kvp__local *m, int rc, char *buf, size_t len);

/* Applies one log/snapshot record payload (recovery and the fuzz target).
 * -EUCLEAN with msg when it is malformed or contradicts the state. */
int kvp__persist_apply(struct kvp__local *m, const uint8_t *payload, uint32_t len, char *msg,
                       size_t msglen, int *type);

#endif
