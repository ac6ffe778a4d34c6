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

/* By enum kvp_rule: the names the server's error replies and Python use. */
static const char *const RULE_NAMES[] = {
    [KVP_RULE_NONE] = "none",
    [KVP_RULE_RANK_NOT_INIT] = "rank_not_init",
    [KVP_RULE_RANK_RANGE] = "rank_range",
    [KVP_RULE_NUM_PAGES] = "num_pages",
    [KVP_RULE_RESIZE_HELD] = "resize_held",
    [KVP_RULE_KEY] = "key",
    [KVP_RULE_CONFIRM_PAGE] = "confirm_page",
    [KVP_RULE_RELEASE_PAGE] = "release_page",
    [KVP_RULE_HELD_BY_OTHER] = "held_by_other",
    [KVP_RULE_NAMESPACE] = "namespace",
    [KVP_RULE_TOO_MANY] = "too_many",
    [KVP_RULE_IO] = "io",
    [KVP_RULE_OFFSET] = "offset",
    [KVP_RULE_SIZE] = "size",
    [KVP_RULE_ALIGN] = "align",
    [KVP_RULE_ARG] = "arg",
    [KVP_RULE_UNAVAILABLE] = "unavailable",
    [KVP_RULE_OWNER] = "owner",
    [KVP_RULE_INTEGRITY] = "integrity",
};
#define NRULES (sizeof RULE_NAMES / sizeof *RULE_NAMES)
_Static_assert(NRULES == KVP_RULE_INTEGRITY + 1, "a rule without a name");

KVP_API const char *kvp_rule_name(int rule)
{
    return rule >= 0 && (size_t)rule < NRULES ? RULE_NAMES[rule] : NULL;
}

KVP_API int kvp_rule_from_name(const char *name, size_t len)
{
    for (size_t i = 0; name && i < NRULES; i++)
        if (strlen(RULE_NAMES[i]) == len && !memcmp(RULE_NAMES[i], name, len))
            return (int)i;
    return -1;
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
