/*
 * kvpage serve: the per-request arena of jansson's blocks.
 *
 * jansson allocates two blocks per string and frees them all at the end of
 * the request: with 1,024-key bodies malloc/free were a quarter of the CPU.
 * While a request is handled, its thread's jansson blocks come from a bump
 * arena that is reset afterwards; frees of arena blocks do nothing. Blocks
 * outside a request, or beyond the arena, are plain malloc. Every jansson
 * value of a request is created and released by the thread handling it
 * (kvp__server_handle releases the body before returning), so a block is
 * never freed by another thread. Not under AddressSanitizer, which must see
 * every block.
 */
#include <jansson.h>
#include <stdlib.h>

#include "server/serve_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVP_JSON_ARENA 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVP_JSON_ARENA 0
#endif
#endif
#ifndef KVP_JSON_ARENA
#define KVP_JSON_ARENA 1
#endif

#define ARENA_MIN ((size_t)1 << 20)
#define ARENA_MAX ((size_t)32 << 20)

struct arena {
    char *base;
    size_t used, cap;
    size_t want; /* bytes the last request asked for, arena or not */
    int active;
    int spilled; /* a block of this request came from malloc */
};
static _Thread_local struct arena t_arena;

static void *arena_malloc(size_t n)
{
    struct arena *a = &t_arena;
    if (a->active) {
        size_t need = (n + 15) & ~(size_t)15;
        a->want += need;
        if (need >= n && a->cap - a->used >= need) {
            void *p = a->base + a->used;
            a->used += need;
            return p;
        }
        a->spilled = 1;
    }
    return malloc(n);
}

/* Every JSON block of the request in progress is in the arena: releasing
 * them one by one would only walk the values (the reset reclaims them). */
int kvp__arena_holds_all(void)
{
    return t_arena.active && !t_arena.spilled;
}

static void arena_free(void *p)
{
    struct arena *a = &t_arena;
    if (p && a->base && (char *)p >= a->base && (char *)p < a->base + a->cap)
        return;
    free(p);
}

void kvp__arena_begin(void)
{
    struct arena *a = &t_arena;
    if (!KVP_JSON_ARENA)
        return;
    /* Grow to what the last request needed (bounded), between requests only. */
    size_t cap = a->cap ? a->cap : ARENA_MIN;
    while (cap < a->want && cap < ARENA_MAX)
        cap *= 2;
    if (cap != a->cap) {
        char *nb = malloc(cap);
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = cap;
        }
    }
    a->used = 0;
    a->want = 0;
    a->spilled = 0;
    a->active = a->base != NULL;
}

void kvp__arena_end(void)
{
    t_arena.active = 0;
    t_arena.used = 0;
}

int kvp__arena_install(void)
{
    if (KVP_JSON_ARENA)
        json_set_alloc_funcs(arena_malloc, arena_free);
    return KVP_JSON_ARENA;
}
