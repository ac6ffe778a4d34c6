/*
 * kvpage bench io: is this file system fast enough for KV pages?
 *
 * Moves pages the way the engines do (random batches of --batch pages between
 * random slots of a large host pool and random pages of the file) through one
 * kvp_pagefile shared by --threads callers, then the same pattern with plain
 * pread/pwrite, one call per page, from 1, 4 and 16 threads (what fio's psync
 * engine with numjobs would get), and keeps the best of those as the
 * baseline. The pool is faulted in before timing so that the figures are the
 * file system's and not the first touch of host memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kvpage/pagefile.h"
#include "util/size.h"

#define CMD "kvpage bench io"

struct io_args {
    const char *file;
    uint64_t file_size, page_size, pool;
    uint32_t batch, threads, queues; /* queues: opts.queues, 0 = the default */
    int rw;                          /* 1 read, 2 write, 3 both */
    int direct, json, mmap_reads;
    double seconds, warmup;
    int backend; /* KVP_PAGEFILE_BACKEND_* of --backend, default AUTO */
    int tags;    /* --tags on|off: integrity tags (default on) */
};

/* One measurement: who moved the pages, how many callers, the figures. */
struct phase_result {
    int write, plain;
    uint32_t threads;
    uint64_t bytes, batches;
    double seconds;
    struct kvp__lat lat; /* per batch */
};

struct run {
    const struct io_args *a;
    struct kvp_pagefile *pf;
    int fd; /* the plain side's own descriptor (O_DIRECT as the page file's) */
    unsigned char *pool;
    uint64_t slots, pages;
    int write, plain;
    uint32_t nthreads;
    /* 0 warming up, 1 measuring, 2 stop: batches count only when they start
     * and end while measuring, so neither edge adds a partial batch. */
    atomic_int state;
    atomic_int failed;
    char why[256];
    pthread_mutex_t why_lock;
};

struct worker {
    struct run *r;
    uint32_t id;
    atomic_uint_fast64_t bytes; /* read by the progress bar while running */
    uint64_t batches;
    struct kvp__lat lat;
    pthread_t tid;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fail(struct run *r, const char *fmt, const char *a, int code)
{
    pthread_mutex_lock(&r->why_lock);
    if (!atomic_load(&r->failed)) {
        char m[200];
        snprintf(m, sizeof m, fmt, a);
        snprintf(r->why, sizeof r->why, "%s: %s", m, strerror(code));
        atomic_store(&r->failed, 1);
    }
    pthread_mutex_unlock(&r->why_lock);
    atomic_store(&r->state, 2);
}

/* One page with plain pread/pwrite, continuing short transfers. */
static int plain_io(int fd, int write, unsigned char *buf, uint64_t size, uint64_t off)
{
    uint64_t done = 0;
    while (done < size) {
        ssize_t n = write ? pwrite(fd, buf + done, size - done, (off_t)(off + done))
                          : pread(fd, buf + done, size - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EIO;
        done += (uint64_t)n;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->r;
    const struct io_args *a = r->a;
    uint64_t seed = 0x5eed0000ull + w->id * 7919ull + (uint64_t)r->plain * 104729ull;
    /* Each caller has slots of its own, as each engine worker has its own
     * blocks, when the pool is large enough for that. */
    uint64_t first = 0, nslots = r->slots;
    if (r->slots >= (uint64_t)r->nthreads * a->batch) {
        nslots = r->slots / r->nthreads;
        first = nslots * w->id;
    }
    struct kvp_pagefile_op *ops = calloc(a->batch, sizeof *ops);
    int64_t *res = calloc(a->batch, sizeof *res);
    if (!ops || !res) {
        fail(r, "%s", "out of memory", ENOMEM);
        goto out;
    }
    while (atomic_load_explicit(&r->state, memory_order_relaxed) != 2) {
        for (uint32_t i = 0; i < a->batch; i++) {
            uint64_t page = rnd(&seed) % r->pages, slot;
            /* distinct slots within a batch, as an engine's blocks are */
            for (;;) {
                slot = first + rnd(&seed) % nslots;
                int dup = 0;
                for (uint32_t j = 0; j < i; j++)
                    dup |= ops[j].buf == r->pool + slot * a->page_size;
                if (!dup || nslots < a->batch)
                    break;
            }
            ops[i] = (struct kvp_pagefile_op){(int64_t)(page * a->page_size),
                                              r->pool + slot * a->page_size, a->page_size};
        }
        int measuring = atomic_load_explicit(&r->state, memory_order_relaxed) == 1;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (r->plain) {
            for (uint32_t i = 0; i < a->batch; i++) {
                int e = plain_io(r->fd, r->write, ops[i].buf, ops[i].size, (uint64_t)ops[i].offset);
                if (e) {
                    fail(r, r->write ? "pwrite of %s" : "pread of %s", a->file, e);
                    goto out;
                }
            }
        } else {
            struct kvp_error err = {0};
            int rc = r->write ? kvp_pagefile_write(r->pf, ops, a->batch, res, &err)
                              : kvp_pagefile_read(r->pf, ops, a->batch, res, &err);
            if (rc) {
                fail(r, "%s", err.msg[0] ? err.msg : "a batch failed", -rc);
                goto out;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (measuring && atomic_load_explicit(&r->state, memory_order_relaxed) == 1) {
            atomic_fetch_add_explicit(&w->bytes, (uint64_t)a->batch * a->page_size,
                                      memory_order_relaxed);
            w->batches++;
            kvp__lat_add(&w->lat, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000ll +
                                             (t1.tv_nsec - t0.tv_nsec)));
        }
    }
out:
    free(ops), free(res);
    return NULL;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static const char *who(const struct phase_result *p, char *buf, size_t n)
{
    snprintf(buf, n, "%s %s, %u thread%s", p->write ? "write" : "read ",
             p->plain ? "plain" : "kvpage", p->threads, p->threads == 1 ? "" : "s");
    return buf;
}

/*
 * Runs one measurement: nthreads callers, warm-up then --seconds; draws the
 * progress bar (phase `index` of `count`) on a terminal. Returns 0, or -1
 * after printing why.
 */
static int measure(struct run *r, struct phase_result *out, int tty, int index, int count)
{
    const struct io_args *a = r->a;
    struct worker *w = calloc(r->nthreads, sizeof *w);
    if (!w) {
        fprintf(stderr, CMD ": out of memory\n");
        return -1;
    }
    atomic_store(&r->state, 0);
    uint32_t started = 0;
    for (; started < r->nthreads; started++) {
        w[started].r = r;
        w[started].id = started;
        if (pthread_create(&w[started].tid, NULL, worker_main, &w[started])) {
            fail(r, "%s", "cannot start a thread", EAGAIN);
            break;
        }
    }
    memset(out, 0, sizeof *out);
    out->write = r->write, out->plain = r->plain, out->threads = r->nthreads;
    char label[120], name[64];
    who(out, name, sizeof name);
    double t_start = now_s(), t_meas = t_start + a->warmup, t_end = t_meas + a->seconds;
    double total = a->warmup + a->seconds;
    int measuring = 0;
    for (;;) {
        double t = now_s();
        if (atomic_load(&r->failed))
            break;
        if (!measuring && t >= t_meas) {
            t_meas = t;
            t_end = t + a->seconds;
            atomic_store(&r->state, 1);
            measuring = 1;
        }
        if (measuring && t >= t_end)
            break;
        if (tty) {
            uint64_t b = 0;
            for (uint32_t i = 0; i < started; i++)
                b += atomic_load_explicit(&w[i].bytes, memory_order_relaxed);
            double el = measuring ? t - t_meas : 0;
            snprintf(label, sizeof label, "%s  %.2f GB/s", name,
                     measuring && el > 0 ? (double)b / el / 1e9 : 0.0);
            kvp__progress_bar((index + (t - t_start) / total) / count, label);
        }
        double next = measuring ? t_end : t_meas;
        sleep_s(next - t < 0.1 ? next - t : 0.1);
    }
    out->seconds = now_s() - t_meas;
    atomic_store(&r->state, 2);
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(w[i].tid, NULL);
        out->bytes += atomic_load(&w[i].bytes);
        out->batches += w[i].batches;
        kvp__lat_merge(&out->lat, &w[i].lat);
    }
    free(w);
    if (atomic_load(&r->failed)) {
        if (tty)
            fputc('\n', stderr);
        fprintf(stderr, CMD ": %s: %s\n", name, r->why);
        return -1;
    }
    if (tty) {
        snprintf(label, sizeof label, "%s  %.2f GB/s", name,
                 (double)out->bytes / out->seconds / 1e9);
        kvp__progress_bar((double)(index + 1) / count, label);
    } else {
        fprintf(stderr, "%s: %.3f GB/s, %.0f pages/s, batch p50 %.0f us p99 %.0f us\n", name,
                (double)out->bytes / out->seconds / 1e9,
                (double)out->batches * a->batch / out->seconds,
                kvp__lat_quantile(&out->lat, 0.5) / 1e3, kvp__lat_quantile(&out->lat, 0.99) / 1e3);
    }
    return 0;
}

static double gbs(const struct phase_result *p)
{
    return (double)p->bytes / p->seconds / 1e9;
}

/* The library's backend names, from value `from` up to the first "?" (the
 * values are consecutive), joined with sep, and with last before the last
 * one: "auto, psync, uring or usrbio". Returns out. */
static const char *backend_names(char *out, size_t len, int from, const char *sep, const char *last)
{
    int n = from;
    while (strcmp(kvp_pagefile_backend_name(n), "?"))
        n++;
    size_t used = 0;
    out[0] = '\0';
    for (int b = from; b < n && used < len; b++) {
        int k = snprintf(out + used, len - used, "%s%s",
                         b == from    ? ""
                         : b == n - 1 ? last
                                      : sep,
                         kvp_pagefile_backend_name(b));
        used += k > 0 ? (size_t)k : 0;
    }
    return out;
}

/* The library's backends, one line each: "      NAME    DESCRIPTION\n". */
static const char *backend_lines(char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int b = 0; strcmp(kvp_pagefile_backend_name(b), "?") && used < len; b++) {
        int k = snprintf(out + used, len - used, "      %-7s %s\n", kvp_pagefile_backend_name(b),
                         kvp_pagefile_backend_description(b));
        used += k > 0 ? (size_t)k : 0;
    }
    return out;
}

static void usage(FILE *out)
{
    char all[256], real[256], each[2048];
    backend_lines(each, sizeof each);
    backend_names(all, sizeof all, 0, "|", "|");
    backend_names(real, sizeof real, 1, ", ", " or ");
    fprintf(out,
            "usage: kvpage bench io --file PATH [flags]\n"
            "Is this file system (a 3FS FUSE mount, a local disk) fast enough for KV pages?\n"
            "Moves random batches of pages between random slots of a host buffer pool and\n"
            "random pages of PATH, as the engines do, through kvpage's page file (io_uring or\n"
            "its thread pool) and, as a baseline, with plain pread/pwrite (one call per page)\n"
            "from 1, 4 and 16 threads, keeping the best: what fio-like plain I/O gets here.\n"
            "flags:\n"
            "  --file PATH        the file to use; created and filled once if missing or\n"
            "                     smaller than --file-size (removed afterwards, and at\n"
            "                     Ctrl-C, only then); a store's page file (PATH.owner) is\n"
            "                     refused, naming its owner\n"
            "  --file-size SIZE   bytes of PATH to use, default 1G (K, M, G, T: powers of 1024)\n"
            "  --page-size SIZE   bytes per page, default 2M\n"
            "  --batch N          pages per batch (the engines' entries), default 8\n"
            "  --pool SIZE        the host buffer pool, default 1G (2 MiB aligned, huge pages\n"
            "                     asked for, faulted in before timing; a backend's own memory,\n"
            "                     registered, where it moves pages without a copy)\n"
            "  --threads N        callers sharing one page file, default 1\n"
            "  --queues N         rings of a backend that has them (batches in flight at\n"
            "                     once); default 4\n"
            "  --rw read|write|both   default both (buffered writes measure what the page\n"
            "                     cache takes; add --direct for the device's)\n"
            "  --direct           O_DIRECT on both sides (else buffered)\n"
            "  --backend %s   kvpage's page-I/O backend, default auto:\n"
            "%s"
            "  --mmap-reads       kvpage's buffered reads copy out of a mapping of PATH\n"
            "                     (KVP_PAGEFILE_MMAP_READS; faster into cold memory, but\n"
            "                     SIGBUS on an I/O error: see kvpage/pagefile.h)\n"
            "  --tags on|off      integrity tags on kvpage's side (default on, as in a page\n"
            "                     file; off: KVP_PAGEFILE_NO_TAGS). With tags, every page\n"
            "                     is first rewritten through kvpage so that reads verify\n"
            "                     tags; run both to see what they cost (bench/io/tags.sh)\n"
            "  --seconds S        each measurement, default 5, after --warmup S (default 1)\n"
            "  --json             one JSON object on standard output, nothing else there\n"
            "Writes overwrite the first --file-size bytes of PATH: name a file of its own.\n"
            "Buffered reads of a file that fits in the page cache measure the cache: use\n"
            "--direct, or a --file-size larger than memory, for the file system's.\n"
            "A progress bar is drawn on standard error when it is a terminal, one line per\n"
            "measurement otherwise.\n"
            "figures (per direction, \"read\" and \"write\" in --json):\n"
            "  kvpage.gbs, baseline.gbs     GB/s (10^9 bytes/s)\n"
            "  kvpage.pages_s, baseline.pages_s   pages/s\n"
            "  kvpage.batch_p50_us, .batch_p99_us (both sides)   microseconds per batch (on\n"
            "                     the plain side, --batch calls one after the other in a thread)\n"
            "  kvpage.batches, kvpage.backend (%s), kvpage.threads\n"
            "  baseline.threads (the best of 1, 4, 16), baseline.tried ([{threads, gbs}])\n"
            "  ratio                        kvpage GB/s / baseline GB/s\n"
            "  and file, file_size, page_size, batch, pool, threads, queues (the rings set\n"
            "  up), direct, tags, seconds, warmup, created (whether this run made the file)\n"
            "exit status: 0 done, 2 a bad flag or value, 3 the file or its I/O failed\n"
            "examples:\n"
            "  kvpage bench io --file /mnt/3fs/kvpage-bench.pages --file-size 16G --direct\n"
            "  kvpage bench io --file /tmp/x.pages --page-size 256K --threads 4 --rw read --json\n",
            all, each, real);
}

static int usage_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, CMD ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (kvpage bench io --help)\n");
    return KVP_EXIT_USAGE;
}

static int parse_seconds(const char *v, double min, double *out)
{
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || !*v || errno || *end || !(d >= min) || d > 86400)
        return -1;
    *out = d;
    return 0;
}

static int parse_args(int argc, char **argv, struct io_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument '%s'%s", arg, "");
        char name[32];
        const char *eq = strchr(arg, '='), *value = NULL;
        size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nl >= sizeof name)
            return usage_error("unknown flag '%s'%s", arg, "");
        memcpy(name, arg, nl);
        name[nl] = 0;
        if (!strcmp(name, "--direct") || !strcmp(name, "--json") || !strcmp(name, "--mmap-reads")) {
            if (eq)
                return usage_error("%s takes no value%s", name, "");
            *(!strcmp(name, "--direct") ? &a->direct
              : !strcmp(name, "--json") ? &a->json
                                        : &a->mmap_reads) = 1;
            continue;
        }
        static const char *const known[] = {"--file",   "--file-size", "--page-size", "--batch",
                                            "--pool",   "--threads",   "--rw",        "--seconds",
                                            "--warmup", "--backend",   "--queues",    "--tags"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
            if (!strcmp(name, known[j]))
                k = j;
        if (k < 0)
            return usage_error("unknown flag '%s'%s", name, "");
        value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value)
            return usage_error("%s needs a value%s", name, "");
        uint64_t v = 0;
        switch (k) {
        case 0:
            a->file = value;
            if (!*value)
                return usage_error("--file needs a path%s%s", "", "");
            break;
        case 1:
        case 2:
        case 4:
            if (kvp__parse_size(value, 1, &v) || v == 0)
                return usage_error("%s '%s' is not a size (a positive number with an "
                                   "optional K, M, G or T)",
                                   name, value);
            *(k == 1 ? &a->file_size : k == 2 ? &a->page_size : &a->pool) = v;
            break;
        case 3:
        case 5:
        case 10:
            if (kvp__parse_size(value, 0, &v) || v == 0 || v > 1024)
                return usage_error("%s '%s' is not a count (1 .. 1024)", name, value);
            *(k == 3 ? &a->batch : k == 5 ? &a->threads : &a->queues) = (uint32_t)v;
            break;
        case 6:
            a->rw = !strcmp(value, "read")    ? 1
                    : !strcmp(value, "write") ? 2
                    : !strcmp(value, "both")  ? 3
                                              : 0;
            if (!a->rw)
                return usage_error("--rw '%s' is not read, write or both%s", value, "");
            break;
        case 7:
        case 8:
            if (parse_seconds(value, k == 7 ? 0.001 : 0, k == 7 ? &a->seconds : &a->warmup))
                return usage_error("%s '%s' is not a number of seconds", name, value);
            break;
        case 11:
            a->tags = !strcmp(value, "on") ? 1 : !strcmp(value, "off") ? 0 : -1;
            if (a->tags < 0)
                return usage_error("--tags '%s' is not on or off%s", value, "");
            break;
        case 9:
            a->backend = -1;
            for (int b = 0; strcmp(kvp_pagefile_backend_name(b), "?"); b++)
                if (!strcmp(value, kvp_pagefile_backend_name(b)))
                    a->backend = b;
            if (a->backend < 0) {
                char names[256];
                return usage_error("--backend '%s' is not %s", value,
                                   backend_names(names, sizeof names, 0, ", ", " or "));
            }
            break;
        }
    }
    if (!a->file)
        return usage_error("--file PATH is required (the file to measure, e.g. on the 3FS "
                           "mount)%s%s",
                           "", "");
    if (a->page_size > a->file_size)
        return usage_error("--page-size is larger than --file-size%s%s", "", "");
    if (a->pool < a->page_size)
        return usage_error("--pool must hold at least one page%s%s", "", "");
    if (a->mmap_reads && a->backend != KVP_PAGEFILE_BACKEND_AUTO &&
        a->backend != KVP_PAGEFILE_BACKEND_PSYNC)
        return usage_error("--mmap-reads copies on the psync threads: --backend auto or "
                           "psync%s%s",
                           "", "");
    if (a->direct && a->mmap_reads)
        return usage_error("--mmap-reads is for buffered reads: drop it or --direct%s%s", "", "");
    if (a->direct && a->page_size % 4096)
        return usage_error("--direct needs a --page-size that is a multiple of 4K%s%s", "", "");
    return 0;
}

/* The exit status for a --file that cannot be opened or created: a missing
 * directory, a path through a file or one the user may not write is a bad
 * location (2, as a bad flag); anything else a failure (3). */
static int bad_location(int e)
{
    return e == ENOENT || e == ENOTDIR || e == EACCES || e == EISDIR ? KVP_EXIT_USAGE
                                                                     : KVP_EXIT_FAILED;
}

/* Makes PATH at least a->file_size bytes, written (not sparse: reads of holes
 * would not touch the device). *made: it did not exist. Returns 0 or the
 * exit status after printing why. */
static int prepare_file(const struct io_args *a, int tty, int *made)
{
    struct stat st;
    *made = stat(a->file, &st) != 0;
    if (*made && errno != ENOENT) {
        int e = errno;
        fprintf(stderr, CMD ": %s: %s\n", a->file, strerror(e));
        return bad_location(e);
    }
    if (!*made && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
        fprintf(stderr, CMD ": %s is not a regular file\n", a->file);
        return KVP_EXIT_USAGE;
    }
    uint64_t have = *made ? 0 : (uint64_t)st.st_size;
    if (!*made && S_ISBLK(st.st_mode))
        have = a->file_size; /* a device is used as it is */
    if (have >= a->file_size)
        return 0;
    int fd = open(a->file, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        int e = errno;
        fprintf(stderr, CMD ": cannot create %s: %s\n", a->file, strerror(e));
        *made = 0;
        return bad_location(e);
    }
    size_t chunk = 8u << 20;
    unsigned char *buf = malloc(chunk);
    if (!buf) {
        close(fd);
        return KVP_EXIT_FAILED;
    }
    for (size_t i = 0; i + 8 <= chunk; i += 8) {
        uint64_t v = i * 0x9e3779b97f4a7c15ull;
        memcpy(buf + i, &v, 8);
    }
    if (!tty)
        fprintf(stderr, CMD ": filling %s to %" PRIu64 " bytes (once)\n", a->file, a->file_size);
    int e = 0;
    for (uint64_t off = have - have % 4096; off < a->file_size && !e;) {
        uint64_t n = a->file_size - off < chunk ? a->file_size - off : chunk;
        e = plain_io(fd, 1, buf, n, off);
        off += n;
        if (tty) {
            char label[96];
            snprintf(label, sizeof label, "filling %s", a->file);
            kvp__progress_bar((double)off / (double)a->file_size * 0.999, label);
        }
    }
    if (tty)
        fputc('\r', stderr);
    free(buf);
    if (!e && fsync(fd))
        e = errno;
    close(fd);
    if (e) {
        fprintf(stderr, CMD ": cannot fill %s: %s\n", a->file, strerror(e));
        return KVP_EXIT_FAILED;
    }
    return 0;
}

/*
 * With tags: rewrites every page of the file through the page file (its own
 * bytes, read plainly), so that each carries a tag and the reads measured
 * verify one (a page filled by plain writes has none to check: it would be
 * served unverified, or rejected). Returns 0 or the exit status after
 * printing why.
 */
static int tag_pages(struct run *r, int tty)
{
    const struct io_args *a = r->a;
    if (!tty)
        fprintf(stderr, CMD ": tagging the %" PRIu64 " pages of %s\n", r->pages, a->file);
    for (uint64_t p = 0; p < r->pages; p++) {
        unsigned char *buf = r->pool + (p % r->slots) * a->page_size;
        struct kvp_pagefile_op op = {(int64_t)(p * a->page_size), buf, a->page_size};
        int64_t res;
        struct kvp_error err = {0};
        int e = plain_io(r->fd, 0, buf, a->page_size, p * a->page_size);
        if (e || kvp_pagefile_write(r->pf, &op, 1, &res, &err) != 0) {
            fprintf(stderr, CMD ": cannot tag %s: %s\n", a->file, e ? strerror(e) : err.msg);
            return KVP_EXIT_FAILED;
        }
        if (tty && p % 64 == 0)
            kvp__progress_bar((double)p / (double)r->pages * 0.999, "tagging pages");
    }
    if (tty)
        fputc('\r', stderr);
    return 0;
}

static void json_side(const char *name, const struct phase_result *p, const struct io_args *a)
{
    printf("\"%s\": {\"threads\": %u, \"gbs\": %.4f, \"pages_s\": %.1f, \"batch_p50_us\": %.1f, "
           "\"batch_p99_us\": %.1f, \"batches\": %" PRIu64,
           name, p->threads, gbs(p), (double)p->batches * a->batch / p->seconds,
           kvp__lat_quantile(&p->lat, 0.5) / 1e3, kvp__lat_quantile(&p->lat, 0.99) / 1e3,
           p->batches);
}

/* Whether a backend of r's page file moves pages in memory of its own
 * without a copy (kvp_pagefile_info's alloc_zero_copy: USRBIO's): the pool
 * is then that memory, as an engine handed such a pool has it. */
static int own_pool(const struct run *r)
{
    struct kvp_pagefile_info inf = {.info_size = sizeof inf};
    return kvp_pagefile_info(r->pf, &inf) == 0 && inf.alloc_zero_copy;
}

/* Opens the page file of r->a and the plain side's descriptor. Returns 0 or
 * the exit status after printing why. */
static int open_sides(struct run *r)
{
    const struct io_args *a = r->a;
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.size = a->file_size;
    o.bytes_per_page = a->page_size;
    o.entries = a->batch;
    o.flags = KVP_PAGEFILE_ALIGNED | (a->direct ? KVP_PAGEFILE_DIRECT : 0) |
              (a->mmap_reads ? KVP_PAGEFILE_MMAP_READS : 0) | (a->tags ? 0 : KVP_PAGEFILE_NO_TAGS);
    o.backend = a->backend;
    o.queues = a->queues;
    struct kvp_error err = {0};
    int e = kvp_pagefile_open(a->file, &o, &r->pf, &err);
    if (e) {
        fprintf(stderr, CMD ": cannot open %s: %s\n", a->file, err.msg[0] ? err.msg : "");
        return e == -EINVAL ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    if (a->direct && a->page_size % kvp_pagefile_direct_offset_align(r->pf)) {
        fprintf(stderr, CMD ": --direct on %s needs pages that are a multiple of %u bytes\n",
                a->file, kvp_pagefile_direct_offset_align(r->pf));
        return KVP_EXIT_USAGE;
    }
    r->fd = open(a->file, O_RDWR | (a->direct ? O_DIRECT : 0));
    if (r->fd < 0) {
        fprintf(stderr, CMD ": cannot open %s: %s\n", a->file, strerror(errno));
        return KVP_EXIT_FAILED;
    }
    return 0;
}

/* The host pool, faulted in. Returns 0 or the exit status after printing why. */
static int make_pool(struct run *r)
{
    const struct io_args *a = r->a;
    struct kvp_error err = {0};
    /* The backend's memory, registered, so pages move without a copy (what
     * an engine handed such a pool gets). */
    if (own_pool(r)) {
        r->pool = kvp_pagefile_alloc(r->pf, a->pool, &err);
        struct kvp_pagefile_buf reg = {r->pool, a->pool};
        if (!r->pool || kvp_pagefile_register_buffers(r->pf, &reg, 1, &err) != 0) {
            fprintf(stderr,
                    CMD ": cannot allocate a pool of %" PRIu64 " bytes of the %s backend: %s\n",
                    a->pool, kvp_pagefile_backend_name(kvp_pagefile_backend(r->pf, 0)), err.msg);
            return KVP_EXIT_FAILED;
        }
    } else if (posix_memalign((void **)&r->pool, 2u << 20, a->pool)) {
        /* 2 MiB alignment lets the kernel back the pool with huge pages. */
        r->pool = NULL;
        fprintf(stderr, CMD ": cannot allocate a pool of %" PRIu64 " bytes\n", a->pool);
        return KVP_EXIT_FAILED;
    }
    /* Engines' pools are large pinned allocations: huge pages keep the cost
     * of first touching 4 KiB pages out of the figures; distinct content per
     * page keeps same-page merging from sharing them. */
    madvise(r->pool, a->pool, MADV_HUGEPAGE);
    for (uint64_t off = 0; off + 8 <= a->pool; off += 8) {
        uint64_t v = off * 0x9e3779b97f4a7c15ull;
        memcpy(r->pool + off, &v, 8);
    }
    return 0;
}

/* The measurements of one run: per direction [0] kvpage's, [1..3] plain
 * from 1, 4 and 16 threads, best[wr] the best of those. */
struct results {
    int dirs[2], ndirs;
    struct phase_result res[2][4];
    int best[2];
};

/* Measures each direction of --rw: kvpage's side, then the plain side.
 * Returns 0 or the exit status. */
static int measure_all(struct run *r, int tty, struct results *m)
{
    static const uint32_t plain_threads[3] = {1, 4, 16};
    const struct io_args *a = r->a;
    m->ndirs = 0;
    m->best[0] = m->best[1] = 0;
    if (a->rw & 1)
        m->dirs[m->ndirs++] = 0;
    if (a->rw & 2)
        m->dirs[m->ndirs++] = 1;
    int count = m->ndirs * 4, index = 0;
    for (int d = 0; d < m->ndirs; d++) {
        int wr = m->dirs[d];
        r->write = wr;
        r->plain = 0;
        r->nthreads = a->threads;
        if (measure(r, &m->res[wr][0], tty, index++, count))
            return KVP_EXIT_FAILED;
        r->plain = 1;
        for (int t = 0; t < 3; t++) {
            r->nthreads = plain_threads[t];
            if (measure(r, &m->res[wr][t + 1], tty, index++, count))
                return KVP_EXIT_FAILED;
            if (gbs(&m->res[wr][t + 1]) > gbs(&m->res[wr][m->best[wr]]) || !m->best[wr])
                m->best[wr] = t + 1;
        }
    }
    return 0;
}

static void print_json(const struct run *r, const struct results *m, int made)
{
    const struct io_args *a = r->a;
    printf("{\"file\": \"");
    for (const char *p = a->file; *p; p++)
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    printf("\", \"file_size\": %" PRIu64 ", \"page_size\": %" PRIu64
           ", \"batch\": %u, \"pool\": %" PRIu64 ", \"threads\": %u, \"queues\": %u, "
           "\"direct\": %s, \"mmap_reads\": %s, \"tags\": %s, \"seconds\": %g, "
           "\"warmup\": %g, \"created\": %s",
           a->file_size, a->page_size, a->batch, a->pool, a->threads, kvp_pagefile_queues(r->pf),
           a->direct ? "true" : "false", a->mmap_reads ? "true" : "false",
           a->tags ? "true" : "false", a->seconds, a->warmup, made ? "true" : "false");
    for (int d = 0; d < m->ndirs; d++) {
        int wr = m->dirs[d];
        const struct phase_result *k = &m->res[wr][0], *b = &m->res[wr][m->best[wr]];
        printf(",\n \"%s\": {", wr ? "write" : "read");
        json_side("kvpage", k, a);
        printf(", \"backend\": \"%s\"}, ",
               kvp_pagefile_backend_name(kvp_pagefile_backend(r->pf, wr)));
        json_side("baseline", b, a);
        printf(", \"tried\": [");
        for (int t = 1; t < 4; t++)
            printf("%s{\"threads\": %u, \"gbs\": %.4f}", t > 1 ? ", " : "", m->res[wr][t].threads,
                   gbs(&m->res[wr][t]));
        printf("]}, \"ratio\": %.4f}", gbs(b) > 0 ? gbs(k) / gbs(b) : 0.0);
    }
    printf("}\n");
}

static void print_table(const struct run *r, const struct results *m)
{
    const struct io_args *a = r->a;
    printf("%s: %" PRIu64 " bytes, pages of %" PRIu64 " bytes in batches of %u, pool %" PRIu64
           " bytes, %s, tags %s\n",
           a->file, a->file_size, a->page_size, a->batch, a->pool,
           a->direct       ? "O_DIRECT"
           : a->mmap_reads ? "buffered, mmap reads"
                           : "buffered",
           a->tags ? "on" : "off");
    printf("  %-5s %-32s %9s %11s %12s %12s\n", "", "", "GB/s", "pages/s", "batch p50 us",
           "batch p99 us");
    for (int d = 0; d < m->ndirs; d++) {
        int wr = m->dirs[d];
        const struct phase_result *res = m->res[wr];
        int best = m->best[wr];
        for (int side = 0; side < 2; side++) {
            const struct phase_result *p = &res[side ? best : 0];
            char name[64];
            if (side)
                snprintf(name, sizeof name, "plain p%s, %u thread%s (best)", wr ? "write" : "read",
                         p->threads, p->threads == 1 ? "" : "s");
            else
                snprintf(name, sizeof name, "kvpage %s, %u caller%s",
                         kvp_pagefile_backend_name(kvp_pagefile_backend(r->pf, wr)), p->threads,
                         p->threads == 1 ? "" : "s");
            printf("  %-5s %-32s %9.3f %11.0f %12.0f %12.0f\n",
                   side ? ""
                   : wr ? "write"
                        : "read",
                   name, gbs(p), (double)p->batches * a->batch / p->seconds,
                   kvp__lat_quantile(&p->lat, 0.5) / 1e3, kvp__lat_quantile(&p->lat, 0.99) / 1e3);
        }
        printf("  %-5s kvpage / baseline: %.2f (plain tried:", "",
               gbs(&res[best]) > 0 ? gbs(&res[0]) / gbs(&res[best]) : 0.0);
        for (int t = 1; t < 4; t++)
            printf(" %u thr %.3f GB/s%s", res[t].threads, gbs(&res[t]), t < 3 ? "," : ")\n");
    }
}

/* Opens, fills the pool, tags, measures and prints (the file is prepared).
 * Returns 0 or the exit status. */
static int bench(struct run *r, int tty, int made)
{
    const struct io_args *a = r->a;
    int rc = open_sides(r);
    if (!rc)
        rc = make_pool(r);
    if (!rc && a->tags)
        rc = tag_pages(r, tty);
    struct results m;
    if (!rc)
        rc = measure_all(r, tty, &m);
    if (rc)
        return rc;
    if (a->json)
        print_json(r, &m, made);
    else
        print_table(r, &m);
    return 0;
}

int kvp__cli_bench_io(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    }
    struct io_args a = {.file_size = 1ull << 30,
                        .page_size = 2u << 20,
                        .pool = 1ull << 30,
                        .batch = 8,
                        .threads = 1,
                        .rw = 3,
                        .seconds = 5.0,
                        .warmup = 1.0,
                        .backend = KVP_PAGEFILE_BACKEND_AUTO,
                        .tags = 1};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    int tty = isatty(2);
    int made = 0;
    /* A store's page file is not a benchmark's: its keys would read our bytes. */
    struct kvp_error oe = {0};
    int own = kvp_store_check_unowned(a.file, CMD, &oe);
    if (own) {
        fprintf(stderr, CMD ": %s: %s\n", a.file, oe.msg);
        return own == -EEXIST ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    struct stat st0;
    if (stat(a.file, &st0) != 0 && errno == ENOENT)
        kvp__cleanup_file(a.file); /* a Ctrl-C while filling or measuring removes it */
    /* The tags sidecar the page file makes beside it, when there is none yet. */
    char *tags = malloc(strlen(a.file) + sizeof ".tags");
    if (!tags)
        return KVP_EXIT_FAILED;
    sprintf(tags, "%s.tags", a.file);
    int tags_made = stat(tags, &st0) != 0 && errno == ENOENT;
    if (tags_made)
        kvp__cleanup_file(tags);
    rc = prepare_file(&a, tty, &made);
    if (rc) {
        if (made)
            unlink(a.file);
        kvp__cleanup_done();
        free(tags);
        return rc;
    }
    struct run r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.why_lock, NULL);
    r.a = &a;
    r.fd = -1;
    r.pages = a.file_size / a.page_size;
    r.slots = a.pool / a.page_size;
    rc = bench(&r, tty, made);
    if (r.fd >= 0)
        close(r.fd);
    if (r.pf && r.pool && own_pool(&r))
        kvp_pagefile_free(r.pf, r.pool);
    else
        free(r.pool);
    kvp_pagefile_close(r.pf);
    pthread_mutex_destroy(&r.why_lock);
    if (made && unlink(a.file))
        fprintf(stderr, CMD ": could not remove %s: %s\n", a.file, strerror(errno));
    if (tags_made && unlink(tags) && errno != ENOENT)
        fprintf(stderr, CMD ": could not remove %s: %s\n", tags, strerror(errno));
    free(tags);
    kvp__cleanup_done();
    return rc;
}
