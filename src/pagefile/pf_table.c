/*
 * pf_table.c — the table of page-I/O backends (pf_internal.h), from the rows
 * of pf_backends.def. Built twice (CMakeLists.txt): for libkvpage.so as it
 * is, and for kvpage_internal with KVP_TEST_BACKENDS, where the test rows
 * (tests/backends) count too.
 */
#include "pagefile/pf_internal.h"

#ifdef KVP_TEST_BACKENDS
#define KVP__PF_TEST_ROW(be) KVP__PF_ROW(be)
#else
#define KVP__PF_TEST_ROW(be)
#endif

#define KVP__PF_ROW(be) extern const struct kvp__pf_backend be;
#include "pagefile/pf_backends.def"
#undef KVP__PF_ROW

const struct kvp__pf_backend *const kvp__pf_backends[] = {
#define KVP__PF_ROW(be) &be,
#include "pagefile/pf_backends.def"
#undef KVP__PF_ROW
    NULL,
};
