/*
 * Pins of the in-process engine (issue 38 §3) and its query by the engines'
 * event hashes (§2). A pin holds a key of a namespace for a time: eviction
 * (evict() in local.c) passes over the key's pages until the pin's deadline.
 * Pins are counted: each kvp_meta_pin adds one and moves the deadline to the
 * later of the two, each kvp_meta_unpin takes one away, and the pin ends at
 * zero or at its deadline, whichever comes first (LMCache's /cache/pins are
 * reference-counted the same way). Delete and clear still remove a pinned
 * key: a pin protects against eviction only.
 *
 * The pins of a namespace are a small hash table of key bytes (struct
 * kvp__pins), guarded by the namespace lock; pins that ended are dropped
 * lazily (prune). They survive a restart in the data directory's file PINS,
 * rewritten whole (a temporary file, fsync, rename) after every change:
 * pins are few and change rarely, unlike pages, so they stay out of the log.
 * Its deadlines are wall-clock times, as the engine's clock restarts with
 * the process.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "meta/local/meta_int.h"
#include "meta/rules.h"
#include "util/hex.h"
#include "util/seed.h"

#define set_err kvp__set_err

struct pin {
    struct pin *next;
    uint64_t h;
    uint64_t deadline; /* ms, the engine's clock (opts.clock) */
    uint32_t count;
    uint16_t len;
    char key[];
};

struct kvp__pins {
    struct pin **b;
    uint64_t nb; /* buckets: a power of two */
    uint64_t n;  /* entries, ended ones included until pruned */
};

/* One writer of PINS files at a time (rarely contended: pins are rare). */
static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ms(const struct kvp__local *m)
{
    return m->opts.clock(m->opts.clock_arg);
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct pin **pin_slot(struct kvp__pins *t, const char *k, size_t len, uint64_t h)
{
    struct pin **pp = &t->b[h & (t->nb - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->h == h && (*pp)->len == len && !memcmp((*pp)->key, k, len))
            return pp;
    return pp;
}

static struct pin *pin_find(struct kvp__pins *t, const char *k, size_t len)
{
    if (!t || !t->n)
        return NULL;
    return *pin_slot(t, k, len, XXH3_64bits_withSeed(k, len, kvp__hash_seed()));
}

/* Removes the pins that ended (deadline passed or count 0). */
static void prune(struct kvp__pins *t, uint64_t now)
{
    if (!t)
        return;
    for (uint64_t i = 0; i < t->nb && t->n; i++)
        for (struct pin **pp = &t->b[i]; *pp;) {
            struct pin *p = *pp;
            if (p->deadline > now && p->count) {
                pp = &p->next;
                continue;
            }
            *pp = p->next;
            free(p);
            t->n--;
        }
}

/* Room for n entries at a load of at most one per bucket: 0 or -ENOMEM. */
static int reserve(struct kvp__lns *ns, uint64_t n)
{
    struct kvp__pins *t = ns->pins;
    if (!t) {
        if (!(t = calloc(1, sizeof *t)))
            return -ENOMEM;
        ns->pins = t;
    }
    uint64_t nb = t->nb ? t->nb : 64;
    while (nb < n)
        nb *= 2;
    if (nb == t->nb)
        return 0;
    struct pin **b = calloc(nb, sizeof *b);
    if (!b)
        return -ENOMEM;
    for (uint64_t i = 0; i < t->nb; i++)
        for (struct pin *p = t->b[i], *nx; p; p = nx) {
            nx = p->next;
            p->next = b[p->h & (nb - 1)];
            b[p->h & (nb - 1)] = p;
        }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return 0;
}

/* A new pin (count 0), not linked: NULL when out of memory. */
static struct pin *pin_new(const char *k, size_t len, uint64_t h)
{
    struct pin *p = calloc(1, sizeof *p + len);
    if (p) {
        p->h = h;
        p->len = (uint16_t)len;
        memcpy(p->key, k, len);
    }
    return p;
}

static void pin_link(struct kvp__pins *t, struct pin *p)
{
    struct pin **pp = &t->b[p->h & (t->nb - 1)];
    p->next = *pp;
    *pp = p;
    t->n++;
}

void kvp__pins_free(struct kvp__lns *ns)
{
    struct kvp__pins *t = ns->pins;
    if (!t)
        return;
    for (uint64_t i = 0; i < t->nb; i++)
        for (struct pin *p = t->b[i], *nx; p; p = nx) {
            nx = p->next;
            free(p);
        }
    free(t->b);
    free(t);
    ns->pins = NULL;
}

int kvp__pin_active(struct kvp__lns *ns, const struct kvp__key *e, uint64_t now)
{
    if (!ns->pins || !ns->pins->n)
        return 0;
    const struct pin *p = pin_find(ns->pins, kvp__key_bytes(e), e->len);
    return p && p->count && p->deadline > now;
}

/* ---------------------------------------------------------------- file */

/* Writes every namespace's pins to DIR/PINS (through PINS.tmp): 0 or -errno. */
static int save(struct kvp__local *m)
{
    const char *dir = m->opts.data_dir;
    if (!dir || m->opts.readonly)
        return 0;
    char path[4096], tmp[4096];
    if (snprintf(path, sizeof path, "%s/PINS", dir) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/PINS.tmp", dir) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    pthread_mutex_lock(&file_lock);
    int rc = 0;
    FILE *f = fopen(tmp, "we");
    if (!f) {
        rc = -errno;
        goto out;
    }
    fputs("kvpage-pins 1\n", f);
    uint64_t wall = wall_ms();
    pthread_rwlock_rdlock(&m->ns_lock);
    for (struct kvp__lns *ns = m->ns_first; ns; ns = ns->next_all) {
        pthread_mutex_lock(&ns->lock);
        uint64_t now = now_ms(m);
        struct kvp__pins *t = ns->pins;
        for (uint64_t i = 0; t && i < t->nb; i++)
            for (const struct pin *p = t->b[i]; p; p = p->next) {
                if (!p->count || p->deadline <= now)
                    continue;
                /* deadline, count, then deployment, pool and key in hex */
                fprintf(f, "%" PRIu64 " %" PRIu32 " ", wall + (p->deadline - now), p->count);
                for (const char *s = ns->deployment; *s; s++)
                    fprintf(f, "%02x", (unsigned char)*s);
                fputc(' ', f);
                for (const char *s = ns->pool; *s; s++)
                    fprintf(f, "%02x", (unsigned char)*s);
                fputc(' ', f);
                for (size_t k = 0; k < p->len; k++)
                    fprintf(f, "%02x", (unsigned char)p->key[k]);
                fputc('\n', f);
            }
        pthread_mutex_unlock(&ns->lock);
    }
    pthread_rwlock_unlock(&m->ns_lock);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        rc = -errno;
    if (fclose(f) != 0 && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path) != 0)
        rc = -errno;
    if (!rc) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            if (fsync(dfd) != 0)
                rc = -errno;
            close(dfd);
        }
    }
    if (rc)
        unlink(tmp);
out:
    pthread_mutex_unlock(&file_lock);
    return rc;
}

/* Decodes the hex field s (NUL- or space-ended) into out (at most cap bytes). */
static ptrdiff_t unhex(const char *s, char *out, size_t cap, const char **end)
{
    size_t n = 0;
    while (*s && *s != ' ' && *s != '\n') {
        int hi = kvp__hex_value(s[0]), lo = s[1] ? kvp__hex_value(s[1]) : -1;
        if (hi < 0 || lo < 0 || n == cap)
            return -1;
        out[n++] = (char)(hi << 4 | lo);
        s += 2;
    }
    *end = s;
    return (ptrdiff_t)n;
}

/* Brings back the pins of DIR/PINS after recovery; lines that do not parse,
 * name a namespace that is gone or a pin that ended meanwhile are skipped. */
void kvp__pins_load(struct kvp__local *m)
{
    char path[4096];
    if (!m->opts.data_dir ||
        snprintf(path, sizeof path, "%s/PINS", m->opts.data_dir) >= (int)sizeof path)
        return;
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    uint64_t wall = wall_ms();
    if (getline(&line, &cap, f) > 0 && !strcmp(line, "kvpage-pins 1\n")) {
        while (getline(&line, &cap, f) > 0) {
            uint64_t until;
            uint32_t count;
            int off = 0;
            char dep[KVP_MAX_NAME_LEN], pool[KVP_MAX_NAME_LEN], key[KVP_MAX_KEY_LEN];
            const char *s;
            if (sscanf(line, "%" SCNu64 " %" SCNu32 " %n", &until, &count, &off) != 2 || !off)
                continue;
            ptrdiff_t dl = unhex(line + off, dep, sizeof dep, &s), pl = -1, kl = -1;
            if (dl > 0 && *s == ' ')
                pl = unhex(s + 1, pool, sizeof pool, &s);
            if (pl >= 0 && *s == ' ')
                kl = unhex(s + 1, key, sizeof key, &s);
            if (kl <= 0 || !count || until <= wall)
                continue;
            struct kvp_ns *pub = NULL;
            uint64_t ticket = 0;
            struct kvp_error err = {0};
            if (m->front->ops->ns(m->front, dep, (size_t)dl, pool, (size_t)pl, 0, &pub, &ticket,
                                  &err) != 0)
                continue;
            struct kvp__lns *ns = (struct kvp__lns *)pub;
            pthread_mutex_lock(&ns->lock);
            uint64_t h = XXH3_64bits_withSeed(key, (size_t)kl, kvp__hash_seed());
            struct pin *p;
            if (reserve(ns, (ns->pins ? ns->pins->n : 0) + 1) == 0 &&
                !pin_find(ns->pins, key, (size_t)kl) && (p = pin_new(key, (size_t)kl, h))) {
                p->count = count;
                p->deadline = now_ms(m) + (until - wall);
                pin_link(ns->pins, p);
            }
            pthread_mutex_unlock(&ns->lock);
        }
    }
    free(line);
    fclose(f);
}

/* ---------------------------------------------------------------- operations */

/* The smallest rank of the namespace (NULL: none). */
static const struct kvp__rank *smallest_rank(const struct kvp__lns *ns)
{
    const struct kvp__rank *min = NULL;
    for (uint32_t i = 0; i < ns->nranks; i++)
        if (!min || ns->by_id[i]->num_pages < min->num_pages)
            min = ns->by_id[i];
    return min;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int kvp__lo_pin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    struct kvp__local *m = ns->meta;
    if (m->opts.readonly) {
        set_err(err, -EROFS, KVP_RULE_ARG, -1, 0, 0, "the state is open read-only");
        return -EROFS;
    }
    /* The keys' hashes, sorted with their index, find a batch's duplicates. */
    uint64_t *h = malloc((n ? n : 1) * sizeof *h);
    uint64_t *order = malloc((n ? n : 1) * 2 * sizeof *order);
    struct pin **fresh = calloc(n ? n : 1, sizeof *fresh);
    int rc = 0;
    if (!h || !order || !fresh) {
        rc = -ENOMEM;
        kvp__err_oom(err, rc);
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = XXH3_64bits_withSeed(keys[i].ptr, keys[i].len, kvp__hash_seed());
    pthread_mutex_lock(&ns->lock);
    const struct kvp__rank *small = smallest_rank(ns);
    if (!small) {
        rc = -ENOENT;
        set_err(err, rc, KVP_RULE_RANK_NOT_INIT, -1, 0, 0,
                "the namespace has no initialized rank: nothing to pin");
        goto unlock;
    }
    uint64_t now = now_ms(m);
    prune(ns->pins, now);
    uint64_t have = ns->pins ? ns->pins->n : 0;
    uint64_t lim = (uint64_t)(max_ratio * (double)small->num_pages);
    /* New keys: not pinned yet, and the first of their duplicates. */
    size_t nnew = 0;
    for (size_t i = 0; i < n; i++) {
        if (pin_find(ns->pins, keys[i].ptr, keys[i].len))
            continue;
        order[2 * nnew] = h[i];
        order[2 * nnew + 1] = i;
        nnew++;
    }
    qsort(order, nnew, 2 * sizeof *order, cmp_u64); /* by hash, then index: duplicates adjacent */
    size_t distinct = 0;
    for (size_t a = 0; a < nnew; a++) {
        size_t i = (size_t)order[2 * a + 1], dup = 0;
        for (size_t b = a; b-- > 0 && order[2 * b] == order[2 * a];) {
            size_t j = (size_t)order[2 * b + 1];
            if (keys[j].len == keys[i].len && !memcmp(keys[j].ptr, keys[i].ptr, keys[i].len))
                dup = 1;
        }
        if (!dup) {
            fresh[i] = (struct pin *)1; /* marked; allocated below */
            distinct++;
        }
    }
    *limit = lim;
    *total = have;
    if (have + distinct > lim) {
        rc = kvp__err_pin_limit(err, distinct, have + distinct, lim, max_ratio, small->id,
                                small->num_pages);
        goto unlock;
    }
    if (reserve(ns, have + distinct) != 0)
        rc = -ENOMEM;
    for (size_t i = 0; i < n && !rc; i++)
        if (fresh[i] && !(fresh[i] = pin_new(keys[i].ptr, keys[i].len, h[i])))
            rc = -ENOMEM;
    if (rc) {
        for (size_t i = 0; i < n; i++)
            if (fresh[i] != (struct pin *)1)
                free(fresh[i]);
        kvp__err_oom(err, rc);
        goto unlock;
    }
    /* Everything checked and allocated: now act. */
    uint64_t until = now + ttl_ms;
    for (size_t i = 0; i < n; i++) {
        struct pin *p = fresh[i];
        if (p)
            pin_link(ns->pins, p);
        else
            p = pin_find(ns->pins, keys[i].ptr, keys[i].len);
        if (p->count < UINT32_MAX)
            p->count++;
        if (p->deadline < until)
            p->deadline = until;
    }
    *total = ns->pins->n;
unlock:
    pthread_mutex_unlock(&ns->lock);
    if (!rc && (rc = save(m)) != 0)
        set_err(err, rc, KVP_RULE_IO, -1, 0, 0,
                "pinned in memory, but cannot write %.160s/PINS: %s", m->opts.data_dir,
                kvp_strerror(rc));
done:
    free(h);
    free(order);
    free(fresh);
    return rc;
}

int kvp__lo_unpin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t *released,
                  struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    struct kvp__local *m = ns->meta;
    if (m->opts.readonly) {
        set_err(err, -EROFS, KVP_RULE_ARG, -1, 0, 0, "the state is open read-only");
        return -EROFS;
    }
    uint64_t done = 0;
    pthread_mutex_lock(&ns->lock);
    prune(ns->pins, now_ms(m));
    for (size_t i = 0; i < n && ns->pins && ns->pins->n; i++) {
        struct pin *p = pin_find(ns->pins, keys[i].ptr, keys[i].len);
        if (p && p->count) {
            p->count--; /* pruned below at 0 */
            done++;
        }
    }
    prune(ns->pins, now_ms(m));
    pthread_mutex_unlock(&ns->lock);
    *released = done;
    int rc = done ? save(m) : 0;
    if (rc)
        set_err(err, rc, KVP_RULE_IO, -1, 0, 0,
                "unpinned in memory, but cannot write %.160s/PINS: %s", m->opts.data_dir,
                kvp_strerror(rc));
    return rc;
}

int kvp__lo_pinned(struct kvp_ns *pub, int64_t rank, uint64_t *keys, uint64_t *refs,
                   struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    int rc = 0;
    uint64_t nk = 0, nr = 0;
    pthread_mutex_lock(&ns->lock);
    const struct kvp__rank *r = rank >= 0 ? kvp__rank_of(ns, (uint32_t)rank) : NULL;
    if (rank >= 0 && !r) {
        rc = -ENOENT;
        kvp__err_rank_not_init(err, rank);
    }
    uint64_t now = now_ms(ns->meta);
    struct kvp__pins *t = ns->pins;
    for (uint64_t i = 0; !rc && t && i < t->nb; i++)
        for (const struct pin *p = t->b[i]; p; p = p->next) {
            if (!p->count || p->deadline <= now)
                continue;
            struct kvp_str k = {p->key, p->len};
            if (r && kvp__key_page_locked(ns, r, &k) == KVP_NONE)
                continue;
            nk++;
            nr += p->count;
        }
    pthread_mutex_unlock(&ns->lock);
    if (keys)
        *keys = nk;
    if (refs)
        *refs = nr;
    return rc;
}

int kvp__lo_exists_hashes(struct kvp_ns *pub, const uint64_t *hashes, size_t n, int form,
                          const uint32_t *ranks, size_t nranks, uint8_t *out, struct kvp_error *err)
{
    struct kvp__lns *ns = (struct kvp__lns *)pub;
    uint32_t lslots[16], *slots = lslots;
    if (nranks > 16 && !(slots = malloc(nranks * sizeof *slots))) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    memset(out, 0, n * nranks);
    int rc = 0;
    pthread_mutex_lock(&ns->lock);
    for (size_t j = 0; j < nranks && !rc; j++) {
        const struct kvp__rank *r = kvp__rank_of(ns, ranks[j]);
        if (!r) {
            rc = -ENOENT;
            kvp__err_rank_not_init(err, ranks[j]);
        } else {
            slots[j] = r->slot;
        }
    }
    /* Each hash is one lookup in the index of block hashes (hashidx.c),
     * built on the first query. */
    for (size_t i = 0; i < n && nranks && !rc; i++)
        if ((rc = kvp__hx_lookup(ns, form, hashes[i], slots, nranks, out + i * nranks)) != 0)
            kvp__err_oom(err, rc);
    pthread_mutex_unlock(&ns->lock);
    if (slots != lslots)
        free(slots);
    return rc;
}
