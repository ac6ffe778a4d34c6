/*
 * The body guard. JSON parsers are linear only for the shapes they expect:
 * jsmn walks back over every open bracket when one closes (100,000 nested
 * lists took 12.7 s), and jansson copies a string or a number whole before
 * looking at its length and tokenizes a list whole before anyone counts it.
 * A body within --max-body could hold the server for minutes. So before any
 * parser, one pass counts what a parser would build and stops at the first
 * limit no valid request reaches: nesting, elements of one list or object,
 * values in the body, the length of one string or number. A body that passes
 * has bounded depth, lists and tokens, which makes every parser after it
 * linear; a body that fails costs only the bytes read up to the failure.
 *
 * The pass follows strings and escapes exactly (a bracket or comma inside a
 * string is text) and otherwise trusts the bytes: it does not check the JSON
 * grammar, so it runs at memory speed and leaves every syntax message to the
 * parser.
 */
#include <stdint.h>
#include <string.h>

#include "server/bodyguard.h"

size_t kvp__guard_max_values(size_t max_list)
{
    size_t extra = 2 * KVP_GUARD_MIN_FIELDS + 64;
    if (max_list > (SIZE_MAX - extra) / 4)
        return SIZE_MAX;
    return 4 * max_list + extra;
}

/* What a byte outside a string starts. */
enum { C_TOKEN = 0, C_SPACE, C_OPEN, C_CLOSE, C_COMMA, C_QUOTE };

static const unsigned char cls[256] = {
    [' '] = C_SPACE, ['\t'] = C_SPACE, ['\n'] = C_SPACE, ['\r'] = C_SPACE,
    [':'] = C_SPACE, ['['] = C_OPEN,   ['{'] = C_OPEN,   [']'] = C_CLOSE,
    ['}'] = C_CLOSE, [','] = C_COMMA,  ['"'] = C_QUOTE,
};

/* Where the string whose opening quote is at s - 1 ends (its closing quote),
 * looking at no more than max bytes of it; NULL when it is longer (or not
 * closed within them). */
static const char *string_end(const char *s, const char *end, size_t max)
{
    const char *stop = (size_t)(end - s) > max ? s + max + 1 : end;
    while (s < stop) {
        if (*s == '"')
            return s;
        s += *s == '\\' ? 2 : 1;
    }
    return NULL;
}

static enum kvp_guard_rule refuse(struct kvp_guard_fail *fail, enum kvp_guard_rule rule,
                                  const char *js, const char *at, size_t limit)
{
    fail->rule = rule;
    fail->offset = (size_t)(at - js);
    fail->limit = limit;
    return rule;
}

enum kvp_guard_rule kvp__body_guard(const char *js, size_t len, size_t max_list,
                                    struct kvp_guard_fail *fail)
{
    /* Per open container: separators seen, separators allowed, the rule. */
    size_t commas[KVP_GUARD_MAX_DEPTH + 1], seps[KVP_GUARD_MAX_DEPTH + 1];
    enum kvp_guard_rule over[KVP_GUARD_MAX_DEPTH + 1];
    /* A pair is a list of two; a body object has a few fields. */
    size_t max_elems = max_list > 2 ? max_list : 2;
    size_t max_fields = max_list > KVP_GUARD_MIN_FIELDS ? max_list : KVP_GUARD_MIN_FIELDS;
    size_t max_values = kvp__guard_max_values(max_list);
    size_t values = 0;
    unsigned depth = 0;
    const char *p = js, *end = js + len;

    while (p < end) {
        switch (cls[(unsigned char)*p]) {
        case C_SPACE:
            p++;
            continue;
        case C_COMMA:
            /* n separators: n + 1 elements. */
            if (depth && ++commas[depth] > seps[depth])
                return refuse(fail, over[depth], js, p, seps[depth] + 1);
            p++;
            continue;
        case C_CLOSE:
            if (!depth)
                return KVP_GUARD_OK; /* unbalanced: the parser's to report */
            depth--;
            p++;
            continue;
        case C_OPEN:
            if (++values > max_values)
                return refuse(fail, KVP_GUARD_VALUES, js, p, max_values);
            if (depth == KVP_GUARD_MAX_DEPTH)
                return refuse(fail, KVP_GUARD_DEPTH, js, p, KVP_GUARD_MAX_DEPTH);
            depth++;
            commas[depth] = 0;
            seps[depth] = (*p == '[' ? max_elems : max_fields) - 1;
            over[depth] = *p == '[' ? KVP_GUARD_LIST : KVP_GUARD_FIELDS;
            p++;
            continue;
        case C_QUOTE: {
            if (++values > max_values)
                return refuse(fail, KVP_GUARD_VALUES, js, p, max_values);
            const char *q = string_end(p + 1, end, KVP_GUARD_MAX_STRING);
            if (q) {
                p = q + 1;
                continue;
            }
            if ((size_t)(end - p - 1) <= KVP_GUARD_MAX_STRING)
                return KVP_GUARD_OK; /* unterminated: the parser's to report */
            return refuse(fail, KVP_GUARD_STRING, js, p, KVP_GUARD_MAX_STRING);
        }
        default: {
            /* A number, a literal or garbage: up to the next structural byte. */
            if (++values > max_values)
                return refuse(fail, KVP_GUARD_VALUES, js, p, max_values);
            size_t room = (size_t)(end - p);
            const char *stop = p + (room > KVP_GUARD_MAX_TOKEN ? KVP_GUARD_MAX_TOKEN + 1 : room);
            const char *q = p + 1;
            while (q < stop && cls[(unsigned char)*q] == C_TOKEN)
                q++;
            if (q - p > KVP_GUARD_MAX_TOKEN)
                return refuse(fail, KVP_GUARD_TOKEN, js, p, KVP_GUARD_MAX_TOKEN);
            p = q;
            continue;
        }
        }
    }
    return KVP_GUARD_OK;
}
