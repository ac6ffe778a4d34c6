/*
 * Connections to Redis for the redis:// backend (redis_conn.h).
 *
 * Each node keeps a few idle hiredis contexts behind its own mutex: a call
 * takes one (or connects a new one), runs its command without any lock, and
 * gives it back, so the server's worker threads run their calls to Redis in
 * parallel. A context that failed is freed, never given back, and with it
 * the node's other idle contexts: when one connection found the server gone
 * (a restart), the others are dead too, and the next call connects afresh.
 *
 * A Redis Cluster: the slot map (slot -> node) comes from CLUSTER SLOTS and
 * is corrected by every MOVED; ASK sends ASKING before the one command. The
 * map is read again after a connection to a node failed, and each call
 * tries a bounded number of times, so that no call waits much longer than
 * its timeouts.
 *
 * Sentinel (redis-sentinel://): the seeds are sentinels; the master is the
 * address they give for the master's name, checked with ROLE. A call that
 * cannot reach the master, loses its connection or is refused as READONLY
 * (the master was demoted) asks the sentinels again and, when they name
 * another master, goes there: a failover is followed without a restart.
 * Until a master answers, calls fail (503 in kvpage serve) within their
 * timeouts.
 *
 * WAIT (?wait=N): a command that may write is followed on its connection by
 * WAIT N T; fewer than N replicas fail the call, although the change is
 * applied on the master (protocol-notes, "Waiting for replicas").
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "meta/redis/redis_conn.h"
#include "util/error.h"

#define MAX_NODES 64
#define POOL_IDLE 8    /* idle contexts kept per node */
#define MAX_ATTEMPTS 6 /* tries of one call (redirections, reloads, failovers) */
#define NSLOTS 16384
#define NO_NODE 0xff
#define MAX_COMBINERS 2 /* batches in flight per node */

struct rnode {
    char *host;
    int port;
    char name[80]; /* "host:port", for messages */
    pthread_mutex_t lock;
    redisContext *idle[POOL_IDLE];
    int nidle;
    /* An outage: set by a call that failed for want of the node, ended by
     * an answer to a call that began after it was set (an answer to an
     * older call says nothing of now). Guarded by lock. */
    int down;
    uint64_t epoch;   /* raised when down is set; each call notes it at its start */
    uint64_t down_ms; /* since when */
    uint64_t down_calls;
    /* Combining: calls queue their commands here; up to MAX_COMBINERS of
     * them at once each take the whole queue and send it on one
     * connection, read every reply and hand them out (under qlock; each
     * caller waits on a condition variable of its own, woken when its
     * jobs are done or when it is the first in the queue and a combiner
     * is free). */
    pthread_mutex_t qlock;
    struct rjob *qhead, **qtail;
    int combining;
};

/* One command of a combined batch, and its outcome. */
struct rjob {
    int argc;
    const char **argv;
    const size_t *lens;
    int wait;          /* a WAIT follows it (?wait=) */
    redisReply *reply; /* the answer (maybe an error reply) */
    int rc, wait_rc;   /* no answer (err); the WAIT's verdict (err) */
    int sent, fresh;   /* with rc: whether it was sent, on a new connection */
    struct kvp_error err;
    int done;
    pthread_cond_t *cv; /* its caller waits on this one (under the node's qlock) */
    struct rjob *next;
};

struct kvp__rconn {
    struct kvp__rcfg cfg;
    atomic_int cluster;   /* slots are looked up in the map (read without the lock) */
    pthread_mutex_t lock; /* guards nodes (appended only), nnodes, slots and the SHAs */
    struct rnode *nodes[MAX_NODES];
    size_t nnodes;
    uint8_t slots[NSLOTS]; /* node index, or NO_NODE */
    atomic_uint_fast64_t connects, failures, redirects, script_loads;
    atomic_uint_fast64_t waits, wait_short, master_asks, switches;
    /* Sentinel: the master's index in nodes[] (outside a cluster, nodes[0]
     * otherwise); asking the sentinels is one call at a time (ask_lock),
     * and a call that waited for another's answer takes it (asked_ms). */
    int sentinel;
    atomic_size_t master;
    pthread_mutex_t ask_lock;
    atomic_uint_fast64_t asked_ms;
    int combine; /* calls share round trips (KVPAGE_REDIS_COMBINE=1; else each its own) */
    atomic_uint_fast64_t batches, batched;
};

/* ---------------------------------------------------------------- CRC16 (XMODEM) */

static uint16_t crc16(const char *s, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)s[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

unsigned kvp__redis_slot(const char *tag, size_t len)
{
    return crc16(tag, len) & (NSLOTS - 1);
}

/* ---------------------------------------------------------------- nodes */

/* The node host:port, added when new. Caller holds c->lock. NULL: table full. */
static struct rnode *node_get_locked(struct kvp__rconn *c, const char *host, size_t hlen, int port,
                                     size_t *index)
{
    for (size_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->port == port && strlen(c->nodes[i]->host) == hlen &&
            !memcmp(c->nodes[i]->host, host, hlen)) {
            if (index)
                *index = i;
            return c->nodes[i];
        }
    if (c->nnodes == MAX_NODES)
        return NULL;
    struct rnode *n = calloc(1, sizeof *n);
    if (!n || !(n->host = strndup(host, hlen))) {
        free(n);
        return NULL;
    }
    n->port = port;
    snprintf(n->name, sizeof n->name, "%.64s:%d", n->host, port);
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->qlock, NULL);
    n->qtail = &n->qhead;
    if (index)
        *index = c->nnodes;
    c->nodes[c->nnodes++] = n;
    return n;
}

static void drop_idle(struct rnode *n)
{
    pthread_mutex_lock(&n->lock);
    redisContext *idle[POOL_IDLE];
    int k = n->nidle;
    memcpy(idle, n->idle, sizeof idle);
    n->nidle = 0;
    pthread_mutex_unlock(&n->lock);
    for (int i = 0; i < k; i++)
        redisFree(idle[i]);
}

/* The failure of a context (no reply) as a negative errno and a message. */
static int ctx_error(const struct kvp__rconn *c, const struct rnode *n, const redisContext *x,
                     int saved_errno, struct kvp_error *err)
{
    int rc;
    const char *why = x ? x->errstr : "cannot allocate a connection";
    char buf[96];
    if (!x) {
        rc = -ENOMEM;
    } else if (x->err == REDIS_ERR_EOF) {
        rc = -ECONNRESET;
        why = "the server closed the connection";
    } else if (x->err == REDIS_ERR_IO) {
        rc = saved_errno ? -saved_errno : -EIO;
        if (rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -EINPROGRESS) {
            rc = -ETIMEDOUT;
            snprintf(buf, sizeof buf, "no answer within %u ms", c->cfg.timeout_ms);
            why = buf;
        }
    } else if (x->err == REDIS_ERR_OOM) {
        rc = -ENOMEM;
    } else {
        rc = -EIO;
        /* hiredis reports a failed name lookup or connect as OTHER */
        if (strstr(why, "refused"))
            rc = -ECONNREFUSED;
        else if (strstr(why, "timed out"))
            rc = -ETIMEDOUT;
    }
    kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, 0, 0, "redis %s: %s", n->name, why);
    return rc;
}

/* An error reply as a negative errno. */
static int reply_error(const struct rnode *n, const redisReply *r, struct kvp_error *err)
{
    int rc = -EIO;
    if (!strncmp(r->str, "OOM", 3))
        rc = -ENOSPC;
    else if (!strncmp(r->str, "NOAUTH", 6) || !strncmp(r->str, "WRONGPASS", 9) ||
             !strncmp(r->str, "NOPERM", 6))
        rc = -EACCES;
    else if (!strncmp(r->str, "LOADING", 7) || !strncmp(r->str, "BUSY", 4) ||
             !strncmp(r->str, "TRYAGAIN", 8) || !strncmp(r->str, "CLUSTERDOWN", 11) ||
             !strncmp(r->str, "READONLY", 8) || !strncmp(r->str, "MASTERDOWN", 10))
        rc = -EAGAIN; /* READONLY: a demoted master, shortly a replica of the new one */
    kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, 0, 0, "redis %s: %.200s", n->name, r->str);
    return rc;
}

static struct timeval tv_ms(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* ------------------------------------------------------------ replies, commands */

/* Replies are built by this layer's own reader functions, not hiredis's: a
 * node and its string in one allocation (hiredis: a calloc, a malloc and,
 * for an array, a calloc of its elements), and small nodes (the page numbers
 * and nils of an HMGET) taken from a per-thread cache of free ones instead of
 * malloc (a 64-key reply frees 65 nodes at once, far more than glibc's
 * per-thread cache keeps). Freed with kvp__rreply_free, never
 * freeReplyObject. */
#define RR_SMALL 96       /* bytes of a cached node: header, reply and a short string */
#define RR_CACHE_MAX 2048 /* free nodes kept per thread (192 KiB) */

struct rr_hdr {
    struct rr_hdr *next; /* in the thread's cache */
    size_t small;
};

/* A thread's cache, held as its thread-specific value (heap memory, freed
 * with its nodes when the thread ends; not _Thread_local, whose block in a
 * dlopen'ed library the thread's exit frees behind the destructor's back). */
struct rr_cache {
    struct rr_hdr *head;
    size_t n;
};

static pthread_key_t rr_key;
static pthread_once_t rr_once = PTHREAD_ONCE_INIT;
static _Atomic int rr_key_ok;

static void rr_cache_drop(void *arg)
{
    struct rr_cache *c = arg;
    while (c->head) {
        struct rr_hdr *h = c->head;
        c->head = h->next;
        free(h);
    }
    free(c);
}

static void rr_key_make(void)
{
    atomic_store_explicit(&rr_key_ok, pthread_key_create(&rr_key, rr_cache_drop) == 0,
                          memory_order_release);
}

/* The calling thread's cache (made when make is set), or NULL. */
static struct rr_cache *rr_cache_of_thread(int make)
{
    if (!atomic_load_explicit(&rr_key_ok, memory_order_acquire)) {
        pthread_once(&rr_once, rr_key_make);
        if (!atomic_load_explicit(&rr_key_ok, memory_order_acquire))
            return NULL;
    }
    struct rr_cache *c = pthread_getspecific(rr_key);
    if (!c && make && (c = calloc(1, sizeof *c)) != NULL && pthread_setspecific(rr_key, c) != 0) {
        free(c);
        c = NULL;
    }
    return c;
}

static redisReply *rr_new(const redisReadTask *t, int type, size_t extra)
{
    size_t need = sizeof(struct rr_hdr) + sizeof(redisReply) + extra;
    struct rr_cache *c = need <= RR_SMALL ? rr_cache_of_thread(0) : NULL;
    struct rr_hdr *h;
    if (c && c->head) {
        h = c->head;
        c->head = h->next;
        c->n--;
    } else {
        h = malloc(need <= RR_SMALL ? RR_SMALL : need);
        if (!h)
            return NULL;
    }
    h->small = need <= RR_SMALL;
    redisReply *r = (redisReply *)(h + 1);
    memset(r, 0, sizeof *r);
    r->type = type;
    if (t && t->parent) {
        redisReply *up = t->parent->obj;
        up->element[t->idx] = r;
    }
    return r;
}

static void rr_free_in(struct rr_cache *c, redisReply *r)
{
    if (r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < r->elements; i++)
            if (r->element[i])
                rr_free_in(c, r->element[i]);
    struct rr_hdr *h = (struct rr_hdr *)r - 1;
    if (!h->small || !c || c->n >= RR_CACHE_MAX) {
        free(h);
        return;
    }
    h->next = c->head;
    c->head = h;
    c->n++;
}

void kvp__rreply_free(redisReply *r)
{
    if (r)
        rr_free_in(rr_cache_of_thread(1), r);
}

static void *rr_string(const redisReadTask *t, char *s, size_t len)
{
    redisReply *r = rr_new(t, t->type, len + 1);
    if (!r)
        return NULL;
    r->str = (char *)(r + 1);
    memcpy(r->str, s, len);
    r->str[len] = '\0';
    r->len = len;
    return r;
}

static void *rr_array(const redisReadTask *t, int elements)
{
    size_t n = elements > 0 ? (size_t)elements : 0;
    redisReply *r = rr_new(t, REDIS_REPLY_ARRAY, n * sizeof(redisReply *));
    if (!r)
        return NULL;
    r->element = n ? (redisReply **)(r + 1) : NULL;
    if (n)
        memset(r->element, 0, n * sizeof(redisReply *));
    r->elements = n;
    return r;
}

static void *rr_integer(const redisReadTask *t, long long v)
{
    redisReply *r = rr_new(t, REDIS_REPLY_INTEGER, 0);
    if (r)
        r->integer = v;
    return r;
}

static void *rr_nil(const redisReadTask *t)
{
    return rr_new(t, REDIS_REPLY_NIL, 0);
}

static void rr_free_obj(void *r)
{
    kvp__rreply_free(r);
}

static redisReplyObjectFunctions rr_fns = {
    .createString = rr_string,
    .createArray = rr_array,
    .createInteger = rr_integer,
    .createNil = rr_nil,
    .freeObject = rr_free_obj,
};

/* Every context of this layer: connected, replies built by rr_fns. */
static redisContext *rr_connect(const char *host, int port, struct timeval tv)
{
    redisContext *x = redisConnectWithTimeout(host, port, tv);
    if (x && !x->err)
        x->reader->fn = &rr_fns;
    return x;
}

/* Appends a command to x's output in the protocol's form, as
 * redisAppendCommandArgv does but in one pass over one buffer (hiredis builds
 * it with an sds printf per argument). */
static int append_argv(redisContext *x, int argc, const char **argv, const size_t *lens)
{
    size_t total = 16;
    for (int i = 0; i < argc; i++)
        total += 26 + (lens ? lens[i] : strlen(argv[i]));
    char stack[4096];
    char *buf = total <= sizeof stack ? stack : malloc(total);
    if (!buf)
        return REDIS_ERR;
    char *p = buf + sprintf(buf, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        size_t len = lens ? lens[i] : strlen(argv[i]);
        char num[24], *q = num + sizeof num;
        size_t v = len;
        do
            *--q = (char)('0' + v % 10);
        while (v /= 10);
        *p++ = '$';
        memcpy(p, q, (size_t)(num + sizeof num - q));
        p += num + sizeof num - q;
        *p++ = '\r', *p++ = '\n';
        memcpy(p, argv[i], len);
        p += len;
        *p++ = '\r', *p++ = '\n';
    }
    int rc = redisAppendFormattedCommand(x, buf, (size_t)(p - buf));
    if (buf != stack)
        free(buf);
    return rc;
}

/* Runs a command on a context just set up; 0 or the error (err set). */
static int setup_cmd(struct kvp__rconn *c, struct rnode *n, redisContext *x, int argc,
                     const char **argv, struct kvp_error *err)
{
    errno = 0;
    redisReply *r = redisCommandArgv(x, argc, argv, NULL);
    if (!r)
        return ctx_error(c, n, x, errno, err);
    int rc = r->type == REDIS_REPLY_ERROR ? reply_error(n, r, err) : 0;
    kvp__rreply_free(r);
    return rc;
}

/* A new context to n: connected, authenticated, on the database. */
static redisContext *node_connect(struct kvp__rconn *c, struct rnode *n, struct kvp_error *err,
                                  int *rc)
{
    atomic_fetch_add(&c->connects, 1);
    errno = 0;
    redisContext *x = rr_connect(n->host, n->port, tv_ms(c->cfg.connect_timeout_ms));
    if (!x || x->err) {
        *rc = ctx_error(c, n, x, errno, err);
        if (x)
            redisFree(x);
        return NULL;
    }
    if (redisSetTimeout(x, tv_ms(c->cfg.timeout_ms)) != REDIS_OK) {
        *rc = ctx_error(c, n, x, errno, err);
        redisFree(x);
        return NULL;
    }
    redisEnableKeepAlive(x);
    *rc = 0;
    if (c->cfg.pass) {
        const char *a[3] = {"AUTH", c->cfg.user ? c->cfg.user : c->cfg.pass, c->cfg.pass};
        *rc = setup_cmd(c, n, x, c->cfg.user ? 3 : 2, a, err);
    }
    if (!*rc && c->cfg.db) {
        char db[16];
        snprintf(db, sizeof db, "%d", c->cfg.db);
        const char *a[2] = {"SELECT", db};
        *rc = setup_cmd(c, n, x, 2, a, err);
    }
    if (*rc) {
        if (*rc == -EACCES)
            kvp__set_err(err, *rc, KVP_RULE_UNAVAILABLE, -1, 0, 0,
                         "redis %s: authentication failed (%.160s)", n->name, err ? err->msg : "");
        redisFree(x);
        return NULL;
    }
    return x;
}

/* An idle connection has nothing to read: readable (the server closed it,
 * as a restarted Redis has) or in error, it is dead. One poll, no wait. */
static int idle_dead(const redisContext *x)
{
    struct pollfd p = {.fd = x->fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

/* A connection to n: an idle one that is alive, else a new one. *fresh: new.
 * Finding the dead ones before a command is sent lets even an allocation
 * (never repeated) go through after Redis restarted. */
static redisContext *node_take(struct kvp__rconn *c, struct rnode *n, int *fresh, uint64_t *epoch,
                               struct kvp_error *err, int *rc)
{
    for (;;) {
        pthread_mutex_lock(&n->lock);
        redisContext *x = n->nidle ? n->idle[--n->nidle] : NULL;
        *epoch = n->epoch;
        pthread_mutex_unlock(&n->lock);
        *rc = 0;
        if (!x) {
            *fresh = 1;
            return node_connect(c, n, err, rc);
        }
        if (!idle_dead(x)) {
            *fresh = 0;
            return x;
        }
        atomic_fetch_add(&c->failures, 1);
        redisFree(x);
    }
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A call failed for want of n (no connection, or it was lost or timed out):
 * the first failure of an outage is logged, the others only counted. */
static void node_failed(struct kvp__rconn *c, struct rnode *n, int rc, const struct kvp_error *err)
{
    int first = 0;
    pthread_mutex_lock(&n->lock);
    if (!n->down) {
        n->down = first = 1;
        n->epoch++;
        n->down_ms = mono_ms();
        n->down_calls = 0;
    }
    n->down_calls++;
    pthread_mutex_unlock(&n->lock);
    if (first && c->cfg.log) {
        char line[400];
        if (err && err->msg[0])
            snprintf(line, sizeof line, "%s: every call that needs it fails until it answers again",
                     err->msg);
        else
            snprintf(line, sizeof line,
                     "redis %s: %s: every call that needs it fails until it answers again", n->name,
                     kvp_strerror(rc));
        c->cfg.log(c->cfg.log_arg, 1, line);
    }
}

/* Gives x back after an answer to a call that began at epoch: a node that was
 * down answers again. */
static void node_put(struct kvp__rconn *c, struct rnode *n, redisContext *x, uint64_t epoch)
{
    uint64_t down_ms = 0, calls = 0;
    int back = 0;
    pthread_mutex_lock(&n->lock);
    if (!x->err && n->down && n->epoch == epoch) {
        n->down = 0;
        back = 1;
        down_ms = mono_ms() - n->down_ms;
        calls = n->down_calls;
    }
    if (!x->err && n->nidle < POOL_IDLE) {
        n->idle[n->nidle++] = x;
        x = NULL;
    }
    pthread_mutex_unlock(&n->lock);
    if (x)
        redisFree(x);
    if (back && c->cfg.log) {
        char line[200];
        snprintf(line, sizeof line,
                 "redis %s answers again, after %.1f s in which %llu call(s) failed for want of it",
                 n->name, (double)down_ms / 1000.0, (unsigned long long)calls);
        c->cfg.log(c->cfg.log_arg, 2, line);
    }
}

/* ---------------------------------------------------------------- the slot map */

/* Reads CLUSTER SLOTS from the first node that answers. 0, or the last error. */
static int refresh_map(struct kvp__rconn *c, struct kvp_error *err)
{
    int rc = -EIO;
    pthread_mutex_lock(&c->lock);
    size_t nn = c->nnodes;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < nn; i++) {
        pthread_mutex_lock(&c->lock);
        struct rnode *n = c->nodes[i];
        pthread_mutex_unlock(&c->lock);
        int fresh;
        uint64_t ep;
        redisContext *x = node_take(c, n, &fresh, &ep, err, &rc);
        if (!x)
            continue;
        errno = 0;
        redisReply *r = redisCommand(x, "CLUSTER SLOTS");
        if (!r) {
            rc = ctx_error(c, n, x, errno, err);
            redisFree(x);
            drop_idle(n);
            continue;
        }
        if (r->type != REDIS_REPLY_ARRAY) {
            rc = r->type == REDIS_REPLY_ERROR ? reply_error(n, r, err) : -EIO;
            kvp__rreply_free(r);
            node_put(c, n, x, ep);
            continue;
        }
        pthread_mutex_lock(&c->lock);
        memset(c->slots, NO_NODE, sizeof c->slots);
        for (size_t j = 0; j < r->elements; j++) {
            redisReply *e = r->element[j];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
                continue;
            redisReply *h = e->element[2]->element[0], *p = e->element[2]->element[1];
            long long lo = e->element[0]->integer, hi = e->element[1]->integer;
            /* An empty host is the node that answered. */
            const char *host = h->type == REDIS_REPLY_STRING && h->len ? h->str : n->host;
            size_t hl = h->type == REDIS_REPLY_STRING && h->len ? h->len : strlen(n->host);
            size_t idx;
            if (lo < 0 || hi >= NSLOTS || lo > hi || p->type != REDIS_REPLY_INTEGER ||
                !node_get_locked(c, host, hl, (int)p->integer, &idx))
                continue;
            memset(c->slots + lo, (int)idx, (size_t)(hi - lo + 1));
        }
        c->cluster = 1;
        pthread_mutex_unlock(&c->lock);
        kvp__rreply_free(r);
        node_put(c, n, x, ep);
        return 0;
    }
    return rc;
}

/* The node for slot: from the map in a cluster, else the first node. */
static struct rnode *node_for(struct kvp__rconn *c, int slot)
{
    pthread_mutex_lock(&c->lock);
    struct rnode *n = c->nodes[atomic_load(&c->master)];
    if (c->cluster && slot >= 0 && c->slots[slot] != NO_NODE)
        n = c->nodes[c->slots[slot]];
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the node named, added when new. */
static struct rnode *redirect_target(struct kvp__rconn *c, const char *msg, int moved)
{
    const char *sp = strchr(msg, ' ');
    const char *addr = sp ? strchr(sp + 1, ' ') : NULL;
    if (!addr)
        return NULL;
    long slot = strtol(sp + 1, NULL, 10);
    addr++;
    const char *colon = strrchr(addr, ':');
    if (!colon || slot < 0 || slot >= NSLOTS)
        return NULL;
    int port = atoi(colon + 1);
    pthread_mutex_lock(&c->lock);
    size_t idx;
    struct rnode *n = node_get_locked(c, addr, (size_t)(colon - addr), port, &idx);
    if (n && moved) {
        c->cluster = 1;
        c->slots[slot] = (uint8_t)idx;
    }
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* ---------------------------------------------------------------- Sentinel */

/* Whether n says it is a master (ROLE). 0, or -EAGAIN / the failure. */
static int check_master(struct kvp__rconn *c, struct rnode *n, struct kvp_error *err)
{
    int fresh, rc;
    uint64_t ep;
    redisContext *x = node_take(c, n, &fresh, &ep, err, &rc);
    if (!x)
        return rc;
    errno = 0;
    redisReply *r = redisCommand(x, "ROLE");
    if (!r) {
        rc = ctx_error(c, n, x, errno, err);
        redisFree(x);
        drop_idle(n);
        return rc;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        rc = reply_error(n, r, err);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
               r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "master")) {
        rc = -EAGAIN;
        kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, 0, 0,
                     "redis %s, named master of '%.64s' by the sentinels, is not a master (a "
                     "failover in progress)",
                     n->name, c->cfg.master_name);
    }
    kvp__rreply_free(r);
    node_put(c, n, x, ep);
    return rc;
}

/* The master's address from the sentinel at seed i: *host (to free) and
 * *port, or the reason in why. */
static int sentinel_master(struct kvp__rconn *c, size_t i, char **host, int *port, char *why,
                           size_t len)
{
    *host = NULL;
    errno = 0;
    redisContext *x = rr_connect(c->cfg.host[i], c->cfg.port[i], tv_ms(c->cfg.connect_timeout_ms));
    if (!x || x->err || redisSetTimeout(x, tv_ms(c->cfg.timeout_ms)) != REDIS_OK) {
        snprintf(why, len, "sentinel %.64s:%d: %s", c->cfg.host[i], c->cfg.port[i],
                 x ? x->errstr : "cannot allocate a connection");
        if (x)
            redisFree(x);
        return -ECONNREFUSED;
    }
    redisReply *r = redisCommand(x, "SENTINEL get-master-addr-by-name %s", c->cfg.master_name);
    int rc = -EIO;
    if (!r)
        snprintf(why, len, "sentinel %.64s:%d: %s", c->cfg.host[i], c->cfg.port[i], x->errstr);
    else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[1]->type == REDIS_REPLY_STRING) {
        *port = atoi(r->element[1]->str);
        if (*port > 0 && *port < 65536 && (*host = strdup(r->element[0]->str)))
            rc = 0;
        else
            snprintf(why, len, "sentinel %.64s:%d: a bad address", c->cfg.host[i], c->cfg.port[i]);
    } else if (r->type == REDIS_REPLY_NIL)
        snprintf(why, len, "sentinel %.64s:%d knows no master named '%.64s'", c->cfg.host[i],
                 c->cfg.port[i], c->cfg.master_name);
    else
        snprintf(why, len, "sentinel %.64s:%d: %.120s", c->cfg.host[i], c->cfg.port[i],
                 r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected answer");
    if (r)
        kvp__rreply_free(r);
    redisFree(x);
    return rc;
}

/*
 * Asks the sentinels, in order, for the master's address until one gives
 * an address that answers ROLE as a master, and makes it the master. One
 * call asks at a time; a call that began before the last question (since,
 * in mono_ms; 0: always ask) takes its answer. 0, or the failure.
 */
static int ask_sentinels(struct kvp__rconn *c, uint64_t since, struct kvp_error *err)
{
    pthread_mutex_lock(&c->ask_lock);
    if (since && atomic_load(&c->asked_ms) >= since) {
        pthread_mutex_unlock(&c->ask_lock);
        return 0;
    }
    atomic_fetch_add(&c->master_asks, 1);
    char why[256] = "no sentinel answered";
    int rc = -EIO;
    for (size_t i = 0; i < c->cfg.nseeds; i++) {
        char *host;
        int port;
        if ((rc = sentinel_master(c, i, &host, &port, why, sizeof why)) != 0)
            continue;
        size_t idx;
        pthread_mutex_lock(&c->lock);
        struct rnode *n = node_get_locked(c, host, strlen(host), port, &idx);
        pthread_mutex_unlock(&c->lock);
        free(host);
        struct kvp_error e = {0};
        if (!n) {
            rc = -ENOMEM;
            snprintf(why, sizeof why, "more than %d Redis nodes", MAX_NODES);
            continue;
        }
        if ((rc = check_master(c, n, &e)) != 0) {
            snprintf(why, sizeof why, "%s", e.msg);
            continue;
        }
        size_t old = atomic_exchange(&c->master, idx);
        atomic_store(&c->asked_ms, mono_ms());
        pthread_mutex_unlock(&c->ask_lock);
        if (old != idx && since) {
            atomic_fetch_add(&c->switches, 1);
            if (c->cfg.log) {
                char line[300];
                snprintf(line, sizeof line,
                         "redis sentinel: the master of '%.64s' is now %s (was %s); calls go "
                         "there",
                         c->cfg.master_name, n->name, c->nodes[old]->name);
                c->cfg.log(c->cfg.log_arg, 1, line);
            }
        }
        return 0;
    }
    atomic_store(&c->asked_ms, mono_ms());
    pthread_mutex_unlock(&c->ask_lock);
    kvp__set_err(err, rc ? rc : -EIO, KVP_RULE_UNAVAILABLE, -1, 0, 0,
                 "redis-sentinel: no master of '%.64s' answers (%s)", c->cfg.master_name, why);
    return rc ? rc : -EIO;
}

/* A call that began at since failed for want of n: with sentinels, asks
 * them again; 1 when the master is now another node (worth a retry). */
static int follow_master(struct kvp__rconn *c, struct rnode *n, uint64_t since)
{
    if (!c->sentinel)
        return 0;
    ask_sentinels(c, since, NULL);
    return node_for(c, -1) != n;
}

/* ---------------------------------------------------------------- WAIT */

/* Whether a command is a change (then ?wait= waits for it). */
static int cmd_writes(const struct kvp__rscript *s, int argc, const char **argv)
{
    static const char *const reads[] = {"ZSCORE", "ZRANGE", "ZCARD",  "HLEN",     "HGET", "HGETALL",
                                        "HMGET",  "HKEYS",  "PING",   "EXISTS",   "GET",  "ROLE",
                                        "HSCAN",  "XINFO",  "XRANGE", "XREVRANGE"};
    if (s)
        return s->change;
    for (size_t i = 0; argc > 0 && i < sizeof reads / sizeof *reads; i++)
        if (!strcasecmp(argv[0], reads[i]))
            return 0;
    return 1;
}

/* The answer to a WAIT sent on n (r NULL: x failed): 0 when enough
 * replicas have the change, else the failure. */
static int wait_result(struct kvp__rconn *c, struct rnode *n, redisContext *x, redisReply *r,
                       int saved_errno, struct kvp_error *err)
{
    if (!r)
        return ctx_error(c, n, x, saved_errno, err);
    atomic_fetch_add(&c->waits, 1);
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = reply_error(n, r, err);
    } else if (r->type != REDIS_REPLY_INTEGER || r->integer < c->cfg.wait_replicas) {
        long long got = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
        atomic_fetch_add(&c->wait_short, 1);
        rc = -ETIMEDOUT;
        kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, got, c->cfg.wait_replicas,
                     "redis %s: the change reached %lld of the %d replica(s) that wait= asks "
                     "for within %u ms; it is applied on the master and a failover may lose it",
                     n->name, got, c->cfg.wait_replicas, c->cfg.wait_ms);
    }
    kvp__rreply_free(r);
    return rc;
}

/* The read timeout while a WAIT may block: its own time on top. */
static uint32_t wait_timeout(const struct kvp__rconn *c)
{
    return c->cfg.timeout_ms + c->cfg.wait_ms;
}

/* Sends WAIT on x after a write and reads its answer. */
static int wait_replicas(struct kvp__rconn *c, struct rnode *n, redisContext *x,
                         struct kvp_error *err)
{
    redisSetTimeout(x, tv_ms(wait_timeout(c)));
    errno = 0;
    redisReply *r = redisCommand(x, "WAIT %d %u", c->cfg.wait_replicas, c->cfg.wait_ms);
    int e = errno;
    if (r)
        redisSetTimeout(x, tv_ms(c->cfg.timeout_ms));
    return wait_result(c, n, x, r, e, err);
}

/* ---------------------------------------------------------------- combining */

/* Sends a batch of jobs on one connection to n, pipelined, and reads their
 * answers (and WAITs) in order. A connection that fails fails the jobs not
 * yet answered, marked sent or not. */
static void run_batch(struct kvp__rconn *c, struct rnode *n, struct rjob *batch)
{
    int fresh, rc;
    uint64_t ep;
    struct kvp_error e = {0};
    redisContext *x = node_take(c, n, &fresh, &ep, &e, &rc);
    size_t k = 0;
    int waiting = 0;
    for (struct rjob *j = batch; j; j = j->next) {
        k++;
        waiting |= j->wait;
        if (!x) {
            j->rc = rc, j->err = e, j->sent = 0;
            continue;
        }
        append_argv(x, j->argc, j->argv, j->lens);
        if (j->wait)
            redisAppendCommand(x, "WAIT %d %u", c->cfg.wait_replicas, c->cfg.wait_ms);
    }
    if (!x)
        return;
    atomic_fetch_add(&c->batches, 1);
    atomic_fetch_add(&c->batched, k);
    if (waiting)
        redisSetTimeout(x, tv_ms(wait_timeout(c)));
    for (struct rjob *j = batch; j; j = j->next) {
        if (!x) { /* after the connection failed: maybe sent, maybe run */
            j->rc = rc, j->err = e, j->sent = 1, j->fresh = fresh;
            continue;
        }
        redisReply *r = NULL;
        errno = 0;
        if (redisGetReply(x, (void **)&r) != REDIS_OK || !r) {
            j->rc = ctx_error(c, n, x, errno, &j->err);
        } else {
            j->reply = r;
            if (j->wait) {
                redisReply *w = NULL;
                errno = 0;
                if (redisGetReply(x, (void **)&w) != REDIS_OK)
                    w = NULL;
                j->wait_rc = wait_result(c, n, x, w, errno, &j->err);
            }
        }
        if (x->err) {
            rc = j->rc ? j->rc : j->wait_rc, e = j->err;
            j->sent = 1, j->fresh = fresh;
            redisFree(x);
            x = NULL;
            drop_idle(n);
        }
    }
    if (x) {
        if (waiting)
            redisSetTimeout(x, tv_ms(c->cfg.timeout_ms));
        node_put(c, n, x, ep);
    }
}

/* Runs jobs (a list) on n, combined with other calls' jobs for n. */
static void combine(struct kvp__rconn *c, struct rnode *n, struct rjob *jobs)
{
    pthread_cond_t cv;
    pthread_cond_init(&cv, NULL);
    struct rjob *last = jobs;
    for (struct rjob *j = jobs; j; j = j->next) {
        j->cv = &cv;
        last = j;
    }
    pthread_mutex_lock(&n->qlock);
    *n->qtail = jobs;
    n->qtail = &last->next;
    for (;;) {
        int done = 1;
        for (struct rjob *j = jobs; j && done; j = j == last ? NULL : j->next)
            done = j->done;
        if (done)
            break;
        if (n->combining < MAX_COMBINERS && n->qhead) {
            struct rjob *batch = n->qhead;
            n->qhead = NULL;
            n->qtail = &n->qhead;
            n->combining++;
            pthread_mutex_unlock(&n->qlock);
            run_batch(c, n, batch);
            pthread_mutex_lock(&n->qlock);
            for (struct rjob *j = batch, *nx; j; j = nx) {
                nx = j->next;
                j->done = 1;
                if (j->cv != &cv && (!nx || nx->cv != j->cv))
                    pthread_cond_signal(j->cv);
            }
            n->combining--;
            if (n->qhead) /* the next batch's first caller combines it */
                pthread_cond_signal(n->qhead->cv);
        } else {
            pthread_cond_wait(&cv, &n->qlock);
        }
    }
    pthread_mutex_unlock(&n->qlock);
    pthread_cond_destroy(&cv);
}

/* An error reply that says the command was not run (safe to send again). */
static int not_run(const redisReply *r)
{
    static const char *const p[] = {"MOVED ",   "ASK ",        "NOSCRIPT",   "READONLY", "LOADING",
                                    "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "BUSY "};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        if (!strncmp(r->str, p[i], strlen(p[i])))
            return 1;
    return 0;
}

/* ---------------------------------------------------------------- commands */

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The script's SHA as last learnt ("" until loaded): 1 when known. */
static int script_sha(struct kvp__rconn *c, const struct kvp__rscript *s, char sha[41])
{
    pthread_mutex_lock(&c->lock);
    memcpy(sha, s->sha, 41);
    pthread_mutex_unlock(&c->lock);
    return sha[0] != 0;
}

static int load_script(struct kvp__rconn *c, struct rnode *n, redisContext *x,
                       struct kvp__rscript *s, struct kvp_error *err)
{
    atomic_fetch_add(&c->script_loads, 1);
    errno = 0;
    redisReply *r = redisCommand(x, "SCRIPT LOAD %s", s->body);
    if (!r)
        return ctx_error(c, n, x, errno, err);
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = reply_error(n, r, err);
    } else if (r->type != REDIS_REPLY_STRING || r->len != 40) {
        rc = -EIO;
        kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, 0, 0,
                     "redis %s: unexpected answer to SCRIPT LOAD", n->name);
    } else {
        pthread_mutex_lock(&c->lock);
        memcpy(s->sha, r->str, 40);
        s->sha[40] = '\0';
        pthread_mutex_unlock(&c->lock);
    }
    kvp__rreply_free(r);
    return rc;
}

/* One call of kvp__rconn_cmd: what its tries share. rc is the call's
 * status so far, *out its reply. */
struct cmd_call {
    struct kvp__rconn *c;
    struct kvp__rscript *script;
    int idempotent, argc;
    const char **argv;
    const size_t *lens;
    size_t *l; /* lens, writable: argv[1]'s length is ours to set for a script */
    char sha[41];
    struct rnode *ask, *lost; /* lost: the last node whose connection was lost */
    uint64_t start, deadline;
    redisReply **out;
    struct kvp_error *err;
    int rc;
};

/* What a try tells the loop of kvp__rconn_cmd. */
enum { TRY_DONE, TRY_AGAIN };

/* The first try of a call: it shares a round trip with other calls to n;
 * what it meets (a redirection, an unloaded script, a failover) is dealt
 * with by a try of its own (try_alone). */
static int try_combined(struct cmd_call *k, struct rnode *n)
{
    struct kvp__rconn *c = k->c;
    if (k->script)
        k->argv[1] = k->sha, k->l[1] = 40;
    struct rjob j = {.argc = k->argc,
                     .argv = k->argv,
                     .lens = k->lens,
                     .wait = c->cfg.wait_replicas && cmd_writes(k->script, k->argc, k->argv)};
    combine(c, n, &j);
    if (j.rc) {
        atomic_fetch_add(&c->failures, 1);
        if (k->err)
            *k->err = j.err;
        k->rc = j.rc;
        if (!j.sent) { /* as a failed connect in try_alone */
            node_failed(c, n, k->rc, k->err);
            if (k->rc != -EACCES &&
                (c->cluster ? refresh_map(c, NULL) == 0 : follow_master(c, n, k->start)))
                return TRY_AGAIN;
            return TRY_DONE;
        }
        if (c->cluster && k->rc != -ETIMEDOUT) /* as a lost connection in lost_reply */
            refresh_map(c, NULL);
        if (k->rc != -ETIMEDOUT)
            follow_master(c, n, k->start);
        if (!j.fresh && k->idempotent && k->rc != -ETIMEDOUT) {
            k->lost = n;
            return TRY_AGAIN;
        }
        node_failed(c, n, k->rc, k->err);
        return TRY_DONE;
    }
    if (j.reply->type == REDIS_REPLY_ERROR) {
        int again = not_run(j.reply);
        k->rc = reply_error(n, j.reply, k->err);
        kvp__rreply_free(j.reply);
        return again ? TRY_AGAIN : TRY_DONE;
    }
    if (j.wait_rc) {
        kvp__rreply_free(j.reply);
        if (k->err)
            *k->err = j.err;
        k->rc = j.wait_rc;
        return TRY_DONE;
    }
    *k->out = j.reply;
    k->rc = 0;
    return TRY_DONE;
}

/* Sends the call on x (after an ASKING when redirected so) and reads its
 * reply: NULL when none came (errno as hiredis left it). */
static redisReply *send_alone(struct cmd_call *k, redisContext *x)
{
    struct kvp__rconn *c = k->c;
    int asking = 0;
    if (k->ask) {
        redisAppendCommand(x, "ASKING");
        asking = 1;
        k->ask = NULL;
    }
    /* A big batch is one script that Redis runs for about 10-30 us
     * per argument here: the answer is waited for that long too (50 us
     * an argument on top of the timeout), so that a valid request of
     * many keys is not cut off (and then applied unacknowledged). */
    uint32_t wait_ms = c->cfg.timeout_ms;
    if (c->cfg.timeout_ms && k->argc > 1000) {
        wait_ms = c->cfg.timeout_ms + (uint32_t)((uint64_t)k->argc * 50 / 1000);
        redisSetTimeout(x, tv_ms(wait_ms));
    }
    errno = 0;
    redisReply *r = NULL;
    if (append_argv(x, k->argc, k->argv, k->lens) != REDIS_OK ||
        redisGetReply(x, (void **)&r) != REDIS_OK)
        r = NULL;
    if (wait_ms != c->cfg.timeout_ms && r)
        redisSetTimeout(x, tv_ms(c->cfg.timeout_ms));
    if (r && asking) { /* the ASKING's +OK came first */
        kvp__rreply_free(r);
        r = NULL;
        if (redisGetReply(x, (void **)&r) != REDIS_OK)
            r = NULL;
    }
    return r;
}

/* No reply on x (fresh: a new connection), errno e: the connection is
 * gone; another try when that is safe. */
static int lost_reply(struct cmd_call *k, struct rnode *n, redisContext *x, int fresh, int e)
{
    struct kvp__rconn *c = k->c;
    atomic_fetch_add(&c->failures, 1);
    k->rc = ctx_error(c, n, x, e, k->err);
    redisFree(x);
    drop_idle(n); /* its siblings are likely dead too */
    /* A lost connection may be a failover: read the map again. A
     * timeout is a slow node, whose slots have not moved (and
     * asking it again would wait as long once more). */
    if (c->cluster && k->rc != -ETIMEDOUT && mono_ms() < k->deadline)
        refresh_map(c, NULL);
    if (k->rc != -ETIMEDOUT)
        follow_master(c, n, k->start);
    /* A pooled connection found dead (the server restarted): the
     * command may not have reached it, and an idempotent one is
     * safe to send again anyway. A timeout is not repeated. */
    if (!fresh && k->idempotent && k->rc != -ETIMEDOUT) {
        k->lost = n;
        return TRY_AGAIN;
    }
    node_failed(c, n, k->rc, k->err);
    return TRY_DONE;
}

/* An error reply r on x (epoch ep) at the attempt-th try: a redirection,
 * a script to load or a refusal worth another try, else the call's error. */
static int error_reply(struct cmd_call *k, struct rnode *n, redisContext *x, uint64_t ep,
                       redisReply *r, int attempt)
{
    struct kvp__rconn *c = k->c;
    if (!strncmp(r->str, "MOVED ", 6) || !strncmp(r->str, "ASK ", 4)) {
        int moved = r->str[0] == 'M';
        struct rnode *t = redirect_target(c, r->str, moved);
        atomic_fetch_add(&c->redirects, 1);
        k->rc = reply_error(n, r, k->err);
        kvp__rreply_free(r);
        node_put(c, n, x, ep);
        if (!t)
            return TRY_DONE;
        if (!moved)
            k->ask = t;
        return TRY_AGAIN;
    }
    if (k->script && !strncmp(r->str, "NOSCRIPT", 8)) {
        kvp__rreply_free(r);
        k->rc = load_script(c, n, x, k->script, k->err);
        node_put(c, n, x, ep);
        return k->rc ? TRY_DONE : TRY_AGAIN;
    }
    k->rc = reply_error(n, r, k->err);
    kvp__rreply_free(r);
    node_put(c, n, x, ep);
    if (k->rc == -EAGAIN && attempt + 1 < MAX_ATTEMPTS) {
        if (c->cluster && mono_ms() < k->deadline)
            refresh_map(c, NULL);
        /* READONLY: Redis refused it, so it is safe to send again. */
        if (follow_master(c, n, k->start))
            return TRY_AGAIN;
        sleep_ms(20L << attempt); /* a failover or a loading node: shortly */
        return TRY_AGAIN;
    }
    return TRY_DONE;
}

/* A try of its own on a connection to n, the attempt-th. */
static int try_alone(struct cmd_call *k, struct rnode *n, int attempt)
{
    struct kvp__rconn *c = k->c;
    int fresh;
    uint64_t ep;
    redisContext *x = node_take(c, n, &fresh, &ep, k->err, &k->rc);
    if (!x) {
        atomic_fetch_add(&c->failures, 1);
        node_failed(c, n, k->rc, k->err);
        /* Nothing was sent. In a cluster another node may now serve the
         * slot (a failover): read the map again and retry. */
        if (c->cluster && k->rc != -EACCES && attempt < 2 && mono_ms() < k->deadline &&
            refresh_map(c, NULL) == 0)
            return TRY_AGAIN;
        /* With sentinels: a failover may have named another master. */
        if (k->rc != -EACCES && attempt < 2 && follow_master(c, n, k->start))
            return TRY_AGAIN;
        return TRY_DONE;
    }
    if (k->script) {
        if (!k->sha[0]) {
            if ((k->rc = load_script(c, n, x, k->script, k->err)) != 0) {
                node_put(c, n, x, ep);
                return TRY_DONE;
            }
            script_sha(c, k->script, k->sha);
        }
        k->argv[1] = k->sha;
        k->l[1] = 40;
    }
    redisReply *r = send_alone(k, x);
    if (!r)
        return lost_reply(k, n, x, fresh, errno);
    if (r->type == REDIS_REPLY_ERROR)
        return error_reply(k, n, x, ep, r, attempt);
    if (c->cfg.wait_replicas && cmd_writes(k->script, k->argc, k->argv) &&
        (k->rc = wait_replicas(c, n, x, k->err)) != 0) {
        kvp__rreply_free(r);
        if (x->err) {
            redisFree(x);
            drop_idle(n);
        } else {
            node_put(c, n, x, ep);
        }
        return TRY_DONE;
    }
    node_put(c, n, x, ep);
    *k->out = r;
    k->rc = 0;
    return TRY_DONE;
}

int kvp__rconn_cmd(struct kvp__rconn *c, int slot, struct kvp__rscript *script, int idempotent,
                   int argc, const char **argv, const size_t *lens, redisReply **out,
                   struct kvp_error *err)
{
    *out = NULL;
    struct cmd_call k = {.c = c,
                         .script = script,
                         .idempotent = idempotent,
                         .argc = argc,
                         .argv = argv,
                         .lens = lens,
                         .l = (size_t *)lens,
                         .out = out,
                         .err = err,
                         .rc = -EIO};
    /* Repeats (redirections, failovers, reloads) start only within one
     * connect and one command timeout of the call's start, so that a call
     * never takes much longer than a single try could. */
    k.start = mono_ms();
    k.deadline = k.start + c->cfg.connect_timeout_ms + c->cfg.timeout_ms;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        if (attempt && mono_ms() >= k.deadline)
            break;
        struct rnode *n = k.ask ? k.ask : node_for(c, slot);
        if (script)
            script_sha(c, script, k.sha);
        int combined = attempt == 0 && c->combine && argc <= 1000 && (!script || k.sha[0]);
        if ((combined ? try_combined(&k, n) : try_alone(&k, n, attempt)) == TRY_DONE)
            return k.rc;
    }
    int rc = k.rc ? k.rc : -EIO;
    if (k.lost)
        node_failed(c, k.lost, rc, err);
    if (err) {
        char last[sizeof err->msg];
        snprintf(last, sizeof last, "%s", err->msg);
        kvp__set_err(err, rc, KVP_RULE_UNAVAILABLE, -1, 0, 0, "%.200s (gave up after repeats)",
                     last);
    }
    return rc;
}

/* A multi command with its script's SHA in argv[1] (sha: its storage); 0
 * when the script is not loaded yet (then it runs alone). */
static int with_sha(struct kvp__rconn *c, struct kvp__rcmd *cmd, char sha[41])
{
    if (!cmd->script)
        return 1;
    if (!script_sha(c, cmd->script, sha))
        return 0;
    cmd->argv[1] = sha;
    cmd->lens[1] = 40;
    return 1;
}

/* kvp__rconn_multi's commands for node nd (nidx d), combined with other
 * calls' commands: state[] and cmds[] as there; a node that cannot be
 * reached sets down and down_rc. */
static void multi_combined(struct kvp__rconn *c, struct rnode *nd, size_t d, struct kvp__rcmd *cmds,
                           size_t n, const uint8_t *nidx, uint8_t *state, char (*sha)[41],
                           struct kvp_error *down, int *down_rc)
{
    size_t k = 0, m = 0;
    for (size_t j = 0; j < n; j++)
        k += nidx[j] == d;
    struct rjob *jobs = calloc(k ? k : 1, sizeof *jobs);
    size_t *which = malloc((k ? k : 1) * sizeof *which);
    struct rjob *head = NULL, **tail = &head;
    for (size_t j = 0; jobs && which && j < n; j++) {
        if (nidx[j] != d)
            continue;
        if (!with_sha(c, &cmds[j], sha[j]))
            continue; /* loaded by kvp__rconn_cmd, alone */
        jobs[m] = (struct rjob){.argc = cmds[j].argc,
                                .argv = cmds[j].argv,
                                .lens = cmds[j].lens,
                                .wait = c->cfg.wait_replicas &&
                                        cmd_writes(cmds[j].script, cmds[j].argc, cmds[j].argv)};
        *tail = &jobs[m];
        tail = &jobs[m].next;
        which[m++] = j;
    }
    if (head)
        combine(c, nd, head);
    int timed_out = 0;
    struct kvp_error te = {0};
    for (size_t i = 0; i < m; i++) {
        struct rjob *b = &jobs[i];
        size_t j = which[i];
        if (b->rc && !b->sent) {
            *down_rc = b->rc, *down = b->err; /* state 0: failed below with the node */
        } else if (b->rc == -ETIMEDOUT) {
            state[j] = 3, cmds[j].rc = b->rc, cmds[j].err = b->err;
            timed_out = 1, te = b->err;
        } else if (b->rc) {
            /* lost: alone below (every command here is idempotent) */
        } else if (b->reply->type == REDIS_REPLY_ERROR) {
            kvp__rreply_free(b->reply); /* MOVED, NOSCRIPT, ...: alone below */
        } else if (b->wait_rc) {
            kvp__rreply_free(b->reply);
            state[j] = 3, cmds[j].rc = b->wait_rc, cmds[j].err = b->err;
        } else {
            cmds[j].reply = b->reply;
            state[j] = 2;
        }
    }
    if (*down_rc) {
        atomic_fetch_add(&c->failures, 1);
        node_failed(c, nd, *down_rc, down);
    }
    if (timed_out)
        node_failed(c, nd, -ETIMEDOUT, &te);
    free(jobs);
    free(which);
}

/* kvp__rconn_multi's commands for node nd (nidx d), pipelined on one
 * connection of its own: state[] and cmds[] as there. 1 when the node
 * cannot be reached (down and down_rc say why), else 0. */
static int multi_pipelined(struct kvp__rconn *c, struct rnode *nd, size_t d, struct kvp__rcmd *cmds,
                           size_t n, const uint8_t *nidx, uint8_t *state, char (*sha)[41],
                           struct kvp_error *down, int *down_rc)
{
    int fresh;
    uint64_t ep; /* the node's epoch at the call (node_put) */
    redisContext *x = node_take(c, nd, &fresh, &ep, down, down_rc);
    if (!x) {
        atomic_fetch_add(&c->failures, 1);
        node_failed(c, nd, *down_rc, down);
        return 1;
    }
    for (size_t j = 0; j < n; j++) {
        if (nidx[j] != d)
            continue;
        if (!with_sha(c, &cmds[j], sha[j]))
            continue; /* loaded by kvp__rconn_cmd below */
        if (append_argv(x, cmds[j].argc, cmds[j].argv, cmds[j].lens) == REDIS_OK)
            state[j] = 1;
    }
    /* ?wait=: one WAIT after the node's commands covers them all. */
    int waiting = 0;
    for (size_t j = 0; c->cfg.wait_replicas && j < n && !waiting; j++)
        waiting =
            nidx[j] == d && state[j] == 1 && cmd_writes(cmds[j].script, cmds[j].argc, cmds[j].argv);
    if (waiting) {
        redisAppendCommand(x, "WAIT %d %u", c->cfg.wait_replicas, c->cfg.wait_ms);
        redisSetTimeout(x, tv_ms(wait_timeout(c)));
    }
    for (size_t j = 0; j < n && x; j++) {
        if (nidx[j] != d || state[j] != 1)
            continue;
        redisReply *r = NULL;
        errno = 0;
        if (redisGetReply(x, (void **)&r) != REDIS_OK || !r) {
            struct kvp_error e = {0};
            int rc = ctx_error(c, nd, x, errno, &e);
            atomic_fetch_add(&c->failures, 1);
            redisFree(x);
            x = NULL;
            drop_idle(nd);
            /* A timeout is not repeated: the node's other commands
             * fail with it instead of waiting as long once more each. */
            if (rc == -ETIMEDOUT)
                node_failed(c, nd, rc, &e);
            for (size_t k = j; rc == -ETIMEDOUT && k < n; k++)
                if (nidx[k] == d && state[k] == 1)
                    state[k] = 3, cmds[k].rc = rc, cmds[k].err = e;
            for (size_t k = j; k < n; k++)
                if (nidx[k] == d && state[k] == 1)
                    state[k] = 0;
            break;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            kvp__rreply_free(r); /* MOVED, NOSCRIPT, ...: alone below */
            state[j] = 0;
        } else {
            cmds[j].reply = r;
            state[j] = 2;
        }
    }
    if (x && waiting) {
        redisReply *r = NULL;
        errno = 0;
        if (redisGetReply(x, (void **)&r) != REDIS_OK)
            r = NULL;
        struct kvp_error e = {0};
        int rc = wait_result(c, nd, x, r, errno, &e);
        if (!x->err)
            redisSetTimeout(x, tv_ms(c->cfg.timeout_ms));
        for (size_t k = 0; rc && k < n; k++)
            if (nidx[k] == d && state[k] == 2 &&
                cmd_writes(cmds[k].script, cmds[k].argc, cmds[k].argv)) {
                kvp__rreply_free(cmds[k].reply);
                cmds[k].reply = NULL;
                state[k] = 3, cmds[k].rc = rc, cmds[k].err = e;
            }
        if (x->err) {
            redisFree(x);
            x = NULL;
            drop_idle(nd);
        }
    }
    if (x)
        node_put(c, nd, x, ep);
    return 0;
}

int kvp__rconn_multi(struct kvp__rconn *c, struct kvp__rcmd *cmds, size_t n, struct kvp_error *err)
{
    uint64_t start = mono_ms();
    uint8_t *nidx = malloc(n ? n : 1); /* each command's place in nodes[] below */
    /* 0 to run alone, 1 sent, 2 answered, 3 failed (cmds[].rc, .err) */
    uint8_t *state = calloc(n ? n : 1, 1);
    char(*sha)[41] = malloc((n ? n : 1) * sizeof *sha);
    struct rnode *nodes[MAX_NODES];
    struct kvp_error down[MAX_NODES]; /* why a node could not be reached */
    int down_rc[MAX_NODES] = {0};
    size_t nn = 0;
    for (size_t i = 0; nidx && i < n; i++) {
        cmds[i].reply = NULL;
        cmds[i].rc = 0;
        struct rnode *nd = node_for(c, cmds[i].slot);
        size_t d = 0;
        while (d < nn && nodes[d] != nd)
            d++;
        if (d == nn)
            nodes[nn++] = nd;
        nidx[i] = (uint8_t)d;
    }
    int any_down = 0;
    for (size_t d = 0; nidx && state && sha && d < nn; d++) {
        memset(&down[d], 0, sizeof down[d]);
        if (c->combine) {
            multi_combined(c, nodes[d], d, cmds, n, nidx, state, sha, &down[d], &down_rc[d]);
            any_down |= down_rc[d] != 0;
            continue;
        }
        if (multi_pipelined(c, nodes[d], d, cmds, n, nidx, state, sha, &down[d], &down_rc[d]))
            any_down = 1;
    }
    /* A node that could not be reached: in a cluster its slots may have
     * moved (read the map once); the commands still meant for it fail with
     * its error rather than each trying to connect again. */
    if (any_down && c->cluster)
        refresh_map(c, NULL);
    if (any_down && c->sentinel)
        ask_sentinels(c, start, NULL);
    for (size_t i = 0; any_down && i < n; i++) {
        size_t d = nidx[i];
        if (down_rc[d] && state[i] == 0 && node_for(c, cmds[i].slot) == nodes[d])
            state[i] = 3, cmds[i].rc = down_rc[d], cmds[i].err = down[d];
    }
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!state || state[i] == 0 || (state[i] == 1)) /* alone, with redirections */
            cmds[i].rc = kvp__rconn_cmd(c, cmds[i].slot, cmds[i].script, 1, cmds[i].argc,
                                        cmds[i].argv, cmds[i].lens, &cmds[i].reply, &cmds[i].err);
        if (cmds[i].rc && !first) {
            first = cmds[i].rc;
            if (err)
                *err = cmds[i].err;
        }
    }
    free(sha);
    free(nidx);
    free(state);
    return first;
}

/* The masters: the nodes the slot map names (the first node outside a cluster). */
static size_t masters(struct kvp__rconn *c, struct rnode **out)
{
    size_t k = 0;
    pthread_mutex_lock(&c->lock);
    if (!c->cluster) {
        out[k++] = c->nodes[atomic_load(&c->master)];
    } else {
        uint8_t seen[MAX_NODES] = {0};
        for (size_t s = 0; s < NSLOTS; s++)
            if (c->slots[s] != NO_NODE && !seen[c->slots[s]]) {
                seen[c->slots[s]] = 1;
                out[k++] = c->nodes[c->slots[s]];
            }
        if (!k)
            out[k++] = c->nodes[0];
    }
    pthread_mutex_unlock(&c->lock);
    return k;
}

int kvp__rconn_each_master(struct kvp__rconn *c, int argc, const char **argv, kvp__rnode_fn fn,
                           void *arg)
{
    struct rnode *ms[MAX_NODES];
    size_t k = masters(c, ms);
    for (size_t i = 0; i < k; i++) {
        struct kvp_error e = {0};
        int fresh, rc;
        redisReply *r = NULL;
        uint64_t ep;
        uint64_t start = mono_ms();
        redisContext *x = node_take(c, ms[i], &fresh, &ep, &e, &rc);
        if (!x) {
            node_failed(c, ms[i], rc, &e);
            follow_master(c, ms[i], start); /* for the next call */
        }
        if (x) {
            errno = 0;
            r = redisCommandArgv(x, argc, argv, NULL);
            if (!r) {
                rc = ctx_error(c, ms[i], x, errno, &e);
                redisFree(x);
                drop_idle(ms[i]);
                node_failed(c, ms[i], rc, &e);
                follow_master(c, ms[i], start);
            } else {
                if (r->type == REDIS_REPLY_ERROR)
                    rc = reply_error(ms[i], r, &e);
                node_put(c, ms[i], x, ep);
            }
        }
        int stop = fn(arg, ms[i]->name, rc ? NULL : r, rc, &e);
        if (r)
            kvp__rreply_free(r);
        if (stop)
            return stop;
    }
    return 0;
}

struct ping_arg {
    char *why;
    size_t len;
    int rc;
};

static int ping_one(void *arg, const char *node, redisReply *reply, int rc,
                    const struct kvp_error *err)
{
    struct ping_arg *a = arg;
    (void)node;
    (void)reply;
    if (rc && !a->rc) {
        a->rc = rc;
        if (a->why && a->len)
            snprintf(a->why, a->len, "%s", err->msg);
    }
    return 0;
}

int kvp__rconn_ping(struct kvp__rconn *c, char *why, size_t len)
{
    struct ping_arg a = {why, len, 0};
    const char *argv[1] = {"PING"};
    kvp__rconn_each_master(c, 1, argv, ping_one, &a);
    return a.rc;
}

void kvp__rconn_stats(struct kvp__rconn *c, struct kvp__rconn_stats *s)
{
    s->connects = atomic_load(&c->connects);
    s->failures = atomic_load(&c->failures);
    s->redirects = atomic_load(&c->redirects);
    s->script_loads = atomic_load(&c->script_loads);
    s->waits = atomic_load(&c->waits);
    s->wait_short = atomic_load(&c->wait_short);
    s->master_asks = atomic_load(&c->master_asks);
    s->switches = atomic_load(&c->switches);
    s->batches = atomic_load(&c->batches);
    s->batched = atomic_load(&c->batched);
    pthread_mutex_lock(&c->lock);
    s->nodes = c->nnodes;
    snprintf(s->master, sizeof s->master, "%s",
             c->sentinel && c->nnodes ? c->nodes[atomic_load(&c->master)]->name : "");
    pthread_mutex_unlock(&c->lock);
}

/* ---------------------------------------------------------------- lifetime */

static void cfg_free(struct kvp__rcfg *cfg)
{
    free(cfg->user);
    free(cfg->pass);
    free(cfg->master_name);
    for (size_t i = 0; i < cfg->nseeds; i++)
        free(cfg->host[i]);
    memset(cfg, 0, sizeof *cfg);
}

int kvp__rconn_open(struct kvp__rconn **out, struct kvp__rcfg *cfg, struct kvp_error *err)
{
    *out = NULL;
    struct kvp__rconn *c = calloc(1, sizeof *c);
    if (!c) {
        cfg_free(cfg);
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    c->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->ask_lock, NULL);
    memset(c->slots, NO_NODE, sizeof c->slots);
    /* Off unless asked for: on the 2-core machine of bench/README.md the
     * waits on condition variables cost the server more than the round
     * trips they save (exists 10,400 vs 11,000-13,000 requests/s). */
    const char *comb = getenv("KVPAGE_REDIS_COMBINE");
    c->combine = comb && !strcmp(comb, "1");
    if (c->cfg.master_name) { /* the seeds are sentinels: the master is theirs to name */
        c->sentinel = 1;
        int rc = ask_sentinels(c, 0, err);
        if (rc) {
            kvp__rconn_close(c);
            return rc;
        }
        *out = c;
        return 0;
    }
    for (size_t i = 0; i < c->cfg.nseeds; i++)
        if (!node_get_locked(c, c->cfg.host[i], strlen(c->cfg.host[i]), c->cfg.port[i], NULL)) {
            kvp__rconn_close(c);
            kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
            return -ENOMEM;
        }
    /* One round trip to a seed: it answers (or says why not), and tells
     * whether it is a cluster node. */
    int rc = -EIO;
    for (size_t i = 0; i < c->nnodes; i++) {
        struct rnode *n = c->nodes[i];
        int fresh;
        uint64_t ep;
        redisContext *x = node_take(c, n, &fresh, &ep, err, &rc);
        if (!x)
            continue;
        errno = 0;
        redisReply *r = redisCommand(x, "INFO cluster");
        if (!r) {
            rc = ctx_error(c, n, x, errno, err);
            redisFree(x);
            continue;
        }
        int cl = r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_enabled:1");
        rc = r->type == REDIS_REPLY_ERROR ? reply_error(n, r, err) : 0;
        kvp__rreply_free(r);
        node_put(c, n, x, ep);
        if (rc)
            continue;
        if (cl || c->cfg.nseeds > 1) {
            if (c->cfg.db) {
                kvp__rconn_close(c);
                kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                             "redis location: a Redis Cluster has only database 0");
                return -EINVAL;
            }
            if ((rc = refresh_map(c, err)) != 0)
                continue;
        }
        break;
    }
    if (rc) {
        kvp__rconn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kvp__rconn_close(struct kvp__rconn *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nnodes; i++) {
        struct rnode *n = c->nodes[i];
        for (int j = 0; j < n->nidle; j++)
            redisFree(n->idle[j]);
        pthread_mutex_destroy(&n->lock);
        pthread_mutex_destroy(&n->qlock);
        free(n->host);
        free(n);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->ask_lock);
    cfg_free(&c->cfg);
    free(c);
}
