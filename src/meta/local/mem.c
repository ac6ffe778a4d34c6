/*
 * Huge-page friendly memory for the metadata (see mem.h for why).
 */
#include "meta/local/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE_SIZE KVP_PIECE_SIZE
#define FIRST_CHUNK ((size_t)64 << 10) /* chunks double from here up to a piece */

static size_t huge_round(size_t n)
{
    return (n + HUGE_SIZE - 1) & ~(HUGE_SIZE - 1);
}

void *kvp__big_zalloc(size_t size)
{
    if (size < HUGE_SIZE)
        return calloc(1, size);
    size_t len = huge_round(size);
    /* Map one huge page more than needed and trim to a 2 MiB boundary:
     * only aligned 2 MiB ranges can be huge pages. */
    char *p =
        mmap(NULL, len + HUGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_SIZE - 1) & ~(uintptr_t)(HUGE_SIZE - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    munmap(a + len, (size_t)(p + len + HUGE_SIZE - (a + len)));
    kvp__big_hint(a, len);
    return a;
}

void kvp__big_free(void *p, size_t size)
{
    if (!p)
        return;
    if (size < HUGE_SIZE)
        free(p);
    else
        munmap(p, huge_round(size));
}

void kvp__big_nofork(void *p, size_t size, int nofork)
{
    if (p && size >= HUGE_SIZE)
        (void)madvise(p, huge_round(size), nofork ? MADV_DONTFORK : MADV_DOFORK);
}

void kvp__big_hint(void *p, size_t size)
{
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_SIZE)
        (void)madvise(p, size, MADV_HUGEPAGE);
#else
    (void)p, (void)size;
#endif
}

void kvp__big_prefault(void *p, size_t size)
{
    if (!p || size < HUGE_SIZE)
        return; /* from calloc: small, and faulted soon enough */
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, huge_round(size), MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (size_t i = 0; i < size; i += 4096) /* an older kernel: one write a page */
        ((volatile char *)p)[i] = 0;
}

/* ---------------------------------------------------------------- pool */

static void *piece_new(void)
{
    char *p = kvp__big_zalloc(KVP_PIECE_SIZE);
    if (p) { /* one write a 4 KiB page: the whole piece is backed now */
        for (size_t i = 0; i < KVP_PIECE_SIZE; i += 4096)
            ((volatile char *)p)[i] = 0;
        kvp__big_nofork(p, KVP_PIECE_SIZE, 1); /* unused: no copy-on-write after a fork */
    }
    return p;
}

/*
 * Backs the next slice of a job; 1 when the job is complete. One slice at a
 * time because the call holds the process's mmap lock, which an mmap or
 * munmap of a request thread waits for: 2 MiB bounds that wait to the time
 * of backing 2 MiB, where 64 MiB in one call made a request wait 200 ms.
 */
static int populate_slice(struct kvp__populate *job)
{
    size_t n = job->len - job->off < KVP_PIECE_SIZE ? job->len - job->off : KVP_PIECE_SIZE;
#ifdef MADV_POPULATE_WRITE
    /* Page-aligned start; errors (an old kernel, a range since unmapped) only
     * mean the memory is backed later, on first touch. */
    uintptr_t s = (uintptr_t)job->addr + job->off, a = s & ~(uintptr_t)4095;
    (void)madvise((void *)a, n + (s - a), MADV_POPULATE_WRITE);
#endif
    job->off += n;
    return job->off >= job->len;
}

static void *filler(void *arg)
{
    pthread_setname_np(pthread_self(), "kvp-prefault"); /* for top and perf */
    struct kvp__mempool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        if (p->jobs && p->n == KVP_POOL_PIECES) { /* pieces first: takers wait for them */
            struct kvp__populate *job = p->jobs;
            pthread_mutex_unlock(&p->lock);
            int done = populate_slice(job);
            pthread_mutex_lock(&p->lock);
            if (done) { /* jobs are only added at the head */
                struct kvp__populate **pp = &p->jobs;
                while (*pp != job)
                    pp = &(*pp)->next;
                *pp = job->next;
                atomic_store(&job->state, KVP_POPULATE_DONE);
            }
            continue;
        }
        if (p->n == KVP_POOL_PIECES) {
            pthread_cond_wait(&p->wake, &p->lock);
            continue;
        }
        pthread_mutex_unlock(&p->lock);
        void *piece = piece_new();
        pthread_mutex_lock(&p->lock);
        if (!piece) { /* out of memory: takers map their own and fail there */
            pthread_cond_wait(&p->wake, &p->lock);
            continue;
        }
        if (p->n < KVP_POOL_PIECES)
            p->ready[p->n++] = piece;
        else
            kvp__big_free(piece, KVP_PIECE_SIZE);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void kvp__mempool_init(struct kvp__mempool *p)
{
    *p = (struct kvp__mempool){0};
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
}

/* Under p->lock: starts the thread on first use. 0 when it runs. */
static int start_locked(struct kvp__mempool *p)
{
    if (!p->started && !p->stop)
        p->started = pthread_create(&p->thread, NULL, filler, p) == 0 ? 1 : -1;
    return p->started == 1 && !p->stop ? 0 : -1;
}

int kvp__mempool_populate(struct kvp__mempool *p, struct kvp__populate *job)
{
    if (atomic_load(&job->state) == KVP_POPULATE_QUEUED)
        return -EBUSY;
    pthread_mutex_lock(&p->lock);
    if (start_locked(p) != 0) {
        atomic_store(&job->state, KVP_POPULATE_DONE);
    } else {
        atomic_store(&job->state, KVP_POPULATE_QUEUED);
        job->off = 0;
        job->next = p->jobs;
        p->jobs = job;
        pthread_cond_signal(&p->wake);
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void *kvp__mempool_take(struct kvp__mempool *p)
{
    void *piece = NULL;
    pthread_mutex_lock(&p->lock);
    start_locked(p);
    if (p->n)
        piece = p->ready[--p->n];
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (!piece)
        return kvp__big_zalloc(KVP_PIECE_SIZE);
    kvp__big_nofork(piece, KVP_PIECE_SIZE, 0); /* in use from now on: a snapshot reads it */
    return piece;
}

void kvp__mempool_destroy(struct kvp__mempool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (p->started == 1)
        pthread_join(p->thread, NULL);
    for (struct kvp__populate *job = p->jobs; job; job = job->next)
        atomic_store(&job->state, KVP_POPULATE_DONE);
    p->jobs = NULL;
    while (p->n)
        kvp__big_free(p->ready[--p->n], KVP_PIECE_SIZE);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
}

/* ---------------------------------------------------------------- slab */

struct chunk {
    struct chunk *next;
    size_t size;
};

void *kvp__slab_alloc(struct kvp__slab *s, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    if (size > KVP_SLAB_MAX)
        return malloc(size);
    void **fl = &s->free[size / 8];
    void *p = *fl;
    if (p) {
        UNPOISON(p, size);
        *fl = *(void **)p;
        return p;
    }
    if ((size_t)(s->end - s->cur) < size) {
        size_t len = s->next_chunk ? s->next_chunk : FIRST_CHUNK;
        struct chunk *c =
            len == KVP_PIECE_SIZE && s->pool ? kvp__mempool_take(s->pool) : kvp__big_zalloc(len);
        if (!c)
            return NULL;
        c->next = s->chunks;
        c->size = len;
        s->chunks = c;
        s->cur = (char *)(c + 1);
        s->end = (char *)c + len;
        POISON(s->cur, (size_t)(s->end - s->cur));
        if (len < KVP_PIECE_SIZE)
            s->next_chunk = len * 2;
    }
    p = s->cur;
    s->cur += size;
    UNPOISON(p, size);
    return p;
}

void kvp__slab_free(struct kvp__slab *s, void *p, size_t size)
{
    if (!p)
        return;
    size = (size + 7) & ~(size_t)7;
    if (size > KVP_SLAB_MAX) {
        free(p);
        return;
    }
    void **fl = &s->free[size / 8];
    *(void **)p = *fl;
    *fl = p;
    POISON((char *)p + sizeof(void *), size - sizeof(void *));
}

void kvp__slab_destroy(struct kvp__slab *s)
{
    struct chunk *c = s->chunks, *nx;
    for (; c; c = nx) {
        nx = c->next;
        UNPOISON(c, c->size);
        kvp__big_free(c, c->size);
    }
    struct kvp__mempool *pool = s->pool;
    *s = (struct kvp__slab){0};
    s->pool = pool;
}
