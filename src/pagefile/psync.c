/*
 * psync.c — the thread-pool backend: pread/pwrite spread over threads.
 *
 * A buffered read or write is a memcpy between the page cache and the
 * caller's buffer, so its speed is the number of cores copying. Each batch
 * is cut into pieces of chunk_bytes (so even one 16 MiB page uses every
 * core) that the calling thread and the pool's workers claim with an atomic
 * counter. The caller always works on its own batch too: a batch of one
 * piece never touches the pool, and the caller never sleeps while pieces are
 * left. Many batches (from many threads) can be in the pool at once.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "pagefile/pf_internal.h"

struct pf_job {
    struct kvp__pf_batch *b;
    int fd;
    uint64_t chunk;
    size_t per_op; /* pieces per operation: the largest op's, so index math stays a division */
    size_t total;
    atomic_size_t next;
    /* The fields below are guarded by the pool mutex. */
    int helpers;
    int linked;
    int waiting;
    pthread_cond_t cv;
    struct pf_job *prev, *nxt;
};

struct kvp__pf_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;
    struct pf_job *head, *tail;
    int stop;
    uint32_t nthreads, idle;
    pthread_t *tids;
};

/* Keeps the first error of an op; otherwise the shortest complete prefix. */
static void pf_record(int64_t *slot, int64_t value)
{
    int64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
    while (cur >= 0 && (value < 0 || value < cur)) {
        if (__atomic_compare_exchange_n(slot, &cur, value, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            break;
    }
}

static void pf_job_work(struct pf_job *job)
{
    const struct kvp__pf_batch *b = job->b;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (c >= job->total)
            return;
        size_t i = c / job->per_op;
        uint64_t start = (uint64_t)(c % job->per_op) * job->chunk;
        const struct kvp_pagefile_op *op = &b->ops[i];
        if (start >= op->size)
            continue;
        uint64_t len = op->size - start < job->chunk ? op->size - start : job->chunk;
        int64_t r = kvp__pf_pio(job->fd, b->write, (char *)op->buf + start, len,
                                op->offset + (int64_t)start);
        if (r < 0)
            pf_record(&b->results[i], r);
        else if ((uint64_t)r < len)
            pf_record(&b->results[i], (int64_t)(start + (uint64_t)r));
    }
}

static void pf_unlink(struct kvp__pf_pool *p, struct pf_job *job)
{
    if (!job->linked)
        return;
    if (job->prev)
        job->prev->nxt = job->nxt;
    else
        p->head = job->nxt;
    if (job->nxt)
        job->nxt->prev = job->prev;
    else
        p->tail = job->prev;
    job->linked = 0;
}

static void *pf_worker(void *arg)
{
    pthread_setname_np(pthread_self(), "kvp-io"); /* for top and perf */
    struct kvp__pf_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct pf_job *job = p->head;
        /* Jobs whose pieces are all claimed wait only for their caller to unlink them. */
        while (job && atomic_load_explicit(&job->next, memory_order_relaxed) >= job->total) {
            struct pf_job *n = job->nxt;
            pf_unlink(p, job);
            job = n;
        }
        if (!job) {
            p->idle++;
            pthread_cond_wait(&p->work, &p->mu);
            p->idle--;
            continue;
        }
        job->helpers++;
        pthread_mutex_unlock(&p->mu);
        pf_job_work(job);
        pthread_mutex_lock(&p->mu);
        pf_unlink(p, job);
        if (--job->helpers == 0 && job->waiting)
            pthread_cond_signal(&job->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kvp__pf_pool_start(struct kvp_pagefile *pf, uint32_t threads)
{
    struct kvp__pf_pool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->tids = calloc(threads, sizeof *p->tids);
    if (!p->tids) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pf->pool = p;
    /* Workers inherit a full signal mask: the application's handlers run on its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (uint32_t t = 0; t < threads; t++) {
        rc = pthread_create(&p->tids[t], NULL, pf_worker, p);
        if (rc != 0)
            break;
        p->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        kvp__pf_pool_stop(pf);
        return -rc;
    }
    return 0;
}

void kvp__pf_pool_stop(struct kvp_pagefile *pf)
{
    struct kvp__pf_pool *p = pf->pool;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t t = 0; t < p->nthreads; t++)
        pthread_join(p->tids[t], NULL);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
    pf->pool = NULL;
}

uint32_t kvp__pf_pool_threads(const struct kvp_pagefile *pf)
{
    return pf->pool ? pf->pool->nthreads : 0;
}

void kvp__pf_pool_run(struct kvp_pagefile *pf, struct kvp__pf_batch *b)
{
    struct kvp__pf_pool *p = pf->pool;
    struct pf_job job;
    job.b = b;
    job.fd = pf->fd;
    job.chunk = pf->chunk_bytes;
    uint64_t largest = 0;
    for (size_t i = 0; i < b->n; i++) {
        b->results[i] = (int64_t)b->ops[i].size;
        if (b->ops[i].size > largest)
            largest = b->ops[i].size;
    }
    job.per_op = largest ? (size_t)((largest + job.chunk - 1) / job.chunk) : 1;
    job.total = job.per_op * b->n;
    atomic_init(&job.next, 0);
    job.helpers = job.linked = job.waiting = 0;

    if (!p || p->nthreads == 0 || job.total == 1) {
        pf_job_work(&job);
        return;
    }
    pthread_cond_init(&job.cv, NULL);
    pthread_mutex_lock(&p->mu);
    job.prev = p->tail;
    job.nxt = NULL;
    if (p->tail)
        p->tail->nxt = &job;
    else
        p->head = &job;
    p->tail = &job;
    job.linked = 1;
    size_t wake = job.total - 1 < p->idle ? job.total - 1 : p->idle;
    for (size_t w = 0; w < wake; w++)
        pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);

    pf_job_work(&job);

    /* Every piece is claimed; wait for helpers still finishing theirs (job lives on our stack). */
    pthread_mutex_lock(&p->mu);
    pf_unlink(p, &job);
    job.waiting = 1;
    while (job.helpers > 0)
        pthread_cond_wait(&job.cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&job.cv);
}
