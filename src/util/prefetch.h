/* Cache prefetches the compiler keeps. */
#ifndef KVP_UTIL_PREFETCH_H
#define KVP_UTIL_PREFETCH_H

/*
 * To GCC (12 at least), a function whose only effects are
 * __builtin_prefetch calls has no effect at all: the calls to it are
 * dropped as dead code, before it could be inlined. Ending such a function
 * with kvp__prefetched() gives it an effect the compiler must keep (an
 * empty volatile asm: no instruction, no clobber). Without it, a batch
 * prefetch of the key index's lookups compiled to nothing for a week
 * unnoticed (bench/README.md, "Evictions prefetched").
 */
static inline void kvp__prefetched(void)
{
    __asm__ volatile("");
}

#endif
