/*
 * kvpage bench store: put and get through the store against kvp_pagefile
 * alone, on the same file in the same run.
 *
 * Each round moves one batch four ways: the page file alone writes it (and,
 * when the store is durable, flushes it: the store does that before it
 * confirms) and reads it back; the store puts it under new keys and gets
 * them back. Then the metadata alone makes the store's calls for the same
 * keys (allocate + confirm, lookup) in a pool of its own, to show what holds
 * the keys/s. The file is written once before timing; by default it holds
 * every round's pages (no eviction).
 *
 * The store reads through the page file, so it cannot be faster than the
 * page file alone by more than the noise. An earlier version timed the
 * first round of each side as the others and summed the rounds: the page
 * file alone went first in it, its reads ran at 0.2-1.2 GB/s (4-18 in the
 * rounds after), and the summary said the store was faster by 60-90%. Now
 * both sides first run one warm-up round, the same as the others but not
 * counted; then the sides take turns at going first (A B, B A, A B, ...:
 * the page cache's dirty pages grow through a round, and whoever writes
 * later would be throttled more); and every figure is the median of the
 * rounds' figures. Each ratio (store / page file) is the median over the
 * pairs of consecutive rounds (one with each side first; the sides' times
 * in the two added up): the side going second can pay for the first (a
 * remote server's log write after the store's puts), and the median of
 * single rounds' ratios then fell between the two orders' (1.39 store
 * first, 1.01 page file first: 1.17).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

struct bench_opts {
    uint32_t batch, rounds, entries;
};

static int bench_flag(const char *name, const char *value, void *arg)
{
    struct bench_opts *b = arg;
    uint32_t *dst = !strcmp(name, "--batch")     ? &b->batch
                    : !strcmp(name, "--rounds")  ? &b->rounds
                    : !strcmp(name, "--entries") ? &b->entries
                                                 : NULL;
    if (!dst)
        return 0;
    char *end;
    errno = 0;
    unsigned long v = value ? strtoul(value, &end, 10) : 0;
    if (!value || errno || *end || v == 0 || v > 1000000 || *value < '0' || *value > '9') {
        fprintf(stderr, "kvpage bench store: %s '%s' is not a count (1 .. 1000000)\n", name,
                value ? value : "");
        return -1;
    }
    *dst = (uint32_t)v;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "costs 8.0%" when the store's median ratio is below 1, "is faster by
 * 8.0%" above (measurement noise: the rounds' spread is printed beside). */
static void cost_words(char *buf, size_t len, double ratio)
{
    double pct = (1 / ratio - 1) * 100;
    if (pct < -0.05)
        snprintf(buf, len, "is faster by %.1f%%", -pct);
    else
        snprintf(buf, len, "costs %.1f%%", pct < 0 ? 0.0 : pct);
}

/* What this run creates, and removes at its end or at a Ctrl-C: the file,
 * the data directory PATH.meta (embedded metadata), the owner record
 * PATH.owner and the integrity tags' sidecar PATH.tags, each only when it
 * did not exist before. */
#define MADE_N 4
struct made {
    char *
        path[MADE_N]; /* the file, PATH.owner, PATH.meta (a directory), PATH.tags; NULL: not made */
};

static char *missing(const char *path, const char *suffix)
{
    size_t n = strlen(path) + strlen(suffix) + 1;
    char *p = malloc(n);
    struct stat st;
    if (p)
        snprintf(p, n, "%s%s", path, suffix);
    if (p && stat(p, &st) == 0) {
        free(p);
        return NULL;
    }
    return p;
}

static void made_init(struct made *m, const struct kvp__store_flags *f)
{
    m->path[0] = missing(f->file, "");
    m->path[1] = missing(f->file, ".owner");
    m->path[2] = f->meta ? NULL : missing(f->file, ".meta");
    m->path[3] = missing(f->file, ".tags");
    for (int i = 0; i < MADE_N; i++)
        if (m->path[i])
            i == 2 ? kvp__cleanup_dir(m->path[i]) : kvp__cleanup_file(m->path[i]);
}

static void made_remove(struct made *m)
{
    for (int i = 0; i < MADE_N; i++)
        if (m->path[i])
            i == 2 ? kvp__remove_flat_dir(m->path[i]) : (void)unlink(m->path[i]);
    kvp__cleanup_done();
    for (int i = 0; i < MADE_N; i++)
        free(m->path[i]);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvpage bench store [flags]\n"
            "Puts and gets batches through the store and through the page file alone, on "
            "the\nsame file in the same run, and prints GB/s, keys/s and their ratios.\n"
            "Both sides first run one warm-up round (not counted), then take turns at going\n"
            "first; each figure is the median of the rounds' figures, and each ratio (store /\n"
            "page file) the median over the pairs of consecutive rounds (one with each side\n"
            "first). --json adds every round's figures (per_round, and warmup).\n"
            "flags (the store's, with these defaults):\n"
            "  --file PATH        default: ./kvpage-bench.pages; what the run creates (the\n"
            "                     file, PATH.meta, PATH.owner) is removed afterwards, and\n"
            "                     at Ctrl-C; a file that has an owner (a store's) is refused\n"
            "  --page-size SIZE   default 2M\n"
            "  --file-size SIZE   default: --rounds + 1 batches of pages (no eviction)\n"
            "  --pool NAME        default kvpage-bench, emptied before and after the run\n"
            "                     (a pool given is used as it is, never emptied)\n"
            "  --rank, --meta, --deployment, --timeout as for kvpage put\n"
            "  --batch N          keys per call (default 128)\n"
            "  --rounds N         counted rounds, after the warm-up (default 16)\n"
            "  --entries N        operations per page-file batch (default: --batch, so that\n"
            "                     both sides make one page-file call per batch)\n"
            "  --no-durable       puts do not fdatasync before confirming (and the page\n"
            "                     file alone does not flush)\n"
            "  --no-tags          no integrity tags on either side (what they cost: the\n"
            "                     same run with and without)\n"
            "  --json             one JSON object on standard output\n"
            "examples:\n"
            "  kvpage bench store --file /mnt/3fs/bench.pages --page-size 2M\n"
            "  kvpage bench store --meta http://10.0.0.5:18000 --page-size 64K --no-durable "
            "--json\n");
}

/* A round's times in seconds, one per kind: the page file alone's write
 * (and flush) and read, the store's put and get, the metadata alone's
 * allocate + confirm and lookup. */
enum { T_PF_W, T_PF_R, T_PUT, T_GET, T_MPUT, T_MGET, NT };

/* One run: the store, its page file, the batch's buffers and names, the
 * metadata-alone pool, and the times of every counted round. */
struct bench {
    struct bench_opts b;
    struct kvp__store_flags f;
    struct kvp_store *s;
    struct kvp_pagefile *pf;
    uint64_t np, bytes, run;
    uint32_t n, entries;
    uint8_t *buf, *rbuf;
    struct kvp_pagefile_op *ops;
    int64_t *res, *mpages;
    struct kvp_str *keys;
    struct kvp_store_buf *wb, *rb;
    char (*names)[48];
    struct kvp_ns *mns;
    double warm[NT], *t; /* the warm-up round's; rounds x NT, counted rounds */
};

/* Parses the flags into B's options and store flags, with their defaults. */
static int bench_parse(struct bench *B, int argc, char **argv)
{
    B->b = (struct bench_opts){128, 16, 0};
    char **pos = calloc((size_t)argc, sizeof *pos);
    int npos;
    if (!pos)
        return KVP_EXIT_FAILED;
    int rc =
        kvp__store_flags_parse("bench store", argc, argv, &B->f, pos, &npos, bench_flag, &B->b);
    if (!rc && npos) {
        fprintf(stderr, "kvpage bench store: unexpected argument '%s'\n", pos[0]);
        rc = KVP_EXIT_USAGE;
    }
    free(pos);
    if (rc)
        return rc;
    if (!B->f.page_size)
        B->f.page_size = 2u << 20;
    if (!B->f.file_size) /* every round's keys fit, the warm-up's too: no eviction */
        B->f.file_size = (uint64_t)B->b.batch * B->f.page_size * (B->b.rounds + 1ull);
    if (!B->f.file)
        B->f.file = "kvpage-bench.pages";
    return 0;
}

/* The batch's buffers (the bytes put, the bytes read) and its per-key
 * arrays, and the rounds' times. */
static int bench_alloc(struct bench *B)
{
    B->n = B->b.batch;
    B->bytes = (uint64_t)B->n * B->f.page_size;
    if (posix_memalign((void **)&B->buf, 4096, B->bytes) ||
        posix_memalign((void **)&B->rbuf, 4096, B->bytes)) {
        fprintf(stderr, "kvpage bench store: cannot allocate 2 x %" PRIu64 " bytes\n", B->bytes);
        return KVP_EXIT_FAILED;
    }
    for (uint64_t i = 0; i < B->bytes; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        memcpy(B->buf + i, &v, 8);
    }
    memset(B->rbuf, 0, B->bytes);
    uint32_t n = B->n;
    B->ops = calloc(n, sizeof *B->ops);
    B->res = calloc(n, sizeof *B->res);
    B->mpages = calloc(n, sizeof *B->mpages);
    B->keys = calloc(n, sizeof *B->keys);
    B->wb = calloc(n, sizeof *B->wb);
    B->rb = calloc(n, sizeof *B->rb);
    B->names = calloc(n, 48);
    B->t = calloc((size_t)B->b.rounds * NT, sizeof *B->t);
    if (!B->ops || !B->res || !B->mpages || !B->keys || !B->wb || !B->rb || !B->names || !B->t) {
        fprintf(stderr, "kvpage bench store: out of memory\n");
        return KVP_EXIT_FAILED;
    }
    return 0;
}

static void bench_free(struct bench *B)
{
    free(B->ops), free(B->res), free(B->mpages), free(B->keys), free(B->wb), free(B->rb);
    free(B->names), free(B->t), free(B->buf), free(B->rbuf);
}

/* Points the page-file ops at pages [first, first + n) and at buffer b. */
static void ops_at(struct bench *B, uint64_t first, uint8_t *b)
{
    for (uint32_t i = 0; i < B->n; i++)
        B->ops[i] = (struct kvp_pagefile_op){(int64_t)((first + i) * B->f.page_size),
                                             b + (uint64_t)i * B->f.page_size, B->f.page_size};
}

/* The batch through the page file alone, in calls of entries ops as the
 * store cuts them; write (0) or read (1). Returns the number of failures. */
static int pf_batch(struct bench *B, int read)
{
    int errors = 0;
    for (uint32_t i = 0; i < B->n && !errors; i += B->entries) {
        uint32_t k = B->n - i < B->entries ? B->n - i : B->entries;
        errors += (read ? kvp_pagefile_read : kvp_pagefile_write)(B->pf, B->ops + i, k, B->res + i,
                                                                  NULL) != 0;
    }
    return errors;
}

/* Every page once, untimed: neither side pays for the file system's block
 * allocation of a sparse file, which the side that came first would. */
static int write_once(struct bench *B)
{
    int rc = 0;
    for (uint64_t p = 0; p + B->n <= B->np && !rc; p += B->n) {
        ops_at(B, p, B->buf);
        rc = pf_batch(B, 0) ? -EIO : 0;
    }
    if (!rc)
        rc = kvp_pagefile_flush(B->pf, NULL);
    if (rc) {
        fprintf(stderr, "kvpage bench store: writing the file once first failed: %s\n",
                kvp_strerror(rc));
        return KVP_EXIT_FAILED;
    }
    return 0;
}

/* The metadata alone, for what holds the keys/s: the same calls the store
 * makes, in a pool of its own beside the store's. */
static int meta_alone_open(struct bench *B)
{
    const char *pool = B->f.pool ? B->f.pool : "kv", *dep = B->f.deployment;
    char mpool[160];
    snprintf(mpool, sizeof mpool, "%.100s.bench-meta", pool);
    struct kvp_error merr = {0};
    if (kvp_meta_ns(kvp_store_meta(B->s), dep ? dep : "default", dep ? strlen(dep) : 7, mpool,
                    strlen(mpool), 1, &B->mns, &merr) ||
        kvp_meta_init_rank(B->mns, B->f.rank, B->np, &merr)) {
        fprintf(stderr, "kvpage bench store: the metadata-alone pool %s: %s\n", mpool, merr.msg);
        return KVP_EXIT_FAILED;
    }
    return 0;
}

/* The page file alone: writes the batch (and flushes it, as a durable put
 * does) and reads it back. */
static int side_pagefile(struct bench *B, uint64_t first, double *t)
{
    ops_at(B, first, B->buf);
    double t0 = now_s();
    int errors = pf_batch(B, 0);
    if (!B->f.no_durable && !errors)
        errors += kvp_pagefile_flush(B->pf, NULL) != 0;
    double t1 = now_s();
    ops_at(B, first, B->rbuf);
    if (!errors)
        errors += pf_batch(B, 1);
    t[T_PF_W] = t1 - t0, t[T_PF_R] = now_s() - t1;
    return errors;
}

/* The store: puts the batch under the round's keys and gets it back,
 * checking that the bytes read are those put. */
static int side_store(struct bench *B, const char *round, double *t)
{
    struct kvp_error err = {0};
    double t0 = now_s();
    int prc = kvp_store_put(B->s, B->keys, B->wb, B->n, B->res, &err);
    double t1 = now_s();
    int64_t got = prc ? 0 : kvp_store_get(B->s, B->keys, B->rb, B->n, B->res, &err);
    t[T_PUT] = t1 - t0, t[T_GET] = now_s() - t1;
    if (prc || got != B->n) {
        fprintf(stderr, "kvpage bench store: %s: %s\n", round,
                err.msg[0] ? err.msg : "not every key was stored and read");
        return 1;
    }
    if (memcmp(B->buf, B->rbuf, B->bytes)) {
        fprintf(stderr, "kvpage bench store: %s: the pages read differ from those put\n", round);
        return 1;
    }
    return 0;
}

/* The metadata alone: the store's calls for the round's keys, then deletes
 * them (its pool stays as empty as it started). */
static int side_meta(struct bench *B, const char *round, double *t)
{
    struct kvp_error merr = {0};
    double t0 = now_s();
    int mrc = kvp_meta_allocate(B->mns, B->f.rank, B->keys, B->n, B->mpages, NULL, &merr);
    if (!mrc)
        mrc = kvp_meta_confirm(B->mns, B->f.rank, B->keys, B->mpages, B->n, NULL, 0, &merr);
    double t1 = now_s();
    if (!mrc)
        mrc = kvp_meta_lookup(B->mns, B->f.rank, 1, B->keys, B->n, B->mpages, &merr);
    t[T_MPUT] = t1 - t0, t[T_MGET] = now_s() - t1;
    if (!mrc)
        mrc = kvp_meta_delete(B->mns, B->f.rank, B->keys, B->n, &merr);
    if (mrc)
        fprintf(stderr, "kvpage bench store: %s: the metadata alone: %s\n", round, merr.msg);
    return mrc != 0;
}

/* Round seq of the run (0: the warm-up, r + 1: counted round r): new keys,
 * the next pages for the page file alone, the page file alone first in
 * even ones and the store first in odd ones (A B, B A, ...). Fills t. */
static int one_round(struct bench *B, uint32_t seq, double *t)
{
    char round[32];
    seq ? snprintf(round, sizeof round, "round %u", seq - 1)
        : snprintf(round, sizeof round, "the warm-up round");
    uint64_t first = ((uint64_t)seq * B->n) % (B->np - B->n + 1);
    for (uint32_t i = 0; i < B->n; i++) {
        snprintf(B->names[i], 48, "bench-%016" PRIx64 "-%u-%u", B->run, seq, i);
        B->keys[i] = (struct kvp_str){B->names[i], strlen(B->names[i])};
        B->wb[i] = (struct kvp_store_buf){B->buf + (uint64_t)i * B->f.page_size, B->f.page_size};
        B->rb[i] = (struct kvp_store_buf){B->rbuf + (uint64_t)i * B->f.page_size, B->f.page_size};
    }
    int errors = 0;
    for (int side = 0; side < 2 && !errors; side++) {
        errors += side == (int)(seq & 1) ? side_pagefile(B, first, t) : side_store(B, round, t);
        memset(B->rbuf, 0, B->bytes);
    }
    if (!errors)
        errors += side_meta(B, round, t);
    return errors;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of a figure, time num / time den (num < 0: the batch's GB over
 * time den), over the first n counted rounds (w = 1) or over their pairs of
 * consecutive rounds (w = 2: one with each side first, so that what the
 * side going first or second pays weighs on both alike; the times of the
 * two added up; a single round when n is 1). Sorted into tmp; lohi[0..1]
 * (when not NULL) the quartiles, the middle half's bounds. */
static double median_of(const struct bench *B, uint32_t n, uint32_t w, int num, int den,
                        double *tmp, double *lohi)
{
    if (w > n)
        w = n;
    n -= w - 1;
    for (uint32_t i = 0; i < n; i++) {
        double a = 0, b = 0;
        for (uint32_t j = i; j < i + w; j++) {
            const double *t = B->t + (size_t)j * NT;
            a += num < 0 ? (double)B->bytes / 1e9 : t[num], b += t[den];
        }
        tmp[i] = a / b;
    }
    qsort(tmp, n, sizeof *tmp, cmp_double);
    if (lohi)
        lohi[0] = tmp[(n - 1) / 4], lohi[1] = tmp[n - 1 - (n - 1) / 4];
    return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

/* Figures: GB/s and keys/s per kind, the store's ratios (its GB/s over
 * the page file's: the page file's time over its own). */
struct figures {
    double gbs[NT], keys_s[NT], put_ratio, get_ratio;
};

/* One round's figures (its times t). */
static struct figures round_figures(const struct bench *B, const double *t)
{
    struct figures g;
    for (int k = 0; k < NT; k++)
        g.gbs[k] = (double)B->bytes / 1e9 / t[k], g.keys_s[k] = B->n / t[k];
    g.put_ratio = t[T_PF_W] / t[T_PUT], g.get_ratio = t[T_PF_R] / t[T_GET];
    return g;
}

/* The medians of the counted rounds' figures (keys/s is GB/s scaled, so its
 * median is the GB/s's scaled), and of the pairs of rounds' ratios;
 * spread[0..3]: the quartiles of the pairs' put ratios, then get ratios. */
static struct figures median_figures(const struct bench *B, double *tmp, double *spread)
{
    struct figures m;
    uint32_t r = B->b.rounds;
    for (int k = 0; k < NT; k++) {
        m.gbs[k] = median_of(B, r, 1, -1, k, tmp, NULL);
        m.keys_s[k] = m.gbs[k] * 1e9 / (double)B->f.page_size;
    }
    m.put_ratio = median_of(B, r, 2, T_PF_W, T_PUT, tmp, spread);
    m.get_ratio = median_of(B, r, 2, T_PF_R, T_GET, tmp, spread + 2);
    return m;
}

static void progress(uint32_t done, uint32_t total, double put_gbs, double get_gbs)
{
    int width = 30, fill = (int)((uint64_t)done * (uint64_t)width / total);
    fprintf(stderr, "\r[%.*s%*s] %3u%%  store put %.2f GB/s  get %.2f GB/s (medians) ", fill,
            "##############################", width - fill, "", done * 100 / total, put_gbs,
            get_gbs);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* One round's figures as a JSON object. */
static void json_round(const struct bench *B, const double *t, uint32_t seq)
{
    struct figures g = round_figures(B, t);
    printf("{\"first\": \"%s\", \"pagefile_write_gbs\": %.4f, \"pagefile_read_gbs\": %.4f, "
           "\"store_put_gbs\": %.4f, \"store_get_gbs\": %.4f, \"meta_put_keys_s\": %.1f, "
           "\"meta_get_keys_s\": %.1f, \"put_ratio\": %.4f, \"get_ratio\": %.4f}",
           seq & 1 ? "store" : "pagefile", g.gbs[T_PF_W], g.gbs[T_PF_R], g.gbs[T_PUT], g.gbs[T_GET],
           g.keys_s[T_MPUT], g.keys_s[T_MGET], g.put_ratio, g.get_ratio);
}

static void print_json(const struct bench *B, const struct figures *m)
{
    const char *loc = kvp_store_location(B->s);
    printf("{\"page_size\": %" PRIu64 ", \"batch\": %u, \"rounds\": %u, \"warmup_rounds\": 1, "
           "\"entries\": %u, \"durable\": %s, \"meta\": \"%s\", \"backend_write\": \"%s\", "
           "\"backend_read\": \"%s\",\n"
           " \"pagefile_write_gbs\": %.4f, \"pagefile_read_gbs\": %.4f, "
           "\"store_put_gbs\": %.4f, \"store_get_gbs\": %.4f,\n"
           " \"store_put_keys_s\": %.1f, \"store_get_keys_s\": %.1f, "
           "\"pagefile_write_keys_s\": %.1f, \"pagefile_read_keys_s\": %.1f,\n"
           " \"meta_put_keys_s\": %.1f, \"meta_get_keys_s\": %.1f,\n"
           " \"put_ratio\": %.4f, \"get_ratio\": %.4f,\n \"warmup\": ",
           B->f.page_size, B->n, B->b.rounds, B->entries, !B->f.no_durable ? "true" : "false",
           strstr(loc, "://") ? "remote" : "embedded",
           kvp_pagefile_backend_name(kvp_pagefile_backend(B->pf, 1)),
           kvp_pagefile_backend_name(kvp_pagefile_backend(B->pf, 0)), m->gbs[T_PF_W],
           m->gbs[T_PF_R], m->gbs[T_PUT], m->gbs[T_GET], m->keys_s[T_PUT], m->keys_s[T_GET],
           m->keys_s[T_PF_W], m->keys_s[T_PF_R], m->keys_s[T_MPUT], m->keys_s[T_MGET], m->put_ratio,
           m->get_ratio);
    json_round(B, B->warm, 0);
    printf(",\n \"per_round\": [");
    for (uint32_t r = 0; r < B->b.rounds; r++) {
        printf(r ? ",\n  " : "\n  ");
        json_round(B, B->t + (size_t)r * NT, r + 1);
    }
    printf("]}\n");
}

static void print_text(const struct bench *B, const struct figures *m, const double *spread)
{
    const double *g = m->gbs, *k = m->keys_s;
    printf("%u rounds (after one warm-up round, not counted) of %u pages of %" PRIu64
           " bytes, metadata %s%s; medians of the rounds:\n",
           B->b.rounds, B->n, B->f.page_size, kvp_store_location(B->s),
           !B->f.no_durable ? ", durable puts" : "");
    printf("  page file alone  write %8.2f GB/s %10.0f pages/s   read %8.2f GB/s %10.0f "
           "pages/s\n",
           g[T_PF_W], k[T_PF_W], g[T_PF_R], k[T_PF_R]);
    printf("  store            put   %8.2f GB/s %10.0f keys/s    get  %8.2f GB/s %10.0f "
           "keys/s\n",
           g[T_PUT], k[T_PUT], g[T_GET], k[T_GET]);
    printf("  metadata alone   allocate+confirm %10.0f keys/s   lookup %10.0f keys/s\n", k[T_MPUT],
           k[T_MGET]);
    char cp[48], cg[48];
    cost_words(cp, sizeof cp, m->put_ratio);
    cost_words(cg, sizeof cg, m->get_ratio);
    printf("  store / page file: put %.3f, get %.3f (the store %s on put, %s on get); "
           "the middle half of the pairs of rounds' ratios: put %.3f .. %.3f, get %.3f .. "
           "%.3f\n",
           m->put_ratio, m->get_ratio, cp, cg, spread[0], spread[1], spread[2], spread[3]);
}

/* The warm-up round, then the counted ones; prints a line per round (not
 * on a terminal, nor with --json) or the progress bar (its medians so far,
 * at most 10 times a second: they sort every round so far). */
static int run_rounds(struct bench *B, double *tmp)
{
    if (one_round(B, 0, B->warm))
        return KVP_EXIT_FAILED;
    int tty = isatty(2) && !B->f.json;
    double drawn = 0;
    for (uint32_t r = 0; r < B->b.rounds; r++) {
        double *t = B->t + (size_t)r * NT;
        if (one_round(B, r + 1, t))
            return KVP_EXIT_FAILED;
        if (tty && (r + 1 == B->b.rounds || now_s() - drawn >= 0.1)) {
            progress(r + 1, B->b.rounds, median_of(B, r + 1, 1, -1, T_PUT, tmp, NULL),
                     median_of(B, r + 1, 1, -1, T_GET, tmp, NULL));
            drawn = now_s();
        } else if (!tty && !B->f.json) {
            struct figures g = round_figures(B, t);
            printf("round %u: page file write %.2f read %.2f, store put %.2f get %.2f GB/s\n", r,
                   g.gbs[T_PF_W], g.gbs[T_PF_R], g.gbs[T_PUT], g.gbs[T_GET]);
        }
    }
    return 0;
}

/* With the store open: checks the file's size, writes it once, opens the
 * metadata-alone pool, runs the rounds and prints the figures. */
static int bench_run(struct bench *B)
{
    B->pf = kvp_store_pagefile(B->s);
    B->np = kvp_store_num_pages(B->s);
    if (B->np < B->n) {
        fprintf(stderr,
                "kvpage bench store: the file holds %" PRIu64 " pages, fewer than a batch of %u "
                "(raise --file-size)\n",
                B->np, B->n);
        return KVP_EXIT_USAGE;
    }
    B->entries = kvp_pagefile_entries(B->pf);
    B->run = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int rc = write_once(B);
    if (!rc)
        rc = meta_alone_open(B);
    if (rc)
        return rc;
    double *tmp = malloc(B->b.rounds * sizeof *tmp);
    rc = tmp ? run_rounds(B, tmp) : KVP_EXIT_FAILED;
    kvp_meta_clear(B->mns, B->f.rank, NULL);
    if (!rc) {
        double spread[4];
        struct figures m = median_figures(B, tmp, spread);
        B->f.json ? print_json(B, &m) : print_text(B, &m, spread);
    }
    free(tmp);
    return rc;
}

int kvp__cli_bench_store(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    struct bench B = {0};
    int rc = bench_parse(&B, argc, argv);
    if (rc)
        return rc;
    /* A store's page file is not a benchmark's: the page file alone writes
     * every page of it, and its keys would read those bytes. */
    struct kvp_error oe = {0};
    if ((rc = kvp_store_check_unowned(B.f.file, "kvpage bench store", &oe)) != 0) {
        fprintf(stderr, "kvpage bench store: %s: %s\n", B.f.file, oe.msg);
        return rc == -EEXIST ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    if ((rc = bench_alloc(&B)) != 0) {
        bench_free(&B);
        return rc;
    }
    struct made made;
    made_init(&made, &B.f);
    /* Its own pool, emptied before and after, unless --pool names one (which
     * is then used as it is: a benchmark never clears a pool it was given). */
    int own_pool = !B.f.pool;
    if (own_pool)
        B.f.pool = "kvpage-bench";
    rc = kvp__store_flags_open("bench store", &B.f, B.b.entries ? B.b.entries : B.b.batch, 1, &B.s);
    if (!rc) {
        if (own_pool)
            kvp_meta_clear(kvp_store_ns(B.s), B.f.rank, NULL);
        rc = bench_run(&B);
        if (own_pool)
            kvp_meta_clear(kvp_store_ns(B.s), B.f.rank, NULL);
        kvp_store_close(B.s);
    } /* else the store undid its own; nothing else was made */
    bench_free(&B);
    made_remove(&made);
    return rc;
}
