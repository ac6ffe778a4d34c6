/*
 * The SGLang dialect (protocol.md §3): POST /{rank}/<op> of the HiCache hf3fs
 * backend's metadata client ↔ meta calls. The pool is the body field
 * "namespace" (default "kv"); keys are per rank.
 */
#include <errno.h>
#include <string.h>

#include "server/server.h"

struct sgl {
    struct kvp_ctx *c;
    uint32_t rank;
    const char *pool;
    size_t plen;
    struct kvp_ns *ns;
    int order; /* of the pages reserve hands out: KVP_ORDER_SGLANG unless "order" says */
};

static int body_pool(struct sgl *s)
{
    json_t *v = json_object_get(s->c->body, "namespace");
    if (!v) {
        s->pool = "kv";
        s->plen = 2;
        return 0;
    }
    if (!json_is_string(v) || !kvp_pool_valid(json_string_value(v), json_string_length(v))) {
        kvp__reply_rule(s->c, KVP_RULE_NAMESPACE, -1, 0, 0);
        kvp__reply_error(s->c, 400, "Invalid namespace");
        return -1;
    }
    s->pool = json_string_value(v);
    s->plen = json_string_length(v);
    return 0;
}

static void not_init(struct sgl *s)
{
    if (s->plen == 2 && !memcmp(s->pool, "kv", 2))
        kvp__reply_not_init(s->c, s->rank,
                            "Rank %u not initialized. Please call /%u/initialize first.", s->rank,
                            s->rank);
    else
        kvp__reply_not_init(
            s->c, s->rank,
            "Rank %u namespace '%.*s' not initialized. Please call /%u/initialize first.", s->rank,
            (int)s->plen, s->pool, s->rank);
}

/* Finds the namespace without creating it; replies 404 / 400 / 500 when it
 * cannot be used. */
static int find(struct sgl *s)
{
    int rc = kvp__find_ns(s->c, s->pool, s->plen, 0, &s->ns);
    if (rc == -ENOENT)
        not_init(s);
    return rc;
}

/* Maps a meta error of a call on an existing namespace. */
static void meta_fail(struct sgl *s, int rc, const struct kvp_error *err)
{
    if (rc == -ENOENT)
        not_init(s);
    else
        kvp__meta_error(s->c, rc, err, "keys");
}

static int list_field(struct sgl *s, const char *field, json_t **out)
{
    if (kvp__body_list(s->c, field, out) == 0)
        return 0;
    kvp__reply_error(s->c, 400, "Invalid request format: '%s' must be a list", field);
    return -1;
}

static void do_init(struct sgl *s)
{
    struct kvp_ctx *c = s->c;
    json_t *np = json_object_get(c->body, "num_pages");
    if (np && !json_is_integer(np)) {
        kvp__reply_error(c, 400, "Invalid request format: 'num_pages' must be an integer");
        return;
    }
    json_int_t n = np ? json_integer_value(np) : 0;
    if (kvp__init_pages(c, n))
        return;
    if (kvp__find_ns(c, s->pool, s->plen, 1, &s->ns))
        return;
    struct kvp_error err = {0};
    int rc = kvp_meta_init_rank_async(s->ns, s->rank, (uint64_t)n, &s->c->rep->ticket, &err);
    if (rc) {
        kvp__init_error(c, s->rank, n, rc, &err);
        return;
    }
    kvp__reply_empty(c, 204);
}

/* The routes below come in two halves: do_X (or do_str_keys) reads the body,
 * X_run does the rest with the keys (and pages) in the scratch arrays, for the
 * general path and fastbody.c's alike. */

static void exists_run(struct sgl *s, size_t n)
{
    if (find(s))
        return;
    struct kvp_error err = {0};
    int rc = kvp_meta_exists(s->ns, s->rank, s->c->rep->keys, n, s->c->rep->flags, &err);
    if (rc) {
        meta_fail(s, rc, &err);
        return;
    }
    struct kvp_buf *b = kvp__reply_json(s->c);
    kvp__jw_lit(b, "{\"exists\": [");
    kvp__jw_bools(b, s->c->rep->flags, n);
    kvp__jw_lit(b, "]}");
}

/* exists and get_page_indices: a list of string keys, then run. */
static void do_str_keys(struct sgl *s, void (*run)(struct sgl *, size_t))
{
    json_t *keys;
    if (list_field(s, "keys", &keys))
        return;
    ptrdiff_t n = kvp__parse_str_keys(s->c, keys, 0);
    if (n >= 0)
        run(s, (size_t)n);
}

static void reserve_run(struct sgl *s, size_t n)
{
    if (find(s))
        return;
    struct kvp_reply *r = s->c->rep;
    struct kvp_error err = {0};
    int rc = kvp_meta_allocate_ordered_async(s->ns, s->rank, s->order, r->keys, n, r->pages,
                                             r->flags, &r->ticket, &err);
    if (rc) {
        meta_fail(s, rc, &err);
        return;
    }
    struct kvp_buf *b = kvp__reply_json(s->c);
    kvp__buf_reserve(b, n * 24 + 32);
    kvp__jw_lit(b, "{\"indices\": [");
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvp__jw_lit(b, ", ");
        if (r->flags[i])
            kvp__jw_lit(b, "[true, ");
        else
            kvp__jw_lit(b, "[false, ");
        kvp__jw_int(b, r->pages[i]);
        kvp__jw_lit(b, "]");
    }
    kvp__jw_lit(b, "]}");
}

/* kvpage's extension (protocol-notes, "The order of free pages"): an optional
 * "order" of "sglang" (the default), "vllm" or "default" (the store's, which
 * the http:// backend of kvpage/meta.h sends). */
static int body_order(struct sgl *s)
{
    static const struct {
        const char *name;
        int order;
    } names[] = {
        {"sglang", KVP_ORDER_SGLANG}, {"vllm", KVP_ORDER_VLLM}, {"default", KVP_ORDER_DEFAULT}};
    json_t *v = json_object_get(s->c->body, "order");
    if (!v)
        return 0;
    for (size_t i = 0; json_is_string(v) && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(json_string_value(v), names[i].name)) {
            s->order = names[i].order;
            return 0;
        }
    kvp__reply_error(s->c, 400,
                     "Invalid request format: 'order' must be 'sglang', 'vllm' or 'default'");
    return -1;
}

static void do_reserve(struct sgl *s)
{
    json_t *keys;
    if (list_field(s, "keys", &keys) || body_order(s))
        return;
    ptrdiff_t n = kvp__parse_alloc_keys(s->c, keys);
    if (n >= 0)
        reserve_run(s, (size_t)n);
}

static const char CONFIRMED[] = "written_keys_to_confirm";

/* x: the confirmations' parents and tokens (NULL: none). */
static void confirm_run(struct sgl *s, size_t n, size_t nrel, const struct kvp_confirm_extra *x)
{
    if (find(s))
        return;
    struct kvp_reply *r = s->c->rep;
    struct kvp_error err = {0};
    int rc = kvp_meta_confirm_ex_async(s->ns, s->rank, r->keys, r->pages, n, r->pages2, nrel,
                                       x && x->used ? &x->opts : NULL, &r->ticket, &err);
    if (rc == -ENOENT) {
        not_init(s);
        return;
    }
    if (rc) {
        kvp__confirm_error(s->c, rc, &err, CONFIRMED, s->rank);
        return;
    }
    kvp__reply_empty(s->c, 204);
}

static void do_confirm(struct sgl *s)
{
    json_t *conf;
    if (list_field(s, CONFIRMED, &conf))
        return;
    size_t n, nrel;
    struct kvp_confirm_extra x = {0};
    if (kvp__parse_confirm(s->c, conf, CONFIRMED, &n, &nrel, 1) == 0 &&
        kvp__parse_confirm_extra(s->c, "confirmation", n, &x) == 0)
        confirm_run(s, n, nrel, &x);
    kvp__confirm_extra_free(&x);
}

static void do_delete(struct sgl *s)
{
    json_t *keys;
    if (list_field(s, "keys", &keys))
        return;
    int reason = kvp__body_reason(s->c);
    if (reason < 0)
        return;
    ptrdiff_t n = kvp__parse_str_keys(s->c, keys, 0);
    if (n < 0 || find(s))
        return;
    struct kvp_error err = {0};
    int rc =
        kvp_meta_delete_async(s->ns, s->rank, s->c->rep->keys, (size_t)n, &s->c->rep->ticket, &err);
    if (rc) {
        meta_fail(s, rc, &err);
        return;
    }
    if (reason)
        kvp__rejected_add(s->c->srv, s->c->dep, s->c->dlen, s->pool, s->plen, (uint64_t)n);
    kvp__reply_empty(s->c, 204);
}

static void do_clear(struct sgl *s)
{
    if (find(s))
        return;
    struct kvp_error err = {0};
    int rc = kvp_meta_clear_async(s->ns, s->rank, &s->c->rep->ticket, &err);
    if (rc) {
        meta_fail(s, rc, &err);
        return;
    }
    kvp__reply_empty(s->c, 204);
}

static void get_run(struct sgl *s, size_t n)
{
    if (find(s))
        return;
    struct kvp_error err = {0};
    int rc = kvp_meta_lookup(s->ns, s->rank, 0, s->c->rep->keys, n, s->c->rep->pages, &err);
    if (rc) {
        meta_fail(s, rc, &err);
        return;
    }
    struct kvp_buf *b = kvp__reply_json(s->c);
    kvp__jw_lit(b, "{\"indices\": [");
    kvp__jw_pages(b, s->c->rep->pages, n);
    kvp__jw_lit(b, "]}");
}

int kvp__sglang_fast(struct kvp_ctx *c, int route)
{
    struct sgl s = {
        .c = c, .rank = c->path_rank, .pool = "kv", .plen = 2, .order = KVP_ORDER_SGLANG};
    struct kvp_str pool, prefix = {NULL, 0};
    size_t n, nrel = 0;
    int rc;
    if (route == KVP_ROUTE_SGL_RESERVE)
        rc = kvp__fast_sgl_reserve(c, &pool, &s.order, &n);
    else if (route == KVP_ROUTE_SGL_CONFIRM)
        rc = kvp__fast_sgl_confirm(c, &pool, &prefix, &n, &nrel);
    else if (route == KVP_ROUTE_SGL_EXISTS || route == KVP_ROUTE_SGL_GET)
        rc = kvp__fast_sgl_keys(c, &pool, &n);
    else
        return 0;
    if (rc != 1)
        return rc != 0; /* -1: replied 500 */
    if (pool.ptr) {
        s.pool = pool.ptr;
        s.plen = pool.len;
    }
    switch (route) {
    case KVP_ROUTE_SGL_RESERVE:
        reserve_run(&s, n);
        break;
    case KVP_ROUTE_SGL_CONFIRM: {
        struct kvp_confirm_extra x = {0};
        if (!prefix.ptr || kvp__confirm_chain(c, n, &prefix, &x) == 0)
            confirm_run(&s, n, nrel, &x);
        kvp__confirm_extra_free(&x);
        break;
    }
    case KVP_ROUTE_SGL_EXISTS:
        exists_run(&s, n);
        break;
    default:
        get_run(&s, n);
        break;
    }
    return 1;
}

void kvp__sglang_handle(struct kvp_ctx *c, int route)
{
    struct sgl s = {.c = c, .rank = c->path_rank, .order = KVP_ORDER_SGLANG};
    if (body_pool(&s))
        return;
    switch (route) {
    case KVP_ROUTE_SGL_INIT:
        do_init(&s);
        break;
    case KVP_ROUTE_SGL_EXISTS:
        do_str_keys(&s, exists_run);
        break;
    case KVP_ROUTE_SGL_RESERVE:
        do_reserve(&s);
        break;
    case KVP_ROUTE_SGL_CONFIRM:
        do_confirm(&s);
        break;
    case KVP_ROUTE_SGL_DELETE:
        do_delete(&s);
        break;
    case KVP_ROUTE_SGL_CLEAR:
        do_clear(&s);
        break;
    case KVP_ROUTE_SGL_GET:
        do_str_keys(&s, get_run);
        break;
    default:
        kvp__reply_error(c, 404, "Not Found");
    }
}
