/* Request-body JSON: jsmn fast path, jansson for everything else (jsonfast.c). */
#ifndef KVP_SERVER_JSONFAST_H
#define KVP_SERVER_JSONFAST_H

#include <jansson.h>
#include <stddef.h>

/* Same contract as json_loadb(js, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, err). */
json_t *kvp__json_load(const char *js, size_t len, json_error_t *err);

/* The fast path alone: NULL when it hands the body to jansson (tests, fuzzing). */
json_t *kvp__json_load_fast_only(const char *js, size_t len);

#endif
