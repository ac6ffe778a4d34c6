#include "util/jsonw.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvp__buf_init(struct kvp_buf *b)
{
    memset(b, 0, sizeof *b);
}

void kvp__buf_free(struct kvp_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void kvp__buf_reset(struct kvp_buf *b)
{
    b->len = 0;
    b->oom = 0;
}

int kvp__buf_reserve(struct kvp_buf *b, size_t extra)
{
    if (b->oom)
        return -ENOMEM;
    if (b->cap - b->len >= extra)
        return 0;
    size_t need = b->len + extra;
    if (need < b->len)
        goto fail;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        goto fail;
    b->p = p;
    b->cap = cap;
    return 0;
fail:
    b->oom = 1;
    return -ENOMEM;
}

void kvp__buf_put(struct kvp_buf *b, const void *p, size_t n)
{
    if (kvp__buf_reserve(b, n))
        return;
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

void kvp__buf_printf(struct kvp_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < room) {
        b->len += (size_t)n;
        return;
    }
    if (kvp__buf_reserve(b, (size_t)n + 1))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* 0: copy as is; 1: needs an escape; 2: first byte of a multibyte sequence
 * (or an invalid byte) that has to be checked. */
static unsigned char esc_class(unsigned char c)
{
    if (c < 0x20 || c == '"' || c == '\\')
        return 1;
    if (c >= 0x80)
        return 2;
    return 0;
}

/* True when none of the 8 bytes at s needs an escape or a UTF-8 check
 * (esc_class 0 for all: 0x20..0x7f except '"' and '\\'). */
static int plain8(const unsigned char *s)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t x;
    memcpy(&x, s, 8);
    if (x & high) /* a byte >= 0x80 */
        return 0;
    if ((x - 0x20 * ones) & ~x & high) /* a byte < 0x20 */
        return 0;
    uint64_t q = x ^ (0x22 * ones), b = x ^ (0x5c * ones); /* '"' or '\\' become 0 */
    return !(((q - ones) & ~q & high) | ((b - ones) & ~b & high));
}

size_t kvp__utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* Overlong forms, surrogates and values beyond U+10FFFF are invalid. */
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void kvp__jw_str(struct kvp_buf *b, const char *str, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    /* Worst case per input byte is 6 output bytes ("\u00XX", or U+FFFD's 3). */
    if (n > (SIZE_MAX - 2) / 6 || kvp__buf_reserve(b, n * 6 + 2))
        return;
    char *o = b->p + b->len;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run + 8 <= n && plain8(s + run)) /* keys: most of every reply */
            run += 8;
        while (run < n && esc_class(s[run]) == 0)
            run++;
        if (run > i) {
            memcpy(o, s + i, run - i);
            o += run - i;
            i = run;
            if (i == n)
                break;
        }
        unsigned char c = s[i];
        if (esc_class(c) == 2) {
            size_t l = kvp__utf8_seq(s + i, n - i);
            if (l) {
                memcpy(o, s + i, l);
                o += l;
                i += l;
            } else {
                memcpy(o, "\xef\xbf\xbd", 3);
                o += 3;
                i++;
            }
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
        i++;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
}

void kvp__jw_uint(struct kvp_buf *b, uint64_t v)
{
    char tmp[24];
    int i = 24;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    kvp__buf_put(b, tmp + i, (size_t)(24 - i));
}

void kvp__jw_int(struct kvp_buf *b, int64_t v)
{
    if (v < 0) {
        kvp__jw_lit(b, "-");
        kvp__jw_uint(b, (uint64_t)0 - (uint64_t)v);
    } else {
        kvp__jw_uint(b, (uint64_t)v);
    }
}

void kvp__jw_page_or_null(struct kvp_buf *b, int64_t v)
{
    if (v < 0)
        kvp__jw_lit(b, "null");
    else
        kvp__jw_uint(b, (uint64_t)v);
}

void kvp__jw_bools(struct kvp_buf *b, const uint8_t *v, size_t n)
{
    kvp__buf_reserve(b, n * 7 + 2);
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvp__jw_lit(b, ", ");
        if (v[i])
            kvp__jw_lit(b, "true");
        else
            kvp__jw_lit(b, "false");
    }
}

void kvp__jw_pages(struct kvp_buf *b, const int64_t *p, size_t n)
{
    kvp__buf_reserve(b, n * 12 + 2);
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvp__jw_lit(b, ", ");
        kvp__jw_page_or_null(b, p[i]);
    }
}

int kvp__utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        size_t l = s[i] < 0x80 ? 1 : kvp__utf8_seq(s + i, n - i);
        if (!l)
            return 0;
        i += l;
    }
    return 1;
}
