/*
 * psync.c — the thread-pool backend: pread/pwrite spread over threads.
 *
 * A buffered read or write is a memcpy between the page cache and the
 * caller's buffer, so its speed is the number of cores copying. A batch is
 * run as pieces that the calling thread and the pool's workers claim with an
 * atomic counter; the caller always works on its own batch too, so a batch
 * of one piece never touches the pool and the caller never sleeps while
 * pieces are left. Many batches (from many threads) can be in the pool at
 * once.
 *
 * Operations are cut into pieces only as far as needed to give every thread
 * one (and never below chunk_bytes): one 16 MiB page is shared by the caller
 * and the workers, a batch of 8 pages is not cut at all, and neither is the
 * batch of a caller while other callers keep the threads busy. Cutting
 * every page into 1 MiB pieces halved the speed of 2 MiB reads (bench/io):
 * each piece handed to another core is a wakeup, and its copy lands in the
 * other core's cache.
 *
 * Copies never put more threads to work than there are cores: a caller is
 * given helpers for its share of the threads (the threads over the callers
 * of late, pf_callers), and a worker joins no batch past that share and
 * none while the callers and the helpers fill the cores. O_DIRECT threads
 * wait on the device, not on a core, and join whatever has pieces left.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagefile/pf_internal.h"
#include "util/clock.h"

struct pf_job {
    struct kvp__pf_batch *b;
    const struct kvp_pagefile *pf;
    kvp__pf_xfer_fn xfer; /* the handle's strategy for this direction */
    uint64_t chunk;
    size_t per_op; /* pieces per operation: the largest op's, so index math stays a division */
    size_t total;
    atomic_size_t next;
    /* The fields below are guarded by the pool mutex. */
    atomic_int helpers; /* changed under the pool mutex; read without it while spinning */
    int max_helpers;    /* this caller's share of the workers: no more join */
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
    uint32_t spinning;           /* workers waiting for a job without sleeping */
    atomic_uint_fast64_t posted; /* jobs ever linked (spinners watch it) */
    atomic_uint callers;         /* batches being run */
    atomic_uint helping;         /* workers running pieces of a caller's batch */
    atomic_uint peak;            /* most callers at once lately (pf_callers) */
    atomic_uint_fast64_t peak_ns;
    uint32_t cores; /* threads that copy at once without taking turns */
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

static atomic_uint_fast64_t pf_helped; /* pieces run by workers, for the tests */

uint64_t kvp__pf_pool_helped(void)
{
    return atomic_load_explicit(&pf_helped, memory_order_relaxed);
}

/* A worker's help is wanted while the callers and the helpers fit on the
 * cores; past that they only take turns (and a thread holding Python's GIL
 * waits for a core). */
static int pf_room(const struct kvp__pf_pool *p, unsigned more)
{
    return atomic_load_explicit(&p->callers, memory_order_relaxed) +
               atomic_load_explicit(&p->helping, memory_order_relaxed) + more <=
           p->cores;
}

/*
 * Moves a piece of op i whose digest is wanted, in steps of
 * KVP__PF_TAG_STEP, each hashed right after its transfer, while its bytes
 * are in the cache: a read's destination the kernel just wrote, a write's
 * source the kernel just read (hashing a write's source first would read
 * it from memory once more: 0.75 of the speed at 256 KiB, bench/README.md).
 * The slot is BAD until the front end records the tag after the batch, so
 * the order does not matter to what a reader sees. Returns as xfer.
 */
static int64_t pf_tagged_piece(const struct pf_job *job, size_t i, uint64_t start, uint64_t len)
{
    const struct kvp__pf_batch *b = job->b;
    const struct kvp_pagefile_op *op = &b->ops[i];
    uint64_t done = 0;
    while (done < len) {
        uint64_t n = len - done < KVP__PF_TAG_STEP ? len - done : KVP__PF_TAG_STEP;
        char *p = (char *)op->buf + start + done;
        int64_t r = job->xfer(job->pf, b->write, p, n, op->offset + (int64_t)(start + done));
        if (r < 0)
            return r;
        if ((uint64_t)r == n)
            kvp__pf_tag_piece(b, i, p, start + done, n);
        done += (uint64_t)r;
        if ((uint64_t)r < n)
            break;
    }
    return (int64_t)done;
}

/* Runs pieces of job until none is left; a helper (pool not NULL) also
 * stops when the cores are taken. */
static void pf_job_work(struct pf_job *job, const struct kvp__pf_pool *helper)
{
    const struct kvp__pf_batch *b = job->b;
    for (;;) {
        if (helper && !pf_room(helper, 0))
            return;
        size_t c = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (c >= job->total)
            return;
        size_t i = c / job->per_op;
        uint64_t start = (uint64_t)(c % job->per_op) * job->chunk;
        const struct kvp_pagefile_op *op = &b->ops[i];
        const struct kvp__pf_vec *v = b->vec && b->vec[i].n ? &b->vec[i] : NULL;
        if (start >= op->size || (v && start)) /* a vectored op moves whole */
            continue;
        uint64_t len = v ? op->size : op->size - start < job->chunk ? op->size - start : job->chunk;
        if (helper)
            atomic_fetch_add_explicit(&pf_helped, 1, memory_order_relaxed);
        int64_t r = v ? kvp__pf_piov(job->pf->fd, b->write, v->iov, v->n, len, op->offset)
                    : b->tag_want && b->tag_want[i]
                        ? pf_tagged_piece(job, i, start, len)
                        : job->xfer(job->pf, b->write, (char *)op->buf + start, len,
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

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/*
 * A worker out of pieces watches for the next job this long before it
 * sleeps. A caller's batches come back to back, and waking a sleeping worker
 * (futex, then the scheduler) takes about as long as copying a 256 KiB page
 * here. The spin is bounded, so an idle pool sleeps.
 */
#define SPIN_NS 50000

/* Watches done(arg) for at most SPIN_NS; 1 when it became true. */
static int spin_until(int (*done)(const void *arg), const void *arg)
{
    uint64_t until = kvp__mono_ns() + SPIN_NS;
    for (unsigned i = 1;; i++) {
        if (done(arg))
            return 1;
        cpu_relax();
        if (i % 64 == 0 && kvp__mono_ns() > until)
            return 0;
    }
}

struct posted_watch {
    const struct kvp__pf_pool *p;
    uint64_t seen;
};

static int job_posted(const void *arg)
{
    const struct posted_watch *w = arg;
    return atomic_load_explicit(&w->p->posted, memory_order_acquire) != w->seen;
}

static int helpers_done(const void *arg)
{
    const struct pf_job *job = arg;
    return atomic_load_explicit(&job->helpers, memory_order_acquire) == 0;
}

/* Called with p->mu held, returns with it held: 1 when a job was posted. */
static int pf_spin(struct kvp__pf_pool *p)
{
    struct posted_watch w = {p, atomic_load(&p->posted)};
    p->spinning++;
    pthread_mutex_unlock(&p->mu);
    int posted = spin_until(job_posted, &w);
    pthread_mutex_lock(&p->mu);
    p->spinning--;
    return posted || job_posted(&w);
}

/* The first job that wants a helper, or NULL (called with p->mu held):
 * jobs whose pieces are all claimed wait only for their caller to unlink
 * them; jobs with their share of helpers are passed over, and every job
 * while the cores are taken (see pf_callers). */
static struct pf_job *pf_pick(struct kvp__pf_pool *p)
{
    if (!pf_room(p, 1))
        return NULL;
    struct pf_job *job = p->head;
    while (job) {
        struct pf_job *n = job->nxt;
        if (atomic_load_explicit(&job->next, memory_order_relaxed) >= job->total)
            pf_unlink(p, job);
        else if (job->helpers < job->max_helpers)
            return job;
        job = n;
    }
    return NULL;
}

static void *pf_worker(void *arg)
{
    pthread_setname_np(pthread_self(), "kvp-io"); /* for top and perf */
    struct kvp__pf_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct pf_job *job = pf_pick(p);
        if (!job) {
            if (!p->stop && pf_room(p, 1) && pf_spin(p))
                continue;
            if (p->stop)
                break;
            p->idle++;
            pthread_cond_wait(&p->work, &p->mu);
            p->idle--;
            continue;
        }
        job->helpers++;
        atomic_fetch_add_explicit(&p->helping, 1, memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
        pf_job_work(job, p);
        atomic_fetch_sub_explicit(&p->helping, 1, memory_order_relaxed);
        pthread_mutex_lock(&p->mu);
        pf_unlink(p, job);
        if (--job->helpers == 0 && job->waiting)
            pthread_cond_signal(&job->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pf_pool_free(struct kvp__pf_pool *p);

static int pf_pool_start(struct kvp_pagefile *pf, uint32_t threads, void **state)
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
    /* Buffered copies keep a core busy each; O_DIRECT threads sleep on the device. */
    p->cores = pf->flags & KVP_PAGEFILE_DIRECT ? UINT32_MAX / 2 : kvp__pf_cpus();
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
        pf_pool_free(p);
        return -rc;
    }
    *state = p;
    return 0;
}

static void pf_pool_free(struct kvp__pf_pool *p)
{
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
}

static void pf_pool_stop(struct kvp_pagefile *pf, void *state)
{
    pf_pool_free(state);
}

/*
 * Counts a caller of copies in and returns how many share the threads: the
 * most callers in flight at once over the last PEAK_NS, not only now.
 * Callers from Python go back to the interpreter between batches, so at
 * times only one of two is in flight; when that one got a helper (and
 * spinning workers joined any batch), a third thread took turns on two
 * cores with the one running Python under the GIL: two Python threads
 * reading 256 KiB pages out of the mapping moved 0.74-0.76 of what two C
 * callers did, 0.91-0.94 with the rules here (bench/README.md, issue 14).
 */
#define PEAK_NS 2000000

static unsigned pf_callers(struct kvp__pf_pool *p)
{
    unsigned now = atomic_fetch_add(&p->callers, 1) + 1;
    unsigned peak = atomic_load_explicit(&p->peak, memory_order_relaxed);
    uint64_t t = kvp__mono_ns();
    if (now >= peak || t - atomic_load_explicit(&p->peak_ns, memory_order_relaxed) > PEAK_NS) {
        atomic_store_explicit(&p->peak, now, memory_order_relaxed);
        atomic_store_explicit(&p->peak_ns, t, memory_order_relaxed);
        return now;
    }
    return peak;
}

static void pf_pool_run(struct kvp_pagefile *pf, void *state, struct kvp__pf_batch *b)
{
    struct kvp__pf_pool *p = state;
    struct pf_job job;
    job.b = b;
    job.pf = pf;
    job.xfer = pf->xfer[b->write ? 1 : 0];
    uint64_t largest = 0;
    for (size_t i = 0; i < b->n; i++) {
        b->results[i] = (int64_t)b->ops[i].size;
        if (b->ops[i].size > largest)
            largest = b->ops[i].size;
    }
    /* Pieces wanted: this caller's share of the pool's threads, as many as
     * run at once (the CPUs, or the queue depth for O_DIRECT); the caller
     * runs pieces too while the workers run the rest. */
    int cpu_bound = !(pf->flags & KVP_PAGEFILE_DIRECT);
    unsigned callers = !p ? 1 : cpu_bound ? pf_callers(p) : atomic_fetch_add(&p->callers, 1) + 1;
    uint64_t want = p && p->nthreads > callers ? p->nthreads / callers : 1;
    /* Buffered writes to one file take its inode lock one at a time (ext4,
     * XFS): helpers would only queue behind it. One 2 MiB page batch wrote
     * 6.1-6.5 GB/s with a helper, 8.3-9.3 GB/s alone (bench/io). */
    if (b->write && cpu_bound)
        want = 1;
    uint64_t per_op = b->n >= want || b->vec ? 1 : (want + b->n - 1) / b->n;
    /* Pieces are whole multiples of chunk_bytes (which keeps O_DIRECT
     * alignment), and of the tags' block when digests are wanted. */
    uint64_t unit = pf->chunk_bytes;
    if (b->tag_want && unit % KVP__PF_TAG_BLOCK)
        unit = (unit / KVP__PF_TAG_BLOCK + 1) * KVP__PF_TAG_BLOCK;
    uint64_t chunk = largest / per_op;
    chunk = chunk < unit ? unit : (chunk + unit - 1) / unit * unit;
    job.chunk = chunk;
    job.per_op = largest ? (size_t)((largest + chunk - 1) / chunk) : 1;
    job.total = job.per_op * b->n;
    atomic_init(&job.next, 0);
    atomic_init(&job.helpers, 0);
    job.linked = job.waiting = 0;
    /* Copies: the caller's share of the threads and no more (with a share
     * of one, itself, the pool is not asked). O_DIRECT: whoever is free,
     * as each only waits on the device. */
    job.max_helpers = cpu_bound ? (int)(want - 1) : INT_MAX;

    if (!p || p->nthreads == 0 || job.total == 1 || (cpu_bound && want == 1)) {
        pf_job_work(&job, NULL);
        if (p)
            atomic_fetch_sub(&p->callers, 1);
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
    atomic_fetch_add_explicit(&p->posted, 1, memory_order_release);
    /* Helpers for this caller's share of the threads, the caller being one:
     * more would only take turns on the same cores. */
    size_t wake = job.total - 1 < p->idle ? job.total - 1 : p->idle;
    size_t cap = want - 1 > p->spinning ? (size_t)(want - 1 - p->spinning) : 0;
    if (wake > cap)
        wake = cap;
    for (size_t w = 0; w < wake; w++)
        pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);

    pf_job_work(&job, NULL);

    /* Every piece is claimed; wait for helpers still finishing theirs (job
     * lives on our stack). Their last pieces end within microseconds: watch
     * first, sleep only if they take long. The mutex below still orders the
     * return after a helper's last touch of the job. */
    spin_until(helpers_done, &job);
    pthread_mutex_lock(&p->mu);
    pf_unlink(p, &job);
    job.waiting = 1;
    while (job.helpers > 0)
        pthread_cond_wait(&job.cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&job.cv);
    atomic_fetch_sub(&p->callers, 1);
}

/*
 * The threads besides the caller: opts.threads, else the CPUs (at most 64);
 * O_DIRECT threads sleep on the device, so there they are the queue depth,
 * at least min(entries, 16), not the CPU use.
 */
static int pf_psync_start(struct kvp_pagefile *pf, void **state, char *why, size_t whylen)
{
    uint32_t t = pf->threads_asked;
    if (t == 0) {
        t = kvp__pf_cpus();
        if (t > 64)
            t = 64;
        uint32_t depth = pf->entries < 16 ? pf->entries : 16;
        if ((pf->flags & KVP_PAGEFILE_DIRECT) && t < depth)
            t = depth;
    }
    int rc = pf_pool_start(pf, t, state);
    if (rc != 0)
        snprintf(why, whylen, "cannot start %u I/O threads: %s", t, strerror(-rc));
    return rc;
}

static void pf_psync_info(const struct kvp_pagefile *pf, void *state,
                          struct kvp_pagefile_info *info)
{
    const struct kvp__pf_pool *p = state;
    info->threads = p ? p->nthreads : 0;
}

/*
 * AUTO's choice for buffered I/O, both ways, from bench/io on a quiet 2-vCPU
 * machine (bench/io/README.md, 2026-11-30): buffered reads are memory copies
 * out of the page cache, and psync spreads them over the cores (24-27 GB/s
 * against io_uring's 13-15); buffered writes take the file's inode lock one
 * at a time, and psync runs them on the calling thread alone (8.3-8.6 GB/s
 * at 2 MiB against io_uring's 6.7-6.9, ahead at 256 KiB and 16 MiB too).
 * For O_DIRECT, uring.c. psync is the table's default row
 * (pf_backends.def): the fallback where another backend is unavailable.
 */
const struct kvp__pf_backend kvp__pf_psync = {
    .id = KVP_PAGEFILE_BACKEND_PSYNC,
    .name = "psync",
    .description = "pread and pwrite on a pool of threads; the others' fallback",
    .what = NULL, /* always there: the fallback of the others */
    .auto_for = KVP__PF_AUTO_CELL(0, 0) | KVP__PF_AUTO_CELL(0, 1),
    .caps = KVP__PF_CAP_VEC | KVP__PF_CAP_XFER,
    .start = pf_psync_start,
    .stop = pf_pool_stop,
    .run = pf_pool_run,
    .info = pf_psync_info,
};
