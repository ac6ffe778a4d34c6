/*
 * pagefile.c — the front end: open/close, batch validation, the choice of a
 * backend per direction and the dispatch to it (struct kvp__pf_backend,
 * pf_internal.h), buffer registration, getters.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/fs.h>

#include "pagefile/pf_internal.h"
#include "util/dirs.h"

#define PF_KNOWN_FLAGS                                                                             \
    (KVP_PAGEFILE_CREATE | KVP_PAGEFILE_DIRECT | KVP_PAGEFILE_ALIGNED | KVP_PAGEFILE_EXACT_SIZE |  \
     KVP_PAGEFILE_READONLY | KVP_PAGEFILE_MMAP_READS | KVP_PAGEFILE_MKDIR | KVP_PAGEFILE_NO_TAGS)
#define PF_MAX_ENTRIES (1u << 20)
#define PF_DEFAULT_CHUNK (1u << 20)
/* Options from the first published layout onwards: everything up to chunk_bytes. */
#define PF_OPTS_MIN_SIZE (offsetof(struct kvp_pagefile_opts, chunk_bytes) + sizeof(uint64_t))

/* The default row of the table: AUTO's choice where no backend claims the
 * cell, and the fallback of one that cannot start (pf_backends.def). */
#define PF_DEFAULT (kvp__pf_backends[0])

/* The backend of an id, or NULL (AUTO and unknown ids have none). */
static const struct kvp__pf_backend *pf_backend_of(int id)
{
    for (size_t i = 0; kvp__pf_backends[i]; i++)
        if (kvp__pf_backends[i]->id == id)
            return kvp__pf_backends[i];
    return NULL;
}

/* AUTO's backend for a direction: the first that claims the file, else the
 * first whose auto_for has the cell, else the default. */
static const struct kvp__pf_backend *pf_auto(int direct, int w,
                                             const struct kvp__pf_backend *claimed)
{
    if (claimed)
        return claimed;
    for (size_t i = 0; kvp__pf_backends[i]; i++)
        if (kvp__pf_backends[i]->auto_for & KVP__PF_AUTO_CELL(direct, w))
            return kvp__pf_backends[i];
    return PF_DEFAULT;
}

/* ---- errors ----------------------------------------------------------- */

/* The error filler of the front end and of the modules below it (pf_internal.h). */
#define pf_fail kvp__pf_fail

/* Sets err->limit after pf_fail; returns code. */
static int pf_limit(struct kvp_error *err, int code, int64_t limit)
{
    if (err)
        err->limit = limit;
    return code;
}

int kvp__pf_fail(struct kvp_error *err, int code, int rule, int64_t index, int64_t value,
                 const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    err->rule = rule;
    err->index = index;
    err->value = value;
    err->limit = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- options and open -------------------------------------------------- */

KVP_API void kvp_pagefile_opts_init(struct kvp_pagefile_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->opts_size = sizeof *opts;
    opts->entries = 8;
    opts->backend = KVP_PAGEFILE_BACKEND_AUTO;
    opts->mode = 0644;
}

/*
 * Sizes the file under an exclusive flock: two processes extending the same
 * new file to different sizes must end with the larger, never with a shrink.
 */
static int pf_size_file(struct kvp_pagefile *pf, const struct kvp_pagefile_opts *o,
                        struct kvp_error *err)
{
    struct stat st;
    int locked = flock(pf->fd, LOCK_EX) == 0; /* some file systems have no flock: best effort */
    int rc = 0;
    if (fstat(pf->fd, &st) != 0) {
        rc = pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "fstat %s: %s", pf->path, strerror(errno));
        goto out;
    }
    if (S_ISBLK(st.st_mode)) {
        uint64_t dev = 0;
        if (ioctl(pf->fd, BLKGETSIZE64, &dev) != 0) {
            rc = pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "BLKGETSIZE64 %s: %s", pf->path,
                         strerror(errno));
            goto out;
        }
        pf->size = o->size ? o->size : dev;
        pf->file_size = dev;
        if (dev < pf->size) {
            rc = pf_fail(err, -ENOSPC, KVP_RULE_ARG, -1, (int64_t)pf->size,
                         "size %" PRIu64 " exceeds the %" PRIu64 " bytes of block device %s",
                         pf->size, dev, pf->path);
            pf_limit(err, rc, (int64_t)dev);
        }
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0,
                     "%s is neither a regular file nor a block device", pf->path);
        goto out;
    }
    uint64_t cur = (uint64_t)st.st_size;
    if (o->size == 0) {
        if (cur == 0) {
            rc = pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0,
                         "size 0 asks for the existing file's size, but %s is empty", pf->path);
            goto out;
        }
        pf->size = cur;
    } else {
        pf->size = o->size;
    }
    if (cur > pf->size && (o->flags & KVP_PAGEFILE_EXACT_SIZE)) {
        rc =
            pf_fail(err, -EEXIST, KVP_RULE_ARG, -1, (int64_t)cur,
                    "%s is %" PRIu64 " bytes, larger than size %" PRIu64
                    "; kvpage never shrinks a page file (the pages past %" PRIu64 " would be lost)",
                    pf->path, cur, pf->size, pf->size);
        pf_limit(err, rc, (int64_t)pf->size);
        goto out;
    }
    if (cur < pf->size && (o->flags & KVP_PAGEFILE_READONLY)) {
        rc = pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)cur,
                     "%s is %" PRIu64 " bytes, smaller than size %" PRIu64
                     ", and a read-only handle cannot extend it",
                     pf->path, cur, pf->size);
        goto out;
    }
    pf->file_size = cur;
out:
    if (locked)
        flock(pf->fd, LOCK_UN);
    return rc;
}

/* Extends a regular file smaller than the handle's size (the last step of
 * the open: nothing after it can fail). Under the flock, from the size the
 * file has then: another process may have extended it meanwhile. */
static int pf_extend_file(struct kvp_pagefile *pf, struct kvp_error *err)
{
    if (pf->file_size >= pf->size)
        return 0;
    int locked = flock(pf->fd, LOCK_EX) == 0;
    int rc = 0;
    struct stat st;
    if (fstat(pf->fd, &st) != 0) {
        rc = pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "fstat %s: %s", pf->path, strerror(errno));
    } else if ((uint64_t)st.st_size < pf->size && ftruncate(pf->fd, (off_t)pf->size) != 0) {
        rc = pf_fail(err, -errno, KVP_RULE_IO, -1, (int64_t)pf->size,
                     "cannot extend %s to %" PRIu64 " bytes: %s", pf->path, pf->size,
                     strerror(errno));
    } else {
        pf->file_size = (uint64_t)st.st_size > pf->size ? (uint64_t)st.st_size : pf->size;
    }
    if (locked)
        flock(pf->fd, LOCK_UN);
    return rc;
}

#define pf_note kvp__pf_note

void kvp__pf_note(struct kvp_pagefile *pf, const char *fmt, ...)
{
    size_t used = strlen(pf->note);
    if (used >= sizeof pf->note - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pf->note + used, sizeof pf->note - used, fmt, ap);
    va_end(ap);
}

/* Starts be once for the handle (both directions may use it); 0 or its -errno, with why. */
static int pf_start_one(struct kvp_pagefile *pf, const struct kvp__pf_backend *be, char *why,
                        size_t whylen)
{
    for (int i = 0; i < 2; i++)
        if (pf->started[i] == be)
            return 0;
    void *state = NULL;
    int rc = be->start(pf, &state, why, whylen);
    if (rc == 0) {
        int k = pf->started[0] ? 1 : 0;
        pf->started[k] = be;
        pf->state[k] = state;
    }
    return rc;
}

/* The state of a started backend. */
static void *pf_state_of(const struct kvp_pagefile *pf, const struct kvp__pf_backend *be)
{
    return pf->started[0] == be ? pf->state[0] : pf->state[1];
}

static int pf_start_backends(struct kvp_pagefile *pf, struct kvp_error *err)
{
    int direct = (pf->flags & KVP_PAGEFILE_DIRECT) != 0;
    const struct kvp__pf_backend *claimed = NULL; /* AUTO: a backend that wants this file */
    for (size_t i = 0; kvp__pf_backends[i] && pf->backend_req == KVP_PAGEFILE_BACKEND_AUTO; i++)
        if (!claimed && kvp__pf_backends[i]->claims && kvp__pf_backends[i]->claims(pf))
            claimed = kvp__pf_backends[i];
    for (int w = 0; w < 2; w++)
        pf->be[w] = pf->backend_req == KVP_PAGEFILE_BACKEND_AUTO ? pf_auto(direct, w, claimed)
                                                                 : pf_backend_of(pf->backend_req);
    pf->xfer[0] = pf->xfer[1] = kvp__pf_xfer_plain;
    if (pf->flags & KVP_PAGEFILE_MMAP_READS) {
        /* the copies run on a backend that moves bytes with pf->xfer */
        if (!(pf->be[0]->caps & KVP__PF_CAP_XFER))
            pf->be[0] = PF_DEFAULT;
        int rc = kvp__pf_map_open(pf);
        if (rc != 0)
            pf_note(pf, "mmap reads: cannot map %s (mmap: %s), reads use pread; ", pf->path,
                    strerror(-rc));
        else
            pf->xfer[0] = kvp__pf_map_read;
    }

    /* Each backend once, reads' first. One that may be unavailable falls
     * back to the default when AUTO chose it, and fails the open when asked for. */
    for (int w = 0; w < 2; w++) {
        const struct kvp__pf_backend *be = pf->be[w];
        char why[200] = "";
        int rc = pf_start_one(pf, be, why, sizeof why);
        if (rc == 0)
            continue;
        if (!be->what)
            return pf_fail(err, rc, KVP_RULE_IO, -1, 0, "%s", why);
        if (pf->backend_req != KVP_PAGEFILE_BACKEND_AUTO)
            return pf_fail(err, rc, KVP_RULE_IO, -1, 0, "%s is unavailable (%s)", be->what, why);
        pf_note(pf, "auto: %s is unavailable (%s, errno %d); using %s", be->what, why, -rc,
                PF_DEFAULT->name);
        for (int d = 0; d < 2; d++)
            if (pf->be[d] == be)
                pf->be[d] = PF_DEFAULT;
        if ((rc = pf_start_one(pf, PF_DEFAULT, why, sizeof why)) != 0)
            return pf_fail(err, rc, KVP_RULE_IO, -1, 0, "%s", why);
    }
    for (int w = 0; w < 2; w++)
        pf->be_state[w] = pf_state_of(pf, pf->be[w]);
    if (pf->map)
        pf_note(pf, "mmap reads: buffered reads of cached pages copy out of a mapping; ");
    if (pf->note[0] == '\0' || (pf->flags & KVP_PAGEFILE_MMAP_READS)) {
        if (pf->backend_req == KVP_PAGEFILE_BACKEND_AUTO && claimed && pf->be[1] == claimed)
            pf_note(pf, "auto: %s reads, %s writes (%s wants this file)", pf->be[0]->name,
                    pf->be[1]->name, claimed->name);
        else if (pf->backend_req == KVP_PAGEFILE_BACKEND_AUTO)
            pf_note(pf, "auto: %s reads, %s writes for %s I/O (the faster per bench/io)",
                    pf->be[0]->name, pf->be[1]->name, direct ? "O_DIRECT" : "buffered");
        else
            pf_note(pf, "%s, as requested", kvp_pagefile_backend_name(pf->backend_req));
    }
    return 0;
}

static int pf_check_opts(const char *path, const struct kvp_pagefile_opts *o, struct kvp_error *err)
{
    if (!path || !*path)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "path is NULL or empty");
    if (!o)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0,
                       "opts is NULL (fill it with kvp_pagefile_opts_init)");
    if (o->opts_size < PF_OPTS_MIN_SIZE || o->opts_size > sizeof *o)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)o->opts_size,
                       "opts_size %zu is unknown (expected %zu: call kvp_pagefile_opts_init)",
                       o->opts_size, sizeof *o);
    if (o->bytes_per_page == 0)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "bytes_per_page must be > 0");
    if (o->entries == 0 || o->entries > PF_MAX_ENTRIES) {
        pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, o->entries, "entries %u is not in 1..%u",
                o->entries, PF_MAX_ENTRIES);
        return pf_limit(err, -EINVAL, PF_MAX_ENTRIES);
    }
    if (o->flags & ~PF_KNOWN_FLAGS)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, o->flags, "unknown flags 0x%x",
                       o->flags & ~PF_KNOWN_FLAGS);
    if (o->backend != KVP_PAGEFILE_BACKEND_AUTO && !pf_backend_of(o->backend))
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, o->backend, "unknown backend %d",
                       o->backend);
    if ((o->flags & KVP_PAGEFILE_MMAP_READS) && (o->flags & KVP_PAGEFILE_DIRECT))
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, o->flags,
                       "KVP_PAGEFILE_MMAP_READS is for buffered reads; O_DIRECT reads copy nothing "
                       "(drop one of the two flags)");
    if ((o->flags & KVP_PAGEFILE_MMAP_READS) && o->backend != KVP_PAGEFILE_BACKEND_AUTO &&
        !(pf_backend_of(o->backend)->caps & KVP__PF_CAP_XFER)) {
        char up[32];
        size_t k = 0;
        for (const char *c = PF_DEFAULT->name; *c && k + 1 < sizeof up; c++)
            up[k++] = (char)(*c >= 'a' && *c <= 'z' ? *c - 'a' + 'A' : *c);
        up[k] = '\0';
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, o->backend,
                       "KVP_PAGEFILE_MMAP_READS copies on the %s threads; ask for backend "
                       "AUTO or %s",
                       PF_DEFAULT->name, up);
    }
    if (o->size > (uint64_t)INT64_MAX || o->bytes_per_page > (uint64_t)INT64_MAX)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "size or bytes_per_page over 2^63");
    return 0;
}

KVP_API int kvp_pagefile_open(const char *path, const struct kvp_pagefile_opts *opts,
                              struct kvp_pagefile **out, struct kvp_error *err)
{
    if (!out)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "out is NULL");
    *out = NULL;
    int rc = pf_check_opts(path, opts, err);
    if (rc)
        return rc;
    /* Copy what this caller's (possibly older, shorter) struct holds over the defaults. */
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    memcpy(&o, opts, opts->opts_size);

    struct kvp_pagefile *pf = calloc(1, sizeof *pf);
    if (!pf)
        return pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    pf->fd = -1;
    /* What this open creates (directories, the file) it removes when it fails. */
    size_t made_dirs = 0;
    int created = 0, tags_made = 0;
    pf->path = strdup(path);
    if (!pf->path) {
        rc = pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
        goto fail;
    }
    pf->bytes_per_page = o.bytes_per_page;
    pf->entries = o.entries;
    pf->flags = o.flags;
    pf->mode = o.mode ? o.mode : 0644;
    pf->backend_req = o.backend;
    pf->threads_asked = o.threads;
    pf->queues_asked = o.queues;
    pf->mem_align = pf->off_align = 1;

    if ((o.flags & KVP_PAGEFILE_CREATE) && (o.flags & KVP_PAGEFILE_MKDIR) &&
        (rc = kvp__mkparents(path, &made_dirs, err)) != 0)
        goto fail;
    int oflags = O_CLOEXEC | ((o.flags & KVP_PAGEFILE_READONLY) ? O_RDONLY : O_RDWR);
    if (o.flags & KVP_PAGEFILE_DIRECT)
        oflags |= O_DIRECT;
    pf->fd = -1;
    if (o.flags & KVP_PAGEFILE_CREATE) {
        pf->fd = open(path, oflags | O_CREAT | O_EXCL, (mode_t)pf->mode);
        created = pf->fd >= 0;
    }
    if (pf->fd < 0 && (!(o.flags & KVP_PAGEFILE_CREATE) || errno == EEXIST))
        pf->fd = open(path, oflags, (mode_t)pf->mode);
    if (pf->fd < 0) {
        int e = errno;
        char *dir = e == ENOENT ? kvp__dirname(path) : NULL;
        struct stat dst;
        if (e == EINVAL && (o.flags & KVP_PAGEFILE_DIRECT))
            rc = pf_fail(err, -EINVAL, KVP_RULE_IO, -1, 0,
                         "the file system of %s refuses O_DIRECT (open: %s); open it without "
                         "KVP_PAGEFILE_DIRECT",
                         path, strerror(e));
        else if (dir && stat(dir, &dst) != 0 && errno == ENOENT)
            rc = pf_fail(err, -ENOENT, KVP_RULE_IO, -1, 0,
                         "cannot create %s: its directory %s does not exist (create it, or "
                         "ask for KVP_PAGEFILE_MKDIR)",
                         path, dir);
        else
            rc = pf_fail(err, -e, KVP_RULE_IO, -1, 0, "cannot open %s: %s", path, strerror(e));
        free(dir);
        goto fail;
    }
    if ((rc = pf_size_file(pf, &o, err)) != 0)
        goto fail;

    if (o.flags & KVP_PAGEFILE_DIRECT) {
        uint32_t ma = 0, oa = 0;
        kvp__pf_dio_align(pf->fd, &ma, &oa);
        if (oa == 0) {
            /* No statx answer: the logical block size of a device, or the page size. */
            int bs = 0;
            struct stat st;
            if (fstat(pf->fd, &st) == 0 && S_ISBLK(st.st_mode) &&
                ioctl(pf->fd, BLKSSZGET, &bs) == 0 && bs > 0)
                oa = (uint32_t)bs;
            else
                oa = 4096;
        }
        pf->off_align = oa;
        pf->mem_align = ma ? ma : oa;
    }
    uint64_t chunk = o.chunk_bytes ? o.chunk_bytes : PF_DEFAULT_CHUNK;
    chunk = (chunk + pf->off_align - 1) / pf->off_align * pf->off_align;
    pf->chunk_bytes = chunk;

    /* The tags sidecar after the backends (their note comes first), before
     * the extension: the open's last step. */
    if ((rc = pf_start_backends(pf, err)) != 0 ||
        (rc = kvp__pf_tags_open(pf, created, &tags_made, err)) != 0 ||
        (rc = pf_extend_file(pf, err)) != 0)
        goto fail;
    *out = pf;
    return 0;
fail:
    kvp__pf_tags_close(pf, tags_made);
    kvp_pagefile_close(pf);
    if (created)
        unlink(path);
    kvp__rmparents(path, made_dirs);
    return rc;
}

KVP_API void kvp_pagefile_close(struct kvp_pagefile *pf)
{
    if (!pf)
        return;
    for (int i = 2; i-- > 0;)
        if (pf->started[i])
            pf->started[i]->stop(pf, pf->state[i]);
    kvp__pf_map_close(pf);
    kvp__pf_tags_close(pf, 0);
    if (pf->fd >= 0)
        close(pf->fd);
    free(pf->path);
    free(pf);
}

/* ---- batches ----------------------------------------------------------- */

/* vec: ops are the whole ranges of vectored ops, whose segments were
 * checked already (their buf is unused: no NULL or address check). */
static int pf_validate(const struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                       const int64_t *results, int write, int vec, struct kvp_error *err)
{
    if (!pf)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "pagefile handle is NULL");
    if (n > pf->entries) {
        pf_fail(err, -EINVAL, KVP_RULE_TOO_MANY, -1, (int64_t)n,
                "batch of %zu operations exceeds entries %u", n, pf->entries);
        return pf_limit(err, -EINVAL, pf->entries);
    }
    if (n == 0)
        return 0;
    if (!ops || !results)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "%s is NULL with n = %zu",
                       !ops ? "ops" : "results", n);
    if (write && (pf->flags & KVP_PAGEFILE_READONLY))
        return pf_fail(err, -EBADF, KVP_RULE_ARG, -1, 0,
                       "write on a handle opened with KVP_PAGEFILE_READONLY");
    const int direct = (pf->flags & KVP_PAGEFILE_DIRECT) != 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t off = ops[i].offset;
        const uint64_t sz = ops[i].size;
        if (off < 0) {
            pf_fail(err, -EINVAL, KVP_RULE_OFFSET, (int64_t)i, off,
                    "op %zu: offset %" PRId64 " is negative", i, off);
            return pf_limit(err, -EINVAL, 0);
        }
        if (sz > pf->size || (uint64_t)off > pf->size - sz) {
            pf_fail(err, -EINVAL, KVP_RULE_OFFSET, (int64_t)i, off,
                    "op %zu: offset %" PRId64 " + size %" PRIu64 " exceeds file size %" PRIu64, i,
                    off, sz, pf->size);
            return pf_limit(err, -EINVAL, (int64_t)pf->size);
        }
        if (sz > pf->bytes_per_page) {
            pf_fail(err, -EINVAL, KVP_RULE_SIZE, (int64_t)i, (int64_t)sz,
                    "op %zu: size %" PRIu64 " exceeds bytes_per_page %" PRIu64, i, sz,
                    pf->bytes_per_page);
            return pf_limit(err, -EINVAL, (int64_t)pf->bytes_per_page);
        }
        if (!vec && !ops[i].buf && sz > 0)
            return pf_fail(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, 0,
                           "op %zu: buffer is NULL for size %" PRIu64, i, sz);
        if ((pf->flags & KVP_PAGEFILE_ALIGNED) && (uint64_t)off % pf->bytes_per_page) {
            pf_fail(err, -EINVAL, KVP_RULE_ALIGN, (int64_t)i, off,
                    "op %zu: offset %" PRId64 " is not a multiple of bytes_per_page %" PRIu64
                    " (a page index passed as an offset?)",
                    i, off, pf->bytes_per_page);
            return pf_limit(err, -EINVAL, (int64_t)pf->bytes_per_page);
        }
        if (direct) {
            if ((uint64_t)off % pf->off_align) {
                pf_fail(err, -EINVAL, KVP_RULE_ALIGN, (int64_t)i, off,
                        "op %zu: offset %" PRId64 " is not a multiple of %u, as O_DIRECT requires",
                        i, off, pf->off_align);
                return pf_limit(err, -EINVAL, pf->off_align);
            }
            if (sz % pf->off_align) {
                pf_fail(err, -EINVAL, KVP_RULE_ALIGN, (int64_t)i, (int64_t)sz,
                        "op %zu: size %" PRIu64 " is not a multiple of %u, as O_DIRECT requires", i,
                        sz, pf->off_align);
                return pf_limit(err, -EINVAL, pf->off_align);
            }
            if (!vec && (uintptr_t)ops[i].buf % pf->mem_align) {
                pf_fail(
                    err, -EINVAL, KVP_RULE_ALIGN, (int64_t)i, (int64_t)(uintptr_t)ops[i].buf,
                    "op %zu: buffer address %p is not aligned to %u bytes, as O_DIRECT requires", i,
                    ops[i].buf, pf->mem_align);
                return pf_limit(err, -EINVAL, pf->mem_align);
            }
        }
    }
    return 0;
}

/* The batch's return: 0, or the first op that did not move its size. */
static int pf_report(const struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                     const int64_t *results, int write, const struct kvp__pf_reject *rej,
                     struct kvp_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (results[i] >= 0 && (uint64_t)results[i] == ops[i].size)
            continue;
        if (rej && rej->index == (int64_t)i)
            return pf_fail(err, -EBADMSG, KVP_RULE_INTEGRITY, (int64_t)i, (int64_t)rej->slot,
                           "op %zu: page %" PRIu64 " of %s (offset %" PRId64
                           ") failed its integrity tag: %s; it is reported as missing",
                           i, rej->slot, pf->path, ops[i].offset, kvp__pf_tag_why(rej->why));
        if (results[i] < 0)
            return pf_fail(err, (int)results[i], KVP_RULE_IO, (int64_t)i, ops[i].offset,
                           "op %zu: %s of %" PRIu64 " bytes at offset %" PRId64 " failed: %s", i,
                           write ? "write" : "read", ops[i].size, ops[i].offset,
                           strerror((int)-results[i]));
        return pf_fail(err, -EIO, KVP_RULE_IO, (int64_t)i, ops[i].offset,
                       "op %zu: short %s, %" PRId64 " of %" PRIu64 " bytes at offset %" PRId64
                       " (end of file: was %s truncated by someone else?)",
                       i, write ? "write" : "read", results[i], ops[i].size, ops[i].offset,
                       pf->path);
    }
    return 0;
}

/* Runs ops (validated; for a vectored batch, the whole ranges of vops,
 * which run moves as its plan's plain operations) on the direction's
 * backend with the tags around them: a write marks its slots BAD, moves the
 * data, then tags them; a read moves the data, then checks it (rejected ops
 * become -EBADMSG, *rej the first). A plain batch's digests are computed by
 * the backend as it moves the bytes (b: its batch, given the tag arrays);
 * what it did not hash, and a vectored batch's, here. Returns 0 or -ENOMEM. */
static int pf_tagged(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                     const struct kvp_pagefile_vop *vops, const char *const *keys, size_t n,
                     int64_t *results, int write, struct kvp__pf_reject *rej,
                     struct kvp__pf_batch *b, void (*run)(struct kvp_pagefile *pf, void *arg),
                     void *arg)
{
    rej->index = -1;
    if (!pf->tags) {
        run(pf, arg);
        return 0;
    }
    /* digests, hashed bytes, wanted: on the stack for the usual batches */
    uint64_t small[2 * 64 + 64 / 8];
    size_t words = 2 * n + (n + 7) / 8;
    uint64_t *mem = words <= sizeof small / sizeof small[0] ? small : malloc(words * 8);
    if (!mem)
        return -ENOMEM;
    memset(mem, 0, words * 8);
    uint64_t *digests = mem, *bytes = mem + n;
    uint8_t *want = (uint8_t *)(mem + 2 * n);
    kvp__pf_tags_begin(pf, ops, n, write, want);
    if (b) {
        b->tag_want = want;
        b->tag_digest = digests;
        b->tag_bytes = bytes;
    } else if (write) {
        kvp__pf_tags_fill(ops, vops, n, want, digests, NULL);
    }
    run(pf, arg);
    if (b || !write)
        kvp__pf_tags_fill(ops, vops, n, want, digests, b ? bytes : NULL);
    if (write)
        kvp__pf_tags_wend(pf, ops, keys, n, results, want, digests);
    else
        kvp__pf_tags_rcheck(pf, ops, vops, keys, n, results, want, digests, rej);
    if (mem != small)
        free(mem);
    return 0;
}

static void pf_run_plain(struct kvp_pagefile *pf, void *arg)
{
    struct kvp__pf_batch *b = arg;
    pf->be[b->write]->run(pf, pf->be_state[b->write], b);
}

static int pf_batch(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                    const char *const *keys, size_t n, int64_t *results, int write,
                    struct kvp_error *err)
{
    int rc = pf_validate(pf, ops, n, results, write, 0, err);
    if (rc || n == 0)
        return rc;
    struct kvp__pf_batch b = {.ops = ops, .results = results, .n = n, .write = write};
    struct kvp__pf_reject rej;
    if (pf_tagged(pf, ops, NULL, keys, n, results, write, &rej, &b, pf_run_plain, &b) != 0)
        return pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    return pf_report(pf, ops, n, results, write, &rej, err);
}

KVP_API int kvp_pagefile_read(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                              int64_t *results, struct kvp_error *err)
{
    return pf_batch(pf, ops, NULL, n, results, 0, err);
}

KVP_API int kvp_pagefile_write(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops, size_t n,
                               int64_t *results, struct kvp_error *err)
{
    return pf_batch(pf, ops, NULL, n, results, 1, err);
}

KVP_API int kvp_pagefile_read_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                                    const char *const *keys, size_t n, int64_t *results,
                                    struct kvp_error *err)
{
    return pf_batch(pf, ops, keys, n, results, 0, err);
}

KVP_API int kvp_pagefile_write_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_op *ops,
                                     const char *const *keys, size_t n, int64_t *results,
                                     struct kvp_error *err)
{
    return pf_batch(pf, ops, keys, n, results, 1, err);
}

/* ---- vectored batches -------------------------------------------------- */

/* How a vectored op moves (pf_vplan). */
enum { PF_V_PLAIN, PF_V_VEC, PF_V_SPLIT, PF_V_STAGE };

/* The segments of vectored ops checked; whole[i] gets op i's file range
 * (its size the segments' sum, saturated so that an overflow is too big). */
static int pf_vcheck(const struct kvp_pagefile_vop *ops, size_t n, struct kvp_pagefile_op *whole,
                     struct kvp_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (ops[i].nsegs > KVP_PAGEFILE_MAX_SEGS) {
            pf_fail(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, (int64_t)ops[i].nsegs,
                    "op %zu: %zu segments, over %d", i, ops[i].nsegs, KVP_PAGEFILE_MAX_SEGS);
            return pf_limit(err, -EINVAL, KVP_PAGEFILE_MAX_SEGS);
        }
        if (ops[i].nsegs && !ops[i].segs)
            return pf_fail(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, 0,
                           "op %zu: segs is NULL with nsegs = %zu", i, ops[i].nsegs);
        uint64_t sum = 0;
        for (size_t k = 0; k < ops[i].nsegs; k++) {
            const struct kvp_pagefile_buf *g = &ops[i].segs[k];
            if (g->len && !g->base)
                return pf_fail(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, (int64_t)k,
                               "op %zu: segment %zu is NULL for %" PRIu64 " bytes", i, k, g->len);
            sum = g->len > UINT64_MAX - sum ? UINT64_MAX : sum + g->len;
        }
        whole[i] = (struct kvp_pagefile_op){ops[i].offset, NULL, sum};
    }
    return 0;
}

/* Whether op's segments may go to the file as they are (O_DIRECT: every
 * non-empty one aligned); *k gets the number of non-empty segments. */
static int pf_valigned(const struct kvp_pagefile *pf, const struct kvp_pagefile_vop *op, size_t *k)
{
    int ok = 1;
    *k = 0;
    for (size_t s = 0; s < op->nsegs; s++) {
        const struct kvp_pagefile_buf *g = &op->segs[s];
        if (!g->len)
            continue;
        ++*k;
        if ((uintptr_t)g->base % pf->mem_align || g->len % pf->off_align)
            ok = 0;
    }
    return ok;
}

/* The plan of a vectored batch: xops (and for a KVP__PF_CAP_VEC backend xvec) the plain
 * operations the backend runs, xown[j] the vectored op of xops[j]. */
struct pf_vplan {
    struct kvp_pagefile_op *xops;
    struct kvp__pf_vec *xvec;
    struct iovec *iov;
    size_t *xown;
    int64_t *xres;
    uint8_t *mode, *stop; /* per vectored op: PF_V_*, and done gathering */
    char *stage;
    size_t nx, niov;
};

static void pf_vplan_free(struct pf_vplan *p)
{
    free(p->mode);
    free(p->xops);
    free(p->stage);
}

/* The staging buffer of op i's whole range, gathered from its segments for a
 * write; *at advances past it. */
static char *pf_vstage(const struct kvp_pagefile *pf, const struct kvp_pagefile_vop *op,
                       uint64_t size, char **at, int write)
{
    char *buf = *at;
    uint64_t a = pf->mem_align > 64 ? pf->mem_align : 64;
    *at += (size + a - 1) / a * a;
    uint64_t o = 0;
    for (size_t s = 0; write && s < op->nsegs; s++) {
        if (op->segs[s].len)
            memcpy(buf + o, op->segs[s].base, op->segs[s].len);
        o += op->segs[s].len;
    }
    return buf;
}

/* Plans the batch: how each op moves, its plain operations, staging. */
static int pf_vplan_make(const struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                         const struct kvp_pagefile_op *whole, size_t n, int write,
                         struct pf_vplan *p)
{
    memset(p, 0, sizeof *p);
    uint8_t *mode = p->mode = malloc(2 * n);
    if (!mode)
        return -ENOMEM;
    p->stop = mode + n;
    const int vec_ok =
        (pf->be[write]->caps & KVP__PF_CAP_VEC) && pf->xfer[write] == kvp__pf_xfer_plain;
    size_t nx = 0, niov = 0;
    uint64_t staged = 0, a = pf->mem_align > 64 ? pf->mem_align : 64;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        int aligned = pf_valigned(pf, &ops[i], &k);
        mode[i] = !aligned ? PF_V_STAGE : k <= 1 ? PF_V_PLAIN : vec_ok ? PF_V_VEC : PF_V_SPLIT;
        nx += mode[i] == PF_V_SPLIT ? k : 1;
        niov += mode[i] == PF_V_VEC ? k : 0;
        staged += mode[i] == PF_V_STAGE ? (whole[i].size + a - 1) / a * a : 0;
    }
    size_t bytes = nx * (sizeof *p->xops + sizeof *p->xvec + sizeof *p->xown + sizeof *p->xres) +
                   niov * sizeof *p->iov;
    char *mem = malloc(bytes);
    p->xops = (struct kvp_pagefile_op *)mem;
    if (!mem || (staged && posix_memalign((void **)&p->stage, (size_t)a, (size_t)staged) != 0)) {
        pf_vplan_free(p);
        return -ENOMEM;
    }
    p->niov = niov;
    p->xops = (struct kvp_pagefile_op *)mem;
    p->xvec = (struct kvp__pf_vec *)(p->xops + nx);
    p->xown = (size_t *)(p->xvec + nx);
    p->xres = (int64_t *)(p->xown + nx);
    p->iov = (struct iovec *)(p->xres + nx);
    char *at = p->stage;
    struct iovec *iov = p->iov;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_pagefile_vop *op = &ops[i];
        int64_t off = op->offset;
        struct kvp__pf_vec v = {iov, 0};
        if (mode[i] == PF_V_STAGE) {
            p->xvec[j] = (struct kvp__pf_vec){NULL, 0};
            p->xown[j] = i;
            p->xops[j++] = (struct kvp_pagefile_op){
                off, pf_vstage(pf, op, whole[i].size, &at, write), whole[i].size};
            continue;
        }
        if (mode[i] == PF_V_PLAIN) { /* the one non-empty segment, or none */
            p->xops[j] = (struct kvp_pagefile_op){off, NULL, 0};
            for (size_t s = 0; s < op->nsegs; s++)
                if (op->segs[s].len)
                    p->xops[j] = (struct kvp_pagefile_op){off, op->segs[s].base, op->segs[s].len};
            p->xvec[j] = (struct kvp__pf_vec){NULL, 0};
            p->xown[j++] = i;
            continue;
        }
        for (size_t s = 0; s < op->nsegs; s++) {
            const struct kvp_pagefile_buf *g = &op->segs[s];
            if (!g->len)
                continue;
            if (mode[i] == PF_V_VEC) {
                *iov++ = (struct iovec){g->base, (size_t)g->len};
                v.n++;
                continue;
            }
            p->xvec[j] = (struct kvp__pf_vec){NULL, 0};
            p->xown[j] = i;
            p->xops[j++] = (struct kvp_pagefile_op){off, g->base, g->len};
            off += (int64_t)g->len;
        }
        if (mode[i] == PF_V_VEC) {
            p->xvec[j] = v;
            p->xown[j] = i;
            p->xops[j++] = (struct kvp_pagefile_op){off, NULL, whole[i].size};
        }
    }
    p->nx = j;
    return 0;
}

/* Each op's result from its plain operations' (in file order): its bytes,
 * the leading part moved before a short one, or the first error; a staged
 * read's bytes are scattered into its segments. */
static void pf_vgather(const struct kvp_pagefile_vop *ops, size_t n, const struct pf_vplan *p,
                       int write, int64_t *results)
{
    uint8_t *stop = p->stop;
    memset(stop, 0, n);
    for (size_t i = 0; i < n; i++)
        results[i] = 0;
    for (size_t j = 0; j < p->nx; j++) {
        size_t i = p->xown[j];
        if (stop[i])
            continue;
        int64_t r = p->xres[j];
        if (r < 0) {
            results[i] = r, stop[i] = 1;
            continue;
        }
        results[i] += r;
        stop[i] = (uint64_t)r < p->xops[j].size;
        if (p->mode[i] != PF_V_STAGE || write)
            continue;
        uint64_t o = 0;
        for (size_t s = 0; s < ops[i].nsegs && o < (uint64_t)r; s++) {
            uint64_t len =
                ops[i].segs[s].len < (uint64_t)r - o ? ops[i].segs[s].len : (uint64_t)r - o;
            if (len)
                memcpy(ops[i].segs[s].base, (char *)p->xops[j].buf + o, len);
            o += len;
        }
    }
}

/* A vectored batch's plain operations, run in batches of at most `entries`. */
struct pf_vrun {
    const struct pf_vplan *p;
    const struct kvp_pagefile_vop *ops;
    size_t n;
    int64_t *results;
    int write;
};

static void pf_run_vplan(struct kvp_pagefile *pf, void *arg)
{
    struct pf_vrun *v = arg;
    const struct pf_vplan *p = v->p;
    /* A split op is several plain ones: batches of at most `entries`. */
    for (size_t lo = 0; lo < p->nx; lo += pf->entries) {
        size_t m = p->nx - lo < pf->entries ? p->nx - lo : pf->entries;
        struct kvp__pf_batch b = {.ops = p->xops + lo,
                                  .results = p->xres + lo,
                                  .n = m,
                                  .write = v->write,
                                  .vec = p->niov ? p->xvec + lo : NULL};
        pf->be[v->write]->run(pf, pf->be_state[v->write], &b);
    }
    pf_vgather(v->ops, v->n, p, v->write, v->results);
}

static int pf_vbatch(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                     const char *const *keys, size_t n, int64_t *results, int write,
                     struct kvp_error *err)
{
    if (!pf || n > pf->entries || n == 0) /* the handle, the batch's size */
        return pf_validate(pf, NULL, n, results, write, 1, err);
    if (!ops || !results)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "%s is NULL with n = %zu",
                       !ops ? "ops" : "results", n);
    struct kvp_pagefile_op *whole = malloc(n * sizeof *whole);
    if (!whole)
        return pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    struct pf_vplan p;
    int rc = pf_vcheck(ops, n, whole, err);
    if (!rc)
        rc = pf_validate(pf, whole, n, results, write, 1, err);
    if (!rc && pf_vplan_make(pf, ops, whole, n, write, &p) != 0)
        rc = pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    if (rc) {
        free(whole);
        return rc;
    }
    struct pf_vrun v = {&p, ops, n, results, write};
    struct kvp__pf_reject rej;
    if (pf_tagged(pf, whole, ops, keys, n, results, write, &rej, NULL, pf_run_vplan, &v) != 0)
        rc = pf_fail(err, -ENOMEM, KVP_RULE_IO, -1, 0, "out of memory");
    pf_vplan_free(&p);
    if (!rc)
        rc = pf_report(pf, whole, n, results, write, &rej, err);
    free(whole);
    return rc;
}

KVP_API int kvp_pagefile_readv(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                               size_t n, int64_t *results, struct kvp_error *err)
{
    return pf_vbatch(pf, ops, NULL, n, results, 0, err);
}

KVP_API int kvp_pagefile_writev(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                size_t n, int64_t *results, struct kvp_error *err)
{
    return pf_vbatch(pf, ops, NULL, n, results, 1, err);
}

KVP_API int kvp_pagefile_readv_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                     const char *const *keys, size_t n, int64_t *results,
                                     struct kvp_error *err)
{
    return pf_vbatch(pf, ops, keys, n, results, 0, err);
}

KVP_API int kvp_pagefile_writev_keyed(struct kvp_pagefile *pf, const struct kvp_pagefile_vop *ops,
                                      const char *const *keys, size_t n, int64_t *results,
                                      struct kvp_error *err)
{
    return pf_vbatch(pf, ops, keys, n, results, 1, err);
}

KVP_API int kvp_pagefile_flush(struct kvp_pagefile *pf, struct kvp_error *err)
{
    if (!pf)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "pagefile handle is NULL");
    while (fsync(pf->fd) != 0) {
        if (errno == EINTR)
            continue;
        return pf_fail(err, -errno, KVP_RULE_IO, -1, 0, "fsync %s: %s", pf->path, strerror(errno));
    }
    return kvp__pf_tags_sync(pf, err);
}

KVP_API int kvp_pagefile_register_buffers(struct kvp_pagefile *pf,
                                          const struct kvp_pagefile_buf *bufs, size_t n,
                                          struct kvp_error *err)
{
    if (!pf)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "pagefile handle is NULL");
    if (n == 0 || !bufs)
        return pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "no buffers given");
    for (size_t i = 0; i < n; i++)
        if (!bufs[i].base || bufs[i].len == 0)
            return pf_fail(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, (int64_t)bufs[i].len,
                           "buffer %zu is NULL or empty", i);
    /* Every started backend that registers memory; one failing undoes the others. */
    for (int i = 0; i < 2; i++) {
        const struct kvp__pf_backend *be = pf->started[i];
        if (!be || !be->reg)
            continue;
        int rc = be->reg(pf, pf->state[i], bufs, n, err);
        if (rc != 0) {
            for (int j = 0; j < i; j++)
                if (pf->started[j] && pf->started[j]->unreg)
                    pf->started[j]->unreg(pf, pf->state[j]);
            return rc;
        }
    }
    return 0;
}

KVP_API int kvp_pagefile_unregister_buffers(struct kvp_pagefile *pf)
{
    for (int i = 0; pf && i < 2; i++)
        if (pf->started[i] && pf->started[i]->unreg)
            pf->started[i]->unreg(pf, pf->state[i]);
    return 0;
}

/* Huge page size of x86-64 and of arm64 with 4 KiB pages (THP's PMD size). */
#define PF_HUGE_PAGE ((size_t)2 << 20)

KVP_API void *kvp_pagefile_alloc(struct kvp_pagefile *pf, uint64_t size, struct kvp_error *err)
{
    if (!pf) {
        pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, 0, "pagefile handle is NULL");
        return NULL;
    }
    if (size == 0 || size > (uint64_t)SIZE_MAX / 2) {
        pf_fail(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)size,
                "size %" PRIu64 " is not a size to allocate", size);
        return NULL;
    }
    for (int i = 0; i < 2; i++)
        if (pf->started[i] && pf->started[i]->alloc)
            return pf->started[i]->alloc(pf, pf->state[i], size, err);
    size_t align = pf->mem_align > 4096 ? pf->mem_align : 4096;
    /* A buffer of a huge page or more is aligned to one and asks for huge
     * pages: each first touch of a 4 KiB page can cost microseconds (some
     * virtual machines: ~5 us, a fresh 1 GiB buffer read at ~1 GB/s), one
     * per 2 MiB page is far cheaper. A request: without THP it is ignored. */
    int huge = size >= PF_HUGE_PAGE;
    if (huge && align < PF_HUGE_PAGE)
        align = PF_HUGE_PAGE;
    size_t len = (size_t)((size + align - 1) / align * align);
    void *p = NULL;
    int rc = posix_memalign(&p, align, len);
    if (rc != 0) {
        pf_fail(err, -rc, KVP_RULE_IO, -1, (int64_t)size, "cannot allocate %" PRIu64 " bytes: %s",
                size, strerror(rc));
        return NULL;
    }
    if (huge)
        (void)madvise(p, len, MADV_HUGEPAGE);
    memset(p, 0, (size_t)size);
    return p;
}

KVP_API void kvp_pagefile_free(struct kvp_pagefile *pf, void *ptr)
{
    if (!pf || !ptr)
        return;
    for (int i = 0; i < 2; i++)
        if (pf->started[i] && pf->started[i]->free && pf->started[i]->free(pf, pf->state[i], ptr))
            return;
    free(ptr);
}

/* ---- getters ----------------------------------------------------------- */

/* What the started backends know (threads, queues, registered buffers); the rest zero. */
static struct kvp_pagefile_info pf_backends_info(const struct kvp_pagefile *pf)
{
    struct kvp_pagefile_info info;
    memset(&info, 0, sizeof info);
    info.info_size = sizeof info;
    for (int i = 0; i < 2; i++)
        if (pf->started[i] && pf->started[i]->info)
            pf->started[i]->info(pf, pf->state[i], &info);
    return info;
}

KVP_API const char *kvp_pagefile_path(const struct kvp_pagefile *pf)
{
    return pf->path;
}
KVP_API uint64_t kvp_pagefile_size(const struct kvp_pagefile *pf)
{
    return pf->size;
}
KVP_API uint64_t kvp_pagefile_file_size(const struct kvp_pagefile *pf)
{
    return pf->file_size;
}
KVP_API uint64_t kvp_pagefile_bytes_per_page(const struct kvp_pagefile *pf)
{
    return pf->bytes_per_page;
}
KVP_API uint32_t kvp_pagefile_entries(const struct kvp_pagefile *pf)
{
    return pf->entries;
}
KVP_API uint32_t kvp_pagefile_flags(const struct kvp_pagefile *pf)
{
    return pf->flags;
}
KVP_API int kvp_pagefile_backend_requested(const struct kvp_pagefile *pf)
{
    return pf->backend_req;
}
KVP_API int kvp_pagefile_backend(const struct kvp_pagefile *pf, int write)
{
    return pf->be[write ? 1 : 0]->id;
}
KVP_API const char *kvp_pagefile_backend_name(int backend)
{
    if (backend == KVP_PAGEFILE_BACKEND_AUTO)
        return "auto";
    const struct kvp__pf_backend *be = pf_backend_of(backend);
    return be ? be->name : "?";
}
KVP_API const char *kvp_pagefile_backend_description(int backend)
{
    if (backend == KVP_PAGEFILE_BACKEND_AUTO)
        return "the best of the others for the file (the default)";
    const struct kvp__pf_backend *be = pf_backend_of(backend);
    return be ? be->description : "?";
}

KVP_API const char *kvp_pagefile_flag_name(uint32_t flag)
{
    static const struct {
        uint32_t flag;
        const char *name;
    } names[] = {
        {KVP_PAGEFILE_CREATE, "create"},     {KVP_PAGEFILE_DIRECT, "direct"},
        {KVP_PAGEFILE_ALIGNED, "aligned"},   {KVP_PAGEFILE_EXACT_SIZE, "exact_size"},
        {KVP_PAGEFILE_READONLY, "readonly"}, {KVP_PAGEFILE_MMAP_READS, "mmap_reads"},
        {KVP_PAGEFILE_MKDIR, "mkdir"},       {KVP_PAGEFILE_NO_TAGS, "no_tags"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].flag == flag)
            return names[i].name;
    return NULL;
}
KVP_API const char *kvp_pagefile_backend_note(const struct kvp_pagefile *pf)
{
    return pf->note;
}
KVP_API uint32_t kvp_pagefile_threads(const struct kvp_pagefile *pf)
{
    return pf_backends_info(pf).threads;
}
KVP_API uint32_t kvp_pagefile_queues(const struct kvp_pagefile *pf)
{
    return pf_backends_info(pf).queues;
}
KVP_API uint32_t kvp_pagefile_mode(const struct kvp_pagefile *pf)
{
    return pf->mode;
}
KVP_API uint64_t kvp_pagefile_chunk_bytes(const struct kvp_pagefile *pf)
{
    return pf->chunk_bytes;
}
KVP_API uint32_t kvp_pagefile_direct_mem_align(const struct kvp_pagefile *pf)
{
    return pf->mem_align;
}
KVP_API uint32_t kvp_pagefile_direct_offset_align(const struct kvp_pagefile *pf)
{
    return pf->off_align;
}
KVP_API uint32_t kvp_pagefile_registered_buffers(const struct kvp_pagefile *pf)
{
    return pf_backends_info(pf).registered_buffers;
}

/* The first published layout: everything up to backend_note. */
#define PF_INFO_MIN_SIZE (offsetof(struct kvp_pagefile_info, backend_note) + sizeof(const char *))

KVP_API int kvp_pagefile_info(const struct kvp_pagefile *pf, struct kvp_pagefile_info *info)
{
    if (!pf || !info || info->info_size < PF_INFO_MIN_SIZE)
        return -EINVAL;
    struct kvp_pagefile_info full = pf_backends_info(pf);
    full.path = pf->path;
    full.size = pf->size;
    full.file_size = pf->file_size;
    full.bytes_per_page = pf->bytes_per_page;
    full.chunk_bytes = pf->chunk_bytes;
    full.entries = pf->entries;
    full.flags = pf->flags;
    full.mode = pf->mode;
    full.backend_requested = pf->backend_req;
    full.backend[0] = pf->be[0]->id;
    full.backend[1] = pf->be[1]->id;
    full.direct_mem_align = pf->mem_align;
    full.direct_offset_align = pf->off_align;
    full.backend_note = pf->note;
    full.alloc_zero_copy = pf->be[0]->alloc || pf->be[1]->alloc;
    kvp__pf_tags_info(pf, &full);
    size_t n = info->info_size < sizeof full ? info->info_size : sizeof full;
    full.info_size = n;
    memcpy(info, &full, n);
    return 0;
}
