/*
 * kvp_meta_watch and kvp_meta_inventory (kvpage serve --kv-events): every
 * page a key gets or loses is told, in order, with the end of each
 * operation; the inventory is every held page; the other backends say
 * -EOPNOTSUPP.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "meta/local/meta_int.h"
#include "meta_test.h"

/* What the watcher was told: "+key@rank", "-key@rank" and "|" (an
 * operation's end), concatenated. */
static char told[4096];

static void watch(const struct kvp_meta_change *c, void *arg)
{
    CHECK(arg == told);
    size_t n = strlen(told);
    if (!c) {
        snprintf(told + n, sizeof told - n, "|");
        return;
    }
    CHECK(c->ns != NULL && c->deployment && c->pool);
    snprintf(told + n, sizeof told - n, "%c%.*s@%u", c->kind == KVP_CHANGE_STORED ? '+' : '-',
             (int)c->len, c->key, c->rank);
    /* What kvp_meta_confirm_ex told of a stored page: "<parent>" and "[t,t]". */
    CHECK(KVP_CHANGE_HAS(c, ntokens) && c->size == sizeof *c);
    CHECK(!c->parent == !c->parent_len && !c->token_ids == !c->ntokens);
    CHECK(c->kind == KVP_CHANGE_STORED || (!c->parent && !c->token_ids));
    n = strlen(told);
    if (c->parent)
        snprintf(told + n, sizeof told - n, "<%.*s>", (int)c->parent_len, c->parent);
    for (size_t i = 0; i < c->ntokens; i++) {
        n = strlen(told);
        snprintf(told + n, sizeof told - n, "%c%u", i ? ',' : '[', c->token_ids[i]);
    }
    if (c->ntokens)
        snprintf(told + strlen(told), sizeof told - strlen(told), "]");
}

static void inventory(const struct kvp_meta_change *c, void *arg)
{
    CHECK_EQ(c->kind, KVP_CHANGE_STORED);
    size_t n = strlen(arg);
    snprintf((char *)arg + n, 4096 - n, "%s/%s:%.*s@%u ", c->deployment, c->pool, (int)c->len,
             c->key, c->rank);
}

/* told since the last call, then forgotten. */
static const char *take(void)
{
    static char last[4096];
    snprintf(last, sizeof last, "%s", told);
    told[0] = 0;
    return last;
}

#define TOLD(want)                                                                                 \
    do {                                                                                           \
        const char *got_ = take();                                                                 \
        if (strcmp(got_, want)) {                                                                  \
            fprintf(stderr, "told \"%s\", expected \"%s\"\n", got_, want);                         \
            CHECK(0);                                                                              \
        }                                                                                          \
    } while (0)

/*
 * What is kept of a key's lineage (namespace d/kv, rank 0 of 8 pages holding
 * x<w>[1,2] y<x> z[5,6] v<w> u): the latest accepted confirmation that
 * names one wins; one that names none or loses changes nothing; it goes
 * with the key (eviction, delete, clear).
 */
static void test_lineage_kept(struct kvp_meta *m, struct kvp_ns *ns)
{
    static const uint32_t t9[] = {9}, t7[] = {7, 8};
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, NULL), 0);
    /* Another rank confirms x with another lineage: the latest wins. */
    CHECK_EQ(put_lin(ns, 1, "x", "q", t9, 1), 0);
    /* Without one (y on rank 1): y keeps what it had. */
    CHECK(put(ns, 1, "y") >= 0);
    take();
    CHECK_STR(lineages(m), "x@0<q>[9] y@0<x> z@0[5,6] v@0<w> u@0 x@1<q>[9] y@1<x> ");
    /* Only a parent: it replaces the whole lineage. */
    CHECK_EQ(put_lin(ns, 1, "u", "x", NULL, 0), 0);
    /* A confirmation that loses (x already holds a page on rank 0): its page
     * is freed and its lineage not kept. */
    struct kvp_str kx = K("x"), kt = K("t");
    int64_t p;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &kt, 1, &p, NULL, NULL), 0);
    const uint32_t *tp = t7;
    uint32_t nt = 2;
    struct kvp_str par = K("lost");
    struct kvp_confirm_opts co = {sizeof co, &par, &tp, &nt};
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, &kx, &p, 1, NULL, 0, &co, NULL), 0);
    take();
    CHECK_STR(lineages(m), "x@0<q>[9] y@0<x> z@0[5,6] v@0<w> u@0<x> x@1<q>[9] y@1<x> u@1<x> ");
    /* Delete: x goes from every rank, and its lineage with it. */
    CHECK_EQ(kvp_meta_delete(ns, -1, &kx, 1, NULL), 0);
    CHECK(put(ns, 0, "x") >= 0);
    take();
    CHECK_STR(lineages(m), "y@0<x> z@0[5,6] v@0<w> u@0<x> x@0 y@1<x> u@1<x> ");
    /* Eviction: rank 0 is full (8 pages with t's freed one: y z v u x and
     * three more); z, held nowhere else, is evicted and forgotten. */
    CHECK(put(ns, 0, "a") >= 0 && put(ns, 0, "b") >= 0 && put(ns, 0, "c") >= 0);
    CHECK(put(ns, 0, "d") >= 0 && put(ns, 0, "e") >= 0); /* evicts y, then z */
    CHECK(kvp__meta_peek(ns, 0, &(struct kvp_str){"z", 1}) == -1);
    CHECK(put(ns, 1, "z") >= 0);
    take();
    CHECK_STR(lineages(m), "v@0<w> u@0<x> x@0 a@0 b@0 c@0 d@0 e@0 y@1<x> u@1<x> z@1 ");
    /* Clear of one rank: keys held only there go with their lineages. */
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    CHECK(put(ns, 0, "v") >= 0);
    take();
    CHECK_STR(lineages(m), "v@0 y@1<x> u@1<x> z@1 ");
    CHECK_EQ(kvp_meta_clear(ns, -1, NULL), 0);
    CHECK(put(ns, 0, "y") >= 0);
    take();
    CHECK_STR(lineages(m), "y@0 ");
}

/* Each stored page of the inventory of keys "k<i>": its lineage is
 * "p<i>" and [i] (arg: how many were told, and how many were wrong). */
static void check_many(const struct kvp_meta_change *c, void *arg)
{
    uint64_t *count = arg;
    char key[32], par[32];
    unsigned i = 0;
    snprintf(key, sizeof key, "%.*s", (int)c->len, c->key);
    count[0]++;
    if (sscanf(key, "k%u", &i) != 1) {
        count[1]++;
        return;
    }
    snprintf(par, sizeof par, "p%u", i);
    if (!c->parent || c->parent_len != strlen(par) || memcmp(c->parent, par, c->parent_len) ||
        c->ntokens != 1 || c->token_ids[0] != i)
        count[1]++;
}

/* Many lineages: the table grows, keys are deleted from the middle of its
 * probe runs, and entries grown for a new rank keep theirs. */
static void test_many_lineages(struct kvp_meta *m)
{
    struct kvp_ns *ns = ns_of(m, "d", "many");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4096, NULL), 0);
    char k[32], p[32];
    for (uint32_t i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "k%u", i);
        snprintf(p, sizeof p, "p%u", i);
        CHECK_EQ(put_lin(ns, 0, k, p, &i, 1), 0);
    }
    for (uint32_t i = 0; i < 3000; i += 3) {
        snprintf(k, sizeof k, "k%u", i);
        struct kvp_str ks = K(k);
        CHECK_EQ(kvp_meta_delete(ns, -1, &ks, 1, NULL), 0);
    }
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 4096, NULL), 0);
    for (uint32_t i = 1; i < 3000; i += 3) { /* their entries grow a slot */
        snprintf(k, sizeof k, "k%u", i);
        CHECK(put(ns, 1, k) >= 0);
    }
    uint64_t count[2] = {0, 0};
    CHECK_EQ(kvp_meta_inventory(m, check_many, count), 0);
    CHECK_EQ(count[0], 2000 + 1000);
    CHECK_EQ(count[1], 0);
    invariants(m);
    CHECK_EQ(kvp_meta_drop(m, "d", 1, "many", 4, NULL), 0);
}

int main(void)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.read_grace_ms = 0;
    struct kvp_meta *m;
    CHECK_EQ(kvp_meta_open_at("mem:", &o, &m, NULL), 0);
    CHECK_EQ(kvp_meta_watch(NULL, watch, told), -EINVAL);
    CHECK_EQ(kvp_meta_inventory(m, NULL, NULL), -EINVAL);
    CHECK_EQ(kvp_meta_watch(m, watch, told), 0);
    struct kvp_ns *ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 2, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 3, 2, NULL), 0);
    TOLD("||");

    CHECK(put(ns, 0, "a") >= 0);
    CHECK(put(ns, 0, "b") >= 0);
    TOLD("|+a@0||+b@0|");        /* allocate (nothing), confirm (stored) */
    CHECK(put(ns, 0, "c") >= 0); /* evicts a, the least recently used */
    TOLD("-a@0|+c@0|");
    /* Confirming a held key again tells nothing. */
    struct kvp_str k = K("c");
    int64_t p = kvp__meta_peek(ns, 0, &k);
    CHECK_EQ(kvp_meta_confirm(ns, 0, &k, &p, 1, NULL, 0, NULL), 0);
    TOLD("|");
    CHECK(put(ns, 3, "c") >= 0);
    TOLD("|+c@3|");

    char inv[4096] = "";
    CHECK_EQ(kvp_meta_inventory(m, inventory, inv), 0);
    CHECK(!strcmp(inv, "d/kv:b@0 d/kv:c@0 d/kv:c@3 ")); /* oldest first per rank */
    TOLD("");

    CHECK_EQ(kvp_meta_delete(ns, -1, &k, 1, NULL), 0); /* every rank */
    TOLD("-c@0-c@3|");
    CHECK(put(ns, 3, "e") >= 0);
    take();
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    TOLD("-b@0|");
    CHECK(put(ns, 0, "f") >= 0);
    take();
    CHECK_EQ(kvp_meta_clear(ns, -1, NULL), 0);
    TOLD("-f@0-e@3|");
    CHECK(put(ns, 0, "g") >= 0);
    take();
    CHECK_EQ(kvp_meta_drop(m, "d", 1, "kv", 2, NULL), 0);
    TOLD("-g@0|");
    inv[0] = 0;
    CHECK_EQ(kvp_meta_inventory(m, inventory, inv), 0);
    CHECK(!strcmp(inv, ""));

    /* kvp_meta_confirm_ex: each stored page with its parent and tokens as
     * opts say them (len 0 / ntokens 0: not known), kept with the key. */
    ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    take();
    struct kvp_str ks[3] = {K("x"), K("y"), K("z")}, par[3] = {K("w"), K("x"), {"", 0}};
    int64_t pg[3];
    CHECK_EQ(kvp_meta_allocate(ns, 0, ks, 3, pg, NULL, NULL), 0);
    take();
    static const uint32_t t0[] = {1, 2}, t2[] = {5, 6};
    const uint32_t *tok[3] = {t0, NULL, t2};
    uint32_t ntok[3] = {2, 0, 2};
    struct kvp_confirm_opts co = {sizeof co, par, tok, ntok};
    struct kvp_error err = {0};
    /* Bad opts: refused before anything changes. */
    struct kvp_confirm_opts bad = co;
    bad.opts_size = sizeof co + 8;
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, ks, pg, 3, NULL, 0, &bad, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_ARG);
    bad = co;
    struct kvp_str badpar[3] = {K("w"), {"a\0b", 3}, K("y")};
    bad.parents = badpar;
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, ks, pg, 3, NULL, 0, &bad, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_KEY);
    CHECK_EQ(err.index, 1);
    bad = co;
    bad.ntokens = NULL;
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, ks, pg, 3, NULL, 0, &bad, &err), -EINVAL);
    uint32_t many[3] = {2, KVP_MAX_PAGE_TOKENS + 1, 2};
    bad = co;
    bad.ntokens = many;
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, ks, pg, 3, NULL, 0, &bad, &err), -EINVAL);
    uint8_t ex[3];
    CHECK_EQ(kvp_meta_exists(ns, 0, ks, 3, ex, NULL), 0);
    CHECK(!ex[0] && !ex[1] && !ex[2]);
    TOLD("");
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, ks, pg, 3, NULL, 0, &co, &err), 0);
    TOLD("+x@0<w>[1,2]+y@0<x>+z@0[5,6]|");
    /* An older caller's opts (only the parents): the rest not known. */
    struct kvp_str k2 = K("v");
    int64_t p2;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k2, 1, &p2, NULL, NULL), 0);
    take();
    co.opts_size = offsetof(struct kvp_confirm_opts, token_ids);
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, &k2, &p2, 1, NULL, 0, &co, NULL), 0);
    TOLD("+v@0<w>|");
    /* NULL opts: a plain confirmation; the inventory knows no parents. */
    struct kvp_str k3 = K("u");
    int64_t p3;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k3, 1, &p3, NULL, NULL), 0);
    take();
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, &k3, &p3, 1, NULL, 0, NULL, NULL), 0);
    TOLD("+u@0|");
    /* The inventory tells each page's lineage as its confirmation named it. */
    CHECK_EQ(kvp_meta_inventory(m, watch, told), 0);
    TOLD("+x@0<w>[1,2]+y@0<x>+z@0[5,6]+v@0<w>+u@0");
    test_lineage_kept(m, ns);
    CHECK_EQ(kvp_meta_drop(m, "d", 1, "kv", 2, NULL), 0);
    take();
    /* Dropped with the namespace: created again, its keys have none. */
    ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    CHECK(put(ns, 0, "x") >= 0);
    take();
    CHECK_STR(lineages(m), "x@0 ");
    CHECK_EQ(kvp_meta_drop(m, "d", 1, "kv", 2, NULL), 0);
    take();

    CHECK_EQ(kvp_meta_watch(m, NULL, NULL), 0);
    test_many_lineages(m);
    CHECK_EQ(kvp_meta_watch(m, watch, told), 0);

    /* Unwatched: nothing more is told. */
    CHECK_EQ(kvp_meta_watch(m, NULL, NULL), 0);
    ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 2, NULL), 0);
    CHECK(put(ns, 0, "h") >= 0);
    TOLD("");
    invariants(m);
    kvp_meta_close(m);
    printf("test_meta_watch: ");
    return check_report();
}
