/*
 * pf_tags.c — integrity tags: the sidecar PATH.tags beside a page file, its
 * records, and the checks of writes and reads (kvpage/pagefile.h,
 * "Integrity tags").
 *
 * The sidecar: a 4096-byte header, then one 32-byte record per slot of
 * slot_size bytes of the page file. It is mapped shared, and its records are
 * read and written with 64-bit atomics: many threads (and processes) of one
 * file touch them at once, and no system call is paid per op. A record's
 * last word holds its state and a check over the first 28 bytes, so a
 * record read while another thread rewrites it (or half written back before
 * a power cut) fails the check and counts as BAD: its page is rejected,
 * never served with a digest it does not match.
 *
 * Write order: BAD, the data, then the tag. Whatever stops a write between
 * (an error, SIGKILL, a power cut with the sidecar's page written back or
 * not) leaves a record that the bytes do not match: the page reads as
 * missing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t, for blocks that span segments */
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include "pagefile/pf_internal.h"

#define TAGS_HDR 4096u
#define TAGS_REC 32u
#define TAGS_MAGIC "KVPTAGS1"
#define TAGS_VERSION 1u

enum { TAG_NONE = 0, TAG_TAGGED = 1, TAG_UNTAGGED = 2, TAG_BAD = 3 };

/* The header's first 32 bytes (the rest of its 4096 are zeros). */
struct tags_hdr {
    char magic[8];
    uint32_t version;
    uint32_t legacy;
    uint64_t slot_size;
    uint64_t check; /* XXH3_64 of the 24 bytes above */
};

struct kvp__pf_tags {
    int fd;     /* -1: no sidecar (a read-only handle on a file without one) */
    char *path; /* PATH.tags */
    char *map;  /* the sidecar from offset 0, or NULL */
    size_t maplen;
    uint64_t nrec; /* records mapped */
    uint64_t slot_size;
    int legacy, readonly;
    atomic_uint_fast64_t verified, rejected, unverified;
    atomic_int noted; /* 0 none, 1 being written, 2 note set */
    char note[256];
    /* The helper thread of kvp__pf_tags_tail: started on first use, joined
     * at close (so a process with no handle open has no thread of ours). */
    pthread_mutex_t hmu;
    pthread_cond_t hcv;
    pthread_t htid;
    atomic_int hstate; /* 0 not started, 1 running, -1 could not start */
    int hstop;
    struct tag_job *_Atomic hjob; /* posted, not yet taken */
};

/* ---- hashing ---------------------------------------------------------- */

/* libxxhash's XXH3, the runtime-dispatched entry on x86-64 (AVX2/AVX-512
 * where the CPU has them: several times the plain SSE2 entry's speed). */
static uint64_t tag_hash(const void *p, size_t len, uint64_t seed)
{
#if defined(__x86_64__)
    return XXH3_64bits_withSeed_dispatch(p, len, seed);
#else
    return XXH3_64bits_withSeed(p, len, seed);
#endif
}

static uint64_t tag_seed(uint64_t oplen, uint64_t block)
{
    return (oplen << 24) ^ block;
}

uint64_t kvp__pf_tag_blocks(const void *p, uint64_t oplen, uint64_t from, uint64_t len)
{
    uint64_t d = 0;
    const char *c = p;
    for (uint64_t o = 0; o < len; o += KVP__PF_TAG_BLOCK) {
        uint64_t l = len - o < KVP__PF_TAG_BLOCK ? len - o : KVP__PF_TAG_BLOCK;
        d ^= tag_hash(c + o, (size_t)l, tag_seed(oplen, (from + o) / KVP__PF_TAG_BLOCK));
    }
    return d;
}

/* The digest of an op laid over segments (a vectored op): a block that
 * spans segments is hashed with XXH3's streaming state. */
static uint64_t tag_digest_segs(const struct kvp_pagefile_buf *segs, size_t nsegs, uint64_t len)
{
    uint64_t d = 0, at = 0; /* at: the op's byte where segment s starts */
    size_t s = 0;
    XXH3_state_t st;
    XXH3_INITSTATE(&st); /* xxhash 0.8.1 reads the seed of the state before reset_withSeed */
    for (uint64_t b = 0; b < len; b += KVP__PF_TAG_BLOCK) {
        uint64_t bl = len - b < KVP__PF_TAG_BLOCK ? len - b : KVP__PF_TAG_BLOCK;
        while (s < nsegs && at + segs[s].len <= b)
            at += segs[s++].len;
        if (s < nsegs && at + segs[s].len >= b + bl) { /* within one segment */
            d ^= kvp__pf_tag_blocks((const char *)segs[s].base + (b - at), len, b, bl);
            continue;
        }
        XXH3_64bits_reset_withSeed(&st, tag_seed(len, b / KVP__PF_TAG_BLOCK));
        uint64_t o = b, sa = at;
        for (size_t k = s; k < nsegs && o < b + bl; sa += segs[k++].len) {
            if (sa + segs[k].len <= o)
                continue;
            uint64_t e = sa + segs[k].len < b + bl ? sa + segs[k].len : b + bl;
#if defined(__x86_64__)
            XXH3_64bits_update_dispatch(&st, (const char *)segs[k].base + (o - sa),
                                        (size_t)(e - o));
#else
            XXH3_64bits_update(&st, (const char *)segs[k].base + (o - sa), (size_t)(e - o));
#endif
            o = e;
        }
        d ^= XXH3_64bits_digest(&st);
    }
    return d;
}

/* The digest of op i of a batch: plain (buf) or vectored. */
static uint64_t tag_digest(const struct kvp_pagefile_op *op, const struct kvp_pagefile_vop *vop)
{
    if (vop)
        return tag_digest_segs(vop->segs, vop->nsegs, op->size);
    return kvp__pf_tag_blocks(op->buf, op->size, 0, op->size);
}

static int zero_mem(const char *p, uint64_t len)
{
    return len == 0 || (p[0] == 0 && memcmp(p, p + 1, (size_t)len - 1) == 0);
}

/* 1 when bytes [a, b) of the op are zeros. */
static int tag_zero(const struct kvp_pagefile_op *op, const struct kvp_pagefile_vop *vop,
                    uint64_t a, uint64_t b)
{
    if (!vop)
        return zero_mem((const char *)op->buf + a, b - a);
    uint64_t at = 0;
    for (size_t s = 0; s < vop->nsegs && at < b; at += vop->segs[s++].len) {
        uint64_t lo = a > at ? a : at, hi = at + vop->segs[s].len < b ? at + vop->segs[s].len : b;
        if (lo < hi && !zero_mem((const char *)vop->segs[s].base + (lo - at), hi - lo))
            return 0;
    }
    return 1;
}

static uint64_t tag_key(const char *const *keys, size_t i)
{
    if (!keys || !keys[i])
        return 0;
    uint64_t h = XXH3_64bits(keys[i], strlen(keys[i]));
    return h ? h : 1; /* 0 is "no key" */
}

/* ---- records ---------------------------------------------------------- */

struct rec {
    uint64_t digest, key, len;
    uint32_t state;
};

static uint32_t rec_check(const struct rec *r)
{
    unsigned char b[28];
    memcpy(b, &r->digest, 8);
    memcpy(b + 8, &r->key, 8);
    memcpy(b + 16, &r->len, 8);
    memcpy(b + 24, &r->state, 4);
    return (uint32_t)XXH3_64bits(b, sizeof b);
}

static uint64_t *rec_at(const struct kvp__pf_tags *t, uint64_t slot)
{
    return (uint64_t *)(void *)(t->map + TAGS_HDR + slot * TAGS_REC);
}

/* The record of a slot; a record that fails its check reads as BAD
 * (*damaged set). Slots past the mapped records are NONE. */
static struct rec rec_load(const struct kvp__pf_tags *t, uint64_t slot, int *damaged)
{
    struct rec r = {0, 0, 0, TAG_NONE};
    *damaged = 0;
    if (!t->map || slot >= t->nrec)
        return r;
    uint64_t *w = rec_at(t, slot);
    uint64_t sc = __atomic_load_n(&w[3], __ATOMIC_ACQUIRE);
    r.digest = __atomic_load_n(&w[0], __ATOMIC_RELAXED);
    r.key = __atomic_load_n(&w[1], __ATOMIC_RELAXED);
    r.len = __atomic_load_n(&w[2], __ATOMIC_RELAXED);
    r.state = (uint32_t)sc;
    if (sc == 0 && r.digest == 0 && r.key == 0 && r.len == 0)
        return r; /* never written */
    if (sc == TAG_BAD)
        return r; /* a write in progress or failed (rec_bad) */
    if (r.state > TAG_BAD || (uint32_t)(sc >> 32) != rec_check(&r)) {
        *damaged = 1;
        r.state = TAG_BAD;
    }
    return r;
}

static void rec_store(struct kvp__pf_tags *t, uint64_t slot, struct rec r)
{
    uint64_t *w = rec_at(t, slot);
    uint64_t sc = r.state | (uint64_t)rec_check(&r) << 32;
    __atomic_store_n(&w[0], r.digest, __ATOMIC_RELAXED);
    __atomic_store_n(&w[1], r.key, __ATOMIC_RELAXED);
    __atomic_store_n(&w[2], r.len, __ATOMIC_RELAXED);
    __atomic_store_n(&w[3], sc, __ATOMIC_RELEASE);
}

/* BAD first: stored before the write's data, seen before the words after it. */
static void rec_bad(struct kvp__pf_tags *t, uint64_t slot)
{
    /* A sequentially consistent store (a full barrier on x86-64), not a
     * relaxed one and a fence: ThreadSanitizer does not model fences
     * (gcc's -Wtsan), and this is the same order. */
    __atomic_store_n(&rec_at(t, slot)[3], (uint64_t)TAG_BAD, __ATOMIC_SEQ_CST);
}

/* ---- the sidecar ------------------------------------------------------ */

static uint64_t hdr_check(const struct tags_hdr *h)
{
    return XXH3_64bits(h, offsetof(struct tags_hdr, check));
}

/* 1 when the page file holds data (anything but holes), as far as lseek says. */
static int file_has_data(int fd, uint64_t size)
{
    if (size == 0)
        return 0;
    off_t d = lseek(fd, 0, SEEK_DATA);
    if (d < 0)
        return errno != ENXIO; /* ENXIO: only holes; anything else: assume data */
    return (uint64_t)d < size;
}

static int tags_init(struct kvp__pf_tags *t, struct kvp_pagefile *pf, int legacy,
                     struct kvp_error *err)
{
    char *h = calloc(1, TAGS_HDR);
    if (!h)
        return kvp__pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    struct tags_hdr hd;
    memset(&hd, 0, sizeof hd);
    memcpy(hd.magic, TAGS_MAGIC, 8);
    hd.version = TAGS_VERSION;
    hd.legacy = (uint32_t)legacy;
    hd.slot_size = pf->bytes_per_page;
    hd.check = hdr_check(&hd);
    memcpy(h, &hd, sizeof hd);
    int rc = 0;
    if (ftruncate(t->fd, 0) != 0 || kvp__pf_pio(t->fd, 1, h, TAGS_HDR, 0) != TAGS_HDR)
        rc = kvp__pf_fail(err, errno ? -errno : -EIO, KVP_RULE_IO, -1, 0,
                          "cannot write the tags sidecar %s: %s", t->path, strerror(errno));
    free(h);
    return rc;
}

static int tags_read_hdr(struct kvp__pf_tags *t, struct kvp_error *err)
{
    struct tags_hdr hd;
    memset(&hd, 0, sizeof hd);
    int64_t r = kvp__pf_pio(t->fd, 0, &hd, sizeof hd, 0);
    if (r < 0)
        return kvp__pf_fail(err, (int)r, KVP_RULE_IO, -1, 0, "cannot read %s: %s", t->path,
                            strerror((int)-r));
    if (r != (int64_t)sizeof hd || memcmp(hd.magic, TAGS_MAGIC, 8) != 0 ||
        hd.version != TAGS_VERSION || hd.check != hdr_check(&hd) || hd.slot_size == 0)
        return kvp__pf_fail(err, -EBADMSG, KVP_RULE_INTEGRITY, -1, 0,
                            "%s is not a kvpage tags sidecar of version %u (damaged?); remove it "
                            "(the pages then read unverified) or open with tags off",
                            t->path, TAGS_VERSION);
    t->slot_size = hd.slot_size;
    t->legacy = hd.legacy != 0;
    return 0;
}

void kvp__pf_tags_close(struct kvp_pagefile *pf, int remove)
{
    struct kvp__pf_tags *t = pf->tags;
    if (!t)
        return;
    if (atomic_load(&t->hstate) == 1) {
        pthread_mutex_lock(&t->hmu);
        t->hstop = 1;
        pthread_cond_signal(&t->hcv);
        pthread_mutex_unlock(&t->hmu);
        pthread_join(t->htid, NULL);
    }
    pthread_cond_destroy(&t->hcv);
    pthread_mutex_destroy(&t->hmu);
    if (t->map)
        munmap(t->map, t->maplen);
    if (t->fd >= 0)
        close(t->fd);
    if (remove && t->path)
        unlink(t->path);
    free(t->path);
    free(t);
    pf->tags = NULL;
}

int kvp__pf_tags_open(struct kvp_pagefile *pf, int created, int *made, struct kvp_error *err)
{
    *made = 0;
    pf->tags_mode = 0;
    if (pf->flags & KVP_PAGEFILE_NO_TAGS)
        return 0;
    struct stat st;
    if (fstat(pf->fd, &st) == 0 && S_ISBLK(st.st_mode)) {
        kvp__pf_note(pf, "; tags: off (a block device has no place for a sidecar)");
        return 0;
    }
    struct kvp__pf_tags *t = calloc(1, sizeof *t);
    size_t pl = strlen(pf->path);
    if (!t || !(t->path = malloc(pl + 6))) {
        free(t);
        return kvp__pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    }
    memcpy(t->path, pf->path, pl);
    memcpy(t->path + pl, ".tags", 6);
    t->fd = -1;
    pthread_mutex_init(&t->hmu, NULL);
    pthread_cond_init(&t->hcv, NULL);
    t->readonly = (pf->flags & KVP_PAGEFILE_READONLY) != 0;
    pf->tags = t;
    int rc = 0, locked = 0;
    if (t->readonly) {
        t->fd = open(t->path, O_RDONLY | O_CLOEXEC);
        if (t->fd < 0 && errno == ENOENT) { /* never creates it: legacy, unverified */
            t->legacy = 1;
            pf->tags_mode = 2;
            return 0;
        }
    } else {
        t->fd = open(t->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)pf->mode);
        *made = t->fd >= 0;
        if (t->fd < 0 && errno == EEXIST)
            t->fd = open(t->path, O_RDWR | O_CLOEXEC);
    }
    if (t->fd < 0) {
        rc = kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, 0,
                          "cannot open the tags sidecar %s: %s (open with tags off to go "
                          "without)",
                          t->path, strerror(errno));
        goto fail;
    }
    /* One opener initializes it; the others read what it wrote. */
    locked = flock(t->fd, t->readonly ? LOCK_SH : LOCK_EX) == 0;
    struct stat ts;
    if (fstat(t->fd, &ts) != 0) {
        rc =
            kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "fstat %s: %s", t->path, strerror(errno));
        goto fail;
    }
    if (!t->readonly && (ts.st_size == 0 || created)) {
        /* New, or left by a page file that is gone (this open created the
         * file): its records would describe other bytes. */
        t->legacy = !created && file_has_data(pf->fd, pf->file_size);
        t->slot_size = pf->bytes_per_page;
        *made = *made || created;
        if ((rc = tags_init(t, pf, t->legacy, err)) != 0)
            goto fail;
        ts.st_size = TAGS_HDR;
    } else if ((rc = tags_read_hdr(t, err)) != 0) {
        goto fail;
    }
    uint64_t nrec = (pf->size + t->slot_size - 1) / t->slot_size;
    uint64_t need = TAGS_HDR + nrec * TAGS_REC;
    if (!t->readonly && (uint64_t)ts.st_size < need) {
        /* Allocated, not sparse: a store into a hole of the mapping would
         * allocate its block in the page fault, under the file system's
         * journal, while the batch waits. */
        int fe = posix_fallocate(t->fd, 0, (off_t)need);
        if (fe != 0 && fe != EOPNOTSUPP && fe != EINVAL) {
            errno = fe;
            rc = kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, (int64_t)need,
                              "cannot extend the tags sidecar %s: %s", t->path, strerror(errno));
            goto fail;
        }
        if (fe != 0 && ftruncate(t->fd, (off_t)need) != 0) {
            rc = kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, (int64_t)need,
                              "cannot extend the tags sidecar %s: %s", t->path, strerror(errno));
            goto fail;
        }
        ts.st_size = (off_t)need;
    }
    if ((uint64_t)ts.st_size < need) /* read-only: the records there are */
        need = (uint64_t)ts.st_size;
    t->nrec = need > TAGS_HDR ? (need - TAGS_HDR) / TAGS_REC : 0;
    t->maplen = (size_t)(TAGS_HDR + t->nrec * TAGS_REC);
    void *m = mmap(NULL, t->maplen, t->readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
                   t->fd, 0);
    if (m == MAP_FAILED) {
        rc = kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "cannot map the tags sidecar %s: %s",
                          t->path, strerror(errno));
        goto fail;
    }
    t->map = m;
    if (locked)
        flock(t->fd, LOCK_UN);
    pf->tags_mode = t->legacy ? 2 : 1;
    return 0;
fail:
    kvp__pf_tags_close(pf, *made);
    *made = 0;
    pf->tags_mode = 0;
    return rc;
}

int kvp__pf_tags_sync(struct kvp_pagefile *pf, struct kvp_error *err)
{
    struct kvp__pf_tags *t = pf->tags;
    if (!t || !t->map || t->readonly)
        return 0;
    if (msync(t->map, t->maplen, MS_SYNC) != 0 || fsync(t->fd) != 0)
        return kvp__pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "syncing the tags sidecar %s: %s",
                            t->path, strerror(errno));
    return 0;
}

/* ---- writes ----------------------------------------------------------- */

/* 1 when op covers one slot from its start (its tag can describe it). */
static int tag_whole(const struct kvp__pf_tags *t, const struct kvp_pagefile_op *op)
{
    return (uint64_t)op->offset % t->slot_size == 0 && op->size <= t->slot_size;
}

static void tag_slots(const struct kvp__pf_tags *t, const struct kvp_pagefile_op *op, uint64_t *s0,
                      uint64_t *s1)
{
    *s0 = (uint64_t)op->offset / t->slot_size;
    *s1 = ((uint64_t)op->offset + op->size - 1) / t->slot_size;
    if (*s1 >= t->nrec)
        *s1 = t->nrec ? t->nrec - 1 : 0;
}

void kvp__pf_tag_piece(const struct kvp__pf_batch *b, size_t i, const void *p, uint64_t start,
                       uint64_t len)
{
    if (!b->tag_want || !b->tag_want[i] || len == 0)
        return;
    uint64_t d = kvp__pf_tag_blocks(p, b->ops[i].size, start, len);
    __atomic_fetch_xor(&b->tag_digest[i], d, __ATOMIC_RELAXED);
    __atomic_fetch_add(&b->tag_bytes[i], len, __ATOMIC_RELAXED);
}

void kvp__pf_tags_begin(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                        int write, uint8_t *want)
{
    struct kvp__pf_tags *t = pf->tags;
    memset(want, 0, n);
    if (!t->map)
        return; /* no sidecar (read-only): nothing to hash */
    for (size_t i = 0; i < n; i++) {
        const struct kvp_pagefile_op *op = &ops[i];
        uint64_t s0 = (uint64_t)op->offset / t->slot_size;
        if (op->size == 0 || s0 >= t->nrec)
            continue;
        if (!write) {
            int damaged;
            struct rec r = rec_load(t, s0, &damaged);
            want[i] = r.state == TAG_TAGGED && tag_whole(t, op) && r.len == op->size;
            continue;
        }
        want[i] = (uint8_t)tag_whole(t, op);
        uint64_t s1;
        tag_slots(t, op, &s0, &s1);
        for (uint64_t s = s0; s <= s1; s++)
            rec_bad(t, s);
    }
}

void kvp__pf_tag_copy(const struct kvp__pf_batch *b, size_t i, void *dst, const void *src,
                      uint64_t len)
{
    if (!b->tag_want || !b->tag_want[i] || len != b->ops[i].size) {
        memcpy(dst, src, (size_t)len);
        return;
    }
    /* Block by block: each block is hashed right after its copy, out of L1
     * and L2, not after the whole page (2 MiB and more) has gone by. */
    uint64_t d = 0;
    for (uint64_t o = 0; o < len; o += KVP__PF_TAG_BLOCK) {
        uint64_t l = len - o < KVP__PF_TAG_BLOCK ? len - o : KVP__PF_TAG_BLOCK;
        memcpy((char *)dst + o, (const char *)src + o, (size_t)l);
        d ^= tag_hash((const char *)dst + o, (size_t)l, tag_seed(len, o / KVP__PF_TAG_BLOCK));
    }
    __atomic_fetch_xor(&b->tag_digest[i], d, __ATOMIC_RELAXED);
    __atomic_fetch_add(&b->tag_bytes[i], len, __ATOMIC_RELAXED);
}

/*
 * kvp__pf_tags_tail: the reads of a batch that completed with nothing else
 * of it in flight (uring, usrbio zero-copy: often all of them at once). A
 * lone thread hashes memory that another core or a device just wrote at
 * ~10 GB/s while the caller waits for nothing else: with TAG_HELP_MIN bytes
 * or more, the handle's helper thread hashes with the caller, TAG_CLAIM
 * bytes at a time. The caller never waits for work the helper did not take
 * (a busy helper: the caller hashes it all), only for the claim the helper
 * is in.
 */
#define TAG_CLAIM ((uint64_t)256 << 10)
#define TAG_HELP_MIN ((uint64_t)1 << 20) /* below: a wakeup costs as much as it saves */

struct tag_job {
    const struct kvp_pagefile_op *ops;
    const size_t *idx;     /* the ops to hash, nidx of them */
    const uint64_t *first; /* claims before idx[k], nidx + 1 of them */
    size_t nidx;
    uint64_t *digests; /* by op index, XORed into (zero first) */
    atomic_size_t next;
    size_t total;
    atomic_int released; /* set by the helper after its last touch of the job */
};

/* Op i of b is a read that completed whole and is not hashed yet. */
static int tag_left(const struct kvp__pf_batch *b, size_t i)
{
    return b->tag_want[i] && b->results[i] == (int64_t)b->ops[i].size && b->ops[i].size &&
           __atomic_load_n(&b->tag_bytes[i], __ATOMIC_RELAXED) == 0;
}

static atomic_uint_fast64_t tag_helped; /* claims the helper hashed, for the tests */

uint64_t kvp__pf_tags_helped(void)
{
    return atomic_load_explicit(&tag_helped, memory_order_relaxed);
}

/* Hashes claim c of j. */
static void tag_claim(struct tag_job *j, size_t c, int helper)
{
    size_t lo = 0, hi = j->nidx;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->first[mid] <= c)
            lo = mid;
        else
            hi = mid;
    }
    const struct kvp_pagefile_op *op = &j->ops[j->idx[lo]];
    uint64_t from = (uint64_t)(c - j->first[lo]) * TAG_CLAIM;
    uint64_t len = op->size - from < TAG_CLAIM ? op->size - from : TAG_CLAIM;
    uint64_t d = kvp__pf_tag_blocks((const char *)op->buf + from, op->size, from, len);
    __atomic_fetch_xor(&j->digests[j->idx[lo]], d, __ATOMIC_RELAXED);
    if (helper)
        atomic_fetch_add_explicit(&tag_helped, 1, memory_order_relaxed);
}

static void tag_job_work(struct tag_job *j, int helper)
{
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->total)
            return;
        tag_claim(j, c, helper);
    }
}

static void *tag_helper_main(void *arg)
{
    struct kvp__pf_tags *t = arg;
    pthread_setname_np(pthread_self(), "kvp-tags"); /* for top and perf */
    pthread_mutex_lock(&t->hmu);
    while (!t->hstop) {
        struct tag_job *j = atomic_exchange(&t->hjob, NULL);
        if (!j) {
            pthread_cond_wait(&t->hcv, &t->hmu);
            continue;
        }
        pthread_mutex_unlock(&t->hmu);
        tag_job_work(j, 1);
        atomic_store_explicit(&j->released, 1, memory_order_release);
        pthread_mutex_lock(&t->hmu);
    }
    pthread_mutex_unlock(&t->hmu);
    return NULL;
}

/* Offers j to t's helper (starting it the first time): 1 when posted
 * (tag_job_join then), 0 when the helper is busy or cannot start. */
static int tag_job_post(struct kvp__pf_tags *t, struct tag_job *j)
{
    if (atomic_load(&t->hstate) == 0) {
        pthread_mutex_lock(&t->hmu);
        if (atomic_load(&t->hstate) == 0) {
            /* A full signal mask: the application's handlers run on its own threads. */
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old);
            int rc = pthread_create(&t->htid, NULL, tag_helper_main, t);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            atomic_store(&t->hstate, rc == 0 ? 1 : -1);
        }
        pthread_mutex_unlock(&t->hmu);
    }
    struct tag_job *none = NULL;
    if (atomic_load(&t->hstate) != 1 || !atomic_compare_exchange_strong(&t->hjob, &none, j))
        return 0;
    pthread_mutex_lock(&t->hmu);
    pthread_cond_signal(&t->hcv);
    pthread_mutex_unlock(&t->hmu);
    return 1;
}

/* After the caller's part of a posted j: takes it back if the helper did
 * not start it, else waits for the helper's last touch. */
static void tag_job_join(struct kvp__pf_tags *t, struct tag_job *j)
{
    struct tag_job *mine = j;
    if (atomic_compare_exchange_strong(&t->hjob, &mine, NULL))
        return; /* not taken: every claim was ours */
    for (unsigned k = 1; !atomic_load_explicit(&j->released, memory_order_acquire); k++) {
        if (k % 256 == 0)
            sched_yield(); /* the helper was put off its core mid-claim */
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

void kvp__pf_tags_tail(struct kvp_pagefile *pf, const struct kvp__pf_batch *b)
{
    struct kvp__pf_tags *t = pf->tags;
    if (!t || !b->tag_want || b->write || kvp__pf_cpus() < 2)
        return;
    uint64_t sum = 0;
    size_t m = 0;
    for (size_t i = 0; i < b->n; i++)
        if (tag_left(b, i)) {
            sum += b->ops[i].size;
            m++;
        }
    if (sum < TAG_HELP_MIN)
        return; /* the front end hashes them */
    size_t small_idx[64];
    uint64_t small_first[65];
    size_t *idx = m <= 64 ? small_idx : malloc(m * sizeof *idx);
    uint64_t *first = m <= 64 ? small_first : malloc((m + 1) * sizeof *first);
    if (idx && first) {
        struct tag_job j = {
            .ops = b->ops, .idx = idx, .first = first, .nidx = m, .digests = b->tag_digest};
        size_t k = 0;
        first[0] = 0;
        for (size_t i = 0; i < b->n; i++)
            if (tag_left(b, i)) {
                idx[k] = i;
                first[k + 1] = first[k] + (b->ops[i].size + TAG_CLAIM - 1) / TAG_CLAIM;
                k++;
            }
        j.total = (size_t)first[m];
        atomic_init(&j.next, 0);
        atomic_init(&j.released, 0);
        int posted = tag_job_post(t, &j);
        tag_job_work(&j, 0);
        if (posted)
            tag_job_join(t, &j);
        for (k = 0; k < m; k++)
            __atomic_store_n(&b->tag_bytes[idx[k]], b->ops[idx[k]].size, __ATOMIC_RELAXED);
    }
    if (idx != small_idx)
        free(idx);
    if (first != small_first)
        free(first);
}

void kvp__pf_tags_fill(const struct kvp_pagefile_op *ops, const struct kvp_pagefile_vop *vops,
                       size_t n, const uint8_t *want, uint64_t *digests, const uint64_t *bytes)
{
    for (size_t i = 0; i < n; i++)
        if (want[i] && (!bytes || bytes[i] != ops[i].size))
            digests[i] = tag_digest(&ops[i], vops ? &vops[i] : NULL);
}

void kvp__pf_tags_wend(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                       const char *const *keys, size_t n, const int64_t *results,
                       const uint8_t *want, const uint64_t *digests)
{
    struct kvp__pf_tags *t = pf->tags;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_pagefile_op *op = &ops[i];
        if (op->size == 0 || (uint64_t)op->offset / t->slot_size >= t->nrec ||
            results[i] != (int64_t)op->size)
            continue; /* failed: BAD stays */
        if (want[i]) {
            rec_store(t, (uint64_t)op->offset / t->slot_size,
                      (struct rec){digests[i], tag_key(keys, i), op->size, TAG_TAGGED});
            continue;
        }
        uint64_t s0, s1;
        tag_slots(t, op, &s0, &s1);
        for (uint64_t s = s0; s <= s1; s++)
            rec_store(t, s, (struct rec){0, 0, 0, TAG_UNTAGGED});
    }
}

/* ---- reads ------------------------------------------------------------ */

/* Why a read was rejected (kvp__pf_tags_rcheck's verdicts). */
static const char *const tag_why[] = {
    [KVP__PF_TAG_DIGEST] = "its bytes differ from what was written there",
    [KVP__PF_TAG_KEY] = "it holds another key's page",
    [KVP__PF_TAG_LEN] = "the read's size differs from the written page's",
    [KVP__PF_TAG_START] = "the read does not start where the page does",
    [KVP__PF_TAG_NOTZERO] = "it was never written through kvpage but is not zeros",
    [KVP__PF_TAG_NOKEY] = "no key was ever written there",
    [KVP__PF_TAG_UNTAGGED] = "it was written without a tag, so it cannot be checked "
                             "against a key",
    [KVP__PF_TAG_BAD] = "its write was interrupted or failed",
    [KVP__PF_TAG_DAMAGED] = "its tag record is damaged",
};

const char *kvp__pf_tag_why(int why)
{
    return why > 0 && (size_t)why < sizeof tag_why / sizeof tag_why[0] ? tag_why[why] : "?";
}

/* The verdict on op's bytes as read (0 = served), for one slot s and the
 * part [a, b) of the op that lies in it. *verified counts what was checked. */
static int tag_check_slot(const struct kvp__pf_tags *t, const struct kvp_pagefile_op *op,
                          const struct kvp_pagefile_vop *vop, uint64_t key, uint64_t s, uint64_t a,
                          uint64_t b, const uint64_t *digest, int *verified)
{
    int damaged;
    struct rec r = rec_load(t, s, &damaged);
    switch (r.state) {
    case TAG_TAGGED:
        if (a != 0 || (uint64_t)op->offset != s * t->slot_size)
            return KVP__PF_TAG_START;
        if (op->size != r.len)
            return KVP__PF_TAG_LEN;
        if (key && r.key != key)
            return KVP__PF_TAG_KEY;
        if ((digest ? *digest : tag_digest(op, vop)) != r.digest)
            return KVP__PF_TAG_DIGEST;
        *verified = 1;
        return 0;
    case TAG_NONE:
        if (t->legacy)
            return 0;
        if (key)
            return KVP__PF_TAG_NOKEY;
        if (!tag_zero(op, vop, a, b))
            return KVP__PF_TAG_NOTZERO;
        *verified = 1;
        return 0;
    case TAG_UNTAGGED:
        return key ? KVP__PF_TAG_UNTAGGED : 0;
    default:
        return damaged ? KVP__PF_TAG_DAMAGED : KVP__PF_TAG_BAD;
    }
}

void kvp__pf_tags_rcheck(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                         const struct kvp_pagefile_vop *vops, const char *const *keys, size_t n,
                         int64_t *results, const uint8_t *want, const uint64_t *digests,
                         struct kvp__pf_reject *rej)
{
    struct kvp__pf_tags *t = pf->tags;
    rej->index = -1;
    uint64_t nv = 0, nu = 0, nr = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_pagefile_op *op = &ops[i];
        if (op->size == 0 || results[i] != (int64_t)op->size)
            continue; /* nothing read, or failed already */
        if (!t->map) {
            nu++;
            continue;
        }
        uint64_t key = tag_key(keys, i);
        uint64_t s0 = (uint64_t)op->offset / t->slot_size;
        uint64_t s1 = ((uint64_t)op->offset + op->size - 1) / t->slot_size;
        int why = 0, verified = 0;
        for (uint64_t s = s0; s <= s1 && !why; s++) {
            uint64_t a = s == s0 ? 0 : s * t->slot_size - (uint64_t)op->offset;
            uint64_t e = (s + 1) * t->slot_size - (uint64_t)op->offset;
            int v = 0;
            why = tag_check_slot(t, op, vops ? &vops[i] : NULL, key, s, a,
                                 e < op->size ? e : op->size, want && want[i] ? &digests[i] : NULL,
                                 &v);
            verified = s == s0 ? v : verified && v;
        }
        if (!why) {
            if (verified)
                nv++;
            else
                nu++;
            continue;
        }
        nr++;
        results[i] = -EBADMSG;
        if (rej->index < 0) {
            rej->index = (int64_t)i;
            rej->slot = s0;
            rej->why = why;
        }
        int expect = 0;
        if (atomic_compare_exchange_strong(&t->noted, &expect, 1)) {
            snprintf(t->note, sizeof t->note,
                     "%s: page %" PRIu64 " (offset %" PRId64 ") rejected: %s; reported as missing",
                     pf->path, s0, op->offset, kvp__pf_tag_why(why));
            atomic_store_explicit(&t->noted, 2, memory_order_release);
        }
    }
    if (nv)
        atomic_fetch_add_explicit(&t->verified, nv, memory_order_relaxed);
    if (nu)
        atomic_fetch_add_explicit(&t->unverified, nu, memory_order_relaxed);
    if (nr)
        atomic_fetch_add_explicit(&t->rejected, nr, memory_order_relaxed);
}

void kvp__pf_tags_info(const struct kvp_pagefile *pf, struct kvp_pagefile_info *info)
{
    const struct kvp__pf_tags *t = pf->tags;
    info->tags = pf->tags_mode;
    info->tags_path = t ? t->path : "";
    info->tags_note = "";
    if (!t)
        return;
    info->tags_verified = atomic_load_explicit(&t->verified, memory_order_relaxed);
    info->tags_rejected = atomic_load_explicit(&t->rejected, memory_order_relaxed);
    info->tags_unverified = atomic_load_explicit(&t->unverified, memory_order_relaxed);
    info->tags_slot_size = t->slot_size;
    if (atomic_load_explicit(&((struct kvp__pf_tags *)t)->noted, memory_order_acquire) == 2)
        info->tags_note = t->note;
}

/* ---- fsck ------------------------------------------------------------- */

#define VERIFY_CHUNK (4u << 20) /* read at once: a multiple of the tag block */

/* The digest of the file's [off, off + len), read through fd, or -errno. */
static int tag_file_digest(int fd, char *buf, int64_t off, uint64_t len, uint64_t *d)
{
    *d = 0;
    for (uint64_t o = 0; o < len; o += VERIFY_CHUNK) {
        uint64_t l = len - o < VERIFY_CHUNK ? len - o : VERIFY_CHUNK;
        int64_t r = kvp__pf_pio(fd, 0, buf, l, off + (int64_t)o);
        if (r < 0)
            return (int)r;
        if ((uint64_t)r < l)
            return -EIO;
        *d ^= kvp__pf_tag_blocks(buf, len, o, l);
    }
    return 0;
}

/* 1 when the file's [off, off + len) is zeros (holes are not read), 0 when
 * not, or -errno. */
static int tag_file_zero(int fd, char *buf, int64_t off, uint64_t len)
{
    int64_t end = off + (int64_t)len;
    while (off < end) {
        off_t d = lseek(fd, off, SEEK_DATA);
        if (d < 0 || d >= end)
            return 1; /* ENXIO: holes to the end */
        off = d;
        uint64_t l = (uint64_t)(end - off) < VERIFY_CHUNK ? (uint64_t)(end - off) : VERIFY_CHUNK;
        int64_t r = kvp__pf_pio(fd, 0, buf, l, off);
        if (r < 0)
            return (int)r;
        if (!zero_mem(buf, (uint64_t)r))
            return 0;
        if ((uint64_t)r < l)
            return 1; /* end of file: reads as zeros */
        off += (int64_t)r;
    }
    return 1;
}

KVP_API int kvp_pagefile_verify(struct kvp_pagefile *pf,
                                void (*cb)(void *arg, uint64_t slot, const char *why), void *arg,
                                struct kvp_pagefile_verify_counts *counts, struct kvp_error *err)
{
    if (!pf)
        return kvp__pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "pagefile handle is NULL");
    if (counts && counts->check_size < sizeof(size_t) + 5 * sizeof(uint64_t))
        return kvp__pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)counts->check_size,
                            "counts->check_size %zu is unknown (set it to sizeof the struct)",
                            counts->check_size);
    struct kvp__pf_tags *t = pf->tags;
    if (!t)
        return kvp__pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0,
                            "%s has integrity tags off on this handle: nothing to verify",
                            pf->path);
    if (!t->map)
        return kvp__pf_fail(err, -ENOENT, KVP_RULE_ARG, -1, 0,
                            "%s has no tags sidecar (%s): its pages carry no tags to verify",
                            pf->path, t->path);
    struct kvp_pagefile_verify_counts c;
    memset(&c, 0, sizeof c);
    int fd = open(pf->path, O_RDONLY | O_CLOEXEC); /* buffered, whatever the handle's mode */
    char *buf = fd >= 0 ? malloc(VERIFY_CHUNK) : NULL;
    if (!buf) {
        int e = fd < 0 ? errno : ENOMEM;
        if (fd >= 0)
            close(fd);
        return kvp__pf_fail(err, -e, KVP_RULE_IO, -1, 0, "cannot read %s: %s", pf->path,
                            strerror(e));
    }
    c.slots = (pf->size + t->slot_size - 1) / t->slot_size;
    int64_t first_bad = -1;
    int rc = 0;
    for (uint64_t s = 0; s < c.slots && rc == 0; s++) {
        int damaged, why = 0;
        struct rec r = rec_load(t, s, &damaged);
        int64_t off = (int64_t)(s * t->slot_size);
        uint64_t room = pf->size - (uint64_t)off;
        uint64_t span = room < t->slot_size ? room : t->slot_size;
        if (r.state == TAG_NONE) {
            int z = t->legacy ? 1 : tag_file_zero(fd, buf, off, span);
            if (z < 0)
                rc = z;
            else if (z)
                c.none++;
            else
                why = KVP__PF_TAG_NOTZERO;
        } else if (r.state == TAG_UNTAGGED) {
            c.untagged++;
        } else if (r.state == TAG_TAGGED && r.len <= span) {
            uint64_t d;
            int e = tag_file_digest(fd, buf, off, r.len, &d);
            if (e < 0 && e != -EIO)
                rc = e;
            else if (e == 0 && d == r.digest)
                c.tagged++;
            else
                why = KVP__PF_TAG_DIGEST;
        } else {
            why = r.state == TAG_BAD && !damaged ? KVP__PF_TAG_BAD : KVP__PF_TAG_DAMAGED;
        }
        if (!why)
            continue;
        c.bad++;
        if (first_bad < 0)
            first_bad = (int64_t)s;
        if (cb)
            cb(arg, s, kvp__pf_tag_why(why));
    }
    free(buf);
    close(fd);
    if (counts) {
        size_t sz = counts->check_size < sizeof c ? counts->check_size : sizeof c;
        c.check_size = sz;
        memcpy(counts, &c, sz);
    }
    if (rc < 0)
        return kvp__pf_fail(err, rc, KVP_RULE_IO, -1, 0, "reading %s: %s", pf->path, strerror(-rc));
    if (c.bad)
        return kvp__pf_fail(err, -EBADMSG, KVP_RULE_INTEGRITY, -1, first_bad,
                            "%s: %" PRIu64 " of %" PRIu64
                            " pages fail their integrity tag (the first: page %" PRId64 ")",
                            pf->path, c.bad, c.slots, first_bad);
    return 0;
}
