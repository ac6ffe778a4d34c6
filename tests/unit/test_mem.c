/* Unit tests of src/meta/local/mem.c: big allocations, the slab, the background pool. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "meta/local/mem.h"

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void test_big(void)
{
    size_t sizes[] = {
        8, 4096, KVP_PIECE_SIZE - 8, KVP_PIECE_SIZE, KVP_PIECE_SIZE + 1, 3 * KVP_PIECE_SIZE + 100};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = kvp__big_zalloc(sizes[i]);
        CHECK(p != NULL);
        if (!p)
            continue;
        CHECK(all_zero(p, sizes[i]));
        if (sizes[i] >= KVP_PIECE_SIZE) /* mapped on its own, on a huge-page boundary */
            CHECK_EQ((uintptr_t)p % KVP_PIECE_SIZE, 0);
        memset(p, 0xab, sizes[i]); /* all of it is writable (ASan checks the small ones) */
        kvp__big_free(p, sizes[i]);
    }
    kvp__big_free(NULL, 123);
}

/* Fills object i of size n with a pattern derived from i. */
static void fill(unsigned char *p, size_t n, size_t i)
{
    for (size_t j = 0; j < n; j++)
        p[j] = (unsigned char)(i * 31 + j);
}

static int intact(const unsigned char *p, size_t n, size_t i)
{
    for (size_t j = 0; j < n; j++)
        if (p[j] != (unsigned char)(i * 31 + j))
            return 0;
    return 1;
}

static void test_slab(struct kvp__mempool *pool)
{
    struct kvp__slab s = {0};
    s.pool = pool;
    /* Enough objects of mixed sizes to pass through every chunk size up to
     * pieces (64 KiB doubling to 2 MiB, then 2 MiB pieces). */
    enum { N = 60000 };
    static unsigned char *obj[N];
    static size_t size[N];
    for (size_t i = 0; i < N; i++) {
        size[i] = 1 + (i * 7919) % 300;
        if (i % 1000 == 0)
            size[i] = KVP_SLAB_MAX + 1 + i % 50; /* malloc's */
        obj[i] = kvp__slab_alloc(&s, size[i]);
        CHECK(obj[i] != NULL);
        CHECK_EQ((uintptr_t)obj[i] % 8, 0);
        fill(obj[i], size[i], i);
    }
    int bad = 0;
    for (size_t i = 0; i < N; i++)
        bad += !intact(obj[i], size[i], i);
    CHECK_EQ(bad, 0); /* no two objects overlap */
    /* Freed objects are reused for the same size, newest first. */
    unsigned char *a = obj[10], *b = obj[20];
    size_t sa = size[10];
    kvp__slab_free(&s, a, sa);
    CHECK(kvp__slab_alloc(&s, sa) == a);
    kvp__slab_free(&s, a, sa);
    kvp__slab_free(&s, b, size[20]);
    if (((size[20] + 7) & ~(size_t)7) != ((sa + 7) & ~(size_t)7))
        CHECK(kvp__slab_alloc(&s, sa) == a);
    else
        CHECK(kvp__slab_alloc(&s, sa) == b);
    for (size_t i = 100; i < N; i++)
        kvp__slab_free(&s, obj[i], size[i]);
    bad = 0;
    for (size_t i = 0; i < 100; i++)
        bad += i != 10 && i != 20 && !intact(obj[i], size[i], i);
    CHECK_EQ(bad, 0);                    /* freeing others leaves these alone */
    kvp__slab_free(&s, obj[0], size[0]); /* a malloc'd one (i % 1000 == 0) */
    kvp__slab_destroy(&s);
    CHECK(s.chunks == NULL);
    CHECK(s.pool == pool); /* the slab stays usable */
    void *again = kvp__slab_alloc(&s, 40);
    CHECK(again != NULL);
    kvp__slab_destroy(&s);
}

static void wait_done(struct kvp__populate *job)
{
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 20000 && atomic_load(&job->state) != KVP_POPULATE_DONE; i++)
        nanosleep(&ts, NULL);
}

static void test_pool(void)
{
    struct kvp__mempool pool;
    kvp__mempool_init(&pool);
    test_slab(&pool); /* through the pool's pieces */

    for (int i = 0; i < 2 * KVP_POOL_PIECES; i++) { /* ready ones, then fresh ones */
        unsigned char *p = kvp__mempool_take(&pool);
        CHECK(p != NULL);
        if (!p)
            continue;
        CHECK_EQ((uintptr_t)p % KVP_PIECE_SIZE, 0);
        CHECK(all_zero(p, KVP_PIECE_SIZE));
        kvp__big_free(p, KVP_PIECE_SIZE);
    }

    /* Populating backs memory without changing a byte of it. */
    size_t len = 3 * KVP_PIECE_SIZE + 4096;
    unsigned char *m = kvp__big_zalloc(len);
    CHECK(m != NULL);
    fill(m + 100, 5000, 7);
    struct kvp__populate job = {.addr = m + 100, .len = len - 100};
    CHECK_EQ(kvp__mempool_populate(&pool, &job), 0);
    wait_done(&job);
    CHECK_EQ(atomic_load(&job.state), KVP_POPULATE_DONE);
    CHECK(intact(m + 100, 5000, 7));
    CHECK(all_zero(m + 5100, len - 5100));
    /* A done job can be queued again. */
    CHECK_EQ(kvp__mempool_populate(&pool, &job), 0);
    wait_done(&job);
    CHECK_EQ(atomic_load(&job.state), KVP_POPULATE_DONE);

    kvp__mempool_destroy(&pool);
    /* Still queued at destroy: marked done, never touched afterwards. */
    struct kvp__mempool p2;
    kvp__mempool_init(&p2);
    struct kvp__populate j2 = {.addr = m, .len = len};
    CHECK_EQ(kvp__mempool_populate(&p2, &j2), 0);
    kvp__mempool_destroy(&p2);
    CHECK_EQ(atomic_load(&j2.state), KVP_POPULATE_DONE);
    kvp__big_free(m, len);
}

static void test_pool_unused(void)
{
    /* Never used: no thread to stop, nothing to free. */
    struct kvp__mempool pool;
    kvp__mempool_init(&pool);
    kvp__mempool_destroy(&pool);
    CHECK(pool.started == 0);
}

int main(void)
{
    test_big();
    struct kvp__slab plain = {0}; /* no pool: pieces are mapped directly */
    void *x = kvp__slab_alloc(&plain, 16);
    CHECK(x != NULL);
    kvp__slab_destroy(&plain);
    test_slab(NULL);
    test_pool();
    test_pool_unused();
    return check_report();
}
