/*
 * test_store_vec — kvp_store_putv / kvp_store_getv (a page as several
 * buffers) and the page file's vectored ops under them, on every way the
 * page file moves them: psync (one preadv/pwritev), io_uring (one SQE per
 * segment), psync with mmap reads (one op per segment), O_DIRECT with
 * aligned segments (without a copy) and unaligned ones (staged), and USRBIO
 * on the emulated 3FS library when KVPAGE_USRBIO_LIB is set (CTest sets it).
 *
 * Each round: pages whose segments fill the page and pages that fill less,
 * with zero-length segments among them; read back into zeroed segments and
 * compared byte for byte, and read as one buffer to check that the segments
 * lie back to back; a plain put read back in segments; a missing key leaves
 * its segments untouched; refused calls (too long, a NULL segment, too many
 * segments) change nothing; a failed write releases its page. And the page
 * file's own checks of a vectored batch and, with psync and io_uring, a
 * short read (the file truncated under the handle) giving the bytes of the
 * leading part and -EIO.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/store.h"
#include "pagefile/pf_internal.h"
#include "rng.h"
#include "scratch.h"

#define BPP 16384u
#define NKEYS 12

static char tmpdir[256];
static int64_t fail_writes; /* 1: the fault hook fails every write */

static int64_t hook(void *arg, int site, int64_t off, uint64_t len)
{
    (void)arg, (void)off, (void)len;
    if (__atomic_load_n(&fail_writes, __ATOMIC_RELAXED) &&
        (site == KVP__PF_PWRITE || site == KVP__PF_URING_WRITE || site == KVP__PF_USRBIO_WRITE))
        return -EIO;
    return 0;
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    rng_fill(&seed, buf, len);
}

struct config {
    const char *name;
    int backend;
    uint32_t flags;
    int aligned; /* O_DIRECT: 1 segments aligned, 0 not (staged) */
};

/* Segment lengths of key i (0-terminated list, -1 ends), summing to the page
 * or less; with O_DIRECT the sums are multiples of 4096, and with aligned
 * every length is. */
static const int64_t seg_plain[][6] = {
    {5000, 0, 3000, 8384, -1}, /* the whole page, a zero-length segment */
    {100, 200, -1},            /* less */
    {BPP, -1},                 /* one segment */
    {1, 1, 1, 1, 16380, -1},   /* the whole page, tiny pieces */
};
static const int64_t seg_direct_aligned[][6] = {
    {4096, 0, 8192, 4096, -1},
    {4096, 4096, -1},
    {BPP, -1},
    {8192, -1},
};
static const int64_t seg_direct_unaligned[][6] = {
    {1000, 0, 3096, 12288, -1},
    {4000, 96, -1},
    {5, 16379, -1},
    {4096, 4096, -1}, /* aligned lengths at unaligned addresses */
};

static const int64_t *segs_of(const struct config *c, int i)
{
    if (!(c->flags & KVP_PAGEFILE_DIRECT))
        return seg_plain[i % 4];
    return c->aligned ? seg_direct_aligned[i % 4] : seg_direct_unaligned[i % 4];
}

/* Key i's segments: each its own allocation, at 4096 (aligned) or at an odd
 * address, filled with the key's bytes (zeroed when zero). */
struct key_bufs {
    struct kvp_store_buf b[6];
    void *mem[6];
    size_t n;
    uint64_t len;
};

static void key_bufs(const struct config *c, int i, int zero, struct key_bufs *k)
{
    const int64_t *l = segs_of(c, i);
    uint8_t whole[BPP];
    fill(whole, BPP, (uint64_t)i);
    k->n = 0;
    k->len = 0;
    for (; l[k->n] >= 0; k->n++) {
        size_t len = (size_t)l[k->n];
        void *p = NULL;
        if (posix_memalign(&p, 4096, len + 4096 + 1))
            abort();
        k->mem[k->n] = p;
        uint8_t *base = (uint8_t *)p + (c->aligned || !(c->flags & KVP_PAGEFILE_DIRECT) ? 0 : 1);
        if (zero)
            memset(base, 0, len);
        else
            memcpy(base, whole + k->len, len);
        k->b[k->n] = (struct kvp_store_buf){len ? base : NULL, len};
        k->len += len;
    }
}

static void key_free(struct key_bufs *k)
{
    for (size_t s = 0; s < k->n; s++)
        free(k->mem[s]);
}

/* The segments hold the key's first len bytes. */
static int key_same(const struct key_bufs *k, int i)
{
    uint8_t whole[BPP];
    fill(whole, BPP, (uint64_t)i);
    uint64_t o = 0;
    for (size_t s = 0; s < k->n; s++) {
        if (k->b[s].len && memcmp(k->b[s].base, whole + o, k->b[s].len))
            return 0;
        o += k->b[s].len;
    }
    return o == k->len;
}

static char keyname[NKEYS][16];
static struct kvp_str keys[NKEYS];

static int open_store(const struct config *c, struct kvp_store **s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, c->name);
    struct kvp_pagefile_opts po;
    kvp_pagefile_opts_init(&po);
    po.backend = c->backend;
    po.flags = c->flags;
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = 64 * BPP;
    o.bytes_per_page = BPP;
    o.entries = 4; /* several pieces per call, and split ops over entries */
    o.meta = "mem:";
    o.pagefile = &po;
    struct kvp_error err = {0};
    int rc = kvp_store_open(&o, s, &err);
    if (rc)
        printf("SKIP %s: kvp_store_open: %d %s\n", c->name, rc, err.msg);
    return rc;
}

static void round_trip(const struct config *c, struct kvp_store *s)
{
    struct key_bufs in[NKEYS], out[NKEYS];
    struct kvp_store_bufv v[NKEYS], w[NKEYS];
    int64_t res[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        key_bufs(c, i, 0, &in[i]);
        key_bufs(c, i, 1, &out[i]);
        v[i] = (struct kvp_store_bufv){in[i].b, in[i].n};
        w[i] = (struct kvp_store_bufv){out[i].b, out[i].n};
    }
    struct kvp_error err = {0};
    CHECK_EQ(kvp_store_putv(s, keys, v, NKEYS, res, &err), 0);
    for (int i = 0; i < NKEYS; i++)
        CHECK_EQ(res[i], KVP_STORE_STORED);
    CHECK_EQ(kvp_store_getv(s, keys, w, NKEYS, res, &err), NKEYS);
    for (int i = 0; i < NKEYS; i++) {
        CHECK_EQ(res[i], (int64_t)in[i].len);
        CHECK(key_same(&out[i], i));
    }
    /* One buffer reads the segments back to back. */
    uint8_t *one = NULL;
    if (posix_memalign((void **)&one, 4096, BPP))
        abort();
    for (int i = 0; i < NKEYS; i++) {
        memset(one, 0, BPP);
        struct kvp_store_buf b = {one, in[i].len};
        int64_t r;
        CHECK_EQ(kvp_store_get(s, &keys[i], &b, 1, &r, &err), 1);
        struct key_bufs k = {.b = {{one, in[i].len}}, .n = 1, .len = in[i].len};
        CHECK(key_same(&k, i));
    }
    /* A plain put read back in segments. */
    struct kvp_str pk = {"plain", 5};
    uint8_t *src = NULL;
    if (posix_memalign((void **)&src, 4096, BPP))
        abort();
    fill(src, BPP, 0); /* key 0's bytes */
    struct kvp_store_buf pb = {src, in[0].len};
    int64_t r;
    CHECK_EQ(kvp_store_put(s, &pk, &pb, 1, &r, &err), 0);
    struct key_bufs z;
    key_bufs(c, 0, 1, &z);
    struct kvp_store_bufv zv = {z.b, z.n};
    CHECK_EQ(kvp_store_getv(s, &pk, &zv, 1, &r, &err), 1);
    CHECK_EQ(r, (int64_t)in[0].len);
    CHECK(key_same(&z, 0));
    key_free(&z);
    /* A missing key: -ENOENT, its segments untouched, the next still read. */
    struct kvp_str mk[2] = {{"missing", 7}, keys[1]};
    key_bufs(c, 0, 1, &z);
    for (size_t g = 0; g < z.n; g++)
        if (z.b[g].len)
            memset(z.b[g].base, 0xa5, z.b[g].len);
    struct key_bufs z1;
    key_bufs(c, 1, 1, &z1);
    struct kvp_store_bufv mv[2] = {{z.b, z.n}, {z1.b, z1.n}};
    int64_t mr[2];
    CHECK_EQ(kvp_store_getv(s, mk, mv, 2, mr, &err), 0);
    CHECK_EQ(mr[0], -ENOENT);
    CHECK_EQ(mr[1], (int64_t)in[1].len);
    CHECK(key_same(&z1, 1));
    int untouched = 1;
    for (size_t g = 0; g < z.n; g++)
        for (uint64_t b = 0; b < z.b[g].len; b++)
            untouched &= ((uint8_t *)z.b[g].base)[b] == 0xa5;
    CHECK(untouched);
    key_free(&z);
    key_free(&z1);
    free(src);
    free(one);
    for (int i = 0; i < NKEYS; i++) {
        key_free(&in[i]);
        key_free(&out[i]);
    }
}

static uint64_t held_keys(struct kvp_store *s)
{
    struct kvp_store_stats st = {.stats_size = sizeof st};
    CHECK_EQ(kvp_store_stats(s, &st, NULL), 0);
    return st.keys + st.reserved;
}

/* Refused calls change nothing; a failed write releases its page. */
static void refusals(const struct config *c, struct kvp_store *s)
{
    uint64_t before = held_keys(s);
    static uint8_t a[BPP], b[BPP];
    struct kvp_str k[2] = {{"new-a", 5}, {"new-b", 5}};
    struct kvp_store_buf ok[1] = {{a, 4096}};
    struct kvp_store_buf too_long[2] = {{a, BPP}, {b, 1}};
    struct kvp_store_buf null_seg[2] = {{a, 4096}, {NULL, 4096}};
    struct kvp_store_bufv v[2] = {{ok, 1}, {too_long, 2}};
    int64_t res[2] = {77, 77};
    struct kvp_error err = {0};
    CHECK_EQ(kvp_store_putv(s, k, v, 2, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_SIZE);
    CHECK_EQ(err.index, 1);
    CHECK_EQ(res[0], 77);
    v[1] = (struct kvp_store_bufv){null_seg, 2};
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_store_putv(s, k, v, 2, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_ARG);
    CHECK_EQ(err.index, 1);
    v[1] = (struct kvp_store_bufv){NULL, 2};
    CHECK_EQ(kvp_store_putv(s, k, v, 2, res, &err), -EINVAL);
    v[1] = (struct kvp_store_bufv){ok, KVP_PAGEFILE_MAX_SEGS + 1};
    CHECK_EQ(kvp_store_putv(s, k, v, 2, res, &err), -EINVAL);
    CHECK_EQ(kvp_store_putv(s, k, NULL, 2, res, &err), -EINVAL);
    CHECK(strstr(err.msg, "bufv") != NULL);
    v[1] = (struct kvp_store_bufv){too_long, 2};
    memset(a, 0x5a, sizeof a);
    CHECK_EQ(kvp_store_getv(s, k, v, 2, res, &err), -EINVAL);
    CHECK_EQ(a[0], 0x5a);
    CHECK_EQ(held_keys(s), before);
    uint8_t there[2] = {9, 9};
    CHECK_EQ(kvp_store_exists(s, k, 2, there, NULL), 0);
    CHECK_EQ(there[0], 0);
    /* A zero-length segment may be NULL. */
    struct kvp_store_buf zl[3] = {{NULL, 0}, {a, 4096}, {NULL, 0}};
    v[0] = (struct kvp_store_bufv){zl, 3};
    CHECK_EQ(kvp_store_putv(s, k, v, 1, res, &err), 0);
    CHECK_EQ(res[0], KVP_STORE_STORED);
    /* Every write failing: nothing stored, no page left reserved. */
    before = held_keys(s);
    __atomic_store_n(&fail_writes, 1, __ATOMIC_RELAXED);
    kvp__pagefile_set_fault(hook,
                            NULL); /* (only here: with a hook psync goes segment by segment) */
    struct kvp_store_buf two[2] = {{a, 4096}, {b, 4096}};
    if (c->flags & KVP_PAGEFILE_DIRECT && !c->aligned)
        two[1].base = b + 1; /* staged */
    v[1] = (struct kvp_store_bufv){two, 2};
    CHECK_EQ(kvp_store_putv(s, &k[1], &v[1], 1, res, &err), -EIO);
    CHECK_EQ(res[0], -EIO);
    __atomic_store_n(&fail_writes, 0, __ATOMIC_RELAXED);
    kvp__pagefile_set_fault(NULL, NULL);
    CHECK_EQ(held_keys(s), before);
    CHECK_EQ(kvp_store_exists(s, &k[1], 1, NULL, NULL), 0);
}

static void run(const struct config *c)
{
    struct kvp_store *s;
    if (open_store(c, &s))
        return;
    int before = check_failed;
    round_trip(c, s);
    refusals(c, s);
    printf("%s: %s\n", c->name, check_failed == before ? "ok" : "FAILED");
    kvp_store_close(s);
}

/* The page file's own checks of a vectored op, and a short read's result
 * (the file truncated under the handle): the bytes of the leading part. */
static void pagefile_checks(int backend)
{
    char path[512];
    snprintf(path, sizeof path, "%s/pf%d", tmpdir, backend);
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.backend = backend;
    o.size = 4 * BPP;
    o.bytes_per_page = BPP;
    o.entries = 2;
    o.flags = KVP_PAGEFILE_CREATE;
    struct kvp_pagefile *pf;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_pagefile_open(path, &o, &pf, &err), 0);
    if (!pf)
        return;
    static uint8_t a[BPP], b[BPP];
    struct kvp_pagefile_buf seg[2] = {{a, 100}, {b, 50}};
    struct kvp_pagefile_vop op[3] = {{BPP, seg, 2}, {0, seg, 2}, {0, seg, 2}};
    int64_t res[3] = {7, 7, 7};
    CHECK_EQ(kvp_pagefile_writev(pf, op, 3, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_TOO_MANY);
    op[1].offset = 4 * BPP - 100; /* past the end with 150 bytes */
    CHECK_EQ(kvp_pagefile_writev(pf, op, 2, res, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_OFFSET);
    CHECK_EQ(res[0], 7);
    op[1].offset = 0;
    fill(a, 100, 1);
    fill(b, 50, 2);
    CHECK_EQ(kvp_pagefile_writev(pf, op, 2, res, &err), 0);
    CHECK_EQ(res[0], 150);
    uint8_t whole[150], want[150];
    memcpy(want, a, 100);
    memcpy(want + 100, b, 50);
    struct kvp_pagefile_op rd = {BPP, whole, 150};
    CHECK_EQ(kvp_pagefile_read(pf, &rd, 1, res, &err), 0);
    CHECK(memcmp(whole, want, 150) == 0);
    CHECK_EQ(truncate(path, BPP + 120), 0);
    uint8_t c[100], d[50];
    memset(d, 0xee, sizeof d);
    struct kvp_pagefile_buf rseg[2] = {{c, 100}, {d, 50}};
    struct kvp_pagefile_vop rop = {BPP, rseg, 2};
    CHECK_EQ(kvp_pagefile_readv(pf, &rop, 1, res, &err), -EIO);
    CHECK_EQ(res[0], 120);
    CHECK(memcmp(c, want, 100) == 0 && memcmp(d, want + 100, 20) == 0 && d[20] == 0xee);
    kvp_pagefile_close(pf);
}

int main(void)
{
    scratch_make(tmpdir, sizeof tmpdir, "test_store_vec", 1);
    const char *ub = getenv("KVPAGE_USRBIO_LIB");
    if (ub && *ub)
        scratch_usrbio_mount(tmpdir, 1); /* AUTO as without 3FS; USRBIO asked below */
    for (int i = 0; i < NKEYS; i++) {
        snprintf(keyname[i], sizeof keyname[i], "key-%d", i);
        keys[i] = (struct kvp_str){keyname[i], strlen(keyname[i])};
    }
    pagefile_checks(KVP_PAGEFILE_BACKEND_PSYNC);
    pagefile_checks(KVP_PAGEFILE_BACKEND_URING);
    const struct config cs[] = {
        {"psync", KVP_PAGEFILE_BACKEND_PSYNC, 0, 1},
        {"uring", KVP_PAGEFILE_BACKEND_URING, 0, 1},
        {"psync_mmap", KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_MMAP_READS, 1},
        {"psync_direct", KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_DIRECT, 1},
        {"psync_direct_unaligned", KVP_PAGEFILE_BACKEND_PSYNC, KVP_PAGEFILE_DIRECT, 0},
        {"uring_direct", KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_DIRECT, 1},
        {"uring_direct_unaligned", KVP_PAGEFILE_BACKEND_URING, KVP_PAGEFILE_DIRECT, 0},
        {"usrbio", KVP_PAGEFILE_BACKEND_USRBIO, 0, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        if (cs[i].backend == KVP_PAGEFILE_BACKEND_USRBIO && !(ub && *ub)) {
            printf("SKIP usrbio: KVPAGE_USRBIO_LIB is not set\n");
            continue;
        }
        run(&cs[i]);
    }
    scratch_remove(tmpdir);
    return check_report();
}
