/*
 * The body guard: one linear pass over a request body, before any JSON
 * parser sees it, that refuses the shapes no valid request has and that
 * would make a parser slow (bodyguard.c).
 */
#ifndef KVP_SERVER_BODYGUARD_H
#define KVP_SERVER_BODYGUARD_H

#include <stddef.h>

/* Deepest nesting accepted; valid requests need 3 (object, list, pair). */
#define KVP_GUARD_MAX_DEPTH 32
/* Longest string accepted, in body bytes between its quotes: a key of the
 * longest length (1024 bytes) written entirely as \u00XX escapes. */
#define KVP_GUARD_MAX_STRING (6 * 1024)
/* Fields an object may have at least, whatever --max-keys is. */
#define KVP_GUARD_MIN_FIELDS 64
/* Longest number or literal accepted: an int64 needs 20 characters. */
#define KVP_GUARD_MAX_TOKEN 40

enum kvp_guard_rule {
    KVP_GUARD_OK = 0,
    KVP_GUARD_DEPTH,  /* a bracket opened level KVP_GUARD_MAX_DEPTH + 1 */
    KVP_GUARD_LIST,   /* an array got more than max(max_list, 2) elements */
    KVP_GUARD_FIELDS, /* an object got more than max(max_list, KVP_GUARD_MIN_FIELDS) members */
    KVP_GUARD_VALUES, /* the body's (max_values + 1)th JSON value */
    KVP_GUARD_STRING, /* a string longer than KVP_GUARD_MAX_STRING */
    KVP_GUARD_TOKEN,  /* a number or literal longer than KVP_GUARD_MAX_TOKEN */
};

struct kvp_guard_fail {
    enum kvp_guard_rule rule;
    size_t offset; /* byte of the body where the rule broke: the bracket, comma, quote or token */
    size_t limit;  /* the limit that was passed (elements, values, levels or bytes) */
};

/* The value limit for a request of at most max_list keys per list:
 * 4 * max_list + 2 * KVP_GUARD_MIN_FIELDS + 64. Every valid request has fewer
 * values (a confirm_write of max_list pairs and as many releases has
 * 4 * max_list + 7), and so has any object of KVP_GUARD_MIN_FIELDS fields. */
size_t kvp__guard_max_values(size_t max_list);

/*
 * Scans js[0..len). Returns KVP_GUARD_OK, or the first rule broken (and
 * fills *fail). Never reads a string or token further than its limit, so the
 * cost is linear in the bytes before the refusal. The scan does not validate
 * JSON: a body it passes may still be malformed (the parser says so), and a
 * malformed body may be refused here first.
 */
enum kvp_guard_rule kvp__body_guard(const char *js, size_t len, size_t max_list,
                                    struct kvp_guard_fail *fail);

#endif
