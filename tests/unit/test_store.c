/*
 * test_store — the store (kvpage/store.h) over embedded metadata: round trips
 * checked byte for byte, hits not rewritten (the bytes the page I/O writes
 * are counted through its fault hook), a failed write releases its page,
 * a missing key leaves later buffers untouched, eviction of a full file keeps
 * the metadata consistent, two ranks of one namespace, a reopened data
 * directory, duplicate keys, bad arguments changing nothing, one owner per
 * page file (another location, rank, pool or deployment refused), a refused
 * open changing nothing (the file's size, mtime and bytes; nothing created),
 * a missing directory refused unless mkdir, 8 threads on one handle.
 *
 * With KVP_TEST_META=http://HOST:PORT every store uses that kvpage serve
 * instead (each test its own pool): tests/integration/test_store_remote.py
 * starts one (with --read-grace-ms 0, as the embedded tests set) and runs
 * this program against it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/store.h"
#include "pagefile/pf_internal.h"
#include "rng.h"
#include "scratch.h"
#include "store_test.h"

#define BPP 4096u

static char tmpdir[256];
static const char *remote; /* KVP_TEST_META, or NULL: embedded */
static int durable = 1;    /* opts.durable of the stores opened */

/* ---- the fault hook: counts bytes written, fails writes in [fail_lo, fail_hi) */
static _Atomic uint64_t written_bytes;
static _Atomic int64_t fail_lo = -1, fail_hi = -1;

static int64_t hook(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg;
    if (site == KVP__PF_PWRITE || site == KVP__PF_URING_WRITE || site == KVP__PF_USRBIO_WRITE) {
        if (off >= atomic_load(&fail_lo) && off < atomic_load(&fail_hi))
            return -EIO;
        atomic_fetch_add(&written_bytes, len);
    }
    return 0;
}

/* The bytes of key k: derived from the key, so any page can be checked. */
static void fill(uint8_t *buf, size_t len, const char *key)
{
    uint64_t seed = rng_seed_of(key);
    rng_fill(&seed, buf, len);
}

static int open_store(struct kvp_store **s, const char *name, uint64_t pages, uint32_t rank,
                      const char *meta, struct kvp_meta *handle, uint32_t entries)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = pages * BPP;
    o.bytes_per_page = BPP;
    o.entries = entries;
    o.rank = rank;
    o.meta = meta;
    o.meta_handle = handle;
    o.durable = durable;
    if (remote) {
        o.meta = remote;
        o.meta_handle = NULL;
        char pool[64];
        snprintf(pool, sizeof pool, "%.60s", name);
        /* ranks of one test share a pool: the file names differ in a digit */
        size_t l = strlen(pool);
        if (l && pool[l - 1] >= '0' && pool[l - 1] <= '9')
            pool[l - 1] = '\0';
        o.pool = strdup(pool);
    }
    struct kvp_meta_opts mo;
    kvp_meta_opts_init(&mo);
    mo.read_grace_ms = 0; /* eviction tests evict what was just read */
    o.meta_opts = &mo;
    struct kvp_error err = {0};
    int rc = kvp_store_open(&o, s, &err);
    if (rc)
        fprintf(stderr, "kvp_store_open(%s): %d %s\n", name, rc, err.msg);
    if (remote)
        free((char *)o.pool);
    return rc;
}

static int meta_ok(struct kvp_store *s)
{
    if (remote) {
        /* fsck runs on the server (the test's caller checks /v1/stats'
         * invariants); here: every page in exactly one state, none reserved */
        struct kvp_store_stats st = {.stats_size = sizeof st};
        if (kvp_store_stats(s, &st, NULL))
            return 0;
        return st.reserved == 0 && st.free + st.held == st.num_pages && st.keys == st.held;
    }
    struct kvp_error err = {0};
    int rc = kvp_meta_check(kvp_store_meta(s), &err);
    if (rc)
        fprintf(stderr, "kvp_meta_check: %s\n", err.msg);
    return rc == 0;
}

/* Puts keys "<prefix><i>" for i in [lo, hi) in one call; returns put's rc. */
static int put_range(struct kvp_store *s, const char *prefix, int lo, int hi, int64_t *res)
{
    int n = hi - lo;
    char(*names)[64] = calloc((size_t)n, 64);
    struct kvp_str *k = calloc((size_t)n, sizeof *k);
    struct kvp_store_buf *b = calloc((size_t)n, sizeof *b);
    uint8_t *data = malloc((size_t)n * BPP);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 64, "%s%d", prefix, lo + i);
        k[i] = S(names[i]);
        fill(data + (size_t)i * BPP, BPP, names[i]);
        b[i] = (struct kvp_store_buf){data + (size_t)i * BPP, BPP};
    }
    struct kvp_error err = {0};
    int rc = kvp_store_put(s, k, b, (size_t)n, res, &err);
    free(names), free(k), free(b), free(data);
    return rc;
}

/* Gets keys "<prefix><i>"; returns the leading count; bad counts pages read wrong. */
static int64_t get_range(struct kvp_store *s, const char *prefix, int lo, int hi, int64_t *res,
                         int *bad)
{
    int n = hi - lo;
    char(*names)[64] = calloc((size_t)n, 64);
    struct kvp_str *k = calloc((size_t)n, sizeof *k);
    struct kvp_store_buf *b = calloc((size_t)n, sizeof *b);
    uint8_t *data = malloc((size_t)n * BPP), *want = malloc(BPP);
    memset(data, 0xA5, (size_t)n * BPP);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 64, "%s%d", prefix, lo + i);
        k[i] = S(names[i]);
        b[i] = (struct kvp_store_buf){data + (size_t)i * BPP, BPP};
    }
    int64_t lead = kvp_store_get(s, k, b, (size_t)n, res, NULL);
    *bad = 0;
    for (int i = 0; i < n; i++) {
        if (res[i] == BPP) {
            fill(want, BPP, names[i]);
            *bad += memcmp(want, data + (size_t)i * BPP, BPP) != 0;
        } else {
            /* untouched */
            for (size_t j = 0; j < BPP; j++)
                if (data[(size_t)i * BPP + j] != 0xA5) {
                    (*bad)++;
                    break;
                }
        }
    }
    free(names), free(k), free(b), free(data), free(want);
    return lead;
}

static void test_round_trip(const char *name, const char *meta, uint32_t entries)
{
    struct kvp_store *s;
    if (open_store(&s, name, 64, 0, meta, NULL, entries)) {
        CHECK(0);
        return;
    }
    int64_t res[64];
    /* the backend AUTO chose: USRBIO on the emulated 3FS mount (test_store_usrbio) */
    CHECK_EQ(kvp_pagefile_backend(kvp_store_pagefile(s), 1),
             getenv("KVP_TEST_USRBIO") ? KVP_PAGEFILE_BACKEND_USRBIO : KVP_PAGEFILE_BACKEND_PSYNC);
    CHECK_EQ(put_range(s, "rt", 0, 40, res), 0);
    for (int i = 0; i < 40; i++)
        CHECK_EQ(res[i], KVP_STORE_STORED);
    int bad;
    CHECK_EQ(get_range(s, "rt", 0, 40, res, &bad), 40);
    CHECK_EQ(bad, 0);
    uint8_t ex[40];
    struct kvp_str k[3] = {S("rt0"), S("rt39"), S("nope")};
    CHECK_EQ(kvp_store_exists(s, k, 3, ex, NULL), 2);
    CHECK(ex[0] && ex[1] && !ex[2]);
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.num_pages, 64);
    CHECK_EQ(st.held, 40);
    CHECK_EQ(st.reserved, 0);
    CHECK_EQ(st.stored, 40);
    CHECK_EQ(st.read, 40);
    CHECK_EQ(st.bytes_written, 40 * BPP);
    /* delete: gone, page free again */
    CHECK_EQ(kvp_store_delete(s, k, 1, NULL), 0);
    CHECK_EQ(kvp_store_exists(s, k, 3, ex, NULL), 0);
    CHECK(!ex[0] && ex[1]);
    get_stats(s, &st);
    CHECK_EQ(st.held, 39);
    CHECK_EQ(st.free, 25);
    CHECK(meta_ok(s));
    CHECK_EQ(kvp_store_clear(s, NULL), 0);
    CHECK_EQ(kvp_store_exists(s, k, 3, ex, NULL), 0);
    CHECK(!ex[1]);
    get_stats(s, &st);
    CHECK_EQ(st.held, 0);
    CHECK_EQ(st.free, 64);
    kvp_store_close(s);
}

static void test_hits_not_rewritten(void)
{
    struct kvp_store *s;
    if (open_store(&s, "hits", 64, 0, "mem:", NULL, 8)) {
        CHECK(0);
        return;
    }
    int64_t res[32];
    atomic_store(&written_bytes, 0);
    CHECK_EQ(put_range(s, "h", 0, 16, res), 0);
    CHECK_EQ(atomic_load(&written_bytes), 16 * BPP);
    /* 8 old, 8 new: only the new are written */
    atomic_store(&written_bytes, 0);
    CHECK_EQ(put_range(s, "h", 8, 24, res), 0);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(res[i], KVP_STORE_ALREADY);
    for (int i = 8; i < 16; i++)
        CHECK_EQ(res[i], KVP_STORE_STORED);
    CHECK_EQ(atomic_load(&written_bytes), 8 * BPP);
    /* a key twice in one call: written once, from its first buffer */
    uint8_t a[BPP], b[BPP], out[BPP];
    memset(a, 1, BPP), memset(b, 2, BPP);
    struct kvp_str k[2] = {S("twice"), S("twice")};
    struct kvp_store_buf bufs[2] = {{a, BPP}, {b, BPP}};
    atomic_store(&written_bytes, 0);
    CHECK_EQ(kvp_store_put(s, k, bufs, 2, res, NULL), 0);
    CHECK_EQ(res[0], KVP_STORE_STORED);
    CHECK_EQ(res[1], KVP_STORE_ALREADY);
    CHECK_EQ(atomic_load(&written_bytes), BPP);
    struct kvp_store_buf ob = {out, BPP};
    CHECK_EQ(kvp_store_get(s, k, &ob, 1, res, NULL), 1);
    CHECK(!memcmp(out, a, BPP));
    CHECK(meta_ok(s));
    kvp_store_close(s);
}

static void test_failed_write(const char *name)
{
    struct kvp_store *s;
    if (open_store(&s, name, 16, 0, "mem:", NULL, 4)) {
        CHECK(0);
        return;
    }
    /* Fresh pages are handed out from 0 up: fail page 2's writes. */
    atomic_store(&fail_lo, 2 * BPP);
    atomic_store(&fail_hi, 3 * BPP);
    int64_t res[8];
    struct kvp_error err = {0};
    (void)err;
    int rc = put_range(s, "f", 0, 8, res);
    atomic_store(&fail_lo, -1);
    atomic_store(&fail_hi, -1);
    CHECK_EQ(rc, -EIO);
    int failed = 0, stored = 0;
    for (int i = 0; i < 8; i++) {
        failed += res[i] == -EIO;
        stored += res[i] == KVP_STORE_STORED;
    }
    CHECK_EQ(failed, 1);
    CHECK_EQ(stored, 7);
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.reserved, 0); /* released, not leaked */
    CHECK_EQ(st.held, 7);
    CHECK_EQ(st.free, 9);
    CHECK_EQ(st.put_failed, 1);
    /* the failed key is not there; put again, it works */
    int bad;
    int64_t lead = get_range(s, "f", 0, 8, res, &bad);
    CHECK_EQ(bad, 0);
    CHECK(lead < 8);
    CHECK_EQ(put_range(s, "f", 0, 8, res), 0);
    CHECK_EQ(get_range(s, "f", 0, 8, res, &bad), 8);
    CHECK_EQ(bad, 0);
    CHECK(meta_ok(s));
    kvp_store_close(s);
}

static void test_missing_middle(void)
{
    struct kvp_store *s;
    if (open_store(&s, "miss", 32, 0, "mem:", NULL, 3)) {
        CHECK(0);
        return;
    }
    int64_t res[10];
    CHECK_EQ(put_range(s, "m", 0, 10, res), 0);
    struct kvp_str k = S("m4");
    CHECK_EQ(kvp_store_delete(s, &k, 1, NULL), 0);
    int bad;
    CHECK_EQ(get_range(s, "m", 0, 10, res, &bad), 4);
    CHECK_EQ(bad, 0); /* m4's buffer untouched; the others right */
    CHECK_EQ(res[4], -ENOENT);
    for (int i = 5; i < 10; i++)
        CHECK_EQ(res[i], BPP); /* later keys are read: the leading run is the caller's */
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.missing, 1);
    kvp_store_close(s);
}

static void test_eviction(void)
{
    struct kvp_store *s;
    if (open_store(&s, "evict", 16, 0, "mem:", NULL, 4)) {
        CHECK(0);
        return;
    }
    int64_t res[16];
    for (int round = 0; round < 10; round++) {
        char pre[16];
        snprintf(pre, sizeof pre, "e%d_", round);
        CHECK_EQ(put_range(s, pre, 0, 12, res), 0);
        CHECK(meta_ok(s));
    }
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.held, 16);
    CHECK(st.evictions >= 100);
    /* The newest round is whole and right; older keys that remain are right. */
    int bad;
    CHECK_EQ(get_range(s, "e9_", 0, 12, res, &bad), 12);
    CHECK_EQ(bad, 0);
    get_range(s, "e8_", 0, 12, res, &bad);
    CHECK_EQ(bad, 0);
    int present = 0;
    for (int i = 0; i < 12; i++)
        present += res[i] == BPP;
    CHECK_EQ(present, 4);
    /* A batch larger than the file: as many as fit are stored, the rest -ENOSPC. */
    int64_t big[40];
    int rc = put_range(s, "big", 0, 40, big);
    CHECK_EQ(rc, -ENOSPC);
    int ok = 0, nospc = 0;
    for (int i = 0; i < 40; i++)
        ok += big[i] == KVP_STORE_STORED, nospc += big[i] == -ENOSPC;
    CHECK_EQ(ok, 16);
    CHECK_EQ(nospc, 24);
    get_stats(s, &st);
    CHECK_EQ(st.reserved, 0);
    CHECK(meta_ok(s));
    kvp_store_close(s);
}

static void test_two_ranks(void)
{
    struct kvp_meta *m = NULL;
    if (!remote) /* one process, one handle for both ranks */
        CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m, NULL), 0);
    struct kvp_store *r0, *r1;
    if (open_store(&r0, "tp0", 32, 0, NULL, m, 8) || open_store(&r1, "tp1", 32, 1, NULL, m, 8)) {
        CHECK(0);
        return;
    }
    int64_t res[4];
    uint8_t ex[4];
    struct kvp_str k[2] = {S("t0"), S("t1")};
    CHECK_EQ(put_range(r0, "t", 0, 2, res), 0);
    /* rank 0 alone: not there for either */
    CHECK_EQ(kvp_store_exists(r0, k, 2, ex, NULL), 0);
    CHECK_EQ(kvp_store_exists(r1, k, 2, ex, NULL), 0);
    int bad;
    CHECK_EQ(get_range(r0, "t", 0, 2, res, &bad), 0);
    CHECK_EQ(bad, 0);
    CHECK_EQ(put_range(r1, "t", 0, 1, res), 0);
    CHECK_EQ(kvp_store_exists(r0, k, 2, ex, NULL), 1);
    CHECK(ex[0] && !ex[1]);
    CHECK_EQ(kvp_store_exists(r1, k, 2, ex, NULL), 1);
    CHECK_EQ(get_range(r1, "t", 0, 2, res, &bad), 1);
    CHECK_EQ(bad, 0);
    kvp_store_close(r0);
    kvp_store_close(r1);
    kvp_meta_close(m);
}

static void test_reopen(void)
{
    char meta[512];
    snprintf(meta, sizeof meta, "file:%s/reopen.meta", tmpdir);
    struct kvp_store *s;
    if (open_store(&s, "reopen", 32, 0, NULL, NULL, 8)) { /* default: PATH.meta */
        CHECK(0);
        return;
    }
    if (!remote)
        CHECK(!strcmp(kvp_store_location(s), meta));
    int64_t res[20];
    CHECK_EQ(put_range(s, "r", 0, 20, res), 0);
    kvp_store_close(s);
    if (open_store(&s, "reopen", 32, 0, meta, NULL, 8)) {
        CHECK(0);
        return;
    }
    int bad;
    CHECK_EQ(get_range(s, "r", 0, 20, res, &bad), 20);
    CHECK_EQ(bad, 0);
    /* the same metadata with another page count while it holds data: refused */
    struct kvp_store *s2;
    kvp_store_close(s);
    char path[512];
    snprintf(path, sizeof path, "%s/reopen", tmpdir);
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.bytes_per_page = BPP / 2;
    o.meta = remote;
    o.pool = remote ? "reopen" : NULL;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_store_open(&o, &s2, &err), -EEXIST);
    CHECK(strstr(err.msg, "32 pages") != NULL);
    /* and a missing file without file_size is a clear error */
    snprintf(path, sizeof path, "%s/absent", tmpdir);
    o.bytes_per_page = BPP;
    memset(&err, 0, sizeof err);
    CHECK(kvp_store_open(&o, &s2, &err) < 0);
    CHECK(err.msg[0] != 0);
}

static void test_bad_args(void)
{
    struct kvp_store *s;
    if (open_store(&s, "bad", 8, 0, "mem:", NULL, 8)) {
        CHECK(0);
        return;
    }
    uint8_t buf[BPP + 1];
    int64_t res[2];
    struct kvp_str k[2] = {S("ok"), {"x\0y", 3}};
    struct kvp_store_buf b[2] = {{buf, BPP}, {buf, BPP}};
    struct kvp_error err = {0};
    CHECK_EQ(kvp_store_put(s, k, b, 2, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_KEY);
    CHECK_EQ(err.index, 1);
    k[1] = S("ok2");
    b[1].len = BPP + 1;
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_store_put(s, k, b, 2, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_SIZE);
    b[1] = (struct kvp_store_buf){NULL, 10};
    CHECK_EQ(kvp_store_get(s, k, b, 2, res, &err), -EINVAL);
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.allocations, 0);
    CHECK_EQ(st.held, 0);
    CHECK_EQ(kvp_store_put(s, k, b, 0, NULL, NULL), 0);
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    struct kvp_store *s2;
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_store_open(&o, &s2, &err), -EINVAL);
    CHECK(strstr(err.msg, "path") != NULL);
    kvp_store_close(s);
}

/* ---- one page file, one metadata owner */

/* The file's size, mtime and first page, to compare before and after. */
struct file_state {
    int exists;
    off_t size;
    struct timespec mtime;
    uint8_t head[64];
};

static void state_of(const char *path, struct file_state *fs)
{
    memset(fs, 0, sizeof *fs);
    struct stat st;
    fs->exists = stat(path, &st) == 0;
    if (!fs->exists)
        return;
    fs->size = st.st_size;
    fs->mtime = st.st_mtim;
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        CHECK(read(fd, fs->head, sizeof fs->head) >= 0);
        close(fd);
    }
}

static int same_state(const struct file_state *a, const struct file_state *b)
{
    return a->exists == b->exists && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec && !memcmp(a->head, b->head, sizeof a->head);
}

static int exists_path(const char *fmt, const char *a)
{
    char p[600];
    snprintf(p, sizeof p, fmt, a);
    struct stat st;
    return stat(p, &st) == 0;
}

/* Opens path with the given owner; returns kvp_store_open's rc (the store in *s). */
static int open_owner(struct kvp_store **s, const char *path, uint64_t size, const char *meta,
                      const char *dep, const char *pool, uint32_t rank, int mkdir,
                      struct kvp_error *err)
{
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = size;
    o.bytes_per_page = BPP;
    o.meta = meta;
    o.deployment = dep;
    o.pool = pool;
    o.rank = rank;
    o.mkdir = mkdir;
    memset(err, 0, sizeof *err);
    *s = NULL;
    return kvp_store_open(&o, s, err);
}

static void test_owner(void)
{
    char path[512], meta[600];
    snprintf(path, sizeof path, "%s/owned", tmpdir);
    /* the first owner: PATH.meta (embedded) or the server, pool "owner" */
    const char *loc = remote;
    struct kvp_store *s;
    struct kvp_error err;
    if (open_owner(&s, path, 16 * BPP, loc, NULL, "owner", 0, 0, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        CHECK(0);
        return;
    }
    uint8_t a[BPP], b[BPP];
    fill(a, BPP, "A");
    struct kvp_str k = S("A");
    struct kvp_store_buf buf = {a, BPP};
    int64_t res;
    CHECK_EQ(kvp_store_put(s, &k, &buf, 1, &res, NULL), 0);
    kvp_store_close(s);
    /* the record: a format line, then the owner, absolute */
    char rec[600];
    snprintf(rec, sizeof rec, "%s.owner", path);
    FILE *f = fopen(rec, "r");
    char text[2048] = {0};
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f)
        fclose(f);
    CHECK(!strncmp(text, "kvpage page-file owner 1\nlocation ", 34));
    if (!remote) {
        snprintf(meta, sizeof meta, "location file:%s.meta\n", path);
        CHECK(strstr(text, meta) != NULL);
    }
    CHECK(strstr(text, "\ndeployment default\npool owner\nrank 0\n") != NULL);

    /* another location, rank, pool or deployment: refused, nothing changed */
    struct file_state before, after;
    state_of(path, &before);
    const char *other_loc = remote ? "mem:" : "http://127.0.0.1:1";
    struct {
        const char *meta, *dep, *pool;
        uint32_t rank;
    } others[] = {
        {other_loc, NULL, "owner", 0},
        {loc, NULL, "owner", 1},
        {loc, NULL, "other", 0},
        {loc, "elsewhere", "owner", 0},
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        int rc = open_owner(&s, path, 16 * BPP, others[i].meta, others[i].dep, others[i].pool,
                            others[i].rank, 0, &err);
        CHECK_EQ(rc, -EEXIST);
        CHECK_EQ(err.rule, KVP_RULE_OWNER);
        CHECK(strstr(err.msg, "the page file belongs to") != NULL);
        CHECK(strstr(err.msg, ".owner") != NULL);
        if (rc == 0)
            kvp_store_close(s);
    }
    int rc = open_owner(&s, path, 16 * BPP, other_loc, NULL, "owner", 0, 0, &err);
    CHECK(strstr(err.msg, other_loc) != NULL); /* names both owners */
    CHECK(strstr(err.msg, remote ? remote + 7 : "owned.meta beside the file") != NULL);
    if (rc == 0)
        kvp_store_close(s);
    state_of(path, &after);
    CHECK(same_state(&before, &after));
    /* kvp_store_claim: the same answer without a store */
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_store_claim(path, other_loc, NULL, "owner", 0, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_OWNER);
    CHECK_EQ(kvp_store_claim(path, loc, NULL, "owner", 0, NULL), 0);
    /* the same owner, named another way, reopens: A is A */
    if (!remote) {
        snprintf(meta, sizeof meta, "file:%s/./owned.meta/", tmpdir);
        loc = meta;
    }
    if (open_owner(&s, path, 0, loc, NULL, "owner", 0, 0, &err)) {
        fprintf(stderr, "reopen: %s\n", err.msg);
        CHECK(0);
        return;
    }
    buf.base = b;
    CHECK_EQ(kvp_store_get(s, &k, &buf, 1, &res, NULL), 1);
    CHECK(!memcmp(a, b, BPP));
    kvp_store_close(s);
    /* a record never holds a password; scheme and host in lower case */
    snprintf(path, sizeof path, "%s/claimed", tmpdir);
    CHECK_EQ(kvp_store_claim(path, "HTTP://user:secret@Example.COM:7/ns/x/?token=t&a=1", NULL, NULL,
                             3, NULL),
             0);
    snprintf(rec, sizeof rec, "%s.owner", path);
    f = fopen(rec, "r");
    memset(text, 0, sizeof text);
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f)
        fclose(f);
    CHECK(strstr(text, "location http://example.com:7/ns/x?a=1\ndeployment x\npool kv\nrank 3\n") !=
          NULL);
    CHECK(strstr(text, "secret") == NULL && strstr(text, "token") == NULL);
    /* a caller's handle: its location is the owner (mem: here) */
    struct kvp_meta *m = NULL;
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m, NULL), 0);
    CHECK(m && !strcmp(kvp_meta_location(m), "mem:"));
    snprintf(path, sizeof path, "%s/handled", tmpdir);
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = 4 * BPP;
    o.bytes_per_page = BPP;
    o.meta_handle = m;
    CHECK_EQ(kvp_store_open(&o, &s, NULL), 0);
    kvp_store_close(s);
    CHECK_EQ(kvp_store_claim(path, "mem:", NULL, NULL, 0, NULL), 0);
    CHECK_EQ(kvp_store_claim(path, NULL, NULL, NULL, 0, NULL), -EEXIST); /* PATH.meta: another */
    kvp_meta_close(m);
    printf("owner: done\n");
}

/* ---- a refused open changes nothing */

static void test_refused_changes_nothing(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/kept", tmpdir);
    struct kvp_store *s;
    struct kvp_error err;
    if (open_owner(&s, path, 8 * BPP, remote, NULL, "kept", 0, 0, &err)) {
        CHECK(0);
        return;
    }
    uint8_t a[BPP];
    fill(a, BPP, "K");
    struct kvp_str k = S("K");
    struct kvp_store_buf buf = {a, BPP};
    int64_t res;
    CHECK_EQ(kvp_store_put(s, &k, &buf, 1, &res, NULL), 0);
    kvp_store_close(s);
    struct file_state before, after;
    state_of(path, &before);
    /* another page count while the rank holds data: refused before the file grows */
    CHECK_EQ(open_owner(&s, path, (uint64_t)1 << 30, remote, NULL, "kept", 0, 0, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_RESIZE_HELD);
    state_of(path, &after);
    CHECK(same_state(&before, &after));
    /* fewer than one page */
    CHECK_EQ(open_owner(&s, path, BPP / 2, remote, NULL, "kept", 0, 0, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_NUM_PAGES);
    state_of(path, &after);
    CHECK(same_state(&before, &after));
    /* the key and the rank's page count are still there */
    CHECK_EQ(open_owner(&s, path, 0, remote, NULL, "kept", 0, 0, &err), 0);
    if (s) {
        CHECK_EQ(kvp_store_num_pages(s), 8);
        CHECK_EQ(kvp_store_exists(s, &k, 1, NULL, NULL), 1);
        kvp_store_close(s);
    }
    /* a new file: fewer than one page, or an unreachable server: nothing made */
    snprintf(path, sizeof path, "%s/new", tmpdir);
    CHECK_EQ(open_owner(&s, path, BPP / 2, NULL, NULL, NULL, 0, 0, &err), -EINVAL);
    CHECK(!exists_path("%s", path) && !exists_path("%s.meta", path) &&
          !exists_path("%s.owner", path));
    CHECK(open_owner(&s, path, (uint64_t)1 << 30, "http://127.0.0.1:1", NULL, NULL, 0, 0, &err) <
          0);
    CHECK(!exists_path("%s", path) && !exists_path("%s.owner", path));
    /* a missing directory: refused, naming it, unless mkdir */
    char dir[400], want[600];
    snprintf(dir, sizeof dir, "%s/no/such", tmpdir);
    snprintf(path, sizeof path, "%s/rank0.pages", dir);
    CHECK_EQ(open_owner(&s, path, 8 * BPP, remote, NULL, "kept", 0, 0, &err), -ENOENT);
    snprintf(want, sizeof want, "its directory %s does not exist", dir);
    CHECK(strstr(err.msg, want) != NULL);
    CHECK(!exists_path("%s/no", tmpdir));
    /* mkdir, but the server is unreachable: the directories made are removed */
    CHECK(open_owner(&s, path, 8 * BPP, "http://127.0.0.1:1", NULL, NULL, 0, 1, &err) < 0);
    CHECK(!exists_path("%s/no", tmpdir));
    CHECK_EQ(open_owner(&s, path, 8 * BPP, remote, NULL, "kept", 0, 1, &err), 0);
    CHECK(exists_path("%s", path));
    kvp_store_close(s);
    printf("refused: done\n");
}

/* ---- 8 threads on one store */

static struct kvp_store *shared;
static atomic_int thread_bad;

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    char pre[16];
    snprintf(pre, sizeof pre, "th%d_", t);
    int64_t res[16];
    for (int round = 0; round < 30; round++) {
        int lo = (round * 5) % 14; /* 8 threads x 29 keys: no eviction in 256 pages */
        int rc = put_range(shared, pre, lo, lo + 16, res);
        if (rc)
            atomic_fetch_add(&thread_bad, 1);
        int bad;
        if (get_range(shared, pre, lo, lo + 16, res, &bad) != 16)
            atomic_fetch_add(&thread_bad, 1);
        atomic_fetch_add(&thread_bad, bad);
    }
    return NULL;
}

static void test_threads(void)
{
    if (open_store(&shared, "threads", 256, 0, "mem:", NULL, 4)) {
        CHECK(0);
        return;
    }
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, thread_main, (void *)(intptr_t)i);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(atomic_load(&thread_bad), 0);
    struct kvp_store_stats st;
    get_stats(shared, &st);
    CHECK_EQ(st.reserved, 0);
    CHECK_EQ(st.held, 8 * 29); /* keys 0 .. 13 + 16 - 1 of each thread */
    CHECK_EQ(st.free, 256 - 8 * 29);
    CHECK_EQ(st.puts, 240);
    CHECK(meta_ok(shared));
    kvp_store_close(shared);
}

int main(void)
{
    scratch_make(tmpdir, sizeof tmpdir, "test_store", 0);
    /* test_store_usrbio: the same tests with the page files on the emulated 3FS
     * mount of tests/usrbio_emu, where AUTO picks the USRBIO backend */
    if (getenv("KVP_TEST_USRBIO"))
        scratch_usrbio_mount(tmpdir, 0);
    kvp__pagefile_set_fault(hook, NULL);
    remote = getenv("KVP_TEST_META");
    if (remote && !*remote)
        remote = NULL;
    test_round_trip("rt_a", "mem:", 8);
    test_round_trip("rt_b", "mem:", 3); /* many pieces per call */
    char loc[512];
    snprintf(loc, sizeof loc, "file:%s/rt.meta.d", tmpdir);
    test_round_trip("rt_c", loc, 8);
    durable = 0; /* puts that wait for neither the file's nor the metadata's sync */
    snprintf(loc, sizeof loc, "file:%s/rt.meta.nd", tmpdir);
    test_round_trip("rt_d", loc, 8);
    test_failed_write("fail_nd");
    durable = 1;
    test_hits_not_rewritten();
    test_failed_write("fail");
    test_missing_middle();
    test_eviction();
    test_two_ranks();
    test_reopen();
    test_bad_args();
    test_owner();
    test_refused_changes_nothing();
    test_threads();
    scratch_remove(tmpdir);
    return check_report();
}
