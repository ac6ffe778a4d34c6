/*
 * The in-process engine's side of its persistence (struct kvp__persist_ops,
 * src/meta/local/persist.h): what recovery applies and what a snapshot reads of
 * the engine's namespaces, ranks and page arrays. The engine hands this
 * table to kvp__persist_open; persist.c, below it, reaches the state only
 * through it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "meta/local/meta_int.h"
#include "meta/local/persist.h"

#define ALL_RANKS 0xffffffffu

/* ---------------------------------------------------------------- recovery */

static int rp_has_ns(struct kvp__local *m, uint32_t id)
{
    return kvp__meta_ns_by_id(m, id) != NULL;
}

static int rp_ns(struct kvp__local *m, uint32_t id, const char *dep, uint32_t dl, const char *pool,
                 uint32_t pl, char *msg, size_t msglen)
{
    struct kvp_error err = {0};
    struct kvp_ns *pub;
    int rc = kvp_meta_ns(m->front, dep, dl, pool, pl, 1, &pub, &err);
    if (rc == -ENOMEM)
        return rc;
    if (rc || ((struct kvp__lns *)pub)->id != id) {
        snprintf(msg, msglen, "namespace record %u does not match the namespaces before it", id);
        return -EUCLEAN;
    }
    return 0;
}

static void rp_keys_hint(struct kvp__local *m, uint32_t ns, uint64_t nkeys)
{
    kvp__meta_reserve_keys(kvp__meta_ns_by_id(m, ns), nkeys);
}

static int rp_init(struct kvp__local *m, uint32_t ns, uint32_t rank, uint32_t np, char *msg,
                   size_t msglen)
{
    struct kvp_error err = {0};
    int rc = kvp_meta_init_rank(&kvp__meta_ns_by_id(m, ns)->pub, rank, np, &err);
    if (rc == -ENOMEM)
        return rc;
    if (rc) {
        snprintf(msg, msglen, "INIT of rank %u with %u pages: %s", rank, np, err.msg);
        return -EUCLEAN;
    }
    return 0;
}

static int rp_hold(struct kvp__local *m, uint32_t id, uint32_t rank, uint32_t page,
                   const struct kvp_str *key, char *msg, size_t msglen)
{
    struct kvp__lns *ns = kvp__meta_ns_by_id(m, id);
    pthread_mutex_lock(&ns->lock);
    int rc = kvp__replay_hold(ns, rank, page, key, msg, msglen);
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

static int rp_free(struct kvp__local *m, uint32_t id, uint32_t rank, uint32_t page, char *msg,
                   size_t msglen)
{
    struct kvp__lns *ns = kvp__meta_ns_by_id(m, id);
    pthread_mutex_lock(&ns->lock);
    int rc = kvp__replay_free(ns, rank, page, msg, msglen);
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

static int rp_lin(struct kvp__local *m, uint32_t id, const struct kvp_str *key, const char *parent,
                  uint32_t plen, const uint8_t *tok, uint32_t ntokens, char *msg, size_t msglen)
{
    return kvp__replay_lin(kvp__meta_ns_by_id(m, id), key, parent, plen, tok, ntokens, msg, msglen);
}

static void rp_drop(struct kvp__local *m, uint32_t id)
{
    kvp__replay_drop(kvp__meta_ns_by_id(m, id));
}

static int rp_clear(struct kvp__local *m, uint32_t id, uint32_t rank, char *msg, size_t msglen)
{
    struct kvp_error err = {0};
    int rc = kvp_meta_clear(&kvp__meta_ns_by_id(m, id)->pub, rank == ALL_RANKS ? -1 : (int64_t)rank,
                            &err);
    if (rc == -ENOMEM)
        return rc;
    if (rc) {
        snprintf(msg, msglen, "CLEAR of rank %u, which is not initialized", rank);
        return -EUCLEAN;
    }
    return 0;
}

/* ---------------------------------------------------------------- snapshots */

static void lock_all(struct kvp__local *m)
{
    pthread_rwlock_wrlock(&m->ns_lock);
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all)
        pthread_mutex_lock(&ns->lock);
}

static void unlock_all(struct kvp__local *m)
{
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all)
        pthread_mutex_unlock(&ns->lock);
    pthread_rwlock_unlock(&m->ns_lock);
}

/*
 * What a snapshot reads, frozen with every lock held, for a snapshot that a
 * thread of this process writes while requests go on (KVP_SNAPSHOT_THREAD,
 * KVP_SNAPSHOT_MANUAL): per namespace its key count and ranks; per rank,
 * the owner and LRU link of each page in the rank's [bot, top). Copying those
 * 16 bytes a page is a sequential pass (about 5 ms per 1,000,000 pages
 * here), where encoding the records with the locks held would walk the LRU
 * in its own order and hash every record (bench/persist/README.md).
 *
 * The key entries the owners point at are not copied. An entry's length and
 * bytes never change while it exists, and from the copy on each namespace
 * keeps the entries it drops (kvp__meta_keep_keys) until the snapshot is
 * written, so no entry is freed or reused under the writer. Walking the
 * copy later therefore tells byte for byte what a walk of the live state
 * with the locks held would have told: the state at the snapshot's LSN.
 */
struct fz_page {
    const struct kvp__key *owner;
    uint32_t prev;
};
struct fz_rank {
    uint32_t id, num_pages, tail;
    const struct kvp__page *live; /* the rank's own pages (no copy), or NULL */
    const struct fz_page *pages;  /* the copy, or NULL */
    uint32_t base;                /* the page pages[0] copies */
};
struct fz_ns {
    const struct kvp__lns *ns; /* its id and names never change */
    uint64_t nkeys;
    uint32_t nranks;
    struct fz_rank *ranks; /* NULL: the namespace's own ranks (no copy) */
    int dropped;
    struct kvp__lintab lins; /* a copy of its lineages' table (lineage.c) */
};

static struct fz_rank live_rank(const struct kvp__rank *r)
{
    return (struct fz_rank){r->id, r->num_pages, r->lru.tail, r->pages, NULL, 0};
}

static uint32_t fz_prev(const struct fz_rank *r, uint32_t p)
{
    return r->pages ? r->pages[p - r->base].prev : r->live[p].prev;
}

static const struct kvp__key *fz_owner(const struct fz_rank *r, uint32_t p)
{
    return r->pages ? r->pages[p - r->base].owner : r->live[p].owner;
}

static size_t frozen_bytes(struct kvp__local *m, int unlocked)
{
    size_t b = 0;
    if (unlocked)
        pthread_rwlock_rdlock(&m->ns_lock);
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all) {
        if (unlocked)
            pthread_mutex_lock(&ns->lock);
        b += sizeof(struct fz_ns) + (size_t)ns->nranks * sizeof(struct fz_rank) +
             (ns->lins.n ? ns->lins.cap * sizeof(struct kvp__linent) : 0);
        for (uint32_t s = 0; s < ns->nranks; s++)
            if (ns->slots[s]->lru.tail != KVP_NONE)
                b += (size_t)(ns->slots[s]->top - ns->slots[s]->bot) * sizeof(struct fz_page);
        if (unlocked)
            pthread_mutex_unlock(&ns->lock);
    }
    if (unlocked)
        pthread_rwlock_unlock(&m->ns_lock);
    return b;
}

static void *frozen_take(struct kvp__frozen *fz, size_t bytes)
{
    void *r = fz->mem + fz->used; /* every piece is a multiple of 8 bytes */
    fz->used += bytes;
    return r;
}

static void freeze(struct kvp__local *m, struct kvp__frozen *fz)
{
    fz->used = 0;
    struct fz_ns *all = frozen_take(fz, m->ns_count * sizeof *all);
    fz->root = all;
    fz->n = 0;
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all) {
        struct fz_ns *v = &all[fz->n++];
        v->ns = ns;
        v->nkeys = ns->nkeys;
        v->nranks = ns->nranks;
        v->dropped = ns->dropped;
        v->lins = (struct kvp__lintab){0};
        if (ns->lins.n) { /* as the entries: the lineages it points at are kept */
            v->lins = ns->lins;
            v->lins.v = frozen_take(fz, ns->lins.cap * sizeof *v->lins.v);
            memcpy(v->lins.v, ns->lins.v, ns->lins.cap * sizeof *v->lins.v);
        }
        v->ranks = frozen_take(fz, (size_t)ns->nranks * sizeof *v->ranks);
        for (uint32_t s = 0; s < ns->nranks; s++) {
            const struct kvp__rank *r = ns->slots[s];
            v->ranks[s] = (struct fz_rank){r->id, r->num_pages, r->lru.tail, NULL, NULL, 0};
            if (r->lru.tail == KVP_NONE)
                continue; /* nothing held: nothing to copy */
            struct fz_page *c = frozen_take(fz, (size_t)(r->top - r->bot) * sizeof *c);
            for (uint32_t p = r->bot; p < r->top; p++)
                c[p - r->bot] = (struct fz_page){r->pages[p].owner, r->pages[p].prev};
            v->ranks[s].pages = c;
            v->ranks[s].base = r->bot;
        }
        kvp__meta_keep_keys(ns, 1);
    }
}

static uint64_t thaw(struct kvp__local *m, const struct kvp__frozen *fz)
{
    (void)m;
    const struct fz_ns *all = fz->root;
    uint64_t kept = 0;
    for (size_t i = 0; i < fz->n; i++) {
        struct kvp__lns *ns = (struct kvp__lns *)all[i].ns;
        pthread_mutex_lock(&ns->lock);
        kept += kvp__meta_keep_keys(ns, 0);
        pthread_mutex_unlock(&ns->lock);
    }
    return kept;
}

/* Reaches keys through the pages that hold them, never through the key
 * index: a forked child does not have the index's big tables
 * (MADV_DONTFORK, so that the server's inserts during a snapshot copy no
 * index pages). */
static void walk(struct kvp__local *m, const struct kvp__frozen *fz,
                 const struct kvp__persist_visit *vis, void *arg)
{
    const struct fz_ns *all = fz ? fz->root : NULL;
    const struct kvp__lns *live = m->ns_first;
    for (size_t i = 0; fz ? i < fz->n : live != NULL; i++) {
        struct fz_ns v = fz ? all[i] : (struct fz_ns){live, live->nkeys,   live->nranks,
                                                      NULL, live->dropped, live->lins};
        const struct kvp__lns *ns = v.ns;
        vis->ns(arg, ns->id, ns->deployment, ns->pool, v.nkeys, v.dropped);
        for (uint32_t s = 0; s < v.nranks; s++) {
            struct fz_rank r = v.ranks ? v.ranks[s] : live_rank(ns->slots[s]);
            vis->rank(arg, ns->id, r.id, r.num_pages);
        }
        for (uint32_t s = 0; s < v.nranks; s++) {
            struct fz_rank r = v.ranks ? v.ranks[s] : live_rank(ns->slots[s]);
            /* Least recent first: replay pushes each at the head. */
            for (uint32_t p = r.tail; p != KVP_NONE; p = fz_prev(&r, p)) {
                const struct kvp__key *k = fz_owner(&r, p);
                vis->hold(arg, ns->id, r.id, p, kvp__key_bytes(k), k->len);
                /* Told with each rank's page of the key. */
                const struct kvp__lin *l = kvp__lin_get(&v.lins, k);
                if (l)
                    vis->lin(arg, ns->id, r.id, kvp__key_bytes(k), k->len, l);
            }
        }
        if (!fz)
            live = live->next_all;
    }
}

static uint64_t catalog_bytes(struct kvp__local *m)
{
    uint64_t bytes = 0;
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all)
        bytes += KVP_JRNL_NS(strlen(ns->deployment), strlen(ns->pool)) +
                 (uint64_t)ns->nranks * KVP_JRNL_INIT + (ns->dropped ? KVP_JRNL_DROP : 0);
    return bytes;
}

static void catalog(struct kvp__local *m)
{
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all) {
        kvp__jrnl_ns(&ns->jrnl, ns->deployment, ns->pool);
        if (ns->dropped)
            kvp__jrnl_drop(&ns->jrnl);
        for (uint32_t s = 0; s < ns->nranks; s++)
            kvp__jrnl_init(&ns->jrnl, ns->slots[s]->id, ns->slots[s]->num_pages);
        kvp__jrnl_commit(&ns->jrnl);
    }
}

const struct kvp__persist_ops kvp__local_persist_ops = {
    .has_ns = rp_has_ns,
    .ns = rp_ns,
    .keys_hint = rp_keys_hint,
    .init = rp_init,
    .hold = rp_hold,
    .free = rp_free,
    .lin = rp_lin,
    .drop = rp_drop,
    .clear = rp_clear,
    .lock_all = lock_all,
    .unlock_all = unlock_all,
    .frozen_bytes = frozen_bytes,
    .freeze = freeze,
    .thaw = thaw,
    .walk = walk,
    .catalog_bytes = catalog_bytes,
    .catalog = catalog,
};
