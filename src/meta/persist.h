/*
 * Durability hooks of the metadata store for kvpage serve and the tools.
 * Internal: not part of the public API.
 */
#ifndef KVP_META_PERSIST_H
#define KVP_META_PERSIST_H

#include <stdint.h>
#include "kvpage/meta.h"

/* End of the log records appended by the calling thread's last changes (0:
 * none). Reset it before handling a request, read it after. */
uint64_t kvp__meta_thread_lsn(void);
void kvp__meta_thread_lsn_reset(void);

/* Blocks until the log is durable up to lsn (per --fsync). 0, or the
 * negative errno the log failed with (-EIO, -ENOSPC, ...): the change is
 * applied in memory but must not be acknowledged. */
int kvp__meta_wait_durable(struct kvp_meta *m, uint64_t lsn);

/* 1: durable already. 0: cb(arg, status) will run on the log's flusher
 * thread once it is (status 0 or a negative errno). < 0: the log failed. */
int kvp__meta_when_durable(struct kvp_meta *m, uint64_t lsn, void (*cb)(void *arg, int status),
                           void *arg);

struct kvp__persist_stats {
    uint64_t wal_bytes, appended, fsyncs, fsync_ns;
    uint64_t snapshots, snapshot_failures, last_snapshot;
    int refused;          /* 0: writes are taken; else the negative errno refusing them */
    int failed;           /* refused because the log failed (not for lack of room) */
    uint64_t refusals;    /* changes refused since start */
};
/* -ENOENT without persistence. */
int kvp__meta_persist_stats(struct kvp_meta *m, struct kvp__persist_stats *st);

/*
 * 0 while changes are taken; else the negative errno refusing them (-ENOSPC
 * or -EDQUOT: no space for the log; another: the log cannot be written) and
 * why says so ("cannot write the log in DIR: <cause>"). 0 without persistence.
 */
int kvp__meta_log_status(struct kvp_meta *m, char *why, size_t len);
/* "cannot write the log in DIR: <strerror(rc)>" */
void kvp__meta_log_why(struct kvp_meta *m, int rc, char *buf, size_t len);

/* Writes a snapshot now (tests, tools). */
int kvp__meta_snapshot_now(struct kvp_meta *m);

/* Applies one log/snapshot record payload (recovery and the fuzz target).
 * -EUCLEAN with msg when it is malformed or contradicts the state. */
int kvp__persist_apply(struct kvp_meta *m, const uint8_t *payload, uint32_t len, char *msg,
                       size_t msglen, int *type);

#endif
