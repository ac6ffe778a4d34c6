/*
 * usrbio_abi.h — kvpage's own declarations of the part of 3FS's USRBIO ABI
 * (the user-space ring I/O of DeepSeek's 3FS) that kvpage uses: the three
 * structs, the constants, and one function-pointer type per function, for a
 * backend that finds libhf3fs_api at run time (dlopen/dlsym) and for the
 * emulation of tests/usrbio_emu.
 *
 * Written from the documented ABI of the public header src/lib/api/hf3fs_usrbio.h
 * of github.com/deepseek-ai/3FS (field order and types as published there, so
 * that the layout is the same); no 3FS code or header is included or copied.
 * The comments say what the published header documents.
 */
#ifndef KVPAGE_USRBIO_ABI_H
#define KVPAGE_USRBIO_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* f_type of statfs(2) on a 3FS mount ("hf3fs fff"). */
#define HF3FS_SUPER_MAGIC 0x8f3f5fff

/* flags of hf3fs_iorcreate4 */
#define HF3FS_IOR_ALLOW_READ_UNCOMMITTED 1
#define HF3FS_IOR_FORBID_READ_HOLES 2

/* Memory shared with the 3FS fuse daemon: the source or destination of I/Os
 * (and the memory of a ring). iovh is the library's handle, NULL for an iov
 * of hf3fs_iovwrap. */
struct hf3fs_iov {
    uint8_t *base;
    void *iovh;
    char id[16];
    char mount_point[256];
    size_t size;
    size_t block_size;
    int numa;
};

/* An I/O ring: I/Os prepared with hf3fs_prep_io, handed to the worker with
 * hf3fs_submit_ios (a hint: the worker may start earlier), reaped with
 * hf3fs_wait_for_ios. io_depth > 0: the worker takes exactly io_depth I/Os at
 * a time; 0: all that are prepared; < 0: at most -io_depth at a time. */
struct hf3fs_ior {
    struct hf3fs_iov iov;
    void *iorh;
    char mount_point[256];
    bool for_read;
    int io_depth;
    int priority;
    int timeout;
    uint64_t flags;
};

/* A completion: index is what hf3fs_prep_io returned for the I/O, result the
 * bytes transferred or -errno, userdata the prep_io argument. */
struct hf3fs_cqe {
    int32_t index;
    int32_t reserved;
    int64_t result;
    const void *userdata;
};

#if defined(__x86_64__)
/* The x86-64 (LP64, System V) layout, computed by hand from the field list. */
_Static_assert(offsetof(struct hf3fs_iov, base) == 0, "hf3fs_iov.base");
_Static_assert(offsetof(struct hf3fs_iov, iovh) == 8, "hf3fs_iov.iovh");
_Static_assert(offsetof(struct hf3fs_iov, id) == 16, "hf3fs_iov.id");
_Static_assert(offsetof(struct hf3fs_iov, mount_point) == 32, "hf3fs_iov.mount_point");
_Static_assert(offsetof(struct hf3fs_iov, size) == 288, "hf3fs_iov.size");
_Static_assert(offsetof(struct hf3fs_iov, block_size) == 296, "hf3fs_iov.block_size");
_Static_assert(offsetof(struct hf3fs_iov, numa) == 304, "hf3fs_iov.numa");
_Static_assert(sizeof(struct hf3fs_iov) == 312, "sizeof hf3fs_iov");

_Static_assert(offsetof(struct hf3fs_ior, iov) == 0, "hf3fs_ior.iov");
_Static_assert(offsetof(struct hf3fs_ior, iorh) == 312, "hf3fs_ior.iorh");
_Static_assert(offsetof(struct hf3fs_ior, mount_point) == 320, "hf3fs_ior.mount_point");
_Static_assert(offsetof(struct hf3fs_ior, for_read) == 576, "hf3fs_ior.for_read");
_Static_assert(offsetof(struct hf3fs_ior, io_depth) == 580, "hf3fs_ior.io_depth");
_Static_assert(offsetof(struct hf3fs_ior, priority) == 584, "hf3fs_ior.priority");
_Static_assert(offsetof(struct hf3fs_ior, timeout) == 588, "hf3fs_ior.timeout");
_Static_assert(offsetof(struct hf3fs_ior, flags) == 592, "hf3fs_ior.flags");
_Static_assert(sizeof(struct hf3fs_ior) == 600, "sizeof hf3fs_ior");

_Static_assert(offsetof(struct hf3fs_cqe, index) == 0, "hf3fs_cqe.index");
_Static_assert(offsetof(struct hf3fs_cqe, reserved) == 4, "hf3fs_cqe.reserved");
_Static_assert(offsetof(struct hf3fs_cqe, result) == 8, "hf3fs_cqe.result");
_Static_assert(offsetof(struct hf3fs_cqe, userdata) == 16, "hf3fs_cqe.userdata");
_Static_assert(sizeof(struct hf3fs_cqe) == 24, "sizeof hf3fs_cqe");
#endif

/*
 * The functions, as pointer types for dlsym. Return conventions (from the
 * header): extract_mount_point: strlen(mount point) + 1 (larger than size: the
 * buffer is too small), -1 when path is not on 3FS; is_hf3fs: true/false;
 * iovcreate, iovwrap, iorcreate4, submit_ios: 0 or -errno; reg_fd: <= 0 on
 * success, a positive errno on error (the fd must be registered before
 * prep_io); prep_io: the I/O's index (>= 0) or -errno, and NOT thread safe
 * (one thread per ring); wait_for_ios: the number of completions (>= 0, may
 * be fewer than are ready: call again) or -errno, abs_timeout on
 * CLOCK_REALTIME, NULL for none.
 */
typedef int (*kvp__hf3fs_extract_mount_point_fn)(char *hf3fs_mount_point, int size,
                                                 const char *path);
typedef bool (*kvp__hf3fs_is_hf3fs_fn)(int fd);
typedef int (*kvp__hf3fs_iovcreate_fn)(struct hf3fs_iov *iov, const char *hf3fs_mount_point,
                                       size_t size, size_t block_size, int numa);
typedef int (*kvp__hf3fs_iovwrap_fn)(struct hf3fs_iov *iov, void *base, const uint8_t id[16],
                                     const char *hf3fs_mount_point, size_t size, size_t block_size,
                                     int numa);
typedef void (*kvp__hf3fs_iovdestroy_fn)(struct hf3fs_iov *iov);
typedef size_t (*kvp__hf3fs_ior_size_fn)(int entries);
typedef int (*kvp__hf3fs_iorcreate4_fn)(struct hf3fs_ior *ior, const char *hf3fs_mount_point,
                                        int entries, bool for_read, int io_depth, int timeout,
                                        int numa, uint64_t flags);
typedef void (*kvp__hf3fs_iordestroy_fn)(struct hf3fs_ior *ior);
typedef int (*kvp__hf3fs_reg_fd_fn)(int fd, uint64_t flags);
typedef void (*kvp__hf3fs_dereg_fd_fn)(int fd);
typedef int (*kvp__hf3fs_io_entries_fn)(const struct hf3fs_ior *ior);
typedef int (*kvp__hf3fs_prep_io_fn)(const struct hf3fs_ior *ior, const struct hf3fs_iov *iov,
                                     bool read, void *ptr, int fd, size_t off, uint64_t len,
                                     const void *userdata);
typedef int (*kvp__hf3fs_submit_ios_fn)(const struct hf3fs_ior *ior);
typedef int (*kvp__hf3fs_wait_for_ios_fn)(const struct hf3fs_ior *ior, struct hf3fs_cqe *cqes,
                                          int cqec, int min_results,
                                          const struct timespec *abs_timeout);

#endif
