/*
 * Persistence figures of issue 3 through the library:
 *  - recovery time of N keys (snapshot + log): N keys are confirmed, a
 *    snapshot is taken after the first 90%, the last 10% stay in the log only;
 *    the process "crashes" (the store is left open) and a fresh open recovers.
 *  - size on disk per key (snapshot + log) after a clean close.
 *
 *   recovery DIR [N]     (default N = 1000000; keys are 64 hex characters)
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvpage/meta.h"
#include "keys.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t dir_bytes(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    uint64_t sum = 0;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)))
            continue;
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!stat(p, &st))
            sum += (uint64_t)st.st_size;
    }
    if (d)
        closedir(d);
    return sum;
}

static int open_dir(const char *dir, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_BATCH;
    o.snapshot_bytes = UINT64_MAX; /* snapshots only when asked */
    return kvp_meta_open(&o, m);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: recovery DIR [N]\n");
        return 2;
    }
    const char *dir = argv[1];
    uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000000;
    struct kvp_meta *m;
    if (open_dir(dir, &m)) {
        fprintf(stderr, "cannot open %s\n", dir);
        return 1;
    }
    struct kvp_ns *ns;
    kvp_meta_ns(m, "default", 7, "kv", 2, 1, &ns, NULL);
    kvp_meta_init_rank(ns, 0, n + 16, NULL);
    enum { B = 1024 };
    static char keybuf[B][64];
    struct kvp_str keys[B];
    int64_t pages[B];
    double t0 = now_s();
    for (uint64_t i = 0; i < n; i += B) {
        size_t c = n - i < B ? (size_t)(n - i) : B;
        for (size_t j = 0; j < c; j++) {
            key_of(i + j, keybuf[j]);
            keys[j] = (struct kvp_str){keybuf[j], 64};
        }
        kvp_meta_allocate(ns, 0, keys, c, pages, NULL, NULL);
        kvp_meta_confirm(ns, 0, keys, pages, c, NULL, 0, NULL);
        if (i < n * 9 / 10 && i + c >= n * 9 / 10)
            kvp_meta_snapshot(m);
    }
    double t_load = now_s() - t0;
    uint64_t snap = dir_bytes(dir, "snap-"), log = dir_bytes(dir, "wal-");
    /* Crash: leave m open (its lock goes with the child in real life; here
     * the second open must not see the lock, so run recovery in a child). */
    pid_t pid = fork();
    if (pid == 0) {
        struct kvp_meta *r;
        /* The parent's flock is shared with the child's copy of the fd; a
         * new open() of LOCK gets its own lock and sees it held, so recover
         * from a copy of the files instead. */
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s.copy && mkdir %s.copy && cp %s/wal-* %s/snap-* %s.copy/", dir, dir, dir,
                 dir, dir);
        if (system(cmd) != 0)
            _exit(3);
        char copy[4096];
        snprintf(copy, sizeof copy, "%s.copy", dir);
        double t1 = now_s();
        if (open_dir(copy, &r))
            _exit(4);
        double t_rec = now_s() - t1;
        struct kvp_ns *rns;
        kvp_meta_ns(r, "default", 7, "kv", 2, 0, &rns, NULL);
        uint8_t ex = 0;
        char k[64];
        key_of(n - 1, k);
        struct kvp_str ks = {k, 64};
        kvp_meta_exists(rns, 0, &ks, 1, &ex, NULL);
        printf("recovery of %" PRIu64
               " keys (snapshot of 90%% + log of 10%%): %.3f s (last key %s)\n",
               n, t_rec, ex ? "present" : "MISSING");
        fflush(stdout);
        _exit(ex ? 0 : 5);
    }
    int st;
    waitpid(pid, &st, 0);
    kvp_meta_close(m); /* clean close: final snapshot, log pruned to the previous one */
    uint64_t snap2 = dir_bytes(dir, "snap-"), log2 = dir_bytes(dir, "wal-");
    printf("load: %" PRIu64 " keys confirmed in %.2f s\n", n, t_load);
    printf("on disk before the crash: snapshot %" PRIu64 " + log %" PRIu64
           " bytes = %.1f bytes/key\n",
           snap, log, (double)(snap + log) / n);
    /* After a clean close the newest snapshot alone holds every key. */
    DIR *d = opendir(dir);
    struct dirent *e;
    uint64_t newest = 0, newest_size = 0;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "snap-", 5))
            continue;
        uint64_t l = strtoull(e->d_name + 5, NULL, 16);
        char p[4096];
        struct stat sst;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (l >= newest && !stat(p, &sst)) {
            newest = l;
            newest_size = (uint64_t)sst.st_size;
        }
    }
    if (d)
        closedir(d);
    printf("after a clean close: newest snapshot %.1f bytes/key; directory total %" PRIu64
           " bytes (%.1f bytes/key)\n",
           (double)newest_size / n, snap2 + log2, (double)(snap2 + log2) / n);
    printf("target: <= 2 x 64 + 32 = 160 bytes/key\n");
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
