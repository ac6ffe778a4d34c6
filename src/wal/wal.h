/*
 * Write-ahead log mechanics: an append-only stream of checksummed records in
 * segment files, group commit, and reading it back. It knows nothing of what
 * the records mean (src/meta/local/persist.c does).
 *
 * On disk, in the data directory:
 *   LOCK                     flock()ed by the process that owns the directory
 *   wal-<LSN>.log            a segment; LSN (16 hex digits) = stream offset of its first byte
 *   snap-<LSN>.snap          a snapshot covering the stream up to LSN
 * A record is [u32 payload length][u64 xxh64 of the payload][payload], little-endian.
 * LSNs are byte offsets in the logical stream (record headers included), so a
 * record "ends at" LSN e and everything up to e is covered by a snapshot at e.
 */
#ifndef KVP_WAL_H
#define KVP_WAL_H

#include <stddef.h>
#include <stdint.h>

#define KVP_WAL_HDR 12u
#define KVP_WAL_MAX_RECORD (1u << 20)

/* fsync modes: KVP_FSYNC_NEVER, KVP_FSYNC_BATCH, KVP_FSYNC_ALWAYS from kvpage/meta.h */
#include "kvpage/meta.h"

/* Log sink: level 0 error, 1 warn, 2 info, 3 debug. */
typedef void (*kvp__log_fn)(void *arg, int level, const char *msg);

struct kvp__wal;

/* Encodes the 12-byte header of a record with this payload. */
void kvp__wal_frame(uint8_t hdr[KVP_WAL_HDR], const void *payload, uint32_t len);

/*
 * Takes the directory (creating it), locks it with flock. -EBUSY when another
 * process holds it. Nothing is written until kvp__wal_start. readonly 1: the
 * directory must exist, is not locked, and is never written (inspect, fsck);
 * readonly 2: the same, under a shared flock of an existing LOCK file
 * (-EBUSY while a writer holds it; a writer is -EBUSY meanwhile).
 */
int kvp__wal_open(const char *dir, int fsync_mode, kvp__log_fn log, void *log_arg, int readonly,
                  struct kvp__wal **out, char *msg, size_t msglen);

/*
 * Reads every record of the log after LSN `from`, in order, calling fn with
 * the payload, the file name and the offset of the record in it. Stops at the
 * first torn or corrupt record: that segment is truncated there (when
 * repair != 0) and any later segments are renamed *.dropped; one log line says
 * what was dropped. A non-zero return of fn stops the scan and is returned.
 * *end receives the LSN after the last good record.
 */
typedef int (*kvp__wal_rec_fn)(void *arg, const uint8_t *payload, uint32_t len, const char *file,
                               uint64_t offset);
int kvp__wal_replay(struct kvp__wal *w, uint64_t from, int repair, kvp__wal_rec_fn fn, void *arg,
                    uint64_t *end);

/* Starts appending at LSN `lsn` in a new segment and starts the flusher thread. */
int kvp__wal_start(struct kvp__wal *w, uint64_t lsn);

/*
 * Appends one record to the in-memory tail; it reaches the file in order.
 * Returns the LSN at its end (UINT64_MAX when the log has failed: a wait for
 * it fails). Never blocks on I/O.
 */
uint64_t kvp__wal_append(struct kvp__wal *w, const void *payload, uint32_t len);

/* Appends records already framed with kvp__wal_frame, in one piece, and
 * gives back `release` bytes of reservation (see kvp__wal_reserve). */
uint64_t kvp__wal_append_framed(struct kvp__wal *w, const uint8_t *framed, size_t len,
                                uint64_t release);

/* 1 when everything up to lsn is durable already, else 0. */
int kvp__wal_is_durable(struct kvp__wal *w, uint64_t lsn);

/*
 * Waits until everything up to lsn is durable as the fsync mode defines it
 * (never: written to the file, so it survives the process but not the
 * machine; batch, always: written and fsynced). Returns 0, or the negative
 * errno with which the log failed (-EIO, -ENOSPC, ...: the server must not
 * acknowledge). Once kvp__wal_resume ran, records before its LSN are durable
 * (a snapshot covers them) and a later wait for them returns 0.
 */
int kvp__wal_wait(struct kvp__wal *w, uint64_t lsn);

/*
 * Like kvp__wal_wait, but returns at once: 1 when lsn is durable already,
 * else 0 and cb(arg, status) runs on the flusher thread once it is (status 0
 * or the log's negative errno), or that negative errno when the log failed
 * already. For servers that park a connection instead of blocking a thread.
 */
int kvp__wal_when_durable(struct kvp__wal *w, uint64_t lsn, void (*cb)(void *arg, int status),
                          void *arg);

/*
 * Space. The zeros written ahead of the log's tail are its reserved space:
 * kvp__wal_reserve makes certain that keep + probe more bytes fit in them
 * (writing more zeros if need be) and holds keep of them for the caller's
 * records, which it appends before calling kvp__wal_release(keep). Call it
 * before changing anything: 0, or the negative errno that refuses the change
 * (-ENOSPC / -EDQUOT: no space, kept until a later reservation finds room;
 * another errno from writing the zeros; or the errno the log failed with).
 * Appends without a reservation still work; they may grow the file past its
 * zeros.
 */
int kvp__wal_reserve(struct kvp__wal *w, uint64_t keep, uint64_t probe);
void kvp__wal_release(struct kvp__wal *w, uint64_t bytes);
/*
 * 0 while writes are taken, else the negative errno that refuses them;
 * *failed (may be NULL) = 1 when that is a failure of the log itself (records
 * not written: only kvp__wal_resume ends it), 0 when it is a lack of room.
 * *refusals: reservations refused since start.
 */
int kvp__wal_status(struct kvp__wal *w, int *failed, uint64_t *refusals);
/* Writes refused for lack of room: tries to make room again (background). */
int kvp__wal_retry(struct kvp__wal *w);
/*
 * After a failure of the log: a snapshot at lsn (== everything appended) is
 * durable and covers every change. Starts a new segment at lsn and takes
 * writes again; 0, -EAGAIN (the log did not fail, or something was appended
 * after lsn), or the errno of starting the segment.
 */
int kvp__wal_resume(struct kvp__wal *w, uint64_t lsn);

/* LSN at the end of the last appended record. */
uint64_t kvp__wal_appended(struct kvp__wal *w);
/* Bytes in segments now on disk (for inspect and metrics). */
uint64_t kvp__wal_disk_bytes(struct kvp__wal *w);
/* Summed fsync count and time in ns (metrics). */
void kvp__wal_fsync_stats(struct kvp__wal *w, uint64_t *count, uint64_t *total_ns);

/* The directory path. */
const char *kvp__wal_dir(struct kvp__wal *w);

/*
 * Snapshot files. kvp__wal_snap_create opens "snap-<lsn>.tmp" for writing;
 * kvp__wal_snap_commit fsyncs it, renames it to snap-<lsn>.snap, fsyncs the
 * directory. Both are async-signal-safe enough for a forked child (no locks).
 */
int kvp__wal_snap_create(const char *dir, uint64_t lsn);
int kvp__wal_snap_commit(const char *dir, uint64_t lsn, int fd);
/* Closes fd (when >= 0) and removes the unfinished snap-<lsn>.tmp. */
void kvp__wal_snap_abort(const char *dir, uint64_t lsn, int fd);

/*
 * Reads snap-<lsn>.snap, calling fn for each record in order (file and offset
 * as in kvp__wal_replay). -EUCLEAN when a record is torn or corrupt (after
 * calling fn for the good ones before it).
 */
int kvp__wal_snap_read(struct kvp__wal *w, uint64_t lsn, kvp__wal_rec_fn fn, void *arg);

/* The size of snap-<lsn>.snap in bytes: 0, or a negative errno. */
int kvp__wal_snap_size(struct kvp__wal *w, uint64_t lsn, uint64_t *size);

/*
 * Lists snapshot LSNs, newest first, into lsns (up to max); returns the count.
 */
int kvp__wal_snap_list(struct kvp__wal *w, uint64_t *lsns, int max);

/*
 * Writes and syncs everything appended so far (which must end at lsn, with
 * appends held off by the caller) and starts a new segment at lsn, so that a
 * snapshot at lsn can later remove every older segment whole.
 */
int kvp__wal_rotate(struct kvp__wal *w, uint64_t lsn);
/*
 * The same in two steps, so that the caller's locks are not held over the
 * I/O: kvp__wal_rotate_at (appends held off, lsn == everything appended)
 * only marks the position, and appends may go on after it; the next flush
 * ends the current segment there and starts the new one, and
 * kvp__wal_rotate_finish does that flush if none has yet. finish returns 0
 * once the segment at lsn has started, or the negative errno that kept it
 * from starting (the log then goes on in the current segment). One rotation
 * at a time.
 */
int kvp__wal_rotate_at(struct kvp__wal *w, uint64_t lsn);
int kvp__wal_rotate_finish(struct kvp__wal *w);

/*
 * After the snapshot at lsn is durable and verified: removes older snapshots
 * and the segments before lsn.
 */
void kvp__wal_prune(struct kvp__wal *w, uint64_t lsn);

/* Flushes (and fsyncs unless never), stops the flusher, unlocks. NULL ok. */
void kvp__wal_close(struct kvp__wal *w);

#endif
