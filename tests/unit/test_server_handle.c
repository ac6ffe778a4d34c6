/* kvp__server_handle without sockets: routing, methods, limits, messages. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "util/jsonw.h"
#include "server/server.h"
#include "server_test.h"

static struct kvp_server srv;
static struct kvp_reply rep;

static const struct kvp_reply *call_full(const char *method, const char *path, const char *body,
                                         const struct sockaddr *client, const char *auth)
{
    server_test_call(
        &srv, &rep,
        (struct kvp_request){
            .method = method, .path = path, .body = body, .client = client, .authorization = auth});
    return &rep;
}

static const struct kvp_reply *call(const char *method, const char *path, const char *body)
{
    return call_full(method, path, body, NULL, NULL);
}

#define EXPECT(what, cond)                                                                         \
    do {                                                                                           \
        if (cond)                                                                                  \
            check_pass();                                                                          \
        else                                                                                       \
            check_fail("FAIL %s:%d %s: got %d %.*s", __FILE__, __LINE__, what, rep.status,         \
                       (int)rep.body.len, rep.body.p ? rep.body.p : "");                           \
    } while (0)

/* Status and exact body. */
static void expect(int line, const char *method, const char *path, const char *body, int status,
                   const char *want)
{
    call(method, path, body);
    int ok = rep.status == status &&
             (!want || (rep.body.len == strlen(want) && !memcmp(rep.body.p, want, rep.body.len)));
    if (ok)
        check_pass();
    else
        check_fail("FAIL line %d: %s %s %s\n  want %d %s\n  got  %d %.*s", line, method, path,
                   body ? body : "", status, want ? want : "(any)", rep.status, (int)rep.body.len,
                   rep.body.p ? rep.body.p : "");
}
#define X(...) expect(__LINE__, __VA_ARGS__)
#define D(msg) "{\"detail\": \"" msg "\"}"

static void test_routing(void)
{
    X("GET", "/healthz", NULL, 200, "ok");
    X("HEAD", "/healthz", NULL, 200, NULL);
    X("GET", "/nope", NULL, 404, D("Not Found"));
    X("POST", "/", NULL, 405, D("Method Not Allowed")); /* GET /: the status page */
    X("GET", "/ns/alpha/", NULL, 200, NULL);
    X("POST", "/keys/batch_exists/", NULL, 404, D("Not Found"));
    X("POST", "//keys/batch_exists", NULL, 404, D("Not Found"));
    X("POST", "/abc/exists", NULL, 404, D("Not Found"));
    X("POST", "/1.5/exists", NULL, 404, D("Not Found"));
    X("POST", "/rank/x/initialize", NULL, 404, D("Not Found"));
    X("POST", "/ns/alpha", NULL, 404, D("Not Found"));
    X("GET", "/ns/alpha/healthz", NULL, 404, D("Not Found"));
    X("POST", "/ns/alpha/keys/batch_exists", "{\"keys\": [\"a\"]}", 200, "{\"exists\": [false]}");
    X("POST", "/ns/bad!name/keys/batch_exists", NULL, 400, D("Invalid namespace"));
    X("POST", "/ns//keys/batch_exists", NULL, 400, D("Invalid namespace"));

    X("GET", "/keys/batch_exists", NULL, 405, D("Method Not Allowed"));
    EXPECT("Allow POST", rep.allow && !strcmp(rep.allow, "POST"));
    X("POST", "/metrics", NULL, 405, D("Method Not Allowed"));
    EXPECT("Allow GET", rep.allow && strstr(rep.allow, "GET"));
    X("DELETE", "/0/exists", NULL, 405, D("Method Not Allowed"));

    X("POST", "/2147483648/exists", NULL, 400, D("Invalid rank: 2147483648"));
    X("POST", "/-1/exists", NULL, 400, D("Invalid rank: -1"));
    X("POST", "/rank/99999999999999999999/initialize", NULL, 400,
      D("Invalid rank: 99999999999999999999"));
}

static void test_json(void)
{
    X("POST", "/keys/batch_exists", "{", 400, NULL);
    EXPECT("json error prefix", rep.body.len > 30 &&
                                    !memcmp(rep.body.p, "{\"detail\": \"Invalid JSON body: ", 30) &&
                                    strstr(rep.body.p, " at byte "));
    X("POST", "/keys/batch_exists", "[1, 2]", 400,
      D("Invalid JSON body: expected an object at byte 0"));
    X("POST", "/keys/batch_exists", "7", 400, D("Invalid JSON body: expected an object at byte 0"));
    X("POST", "/keys/batch_exists", "", 200, "{\"exists\": []}");
    X("POST", "/keys/batch_exists", "{\"keys\": null}", 400, D("Invalid keys format"));
    X("POST", "/keys/batch_exists", "{\"keys\": [1]}", 400, D("Invalid keys format"));
    X("POST", "/keys/batch_exists", "{\"keys\": [\"\"]}", 400, D("Invalid key: keys[0] is empty"));
    X("POST", "/keys/batch_exists", "{\"keys\": [\"a\", \"b\\u0000c\"]}", 400,
      D("Invalid key: keys[1] contains a NUL byte"));
}

static void test_vllm(void)
{
    X("POST", "/rank/0/initialize", "{\"num_pages\": 4}", 200,
      "{\"message\": \"Rank 0 initialized with 4 pages\"}");
    X("POST", "/rank/0/initialize", "{\"num_pages\": 4.0}", 400,
      D("Invalid initialization parameters: num_pages must be a positive integer"));
    X("POST", "/rank/0/initialize", "{\"num_pages\": 2147483648}", 400,
      D("Invalid initialization parameters: num_pages must be at most 2147483647"));
    X("POST", "/rank/3/initialize", "{\"role\": \"scheduler\"}", 200,
      "{\"message\": \"Scheduler role does not require initialization\"}");
    X("POST", "/rank/3/initialize", "{\"role\": \"boss\", \"num_pages\": 2}", 400,
      D("Invalid initialization parameters: role must be 'worker' or 'scheduler'"));
    X("POST", "/keys/batch_allocate", "{\"rank\": \"0\", \"keys\": []}", 400,
      D("Invalid request format: need 'rank' and 'keys'"));
    X("POST", "/keys/batch_allocate", "{\"rank\": 0, \"keys\": [[\"a\"]]}", 400,
      D("Invalid request format: keys[0] must be a string or [key, prefix_key]"));
    X("POST", "/keys/batch_allocate", "{\"rank\": 7, \"keys\": [\"a\"]}", 404,
      D("Allocation failed: Rank 7 not initialized"));
    X("POST", "/keys/batch_allocate",
      "{\"rank\": 0, \"keys\": [[\"a\\\"q\", \"\"], \"b\", \"a\\\"q\"]}", 200,
      "{\"rank\": 0, \"results\": [[\"a\\\"q\", 0], [\"b\", 1], [\"a\\\"q\", 0]]}");
    X("POST", "/keys/confirm_write", "{\"rank\": 0, \"confirmations\": [[\"a\\\"q\", 9]]}", 400,
      D("Confirmation failed: confirmations[0] page 9 is outside [0, 4)"));
    X("POST", "/keys/confirm_write",
      "{\"rank\": 0, \"confirmations\": [[\"a\\\"q\", 0]], \"pages_to_release\": [1]}", 204, "");
    X("POST", "/keys/confirm_write", "{\"rank\": 0, \"confirmations\": [[\"zz\", 0]]}", 409,
      D("Confirmation failed: page 0 on rank 0 holds another key"));
    X("POST", "/keys/confirm_write", "{\"rank\": 0, \"confirmations\": [[\"zz\", true]]}", 400,
      D("Confirmation failed: confirmations[0] must be [key, page]"));
    X("POST", "/keys/confirm_write", "{\"rank\": 0, \"pages_to_release\": [\"1\"]}", 400,
      D("Confirmation failed: pages_to_release[0] must be an integer page"));
    X("POST", "/keys/confirm_write", "{\"rank\": 5, \"confirmations\": []}", 404,
      D("Confirmation failed: Rank 5 not initialized"));
    X("POST", "/keys/batch_exists", "{\"keys\": [\"a\\\"q\", \"b\"]}", 200,
      "{\"exists\": [true, false]}");
    X("POST", "/keys/get_locations", "{\"rank\": 0, \"keys\": [\"a\\\"q\", \"b\"]}", 200,
      "{\"locations\": [0, null]}");
    X("POST", "/keys/get_locations", "{\"rank\": 0, \"keys\": [3]}", 400,
      D("Invalid request format: keys[0] must be a string"));
    X("POST", "/rank/0/initialize", "{\"num_pages\": 8}", 409,
      D("Rank 0 already initialized with 4 pages; refusing to change to 8 pages while it holds "
        "data"));
    X("POST", "/keys/delete", "{\"keys\": [\"a\\\"q\"]}", 204, "");
    X("POST", "/clear", NULL, 204, "");
    X("POST", "/ns/other/clear", NULL, 204, "");
}

static void test_sglang(void)
{
    X("POST", "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"mamba\"}", 404,
      D("Rank 0 namespace 'mamba' not initialized. Please call /0/initialize first."));
    X("POST", "/9/exists", "{\"keys\": [\"a\"]}", 404,
      D("Rank 9 not initialized. Please call /9/initialize first."));
    X("POST", "/0/exists", "{\"keys\": [\"a\"], \"namespace\": 3}", 400, D("Invalid namespace"));
    X("POST", "/0/exists", "{\"keys\": [\"a\"], \"namespace\": \"\"}", 400, D("Invalid namespace"));
    X("POST", "/0/exists", "{\"keys\": 5}", 400,
      D("Invalid request format: 'keys' must be a list"));
    X("POST", "/2/initialize", "{\"num_pages\": 3}", 204, "");
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"keys\": [\"x\", [\"y\", \"\"], \"x\"]}",
      200, "{\"indices\": [[false, 2], [false, 1], [false, 2]]}");
    X("POST", "/2/confirm_write",
      "{\"written_keys_to_confirm\": [[\"x\", 2]], \"pages_to_release\": [1]}", 204, "");
    X("POST", "/2/confirm_write", "{\"written_keys_to_confirm\": [[\"x\", -1]]}", 400,
      D("Confirmation failed: written_keys_to_confirm[0] page -1 is outside [0, 3)"));
    X("POST", "/2/exists", "{\"keys\": [\"x\", \"y\"]}", 200, "{\"exists\": [true, false]}");
    X("POST", "/2/get_page_indices", "{\"keys\": [\"x\", \"y\"]}", 200, "{\"indices\": [2, null]}");
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"keys\": [\"x\"]}", 200,
      "{\"indices\": [[true, 2]]}");
    /* kvpage's "order" field: vLLM's order takes the lowest never-used page,
     * the default the most recently freed; anything else is refused */
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"keys\": [\"z\"], \"order\": \"vllm\"}",
      200, "{\"indices\": [[false, 0]]}");
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"keys\": [\"w\"], \"order\": \"bogus\"}",
      400, D("Invalid request format: 'order' must be 'sglang', 'vllm' or 'default'"));
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"order\": 1, \"keys\": [\"w\"]}", 400,
      D("Invalid request format: 'order' must be 'sglang', 'vllm' or 'default'"));
    X("POST", "/2/reserve_and_allocate_page_indices", "{\"keys\": [\"w\"], \"order\": \"default\"}",
      200, "{\"indices\": [[false, 1]]}");
    X("POST", "/2/delete_keys", "{\"keys\": [\"x\"]}", 204, "");
    X("POST", "/2/clear", NULL, 204, "");
    X("POST", "/3/clear", NULL, 404, D("Rank 3 not initialized. Please call /3/initialize first."));
}

static void test_native(void)
{
    X("GET", "/v1/stats", NULL, 200, NULL);
    EXPECT("stats shape", strstr(rep.body.p, "\"namespaces\": [") &&
                              strstr(rep.body.p, "\"requests\": {") &&
                              strstr(rep.body.p, "\"release_of_held_page\": "));
    X("GET", "/metrics", NULL, 200, NULL);
    EXPECT(
        "metrics content",
        strstr(rep.body.p,
               "kvpage_http_requests_total{route=\"/keys/batch_exists\",status=\"200\"}") &&
            strstr(
                rep.body.p,
                "kvpage_rank_pages{deployment=\"default\",pool=\"kv\",rank=\"0\",state=\"free\"}"));
    EXPECT("metrics type", rep.content_type && strstr(rep.content_type, "version=0.0.4"));
}

static void test_limits_and_access(void)
{
    struct kvp_cidr allow[1];
    EXPECT("cidr parse", kvp__cidr_parse("10.0.0.0/8", &allow[0]) == 0);
    EXPECT("cidr bad", kvp__cidr_parse("10.0.0.0/33", &(struct kvp_cidr){0}) != 0);
    struct kvp_server_config cfg = {
        .token = "s3cret", .allow = allow, .nallow = 1, .max_body = 64, .max_keys = 2};
    struct kvp_server saved = srv;
    kvp__server_init(&srv, saved.meta, &cfg);

    struct sockaddr_in in = {.sin_family = AF_INET};
    inet_pton(AF_INET, "10.1.2.3", &in.sin_addr);
    struct sockaddr_in out = {.sin_family = AF_INET};
    inet_pton(AF_INET, "192.168.0.1", &out.sin_addr);
    struct sockaddr_in6 mapped = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:10.9.9.9", &mapped.sin6_addr);

    call_full("GET", "/healthz", NULL, (struct sockaddr *)&out, NULL);
    EXPECT("403", rep.status == 403 && strstr(rep.body.p, "Client address not allowed"));
    call_full("GET", "/healthz", NULL, (struct sockaddr *)&in, NULL);
    EXPECT("healthz without token", rep.status == 200);
    call_full("GET", "/v1/stats", NULL, (struct sockaddr *)&mapped, "Bearer nope");
    EXPECT("401", rep.status == 401 && rep.www_authenticate &&
                      strstr(rep.body.p, "Invalid or missing bearer token"));
    call_full("POST", "/keys/batch_exists", "{\"keys\": [\"a\", \"b\", \"c\"]}",
              (struct sockaddr *)&in, "Bearer s3cret");
    EXPECT("413 keys",
           rep.status == 413 && strstr(rep.body.p, "Too many keys: more than 2 in one request"));
    call_full(
        "POST", "/keys/batch_exists",
        "{\"keys\": [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", \"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"]}",
        (struct sockaddr *)&in, "bearer s3cret");
    EXPECT("413 body",
           rep.status == 413 && strstr(rep.body.p, "Request body too large: limit is 64 bytes"));
    srv = saved;
}

static void test_jsonw(void)
{
    struct kvp_buf b;
    kvp__buf_init(&b);
    kvp__jw_str(&b, "a\"b\\c\n\x01\xff\xc3\xa9", 10);
    const char want[] = "\"a\\\"b\\\\c\\n\\u0001\xef\xbf\xbd\xc3\xa9\"";
    EXPECT("jw_str", b.len == sizeof want - 1 && !memcmp(b.p, want, b.len));
    kvp__buf_reset(&b);
    kvp__jw_int(&b, INT64_MIN);
    EXPECT("jw_int", b.len == 20 && !memcmp(b.p, "-9223372036854775808", 20));
    /* Long strings are scanned eight bytes at a time: every byte value at
     * every position of a 24-byte string must come out as it does alone
     * (a 1-byte string never takes the 8-byte path). */
    struct kvp_buf one, want8;
    kvp__buf_init(&one);
    kvp__buf_init(&want8);
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        kvp__buf_reset(&one);
        char ch = (char)c;
        kvp__jw_str(&one, &ch, 1);
        for (int pos = 0; pos < 24; pos++) {
            char in[24];
            memset(in, 'k', sizeof in);
            in[pos] = ch;
            kvp__buf_reset(&want8);
            kvp__buf_put(&want8, "\"", 1);
            kvp__buf_put(&want8, in, (size_t)pos);
            kvp__buf_put(&want8, one.p + 1, one.len - 2);
            kvp__buf_put(&want8, in + pos + 1, sizeof in - (size_t)pos - 1);
            kvp__buf_put(&want8, "\"", 1);
            kvp__buf_reset(&b);
            kvp__jw_str(&b, in, sizeof in);
            bad += b.len != want8.len || memcmp(b.p, want8.p, b.len) != 0;
        }
    }
    EXPECT("jw_str: every byte at every position", bad == 0);
    kvp__buf_free(&one);
    kvp__buf_free(&want8);
    kvp__buf_free(&b);
}

int main(void)
{
    struct kvp_meta *meta = server_test_open(&srv, &rep);

    /* First, on a reply whose arrays were never used: empty key lists in
     * plain form (the body scanner) on a namespace that does not exist. */
    X("POST", "/ns/fresh/keys/batch_exists", "{\"keys\": []}", 200, "{\"exists\": []}");
    X("POST", "/ns/fresh/keys/get_locations", "{\"rank\": 0, \"keys\": []}", 404,
      D("Failed to get key locations: Rank 0 not initialized"));
    X("POST", "/ns/fresh/keys/batch_exists", "{\"keys\": [\"a\"]}", 200, "{\"exists\": [false]}");

    test_routing();
    test_json();
    test_vllm();
    test_sglang();
    test_native();
    test_limits_and_access();
    test_jsonw();

    struct kvp_error err = {0};
    EXPECT("invariants", kvp_meta_check(meta, &err) == 0);
    kvp__reply_free(&rep);
    kvp_meta_close(meta);
    return check_report();
}
