/*
 * rules.h — the metadata rules' refusals, written once (rules.c): the checks
 * the interface (meta.c) makes before a backend is asked, which the server's
 * dialects also make before they change anything (creating a namespace),
 * and the refusals every backend words the same (tests compare the words,
 * and the server's replies repeat them). Each fills err (when non-NULL:
 * code, rule, index, value, limit, msg) and returns the negative errno.
 */
#ifndef KVP_META_RULES_H
#define KVP_META_RULES_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/error.h"
#include "kvpage/meta.h"

/* num_pages of a rank: 1 .. KVP_MAX_PAGES. 0, or -EINVAL (KVP_RULE_NUM_PAGES,
 * value num_pages, limit KVP_MAX_PAGES: "num_pages must be a positive
 * integer" / "num_pages must be at most 2147483647"). */
int kvp__check_num_pages(uint64_t num_pages, struct kvp_error *err);

/* "Rank R not initialized": -ENOENT, KVP_RULE_RANK_NOT_INIT, value rank. */
int kvp__err_rank_not_init(struct kvp_error *err, int64_t rank);

/* "Rank R already initialized with OLD pages; refusing to change to ASKED
 * pages while it holds data": -EEXIST, KVP_RULE_RESIZE_HELD. kvp__msg_resize_held
 * writes the sentence alone (the dialects' 409 reply). */
int kvp__err_resize_held(struct kvp_error *err, uint32_t rank, int64_t old, int64_t asked);
void kvp__msg_resize_held(char *buf, size_t len, uint32_t rank, int64_t old, int64_t asked);

/* "page P on rank R holds another key": -EEXIST, KVP_RULE_HELD_BY_OTHER,
 * index i (the confirmation), value page. */
int kvp__err_held_by_other(struct kvp_error *err, int64_t i, int64_t page, uint32_t rank);

/* "WHAT I: page P is outside [0, NUM_PAGES)" (what: "confirmation" or
 * "release"): -EINVAL, rule (KVP_RULE_CONFIRM_PAGE or _RELEASE_PAGE). */
int kvp__err_page_range(struct kvp_error *err, int rule, const char *what, int64_t i, int64_t page,
                        uint32_t num_pages);

/* "too many ranks in this namespace (limit L)": code, KVP_RULE_TOO_MANY. */
int kvp__err_too_many_ranks(struct kvp_error *err, int code, int64_t count, int limit);

/* "no namespace DEP/POOL": code, KVP_RULE_NONE. */
int kvp__err_no_namespace(struct kvp_error *err, int code, const char *dep, size_t dlen,
                          const char *pool, size_t plen);

/* "pinning NEW more keys would pin TOTAL keys of the namespace, over the
 * LIMIT allowed (--max-pinned-ratio RATIO of rank R's NP pages)": -ENOSPC,
 * KVP_RULE_TOO_MANY, value total, limit limit. */
int kvp__err_pin_limit(struct kvp_error *err, uint64_t news, uint64_t total, uint64_t limit,
                       double ratio, uint32_t rank, uint32_t num_pages);

/* "out of memory": code, KVP_RULE_NONE. */
int kvp__err_oom(struct kvp_error *err, int code);

/* The opts of kvp_meta_confirm_ex for n confirmations (see kvpage/meta.h)
 * into *o: the caller's struct at the library's size, what the caller's
 * lacks NULL. 0 or -EINVAL (KVP_RULE_ARG; KVP_RULE_KEY for a parent, index
 * its confirmation). */
int kvp__check_confirm_opts(const struct kvp_confirm_opts *opts, size_t n,
                            struct kvp_confirm_opts *o, struct kvp_error *err);

#endif
