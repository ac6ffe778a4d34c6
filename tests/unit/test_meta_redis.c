/*
 * The redis:// backend (src/meta/redis/redis.c) against real Redis servers that
 * this test starts on free loopback ports (and kills, also when a check
 * fails):
 *
 *   - a differential run: one long random sequence of operations against
 *     mem: and against redis://, comparing every return code, every field
 *     of every error, every output, the stats and the invariant check after
 *     each step (lease long and read grace 0, so that time does not matter);
 *   - read grace and lease expiry, which do depend on time;
 *   - a rank of 2^31-1 pages costs nothing; two handles are one store;
 *     threads of two handles never hand one page to two keys; Redis killed
 *     and restarted; bad locations; kvp__redis_durability;
 *   - a three-master Redis Cluster: the protocol flows, a shorter
 *     differential run over ranks on different shards, and a slot moved to
 *     another master (MOVED).
 *
 *   test_meta_redis [steps] [seed]     (defaults: 2000 steps, seed 1; the cluster
 *                                       runs a third as many)
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>

#include "check.h"
#include "kvpage/meta.h"
#include "meta/backend.h"
#include "meta/redis/redis_conn.h"
#include "meta_diff.h"
#include "meta_drop.h"
#include "meta_test.h"
#include "mono.h"

/* ---------------------------------------------------------------- Redis servers */

#define MAX_SERVERS 8

struct server {
    pid_t pid;
    int port;
    char conf[64]; /* extra arguments, kept for a restart */
};

static struct server servers[MAX_SERVERS];
static char tmpdir[64];

/* A loopback port nobody listens on (and, for a cluster node, its bus port +10000). */
static int free_port(int cluster)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof a;
        if (fd < 0)
            return -1;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) ||
            getsockname(fd, (struct sockaddr *)&a, &l)) {
            close(fd);
            continue;
        }
        close(fd);
        int port = ntohs(a.sin_port);
        if (!cluster)
            return port;
        if (port > 55000)
            continue;
        fd = socket(AF_INET, SOCK_STREAM, 0);
        a.sin_port = htons((uint16_t)(port + 10000));
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return port;
    }
    return -1;
}

static redisContext *raw_connect(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c)
        redisSetTimeout(c, (struct timeval){5, 0});
    return c;
}

/* Runs a command on the server at port; its reply as text (integers too) in
 * out, or "" on failure. Returns 0, or -1. */
static int raw(int port, char *out, size_t len, const char *fmt, ...)
{
    redisContext *c = raw_connect(port);
    if (out && len)
        out[0] = '\0';
    if (!c)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    int rc = -1;
    if (r) {
        rc = r->type == REDIS_REPLY_ERROR ? -1 : 0;
        if (out && len) {
            if (r->type == REDIS_REPLY_INTEGER)
                snprintf(out, len, "%lld", r->integer);
            else if (r->str)
                snprintf(out, len, "%s", r->str);
            else if (r->type == REDIS_REPLY_ARRAY)
                snprintf(out, len, "%zu", r->elements);
        }
        freeReplyObject(r);
    }
    redisFree(c);
    return rc;
}

static int server_up(int port)
{
    char buf[16];
    return raw(port, buf, sizeof buf, "PING") == 0 && !strcmp(buf, "PONG");
}

/* Starts redis-server on port (0: a free one) in slot i; 0 or -1. */
static int server_start(int i, int port, const char *extra)
{
    for (int tries = 0; tries < 5; tries++) {
        int p = port ? port : free_port(extra && strstr(extra, "cluster") != NULL);
        char ps[16], dir[128];
        snprintf(ps, sizeof ps, "%d", p);
        snprintf(dir, sizeof dir, "%s", tmpdir);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open("/dev/null", O_RDWR);
            dup2(fd, 1);
            dup2(fd, 2);
            char conf[128];
            snprintf(conf, sizeof conf, "%s/nodes-%d.conf", tmpdir, p);
            char dbf[64];
            snprintf(dbf, sizeof dbf, "dump-%d.rdb", p);
            char aof[64];
            snprintf(aof, sizeof aof, "aof-%d", p);
            if (extra && strstr(extra, "cluster"))
                execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", dir, "--dbfilename", dbf,
                       "--appenddirname", aof, "--cluster-enabled", "yes", "--cluster-config-file",
                       conf, "--cluster-node-timeout", "30000", NULL);
            else
                execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1",
                       "--save", "", "--appendonly", "no", "--dir", dir, "--dbfilename", dbf,
                       "--appenddirname", aof, NULL);
            _exit(127);
        }
        if (pid < 0)
            return -1;
        for (int w = 0; w < 100; w++) {
            if (server_up(p)) {
                servers[i].pid = pid;
                servers[i].port = p;
                snprintf(servers[i].conf, sizeof servers[i].conf, "%s", extra ? extra : "");
                return 0;
            }
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid)
                break; /* it died: the port was taken meanwhile */
            sleep_ms(50);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        if (port)
            sleep_ms(200);
    }
    return -1;
}

static void server_kill(int i)
{
    if (servers[i].pid > 0) {
        kill(servers[i].pid, SIGKILL);
        waitpid(servers[i].pid, NULL, 0);
        servers[i].pid = 0;
    }
}

static void kill_all(void)
{
    for (int i = 0; i < MAX_SERVERS; i++)
        server_kill(i);
    if (tmpdir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
        tmpdir[0] = '\0';
    }
}

static void on_signal(int sig)
{
    for (int i = 0; i < MAX_SERVERS; i++)
        if (servers[i].pid > 0)
            kill(servers[i].pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---------------------------------------------------------------- time: grace and lease */

static void grace_and_lease(struct kvp_meta *m, const char *what)
{
    struct kvp_ns *ns = ns_of(m, "time", what);
    CHECK(ns != NULL);
    if (!ns)
        return;
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 2, NULL), 0);
    CHECK_EQ(put(ns, 0, "k1"), 0);
    CHECK_EQ(put(ns, 0, "k2"), 1);
    struct kvp_str k1 = K("k1"), k2 = K("k2"), k3 = K("k3"), k4 = K("k4");
    int64_t p;
    uint8_t ex;
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, &k1, 1, &p, NULL), 0); /* k1 in grace */
    CHECK_EQ(p, 0);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k2, 1, &p, &ex, NULL), 0); /* a hit: k1 is the LRU tail */
    CHECK_EQ(ex, 1);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k3, 1, &p, &ex, NULL), 0);
    CHECK_EQ(p, 1); /* k2 evicted: k1, older, is in its grace */
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k4, 1, &p, NULL, NULL), 0);
    CHECK_EQ(p, -1); /* k1 in grace, k3's page reserved */
    sleep_ms(1100);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k4, 1, &p, NULL, NULL), 0);
    CHECK_EQ(p, 0); /* the grace is over */
    /* Leases: k3's and k4's reservations run out. */
    sleep_ms(2800);
    struct kvp_str k5 = K("k5");
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k5, 1, &p, NULL, NULL), 0);
    CHECK_EQ(p, 0); /* most recently freed: k4's page 0 expired after k3's page 1 */
    struct diff_stats_copy s = {.len = 0};
    CHECK_EQ(kvp_meta_stats(m, diff_stats_fn, &s), 0);
    CHECK(strstr(s.text, " ex2 ") != NULL);
    if (!strstr(s.text, " ex2 "))
        fprintf(stderr, "%s stats: %s\n", what, s.text);
    invariants(m);
}

/* ---------------------------------------------------------------- threads */

#define THREADS 4
#define TKEYS 200

struct worker {
    struct kvp_ns *ns;
    int id;
    int fails;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char names[8][32];
    struct kvp_str keys[8];
    for (int it = 0; it < 150; it++) {
        for (int i = 0; i < 8; i++) {
            snprintf(names[i], sizeof names[i], "t-%d", (it * 8 + i + w->id * 3) % TKEYS);
            keys[i] = K(names[i]);
        }
        int64_t pages[8];
        uint8_t ex[8];
        struct kvp_error e = {0};
        if (kvp_meta_allocate(w->ns, 0, keys, 8, pages, ex, &e)) {
            w->fails++;
            continue;
        }
        struct kvp_str ck[8];
        int64_t cp[8];
        size_t nc = 0;
        for (int i = 0; i < 8; i++)
            if (pages[i] >= 0 && !ex[i])
                ck[nc] = keys[i], cp[nc++] = pages[i];
        int rc = kvp_meta_confirm(w->ns, 0, ck, cp, nc, NULL, 0, &e);
        /* Another thread's eviction may give a page to a key of its own
         * before this confirmation: that is the only refusal there may be. */
        if (rc && rc != -EEXIST)
            w->fails++;
    }
    return NULL;
}

/* Two handles of the state at loc (two servers' view of one state): 0, or
 * -1 with neither open (the failure checked). */
static int open_two(const char *loc, struct kvp_meta **a, struct kvp_meta **b)
{
    *a = diff_open(loc, 60000, 0);
    *b = diff_open(loc, 60000, 0);
    CHECK(*a && *b);
    if (*a && *b)
        return 0;
    kvp_meta_close(*a);
    kvp_meta_close(*b);
    return -1;
}

static void threads_test(const char *loc)
{
    struct kvp_meta *m1, *m2;
    if (open_two(loc, &m1, &m2))
        return;
    struct kvp_ns *n1 = ns_of(m1, "thr", "p"), *n2 = ns_of(m2, "thr", "p");
    CHECK_EQ(kvp_meta_init_rank(n1, 0, 64, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(n2, 0, 64, NULL), 0);
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){i % 2 ? n2 : n1, i, 0};
        pthread_create(&t[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].fails, 0);
    }
    invariants(m1);
    /* Every held page has one key: the pages of all keys are distinct. */
    char seen[64] = {0};
    int dup = 0, held = 0;
    for (int k = 0; k < TKEYS; k++) {
        char name[32];
        snprintf(name, sizeof name, "t-%d", k);
        struct kvp_str key = K(name);
        int64_t p;
        uint8_t e1, e2;
        CHECK_EQ(kvp_meta_lookup(n2, 0, 0, &key, 1, &p, NULL), 0);
        CHECK_EQ(kvp_meta_exists(n1, 0, &key, 1, &e1, NULL), 0);
        CHECK_EQ(kvp_meta_exists(n2, -1, &key, 1, &e2, NULL), 0);
        CHECK_EQ(e1, p >= 0);
        CHECK_EQ(e2, p >= 0);
        if (p >= 0 && p < 64) {
            dup += seen[p]++;
            held++;
        }
    }
    CHECK_EQ(dup, 0);
    CHECK(held > 0);
    kvp_meta_close(m1);
    kvp_meta_close(m2);
}

/* ---------------------------------------------------------------- single server */

static void bad_locations(void)
{
    static const char *const bad[][2] = {
        {"redis:127.0.0.1:6379", "redis://"},
        {"redis://", "no HOST:PORT"},
        {"redis://127.0.0.1:abc", "port 'abc'"},
        {"redis://127.0.0.1:0", "port '0'"},
        {"redis://127.0.0.1:70000", "port '70000'"},
        {"redis://:6379", "host 1 is empty"},
        {"redis://127.0.0.1:6379/x", "database 'x'"},
        {"redis://127.0.0.1:6379/-1", "database '-1'"},
        {"redis://127.0.0.1:6379?prefix=bad{x}", "prefix"},
        {"redis://127.0.0.1:6379?prefix=", "unknown parameter"},
        {"redis://127.0.0.1:6379?size=1", "unknown parameter 'size=1'"},
        {"redis://a:1,b:2/3", "only database 0"},
        {"redis://a:1,", "ends with a ','"},
        {"redis://u:p%zz@127.0.0.1:1", "password has a bad"},
        {"redis://[::1:6379", "IPv6"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct kvp_meta *m = NULL;
        struct kvp_error e = {0};
        int rc = kvp_meta_open_at(bad[i][0], NULL, &m, &e);
        CHECK_EQ(rc, -EINVAL);
        CHECK(m == NULL);
        CHECK(strstr(e.msg, bad[i][1]) != NULL);
        if (!strstr(e.msg, bad[i][1]))
            fprintf(stderr, "%s: '%s'\n", bad[i][0], e.msg);
    }
}

static char logged[256];
static void log_fn(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    snprintf(logged, sizeof logged, "%s", msg);
}

static void durability(int port, struct kvp_meta *m)
{
    char buf[128], out[64];
    /* Said once at open, through opts.log. */
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.log = log_fn;
    char loc[64];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d", port);
    struct kvp_meta *lm = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, &o, &lm, NULL), 0);
    CHECK(strstr(logged, "appendonly no, appendfsync everysec (changes since the last RDB save "
                         "may be lost)") != NULL);
    /* Described as the server's banner shows it, never with a password. */
    char d[512], want[160];
    snprintf(want, sizeof want,
             "Redis 127.0.0.1:%d db 0, prefix kvp (appendonly no, appendfsync everysec: changes "
             "since the last RDB save may be lost)",
             port);
    CHECK_EQ(kvp_meta_describe(lm, d, sizeof d), (int)strlen(want));
    CHECK(!strcmp(d, want));
    CHECK_EQ(kvp_meta_describe(lm, NULL, 0), (int)strlen(want));
    kvp_meta_close(lm);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET maxmemory-policy allkeys-lru"), 0);
    lm = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, &o, &lm, NULL), 0);
    CHECK(strstr(logged, "maxmemory-policy allkeys-lru may evict") != NULL);
    kvp_meta_close(lm);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET maxmemory-policy noeviction"), 0);
    CHECK_EQ(kvp__redis_durability(m, buf, sizeof buf), 0);
    CHECK(strstr(buf, "appendonly no") != NULL);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendonly yes"), 0);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendfsync everysec"), 0);
    CHECK_EQ(kvp__redis_durability(m, buf, sizeof buf), 1);
    CHECK(!strcmp(buf, "appendonly yes, appendfsync everysec"));
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendfsync always"), 0);
    CHECK_EQ(kvp__redis_durability(m, buf, sizeof buf), 2);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendfsync no"), 0);
    CHECK_EQ(kvp__redis_durability(m, buf, sizeof buf), 0);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendonly no"), 0);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET appendfsync everysec"), 0);
    CHECK_EQ(kvp__redis_durability(m, buf, sizeof buf), 0);
    /* Not a redis handle: refused, no crash. */
    struct kvp_meta *mm = NULL;
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &mm, NULL), 0);
    CHECK_EQ(kvp__redis_durability(mm, buf, sizeof buf), -EINVAL);
    CHECK_EQ(kvp__redis_durability(NULL, buf, sizeof buf), -EINVAL);
    kvp_meta_close(mm);
}

static void big_rank(int port, const char *loc)
{
    char out[64];
    CHECK_EQ(raw(port, out, sizeof out, "FLUSHALL"), 0);
    struct kvp_meta *m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    struct kvp_ns *ns = ns_of(m, "big", "p");
    CHECK_EQ(kvp_meta_init_rank(ns, 3, 2147483647ull, NULL), 0);
    CHECK_EQ(put(ns, 3, "a"), 0);
    CHECK_EQ(put(ns, 3, "b"), 1);
    struct kvp_str k = K("c");
    int64_t p = 2147483646;
    CHECK_EQ(kvp_meta_confirm(ns, 3, &k, &p, 1, NULL, 0, NULL), 0); /* the last page, directly */
    CHECK_EQ(raw(port, out, sizeof out, "DBSIZE"), 0);
    CHECK(atoi(out) <= 12);
    redisContext *c = raw_connect(port);
    redisReply *r = c ? redisCommand(c, "INFO memory") : NULL;
    const char *u = r && r->str ? strstr(r->str, "used_memory_dataset:") : NULL;
    long long used = u ? atoll(u + strlen("used_memory_dataset:")) : -1;
    /* (the rank's stream of changes, for KV events, is a few KB of it) */
    CHECK(used >= 0 && used < 1500000);
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    invariants(m);
    kvp_meta_close(m);
}

/* The port of a location's first node ("redis://H:P..." or "redis://H:P,..."). */
static int port_of_loc(const char *loc)
{
    const char *c = strchr(loc + 8, ':');
    return c ? atoi(c + 1) : -1;
}

static void two_handles(const char *loc)
{
    struct kvp_meta *a = diff_open(loc, 60000, 0), *b = diff_open(loc, 60000, 0);
    CHECK(a && b);
    if (!a || !b) {
        kvp_meta_close(a);
        kvp_meta_close(b);
        return;
    }
    struct kvp_ns *na = ns_of(a, "two", "p"), *nb = NULL;
    CHECK_EQ(kvp_meta_ns(b, "two", 3, "p", 1, 0, &nb, NULL), 0); /* made by the other */
    CHECK_EQ(kvp_meta_ns(b, "two", 3, "q", 1, 0, &nb, NULL), -ENOENT);
    CHECK_EQ(kvp_meta_ns(b, "two", 3, "p", 1, 0, &nb, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(na, 0, 8, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(nb, 1, 8, NULL), 0);
    CHECK_EQ(kvp_meta_nranks(na), 2);
    struct kvp_str k = K("shared");
    int64_t p0, p1, q;
    CHECK_EQ(kvp_meta_allocate(na, 0, &k, 1, &p0, NULL, NULL), 0);
    CHECK_EQ(kvp_meta_confirm(na, 0, &k, &p0, 1, NULL, 0, NULL), 0);
    uint8_t ex = 9;
    CHECK_EQ(kvp_meta_exists(nb, -1, &k, 1, &ex, NULL), 0);
    CHECK_EQ(ex, 0); /* not on rank 1 yet */
    CHECK_EQ(kvp_meta_lookup(nb, 0, 1, &k, 1, &q, NULL), 0);
    CHECK_EQ(q, -1); /* incomplete */
    CHECK_EQ(kvp_meta_allocate(nb, 1, &k, 1, &p1, NULL, NULL), 0);
    CHECK_EQ(kvp_meta_confirm(nb, 1, &k, &p1, 1, NULL, 0, NULL), 0);
    CHECK_EQ(kvp_meta_exists(na, -1, &k, 1, &ex, NULL), 0);
    CHECK_EQ(ex, 1);
    CHECK_EQ(kvp_meta_lookup(nb, 0, 1, &k, 1, &q, NULL), 0);
    CHECK_EQ(q, p0);
    /* A confirmation of that page for another key through the other handle. */
    struct kvp_str o = K("other");
    struct kvp_error e = {0};
    CHECK_EQ(kvp_meta_confirm(nb, 0, &o, &p0, 1, NULL, 0, &e), -EEXIST);
    CHECK_EQ(e.rule, KVP_RULE_HELD_BY_OTHER);
    CHECK_EQ(kvp_meta_delete(nb, -1, &k, 1, NULL), 0);
    CHECK_EQ(kvp_meta_lookup(na, 0, 0, &k, 1, &q, NULL), 0);
    CHECK_EQ(q, -1);
    /* The limit on ranks, as the in-process engine's (the list filled by hand). */
    redisContext *rc = strchr(loc, ',') ? NULL : raw_connect(port_of_loc(loc)); /* one server */
    if (rc) {
        size_t n = 2 + 2 * 65535;
        const char **v = malloc(n * sizeof *v);
        size_t *l = malloc(n * sizeof *l);
        char(*num)[12] = malloc(65535 * sizeof *num);
        char key[64];
        snprintf(key, sizeof key, "%s:{two/%02x}:ranks", "kvp", 'p');
        v[0] = "HSET", l[0] = 4, v[1] = key, l[1] = strlen(key);
        for (int i = 0; i < 65535; i++) {
            snprintf(num[i], sizeof num[i], "%d", 100 + i);
            v[2 + 2 * i] = num[i], l[2 + 2 * i] = strlen(num[i]);
            v[3 + 2 * i] = "1", l[3 + 2 * i] = 1;
        }
        redisReply *r = redisCommandArgv(rc, (int)n, v, l);
        CHECK(r && r->type == REDIS_REPLY_INTEGER);
        if (r)
            freeReplyObject(r);
        struct kvp_error te = {0};
        CHECK_EQ(kvp_meta_init_rank(nb, 5, 8, &te), -ENOSPC);
        CHECK_EQ(te.rule, KVP_RULE_TOO_MANY);
        CHECK_EQ(te.value, 65535 + 2);
        CHECK_EQ(te.limit, 65535);
        CHECK(!strcmp(te.msg, "too many ranks in this namespace (limit 65535)"));
        CHECK_EQ(kvp_meta_init_rank(nb, 1, 8, &te), 0); /* listed: no limit */
        r = redisCommand(rc, "DEL %s", key);
        if (r)
            freeReplyObject(r);
        redisFree(rc);
        free(v);
        free(l);
        free(num);
        r = NULL;
    }
    /* The other figures of the backend. */
    char why[128] = "x";
    CHECK_EQ(kvp_meta_health(a, why, sizeof why), 0);
    CHECK_EQ(kvp_meta_snapshot(a), -EOPNOTSUPP);
    uint64_t t = 0;
    CHECK_EQ(kvp_meta_clear_async(na, -1, &t, NULL), 0);
    CHECK_EQ(t, 0);
    invariants(a);
    kvp_meta_close(a);
    kvp_meta_close(b);
}

/* Lines of an outage and of its end (levels 1 and 2), and the last one. */
static atomic_int outage_lines[4];
static char outage_last[512];

static void outage_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level >= 1 && level <= 2) {
        atomic_fetch_add(&outage_lines[level], 1);
        snprintf(outage_last, sizeof outage_last, "%s", msg);
    }
}

static void restart_test(int i)
{
    int port = servers[i].port;
    char loc[64];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=restart", port);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = 60000;
    o.read_grace_ms = 0;
    o.timeout_ms = 2000;
    o.connect_timeout_ms = 1000;
    o.log = outage_log;
    struct kvp_meta *m = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, &o, &m, NULL), 0);
    atomic_store(&outage_lines[1], 0);
    atomic_store(&outage_lines[2], 0);
    CHECK(m != NULL);
    if (!m)
        return;
    struct kvp_ns *ns = ns_of(m, "rs", "p");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(put(ns, 0, "a"), 0);
    server_kill(i);
    struct kvp_str k = K("a");
    int64_t p;
    struct kvp_error e = {0};
    uint64_t t0 = mono_ms();
    int rc = kvp_meta_lookup(ns, 0, 0, &k, 1, &p, &e);
    CHECK(rc == -ECONNREFUSED || rc == -ECONNRESET);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    char want[48];
    snprintf(want, sizeof want, "redis 127.0.0.1:%d: ", port);
    CHECK(strstr(e.msg, want) != NULL);
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, &e), -ECONNREFUSED);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK(strstr(e.msg, "Connection refused") != NULL);
    CHECK(mono_ms() - t0 < 3000);
    char why[160] = "";
    CHECK(kvp_meta_health(m, why, sizeof why) < 0);
    CHECK(strstr(why, want) != NULL);
    int scope = 0;
    CHECK(kvp_meta_health_scope(m, &scope, NULL, 0) < 0);
    CHECK_EQ(scope, KVP_HEALTH_ALL); /* reads fail too */
    /* The outage was said once through opts.log, for all these calls. */
    CHECK_EQ(atomic_load(&outage_lines[1]), 1);
    CHECK(strstr(outage_last, want) && strstr(outage_last, "fails until it answers again"));
    CHECK_EQ(atomic_load(&outage_lines[2]), 0);
    /* Opening while it is down fails the same way. */
    struct kvp_meta *m2 = NULL;
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_open_at(loc, NULL, &m2, &e), -ECONNREFUSED);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    /* Back (empty: no persistence), on the same port: the same handle works again. */
    CHECK_EQ(server_start(i, port, NULL), 0);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, &k, 1, &p, &e), -ENOENT); /* the rank is gone */
    CHECK_EQ(e.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(put(ns, 0, "a"), 0);
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    CHECK(kvp_meta_health_scope(m, &scope, NULL, 0) == 0 && scope == 0);
    CHECK_EQ(atomic_load(&outage_lines[1]), 1);
    CHECK_EQ(atomic_load(&outage_lines[2]), 1); /* and its end once */
    CHECK(strstr(outage_last, "answers again, after") != NULL);
    static struct diff_stats_copy sc;
    CHECK_EQ(kvp_meta_stats(m, diff_stats_fn, &sc), 0);
    CHECK(strstr(sc.text, "[rs|70 r0 np4 f3 rs0 h1") != NULL); /* listed again by init_rank */
    /* Killed and back between two calls: the pooled connections are dead,
     * and an allocation (never repeated) still goes through. */
    server_kill(i);
    CHECK_EQ(server_start(i, port, NULL), 0);
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, &e), -ENOENT);
    CHECK_EQ(e.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(put(ns, 0, "a"), 0);
    /* A server that answers nothing: a timeout, not a hang. */
    kill(servers[i].pid, SIGSTOP);
    t0 = mono_ms();
    memset(&e, 0, sizeof e);
    rc = kvp_meta_lookup(ns, 0, 0, &k, 1, &p, &e);
    uint64_t took = mono_ms() - t0;
    CHECK_EQ(rc, -ETIMEDOUT);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK(took >= 1500 && took < 4500);
    kill(servers[i].pid, SIGCONT);
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, &k, 1, &p, &e), 0);
    CHECK_EQ(p, 0);
    /* Out of memory in Redis: -ENOSPC. */
    char out[64];
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET maxmemory 1"), 0);
    struct kvp_str nk = K("new");
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &nk, 1, &p, NULL, &e), -ENOSPC);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK_EQ(raw(port, out, sizeof out, "CONFIG SET maxmemory 0"), 0);
    invariants(m);
    kvp_meta_close(m);
}

static void auth_test(int port)
{
    char out[64], loc[96];
    CHECK_EQ(raw(port, out, sizeof out, "ACL SETUSER kvu on >s3cret ~* &* +@all"), 0);
    snprintf(loc, sizeof loc, "redis://kvu:s3cret@127.0.0.1:%d/2?prefix=auth", port);
    struct kvp_meta *m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    struct kvp_ns *ns = m ? ns_of(m, "a", "p") : NULL;
    CHECK(ns && kvp_meta_init_rank(ns, 0, 2, NULL) == 0);
    CHECK_EQ(raw(port, out, sizeof out, "SELECT 2"), 0); /* (each raw() is a new connection) */
    kvp_meta_close(m);
    snprintf(loc, sizeof loc, "redis://kvu:wrong@127.0.0.1:%d", port);
    struct kvp_error e = {0};
    m = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, NULL, &m, &e), -EACCES);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK(strstr(e.msg, "authentication failed") != NULL);
    /* From the environment. */
    setenv("KVPAGE_REDIS_USER", "kvu", 1);
    setenv("KVPAGE_REDIS_PASSWORD", "s3cret", 1);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d/2?prefix=auth", port);
    m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    ns = m ? ns_of(m, "a", "p") : NULL;
    CHECK(ns && kvp_meta_nranks(ns) == 1); /* database 2, as above */
    kvp_meta_close(m);
    unsetenv("KVPAGE_REDIS_USER");
    unsetenv("KVPAGE_REDIS_PASSWORD");
    CHECK_EQ(raw(port, out, sizeof out, "ACL DELUSER kvu"), 0);
}

static int combined_fn(const struct kvp_meta_value *v, void *arg)
{
    if (!strcmp(v->key, "round_trips"))
        ((uint64_t *)arg)[0] = v->value;
    if (!strcmp(v->key, "combined_commands"))
        ((uint64_t *)arg)[1] = v->value;
    return 0;
}

/* KVPAGE_REDIS_COMBINE=1 (read at open): the differential run and the
 * threads again, with calls sharing round trips. */
static void combined(int port, int steps, uint64_t seed)
{
    char loc[64];
    setenv("KVPAGE_REDIS_COMBINE", "1", 1);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=comb", port);
    meta_differential(loc, steps, seed);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=combt", port);
    threads_test(loc);
    struct kvp_meta *m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    if (m) {
        struct kvp_ns *ns = ns_of(m, "c", "p");
        CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
        for (int i = 0; i < 8; i++) {
            char key[8];
            snprintf(key, sizeof key, "k%d", i);
            CHECK_EQ(put(ns, 0, key), i);
        }
        uint64_t v[2] = {0, 0};
        CHECK_EQ(kvp_meta_values(m, combined_fn, v), 0);
        /* after each script's first call (which loads it) they went through the combiner */
        CHECK(v[0] >= 10 && v[1] >= v[0]);
        kvp_meta_close(m);
    }
    unsetenv("KVPAGE_REDIS_COMBINE");
}

/* One key allocated in an order (enum kvp_page_order); its page. */
static int64_t alloc_in(struct kvp_ns *ns, int order, const char *key)
{
    struct kvp_str k = K(key);
    int64_t p = -9;
    CHECK_EQ(kvp_meta_allocate_ordered(ns, 0, order, &k, 1, &p, NULL, NULL), 0);
    return p;
}

/* How many numbers the rank's string holds (the Redis key PREFIX:{od/70/0}:m). */
static int rank_fields_of(int port, char *last, size_t len)
{
    char v[256];
    if (raw(port, v, sizeof v, "GET oldst:{od/70/0}:m") != 0)
        return -1;
    int n = 0;
    for (char *t = strtok(v, " "); t; t = strtok(NULL, " "), n++)
        snprintf(last, len, "%s", t);
    return n;
}

/*
 * Issue 35: pages in each dialect's order over Redis, on state of the format
 * earlier versions wrote. A rank used in the default order (the store's, the
 * only one before) keeps its 13 fields, which earlier versions read; then
 * SGLang's order takes the most recently freed page and then the highest
 * never-used one, vLLM's the lowest never-used one and then the earliest
 * freed; the rank gains its 14th field (ceil) only once SGLang's order took
 * a page from the top, and loses it at a clear.
 */
static void page_orders(int port)
{
    char loc[80], last[32] = "";
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=oldst", port);
    struct kvp_meta *m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    struct kvp_ns *ns = ns_of(m, "od", "p");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    for (int i = 0; i < 4; i++) /* a, b, c, d on 0, 1, 2, 3: the default order */
        CHECK_EQ(put(ns, 0, (char[]){(char)('a' + i), '\0'}), i);
    struct kvp_str kb = K("b"), kd = K("d");
    CHECK_EQ(kvp_meta_delete(ns, 0, &kb, 1, NULL), 0); /* freed: 1, then 3 */
    CHECK_EQ(kvp_meta_delete(ns, 0, &kd, 1, NULL), 0);
    CHECK_EQ(rank_fields_of(port, last, sizeof last), 13);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_SGLANG, "x"), 3);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_VLLM, "y"), 4);
    CHECK_EQ(rank_fields_of(port, last, sizeof last), 13);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_SGLANG, "z"), 1);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_SGLANG, "w"), 7);
    CHECK_EQ(rank_fields_of(port, last, sizeof last), 14);
    CHECK(!strcmp(last, "7"));
    invariants(m);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_VLLM, "v"), 5);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_SGLANG, "u"), 6);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_VLLM, "t"), 0); /* nothing FREE: a, the LRU, is evicted */
    invariants(m);
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    CHECK_EQ(rank_fields_of(port, last, sizeof last), 13);
    CHECK_EQ(alloc_in(ns, KVP_ORDER_SGLANG, "s"), 7);
    invariants(m);
    kvp_meta_close(m);
}

/* kvp_meta_drop on Redis: meta_drop.h's semantics, every key of the
 * dropped namespace deleted (only d2's remain under the prefix), and a
 * second handle (another process's) no longer finds it. */
static void drop_test(int port)
{
    char loc[96], n[32];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=drop", port);
    struct kvp_meta *m = NULL, *m2 = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, NULL, &m, NULL), 0);
    CHECK_EQ(kvp_meta_open_at(loc, NULL, &m2, NULL), 0);
    if (!m || !m2)
        return;
    drop_semantics(m);
    struct kvp_ns *ns = NULL;
    CHECK_EQ(kvp_meta_ns(m2, "d1", 2, "kv", 2, 0, &ns, NULL), -ENOENT);
    struct drop_seen seen = drop_seen_of(m2);
    CHECK(!seen.a && seen.b);
    /* d1's keys are gone: its tag appears in no key of the prefix but
     * the ranks' streams of changes, which expire (after the KV events'
     * readers have read the removals) */
    char nev[32];
    CHECK_EQ(raw(port, n, sizeof n, "KEYS drop:{d1/*"), 0);
    CHECK_EQ(raw(port, nev, sizeof nev, "KEYS drop:{d1/*:ev"), 0);
    CHECK_EQ(strcmp(n, nev), 0);
    CHECK_EQ(raw(port, n, sizeof n, "KEYS drop:{d2/*"), 0);
    CHECK(strcmp(n, "0") != 0);
    kvp_meta_close(m2);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- changes (KV events) */

/* What a watcher was told ("+key@rank", "-key@rank", "|" at the end of an
 * entry; a stored key's parent and tokens after it, when it was told them:
 * "+key@rank<parent>[t,t,...]"), on the backend's thread. */
struct told {
    pthread_mutex_t lock;
    char s[4096];
};

static void told_fn(const struct kvp_meta_change *c, void *arg)
{
    struct told *t = arg;
    pthread_mutex_lock(&t->lock);
    size_t n = strlen(t->s);
    if (!c)
        snprintf(t->s + n, sizeof t->s - n, "|");
    else {
        n += (size_t)snprintf(t->s + n, sizeof t->s - n, "%c%.*s@%u",
                              c->kind == KVP_CHANGE_STORED ? '+' : '-', (int)c->len, c->key,
                              c->rank);
        CHECK(KVP_CHANGE_HAS(c, ntokens) && !c->ntokens == !c->token_ids);
        if (c->parent && n < sizeof t->s)
            n += (size_t)snprintf(t->s + n, sizeof t->s - n, "<%.*s>", (int)c->parent_len,
                                  c->parent);
        for (size_t i = 0; i < c->ntokens && n < sizeof t->s; i++)
            n += (size_t)snprintf(t->s + n, sizeof t->s - n, "%c%u%s", i ? ',' : '[',
                                  c->token_ids[i], i + 1 == c->ntokens ? "]" : "");
    }
    pthread_mutex_unlock(&t->lock);
}

/* Waits (10 s at most) until t has been told want (or, when or is not
 * NULL, that: two ranks' changes come in either order); then forgets it. */
static void told_wait2(struct told *t, const char *want, const char * or)
{
    char got[4096];
    for (uint64_t t0 = mono_ms();;) {
        pthread_mutex_lock(&t->lock);
        snprintf(got, sizeof got, "%s", t->s);
        pthread_mutex_unlock(&t->lock);
        if (strlen(got) >= strlen(want) || mono_ms() - t0 > 10000)
            break;
        usleep(2000);
    }
    int ok = !strcmp(got, want) || (or &&!strcmp(got, or));
    if (!ok)
        fprintf(stderr, "told \"%s\", expected \"%s\"\n", got, want);
    CHECK(ok);
    pthread_mutex_lock(&t->lock);
    t->s[0] = 0;
    pthread_mutex_unlock(&t->lock);
}

static void told_wait(struct told *t, const char *want)
{
    told_wait2(t, want, NULL);
}

static void inv_fn(const struct kvp_meta_change *c, void *arg)
{
    CHECK_EQ(c->kind, KVP_CHANGE_STORED);
    size_t n = strlen(arg);
    snprintf((char *)arg + n, 4096 - n, "%s/%s:%.*s@%u ", c->deployment, c->pool, (int)c->len,
             c->key, c->rank);
}

/* kvp_meta_watch over Redis: a handle (another process's) watches the
 * changes made through another, in order, one entry per script call; a
 * watcher started later hears only what comes after; the inventory; the
 * counters of kvp_meta_counter. */
static void watch_test(const char *loc, int port)
{
    char out[32];
    struct kvp_meta *m = diff_open(loc, 60000, 0), *w = diff_open(loc, 60000, 0), *w2 = NULL;
    CHECK(m && w);
    if (!m || !w)
        return;
    static struct told t = {PTHREAD_MUTEX_INITIALIZER, ""}, t2 = {PTHREAD_MUTEX_INITIALIZER, ""};
    t.s[0] = t2.s[0] = 0;
    CHECK_EQ(kvp_meta_watch(w, told_fn, &t), 0); /* before the namespace exists */
    struct kvp_ns *ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 2, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 2, 4, NULL), 0);
    CHECK(put(ns, 0, "a") >= 0);
    CHECK(put(ns, 0, "b") >= 0);
    CHECK(put(ns, 0, "c") >= 0); /* evicts a */
    told_wait(&t, "+a@0|+b@0|-a@0|+c@0|");
    struct kvp_str k = K("c");
    int64_t p = put(ns, 2, "c");
    CHECK(p >= 0);
    CHECK_EQ(kvp_meta_confirm(ns, 2, &k, &p, 1, NULL, 0, NULL), 0); /* held already: nothing */
    told_wait(&t, "+c@2|");
    char inv[4096] = "";
    CHECK_EQ(kvp_meta_inventory(w, inv_fn, inv), 0);
    CHECK(!strcmp(inv, "d/kv:c@0 d/kv:b@0 d/kv:c@2 ") ||
          !strcmp(inv, "d/kv:b@0 d/kv:c@0 d/kv:c@2 "));
    w2 = diff_open(loc, 60000, 0);
    CHECK(w2 != NULL);
    if (w2)
        CHECK_EQ(kvp_meta_watch(w2, told_fn, &t2), 0); /* from now on */
    CHECK_EQ(kvp_meta_delete(ns, -1, &k, 1, NULL), 0);
    told_wait2(&t, "-c@0|-c@2|", "-c@2|-c@0|");
    told_wait2(&t2, "-c@0|-c@2|", "-c@2|-c@0|");
    CHECK(put(ns, 2, "e") >= 0);
    told_wait(&t, "+e@2|");
    told_wait(&t2, "+e@2|");
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0); /* (ranks' streams: each in its order) */
    told_wait(&t, "-b@0|");
    told_wait(&t2, "-b@0|");
    CHECK_EQ(kvp_meta_drop(m, "d", 1, "kv", 2, NULL), 0);
    told_wait(&t, "-e@2|");
    /* The namespace made again: its ranks' streams are read on. */
    ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 2, NULL), 0);
    CHECK(put(ns, 0, "g") >= 0);
    told_wait(&t, "+g@0|");
    told_wait2(&t2, "-e@2|+g@0|", "+g@0|-e@2|");
    inv[0] = 0;
    CHECK_EQ(kvp_meta_inventory(w, inv_fn, inv), 0);
    CHECK(!strcmp(inv, "d/kv:g@0 "));
    /* Unwatched: nothing more is told. */
    CHECK_EQ(kvp_meta_watch(w, NULL, NULL), 0);
    CHECK(put(ns, 0, "h") >= 0);
    told_wait(&t2, "+h@0|");
    told_wait(&t, "");
    if (port) { /* (one server: its keys are all on it) */
        CHECK_EQ(raw(port, out, sizeof out, "XLEN ev:{d/6b76/0}:ev"), 0);
        CHECK(atoi(out) >= 3);
    }

    uint64_t v = 99;
    CHECK_EQ(kvp_meta_counter(m, "n", 0, 0, &v, NULL), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(kvp_meta_counter(m, "n", 10, 10, &v, NULL), 0);
    CHECK_EQ(v, 10);
    CHECK_EQ(kvp_meta_counter(m, "n", 5, 5, &v, NULL), 0); /* raises only */
    CHECK_EQ(v, 10);
    CHECK_EQ(kvp_meta_counter(w, "n", 10, 7, &v, NULL), 0); /* set, as it is 10 */
    CHECK_EQ(v, 7);
    CHECK_EQ(kvp_meta_counter(m, "n", 3, 1, &v, NULL), 0); /* it is not 3 or less */
    CHECK_EQ(v, 7);
    CHECK_EQ(kvp_meta_counter(m, "", 0, 0, &v, NULL), -EINVAL);
    kvp_meta_close(w2);
    kvp_meta_close(w);
    kvp_meta_close(m);
}

/* The number of fields of the last entry of a rank's stream, and whether
 * it has the field name (one server: port). */
static size_t last_entry_fields(int port, const char *stream, char name, int *has)
{
    redisContext *rc = raw_connect(port);
    size_t nf = 0;
    *has = 0;
    redisReply *r = rc ? redisCommand(rc, "XREVRANGE %s + - COUNT 1", stream) : NULL;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1 && r->element[0]->elements == 2) {
        const redisReply *f = r->element[0]->element[1];
        nf = f->elements / 2;
        for (size_t j = 0; j + 1 < f->elements; j += 2)
            *has |= f->element[j]->len == 1 && f->element[j]->str[0] == name;
    }
    if (r)
        freeReplyObject(r);
    if (rc)
        redisFree(rc);
    return nf;
}

/* kvp_meta_confirm_ex over Redis: a watcher (another handle) is told the
 * parents and tokens of the keys the confirmation stored, aligned with
 * them when some are not (held already); a confirmation without them
 * writes its entry as before (one field). */
static void watch_parents_test(const char *loc, int port)
{
    struct kvp_meta *m = diff_open(loc, 60000, 0), *w = diff_open(loc, 60000, 0);
    CHECK(m && w);
    if (!m || !w)
        return;
    static struct told t = {PTHREAD_MUTEX_INITIALIZER, ""};
    t.s[0] = 0;
    CHECK_EQ(kvp_meta_watch(w, told_fn, &t), 0);
    struct kvp_ns *ns = ns_of(m, "p", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    int64_t px = put(ns, 0, "x");
    CHECK(px >= 0);
    told_wait(&t, "+x@0|");
    const char *stream = "ev:{p/6b76/0}:ev";
    int has = 0;
    if (port)
        CHECK_EQ(last_entry_fields(port, stream, 's', &has), 1); /* as before */
    struct kvp_str keys[3] = {K("b"), K("x"), K("c")}, par[3] = {K("a"), K("zz"), {NULL, 0}};
    int64_t pages[3];
    uint8_t existed[3];
    CHECK_EQ(kvp_meta_allocate(ns, 0, keys, 3, pages, existed, NULL), 0);
    CHECK_EQ(pages[1], px); /* x held already: not stored again */
    uint32_t tb[2] = {1, 0xdeadbeefu}, tx[1] = {7};
    const uint32_t *tok[3] = {tb, tx, NULL};
    uint32_t ntok[3] = {2, 1, 0};
    struct kvp_confirm_opts o = {.opts_size = sizeof o, .parents = par};
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, keys, pages, 3, NULL, 0, &o, NULL), 0);
    told_wait(&t, "+b@0<a>+c@0|");
    if (port) {
        CHECK_EQ(last_entry_fields(port, stream, 't', &has), 2); /* 's', 'p' */
        CHECK(!has);
    }
    struct kvp_str k2[2] = {K("d"), K("e")};
    int64_t p2[2];
    CHECK_EQ(kvp_meta_allocate(ns, 0, k2, 2, p2, existed, NULL), 0);
    o = (struct kvp_confirm_opts){.opts_size = sizeof o, .token_ids = tok, .ntokens = ntok};
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, k2, p2, 2, NULL, 0, &o, NULL), 0);
    told_wait(&t, "+d@0[1,3735928559]+e@0[7]|");
    o.parents = par;
    struct kvp_str k3 = K("f");
    int64_t p3;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k3, 1, &p3, existed, NULL), 0);
    tok[0] = NULL, ntok[0] = 0; /* known parent, tokens not known */
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, &k3, &p3, 1, NULL, 0, &o, NULL), 0);
    told_wait(&t, "+f@0<a>|");
    if (port) {
        CHECK_EQ(last_entry_fields(port, stream, 't', &has), 3); /* 's', 'p', 't' */
        CHECK(has);
    }
    CHECK(put(ns, 0, "g") >= 0); /* after them: as before */
    told_wait(&t, "+g@0|");
    if (port)
        CHECK_EQ(last_entry_fields(port, stream, 's', &has), 1);
    CHECK_EQ(kvp_meta_watch(w, NULL, NULL), 0);
    CHECK_EQ(kvp_meta_drop(m, "p", 1, "kv", 2, NULL), 0);
    kvp_meta_close(w);
    kvp_meta_close(m);
}

/* The inventory as text: "key@rank<parent>[t,t,...]" per page (parent and
 * tokens when told), sorted, separated by spaces. */
struct lin_inv {
    char e[32][96];
    size_t n;
};

static void lin_inv_fn(const struct kvp_meta_change *c, void *arg)
{
    struct lin_inv *v = arg;
    CHECK_EQ(c->kind, KVP_CHANGE_STORED);
    CHECK(KVP_CHANGE_HAS(c, ntokens) && !c->ntokens == !c->token_ids);
    CHECK(!c->parent == !c->parent_len);
    if (v->n == 32)
        return;
    char *s = v->e[v->n++];
    size_t len = sizeof v->e[0];
    int n = snprintf(s, len, "%.*s@%u", (int)c->len, c->key, c->rank);
    if (c->parent)
        n += snprintf(s + n, len - (size_t)n, "<%.*s>", (int)c->parent_len, c->parent);
    for (size_t i = 0; i < c->ntokens && (size_t)n < len; i++)
        n += snprintf(s + n, len - (size_t)n, "%c%u%s", i ? ',' : '[', c->token_ids[i],
                      i + 1 == c->ntokens ? "]" : "");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* m's inventory (of every namespace of its prefix) is want. */
static void lin_inv_is(struct kvp_meta *m, const char *want)
{
    static struct lin_inv v;
    v.n = 0;
    CHECK_EQ(kvp_meta_inventory(m, lin_inv_fn, &v), 0);
    qsort(v.e, v.n, sizeof v.e[0], cmp_str);
    char got[4096] = "";
    for (size_t i = 0; i < v.n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", v.e[i]);
    if (strcmp(got, want))
        fprintf(stderr, "inventory \"%s\", expected \"%s\"\n", got, want);
    CHECK(!strcmp(got, want));
}

/* The number of entries of the rank's lin hash (lineage, prefix "lin",
 * namespace l/kv, rank). */
static int lin_len(int port, uint32_t rank)
{
    char out[32];
    CHECK_EQ(raw(port, out, sizeof out, "HLEN lin:{l/6b76/%u}:lin", rank), 0);
    return atoi(out);
}

/* Confirms keys (allocated first) with parents (NULL, or "" for none) and
 * tokens (ntok[i] of them, 100 * i + 1, ...; NULL: none). */
static int confirm_lin(struct kvp_ns *ns, uint32_t rank, const char *const *keys, size_t n,
                       const char *const *parents, const uint32_t *ntok)
{
    struct kvp_str k[8], par[8];
    int64_t pages[8];
    uint32_t tv[8][4];
    const uint32_t *tok[8];
    for (size_t i = 0; i < n; i++) {
        k[i] = K(keys[i]);
        par[i] = parents ? K(parents[i]) : (struct kvp_str){NULL, 0};
        for (uint32_t j = 0; j < 4; j++)
            tv[i][j] = 100 * (uint32_t)i + 1 + j;
        tok[i] = ntok && ntok[i] ? tv[i] : NULL;
    }
    int rc = kvp_meta_allocate(ns, rank, k, n, pages, NULL, NULL);
    if (rc)
        return rc;
    struct kvp_confirm_opts o = {.opts_size = sizeof o,
                                 .parents = parents ? par : NULL,
                                 .token_ids = ntok ? tok : NULL,
                                 .ntokens = ntok};
    return kvp_meta_confirm_ex(ns, rank, k, pages, n, NULL, 0, &o, NULL);
}

/* Counts the keys "kN" of rank 2 told with their parent, k(N-1), or none
 * when N is a multiple of 6. */
static void chain_fn(const struct kvp_meta_change *c, void *arg)
{
    char key[16], want[16] = "";
    if (c->rank != 2 || c->len >= sizeof key || c->ntokens)
        return;
    memcpy(key, c->key, c->len);
    key[c->len] = 0;
    int n = atoi(key + 1);
    if (n % 6)
        snprintf(want, sizeof want, "k%d", n - 1);
    if (c->parent_len == strlen(want) &&
        (!c->parent_len || !memcmp(c->parent, want, c->parent_len)))
        ++*(int *)arg;
}

/* The parents and tokens a confirmation names are kept with its keys over
 * Redis (the rank's lin hash): the inventory reports them, through any
 * handle, until the key loses its page (eviction, delete, clear, drop); a
 * key confirmed again keeps what its first confirmation said; a rank whose
 * confirmations name none has no lin hash; every step passes the invariant
 * check (which checks that lin names only held keys). */
static void lineage_test(int port)
{
    char loc[96], out[32];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=lin", port);
    struct kvp_meta *m, *m2;
    if (open_two(loc, &m, &m2))
        return;
    struct kvp_ns *ns = ns_of(m, "l", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 4, NULL), 0);
    /* Without parents or tokens: no lin hash (an empty parent and no tokens
     * are none). */
    CHECK(put(ns, 0, "x") >= 0);
    static const char *const k1[2] = {"y", "z"}, *const none[2] = {"", ""};
    static const uint32_t zero[2] = {0, 0};
    CHECK_EQ(confirm_lin(ns, 0, k1, 2, none, zero), 0);
    CHECK_EQ(raw(port, out, sizeof out, "EXISTS lin:{l/6b76/0}:lin"), 0);
    CHECK(!strcmp(out, "0"));
    lin_inv_is(m2, "x@0 y@0 z@0");
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    /* A chain a <- b <- c with tokens for a and b, on rank 0; rank 1 too. */
    static const char *const abc[3] = {"a", "b", "c"}, *const pabc[3] = {"", "a", "b"};
    static const uint32_t tabc[3] = {2, 1, 0};
    CHECK_EQ(confirm_lin(ns, 0, abc, 3, pabc, tabc), 0);
    CHECK_EQ(confirm_lin(ns, 1, abc, 1, NULL, tabc), 0);
    CHECK_EQ(lin_len(port, 0), 3);
    const char *all = "a@0[1,2] a@1[1,2] b@0<a>[101] c@0<b>";
    lin_inv_is(m, all);
    lin_inv_is(m2, all); /* another handle (another server) sees the same */
    invariants(m);
    /* A key stored without them has none (an entry left by a kvpage of
     * before this, which did not drop it, goes). */
    CHECK_EQ(raw(port, NULL, 0, "HSET lin:{l/6b76/0}:lin d %b", "\1\0\0\0\5\0\0\0p", (size_t)9), 0);
    CHECK(put(ns, 0, "d") >= 0);
    CHECK_EQ(lin_len(port, 0), 3);
    lin_inv_is(m2, "a@0[1,2] a@1[1,2] b@0<a>[101] c@0<b> d@0");
    /* So too in a confirmation that names them for other keys. */
    CHECK_EQ(raw(port, NULL, 0, "HSET lin:{l/6b76/1}:lin h %b", "\1\0\0\0\5\0\0\0p", (size_t)9), 0);
    static const char *const hi[2] = {"h", "i"}, *const phi[2] = {"", "h"};
    CHECK_EQ(confirm_lin(ns, 1, hi, 2, phi, NULL), 0);
    CHECK_EQ(lin_len(port, 1), 2);
    lin_inv_is(m2, "a@0[1,2] a@1[1,2] b@0<a>[101] c@0<b> d@0 h@1 i@1<h>");
    CHECK_EQ(kvp_meta_delete(ns, 1, (struct kvp_str[]){K("h"), K("i")}, 2, NULL), 0);
    /* Confirmed again on another page, c keeps its page and its parent. */
    struct kvp_str kc = K("c"), ke = K("e");
    int64_t pe;
    CHECK_EQ(kvp_meta_delete(ns, 0, (struct kvp_str[]){K("d")}, 1, NULL), 0);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &ke, 1, &pe, NULL, NULL), 0);
    CHECK(pe >= 0);
    struct kvp_str pz = K("zz");
    struct kvp_confirm_opts o = {.opts_size = sizeof o, .parents = &pz};
    CHECK_EQ(kvp_meta_confirm_ex(ns, 0, &kc, &pe, 1, NULL, 0, &o, NULL), 0);
    lin_inv_is(m2, all);
    invariants(m);
    /* Deleted: gone; stored again without them: none. */
    struct kvp_str kb = K("b");
    CHECK_EQ(kvp_meta_delete(ns, 0, &kb, 1, NULL), 0);
    CHECK_EQ(lin_len(port, 0), 2);
    lin_inv_is(m2, "a@0[1,2] a@1[1,2] c@0<b>");
    CHECK(put(ns, 0, "b") >= 0);
    lin_inv_is(m2, "a@0[1,2] a@1[1,2] b@0 c@0<b>");
    invariants(m);
    /* Evicted (rank 0 holds a, c, b and one free page; f and g take it and
     * a's, the least recent): gone. */
    static const char *const fg[2] = {"f", "g"}, *const pfg[2] = {"c", "f"};
    CHECK_EQ(confirm_lin(ns, 0, fg, 2, pfg, NULL), 0);
    lin_inv_is(m2, "a@1[1,2] b@0 c@0<b> f@0<c> g@0<f>");
    CHECK_EQ(lin_len(port, 0), 3);
    invariants(m);
    /* Cleared: rank 0's hash goes, rank 1's stays. */
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    CHECK_EQ(raw(port, out, sizeof out, "EXISTS lin:{l/6b76/0}:lin"), 0);
    CHECK(!strcmp(out, "0"));
    lin_inv_is(m2, "a@1[1,2]");
    invariants(m);
    /* The invariant check finds an entry of a key that holds no page, and
     * a malformed one (a count of 2 tokens with one). */
    struct kvp_error ce = {0};
    CHECK_EQ(raw(port, NULL, 0, "HSET lin:{l/6b76/1}:lin gone %b", "\0\0\0\0p", (size_t)5), 0);
    CHECK_EQ(kvp_meta_check(m, &ce), -EUCLEAN);
    CHECK(strstr(ce.msg, "rank 1: key 'gone' has a parent or tokens kept but holds no page"));
    CHECK_EQ(raw(port, NULL, 0, "HSET lin:{l/6b76/1}:lin gone %b", "\0\0\0\0", (size_t)4), 0);
    CHECK_EQ(raw(port, NULL, 0, "HSET lin:{l/6b76/1}:lin a %b", "\2\0\0\0\1\0\0\0", (size_t)8), 0);
    CHECK_EQ(raw(port, NULL, 0, "HDEL lin:{l/6b76/1}:lin gone"), 0);
    CHECK_EQ(kvp_meta_check(m, &ce), -EUCLEAN);
    CHECK(strstr(ce.msg, "rank 1: key 'a' has a malformed parent and tokens entry"));
    lin_inv_is(m2, "a@1"); /* (told without what it cannot read) */
    CHECK_EQ(
        raw(port, NULL, 0, "HSET lin:{l/6b76/1}:lin a %b", "\2\0\0\0\1\0\0\0\2\0\0\0", (size_t)12),
        0);
    lin_inv_is(m2, "a@1[1,2]");
    invariants(m);
    /* More keys than one HMGET of the inventory reads (INV_LIN_CHUNK), in
     * a rank of 600 pages. */
    CHECK_EQ(kvp_meta_init_rank(ns, 2, 600, NULL), 0);
    for (int b = 0; b < 100; b++) {
        char names[6][16];
        const char *ks[6], *ps[6];
        for (int i = 0; i < 6; i++) {
            snprintf(names[i], sizeof names[i], "k%d", 6 * b + i);
            ks[i] = names[i];
            ps[i] = i ? names[i - 1] : "";
        }
        CHECK_EQ(confirm_lin(ns, 2, ks, 6, ps, NULL), 0);
    }
    int chained = 0;
    CHECK_EQ(kvp_meta_inventory(m2, chain_fn, &chained), 0);
    CHECK_EQ(chained, 600);
    CHECK_EQ(lin_len(port, 2), 500);
    invariants(m);
    /* Dropped: no lin hash is left. */
    CHECK_EQ(kvp_meta_drop(m, "l", 1, "kv", 2, NULL), 0);
    CHECK_EQ(raw(port, out, sizeof out, "KEYS lin:*:lin"), 0);
    CHECK(!strcmp(out, "0"));
    kvp_meta_close(m2);
    kvp_meta_close(m);
}

/* A watcher held up (its fn waits) while a rank's stream of 100 entries
 * (?events_max=100) is trimmed past it: the gap is counted and told (one
 * KVP_CHANGE_LOST of that rank, key NULL), the changes after it still told. */
static atomic_int gate_open;
static atomic_int gate_told;
static atomic_int gate_lost;
static atomic_int gate_last; /* the key "last" was told */

static void gate_fn(const struct kvp_meta_change *c, void *arg)
{
    (void)arg;
    if (c && c->kind == KVP_CHANGE_LOST && !c->key && c->rank == 0 && !strcmp(c->pool, "kv"))
        atomic_fetch_add(&gate_lost, 1);
    else if (c) {
        atomic_fetch_add(&gate_told, 1);
        if (c->key && c->len == 4 && !memcmp(c->key, "last", 4))
            atomic_store(&gate_last, 1);
    }
    while (!atomic_load(&gate_open))
        usleep(1000);
}

static int gaps_of(const struct kvp_meta_value *v, void *arg)
{
    if (!strcmp(v->key, "event_gaps"))
        *(uint64_t *)arg = v->value;
    return 0;
}

static void watch_gap_test(int port)
{
    char loc[96];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=gap&events_max=100", port);
    struct kvp_meta *m = diff_open(loc, 60000, 0), *w = diff_open(loc, 60000, 0);
    CHECK(m && w);
    if (!m || !w)
        return;
    struct kvp_ns *ns = ns_of(m, "d", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4096, NULL), 0);
    CHECK_EQ(kvp_meta_watch(w, gate_fn, NULL), 0);
    char key[32];
    CHECK(put(ns, 0, "first") >= 0);
    for (uint64_t t0 = mono_ms(); !atomic_load(&gate_told) && mono_ms() - t0 < 10000;)
        usleep(1000); /* the tail is held in its first fn */
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK(put(ns, 0, key) >= 0); /* an entry each */
    }
    char out[32];
    CHECK_EQ(raw(port, out, sizeof out, "XLEN gap:{d/6b76/0}:ev"), 0);
    CHECK(atoi(out) < 400); /* trimmed to about 100 */
    atomic_store(&gate_open, 1);
    uint64_t gaps = 0;
    for (uint64_t t0 = mono_ms(); mono_ms() - t0 < 10000; usleep(2000)) {
        kvp_meta_values(w, gaps_of, &gaps);
        if (gaps && atomic_load(&gate_told) > 1)
            break;
    }
    CHECK_EQ(gaps, 1);
    CHECK_EQ(atomic_load(&gate_lost), 1);
    CHECK(atomic_load(&gate_told) < 1000); /* the trimmed ones were never told */
    /* A change after the gap is told (waited for by its key: the count
     * may move before the put returns, or after it for entries before it). */
    CHECK(put(ns, 0, "last") >= 0);
    for (uint64_t t0 = mono_ms(); !atomic_load(&gate_last) && mono_ms() - t0 < 10000;)
        usleep(1000);
    CHECK(atomic_load(&gate_last));
    kvp_meta_values(w, gaps_of, &gaps);
    CHECK_EQ(gaps, 1);
    CHECK_EQ(atomic_load(&gate_lost), 1);
    kvp_meta_close(w);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- pins and block hashes */

/* The pins and the query by block hashes of issue 38 on m (Redis or
 * memory), which must answer alike: the limit of the smallest rank, the
 * refusal's words, counts, eviction passing over pins, expiry, and the
 * hash index kept by confirm, delete, eviction and clear. */
static void pins_and_hashes(struct kvp_meta *m, const char *what)
{
    struct kvp_ns *ns = NULL;
    CHECK_EQ(kvp_meta_ns(m, "pins", 4, what, strlen(what), 1, &ns, NULL), 0);
    if (!ns)
        return;
    struct kvp_str a = K("a"), b = K("b"), two[2] = {a, b};
    struct kvp_error e = {0};
    CHECK_EQ(kvp_meta_pin(ns, &a, 1, 60000, 0.5, NULL, NULL, &e), -ENOENT);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 2, NULL), 0);
    uint64_t total = 0, limit = 0, keys = 0, refs = 0, rel = 0;
    e = (struct kvp_error){0};
    CHECK_EQ(kvp_meta_pin(ns, two, 2, 60000, 0.5, &total, &limit, &e), -ENOSPC);
    CHECK_EQ(total, 0);
    CHECK_EQ(limit, 1);
    CHECK_EQ(e.rule, KVP_RULE_TOO_MANY);
    CHECK_EQ(strcmp(e.msg, "pinning 2 more keys would pin 2 keys of the namespace, over the 1 "
                           "allowed (--max-pinned-ratio 0.5 of rank 1's 2 pages)"),
             0);
    CHECK_EQ(kvp_meta_pinned(ns, -1, &keys, &refs, NULL), 0);
    CHECK_EQ(keys + refs, 0);
    struct kvp_str aa[2] = {a, a};
    CHECK_EQ(kvp_meta_pin(ns, aa, 2, 60000, 0.5, &total, &limit, NULL), 0);
    CHECK_EQ(total, 1);
    CHECK_EQ(kvp_meta_pinned(ns, -1, &keys, &refs, NULL), 0);
    CHECK_EQ(keys, 1);
    CHECK_EQ(refs, 2);
    CHECK_EQ(kvp_meta_pinned(ns, 1, &keys, NULL, NULL), 0);
    CHECK_EQ(keys, 0); /* a is not stored on rank 1 yet */
    /* rank 1 full (a the least recent): eviction passes over a */
    CHECK(put(ns, 1, "a") >= 0);
    CHECK(put(ns, 1, "c") >= 0);
    CHECK_EQ(kvp_meta_pinned(ns, 1, &keys, NULL, NULL), 0);
    CHECK_EQ(keys, 1);
    CHECK(put(ns, 1, "d") >= 0);
    uint8_t ex[3] = {0};
    struct kvp_str acd[3] = {a, K("c"), K("d")};
    CHECK_EQ(kvp_meta_exists(ns, 1, acd, 3, ex, NULL), 0);
    CHECK(ex[0] && !ex[1] && ex[2]);
    /* one reference back: still pinned; the second: evicted next */
    CHECK_EQ(kvp_meta_unpin(ns, &a, 1, &rel, NULL), 0);
    CHECK_EQ(rel, 1);
    CHECK_EQ(kvp_meta_unpin(ns, two, 2, &rel, NULL), 0);
    CHECK_EQ(rel, 1);
    CHECK_EQ(kvp_meta_pinned(ns, -1, &keys, &refs, NULL), 0);
    CHECK_EQ(keys + refs, 0);
    CHECK(put(ns, 1, "e") >= 0);
    CHECK_EQ(kvp_meta_exists(ns, 1, acd, 1, ex, NULL), 0);
    CHECK(!ex[0]);
    /* a short pin ends by itself */
    CHECK_EQ(kvp_meta_pin(ns, &b, 1, 200, 0.5, NULL, NULL, NULL), 0);
    sleep_ms(400);
    CHECK_EQ(kvp_meta_pinned(ns, -1, &keys, NULL, NULL), 0);
    CHECK_EQ(keys, 0);
    /* block hashes: SGLang's (first 16 hex digits) and vLLM's (last 16) */
    const char *k1 = "0123456789ABCDEF00000000000000000000000000000000000000000000ffff";
    const char *k2 = "m@fedcba9876543210";
    struct kvp_str ks[2] = {K(k1), K(k2)};
    CHECK(put(ns, 0, k1) >= 0);
    CHECK(put(ns, 0, k2) >= 0);
    uint64_t hs[3] = {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x000000000000ffffull};
    uint32_t r01[2] = {0, 1};
    uint8_t out[6];
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs, 3, KVP_HASH_SGLANG, r01, 2, out, NULL), 0);
    CHECK(out[0] && !out[1] && !out[2] && !out[3] && !out[4] && !out[5]);
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs, 3, KVP_HASH_VLLM, r01, 1, out, NULL), 0);
    CHECK(!out[0] && out[1] && out[2]);
    CHECK_EQ(kvp_meta_delete(ns, 0, &ks[1], 1, NULL), 0);
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs, 3, KVP_HASH_VLLM, r01, 1, out, NULL), 0);
    CHECK(!out[0] && !out[1] && out[2]);
    CHECK_EQ(kvp_meta_clear(ns, 0, NULL), 0);
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs, 3, KVP_HASH_SGLANG, r01, 1, out, NULL), 0);
    CHECK(!out[0]);
    uint32_t r9 = 9;
    CHECK_EQ(kvp_meta_exists_hashes(ns, hs, 1, KVP_HASH_SGLANG, &r9, 1, out, NULL), -ENOENT);
    CHECK_EQ(kvp_meta_drop(m, "pins", 4, what, strlen(what), NULL), 0);
}

static void single_server(int steps, uint64_t seed)
{
    if (server_start(0, 0, NULL)) {
        CHECK(!"redis-server did not start");
        return;
    }
    int port = servers[0].port;
    char loc[64];
    uint64_t t0 = mono_ms();
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=diff", port);
    meta_differential(loc, steps, seed);
    printf("differential, one server: %d steps in %llu ms\n", steps,
           (unsigned long long)(mono_ms() - t0));
    bad_locations();
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d?prefix=time", port);
    struct kvp_meta *rm = diff_open(loc, 2500, 1000), *mm = NULL;
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.lease_ms = 2500;
    o.read_grace_ms = 1000;
    CHECK_EQ(kvp_meta_open_at("mem:", &o, &mm, NULL), 0);
    if (rm)
        grace_and_lease(rm, "redis");
    grace_and_lease(mm, "mem");
    if (rm)
        pins_and_hashes(rm, "redis");
    pins_and_hashes(mm, "mem");
    if (rm)
        durability(port, rm);
    kvp_meta_close(rm);
    kvp_meta_close(mm);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d", port);
    two_handles(loc);
    threads_test(loc);
    combined(port, steps / 4, seed + 7);
    auth_test(port);
    big_rank(port, loc);
    page_orders(port);
    drop_test(port);
    char evloc[96];
    snprintf(evloc, sizeof evloc, "redis://127.0.0.1:%d?prefix=ev", port);
    watch_test(evloc, port);
    watch_parents_test(evloc, port);
    lineage_test(port);
    watch_gap_test(port);
    restart_test(0);
    server_kill(0);
}

/* ---------------------------------------------------------------- a cluster */

static void node_id(int port, char *id, size_t len)
{
    raw(port, id, len, "CLUSTER MYID");
}

static int cluster_ok(int port)
{
    char buf[4096];
    redisContext *c = raw_connect(port);
    redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
    snprintf(buf, sizeof buf, "%s", r && r->str ? r->str : "");
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return strstr(buf, "cluster_state:ok") != NULL;
}

/* Moves slot from the node at src to the node at dst with its keys; mid
 * (may be NULL) runs once the keys are on dst but src still owns the slot
 * (its clients get ASK). */
static int move_slot(int slot, int src, int dst, int others[], int nothers, void (*mid)(void *),
                     void *arg)
{
    char sid[64], did[64], out[64];
    node_id(src, sid, sizeof sid);
    node_id(dst, did, sizeof did);
    if (raw(dst, out, sizeof out, "CLUSTER SETSLOT %d IMPORTING %s", slot, sid) ||
        raw(src, out, sizeof out, "CLUSTER SETSLOT %d MIGRATING %s", slot, did))
        return -1;
    redisContext *c = raw_connect(src);
    redisReply *r = c ? redisCommand(c, "CLUSTER GETKEYSINSLOT %d 1000", slot) : NULL;
    for (size_t i = 0; r && i < r->elements; i++) {
        redisReply *m = redisCommand(c, "MIGRATE 127.0.0.1 %d %b 0 5000", dst, r->element[i]->str,
                                     r->element[i]->len);
        if (!m || m->type == REDIS_REPLY_ERROR)
            fprintf(stderr, "MIGRATE: %s\n", m ? m->str : "no reply");
        if (m)
            freeReplyObject(m);
    }
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    if (mid)
        mid(arg);
    int rc = raw(dst, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, did);
    rc |= raw(src, out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, did);
    for (int i = 0; i < nothers; i++)
        rc |= raw(others[i], out, sizeof out, "CLUSTER SETSLOT %d NODE %s", slot, did);
    return rc;
}

/* The port of the master serving slot, or -1. */
static int owner_of(int slot, const int *ports, int n)
{
    for (int i = 0; i < n; i++) {
        redisContext *c = raw_connect(ports[i]);
        redisReply *r = c ? redisCommand(c, "CLUSTER COUNTKEYSINSLOT %d", slot) : NULL;
        redisReply *s = c ? redisCommand(c, "CLUSTER SLOTS") : NULL;
        int port = -1;
        for (size_t j = 0; s && s->type == REDIS_REPLY_ARRAY && j < s->elements; j++) {
            redisReply *e = s->element[j];
            if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
                port = (int)e->element[2]->element[1]->integer;
        }
        if (r)
            freeReplyObject(r);
        if (s)
            freeReplyObject(s);
        if (c)
            redisFree(c);
        if (port > 0)
            return port;
    }
    return -1;
}

/* During the move: src answers ASK for the rank's keys, now on dst. */
static void lookup_mid_move(void *arg)
{
    struct kvp_ns *ns = arg;
    struct kvp_str keys[2] = {K("a"), K("b")};
    int64_t pages[2] = {-5, -5};
    struct kvp_error e = {0};
    uint64_t t0 = mono_ms();
    int rc = kvp_meta_lookup(ns, 0, 0, keys, 2, pages, &e);
    /* A script's keys must all be on the importing node, and the empty
     * ones of a rank never are: Redis answers TRYAGAIN until the slot is
     * moved, and the call gives up soon, as unavailable. */
    CHECK(rc == 0 ||
          (rc == -EAGAIN && e.rule == KVP_RULE_UNAVAILABLE && strstr(e.msg, "TRYAGAIN") != NULL));
    CHECK(mono_ms() - t0 < 3000);
    if (rc == 0) {
        CHECK_EQ(pages[0], 0);
        CHECK_EQ(pages[1], 1);
    }
}

static int redirects_fn(const struct kvp_meta_value *v, void *arg)
{
    if (!strcmp(v->key, "redirects"))
        *(uint64_t *)arg = v->value;
    return 0;
}

static void cluster(int steps, uint64_t seed)
{
    int ports[3];
    for (int i = 0; i < 3; i++) {
        if (server_start(1 + i, 0, "cluster")) {
            CHECK(!"cluster node did not start");
            return;
        }
        ports[i] = servers[1 + i].port;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "redis-cli --cluster create 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d "
             "--cluster-replicas 0 --cluster-yes >/dev/null 2>&1",
             ports[0], ports[1], ports[2]);
    CHECK_EQ(system(cmd), 0);
    uint64_t t0 = mono_ms();
    int ok = 0;
    while (!ok && mono_ms() - t0 < 20000) {
        ok = cluster_ok(ports[0]) && cluster_ok(ports[1]) && cluster_ok(ports[2]);
        if (!ok)
            sleep_ms(100);
    }
    CHECK(ok);
    if (!ok)
        return;
    printf("cluster ready in %llu ms\n", (unsigned long long)(mono_ms() - t0));
    char loc[128];
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?prefix=cl", ports[0],
             ports[1], ports[2]);
    t0 = mono_ms();
    meta_differential(loc, steps, seed + 1);
    printf("differential, cluster: %d steps in %llu ms\n", steps,
           (unsigned long long)(mono_ms() - t0));
    /* The ranks landed on more than one shard. */
    int used = 0;
    for (int i = 0; i < 3; i++) {
        char out[32];
        raw(ports[i], out, sizeof out, "DBSIZE");
        used += atoi(out) > 0;
    }
    CHECK(used >= 2);
    /* A seed that is down: the next one answers, and gives the map. */
    int dead = free_port(0);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d,127.0.0.1:%d?prefix=cl", dead, ports[2]);
    struct kvp_meta *dm = diff_open(loc, 60000, 0);
    CHECK(dm != NULL);
    char why[128] = "";
    CHECK(dm && kvp_meta_health(dm, why, sizeof why) == 0);
    struct kvp_ns *dns = dm ? ns_of(dm, "d", "p0") : NULL; /* of the differential run */
    CHECK(dns && kvp_meta_nranks(dns) > 0);
    kvp_meta_close(dm);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?prefix=ev", ports[0],
             ports[1], ports[2]);
    watch_test(loc, 0); /* KV events from ranks on different shards */
    watch_parents_test(loc, 0);
    snprintf(loc, sizeof loc, "redis://127.0.0.1:%d,127.0.0.1:%d", ports[0], ports[1]);
    two_handles(loc);
    threads_test(loc);
    /* MOVED: the slot of a rank in use goes to another master. */
    struct kvp_meta *m = diff_open(loc, 60000, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    pins_and_hashes(m, "cluster"); /* its ranks on two slots */
    struct kvp_ns *ns = ns_of(m, "mv", "p");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
    CHECK_EQ(put(ns, 0, "a"), 0);
    CHECK_EQ(put(ns, 0, "b"), 1);
    char tag[64];
    snprintf(tag, sizeof tag, "mv/%02x/0", 'p');
    int slot = (int)kvp__redis_slot(tag, strlen(tag));
    char ks[32];
    CHECK_EQ(raw(ports[0], ks, sizeof ks, "CLUSTER KEYSLOT cl:{%s}:m", tag), 0);
    CHECK_EQ(atoi(ks), slot);
    int src = owner_of(slot, ports, 3), dst = src == ports[0] ? ports[1] : ports[0];
    int third = ports[0] + ports[1] + ports[2] - src - dst;
    CHECK(src > 0);
    uint64_t before = 0, redirects = 0;
    CHECK_EQ(kvp_meta_values(m, redirects_fn, &before), 0);
    CHECK_EQ(move_slot(slot, src, dst, &third, 1, lookup_mid_move, ns), 0);
    CHECK_EQ(kvp_meta_values(m, redirects_fn, &redirects), 0);
    CHECK(redirects > before); /* the ASK */
    before = redirects;
    CHECK_EQ(owner_of(slot, ports, 3), dst);
    struct kvp_str keys[2] = {K("a"), K("b")};
    int64_t pages[2];
    struct kvp_error e = {0};
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, keys, 2, pages, &e), 0);
    CHECK_EQ(pages[0], 0);
    CHECK_EQ(pages[1], 1);
    CHECK_EQ(put(ns, 0, "c"), 2);
    /* A master that stops answering: its ranks time out, the others' work. */
    int other = -1;
    for (uint32_t r = 1; r < 64 && other < 0; r++) {
        snprintf(tag, sizeof tag, "mv/%02x/%u", 'p', r);
        if (owner_of((int)kvp__redis_slot(tag, strlen(tag)), ports, 3) != dst)
            other = (int)r;
    }
    CHECK(other > 0);
    CHECK_EQ(kvp_meta_init_rank(ns, (uint32_t)other, 4, NULL), 0);
    for (uint32_t r = 64; r < 80; r++)
        CHECK_EQ(kvp_meta_init_rank(ns, r, 4, NULL), 0); /* some on the one stopped below */
    int di = ports[0] == dst ? 1 : ports[1] == dst ? 2 : 3;
    kill(servers[di].pid, SIGSTOP);
    uint64_t t1 = mono_ms();
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, keys, 2, pages, &e), -ETIMEDOUT);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK(mono_ms() - t1 < 4500);
    CHECK_EQ(put(ns, (uint32_t)other, "x"), 0);
    /* Across ranks (pipelined): one timeout, not one per rank. */
    uint8_t exv[2];
    t1 = mono_ms();
    memset(&e, 0, sizeof e);
    CHECK_EQ(kvp_meta_exists(ns, -1, keys, 2, exv, &e), -ETIMEDOUT);
    CHECK_EQ(e.rule, KVP_RULE_UNAVAILABLE);
    CHECK(mono_ms() - t1 < 4500);
    kill(servers[di].pid, SIGCONT);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, keys, 2, pages, &e), 0);
    CHECK_EQ(pages[1], 1);
    CHECK_EQ(kvp_meta_values(m, redirects_fn, &redirects), 0);
    CHECK(redirects > before); /* the MOVED */
    invariants(m);
    kvp_meta_close(m);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    if (system("command -v redis-server >/dev/null && command -v redis-cli >/dev/null") != 0) {
        printf("test_meta_redis: redis-server or redis-cli is not installed "
               "(scripts/install-deps --test): skipped\n");
        return 77; /* ctest's SKIP_RETURN_CODE */
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvp-redis-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(kill_all);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGABRT, on_signal);
    signal(SIGSEGV, on_signal);
    signal(SIGPIPE, SIG_IGN);
    uint64_t t0 = mono_ms();
    single_server(steps, seed);
    cluster(steps / 3, seed);
    kill_all();
    printf("test_meta_redis: %llu ms\n", (unsigned long long)(mono_ms() - t0));
    return check_report();
}
