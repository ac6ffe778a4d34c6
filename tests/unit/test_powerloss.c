/*
 * Power loss, simulated: after a power cut only what an fsync or fdatasync
 * covered survives (POSIX's promise, and no more). The SIGKILL tests cannot
 * see a missing fsync (the page cache survives a killed process); this one
 * can.
 *
 * fsync and fdatasync are wrapped at link time (-Wl,--wrap, CMakeLists.txt).
 * Each successful call records what it made durable in a shadow directory:
 * a file's content as it was when the call began, under its inode number; a
 * directory's listing (name -> inode). A cut builds the directory a machine
 * would find after losing power at that moment: the names of the last synced
 * listing, each with the content last synced under its inode (empty if none).
 * Snapshots are written by a forked child; its calls record into the same
 * shadow directory, under a lock file taken afresh each time (a descriptor
 * inherited across fork would share the lock).
 *
 * A writer confirms keys one at a time, each acknowledged only once durable
 * (as the server does), with snapshots every 97 keys and whenever 64 KiB of
 * log has grown, so cuts land between log writes, segment rotations, snapshot
 * renames and pruning. Removing the directory fsync of a new segment, or the
 * flusher's fdatasync, makes it fail. Every
 * cut must recover, keep every key acknowledged before it with its page, and
 * hold every invariant.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"
#include "meta/local/meta_int.h"

int __real_fsync(int fd);
int __real_fdatasync(int fd);

static char shadow[256];  /* empty: not recording */
static char watched[256]; /* the data directory: only its files are recorded */

static int lock_shadow(void)
{
    char p[300];
    snprintf(p, sizeof p, "%s/LOCK", shadow);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        flock(fd, LOCK_EX);
    return fd;
}

static void unlock_shadow(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

/* Writes len bytes to shadow/name through a temporary name. */
static void put_shadow(const char *name, const void *p, size_t len)
{
    char tmp[400], dst[400];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", shadow, name);
    snprintf(dst, sizeof dst, "%s/%s", shadow, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        abort();
    size_t off = 0;
    while (off < len) {
        ssize_t r = write(fd, (const char *)p + off, len - off);
        if (r <= 0)
            abort();
        off += (size_t)r;
    }
    close(fd);
    rename(tmp, dst);
}

/* What fd holds now: a regular file's bytes, or a directory's "inode name" lines. */
static char *capture(int fd, int *is_dir, size_t *len)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return NULL;
    *is_dir = S_ISDIR(st.st_mode);
    if (!*is_dir) { /* through a descriptor of our own: the log's is write-only */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int rfd = open(path, O_RDONLY | O_CLOEXEC);
        char *b = malloc((size_t)st.st_size + 1);
        size_t n = 0;
        ssize_t r = 1;
        while (rfd >= 0 && b && n < (size_t)st.st_size &&
               (r = pread(rfd, b + n, (size_t)st.st_size - n, (off_t)n)) > 0)
            n += (size_t)r;
        if (rfd >= 0)
            close(rfd);
        if (rfd < 0 || r < 0)
            abort(); /* the model would silently lose data */
        *len = n;
        return b;
    }
    int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d)
        return NULL;
    rewinddir(d);
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    struct dirent *e;
    while (b && (e = readdir(d))) {
        struct stat es;
        if (fstatat(fd, e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(es.st_mode))
            continue;
        if (n + 300 > cap)
            b = realloc(b, cap *= 2);
        if (b)
            n += (size_t)snprintf(b + n, cap - n, "%" PRIu64 " %s\n", (uint64_t)es.st_ino,
                                  e->d_name);
    }
    closedir(d);
    *len = n;
    return b;
}

/* 1 when fd is the watched directory or a file in it (the checks of each cut
 * open the cut itself, whose fsyncs are not the data directory's). */
static int is_watched(int fd)
{
    char link[64], path[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = 0;
    size_t w = strlen(watched);
    return !strncmp(path, watched, w) &&
           (path[w] == 0 || (path[w] == '/' && !strchr(path + w + 1, '/')));
}

static int synced(int fd, int (*real)(int))
{
    if (!shadow[0] || !is_watched(fd))
        return real(fd);
    struct stat st;
    int is_dir = 0;
    size_t len = 0;
    char *b = fstat(fd, &st) == 0 ? capture(fd, &is_dir, &len) : NULL;
    int rc = real(fd);
    if (rc == 0 && b) {
        char name[64];
        if (is_dir)
            snprintf(name, sizeof name, "listing");
        else
            snprintf(name, sizeof name, "ino-%" PRIu64, (uint64_t)st.st_ino);
        int lk = lock_shadow();
        put_shadow(name, b, len);
        unlock_shadow(lk);
    }
    free(b);
    return rc;
}

int __wrap_fsync(int fd)
{
    return synced(fd, __real_fsync);
}

int __wrap_fdatasync(int fd)
{
    return synced(fd, __real_fdatasync);
}

static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(out >= 0);
    char buf[1 << 16];
    ssize_t r;
    while (in >= 0 && (r = read(in, buf, sizeof buf)) > 0)
        CHECK_EQ(write(out, buf, (size_t)r), r);
    if (in >= 0)
        close(in);
    close(out);
}

static int cuts_with_snapshot; /* cuts whose directory held a snapshot */

/* The directory a power cut now would leave, built at dst. */
static void cut(const char *dst)
{
    int snap = 0;
    int lk = lock_shadow();
    mkdir(dst, 0755);
    char p[400], q[400];
    snprintf(p, sizeof p, "%s/listing", shadow);
    FILE *f = fopen(p, "r");
    uint64_t ino;
    char name[256];
    while (f && fscanf(f, "%" SCNu64 " %255s", &ino, name) == 2) {
        snprintf(p, sizeof p, "%s/ino-%" PRIu64, shadow, ino);
        snprintf(q, sizeof q, "%s/%s", dst, name);
        copy_file(p, q); /* never synced: empty */
        snap |= !strncmp(name, "snap-", 5) && strstr(name, ".snap") != NULL;
    }
    cuts_with_snapshot += snap;
    if (f)
        fclose(f);
    unlock_shadow(lk);
}

#define NKEYS 600
#define NCUTS 30

static void key_name(int i, char *k, size_t n)
{
    snprintf(k, n, "powerloss-key-%05d", i);
}

static void check_cut(const char *dir, int acked, const int64_t *pages)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_BATCH;
    o.read_grace_ms = 0;
    struct kvp_meta *m = NULL;
    int rc = kvp_meta_open(&o, &m);
    if (rc)
        fprintf(stderr, "cut %s after %d acknowledged keys does not recover (%d)\n", dir, acked,
                rc);
    CHECK_EQ(rc, 0);
    if (rc)
        return;
    invariants(m);
    struct kvp_ns *ns = NULL;
    kvp_meta_ns(m, "default", 7, "kv", 2, 0, &ns, NULL);
    if (acked > 0)
        CHECK(ns != NULL);
    char k[64];
    int lost = 0;
    for (int i = 0; ns && i < NKEYS; i++) {
        key_name(i, k, sizeof k);
        struct kvp_str ks = K(k);
        int64_t p = kvp__meta_peek(ns, 0, &ks);
        if (i < acked && p != pages[i])
            lost++;
        if (i >= acked && p >= 0)
            CHECK_EQ(p, pages[i]); /* not acknowledged yet: absent or right */
    }
    if (lost)
        fprintf(stderr, "cut %s: %d of %d acknowledged keys lost\n", dir, lost, acked);
    CHECK_EQ(lost, 0);
    kvp_meta_close(m);
}

int main(void)
{
    char base[200], data[256];
    scratch_make(base, sizeof base, "powerloss", 0);
    snprintf(shadow, sizeof shadow, "%s/shadow", base);
    snprintf(data, sizeof data, "%s/data", base);
    snprintf(watched, sizeof watched, "%s", data);
    mkdir(shadow, 0755);

    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = data;
    o.fsync = KVP_FSYNC_BATCH;
    o.read_grace_ms = 0;
    o.snapshot_bytes = 64 << 10;
    struct kvp_meta *m = NULL;
    CHECK_EQ(kvp_meta_open(&o, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, NKEYS + 10, NULL), 0);

    static int64_t pages[NKEYS];
    int cuts = 0, snaps = 0;
    char k[64], img[300];
    for (int i = 0; i < NKEYS; i++) {
        key_name(i, k, sizeof k);
        pages[i] = put(ns, 0, k);
        CHECK(pages[i] >= 0);
        /* put returned: acknowledged (the calls return once durable) */
        if (i % 97 == 50) { /* and some snapshots at chosen moments */
            CHECK_EQ(kvp_meta_snapshot(m), 0);
            snaps++;
        }
        if (i % (NKEYS / NCUTS) == NKEYS / NCUTS - 1) {
            snprintf(img, sizeof img, "%s/cut-%03d", base, cuts++);
            cut(img);
            check_cut(img, i + 1, pages);
            rmrf(img);
        }
    }
    /* A cut right after a snapshot was taken, before anything else is logged. */
    CHECK_EQ(kvp_meta_snapshot(m), 0);
    snprintf(img, sizeof img, "%s/cut-last", base);
    cut(img);
    check_cut(img, NKEYS, pages);
    rmrf(img);
    kvp_meta_close(m);
    shadow[0] = 0;
    CHECK_EQ(cuts, NCUTS);
    CHECK(snaps > 0);

    /* The cuts were not vacuous: most recovered from a snapshot and its log. */
    CHECK(cuts_with_snapshot > NCUTS / 2);

    char p[300];
    snprintf(p, sizeof p, "%s/shadow", base);
    rmrf(p);
    rmrf(data);
    rmrf(base);
    return check_report();
}
