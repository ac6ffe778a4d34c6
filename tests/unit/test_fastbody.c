/*
 * fastbody.c for the SGLang dialect: which bodies the scanner takes, and that
 * kvp__server_handle answers every body byte for byte as the general path
 * (cfg.no_fast_bodies) does, on two stores fed the same requests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/meta.h"
#include "server/server.h"

static int passed, failed;
static struct kvp_meta *meta_fast, *meta_gen;
static struct kvp_server fast, gen;
static struct kvp_reply rep_fast, rep_gen;

#define MAX_KEYS 64

static int shown(const struct kvp_reply *r)
{
    return (int)(r->body.len > 300 ? 300 : r->body.len);
}

static void fail(int line, const char *what, const char *path, const char *body)
{
    failed++;
    fprintf(stderr, "FAIL line %d: %s\n  %s %.300s\n  fast:    %d %.*s\n  general: %d %.*s\n", line,
            what, path, body, rep_fast.status, shown(&rep_fast),
            rep_fast.body.p ? rep_fast.body.p : "", rep_gen.status, shown(&rep_gen),
            rep_gen.body.p ? rep_gen.body.p : "");
}

/* The body through both servers: same status, content type and bytes. Returns the status. */
static int both(int line, const char *path, const char *body)
{
    struct kvp_request req = {.method = "POST",
                              .path = path,
                              .path_len = strlen(path),
                              .body = body,
                              .body_len = strlen(body)};
    kvp__server_handle(&fast, &req, &rep_fast);
    kvp__server_handle(&gen, &req, &rep_gen);
    int same = rep_fast.status == rep_gen.status && rep_fast.content_type == rep_gen.content_type &&
               rep_fast.body.len == rep_gen.body.len &&
               (!rep_fast.body.len || !memcmp(rep_fast.body.p, rep_gen.body.p, rep_fast.body.len));
    if (same)
        passed++;
    else
        fail(line, "fast and general paths differ", path, body);
    return rep_fast.status;
}

/* The prefix_key the scanner read last (a confirmation's). */
static struct kvp_str last_prefix;

/* The scanner read what was asserted of it at line. */
#define READ(cond)                                                                                 \
    do {                                                                                           \
        if (cond)                                                                                  \
            passed++;                                                                              \
        else                                                                                       \
            fail(__LINE__, "the scanner's prefix_key: " #cond, "/0/confirm_write", "");            \
    } while (0)

/* What the scanner itself makes of body on route: 1 read, 0 declined. */
static int scanned(int route, const char *body, struct kvp_str *pool, size_t *n, size_t *nrel)
{
    struct kvp_request req = {.method = "POST", .path = "", .body = body, .body_len = strlen(body)};
    struct kvp_ctx c = {.srv = &fast, .req = &req, .rep = &rep_fast};
    *nrel = 0;
    if (route == KVP_ROUTE_SGL_RESERVE)
        return kvp__fast_sgl_allocate(&c, pool, n);
    if (route == KVP_ROUTE_SGL_CONFIRM)
        return kvp__fast_sgl_confirm(&c, pool, &last_prefix, n, nrel);
    return kvp__fast_sgl_keys(&c, pool, n);
}

/* The scanner reads body (n elements, nrel releases, pool or NULL for absent)
 * and both paths answer alike. */
static void takes(int line, int route, const char *path, const char *body, size_t want_n,
                  size_t want_nrel, const char *want_pool)
{
    struct kvp_str pool;
    size_t n, nrel;
    int rc = scanned(route, body, &pool, &n, &nrel);
    int ok = rc == 1 && n == want_n && nrel == want_nrel &&
             (want_pool ? pool.ptr && pool.len == strlen(want_pool) &&
                              !memcmp(pool.ptr, want_pool, pool.len)
                        : !pool.ptr);
    if (ok)
        passed++;
    else
        fail(line, "scanner should read this body", path, body);
    both(line, path, body);
}

/* The scanner leaves body to the general path, and both paths answer alike. */
static void declines(int line, int route, const char *path, const char *body)
{
    struct kvp_str pool;
    size_t n, nrel;
    if (scanned(route, body, &pool, &n, &nrel) == 0)
        passed++;
    else
        fail(line, "scanner should decline this body", path, body);
    both(line, path, body);
}

#define T(route, path, body, n, nrel, pool) takes(__LINE__, route, path, body, n, nrel, pool)
#define N(route, path, body) declines(__LINE__, route, path, body)
#define B(path, body) both(__LINE__, path, body)

enum {
    EX = KVP_ROUTE_SGL_EXISTS,
    RS = KVP_ROUTE_SGL_RESERVE,
    CF = KVP_ROUTE_SGL_CONFIRM,
    GT = KVP_ROUTE_SGL_GET,
};

static char *repeat_key(char ch, size_t len, const char *head, const char *tail)
{
    size_t hl = strlen(head), tl = strlen(tail);
    char *s = malloc(hl + len + tl + 1);
    memcpy(s, head, hl);
    memset(s + hl, ch, len);
    memcpy(s + hl + len, tail, tl + 1);
    return s;
}

/* {"keys": [elem(0), ..., elem(n-1)]} with elem printf'ed from fmt and i. */
static char *list_body(const char *head, const char *fmt, size_t n, const char *tail)
{
    size_t cap = strlen(head) + strlen(tail) + n * (strlen(fmt) + 24) + 1, len = 0;
    char *s = malloc(cap);
    len += (size_t)snprintf(s, cap, "%s", head);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, fmt, i ? ", " : "", i);
    snprintf(s + len, cap - len, "%s", tail);
    return s;
}

static void test_state_and_shapes(void)
{
    /* before any initialize: 404 on both */
    T(EX, "/0/exists", "{\"keys\": [\"a\"]}", 1, 0, NULL);
    T(GT, "/0/get_page_indices", "{\"keys\": [\"a\"], \"namespace\": \"p1\"}", 1, 0, "p1");
    T(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": [\"a\"]}", 1, 0, NULL);
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"a\", 0]]}", 1, 0, NULL);
    B("/0/initialize", "{\"num_pages\": 16}");
    B("/0/initialize", "{\"num_pages\": 8, \"namespace\": \"p1\"}");

    /* reserve: keys or [key, prefix], namespace anywhere or absent */
    T(RS, "/0/reserve_and_allocate_page_indices",
      "{\"keys\": [[\"s1\", \"\"], \"s2\", [\"s3\", \"s1\"], \"s1\"]}", 4, 0, NULL);
    T(RS, "/0/reserve_and_allocate_page_indices",
      "{\"namespace\": \"p1\", \"keys\": [\"q1\", [\"q2\", \"q1\"]]}", 2, 0, "p1");
    T(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": [\"q3\"], \"namespace\": \"kv\"}", 1,
      0, "kv");
    T(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": []}", 0, 0, NULL);
    T(RS, "/5/reserve_and_allocate_page_indices", "{\"keys\": [\"a\"]}", 1, 0, NULL);
    N(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": [[\"a\", \"b\", \"c\"]]}");
    N(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": [[\"a\", 5]]}");
    N(RS, "/0/reserve_and_allocate_page_indices", "{\"keys\": [\"a\"], \"rank\": 0}");

    /* confirm: both lists, either order, namespace first / last / absent */
    T(CF, "/0/confirm_write",
      "{\"written_keys_to_confirm\": [[\"s1\", 0], [\"s2\", 1]], \"pages_to_release\": [2]}", 2, 1,
      NULL);
    T(CF, "/0/confirm_write",
      "{\"namespace\": \"p1\", \"pages_to_release\": [], \"written_keys_to_confirm\": [[\"q1\", "
      "0]]}",
      1, 0, "p1");
    T(CF, "/0/confirm_write",
      "{\"pages_to_release\": [1], \"written_keys_to_confirm\": [], \"namespace\": \"p1\"}", 0, 1,
      "p1");
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", 99]]}", 1, 0, NULL);
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"x1\", 0]]}", 1, 0, NULL); /* 409 */
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [], \"pages_to_release\": [-1]}", 0, 1,
      NULL);
    T(CF, "/0/confirm_write",
      "{\"written_keys_to_confirm\": [[\"y1\", 5], [\"y2\", 5]], \"pages_to_release\": []}", 2, 0,
      NULL);
    /* kvpage's prefix_key (a chain of parents, protocol.md 14.1): a key or null */
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", 0]], \"prefix_key\": \"p\"}",
      1, 0, NULL);
    READ(last_prefix.len == 1 && last_prefix.ptr[0] == 'p');
    T(CF, "/0/confirm_write", "{\"prefix_key\": null, \"written_keys_to_confirm\": [[\"s1\", 0]]}",
      1, 0, NULL);
    READ(last_prefix.ptr == KVP_FAST_NULL && last_prefix.len == 0);
    T(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", 0]]}", 1, 0, NULL);
    READ(!last_prefix.ptr);
    /* ... and leaves to the general path an empty key, another type, a bad
     * literal, the field twice, and parent_keys (and token_ids) */
    static const char *const other_parents[] = {
        "\"prefix_key\": \"\"", "\"prefix_key\": 3", "\"prefix_key\": nul",
        "\"prefix_key\": \"a\", \"prefix_key\": \"b\"", "\"parent_keys\": []"};
    for (size_t i = 0; i < sizeof other_parents / sizeof *other_parents; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"written_keys_to_confirm\": [], %s}", other_parents[i]);
        N(CF, "/0/confirm_write", body);
    }
    N(CF, "/0/confirm_write", "{\"pages_to_release\": [3]}"); /* the list it needs is missing */
    N(CF, "/0/confirm_write", "{\"confirmations\": [[\"a\", 0]]}");
    N(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", 1.0]]}");
    N(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", -0]]}");
    N(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [[\"s1\", 01]]}");
    N(CF, "/0/confirm_write",
      "{\"written_keys_to_confirm\": [], \"pages_to_release\": [1], \"pages_to_release\": [2]}");
    N(CF, "/0/confirm_write", "{\"written_keys_to_confirm\": [], \"pages_to_release\": 3}");

    /* exists and get_page_indices */
    T(EX, "/0/exists", "{\"keys\": [\"s1\", \"s2\", \"zz\"]}", 3, 0, NULL);
    T(EX, "/0/exists", "{\"namespace\": \"kv\", \"keys\": [\"s1\"]}", 1, 0, "kv");
    T(EX, "/0/exists", "{\"keys\": [\"q1\", \"s1\"], \"namespace\": \"p1\"}", 2, 0, "p1");
    T(EX, "/0/exists", " { \"keys\" : [ \"s1\" , \"s2\" ] ,\n\t\"namespace\" : \"kv\" }\r\n", 2, 0,
      "kv");
    T(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"zz\"}", 1, 0, "zz"); /* 404 */
    T(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"a b/c:d\"}", 1, 0, "a b/c:d");
    T(EX, "/ns/dep1/0/exists", "{\"keys\": [\"a\"]}", 1, 0, NULL);
    T(EX, "/9/exists", "{\"keys\": [\"a\"]}", 1, 0, NULL);
    T(GT, "/0/get_page_indices", "{\"keys\": [\"s1\", \"nope\"]}", 2, 0, NULL);
    T(GT, "/0/get_page_indices", "{\"keys\": [\"q1\"], \"namespace\": \"p1\"}", 1, 0, "p1");
    T(GT, "/0/get_page_indices", "{\"keys\": []}", 0, 0, NULL);
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"\"}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": 5}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": null}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"k\\u0076\"}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"k\xc3\xa9\"}");
    N(EX, "/0/exists", "{\"namespace\": \"kv\", \"keys\": [\"a\"], \"namespace\": \"p1\"}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"keys\": [\"b\"]}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"kv\",}");
    N(EX, "/0/exists", "{\"keys\": [\"a\"]} x");
    N(EX, "/0/exists", "{\"keys\": [\"a\"], \"rank\": 0}");
    N(EX, "/0/exists", "{\"keys\": [[\"a\", \"\"]]}");
    N(EX, "/0/exists", "{\"keys\": {\"a\": 1}}");
    N(EX, "/0/exists", "{\"namespace\": \"kv\"}");
    N(GT, "/0/get_page_indices", "{\"keys\": [\"\"]}");
    N(GT, "/0/get_page_indices", "{\"keys\": [\"a\\\"b\"]}");
    N(GT, "/0/get_page_indices", "{\"keys\": [1]}");

    /* a pool name of 128 bytes is the longest the pool rule takes */
    char *p128 = repeat_key('p', 128, "{\"keys\": [\"a\"], \"namespace\": \"", "\"}");
    char *p129 = repeat_key('p', 129, "{\"keys\": [\"a\"], \"namespace\": \"", "\"}");
    struct kvp_str pool;
    size_t n, nrel;
    if (scanned(EX, p128, &pool, &n, &nrel) == 1 && pool.len == 128)
        passed++;
    else
        fail(__LINE__, "128-byte pool", "/0/exists", p128);
    B("/0/exists", p128);
    N(EX, "/0/exists", p129);
    free(p128);
    free(p129);

    /* keys of 1024 bytes (the longest) and 1025 */
    char *k1024 = repeat_key('k', 1024, "{\"keys\": [\"", "\"]}");
    char *k1025 = repeat_key('k', 1025, "{\"keys\": [\"", "\"]}");
    char *c1024 = repeat_key('k', 1024, "{\"written_keys_to_confirm\": [[\"", "\", 3]]}");
    char *c1025 = repeat_key('k', 1025, "{\"written_keys_to_confirm\": [[\"", "\", 3]]}");
    T(RS, "/0/reserve_and_allocate_page_indices", k1024, 1, 0, NULL);
    N(RS, "/0/reserve_and_allocate_page_indices", k1025);
    T(CF, "/0/confirm_write", c1024, 1, 0, NULL);
    N(CF, "/0/confirm_write", c1025);
    T(EX, "/0/exists", k1024, 1, 0, NULL);
    N(EX, "/0/exists", k1025);
    T(GT, "/0/get_page_indices", k1024, 1, 0, NULL);
    N(GT, "/0/get_page_indices", k1025);
    free(k1024);
    free(k1025);
    free(c1024);
    free(c1025);

    /* lists at --max-keys and one over */
    char *at = list_body("{\"keys\": [", "%s\"m%zu\"", MAX_KEYS, "], \"namespace\": \"kv\"}");
    char *over = list_body("{\"keys\": [", "%s\"m%zu\"", MAX_KEYS + 1, "]}");
    char *rat = list_body("{\"keys\": [", "%s[\"m%zu\", \"\"]", MAX_KEYS, "]}");
    char *rover = list_body("{\"keys\": [", "%s[\"m%zu\", \"\"]", MAX_KEYS + 1, "]}");
    char *cat = list_body("{\"written_keys_to_confirm\": [], \"pages_to_release\": [", "%s%zu",
                          MAX_KEYS, "]}");
    char *cover = list_body("{\"written_keys_to_confirm\": [], \"pages_to_release\": [", "%s%zu",
                            MAX_KEYS + 1, "]}");
    T(EX, "/0/exists", at, MAX_KEYS, 0, "kv");
    N(EX, "/0/exists", over);
    T(GT, "/0/get_page_indices", at, MAX_KEYS, 0, "kv");
    N(GT, "/0/get_page_indices", over);
    T(RS, "/0/reserve_and_allocate_page_indices", rat, MAX_KEYS, 0, NULL);
    N(RS, "/0/reserve_and_allocate_page_indices", rover);
    T(CF, "/0/confirm_write", cat, 0, MAX_KEYS, NULL); /* pages past the pool: 400 */
    N(CF, "/0/confirm_write", cover);
    free(at);
    free(over);
    free(rat);
    free(rover);
    free(cat);
    free(cover);

    /* the state after all this is the same in both stores */
    B("/0/exists", "{\"keys\": [\"s1\", \"s2\", \"s3\", \"q3\", \"x1\", \"y1\", \"y2\", \"m0\"]}");
    B("/0/get_page_indices", "{\"keys\": [\"q1\", \"q2\"], \"namespace\": \"p1\"}");
}

/* kvpage's extension: the vLLM batch_exists and get_locations bodies with an
 * optional "namespace" (the pool): read by the scanner when plain, answered
 * alike by both paths either way. */
static void test_vllm_namespace(void)
{
    B("/0/initialize", "{\"num_pages\": 4, \"namespace\": \"vp\"}");
    B("/0/reserve_and_allocate_page_indices", "{\"keys\": [\"v1\"], \"namespace\": \"vp\"}");
    B("/0/confirm_write", "{\"written_keys_to_confirm\": [[\"v1\", 0]], \"namespace\": \"vp\"}");
    static const char *const bodies[] = {
        "{\"keys\": [\"v1\", \"v2\"], \"namespace\": \"vp\"}",
        "{\"namespace\": \"vp\", \"keys\": [\"v1\"]}",
        "{\"keys\": [\"v1\"], \"namespace\": \"kv\"}",
        "{\"keys\": [\"v1\"], \"namespace\": \"absent\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        struct kvp_request req = {
            .method = "POST", .path = "", .body = bodies[i], .body_len = strlen(bodies[i])};
        struct kvp_ctx c = {.srv = &fast, .req = &req, .rep = &rep_fast};
        struct kvp_str pool;
        size_t n;
        if (kvp__fast_keys(&c, NULL, &pool, &n) == 1 && pool.ptr)
            passed++;
        else
            fail(__LINE__, "scanner should read this body", "/keys/batch_exists", bodies[i]);
        B("/keys/batch_exists", bodies[i]);
    }
    if (B("/keys/batch_exists", "{\"keys\": [\"v1\"], \"namespace\": \"vp\"}") == 200 &&
        strstr(rep_fast.body.p, "true"))
        passed++;
    else
        fail(__LINE__, "v1 exists in pool vp", "/keys/batch_exists", "");
    /* declined by the scanner (an escape, a bad or non-string pool, twice) */
    B("/keys/batch_exists", "{\"keys\": [\"v1\"], \"namespace\": \"v\\u0070\"}");
    B("/keys/batch_exists", "{\"keys\": [\"v1\"], \"namespace\": \"\"}");
    B("/keys/batch_exists", "{\"keys\": [\"v1\"], \"namespace\": 7}");
    B("/keys/batch_exists", "{\"keys\": [\"v1\"], \"namespace\": \"vp\", \"namespace\": \"vp\"}");
    B("/keys/get_locations", "{\"rank\": 0, \"keys\": [\"v1\"], \"namespace\": \"vp\"}");
    B("/keys/get_locations", "{\"rank\": 0, \"keys\": [\"v1\"], \"namespace\": \"kv\"}");
    B("/keys/get_locations", "{\"rank\": 0, \"keys\": [\"v1\"], \"namespace\": null}");
    if (B("/keys/get_locations", "{\"rank\": 0, \"keys\": [\"v1\"], \"namespace\": \"vp\"}") ==
            200 &&
        strstr(rep_fast.body.p, "[0]"))
        passed++;
    else
        fail(__LINE__, "v1 at page 0 in pool vp", "/keys/get_locations", "");
}

int main(void)
{
    struct kvp_server_config cfg = {.max_keys = MAX_KEYS};
    if (kvp_meta_open(NULL, &meta_fast) || kvp_meta_open(NULL, &meta_gen)) {
        fprintf(stderr, "kvp_meta_open failed\n");
        return 1;
    }
    kvp__server_init(&fast, meta_fast, &cfg);
    cfg.no_fast_bodies = 1;
    kvp__server_init(&gen, meta_gen, &cfg);
    kvp__reply_init(&rep_fast);
    kvp__reply_init(&rep_gen);

    test_state_and_shapes();
    test_vllm_namespace();

    struct kvp_error err = {0};
    if (kvp_meta_check(meta_fast, &err) == 0 && kvp_meta_check(meta_gen, &err) == 0)
        passed++;
    else
        fail(__LINE__, "invariants", "", err.msg);
    kvp__reply_free(&rep_fast);
    kvp__reply_free(&rep_gen);
    kvp_meta_close(meta_fast);
    kvp_meta_close(meta_gen);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
