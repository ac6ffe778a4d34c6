/*
 * The vLLM dialect (protocol.md §2): JSON bodies of the HF3FS KV connector's
 * metadata client ↔ meta calls. Pool is always "kv", except that the four
 * namespace-wide routes (batch_exists, get_locations, /clear, /keys/delete)
 * take an optional body field "namespace" naming the pool (a kvpage
 * extension for the http:// client of kvpage/meta.h; docs/protocol-notes.md).
 */
#include <errno.h>
#include <string.h>

#include "server/server.h"

static const char POOL[] = "kv";
#define POOL_LEN (sizeof POOL - 1)

/* The optional "namespace" body field of the namespace-wide routes: absent →
 * "kv", as the SGLang dialect reads it. 0, or -1 when replied. */
static int body_pool(struct kvp_ctx *c, const char **pool, size_t *plen)
{
    return kvp__body_pool(c, POOL, pool, plen);
}

/* rank field of the body: a JSON integer in 0..2^31-1. */
static int body_rank(struct kvp_ctx *c, uint32_t *out)
{
    json_t *v = json_object_get(c->body, "rank");
    if (!json_is_integer(v))
        return -1;
    json_int_t r = json_integer_value(v);
    if (r < 0 || r > (json_int_t)KVP_MAX_RANK)
        return -1;
    *out = (uint32_t)r;
    return 0;
}

static void do_init(struct kvp_ctx *c)
{
    uint32_t rank = c->path_rank;
    json_t *role = json_object_get(c->body, "role");
    if (role) {
        const char *r = json_string_value(role);
        size_t rl = json_string_length(role);
        if (r && rl == 9 && !memcmp(r, "scheduler", 9)) {
            kvp__jw_lit(kvp__reply_json(c),
                        "{\"message\": \"Scheduler role does not require initialization\"}");
            return;
        }
        if (!r || rl != 6 || memcmp(r, "worker", 6)) {
            kvp__reply_error(
                c, 400, "Invalid initialization parameters: role must be 'worker' or 'scheduler'");
            return;
        }
    }
    json_t *np = json_object_get(c->body, "num_pages");
    json_int_t n = json_is_integer(np) ? json_integer_value(np) : 0;
    if (kvp__init_pages(c, n))
        return;
    struct kvp_ns *ns;
    if (kvp__find_ns(c, POOL, POOL_LEN, 1, &ns))
        return; /* replied (create never yields -ENOENT) */
    struct kvp_error err = {0};
    int rc = kvp_meta_init_rank_async(ns, rank, (uint64_t)n, &c->rep->ticket, &err);
    if (rc) {
        kvp__init_error(c, rank, n, rc, &err);
        return;
    }
    struct kvp_buf *b = kvp__reply_json(c);
    kvp__buf_printf(b, "{\"message\": \"Rank %u initialized with %lld pages\"}", rank,
                    (long long)n);
}

/* batch_allocate of the n keys in c->rep->keys, the body read. */
static void allocate_run(struct kvp_ctx *c, uint32_t rank, size_t n)
{
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, POOL, POOL_LEN, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    struct kvp_error err = {0};
    if (rc == 0)
        rc = kvp_meta_allocate_ordered_async(ns, rank, KVP_ORDER_VLLM, c->rep->keys, n,
                                             c->rep->pages, NULL, &c->rep->ticket, &err);
    if (rc == -ENOENT) {
        kvp__reply_not_init(c, rank, "Allocation failed: Rank %u not initialized", rank);
        return;
    }
    if (rc) {
        kvp__meta_error(c, rc, &err, "keys");
        return;
    }
    struct kvp_buf *b = kvp__reply_json(c);
    const struct kvp_str *k = c->rep->keys;
    const int64_t *pages = c->rep->pages;
    kvp__buf_reserve(b, n * 96 + 48);
    kvp__jw_lit(b, "{\"rank\": ");
    kvp__jw_uint(b, rank);
    kvp__jw_lit(b, ", \"results\": [");
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvp__jw_lit(b, ", ");
        kvp__jw_lit(b, "[");
        kvp__jw_str(b, k[i].ptr, k[i].len);
        kvp__jw_lit(b, ", ");
        kvp__jw_int(b, pages[i]);
        kvp__jw_lit(b, "]");
    }
    kvp__jw_lit(b, "]}");
}

static void do_allocate(struct kvp_ctx *c)
{
    uint32_t rank;
    json_t *keys;
    if (body_rank(c, &rank) || kvp__body_list(c, "keys", &keys)) {
        kvp__reply_error(c, 400, "Invalid request format: need 'rank' and 'keys'");
        return;
    }
    ptrdiff_t n = kvp__parse_alloc_keys(c, keys);
    if (n >= 0)
        allocate_run(c, rank, (size_t)n);
}

/* confirm_write of the n confirmations and nrel releases in the scratch
 * arrays, with their parents and tokens (x NULL: none). */
static void confirm_run(struct kvp_ctx *c, uint32_t rank, size_t n, size_t nrel,
                        const struct kvp_confirm_extra *x)
{
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, POOL, POOL_LEN, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    struct kvp_error err = {0};
    if (rc == 0)
        rc = kvp_meta_confirm_ex_async(ns, rank, c->rep->keys, c->rep->pages, n, c->rep->pages2,
                                       nrel, x && x->used ? &x->opts : NULL, &c->rep->ticket, &err);
    if (rc == -ENOENT) {
        kvp__reply_not_init(c, rank, "Confirmation failed: Rank %u not initialized", rank);
        return;
    }
    if (rc) {
        kvp__confirm_error(c, rc, &err, "confirmations", rank);
        return;
    }
    kvp__reply_empty(c, 204);
}

static void do_confirm(struct kvp_ctx *c)
{
    uint32_t rank;
    json_t *conf;
    if (body_rank(c, &rank) || kvp__body_list(c, "confirmations", &conf)) {
        kvp__reply_error(c, 400, "Invalid request format: need 'rank' and 'confirmations'");
        return;
    }
    size_t n, nrel;
    struct kvp_confirm_extra x = {0};
    if (kvp__parse_confirm(c, conf, "confirmations", &n, &nrel, 0) == 0 &&
        kvp__parse_confirm_extra(c, "confirmation", n, &x) == 0)
        confirm_run(c, rank, n, nrel, &x);
    kvp__confirm_extra_free(&x);
}

static void exists_run(struct kvp_ctx *c, const char *pool, size_t plen, size_t n)
{
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, pool, plen, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    if (rc == -ENOENT) {
        memset(c->rep->flags, 0, n);
    } else {
        struct kvp_error err = {0};
        rc = kvp_meta_exists(ns, -1, c->rep->keys, n, c->rep->flags, &err);
        if (rc) {
            kvp__meta_error(c, rc, &err, "keys");
            return;
        }
    }
    struct kvp_buf *b = kvp__reply_json(c);
    kvp__jw_lit(b, "{\"exists\": [");
    kvp__jw_bools(b, c->rep->flags, n);
    kvp__jw_lit(b, "]}");
}

static void do_exists(struct kvp_ctx *c)
{
    json_t *keys;
    const char *pool;
    size_t plen;
    if (body_pool(c, &pool, &plen))
        return;
    if (kvp__body_list(c, "keys", &keys)) {
        kvp__reply_error(c, 400, "Invalid keys format");
        return;
    }
    ptrdiff_t n = kvp__parse_str_keys(c, keys, 1);
    if (n >= 0)
        exists_run(c, pool, plen, (size_t)n);
}

static void locations_run(struct kvp_ctx *c, const char *pool, size_t plen, uint32_t rank, size_t n)
{
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, pool, plen, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    struct kvp_error err = {0};
    if (rc == 0)
        rc = kvp_meta_lookup(ns, rank, 1, c->rep->keys, n, c->rep->pages, &err);
    if (rc == -ENOENT) {
        kvp__reply_not_init(c, rank, "Failed to get key locations: Rank %u not initialized", rank);
        return;
    }
    if (rc) {
        kvp__meta_error(c, rc, &err, "keys");
        return;
    }
    struct kvp_buf *b = kvp__reply_json(c);
    kvp__jw_lit(b, "{\"locations\": [");
    kvp__jw_pages(b, c->rep->pages, n);
    kvp__jw_lit(b, "]}");
}

static void do_locations(struct kvp_ctx *c)
{
    uint32_t rank;
    json_t *keys;
    const char *pool;
    size_t plen;
    if (body_pool(c, &pool, &plen))
        return;
    if (body_rank(c, &rank) || kvp__body_list(c, "keys", &keys)) {
        kvp__reply_error(c, 400, "Invalid request format: need 'rank' and 'keys'");
        return;
    }
    ptrdiff_t n = kvp__parse_str_keys(c, keys, 0);
    if (n >= 0)
        locations_run(c, pool, plen, rank, (size_t)n);
}

static void do_clear(struct kvp_ctx *c)
{
    struct kvp_ns *ns;
    const char *pool;
    size_t plen;
    if (body_pool(c, &pool, &plen))
        return;
    int rc = kvp__find_ns(c, pool, plen, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    if (rc == 0) {
        struct kvp_error err = {0};
        rc = kvp_meta_clear_async(ns, -1, &c->rep->ticket, &err);
        if (rc) {
            kvp__meta_error(c, rc, &err, "keys");
            return;
        }
    }
    kvp__reply_empty(c, 204);
}

/* kvpage's POST /drop: the namespace (this deployment, the body's pool) and
 * its ranks go (kvp_meta_drop); 204, or 404 when there is none. */
static void do_drop(struct kvp_ctx *c)
{
    const char *pool;
    size_t plen;
    if (body_pool(c, &pool, &plen))
        return;
    struct kvp_error err = {0};
    int rc = kvp_meta_drop_async(c->srv->meta, c->dep, c->dlen, pool, plen, &c->rep->ticket, &err);
    if (rc == -ENOENT)
        kvp__reply_error(c, 404, "Namespace not found");
    else if (rc)
        kvp__meta_error(c, rc, &err, "namespace");
    else
        kvp__reply_empty(c, 204);
}

static void do_delete(struct kvp_ctx *c)
{
    json_t *keys;
    const char *pool;
    size_t plen;
    if (body_pool(c, &pool, &plen))
        return;
    if (kvp__body_list(c, "keys", &keys)) {
        kvp__reply_error(c, 400, "Invalid request format: 'keys' must be a list");
        return;
    }
    int reason = kvp__body_reason(c);
    if (reason < 0)
        return;
    ptrdiff_t n = kvp__parse_str_keys(c, keys, 0);
    if (n < 0)
        return;
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, pool, plen, 0, &ns);
    if (rc && rc != -ENOENT)
        return;
    if (rc == 0) {
        struct kvp_error err = {0};
        rc = kvp_meta_delete_async(ns, -1, c->rep->keys, (size_t)n, &c->rep->ticket, &err);
        if (rc) {
            kvp__meta_error(c, rc, &err, "keys");
            return;
        }
        if (reason)
            kvp__rejected_add(c->srv, c->dep, c->dlen, pool, plen, (uint64_t)n);
    }
    kvp__reply_empty(c, 204);
}

int kvp__vllm_fast(struct kvp_ctx *c, int route)
{
    uint32_t rank;
    size_t n, nrel;
    struct kvp_str pool;
    int rc;
    if (route == KVP_ROUTE_VLLM_ALLOCATE) {
        if ((rc = kvp__fast_allocate(c, &rank, &n)) == 1)
            allocate_run(c, rank, n);
    } else if (route == KVP_ROUTE_VLLM_CONFIRM) {
        struct kvp_str prefix;
        if ((rc = kvp__fast_confirm(c, &rank, &prefix, &n, &nrel)) == 1) {
            struct kvp_confirm_extra x = {0};
            if (!prefix.ptr || kvp__confirm_chain(c, n, &prefix, &x) == 0)
                confirm_run(c, rank, n, nrel, &x);
            kvp__confirm_extra_free(&x);
        }
    } else if (route == KVP_ROUTE_VLLM_EXISTS) {
        if ((rc = kvp__fast_keys(c, NULL, &pool, &n)) == 1)
            exists_run(c, pool.ptr ? pool.ptr : POOL, pool.ptr ? pool.len : POOL_LEN, n);
    } else if (route == KVP_ROUTE_VLLM_LOCATIONS) {
        if ((rc = kvp__fast_keys(c, &rank, &pool, &n)) == 1)
            locations_run(c, pool.ptr ? pool.ptr : POOL, pool.ptr ? pool.len : POOL_LEN, rank, n);
    } else {
        return 0;
    }
    return rc != 0;
}

void kvp__vllm_handle(struct kvp_ctx *c, int route)
{
    switch (route) {
    case KVP_ROUTE_VLLM_INIT:
        do_init(c);
        break;
    case KVP_ROUTE_VLLM_ALLOCATE:
        do_allocate(c);
        break;
    case KVP_ROUTE_VLLM_CONFIRM:
        do_confirm(c);
        break;
    case KVP_ROUTE_VLLM_EXISTS:
        do_exists(c);
        break;
    case KVP_ROUTE_VLLM_LOCATIONS:
        do_locations(c);
        break;
    case KVP_ROUTE_VLLM_CLEAR:
        do_clear(c);
        break;
    case KVP_ROUTE_VLLM_DELETE:
        do_delete(c);
        break;
    case KVP_ROUTE_VLLM_DROP:
        do_drop(c);
        break;
    default:
        kvp__reply_error(c, 404, "Not Found");
    }
}
