/*
 * kvpage serve's flags: --help's text, the table of flags with what each
 * accepts, and the checks between flags. Parsing only: serve.c acts on
 * what they ask.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/log.h"
#include "server/serve_internal.h"
#include "util/size.h"

/* The n-th remote metadata backend, what --meta takes, as the library
 * lists them (kvp_meta_backend_info) into *i, its scheme as a location
 * starts ("redis://" when its form has the slashes) into typed; 0, or -1
 * past the last. */
static int remote_backend(size_t n, struct kvp_meta_info *i, char *typed, size_t len)
{
    for (size_t k = 0, seen = 0; i->info_size = sizeof *i, kvp_meta_backend_info(k, i) == 0; k++) {
        if (!i->remote || seen++ < n)
            continue;
        size_t sl = strlen(i->scheme);
        int slashes =
            !strncmp(i->description, i->scheme, sl) && !strncmp(i->description + sl, "://", 3);
        snprintf(typed, len, "%s:%s", i->scheme, slashes ? "//" : "");
        return 0;
    }
    return -1;
}

/* "    SCHEME   the state in HOLDER" for each remote backend. */
static void meta_lines(FILE *f)
{
    struct kvp_meta_info i;
    char typed[64];
    for (size_t n = 0; remote_backend(n, &i, typed, sizeof typed) == 0; n++)
        fprintf(f, "                           %-19s the state in %s\n", typed, i.holder);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage serve [options]\n"
            "Runs the kvpage metadata server (vLLM and SGLang HF3FS metadata protocols).\n"
            "\n"
            "  --listen ADDR:PORT     address to listen on (default 127.0.0.1:18000;\n"
            "                         IPv6 as [::1]:18000)\n"
            "  --allow CIDR           only accept clients from CIDR (repeatable; IPv4 or IPv6);\n"
            "                         others get 403\n"
            "  --token T              require 'Authorization: Bearer T' on every route but\n"
            "                         /healthz (default: $KVPAGE_TOKEN, if set)\n"
            "  --lease-seconds S      lease of a page reservation (default 120)\n"
            "  --read-grace-ms MS     no eviction this long after a lookup (default 5000)\n"
            "  --max-body BYTES       largest request body (default 67108864; K/M/G suffixes)\n"
            "  --max-keys N           most keys in one request (default 1000000)\n"
            "  --max-body-memory N    memory all bodies over 1 MiB may take at once (default\n"
            "                         1G, at least --max-body); past it they get 503\n"
            "  --max-pinned-ratio R   most of a rank's pages that pins (POST /v1/pins) may\n"
            "                         hold from eviction, above 0 and at most 1 (default 0.5)\n"
            "  --threads N            HTTP worker threads (default 1, 8 with --meta;\n"
            "                         bodies over 1 MiB are handled by one more thread, off\n"
            "                         the event loop)\n"
            "  --idle-timeout S       close a connection idle between requests for S seconds\n"
            "                         (default 60; 0: never)\n"
            "  --request-timeout S    drop a request whose headers or body stop arriving for S\n"
            "                         seconds (default 30; 0: never)\n"
            "  --max-conns-per-client N  connections one client address may hold open\n"
            "                         (default 1024); more are closed at once\n"
            "  --max-conns N          connections in total (default: the open-file limit,\n"
            "                         raised to its hard limit, less 64); more are closed at once\n"
            "  --data-dir DIR         state directory: write-ahead log and snapshots\n"
            "                         (default ./kvpage-data); 'none' keeps state in memory only\n"
            "  --meta LOCATION        keep the state in a remote backend instead of --data-dir,\n"
            "                         shared by every server given the same LOCATION (its\n"
            "                         form and options: kvpage backends, man kvpage):\n");
    meta_lines(f);
    fprintf(f,
            "  --fsync MODE           always, batch (default: group commit) or never\n"
            "  --snapshot-bytes N     write a snapshot once the log has grown by N bytes, or\n"
            "                         by the last snapshot's size if larger (default 64M)\n"
            "  --kv-events FIELDS     publish every page stored and removed as vLLM's KV events\n"
            "                         (ZeroMQ, msgpack): endpoint=tcp://*:5557 (default),\n"
            "                         replay_endpoint=, topic= (may name {deployment} and {pool}:\n"
            "                         a topic per namespace), buffer_steps=10000, hwm=100000,\n"
            "                         max_queue_size=100000, medium=STORAGE|EXTERNAL|DISK,\n"
            "                         format=map|array, block_size=16,\n"
            "                         hash=auto|sglang|vllm|xxh3 (with --meta: every server\n"
            "                         of the Redis state publishes every change of it)\n"
            "  --log-level LEVEL      error, warn, info (default) or debug\n"
            "  --log-format FORMAT    text (default) or json: one JSON object per line\n"
            "  --help                 show this help\n"
            "examples:\n"
            "  kvpage serve --listen 0.0.0.0:18000 --data-dir /var/lib/kvpage --allow 10.0.0.0/8\n"
            "  kvpage serve --listen 0.0.0.0:18000 --meta redis://10.0.0.5:6379/0\n"
            "  KVPAGE_TOKEN=secret kvpage serve --data-dir none --threads 2\n"
            "more: man kvpage, and the README\n");
}

int kvp__serve_bad_value(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "kvpage serve: invalid value '%s' for %s: %s\n", value, flag, why);
    return 2;
}

struct flag;
/* Sets the flag's field from its value: 0, or the exit status (2, usage). */
typedef int (*flag_set_fn)(struct serve_cfg *c, const struct flag *f, const char *v);

/* One flag of kvpage serve: --NAME VALUE, set into the field at off. */
struct flag {
    const char *name;
    flag_set_fn set; /* NULL: --help */
    size_t off;      /* of a uint64_t (set_num) or a const char * (set_str) */
    int suffixes;    /* set_num: K/M/G suffixes allowed */
    uint64_t lo, hi; /* set_num: the accepted range */
    const char *why; /* what a bad value gets told */
};

static int bad_flag(const struct flag *f, const char *v)
{
    char name[40];
    snprintf(name, sizeof name, "--%s", f->name);
    return kvp__serve_bad_value(name, v, f->why);
}

static int set_num(struct serve_cfg *c, const struct flag *f, const char *v)
{
    uint64_t n;
    if (kvp__parse_size(v, f->suffixes, &n) || n < f->lo || n > f->hi)
        return bad_flag(f, v);
    *(uint64_t *)((char *)c + f->off) = n;
    return 0;
}

static int set_str(struct serve_cfg *c, const struct flag *f, const char *v)
{
    *(const char **)((char *)c + f->off) = v;
    return 0;
}

static int set_nonempty(struct serve_cfg *c, const struct flag *f, const char *v)
{
    return *v ? set_str(c, f, v) : bad_flag(f, v);
}

static int set_threads(struct serve_cfg *c, const struct flag *f, const char *v)
{
    c->threads_given = 1;
    return set_num(c, f, v);
}

static int set_data_dir(struct serve_cfg *c, const struct flag *f, const char *v)
{
    c->data_dir_given = 1;
    return set_nonempty(c, f, v);
}

static int set_allow(struct serve_cfg *c, const struct flag *f, const char *v)
{
    struct kvp_cidr *a = realloc(c->allow, (c->nallow + 1) * sizeof *a);
    if (!a) {
        fprintf(stderr, "kvpage serve: out of memory\n");
        return 2;
    }
    c->allow = a;
    if (kvp__cidr_parse(v, &c->allow[c->nallow]))
        return bad_flag(f, v);
    c->nallow++;
    return 0;
}

static int set_lease(struct serve_cfg *c, const struct flag *f, const char *v)
{
    char *end;
    errno = 0;
    double s = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(s) || s <= 0 || s > 1e9)
        return bad_flag(f, v);
    c->lease_ms = (uint64_t)(s * 1000.0 + 0.5);
    if (!c->lease_ms)
        c->lease_ms = 1;
    return 0;
}

static int set_pinned_ratio(struct serve_cfg *c, const struct flag *f, const char *v)
{
    char *end;
    errno = 0;
    double r = strtod(v, &end);
    if (errno || end == v || *end || !(r > 0 && r <= 1))
        return bad_flag(f, v);
    c->max_pinned_ratio = r;
    return 0;
}

/* Whether the scheme of v (the letters before ':') is a backend that keeps
 * the state in this process, as the library's listing says (mem:, file:). */
static int in_process_scheme(const char *v)
{
    size_t n = strcspn(v, ":");
    struct kvp_meta_info in = {.info_size = sizeof in};
    for (size_t i = 0; kvp_meta_backend_info(i, &in) == 0; i++)
        if (strlen(in.scheme) == n && !strncmp(in.scheme, v, n))
            return !in.remote;
    return 0;
}

/* Any location of a remote backend: the metadata layer knows the schemes
 * (and says which it knows); a data directory goes in --data-dir. */
static int set_meta(struct serve_cfg *c, const struct flag *f, const char *v)
{
    (void)f;
    if (v[0] == '/' || v[0] == '.' || !strchr(v, ':') || in_process_scheme(v)) {
        /* "expected http://..., redis://... or ..." of the library's remote backends */
        struct kvp_meta_info i;
        char typed[64], why[512] = "expected the location of a remote backend: ";
        size_t count = 0, used = strlen(why);
        while (remote_backend(count, &i, typed, sizeof typed) == 0)
            count++;
        for (size_t n = 0; n < count && remote_backend(n, &i, typed, sizeof typed) == 0; n++)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s%s...",
                                     n == 0           ? ""
                                     : n + 1 == count ? " or "
                                                      : ", ",
                                     typed);
        snprintf(why + used, sizeof why - used, " (a data directory goes in --data-dir)");
        return kvp__serve_bad_value("--meta", v, why);
    }
    c->meta_loc = v;
    return 0;
}

static int set_fsync(struct serve_cfg *c, const struct flag *f, const char *v)
{
    if (!strcmp(v, "always"))
        c->fsync_mode = KVP_FSYNC_ALWAYS;
    else if (!strcmp(v, "batch"))
        c->fsync_mode = KVP_FSYNC_BATCH;
    else if (!strcmp(v, "never"))
        c->fsync_mode = KVP_FSYNC_NEVER;
    else
        return bad_flag(f, v);
    return 0;
}

static int set_log_level(struct serve_cfg *c, const struct flag *f, const char *v)
{
    (void)c;
    int lvl = kvp__log_parse_level(v);
    if (lvl < 0)
        return bad_flag(f, v);
    kvp__log_set_level(lvl);
    return 0;
}

static int set_log_format(struct serve_cfg *c, const struct flag *f, const char *v)
{
    (void)c;
    if (strcmp(v, "text") && strcmp(v, "json"))
        return bad_flag(f, v);
    kvp__log_set_json(!strcmp(v, "json"));
    return 0;
}

static int set_kv_events(struct serve_cfg *c, const struct flag *f, const char *v)
{
    (void)f;
    char why[300];
    kvp__kvev_cfg_free(&c->kvev); /* the last one given counts */
    if (kvp__kvev_parse(v, &c->kvev, why, sizeof why))
        return kvp__serve_bad_value("--kv-events", v, why);
    return 0;
}

#define CFG(field) offsetof(struct serve_cfg, field)
#define BYTES_WHY "expected a positive number of bytes (K/M/G suffixes allowed)"
#define SECONDS_WHY "expected a whole number of seconds (0: no timeout)"

static const struct flag serve_flags[] = {
    {"listen", set_str, CFG(listen_text), 0, 0, 0, NULL}, /* checked by run */
    {"allow", set_allow, 0, 0, 0, 0,
     "expected an IPv4 or IPv6 address with an optional /prefix, e.g. 10.0.0.0/8 or fd00::/8"},
    {"token", set_nonempty, CFG(token), 0, 0, 0, "the token must not be empty"},
    {"lease-seconds", set_lease, 0, 0, 0, 0, "expected a positive number of seconds"},
    {"read-grace-ms", set_num, CFG(grace_ms), 0, 0, UINT64_C(1) << 40,
     "expected a number of milliseconds >= 0"},
    {"max-body", set_num, CFG(max_body), 1, 1, SIZE_MAX / 2, BYTES_WHY},
    {"max-keys", set_num, CFG(max_keys), 0, 1, UINT64_C(1) << 40, "expected a positive integer"},
    {"threads", set_threads, CFG(threads), 0, 1, 1024, "expected an integer from 1 to 1024"},
    {"data-dir", set_data_dir, CFG(data_dir), 0, 0, 0, "expected a directory or 'none'"},
    {"meta", set_meta, 0, 0, 0, 0, NULL /* set_meta words it from the library's backends */},
    {"fsync", set_fsync, 0, 0, 0, 0, "expected always, batch or never"},
    {"snapshot-bytes", set_num, CFG(snapshot_bytes), 1, UINT64_C(64) << 10, UINT64_C(1) << 50,
     "expected a number of bytes of at least 64K (K/M/G suffixes allowed)"},
    {"kv-events", set_kv_events, 0, 0, 0, 0, NULL},
    {"log-level", set_log_level, 0, 0, 0, 0, "expected error, warn, info or debug"},
    {"log-format", set_log_format, 0, 0, 0, 0, "expected text or json"},
    {"idle-timeout", set_num, CFG(idle_timeout), 0, 0, 86400 * 365, SECONDS_WHY},
    {"request-timeout", set_num, CFG(request_timeout), 0, 0, 86400 * 365, SECONDS_WHY},
    {"max-conns-per-client", set_num, CFG(max_conns_client), 0, 1, UINT64_C(1) << 30,
     "expected a positive integer"},
    {"max-conns", set_num, CFG(max_conns), 0, 1, UINT64_C(1) << 30, "expected a positive integer"},
    {"max-body-memory", set_num, CFG(max_body_memory), 1, 1, SIZE_MAX / 2, BYTES_WHY},
    {"max-pinned-ratio", set_pinned_ratio, 0, 0, 0, 0,
     "expected a share of a rank's pages above 0 and at most 1, e.g. 0.5"},
    {"help", NULL, 0, 0, 0, 0, NULL},
};
#define NFLAGS (sizeof serve_flags / sizeof *serve_flags)

int kvp__serve_parse(int argc, char **argv, struct serve_cfg *cfg)
{
    *cfg = (struct serve_cfg){
        .listen_text = "127.0.0.1:18000",
        .token = getenv("KVPAGE_TOKEN"),
        .data_dir = "./kvpage-data",
        .fsync_mode = KVP_FSYNC_BATCH,
        .lease_ms = 120000,
        .grace_ms = 5000,
        .max_body = KVP_DEFAULT_MAX_BODY,
        .max_keys = KVP_DEFAULT_MAX_KEYS,
        .threads = 1,
        .idle_timeout = 60,
        .request_timeout = 30,
        .max_conns_client = 1024,
        .max_body_memory = UINT64_C(1) << 30,
        .max_pinned_ratio = KVP_DEFAULT_MAX_PINNED_RATIO,
    };
    if (cfg->token && !*cfg->token)
        cfg->token = NULL;
    struct option opts[NFLAGS + 1];
    for (size_t i = 0; i < NFLAGS; i++)
        opts[i] =
            (struct option){serve_flags[i].name,
                            serve_flags[i].set ? required_argument : no_argument, NULL, (int)i + 1};
    opts[NFLAGS] = (struct option){NULL, 0, NULL, 0};
    opterr = 0;
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (o >= 1 && (size_t)o <= NFLAGS) {
            const struct flag *f = &serve_flags[o - 1];
            if (!f->set) {
                usage(stdout);
                return 0;
            }
            int rc = f->set(cfg, f, optarg);
            if (rc)
                return rc;
        } else if (o == ':') {
            fprintf(stderr, "kvpage serve: %s needs a value\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        } else {
            fprintf(stderr, "kvpage serve: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvpage serve: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (cfg->meta_loc && cfg->data_dir_given) {
        fprintf(stderr, "kvpage serve: --meta and --data-dir exclude each other: the state is "
                        "either in a remote backend or in a data directory\n");
        return 2;
    }
    /* Every call to a remote store waits for a round trip: more threads keep
     * the server answering while some wait (a slow or unreachable store must
     * not stall every client behind one request). */
    if (cfg->meta_loc && !cfg->threads_given)
        cfg->threads = 8;
    return -1;
}
