/*
 * bench/io/tags_cpu.c — issue 36 §1: the CPU cost of integrity tags,
 * measured so that other programs' load cannot blur it. One thread moves
 * random batches of 8 pages between a host pool and a page file in the
 * page cache through two handles of the same file, one with tags and one
 * without (KVP_PAGEFILE_NO_TAGS), alternating every batch; it counts the
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per handle. With threads = 1
 * and batches of 8 the psync backend runs every op on the calling thread,
 * so that thread's CPU time is the whole cost. A buffered copy out of (or
 * into) the page cache is CPU-bound: CPU seconds per byte off ÷ on is the
 * throughput ratio an otherwise idle core would see.
 *
 *   cc -O2 -Iinclude bench/io/tags_cpu.c -Lbuild -lkvpage -Wl,-rpath,build -o /tmp/tags_cpu
 *   /tmp/tags_cpu FILE PAGE_SIZE read|write SECONDS [psync|uring|usrbio [direct]]
 * Prints: page, op, GB per CPU second with tags and without, ratio on/off,
 * and the ratio of the wall-clock times (off / on: blurred by other load,
 * but it shows time spent waiting, which CPU time does not).
 *
 * The calling thread is not the whole cost with a backend named (psync
 * with its default threads, uring, usrbio: FILE on the emulation's mount,
 * KVPAGE_USRBIO_LIB set, each handle's pool its own kvp_pagefile_alloc
 * memory, registered: zero-copy); so it also prints the process's CPU time per
 * byte (every thread's, the emulated daemon's too: the batches run one at a
 * time) and the ratio of the batches' quartile wall-clock times (the
 * fastest quarter of each side: the batches that ran with the cores free,
 * the closest a loaded machine gets to a quiet one's figure).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpage/pagefile.h"

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double wall_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double proc_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int backend = -1, direct; /* -1: psync with threads = 1 */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static struct kvp_pagefile *open_pf(const char *path, uint64_t size, uint64_t page, int tags)
{
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.size = size;
    o.bytes_per_page = page;
    o.entries = 8;
    o.threads = backend < 0 ? 1 : 0;
    o.backend = backend < 0 ? KVP_PAGEFILE_BACKEND_PSYNC : backend;
    o.flags = KVP_PAGEFILE_CREATE | (tags ? 0 : KVP_PAGEFILE_NO_TAGS) |
              (direct ? KVP_PAGEFILE_DIRECT | KVP_PAGEFILE_ALIGNED : 0);
    struct kvp_pagefile *pf = NULL;
    struct kvp_error err = {0};
    if (kvp_pagefile_open(path, &o, &pf, &err)) {
        fprintf(stderr, "open %s: %s\n", path, err.msg);
        exit(1);
    }
    return pf;
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 7) {
        fprintf(stderr, "usage: tags_cpu FILE PAGE_SIZE_KIB read|write SECONDS "
                        "[psync|uring|usrbio [direct]]\n");
        return 2;
    }
    if (argc > 5)
        backend = !strcmp(argv[5], "uring")    ? KVP_PAGEFILE_BACKEND_URING
                  : !strcmp(argv[5], "usrbio") ? KVP_PAGEFILE_BACKEND_USRBIO
                                               : KVP_PAGEFILE_BACKEND_PSYNC;
    direct = argc > 6 && !strcmp(argv[6], "direct");
    const uint64_t page = strtoull(argv[2], NULL, 10) << 10, size = 512ull << 20;
    const uint64_t pool = 256ull << 20, pages = size / page, slots = pool / page;
    const int write = !strcmp(argv[3], "write");
    const double seconds = atof(argv[4]);
    /* a new file each run: a sidecar keeps the slot size it was made with */
    char tags[4096];
    snprintf(tags, sizeof tags, "%s.tags", argv[1]);
    unlink(argv[1]);
    unlink(tags);
    struct kvp_pagefile *pf[2] = {open_pf(argv[1], size, page, 1), open_pf(argv[1], size, page, 0)};
    struct kvp_pagefile *tmp = pf[0]; /* [0] without tags, [1] with, as below */
    pf[0] = pf[1];
    pf[1] = tmp;
    unsigned char *bufs[2], *buf;
    for (int t = 0; t < 2; t++) {
        struct kvp_error err = {0};
        bufs[t] = backend == KVP_PAGEFILE_BACKEND_USRBIO ? kvp_pagefile_alloc(pf[t], pool, &err)
                                                         : aligned_alloc(2u << 20, pool);
        struct kvp_pagefile_buf reg = {bufs[t], pool};
        if (!bufs[t] || (backend == KVP_PAGEFILE_BACKEND_USRBIO &&
                         kvp_pagefile_register_buffers(pf[t], &reg, 1, &err))) {
            fprintf(stderr, "pool: %s\n", err.msg);
            return 1;
        }
        for (uint64_t i = 0; i < pool; i += 8)
            memcpy(bufs[t] + i, &(uint64_t){i * 0x9e3779b97f4a7c15ull}, 8);
    }
    buf = bufs[1];
    /* every page written through the tagged handle: reads verify a tag */
    for (uint64_t p = 0; p < pages; p++) {
        struct kvp_pagefile_op op = {(int64_t)(p * page), buf + (p % slots) * page, page};
        int64_t r;
        struct kvp_error err = {0};
        if (kvp_pagefile_write(pf[1], &op, 1, &r, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    }
    double cpu[2] = {0, 0}, wall[2] = {0, 0}, proc[2] = {0, 0};
    size_t nlat[2] = {0, 0}, cap = 1u << 20;
    double *lat[2] = {malloc(cap * sizeof(double)), malloc(cap * sizeof(double))};
    uint64_t bytes[2] = {0, 0}, seed = 1;
    struct kvp_pagefile_op ops[8];
    int64_t res[8];
    for (double start = cpu_now(); cpu_now() - start < seconds;) {
        for (int t = 0; t < 2; t++) {
            for (int i = 0; i < 8; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                /* distinct buffers in a batch: ops in flight at once never share one */
                uint64_t p = (seed >> 20) % pages, s = ((seed >> 40) % (slots / 8)) * 8 + i;
                ops[i] = (struct kvp_pagefile_op){(int64_t)(p * page), bufs[t] + s * page, page};
            }
            struct kvp_error err = {0};
            double c0 = cpu_now(), w0 = wall_now(), p0 = proc_now();
            int rc = write ? kvp_pagefile_write(pf[t], ops, 8, res, &err)
                           : kvp_pagefile_read(pf[t], ops, 8, res, &err);
            cpu[t] += cpu_now() - c0;
            proc[t] += proc_now() - p0;
            double w = wall_now() - w0;
            wall[t] += w;
            if (nlat[t] < cap)
                lat[t][nlat[t]++] = w;
            bytes[t] += 8 * page;
            if (rc) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        }
    }
    double on = (double)bytes[1] / cpu[1] / 1e9, off = (double)bytes[0] / cpu[0] / 1e9;
    struct kvp_pagefile_info in = {.info_size = sizeof in};
    kvp_pagefile_info(pf[1], &in);
    printf("page=%s op=%s on_gb_per_cpu_s=%.2f off_gb_per_cpu_s=%.2f ratio=%.3f verified=%llu "
           "wall_ratio=%.3f\n",
           argv[2], argv[3], on, off, on / off, (unsigned long long)in.tags_verified,
           wall[0] / wall[1]);
    {
        qsort(lat[0], nlat[0], sizeof(double), cmp_double);
        qsort(lat[1], nlat[1], sizeof(double), cmp_double);
        printf("  backend=%s%s proc_cpu_ratio=%.3f q25_wall_ratio=%.3f (off %.0f us, on %.0f us "
               "a batch) batches=%zu\n",
               backend >= 0 ? argv[5] : "psync(threads=1)", direct ? " direct" : "",
               (proc[0] / bytes[0]) / (proc[1] / bytes[1]),
               lat[0][nlat[0] / 4] / lat[1][nlat[1] / 4], lat[0][nlat[0] / 4] * 1e6,
               lat[1][nlat[1] / 4] * 1e6, nlat[1]);
    }
    for (int t = 0; t < 2; t++) {
        if (backend == KVP_PAGEFILE_BACKEND_USRBIO)
            kvp_pagefile_free(pf[t], bufs[t]);
        else
            free(bufs[t]);
        free(lat[t]);
    }
    kvp_pagefile_close(pf[0]);
    kvp_pagefile_close(pf[1]);
    unlink(argv[1]);
    unlink(tags);
    return 0;
}
