/*
 * The metadata interface above its backends (src/meta/meta.c): locations and
 * their schemes, that a backend sees only validated input, the documented
 * defaults of every *_opts_init, and durability: a change call returns only
 * once its change is durable (fsync batch), and the _async form completes.
 *
 * Linked with --wrap=fsync/fdatasync (CMakeLists.txt): a gate holds every
 * sync of the log while the test looks at what has returned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/meta.h"
#include "kvpage/pagefile.h"
#include "meta/backend.h"
#include "mono.h"
#include "scratch.h"

/* ---------------------------------------------------------------- the sync gate */

int __real_fsync(int fd);
int __real_fdatasync(int fd);
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed;
static atomic_int syncs_done, syncs_waiting;

static void gate_pass(void)
{
    pthread_mutex_lock(&gate_mu);
    atomic_fetch_add(&syncs_waiting, 1);
    while (gate_closed)
        pthread_cond_wait(&gate_cv, &gate_mu);
    atomic_fetch_sub(&syncs_waiting, 1);
    pthread_mutex_unlock(&gate_mu);
}

int __wrap_fsync(int fd)
{
    gate_pass();
    int rc = __real_fsync(fd);
    atomic_fetch_add(&syncs_done, 1);
    return rc;
}

int __wrap_fdatasync(int fd)
{
    gate_pass();
    int rc = __real_fdatasync(fd);
    atomic_fetch_add(&syncs_done, 1);
    return rc;
}

static void gate_set(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* ---------------------------------------------------------------- a test backend */

/* Records what reached it and fails the test on any input the interface
 * should have stopped. Holds one namespace; every call succeeds. */
static struct {
    int opened, calls, bad;
    char where[64];
    struct kvp_ns ns;
    uint64_t next_ticket;
    int waits;
} tb;

static void tb_keys(const struct kvp_str *keys, size_t n)
{
    if (n && !keys)
        tb.bad++;
    for (size_t i = 0; i < n; i++)
        if (keys[i].len == 0 || keys[i].len > KVP_MAX_KEY_LEN ||
            memchr(keys[i].ptr, 0, keys[i].len))
            tb.bad++;
}

static void tb_rank(int64_t rank, int any)
{
    if (rank > (int64_t)KVP_MAX_RANK || (rank < 0 && !any) || rank < -1)
        tb.bad++;
}

static int tb_open(struct kvp_meta *m, const char *where, struct kvp_error *err)
{
    (void)err;
    tb.opened++;
    snprintf(tb.where, sizeof tb.where, "%s", where ? where : "(null)");
    tb.ns.meta = m;
    m->be = &tb;
    return 0;
}

static void tb_close(struct kvp_meta *m)
{
    (void)m;
    tb.opened--;
}

static int tb_ns(struct kvp_meta *m, const char *d, size_t dl, const char *p, size_t pl, int create,
                 struct kvp_ns **out, uint64_t *ticket, struct kvp_error *err)
{
    (void)m, (void)create, (void)ticket, (void)err;
    tb.calls++;
    tb.bad += !kvp_deployment_valid(d, dl) || !kvp_pool_valid(p, pl);
    *out = &tb.ns;
    return 0;
}

static int tb_init(struct kvp_ns *ns, uint32_t rank, uint32_t np, uint64_t *ticket,
                   struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 0);
    tb.bad += np < 1 || np > KVP_MAX_PAGES || !ticket;
    *ticket = ++tb.next_ticket;
    return 0;
}

static int tb_alloc(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys, size_t n,
                    int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    (void)ns, (void)existed, (void)err;
    tb.calls++;
    tb_rank(rank, 0);
    tb_keys(keys, n);
    tb.bad += (n && !pages) || !ticket;
    for (size_t i = 0; i < n; i++)
        pages[i] = (int64_t)i;
    *ticket = ++tb.next_ticket;
    return 0;
}

static int tb_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                      const int64_t *pages, size_t n, const int64_t *rel, size_t nrel,
                      uint64_t *ticket, struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 0);
    tb_keys(keys, n);
    tb.bad += (n && !pages) || (nrel && !rel) || !ticket;
    *ticket = ++tb.next_ticket;
    return 0;
}

static int tb_exists(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint8_t *out, struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 1);
    tb_keys(keys, n);
    tb.bad += n && !out;
    memset(out, 1, n);
    return 0;
}

static int tb_lookup(struct kvp_ns *ns, uint32_t rank, int complete, const struct kvp_str *keys,
                     size_t n, int64_t *pages, struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 0);
    tb_keys(keys, n);
    tb.bad += (n && !pages) || (complete != 0 && complete != 1);
    for (size_t i = 0; i < n; i++)
        pages[i] = -1;
    return 0;
}

static int tb_del(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                  uint64_t *ticket, struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 1);
    tb_keys(keys, n);
    *ticket = ++tb.next_ticket;
    return 0;
}

static int tb_clear(struct kvp_ns *ns, int64_t rank, uint64_t *ticket, struct kvp_error *err)
{
    (void)ns, (void)err;
    tb.calls++;
    tb_rank(rank, 1);
    *ticket = ++tb.next_ticket;
    return 0;
}

static size_t tb_nranks(struct kvp_ns *ns)
{
    (void)ns;
    return 1;
}

static int tb_stats(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg)
{
    (void)m, (void)fn, (void)arg;
    return 0;
}

static int tb_check(struct kvp_meta *m, struct kvp_error *err)
{
    (void)m, (void)err;
    return 0;
}

static int tb_wait(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err)
{
    (void)m, (void)err;
    tb.waits++;
    tb.bad += ticket == 0 || ticket > tb.next_ticket;
    return 0;
}

static int tb_when(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn, void *arg)
{
    (void)m, (void)fn, (void)arg;
    tb.bad += ticket == 0;
    return 1;
}

static const struct kvp__meta_ops tb_ops = {
    .name = "test",
    .open = tb_open,
    .close = tb_close,
    .ns = tb_ns,
    .init_rank = tb_init,
    .allocate = tb_alloc,
    .confirm = tb_confirm,
    .exists = tb_exists,
    .lookup = tb_lookup,
    .del = tb_del,
    .clear = tb_clear,
    .nranks = tb_nranks,
    .stats = tb_stats,
    .check = tb_check,
    .wait = tb_wait,
    .when_durable = tb_when,
};

#define K(s) ((struct kvp_str){(s), sizeof(s) - 1})

static void test_locations(void)
{
    struct kvp_meta *m = (struct kvp_meta *)1;
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_open_at("ftp://x", NULL, &m, &err), -EINVAL);
    CHECK(m == NULL);
    CHECK_EQ(err.rule, KVP_RULE_ARG);
    CHECK(strstr(err.msg, "'ftp:'") && strstr(err.msg, "mem:") && strstr(err.msg, "file:"));
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_open_at("no scheme here", NULL, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "no scheme") != NULL);
    memset(&err, 0, sizeof err);
    /* A server's address without its scheme: the URL it meant is named. */
    CHECK_EQ(kvp_meta_open_at("127.0.0.1:18501", NULL, &m, &err), -EINVAL);
    CHECK(m == NULL && strstr(err.msg, "did you mean http://127.0.0.1:18501?") != NULL);
    memset(&err, 0, sizeof err);
    /* http: is the remote backend (test_http_client.c); opening connects to nothing. */
    CHECK_EQ(kvp_meta_open_at("http://127.0.0.1:18000", NULL, &m, &err), 0);
    kvp_meta_close(m);
    CHECK_EQ(kvp_meta_open_at("http://127.0.0.1:18000/ns/d1", NULL, &m, &err), 0);
    kvp_meta_close(m);
    CHECK_EQ(kvp_meta_open_at("http://127.0.0.1:18000/other", NULL, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "/ns/NAME") != NULL);
    CHECK_EQ(kvp_meta_open_at("http://127.0.0.1:18000/ns/bad!name", NULL, &m, &err), -EINVAL);
    CHECK_EQ(kvp_meta_open_at("http:", NULL, &m, &err), -EINVAL);
    CHECK_EQ(kvp_meta_open_at("https://127.0.0.1:18000", NULL, &m, &err), -EOPNOTSUPP);
    CHECK(strstr(err.msg, "'https:'") && strstr(err.msg, "not implemented"));
    /* redis: is a backend (test_meta_redis.c); TLS to Redis is not. */
    CHECK_EQ(kvp_meta_open_at("rediss://127.0.0.1:6379", NULL, &m, &err), -EOPNOTSUPP);
    CHECK(strstr(err.msg, "'rediss:'") && strstr(err.msg, "not implemented"));
    CHECK_EQ(kvp_meta_open_at("redis:127.0.0.1", NULL, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "redis://") != NULL);
    CHECK_EQ(kvp_meta_open_at("file:", NULL, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "no directory") != NULL);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.opts_size = sizeof o + 8; /* from a newer header than the library */
    CHECK_EQ(kvp_meta_open_at("mem:", &o, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "opts_size") != NULL);
    kvp_meta_opts_init(&o);
    o.fsync = 7;
    CHECK_EQ(kvp_meta_open_at("mem:", &o, &m, &err), -EINVAL);

    /* mem: and the test scheme open; the rest of the location reaches the backend. */
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m, &err), 0);
    kvp_meta_close(m);
    CHECK_EQ(kvp__meta_register("test", &tb_ops), 0);
    CHECK_EQ(kvp__meta_register("test", &tb_ops), -EEXIST);
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_open_at("nope:", NULL, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "test:") != NULL); /* the schemes there are, now with test: */
    CHECK_EQ(kvp_meta_open_at("test:somewhere", NULL, &m, &err), 0);
    CHECK_EQ(tb.opened, 1);
    CHECK(!strcmp(tb.where, "somewhere"));
    kvp_meta_close(m);
    CHECK_EQ(tb.opened, 0);
}

/* Every bad call is stopped above the backend, with the error the in-process
 * backend gives too; every good one reaches it with valid input. */
static void test_backend_sees_valid_input(void)
{
    struct kvp_meta *m[2];
    CHECK_EQ(kvp_meta_open_at("test:", NULL, &m[0], NULL), 0);
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m[1], NULL), 0);
    char nul[3] = {'a', 0, 'b'};
    static char longkey[KVP_MAX_KEY_LEN + 1];
    memset(longkey, 'k', sizeof longkey);
    struct kvp_str bad[3] = {{"ok", 2}, {nul, 3}, {longkey, sizeof longkey}};
    struct kvp_str empty = {"", 0};
    int64_t pages[4] = {0, 1, 2, 3};
    uint8_t flags[4];
    for (int b = 0; b < 2; b++) {
        struct kvp_ns *ns = NULL;
        struct kvp_error e = {0};
        CHECK_EQ(kvp_meta_ns(m[b], "a/b", 3, "kv", 2, 1, &ns, &e), -EINVAL);
        CHECK_EQ(e.rule, KVP_RULE_NAMESPACE);
        CHECK_EQ(kvp_meta_ns(m[b], nul, 3, "kv", 2, 1, &ns, &e), -EINVAL);
        CHECK_EQ(kvp_meta_ns(m[b], "d", 1, nul, 3, 1, &ns, &e), -EINVAL);
        CHECK_EQ(kvp_meta_ns(m[b], "d", 1, "", 0, 1, &ns, &e), -EINVAL);
        int calls = tb.calls;
        CHECK_EQ(kvp_meta_ns(m[b], "d", 1, "kv", 2, 1, &ns, &e), 0);
        CHECK(ns != NULL);
        CHECK_EQ(kvp_meta_init_rank(ns, 0, 8, NULL), 0);
        if (b == 0)
            CHECK_EQ(tb.calls, calls + 2);
        calls = tb.calls;
        CHECK_EQ(kvp_meta_init_rank(ns, 1u << 31, 8, &e), -EINVAL);
        CHECK_EQ(e.rule, KVP_RULE_RANK_RANGE);
        CHECK_EQ(kvp_meta_init_rank(ns, 0, 0, &e), -EINVAL);
        CHECK_EQ(e.rule, KVP_RULE_NUM_PAGES);
        CHECK_EQ(kvp_meta_init_rank(ns, 0, (uint64_t)KVP_MAX_PAGES + 1, &e), -EINVAL);
        CHECK_EQ(kvp_meta_allocate(ns, 0, bad, 3, pages, NULL, &e), -EINVAL);
        CHECK_EQ(e.rule, KVP_RULE_KEY);
        CHECK_EQ(e.index, 1);
        CHECK(strstr(e.msg, "NUL") != NULL);
        CHECK_EQ(kvp_meta_allocate(ns, 0, bad + 2, 1, pages, NULL, &e), -EINVAL);
        CHECK_EQ(e.value, KVP_MAX_KEY_LEN + 1);
        CHECK_EQ(kvp_meta_allocate(ns, 0, &empty, 1, pages, NULL, &e), -EINVAL);
        CHECK_EQ(kvp_meta_allocate(ns, 0, bad, 1, NULL, NULL, &e), -EINVAL);
        CHECK_EQ(e.rule, KVP_RULE_ARG);
        CHECK_EQ(kvp_meta_allocate(ns, 0, NULL, 1, pages, NULL, &e), -EINVAL);
        CHECK_EQ(kvp_meta_confirm(ns, 0, bad, pages, 2, NULL, 0, &e), -EINVAL);
        CHECK_EQ(kvp_meta_confirm(ns, 0, bad, pages, 1, NULL, 2, &e), -EINVAL);
        CHECK_EQ(kvp_meta_exists(ns, -1, bad, 2, flags, &e), -EINVAL);
        CHECK_EQ(kvp_meta_exists(ns, (int64_t)KVP_MAX_RANK + 1, bad, 1, flags, &e), -EINVAL);
        CHECK_EQ(kvp_meta_lookup(ns, 0, 1, bad + 1, 1, pages, &e), -EINVAL);
        CHECK_EQ(kvp_meta_lookup(ns, 1u << 31, 1, bad, 1, pages, &e), -EINVAL);
        CHECK_EQ(kvp_meta_delete(ns, 0, bad, 3, &e), -EINVAL);
        CHECK_EQ(kvp_meta_clear(ns, (int64_t)1 << 40, &e), -EINVAL);
        CHECK_EQ(kvp_meta_clear(NULL, 0, &e), -EINVAL);
        uint64_t t = 0;
        CHECK_EQ(kvp_meta_confirm_async(ns, 0, bad, pages, 1, NULL, 0, NULL, &e), -EINVAL);
        if (b == 0)
            CHECK_EQ(tb.calls, calls); /* none of them reached the backend */
        /* Valid calls, with rank -1 (every rank) where the call allows it. */
        CHECK_EQ(kvp_meta_allocate(ns, 0, bad, 1, pages, flags, &e), 0);
        CHECK_EQ(kvp_meta_confirm_async(ns, 0, bad, pages, 1, NULL, 0, &t, &e), 0);
        CHECK_EQ(kvp_meta_wait(m[b], t, &e), 0);
        CHECK_EQ(kvp_meta_exists(ns, -3, bad, 1, flags, &e), 0); /* any negative rank: all */
        CHECK_EQ(kvp_meta_exists(ns, 0, bad, 1, flags, &e), 0);
        CHECK_EQ(kvp_meta_lookup(ns, 0, 1, bad, 1, pages, &e), 0);
        CHECK_EQ(kvp_meta_delete(ns, -7, bad, 1, &e), 0); /* any negative rank: every rank */
        CHECK_EQ(kvp_meta_clear(ns, -1, &e), 0);
        CHECK_EQ(kvp_meta_wait(m[b], 0, &e), 0); /* nothing to wait for */
        if (b == 0)
            CHECK_EQ(tb.calls, calls + 7);
    }
    CHECK_EQ(tb.bad, 0);
    CHECK(tb.waits >= 5); /* the blocking calls waited on their tickets */
    kvp_meta_close(m[0]);
    kvp_meta_close(m[1]);
}

/* The defaults documented in kvpage/meta.h and kvpage/pagefile.h. */
static void test_documented_defaults(void)
{
    struct kvp_meta_opts o;
    memset(&o, 0x5a, sizeof o);
    kvp_meta_opts_init(&o);
    CHECK_EQ(o.opts_size, sizeof o);
    CHECK_EQ(o.lease_ms, 120000);
    CHECK_EQ(o.read_grace_ms, 5000);
    CHECK(o.clock == NULL && o.clock_arg == NULL && o.data_dir == NULL && o.log == NULL);
    CHECK_EQ(o.fsync, KVP_FSYNC_BATCH);
    CHECK_EQ(o.snapshot_bytes, (uint64_t)64 << 20);
    CHECK_EQ(o.readonly, 0);
    CHECK_EQ(o.snapshot_mode, KVP_SNAPSHOT_THREAD);

    struct kvp_pagefile_opts p;
    memset(&p, 0x5a, sizeof p);
    kvp_pagefile_opts_init(&p);
    CHECK_EQ(p.opts_size, sizeof p);
    CHECK_EQ(p.size, 0);
    CHECK_EQ(p.bytes_per_page, 0);
    CHECK_EQ(p.entries, 8);
    CHECK_EQ(p.flags, 0);
    CHECK_EQ(p.backend, KVP_PAGEFILE_BACKEND_AUTO);
    CHECK_EQ(p.mode, 0644);
}

/* ---------------------------------------------------------------- durability */

struct confirm_job {
    struct kvp_ns *ns;
    atomic_int done;
    int rc;
};

static void *confirm_thread(void *arg)
{
    struct confirm_job *j = arg;
    struct kvp_str k = K("blocking");
    int64_t page = 1;
    j->rc = kvp_meta_confirm(j->ns, 0, &k, &page, 1, NULL, 0, NULL);
    atomic_store(&j->done, 1);
    return NULL;
}

static atomic_int cb_calls, cb_status = 99;
static void on_durable(void *arg, int status)
{
    (void)arg;
    atomic_store(&cb_status, status);
    atomic_fetch_add(&cb_calls, 1);
}

static void test_durability(const char *base)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/durable", base);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o); /* fsync batch, the default */
    struct kvp_meta *m;
    char loc[320];
    snprintf(loc, sizeof loc, "file:%s", dir);
    CHECK_EQ(kvp_meta_open_at(loc, &o, &m, NULL), 0);
    struct kvp_ns *ns;
    CHECK_EQ(kvp_meta_ns(m, "d", 1, "kv", 2, 1, &ns, NULL), 0);
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 16, NULL), 0);

    /* The blocking call does not return while the log's sync is held. */
    gate_set(1);
    int before = atomic_load(&syncs_done);
    struct confirm_job job = {.ns = ns};
    pthread_t t;
    pthread_create(&t, NULL, confirm_thread, &job);
    for (int i = 0; i < 200 && atomic_load(&syncs_waiting) == 0; i++)
        sleep_ms(5);
    CHECK(atomic_load(&syncs_waiting) > 0); /* the flusher reached its fsync */
    sleep_ms(100);
    CHECK_EQ(atomic_load(&job.done), 0); /* ... and the call waits for it */
    /* Its change is applied and visible meanwhile (not yet acknowledged). */
    struct kvp_str k = K("blocking");
    uint8_t e = 0;
    CHECK_EQ(kvp_meta_exists(ns, 0, &k, 1, &e, NULL), 0);
    CHECK_EQ(e, 1);
    gate_set(0);
    pthread_join(t, NULL);
    CHECK_EQ(job.rc, 0);
    CHECK(atomic_load(&syncs_done) > before);

    /* The _async form returns at once with a ticket that completes later. */
    gate_set(1);
    struct kvp_str a = K("async");
    int64_t page = 2;
    uint64_t ticket = 0;
    CHECK_EQ(kvp_meta_confirm_async(ns, 0, &a, &page, 1, NULL, 0, &ticket, NULL), 0);
    CHECK(ticket > 0);
    uint64_t t2 = ticket;
    struct kvp_str d = K("blocking");
    CHECK_EQ(kvp_meta_delete_async(ns, 0, &d, 1, &t2, NULL), 0);
    CHECK(t2 > ticket); /* raised by the later change, never lowered */
    CHECK_EQ(kvp_meta_when_durable(m, t2, on_durable, NULL), 0);
    sleep_ms(100);
    CHECK_EQ(atomic_load(&cb_calls), 0);
    gate_set(0);
    for (int i = 0; i < 400 && atomic_load(&cb_calls) == 0; i++)
        sleep_ms(5);
    CHECK_EQ(atomic_load(&cb_calls), 1);
    CHECK_EQ(atomic_load(&cb_status), 0);
    CHECK_EQ(kvp_meta_when_durable(m, t2, on_durable, NULL), 1); /* durable already */
    CHECK_EQ(kvp_meta_wait(m, t2, NULL), 0);
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_wait(m, t2 + 1000000, &err), -EINVAL); /* not a ticket of this handle */
    CHECK_EQ(err.rule, KVP_RULE_ARG);

    /* Values and health come through the interface. */
    char why[256] = "x";
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    CHECK_EQ(why[0], '\0');
    int scope = -1;
    CHECK_EQ(kvp_meta_health_scope(m, &scope, why, sizeof why), 0);
    CHECK_EQ(scope, 0);
    char desc[512], want[400];
    snprintf(want, sizeof want, "data directory %s (write-ahead log, fsync batch)", dir);
    CHECK_EQ(kvp_meta_describe(m, desc, sizeof desc), (int)strlen(want));
    CHECK(!strcmp(desc, want));
    CHECK_EQ(kvp_meta_describe(m, desc, 5), (int)strlen(want)); /* cut, as snprintf */
    CHECK(!strcmp(desc, "data"));
    CHECK_EQ(kvp_meta_describe(NULL, desc, sizeof desc), -EINVAL);
    CHECK_EQ(kvp_meta_snapshot(m), 0);
    CHECK_EQ(kvp_meta_check(m, NULL), 0);
    kvp_meta_close(m);

    /* After a restart both changes are there. */
    CHECK_EQ(kvp_meta_open_at(loc, &o, &m, NULL), 0);
    CHECK_EQ(kvp_meta_ns(m, "d", 1, "kv", 2, 0, &ns, NULL), 0);
    int64_t got[2];
    struct kvp_str both[2] = {K("async"), K("blocking")};
    CHECK_EQ(kvp_meta_lookup(ns, 0, 0, both, 2, got, NULL), 0);
    CHECK_EQ(got[0], 2);
    CHECK_EQ(got[1], -1);
    kvp_meta_close(m);
}

int main(void)
{
    char base[64];
    scratch_make(base, sizeof base, "dispatch", 0);
    test_locations();
    test_backend_sees_valid_input();
    test_documented_defaults();
    test_durability(base);
    scratch_remove(base);
    return check_report();
}
