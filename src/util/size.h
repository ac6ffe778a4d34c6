/* Reading a size or count from the command line: the one parser that the
 * server's flags and the store's commands share. Header only (the kvpage
 * executable uses it on both sides of libkvpage.so); the library exports
 * it, with suffixes, as kvp_parse_size (kvpage/size.h, util/size.c), which
 * the Python package calls. */
#ifndef KVP_UTIL_SIZE_H
#define KVP_UTIL_SIZE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/*
 * A decimal unsigned integer; with suffixes != 0 optionally followed by
 * k/K, m/M, g/G or t/T (powers of 1024) and then optionally "iB" or "B".
 * 0, or -1 for anything else (a sign, a fraction, spaces, overflow).
 */
static inline int kvp__parse_size(const char *s, int suffixes, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    if (suffixes && *end) {
        switch (*end | 0x20) {
        case 'k':
            shift = 10;
            break;
        case 'm':
            shift = 20;
            break;
        case 'g':
            shift = 30;
            break;
        case 't':
            shift = 40;
            break;
        default:
            return -1;
        }
        end++;
        if (*end == 'i' && end[1] == 'B')
            end += 2;
        else if (*end == 'B')
            end++;
    }
    if (*end)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

#endif
