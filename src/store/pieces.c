/*
 * The store's parallel-for (store/pieces.h). A run is a job on a list; a
 * worker takes the first job with pieces left, one piece at a time, and the
 * caller works on its own job too, then waits for the pieces others took.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "store/pieces.h"

struct job {
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n, next, done; /* under the pool's lock */
    pthread_cond_t finished;
    struct job *link;
};

struct kvp__pieces {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct job *head, *tail; /* jobs with pieces not yet taken */
    int stop;
    unsigned nthreads;
    pthread_t *threads;
};

/* Takes a piece of j (lock held); removes j from the list once all are taken. */
static size_t take(struct kvp__pieces *p, struct job *j)
{
    size_t i = j->next++;
    if (j->next == j->n) {
        struct job **pp = &p->head, *prev = NULL;
        while (*pp != j)
            prev = *pp, pp = &(*pp)->link;
        *pp = j->link;
        if (p->tail == j)
            p->tail = prev;
    }
    return i;
}

static void finish(struct kvp__pieces *p, struct job *j)
{
    if (++j->done == j->n)
        pthread_cond_signal(&j->finished);
}

static void *worker(void *arg)
{
    struct kvp__pieces *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->head)
            break;
        struct job *j = p->head;
        size_t i = take(p, j);
        pthread_mutex_unlock(&p->lock);
        j->fn(j->arg, i);
        pthread_mutex_lock(&p->lock);
        finish(p, j);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int kvp__pieces_open(unsigned threads, struct kvp__pieces **out)
{
    struct kvp__pieces *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    unsigned nw = threads > 1 ? threads - 1 : 0;
    p->threads = nw ? calloc(nw, sizeof *p->threads) : NULL;
    if (nw && !p->threads) {
        kvp__pieces_close(p);
        return -ENOMEM;
    }
    for (; p->nthreads < nw; p->nthreads++) {
        int rc = pthread_create(&p->threads[p->nthreads], NULL, worker, p);
        if (rc) {
            kvp__pieces_close(p);
            return -rc;
        }
    }
    *out = p;
    return 0;
}

void kvp__pieces_close(struct kvp__pieces *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void kvp__pieces_run(struct kvp__pieces *p, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
    if (n == 0)
        return;
    if (n == 1 || p->nthreads == 0) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    struct job j = {.fn = fn, .arg = arg, .n = n};
    pthread_cond_init(&j.finished, NULL);
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->link = &j;
    else
        p->head = &j;
    p->tail = &j;
    if (n - 1 < p->nthreads)
        for (size_t k = 0; k < n - 1; k++)
            pthread_cond_signal(&p->work);
    else
        pthread_cond_broadcast(&p->work);
    while (j.next < j.n) {
        size_t i = take(p, &j);
        pthread_mutex_unlock(&p->lock);
        fn(arg, i);
        pthread_mutex_lock(&p->lock);
        finish(p, &j);
    }
    while (j.done < j.n)
        pthread_cond_wait(&j.finished, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&j.finished);
}
