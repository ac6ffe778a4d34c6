/*
 * usrbio_emu.c — libhf3fs_emu.so, a stand-in for 3FS's USRBIO library
 * (libhf3fs_api) for tests on machines without 3FS. It exports the 14
 * functions kvpage uses with the signatures of the published header
 * (src/lib/api/hf3fs_usrbio.h of github.com/deepseek-ai/3FS), over POSIX files
 * and shared memory, and it checks that callers keep the header's contract:
 * see README.md next to this file. Written from the header and from reading
 * how the library behaves; no 3FS code is included or copied.
 *
 *   mount       the directory $KVPAGE_USRBIO_EMU_MOUNT (read at each call)
 *   iov         memfd + mmap(MAP_SHARED) (hf3fs_iovcreate) or the caller's
 *               memory (hf3fs_iovwrap); iovh points to an emu object
 *   ior         a ring of `entries` slots and a worker thread that runs the
 *               prepared I/Os with pread/pwrite on a dup of the registered fd
 *               and posts completions; iorh points to an emu object
 *
 * Objects are never freed: every iov and ring ever made stays on a list, so a
 * handle is checked against that list before it is used and use after
 * destroy is reported rather than a crash.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "pagefile/usrbio_abi.h"

#define EMU_API __attribute__((visibility("default")))

/* The functions, declared here with the header's signatures. */
EMU_API int hf3fs_extract_mount_point(char *hf3fs_mount_point, int size, const char *path);
EMU_API bool hf3fs_is_hf3fs(int fd);
EMU_API int hf3fs_iovcreate(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size,
                            size_t block_size, int numa);
EMU_API int hf3fs_iovwrap(struct hf3fs_iov *iov, void *base, const uint8_t id[16],
                          const char *hf3fs_mount_point, size_t size, size_t block_size, int numa);
EMU_API void hf3fs_iovdestroy(struct hf3fs_iov *iov);
EMU_API size_t hf3fs_ior_size(int entries);
EMU_API int hf3fs_iorcreate4(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries,
                             bool for_read, int io_depth, int timeout, int numa, uint64_t flags);
EMU_API void hf3fs_iordestroy(struct hf3fs_ior *ior);
EMU_API int hf3fs_reg_fd(int fd, uint64_t flags);
EMU_API void hf3fs_dereg_fd(int fd);
EMU_API int hf3fs_io_entries(const struct hf3fs_ior *ior);
EMU_API int hf3fs_prep_io(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov, bool read,
                          void *ptr, int fd, size_t off, uint64_t len, const void *userdata);
EMU_API int hf3fs_submit_ios(const struct hf3fs_ior *ior);
EMU_API int hf3fs_wait_for_ios(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int cqec,
                               int min_results, const struct timespec *abs_timeout);
/* The emulation's own: how many violations count mode has seen, the last one. */
EMU_API int hf3fs_emu_violations(void);
EMU_API const char *hf3fs_emu_last_violation(void);

/* The declarations above have the types kvpage's usrbio_abi.h gives them. */
#define EMU_SAME_TYPE(fn, type) _Static_assert(_Generic(&fn, type : 1, default : 0), #fn " type")
EMU_SAME_TYPE(hf3fs_extract_mount_point, kvp__hf3fs_extract_mount_point_fn);
EMU_SAME_TYPE(hf3fs_is_hf3fs, kvp__hf3fs_is_hf3fs_fn);
EMU_SAME_TYPE(hf3fs_iovcreate, kvp__hf3fs_iovcreate_fn);
EMU_SAME_TYPE(hf3fs_iovwrap, kvp__hf3fs_iovwrap_fn);
EMU_SAME_TYPE(hf3fs_iovdestroy, kvp__hf3fs_iovdestroy_fn);
EMU_SAME_TYPE(hf3fs_ior_size, kvp__hf3fs_ior_size_fn);
EMU_SAME_TYPE(hf3fs_iorcreate4, kvp__hf3fs_iorcreate4_fn);
EMU_SAME_TYPE(hf3fs_iordestroy, kvp__hf3fs_iordestroy_fn);
EMU_SAME_TYPE(hf3fs_reg_fd, kvp__hf3fs_reg_fd_fn);
EMU_SAME_TYPE(hf3fs_dereg_fd, kvp__hf3fs_dereg_fd_fn);
EMU_SAME_TYPE(hf3fs_io_entries, kvp__hf3fs_io_entries_fn);
EMU_SAME_TYPE(hf3fs_prep_io, kvp__hf3fs_prep_io_fn);
EMU_SAME_TYPE(hf3fs_submit_ios, kvp__hf3fs_submit_ios_fn);
EMU_SAME_TYPE(hf3fs_wait_for_ios, kvp__hf3fs_wait_for_ios_fn);

/* ---- violations ------------------------------------------------------- */

static atomic_int emu_violations;
static pthread_mutex_t emu_last_lock = PTHREAD_MUTEX_INITIALIZER;
static char emu_last[512];

static bool count_mode(void)
{
    const char *v = getenv("KVPAGE_USRBIO_EMU_VIOLATIONS");
    return v && strcmp(v, "count") == 0;
}

/* A broken rule of the header: abort() (default) or count it. */
__attribute__((format(printf, 1, 2))) static void violation(const char *fmt, ...)
{
    char msg[sizeof emu_last];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&emu_last_lock);
    memcpy(emu_last, msg, sizeof msg);
    pthread_mutex_unlock(&emu_last_lock);
    atomic_fetch_add(&emu_violations, 1);
    if (!count_mode()) {
        fprintf(stderr, "usrbio-emu: contract violation: %s\n", msg);
        abort();
    }
}

int hf3fs_emu_violations(void)
{
    return atomic_load(&emu_violations);
}

const char *hf3fs_emu_last_violation(void)
{
    return emu_last;
}

/* ---- objects ---------------------------------------------------------- */

/* emu_lock guards the lists, the fd table and the reference counts. */
static pthread_mutex_t emu_lock = PTHREAD_MUTEX_INITIALIZER;

struct emu_iov {
    struct emu_iov *next;
    bool live, wrapped, unmapped;
    uint8_t *base;
    size_t size, block_size;
    int inflight; /* I/Os prepared on it and not yet done */
};

struct emu_fd {
    struct emu_fd *next;
    int fd, dupfd, accmode;
    bool live;
    int refs; /* I/Os prepared on it and not yet done */
};

enum { SLOT_FREE, SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

struct emu_slot {
    int state;
    struct emu_iov *iov;
    struct emu_fd *fd;
    uint8_t *ptr;
    size_t off;
    uint64_t len;
    const void *userdata;
    int64_t result;
};

struct emu_ring {
    struct emu_ring *next;
    atomic_bool live;
    atomic_int in_prep, in_wait; /* a thread is inside prep_io / wait_for_ios */
    /* fixed at creation */
    int entries, io_depth;
    bool for_read;
    bool early, few, full_is_violation;
    long fail_every, short_every;
    unsigned prep_delay_us;
    void *mem; /* ior->iov's memory */
    size_t mem_size;
    pthread_t worker;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    bool stop;
    struct emu_slot *slots;
    int busy;                          /* slots not free: prepared and not reaped */
    int *sq, sq_head, sq_len, sq_subm; /* queued slots; the first sq_subm submitted */
    int *cq, cq_head, cq_len;          /* done slots, not reaped */
    int *batch;
    unsigned few_calls;
};

static struct emu_iov *all_iovs;
static struct emu_ring *all_rings;
static struct emu_fd *all_fds;
static atomic_ulong emu_io_count; /* every I/O run, process-wide (FAIL_EVERY, SHORT_EVERY) */

static struct emu_iov *find_iov_locked(const void *h)
{
    for (struct emu_iov *v = all_iovs; v; v = v->next)
        if (v == h)
            return v;
    return NULL;
}

static struct emu_fd *find_fd_locked(int fd)
{
    for (struct emu_fd *f = all_fds; f; f = f->next)
        if (f->live && (f->fd == fd || f->dupfd == fd)) /* 3FS knows both numbers too */
            return f;
    return NULL;
}

static void fd_put_locked(struct emu_fd *f)
{
    if (--f->refs > 0 || f->live)
        return;
    for (struct emu_fd **p = &all_fds; *p; p = &(*p)->next) {
        if (*p == f) {
            *p = f->next;
            break;
        }
    }
    close(f->dupfd);
    free(f);
}

static void iov_unmap_locked(struct emu_iov *v)
{
    if (!v->wrapped && !v->unmapped) {
        munmap(v->base, v->size);
        v->unmapped = true;
    }
}

/* An I/O no longer touches its iov and fd. */
static void slot_release_locked(struct emu_slot *s)
{
    if (s->iov && --s->iov->inflight == 0 && !s->iov->live)
        iov_unmap_locked(s->iov);
    if (s->fd)
        fd_put_locked(s->fd);
    s->iov = NULL;
    s->fd = NULL;
}

/* The ring of a handle, or NULL after reporting why it is not usable. */
static struct emu_ring *ring_of(const struct hf3fs_ior *ior, const char *fn)
{
    if (!ior) {
        violation("%s: ior is NULL", fn);
        return NULL;
    }
    struct emu_ring *r;
    pthread_mutex_lock(&emu_lock);
    for (r = all_rings; r && r != ior->iorh; r = r->next)
        ;
    pthread_mutex_unlock(&emu_lock);
    if (!r) {
        violation("%s: ior not created by hf3fs_iorcreate4", fn);
        return NULL;
    }
    if (!atomic_load(&r->live)) {
        violation("%s: ior used after hf3fs_iordestroy", fn);
        return NULL;
    }
    return r;
}

/* ---- the mount -------------------------------------------------------- */

/* realpath of $KVPAGE_USRBIO_EMU_MOUNT into out, or false. */
static bool emu_mount(char out[PATH_MAX])
{
    const char *m = getenv("KVPAGE_USRBIO_EMU_MOUNT");
    return m && *m && realpath(m, out);
}

/* Whether the canonical path p is the directory m or under it. */
static bool path_under(const char *p, const char *m)
{
    size_t n = strlen(m);
    if (n == 1 && m[0] == '/')
        return p[0] == '/';
    return strncmp(p, m, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

static bool is_emu_mount(const char *mount)
{
    char m[PATH_MAX], r[PATH_MAX];
    return mount && emu_mount(m) && realpath(mount, r) && strcmp(m, r) == 0;
}

int hf3fs_extract_mount_point(char *hf3fs_mount_point, int size, const char *path)
{
    char m[PATH_MAX], p[PATH_MAX];
    if (!path || !emu_mount(m))
        return -1;
    if (!realpath(path, p)) {
        /* a file not created yet: its directory */
        char dir[PATH_MAX];
        if (errno != ENOENT || strlen(path) >= sizeof dir)
            return -1;
        strcpy(dir, path);
        char *slash = strrchr(dir, '/');
        if (!slash)
            strcpy(dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        if (!realpath(dir, p))
            return -1;
    }
    if (!path_under(p, m))
        return -1;
    int need = (int)strlen(m) + 1;
    if (hf3fs_mount_point && need <= size)
        memcpy(hf3fs_mount_point, m, (size_t)need);
    return need;
}

bool hf3fs_is_hf3fs(int fd)
{
    char link[64], target[PATH_MAX], m[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0 || !emu_mount(m))
        return false;
    target[n] = '\0';
    return target[0] == '/' && path_under(target, m);
}

/* ---- iov -------------------------------------------------------------- */

static void fill_iov(struct hf3fs_iov *iov, struct emu_iov *v, const uint8_t *id, const char *mount,
                     int numa)
{
    memset(iov, 0, sizeof *iov);
    iov->base = v->base;
    iov->iovh = v;
    if (id)
        memcpy(iov->id, id, sizeof iov->id);
    else if (getrandom(iov->id, sizeof iov->id, 0) != (ssize_t)sizeof iov->id)
        for (size_t i = 0; i < sizeof iov->id; i++)
            iov->id[i] = (char)rand();
    strcpy(iov->mount_point, mount);
    iov->size = v->size;
    iov->block_size = v->block_size;
    iov->numa = numa;
}

static void iov_register(struct emu_iov *v)
{
    pthread_mutex_lock(&emu_lock);
    v->next = all_iovs;
    all_iovs = v;
    pthread_mutex_unlock(&emu_lock);
}

int hf3fs_iovcreate(struct hf3fs_iov *iov, const char *hf3fs_mount_point, size_t size,
                    size_t block_size, int numa)
{
    if (!iov || size == 0 || !is_emu_mount(hf3fs_mount_point) ||
        strlen(hf3fs_mount_point) >= sizeof iov->mount_point)
        return -EINVAL;
    int mfd = memfd_create("hf3fs-emu-iov", MFD_CLOEXEC);
    if (mfd < 0)
        return -errno;
    if (ftruncate(mfd, (off_t)size) < 0) {
        int e = errno;
        close(mfd);
        return -e;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    int e = errno;
    close(mfd);
    if (p == MAP_FAILED)
        return -e;
    struct emu_iov *v = calloc(1, sizeof *v);
    if (!v) {
        munmap(p, size);
        return -ENOMEM;
    }
    v->live = true;
    v->base = p;
    v->size = size;
    v->block_size = block_size;
    iov_register(v);
    fill_iov(iov, v, NULL, hf3fs_mount_point, numa);
    return 0;
}

int hf3fs_iovwrap(struct hf3fs_iov *iov, void *base, const uint8_t id[16],
                  const char *hf3fs_mount_point, size_t size, size_t block_size, int numa)
{
    if (!iov || !base || size == 0 || !is_emu_mount(hf3fs_mount_point) ||
        strlen(hf3fs_mount_point) >= sizeof iov->mount_point)
        return -EINVAL;
    struct emu_iov *v = calloc(1, sizeof *v);
    if (!v)
        return -ENOMEM;
    v->live = true;
    v->wrapped = true;
    v->base = base;
    v->size = size;
    v->block_size = block_size;
    iov_register(v);
    fill_iov(iov, v, id, hf3fs_mount_point, numa);
    return 0;
}

void hf3fs_iovdestroy(struct hf3fs_iov *iov)
{
    if (!iov)
        return;
    pthread_mutex_lock(&emu_lock);
    struct emu_iov *v = find_iov_locked(iov->iovh);
    if (!v) {
        violation("hf3fs_iovdestroy: iov not created by hf3fs_iovcreate");
    } else if (v->wrapped) {
        /* The header: a wrapped iov cannot be destroyed; the library ignores it. */
    } else if (!v->live) {
        violation("hf3fs_iovdestroy: iov used after hf3fs_iovdestroy (destroyed twice)");
    } else {
        v->live = false;
        if (v->inflight > 0)
            violation("hf3fs_iovdestroy: iov destroyed with %d I/Os on it not completed",
                      v->inflight); /* unmapped when the last one is done */
        else
            iov_unmap_locked(v);
    }
    pthread_mutex_unlock(&emu_lock);
}

/* ---- fds -------------------------------------------------------------- */

int hf3fs_reg_fd(int fd, uint64_t flags)
{
    (void)flags;
    if (fd < 0 || !hf3fs_is_hf3fs(fd))
        return EBADF;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return errno;
    pthread_mutex_lock(&emu_lock);
    int rc = 0;
    struct emu_fd *f = NULL;
    if (find_fd_locked(fd)) {
        rc = EINVAL; /* as the library: already registered */
    } else if (!(f = calloc(1, sizeof *f))) {
        rc = ENOMEM;
    } else if ((f->dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = errno;
        free(f);
    } else {
        f->fd = fd;
        f->accmode = fl & O_ACCMODE;
        f->live = true;
        f->next = all_fds;
        all_fds = f;
        /* 3FS's library returns -(its dup of fd), which prep_io takes too */
        const char *how = getenv("KVPAGE_USRBIO_EMU_REG_RESULT");
        if (how && strcmp(how, "dup") == 0)
            rc = -f->dupfd;
    }
    pthread_mutex_unlock(&emu_lock);
    return rc;
}

void hf3fs_dereg_fd(int fd)
{
    pthread_mutex_lock(&emu_lock);
    struct emu_fd *f = find_fd_locked(fd);
    if (f) {
        f->live = false;
        f->refs++; /* fd_put_locked drops one: closes the dup now, or at its last I/O */
        fd_put_locked(f);
    }
    pthread_mutex_unlock(&emu_lock);
}

/* ---- rings ------------------------------------------------------------ */

static long env_long(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : 0;
}

size_t hf3fs_ior_size(int entries)
{
    /* the emulation's own figure: a page of header and 128 bytes a slot */
    return entries < 0 ? 0 : 4096 + ((size_t)entries + 1) * 128;
}

/* How many queued I/Os the worker may take now. */
static int ring_batch(const struct emu_ring *r)
{
    int avail = r->early ? r->sq_len : r->sq_subm;
    if (r->io_depth > 0)
        return avail >= r->io_depth ? r->io_depth : 0;
    if (r->io_depth < 0 && avail > -r->io_depth)
        return -r->io_depth;
    return avail;
}

static int64_t run_io(const struct emu_ring *r, const struct emu_slot *s)
{
    unsigned long n = atomic_fetch_add(&emu_io_count, 1) + 1;
    if (r->fail_every > 0 && n % (unsigned long)r->fail_every == 0)
        return -EIO;
    uint64_t len = s->len;
    if (r->short_every > 0 && n % (unsigned long)r->short_every == 0)
        len /= 2;
    uint64_t done = 0;
    while (done < len) {
        ssize_t k = r->for_read
                        ? pread(s->fd->dupfd, s->ptr + done, len - done, (off_t)(s->off + done))
                        : pwrite(s->fd->dupfd, s->ptr + done, len - done, (off_t)(s->off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return done ? (int64_t)done : -errno;
        if (k == 0)
            break; /* end of file */
        done += (uint64_t)k;
    }
    return (int64_t)done;
}

static void *ring_worker(void *arg)
{
    struct emu_ring *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        int n;
        while (!r->stop && (n = ring_batch(r)) == 0)
            pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->stop)
            break;
        for (int i = 0; i < n; i++) {
            r->batch[i] = r->sq[(r->sq_head + i) % r->entries];
            r->slots[r->batch[i]].state = SLOT_RUNNING;
        }
        r->sq_head = (r->sq_head + n) % r->entries;
        r->sq_len -= n;
        r->sq_subm = r->sq_subm > n ? r->sq_subm - n : 0;
        pthread_mutex_unlock(&r->mu);

        /* the slots are the worker's while they run */
        for (int i = 0; i < n; i++) {
            struct emu_slot *s = &r->slots[r->batch[i]];
            s->result = run_io(r, s);
        }
        pthread_mutex_lock(&emu_lock);
        for (int i = 0; i < n; i++)
            slot_release_locked(&r->slots[r->batch[i]]);
        pthread_mutex_unlock(&emu_lock);

        pthread_mutex_lock(&r->mu);
        for (int i = 0; i < n; i++) {
            r->slots[r->batch[i]].state = SLOT_DONE;
            r->cq[(r->cq_head + r->cq_len) % r->entries] = r->batch[i];
            r->cq_len++;
        }
        pthread_cond_broadcast(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int hf3fs_iorcreate4(struct hf3fs_ior *ior, const char *hf3fs_mount_point, int entries,
                     bool for_read, int io_depth, int timeout, int numa, uint64_t flags)
{
    if (!ior || entries <= 0 || entries > (1 << 20) || timeout < 0 ||
        !is_emu_mount(hf3fs_mount_point) || strlen(hf3fs_mount_point) >= sizeof ior->mount_point)
        return -EINVAL;
    struct emu_ring *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->entries = entries;
    r->for_read = for_read;
    r->io_depth = io_depth;
    r->early = env_long("KVPAGE_USRBIO_EMU_EARLY") > 0;
    r->few = env_long("KVPAGE_USRBIO_EMU_FEW") > 0;
    r->fail_every = env_long("KVPAGE_USRBIO_EMU_FAIL_EVERY");
    r->short_every = env_long("KVPAGE_USRBIO_EMU_SHORT_EVERY");
    long delay = env_long("KVPAGE_USRBIO_EMU_PREP_DELAY_US");
    r->prep_delay_us = delay > 0 && delay < 10000000 ? (unsigned)delay : 0;
    const char *full = getenv("KVPAGE_USRBIO_EMU_FULL");
    r->full_is_violation = full && strcmp(full, "violation") == 0;
    r->mem_size = hf3fs_ior_size(entries);
    r->mem = mmap(NULL, r->mem_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r->slots = calloc((size_t)entries, sizeof *r->slots);
    r->sq = calloc((size_t)entries, sizeof *r->sq);
    r->cq = calloc((size_t)entries, sizeof *r->cq);
    r->batch = calloc((size_t)entries, sizeof *r->batch);
    int rc = 0;
    if (r->mem == MAP_FAILED || !r->slots || !r->sq || !r->cq || !r->batch) {
        rc = -ENOMEM;
    } else {
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->work_cv, NULL);
        pthread_cond_init(&r->done_cv, NULL); /* CLOCK_REALTIME, as abs_timeout */
        /* the worker takes no signals of the process */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = -pthread_create(&r->worker, NULL, ring_worker, r);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc < 0) {
        if (r->mem != MAP_FAILED)
            munmap(r->mem, r->mem_size);
        free(r->slots);
        free(r->sq);
        free(r->cq);
        free(r->batch);
        free(r);
        return rc;
    }
    atomic_store(&r->live, true);
    pthread_mutex_lock(&emu_lock);
    r->next = all_rings;
    all_rings = r;
    pthread_mutex_unlock(&emu_lock);

    memset(ior, 0, sizeof *ior);
    ior->iov.base = r->mem;
    ior->iov.iovh = NULL; /* the ring's memory, not an iov for I/O */
    if (getrandom(ior->iov.id, sizeof ior->iov.id, 0) != (ssize_t)sizeof ior->iov.id)
        memset(ior->iov.id, 0x3f, sizeof ior->iov.id);
    strcpy(ior->iov.mount_point, hf3fs_mount_point);
    ior->iov.size = r->mem_size;
    ior->iov.numa = numa;
    ior->iorh = r;
    strcpy(ior->mount_point, hf3fs_mount_point);
    ior->for_read = for_read;
    ior->io_depth = io_depth;
    ior->timeout = timeout;
    ior->flags = flags;
    return 0;
}

void hf3fs_iordestroy(struct hf3fs_ior *ior)
{
    struct emu_ring *r = ring_of(ior, "hf3fs_iordestroy");
    if (!r)
        return;
    if (atomic_load(&r->in_prep) || atomic_load(&r->in_wait))
        violation("hf3fs_iordestroy: another thread is inside hf3fs_prep_io or "
                  "hf3fs_wait_for_ios on the ring");
    bool was = true;
    if (!atomic_compare_exchange_strong(&r->live, &was, false)) {
        violation("hf3fs_iordestroy: ior used after hf3fs_iordestroy (destroyed twice)");
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->work_cv);
    pthread_cond_broadcast(&r->done_cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->worker, NULL);
    /* I/Os never run: their iovs and fds are free. The arrays stay, for a
     * thread that may still be inside a call (count mode). */
    pthread_mutex_lock(&emu_lock);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->entries; i++)
        if (r->slots[i].state == SLOT_QUEUED)
            slot_release_locked(&r->slots[i]);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&emu_lock);
    munmap(r->mem, r->mem_size);
}

int hf3fs_io_entries(const struct hf3fs_ior *ior)
{
    struct emu_ring *r = ring_of(ior, "hf3fs_io_entries");
    return r ? r->entries : -EINVAL;
}

static int prep_io_checked(struct emu_ring *r, const struct hf3fs_iov *iov, bool read, void *ptr,
                           int fd, size_t off, uint64_t len, const void *userdata)
{
    if (r->prep_delay_us)
        usleep(r->prep_delay_us);
    if (read != r->for_read) {
        violation("hf3fs_prep_io: read=%d on a ring created with for_read=%d", read, r->for_read);
        return -EINVAL;
    }
    int rc = -EINVAL;
    pthread_mutex_lock(&emu_lock);
    struct emu_iov *v = iov ? find_iov_locked(iov->iovh) : NULL;
    uintptr_t p = (uintptr_t)ptr, base = v ? (uintptr_t)v->base : 0;
    struct emu_fd *f = NULL;
    if (!v) {
        violation("hf3fs_prep_io: iov not created by hf3fs_iovcreate or hf3fs_iovwrap");
    } else if (!v->live) {
        violation("hf3fs_prep_io: iov used after hf3fs_iovdestroy");
    } else if (iov->base != v->base || iov->size != v->size || iov->block_size != v->block_size) {
        violation("hf3fs_prep_io: iov's base, size or block_size changed since it was made");
    } else if (len == 0) {
        violation("hf3fs_prep_io: len 0");
    } else if (!ptr || p < base || p - base > v->size || len > v->size - (p - base)) {
        violation("hf3fs_prep_io: [ptr, ptr+len) not inside the iov (ptr = base%+lld, len "
                  "%llu, iov size %zu)",
                  (long long)(p - base), (unsigned long long)len, v->size);
    } else if (v->block_size > 0 &&
               (p - base) / v->block_size != (p - base + len - 1) / v->block_size) {
        violation("hf3fs_prep_io: I/O crosses a block_size boundary of the iov (iov offset %zu, "
                  "len %llu, block_size %zu)",
                  (size_t)(p - base), (unsigned long long)len, v->block_size);
    } else if (off > (size_t)INT64_MAX || len > (uint64_t)INT64_MAX - off) {
        violation("hf3fs_prep_io: off+len overflows (off %zu, len %llu)", off,
                  (unsigned long long)len);
    } else if (fd == INT_MIN || !(f = find_fd_locked(fd < 0 ? -fd : fd))) {
        violation("hf3fs_prep_io: fd %d not registered with hf3fs_reg_fd", fd);
    } else if ((read && f->accmode == O_WRONLY) || (!read && f->accmode == O_RDONLY)) {
        rc = -EACCES; /* as the library: an error, not a broken rule */
    } else {
        pthread_mutex_lock(&r->mu);
        if (r->busy == r->entries) {
            /* The library's answer when no slot is free: -EAGAIN (UsrbIo.cc of
             * deepseek-ai/3FS, hf3fs_prep_io: `if (!idx) { // ring is full
             * return -EAGAIN; }` after ring.slots.alloc()). */
            if (r->full_is_violation)
                violation("hf3fs_prep_io: ring capacity: more than %d I/Os prepared and not "
                          "reaped",
                          r->entries);
            else
                rc = -EAGAIN;
        } else {
            int idx = 0;
            while (r->slots[idx].state != SLOT_FREE)
                idx++;
            struct emu_slot *s = &r->slots[idx];
            s->state = SLOT_QUEUED;
            s->iov = v;
            s->fd = f;
            s->ptr = ptr;
            s->off = off;
            s->len = len;
            s->userdata = userdata;
            s->result = 0;
            v->inflight++;
            f->refs++;
            r->busy++;
            r->sq[(r->sq_head + r->sq_len) % r->entries] = idx;
            r->sq_len++;
            if (r->early)
                pthread_cond_signal(&r->work_cv);
            rc = idx;
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&emu_lock);
    return rc;
}

int hf3fs_prep_io(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov, bool read, void *ptr,
                  int fd, size_t off, uint64_t len, const void *userdata)
{
    struct emu_ring *r = ring_of(ior, "hf3fs_prep_io");
    if (!r)
        return -EINVAL;
    if (atomic_exchange(&r->in_prep, 1)) {
        violation("hf3fs_prep_io: two threads in hf3fs_prep_io on one ring at once (it is "
                  "not thread safe)");
        return -EINVAL; /* the flag is the other thread's */
    }
    int rc = prep_io_checked(r, iov, read, ptr, fd, off, len, userdata);
    atomic_store(&r->in_prep, 0);
    return rc;
}

int hf3fs_submit_ios(const struct hf3fs_ior *ior)
{
    struct emu_ring *r = ring_of(ior, "hf3fs_submit_ios");
    if (!r)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    r->sq_subm = r->sq_len;
    pthread_cond_signal(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int hf3fs_wait_for_ios(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes, int cqec,
                       int min_results, const struct timespec *abs_timeout)
{
    struct emu_ring *r = ring_of(ior, "hf3fs_wait_for_ios");
    if (!r)
        return -EINVAL;
    if (atomic_exchange(&r->in_wait, 1)) {
        violation("hf3fs_wait_for_ios: two threads in hf3fs_wait_for_ios on one ring at once");
        return -EINVAL;
    }
    if (!cqes || cqec <= 0) {
        atomic_store(&r->in_wait, 0);
        return -EINVAL; /* as the library */
    }
    if (min_results > cqec)
        min_results = cqec;
    if (min_results < 0)
        min_results = 0;
    pthread_mutex_lock(&r->mu);
    while (r->cq_len < min_results && !r->stop) {
        int e = abs_timeout ? pthread_cond_timedwait(&r->done_cv, &r->mu, abs_timeout)
                            : pthread_cond_wait(&r->done_cv, &r->mu);
        if (e != 0)
            break; /* timed out (or a bad timespec): what there is */
    }
    int n = r->cq_len < cqec ? r->cq_len : cqec;
    if (r->few) {
        /* fewer than are ready: min_results on one call, max(min_results, 1) on the next */
        int cap = (r->few_calls++ & 1) ? (min_results > 1 ? min_results : 1) : min_results;
        if (n > cap)
            n = cap;
    }
    for (int i = 0; i < n; i++) {
        int idx = r->cq[r->cq_head];
        r->cq_head = (r->cq_head + 1) % r->entries;
        r->cq_len--;
        struct emu_slot *s = &r->slots[idx];
        cqes[i].index = idx;
        cqes[i].reserved = 0;
        cqes[i].result = s->result;
        cqes[i].userdata = s->userdata;
        s->state = SLOT_FREE;
        r->busy--;
    }
    pthread_mutex_unlock(&r->mu);
    atomic_store(&r->in_wait, 0);
    return n;
}
