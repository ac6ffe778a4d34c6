/*
 * The body guard at the edges of each limit: directly, and through
 * kvp__server_handle in each body path (the plain-body scanner, jsmn, and
 * jansson), which must all answer the same at and past each limit.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "server/bodyguard.h"
#include "server/server.h"

/* A growing string, for building bodies. */
struct sb {
    char *p;
    size_t len, cap;
};

static void sb_put(struct sb *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_printf(struct sb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n);
}

static void sb_rep(struct sb *b, const char *s, size_t times)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < times; i++)
        sb_put(b, s, n);
}

/* b = head, fill repeated times, tail; returns b. */
static struct sb *framed(struct sb *b, const char *head, const char *fill, size_t times,
                         const char *tail)
{
    b->len = 0;
    sb_put(b, head, strlen(head));
    sb_rep(b, fill, times);
    sb_put(b, tail, strlen(tail));
    return b;
}

static enum kvp_guard_rule guard(const struct sb *b, size_t max_list, struct kvp_guard_fail *f)
{
    memset(f, 0, sizeof *f);
    return kvp__body_guard(b->p, b->len, max_list, f);
}

/* HEAD[[[...]]]} with `levels` levels in all (the object counts); HEAD
 * opens the object, e.g. {"keys": . */
static void nested_in(struct sb *b, size_t levels, const char *head)
{
    b->len = 0;
    sb_put(b, head, strlen(head));
    sb_rep(b, "[", levels - 1);
    sb_rep(b, "]", levels - 1);
    sb_put(b, "}", 1);
}

static void nested(struct sb *b, size_t levels)
{
    nested_in(b, levels, "{\"keys\": ");
}

static void test_direct(void)
{
    struct sb b = {0};
    struct kvp_guard_fail f;

    nested(&b, KVP_GUARD_MAX_DEPTH);
    CHECK_EQ(guard(&b, 100, &f), KVP_GUARD_OK);
    nested(&b, KVP_GUARD_MAX_DEPTH + 1);
    CHECK_EQ(guard(&b, 100, &f), KVP_GUARD_DEPTH);
    CHECK_EQ(f.offset, 9 + KVP_GUARD_MAX_DEPTH - 1); /* the bracket that opens level 33 */
    CHECK_EQ(f.limit, KVP_GUARD_MAX_DEPTH);

    /* Elements of a list: max_list passes, one more is refused at its comma. */
    b.len = 0;
    sb_put(&b, "[", 1);
    sb_rep(&b, "1,", 9);
    sb_put(&b, "1]", 2);
    CHECK_EQ(guard(&b, 10, &f), KVP_GUARD_OK);
    CHECK_EQ(guard(&b, 9, &f), KVP_GUARD_LIST);
    CHECK_EQ(f.offset, 2 * 9);
    CHECK_EQ(f.limit, 9);
    /* A pair is always two, whatever the limit. */
    b.len = 0;
    sb_printf(&b, "[[\"a\", \"\"]]");
    CHECK_EQ(guard(&b, 1, &f), KVP_GUARD_OK);
    /* Separators inside strings are text. */
    b.len = 0;
    sb_printf(&b, "[\"a,b,c,[[[\", \"\\\",\\\\\", \"}]\"]");
    CHECK_EQ(guard(&b, 3, &f), KVP_GUARD_OK);
    CHECK_EQ(guard(&b, 2, &f), KVP_GUARD_LIST);

    /* Object members: at least KVP_GUARD_MIN_FIELDS. */
    b.len = 0;
    sb_put(&b, "{", 1);
    for (int i = 0; i < KVP_GUARD_MIN_FIELDS; i++)
        sb_printf(&b, "%s\"f%d\": 0", i ? ", " : "", i);
    sb_put(&b, "}", 1);
    CHECK_EQ(guard(&b, 2, &f), KVP_GUARD_OK);
    b.p[--b.len] = 0;
    sb_printf(&b, ", \"x\": 0}");
    CHECK_EQ(guard(&b, 2, &f), KVP_GUARD_FIELDS);
    CHECK_EQ(f.limit, KVP_GUARD_MIN_FIELDS);

    /* Values in the body: 4 per key of the limit, plus room for the fields. */
    size_t lim = kvp__guard_max_values(4);
    CHECK_EQ(lim, 4 * 4 + 2 * KVP_GUARD_MIN_FIELDS + 64);
    b.len = 0;
    sb_put(&b, "[", 1);
    sb_rep(&b, "[1,1],", lim / 3 - 1);
    sb_put(&b, "[]]", 3);
    /* 69 elements: too many for a list of at most 4, not for 1,000 */
    CHECK_EQ(guard(&b, 4, &f), KVP_GUARD_LIST);
    CHECK_EQ(guard(&b, 1000, &f), KVP_GUARD_OK);
    b.len = 0;
    sb_rep(&b, "[1,1]", lim / 3);
    CHECK_EQ(guard(&b, 4, &f), KVP_GUARD_OK); /* 3 values each: lim/3*3 <= lim */
    sb_rep(&b, "[1,1]", 1);
    CHECK_EQ(guard(&b, 4, &f), KVP_GUARD_VALUES);
    CHECK_EQ(f.limit, lim);

    /* Strings: KVP_GUARD_MAX_STRING bytes between the quotes pass. */
    CHECK_EQ(guard(framed(&b, "[\"", "a", KVP_GUARD_MAX_STRING, "\"]"), 10, &f), KVP_GUARD_OK);
    CHECK_EQ(guard(framed(&b, "[\"", "a", KVP_GUARD_MAX_STRING + 1, "\"]"), 10, &f),
             KVP_GUARD_STRING);
    CHECK_EQ(f.offset, 1);
    /* ... also when escapes make it long, or an escaped quote sits at the edge. */
    CHECK_EQ(guard(framed(&b, "[\"", "\\u0041", KVP_MAX_KEY_LEN, "\"]"), 10, &f), KVP_GUARD_OK);
    CHECK_EQ(guard(framed(&b, "[\"", "a", KVP_GUARD_MAX_STRING - 1, "\\\"\"]"), 10, &f),
             KVP_GUARD_STRING);
    /* A string not closed within its limit: the parser's to report if short. */
    CHECK_EQ(guard(framed(&b, "[\"abc\\", "", 0, ""), 10, &f), KVP_GUARD_OK);

    /* Numbers and literals. */
    CHECK_EQ(guard(framed(&b, "[", "1", KVP_GUARD_MAX_TOKEN, "]"), 10, &f), KVP_GUARD_OK);
    CHECK_EQ(guard(framed(&b, "[", "1", KVP_GUARD_MAX_TOKEN + 1, ""), 10, &f), KVP_GUARD_TOKEN);
    CHECK_EQ(f.offset, 1);

    /* Unbalanced or empty input is left to the parser. */
    b.len = 0;
    sb_put(&b, "]]]]{", 5);
    CHECK_EQ(guard(&b, 10, &f), KVP_GUARD_OK);
    CHECK_EQ(kvp__body_guard("", 0, 10, &f), KVP_GUARD_OK);
    free(b.p);
}

/* ---- through the server, in each body path ---- */

static struct kvp_meta *meta, *meta2;
static struct kvp_server fast_srv, slow_srv;
static struct kvp_reply rep, rep2;

#define MAX_KEYS 50

static void post(const char *path, const struct sb *body)
{
    struct kvp_request req = {.method = "POST",
                              .path = path,
                              .path_len = strlen(path),
                              .body = body->p,
                              .body_len = body->len};
    kvp__server_handle(&fast_srv, &req, &rep);
    kvp__server_handle(&slow_srv, &req, &rep2);
}

/* Both servers answered status with a detail that contains want (NULL: any). */
static int replied(int status, const char *want)
{
    int same = rep.status == rep2.status && rep.body.len == rep2.body.len &&
               !memcmp(rep.body.p, rep2.body.p, rep.body.len);
    int ok = same && rep.status == status && (!want || (rep.body.p && strstr(rep.body.p, want)));
    if (!ok)
        fprintf(stderr, "  want %d %s\n  fast %d %.*s\n  slow %d %.*s\n", status, want ? want : "",
                rep.status, (int)rep.body.len, rep.body.p ? rep.body.p : "", rep2.status,
                (int)rep2.body.len, rep2.body.p ? rep2.body.p : "");
    return ok;
}

/* {"keys": [k0, ...]} with n keys; `style` picks the path: 0 plain (the
 * scanner), 1 an unknown field (jsmn), 2 an escape in the first key (jansson). */
static void keys_body(struct sb *b, const char *head, size_t n, int style)
{
    b->len = 0;
    sb_printf(b, "{%s\"keys\": [", head);
    for (size_t i = 0; i < n; i++)
        sb_printf(b, "%s\"%s%032zx\"", i ? ", " : "", i == 0 && style == 2 ? "\\u0041" : "k", i);
    sb_printf(b, "]%s}", style == 1 ? ", \"x\": [1]" : "");
}

static void test_paths(void)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    if (kvp_meta_open(&o, &meta) || kvp_meta_open(&o, &meta2))
        abort();
    struct kvp_server_config cfg = {.max_keys = MAX_KEYS};
    kvp__server_init(&fast_srv, meta, &cfg);
    cfg.no_fast_bodies = 1;
    kvp__server_init(&slow_srv, meta2, &cfg);
    kvp__reply_init(&rep);
    kvp__reply_init(&rep2);

    struct sb b = {0};
    sb_printf(&b, "{\"num_pages\": 100}");
    post("/rank/0/initialize", &b);
    CHECK(replied(200, NULL));

    static const struct {
        const char *path, *head, *ok;
    } routes[] = {
        {"/keys/batch_exists", "", "{\"exists\": ["},
        {"/keys/get_locations", "\"rank\": 0, ", "{\"locations\": ["},
        {"/0/exists", "", "{\"exists\": ["},
        {"/0/get_page_indices", "", "{\"indices\": ["},
    };
    for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
        for (int style = 0; style < 3; style++) {
            keys_body(&b, routes[r].head, MAX_KEYS, style);
            post(routes[r].path, &b);
            CHECK(replied(200, routes[r].ok));
            keys_body(&b, routes[r].head, MAX_KEYS + 1, style);
            post(routes[r].path, &b);
            CHECK(replied(413, "Too many keys: more than 50 in one request"));
        }
    }

    /* Depth: 32 levels reach the route (which refuses the shape), 33 do not. */
    static const struct {
        const char *head, *at33;
    } heads[] = {
        {"{\"keys\": ", "nesting deeper than 32 levels at byte 40"},
        /* an escape sends the body to jansson */
        {"{\"k\\u0065ys\": ", "nesting deeper than 32 levels at byte 45"},
    };
    for (int h = 0; h < 2; h++) {
        nested_in(&b, KVP_GUARD_MAX_DEPTH, heads[h].head);
        post("/keys/batch_exists", &b);
        CHECK(replied(400, "Invalid keys format"));
        nested_in(&b, KVP_GUARD_MAX_DEPTH + 1, heads[h].head);
        post("/keys/batch_exists", &b);
        CHECK(replied(400, heads[h].at33));
        post("/0/reserve_and_allocate_page_indices", &b);
        CHECK(replied(400, heads[h].at33));
    }

    /* A long string and a long number, on a fast route and a general one. */
    framed(&b, "{\"rank\": 0, \"keys\": [\"", "a", KVP_GUARD_MAX_STRING + 1, "\"]}");
    post("/keys/batch_allocate", &b);
    CHECK(replied(400, "Invalid JSON body: string longer than 6144 bytes at byte 21"));
    post("/0/delete_keys", &b);
    CHECK(replied(400, "Invalid JSON body: string longer than 6144 bytes at byte 21"));
    post("/keys/batch_allocate",
         framed(&b, "{\"rank\": ", "9", KVP_GUARD_MAX_TOKEN + 1, ", \"keys\": []}"));
    CHECK(replied(400, "Invalid JSON body: number or literal longer than 40 characters at byte 9"));
    /* ... while 40 digits still get the parser's own message. */
    post("/keys/batch_allocate",
         framed(&b, "{\"rank\": ", "9", KVP_GUARD_MAX_TOKEN, ", \"keys\": []}"));
    CHECK(replied(400, "Invalid JSON body: too big integer"));

    free(b.p);
    kvp__reply_free(&rep);
    kvp__reply_free(&rep2);
    kvp_meta_close(meta);
    kvp_meta_close(meta2);
}

int main(void)
{
    test_direct();
    test_paths();
    return check_report();
}
