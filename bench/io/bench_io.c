/*
 * bench_io — throughput of kvp_pagefile batches, the way an engine uses it:
 * random batches of `batch` pages (the engines' entries = 8) between random
 * slots of a large host pool (>= 1 GiB, so copies land in cold memory as
 * they do in a real KV pool) and random pages of the file.
 *
 *   bench_io --file F --size BYTES --bpp BYTES --rw read|write [--direct]
 *            [--backend auto|psync|uring] [--threads N] [--queues N]
 *            [--pool BYTES] [--batch N] [--callers N] [--seconds S]
 *            [--register] [--chunk BYTES] [--memcpy] [--mmap-reads]
 *
 * --mmap-reads opens the page file with KVP_PAGEFILE_MMAP_READS.
 *
 * --memcpy measures the ceiling of a buffered read instead: each caller
 * copies the same pages with memcpy from the file mapped in memory (the page
 * cache itself, the source pread copies from) into the same pool slots. Run
 * with --callers 2 it is what two cores can copy into a cold pool.
 *
 * Prints one line: key=value pairs including gbps (10^9 bytes/s).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvpage.h"

static struct {
    const char *file;
    uint64_t size, bpp, pool, chunk;
    int write, direct, backend, threads, queues, batch, callers, reg, huge, memcpy;
    double warmup;
    double seconds;
} a = {NULL, 4ull << 30, 2u << 20, 1ull << 30, 0, 0,   0,  KVP_PAGEFILE_BACKEND_AUTO, 0, 0,
       8,    1,          0,        1,          0, 1.0, 4.0};

static const unsigned char *map; /* --memcpy: the file, mapped */

static struct kvp_pagefile *pf;
static atomic_int stop;
static atomic_uint_fast64_t total_bytes, total_batches, failures;

static double now(void)
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

/* Each caller has its own pool, as each engine worker has its own blocks. */
static unsigned char **pools;

static void *caller(void *arg)
{
    unsigned char *pool = pools[(uintptr_t)arg];
    uint64_t seed = 12345 + (uint64_t)(uintptr_t)arg * 7919;
    uint64_t pages = a.size / a.bpp, slots = a.pool / a.bpp;
    struct kvp_pagefile_op ops[64];
    int64_t res[64];
    struct kvp_error err;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < a.batch; i++) {
            uint64_t page = rnd(&seed) % pages, slot;
            /* Distinct slots within a batch, as an engine's blocks are; a pool smaller than
             * a batch (--pool for fio-like hot buffers) reuses them. */
            for (;;) {
                slot = rnd(&seed) % slots;
                int dup = 0;
                for (int j = 0; j < i; j++)
                    dup |= ops[j].buf == pool + slot * a.bpp;
                if (!dup || slots < (uint64_t)a.batch)
                    break;
            }
            ops[i] = (struct kvp_pagefile_op){(int64_t)(page * a.bpp), pool + slot * a.bpp, a.bpp};
        }
        int rc = 0;
        if (map)
            for (int i = 0; i < a.batch; i++)
                memcpy(ops[i].buf, map + ops[i].offset, ops[i].size);
        else
            rc = a.write ? kvp_pagefile_write(pf, ops, (size_t)a.batch, res, &err)
                         : kvp_pagefile_read(pf, ops, (size_t)a.batch, res, &err);
        if (rc != 0) {
            fprintf(stderr, "bench_io: %s\n", err.msg);
            atomic_fetch_add(&failures, 1);
            break;
        }
        atomic_fetch_add_explicit(&total_bytes, a.bpp * (uint64_t)a.batch, memory_order_relaxed);
        atomic_fetch_add_explicit(&total_batches, 1, memory_order_relaxed);
    }
    return NULL;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    default:
        break;
    }
    return (uint64_t)v;
}

static int mmap_reads;

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--file"))
            a.file = v, i++;
        else if (!strcmp(k, "--size"))
            a.size = parse_size(v), i++;
        else if (!strcmp(k, "--bpp"))
            a.bpp = parse_size(v), i++;
        else if (!strcmp(k, "--pool"))
            a.pool = parse_size(v), i++;
        else if (!strcmp(k, "--chunk"))
            a.chunk = parse_size(v), i++;
        else if (!strcmp(k, "--rw"))
            a.write = !strcmp(v, "write"), i++;
        else if (!strcmp(k, "--direct"))
            a.direct = 1;
        else if (!strcmp(k, "--memcpy"))
            a.memcpy = 1;
        else if (!strcmp(k, "--mmap-reads"))
            mmap_reads = 1;
        else if (!strcmp(k, "--register"))
            a.reg = 1;
        else if (!strcmp(k, "--no-huge"))
            a.huge = 0;
        else if (!strcmp(k, "--warmup"))
            a.warmup = atof(v), i++;
        else if (!strcmp(k, "--threads"))
            a.threads = atoi(v), i++;
        else if (!strcmp(k, "--queues"))
            a.queues = atoi(v), i++;
        else if (!strcmp(k, "--batch"))
            a.batch = atoi(v), i++;
        else if (!strcmp(k, "--callers"))
            a.callers = atoi(v), i++;
        else if (!strcmp(k, "--seconds"))
            a.seconds = atof(v), i++;
        else if (!strcmp(k, "--backend")) {
            a.backend = !strcmp(v, "psync")   ? KVP_PAGEFILE_BACKEND_PSYNC
                        : !strcmp(v, "uring") ? KVP_PAGEFILE_BACKEND_URING
                                              : KVP_PAGEFILE_BACKEND_AUTO;
            i++;
        } else {
            fprintf(stderr, "bench_io: unknown argument %s\n", k);
            return 2;
        }
    }
    if (!a.file || a.batch < 1 || a.batch > 64 || a.callers < 1 || a.pool < a.bpp) {
        fprintf(stderr, "bench_io: --file required; batch 1..64; pool must hold a page\n");
        return 2;
    }
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.size = a.size;
    o.bytes_per_page = a.bpp;
    o.entries = (uint32_t)a.batch;
    o.flags = KVP_PAGEFILE_CREATE | KVP_PAGEFILE_ALIGNED | (a.direct ? KVP_PAGEFILE_DIRECT : 0) |
              (mmap_reads ? KVP_PAGEFILE_MMAP_READS : 0);
    o.backend = a.backend;
    o.threads = (uint32_t)a.threads;
    o.queues = (uint32_t)a.queues;
    o.chunk_bytes = a.chunk;
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    int rc = kvp_pagefile_open(a.file, &o, &pf, &err);
    if (rc != 0) {
        fprintf(stderr, "bench_io: open: %s\n", err.msg);
        return 1;
    }
    if (a.memcpy) {
        if (a.write || a.direct) {
            fprintf(stderr, "bench_io: --memcpy is the buffered-read ceiling only\n");
            return 2;
        }
        int fd = open(a.file, O_RDONLY);
        void *m =
            fd < 0 ? MAP_FAILED : mmap(NULL, a.size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "bench_io: cannot map %s\n", a.file);
            return 1;
        }
        close(fd);
        map = m;
    }
    pools = calloc((size_t)a.callers, sizeof *pools);
    for (int c = 0; c < a.callers; c++) {
        unsigned char *pool;
        /* 2 MiB alignment lets the kernel back the pool with huge pages when THP allows. */
        if (posix_memalign((void **)&pool, 2u << 20, a.pool) != 0) {
            fprintf(stderr, "bench_io: cannot allocate a pool of %llu bytes\n",
                    (unsigned long long)a.pool);
            return 1;
        }
        /* Engines' host pools are big pinned allocations; huge pages keep this VM's
         * per-4-KiB-page cost of first writes (see README) out of the figures. */
        if (a.huge)
            madvise(pool, a.pool, MADV_HUGEPAGE);
        /* Fault the pool in before timing, with distinct content per 4 KiB page so that no
         * same-page merging (KSM, in the guest or the host) can share the pages. */
        for (uint64_t off = 0; off < a.pool; off += 8)
            *(uint64_t *)(pool + off) = off * 0x9e3779b97f4a7c15ull;
        pools[c] = pool;
    }
    if (a.reg) {
        struct kvp_pagefile_buf *b = calloc((size_t)a.callers, sizeof *b);
        for (int c = 0; c < a.callers; c++)
            b[c] = (struct kvp_pagefile_buf){pools[c], a.pool};
        if (kvp_pagefile_register_buffers(pf, b, (size_t)a.callers, &err) != 0) {
            fprintf(stderr, "bench_io: register: %s\n", err.msg);
            return 1;
        }
        free(b);
    }
    pthread_t *tids = calloc((size_t)a.callers, sizeof *tids);
    for (int c = 0; c < a.callers; c++)
        pthread_create(&tids[c], NULL, caller, (void *)(uintptr_t)c);
    /* Warm up untimed (page tables, caches), then measure the counters' growth. */
    struct timespec w = {(time_t)a.warmup, (long)((a.warmup - (double)(time_t)a.warmup) * 1e9)};
    nanosleep(&w, NULL);
    double t0 = now();
    uint64_t bytes0 = atomic_load(&total_bytes), batches0 = atomic_load(&total_batches);
    struct timespec nap = {(time_t)a.seconds,
                           (long)((a.seconds - (double)(time_t)a.seconds) * 1e9)};
    nanosleep(&nap, NULL);
    uint64_t bytes = atomic_load(&total_bytes) - bytes0,
             batches = atomic_load(&total_batches) - batches0;
    double dt = now() - t0;
    atomic_store(&stop, 1);
    for (int c = 0; c < a.callers; c++)
        pthread_join(tids[c], NULL);
    printf("tool=kvpage rw=%s direct=%d bpp=%llu batch=%d callers=%d backend=%s threads=%u "
           "queues=%u registered=%d mmap_reads=%d batches=%llu seconds=%.2f gbps=%.3f "
           "us_per_batch=%.1f\n",
           a.write ? "write"
           : map   ? "memcpy"
                   : "read",
           a.direct, (unsigned long long)a.bpp, a.batch, a.callers,
           kvp_pagefile_backend_name(kvp_pagefile_backend(pf, a.write)), kvp_pagefile_threads(pf),
           kvp_pagefile_queues(pf), a.reg, mmap_reads, (unsigned long long)batches, dt,
           (double)bytes / dt / 1e9, batches ? dt * 1e6 / (double)batches * a.callers : 0.0);
    kvp_pagefile_close(pf);
    for (int c = 0; c < a.callers; c++)
        free(pools[c]);
    free(pools);
    free(tids);
    return atomic_load(&failures) ? 1 : 0;
}
