#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "util/error.h"

KVP_API const char *kvp_strerror(int code)
{
    if (code > 0)
        code = -code;
    switch (code) {
    case 0:
        return "success";
    case -EUCLEAN:
        return "invariant violated (structure needs cleaning)";
    default:
        /* strerror's table is static in glibc; the buffer variant is not needed. */
        return strerror(-code);
    }
}

void kvp__set_err(struct kvp_error *err, int code, int rule, int64_t index, int64_t value,
                  int64_t limit, const char *fmt, ...)
{
    if (!err)
        return;
    err->code = code;
    err->rule = rule;
    err->index = index;
    err->value = value;
    err->limit = limit;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}
