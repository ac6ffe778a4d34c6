/*
 * pf_dio.c — O_DIRECT alignment from statx(STATX_DIOALIGN).
 *
 * Its own file because glibc 2.36's struct statx lacks the stx_dio_* fields:
 * this uses the kernel's definition, which cannot share a unit with <sys/stat.h>.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/stat.h>

#include "pagefile/pf_internal.h"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

void kvp__pf_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align)
{
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    *mem_align = *off_align = 0;
    /* Kernels before 6.1 ignore the mask bit and leave the fields zero. */
    if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0)
        return;
    if (!(stx.stx_mask & STATX_DIOALIGN))
        return;
    *mem_align = stx.stx_dio_mem_align;
    *off_align = stx.stx_dio_offset_align;
}
