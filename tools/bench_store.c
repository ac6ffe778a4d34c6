/*
 * kvpage bench store: put and get through the store against kvp_pagefile
 * alone, on the same file in the same run.
 *
 * Each round moves one batch four ways: the page file alone writes it (and,
 * when the store is durable, flushes it: the store does that before it
 * confirms) and reads it back; the store puts it under new keys and gets
 * them back; the two sides take turns at going first. Then the metadata
 * alone makes the store's calls for the same keys (allocate + confirm,
 * lookup) in a pool of its own, to show what holds the keys/s. The file is
 * written once before timing; by default it holds every round's pages (no
 * eviction). The figures are bytes (and keys) over the time of each kind
 * summed over the rounds, and the store's over the page file's.
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
    uint32_t *dst = !strcmp(name, "--batch")    ? &b->batch
                    : !strcmp(name, "--rounds") ? &b->rounds
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

static void progress(int tty, uint32_t done, uint32_t total, double put_gbs, double get_gbs)
{
    if (!tty)
        return;
    int width = 30, fill = (int)((uint64_t)done * (uint64_t)width / total);
    fprintf(stderr, "\r[%.*s%*s] %3u%%  store put %.2f GB/s  get %.2f GB/s ", fill,
            "##############################", width - fill, "", done * 100 / total, put_gbs,
            get_gbs);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* "costs 8.0%" when the store took longer than the page file alone, "is
 * faster by 8.0%" when it took less (measurement noise, or the cache). */
static void cost_words(char *buf, size_t len, double t_store, double t_alone)
{
    double pct = (t_store / t_alone - 1) * 100;
    if (pct < -0.05)
        snprintf(buf, len, "is faster by %.1f%%", -pct);
    else
        snprintf(buf, len, "costs %.1f%%", pct < 0 ? 0.0 : pct);
}

/* What this run creates, and removes at its end or at a Ctrl-C: the file,
 * the data directory PATH.meta (embedded metadata) and the owner record
 * PATH.owner, each only when it did not exist before. */
struct made {
    char *path[3]; /* the file, PATH.owner, PATH.meta (a directory); NULL: not made */
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
    for (int i = 0; i < 3; i++)
        if (m->path[i])
            i == 2 ? kvp__cleanup_dir(m->path[i]) : kvp__cleanup_file(m->path[i]);
}

static void made_remove(struct made *m)
{
    for (int i = 0; i < 3; i++)
        if (m->path[i])
            i == 2 ? kvp__remove_flat_dir(m->path[i]) : (void)unlink(m->path[i]);
    kvp__cleanup_done();
    for (int i = 0; i < 3; i++)
        free(m->path[i]);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: kvpage bench store [flags]\n"
                 "Puts and gets batches through the store and through the page file alone, on "
                 "the\nsame file in the same run, and prints GB/s, keys/s and their ratios.\n"
                 "flags (the store's, with these defaults):\n"
                 "  --file PATH        default: ./kvpage-bench.pages; what the run creates (the\n"
                 "                     file, PATH.meta, PATH.owner) is removed afterwards, and\n"
                 "                     at Ctrl-C; a file that has an owner (a store's) is refused\n"
                 "  --page-size SIZE   default 2M\n"
                 "  --file-size SIZE   default: --rounds batches of pages (no eviction)\n"
                 "  --pool NAME        default kvpage-bench, emptied before and after the run\n"
                 "                     (a pool given is used as it is, never emptied)\n"
                 "  --rank, --meta, --deployment, --timeout as for kvpage put\n"
                 "  --batch N          keys per call (default 128)\n"
                 "  --rounds N         batches of each kind (default 16)\n"
                 "  --entries N        operations per page-file batch (default: --batch, so that\n"
                 "                     both sides make one page-file call per batch)\n"
                 "  --no-durable       puts do not fdatasync before confirming (and the page\n"
                 "                     file alone does not flush)\n"
                 "  --json             one JSON object on standard output\n"
                 "examples:\n"
                 "  kvpage bench store --file /mnt/3fs/bench.pages --page-size 2M\n"
                 "  kvpage bench store --meta http://10.0.0.5:18000 --page-size 64K --no-durable "
                 "--json\n");
}

int kvp__cli_bench_store(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    struct bench_opts b = {128, 16, 0};
    struct kvp__store_flags f;
    char **pos = calloc((size_t)argc, sizeof *pos);
    int npos;
    if (!pos)
        return KVP_EXIT_FAILED;
    int rc = kvp__store_flags_parse("bench store", argc, argv, &f, pos, &npos, bench_flag, &b);
    if (!rc && npos) {
        fprintf(stderr, "kvpage bench store: unexpected argument '%s'\n", pos[0]);
        rc = KVP_EXIT_USAGE;
    }
    free(pos);
    if (rc)
        return rc;
    if (!f.page_size)
        f.page_size = 2u << 20;
    if (!f.file_size) /* every round's keys fit: no eviction (see bench/store/README.md) */
        f.file_size = (uint64_t)b.batch * f.page_size * b.rounds;
    char default_file[] = "kvpage-bench.pages";
    if (!f.file)
        f.file = default_file;
    /* A store's page file is not a benchmark's: the page file alone writes
     * every page of it, and its keys would read those bytes. */
    struct kvp_error oe = {0};
    if ((rc = kvp_store_check_unowned(f.file, "kvpage bench store", &oe)) != 0) {
        fprintf(stderr, "kvpage bench store: %s: %s\n", f.file, oe.msg);
        return rc == -EEXIST ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    struct made made;
    made_init(&made, &f);
    uint64_t bytes = (uint64_t)b.batch * f.page_size;
    uint8_t *buf = NULL, *rbuf = NULL;
    if (posix_memalign((void **)&buf, 4096, bytes) || posix_memalign((void **)&rbuf, 4096, bytes)) {
        fprintf(stderr, "kvpage bench store: cannot allocate 2 x %" PRIu64 " bytes\n", bytes);
        free(buf);
        return KVP_EXIT_FAILED;
    }
    for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        memcpy(buf + i, &v, 8);
    }
    memset(rbuf, 0, bytes);

    /* Its own pool, emptied before and after, unless --pool names one (which
     * is then used as it is: a benchmark never clears a pool it was given). */
    int own_pool = !f.pool;
    if (own_pool)
        f.pool = "kvpage-bench";
    struct kvp_store *s;
    rc = kvp__store_flags_open("bench store", &f, b.entries ? b.entries : b.batch, 1, &s);
    if (rc) {
        free(buf), free(rbuf);
        made_remove(&made); /* the store undid its own; nothing else was made */
        return rc;
    }
    if (own_pool)
        kvp_meta_clear(kvp_store_ns(s), f.rank, NULL);
    struct kvp_pagefile *pf = kvp_store_pagefile(s);
    uint64_t np = kvp_store_num_pages(s);
    if (np < b.batch) {
        fprintf(stderr,
                "kvpage bench store: the file holds %" PRIu64 " pages, fewer than a batch of %u "
                "(raise --file-size)\n",
                np, b.batch);
        kvp_store_close(s);
        free(buf), free(rbuf);
        made_remove(&made);
        return KVP_EXIT_USAGE;
    }
    uint32_t n = b.batch, entries = kvp_pagefile_entries(pf);
    struct kvp_pagefile_op *ops = calloc(n, sizeof *ops);
    int64_t *res = calloc(n, sizeof *res);
    struct kvp_str *keys = calloc(n, sizeof *keys);
    struct kvp_store_buf *wb = calloc(n, sizeof *wb), *rb = calloc(n, sizeof *rb);
    char(*names)[48] = calloc(n, 48);
    if (!ops || !res || !keys || !wb || !rb || !names) {
        fprintf(stderr, "kvpage bench store: out of memory\n");
        rc = KVP_EXIT_FAILED;
        goto out;
    }
    /* Every page once, untimed: neither side pays for the file system's block
     * allocation of a sparse file, which the side that came first would. */
    for (uint64_t p = 0; p + n <= np && !rc; p += n) {
        for (uint32_t i = 0; i < n; i++)
            ops[i] = (struct kvp_pagefile_op){(int64_t)((p + i) * f.page_size),
                                              buf + (uint64_t)i * f.page_size, f.page_size};
        for (uint32_t i = 0; i < n && !rc; i += entries)
            rc = kvp_pagefile_write(pf, ops + i, n - i < entries ? n - i : entries, res + i, NULL);
    }
    if (!rc)
        rc = kvp_pagefile_flush(pf, NULL);
    if (rc) {
        fprintf(stderr, "kvpage bench store: writing the file once first failed: %s\n",
                kvp_strerror(rc));
        rc = KVP_EXIT_FAILED;
        goto out;
    }
    /* The metadata alone, for what holds the keys/s: the same calls the
     * store makes, in a pool of its own beside the store's. */
    struct kvp_ns *mns = NULL;
    int64_t *mpages = calloc(n, sizeof *mpages);
    const char *pool = f.pool ? f.pool : "kv";
    char mpool[160];
    snprintf(mpool, sizeof mpool, "%.100s.bench-meta", pool);
    struct kvp_error merr = {0};
    const char *dep = f.deployment;
    if (!mpages ||
        kvp_meta_ns(kvp_store_meta(s), dep ? dep : "default", dep ? strlen(dep) : 7, mpool,
                    strlen(mpool), 1, &mns, &merr) ||
        kvp_meta_init_rank(mns, f.rank, np, &merr)) {
        fprintf(stderr, "kvpage bench store: the metadata-alone pool %s: %s\n", mpool,
                merr.msg[0] ? merr.msg : "out of memory");
        free(mpages);
        rc = KVP_EXIT_FAILED;
        goto out;
    }
    int tty = isatty(2) && !f.json;
    double t_raw_w = 0, t_raw_r = 0, t_put = 0, t_get = 0, t_mput = 0, t_mget = 0;
    uint64_t run = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int errors = 0;
    for (uint32_t r = 0; r < b.rounds && !errors; r++) {
        uint64_t first = ((uint64_t)r * n) % (np - n + 1);
        for (uint32_t i = 0; i < n; i++) {
            ops[i] = (struct kvp_pagefile_op){(int64_t)((first + i) * f.page_size),
                                              buf + (uint64_t)i * f.page_size, f.page_size};
            snprintf(names[i], 48, "bench-%016" PRIx64 "-%u-%u", run, r, i);
            keys[i] = (struct kvp_str){names[i], strlen(names[i])};
            wb[i] = (struct kvp_store_buf){buf + (uint64_t)i * f.page_size, f.page_size};
            rb[i] = (struct kvp_store_buf){rbuf + (uint64_t)i * f.page_size, f.page_size};
        }
        /* the page file alone, in batches of entries as the store cuts them */
        /* The two sides take turns at going first: the page cache's dirty
         * pages grow through a round, and whoever writes later would be
         * throttled more. */
        double d_raw_w = 0, d_raw_r = 0, d_put = 0, d_get = 0;
        struct kvp_error err = {0};
        int prc = 0;
        int64_t lead = n;
        for (int side = 0; side < 2; side++) {
            if (side == (int)(r & 1)) {
                for (uint32_t i = 0; i < n; i++)
                    ops[i].buf = buf + (uint64_t)i * f.page_size;
                double t0 = now_s();
                for (uint32_t i = 0; i < n && !errors; i += entries)
                    errors += kvp_pagefile_write(pf, ops + i, n - i < entries ? n - i : entries,
                                                 res + i, NULL) != 0;
                if (!f.no_durable)
                    errors += kvp_pagefile_flush(pf, NULL) != 0;
                double t1 = now_s();
                for (uint32_t i = 0; i < n; i++)
                    ops[i].buf = rbuf + (uint64_t)i * f.page_size;
                for (uint32_t i = 0; i < n && !errors; i += entries)
                    errors += kvp_pagefile_read(pf, ops + i, n - i < entries ? n - i : entries,
                                                res + i, NULL) != 0;
                d_raw_w = t1 - t0, d_raw_r = now_s() - t1;
            } else {
                double t2 = now_s();
                prc = kvp_store_put(s, keys, wb, n, res, &err);
                double t3 = now_s();
                lead = kvp_store_get(s, keys, rb, n, res, &err);
                d_put = t3 - t2, d_get = now_s() - t3;
                if (!prc && lead == n && memcmp(buf, rbuf, bytes)) {
                    fprintf(stderr,
                            "kvpage bench store: round %u: the pages read differ from those put\n",
                            r);
                    errors++;
                }
            }
        }
        double t4 = now_s();
        int mrc = kvp_meta_allocate(mns, f.rank, keys, n, mpages, NULL, &merr);
        if (!mrc)
            mrc = kvp_meta_confirm(mns, f.rank, keys, mpages, n, NULL, 0, &merr);
        double t5 = now_s();
        if (!mrc)
            mrc = kvp_meta_lookup(mns, f.rank, 1, keys, n, mpages, &merr);
        double t6 = now_s();
        if (!mrc)
            mrc = kvp_meta_delete(mns, f.rank, keys, n, &merr);
        if (mrc) {
            fprintf(stderr, "kvpage bench store: round %u: the metadata alone: %s\n", r, merr.msg);
            errors++;
        }
        if (prc || lead != n) {
            fprintf(stderr, "kvpage bench store: round %u: %s\n", r,
                    err.msg[0] ? err.msg : "not every key was stored and read");
            errors++;
        }
        if (errors)
            break;
        t_raw_w += d_raw_w, t_raw_r += d_raw_r, t_put += d_put, t_get += d_get;
        t_mput += t5 - t4, t_mget += t6 - t5;
        memset(rbuf, 0, bytes);
        double moved = (double)bytes * (r + 1) / 1e9;
        progress(tty, r + 1, b.rounds, moved / t_put, moved / t_get);
        if (!tty && !f.json)
            printf("round %u: page file write %.2f read %.2f, store put %.2f get %.2f GB/s\n", r,
                   (double)bytes / 1e9 / d_raw_w, (double)bytes / 1e9 / d_raw_r,
                   (double)bytes / 1e9 / d_put, (double)bytes / 1e9 / d_get);
    }
    free(mpages);
    kvp_meta_clear(mns, f.rank, NULL);
    if (errors) {
        rc = KVP_EXIT_FAILED;
        goto out;
    }
    double gb = (double)bytes * b.rounds / 1e9, k = (double)n * b.rounds;
    const char *loc = kvp_store_location(s);
    if (f.json) {
        printf("{\"page_size\": %" PRIu64 ", \"batch\": %u, \"rounds\": %u, \"entries\": %u, "
               "\"durable\": %s, \"meta\": \"%s\", \"backend_write\": \"%s\", "
               "\"backend_read\": \"%s\",\n"
               " \"pagefile_write_gbs\": %.4f, \"pagefile_read_gbs\": %.4f, "
               "\"store_put_gbs\": %.4f, \"store_get_gbs\": %.4f,\n"
               " \"store_put_keys_s\": %.1f, \"store_get_keys_s\": %.1f, "
               "\"pagefile_write_keys_s\": %.1f, \"pagefile_read_keys_s\": %.1f,\n"
               " \"meta_put_keys_s\": %.1f, \"meta_get_keys_s\": %.1f,\n"
               " \"put_ratio\": %.4f, \"get_ratio\": %.4f}\n",
               f.page_size, n, b.rounds, entries, !f.no_durable ? "true" : "false",
               strstr(loc, "://") ? "remote" : "embedded",
               kvp_pagefile_backend_name(kvp_pagefile_backend(pf, 1)),
               kvp_pagefile_backend_name(kvp_pagefile_backend(pf, 0)), gb / t_raw_w, gb / t_raw_r,
               gb / t_put, gb / t_get, k / t_put, k / t_get, k / t_raw_w, k / t_raw_r, k / t_mput,
               k / t_mget, t_raw_w / t_put, t_raw_r / t_get);
    } else {
        printf("%u rounds of %u pages of %" PRIu64 " bytes, metadata %s%s:\n", b.rounds, n,
               f.page_size, loc, !f.no_durable ? ", durable puts" : "");
        printf("  page file alone  write %8.2f GB/s %10.0f pages/s   read %8.2f GB/s %10.0f "
               "pages/s\n",
               gb / t_raw_w, k / t_raw_w, gb / t_raw_r, k / t_raw_r);
        printf("  store            put   %8.2f GB/s %10.0f keys/s    get  %8.2f GB/s %10.0f "
               "keys/s\n",
               gb / t_put, k / t_put, gb / t_get, k / t_get);
        printf("  metadata alone   allocate+confirm %10.0f keys/s   lookup %10.0f keys/s\n",
               k / t_mput, k / t_mget);
        char cp[48], cg[48];
        cost_words(cp, sizeof cp, t_put, t_raw_w);
        cost_words(cg, sizeof cg, t_get, t_raw_r);
        printf("  store / page file: put %.3f, get %.3f (the store %s on put, %s on get)\n",
               t_raw_w / t_put, t_raw_r / t_get, cp, cg);
    }
out:
    free(ops), free(res), free(keys), free(wb), free(rb), free(names);
    if (own_pool)
        kvp_meta_clear(kvp_store_ns(s), f.rank, NULL);
    kvp_store_close(s);
    free(buf), free(rbuf);
    made_remove(&made);
    return rc;
}
