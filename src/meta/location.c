/*
 * location.c — what a metadata location means, in one place for every
 * caller (src/meta/location.h): the store, kvp_meta_open_at, the server and,
 * through kvp_meta_location_canonical, Python. A location without a scheme
 * is a directory, unless it is a server's HOST:PORT that a person meant as a
 * URL; the canonical form is what a page file's owner record compares.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvpage/meta.h"
#include "meta/location.h"
#include "util/error.h"

char *kvp__cat3(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

char *kvp__path_abs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return NULL;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        p[--n] = '\0';
    char *r = realpath(p, NULL);
    if (r) {
        free(p);
        return r;
    }
    /* Missing: its directory resolved, its own name as given. */
    char *slash = strrchr(p, '/');
    const char *base = slash ? slash + 1 : p;
    char *dir = slash ? (slash == p ? strdup("/") : strndup(p, (size_t)(slash - p))) : strdup(".");
    char *rd = dir ? realpath(dir, NULL) : NULL;
    free(dir);
    if (rd) {
        r = kvp__cat3(rd, strcmp(rd, "/") ? "/" : "", base);
        free(rd);
        free(p);
        return r;
    }
    if (p[0] == '/')
        return p;
    char cwd[PATH_MAX];
    r = getcwd(cwd, sizeof cwd) ? kvp__cat3(cwd, "/", p) : NULL;
    free(p);
    return r;
}

/* A query parameter that may carry a secret: never recorded. */
static int secret_param(const char *q, size_t n)
{
    static const char *const names[] = {"password", "pass", "user", "username", "token", "auth"};
    size_t k = strcspn(q, "=");
    if (k > n)
        k = n;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == k && !strncasecmp(q, names[i], k))
            return 1;
    return 0;
}

static char *url_canon(const char *loc, const char *sep)
{
    size_t len = strlen(loc);
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (const char *p = loc; p < sep; p++)
        out[o++] = (char)tolower((unsigned char)*p);
    memcpy(out + o, "://", 3), o += 3;
    const char *auth = sep + 3;
    size_t alen = strcspn(auth, "/?#");
    const char *host = auth;
    for (const char *p = auth; p < auth + alen; p++)
        if (*p == '@')
            host = p + 1; /* user and password dropped */
    for (const char *p = host; p < auth + alen; p++)
        out[o++] = (char)tolower((unsigned char)*p);
    const char *path = auth + alen;
    size_t plen = strcspn(path, "?#");
    while (plen && path[plen - 1] == '/')
        plen--;
    memcpy(out + o, path, plen), o += plen;
    const char *q = path + strcspn(path, "?#");
    if (*q == '?') {
        q++;
        size_t qlen = strcspn(q, "#");
        int first = 1;
        while (qlen) {
            size_t k = strcspn(q, "&#");
            if (k > qlen)
                k = qlen;
            if (k && !secret_param(q, k)) {
                out[o++] = first ? '?' : '&';
                memcpy(out + o, q, k), o += k;
                first = 0;
            }
            q += k, qlen -= k;
            if (qlen && *q == '&')
                q++, qlen--;
        }
    }
    out[o] = '\0';
    return out;
}

char *kvp__file_location(const char *dir)
{
    char *abs = kvp__path_abs(dir);
    char *r = abs ? kvp__cat3("file:", abs, "") : NULL;
    free(abs);
    return r;
}

char *kvp__location_canon(const char *loc)
{
    if (!loc || !*loc || !strncmp(loc, "mem:", 4))
        return strdup("mem:");
    const char *dir = NULL;
    if (loc[0] == '/' || loc[0] == '.')
        dir = loc;
    else if (!strncmp(loc, "file://", 7))
        dir = loc + 7;
    else if (!strncmp(loc, "file:", 5))
        dir = loc + 5;
    if (dir)
        return kvp__file_location(*dir ? dir : ".");
    const char *sep = strstr(loc, "://");
    return sep ? url_canon(loc, sep) : strdup(loc);
}

int kvp__looks_hostport(const char *loc)
{
    const char *colon = loc ? strrchr(loc, ':') : NULL;
    if (!colon || colon == loc)
        return 0;
    const char *port = colon + 1;
    size_t pn = strlen(port);
    if (pn == 0 || pn > 5 || strspn(port, "0123456789") != pn)
        return 0;
    long p = strtol(port, NULL, 10);
    if (p < 1 || p > 65535)
        return 0;
    size_t hn = (size_t)(colon - loc);
    if (loc[0] == '[')
        return hn > 2 && loc[hn - 1] == ']' &&
               strspn(loc + 1, "0123456789abcdefABCDEF:.") == hn - 2;
    return strspn(loc, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == hn;
}

int kvp__hostport_refusal(const char *loc, struct kvp_error *err)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                 "metadata location '%.128s' looks like HOST:PORT, not a directory: did you mean "
                 "http://%.128s? (a kvpage serve; redis://%.128s for Redis, file:%.128s for a "
                 "directory of that name)",
                 loc, loc, loc, loc);
    return -EINVAL;
}

int kvp__store_location(const char *meta, char **out, struct kvp_error *err)
{
    *out = NULL;
    if (!meta)
        return 0;
    struct stat st;
    int url =
        !*meta || strstr(meta, "://") || !strncmp(meta, "mem:", 4) || !strncmp(meta, "file:", 5);
    if (!url && kvp__looks_hostport(meta) && !(stat(meta, &st) == 0 && S_ISDIR(st.st_mode)))
        return kvp__hostport_refusal(meta, err);
    size_t n = strlen(meta) + 6;
    if ((*out = malloc(n)))
        snprintf(*out, n, "%s%s", url || meta[0] == '/' || meta[0] == '.' ? "" : "file:", meta);
    if (*out)
        return 0;
    kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    return -ENOMEM;
}

char *kvp__location_deployment(const char *loc)
{
    const char *p = strstr(loc, "://");
    if (!p)
        return NULL;
    p = strchr(p + 3, '/');
    if (!p || strncmp(p, "/ns/", 4))
        return NULL;
    p += 4;
    size_t n = strcspn(p, "/?#");
    return n ? strndup(p, n) : NULL;
}

KVP_API int kvp_meta_location_canonical(const char *in, char *out, size_t len,
                                        struct kvp_error *err)
{
    char *where = NULL;
    int rc = kvp__store_location(in ? in : "", &where, err);
    if (rc)
        return rc;
    char *canon = kvp__location_canon(where);
    free(where);
    if (!canon) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    size_t n = strlen(canon);
    if (!out || n >= len) {
        kvp__set_err(err, -ERANGE, KVP_RULE_ARG, -1, (int64_t)n + 1, (int64_t)len,
                     "the canonical location takes %zu bytes, the buffer has %zu", n + 1, len);
        free(canon);
        return -ERANGE;
    }
    memcpy(out, canon, n + 1);
    free(canon);
    return 0;
}
