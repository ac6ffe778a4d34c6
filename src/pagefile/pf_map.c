/*
 * pf_map.c — KVP_PAGEFILE_MMAP_READS: buffered reads copied out of a shared
 * read-only mapping of the file with streaming stores.
 *
 * pread copies out of the page cache in the kernel (rep movsb here), whose
 * stores first read every destination line into the cache. An engine's host
 * pool is cold memory, so that costs a third more memory traffic, and more
 * cache misses: into cold slots of a 1 GiB pool, two threads moved 8 GB/s
 * with pread and 15 GB/s with non-temporal stores from a mapping
 * (bench/README.md, "Issue 14 — reads out of a mapping"). The copy is
 * done only for ranges that mincore says are in the page cache; the others
 * take pread, so a page missing from memory costs one read from the device
 * as before.
 *
 * What the caller accepts with the flag (pagefile.h): a page evicted between
 * the check and the copy is read back by a page fault, and if the device
 * then fails, or someone else truncates the file, the process gets SIGBUS
 * where pread would have returned an error.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "pagefile/pf_internal.h"

static atomic_uint_fast64_t pf_map_copies;

uint64_t kvp__pf_map_copies(void)
{
    return atomic_load_explicit(&pf_map_copies, memory_order_relaxed);
}

int kvp__pf_map_open(struct kvp_pagefile *pf)
{
    void *m = mmap(NULL, (size_t)pf->size, PROT_READ, MAP_SHARED, pf->fd, 0);
    if (m == MAP_FAILED)
        return -errno;
    pf->map = m;
    long pg = sysconf(_SC_PAGESIZE);
    pf->map_page = pg > 0 ? (uint64_t)pg : 4096;
    return 0;
}

void kvp__pf_map_close(struct kvp_pagefile *pf)
{
    if (pf->map)
        munmap(pf->map, (size_t)pf->size);
    pf->map = NULL;
}

/* 1 when every page of [off, off + len) is in the page cache. */
static int pf_resident(const char *map, uint64_t pg, int64_t off, uint64_t len)
{
    uint64_t start = (uint64_t)off / pg * pg, end = (uint64_t)off + len;
    unsigned char vec[1024];
    while (start < end) {
        uint64_t span = end - start;
        if (span > sizeof vec * pg)
            span = sizeof vec * pg;
        if (mincore((void *)(map + start), (size_t)span, vec) != 0)
            return 0;
        for (uint64_t i = 0, n = (span + pg - 1) / pg; i < n; i++)
            if (!(vec[i] & 1))
                return 0;
        start += span;
    }
    return 1;
}

/* memcpy with stores that bypass the caches, for destinations not read soon. */
static void pf_stream_copy(char *dst, const char *src, uint64_t len)
{
#if defined(__x86_64__)
    if (len >= 4096) {
        size_t head = (size_t)(-(uintptr_t)dst & 63);
        memcpy(dst, src, head);
        dst += head, src += head, len -= head;
        for (; len >= 64; dst += 64, src += 64, len -= 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
        /* Streaming stores are weakly ordered: make them visible before the
         * result that says the bytes are there. */
        _mm_sfence();
    }
#endif
    memcpy(dst, src, len);
}

int64_t kvp__pf_map_read(const struct kvp_pagefile *pf, int write, void *buf, uint64_t len,
                         int64_t off)
{
    (void)write; /* the read strategy only: writes always take the plain transfer */
    /* Under fault injection every read takes pread, where the hook applies. */
    if (len == 0 || kvp__pf_fault_on() || !pf_resident(pf->map, pf->map_page, off, len))
        return kvp__pf_pio(pf->fd, 0, buf, len, off);
    pf_stream_copy(buf, pf->map + off, len);
    atomic_fetch_add_explicit(&pf_map_copies, 1, memory_order_relaxed);
    return (int64_t)len;
}
