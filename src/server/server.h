/*
 * kvpage serve — the socket-free core. kvp__server_handle() takes one parsed
 * HTTP request (method, path, body, client address, Authorization header)
 * and fills a reply (status, content type, body, extra headers). Everything
 * protocol-level (protocol.md, docs/protocol-notes.md) happens behind it, so
 * unit tests and the fuzz target drive it without sockets; serve_http.c only
 * moves bytes between libmicrohttpd and this.
 */
#ifndef KVP_SERVER_SERVER_H
#define KVP_SERVER_SERVER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/socket.h>

#include "kvpage/meta.h"
#include "server/routes.h"
#include "util/jsonw.h"

/* An --allow entry. family is AF_INET or AF_INET6; addr holds 4 or 16 bytes. */
struct kvp_cidr {
    int family;
    unsigned prefix;
    uint8_t addr[16];
};

/* Parses "A.B.C.D[/N]" or "IPV6[/N]"; returns 0 or -EINVAL. */
int kvp__cidr_parse(const char *s, struct kvp_cidr *out);
/* 1 when sa (AF_INET, AF_INET6, or IPv4-mapped IPv6) is inside c. */
int kvp__cidr_match(const struct kvp_cidr *c, const struct sockaddr *sa);

struct kvp_server_config {
    const char *token;            /* NULL: no bearer token required */
    const struct kvp_cidr *allow; /* NULL / nallow == 0: every client allowed */
    size_t nallow;
    size_t max_body;      /* bytes; 0 means the default (64 MiB) */
    size_t max_keys;      /* per list in one request; 0 means the default (1,000,000) */
    const char *data_dir; /* for the record (serve_state.c opens meta with it); may be NULL */
    const char *state;    /* where the state is, for /v1/stats "server" (may be NULL) */
    /* When set and true after a request, the request body's JSON values live
     * in scratch memory the caller reclaims whole: they are not released one
     * by one (serve_arena.c's arena; a tenth of the JSON time for a 64-key body). */
    int (*json_is_scratch)(void);
    /* Tests and the fuzzer only: read every body with jansson (fastbody.c off). */
    int no_fast_bodies;
    /* --max-pinned-ratio: the share of a rank's pages pins may hold (0: the default). */
    double max_pinned_ratio;
};

#define KVP_DEFAULT_MAX_BODY ((size_t)64 << 20)
#define KVP_DEFAULT_MAX_KEYS ((size_t)1000000)
#define KVP_DEFAULT_MAX_PINNED_RATIO 0.5

#define KVP_METRICS_NSTATUS 11
#define KVP_METRICS_NBUCKETS 15

struct kvp_metrics_cell {
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t sum_ns;
    atomic_uint_fast64_t bucket[KVP_METRICS_NBUCKETS]; /* non-cumulative; last is +Inf */
};

struct kvp_metrics {
    struct kvp_metrics_cell cell[KVP_ROUTE_COUNT][KVP_METRICS_NSTATUS];
};

/* Connections, counted by the transport (serve_http.c, serve_limits.c), printed with the metrics.
 */
struct kvp_conn_stats {
    atomic_uint_fast64_t open;            /* now */
    atomic_uint_fast64_t accepted;        /* since start */
    atomic_uint_fast64_t refused_client;  /* over --max-conns-per-client */
    atomic_uint_fast64_t refused_total;   /* over --max-conns */
    atomic_uint_fast64_t timeout_idle;    /* closed after --idle-timeout between requests */
    atomic_uint_fast64_t timeout_request; /* dropped after --request-timeout inside a request */
};

/* Keys a client dropped because their pages failed the integrity tag (a
 * delete with "reason": "integrity"), per namespace: a list, rarely added
 * to, under srv->rejected_lock. */
struct kvp_rejected {
    struct kvp_rejected *next;
    uint64_t count;
    size_t dlen, plen;
    char names[]; /* the deployment then the pool, each NUL-terminated */
};

struct kvp_server {
    struct kvp_meta *meta; /* not owned */
    struct kvp_server_config cfg;
    size_t token_len;
    struct kvp_metrics metrics;
    struct kvp_conn_stats conns;
    uint64_t started_ns;               /* kvp__mono_ns() at kvp__server_init, for the uptime */
    atomic_uint_fast64_t pins_refused; /* pins over --max-pinned-ratio */
    pthread_mutex_t rejected_lock;
    struct kvp_rejected *rejected;
};

/* access.c: whether the client at sa may ask (--allow; NULL sa: yes), and
 * whether an Authorization header carries the server's bearer token. */
int kvp__client_allowed(const struct kvp_server *srv, const struct sockaddr *sa);
int kvp__token_ok(const struct kvp_server *srv, const char *authorization);

/* Sets up srv over an open meta. cfg is copied (its strings and allow array
 * must outlive srv). Always succeeds. */
void kvp__server_init(struct kvp_server *srv, struct kvp_meta *meta,
                      const struct kvp_server_config *cfg);

struct kvp_request {
    const char *method; /* "GET", "POST", ... NUL-terminated */
    const char *path;   /* decoded path without the query; need not be NUL-terminated */
    size_t path_len;
    const char *body; /* may be NULL when body_len == 0 */
    size_t body_len;
    const struct sockaddr *client; /* NULL: not checked against --allow (in-process callers) */
    const char *authorization;     /* the Authorization header, or NULL */
    /* The X-Kvpage-Errors header was sent (kvpage's http:// backend): error
     * replies carry their rule's fields (kvp__reply_rule) beside "detail". */
    int error_fields;
    int body_too_large; /* the transport saw more than max_body bytes and dropped them */
    /* The transport dropped the body: large bodies already take all the
     * memory it allows them (--max-body-memory, the limit in bytes). */
    size_t body_memory_full;
};

/*
 * The reply and the per-connection scratch space reused across requests (so
 * the hot path allocates nothing once it has warmed up). One per connection
 * (or per thread); never shared by two concurrent requests.
 */
struct kvp_reply {
    int status;
    const char *content_type;     /* static string, or NULL for no body */
    const char *allow;            /* Allow header for 405, else NULL */
    const char *www_authenticate; /* WWW-Authenticate header for 401, else NULL */
    int route;                    /* enum kvp_route that answered */
    struct kvp_buf body;
    /* The rule the next error reply broke (kvp__reply_rule), for a client
     * that asked for the fields (kvp_request.error_fields). */
    struct kvp_reply_rule {
        int set, rule;
        int64_t index, value, limit;
    } why;
    /* The ticket of the request's changes (kvp_meta_*_async): the reply may
     * be sent only once kvp_meta_wait / kvp_meta_when_durable says it is
     * durable. 0: nothing to wait for. Set by kvp__server_handle. */
    uint64_t ticket;
    /* scratch */
    struct kvp_str *keys;
    int64_t *pages;
    int64_t *pages2;
    uint8_t *flags;
    size_t scratch_cap;
};

void kvp__reply_init(struct kvp_reply *rep);
/* Replaces the reply by 500 "Internal error: <what>: <strerror(rc)>". */
void kvp__reply_failure(struct kvp_reply *rep, int rc, const char *what);
/* The status for a change the log cannot take: 507 for -ENOSPC / -EDQUOT,
 * else 503 (protocol-notes: a full or failing disk). */
int kvp__log_error_status(int rc);
/* Replaces the reply by that status with why ("cannot write the log in DIR:
 * <cause>"); applied: the change was made in memory but is not durable. */
void kvp__reply_log_error(struct kvp_reply *rep, int rc, const char *why, int applied);
void kvp__reply_free(struct kvp_reply *rep);

/* Handles one request. Never fails: every outcome is a reply. */
void kvp__server_handle(struct kvp_server *srv, const struct kvp_request *req,
                        struct kvp_reply *rep);

/* Releases what kvp__server_init and the requests since allocated. */
void kvp__server_fini(struct kvp_server *srv);

/* Counts n keys of namespace (dep, pool) dropped for integrity (a delete
 * route's "reason": "integrity"); the count of (dep, pool) so far. */
void kvp__rejected_add(struct kvp_server *srv, const char *dep, size_t dlen, const char *pool,
                       size_t plen, uint64_t n);
uint64_t kvp__rejected_count(struct kvp_server *srv, const char *dep, const char *pool);

/* Records one answered request (route, status, duration) in srv->metrics. */
void kvp__metrics_record(struct kvp_metrics *m, int route, int status, uint64_t ns);

/* ---- internal to the dialect files ---- */

#include <jansson.h>

/* One request being handled. */
struct kvp_ctx {
    struct kvp_server *srv;
    const struct kvp_request *req;
    struct kvp_reply *rep;
    const char *dep; /* deployment (URL prefix), not NUL-terminated */
    size_t dlen;
    uint32_t path_rank; /* SGLang and vLLM initialize: rank from the path */
    json_t *body;       /* the body object; NULL for an empty body (reads as {}) */
};

void kvp__vllm_handle(struct kvp_ctx *c, int route);
/* The vLLM routes whose plain bodies fastbody.c reads: 1 when handled (replied), else 0. */
int kvp__vllm_fast(struct kvp_ctx *c, int route);
void kvp__sglang_handle(struct kvp_ctx *c, int route);
/* The SGLang routes whose plain bodies fastbody.c reads: 1 when handled (replied), else 0. */
int kvp__sglang_fast(struct kvp_ctx *c, int route);
void kvp__native_handle(struct kvp_ctx *c, int route);
/* /v1/query and /v1/pins (query.c). */
void kvp__query_handle(struct kvp_ctx *c, int route);
int kvp__query_fast(struct kvp_ctx *c, int route);
/* The pins' figures in /metrics and in /v1/stats ("pins"): 0 or -errno. */
int kvp__pins_prometheus(struct kvp_server *srv, struct kvp_buf *out);
int kvp__pins_stats_json(struct kvp_server *srv, struct kvp_buf *out);
/* Writes the Prometheus text (metrics.c) and the /v1/stats JSON. Return 0 or
 * a negative errno (out of memory). */
int kvp__metrics_prometheus(struct kvp_server *srv, struct kvp_buf *out);
int kvp__metrics_stats_json(struct kvp_server *srv, struct kvp_buf *out);

/* Replies {"detail": "<formatted message>"} with status; when the client
 * asked (X-Kvpage-Errors) and kvp__reply_rule named the rule, also "rule",
 * "index", "value" and "limit" (docs/protocol.md, "Errors as data"). */
void kvp__reply_error(struct kvp_ctx *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The rule (enum kvp_rule) the next kvp__reply_error reports broken, with
 * its index, value and limit as struct kvp_error has them; kvp__reply_err
 * takes them from err. */
void kvp__reply_rule(struct kvp_ctx *c, int rule, int64_t index, int64_t value, int64_t limit);
void kvp__reply_err(struct kvp_ctx *c, const struct kvp_error *err);
/* Replies with an empty body (204). */
void kvp__reply_empty(struct kvp_ctx *c, int status);
/* Starts a JSON reply: status 200, body emptied, content type JSON. */
struct kvp_buf *kvp__reply_json(struct kvp_ctx *c);
/* Replies 500 "Internal error: ..." for a failure that is not the client's. */
void kvp__reply_internal(struct kvp_ctx *c, int rc, const char *what);
/* Makes room for n entries in every scratch array; 0 or -ENOMEM (replied 500). */
int kvp__scratch(struct kvp_ctx *c, size_t n);
/* For the router (handle.c): a reply emptied for the next request (status
 * 500 until set); 500 "out of memory" without allocating; the 400/413 of a
 * body the guard refused (texts in docs/protocol-notes.md). */
struct kvp_guard_fail;
void kvp__reply_reset(struct kvp_reply *rep);
void kvp__reply_oom(struct kvp_reply *rep);
void kvp__reply_guard(struct kvp_ctx *c, const struct kvp_guard_fail *f);

/* The rules on keys and names are the metadata interface's: kvp_key_problem,
 * kvp_deployment_valid, kvp_pool_valid (kvpage/meta.h). */
/* Checks a list length against --max-keys; replies 413 and returns -1 when over. */
int kvp__check_count(struct kvp_ctx *c, size_t n);

/*
 * fastbody.c: the plain forms of the vLLM batch_allocate, confirm_write,
 * batch_exists and get_locations bodies, read into the scratch arrays without
 * jansson. 1: read (rank, the counts, keys/pages/pages2 filled); 0: not in
 * plain form, nothing replied, use the general path; -1: out of memory,
 * replied 500.
 */
int kvp__fast_allocate(struct kvp_ctx *c, uint32_t *rank, size_t *n);
/* confirm_write's bodies also take kvpage's "prefix_key" (protocol.md 14.1):
 * prefix->ptr NULL when absent, KVP_FAST_NULL (len 0) for null, else the key;
 * prefix NULL declines a body that has it. */
extern const char KVP_FAST_NULL[1];
int kvp__fast_confirm(struct kvp_ctx *c, uint32_t *rank, struct kvp_str *prefix, size_t *n,
                      size_t *nrel);
/* {"keys": [K, ...]} (rank NULL) or {"rank": R, "keys": [K, ...]}; with pool
 * != NULL also an optional "namespace" (pool->ptr NULL when absent). */
int kvp__fast_keys(struct kvp_ctx *c, uint32_t *rank, struct kvp_str *pool, size_t *n);
/* The SGLang bodies of reserve_and_allocate_page_indices, confirm_write
 * (written_keys_to_confirm) and exists / get_page_indices: the same lists, no
 * rank, and an optional "namespace" (pool->ptr NULL when absent). Same returns. */
int kvp__fast_sgl_allocate(struct kvp_ctx *c, struct kvp_str *pool, size_t *n);
/* The same, also taking kvpage's optional "order" field (protocol-notes, "The
 * order of free pages"): *order is set when the body has it. */
int kvp__fast_sgl_reserve(struct kvp_ctx *c, struct kvp_str *pool, int *order, size_t *n);
int kvp__fast_sgl_confirm(struct kvp_ctx *c, struct kvp_str *pool, struct kvp_str *prefix,
                          size_t *n, size_t *nrel);
int kvp__fast_sgl_keys(struct kvp_ctx *c, struct kvp_str *pool, size_t *n);

/* A body list field: missing → *out = NULL and returns 0 (reads as []);
 * present and an array → 0; anything else (null included) → -1. */
int kvp__body_list(struct kvp_ctx *c, const char *field, json_t **out);
/* A delete route's optional "reason": 0 when absent, 1 for "integrity";
 * else replies 400 and returns -1. */
int kvp__body_reason(struct kvp_ctx *c);

/*
 * Reads a list of plain string keys from arr (NULL: empty) into c->rep->keys.
 * Elements that are not strings get "Invalid keys format" when exists_fmt is
 * set (vLLM batch_exists) or "Invalid request format: keys[i] must be a
 * string". Returns the count, or -1 after replying.
 */
ptrdiff_t kvp__parse_str_keys(struct kvp_ctx *c, json_t *arr, int exists_fmt);
/* Like kvp__parse_str_keys but elements may be a string or [key, prefix_key]. */
ptrdiff_t kvp__parse_alloc_keys(struct kvp_ctx *c, json_t *arr);
/*
 * Reads confirmations ([key, page] pairs; field names them in messages) and
 * pages_to_release into keys/pages and pages2. Shape errors get
 * "Confirmation failed: ..." except where sglang_types asks for
 * "Invalid request format: '<field>' must be a list" (wrong list types).
 * Returns 0 (n, nrel set) or -1 after replying.
 */
int kvp__parse_confirm(struct kvp_ctx *c, json_t *conf, const char *field, size_t *n, size_t *nrel,
                       int sglang_types);
/*
 * The optional fields of a confirmation that name each page's parent and
 * tokens (protocol.md, "Parents and tokens"): "parent_keys" (a key or null
 * per confirmation), or "prefix_key" (a key or null: the first
 * confirmation's parent, each next one's the confirmation before it), and
 * "token_ids" (a list of tokens, or null, per confirmation). Read after
 * kvp__parse_confirm (its n keys in the scratch). Returns 0 (x->used 0 when
 * the body has none of them) or -1 after replying 400; x is freed by
 * kvp__confirm_extra_free either way.
 */
struct kvp_confirm_extra {
    int used;
    struct kvp_confirm_opts opts;
    struct kvp_str *parents;
    const uint32_t **tok;
    uint32_t *ntok, *flat;
};
int kvp__parse_confirm_extra(struct kvp_ctx *c, const char *field, size_t n,
                             struct kvp_confirm_extra *x);
/* x for n confirmations (keys in the scratch) that are a chain from first
 * (len 0: none known), as "prefix_key" says; 0, or -1 after replying 500. */
int kvp__confirm_chain(struct kvp_ctx *c, size_t n, const struct kvp_str *first,
                       struct kvp_confirm_extra *x);
void kvp__confirm_extra_free(struct kvp_confirm_extra *x);
/* Maps a confirm error of meta other than -ENOENT (rc, err) to the documented
 * replies; field names the confirmations list. */
void kvp__confirm_error(struct kvp_ctx *c, int rc, const struct kvp_error *err, const char *field,
                        uint32_t rank);
/* Maps any other meta error (not -ENOENT): -EINVAL → 400 (key rule messages
 * name field), -EEXIST → 409, KVP_RULE_IO (the log cannot take the change)
 * → 507 / 503, else 500. */
void kvp__meta_error(struct kvp_ctx *c, int rc, const struct kvp_error *err, const char *field);
/* The initialize routes of both dialects. kvp__init_pages: the num_pages
 * rule (meta's, checked before the namespace is created): 0, or -1 after
 * replying 400. kvp__init_error: a refused kvp_meta_init_rank of n pages,
 * -EEXIST as the dialects' 409, any other as kvp__meta_error. */
int kvp__init_pages(struct kvp_ctx *c, json_int_t n);
void kvp__init_error(struct kvp_ctx *c, uint32_t rank, json_int_t n, int rc,
                     const struct kvp_error *err);
/* "<what>Rank R not initialized..." (404), with the rule's fields. */
void kvp__reply_not_init(struct kvp_ctx *c, uint32_t rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 503 "Service unavailable: {err->msg}; retry later": a remote metadata
 * store (KVP_RULE_UNAVAILABLE) did not answer. */
void kvp__reply_unavailable(struct kvp_ctx *c, const struct kvp_error *err);
/* The optional "namespace" body field: absent → dflt (may be NULL; *plen 0);
 * not a string or not a valid pool → 400 "Invalid namespace". 0, or -1
 * when replied. */
int kvp__body_pool(struct kvp_ctx *c, const char *dflt, const char **pool, size_t *plen);
/* Finds the namespace (deployment of the URL, pool); 0, -ENOENT (absent), or
 * another negative errno after replying. */
int kvp__find_ns(struct kvp_ctx *c, const char *pool, size_t plen, int create, struct kvp_ns **ns);

#endif
