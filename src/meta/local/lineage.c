/*
 * The lineages the in-process engine keeps (struct kvp__lin, meta_int.h):
 * per namespace, a table from a key entry to the parent key and tokens its
 * last accepted confirmation named. A namespace whose confirmations name
 * none never allocates it, and its key index pays one test per dropped or
 * grown entry (kvp__lin_note).
 *
 * Open addressing on the entry's address, linear probing, deletion by
 * shifting the probe run back (no tombstones), at most half full. Guarded
 * by the namespace's lock. A snapshot thread reads a copy of the table made
 * with the locks held (local_persist.c); the lineages the copy points at
 * are kept until the snapshot is written, as the key entries are.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/local/meta_int.h"

static uint64_t home(const struct kvp__lintab *t, const struct kvp__key *k)
{
    uint64_t h = (uint64_t)(uintptr_t)k * 0x9E3779B97F4A7C15ull;
    return (h ^ h >> 29) & (t->cap - 1);
}

/* The slot of k, or of the free slot where it would go. */
static uint64_t slot_of(const struct kvp__lintab *t, const struct kvp__key *k)
{
    uint64_t i = home(t, k);
    while (t->v[i].key && t->v[i].key != k)
        i = (i + 1) & (t->cap - 1);
    return i;
}

struct kvp__lin *kvp__lin_get(const struct kvp__lintab *t, const struct kvp__key *e)
{
    if (!t->n)
        return NULL;
    const struct kvp__linent *s = &t->v[slot_of(t, e)];
    return s->key ? s->lin : NULL;
}

int kvp__lin_reserve(struct kvp__lns *ns, uint64_t more)
{
    struct kvp__lintab *t = &ns->lins;
    if (2 * (t->n + more) <= t->cap)
        return 0;
    uint64_t cap = t->cap ? t->cap : 64;
    while (2 * (t->n + more) > cap)
        cap *= 2;
    struct kvp__lintab g = {calloc(cap, sizeof *g.v), cap, t->n};
    if (!g.v)
        return -ENOMEM;
    for (uint64_t i = 0; i < t->cap; i++)
        if (t->v[i].key)
            g.v[slot_of(&g, t->v[i].key)] = t->v[i];
    free(t->v);
    *t = g;
    return 0;
}

void kvp__lin_free(struct kvp__lns *ns, struct kvp__lin *l)
{
    if (l && ns->keep_keys) {
        l->next_kept = ns->kept_lin;
        ns->kept_lin = l;
    } else {
        free(l);
    }
}

void kvp__lin_set(struct kvp__lns *ns, const struct kvp__key *e, struct kvp__lin *l)
{
    struct kvp__lintab *t = &ns->lins;
    struct kvp__linent *s = &t->v[slot_of(t, e)];
    if (s->key) {
        kvp__lin_free(ns, s->lin);
    } else {
        s->key = e;
        t->n++;
    }
    s->lin = l;
}

/* Empties slot i, moving back the entries after it whose probe passed it. */
static void unslot(struct kvp__lintab *t, uint64_t i)
{
    uint64_t mask = t->cap - 1;
    for (uint64_t j = i;;) {
        j = (j + 1) & mask;
        if (!t->v[j].key)
            break;
        uint64_t k = home(t, t->v[j].key);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue; /* its home is after the hole: it stays */
        t->v[i] = t->v[j];
        i = j;
    }
    t->v[i] = (struct kvp__linent){NULL, NULL};
    t->n--;
}

void kvp__lin_change(struct kvp__lns *ns, const struct kvp__key *from, const struct kvp__key *to)
{
    struct kvp__lintab *t = &ns->lins;
    uint64_t i = slot_of(t, from);
    if (!t->v[i].key)
        return;
    struct kvp__lin *l = t->v[i].lin;
    unslot(t, i);
    if (to) /* a grown entry: the room of the one it replaces */
        kvp__lin_set(ns, to, l);
    else
        kvp__lin_free(ns, l);
}

void kvp__lin_drop_all(struct kvp__lns *ns)
{
    struct kvp__lintab *t = &ns->lins;
    for (uint64_t i = 0; i < t->cap; i++)
        if (t->v[i].key)
            kvp__lin_free(ns, t->v[i].lin);
    free(t->v);
    *t = (struct kvp__lintab){0};
}
