/*
 * Snapshot modes (kvpage/meta.h: KVP_SNAPSHOT_FORK, _THREAD, _MANUAL):
 *  - per mode, a writer that snapshots (by the log's growth, or by hand in
 *    MANUAL), writes more and crashes; recovery gives every key its page.
 *    THREAD and MANUAL never fork (pthread_atfork counts the forks of the
 *    writer's process); MANUAL never writes a snapshot by itself;
 *  - the three modes write the same bytes for the same history;
 *  - THREAD and MANUAL: changes made while the snapshot is being written
 *    (deletes whose entries new keys would reuse, entries grown for a new
 *    rank, a clear, a new namespace) are not in it: the snapshot alone
 *    recovers the state at its position, the log after it the rest (those
 *    changes are logged before the log's rotation is finished, so their
 *    records must land in the new segment, not in the one it prunes);
 *  - THREAD: writer threads confirm, evict and delete while snapshots are
 *    taken, then the process crashes; recovery matches and checks.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"
#include "meta/local/meta_int.h"
#include "mono.h"

static char base[256];
static const char *const mode_name[] = {"", "fork", "thread", "manual"};

/* Forks made by this process since the counter was last reset. */
static atomic_int forks;
static void count_fork(void)
{
    atomic_fetch_add(&forks, 1);
}

static uint64_t fixed_clock(void *arg)
{
    (void)arg;
    return 1000;
}

static int open_mode(const char *dir, int mode, uint64_t snapshot_bytes, int readonly,
                     int fixed_time, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_BATCH;
    o.snapshot_mode = mode;
    o.snapshot_bytes = snapshot_bytes;
    o.readonly = readonly;
    o.read_grace_ms = 0;
    if (fixed_time)
        o.clock = fixed_clock;
    return kvp_meta_open(&o, m);
}

struct value_q {
    const char *key;
    uint64_t v;
};
static int value_cb(const struct kvp_meta_value *v, void *arg)
{
    struct value_q *q = arg;
    if (!strcmp(v->section, "wal") && !strcmp(v->key, q->key))
        q->v = v->value;
    return 0;
}
/* Snapshots this handle has written (kvp_meta_values: wal.snapshots). */
static uint64_t snapshots_of(struct kvp_meta *m)
{
    struct value_q q = {"snapshots", UINT64_MAX};
    kvp_meta_values(m, value_cb, &q);
    return q.v;
}

/* The snapshot files in dir; *newest gets the name of the newest. */
static int snap_files(const char *dir, char *newest, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (newest)
        newest[0] = 0;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "snap-", 5) || l < 5 || strcmp(e->d_name + l - 5, ".snap"))
            continue;
        n++;
        if (newest && strcmp(e->d_name, newest) > 0) /* fixed-width hex: names sort by LSN */
            snprintf(newest, len, "%s", e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

/* Copies file name from dir a to dir b. 0 or -1. */
static int copy_file(const char *a, const char *b, const char *name)
{
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    int in = open(pa, O_RDONLY), out = open(pb, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[1 << 16];
    ssize_t r = 0;
    while (in >= 0 && out >= 0 && (r = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)r) != r)
            r = -1;
    int rc = in >= 0 && out >= 0 && r == 0 ? 0 : -1;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

/* Copies the snapshots (and, with logs, the log segments) of dir a into a fresh dir b. */
static int copy_dir(const char *a, const char *b, int logs)
{
    rmrf(b);
    if (mkdir(b, 0755) != 0)
        return -1;
    DIR *d = opendir(a);
    struct dirent *e;
    int rc = 0;
    while (d && (e = readdir(d)))
        if ((!strncmp(e->d_name, "snap-", 5) && strstr(e->d_name, ".snap")) ||
            (logs && !strncmp(e->d_name, "wal-", 4) && strstr(e->d_name, ".log")))
            rc |= copy_file(a, b, e->d_name);
    if (d)
        closedir(d);
    return rc;
}

static int64_t peek(struct kvp_ns *ns, uint32_t rank, const char *key)
{
    struct kvp_str k = K(key);
    return kvp__meta_peek(ns, rank, &k);
}

/* Key i: a third are 64 lowercase hex digits (stored as their bytes), the
 * rest plain strings. */
static void key_name(char *out, size_t n, const char *prefix, int i)
{
    if (i % 3 == 0) {
        uint64_t x = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
        for (int j = 0; j < 64 && (size_t)j + 1 < n; j++) {
            x ^= x >> 29;
            x *= 0xBF58476D1CE4E5B9ull;
            out[j] = "0123456789abcdef"[(x >> 60) & 15];
            out[j + 1] = 0;
        }
        out[0] = prefix[0] == 'n' ? 'a' : 'b'; /* two prefixes, two sets of hex keys */
    } else {
        snprintf(out, n, "%s-%05d", prefix, i);
    }
}

/* Moves n bytes through a pipe: writes them (out != 0) or reads them. 0 or -1. */
static int pipe_all(int fd, void *p, size_t n, int out)
{
    char *c = p;
    while (n) {
        ssize_t r = out ? write(fd, c, n) : read(fd, c, n);
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Runs fn(dir, mode, fd) in a child that writes its report (len bytes) to
 * fd and _exits (a crash: the store is never closed); reads the report. */
static void in_child(void (*fn)(const char *dir, int mode, int fd), const char *dir, int mode,
                     void *report, size_t len)
{
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        fn(dir, mode, fds[1]);
        _exit(1);
    }
    close(fds[1]);
    CHECK_EQ(pipe_all(fds[0], report, len, 0), 0);
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---------------------------------------------------------------- a crash per mode */

enum { NK = 600 };

/* What the crashed writer reports. */
struct crash_report {
    int status; /* 0, or the step that failed */
    int forks;
    uint64_t snapshots_after_first, snapshots_at_end;
    int64_t page[NK];
};

/* Waits (up to 10 s) until the handle has written n snapshots. */
static int wait_snapshots(struct kvp_meta *m, uint64_t n)
{
    for (int i = 0; i < 500; i++) {
        if (snapshots_of(m) >= n)
            return 0;
        sleep_ms(20);
    }
    return -1;
}

static void crash_child(const char *dir, int mode, int fd)
{
    static struct crash_report r;
    memset(&r, 0, sizeof r);
    atomic_store(&forks, 0);
    /* FORK and THREAD snapshot by the log's growth; MANUAL is given a
     * threshold it passes many times over and must ignore. */
    uint64_t bytes = mode == KVP_SNAPSHOT_MANUAL ? 1 : 8 << 10;
    struct kvp_meta *m;
    if (open_mode(dir, mode, bytes, 0, 0, &m) != 0) {
        r.status = 1;
        goto out;
    }
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    kvp_meta_init_rank(ns, 0, NK + 8, NULL);
    char k[80];
    for (int i = 0; i < NK; i++)
        r.page[i] = -1;
    for (int i = 0; i < NK / 2; i++) {
        key_name(k, sizeof k, "key", i);
        if ((r.page[i] = put(ns, 0, k)) < 0)
            r.status = 2;
    }
    if (mode == KVP_SNAPSHOT_MANUAL) {
        if (kvp_meta_snapshot(m) != 0)
            r.status = 3;
        sleep_ms(700); /* several rounds of the snapshot thread */
    } else if (wait_snapshots(m, 1) != 0) {
        r.status = 4;
    }
    r.snapshots_after_first = snapshots_of(m);
    for (int i = 0; i < NK / 2; i += 5) { /* FREE records after the snapshot */
        key_name(k, sizeof k, "key", i);
        struct kvp_str ks = K(k);
        if (kvp_meta_delete(ns, 0, &ks, 1, NULL) != 0)
            r.status = 5;
        r.page[i] = -1;
    }
    for (int i = NK / 2; i < NK; i++) {
        key_name(k, sizeof k, "key", i);
        if ((r.page[i] = put(ns, 0, k)) < 0)
            r.status = 6;
        if (i == NK * 3 / 4 && mode == KVP_SNAPSHOT_THREAD && kvp_meta_snapshot(m) != 0)
            r.status = 7; /* asked for, in THREAD mode: the snapshot thread writes it */
    }
    if (mode == KVP_SNAPSHOT_MANUAL)
        sleep_ms(500);
    r.snapshots_at_end = snapshots_of(m);
out:
    r.forks = atomic_load(&forks);
    pipe_all(fd, &r, sizeof r, 1);
    _exit(0); /* a crash: nothing is closed */
}

static void test_crash_per_mode(int mode)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/crash-%s", base, mode_name[mode]);
    static struct crash_report r;
    in_child(crash_child, dir, mode, &r, sizeof r);
    CHECK_EQ(r.status, 0);
    if (mode == KVP_SNAPSHOT_FORK) {
        CHECK(r.forks >= 1); /* the counter does count the library's forks */
    } else {
        CHECK_EQ(r.forks, 0);
    }
    if (mode == KVP_SNAPSHOT_MANUAL) {
        CHECK_EQ(r.snapshots_after_first, 1); /* the one asked for, no other */
        CHECK_EQ(r.snapshots_at_end, 1);
        CHECK_EQ(snap_files(dir, NULL, 0), 1);
    } else {
        CHECK(r.snapshots_after_first >= 1);
        CHECK(r.snapshots_at_end >= r.snapshots_after_first + (mode == KVP_SNAPSHOT_THREAD));
        CHECK(snap_files(dir, NULL, 0) >= 1);
    }

    /* Recovery in the same mode: the newest snapshot and the log after it. */
    int before = atomic_load(&forks);
    struct kvp_meta *m;
    CHECK_EQ(open_mode(dir, mode, UINT64_MAX, 0, 0, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    char k[80];
    int wrong = 0;
    for (int i = 0; i < NK; i++) {
        key_name(k, sizeof k, "key", i);
        wrong += peek(ns, 0, k) != r.page[i];
    }
    CHECK_EQ(wrong, 0);
    invariants(m);
    int64_t after = put(ns, 0, "after");
    CHECK(after >= 0);
    kvp_meta_close(m); /* the final snapshot: written here, in every mode */
    if (mode != KVP_SNAPSHOT_FORK)
        CHECK_EQ(atomic_load(&forks), before);

    /* From the final snapshot alone (the log before it is pruned). */
    CHECK_EQ(open_mode(dir, mode, UINT64_MAX, 1, 0, &m), 0);
    ns = ns_of(m, "default", "kv");
    wrong = 0;
    for (int i = 0; i < NK; i++) {
        key_name(k, sizeof k, "key", i);
        wrong += peek(ns, 0, k) != r.page[i];
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(peek(ns, 0, "after"), after);
    kvp_meta_close(m);
    rmrf(dir);
}

/* ---------------------------------------------------------------- the same bytes */

/* A history with two namespaces, ranks added after their keys, evictions,
 * deletes, a clear and lookups that reorder the LRU: the same in every mode
 * (the clock is fixed, so leases and grace are too). */
static void history(struct kvp_meta *m)
{
    struct kvp_ns *a = ns_of(m, "default", "kv"), *b = ns_of(m, "qwen", "mamba");
    kvp_meta_init_rank(a, 0, 40, NULL);
    kvp_meta_init_rank(b, 3, 16, NULL);
    char k[80];
    for (int i = 0; i < 60; i++) { /* 60 keys on 40 pages: 20 evictions */
        key_name(k, sizeof k, "key", i);
        put(a, 0, k);
        if (i % 4 == 0)
            put(b, 3, k);
    }
    kvp_meta_init_rank(a, 1, 30, NULL);
    for (int i = 40; i < 60; i += 2) { /* entries grow a page slot for rank 1 */
        key_name(k, sizeof k, "key", i);
        put(a, 1, k);
    }
    for (int i = 41; i < 60; i += 5) {
        key_name(k, sizeof k, "key", i);
        struct kvp_str ks = K(k);
        kvp_meta_delete(a, -1, &ks, 1, NULL);
    }
    struct kvp_str q[3];
    char qk[3][80];
    for (int i = 0; i < 3; i++) {
        key_name(qk[i], sizeof qk[i], "key", 50 - 4 * i);
        q[i] = K(qk[i]);
    }
    int64_t got[3];
    kvp_meta_lookup(a, 0, 0, q, 3, got, NULL);
    kvp_meta_init_rank(b, 9, 8, NULL);
    put(b, 9, "gone");
    kvp_meta_clear(b, 9, NULL);
    put(b, 9, "kept");
}

static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(*buf, 1, (size_t)n, f);
    fclose(f);
    return *len == (size_t)n ? 0 : -1;
}

static void test_same_bytes(void)
{
    char *snap[4] = {0};
    size_t len[4] = {0};
    char name[4][64];
    for (int mode = KVP_SNAPSHOT_FORK; mode <= KVP_SNAPSHOT_MANUAL; mode++) {
        char dir[300], path[400];
        snprintf(dir, sizeof dir, "%s/bytes-%s", base, mode_name[mode]);
        struct kvp_meta *m;
        CHECK_EQ(open_mode(dir, mode, UINT64_MAX, 0, 1, &m), 0);
        history(m);
        CHECK_EQ(kvp_meta_snapshot(m), 0);
        CHECK_EQ(snap_files(dir, name[mode], sizeof name[mode]), 1);
        snprintf(path, sizeof path, "%s/%s", dir, name[mode]);
        CHECK_EQ(read_file(path, &snap[mode], &len[mode]), 0);
        kvp_meta_close(m);
        rmrf(dir);
    }
    CHECK(len[KVP_SNAPSHOT_FORK] > 1000);
    for (int mode = KVP_SNAPSHOT_THREAD; mode <= KVP_SNAPSHOT_MANUAL; mode++) {
        CHECK(!strcmp(name[mode], name[KVP_SNAPSHOT_FORK])); /* the same log position */
        CHECK_EQ(len[mode], len[KVP_SNAPSHOT_FORK]);
        CHECK(len[mode] == len[KVP_SNAPSHOT_FORK] &&
              !memcmp(snap[mode], snap[KVP_SNAPSHOT_FORK], len[mode]));
    }
    for (int i = 0; i < 4; i++)
        free(snap[i]);
}

/* ---------------------------------------------------------------- changes while it is written */

enum { NA = 40 };

struct during {
    struct kvp_meta *m;
    pthread_t caller;
    int ran, other_thread;
};

/* Every way a namespace drops or replaces a key entry, while the snapshot
 * thread is about to encode from its copy of the page arrays. */
static void change_during_write(void *arg)
{
    struct during *d = arg;
    d->ran++;
    d->other_thread = !pthread_equal(pthread_self(), d->caller);
    struct kvp_ns *a = ns_of(d->m, "default", "kv"), *b = ns_of(d->m, "qwen", "mamba");
    char k[80];
    for (int i = 0; i < 10; i++) { /* dropped entries, and new keys of the same sizes */
        key_name(k, sizeof k, "key", i);
        struct kvp_str ks = K(k);
        kvp_meta_delete(a, -1, &ks, 1, NULL);
        key_name(k, sizeof k, "new", i);
        put(a, 0, k);
    }
    kvp_meta_init_rank(a, 1, 16, NULL);
    for (int i = 10; i < 20; i++) { /* grown entries: the old ones are dropped */
        key_name(k, sizeof k, "key", i);
        put(a, 1, k);
    }
    kvp_meta_clear(b, 0, NULL);
    kvp_meta_init_rank(b, 0, 4, NULL); /* a resize, now that it is empty */
    put(b, 0, "after");
    struct kvp_ns *c = ns_of(d->m, "late", "kv");
    kvp_meta_init_rank(c, 0, 4, NULL);
    put(c, 0, "x");
    struct kvp_ns *g = ns_of(d->m, "gone", "kv"); /* every key at once: a clear of all ranks */
    kvp_meta_clear(g, -1, NULL);
    put(g, 0, "back");
}

struct expect {
    int64_t a0[NA], a1[NA], b0[NA], newk[NA];
};

static void expect_now(struct kvp_meta *m, struct expect *e)
{
    struct kvp_ns *a = ns_of(m, "default", "kv"), *b = ns_of(m, "qwen", "mamba");
    char k[80];
    for (int i = 0; i < NA; i++) {
        key_name(k, sizeof k, "key", i);
        e->a0[i] = peek(a, 0, k);
        e->a1[i] = peek(a, 1, k);
        e->b0[i] = peek(b, 0, k);
        key_name(k, sizeof k, "new", i);
        e->newk[i] = peek(a, 0, k);
    }
}

/* The recovered state is e, with the namespace "late" iff late. */
static void check_expect(const char *dir, const struct expect *e, int late)
{
    struct kvp_meta *m;
    CHECK_EQ(open_mode(dir, KVP_SNAPSHOT_FORK, UINT64_MAX, 1, 0, &m), 0);
    if (!m)
        return;
    invariants(m);
    struct expect got;
    struct kvp_ns *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ(kvp_meta_ns(m, "default", 7, "kv", 2, 0, &a, NULL), 0);
    CHECK_EQ(kvp_meta_ns(m, "qwen", 4, "mamba", 5, 0, &b, NULL), 0);
    CHECK_EQ(kvp_meta_ns(m, "late", 4, "kv", 2, 0, &c, NULL), late ? 0 : -ENOENT);
    expect_now(m, &got);
    int wrong = 0;
    for (int i = 0; i < NA; i++)
        wrong += got.a0[i] != e->a0[i] || got.a1[i] != e->a1[i] || got.b0[i] != e->b0[i] ||
                 got.newk[i] != e->newk[i];
    CHECK_EQ(wrong, 0);
    CHECK_EQ(kvp_meta_nranks(a), late ? 2 : 1);
    if (late)
        CHECK(peek(b, 0, "after") >= 0 && peek(c, 0, "x") >= 0);
    struct kvp_ns *g = NULL;
    CHECK_EQ(kvp_meta_ns(m, "gone", 4, "kv", 2, 0, &g, NULL), 0);
    if (g) {
        char k[80];
        int held = 0;
        for (int i = 0; i < NA; i++) {
            key_name(k, sizeof k, "key", i);
            held += peek(g, 0, k) >= 0;
        }
        CHECK_EQ(held, late ? 0 : NA); /* all of them at the snapshot, none after the clear */
        CHECK_EQ(peek(g, 0, "back") >= 0, late);
    }
    kvp_meta_close(m);
}

static void test_changes_during_write(int mode)
{
    char dir[300], only_snap[320], all[320];
    snprintf(dir, sizeof dir, "%s/during-%s", base, mode_name[mode]);
    snprintf(only_snap, sizeof only_snap, "%s.snap", dir);
    snprintf(all, sizeof all, "%s.all", dir);
    struct kvp_meta *m;
    CHECK_EQ(open_mode(dir, mode, UINT64_MAX, 0, 0, &m), 0);
    struct kvp_ns *a = ns_of(m, "default", "kv"), *b = ns_of(m, "qwen", "mamba");
    struct kvp_ns *g = ns_of(m, "gone", "kv");
    kvp_meta_init_rank(a, 0, 2 * NA, NULL);
    kvp_meta_init_rank(b, 0, NA, NULL);
    kvp_meta_init_rank(g, 0, 2 * NA, NULL);
    char k[80];
    for (int i = 0; i < NA; i++) {
        key_name(k, sizeof k, "key", i);
        CHECK(put(a, 0, k) >= 0);
        CHECK(put(g, 0, k) >= 0);
        if (i % 2)
            CHECK(put(b, 0, k) >= 0);
    }
    static struct expect at_snap, at_end;
    expect_now(m, &at_snap);

    struct during d = {m, pthread_self(), 0, 0};
    kvp__snapshot_test_hook_arg = &d;
    kvp__snapshot_test_hook = change_during_write;
    CHECK_EQ(kvp_meta_snapshot(m), 0);
    kvp__snapshot_test_hook = NULL;
    CHECK_EQ(d.ran, 1);
    CHECK_EQ(d.other_thread, mode == KVP_SNAPSHOT_THREAD); /* MANUAL: in the caller */
    invariants(m);
    expect_now(m, &at_end);
    CHECK(at_end.newk[0] >= 0 && at_end.a0[0] == -1 && at_end.a1[15] >= 0);

    /* The snapshot alone is the state when it was asked for ... */
    CHECK_EQ(copy_dir(dir, only_snap, 0), 0);
    check_expect(only_snap, &at_snap, 0);
    /* ... and with the log after it, the state now. Everything is durable
     * and no snapshot runs: the files are what a crash would leave. */
    CHECK_EQ(copy_dir(dir, all, 1), 0);
    check_expect(all, &at_end, 1);
    kvp_meta_close(m);
    rmrf(only_snap);
    rmrf(all);
    rmrf(dir);
}

/* ---------------------------------------------------------------- writers while snapshots run */

enum { NW = 3, KW = 900, POOL = 1500 };

struct writer {
    struct kvp_ns *ns;
    int id, rc;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    char kb[4][80];
    struct kvp_str ks[4];
    int64_t pages[4];
    for (int i = 0; i < KW && !w->rc; i += 4) {
        char prefix[8];
        snprintf(prefix, sizeof prefix, "w%d", w->id);
        for (int j = 0; j < 4; j++) {
            key_name(kb[j], sizeof kb[j], prefix, i + j);
            ks[j] = K(kb[j]);
        }
        if (kvp_meta_allocate(w->ns, 0, ks, 4, pages, NULL, NULL) != 0)
            w->rc = 1;
        size_t n = 0; /* pages the pool could not give stay unconfirmed */
        for (int j = 0; j < 4; j++)
            if (pages[j] >= 0) {
                ks[n] = ks[j];
                pages[n++] = pages[j];
            }
        struct kvp_error err = {0};
        int rc = w->rc ? 0 : kvp_meta_confirm(w->ns, 0, ks, pages, n, NULL, 0, &err);
        if (rc != 0) { /* said, so that a failure seen once can be explained */
            fprintf(stderr, "writer %d: confirm: %d (%s)\n", w->id, rc, err.msg);
            w->rc = 2;
        }
        if (i % 28 == 0) { /* and a delete now and then */
            key_name(kb[0], sizeof kb[0], prefix, i / 2);
            ks[0] = K(kb[0]);
            if (kvp_meta_delete(w->ns, 0, ks, 1, NULL) != 0)
                w->rc = 3;
        }
    }
    return NULL;
}

struct asker {
    struct kvp_meta *m;
    atomic_int stop;
    int calls, rc;
};

static void *asker_main(void *arg)
{
    struct asker *a = arg;
    while (!atomic_load(&a->stop)) {
        if (kvp_meta_snapshot(a->m) != 0)
            a->rc = 1;
        a->calls++;
        sleep_ms(30);
    }
    return NULL;
}

struct writers_report {
    int status, forks, check;
    uint64_t snapshots;
    int64_t page[NW][KW];
};

static void writers_child(const char *dir, int mode, int fd)
{
    static struct writers_report r;
    memset(&r, 0, sizeof r);
    atomic_store(&forks, 0);
    struct kvp_meta *m;
    if (open_mode(dir, mode, 16 << 10, 0, 0, &m) != 0) {
        r.status = 1;
        goto out;
    }
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    kvp_meta_init_rank(ns, 0, POOL, NULL); /* fewer pages than keys: evictions */
    struct writer w[NW];
    pthread_t t[NW], at;
    struct asker ask = {.m = m};
    pthread_create(&at, NULL, asker_main, &ask);
    for (int i = 0; i < NW; i++) {
        w[i] = (struct writer){ns, i, 0};
        pthread_create(&t[i], NULL, writer_main, &w[i]);
    }
    for (int i = 0; i < NW; i++) {
        pthread_join(t[i], NULL);
        if (w[i].rc)
            r.status = 10 + w[i].rc;
    }
    atomic_store(&ask.stop, 1);
    pthread_join(at, NULL);
    if (ask.rc || ask.calls < 2)
        r.status = 20;
    struct kvp_error err = {0};
    r.check = kvp_meta_check(m, &err);
    if (r.check)
        fprintf(stderr, "invariant: %s\n", err.msg);
    r.snapshots = snapshots_of(m);
    char k[80], prefix[8];
    for (int i = 0; i < NW; i++) {
        snprintf(prefix, sizeof prefix, "w%d", i);
        for (int j = 0; j < KW; j++) {
            key_name(k, sizeof k, prefix, j);
            r.page[i][j] = peek(ns, 0, k);
        }
    }
out:
    r.forks = atomic_load(&forks);
    pipe_all(fd, &r, sizeof r, 1);
    _exit(0);
}

static void test_writers_thread_mode(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/writers", base);
    static struct writers_report r;
    in_child(writers_child, dir, KVP_SNAPSHOT_THREAD, &r, sizeof r);
    CHECK_EQ(r.status, 0);
    CHECK_EQ(r.forks, 0);
    CHECK_EQ(r.check, 0);
    CHECK(r.snapshots >= 2);

    struct kvp_meta *m;
    CHECK_EQ(open_mode(dir, KVP_SNAPSHOT_THREAD, UINT64_MAX, 0, 0, &m), 0);
    invariants(m);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    char k[80], prefix[8];
    int wrong = 0, held = 0;
    for (int i = 0; i < NW; i++) {
        snprintf(prefix, sizeof prefix, "w%d", i);
        for (int j = 0; j < KW; j++) {
            key_name(k, sizeof k, prefix, j);
            wrong += peek(ns, 0, k) != r.page[i][j];
            held += r.page[i][j] >= 0;
        }
    }
    CHECK_EQ(wrong, 0);
    CHECK(held > POOL / 2);
    kvp_meta_close(m);
    rmrf(dir);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    scratch_make_in(base, sizeof base, t ? t : "/var/tmp", "snapmodes");
    pthread_atfork(count_fork, NULL, NULL);
    for (int mode = KVP_SNAPSHOT_FORK; mode <= KVP_SNAPSHOT_MANUAL; mode++)
        test_crash_per_mode(mode);
    test_same_bytes();
    test_changes_during_write(KVP_SNAPSHOT_THREAD);
    test_changes_during_write(KVP_SNAPSHOT_MANUAL);
    test_writers_thread_mode();
    rmrf(base);
    return check_report();
}
