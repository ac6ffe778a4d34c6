/*
 * kvpage bench trace FILE --url URL: a real workload through SGLang's routes.
 *
 * Replays a Mooncake trace (JSON lines {timestamp (ms), hash_ids: [block
 * ids], ...}, e.g. the FAST'25 conversation trace) against one rank of a
 * server as an SGLang engine with a storage tier would use it: per request,
 * in timestamp order (scaled by --speedup), exists of its pages, the hit
 * prefix (the leading run that exists) looked up as the engine loads it,
 * then reserve + confirm of the pages after the prefix (the server answers
 * "existed" for those it holds; the others are written). Several requests
 * run at once, one per connection, when their time has come. What it
 * measures: the prefix hit rate a rank of C pages gives this workload (which
 * bench/trace/lru_sim.py simulates), and whether the server keeps the trace's
 * schedule at a speed-up.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_http.h"
#include "cli.h"
#include "util/size.h"

#define CMD "kvpage bench trace"
#define KEYLEN 64 /* hex digits of a page key */

struct trace_args {
    const char *file, *url, *token;
    double speedup;    /* 0: as fast as it goes, no schedule */
    double max_lag_ms; /* the schedule holds while the p99 lag stays within */
    uint64_t capacity; /* pages of the rank */
    uint32_t rank, conns;
    int json;
};

/* One request of the trace: its blocks are ids[first, first + n). */
struct treq {
    double t_ms;
    size_t line, first;
    uint32_t n;
};

struct trace {
    struct treq *r;
    size_t nreq;
    uint64_t *ids;
    size_t nids, capids;
    uint64_t unique; /* distinct block ids */
};

struct tstats {
    uint64_t requests, blocks, hits, lost, unstored, written, errors;
    struct kvp__lat lag;
};

struct replay {
    const struct trace_args *a;
    const struct trace *tr;
    char url_exists[1100], url_get[1100], url_alloc[1100], url_confirm[1100], url_init[1100];
    double t0;          /* CLOCK_MONOTONIC seconds of the trace's time 0 */
    atomic_size_t next; /* the next request to start */
    atomic_size_t done; /* requests finished, for the progress bar */
    pthread_mutex_t lock;
    char first_error[400];
};

struct tworker {
    struct replay *rp;
    struct kvp__conn c;
    struct tstats st;
    char *keys;     /* KEYLEN + 1 per block of the request being replayed */
    size_t keycap;  /* blocks keys holds room for */
    int64_t *pages; /* per block after the prefix */
    pthread_t tid;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The page key of a block id: 64 hex digits like SGLang's page hashes, the
 * SHA-256 of "kvpage-trace-block:ID" (lru_sim.py and the tests derive the
 * same). */
static void block_key(uint64_t id, char *out)
{
    char in[48];
    unsigned char md[SHA256_DIGEST_LENGTH];
    int n = snprintf(in, sizeof in, "kvpage-trace-block:%" PRIu64, id);
    SHA256((const unsigned char *)in, (size_t)n, md);
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[KEYLEN] = 0;
}

/* ------------------------------------------------------------ the trace */

static int cmp_req(const void *x, const void *y)
{
    const struct treq *a = x, *b = y;
    if (a->t_ms != b->t_ms)
        return a->t_ms < b->t_ms ? -1 : 1;
    return a->line < b->line ? -1 : a->line > b->line;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static void trace_free(struct trace *t)
{
    free(t->r), free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Reads the trace; on a bad line prints FILE:LINE and why, and returns
 * KVP_EXIT_USAGE. Requests end up in timestamp order (stable). */
static int trace_load(const char *path, struct trace *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, CMD ": cannot open %s: %s\n", path, strerror(errno));
        return KVP_EXIT_USAGE;
    }
    char *line = NULL;
    size_t cap = 0, nline = 0, capreq = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        nline++;
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue; /* blank lines are skipped */
        json_error_t je;
        json_t *doc = json_loadb(line, (size_t)len, 0, &je);
        const char *why = NULL;
        json_t *ids = doc ? json_object_get(doc, "hash_ids") : NULL,
               *ts = doc ? json_object_get(doc, "timestamp") : NULL;
        if (!doc)
            why = je.text;
        else if (!json_is_object(doc))
            why = "not a JSON object";
        else if (!json_is_array(ids))
            why = "'hash_ids' must be a list of block ids (integers >= 0)";
        else if (ts && (!json_is_number(ts) || json_number_value(ts) < 0))
            why = "'timestamp' must be a number >= 0 (ms)";
        else if (json_array_size(ids) > UINT32_MAX)
            why = "too many blocks";
        size_t i;
        json_t *v;
        if (!why)
            json_array_foreach(ids, i, v) if (!json_is_integer(v) || json_integer_value(v) < 0)
            {
                why = "'hash_ids' must be a list of block ids (integers >= 0)";
                break;
            }
        if (why) {
            fprintf(stderr, CMD ": %s:%zu: %s%s\n", path, nline, doc ? "" : "not JSON: ", why);
            json_decref(doc);
            rc = KVP_EXIT_USAGE;
            break;
        }
        size_t n = json_array_size(ids);
        if (t->nreq == capreq) {
            capreq = capreq ? capreq * 2 : 1024;
            struct treq *r = realloc(t->r, capreq * sizeof *r);
            if (!r)
                goto oom;
            t->r = r;
        }
        if (t->nids + n > t->capids) {
            size_t c2 = (t->nids + n) * 2 + 1024;
            uint64_t *p = realloc(t->ids, c2 * sizeof *p);
            if (!p)
                goto oom;
            t->ids = p, t->capids = c2;
        }
        t->r[t->nreq++] =
            (struct treq){ts ? json_number_value(ts) : 0, nline, t->nids, (uint32_t)n};
        json_array_foreach(ids, i, v) t->ids[t->nids++] = (uint64_t)json_integer_value(v);
        json_decref(doc);
        continue;
    oom:
        json_decref(doc);
        fprintf(stderr, CMD ": out of memory reading %s\n", path);
        rc = KVP_EXIT_FAILED;
        break;
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, CMD ": cannot read %s: %s\n", path, strerror(errno));
        rc = KVP_EXIT_USAGE;
    }
    free(line);
    fclose(f);
    if (!rc && !t->nreq) {
        fprintf(stderr, CMD ": %s holds no requests (JSON lines with \"hash_ids\")\n", path);
        rc = KVP_EXIT_USAGE;
    }
    if (rc) {
        trace_free(t);
        return rc;
    }
    qsort(t->r, t->nreq, sizeof *t->r, cmp_req);
    /* Distinct blocks: what an infinite cache could hit is the rest. */
    uint64_t *s = malloc((t->nids ? t->nids : 1) * sizeof *s);
    if (!s) {
        trace_free(t);
        fprintf(stderr, CMD ": out of memory\n");
        return KVP_EXIT_FAILED;
    }
    memcpy(s, t->ids, t->nids * sizeof *s);
    qsort(s, t->nids, sizeof *s, cmp_u64);
    for (size_t i = 0; i < t->nids; i++)
        t->unique += !i || s[i] != s[i - 1];
    free(s);
    return 0;
}

/* ------------------------------------------------------------ the replay */

static void fail(struct replay *rp, struct tworker *w, int rc, const char *url)
{
    w->st.errors++;
    pthread_mutex_lock(&rp->lock);
    if (!rp->first_error[0])
        kvp__describe(&w->c, rc, url, rp->first_error, sizeof rp->first_error);
    pthread_mutex_unlock(&rp->lock);
}

/* The body {"keys": [keys[from, to)]}. */
static void body_keys(struct tworker *w, size_t from, size_t to)
{
    kvp__body_reset(&w->c);
    kvp__body_put(&w->c, "{\"keys\": [");
    for (size_t j = from; j < to; j++)
        kvp__body_put(&w->c, "%s\"%s\"", j > from ? ", " : "", w->keys + j * (KEYLEN + 1));
    kvp__body_put(&w->c, "]}");
}

/* The answer's list under name, or NULL with the reason in the connection's
 * error (the caller owns doc). */
static json_t *answer_list(struct tworker *w, const char *name, size_t want, json_t **doc)
{
    *doc = json_loadb(w->c.resp ? w->c.resp : "", w->c.len, 0, NULL);
    json_t *l = json_object_get(*doc, name);
    if (!json_is_array(l) || json_array_size(l) != want) {
        snprintf(w->c.cerr, sizeof w->c.cerr, "the answer has no \"%s\" of %zu elements: %.200s",
                 name, want, w->c.resp ? w->c.resp : "");
        return NULL;
    }
    return l;
}

/* One request of the trace, as the engine makes it. */
static void replay_one(struct tworker *w, const struct treq *q)
{
    struct replay *rp = w->rp;
    const uint64_t *ids = rp->tr->ids + q->first;
    size_t n = q->n;
    w->st.requests++;
    w->st.blocks += n;
    if (!n)
        return;
    for (size_t j = 0; j < n; j++)
        block_key(ids[j], w->keys + j * (KEYLEN + 1));
    json_t *doc = NULL, *l;
    int rc;
    /* 1. exists: how many leading pages are stored. */
    body_keys(w, 0, n);
    if ((rc = kvp__post(&w->c, rp->url_exists)) != 0)
        goto failed_exists;
    if (!(l = answer_list(w, "exists", n, &doc))) {
        rc = -1;
        goto failed_exists;
    }
    size_t prefix = 0;
    while (prefix < n && json_is_true(json_array_get(l, prefix)))
        prefix++;
    json_decref(doc), doc = NULL;
    /* 2. the prefix's pages, as the engine loads them: the hits are what
     * this lookup found (another connection may have evicted some since). */
    size_t hit = 0;
    if (prefix) {
        body_keys(w, 0, prefix);
        if ((rc = kvp__post(&w->c, rp->url_get)) != 0)
            goto failed_get;
        if (!(l = answer_list(w, "indices", prefix, &doc))) {
            rc = -1;
            goto failed_get;
        }
        while (hit < prefix && json_is_integer(json_array_get(l, hit)))
            hit++;
        json_decref(doc), doc = NULL;
    }
    w->st.hits += hit;
    w->st.lost += prefix - hit;
    if (hit == n)
        return;
    /* 3. the pages after the prefix: reserved (those held answer "existed"
     * and are left alone), then the new ones confirmed as written. Each key
     * names the one before it as its prefix_key, as SGLang's do. */
    kvp__body_reset(&w->c);
    kvp__body_put(&w->c, "{\"keys\": [");
    for (size_t j = hit; j < n; j++)
        kvp__body_put(&w->c, "%s[\"%s\", \"%s\"]", j > hit ? ", " : "", w->keys + j * (KEYLEN + 1),
                      j ? w->keys + (j - 1) * (KEYLEN + 1) : "");
    kvp__body_put(&w->c, "]}");
    if ((rc = kvp__post(&w->c, rp->url_alloc)) != 0)
        goto failed_alloc;
    if (!(l = answer_list(w, "indices", n - hit, &doc))) {
        rc = -1;
        goto failed_alloc;
    }
    size_t nnew = 0;
    for (size_t j = hit; j < n; j++) {
        json_t *e = json_array_get(l, j - hit);
        json_t *ex = json_array_get(e, 0), *pg = json_array_get(e, 1);
        if (!json_is_boolean(ex) || !json_is_integer(pg)) {
            snprintf(w->c.cerr, sizeof w->c.cerr, "indices[%zu] is not [existed, page]: %.200s",
                     j - hit, w->c.resp);
            rc = -1;
            goto failed_alloc;
        }
        int64_t p = json_is_true(ex) ? -2 : (int64_t)json_integer_value(pg);
        if (p == -1)
            w->st.unstored++;
        /* A block repeated within the request got the page of its first
         * occurrence: written once. */
        for (size_t k = 0; p >= 0 && k < j - hit; k++)
            if (w->pages[k] == p)
                p = -3;
        w->pages[j - hit] = p;
        nnew += p >= 0;
    }
    json_decref(doc), doc = NULL;
    if (!nnew)
        return;
    kvp__body_reset(&w->c);
    kvp__body_put(&w->c, "{\"written_keys_to_confirm\": [");
    int any = 0;
    for (size_t j = hit; j < n; j++) {
        if (w->pages[j - hit] < 0)
            continue;
        kvp__body_put(&w->c, "%s[\"%s\", %" PRId64 "]", any ? ", " : "", w->keys + j * (KEYLEN + 1),
                      w->pages[j - hit]);
        any = 1;
    }
    kvp__body_put(&w->c, "], \"pages_to_release\": []}");
    if ((rc = kvp__post(&w->c, rp->url_confirm)) != 0) {
        fail(rp, w, rc, rp->url_confirm);
        return;
    }
    w->st.written += nnew;
    return;
failed_exists:
    fail(rp, w, rc, rp->url_exists);
    json_decref(doc);
    return;
failed_get:
    fail(rp, w, rc, rp->url_get);
    json_decref(doc);
    return;
failed_alloc:
    fail(rp, w, rc, rp->url_alloc);
    json_decref(doc);
}

static void *worker_main(void *arg)
{
    struct tworker *w = arg;
    struct replay *rp = w->rp;
    const struct trace_args *a = rp->a;
    for (;;) {
        size_t i = atomic_fetch_add(&rp->next, 1);
        if (i >= rp->tr->nreq)
            break;
        const struct treq *q = &rp->tr->r[i];
        if (a->speedup > 0) {
            double due = rp->t0 + q->t_ms / 1000.0 / a->speedup, t = now_s();
            while (t < due) {
                double left = due - t;
                usleep((useconds_t)(left > 0.1 ? 1e5 : left * 1e6 + 1));
                t = now_s();
            }
            kvp__lat_add(&w->st.lag, (uint64_t)((t - due) * 1e9));
        }
        if (q->n > w->keycap) {
            free(w->keys), free(w->pages);
            w->keys = malloc((size_t)q->n * (KEYLEN + 1));
            w->pages = malloc((size_t)q->n * sizeof *w->pages);
            w->keycap = w->keys && w->pages ? q->n : 0;
        }
        if (q->n > w->keycap) {
            snprintf(w->c.cerr, sizeof w->c.cerr, "out of memory for %u keys", q->n);
            fail(rp, w, -1, rp->url_exists);
        } else {
            replay_one(w, q);
        }
        atomic_fetch_add(&rp->done, 1);
    }
    return NULL;
}

/* ------------------------------------------------------------ the command */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvpage bench trace FILE --url URL [flags]\n"
            "A real workload: replays a Mooncake trace (JSON lines {\"timestamp\": ms,\n"
            "\"hash_ids\": [block ids], ...}, e.g. the FAST'25 conversation trace) through\n"
            "SGLang's routes of the server at URL (http://HOST:PORT[/ns/NAME]) as an engine\n"
            "with a storage tier would: per request, in timestamp order scaled by --speedup,\n"
            "exists of its pages, get_page_indices of the hit prefix (the leading pages that\n"
            "exist, as the engine loads them), then reserve_and_allocate_page_indices of the\n"
            "pages after the prefix and confirm_write of those it lacked. A request starts\n"
            "when its time has come, on the first of --connections that is free. A block's\n"
            "key is the SHA-256 of \"kvpage-trace-block:ID\" in hex.\n"
            "It initializes the rank with --capacity pages and needs it EMPTY: point it at a\n"
            "deployment of its own (http://HOST:PORT/ns/NAME); the keys stay afterwards.\n"
            "Run the server with --read-grace-ms 0 to compare with an LRU simulation\n"
            "(bench/trace/lru_sim.py): the grace (default 5 s of wall time) keeps pages just\n"
            "looked up from eviction, which at a speed-up is many trace seconds.\n"
            "flags:\n"
            "  --url URL          the server (required)\n"
            "  --speedup X        replay X times faster than the trace's timestamps (default\n"
            "                     1); 0: as fast as it goes, no schedule\n"
            "  --capacity C       pages of the rank (default 1048576, more than the trace's\n"
            "                     blocks: no eviction)\n"
            "  --rank R           default 0\n"
            "  --connections N    requests at once, one thread each (default 4)\n"
            "  --max-lag-ms MS    the schedule holds while the 99th percentile of how late\n"
            "                     requests start stays within MS (default 100)\n"
            "  --token T          bearer token (default $KVPAGE_TOKEN)\n"
            "  --json             one JSON object on standard output, nothing else there\n"
            "figures (names as in --json):\n"
            "  requests, blocks, unique_blocks; reuse_ceiling (%% of blocks seen before: what\n"
            "  an infinite cache could hit), prefix_hit_blocks and hit_rate (%% of all blocks\n"
            "  that were in a request's hit prefix), lost_blocks (in the prefix at exists,\n"
            "  evicted by another connection before the lookup), unstored_blocks (no page\n"
            "  could be had), written_blocks; seconds, requests_s (achieved), trace_seconds\n"
            "  (the trace's span at the speed-up); lag_p50_ms, lag_p99_ms, lag_max_ms (how\n"
            "  late requests started), schedule_held (null at --speedup 0); errors,\n"
            "  first_error\n"
            "exit status: 0 done, 2 a bad flag, value or trace line (FILE:LINE says which),\n"
            "3 the server could not be reached, the rank is not empty, or a request failed\n"
            "examples:\n"
            "  kvpage serve --listen 127.0.0.1:18000 --read-grace-ms 0 &\n"
            "  kvpage bench trace conversation_trace.jsonl --url "
            "http://127.0.0.1:18000/ns/trace \\\n"
            "      --capacity 30000 --speedup 10\n");
}

/* Prints "kvpage bench trace: " what is wrong, where to read more; returns
 * the exit status of a usage error. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(CMD ": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (kvpage bench trace --help)\n", stderr);
    return KVP_EXIT_USAGE;
}

/* A number in [lo, hi] into *out; a usage error otherwise. */
static int parse_number(const char *name, const char *value, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(value, &end);
    if (!*value || errno || *end || !(d >= lo) || d > hi)
        return usage_error("%s '%s' is not a number from %g to %g", name, value, lo, hi);
    *out = d;
    return 0;
}

/* A whole number in [lo, hi]; a usage error naming what it should be. */
static int parse_count(const char *name, const char *value, uint64_t lo, uint64_t hi,
                       const char *what, uint64_t *out)
{
    if (kvp__parse_size(value, 0, out) || *out < lo || *out > hi)
        return usage_error("%s '%s' is not %s (%" PRIu64 " .. %" PRIu64 ")", name, value, what, lo,
                           hi);
    return 0;
}

static int parse_args(int argc, char **argv, struct trace_args *a)
{
    static const char *const known[] = {"--url",         "--speedup",    "--capacity", "--rank",
                                        "--connections", "--max-lag-ms", "--token"};
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *value;
        int kind = kvp__flag_next(argc, argv, &i, name, sizeof name, &value), k = -1, rc = 0;
        if (kind == 0) {
            if (a->file)
                return usage_error("unexpected argument '%s' (one trace FILE only)", value);
            a->file = value;
            continue;
        }
        for (int j = 0; kind > 0 && j < (int)(sizeof known / sizeof *known); j++)
            if (!strcmp(name, known[j]))
                k = j;
        if (kind > 0 && !strcmp(name, "--json")) {
            if (value)
                return usage_error("--json takes no value");
            a->json = 1;
            continue;
        }
        if (k < 0)
            return usage_error("unknown flag '%s'", kind < 0 ? value : name);
        if (!value && !(value = i + 1 < argc ? argv[++i] : NULL))
            return usage_error("%s needs a value", name);
        uint64_t v = 0;
        if (k == 0)
            a->url = value;
        else if (k == 1)
            rc = parse_number(name, value, 0, 1e9, &a->speedup);
        else if (k == 2 && !(rc = parse_count(name, value, 1, 2147483647, "a page count", &v)))
            a->capacity = v;
        else if (k == 3 && !(rc = parse_count(name, value, 0, 2147483647, "a rank", &v)))
            a->rank = (uint32_t)v;
        else if (k == 4 && !(rc = parse_count(name, value, 1, 1024, "a count", &v)))
            a->conns = (uint32_t)v;
        else if (k == 5)
            rc = parse_number(name, value, 0, 86400e3, &a->max_lag_ms);
        else if (k == 6)
            a->token = value;
        if (rc)
            return rc;
    }
    if (!a->file)
        return usage_error("a trace FILE is required");
    if (!a->url)
        return usage_error("--url is required, e.g. --url http://127.0.0.1:18000/ns/trace");
    if (!kvp__server_url_ok(a->url))
        return usage_error("'%s' is not an http://HOST:PORT[/ns/NAME] URL", a->url);
    a->token = kvp__bench_token(a->token);
    return 0;
}

/* Initializes the rank with the capacity and checks that it holds nothing.
 * Returns 0 or the exit status after printing why. */
static int prepare(struct replay *rp, struct kvp__conn *c)
{
    const struct trace_args *a = rp->a;
    char why[400];
    kvp__body_reset(c);
    kvp__body_put(c, "{\"num_pages\": %" PRIu64 "}", a->capacity);
    int rc = kvp__post(c, rp->url_init);
    if (rc < 0) {
        fprintf(stderr, CMD ": cannot reach %s: %s\n", a->url, c->cerr);
        return KVP_EXIT_FAILED;
    }
    if (rc) {
        kvp__describe(c, rc, rp->url_init, why, sizeof why);
        fprintf(stderr, CMD ": cannot initialize rank %u with %" PRIu64 " pages: %s%s\n", a->rank,
                a->capacity, why,
                rc == 401   ? " (give the server's token with --token or $KVPAGE_TOKEN)"
                : rc == 409 ? " (replay into an empty rank: a deployment of its own, "
                              "http://HOST:PORT/ns/NAME)"
                            : "");
        return KVP_EXIT_FAILED;
    }
    int64_t held = kvp__rank_stat(c, a->url, a->rank, "held");
    if (held > 0) {
        fprintf(stderr,
                CMD ": rank %u of %s holds %" PRId64 " pages already: the hit rate would not be "
                    "the trace's; replay into an empty rank (a deployment of its own, "
                    "http://HOST:PORT/ns/NAME, or clear it: kvpage clear)\n",
                a->rank, a->url, held);
        return KVP_EXIT_FAILED;
    }
    return 0;
}

static void report(const struct replay *rp, const struct tstats *s, double secs)
{
    const struct trace_args *a = rp->a;
    const struct trace *tr = rp->tr;
    double hit_rate = s->blocks ? 100.0 * (double)s->hits / (double)s->blocks : 0,
           ceiling = tr->nids ? 100.0 * (double)(tr->nids - tr->unique) / (double)tr->nids : 0,
           span = a->speedup > 0 ? (tr->r[tr->nreq - 1].t_ms - tr->r[0].t_ms) / 1000.0 / a->speedup
                                 : 0,
           p50 = kvp__lat_quantile(&s->lag, 0.5) / 1e6,
           p99 = kvp__lat_quantile(&s->lag, 0.99) / 1e6, max = (double)s->lag.max_ns / 1e6,
           rps = secs > 0 ? (double)s->requests / secs : 0;
    int held = a->speedup > 0 && p99 <= a->max_lag_ms;
    if (a->json) {
        printf("{\"file\": ");
        kvp__json_str(a->file);
        printf(", \"url\": ");
        kvp__json_str(a->url);
        printf(", \"rank\": %u, \"capacity\": %" PRIu64 ", \"speedup\": %g, \"connections\": %u, "
               "\"max_lag_ms\": %g,\n \"requests\": %" PRIu64 ", \"blocks\": %" PRIu64
               ", \"unique_blocks\": %" PRIu64 ", \"reuse_ceiling\": %.4f, "
               "\"prefix_hit_blocks\": %" PRIu64 ", \"hit_rate\": %.4f, \"lost_blocks\": %" PRIu64
               ", \"unstored_blocks\": %" PRIu64 ", \"written_blocks\": %" PRIu64 ",\n"
               " \"seconds\": %.3f, \"requests_s\": %.1f, \"trace_seconds\": %.3f, ",
               a->rank, a->capacity, a->speedup, a->conns, a->max_lag_ms, s->requests, s->blocks,
               tr->unique, ceiling, s->hits, hit_rate, s->lost, s->unstored, s->written, secs, rps,
               span);
        if (a->speedup > 0)
            printf("\"lag_p50_ms\": %.3f, \"lag_p99_ms\": %.3f, \"lag_max_ms\": %.3f, "
                   "\"schedule_held\": %s",
                   p50, p99, max, held ? "true" : "false");
        else
            printf("\"lag_p50_ms\": null, \"lag_p99_ms\": null, \"lag_max_ms\": null, "
                   "\"schedule_held\": null");
        printf(",\n \"errors\": %" PRIu64 ", \"first_error\": ", s->errors);
        if (rp->first_error[0])
            kvp__json_str(rp->first_error);
        else
            printf("null");
        printf("}\n");
        return;
    }
    printf("%s -> %s (rank %u, %" PRIu64 " pages, %u connection%s, speed-up ", a->file, a->url,
           a->rank, a->capacity, a->conns, a->conns == 1 ? "" : "s");
    if (a->speedup > 0)
        printf("%gx)\n", a->speedup);
    else
        printf("none: as fast as it goes)\n");
    printf("  requests   %" PRIu64 " in %.1f s: %.1f requests/s", s->requests, secs, rps);
    if (a->speedup > 0)
        printf(" (the trace's span at %gx: %.1f s)", a->speedup, span);
    printf("\n  blocks     %" PRIu64 " (%" PRIu64 " unique; reuse ceiling %.2f%%)\n", s->blocks,
           tr->unique, ceiling);
    printf("  hit rate   %.2f%% (%" PRIu64 " blocks in a hit prefix", hit_rate, s->hits);
    if (s->lost)
        printf("; %" PRIu64 " lost between exists and the lookup", s->lost);
    if (s->unstored)
        printf("; %" PRIu64 " got no page", s->unstored);
    printf(")\n");
    if (a->speedup > 0)
        printf("  schedule   %s (lag p50 %.1f ms, p99 %.1f ms, max %.1f ms; held while p99 <= "
               "%g ms)\n",
               held ? "held" : "NOT held", p50, p99, max, a->max_lag_ms);
    printf("  errors     %" PRIu64 "%s%s\n", s->errors, rp->first_error[0] ? ": " : "",
           rp->first_error);
}

int kvp__cli_bench_trace(int argc, char **argv)
{
    if (kvp__wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    struct trace_args a = {.speedup = 1, .max_lag_ms = 100, .capacity = 1048576, .conns = 4};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    struct trace tr;
    if ((rc = trace_load(a.file, &tr)) != 0)
        return rc;
    struct replay *rp = calloc(1, sizeof *rp);
    struct tworker *w = calloc(a.conns, sizeof *w);
    if (!rp || !w) {
        free(rp), free(w);
        trace_free(&tr);
        fprintf(stderr, CMD ": out of memory\n");
        return KVP_EXIT_FAILED;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rp->a = &a, rp->tr = &tr;
    pthread_mutex_init(&rp->lock, NULL);
    char base[1024];
    snprintf(base, sizeof base, "%s", a.url);
    size_t bl = strlen(base);
    if (bl && base[bl - 1] == '/')
        base[bl - 1] = 0;
    snprintf(rp->url_exists, sizeof rp->url_exists, "%s/%u/exists", base, a.rank);
    snprintf(rp->url_get, sizeof rp->url_get, "%s/%u/get_page_indices", base, a.rank);
    snprintf(rp->url_alloc, sizeof rp->url_alloc, "%s/%u/reserve_and_allocate_page_indices", base,
             a.rank);
    snprintf(rp->url_confirm, sizeof rp->url_confirm, "%s/%u/confirm_write", base, a.rank);
    snprintf(rp->url_init, sizeof rp->url_init, "%s/%u/initialize", base, a.rank);
    uint32_t nconns = 0, started = 0;
    for (; nconns < a.conns; nconns++) {
        w[nconns].rp = rp;
        if (kvp__conn_init(&w[nconns].c, a.token)) {
            fprintf(stderr, CMD ": cannot set up a connection (libcurl)\n");
            rc = KVP_EXIT_FAILED;
            goto out;
        }
    }
    if ((rc = prepare(rp, &w[0].c)) != 0)
        goto out;
    int tty = isatty(2);
    /* The trace's first request starts now. */
    rp->t0 = now_s() - (a.speedup > 0 ? tr.r[0].t_ms / 1000.0 / a.speedup : 0);
    double t_start = now_s();
    for (; started < a.conns; started++)
        if (pthread_create(&w[started].tid, NULL, worker_main, &w[started]))
            break;
    if (started < a.conns) {
        fprintf(stderr, CMD ": cannot start %u threads (started %u)\n", a.conns, started);
        atomic_store(&rp->next, tr.nreq); /* the started ones stop */
        rc = KVP_EXIT_FAILED;
    }
    while (started && atomic_load(&rp->done) < tr.nreq && !rc) {
        if (tty) {
            size_t d = atomic_load(&rp->done);
            double t = now_s() - t_start;
            char label[96];
            snprintf(label, sizeof label, "%zu of %zu requests, %.0f requests/s", d, tr.nreq,
                     t > 0 ? (double)d / t : 0.0);
            kvp__progress_bar((double)d / (double)tr.nreq * 0.999, label);
        }
        usleep(100000);
    }
    struct tstats s;
    memset(&s, 0, sizeof s);
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(w[i].tid, NULL);
        s.requests += w[i].st.requests, s.blocks += w[i].st.blocks, s.hits += w[i].st.hits;
        s.lost += w[i].st.lost, s.unstored += w[i].st.unstored, s.written += w[i].st.written;
        s.errors += w[i].st.errors;
        kvp__lat_merge(&s.lag, &w[i].st.lag);
    }
    double secs = now_s() - t_start;
    if (tty && !rc)
        kvp__progress_bar(1, "done");
    if (rc)
        goto out;
    report(rp, &s, secs);
    if (s.errors) {
        fprintf(stderr, CMD ": %" PRIu64 " request(s) failed; the first: %s\n", s.errors,
                rp->first_error);
        rc = KVP_EXIT_FAILED;
    }
out:
    for (uint32_t i = 0; i < nconns; i++) {
        kvp__conn_free(&w[i].c);
        free(w[i].keys), free(w[i].pages);
    }
    pthread_mutex_destroy(&rp->lock);
    free(rp), free(w);
    trace_free(&tr);
    curl_global_cleanup();
    return rc;
}
