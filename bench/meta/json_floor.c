/*
 * json_floor: how long jansson's json_loadb (+ json_decref) takes for the
 * benchmark's request bodies, with no HTTP at all. kvpage parses every request
 * body with json_loadb, so 1 / this time bounds its requests/s per core.
 * Built and run by run.sh:  cc -O2 -o json_floor json_floor.c -ljansson
 *   json_floor BATCH [exists|alloc]
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : 64;
    int alloc = argc > 2 && !strcmp(argv[2], "alloc");
    if (batch < 1)
        return 2;
    size_t n = 0;
    char *b = malloc((size_t)batch * 80 + 64);
    if (!b)
        return 1;
    n += (size_t)sprintf(b + n, alloc ? "{\"rank\":0,\"keys\":[" : "{\"keys\":[");
    for (int i = 0; i < batch; i++) /* 64 hex characters per key, as in the benchmark */
        n += (size_t)sprintf(
            b + n, alloc ? "%s[\"%016x%016x%016x%016x\",\"\"]" : "%s\"%016x%016x%016x%016x\"",
            i ? "," : "", i, i * 7u, i * 13u, i * 31u);
    n += (size_t)sprintf(b + n, "]}");
    int iters = 400000 / batch + 10;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < iters; i++) {
            json_error_t e;
            json_t *j = json_loadb(b, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
            if (!j) {
                fprintf(stderr, "json_floor: %s\n", e.text);
                return 1;
            }
            json_decref(j);
        }
        double us = (now() - t0) / iters * 1e6;
        if (us < best)
            best = us;
    }
    printf("RESULT batch=%d form=%s body_bytes=%zu parse_us=%.2f ns_per_byte=%.1f "
           "max_rps_per_core=%.0f\n",
           batch, alloc ? "alloc" : "exists", n, best, best * 1000 / n, 1e6 / best);
    free(b);
    return 0;
}
