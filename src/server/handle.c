/*
 * Routing: the /ns/NAME prefix, method checks, body limits and JSON
 * parsing, then the dialect table ({routes, fast path, handler}). Which
 * path names which route is routes.c's; the access checks are access.c's;
 * the replies and the helpers the dialects share (keys, confirmations,
 * error statuses) are request.c's.
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
    pthread_mutex_init(&srv->rejected_lock, NULL);
}

void kvp__server_fini(struct kvp_server *srv)
{
    while (srv->rejected) {
        struct kvp_rejected *r = srv->rejected;
        srv->rejected = r->next;
        free(r);
    }
    pthread_mutex_destroy(&srv->rejected_lock);
}

static struct kvp_rejected *rejected_find(struct kvp_server *srv, const char *dep, size_t dlen,
                                          const char *pool, size_t plen)
{
    for (struct kvp_rejected *r = srv->rejected; r; r = r->next)
        if (r->dlen == dlen && r->plen == plen && !memcmp(r->names, dep, dlen) &&
            !memcmp(r->names + dlen + 1, pool, plen))
            return r;
    return NULL;
}

void kvp__rejected_add(struct kvp_server *srv, const char *dep, size_t dlen, const char *pool,
                       size_t plen, uint64_t n)
{
    pthread_mutex_lock(&srv->rejected_lock);
    struct kvp_rejected *r = rejected_find(srv, dep, dlen, pool, plen);
    if (!r && (r = calloc(1, sizeof *r + dlen + plen + 2))) { /* no memory: not counted */
        memcpy(r->names, dep, dlen);
        memcpy(r->names + dlen + 1, pool, plen);
        r->dlen = dlen;
        r->plen = plen;
        r->next = srv->rejected;
        srv->rejected = r;
    }
    if (r)
        r->count += n;
    pthread_mutex_unlock(&srv->rejected_lock);
}

uint64_t kvp__rejected_count(struct kvp_server *srv, const char *dep, const char *pool)
{
    pthread_mutex_lock(&srv->rejected_lock);
    struct kvp_rejected *r = rejected_find(srv, dep, strlen(dep), pool, strlen(pool));
    uint64_t n = r ? r->count : 0;
    pthread_mutex_unlock(&srv->rejected_lock);
    return n;
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
    {KVP_ROUTE_VLLM_INIT, KVP_ROUTE_VLLM_DROP, kvp__vllm_fast, kvp__vllm_handle},
    {KVP_ROUTE_SGL_INIT, KVP_ROUTE_SGL_GET, kvp__sglang_fast, kvp__sglang_handle},
    {KVP_ROUTE_QUERY, KVP_ROUTE_PINS, kvp__query_fast, kvp__query_handle},
};

static const struct dialect *dialect_of(int route)
{
    for (size_t i = 0; i < sizeof dialects / sizeof *dialects; i++)
        if (route >= dialects[i].first && route <= dialects[i].last)
            return &dialects[i];
    return NULL;
}

/* Splits the namespace prefix off req->path and decodes the rest: c->dep
 * and c->dlen name the deployment ("default" without /ns/NAME), *path and
 * *plen the route's path (plen 0: no route can match). dbuf and pbuf hold
 * what is decoded. Returns 1 when the path had a /ns/NAME prefix. */
static int split_path(struct kvp_ctx *c, char dbuf[KVP_MAX_NAME_LEN + 1],
                      char pbuf[PATH_DECODE_MAX], const char **pathp, size_t *plenp)
{
    const struct kvp_request *req = c->req;
    const char *path = req->path ? req->path : "";
    size_t plen = req->path ? req->path_len : 0;
    /* The path comes with its %-escapes (keep_escapes in serve_http.c):
     * split first, then decode, so that "/ns/a%2Fb/..." names the deployment
     * "a/b" (a bad name) rather than another path. */
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
        if (n < PATH_DECODE_MAX && pct_decode(path, plen, pbuf) == n && !memchr(pbuf, '\0', n) &&
            segments_of(pbuf, n) == segments_of(path, plen)) {
            path = pbuf;
            plen = n;
        } else {
            plen = 0; /* (or longer than any route) */
        }
    }
    *pathp = path;
    *plenp = plen;
    return has_ns;
}

/* The checks every route passes: the token, a route at all, its method.
 * 1: go on; 0: replied. */
static int route_ok(struct kvp_ctx *c, const struct kvp_route_match *m)
{
    struct kvp_server *srv = c->srv;
    const struct kvp_request *req = c->req;
    /* The status page holds no figures: it asks for the token itself. */
    if (srv->cfg.token && m->route != KVP_ROUTE_HEALTHZ && m->route != KVP_ROUTE_STATUS &&
        !kvp__token_ok(srv, req->authorization)) {
        c->rep->route = m->route;
        kvp__reply_error(c, 401, "Invalid or missing bearer token");
        c->rep->www_authenticate = "Bearer";
        return 0;
    }
    if (m->route == KVP_ROUTE_NONE) {
        kvp__reply_error(c, 404, "Not Found");
        return 0;
    }
    const char *method = req->method ? req->method : "";
    int method_ok = m->get ? (!strcmp(method, "GET") || !strcmp(method, "HEAD"))
                           : !strcmp(method, "POST") ||
                                 (m->route == KVP_ROUTE_PINS && !strcmp(method, "DELETE"));
    if (!method_ok) {
        kvp__reply_error(c, 405, "Method Not Allowed");
        c->rep->allow = m->get ? "GET, HEAD" : m->route == KVP_ROUTE_PINS ? "POST, DELETE" : "POST";
        return 0;
    }
    return 1;
}

/* The checks of a POST route before its body is read: the namespace, the
 * rank of the path, the body's size. 1: go on; 0: replied. */
static int post_ok(struct kvp_ctx *c, const struct kvp_route_match *m, int has_ns)
{
    struct kvp_server *srv = c->srv;
    const struct kvp_request *req = c->req;
    if (has_ns && !kvp_deployment_valid(c->dep, c->dlen)) {
        kvp__reply_error(c, 400, "Invalid namespace");
        return 0;
    }
    if (m->rank && !kvp__route_rank(m, &c->path_rank)) {
        kvp__reply_error(c, 400, "Invalid rank: %.*s",
                         (int)(m->rank_len > 4096 ? 4096 : m->rank_len), m->rank);
        return 0;
    }
    if (req->body_memory_full) {
        kvp__reply_error(
            c, 503,
            "Server busy: request bodies over 1 MiB being received or handled take all "
            "of the %zu bytes allowed (--max-body-memory); retry later",
            req->body_memory_full);
        return 0;
    }
    if (req->body_too_large || req->body_len > srv->cfg.max_body) {
        kvp__reply_error(c, 413, "Request body too large: limit is %zu bytes", srv->cfg.max_body);
        return 0;
    }
    return 1;
}

/* A POST route's body to its dialect: the fast path for the plain forms,
 * else the guard, jansson, and the dialect's handler. */
static void post_route(struct kvp_ctx *c, int route)
{
    struct kvp_server *srv = c->srv;
    const struct kvp_request *req = c->req;
    c->body = NULL;
    const struct dialect *d = dialect_of(route);
    if (!d) { /* every POST route is a dialect's */
        kvp__reply_internal(c, -EINVAL, "routing");
        return;
    }
    if (req->body_len && !srv->cfg.no_fast_bodies && d->fast(c, route))
        return;
    if (req->body_len) {
        struct kvp_guard_fail gf;
        if (kvp__body_guard(req->body, req->body_len, srv->cfg.max_keys, &gf)) {
            kvp__reply_guard(c, &gf);
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
    d->handle(c, route);
    if (!(c->srv->cfg.json_is_scratch && c->srv->cfg.json_is_scratch()))
        json_decref(c->body);
    c->body = NULL;
}

static void dispatch(struct kvp_ctx *c)
{
    if (!kvp__client_allowed(c->srv, c->req->client)) {
        kvp__reply_error(c, 403, "Client address not allowed");
        return;
    }
    char dbuf[KVP_MAX_NAME_LEN + 1], pbuf[PATH_DECODE_MAX];
    const char *path;
    size_t plen;
    int has_ns = split_path(c, dbuf, pbuf, &path, &plen);
    struct kvp_route_match m;
    kvp__route_match(path, plen, has_ns, &m);
    c->rep->route = m.route;
    if (!route_ok(c, &m))
        return;
    if (m.get && m.route == KVP_ROUTE_STATUS && has_ns && !kvp_deployment_valid(c->dep, c->dlen)) {
        kvp__reply_error(c, 400, "Invalid namespace");
        return;
    }
    if (m.get) {
        kvp__native_handle(c, m.route);
        return;
    }
    if (post_ok(c, &m, has_ns))
        post_route(c, m.route);
}

void kvp__server_handle(struct kvp_server *srv, const struct kvp_request *req,
                        struct kvp_reply *rep)
{
    uint64_t t0 = kvp__mono_ns();
    struct kvp_ctx c = {.srv = srv, .req = req, .rep = rep};
    kvp__reply_reset(rep);
    dispatch(&c);
    if (rep->body.oom)
        kvp__reply_oom(rep);
    kvp__metrics_record(&srv->metrics, rep->route, rep->status, kvp__mono_ns() - t0);
}
