/*
 * The metadata interface (kvpage/meta.h): opens a location's backend, checks
 * every argument once, dispatches to the backend's operations, and makes the
 * blocking calls wait for durability. The rules on keys, names, ranks and
 * page counts live here and nowhere else (kvpage serve calls the same
 * functions: kvp_key_problem, kvp_deployment_valid, kvp_pool_valid).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include "meta/backend.h"
#include "meta/location.h"
#include "meta/rules.h"

/* ---------------------------------------------------------------- rules */

KVP_API const char *kvp_key_problem(const char *key, size_t len)
{
    if (len == 0)
        return "is empty";
    if (len > KVP_MAX_KEY_LEN)
        return "is longer than 1024 bytes";
    if (!key || memchr(key, '\0', len))
        return "contains a NUL byte";
    return NULL;
}

KVP_API int kvp_deployment_valid(const char *s, size_t n)
{
    if (!s || n == 0 || n > KVP_MAX_NAME_LEN)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

KVP_API int kvp_pool_valid(const char *s, size_t n)
{
    return s && n >= 1 && n <= KVP_MAX_NAME_LEN && !memchr(s, '\0', n);
}

static int bad_arg(struct kvp_error *err, const char *what)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0, "%s", what);
    return -EINVAL;
}

/* keys[0..n) are valid keys (and the arrays exist), else -EINVAL naming the first bad one. */
static int check_keys(const struct kvp_str *keys, size_t n, struct kvp_error *err)
{
    if (n > KVP_MAX_BATCH) {
        kvp__set_err(err, -EINVAL, KVP_RULE_TOO_MANY, -1, (int64_t)n, (int64_t)KVP_MAX_BATCH,
                     "too many keys");
        return -EINVAL;
    }
    if (n && !keys)
        return bad_arg(err, "keys is NULL");
    for (size_t i = 0; i < n; i++) {
        const char *why = kvp_key_problem(keys[i].ptr, keys[i].len);
        if (why) {
            kvp__set_err(err, -EINVAL, KVP_RULE_KEY, (int64_t)i, (int64_t)keys[i].len,
                         KVP_MAX_KEY_LEN, "key %zu %s", i, why);
            return -EINVAL;
        }
    }
    return 0;
}

static int check_rank(int64_t rank, int any, struct kvp_error *err)
{
    if ((rank < 0 && any) || (rank >= 0 && rank <= (int64_t)KVP_MAX_RANK))
        return 0;
    kvp__set_err(err, -EINVAL, KVP_RULE_RANK_RANGE, -1, rank, KVP_MAX_RANK, "Invalid rank: %lld",
                 (long long)rank);
    return -EINVAL;
}

static int check_ns(const struct kvp_ns *ns, struct kvp_error *err)
{
    return ns ? 0 : bad_arg(err, "namespace handle is NULL");
}

/* ---------------------------------------------------------------- locations */

/* Schemes added by kvp__meta_register (tests), after the table's. */
struct extra_scheme {
    struct kvp__meta_scheme s;
    const struct kvp__meta_ops *ops;
};
static struct extra_scheme *extra;
static size_t nextra;

/* The i-th scheme there is (all: with those refused), with its backend: 0,
 * or -ENOENT past the last. */
static int scheme_at(size_t i, int all, const struct kvp__meta_scheme **s,
                     const struct kvp__meta_ops **ops)
{
    for (size_t b = 0; kvp__meta_backends[b]; b++)
        for (const struct kvp__meta_scheme *r = kvp__meta_backends[b]->schemes; r && r->scheme; r++)
            if ((all || !(r->flags & KVP__SCHEME_REFUSED)) && i-- == 0) {
                *s = r;
                *ops = kvp__meta_backends[b];
                return 0;
            }
    if (i >= nextra)
        return -ENOENT;
    *s = &extra[i].s;
    *ops = extra[i].ops;
    return 0;
}

/* The scheme named by the slen bytes at name, or the first with one of
 * flags (name NULL): 0, or -ENOENT. */
static int scheme_find(const char *name, size_t slen, int flags, const struct kvp__meta_scheme **s,
                       const struct kvp__meta_ops **ops)
{
    for (size_t i = 0; scheme_at(i, 1, s, ops) == 0; i++)
        if (name ? strlen((*s)->scheme) == slen && !strncmp((*s)->scheme, name, slen)
                 : ((*s)->flags & flags) != 0)
            return 0;
    return -ENOENT;
}

int kvp__meta_register(const char *scheme, const struct kvp__meta_ops *ops)
{
    const struct kvp__meta_scheme *s;
    const struct kvp__meta_ops *o;
    if (scheme_find(scheme, strlen(scheme), 0, &s, &o) == 0)
        return -EEXIST;
    struct extra_scheme *e = realloc(extra, (nextra + 1) * sizeof *e);
    if (!e)
        return -ENOMEM;
    extra = e;
    extra[nextra++] = (struct extra_scheme){{scheme, NULL, 0}, ops};
    return 0;
}

static void known_schemes(char *buf, size_t len)
{
    const struct kvp__meta_scheme *s;
    const struct kvp__meta_ops *ops;
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; scheme_at(i, 0, &s, &ops) == 0 && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s:", i ? ", " : "", s->scheme);
}

/* A location taken apart: its scheme, its backend and what the backend's
 * open gets (where: the part after the scheme; NULL for a default one). */
struct loc {
    const struct kvp__meta_scheme *s;
    const struct kvp__meta_ops *ops;
    const char *where;
};

/* The error for a scheme (slen bytes at scheme) that no backend serves. */
static int no_backend(const char *location, const char *scheme, size_t slen, struct kvp_error *err)
{
    char known[128];
    known_schemes(known, sizeof known);
    if (kvp__looks_hostport(location))
        return kvp__hostport_refusal(location, err);
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                 "unknown metadata location scheme '%.*s:' (known: %s)",
                 (int)(slen > 32 ? 32 : slen), scheme, known);
    return -EINVAL;
}

/*
 * Takes location apart (data_dir: opts.data_dir, for a NULL or empty
 * location): 0, or -EINVAL / -EOPNOTSUPP with err saying why.
 */
static int parse_location(const char *location, const char *data_dir, struct loc *l,
                          struct kvp_error *err)
{
    memset(l, 0, sizeof *l);
    const char *scheme = NULL;
    size_t slen = 0;
    int flag = 0;
    if (!location || !*location) {
        flag = data_dir ? KVP__SCHEME_DIR : KVP__SCHEME_DEFAULT;
        l->where = data_dir;
    } else if (location[0] == '/' || location[0] == '.') {
        flag = KVP__SCHEME_DIR;
        l->where = location;
    } else {
        /* The scheme: the letters before ':'. */
        const char *colon = strchr(location, ':');
        slen = colon ? (size_t)(colon - location) : strlen(location);
        scheme = location;
        if (!colon || slen == 0 ||
            strspn(location, "abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") < slen) {
            char known[128];
            known_schemes(known, sizeof known);
            kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                         "location '%.64s' has no scheme (known: %s, or a path starting with / "
                         "or .)",
                         location, known);
            return -EINVAL;
        }
        l->where = colon + 1;
    }
    if (scheme_find(scheme, slen, flag, &l->s, &l->ops))
        return scheme ? no_backend(location, scheme, slen, err)
                      : bad_arg(err, "no backend takes a data directory or the default");
    if (l->s->flags & KVP__SCHEME_REFUSED) {
        char known[128] = "";
        if (l->s->flags & KVP__SCHEME_KNOWN)
            known_schemes(known, sizeof known);
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0, "%s%s%s%s", l->s->description,
                     *known ? " (known: " : "", known, *known ? ")" : "");
        return -EOPNOTSUPP;
    }
    if (l->s->flags & KVP__SCHEME_DEFAULT) {
        l->where = NULL;
    } else if (l->s->flags & KVP__SCHEME_DIR) {
        if (scheme && !strncmp(l->where, "//", 2))
            l->where += 2; /* file://DIR and file:///abs */
        if (!*l->where) {  /* also an empty opts.data_dir */
            kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                         "location '%s:' names no directory (%s:DIR)", l->s->scheme, l->s->scheme);
            return -EINVAL;
        }
    }
    return 0;
}

/* opts (NULL: the defaults) checked, into o with the defaults filled in. */
static int opts_of(const struct kvp_meta_opts *opts, struct kvp_meta_opts *o, struct kvp_error *err)
{
    kvp_meta_opts_init(o);
    if (!opts)
        return 0;
    if (opts->opts_size == 0 || opts->opts_size > sizeof *opts) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)opts->opts_size, sizeof *opts,
                     "opts_size %zu is not a size of struct kvp_meta_opts (set it with "
                     "kvp_meta_opts_init)",
                     opts->opts_size);
        return -EINVAL;
    }
    memcpy(o, opts, opts->opts_size);
    o->opts_size = sizeof *o;
    return 0;
}

/* The options a backend may not get: 0 or -EINVAL; the defaults filled in. */
static int opts_check(struct kvp_meta_opts *o, struct kvp_error *err)
{
    if (o->fsync < KVP_FSYNC_NEVER || o->fsync > KVP_FSYNC_ALWAYS) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, o->fsync, KVP_FSYNC_ALWAYS,
                     "fsync must be KVP_FSYNC_NEVER, KVP_FSYNC_BATCH or KVP_FSYNC_ALWAYS");
        return -EINVAL;
    }
    if (o->snapshot_mode == 0)
        o->snapshot_mode = KVP_SNAPSHOT_THREAD;
    if (o->connect_timeout_ms == 0)
        o->connect_timeout_ms = 2000;
    if (o->timeout_ms == 0)
        o->timeout_ms = 10000;
    if (o->snapshot_mode < KVP_SNAPSHOT_FORK || o->snapshot_mode > KVP_SNAPSHOT_MANUAL) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, o->snapshot_mode, KVP_SNAPSHOT_MANUAL,
                     "snapshot_mode must be KVP_SNAPSHOT_FORK, KVP_SNAPSHOT_THREAD or "
                     "KVP_SNAPSHOT_MANUAL");
        return -EINVAL;
    }
    return 0;
}

static void meta_free(struct kvp_meta *m)
{
    free(m->identity);
    free(m->location);
    free(m->dir);
    free(m);
}

KVP_API void kvp_meta_opts_init(struct kvp_meta_opts *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->opts_size = sizeof *opts;
    opts->lease_ms = 120000;
    opts->read_grace_ms = 5000;
    opts->fsync = KVP_FSYNC_BATCH;
    opts->snapshot_bytes = (uint64_t)64 << 20;
    opts->snapshot_mode = KVP_SNAPSHOT_THREAD; /* no fork inside a caller's process */
    opts->connect_timeout_ms = 2000;
    opts->timeout_ms = 10000;
    opts->retries = 3;
}

KVP_API int kvp_meta_open_at(const char *location, const struct kvp_meta_opts *opts,
                             struct kvp_meta **out, struct kvp_error *err)
{
    if (!out)
        return bad_arg(err, "out is NULL");
    *out = NULL;
    struct kvp_meta_opts o;
    struct loc l;
    int rc;
    if ((rc = opts_of(opts, &o, err)) || (rc = parse_location(location, o.data_dir, &l, err)) ||
        (rc = opts_check(&o, err)))
        return rc;
    struct kvp_meta *m = calloc(1, sizeof *m);
    if (!m) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    m->ops = l.ops;
    m->scheme = l.s;
    m->opts = o;
    m->opts.data_dir = NULL;
    const char *where = l.where;
    if ((l.s->flags & KVP__SCHEME_DIR) && !(where = m->opts.data_dir = m->dir = strdup(where))) {
        free(m);
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    m->location = m->dir ? kvp__file_location(m->dir) : kvp__location_canon(location);
    rc = m->location ? l.ops->open(m, where, err) : -ENOMEM;
    if (rc) {
        if (!m->location)
            kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        meta_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* What a backend is, without a handle: the caller's out gets what both know of. */
static int info_out(const struct kvp__meta_scheme *s, const struct kvp__meta_ops *ops,
                    struct kvp_meta *m, struct kvp_meta_info *out)
{
    struct kvp_meta_info i;
    memset(&i, 0, sizeof i);
    i.info_size = sizeof i;
    i.name = ops->name;
    i.scheme = s->scheme;
    i.description = s->description ? s->description : "";
    i.remote = ops->remote;
    i.holder = ops->holder ? ops->holder : ops->remote ? "a remote server" : "this process";
    i.values_section = ops->values_section;
    i.durability = KVP_DURABLE_UNKNOWN;
    if (ops->info)
        ops->info(m, &i);
    size_t n = out->info_size < sizeof i ? out->info_size : sizeof i;
    memcpy(out, &i, n);
    out->info_size = n;
    return 0;
}

KVP_API int kvp_meta_info(struct kvp_meta *m, struct kvp_meta_info *out)
{
    if (!m || !out || !out->info_size)
        return -EINVAL;
    return info_out(m->scheme, m->ops, m, out);
}

KVP_API int kvp_meta_backend_info(size_t i, struct kvp_meta_info *out)
{
    const struct kvp__meta_scheme *s;
    const struct kvp__meta_ops *ops;
    if (!out || !out->info_size)
        return -EINVAL;
    return scheme_at(i, 0, &s, &ops) ? -ENOENT : info_out(s, ops, NULL, out);
}

KVP_API int kvp_meta_location_info(const char *location, int data_dir, struct kvp_meta_info *out,
                                   struct kvp_error *err)
{
    struct loc l;
    if (!out || !out->info_size)
        return bad_arg(err, "out is NULL or its info_size 0");
    int rc = parse_location(location, data_dir ? "." : NULL, &l, err);
    return rc ? rc : info_out(l.s, l.ops, NULL, out);
}

KVP_API const char *kvp_meta_location(const struct kvp_meta *m)
{
    return m ? m->location : NULL;
}

int kvp__identity_new(char out[KVP_IDENTITY_LEN + 1])
{
    unsigned char r[KVP_IDENTITY_LEN / 2];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t n = getrandom(r + got, sizeof r - got, 0);
        if (n < 0 && errno != EINTR)
            return -errno;
        got += n > 0 ? (size_t)n : 0;
    }
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
    return 0;
}

int kvp__identity_valid(const char *s, size_t len)
{
    if (len != KVP_IDENTITY_LEN)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!strchr("0123456789abcdef", s[i]) || !s[i])
            return 0;
    return 1;
}

int kvp__dir_identity(const char *dir, char out[KVP_IDENTITY_LEN + 1])
{
    char path[4096], id[KVP_IDENTITY_LEN + 2] = "";
    snprintf(path, sizeof path, "%s/IDENTITY", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, id, sizeof id - 1);
    close(fd);
    if (n < KVP_IDENTITY_LEN || !kvp__identity_valid(id, KVP_IDENTITY_LEN))
        return -EUCLEAN;
    memcpy(out, id, KVP_IDENTITY_LEN);
    out[KVP_IDENTITY_LEN] = '\0';
    return 0;
}

KVP_API const char *kvp_meta_identity(struct kvp_meta *m)
{
    if (!m)
        return NULL;
    return m->ops->identity ? m->ops->identity(m) : m->identity;
}

KVP_API int kvp_meta_open(const struct kvp_meta_opts *opts, struct kvp_meta **out)
{
    return kvp_meta_open_at(NULL, opts, out, NULL);
}

KVP_API void kvp_meta_close(struct kvp_meta *m)
{
    if (!m)
        return;
    m->ops->close(m);
    free(m->identity);
    free(m->location);
    free(m->dir);
    free(m);
}

/* ---------------------------------------------------------------- durability */

KVP_API int kvp_meta_wait(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err)
{
    if (!m)
        return bad_arg(err, "metadata handle is NULL");
    return ticket ? m->ops->wait(m, ticket, err) : 0;
}

KVP_API int kvp_meta_when_durable(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn,
                                  void *arg)
{
    if (!m || !fn)
        return -EINVAL;
    return ticket ? m->ops->when_durable(m, ticket, fn, arg) : 1;
}

/* The blocking form of a change: applied (rc 0), then durable. */
static int settle(struct kvp_meta *m, int rc, uint64_t ticket, struct kvp_error *err)
{
    if (rc || !ticket)
        return rc;
    return m->ops->wait(m, ticket, err);
}

/* ---------------------------------------------------------------- operations */

KVP_API int kvp_meta_ns(struct kvp_meta *m, const char *deployment, size_t dlen, const char *pool,
                        size_t plen, int create, struct kvp_ns **out, struct kvp_error *err)
{
    if (!m || !out)
        return bad_arg(err, "metadata handle or out is NULL");
    *out = NULL;
    if (!kvp_deployment_valid(deployment, dlen) || !kvp_pool_valid(pool, plen)) {
        kvp__set_err(err, -EINVAL, KVP_RULE_NAMESPACE, -1, 0, 0, "Invalid namespace");
        return -EINVAL;
    }
    uint64_t ticket = 0;
    int rc = m->ops->ns(m, deployment, dlen, pool, plen, create, out, &ticket, err);
    rc = settle(m, rc, ticket, err);
    if (rc && rc != -ENOENT)
        *out = NULL;
    return rc;
}

KVP_API int kvp_meta_init_rank_async(struct kvp_ns *ns, uint32_t rank, uint64_t num_pages,
                                     uint64_t *ticket, struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 0, err)))
        return rc;
    if (!ticket)
        return bad_arg(err, "ticket is NULL");
    if ((rc = kvp__check_num_pages(num_pages, err)) != 0)
        return rc;
    return ns->meta->ops->init_rank(ns, rank, (uint32_t)num_pages, ticket, err);
}

KVP_API int kvp_meta_init_rank(struct kvp_ns *ns, uint32_t rank, uint64_t num_pages,
                               struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_init_rank_async(ns, rank, num_pages, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_allocate_ordered_async(struct kvp_ns *ns, uint32_t rank, int order,
                                            const struct kvp_str *keys, size_t n, int64_t *pages,
                                            uint8_t *existed, uint64_t *ticket,
                                            struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 0, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    if ((n && !pages) || !ticket)
        return bad_arg(err, "pages or ticket is NULL");
    if (order != KVP_ORDER_DEFAULT && order != KVP_ORDER_VLLM && order != KVP_ORDER_SGLANG)
        return bad_arg(err, "unknown page order");
    const struct kvp__meta_ops *ops = ns->meta->ops;
    if (ops->allocate_ordered)
        return ops->allocate_ordered(ns, rank, order, keys, n, pages, existed, ticket, err);
    return ops->allocate(ns, rank, keys, n, pages, existed, ticket, err);
}

KVP_API int kvp_meta_allocate_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                    size_t n, int64_t *pages, uint8_t *existed, uint64_t *ticket,
                                    struct kvp_error *err)
{
    return kvp_meta_allocate_ordered_async(ns, rank, KVP_ORDER_DEFAULT, keys, n, pages, existed,
                                           ticket, err);
}

KVP_API int kvp_meta_allocate_ordered(struct kvp_ns *ns, uint32_t rank, int order,
                                      const struct kvp_str *keys, size_t n, int64_t *pages,
                                      uint8_t *existed, struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_allocate_ordered_async(ns, rank, order, keys, n, pages, existed, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_allocate(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                              size_t n, int64_t *pages, uint8_t *existed, struct kvp_error *err)
{
    return kvp_meta_allocate_ordered(ns, rank, KVP_ORDER_DEFAULT, keys, n, pages, existed, err);
}

/* The arguments of a confirmation but its opts. */
static int check_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                         const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                         const uint64_t *ticket, struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 0, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    if ((n && !pages) || (nrel && !release) || !ticket)
        return bad_arg(err, "pages, release or ticket is NULL");
    if (nrel > KVP_MAX_BATCH) {
        kvp__set_err(err, -EINVAL, KVP_RULE_TOO_MANY, -1, (int64_t)nrel, (int64_t)KVP_MAX_BATCH,
                     "too many pages to release");
        return -EINVAL;
    }
    return 0;
}

KVP_API int kvp_meta_confirm_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                   const int64_t *pages, size_t n, const int64_t *release,
                                   size_t nrel, uint64_t *ticket, struct kvp_error *err)
{
    int rc = check_confirm(ns, rank, keys, pages, n, release, nrel, ticket, err);
    if (rc)
        return rc;
    return ns->meta->ops->confirm(ns, rank, keys, pages, n, release, nrel, ticket, err);
}

KVP_API int kvp_meta_confirm_ex_async(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                      const int64_t *pages, size_t n, const int64_t *release,
                                      size_t nrel, const struct kvp_confirm_opts *opts,
                                      uint64_t *ticket, struct kvp_error *err)
{
    if (!opts)
        return kvp_meta_confirm_async(ns, rank, keys, pages, n, release, nrel, ticket, err);
    struct kvp_confirm_opts o;
    int rc;
    if ((rc = check_confirm(ns, rank, keys, pages, n, release, nrel, ticket, err)) ||
        (rc = kvp__check_confirm_opts(opts, n, &o, err)))
        return rc;
    if (!ns->meta->ops->confirm_ex)
        return ns->meta->ops->confirm(ns, rank, keys, pages, n, release, nrel, ticket, err);
    return ns->meta->ops->confirm_ex(ns, rank, keys, pages, n, release, nrel, &o, ticket, err);
}

KVP_API int kvp_meta_confirm_ex(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                                const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                                const struct kvp_confirm_opts *opts, struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_confirm_ex_async(ns, rank, keys, pages, n, release, nrel, opts, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                             const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                             struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_confirm_async(ns, rank, keys, pages, n, release, nrel, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_exists(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                            uint8_t *out, struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 1, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    if (n && !out)
        return bad_arg(err, "out is NULL");
    return ns->meta->ops->exists(ns, rank < 0 ? -1 : rank, keys, n, out, err);
}

static int unsupported(struct kvp_ns *ns, const char *what, struct kvp_error *err)
{
    kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                 "%s not implemented yet with %s metadata", what, ns->meta->ops->name);
    return -EOPNOTSUPP;
}

KVP_API int kvp_meta_pin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                         double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err)
{
    int rc;
    uint64_t t = 0, l = 0;
    if ((rc = check_ns(ns, err)) || (rc = check_keys(keys, n, err)))
        return rc;
    if (ttl_ms == 0)
        return bad_arg(err, "ttl_ms is 0");
    if (!(max_ratio > 0 && max_ratio <= 1))
        return bad_arg(err, "max_ratio must be in (0, 1]");
    if (!ns->meta->ops->pin)
        return unsupported(ns, "pins are", err);
    rc = ns->meta->ops->pin(ns, keys, n, ttl_ms, max_ratio, &t, &l, err);
    if (total)
        *total = t;
    if (limit)
        *limit = l;
    return rc;
}

KVP_API int kvp_meta_unpin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n,
                           uint64_t *released, struct kvp_error *err)
{
    int rc;
    uint64_t r = 0;
    if ((rc = check_ns(ns, err)) || (rc = check_keys(keys, n, err)))
        return rc;
    if (!ns->meta->ops->unpin)
        return unsupported(ns, "pins are", err);
    rc = ns->meta->ops->unpin(ns, keys, n, &r, err);
    if (released)
        *released = r;
    return rc;
}

KVP_API int kvp_meta_pinned(struct kvp_ns *ns, int64_t rank, uint64_t *keys, uint64_t *refs,
                            struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 1, err)))
        return rc;
    if (!ns->meta->ops->pinned)
        return unsupported(ns, "pins are", err);
    return ns->meta->ops->pinned(ns, rank < 0 ? -1 : rank, keys, refs, err);
}

KVP_API int kvp_meta_exists_hashes(struct kvp_ns *ns, const uint64_t *hashes, size_t n, int form,
                                   const uint32_t *ranks, size_t nranks, uint8_t *out,
                                   struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)))
        return rc;
    if (form != KVP_HASH_SGLANG && form != KVP_HASH_VLLM)
        return bad_arg(err, "unknown hash form");
    if ((n && !hashes) || (nranks && !ranks) || (n && nranks && !out))
        return bad_arg(err, "hashes, ranks or out is NULL");
    if (nranks && n > SIZE_MAX / nranks)
        return bad_arg(err, "too many hashes");
    for (size_t j = 0; j < nranks; j++)
        if ((rc = check_rank(ranks[j], 0, err)))
            return rc;
    if (!ns->meta->ops->exists_hashes)
        return unsupported(ns, "the query by block hashes is", err);
    return ns->meta->ops->exists_hashes(ns, hashes, n, form, ranks, nranks, out, err);
}

KVP_API int kvp_meta_lookup(struct kvp_ns *ns, uint32_t rank, int complete_only,
                            const struct kvp_str *keys, size_t n, int64_t *pages,
                            struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 0, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    if (n && !pages)
        return bad_arg(err, "pages is NULL");
    return ns->meta->ops->lookup(ns, rank, complete_only != 0, keys, n, pages, err);
}

KVP_API int kvp_meta_delete_async(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys,
                                  size_t n, uint64_t *ticket, struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 1, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    if (!ticket)
        return bad_arg(err, "ticket is NULL");
    return ns->meta->ops->del(ns, rank < 0 ? -1 : rank, keys, n, ticket, err);
}

KVP_API int kvp_meta_delete(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                            struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_delete_async(ns, rank, keys, n, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_delete_rejected(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys,
                                     size_t n, struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 1, err)) ||
        (rc = check_keys(keys, n, err)))
        return rc;
    const struct kvp__meta_ops *ops = ns->meta->ops;
    uint64_t t = 0;
    rc = (ops->del_rejected ? ops->del_rejected : ops->del)(ns, rank < 0 ? -1 : rank, keys, n, &t,
                                                            err);
    return settle(ns->meta, rc, t, err);
}

KVP_API int kvp_meta_clear_async(struct kvp_ns *ns, int64_t rank, uint64_t *ticket,
                                 struct kvp_error *err)
{
    int rc;
    if ((rc = check_ns(ns, err)) || (rc = check_rank(rank, 1, err)))
        return rc;
    if (!ticket)
        return bad_arg(err, "ticket is NULL");
    return ns->meta->ops->clear(ns, rank < 0 ? -1 : rank, ticket, err);
}

KVP_API int kvp_meta_clear(struct kvp_ns *ns, int64_t rank, struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_clear_async(ns, rank, &t, err);
    return settle(ns ? ns->meta : NULL, rc, t, err);
}

KVP_API int kvp_meta_drop_async(struct kvp_meta *m, const char *deployment, size_t dlen,
                                const char *pool, size_t plen, uint64_t *ticket,
                                struct kvp_error *err)
{
    if (!m || !ticket)
        return bad_arg(err, "metadata handle or ticket is NULL");
    if (!kvp_deployment_valid(deployment, dlen) || !kvp_pool_valid(pool, plen)) {
        kvp__set_err(err, -EINVAL, KVP_RULE_NAMESPACE, -1, 0, 0, "Invalid namespace");
        return -EINVAL;
    }
    if (!m->ops->drop) {
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                     "the %s backend cannot drop a namespace (clear it instead)", m->ops->name);
        return -EOPNOTSUPP;
    }
    return m->ops->drop(m, deployment, dlen, pool, plen, ticket, err);
}

KVP_API int kvp_meta_drop(struct kvp_meta *m, const char *deployment, size_t dlen, const char *pool,
                          size_t plen, struct kvp_error *err)
{
    uint64_t t = 0;
    int rc = kvp_meta_drop_async(m, deployment, dlen, pool, plen, &t, err);
    return settle(m, rc, t, err);
}

KVP_API size_t kvp_meta_nranks(struct kvp_ns *ns)
{
    return ns ? ns->meta->ops->nranks(ns) : 0;
}

/* ---------------------------------------------------------------- figures and checks */

KVP_API int kvp_meta_stats(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg)
{
    if (!m || !fn)
        return -EINVAL;
    return m->ops->stats(m, fn, arg);
}

KVP_API int kvp_meta_values(struct kvp_meta *m, kvp_meta_value_fn fn, void *arg)
{
    if (!m || !fn)
        return -EINVAL;
    return m->ops->values ? m->ops->values(m, fn, arg) : 0;
}

KVP_API int kvp_meta_watch(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg)
{
    if (!m)
        return -EINVAL;
    return m->ops->watch ? m->ops->watch(m, fn, arg) : -EOPNOTSUPP;
}

KVP_API int kvp_meta_inventory(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg)
{
    if (!m || !fn)
        return -EINVAL;
    return m->ops->inventory ? m->ops->inventory(m, fn, arg) : -EOPNOTSUPP;
}

KVP_API int kvp_meta_counter(struct kvp_meta *m, const char *name, uint64_t expect, uint64_t value,
                             uint64_t *now, struct kvp_error *err)
{
    if (!m || !name || !*name || strlen(name) > KVP_MAX_COUNTER_NAME) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                     "kvp_meta_counter: a handle and a name of 1..%d bytes are needed",
                     KVP_MAX_COUNTER_NAME);
        return -EINVAL;
    }
    if (!m->ops->counter) {
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                     "the %s backend keeps no counters (a data directory keeps them)",
                     m->ops->name);
        return -EOPNOTSUPP;
    }
    return m->ops->counter(m, name, expect, value, now, err);
}

KVP_API int kvp_meta_health_scope(struct kvp_meta *m, int *scope, char *why, size_t len)
{
    int sc = 0;
    if (scope)
        *scope = 0;
    if (!m)
        return -EINVAL;
    if (why && len)
        why[0] = '\0';
    int rc = m->ops->health ? m->ops->health(m, &sc, why, len) : 0;
    if (scope && rc)
        *scope = sc == KVP_HEALTH_ALL ? KVP_HEALTH_ALL : KVP_HEALTH_WRITES;
    return rc;
}

KVP_API int kvp_meta_health(struct kvp_meta *m, char *why, size_t len)
{
    return kvp_meta_health_scope(m, NULL, why, len);
}

KVP_API int kvp_meta_describe(struct kvp_meta *m, char *buf, size_t len)
{
    if (!m || (!buf && len))
        return -EINVAL;
    if (m->ops->describe)
        return m->ops->describe(m, buf, len);
    return snprintf(buf, len, "the %s backend", m->ops->name);
}

KVP_API int kvp_meta_snapshot(struct kvp_meta *m)
{
    if (!m)
        return -EINVAL;
    return m->ops->snapshot ? m->ops->snapshot(m) : -ENOENT;
}

KVP_API int kvp_meta_check(struct kvp_meta *m, struct kvp_error *err)
{
    if (!m)
        return bad_arg(err, "metadata handle is NULL");
    return m->ops->check(m, err);
}
