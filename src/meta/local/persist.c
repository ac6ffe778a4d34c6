/*
 * Persistence of the metadata (protocol.md §6): what the log records mean,
 * snapshots, and recovery. The log mechanics are in src/wal.
 *
 * Logged: namespace creation, rank init/resize, HOLD (a confirmed key takes a
 * page), LINEAGE (after a HOLD: the parent key and tokens its confirmation
 * named), FREE (a key loses a page: delete or eviction), CLEAR, DROP (the
 * namespace and its ranks go; a later INIT brings it back). Reservations
 * are not logged: after a restart they are gone and their writers'
 * confirmations are still accepted while the page is free.
 *
 * Each change is appended to the log under the namespace lock before it is
 * applied, so the log order is the order of the changes. Each operation
 * hands its caller a ticket, the log position at which it is durable
 * (kvp__jrnl_commit); kvp_meta_wait and kvp_meta_when_durable redeem it.
 *
 * Snapshots: every namespace lock is taken, the log is rotated at the
 * snapshot's LSN (THREAD and MANUAL only mark the position and finish the
 * rotation once the locks are released), and the state at that LSN is
 * captured, in one of three ways (opts.snapshot_mode):
 *   KVP_SNAPSHOT_FORK    a forked child writes it from its copy-on-write
 *                        image: requests stop only for the fork, but every
 *                        page the process writes while the child lives is
 *                        copied, and the fork copies the page tables of all
 *                        of the process's memory.
 *   KVP_SNAPSHOT_THREAD  the snapshot thread copies the page arrays' owners
 *                        and links (16 bytes a page; see local_persist.c),
 *                        releases the locks, and writes from the copy.
 *   KVP_SNAPSHOT_MANUAL  the same, by the thread that calls
 *                        kvp_meta_snapshot; never by itself.
 * Recovery cannot tell them apart: all three write the same bytes for the
 * same state. The snapshot keeps each rank's LRU order (HOLD records from
 * least to most recent), so recency survives a restart; touches are not
 * logged, so after a crash the recency of the time since the last snapshot
 * is approximated by write order. A clean close writes a final snapshot.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "meta/local/meta_int.h"
#include "meta/local/persist.h"
#include "util/clock.h"
#include "wal/wal.h"

enum {
    REC_NS = 1,
    REC_INIT = 2,
    REC_HOLD = 3,
    REC_FREE = 4,
    REC_CLEAR = 5,
    REC_SNAP_BEGIN = 6,
    REC_SNAP_END = 7,
    REC_HOLD_HEX = 8,  /* HOLD of a lowercase hex key, stored as its bytes */
    REC_KEYS_HINT = 9, /* snapshot: how many keys the namespace has (sizes its index once) */
    REC_DROP = 10,     /* kvp_meta_drop: as CLEAR's fields (namespace, every rank) */
    /* A key's lineage, after a HOLD of it (in the log and in a snapshot):
     * namespace, rank, key length (2) and key, parent length (2, 0: none)
     * and parent, token count (4) and tokens (4 each). A state written
     * before it existed has none and loads as it did; a binary older than it
     * does not read a state that has one. */
    REC_LINEAGE = 11,
};
#define MAX_KEYS_HINT (1ull << 28)
#define SNAP_VERSION 1
#define ALL_RANKS 0xffffffffu

struct kvp__persist {
    struct kvp__wal *wal;
    const struct kvp__persist_ops *ops; /* the engine's state (persist.h) */
    struct kvp__local *m;               /* its options (opts) */
    int replaying;                      /* recovery is applying records: log nothing */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t snap_mu; /* one snapshot at a time (the thread, kvp_meta_snapshot) */
    int stop;
    /* KVP_SNAPSHOT_THREAD: kvp_meta_snapshot asks the snapshot thread for one
     * (asked), and waits until one that began after it is done (served, with
     * its result); guarded by mu. */
    uint64_t asked, served;
    int served_rc;
    pthread_cond_t served_cv;
    /* Guarded by mu: written by whichever thread took the snapshot (the
     * snapshot thread, or one calling kvp_meta_snapshot), read by the
     * snapshot thread and by kvp__meta_persist_stats. */
    uint64_t last_snap;      /* LSN of the newest snapshot on disk */
    uint64_t last_snap_size; /* its size: the log may grow to this before the next */
    uint64_t snapshots, snapshot_failures;
    uint64_t last_snap_unix; /* wall-clock second the last snapshot was adopted; 0: none yet */
};

static void plog(const struct kvp__local *m, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void plog(const struct kvp__local *m, int level, const char *fmt, ...)
{
    if (!m->opts.log)
        return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    m->opts.log(m->opts.log_arg, level, msg);
}

/* ---------------------------------------------------------------- encoding */

/* Declared without an initializer and started with e.n = 0: "= {0}" would
 * clear all 1.3 KB of b for every record (64 KB of memset per confirm). */
struct enc {
    uint8_t b[32 + KVP_MAX_KEY_LEN + 2 * KVP_MAX_NAME_LEN];
    uint32_t n;
};
static void e8(struct enc *e, uint8_t v)
{
    e->b[e->n++] = v;
}
static void e16(struct enc *e, uint16_t v)
{
    e8(e, (uint8_t)v);
    e8(e, (uint8_t)(v >> 8));
}
static void e32(struct enc *e, uint32_t v)
{
    e16(e, (uint16_t)v);
    e16(e, (uint16_t)(v >> 16));
}
static void e64(struct enc *e, uint64_t v)
{
    e32(e, (uint32_t)v);
    e32(e, (uint32_t)(v >> 32));
}
static void ebytes(struct enc *e, const void *p, size_t n)
{
    memcpy(e->b + e->n, p, n);
    e->n += (uint32_t)n;
}

static void enc_ns(struct enc *e, uint32_t id, const char *dep, const char *pool)
{
    size_t dl = strlen(dep), pl = strlen(pool);
    e8(e, REC_NS);
    e32(e, id);
    e8(e, (uint8_t)dl);
    ebytes(e, dep, dl);
    e8(e, (uint8_t)pl);
    ebytes(e, pool, pl);
}
static void enc_init(struct enc *e, uint32_t ns, uint32_t rank, uint32_t num_pages)
{
    e8(e, REC_INIT);
    e32(e, ns);
    e32(e, rank);
    e32(e, num_pages);
}
/* One more than the value of each lowercase hex digit; 0 for every other byte. */
static const uint8_t HEX1[256] = {
    ['0'] = 1, ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

/* Packs the n lowercase hex digits at k into n/2 bytes at out; 0 when n is
 * odd or one of them is not such a digit (out then holds garbage). */
static int pack_hex(uint8_t *out, const char *k, size_t n)
{
    uint8_t bad = (uint8_t)(n % 2);
    for (size_t i = 0; i + 1 < n; i += 2) {
        /* a non-digit becomes 0xff: its high bits mark the key as not hex */
        uint8_t hi = (uint8_t)(HEX1[(unsigned char)k[i]] - 1);
        uint8_t lo = (uint8_t)(HEX1[(unsigned char)k[i + 1]] - 1);
        bad |= (hi | lo) & 0xf0;
        out[i / 2] = (uint8_t)(hi << 4 | (lo & 0x0f));
    }
    return !bad;
}

/* The engines' keys are md5 or sha256 in lowercase hex: storing their bytes
 * halves the log and the snapshot. */
static void enc_hold(struct enc *e, uint32_t ns, uint32_t rank, uint32_t page, const char *kb,
                     uint16_t klen)
{
    uint32_t start = e->n;
    e8(e, REC_HOLD_HEX);
    e32(e, ns);
    e32(e, rank);
    e32(e, page);
    e16(e, (uint16_t)(klen / 2));
    if (pack_hex(e->b + e->n, kb, klen)) {
        e->n += klen / 2;
        return;
    }
    e->b[start] = REC_HOLD;
    e->n -= 2;
    e16(e, klen);
    ebytes(e, kb, klen);
}

/* Encodes a LINEAGE record into b (room for KVP_JRNL_LIN - KVP_WAL_HDR
 * bytes); returns its length. */
static uint32_t enc_lin(uint8_t *b, uint32_t ns, uint32_t rank, const char *key, uint16_t klen,
                        const struct kvp__lin *l)
{
    uint8_t *p = b;
    *p++ = REC_LINEAGE;
    for (int i = 0; i < 4; i++)
        *p++ = (uint8_t)(ns >> (8 * i));
    for (int i = 0; i < 4; i++)
        *p++ = (uint8_t)(rank >> (8 * i));
    *p++ = (uint8_t)klen;
    *p++ = (uint8_t)(klen >> 8);
    memcpy(p, key, klen);
    p += klen;
    *p++ = (uint8_t)l->plen;
    *p++ = (uint8_t)(l->plen >> 8);
    memcpy(p, kvp__lin_parent(l), l->plen);
    p += l->plen;
    for (int i = 0; i < 4; i++)
        *p++ = (uint8_t)(l->ntokens >> (8 * i));
    for (uint32_t t = 0; t < l->ntokens; t++)
        for (int i = 0; i < 4; i++)
            *p++ = (uint8_t)(l->tok[t] >> (8 * i));
    return (uint32_t)(p - b);
}

/* The log the journal appends to, or NULL: none, or recovery is applying
 * records (they are in the log already). */
static struct kvp__wal *log_of(const struct kvp__persist *p)
{
    return p && !p->replaying ? p->wal : NULL;
}

static struct kvp__wal *jwal(const struct kvp__jrnl *j)
{
    return log_of(*j->persist);
}

void kvp__jrnl_start(struct kvp__jrnl *j, struct kvp__persist *const *persist, uint32_t id)
{
    *j = (struct kvp__jrnl){.persist = persist, .ns = id};
}

uint64_t kvp__jrnl_ns(struct kvp__jrnl *j, const char *deployment, const char *pool)
{
    struct kvp__wal *w = jwal(j);
    if (!w)
        return 0;
    struct enc e;
    e.n = 0;
    enc_ns(&e, j->ns, deployment, pool);
    return kvp__wal_append(w, e.b, e.n);
}

/*
 * Records of an operation are framed into the namespace's staging buffer
 * (the caller holds the namespace lock) and reach the log in one append at
 * kvp__jrnl_commit: one lock of the log and one wake-up of its flusher per
 * request instead of one per key.
 */
static void stage(struct kvp__jrnl *j, struct kvp__wal *w, const struct enc *e)
{
    size_t need = j->len + KVP_WAL_HDR + e->n;
    if (need > j->cap) {
        size_t cap = j->cap ? j->cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *b = realloc(j->buf, cap);
        if (!b) {
            /* Send what is staged, then this record alone: order is kept. */
            uint64_t x = kvp__jrnl_commit(j);
            uint64_t y = kvp__wal_append(w, e->b, e->n);
            j->lsn = x > y ? x : y;
            return;
        }
        j->buf = b;
        j->cap = cap;
    }
    kvp__wal_frame(j->buf + j->len, e->b, e->n);
    memcpy(j->buf + j->len + KVP_WAL_HDR, e->b, e->n);
    j->len += KVP_WAL_HDR + e->n;
}

/* A LINEAGE record is too big for struct enc (up to 256 KiB of tokens): it
 * is encoded in place in the staging buffer. */
void kvp__jrnl_lin(struct kvp__jrnl *j, uint32_t rank, const char *key, uint16_t klen,
                   const struct kvp__lin *l)
{
    struct kvp__wal *w = jwal(j);
    if (!w)
        return;
    size_t need = j->len + KVP_JRNL_LIN(klen, l->plen, l->ntokens);
    if (need > j->cap) {
        size_t cap = j->cap ? j->cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *b = realloc(j->buf, cap);
        if (!b)
            return; /* out of memory: a restart will not know this lineage */
        j->buf = b;
        j->cap = cap;
    }
    uint8_t *rec = j->buf + j->len + KVP_WAL_HDR;
    uint32_t n = enc_lin(rec, j->ns, rank, key, klen, l);
    kvp__wal_frame(j->buf + j->len, rec, n);
    j->len += KVP_WAL_HDR + n;
}

uint64_t kvp__jrnl_commit(struct kvp__jrnl *j)
{
    struct kvp__persist *p = *j->persist;
    if (j->len) {
        uint64_t lsn = kvp__wal_append_framed(p->wal, j->buf, j->len, j->res);
        if (lsn > j->lsn)
            j->lsn = lsn;
        j->res = 0;
        j->len = 0;
        if (j->cap > (1u << 20)) { /* one huge request does not pin its buffer */
            free(j->buf);
            j->buf = NULL;
            j->cap = 0;
        }
    }
    if (j->freed) { /* the operation's append holds the freeing records */
        j->free_lsn = j->lsn;
        j->freed = 0;
    }
    if (j->res) { /* appended: the room held for it is used or free again */
        kvp__wal_release(p->wal, j->res);
        j->res = 0;
    }
    uint64_t lsn = j->lsn;
    j->lsn = 0;
    return lsn;
}

void kvp__meta_log_why(struct kvp__local *m, int rc, char *buf, size_t len)
{
    snprintf(buf, len, "cannot write the log in %s: %s", m->opts.data_dir ? m->opts.data_dir : "",
             kvp_strerror(rc));
}

/* err (when non-NULL): the log refused or failed with rc (KVP_RULE_IO). */
static void log_err(struct kvp__local *m, int rc, struct kvp_error *err)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    err->code = rc;
    err->rule = KVP_RULE_IO;
    err->index = -1;
    kvp__meta_log_why(m, rc, err->msg, sizeof err->msg);
}

int kvp__jrnl_space(struct kvp__local *m, uint64_t keep, uint64_t probe, struct kvp_error *err)
{
    struct kvp__wal *w = log_of(m->persist);
    if (!w || m->opts.readonly)
        return 0;
    int rc = kvp__wal_reserve(w, keep, probe);
    if (rc)
        log_err(m, rc, err);
    return rc;
}

void kvp__jrnl_unspace(struct kvp__local *m, uint64_t bytes)
{
    struct kvp__wal *w = log_of(m->persist);
    if (w && !m->opts.readonly)
        kvp__wal_release(w, bytes);
}

int kvp__jrnl_reserve(struct kvp__jrnl *j, uint64_t keep, uint64_t probe, struct kvp_error *err)
{
    struct kvp__persist *p = *j->persist;
    int rc = p ? kvp__jrnl_space(p->m, keep, probe, err) : 0;
    if (!rc && jwal(j) && !p->m->opts.readonly)
        j->res += keep;
    return rc;
}

void kvp__jrnl_reuse(struct kvp__jrnl *j)
{
    struct kvp__wal *w = jwal(j);
    if (w && j->free_lsn > j->lsn && !kvp__wal_is_durable(w, j->free_lsn))
        j->lsn = j->free_lsn;
}

void kvp__jrnl_init(struct kvp__jrnl *j, uint32_t rank, uint32_t num_pages)
{
    struct kvp__wal *w = jwal(j);
    if (!w)
        return;
    struct enc e;
    e.n = 0;
    enc_init(&e, j->ns, rank, num_pages);
    stage(j, w, &e);
}

void kvp__jrnl_hold(struct kvp__jrnl *j, uint32_t rank, uint32_t page, const char *key,
                    uint16_t klen)
{
    struct kvp__wal *w = jwal(j);
    if (!w)
        return;
    struct enc e;
    e.n = 0;
    enc_hold(&e, j->ns, rank, page, key, klen);
    stage(j, w, &e);
}

/* A record of a namespace and every rank (ALL_RANKS) or one that frees pages. */
static void stage_freeing(struct kvp__jrnl *j, int type, uint32_t rank, const uint32_t *page)
{
    struct kvp__wal *w = jwal(j);
    if (!w)
        return;
    struct enc e;
    e.n = 0;
    e8(&e, (uint8_t)type);
    e32(&e, j->ns);
    e32(&e, rank);
    if (page)
        e32(&e, *page);
    stage(j, w, &e);
    j->freed = 1;
}

void kvp__jrnl_free(struct kvp__jrnl *j, uint32_t rank, uint32_t page)
{
    stage_freeing(j, REC_FREE, rank, &page);
}

void kvp__jrnl_clear(struct kvp__jrnl *j, int64_t rank)
{
    stage_freeing(j, REC_CLEAR, rank < 0 ? ALL_RANKS : (uint32_t)rank, NULL);
}

void kvp__jrnl_drop(struct kvp__jrnl *j)
{
    stage_freeing(j, REC_DROP, ALL_RANKS, NULL);
}

/* ---------------------------------------------------------------- decoding */

struct dec {
    const uint8_t *p;
    uint32_t n, off;
    int bad;
};
static uint64_t dget(struct dec *d, int bytes)
{
    if (d->bad || d->n - d->off < (uint32_t)bytes) {
        d->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)d->p[d->off + i] << (8 * i);
    d->off += (uint32_t)bytes;
    return v;
}
static const char *dbytes(struct dec *d, uint32_t len)
{
    if (d->bad || d->n - d->off < len) {
        d->bad = 1;
        return NULL;
    }
    const char *p = (const char *)d->p + d->off;
    d->off += len;
    return p;
}

int kvp__persist_apply(struct kvp__local *m, const uint8_t *payload, uint32_t len, char *msg,
                       size_t msglen, int *type)
{
    const struct kvp__persist_ops *ops = m->persist->ops;
    struct dec d = {payload, len, 0, 0};
    int t = (int)dget(&d, 1);
    *type = t;
    if (t == REC_SNAP_BEGIN || t == REC_SNAP_END) {
        dget(&d, 8);
        dget(&d, t == REC_SNAP_BEGIN ? 4 : 8);
        if (d.bad || d.off != d.n) {
            snprintf(msg, msglen, "malformed snapshot marker");
            return -EUCLEAN;
        }
        return 0;
    }
    if (t == REC_KEYS_HINT) {
        uint32_t id = (uint32_t)dget(&d, 4);
        uint64_t n = dget(&d, 8);
        if (d.bad || d.off != d.n || !ops->has_ns(m, id)) {
            snprintf(msg, msglen, "malformed key-count record");
            return -EUCLEAN;
        }
        ops->keys_hint(m, id, n < MAX_KEYS_HINT ? n : MAX_KEYS_HINT);
        return 0;
    }
    if (t == REC_NS) {
        uint32_t id = (uint32_t)dget(&d, 4);
        uint32_t dl = (uint32_t)dget(&d, 1);
        const char *dep = dbytes(&d, dl);
        uint32_t pl = (uint32_t)dget(&d, 1);
        const char *pool = dbytes(&d, pl);
        if (d.bad || d.off != d.n) {
            snprintf(msg, msglen, "malformed namespace record");
            return -EUCLEAN;
        }
        return ops->ns(m, id, dep, dl, pool, pl, msg, msglen);
    }
    uint32_t nsid = (uint32_t)dget(&d, 4);
    uint32_t rank = (uint32_t)dget(&d, 4);
    if (!d.bad && !ops->has_ns(m, nsid)) {
        snprintf(msg, msglen, "record names namespace %u, which was never created", nsid);
        return -EUCLEAN;
    }
    switch (t) {
    case REC_INIT: {
        uint32_t np = (uint32_t)dget(&d, 4);
        if (d.bad || d.off != d.n)
            break;
        return ops->init(m, nsid, rank, np, msg, msglen);
    }
    case REC_HOLD:
    case REC_HOLD_HEX: {
        uint32_t page = (uint32_t)dget(&d, 4);
        uint32_t kl = (uint32_t)dget(&d, 2);
        const char *k = dbytes(&d, kl);
        if (d.bad || d.off != d.n || (t == REC_HOLD_HEX && kl > KVP_MAX_KEY_LEN / 2))
            break;
        char hex[KVP_MAX_KEY_LEN];
        struct kvp_str ks = {k, kl};
        if (t == REC_HOLD_HEX) {
            for (uint32_t i = 0; i < kl; i++) {
                hex[2 * i] = "0123456789abcdef"[(uint8_t)k[i] >> 4];
                hex[2 * i + 1] = "0123456789abcdef"[(uint8_t)k[i] & 15];
            }
            ks = (struct kvp_str){hex, 2 * (size_t)kl};
        }
        return ops->hold(m, nsid, rank, page, &ks, msg, msglen);
    }
    case REC_LINEAGE: {
        uint32_t kl = (uint32_t)dget(&d, 2);
        const char *k = dbytes(&d, kl);
        uint32_t pl = (uint32_t)dget(&d, 2);
        const char *par = dbytes(&d, pl);
        uint32_t nt = (uint32_t)dget(&d, 4);
        if (d.bad || nt > KVP_MAX_PAGE_TOKENS || d.n - d.off != 4 * nt)
            break;
        struct kvp_str ks = {k, kl};
        return ops->lin(m, nsid, &ks, par, pl, d.p + d.off, nt, msg, msglen);
    }
    case REC_FREE: {
        uint32_t page = (uint32_t)dget(&d, 4);
        if (d.bad || d.off != d.n)
            break;
        return ops->free(m, nsid, rank, page, msg, msglen);
    }
    case REC_DROP:
        if (d.bad || d.off != d.n || rank != ALL_RANKS)
            break;
        ops->drop(m, nsid);
        return 0;
    case REC_CLEAR:
        if (d.bad || d.off != d.n)
            break;
        return ops->clear(m, nsid, rank, msg, msglen);
    default:
        snprintf(msg, msglen, "unknown record type %d", t);
        return -EUCLEAN;
    }
    snprintf(msg, msglen, "malformed record of type %d (%u bytes)", t, len);
    return -EUCLEAN;
}

/* ---------------------------------------------------------------- snapshots */

struct snapw {
    int fd, err;
    uint8_t *big; /* a LINEAGE record's encoding (grown as needed), or NULL */
    size_t bigcap;
    uint8_t buf[1 << 16];
    size_t n;
    uint64_t records;
    uint64_t written, synced; /* bytes written; bytes already on disk */
    uint64_t chunk_start;     /* when the chunk being written was begun (ns) */
    int pace;                 /* in the forked child: leave the disk to the log */
};

/*
 * The snapshot shares the disk with the log, whose every fdatasync flushes
 * the disk's write cache: tens of megabytes of snapshot written at once made
 * each of those fsyncs wait for all of it (log fsyncs fell from 2,000/s to
 * 300/s for the whole snapshot). So the child writes a chunk at a time and
 * waits until the chunk is on disk.
 *
 * It also shares the CPUs, and not only with requests: on a virtual machine
 * the host emulates the disk with CPU time the guest leaves idle, so a child
 * that keeps a CPU busy (even at idle priority) slows every fsync of the log
 * (measured here: 2 ms+ fsyncs from 2/s to 11/s beside an idle-priority
 * busy loop). So after each chunk the child rests as long as the chunk took
 * to encode, write and sync: it never takes more than half of a CPU or of
 * the disk.
 *
 * A chunk handed to the device this way still sits in the host's cache, and
 * the log's next fdatasync pays for writing it out: the chunk is small so
 * that each of those pays a little (4 MiB chunks: p99 of allocate + confirm
 * 15-27 ms while snapshots ran; 256 KiB: 12-16 ms, four interleaved runs).
 */
#define SNAP_CHUNK ((uint64_t)256 << 10)

static void sw_pace(struct snapw *w)
{
    if (w->err || w->written - w->synced < SNAP_CHUNK)
        return;
    if (sync_file_range(w->fd, (off_t)w->synced, (off_t)(w->written - w->synced),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        w->synced = w->written; /* unsupported: the final fsync does it all */
        return;
    }
    w->synced = w->written;
    uint64_t took = kvp__mono_ns() - w->chunk_start;
    struct timespec rest = {(time_t)(took / 1000000000u), (long)(took % 1000000000u)};
    while (nanosleep(&rest, &rest) != 0 && errno == EINTR)
        ;
    w->chunk_start = kvp__mono_ns();
}

static void sw_flush(struct snapw *w)
{
    size_t off = 0;
    while (!w->err && off < w->n) {
        ssize_t r = write(w->fd, w->buf + off, w->n - off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            w->err = r < 0 ? -errno : -EIO;
        else
            off += (size_t)r;
    }
    w->written += w->n;
    w->n = 0;
    if (w->pace)
        sw_pace(w);
}

static void sw_rec(struct snapw *w, const struct enc *e)
{
    if (w->n + KVP_WAL_HDR + e->n > sizeof w->buf)
        sw_flush(w);
    kvp__wal_frame(w->buf + w->n, e->b, e->n);
    memcpy(w->buf + w->n + KVP_WAL_HDR, e->b, e->n);
    w->n += KVP_WAL_HDR + e->n;
    w->records++;
}

/* The records of a snapshot, told by the engine's walk of its state. */
static void snap_ns(void *arg, uint32_t id, const char *dep, const char *pool, uint64_t nkeys,
                    int dropped)
{
    struct snapw *w = arg;
    struct enc e;
    e.n = 0;
    enc_ns(&e, id, dep, pool);
    sw_rec(w, &e);
    e.n = 0;
    e8(&e, REC_KEYS_HINT);
    e32(&e, id);
    e64(&e, nkeys);
    sw_rec(w, &e);
    if (dropped) { /* kept for its number; no ranks, no keys */
        e.n = 0;
        e8(&e, REC_DROP);
        e32(&e, id);
        e32(&e, ALL_RANKS);
        sw_rec(w, &e);
    }
}

static void snap_rank(void *arg, uint32_t ns, uint32_t rank, uint32_t num_pages)
{
    struct enc e;
    e.n = 0;
    enc_init(&e, ns, rank, num_pages);
    sw_rec(arg, &e);
}

static void snap_hold(void *arg, uint32_t ns, uint32_t rank, uint32_t page, const char *key,
                      uint16_t klen)
{
    struct enc e;
    e.n = 0;
    enc_hold(&e, ns, rank, page, key, klen);
    sw_rec(arg, &e);
}

/* A record of any size: through buf, a piece at a time. */
static void sw_big(struct snapw *w, const uint8_t *rec, uint32_t len)
{
    uint8_t hdr[KVP_WAL_HDR];
    kvp__wal_frame(hdr, rec, len);
    const uint8_t *src[2] = {hdr, rec};
    size_t n[2] = {KVP_WAL_HDR, len};
    for (int k = 0; k < 2; k++)
        for (size_t off = 0; off < n[k];) {
            if (w->n == sizeof w->buf)
                sw_flush(w);
            size_t c = sizeof w->buf - w->n < n[k] - off ? sizeof w->buf - w->n : n[k] - off;
            memcpy(w->buf + w->n, src[k] + off, c);
            w->n += c;
            off += c;
        }
    w->records++;
}

static void snap_lin(void *arg, uint32_t ns, uint32_t rank, const char *key, uint16_t klen,
                     const struct kvp__lin *l)
{
    struct snapw *w = arg;
    size_t need = KVP_JRNL_LIN(klen, l->plen, l->ntokens);
    if (need > w->bigcap) {
        uint8_t *b = realloc(w->big, need);
        if (!b) { /* the snapshot fails whole: a later one tries again */
            w->err = -ENOMEM;
            return;
        }
        w->big = b;
        w->bigcap = need;
    }
    sw_big(w, w->big, enc_lin(w->big, ns, rank, key, klen, l));
}

static const struct kvp__persist_visit snap_visit = {snap_ns, snap_rank, snap_hold, snap_lin};

/*
 * Writes the whole state: with fz == NULL the live one (in a forked child, or
 * with no request running), else the frozen copy.
 */
static int write_snapshot(struct kvp__local *m, struct snapw *w, int fd, uint64_t lsn, int pace,
                          const struct kvp__frozen *fz)
{
    w->fd = fd;
    w->err = 0;
    w->n = 0;
    w->records = 0;
    w->written = w->synced = 0;
    w->chunk_start = kvp__mono_ns();
    w->pace = pace;
    w->big = NULL;
    w->bigcap = 0;
    struct enc e;
    e.n = 0;
    e8(&e, REC_SNAP_BEGIN);
    e64(&e, lsn);
    e32(&e, SNAP_VERSION);
    sw_rec(w, &e);
    m->persist->ops->walk(m, fz, &snap_visit, w);
    e.n = 0;
    e8(&e, REC_SNAP_END);
    e64(&e, lsn);
    e64(&e, w->records + 1);
    sw_rec(w, &e);
    sw_flush(w);
    free(w->big);
    w->big = NULL;
    return w->err;
}

/* Writes, fsyncs and renames snap-<lsn>.snap (a failed one is removed). */
static int snap_file(struct kvp__local *m, struct snapw *w, uint64_t lsn, int pace,
                     const struct kvp__frozen *fz)
{
    const char *dir = kvp__wal_dir(m->persist->wal);
    int fd = kvp__wal_snap_create(dir, lsn);
    int rc = fd < 0 ? fd : write_snapshot(m, w, fd, lsn, pace, fz);
    if (fd >= 0 && rc)
        kvp__wal_snap_abort(dir, lsn, fd); /* a full disk gets its space back */
    else if (fd >= 0)
        rc = kvp__wal_snap_commit(dir, lsn, fd);
    return rc;
}

static void lock_all(struct kvp__local *m)
{
    m->persist->ops->lock_all(m);
}

static void unlock_all(struct kvp__local *m)
{
    m->persist->ops->unlock_all(m);
}

struct snapcheck {
    uint64_t records, end_count, bytes;
    int saw_end;
};

static int snap_check_rec(void *arg, const uint8_t *payload, uint32_t len, const char *file,
                          uint64_t offset);

/* Reads the new snapshot back before anything older is deleted. 0, or a
 * negative errno (-EUCLEAN: it does not end as written). *bytes: its size. */
static int check_snapshot(struct kvp__wal *wal, uint64_t lsn, uint64_t *bytes)
{
    struct snapcheck c = {0};
    int rc = kvp__wal_snap_read(wal, lsn, snap_check_rec, &c);
    if (rc == 0 && (!c.saw_end || c.end_count != c.records))
        rc = -EUCLEAN;
    *bytes = c.bytes;
    return rc;
}

/* The snapshot at lsn read back whole: what it covers can go. */
static void adopt_snapshot(struct kvp__local *m, uint64_t lsn, uint64_t bytes)
{
    struct kvp__persist *p = m->persist;
    kvp__wal_prune(p->wal, lsn);
    pthread_mutex_lock(&p->mu);
    p->last_snap = lsn;
    p->last_snap_size = bytes;
    p->snapshots++;
    p->last_snap_unix = (uint64_t)time(NULL);
    pthread_mutex_unlock(&p->mu);
}

static void log_unreadable(struct kvp__local *m, uint64_t lsn, int rc)
{
    plog(m, 0, "snapshot at %" PRIu64 " does not read back (%s); older files are kept", lsn,
         strerror(-rc));
}

/*
 * Logs every namespace and rank again at the start of a segment, so that the
 * log after a snapshot can be replayed even if that snapshot is lost.
 * Replaying them over an intact snapshot changes nothing. Caller holds every
 * lock (or runs before any request).
 */
static void append_catalog(struct kvp__local *m)
{
    const struct kvp__persist_ops *ops = m->persist->ops;
    uint64_t bytes = ops->catalog_bytes(m);
    if (!bytes)
        return;
    if (kvp__jrnl_space(m, bytes, 0, NULL) != 0) {
        plog(m, 1,
             "no room in the log for the catalog of namespaces and ranks; it is left out "
             "of this segment (the snapshot has it)");
        return;
    }
    ops->catalog(m);
    kvp__jrnl_unspace(m, bytes);
}

/* Exit statuses of the snapshot child other than 0 (written, fsynced, renamed
 * and read back whole). */
enum { SNAP_CHILD_WRITE_FAILED = 1, SNAP_CHILD_UNREADABLE = 2 };

/*
 * After the log failed (records not written): the snapshot at lsn covers
 * every change, so the log starts again after it. Caller holds every lock.
 */
static int resume_log(struct kvp__local *m, uint64_t lsn)
{
    int rc = kvp__wal_resume(m->persist->wal, lsn);
    if (rc)
        plog(m, 0,
             "snapshot at %" PRIu64 " written, but the log cannot start again: %s; writes "
             "stay refused, retrying",
             lsn, strerror(-rc));
    else
        append_catalog(m);
    return rc;
}

/*
 * The start of every snapshot but the final one, with every lock held (the
 * caller took them): *lsn, the log position it covers (no append can come
 * between); *failed, whether the log had failed; and the log rotated at
 * *lsn, so that the snapshot can later remove the segments before it whole
 * (later: only marked there, when the caller finishes the rotation once it
 * has released the locks). *done = 1 when there is nothing to write: the
 * newest snapshot covers it all (after a failure of the log, writes then
 * resume). 0 or a negative errno; the locks stay held either way.
 */
static int snap_begin(struct kvp__local *m, uint64_t *lsn, int *failed, int *done, int later)
{
    struct kvp__persist *p = m->persist;
    *lsn = kvp__wal_appended(p->wal);
    *failed = 0;
    *done = 0;
    kvp__wal_status(p->wal, failed, NULL);
    pthread_mutex_lock(&p->mu);
    uint64_t last = p->last_snap;
    pthread_mutex_unlock(&p->mu);
    if (*lsn == last) {
        *done = 1;
        return *failed ? resume_log(m, *lsn) : 0; /* that snapshot covers it all */
    }
    int rc = *failed ? 0 : later ? kvp__wal_rotate_at(p->wal, *lsn) : kvp__wal_rotate(p->wal, *lsn);
    if (rc)
        plog(m, 0, "snapshot: cannot rotate the log: %s", strerror(-rc));
    return rc;
}

/* The snapshot at lsn is on disk and read back whole (bytes long): the log
 * before it can go, and after a failure of the log writes resume. */
static int snap_adopt(struct kvp__local *m, uint64_t lsn, int failed, uint64_t bytes)
{
    int rc = 0;
    if (failed) {
        lock_all(m);
        rc = resume_log(m, lsn);
        unlock_all(m);
    }
    adopt_snapshot(m, lsn, bytes);
    return rc;
}

/*
 * Takes a snapshot in a forked child (KVP_SNAPSHOT_FORK). Returns 0 or a
 * negative errno. After a failure of the log it is also the way back: the
 * snapshot covers every change (acknowledged or not), and the log starts
 * again after it.
 */
static int snapshot_fork_locked(struct kvp__local *m)
{
    struct kvp__persist *p = m->persist;
    uint64_t t0 = kvp__mono_ns();
    lock_all(m);
    uint64_t lsn;
    int failed, done;
    int rc = snap_begin(m, &lsn, &failed, &done, 0);
    if (rc || done) {
        unlock_all(m);
        return rc;
    }
    pid_t parent = getpid();
    uint64_t tf = kvp__mono_ns();
    pid_t pid = fork();
    if (pid > 0)
        tf = kvp__mono_ns() - tf;
    if (pid > 0 && !failed)
        append_catalog(m); /* after the fork: the child's image must not include it */
    if (pid == 0) {
        /* The child dies with the server (this thread waits for it): left
         * behind, it would keep the data directory's lock, inherited with
         * the descriptor, and a restarted server would find it taken. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(SNAP_CHILD_WRITE_FAILED);
        /* The snapshot can wait; requests cannot: use only idle CPU. */
        struct sched_param sp = {0};
        if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0 && nice(19) == -1)
            (void)0;           /* a lower priority is an optimization only */
        static struct snapw w; /* large; static so the child's stack stays small */
        int crc = snap_file(m, &w, lsn, 1, NULL);
        /* The read-back too: at idle priority here, where in the server it
         * took a core for a third of a second per 170 MB of snapshot. */
        uint64_t bytes;
        _exit(crc                                   ? SNAP_CHILD_WRITE_FAILED
              : check_snapshot(p->wal, lsn, &bytes) ? SNAP_CHILD_UNREADABLE
                                                    : 0);
    }
    unlock_all(m);
    uint64_t paused = kvp__mono_ns() - t0;
    if (pid < 0) {
        int e = -errno;
        plog(m, 0, "snapshot: fork failed: %s", strerror(errno));
        return e;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == SNAP_CHILD_UNREADABLE) {
        log_unreadable(m, lsn, -EUCLEAN);
        return -EUCLEAN;
    }
    uint64_t bytes;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        kvp__wal_snap_size(p->wal, lsn, &bytes) != 0) {
        plog(m, 0, "snapshot at %" PRIu64 " failed (child status %d); the log is kept%s", lsn,
             status, failed ? "; writes stay refused, retrying" : ", retrying later");
        return -EIO;
    }
    rc = snap_adopt(m, lsn, failed, bytes);
    plog(m, 2,
         "snapshot at log position %" PRIu64 " written by a child (requests paused %.2f ms, "
         "of which fork %.2f ms)",
         lsn, paused / 1e6, tf / 1e6);
    return rc;
}

/* Room for need bytes of copy, backed now: faulting fresh memory in while
 * the locks are held would cost more than the copy (a 32 MiB copy into
 * unbacked memory took 26-34 ms here, 6-10 ms into backed memory). */
static int frozen_reserve(struct kvp__frozen *fz, size_t need)
{
    if (fz->mem && need <= fz->cap)
        return 0;
    kvp__big_free(fz->mem, fz->cap);
    fz->cap = need + need / 8 + 4096; /* and for what comes before the locks are taken */
    if (!(fz->mem = kvp__big_zalloc(fz->cap))) {
        fz->cap = 0;
        return -ENOMEM;
    }
    kvp__big_prefault(fz->mem, fz->cap);
    return 0;
}

void (*kvp__snapshot_test_hook)(void *arg);
void *kvp__snapshot_test_hook_arg;

/*
 * Takes a snapshot without forking (KVP_SNAPSHOT_THREAD, on the snapshot
 * thread; KVP_SNAPSHOT_MANUAL, on the caller's): with every lock held the
 * log is marked for rotation and the state frozen (freeze), then the locks
 * are released, the rotation finished, and this thread writes the snapshot
 * from the copy, paced as the forked child is. It runs at the thread's own priority: a library
 * cannot lower a thread's priority and raise it again without privileges, and pacing already keeps
 * it to half a CPU in short bursts. Returns 0 or a negative errno; after a failure of the log it is
 * the way back, as a fork's is.
 */
static int snapshot_thread_locked(struct kvp__local *m)
{
    struct kvp__persist *p = m->persist;
    const struct kvp__persist_ops *ops = p->ops;
    struct kvp__frozen fz = {0};
    struct snapw *w = malloc(sizeof *w);
    int rc = w ? frozen_reserve(&fz, ops->frozen_bytes(m, 1)) : -ENOMEM;
    uint64_t t0 = 0;
    for (int tries = 0; !rc;) {
        t0 = kvp__mono_ns();
        lock_all(m);
        size_t need = ops->frozen_bytes(m, 0);
        if (need <= fz.cap)
            break;
        /* It outgrew its room meanwhile: larger room, backed outside the
         * locks; a state that keeps outgrowing it gets it with them held. */
        if (++tries == 3 && (rc = frozen_reserve(&fz, need)) == 0)
            break;
        unlock_all(m);
        if (!rc)
            rc = frozen_reserve(&fz, need);
    }
    if (rc) {
        plog(m, 0, "snapshot: no memory for a copy of the state");
        free(w);
        return rc;
    }
    uint64_t lsn;
    int failed, done;
    rc = snap_begin(m, &lsn, &failed, &done, 1);
    if (rc || done) {
        unlock_all(m);
        kvp__big_free(fz.mem, fz.cap);
        free(w);
        return rc;
    }
    uint64_t tc = kvp__mono_ns();
    ops->freeze(m, &fz);
    if (!failed)
        append_catalog(m); /* after the copy, which must not include it */
    unlock_all(m);
    uint64_t t1 = kvp__mono_ns();
    if (kvp__snapshot_test_hook) /* changes now: their records come after lsn */
        kvp__snapshot_test_hook(kvp__snapshot_test_hook_arg);
    /* The segment at lsn starts now that requests go on: its syncs (of the
     * old segment's tail, of the directory) are no longer theirs to wait for. */
    if (!failed && (rc = kvp__wal_rotate_finish(p->wal)) != 0)
        plog(m, 0, "snapshot: cannot rotate the log: %s", strerror(-rc));
    uint64_t tr = kvp__mono_ns();
    if (!rc)
        rc = snap_file(m, w, lsn, 1, &fz);
    uint64_t kept = ops->thaw(m, &fz); /* the writer is done with the entries */
    kvp__big_free(fz.mem, fz.cap);
    free(w);
    uint64_t bytes = 0;
    if (rc) {
        plog(m, 0, "snapshot at %" PRIu64 " failed: %s; the log is kept%s", lsn, strerror(-rc),
             failed ? "; writes stay refused, retrying" : ", retrying later");
        return rc;
    }
    if ((rc = check_snapshot(p->wal, lsn, &bytes)) != 0) {
        log_unreadable(m, lsn, rc);
        return rc;
    }
    rc = snap_adopt(m, lsn, failed, bytes);
    plog(m, 2,
         "snapshot at log position %" PRIu64 " written by a thread (requests paused %.2f ms, "
         "of which copying %zu bytes %.2f ms; then the log rotated in %.2f ms and the snapshot "
         "written in %.0f ms, %" PRIu64 " dropped key entries kept meanwhile)",
         lsn, (t1 - t0) / 1e6, fz.used, (t1 - tc) / 1e6, (tr - t1) / 1e6,
         (kvp__mono_ns() - tr) / 1e6, kept);
    return rc;
}

/* One snapshot at a time (the snapshot thread, kvp_meta_snapshot). */
static int snapshot_now(struct kvp__local *m, int fork_it)
{
    pthread_mutex_lock(&m->persist->snap_mu);
    int rc = fork_it ? snapshot_fork_locked(m) : snapshot_thread_locked(m);
    pthread_mutex_unlock(&m->persist->snap_mu);
    return rc;
}

/* Waits between tries after a failed snapshot or while writes are refused. */
#define RETRY_MS 1000u
#define RETRY_MAX_MS 10000u

static void *snap_main(void *arg)
{
    pthread_setname_np(pthread_self(), "kvp-snapshot"); /* for top and perf */
    struct kvp__local *m = arg;
    struct kvp__persist *p = m->persist;
    uint64_t next_try = 0, backoff = RETRY_MS;
    int forks = m->opts.snapshot_mode == KVP_SNAPSHOT_FORK;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (p->asked == p->served) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        if (p->stop)
            break;
        if (p->asked != p->served) { /* kvp_meta_snapshot waits: at once, whatever the backoff */
            uint64_t asked = p->asked;
            pthread_mutex_unlock(&p->mu);
            int rc = snapshot_now(m, forks);
            pthread_mutex_lock(&p->mu);
            p->served = asked;
            p->served_rc = rc;
            pthread_cond_broadcast(&p->served_cv);
            continue;
        }
        uint64_t now = kvp__mono_ms();
        if (now < next_try)
            continue;
        int failed = 0;
        int refused = kvp__wal_status(p->wal, &failed, NULL);
        if (!refused && now >= next_try + RETRY_MAX_MS)
            backoff = RETRY_MS; /* well for a while: the next trouble is tried at once */
        if (refused && !failed) {
            /* No room for the log: a write that comes retries too, this
             * brings /healthz back without one. */
            pthread_mutex_unlock(&p->mu);
            kvp__wal_retry(p->wal);
            pthread_mutex_lock(&p->mu);
            next_try = now + RETRY_MS;
            continue;
        }
        if (m->opts.snapshot_mode == KVP_SNAPSHOT_MANUAL)
            continue; /* only kvp_meta_snapshot writes one, even to bring a failed log back */
        /* The log may grow to the snapshot's size (or snapshot_bytes, if
         * larger) before the next one: disk use stays under twice the state.
         * A failed log needs one now. */
        uint64_t appended = kvp__wal_appended(p->wal);
        uint64_t limit =
            m->opts.snapshot_bytes > p->last_snap_size ? m->opts.snapshot_bytes : p->last_snap_size;
        if (!failed && appended - p->last_snap < limit)
            continue;
        pthread_mutex_unlock(&p->mu);
        int rc = snapshot_now(m, forks);
        pthread_mutex_lock(&p->mu);
        /* After a recovery too: a disk that fails again at once must not
         * get a whole snapshot every 0.2 s. */
        if (rc != 0 || failed) {
            p->snapshot_failures += rc != 0;
            next_try = kvp__mono_ms() + backoff;
            backoff = backoff * 2 < RETRY_MAX_MS ? backoff * 2 : RETRY_MAX_MS;
        } else {
            backoff = RETRY_MS;
        }
    }
    if (p->asked != p->served) { /* closing: kvp_meta_snapshot may not run now, but if it did */
        p->served = p->asked;
        p->served_rc = -ECANCELED;
        pthread_cond_broadcast(&p->served_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---------------------------------------------------------------- recovery */

struct replay_ctx {
    struct kvp__local *m;
    int lenient; /* skip records that contradict the state (after a damaged snapshot) */
    uint64_t skipped;
    char msg[512];
    char file[96]; /* the name, copied: the caller's string does not outlive the scan */
    uint64_t offset;
    uint64_t records;
    int saw_end, saw_begin;
    uint64_t end_count;
};

static int replay_rec(void *arg, const uint8_t *payload, uint32_t len, const char *file,
                      uint64_t offset)
{
    struct replay_ctx *c = arg;
    int type = 0;
    int rc = kvp__persist_apply(c->m, payload, len, c->msg, sizeof c->msg, &type);
    c->records++;
    if (rc == -EUCLEAN && c->lenient) {
        c->skipped++;
        return 0;
    }
    if (rc) {
        snprintf(c->file, sizeof c->file, "%s", file);
        c->offset = offset;
    }
    return rc;
}

/* Checks a snapshot: framing, BEGIN first, END last with the right count. */
static int snap_check_rec(void *arg, const uint8_t *payload, uint32_t len, const char *file,
                          uint64_t offset)
{
    struct snapcheck *c = arg;
    (void)file;
    if (c->saw_end || (c->records == 0 && (len < 1 || payload[0] != REC_SNAP_BEGIN)))
        return -EUCLEAN;
    c->records++;
    c->bytes = offset + KVP_WAL_HDR + len;
    if (len == 17 && payload[0] == REC_SNAP_END) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++)
            n |= (uint64_t)payload[9 + i] << (8 * i);
        c->saw_end = 1;
        c->end_count = n;
    }
    return 0;
}

struct snapload {
    struct replay_ctx r;
    struct snapcheck chk;
};

static int snap_load_rec(void *arg, const uint8_t *payload, uint32_t len, const char *file,
                         uint64_t offset)
{
    struct snapload *l = arg;
    int rc = snap_check_rec(&l->chk, payload, len, file, offset);
    return rc ? rc : replay_rec(&l->r, payload, len, file, offset);
}

/*
 * Loads the snapshot at lsn in one pass. A whole, valid snapshot: 0. A
 * damaged one: the records before the damage stay loaded (a snapshot is
 * written in an order in which every prefix is a consistent state) and 1 is
 * returned, so that the log after it is replayed leniently.
 */
static int load_snapshot(struct kvp__local *m, struct kvp__wal *w, uint64_t lsn)
{
    struct snapload l = {.r = {.m = m}};
    int rc = kvp__wal_snap_read(w, lsn, snap_load_rec, &l);
    if (l.r.file[0]) { /* a record that frames correctly but contradicts the state */
        plog(m, 0, "%s/snap-%016" PRIx64 ".snap offset %" PRIu64 ": %s", kvp__wal_dir(w), lsn,
             l.r.offset, l.r.msg);
        return -EUCLEAN;
    }
    if (rc < 0 && rc != -EUCLEAN)
        return rc; /* could not read the file */
    int whole = rc == 0 && l.chk.saw_end && l.chk.end_count == l.chk.records;
    if (!whole)
        plog(m, 1,
             "snapshot %s/snap-%016" PRIx64 ".snap is damaged after %" PRIu64
             " good records (offset %" PRIu64 "): keeping those, dropping the rest, and "
             "replaying the log after it, skipping records that contradict what was kept",
             kvp__wal_dir(w), lsn, l.chk.records, l.chk.bytes);
    return whole ? 0 : 1;
}

int kvp__persist_open(struct kvp__local *m, const struct kvp__persist_ops *ops)
{
    struct kvp__persist *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->ops = ops;
    p->m = m;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->snap_mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->served_cv, NULL);
    if (!m->opts.snapshot_bytes)
        m->opts.snapshot_bytes = 64u << 20;
    if (m->opts.snapshot_mode != KVP_SNAPSHOT_THREAD &&
        m->opts.snapshot_mode != KVP_SNAPSHOT_MANUAL)
        m->opts.snapshot_mode = KVP_SNAPSHOT_FORK; /* the interface has checked it */
    char msg[512] = "";
    int rc = kvp__wal_open(m->opts.data_dir, m->opts.fsync, m->opts.log, m->opts.log_arg,
                           m->opts.readonly, &p->wal, msg, sizeof msg);
    if (rc) {
        plog(m, 0, "%s", msg);
        free(p);
        return rc;
    }
    m->persist = p;
    p->replaying = 1;
    uint64_t t0 = kvp__mono_ms();

    uint64_t snaps[16];
    int nsnap = kvp__wal_snap_list(p->wal, snaps, 16);
    uint64_t from = 0;
    int lenient = 0;
    if (nsnap) {
        /* Only the newest snapshot counts: the log before it is gone. */
        rc = load_snapshot(m, p->wal, snaps[0]);
        if (rc < 0)
            goto fail;
        lenient = rc == 1;
        from = snaps[0];
    }
    struct replay_ctx c = {.m = m, .lenient = lenient};
    uint64_t end = from;
    rc = kvp__wal_replay(p->wal, from, !m->opts.readonly, replay_rec, &c, &end);
    if (rc) {
        if (c.file[0])
            plog(m, 0, "cannot recover %s: %s offset %" PRIu64 ": %s", m->opts.data_dir, c.file,
                 c.offset, c.msg);
        goto fail;
    }
    if (c.skipped)
        plog(m, 1, "skipped %" PRIu64 " log records that contradicted the damaged snapshot's state",
             c.skipped);
    p->replaying = 0;
    p->last_snap = from;
    p->last_snap_size = 0;
    plog(m, 2, "recovered %s: snapshot at %" PRIu64 " + %" PRIu64 " log records in %" PRIu64 " ms",
         m->opts.data_dir, from, c.records, kvp__mono_ms() - t0);
    if (m->opts.readonly)
        return 0;
    if ((rc = kvp__wal_start(p->wal, end)) != 0) {
        plog(m, 0, "cannot start the log in %s: %s", m->opts.data_dir, strerror(-rc));
        goto fail;
    }
    append_catalog(m);
    if (pthread_create(&p->thread, NULL, snap_main, m) == 0)
        p->thread_started = 1;
    return 0;
fail:
    p->replaying = 0;
    kvp__wal_close(p->wal);
    m->persist = NULL;
    free(p);
    return rc ? rc : -EUCLEAN;
}

void kvp__persist_close(struct kvp__local *m)
{
    struct kvp__persist *p = m->persist;
    if (!p)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (!m->opts.readonly) {
        /* A final snapshot keeps the LRU order of a clean shutdown. In
         * every mode it is written by this thread from the live state, at
         * full speed: no request runs any more, so neither a fork nor a copy
         * would spare anyone a pause (and KVP_SNAPSHOT_MANUAL's log is
         * compacted here too). */
        uint64_t lsn = kvp__wal_appended(p->wal);
        if (lsn != p->last_snap) {
            /* After a failure of the log this snapshot is what keeps the
             * changes since (none of them acknowledged). */
            int failed = 0;
            kvp__wal_status(p->wal, &failed, NULL);
            struct snapw *w = malloc(sizeof *w);
            int rc = !w ? -ENOMEM : failed ? 0 : kvp__wal_rotate(p->wal, lsn);
            if (!rc)
                rc = snap_file(m, w, lsn, 0, NULL);
            free(w);
            uint64_t bytes;
            if (rc)
                plog(m, 0, "final snapshot failed: %s (the log is kept)", strerror(-rc));
            else if ((rc = check_snapshot(p->wal, lsn, &bytes)) != 0)
                log_unreadable(m, lsn, rc);
            else if (!failed || kvp__wal_resume(p->wal, lsn) == 0)
                adopt_snapshot(m, lsn, bytes);
        }
    }
    kvp__wal_close(p->wal);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->snap_mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->served_cv);
    free(p);
    m->persist = NULL;
}

/* ---------------------------------------------------------------- the backend's log operations */

int kvp__persist_wait(struct kvp__local *m, uint64_t lsn, struct kvp_error *err)
{
    if (!m->persist || !lsn || m->opts.readonly)
        return 0;
    int rc = kvp__wal_wait(m->persist->wal, lsn);
    if (rc == -EINVAL) {
        kvp__set_err(err, rc, KVP_RULE_ARG, -1, (int64_t)lsn, 0,
                     "ticket %llu was not handed out by this handle", (unsigned long long)lsn);
    } else if (rc) {
        log_err(m, rc, err);
    }
    return rc;
}

int kvp__persist_when_durable(struct kvp__local *m, uint64_t lsn, kvp_meta_durable_fn fn, void *arg)
{
    if (!m->persist || !lsn || m->opts.readonly)
        return 1;
    return kvp__wal_when_durable(m->persist->wal, lsn, fn, arg);
}

/* "" for 0, else the errno's symbol (ENOSPC, EIO, ...) or its number. */
static const char *errno_name(int rc, char *num, size_t len)
{
    switch (-rc) {
    case 0:
        return "";
    case ENOSPC:
        return "ENOSPC";
    case EDQUOT:
        return "EDQUOT";
    case EIO:
        return "EIO";
    case ENOMEM:
        return "ENOMEM";
    case EROFS:
        return "EROFS";
    default:
        snprintf(num, len, "%d", -rc);
        return num;
    }
}

int kvp__persist_values(struct kvp__local *m, kvp_meta_value_fn fn, void *arg)
{
    struct kvp__persist *p = m->persist;
    if (!p)
        return 0; /* in memory only: no log */
    uint64_t fsyncs, fsync_ns, refusals;
    int failed;
    kvp__wal_fsync_stats(p->wal, &fsyncs, &fsync_ns);
    pthread_mutex_lock(&p->mu);
    uint64_t snapshots = p->snapshots, snapshot_failures = p->snapshot_failures;
    uint64_t last_snap_unix = p->last_snap_unix;
    pthread_mutex_unlock(&p->mu);
    int refused = kvp__wal_status(p->wal, &failed, &refusals);
    char num[16];
    const struct kvp_meta_value v[] = {
        {"wal", "bytes", "kvpage_wal_bytes", "Bytes of write-ahead log and snapshots on disk.",
         KVP_VALUE_GAUGE, 0, kvp__wal_disk_bytes(p->wal), NULL, NULL},
        {"wal", "appended", "kvpage_wal_appended_total", "Write-ahead log appended since start.",
         KVP_VALUE_COUNTER, 0, kvp__wal_appended(p->wal), NULL, NULL},
        {"wal", "fsyncs", "kvpage_wal_fsyncs_total", "fsync calls of the write-ahead log.",
         KVP_VALUE_COUNTER, 0, fsyncs, NULL, NULL},
        {"wal", "fsync_seconds", "kvpage_wal_fsync_seconds_total",
         "Time spent in those fsync calls.", KVP_VALUE_COUNTER, 9, fsync_ns, NULL, NULL},
        {"wal", "snapshots", "kvpage_snapshots_total", "Snapshots written.", KVP_VALUE_COUNTER, 0,
         snapshots, NULL, NULL},
        {"wal", "snapshot_failures", "kvpage_snapshot_failures_total", "Snapshots that failed.",
         KVP_VALUE_COUNTER, 0, snapshot_failures, NULL, NULL},
        {"wal", "last_snapshot_unix", "kvpage_last_snapshot_timestamp_seconds",
         "Unix time of the last snapshot written since the start (0: none yet).", KVP_VALUE_GAUGE,
         0, last_snap_unix, NULL, NULL},
        {"wal", "writable", "kvpage_wal_writable",
         "1 while the log takes changes; 0 while they are refused (errno: why).", KVP_VALUE_BOOL, 0,
         !refused, "errno", errno_name(refused, num, sizeof num)},
        {"wal", "refused_writes", "kvpage_wal_refused_writes_total",
         "Changes refused because the log could not take them.", KVP_VALUE_COUNTER, 0, refusals,
         NULL, NULL},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int rc = fn(&v[i], arg);
        if (rc)
            return rc;
    }
    return 0;
}

int kvp__persist_health(struct kvp__local *m, char *why, size_t len)
{
    if (!m->persist || m->opts.readonly)
        return 0;
    int rc = kvp__wal_status(m->persist->wal, NULL, NULL);
    if (rc && why && len)
        kvp__meta_log_why(m, rc, why, len);
    return rc;
}

int kvp__persist_snapshot(struct kvp__local *m)
{
    struct kvp__persist *p = m->persist;
    if (!p || m->opts.readonly)
        return -ENOENT;
    if (m->opts.snapshot_mode != KVP_SNAPSHOT_THREAD || !p->thread_started)
        return snapshot_now(m, m->opts.snapshot_mode == KVP_SNAPSHOT_FORK); /* MANUAL: here */
    pthread_mutex_lock(&p->mu);
    uint64_t mine = ++p->asked;
    pthread_cond_signal(&p->cv);
    while (p->served < mine)
        pthread_cond_wait(&p->served_cv, &p->mu);
    int rc = p->served_rc; /* of a snapshot that began after the call */
    pthread_mutex_unlock(&p->mu);
    return rc;
}
