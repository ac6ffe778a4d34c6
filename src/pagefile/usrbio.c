/*
 * usrbio.c — the 3FS USRBIO backend: page I/O through 3FS's user-space
 * rings instead of its FUSE mount.
 *
 * The library (libhf3fs_api_shared.so, or what KVPAGE_USRBIO_LIB names) is
 * loaded with dlopen the first time a page file asks for it, so a build of
 * kvpage never needs 3FS; the declarations are kvpage's own (usrbio_abi.h).
 * A handle on 3FS registers its fd with the library and owns opts.queues
 * rings (default 4) per direction it serves, so that as many batches of each
 * direction run at once (a batch takes a free ring, or waits for one, as in
 * uring.c), each with a staging iov of `slots` pages (shared memory the 3FS
 * daemon reads and writes; 256 MiB per direction at most): a write copies the caller's page
 * into a slot and prepares the I/O from there, a read prepares it into a
 * slot and copies out when it completes, as the engines' clients do. A
 * buffer that lies inside memory kvp_pagefile_alloc handed out (an iov of
 * this backend) and that the caller registered goes zero-copy: the I/O is
 * prepared on that iov directly.
 *
 * The header's rules: hf3fs_prep_io and hf3fs_wait_for_ios of one ring are
 * called from one thread at a time (a batch holds its ring's mutex from its
 * first prep to its last completion); at most `slots` I/Os are in a ring at
 * once (its entries); every I/O lies inside the iov it names. A completion that falls short is
 * continued from where it stopped; -errno is that op's result. A ring whose
 * submit or wait fails, or whose wait sees nothing for KVP__UB_WAIT_S
 * seconds, is taken out of use (its I/Os may still land in its staging
 * memory, so it is never reused): the ops still in it get the error
 * (-ETIMEDOUT for the wait), and later batches that take that ring run with
 * pread/pwrite on the calling thread, so the handle stays usable.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagefile/pf_internal.h"
#include "pagefile/usrbio_abi.h"

#define UB_DEFAULT_LIB "libhf3fs_api_shared.so"
#define UB_STAGE_MAX                                                                               \
    (256ull << 20) /* staging memory per direction, at most (at least a page a ring) */
#define UB_MAX_SLOTS 1024u
#define KVP__UB_WAIT_S 30 /* a ring that completes nothing this long is broken */

/* ---- the library ------------------------------------------------------ */

static struct ub_lib {
    void *dl;
    kvp__hf3fs_extract_mount_point_fn extract_mount_point;
    kvp__hf3fs_iovcreate_fn iovcreate;
    kvp__hf3fs_iovdestroy_fn iovdestroy;
    kvp__hf3fs_iorcreate4_fn iorcreate4;
    kvp__hf3fs_iordestroy_fn iordestroy;
    kvp__hf3fs_reg_fd_fn reg_fd;
    kvp__hf3fs_dereg_fd_fn dereg_fd;
    kvp__hf3fs_prep_io_fn prep_io;
    kvp__hf3fs_submit_ios_fn submit_ios;
    kvp__hf3fs_wait_for_ios_fn wait_for_ios;
} ub;
static pthread_mutex_t ub_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int ub_loaded;

/* Loads the library once per process (a failure is tried again next time).
 * Returns 0, or -ENOENT / -ENOSYS with why saying what was tried. */
static int ub_load(char *why, size_t whylen)
{
    if (atomic_load_explicit(&ub_loaded, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&ub_mu);
    int rc = 0;
    if (atomic_load_explicit(&ub_loaded, memory_order_relaxed))
        goto out;
    const char *env = getenv("KVPAGE_USRBIO_LIB");
    const char *name = env && *env ? env : UB_DEFAULT_LIB;
    void *dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        if (env && *env)
            snprintf(why, whylen, "cannot load KVPAGE_USRBIO_LIB=%s: %s", name, e ? e : "?");
        else
            snprintf(why, whylen,
                     "cannot load %s (3FS's USRBIO library; KVPAGE_USRBIO_LIB names another "
                     "path): %s",
                     name, e ? e : "?");
        rc = -ENOENT;
        goto out;
    }
    struct ub_lib l = {.dl = dl};
    struct {
        const char *sym;
        void **slot;
    } want[] = {
        {"hf3fs_extract_mount_point", (void **)&l.extract_mount_point},
        {"hf3fs_iovcreate", (void **)&l.iovcreate},
        {"hf3fs_iovdestroy", (void **)&l.iovdestroy},
        {"hf3fs_iorcreate4", (void **)&l.iorcreate4},
        {"hf3fs_iordestroy", (void **)&l.iordestroy},
        {"hf3fs_reg_fd", (void **)&l.reg_fd},
        {"hf3fs_dereg_fd", (void **)&l.dereg_fd},
        {"hf3fs_prep_io", (void **)&l.prep_io},
        {"hf3fs_submit_ios", (void **)&l.submit_ios},
        {"hf3fs_wait_for_ios", (void **)&l.wait_for_ios},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = dlsym(dl, want[i].sym);
        if (!*want[i].slot) {
            snprintf(why, whylen, "%s has no %s (not 3FS's USRBIO library?)", name, want[i].sym);
            dlclose(dl);
            rc = -ENOSYS;
            goto out;
        }
    }
    ub = l; /* never unloaded: handles of any thread may use it */
    atomic_store_explicit(&ub_loaded, 1, memory_order_release);
out:
    pthread_mutex_unlock(&ub_mu);
    return rc;
}

/* ---- the handle's state ----------------------------------------------- */

extern const struct kvp__pf_backend kvp__pf_usrbio; /* below */

struct ub_ring {
    pthread_mutex_t mu;
    int made, ok; /* ok: usable; 0 once broken (batches then run inline) */
    struct hf3fs_ior ior;
    struct hf3fs_iov stage;
    uint32_t slots;
    uint64_t stride;        /* bytes per slot */
    struct hf3fs_cqe *cqes; /* slots of them */
    uint32_t *free_slots, nfree;
    /* per op of the batch in flight (entries of them) */
    uint64_t *done;
    unsigned *again;  /* EINTR/EAGAIN in a row, retried up to KVP__PF_MAX_AGAIN */
    int32_t *slot_of; /* -1: zero-copy (the op's own iov) */
    const struct hf3fs_iov **iov_of;
};

/* Memory handed out by kvp_pagefile_alloc: an iov of the library. */
struct ub_alloc {
    struct hf3fs_iov iov;
    struct ub_alloc *next;
};

struct kvp__pf_usrbio {
    char mount[256];
    int fd_registered;
    struct ub_ring *ring[2]; /* [0] reads, [1] writes: nring[w] of them each */
    uint32_t nring[2];
    _Atomic uint32_t rr;      /* where a batch starts looking for a free ring */
    pthread_mutex_t alloc_mu; /* guards what follows */
    struct ub_alloc *allocs;
    struct kvp_pagefile_buf *regs; /* kvp_pagefile_register_buffers' regions */
    _Atomic size_t nregs;          /* read without the lock to skip the search when 0 */
};

static void ub_ring_destroy(struct ub_ring *r)
{
    if (r->made) {
        ub.iordestroy(&r->ior);
        ub.iovdestroy(&r->stage);
    }
    free(r->cqes);
    free(r->free_slots);
    free(r->done);
    free(r->again);
    free(r->slot_of);
    free(r->iov_of);
    pthread_mutex_destroy(&r->mu);
}

static void ub_free(struct kvp_pagefile *pf, struct kvp__pf_usrbio *u)
{
    for (int w = 0; w < 2; w++) {
        for (uint32_t k = 0; k < u->nring[w]; k++)
            ub_ring_destroy(&u->ring[w][k]);
        free(u->ring[w]);
    }
    while (u->allocs) {
        struct ub_alloc *a = u->allocs;
        u->allocs = a->next;
        ub.iovdestroy(&a->iov);
        free(a);
    }
    if (u->fd_registered)
        ub.dereg_fd(pf->fd);
    free(u->regs);
    pthread_mutex_destroy(&u->alloc_mu);
    free(u);
}

static void pf_usrbio_stop(struct kvp_pagefile *pf, void *state)
{
    ub_free(pf, state);
}

/* 1 when the library loads and says pf's file is on a 3FS mount (AUTO's test). */
static int pf_usrbio_claims(const struct kvp_pagefile *pf)
{
    const char *env = getenv("KVPAGE_USRBIO");
    if (env && strcmp(env, "0") == 0)
        return 0; /* turned off for AUTO */
    char why[256], mp[256];
    if (ub_load(why, sizeof why) != 0)
        return 0;
    int n = ub.extract_mount_point(mp, (int)sizeof mp, pf->path);
    return n > 0 && n <= (int)sizeof mp;
}

static int ub_ring_make(struct kvp_pagefile *pf, struct kvp__pf_usrbio *u, struct ub_ring *r, int w,
                        char *why, size_t whylen)
{
    uint64_t stride = (pf->bytes_per_page + 4095) / 4096 * 4096;
    uint64_t slots = UB_STAGE_MAX / u->nring[w] / stride;
    if (slots < 1)
        slots = 1;
    if (slots > pf->entries)
        slots = pf->entries;
    if (slots > UB_MAX_SLOTS)
        slots = UB_MAX_SLOTS;
    r->slots = (uint32_t)slots;
    r->stride = stride;
    r->cqes = calloc(slots, sizeof *r->cqes);
    r->free_slots = calloc(slots, sizeof *r->free_slots);
    r->done = calloc(pf->entries, sizeof *r->done);
    r->again = calloc(pf->entries, sizeof *r->again);
    r->slot_of = calloc(pf->entries, sizeof *r->slot_of);
    r->iov_of = calloc(pf->entries, sizeof *r->iov_of);
    if (!r->cqes || !r->free_slots || !r->done || !r->again || !r->slot_of || !r->iov_of) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    int64_t f = kvp__pf_fault(KVP__PF_USRBIO_INIT, 0, 0);
    int rc = f < 0 ? (int)f : ub.iovcreate(&r->stage, u->mount, slots * stride, 0, -1);
    if (rc < 0) {
        snprintf(why, whylen, "hf3fs_iovcreate of %llu bytes: %s",
                 (unsigned long long)(slots * stride), strerror(-rc));
        return rc;
    }
    rc = ub.iorcreate4(&r->ior, u->mount, (int)slots, !w, 0, 0, -1, 0);
    if (rc < 0) {
        ub.iovdestroy(&r->stage);
        snprintf(why, whylen, "hf3fs_iorcreate4 of %u entries: %s", r->slots, strerror(-rc));
        return rc;
    }
    r->made = r->ok = 1;
    return 0;
}

static int pf_usrbio_start(struct kvp_pagefile *pf, void **state, char *why, size_t whylen)
{
    int rc = ub_load(why, whylen);
    if (rc != 0)
        return rc;
    struct kvp__pf_usrbio *u = calloc(1, sizeof *u);
    if (!u) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&u->alloc_mu, NULL);
    int n = ub.extract_mount_point(u->mount, (int)sizeof u->mount, pf->path);
    if (n <= 0 || n > (int)sizeof u->mount) {
        snprintf(why, whylen,
                 n <= 0 ? "%s is not on a 3FS mount (hf3fs_extract_mount_point)"
                        : "the 3FS mount point of %s is too long",
                 pf->path);
        rc = n <= 0 ? -ENOTSUP : -ENAMETOOLONG;
        goto fail;
    }
    rc = ub.reg_fd(pf->fd, 0);
    if (rc > 0) {
        snprintf(why, whylen, "hf3fs_reg_fd: %s", strerror(rc));
        rc = -rc;
        goto fail;
    }
    u->fd_registered = 1;
    uint32_t nr = pf->queues_asked ? pf->queues_asked : KVP__PF_DEFAULT_QUEUES;
    for (int w = 0; w < 2; w++) {
        if (pf->be[w] != &kvp__pf_usrbio || (w && (pf->flags & KVP_PAGEFILE_READONLY)))
            continue;
        if (!(u->ring[w] = calloc(nr, sizeof *u->ring[w]))) {
            snprintf(why, whylen, "out of memory");
            rc = -ENOMEM;
            goto fail;
        }
        u->nring[w] = nr;
        for (uint32_t k = 0; k < nr; k++)
            pthread_mutex_init(&u->ring[w][k].mu, NULL);
        for (uint32_t k = 0; k < nr; k++)
            if ((rc = ub_ring_make(pf, u, &u->ring[w][k], w, why, whylen)) != 0)
                goto fail;
    }
    *state = u;
    return 0;
fail:
    ub_free(pf, u);
    return rc;
}

/* ---- batches ----------------------------------------------------------- */

/* 1 when [p, p + len) lies inside [base, base + size). */
static int ub_inside(uintptr_t p, uint64_t len, uintptr_t base, uint64_t size)
{
    return p >= base && p - base <= size && len <= size - (p - base);
}

/* The iov of kvp_pagefile_alloc holding [buf, buf + len) when that range is
 * also inside a registered region, or NULL. */
static const struct hf3fs_iov *ub_own_iov(struct kvp__pf_usrbio *u, const void *buf, uint64_t len)
{
    const struct hf3fs_iov *found = NULL;
    uintptr_t p = (uintptr_t)buf;
    pthread_mutex_lock(&u->alloc_mu);
    for (struct ub_alloc *a = u->allocs; a && !found; a = a->next) {
        if (!ub_inside(p, len, (uintptr_t)a->iov.base, a->iov.size))
            continue;
        for (size_t k = 0; k < u->nregs && !found; k++)
            if (ub_inside(p, len, (uintptr_t)u->regs[k].base, u->regs[k].len))
                found = &a->iov;
    }
    pthread_mutex_unlock(&u->alloc_mu);
    return found;
}

/* Prepares op i from where it stands (r->done[i]); 0, or its -errno (then it is not in the ring).
 */
static int ub_prep_once(struct kvp_pagefile *pf, struct ub_ring *r, const struct kvp__pf_batch *b,
                        size_t i)
{
    const struct kvp_pagefile_op *op = &b->ops[i];
    uint64_t done = r->done[i], len = op->size - done;
    int64_t off = op->offset + (int64_t)done;
    int64_t f = kvp__pf_fault(b->write ? KVP__PF_USRBIO_WRITE : KVP__PF_USRBIO_READ, off, len);
    if (f < 0)
        return (int)f;
    if (f > 0 && (uint64_t)f < len)
        len = (uint64_t)f; /* a short transfer: the rest is continued */
    const struct hf3fs_iov *iov = r->iov_of[i];
    char *ptr = r->slot_of[i] < 0 ? (char *)op->buf + done
                                  : (char *)iov->base + (uint64_t)r->slot_of[i] * r->stride + done;
    int rc = ub.prep_io(&r->ior, iov, !b->write, ptr, pf->fd, (size_t)off, len,
                        (const void *)(uintptr_t)(i + 1));
    return rc < 0 ? rc : 0;
}

/* ub_prep_once, retrying EINTR and EAGAIN (a full ring cannot be: at most
 * slots I/Os are in it) as kvp__pf_pio does. */
static int ub_prep(struct kvp_pagefile *pf, struct ub_ring *r, const struct kvp__pf_batch *b,
                   size_t i)
{
    for (;;) {
        int rc = ub_prep_once(pf, r, b, i);
        if ((rc != -EINTR && rc != -EAGAIN) || ++r->again[i] >= KVP__PF_MAX_AGAIN)
            return rc;
        if (rc == -EAGAIN)
            kvp__pf_again_pause(r->again[i]);
    }
}

/* Gives op i its buffer: zero-copy when it lies in a registered iov of ours,
 * else a staging slot (a write's page copied in). 0, or -1 when no slot is free. */
static int ub_place(struct kvp__pf_usrbio *u, struct ub_ring *r, const struct kvp__pf_batch *b,
                    size_t i)
{
    const struct kvp_pagefile_op *op = &b->ops[i];
    const struct hf3fs_iov *own = atomic_load_explicit(&u->nregs, memory_order_relaxed)
                                      ? ub_own_iov(u, op->buf, op->size)
                                      : NULL;
    r->done[i] = 0;
    r->again[i] = 0;
    if (own) { /* a write's digest: while the daemon works (ub_ring_hash) */
        r->slot_of[i] = -1;
        r->iov_of[i] = own;
        return 0;
    }
    if (r->nfree == 0)
        return -1;
    uint32_t s = r->free_slots[--r->nfree];
    r->slot_of[i] = (int32_t)s;
    r->iov_of[i] = &r->stage;
    if (b->write) /* what the daemon will write, hashed as it is copied */
        kvp__pf_tag_copy(b, i, r->stage.base + (uint64_t)s * r->stride, op->buf, op->size);
    return 0;
}

/* Op i is finished with result res: a read's staged bytes are copied out,
 * and hashed as they are (a zero-copy read's digest: ub_ring_hash). */
static void ub_finish(struct ub_ring *r, const struct kvp__pf_batch *b, size_t i, int64_t res)
{
    int32_t s = r->slot_of[i];
    if (s >= 0) {
        if (!b->write && res > 0)
            kvp__pf_tag_copy(b, i, b->ops[i].buf, r->stage.base + (uint64_t)s * r->stride,
                             (uint64_t)res);
        r->free_slots[r->nfree++] = (uint32_t)s;
    }
    b->results[i] = res;
}

/*
 * The zero-copy ops' digests while the daemon works on the ring (called
 * between the submit and the wait): the writes placed since the last call
 * (ops [*wh, next): their bytes are the caller's from the start, and their
 * slots stay BAD until the front end records the tags after the batch), and
 * the reads that completed in the last wait (the cqes r->cqes[0, got)).
 * Reads that complete with nothing else in flight are left to
 * kvp__pf_tags_tail, which hashes them on two threads after the ring is
 * released.
 */
static void ub_ring_hash(const struct ub_ring *r, const struct kvp__pf_batch *b, size_t *wh,
                         size_t next, int got)
{
    if (!b->tag_want)
        return;
    for (; b->write && *wh < next; ++*wh)
        if (r->slot_of[*wh] < 0)
            kvp__pf_tag_piece(b, *wh, b->ops[*wh].buf, 0, b->ops[*wh].size);
    for (int c = 0; !b->write && c < got; c++) {
        size_t i = (size_t)(uintptr_t)r->cqes[c].userdata - 1;
        if (r->slot_of[i] < 0 && b->results[i] == (int64_t)b->ops[i].size &&
            __atomic_load_n(&b->tag_bytes[i], __ATOMIC_RELAXED) == 0)
            kvp__pf_tag_piece(b, i, b->ops[i].buf, 0, b->ops[i].size);
    }
}

static void ub_ring_run(struct kvp_pagefile *pf, struct kvp__pf_usrbio *u, struct ub_ring *r,
                        struct kvp__pf_batch *b)
{
    r->nfree = r->slots;
    for (uint32_t s = 0; s < r->slots; s++)
        r->free_slots[s] = r->slots - 1 - s;
    size_t next = 0, inflight = 0, wh = 0;
    int got = 0; /* completions of the last wait */
    for (;;) {
        /* fill the ring: at most slots I/Os in it */
        while (next < b->n && inflight < r->slots) {
            size_t i = next;
            if (b->ops[i].size == 0) {
                b->results[i] = 0;
                next++;
                continue;
            }
            if (ub_place(u, r, b, i) != 0)
                break; /* every slot taken: wait for completions first */
            next++;
            int rc = ub_prep(pf, r, b, i);
            if (rc < 0)
                ub_finish(r, b, i, rc);
            else
                inflight++;
        }
        if (inflight == 0) {
            if (next >= b->n)
                return;
            continue;
        }
        int64_t f = kvp__pf_fault(KVP__PF_USRBIO_SUBMIT, 0, 0);
        int rc = f < 0 ? (int)f : ub.submit_ios(&r->ior);
        if (rc == 0)
            ub_ring_hash(r, b, &wh, next, got);
        got = 0;
        if (rc == 0) {
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += KVP__UB_WAIT_S;
            got = ub.wait_for_ios(&r->ior, r->cqes, (int)r->slots, 1, &dl);
            if (got == 0)
                rc = -ETIMEDOUT;
            else if (got < 0)
                rc = got;
        }
        if (rc < 0) {
            /* The ring is out of use; what is still in it fails with rc. */
            r->ok = 0;
            for (size_t i = 0; i < next; i++)
                if (b->results[i] == INT64_MIN)
                    b->results[i] = rc;
            for (size_t i = next; i < b->n; i++)
                b->results[i] =
                    kvp__pf_pio(pf->fd, b->write, b->ops[i].buf, b->ops[i].size, b->ops[i].offset);
            return;
        }
        for (int c = 0; c < got; c++) {
            size_t i = (size_t)(uintptr_t)r->cqes[c].userdata - 1;
            int64_t res = r->cqes[c].result;
            inflight--;
            if ((res == -EINTR || res == -EAGAIN) && ++r->again[i] < KVP__PF_MAX_AGAIN) {
                if (res == -EAGAIN)
                    kvp__pf_again_pause(r->again[i]);
            } else if (res < 0) {
                ub_finish(r, b, i, res);
                continue;
            } else {
                r->again[i] = 0;
                r->done[i] += (uint64_t)res;
                if (r->done[i] >= b->ops[i].size || res == 0) {
                    /* complete, or a read at the end of the file (a write of 0
                     * makes no progress: -EIO, as kvp__pf_pio) */
                    ub_finish(r, b, i,
                              res == 0 && b->write && r->done[i] < b->ops[i].size
                                  ? -EIO
                                  : (int64_t)r->done[i]);
                    continue;
                }
            }
            int prc = ub_prep(pf, r, b, i); /* the rest of a short one, or a retry */
            if (prc < 0)
                ub_finish(r, b, i, prc);
            else
                inflight++;
        }
    }
}

static void pf_usrbio_run(struct kvp_pagefile *pf, void *state, struct kvp__pf_batch *b)
{
    struct kvp__pf_usrbio *u = state;
    int w = b->write ? 1 : 0;
    for (size_t i = 0; i < b->n; i++)
        b->results[i] = INT64_MIN; /* not finished */
    /* A free ring of this direction that works, else wait for one (as
     * uring.c); a broken ring (ok 0) is passed over while another is free. */
    uint32_t n = u->nring[w];
    uint32_t start = atomic_fetch_add_explicit(&u->rr, 1, memory_order_relaxed) % n;
    struct ub_ring *r = NULL;
    for (uint32_t k = 0; k < n && !r; k++) {
        struct ub_ring *c = &u->ring[w][(start + k) % n];
        if (pthread_mutex_trylock(&c->mu) != 0)
            continue;
        if (c->ok)
            r = c;
        else
            pthread_mutex_unlock(&c->mu);
    }
    if (!r) {
        r = &u->ring[w][start];
        pthread_mutex_lock(&r->mu);
    }
    if (r->ok)
        ub_ring_run(pf, u, r, b);
    else
        kvp__pf_run_inline(pf, b);
    pthread_mutex_unlock(&r->mu);
    kvp__pf_tags_tail(pf, b); /* the reads that completed last, on two threads */
}

/* ---- memory and registration ------------------------------------------ */

/* The regions are kept: an op inside one and inside an iov of
 * kvp_pagefile_alloc goes zero-copy (other memory is staged as before). */
static int pf_usrbio_register(struct kvp_pagefile *pf, void *state,
                              const struct kvp_pagefile_buf *bufs, size_t n, struct kvp_error *err)
{
    struct kvp__pf_usrbio *u = state;
    struct kvp_pagefile_buf *copy = calloc(n, sizeof *copy);
    if (!copy) {
        return kvp__pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    }
    memcpy(copy, bufs, n * sizeof *copy);
    pthread_mutex_lock(&u->alloc_mu);
    free(u->regs);
    u->regs = copy;
    u->nregs = n;
    pthread_mutex_unlock(&u->alloc_mu);
    return 0;
}

static void pf_usrbio_unregister(struct kvp_pagefile *pf, void *state)
{
    struct kvp__pf_usrbio *u = state;
    pthread_mutex_lock(&u->alloc_mu);
    free(u->regs);
    u->regs = NULL;
    u->nregs = 0;
    pthread_mutex_unlock(&u->alloc_mu);
}

/* An iov of the library: memory the 3FS daemon reads and writes directly. */
static void *pf_usrbio_alloc(struct kvp_pagefile *pf, void *state, uint64_t size,
                             struct kvp_error *err)
{
    struct kvp__pf_usrbio *u = state;
    struct ub_alloc *a = calloc(1, sizeof *a);
    int rc = a ? ub.iovcreate(&a->iov, u->mount, (size_t)size, 0, -1) : -ENOMEM;
    if (rc < 0) {
        free(a);
        kvp__pf_fail(err, rc, KVP_RULE_IO, -1, 0, "hf3fs_iovcreate of %llu bytes on %.150s: %s",
                     (unsigned long long)size, u->mount, strerror(-rc));
        return NULL;
    }
    pthread_mutex_lock(&u->alloc_mu);
    a->next = u->allocs;
    u->allocs = a;
    pthread_mutex_unlock(&u->alloc_mu);
    return a->iov.base;
}

static int pf_usrbio_free(struct kvp_pagefile *pf, void *state, void *ptr)
{
    struct kvp__pf_usrbio *u = state;
    struct ub_alloc *a = NULL;
    pthread_mutex_lock(&u->alloc_mu);
    for (struct ub_alloc **pp = &u->allocs; *pp; pp = &(*pp)->next) {
        if ((*pp)->iov.base == (uint8_t *)ptr) {
            a = *pp;
            *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&u->alloc_mu);
    if (!a)
        return 0;
    ub.iovdestroy(&a->iov);
    free(a);
    return 1;
}

static void pf_usrbio_info(const struct kvp_pagefile *pf, void *state,
                           struct kvp_pagefile_info *info)
{
    const struct kvp__pf_usrbio *u = state;
    for (int w = 0; w < 2; w++)
        for (uint32_t k = 0; k < u->nring[w]; k++)
            info->queues += u->ring[w][k].made;
}

const struct kvp__pf_backend kvp__pf_usrbio = {
    .id = KVP_PAGEFILE_BACKEND_USRBIO,
    .name = "usrbio",
    .description = "3FS's USRBIO rings, for files on 3FS; its memory needs no copy",
    .what = "USRBIO",
    .claims = pf_usrbio_claims,
    .start = pf_usrbio_start,
    .stop = pf_usrbio_stop,
    .run = pf_usrbio_run,
    .reg = pf_usrbio_register,
    .unreg = pf_usrbio_unregister,
    .alloc = pf_usrbio_alloc,
    .free = pf_usrbio_free,
    .info = pf_usrbio_info,
};
