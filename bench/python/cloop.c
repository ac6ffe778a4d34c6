/*
 * bench/python/cloop.c — bench_io's caller loop as a function, for
 * compat_bench.py to run in its own process, on its own page file handle and
 * host pool, taking turns with the Python client (and a round of
 * `kvpage bench store` as one, for store_bench.py): the C side of a ratio then
 * sees the same machine, memory and file as the Python side, within the same
 * second (this machine's speed drifts by tens of percent from one minute to
 * the next, so two processes run apart do not measure one thing).
 *
 * Built by run.sh against the build tree's libkvpage.so:
 *   cc -O2 -shared -fPIC -Iinclude bench/python/cloop.c -Lbuild -lkvpage -o DIR/cloop.so
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvpage/pagefile.h"
#include "kvpage/store.h"

static uint64_t rnd(uint64_t *s) /* splitmix64, as bench_io */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/*
 * Random batches of `batch` pages (distinct slots of pool, random pages of
 * the file) for `seconds`, as bench_io's caller. Returns the batches done,
 * or -1 when one failed. *seed carries the generator from call to call.
 */
int64_t kvpb_loop(struct kvp_pagefile *pf, int write, unsigned char *pool, uint64_t pool_bytes,
                  uint64_t bpp, int batch, double seconds, uint64_t *seed)
{
    uint64_t pages = kvp_pagefile_size(pf) / bpp, slots = pool_bytes / bpp;
    struct kvp_pagefile_op ops[64];
    int64_t res[64];
    struct kvp_error err;
    if (batch < 1 || batch > 64 || !pages || !slots)
        return -1;
    int64_t n = 0;
    double end = now() + seconds;
    do {
        for (int i = 0; i < batch; i++) {
            uint64_t page = rnd(seed) % pages, slot;
            for (;;) {
                slot = rnd(seed) % slots;
                int dup = 0;
                for (int j = 0; j < i; j++)
                    dup |= ops[j].buf == pool + slot * bpp;
                if (!dup || slots < (uint64_t)batch)
                    break;
            }
            ops[i] = (struct kvp_pagefile_op){(int64_t)(page * bpp), pool + slot * bpp, bpp};
        }
        int rc = write ? kvp_pagefile_write(pf, ops, (size_t)batch, res, &err)
                       : kvp_pagefile_read(pf, ops, (size_t)batch, res, &err);
        if (rc != 0)
            return -1;
        n++;
    } while (now() < end);
    return n;
}

/*
 * One round of `kvpage bench store`: put `batch` new keys (named after tag)
 * from src, get them back into dst; adds the seconds of each to *t_put and
 * *t_get; with recycle, deletes the keys after (untimed), so that the next
 * round writes the same pages again. Returns 0, or -1 when a key was not
 * stored or not read in full.
 */
int kvpb_store_round(struct kvp_store *s, unsigned char *src, unsigned char *dst, uint64_t bpp,
                     int batch, uint64_t tag, int recycle, double *t_put, double *t_get)
{
    enum { MAX = 1024 };
    static _Thread_local char names[MAX][48];
    static _Thread_local struct kvp_str keys[MAX];
    static _Thread_local struct kvp_store_buf w[MAX], r[MAX];
    static _Thread_local int64_t res[MAX];
    struct kvp_error err;
    if (batch < 1 || batch > MAX)
        return -1;
    for (int i = 0; i < batch; i++) {
        int len = snprintf(names[i], sizeof names[i], "c-%llu-%d", (unsigned long long)tag, i);
        keys[i] = (struct kvp_str){names[i], (size_t)len};
        w[i] = (struct kvp_store_buf){src + (uint64_t)i * bpp, bpp};
        r[i] = (struct kvp_store_buf){dst + (uint64_t)i * bpp, bpp};
    }
    double t0 = now();
    int rc = kvp_store_put(s, keys, w, (size_t)batch, res, &err);
    double t1 = now();
    int64_t lead = kvp_store_get(s, keys, r, (size_t)batch, res, &err);
    double t2 = now();
    *t_put += t1 - t0;
    *t_get += t2 - t1;
    int ok = rc == 0 && lead == batch && !memcmp(src, dst, (size_t)batch * bpp);
    if (recycle && kvp_store_delete(s, keys, (size_t)batch, &err) != 0)
        ok = 0;
    return ok ? 0 : -1;
}
