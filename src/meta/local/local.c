/*
 * The in-process engine: the metadata state machine of protocol.md §1–3, the
 * backend of the mem: and file: locations (kvp__local_ops). Its callers are
 * the interface in src/meta/meta.c, which has checked every argument.
 *
 * Locking: the namespace registry has a rwlock that is only written when a
 * namespace is created; every operation on a namespace holds that
 * namespace's mutex for its whole duration, so each request is atomic.
 *
 * Cost: every operation is O(keys in the request); page allocation, release,
 * touch and eviction are O(1) apart from eviction skipping pages that are in
 * their read grace, returned by the same request or pinned (see evict()).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "meta/local/mem.h"
#include "util/clock.h"
#include "util/prefetch.h"
#include "util/seed.h"
#include "meta/local/meta_int.h"
#include "meta/local/persist.h"
#include "meta/rules.h"

#define set_err kvp__set_err

#define NS_BUCKETS 1024
#define MIN_KEY_BUCKETS 1024

static uint64_t default_clock(void *arg)
{
    (void)arg;
    return kvp__mono_ms();
}

static uint64_t now_ms(const struct kvp__local *m)
{
    return m->opts.clock(m->opts.clock_arg);
}

struct kvp__local *kvp__local_of(struct kvp_meta *m)
{
    return m->ops == &kvp__local_ops ? m->be : NULL;
}

static void lo_close(struct kvp_meta *front);

/* The identity of the data directory dir (its file IDENTITY), written now
 * when missing and the directory is writable (not readonly). NULL when it
 * has none: an older directory read-only, or one that could not be written
 * (logged; the owner records then compare locations). */
static char *dir_identity(const struct kvp__local *m, const char *dir)
{
    char path[4096], tmp[4128], id[KVP_IDENTITY_LEN + 1];
    snprintf(path, sizeof path, "%s/IDENTITY", dir);
    int rc = kvp__dir_identity(dir, id);
    if (rc == 0)
        return strdup(id);
    /* none readable (damaged): compared by location, never rewritten */
    if (rc != -ENOENT || m->opts.readonly || kvp__identity_new(id))
        return NULL;
    int fd;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int ok = fd >= 0 && write(fd, id, KVP_IDENTITY_LEN) == KVP_IDENTITY_LEN &&
             write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return NULL;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0)
        fsync(dfd), close(dfd);
    return strndup(id, KVP_IDENTITY_LEN);
}

/* where: the data directory (file:), or NULL (mem:); front->opts has it too. */
static int lo_open(struct kvp_meta *front, const char *where, struct kvp_error *err)
{
    struct kvp__local *m = calloc(1, sizeof *m);
    if (!m) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    m->front = front;
    m->opts = front->opts;
    m->opts.data_dir = where;
    front->be = m;
    if (!m->opts.clock)
        m->opts.clock = default_clock;
    m->ns_buckets = calloc(NS_BUCKETS, sizeof *m->ns_buckets);
    if (!m->ns_buckets) {
        free(m);
        front->be = NULL;
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    pthread_rwlock_init(&m->ns_lock, NULL);
    kvp__mempool_init(&m->pool);
    if (m->opts.data_dir) {
        int rc = kvp__persist_open(m, &kvp__local_persist_ops);
        if (rc) {
            if (rc == -EBUSY) /* the words of kvpage serve's log (wal.c) */
                set_err(err, rc, KVP_RULE_IO, -1, 0, 0,
                        "data directory %.160s is busy: in use by another kvpage process",
                        m->opts.data_dir);
            else
                set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot open the state in %.160s: %s",
                        m->opts.data_dir, kvp_strerror(rc));
            lo_close(front);
            return rc;
        }
        front->identity = dir_identity(m, m->opts.data_dir);
        kvp__pins_load(m);
    }
    /* mem: has none: its state ends with the handle, and a page file's
     * owner record of "mem:" compares the location, as before. */
    return 0;
}

/* The later of two log positions. */
static uint64_t later(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* ---------------------------------------------------------------- lists */

static void list_init(struct kvp__list *l)
{
    l->head = l->tail = KVP_NONE;
    l->count = 0;
}

static void list_push_head(struct kvp__page *pg, struct kvp__list *l, uint32_t p)
{
    pg[p].prev = KVP_NONE;
    pg[p].next = l->head;
    if (l->head != KVP_NONE)
        pg[l->head].prev = p;
    else
        l->tail = p;
    l->head = p;
    l->count++;
}

static void list_remove(struct kvp__page *pg, struct kvp__list *l, uint32_t p)
{
    uint32_t pr = pg[p].prev, nx = pg[p].next;
    if (pr != KVP_NONE)
        pg[pr].next = nx;
    else
        l->head = nx;
    if (nx != KVP_NONE)
        pg[nx].prev = pr;
    else
        l->tail = pr;
    pg[p].prev = pg[p].next = KVP_NONE;
    l->count--;
}

/* ---------------------------------------------------------------- keys */

static int check_key(const struct kvp_str *k)
{
    if (k->len == 0)
        return 1;
    if (k->len > KVP_MAX_KEY_LEN)
        return 2;
    if (memchr(k->ptr, '\0', k->len))
        return 3;
    return 0;
}

static uint64_t key_hash(const struct kvp_str *k)
{
    return XXH3_64bits_withSeed(k->ptr, k->len, kvp__hash_seed()); /* util/seed.h: why */
}

/*
 * The key index is a chained hash table that grows by doubling. The move to
 * the bigger table is incremental (each insertion moves a few old buckets),
 * so no request ever waits for millions of keys to be rehashed; until it is
 * done, a lookup also searches the old table's buckets not yet moved. An
 * entry keeps the low 32 bits of its hash, which are its bucket bits (moving
 * it needs neither its key bytes nor a new hash), and a 16-bit tag from the
 * top bits. A bucket keeps the tags of its chain's first entries and the
 * chain's length, so a lookup of an absent key, which is every key of a
 * batch_allocate and of a first confirm_write, usually reads no entry at all:
 * only its bucket.
 */
#define MIGRATE_STEP 64
#define MAX_KEY_BUCKETS (1ull << 32)
#define CHAIN_UNCOUNTED UINT16_MAX /* bucket n: the chain is at least this long */

static uint16_t key_tag(uint64_t h)
{
    return (uint16_t)(h >> 48) | 1;
}

static struct kvp__bucket *bucket_of(struct kvp__bucket *t, uint64_t nb, uint64_t h)
{
    return &t[(uint32_t)h & (nb - 1)];
}

static void bucket_push(struct kvp__bucket *b, struct kvp__key *e)
{
    e->next = b->head;
    b->head = e;
    for (unsigned i = KVP_BUCKET_TAGS - 1; i > 0; i--)
        b->tag[i] = b->tag[i - 1];
    b->tag[0] = e->tag;
    if (b->n != CHAIN_UNCOUNTED)
        b->n++;
}

/* Tags and length of bucket b after the entry at place pos of its chain was unlinked. */
static void bucket_unlinked(struct kvp__bucket *b, unsigned pos)
{
    uint64_t n = 0;
    if (b->n == CHAIN_UNCOUNTED) { /* count it again, and redo the tags */
        for (struct kvp__key *e = b->head; e; e = e->next, n++)
            if (n < KVP_BUCKET_TAGS)
                b->tag[n] = e->tag;
        b->n = n < CHAIN_UNCOUNTED ? (uint16_t)n : CHAIN_UNCOUNTED;
        for (; n < KVP_BUCKET_TAGS; n++)
            b->tag[n] = 0;
        return;
    }
    b->n--;
    if (pos >= KVP_BUCKET_TAGS)
        return;
    for (unsigned i = pos; i + 1 < KVP_BUCKET_TAGS; i++)
        b->tag[i] = b->tag[i + 1];
    uint16_t last = 0;
    if (b->n >= KVP_BUCKET_TAGS) {
        struct kvp__key *e = b->head;
        for (unsigned i = 0; i + 1 < KVP_BUCKET_TAGS; i++)
            e = e->next;
        last = e->tag;
    }
    b->tag[KVP_BUCKET_TAGS - 1] = last;
}

/* How many entries of bucket b's chain a search for tag t must look at: in a
 * chain of at most KVP_BUCKET_TAGS entries, up to the last matching tag
 * (usually none matches, and no entry is read); else the whole chain. */
static uint64_t bucket_search_end(const struct kvp__bucket *b, uint16_t t)
{
    if (b->n == CHAIN_UNCOUNTED)
        return UINT64_MAX;
    if (b->n > KVP_BUCKET_TAGS)
        return b->n;
    uint64_t end = 0;
    for (unsigned i = 0; i < b->n; i++)
        if (b->tag[i] == t)
            end = i + 1;
    return end;
}

/* The link to key k's entry in bucket b, or NULL when it is not there. */
static struct kvp__key **chain_find(struct kvp__bucket *b, const struct kvp_str *k, uint64_t h)
{
    uint16_t t = key_tag(h);
    uint64_t end = bucket_search_end(b, t);
    struct kvp__key **pp = &b->head;
    for (uint64_t i = 0; i < end && *pp; i++, pp = &(*pp)->next) {
        struct kvp__key *e = *pp;
        if ((i < KVP_BUCKET_TAGS ? b->tag[i] : e->tag) != t)
            continue;
        if (e->hash == (uint32_t)h && e->len == k->len &&
            !memcmp(kvp__key_bytes(e), k->ptr, k->len))
            return pp;
    }
    return NULL;
}

/* While the index moves: the old table's bucket for hash bits h when it has
 * not been moved yet (an entry of those bits may still be there), else NULL. */
static struct kvp__bucket *old_bucket(const struct kvp__lns *ns, uint64_t h)
{
    if (!ns->old)
        return NULL;
    uint64_t ob = (uint32_t)h & (ns->nold - 1);
    return ob >= ns->mpos ? &ns->old[ob] : NULL;
}

/* The link to the key's entry, or NULL when the key is absent. */
static struct kvp__key **key_slot(struct kvp__lns *ns, const struct kvp_str *k, uint64_t h)
{
    struct kvp__bucket *ob = old_bucket(ns, h);
    struct kvp__key **pp = ob ? chain_find(ob, k, h) : NULL;
    return pp ? pp : chain_find(bucket_of(ns->buckets, ns->nbuckets, h), k, h);
}

static struct kvp__key *key_find_h(struct kvp__lns *ns, const struct kvp_str *k, uint64_t h)
{
    if (!ns->nkeys)
        return NULL;
    struct kvp__key **pp = key_slot(ns, k, h);
    return pp ? *pp : NULL;
}

static struct kvp__key *key_find(struct kvp__lns *ns, const struct kvp_str *k)
{
    return key_find_h(ns, k, key_hash(k));
}

/*
 * Batches. A request's keys are hashed once, before the namespace lock.
 * They are not prefetched a window at a time: that code was in the tree
 * from 2026-11-30 but compiled to nothing (util/prefetch.h), and once it
 * ran it made 64-key lookups 4% slower at a 4-million-key index, the core
 * already overlapping the misses of independent lookups (bench/README.md,
 * "Evictions prefetched"). An eviction's misses depend on one another:
 * those are prefetched (evict_prefetch).
 */
#define KB_LOCAL 64 /* keys whose hashes and entries live on the stack */

struct kbatch {
    uint64_t *h;         /* hash of each key */
    struct kvp__key **e; /* entry of each key, filled by kb_find */
    uint64_t lh[KB_LOCAL];
    struct kvp__key *le[KB_LOCAL];
};

/* Hashes the n keys; -ENOMEM (err set) when their arrays cannot be had. */
static int kb_init(struct kbatch *kb, const struct kvp_str *keys, size_t n, struct kvp_error *err)
{
    kb->h = kb->lh;
    kb->e = kb->le;
    if (n > KB_LOCAL) {
        kb->h = malloc(n * sizeof *kb->h);
        kb->e = malloc(n * sizeof *kb->e);
        if (!kb->h || !kb->e) {
            free(kb->h);
            free(kb->e);
            kvp__err_oom(err, -ENOMEM);
            return -ENOMEM;
        }
    }
    for (size_t i = 0; i < n; i++)
        kb->h[i] = key_hash(&keys[i]);
    return 0;
}

static void kb_free(struct kbatch *kb)
{
    if (kb->h != kb->lh) {
        free(kb->h);
        free(kb->e);
    }
}

/* kb->e[i] = the entry of keys[i] or NULL, for every key. */
static void kb_find(struct kvp__lns *ns, struct kbatch *kb, const struct kvp_str *keys, size_t n)
{
    if (!ns->nkeys) {
        memset(kb->e, 0, n * sizeof *kb->e);
        return;
    }
    for (size_t i = 0; i < n; i++)
        kb->e[i] = key_find_h(ns, &keys[i], kb->h[i]);
}

/* Bytes of an entry with cap slots and a key of len bytes. */
static size_t key_size(uint32_t cap, size_t len)
{
    /* offsetof, not sizeof: the struct's tail padding is not needed */
    return offsetof(struct kvp__key, pages) + cap * sizeof(uint32_t) + len;
}

static void key_free(struct kvp__lns *ns, struct kvp__key *e)
{
    if (ns->keep_keys) {    /* a snapshot thread may still read it: see kvp__meta_keep_keys */
        e->next = ns->kept; /* unlinked from its chain: the link is free */
        ns->kept = e;
        ns->nkept++;
        return;
    }
    kvp__slab_free(&ns->keys_mem, e, key_size(e->cap, e->len));
}

uint64_t kvp__meta_keep_keys(struct kvp__lns *ns, int keep)
{
    uint64_t n = ns->nkept;
    ns->keep_keys = keep;
    if (!keep) {
        for (struct kvp__key *e = ns->kept, *nx; e; e = nx) {
            nx = e->next;
            kvp__slab_free(&ns->keys_mem, e, key_size(e->cap, e->len));
        }
        ns->kept = NULL;
        ns->nkept = 0;
        for (struct kvp__lin *l = ns->kept_lin, *nx; l; l = nx) {
            nx = l->next_kept;
            free(l);
        }
        ns->kept_lin = NULL;
    }
    return n;
}

static uint32_t key_page(const struct kvp__key *e, uint32_t slot)
{
    return (e && slot < e->cap) ? e->pages[slot] : KVP_NONE;
}

/* Moves up to n buckets of the old table into the current one. */
static void migrate(struct kvp__lns *ns, uint64_t n)
{
    if (ns->old) /* the step's first entries are scattered: fetch them together */
        for (uint64_t b = ns->mpos; b < ns->nold && b < ns->mpos + n; b++)
            if (ns->old[b].head)
                __builtin_prefetch(ns->old[b].head);
    while (ns->old && n--) {
        struct kvp__bucket *ob = &ns->old[ns->mpos];
        for (struct kvp__key *e = ob->head, *nx; e; e = nx) {
            nx = e->next;
            bucket_push(bucket_of(ns->buckets, ns->nbuckets, e->hash), e);
        }
        memset(ob, 0, sizeof *ob);
        if (++ns->mpos == ns->nold) {
            kvp__big_free(ns->old, ns->nold * sizeof *ns->old);
            ns->old = NULL;
            ns->nold = ns->mpos = 0;
        }
    }
}

/* Starts moving to a table of nb buckets (a power of two). */
static int start_resize(struct kvp__lns *ns, uint64_t nb)
{
    migrate(ns, UINT64_MAX); /* at most one move at a time */
    if (nb > MAX_KEY_BUCKETS || nb <= ns->nbuckets)
        return -ENOSPC;
    struct kvp__bucket *b = NULL;
    if (ns->grown && ns->ngrown == nb)
        b = ns->grown; /* backed, or being backed: populating changes no byte */
    else
        kvp__big_free(ns->grown, ns->ngrown * sizeof *ns->grown);
    ns->grown = NULL;
    if (!b && !(b = kvp__big_zalloc(nb * sizeof *b)))
        return -ENOMEM;
    kvp__big_nofork(b, nb * sizeof *b, 1); /* the snapshot child never reads the index */
    ns->old = ns->buckets;
    ns->nold = ns->nbuckets;
    ns->mpos = 0;
    ns->buckets = b;
    ns->nbuckets = nb;
    return 0;
}

/*
 * The index doubles when it holds as many keys as buckets. A big new table is
 * backed by the background thread before the move starts: a fresh 64 MiB
 * table touched at random by the first requests after the resize stalled
 * them for up to 190 ms. Meanwhile the current table takes more keys, up to
 * twice as many as buckets, after which the move starts regardless.
 */
static void grow_index(struct kvp__lns *ns)
{
    uint64_t nb = ns->nbuckets * 2;
    if (nb > MAX_KEY_BUCKETS)
        return; /* chains just get longer */
    if (nb * sizeof *ns->buckets >= KVP_PIECE_SIZE && !ns->grown) {
        /* A move that started before its table was backed (below) left that
         * table's job queued, and a queued job's fields belong to the
         * background thread (mem.h): the next table waits for it while the
         * current one may still take keys. */
        if (atomic_load(&ns->grow_job.state) == KVP_POPULATE_QUEUED) {
            if (ns->nkeys < 2 * ns->nbuckets)
                return;
        } else if ((ns->grown = kvp__big_zalloc(nb * sizeof *ns->grown)) != NULL) {
            kvp__big_nofork(ns->grown, nb * sizeof *ns->grown, 1);
            ns->ngrown = nb;
            ns->grow_job.addr = ns->grown;
            ns->grow_job.len = nb * sizeof *ns->grown;
            kvp__mempool_populate(&ns->meta->pool, &ns->grow_job);
        }
    }
    if (!ns->grown || atomic_load(&ns->grow_job.state) != KVP_POPULATE_QUEUED ||
        ns->nkeys >= 2 * ns->nbuckets)
        start_resize(ns, nb); /* on failure chains just get longer */
}

/* Returns the key's entry, creating it with room for `slot`. NULL: out of memory. */
static struct kvp__key *key_get_h(struct kvp__lns *ns, const struct kvp_str *k, uint64_t h,
                                  uint32_t slot)
{
    if (ns->old)
        migrate(ns, MIGRATE_STEP);
    else if (ns->nkeys + 1 > ns->nbuckets)
        grow_index(ns);
    struct kvp__key **pp = key_slot(ns, k, h);
    struct kvp__key *e = pp ? *pp : NULL;
    if (e && slot < e->cap)
        return e;
    uint16_t cap = (uint16_t)(ns->nranks > slot + 1 ? ns->nranks : slot + 1);
    struct kvp__key *ne = kvp__slab_alloc(&ns->keys_mem, key_size(cap, k->len));
    if (!ne)
        return NULL;
    if (!e) {
        /* Linked at the head of its bucket, not at the end of the chain
         * where the search stopped: writing into an older entry would copy
         * its page while a snapshot child shares it (a copy-on-write fault
         * per insertion, across all of the entries' memory). */
        ne->hash = (uint32_t)h;
        ne->len = (uint16_t)k->len;
        ne->nheld = 0;
        ne->tag = key_tag(h);
        ne->cap = cap;
        for (uint32_t i = 0; i < cap; i++)
            ne->pages[i] = KVP_NONE;
        memcpy((char *)(ne->pages + cap), k->ptr, k->len);
        bucket_push(bucket_of(ns->buckets, ns->nbuckets, h), ne);
        ns->nkeys++;
        kvp__hx_note(ns, NULL, ne);
        return ne;
    }
    /* Grow an existing entry: copy, then repoint the chain and its pages' owners. */
    memcpy(ne, e, offsetof(struct kvp__key, pages));
    ne->cap = cap;
    for (uint32_t i = 0; i < cap; i++)
        ne->pages[i] = i < e->cap ? e->pages[i] : KVP_NONE;
    memcpy((char *)(ne->pages + cap), kvp__key_bytes(e), e->len);
    *pp = ne;
    kvp__hx_note(ns, e, ne);
    kvp__lin_note(ns, e, ne);
    for (uint32_t i = 0; i < e->cap; i++)
        if (e->pages[i] != KVP_NONE)
            ns->slots[i]->pages[e->pages[i]].owner = ne;
    key_free(ns, e);
    return ne;
}

static struct kvp__key *key_get(struct kvp__lns *ns, const struct kvp_str *k, uint32_t slot)
{
    return key_get_h(ns, k, key_hash(k), slot);
}

/* The link to entry e in bucket b's chain, or NULL; *pos: its place. */
static struct kvp__key **chain_link(struct kvp__bucket *b, const struct kvp__key *e, unsigned *pos)
{
    unsigned i = 0;
    for (struct kvp__key **pp = &b->head; *pp; pp = &(*pp)->next, i++) {
        if (*pp == e) {
            *pos = i;
            return pp;
        }
    }
    return NULL;
}

/* Takes entry e out of the index. Its bucket is found from the hash bits it
 * keeps and it is found by its address: the key is neither hashed again nor
 * compared (an eviction's cache misses are the entry, its bucket and the
 * entries before it in the chain). */
static void key_unlink(struct kvp__lns *ns, struct kvp__key *e)
{
    struct kvp__bucket *b = old_bucket(ns, e->hash);
    unsigned pos = 0;
    struct kvp__key **pp = b ? chain_link(b, e, &pos) : NULL;
    if (!pp)
        pp = chain_link(b = bucket_of(ns->buckets, ns->nbuckets, e->hash), e, &pos);
    assert(pp && *pp == e);
    *pp = e->next;
    bucket_unlinked(b, pos);
    ns->nkeys--;
    kvp__hx_note(ns, e, NULL);
    kvp__lin_note(ns, e, NULL);
    key_free(ns, e);
}

/* ---------------------------------------------------------------- pages */

/* Page p is outside the untouched range: on the free list when FREE. */
static int page_touched(const struct kvp__rank *r, uint32_t p)
{
    return p < r->hwm || p >= r->ceil;
}

/* Puts page p, already unlinked from any list, into FREE: at the back of
 * the free pages (the free list's head), as the references append it. */
static void page_to_free(struct kvp__rank *r, uint32_t p)
{
    struct kvp__page *pg = &r->pages[p];
    pg->state = KVP_PFREE;
    pg->owner = NULL;
    pg->t = 0;
    /* Pages of the untouched range are found by its scans. */
    if (page_touched(r, p))
        list_push_head(r->pages, &r->free, p);
    r->nfree++;
}

/* Unlinks FREE page p from wherever it is so that it can change state. */
static void page_take_free(struct kvp__rank *r, uint32_t p)
{
    if (page_touched(r, p))
        list_remove(r->pages, &r->free, p);
    r->nfree--;
}

/* Page p, already unlinked from its list, becomes HELD by key e, most recent in the LRU. */
static void page_hold(struct kvp__rank *r, uint32_t p, struct kvp__key *e)
{
    struct kvp__page *pg = &r->pages[p];
    pg->state = KVP_PHELD;
    pg->owner = e;
    pg->t = 0;
    if (p >= r->top)
        r->top = p + 1;
    if (p < r->bot)
        r->bot = p;
    e->pages[r->slot] = p;
    e->nheld++;
    list_push_head(r->pages, &r->lru, p);
}

/* HELD page p loses its key (eviction, delete, clear); p is unlinked from the LRU. */
static void page_unhold(struct kvp__lns *ns, struct kvp__rank *r, uint32_t p)
{
    struct kvp__key *e = r->pages[p].owner;
    list_remove(r->pages, &r->lru, p);
    e->pages[r->slot] = KVP_NONE;
    if (--e->nheld == 0)
        key_unlink(ns, e);
    r->pages[p].owner = NULL;
}

/* Tells the watcher (kvp_meta_watch) that key e gets or loses its page on
 * rank r; under the namespace's lock, in the order of the changes. A page
 * stored is told with the key's lineage as kept. */
static void tell_fn(kvp_meta_change_fn fn, void *arg, struct kvp__lns *ns,
                    const struct kvp__rank *r, const struct kvp__key *e, int kind)
{
    struct kvp_meta_change c = {.kind = kind,
                                .ns = &ns->pub,
                                .deployment = ns->deployment,
                                .pool = ns->pool,
                                .rank = r->id,
                                .key = kvp__key_bytes(e),
                                .len = e->len,
                                .size = sizeof c};
    const struct kvp__lin *l = kind == KVP_CHANGE_STORED ? kvp__lin_get(&ns->lins, e) : NULL;
    if (l && l->plen) {
        c.parent = kvp__lin_parent(l);
        c.parent_len = l->plen;
    }
    if (l && l->ntokens) {
        c.token_ids = l->tok;
        c.ntokens = l->ntokens;
    }
    fn(&c, arg);
}

static inline void tell(struct kvp__lns *ns, const struct kvp__rank *r, const struct kvp__key *e,
                        int kind)
{
    struct kvp__local *m = ns->meta;
    if (m->watch)
        tell_fn(m->watch, m->watch_arg, ns, r, e, kind);
}

/* The end of an operation that may change pages, before the namespace's lock
 * is released: the watcher hears it (a change of NULL) and may hand on what
 * it was told in one piece; then the log's records are appended (returns
 * kvp__jrnl_commit's position). */
static uint64_t op_done(struct kvp__lns *ns)
{
    struct kvp__local *m = ns->meta;
    if (m->watch)
        m->watch(NULL, m->watch_arg);
    return kvp__jrnl_commit(&ns->jrnl);
}

/* Every held page of the namespace, oldest first per rank, to fn. */
static void tell_all(kvp_meta_change_fn fn, void *arg, struct kvp__lns *ns, int kind)
{
    for (uint32_t i = 0; i < ns->nranks; i++) {
        const struct kvp__rank *r = ns->by_id[i];
        for (uint32_t p = r->lru.tail; p != KVP_NONE; p = r->pages[p].prev)
            tell_fn(fn, arg, ns, r, r->pages[p].owner, kind);
    }
}

static void touch(struct kvp__rank *r, uint32_t p)
{
    list_remove(r->pages, &r->lru, p);
    list_push_head(r->pages, &r->lru, p);
}

/* Reservations whose lease ran out go back to FREE. FIFO order = deadline order. */
static void expire(struct kvp__rank *r, uint64_t now)
{
    while (r->reserved.tail != KVP_NONE && r->pages[r->reserved.tail].t <= now) {
        uint32_t p = r->reserved.tail;
        list_remove(r->pages, &r->reserved, p);
        page_to_free(r, p);
        r->expired++;
    }
}

/* Pages whose slots fill one 2 MiB piece of a page array. */
#define PAGES_PER_PIECE (KVP_PIECE_SIZE / sizeof(struct kvp__page))

/* Has the background thread back the pages [from, to) of the page array
 * (at most one piece), one piece ahead of the untouched range's scan, so
 * that handing out never-used pages does not wait for fresh memory. */
static void populate_ahead(struct kvp__local *m, struct kvp__rank *r, uint64_t from, uint64_t to)
{
    if (from >= to || atomic_load(&r->ahead.state) == KVP_POPULATE_QUEUED)
        return;
    r->ahead.addr = &r->pages[from];
    r->ahead.len = (to - from) * sizeof *r->pages;
    kvp__mempool_populate(&m->pool, &r->ahead);
}

/* The lowest FREE page of the untouched range, unlinked, or KVP_NONE. */
static uint32_t take_lowest_untouched(struct kvp__local *m, struct kvp__rank *r)
{
    while (r->hwm < r->ceil) {
        uint32_t p = r->hwm++;
        if (p % PAGES_PER_PIECE == 0) {
            uint64_t from = (uint64_t)p + PAGES_PER_PIECE;
            populate_ahead(m, r, from,
                           from + PAGES_PER_PIECE < r->ceil ? from + PAGES_PER_PIECE : r->ceil);
        }
        if (r->pages[p].state == KVP_PFREE) {
            r->nfree--;
            return p;
        }
    }
    return KVP_NONE;
}

/* The highest FREE page of the untouched range, unlinked, or KVP_NONE. */
static uint32_t take_highest_untouched(struct kvp__local *m, struct kvp__rank *r)
{
    while (r->ceil > r->hwm) {
        uint32_t p = --r->ceil;
        if ((p + 1) % PAGES_PER_PIECE == 0 && p + 1 >= PAGES_PER_PIECE) {
            uint64_t to = (uint64_t)p + 1 - PAGES_PER_PIECE;
            populate_ahead(m, r, to > PAGES_PER_PIECE + r->hwm ? to - PAGES_PER_PIECE : r->hwm, to);
        }
        if (r->pages[p].state == KVP_PFREE) {
            r->nfree--;
            return p;
        }
    }
    return KVP_NONE;
}

/* A FREE page in the given order (enum kvp_page_order), unlinked, or KVP_NONE. */
static uint32_t take_free_page(struct kvp__local *m, struct kvp__rank *r, int order)
{
    uint32_t p;
    if (order == KVP_ORDER_VLLM) { /* the front: untouched ascending, then the oldest freed */
        if ((p = take_lowest_untouched(m, r)) != KVP_NONE || (p = r->free.tail) == KVP_NONE)
            return p;
    } else if ((p = r->free.head) == KVP_NONE) { /* the newest freed first */
        return order == KVP_ORDER_SGLANG ? take_highest_untouched(m, r)
                                         : take_lowest_untouched(m, r);
    }
    list_remove(r->pages, &r->free, p);
    r->nfree--;
    return p;
}

/*
 * Frees the least recently used HELD page that is neither in its read grace
 * nor returned by the current request nor pinned, and returns it unlinked, or
 * KVP_NONE. Walks from the LRU tail. A page in grace or pinned that it meets
 * moves to the head, so that the next walk does not meet it first again
 * (pins.c): the walk is long only when nearly every page is in grace or
 * pinned.
 */
static uint32_t evict(struct kvp__lns *ns, struct kvp__rank *r, uint64_t now)
{
    uint64_t left = r->lru.count; /* pinned pages moved to the head come round again */
    for (uint32_t p = r->lru.tail, prev; p != KVP_NONE && left--; p = prev) {
        struct kvp__page *pg = &r->pages[p];
        prev = pg->prev;
        if (pg->mark == r->stamp)
            return KVP_NONE; /* marked pages are the most recent: nothing older is left */
        /* A page in its read grace was looked up within read_grace_ms: a
         * use, as a touch is. Skipped in place, a burst of writes larger than
         * the rank within the grace made every eviction walk past all of
         * them (64 evictions past 16,384 pages in grace: 670 us a request,
         * bench/README.md). */
        if (pg->t > now || (ns->pins && kvp__pin_active(ns, pg->owner, now))) {
            touch(r, p);
            continue;
        }
        kvp__jrnl_free(&ns->jrnl, r->id, p);
        tell(ns, r, pg->owner, KVP_CHANGE_REMOVED);
        page_unhold(ns, r, p);
        r->evictions++;
        return p;
    }
    return KVP_NONE;
}

/*
 * Pulls into the cache what the next k evictions (at most EVICT_WINDOW) will
 * read, a step at a time for all of them: the key entries of the pages at
 * the LRU tail (their header and the key's last bytes, which a watcher
 * reads), then the buckets they are chained from, then the first two
 * entries of those chains (an evicted key is the oldest of its chain, so
 * key_unlink walks past every newer one). Each eviction's misses depend on
 * one another; fetched a step at a time, the misses of a window's
 * evictions overlap (bench/README.md, "Evictions prefetched"). Only reads:
 * evict() still decides, and a page it skips makes a prefetch useless, not
 * wrong.
 */
#define EVICT_WINDOW 16

static void evict_prefetch(const struct kvp__lns *ns, const struct kvp__rank *r, uint64_t k)
{
    const struct kvp__key *e[EVICT_WINDOW];
    const struct kvp__bucket *b[EVICT_WINDOW];
    size_t m = 0;
    for (uint32_t p = r->lru.tail; p != KVP_NONE && m < k && m < EVICT_WINDOW;
         p = r->pages[p].prev) {
        e[m] = r->pages[p].owner;
        __builtin_prefetch(e[m]);
        m++;
    }
    for (size_t i = 0; i < m; i++) {
        __builtin_prefetch(kvp__key_bytes(e[i]) + e[i]->len - 1);
        b[i] = old_bucket(ns, e[i]->hash); /* not moved yet: most likely there */
        if (!b[i])
            b[i] = bucket_of(ns->buckets, ns->nbuckets, e[i]->hash);
        __builtin_prefetch(b[i]);
    }
    const struct kvp__key *x[EVICT_WINDOW];
    for (size_t i = 0; i < m; i++) {
        x[i] = b[i]->head != e[i] ? b[i]->head : NULL;
        if (x[i])
            __builtin_prefetch(x[i]);
    }
    for (size_t i = 0; i < m; i++)
        if (x[i] && x[i]->next && x[i]->next != e[i])
            __builtin_prefetch(x[i]->next);
    kvp__prefetched();
}

static void page_reserve(struct kvp__local *m, struct kvp__rank *r, uint32_t p, uint64_t now)
{
    struct kvp__page *pg = &r->pages[p];
    pg->state = KVP_PRESERVED;
    pg->owner = NULL;
    pg->t = now + m->opts.lease_ms;
    /* Lease deadlines grow with time, so pushing at the head keeps the tail oldest. */
    list_push_head(r->pages, &r->reserved, p);
}

/* ---------------------------------------------------------------- ranks */

static struct kvp__rank *rank_find(struct kvp__lns *ns, uint32_t id)
{
    uint32_t lo = 0, hi = ns->nranks;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ns->by_id[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < ns->nranks && ns->by_id[lo]->id == id) ? ns->by_id[lo] : NULL;
}

/*
 * Page arrays are reserved, not committed: a rank of 2^31 pages costs no
 * memory until its pages are used, and zeroed anonymous memory is all FREE.
 */
static struct kvp__page *pages_alloc(uint32_t num_pages)
{
    void *p = mmap(NULL, (size_t)num_pages * sizeof(struct kvp__page), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    kvp__big_hint(p, (size_t)num_pages * sizeof(struct kvp__page));
    return p;
}

static void pages_free(struct kvp__page *pg, uint32_t num_pages)
{
    if (pg)
        munmap(pg, (size_t)num_pages * sizeof *pg);
}

/* Installs a fresh page array (all FREE). */
static void rank_set_pages(struct kvp__rank *r, struct kvp__page *pg, uint32_t num_pages)
{
    pages_free(r->pages, r->num_pages);
    r->pages = pg;
    r->num_pages = num_pages;
    r->hwm = 0;
    r->ceil = num_pages;
    r->bot = num_pages;
    r->top = 0;
    r->nfree = num_pages;
    list_init(&r->free);
    list_init(&r->reserved);
    list_init(&r->lru);
}

static int rank_reset_pages(struct kvp__rank *r, uint32_t num_pages)
{
    struct kvp__page *pg = pages_alloc(num_pages);
    if (!pg)
        return -ENOMEM;
    rank_set_pages(r, pg, num_pages);
    return 0;
}

/* Drops every key's page on r and every reservation: all pages FREE. */
static int rank_clear(struct kvp__lns *ns, struct kvp__rank *r)
{
    struct kvp__page *pg = pages_alloc(r->num_pages);
    if (!pg)
        return -ENOMEM;
    while (r->lru.tail != KVP_NONE) {
        tell(ns, r, r->pages[r->lru.tail].owner, KVP_CHANGE_REMOVED);
        page_unhold(ns, r, r->lru.tail);
    }
    rank_set_pages(r, pg, r->num_pages);
    return 0;
}

static int rank_lookup_err(struct kvp__lns *ns, uint32_t id, struct kvp__rank **out,
                           struct kvp_error *err)
{
    *out = rank_find(ns, id);
    if (*out)
        return 0;
    return kvp__err_rank_not_init(err, id);
}

/* ---------------------------------------------------------------- namespaces */

static uint64_t ns_hash(const char *d, size_t dl, const char *p, size_t pl)
{
    return XXH3_64bits_withSeed(p, pl, XXH3_64bits_withSeed(d, dl, kvp__hash_seed()));
}

static struct kvp__lns *ns_find_locked(struct kvp__local *m, uint64_t h, const char *d, size_t dl,
                                       const char *p, size_t pl)
{
    for (struct kvp__lns *ns = m->ns_buckets[h % NS_BUCKETS]; ns; ns = ns->next)
        if (strlen(ns->deployment) == dl && !memcmp(ns->deployment, d, dl) &&
            strlen(ns->pool) == pl && !memcmp(ns->pool, p, pl))
            return ns;
    return NULL;
}

static int lo_ns(struct kvp_meta *front, const char *deployment, size_t dlen, const char *pool,
                 size_t plen, int create, struct kvp_ns **out, uint64_t *ticket,
                 struct kvp_error *err)
{
    struct kvp__local *m = front->be;
    *out = NULL;
    uint64_t h = ns_hash(deployment, dlen, pool, plen);
    pthread_rwlock_rdlock(&m->ns_lock);
    struct kvp__lns *ns = ns_find_locked(m, h, deployment, dlen, pool, plen);
    pthread_rwlock_unlock(&m->ns_lock);
    if (ns && !create && __atomic_load_n(&ns->dropped, __ATOMIC_ACQUIRE))
        ns = NULL; /* dropped: found again only to be created */
    if (ns || !create) {
        *out = ns ? &ns->pub : NULL;
        return ns ? 0 : -ENOENT;
    }
    pthread_rwlock_wrlock(&m->ns_lock);
    ns = ns_find_locked(m, h, deployment, dlen, pool, plen);
    uint64_t room = KVP_JRNL_NS(dlen, plen);
    int rc;
    if (!ns && (rc = kvp__jrnl_space(m, room, 0, err)) != 0) {
        pthread_rwlock_unlock(&m->ns_lock);
        return rc; /* no room in the log: no namespace */
    }
    if (!ns) {
        ns = calloc(1, sizeof *ns);
        if (ns) {
            ns->deployment = strndup(deployment, dlen);
            ns->pool = strndup(pool, plen);
            ns->buckets = kvp__big_zalloc(MIN_KEY_BUCKETS * sizeof *ns->buckets);
            ns->nbuckets = MIN_KEY_BUCKETS;
        }
        struct kvp__lns **by_id = NULL;
        if (ns && (m->ns_count & (m->ns_count - 1)) == 0) { /* grow at powers of two */
            by_id = realloc(m->ns_by_id, (m->ns_count ? m->ns_count * 2 : 1) * sizeof *by_id);
            if (by_id)
                m->ns_by_id = by_id;
        } else {
            by_id = m->ns_by_id;
        }
        if (!ns || !ns->deployment || !ns->pool || !ns->buckets || !by_id) {
            if (ns) {
                free(ns->deployment);
                free(ns->pool);
                kvp__big_free(ns->buckets, MIN_KEY_BUCKETS * sizeof *ns->buckets);
                free(ns);
            }
            kvp__jrnl_unspace(m, room);
            pthread_rwlock_unlock(&m->ns_lock);
            kvp__err_oom(err, -ENOMEM);
            return -ENOMEM;
        }
        ns->meta = m;
        ns->pub.meta = front;
        ns->keys_mem.pool = &m->pool;
        ns->id = (uint32_t)m->ns_count;
        m->ns_by_id[ns->id] = ns;
        kvp__jrnl_start(&ns->jrnl, &m->persist, ns->id);
        *ticket = kvp__jrnl_ns(&ns->jrnl, ns->deployment, ns->pool);
        kvp__jrnl_unspace(m, room);
        pthread_mutex_init(&ns->lock, NULL);
        ns->next = m->ns_buckets[h % NS_BUCKETS];
        m->ns_buckets[h % NS_BUCKETS] = ns;
        if (m->ns_last)
            m->ns_last->next_all = ns;
        else
            m->ns_first = ns;
        m->ns_last = ns;
        m->ns_count++;
    }
    pthread_rwlock_unlock(&m->ns_lock);
    *out = &ns->pub;
    return 0;
}

/* Drops every key entry of the namespace (a clear of all ranks, or close).
 * While a snapshot thread encodes from its copy (keep_keys), the entries go
 * to the kept list like any other dropped entry and the slab stays. */
static void free_all_keys(struct kvp__lns *ns)
{
    kvp__hx_free(ns); /* the next query by hashes builds it again */
    kvp__lin_drop_all(ns);
    migrate(ns, UINT64_MAX);
    for (uint64_t i = 0; i < ns->nbuckets; i++) {
        struct kvp__key *e = ns->buckets[i].head, *nx;
        for (; e; e = nx) {
            nx = e->next;
            key_free(ns, e); /* frees the big ones, kept in no chunk */
        }
        memset(&ns->buckets[i], 0, sizeof ns->buckets[i]);
    }
    ns->nkeys = 0;
    if (!ns->keep_keys)
        kvp__slab_destroy(&ns->keys_mem);
}

static void lo_close(struct kvp_meta *front)
{
    struct kvp__local *m = front->be;
    if (!m)
        return;
    kvp__persist_close(m);
    kvp__mempool_destroy(&m->pool); /* its thread may be writing into namespaces */
    struct kvp__lns *ns = m->ns_first, *nx;
    for (; ns; ns = nx) {
        nx = ns->next_all;
        kvp__meta_keep_keys(ns, 0); /* no snapshot runs any more: the kept ones go */
        free_all_keys(ns);
        for (uint32_t i = 0; i < ns->nranks; i++) {
            pages_free(ns->slots[i]->pages, ns->slots[i]->num_pages);
            free(ns->slots[i]);
        }
        for (struct kvp__rank *r = ns->dead, *nd; r; r = nd) { /* the pool is stopped */
            nd = r->next_dead;
            free(r);
        }
        free(ns->slots);
        free(ns->by_id);
        kvp__big_free(ns->buckets, ns->nbuckets * sizeof *ns->buckets);
        kvp__big_free(ns->old, ns->nold * sizeof *ns->old);
        kvp__big_free(ns->grown, ns->ngrown * sizeof *ns->grown);
        kvp__slab_destroy(&ns->keys_mem);
        free(ns->deployment);
        free(ns->pool);
        free(ns->jrnl.buf);
        kvp__pins_free(ns);
        pthread_mutex_destroy(&ns->lock);
        free(ns);
    }
    free(m->ns_buckets);
    free(m->ns_by_id);
    pthread_rwlock_destroy(&m->ns_lock);
    free(m);
    front->be = NULL;
}

static size_t lo_nranks(struct kvp_ns *pub)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    pthread_mutex_lock(&ns->lock);
    size_t n = ns->nranks;
    pthread_mutex_unlock(&ns->lock);
    return n;
}

/* ---------------------------------------------------------------- operations */

static int rank_create(struct kvp__lns *ns, uint32_t id, uint32_t num_pages, struct kvp__rank **out)
{
    if (ns->nranks >= KVP_MAX_RANKS_PER_NS)
        return -ENOSPC;
    if (ns->nranks == ns->cap_ranks) {
        uint32_t cap = ns->cap_ranks ? ns->cap_ranks * 2 : 8;
        struct kvp__rank **s = realloc(ns->slots, cap * sizeof *s);
        if (!s)
            return -ENOMEM;
        ns->slots = s;
        struct kvp__rank **b = realloc(ns->by_id, cap * sizeof *b);
        if (!b)
            return -ENOMEM;
        ns->by_id = b;
        ns->cap_ranks = cap;
    }
    struct kvp__rank *r = calloc(1, sizeof *r);
    if (!r || rank_reset_pages(r, num_pages) != 0) {
        free(r);
        return -ENOMEM;
    }
    r->id = id;
    r->slot = ns->nranks;
    r->stamp = 1;
    ns->slots[ns->nranks] = r;
    uint32_t i = ns->nranks;
    while (i > 0 && ns->by_id[i - 1]->id > id) {
        ns->by_id[i] = ns->by_id[i - 1];
        i--;
    }
    ns->by_id[i] = r;
    ns->nranks++;
    *out = r;
    return 0;
}

static int lo_init_rank(struct kvp_ns *pub, uint32_t rank, uint32_t num_pages, uint64_t *ticket,
                        struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc = 0;
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *r = rank_find(ns, rank);
    /* Even a repeat that changes nothing: it would acknowledge a rank whose
     * INIT the log may have failed to write. */
    if ((rc = kvp__jrnl_reserve(&ns->jrnl, KVP_JRNL_INIT, 0, err)) != 0) {
        /* no room in the log: nothing changes */
    } else if (!r) {
        rc = rank_create(ns, rank, num_pages, &r);
        if (!rc) {
            kvp__jrnl_init(&ns->jrnl, rank, num_pages); /* also what brings a dropped one back */
            __atomic_store_n(&ns->dropped, 0, __ATOMIC_RELEASE);
        }
        if (rc == -ENOSPC)
            kvp__err_too_many_ranks(err, rc, ns->nranks, KVP_MAX_RANKS_PER_NS);
        else if (rc)
            kvp__err_oom(err, rc);
    } else if (r->num_pages != num_pages) {
        expire(r, now_ms(ns->meta));
        if (r->lru.count || r->reserved.count) {
            rc = -EEXIST;
            kvp__err_resize_held(err, rank, r->num_pages, num_pages);
        } else if ((rc = rank_reset_pages(r, num_pages)) != 0) {
            kvp__err_oom(err, rc);
        } else {
            kvp__jrnl_init(&ns->jrnl, rank, num_pages);
        }
    }
    *ticket = later(*ticket, op_done(ns)); /* the op's records reach the log together */
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

/*
 * Index of keys already seen in one request, for "the same key earlier in this
 * request gets the same page". Open addressing over request positions.
 */
struct seen {
    uint32_t *slot; /* request index + 1, 0 = empty */
    uint64_t *hash;
    size_t mask;
};

static int seen_init(struct seen *s, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    s->slot = calloc(cap, sizeof *s->slot);
    s->hash = malloc(cap * sizeof *s->hash);
    s->mask = cap - 1;
    if (!s->slot || !s->hash) {
        free(s->slot);
        free(s->hash);
        return -ENOMEM;
    }
    return 0;
}

/* Returns the earlier index of key i, or inserts i and returns -1. */
static int64_t seen_check(struct seen *s, const struct kvp_str *keys, const uint64_t *hash,
                          size_t i)
{
    uint64_t h = hash[i];
    for (size_t j = h & s->mask;; j = (j + 1) & s->mask) {
        if (!s->slot[j]) {
            s->slot[j] = (uint32_t)i + 1;
            s->hash[j] = h;
            return -1;
        }
        size_t o = s->slot[j] - 1;
        if (s->hash[j] == h && keys[o].len == keys[i].len &&
            !memcmp(keys[o].ptr, keys[i].ptr, keys[i].len))
            return (int64_t)o;
    }
}

static void seen_free(struct seen *s)
{
    free(s->slot);
    free(s->hash);
}

static int lo_allocate_ordered(struct kvp_ns *pub, uint32_t rank, int order,
                               const struct kvp_str *keys, size_t n, int64_t *pages,
                               uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc;
    int reused = 0; /* a FREE page is handed out (kvp__jrnl_reuse) */
    struct seen seen = {0};
    struct kbatch kb;
    if (kb_init(&kb, keys, n, err) != 0)
        return -ENOMEM;
    if (n > 1 && seen_init(&seen, n) != 0) {
        kb_free(&kb);
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    /* The pages handed out are only worth writing if their confirmations
     * can be logged: their room must be there too (not held; up to
     * KVP_JRNL_PROBE_MAX, so that a huge batch writes no zeros for it). */
    uint64_t confirm_room = 0;
    for (size_t i = 0; i < n && confirm_room < KVP_JRNL_PROBE_MAX; i++)
        confirm_room += KVP_JRNL_HOLD(keys[i].len);
    if (confirm_room > KVP_JRNL_PROBE_MAX)
        confirm_room = KVP_JRNL_PROBE_MAX;
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *r;
    if ((rc = rank_lookup_err(ns, rank, &r, err)) != 0)
        goto out;
    /* Evictions log a FREE each: one per key that finds no free page, and
     * at most one per held page (expiry below only adds free pages). */
    uint64_t evictable = n > r->nfree ? n - r->nfree : 0;
    if (evictable > r->lru.count)
        evictable = r->lru.count;
    if ((rc = kvp__jrnl_reserve(&ns->jrnl, evictable * KVP_JRNL_FREE, confirm_room, err)) != 0)
        goto out;
    uint64_t now = now_ms(ns->meta);
    expire(r, now);
    if (++r->stamp == 0)
        r->stamp = 1;
    kb_find(ns, &kb, keys, n);
    /* Hits first, touched last to first so that earlier keys (prefix parents)
     * end up more recent; marking them keeps phase two from evicting them. */
    for (size_t i = n; i-- > 0;) {
        uint32_t p = key_page(kb.e[i], r->slot);
        if (existed)
            existed[i] = p != KVP_NONE;
        pages[i] = p == KVP_NONE ? -2 : (int64_t)p;
        if (p != KVP_NONE) {
            touch(r, p);
            r->pages[p].mark = r->stamp;
            r->hits++;
        }
    }
    /* Evictions to come: one per key without a page, past the free pages. */
    uint64_t to_evict = 0, prefetched = 0;
    for (size_t i = 0; i < n; i++)
        to_evict += pages[i] == -2;
    to_evict = to_evict > r->nfree ? to_evict - r->nfree : 0;
    for (size_t i = 0; i < n; i++) {
        if (pages[i] != -2) {
            if (n > 1)
                seen_check(&seen, keys, kb.h, i); /* a hit is also "seen" */
            continue;
        }
        int64_t prev = n > 1 ? seen_check(&seen, keys, kb.h, i) : -1;
        if (prev >= 0) {
            pages[i] = pages[prev];
            continue;
        }
        r->misses++;
        uint32_t p = take_free_page(ns->meta, r, order);
        if (p != KVP_NONE) {
            reused = 1;
        } else {
            if (!prefetched && to_evict) {
                prefetched = to_evict < EVICT_WINDOW ? to_evict : EVICT_WINDOW;
                to_evict -= prefetched;
                evict_prefetch(ns, r, prefetched);
            }
            p = evict(ns, r, now);
            prefetched -= prefetched > 0;
        }
        if (p == KVP_NONE) {
            pages[i] = -1;
            continue;
        }
        page_reserve(ns->meta, r, p, now);
        r->pages[p].mark = r->stamp;
        r->allocations++;
        pages[i] = p;
    }
    if (reused)
        kvp__jrnl_reuse(&ns->jrnl);
out:
    *ticket = later(*ticket, op_done(ns)); /* the op's records reach the log together */
    pthread_mutex_unlock(&ns->lock);
    if (n > 1)
        seen_free(&seen);
    kb_free(&kb);
    return rc;
}

static int lo_allocate(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys, size_t n,
                       int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    return lo_allocate_ordered(pub, rank, KVP_ORDER_DEFAULT, keys, n, pages, existed, ticket, err);
}

/* -EINVAL (rule, the element, its page) unless every page is in [0, num_pages). */
static int pages_in_range(const struct kvp__rank *r, const int64_t *p, size_t n, int rule,
                          const char *what, struct kvp_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= r->num_pages) {
            return kvp__err_page_range(err, rule, what, (int64_t)i, p[i], r->num_pages);
        }
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A lineage of plen parent bytes and ntokens tokens, its tokens not yet
 * filled; NULL when out of memory. */
static struct kvp__lin *lin_new(const char *parent, size_t plen, uint32_t ntokens)
{
    struct kvp__lin *l = malloc(sizeof *l + (size_t)ntokens * sizeof(uint32_t) + plen);
    if (!l)
        return NULL;
    l->next_kept = NULL;
    l->ntokens = ntokens;
    l->plen = (uint16_t)plen;
    if (plen)
        memcpy((char *)kvp__lin_parent(l), parent, plen);
    return l;
}

static void lins_free(struct kvp__lin **lins, size_t n)
{
    for (size_t i = 0; lins && i < n; i++)
        free(lins[i]);
    free(lins);
}

/* The lineage confirmation i of o names (*out NULL: none), built before
 * anything changes. 0 or -ENOMEM. */
static int lin_of(const struct kvp_confirm_opts *o, size_t i, struct kvp__lin **out)
{
    size_t plen = o->parents ? o->parents[i].len : 0;
    uint32_t nt = o->ntokens ? o->ntokens[i] : 0;
    *out = NULL;
    if (!plen && !nt)
        return 0;
    if (!(*out = lin_new(plen ? o->parents[i].ptr : NULL, plen, nt)))
        return -ENOMEM;
    if (nt)
        memcpy((*out)->tok, o->token_ids[i], nt * sizeof(uint32_t));
    return 0;
}

static int lo_confirm_ex(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys,
                         const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                         const struct kvp_confirm_opts *opts, uint64_t *ticket,
                         struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc;
    /* Two confirmations of one page for different keys within one request would
     * conflict half-way through; find them before anything changes. Sorting
     * (page << 32 | index) groups the same page together. */
    uint64_t *order = NULL;
    /* lins[i]: the lineage confirmation i names, kept if it is accepted
     * (NULL: none named; the array NULL: opts name none). */
    struct kvp__lin **lins = NULL;
    struct kbatch kb; /* kb.e: each confirmation's entry, looked up once */
    if (kb_init(&kb, keys, n, err) != 0)
        return -ENOMEM;
    if (n > 1 && !(order = malloc(n * sizeof *order))) {
        kb_free(&kb);
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *r;
    if ((rc = rank_lookup_err(ns, rank, &r, err)) != 0)
        goto out;
    if ((rc = pages_in_range(r, pages, n, KVP_RULE_CONFIRM_PAGE, "confirmation", err)) ||
        (rc = pages_in_range(r, release, nrel, KVP_RULE_RELEASE_PAGE, "release", err)))
        goto out;
    for (size_t i = 0; i < n; i++) {
        struct kvp__page *pg = &r->pages[pages[i]];
        if (pg->state != KVP_PHELD)
            continue;
        struct kvp__key *o = pg->owner;
        if (o->len != keys[i].len || memcmp(kvp__key_bytes(o), keys[i].ptr, keys[i].len)) {
            rc = -EEXIST;
            kvp__err_held_by_other(err, (int64_t)i, pages[i], rank);
            goto out;
        }
    }
    if (n > 1) {
        for (size_t i = 0; i < n; i++)
            order[i] = (uint64_t)pages[i] << 32 | i;
        qsort(order, n, sizeof *order, cmp_u64);
        for (size_t j = 1; j < n; j++) {
            size_t a = order[j - 1] & 0xffffffffu, b = order[j] & 0xffffffffu;
            if (pages[a] == pages[b] &&
                (keys[a].len != keys[b].len || memcmp(keys[a].ptr, keys[b].ptr, keys[a].len))) {
                rc = -EEXIST;
                kvp__err_held_by_other(err, (int64_t)b, pages[b], rank);
                goto out;
            }
        }
    }
    /* The lineages named, built before anything changes (out of memory:
     * nothing changed). */
    if (opts && (opts->parents || opts->ntokens)) {
        if (!(lins = calloc(n, sizeof *lins))) {
            rc = -ENOMEM;
            kvp__err_oom(err, rc);
            goto out;
        }
        uint64_t named = 0;
        for (size_t i = 0; i < n; i++) {
            if (r->pages[pages[i]].state != KVP_PHELD && (rc = lin_of(opts, i, &lins[i]))) {
                kvp__err_oom(err, rc);
                goto out;
            }
            named += lins[i] != NULL;
        }
        if ((rc = kvp__lin_reserve(ns, named)) != 0) {
            kvp__err_oom(err, rc);
            goto out;
        }
    }
    /* Room in the log for a HOLD (and a lineage) per confirmation, before
     * anything changes. */
    uint64_t room = 0;
    for (size_t i = 0; i < n; i++) {
        room += KVP_JRNL_HOLD(keys[i].len);
        if (lins && lins[i])
            room += KVP_JRNL_LIN(keys[i].len, lins[i]->plen, lins[i]->ntokens);
    }
    if ((rc = kvp__jrnl_reserve(&ns->jrnl, room, 0, err)) != 0)
        goto out;
    /* Validation is complete; from here on nothing fails but memory. Allocate
     * every new key entry first so that running out of memory changes nothing. */
    for (size_t i = 0; i < n; i++) {
        kb.e[i] = NULL;
        if (r->pages[pages[i]].state == KVP_PHELD)
            continue;
        if (!(kb.e[i] = key_get_h(ns, &keys[i], kb.h[i], r->slot))) {
            rc = -ENOMEM;
            kvp__err_oom(err, rc);
            /* Entries created so far hold no page; drop them again. */
            for (size_t j = 0; j <= i; j++) {
                struct kvp__key *e = key_find(ns, &keys[j]);
                if (e && e->nheld == 0)
                    key_unlink(ns, e);
            }
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t p = (uint32_t)pages[i];
        struct kvp__page *pg = &r->pages[p];
        if (pg->state == KVP_PHELD)
            continue; /* held by this key (validated): idempotent */
        struct kvp__key *e = kb.e[i];
        if (pg->state == KVP_PRESERVED)
            list_remove(r->pages, &r->reserved, p);
        else
            page_take_free(r, p);
        if (e->pages[r->slot] != KVP_NONE) {
            page_to_free(r, p); /* the key's first confirmed page wins */
            continue;
        }
        kvp__jrnl_hold(&ns->jrnl, r->id, p, kvp__key_bytes(e), e->len);
        page_hold(r, p, e);
        if (lins && lins[i]) { /* the latest accepted lineage of the key wins */
            kvp__jrnl_lin(&ns->jrnl, r->id, kvp__key_bytes(e), e->len, lins[i]);
            kvp__lin_set(ns, e, lins[i]);
            lins[i] = NULL;
        }
        tell(ns, r, e, KVP_CHANGE_STORED);
    }
    for (size_t i = 0; i < nrel; i++) {
        uint32_t p = (uint32_t)release[i];
        struct kvp__page *pg = &r->pages[p];
        if (pg->state == KVP_PRESERVED) {
            list_remove(r->pages, &r->reserved, p);
            page_to_free(r, p);
        } else if (pg->state == KVP_PHELD) {
            r->release_held++;
        }
    }
out:
    *ticket = later(*ticket, op_done(ns)); /* the op's records reach the log together */
    pthread_mutex_unlock(&ns->lock);
    lins_free(lins, n); /* those not accepted */
    free(order);
    kb_free(&kb);
    return rc;
}

static int lo_confirm(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys,
                      const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                      uint64_t *ticket, struct kvp_error *err)
{
    return lo_confirm_ex(pub, rank, keys, pages, n, release, nrel, NULL, ticket, err);
}

static int lo_exists(struct kvp_ns *pub, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint8_t *out, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc = 0;
    struct kbatch kb;
    if (kb_init(&kb, keys, n, err) != 0)
        return -ENOMEM;
    pthread_mutex_lock(&ns->lock);
    if (rank < 0) {
        uint32_t want = ns->nranks;
        kb_find(ns, &kb, keys, n);
        for (size_t i = 0; i < n; i++)
            out[i] = kb.e[i] && want && kb.e[i]->nheld == want;
    } else {
        struct kvp__rank *r;
        if ((rc = rank_lookup_err(ns, (uint32_t)rank, &r, err)) == 0) {
            kb_find(ns, &kb, keys, n);
            for (size_t i = 0; i < n; i++)
                out[i] = key_page(kb.e[i], r->slot) != KVP_NONE;
        }
    }
    pthread_mutex_unlock(&ns->lock);
    kb_free(&kb);
    return rc;
}

static int lo_lookup(struct kvp_ns *pub, uint32_t rank, int complete_only,
                     const struct kvp_str *keys, size_t n, int64_t *pages, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc;
    struct kbatch kb;
    if (kb_init(&kb, keys, n, err) != 0)
        return -ENOMEM;
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *r;
    if ((rc = rank_lookup_err(ns, rank, &r, err)) != 0)
        goto out;
    uint64_t until = now_ms(ns->meta) + ns->meta->opts.read_grace_ms;
    kb_find(ns, &kb, keys, n);
    for (size_t i = n; i-- > 0;) {
        struct kvp__key *e = kb.e[i];
        uint32_t p = key_page(e, r->slot);
        if (p != KVP_NONE && complete_only && e->nheld != ns->nranks)
            p = KVP_NONE;
        pages[i] = p == KVP_NONE ? -1 : (int64_t)p;
        if (p == KVP_NONE) {
            r->misses++;
            continue;
        }
        r->hits++;
        touch(r, p);
        r->pages[p].t = until;
    }
out:
    pthread_mutex_unlock(&ns->lock);
    kb_free(&kb);
    return rc;
}

static int lo_delete(struct kvp_ns *pub, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint64_t *ticket, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc = 0;
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *only = NULL;
    if (rank >= 0 && (rc = rank_lookup_err(ns, (uint32_t)rank, &only, err)) != 0)
        goto out;
    /* A FREE per page the keys hold on the ranks concerned, counted first
     * (delete is not a hot route; a bound by n could be far too much). */
    uint64_t frees = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvp__key *e = key_find(ns, &keys[i]);
        if (e && only)
            frees += only->slot < e->cap && e->pages[only->slot] != KVP_NONE;
        else if (e)
            frees += e->nheld;
    }
    if ((rc = kvp__jrnl_reserve(&ns->jrnl, frees * KVP_JRNL_FREE, 0, err)) != 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        struct kvp__key *e = key_find(ns, &keys[i]);
        if (!e)
            continue;
        for (uint32_t s = 0; e && s < e->cap; s++) {
            if (only && s != only->slot)
                continue;
            uint32_t p = e->pages[s];
            if (p == KVP_NONE)
                continue;
            struct kvp__rank *r = ns->slots[s];
            int last = e->nheld == 1;
            kvp__jrnl_free(&ns->jrnl, r->id, p);
            tell(ns, r, e, KVP_CHANGE_REMOVED);
            page_unhold(ns, r, p); /* frees e when it was its last page */
            page_to_free(r, p);
            if (last)
                e = NULL;
        }
    }
out:
    *ticket = later(*ticket, op_done(ns)); /* the op's records reach the log together */
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

static int lo_clear(struct kvp_ns *pub, int64_t rank, uint64_t *ticket, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc = 0;
    pthread_mutex_lock(&ns->lock);
    if (rank >= 0) {
        struct kvp__rank *r;
        if ((rc = rank_lookup_err(ns, (uint32_t)rank, &r, err)) == 0 &&
            (rc = kvp__jrnl_reserve(&ns->jrnl, KVP_JRNL_CLEAR, 0, err)) == 0) {
            kvp__jrnl_clear(&ns->jrnl, rank);
            if ((rc = rank_clear(ns, r)) != 0)
                kvp__err_oom(err, rc);
        }
    } else if ((rc = kvp__jrnl_reserve(&ns->jrnl, KVP_JRNL_CLEAR, 0, err)) == 0) {
        struct kvp__page **fresh = calloc(ns->nranks ? ns->nranks : 1, sizeof *fresh);
        for (uint32_t i = 0; fresh && i < ns->nranks; i++)
            if (!(fresh[i] = pages_alloc(ns->slots[i]->num_pages)))
                rc = -ENOMEM;
        if (!fresh || rc) {
            for (uint32_t i = 0; fresh && i < ns->nranks; i++)
                pages_free(fresh[i], ns->slots[i]->num_pages);
            rc = -ENOMEM;
            kvp__err_oom(err, rc);
        } else {
            kvp__jrnl_clear(&ns->jrnl, -1);
            if (ns->meta->watch)
                tell_all(ns->meta->watch, ns->meta->watch_arg, ns, KVP_CHANGE_REMOVED);
            free_all_keys(ns);
            for (uint32_t i = 0; i < ns->nranks; i++)
                rank_set_pages(ns->slots[i], fresh[i], ns->slots[i]->num_pages);
        }
        free(fresh);
    }
    *ticket = later(*ticket, op_done(ns)); /* the op's records reach the log together */
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

/* Forgets every key and rank of the namespace and marks it dropped; the
 * caller holds its lock and has logged the DROP record. */
static void ns_drop_locked(struct kvp__lns *ns)
{
    free_all_keys(ns);
    struct kvp__rank **pp = &ns->dead, *r;
    while ((r = *pp)) { /* the ones dropped before whose job is done now */
        if (atomic_load(&r->ahead.state) != KVP_POPULATE_QUEUED) {
            *pp = r->next_dead;
            free(r);
        } else {
            pp = &r->next_dead;
        }
    }
    for (uint32_t i = 0; i < ns->nranks; i++) {
        r = ns->slots[i];
        pages_free(r->pages, r->num_pages); /* a job still queued backs nothing */
        r->pages = NULL;
        if (atomic_load(&r->ahead.state) == KVP_POPULATE_QUEUED) {
            r->next_dead = ns->dead; /* the prefault thread holds &r->ahead */
            ns->dead = r;
        } else {
            free(r);
        }
    }
    ns->nranks = 0;
    kvp__pins_free(ns); /* the PINS file forgets them at its next rewrite */
    __atomic_store_n(&ns->dropped, 1, __ATOMIC_RELEASE);
}

void kvp__replay_drop(struct kvp__lns *ns)
{
    pthread_mutex_lock(&ns->lock);
    ns_drop_locked(ns);
    pthread_mutex_unlock(&ns->lock);
}

static int lo_drop(struct kvp_meta *front, const char *dep, size_t dlen, const char *pool,
                   size_t plen, uint64_t *ticket, struct kvp_error *err)
{
    struct kvp_ns *pub;
    int rc = lo_ns(front, dep, dlen, pool, plen, 0, &pub, ticket, err);
    if (rc) {
        kvp__err_no_namespace(err, rc, dep, dlen, pool, plen);
        return rc;
    }
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    pthread_mutex_lock(&ns->lock);
    if (ns->dropped) { /* dropped meanwhile by another caller */
        rc = -ENOENT;
        kvp__err_no_namespace(err, rc, dep, dlen, pool, plen);
    } else if ((rc = kvp__jrnl_reserve(&ns->jrnl, KVP_JRNL_DROP, 0, err)) == 0) {
        kvp__jrnl_drop(&ns->jrnl);
        if (ns->meta->watch)
            tell_all(ns->meta->watch, ns->meta->watch_arg, ns, KVP_CHANGE_REMOVED);
        ns_drop_locked(ns);
    }
    *ticket = later(*ticket, op_done(ns));
    pthread_mutex_unlock(&ns->lock);
    return rc;
}

/* ---------------------------------------------------------------- stats and checks */

static void rank_stats(const struct kvp__rank *r, struct kvp_rank_stats *s)
{
    s->rank = r->id;
    s->num_pages = r->num_pages;
    s->free = r->nfree;
    s->reserved = r->reserved.count;
    s->held = r->lru.count;
    s->keys = r->lru.count;
    s->hits = r->hits;
    s->misses = r->misses;
    s->allocations = r->allocations;
    s->evictions = r->evictions;
    s->expired_reservations = r->expired;
    s->release_of_held_page = r->release_held;
}

static int lo_stats(struct kvp_meta *front, kvp_meta_stats_fn fn, void *arg)
{
    struct kvp__local *m = front->be;
    pthread_rwlock_rdlock(&m->ns_lock);
    struct kvp__lns *first = m->ns_first;
    pthread_rwlock_unlock(&m->ns_lock);
    /* Namespaces are never removed and next_all is only appended under the
     * registry lock, so walking from a snapshot of the head is safe. */
    int rc = 0;
    for (struct kvp__lns *ns = first; ns && !rc;) {
        pthread_mutex_lock(&ns->lock);
        if (ns->dropped) { /* gone for everyone but the log's numbering */
            pthread_mutex_unlock(&ns->lock);
            pthread_rwlock_rdlock(&m->ns_lock);
            ns = ns->next_all;
            pthread_rwlock_unlock(&m->ns_lock);
            continue;
        }
        size_t nr = ns->nranks;
        struct kvp_rank_stats *st = calloc(nr ? nr : 1, sizeof *st);
        if (!st) {
            pthread_mutex_unlock(&ns->lock);
            return -ENOMEM;
        }
        uint64_t now = now_ms(m);
        for (size_t i = 0; i < nr; i++) {
            expire(ns->by_id[i], now);
            rank_stats(ns->by_id[i], &st[i]);
        }
        pthread_mutex_unlock(&ns->lock);
        rc = fn(ns->deployment, ns->pool, st, nr, arg);
        free(st);
        pthread_rwlock_rdlock(&m->ns_lock);
        ns = ns->next_all;
        pthread_rwlock_unlock(&m->ns_lock);
    }
    return rc;
}

static int lo_watch(struct kvp_meta *front, kvp_meta_change_fn fn, void *arg)
{
    struct kvp__local *m = front->be;
    m->watch = fn;
    m->watch_arg = fn ? arg : NULL;
    return 0;
}

static int lo_inventory(struct kvp_meta *front, kvp_meta_change_fn fn, void *arg)
{
    struct kvp__local *m = front->be;
    pthread_rwlock_rdlock(&m->ns_lock);
    struct kvp__lns *ns = m->ns_first;
    pthread_rwlock_unlock(&m->ns_lock);
    while (ns) { /* as lo_stats walks them */
        pthread_mutex_lock(&ns->lock);
        if (!ns->dropped)
            tell_all(fn, arg, ns, KVP_CHANGE_STORED);
        pthread_mutex_unlock(&ns->lock);
        pthread_rwlock_rdlock(&m->ns_lock);
        ns = ns->next_all;
        pthread_rwlock_unlock(&m->ns_lock);
    }
    return 0;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            set_err(err, -EUCLEAN, KVP_RULE_NONE, -1, 0, 0, __VA_ARGS__);                          \
            return -EUCLEAN;                                                                       \
        }                                                                                          \
    } while (0)

static int check_list(const struct kvp__rank *r, const struct kvp__list *l, uint8_t state,
                      const char *what, const char *ctx, struct kvp_error *err)
{
    uint64_t count = 0;
    uint32_t prev = KVP_NONE;
    for (uint32_t p = l->head; p != KVP_NONE; p = r->pages[p].next) {
        CHECK(p < r->num_pages, "%s rank %u: %s list has page %u out of range", ctx, r->id, what,
              p);
        CHECK(r->pages[p].state == state, "%s rank %u: page %u on the %s list is in state %d", ctx,
              r->id, p, what, r->pages[p].state);
        CHECK(r->pages[p].prev == prev, "%s rank %u: %s list broken at page %u", ctx, r->id, what,
              p);
        CHECK(++count <= r->num_pages, "%s rank %u: %s list has a cycle", ctx, r->id, what);
        prev = p;
    }
    CHECK(l->tail == prev, "%s rank %u: %s list tail is wrong", ctx, r->id, what);
    CHECK(count == l->count, "%s rank %u: %s list has %llu pages, counted %llu", ctx, r->id, what,
          (unsigned long long)count, (unsigned long long)l->count);
    return 0;
}

static int check_ns(struct kvp__lns *ns, struct kvp_error *err)
{
    char ctx[300];
    snprintf(ctx, sizeof ctx, "namespace %s/%s", ns->deployment, ns->pool);
    uint64_t held_total = 0;
    for (uint32_t i = 0; i < ns->nranks; i++) {
        const struct kvp__rank *r = ns->slots[i];
        CHECK(r->slot == i, "%s rank %u: slot %u != %u", ctx, r->id, r->slot, i);
        CHECK(i == 0 || ns->by_id[i - 1]->id < ns->by_id[i]->id, "%s: rank order broken", ctx);
        int rc;
        if ((rc = check_list(r, &r->free, KVP_PFREE, "free", ctx, err)) ||
            (rc = check_list(r, &r->reserved, KVP_PRESERVED, "reserved", ctx, err)) ||
            (rc = check_list(r, &r->lru, KVP_PHELD, "LRU", ctx, err)))
            return rc;
        uint64_t nf = 0, nfl = 0, nr = 0, nh = 0;
        for (uint32_t p = 0; p < r->num_pages; p++) {
            const struct kvp__page *pg = &r->pages[p];
            switch (pg->state) {
            case KVP_PFREE:
                nf++;
                nfl += page_touched(r, p);
                CHECK(!pg->owner, "%s rank %u: FREE page %u has an owner", ctx, r->id, p);
                break;
            case KVP_PRESERVED:
                nr++;
                CHECK(!pg->owner, "%s rank %u: RESERVED page %u has an owner", ctx, r->id, p);
                break;
            case KVP_PHELD: {
                nh++;
                const struct kvp__key *e = pg->owner;
                CHECK(e, "%s rank %u: HELD page %u has no key", ctx, r->id, p);
                CHECK(r->slot < e->cap && e->pages[r->slot] == p,
                      "%s rank %u: page %u is HELD by key '%.*s' which does not point at it", ctx,
                      r->id, p, (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e));
                break;
            }
            default:
                CHECK(0, "%s rank %u: page %u in unknown state %d", ctx, r->id, p, pg->state);
            }
        }
        CHECK(nf + nr + nh == r->num_pages, "%s rank %u: states do not add up", ctx, r->id);
        CHECK(nf == r->nfree, "%s rank %u: %llu FREE pages, counted %llu", ctx, r->id,
              (unsigned long long)nf, (unsigned long long)r->nfree);
        CHECK(r->hwm <= r->ceil && r->ceil <= r->num_pages,
              "%s rank %u: untouched range [%u, %u) is not within [0, %u]", ctx, r->id, r->hwm,
              r->ceil, r->num_pages);
        CHECK(nfl == r->free.count,
              "%s rank %u: %llu FREE pages outside [hwm, ceil), free list has %llu", ctx, r->id,
              (unsigned long long)nfl, (unsigned long long)r->free.count);
        CHECK(nr == r->reserved.count, "%s rank %u: reserved count wrong", ctx, r->id);
        CHECK(nh == r->lru.count, "%s rank %u: held count wrong", ctx, r->id);
        held_total += nh;
    }
    uint64_t keys = 0, slots_total = 0;
    for (uint64_t b = 0; b < ns->nbuckets + ns->nold; b++) {
        int in_old = b >= ns->nbuckets;
        uint64_t bi = in_old ? b - ns->nbuckets : b, nb = in_old ? ns->nold : ns->nbuckets;
        const struct kvp__bucket *bk = in_old ? &ns->old[bi] : &ns->buckets[bi];
        CHECK(!in_old || bi >= ns->mpos || (!bk->head && !bk->n),
              "%s: old bucket %llu was moved but is not empty", ctx, (unsigned long long)bi);
        uint64_t pos = 0;
        for (const struct kvp__key *e = bk->head; e; e = e->next, pos++) {
            struct kvp_str ks = {kvp__key_bytes(e), e->len};
            uint64_t h = key_hash(&ks);
            CHECK(e->hash == (uint32_t)h && e->tag == key_tag(h) && ((uint32_t)h & (nb - 1)) == bi,
                  "%s: key '%.*s' has a wrong hash or tag, or sits in the wrong bucket", ctx,
                  (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e));
            CHECK(pos >= KVP_BUCKET_TAGS || bk->tag[pos] == e->tag,
                  "%s: bucket %llu has a wrong tag at place %llu", ctx, (unsigned long long)bi,
                  (unsigned long long)pos);
            keys++;
            uint32_t held = 0;
            CHECK(e->nheld > 0, "%s: key '%.*s' holds no page", ctx,
                  (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e));
            for (uint32_t s = 0; s < e->cap; s++) {
                uint32_t p = e->pages[s];
                if (p == KVP_NONE)
                    continue;
                CHECK(s < ns->nranks, "%s: key has a page on slot %u beyond the ranks", ctx, s);
                const struct kvp__rank *r = ns->slots[s];
                CHECK(p < r->num_pages && r->pages[p].state == KVP_PHELD && r->pages[p].owner == e,
                      "%s rank %u: key '%.*s' points at page %u which it does not hold", ctx, r->id,
                      (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e), p);
                held++;
            }
            CHECK(held == e->nheld, "%s: key '%.*s' counts %u pages, has %u", ctx,
                  (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e), e->nheld, held);
            slots_total += held;
        }
        CHECK(bk->n == CHAIN_UNCOUNTED ? pos >= CHAIN_UNCOUNTED : bk->n == pos,
              "%s: bucket %llu counts %u entries, has %llu", ctx, (unsigned long long)bi, bk->n,
              (unsigned long long)pos);
        for (; pos < KVP_BUCKET_TAGS; pos++)
            CHECK(!bk->tag[pos], "%s: bucket %llu has a tag past its chain's end", ctx,
                  (unsigned long long)bi);
    }
    CHECK(keys == ns->nkeys, "%s: %llu keys in the index, counted %llu", ctx,
          (unsigned long long)keys, (unsigned long long)ns->nkeys);
    /* Each HELD page points at a key that points back at it, and each key slot
     * at a page held by it: equal totals mean no page is held by two keys. */
    CHECK(slots_total == held_total, "%s: %llu key slots but %llu held pages", ctx,
          (unsigned long long)slots_total, (unsigned long long)held_total);
    /* Each lineage belongs to a key of the index, and is found where it is. */
    uint64_t nlin = 0;
    for (uint64_t i = 0; i < ns->lins.cap; i++) {
        const struct kvp__key *e = ns->lins.v[i].key;
        if (!e)
            continue;
        nlin++;
        struct kvp_str k = {kvp__key_bytes(e), e->len};
        CHECK(key_find(ns, &k) == e && kvp__lin_get(&ns->lins, e) == ns->lins.v[i].lin,
              "%s: a lineage of key '%.*s', which is not in the index or not found", ctx,
              (int)(e->len > 64 ? 64 : e->len), kvp__key_bytes(e));
    }
    CHECK(nlin == ns->lins.n, "%s: %llu lineages counted, %llu found", ctx,
          (unsigned long long)ns->lins.n, (unsigned long long)nlin);
    return 0;
}

static int lo_check(struct kvp_meta *front, struct kvp_error *err)
{
    struct kvp__local *m = front->be;
    pthread_rwlock_rdlock(&m->ns_lock);
    struct kvp__lns *first = m->ns_first;
    pthread_rwlock_unlock(&m->ns_lock);
    for (struct kvp__lns *ns = first; ns;) {
        pthread_mutex_lock(&ns->lock);
        int rc = check_ns(ns, err);
        pthread_mutex_unlock(&ns->lock);
        if (rc)
            return rc;
        pthread_rwlock_rdlock(&m->ns_lock);
        ns = ns->next_all;
        pthread_rwlock_unlock(&m->ns_lock);
    }
    return 0;
}

struct kvp__rank *kvp__rank_of(struct kvp__lns *ns, uint32_t rank)
{
    return rank_find(ns, rank);
}

uint32_t kvp__key_page_locked(struct kvp__lns *ns, const struct kvp__rank *r,
                              const struct kvp_str *key)
{
    return key_page(key_find(ns, key), r->slot);
}

int64_t kvp__meta_peek(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *key)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    pthread_mutex_lock(&ns->lock);
    struct kvp__rank *r = rank_find(ns, rank);
    int64_t p = -2;
    if (r) {
        uint32_t q = key_page(key_find(ns, key), r->slot);
        p = q == KVP_NONE ? -1 : (int64_t)q;
    }
    pthread_mutex_unlock(&ns->lock);
    return p;
}

struct kvp__lns *kvp__meta_ns_by_id(struct kvp__local *m, uint32_t id)
{
    return id < m->ns_count ? m->ns_by_id[id] : NULL;
}

int kvp__replay_hold(struct kvp__lns *ns, uint32_t rank, uint32_t page, const struct kvp_str *key,
                     char *msg, size_t msglen)
{
    struct kvp__rank *r = rank_find(ns, rank);
    if (!r) {
        snprintf(msg, msglen, "HOLD on rank %u, which is not initialized", rank);
        return -EUCLEAN;
    }
    if (page >= r->num_pages || r->pages[page].state != KVP_PFREE) {
        snprintf(msg, msglen, "HOLD of page %u on rank %u, which is %s", page, rank,
                 page >= r->num_pages ? "out of range" : "not free");
        return -EUCLEAN;
    }
    if (check_key(key)) {
        snprintf(msg, msglen, "HOLD with an invalid key");
        return -EUCLEAN;
    }
    struct kvp__key *e = key_get(ns, key, r->slot);
    if (!e)
        return -ENOMEM;
    if (e->pages[r->slot] != KVP_NONE) { /* an existing entry: nothing was created */
        snprintf(msg, msglen, "HOLD of page %u on rank %u for a key that holds another page", page,
                 rank);
        return -EUCLEAN;
    }
    page_take_free(r, page);
    page_hold(r, page, e);
    return 0;
}

int kvp__replay_free(struct kvp__lns *ns, uint32_t rank, uint32_t page, char *msg, size_t msglen)
{
    struct kvp__rank *r = rank_find(ns, rank);
    if (!r || page >= r->num_pages || r->pages[page].state != KVP_PHELD) {
        snprintf(msg, msglen, "FREE of page %u on rank %u, which does not hold a key", page, rank);
        return -EUCLEAN;
    }
    page_unhold(ns, r, page);
    page_to_free(r, page);
    return 0;
}

int kvp__replay_lin(struct kvp__lns *ns, const struct kvp_str *key, const char *parent,
                    uint32_t plen, const uint8_t *tok, uint32_t ntokens, char *msg, size_t msglen)
{
    if (check_key(key) || (plen && kvp_key_problem(parent, plen)) ||
        ntokens > KVP_MAX_PAGE_TOKENS) {
        snprintf(msg, msglen, "LINEAGE with an invalid key, parent or token count");
        return -EUCLEAN;
    }
    struct kvp__lin *l = lin_new(parent, plen, ntokens);
    if (!l)
        return -ENOMEM;
    for (uint32_t i = 0; i < ntokens; i++)
        l->tok[i] = (uint32_t)tok[4 * i] | (uint32_t)tok[4 * i + 1] << 8 |
                    (uint32_t)tok[4 * i + 2] << 16 | (uint32_t)tok[4 * i + 3] << 24;
    pthread_mutex_lock(&ns->lock);
    struct kvp__key *e = key_find(ns, key);
    int rc = e ? kvp__lin_reserve(ns, 1) : -EUCLEAN;
    if (!rc)
        kvp__lin_set(ns, e, l);
    pthread_mutex_unlock(&ns->lock);
    if (rc)
        free(l);
    if (rc == -EUCLEAN)
        snprintf(msg, msglen, "LINEAGE of a key that holds no page");
    return rc;
}

void kvp__meta_reserve_keys(struct kvp__lns *ns, uint64_t nkeys)
{
    pthread_mutex_lock(&ns->lock);
    uint64_t nb = ns->nbuckets;
    while (nb < nkeys && nb < MAX_KEY_BUCKETS)
        nb *= 2;
    if (nb > ns->nbuckets && start_resize(ns, nb) == 0)
        migrate(ns, UINT64_MAX); /* recovery: no request is waiting */
    pthread_mutex_unlock(&ns->lock);
}

/* ---------------------------------------------------------------- the backend */

static int lo_wait(struct kvp_meta *front, uint64_t ticket, struct kvp_error *err)
{
    return kvp__persist_wait(front->be, ticket, err);
}

static int lo_when_durable(struct kvp_meta *front, uint64_t ticket, kvp_meta_durable_fn fn,
                           void *arg)
{
    return kvp__persist_when_durable(front->be, ticket, fn, arg);
}

static int lo_values(struct kvp_meta *front, kvp_meta_value_fn fn, void *arg)
{
    return kvp__persist_values(front->be, fn, arg);
}

static int lo_health(struct kvp_meta *front, int *scope, char *why, size_t len)
{
    *scope = KVP_HEALTH_WRITES; /* the log: reads are served from memory */
    return kvp__persist_health(front->be, why, len);
}

static int lo_describe(struct kvp_meta *front, char *buf, size_t len)
{
    static const char *const fsync_names[] = {"never", "batch", "always"};
    const struct kvp__local *m = front->be;
    if (!m->opts.data_dir)
        return snprintf(buf, len, "memory only");
    int f = m->opts.fsync;
    return snprintf(buf, len, "data directory %s (write-ahead log%s, fsync %s)", m->opts.data_dir,
                    m->opts.readonly ? ", read only" : "", f >= 0 && f <= 2 ? fsync_names[f] : "?");
}

static int lo_snapshot(struct kvp_meta *front)
{
    return kvp__persist_snapshot(front->be);
}

/* What an acknowledged change promises: the log's fsync, or nothing. */
static void lo_info(struct kvp_meta *front, struct kvp_meta_info *out)
{
    static const char *const fsync_names[] = {"never", "batch", "always"};
    if (!front)
        return;
    int f = front->opts.fsync;
    if (!front->opts.data_dir || front->opts.readonly) {
        out->durability = KVP_DURABLE_NONE;
        snprintf(out->durability_text, sizeof out->durability_text, "%s",
                 front->opts.data_dir ? "read only: changes live in memory" : "memory only");
        out->durability_meaning = "changes are lost when the handle is closed";
        out->durability_loss = "everything";
        return;
    }
    out->durability = f == KVP_FSYNC_NEVER ? KVP_DURABLE_PROCESS : KVP_DURABLE_MACHINE;
    snprintf(out->durability_text, sizeof out->durability_text, "write-ahead log, fsync %s",
             f >= 0 && f <= 2 ? fsync_names[f] : "?");
    out->durability_meaning = f == KVP_FSYNC_NEVER
                                  ? "acknowledged changes survive a crash of the process, not "
                                    "of the machine"
                                  : "acknowledged changes are on stable storage";
}

static const struct kvp__meta_scheme lo_schemes[] = {
    {"mem", "mem: the state in this process's memory only, gone at close", KVP__SCHEME_DEFAULT},
    {"file",
     "file:DIR (or a path starting with / or .): the state in this process, with a write-ahead "
     "log and snapshots in the data directory DIR",
     KVP__SCHEME_DIR},
    {NULL, NULL, 0},
};

const struct kvp__meta_ops kvp__local_ops = {
    .name = "in-process",
    .schemes = lo_schemes,
    .holder = "this process",
    .info = lo_info,
    .open = lo_open,
    .close = lo_close,
    .ns = lo_ns,
    .init_rank = lo_init_rank,
    .allocate = lo_allocate,
    .allocate_ordered = lo_allocate_ordered,
    .confirm = lo_confirm,
    .confirm_ex = lo_confirm_ex,
    .exists = lo_exists,
    .lookup = lo_lookup,
    .del = lo_delete,
    .clear = lo_clear,
    .drop = lo_drop,
    .nranks = lo_nranks,
    .stats = lo_stats,
    .check = lo_check,
    .wait = lo_wait,
    .when_durable = lo_when_durable,
    .values = lo_values,
    .health = lo_health,
    .snapshot = lo_snapshot,
    .describe = lo_describe,
    .watch = lo_watch,
    .inventory = lo_inventory,
    .pin = kvp__lo_pin,
    .unpin = kvp__lo_unpin,
    .pinned = kvp__lo_pinned,
    .exists_hashes = kvp__lo_exists_hashes,
};
