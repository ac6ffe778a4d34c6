/*
 * A growable output buffer and a small JSON writer over it, with the UTF-8
 * check both use: the server writes its responses with it (instead of
 * building jansson trees and calling json_dumps: one buffer per
 * connection, reused across requests), and the http:// backend
 * (src/meta/http/http.c) its request bodies. Compiled into the library and
 * into the server (CMakeLists.txt), whose binary links only the library's
 * public API.
 *
 * Allocation failure sets buf->oom and turns every later append into a no-op;
 * the caller checks oom once at the end.
 */
#ifndef KVP_UTIL_JSONW_H
#define KVP_UTIL_JSONW_H

#include <stddef.h>
#include <stdint.h>

struct kvp_buf {
    char *p;
    size_t len, cap;
    int oom;
};

void kvp__buf_init(struct kvp_buf *b);
void kvp__buf_free(struct kvp_buf *b);
/* Empties the buffer, keeping its memory (and dropping an earlier oom). */
void kvp__buf_reset(struct kvp_buf *b);
/* Makes room for extra more bytes; returns 0 or -ENOMEM (and sets oom). */
int kvp__buf_reserve(struct kvp_buf *b, size_t extra);
void kvp__buf_put(struct kvp_buf *b, const void *p, size_t n);
void kvp__buf_printf(struct kvp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvp__jw_lit(b, s) kvp__buf_put((b), (s), sizeof(s) - 1)
/* A JSON string with its quotes. Escapes '"', '\\' and control characters;
 * bytes that are not valid UTF-8 become U+FFFD, so the output is always
 * valid JSON whatever the input bytes. */
void kvp__jw_str(struct kvp_buf *b, const char *s, size_t n);
void kvp__jw_int(struct kvp_buf *b, int64_t v);
void kvp__jw_uint(struct kvp_buf *b, uint64_t v);
/* `null` when v < 0, else the integer. */
void kvp__jw_page_or_null(struct kvp_buf *b, int64_t v);
/* The elements of a list (no brackets), ", " between them, as the
 * engines' servers print them: true/false for each v[i]; each p[i] as
 * kvp__jw_page_or_null. */
void kvp__jw_bools(struct kvp_buf *b, const uint8_t *v, size_t n);
void kvp__jw_pages(struct kvp_buf *b, const int64_t *p, size_t n);

/* Length of the valid UTF-8 sequence (not ASCII) starting at s, within n
 * bytes, or 0: strict (no overlong forms, no surrogates, at most U+10FFFF),
 * as the server's JSON parser takes it. */
size_t kvp__utf8_seq(const unsigned char *s, size_t n);
/* Whether s[0..n) is all valid UTF-8. */
int kvp__utf8_valid(const char *s, size_t n);

#endif
