/*
 * Write-ahead log: append to memory, write and fsync on a flusher thread
 * (group commit: everything appended while one fsync runs shares the next),
 * or synchronously in the caller for --fsync always.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "util/clock.h"
#include "wal/wal.h"

#define SEGMENT_MAX (64u << 20)
/*
 * The segment file is extended with zeros ahead of the records, this much at
 * a time: an fdatasync of records written inside the file's size writes only
 * the data, where one that grows the file also writes its inode (0.27 vs
 * 0.38 ms here, ext4). Replay ends a segment at its first all-zero tail.
 * The fdatasync that carries the zeros is slow, and every confirmation
 * waiting on it waits that long: 4 MiB took 5-10 ms here, 1 MiB 1-3 ms,
 * for the same bytes in all (with 1 MiB, and the snapshot's CPU pacing in
 * persist.c, 7-16% more pairs/s in four interleaved runs).
 */
#define ZERO_AHEAD ((uint64_t)1 << 20)
/*
 * The zeros are also the log's reserved space: a change is applied in memory
 * only once the bytes its records can take are zeros already written ahead
 * of the tail (kvp__wal_reserve), so that running out of space refuses the
 * change instead of losing it. The flusher keeps this much room ahead of
 * what is appended and reserved, so that a request rarely writes zeros.
 */
#define ROOM_LOW (ZERO_AHEAD / 2)
/* A segment that cannot be started (no space) is retried this often. */
#define ROTATE_RETRY_NS (1000000000ull)

struct waiter {
    uint64_t lsn;
    void (*cb)(void *arg, int status);
    void *arg;
};

struct kvp__wal {
    char *dir;
    int dirfd, lockfd, mode;
    kvp__log_fn log;
    void *log_arg;

    pthread_mutex_t mu;
    pthread_cond_t work, done;
    uint8_t *buf, *spare;
    size_t len, cap, spare_cap;
    uint64_t appended, durable;
    /* room: LSN up to which the segment's file space is written (zeros
     * ahead of the records); reserved: bytes promised to operations that
     * have not appended yet. appended + reserved <= room for reserved
     * operations. */
    uint64_t room, reserved;
    /* failed: records were lost (write or fsync error): negative errno until
     * kvp__wal_resume. refused: the last reservation could not get room:
     * negative errno until one does. */
    int failed, refused, stop, started;
    uint64_t refusals;
    pthread_t flusher;
    struct waiter *waiters;
    size_t nwait, capwait;

    pthread_mutex_t io; /* one writer of the segment at a time */
    int seg_fd;
    uint64_t seg_start, seg_bytes, old_bytes;
    uint64_t seg_size; /* the file's size: seg_bytes of records, then zeros */
    uint64_t fsyncs, fsync_ns;
    uint64_t rotate_retry; /* mono ns before which a failed rotation is not retried */
    /* kvp__wal_rotate_at: a segment is to start at rot_at, which the next
     * flush does (rot_pending); rot_rc: how the last one went (mu). */
    int rot_pending, rot_rc;
    uint64_t rot_at;
};

static void logf_(struct kvp__wal *w, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(struct kvp__wal *w, int level, const char *fmt, ...)
{
    if (!w->log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    w->log(w->log_arg, level, msg);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void kvp__wal_frame(uint8_t hdr[KVP_WAL_HDR], const void *payload, uint32_t len)
{
    put32(hdr, len);
    put64(hdr + 4, XXH64(payload, len, 0));
}

static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off)
{
    while (n) {
        ssize_t r = pwrite(fd, p, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/*
 * Writes zeros from offset *size (the file's end) up to a ZERO_AHEAD multiple
 * past `need`. *size follows what was written, also when it fails half-way
 * (the zeros written are room all the same).
 */
static int zero_fill(int fd, uint64_t *size, uint64_t need)
{
    static const uint8_t zeros[64 << 10];
    uint64_t to = (need + ZERO_AHEAD) & ~(ZERO_AHEAD - 1);
    while (*size < to) {
        size_t n = to - *size < sizeof zeros ? (size_t)(to - *size) : sizeof zeros;
        ssize_t r = pwrite(fd, zeros, n, (off_t)*size);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        *size += (uint64_t)r;
    }
    return 0;
}

/* The current segment's zeros reach past `need`; updates room (w->io held). */
static int zero_ahead(struct kvp__wal *w, uint64_t need)
{
    if (w->seg_size < w->seg_bytes)
        w->seg_size = w->seg_bytes;
    int rc = zero_fill(w->seg_fd, &w->seg_size, need);
    pthread_mutex_lock(&w->mu);
    w->room = w->seg_start + w->seg_size;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static int all_zero(const uint8_t *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

static void log_refused(struct kvp__wal *w, int was, int now);

/*
 * Starts the segment at lsn (w->io held), with zeros ahead for everything
 * already promised against the current segment's room plus a margin; only
 * then is the current segment closed, its unused zeros cut off. On failure
 * the current segment stays (short != 0, at start: the new one is kept with
 * what room it got).
 */
static int open_segment(struct kvp__wal *w, uint64_t lsn, int short_ok)
{
    if (w->seg_fd >= 0 && w->seg_start == lsn)
        return 0; /* nothing was appended since it began */
    char name[64];
    snprintf(name, sizeof name, "wal-%016" PRIx64 ".log", lsn);
    int fd = openat(w->dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&w->mu);
    uint64_t promised = w->room > lsn ? w->room - lsn : 0;
    if (w->appended + w->reserved > lsn + promised)
        promised = w->appended + w->reserved - lsn;
    pthread_mutex_unlock(&w->mu);
    uint64_t size = 0;
    int rc = zero_fill(fd, &size, promised + ROOM_LOW), short_rc = 0;
    if (rc && short_ok && size >= promised) {
        short_rc = rc; /* starting on a full disk: writes are refused from the start */
        rc = 0;
    }
    if (!rc && w->mode != KVP_FSYNC_NEVER && fsync(w->dirfd) != 0)
        rc = -errno;
    if (rc) {
        close(fd);
        unlinkat(w->dirfd, name, 0);
        return rc;
    }
    if (w->seg_fd >= 0) {
        if (w->seg_size > w->seg_bytes) /* give the zeros' space back */
            (void)!ftruncate(w->seg_fd, (off_t)w->seg_bytes);
        close(w->seg_fd);
        w->old_bytes += w->seg_bytes;
    }
    w->seg_fd = fd;
    w->seg_start = lsn;
    w->seg_bytes = 0;
    w->seg_size = size;
    pthread_mutex_lock(&w->mu);
    w->room = lsn + size;
    int was = w->refused;
    if (short_rc && !was)
        w->refused = short_rc;
    pthread_mutex_unlock(&w->mu);
    if (short_rc && !was)
        log_refused(w, 0, short_rc);
    return 0;
}

int kvp__wal_open(const char *dir, int fsync_mode, kvp__log_fn log, void *log_arg, int readonly,
                  struct kvp__wal **out, char *msg, size_t msglen)
{
    *out = NULL;
    if (!readonly && mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        snprintf(msg, msglen, "cannot create data directory %s: %s", dir, strerror(e));
        return -e;
    }
    struct kvp__wal *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        snprintf(msg, msglen, "out of memory");
        return -ENOMEM;
    }
    w->mode = fsync_mode;
    w->log = log;
    w->log_arg = log_arg;
    w->seg_fd = -1;
    w->lockfd = -1;
    w->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->dirfd < 0) {
        int e = errno;
        snprintf(msg, msglen, "cannot open data directory %s: %s", dir, strerror(e));
        free(w->dir);
        free(w);
        return -e;
    }
    /* A shared reader opens an existing LOCK read-only (none: no writer has
     * ever run here, nothing to keep out) and creates nothing. */
    int how = readonly == 2 ? LOCK_SH : LOCK_EX;
    if (!readonly)
        w->lockfd = openat(w->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    else if (readonly == 2)
        w->lockfd = openat(w->dirfd, "LOCK", O_RDONLY | O_CLOEXEC);
    /* A snapshot child of a server that was just killed dies with it, but
     * holds the lock it inherited until it is gone: give it a moment. */
    int locked =
        (readonly && w->lockfd < 0) || (w->lockfd >= 0 && flock(w->lockfd, how | LOCK_NB) == 0);
    for (int i = 0; !locked && w->lockfd >= 0 && errno == EWOULDBLOCK && i < 50; i++) {
        usleep(20000);
        locked = flock(w->lockfd, how | LOCK_NB) == 0;
    }
    if (!locked) {
        int e = errno;
        if (e == EWOULDBLOCK)
            snprintf(msg, msglen, "data directory %s is busy: in use by another kvpage process",
                     dir);
        else
            snprintf(msg, msglen, "cannot lock %s/LOCK: %s", dir, strerror(e));
        if (w->lockfd >= 0)
            close(w->lockfd);
        close(w->dirfd);
        free(w->dir);
        free(w);
        return e == EWOULDBLOCK ? -EBUSY : -e;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->io, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    *out = w;
    return 0;
}

const char *kvp__wal_dir(struct kvp__wal *w)
{
    return w->dir;
}

/* ---------------------------------------------------------------- listing */

struct seg {
    uint64_t lsn, size;
    char name[64];
};

static int cmp_seg(const void *a, const void *b)
{
    uint64_t x = ((const struct seg *)a)->lsn, y = ((const struct seg *)b)->lsn;
    return x < y ? -1 : x > y;
}

/* Lists files "<prefix><16 hex><suffix>", sorted by LSN. */
static int list_files(struct kvp__wal *w, const char *prefix, const char *suffix, struct seg **out,
                      size_t *n)
{
    *out = NULL;
    *n = 0;
    int fd = dup(w->dirfd);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    rewinddir(d);
    size_t cap = 0;
    struct dirent *e;
    size_t pl = strlen(prefix), sl = strlen(suffix);
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl != pl + 16 + sl || strncmp(e->d_name, prefix, pl) ||
            strcmp(e->d_name + pl + 16, suffix))
            continue;
        char hex[17];
        memcpy(hex, e->d_name + pl, 16);
        hex[16] = 0;
        char *end;
        uint64_t lsn = strtoull(hex, &end, 16);
        if (*end)
            continue;
        struct stat st;
        if (fstatat(w->dirfd, e->d_name, &st, 0) != 0)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            struct seg *s = realloc(*out, cap * sizeof *s);
            if (!s) {
                closedir(d);
                free(*out);
                *out = NULL;
                return -ENOMEM;
            }
            *out = s;
        }
        (*out)[*n].lsn = lsn;
        (*out)[*n].size = (uint64_t)st.st_size;
        /* A segment's name was parsed above, so it fits; the bounded copy
         * says so to the compiler (-Wformat-truncation at -O0). */
        size_t cp = nl < sizeof(*out)[*n].name - 1 ? nl : sizeof(*out)[*n].name - 1;
        memcpy((*out)[*n].name, e->d_name, cp);
        (*out)[*n].name[cp] = '\0';
        (*n)++;
    }
    closedir(d);
    if (*n)
        qsort(*out, *n, sizeof **out, cmp_seg);
    return 0;
}

int kvp__wal_snap_list(struct kvp__wal *w, uint64_t *lsns, int max)
{
    struct seg *s;
    size_t n;
    if (list_files(w, "snap-", ".snap", &s, &n) != 0)
        return 0;
    int k = 0;
    for (size_t i = n; i-- > 0 && k < max;)
        lsns[k++] = s[i].lsn;
    free(s);
    return k;
}

/* ---------------------------------------------------------------- replay */

/* Maps a whole file read-only (no copy); unmap with unmap_file. */
static int read_file(int dirfd, const char *name, uint8_t **buf, size_t *len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    *len = (size_t)st.st_size;
    *buf = NULL;
    if (*len) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = -errno;
            close(fd);
            return e;
        }
        *buf = p;
    }
    close(fd);
    return 0;
}

static void unmap_file(uint8_t *buf, size_t len)
{
    if (buf)
        munmap(buf, len);
}

/* Length of the valid record at p (header + payload), or 0 when torn/corrupt. */
static size_t record_at(const uint8_t *p, size_t avail)
{
    if (avail < KVP_WAL_HDR)
        return 0;
    uint32_t len = get32(p);
    if (len == 0 || len > KVP_WAL_MAX_RECORD || len > avail - KVP_WAL_HDR)
        return 0;
    if (XXH64(p + KVP_WAL_HDR, len, 0) != get64(p + 4))
        return 0;
    return KVP_WAL_HDR + len;
}

int kvp__wal_replay(struct kvp__wal *w, uint64_t from, int repair, kvp__wal_rec_fn fn, void *arg,
                    uint64_t *end)
{
    struct seg *segs;
    size_t n;
    int rc = list_files(w, "wal-", ".log", &segs, &n);
    if (rc)
        return rc;
    uint64_t pos = from; /* the stream is known to be intact up to here */
    *end = from;
    size_t i = 0;
    /* Segments wholly covered by the snapshot are skipped. */
    while (i + 1 < n && segs[i + 1].lsn <= from)
        i++;
    for (; i < n; i++) {
        struct seg *s = &segs[i];
        if (s->lsn > pos) {
            rc = -EUCLEAN;
            logf_(w, 0,
                  "wal: the log has a gap: %s starts at %" PRIu64
                  " but the log before it ends at %" PRIu64 "; refusing to guess what is missing",
                  s->name, s->lsn, pos);
            break;
        }
        uint8_t *buf = NULL;
        size_t len = 0;
        if ((rc = read_file(w->dirfd, s->name, &buf, &len)) != 0) {
            logf_(w, 0, "wal: cannot read %s/%s: %s", w->dir, s->name, strerror(-rc));
            break;
        }
        size_t off = 0;
        while (off < len) {
            size_t rl = record_at(buf + off, len - off);
            if (!rl)
                break;
            uint64_t rec_end = s->lsn + off + rl;
            if (rec_end > from) {
                rc = fn(arg, buf + off + KVP_WAL_HDR, (uint32_t)(rl - KVP_WAL_HDR), s->name, off);
                if (rc) {
                    unmap_file(buf, len);
                    free(segs);
                    return rc;
                }
            }
            off += rl;
        }
        int zero_tail = off < len && all_zero(buf + off, len - off); /* see ZERO_AHEAD */
        unmap_file(buf, len);
        if (s->lsn + off > pos)
            pos = s->lsn + off;
        if (off < len && !zero_tail) {
            uint64_t later = n - i - 1;
            logf_(w, 1,
                  "wal: torn or corrupt record at %s/%s offset %zu: dropped %zu bytes%s%" PRIu64
                  " later segment file(s))",
                  w->dir, s->name, off, len - off, " (and ", later);
            if (repair) {
                int fd = openat(w->dirfd, s->name, O_WRONLY | O_CLOEXEC);
                if (fd >= 0) {
                    if (ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0)
                        logf_(w, 0, "wal: cannot truncate %s: %s", s->name, strerror(errno));
                    close(fd);
                }
                for (size_t j = i + 1; j < n; j++) {
                    char to[80];
                    snprintf(to, sizeof to, "%s.dropped", segs[j].name);
                    renameat(w->dirfd, segs[j].name, w->dirfd, to);
                }
                fsync(w->dirfd);
            }
            break;
        }
    }
    free(segs);
    *end = pos;
    return rc;
}

static void snap_name(char name[64], uint64_t lsn)
{
    snprintf(name, 64, "snap-%016" PRIx64 ".snap", lsn);
}

int kvp__wal_snap_size(struct kvp__wal *w, uint64_t lsn, uint64_t *size)
{
    char name[64];
    snap_name(name, lsn);
    struct stat st;
    if (fstatat(w->dirfd, name, &st, 0) != 0)
        return -errno;
    *size = (uint64_t)st.st_size;
    return 0;
}

int kvp__wal_snap_read(struct kvp__wal *w, uint64_t lsn, kvp__wal_rec_fn fn, void *arg)
{
    char name[64];
    snap_name(name, lsn);
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_file(w->dirfd, name, &buf, &len);
    if (rc)
        return rc;
    size_t off = 0;
    while (off < len && !rc) {
        size_t rl = record_at(buf + off, len - off);
        if (!rl) {
            rc = -EUCLEAN;
            break;
        }
        rc = fn(arg, buf + off + KVP_WAL_HDR, (uint32_t)(rl - KVP_WAL_HDR), name, off);
        off += rl;
    }
    unmap_file(buf, len);
    return rc;
}

/* ---------------------------------------------------------------- appending */

static void *flusher_main(void *arg);

int kvp__wal_start(struct kvp__wal *w, uint64_t lsn)
{
    /* Snapshots a killed server never finished. */
    struct seg *tmp;
    size_t ntmp;
    if (list_files(w, "snap-", ".tmp", &tmp, &ntmp) == 0) {
        for (size_t i = 0; i < ntmp; i++)
            unlinkat(w->dirfd, tmp[i].name, 0);
        free(tmp);
    }
    pthread_mutex_lock(&w->io);
    int rc = open_segment(w, lsn, 1); /* on a full disk: start, refusing writes */
    pthread_mutex_unlock(&w->io);
    if (rc)
        return rc;
    struct seg *segs;
    size_t n;
    if (list_files(w, "wal-", ".log", &segs, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (segs[i].lsn != lsn)
                w->old_bytes += segs[i].size;
        free(segs);
    }
    w->appended = w->durable = lsn;
    /* always and never: each request writes its own records (kvp__wal_wait);
     * only batch has a flusher thread that gathers them for one fsync. */
    if (w->mode == KVP_FSYNC_BATCH) {
        if (pthread_create(&w->flusher, NULL, flusher_main, w) != 0)
            return -EAGAIN;
        w->started = 1;
    }
    return 0;
}

/*
 * Makes room for len more bytes of pending log, with w->mu held. On failure
 * the log is failed (nothing acknowledged may depend on a record that was not
 * kept), w->mu is released and 0 returned.
 */
static int reserve_locked(struct kvp__wal *w, size_t len)
{
    size_t need = w->len + len;
    if (need <= w->cap)
        return 1;
    size_t cap = w->cap ? w->cap : 1 << 16;
    while (cap < need)
        cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) {
        w->failed = -ENOMEM;
        pthread_mutex_unlock(&w->mu);
        logf_(w, 0, "wal: out of memory appending to the log; the log is failed");
        return 0;
    }
    w->buf = b;
    w->cap = cap;
    return 1;
}

/* Accounts for len bytes just placed at the end of the pending log, wakes the
 * flusher when they are the first, releases w->mu; returns the end LSN. */
static uint64_t appended_locked(struct kvp__wal *w, size_t len)
{
    int was_empty = w->len == 0;
    w->len += len;
    w->appended += len;
    uint64_t lsn = w->appended;
    if (was_empty && w->started)
        pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    return lsn;
}

uint64_t kvp__wal_append(struct kvp__wal *w, const void *payload, uint32_t len)
{
    pthread_mutex_lock(&w->mu);
    if (!reserve_locked(w, KVP_WAL_HDR + len))
        return UINT64_MAX;
    kvp__wal_frame(w->buf + w->len, payload, len);
    memcpy(w->buf + w->len + KVP_WAL_HDR, payload, len);
    return appended_locked(w, KVP_WAL_HDR + len);
}

uint64_t kvp__wal_append_framed(struct kvp__wal *w, const uint8_t *framed, size_t len,
                                uint64_t release)
{
    pthread_mutex_lock(&w->mu);
    w->reserved = w->reserved > release ? w->reserved - release : 0;
    if (!reserve_locked(w, len))
        return UINT64_MAX;
    memcpy(w->buf + w->len, framed, len);
    return appended_locked(w, len);
}

int kvp__wal_is_durable(struct kvp__wal *w, uint64_t lsn)
{
    pthread_mutex_lock(&w->mu);
    int done = lsn <= w->durable;
    pthread_mutex_unlock(&w->mu);
    return done;
}

uint64_t kvp__wal_appended(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t a = w->appended;
    pthread_mutex_unlock(&w->mu);
    return a;
}

uint64_t kvp__wal_disk_bytes(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->io);
    uint64_t b = w->old_bytes + w->seg_bytes;
    pthread_mutex_unlock(&w->io);
    return b;
}

void kvp__wal_fsync_stats(struct kvp__wal *w, uint64_t *count, uint64_t *total_ns)
{
    pthread_mutex_lock(&w->io);
    *count = w->fsyncs;
    *total_ns = w->fsync_ns;
    pthread_mutex_unlock(&w->io);
}

/*
 * Keeps ROOM_LOW of zeros ahead of what is appended and reserved (w->io
 * held). A failure here refuses nothing yet: the reservation that finds no
 * room tries again and is refused if it still cannot have it.
 */
static void keep_room(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t want = w->appended + w->reserved + ROOM_LOW;
    int short_of = w->room < want;
    pthread_mutex_unlock(&w->mu);
    if (short_of)
        (void)zero_ahead(w, want - w->seg_start);
}

/* Writes n bytes of records at the segment's end and (unless never) fsyncs
 * them (w->io held). 0 or a negative errno. */
static int write_records(struct kvp__wal *w, const uint8_t *b, size_t n)
{
    int rc = pwrite_all(w->seg_fd, b, n, w->seg_bytes);
    if (rc)
        return rc;
    w->seg_bytes += n;
    if (w->seg_bytes > w->seg_size)
        w->seg_size = w->seg_bytes; /* unreserved records past the zeros */
    keep_room(w);                   /* made durable by this fdatasync */
    if (w->mode != KVP_FSYNC_NEVER) {
        uint64_t t0 = kvp__mono_ns();
        if (fdatasync(w->seg_fd) != 0)
            rc = -errno;
        w->fsyncs++;
        w->fsync_ns += kvp__mono_ns() - t0;
    }
    return rc;
}

/*
 * Takes whatever is pending, writes it and (unless never) fsyncs it. Called
 * with w->io held; takes w->mu only briefly so appends continue meanwhile.
 * A rotation asked for by kvp__wal_rotate_at falls inside what is pending
 * (everything before it was written by earlier flushes): the records before
 * it end the current segment, which is synced, the new one is started, and
 * the rest go into it.
 */
static void flush_pending(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint8_t *b = w->buf;
    size_t bcap = w->cap, n = w->len;
    uint64_t end = w->appended;
    int failed = w->failed, rot = w->rot_pending;
    uint64_t rot_at = w->rot_at;
    w->rot_pending = 0;
    w->buf = w->spare;
    w->cap = w->spare_cap;
    w->len = 0;
    pthread_mutex_unlock(&w->mu);

    int rc = failed, rot_rc = 0;
    if (rot && (rot_at < end - n || rot_at > end)) {
        rot = 0; /* not inside what is pending: kvp__wal_rotate_at's rule was broken */
        rot_rc = -EINVAL;
    }
    size_t first = rot ? (size_t)(rot_at - (end - n)) : n; /* bytes before the rotation */
    if (!rc && first)
        rc = write_records(w, b, first);
    if (rot) {
        rot_rc = rc ? rc : open_segment(w, rot_at, 0);
        if (!rc && rot_rc) /* the current segment goes on; the snapshot waiting for it fails */
            logf_(w, 1, "wal: cannot start a new segment in %s: %s; the current one goes on",
                  w->dir, strerror(-rot_rc));
    }
    if (!rc && n > first)
        rc = write_records(w, b + first, n - first);
    if (rc && !failed)
        logf_(w, 0,
              "wal: writes refused: writing %s/wal-%016" PRIx64 ".log failed: %s; changes "
              "not yet durable are not acknowledged, and writes are refused until a snapshot "
              "covers them",
              w->dir, w->seg_start, strerror(-rc));
    if (!rc && w->seg_bytes >= SEGMENT_MAX && kvp__mono_ns() >= w->rotate_retry) {
        int orc = open_segment(w, end, 0);
        if (orc) { /* the segment grows past SEGMENT_MAX meanwhile: no harm */
            if (!w->rotate_retry)
                logf_(w, 1, "wal: cannot start a new segment in %s: %s; the current one goes on",
                      w->dir, strerror(-orc));
            w->rotate_retry = kvp__mono_ns() + ROTATE_RETRY_NS;
        } else {
            w->rotate_retry = 0;
        }
    }

    pthread_mutex_lock(&w->mu);
    if (rot || rot_rc)
        w->rot_rc = rot_rc;
    /* Appends went to the other buffer meanwhile; this one becomes the spare. */
    w->spare = b;
    w->spare_cap = bcap;
    if (rc && !w->failed)
        w->failed = rc;
    if (!w->failed)
        w->durable = end;
    /* Collect the waiters this flush satisfied (or failed). */
    struct waiter *fire = NULL;
    size_t nfire = 0;
    if (w->nwait) {
        fire = malloc(w->nwait * sizeof *fire);
        size_t keep = 0;
        for (size_t i = 0; i < w->nwait; i++) {
            if (fire && (w->failed || w->waiters[i].lsn <= w->durable))
                fire[nfire++] = w->waiters[i];
            else
                w->waiters[keep++] = w->waiters[i];
        }
        w->nwait = keep;
    }
    int status = w->failed;
    pthread_cond_broadcast(&w->done);
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < nfire; i++)
        fire[i].cb(fire[i].arg, status);
    free(fire);
}

static void *flusher_main(void *arg)
{
    pthread_setname_np(pthread_self(), "kvp-wal"); /* for top and perf */
    struct kvp__wal *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->stop && w->len == 0)
            pthread_cond_wait(&w->work, &w->mu);
        int stop = w->stop && w->len == 0;
        pthread_mutex_unlock(&w->mu);
        if (stop)
            return NULL;
        /* No pause to gather more: whatever arrives while this fsync runs
         * shares the next one (a 0.2 ms gather made no measurable difference
         * to throughput and added its time to every lone request). */
        pthread_mutex_lock(&w->io);
        flush_pending(w);
        pthread_mutex_unlock(&w->io);
    }
}

/* A position past everything appended (and not the mark of a failed
 * append, UINT64_MAX) is no ticket of this log: waiting would never end.
 * Called with w->mu held. */
static int beyond_end_locked(const struct kvp__wal *w, uint64_t lsn)
{
    return lsn != UINT64_MAX && lsn > w->appended;
}

int kvp__wal_wait(struct kvp__wal *w, uint64_t lsn)
{
    /* always: this request's own write and fsync; never: its own write (a
     * syscall is cheaper than handing the reply to the flusher and back). */
    if (w->mode == KVP_FSYNC_ALWAYS || w->mode == KVP_FSYNC_NEVER) {
        pthread_mutex_lock(&w->io);
        pthread_mutex_lock(&w->mu);
        int bad = beyond_end_locked(w, lsn);
        int need = !bad && w->durable < lsn && !w->failed;
        pthread_mutex_unlock(&w->mu);
        if (need)
            flush_pending(w);
        pthread_mutex_unlock(&w->io);
        if (bad)
            return -EINVAL;
    }
    pthread_mutex_lock(&w->mu);
    if (beyond_end_locked(w, lsn)) {
        pthread_mutex_unlock(&w->mu);
        return -EINVAL;
    }
    while (!w->failed && w->durable < lsn)
        pthread_cond_wait(&w->done, &w->mu);
    int rc = w->failed;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int kvp__wal_when_durable(struct kvp__wal *w, uint64_t lsn, void (*cb)(void *arg, int status),
                          void *arg)
{
    if (w->mode != KVP_FSYNC_BATCH) {
        int rc = kvp__wal_wait(w, lsn);
        return rc ? rc : 1;
    }
    pthread_mutex_lock(&w->mu);
    if (beyond_end_locked(w, lsn)) {
        pthread_mutex_unlock(&w->mu);
        return -EINVAL;
    }
    if (w->failed) {
        int rc = w->failed;
        pthread_mutex_unlock(&w->mu);
        return rc;
    }
    if (w->durable >= lsn) {
        pthread_mutex_unlock(&w->mu);
        return 1;
    }
    if (w->nwait == w->capwait) {
        size_t cap = w->capwait ? w->capwait * 2 : 64;
        struct waiter *nw = realloc(w->waiters, cap * sizeof *nw);
        if (!nw) {
            pthread_mutex_unlock(&w->mu);
            int rc = kvp__wal_wait(w, lsn); /* fall back to blocking */
            return rc ? rc : 1;
        }
        w->waiters = nw;
        w->capwait = cap;
    }
    w->waiters[w->nwait++] = (struct waiter){lsn, cb, arg};
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* ---------------------------------------------------------------- space */

static int no_space(int rc)
{
    return rc == -ENOSPC || rc == -EDQUOT;
}

/* Logs a change of w->refused from was to now (0: writes are taken). */
static void log_refused(struct kvp__wal *w, int was, int now)
{
    if (!was && now)
        logf_(w, 0,
              "wal: writes refused: cannot write the log in %s: %s; writes are refused until %s",
              w->dir, strerror(-now), no_space(now) ? "space is freed" : "the log can be written");
    else if (was && !now)
        logf_(w, 2, "wal: writes resume: the log in %s has room again", w->dir);
}

/*
 * With w->io held: room for keep + probe more bytes past what is appended and
 * reserved, writing zeros if need be; keep of them is reserved. 0 or the
 * negative errno that refused it.
 */
static int make_room(struct kvp__wal *w, uint64_t keep, uint64_t probe)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->failed, was = w->refused;
    uint64_t want = w->appended + w->reserved + keep + probe;
    pthread_mutex_unlock(&w->mu);
    /* Refused: only more zeros written show that there is space again
     * (what is left of the room does not, or writes would flap between
     * taken and refused with the size of the requests). */
    uint64_t have = w->seg_start + w->seg_size;
    if (was && want <= have)
        want = have + 1;
    int zr = 0;
    if (!rc && have < want)
        zr = zero_ahead(w, want - w->seg_start);
    pthread_mutex_lock(&w->mu);
    rc = w->failed;
    if (!rc && (!was || !zr) && w->appended + w->reserved + keep + probe <= w->room) {
        w->reserved += keep;
        w->refused = 0;
    } else {
        if (!rc)
            rc = w->refused = zr ? zr : -ENOSPC;
        w->refusals++;
    }
    int now = w->refused;
    pthread_mutex_unlock(&w->mu);
    log_refused(w, was, now);
    return rc;
}

int kvp__wal_reserve(struct kvp__wal *w, uint64_t keep, uint64_t probe)
{
    pthread_mutex_lock(&w->mu);
    if (!w->failed && !w->refused && w->appended + w->reserved + keep + probe <= w->room) {
        w->reserved += keep;
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    int rc = w->failed;
    if (rc)
        w->refusals++;
    pthread_mutex_unlock(&w->mu);
    if (rc)
        return rc;
    pthread_mutex_lock(&w->io);
    rc = make_room(w, keep, probe);
    pthread_mutex_unlock(&w->io);
    return rc;
}

void kvp__wal_release(struct kvp__wal *w, uint64_t bytes)
{
    pthread_mutex_lock(&w->mu);
    w->reserved = w->reserved > bytes ? w->reserved - bytes : 0;
    pthread_mutex_unlock(&w->mu);
}

int kvp__wal_status(struct kvp__wal *w, int *failed, uint64_t *refusals)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->failed ? w->failed : w->refused;
    if (failed)
        *failed = w->failed != 0;
    if (refusals)
        *refusals = w->refusals;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int kvp__wal_retry(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->failed ? w->failed : w->refused;
    pthread_mutex_unlock(&w->mu);
    if (!rc || w->seg_fd < 0)
        return rc;
    pthread_mutex_lock(&w->io);
    rc = make_room(w, 0, ROOM_LOW);
    pthread_mutex_unlock(&w->io);
    return rc;
}

int kvp__wal_resume(struct kvp__wal *w, uint64_t lsn)
{
    pthread_mutex_lock(&w->io);
    pthread_mutex_lock(&w->mu);
    int ok = w->failed && w->appended == lsn;
    if (ok)
        w->len = 0; /* not written, and covered by the snapshot at lsn */
    pthread_mutex_unlock(&w->mu);
    int rc = ok ? open_segment(w, lsn, 0) : -EAGAIN;
    if (!rc) {
        pthread_mutex_lock(&w->mu);
        w->failed = 0;
        w->refused = 0;
        w->durable = lsn;
        pthread_cond_broadcast(&w->done);
        pthread_mutex_unlock(&w->mu);
        logf_(w, 2,
              "wal: writes resume: a snapshot at %" PRIu64 " covers every change, the log goes on "
              "in %s/wal-%016" PRIx64 ".log",
              lsn, w->dir, lsn);
    }
    pthread_mutex_unlock(&w->io);
    return rc;
}

/* ---------------------------------------------------------------- snapshots */

int kvp__wal_snap_create(const char *dir, uint64_t lsn)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/snap-%016" PRIx64 ".tmp", dir, lsn);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd < 0 ? -errno : fd;
}

void kvp__wal_snap_abort(const char *dir, uint64_t lsn, int fd)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/snap-%016" PRIx64 ".tmp", dir, lsn);
    if (fd >= 0)
        close(fd);
    unlink(path);
}

int kvp__wal_snap_commit(const char *dir, uint64_t lsn, int fd)
{
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/snap-%016" PRIx64 ".tmp", dir, lsn);
    snprintf(to, sizeof to, "%s/snap-%016" PRIx64 ".snap", dir, lsn);
    if (fsync(fd) != 0) {
        int e = -errno;
        close(fd);
        unlink(from);
        return e;
    }
    close(fd);
    if (rename(from, to) != 0) {
        int e = -errno;
        unlink(from);
        return e;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int kvp__wal_rotate_at(struct kvp__wal *w, uint64_t lsn)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->failed;
    if (!rc && lsn != w->appended)
        rc = -EINVAL; /* the caller holds appends off: this is a bug */
    if (!rc) {
        w->rot_pending = 1;
        w->rot_at = lsn;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int kvp__wal_rotate_finish(struct kvp__wal *w)
{
    pthread_mutex_lock(&w->io); /* a flush that took the rotation is over */
    pthread_mutex_lock(&w->mu);
    int pending = w->rot_pending;
    pthread_mutex_unlock(&w->mu);
    if (pending)
        flush_pending(w);
    pthread_mutex_lock(&w->mu);
    int rc = w->rot_rc; /* no space: the snapshot waits, the log goes on */
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_unlock(&w->io);
    return rc;
}

int kvp__wal_rotate(struct kvp__wal *w, uint64_t lsn)
{
    int rc = kvp__wal_rotate_at(w, lsn);
    return rc ? rc : kvp__wal_rotate_finish(w);
}

void kvp__wal_prune(struct kvp__wal *w, uint64_t lsn)
{
    struct seg *snaps, *segs;
    size_t ns, nseg;
    if (list_files(w, "snap-", ".snap", &snaps, &ns) == 0) {
        for (size_t i = 0; i < ns; i++)
            if (snaps[i].lsn < lsn)
                unlinkat(w->dirfd, snaps[i].name, 0);
        free(snaps);
    }
    if (list_files(w, "wal-", ".log", &segs, &nseg) != 0)
        return;
    uint64_t removed = 0;
    pthread_mutex_lock(&w->io);
    /* The log was rotated at lsn: every segment that starts before it ends
     * at or before it, and the snapshot covers it. */
    for (size_t i = 0; i < nseg; i++)
        if (segs[i].lsn < lsn && segs[i].lsn != w->seg_start &&
            unlinkat(w->dirfd, segs[i].name, 0) == 0)
            removed += segs[i].size;
    w->old_bytes = w->old_bytes > removed ? w->old_bytes - removed : 0;
    pthread_mutex_unlock(&w->io);
    free(segs);
    fsync(w->dirfd);
}

void kvp__wal_close(struct kvp__wal *w)
{
    if (!w)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->flusher, NULL);
    }
    if (w->seg_fd >= 0) {
        pthread_mutex_lock(&w->io);
        flush_pending(w);
        if (w->seg_size > w->seg_bytes && !w->failed) /* drop the zeros ahead */
            (void)!ftruncate(w->seg_fd, (off_t)w->seg_bytes);
        if (w->mode != KVP_FSYNC_NEVER)
            fdatasync(w->seg_fd);
        pthread_mutex_unlock(&w->io);
        close(w->seg_fd);
    }
    free(w->buf);
    free(w->spare);
    free(w->waiters);
    if (w->lockfd >= 0) {
        flock(w->lockfd, LOCK_UN);
        close(w->lockfd);
    }
    close(w->dirfd);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->io);
    pthread_cond_destroy(&w->work);
    pthread_cond_destroy(&w->done);
    free(w->dir);
    free(w);
}
