/*
 * Differential fuzz target: the jsmn fast path of request parsing
 * (src/server/jsonfast.c) against jansson. Whatever the fast path accepts,
 * jansson must accept too, with an equal value; the fast path may hand any
 * body to jansson.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/jsonfast.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *fast = kvp__json_load_fast_only((const char *)data, size);
    if (!fast)
        return 0;
    json_error_t err;
    json_t *ref = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!ref) {
        fprintf(stderr, "fast path accepted what jansson refuses: %s at %d\n", err.text,
                err.position);
        abort();
    }
    if (!json_equal(fast, ref)) {
        fprintf(stderr, "fast path and jansson disagree on the value\n");
        abort();
    }
    json_decref(fast);
    json_decref(ref);
    return 0;
}
