/*
 * uring.c — the io_uring backend.
 *
 * A ring is not safe for concurrent submission, and one ring per batch in
 * flight is what lets many threads share a handle, so the handle owns a
 * small set of rings, each behind its own mutex; a batch takes a free one
 * (or waits for one) and keeps it until all its operations complete. The
 * file is registered in every ring (no fd lookup per I/O) and so are the
 * caller's buffers when it asks (no page pinning per O_DIRECT I/O).
 */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "pagefile/pf_internal.h"

#define PF_RING_MAX_DEPTH 1024u
#define PF_SQE_MAX_LEN (1u << 30)   /* one SQE moves at most this; the rest is a continuation */
#define PF_REG_MAX_LEN (1ull << 30) /* the kernel's limit per registered buffer */
#define PF_NO_OP UINT64_MAX         /* user_data of an SQE neutralized after a failed submit */

struct pf_opstate {
    uint64_t done;
    int64_t injected; /* error a test wants this op's next completion to carry */
    unsigned again;
    int inflight;
    uint32_t hnext; /* the next op (+1) of the list of reads to hash, 0 at its end */
};

struct kvp__pf_urings;

struct pf_ring {
    pthread_mutex_t mu;
    struct kvp__pf_urings *set; /* the handle's rings, this one's among them */
    struct io_uring ring;
    int ok;         /* set up and usable; 0 after a failed reset: batches run inline */
    int fixed_file; /* the fd is registered at index 0 */
    unsigned depth;
    struct pf_opstate *st; /* entries of them */
    uint32_t *todo;        /* entries of them: ops waiting for an SQE */
};

struct pf_reg {
    uintptr_t base;
    uint64_t len;
    unsigned index;
};

struct kvp__pf_urings {
    uint32_t n;
    struct pf_ring *rings;
    atomic_uint rr;
    /* Changed only with every ring mutex held; read with any one held. */
    struct iovec *iov;
    struct pf_reg *regs; /* sorted by base */
    uint32_t nregs;
};

static int pf_ring_setup(struct kvp_pagefile *pf, struct pf_ring *r)
{
    int64_t f = kvp__pf_fault(KVP__PF_URING_INIT, 0, 0);
    if (f < 0)
        return (int)f;
    /* SUBMIT_ALL keeps one bad SQE from stranding the rest; COOP_TASKRUN saves IPIs. Both 5.19+. */
    int rc = io_uring_queue_init(r->depth, &r->ring,
                                 IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN);
    if (rc == -EINVAL)
        rc = io_uring_queue_init(r->depth, &r->ring, 0);
    if (rc < 0)
        return rc;
    r->fixed_file = io_uring_register_files(&r->ring, &pf->fd, 1) == 0;
    r->ok = 1;
    return 0;
}

static int pf_ring_register(struct kvp__pf_urings *u, struct pf_ring *r)
{
    if (!r->ok || u->nregs == 0)
        return 0;
    return io_uring_register_buffers(&r->ring, u->iov, u->nregs);
}

static void pf_uring_free(struct kvp__pf_urings *u);

static int pf_uring_setup(struct kvp_pagefile *pf, uint32_t queues, void **state)
{
    struct kvp__pf_urings *u = calloc(1, sizeof *u);
    if (!u)
        return -ENOMEM;
    u->rings = calloc(queues, sizeof *u->rings);
    if (!u->rings) {
        free(u);
        return -ENOMEM;
    }
    unsigned depth = pf->entries < PF_RING_MAX_DEPTH ? pf->entries : PF_RING_MAX_DEPTH;
    for (uint32_t q = 0; q < queues; q++) {
        struct pf_ring *r = &u->rings[q];
        pthread_mutex_init(&r->mu, NULL);
        r->set = u;
        u->n++;
        r->depth = depth;
        r->st = calloc(pf->entries, sizeof *r->st);
        r->todo = calloc(pf->entries, sizeof *r->todo);
        if (!r->st || !r->todo) {
            pf_uring_free(u);
            return -ENOMEM;
        }
        int rc = pf_ring_setup(pf, r);
        if (rc < 0) {
            pf_uring_free(u);
            return rc;
        }
    }
    *state = u;
    return 0;
}

static void pf_uring_free(struct kvp__pf_urings *u)
{
    for (uint32_t q = 0; q < u->n; q++) {
        struct pf_ring *r = &u->rings[q];
        if (r->ok)
            io_uring_queue_exit(&r->ring);
        free(r->st);
        free(r->todo);
        pthread_mutex_destroy(&r->mu);
    }
    free(u->rings);
    free(u->iov);
    free(u->regs);
    free(u);
}

static void pf_uring_stop(struct kvp_pagefile *pf, void *state)
{
    pf_uring_free(state);
}

static void pf_uring_info(const struct kvp_pagefile *pf, void *state,
                          struct kvp_pagefile_info *info)
{
    struct kvp__pf_urings *u = state;
    info->queues = u->n;
    pthread_mutex_lock(&u->rings[0].mu);
    info->registered_buffers = u->nregs;
    pthread_mutex_unlock(&u->rings[0].mu);
}

static void pf_lock_all(struct kvp__pf_urings *u)
{
    for (uint32_t q = 0; q < u->n; q++)
        pthread_mutex_lock(&u->rings[q].mu);
}

static void pf_unlock_all(struct kvp__pf_urings *u)
{
    for (uint32_t q = u->n; q-- > 0;)
        pthread_mutex_unlock(&u->rings[q].mu);
}

static void pf_drop_regs(struct kvp__pf_urings *u)
{
    if (u->nregs)
        for (uint32_t q = 0; q < u->n; q++)
            if (u->rings[q].ok)
                io_uring_unregister_buffers(&u->rings[q].ring);
    free(u->iov);
    free(u->regs);
    u->iov = NULL;
    u->regs = NULL;
    u->nregs = 0;
}

static int pf_reg_cmp(const void *a, const void *b)
{
    const struct pf_reg *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

static int pf_uring_register(struct kvp_pagefile *pf, void *state,
                             const struct kvp_pagefile_buf *bufs, size_t n, struct kvp_error *err)
{
    struct kvp__pf_urings *u = state;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += (size_t)((bufs[i].len + PF_REG_MAX_LEN - 1) / PF_REG_MAX_LEN);
    struct iovec *iov = calloc(count, sizeof *iov);
    struct pf_reg *regs = calloc(count, sizeof *regs);
    if (!iov || !regs) {
        free(iov);
        free(regs);
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t at = 0; at < bufs[i].len; at += PF_REG_MAX_LEN, k++) {
            uint64_t len = bufs[i].len - at < PF_REG_MAX_LEN ? bufs[i].len - at : PF_REG_MAX_LEN;
            iov[k].iov_base = (char *)bufs[i].base + at;
            iov[k].iov_len = len;
            regs[k] = (struct pf_reg){(uintptr_t)iov[k].iov_base, len, (unsigned)k};
        }
    }
    qsort(regs, count, sizeof *regs, pf_reg_cmp);

    pf_lock_all(u);
    pf_drop_regs(u);
    u->iov = iov;
    u->regs = regs;
    u->nregs = (uint32_t)count;
    int rc = 0;
    for (uint32_t q = 0; q < u->n && rc == 0; q++)
        rc = pf_ring_register(u, &u->rings[q]);
    if (rc != 0)
        pf_drop_regs(u);
    pf_unlock_all(u);
    if (rc != 0)
        kvp__pf_fail(err, rc, KVP_RULE_IO, -1, 0,
                     "io_uring_register_buffers of %zu regions failed: %s%s", count, strerror(-rc),
                     rc == -ENOMEM ? " (RLIMIT_MEMLOCK too low?)" : "");
    return rc;
}

static void pf_uring_unregister(struct kvp_pagefile *pf, void *state)
{
    struct kvp__pf_urings *u = state;
    pf_lock_all(u);
    pf_drop_regs(u);
    pf_unlock_all(u);
}

/* The registered buffer holding [buf, buf + len), or -1. */
static int pf_find_reg(const struct kvp__pf_urings *u, const void *buf, uint64_t len)
{
    uintptr_t p = (uintptr_t)buf;
    uint32_t lo = 0, hi = u->nregs;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (u->regs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct pf_reg *r = &u->regs[lo - 1];
    if (p - r->base <= r->len && len <= r->len - (p - r->base))
        return (int)r->index;
    return -1;
}

static void pf_prep(struct kvp_pagefile *pf, struct pf_ring *r, struct io_uring_sqe *sqe,
                    const struct kvp__pf_batch *b, uint32_t i)
{
    const struct kvp_pagefile_op *op = &b->ops[i];
    struct pf_opstate *s = &r->st[i];
    uint64_t len = op->size - s->done;
    if (len > PF_SQE_MAX_LEN)
        len = PF_SQE_MAX_LEN;
    int64_t off = op->offset + (int64_t)s->done;
    char *buf = (char *)op->buf + s->done;
    int64_t f = kvp__pf_fault(b->write ? KVP__PF_URING_WRITE : KVP__PF_URING_READ, off, len);
    if (f < 0) {
        io_uring_prep_nop(sqe);
        s->injected = f;
    } else {
        if (f > 0 && (uint64_t)f < len)
            len = (uint64_t)f;
        int fd = r->fixed_file ? 0 : pf->fd;
        int reg = pf_find_reg(r->set, op->buf, op->size);
        if (reg >= 0 && b->write)
            io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, (uint64_t)off, reg);
        else if (reg >= 0)
            io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, (uint64_t)off, reg);
        else if (b->write)
            io_uring_prep_write(sqe, fd, buf, (unsigned)len, (uint64_t)off);
        else
            io_uring_prep_read(sqe, fd, buf, (unsigned)len, (uint64_t)off);
        if (r->fixed_file)
            sqe->flags |= IOSQE_FIXED_FILE;
    }
    io_uring_sqe_set_data64(sqe, i);
    s->inflight = 1;
}

/* Applies one completion to its op; returns 1 when the op needs another SQE.
 * A read that completes joins the list *hq (its first op + 1, or 0) of
 * reads to hash (hq NULL: none is kept). */
static int pf_complete(struct pf_ring *r, const struct kvp__pf_batch *b, uint32_t i, int64_t res,
                       size_t *remaining, uint32_t *hq)
{
    struct pf_opstate *s = &r->st[i];
    s->inflight = 0;
    if (s->injected) {
        res = s->injected;
        s->injected = 0;
    }
    if ((res == -EAGAIN || res == -EINTR) && ++s->again < KVP__PF_MAX_AGAIN) {
        if (res == -EAGAIN)
            kvp__pf_again_pause(s->again);
        return 1;
    }
    if (res < 0) {
        b->results[i] = res;
    } else if (res == 0) {
        /* End of file for a read; a write that moves nothing would never finish. */
        b->results[i] = b->write ? -EIO : (int64_t)s->done;
    } else {
        s->done += (uint64_t)res;
        s->again = 0;
        if (s->done < b->ops[i].size)
            return 1;
        b->results[i] = (int64_t)s->done;
        if (!b->write && hq && b->tag_want && b->tag_want[i]) {
            s->hnext = *hq;
            *hq = i + 1;
        }
    }
    (*remaining)--;
    return 0;
}

/*
 * A submit that fails for good: fail the ops whose SQEs the kernel never
 * took, wait for those it did (their buffers are the caller's), then rebuild
 * the ring, whose SQ now holds entries we cannot take back.
 */
static void pf_ring_broken(struct kvp_pagefile *pf, struct pf_ring *r,
                           const struct kvp__pf_batch *b, int error, unsigned *inflight,
                           size_t *remaining, uint32_t *todo_n)
{
    unsigned ready = io_uring_sq_ready(&r->ring);
    for (unsigned k = r->ring.sq.sqe_tail - ready; k != r->ring.sq.sqe_tail; k++) {
        struct io_uring_sqe *sqe = &r->ring.sq.sqes[k & r->ring.sq.ring_mask];
        uint64_t i = sqe->user_data;
        if (i < b->n) {
            r->st[i].inflight = 0;
            r->st[i].injected = 0;
            b->results[i] = error;
            (*remaining)--;
            (*inflight)--;
        }
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, PF_NO_OP);
    }
    while (*inflight > 0) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&r->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0)
            break;
        uint64_t i = io_uring_cqe_get_data64(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&r->ring, cqe);
        if (i >= b->n)
            continue;
        (*inflight)--;
        if (pf_complete(r, b, (uint32_t)i, res, remaining, NULL)) {
            b->results[i] = error;
            (*remaining)--;
        }
    }
    for (uint32_t t = 0; t < *todo_n; t++) {
        b->results[r->todo[t]] = error;
        (*remaining)--;
    }
    *todo_n = 0;
    io_uring_queue_exit(&r->ring);
    r->ok = 0;
    if (pf_ring_setup(pf, r) == 0 && pf_ring_register(r->set, r) != 0) {
        io_uring_queue_exit(&r->ring);
        r->ok = 0;
    }
}

/*
 * The digests while the batch's I/O is in flight (called between the submit
 * and the wait): a write's at once, its source being the caller's from the
 * start (its slot stays BAD until the front end records the tag after the
 * batch); the reads that completed, listed in *hq. Reads that complete with
 * nothing else in flight are left to kvp__pf_tags_tail, which hashes them
 * on two threads after the ring is released.
 */
static void pf_ring_hash(const struct pf_ring *r, const struct kvp__pf_batch *b, uint32_t *hq,
                         int *writes)
{
    for (size_t i = 0; *writes && i < b->n; i++)
        kvp__pf_tag_piece(b, i, b->ops[i].buf, 0, b->ops[i].size);
    *writes = 0;
    while (*hq) {
        uint32_t i = *hq - 1;
        *hq = r->st[i].hnext;
        kvp__pf_tag_piece(b, i, b->ops[i].buf, 0, b->ops[i].size);
    }
}

static void pf_ring_run(struct kvp_pagefile *pf, struct pf_ring *r, struct kvp__pf_batch *b)
{
    size_t remaining = 0;
    uint32_t todo_n = 0, hq = 0;
    unsigned inflight = 0, busy = 0;
    int hash_writes = b->write && b->tag_want;
    for (size_t i = b->n; i-- > 0;) {
        r->st[i] = (struct pf_opstate){0};
        b->results[i] = 0;
        if (b->ops[i].size == 0)
            continue;
        r->todo[todo_n++] = (uint32_t)i; /* popped from the end: op 0 goes first */
        remaining++;
    }
    while (remaining > 0) {
        while (todo_n > 0 && inflight < r->depth) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
            if (!sqe)
                break;
            pf_prep(pf, r, sqe, b, r->todo[--todo_n]);
            inflight++;
        }
        int64_t f = kvp__pf_fault(KVP__PF_URING_SUBMIT, 0, 0);
        int rc;
        if (f < 0) {
            rc = (int)f;
        } else if (hash_writes || hq) {
            /* Submit, hash while the device works, then wait. */
            rc = io_uring_submit(&r->ring);
            if (rc >= 0) {
                pf_ring_hash(r, b, &hq, &hash_writes);
                struct io_uring_cqe *c;
                int w = io_uring_cq_ready(&r->ring) ? 0 : io_uring_wait_cqe(&r->ring, &c);
                if (w < 0)
                    rc = w;
            }
        } else {
            rc = io_uring_submit_and_wait(&r->ring, 1);
        }
        if (rc < 0 && rc != -EINTR) {
            /* EAGAIN/EBUSY: the kernel is short of resources until completions are reaped. */
            if ((rc == -EAGAIN || rc == -EBUSY) && ++busy < KVP__PF_MAX_AGAIN) {
                if (io_uring_cq_ready(&r->ring) == 0)
                    kvp__pf_again_pause(busy);
            } else {
                pf_ring_broken(pf, r, b, rc, &inflight, &remaining, &todo_n);
                return;
            }
        } else if (rc >= 0) {
            busy = 0;
        }
        unsigned head, seen = 0;
        struct io_uring_cqe *cqe;
        io_uring_for_each_cqe(&r->ring, head, cqe)
        {
            seen++;
            uint64_t i = io_uring_cqe_get_data64(cqe);
            if (i >= b->n)
                continue;
            inflight--;
            if (pf_complete(r, b, (uint32_t)i, cqe->res, &remaining, &hq))
                r->todo[todo_n++] = (uint32_t)i;
        }
        io_uring_cq_advance(&r->ring, seen);
    }
}

static void pf_uring_run(struct kvp_pagefile *pf, void *state, struct kvp__pf_batch *b)
{
    struct kvp__pf_urings *u = state;
    uint32_t start = atomic_fetch_add_explicit(&u->rr, 1, memory_order_relaxed) % u->n;
    struct pf_ring *r = NULL;
    for (uint32_t k = 0; k < u->n && !r; k++) {
        struct pf_ring *c = &u->rings[(start + k) % u->n];
        if (pthread_mutex_trylock(&c->mu) == 0)
            r = c;
    }
    if (!r) {
        r = &u->rings[start];
        pthread_mutex_lock(&r->mu);
    }
    if (r->ok)
        pf_ring_run(pf, r, b);
    else
        kvp__pf_run_inline(pf, b);
    pthread_mutex_unlock(&r->mu);
    kvp__pf_tags_tail(pf, b); /* the reads that completed last, on two threads */
}

/* queues rings (opts.queues, default 4); why: the cause when io_uring cannot be set up. */
static int pf_uring_start(struct kvp_pagefile *pf, void **state, char *why, size_t whylen)
{
    int rc =
        pf_uring_setup(pf, pf->queues_asked ? pf->queues_asked : KVP__PF_DEFAULT_QUEUES, state);
    if (rc != 0)
        snprintf(why, whylen, "io_uring_queue_init: %s", strerror(-rc));
    return rc;
}

/*
 * AUTO's choice for O_DIRECT, both ways, from bench/io (bench/io/README.md,
 * 2026-11-30): io_uring is ahead in every page size, as it keeps the device
 * queue full without a thread per request. Buffered I/O: psync.c.
 */
const struct kvp__pf_backend kvp__pf_uring = {
    .id = KVP_PAGEFILE_BACKEND_URING,
    .name = "uring",
    .description = "io_uring, a ring per queue; registered buffers need no copy",
    .what = "io_uring",
    .auto_for = KVP__PF_AUTO_CELL(1, 0) | KVP__PF_AUTO_CELL(1, 1),
    .start = pf_uring_start,
    .stop = pf_uring_stop,
    .run = pf_uring_run,
    .reg = pf_uring_register,
    .unreg = pf_uring_unregister,
    .info = pf_uring_info,
};
