/*
 * test_pagefile_concurrency — 8 threads doing random batches on one handle,
 * checked against a model: each thread owns a range of pages it writes and
 * reads; all of them also read a shared range written before they start.
 * Both backends, buffered and O_DIRECT; the io_uring handle has fewer rings
 * than threads, so batches also wait for a free ring.
 */
#include <pthread.h>

#include "pagefile_test.h"

#define THREADS 8
#define BPP (128 * 1024)
#define OWN_PAGES 8
#define SHARED_PAGES 16
#define NPAGES (THREADS * OWN_PAGES + SHARED_PAGES)
#define FILE_SIZE ((uint64_t)NPAGES * BPP)
#define ENTRIES 8
#define BATCHES 120

static unsigned char *model;
static struct kvp_pagefile *pf;
static int direct;
static atomic_int errors;

struct worker {
    pthread_t tid;
    int id;
    unsigned char *bufs;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    uint64_t seed = 777 + (uint64_t)w->id;
    const uint64_t al = direct ? kvp_pagefile_direct_offset_align(pf) : 1;
    const int first = SHARED_PAGES + w->id * OWN_PAGES;
    struct kvp_pagefile_op ops[ENTRIES];
    int64_t res[ENTRIES];
    for (int it = 0; it < BATCHES; it++) {
        int write = pt_below(&seed, 2);
        size_t n = 1 + pt_below(&seed, ENTRIES);
        /* Distinct pages per batch: concurrent ops of one batch have no order. */
        int used[NPAGES] = {0};
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            int page;
            if (!write && pt_below(&seed, 2))
                page = (int)pt_below(&seed, SHARED_PAGES);
            else
                page = first + (int)pt_below(&seed, OWN_PAGES);
            if (used[page])
                continue;
            used[page] = 1;
            uint64_t start = pt_below(&seed, BPP / 2) / al * al;
            uint64_t size = (1 + pt_below(&seed, BPP - start));
            size = (size + al - 1) / al * al;
            if (start + size > BPP)
                size = BPP - start;
            ops[k] = (struct kvp_pagefile_op){(int64_t)((uint64_t)page * BPP + start),
                                              w->bufs + k * BPP, size};
            k++;
        }
        n = k;
        struct kvp_error err;
        if (write) {
            for (size_t i = 0; i < n; i++)
                pt_fill(&seed, ops[i].buf, ops[i].size);
            int rc = kvp_pagefile_write(pf, ops, n, res, &err);
            if (rc != 0)
                fprintf(stderr, "thread %d: write: %s\n", w->id, err.msg);
            for (size_t i = 0; i < n; i++) {
                if (rc != 0 || res[i] != (int64_t)ops[i].size)
                    atomic_fetch_add(&errors, 1);
                memcpy(model + ops[i].offset, ops[i].buf, ops[i].size);
            }
        } else {
            int rc = kvp_pagefile_read(pf, ops, n, res, &err);
            if (rc != 0)
                fprintf(stderr, "thread %d: read: %s\n", w->id, err.msg);
            for (size_t i = 0; i < n; i++)
                if (rc != 0 || res[i] != (int64_t)ops[i].size ||
                    memcmp(ops[i].buf, model + ops[i].offset, ops[i].size) != 0)
                    atomic_fetch_add(&errors, 1);
        }
    }
    return NULL;
}

static void run(int backend, uint32_t flags, const char *name)
{
    char path[600];
    pt_path(path, sizeof path, name);
    struct kvp_pagefile_opts o =
        pt_opts(FILE_SIZE, BPP, ENTRIES, KVP_PAGEFILE_CREATE | flags, backend);
    o.chunk_bytes = 32 * 1024;
    o.queues = 3;
    pf = pt_open_or_skip(path, &o, name);
    if (!pf)
        return;
    direct = (flags & KVP_PAGEFILE_DIRECT) != 0;
    memset(model, 0, FILE_SIZE);
    uint64_t seed = 99;
    pt_fill(&seed, model, (size_t)SHARED_PAGES * BPP);
    unsigned char *shared = pt_alloc((size_t)SHARED_PAGES * BPP);
    memcpy(shared, model, (size_t)SHARED_PAGES * BPP);
    struct kvp_pagefile_op ops[ENTRIES];
    int64_t res[ENTRIES];
    for (int p = 0; p < SHARED_PAGES; p += ENTRIES) {
        for (int i = 0; i < ENTRIES; i++)
            ops[i] = (struct kvp_pagefile_op){(int64_t)(p + i) * BPP,
                                              shared + (size_t)(p + i) * BPP, BPP};
        CHECK_EQ(kvp_pagefile_write(pf, ops, ENTRIES, res, NULL), 0);
    }
    atomic_store(&errors, 0);
    struct worker ws[THREADS];
    for (int t = 0; t < THREADS; t++) {
        ws[t].id = t;
        ws[t].bufs = pt_alloc((size_t)ENTRIES * BPP);
        CHECK(pthread_create(&ws[t].tid, NULL, work, &ws[t]) == 0);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(ws[t].tid, NULL);
        free(ws[t].bufs);
    }
    CHECK_EQ(atomic_load(&errors), 0);
    /* Afterwards the whole file equals the model. */
    int bad = 0;
    unsigned char *page = pt_alloc(BPP);
    for (int p = 0; p < NPAGES; p++) {
        struct kvp_pagefile_op op = {(int64_t)p * BPP, page, BPP};
        CHECK_EQ(kvp_pagefile_read(pf, &op, 1, res, NULL), 0);
        bad += memcmp(page, model + (size_t)p * BPP, BPP) != 0;
    }
    CHECK_EQ(bad, 0);
    free(page);
    free(shared);
    kvp_pagefile_close(pf);
    printf("%s: %d threads x %d batches, %s\n", name, THREADS, BATCHES,
           atomic_load(&errors) || bad ? "MISMATCH" : "ok");
}

/*
 * Who copies: one caller's large page is shared with a worker (when there
 * are two cores for them); a buffered write is never handed to one, not
 * even by workers still spinning after the reads (the inode lock would only
 * make them queue), nor are the batches of as many callers as threads.
 */
static void helpers(void)
{
    char path[600];
    pt_path(path, sizeof path, "helpers");
    const uint64_t bpp = 8u << 20;
    struct kvp_pagefile_opts o =
        pt_opts(4 * bpp, bpp, 2, KVP_PAGEFILE_CREATE, KVP_PAGEFILE_BACKEND_PSYNC);
    o.threads = 2;
    o.chunk_bytes = 1u << 20;
    struct kvp_pagefile *h = pt_open_or_skip(path, &o, "helpers");
    if (!h)
        return;
    unsigned char *buf = pt_alloc(2 * bpp);
    memset(buf, 7, 2 * bpp);
    struct kvp_pagefile_op ops[2] = {{0, buf, bpp}, {(int64_t)bpp, buf + bpp, bpp}};
    int64_t res[2];
    CHECK_EQ(kvp_pagefile_write(h, ops, 2, res, NULL), 0);
    uint64_t before = kvp__pf_pool_helped();
    for (int i = 0; i < 50 && kvp__pf_pool_helped() == before; i++)
        CHECK_EQ(kvp_pagefile_read(h, ops, 1, res, NULL), 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus >= 2)
        CHECK(kvp__pf_pool_helped() > before);
    /* Right after reads, with workers spinning: writes stay with their caller. */
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(kvp_pagefile_read(h, ops, 1, res, NULL), 0);
        before = kvp__pf_pool_helped();
        CHECK_EQ(kvp_pagefile_write(h, ops, 2, res, NULL), 0);
        CHECK_EQ(kvp__pf_pool_helped(), before);
        CHECK_EQ(res[0], (int64_t)bpp);
        CHECK_EQ(res[1], (int64_t)bpp);
    }
    free(buf);
    kvp_pagefile_close(h);
    printf("helpers: %s\n", cpus >= 2 ? "a read shared, writes alone" : "writes alone (1 CPU)");
}

int main(void)
{
    pt_mkdir("concurrency");
    model = malloc(FILE_SIZE);
    pt_each_mode(run);
    run(KVP_PAGEFILE_BACKEND_AUTO, 0, "auto_buffered");
    run(KVP_PAGEFILE_BACKEND_AUTO, KVP_PAGEFILE_MMAP_READS, "mmap_reads");
    helpers();
    free(model);
    pt_rmdir();
    return pt_finish();
}
