/*
 * Errors as data (docs/protocol.md, "Errors as data"): a request with the
 * X-Kvpage-Errors header (kvp_request.error_fields; kvpage's http://
 * backend sends it) gets error replies that name the broken rule and its
 * index, value and limit beside "detail"; any other request gets the one
 * member "detail", as the engines' servers answer. The words are the same
 * either way.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "server/server.h"
#include "server_test.h"
#include "util/jsonw.h"

static struct kvp_server srv;
static struct kvp_reply rep;

static void call(const char *path, const char *body, int fields)
{
    server_test_call(
        &srv, &rep,
        (struct kvp_request){.method = "POST", .path = path, .body = body, .error_fields = fields});
}

/* The reply to (path, body) is status with detail, and with the fields when
 * asked for them. */
static void expect(int line, const char *path, const char *body, int status, const char *detail,
                   const char *fields)
{
    char want[1024];
    for (int asked = 0; asked <= 1; asked++) {
        call(path, body, asked);
        snprintf(want, sizeof want, "{\"detail\": \"%s\"%s%s}", detail, asked ? ", " : "",
                 asked ? fields : "");
        int ok = rep.status == status && rep.body.len == strlen(want) &&
                 !memcmp(rep.body.p, want, rep.body.len);
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "line %d: %s %s\n  want %d %s\n  got  %d %.*s\n", line, path, body,
                    status, want, rep.status, (int)rep.body.len, rep.body.p);
    }
}
#define X(...) expect(__LINE__, __VA_ARGS__)

int main(void)
{
    struct kvp_meta *meta = server_test_open(&srv, &rep);

    X("/rank/0/initialize", "{\"num_pages\": 0}", 400,
      "Invalid initialization parameters: num_pages must be a positive integer",
      "\"rule\": \"num_pages\", \"index\": -1, \"value\": 0, \"limit\": 2147483647");
    X("/1/initialize", "{\"num_pages\": 2147483648}", 400,
      "Invalid initialization parameters: num_pages must be at most 2147483647",
      "\"rule\": \"num_pages\", \"index\": -1, \"value\": 2147483648, \"limit\": 2147483647");
    X("/keys/batch_exists", "{\"keys\": [\"a\", \"\"]}", 400, "Invalid key: keys[1] is empty",
      "\"rule\": \"key\", \"index\": 1, \"value\": 0, \"limit\": 1024");
    X("/keys/batch_exists", "{\"keys\": [\"a\"], \"namespace\": 5}", 400, "Invalid namespace",
      "\"rule\": \"namespace\", \"index\": -1, \"value\": 0, \"limit\": 0");
    X("/keys/get_locations", "{\"rank\": 5, \"keys\": [\"a\"]}", 404,
      "Failed to get key locations: Rank 5 not initialized",
      "\"rule\": \"rank_not_init\", \"index\": -1, \"value\": 5, \"limit\": 0");
    X("/7/reserve_and_allocate_page_indices", "{\"keys\": [\"a\"]}", 404,
      "Rank 7 not initialized. Please call /7/initialize first.",
      "\"rule\": \"rank_not_init\", \"index\": -1, \"value\": 7, \"limit\": 0");

    /* A rank holding data, resized; confirmations outside it and on a page
     * another key holds. */
    call("/rank/2/initialize", "{\"num_pages\": 4}", 0);
    CHECK_EQ(rep.status, 200);
    call("/keys/batch_allocate", "{\"rank\": 2, \"keys\": [\"a\"]}", 0);
    CHECK(rep.status == 200 && strstr(rep.body.p, "[\"a\", 0]"));
    call("/keys/confirm_write", "{\"rank\": 2, \"confirmations\": [[\"a\", 0]]}", 0);
    CHECK_EQ(rep.status, 204);
    X("/rank/2/initialize", "{\"num_pages\": 8}", 409,
      "Rank 2 already initialized with 4 pages; refusing to change to 8 pages while it holds data",
      "\"rule\": \"resize_held\", \"index\": -1, \"value\": 4, \"limit\": 8");
    X("/keys/confirm_write", "{\"rank\": 2, \"confirmations\": [[\"b\", 1], [\"c\", 9]]}", 400,
      "Confirmation failed: confirmations[1] page 9 is outside [0, 4)",
      "\"rule\": \"confirm_page\", \"index\": 1, \"value\": 9, \"limit\": 4");
    X("/keys/confirm_write", "{\"rank\": 2, \"confirmations\": [[\"b\", 0]]}", 409,
      "Confirmation failed: page 0 on rank 2 holds another key",
      "\"rule\": \"held_by_other\", \"index\": 0, \"value\": 0, \"limit\": 0");

    /* A refusal that names no rule has no fields, asked or not. */
    call("/nope", NULL, 1);
    CHECK(rep.status == 404 && rep.body.len == strlen("{\"detail\": \"Not Found\"}"));

    kvp__reply_free(&rep);
    kvp_meta_close(meta);
    return check_report();
}
