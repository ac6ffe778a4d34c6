/* Request-body JSON: jsmn fast path, jansson for everything else (jsonfast.c). */
#ifndef KVP_SERVER_JSONFAST_H
#define KVP_SERVER_JSONFAST_H

#include <jansson.h>
#include <stddef.h>

/* Same contract as json_loadb(js, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, err). */
json_t *kvp__json_load(const char *js, size_t len, json_error_t *err);

/* The fast path alone: NULL when it hands the body to jansson (tests, fuzzing). */
json_t *kvp__json_load_fast_only(const char *js, size_t len);

/* 1 when the n bytes at s are printable ASCII without a backslash: a string's
 * content that needs no unescaping and no UTF-8 check. */
int kvp__plain_ascii(const char *s, size_t n);

#endif
