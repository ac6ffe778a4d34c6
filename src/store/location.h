/*
 * location.h — what a metadata location a person typed means: the one rule
 * the store (and so the command line and Python's Store) and
 * kvp_meta_open_at follow for a location without a scheme.
 */
#ifndef KVPAGE_STORE_LOCATION_H
#define KVPAGE_STORE_LOCATION_H

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

#endif
