/*
 * gapshim.c — where a Python caller's time goes between two page-file batches.
 *
 * A library to load in place of libkvpage.so (KVPAGE_LIB=gapshim.so; it
 * needs libkvpage.so and passes every other symbol through to it). Its
 * kvp_pagefile_read calls the real one and counts, per thread, the time
 * from the return of one call to the entry of the next (the gap: what the
 * caller spends outside the library) and the time inside. gaps.py drives it.
 *
 * build: cc -O2 -shared -fPIC -Iinclude bench/python/gapshim.c -Wl,--no-as-needed \
 *          -Lbuild -lkvpage -ldl -Wl,-rpath,$PWD/build -o gapshim.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include <kvpage/pagefile.h>

typedef int (*read_fn)(struct kvp_pagefile *, const struct kvp_pagefile_op *, size_t, int64_t *,
                       struct kvp_error *);

static read_fn real_read;
static _Thread_local uint64_t last_exit;
static atomic_uint_fast64_t gap_ns, gaps, inside_ns, calls;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* libkvpage's own kvp_pagefile_read, found once when the shim is loaded. */
__attribute__((constructor)) static void find_real_read(void)
{
    real_read = (read_fn)dlsym(RTLD_NEXT, "kvp_pagefile_read");
}

int kvp_pagefile_read(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                      int64_t *results, struct kvp_error *err)
{
    uint64_t in = now_ns();
    /* A gap over 1 ms is the caller doing something else (a new round). */
    if (last_exit && in - last_exit < 1000000) {
        atomic_fetch_add(&gap_ns, in - last_exit);
        atomic_fetch_add(&gaps, 1);
    }
    int rc = real_read(pf, ops, n, results, err);
    last_exit = now_ns();
    atomic_fetch_add(&inside_ns, last_exit - in);
    atomic_fetch_add(&calls, 1);
    return rc;
}

/* Mean gap and mean time inside since the last call, in ns; then starts over. */
void kvpb_gaps(double *gap, double *inside)
{
    uint64_t g = atomic_exchange(&gaps, 0), c = atomic_exchange(&calls, 0);
    uint64_t gn = atomic_exchange(&gap_ns, 0), in = atomic_exchange(&inside_ns, 0);
    *gap = g ? (double)gn / (double)g : 0;
    *inside = c ? (double)in / (double)c : 0;
}
