/*
 * kvpage's router-facing routes (issue 38 §2, §3; protocol.md §5):
 *   POST [/ns/NAME]/v1/query   the longest stored prefix of a list of pages,
 *                              per namespace and rank (in the shape of
 *                              Mooncake's indexer API)
 *   POST [/ns/NAME]/v1/pins    pin pages for ttl_s seconds (after LMCache's
 *   DELETE [/ns/NAME]/v1/pins  /cache/pins); unpin
 * The pages are named by "keys" (in prefix order), by "token_ids" with
 * "block_size" (and "cache_salt"), of which kvpage derives its page keys
 * (kvpage/keys.h: SGLang's HiCache keys with an empty salt), or, for the
 * query only, by the engines' event "block_hashes" with "hash_format".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/keys.h"
#include "server/server.h"

/* The most seconds a pin may last: a year. */
#define MAX_TTL_S (365.0 * 86400)

int kvp__query_fast(struct kvp_ctx *c, int route)
{
    (void)c, (void)route;
    return 0; /* rare routes: jansson reads every body */
}

/* The pages a request names. */
struct sel {
    size_t n;                              /* pages */
    char (*derived)[KVP_PAGE_KEY_LEN + 1]; /* token_ids: the keys (owned) */
    uint64_t *hashes;                      /* block_hashes (owned); else keys are in c->rep->keys */
    int form;                              /* enum kvp_hash_form, with hashes */
    int64_t block_size;                    /* 0: not given */
};

static void sel_free(struct sel *s)
{
    free(s->derived);
    free(s->hashes);
}

/* "block_size": absent (0) or a positive integer up to 2^20; -1 after replying. */
static int body_block_size(struct kvp_ctx *c, int64_t *out)
{
    json_t *v = json_object_get(c->body, "block_size");
    *out = 0;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 20)) {
        kvp__reply_error(c, 400,
                         "Invalid request: block_size must be an integer from 1 to 1048576");
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

static int sel_tokens(struct kvp_ctx *c, json_t *toks, struct sel *s)
{
    if (!s->block_size) {
        kvp__reply_error(c, 400, "Invalid request: token_ids need block_size");
        return -1;
    }
    json_t *salt = json_object_get(c->body, "cache_salt");
    if (salt && !json_is_string(salt)) {
        kvp__reply_error(c, 400, "Invalid request: cache_salt must be a string");
        return -1;
    }
    size_t nt = json_array_size(toks);
    uint32_t *t = malloc((nt ? nt : 1) * sizeof *t);
    if (!t) {
        kvp__reply_internal(c, -ENOMEM, "token ids");
        return -1;
    }
    for (size_t i = 0; i < nt; i++) {
        json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > (json_int_t)UINT32_MAX) {
            free(t);
            kvp__reply_error(c, 400,
                             "Invalid request: token_ids[%zu] must be an integer from 0 to "
                             "4294967295",
                             i);
            return -1;
        }
        t[i] = (uint32_t)json_integer_value(v);
    }
    size_t n = nt / (size_t)s->block_size;
    if (kvp__check_count(c, n) || kvp__scratch(c, n)) {
        free(t);
        return -1;
    }
    s->derived = malloc((n ? n : 1) * sizeof *s->derived);
    struct kvp_error err = {0};
    int rc = s->derived
                 ? kvp_page_keys(t, nt, (size_t)s->block_size, NULL,
                                 salt ? json_string_value(salt) : NULL,
                                 salt ? json_string_length(salt) : 0, s->derived, n, NULL, &err)
                 : -ENOMEM;
    free(t);
    if (rc) {
        kvp__reply_internal(c, rc, "page keys");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        c->rep->keys[i].ptr = s->derived[i];
        c->rep->keys[i].len = KVP_PAGE_KEY_LEN;
    }
    s->n = n;
    return 0;
}

/* One block hash: a JSON integer (int64, its two's complement bits: SGLang's
 * signed hashes) or a string of decimal digits up to 2^64-1 (vLLM's uint64
 * hashes above 2^63-1, which JSON parsers read as floats). */
static int hash_of(json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        *out = (uint64_t)json_integer_value(v);
        return 0;
    }
    const char *p = json_string_value(v);
    size_t len = json_string_length(v);
    if (!p || !len || len > 20)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

static int sel_hashes(struct kvp_ctx *c, json_t *arr, struct sel *s)
{
    json_t *f = json_object_get(c->body, "hash_format");
    const char *fs = json_string_value(f);
    if (fs && !strcmp(fs, "sglang")) {
        s->form = KVP_HASH_SGLANG;
    } else if (fs && !strcmp(fs, "vllm")) {
        s->form = KVP_HASH_VLLM;
    } else {
        kvp__reply_error(c, 400,
                         "Invalid request: block_hashes need hash_format 'sglang' (the key's "
                         "first 16 hex digits) or 'vllm' (its last 16)");
        return -1;
    }
    size_t n = json_array_size(arr);
    if (kvp__check_count(c, n))
        return -1;
    s->hashes = malloc((n ? n : 1) * sizeof *s->hashes);
    if (!s->hashes) {
        kvp__reply_internal(c, -ENOMEM, "block hashes");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (hash_of(json_array_get(arr, i), &s->hashes[i])) {
            kvp__reply_error(c, 400,
                             "Invalid request: block_hashes[%zu] must be an integer (int64) or a "
                             "string of decimal digits (uint64)",
                             i);
            return -1;
        }
    s->n = n;
    return 0;
}

/* Reads the pages of the body: exactly one of keys, token_ids and (with
 * hashes_ok) block_hashes. 0, or -1 after replying. */
static int sel_read(struct kvp_ctx *c, struct sel *s, int hashes_ok)
{
    memset(s, 0, sizeof *s);
    static const char *const fields[] = {"keys", "token_ids", "block_hashes"};
    json_t *v[3];
    int given = 0, which = -1;
    for (int i = 0; i < 3; i++)
        if ((v[i] = json_object_get(c->body, fields[i])) && (i < 2 || hashes_ok))
            given++, which = i;
    if (given != 1) {
        kvp__reply_error(c, 400, "Invalid request: give exactly one of keys, token_ids%s",
                         hashes_ok ? " or block_hashes" : "");
        return -1;
    }
    if (!json_is_array(v[which])) {
        kvp__reply_error(c, 400, "Invalid request: %s must be a list", fields[which]);
        return -1;
    }
    if (body_block_size(c, &s->block_size))
        return -1;
    if (which == 1)
        return sel_tokens(c, v[1], s);
    if (which == 2)
        return sel_hashes(c, v[2], s);
    ptrdiff_t n = kvp__parse_str_keys(c, v[0], 0);
    if (n < 0)
        return -1;
    for (ptrdiff_t i = 0; i < n; i++) {
        const char *why = kvp_key_problem(c->rep->keys[i].ptr, c->rep->keys[i].len);
        if (why) {
            kvp__reply_error(c, 400, "Invalid key: keys[%td] %s", i, why);
            return -1;
        }
    }
    s->n = (size_t)n;
    return 0;
}

/* "rank": absent (-1) or an integer in 0..2^31-1; -1 after replying. */
static int body_rank(struct kvp_ctx *c, int64_t *out)
{
    json_t *v = json_object_get(c->body, "rank");
    *out = -1;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > (json_int_t)KVP_MAX_RANK) {
        kvp__reply_error(c, 400, "Invalid request: rank must be an integer from 0 to %u",
                         KVP_MAX_RANK);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* ---------------------------------------------------------------- query */

/* The namespaces of the deployment (and pool, when named) with their ranks. */
struct nsl {
    const char *dep, *pool;
    size_t dlen, plen;
    struct nsl_row {
        char *dep, *pool;
        uint32_t *ranks;
        size_t nranks;
    } * rows;
    size_t n;
    int oom;
};

static int nsl_fn(const char *dep, const char *pool, const struct kvp_rank_stats *ranks,
                  size_t nranks, void *arg)
{
    struct nsl *l = arg;
    if ((l->dep && (strlen(dep) != l->dlen || memcmp(dep, l->dep, l->dlen))) ||
        (l->pool && (strlen(pool) != l->plen || memcmp(pool, l->pool, l->plen))))
        return 0;
    struct nsl_row *rows = realloc(l->rows, (l->n + 1) * sizeof *rows);
    if (!rows)
        return -ENOMEM;
    l->rows = rows;
    struct nsl_row *r = &rows[l->n];
    r->dep = strdup(dep);
    r->pool = strdup(pool);
    r->ranks = malloc((nranks ? nranks : 1) * sizeof *r->ranks);
    r->nranks = nranks;
    if (!r->dep || !r->pool || !r->ranks) {
        free(r->dep);
        free(r->pool);
        free(r->ranks);
        return -ENOMEM;
    }
    for (size_t i = 0; i < nranks; i++)
        r->ranks[i] = ranks[i].rank;
    l->n++;
    return 0;
}

static void nsl_free(struct nsl *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->rows[i].dep);
        free(l->rows[i].pool);
        free(l->rows[i].ranks);
    }
    free(l->rows);
}

/* {"pages": P, "tokens": T or null} */
static void put_len(struct kvp_buf *b, uint64_t pages, int64_t block_size)
{
    kvp__buf_printf(b, "{\"pages\": %llu, \"tokens\": ", (unsigned long long)pages);
    if (block_size)
        kvp__buf_printf(b, "%llu}", (unsigned long long)(pages * (uint64_t)block_size));
    else
        kvp__jw_lit(b, "null}");
}

/* The longest prefix of each rank of row into best (nranks entries;
 * UINT64_MAX: the namespace is gone), a rank at a time (its flags in the
 * scratch: n bytes, however many ranks), and with held (not NULL) each
 * rank's flags at held + j * n; 0 or a meta error (replied). */
static int ns_prefix(struct kvp_ctx *c, const struct sel *s, const struct nsl_row *row,
                     uint64_t *best, uint8_t *held)
{
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, row->pool, strlen(row->pool), 0, &ns);
    if (rc == -ENOENT) { /* dropped meanwhile */
        for (size_t j = 0; j < row->nranks; j++)
            best[j] = UINT64_MAX;
        return 0;
    }
    if (rc)
        return rc;
    uint8_t *hit = c->rep->flags;
    for (size_t j = 0; j < row->nranks; j++) {
        struct kvp_error err = {0};
        if (s->hashes)
            rc = kvp_meta_exists_hashes(ns, s->hashes, s->n, s->form, &row->ranks[j], 1, hit, &err);
        else
            rc = kvp_meta_exists(ns, row->ranks[j], c->rep->keys, s->n, hit, &err);
        if (rc == -EOPNOTSUPP) {
            kvp__reply_error(c, 501, "Not implemented yet: %s", err.msg);
            return rc;
        }
        if (rc && rc != -ENOENT) { /* -ENOENT: the rank went meanwhile, no pages */
            kvp__meta_error(c, rc, &err, "keys");
            return rc;
        }
        size_t i = 0;
        while (!rc && i < s->n && hit[i])
            i++;
        best[j] = i;
        if (held && rc)
            memset(held + j * s->n, 0, s->n);
        else if (held)
            memcpy(held + j * s->n, hit, s->n);
    }
    return 0;
}

/* "held": absent or false (0), true (1); -1 after replying. */
static int body_held(struct kvp_ctx *c)
{
    json_t *v = json_object_get(c->body, "held");
    if (v && !json_is_boolean(v)) {
        kvp__reply_error(c, 400, "Invalid request: held must be true or false");
        return -1;
    }
    return v && json_is_true(v);
}

/* A rank's length as put_len writes it, with "held" (one bool per page
 * asked) when flags is not NULL. */
static void put_rank(struct kvp_buf *b, uint64_t pages, int64_t block_size, const uint8_t *flags,
                     size_t n)
{
    put_len(b, pages, block_size);
    if (!flags || b->oom)
        return;
    b->len--; /* the closing brace */
    kvp__jw_lit(b, ", \"held\": [");
    kvp__jw_bools(b, flags, n);
    kvp__jw_lit(b, "]}");
}

static void do_query(struct kvp_ctx *c)
{
    struct sel s = {0};
    struct nsl l = {.dep = c->dep, .dlen = c->dlen};
    int64_t rank;
    uint64_t *best = NULL;
    uint8_t *held = NULL;
    int want_held;
    if (kvp__body_pool(c, NULL, &l.pool, &l.plen) || body_rank(c, &rank) ||
        (want_held = body_held(c)) < 0 || sel_read(c, &s, 1))
        goto out_sel;
    int rc = kvp_meta_stats(c->srv->meta, nsl_fn, &l);
    if (rc) {
        if (rc == -ENOMEM)
            kvp__reply_internal(c, rc, "query");
        else {
            struct kvp_error err = {.code = rc, .rule = KVP_RULE_UNAVAILABLE};
            snprintf(err.msg, sizeof err.msg, "cannot list the namespaces: %s", kvp_strerror(rc));
            kvp__reply_unavailable(c, &err);
        }
        goto out;
    }
    /* The flags of one rank (the keys' scratch is s.n already). */
    if (kvp__scratch(c, s.n))
        goto out;
    struct kvp_buf *b = NULL;
    uint64_t overall = 0;
    struct kvp_buf out = {0};
    kvp__jw_lit(&out, ", \"namespaces\": [");
    size_t shown = 0;
    for (size_t k = 0; k < l.n; k++) {
        struct nsl_row *row = &l.rows[k];
        /* Only the rank asked for, when one is. */
        if (rank >= 0) {
            size_t keep = 0;
            for (size_t j = 0; j < row->nranks; j++)
                if (row->ranks[j] == (uint32_t)rank)
                    row->ranks[keep++] = row->ranks[j];
            row->nranks = keep;
            if (!keep)
                continue;
        }
        free(best);
        free(held);
        best = malloc((row->nranks ? row->nranks : 1) * sizeof *best);
        held = want_held ? malloc(row->nranks * s.n + 1) : NULL;
        if (!best || (want_held && !held)) {
            kvp__buf_free(&out);
            kvp__reply_internal(c, -ENOMEM, "query");
            goto out;
        }
        if (ns_prefix(c, &s, row, best, held)) {
            kvp__buf_free(&out);
            goto out;
        }
        uint64_t most = 0, all = UINT64_MAX;
        size_t live = 0;
        for (size_t j = 0; j < row->nranks; j++) {
            if (best[j] == UINT64_MAX)
                continue;
            live++;
            most = best[j] > most ? best[j] : most;
            all = best[j] < all ? best[j] : all;
        }
        if (!live)
            continue;
        overall = most > overall ? most : overall;
        if (shown)
            kvp__jw_lit(&out, ", ");
        kvp__jw_lit(&out, "{\"namespace\": ");
        kvp__jw_str(&out, row->pool, strlen(row->pool));
        kvp__jw_lit(&out, ", \"longest_matched\": ");
        put_len(&out, most, s.block_size);
        kvp__jw_lit(&out, ", \"all_ranks\": ");
        put_len(&out, all, s.block_size);
        kvp__jw_lit(&out, ", \"ranks\": {");
        size_t w = 0;
        for (size_t j = 0; j < row->nranks; j++) {
            if (best[j] == UINT64_MAX)
                continue;
            kvp__buf_printf(&out, "%s\"%u\": ", w++ ? ", " : "", row->ranks[j]);
            put_rank(&out, best[j], s.block_size, held ? held + j * s.n : NULL, s.n);
        }
        kvp__jw_lit(&out, "}}");
        shown++;
    }
    kvp__jw_lit(&out, "]}");
    b = kvp__reply_json(c);
    kvp__jw_lit(b, "{\"deployment\": ");
    kvp__jw_str(b, c->dep, c->dlen);
    kvp__jw_lit(b, ", \"queried\": ");
    put_len(b, s.n, s.block_size);
    kvp__jw_lit(b, ", \"longest_matched\": ");
    put_len(b, overall, s.block_size);
    kvp__buf_put(b, out.p, out.len);
    if (out.oom)
        b->oom = 1;
    kvp__buf_free(&out);
out:
    free(best);
    free(held);
    nsl_free(&l);
out_sel:
    sel_free(&s);
}

/* ---------------------------------------------------------------- pins */

/* A pin refused over the limit, to a client that asked for the rule's
 * fields: also the namespace's pinned keys and the most allowed, as a
 * pin's answer has them (kvp_meta_pin's *total and *limit). */
static void pin_refusal_figures(struct kvp_ctx *c, uint64_t total, uint64_t limit)
{
    struct kvp_buf *b = &c->rep->body;
    if (!c->req || !c->req->error_fields || b->oom || !b->len || b->p[b->len - 1] != '}')
        return;
    b->len--;
    kvp__buf_printf(b, ", \"pinned_keys\": %llu, \"max_pinned_keys\": %llu}",
                    (unsigned long long)total, (unsigned long long)limit);
}

static void do_pins(struct kvp_ctx *c)
{
    int pin = !strcmp(c->req->method, "POST");
    const char *pool;
    size_t plen;
    struct sel s = {0};
    double ttl = 0;
    if (kvp__body_pool(c, "kv", &pool, &plen))
        return;
    double ratio = c->srv->cfg.max_pinned_ratio > 0 ? c->srv->cfg.max_pinned_ratio
                                                    : KVP_DEFAULT_MAX_PINNED_RATIO;
    if (pin) {
        json_t *t = json_object_get(c->body, "ttl_s");
        ttl = json_is_number(t) ? json_number_value(t) : 0;
        if (!(ttl >= 0.001 && ttl <= MAX_TTL_S)) {
            kvp__reply_error(c, 400,
                             "Invalid request: ttl_s must be a number of seconds from 0.001 to "
                             "31536000");
            return;
        }
        /* A client's own bound (kvp_meta_pin's max_ratio over http://):
         * the lower of it and the server's applies. */
        json_t *r = json_object_get(c->body, "max_pinned_ratio");
        double asked = json_is_number(r) ? json_number_value(r) : 0;
        if (r && !(asked > 0 && asked <= 1)) {
            kvp__reply_error(c, 400,
                             "Invalid request: max_pinned_ratio must be a number in (0, 1]");
            return;
        }
        if (r && asked < ratio)
            ratio = asked;
    }
    if (sel_read(c, &s, 0))
        goto out;
    struct kvp_ns *ns;
    int rc = kvp__find_ns(c, pool, plen, 0, &ns);
    if (rc == -ENOENT) {
        kvp__reply_rule(c, KVP_RULE_RANK_NOT_INIT, -1, 0, 0);
        kvp__reply_error(c, 404, "Namespace '%.*s' not found", (int)plen, pool);
        goto out;
    }
    if (rc)
        goto out;
    struct kvp_error err = {0};
    uint64_t total = 0, limit = 0, released = 0;
    if (pin)
        rc = kvp_meta_pin(ns, c->rep->keys, s.n, (uint64_t)(ttl * 1000.0 + 0.5), ratio, &total,
                          &limit, &err);
    else
        rc = kvp_meta_unpin(ns, c->rep->keys, s.n, &released, &err);
    if (rc == -EOPNOTSUPP) {
        kvp__reply_error(c, 501, "Not implemented yet: %s", err.msg);
    } else if (rc == -ENOSPC && err.rule == KVP_RULE_TOO_MANY) {
        atomic_fetch_add_explicit(&c->srv->pins_refused, 1, memory_order_relaxed);
        kvp__reply_err(c, &err);
        kvp__reply_error(c, 409, "Pin refused: %s", err.msg);
        pin_refusal_figures(c, total, limit);
    } else if (rc == -ENOENT) {
        kvp__reply_err(c, &err);
        kvp__reply_error(c, 404, "Pin refused: namespace '%.*s' has no initialized rank", (int)plen,
                         pool);
    } else if (rc == -EROFS) {
        kvp__reply_err(c, &err);
        kvp__reply_error(c, 409, "Pin refused: %s", err.msg);
    } else if (rc) {
        kvp__meta_error(c, rc, &err, "keys");
    } else {
        struct kvp_buf *b = kvp__reply_json(c);
        if (pin) {
            kvp__buf_printf(b,
                            "{\"pinned\": %zu, \"ttl_s\": %.3f, \"pinned_keys\": %llu, "
                            "\"max_pinned_keys\": %llu}",
                            s.n, ttl, (unsigned long long)total, (unsigned long long)limit);
        } else {
            uint64_t keys = 0;
            kvp_meta_pinned(ns, -1, &keys, NULL, NULL);
            kvp__buf_printf(b, "{\"unpinned\": %llu, \"pinned_keys\": %llu}",
                            (unsigned long long)released, (unsigned long long)keys);
        }
    }
out:
    sel_free(&s);
}

void kvp__query_handle(struct kvp_ctx *c, int route)
{
    if (route == KVP_ROUTE_QUERY)
        do_query(c);
    else
        do_pins(c);
}

/* ---------------------------------------------------------------- figures */

/* The pins of every namespace (for /metrics and /v1/stats): calls fn for
 * each namespace with pins, and its per-rank pinned pages. Returns 0, 1 when
 * the backend has no pins, or a negative errno. */
typedef void (*pins_fn)(void *arg, const struct nsl_row *row, uint64_t keys, uint64_t refs,
                        const uint64_t *per_rank, const uint64_t *refs_per_rank);

static int pins_walk(struct kvp_server *srv, pins_fn fn, void *arg)
{
    struct nsl l = {0};
    int rc = kvp_meta_stats(srv->meta, nsl_fn, &l);
    for (size_t k = 0; !rc && k < l.n; k++) {
        struct nsl_row *row = &l.rows[k];
        struct kvp_ns *ns;
        uint64_t keys = 0, refs = 0;
        if (kvp_meta_ns(srv->meta, row->dep, strlen(row->dep), row->pool, strlen(row->pool), 0, &ns,
                        NULL) != 0)
            continue;
        int prc = kvp_meta_pinned(ns, -1, &keys, &refs, NULL);
        if (prc == -EOPNOTSUPP) {
            rc = 1;
            break;
        }
        if (prc || !keys)
            continue;
        uint64_t *per = calloc(row->nranks ? 2 * row->nranks : 1, sizeof *per);
        if (!per) {
            rc = -ENOMEM;
            break;
        }
        for (size_t j = 0; j < row->nranks; j++)
            kvp_meta_pinned(ns, row->ranks[j], &per[j], &per[row->nranks + j], NULL);
        fn(arg, row, keys, refs, per, per + row->nranks);
        free(per);
    }
    nsl_free(&l);
    return rc;
}

static void prom_label(struct kvp_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            kvp__buf_put(b, "\\", 1);
        if (*s == '\n')
            kvp__jw_lit(b, "\\n");
        else
            kvp__buf_put(b, s, 1);
    }
}

static void prom_ns(void *arg, const struct nsl_row *row, uint64_t keys, uint64_t refs,
                    const uint64_t *per_rank, const uint64_t *refs_per_rank)
{
    (void)refs_per_rank;
    struct kvp_buf *b = arg;
    for (int which = 0; which < 2; which++) {
        kvp__buf_printf(b, "%s{deployment=\"", which ? "kvpage_pin_refs" : "kvpage_pinned_keys");
        prom_label(b, row->dep);
        kvp__jw_lit(b, "\",pool=\"");
        prom_label(b, row->pool);
        kvp__buf_printf(b, "\"} %llu\n", (unsigned long long)(which ? refs : keys));
    }
    for (size_t j = 0; j < row->nranks; j++) {
        kvp__jw_lit(b, "kvpage_rank_pinned_pages{deployment=\"");
        prom_label(b, row->dep);
        kvp__jw_lit(b, "\",pool=\"");
        prom_label(b, row->pool);
        kvp__buf_printf(b, "\",rank=\"%u\"} %llu\n", row->ranks[j],
                        (unsigned long long)per_rank[j]);
    }
}

int kvp__pins_prometheus(struct kvp_server *srv, struct kvp_buf *b)
{
    kvp__buf_printf(
        b,
        "# HELP kvpage_pins_refused_total Pins refused over --max-pinned-ratio.\n"
        "# TYPE kvpage_pins_refused_total counter\n"
        "kvpage_pins_refused_total %llu\n"
        "# HELP kvpage_pinned_keys Keys pinned (POST /v1/pins) in the namespace.\n"
        "# TYPE kvpage_pinned_keys gauge\n"
        "# HELP kvpage_pin_refs References of the namespace's pins.\n"
        "# TYPE kvpage_pin_refs gauge\n"
        "# HELP kvpage_rank_pinned_pages Pages of the rank held by pinned keys.\n"
        "# TYPE kvpage_rank_pinned_pages gauge\n",
        (unsigned long long)atomic_load_explicit(&srv->pins_refused, memory_order_relaxed));
    int rc = pins_walk(srv, prom_ns, b);
    return rc < 0 ? rc : 0;
}

static void json_ns(void *arg, const struct nsl_row *row, uint64_t keys, uint64_t refs,
                    const uint64_t *per_rank, const uint64_t *refs_per_rank)
{
    struct kvp_buf *b = arg;
    if (b->len && b->p[b->len - 1] != '[')
        kvp__jw_lit(b, ", ");
    kvp__jw_lit(b, "{\"deployment\": ");
    kvp__jw_str(b, row->dep, strlen(row->dep));
    kvp__jw_lit(b, ", \"pool\": ");
    kvp__jw_str(b, row->pool, strlen(row->pool));
    kvp__buf_printf(b, ", \"keys\": %llu, \"refs\": %llu, \"ranks\": {", (unsigned long long)keys,
                    (unsigned long long)refs);
    for (size_t j = 0; j < row->nranks; j++)
        kvp__buf_printf(b, "%s\"%u\": %llu", j ? ", " : "", row->ranks[j],
                        (unsigned long long)per_rank[j]);
    /* the references of the keys each rank holds (kvp_meta_pinned of the rank) */
    kvp__jw_lit(b, "}, \"rank_refs\": {");
    for (size_t j = 0; j < row->nranks; j++)
        kvp__buf_printf(b, "%s\"%u\": %llu", j ? ", " : "", row->ranks[j],
                        (unsigned long long)refs_per_rank[j]);
    kvp__jw_lit(b, "}}");
}

int kvp__pins_stats_json(struct kvp_server *srv, struct kvp_buf *b)
{
    double ratio =
        srv->cfg.max_pinned_ratio > 0 ? srv->cfg.max_pinned_ratio : KVP_DEFAULT_MAX_PINNED_RATIO;
    kvp__buf_printf(
        b, ", \"pins\": {\"max_pinned_ratio\": %g, \"refused\": %llu, ", ratio,
        (unsigned long long)atomic_load_explicit(&srv->pins_refused, memory_order_relaxed));
    size_t mark = b->len;
    kvp__jw_lit(b, "\"supported\": true, \"namespaces\": [");
    int rc = pins_walk(srv, json_ns, b);
    if (rc == 1) { /* a backend without pins */
        b->len = mark;
        kvp__jw_lit(b, "\"supported\": false, \"namespaces\": [");
        rc = 0;
    }
    kvp__jw_lit(b, "]}");
    return rc;
}
