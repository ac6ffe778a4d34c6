/* The jsmn fast path of request parsing: takes the engines' bodies, hands
 * everything unusual or malformed to jansson, and agrees with jansson. */
#include <string.h>

#include "check.h"
#include "server/jsonfast.h"

static void fast_equals_jansson(const char *body)
{
    json_t *f = kvp__json_load_fast_only(body, strlen(body));
    json_error_t e;
    json_t *j = json_loadb(body, strlen(body), JSON_DECODE_ANY, &e);
    CHECK(f != NULL);
    CHECK(j != NULL);
    if (f && j)
        CHECK(json_equal(f, j));
    if (!f)
        fprintf(stderr, "  fast path refused: %s\n", body);
    json_decref(f);
    json_decref(j);
}

static void goes_to_jansson(const char *body)
{
    json_t *f = kvp__json_load_fast_only(body, strlen(body));
    CHECK(f == NULL);
    if (f)
        fprintf(stderr, "  fast path accepted: %s\n", body);
    json_decref(f);
}

int main(void)
{
    fast_equals_jansson("{\"rank\": 0, \"keys\": [[\"ab01\", \"\"], \"cd\"]}");
    fast_equals_jansson("{\"rank\":1,\"confirmations\":[[\"k\",1]],\"pages_to_release\":[2,3]}");
    fast_equals_jansson("{\"keys\":[]}");
    fast_equals_jansson("{}");
    fast_equals_jansson(" \n{ \"a\" : [ { \"x\" : [ ] } , { } ] , \"b\" : -0 }\t");
    fast_equals_jansson("{\"a\":1.5,\"b\":1e3,\"c\":-2E-2,\"d\":true,\"e\":null,\"f\":false}");
    fast_equals_jansson("{\"a\":1,\"a\":2}"); /* the last one wins in both */
    fast_equals_jansson("[1,2,3]");
    fast_equals_jansson("\"top\"");
    goes_to_jansson("9223372036854775807"); /* jsmn wants a delimiter after a top-level primitive */

    /* malformed: jansson gives the message */
    const char *bad[] = {"[1 2]",       "[1,]",       "{\"a\" \"b\"}",
                         "{\"a\":1}{}", "{\"a\":01}", "[tru]",
                         "{\"a\":[1,2", "{,}",        "{\"a\":1,}",
                         "[1e]",        "[.5]",       "[-]",
                         "[1.]",        "{\"a\"}",    "{1:2}",
                         "[\"a\":1]",   "]",          "",
                         "[1]x",        "[nulll]",    "{\"a\":1 \"b\":2}",
                         "[[1],,[2]]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        goes_to_jansson(bad[i]);
        json_error_t e;
        json_t *j = kvp__json_load(bad[i], strlen(bad[i]), &e);
        CHECK(j == NULL); /* and the combined loader refuses it, with jansson's text */
        CHECK(e.text[0] != 0);
        json_decref(j);
    }
    /* valid but unusual: jansson parses them */
    const char *odd[] = {"{\"a\":\"\\u0041\"}", "{\"k\":\"caf\xc3\xa9\"}", "[99999999999999999999]",
                         "{\"a\\\"b\":1}", "[1e999]"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        goes_to_jansson(odd[i]);
    json_error_t e;
    json_t *j = kvp__json_load("{\"a\":\"\\u0041\"}", 14, &e);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "a")), "A"));
    json_decref(j);
    /* the word-at-a-time string check: every bad byte at every position of
     * strings across 8-byte words is refused; good bytes are accepted */
    const unsigned char badb[] = {0x01, 0x1f, 0x7f, 0x80, 0xc3, 0xff, '\\'};
    const unsigned char goodb[] = {0x20, 0x21, 0x5b, 0x5d, 0x7e, 'a', '0'};
    int wrong = 0;
    for (int len = 1; len <= 19; len++)
        for (int pos = 0; pos < len; pos++) {
            char body[64];
            for (size_t b = 0; b < sizeof badb + sizeof goodb; b++) {
                int refuse = b < sizeof badb;
                unsigned char ch = refuse ? badb[b] : goodb[b - sizeof badb];
                int n = snprintf(body, sizeof body, "{\"k\":[\"");
                for (int i = 0; i < len; i++)
                    body[n++] = i == pos ? (char)ch : 'x';
                n += snprintf(body + n, sizeof body - (size_t)n, "\"]}");
                json_t *f = kvp__json_load_fast_only(body, (size_t)n);
                if ((f != NULL) == refuse)
                    wrong++;
                if (f && !refuse) {
                    const char *v = json_string_value(json_array_get(json_object_get(f, "k"), 0));
                    if (!v || strlen(v) != (size_t)len || (unsigned char)v[pos] != ch)
                        wrong++;
                }
                json_decref(f);
                /* the same byte in an object member's name */
                n = snprintf(body, sizeof body, "{\"");
                for (int i = 0; i < len; i++)
                    body[n++] = i == pos ? (char)ch : 'y';
                n += snprintf(body + n, sizeof body - (size_t)n, "\":1}");
                f = kvp__json_load_fast_only(body, (size_t)n);
                if ((f != NULL) == refuse)
                    wrong++;
                json_decref(f);
            }
        }
    CHECK_EQ(wrong, 0);

    /* a NUL byte inside the body */
    json_t *n = kvp__json_load_fast_only("{}\0{}", 5);
    CHECK(n == NULL);
    return check_report();
}
