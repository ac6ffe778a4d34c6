/*
 * The redis:// backend (kvp__redis_ops): the metadata state machine of
 * protocol.md §1 kept in Redis (or a Redis Cluster), with the semantics,
 * return codes and messages of the in-process engine (src/meta/local/local.c).
 *
 * Every operation on one rank is one Lua script (src/meta/redis/redis_lua.h) over
 * keys that share the rank's hash tag, PREFIX:{DEP/HEXPOOL/RANK}:..., so
 * Redis runs it atomically and a cluster keeps the rank on one shard: any
 * number of kvpage processes may share one store. The pool is any bytes but
 * NUL, so it is hex-encoded inside the tag.
 *
 * Per namespace, PREFIX:{DEP/HEXPOOL}:ranks (HASH rank -> num_pages) lists
 * its initialized ranks; init_rank writes it after the rank's own script.
 * PREFIX:{PREFIX}:namespaces (ZSET, scored by creation number) lists the
 * namespaces. What spans ranks (exists with rank < 0, lookup with
 * complete_only, delete and clear of every rank, nranks, stats, the limit
 * of 65535 ranks) is computed here by asking each rank's slot in turn: it
 * is NOT atomic across ranks (each rank's part is), as no script may touch
 * two slots of a cluster.
 *
 * Durability is Redis's: a change is acknowledged once Redis answered it,
 * tickets stay 0 (kvp__redis_durability tells what Redis's AOF settings
 * promise). Failures to reach Redis are negative errnos with
 * KVP_RULE_UNAVAILABLE (src/meta/redis/redis_conn.c).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "meta/backend.h"
#include "meta/redis/redis_conn.h"
#include "meta/redis/redis_lua.h"
#include "meta/rules.h"
#include "util/hex.h"

#define set_err kvp__set_err

#define MAX_RANKS_PER_NS 65535 /* as the in-process engine's */
#define MAX_PREFIX 64
/* Eviction skips at most this many HELD pages in their read grace per
 * request before it gives up (-1), so that one allocation never scans a
 * huge LRU whose every page was just read. */
#define EVICT_SCAN_MAX 4096

/* Script replies: the first element (redis_lua.h). */
enum {
    ST_OK = 0,
    ST_NOT_INIT,
    ST_RESIZE_HELD,
    ST_CONFIRM,
    ST_RELEASE,
    ST_HELD_OTHER,
    ST_BROKEN,
    ST_PIN_LIMIT
};

enum {
    SC_INIT,
    SC_ALLOCATE,
    SC_CONFIRM,
    SC_EXISTS,
    SC_LOOKUP,
    SC_DELETE,
    SC_CLEAR,
    SC_STATS,
    SC_CHECK,
    SC_NS_CREATE,
    SC_RANK_COUNT,
    SC_PIN,
    SC_UNPIN,
    SC_PINNED,
    SC_HASHES,
    SC_PINS_READ,
    SC_PINS_MERGE,
    SC_COUNTER,
    SC_COUNT
};

static const char *const script_body[SC_COUNT] = {
    [SC_INIT] = KVP_LUA_INIT,
    [SC_ALLOCATE] = KVP_LUA_ALLOCATE,
    [SC_CONFIRM] = KVP_LUA_CONFIRM,
    [SC_EXISTS] = KVP_LUA_EXISTS,
    [SC_LOOKUP] = KVP_LUA_LOOKUP,
    [SC_DELETE] = KVP_LUA_DELETE,
    [SC_CLEAR] = KVP_LUA_CLEAR,
    [SC_STATS] = KVP_LUA_STATS,
    [SC_CHECK] = KVP_LUA_CHECK,
    [SC_NS_CREATE] = KVP_LUA_NS_CREATE,
    [SC_PIN] = KVP_LUA_PIN,
    [SC_UNPIN] = KVP_LUA_UNPIN,
    [SC_PINNED] = KVP_LUA_PINNED,
    [SC_HASHES] = KVP_LUA_HASHES,
    [SC_PINS_READ] = KVP_LUA_PINS_READ,
    [SC_PINS_MERGE] = KVP_LUA_PINS_MERGE,
    /* KEYS: a namespace's rank list. ARGV: rank. {listed, ranks listed}. */
    [SC_RANK_COUNT] = "#!lua flags=no-writes\n"
                      "return {redis.call('HEXISTS', KEYS[1], ARGV[1]), "
                      "redis.call('HLEN', KEYS[1])}\n",
    /* KEYS: a counter. ARGV: expect, value. Sets it to value when it is
     * expect or less (none: 0); its value after, as text. */
    [SC_COUNTER] = "#!lua\n"
                   "local c = redis.call('GET', KEYS[1]) or '0'\n"
                   "if tonumber(c) > tonumber(ARGV[1]) then return c end\n"
                   "if c ~= ARGV[2] then redis.call('SET', KEYS[1], ARGV[2]) end\n"
                   "return ARGV[2]\n",
};

struct rns {
    struct kvp_ns pub; /* first: a cast converts */
    struct rmeta *m;
    char *dep, *pool;
    char *tag; /* DEP/HEXPOOL */
    size_t taglen;
    char *ranks_key; /* PREFIX:{DEP/HEXPOOL}:ranks */
    /* The ranks as last read (under m->lock): a request over every rank
     * asks them with the list in one round trip, and again only when the
     * list it read with them differs. */
    uint32_t *seen_ranks;
    size_t nseen;
    int seen_valid;
    /* Dropped through this handle (kvp_meta_drop): kvp_meta_ns without
     * create asks Redis again until a rank is initialized (atomic). */
    int dropped;
    struct rns *next;
};

struct rmeta {
    struct kvp__rconn *c;
    struct kvp_meta *front;
    char prefix[MAX_PREFIX + 1];
    char loc[256]; /* the seeds (never the password), for messages */
    int db;
    int wait_replicas; /* ?wait=N (0: none) within wait_ms */
    uint32_t wait_ms;
    uint64_t lease_ms, grace_ms;
    struct kvp__rscript scripts[SC_COUNT];
    pthread_mutex_t lock; /* guards nss */
    struct rns *nss;
    struct evtail *tail;                    /* kvp_meta_watch's thread, or NULL */
    char *bodies[SC_COUNT];                 /* scripts made for ?events_max= (owned), or NULL */
    atomic_uint_least64_t ev_read, ev_gaps; /* its entries read; streams found trimmed past it */
};

/* ---------------------------------------------------------------- the location */

/* The percent-decoded copy of s[0..n), or NULL (bad escape or no memory). */
static char *pct_decode(const char *s, size_t n)
{
    char *o = malloc(n + 1), *w = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            int a = i + 2 < n ? kvp__hex_value(s[i + 1]) : -1;
            int b = i + 2 < n ? kvp__hex_value(s[i + 2]) : -1;
            if (a < 0 || b < 0 || (a == 0 && b == 0)) { /* no NUL inside a credential */
                free(o);
                return NULL;
            }
            *w++ = (char)(a * 16 + b);
            i += 2;
        } else {
            *w++ = s[i];
        }
    }
    *w = '\0';
    return o;
}

static int bad_url(struct kvp_error *err, int sentinel, const char *what)
{
    if (sentinel)
        set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                "redis-sentinel location: %s (redis-sentinel://[USER[:PASSWORD]@]HOST:PORT"
                "[,HOST:PORT...]/MASTER[/DB][?prefix=NAME&wait=N&wait_ms=T])",
                what);
    else
        set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                "redis location: %s (redis://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/DB]"
                "[?prefix=NAME&wait=N&wait_ms=T])",
                what);
    return -EINVAL;
}

/* A number option's value: 0, or -1 when it is not a number in [lo, hi]. */
static int opt_num(const char *s, size_t n, long lo, long hi, long *out)
{
    char buf[16];
    if (n == 0 || n >= sizeof buf || strspn(s, "0123456789") < n)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *out = strtol(buf, NULL, 10);
    return *out < lo || *out > hi ? -1 : 0;
}

/* As a deployment's name ([A-Za-z0-9._-]), at most MAX_PREFIX bytes. */
static int prefix_valid(const char *s, size_t n)
{
    return n <= MAX_PREFIX && kvp_deployment_valid(s, n);
}

/* Parses where (the location after "redis:", or after "redis-sentinel:"
 * when sentinel) into cfg and prefix. */
/* USER[:PASSWORD] (the len bytes at s, before the '@') into cfg: 0 or
 * -EINVAL. */
static int parse_auth(const char *s, size_t len, int sentinel, struct kvp__rcfg *cfg,
                      struct kvp_error *err)
{
    const char *colon = memchr(s, ':', len);
    size_t ul = colon ? (size_t)(colon - s) : len;
    if (ul && !(cfg->user = pct_decode(s, ul)))
        return bad_url(err, sentinel, "the user has a bad %-escape");
    if (colon && !(cfg->pass = pct_decode(colon + 1, (size_t)(s + len - colon - 1))))
        return bad_url(err, sentinel, "the password has a bad %-escape");
    return 0;
}

/* One seed, h..he (HOST[:PORT] or [IPv6][:PORT]), into cfg: 0, -EINVAL or
 * -ENOMEM. */
static int parse_host(const char *h, const char *he, int sentinel, struct kvp__rcfg *cfg,
                      struct kvp_error *err)
{
    char msg[160];
    const char *hs = h, *hend, *colon;
    if (*h == '[') { /* [IPv6]:PORT */
        const char *rb = memchr(h, ']', (size_t)(he - h));
        if (!rb)
            return bad_url(err, sentinel, "an IPv6 address lacks its ']'");
        hs = h + 1;
        hend = rb;
        colon = rb + 1 < he && rb[1] == ':' ? rb + 1 : NULL;
        if (rb + 1 < he && !colon)
            return bad_url(err, sentinel, "junk after an IPv6 address");
    } else {
        colon = NULL;
        for (const char *p = h; p < he; p++)
            if (*p == ':')
                colon = p;
        hend = colon ? colon : he;
    }
    if (hend == hs) {
        snprintf(msg, sizeof msg, "host %zu is empty", cfg->nseeds + 1);
        return bad_url(err, sentinel, msg);
    }
    long port = sentinel ? 26379 : 6379;
    if (colon) {
        char *pe;
        port = strtol(colon + 1, &pe, 10);
        if (colon + 1 == he || pe != he || port < 1 || port > 65535) {
            snprintf(msg, sizeof msg, "port '%.*s' is not a number in 1..65535",
                     (int)(he - colon - 1 > 16 ? 16 : he - colon - 1), colon + 1);
            return bad_url(err, sentinel, msg);
        }
    }
    if (cfg->nseeds == KVP_REDIS_MAX_SEEDS) {
        snprintf(msg, sizeof msg, "more than %d seed nodes", KVP_REDIS_MAX_SEEDS);
        return bad_url(err, sentinel, msg);
    }
    if (!(cfg->host[cfg->nseeds] = strndup(hs, (size_t)(hend - hs)))) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    cfg->port[cfg->nseeds++] = (int)port;
    return 0;
}

/* The seeds HOST:PORT[,HOST:PORT...] of hosts..end into cfg. */
static int parse_hosts(const char *hosts, const char *end, int sentinel, struct kvp__rcfg *cfg,
                       struct kvp_error *err)
{
    if (hosts == end)
        return bad_url(err, sentinel, "names no HOST:PORT");
    for (const char *h = hosts; h < end;) {
        const char *comma = memchr(h, ',', (size_t)(end - h));
        int rc = parse_host(h, comma ? comma : end, sentinel, cfg, err);
        if (rc)
            return rc;
        if (comma && comma + 1 == end)
            return bad_url(err, sentinel, "ends with a ','");
        h = comma ? comma + 1 : end;
    }
    return 0;
}

/* The path, from slash (NULL: none) to end: /MASTER with sentinels, then
 * /DB, into cfg. */
static int parse_path(const char *slash, const char *end, int sentinel, struct kvp__rcfg *cfg,
                      struct kvp_error *err)
{
    char msg[160];
    if (sentinel) { /* /MASTER[/DB] */
        const char *ne = slash ? memchr(slash + 1, '/', (size_t)(end - slash - 1)) : NULL;
        if (!ne)
            ne = end;
        if (!slash || ne == slash + 1)
            return bad_url(err, sentinel, "names no master (/MASTER after the sentinels)");
        if (!(cfg->master_name = pct_decode(slash + 1, (size_t)(ne - slash - 1))) ||
            strpbrk(cfg->master_name, " \r\n\t") || strlen(cfg->master_name) > 64)
            return bad_url(err, sentinel,
                           "the master's name is not 1..64 characters without spaces");
        slash = ne < end ? ne : NULL;
    }
    if (slash && slash + 1 < end) {
        char *pe;
        long db = strtol(slash + 1, &pe, 10);
        if (pe != end || db < 0 || db > INT_MAX || slash[1] < '0' || slash[1] > '9') {
            snprintf(msg, sizeof msg, "database '%.*s' is not a number",
                     (int)(end - slash - 1 > 16 ? 16 : end - slash - 1), slash + 1);
            return bad_url(err, sentinel, msg);
        }
        cfg->db = (int)db;
        if (db && cfg->nseeds > 1 && !sentinel)
            return bad_url(err, sentinel, "a Redis Cluster has only database 0");
    }
    return 0;
}

/* The parameters after the '?' (p; NULL: none): prefix into prefix, wait
 * and wait_ms into cfg, events_max into *evmax. */
static int parse_params(const char *p, int sentinel, struct kvp__rcfg *cfg, char *prefix,
                        long *evmax, struct kvp_error *err)
{
    char msg[160];
    while (p && *p) {
        const char *amp = strchr(p, '&');
        size_t l = amp ? (size_t)(amp - p) : strlen(p);
        long v;
        if (l > 7 && !strncmp(p, "prefix=", 7)) {
            if (!prefix_valid(p + 7, l - 7))
                return bad_url(err, sentinel, "prefix must be 1..64 characters of [A-Za-z0-9._-]");
            memcpy(prefix, p + 7, l - 7);
            prefix[l - 7] = '\0';
        } else if (l > 5 && !strncmp(p, "wait=", 5)) {
            if (opt_num(p + 5, l - 5, 0, 64, &v))
                return bad_url(err, sentinel, "wait must be a number of replicas in 0..64");
            cfg->wait_replicas = (int)v;
        } else if (l > 8 && !strncmp(p, "wait_ms=", 8)) {
            if (opt_num(p + 8, l - 8, 1, 60000, &v))
                return bad_url(err, sentinel,
                               "wait_ms must be a number of milliseconds in 1..60000");
            cfg->wait_ms = (uint32_t)v;
        } else if (l > 11 && !strncmp(p, "events_max=", 11)) {
            if (opt_num(p + 11, l - 11, 100, 100000000, evmax))
                return bad_url(err, sentinel,
                               "events_max must be a number of entries in 100..100000000");
        } else {
            snprintf(msg, sizeof msg,
                     "unknown parameter '%.*s' (known: prefix, wait, wait_ms, events_max)",
                     (int)(l > 32 ? 32 : l), p);
            return bad_url(err, sentinel, msg);
        }
        p = amp ? amp + 1 : NULL;
    }
    if (cfg->wait_ms && !cfg->wait_replicas)
        return bad_url(err, sentinel, "wait_ms needs wait=N (the replicas to wait for)");
    if (cfg->wait_replicas && !cfg->wait_ms)
        cfg->wait_ms = 1000;
    return 0;
}

static int parse_url(const char *where, int sentinel, struct kvp__rcfg *cfg, char *prefix,
                     long *evmax, struct kvp_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(prefix, "kvp");
    if (strncmp(where, "//", 2))
        return bad_url(err, sentinel,
                       sentinel ? "must start with redis-sentinel://" : "must start with redis://");
    const char *s = where + 2;
    const char *q = strchr(s, '?');
    const char *end = q ? q : s + strlen(s);
    const char *slash = memchr(s, '/', (size_t)(end - s));
    const char *auth_end = slash ? slash : end;
    /* USER[:PASSWORD]@: up to the last '@' before the path */
    const char *at = NULL;
    for (const char *p = s; p < auth_end; p++)
        if (*p == '@')
            at = p;
    int rc;
    if ((at && (rc = parse_auth(s, (size_t)(at - s), sentinel, cfg, err))) ||
        (rc = parse_hosts(at ? at + 1 : s, auth_end, sentinel, cfg, err)) ||
        (rc = parse_path(slash, end, sentinel, cfg, err)) ||
        (rc = parse_params(q ? q + 1 : NULL, sentinel, cfg, prefix, evmax, err)))
        goto fail;
    /* Credentials from the environment when the location has none. */
    const char *env;
    if (!at && (env = getenv("KVPAGE_REDIS_USER")) && *env && !(cfg->user = strdup(env)))
        goto nomem;
    if (!cfg->pass && (env = getenv("KVPAGE_REDIS_PASSWORD")) && *env && !(cfg->pass = strdup(env)))
        goto nomem;
    return 0;
nomem:
    rc = -ENOMEM;
    kvp__err_oom(err, rc);
fail:
    free(cfg->user);
    free(cfg->pass);
    free(cfg->master_name);
    for (size_t i = 0; i < cfg->nseeds; i++)
        free(cfg->host[i]);
    memset(cfg, 0, sizeof *cfg);
    return rc;
}

/* ---------------------------------------------------------------- keys and scripts */

#define KEY_MAX 520 /* PREFIX:{DEP/HEXPOOL/RANK}:field */
#define NRKEYS 13
#define NRKEYS_TEXT "13"
#define K2P_FIELD 5  /* rank_fields[K2P_FIELD]: key -> page */
#define EV_FIELD 11  /* the stream of changes */
#define LIN_FIELD 12 /* key -> its parent and tokens, when a confirmation named them */

static const char *const rank_fields[NRKEYS] = {"m",  "free", "res",  "lru", "grace", "k2p", "p2k",
                                                "rb", "pin",  "pinc", "hx",  "ev",    "lin"};

struct rkeys {
    char k[NRKEYS][KEY_MAX];
    size_t len[NRKEYS];
    int slot;
};

static void rank_keys(const struct rns *ns, uint32_t rank, struct rkeys *k)
{
    char tag[KEY_MAX];
    int tl = snprintf(tag, sizeof tag, "%s/%u", ns->tag, rank);
    k->slot = (int)kvp__redis_slot(tag, (size_t)tl);
    for (int i = 0; i < NRKEYS; i++)
        k->len[i] =
            (size_t)snprintf(k->k[i], KEY_MAX, "%s:{%s}:%s", ns->m->prefix, tag, rank_fields[i]);
}

/* The slot of a key's hash tag (the text between its first '{' and '}'). */
static int key_slot(const char *key)
{
    const char *a = strchr(key, '{'), *b = a ? strchr(a + 1, '}') : NULL;
    return b ? (int)kvp__redis_slot(a + 1, (size_t)(b - a - 1))
             : (int)kvp__redis_slot(key, strlen(key));
}

static int unexpected(struct rmeta *m, const char *what, struct kvp_error *err)
{
    set_err(err, -EIO, KVP_RULE_UNAVAILABLE, -1, 0, 0, "redis %.120s: unexpected answer to %s",
            m->loc, what);
    return -EIO;
}

/*
 * Runs script sc with nkeys keys (of one slot) and nargs arguments. *out: an
 * array whose first element is an integer status, with at least min
 * elements when that status is ST_OK.
 */
static int run_script(struct rmeta *m, int sc, int slot, int idempotent, int nkeys,
                      const char *const *keys, const size_t *klens, size_t nargs,
                      const char *const *args, const size_t *alens, size_t min, redisReply **out,
                      struct kvp_error *err)
{
    *out = NULL;
    size_t argc = 3 + (size_t)nkeys + nargs;
    if (argc > INT_MAX) {
        set_err(err, -E2BIG, KVP_RULE_TOO_MANY, -1, (int64_t)nargs, INT_MAX - 20,
                "too many arguments for one Redis command");
        return -E2BIG;
    }
    const char **argv = malloc(argc * sizeof *argv);
    size_t *lens = malloc(argc * sizeof *lens);
    if (!argv || !lens) {
        free(argv);
        free(lens);
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    char nk[12];
    snprintf(nk, sizeof nk, "%d", nkeys);
    argv[0] = "EVALSHA", lens[0] = 7;
    argv[1] = "", lens[1] = 0; /* the SHA, filled in by kvp__rconn_cmd */
    argv[2] = nk, lens[2] = strlen(nk);
    for (int i = 0; i < nkeys; i++)
        argv[3 + i] = keys[i], lens[3 + i] = klens[i];
    for (size_t i = 0; i < nargs; i++)
        argv[3 + (size_t)nkeys + i] = args[i], lens[3 + (size_t)nkeys + i] = alens[i];
    redisReply *r;
    int rc =
        kvp__rconn_cmd(m->c, slot, &m->scripts[sc], idempotent, (int)argc, argv, lens, &r, err);
    free(argv);
    free(lens);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        (r->element[0]->integer == ST_OK && r->elements < min)) {
        kvp__rreply_free(r);
        return unexpected(m, "a script", err);
    }
    *out = r;
    return 0;
}

static int run_rank(struct rns *ns, uint32_t rank, int sc, int idempotent, size_t nargs,
                    const char *const *args, const size_t *alens, size_t min, redisReply **out,
                    struct kvp_error *err)
{
    struct rkeys k;
    rank_keys(ns, rank, &k);
    const char *keys[NRKEYS];
    for (int i = 0; i < NRKEYS; i++)
        keys[i] = k.k[i];
    return run_script(ns->m, sc, k.slot, idempotent, NRKEYS, keys, k.len, nargs, args, alens, min,
                      out, err);
}

static int64_t rint_at(const redisReply *r, size_t i)
{
    return i < r->elements && r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer
                                                                         : INT64_MIN;
}

static int not_init(uint32_t rank, struct kvp_error *err)
{
    return kvp__err_rank_not_init(err, rank);
}

/* Arguments of a script call: fixed ones, then the keys of a request. */
struct args {
    const char **v;
    size_t *len;
    size_t n;
    char (*num)[24]; /* numbers formatted here */
    size_t nnum;
};

static int args_init(struct args *a, size_t cap, size_t nnum, struct kvp_error *err)
{
    a->n = a->nnum = 0;
    a->v = malloc((cap ? cap : 1) * sizeof *a->v);
    a->len = malloc((cap ? cap : 1) * sizeof *a->len);
    a->num = malloc((nnum ? nnum : 1) * sizeof *a->num);
    if (!a->v || !a->len || !a->num) {
        free(a->v);
        free(a->len);
        free(a->num);
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    return 0;
}

static void args_free(struct args *a)
{
    free(a->v);
    free(a->len);
    free(a->num);
}

static void arg_str(struct args *a, const char *s, size_t len)
{
    a->v[a->n] = s;
    a->len[a->n++] = len;
}

static void arg_int(struct args *a, long long x)
{
    int l = snprintf(a->num[a->nnum], sizeof a->num[0], "%lld", x);
    arg_str(a, a->num[a->nnum++], (size_t)l);
}

static void arg_keys(struct args *a, const struct kvp_str *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        arg_str(a, keys[i].ptr, keys[i].len);
}

/* ---------------------------------------------------------------- namespaces */

static char *hex_of(const char *s, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    char *o = malloc(2 * n + 1);
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        o[2 * i] = digits[(uint8_t)s[i] >> 4];
        o[2 * i + 1] = digits[(uint8_t)s[i] & 15];
    }
    o[2 * n] = '\0';
    return o;
}

static void ns_free(struct rns *ns)
{
    if (!ns)
        return;
    free(ns->dep);
    free(ns->pool);
    free(ns->tag);
    free(ns->ranks_key);
    free(ns->seen_ranks);
    free(ns);
}

static struct rns *ns_new(struct rmeta *m, const char *dep, size_t dlen, const char *pool,
                          size_t plen)
{
    struct rns *ns = calloc(1, sizeof *ns);
    char *hex = hex_of(pool, plen);
    if (!ns || !hex)
        goto fail;
    ns->m = m;
    ns->pub.meta = m->front;
    ns->dep = strndup(dep, dlen);
    ns->pool = strndup(pool, plen);
    ns->taglen = dlen + 1 + 2 * plen;
    ns->tag = malloc(ns->taglen + 1);
    ns->ranks_key = malloc(strlen(m->prefix) + ns->taglen + 16);
    if (!ns->dep || !ns->pool || !ns->tag || !ns->ranks_key)
        goto fail;
    sprintf(ns->tag, "%.*s/%s", (int)dlen, dep, hex);
    sprintf(ns->ranks_key, "%s:{%s}:ranks", m->prefix, ns->tag);
    free(hex);
    return ns;
fail:
    free(hex);
    ns_free(ns);
    return NULL;
}

static struct rns *ns_cached(struct rmeta *m, const char *dep, size_t dlen, const char *pool,
                             size_t plen)
{
    pthread_mutex_lock(&m->lock);
    struct rns *ns = m->nss;
    for (; ns; ns = ns->next)
        if (strlen(ns->dep) == dlen && !memcmp(ns->dep, dep, dlen) && strlen(ns->pool) == plen &&
            !memcmp(ns->pool, pool, plen))
            break;
    pthread_mutex_unlock(&m->lock);
    return ns;
}

static void nslist_keys(struct rmeta *m, char *list, char *seq, size_t len)
{
    snprintf(list, len, "%s:{%s}:namespaces", m->prefix, m->prefix);
    snprintf(seq, len, "%s:{%s}:nsseq", m->prefix, m->prefix);
}

/* The data model of redis_lua.h, as PREFIX:{PREFIX}:format says it (in the
 * namespace list's slot: the script that registers a namespace sets it). */
#define STORE_FORMAT "2"

static void format_key(struct rmeta *m, char *key, size_t len)
{
    snprintf(key, len, "%s:{%s}:format", m->prefix, m->prefix);
}

/* The state's identity (kvp_meta_identity), in the same slot: set with the
 * format by the script that registers the first namespace, so that opening
 * a prefix writes nothing. */
static void identity_key(struct rmeta *m, char *key, size_t len)
{
    snprintf(key, len, "%s:{%s}:identity", m->prefix, m->prefix);
}

/* Lists the namespace (no change when it is listed already). */
static int ns_register(struct rmeta *m, struct rns *ns, struct kvp_error *err)
{
    char list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
    nslist_keys(m, list, seq, sizeof list);
    char fkey[MAX_PREFIX * 2 + 32], ikey[MAX_PREFIX * 2 + 32], id[KVP_IDENTITY_LEN + 1];
    format_key(m, fkey, sizeof fkey);
    identity_key(m, ikey, sizeof ikey);
    if (kvp__identity_new(id))
        memset(id, '0', sizeof id - 1), id[KVP_IDENTITY_LEN] = 0; /* no randomness: never valid */
    const char *argv[10] = {"EVALSHA", "", "4", list, seq, fkey, ikey, ns->tag, STORE_FORMAT, id};
    size_t lens[10] = {7,
                       0,
                       1,
                       strlen(list),
                       strlen(seq),
                       strlen(fkey),
                       strlen(ikey),
                       ns->taglen,
                       1,
                       KVP_IDENTITY_LEN};
    redisReply *r;
    int rc =
        kvp__rconn_cmd(m->c, key_slot(list), &m->scripts[SC_NS_CREATE], 1, 10, argv, lens, &r, err);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_INTEGER)
        rc = unexpected(m, "the namespace script", err);
    kvp__rreply_free(r);
    return rc;
}

static int rd_ns(struct kvp_meta *front, const char *deployment, size_t dlen, const char *pool,
                 size_t plen, int create, struct kvp_ns **out, uint64_t *ticket,
                 struct kvp_error *err)
{
    struct rmeta *m = front->be;
    *out = NULL;
    struct rns *ns = ns_cached(m, deployment, dlen, pool, plen);
    if (ns && (create || !__atomic_load_n(&ns->dropped, __ATOMIC_ACQUIRE))) {
        *out = &ns->pub;
        return 0;
    }
    if (ns) { /* dropped here: is it listed again (by another process)? */
        char list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
        nslist_keys(m, list, seq, sizeof list);
        const char *argv[3] = {"ZSCORE", list, ns->tag};
        size_t lens[3] = {6, strlen(list), ns->taglen};
        redisReply *r;
        int rc = kvp__rconn_cmd(m->c, key_slot(list), NULL, 1, 3, argv, lens, &r, err);
        if (rc)
            return rc;
        int listed = r->type != REDIS_REPLY_NIL;
        kvp__rreply_free(r);
        *out = listed ? &ns->pub : NULL;
        return listed ? 0 : -ENOENT;
    }
    if (!(ns = ns_new(m, deployment, dlen, pool, plen))) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    char list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
    nslist_keys(m, list, seq, sizeof list);
    redisReply *r = NULL;
    int rc;
    if (create) {
        rc = ns_register(m, ns, err);
    } else {
        const char *argv[3] = {"ZSCORE", list, ns->tag};
        size_t lens[3] = {6, strlen(list), ns->taglen};
        rc = kvp__rconn_cmd(m->c, key_slot(list), NULL, 1, 3, argv, lens, &r, err);
        if (!rc && r->type == REDIS_REPLY_NIL)
            rc = -ENOENT;
    }
    if (r)
        kvp__rreply_free(r);
    if (rc) {
        ns_free(ns);
        return rc;
    }
    /* Another thread may have found it meanwhile: keep the first. */
    pthread_mutex_lock(&m->lock);
    struct rns *o = m->nss;
    for (; o; o = o->next)
        if (!strcmp(o->tag, ns->tag))
            break;
    if (o) {
        ns_free(ns);
        ns = o;
    } else {
        ns->next = m->nss;
        m->nss = ns;
    }
    pthread_mutex_unlock(&m->lock);
    *out = &ns->pub;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The namespace's listed ranks, ascending, and their num_pages (np may be NULL). */
static int parse_ranks(struct rmeta *m, redisReply *r, uint32_t **ranks, uint32_t **np, size_t *n,
                       struct kvp_error *err);

static int list_ranks(struct rmeta *m, const char *ranks_key, uint32_t **ranks, uint32_t **np,
                      size_t *n, struct kvp_error *err)
{
    *ranks = NULL;
    *n = 0;
    if (np)
        *np = NULL;
    const char *argv[2] = {"HGETALL", ranks_key};
    size_t lens[2] = {7, strlen(ranks_key)};
    redisReply *r;
    int rc = kvp__rconn_cmd(m->c, key_slot(ranks_key), NULL, 1, 2, argv, lens, &r, err);
    if (rc)
        return rc;
    return parse_ranks(m, r, ranks, np, n, err);
}

/* The ranks (sorted) and their page counts of an HGETALL of a ranks key
 * (r, freed here). */
static int parse_ranks(struct rmeta *m, redisReply *r, uint32_t **ranks, uint32_t **np, size_t *n,
                       struct kvp_error *err)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2) {
        kvp__rreply_free(r);
        return unexpected(m, "HGETALL", err);
    }
    size_t k = r->elements / 2;
    uint64_t *pairs = malloc((k ? k : 1) * sizeof *pairs);
    uint32_t *rk = malloc((k ? k : 1) * sizeof *rk);
    uint32_t *pg = malloc((k ? k : 1) * sizeof *pg);
    if (!pairs || !rk || !pg) {
        free(pairs);
        free(rk);
        free(pg);
        kvp__rreply_free(r);
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    for (size_t i = 0; i < k; i++) {
        const redisReply *a = r->element[2 * i], *b = r->element[2 * i + 1];
        uint64_t id = a->type == REDIS_REPLY_STRING ? strtoull(a->str, NULL, 10) : 0;
        uint64_t pages = b->type == REDIS_REPLY_STRING ? strtoull(b->str, NULL, 10) : 0;
        pairs[i] = (id & 0xffffffffu) << 32 | (pages & 0xffffffffu);
    }
    kvp__rreply_free(r);
    qsort(pairs, k, sizeof *pairs, cmp_u64);
    for (size_t i = 0; i < k; i++) {
        rk[i] = (uint32_t)(pairs[i] >> 32);
        pg[i] = (uint32_t)pairs[i];
    }
    free(pairs);
    *ranks = rk;
    *n = k;
    if (np)
        *np = pg;
    else
        free(pg);
    return 0;
}

/* ---------------------------------------------------------------- operations */

/*
 * A rank new to the namespace's list takes the namespace's pins from
 * another rank (pins are the namespace's, kept on every rank: see rd_pin):
 * two more round trips, for a rank's first initialize only.
 */
static int pins_inherit(struct rns *ns, uint32_t rank, struct kvp_error *err)
{
    uint32_t *ranks;
    size_t nr;
    int rc = list_ranks(ns->m, ns->ranks_key, &ranks, NULL, &nr, err);
    if (rc)
        return rc;
    size_t from = 0;
    while (from < nr && ranks[from] == rank)
        from++;
    redisReply *r = NULL;
    if (from < nr)
        rc = run_rank(ns, ranks[from], SC_PINS_READ, 1, 0, NULL, NULL, 1, &r, err);
    free(ranks);
    if (rc || !r || r->element[0]->integer != ST_OK || r->elements < 4) {
        if (r)
            kvp__rreply_free(r);
        return rc;
    }
    size_t n = r->elements - 1;
    const char **v = malloc(n * sizeof *v);
    size_t *l = malloc(n * sizeof *l);
    if (!v || !l) {
        rc = kvp__err_oom(err, -ENOMEM);
    } else {
        for (size_t i = 0; i < n; i++) {
            const redisReply *e = r->element[1 + i];
            v[i] = e->type == REDIS_REPLY_STRING ? e->str : "1";
            l[i] = e->type == REDIS_REPLY_STRING ? e->len : 1;
        }
        redisReply *w;
        if ((rc = run_rank(ns, rank, SC_PINS_MERGE, 1, n, v, l, 1, &w, err)) == 0)
            kvp__rreply_free(w);
    }
    free(v);
    free(l);
    kvp__rreply_free(r);
    return rc;
}

static int rd_init_rank(struct kvp_ns *pub, uint32_t rank, uint32_t num_pages, uint64_t *ticket,
                        struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    struct rmeta *m = ns->m;
    (void)ticket;
    /* The limit on ranks counts the namespace's list: not atomic with other
     * processes initializing ranks at the same moment (it may overshoot by
     * as many as race). */
    char rk[12];
    snprintf(rk, sizeof rk, "%u", rank);
    const char *keys[1] = {ns->ranks_key};
    size_t kl[1] = {strlen(ns->ranks_key)};
    const char *a[1] = {rk};
    size_t al[1] = {strlen(rk)};
    redisReply *r;
    int rc =
        run_script(m, SC_RANK_COUNT, key_slot(ns->ranks_key), 1, 1, keys, kl, 1, a, al, 2, &r, err);
    if (rc)
        return rc;
    int listed = r->element[0]->integer != 0;
    int64_t count = rint_at(r, 1);
    kvp__rreply_free(r);
    if (!listed && count >= MAX_RANKS_PER_NS) {
        return kvp__err_too_many_ranks(err, -ENOSPC, count, MAX_RANKS_PER_NS);
    }
    char np[12];
    snprintf(np, sizeof np, "%u", num_pages);
    const char *ia[1] = {np};
    size_t il[1] = {strlen(np)};
    if ((rc = run_rank(ns, rank, SC_INIT, 1, 1, ia, il, 1, &r, err)) != 0)
        return rc;
    int64_t st = r->element[0]->integer, old = rint_at(r, 1);
    kvp__rreply_free(r);
    if (st == ST_RESIZE_HELD) {
        return kvp__err_resize_held(err, rank, old, num_pages);
    }
    if (st != ST_OK)
        return unexpected(m, "the init script", err);
    /* Listed after the rank exists (also repairs a list that missed it),
     * and the namespace too: a Redis that lost its data (restarted without
     * persistence) forgot it while this handle still holds it. */
    const char *argv[4] = {"HSET", ns->ranks_key, rk, np};
    size_t lens[4] = {4, kl[0], strlen(rk), strlen(np)};
    if ((rc = kvp__rconn_cmd(m->c, key_slot(ns->ranks_key), NULL, 1, 4, argv, lens, &r, err)))
        return rc;
    kvp__rreply_free(r);
    if (!listed && count > 0 && (rc = pins_inherit(ns, rank, err)) != 0)
        return rc;
    if ((rc = ns_register(m, ns, err)) == 0)
        __atomic_store_n(&ns->dropped, 0, __ATOMIC_RELEASE);
    return rc;
}

static int rd_allocate_ordered(struct kvp_ns *pub, uint32_t rank, int order,
                               const struct kvp_str *keys, size_t n, int64_t *pages,
                               uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    (void)ticket;
    struct args a;
    int rc;
    if ((rc = args_init(&a, 3 + n, 3, err)) != 0)
        return rc;
    arg_int(&a, (long long)(ns->m->lease_ms > INT64_MAX / 2 ? INT64_MAX / 2 : ns->m->lease_ms));
    arg_int(&a, EVICT_SCAN_MAX);
    arg_int(&a, order);
    arg_keys(&a, keys, n);
    redisReply *r;
    /* Not repeated after a lost connection: it may have handed out pages. */
    rc = run_rank(ns, rank, SC_ALLOCATE, 0, a.n, a.v, a.len, 3, &r, err);
    args_free(&a);
    if (rc)
        return rc;
    if (r->element[0]->integer == ST_NOT_INIT) {
        kvp__rreply_free(r);
        return not_init(rank, err);
    }
    /* {0, the pages in decimal separated by spaces, a '0'/'1' per key} */
    const redisReply *pr = r->element[1], *er = r->element[2];
    int bad = pr->type != REDIS_REPLY_STRING || er->type != REDIS_REPLY_STRING || er->len != n;
    const char *s = bad ? NULL : pr->str, *end = s ? s + pr->len : NULL;
    for (size_t i = 0; i < n && !bad; i++) {
        char *e;
        long long v = strtoll(s, &e, 10);
        bad = e == s || e > end || v < -1 || v > (long long)KVP_MAX_PAGES ||
              (i + 1 < n ? *e != ' ' : e != end);
        pages[i] = v;
        if (existed)
            existed[i] = er->str[i] == '1';
        s = e + 1;
    }
    kvp__rreply_free(r);
    return bad ? unexpected(ns->m, "the allocate script", err) : 0;
}

static int rd_allocate(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys, size_t n,
                       int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    return rd_allocate_ordered(pub, rank, KVP_ORDER_DEFAULT, keys, n, pages, existed, ticket, err);
}

/* The index of the first confirmation (in page, then index order) whose page
 * another confirmation of the request gives to a different key, or -1: as
 * the in-process engine finds it. Pages outside [0, 2^31) fail the range
 * check first, so they do not matter here. */
static int64_t dup_confirmation(const struct kvp_str *keys, const int64_t *pages, size_t n,
                                int *nomem)
{
    *nomem = 0;
    if (n < 2)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (pages[i] < 0 || pages[i] > (int64_t)KVP_MAX_PAGES)
            return -1;
    uint64_t *order = malloc(n * sizeof *order);
    if (!order) {
        *nomem = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint64_t)pages[i] << 32 | i;
    qsort(order, n, sizeof *order, cmp_u64);
    int64_t found = -1;
    for (size_t j = 1; j < n && found < 0; j++) {
        size_t x = order[j - 1] & 0xffffffffu, y = order[j] & 0xffffffffu;
        if (pages[x] == pages[y] &&
            (keys[x].len != keys[y].len || memcmp(keys[x].ptr, keys[y].ptr, keys[x].len)))
            found = (int64_t)y;
    }
    free(order);
    return found;
}

static long long max_page(const int64_t *pages, size_t n)
{
    long long m = 0;
    for (size_t i = 0; i < n; i++) {
        if (pages[i] < 0 || pages[i] > (int64_t)KVP_MAX_PAGES)
            return -1;
        if (pages[i] > m)
            m = pages[i];
    }
    return m;
}

static void put_le32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16),
    b[3] = (uint8_t)(v >> 24);
}

/* Each key's tokens for the confirm script, one buffer: per key its count,
 * then the tokens, little-endian u32s (the stream's field 't', as is). */
static uint8_t *token_bytes(const struct kvp_confirm_opts *o, size_t n, size_t **off)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += 4 + 4 * (size_t)o->ntokens[i];
    uint8_t *b = malloc(total ? total : 1);
    *off = malloc((n + 1) * sizeof **off);
    if (!b || !*off) {
        free(b);
        free(*off);
        *off = NULL;
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        (*off)[i] = at;
        for (uint32_t j = 0; j <= o->ntokens[i]; j++, at += 4)
            put_le32(b + at, j ? o->token_ids[i][j - 1] : o->ntokens[i]);
    }
    (*off)[n] = at;
    return b;
}

/* confirm, and confirm_ex (o not NULL): its parents and tokens go to the
 * script after the releases, which puts them in the stream with the keys. */
static int confirm_run(struct rns *ns, uint32_t rank, const struct kvp_str *keys,
                       const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                       const struct kvp_confirm_opts *o, struct kvp_error *err)
{
    int nomem;
    int64_t dup = dup_confirmation(keys, pages, n, &nomem);
    int hasp = o && o->parents, hast = o && o->token_ids;
    uint8_t *tok = NULL;
    size_t *toff = NULL;
    if (!nomem && hast && !(tok = token_bytes(o, n, &toff)))
        nomem = 1;
    if (nomem) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    struct args a;
    int rc;
    if ((rc = args_init(&a, 6 + (2 + (size_t)hasp + (size_t)hast) * n + nrel, 5 + n + nrel, err)) !=
        0) {
        free(tok);
        free(toff);
        return rc;
    }
    arg_int(&a, (long long)n);
    arg_int(&a, (long long)nrel);
    arg_int(&a, dup);
    /* The highest page of each list when all are in [0, 2^31), else -1: one
     * comparison with num_pages spares the script checking each. */
    arg_int(&a, max_page(pages, n));
    arg_int(&a, max_page(release, nrel));
    arg_keys(&a, keys, n);
    for (size_t i = 0; i < n; i++)
        arg_int(&a, pages[i]);
    for (size_t i = 0; i < nrel; i++)
        arg_int(&a, release[i]);
    if (hasp || hast)
        arg_str(&a, hasp && hast ? "pt" : hasp ? "p" : "t", (size_t)(hasp + hast));
    for (size_t i = 0; hasp && i < n; i++) /* len 0: no parent, ptr maybe NULL */
        arg_str(&a, o->parents[i].len ? o->parents[i].ptr : "", o->parents[i].len);
    for (size_t i = 0; hast && i < n; i++)
        arg_str(&a, (const char *)tok + toff[i], toff[i + 1] - toff[i]);
    redisReply *r;
    rc = run_rank(ns, rank, SC_CONFIRM, 1, a.n, a.v, a.len, 1, &r, err);
    args_free(&a);
    free(tok);
    free(toff);
    if (rc)
        return rc;
    int64_t st = r->element[0]->integer, i = rint_at(r, 1), np = rint_at(r, 2);
    kvp__rreply_free(r);
    switch (st) {
    case ST_OK:
        return 0;
    case ST_NOT_INIT:
        return not_init(rank, err);
    case ST_CONFIRM:
        if (i < 0 || (size_t)i >= n)
            break;
        return kvp__err_page_range(err, KVP_RULE_CONFIRM_PAGE, "confirmation", i, pages[i],
                                   (uint32_t)np);
    case ST_RELEASE:
        if (i < 0 || (size_t)i >= nrel)
            break;
        return kvp__err_page_range(err, KVP_RULE_RELEASE_PAGE, "release", i, release[i],
                                   (uint32_t)np);
    case ST_HELD_OTHER:
        if (i < 0 || (size_t)i >= n)
            break;
        return kvp__err_held_by_other(err, i, pages[i], rank);
    }
    return unexpected(ns->m, "the confirm script", err);
}

static int rd_confirm(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys,
                      const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                      uint64_t *ticket, struct kvp_error *err)
{
    (void)ticket;
    return confirm_run((struct rns *)pub, rank, keys, pages, n, release, nrel, NULL, err);
}

static int rd_confirm_ex(struct kvp_ns *pub, uint32_t rank, const struct kvp_str *keys,
                         const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                         const struct kvp_confirm_opts *opts, uint64_t *ticket,
                         struct kvp_error *err)
{
    (void)ticket;
    return confirm_run((struct rns *)pub, rank, keys, pages, n, release, nrel, opts, err);
}

/*
 * Ranks of one namespace asked together: one command per rank, pipelined
 * (kvp__rconn_multi), a chunk of ranks at a time. sc >= 0: that script with
 * args; SC_HMGET: HMGET of the args (keys) in the rank's key -> page map.
 * fn gets each rank's reply (checked as run_script checks it, min elements)
 * and frees nothing; a non-zero return stops.
 */
#define SC_HMGET (-1)
#define BATCH_RANKS 256

typedef int (*rank_reply_fn)(void *arg, size_t j, redisReply *r, struct kvp_error *err);

static int ranks_batch_pre(struct rns *ns, const uint32_t *ranks, size_t nr, int sc, size_t nargs,
                           const char *const *args, const size_t *alens, size_t min,
                           rank_reply_fn fn, void *arg, struct kvp__rcmd *pre,
                           struct kvp_error *err);

static int ranks_batch(struct rns *ns, const uint32_t *ranks, size_t nr, int sc, size_t nargs,
                       const char *const *args, const size_t *alens, size_t min, rank_reply_fn fn,
                       void *arg, struct kvp_error *err)
{
    return ranks_batch_pre(ns, ranks, nr, sc, nargs, args, alens, min, fn, arg, NULL, err);
}

/* As ranks_batch, with pre (may be NULL) sent first in the same round trip
 * (its reply, or NULL, left in pre->reply for the caller). */
static int ranks_batch_pre(struct rns *ns, const uint32_t *ranks, size_t nr, int sc, size_t nargs,
                           const char *const *args, const size_t *alens, size_t min,
                           rank_reply_fn fn, void *arg, struct kvp__rcmd *pre,
                           struct kvp_error *err)
{
    struct rmeta *m = ns->m;
    size_t klen = strlen(m->prefix) + ns->taglen + 32;
    size_t argc = sc == SC_HMGET ? 2 + nargs : 3 + NRKEYS + nargs;
    if (argc > INT_MAX) {
        set_err(err, -E2BIG, KVP_RULE_TOO_MANY, -1, (int64_t)nargs, INT_MAX - 20,
                "too many arguments for one Redis command");
        return -E2BIG;
    }
    size_t chunk = nr < BATCH_RANKS ? (nr ? nr : 1) : BATCH_RANKS;
    struct kvp__rcmd *all = calloc(chunk + 1, sizeof *all), *cmds = all ? all + 1 : NULL;
    char *kbuf = malloc(chunk * NRKEYS * klen);
    const char **argv = malloc(chunk * argc * sizeof *argv);
    size_t *lens = malloc(chunk * argc * sizeof *lens);
    int rc = 0;
    if (pre)
        pre->reply = NULL;
    if (!cmds || !kbuf || !argv || !lens) {
        rc = -ENOMEM;
        kvp__err_oom(err, rc);
    }
    for (size_t base = 0; !rc && (base < nr || (pre && base == 0)); base += chunk) {
        size_t c = nr - base < chunk ? nr - base : chunk;
        for (size_t j = 0; j < c; j++) {
            const char **v = argv + j * argc;
            size_t *l = lens + j * argc, o = 0;
            char tag[KEY_MAX];
            int tl = snprintf(tag, sizeof tag, "%s/%u", ns->tag, ranks[base + j]);
            char *kb = kbuf + j * NRKEYS * klen;
            if (sc == SC_HMGET) {
                v[o] = "HMGET", l[o++] = 5;
                v[o] = kb, l[o++] = (size_t)snprintf(kb, klen, "%s:{%s}:%s", m->prefix, tag,
                                                     rank_fields[K2P_FIELD]);
            } else {
                v[o] = "EVALSHA", l[o++] = 7;
                v[o] = "", l[o++] = 0;
                v[o] = NRKEYS_TEXT, l[o++] = sizeof NRKEYS_TEXT - 1;
                for (int f = 0; f < NRKEYS; f++)
                    v[o] = kb + f * klen,
                    l[o++] = (size_t)snprintf(kb + f * klen, klen, "%s:{%s}:%s", m->prefix, tag,
                                              rank_fields[f]);
            }
            for (size_t a = 0; a < nargs; a++)
                v[o] = args[a], l[o++] = alens[a];
            cmds[j] = (struct kvp__rcmd){.slot = (int)kvp__redis_slot(tag, (size_t)tl),
                                         .script = sc == SC_HMGET ? NULL : &m->scripts[sc],
                                         .argc = (int)argc,
                                         .argv = v,
                                         .lens = l};
        }
        if (pre && base == 0) { /* first, in the same round trip */
            all[0] = *pre;
            rc = kvp__rconn_multi(m->c, all, c + 1, err);
            pre->reply = all[0].reply;
            pre->rc = all[0].rc;
        } else {
            rc = kvp__rconn_multi(m->c, cmds, c, err);
        }
        for (size_t j = 0; j < c; j++) {
            redisReply *r = cmds[j].reply;
            int bad = sc == SC_HMGET
                          ? r && (r->type != REDIS_REPLY_ARRAY || r->elements != nargs)
                          : r && (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
                                  r->element[0]->type != REDIS_REPLY_INTEGER ||
                                  (r->element[0]->integer == ST_OK && r->elements < min));
            if (!rc && bad)
                rc = unexpected(m, sc == SC_HMGET ? "HMGET" : "a script", err);
            if (!rc && r)
                rc = fn(arg, base + j, r, err);
            if (r)
                kvp__rreply_free(r);
        }
    }
    free(all);
    free(kbuf);
    free(argv);
    free(lens);
    return rc;
}

struct held_arg {
    uint8_t *held;
    size_t n;
};

static int held_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct held_arg *h = arg;
    (void)j;
    (void)err;
    for (size_t i = 0; i < h->n; i++)
        h->held[i] &= r->element[i]->type != REDIS_REPLY_NIL;
    return 0;
}

/* A copy of ranks[0..n) without `except` (-1: none), *k long; NULL: no
 * memory (err set). */
static uint32_t *ranks_but(const uint32_t *ranks, size_t n, int64_t except, size_t *k,
                           struct kvp_error *err)
{
    uint32_t *out = malloc((n ? n : 1) * sizeof *out);
    *k = 0;
    if (!out) {
        kvp__err_oom(err, -ENOMEM);
        return NULL;
    }
    for (size_t j = 0; j < n; j++)
        if ((int64_t)ranks[j] != except)
            out[(*k)++] = ranks[j];
    return out;
}

/*
 * out[i] = keys[i] holds a page on every listed rank of the namespace but
 * `except` (-1: none); *nranks: how many are listed. The ranks are asked
 * together but each on its own: not atomic across ranks.
 */
static int held_elsewhere(struct rns *ns, int64_t except, const struct kvp_str *keys, size_t n,
                          uint8_t *out, size_t *nranks, struct kvp_error *err)
{
    struct rmeta *m = ns->m;
    /* The ranks last seen, asked for with the list itself in one round
     * trip; asked again only if the list read with them differs. */
    uint32_t *guess = NULL, *ranks = NULL;
    size_t ng = 0, nr = 0;
    int have = 0, rc = 0;
    pthread_mutex_lock(&m->lock);
    if (ns->seen_valid && (guess = malloc((ns->nseen ? ns->nseen : 1) * sizeof *guess))) {
        memcpy(guess, ns->seen_ranks, ns->nseen * sizeof *guess);
        ng = ns->nseen;
        have = 1;
    }
    pthread_mutex_unlock(&m->lock);
    struct args a;
    int args_ok = n && (rc = args_init(&a, n, 0, err)) == 0;
    if (rc)
        goto out;
    if (args_ok)
        arg_keys(&a, keys, n);
    struct held_arg h = {out, n};
    if (have) {
        size_t k, lens[2] = {7, strlen(ns->ranks_key)};
        const char *argv[2] = {"HGETALL", ns->ranks_key};
        struct kvp__rcmd pre = {
            .slot = key_slot(ns->ranks_key), .argc = 2, .argv = argv, .lens = lens};
        uint32_t *ask = ranks_but(guess, ng, except, &k, err);
        if (!ask) {
            rc = -ENOMEM;
            goto out;
        }
        memset(out, 1, n);
        rc = ranks_batch_pre(ns, ask, args_ok ? k : 0, SC_HMGET, args_ok ? a.n : 0,
                             args_ok ? a.v : NULL, args_ok ? a.len : NULL, 0, held_reply, &h, &pre,
                             err);
        free(ask);
        if (!rc && !pre.reply)
            rc = unexpected(m, "HGETALL", err);
        if (rc) {
            if (pre.reply)
                kvp__rreply_free(pre.reply);
            goto out;
        }
        if ((rc = parse_ranks(m, pre.reply, &ranks, NULL, &nr, err)) != 0)
            goto out;
        if (nr == ng && !memcmp(ranks, guess, nr * sizeof *ranks))
            goto done; /* the list was as seen: the answers stand */
    } else if ((rc = list_ranks(m, ns->ranks_key, &ranks, NULL, &nr, err)) != 0) {
        goto out;
    }
    /* The ranks as they are now: asked (again). */
    memset(out, 1, n);
    if (args_ok) {
        size_t k;
        uint32_t *ask = ranks_but(ranks, nr, except, &k, err);
        if (!ask) {
            rc = -ENOMEM;
            goto out;
        }
        rc = ranks_batch(ns, ask, k, SC_HMGET, a.n, a.v, a.len, 0, held_reply, &h, err);
        free(ask);
        if (rc)
            goto out;
    }
done:
    *nranks = nr;
    pthread_mutex_lock(&m->lock);
    if (!ns->seen_valid || ns->nseen != nr || memcmp(ns->seen_ranks, ranks, nr * sizeof *ranks)) {
        free(ns->seen_ranks);
        ns->seen_ranks = ranks;
        ns->nseen = nr;
        ns->seen_valid = 1;
        ranks = NULL;
    }
    pthread_mutex_unlock(&m->lock);
out:
    if (args_ok)
        args_free(&a);
    free(guess);
    free(ranks);
    return rc;
}

static int rd_exists(struct kvp_ns *pub, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint8_t *out, struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    if (rank < 0) {
        size_t nr;
        int rc = held_elsewhere(ns, -1, keys, n, out, &nr, err);
        if (!rc && !nr)
            memset(out, 0, n);
        return rc;
    }
    struct args a;
    int rc;
    if ((rc = args_init(&a, n, 0, err)) != 0)
        return rc;
    arg_keys(&a, keys, n);
    redisReply *r;
    rc = run_rank(ns, (uint32_t)rank, SC_EXISTS, 1, a.n, a.v, a.len, 1 + n, &r, err);
    args_free(&a);
    if (rc)
        return rc;
    if (r->element[0]->integer == ST_NOT_INIT) {
        kvp__rreply_free(r);
        return not_init((uint32_t)rank, err);
    }
    for (size_t i = 0; i < n; i++)
        out[i] = rint_at(r, 1 + i) == 1;
    kvp__rreply_free(r);
    return 0;
}

static int rd_lookup(struct kvp_ns *pub, uint32_t rank, int complete_only,
                     const struct kvp_str *keys, size_t n, int64_t *pages, struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    char *flags = malloc(n + 1);
    if (!flags) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    int rc = 0;
    memset(flags, '1', n);
    if (complete_only && n) {
        /* Completeness on the other ranks, asked before this rank's script:
         * not atomic across ranks. */
        uint8_t *held = malloc(n);
        size_t nr;
        if (!held) {
            rc = -ENOMEM;
            kvp__err_oom(err, rc);
        } else if ((rc = held_elsewhere(ns, rank, keys, n, held, &nr, err)) == 0) {
            for (size_t i = 0; i < n; i++)
                flags[i] = held[i] ? '1' : '0';
        }
        free(held);
    }
    struct args a;
    if (rc || (rc = args_init(&a, 3 + n, 1, err)) != 0) {
        free(flags);
        return rc;
    }
    arg_int(&a, (long long)(ns->m->grace_ms > INT64_MAX / 2 ? INT64_MAX / 2 : ns->m->grace_ms));
    arg_str(&a, complete_only ? "1" : "0", 1);
    arg_str(&a, flags, n);
    arg_keys(&a, keys, n);
    redisReply *r;
    rc = run_rank(ns, rank, SC_LOOKUP, 1, a.n, a.v, a.len, 1 + n, &r, err);
    args_free(&a);
    free(flags);
    if (rc)
        return rc;
    if (r->element[0]->integer == ST_NOT_INIT) {
        kvp__rreply_free(r);
        return not_init(rank, err);
    }
    for (size_t i = 0; i < n; i++)
        pages[i] = rint_at(r, 1 + i);
    kvp__rreply_free(r);
    return 0;
}

/* Runs a delete or clear script on one rank; ST_NOT_INIT as *missing. */
static int rank_op(struct rns *ns, uint32_t rank, int sc, const struct kvp_str *keys, size_t n,
                   int *missing, struct kvp_error *err)
{
    struct args a;
    int rc;
    if ((rc = args_init(&a, n, 0, err)) != 0)
        return rc;
    arg_keys(&a, keys, n);
    redisReply *r;
    rc = run_rank(ns, rank, sc, 1, a.n, a.v, a.len, 1, &r, err);
    args_free(&a);
    if (rc)
        return rc;
    *missing = r->element[0]->integer == ST_NOT_INIT;
    kvp__rreply_free(r);
    return 0;
}

static int ignore_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    (void)arg;
    (void)j;
    (void)r;
    (void)err;
    return 0; /* a rank listed but gone (ST_NOT_INIT) has nothing to delete */
}

/* A delete or clear of one rank, or (rank < 0) of every listed rank, sent
 * together: each rank's part is atomic, the whole is not. */
static int each_rank_op(struct rns *ns, int64_t rank, int sc, const struct kvp_str *keys, size_t n,
                        struct kvp_error *err)
{
    int missing = 0, rc;
    if (rank >= 0) {
        if ((rc = rank_op(ns, (uint32_t)rank, sc, keys, n, &missing, err)) != 0)
            return rc;
        return missing ? not_init((uint32_t)rank, err) : 0;
    }
    uint32_t *ranks;
    size_t nr;
    if ((rc = list_ranks(ns->m, ns->ranks_key, &ranks, NULL, &nr, err)) != 0)
        return rc;
    struct args a;
    if (nr && (rc = args_init(&a, n, 0, err)) == 0) {
        arg_keys(&a, keys, n);
        rc = ranks_batch(ns, ranks, nr, sc, a.n, a.v, a.len, 1, ignore_reply, NULL, err);
        args_free(&a);
    }
    free(ranks);
    return rc;
}

static int rd_delete(struct kvp_ns *pub, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint64_t *ticket, struct kvp_error *err)
{
    (void)ticket;
    return each_rank_op((struct rns *)pub, rank, SC_DELETE, keys, n, err);
}

static int rd_clear(struct kvp_ns *pub, int64_t rank, uint64_t *ticket, struct kvp_error *err)
{
    (void)ticket;
    return each_rank_op((struct rns *)pub, rank, SC_CLEAR, NULL, 0, err);
}

/* Deletes one command's worth of keys of one slot (DEL k...). */
static int del_keys(struct rmeta *m, int slot, int n, const char **keys, const size_t *lens,
                    struct kvp_error *err)
{
    const char *argv[NRKEYS + 1] = {"DEL"};
    size_t al[NRKEYS + 1] = {3};
    for (int i = 0; i < n; i++)
        argv[1 + i] = keys[i], al[1 + i] = lens[i];
    redisReply *r;
    int rc = kvp__rconn_cmd(m->c, slot, NULL, 1, 1 + n, argv, al, &r, err);
    if (!rc)
        kvp__rreply_free(r);
    return rc;
}

/* kvp_meta_drop: every rank's keys, the rank list and the namespace's entry
 * in the list of namespaces are deleted, in that order (each step atomic,
 * the whole not: a drop cut short is finished by repeating it). A later
 * init_rank lists the namespace again. */
static int rd_drop(struct kvp_meta *front, const char *dep, size_t dlen, const char *pool,
                   size_t plen, uint64_t *ticket, struct kvp_error *err)
{
    struct rmeta *m = front->be;
    struct kvp_ns *pub;
    int rc = rd_ns(front, dep, dlen, pool, plen, 0, &pub, ticket, err);
    if (rc == -ENOENT)
        kvp__err_no_namespace(err, rc, dep, dlen, pool, plen);
    if (rc)
        return rc;
    struct rns *ns = (struct rns *)pub;
    char list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
    nslist_keys(m, list, seq, sizeof list);
    const char *argv[3] = {"ZSCORE", list, ns->tag};
    size_t lens[3] = {6, strlen(list), ns->taglen};
    redisReply *r;
    if ((rc = kvp__rconn_cmd(m->c, key_slot(list), NULL, 1, 3, argv, lens, &r, err)) != 0)
        return rc;
    int listed = r->type != REDIS_REPLY_NIL;
    kvp__rreply_free(r);
    if (!listed) { /* a handle of this process may know it still: Redis does not */
        return kvp__err_no_namespace(err, -ENOENT, dep, dlen, pool, plen);
    }
    uint32_t *ranks;
    size_t nr;
    if ((rc = list_ranks(m, ns->ranks_key, &ranks, NULL, &nr, err)) != 0)
        return rc;
    /* Each rank by the clear script in its drop form: the removals of its
     * held keys go to its stream of changes (KV events) with the deletion. */
    const char *one[1] = {"1"};
    size_t onel[1] = {1};
    for (size_t i = 0; i < nr && !rc; i++) {
        if ((rc = run_rank(ns, ranks[i], SC_CLEAR, 1, 1, one, onel, 1, &r, err)) == 0)
            kvp__rreply_free(r);
    }
    free(ranks);
    const char *rk[1] = {ns->ranks_key};
    size_t rl[1] = {strlen(ns->ranks_key)};
    if (!rc)
        rc = del_keys(m, key_slot(ns->ranks_key), 1, rk, rl, err);
    argv[0] = "ZREM", lens[0] = 4;
    if (!rc && (rc = kvp__rconn_cmd(m->c, key_slot(list), NULL, 1, 3, argv, lens, &r, err)) == 0) {
        kvp__rreply_free(r);
        __atomic_store_n(&ns->dropped, 1, __ATOMIC_RELEASE);
    }
    return rc;
}

/* ---------------------------------------------------------------- pins */

/*
 * Pins (kvp_meta_pin) belong to the namespace, but no script may touch two
 * slots: every rank keeps the namespace's pins (pin, pinc; redis_lua.h),
 * and eviction on a rank passes over the pages of the keys it has pinned.
 * A pin runs first on the smallest rank, whose script checks the limit
 * atomically (the limit is the smallest rank's share, as in-process), so a
 * refused pin changes nothing; then on the other ranks in one round trip.
 * Deadlines are Redis's TIME: pins survive any kvpage restart. A rank's
 * first initialize copies them from another rank (pins_inherit).
 */

struct pin_arg {
    const uint32_t *ranks;
    int refused;
    uint32_t rank, np;
    uint64_t total, limit, news, most[2];
};

/* The refusal of a pin script's reply r on rank (ST_PIN_LIMIT). */
static int pin_refused(const redisReply *r, uint32_t rank, double ratio, uint64_t *total,
                       uint64_t *limit, struct kvp_error *err)
{
    uint64_t after = (uint64_t)rint_at(r, 1), news = (uint64_t)rint_at(r, 4);
    *total = after - news;
    *limit = (uint64_t)rint_at(r, 2);
    return kvp__err_pin_limit(err, news, after, *limit, ratio, rank, (uint32_t)rint_at(r, 3));
}

static int pin_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct pin_arg *p = arg;
    (void)err;
    if (r->element[0]->integer == ST_PIN_LIMIT && !p->refused) {
        p->refused = 1;
        p->rank = p->ranks[j];
        p->total = (uint64_t)rint_at(r, 1);
        p->news = (uint64_t)rint_at(r, 4);
        p->limit = (uint64_t)rint_at(r, 2);
        p->np = (uint32_t)rint_at(r, 3);
    }
    return 0;
}

static int rd_pin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                  double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    uint32_t *ranks, *np, *others = NULL;
    size_t nr, k = 0;
    int rc = list_ranks(ns->m, ns->ranks_key, &ranks, &np, &nr, err);
    if (rc)
        return rc;
    struct args a = {0};
    if (!nr) {
        rc = -ENOENT;
        set_err(err, rc, KVP_RULE_RANK_NOT_INIT, -1, 0, 0,
                "the namespace has no initialized rank: nothing to pin");
        goto out;
    }
    size_t s = 0; /* the smallest rank, the lowest of those */
    for (size_t i = 1; i < nr; i++)
        if (np[i] < np[s])
            s = i;
    char ratio[32];
    int rl = snprintf(ratio, sizeof ratio, "%.17g", max_ratio);
    if ((rc = args_init(&a, n + 2, 1, err)) != 0)
        goto out;
    arg_int(&a, (long long)ttl_ms);
    arg_str(&a, ratio, (size_t)rl);
    arg_keys(&a, keys, n);
    redisReply *r;
    if ((rc = run_rank(ns, ranks[s], SC_PIN, 0, a.n, a.v, a.len, 4, &r, err)) != 0)
        goto out;
    int64_t st = r->element[0]->integer;
    if (st == ST_NOT_INIT)
        rc = not_init(ranks[s], err);
    else if (st == ST_PIN_LIMIT)
        rc = pin_refused(r, ranks[s], max_ratio, total, limit, err);
    else if (st != ST_OK)
        rc = unexpected(ns->m, "the pin script", err);
    *total = rc ? *total : (uint64_t)rint_at(r, 1);
    *limit = rc ? *limit : (uint64_t)rint_at(r, 2);
    kvp__rreply_free(r);
    if (rc || nr == 1)
        goto out;
    if (!(others = ranks_but(ranks, nr, ranks[s], &k, err))) {
        rc = -ENOMEM;
        goto out;
    }
    struct pin_arg p = {.ranks = others};
    rc = ranks_batch(ns, others, k, SC_PIN, a.n, a.v, a.len, 4, pin_reply, &p, err);
    if (!rc &&
        p.refused) /* only when the ranks' pins differ (a pin racing a rank's first initialize) */
        rc = kvp__err_pin_limit(err, p.news, p.total, p.limit, max_ratio, p.rank, p.np);
out:
    args_free(&a);
    free(others);
    free(ranks);
    free(np);
    return rc;
}

/* The most of the reply's elements 1 and 2 over the ranks (unpin: released
 * and pinned keys; pinned: keys and references): every rank holds the
 * namespace's pins, a rank initialized after a pin lacks it. */
static int most_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct pin_arg *p = arg;
    (void)j;
    (void)err;
    if (r->element[0]->integer == ST_OK) {
        uint64_t x = (uint64_t)rint_at(r, 1), y = (uint64_t)rint_at(r, 2);
        p->most[0] = x > p->most[0] ? x : p->most[0];
        p->most[1] = y > p->most[1] ? y : p->most[1];
    }
    return 0;
}

static int rd_unpin(struct kvp_ns *pub, const struct kvp_str *keys, size_t n, uint64_t *released,
                    struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    uint32_t *ranks;
    size_t nr;
    struct pin_arg p = {0};
    int rc = list_ranks(ns->m, ns->ranks_key, &ranks, NULL, &nr, err);
    if (rc)
        return rc;
    struct args a;
    if (nr && (rc = args_init(&a, n, 0, err)) == 0) {
        arg_keys(&a, keys, n);
        rc = ranks_batch(ns, ranks, nr, SC_UNPIN, a.n, a.v, a.len, 3, most_reply, &p, err);
        args_free(&a);
    }
    free(ranks);
    *released = p.most[0];
    return rc;
}

static int rd_pinned(struct kvp_ns *pub, int64_t rank, uint64_t *keys, uint64_t *refs,
                     struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    struct pin_arg p = {0};
    int rc;
    if (rank >= 0) { /* the pins of the keys the rank holds */
        uint32_t one = (uint32_t)rank;
        const char *arg = "1";
        size_t len = 1;
        redisReply *r;
        if ((rc = run_rank(ns, one, SC_PINNED, 1, 1, &arg, &len, 3, &r, err)) != 0)
            return rc;
        if (r->element[0]->integer == ST_NOT_INIT)
            rc = not_init(one, err);
        else
            most_reply(&p, 0, r, err);
        kvp__rreply_free(r);
    } else { /* every rank holds the namespace's pins: the most any holds */
        uint32_t *ranks;
        size_t nr;
        if ((rc = list_ranks(ns->m, ns->ranks_key, &ranks, NULL, &nr, err)) != 0)
            return rc;
        const char *arg = "0";
        size_t len = 1;
        rc = ranks_batch(ns, ranks, nr, SC_PINNED, 1, &arg, &len, 3, most_reply, &p, err);
        free(ranks);
    }
    if (keys)
        *keys = p.most[0];
    if (refs)
        *refs = p.most[1];
    return rc;
}

/* ---------------------------------------------------------------- the query by block hashes */

struct hashes_arg {
    struct rmeta *m;
    const uint32_t *ranks;
    size_t n, nranks;
    uint8_t *out;
};

static int hashes_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct hashes_arg *h = arg;
    if (r->element[0]->integer == ST_NOT_INIT)
        return not_init(h->ranks[j], err);
    const redisReply *s = r->element[1];
    if (r->element[0]->integer != ST_OK || s->type != REDIS_REPLY_STRING || s->len != h->n)
        return unexpected(h->m, "the block hash script", err);
    for (size_t i = 0; i < h->n; i++)
        h->out[i * h->nranks + j] = s->str[i] == '1';
    return 0;
}

/* Each rank's hx (redis_lua.h) maps the block hashes of the keys it holds to
 * them, kept by confirm, delete, eviction and clear: one HMGET per rank,
 * every rank in one round trip. */
static int rd_exists_hashes(struct kvp_ns *pub, const uint64_t *hashes, size_t n, int form,
                            const uint32_t *ranks, size_t nranks, uint8_t *out,
                            struct kvp_error *err)
{
    struct rns *ns = (struct rns *)pub;
    char(*fields)[18] = malloc((n ? n : 1) * sizeof *fields);
    struct args a;
    int rc = fields ? args_init(&a, n, 0, err) : kvp__err_oom(err, -ENOMEM);
    if (rc) {
        free(fields);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(fields[i], sizeof fields[i], "%c%016llx", form == KVP_HASH_VLLM ? 'v' : 's',
                 (unsigned long long)hashes[i]);
        arg_str(&a, fields[i], 17);
    }
    memset(out, 0, n * nranks);
    struct hashes_arg h = {ns->m, ranks, n, nranks, out};
    rc = ranks_batch(ns, ranks, nranks, SC_HASHES, a.n, a.v, a.len, 2, hashes_reply, &h, err);
    args_free(&a);
    free(fields);
    return rc;
}

static size_t rd_nranks(struct kvp_ns *pub)
{
    struct rns *ns = (struct rns *)pub;
    const char *argv[2] = {"HLEN", ns->ranks_key};
    size_t lens[2] = {4, strlen(ns->ranks_key)};
    redisReply *r;
    if (kvp__rconn_cmd(ns->m->c, key_slot(ns->ranks_key), NULL, 1, 2, argv, lens, &r, NULL))
        return 0; /* the interface has no error here */
    size_t n = r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? (size_t)r->integer : 0;
    kvp__rreply_free(r);
    return n;
}

/* ---------------------------------------------------------------- stats and checks */

/* The namespaces in creation order, as names DEP/HEXPOOL (a reply to free). */
static int list_namespaces(struct rmeta *m, redisReply **out, struct kvp_error *err)
{
    char list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
    nslist_keys(m, list, seq, sizeof list);
    const char *argv[4] = {"ZRANGE", list, "0", "-1"};
    size_t lens[4] = {6, strlen(list), 1, 2};
    int rc = kvp__rconn_cmd(m->c, key_slot(list), NULL, 1, 4, argv, lens, out, err);
    if (rc)
        return rc;
    if ((*out)->type != REDIS_REPLY_ARRAY) {
        kvp__rreply_free(*out);
        return unexpected(m, "ZRANGE", err);
    }
    return 0;
}

/* The handle of a listed namespace (created in the cache when missing). */
static struct rns *ns_of_name(struct rmeta *m, const char *name, size_t len)
{
    const char *slash = memchr(name, '/', len);
    if (!slash || (len - (size_t)(slash - name) - 1) % 2)
        return NULL;
    size_t dl = (size_t)(slash - name), pl = (len - dl - 1) / 2;
    char *pool = malloc(pl ? pl : 1);
    if (!pool)
        return NULL;
    for (size_t i = 0; i < pl; i++) {
        int a = kvp__hex_value(slash[1 + 2 * i]), b = kvp__hex_value(slash[2 + 2 * i]);
        if (a < 0 || b < 0) {
            free(pool);
            return NULL;
        }
        pool[i] = (char)(a * 16 + b);
    }
    struct kvp_ns *out = NULL;
    struct kvp_error e = {0};
    if (!kvp_deployment_valid(name, dl) || !kvp_pool_valid(pool, pl) ||
        rd_ns(m->front, name, dl, pool, pl, 0, &out, NULL, &e) != 0)
        out = NULL;
    free(pool);
    return (struct rns *)out;
}

struct stats_arg {
    const uint32_t *ranks;
    struct kvp_rank_stats *st;
    size_t k;
};

static int stats_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct stats_arg *a = arg;
    (void)err;
    if (r->element[0]->integer != ST_OK)
        return 0; /* listed but gone meanwhile */
    struct kvp_rank_stats *s = &a->st[a->k++];
    uint64_t v[10];
    for (size_t x = 0; x < 10; x++) {
        int64_t y = rint_at(r, 1 + x);
        v[x] = y > 0 ? (uint64_t)y : 0;
    }
    s->rank = a->ranks[j];
    s->num_pages = v[0];
    s->free = v[1];
    s->reserved = v[2];
    s->held = s->keys = v[3];
    s->hits = v[4];
    s->misses = v[5];
    s->allocations = v[6];
    s->evictions = v[7];
    s->expired_reservations = v[8];
    s->release_of_held_page = v[9];
    return 0;
}

/* Calls fn with each listed namespace (names that are not one skipped) and
 * its ranks, ascending; stops at a failure to list them or at fn's non-zero
 * return, which it returns. */
typedef int (*ns_ranks_fn)(void *arg, struct rns *ns, const uint32_t *ranks, size_t nr);

static int each_ns_ranks(struct rmeta *m, ns_ranks_fn fn, void *arg)
{
    redisReply *names;
    int rc = list_namespaces(m, &names, NULL);
    if (rc)
        return rc;
    for (size_t i = 0; i < names->elements && !rc; i++) {
        const redisReply *nm = names->element[i];
        struct rns *ns = nm->type == REDIS_REPLY_STRING ? ns_of_name(m, nm->str, nm->len) : NULL;
        if (!ns)
            continue;
        uint32_t *ranks;
        size_t nr;
        if ((rc = list_ranks(m, ns->ranks_key, &ranks, NULL, &nr, NULL)) != 0)
            break;
        rc = fn(arg, ns, ranks, nr);
        free(ranks);
    }
    kvp__rreply_free(names);
    return rc;
}

struct stats_each {
    kvp_meta_stats_fn fn;
    void *arg;
};

static int stats_ns(void *arg, struct rns *ns, const uint32_t *ranks, size_t nr)
{
    struct stats_each *e = arg;
    struct stats_arg a = {ranks, calloc(nr ? nr : 1, sizeof *a.st), 0};
    int rc = 0;
    if (!a.st)
        rc = -ENOMEM;
    else if (nr)
        rc = ranks_batch(ns, ranks, nr, SC_STATS, 0, NULL, NULL, 11, stats_reply, &a, NULL);
    if (!rc)
        rc = e->fn(ns->dep, ns->pool, a.st, a.k, e->arg);
    free(a.st);
    return rc;
}

/* Each rank's figures are one script's (consistent); a namespace's ranks are
 * asked together, not atomically. */
static int rd_stats(struct kvp_meta *front, kvp_meta_stats_fn fn, void *arg)
{
    struct stats_each e = {fn, arg};
    return each_ns_ranks(front->be, stats_ns, &e);
}

struct check_arg {
    struct rns *ns;
    const uint32_t *ranks, *np;
};

static int check_reply(void *arg, size_t j, redisReply *r, struct kvp_error *err)
{
    struct check_arg *a = arg;
    struct rns *ns = a->ns;
    int64_t st = r->element[0]->integer;
    if (st == ST_NOT_INIT) {
        set_err(err, -EUCLEAN, KVP_RULE_NONE, -1, 0, 0,
                "namespace %s/%s rank %u: listed but not initialized", ns->dep, ns->pool,
                a->ranks[j]);
        return -EUCLEAN;
    }
    if (st == ST_BROKEN) {
        const redisReply *w = r->elements > 1 ? r->element[1] : NULL;
        int ok = w && w->type == REDIS_REPLY_STRING;
        set_err(err, -EUCLEAN, KVP_RULE_NONE, -1, 0, 0, "namespace %s/%s rank %u: %.*s", ns->dep,
                ns->pool, a->ranks[j], ok ? (int)w->len : 0, ok ? w->str : "");
        return -EUCLEAN;
    }
    if (st != ST_OK || rint_at(r, 1) != a->np[j]) {
        set_err(err, -EUCLEAN, KVP_RULE_NONE, -1, 0, 0,
                "namespace %s/%s rank %u: listed with %u pages but has %lld", ns->dep, ns->pool,
                a->ranks[j], a->np[j], (long long)rint_at(r, 1));
        return -EUCLEAN;
    }
    return 0;
}

/* The invariants of each rank, each checked by one script (atomic); the
 * namespaces and their rank lists are read first, not atomically with them. */
static int rd_check(struct kvp_meta *front, struct kvp_error *err)
{
    struct rmeta *m = front->be;
    redisReply *names;
    int rc = list_namespaces(m, &names, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < names->elements && !rc; i++) {
        const redisReply *nm = names->element[i];
        struct rns *ns = nm->type == REDIS_REPLY_STRING ? ns_of_name(m, nm->str, nm->len) : NULL;
        if (!ns) {
            rc = -EUCLEAN;
            set_err(err, rc, KVP_RULE_NONE, -1, 0, 0, "namespace list has a bad name '%.*s'",
                    nm->type == REDIS_REPLY_STRING ? (int)(nm->len > 64 ? 64 : nm->len) : 0,
                    nm->type == REDIS_REPLY_STRING ? nm->str : "");
            break;
        }
        uint32_t *ranks, *np;
        size_t nr;
        if ((rc = list_ranks(m, ns->ranks_key, &ranks, &np, &nr, err)) != 0)
            break;
        struct check_arg a = {ns, ranks, np};
        if (nr)
            rc = ranks_batch(ns, ranks, nr, SC_CHECK, 0, NULL, NULL, 2, check_reply, &a, err);
        free(ranks);
        free(np);
    }
    kvp__rreply_free(names);
    return rc;
}

/* ---------------------------------------------------------------- the backend */

static int rd_wait(struct kvp_meta *front, uint64_t ticket, struct kvp_error *err)
{
    (void)front;
    (void)ticket;
    (void)err;
    return 0; /* acknowledged by Redis means done: tickets stay 0 */
}

static int rd_when_durable(struct kvp_meta *front, uint64_t ticket, kvp_meta_durable_fn fn,
                           void *arg)
{
    (void)front;
    (void)ticket;
    (void)fn;
    (void)arg;
    return 1; /* durable already (as far as Redis is): fn is not called */
}

static int rd_values(struct kvp_meta *front, kvp_meta_value_fn fn, void *arg)
{
    struct rmeta *m = front->be;
    struct kvp__rconn_stats s;
    kvp__rconn_stats(m->c, &s);
    char how[160];
    int level = kvp__redis_durability(front, how, sizeof how);
    const struct kvp_meta_value v[] = {
        {"redis", "connects", "kvpage_redis_connects_total", "Connections opened to Redis nodes.",
         KVP_VALUE_COUNTER, 0, s.connects, NULL, NULL},
        {"redis", "failures", "kvpage_redis_failures_total",
         "Connections to Redis nodes that failed or were lost.", KVP_VALUE_COUNTER, 0, s.failures,
         NULL, NULL},
        {"redis", "redirects", "kvpage_redis_redirects_total",
         "MOVED and ASK redirections followed.", KVP_VALUE_COUNTER, 0, s.redirects, NULL, NULL},
        {"redis", "script_loads", "kvpage_redis_script_loads_total",
         "Scripts loaded into Redis nodes (SCRIPT LOAD).", KVP_VALUE_COUNTER, 0, s.script_loads,
         NULL, NULL},
        {"redis", "nodes", "kvpage_redis_nodes", "Redis nodes known (seeds and cluster nodes).",
         KVP_VALUE_GAUGE, 0, s.nodes, NULL, NULL},
        {"redis", "waits", "kvpage_redis_waits_total",
         "WAITs for replicas after changes (the location's wait=N).", KVP_VALUE_COUNTER, 0, s.waits,
         NULL, NULL},
        {"redis", "waits_short", "kvpage_redis_waits_short_total",
         "WAITs that saw fewer replicas than wait=N asks for (the change was refused with 503 "
         "although applied on the master).",
         KVP_VALUE_COUNTER, 0, s.wait_short, NULL, NULL},
        {"redis", "master_asks", "kvpage_redis_master_asks_total",
         "Questions to the sentinels for the master (redis-sentinel://).", KVP_VALUE_COUNTER, 0,
         s.master_asks, NULL, NULL},
        {"redis", "round_trips", "kvpage_redis_combined_round_trips_total",
         "Round trips to Redis that carried the commands of concurrent calls together.",
         KVP_VALUE_COUNTER, 0, s.batches, NULL, NULL},
        {"redis", "combined_commands", "kvpage_redis_combined_commands_total",
         "Commands sent in those round trips (divided by them: commands per round trip).",
         KVP_VALUE_COUNTER, 0, s.batched, NULL, NULL},
        {"redis", "master_switches", "kvpage_redis_master_switches_total",
         "Failovers followed: the sentinels named another master (redis-sentinel://).",
         KVP_VALUE_COUNTER, 0, s.switches, NULL, NULL},
        /* kvpage serve reads this one at start to warn (the binary links
         * only the public API, so not kvp__redis_durability). */
        {"redis", "durability", "kvpage_redis_durability",
         "What the Redis masters' persistence promises for an acknowledged change, the least of "
         "them: 3 appendfsync always (survives a restart), 2 everysec (up to about a second "
         "lost), 1 no AOF (everything since the last snapshot lost), 0 unknown.",
         KVP_VALUE_GAUGE, 0, (uint64_t)(level + 1), "settings", how},
        {"redis", "event_entries", "kvpage_redis_event_entries_total",
         "Entries read from the ranks' streams of changes (kvp_meta_watch: kvpage serve "
         "--kv-events).",
         KVP_VALUE_COUNTER, 0, atomic_load(&m->ev_read), NULL, NULL},
        {"redis", "event_gaps", "kvpage_redis_event_gaps_total",
         "Reads of a rank's stream of changes that found it trimmed past the last change read: "
         "changes lost to the KV events (the stream keeps about the location's events_max "
         "entries, 2000 by default).",
         KVP_VALUE_COUNTER, 0, atomic_load(&m->ev_gaps), NULL, NULL},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int rc = fn(&v[i], arg);
        if (rc)
            return rc;
    }
    return 0;
}

static int rd_health(struct kvp_meta *front, int *scope, char *why, size_t len)
{
    struct rmeta *m = front->be;
    *scope = KVP_HEALTH_ALL; /* every call needs Redis */
    return kvp__rconn_ping(m->c, why, len);
}

/* What a durability level of kvp__redis_durability means. */
static const char *durability_meaning(int level)
{
    return level == 2   ? "acknowledged changes survive a restart of Redis"
           : level == 1 ? "up to about a second of acknowledged changes may be lost"
           : level == 0 ? "changes since the last RDB save may be lost"
                        : "what a restart of Redis loses is unknown";
}

static int rd_describe(struct kvp_meta *front, char *buf, size_t len)
{
    struct rmeta *m = front->be;
    char d[160];
    int level = kvp__redis_durability(front, d, sizeof d);
    char w[96] = "";
    if (m->wait_replicas)
        snprintf(w, sizeof w, "; each change waits for %d replica(s), at most %u ms",
                 m->wait_replicas, m->wait_ms);
    return snprintf(buf, len, "Redis %s db %d, prefix %s (%s: %s%s)", m->loc, m->db, m->prefix, d,
                    durability_meaning(level), w);
}

static int rd_snapshot(struct kvp_meta *front)
{
    (void)front;
    return -EOPNOTSUPP; /* Redis writes its own RDB and AOF */
}

struct dur {
    int level;
    char text[160];
    int nodes;
};

static const char *pair_value(const redisReply *r, const char *name)
{
    for (size_t i = 0; i + 1 < r->elements; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING && !strcmp(r->element[i]->str, name) &&
            r->element[i + 1]->type == REDIS_REPLY_STRING)
            return r->element[i + 1]->str;
    return NULL;
}

static int dur_one(void *arg, const char *node, redisReply *reply, int rc,
                   const struct kvp_error *err)
{
    struct dur *d = arg;
    int level = -1;
    char text[160];
    const char *ao = NULL, *fs = NULL;
    if (!rc && reply && reply->type == REDIS_REPLY_ARRAY) {
        ao = pair_value(reply, "appendonly");
        fs = pair_value(reply, "appendfsync");
    }
    if (ao && fs) {
        if (strcmp(ao, "yes") || !strcmp(fs, "no"))
            level = 0;
        else if (!strcmp(fs, "always"))
            level = 2;
        else if (!strcmp(fs, "everysec"))
            level = 1;
        snprintf(text, sizeof text, "appendonly %.8s, appendfsync %.12s", ao, fs);
    } else {
        snprintf(text, sizeof text, "unknown (%.120s)",
                 rc ? err->msg : "CONFIG GET is not available");
    }
    if (d->nodes++ == 0 || level < d->level) {
        d->level = level;
        snprintf(d->text, sizeof d->text, "%s", text);
        if (d->nodes > 1)
            snprintf(d->text + strlen(d->text), sizeof d->text - strlen(d->text), " on %s", node);
    }
    return 0;
}

int kvp__redis_durability(struct kvp_meta *front, char *buf, size_t len)
{
    if (!front || (front->ops != &kvp__redis_ops && front->ops != &kvp__redis_sentinel_ops) ||
        !front->be)
        return -EINVAL;
    struct rmeta *m = front->be;
    struct dur d = {-1, "", 0};
    const char *argv[3] = {"CONFIG", "GET", "append*"};
    kvp__rconn_each_master(m->c, 3, argv, dur_one, &d);
    if (buf && len)
        snprintf(buf, len, "%s", d.nodes ? d.text : "unknown");
    return d.level;
}

struct policy_arg {
    struct rmeta *m;
    struct kvp_meta *front;
};

/* An allkeys-* eviction policy lets Redis drop this store's keys at its
 * maxmemory, which breaks its invariants (pages lost, keys pointing at pages
 * that hold nothing): worth a warning. */
static int policy_one(void *arg, const char *node, redisReply *reply, int rc,
                      const struct kvp_error *err)
{
    struct policy_arg *a = arg;
    (void)err;
    const char *p = !rc && reply && reply->type == REDIS_REPLY_ARRAY
                        ? pair_value(reply, "maxmemory-policy")
                        : NULL;
    if (p && !strncmp(p, "allkeys-", 8)) {
        char line[256];
        snprintf(line, sizeof line,
                 "redis %s: maxmemory-policy %.32s may evict kvpage's keys and break its "
                 "state: use noeviction (or a volatile-* policy)",
                 node, p);
        a->front->opts.log(a->front->opts.log_arg, 1, line);
    }
    return 0;
}

/* ---------------------------------------------------------------- changes (KV events) */

/*
 * kvp_meta_watch and kvp_meta_inventory over Redis (kvpage serve
 * --kv-events). Every rank script that changes what a rank holds appends
 * its changes to the rank's stream, PREFIX:{DEP/HEXPOOL/RANK}:ev, in the
 * same script (redis_lua.h): the change and its record are one atomic step,
 * whichever process made it. A watcher is a thread of its own (the tail)
 * that reads every rank's stream from where it left, through the
 * connection layer (so a Cluster's slots and a Sentinel's master are
 * followed), and tells fn of each change, then fn(NULL) after each entry
 * (one script call's changes). So every process that watches one state is
 * told of every change of it, once, in each rank's order. fn is called on
 * the tail's thread, never with a lock of a caller's.
 *
 * The tail learns the namespaces and their ranks from the namespace list
 * and each namespace's rank list, every EV_REFRESH_MS; a rank listed when
 * the watch began is read from its stream's end then ("from now on"), a
 * rank listed later from its stream's start (its changes are all after the
 * watch began); a rank no longer listed (dropped) is let go once its
 * stream has nothing more to read. Each entry's id is 1-N, N counting the
 * rank's entries from 0 (XADD 1-*, redis_lua.h), so the tail sees a gap at
 * once: the streams are trimmed to about events_max entries (2000), and a
 * tail that fell further behind than that finds its next entry's N beyond
 * the one after its last; it says so once in the log and counts it
 * (kvpage_redis_event_gaps_total).
 */

#define EV_READ_COUNT 512 /* entries per read of one stream */
#define EV_READ_COUNT_TEXT "512"
#define EV_REFRESH_MS 200 /* the namespaces and ranks read again */
#define EV_IDLE_MS 20     /* the longest pause between reads when nothing came */
#define EV_ID_MAX 48

struct evrank {
    struct rns *ns;
    uint32_t rank;
    int slot;
    int listed; /* in the last listing */
    char key[KEY_MAX];
    size_t klen;
    char after[EV_ID_MAX + 1]; /* "(" and the last entry's id read, or "-" */
};

/* A change's tokens, copied out of a reply (whose bytes are not aligned). */
struct tokbuf {
    uint32_t *v;
    size_t cap;
};

struct evtail {
    struct rmeta *m;
    kvp_meta_change_fn fn;
    void *arg;
    pthread_t thread;
    atomic_int stop;
    struct evrank *r;
    size_t n, cap;
    int logged_gap;
    struct tokbuf tok; /* a change's tokens (tokens_at) */
};

/* An entry id "MS-SEQ" as two numbers; 0 when it is not one. */
static int ev_id(const char *s, uint64_t *ms, uint64_t *seq)
{
    char *e;
    *ms = strtoull(s, &e, 10);
    if (*e != '-')
        return 0;
    *seq = strtoull(e + 1, &e, 10);
    return *e == 0;
}

static struct evrank *ev_known(struct evtail *t, const struct rns *ns, uint32_t rank)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->r[i].ns == ns && t->r[i].rank == rank)
            return &t->r[i];
    return NULL;
}

/* Adds a rank's stream, read from its end now (at_end) or its start. */
static void ev_add(struct evtail *t, struct rns *ns, uint32_t rank, int at_end)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        struct evrank *v = realloc(t->r, cap * sizeof *v);
        if (!v)
            return; /* read again at the next refresh */
        t->r = v;
        t->cap = cap;
    }
    struct evrank *e = &t->r[t->n];
    memset(e, 0, sizeof *e);
    e->ns = ns;
    e->rank = rank;
    e->listed = 1;
    struct rkeys k;
    rank_keys(ns, rank, &k);
    e->slot = k.slot;
    memcpy(e->key, k.k[EV_FIELD], k.len[EV_FIELD] + 1);
    e->klen = k.len[EV_FIELD];
    strcpy(e->after, "-");
    if (at_end) {
        const char *argv[6] = {"XREVRANGE", e->key, "+", "-", "COUNT", "1"};
        size_t lens[6] = {9, e->klen, 1, 1, 5, 1};
        redisReply *r;
        if (kvp__rconn_cmd(t->m->c, e->slot, NULL, 1, 6, argv, lens, &r, NULL))
            return; /* unreachable now: the next refresh tries again */
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
            r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2 &&
            r->element[0]->element[0]->type == REDIS_REPLY_STRING &&
            r->element[0]->element[0]->len < EV_ID_MAX)
            snprintf(e->after, sizeof e->after, "(%s", r->element[0]->element[0]->str);
        kvp__rreply_free(r);
    }
    t->n++;
}

struct ev_refresh_arg {
    struct evtail *t;
    int at_start;
};

static int ev_refresh_ns(void *arg, struct rns *ns, const uint32_t *ranks, size_t nr)
{
    struct ev_refresh_arg *a = arg;
    for (size_t j = 0; j < nr; j++) {
        struct evrank *e = ev_known(a->t, ns, ranks[j]);
        if (e)
            e->listed = 1;
        else
            ev_add(a->t, ns, ranks[j], a->at_start);
    }
    return atomic_load(&a->t->stop);
}

/* Reads the namespaces and their ranks; adds the streams not yet read and
 * notes those of ranks no longer listed (ev_poll lets them go). */
static void ev_refresh(struct evtail *t, int at_start)
{
    struct ev_refresh_arg a = {t, at_start};
    for (size_t i = 0; i < t->n; i++)
        t->r[i].listed = 0;
    if (each_ns_ranks(t->m, ev_refresh_ns, &a) != 0)
        for (size_t i = 0; i < t->n; i++)
            t->r[i].listed = 1; /* not known: kept */
}

static void ev_gap(struct evtail *t, const struct evrank *e)
{
    atomic_fetch_add(&t->m->ev_gaps, 1);
    if (t->logged_gap || !t->m->front->opts.log)
        return;
    t->logged_gap = 1;
    char line[KEY_MAX + 320];
    snprintf(line, sizeof line,
             "KV events: the stream %s was trimmed past the last change read from it: changes "
             "are lost (told as KVP_CHANGE_LOST: kvpage serve skips a sequence number and "
             "answers the replay from the inventory); said once, counted in "
             "kvpage_redis_event_gaps_total",
             e->key);
    t->m->front->opts.log(t->m->front->opts.log_arg, 1, line);
}

/* The value of an entry's field named by the one letter name, or NULL. */
static const redisReply *ev_field(const redisReply *f, char name)
{
    for (size_t j = 0; f->type == REDIS_REPLY_ARRAY && j + 1 < f->elements; j += 2) {
        const redisReply *k = f->element[j], *v = f->element[j + 1];
        if (k->type == REDIS_REPLY_STRING && k->len == 1 && k->str[0] == name &&
            v->type == REDIS_REPLY_STRING)
            return v;
    }
    return NULL;
}

/* The next key's parent from *pp ('p': the parents NUL-separated, aligned
 * with the keys; empty: none); *pp NULL: none known (or no more). */
static void ev_parent(struct kvp_meta_change *c, const char **pp, const char *end)
{
    c->parent = NULL;
    c->parent_len = 0;
    if (!*pp)
        return;
    const char *nul = memchr(*pp, 0, (size_t)(end - *pp));
    size_t len = (size_t)((nul ? nul : end) - *pp);
    if (len) {
        c->parent = *pp;
        c->parent_len = len;
    }
    *pp = nul ? nul + 1 : NULL;
}

static uint32_t le32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The next key's tokens from the len bytes at s, from *at (per key a
 * count, then the tokens, little-endian u32s: the stream's field 't', a
 * lin entry's start), copied to tb; none when s is NULL, malformed or
 * short (then *at goes to len: nothing more is read from s). */
static void tokens_at(struct tokbuf *tb, struct kvp_meta_change *c, const char *s, size_t len,
                      size_t *at)
{
    c->token_ids = NULL;
    c->ntokens = 0;
    if (!s || *at > len || len - *at < 4)
        return;
    const uint8_t *b = (const uint8_t *)s + *at;
    uint32_t nt = le32(b);
    if (nt > KVP_MAX_PAGE_TOKENS || (len - *at - 4) / 4 < nt) {
        *at = len; /* not ours to read: no more */
        return;
    }
    *at += 4 + 4 * (size_t)nt;
    if (!nt)
        return;
    if (nt > tb->cap) {
        uint32_t *v = realloc(tb->v, (size_t)nt * sizeof *v);
        if (!v)
            return; /* the key goes without its tokens */
        tb->v = v;
        tb->cap = nt;
    }
    for (uint32_t j = 0; j < nt; j++)
        tb->v[j] = le32(b + 4 + 4 * (size_t)j);
    c->token_ids = tb->v;
    c->ntokens = nt;
}

/* Tells fn of the entries of one read of stream e; the number of entries. */
static size_t ev_deliver(struct evtail *t, struct evrank *e, const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY)
        return 0;
    struct kvp_meta_change c = {.ns = &e->ns->pub,
                                .deployment = e->ns->dep,
                                .pool = e->ns->pool,
                                .rank = e->rank,
                                .size = sizeof c};
    size_t n = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *x = r->element[i];
        if (x->type != REDIS_REPLY_ARRAY || x->elements != 2 ||
            x->element[0]->type != REDIS_REPLY_STRING || x->element[0]->len >= EV_ID_MAX)
            continue;
        uint64_t ms, seq, lms, lseq;
        if (i == 0 && e->after[0] == '(' && ev_id(x->element[0]->str, &ms, &seq) &&
            ev_id(e->after + 1, &lms, &lseq) && ms == 1 && lms == 1 && seq > lseq + 1) {
            ev_gap(t, e); /* entries lseq+1 .. seq-1 were trimmed unread */
            c.kind = KVP_CHANGE_LOST;
            t->fn(&c, t->arg);
            t->fn(NULL, t->arg);
        }
        const redisReply *f = x->element[1];
        /* The parents ('p') and tokens ('t') of the keys stored, when the
         * confirmation had them. */
        const redisReply *pf = ev_field(f, 'p'), *tf = ev_field(f, 't');
        for (size_t j = 0; f->type == REDIS_REPLY_ARRAY && j + 1 < f->elements; j += 2) {
            const redisReply *k = f->element[j], *v = f->element[j + 1];
            if (k->type != REDIS_REPLY_STRING || k->len != 1 || v->type != REDIS_REPLY_STRING ||
                (k->str[0] != 's' && k->str[0] != 'r'))
                continue; /* a field of a later version */
            c.kind = k->str[0] == 's' ? KVP_CHANGE_STORED : KVP_CHANGE_REMOVED;
            int stored = c.kind == KVP_CHANGE_STORED;
            const char *pp = stored && pf ? pf->str : NULL, *pend = pf ? pf->str + pf->len : NULL;
            size_t tat = 0;
            for (const char *p = v->str, *end = v->str + v->len; p < end;) {
                const char *nul = memchr(p, 0, (size_t)(end - p));
                c.key = p;
                c.len = (size_t)((nul ? nul : end) - p);
                ev_parent(&c, &pp, pend);
                tokens_at(&t->tok, &c, stored && tf ? tf->str : NULL, tf ? tf->len : 0, &tat);
                t->fn(&c, t->arg); /* the keys, separated by NUL bytes */
                p += c.len + 1;
            }
        }
        t->fn(NULL, t->arg);
        snprintf(e->after, sizeof e->after, "(%s", x->element[0]->str);
        n++;
    }
    return n;
}

/* One read of every stream (pipelined per node): the entries delivered. */
static size_t ev_poll(struct evtail *t)
{
    struct kvp__rcmd *cmds = calloc(t->n ? t->n : 1, sizeof *cmds);
    const char **argv = malloc((6 * t->n + 1) * sizeof *argv);
    size_t *lens = malloc((6 * t->n + 1) * sizeof *lens);
    size_t got = 0;
    if (!cmds || !argv || !lens)
        goto out;
    for (size_t i = 0; i < t->n; i++) {
        struct evrank *e = &t->r[i];
        const char **v = argv + 6 * i;
        size_t *l = lens + 6 * i;
        cmds[i] = (struct kvp__rcmd){.slot = e->slot, .argc = 6, .argv = v, .lens = l};
        v[0] = "XRANGE", l[0] = 6;
        v[1] = e->key, l[1] = e->klen;
        v[2] = e->after, l[2] = strlen(e->after);
        v[3] = "+", l[3] = 1;
        v[4] = "COUNT", l[4] = 5;
        v[5] = EV_READ_COUNT_TEXT, l[5] = sizeof EV_READ_COUNT_TEXT - 1;
    }
    kvp__rconn_multi(t->m->c, cmds, t->n, NULL);
    size_t keep = 0;
    for (size_t i = 0; i < t->n; i++) {
        size_t k = cmds[i].rc ? 0 : ev_deliver(t, &t->r[i], cmds[i].reply);
        got += k;
        /* A rank found unlisted has nothing more once a read after that
         * finds nothing: a drop writes its removals before it unlists the
         * rank. Let go (a rank listed again is read from its start). */
        if (t->r[i].listed || k || cmds[i].rc)
            t->r[keep++] = t->r[i];
    }
    for (size_t i = 0; i < t->n; i++)
        if (cmds[i].reply)
            kvp__rreply_free(cmds[i].reply);
    t->n = keep;
out:
    free(cmds);
    free(argv);
    free(lens);
    atomic_fetch_add(&t->m->ev_read, got);
    return got;
}

static uint64_t ev_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *ev_main(void *arg)
{
    struct evtail *t = arg;
    uint64_t refreshed = ev_now_ms(); /* rd_watch read them */
    unsigned pause = 1;
    while (!atomic_load(&t->stop)) {
        uint64_t now = ev_now_ms();
        if (now - refreshed >= EV_REFRESH_MS) {
            size_t before = t->n;
            ev_refresh(t, 0);
            refreshed = now;
            if (t->n != before)
                pause = 1;
        }
        if (ev_poll(t)) {
            pause = 1;
            continue;
        }
        /* Nothing new: wait a little longer each time, up to EV_IDLE_MS. */
        struct timespec ts = {0, (long)pause * 1000000L};
        nanosleep(&ts, NULL);
        pause = pause * 2 > EV_IDLE_MS ? EV_IDLE_MS : pause * 2;
    }
    return NULL;
}

static void ev_stop(struct rmeta *m)
{
    struct evtail *t = m->tail;
    if (!t)
        return;
    atomic_store(&t->stop, 1);
    pthread_join(t->thread, NULL);
    free(t->r);
    free(t->tok.v);
    free(t);
    m->tail = NULL;
}

static int rd_watch(struct kvp_meta *front, kvp_meta_change_fn fn, void *arg)
{
    struct rmeta *m = front->be;
    ev_stop(m);
    if (!fn)
        return 0;
    struct evtail *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->m = m;
    t->fn = fn;
    t->arg = arg;
    /* The streams' ends are noted before this returns: changes made after
     * it are told, as by the in-process engine. */
    ev_refresh(t, 1);
    int rc = pthread_create(&t->thread, NULL, ev_main, t);
    if (rc) {
        free(t->r);
        free(t);
        return -rc;
    }
    m->tail = t;
    return 0;
}

/*
 * kvp_meta_inventory: every rank's key -> page map, read by HSCAN (a few
 * thousand keys per round trip, never one long script that would stall
 * Redis). Unlike in-process it is not each namespace at one moment, and
 * need not be: kvpage serve numbers an inventory with the last batch it
 * published before the inventory began, and
 *   - a key whose page stays while its rank is scanned is in it (HSCAN
 *     returns every field present from its start to its end);
 *   - every change made after the inventory began is in an entry of its
 *     rank's stream that the tail reads after that (it cannot read an entry
 *     before the entry is written), so it is published in a later batch; so
 *     is a change made before it that a tail behind reads after it began;
 *   - the tail tells each rank's changes in their order, so the last one of
 *     a key changed meanwhile is its state.
 * So the inventory and every batch after its number give the state, as the
 * in-process one does (src/server/kvevents.c, serve_replay).
 *
 * A held key's parent and tokens, where its confirmation named them, are in
 * the rank's lin hash (redis_lua.h), read by HMGET of the keys of each HSCAN
 * batch, INV_LIN_CHUNK at a time (a reply of at most that many pages'
 * tokens), and only on a rank that has one (one EXISTS a rank). A key
 * stored again between the two reads is told with its later parent; that
 * change is in the stream too, so the end state is the same.
 */
#define INV_LIN_CHUNK 256

struct inv_arg {
    struct rmeta *m;
    kvp_meta_change_fn fn;
    void *arg;
    struct tokbuf tok;
};

/* Whether the rank of k keeps parents or tokens (its lin hash exists). */
static int inv_has_lin(struct inv_arg *a, const struct rkeys *k, int *has)
{
    const char *argv[2] = {"EXISTS", k->k[LIN_FIELD]};
    size_t lens[2] = {6, k->len[LIN_FIELD]};
    redisReply *r;
    int rc = kvp__rconn_cmd(a->m->c, k->slot, NULL, 1, 2, argv, lens, &r, NULL);
    if (rc)
        return rc;
    *has = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    kvp__rreply_free(r);
    return 0;
}

/* Tells fn of the keys of one HSCAN batch (kv: key, page, ...), each with
 * what the rank's lin hash keeps of it when has_lin. */
static int inv_tell(struct inv_arg *a, const struct rkeys *k, int has_lin, const redisReply *kv,
                    struct kvp_meta_change *c)
{
    size_t nk = kv->elements / 2;
    for (size_t base = 0; base < nk; base += INV_LIN_CHUNK) {
        size_t cn = nk - base < INV_LIN_CHUNK ? nk - base : INV_LIN_CHUNK;
        redisReply *l = NULL;
        if (has_lin) {
            const char *argv[2 + INV_LIN_CHUNK] = {"HMGET", k->k[LIN_FIELD]};
            size_t lens[2 + INV_LIN_CHUNK] = {5, k->len[LIN_FIELD]};
            for (size_t j = 0; j < cn; j++) {
                const redisReply *f = kv->element[2 * (base + j)];
                int str = f->type == REDIS_REPLY_STRING;
                argv[2 + j] = str ? f->str : "", lens[2 + j] = str ? f->len : 0;
            }
            int rc = kvp__rconn_cmd(a->m->c, k->slot, NULL, 1, (int)(2 + cn), argv, lens, &l, NULL);
            if (rc)
                return rc;
            if (l->type != REDIS_REPLY_ARRAY || l->elements != cn) {
                kvp__rreply_free(l);
                return -EIO;
            }
        }
        for (size_t j = 0; j < cn; j++) {
            const redisReply *f = kv->element[2 * (base + j)], *v = l ? l->element[j] : NULL;
            if (f->type != REDIS_REPLY_STRING)
                continue;
            c->key = f->str;
            c->len = f->len;
            /* lin's value: the tokens (a count, then they), then the parent */
            int has = v && v->type == REDIS_REPLY_STRING;
            size_t at = 0;
            tokens_at(&a->tok, c, has ? v->str : NULL, has ? v->len : 0, &at);
            c->parent = has && at < v->len ? v->str + at : NULL;
            c->parent_len = c->parent ? v->len - at : 0;
            a->fn(c, a->arg);
        }
        if (l)
            kvp__rreply_free(l);
    }
    return 0;
}

static int inv_ns(void *arg, struct rns *ns, const uint32_t *ranks, size_t nr)
{
    struct inv_arg *a = arg;
    int rc = 0;
    for (size_t j = 0; j < nr && !rc; j++) {
        struct rkeys k;
        rank_keys(ns, ranks[j], &k);
        struct kvp_meta_change c = {.kind = KVP_CHANGE_STORED,
                                    .ns = &ns->pub,
                                    .deployment = ns->dep,
                                    .pool = ns->pool,
                                    .rank = ranks[j],
                                    .size = sizeof c};
        char cursor[32] = "0";
        int has_lin = 0;
        if ((rc = inv_has_lin(a, &k, &has_lin)) != 0)
            break;
        do {
            const char *argv[5] = {"HSCAN", k.k[K2P_FIELD], cursor, "COUNT", "2000"};
            size_t lens[5] = {5, k.len[K2P_FIELD], strlen(cursor), 5, 4};
            redisReply *r;
            if ((rc = kvp__rconn_cmd(a->m->c, k.slot, NULL, 1, 5, argv, lens, &r, NULL)) != 0)
                break;
            if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= 32 ||
                r->element[1]->type != REDIS_REPLY_ARRAY) {
                kvp__rreply_free(r);
                rc = -EIO;
                break;
            }
            memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
            rc = inv_tell(a, &k, has_lin, r->element[1], &c);
            kvp__rreply_free(r);
            if (rc)
                break;
        } while (strcmp(cursor, "0"));
    }
    return rc;
}

static int rd_inventory(struct kvp_meta *front, kvp_meta_change_fn fn, void *arg)
{
    struct inv_arg a = {front->be, fn, arg, {NULL, 0}};
    int rc = each_ns_ranks(front->be, inv_ns, &a);
    free(a.tok.v);
    return rc;
}

/* kvp_meta_counter: PREFIX:{PREFIX}:counter:NAME, set by a script (a compare
 * and set: two servers may share the name). */
static int rd_counter(struct kvp_meta *front, const char *name, uint64_t expect, uint64_t value,
                      uint64_t *now, struct kvp_error *err)
{
    struct rmeta *m = front->be;
    size_t kl = strlen(m->prefix) * 2 + strlen(name) + 16;
    char *key = malloc(kl), e[24], v[24];
    if (!key) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    snprintf(key, kl, "%s:{%s}:counter:%s", m->prefix, m->prefix, name);
    snprintf(e, sizeof e, "%llu", (unsigned long long)expect);
    snprintf(v, sizeof v, "%llu", (unsigned long long)value);
    const char *argv[6] = {"EVALSHA", "", "1", key, e, v};
    size_t lens[6] = {7, 0, 1, strlen(key), strlen(e), strlen(v)};
    redisReply *r;
    int rc =
        kvp__rconn_cmd(m->c, key_slot(key), &m->scripts[SC_COUNTER], 0, 6, argv, lens, &r, err);
    free(key);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_STRING)
        rc = unexpected(m, "the counter script", err);
    else if (now)
        *now = strtoull(r->str, NULL, 10);
    kvp__rreply_free(r);
    return rc;
}

/* A rank script's body with ?events_max='s length of its stream in place of
 * KVP_LUA_EVMAX (another script: another SHA). 0 or -ENOMEM. */
static int evmax_body(struct rmeta *m, int sc, long evmax)
{
    static const char pat[] = "'~', '" KVP_LUA_EVMAX "'";
    const char *b = script_body[sc], *at = strstr(b, pat);
    if (!at)
        return 0;
    size_t n = strlen(b) + 32;
    if (!(m->bodies[sc] = malloc(n)))
        return -ENOMEM;
    snprintf(m->bodies[sc], n, "%.*s'~', '%ld'%s", (int)(at - b), b, evmax, at + sizeof pat - 1);
    m->scripts[sc].body = m->bodies[sc];
    return 0;
}

static void rd_free_bodies(struct rmeta *m)
{
    for (int i = 0; i < SC_COUNT; i++)
        free(m->bodies[i]);
}

static void rd_close(struct kvp_meta *front)
{
    struct rmeta *m = front->be;
    if (!m)
        return;
    ev_stop(m);
    kvp__rconn_close(m->c);
    for (struct rns *ns = m->nss, *nx; ns; ns = nx) {
        nx = ns->next;
        ns_free(ns);
    }
    pthread_mutex_destroy(&m->lock);
    rd_free_bodies(m);
    free(m);
    front->be = NULL;
}

/* A location whose state is of another data model (an older kvpage's) is
 * refused at open, before any script could meet a key of the wrong type.
 * Reads only: a fresh prefix gets its format with its first namespace. */
static int check_format(struct rmeta *m, struct kvp_error *err)
{
    char fkey[MAX_PREFIX * 2 + 32], list[MAX_PREFIX * 2 + 32], seq[MAX_PREFIX * 2 + 32];
    format_key(m, fkey, sizeof fkey);
    nslist_keys(m, list, seq, sizeof list);
    /* One slot, one round trip: the format, and whether namespaces exist. */
    const char *get[2] = {"GET", fkey}, *ex[2] = {"EXISTS", list};
    size_t gl[2] = {3, strlen(fkey)}, el[2] = {6, strlen(list)};
    struct kvp__rcmd cmds[2] = {
        {.slot = key_slot(list), .argc = 2, .argv = get, .lens = gl},
        {.slot = key_slot(list), .argc = 2, .argv = ex, .lens = el},
    };
    int rc = kvp__rconn_multi(m->c, cmds, 2, err);
    char found[96] = "";
    int old = 0;
    if (!rc && cmds[0].reply->type == REDIS_REPLY_STRING)
        snprintf(found, sizeof found, "%.*s",
                 (int)(cmds[0].reply->len < 31 ? cmds[0].reply->len : 31), cmds[0].reply->str);
    if (!rc)
        old = cmds[1].reply->type == REDIS_REPLY_INTEGER && cmds[1].reply->integer > 0;
    for (int i = 0; i < 2; i++)
        if (cmds[i].reply)
            kvp__rreply_free(cmds[i].reply);
    if (rc)
        return rc;
    if (!strcmp(found, STORE_FORMAT) || (!found[0] && !old))
        return 0;
    if (!found[0]) /* written before the format was named */
        snprintf(found, sizeof found, "1 (no %.64s)", fkey);
    set_err(err, -EPROTO, KVP_RULE_NONE, -1, 0, 0, /* the state's, not the location's */
            "redis %.120s: prefix '%s' holds kvpage state of format %s, this kvpage reads format "
            "%s: use another ?prefix=, or delete the old state (redis-cli --scan --pattern "
            "'%s:*' | xargs redis-cli del)",
            m->loc, m->prefix, found, STORE_FORMAT, m->prefix);
    return -EPROTO;
}

/* The prefix's identity, read (never written: a fresh prefix has none until
 * its first namespace is registered, and is then asked again). Front's
 * identity is set once, under m->lock; a failed read leaves it unknown. */
static const char *rd_identity(struct kvp_meta *front)
{
    struct rmeta *m = front->be;
    pthread_mutex_lock(&m->lock);
    if (!front->identity) {
        char key[MAX_PREFIX * 2 + 32];
        identity_key(m, key, sizeof key);
        const char *get[2] = {"GET", key};
        size_t gl[2] = {3, strlen(key)};
        struct kvp__rcmd cmd = {.slot = key_slot(key), .argc = 2, .argv = get, .lens = gl};
        struct kvp_error err = {0};
        if (kvp__rconn_multi(m->c, &cmd, 1, &err) == 0 && cmd.reply &&
            cmd.reply->type == REDIS_REPLY_STRING &&
            kvp__identity_valid(cmd.reply->str, cmd.reply->len))
            front->identity = strndup(cmd.reply->str, KVP_IDENTITY_LEN);
        if (cmd.reply)
            kvp__rreply_free(cmd.reply);
    }
    pthread_mutex_unlock(&m->lock);
    return front->identity;
}

static int open_either(struct kvp_meta *front, const char *where, int sentinel,
                       struct kvp_error *err)
{
    struct rmeta *m = calloc(1, sizeof *m);
    if (!m) {
        kvp__err_oom(err, -ENOMEM);
        return -ENOMEM;
    }
    struct kvp__rcfg cfg;
    long evmax = 0;
    int rc = parse_url(where ? where : "", sentinel, &cfg, m->prefix, &evmax, err);
    if (rc) {
        free(m);
        return rc;
    }
    m->db = cfg.db;
    m->wait_replicas = cfg.wait_replicas;
    m->wait_ms = cfg.wait_ms;
    cfg.log = front->opts.log;
    cfg.log_arg = front->opts.log_arg;
    cfg.connect_timeout_ms = front->opts.connect_timeout_ms ? front->opts.connect_timeout_ms : 2000;
    cfg.timeout_ms = front->opts.timeout_ms ? front->opts.timeout_ms : 10000;
    /* For messages: the seeds, never the password. */
    size_t o = 0;
    if (sentinel)
        o = (size_t)snprintf(m->loc, sizeof m->loc, "master '%.64s' of sentinels ",
                             cfg.master_name);
    for (size_t i = 0; i < cfg.nseeds && o < sizeof m->loc; i++)
        o += (size_t)snprintf(m->loc + o, sizeof m->loc - o, "%s%s:%d", i ? "," : "", cfg.host[i],
                              cfg.port[i]);
    m->front = front;
    m->lease_ms = front->opts.lease_ms;
    m->grace_ms = front->opts.read_grace_ms;
    for (int i = 0; i < SC_COUNT; i++) {
        m->scripts[i].body = script_body[i];
        m->scripts[i].change = i == SC_INIT || i == SC_ALLOCATE || i == SC_CONFIRM ||
                               i == SC_DELETE || i == SC_CLEAR || i == SC_NS_CREATE ||
                               i == SC_COUNTER;
    }
    pthread_mutex_init(&m->lock, NULL);
    if ((rc = kvp__rconn_open(&m->c, &cfg, err)) != 0) {
        pthread_mutex_destroy(&m->lock);
        free(m);
        return rc;
    }
    for (int i = 0; evmax && !rc && i < SC_COUNT; i++)
        if ((rc = evmax_body(m, i, evmax)) != 0)
            kvp__err_oom(err, rc);
    if (rc || (rc = check_format(m, err)) != 0) {
        kvp__rconn_close(m->c);
        pthread_mutex_destroy(&m->lock);
        rd_free_bodies(m);
        free(m);
        return rc;
    }
    front->be = m;
    /* What Redis promises for acknowledged changes, once at open, for the
     * log, as information: whether it is enough depends on what the caller
     * asks (kvpage serve warns against its --fsync). */
    if (front->opts.log) {
        char d[160], line[512];
        int level = kvp__redis_durability(front, d, sizeof d);
        snprintf(line, sizeof line, "redis %s: %s (%s)", m->loc, d, durability_meaning(level));
        front->opts.log(front->opts.log_arg, 2, line);
        const char *argv[3] = {"CONFIG", "GET", "maxmemory-policy"};
        struct policy_arg pa = {m, front};
        kvp__rconn_each_master(m->c, 3, argv, policy_one, &pa);
    }
    return 0;
}

static int rd_open(struct kvp_meta *front, const char *where, struct kvp_error *err)
{
    return open_either(front, where, 0, err);
}

static int rd_open_sentinel(struct kvp_meta *front, const char *where, struct kvp_error *err)
{
    return open_either(front, where, 1, err);
}

/* What an acknowledged change promises: Redis's AOF settings. */
static void rd_info(struct kvp_meta *front, struct kvp_meta_info *out)
{
    out->durability_wanted = "appendonly yes and appendfsync always";
    out->durability_source = "CONFIG GET";
    if (!front)
        return;
    int level = kvp__redis_durability(front, out->durability_text, sizeof out->durability_text);
    out->durability = level;
    out->durability_meaning = durability_meaning(level);
    out->durability_loss = level == 1   ? "up to about a second of changes"
                           : level == 0 ? "everything since its last snapshot"
                                        : NULL;
}

static const struct kvp__meta_scheme rd_schemes[] = {
    {"redis",
     "redis://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/DB][?prefix=NAME&wait=N&wait_ms=T]: "
     "the state in a Redis server or Redis Cluster, shared by every process that opens it",
     0},
    {"rediss", "metadata location scheme 'rediss:' (Redis over TLS) is not implemented yet",
     KVP__SCHEME_REFUSED | KVP__SCHEME_KNOWN},
    {NULL, NULL, 0},
};

static const struct kvp__meta_scheme rd_sentinel_schemes[] = {
    {"redis-sentinel",
     "redis-sentinel://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?...]: as redis://, "
     "its master named by Redis Sentinel",
     0},
    {NULL, NULL, 0},
};

#define RD_OPS                                                                                     \
    .close = rd_close, .ns = rd_ns, .init_rank = rd_init_rank, .allocate = rd_allocate,            \
    .allocate_ordered = rd_allocate_ordered, .confirm = rd_confirm, .exists = rd_exists,           \
    .lookup = rd_lookup, .del = rd_delete, .clear = rd_clear, .drop = rd_drop,                     \
    .nranks = rd_nranks, .stats = rd_stats, .check = rd_check, .wait = rd_wait,                    \
    .when_durable = rd_when_durable, .values = rd_values, .health = rd_health,                     \
    .snapshot = rd_snapshot, .describe = rd_describe, .identity = rd_identity, .remote = 1,        \
    .holder = "Redis", .values_section = "redis", .info = rd_info, .pin = rd_pin,                  \
    .unpin = rd_unpin, .pinned = rd_pinned, .exists_hashes = rd_exists_hashes, .watch = rd_watch,  \
    .inventory = rd_inventory, .counter = rd_counter, .confirm_ex = rd_confirm_ex

/* The same backend, its master named by sentinels. */
const struct kvp__meta_ops kvp__redis_sentinel_ops = {
    .name = "redis-sentinel",
    .schemes = rd_sentinel_schemes,
    .open = rd_open_sentinel,
    RD_OPS,
};

const struct kvp__meta_ops kvp__redis_ops = {
    .name = "redis",
    .schemes = rd_schemes,
    .open = rd_open,
    RD_OPS,
};
