/*
 * The table of metadata backends: the rows of backends.h. Compiled twice
 * (CMakeLists.txt): for libkvpage.so, and with KVP_TEST_BACKENDS for the
 * unit tests' libkvpage_internal.a, whose table also has the test backends
 * of tests/backends/.
 */
#include <stddef.h>

#include "meta/backend.h"

#define KVP__META_BACKEND(ops) &ops,
const struct kvp__meta_ops *const kvp__meta_backends[] = {
#include "meta/backends.h"
    NULL,
};
