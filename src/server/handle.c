/*
 * Routing and what every route shares (the access checks are access.c's):
 * the /ns/NAME prefix, method checks, body limits, JSON parsing, error
 * replies, and the helpers the dialect files use to read keys.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "server/bodyguard.h"
#include "server/jsonfast.h"
#include "server/server.h"
#include "util/clock.h"
#include "util/hex.h"

static const char JSON_TYPE[] = "application/json";

/* ---------- replies ---------- */

void kvp__reply_init(struct kvp_reply *rep)
{
    memset(rep, 0, sizeof *rep);
    kvp__buf_init(&rep->body);
}

void kvp__reply_free(struct kvp_reply *rep)
{
    kvp__buf_free(&rep->body);
    free(rep->keys);
    free(rep->pages);
    free(rep->pages2);
    free(rep->flags);
    memset(rep, 0, sizeof *rep);
}

static void reply_reset(struct kvp_reply *rep)
{
    rep->ticket = 0;
    rep->status = 500;
    rep->content_type = NULL;
    rep->allow = NULL;
    rep->www_authenticate = NULL;
    rep->route = KVP_ROUTE_NONE;
    kvp__buf_reset(&rep->body);
}

static void reply_oom(struct kvp_reply *rep)
{
    static const char msg[] = "{\"detail\": \"Internal error: out of memory\"}";
    rep->status = 500;
    rep->content_type = JSON_TYPE;
    kvp__buf_reset(&rep->body);
    kvp__buf_put(&rep->body, msg, sizeof msg - 1);
    /* If even this fails the transport sends the status with an empty body. */
}

static void reply_detail(struct kvp_reply *rep, int status, const char *msg, size_t len)
{
    rep->status = status;
    rep->content_type = JSON_TYPE;
    kvp__buf_reset(&rep->body);
    kvp__jw_lit(&rep->body, "{\"detail\": ");
    kvp__jw_str(&rep->body, msg, len);
    kvp__jw_lit(&rep->body, "}");
}

void kvp__reply_error(struct kvp_ctx *c, int status, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        reply_detail(c->rep, status, "", 0);
        return;
    }
    if ((size_t)n < sizeof small) {
        reply_detail(c->rep, status, small, (size_t)n);
        return;
    }
    /* Long messages only come from long client text (a huge rank segment). */
    char *big = malloc((size_t)n + 1);
    if (!big) {
        reply_oom(c->rep);
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    reply_detail(c->rep, status, big, (size_t)n);
    free(big);
}

void kvp__reply_empty(struct kvp_ctx *c, int status)
{
    c->rep->status = status;
    c->rep->content_type = NULL;
    kvp__buf_reset(&c->rep->body);
}

void kvp__reply_failure(struct kvp_reply *rep, int rc, const char *what)
{
    struct kvp_ctx c = {.rep = rep};
    kvp__reply_internal(&c, rc, what);
}

struct kvp_buf *kvp__reply_json(struct kvp_ctx *c)
{
    c->rep->status = 200;
    c->rep->content_type = JSON_TYPE;
    kvp__buf_reset(&c->rep->body);
    return &c->rep->body;
}

int kvp__log_error_status(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT ? 507 : 503;
}

void kvp__reply_log_error(struct kvp_reply *rep, int rc, const char *why, int applied)
{
    struct kvp_ctx c = {.rep = rep};
    int status = kvp__log_error_status(rc);
    const char *what = status == 507 ? "Insufficient storage" : "Service unavailable";
    const char *until = status == 507 ? "space is freed" : "the log recovers";
    if (applied)
        kvp__reply_error(&c, status,
                         "%s: %s; the change is made but not acknowledged: it is durable once the "
                         "log recovers, and retrying it is safe; writes are refused until %s",
                         what, why, until);
    else
        kvp__reply_error(&c, status, "%s: %s; writes are refused until %s", what, why, until);
}

void kvp__reply_internal(struct kvp_ctx *c, int rc, const char *what)
{
    if (rc == -ENOMEM) {
        reply_oom(c->rep);
        return;
    }
    kvp__reply_error(c, 500, "Internal error: %s: %s", what, kvp_strerror(rc));
}

int kvp__scratch(struct kvp_ctx *c, size_t n)
{
    struct kvp_reply *r = c->rep;
    if (n <= r->scratch_cap && r->scratch_cap)
        return 0;
    size_t cap = r->scratch_cap ? r->scratch_cap * 2 : 256;
    if (cap < n)
        cap = n;
    if (cap > SIZE_MAX / sizeof(struct kvp_str))
        goto oom;
    struct kvp_str *k = realloc(r->keys, cap * sizeof *k);
    if (!k)
        goto oom;
    r->keys = k;
    int64_t *p = realloc(r->pages, cap * sizeof *p);
    if (!p)
        goto oom;
    r->pages = p;
    p = realloc(r->pages2, cap * sizeof *p);
    if (!p)
        goto oom;
    r->pages2 = p;
    uint8_t *f = realloc(r->flags, cap);
    if (!f)
        goto oom;
    r->flags = f;
    r->scratch_cap = cap;
    return 0;
oom:
    reply_oom(r);
    return -ENOMEM;
}

/* ---------- validation helpers ---------- */

int kvp__check_count(struct kvp_ctx *c, size_t n)
{
    size_t max = c->srv->cfg.max_keys;
    if (n <= max)
        return 0;
    kvp__reply_error(c, 413, "Too many keys: more than %zu in one request", max);
    return -1;
}

/* Replies to a body the guard refused; the texts are in docs/protocol-notes.md. */
static void reply_guard(struct kvp_ctx *c, const struct kvp_guard_fail *f)
{
    switch (f->rule) {
    case KVP_GUARD_DEPTH:
        kvp__reply_error(c, 400, "Invalid JSON body: nesting deeper than %zu levels at byte %zu",
                         f->limit, f->offset);
        break;
    case KVP_GUARD_LIST:
        kvp__reply_error(c, 413, "Too many keys: more than %zu in one request", f->limit);
        break;
    case KVP_GUARD_FIELDS:
        kvp__reply_error(c, 413, "Too many fields: more than %zu in one object at byte %zu",
                         f->limit, f->offset);
        break;
    case KVP_GUARD_VALUES:
        kvp__reply_error(c, 413, "Too many values: more than %zu JSON values in one request",
                         f->limit);
        break;
    case KVP_GUARD_STRING:
        kvp__reply_error(c, 400,
                         "Invalid JSON body: string longer than %zu bytes at byte %zu (keys are "
                         "at most 1024 bytes)",
                         f->limit, f->offset);
        break;
    default:
        kvp__reply_error(
            c, 400, "Invalid JSON body: number or literal longer than %zu characters at byte %zu",
            f->limit, f->offset);
        break;
    }
}

int kvp__body_list(struct kvp_ctx *c, const char *field, json_t **out)
{
    json_t *v = json_object_get(c->body, field);
    *out = v;
    if (!v || json_is_array(v))
        return 0;
    return -1;
}

ptrdiff_t kvp__parse_str_keys(struct kvp_ctx *c, json_t *arr, int exists_fmt)
{
    size_t n = arr ? json_array_size(arr) : 0;
    if (kvp__check_count(c, n) || kvp__scratch(c, n))
        return -1;
    struct kvp_str *keys = c->rep->keys;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_string(v)) {
            if (exists_fmt)
                kvp__reply_error(c, 400, "Invalid keys format");
            else
                kvp__reply_error(c, 400, "Invalid request format: keys[%zu] must be a string", i);
            return -1;
        }
        keys[i].ptr = json_string_value(v);
        keys[i].len = json_string_length(v);
        const char *why = kvp_key_problem(keys[i].ptr, keys[i].len);
        if (why) {
            kvp__reply_error(c, 400, "Invalid key: keys[%zu] %s", i, why);
            return -1;
        }
    }
    return (ptrdiff_t)n;
}

ptrdiff_t kvp__parse_alloc_keys(struct kvp_ctx *c, json_t *arr)
{
    size_t n = arr ? json_array_size(arr) : 0;
    if (kvp__check_count(c, n) || kvp__scratch(c, n))
        return -1;
    struct kvp_str *keys = c->rep->keys;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        json_t *k = v;
        if (json_is_array(v)) {
            k = json_array_get(v, 0);
            if (json_array_size(v) != 2 || !json_is_string(json_array_get(v, 1)))
                k = NULL;
        }
        if (!json_is_string(k)) {
            kvp__reply_error(
                c, 400, "Invalid request format: keys[%zu] must be a string or [key, prefix_key]",
                i);
            return -1;
        }
        keys[i].ptr = json_string_value(k);
        keys[i].len = json_string_length(k);
        const char *why = kvp_key_problem(keys[i].ptr, keys[i].len);
        if (why) {
            kvp__reply_error(c, 400, "Invalid key: keys[%zu] %s", i, why);
            return -1;
        }
    }
    return (ptrdiff_t)n;
}

int kvp__parse_confirm(struct kvp_ctx *c, json_t *conf, const char *field, size_t *np,
                       size_t *nrelp, int sglang_types)
{
    size_t n = conf ? json_array_size(conf) : 0;
    if (kvp__check_count(c, n))
        return -1;
    json_t *rel = json_object_get(c->body, "pages_to_release");
    size_t nrel = json_is_array(rel) ? json_array_size(rel) : 0;
    if (kvp__scratch(c, n > nrel ? n : nrel))
        return -1;
    struct kvp_str *keys = c->rep->keys;
    int64_t *pages = c->rep->pages;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(conf, i);
        json_t *k = json_array_get(e, 0), *p = json_array_get(e, 1);
        if (json_array_size(e) != 2 || !json_is_string(k) || !json_is_integer(p)) {
            kvp__reply_error(c, 400, "Confirmation failed: %s[%zu] must be [key, page]", field, i);
            return -1;
        }
        keys[i].ptr = json_string_value(k);
        keys[i].len = json_string_length(k);
        pages[i] = json_integer_value(p);
        const char *why = kvp_key_problem(keys[i].ptr, keys[i].len);
        if (why) {
            kvp__reply_error(c, 400, "Confirmation failed: %s[%zu] key %s", field, i, why);
            return -1;
        }
    }
    if (rel && !json_is_array(rel)) {
        if (sglang_types)
            kvp__reply_error(c, 400, "Invalid request format: 'pages_to_release' must be a list");
        else
            kvp__reply_error(c, 400, "Confirmation failed: pages_to_release must be a list");
        return -1;
    }
    if (kvp__check_count(c, nrel))
        return -1;
    int64_t *release = c->rep->pages2;
    for (size_t i = 0; i < nrel; i++) {
        json_t *p = json_array_get(rel, i);
        if (!json_is_integer(p)) {
            kvp__reply_error(
                c, 400, "Confirmation failed: pages_to_release[%zu] must be an integer page", i);
            return -1;
        }
        release[i] = json_integer_value(p);
    }
    *np = n;
    *nrelp = nrel;
    return 0;
}

void kvp__reply_unavailable(struct kvp_ctx *c, const struct kvp_error *err)
{
    kvp__reply_error(c, 503, "Service unavailable: %s; retry later",
                     err->msg[0] ? err->msg : kvp_strerror(err->code));
}

void kvp__confirm_error(struct kvp_ctx *c, int rc, const struct kvp_error *err, const char *field,
                        uint32_t rank)
{
    if (err->rule == KVP_RULE_UNAVAILABLE) {
        kvp__reply_unavailable(c, err);
    } else if (rc == -EINVAL && err->rule == KVP_RULE_CONFIRM_PAGE) {
        kvp__reply_error(c, 400, "Confirmation failed: %s[%lld] page %lld is outside [0, %lld)",
                         field, (long long)err->index, (long long)err->value,
                         (long long)err->limit);
    } else if (rc == -EINVAL && err->rule == KVP_RULE_RELEASE_PAGE) {
        kvp__reply_error(
            c, 400, "Confirmation failed: pages_to_release[%lld] page %lld is outside [0, %lld)",
            (long long)err->index, (long long)err->value, (long long)err->limit);
    } else if (rc == -EINVAL && err->rule == KVP_RULE_KEY) {
        const char *why = err->value == 0                ? "is empty"
                          : err->value > KVP_MAX_KEY_LEN ? "is longer than 1024 bytes"
                                                         : "contains a NUL byte";
        kvp__reply_error(c, 400, "Confirmation failed: %s[%lld] key %s", field,
                         (long long)err->index, why);
    } else if (rc == -EEXIST) {
        kvp__reply_error(c, 409, "Confirmation failed: page %lld on rank %u holds another key",
                         (long long)err->value, rank);
    } else if (rc == -EINVAL) {
        kvp__reply_error(c, 400, "Confirmation failed: %s", err->msg);
    } else if (err->rule == KVP_RULE_IO) {
        kvp__reply_log_error(c->rep, rc, err->msg, 0);
    } else {
        kvp__reply_internal(c, rc, "confirm");
    }
}

void kvp__meta_error(struct kvp_ctx *c, int rc, const struct kvp_error *err, const char *field)
{
    if (err->rule == KVP_RULE_UNAVAILABLE) {
        kvp__reply_unavailable(c, err);
    } else if (rc == -EINVAL && err->rule == KVP_RULE_KEY) {
        const char *why = err->value == 0                ? "is empty"
                          : err->value > KVP_MAX_KEY_LEN ? "is longer than 1024 bytes"
                                                         : "contains a NUL byte";
        kvp__reply_error(c, 400, "Invalid key: %s[%lld] %s", field, (long long)err->index, why);
    } else if (rc == -EINVAL && err->rule == KVP_RULE_NAMESPACE) {
        kvp__reply_error(c, 400, "Invalid namespace");
    } else if (rc == -EINVAL) {
        kvp__reply_error(c, 400, "Invalid request: %s",
                         err->msg[0] ? err->msg : "invalid argument");
    } else if (rc == -EEXIST) {
        kvp__reply_error(c, 409, "Conflict: %s", err->msg[0] ? err->msg : "conflict");
    } else if (err->rule == KVP_RULE_IO) {
        kvp__reply_log_error(c->rep, rc, err->msg, 0);
    } else {
        kvp__reply_internal(c, rc, "metadata");
    }
}

int kvp__find_ns(struct kvp_ctx *c, const char *pool, size_t plen, int create, struct kvp_ns **ns)
{
    struct kvp_error err = {0};
    int rc = kvp_meta_ns(c->srv->meta, c->dep, c->dlen, pool, plen, create, ns, &err);
    if (rc == 0 || rc == -ENOENT)
        return rc;
    if (err.rule == KVP_RULE_UNAVAILABLE)
        kvp__reply_unavailable(c, &err);
    else if (rc == -EINVAL)
        kvp__reply_error(c, 400, "Invalid namespace");
    else if (err.rule == KVP_RULE_IO)
        kvp__reply_log_error(c->rep, rc, err.msg, 0);
    else
        kvp__reply_internal(c, rc, "namespace");
    return rc;
}

/* ---------- routing ---------- */

static const char *const route_names[KVP_ROUTE_COUNT] = {
    [KVP_ROUTE_NONE] = "unmatched",
    [KVP_ROUTE_VLLM_INIT] = "/rank/{rank}/initialize",
    [KVP_ROUTE_VLLM_ALLOCATE] = "/keys/batch_allocate",
    [KVP_ROUTE_VLLM_CONFIRM] = "/keys/confirm_write",
    [KVP_ROUTE_VLLM_EXISTS] = "/keys/batch_exists",
    [KVP_ROUTE_VLLM_LOCATIONS] = "/keys/get_locations",
    [KVP_ROUTE_VLLM_CLEAR] = "/clear",
    [KVP_ROUTE_VLLM_DELETE] = "/keys/delete",
    [KVP_ROUTE_SGL_INIT] = "/{rank}/initialize",
    [KVP_ROUTE_STATUS] = "/",
    [KVP_ROUTE_SGL_EXISTS] = "/{rank}/exists",
    [KVP_ROUTE_SGL_RESERVE] = "/{rank}/reserve_and_allocate_page_indices",
    [KVP_ROUTE_SGL_CONFIRM] = "/{rank}/confirm_write",
    [KVP_ROUTE_SGL_DELETE] = "/{rank}/delete_keys",
    [KVP_ROUTE_SGL_CLEAR] = "/{rank}/clear",
    [KVP_ROUTE_SGL_GET] = "/{rank}/get_page_indices",
    [KVP_ROUTE_HEALTHZ] = "/healthz",
    [KVP_ROUTE_METRICS] = "/metrics",
    [KVP_ROUTE_STATS] = "/v1/stats",
};

const char *kvp__route_name(int route)
{
    if (route < 0 || route >= KVP_ROUTE_COUNT)
        return "unmatched";
    return route_names[route];
}

struct seg {
    const char *p;
    size_t n;
};

static int seg_is(struct seg s, const char *lit)
{
    size_t n = strlen(lit);
    return s.n == n && !memcmp(s.p, lit, n);
}

/* A path segment where a rank goes: [+-]?[0-9]+ (anything else is 404). */
static int rank_like(struct seg s)
{
    size_t i = 0;
    if (s.n && (s.p[0] == '-' || s.p[0] == '+'))
        i = 1;
    if (i == s.n)
        return 0;
    for (; i < s.n; i++)
        if (s.p[i] < '0' || s.p[i] > '9')
            return 0;
    return 1;
}

/* Value of a rank_like segment; 0 when outside 0..2^31-1. */
static int rank_value(struct seg s, uint32_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (s.p[0] == '-' || s.p[0] == '+')
        neg = s.p[i++] == '-';
    uint64_t v = 0;
    for (; i < s.n; i++) {
        v = v * 10 + (uint64_t)(s.p[i] - '0');
        if (v > KVP_MAX_RANK)
            return 0;
    }
    if (neg && v != 0)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

struct match {
    int route;
    int get; /* a GET route (else POST) */
    struct seg rank;
};

static void match_route(const char *p, size_t n, int has_ns, struct match *m)
{
    static const struct {
        const char *op;
        int route;
    } sgl[] = {
        {"initialize", KVP_ROUTE_SGL_INIT},
        {"exists", KVP_ROUTE_SGL_EXISTS},
        {"reserve_and_allocate_page_indices", KVP_ROUTE_SGL_RESERVE},
        {"confirm_write", KVP_ROUTE_SGL_CONFIRM},
        {"delete_keys", KVP_ROUTE_SGL_DELETE},
        {"clear", KVP_ROUTE_SGL_CLEAR},
        {"get_page_indices", KVP_ROUTE_SGL_GET},
    };
    static const struct {
        const char *op;
        int route;
    } keys_ops[] = {
        {"batch_allocate", KVP_ROUTE_VLLM_ALLOCATE}, {"confirm_write", KVP_ROUTE_VLLM_CONFIRM},
        {"batch_exists", KVP_ROUTE_VLLM_EXISTS},     {"get_locations", KVP_ROUTE_VLLM_LOCATIONS},
        {"delete", KVP_ROUTE_VLLM_DELETE},
    };
    struct seg s[4];
    size_t ns = 0;
    memset(m, 0, sizeof *m);
    if (n == 0 || p[0] != '/')
        return;
    if (n == 1) { /* "/" or "/ns/NAME/" */
        m->route = KVP_ROUTE_STATUS, m->get = 1;
        return;
    }
    size_t i = 1;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '/')
            j++;
        if (ns == 4)
            return;
        s[ns].p = p + i;
        s[ns].n = j - i;
        ns++;
        if (j >= n)
            break;
        i = j + 1;
    }
    for (size_t k = 0; k < ns; k++)
        if (s[k].n == 0)
            return;
    if (ns == 1) {
        if (seg_is(s[0], "clear"))
            m->route = KVP_ROUTE_VLLM_CLEAR;
        else if (!has_ns && seg_is(s[0], "healthz"))
            m->route = KVP_ROUTE_HEALTHZ, m->get = 1;
        else if (!has_ns && seg_is(s[0], "metrics"))
            m->route = KVP_ROUTE_METRICS, m->get = 1;
    } else if (ns == 2) {
        if (seg_is(s[0], "keys")) {
            for (size_t k = 0; k < sizeof keys_ops / sizeof keys_ops[0]; k++)
                if (seg_is(s[1], keys_ops[k].op))
                    m->route = keys_ops[k].route;
        } else if (!has_ns && seg_is(s[0], "v1") && seg_is(s[1], "stats")) {
            m->route = KVP_ROUTE_STATS, m->get = 1;
        } else if (rank_like(s[0])) {
            for (size_t k = 0; k < sizeof sgl / sizeof sgl[0]; k++)
                if (seg_is(s[1], sgl[k].op)) {
                    m->route = sgl[k].route;
                    m->rank = s[0];
                }
        }
    } else if (ns == 3) {
        if (seg_is(s[0], "rank") && rank_like(s[1]) && seg_is(s[2], "initialize")) {
            m->route = KVP_ROUTE_VLLM_INIT;
            m->rank = s[1];
        }
    }
}

void kvp__server_init(struct kvp_server *srv, struct kvp_meta *meta,
                      const struct kvp_server_config *cfg)
{
    memset(srv, 0, sizeof *srv);
    srv->meta = meta;
    srv->cfg = *cfg;
    if (!srv->cfg.max_body)
        srv->cfg.max_body = KVP_DEFAULT_MAX_BODY;
    if (!srv->cfg.max_keys)
        srv->cfg.max_keys = KVP_DEFAULT_MAX_KEYS;
    if (srv->cfg.token && !srv->cfg.token[0])
        srv->cfg.token = NULL;
    srv->token_len = srv->cfg.token ? strlen(srv->cfg.token) : 0;
    srv->started_ns = kvp__mono_ns();
}

/* Longest decoded path (after a namespace prefix) that can name a route. */
#define PATH_DECODE_MAX 512

/* Length of s[0..n) with its %XX escapes decoded (a '%' not followed by two
 * hex digits stays as it is, as libmicrohttpd leaves it). */
static size_t pct_decoded_len(const char *s, size_t n)
{
    size_t len = 0;
    for (size_t i = 0; i < n; len++) {
        int esc = s[i] == '%' && i + 2 < n && kvp__hex_value(s[i + 1]) >= 0 &&
                  kvp__hex_value(s[i + 2]) >= 0;
        i += esc ? 3 : 1;
    }
    return len;
}

/* Decodes s[0..n) into out (pct_decoded_len bytes); returns the length. */
static size_t pct_decode(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < n && (hi = kvp__hex_value(s[i + 1])) >= 0 &&
            (lo = kvp__hex_value(s[i + 2])) >= 0) {
            out[o++] = (char)(hi << 4 | lo);
            i += 3;
        } else {
            out[o++] = s[i++];
        }
    }
    return o;
}

static size_t segments_of(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '/';
    return k;
}

/* The engines' protocols: their routes (a range of enum kvp_route), the
 * fast path for their bodies (1: answered without jansson) and their
 * handlers (vllm.c, sglang.c). */
struct dialect {
    int first, last;
    int (*fast)(struct kvp_ctx *c, int route);
    void (*handle)(struct kvp_ctx *c, int route);
};

static const struct dialect dialects[] = {
    {KVP_ROUTE_VLLM_INIT, KVP_ROUTE_VLLM_DELETE, kvp__vllm_fast, kvp__vllm_handle},
    {KVP_ROUTE_SGL_INIT, KVP_ROUTE_SGL_GET, kvp__sglang_fast, kvp__sglang_handle},
};

static const struct dialect *dialect_of(int route)
{
    for (size_t i = 0; i < sizeof dialects / sizeof *dialects; i++)
        if (route >= dialects[i].first && route <= dialects[i].last)
            return &dialects[i];
    return NULL;
}

static void dispatch(struct kvp_ctx *c)
{
    struct kvp_server *srv = c->srv;
    const struct kvp_request *req = c->req;
    const char *path = req->path ? req->path : "";
    size_t plen = req->path ? req->path_len : 0;

    if (!kvp__client_allowed(srv, req->client)) {
        kvp__reply_error(c, 403, "Client address not allowed");
        return;
    }

    /* The path comes with its %-escapes (keep_escapes in serve.c): split
     * first, then decode, so that "/ns/a%2Fb/..." names the deployment
     * "a/b" (a bad name) rather than another path. */
    char dbuf[KVP_MAX_NAME_LEN + 1], pbuf[PATH_DECODE_MAX];
    int has_ns = 0;
    c->dep = "default";
    c->dlen = 7;
    if (plen >= 4 && !memcmp(path, "/ns/", 4)) {
        const char *name = path + 4;
        const char *slash = memchr(name, '/', plen - 4);
        size_t raw = slash ? (size_t)(slash - name) : plen - 4;
        has_ns = 1;
        c->dep = name;
        c->dlen = raw;
        if (memchr(name, '%', raw)) {
            /* Longer than any name once decoded: keep it raw, it is bad either way. */
            if (pct_decoded_len(name, raw) <= KVP_MAX_NAME_LEN)
                c->dlen = pct_decode(name, raw, dbuf), c->dep = dbuf;
        }
        plen -= 4 + raw;
        path = name + raw;
    }
    if (memchr(path, '%', plen)) {
        /* No route has a NUL or a '/' inside a segment: those are Not Found. */
        size_t n = pct_decoded_len(path, plen);
        if (n < sizeof pbuf && pct_decode(path, plen, pbuf) == n && !memchr(pbuf, '\0', n) &&
            segments_of(pbuf, n) == segments_of(path, plen)) {
            path = pbuf;
            plen = n;
        } else {
            plen = 0; /* (or longer than any route) */
        }
    }

    struct match m;
    match_route(path, plen, has_ns, &m);
    c->rep->route = m.route;

    /* The status page holds no figures: it asks for the token itself. */
    if (srv->cfg.token && m.route != KVP_ROUTE_HEALTHZ && m.route != KVP_ROUTE_STATUS &&
        !kvp__token_ok(srv, req->authorization)) {
        c->rep->route = m.route;
        kvp__reply_error(c, 401, "Invalid or missing bearer token");
        c->rep->www_authenticate = "Bearer";
        return;
    }
    if (m.route == KVP_ROUTE_NONE) {
        kvp__reply_error(c, 404, "Not Found");
        return;
    }
    const char *method = req->method ? req->method : "";
    int method_ok =
        m.get ? (!strcmp(method, "GET") || !strcmp(method, "HEAD")) : !strcmp(method, "POST");
    if (!method_ok) {
        kvp__reply_error(c, 405, "Method Not Allowed");
        c->rep->allow = m.get ? "GET, HEAD" : "POST";
        return;
    }
    if (m.get && m.route == KVP_ROUTE_STATUS && has_ns && !kvp_deployment_valid(c->dep, c->dlen)) {
        kvp__reply_error(c, 400, "Invalid namespace");
        return;
    }
    if (m.get) {
        kvp__native_handle(c, m.route);
        return;
    }
    if (has_ns && !kvp_deployment_valid(c->dep, c->dlen)) {
        kvp__reply_error(c, 400, "Invalid namespace");
        return;
    }
    if (m.rank.p && !rank_value(m.rank, &c->path_rank)) {
        kvp__reply_error(c, 400, "Invalid rank: %.*s", (int)(m.rank.n > 4096 ? 4096 : m.rank.n),
                         m.rank.p);
        return;
    }
    if (req->body_memory_full) {
        kvp__reply_error(
            c, 503,
            "Server busy: request bodies over 1 MiB being received or handled take all "
            "of the %zu bytes allowed (--max-body-memory); retry later",
            req->body_memory_full);
        return;
    }
    if (req->body_too_large || req->body_len > srv->cfg.max_body) {
        kvp__reply_error(c, 413, "Request body too large: limit is %zu bytes", srv->cfg.max_body);
        return;
    }

    c->body = NULL;
    const struct dialect *d = dialect_of(m.route);
    if (!d) { /* every POST route is a dialect's */
        kvp__reply_internal(c, -EINVAL, "routing");
        return;
    }
    if (req->body_len && !srv->cfg.no_fast_bodies && d->fast(c, m.route))
        return;
    if (req->body_len) {
        struct kvp_guard_fail gf;
        if (kvp__body_guard(req->body, req->body_len, srv->cfg.max_keys, &gf)) {
            reply_guard(c, &gf);
            return;
        }
        json_error_t jerr;
        json_t *j = kvp__json_load(req->body, req->body_len, &jerr);
        if (!j) {
            kvp__reply_error(c, 400, "Invalid JSON body: %s at byte %lld", jerr.text,
                             (long long)jerr.position);
            return;
        }
        if (!json_is_object(j)) {
            json_decref(j);
            kvp__reply_error(c, 400, "Invalid JSON body: expected an object at byte 0");
            return;
        }
        c->body = j;
    }
    d->handle(c, m.route);
    if (!(c->srv->cfg.json_is_scratch && c->srv->cfg.json_is_scratch()))
        json_decref(c->body);
    c->body = NULL;
}

void kvp__server_handle(struct kvp_server *srv, const struct kvp_request *req,
                        struct kvp_reply *rep)
{
    uint64_t t0 = kvp__mono_ns();
    struct kvp_ctx c = {.srv = srv, .req = req, .rep = rep};
    reply_reset(rep);
    dispatch(&c);
    if (rep->body.oom)
        reply_oom(rep);
    kvp__metrics_record(&srv->metrics, rep->route, rep->status, kvp__mono_ns() - t0);
}
