/*
 * What the dialects (vllm.c, sglang.c, native.c) share below the routing
 * table of handle.c: the replies (errors, JSON, empty), the per-request
 * scratch arrays, reading keys and confirmations out of a parsed body, the
 * guard's refusals, and the mapping of a metadata error to its status and
 * text (docs/protocol-notes.md).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/bodyguard.h"
#include "meta/rules.h"
#include "server/server.h"
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

void kvp__reply_reset(struct kvp_reply *rep)
{
    rep->ticket = 0;
    rep->status = 500;
    rep->content_type = NULL;
    rep->allow = NULL;
    rep->www_authenticate = NULL;
    rep->route = KVP_ROUTE_NONE;
    rep->why.set = 0;
    kvp__buf_reset(&rep->body);
}

void kvp__reply_oom(struct kvp_reply *rep)
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

void kvp__reply_rule(struct kvp_ctx *c, int rule, int64_t index, int64_t value, int64_t limit)
{
    c->rep->why = (struct kvp_reply_rule){1, rule, index, value, limit};
}

void kvp__reply_err(struct kvp_ctx *c, const struct kvp_error *err)
{
    kvp__reply_rule(c, err->rule, err->index, err->value, err->limit);
}

/* The rule's fields after "detail", for a client that asked for them. */
static void reply_fields(struct kvp_ctx *c)
{
    struct kvp_reply *rep = c->rep;
    struct kvp_reply_rule w = rep->why;
    rep->why.set = 0;
    const char *name = w.set ? kvp_rule_name(w.rule) : NULL;
    if (!name || !c->req || !c->req->error_fields || rep->body.oom || !rep->body.len)
        return;
    rep->body.len--; /* the closing brace */
    kvp__jw_lit(&rep->body, ", \"rule\": ");
    kvp__jw_str(&rep->body, name, strlen(name));
    kvp__jw_lit(&rep->body, ", \"index\": ");
    kvp__jw_int(&rep->body, w.index);
    kvp__jw_lit(&rep->body, ", \"value\": ");
    kvp__jw_int(&rep->body, w.value);
    kvp__jw_lit(&rep->body, ", \"limit\": ");
    kvp__jw_int(&rep->body, w.limit);
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
        reply_fields(c);
        return;
    }
    /* Long messages only come from long client text (a huge rank segment). */
    char *big = malloc((size_t)n + 1);
    if (!big) {
        kvp__reply_oom(c->rep);
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    reply_detail(c->rep, status, big, (size_t)n);
    free(big);
    reply_fields(c);
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
        kvp__reply_oom(c->rep);
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
    kvp__reply_oom(r);
    return -ENOMEM;
}

/* ---------- validation helpers ---------- */

int kvp__check_count(struct kvp_ctx *c, size_t n)
{
    size_t max = c->srv->cfg.max_keys;
    if (n <= max)
        return 0;
    kvp__reply_rule(c, KVP_RULE_TOO_MANY, -1, (int64_t)n, (int64_t)max);
    kvp__reply_error(c, 413, "Too many keys: more than %zu in one request", max);
    return -1;
}

/* Replies to a body the guard refused; the texts are in docs/protocol-notes.md. */
void kvp__reply_guard(struct kvp_ctx *c, const struct kvp_guard_fail *f)
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

int kvp__body_reason(struct kvp_ctx *c)
{
    json_t *v = json_object_get(c->body, "reason");
    if (!v)
        return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "integrity"))
        return 1;
    kvp__reply_error(c, 400, "Invalid request format: 'reason' must be 'integrity'");
    return -1;
}

/* Keeps the string s as key i of the request; -1 after replying 400 when it
 * is not a valid key. */
static int take_key(struct kvp_ctx *c, size_t i, json_t *s)
{
    struct kvp_str *k = &c->rep->keys[i];
    k->ptr = json_string_value(s);
    k->len = json_string_length(s);
    const char *why = kvp_key_problem(k->ptr, k->len);
    if (why) {
        kvp__reply_rule(c, KVP_RULE_KEY, (int64_t)i, (int64_t)k->len, KVP_MAX_KEY_LEN);
        kvp__reply_error(c, 400, "Invalid key: keys[%zu] %s", i, why);
        return -1;
    }
    return 0;
}

ptrdiff_t kvp__parse_str_keys(struct kvp_ctx *c, json_t *arr, int exists_fmt)
{
    size_t n = arr ? json_array_size(arr) : 0;
    if (kvp__check_count(c, n) || kvp__scratch(c, n))
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_string(v)) {
            if (exists_fmt)
                kvp__reply_error(c, 400, "Invalid keys format");
            else
                kvp__reply_error(c, 400, "Invalid request format: keys[%zu] must be a string", i);
            return -1;
        }
        if (take_key(c, i, v))
            return -1;
    }
    return (ptrdiff_t)n;
}

ptrdiff_t kvp__parse_alloc_keys(struct kvp_ctx *c, json_t *arr)
{
    size_t n = arr ? json_array_size(arr) : 0;
    if (kvp__check_count(c, n) || kvp__scratch(c, n))
        return -1;
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
        if (take_key(c, i, k))
            return -1;
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
            kvp__reply_rule(c, KVP_RULE_KEY, (int64_t)i, (int64_t)keys[i].len, KVP_MAX_KEY_LEN);
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

/* A parent: a valid key, or null (none); 0 or -1 after replying. what
 * names it in the message. */
static int parent_value(struct kvp_ctx *c, json_t *v, struct kvp_str *out, const char *what,
                        size_t i)
{
    out->ptr = NULL;
    out->len = 0;
    if (json_is_null(v))
        return 0;
    char why[64] = "must be a key or null";
    if (json_is_string(v)) {
        const char *p = kvp_key_problem(json_string_value(v), json_string_length(v));
        if (!p) {
            out->ptr = json_string_value(v);
            out->len = json_string_length(v);
            return 0;
        }
        snprintf(why, sizeof why, "key %s", p);
        kvp__reply_rule(c, KVP_RULE_KEY, i == SIZE_MAX ? -1 : (int64_t)i,
                        (int64_t)json_string_length(v), KVP_MAX_KEY_LEN);
    }
    if (i == SIZE_MAX)
        kvp__reply_error(c, 400, "Confirmation failed: %s %s", what, why);
    else
        kvp__reply_error(c, 400, "Confirmation failed: %s[%zu] %s", what, i, why);
    return -1;
}

static int parse_tokens(struct kvp_ctx *c, json_t *tl, const char *field, size_t n,
                        struct kvp_confirm_extra *x)
{
    if (!json_is_array(tl) || json_array_size(tl) != n) {
        kvp__reply_error(c, 400,
                         "Confirmation failed: token_ids must be a list of %zu token lists (or "
                         "nulls), one per %s",
                         n, field);
        return -1;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tl, i);
        if (json_is_null(t))
            continue;
        if (!json_is_array(t) || json_array_size(t) > KVP_MAX_PAGE_TOKENS) {
            kvp__reply_error(c, 400,
                             "Confirmation failed: token_ids[%zu] must be a list of at most %d "
                             "tokens, or null",
                             i, KVP_MAX_PAGE_TOKENS);
            return -1;
        }
        for (size_t k = 0; k < json_array_size(t); k++) {
            json_t *v = json_array_get(t, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > (json_int_t)UINT32_MAX) {
                kvp__reply_error(c, 400,
                                 "Confirmation failed: token_ids[%zu][%zu] must be a token id "
                                 "(an integer from 0 to 4294967295)",
                                 i, k);
                return -1;
            }
        }
        total += json_array_size(t);
    }
    x->tok = calloc(n ? n : 1, sizeof *x->tok);
    x->ntok = calloc(n ? n : 1, sizeof *x->ntok);
    x->flat = malloc((total ? total : 1) * sizeof *x->flat);
    if (!x->tok || !x->ntok || !x->flat) {
        kvp__reply_internal(c, -ENOMEM, "token_ids");
        return -1;
    }
    uint32_t *f = x->flat;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tl, i);
        x->tok[i] = f;
        x->ntok[i] = (uint32_t)json_array_size(t); /* 0 for null */
        for (size_t k = 0; k < x->ntok[i]; k++)
            *f++ = (uint32_t)json_integer_value(json_array_get(t, k));
    }
    x->opts.token_ids = x->tok;
    x->opts.ntokens = x->ntok;
    return 0;
}

int kvp__parse_confirm_extra(struct kvp_ctx *c, const char *field, size_t n,
                             struct kvp_confirm_extra *x)
{
    memset(x, 0, sizeof *x);
    x->opts.opts_size = sizeof x->opts;
    json_t *pk = json_object_get(c->body, "parent_keys");
    json_t *pre = json_object_get(c->body, "prefix_key");
    json_t *tl = json_object_get(c->body, "token_ids");
    if (!pk && !pre && !tl)
        return 0;
    x->used = 1;
    if (pk && pre) {
        kvp__reply_error(c, 400, "Confirmation failed: give parent_keys or prefix_key, not both");
        return -1;
    }
    if (pk && (!json_is_array(pk) || json_array_size(pk) != n)) {
        kvp__reply_error(
            c, 400,
            "Confirmation failed: parent_keys must be a list of %zu keys (or nulls), one per %s", n,
            field);
        return -1;
    }
    if (pre) {
        struct kvp_str first;
        if (parent_value(c, pre, &first, "prefix_key", SIZE_MAX) ||
            kvp__confirm_chain(c, n, &first, x))
            return -1;
    } else if (pk) {
        if (!(x->parents = calloc(n ? n : 1, sizeof *x->parents))) {
            kvp__reply_internal(c, -ENOMEM, "parent_keys");
            return -1;
        }
        x->opts.parents = x->parents;
        for (size_t i = 0; i < n; i++)
            if (parent_value(c, json_array_get(pk, i), &x->parents[i], "parent_keys", i))
                return -1;
    }
    return tl ? parse_tokens(c, tl, field, n, x) : 0;
}

int kvp__confirm_chain(struct kvp_ctx *c, size_t n, const struct kvp_str *first,
                       struct kvp_confirm_extra *x)
{
    x->used = 1;
    x->opts.opts_size = sizeof x->opts;
    if (!(x->parents = calloc(n ? n : 1, sizeof *x->parents))) {
        kvp__reply_internal(c, -ENOMEM, "prefix_key");
        return -1;
    }
    x->opts.parents = x->parents;
    /* A chain: each page's parent is the page confirmed before it. */
    for (size_t i = 0; i < n; i++)
        x->parents[i] = i ? c->rep->keys[i - 1] : *first;
    return 0;
}

void kvp__confirm_extra_free(struct kvp_confirm_extra *x)
{
    free(x->parents);
    free(x->tok);
    free(x->ntok);
    free(x->flat);
    memset(x, 0, sizeof *x);
}

void kvp__reply_unavailable(struct kvp_ctx *c, const struct kvp_error *err)
{
    kvp__reply_error(c, 503, "Service unavailable: %s; retry later",
                     err->msg[0] ? err->msg : kvp_strerror(err->code));
}

void kvp__confirm_error(struct kvp_ctx *c, int rc, const struct kvp_error *err, const char *field,
                        uint32_t rank)
{
    if ((rc == -EINVAL || rc == -EEXIST) && err->rule != KVP_RULE_UNAVAILABLE)
        kvp__reply_err(c, err); /* the refusal's fields: the client's error is the meta's */
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
    if ((rc == -EINVAL || rc == -EEXIST) && err->rule != KVP_RULE_UNAVAILABLE)
        kvp__reply_err(c, err); /* the refusal's fields: the client's error is the meta's */
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

int kvp__init_pages(struct kvp_ctx *c, json_int_t n)
{
    struct kvp_error err = {0};
    if (kvp__check_num_pages(n < 1 ? 0 : (uint64_t)n, &err) == 0)
        return 0;
    kvp__reply_err(c, &err);
    kvp__reply_error(c, 400, "Invalid initialization parameters: %s", err.msg);
    return -1;
}

void kvp__init_error(struct kvp_ctx *c, uint32_t rank, json_int_t n, int rc,
                     const struct kvp_error *err)
{
    if (rc != -EEXIST) {
        kvp__meta_error(c, rc, err, "keys");
        return;
    }
    char msg[256];
    kvp__msg_resize_held(msg, sizeof msg, rank, err->value, n);
    kvp__reply_err(c, err);
    kvp__reply_error(c, 409, "%s", msg);
}

void kvp__reply_not_init(struct kvp_ctx *c, uint32_t rank, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvp__reply_rule(c, KVP_RULE_RANK_NOT_INIT, -1, rank, 0);
    kvp__reply_error(c, 404, "%s", msg);
}

int kvp__body_pool(struct kvp_ctx *c, const char *dflt, const char **pool, size_t *plen)
{
    json_t *v = json_object_get(c->body, "namespace");
    *pool = dflt;
    *plen = dflt ? strlen(dflt) : 0;
    if (!v)
        return 0;
    if (!json_is_string(v) || !kvp_pool_valid(json_string_value(v), json_string_length(v))) {
        kvp__reply_rule(c, KVP_RULE_NAMESPACE, -1, 0, 0);
        kvp__reply_error(c, 400, "Invalid namespace");
        return -1;
    }
    *pool = json_string_value(v);
    *plen = json_string_length(v);
    return 0;
}

int kvp__find_ns(struct kvp_ctx *c, const char *pool, size_t plen, int create, struct kvp_ns **ns)
{
    struct kvp_error err = {0};
    int rc = kvp_meta_ns(c->srv->meta, c->dep, c->dlen, pool, plen, create, ns, &err);
    if (rc == 0 || rc == -ENOENT)
        return rc;
    if (err.rule == KVP_RULE_UNAVAILABLE)
        kvp__reply_unavailable(c, &err);
    else if (rc == -EINVAL) {
        kvp__reply_rule(c, KVP_RULE_NAMESPACE, -1, 0, 0);
        kvp__reply_error(c, 400, "Invalid namespace");
    } else if (err.rule == KVP_RULE_IO)
        kvp__reply_log_error(c->rep, rc, err.msg, 0);
    else
        kvp__reply_internal(c, rc, "namespace");
    return rc;
}
