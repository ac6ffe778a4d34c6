/*
 * The in-process engine's index of block hashes (issue 38 §2): per hash form
 * (enum kvp_hash_form), the engine hash of each key entry whose key has 16
 * hex digits where the form reads them, mapped to the entry. The query by
 * block hashes (kvp__lo_exists_hashes, pins.c) looks each hash up here and
 * reads the entry's page on each rank asked, instead of parsing the key of
 * every page of every rank under the namespace lock (107 ms for one hash on
 * a 1,048,576-page rank).
 *
 * Derived state, never persisted: built on a namespace's first query in a
 * form (one pass over its key entries under the lock, once), then kept by
 * kvp__hx_note, which the key index calls where an entry is created, grown
 * into a new one or unlinked. A namespace nobody queries by hashes has no
 * index, and its allocations, confirmations and evictions pay one test of
 * two NULL pointers. Clearing every key (a clear of all ranks, a drop,
 * close) frees the index: the next query builds it again.
 *
 * The table is chained like the key index, with the same incremental
 * doubling: when it holds as many entries as buckets a table twice the size
 * is allocated and each later insertion moves HX_MIGRATE_STEP old buckets,
 * so no request waits for a million entries to be rehashed; until the move
 * is done a lookup also searches the old buckets not yet moved. Duplicates
 * (two keys with the same 16 digits) are separate nodes of one chain.
 * Memory: 8 bytes a bucket plus a 24-byte node per indexed key, about
 * 32-40 bytes a key per form queried. The engine reports no memory figures
 * per namespace, so it is counted nowhere (docs/protocol.md §13 says so).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "meta/local/meta_int.h"
#include "util/seed.h"
#include "util/hex.h"

#define HX_MIN_BUCKETS 1024
#define HX_MIGRATE_STEP 64

struct hx_node {
    struct hx_node *next;
    uint64_t v;         /* the engine hash */
    struct kvp__key *e; /* the entry whose key reads as v */
};

struct kvp__hx {
    struct hx_node **b; /* nb buckets, a power of two */
    uint64_t nb, n;
    struct hx_node **old; /* while growing: the table being emptied */
    uint64_t nold, mpos;  /* its size; its buckets below mpos are moved */
    struct kvp__slab mem; /* the nodes */
};

/* The engine hash of a key in form (kvpage/meta.h, enum kvp_hash_form): 0,
 * or -1 when the key has no 16 hex digits where the form takes them. */
static int key_hash_of(const char *k, size_t len, int form, uint64_t *out)
{
    if (len < 16)
        return -1;
    const char *s = form == KVP_HASH_VLLM ? k + len - 16 : k;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int d = kvp__hex_value(s[i]);
        if (d < 0)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* The bucket of v in a table of nb: the hashes come from clients, so they
 * are hashed with the process's seed (util/seed.h), not trusted to be
 * uniform, nor mixed by a function a client could invert. */
static uint64_t hx_index(uint64_t nb, uint64_t v)
{
    return XXH3_64bits_withSeed(&v, sizeof v, kvp__hash_seed()) & (nb - 1);
}

static struct hx_node **hx_bucket(struct hx_node **t, uint64_t nb, uint64_t v)
{
    return &t[hx_index(nb, v)];
}

static void hx_free(struct kvp__hx *x)
{
    if (!x)
        return;
    kvp__big_free(x->b, x->nb * sizeof *x->b);
    kvp__big_free(x->old, x->nold * sizeof *x->old);
    kvp__slab_destroy(&x->mem);
    free(x);
}

void kvp__hx_free(struct kvp__lns *ns)
{
    for (int f = 0; f < 2; f++) {
        hx_free(ns->hx[f]);
        ns->hx[f] = NULL;
    }
}

static void hx_migrate(struct kvp__hx *x, uint64_t n)
{
    while (x->old && n--) {
        for (struct hx_node *p = x->old[x->mpos], *nx; p; p = nx) {
            nx = p->next;
            struct hx_node **b = hx_bucket(x->b, x->nb, p->v);
            p->next = *b;
            *b = p;
        }
        x->old[x->mpos] = NULL;
        if (++x->mpos == x->nold) {
            kvp__big_free(x->old, x->nold * sizeof *x->old);
            x->old = NULL;
            x->nold = x->mpos = 0;
        }
    }
}

/* The chain where v's nodes are: the old table's bucket until it is moved. */
static struct hx_node **hx_chain(struct kvp__hx *x, uint64_t v)
{
    if (x->old) {
        uint64_t i = hx_index(x->nold, v);
        if (i >= x->mpos)
            return &x->old[i];
    }
    return hx_bucket(x->b, x->nb, v);
}

/* Adds (v, e); -1 when out of memory (the caller then drops the index). */
static int hx_add(struct kvp__hx *x, uint64_t v, struct kvp__key *e)
{
    if (x->old) {
        hx_migrate(x, HX_MIGRATE_STEP);
    } else if (x->n >= x->nb) {
        /* Doubles: the move is spread over the next insertions (nold /
         * HX_MIGRATE_STEP of them, far fewer than the nb before the next
         * doubling). A failed allocation only makes chains longer. */
        struct hx_node **t = kvp__big_zalloc(2 * x->nb * sizeof *t);
        if (t) {
            kvp__big_nofork(t, 2 * x->nb * sizeof *t, 1);
            x->old = x->b;
            x->nold = x->nb;
            x->mpos = 0;
            x->b = t;
            x->nb *= 2;
        }
    }
    struct hx_node *p = kvp__slab_alloc(&x->mem, sizeof *p);
    if (!p)
        return -1;
    p->v = v;
    p->e = e;
    struct hx_node **b = hx_chain(x, v);
    p->next = *b;
    *b = p;
    x->n++;
    return 0;
}

static void hx_change(struct kvp__lns *ns, int form, struct kvp__key *from, struct kvp__key *to)
{
    struct kvp__hx *x = ns->hx[form];
    const struct kvp__key *k = to ? to : from;
    uint64_t v;
    if (key_hash_of(kvp__key_bytes(k), k->len, form, &v) != 0)
        return;
    if (from) { /* unlinked, or grown into to */
        for (struct hx_node **pp = hx_chain(x, v), *p; (p = *pp) != NULL; pp = &p->next)
            if (p->e == from) {
                if (to) {
                    p->e = to;
                } else {
                    *pp = p->next;
                    kvp__slab_free(&x->mem, p, sizeof *p);
                    x->n--;
                }
                return;
            }
        return;
    }
    if (hx_add(x, v, to) != 0) { /* out of memory: the next query builds it again */
        hx_free(x);
        ns->hx[form] = NULL;
    }
}

void kvp__hx_change(struct kvp__lns *ns, struct kvp__key *from, struct kvp__key *to)
{
    for (int f = 0; f < 2; f++)
        if (ns->hx[f])
            hx_change(ns, f, from, to);
}

/* Builds the index of form from every key entry; -ENOMEM. */
static int hx_build(struct kvp__lns *ns, int form)
{
    struct kvp__hx *x = calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    x->nb = HX_MIN_BUCKETS;
    while (x->nb < ns->nkeys)
        x->nb *= 2; /* sized ahead: the build never grows the table */
    if (!(x->b = kvp__big_zalloc(x->nb * sizeof *x->b))) {
        free(x);
        return -ENOMEM;
    }
    kvp__big_nofork(x->b, x->nb * sizeof *x->b, 1);
    for (int t = 0; t < 2; t++) {
        const struct kvp__bucket *tb = t ? ns->old : ns->buckets;
        uint64_t from = t ? ns->mpos : 0, to = t ? ns->nold : ns->nbuckets;
        for (uint64_t i = from; tb && i < to; i++)
            for (struct kvp__key *e = tb[i].head; e; e = e->next) {
                uint64_t v;
                if (key_hash_of(kvp__key_bytes(e), e->len, form, &v) == 0 && hx_add(x, v, e) != 0) {
                    hx_free(x);
                    return -ENOMEM;
                }
            }
    }
    ns->hx[form] = x;
    return 0;
}

int kvp__hx_lookup(struct kvp__lns *ns, int form, uint64_t v, const uint32_t *slots, size_t nslots,
                   uint8_t *out)
{
    if (!ns->hx[form]) {
        int rc = hx_build(ns, form);
        if (rc)
            return rc;
    }
    struct kvp__hx *x = ns->hx[form];
    for (const struct hx_node *p = *hx_chain(x, v); p; p = p->next)
        if (p->v == v)
            for (size_t j = 0; j < nslots; j++)
                if (slots[j] < p->e->cap && p->e->pages[slots[j]] != KVP_NONE)
                    out[j] = 1;
    return 0;
}
