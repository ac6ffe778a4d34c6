/*
 * location.c — a metadata location without a scheme (kvpage/store.h): a
 * directory, unless it is a server's HOST:PORT that a person meant as a URL
 * (src/store/location.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store/location.h"
#include "util/error.h"

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
