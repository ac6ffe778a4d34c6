/*
 * kvpage/error.h — error conventions shared by every part of kvpage.
 *
 * Every function returns 0 on success or a negative errno (-EINVAL, -ENOENT,
 * -ENOSPC, ...). Functions that validate caller input also fill a
 * caller-provided struct kvp_error (when non-NULL) saying which element broke
 * which rule, with a message a person can act on. The library never prints
 * and never aborts on bad input.
 */
#ifndef KVPAGE_ERROR_H
#define KVPAGE_ERROR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_API __attribute__((visibility("default")))

/* Which rule a validation failure broke (struct kvp_error.rule). */
enum kvp_rule {
    KVP_RULE_NONE = 0,
    KVP_RULE_RANK_NOT_INIT, /* value = rank */
    KVP_RULE_RANK_RANGE,    /* value = rank; must be 0 <= rank < 2^31 */
    KVP_RULE_NUM_PAGES,     /* value = num_pages asked; limit = maximum */
    KVP_RULE_RESIZE_HELD,   /* value = old num_pages, limit = new num_pages */
    KVP_RULE_KEY,           /* index = key index; value = key length; limit = 1024 */
    KVP_RULE_CONFIRM_PAGE,  /* index = confirmation index, value = page, limit = num_pages */
    KVP_RULE_RELEASE_PAGE,  /* index = release index, value = page, limit = num_pages */
    KVP_RULE_HELD_BY_OTHER, /* index = confirmation index, value = page */
    KVP_RULE_NAMESPACE,     /* deployment or pool name invalid */
    KVP_RULE_TOO_MANY,      /* value = count, limit = maximum */
    KVP_RULE_IO,            /* an I/O or system call failed; see code and msg */
    KVP_RULE_OFFSET,        /* pagefile: offset negative or beyond the file */
    KVP_RULE_SIZE,          /* pagefile: size beyond bytes_per_page */
    KVP_RULE_ALIGN,         /* pagefile: alignment required and not met */
    KVP_RULE_ARG,           /* any other invalid argument */
    KVP_RULE_UNAVAILABLE,   /* a remote metadata store (redis://) could not be reached or
                               failed the call; msg names it and the cause. Refused before
                               it was sent: nothing changed; lost after: it may have taken
                               effect (every call but allocate is safe to repeat) */
    KVP_RULE_OWNER,         /* store: the page file belongs to another metadata owner
                               (location, deployment, pool, rank); value = its rank, limit =
                               the rank asked; msg names both and the fix */
    KVP_RULE_INTEGRITY,     /* pagefile: a page's bytes fail its integrity tag (code -EBADMSG;
                               index = op, value = the page's slot index); the page is
                               reported as missing, msg says which page and why */
};

/* Filled by validating functions on failure. Zero-initialize before use. */
struct kvp_error {
    int code;      /* the negative errno the function returned */
    int rule;      /* enum kvp_rule */
    int64_t index; /* element index the failure is about, or -1 */
    int64_t value; /* the offending value (see enum kvp_rule) */
    int64_t limit; /* the bound it broke (see enum kvp_rule) */
    char msg[256]; /* a sentence for a person, NUL-terminated */
};

/* Text for a negative errno or library code; never NULL. Thread-safe. */
KVP_API const char *kvp_strerror(int code);

/* The name of rule (enum kvp_rule) as kvpage's wire and Python spell it:
 * "none", "rank_not_init", "rank_range", ..., "integrity" (the enum's
 * name without KVP_RULE_, in lower case); NULL for a value that is no rule,
 * so a loop from 0 to the first NULL lists them all. */
KVP_API const char *kvp_rule_name(int rule);

/* The rule named name (len bytes, not NUL-terminated), or -1 when no rule
 * has that name. */
KVP_API int kvp_rule_from_name(const char *name, size_t len);

#ifdef __cplusplus
}
#endif
#endif
