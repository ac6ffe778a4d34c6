/*
 * The HTTP client of the benchmarks that drive a metadata server (bench
 * meta, bench trace): one libcurl easy handle per connection, kept alive,
 * with the request body built in place and the answer collected.
 */
#ifndef KVP_TOOLS_BENCH_HTTP_H
#define KVP_TOOLS_BENCH_HTTP_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

struct kvp__conn {
    CURL *h;
    struct curl_slist *hdrs;
    char *resp; /* the answer, NUL-terminated */
    size_t len, cap;
    char *body; /* the request under construction */
    size_t blen, bcap;
    char cerr[CURL_ERROR_SIZE];
    long status;
    int oom;
};

/* A connection with a bearer token (or none). Returns 0, -1 if libcurl
 * cannot make a handle. */
int kvp__conn_init(struct kvp__conn *c, const char *token);
void kvp__conn_free(struct kvp__conn *c);

/* The body under construction: appends, growing it (c->oom on failure,
 * reported by the next kvp__post). */
void kvp__body_put(struct kvp__conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvp__body_reset(struct kvp__conn *c);

/* POSTs the body to url. Returns 0 for a 2xx answer, the status otherwise,
 * -1 when no answer came (c->cerr says why). */
int kvp__post(struct kvp__conn *c, const char *url);

/* What a failed request says: the status and the start of the body. */
void kvp__describe(struct kvp__conn *c, int rc, const char *url, char *out, size_t n);

/* Prints s as a JSON string on standard output. */
void kvp__json_str(const char *s);

/*
 * One figure of a rank from GET /v1/stats of the server at url
 * (http://HOST:PORT[/ns/NAME]; kvpage serve's route, another server may
 * have none), in pool "kv": field is "num_pages", "held", ... Returns it, or
 * -1 when it cannot be told.
 */
int64_t kvp__rank_stat(struct kvp__conn *c, const char *url, uint32_t rank, const char *field);

/*
 * The next word of a command's flags, argv[*i]: returns 0 for an argument
 * that is not a flag (*word; "--" makes the word after it one, whatever it
 * looks like), 1 for a flag: its name, without "=VALUE", in name (n bytes),
 * and *word the VALUE after "=", or NULL; -1 when the name does not fit
 * (*word the whole word). *i moves past what was read.
 */
int kvp__flag_next(int argc, char **argv, int *i, char *name, size_t n, const char **word);

/* Whether -h or --help stands among argv[1..argc) before any "--". */
int kvp__wants_help(int argc, char **argv);

/* Whether u is an http://HOST:PORT[/ns/NAME] URL of a server. */
int kvp__server_url_ok(const char *u);

/* The bearer token: the one given, else $KVPAGE_TOKEN; NULL when empty. */
const char *kvp__bench_token(const char *given);

#endif
