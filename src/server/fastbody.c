/*
 * The hot bodies of both dialects, read without building JSON values.
 *
 *   batch_allocate    {"rank": R, "keys": [K | [K, P], ...]}
 *   confirm_write     {"rank": R, "confirmations": [[K, page], ...],
 *                      "pages_to_release": [page, ...]} (and kvpage's optional
 *                      "prefix_key": K | null)
 *   batch_exists      {"keys": [K, ...]}
 *   get_locations     {"rank": R, "keys": [K, ...]}
 *
 * (these two with an optional "namespace": "POOL", kvpage's extension),
 *
 * and SGLang's (the rank is in the path; "namespace": "POOL" optional)
 *
 *   /{rank}/reserve_and_allocate_page_indices  {"keys": [K | [K, P], ...]}
 *                               (and kvpage's optional "order": NAME)
 *   /{rank}/confirm_write      {"written_keys_to_confirm": [[K, page], ...],
 *                               "pages_to_release": [page, ...]}
 *                               (and kvpage's optional "prefix_key": K | null)
 *   /{rank}/exists, /{rank}/get_page_indices   {"keys": [K, ...]}
 *
 * are nearly all of a busy server's requests. A body in their plain form is
 * scanned straight into the request's scratch arrays, its keys pointing into
 * the body; that costs a fraction of tokenizing it and building jansson values
 * (bench/meta). The scanner takes only what it is sure of: strings of
 * printable ASCII without escapes, integers without sign tricks, fraction or
 * exponent, these fields once each and no others, lists within --max-keys,
 * keys that pass the key rule, pool names that pass the pool rule
 * (kvp_pool_valid). For anything else it returns 0 without replying, and the
 * general path (jansson) reads the body and gives every error its message.
 * The scanner never answers an error itself, so the two paths cannot disagree
 * on one; fuzz/fuzz_request.c runs every input through both and compares the
 * replies.
 */
#include <string.h>

#include "server/jsonfast.h"
#include "server/server.h"

struct scan {
    const char *p, *end;
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* Consumes c (after whitespace) when it is next. */
static int eat(struct scan *s, char c)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

static int peek(struct scan *s, char c)
{
    skip_ws(s);
    return s->p < s->end && *s->p == c;
}

/* A string of printable ASCII without escapes. */
static int plain_string(struct scan *s, struct kvp_str *out)
{
    if (!eat(s, '"'))
        return 0;
    const char *q = memchr(s->p, '"', (size_t)(s->end - s->p));
    /* No backslash before q (checked next), so q is the closing quote. */
    if (!q || !kvp__plain_ascii(s->p, (size_t)(q - s->p)))
        return 0;
    out->ptr = s->p;
    out->len = (size_t)(q - s->p);
    s->p = q + 1;
    return 1;
}

/* -?(0|[1-9][0-9]{0,17}): an integer that jansson reads as the same int64. */
static int plain_int(struct scan *s, int64_t *out)
{
    skip_ws(s);
    const char *p = s->p;
    int neg = p < s->end && *p == '-';
    p += neg;
    if (p >= s->end || *p < '0' || *p > '9')
        return 0;
    const char *d = p;
    int64_t v = 0;
    while (p < s->end && *p >= '0' && *p <= '9') {
        if (p - d == 18)
            return 0; /* near the int64 limits: jansson's rules */
        v = v * 10 + (*p++ - '0');
    }
    if ((*d == '0' && p - d > 1) || (neg && v == 0))
        return 0; /* leading zero (invalid JSON), "-0" */
    if (p < s->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return 0; /* a real number */
    *out = neg ? -v : v;
    s->p = p;
    return 1;
}

/* The name of the next field and its colon. */
static int field(struct scan *s, struct kvp_str *name)
{
    return plain_string(s, name) && eat(s, ':');
}

static int is(const struct kvp_str *name, const char *lit)
{
    size_t n = strlen(lit);
    return name->len == n && !memcmp(name->ptr, lit, n);
}

/* Room for one more element at index n of every scratch array, within --max-keys. */
static int room(struct kvp_ctx *c, size_t n, int *oom)
{
    if (n + 1 > c->srv->cfg.max_keys)
        return 0;
    if (n < c->rep->scratch_cap)
        return 1;
    if (kvp__scratch(c, n + 1)) {
        *oom = 1; /* replied 500 */
        return 0;
    }
    return 1;
}

static int good_key(const struct kvp_str *k)
{
    return !kvp_key_problem(k->ptr, k->len);
}

/* The rank field's value: 0..KVP_MAX_RANK. */
static int rank_value(struct scan *s, uint32_t *rank)
{
    int64_t r;
    if (!plain_int(s, &r) || r < 0 || r > (int64_t)KVP_MAX_RANK)
        return 0;
    *rank = (uint32_t)r;
    return 1;
}

/* A list of elements read by one(s, c, i, oom); *n: how many. */
static int list(struct scan *s, struct kvp_ctx *c, size_t *n, int *oom,
                int (*one)(struct scan *, struct kvp_ctx *, size_t))
{
    *n = 0;
    if (!eat(s, '['))
        return 0;
    if (eat(s, ']'))
        return 1;
    do {
        if (!room(c, *n, oom) || !one(s, c, *n))
            return 0;
        ++*n;
    } while (eat(s, ','));
    return eat(s, ']');
}

/* keys[i]: K or [K, P] with P a string. */
static int alloc_key(struct scan *s, struct kvp_ctx *c, size_t i)
{
    struct kvp_str *k = &c->rep->keys[i], prefix;
    if (!peek(s, '['))
        return plain_string(s, k) && good_key(k);
    return eat(s, '[') && plain_string(s, k) && good_key(k) && eat(s, ',') &&
           plain_string(s, &prefix) && eat(s, ']');
}

/* keys[i]: K. */
static int plain_key(struct scan *s, struct kvp_ctx *c, size_t i)
{
    return plain_string(s, &c->rep->keys[i]) && good_key(&c->rep->keys[i]);
}

/* confirmations[i]: [K, page]. */
static int confirmation(struct scan *s, struct kvp_ctx *c, size_t i)
{
    struct kvp_str *k = &c->rep->keys[i];
    return eat(s, '[') && plain_string(s, k) && good_key(k) && eat(s, ',') &&
           plain_int(s, &c->rep->pages[i]) && eat(s, ']');
}

/* pages_to_release[i]: a page. */
static int release(struct scan *s, struct kvp_ctx *c, size_t i)
{
    return plain_int(s, &c->rep->pages2[i]);
}

/* What a body holds besides its scalar field: its lists, each at most once. */
struct shape {
    const char *list1; /* required */
    int (*one1)(struct scan *, struct kvp_ctx *, size_t);
    const char *list2; /* pages_to_release (read by release), or NULL */
};

static const struct shape ALLOCATE = {"keys", alloc_key, NULL};
static const struct shape KEYS = {"keys", plain_key, NULL};
static const struct shape CONFIRM = {"confirmations", confirmation, "pages_to_release"};
static const struct shape SGL_CONFIRM = {"written_keys_to_confirm", confirmation,
                                         "pages_to_release"};

/* The namespace field's value: a pool name the general path takes as it is. */
static int pool_value(struct scan *s, struct kvp_str *pool)
{
    return plain_string(s, pool) && kvp_pool_valid(pool->ptr, pool->len);
}

/* The order field's value: one of the names the general path takes. */
static int order_value(struct scan *s, int *order)
{
    struct kvp_str v;
    if (!plain_string(s, &v))
        return 0;
    if (is(&v, "sglang"))
        *order = KVP_ORDER_SGLANG;
    else if (is(&v, "vllm"))
        *order = KVP_ORDER_VLLM;
    else if (is(&v, "default"))
        *order = KVP_ORDER_DEFAULT;
    else
        return 0;
    return 1;
}

/* The prefix_key field's value (a confirmation's, protocol.md 14.1): a key,
 * or null (ptr KVP_FAST_NULL, len 0). */
const char KVP_FAST_NULL[1] = "";
static int prefix_value(struct scan *s, struct kvp_str *prefix)
{
    skip_ws(s);
    if (s->end - s->p >= 4 && !memcmp(s->p, "null", 4)) {
        s->p += 4;
        prefix->ptr = KVP_FAST_NULL;
        prefix->len = 0;
        return 1;
    }
    return plain_string(s, prefix) && good_key(prefix);
}

/* Reads an object of the shape's lists, "rank" when rank != NULL (required),
 * "namespace" when pool != NULL (optional, pool->ptr NULL when absent),
 * "order" when order != NULL (optional, *order unchanged when absent) and
 * "prefix_key" when prefix != NULL (optional, prefix->ptr NULL when absent),
 * each field at most once, and nothing after it. */
static int scan_body(struct kvp_ctx *c, const struct shape *sh, uint32_t *rank,
                     struct kvp_str *pool, int *order, struct kvp_str *prefix, size_t *n1,
                     size_t *n2, int *oom)
{
    struct scan s = {c->req->body, c->req->body + c->req->body_len};
    int seen_rank = 0, seen_pool = 0, seen_order = 0, seen_prefix = 0, seen1 = 0, seen2 = 0;
    *n2 = 0;
    if (pool)
        pool->ptr = NULL, pool->len = 0;
    if (prefix)
        prefix->ptr = NULL, prefix->len = 0;
    if (kvp__scratch(c, 1)) { /* the arrays exist even for empty lists */
        *oom = 1;
        return 0;
    }
    if (!eat(&s, '{'))
        return 0;
    do {
        struct kvp_str name;
        if (!field(&s, &name))
            return 0;
        if (rank && is(&name, "rank") && !seen_rank++) {
            if (!rank_value(&s, rank))
                return 0;
        } else if (pool && is(&name, "namespace") && !seen_pool++) {
            if (!pool_value(&s, pool))
                return 0;
        } else if (order && is(&name, "order") && !seen_order++) {
            if (!order_value(&s, order))
                return 0;
        } else if (prefix && is(&name, "prefix_key") && !seen_prefix++) {
            if (!prefix_value(&s, prefix))
                return 0;
        } else if (is(&name, sh->list1) && !seen1++) {
            if (!list(&s, c, n1, oom, sh->one1))
                return 0;
        } else if (sh->list2 && is(&name, sh->list2) && !seen2++) {
            if (!list(&s, c, n2, oom, release))
                return 0;
        } else {
            return 0;
        }
    } while (eat(&s, ','));
    if (!eat(&s, '}'))
        return 0;
    skip_ws(&s);
    return s.p == s.end && (seen_rank || !rank) && seen1;
}

static int scan(struct kvp_ctx *c, const struct shape *sh, uint32_t *rank, struct kvp_str *pool,
                size_t *n1, size_t *n2)
{
    int oom = 0;
    size_t unused;
    int ok = scan_body(c, sh, rank, pool, NULL, NULL, n1, n2 ? n2 : &unused, &oom);
    return oom ? -1 : ok;
}

/* A confirmation's body, with its optional prefix_key. */
static int scan_confirm(struct kvp_ctx *c, const struct shape *sh, uint32_t *rank,
                        struct kvp_str *pool, struct kvp_str *prefix, size_t *n, size_t *nrel)
{
    int oom = 0;
    int ok = scan_body(c, sh, rank, pool, NULL, prefix, n, nrel, &oom);
    return oom ? -1 : ok;
}

int kvp__fast_allocate(struct kvp_ctx *c, uint32_t *rank, size_t *n)
{
    return scan(c, &ALLOCATE, rank, NULL, n, NULL);
}

int kvp__fast_keys(struct kvp_ctx *c, uint32_t *rank, struct kvp_str *pool, size_t *n)
{
    return scan(c, &KEYS, rank, pool, n, NULL);
}

int kvp__fast_confirm(struct kvp_ctx *c, uint32_t *rank, struct kvp_str *prefix, size_t *n,
                      size_t *nrel)
{
    /* confirmations and pages_to_release share the scratch arrays' capacity */
    return scan_confirm(c, &CONFIRM, rank, NULL, prefix, n, nrel);
}

int kvp__fast_sgl_allocate(struct kvp_ctx *c, struct kvp_str *pool, size_t *n)
{
    return scan(c, &ALLOCATE, NULL, pool, n, NULL);
}

int kvp__fast_sgl_reserve(struct kvp_ctx *c, struct kvp_str *pool, int *order, size_t *n)
{
    int oom = 0;
    size_t unused;
    int ok = scan_body(c, &ALLOCATE, NULL, pool, order, NULL, n, &unused, &oom);
    return oom ? -1 : ok;
}

int kvp__fast_sgl_keys(struct kvp_ctx *c, struct kvp_str *pool, size_t *n)
{
    return scan(c, &KEYS, NULL, pool, n, NULL);
}

int kvp__fast_sgl_confirm(struct kvp_ctx *c, struct kvp_str *pool, struct kvp_str *prefix,
                          size_t *n, size_t *nrel)
{
    return scan_confirm(c, &SGL_CONFIRM, NULL, pool, prefix, n, nrel);
}
