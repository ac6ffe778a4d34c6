/*
 * rules.c — the metadata rules' refusals in one set of words (rules.h),
 * shared by the interface, the backends (local.c, redis.c, pins.c) and the
 * server's dialects. The server binary reaches only the library's public
 * API, so it compiles its own copy of this file (CMakeLists.txt): it uses
 * nothing but the C library.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvpage/meta.h"
#include "meta/rules.h"

static void set(struct kvp_error *err, int code, int rule, int64_t index, int64_t value,
                int64_t limit, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void set(struct kvp_error *err, int code, int rule, int64_t index, int64_t value,
                int64_t limit, const char *fmt, ...)
{
    if (!err)
        return;
    *err = (struct kvp_error){code, rule, index, value, limit, ""};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

int kvp__check_num_pages(uint64_t num_pages, struct kvp_error *err)
{
    if (num_pages >= 1 && num_pages <= KVP_MAX_PAGES)
        return 0;
    set(err, -EINVAL, KVP_RULE_NUM_PAGES, -1, (int64_t)num_pages, KVP_MAX_PAGES,
        num_pages < 1 ? "num_pages must be a positive integer"
                      : "num_pages must be at most 2147483647");
    return -EINVAL;
}

int kvp__err_rank_not_init(struct kvp_error *err, int64_t rank)
{
    set(err, -ENOENT, KVP_RULE_RANK_NOT_INIT, -1, rank, 0, "Rank %lld not initialized",
        (long long)rank);
    return -ENOENT;
}

void kvp__msg_resize_held(char *buf, size_t len, uint32_t rank, int64_t old, int64_t asked)
{
    snprintf(buf, len,
             "Rank %u already initialized with %lld pages; refusing to change to %lld pages "
             "while it holds data",
             rank, (long long)old, (long long)asked);
}

int kvp__err_resize_held(struct kvp_error *err, uint32_t rank, int64_t old, int64_t asked)
{
    set(err, -EEXIST, KVP_RULE_RESIZE_HELD, -1, old, asked, "%s", "");
    if (err) /* the same sentence as the dialects' 409 */
        kvp__msg_resize_held(err->msg, sizeof err->msg, rank, old, asked);
    return -EEXIST;
}

int kvp__err_held_by_other(struct kvp_error *err, int64_t i, int64_t page, uint32_t rank)
{
    set(err, -EEXIST, KVP_RULE_HELD_BY_OTHER, i, page, 0, "page %lld on rank %u holds another key",
        (long long)page, rank);
    return -EEXIST;
}

int kvp__err_page_range(struct kvp_error *err, int rule, const char *what, int64_t i, int64_t page,
                        uint32_t num_pages)
{
    set(err, -EINVAL, rule, i, page, num_pages, "%s %lld: page %lld is outside [0, %u)", what,
        (long long)i, (long long)page, num_pages);
    return -EINVAL;
}

int kvp__err_too_many_ranks(struct kvp_error *err, int code, int64_t count, int limit)
{
    set(err, code, KVP_RULE_TOO_MANY, -1, count, limit,
        "too many ranks in this namespace (limit %d)", limit);
    return code;
}

int kvp__err_no_namespace(struct kvp_error *err, int code, const char *dep, size_t dlen,
                          const char *pool, size_t plen)
{
    set(err, code, KVP_RULE_NONE, -1, 0, 0, "no namespace %.*s/%.*s", (int)dlen, dep, (int)plen,
        pool);
    return code;
}

int kvp__err_oom(struct kvp_error *err, int code)
{
    set(err, code, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    return code;
}

int kvp__err_pin_limit(struct kvp_error *err, uint64_t news, uint64_t total, uint64_t limit,
                       double ratio, uint32_t rank, uint32_t num_pages)
{
    set(err, -ENOSPC, KVP_RULE_TOO_MANY, -1, (int64_t)total, (int64_t)limit,
        "pinning %" PRIu64 " more keys would pin %" PRIu64
        " keys of the namespace, over the %" PRIu64
        " allowed (--max-pinned-ratio %g of rank %" PRIu32 "'s %" PRIu32 " pages)",
        news, total, limit, ratio, rank, num_pages);
    return -ENOSPC;
}

int kvp__check_confirm_opts(const struct kvp_confirm_opts *opts, size_t n,
                            struct kvp_confirm_opts *o, struct kvp_error *err)
{
    if (opts->opts_size == 0 || opts->opts_size > sizeof *o) {
        set(err, -EINVAL, KVP_RULE_ARG, -1, (int64_t)opts->opts_size, sizeof *o,
            "opts_size %zu is not a size of struct kvp_confirm_opts", opts->opts_size);
        return -EINVAL;
    }
    memset(o, 0, sizeof *o);
    memcpy(o, opts, opts->opts_size);
    o->opts_size = sizeof *o;
    if (!o->token_ids != !o->ntokens) {
        set(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0, "token_ids and ntokens: give both or neither");
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (o->parents && o->parents[i].len) {
            const char *why = kvp_key_problem(o->parents[i].ptr, o->parents[i].len);
            if (why) {
                set(err, -EINVAL, KVP_RULE_KEY, (int64_t)i, (int64_t)o->parents[i].len,
                    KVP_MAX_KEY_LEN, "parent %zu %s", i, why);
                return -EINVAL;
            }
        }
        if (!o->ntokens || !o->ntokens[i])
            continue;
        if (o->ntokens[i] > KVP_MAX_PAGE_TOKENS) {
            set(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, o->ntokens[i], KVP_MAX_PAGE_TOKENS,
                "token_ids %zu: more than %d tokens", i, KVP_MAX_PAGE_TOKENS);
            return -EINVAL;
        }
        if (!o->token_ids[i]) {
            set(err, -EINVAL, KVP_RULE_ARG, (int64_t)i, 0, 0,
                "token_ids %zu is NULL with ntokens %u", i, o->ntokens[i]);
            return -EINVAL;
        }
    }
    return 0;
}
