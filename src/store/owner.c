/*
 * owner.c — the one metadata owner of a page file: (location, deployment,
 * pool, rank), recorded in PATH.owner when a store (or kvp_store_claim)
 * first opens the file, compared by every later open. Two metadata stores
 * over one file would each hand out its pages for their own keys, and one
 * key would then read another's bytes.
 *
 * The record is text, never holds a secret (a URL's user and password are
 * dropped), and is written as a whole: a temporary file, fsync, link (which
 * refuses to replace a record another process wrote meanwhile; rename where
 * the file system has no hard links), fsync of the directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvpage/store.h"
#include "meta/location.h"
#include "store/owner.h"
#include "util/error.h"

#define OWNER_FORMAT "kvpage page-file owner 1"
#define OWNER_MAX 8192

/* ---------------------------------------------------------------- the record */

struct owner {
    char loc[OWNER_MAX], dep[256], pool[256];
    char id[40]; /* the metadata's identity; "" in a record of an older kvpage */
    unsigned long rank;
};

static int set_io(struct kvp_error *err, int code, const char *what, const char *file)
{
    kvp__set_err(err, code, KVP_RULE_IO, -1, 0, 0, "%s %s: %s", what, file, kvp_strerror(code));
    return code;
}

/* Reads file's record into *ow: 0, -ENOENT, -EUCLEAN (malformed), or -errno. */
static int owner_read(const char *file, struct owner *ow)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return -errno;
    char line[OWNER_MAX + 16];
    int rc = -EUCLEAN, have = 0;
    if (fgets(line, sizeof line, f) && !strcmp(line, OWNER_FORMAT "\n")) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            char *v = strchr(line, ' ');
            if (!v)
                continue;
            *v++ = '\0';
            if (!strcmp(line, "location") && strlen(v) < sizeof ow->loc)
                strcpy(ow->loc, v), have |= 1;
            else if (!strcmp(line, "deployment") && strlen(v) < sizeof ow->dep)
                strcpy(ow->dep, v), have |= 2;
            else if (!strcmp(line, "pool") && strlen(v) < sizeof ow->pool)
                strcpy(ow->pool, v), have |= 4;
            else if (!strcmp(line, "rank"))
                ow->rank = strtoul(v, NULL, 10), have |= 8;
            else if (!strcmp(line, "identity") && strlen(v) < sizeof ow->id)
                strcpy(ow->id, v); /* optional: older records have none */
        }
        if (have == 15)
            rc = 0;
    }
    fclose(f);
    return rc;
}

/* The error of a record owner_read found malformed (-EUCLEAN). */
static void malformed(struct kvp_error *err, const char *file)
{
    kvp__set_err(err, -EUCLEAN, KVP_RULE_IO, -1, 0, 0,
                 "%s is not a page file's owner record (first line \"" OWNER_FORMAT
                 "\"): remove it if it is one of an older kvpage",
                 file);
}

/* A location for a message: a data directory beside the page file (the
 * default PATH.meta) by its name, anything else as it is. */
static const char *shown(const char *loc, const char *dir, char *buf, size_t cap)
{
    size_t n = dir ? strlen(dir) : 0;
    if (n && !strncmp(loc, "file:", 5) && !strncmp(loc + 5, dir, n) && loc[5 + n] == '/' &&
        !strchr(loc + 6 + n, '/')) {
        snprintf(buf, cap, "%s beside the file", loc + 6 + n);
        return buf;
    }
    return loc;
}

static int refuse(const char *path, const struct owner *ow, const char *loc, const char *id,
                  const char *dep, const char *pool, uint32_t rank, struct kvp_error *err)
{
    char *abs = kvp__path_abs(path);
    char *slash = abs ? strrchr(abs, '/') : NULL;
    if (slash)
        *slash = '\0';
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char a[300], b[300], states[160] = "";
    if (ow->id[0] && id && strcmp(ow->id, id) && !strcmp(ow->loc, loc)) /* alike but not one */
        snprintf(states, sizeof states, "; another state: identity %.40s, the record's %.40s", id,
                 ow->id);
    kvp__set_err(err, -EEXIST, KVP_RULE_OWNER, -1, (int64_t)ow->rank, rank,
                 "the page file belongs to %s (%s/%s rank %lu), not %s (%s/%s rank %u%s): use "
                 "that metadata, or delete %s.owner if it is gone for good",
                 shown(ow->loc, slash ? abs : NULL, a, sizeof a), ow->dep, ow->pool, ow->rank,
                 shown(loc, slash ? abs : NULL, b, sizeof b), dep, pool, rank, states, base);
    free(abs);
    return -EEXIST;
}

/* The same names, and the same metadata: by identity when both have one,
 * else by location. */
static int same(const struct owner *ow, const char *loc, const char *id, const char *dep,
                const char *pool, uint32_t rank)
{
    int meta = ow->id[0] && id ? !strcmp(ow->id, id) : !strcmp(ow->loc, loc);
    return meta && !strcmp(ow->dep, dep) && !strcmp(ow->pool, pool) && ow->rank == rank;
}

int kvp__owner_check(const char *path, const char *loc, const char *id, int defer, const char *dep,
                     const char *pool, uint32_t rank, struct kvp_error *err)
{
    struct stat st;
    int found = stat(path, &st) == 0;
    if (!found && errno == ENOENT)
        return 1; /* no page file: no pages to protect, a record left is stale */
    if (found && !S_ISREG(st.st_mode))
        return 0; /* a block device: nothing may be written beside it in /dev */
    char *file = kvp__cat3(path, ".owner", "");
    if (!file) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    struct owner *ow = calloc(1, sizeof *ow);
    int rc = ow ? owner_read(file, ow) : -ENOMEM;
    if (rc == -ENOENT)
        rc = 1;
    else if (rc == -EUCLEAN)
        malformed(err, file);
    else if (rc < 0)
        set_io(err, rc, "cannot read", file);
    else if (defer && !id && ow->id[0] && !strcmp(ow->dep, dep) && !strcmp(ow->pool, pool) &&
             ow->rank == rank)
        rc = 2;
    else if (!same(ow, loc, id, dep, pool, rank))
        rc = refuse(path, ow, loc, id, dep, pool, rank, err);
    free(ow);
    free(file);
    return rc;
}

static int sync_dir_of(const char *file)
{
    char *d = strdup(file);
    if (!d)
        return -ENOMEM;
    char *slash = strrchr(d, '/');
    if (slash)
        slash == d ? (void)(d[1] = '\0') : (void)(*slash = '\0');
    int fd = open(slash ? d : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(d);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc == -EINVAL ? 0 : rc; /* some file systems cannot sync a directory */
}

int kvp__owner_write(const char *path, const char *loc, const char *id, const char *dep,
                     const char *pool, uint32_t rank, struct kvp_error *err)
{
    char *file = kvp__cat3(path, ".owner", "");
    char *tmp = file ? kvp__cat3(file, ".tmp.", "XXXXXX") : NULL;
    int rc = 0;
    if (!tmp) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
        rc = 1; /* a directory this process may only read: the file stays unrecorded */
        goto out;
    }
    if (fd < 0) {
        rc = set_io(err, -errno, "cannot create", tmp);
        goto out;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        rc = set_io(err, -errno, "cannot write", tmp);
        close(fd);
        unlink(tmp);
        goto out;
    }
    fchmod(fd, 0644);
    fprintf(f, OWNER_FORMAT "\nlocation %s\n", loc);
    if (id)
        fprintf(f, "identity %s\n", id);
    fprintf(f, "deployment %s\npool %s\nrank %u\n", dep, pool, rank);
    if (fflush(f) || fsync(fd)) {
        rc = set_io(err, -errno, "cannot write", tmp);
        fclose(f);
        unlink(tmp);
        goto out;
    }
    fclose(f);
    struct stat st;
    int stale = stat(path, &st) != 0 && errno == ENOENT; /* a record of no page file */
    if (!stale && link(tmp, file) == 0) {
        unlink(tmp);
    } else if (!stale && errno == EEXIST) {
        unlink(tmp);
        struct owner *ow = calloc(1, sizeof *ow);
        rc = !ow ? -ENOMEM : owner_read(file, ow);
        if (rc == 0 && !same(ow, loc, id, dep, pool, rank))
            rc = refuse(path, ow, loc, id, dep, pool, rank, err);
        else if (rc)
            set_io(err, rc, "cannot read", file);
        free(ow);
        goto out;
    } else if (rename(tmp, file) != 0) { /* replacing a stale record, or no hard links */
        rc = set_io(err, -errno, "cannot create", file);
        unlink(tmp);
        goto out;
    }
    if ((rc = sync_dir_of(file)) != 0)
        set_io(err, rc, "cannot sync the directory of", file);
out:
    free(tmp);
    free(file);
    return rc;
}

void kvp__owner_remove(const char *path)
{
    char *file = kvp__cat3(path, ".owner", "");
    if (file)
        unlink(file);
    free(file);
}

KVP_API int kvp_store_check_unowned(const char *path, const char *writer, struct kvp_error *err)
{
    if (!path || !*path || !writer) {
        kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0, "path or writer is NULL or empty");
        return -EINVAL;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0; /* nothing to protect, or a device: no record beside it */
    char *file = kvp__cat3(path, ".owner", "");
    struct owner *ow = file ? calloc(1, sizeof *ow) : NULL;
    int rc = ow ? owner_read(file, ow) : -ENOMEM;
    if (rc == 0) {
        char *abs = kvp__path_abs(path);
        char *slash = abs ? strrchr(abs, '/') : NULL;
        if (slash)
            *slash = '\0';
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        char a[300];
        kvp__set_err(err, -EEXIST, KVP_RULE_OWNER, -1, (int64_t)ow->rank, 0,
                     "the page file belongs to %s (%s/%s rank %lu), not %s (which writes over "
                     "its pages): give it a file of its own, or delete %s.owner if that "
                     "metadata is gone for good",
                     shown(ow->loc, slash ? abs : NULL, a, sizeof a), ow->dep, ow->pool, ow->rank,
                     writer, base);
        free(abs);
        rc = -EEXIST;
    } else if (rc == -ENOENT) {
        rc = 0;
    } else if (rc == -ENOMEM) {
        kvp__set_err(err, rc, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    } else if (rc == -EUCLEAN) { /* not ours to ignore: whose it is cannot be told */
        malformed(err, file);
    } else {
        set_io(err, rc, "cannot read", file);
    }
    free(ow);
    free(file);
    return rc;
}
