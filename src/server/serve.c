/*
 * kvpage serve: flags, the libmicrohttpd daemon, signals. Everything about
 * the protocol is in kvp__server_handle (handle.c); this file only moves
 * bytes between sockets and it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "server/serve.h"
#include "server/server.h"
#include "util/clock.h"
#include "util/dirs.h"
#include "util/size.h"
#include "server/kvevents.h"
#include "server/log.h"

/* A client address as the per-client connection limit counts it (an
 * IPv4-mapped IPv6 address counts as its IPv4 address). */
struct client_key {
    uint8_t addr[16];
    uint8_t len; /* 4 or 16; 0: not counted (no address) */
};

/* Per-connection state: the request body being received and the reply with
 * its scratch space, both reused by every request of the connection. */
struct conn {
    struct kvp_buf in;
    struct kvp_reply rep;
    int too_large;
    int memory_full; /* the body was dropped: over --max-body-memory */
    size_t held;     /* bytes of --max-body-memory this request's body holds */
    /* A refused body is read and dropped, up to discard_max bytes in all and
     * until drop_until_ms, so that the client reads the reply. */
    uint64_t body_seen;     /* bytes of this request's body received */
    uint64_t drop_until_ms; /* 0: no body being dropped */
    /* Group commit: a reply that changed state waits, with the connection
     * suspended, until the log is durable up to the request's records. */
    struct MHD_Connection *mc;
    atomic_int durable; /* 1 once the log callback ran for the pending reply */
    int durable_rc;     /* its status: 0, or -EIO (the change is not acknowledged) */
    int waiting;        /* a reply is parked until durable (or until the body worker is done) */
    /* Limits and timeouts. */
    struct client_key key; /* the client's address, counted in the per-client table */
    int in_request;        /* the request line came and its reply is not sent yet */
    int timed_out;         /* MHD reported the request's timeout (counted) */
    uint64_t last_ms;      /* last progress the callbacks saw */
    /* A large body is handled by the body worker, off the event loop. */
    struct kvp_request req;
    struct conn *job_next;
};

/*
 * jansson allocates two blocks per string and frees them all at the end of
 * the request: with 1,024-key bodies malloc/free were a quarter of the CPU.
 * While a request is handled, its thread's jansson blocks come from a bump
 * arena that is reset afterwards; frees of arena blocks do nothing. Blocks
 * outside a request, or beyond the arena, are plain malloc. Every jansson
 * value of a request is created and released by the thread handling it
 * (kvp__server_handle releases the body before returning), so a block is
 * never freed by another thread. Not under AddressSanitizer, which must see
 * every block.
 */
#if defined(__SANITIZE_ADDRESS__)
#define KVP_JSON_ARENA 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVP_JSON_ARENA 0
#endif
#endif
#ifndef KVP_JSON_ARENA
#define KVP_JSON_ARENA 1
#endif

#define ARENA_MIN ((size_t)1 << 20)
#define ARENA_MAX ((size_t)32 << 20)

struct arena {
    char *base;
    size_t used, cap;
    size_t want; /* bytes the last request asked for, arena or not */
    int active;
    int spilled; /* a block of this request came from malloc */
};
static _Thread_local struct arena t_arena;

static void *arena_malloc(size_t n)
{
    struct arena *a = &t_arena;
    if (a->active) {
        size_t need = (n + 15) & ~(size_t)15;
        a->want += need;
        if (need >= n && a->cap - a->used >= need) {
            void *p = a->base + a->used;
            a->used += need;
            return p;
        }
        a->spilled = 1;
    }
    return malloc(n);
}

/* Every JSON block of the request in progress is in the arena: releasing
 * them one by one would only walk the values (the reset reclaims them). */
static int arena_holds_all(void)
{
    return t_arena.active && !t_arena.spilled;
}

static void arena_free(void *p)
{
    struct arena *a = &t_arena;
    if (p && a->base && (char *)p >= a->base && (char *)p < a->base + a->cap)
        return;
    free(p);
}

static void arena_begin(void)
{
    struct arena *a = &t_arena;
    if (!KVP_JSON_ARENA)
        return;
    /* Grow to what the last request needed (bounded), between requests only. */
    size_t cap = a->cap ? a->cap : ARENA_MIN;
    while (cap < a->want && cap < ARENA_MAX)
        cap *= 2;
    if (cap != a->cap) {
        char *nb = malloc(cap);
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = cap;
        }
    }
    a->used = 0;
    a->want = 0;
    a->spilled = 0;
    a->active = a->base != NULL;
}

static void arena_end(void)
{
    t_arena.active = 0;
    t_arena.used = 0;
}

/* Replies parked on the log's flusher; shutdown waits for them to drain. */
static atomic_long g_pending;
static atomic_int g_stopping;

/* Buffers above this are released after a request instead of being kept. */
#define KEEP_BUFFER_MAX ((size_t)4 << 20)

/* Bodies larger than this are parsed and handled by the body worker, so that
 * the event loop goes on serving everyone else meanwhile (a 64 MiB body
 * takes the guard about 0.1 s, a valid 1,000,000-key request longer). */
#define WORKER_BODY_MIN ((size_t)1 << 20)

/*
 * A body that is refused (over --max-body or --max-body-memory) is still
 * read, and dropped, before the reply: a client such as Python's
 * http.client sends its whole body before it reads, and a reply sent (and
 * the connection closed) while it sends makes its kernel reset the
 * connection before it reads the reply. The reading is bounded as nginx's
 * lingering close is: at most DROP_SECONDS, and at most --max-body plus the
 * larger of --max-body and DROP_EXTRA_MIN in all (discard_max). Past
 * either, or for a Content-Length past the bytes, the server answers at once
 * and closes the connection, and the client may see a reset.
 */
#define DROP_SECONDS 10
#define DROP_EXTRA_MIN ((uint64_t)64 << 20)

/* The per-client connection counts: a chained hash table under one lock
 * (taken once per accept and once per close). */
#define CLIENT_BUCKETS 1024
struct client_count {
    struct client_key key;
    unsigned n;
    struct client_count *next;
};

struct serve {
    struct kvp_server srv;
    struct kvp_meta *meta;
    size_t max_body;
    uint64_t discard_max; /* the most bytes of a refused body read (see DROP_SECONDS) */
    int group_commit;     /* --fsync batch: replies wait for the flusher, parked */
    unsigned idle_timeout, request_timeout; /* seconds; 0: none */
    uint64_t max_conns, max_conns_per_client;
    size_t max_body_memory;
    atomic_size_t body_memory; /* held by the bodies over 1 MiB in flight */
    pthread_mutex_t clients_lock;
    struct client_count *clients[CLIENT_BUCKETS];
    /* The body worker's queue of suspended connections. */
    pthread_t worker;
    int worker_running, worker_stop;
    pthread_mutex_t jobs_lock;
    pthread_cond_t jobs_cond;
    struct conn *jobs_head, *jobs_tail;
    /* The acceptor (with more than one MHD thread, see acceptor_main). */
    struct MHD_Daemon *d;
    int listen_fd, accept_stop; /* accept_stop: an eventfd, -1 without an acceptor */
    pthread_t acceptor;
};

/*
 * systemd's readiness protocol (sd_notify(3), Type=notify): one datagram to
 * the socket named by $NOTIFY_SOCKET, a path or '@' for an abstract name.
 * Without the variable (not run by systemd) it does nothing.
 */
static void notify_systemd(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = path ? strlen(path) : 0;
    if (len < 2 || len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
        return;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
        KVP_LOGW("cannot notify systemd at %s: %s", path, strerror(errno));
    close(fd);
}

struct remote_durability {
    int level; /* as the value kvpage_redis_durability: 3 always ... 0 unknown; -1 absent */
    char how[160];
};

static int find_durability(const struct kvp_meta_value *v, void *arg)
{
    struct remote_durability *d = arg;
    if (strcmp(v->key, "durability") != 0) /* a remote backend's promise, whatever its name */
        return 0;
    d->level = (int)v->value;
    snprintf(d->how, sizeof d->how, "%s", v->label_value ? v->label_value : "");
    return 1;
}

/* loc as messages show it: a password in it ("redis://USER:PASS@...")
 * becomes "***". */
static void show_location(const char *loc, char *out, size_t len)
{
    const char *auth = strstr(loc, "://");
    auth = auth ? auth + 3 : loc;
    size_t end = strcspn(auth, "/?");
    const char *at = NULL;
    for (const char *p = auth; p < auth + end; p++)
        if (*p == '@')
            at = p;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon)
        snprintf(out, len, "%s", loc);
    else
        snprintf(out, len, "%.*s:***%s", (int)(colon - loc), loc, at);
}

/*
 * Opens the state. A redis:// location that cannot be reached yet (Redis
 * starting with the server, a failover) is retried for up to 30 s before
 * the server gives up; once running, the backend reconnects by itself.
 */
static int open_meta(const char *loc, const char *shown, const struct kvp_meta_opts *mo,
                     struct kvp_meta **meta, struct kvp_error *err)
{
    int remote = loc && strncmp(loc, "mem:", 4) != 0; /* --meta: any remote location */
    uint64_t give_up = kvp__mono_ns() + UINT64_C(30000000000), said = 0;
    for (;;) {
        memset(err, 0, sizeof *err);
        int rc = kvp_meta_open_at(loc, mo, meta, err);
        if (rc == 0 || !remote || err->rule != KVP_RULE_UNAVAILABLE || kvp__mono_ns() > give_up)
            return rc;
        if (kvp__mono_ns() >= said) {
            KVP_LOGW("cannot reach %s yet (%s); retrying for up to 30 s", shown, err->msg);
            said = kvp__mono_ns() + UINT64_C(5000000000);
        }
        struct timespec nap = {0, 250 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* Says what Redis promises against what --fsync asks (protocol-notes:
 * "Durability with Redis"). */
static void durability_warning(struct kvp_meta *meta, const char *loc, int fsync_mode)
{
    struct remote_durability d = {-1, ""};
    kvp_meta_values(meta, find_durability, &d);
    int level = d.level - 1; /* 2 always, 1 everysec, 0 no AOF, -1 unknown */
    const char *how = d.how;
    if (fsync_mode == KVP_FSYNC_NEVER)
        return;
    if (level == -1)
        KVP_LOGW("cannot read the persistence settings of %s (CONFIG GET refused): whether an "
                 "acknowledged change survives a restart of Redis is unknown; --fsync %s asks "
                 "for appendonly yes and appendfsync always",
                 loc, fsync_mode == KVP_FSYNC_ALWAYS ? "always" : "batch");
    else if (level < 2)
        KVP_LOGW("%s has %s: an acknowledged change can be lost when Redis restarts (%s); "
                 "--fsync %s asks for appendonly yes and appendfsync always",
                 loc, how,
                 level == 1 ? "up to about a second of changes"
                            : "everything since its last snapshot",
                 fsync_mode == KVP_FSYNC_ALWAYS ? "always" : "batch");
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
            "  --meta LOCATION        keep the state in Redis instead, shared by every server\n"
            "                         given the same LOCATION: redis://[USER[:PASS]@]HOST:PORT\n"
            "                         [/DB][?prefix=NAME], redis://H1:P1,H2:P2,... for a\n"
            "                         Redis Cluster, redis-sentinel://S1:P1,S2:P2/MASTER[/DB]\n"
            "                         for a master that Sentinel fails over; ?wait=N[&wait_ms=T]\n"
            "                         acknowledges a change once N replicas have it (password\n"
            "                         also from $KVPAGE_REDIS_PASSWORD)\n"
            "  --fsync MODE           always, batch (default: group commit) or never\n"
            "  --snapshot-bytes N     write a snapshot once the log has grown by N bytes, or\n"
            "                         by the last snapshot's size if larger (default 64M)\n"
            "  --kv-events FIELDS     publish every page stored and removed as vLLM's KV events\n"
            "                         (ZeroMQ, msgpack): endpoint=tcp://*:5557 (default),\n"
            "                         replay_endpoint=, topic=, buffer_steps=10000, hwm=100000,\n"
            "                         max_queue_size=100000, medium=STORAGE|EXTERNAL|DISK,\n"
            "                         format=map|array, block_size=16,\n"
            "                         hash=auto|sglang|vllm|xxh3 (not with --meta yet)\n"
            "  --log-level LEVEL      error, warn, info (default) or debug\n"
            "  --log-format FORMAT    text (default) or json: one JSON object per line\n"
            "  --help                 show this help\n"
            "examples:\n"
            "  kvpage serve --listen 0.0.0.0:18000 --data-dir /var/lib/kvpage --allow 10.0.0.0/8\n"
            "  kvpage serve --listen 0.0.0.0:18000 --meta redis://10.0.0.5:6379/0\n"
            "  KVPAGE_TOKEN=secret kvpage serve --data-dir none --threads 2\n"
            "more: man kvpage, and the README\n");
}

static int bad_value(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "kvpage serve: invalid value '%s' for %s: %s\n", value, flag, why);
    return 2;
}

struct listen_addr {
    struct sockaddr_storage ss;
    socklen_t len;
    char host[INET6_ADDRSTRLEN + 2]; /* as printed in URLs: [v6] */
};

static int parse_listen(const char *s, struct listen_addr *la)
{
    char host[256];
    const char *port;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host)
            return -1;
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = 0;
        port = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof host || strchr(s, ':') != colon)
            return -1;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
        port = colon + 1;
    }
    uint64_t p;
    if (!host[0] || kvp__parse_size(port, 0, &p) || p > 65535)
        return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) || !res)
        return -1;
    memcpy(&la->ss, res->ai_addr, res->ai_addrlen);
    la->len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void addr_text(const struct listen_addr *la, char *host, size_t hostlen, unsigned *port)
{
    char tmp[INET6_ADDRSTRLEN];
    if (la->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)&la->ss;
        inet_ntop(AF_INET6, &a->sin6_addr, tmp, sizeof tmp);
        snprintf(host, hostlen, "[%s]", tmp);
        *port = ntohs(a->sin6_port);
    } else {
        const struct sockaddr_in *a = (const void *)&la->ss;
        inet_ntop(AF_INET, &a->sin_addr, tmp, sizeof tmp);
        snprintf(host, hostlen, "%s", tmp);
        *port = ntohs(a->sin_port);
    }
}

/* Recovery and background persistence messages of meta (levels match). */
static void meta_log(void *arg, int level, const char *msg)
{
    (void)arg;
    kvp__log(level, "%s", msg);
}

/* ---------- connection limits ---------- */

static int client_key_of(const struct sockaddr *sa, struct client_key *k)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(k, 0, sizeof *k);
    if (!sa)
        return -1;
    if (sa->sa_family == AF_INET) {
        memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        k->len = 4;
    } else if (sa->sa_family == AF_INET6) {
        const uint8_t *a = (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (!memcmp(a, v4mapped, 12)) {
            memcpy(k->addr, a + 12, 4);
            k->len = 4;
        } else {
            memcpy(k->addr, a, 16);
            k->len = 16;
        }
    } else {
        return -1;
    }
    return 0;
}

static struct client_count **client_slot(struct serve *S, const struct client_key *k)
{
    uint32_t h = 2166136261u;
    for (unsigned i = 0; i < k->len; i++)
        h = (h ^ k->addr[i]) * 16777619u;
    struct client_count **pp = &S->clients[h % CLIENT_BUCKETS];
    while (*pp && ((*pp)->key.len != k->len || memcmp((*pp)->key.addr, k->addr, k->len)))
        pp = &(*pp)->next;
    return pp;
}

/* Counts one connection fewer from k (counted by client_take). */
static void client_drop(struct serve *S, const struct client_key *k)
{
    pthread_mutex_lock(&S->clients_lock);
    struct client_count **pp = client_slot(S, k), *c = *pp;
    if (c && --c->n == 0) {
        *pp = c->next;
        free(c);
    }
    pthread_mutex_unlock(&S->clients_lock);
}

/* Counts one more connection from k unless k has max already: 1 counted, 0
 * at the limit, -1 out of memory (not counted). */
static int client_take(struct serve *S, const struct client_key *k, uint64_t max)
{
    pthread_mutex_lock(&S->clients_lock);
    struct client_count **pp = client_slot(S, k), *c = *pp;
    int rc = 1;
    if (c && c->n >= max)
        rc = 0;
    else if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        c->key = *k;
        *pp = c;
    }
    if (rc == 1 && c)
        c->n++;
    else if (rc == 1)
        rc = -1;
    pthread_mutex_unlock(&S->clients_lock);
    return rc;
}

/* Runs for each accepted socket before MHD takes it: over a limit, MHD
 * closes it at once (the client sees the connection closed, not a hang).
 * A connection let in is counted here, open and against its address, not
 * when MHD starts it: with the acceptor, MHD starts connections on its
 * workers later, and a burst from one address would otherwise all pass the
 * check before the first of them was counted. (Should MHD fail to start one
 * it let in, for want of memory, that count stays one too high.) */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    struct serve *S = cls;
    struct kvp_conn_stats *cs = &S->srv.conns;
    if (atomic_fetch_add(&cs->open, 1) >= S->max_conns) {
        atomic_fetch_sub(&cs->open, 1);
        atomic_fetch_add(&cs->refused_total, 1);
        return MHD_NO;
    }
    struct client_key k;
    int taken = client_key_of(addr, &k) ? 1 : client_take(S, &k, S->max_conns_per_client);
    if (taken != 1) { /* at the limit, or no memory to count it */
        atomic_fetch_sub(&cs->open, 1);
        atomic_fetch_add(taken == 0 ? &cs->refused_client : &cs->refused_total, 1);
        return MHD_NO;
    }
    return MHD_YES;
}

/* The request line of a new request arrived: from now on, the request's
 * bytes must keep coming (--request-timeout), until its reply is sent. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)uri;
    struct serve *S = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *cn = ci ? ci->socket_context : NULL;
    if (cn) {
        cn->in_request = 1;
        cn->last_ms = kvp__mono_ms();
    }
    if (S->request_timeout != S->idle_timeout)
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, S->request_timeout);
    return NULL; /* *con_cls starts NULL: on_request sees its first call */
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct serve *S = cls;
    struct conn *cn = *con_cls;
    if (!cn)
        return;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && !cn->timed_out) {
        cn->timed_out = 1;
        atomic_fetch_add(&S->srv.conns.timeout_request, 1);
    }
    cn->in_request = 0;
    cn->last_ms = kvp__mono_ms();
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && S->request_timeout != S->idle_timeout)
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, S->idle_timeout);
}

/* ---------- memory of large bodies ---------- */

/*
 * Bodies over 1 MiB share --max-body-memory, so that many slow uploads of
 * large bodies cannot take all the memory: a body that would pass it is
 * dropped and answered 503. Smaller bodies do not count (each connection's
 * memory is bounded by them, and engines' requests always get through).
 */
static int body_hold(struct serve *S, struct conn *cn, size_t want)
{
    if (want <= WORKER_BODY_MIN || want <= cn->held)
        return 0;
    size_t add = want - cn->held, cur = atomic_load(&S->body_memory);
    do {
        if (add > S->max_body_memory || cur > S->max_body_memory - add)
            return -1;
    } while (!atomic_compare_exchange_weak(&S->body_memory, &cur, cur + add));
    cn->held = want;
    return 0;
}

static void body_release(struct serve *S, struct conn *cn)
{
    if (cn->held)
        atomic_fetch_sub(&S->body_memory, cn->held);
    cn->held = 0;
}

/* ---------- libmicrohttpd callbacks ---------- */

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct serve *S = cls;
    struct kvp_conn_stats *cs = &S->srv.conns;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *cn = calloc(1, sizeof *cn);
        if (cn) {
            kvp__buf_init(&cn->in);
            kvp__reply_init(&cn->rep);
            cn->last_ms = kvp__mono_ms();
        }
        /* Counted by on_accept: cn->key says whose count to lower at the end. */
        struct client_key k;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (client_key_of(ci ? ci->client_addr : NULL, &k) == 0) {
            if (cn)
                cn->key = k;
            else
                client_drop(S, &k);
        }
        atomic_fetch_add(&cs->accepted, 1);
        *socket_context = cn;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *cn = *socket_context;
        atomic_fetch_sub(&cs->open, 1);
        if (cn) {
            /* MHD does not say why it closes; a connection that made no
             * progress for its whole timeout was closed for it. */
            unsigned t = cn->in_request ? S->request_timeout : S->idle_timeout;
            if (t && !cn->timed_out && !atomic_load(&g_stopping) &&
                kvp__mono_ms() - cn->last_ms + 100 >= (uint64_t)t * 1000)
                atomic_fetch_add(cn->in_request ? &cs->timeout_request : &cs->timeout_idle, 1);
            if (cn->key.len)
                client_drop(S, &cn->key);
            body_release(S, cn);
            kvp__buf_free(&cn->in);
            kvp__reply_free(&cn->rep);
            free(cn);
        }
        *socket_context = NULL;
    }
}

static enum MHD_Result queue_reply(struct MHD_Connection *mc, struct kvp_reply *rep)
{
    /* The reply buffer belongs to the connection and is not touched again
     * before MHD has sent this response (no pipelined request is handled
     * while a response is pending), so MHD need not copy it. */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(rep->body.len, rep->body.p, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    if (rep->content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, rep->content_type);
    if (rep->allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, rep->allow);
    if (rep->www_authenticate)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, rep->www_authenticate);
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)rep->status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Runs on the log's flusher thread once the parked reply's records are durable. */
static void on_durable(void *arg, int status)
{
    struct conn *cn = arg;
    struct MHD_Connection *mc = cn->mc;
    cn->durable_rc = status;
    atomic_store(&cn->durable, 1);
    MHD_resume_connection(mc);
    atomic_fetch_sub(&g_pending, 1);
}

static enum MHD_Result durable_reply(struct serve *S, struct MHD_Connection *mc, struct conn *cn)
{
    cn->waiting = 0;
    if (cn->durable_rc) {
        /* Applied in memory, not durable: 507 / 503, not 500. The log said
         * once that writes are refused; no line per request. */
        char why[sizeof((struct kvp_error *)0)->msg];
        if (kvp_meta_health(S->meta, why, sizeof why) == 0)
            snprintf(why, sizeof why, "cannot make the change durable: %s",
                     kvp_strerror(cn->durable_rc));
        kvp__reply_log_error(&cn->rep, cn->durable_rc, why, 1);
    }
    return queue_reply(mc, &cn->rep);
}

/* Handles the request in cn->req on the calling thread; returns the ticket
 * of its changes (0: nothing to wait for before the reply). */
static uint64_t handle(struct serve *S, struct conn *cn)
{
    struct kvp_reply *rep = &cn->rep;
    arena_begin();
    kvp__server_handle(&S->srv, &cn->req, rep);
    arena_end();
    uint64_t lsn = rep->ticket;
    if (cn->in.cap > KEEP_BUFFER_MAX)
        kvp__buf_free(&cn->in);
    body_release(S, cn);
    if (rep->status >= 500 && rep->status != 503 &&
        rep->status != 507) /* said once, not per request */
        KVP_LOGE("%s %.*s -> %d %.*s", cn->req.method, (int)cn->req.path_len, cn->req.path,
                 rep->status, (int)rep->body.len, rep->body.p ? rep->body.p : "");
    else
        KVP_LOGD("%s %.*s -> %d", cn->req.method, (int)cn->req.path_len, cn->req.path, rep->status);
    return lsn;
}

/* The body worker: handles the requests with large bodies, one at a time,
 * waits for their log records, and gives each connection back to MHD. */
static void *body_worker(void *arg)
{
    struct serve *S = arg;
    pthread_setname_np(pthread_self(), "kvp-body");
    pthread_mutex_lock(&S->jobs_lock);
    for (;;) {
        while (!S->jobs_head && !S->worker_stop)
            pthread_cond_wait(&S->jobs_cond, &S->jobs_lock);
        struct conn *cn = S->jobs_head;
        if (!cn)
            break;
        S->jobs_head = cn->job_next;
        if (!S->jobs_head)
            S->jobs_tail = NULL;
        pthread_mutex_unlock(&S->jobs_lock);
        uint64_t lsn = handle(S, cn);
        cn->durable_rc = lsn ? kvp_meta_wait(S->meta, lsn, NULL) : 0;
        atomic_store(&cn->durable, 1);
        MHD_resume_connection(cn->mc);
        atomic_fetch_sub(&g_pending, 1);
        pthread_mutex_lock(&S->jobs_lock);
    }
    pthread_mutex_unlock(&S->jobs_lock);
    return NULL;
}

static void worker_push(struct serve *S, struct conn *cn)
{
    cn->job_next = NULL;
    pthread_mutex_lock(&S->jobs_lock);
    if (S->jobs_tail)
        S->jobs_tail->job_next = cn;
    else
        S->jobs_head = cn;
    S->jobs_tail = cn;
    pthread_cond_signal(&S->jobs_cond);
    pthread_mutex_unlock(&S->jobs_lock);
}

/* Announces a reply that will be given later (parked on the log or on the
 * body worker); 0 when shutdown has begun, and the caller must answer now.
 * Shutdown sets g_stopping before it reads g_pending: one of the two sees
 * the other. */
static int announce_pending(void)
{
    atomic_fetch_add(&g_pending, 1);
    if (!atomic_load(&g_stopping))
        return 1;
    atomic_fetch_sub(&g_pending, 1);
    return 0;
}

static enum MHD_Result respond(struct serve *S, struct MHD_Connection *mc, struct conn *cn,
                               const char *url, const char *method)
{
    cn->req = (struct kvp_request){
        .method = method,
        .path = url,
        .path_len = strlen(url),
        .body = cn->in.p,
        .body_len = cn->in.len,
        .authorization =
            MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .error_fields = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Kvpage-Errors") != NULL,
        .body_too_large = cn->too_large,
        .body_memory_full = cn->memory_full ? S->max_body_memory : 0,
    };
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    cn->req.client = ci ? ci->client_addr : NULL;
    if (S->srv.cfg.nallow && !cn->req.client)
        return MHD_NO; /* cannot check the address: refuse the connection */

    if (cn->req.body_len > WORKER_BODY_MIN && S->worker_running && announce_pending()) {
        /* Everything the request points at (url, headers, body) stays put
         * while the connection is suspended. */
        cn->mc = mc;
        cn->waiting = 1;
        atomic_store(&cn->durable, 0);
        MHD_suspend_connection(mc);
        worker_push(S, cn);
        return MHD_YES;
    }

    uint64_t lsn = handle(S, cn);
    if (lsn && !S->group_commit) {
        /* always / never: this thread writes (and syncs) the records itself;
         * parking the reply would only add a suspend and a resume. */
        cn->durable_rc = kvp_meta_wait(S->meta, lsn, NULL);
        return durable_reply(S, mc, cn);
    }
    if (lsn) {
        if (!announce_pending()) {
            cn->durable_rc = kvp_meta_wait(S->meta, lsn, NULL);
            return durable_reply(S, mc, cn);
        }
        /* Suspend first, so that a callback running at once finds the
         * connection suspended; MHD calls us again after the resume. */
        cn->mc = mc;
        cn->waiting = 1;
        atomic_store(&cn->durable, 0);
        MHD_suspend_connection(mc);
        int r = kvp_meta_when_durable(S->meta, lsn, on_durable, cn);
        if (r != 0) {
            cn->durable_rc = r < 0 ? r : 0;
            atomic_store(&cn->durable, 1);
            MHD_resume_connection(mc);
            atomic_fetch_sub(&g_pending, 1);
        }
        return MHD_YES;
    }
    return queue_reply(mc, &cn->rep);
}

/* Why this thread's callback closed a connection on purpose (MHD then logs
 * "Application reported internal error"), for mhd_log to say instead. */
static _Thread_local char t_close_why[384];

/* The body of this request will be refused: from now on it is read and
 * dropped, for DROP_SECONDS at most. */
static void start_dropping(struct conn *cn)
{
    cn->drop_until_ms = kvp__mono_ms() + DROP_SECONDS * 1000;
}

/* The client waits for "100 Continue" before it sends its body. */
static int expects_continue(struct MHD_Connection *mc)
{
    const char *e = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return e && strcasecmp(e, "100-continue") == 0;
}

/* The handler decodes the path itself, one segment at a time, so that an
 * encoded '/' or NUL in a deployment name is a bad name (400), not another
 * path (docs/protocol-notes.md). */
static size_t keep_escapes(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    struct serve *S = cls;
    struct conn *cn = *con_cls;
    t_close_why[0] = '\0';
    if (cn && cn->waiting) {
        if (!atomic_load(&cn->durable))
            return MHD_YES; /* not ours to answer yet */
        return durable_reply(S, mc, cn);
    }
    if (!cn) {
        /* First call of a request: headers only. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cn = ci ? ci->socket_context : NULL;
        if (!cn)
            return MHD_NO;
        *con_cls = cn;
        cn->last_ms = kvp__mono_ms();
        kvp__buf_reset(&cn->in);
        cn->too_large = 0;
        cn->memory_full = 0;
        cn->body_seen = 0;
        cn->drop_until_ms = 0;
        body_release(S, cn);
        if (cn->rep.body.cap > KEEP_BUFFER_MAX || cn->rep.scratch_cap > KEEP_BUFFER_MAX / 8) {
            kvp__reply_free(&cn->rep);
            kvp__reply_init(&cn->rep);
        }
        const char *cl =
            MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            uint64_t n;
            if (!kvp__parse_size(cl, 0, &n) && n > S->max_body) {
                cn->too_large = 1;
                /* A client waiting for 100 Continue sends no body after the
                 * reply; a body past what is dropped is not read at all:
                 * answer before reading any of it (MHD then closes the
                 * connection instead of reading it). */
                if (n > S->discard_max || expects_continue(mc))
                    return respond(S, mc, cn, url, method);
                start_dropping(cn);
                return MHD_YES;
            }
            if (!kvp__parse_size(cl, 0, &n) && body_hold(S, cn, (size_t)n)) {
                cn->memory_full = 1;
                start_dropping(cn);
                return MHD_YES;
            }
            if (!kvp__parse_size(cl, 0, &n) && n <= KEEP_BUFFER_MAX)
                kvp__buf_reserve(&cn->in, (size_t)n);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        cn->last_ms = kvp__mono_ms();
        cn->body_seen += n;
        if (cn->drop_until_ms) {
            /* The body will be refused: drop it, within the bounds. */
            if (cn->body_seen <= S->discard_max && cn->last_ms <= cn->drop_until_ms)
                return MHD_YES;
            /* MHD 0.9.75 cannot answer in the middle of a body: close. */
            snprintf(t_close_why, sizeof t_close_why,
                     "%s %.200s: closed the connection after %" PRIu64 " bytes of a body that "
                     "is refused (%s): more than is read and dropped (%" PRIu64 " bytes, %d s)",
                     method, url, cn->body_seen,
                     cn->too_large ? "over --max-body" : "over --max-body-memory", S->discard_max,
                     DROP_SECONDS);
            return MHD_NO;
        }
        if (n > S->max_body - cn->in.len) {
            cn->too_large = 1;
            kvp__buf_free(&cn->in);
            body_release(S, cn);
            start_dropping(cn);
            return MHD_YES;
        }
        /* A body without Content-Length holds memory as it grows, in doublings. */
        size_t want = cn->in.len + n;
        if (want > cn->held && want > WORKER_BODY_MIN) {
            size_t step = cn->held ? 2 * cn->held : 2 * WORKER_BODY_MIN;
            if (step > S->max_body)
                step = S->max_body;
            if (step < want)
                step = want;
            if (body_hold(S, cn, step) && body_hold(S, cn, want)) {
                cn->memory_full = 1;
                kvp__buf_free(&cn->in);
                body_release(S, cn);
                start_dropping(cn);
                return MHD_YES;
            }
        }
        kvp__buf_put(&cn->in, upload_data, n);
        if (cn->in.oom)
            return MHD_NO;
        return MHD_YES;
    }
    return respond(S, mc, cn, url, method);
}

/* libmicrohttpd's messages, at most a few a second: every client that
 * hangs up mid-request makes one, and a client must not fill the log. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t window_ms, dropped;
    static unsigned in_window;
    uint64_t now = kvp__mono_ms(), was_dropped = 0;
    pthread_mutex_lock(&lock);
    if (now - window_ms >= 1000) {
        was_dropped = dropped;
        window_ms = now;
        in_window = dropped = 0;
    }
    int quiet = ++in_window > 10;
    dropped += quiet;
    pthread_mutex_unlock(&lock);
    if (was_dropped)
        KVP_LOGW("libmicrohttpd: %llu more messages in the last second were not logged",
                 (unsigned long long)was_dropped);
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    int ours = t_close_why[0] && strstr(line, "Application reported internal error");
    if (ours && !quiet)
        KVP_LOGW("%s", t_close_why);
    if (ours)
        t_close_why[0] = '\0';
    if (quiet || ours)
        return;
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = 0;
    KVP_LOGW("libmicrohttpd: %s", line);
}

static int open_listener(const struct listen_addr *la, const char *text)
{
    int fd = socket(la->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "kvpage serve: socket: %s\n", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (la->ss.ss_family == AF_INET6) {
        /* "[::]" listens on IPv6 only unless told otherwise; keep the
         * system default (usually dual stack) rather than surprise. */
    }
    if (bind(fd, (const struct sockaddr *)&la->ss, la->len) != 0) {
        int e = errno;
        if (e == EADDRINUSE)
            fprintf(stderr,
                    "kvpage serve: cannot listen on %s: the address is already in use "
                    "(another kvpage serve or another program holds the port; choose another "
                    "with --listen)\n",
                    text);
        else
            fprintf(stderr, "kvpage serve: cannot listen on %s: %s\n", text, strerror(e));
        close(fd);
        return -1;
    }
    if (listen(fd, 1024) != 0) {
        fprintf(stderr, "kvpage serve: listen on %s: %s\n", text, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * The acceptor. Each of MHD's worker threads accepts up to eleven
 * connections in a row when the listening socket wakes it, so the sixteen
 * connections an engine's client pool opens at once can land on two of eight
 * workers; with a backend whose calls wait for a reply (redis://, http://),
 * such a worker serves its connections one round trip at a time while the
 * others idle (measured: 22,000 against 32,000 batch_exists a second, by
 * where the connections fell). With --meta and more than one worker, this
 * thread accepts instead and gives each connection to MHD_add_connection, which
 * hands it to worker (descriptor mod pool size): new connections go round
 * the workers in turn. The access policy (on_accept) applies as before.
 */
static void *acceptor_main(void *arg)
{
    struct serve *S = arg;
    pthread_setname_np(pthread_self(), "kvp-accept");
    struct pollfd p[2] = {{.fd = S->listen_fd, .events = POLLIN},
                          {.fd = S->accept_stop, .events = POLLIN}};
    int warned = 0;
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            KVP_LOGE("the acceptor stops: poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents)
            break;
        if (p[0].revents & (POLLERR | POLLNVAL)) { /* the listening socket is gone */
            KVP_LOGE("the acceptor stops: the listening socket failed");
            break;
        }
        for (int k = 0; k < 64; k++) {
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            int s =
                accept4(S->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (s < 0) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    /* Out of descriptors: the connection waits in the
                     * backlog; try again shortly instead of spinning. */
                    if (!warned++)
                        KVP_LOGW("cannot accept a connection: %s (retrying)", strerror(errno));
                    usleep(10000);
                }
                break; /* EAGAIN: none left; ECONNABORTED and the like: poll again */
            }
            warned = 0;
            /* MHD closes the socket itself when it refuses it. */
            (void)MHD_add_connection(S->d, s, (struct sockaddr *)&ss, len);
        }
    }
    return NULL;
}

/* Starts the acceptor on fd (made non-blocking); 0, or -1 (said). */
static int acceptor_start(struct serve *S, int fd)
{
    S->listen_fd = fd;
    int fl = fcntl(fd, F_GETFL);
    S->accept_stop = eventfd(0, EFD_CLOEXEC);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || S->accept_stop < 0 ||
        pthread_create(&S->acceptor, NULL, acceptor_main, S) != 0) {
        fprintf(stderr, "kvpage serve: cannot start the acceptor thread: %s\n", strerror(errno));
        if (S->accept_stop >= 0)
            close(S->accept_stop);
        S->accept_stop = -1;
        return -1;
    }
    return 0;
}

static void acceptor_stop(struct serve *S)
{
    if (S->accept_stop < 0)
        return;
    uint64_t one = 1;
    if (write(S->accept_stop, &one, sizeof one) != (ssize_t)sizeof one)
        KVP_LOGW("cannot stop the acceptor: %s", strerror(errno));
    pthread_join(S->acceptor, NULL);
    close(S->accept_stop);
    S->accept_stop = -1;
}

/* ---------------------------------------------------------------- stopping */

/* Stops a server that serve_run started, in order: the replies parked on
 * the log are answered (their callbacks point at connections that MHD frees
 * when it stops), the acceptor stops, then MHD (every connection closed). */
static void serve_stop(struct serve *S, struct MHD_Daemon *d, int fd)
{
    atomic_store(&g_stopping, 1);
    for (int i = 0; i < 30000 && atomic_load(&g_pending) > 0; i++)
        usleep(1000);
    if (atomic_load(&g_pending) > 0)
        KVP_LOGW("%ld replies still wait for the log after 30 s", (long)atomic_load(&g_pending));
    acceptor_stop(S);
    MHD_stop_daemon(d);
    close(fd);
}

/* Frees what serve_run made, started or not: the body worker ends, then the
 * connection counts, the locks and the metadata handle go. */
static void serve_free(struct serve *S)
{
    if (S->worker_running) {
        pthread_mutex_lock(&S->jobs_lock);
        S->worker_stop = 1;
        pthread_cond_signal(&S->jobs_cond);
        pthread_mutex_unlock(&S->jobs_lock);
        pthread_join(S->worker, NULL);
    }
    for (size_t i = 0; i < CLIENT_BUCKETS; i++)
        while (S->clients[i]) {
            struct client_count *c = S->clients[i];
            S->clients[i] = c->next;
            free(c);
        }
    pthread_mutex_destroy(&S->clients_lock);
    pthread_mutex_destroy(&S->jobs_lock);
    pthread_cond_destroy(&S->jobs_cond);
    kvp__server_fini(&S->srv);
    kvp_meta_close(S->meta);
    free(S);
}

/* ---------------------------------------------------------------- the flags */

/* What the flags ask for: parse fills it, run acts on it. */
struct serve_cfg {
    const char *listen_text, *token, *data_dir, *meta_loc;
    int data_dir_given, threads_given, fsync_mode;
    uint64_t lease_ms, grace_ms, max_body, max_keys, threads, snapshot_bytes;
    uint64_t idle_timeout, request_timeout, max_conns_client, max_conns, max_body_memory;
    struct kvp_cidr *allow;
    size_t nallow;
    struct kvp_kvev_cfg kvev; /* --kv-events: kvev.spec set when given */
    double max_pinned_ratio;
};

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
    return bad_value(name, v, f->why);
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

/* Any location of a remote backend: the metadata layer knows the schemes
 * (and says which it knows); a data directory goes in --data-dir. */
static int set_meta(struct serve_cfg *c, const struct flag *f, const char *v)
{
    if (!strncmp(v, "file:", 5) || !strncmp(v, "mem:", 4) || v[0] == '/' || v[0] == '.' ||
        !strchr(v, ':'))
        return bad_flag(f, v);
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
        return bad_value("--kv-events", v, why);
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
    {"meta", set_meta, 0, 0, 0, 0,
     "expected redis://HOST:PORT[/DB], redis://H1:P1,H2:P2,... or "
     "redis-sentinel://S1:P1,S2:P2,.../MASTER (a data directory goes in --data-dir)"},
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

/* Fills cfg from the command line (defaults first): -1 to go on and run,
 * else the exit status (0 after --help, 2 for a usage error). */
static int serve_parse(int argc, char **argv, struct serve_cfg *cfg)
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
                        "either in Redis or in a data directory\n");
        return 2;
    }
    if (cfg->meta_loc && cfg->kvev.spec) {
        fprintf(stderr, "kvpage serve: --kv-events with --meta is not implemented yet: KV events "
                        "come from a server whose state is in process (--data-dir)\n");
        return 2;
    }
    /* Every call to a remote store waits for a round trip: more threads keep
     * the server answering while some wait (a slow or unreachable store must
     * not stall every client behind one request). */
    if (cfg->meta_loc && !cfg->threads_given)
        cfg->threads = 8;
    return -1;
}

/* ---------------------------------------------------------------- running */

/* Whether stock vLLM's metadata client, which ignores its URL and always
 * asks http://localhost:18000, reaches a server listening on host:port
 * (research/vllm_hf3fs.md: hf3fs_metadata_server_url is read, never used). */
static int stock_vllm_reaches(const char *host, unsigned port)
{
    return port == 18000 && (!strncmp(host, "127.", 4) || !strcmp(host, "0.0.0.0") ||
                             !strcmp(host, "[::]") || !strcmp(host, "[::1]"));
}

/* Runs the server that sc describes until SIGTERM or SIGINT: the exit
 * status. */
static int serve_run(const struct serve_cfg *sc)
{
    const char *listen_text = sc->listen_text, *token = sc->token, *data_dir = sc->data_dir;
    const char *meta_loc = sc->meta_loc;
    uint64_t lease_ms = sc->lease_ms, grace_ms = sc->grace_ms, max_body = sc->max_body,
             max_keys = sc->max_keys, threads = sc->threads, snapshot_bytes = sc->snapshot_bytes;
    uint64_t idle_timeout = sc->idle_timeout, request_timeout = sc->request_timeout,
             max_conns_client = sc->max_conns_client, max_conns = sc->max_conns,
             max_body_memory = sc->max_body_memory;
    const struct kvp_cidr *allow = sc->allow;
    size_t nallow = sc->nallow;
    int fsync_mode = sc->fsync_mode;
    int status = 2;
    if (KVP_JSON_ARENA)
        json_set_alloc_funcs(arena_malloc, arena_free);
    struct listen_addr la;
    if (parse_listen(listen_text, &la)) {
        status =
            bad_value("--listen", listen_text,
                      "expected ADDR:PORT, e.g. 127.0.0.1:18000, 0.0.0.0:18000 or [::1]:18000");
        goto out;
    }

    /* From here on failures are not usage errors. */
    status = 1;
    /* SIGINT and SIGTERM are taken synchronously by this thread only (the
     * sigwait below), blocked before any thread exists: the log's and the
     * snapshot's threads, started while the state opens, and MHD's inherit
     * the mask. A signal during start-up then waits for the sigwait (a clean
     * stop, exit 0) instead of killing the process in another thread. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The port before the state: a port in use is refused before a data
     * directory, its LOCK and its log are created. */
    int fd = open_listener(&la, listen_text);
    if (fd < 0)
        goto out;
    struct stat dst;
    int made_dir =
        !meta_loc && strcmp(data_dir, "none") != 0 && stat(data_dir, &dst) != 0 && errno == ENOENT;
    /* Every connection is a file descriptor: take all the kernel allows, and
     * keep some for the log, snapshots and the listener. */
    struct rlimit rl;
    uint64_t fd_room = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
            struct rlimit up = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                rl.rlim_cur = want;
        }
        fd_room = rl.rlim_cur == RLIM_INFINITY ? (uint64_t)1 << 20 : (uint64_t)rl.rlim_cur;
    }
    uint64_t conn_room = fd_room > 128 ? fd_room - 64 : fd_room / 2;
    if (!max_conns)
        max_conns = conn_room;
    else if (max_conns > conn_room)
        KVP_LOGW("--max-conns %" PRIu64 " is above what the open-file limit (%" PRIu64
                 ") leaves for connections (%" PRIu64 "); accepts may fail past that",
                 max_conns, fd_room, conn_room);
    struct kvp_meta_opts mo;
    kvp_meta_opts_init(&mo);
    mo.lease_ms = lease_ms;
    mo.read_grace_ms = grace_ms;
    int persistent = !meta_loc && strcmp(data_dir, "none") != 0;
    mo.data_dir = persistent ? data_dir : NULL;
    if (meta_loc) {
        /* A request waits for Redis at most this long before it gets 503. */
        mo.connect_timeout_ms = 1000;
        mo.timeout_ms = 2000;
    }
    mo.fsync = fsync_mode;
    mo.snapshot_bytes = snapshot_bytes; /* 0: the library's default */
    /* Not the library's default (a thread): this process holds little but
     * the metadata, so its fork costs about what the thread's copy does
     * (1-4 ms for 1,000,000 keys), and the child writes at idle priority,
     * leaving the CPUs to requests (bench/persist/README.md, "pause"). */
    mo.snapshot_mode = KVP_SNAPSHOT_FORK;
    mo.log = meta_log;
    struct kvp_meta *meta = NULL;
    struct kvp_error merr = {0};
    /* Messages name the location without its password. */
    char shown_loc[1024];
    show_location(meta_loc ? meta_loc : "", shown_loc, sizeof shown_loc);
    int rc = open_meta(meta_loc     ? meta_loc
                       : persistent ? NULL
                                    : "mem:",
                       shown_loc, &mo, &meta, &merr);
    if (rc && meta_loc) {
        fprintf(stderr, "kvpage serve: cannot open the state in %s: %s\n", shown_loc,
                merr.msg[0] ? merr.msg : kvp_strerror(rc));
        if (merr.rule == KVP_RULE_ARG) /* a bad location, as a bad flag: 2 */
            status = 2;
        goto out_closed;
    }
    if (rc) {
        /* A data directory that cannot be one (a missing parent, a file): 2. */
        if (persistent && (rc == -ENOENT || rc == -ENOTDIR))
            status = 2;
        /* meta has logged the details (file, offset, what is wrong); "data
         * directory D is busy: in use by another kvpage process" among them, in
         * the words the embedded store's callers print. */
        if (rc == -EBUSY)
            goto out_closed;
        if (persistent && merr.msg[0])
            fprintf(stderr, "kvpage serve: %s\n", merr.msg); /* names the directory */
        else if (persistent)
            fprintf(stderr, "kvpage serve: cannot open the state in %s: %s\n", data_dir,
                    kvp_strerror(rc));
        else
            fprintf(stderr, "kvpage serve: cannot create the metadata store: %s\n",
                    merr.msg[0] ? merr.msg : kvp_strerror(rc));
        goto out_closed;
    }
    /* Before the listener: by the time a client is answered, the log says it. */
    if (meta_loc)
        durability_warning(meta, shown_loc, fsync_mode);
    struct serve *S = calloc(1, sizeof *S);
    if (!S) {
        fprintf(stderr, "kvpage serve: out of memory\n");
        kvp_meta_close(meta);
        goto out_closed;
    }
    /* Where the state is, as the backend says (never a password): the
     * banner and /v1/stats's server.state. */
    char state_text[4200];
    if (!persistent && !meta_loc)
        snprintf(state_text, sizeof state_text, "memory only (--data-dir none)");
    else if (kvp_meta_describe(meta, state_text, sizeof state_text) < 0)
        snprintf(state_text, sizeof state_text, "%s", shown_loc);
    /* Before the listener, as the durability warning: a client that is
     * answered finds it in the log. */
    if (!persistent && !meta_loc)
        KVP_LOGI("--data-dir none: state is in memory only");
    else
        KVP_LOGI("state in %s", state_text);
    struct kvp_server_config cfg = {
        .token = token,
        .allow = allow,
        .nallow = nallow,
        .max_body = (size_t)max_body,
        .max_keys = (size_t)max_keys,
        .data_dir = meta_loc ? shown_loc : data_dir,
        .state = state_text,
        .json_is_scratch = KVP_JSON_ARENA ? arena_holds_all : NULL,
        .max_pinned_ratio = sc->max_pinned_ratio,
    };
    kvp__server_init(&S->srv, meta, &cfg);
    S->meta = meta;
    S->group_commit = fsync_mode == KVP_FSYNC_BATCH;
    S->max_body = (size_t)max_body;
    S->discard_max = max_body + (max_body > DROP_EXTRA_MIN ? max_body : DROP_EXTRA_MIN);
    S->idle_timeout = (unsigned)idle_timeout;
    S->request_timeout = (unsigned)request_timeout;
    S->max_conns = max_conns;
    S->max_conns_per_client = max_conns_client;
    /* One body of --max-body always fits. */
    S->max_body_memory = (size_t)(max_body_memory > max_body ? max_body_memory : max_body);
    pthread_mutex_init(&S->clients_lock, NULL);
    pthread_mutex_init(&S->jobs_lock, NULL);
    pthread_cond_init(&S->jobs_cond, NULL);
    struct kvp_kvev *kvev = NULL;
    if (sc->kvev.spec) { /* before the listener: no change goes unpublished */
        char why[600];
        if (kvp__kvev_start(&sc->kvev, meta, persistent ? data_dir : NULL, &kvev, why,
                            sizeof why) != 0) {
            fprintf(stderr, "kvpage serve: --kv-events: %s\n", why);
            serve_free(S);
            goto out_closed;
        }
        KVP_LOGI("KV events on %s%s%s (topic \"%s\", medium %s)", sc->kvev.endpoint,
                 sc->kvev.replay_endpoint ? ", replay on " : "",
                 sc->kvev.replay_endpoint ? sc->kvev.replay_endpoint : "", sc->kvev.topic,
                 sc->kvev.medium);
    }

    struct MHD_Daemon *d = NULL;
    S->accept_stop = -1;
    { /* the HTTP server on the listener */
        unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_TURBO | MHD_USE_ERROR_LOG |
                         MHD_ALLOW_SUSPEND_RESUME;
        /* acceptor_main: where a call waits on the network (--meta) and
         * there are several workers. In process, a worker never waits, and
         * MHD's own accepting costs a new connection less. */
        int own_accept = threads > 1 && meta_loc;
        if (own_accept)
            flags |= MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
        if (la.ss.ss_family == AF_INET6)
            flags |= MHD_USE_IPv6;
        /* MHD's own limit stays out of reach: at it, MHD stops accepting
         * (every new client hangs) where on_accept refuses at once. */
        uint64_t mhd_limit = max_conns + 64 + threads;
        const struct MHD_OptionItem common[] = {
            {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, S},
            {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, S},
            {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, S},
            {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)keep_escapes, NULL},
            {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)idle_timeout, NULL},
            {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)(mhd_limit > UINT_MAX ? UINT_MAX : mhd_limit),
             NULL},
            {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 16 * 1024, NULL},
            {MHD_OPTION_END, 0, NULL},
        };
        struct MHD_OptionItem ops[2 + sizeof common / sizeof common[0]];
        size_t no = 0;
        if (!own_accept) /* else the acceptor accepts on fd */
            ops[no++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, fd, NULL};
        if (threads > 1)
            ops[no++] =
                (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)threads, NULL};
        memcpy(ops + no, common, sizeof common);
        if (pthread_create(&S->worker, NULL, body_worker, S) == 0)
            S->worker_running = 1;
        else
            KVP_LOGW("cannot start the body worker thread: large bodies are handled in line");
        d = MHD_start_daemon(flags, 0, on_accept, S, on_request, S, MHD_OPTION_EXTERNAL_LOGGER,
                             mhd_log, NULL, MHD_OPTION_ARRAY, ops, MHD_OPTION_END);
        if (!d) {
            fprintf(stderr, "kvpage serve: cannot start the HTTP server on %s\n", listen_text);
            close(fd);
            fd = -1;
        } else if (own_accept) {
            S->d = d;
            if (acceptor_start(S, fd) != 0) {
                MHD_stop_daemon(d);
                d = NULL;
                close(fd);
                fd = -1;
            }
        }
    }
    if (d) {
        char host[INET6_ADDRSTRLEN + 2];
        unsigned port;
        addr_text(&la, host, sizeof host, &port);
        struct sockaddr_storage bound;
        socklen_t blen = sizeof bound;
        if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0) /* the port of :0 */
            port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                     : ((struct sockaddr_in *)&bound)->sin_port);
        KVP_LOGI("lease %" PRIu64 " ms, read grace %" PRIu64 " ms, max body %" PRIu64
                 " bytes, max keys %" PRIu64 ", %" PRIu64 " thread(s)%s%s",
                 lease_ms, grace_ms, max_body, max_keys, threads,
                 token ? ", bearer token required" : "",
                 nallow ? ", client addresses restricted by --allow" : "");
        KVP_LOGI("connections: at most %" PRIu64 ", %" PRIu64
                 " per client address; idle timeout %" PRIu64 " s, request timeout %" PRIu64 " s",
                 max_conns, max_conns_client, idle_timeout, request_timeout);
        if (kvp__log_json())
            /* Every line a JSON object: the banner as a log line. */
            KVP_LOGI("listening on http://%s:%u (vLLM: hf3fs_metadata_server_url%s, SGLang: "
                     "metadata_server_url)",
                     host, port,
                     stock_vllm_reaches(host, port)
                         ? ""
                         : " of kvpage.vllm; stock vLLM talks to localhost:18000 only");
        else {
            printf("kvpage serve: listening on http://%s:%u\n", host, port);
            if (stock_vllm_reaches(host, port))
                printf("  vLLM:   \"hf3fs_metadata_server_url\": \"http://%s:%u\" in "
                       "kv_connector_extra_config\n",
                       host, port);
            else
                printf("  vLLM:   stock vLLM ignores hf3fs_metadata_server_url: it talks to "
                       "localhost:18000 only,\n"
                       "          never to this server. Use kvpage.vllm "
                       "(\"kv_connector_module_path\": \"kvpage.vllm\",\n"
                       "          \"kv_connector\": \"KvpageHF3FSConnector\") with "
                       "\"hf3fs_metadata_server_url\": \"http://%s:%u\"\n",
                       host, port);
            printf("  SGLang: \"metadata_server_url\": \"http://%s:%u\" in the JSON file named by "
                   "SGLANG_HICACHE_HF3FS_CONFIG_PATH\n",
                   host, port);
        }
        fflush(stdout);
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "[::]"))
            KVP_LOGI("listening on every interface: give clients this machine's address instead "
                     "of %s",
                     host);

        char status_text[160];
        snprintf(status_text, sizeof status_text, "READY=1\nSTATUS=listening on http://%s:%u", host,
                 port);
        notify_systemd(status_text);

        int sig = 0;
        sigwait(&sigs, &sig);
        KVP_LOGI("%s received, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
        notify_systemd("STOPPING=1");
        serve_stop(S, d, fd);
        status = 0;
    }
    kvp__kvev_stop(kvev); /* after the last request, before the state closes */
    serve_free(S);
    if (!d && made_dir)
        kvp__remove_data_dir(data_dir); /* started nothing: leave no state behind */
    return status;
out_closed:
    close(fd);
    if (made_dir)
        kvp__remove_data_dir(data_dir);
out:
    return status;
}

int kvp__serve_main(int argc, char **argv)
{
    struct serve_cfg cfg;
    int status = serve_parse(argc, argv, &cfg);
    if (status < 0)
        status = serve_run(&cfg);
    free(cfg.allow);
    kvp__kvev_cfg_free(&cfg.kvev);
    return status;
}
