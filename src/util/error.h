/* Filling a caller's struct kvp_error (kvpage/error.h): every part of the
 * library reports bad input the same way. Internal. */
#ifndef KVP_UTIL_ERROR_H
#define KVP_UTIL_ERROR_H

#include <stdint.h>
#include "kvpage/error.h"

/* Fills err (when non-NULL): code, rule, index, value, limit, msg. */
void kvp__set_err(struct kvp_error *err, int code, int rule, int64_t index, int64_t value,
                  int64_t limit, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#endif
