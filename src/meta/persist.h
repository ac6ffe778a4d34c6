/*
 * The log of the in-process engine, for recovery and the fuzz target.
 * Internal: not part of the public API (callers use kvp_meta_wait,
 * kvp_meta_values, kvp_meta_health and kvp_meta_snapshot).
 */
#ifndef KVP_META_PERSIST_H
#define KVP_META_PERSIST_H

#include <stddef.h>
#include <stdint.h>
#include "meta/meta_int.h"

/* "cannot write the log in DIR: <strerror(rc)>" */
void kvp__meta_log_why(struct kvp__local *m, int rc, char *buf, size_t len);

/* Applies one log/snapshot record payload (recovery and the fuzz target).
 * -EUCLEAN with msg when it is malformed or contradicts the state. */
int kvp__persist_apply(struct kvp__local *m, const uint8_t *payload, uint32_t len, char *msg,
                       size_t msglen, int *type);

#endif
