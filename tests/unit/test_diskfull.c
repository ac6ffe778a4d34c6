/*
 * A full or failing disk under src/meta's persistence. The fault shim of the
 * integration tests (tests/integration/faultshim.c) is linked in, so that the
 * library's writes of the log and the snapshots fail on demand:
 *   - no room: writing the zeros ahead of the log fails with ENOSPC. Every
 *     change is refused with -ENOSPC before it changes anything, on every
 *     call that logs; once the zeros can be written again the next change
 *     succeeds by itself, and a restart finds exactly the accepted changes.
 *   - a failed log: writing the records (or their fdatasync) fails. That
 *     change is applied but its wait reports the error; later changes are
 *     refused before they change anything; a snapshot (the background one,
 *     or kvp__meta_snapshot_now) brings the log back, the unacknowledged
 *     change included, and a restart keeps it.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"
#include "meta/local/meta_int.h"

/* The ticket of the last _async calls (kvpage/meta.h). */
static uint64_t tk;

/* ---------------------------------------------------------------- faults */

/* The control file of tests/integration/faultshim.c, linked into this test:
 * lines "<point> <ERRNO>" (see there); "" removes it (no faults). */
static char ctl[300];

static void fault(const char *spec)
{
    if (!*spec) {
        unlink(ctl);
        return;
    }
    FILE *f = fopen(ctl, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(spec, f);
        fclose(f);
    }
}

/* ---------------------------------------------------------------- helpers */

static char base[256];

static uint64_t snapshot_bytes; /* 0: the default */

static int open_dir(const char *dir, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_BATCH;
    o.read_grace_ms = 0;
    o.snapshot_bytes = snapshot_bytes;
    return kvp_meta_open(&o, m);
}

static int segments(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, "wal-", 4) && strstr(e->d_name, ".log") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* Keys of 1000 bytes: "<tag>-<i>-xxxx...". */
#define BIG 1000
static char bigbuf[64][BIG];
static struct kvp_str big_key(int slot, const char *tag, int i)
{
    memset(bigbuf[slot], 'x', BIG);
    int n = snprintf(bigbuf[slot], BIG, "%s-%d-", tag, i);
    bigbuf[slot][n] = 'x';
    return (struct kvp_str){bigbuf[slot], BIG};
}

/* Confirms n big keys on pages first.. (FREE pages: accepted per §2). */
static int confirm_big(struct kvp_ns *ns, const char *tag, int n, int64_t first,
                       struct kvp_error *err)
{
    static struct kvp_str keys[2048];
    static int64_t pages[2048];
    static char store[2048][BIG];
    if (n > 2048)
        return -E2BIG;
    for (int i = 0; i < n; i++) {
        struct kvp_str k = big_key(0, tag, i);
        memcpy(store[i], k.ptr, BIG);
        keys[i] = (struct kvp_str){store[i], BIG};
        pages[i] = first + i;
    }
    tk = 0;
    return kvp_meta_confirm_async(ns, 0, keys, pages, (size_t)n, NULL, 0, &tk, err);
}

/* A value of the log (kvp_meta_values) by its key; its label's value in *label. */
struct value_query {
    const char *key;
    uint64_t value;
    char label[32];
};

static int find_value(const struct kvp_meta_value *v, void *arg)
{
    struct value_query *q = arg;
    if (strcmp(v->section, "wal") || strcmp(v->key, q->key))
        return 0;
    q->value = v->value;
    snprintf(q->label, sizeof q->label, "%s", v->label_value ? v->label_value : "");
    return 1;
}

static uint64_t value_of(struct kvp_meta *m, const char *key, const char **label)
{
    static struct value_query q;
    q = (struct value_query){.key = key, .value = UINT64_MAX};
    CHECK_EQ(kvp_meta_values(m, find_value, &q), 1);
    if (label)
        *label = q.label;
    return q.value;
}

/* 1 when every one of the n big keys exists on rank 0 (0: none; -1: some). */
static int big_exist(struct kvp_ns *ns, const char *tag, int n)
{
    int yes = 0;
    for (int i = 0; i < n; i++) {
        struct kvp_str k = big_key(0, tag, i);
        uint8_t e = 0;
        CHECK_EQ(kvp_meta_exists(ns, 0, &k, 1, &e, NULL), 0);
        yes += e;
    }
    return yes == n ? 1 : yes == 0 ? 0 : -1;
}

static uint64_t held(struct kvp_meta *m);
static int held_fn(const char *d, const char *p, const struct kvp_rank_stats *r, size_t n,
                   void *arg)
{
    (void)d;
    (void)p;
    for (size_t i = 0; i < n; i++)
        *(uint64_t *)arg += r[i].held;
    return 0;
}
static uint64_t held(struct kvp_meta *m)
{
    uint64_t h = 0;
    kvp_meta_stats(m, held_fn, &h);
    return h;
}

/* ---------------------------------------------------------------- no room */

static void test_no_room_refuses_before_any_change(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/noroom", base);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 100000, NULL), 0);
    int64_t pa = put(ns, 0, "a");
    CHECK(pa >= 0);
    struct kvp_error err = {0};
    CHECK_EQ(confirm_big(ns, "ok", 100, 1000, &err), 0);

    fault("zero ENOSPC\n");
    /* 2000 keys of 1000 bytes: more than the room written ahead. */
    memset(&err, 0, sizeof err);
    CHECK_EQ(confirm_big(ns, "refused", 2000, 20000, &err), -ENOSPC);
    CHECK_EQ(err.rule, KVP_RULE_IO);
    CHECK(strstr(err.msg, dir) && strstr(err.msg, "No space left on device"));
    CHECK_EQ(tk, 0); /* nothing was logged */
    CHECK_EQ(big_exist(ns, "refused", 2000), 0);
    CHECK_EQ(held(m), 101u);
    char why[256] = "";
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), -ENOSPC);
    CHECK(strstr(why, "cannot write the log in"));
    int scope = 0;
    CHECK_EQ(kvp_meta_health_scope(m, &scope, NULL, 0), -ENOSPC);
    CHECK_EQ(scope, KVP_HEALTH_WRITES); /* reads are served */

    /* Now every change is refused, however small, and changes nothing. */
    struct kvp_str a = K("a"), b = K("b");
    int64_t p = -7;
    CHECK_EQ(kvp_meta_allocate(ns, 0, &b, 1, &p, NULL, &err), -ENOSPC);
    CHECK_EQ(p, -7);
    CHECK_EQ(kvp_meta_confirm(ns, 0, &b, &(int64_t){5}, 1, NULL, 0, &err), -ENOSPC);
    CHECK_EQ(kvp_meta_delete(ns, -1, &a, 1, &err), -ENOSPC);
    CHECK_EQ(kvp_meta_clear(ns, 0, &err), -ENOSPC);
    CHECK_EQ(kvp_meta_clear(ns, -1, &err), -ENOSPC);
    CHECK_EQ(kvp_meta_init_rank(ns, 1, 8, &err), -ENOSPC);
    CHECK_EQ(kvp_meta_nranks(ns), 1u);
    struct kvp_ns *other = NULL;
    CHECK_EQ(kvp_meta_ns(m, "other", 5, "kv", 2, 1, &other, &err), -ENOSPC);
    CHECK_EQ(err.rule, KVP_RULE_IO);
    CHECK_EQ(kvp_meta_ns(m, "other", 5, "kv", 2, 0, &other, NULL), -ENOENT);
    /* Reads go on. */
    CHECK_EQ(kvp__meta_peek(ns, 0, &a), pa);
    uint8_t e = 0;
    CHECK_EQ(kvp_meta_exists(ns, 0, &b, 1, &e, NULL), 0);
    CHECK_EQ(e, 0);
    CHECK_EQ(held(m), 101u);
    invariants(m);

    /* Space again: the next change takes it by itself. */
    fault("");
    CHECK_EQ(confirm_big(ns, "after", 100, 5000, &err), 0);
    CHECK(tk > 0);
    CHECK_EQ(kvp_meta_wait(m, tk, NULL), 0);
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    CHECK(put(ns, 0, "b") >= 0);
    kvp_meta_close(m);

    CHECK_EQ(open_dir(dir, &m), 0);
    ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp__meta_peek(ns, 0, &a), pa);
    CHECK(kvp__meta_peek(ns, 0, &b) >= 0);
    CHECK_EQ(big_exist(ns, "ok", 100), 1);
    CHECK_EQ(big_exist(ns, "after", 100), 1);
    CHECK_EQ(big_exist(ns, "refused", 2000), 0);
    CHECK_EQ(kvp_meta_nranks(ns), 1u);
    CHECK_EQ(kvp_meta_ns(m, "other", 5, "kv", 2, 0, &other, NULL), -ENOENT);
    invariants(m);
    kvp_meta_close(m);
}

/* ---------------------------------------------------------------- a failed log */

static void failed_log(const char *name, const char *point, const char *ename, int e)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", base, name);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 1000, NULL), 0);
    CHECK(put(ns, 0, "a") >= 0); /* returns once durable */

    char spec[128];
    /* and the background snapshot cannot recover yet */
    snprintf(spec, sizeof spec, "%s %s\nsnapshot %s\n", point, ename, ename);
    fault(spec);
    struct kvp_str b = K("b"), c = K("c");
    int64_t pb = 10, pc = 11;
    tk = 0;
    CHECK_EQ(kvp_meta_confirm_async(ns, 0, &b, &pb, 1, NULL, 0, &tk, NULL), 0); /* applied ... */
    uint64_t lsn = tk;
    CHECK(lsn > 0);
    CHECK_EQ(kvp_meta_wait(m, lsn, NULL), -e); /* ... but not durable */
    CHECK_EQ(kvp__meta_peek(ns, 0, &b), pb);
    struct kvp_error err = {0};
    tk = 0;
    CHECK_EQ(kvp_meta_confirm_async(ns, 0, &c, &pc, 1, NULL, 0, &tk, &err), -e); /* refused */
    CHECK_EQ(err.rule, KVP_RULE_IO);
    CHECK_EQ(tk, 0);
    CHECK_EQ(kvp__meta_peek(ns, 0, &c), -1);
    char why[256];
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), -e);
    const char *label = NULL;
    CHECK_EQ(value_of(m, "writable", &label), 0u);
    CHECK(label && !strcmp(label, ename));
    CHECK(value_of(m, "refused_writes", NULL) >= 1);
    CHECK(kvp_meta_snapshot(m) != 0);

    fault("");
    CHECK_EQ(kvp_meta_snapshot(m), 0); /* or the background one did it first */
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    CHECK_EQ(kvp_meta_wait(m, lsn, NULL), 0);                        /* the snapshot covers b */
    CHECK_EQ(kvp_meta_confirm(ns, 0, &c, &pc, 1, NULL, 0, NULL), 0); /* returns once durable */
    invariants(m);
    kvp_meta_close(m);

    CHECK_EQ(open_dir(dir, &m), 0);
    ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp__meta_peek(ns, 0, &b), pb);
    CHECK_EQ(kvp__meta_peek(ns, 0, &c), pc);
    invariants(m);
    kvp_meta_close(m);
}

static void test_failed_log_refuses_then_recovers(void)
{
    failed_log("eio-write", "append", "EIO", EIO);
    failed_log("enospc-write", "append", "ENOSPC", ENOSPC);
    failed_log("eio-sync", "fdatasync", "EIO", EIO);
    failed_log("enospc-sync", "fdatasync", "ENOSPC", ENOSPC);
}

/* ---------------------------------------------------------------- rotation */

/*
 * The flusher starts a new segment every 64 MiB. When it cannot (no space),
 * the current segment goes on, and a later flush starts the next one.
 */
static void test_rotation_without_space_goes_on(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/rotate", base);
    snapshot_bytes = (uint64_t)1 << 40; /* no snapshot: only the flusher rotates */
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, &m), 0);
    struct kvp_ns *ns = ns_of(m, "default", "kv");
    CHECK_EQ(kvp_meta_init_rank(ns, 0, 1 << 20, NULL), 0);
    CHECK_EQ(segments(dir), 1);
    fault("rotate ENOSPC\n");
    char tag[32];
    int batches = 0;
    /* 2000 keys of 1000 bytes a batch: past 64 MiB after 33 batches. */
    for (; batches < 40; batches++) {
        snprintf(tag, sizeof tag, "r%d", batches);
        CHECK_EQ(confirm_big(ns, tag, 2000, (int64_t)batches * 2000, NULL), 0);
        CHECK_EQ(kvp_meta_wait(m, tk, NULL), 0);
    }
    CHECK_EQ(segments(dir), 1); /* still the one, past 64 MiB */
    char why[256];
    CHECK_EQ(kvp_meta_health(m, why, sizeof why), 0);
    fault("");
    sleep(1); /* the next try comes a second after the failed one */
    for (int i = 0; i < 5 && segments(dir) == 1; i++) {
        snprintf(tag, sizeof tag, "r%d", batches);
        CHECK_EQ(confirm_big(ns, tag, 10, (int64_t)batches * 2000, NULL), 0);
        CHECK_EQ(kvp_meta_wait(m, tk, NULL), 0);
        batches++;
        usleep(300 * 1000);
    }
    CHECK_EQ(segments(dir), 2);
    kvp_meta_close(m);
    snapshot_bytes = 0;

    CHECK_EQ(open_dir(dir, &m), 0);
    ns = ns_of(m, "default", "kv");
    for (int b = 0; b < 40; b++) {
        snprintf(tag, sizeof tag, "r%d", b);
        CHECK_EQ(big_exist(ns, tag, 2000), 1);
    }
    invariants(m);
    kvp_meta_close(m);
}

int main(void)
{
    scratch_make(base, sizeof base, "diskfull", 0);
    snprintf(ctl, sizeof ctl, "%s.ctl", base);
    setenv("KVP_FAULT_CTL", ctl, 1);
    test_no_room_refuses_before_any_change();
    test_failed_log_refuses_then_recovers();
    test_rotation_without_space_goes_on();
    rmrf(base);
    return check_report();
}
