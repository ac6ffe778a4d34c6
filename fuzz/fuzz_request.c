/*
 * Fuzzes kvp__server_handle. Input: a first line "METHOD PATH" (or just
 * "PATH", meaning POST), then the body. One metadata store serves many inputs
 * (so sequences build up state) and is replaced every few hundred inputs.
 * Aborts when a reply is 500 (never allowed for client input), when a JSON
 * reply is not valid JSON, or when meta's invariants break.
 *
 * Every input also goes to a second store behind a server that reads every
 * body with jansson (cfg.no_fast_bodies): the two replies must be the same,
 * byte for byte, so the plain-body scanner of fastbody.c can never answer
 * differently from the general path. Both stores run on one injected clock.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/meta.h"
#include "server/server.h"

static struct kvp_meta *meta, *meta2;
static struct kvp_server srv, srv2;
static struct kvp_reply rep, rep2;
static unsigned inputs;
static uint64_t now_ms = 1000;

static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return now_ms;
}

static void setup(void)
{
    if (meta && ++inputs % 512 != 0)
        return;
    kvp_meta_close(meta);
    kvp_meta_close(meta2);
    meta = meta2 = NULL;
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = 1000;
    o.read_grace_ms = 10;
    o.clock = fake_clock;
    if (kvp_meta_open(&o, &meta) != 0 || kvp_meta_open(&o, &meta2) != 0)
        abort();
    struct kvp_server_config cfg = {.max_keys = 4096, .max_body = 1 << 20};
    kvp__server_init(&srv, meta, &cfg);
    cfg.no_fast_bodies = 1;
    kvp__server_init(&srv2, meta2, &cfg);
    if (!rep.scratch_cap) {
        kvp__reply_init(&rep);
        kvp__reply_init(&rep2);
    }
}

/* Huge pools make every invariant check walk billions of pages: skip them. */
static int too_big(const char *body, size_t len)
{
    if (!len || !memmem(body, len, "num_pages", 9))
        return 0;
    json_t *j = json_loadb(body, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_t *n = json_object_get(j, "num_pages");
    int big = json_is_integer(n) && json_integer_value(n) > 4096;
    json_decref(j);
    return big;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data;
    const char *nl = memchr(in, '\n', size);
    size_t line = nl ? (size_t)(nl - in) : size;
    const char *body = nl ? nl + 1 : in + size;
    size_t blen = nl ? size - line - 1 : 0;
    if (too_big(body, blen))
        return 0;
    setup();

    char method[16] = "POST";
    const char *path = in;
    size_t plen = line;
    const char *sp = memchr(in, ' ', line);
    if (sp && (size_t)(sp - in) < sizeof method) {
        memcpy(method, in, (size_t)(sp - in));
        method[sp - in] = 0;
        path = sp + 1;
        plen = line - (size_t)(sp - in) - 1;
    }
    struct kvp_request req = {
        .method = method, .path = path, .path_len = plen, .body = body, .body_len = blen};
    now_ms += 7;
    kvp__server_handle(&srv, &req, &rep);
    kvp__server_handle(&srv2, &req, &rep2);
    /* (statistics and metrics carry each server's own timings) */
    int timed = memmem(path, plen, "stats", 5) || memmem(path, plen, "metrics", 7);
    if (rep.status != rep2.status ||
        (!timed && (rep.body.len != rep2.body.len ||
                    (rep.body.len && memcmp(rep.body.p, rep2.body.p, rep.body.len))))) {
        fprintf(stderr, "fast and general paths differ:\n  %d %.*s\n  %d %.*s\n", rep.status,
                (int)rep.body.len, rep.body.p, rep2.status, (int)rep2.body.len, rep2.body.p);
        abort();
    }

    if (rep.status >= 500) {
        fprintf(stderr, "status %d: %.*s\n", rep.status, (int)rep.body.len, rep.body.p);
        abort();
    }
    if (rep.content_type && !strncmp(rep.content_type, "application/json", 16)) {
        json_error_t e;
        json_t *j = json_loadb(rep.body.p, rep.body.len, JSON_ALLOW_NUL, &e);
        if (!j) {
            fprintf(stderr, "reply is not JSON (%s): %.*s\n", e.text, (int)rep.body.len,
                    rep.body.p);
            abort();
        }
        json_decref(j);
    }
    struct kvp_error err = {0};
    if (kvp_meta_check(meta, &err) != 0) {
        fprintf(stderr, "invariant: %s\n", err.msg);
        abort();
    }
    return 0;
}
