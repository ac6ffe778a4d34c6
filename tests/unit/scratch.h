/*
 * scratch.h — a test's scratch directory: made new (mkdtemp) under /tmp, or
 * on a real disk for the tests that need one (O_DIRECT refuses tmpfs:
 * $KVP_TEST_DIR, else /tmp unless it is tmpfs, else /var/tmp), and removed
 * with everything below it at the end.
 */
#ifndef KVP_TEST_SCRATCH_H
#define KVP_TEST_SCRATCH_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>

/* dir (cap bytes) becomes a new directory BASE/kvp_NAME_XXXXXX; a test that
 * cannot have one cannot run: exit status 2. */
static inline void scratch_make_in(char *dir, size_t cap, const char *base, const char *name)
{
    snprintf(dir, cap, "%s/kvp_%s_XXXXXX", base, name);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* The same under /tmp, or with real_disk on a real disk. */
static inline void scratch_make(char *dir, size_t cap, const char *name, int real_disk)
{
    const char *base = real_disk ? getenv("KVP_TEST_DIR") : NULL;
    struct statfs sf;
    if (!base)
        base = !real_disk || (statfs("/tmp", &sf) == 0 && sf.f_type != TMPFS_MAGIC) ? "/tmp"
                                                                                    : "/var/tmp";
    scratch_make_in(dir, cap, base, name);
}

static inline int scratch_remove_one(const char *p, const struct stat *st, int type,
                                     struct FTW *ftw)
{
    (void)st, (void)type, (void)ftw;
    remove(p);
    return 0;
}

/* Removes dir and everything below it (nothing when it is not there). */
static inline void scratch_remove(const char *dir)
{
    nftw(dir, scratch_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/*
 * For the tests run again over the USRBIO backend (CMake sets
 * KVPAGE_USRBIO_LIB to tests/usrbio_emu's library): dir becomes the emulated
 * 3FS mount, whose registration answers as 3FS's hf3fs_reg_fd does. With
 * auto_as_without, KVPAGE_USRBIO=0 makes AUTO choose as it does without 3FS
 * (the test asks for USRBIO by name); else AUTO picks USRBIO there.
 */
static inline void scratch_usrbio_mount(const char *dir, int auto_as_without)
{
    setenv("KVPAGE_USRBIO_EMU_MOUNT", dir, 1);
    if (auto_as_without)
        setenv("KVPAGE_USRBIO", "0", 1);
    setenv("KVPAGE_USRBIO_EMU_REG_RESULT", "dup", 1);
}

#endif
