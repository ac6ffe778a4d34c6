/*
 * kvp_meta_drop on the in-process engine (tests/unit/meta_drop.h for what
 * every backend must do): in memory, and with a data directory, where the
 * drop must survive a restart from the snapshot kvp_meta_close writes, from
 * the log alone (a crash: a forked child that drops and _exits), and from a
 * log that re-creates the namespace after its DROP record.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meta_drop.h"
#include "meta_test.h"

static char base[256];

static int open_dir(const char *dir, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_ALWAYS;
    o.snapshot_mode = KVP_SNAPSHOT_MANUAL;
    return kvp_meta_open(&o, m);
}

/* After drop_semantics: d1/kv gone, d2/kv's key there; checked after a restart. */
static void check_dropped(struct kvp_meta *m)
{
    invariants(m);
    struct drop_seen s = drop_seen_of(m);
    CHECK(!s.a && s.b);
    struct kvp_ns *a = NULL;
    CHECK_EQ(kvp_meta_ns(m, "d1", 2, "kv", 2, 0, &a, NULL), -ENOENT);
    struct kvp_ns *b = ns_of(m, "d2", "kv");
    struct kvp_str bk = K("b-key");
    int64_t page = -1;
    CHECK_EQ(kvp_meta_lookup(b, 0, 0, &bk, 1, &page, NULL), 0);
    CHECK(page >= 0);
}

static void in_memory(void)
{
    struct kvp_meta *m;
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m, NULL), 0);
    drop_semantics(m);
    invariants(m);
    kvp_meta_close(m);
}

/* A clean restart: the snapshot of kvp_meta_close holds the drop. */
static void restart_from_snapshot(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/snap", base);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, &m), 0);
    drop_semantics(m);
    kvp_meta_close(m);
    CHECK_EQ(open_dir(dir, &m), 0);
    check_dropped(m);
    /* a namespace created after it keeps its place; and a third open
     * reads the snapshot the second wrote */
    struct kvp_ns *c = ns_of(m, "d3", "kv");
    CHECK_EQ(kvp_meta_init_rank(c, 0, 4, NULL), 0);
    CHECK(put(c, 0, "c-key") >= 0);
    kvp_meta_close(m);
    CHECK_EQ(open_dir(dir, &m), 0);
    check_dropped(m);
    int64_t page = -1;
    struct kvp_str ck = K("c-key");
    CHECK_EQ(kvp_meta_lookup(ns_of(m, "d3", "kv"), 0, 0, &ck, 1, &page, NULL), 0);
    CHECK(page >= 0);
    kvp_meta_close(m);
    rmrf(dir);
}

/* A crash: the child's log is all there is (no snapshot after the drop). */
static void restart_from_log(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/log", base);
    pid_t pid = fork();
    if (pid == 0) {
        struct kvp_meta *m;
        if (open_dir(dir, &m))
            _exit(2);
        drop_semantics(m);
        _exit(check_report() ? 1 : 0); /* no close: no snapshot */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    struct kvp_meta *m;
    CHECK_EQ(open_dir(dir, &m), 0);
    check_dropped(m);
    kvp_meta_close(m); /* a snapshot that holds the dropped entry */
    /* re-created after it, then a crash: the log's INIT brings it back */
    pid = fork();
    if (pid == 0) {
        if (open_dir(dir, &m))
            _exit(2);
        struct kvp_ns *a = ns_of(m, "d1", "kv");
        _exit(kvp_meta_init_rank(a, 5, 16, NULL) || put(a, 5, "back") < 0);
    }
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(open_dir(dir, &m), 0);
    invariants(m);
    struct drop_seen s = drop_seen_of(m);
    CHECK(s.a && s.b);
    CHECK_EQ(s.a_ranks, 1);
    CHECK_EQ(s.a_keys, 1);
    kvp_meta_close(m);
    rmrf(dir);
}

int main(void)
{
    const char *t = getenv("TMPDIR");
    scratch_make_in(base, sizeof base, t ? t : "/var/tmp", "drop");
    in_memory();
    restart_from_snapshot();
    restart_from_log();
    rmrf(base);
    return check_report();
}
