/*
 * location.h — what a metadata location means, in one place (location.c):
 * the rule for a location without a scheme that the store (and so the
 * command line and Python's Store) and kvp_meta_open_at follow, and the
 * canonical form a page file's owner record compares
 * (kvp_meta_location_canonical exports it).
 */
#ifndef KVPAGE_META_LOCATION_H
#define KVPAGE_META_LOCATION_H

#include "kvpage/error.h"

/* 1 when loc is HOST:PORT (a host name, IPv4 address or [IPv6] address, a
 * colon, a port 1..65535) and nothing else: what a server's address looks
 * like, never a directory anyone means to create. */
int kvp__looks_hostport(const char *loc);

/* Sets err (-EINVAL, KVP_RULE_ARG) to the refusal of a HOST:PORT location
 * that is not a directory: "did you mean http://HOST:PORT?". Returns -EINVAL. */
int kvp__hostport_refusal(const char *loc, struct kvp_error *err);

/*
 * The location a store opens for meta (malloc'd into *out; NULL meta: NULL,
 * the default PATH.meta): a URL or "mem:"/"file:..." as it is (file: is
 * always a directory); a plain path is the directory file:PATH, unless it
 * looks like HOST:PORT and no directory of that name exists, which is
 * refused (-EINVAL, err says "did you mean http://HOST:PORT?"): creating
 * ./127.0.0.1:18000/ and answering from it would look like success.
 * Returns 0, -EINVAL or -ENOMEM (err set).
 */
int kvp__store_location(const char *meta, char **out, struct kvp_error *err);

/*
 * The canonical form of a metadata location (malloc'd; NULL when out of
 * memory): "mem:"; "file:" and an absolute path (a plain path or file:DIR,
 * relative to the working directory); a URL with its scheme and host in
 * lower case, without user or password, without a trailing slash, with its
 * query (redis's ?prefix=) but no fragment. NULL or "" is "mem:".
 */
char *kvp__location_canon(const char *loc);

/* "file:" and the absolute form of the directory dir (malloc'd, or NULL). */
char *kvp__file_location(const char *dir);

/* The absolute form of path (its directory resolved when it exists);
 * malloc'd, NULL when out of memory. */
char *kvp__path_abs(const char *path);

/* The NAME of a location "http://HOST:PORT/ns/NAME[/...]" (malloc'd), or
 * NULL. */
char *kvp__location_deployment(const char *loc);

/* a, b and c joined (malloc'd; NULL when out of memory). */
char *kvp__cat3(const char *a, const char *b, const char *c);

#endif
