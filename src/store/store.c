/*
 * The store (kvpage/store.h): put and get pages by key, over one page file
 * and the metadata interface. Every call is one metadata call (allocate,
 * lookup, exists, delete) plus, for put, one confirmation; the page I/O of a
 * call is cut into batches of `entries` that the store's workers and the
 * caller run in parallel (src/store/pieces.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "kvpage/store.h"
#include "meta/backend.h"
#include "meta/location.h"
#include "meta/rules.h"
#include "store/owner.h"
#include "store/pieces.h"
#include "util/dirs.h"
#include "util/error.h"

struct kvp_store {
    struct kvp_pagefile *pf;
    struct kvp_meta *meta;
    int own_meta;
    struct kvp_ns *ns;
    uint32_t rank;
    uint64_t num_pages, bpp;
    uint32_t entries;
    int per_rank, durable, readonly, tags;
    char *location, *deployment, *pool;
    struct kvp__pieces *pieces;
    _Atomic uint64_t puts, gets, stored, already, put_failed, read, missing, get_failed;
    _Atomic uint64_t bytes_written, bytes_read, rejected;
    atomic_int logged; /* a rejected page was logged (once per handle) */
    void (*log)(void *arg, int level, const char *msg); /* the metadata's log, or NULL */
    void *log_arg;
};

KVP_API void kvp_store_opts_init(struct kvp_store_opts *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->opts_size = sizeof *opts;
    opts->entries = 8;
    opts->durable = 1;
    opts->threads = 4;
}

static int arg_err(struct kvp_error *err, const char *fmt, const char *what)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0, fmt, what);
    return -EINVAL;
}

/* The error of a file that holds no page, or more than a rank may have. */
static int pages_err(const char *path, uint64_t size, uint64_t bpp, struct kvp_error *err)
{
    uint64_t np = size / bpp;
    kvp__set_err(err, -EINVAL, KVP_RULE_NUM_PAGES, -1, (int64_t)np, KVP_MAX_PAGES,
                 "the file %s of %llu bytes holds %llu pages of %llu bytes (1 .. %u allowed)", path,
                 (unsigned long long)size, (unsigned long long)np, (unsigned long long)bpp,
                 KVP_MAX_PAGES);
    return -EINVAL;
}

/* Opens the store's namespace and initializes its rank with its page count:
 * refused (-EEXIST, KVP_RULE_RESIZE_HELD) when the rank holds data with
 * another count. */
static int init_rank(struct kvp_store *s, const char *path, struct kvp_error *err)
{
    int rc = kvp_meta_ns(s->meta, s->deployment, strlen(s->deployment), s->pool, strlen(s->pool), 1,
                         &s->ns, err);
    if (rc)
        return rc;
    struct kvp_error e2 = {0};
    rc = kvp_meta_init_rank(s->ns, s->rank, s->num_pages, &e2);
    if (rc == -EEXIST) {
        /* The command that clears it, short enough that the message (256
         * bytes) keeps it whole: the store's default location is --file,
         * the default names are left out. */
        char def[PATH_MAX + 16];
        snprintf(def, sizeof def, "file:%s.meta", path);
        int is_def = !strcmp(def, s->location), dd = !strcmp(s->deployment, "default"),
            dp = !strcmp(s->pool, "kv");
        kvp__set_err(
            err, rc, KVP_RULE_RESIZE_HELD, -1, e2.value, (int64_t)s->num_pages,
            "rank %u of %s/%s holds data in %lld pages, not %llu pages of %llu bytes: clear "
            "the rank (kvpage clear %s %s%s%s%s%s --rank %u --yes) or keep the file "
            "size and page size",
            s->rank, s->deployment, s->pool, (long long)e2.value, (unsigned long long)s->num_pages,
            (unsigned long long)s->bpp, is_def ? "--file" : "--meta", is_def ? path : s->location,
            dd ? "" : " --deployment ", dd ? "" : s->deployment, dp ? "" : " --pool ",
            dp ? "" : s->pool, s->rank);
    } else if (rc && err)
        *err = e2;
    return rc;
}

/* The owner of a page file: the canonical location (NULL: PATH.meta), the
 * deployment (NULL: the location's /ns/NAME, else "default") and the pool
 * (NULL: "kv"), each malloc'd. Returns 0 or -ENOMEM (err set). */
static int owner_of(const char *path, const char *meta, struct kvp_meta *handle,
                    const char *deployment, const char *pool, char **loc, char **dep, char **pl,
                    struct kvp_error *err)
{
    if (handle) {
        const char *hl = kvp_meta_location(handle);
        *loc = strdup(hl ? hl : "mem:");
    } else if (meta) {
        *loc = kvp__location_canon(meta);
    } else {
        size_t n = strlen(path) + 6;
        char *d = malloc(n);
        if (d)
            snprintf(d, n, "%s.meta", path);
        *loc = d ? kvp__file_location(d) : NULL;
        free(d);
    }
    char *locdep = handle || !meta ? NULL : kvp__location_deployment(meta);
    *dep = deployment ? strdup(deployment) : locdep ? locdep : strdup("default");
    if (deployment)
        free(locdep);
    *pl = strdup(pool ? pool : "kv");
    if (*loc && *dep && *pl)
        return 0;
    free(*loc), free(*dep), free(*pl);
    *loc = *dep = *pl = NULL;
    kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    return -ENOMEM;
}

static int check_names(const char *dep, const char *pool, uint32_t rank, struct kvp_error *err)
{
    if (!kvp_deployment_valid(dep, strlen(dep)) || !kvp_pool_valid(pool, strlen(pool))) {
        kvp__set_err(err, -EINVAL, KVP_RULE_NAMESPACE, -1, 0, 0,
                     "Invalid namespace: deployment '%.64s', pool '%.64s'", dep, pool);
        return -EINVAL;
    }
    if (rank > KVP_MAX_RANK) {
        kvp__set_err(err, -EINVAL, KVP_RULE_RANK_RANGE, -1, rank, KVP_MAX_RANK,
                     "rank %u is out of range (0 <= rank < 2^31)", rank);
        return -EINVAL;
    }
    return 0;
}

/* The identity of a data directory location ("file:DIR") read from it without
 * opening it, into buf; NULL for another location or a directory without. */
static const char *file_identity(const char *loc, char buf[KVP_IDENTITY_LEN + 1])
{
    return !strncmp(loc, "file:", 5) && kvp__dir_identity(loc + 5, buf) == 0 ? buf : NULL;
}

/* Whether an owner record's identity is to be compared once the metadata at
 * loc is open: a server's or Redis's (asking changes no file), or a data
 * directory without one (missing: a new state, whose identity is made with
 * it; a refused open removes it). mem: has none. */
static int defer_identity(const char *loc, const char *known)
{
    return !known && strcmp(loc, "mem:");
}

KVP_API int kvp_store_claim(const char *path, const char *location, const char *deployment,
                            const char *pool, uint32_t rank, struct kvp_error *err)
{
    if (!path || !*path)
        return arg_err(err, "%s is NULL or empty", "path");
    char *loc, *dep, *pl, *where;
    int rc = kvp__store_location(location, &where, err);
    if (rc)
        return rc;
    rc = owner_of(path, where, NULL, deployment, pool, &loc, &dep, &pl, err);
    free(where);
    if (rc)
        return rc;
    rc = check_names(dep, pl, rank, err);
    char idbuf[KVP_IDENTITY_LEN + 1];
    const char *id = file_identity(loc, idbuf); /* a remote one unknown: the location */
    if (!rc)
        rc = kvp__owner_check(path, loc, id, 0, dep, pl, rank, err);
    if (rc == 1)
        rc = kvp__owner_write(path, loc, id, dep, pl, rank, err);
    free(loc), free(dep), free(pl);
    return rc < 0 ? rc : 0;
}

/* A read-only open's page file exists (file_size, when given, sets only the
 * page count checked against the metadata's; the file is not changed). */
static int check_readonly(const struct kvp_store_opts *o, int exists, struct kvp_error *err)
{
    if (exists)
        return 0;
    kvp__set_err(err, -ENOENT, KVP_RULE_IO, -1, 0, 0,
                 "%s does not exist (a read-only store creates nothing)", o->path);
    return -ENOENT;
}

/* Opens the metadata of a read-only store at s->location: an embedded data
 * directory recovered in memory under a shared lock, writing nothing (a
 * missing one: an empty state in memory); any other location as it is. */
static int open_meta_readonly(struct kvp_store *s, const char *loc, const struct kvp_meta_opts *mo,
                              struct kvp_error *err)
{
    struct stat st;
    const char *where = !strncmp(loc, "file:", 5) && stat(loc + 5, &st) != 0 ? "mem:" : s->location;
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    if (mo && (mo->opts_size == 0 || mo->opts_size > sizeof o))
        return kvp_meta_open_at(where, mo, &s->meta, err); /* refused, naming opts_size */
    if (mo)
        memcpy(&o, mo, mo->opts_size);
    o.opts_size = sizeof o;
    o.readonly = KVP_META_READONLY_SHARED;
    return kvp_meta_open_at(where, &o, &s->meta, err);
}

/* The checks of the page file before anything is opened: *exists, the page
 * count *np (0 when only the opened file can tell: a block device), and
 * *mkdirs when its directory is missing and may be made. */
static int check_file(const struct kvp_store_opts *o, int *exists, uint64_t *np, int *mkdirs,
                      struct kvp_error *err)
{
    struct stat st;
    *exists = stat(o->path, &st) == 0;
    *np = 0;
    *mkdirs = 0;
    if (!*exists && errno != ENOENT) {
        int e = -errno;
        kvp__set_err(err, e, KVP_RULE_IO, -1, 0, 0, "cannot open %s: %s", o->path, kvp_strerror(e));
        return e;
    }
    if (*exists && S_ISDIR(st.st_mode)) {
        kvp__set_err(err, -EISDIR, KVP_RULE_IO, -1, 0, 0, "%s is a directory, not a page file",
                     o->path);
        return -EISDIR;
    }
    if (!*exists && !o->file_size) {
        kvp__set_err(err, -ENOENT, KVP_RULE_IO, -1, 0, 0,
                     "%s does not exist (a file size creates it)", o->path);
        return -ENOENT;
    }
    uint64_t size = o->file_size ? o->file_size : S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    if (o->file_size || S_ISREG(st.st_mode)) {
        *np = size / o->bytes_per_page;
        if (*np == 0 || *np > KVP_MAX_PAGES)
            return pages_err(o->path, size, o->bytes_per_page, err);
    }
    if (*exists)
        return 0;
    char *dir = kvp__dirname(o->path);
    if (!dir) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    if (stat(dir, &st) != 0) {
        rc = -errno;
        if (rc == -ENOENT && o->mkdir)
            *mkdirs = 1, rc = 0;
        else if (rc == -ENOENT)
            kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0,
                         "cannot create %s: its directory %s does not exist (create it, or "
                         "set mkdir)",
                         o->path, dir);
        else
            kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot create %s: %s: %s", o->path, dir,
                         kvp_strerror(rc));
    } else if (!S_ISDIR(st.st_mode)) {
        rc = -ENOTDIR;
        kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot create %s: %s is not a directory",
                     o->path, dir);
    } else if (access(dir, W_OK | X_OK) != 0) {
        rc = -errno;
        kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot create %s in %s: %s", o->path, dir,
                     kvp_strerror(rc));
    }
    free(dir);
    return rc;
}

/* The caller's options into *o (its struct may be older and shorter), with
 * the defaults filled in; checked. */
static int read_opts(const struct kvp_store_opts *opts_in, struct kvp_store_opts *o,
                     struct kvp_error *err)
{
    if (!opts_in)
        return arg_err(err, "%s is NULL (set it with kvp_store_opts_init)", "opts");
    kvp_store_opts_init(o);
    if (opts_in->opts_size == 0 || opts_in->opts_size > sizeof *o) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)opts_in->opts_size, sizeof *o,
                     "opts_size %zu is not a size of struct kvp_store_opts (set it with "
                     "kvp_store_opts_init)",
                     opts_in->opts_size);
        return -EINVAL;
    }
    memcpy(o, opts_in, opts_in->opts_size);
    if (!o->path || !*o->path)
        return arg_err(err, "%s is not set: the rank's storage file is required", "path");
    if (o->bytes_per_page == 0)
        return arg_err(err, "%s is 0: the page size is required", "bytes_per_page");
    if (o->entries == 0)
        o->entries = 8;
    if (o->threads == 0)
        o->threads = 4;
    if (o->threads > 64)
        o->threads = 64;
    if (o->rank > KVP_MAX_RANK) {
        kvp__set_err(err, -EINVAL, KVP_RULE_RANK_RANGE, -1, o->rank, KVP_MAX_RANK,
                     "rank %u is out of range (0 <= rank < 2^31)", o->rank);
        return -EINVAL;
    }
    return 0;
}

/* A store of the options o, nothing opened yet; NULL when out of memory. */
static struct kvp_store *store_new(const struct kvp_store_opts *o)
{
    struct kvp_store *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->rank = o->rank;
    s->bpp = o->bytes_per_page;
    s->entries = o->entries;
    s->per_rank = o->per_rank != 0;
    s->durable = o->durable != 0;
    s->readonly = o->readonly != 0;
    s->tags = !o->no_tags &&
              !(o->pagefile && o->pagefile->opts_size > offsetof(struct kvp_pagefile_opts, flags) &&
                (o->pagefile->flags & KVP_PAGEFILE_NO_TAGS));
    if (o->meta_opts && o->meta_opts->opts_size > offsetof(struct kvp_meta_opts, log_arg)) {
        s->log = o->meta_opts->log;
        s->log_arg = o->meta_opts->log_arg;
    }
    return s;
}

/* What an open made so far, undone when it fails (open_undo). */
struct made {
    int wrote_owner, meta_dir, exists;
    size_t dirs;
    char *owner_loc; /* the owner record's location (canonical) */
};

/* The store's metadata: the caller's handle, or its location (owner_loc the
 * canonical form) opened, read-only as the store is. */
static int open_meta(struct kvp_store *s, const struct kvp_store_opts *o, struct made *made,
                     struct kvp_error *err)
{
    if (o->meta_handle) {
        s->meta = o->meta_handle;
        s->location = strdup("(the caller's metadata handle)");
        return 0;
    }
    if (o->meta) {
        s->location = strdup(o->meta);
    } else {
        size_t n = strlen(o->path);
        if ((s->location = malloc(n + 11)))
            snprintf(s->location, n + 11, "file:%s.meta", o->path);
    }
    if (!s->location)
        return 0; /* the caller says out of memory */
    struct stat st;
    const char *loc = made->owner_loc;
    made->meta_dir = !s->readonly && !strncmp(loc, "file:", 5) && stat(loc + 5, &st) != 0;
    int rc = s->readonly ? open_meta_readonly(s, loc, o->meta_opts, err)
                         : kvp_meta_open_at(s->location, o->meta_opts, &s->meta, err);
    if (rc) {
        made->meta_dir = 0; /* not made, or another process's by now */
        return rc;
    }
    s->own_meta = 1;
    return 0;
}

/* Last, the page file: created or extended once everything else holds. */
static int open_pagefile(struct kvp_store *s, const struct kvp_store_opts *o, struct kvp_error *err)
{
    struct kvp_pagefile_opts po;
    kvp_pagefile_opts_init(&po);
    if (o->pagefile) /* as much as the caller's (possibly older, shorter) struct holds */
        memcpy(&po, o->pagefile,
               o->pagefile->opts_size && o->pagefile->opts_size < sizeof po ? o->pagefile->opts_size
                                                                            : sizeof po);
    po.size = o->file_size;
    po.bytes_per_page = o->bytes_per_page;
    po.entries = o->entries;
    if (o->file_size && !s->readonly)
        po.flags |= KVP_PAGEFILE_CREATE;
    if (o->mkdir && !s->readonly)
        po.flags |= KVP_PAGEFILE_MKDIR;
    if (!s->tags)
        po.flags |= KVP_PAGEFILE_NO_TAGS;
    if (s->readonly)
        po.size = 0, po.flags = (po.flags & ~KVP_PAGEFILE_CREATE) | KVP_PAGEFILE_READONLY;
    int rc = kvp_pagefile_open(o->path, &po, &s->pf, err);
    if (rc || s->num_pages)
        return rc;
    /* a block device: its size is known now */
    uint64_t np = kvp_pagefile_size(s->pf) / s->bpp;
    if (np == 0 || np > KVP_MAX_PAGES)
        return pages_err(o->path, kvp_pagefile_size(s->pf), s->bpp, err);
    s->num_pages = np;
    return init_rank(s, o->path, err);
}

/* Undoes what a failed open made, and frees the store. */
static void open_undo(struct kvp_store *s, const char *path, struct made *made)
{
    int opened = s->pf != NULL;
    kvp_store_close(s);
    if (opened && !made->exists)
        unlink(path);
    if (made->wrote_owner)
        kvp__owner_remove(path);
    if (made->meta_dir)
        kvp__remove_data_dir(made->owner_loc + 5);
    kvp__rmparents(path, made->dirs);
}

/* The owner checks (claim: as kvp__owner_check), the directories, the
 * metadata and the rank in it, the threads and the owner record: all of
 * the open but the page file. */
static int open_rest(struct kvp_store *s, const struct kvp_store_opts *o, struct made *made,
                     struct kvp_error *err)
{
    uint64_t np;
    int mkdirs = 0, rc;
    /* Checks first: nothing below changes anything until the metadata is open. */
    if ((rc = check_file(o, &made->exists, &np, &mkdirs, err)) != 0)
        return rc;
    if (s->readonly && (rc = check_readonly(o, made->exists, err)) != 0)
        return rc;
    rc = owner_of(o->path, o->meta, o->meta_handle, o->deployment, o->pool, &made->owner_loc,
                  &s->deployment, &s->pool, err);
    if (rc || (rc = check_names(s->deployment, s->pool, s->rank, err)) != 0)
        return rc;
    char idbuf[KVP_IDENTITY_LEN + 1];
    const char *loc = made->owner_loc;
    const char *id = o->meta_handle ? kvp_meta_identity(o->meta_handle) : file_identity(loc, idbuf);
    int claim = kvp__owner_check(o->path, loc, id, defer_identity(loc, id), s->deployment, s->pool,
                                 s->rank, err);
    if (claim < 0)
        return claim;
    s->num_pages = np;
    /* The file's directories first: PATH.meta lives in the same one. */
    if (mkdirs && (rc = kvp__mkparents(o->path, &made->dirs, err)) != 0)
        return rc;
    if ((rc = open_meta(s, o, made, err)) != 0)
        return rc;
    if (!s->location)
        return kvp__err_oom(err, -ENOMEM);
    if (claim == 2) { /* the record's identity against the metadata's, now known */
        claim = kvp__owner_check(o->path, loc, kvp_meta_identity(s->meta), 0, s->deployment,
                                 s->pool, s->rank, err);
        if (claim < 0)
            return claim;
    }
    /* Whether the metadata takes this rank with this page count. */
    if (s->num_pages && (rc = init_rank(s, o->path, err)) != 0)
        return rc;
    rc = kvp__pieces_open(o->threads, &s->pieces);
    if (rc) {
        kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot start the store's threads: %s",
                     kvp_strerror(rc));
        return rc;
    }
    if (claim == 1 && !s->readonly) {
        rc = kvp__owner_write(o->path, loc, kvp_meta_identity(s->meta), s->deployment, s->pool,
                              s->rank, err);
        if (rc < 0)
            return rc;
        made->wrote_owner = rc == 0;
    }
    return 0;
}

KVP_API int kvp_store_open(const struct kvp_store_opts *opts_in, struct kvp_store **out,
                           struct kvp_error *err)
{
    if (!out)
        return arg_err(err, "%s is NULL", "out");
    *out = NULL;
    struct kvp_store_opts o;
    int rc = read_opts(opts_in, &o, err);
    if (rc)
        return rc;
    /* A plain directory as file:DIR; a HOST:PORT that is none refused. */
    char *where = NULL;
    if (!o.meta_handle && (rc = kvp__store_location(o.meta, &where, err)) != 0)
        return rc;
    if (where)
        o.meta = where;
    struct kvp_store *s = store_new(&o);
    if (!s) {
        free(where);
        return kvp__err_oom(err, -ENOMEM);
    }
    struct made made = {0};
    rc = open_rest(s, &o, &made, err);
    if (!rc)
        rc = open_pagefile(s, &o, err);
    if (rc)
        open_undo(s, o.path, &made);
    else
        *out = s;
    free(made.owner_loc);
    free(where);
    return rc;
}

KVP_API void kvp_store_close(struct kvp_store *s)
{
    if (!s)
        return;
    kvp__pieces_close(s->pieces);
    if (s->pf) {
        kvp_pagefile_flush(s->pf, NULL);
        kvp_pagefile_close(s->pf);
    }
    if (s->own_meta)
        kvp_meta_close(s->meta);
    free(s->location);
    free(s->deployment);
    free(s->pool);
    free(s);
}

/* ---------------------------------------------------------------- checks */

/* Where a call's pages come from or go to: one buffer per key (bufs) or
 * several (bufv, whose buffers src_open copies into segs: key i's from
 * first[i], len[i] bytes in all). */
struct src {
    const struct kvp_store_buf *bufs;
    const struct kvp_store_bufv *bufv;
    struct kvp_pagefile_buf *segs;
    size_t *first;
    uint64_t *len;
    int vec;                           /* kvp_store_putv / getv */
    const struct kvp_confirm_opts *co; /* kvp_store_putv_ex's, checked; else NULL */
};

static uint64_t src_len(const struct src *c, size_t i)
{
    return c->bufs ? c->bufs[i].len : c->len[i];
}

static int size_err(struct kvp_store *s, size_t i, uint64_t len, struct kvp_error *err)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_SIZE, (int64_t)i, (int64_t)len, (int64_t)s->bpp,
                 "buffer %zu is %llu bytes, over the page size %llu", i, (unsigned long long)len,
                 (unsigned long long)s->bpp);
    return -EINVAL;
}

/* Checks key i's buffers (bufv[i]) and sums their lengths into *len. */
static int check_bufv(struct kvp_store *s, size_t i, const struct kvp_store_bufv *v, uint64_t *len,
                      struct kvp_error *err)
{
    if (v->n > KVP_PAGEFILE_MAX_SEGS) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, (int64_t)v->n, KVP_PAGEFILE_MAX_SEGS,
                     "key %zu has %zu buffers, over %d", i, v->n, KVP_PAGEFILE_MAX_SEGS);
        return -EINVAL;
    }
    if (v->n && !v->bufs) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, 0, 0,
                     "key %zu: bufs is NULL with %zu buffers", i, v->n);
        return -EINVAL;
    }
    *len = 0;
    for (size_t k = 0; k < v->n; k++) {
        if (v->bufs[k].len && !v->bufs[k].base) {
            kvp__set_err(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, (int64_t)k, 0,
                         "key %zu: buffer %zu is NULL with %llu bytes", i, k,
                         (unsigned long long)v->bufs[k].len);
            return -EINVAL;
        }
        if (v->bufs[k].len > s->bpp - *len) {
            kvp__set_err(err, -EINVAL, KVP_RULE_SIZE, (int64_t)i, (int64_t)k, (int64_t)s->bpp,
                         "key %zu: its buffers 0..%zu are over the page size %llu", i, k,
                         (unsigned long long)s->bpp);
            return -EINVAL;
        }
        *len += v->bufs[k].len;
    }
    return 0;
}

static void src_close(struct src *c)
{
    free(c->segs);
    free(c->first);
    free(c->len);
}

/* Checks a call's arguments; for bufv, copies its buffers into c->segs. */
static int check_call(struct kvp_store *s, const struct kvp_str *keys, struct src *c, size_t n,
                      const int64_t *results, struct kvp_error *err)
{
    if (!s)
        return arg_err(err, "%s is NULL", "store");
    if (n > (size_t)INT64_MAX / 2) {
        kvp__set_err(err, -EINVAL, KVP_RULE_TOO_MANY, -1, (int64_t)n, INT64_MAX / 2,
                     "too many keys");
        return -EINVAL;
    }
    if (n && !c->bufs && !c->bufv)
        return arg_err(err, "%s is NULL", c->vec ? "bufv" : "bufs");
    if (n && !results)
        return arg_err(err, "%s is NULL", "results");
    if (n && !keys)
        return arg_err(err, "%s is NULL", "keys");
    /* The keys are checked by the metadata call, before it changes anything. */
    for (size_t i = 0; c->bufs && i < n; i++) {
        if (c->bufs[i].len > s->bpp)
            return size_err(s, i, c->bufs[i].len, err);
        if (c->bufs[i].len && !c->bufs[i].base) {
            kvp__set_err(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, 0, 0,
                         "buffer %zu is NULL with %llu bytes", i,
                         (unsigned long long)c->bufs[i].len);
            return -EINVAL;
        }
    }
    if (!c->bufv || !n)
        return 0;
    c->len = malloc(n * sizeof *c->len);
    c->first = malloc(n * sizeof *c->first);
    size_t total = 0;
    int rc = c->len && c->first ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        rc = check_bufv(s, i, &c->bufv[i], &c->len[i], err);
        c->first[i] = total;
        total += c->bufv[i].n;
    }
    if (!rc && !(c->segs = malloc((total ? total : 1) * sizeof *c->segs)))
        rc = -ENOMEM;
    if (rc == -ENOMEM)
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        for (size_t k = 0; k < c->bufv[i].n; k++)
            c->segs[c->first[i] + k] =
                (struct kvp_pagefile_buf){c->bufv[i].bufs[k].base, c->bufv[i].bufs[k].len};
    if (rc)
        src_close(c);
    return rc;
}

/* Key i's page I/O at page `page`: ops[k] (one buffer) or vops[k] (several). */
static void src_op(struct kvp_store *s, const struct src *c, size_t i, int64_t page,
                   struct kvp_pagefile_op *ops, struct kvp_pagefile_vop *vops, size_t k)
{
    int64_t off = (int64_t)((uint64_t)page * s->bpp);
    if (c->bufs)
        ops[k] = (struct kvp_pagefile_op){off, c->bufs[i].base, c->bufs[i].len};
    else
        vops[k] = (struct kvp_pagefile_vop){off, c->segs + c->first[i], c->bufv[i].n};
}

/* Zeroes the buffers of op k: a rejected page's bytes are never handed
 * out. */
static void src_zero(const struct src *c, const struct kvp_pagefile_op *ops,
                     const struct kvp_pagefile_vop *vops, size_t k)
{
    if (c->bufs) {
        if (ops[k].size)
            memset(ops[k].buf, 0, ops[k].size);
        return;
    }
    for (size_t g = 0; g < vops[k].nsegs; g++)
        if (vops[k].segs[g].len)
            memset(vops[k].segs[g].base, 0, vops[k].segs[g].len);
}

/* ---------------------------------------------------------------- page I/O */

/* The page I/O of one call: ops[k] (or vops[k]) for k < nops, results
 * into res[k]. */
struct io_job {
    struct kvp_store *s;
    int write;
    struct kvp_pagefile_op *ops;
    struct kvp_pagefile_vop *vops; /* not NULL: the call's pages are vectored */
    const char *const *keys;       /* keys[k]: op k's key (the tag's), or NULL: no tags */
    int64_t *res;
    size_t nops;
    atomic_int have_why; /* why holds the first rejection's message */
    char why[sizeof(((struct kvp_error *)0)->msg)];
};

static void io_piece(void *arg, size_t piece)
{
    struct io_job *j = arg;
    size_t lo = piece * j->s->entries;
    size_t n = j->nops - lo < j->s->entries ? j->nops - lo : j->s->entries;
    struct kvp_pagefile *pf = j->s->pf;
    const char *const *k = j->keys ? j->keys + lo : NULL;
    struct kvp_error e = {0};
    int rc = j->vops && j->write
                 ? kvp_pagefile_writev_keyed(pf, j->vops + lo, k, n, j->res + lo, &e)
             : j->vops  ? kvp_pagefile_readv_keyed(pf, j->vops + lo, k, n, j->res + lo, &e)
             : j->write ? kvp_pagefile_write_keyed(pf, j->ops + lo, k, n, j->res + lo, &e)
                        : kvp_pagefile_read_keyed(pf, j->ops + lo, k, n, j->res + lo, &e);
    if (rc == -EINVAL) /* validated before: cannot happen, but never leave results unset */
        for (size_t i = 0; i < n; i++)
            j->res[lo + i] = rc;
    if (rc == -EBADMSG && !atomic_exchange(&j->have_why, 1))
        memcpy(j->why, e.msg, sizeof j->why);
}

/* The keys of ops[k] (keys[idx[k]]) as NUL-terminated strings, for the
 * tags: one allocation (free it), NULL when tags are off or no memory (the
 * I/O then goes without keys: a page so written reads as missing for its
 * key later, never as another's). */
static const char **tag_keys(const struct kvp_store *s, const struct kvp_str *keys,
                             const size_t *idx, size_t nops)
{
    if (!s->tags || !nops)
        return NULL;
    size_t bytes = nops * sizeof(char *);
    for (size_t k = 0; k < nops; k++)
        bytes += keys[idx[k]].len + 1;
    const char **out = malloc(bytes);
    if (!out)
        return NULL;
    char *p = (char *)(out + nops);
    for (size_t k = 0; k < nops; k++) {
        const struct kvp_str *key = &keys[idx[k]];
        memcpy(p, key->ptr, key->len);
        p[key->len] = 0;
        out[k] = p;
        p += key->len + 1;
    }
    return out;
}

/* Runs the page I/O of a call; *why (may be NULL) receives the first
 * rejection's message. */
static void run_io(struct kvp_store *s, int write, struct kvp_pagefile_op *ops,
                   struct kvp_pagefile_vop *vops, const char *const *keys, int64_t *res,
                   size_t nops, char *why, size_t why_len)
{
    if (!nops)
        return;
    struct io_job j = {
        .s = s, .write = write, .ops = ops, .vops = vops, .keys = keys, .res = res, .nops = nops};
    size_t pieces = (nops + s->entries - 1) / s->entries;
    kvp__pieces_run(s->pieces, pieces, io_piece, &j);
    if (why && atomic_load(&j.have_why))
        snprintf(why, why_len, "%s", j.why);
}

/* ---------------------------------------------------------------- put */

/* Index of the first key given the same page earlier in this call, or -1:
 * a small open-addressing table of page -> first index. */
struct page_set {
    int64_t *page;
    size_t *idx;
    size_t mask;
};

static int page_set_init(struct page_set *t, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    t->mask = cap - 1;
    t->page = malloc(cap * sizeof *t->page);
    t->idx = malloc(cap * sizeof *t->idx);
    if (!t->page || !t->idx) {
        free(t->page);
        free(t->idx);
        return -ENOMEM;
    }
    memset(t->page, 0xff, cap * sizeof *t->page); /* -1: empty */
    return 0;
}

static int64_t page_set_first(struct page_set *t, int64_t page, size_t i)
{
    size_t h = ((uint64_t)page * 0x9e3779b97f4a7c15ull) >> 20 & t->mask;
    for (;; h = (h + 1) & t->mask) {
        if (t->page[h] == -1) {
            t->page[h] = page;
            t->idx[h] = i;
            return -1;
        }
        if (t->page[h] == page)
            return (int64_t)t->idx[h];
    }
}

static void page_set_free(struct page_set *t)
{
    free(t->page);
    free(t->idx);
}

/* Why key i got no page: every page of the rank is reserved by a write not
 * yet confirmed (this call's too) or holds a key that was just read (eviction
 * spares those for the read grace), as far as the metadata's figures say. */
static void no_page_err(struct kvp_store *s, size_t i, struct kvp_error *err)
{
    struct kvp_store_stats st = {.stats_size = sizeof st};
    if (kvp_store_stats(s, &st, NULL) == 0 && st.num_pages)
        kvp__set_err(err, -ENOSPC, KVP_RULE_NONE, (int64_t)i, 0, 0,
                     "key %zu: rank %u of %s/%s has no free page: all %llu are taken, %llu "
                     "reserved by writes not yet confirmed, %llu holding keys read too recently to "
                     "evict (the read grace)",
                     i, s->rank, s->deployment, s->pool, (unsigned long long)st.num_pages,
                     (unsigned long long)st.reserved, (unsigned long long)st.held);
    else
        kvp__set_err(err, -ENOSPC, KVP_RULE_NONE, (int64_t)i, 0, 0,
                     "key %zu: rank %u of %s/%s has no free page: none of its %llu pages is free "
                     "or evictable",
                     i, s->rank, s->deployment, s->pool, (unsigned long long)s->num_pages);
}

/* -EROFS for a change asked of a read-only store. */
static int ro_err(const char *what, struct kvp_error *err)
{
    kvp__set_err(err, -EROFS, KVP_RULE_ARG, -1, 0, 0,
                 "%s on a store opened read-only (kvp_store_opts.readonly)", what);
    return -EROFS;
}

/* The arrays of one put, in one allocation (ops: room for vops). */
struct put_arrays {
    char *mem;
    int64_t *pages, *wres, *cpages, *release;
    int64_t *dupof; /* -1, or the first index of the same key */
    struct kvp_pagefile_op *ops;
    struct kvp_pagefile_vop *vops;
    struct kvp_str *ckeys;
    size_t *widx;
    uint8_t *existed;
};

static int put_arrays_alloc(struct put_arrays *a, size_t n, int bufv)
{
    _Static_assert(sizeof(struct kvp_pagefile_vop) == sizeof(struct kvp_pagefile_op),
                   "ops and vops share their room");
    size_t bytes = n * (sizeof(int64_t) * 5 + sizeof(struct kvp_pagefile_op) +
                        sizeof(struct kvp_str) + sizeof(size_t) + 1);
    if (!(a->mem = malloc(bytes)))
        return -ENOMEM;
    a->pages = (int64_t *)a->mem;
    a->wres = a->pages + n;
    a->cpages = a->wres + n;
    a->release = a->cpages + n;
    a->dupof = a->release + n;
    a->ops = (struct kvp_pagefile_op *)(a->dupof + n);
    a->vops = bufv ? (struct kvp_pagefile_vop *)a->ops : NULL;
    a->ckeys = (struct kvp_str *)(a->ops + n);
    a->widx = (size_t *)(a->ckeys + n);
    a->existed = (uint8_t *)(a->widx + n);
    return 0;
}

/* Writes the pages of the keys to write (not held already, given a page,
 * first of their page: a later copy of a key waits for the first's fate in
 * dupof); the results of the others. Returns how many were written (widx). */
static size_t put_write(struct kvp_store *s, const struct kvp_str *keys, const struct src *c,
                        size_t n, struct put_arrays *a, struct page_set *dup, int64_t *results)
{
    size_t nw = 0;
    for (size_t i = 0; i < n; i++) {
        a->dupof[i] = -1;
        if (a->existed[i]) {
            results[i] = KVP_STORE_ALREADY;
        } else if (a->pages[i] < 0) {
            results[i] = -ENOSPC;
        } else {
            int64_t first = page_set_first(dup, a->pages[i], i);
            if (first >= 0) {
                a->dupof[i] = first; /* resolved below, after the first's fate */
                continue;
            }
            src_op(s, c, i, a->pages[i], a->ops, a->vops, nw);
            a->widx[nw++] = i;
        }
    }
    const char **tkeys = tag_keys(s, keys, a->widx, nw);
    run_io(s, 1, a->ops, a->vops, tkeys, a->wres, nw, NULL, 0);
    free(tkeys);
    return nw;
}

/* Marks confirm_opts's failure. */
static struct kvp_confirm_opts oom_opts;

/* Room for the opts of up to n confirmations when the caller gave opts
 * (c->co): NULL when it gave none, &oom_opts without memory, else one
 * allocation (the caller frees it) that opts_set fills. */
static struct kvp_confirm_opts *opts_new(const struct src *c, size_t n)
{
    if (!c->co)
        return NULL;
    struct kvp_confirm_opts *co =
        malloc(sizeof *co + n * (sizeof(struct kvp_str) + sizeof(uint32_t *) + sizeof(uint32_t)));
    if (!co)
        return &oom_opts;
    struct kvp_str *par = (struct kvp_str *)(co + 1);
    const uint32_t **tok = (const uint32_t **)(par + n);
    uint32_t *ntok = (uint32_t *)(tok + n);
    *co = (struct kvp_confirm_opts){sizeof *co, c->co->parents ? par : NULL,
                                    c->co->ntokens ? tok : NULL, c->co->ntokens ? ntok : NULL};
    return co;
}

/* Confirmation j is the caller's key i. */
static void opts_set(struct kvp_confirm_opts *co, const struct src *c, size_t j, size_t i)
{
    if (!co || co == &oom_opts)
        return;
    if (co->parents)
        ((struct kvp_str *)co->parents)[j] = c->co->parents[i];
    if (co->ntokens) {
        ((const uint32_t **)co->token_ids)[j] = c->co->token_ids[i];
        ((uint32_t *)co->ntokens)[j] = c->co->ntokens[i];
    }
}

/* Confirms the nw written pages whose bytes all reached the file (and, for
 * a durable put, were flushed) and gives the others back; their results.
 * *e: why one failed. Returns the bytes stored. */
static uint64_t put_confirm(struct kvp_store *s, const struct kvp_str *keys, const struct src *c,
                            struct put_arrays *a, size_t nw, uint64_t *ticket, int64_t *results,
                            struct kvp_error *e)
{
    size_t nc = 0, nrel = 0;
    uint64_t bytes_w = 0;
    struct kvp_confirm_opts *co = opts_new(c, nw);
    for (size_t k = 0; k < nw; k++) {
        size_t i = a->widx[k];
        if (a->wres[k] == (int64_t)src_len(c, i)) {
            opts_set(co, c, nc, i);
            a->ckeys[nc] = keys[i];
            a->cpages[nc++] = a->pages[i];
            bytes_w += src_len(c, i);
            results[i] = KVP_STORE_STORED;
        } else {
            a->release[nrel++] = a->pages[i];
            results[i] = a->wres[k] < 0 ? a->wres[k] : -EIO;
        }
    }
    int frc = 0;
    if (nc && s->durable)
        frc = kvp_pagefile_flush(s->pf, e);
    if (frc) {
        /* Nothing written is known to be durable: release it all. */
        for (size_t k = 0; k < nw; k++)
            if (results[a->widx[k]] == KVP_STORE_STORED)
                results[a->widx[k]] = frc;
        nrel = 0;
        for (size_t k = 0; k < nw; k++)
            a->release[nrel++] = a->pages[a->widx[k]];
        nc = 0;
    }
    if (!nc && !nrel) {
        if (co != &oom_opts)
            free(co);
        return bytes_w;
    }
    struct kvp_error ce = {0};
    int crc = co == &oom_opts ? kvp__err_oom(&ce, -ENOMEM)
              : s->durable    ? kvp_meta_confirm_ex(s->ns, s->rank, a->ckeys, a->cpages, nc,
                                                    a->release, nrel, co, &ce)
                              : kvp_meta_confirm_ex_async(s->ns, s->rank, a->ckeys, a->cpages, nc,
                                                          a->release, nrel, co, ticket, &ce);
    if (co != &oom_opts)
        free(co);
    if (crc) {
        /* All or nothing: nothing was confirmed. Give the pages back
         * (best effort: a lease would reclaim them anyway). */
        for (size_t k = 0; k < nw; k++) {
            if (results[a->widx[k]] == KVP_STORE_STORED)
                results[a->widx[k]] = crc;
            a->release[k] = a->pages[a->widx[k]];
        }
        kvp_meta_confirm(s->ns, s->rank, NULL, NULL, 0, a->release, nw, NULL);
        *e = ce;
    }
    return bytes_w;
}

/* Settles the results (later copies of a key share the first copy's) and
 * counts them; the first failure is the call's (err: e, or what the result
 * says). Returns 0 or that failure. */
static int put_results(struct kvp_store *s, size_t n, const int64_t *dupof, int64_t *results,
                       const struct kvp_error *e, struct kvp_error *err)
{
    uint64_t st = 0, al = 0, fl = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (dupof[i] >= 0) {
            int64_t f = results[dupof[i]];
            results[i] = f == KVP_STORE_STORED ? KVP_STORE_ALREADY : f;
        }
        if (results[i] == KVP_STORE_STORED) {
            st++;
        } else if (results[i] == KVP_STORE_ALREADY) {
            al++;
        } else {
            fl++;
            if (!rc) {
                rc = (int)results[i];
                if (rc == -ENOSPC && !e->code)
                    no_page_err(s, i, err);
                else if (err && e->code)
                    *err = *e, err->index = (int64_t)i;
                else
                    kvp__set_err(err, rc, KVP_RULE_IO, (int64_t)i, 0, 0,
                                 "key %zu: writing its page failed: %s", i, kvp_strerror(rc));
            }
        }
    }
    atomic_fetch_add(&s->stored, st);
    atomic_fetch_add(&s->already, al);
    atomic_fetch_add(&s->put_failed, fl);
    return rc;
}

static int store_put(struct kvp_store *s, const struct kvp_str *keys, struct src *c, size_t n,
                     int64_t *results, struct kvp_error *err)
{
    int rc = check_call(s, keys, c, n, results, err);
    if (rc)
        return rc;
    if (s->readonly) {
        for (size_t i = 0; i < n; i++)
            results[i] = -EROFS;
        return ro_err("put", err);
    }
    atomic_fetch_add(&s->puts, 1);
    if (n == 0)
        return 0;
    struct put_arrays a;
    struct page_set dup;
    if (put_arrays_alloc(&a, n, c->bufv != NULL) || page_set_init(&dup, n)) {
        free(a.mem);
        src_close(c);
        return kvp__err_oom(err, -ENOMEM);
    }
    /* Without durable puts the metadata's changes are not waited for either:
     * they are logged and synced by the log's own group commit, and a crash
     * before that forgets keys (never points one at wrong bytes that a
     * durable put would have kept out). */
    struct kvp_error e = {0};
    uint64_t ticket = 0;
    rc = s->durable
             ? kvp_meta_allocate(s->ns, s->rank, keys, n, a.pages, a.existed, &e)
             : kvp_meta_allocate_async(s->ns, s->rank, keys, n, a.pages, a.existed, &ticket, &e);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
        atomic_fetch_add(&s->put_failed, n);
        if (err)
            *err = e;
    } else {
        size_t nw = put_write(s, keys, c, n, &a, &dup, results);
        uint64_t bytes_w = put_confirm(s, keys, c, &a, nw, &ticket, results, &e);
        rc = put_results(s, n, a.dupof, results, &e, err);
        atomic_fetch_add(&s->bytes_written, bytes_w);
    }
    page_set_free(&dup);
    free(a.mem);
    src_close(c);
    return rc;
}

KVP_API int kvp_store_put(struct kvp_store *s, const struct kvp_str *keys,
                          const struct kvp_store_buf *bufs, size_t n, int64_t *results,
                          struct kvp_error *err)
{
    struct src c = {.bufs = bufs};
    return store_put(s, keys, &c, n, results, err);
}

KVP_API int kvp_store_putv(struct kvp_store *s, const struct kvp_str *keys,
                           const struct kvp_store_bufv *bufv, size_t n, int64_t *results,
                           struct kvp_error *err)
{
    struct src c = {.bufv = bufv, .vec = 1};
    return store_put(s, keys, &c, n, results, err);
}

KVP_API int kvp_store_putv_ex(struct kvp_store *s, const struct kvp_str *keys,
                              const struct kvp_store_bufv *bufv, size_t n,
                              const struct kvp_confirm_opts *opts, int64_t *results,
                              struct kvp_error *err)
{
    struct kvp_confirm_opts o;
    struct src c = {.bufv = bufv, .vec = 1, .co = opts ? &o : NULL};
    if (opts) {
        int rc = kvp__check_confirm_opts(opts, n, &o, err);
        if (rc)
            return rc;
    }
    return store_put(s, keys, &c, n, results, err);
}

/* ---------------------------------------------------------------- get */

/* Keys keys[idx[0..nrej)] were rejected by their pages' tags: logged (the
 * first of this handle only), dropped from the metadata so that the next
 * lookup is an honest miss. A read-only store writes no file of its own: it
 * drops them only from remote metadata (as its reads touch keys there);
 * embedded, its next read is rejected again (kvpage get then drops the key
 * through a writable store). why: the page file's message of the first. */
static void reject(struct kvp_store *s, const struct kvp_str *keys, const int64_t *pages,
                   const size_t *idx, size_t nrej, const char *why)
{
    if (!atomic_exchange(&s->logged, 1)) {
        char line[PATH_MAX + 1024], page[PATH_MAX + 64];
        const struct kvp_str *k = &keys[idx[0]];
        if (!*why) {
            snprintf(page, sizeof page, "page %lld of %s failed its integrity tag",
                     (long long)pages[idx[0]], kvp_pagefile_path(s->pf));
            why = page;
        }
        snprintf(line, sizeof line,
                 "kvpage: key '%.*s' of %s/%s rank %u is reported missing and dropped: %s. Later "
                 "rejections of this store are counted (kvp_store_stats' rejected), not logged",
                 (int)(k->len > 160 ? 160 : k->len), (const char *)k->ptr, s->deployment, s->pool,
                 s->rank, why);
        if (s->log)
            s->log(s->log_arg, 1, line);
        else
            fprintf(stderr, "%s\n", line);
    }
    struct kvp_meta_info mi = {.info_size = sizeof mi};
    if (s->readonly && !(kvp_meta_info(s->meta, &mi) == 0 && mi.remote))
        return;
    struct kvp_str *drop = malloc(nrej * sizeof *drop);
    if (!drop)
        return; /* the next read is rejected again */
    for (size_t r = 0; r < nrej; r++)
        drop[r] = keys[idx[r]];
    kvp_meta_delete_rejected(s->ns, s->rank, drop, nrej, NULL);
    free(drop);
}

static int64_t store_get(struct kvp_store *s, const struct kvp_str *keys, struct src *c, size_t n,
                         int64_t *results, struct kvp_error *err)
{
    int rc = check_call(s, keys, c, n, results, err);
    if (rc)
        return rc;
    atomic_fetch_add(&s->gets, 1);
    if (n == 0)
        return 0;
    char *mem = malloc(n * (sizeof(int64_t) * 2 + sizeof(struct kvp_pagefile_op) + sizeof(size_t)));
    if (!mem) {
        src_close(c);
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    int64_t *pages = (int64_t *)mem;
    int64_t *rres = pages + n;
    struct kvp_pagefile_op *ops = (struct kvp_pagefile_op *)(rres + n);
    struct kvp_pagefile_vop *vops = c->bufv ? (struct kvp_pagefile_vop *)ops : NULL;
    size_t *ridx = (size_t *)(ops + n);
    rc = kvp_meta_lookup(s->ns, s->rank, !s->per_rank, keys, n, pages, err);
    if (rc) {
        free(mem);
        src_close(c);
        return rc;
    }
    size_t nr = 0;
    for (size_t i = 0; i < n; i++) {
        if (pages[i] < 0) {
            results[i] = -ENOENT;
            continue;
        }
        src_op(s, c, i, pages[i], ops, vops, nr);
        ridx[nr++] = i;
    }
    const char **tkeys = tag_keys(s, keys, ridx, nr);
    char why[sizeof err->msg] = "";
    run_io(s, 0, ops, vops, tkeys, rres, nr, why, sizeof why);
    free(tkeys);
    uint64_t bytes_r = 0, ok = 0, failed = 0;
    size_t nrej = 0;
    for (size_t k = 0; k < nr; k++) {
        size_t i = ridx[k];
        if (rres[k] == -EBADMSG) {
            /* Rejected by its tag: a miss, never the bytes; dropped below. */
            results[i] = -ENOENT;
            src_zero(c, ops, vops, k);
            ridx[nrej++] = i; /* ridx[0..k) is read no more */
            continue;
        }
        results[i] = rres[k] == (int64_t)src_len(c, i) ? rres[k] : rres[k] < 0 ? rres[k] : -EIO;
        if (results[i] >= 0)
            bytes_r += (uint64_t)results[i], ok++;
        else
            failed++;
    }
    if (nrej)
        reject(s, keys, pages, ridx, nrej, why);
    int64_t lead = 0;
    while ((size_t)lead < n && results[lead] >= 0)
        lead++;
    for (size_t i = 0; i < n; i++)
        if (results[i] < 0 && results[i] != -ENOENT) {
            kvp__set_err(err, (int)results[i], KVP_RULE_IO, (int64_t)i, 0, 0,
                         "key %zu: reading its page failed: %s", i, kvp_strerror((int)results[i]));
            break;
        }
    atomic_fetch_add(&s->read, ok);
    atomic_fetch_add(&s->get_failed, failed);
    atomic_fetch_add(&s->missing, n - nr + nrej);
    atomic_fetch_add(&s->rejected, nrej);
    atomic_fetch_add(&s->bytes_read, bytes_r);
    free(mem);
    src_close(c);
    return lead;
}

KVP_API int64_t kvp_store_get(struct kvp_store *s, const struct kvp_str *keys,
                              const struct kvp_store_buf *bufs, size_t n, int64_t *results,
                              struct kvp_error *err)
{
    struct src c = {.bufs = bufs};
    return store_get(s, keys, &c, n, results, err);
}

KVP_API int64_t kvp_store_getv(struct kvp_store *s, const struct kvp_str *keys,
                               const struct kvp_store_bufv *bufv, size_t n, int64_t *results,
                               struct kvp_error *err)
{
    struct src c = {.bufv = bufv, .vec = 1};
    return store_get(s, keys, &c, n, results, err);
}

/* ---------------------------------------------------------------- the rest */

KVP_API int64_t kvp_store_exists(struct kvp_store *s, const struct kvp_str *keys, size_t n,
                                 uint8_t *out, struct kvp_error *err)
{
    if (!s)
        return arg_err(err, "%s is NULL", "store");
    uint8_t *flags = out ? out : malloc(n ? n : 1);
    if (!flags) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = kvp_meta_exists(s->ns, s->per_rank ? (int64_t)s->rank : -1, keys, n, flags, err);
    int64_t lead = 0;
    if (!rc)
        while ((size_t)lead < n && flags[lead])
            lead++;
    if (!out)
        free(flags);
    return rc ? rc : lead;
}

KVP_API int kvp_store_delete(struct kvp_store *s, const struct kvp_str *keys, size_t n,
                             struct kvp_error *err)
{
    if (!s)
        return arg_err(err, "%s is NULL", "store");
    if (s->readonly)
        return ro_err("delete", err);
    return kvp_meta_delete(s->ns, s->rank, keys, n, err);
}

KVP_API int kvp_store_clear(struct kvp_store *s, struct kvp_error *err)
{
    if (!s)
        return arg_err(err, "%s is NULL", "store");
    if (s->readonly)
        return ro_err("clear", err);
    return kvp_meta_clear(s->ns, s->rank, err);
}

struct stats_find {
    struct kvp_store *s;
    struct kvp_store_stats *st;
    int found;
};

static int stats_fn(const char *dep, const char *pool, const struct kvp_rank_stats *r, size_t nr,
                    void *arg)
{
    struct stats_find *f = arg;
    if (strcmp(dep, f->s->deployment) || strcmp(pool, f->s->pool))
        return 0;
    for (size_t i = 0; i < nr; i++) {
        if (r[i].rank != f->s->rank)
            continue;
        struct kvp_store_stats *st = f->st;
        st->num_pages = r[i].num_pages;
        st->free = r[i].free;
        st->reserved = r[i].reserved;
        st->held = r[i].held;
        st->keys = r[i].keys;
        st->hits = r[i].hits;
        st->misses = r[i].misses;
        st->allocations = r[i].allocations;
        st->evictions = r[i].evictions;
        f->found = 1;
        return 1;
    }
    return 0;
}

KVP_API int kvp_store_stats(struct kvp_store *s, struct kvp_store_stats *out, struct kvp_error *err)
{
    if (!s || !out)
        return arg_err(err, "%s is NULL", !s ? "store" : "stats");
    if (out->stats_size == 0 || out->stats_size > sizeof *out) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)out->stats_size, sizeof *out,
                     "stats_size %zu is not a size of struct kvp_store_stats", out->stats_size);
        return -EINVAL;
    }
    struct kvp_store_stats st = {.stats_size = out->stats_size};
    struct stats_find f = {s, &st, 0};
    int rc = kvp_meta_stats(s->meta, stats_fn, &f);
    if (rc < 0) {
        kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "reading the metadata's figures failed: %s",
                     kvp_strerror(rc));
        return rc;
    }
    st.puts = atomic_load(&s->puts);
    st.gets = atomic_load(&s->gets);
    st.stored = atomic_load(&s->stored);
    st.already = atomic_load(&s->already);
    st.put_failed = atomic_load(&s->put_failed);
    st.read = atomic_load(&s->read);
    st.missing = atomic_load(&s->missing);
    st.get_failed = atomic_load(&s->get_failed);
    st.bytes_written = atomic_load(&s->bytes_written);
    st.bytes_read = atomic_load(&s->bytes_read);
    st.rejected = atomic_load(&s->rejected);
    memcpy(out, &st, out->stats_size);
    return 0;
}

KVP_API struct kvp_pagefile *kvp_store_pagefile(const struct kvp_store *s)
{
    return s->pf;
}
KVP_API struct kvp_meta *kvp_store_meta(const struct kvp_store *s)
{
    return s->meta;
}
KVP_API struct kvp_ns *kvp_store_ns(const struct kvp_store *s)
{
    return s->ns;
}
KVP_API uint32_t kvp_store_rank(const struct kvp_store *s)
{
    return s->rank;
}
KVP_API uint64_t kvp_store_num_pages(const struct kvp_store *s)
{
    return s->num_pages;
}
KVP_API uint64_t kvp_store_bytes_per_page(const struct kvp_store *s)
{
    return s->bpp;
}
KVP_API const char *kvp_store_location(const struct kvp_store *s)
{
    return s->location;
}
