/*
 * Persistence of src/meta (protocol.md §6): restart round trip, LRU order
 * across a restart, crash (fork + _exit) recovery, torn tails at every offset
 * class, corrupted log and snapshot bytes, the directory lock, and a record
 * that contradicts the state, and a freed page handed out again only once its
 * freeing is durable.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"
#include "meta/local/meta_int.h"
#include "wal/wal.h"

/* The ticket of the last _async calls (kvpage/meta.h). */
static uint64_t tk;

static char logbuf[1 << 16];
static size_t loglen;
static void capture(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    int n = snprintf(logbuf + loglen, sizeof logbuf - loglen, "%s\n", msg);
    if (n > 0 && loglen + (size_t)n < sizeof logbuf)
        loglen += (size_t)n;
}

static char base[256];

static int open_opts(const char *dir, int fsync, int readonly, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.readonly = readonly;
    o.fsync = fsync;
    o.read_grace_ms = 0;
    o.log = capture;
    return kvp_meta_open(&o, m);
}

static int open_dir(const char *dir, int fsync, struct kvp_meta **m)
{
    return open_opts(dir, fsync, 0, m);
}

/* Recovery that writes nothing: each damaged variant is judged on its own. */
static int open_ro(const char *dir, struct kvp_meta **m)
{
    return open_opts(dir, KVP_FSYNC_NEVER, 1, m);
}

static int64_t peek(struct kvp_ns *ns, uint32_t rank, const char *key)
{
    struct kvp_str k = K(key);
    return kvp__meta_peek(ns, rank, &k);
}

static void test_roundtrip_and_lru(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/rt", base);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv"), *mb = ns_of(m, "qwen", "mamba");
    kvp_meta_init_rank(ns, 0, 3, NULL);
    kvp_meta_init_rank(ns, 1, 5, NULL);
    kvp_meta_init_rank(mb, 7, 4, NULL);
    int64_t pa = put(ns, 0, "a"), pb = put(ns, 0, "b"), pc = put(ns, 0, "c");
    put(ns, 1, "a");
    put(ns, 1, "z");
    struct kvp_str z = K("z");
    kvp_meta_delete(ns, 1, &z, 1, NULL);
    put(mb, 7, "m");
    kvp_meta_init_rank(mb, 9, 2, NULL);
    put(mb, 9, "gone");
    kvp_meta_clear(mb, 9, NULL);
    /* lookups [c, a] touch a then c: least to most recent is b, a, c */
    struct kvp_str q[2] = {K("c"), K("a")};
    int64_t got[2];
    kvp_meta_lookup(ns, 0, 0, q, 2, got, NULL);
    kvp_meta_close(m);

    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    ns = ns_of(m, "default", "kv");
    mb = ns_of(m, "qwen", "mamba");
    invariants(m);
    CHECK_EQ(peek(ns, 0, "a"), pa);
    CHECK_EQ(peek(ns, 0, "b"), pb);
    CHECK_EQ(peek(ns, 0, "c"), pc);
    CHECK(peek(ns, 1, "a") >= 0);
    CHECK_EQ(peek(ns, 1, "z"), -1);
    CHECK(peek(mb, 7, "m") >= 0);
    CHECK_EQ(peek(mb, 9, "gone"), -1);
    CHECK_EQ(kvp_meta_nranks(mb), 2);
    uint8_t ex;
    struct kvp_str a = K("a");
    kvp_meta_exists(ns, -1, &a, 1, &ex, NULL);
    CHECK_EQ(ex, 1);
    /* the pool of rank 0 is full: evictions go b, a, c as before the restart */
    const char *nk[3] = {"n1", "n2", "n3"};
    int64_t want[3] = {pb, pa, pc};
    for (int i = 0; i < 3; i++) {
        struct kvp_str k = K(nk[i]);
        int64_t p;
        kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, NULL);
        CHECK_EQ(p, want[i]);
    }
    invariants(m);
    kvp_meta_close(m);
    rmrf(dir);
}

/*
 * Lowercase hex keys are logged as their bytes, every other key as it is: each
 * kind must come back byte for byte, from the log and from a snapshot.
 */
static void test_key_encodings(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/keys", base);
    static const char *const keys[] = {
        "0123456789abcdef",
        "ab",
        "00",
        "ABCDEF",
        "abcdeg",
        "gbcdef",
        "abc",
        "a",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85G",
        "\xff\xfe",
        "0x1f",
    };
    enum { NK = sizeof keys / sizeof keys[0] };
    int64_t pages[NK];
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    kvp_meta_init_rank(ns, 0, 64, NULL);
    for (int i = 0; i < NK; i++)
        CHECK((pages[i] = put(ns, 0, keys[i])) >= 0); /* each returns once durable */
    kvp_meta_close(m);
    for (int round = 0; round < 2; round++) { /* the log, then a snapshot */
        CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
        ns = ns_of(m, "default", "kv");
        invariants(m);
        for (int i = 0; i < NK; i++)
            CHECK_EQ(peek(ns, 0, keys[i]), pages[i]);
        CHECK_EQ(peek(ns, 0, "abcdef"), -1); /* "ABCDEF" kept its case */
        CHECK_EQ(peek(ns, 0, "0123456789ABCDEF"), -1);
        if (round == 0)
            CHECK_EQ(kvp_meta_snapshot(m), 0);
        kvp_meta_close(m);
    }
    rmrf(dir);
}

/* Child writes, makes it durable, and dies without closing: a crash. */
static void crash_writer(const char *dir, int fsync, int nkeys, int snapshot_at)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct kvp_meta *m;
        if (open_dir(dir, fsync, &m))
            _exit(3);
        struct kvp_ns *ns = ns_of(m, "default", "kv");
        kvp_meta_init_rank(ns, 0, (uint64_t)nkeys + 10, NULL);
        char k[32];
        for (int i = 0; i < nkeys; i++) {
            snprintf(k, sizeof k, "key-%04d", i);
            if (put(ns, 0, k) != i)
                _exit(4);
            if (i == snapshot_at && kvp_meta_snapshot(m) != 0)
                _exit(5);
        }
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Number of keys key-0000.. present as a prefix; -1 if not a prefix. */
static int recovered_prefix(struct kvp_meta *m, int nkeys)
{
    struct kvp_ns *ns = NULL;
    if (kvp_meta_ns(m, "default", 7, "kv", 2, 0, &ns, NULL))
        return 0;
    int n = 0;
    char k[32];
    for (int i = 0; i < nkeys; i++) {
        snprintf(k, sizeof k, "key-%04d", i);
        int64_t p = peek(ns, 0, k);
        if (p == i && n == i)
            n++;
        else if (p >= 0)
            return -1;
    }
    return n;
}

static void test_crash_recovery(void)
{
    for (int mode = 0; mode < 3; mode++) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/crash%d", base, mode);
        crash_writer(dir, mode, 200, 120);
        struct kvp_meta *m;
        CHECK_EQ(open_dir(dir, mode, &m), 0);
        CHECK_EQ(recovered_prefix(m, 200), 200);
        invariants(m);
        /* and the recovered server keeps working and logging */
        struct kvp_ns *ns = ns_of(m, "default", "kv");
        CHECK(put(ns, 0, "after") >= 0);
        kvp_meta_close(m);
        CHECK_EQ(open_dir(dir, mode, &m), 0);
        CHECK(peek(ns_of(m, "default", "kv"), 0, "after") >= 0);
        kvp_meta_close(m);
        rmrf(dir);
    }
}

static char *segment_path(const char *dir, char *out, size_t n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    out[0] = 0;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "wal-", 4) && strstr(e->d_name, ".log") &&
            !strstr(e->d_name, "dropped"))
            snprintf(out, n, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    return out;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static size_t slurp(const char *path, uint8_t **buf)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    *buf = malloc((size_t)st.st_size + 1);
    size_t n = (size_t)read(fd, *buf, (size_t)st.st_size);
    close(fd);
    return n;
}

static void spit(const char *path, const uint8_t *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (write(fd, buf, n) != (ssize_t)n)
        abort();
    close(fd);
}

/* Record boundaries of a segment: ends[i] = offset after record i. */
static int boundaries(const uint8_t *b, size_t n, size_t *ends, int max)
{
    int k = 0;
    size_t off = 0;
    while (off + KVP_WAL_HDR <= n && k < max) {
        uint32_t len = (uint32_t)b[off] | (uint32_t)b[off + 1] << 8 | (uint32_t)b[off + 2] << 16 |
                       (uint32_t)b[off + 3] << 24;
        if (len == 0)
            break; /* the zeros written ahead of the records */
        off += KVP_WAL_HDR + len;
        ends[k++] = off;
    }
    return k;
}

static void test_torn_and_corrupt_log(void)
{
    char dir[300], seg[600];
    snprintf(dir, sizeof dir, "%s/torn", base);
    const int nkeys = 40;
    crash_writer(dir, KVP_FSYNC_BATCH, nkeys, -1);
    segment_path(dir, seg, sizeof seg);
    uint8_t *orig;
    size_t flen = slurp(seg, &orig);
    size_t ends[64];
    int nrec = boundaries(orig, flen, ends, 64);
    CHECK_EQ(nrec, nkeys + 2); /* NS, INIT, HOLD x nkeys */
    size_t n = ends[nrec - 1];
    /* After a crash the file goes on with the zeros written ahead of the
     * records (up to a 4 MiB boundary). */
    CHECK(flen > n);
    CHECK(all_zero(orig + n, flen - n));
    /* Every truncation point, once cut off and once followed by the zeros:
     * never crash, keep every whole record before it, and say what was
     * dropped unless all of it was zeros. */
    int cuts = 0;
    uint8_t *zt = calloc(1, flen);
    for (size_t step = 0; step < 2 * (n + 1); step += (step / 2 < 200 ? 1 : 14)) {
        size_t cut = step / 2;
        int zero_tail = step % 2;
        if (zero_tail) {
            memcpy(zt, orig, cut);
            spit(seg, zt, flen);
        } else {
            spit(seg, orig, cut);
        }
        loglen = 0;
        struct kvp_meta *m;
        int rc = open_ro(dir, &m);
        CHECK_EQ(rc, 0);
        if (rc)
            continue;
        if (zero_tail) /* the file is the original up to the first nonzero byte cut off */
            while (cut < n && orig[cut] == 0)
                cut++;
        int whole = 0;
        while (whole < nrec && ends[whole] <= cut)
            whole++;
        int want = whole > 2 ? whole - 2 : 0;
        CHECK_EQ(recovered_prefix(m, nkeys), want);
        size_t kept = whole ? ends[whole - 1] : 0;
        if (cut > kept && !all_zero(orig + kept, cut - kept))
            CHECK(strstr(logbuf, "dropped") != NULL); /* says what it dropped */
        if (cut == kept || zero_tail)                 /* whole records, then nothing or zeros */
            CHECK(cut > kept || strstr(logbuf, "dropped") == NULL);
        invariants(m);
        kvp_meta_close(m);
        cuts++;
    }
    free(zt);
    CHECK(cuts > 200);
    /* A writable start truncates the torn tail, then appends after it. */
    size_t cut = ends[nrec - 2] + 5;
    spit(seg, orig, cut);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    struct stat st;
    stat(seg, &st);
    CHECK_EQ(st.st_size, ends[nrec - 2]);
    CHECK(put(ns_of(m, "default", "kv"), 0, "later") >= 0);
    kvp_meta_close(m);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_EQ(recovered_prefix(m, nkeys), nkeys - 1);
    CHECK(peek(ns_of(m, "default", "kv"), 0, "later") >= 0);
    kvp_meta_close(m);
    rmrf(dir);
    crash_writer(dir, KVP_FSYNC_BATCH, nkeys, -1);
    segment_path(dir, seg, sizeof seg);
    /* flip one byte in each record: the records before it survive */
    for (int r = 0; r < nrec; r++) {
        size_t start = r ? ends[r - 1] : 0;
        size_t at = start + (ends[r] - start) / 2;
        uint8_t *b = malloc(n);
        memcpy(b, orig, n);
        b[at] ^= 0x5a;
        spit(seg, b, n);
        free(b);
        loglen = 0;
        CHECK_EQ(open_ro(dir, &m), 0);
        CHECK_EQ(recovered_prefix(m, nkeys), r > 2 ? r - 2 : 0);
        CHECK(strstr(logbuf, "offset") != NULL);
        kvp_meta_close(m);
    }
    free(orig);
    rmrf(dir);
}

/* Keys 0..snap_at are in the snapshot, the rest only in the log after it.
 * Returns how many snapshot keys survived (a prefix), or -1 on a wrong answer. */
static int check_after_damaged_snapshot(struct kvp_meta *m, int nkeys, int snap_at)
{
    struct kvp_ns *ns = NULL;
    if (kvp_meta_ns(m, "default", 7, "kv", 2, 0, &ns, NULL))
        return -1;
    int prefix = 0;
    char k[32];
    for (int i = 0; i < nkeys; i++) {
        snprintf(k, sizeof k, "key-%04d", i);
        int64_t p = peek(ns, 0, k);
        if (i > snap_at) {
            if (p != i)
                return -1; /* every key logged after the snapshot is kept */
        } else if (p == i && prefix == i) {
            prefix++;
        } else if (p >= 0) {
            return -1;
        }
    }
    return prefix;
}

static void test_corrupt_snapshot(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/snap", base);
    crash_writer(dir, KVP_FSYNC_BATCH, 60, 30);
    DIR *d = opendir(dir);
    struct dirent *e;
    char snap[600] = "";
    int nlogs = 0;
    while (d && (e = readdir(d))) {
        if (strstr(e->d_name, ".snap"))
            snprintf(snap, sizeof snap, "%s/%s", dir, e->d_name);
        nlogs += !strncmp(e->d_name, "wal-", 4);
    }
    closedir(d);
    CHECK(snap[0] != 0);
    CHECK_EQ(nlogs, 1); /* the log before the snapshot is gone */
    struct kvp_meta *m;
    CHECK_EQ(open_ro(dir, &m), 0);
    CHECK_EQ(check_after_damaged_snapshot(m, 60, 30), 31); /* undamaged: everything */
    kvp_meta_close(m);
    uint8_t *b;
    size_t n = slurp(snap, &b);
    int last = 31;
    for (size_t at = 0; at < n; at += n / 17 + 1) {
        b[at] ^= 0xff;
        spit(snap, b, n);
        b[at] ^= 0xff;
        loglen = 0;
        int rc = open_ro(dir, &m);
        CHECK_EQ(rc, 0);
        if (rc) {
            fprintf(stderr, "flip at %zu: %s\n", at, logbuf);
            continue;
        }
        int kept = check_after_damaged_snapshot(m, 60, 30);
        if (!(kept >= 0 && kept <= last))
            fprintf(stderr, "flip at %zu: kept %d\n%s\n", at, kept, logbuf);
        CHECK(kept >= 0 && kept <= last); /* later damage keeps at least as much */
        if (kept >= 0 && kept < 31)
            CHECK(strstr(logbuf, "damaged") != NULL);
        invariants(m);
        kvp_meta_close(m);
    }
    /* a truncated snapshot, then a writable start that goes on from it */
    spit(snap, b, n / 2);
    loglen = 0;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    int kept = check_after_damaged_snapshot(m, 60, 30);
    CHECK(kept > 0 && kept < 31);
    CHECK(strstr(logbuf, "damaged") != NULL);
    CHECK(put(ns_of(m, "default", "kv"), 0, "after") >= 0);
    invariants(m);
    kvp_meta_close(m); /* writes a fresh, whole snapshot */
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_EQ(check_after_damaged_snapshot(m, 60, 30), kept);
    CHECK(peek(ns_of(m, "default", "kv"), 0, "after") >= 0);
    kvp_meta_close(m);
    free(b);
    rmrf(dir);
}

static void test_lock_and_bad_record(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/lock", base);
    struct kvp_meta *m, *m2;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    loglen = 0;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m2), -EBUSY);
    CHECK(strstr(logbuf, "in use by another kvpage process") != NULL);
    kvp_meta_close(m);
    rmrf(dir);

    /* a log whose HOLD names a rank that was never initialized */
    mkdir(dir, 0755);
    uint8_t rec[2][64], out[256];
    size_t n = 0;
    uint8_t ns[] = {1, 0, 0, 0, 0, 7, 'd', 'e', 'f', 'a', 'u', 'l', 't', 2, 'k', 'v'};
    uint8_t hold[] = {3, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 'x'};
    memcpy(rec[0], ns, sizeof ns);
    memcpy(rec[1], hold, sizeof hold);
    size_t lens[2] = {sizeof ns, sizeof hold};
    for (int i = 0; i < 2; i++) {
        kvp__wal_frame(out + n, rec[i], (uint32_t)lens[i]);
        memcpy(out + n + KVP_WAL_HDR, rec[i], lens[i]);
        n += KVP_WAL_HDR + lens[i];
    }
    char seg[400];
    snprintf(seg, sizeof seg, "%s/wal-0000000000000000.log", dir);
    spit(seg, out, n);
    loglen = 0;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), -EUCLEAN);
    if (!strstr(logbuf, "wal-0000000000000000.log offset 28"))
        fprintf(stderr, "log was: %s\n", logbuf);
    CHECK(strstr(logbuf, "wal-0000000000000000.log offset 28") != NULL);
    CHECK(strstr(logbuf, "not initialized") != NULL);
    rmrf(dir);
}

/* Allocates one key on rank 0 with a fresh ticket (tk). */
static int64_t alloc1(struct kvp_ns *ns, const char *key)
{
    struct kvp_str k = K(key);
    int64_t p = -1;
    tk = 0;
    CHECK_EQ(kvp_meta_allocate_async(ns, 0, &k, 1, &p, NULL, &tk, NULL), 0);
    CHECK(p >= 0);
    return p;
}

/*
 * A page freed by a record that is not durable yet is handed out only in a
 * reply that waits for that record. Otherwise its new writer could overwrite
 * the page, and a crash before the record reached the disk would bring back
 * the old key on the new bytes. With never, nothing is written until someone
 * waits, so "not durable yet" holds for as long as the test needs.
 */
static void test_freed_page_reuse_waits(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/reuse", base);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, KVP_FSYNC_NEVER, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    kvp_meta_init_rank(ns, 0, 2, NULL);
    CHECK(put(ns, 0, "old") >= 0);

    /* a never-used page, nothing freed yet; then the page a delete freed */
    alloc1(ns, "before");
    CHECK_EQ(tk, 0); /* nothing was ever freed: no wait */
    struct kvp_str k = K("old");
    tk = 0;
    CHECK_EQ(kvp_meta_delete_async(ns, 0, &k, 1, &tk, NULL), 0);
    uint64_t freed = tk;
    CHECK(freed > 0);
    alloc1(ns, "new1"); /* the only FREE page is the one just freed */
    CHECK(tk >= freed);
    CHECK_EQ(kvp_meta_wait(m, tk, NULL), 0);

    /* the same after a clear; once durable, a reuse waits for nothing */
    tk = 0;
    CHECK_EQ(kvp_meta_clear_async(ns, 0, &tk, NULL), 0);
    freed = tk;
    CHECK(freed > 0);
    alloc1(ns, "new2");
    CHECK(tk >= freed);
    CHECK_EQ(kvp_meta_wait(m, tk, NULL), 0);
    alloc1(ns, "new3");
    CHECK_EQ(tk, 0);
    invariants(m);
    kvp_meta_close(m);
    rmrf(dir);
}

/* ---------------------------------------------------------------- lineage */

static uint32_t big_tokens[20000]; /* a LINEAGE record bigger than a snapshot's buffer */
#define LIN_ALL                                                                                    \
    "a@0[1,2,3] b@0<a>[4,5,6] big@0<b>[0,7,14,21,28,35,42,49..20000:139993] plain@0 "              \
    "b@1<a>[4,5,6] "

/* The lineages of LIN_ALL, in namespace default/kv (ranks 0 and 1 of 64
 * pages); snap: a snapshot after a and b. */
static int write_lineages(struct kvp_meta *m, int snap)
{
    static const uint32_t ta[] = {1, 2, 3}, tb[] = {4, 5, 6};
    for (uint32_t i = 0; i < 20000; i++)
        big_tokens[i] = 7 * i;
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    if (kvp_meta_init_rank(ns, 0, 64, NULL) || kvp_meta_init_rank(ns, 1, 64, NULL) ||
        put_lin(ns, 0, "a", NULL, ta, 3) || put_lin(ns, 0, "b", "a", tb, 3) ||
        (snap && kvp_meta_snapshot(m)) || put_lin(ns, 0, "big", "b", big_tokens, 20000) ||
        put(ns, 0, "plain") < 0 || put_lin(ns, 1, "b", "a", tb, 3))
        return -1;
    return 0;
}

/* While a snapshot thread writes from its copy: a's lineage replaced
 * (another rank's confirmation) and b deleted, both lineages kept for the
 * writer. */
static void change_during_snapshot(void *arg)
{
    static const uint32_t t9[] = {9};
    struct kvp_ns *ns = ns_of(arg, "default", "kv");
    struct kvp_str kb = K("b");
    if (put_lin(ns, 1, "a", "z", t9, 1) || kvp_meta_delete(ns, -1, &kb, 1, NULL))
        _exit(6);
}

/* A child writes the lineages, makes them durable and dies without closing;
 * hook: changes during a snapshot after them. */
static void crash_lineages(const char *dir, int snap, int hook)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct kvp_meta *m;
        if (open_dir(dir, KVP_FSYNC_BATCH, &m) || write_lineages(m, snap))
            _exit(3);
        if (hook) {
            kvp__snapshot_test_hook = change_during_snapshot;
            kvp__snapshot_test_hook_arg = m;
            if (kvp_meta_snapshot(m))
                _exit(5);
            struct kvp_str kp = K("plain");
            if (kvp_meta_delete(ns_of(m, "default", "kv"), -1, &kp, 1, NULL))
                _exit(7);
        }
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/*
 * The parent and tokens a confirmation named (kvp_meta_confirm_ex) survive a
 * restart (from the snapshot a clean close writes), a crash (from the log,
 * with or without a snapshot before), changes while a snapshot thread
 * writes, and a torn LINEAGE record at the log's end; a state with none
 * (all that a binary before them wrote) loads as before.
 */
static void test_lineage(void)
{
    char dir[300];
    struct kvp_meta *m;
    snprintf(dir, sizeof dir, "%s/lin-clean", base);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_EQ(write_lineages(m, 0), 0);
    CHECK_STR(lineages(m), LIN_ALL);
    kvp_meta_close(m);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_STR(lineages(m), LIN_ALL);
    invariants(m);
    kvp_meta_close(m);
    rmrf(dir);

    for (int snap = 0; snap < 2; snap++) {
        snprintf(dir, sizeof dir, "%s/lin-crash%d", base, snap);
        crash_lineages(dir, snap, 0);
        CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
        CHECK_STR(lineages(m), LIN_ALL);
        invariants(m);
        kvp_meta_close(m);
        rmrf(dir);
    }

    snprintf(dir, sizeof dir, "%s/lin-hook", base);
    crash_lineages(dir, 0, 1);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_STR(lineages(m), "a@0<z>[9] big@0<b>[0,7,14,21,28,35,42,49..20000:139993] a@1<z>[9] ");
    kvp_meta_close(m);
    rmrf(dir);

    /* A torn LINEAGE record (the last of the log: b's on rank 1, after its
     * HOLD): the key is recovered without it. */
    char seg[600];
    snprintf(dir, sizeof dir, "%s/lin-torn", base);
    crash_lineages(dir, 0, 0);
    segment_path(dir, seg, sizeof seg);
    uint8_t *orig;
    size_t flen = slurp(seg, &orig);
    size_t ends[64];
    int nrec = boundaries(orig, flen, ends, 64);
    CHECK(nrec > 3 && orig[ends[nrec - 2] + KVP_WAL_HDR] == 11); /* REC_LINEAGE */
    for (size_t cut = ends[nrec - 2] + 1; cut < ends[nrec - 1]; cut += 7) {
        spit(seg, orig, cut);
        CHECK_EQ(open_ro(dir, &m), 0);
        CHECK_STR(lineages(m), "a@0[1,2,3] b@0<a>[4,5,6] big@0<b>[0,7,14,21,28,35,42,49..20000:"
                               "139993] plain@0 b@1<a>[4,5,6] ");
        kvp_meta_close(m);
    }
    spit(seg, orig, ends[nrec - 2]);
    CHECK_EQ(open_ro(dir, &m), 0);
    CHECK_STR(lineages(m), LIN_ALL);
    kvp_meta_close(m);
    free(orig);
    rmrf(dir);

    /* A state with no lineage: no LINEAGE record (the bytes a binary before
     * them wrote), and it loads with none. */
    snprintf(dir, sizeof dir, "%s/lin-none", base);
    crash_writer(dir, KVP_FSYNC_BATCH, 3, 1);
    segment_path(dir, seg, sizeof seg);
    flen = slurp(seg, &orig);
    nrec = boundaries(orig, flen, ends, 64);
    CHECK(nrec >= 3);
    for (int i = 0; i < nrec; i++) /* the types a binary before LINEAGE wrote */
        CHECK(orig[(i ? ends[i - 1] : 0) + KVP_WAL_HDR] != 11);
    free(orig);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_STR(lineages(m), "key-0000@0 key-0001@0 key-0002@0 ");
    kvp_meta_close(m);
    CHECK_EQ(open_dir(dir, KVP_FSYNC_BATCH, &m), 0);
    CHECK_STR(lineages(m), "key-0000@0 key-0001@0 key-0002@0 ");
    kvp_meta_close(m);
    rmrf(dir);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    scratch_make_in(base, sizeof base, t ? t : "/var/tmp", "persist");
    test_roundtrip_and_lru();
    test_key_encodings();
    test_crash_recovery();
    test_torn_and_corrupt_log();
    test_corrupt_snapshot();
    test_lock_and_bad_record();
    test_freed_page_reuse_waits();
    test_lineage();
    rmrf(base);
    return check_report();
}
