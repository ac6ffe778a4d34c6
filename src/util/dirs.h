/* A page file's directory: made when asked, unmade when the open that made
 * it fails. Internal. */
#ifndef KVP_UTIL_DIRS_H
#define KVP_UTIL_DIRS_H

#include <stddef.h>
#include "kvpage/error.h"

/* The directory of path (malloc'd, NULL when out of memory): "." for a bare
 * name, "/" for "/name". */
char *kvp__dirname(const char *path);

/* mkdir -p (0755) of path's directory. *made: the length of the first
 * directory it created (0: none), for kvp__rmparents, also when it fails.
 * Returns 0 or -errno (err: KVP_RULE_IO naming the directory). */
int kvp__mkparents(const char *path, size_t *made, struct kvp_error *err);

/* Removes the directories kvp__mkparents created, deepest first, while they
 * are empty. */
void kvp__rmparents(const char *path, size_t made);

/* Removes a flat directory this process created: its files, then itself
 * (a data directory a failed open or a refused start made). */
void kvp__remove_data_dir(const char *dir);

#endif
