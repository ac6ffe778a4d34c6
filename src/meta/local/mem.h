/*
 * Memory for the metadata's big structures: the key entries, the key index
 * and the page tables.
 *
 * Taking fresh anonymous memory 4 KiB at a time is the costliest part of an
 * insertion on a paravirtualized machine (13.6 us a page fault on the
 * benchmark machine: a 64-key allocate + confirm paid 40% of its time in
 * faults). So these structures come in 2 MiB-aligned pieces marked for
 * transparent huge pages (one fault per 2 MiB where the kernel allows it,
 * still correct where it does not), and key entries are carved from such
 * pieces instead of the heap.
 */
#ifndef KVP_META_MEM_H
#define KVP_META_MEM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* Zeroed memory; at and above 2 MiB mapped on its own and marked for huge
 * pages. NULL when out of memory. Release with kvp__big_free(p, size). */
void *kvp__big_zalloc(size_t size);
void kvp__big_free(void *p, size_t size);
/* For memory from kvp__big_zalloc: nofork != 0 leaves it out of forked
 * children (MADV_DONTFORK; a no-op below 2 MiB, which is on the heap), so
 * writes to it after a fork copy nothing; 0 puts it back. The snapshot child
 * reads neither the key index nor the unused pieces. */
void kvp__big_nofork(void *p, size_t size, int nofork);
/* Marks an existing mapping for huge pages (a hint; errors are ignored). */
void kvp__big_hint(void *p, size_t size);
/* Backs memory from kvp__big_zalloc now (it stays zero), so that writing it
 * later takes no page fault: for a copy made while requests wait. */
void kvp__big_prefault(void *p, size_t size);

/*
 * Backing memory ahead of use. Backing fresh memory costs milliseconds per
 * 2 MiB here (the hypervisor backs the guest's memory on first touch): a
 * stall that every request behind it waits for. A background thread, started
 * on first use, keeps a few 2 MiB pieces touched and ready for the slabs, and
 * populates ranges on request (MADV_POPULATE_WRITE: backs the memory without
 * changing a byte, so the range may be in use meanwhile).
 */
#define KVP_POOL_PIECES 4
#define KVP_PIECE_SIZE ((size_t)2 << 20)

enum { KVP_POPULATE_IDLE = 0, KVP_POPULATE_QUEUED, KVP_POPULATE_DONE };

struct kvp__populate {
    void *addr;
    size_t len;
    size_t off;        /* backed so far (the background thread's) */
    _Atomic int state; /* KVP_POPULATE_* */
    struct kvp__populate *next;
};

struct kvp__mempool {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    void *ready[KVP_POOL_PIECES];
    unsigned n;
    int started, stop;
    struct kvp__populate *jobs; /* queued, newest first */
    pthread_t thread;
};

void kvp__mempool_init(struct kvp__mempool *p);
/* A zeroed, 2 MiB-aligned piece of KVP_PIECE_SIZE bytes (free it with
 * kvp__big_free), taken ready when there is one; NULL when out of memory. */
void *kvp__mempool_take(struct kvp__mempool *p);
/* Queues job (addr, len set by the caller; it must stay valid until its state
 * is DONE or the pool is destroyed). Returns 0, or -EBUSY when the job is
 * still queued. A job on a stopped pool is DONE at once. */
int kvp__mempool_populate(struct kvp__mempool *p, struct kvp__populate *job);
/* Stops the thread (queued jobs are dropped) and unmaps the pieces not taken. */
void kvp__mempool_destroy(struct kvp__mempool *p);

/*
 * A slab of small objects of any size up to KVP_SLAB_MAX bytes, rounded up to
 * 8; bigger ones go to malloc. Freed objects are kept per size for reuse;
 * memory returns to the system only with kvp__slab_destroy. Not thread-safe
 * (a namespace's slab is used under its lock).
 */
#define KVP_SLAB_MAX 2048
#define KVP_SLAB_CLASSES (KVP_SLAB_MAX / 8)

struct kvp__slab {
    void *free[KVP_SLAB_CLASSES + 1]; /* per size class (size / 8): freed objects */
    char *cur, *end;                  /* the unused part of the newest chunk */
    void *chunks;                     /* every chunk, newest first */
    size_t next_chunk;                /* size of the next chunk */
    struct kvp__mempool *pool;        /* where chunks of KVP_PIECE_SIZE come from, or NULL */
};

void *kvp__slab_alloc(struct kvp__slab *s, size_t size);
void kvp__slab_free(struct kvp__slab *s, void *p, size_t size);
void kvp__slab_destroy(struct kvp__slab *s);

#endif
