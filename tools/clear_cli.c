/*
 * kvpage clear: forgets what a metadata location holds, at one of three
 * scopes (one rank of a namespace, a namespace, every namespace), or with
 * --drop removes the namespaces themselves (kvp_meta_drop). Embedded (a data
 * directory: the state is opened in this process, so no server may hold it)
 * or remote (http://, redis://), through the library's calls, so every
 * backend clears alike.
 *
 * It changes nothing without --yes: it says what it would clear, with the
 * keys each rank holds now, and how to confirm, and exits 2. A clear frees
 * the pages of the keys it forgets; the page files are not touched (the
 * next put writes over them). Ranks stay initialized with their page count,
 * so a rank whose size must change is cleared, then initialized again by
 * its next user.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kvpage/meta.h"

struct clear_args {
    int yes, all, drop, has_rank;
    uint32_t rank;
};

static int clear_extra(const char *name, const char *value, void *arg)
{
    struct clear_args *a = arg;
    int *sw = !strcmp(name, "--yes")    ? &a->yes
              : !strcmp(name, "--all")  ? &a->all
              : !strcmp(name, "--drop") ? &a->drop
                                        : NULL;
    if (sw) {
        *sw = 1;
        return 2;
    }
    if (strcmp(name, "--rank"))
        return 0;
    char *end;
    unsigned long long v = value ? strtoull(value, &end, 10) : 0;
    if (!value || !*value || *end || value[0] == '-' || v > KVP_MAX_RANK) {
        fprintf(stderr, "kvpage clear: --rank '%s' is not a rank (0 .. 2147483647)\n",
                value ? value : "");
        return -1;
    }
    a->rank = (uint32_t)v;
    a->has_rank = 1;
    return 1;
}

static void clear_usage(FILE *out)
{
    fprintf(out, "usage: kvpage clear --meta DIR|URL [--deployment NAME] [--pool NAME]\n"
                 "                    [--rank R | --all] [--drop] --yes\n"
                 "Forgets the keys of one rank (--rank R), of a namespace (every rank of\n"
                 "--deployment/--pool), or of every namespace of the location (--all): their\n"
                 "pages become free, the ranks stay initialized with their page count. With\n"
                 "--drop the namespace (or with --all every namespace) is removed with its\n"
                 "ranks: gone from the status page and /metrics; an engine's next\n"
                 "initialization creates it again, empty. Without --yes nothing changes: it\n"
                 "prints what it would clear and exits 2. The page files are not touched.\n"
                 "flags:\n"
                 "  --meta DIR|URL     the metadata: a data directory (no kvpage serve may be\n"
                 "                     running on it: clear through its http://HOST:PORT\n"
                 "                     instead), http://HOST:PORT[/ns/NAME] or redis://...\n"
                 "  --file PATH        instead of --meta: the store's default, PATH.meta\n"
                 "  --deployment NAME  (default: the URL's /ns/NAME, else default)\n"
                 "  --pool NAME        (default: kv)\n"
                 "  --rank R           clear this rank only (not with --drop or --all)\n"
                 "  --all              every namespace of the location\n"
                 "  --drop             remove the namespace(s) instead of clearing them\n"
                 "  --yes              do it\n"
                 "  --timeout MS       the metadata server's request timeout (default 10000)\n"
                 "exit status: 0 done, 1 no such namespace or rank, 2 a bad flag or no --yes\n"
                 "(nothing changed), 3 the metadata failed.\n"
                 "examples:\n"
                 "  kvpage clear --meta http://10.0.0.5:18000 --rank 0 --yes\n"
                 "  kvpage clear --meta /var/lib/kvpage --deployment bench --drop --yes\n"
                 "  kvpage clear --meta redis://10.0.0.5:6379/0 --all --yes\n");
}

/* One namespace the location holds, with its keys per rank. */
struct clear_ns {
    char *dep, *pool;
    struct kvp_rank_stats *ranks;
    size_t nranks;
};
struct clear_list {
    struct clear_ns *v;
    size_t n;
    int oom;
};

static int collect(const char *dep, const char *pool, const struct kvp_rank_stats *ranks,
                   size_t nranks, void *arg)
{
    struct clear_list *l = arg;
    struct clear_ns *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v)
        return l->oom = -ENOMEM;
    l->v = v;
    struct clear_ns *e = &v[l->n];
    e->dep = strdup(dep);
    e->pool = strdup(pool);
    e->ranks = malloc((nranks ? nranks : 1) * sizeof *ranks);
    e->nranks = nranks;
    l->n++;
    if (!e->dep || !e->pool || !e->ranks)
        return l->oom = -ENOMEM;
    memcpy(e->ranks, ranks, nranks * sizeof *ranks);
    return 0;
}

static void list_free(struct clear_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].dep);
        free(l->v[i].pool);
        free(l->v[i].ranks);
    }
    free(l->v);
}

static const struct clear_ns *find_ns(const struct clear_list *l, const char *dep, const char *pool)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].dep, dep) && !strcmp(l->v[i].pool, pool))
            return &l->v[i];
    return NULL;
}

static uint64_t ns_keys(const struct clear_ns *e, int has_rank, uint32_t rank)
{
    uint64_t k = 0;
    for (size_t i = 0; i < e->nranks; i++)
        if (!has_rank || e->ranks[i].rank == rank)
            k += e->ranks[i].keys;
    return k;
}

/* The deployment of "scheme://host/ns/NAME...", or NULL. */
static char *url_deployment(const char *loc)
{
    const char *p = strstr(loc, "://");
    p = p ? strchr(p + 3, '/') : NULL;
    if (!p || strncmp(p, "/ns/", 4))
        return NULL;
    size_t n = strcspn(p + 4, "/?#");
    return n ? strndup(p + 4, n) : NULL;
}

/* 1 when dir holds a log or a snapshot of kvpage's (wal-*, snap-*). */
static int holds_state(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        found = !strncmp(e->d_name, "wal-", 4) || !strncmp(e->d_name, "snap-", 5);
    if (d)
        closedir(d);
    return found;
}

/* The location to open (malloc'd), or NULL after printing why (*rc): the
 * library's rules (kvp_meta_location_canonical, as the store and
 * kvp_meta_open_at follow them): a URL as it is, a plain path or file:DIR
 * the directory, HOST:PORT refused with "did you mean http://HOST:PORT?".
 * A data directory is opened in this process: one that does not exist holds
 * nothing, and opening it would create it, so it is refused. */
static char *clear_location(const struct kvp__store_flags *f, int *rc)
{
    *rc = KVP_EXIT_USAGE;
    if (!f->meta && !f->file) {
        fprintf(stderr, "kvpage clear: --meta DIR|URL is required (the metadata to clear)\n");
        return NULL;
    }
    size_t n = f->meta ? strlen(f->meta) + 1 : strlen(f->file) + 11;
    char *given = malloc(n), canon[PATH_MAX + 16];
    if (!given) {
        fprintf(stderr, "kvpage clear: out of memory\n");
        *rc = KVP_EXIT_FAILED;
        return NULL;
    }
    snprintf(given, n, "%s%s%s", f->meta ? "" : "file:", f->meta ? f->meta : f->file,
             f->meta ? "" : ".meta");
    struct kvp_error err = {0};
    int crc = kvp_meta_location_canonical(given, canon, sizeof canon, &err);
    if (crc) {
        fprintf(stderr, "kvpage clear: --meta %s: %s\n", f->meta ? f->meta : given, err.msg);
        *rc = crc == -EINVAL || crc == -ERANGE ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
        free(given);
        return NULL;
    }
    /* The canonical form of a directory is "file:" and its absolute path. */
    if (strncmp(canon, "file:", 5)) /* a URL (its password kept) or mem: */
        return given;
    free(given);
    const char *dir = canon + 5;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvpage clear: %s is not a data directory: nothing to clear\n", dir);
        return NULL;
    }
    if (!holds_state(dir)) { /* opening it would write a state into it */
        fprintf(stderr,
                "kvpage clear: %s holds no kvpage state (no log, no snapshot): nothing to clear\n",
                dir);
        return NULL;
    }
    return strdup(canon);
}

/* What the flags select, one line per namespace, to stdout or stderr. */
static void describe(FILE *out, const struct clear_list *l, const struct clear_args *a,
                     const char *dep, const char *pool, const char *loc)
{
    const char *verb = a->drop ? "drop" : "clear";
    for (size_t i = 0; i < l->n; i++) {
        const struct clear_ns *e = &l->v[i];
        if (!a->all && (strcmp(e->dep, dep) || strcmp(e->pool, pool)))
            continue;
        if (a->has_rank)
            fprintf(out, "  %s rank %u of %s/%s at %s (%llu keys)\n", verb, a->rank, e->dep,
                    e->pool, loc, (unsigned long long)ns_keys(e, 1, a->rank));
        else
            fprintf(out, "  %s namespace %s/%s at %s (%zu ranks, %llu keys)\n", verb, e->dep,
                    e->pool, loc, e->nranks, (unsigned long long)ns_keys(e, 0, 0));
    }
}

/* Clears (or drops) one namespace, or one rank of it. Prints the outcome;
 * returns an exit status. */
static int clear_one(struct kvp_meta *m, const char *dep, const char *pool,
                     const struct clear_args *a, const char *loc)
{
    struct kvp_error err = {0};
    struct kvp_ns *ns = NULL;
    int rc;
    if (a->drop) {
        rc = kvp_meta_drop(m, dep, strlen(dep), pool, strlen(pool), &err);
    } else if ((rc = kvp_meta_ns(m, dep, strlen(dep), pool, strlen(pool), 0, &ns, &err)) == 0) {
        memset(&err, 0, sizeof err);
        rc = kvp_meta_clear(ns, a->has_rank ? (int64_t)a->rank : -1, &err);
    }
    if (rc == -ENOENT) {
        if (ns && a->has_rank)
            fprintf(stderr, "kvpage clear: rank %u of %s/%s at %s is not initialized\n", a->rank,
                    dep, pool, loc);
        else
            fprintf(stderr, "kvpage clear: no namespace %s/%s at %s\n", dep, pool, loc);
        return KVP_EXIT_MISSING;
    }
    if (rc) {
        fprintf(stderr, "kvpage clear: cannot %s %s/%s at %s: %s\n", a->drop ? "drop" : "clear",
                dep, pool, loc, err.msg[0] ? err.msg : kvp_strerror(rc));
        return rc == -EINVAL || rc == -EOPNOTSUPP ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    if (a->drop)
        printf("dropped namespace %s/%s at %s\n", dep, pool, loc);
    else if (a->has_rank)
        printf("cleared rank %u of %s/%s at %s\n", a->rank, dep, pool, loc);
    else
        printf("cleared namespace %s/%s at %s\n", dep, pool, loc);
    return KVP_EXIT_OK;
}

static int clear_run(struct kvp_meta *m, const struct clear_args *a, const char *dep,
                     const char *pool, const char *loc)
{
    struct clear_list l = {0};
    int src = kvp_meta_stats(m, collect, &l);
    int rc = KVP_EXIT_OK;
    if (src && (a->all || !a->yes)) { /* --all needs the list; a refusal says what it holds */
        fprintf(stderr, "kvpage clear: cannot list the namespaces at %s: %s\n", loc,
                kvp_strerror(src));
        rc = KVP_EXIT_FAILED;
    } else if (!a->yes) {
        fprintf(stderr, "kvpage clear: nothing changed; this would:\n");
        describe(stderr, &l, a, dep, pool, loc);
        if (!a->all && !find_ns(&l, dep, pool))
            fprintf(stderr, "  (no namespace %s/%s is there now)\n", dep, pool);
        else if (a->all && !l.n)
            fprintf(stderr, "  (no namespace is there now)\n");
        fprintf(stderr, "add --yes to do it\n");
        rc = KVP_EXIT_USAGE;
    } else if (a->all) {
        for (size_t i = 0; i < l.n; i++) {
            int r = clear_one(m, l.v[i].dep, l.v[i].pool, a, loc);
            if (r > rc)
                rc = r;
        }
        if (!l.n)
            printf("no namespace at %s: nothing to clear\n", loc);
    } else {
        rc = clear_one(m, dep, pool, a, loc);
    }
    list_free(&l);
    return rc;
}

int kvp__cli_clear(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            clear_usage(stdout);
            return 0;
        }
    struct kvp__store_flags f;
    struct clear_args a = {0};
    char *pos[1];
    int npos = 0;
    char **posv = argc > 1 ? calloc((size_t)argc, sizeof *posv) : pos;
    int rc = posv ? kvp__store_flags_parse("clear", argc, argv, &f, posv, &npos, clear_extra, &a)
                  : KVP_EXIT_FAILED;
    if (posv != pos)
        free(posv);
    if (rc)
        return rc;
    const char *bad = npos                   ? "takes no arguments, only flags"
                      : a.has_rank && a.all  ? "--rank and --all: choose one"
                      : a.has_rank && a.drop ? "--drop removes a whole namespace: not with --rank"
                      : a.all && (f.deployment || f.pool) ? "--all takes no --deployment or --pool"
                      : f.page_size || f.file_size        ? "takes no page or file size"
                                                          : NULL;
    if (bad) {
        fprintf(stderr, "kvpage clear: %s (kvpage clear --help)\n", bad);
        return KVP_EXIT_USAGE;
    }
    char *loc = clear_location(&f, &rc);
    if (!loc)
        return rc;
    char *urldep = url_deployment(loc);
    const char *dep = f.deployment ? f.deployment : urldep ? urldep : "default";
    const char *pool = f.pool ? f.pool : "kv";
    if (!kvp_deployment_valid(dep, strlen(dep)) || !kvp_pool_valid(pool, strlen(pool))) {
        fprintf(stderr, "kvpage clear: invalid namespace %s/%s\n", dep, pool);
        rc = KVP_EXIT_USAGE;
    } else {
        struct kvp_meta_opts mo;
        kvp_meta_opts_init(&mo);
        if (f.timeout_ms)
            mo.timeout_ms = f.timeout_ms;
        mo.readonly = !a.yes; /* a refusal writes nothing, not even a snapshot */
        mo.token = getenv("KVPAGE_TOKEN");
        struct kvp_meta *m = NULL;
        struct kvp_error err = {0};
        int orc = kvp_meta_open_at(loc, &mo, &m, &err);
        if (orc) {
            fprintf(stderr, "kvpage clear: cannot open the metadata at %s: %s\n", loc,
                    err.msg[0] ? err.msg : kvp_strerror(orc));
            rc = orc == -EINVAL || orc == -EOPNOTSUPP ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
        } else {
            rc = clear_run(m, &a, dep, pool, loc);
            kvp_meta_close(m);
        }
    }
    free(urldep);
    free(loc);
    return rc;
}
