/* A page file's directory (util/dirs.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/dirs.h"
#include "util/error.h"

char *kvp__dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    return slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
}

int kvp__mkparents(const char *path, size_t *made, struct kvp_error *err)
{
    *made = 0;
    char *dir = kvp__dirname(path);
    if (!dir) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_IO, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = 0;
    for (char *p = dir + 1; rc == 0 && dir[0]; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(dir, 0755) == 0) {
            if (!*made)
                *made = strlen(dir);
        } else if (errno != EEXIST) {
            rc = -errno;
            kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "cannot create directory %s: %s", dir,
                         strerror(errno));
        }
        *p = c;
        if (c == '\0')
            break;
    }
    free(dir);
    return rc;
}

void kvp__rmparents(const char *path, size_t made)
{
    char *dir = made ? kvp__dirname(path) : NULL;
    if (!dir)
        return;
    for (size_t n = strlen(dir); n >= made;) {
        dir[n] = '\0';
        if (rmdir(dir) != 0)
            break;
        char *slash = strrchr(dir, '/');
        if (!slash)
            break;
        n = (size_t)(slash - dir);
    }
    free(dir);
}
