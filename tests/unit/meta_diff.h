/*
 * meta_diff.h — the differential test of a metadata backend, shared by the
 * backends' tests: one long random sequence of operations on mem: and on the
 * backend at LOCATION, comparing every return code, every field of every
 * error, every output, the stats and the invariant check after each step
 * (lease long and read grace 0, so that time does not matter). A backend's
 * test is then
 *
 *     meta_differential("redis://127.0.0.1:6379/0?prefix=t", 2000, 1);
 *
 * It asks for the same answers as mem: gives, to the byte (messages, error
 * fields, stats of every namespace, kvp_meta_check): the redis:// backend
 * meets that, on one server and on a cluster (test_meta_redis.c). The
 * http:// backend does not (yet): its pools are UTF-8 only, its errors carry
 * the server's wording, its stats and check are the server's, so
 * test_http_client.c tests it by its own round trips.
 *
 * Include once, after check.h; it defines static functions and data.
 */
#ifndef KVPAGE_META_DIFF_H
#define KVPAGE_META_DIFF_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "meta_test.h"
#include "rng.h"

/* The backend under test, with the given lease and read grace. */
static struct kvp_meta *diff_open(const char *loc, uint64_t lease, uint64_t grace)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = lease;
    o.read_grace_ms = grace;
    o.timeout_ms = 2000;
    o.connect_timeout_ms = 1000;
    struct kvp_meta *m = NULL;
    struct kvp_error e = {0};
    if (kvp_meta_open_at(loc, &o, &m, &e))
        fprintf(stderr, "open %s: %s\n", loc, e.msg);
    return m;
}

static uint64_t diff_rng = 1;
static uint32_t diff_rnd(uint32_t n)
{
    return (uint32_t)rng_below(&diff_rng, n);
}

#define DKEYS 20
#define DNS 3
#define DRANKS 5
static char dkeys[DKEYS][KVP_MAX_KEY_LEN + 1];
static const uint32_t drank_ids[DRANKS] = {0, 1, 2, 7, 1000};

struct diff_last_alloc { /* per namespace and rank: reservations not yet confirmed or released */
    int key[16];
    int64_t page[16];
    int n;
};

struct diff_stats_copy {
    char text[8192];
    size_t len;
};

static int diff_stats_fn(const char *dep, const char *pool, const struct kvp_rank_stats *r,
                         size_t n, void *arg)
{
    struct diff_stats_copy *s = arg;
    s->len += (size_t)snprintf(s->text + s->len, sizeof s->text - s->len, "[%s|", dep);
    for (const char *p = pool; *p && s->len < sizeof s->text - 4; p++)
        s->len +=
            (size_t)snprintf(s->text + s->len, sizeof s->text - s->len, "%02x", (unsigned char)*p);
    for (size_t i = 0; i < n && s->len < sizeof s->text - 200; i++)
        s->len += (size_t)snprintf(
            s->text + s->len, sizeof s->text - s->len,
            " r%u np%llu f%llu rs%llu h%llu k%llu hit%llu mis%llu al%llu ev%llu ex%llu rh%llu",
            r[i].rank, (unsigned long long)r[i].num_pages, (unsigned long long)r[i].free,
            (unsigned long long)r[i].reserved, (unsigned long long)r[i].held,
            (unsigned long long)r[i].keys, (unsigned long long)r[i].hits,
            (unsigned long long)r[i].misses, (unsigned long long)r[i].allocations,
            (unsigned long long)r[i].evictions, (unsigned long long)r[i].expired_reservations,
            (unsigned long long)r[i].release_of_held_page);
    if (s->len < sizeof s->text - 2)
        s->text[s->len++] = ']';
    s->text[s->len] = '\0';
    return 0;
}

static int diff_evictions_fn(const char *dep, const char *pool, const struct kvp_rank_stats *r,
                             size_t n, void *arg)
{
    (void)dep;
    (void)pool;
    for (size_t i = 0; i < n; i++)
        *(uint64_t *)arg += r[i].evictions;
    return 0;
}

static int diff_failed;
static int diff_rules_seen[32];             /* errors both backends gave, by rule */
static int diff_none_given, diff_hits_seen; /* allocations of -1, and hits */

static void diff_same_err(int step, const char *what, int rc1, const struct kvp_error *e1, int rc2,
                          const struct kvp_error *e2)
{
    int same = rc1 == rc2 && (rc1 == 0 || (e1->code == e2->code && e1->rule == e2->rule &&
                                           e1->index == e2->index && e1->value == e2->value &&
                                           e1->limit == e2->limit && !strcmp(e1->msg, e2->msg)));
    CHECK(same);
    if (same && rc1 && e1->rule >= 0 && e1->rule < 32)
        diff_rules_seen[e1->rule]++;
    if (!same && diff_failed++ < 10)
        fprintf(stderr,
                "step %d %s: mem rc %d rule %d i %lld v %lld l %lld '%s' / redis rc %d rule %d "
                "i %lld v %lld l %lld '%s'\n",
                step, what, rc1, e1->rule, (long long)e1->index, (long long)e1->value,
                (long long)e1->limit, e1->msg, rc2, e2->rule, (long long)e2->index,
                (long long)e2->value, (long long)e2->limit, e2->msg);
}

static void diff_same_i64(int step, const char *what, const int64_t *a, const int64_t *b, size_t n)
{
    int same = !n || !memcmp(a, b, n * sizeof *a);
    CHECK(same);
    if (!same && diff_failed++ < 10) {
        fprintf(stderr, "step %d %s:", step, what);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %lld/%lld", (long long)a[i], (long long)b[i]);
        fprintf(stderr, "\n");
    }
}

static void diff_same_u8(int step, const char *what, const uint8_t *a, const uint8_t *b, size_t n)
{
    int same = !n || !memcmp(a, b, n);
    CHECK(same);
    if (!same && diff_failed++ < 10) {
        fprintf(stderr, "step %d %s:", step, what);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d/%d", a[i], b[i]);
        fprintf(stderr, "\n");
    }
}

/* Runs steps random operations on mem: and on the redis location, comparing. */
static void meta_differential(const char *loc, int steps, uint64_t seed)
{
    diff_rng = seed;
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = 3600 * 1000;
    o.read_grace_ms = 0;
    struct kvp_meta *mm = NULL, *rm = diff_open(loc, o.lease_ms, 0);
    CHECK_EQ(kvp_meta_open_at("mem:", &o, &mm, NULL), 0);
    CHECK(rm != NULL);
    if (!mm || !rm) {
        kvp_meta_close(mm);
        kvp_meta_close(rm);
        return;
    }
    static const char *const pools[DNS] = {"p0", "pool/with:{braces}", "\xff\xfe bytes"};
    static const char *const deps[DNS] = {"d", "d", "dep-2.x"};
    struct kvp_ns *mns[DNS], *rns[DNS];
    struct diff_last_alloc last[DNS][DRANKS];
    memset(last, 0, sizeof last);
    for (int i = 0; i < DNS; i++) {
        mns[i] = ns_of(mm, deps[i], pools[i]);
        rns[i] = ns_of(rm, deps[i], pools[i]);
        CHECK(mns[i] && rns[i]);
        if (!mns[i] || !rns[i])
            goto out;
    }
    for (int i = 0; i < DKEYS; i++)
        snprintf(dkeys[i], sizeof dkeys[i], "key-%d", i);
    /* Keys are bytes: braces (no hash tag of ours), high bytes, the longest. */
    snprintf(dkeys[3], sizeof dkeys[3], "{k3}\xff\x01 \"%%s");
    memset(dkeys[DKEYS - 1], 'L', KVP_MAX_KEY_LEN);
    dkeys[DKEYS - 1][KVP_MAX_KEY_LEN] = '\0';
    for (int step = 0; step < steps && diff_failed < 10; step++) {
        int x = (int)diff_rnd(DNS), ri = (int)diff_rnd(DRANKS);
        uint32_t rank = drank_ids[ri];
        struct kvp_ns *a = mns[x], *b = rns[x];
        struct kvp_error e1 = {0}, e2 = {0};
        int rc1 = 0, rc2 = 0;
        uint32_t op = diff_rnd(100);
        struct kvp_str keys[8];
        int kidx[8];
        size_t n = 1 + diff_rnd(6);
        for (size_t i = 0; i < n; i++) {
            /* a few keys often, so that hits, duplicates and evictions happen */
            kidx[i] = (int)(diff_rnd(3) ? diff_rnd(8) : diff_rnd(DKEYS));
            keys[i] = K(dkeys[kidx[i]]);
        }
        if (op < 8) {
            uint64_t np = 1 + diff_rnd(8);
            rc1 = kvp_meta_init_rank(a, rank, np, &e1);
            rc2 = kvp_meta_init_rank(b, rank, np, &e2);
            diff_same_err(step, "init", rc1, &e1, rc2, &e2);
        } else if (op < 33) {
            int64_t p1[8], p2[8];
            uint8_t x1[8], x2[8];
            /* every page order (enum kvp_page_order), from the step so that
             * the sequence of random operations stays what it was */
            int order = (int)((uint32_t)step * 2654435761u >> 16) % 3;
            rc1 = kvp_meta_allocate_ordered(a, rank, order, keys, n, p1, x1, &e1);
            rc2 = kvp_meta_allocate_ordered(b, rank, order, keys, n, p2, x2, &e2);
            diff_same_err(step, "allocate", rc1, &e1, rc2, &e2);
            if (!rc1 && !rc2) {
                diff_same_i64(step, "allocate pages", p1, p2, n);
                diff_same_u8(step, "allocate existed", x1, x2, n);
                struct diff_last_alloc *l = &last[x][ri];
                for (size_t i = 0; i < n; i++) {
                    if (p1[i] >= 0 && !x1[i]) {
                        if (l->n == 16) /* the oldest is forgotten */
                            memmove(l->key, l->key + 1, 15 * sizeof *l->key),
                                memmove(l->page, l->page + 1, 15 * sizeof *l->page), l->n--;
                        l->key[l->n] = kidx[i], l->page[l->n++] = p1[i];
                    }
                    diff_none_given += p1[i] == -1;
                    diff_hits_seen += x1[i];
                }
            }
        } else if (op < 60) {
            struct diff_last_alloc *l = &last[x][ri];
            int64_t pages[8], rel[8];
            size_t nc = 0, nr = 0;
            while (l->n > 0 && nc + nr < 6) {
                l->n--;
                if (diff_rnd(10) < 6) {
                    keys[nc] = K(dkeys[l->key[l->n]]);
                    pages[nc++] = l->page[l->n];
                } else {
                    rel[nr++] = l->page[l->n];
                }
            }
            uint32_t twist = diff_rnd(12);
            if (twist == 0 && nc < 8) { /* a page of another key, or out of range */
                keys[nc] = K(dkeys[diff_rnd(DKEYS)]);
                pages[nc++] = (int64_t)diff_rnd(8) - (diff_rnd(4) == 0 ? 3 : 0);
            } else if (twist == 1 && nr < 8) {
                rel[nr++] = (int64_t)diff_rnd(9) - 1;
            } else if (twist == 2 && nc > 0 && nc < 8) { /* one page for two keys */
                keys[nc] = K(dkeys[diff_rnd(DKEYS)]);
                pages[nc] = pages[0];
                nc++;
            } else if (twist == 3 && nc < 8) {
                keys[nc] = K(dkeys[diff_rnd(DKEYS)]);
                pages[nc++] = diff_rnd(2) ? INT64_MAX : 2147483647;
            }
            /* Every other confirmation names parents (each key's the one
             * before it) and some tokens, from the step (the random sequence
             * stays what it was): over Redis they are kept with the key and
             * dropped with it, which the invariant check below checks. */
            struct kvp_str par[8];
            uint32_t ntok[8], tk[3] = {(uint32_t)step, 1, 7};
            const uint32_t *tok[8];
            for (size_t i = 0; i < nc; i++) {
                par[i] = i ? keys[i - 1] : (struct kvp_str){NULL, 0};
                ntok[i] = (uint32_t)(i + (size_t)step / 2) % 4 % 3;
                tok[i] = ntok[i] ? tk : NULL;
            }
            struct kvp_confirm_opts co = {.opts_size = sizeof co,
                                          .parents = step % 4 == 1 ? NULL : par,
                                          .token_ids = step % 4 == 3 ? NULL : tok,
                                          .ntokens = step % 4 == 3 ? NULL : ntok};
            const struct kvp_confirm_opts *cop = step % 2 ? &co : NULL;
            rc1 = kvp_meta_confirm_ex(a, rank, keys, pages, nc, rel, nr, cop, &e1);
            rc2 = kvp_meta_confirm_ex(b, rank, keys, pages, nc, rel, nr, cop, &e2);
            diff_same_err(step, "confirm", rc1, &e1, rc2, &e2);
        } else if (op < 72) {
            int64_t r = diff_rnd(3) ? (int64_t)rank : -1;
            uint8_t x1[8], x2[8];
            rc1 = kvp_meta_exists(a, r, keys, n, x1, &e1);
            rc2 = kvp_meta_exists(b, r, keys, n, x2, &e2);
            diff_same_err(step, "exists", rc1, &e1, rc2, &e2);
            if (!rc1 && !rc2)
                diff_same_u8(step, "exists out", x1, x2, n);
        } else if (op < 87) {
            int co = (int)diff_rnd(2);
            int64_t p1[8], p2[8];
            rc1 = kvp_meta_lookup(a, rank, co, keys, n, p1, &e1);
            rc2 = kvp_meta_lookup(b, rank, co, keys, n, p2, &e2);
            diff_same_err(step, "lookup", rc1, &e1, rc2, &e2);
            if (!rc1 && !rc2)
                diff_same_i64(step, "lookup pages", p1, p2, n);
        } else if (op < 96) {
            int64_t r = diff_rnd(2) ? (int64_t)rank : -1;
            rc1 = kvp_meta_delete(a, r, keys, n, &e1);
            rc2 = kvp_meta_delete(b, r, keys, n, &e2);
            diff_same_err(step, "delete", rc1, &e1, rc2, &e2);
        } else {
            int64_t r = diff_rnd(3) ? (int64_t)rank : -1;
            rc1 = kvp_meta_clear(a, r, &e1);
            rc2 = kvp_meta_clear(b, r, &e2);
            diff_same_err(step, "clear", rc1, &e1, rc2, &e2);
        }
        CHECK_EQ(kvp_meta_nranks(a), kvp_meta_nranks(b));
        static struct diff_stats_copy s1, s2;
        s1.len = s2.len = 0;
        s1.text[0] = s2.text[0] = '\0';
        CHECK_EQ(kvp_meta_stats(mm, diff_stats_fn, &s1), 0);
        CHECK_EQ(kvp_meta_stats(rm, diff_stats_fn, &s2), 0);
        int same = !strcmp(s1.text, s2.text);
        CHECK(same);
        if (!same && diff_failed++ < 10)
            fprintf(stderr, "step %d stats:\n mem   %s\n redis %s\n", step, s1.text, s2.text);
        invariants(mm);
        invariants(rm);
    }
    /* The run met every rule it can break, evictions and exhaustion. */
    static const int rules[] = {KVP_RULE_RANK_NOT_INIT, KVP_RULE_RESIZE_HELD, KVP_RULE_CONFIRM_PAGE,
                                KVP_RULE_RELEASE_PAGE, KVP_RULE_HELD_BY_OTHER};
    printf("differential: errors not_init %d resize %d confirm_page %d release_page %d "
           "held_by_other %d; %d hits, %d allocations of -1\n",
           diff_rules_seen[rules[0]], diff_rules_seen[rules[1]], diff_rules_seen[rules[2]],
           diff_rules_seen[rules[3]], diff_rules_seen[rules[4]], diff_hits_seen, diff_none_given);
    uint64_t ev = 0;
    CHECK_EQ(kvp_meta_stats(mm, diff_evictions_fn, &ev), 0);
    printf("differential: %llu evictions\n", (unsigned long long)ev);
    if (steps >= 500) {
        for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
            CHECK(diff_rules_seen[rules[i]] > 0);
        CHECK(diff_hits_seen > 0 && diff_none_given > 0 && ev > 0);
    }
    memset(diff_rules_seen, 0, sizeof diff_rules_seen);
    diff_none_given = diff_hits_seen = 0;
out:
    kvp_meta_close(mm);
    kvp_meta_close(rm);
}

#endif
