/*
 * The http:// backend of kvpage/meta.h (src/meta/http/http.c) against the real
 * server ($KVPAGE_BIN serve, set by CMake) and against fake servers written
 * here (a thread with a plain socket speaking just enough HTTP/1.1):
 *
 *   1. a round trip of every call through the real server, with a
 *      deployment from the location (/ns/NAME), a pool other than "kv" and
 *      two ranks, and the default deployment;
 *   2. the server killed (SIGKILL) and restarted on the same port and data
 *      directory: the client reconnects and finds the confirmed keys; a fake
 *      server that drops the first request of each route: exists is retried
 *      and succeeds, allocate fails after exactly one request;
 *   3. fake servers that answer too slowly (-ETIMEDOUT in bounded time), with
 *      4xx (errno and detail) and with 503 (retried opts.retries times, but
 *      an allocation never);
 *   4. 8 threads on one handle: no page leaks, connections reused.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/meta.h"
#include "mono.h"
#include "scratch.h"

static struct kvp_str S(const char *s) {
    return (struct kvp_str){s, strlen(s)};
}

/* ---------------------------------------------------------------- the real server */

static char tmpdir[64];

/* A port nothing listens on now (the kernel's pick for port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (void *)&a, &l))
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

static const char *open_token; /* opts.token of the next http_open */

static int http_open(const char *path, int port, uint32_t timeout_ms, uint32_t retries,
                     struct kvp_meta **m)
{
    char loc[128];
    snprintf(loc, sizeof loc, "http://127.0.0.1:%d%s", port, path);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = 2000;
    o.retries = retries;
    char token[32];
    if (open_token) /* the caller's string may go once open returns */
        snprintf(token, sizeof token, "%s", open_token);
    o.token = open_token ? token : NULL;
    struct kvp_error err = {0};
    int rc = kvp_meta_open_at(loc, &o, m, &err);
    memset(token, 'x', sizeof token);
    if (rc)
        fprintf(stderr, "open %s: %d %s\n", loc, rc, err.msg);
    return rc;
}

/* Starts kvpage serve on port (0: a free one, retried while taken) with data
 * dir dir; returns its pid once /healthz answers, or -1. */
static pid_t start_server(int *port, const char *dir)
{
    const char *bin = getenv("KVPAGE_BIN");
    if (!bin || !*bin) {
        fprintf(stderr, "KVPAGE_BIN is not set (CMake sets it for ctest)\n");
        return -1;
    }
    for (int attempt = 0; attempt < 10; attempt++) {
        int p = *port ? *port : free_port();
        char listen[32], log[128];
        snprintf(listen, sizeof listen, "127.0.0.1:%d", p);
        snprintf(log, sizeof log, "%s/server.log", tmpdir);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 2);
                dup2(fd, 1);
            }
            execl(bin, bin, "serve", "--listen", listen, "--data-dir", dir, (char *)NULL);
            _exit(127);
        }
        struct kvp_meta *m;
        if (pid < 0 || http_open("", p, 1000, 0, &m))
            return -1;
        uint64_t t0 = mono_ms();
        int up = 0, dead = 0;
        while (!up && !dead && mono_ms() - t0 < 30000) {
            char why[256];
            if (kvp_meta_health(m, why, sizeof why) == 0)
                up = 1;
            else if (waitpid(pid, NULL, WNOHANG) == pid)
                dead = 1; /* the port was taken meanwhile: another */
            else
                sleep_ms(20);
        }
        kvp_meta_close(m);
        if (up) {
            *port = p;
            return pid;
        }
        if (!dead) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        if (*port) /* a fixed port: wait for it to be free again */
            sleep_ms(200);
    }
    return -1;
}

static int stop_server(pid_t pid, int sig)
{
    int st = 0;
    kill(pid, sig);
    waitpid(pid, &st, 0);
    return st;
}

/* ---------------------------------------------------------------- stats helpers */

struct want_ns {
    const char *dep, *pool;
    int found;
    size_t nranks;
    struct kvp_rank_stats r[4];
};

static int stats_fn(const char *dep, const char *pool, const struct kvp_rank_stats *ranks, size_t n,
                    void *arg)
{
    struct want_ns *w = arg;
    if (strcmp(dep, w->dep) || strcmp(pool, w->pool))
        return 0;
    w->found = 1;
    w->nranks = n;
    for (size_t i = 0; i < n && i < 4; i++)
        w->r[i] = ranks[i];
    return 0;
}

struct values {
    uint64_t requests, retries, connections;
};

static int value_fn(const struct kvp_meta_value *v, void *arg)
{
    struct values *x = arg;
    if (!strcmp(v->key, "requests"))
        x->requests = v->value;
    else if (!strcmp(v->key, "retries"))
        x->retries = v->value;
    else if (!strcmp(v->key, "connections"))
        x->connections = v->value;
    return 0;
}

static struct values values_of(struct kvp_meta *m)
{
    struct values v = {0};
    CHECK_EQ(kvp_meta_values(m, value_fn, &v), 0);
    return v;
}

/* ---------------------------------------------------------------- 1. round trip */

static void durable_fn(void *arg, int status)
{
    CHECK(0); /* never called: nothing is waited for */
}

static void test_round_trip(int port)
{
    struct kvp_meta *m;
    struct kvp_error err = {0};
    if (http_open("/ns/dep1", port, 10000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns, *other;
    CHECK_EQ(kvp_meta_ns(m, "dep2", 4, "p1", 2, 1, &other, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_NAMESPACE);
    CHECK(strstr(err.msg, "dep1") != NULL);
    CHECK_EQ(kvp_meta_ns(m, "dep1", 4, "p1", 2, 0, &ns, &err), -ENOENT);
    CHECK_EQ(kvp_meta_ns(m, "dep1", 4, "p1", 2, 1, &ns, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, &err), 0); /* the same again */
    CHECK_EQ(kvp_meta_ns(m, "dep1", 4, "p1", 2, 0, &other, &err), 0);
    CHECK(other == ns);
    CHECK_EQ(kvp_meta_nranks(ns), 2);

    /* allocate, confirm, allocate again: existed */
    struct kvp_str k2[] = {S("a"), S("b\"q\\\x01\n\xc3\xa9")}; /* escapes and UTF-8 */
    int64_t pg[4];
    uint8_t ex[4] = {9, 9, 9, 9};
    CHECK_EQ(kvp_meta_allocate(ns, 0, k2, 2, pg, ex, &err), 0);
    CHECK(pg[0] >= 0 && pg[1] >= 0 && pg[0] != pg[1]);
    CHECK(ex[0] == 0 && ex[1] == 0);
    int64_t pa = pg[0], pb = pg[1];
    CHECK_EQ(kvp_meta_confirm(ns, 0, k2, pg, 2, NULL, 0, &err), 0);
    struct kvp_str kac[] = {S("a"), S("c")};
    CHECK_EQ(kvp_meta_allocate(ns, 0, kac, 2, pg, ex, &err), 0);
    CHECK_EQ(pg[0], pa);
    CHECK(ex[0] == 1 && ex[1] == 0 && pg[1] >= 0);
    int64_t rel = pg[1];
    CHECK_EQ(kvp_meta_confirm(ns, 0, NULL, NULL, 0, &rel, 1, &err), 0); /* c released */
    /* rank 1 holds a only */
    CHECK_EQ(kvp_meta_allocate(ns, 1, k2, 1, pg, ex, &err), 0);
    CHECK_EQ(kvp_meta_confirm(ns, 1, k2, pg, 1, NULL, 0, &err), 0);

    struct kvp_str kabc[] = {S("a"), k2[1], S("c")};
    uint8_t e3[3];
    CHECK_EQ(kvp_meta_exists(ns, 0, kabc, 3, e3, &err), 0);
    CHECK(e3[0] == 1 && e3[1] == 1 && e3[2] == 0);
    CHECK_EQ(kvp_meta_exists(ns, 1, kabc, 3, e3, &err), 0);
    CHECK(e3[0] == 1 && e3[1] == 0 && e3[2] == 0);
    CHECK_EQ(kvp_meta_exists(ns, -1, kabc, 3, e3, &err), 0); /* complete: both ranks */
    CHECK(e3[0] == 1 && e3[1] == 0 && e3[2] == 0);
    int64_t l3[3];
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, kabc, 3, l3, &err), 0);
    CHECK(l3[0] == pa && l3[1] == pb && l3[2] == -1);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 1, kabc, 3, l3, &err), 0);
    CHECK(l3[0] == pa && l3[1] == -1 && l3[2] == -1);

    /* stats of the server */
    struct want_ns w = {.dep = "dep1", .pool = "p1"};
    CHECK_EQ(kvp_meta_stats(m, stats_fn, &w), 0);
    CHECK(w.found && w.nranks == 2);
    CHECK(w.r[0].rank == 0 && w.r[0].num_pages == 8 && w.r[0].held == 2 && w.r[0].free == 6 &&
          w.r[0].reserved == 0 && w.r[0].keys == 2);
    CHECK(w.r[1].rank == 1 && w.r[1].held == 1);

    /* the server's errors */
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_RESIZE_HELD);
    CHECK(err.value == 8 && err.limit == 4);
    CHECK(strstr(err.msg, "/ns/dep1/0/initialize") && strstr(err.msg, "refusing to change"));
    struct kvp_str kz = S("z");
    CHECK_EQ(kvp_meta_confirm(ns, 0, &kz, &pa, 1, NULL, 0, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_HELD_BY_OTHER);
    CHECK(err.value == pa && err.index == 0);
    int64_t far = 100;
    CHECK_EQ(kvp_meta_confirm(ns, 0, &kz, &far, 1, NULL, 0, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_CONFIRM_PAGE);
    CHECK(err.value == 100 && err.limit == 8 && strstr(err.msg, "is outside"));
    CHECK_EQ(kvp_meta_allocate(ns, 5, &kz, 1, pg, ex, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK(strstr(err.msg, "/ns/dep1/5/reserve_and_allocate_page_indices") &&
          strstr(err.msg, "not initialized"));
    CHECK_EQ(kvp_meta_lookup(ns, 5, 1, &kz, 1, l3, &err), -ENOENT);
    struct kvp_str bad = {"\xff\xfe", 2};
    CHECK_EQ(kvp_meta_exists(ns, 0, &bad, 1, e3, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_KEY);
    CHECK(strstr(err.msg, "UTF-8") != NULL);

    /* delete: on every rank, then on one */
    CHECK_EQ(kvp_meta_delete(ns, -1, kabc, 1, &err), 0);
    CHECK_EQ(kvp_meta_exists(ns, 0, kabc, 2, e3, &err), 0);
    CHECK(e3[0] == 0 && e3[1] == 1);
    CHECK_EQ(kvp_meta_exists(ns, 1, kabc, 1, e3, &err), 0);
    CHECK(e3[0] == 0);
    CHECK_EQ(kvp_meta_delete(ns, 0, kabc + 1, 1, &err), 0);
    CHECK_EQ(kvp_meta_exists(ns, 0, kabc + 1, 1, e3, &err), 0);
    CHECK(e3[0] == 0);
    /* clear: one rank, then the namespace */
    CHECK_EQ(kvp_meta_allocate(ns, 0, kac, 2, pg, NULL, &err), 0);
    CHECK_EQ(kvp_meta_confirm(ns, 0, kac, pg, 2, NULL, 0, &err), 0);
    CHECK_EQ(kvp_meta_allocate(ns, 1, kac, 2, pg, NULL, &err), 0);
    CHECK_EQ(kvp_meta_confirm(ns, 1, kac, pg, 2, NULL, 0, &err), 0);
    CHECK_EQ(kvp_meta_exists(ns, -1, kac, 2, e3, &err), 0);
    CHECK(e3[0] == 1 && e3[1] == 1);
    CHECK_EQ(kvp_meta_clear(ns, 1, &err), 0);
    CHECK_EQ(kvp_meta_exists(ns, -1, kac, 2, e3, &err), 0);
    CHECK(e3[0] == 0 && e3[1] == 0);
    CHECK_EQ(kvp_meta_exists(ns, 0, kac, 2, e3, &err), 0);
    CHECK(e3[0] == 1 && e3[1] == 1);
    CHECK_EQ(kvp_meta_clear(ns, -1, &err), 0);
    CHECK_EQ(kvp_meta_exists(ns, 0, kac, 2, e3, &err), 0);
    CHECK(e3[0] == 0 && e3[1] == 0);
    memset(&w, 0, sizeof w);
    w.dep = "dep1", w.pool = "p1";
    CHECK_EQ(kvp_meta_stats(m, stats_fn, &w), 0);
    CHECK(w.found && w.nranks == 2 && w.r[0].free == 8 && w.r[1].free == 8);

    /* the rest of the interface */
    uint64_t ticket = 0;
    CHECK_EQ(kvp_meta_delete_async(ns, 0, kac, 1, &ticket, &err), 0);
    CHECK_EQ(ticket, 0); /* durable once answered */
    CHECK_EQ(kvp_meta_wait(m, ticket, &err), 0);
    CHECK_EQ(kvp_meta_when_durable(m, ticket, durable_fn, NULL), 1);
    CHECK_EQ(kvp_meta_check(m, &err), -EOPNOTSUPP);
    CHECK(strstr(err.msg, "fsck") != NULL);
    char why[256];
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    CHECK(kvp_meta_snapshot(m) < 0);
    char desc[128], want[96];
    snprintf(want, sizeof want, "kvpage serve at http://127.0.0.1:%d/ns/dep1", port);
    CHECK(kvp_meta_describe(m, desc, sizeof desc) > 0 && !strcmp(desc, want));
    struct values v = values_of(m);
    CHECK(v.requests >= 40 && v.connections >= 1 && v.connections <= 2 && v.retries == 0);
    kvp_meta_close(m);

    /* the default deployment (no /ns/ in the location, none in the path), pool kv */
    if (http_open("", port, 10000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *dflt, *d2;
    CHECK_EQ(kvp_meta_ns(m, "default", 7, "kv", 2, 1, &dflt, &err), 0);
    CHECK_EQ(kvp_meta_ns(m, "dep2", 4, "kv", 2, 1, &d2, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(dflt, 0, 4, &err), 0);
    CHECK_EQ(kvp_meta_allocate(dflt, 0, kac, 1, pg, NULL, &err), 0);
    CHECK_EQ(kvp_meta_confirm(dflt, 0, kac, pg, 1, NULL, 0, &err), 0);
    CHECK_EQ(kvp_meta_exists(dflt, -1, kac, 1, e3, &err), 0);
    CHECK(e3[0] == 1);
    CHECK_EQ(kvp_meta_exists(d2, -1, kac, 1, e3, &err), 0); /* an unknown namespace */
    CHECK(e3[0] == 0);
    CHECK_EQ(kvp_meta_exists(d2, 0, kac, 1, e3, &err), -ENOENT);
    memset(&w, 0, sizeof w);
    w.dep = "default", w.pool = "kv";
    CHECK_EQ(kvp_meta_stats(m, stats_fn, &w), 0);
    CHECK(w.found && w.nranks == 1 && w.r[0].held == 1);
    memset(&w, 0, sizeof w);
    w.dep = "dep1", w.pool = "p1"; /* every deployment without /ns/ */
    CHECK_EQ(kvp_meta_stats(m, stats_fn, &w), 0);
    CHECK(w.found);
    CHECK_EQ(kvp_meta_delete(dflt, -1, kac, 1, &err), 0);
    CHECK_EQ(kvp_meta_exists(dflt, 0, kac, 1, e3, &err), 0);
    CHECK(e3[0] == 0);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- 2. restart */

static void test_restart(pid_t *pid, int port, const char *dir)
{
    struct kvp_meta *m;
    struct kvp_error err = {0};
    if (http_open("/ns/rs", port, 5000, 2, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns;
    struct kvp_str keys[] = {S("r1"), S("r2")};
    int64_t pg[2], got[2];
    CHECK_EQ(kvp_meta_ns(m, "rs", 2, "kv", 2, 1, &ns, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 16, &err), 0);
    CHECK_EQ(kvp_meta_allocate(ns, 0, keys, 2, pg, NULL, &err), 0);
    CHECK_EQ(kvp_meta_confirm(ns, 0, keys, pg, 2, NULL, 0, &err), 0);
    uint64_t conns = values_of(m).connections;

    CHECK_EQ(stop_server(*pid, SIGKILL), SIGKILL); /* killed mid-run */
    uint8_t e[2];
    uint64_t t0 = mono_ms();
    CHECK_EQ(kvp_meta_exists(ns, 0, keys, 2, e, &err), -ECONNREFUSED);
    CHECK(strstr(err.msg, "/ns/rs/0/exists") && strstr(err.msg, "after 3 attempts"));
    CHECK(mono_ms() - t0 >= 20); /* backoff: 10-20 ms, then 20-40 ms */
    CHECK_EQ(kvp_meta_allocate(ns, 0, keys, 1, got, NULL, &err), -ECONNREFUSED);
    CHECK(strstr(err.msg, "never sent again") != NULL);
    char why[256];
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), -ECONNREFUSED);
    int scope = 0;
    CHECK_EQ(kvp_meta_health_scope(m, &scope, NULL, 0), -ECONNREFUSED);
    CHECK_EQ(scope, KVP_HEALTH_ALL);

    int p = port;
    *pid = start_server(&p, dir);
    CHECK(*pid > 0);
    if (*pid <= 0)
        return;
    /* the same handle reconnects, and the confirmed keys survived */
    CHECK_EQ(kvp_meta_exists(ns, 0, keys, 2, e, &err), 0);
    CHECK(e[0] == 1 && e[1] == 1);
    CHECK_EQ(kvp_meta_lookup(ns, 0, 1, keys, 2, got, &err), 0);
    CHECK(got[0] == pg[0] && got[1] == pg[1]);
    CHECK(values_of(m).connections > conns);
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- fake servers */

enum fake_mode { FAKE_SLOW, FAKE_4XX, FAKE_503, FAKE_DROP_FIRST, FAKE_FIELDS };

struct fake {
    int lfd, port;
    enum fake_mode mode;
    atomic_int stop;
    atomic_int exists_reqs, alloc_reqs, other_reqs, with_token, with_fields;
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_t conns[64];
    int nconns;
};

struct conn {
    struct fake *f;
    int fd;
};

static void send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void reply(int fd, int status, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                     "%zu\r\n\r\n",
                     status, strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
}

/* Reads one request (headers and Content-Length body) into buf; its length
 * or -1 at the end of the connection. */
static ssize_t read_request(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    char *end = NULL;
    while (!(end = strstr(buf, "\r\n\r\n"))) {
        if (len + 1 >= cap)
            return -1;
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
    }
    size_t need = (size_t)(end + 4 - buf), body = 0;
    for (char *h = buf; h < end; h = strstr(h, "\r\n") + 2)
        if (!strncasecmp(h, "Content-Length:", 15))
            body = strtoul(h + 15, NULL, 10);
    need += body;
    while (len < need) {
        if (len + 1 >= cap)
            return -1;
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0)
            return -1;
        len += (size_t)r;
        buf[len] = '\0';
    }
    return (ssize_t)len;
}

static void *conn_main(void *arg)
{
    struct conn c = *(struct conn *)arg;
    free(arg);
    struct fake *f = c.f;
    static char bufs[64][65536];
    static atomic_int next;
    char *buf = bufs[atomic_fetch_add(&next, 1) % 64];
    for (;;) {
        buf[0] = '\0';
        if (read_request(c.fd, buf, 65536) < 0)
            break;
        if (strstr(buf, "\r\nAuthorization: Bearer s3cret\r\n"))
            atomic_fetch_add(&f->with_token, 1);
        if (strstr(buf, "\r\nX-Kvpage-Errors: fields\r\n"))
            atomic_fetch_add(&f->with_fields, 1);
        int is_exists = strstr(buf, "/exists ") != NULL;
        int is_alloc = strstr(buf, "/reserve_and_allocate_page_indices ") != NULL;
        int nth = is_exists  ? atomic_fetch_add(&f->exists_reqs, 1)
                  : is_alloc ? atomic_fetch_add(&f->alloc_reqs, 1)
                             : atomic_fetch_add(&f->other_reqs, 1);
        if (f->mode == FAKE_SLOW) {
            for (int i = 0; i < 150 && !f->stop; i++)
                sleep_ms(10);
            reply(c.fd, 200, "{\"exists\": [true]}");
        } else if (f->mode == FAKE_4XX) {
            if (is_alloc)
                reply(c.fd, 404,
                      "{\"detail\": \"Rank 3 not initialized. Please call "
                      "/3/initialize first.\"}");
            else if (strstr(buf, "/drop ")) /* a server older than the route */
                reply(c.fd, 404, "{\"detail\": \"Not Found\"}");
            else if (strstr(buf, "/confirm_write "))
                reply(c.fd, 409,
                      "{\"detail\": \"Confirmation failed: page 7 on rank 3 holds "
                      "another key\"}");
            else
                reply(c.fd, 400, "{\"detail\": \"Invalid request: fake \\\"detail\\\" \\u00e9\"}");
        } else if (f->mode == FAKE_FIELDS) {
            /* a server whose words the client cannot read back: only the fields name the rule */
            if (is_exists)
                reply(c.fd, 400,
                      "{\"detail\": \"refused in other words\", \"rule\": \"key\", "
                      "\"index\": 1, \"value\": 2000, \"limit\": 1024}");
            else
                reply(c.fd, 409,
                      "{\"detail\": \"also refused\", \"rule\": \"held_by_other\", \"index\": "
                      "1, \"value\": 9, \"limit\": 0}");
        } else if (f->mode == FAKE_503) {
            reply(c.fd, 503, "{\"detail\": \"Service unavailable: fake outage\"}");
        } else { /* FAKE_DROP_FIRST: the first request of each route is dropped */
            if (nth == 0)
                break;
            if (is_exists)
                reply(c.fd, 200, "{\"exists\": [true]}");
            else if (is_alloc)
                reply(c.fd, 200, "{\"indices\": [[false, 0]]}");
            else
                reply(c.fd, 204, "");
        }
    }
    close(c.fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct fake *f = arg;
    for (;;) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0 || f->stop) {
            if (fd >= 0)
                close(fd);
            if (f->stop)
                break;
            continue;
        }
        struct conn *c = malloc(sizeof *c);
        c->f = f;
        c->fd = fd;
        pthread_mutex_lock(&f->mu);
        if (f->nconns < 64 && pthread_create(&f->conns[f->nconns], NULL, conn_main, c) == 0) {
            f->nconns++;
        } else {
            close(fd);
            free(c);
        }
        pthread_mutex_unlock(&f->mu);
    }
    return NULL;
}

static int fake_start(struct fake *f, enum fake_mode mode)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    pthread_mutex_init(&f->mu, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) || listen(f->lfd, 64) ||
        getsockname(f->lfd, (void *)&a, &l))
        return -1;
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->acceptor, NULL, accept_main, f);
}

/* After every client of f is closed. */
static void fake_stop(struct fake *f)
{
    f->stop = 1;
    /* wake accept() with a connection of our own */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)f->port)};
    connect(fd, (struct sockaddr *)&a, sizeof a);
    close(fd);
    pthread_join(f->acceptor, NULL);
    for (int i = 0; i < f->nconns; i++)
        pthread_join(f->conns[i], NULL);
    close(f->lfd);
    pthread_mutex_destroy(&f->mu);
}

/* ---------------------------------------------------------------- 3. timeouts, 4xx, 503 */

/* A fake server in mode and a client of it: location path (whose deployment
 * is dep, or "default"), pool "kv" unless 4xx's "p". 0, or -1 (checked). */
static int fake_client(struct fake *f, enum fake_mode mode, const char *path, uint32_t timeout_ms,
                       uint32_t retries, struct kvp_meta **m, struct kvp_ns **ns)
{
    struct kvp_error err = {0};
    const char *dep = *path ? path + 4 : "default", *pool = mode == FAKE_4XX ? "p" : "kv";
    if (fake_start(f, mode) || http_open(path, f->port, timeout_ms, retries, m)) {
        CHECK(0);
        return -1;
    }
    int rc = kvp_meta_ns(*m, dep, strlen(dep), pool, strlen(pool), 1, ns, &err);
    CHECK_EQ(rc, 0);
    return rc;
}

static void test_fake_slow(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    if (fake_client(&f, FAKE_SLOW, "", 200, 0, &m, &ns))
        return;
    struct kvp_str k = S("k");
    uint8_t e;
    uint64_t t0 = mono_ms();
    CHECK_EQ(kvp_meta_exists(ns, 0, &k, 1, &e, &err), -ETIMEDOUT);
    uint64_t dt = mono_ms() - t0;
    CHECK(dt >= 150 && dt < 5000);
    CHECK(strstr(err.msg, "/0/exists") != NULL);
    CHECK_EQ(f.exists_reqs, 1); /* retries 0 */
    kvp_meta_close(m);
    fake_stop(&f);
}

static void test_fake_4xx(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    open_token = "s3cret"; /* sent on every request */
    int rc = fake_client(&f, FAKE_4XX, "/ns/d4", 5000, 3, &m, &ns);
    open_token = NULL;
    if (rc)
        return;
    struct kvp_str k = S("k");
    uint8_t e;
    int64_t p = 7;
    CHECK_EQ(kvp_meta_exists(ns, 3, &k, 1, &e, &err), -EINVAL);
    CHECK(strstr(err.msg, "POST /ns/d4/3/exists") && strstr(err.msg, "400") &&
          strstr(err.msg, "Invalid request: fake \"detail\" \xc3\xa9"));
    CHECK_EQ(f.exists_reqs, 1); /* never retried on 4xx */
    CHECK_EQ(kvp_meta_allocate(ns, 3, &k, 1, &p, NULL, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(err.value, 3);
    CHECK(strstr(err.msg, "Rank 3 not initialized") != NULL);
    CHECK_EQ(kvp_meta_confirm(ns, 3, &k, &p, 1, NULL, 0, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_HELD_BY_OTHER);
    CHECK(err.value == 7 && err.index == 0);
    CHECK_EQ(f.alloc_reqs + f.other_reqs, 2);
    CHECK_EQ(f.with_token, 3);
    kvp_meta_close(m);
    fake_stop(&f);
}

/* A server that names the broken rule in its reply's fields (and asked to by
 * the X-Kvpage-Errors header): the error is those, whatever its words. */
static void test_fake_fields(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    if (fake_client(&f, FAKE_FIELDS, "", 5000, 3, &m, &ns))
        return;
    struct kvp_str k[2] = {S("k"), S("l")};
    uint8_t e[2];
    int64_t p[2] = {8, 9};
    CHECK_EQ(kvp_meta_exists(ns, 3, k, 2, e, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_KEY);
    CHECK(err.index == 1 && err.value == 2000 && err.limit == 1024);
    CHECK(strstr(err.msg, "400 refused in other words") != NULL);
    CHECK_EQ(kvp_meta_confirm(ns, 3, k, p, 2, NULL, 0, &err), -EEXIST);
    CHECK_EQ(err.rule, KVP_RULE_HELD_BY_OTHER);
    CHECK(err.index == 1 && err.value == 9);
    CHECK_EQ(f.with_fields, f.exists_reqs + f.alloc_reqs + f.other_reqs);
    kvp_meta_close(m);
    fake_stop(&f);
}

/* kvp_meta_drop of a server that does not know POST /drop: -EOPNOTSUPP,
 * saying so, not "no such namespace". */
static void test_fake_old_drop(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    if (fake_client(&f, FAKE_4XX, "/ns/d5", 5000, 3, &m, &ns))
        return;
    CHECK_EQ(kvp_meta_drop(m, "d5", 2, "p", 1, &err), -EOPNOTSUPP);
    CHECK(strstr(err.msg, "cannot drop a namespace") && strstr(err.msg, "POST /ns/d5/drop"));
    kvp_meta_close(m);
    fake_stop(&f);
}

/* kvp_meta_drop through POST /drop of the real server: gone, a second drop
 * finds nothing, the namespace's next init creates it again, empty. */
static void test_drop(int port)
{
    struct kvp_meta *m;
    if (http_open("", port, 5000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns = NULL;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_ns(m, "dropme", 6, "pool x", 6, 1, &ns, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 2, 16, &err), 0);
    struct kvp_str k = S("k");
    int64_t p = -1;
    CHECK_EQ(kvp_meta_allocate(ns, 2, &k, 1, &p, NULL, &err), 0);
    CHECK_EQ(kvp_meta_confirm(ns, 2, &k, &p, 1, NULL, 0, &err), 0);
    CHECK_EQ(kvp_meta_drop(m, "dropme", 6, "pool x", 6, &err), 0);
    struct kvp_ns *again = NULL;
    CHECK_EQ(kvp_meta_ns(m, "dropme", 6, "pool x", 6, 0, &again, &err), -ENOENT);
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_drop(m, "dropme", 6, "pool x", 6, &err), -ENOENT);
    CHECK(strstr(err.msg, "Namespace not found") != NULL);
    CHECK_EQ(kvp_meta_init_rank(ns, 2, 16, &err), 0);
    p = 0;
    CHECK_EQ(kvp_meta_lookup(ns, 2, 0, &k, 1, &p, &err), 0);
    CHECK_EQ(p, -1);
    CHECK_EQ(kvp_meta_drop(m, "dropme", 6, "pool x", 6, &err), 0);
    kvp_meta_close(m);
}

static void test_fake_503(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    if (fake_client(&f, FAKE_503, "", 5000, 3, &m, &ns))
        return;
    struct kvp_str k = S("k");
    uint8_t e;
    int64_t p;
    CHECK_EQ(kvp_meta_exists(ns, 0, &k, 1, &e, &err), -EIO);
    CHECK(strstr(err.msg, "503") && strstr(err.msg, "fake outage"));
    CHECK_EQ(f.exists_reqs, 4); /* once and retries = 3 times */
    CHECK_EQ(values_of(m).retries, 3);
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, &err), -EIO);
    CHECK_EQ(f.alloc_reqs, 1); /* an allocation is never repeated */
    CHECK_EQ(values_of(m).retries, 3);
    char why[256];
    CHECK(kvp_meta_health(m, why, sizeof why) < 0);
    CHECK(strstr(why, "503") != NULL);
    kvp_meta_close(m);
    fake_stop(&f);
}

static void test_fake_drop(void)
{
    struct fake f;
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    if (fake_client(&f, FAKE_DROP_FIRST, "", 5000, 3, &m, &ns))
        return;
    struct kvp_str k = S("k");
    uint8_t e = 0;
    int64_t p = 99;
    /* exists: dropped, retried, answered */
    CHECK_EQ(kvp_meta_exists(ns, 0, &k, 1, &e, &err), 0);
    CHECK_EQ(e, 1);
    CHECK_EQ(f.exists_reqs, 2);
    /* allocate on the kept-alive connection: dropped, and not sent again
     * (neither by the backend nor by libcurl's own re-send on a reused
     * connection) */
    CHECK(kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, &err) < 0);
    CHECK_EQ(err.code, -ECONNRESET);
    CHECK(strstr(err.msg, "reserve_and_allocate_page_indices") != NULL);
    CHECK_EQ(f.alloc_reqs, 1);
    /* the next one is answered */
    CHECK_EQ(kvp_meta_allocate(ns, 0, &k, 1, &p, NULL, &err), 0);
    CHECK_EQ(p, 0);
    CHECK_EQ(f.alloc_reqs, 2);
    kvp_meta_close(m);
    fake_stop(&f);
}

/* ---------------------------------------------------------------- pins, the query by hashes */

/* allocate + confirm of one key on rank: its page, or -1 */
static int64_t put1(struct kvp_ns *ns, uint32_t rank, const char *key)
{
    struct kvp_str k = S(key);
    int64_t p = -1;
    struct kvp_error err = {0};
    if (kvp_meta_allocate(ns, rank, &k, 1, &p, NULL, &err) || p < 0 ||
        kvp_meta_confirm(ns, rank, &k, &p, 1, NULL, 0, &err))
        return -1;
    return p;
}

static void check_pinned(struct kvp_ns *ns, int64_t rank, uint64_t keys, uint64_t refs)
{
    uint64_t k = 99, r = 99;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_pinned(ns, rank, &k, &r, &err), 0);
    if (k != keys || r != refs)
        fprintf(stderr, "pinned(rank %lld): %llu keys %llu refs, not %llu and %llu (%s)\n",
                (long long)rank, (unsigned long long)k, (unsigned long long)r,
                (unsigned long long)keys, (unsigned long long)refs, err.msg);
    CHECK(k == keys && r == refs);
}

/* kvp_meta_pin, _unpin, _pinned over POST/DELETE /v1/pins and /v1/stats:
 * the in-process engine's rule (test_pins.c), errors and figures. */
static void test_pins(int port)
{
    struct kvp_meta *m;
    if (http_open("/ns/pinsdep", port, 10000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    uint64_t total = 9, limit = 9, released = 9;
    CHECK_EQ(kvp_meta_ns(m, "pinsdep", 7, "kv", 2, 1, &ns, &err), 0);
    struct kvp_str a = S("a"), aba[] = {S("a"), S("b"), S("a")}, c = S("c");
    /* no rank yet: nothing to pin, nothing to unpin, no pins */
    CHECK_EQ(kvp_meta_pin(ns, &a, 1, 60000, 0.5, &total, &limit, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(kvp_meta_unpin(ns, &a, 1, &released, &err), 0);
    CHECK_EQ(released, 0);
    check_pinned(ns, -1, 0, 0);
    CHECK_EQ(kvp_meta_pinned(ns, 0, NULL, NULL, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);

    CHECK_EQ(kvp_meta_init_rank(ns, 0, 4, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, &err), 0);
    const char *keys[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        CHECK(put1(ns, 0, keys[i]) >= 0);
    /* a twice: two references; the limit is 0.5 of the smallest rank's 4 pages */
    CHECK_EQ(kvp_meta_pin(ns, aba, 3, 60000, 0.5, &total, &limit, &err), 0);
    CHECK(total == 2 && limit == 2);
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_pin(ns, &c, 1, 60000, 0.5, &total, &limit, &err), -ENOSPC);
    CHECK_EQ(err.code, -ENOSPC);
    CHECK_EQ(err.rule, KVP_RULE_TOO_MANY);
    CHECK(err.value == 3 && err.limit == 2);
    CHECK(total == 2 && limit == 2);
    CHECK(strstr(err.msg, "POST /ns/pinsdep/v1/pins: 409 Pin refused: pinning 1 more keys") !=
          NULL);
    /* the caller's ratio counts when it is the lower (here 1 of 4 pages)... */
    CHECK_EQ(kvp_meta_pin(ns, &a, 1, 60000, 0.25, &total, &limit, &err), -ENOSPC);
    CHECK(err.value == 2 && err.limit == 1 && limit == 1);
    /* ...the server's (--max-pinned-ratio 0.5) when it is */
    CHECK_EQ(kvp_meta_pin(ns, &c, 1, 60000, 1.0, NULL, NULL, &err), -ENOSPC);
    CHECK_EQ(err.limit, 2);
    check_pinned(ns, -1, 2, 3);
    check_pinned(ns, 0, 2, 3);
    check_pinned(ns, 1, 0, 0); /* rank 1 holds none of them */
    CHECK_EQ(kvp_meta_pinned(ns, 5, NULL, NULL, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    /* eviction passes over a and b */
    CHECK(put1(ns, 0, "e") >= 0);
    struct kvp_str ab[] = {S("a"), S("b")};
    uint8_t e2[2] = {0, 0};
    CHECK_EQ(kvp_meta_exists(ns, 0, ab, 2, e2, &err), 0);
    CHECK(e2[0] == 1 && e2[1] == 1);
    /* counted: one unpin of a leaves it pinned; keys not pinned are passed over */
    CHECK_EQ(kvp_meta_unpin(ns, &a, 1, &released, &err), 0);
    CHECK_EQ(released, 1);
    check_pinned(ns, -1, 2, 2);
    struct kvp_str abz[] = {S("a"), S("b"), S("z")};
    CHECK_EQ(kvp_meta_unpin(ns, abz, 3, &released, &err), 0);
    CHECK_EQ(released, 2);
    check_pinned(ns, -1, 0, 0);
    /* a pin ends at its deadline (the server's clock) */
    CHECK_EQ(kvp_meta_pin(ns, &a, 1, 200, 0.5, &total, &limit, &err), 0);
    CHECK_EQ(total, 1);
    sleep_ms(1200);
    check_pinned(ns, -1, 0, 0);
    /* bad arguments are the interface's, before any request */
    CHECK_EQ(kvp_meta_pin(ns, &a, 1, 0, 0.5, NULL, NULL, &err), -EINVAL);
    kvp_meta_close(m);
}

/* kvp_meta_exists_hashes over POST /v1/query with "held": the same
 * answers as test_pins.c's in-process ones. */
static void test_exists_hashes(int port)
{
    struct kvp_meta *m;
    if (http_open("", port, 10000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_ns(m, "default", 7, "hx", 2, 1, &ns, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, &err), 0);
    CHECK(put1(ns, 0, "ffeeddccbbaa99887766554433221100") >= 0);
    CHECK(put1(ns, 1, "m@00112233445566778899aabbccddeeff") >= 0);
    CHECK(put1(ns, 1, "short") >= 0);
    uint64_t h[] = {0xffeeddccbbaa9988u, 0x8899aabbccddeeffu, 0x8899aabbccddeeffu, 1};
    uint32_t ranks[] = {0, 1}, one = 1, bad[] = {1, 5};
    uint8_t out[8];
    memset(out, 9, sizeof out);
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_SGLANG, ranks, 2, out, &err), 0);
    uint8_t sgl[] = {1, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!memcmp(out, sgl, 8));
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_VLLM, ranks, 2, out, &err), 0);
    uint8_t vll[] = {0, 0, 0, 1, 0, 1, 0, 0};
    CHECK(!memcmp(out, vll, 8));
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_VLLM, &one, 1, out, &err), 0);
    uint8_t r1[] = {0, 1, 1, 0};
    CHECK(!memcmp(out, r1, 4));
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, KVP_HASH_VLLM, bad, 2, out, &err), -ENOENT);
    CHECK_EQ(err.rule, KVP_RULE_RANK_NOT_INIT);
    CHECK_EQ(err.value, 5);
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 4, 7, ranks, 2, out, &err), -EINVAL);
    CHECK_EQ(kvp_meta_exists_hashes(ns, h, 0, KVP_HASH_SGLANG, ranks, 2, out, &err), 0);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- 4. threads */

#define NTHREADS 8
static int iters = 150;

struct worker {
    struct kvp_ns *ns;
    int id, failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvp_error err = {0};
    for (int i = 0; i < iters; i++) {
        char a[32], b[32];
        snprintf(a, sizeof a, "t%d-%d-a", w->id, i);
        snprintf(b, sizeof b, "t%d-%d-b", w->id, i);
        struct kvp_str k[] = {S(a), S(b)};
        int64_t pg[2], got = -2;
        uint8_t ex[2];
        if (kvp_meta_allocate(w->ns, 0, k, 2, pg, ex, &err) || pg[0] < 0 || pg[1] < 0 || ex[0] ||
            ex[1] || kvp_meta_confirm(w->ns, 0, k, pg, 1, &pg[1], 1, &err) ||
            kvp_meta_lookup(w->ns, 0, 0, k, 1, &got, &err) || got != pg[0] ||
            (i % 2 && kvp_meta_delete(w->ns, 0, k, 1, &err))) {
            if (w->failures++ < 3)
                fprintf(stderr, "worker %d iteration %d: %s\n", w->id, i, err.msg);
        }
    }
    return NULL;
}

static void test_threads(int port)
{
    struct kvp_meta *m;
    struct kvp_error err = {0};
    if (http_open("/ns/conc", port, 20000, 3, &m)) {
        CHECK(0);
        return;
    }
    struct kvp_ns *ns;
    const uint32_t num_pages = 2 * NTHREADS * 100;
    CHECK_EQ(kvp_meta_ns(m, "conc", 4, "pool x", 6, 1, &ns, &err), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, num_pages, &err), 0);
    pthread_t t[NTHREADS];
    struct worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (struct worker){.ns = ns, .id = i};
        pthread_create(&t[i], NULL, worker_main, &w[i]);
    }
    int failures = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(t[i], NULL);
        failures += w[i].failures;
    }
    CHECK_EQ(failures, 0);
    struct want_ns s = {.dep = "conc", .pool = "pool x"};
    CHECK_EQ(kvp_meta_stats(m, stats_fn, &s), 0);
    CHECK(s.found && s.nranks == 1);
    /* every even iteration keeps its key; nothing else holds or reserves a page */
    CHECK_EQ(s.r[0].reserved, 0);
    CHECK_EQ(s.r[0].held, NTHREADS * ((iters + 1) / 2));
    CHECK_EQ(s.r[0].free + s.r[0].held, num_pages);
    struct values v = values_of(m);
    CHECK(v.requests >= (uint64_t)NTHREADS * iters * 3);
    CHECK(v.connections >= 1 && v.connections <= 16);
    printf("threads: %llu requests over %llu connections\n", (unsigned long long)v.requests,
           (unsigned long long)v.connections);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    if (argc > 1)
        iters = atoi(argv[1]);
    signal(SIGPIPE, SIG_IGN);
    scratch_make(tmpdir, sizeof tmpdir, "http", 0);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/data", tmpdir);

    test_fake_slow();
    test_fake_4xx();
    test_fake_fields();
    test_fake_503();
    test_fake_drop();
    test_fake_old_drop();

    int port = 0;
    pid_t pid = start_server(&port, dir);
    CHECK(pid > 0);
    if (pid > 0) {
        test_round_trip(port);
        test_drop(port);
        test_pins(port);
        test_exists_hashes(port);
        test_restart(&pid, port, dir);
    }
    if (pid > 0) {
        test_threads(port);
        int st = stop_server(pid, SIGTERM);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    if (check_failed) {
        char log[128], line[512];
        snprintf(log, sizeof log, "%s/server.log", tmpdir);
        FILE *fp = fopen(log, "r");
        fprintf(stderr, "--- %s\n", log);
        while (fp && fgets(line, sizeof line, fp))
            fputs(line, stderr);
        if (fp)
            fclose(fp);
    }
    scratch_remove(tmpdir);
    return check_report();
}
