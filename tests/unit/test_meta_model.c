/*
 * Randomized model test of src/meta: random operations of both dialects
 * (vLLM: complete-key exists/lookup, delete and clear over all ranks; SGLang:
 * per-rank exists/lookup/delete/clear, pools) against a deliberately simple
 * model written here with arrays and linear scans. Every answer, every page
 * owner and every per-rank counter is compared after each operation, and the
 * invariant checker runs after each operation.
 *
 *   test_meta_model [ops] [seed]      (defaults: 100000 ops, seed 1)
 *
 * The model follows the documented policy (docs/protocol-notes.md, "The order
 * of free pages"): one list per rank, the never-used pages ascending, then the
 * freed ones in release order; allocations take from it in the three orders
 * of kvp_meta_allocate_ordered in turn (the default: the most recently freed,
 * then the lowest never used; vLLM's: the front; SGLang's: the back).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "meta/local/meta_int.h"
#include "rng.h"

#define NKEYS 12
#define MAXP 8
#define MAXR 4
#define NNS 2
#define LEASE 1000
#define GRACE 300

static const uint32_t rank_ids[MAXR] = {0, 1, 2, 5};
static char keynames[NKEYS][8];

static uint64_t now;
static uint64_t clock_fn(void *a)
{
    (void)a;
    return now;
}

static uint64_t rng = 1; /* the seed: argv[2] */
static uint32_t rnd(uint32_t n)
{
    return (uint32_t)rng_below(&rng, n);
}

enum { F = 0, R = 1, H = 2 };
struct mpage {
    int state, owner; /* owner: key index when H */
    uint64_t t, seq, rseq;
    uint32_t mark;
};
struct mrank {
    bool init;
    int slot;
    uint32_t num_pages, hwm, ceil, stamp; /* [hwm, ceil): the never-used range */
    struct mpage pg[MAXP];
    int stack[MAXP * 2], nstack; /* freed pages in release order, newest last */
    uint64_t hits, misses, allocs, evictions, expired, release_held;
};
struct mns {
    struct mrank r[MAXR];    /* by index into rank_ids */
    int order[MAXR], nranks; /* rank indices in creation (slot) order */
};
static struct mns model[NNS];
static uint64_t seqc;

static int ridx(uint32_t id)
{
    for (int i = 0; i < MAXR; i++)
        if (rank_ids[i] == id)
            return i;
    return -1;
}

static int mpage_of(struct mrank *r, int key)
{
    for (uint32_t p = 0; p < r->num_pages; p++)
        if (r->pg[p].state == H && r->pg[p].owner == key)
            return (int)p;
    return -1;
}

static int nheld(struct mns *ns, int key)
{
    int n = 0;
    for (int i = 0; i < MAXR; i++)
        if (ns->r[i].init && mpage_of(&ns->r[i], key) >= 0)
            n++;
    return n;
}

static void stack_remove(struct mrank *r, int p)
{
    for (int i = 0; i < r->nstack; i++)
        if (r->stack[i] == p) {
            memmove(&r->stack[i], &r->stack[i + 1], (size_t)(r->nstack - i - 1) * sizeof(int));
            r->nstack--;
            return;
        }
    fprintf(stderr, "model: page %d not on its free stack\n", p);
    abort();
}

static void to_free(struct mrank *r, int p)
{
    r->pg[p].state = F;
    r->pg[p].owner = -1;
    r->pg[p].t = 0;
    if ((uint32_t)p < r->hwm || (uint32_t)p >= r->ceil)
        r->stack[r->nstack++] = p;
}

static void m_reset(struct mrank *r, uint32_t np)
{
    memset(r->pg, 0, sizeof r->pg);
    for (int p = 0; p < MAXP; p++)
        r->pg[p].owner = -1;
    r->num_pages = np;
    r->hwm = 0;
    r->ceil = np;
    r->nstack = 0;
}

static void m_expire(struct mrank *r)
{
    for (;;) {
        int best = -1;
        for (uint32_t p = 0; p < r->num_pages; p++)
            if (r->pg[p].state == R && r->pg[p].t <= now &&
                (best < 0 || r->pg[p].rseq < r->pg[best].rseq))
                best = (int)p;
        if (best < 0)
            return;
        to_free(r, best);
        r->expired++;
    }
}

static int m_lowest_unused(struct mrank *r)
{
    while (r->hwm < r->ceil) {
        int p = (int)r->hwm++;
        if (r->pg[p].state == F)
            return p;
    }
    return -1;
}

static int m_take_free(struct mrank *r, int order)
{
    if (order == KVP_ORDER_VLLM) {
        int p = m_lowest_unused(r);
        if (p < 0 && r->nstack) {
            p = r->stack[0];
            stack_remove(r, p);
        }
        return p;
    }
    if (r->nstack)
        return r->stack[--r->nstack];
    if (order == KVP_ORDER_DEFAULT)
        return m_lowest_unused(r);
    while (r->ceil > r->hwm) {
        int p = (int)--r->ceil;
        if (r->pg[p].state == F)
            return p;
    }
    return -1;
}

static int m_evict(struct mrank *r)
{
    bool done[MAXP] = {0};
    for (;;) { /* least recent first */
        int best = -1;
        for (uint32_t p = 0; p < r->num_pages; p++)
            if (r->pg[p].state == H && !done[p] && (best < 0 || r->pg[p].seq < r->pg[best].seq))
                best = (int)p;
        if (best < 0 || r->pg[best].mark == r->stamp)
            return -1;
        done[best] = true;
        if (r->pg[best].t > now) { /* in its read grace: a use, it moves to the head */
            r->pg[best].seq = ++seqc;
            continue;
        }
        r->pg[best].state = F; /* unlinked, becomes RESERVED by the caller */
        r->pg[best].owner = -1;
        r->evictions++;
        return best;
    }
}

/* ------------------------------------------------------------------ */

static struct kvp_meta *meta;
static struct kvp_ns *nss[NNS];
static const char *pools[NNS] = {"kv", "mamba"};
static long op_no;

#define FAIL_OP(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "op %ld: ", op_no);                                                        \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        CHECK(0);                                                                                  \
        return;                                                                                    \
    } while (0)

static struct kvp_str kstr(int k)
{
    return (struct kvp_str){keynames[k], strlen(keynames[k])};
}

static void op_init(int n)
{
    struct mns *ms = &model[n];
    int ri = (int)rnd(MAXR);
    struct mrank *r = &ms->r[ri];
    uint32_t np = 1 + rnd(MAXP);
    if (r->init && rnd(2))
        np = r->num_pages;
    int want = 0;
    if (!r->init) {
        memset(r, 0, sizeof *r);
        r->init = true;
        r->slot = ms->nranks;
        r->stamp = 1;
        ms->order[ms->nranks++] = ri;
        m_reset(r, np);
    } else if (r->num_pages != np) {
        m_expire(r);
        bool busy = false;
        for (uint32_t p = 0; p < r->num_pages; p++)
            busy |= r->pg[p].state != F;
        if (busy)
            want = -EEXIST;
        else
            m_reset(r, np);
    }
    int rc = kvp_meta_init_rank(nss[n], rank_ids[ri], np, NULL);
    if (rc != want)
        FAIL_OP("init rank %u to %u: rc %d want %d", rank_ids[ri], np, rc, want);
}

static int pick_rank(struct mns *ms, uint32_t *id)
{
    int ri = (int)rnd(MAXR);
    *id = rank_ids[ri];
    return ms->r[ri].init ? ri : -1;
}

/* Draws a count below max, then that many keys (their indices in ks). */
static size_t draw_keys(uint32_t max, int *ks, struct kvp_str *keys)
{
    size_t cnt = rnd(max);
    for (size_t i = 0; i < cnt; i++) {
        ks[i] = (int)rnd(NKEYS);
        keys[i] = kstr(ks[i]);
    }
    return cnt;
}

static void op_allocate(int n)
{
    struct mns *ms = &model[n];
    uint32_t id;
    int ri = pick_rank(ms, &id);
    int ks[8];
    struct kvp_str keys[8];
    size_t cnt = draw_keys(6, ks, keys);
    int64_t got[8], want[8];
    uint8_t ex[8], wex[8];
    static unsigned nalloc; /* the orders in turn, without drawing from rnd */
    int order = (int)(nalloc++ % 3);
    int rc = kvp_meta_allocate_ordered(nss[n], id, order, keys, cnt, got, ex, NULL);
    if (ri < 0) {
        if (rc != -ENOENT)
            FAIL_OP("allocate on uninitialized rank: rc %d", rc);
        return;
    }
    struct mrank *r = &ms->r[ri];
    m_expire(r);
    if (++r->stamp == 0)
        r->stamp = 1;
    for (size_t i = cnt; i-- > 0;) {
        int p = mpage_of(r, ks[i]);
        wex[i] = p >= 0;
        want[i] = p >= 0 ? p : -2;
        if (p >= 0) {
            r->pg[p].seq = ++seqc;
            r->pg[p].mark = r->stamp;
            r->hits++;
        }
    }
    for (size_t i = 0; i < cnt; i++) {
        if (want[i] != -2)
            continue;
        long prev = -1;
        for (size_t j = 0; j < i; j++)
            if (ks[j] == ks[i]) {
                prev = (long)j;
                break;
            }
        if (prev >= 0) {
            want[i] = want[prev];
            continue;
        }
        r->misses++;
        int p = m_take_free(r, order);
        if (p < 0)
            p = m_evict(r);
        if (p < 0) {
            want[i] = -1;
            continue;
        }
        r->pg[p].state = R;
        r->pg[p].t = now + LEASE;
        r->pg[p].rseq = ++seqc;
        r->pg[p].mark = r->stamp;
        r->allocs++;
        want[i] = p;
    }
    if (rc != 0)
        FAIL_OP("allocate rc %d", rc);
    for (size_t i = 0; i < cnt; i++)
        if (got[i] != want[i] || ex[i] != wex[i])
            FAIL_OP("allocate key %zu (%s): got [%d,%" PRId64 "] want [%d,%" PRId64 "]", i,
                    keynames[ks[i]], ex[i], got[i], wex[i], want[i]);
}

static void op_confirm(int n)
{
    struct mns *ms = &model[n];
    uint32_t id;
    int ri = pick_rank(ms, &id);
    size_t cnt = rnd(4), nrel = rnd(3);
    int ks[4];
    struct kvp_str keys[4];
    int64_t pages[4], rel[3];
    uint32_t np = ri >= 0 ? ms->r[ri].num_pages : MAXP;
    bool allow_bad = rnd(8) == 0;
    for (size_t i = 0; i < cnt; i++) {
        ks[i] = (int)rnd(NKEYS);
        keys[i] = kstr(ks[i]);
        pages[i] = allow_bad ? (int64_t)rnd(np + 2) - 1 : (int64_t)rnd(np);
    }
    for (size_t i = 0; i < nrel; i++)
        rel[i] = allow_bad ? (int64_t)rnd(np + 2) - 1 : (int64_t)rnd(np);
    int rc = kvp_meta_confirm(nss[n], id, keys, pages, cnt, rel, nrel, NULL);
    int want = 0;
    if (ri < 0) {
        want = -ENOENT;
    } else {
        struct mrank *r = &ms->r[ri];
        for (size_t i = 0; i < cnt && !want; i++)
            if (pages[i] < 0 || pages[i] >= r->num_pages)
                want = -EINVAL;
        for (size_t i = 0; i < nrel && !want; i++)
            if (rel[i] < 0 || rel[i] >= r->num_pages)
                want = -EINVAL;
        for (size_t i = 0; i < cnt && !want; i++) {
            struct mpage *pg = &r->pg[pages[i]];
            if (pg->state == H && pg->owner != ks[i])
                want = -EEXIST;
            for (size_t j = 0; j < i && !want; j++)
                if (pages[j] == pages[i] && ks[j] != ks[i])
                    want = -EEXIST;
        }
        if (!want) {
            for (size_t i = 0; i < cnt; i++) {
                int p = (int)pages[i];
                struct mpage *pg = &r->pg[p];
                if (pg->state == H)
                    continue;
                if (pg->state == F && ((uint32_t)p < r->hwm || (uint32_t)p >= r->ceil))
                    stack_remove(r, p);
                if (mpage_of(r, ks[i]) >= 0) {
                    to_free(r, p);
                    continue;
                }
                pg->state = H;
                pg->owner = ks[i];
                pg->t = 0;
                pg->seq = ++seqc;
            }
            for (size_t i = 0; i < nrel; i++) {
                struct mpage *pg = &r->pg[rel[i]];
                if (pg->state == R)
                    to_free(r, (int)rel[i]);
                else if (pg->state == H)
                    r->release_held++;
            }
        }
    }
    if (rc != want)
        FAIL_OP("confirm on rank %u: rc %d want %d", id, rc, want);
}

static void op_exists(int n)
{
    struct mns *ms = &model[n];
    bool complete = rnd(2);
    uint32_t id;
    int ri = pick_rank(ms, &id);
    int ks[5];
    struct kvp_str keys[5];
    size_t cnt = draw_keys(5, ks, keys);
    uint8_t got[5];
    int rc = kvp_meta_exists(nss[n], complete ? -1 : (int64_t)id, keys, cnt, got, NULL);
    if (!complete && ri < 0) {
        if (rc != -ENOENT)
            FAIL_OP("exists on uninitialized rank: rc %d", rc);
        return;
    }
    if (rc)
        FAIL_OP("exists rc %d", rc);
    for (size_t i = 0; i < cnt; i++) {
        bool want = complete ? (ms->nranks > 0 && nheld(ms, ks[i]) == ms->nranks)
                             : mpage_of(&ms->r[ri], ks[i]) >= 0;
        if (got[i] != want)
            FAIL_OP("exists(%s, %s) = %d, want %d", complete ? "complete" : "rank", keynames[ks[i]],
                    got[i], want);
    }
}

static void op_lookup(int n)
{
    struct mns *ms = &model[n];
    bool complete = rnd(2);
    uint32_t id;
    int ri = pick_rank(ms, &id);
    int ks[5];
    struct kvp_str keys[5];
    size_t cnt = draw_keys(5, ks, keys);
    int64_t got[5];
    int rc = kvp_meta_lookup(nss[n], id, complete, keys, cnt, got, NULL);
    if (ri < 0) {
        if (rc != -ENOENT)
            FAIL_OP("lookup on uninitialized rank: rc %d", rc);
        return;
    }
    struct mrank *r = &ms->r[ri];
    int64_t want[5];
    for (size_t i = cnt; i-- > 0;) {
        int p = mpage_of(r, ks[i]);
        if (p >= 0 && complete && nheld(ms, ks[i]) != ms->nranks)
            p = -1;
        want[i] = p;
        if (p < 0) {
            r->misses++;
            continue;
        }
        r->hits++;
        r->pg[p].seq = ++seqc;
        r->pg[p].t = now + GRACE;
    }
    if (rc)
        FAIL_OP("lookup rc %d", rc);
    for (size_t i = 0; i < cnt; i++)
        if (got[i] != want[i])
            FAIL_OP("lookup(%s) = %" PRId64 ", want %" PRId64, keynames[ks[i]], got[i], want[i]);
}

static void op_delete(int n)
{
    struct mns *ms = &model[n];
    bool all = rnd(2);
    uint32_t id;
    int ri = pick_rank(ms, &id);
    int ks[3];
    struct kvp_str keys[3];
    size_t cnt = draw_keys(3, ks, keys);
    int rc = kvp_meta_delete(nss[n], all ? -1 : (int64_t)id, keys, cnt, NULL);
    if (!all && ri < 0) {
        if (rc != -ENOENT)
            FAIL_OP("delete on uninitialized rank: rc %d", rc);
        return;
    }
    for (size_t i = 0; i < cnt; i++)
        for (int s = 0; s < ms->nranks; s++) {
            int rj = ms->order[s];
            if (!all && rj != ri)
                continue;
            int p = mpage_of(&ms->r[rj], ks[i]);
            if (p >= 0)
                to_free(&ms->r[rj], p);
        }
    if (rc)
        FAIL_OP("delete rc %d", rc);
}

static void op_clear(int n)
{
    struct mns *ms = &model[n];
    bool all = rnd(2);
    uint32_t id;
    int ri = pick_rank(ms, &id);
    int rc = kvp_meta_clear(nss[n], all ? -1 : (int64_t)id, NULL);
    if (!all && ri < 0) {
        if (rc != -ENOENT)
            FAIL_OP("clear on uninitialized rank: rc %d", rc);
        return;
    }
    for (int i = 0; i < MAXR; i++)
        if (ms->r[i].init && (all || i == ri))
            m_reset(&ms->r[i], ms->r[i].num_pages);
    if (rc)
        FAIL_OP("clear rc %d", rc);
}

/* ------------------------------------------------------------------ comparison */

struct cmp_arg {
    int bad;
};
static int cmp_stats(const char *d, const char *p, const struct kvp_rank_stats *st, size_t nr,
                     void *a)
{
    struct cmp_arg *ca = a;
    int n = !strcmp(p, "kv") ? 0 : 1;
    struct mns *ms = &model[n];
    (void)d;
    if ((int)nr != ms->nranks) {
        fprintf(stderr, "op %ld: %s has %zu ranks, model %d\n", op_no, p, nr, ms->nranks);
        ca->bad = 1;
        return 1;
    }
    for (size_t i = 0; i < nr; i++) {
        int ri = ridx(st[i].rank);
        struct mrank *r = &ms->r[ri];
        m_expire(r); /* stats reclaims expired reservations first */
        uint64_t f = 0, rs = 0, h = 0;
        for (uint32_t q = 0; q < r->num_pages; q++) {
            f += r->pg[q].state == F;
            rs += r->pg[q].state == R;
            h += r->pg[q].state == H;
        }
        uint64_t want[] = {
            r->num_pages,   f, rs, h, h, r->hits, r->misses, r->allocs, r->evictions, r->expired,
            r->release_held};
        uint64_t got[] = {st[i].num_pages,
                          st[i].free,
                          st[i].reserved,
                          st[i].held,
                          st[i].keys,
                          st[i].hits,
                          st[i].misses,
                          st[i].allocations,
                          st[i].evictions,
                          st[i].expired_reservations,
                          st[i].release_of_held_page};
        for (size_t j = 0; j < sizeof want / sizeof want[0]; j++)
            if (want[j] != got[j]) {
                fprintf(stderr,
                        "op %ld: pool %s rank %u figure %zu = %" PRIu64 ", model %" PRIu64 "\n",
                        op_no, p, st[i].rank, j, got[j], want[j]);
                ca->bad = 1;
            }
    }
    return 0;
}

static void compare_all(void)
{
    struct kvp_error e = {0};
    int rc = kvp_meta_check(meta, &e);
    if (rc) {
        fprintf(stderr, "op %ld: invariant: %s\n", op_no, e.msg);
        CHECK(0);
    }
    struct cmp_arg ca = {0};
    kvp_meta_stats(meta, cmp_stats, &ca);
    if (ca.bad)
        CHECK(0);
    for (int n = 0; n < NNS; n++)
        for (int ri = 0; ri < MAXR; ri++) {
            struct mrank *r = &model[n].r[ri];
            for (int k = 0; k < NKEYS; k++) {
                struct kvp_str ks = kstr(k);
                int64_t got = kvp__meta_peek(nss[n], rank_ids[ri], &ks);
                int64_t want = r->init ? mpage_of(r, k) : -2;
                if (got != want) {
                    fprintf(stderr,
                            "op %ld: pool %s rank %u key %s page %" PRId64 ", model %" PRId64 "\n",
                            op_no, pools[n], rank_ids[ri], keynames[k], got, want);
                    CHECK(0);
                    return;
                }
            }
        }
    CHECK(1);
}

int main(int argc, char **argv)
{
    long ops = argc > 1 ? atol(argv[1]) : 100000;
    rng = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    for (int k = 0; k < NKEYS; k++)
        snprintf(keynames[k], sizeof keynames[k], "k%d", k);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = LEASE;
    o.read_grace_ms = GRACE;
    o.clock = clock_fn;
    now = 10000;
    if (kvp_meta_open(&o, &meta))
        return 1;
    for (int n = 0; n < NNS; n++)
        if (kvp_meta_ns(meta, "default", 7, pools[n], strlen(pools[n]), 1, &nss[n], NULL))
            return 1;
    for (op_no = 0; op_no < ops && !check_failed; op_no++) {
        int n = rnd(4) == 0 ? 1 : 0;
        switch (rnd(20)) {
        case 0:
        case 1:
            op_init(n);
            break;
        case 2:
        case 3:
        case 4:
        case 5:
            op_allocate(n);
            break;
        case 6:
        case 7:
        case 8:
        case 9:
            op_confirm(n);
            break;
        case 10:
        case 11:
            op_exists(n);
            break;
        case 12:
        case 13:
        case 14:
            op_lookup(n);
            break;
        case 15:
            op_delete(n);
            break;
        case 16:
            if (rnd(4) == 0)
                op_clear(n);
            break;
        default:
            now += rnd(3) ? rnd(400) : 0;
            break;
        }
        compare_all();
    }
    printf("model test: %ld operations, seed %s\n", op_no, argc > 2 ? argv[2] : "1");
    kvp_meta_close(meta);
    return check_report();
}
