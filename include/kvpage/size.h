/*
 * kvpage/size.h — sizes as kvpage's command line writes them ("4G",
 * "2MiB", "512KB", "4096"), for programs and bindings that take the same
 * strings (the Python package's PageFile, Store and compat.Hf3fsClient).
 */
#ifndef KVPAGE_SIZE_H
#define KVPAGE_SIZE_H

#include <stdint.h>

#include "kvpage/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Reads the size in s: a decimal whole number of bytes, optionally followed
 * by K, M, G or T (either case; powers of 1024) and then optionally "iB" or
 * "B" ("4G", "4g", "4GB", "4GiB" are 4 << 30). Nothing else: no sign, space,
 * fraction, "0x", or other suffix.
 *
 * s: NUL-terminated; read only. out: receives the number of bytes; left as
 * it was on failure.
 * Returns 0, or -EINVAL: s or out is NULL, s is not a size, or its value
 * does not fit in 64 bits.
 * Thread safety: any thread at any time (it keeps no state).
 */
KVP_API int kvp_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif
