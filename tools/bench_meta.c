/*
 * kvpage bench meta URL: how much can one metadata server take?
 *
 * Drives a server of either dialect with the engines' request shapes: one
 * thread per keep-alive connection (libcurl easy handles), each sending
 * batches of --batch keys back to back for --seconds per operation. Lookups
 * ask about keys this run wrote first (hits, as an engine's prefix lookups
 * mostly are); writes are allocate + confirm pairs of fresh keys, the two
 * requests an engine makes per stored batch.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_http.h"
#include "cli.h"
#include "util/size.h"

#define CMD "kvpage bench meta"

enum { OP_EXISTS, OP_LOCATIONS, OP_WRITE, NOPS };
static const char *const op_names[NOPS] = {"exists", "locations", "write"};

struct meta_args {
    const char *url, *token;
    int sglang, json;
    uint32_t rank, batch, conns;
    uint64_t pages;
    double seconds;
    int ops[NOPS], nops; /* in the order given */
};

struct op_stats {
    uint64_t requests, keys, errors;
    struct kvp__lat lat;
};

struct bench {
    const struct meta_args *a;
    char base[1024];
    char url_exists[1100], url_locations[1100], url_alloc[1100], url_confirm[1100], url_init[1100];
    char url_delete[1100];
    uint32_t run;       /* tells this run's keys from another's */
    uint64_t nheld;     /* keys written before the lookups: kvpbench-RUN-hI */
    uint64_t held_done; /* of them, the batches written (or tried) so far, in keys */
    uint64_t *written;  /* per connection: kvpbench-RUN-cC-I written for I < written[C] */
    atomic_int state;   /* 1 measuring, 2 stop */
    pthread_mutex_t lock;
    char first_error[400];
    uint64_t total_errors;
};

struct worker {
    struct bench *b;
    struct kvp__conn *c;
    uint32_t id;
    int op;
    atomic_uint_fast64_t live; /* requests so far, for the progress bar */
    struct op_stats st;
    pthread_t tid;
};

static void keyname(char *buf, size_t n, uint32_t run, uint32_t conn, uint64_t i, int held)
{
    if (held)
        snprintf(buf, n, "kvpbench-%08x-h%" PRIu64, run, i);
    else
        snprintf(buf, n, "kvpbench-%08x-c%u-%" PRIu64, run, conn, i);
}

static void body_allocate(struct bench *b, struct kvp__conn *c, uint32_t conn, uint64_t first,
                          int held)
{
    const struct meta_args *a = b->a;
    kvp__body_reset(c);
    if (a->sglang)
        kvp__body_put(c, "{\"keys\": [");
    else
        kvp__body_put(c, "{\"rank\": %u, \"keys\": [", a->rank);
    for (uint32_t i = 0; i < a->batch; i++) {
        char k[80];
        keyname(k, sizeof k, b->run, conn, first + i, held);
        kvp__body_put(c, "%s[\"%s\", \"\"]", i ? ", " : "", k);
    }
    kvp__body_put(c, "]}");
}

/*
 * Reads the pages of an allocation's answer ("results": [[key, page], ...]
 * or "indices": [[existed, page], ...]): the integer after the last comma of
 * each pair. Returns how many were read.
 */
static uint32_t parse_pages(const struct kvp__conn *c, int sglang, int64_t *pages, uint32_t n)
{
    const char *p = c->resp ? strstr(c->resp, sglang ? "\"indices\"" : "\"results\"") : NULL;
    if (!p || !(p = strchr(p, '[')))
        return 0;
    p++;
    uint32_t got = 0;
    while (got < n) {
        const char *open = strchr(p, '['), *close = open ? strchr(open, ']') : NULL;
        if (!close)
            break;
        const char *comma = NULL;
        for (const char *q = open; q < close; q++)
            if (*q == ',')
                comma = q;
        if (!comma)
            break;
        pages[got++] = strtoll(comma + 1, NULL, 10);
        p = close + 1;
    }
    return got;
}

/* One allocate + confirm pair of a batch of keys. Returns as kvp__post(), with
 * *which the URL of the request that failed. */
static int write_pair(struct bench *b, struct kvp__conn *c, uint32_t conn, uint64_t first, int held,
                      int64_t *pages, const char **which)
{
    const struct meta_args *a = b->a;
    body_allocate(b, c, conn, first, held);
    *which = b->url_alloc;
    int rc = kvp__post(c, b->url_alloc);
    if (rc)
        return rc;
    if (parse_pages(c, a->sglang, pages, a->batch) != a->batch) {
        snprintf(c->cerr, sizeof c->cerr, "the answer does not hold %u pages: %.200s", a->batch,
                 c->resp ? c->resp : "");
        return -1;
    }
    kvp__body_reset(c);
    if (a->sglang)
        kvp__body_put(c, "{\"written_keys_to_confirm\": [");
    else
        kvp__body_put(c, "{\"rank\": %u, \"confirmations\": [", a->rank);
    int any = 0;
    for (uint32_t i = 0; i < a->batch; i++) {
        if (pages[i] < 0) /* no page free: the engine skips the key */
            continue;
        char k[80];
        keyname(k, sizeof k, b->run, conn, first + i, held);
        kvp__body_put(c, "%s[\"%s\", %" PRId64 "]", any ? ", " : "", k, pages[i]);
        any = 1;
    }
    kvp__body_put(c, "], \"pages_to_release\": []}");
    *which = b->url_confirm;
    return any ? kvp__post(c, b->url_confirm) : 0;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct bench *b = w->b;
    const struct meta_args *a = b->a;
    struct kvp__conn *c = w->c;
    uint64_t seed = 0xbe7c4000ull + w->id * 104729ull + (uint64_t)w->op * 7919ull, next = 0;
    int64_t *pages = calloc(a->batch, sizeof *pages);
    if (!pages)
        c->oom = 1;
    while (atomic_load_explicit(&b->state, memory_order_relaxed) == 1) {
        const char *url = w->op == OP_EXISTS ? b->url_exists : b->url_locations;
        struct timespec t0, t1;
        int rc;
        if (w->op == OP_WRITE) {
            clock_gettime(CLOCK_MONOTONIC, &t0);
            rc = pages ? write_pair(b, c, w->id, next, 0, pages, &url) : -1;
            next += a->batch;
        } else {
            kvp__body_reset(c);
            if (w->op == OP_LOCATIONS && !a->sglang)
                kvp__body_put(c, "{\"rank\": %u, \"keys\": [", a->rank);
            else
                kvp__body_put(c, "{\"keys\": [");
            for (uint32_t i = 0; i < a->batch; i++) {
                char k[80];
                keyname(k, sizeof k, b->run, 0, rnd(&seed) % b->nheld, 1);
                kvp__body_put(c, "%s\"%s\"", i ? ", " : "", k);
            }
            kvp__body_put(c, "]}");
            clock_gettime(CLOCK_MONOTONIC, &t0);
            rc = kvp__post(c, url);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        w->st.requests++;
        atomic_fetch_add_explicit(&w->live, 1, memory_order_relaxed);
        if (rc) {
            w->st.errors++;
            pthread_mutex_lock(&b->lock);
            if (!b->first_error[0])
                kvp__describe(c, rc, url, b->first_error, sizeof b->first_error);
            pthread_mutex_unlock(&b->lock);
            if (rc < 0) /* no server: do not spin on a refused connection */
                usleep(10000);
            continue;
        }
        w->st.keys += a->batch;
        kvp__lat_add(&w->st.lat, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000ll +
                                            (t1.tv_nsec - t0.tv_nsec)));
    }
    if (w->op == OP_WRITE && next > b->written[w->id])
        b->written[w->id] = next; /* each connection's own slot, joined before it is read */
    free(pages);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvpage bench meta URL [flags]\n"
            "How much can one metadata server take? Drives a running kvpage serve (or any\n"
            "server of the vLLM or SGLang protocol) at URL, http://HOST:PORT[/ns/NAME], with\n"
            "the engines' request shapes from --connections keep-alive connections at once.\n"
            "It WRITES KEYS to the server: --batch x 200 keys first (what the lookups ask\n"
            "about), and fresh keys for as long as the write operation runs, evicting older\n"
            "keys when the rank is full. Point it at a deployment of its own,\n"
            "http://HOST:PORT/ns/NAME, never at the one your engines use. Ctrl-C (SIGINT,\n"
            "SIGTERM, SIGHUP) deletes the keys the run wrote before it exits.\n"
            "flags:\n"
            "  --dialect vllm|sglang   the protocol, default vllm\n"
            "  --rank R           default 0\n"
            "  --batch N          keys per request, default 64\n"
            "  --connections N    at once, one thread each, default 16\n"
            "  --seconds S        per operation, default 10\n"
            "  --ops LIST         comma-separated, default exists,locations,write:\n"
            "                       exists     batch_exists (vllm) / exists (sglang) of held keys\n"
            "                       locations  get_locations / get_page_indices of held keys\n"
            "                       write      batch_allocate + confirm_write (vllm) /\n"
            "                                  reserve_and_allocate_page_indices + confirm_write\n"
            "                                  (sglang) of fresh keys; one pair is one request\n"
            "  --pages N          initialize the rank with N pages (default 1048576) unless it\n"
            "                     is initialized already: then it is used as it is\n"
            "  --token T          bearer token (default $KVPAGE_TOKEN)\n"
            "  --json             one JSON object on standard output, nothing else there\n"
            "A progress bar is drawn on standard error when it is a terminal, one line per\n"
            "operation otherwise.\n"
            "figures (per operation, under \"ops\" in --json):\n"
            "  requests, requests_s (requests/s), keys_s (keys/s), p50_ms, p99_ms, max_ms\n"
            "  (latency of one successful request, or of one allocate + confirm pair),\n"
            "  errors (answers that were not 2xx, and requests that got no answer)\n"
            "  and url, dialect, rank, batch, connections, seconds, initialized (whether\n"
            "  this run initialized the rank), num_pages (the rank's size; null when it\n"
            "  was initialized already and GET /v1/stats does not tell), held_keys (keys\n"
            "  written for the lookups), errors (total), first_error (or null)\n"
            "exit status: 0 done, 2 a bad flag or value, 3 the server could not be reached\n"
            "or answered an error (the first one is printed)\n"
            "examples:\n"
            "  kvpage bench meta http://10.0.0.5:18000/ns/bench\n"
            "  kvpage bench meta http://127.0.0.1:18000/ns/bench --dialect sglang --batch 256 "
            "--ops exists --json\n");
}

static int usage_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, CMD ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (kvpage bench meta --help)\n");
    return KVP_EXIT_USAGE;
}

static int parse_args(int argc, char **argv, struct meta_args *a)
{
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *value;
        int kind = kvp__flag_next(argc, argv, &i, name, sizeof name, &value);
        if (kind < 0)
            return usage_error("unknown flag '%s'%s", value, "");
        if (kind == 0) {
            if (a->url)
                return usage_error("unexpected argument '%s' (one URL only)%s", value, "");
            a->url = value;
            continue;
        }
        if (!strcmp(name, "--json")) {
            if (value)
                return usage_error("--json takes no value%s%s", "", "");
            a->json = 1;
            continue;
        }
        static const char *const known[] = {"--dialect", "--rank", "--batch", "--connections",
                                            "--seconds", "--ops",  "--pages", "--token"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
            if (!strcmp(name, known[j]))
                k = j;
        if (k < 0)
            return usage_error("unknown flag '%s'%s", name, "");
        if (!value)
            value = i + 1 < argc ? argv[++i] : NULL;
        if (!value)
            return usage_error("%s needs a value%s", name, "");
        uint64_t v = 0;
        switch (k) {
        case 0:
            if (strcmp(value, "vllm") && strcmp(value, "sglang"))
                return usage_error("--dialect '%s' is not vllm or sglang%s", value, "");
            a->sglang = !strcmp(value, "sglang");
            break;
        case 1:
            if (kvp__parse_size(value, 0, &v) || v > 2147483647u)
                return usage_error("--rank '%s' is not a rank (0 .. 2147483647)%s", value, "");
            a->rank = (uint32_t)v;
            break;
        case 2:
        case 3:
            if (kvp__parse_size(value, 0, &v) || v == 0 || v > (k == 2 ? 100000u : 1024u))
                return usage_error(k == 2 ? "%s '%s' is not a count (1 .. 100000)"
                                          : "%s '%s' is not a count (1 .. 1024)",
                                   name, value);
            *(k == 2 ? &a->batch : &a->conns) = (uint32_t)v;
            break;
        case 4: {
            char *end;
            errno = 0;
            double d = strtod(value, &end);
            if (!*value || errno || *end || !(d >= 0.001) || d > 86400)
                return usage_error("--seconds '%s' is not a number of seconds%s", value, "");
            a->seconds = d;
            break;
        }
        case 5: {
            a->nops = 0;
            const char *p = value;
            while (*p) {
                size_t l = strcspn(p, ",");
                int op = -1;
                for (int j = 0; j < NOPS; j++)
                    if (strlen(op_names[j]) == l && !strncmp(p, op_names[j], l))
                        op = j;
                if (op < 0)
                    return usage_error("--ops '%s': not a list of exists, locations, write%s",
                                       value, "");
                for (int j = 0; j < a->nops; j++)
                    if (a->ops[j] == op)
                        return usage_error("--ops '%s' names an operation twice%s", value, "");
                a->ops[a->nops++] = op;
                p += l;
                if (*p == ',')
                    p++;
            }
            if (!a->nops)
                return usage_error("--ops needs at least one operation%s%s", "", "");
            break;
        }
        case 6:
            if (kvp__parse_size(value, 0, &v) || v == 0 || v > 2147483647u)
                return usage_error("--pages '%s' is not a count (1 .. 2147483647)%s", value, "");
            a->pages = v;
            break;
        case 7:
            a->token = value;
            break;
        }
    }
    if (!a->url)
        return usage_error("a URL is required, e.g. kvpage bench meta "
                           "http://127.0.0.1:18000/ns/bench%s%s",
                           "", "");
    if (!kvp__server_url_ok(a->url))
        return usage_error("'%s' is not an http://HOST:PORT[/ns/NAME] URL%s", a->url, "");
    a->token = kvp__bench_token(a->token);
    return 0;
}

/* SIGINT, SIGTERM or SIGHUP: the run stops, removes the keys it wrote, and
 * then dies of the signal. */
static volatile sig_atomic_t g_signal;

static void on_signal(int sig)
{
    g_signal = sig;
}

static void catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: the main thread's sleep ends */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* Deletes the keys [0, n) of one series (held, or connection conn's fresh
 * keys) in batches. Returns how many requests failed. */
static uint64_t delete_series(struct bench *b, struct kvp__conn *c, uint32_t conn, uint64_t n,
                              int held)
{
    uint64_t failed = 0;
    for (uint64_t first = 0; first < n; first += 1024) {
        kvp__body_reset(c);
        kvp__body_put(c, "{\"keys\": [");
        for (uint64_t i = first; i < n && i < first + 1024; i++) {
            char k[80];
            keyname(k, sizeof k, b->run, conn, i, held);
            kvp__body_put(c, "%s\"%s\"", i > first ? ", " : "", k);
        }
        kvp__body_put(c, "]}");
        failed += kvp__post(c, b->url_delete) != 0;
    }
    return failed;
}

/* After a signal: deletes every key this run wrote, says so, and dies of
 * the signal. */
static void interrupted(struct bench *b, struct kvp__conn *c)
{
    const struct meta_args *a = b->a;
    uint64_t n = b->held_done, failed = delete_series(b, c, 0, b->held_done, 1);
    for (uint32_t i = 0; i < a->conns; i++) {
        failed += delete_series(b, c, i, b->written[i], 0);
        n += b->written[i];
    }
    if (failed)
        fprintf(stderr,
                CMD ": interrupted: %" PRIu64 " delete request(s) to %s failed; keys "
                    "kvpbench-%08x-* are left\n",
                failed, b->url_delete, b->run);
    else
        fprintf(stderr, CMD ": interrupted: removed the %" PRIu64 " keys this run wrote\n", n);
    int sig = g_signal;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Initializes the rank unless it answers already; fills *initialized and
 * the held keys. Returns 0 or the exit status after printing why. */
static int prepare(struct bench *b, struct kvp__conn *c, int *initialized, int64_t *num_pages,
                   int tty)
{
    const struct meta_args *a = b->a;
    char why[400];
    kvp__body_reset(c);
    if (a->sglang)
        kvp__body_put(c, "{\"keys\": [\"kvpbench-probe\"]}");
    else
        kvp__body_put(c, "{\"rank\": %u, \"keys\": [\"kvpbench-probe\"]}", a->rank);
    int rc = kvp__post(c, b->url_locations);
    if (rc < 0) {
        fprintf(stderr, CMD ": cannot reach %s: %s\n", a->url, c->cerr);
        return KVP_EXIT_FAILED;
    }
    *initialized = 0;
    if (rc == 404) {
        kvp__body_reset(c);
        kvp__body_put(c, "{\"num_pages\": %" PRIu64 "}", a->pages);
        rc = kvp__post(c, b->url_init);
        if (rc) {
            kvp__describe(c, rc, b->url_init, why, sizeof why);
            fprintf(stderr, CMD ": cannot initialize rank %u: %s\n", a->rank, why);
            return KVP_EXIT_FAILED;
        }
        *initialized = 1;
        *num_pages = (int64_t)a->pages;
    } else if (rc) {
        kvp__describe(c, rc, b->url_locations, why, sizeof why);
        fprintf(stderr, CMD ": %s%s\n", why,
                rc == 401 ? " (give the server's token with --token or $KVPAGE_TOKEN)" : "");
        return KVP_EXIT_FAILED;
    }
    /* Some hundred batches of held keys, fewer when a small rank would
     * evict them again. */
    if (!*initialized)
        *num_pages = kvp__rank_stat(c, a->url, a->rank, "num_pages");
    uint64_t batches = 200, half = *num_pages > 0 ? (uint64_t)*num_pages / 2 / a->batch : batches;
    if (half < batches)
        batches = half ? half : 1;
    b->nheld = batches * a->batch;
    int64_t *pages = calloc(a->batch, sizeof *pages);
    if (!pages)
        return KVP_EXIT_FAILED;
    for (uint64_t i = 0; i < batches && !g_signal; i++) {
        const char *url;
        b->held_done = (i + 1) * a->batch;
        rc = write_pair(b, c, 0, i * a->batch, 1, pages, &url);
        if (rc) {
            kvp__describe(c, rc, url, why, sizeof why);
            fprintf(stderr, CMD ": writing the keys to look up: %s\n", why);
            free(pages);
            return KVP_EXIT_FAILED;
        }
        if (tty && (i % 8 == 7 || i + 1 == batches)) {
            char label[96];
            snprintf(label, sizeof label, "writing %" PRIu64 " keys to look up", b->nheld);
            kvp__progress_bar((double)(i + 1) / (double)batches * 0.999, label);
        }
    }
    if (tty)
        fputc('\r', stderr);
    free(pages);
    return 0;
}

/* The summary table, or the JSON object, of the operations run. */
static void report(const struct meta_args *ap, const struct bench *b, const struct op_stats *res,
                   const double *durations, int initialized, int64_t num_pages)
{
    const struct meta_args a = *ap;
    if (a.json) {
        printf("{\"url\": ");
        kvp__json_str(a.url);
        printf(", \"dialect\": \"%s\", \"rank\": %u, \"batch\": %u, \"connections\": %u, "
               "\"seconds\": %g, \"initialized\": %s, \"num_pages\": ",
               a.sglang ? "sglang" : "vllm", a.rank, a.batch, a.conns, a.seconds,
               initialized ? "true" : "false");
        if (num_pages > 0)
            printf("%" PRId64, num_pages);
        else
            printf("null");
        printf(", \"held_keys\": %" PRIu64 ",\n \"ops\": {", b->nheld);
        for (int j = 0; j < a.nops; j++) {
            const struct op_stats *r = &res[a.ops[j]];
            double d = durations[a.ops[j]];
            printf("%s\n  \"%s\": {\"requests\": %" PRIu64
                   ", \"requests_s\": %.1f, \"keys_s\": %.1f, \"p50_ms\": %.4f, "
                   "\"p99_ms\": %.4f, \"max_ms\": %.4f, \"errors\": %" PRIu64 "}",
                   j ? "," : "", op_names[a.ops[j]], r->requests, (double)r->requests / d,
                   (double)r->keys / d, kvp__lat_quantile(&r->lat, 0.5) / 1e6,
                   kvp__lat_quantile(&r->lat, 0.99) / 1e6, (double)r->lat.max_ns / 1e6, r->errors);
        }
        printf("},\n \"errors\": %" PRIu64 ", \"first_error\": ", b->total_errors);
        if (b->first_error[0])
            kvp__json_str(b->first_error);
        else
            printf("null");
        printf("}\n");
    } else {
        printf("%s (%s, rank %u): %u connections, %u keys per request, %g s per "
               "operation, %" PRIu64 " keys held\n",
               a.url, a.sglang ? "sglang" : "vllm", a.rank, a.conns, a.batch, a.seconds, b->nheld);
        printf("  %-10s %11s %12s %9s %9s %9s %8s\n", "", "requests/s", "keys/s", "p50 ms",
               "p99 ms", "max ms", "errors");
        for (int j = 0; j < a.nops; j++) {
            const struct op_stats *r = &res[a.ops[j]];
            double d = durations[a.ops[j]];
            printf("  %-10s %11.0f %12.0f %9.3f %9.3f %9.3f %8" PRIu64 "\n", op_names[a.ops[j]],
                   (double)r->requests / d, (double)r->keys / d,
                   kvp__lat_quantile(&r->lat, 0.5) / 1e6, kvp__lat_quantile(&r->lat, 0.99) / 1e6,
                   (double)r->lat.max_ns / 1e6, r->errors);
        }
        if (res[OP_WRITE].requests)
            printf("  (write: one allocate + confirm pair per request)\n");
    }
}

/* The URLs of the routes the bench asks, under --url (a trailing '/' dropped). */
static void bench_urls(struct bench *b, const struct meta_args *a)
{
    snprintf(b->base, sizeof b->base, "%s", a->url);
    size_t bl = strlen(b->base);
    if (bl && b->base[bl - 1] == '/')
        b->base[bl - 1] = 0;
    if (a->sglang) {
        snprintf(b->url_exists, sizeof b->url_exists, "%s/%u/exists", b->base, a->rank);
        snprintf(b->url_locations, sizeof b->url_locations, "%s/%u/get_page_indices", b->base,
                 a->rank);
        snprintf(b->url_alloc, sizeof b->url_alloc, "%s/%u/reserve_and_allocate_page_indices",
                 b->base, a->rank);
        snprintf(b->url_confirm, sizeof b->url_confirm, "%s/%u/confirm_write", b->base, a->rank);
        snprintf(b->url_init, sizeof b->url_init, "%s/%u/initialize", b->base, a->rank);
        snprintf(b->url_delete, sizeof b->url_delete, "%s/%u/delete_keys", b->base, a->rank);
    } else {
        snprintf(b->url_exists, sizeof b->url_exists, "%s/keys/batch_exists", b->base);
        snprintf(b->url_locations, sizeof b->url_locations, "%s/keys/get_locations", b->base);
        snprintf(b->url_alloc, sizeof b->url_alloc, "%s/keys/batch_allocate", b->base);
        snprintf(b->url_confirm, sizeof b->url_confirm, "%s/keys/confirm_write", b->base);
        snprintf(b->url_init, sizeof b->url_init, "%s/rank/%u/initialize", b->base, a->rank);
        snprintf(b->url_delete, sizeof b->url_delete, "%s/keys/delete", b->base);
    }
}

/* Runs the o-th operation of --ops on every connection for --seconds; adds
 * its figures to res[op] and its length to durations[op]. 0, or
 * KVP_EXIT_FAILED when its threads could not all start. */
static int run_op(struct bench *b, struct kvp__conn *conns, struct worker *w, int o,
                  struct op_stats *res, double *durations, int tty)
{
    const struct meta_args *a = b->a;
    int rc = 0;
    int op = a->ops[o];
    atomic_store(&b->state, 1);
    uint32_t started = 0;
    for (; started < a->conns; started++) {
        memset(&w[started], 0, sizeof w[started]);
        w[started].b = b, w[started].c = &conns[started];
        w[started].id = started, w[started].op = op;
        if (pthread_create(&w[started].tid, NULL, worker_main, &w[started]))
            break;
    }
    if (started < a->conns) {
        fprintf(stderr, CMD ": cannot start %u threads (started %u)\n", a->conns, started);
        rc = KVP_EXIT_FAILED;
    }
    double t0 = now_s(), t_end = t0 + a->seconds;
    for (double t = t0; t < t_end && !rc && !g_signal; t = now_s()) {
        if (tty) {
            uint64_t n = 0;
            for (uint32_t i = 0; i < started; i++)
                n += atomic_load_explicit(&w[i].live, memory_order_relaxed);
            char label[96];
            snprintf(label, sizeof label, "%-9s %.0f requests/s", op_names[op],
                     t > t0 ? (double)n / (t - t0) : 0.0);
            kvp__progress_bar((o + (t - t0) / a->seconds) / a->nops, label);
        }
        double left = t_end - t;
        usleep((useconds_t)((left < 0.1 ? left : 0.1) * 1e6));
    }
    atomic_store(&b->state, 2);
    double dt = now_s() - t0;
    struct op_stats *s = &res[op];
    for (uint32_t i = 0; i < started; i++) {
        pthread_join(w[i].tid, NULL);
        s->requests += w[i].st.requests;
        s->keys += w[i].st.keys;
        s->errors += w[i].st.errors;
        kvp__lat_merge(&s->lat, &w[i].st.lat);
    }
    if (rc)
        return rc;
    b->total_errors += s->errors;
    double rps = (double)s->requests / dt, kps = (double)s->keys / dt;
    if (tty) {
        char label[96];
        snprintf(label, sizeof label, "%-9s %.0f requests/s", op_names[op], rps);
        kvp__progress_bar((double)(o + 1) / a->nops, label);
    } else {
        fprintf(stderr,
                "%s: %.0f requests/s, %.0f keys/s, p50 %.3f ms p99 %.3f ms max %.3f ms, "
                "%" PRIu64 " errors\n",
                op_names[op], rps, kps, kvp__lat_quantile(&s->lat, 0.5) / 1e6,
                kvp__lat_quantile(&s->lat, 0.99) / 1e6, (double)s->lat.max_ns / 1e6, s->errors);
    }
    durations[op] = dt;
    return 0;
}

int kvp__cli_bench_meta(int argc, char **argv)
{
    if (kvp__wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    struct meta_args a = {.batch = 64,
                          .conns = 16,
                          .pages = 1048576,
                          .seconds = 10,
                          .ops = {OP_EXISTS, OP_LOCATIONS, OP_WRITE},
                          .nops = 3};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    struct bench *b = calloc(1, sizeof *b);
    struct kvp__conn *conns = calloc(a.conns, sizeof *conns);
    struct worker *w = calloc(a.conns, sizeof *w);
    uint64_t *written = calloc(a.conns, sizeof *written);
    struct op_stats res[NOPS];
    memset(res, 0, sizeof res);
    if (!b || !conns || !w || !written) {
        free(b), free(conns), free(w), free(written);
        fprintf(stderr, CMD ": out of memory\n");
        return KVP_EXIT_FAILED;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    b->a = &a;
    b->written = written;
    pthread_mutex_init(&b->lock, NULL);
    bench_urls(b, &a);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    b->run = (uint32_t)(ts.tv_nsec ^ (ts.tv_sec << 12) ^ ((uint64_t)getpid() << 20));
    int tty = isatty(2);
    uint32_t nconns = 0;
    for (; nconns < a.conns; nconns++)
        if (kvp__conn_init(&conns[nconns], a.token)) {
            fprintf(stderr, CMD ": cannot set up a connection (libcurl)\n");
            rc = KVP_EXIT_FAILED;
            goto out;
        }
    fprintf(stderr,
            CMD ": warning: this writes keys to %s%s (use http://HOST:PORT/ns/NAME of a "
                "deployment of its own)\n",
            a.url,
            strstr(a.url, "/ns/") ? "" : ", the default deployment, which engines may be using");
    int initialized = 0;
    int64_t num_pages = -1;
    catch_signals();
    rc = prepare(b, &conns[0], &initialized, &num_pages, tty);
    if (g_signal)
        interrupted(b, &conns[0]);
    if (rc)
        goto out;
    double durations[NOPS] = {0};
    for (int o = 0; o < a.nops && !g_signal; o++)
        if ((rc = run_op(b, conns, w, o, res, durations, tty)) != 0)
            goto out;
    if (g_signal)
        interrupted(b, &conns[0]);
    report(&a, b, res, durations, initialized, num_pages);
    if (b->total_errors) {
        fprintf(stderr, CMD ": %" PRIu64 " request(s) failed; the first: %s\n", b->total_errors,
                b->first_error);
        rc = KVP_EXIT_FAILED;
    }
out:
    for (uint32_t i = 0; i < nconns; i++)
        kvp__conn_free(&conns[i]);
    pthread_mutex_destroy(&b->lock);
    free(b), free(conns), free(w), free(written);
    curl_global_cleanup();
    return rc;
}
