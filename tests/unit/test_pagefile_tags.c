/*
 * test_pagefile_tags.c — integrity tags (kvpage/pagefile.h, "Integrity
 * tags"): a page whose bytes changed after their write, a torn write,
 * another key's page, a partial read, are rejected (-EBADMSG, counted,
 * noted), the other ops of the batch served; a file from before tags keeps
 * working (legacy); never-written pages must be zeros; read-only handles
 * write no sidecar; KVP_PAGEFILE_NO_TAGS makes none; kvp_pagefile_verify
 * names the bad pages. Every backend (and several threads at once).
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "pagefile_test.h"

#define PAGE (256u << 10)
#define NPAGES 8u
#define FSIZE ((uint64_t)PAGE * NPAGES)

static char path[600], tpath[640];

static struct kvp_pagefile *open_pf(uint32_t flags, int backend)
{
    struct kvp_pagefile_opts o = pt_tags_opts(FSIZE, PAGE, 8, flags, backend);
    o.chunk_bytes = 64 << 10; /* psync: one page in pieces on several threads */
    o.threads = 4;
    return pt_open_or_skip(path, &o, "tags");
}

static struct kvp_pagefile_info info_of(struct kvp_pagefile *pf)
{
    struct kvp_pagefile_info in;
    memset(&in, 0, sizeof in);
    in.info_size = sizeof in;
    kvp_pagefile_info(pf, &in);
    return in;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void reset(void)
{
    unlink(path);
    unlink(tpath);
}

/* Writes page i (op offset i * PAGE, len bytes, filled from seed) with key. */
static int put(struct kvp_pagefile *pf, uint32_t i, uint64_t len, uint64_t seed, const char *key)
{
    char *buf = pt_alloc(len);
    pt_fill(&seed, buf, len);
    struct kvp_pagefile_op op = {(int64_t)i * PAGE, buf, len};
    const char *keys[1] = {key};
    int64_t res = 0;
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    int rc = kvp_pagefile_write_keyed(pf, &op, keys, 1, &res, &err);
    free(buf);
    return rc;
}

/* Reads page i (len bytes at offset off) with key; the result, and whether
 * the bytes are those of seed. */
static int64_t get(struct kvp_pagefile *pf, int64_t off, uint64_t len, uint64_t seed,
                   const char *key, int *same, struct kvp_error *err)
{
    char *buf = pt_alloc(len), *want = pt_alloc(len);
    pt_fill(&seed, want, len);
    struct kvp_pagefile_op op = {off, buf, len};
    const char *keys[1] = {key};
    int64_t res = 0;
    memset(err, 0, sizeof *err);
    int rc = kvp_pagefile_read_keyed(pf, &op, keys, 1, &res, err);
    if (same)
        *same = memcmp(buf, want, len) == 0;
    free(buf);
    free(want);
    return rc < 0 && rc != -EBADMSG ? rc : res;
}

/* Overwrites bytes of the file behind the library's back. */
static void tamper(int64_t off, const char *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, bytes, n, off) == (ssize_t)n);
    close(fd);
}

/* kvp_pagefile_verify's callback: bad[0] counts, bad[1..] the slots. */
static void on_bad(void *arg, uint64_t slot, const char *why)
{
    uint64_t *bad = arg;
    CHECK(why && *why);
    if (bad[0] < 7)
        bad[1 + bad[0]] = slot;
    bad[0]++;
}

static void test_write_read(int backend)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE, backend);
    if (!pf)
        return;
    CHECK(exists(tpath));
    struct kvp_pagefile_info in = info_of(pf);
    CHECK_EQ(in.tags, 1);
    CHECK_STR(in.tags_path, tpath);
    CHECK_STR(in.tags_note, "");
    struct kvp_error err;
    int same = 0;
    /* whole pages, a short page, a keyed one, an unkeyed one */
    CHECK_EQ(put(pf, 0, PAGE, 1, "k0"), 0);
    CHECK_EQ(put(pf, 1, 1000, 2, NULL), 0);
    CHECK_EQ(put(pf, 2, PAGE, 3, "k2"), 0);
    CHECK_EQ(get(pf, 0, PAGE, 1, "k0", &same, &err), PAGE);
    CHECK(same);
    CHECK_EQ(get(pf, 0, PAGE, 1, NULL, &same, &err), PAGE); /* key unknown: digest only */
    CHECK_EQ(get(pf, PAGE, 1000, 2, NULL, &same, &err), 1000);
    CHECK(same);
    /* never written: zeros are verified */
    CHECK_EQ(get(pf, 5 * (int64_t)PAGE, PAGE, 0, NULL, NULL, &err), PAGE);
    in = info_of(pf);
    CHECK_EQ(in.tags_verified, 4);
    CHECK_EQ(in.tags_rejected, 0);

    /* another key's intact page */
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 3, "k0", NULL, &err), -EBADMSG);
    CHECK_EQ(err.code, -EBADMSG);
    CHECK_EQ(err.rule, KVP_RULE_INTEGRITY);
    CHECK_EQ(err.index, 0);
    CHECK_EQ(err.value, 2);
    CHECK(strstr(err.msg, "another key") != NULL);
    CHECK(strstr(err.msg, "missing") != NULL);
    /* a keyed read of a page written without a key, and of a never-written one */
    CHECK_EQ(get(pf, PAGE, 1000, 2, "k1", NULL, &err), -EBADMSG);
    CHECK_EQ(get(pf, 6 * (int64_t)PAGE, PAGE, 0, "k6", NULL, &err), -EBADMSG);
    CHECK(strstr(err.msg, "no key") != NULL);
    /* a size other than the write's, a read not at the page's start */
    CHECK_EQ(get(pf, PAGE, PAGE, 2, NULL, NULL, &err), -EBADMSG);
    CHECK(strstr(err.msg, "size") != NULL);
    CHECK_EQ(get(pf, 4096, 4096, 1, NULL, NULL, &err), -EBADMSG);

    /* bytes changed behind the library's back: rejected, the others served */
    tamper(2 * (int64_t)PAGE + 7, "X", 1);
    tamper(7 * (int64_t)PAGE + 100, "Y", 1); /* never written: not zeros any more */
    char *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = pt_alloc(PAGE);
    struct kvp_pagefile_op ops[4] = {{0, b[0], PAGE},
                                     {2 * (int64_t)PAGE, b[1], PAGE},
                                     {3 * (int64_t)PAGE, b[2], PAGE},
                                     {7 * (int64_t)PAGE, b[3], PAGE}};
    const char *keys[4] = {"k0", "k2", NULL, NULL};
    int64_t res[4];
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_pagefile_read_keyed(pf, ops, keys, 4, res, &err), -EBADMSG);
    CHECK_EQ(res[0], PAGE);
    CHECK_EQ(res[1], -EBADMSG);
    CHECK_EQ(res[2], PAGE);
    CHECK_EQ(res[3], -EBADMSG);
    CHECK_EQ(err.index, 1);
    CHECK_EQ(err.value, 2);
    CHECK(strstr(err.msg, "differ") != NULL);
    for (int i = 0; i < 4; i++)
        free(b[i]);
    in = info_of(pf);
    CHECK_EQ(in.tags_rejected, 7);
    CHECK(strstr(in.tags_note, "page 2 ") != NULL); /* the first rejection, kept */
    CHECK(strstr(in.tags_note, tpath) == NULL && strstr(in.tags_note, path) != NULL);

    /* a rewrite tags it again; an unaligned write leaves its pages untagged */
    CHECK_EQ(put(pf, 2, PAGE, 4, "k2"), 0);
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 4, "k2", &same, &err), PAGE);
    char x[8192];
    memset(x, 'u', sizeof x);
    struct kvp_pagefile_op uop = {4 * (int64_t)PAGE - 4096, x, sizeof x};
    int64_t r1;
    CHECK_EQ(kvp_pagefile_write(pf, &uop, 1, &r1, &err), 0);
    uint64_t unv = info_of(pf).tags_unverified;
    CHECK_EQ(get(pf, 4 * (int64_t)PAGE, PAGE, 0, NULL, NULL, &err), PAGE);
    CHECK_EQ(info_of(pf).tags_unverified, unv + 1);
    CHECK_EQ(get(pf, 4 * (int64_t)PAGE, PAGE, 0, "k4", NULL, &err), -EBADMSG);
    CHECK(strstr(err.msg, "without a tag") != NULL);

    /* fsck: pages 3 (the unaligned write's first, untagged), 7 (not zeros) */
    struct kvp_pagefile_verify_counts c;
    memset(&c, 0, sizeof c);
    c.check_size = sizeof c;
    uint64_t bad[8] = {0};
    CHECK_EQ(kvp_pagefile_verify(pf, on_bad, bad, &c, &err), -EBADMSG);
    CHECK_EQ(bad[0], 1);
    CHECK_EQ(bad[1], 7);
    CHECK_EQ(err.rule, KVP_RULE_INTEGRITY);
    CHECK_EQ(err.value, 7);
    CHECK_EQ(c.slots, NPAGES);
    CHECK_EQ(c.bad, 1);
    CHECK_EQ(c.untagged, 2);
    CHECK_EQ(c.tagged, 3); /* pages 0, 1, 2 */
    CHECK_EQ(c.none, 2);   /* 5, 6 */
    kvp_pagefile_close(pf);

    /* the tags survive the handle; a flushed sidecar too */
    pf = open_pf(0, backend);
    CHECK_EQ(get(pf, 0, PAGE, 1, "k0", &same, &err), PAGE);
    CHECK(same);
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 4, "k0", NULL, &err), -EBADMSG);
    CHECK_EQ(kvp_pagefile_flush(pf, &err), 0);
    kvp_pagefile_close(pf);
}

/* A write that fails (or is torn by a crash) leaves its page BAD. */
static int64_t fail_writes(void *arg, int site, int64_t offset, uint64_t len)
{
    (void)arg, (void)offset, (void)len;
    return site == KVP__PF_PWRITE || site == KVP__PF_URING_WRITE || site == KVP__PF_USRBIO_WRITE
               ? -EIO
               : 0;
}

static void test_torn(int backend)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE, backend);
    if (!pf)
        return;
    struct kvp_error err;
    int same;
    CHECK_EQ(put(pf, 1, PAGE, 9, "k"), 0);
    kvp__pagefile_set_fault(fail_writes, NULL);
    CHECK_EQ(put(pf, 1, PAGE, 10, "k"), -EIO);
    kvp__pagefile_set_fault(NULL, NULL);
    CHECK_EQ(get(pf, PAGE, PAGE, 9, "k", &same, &err), -EBADMSG); /* neither old nor new */
    CHECK(strstr(err.msg, "interrupted") != NULL);
    kvp_pagefile_close(pf);
    /* a record half written (a power cut): its check fails */
    pf = open_pf(0, backend);
    CHECK_EQ(put(pf, 3, PAGE, 11, "k"), 0);
    kvp_pagefile_close(pf);
    int fd = open(tpath, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, "\x01", 1, 4096 + 3 * 32 + 16) == 1);
    close(fd);
    pf = open_pf(0, backend);
    CHECK_EQ(get(pf, 3 * (int64_t)PAGE, PAGE, 11, "k", &same, &err), -EBADMSG);
    CHECK(strstr(err.msg, "damaged") != NULL);
    kvp_pagefile_close(pf);
}

/* SIGKILL in the middle of a write (half the page written): after the
 * crash the page reads as missing, and fsck names it; a bigger open then
 * extends the sidecar with the file. */
static int64_t kill_midway(void *arg, int site, int64_t offset, uint64_t len)
{
    (void)arg, (void)offset;
    if (site != KVP__PF_PWRITE)
        return 0;
    if (len < PAGE)
        raise(SIGKILL); /* the second attempt: the first half is on its way to disk */
    return PAGE / 2;
}

static void test_sigkill(void)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_PSYNC);
    CHECK_EQ(put(pf, 2, PAGE, 21, "old"), 0);
    kvp_pagefile_close(pf);
    pid_t child = fork();
    if (child == 0) {
        struct kvp_pagefile *c = open_pf(0, KVP_PAGEFILE_BACKEND_PSYNC);
        kvp__pagefile_set_fault(kill_midway, NULL);
        put(c, 2, PAGE, 22, "new");
        _exit(0); /* not reached */
    }
    int st = 0;
    waitpid(child, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    pf = open_pf(0, KVP_PAGEFILE_BACKEND_PSYNC);
    struct kvp_error err;
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 21, "old", NULL, &err), -EBADMSG);
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 22, "new", NULL, &err), -EBADMSG);
    CHECK(strstr(err.msg, "interrupted") != NULL);
    uint64_t bad[8] = {0};
    struct kvp_pagefile_verify_counts c = {.check_size = sizeof c};
    CHECK_EQ(kvp_pagefile_verify(pf, on_bad, bad, &c, &err), -EBADMSG);
    CHECK_EQ(bad[0], 1);
    CHECK_EQ(bad[1], 2);
    kvp_pagefile_close(pf);

    /* twice the size: the sidecar grows with the file */
    struct stat before, after;
    stat(tpath, &before);
    struct kvp_pagefile_opts o = pt_tags_opts(2 * FSIZE, PAGE, 8, 0, KVP_PAGEFILE_BACKEND_PSYNC);
    pf = pt_open_or_skip(path, &o, "tags grow");
    stat(tpath, &after);
    CHECK_EQ(after.st_size, before.st_size + (int64_t)NPAGES * 32);
    CHECK_EQ(put(pf, NPAGES + 3, PAGE, 23, "far"), 0);
    int same = 0;
    CHECK_EQ(get(pf, (NPAGES + 3) * (int64_t)PAGE, PAGE, 23, "far", &same, &err), PAGE);
    CHECK(same);
    kvp_pagefile_close(pf);
}

/* A page file written before tags (no sidecar, data in it) keeps working. */
static void test_legacy(void)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE | KVP_PAGEFILE_NO_TAGS, 0);
    CHECK_EQ(put(pf, 0, PAGE, 5, NULL), 0);
    CHECK_EQ(info_of(pf).tags, 0);
    CHECK_STR(info_of(pf).tags_path, "");
    kvp_pagefile_close(pf);
    CHECK(!exists(tpath)); /* NO_TAGS makes none */

    /* read-only: writes no sidecar, serves unverified */
    pf = open_pf(KVP_PAGEFILE_READONLY, 0);
    struct kvp_error err;
    int same;
    CHECK_EQ(info_of(pf).tags, 2);
    CHECK_EQ(get(pf, 0, PAGE, 5, "k", &same, &err), PAGE);
    CHECK(same);
    CHECK_EQ(info_of(pf).tags_unverified, 1);
    struct kvp_pagefile_verify_counts c = {.check_size = sizeof c};
    CHECK_EQ(kvp_pagefile_verify(pf, NULL, NULL, &c, &err), -ENOENT);
    kvp_pagefile_close(pf);
    CHECK(!exists(tpath));

    /* read-write: a legacy sidecar; old pages served unverified, keyed too */
    pf = open_pf(0, 0);
    CHECK(exists(tpath));
    CHECK_EQ(info_of(pf).tags, 2);
    CHECK_EQ(get(pf, 0, PAGE, 5, "k", &same, &err), PAGE);
    CHECK(same);
    CHECK_EQ(info_of(pf).tags_unverified, 1);
    /* new writes are tagged */
    CHECK_EQ(put(pf, 1, PAGE, 6, "k1"), 0);
    tamper(PAGE, "Z", 1);
    CHECK_EQ(get(pf, PAGE, PAGE, 6, "k1", NULL, &err), -EBADMSG);
    kvp_pagefile_close(pf);

    /* read-only with a sidecar: verifies, never writes it */
    struct stat before, after;
    stat(tpath, &before);
    pf = open_pf(KVP_PAGEFILE_READONLY, 0);
    CHECK_EQ(info_of(pf).tags, 2);
    CHECK_EQ(get(pf, PAGE, PAGE, 6, NULL, NULL, &err), -EBADMSG);
    CHECK_EQ(get(pf, 0, PAGE, 5, NULL, &same, &err), PAGE);
    kvp_pagefile_close(pf);
    stat(tpath, &after);
    CHECK_EQ(before.st_mtime, after.st_mtime);
    CHECK_EQ(before.st_size, after.st_size);

    /* an existing empty (sparse) file gets a fresh sidecar: zeros checked */
    reset();
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)FSIZE) == 0);
    close(fd);
    pf = open_pf(0, 0);
    CHECK_EQ(info_of(pf).tags, 1);
    kvp_pagefile_close(pf);
    tamper(100, "Q", 1);
    pf = open_pf(0, 0);
    CHECK_EQ(get(pf, 0, PAGE, 0, NULL, NULL, &err), -EBADMSG);
    CHECK(strstr(err.msg, "not zeros") != NULL);
    kvp_pagefile_close(pf);

    /* a stale sidecar of a removed page file is not reused by a new file */
    CHECK_EQ(unlink(path), 0);
    pf = open_pf(KVP_PAGEFILE_CREATE, 0);
    CHECK_EQ(get(pf, 0, PAGE, 0, NULL, NULL, &err), PAGE);
    kvp_pagefile_close(pf);

    /* a failed open removes the sidecar it made */
    reset();
    struct kvp_pagefile_opts o = pt_tags_opts(FSIZE, PAGE, 8, KVP_PAGEFILE_CREATE, 0);
    o.size = (uint64_t)1 << 62; /* cannot extend that far */
    struct kvp_pagefile *bad = NULL;
    CHECK(kvp_pagefile_open(path, &o, &bad, &err) != 0);
    CHECK(!exists(path) && !exists(tpath));
}

/* The vectored forms: a page over several segments, and blocks across them. */
static void test_vectored(int backend)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE, backend);
    if (!pf)
        return;
    uint64_t seed = 77;
    char *src = pt_alloc(PAGE), *dst = pt_alloc(PAGE);
    pt_fill(&seed, src, PAGE);
    /* uneven segments: 1000, 70000, the rest */
    struct kvp_pagefile_buf ws[3] = {{src, 1000}, {src + 1000, 70000}, {src + 71000, PAGE - 71000}};
    struct kvp_pagefile_buf rs[2] = {{dst, 5000}, {dst + 5000, PAGE - 5000}};
    struct kvp_pagefile_vop w = {2 * (int64_t)PAGE, ws, 3}, r = {2 * (int64_t)PAGE, rs, 2};
    const char *key[1] = {"v"}, *other[1] = {"w"};
    int64_t res;
    struct kvp_error err;
    CHECK_EQ(kvp_pagefile_writev_keyed(pf, &w, key, 1, &res, &err), 0);
    CHECK_EQ(kvp_pagefile_readv_keyed(pf, &r, key, 1, &res, &err), 0);
    CHECK(memcmp(src, dst, PAGE) == 0);
    /* the same page read plainly has the same digest */
    int same;
    seed = 77;
    CHECK_EQ(get(pf, 2 * (int64_t)PAGE, PAGE, 77, "v", &same, &err), PAGE);
    CHECK(same);
    CHECK_EQ(kvp_pagefile_readv_keyed(pf, &r, other, 1, &res, &err), -EBADMSG);
    CHECK_EQ(res, -EBADMSG);
    tamper(2 * (int64_t)PAGE + 69000, "T", 1);
    CHECK_EQ(kvp_pagefile_readv(pf, &r, 1, &res, &err), -EBADMSG);
    free(src);
    free(dst);
    kvp_pagefile_close(pf);
}

/* Threads writing and reading their own pages with keys: all verified. */
struct thr {
    struct kvp_pagefile *pf;
    uint32_t page;
    int bad;
};

static void *thr_run(void *arg)
{
    struct thr *t = arg;
    char key[16];
    snprintf(key, sizeof key, "t%u", t->page);
    struct kvp_error err;
    for (int round = 0; round < 20; round++) {
        int same = 0;
        if (put(t->pf, t->page, PAGE, (uint64_t)round + 100 * t->page, key) != 0 ||
            get(t->pf, (int64_t)t->page * PAGE, PAGE, (uint64_t)round + 100 * t->page, key, &same,
                &err) != PAGE ||
            !same)
            t->bad++;
    }
    return NULL;
}

static void test_threads(int backend)
{
    reset();
    struct kvp_pagefile *pf = open_pf(KVP_PAGEFILE_CREATE, backend);
    if (!pf)
        return;
    pthread_t tid[4];
    struct thr t[4];
    for (uint32_t i = 0; i < 4; i++) {
        t[i] = (struct thr){pf, i, 0};
        pthread_create(&tid[i], NULL, thr_run, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(tid[i], NULL);
        CHECK_EQ(t[i].bad, 0);
    }
    CHECK_EQ(info_of(pf).tags_verified, 80);
    kvp_pagefile_close(pf);
}

/* Pages larger than the psync piece and the hashing step (2 MiB in 1 MiB
 * pieces, 256 KiB steps), a batch of one and of several, buffered. */
static void test_big_pages(int backend)
{
    reset();
    const uint64_t big = 2u << 20;
    struct kvp_pagefile_opts o = pt_tags_opts(8 * big, big, 8, KVP_PAGEFILE_CREATE, backend);
    o.threads = 3;
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "tags big");
    if (!pf)
        return;
    char *src = pt_alloc(3 * big), *dst = pt_alloc(3 * big);
    uint64_t seed = 5;
    pt_fill(&seed, src, 3 * big);
    struct kvp_pagefile_op w[3], r[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (struct kvp_pagefile_op){(int64_t)(i * 2 + 1) * (int64_t)big, src + i * big, big};
        r[i] = (struct kvp_pagefile_op){w[i].offset, dst + i * big, big};
    }
    r[2].size = w[2].size = big - 65536 - 100; /* a last block that is short */
    int64_t res[3];
    struct kvp_error err;
    int rc = kvp_pagefile_write(pf, w, 3, res, &err);
    CHECK_EQ(rc, 0);
    if (rc)
        fprintf(stderr, "backend %d: %s\n", backend, err.msg);
    CHECK_EQ(kvp_pagefile_read(pf, r, 1, res, &err), 0); /* one op: pieces on the threads */
    CHECK_EQ(kvp_pagefile_read(pf, r, 3, res, &err), 0);
    CHECK(memcmp(src, dst, 2 * big + r[2].size) == 0);
    CHECK_EQ(info_of(pf).tags_verified, 4);
    tamper(w[1].offset + (int64_t)big - 1, "!", 1); /* the last byte of a page */
    CHECK_EQ(kvp_pagefile_read(pf, r, 3, res, &err), -EBADMSG);
    CHECK_EQ(res[1], -EBADMSG);
    CHECK_EQ(res[0], (int64_t)big);
    CHECK_EQ(res[2], (int64_t)r[2].size);
    free(src);
    free(dst);
    kvp_pagefile_close(pf);
}

/* kvp__pf_tag_copy (the USRBIO staging copies): the bytes copied, and the
 * digest the same as hashing them after the copy; a part of an op is only
 * copied. */
static void test_tag_copy(void)
{
    const uint64_t len = (2u << 20) - 65536 - 100; /* a last block that is short */
    char *src = pt_alloc(len), *dst = pt_alloc(len);
    uint64_t seed = 9;
    pt_fill(&seed, src, len);
    struct kvp_pagefile_op op = {0, dst, len};
    uint8_t want = 1;
    uint64_t digest = 0, bytes = 0;
    struct kvp__pf_batch b = {
        .ops = &op, .n = 1, .tag_want = &want, .tag_digest = &digest, .tag_bytes = &bytes};
    kvp__pf_tag_copy(&b, 0, dst, src, len);
    CHECK(memcmp(src, dst, len) == 0);
    CHECK_EQ(bytes, len);
    CHECK_EQ(digest, kvp__pf_tag_blocks(src, len, 0, len));
    memset(dst, 0, len);
    kvp__pf_tag_copy(&b, 0, dst, src, len - 1); /* short: copied, not hashed */
    CHECK(memcmp(src, dst, len - 1) == 0);
    CHECK_EQ(bytes, len);
    free(src);
    free(dst);
}

/* USRBIO with the pool in the backend's memory (zero-copy: the digests are
 * hashed while the daemon works, or after the batch on two threads), also
 * with completions handed back a few at a time: what it writes verifies
 * through psync and kvp_pagefile_verify, a changed page is rejected. */
static void test_usrbio_zero_copy(int few)
{
    if (!pt_usrbio())
        return;
    reset();
    const uint64_t pg = 512u << 10;
    if (few)
        setenv("KVPAGE_USRBIO_EMU_FEW", "1", 1);
    struct kvp_pagefile_opts o =
        pt_tags_opts(16 * pg, pg, 8, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_USRBIO);
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "tags usrbio");
    unsetenv("KVPAGE_USRBIO_EMU_FEW");
    if (!pf)
        return;
    struct kvp_error err;
    char *pool = kvp_pagefile_alloc(pf, 8 * pg, &err), *copy = pt_alloc(8 * pg);
    struct kvp_pagefile_buf reg = {pool, 8 * pg};
    CHECK(pool != NULL);
    if (!pool || kvp_pagefile_register_buffers(pf, &reg, 1, &err) != 0) {
        CHECK(0);
        free(copy);
        kvp_pagefile_close(pf);
        return;
    }
    uint64_t seed = 11;
    pt_fill(&seed, pool, 8 * pg);
    memcpy(copy, pool, 8 * pg);
    struct kvp_pagefile_op ops[8];
    int64_t res[8];
    for (int i = 0; i < 8; i++)
        ops[i] = (struct kvp_pagefile_op){(int64_t)((i * 5) % 16) * (int64_t)pg, pool + i * pg, pg};
    CHECK_EQ(kvp_pagefile_write(pf, ops, 8, res, &err), 0);
    memset(pool, 0, 8 * pg);
    CHECK_EQ(kvp_pagefile_read(pf, ops, 8, res, &err), 0);
    CHECK(memcmp(pool, copy, 8 * pg) == 0);
    CHECK_EQ(info_of(pf).tags_verified, 8);
    /* the same digests as any other backend's */
    o.backend = KVP_PAGEFILE_BACKEND_PSYNC;
    o.flags = 0;
    struct kvp_pagefile *ps = pt_open_or_skip(path, &o, "tags usrbio psync");
    if (ps) {
        char *back = pt_alloc(8 * pg);
        struct kvp_pagefile_op r[8];
        for (int i = 0; i < 8; i++)
            r[i] = (struct kvp_pagefile_op){ops[i].offset, back + i * pg, pg};
        CHECK_EQ(kvp_pagefile_read(ps, r, 8, res, &err), 0);
        CHECK(memcmp(back, copy, 8 * pg) == 0);
        struct kvp_pagefile_verify_counts c = {.check_size = sizeof c};
        CHECK_EQ(kvp_pagefile_verify(ps, NULL, NULL, &c, &err), 0);
        CHECK_EQ(c.tagged, 8);
        free(back);
        kvp_pagefile_close(ps);
    }
    tamper(ops[6].offset + (int64_t)pg / 2, "!", 1);
    CHECK_EQ(kvp_pagefile_read(pf, ops, 8, res, &err), -EBADMSG);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(res[i], i == 6 ? -EBADMSG : (int64_t)pg);
    kvp_pagefile_free(pf, pool);
    free(copy);
    kvp_pagefile_close(pf);
}

/* Reads that complete together leave their digests to kvp__pf_tags_tail,
 * which hashes 1 MiB or more of them on two threads: the helper thread takes
 * part (tried until it does, however busy the machine), what was written
 * verifies, and a page changed in such a batch is still rejected. */
static void test_helper(int backend)
{
    if (kvp__pf_cpus() < 2)
        return;
    reset();
    const uint64_t pg = 1u << 20;
    struct kvp_pagefile_opts o = pt_tags_opts(8 * pg, pg, 8, KVP_PAGEFILE_CREATE, backend);
    struct kvp_pagefile *pf = pt_open_or_skip(path, &o, "tags helper");
    if (!pf)
        return;
    char *src = pt_alloc(8 * pg), *dst = pt_alloc(8 * pg);
    uint64_t seed = 13;
    pt_fill(&seed, src, 8 * pg);
    struct kvp_pagefile_op w[8], r[8];
    int64_t res[8];
    for (int i = 0; i < 8; i++) {
        w[i] = (struct kvp_pagefile_op){(int64_t)i * (int64_t)pg, src + i * pg, pg};
        r[i] = (struct kvp_pagefile_op){w[i].offset, dst + i * pg, pg};
    }
    struct kvp_error err;
    CHECK_EQ(kvp_pagefile_write(pf, w, 8, res, &err), 0);
    struct kvp_pagefile_verify_counts c = {.check_size = sizeof c};
    CHECK_EQ(kvp_pagefile_verify(pf, NULL, NULL, &c, &err), 0);
    CHECK_EQ(c.tagged, 8);
    uint64_t before = kvp__pf_tags_helped();
    int n = 0;
    /* uring leaves them (USRBIO's staged reads and psync hash as they copy) */
    int uring = backend == KVP_PAGEFILE_BACKEND_URING;
    for (; n < (uring ? 2000 : 1) && kvp__pf_tags_helped() == before; n++) {
        memset(dst, 0, 8 * pg);
        CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &err), 0);
        CHECK(memcmp(src, dst, 8 * pg) == 0);
    }
    if (uring)
        CHECK(kvp__pf_tags_helped() > before);
    CHECK_EQ(info_of(pf).tags_verified, 8 * (uint64_t)n);
    tamper(w[7].offset, "!", 1);
    CHECK_EQ(kvp_pagefile_read(pf, r, 8, res, &err), -EBADMSG);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(res[i], i == 7 ? -EBADMSG : (int64_t)pg);
    free(src);
    free(dst);
    kvp_pagefile_close(pf);
}

int main(void)
{
    pt_mkdir("tags");
    pt_path(path, sizeof path, "p.pages");
    snprintf(tpath, sizeof tpath, "%s.tags", path);
    for (int b = 0; b < PT_NBACKENDS; b++) {
        test_write_read(pt_backends[b]);
        test_torn(pt_backends[b]);
        test_vectored(pt_backends[b]);
        test_threads(pt_backends[b]);
        test_big_pages(pt_backends[b]);
        test_helper(pt_backends[b]);
    }
    test_tag_copy();
    test_usrbio_zero_copy(0);
    test_usrbio_zero_copy(1);
    test_sigkill();
    test_legacy();
    pt_rmdir();
    return pt_finish();
}
