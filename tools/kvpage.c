/* kvpage — the command line: serve, the store (put, get, exists, delete),
 * clear, bench io | meta | store, inspect, fsck, backends. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kvpage/meta.h"
#include "kvpage/pagefile.h"
#include "server/serve.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpage <command> [options]\n"
            "commands:\n"
            "  serve [flags]              run the metadata server (kvpage serve --help)\n"
            "  put [flags] KEY [INPUT]    store a page under KEY (kvpage put --help)\n"
            "  get [flags] KEY [OUTPUT]   write the page of KEY\n"
            "  exists [flags] KEY...      print whether each key is there\n"
            "  delete [flags] KEY...      forget keys\n"
            "  clear --meta LOC --yes     forget a rank's, a namespace's or every key; --drop\n"
            "                             removes namespaces (kvpage clear --help)\n"
            "  bench io --file PATH       is this file system fast enough: page I/O against\n"
            "                             plain pread/pwrite\n"
            "  bench meta URL             how much one metadata server takes\n"
            "  bench trace FILE --url URL replay a Mooncake trace: prefix hit rate, requests/s\n"
            "  bench store [flags]        measure the store against the page file alone\n"
            "  inspect DIR                print what a data directory holds (no server needed)\n"
            "  fsck DIR                   check every invariant of a data directory; exit 1 on a\n"
            "                             failure\n"
            "  fsck --file PATH           verify every page of a page file against its integrity\n"
            "                             tag (PATH.tags); name the bad ones, exit 1 if any\n"
            "  backends                   list the page-I/O and metadata backends\n"
            "  help [COMMAND]             this, or the help of COMMAND (as COMMAND --help)\n"
            "  version                    print the version (also kvpage --version)\n"
            "examples:\n"
            "  kvpage serve --listen 0.0.0.0:18000 --data-dir /var/lib/kvpage\n"
            "  kvpage serve --listen 0.0.0.0:18000 --meta redis://10.0.0.5:6379/0\n"
            "  kvpage put --file /mnt/3fs/rank0 --file-size 64G --page-size 2M KEY data.bin\n"
            "  kvpage get --file /mnt/3fs/rank0 --page-size 2M KEY out.bin\n"
            "more: man kvpage\n");
}

struct logctx {
    const char *cmd;
    int warnings, errors;
};

static void tool_log(void *arg, int level, const char *msg)
{
    struct logctx *c = arg;
    if (level >= 2)
        return;
    fprintf(stderr, "kvpage %s: %s: %s\n", c->cmd, level == 0 ? "error" : "warning", msg);
    if (level == 0)
        c->errors++;
    else
        c->warnings++;
}

static int print_ns(const char *dep, const char *pool, const struct kvp_rank_stats *r, size_t n,
                    void *arg)
{
    (void)arg;
    printf("namespace %s/%s: %zu rank(s)\n", dep, pool, n);
    for (size_t i = 0; i < n; i++)
        printf("  rank %-6u pages %-10" PRIu64 " held %-10" PRIu64 " free %-10" PRIu64
               " keys %" PRIu64 "\n",
               r[i].rank, r[i].num_pages, r[i].held, r[i].free, r[i].keys);
    return 0;
}

/* The log segments and snapshots in dir: how many, how many bytes. */
struct state_files {
    uint64_t log_bytes, snap_bytes;
    int nlog, nsnap;
};

static void count_files(const char *dir, struct state_files *sf)
{
    memset(sf, 0, sizeof *sf);
    DIR *d = opendir(dir);
    if (!d)
        return;
    uint64_t log_bytes = 0, snap_bytes = 0;
    int nlog = 0, nsnap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, "wal-", 4) && l > 4 && !strcmp(e->d_name + l - 4, ".log")) {
            log_bytes += (uint64_t)st.st_size;
            nlog++;
        } else if (!strncmp(e->d_name, "snap-", 5) && l > 5 &&
                   !strcmp(e->d_name + l - 5, ".snap")) {
            snap_bytes += (uint64_t)st.st_size;
            nsnap++;
        }
    }
    closedir(d);
    *sf = (struct state_files){log_bytes, snap_bytes, nlog, nsnap};
}

/* kvp_pagefile_verify's callback: one line per bad page. */
static void print_bad(void *arg, uint64_t slot, const char *why)
{
    uint64_t slot_size = *(const uint64_t *)arg;
    printf("bad page %" PRIu64 " (offset %" PRIu64 "): %s\n", slot, slot * slot_size, why);
}

/* kvpage fsck --file PATH: every page of a page file against its tag. */
static int cmd_fsck_file(const char *path)
{
    struct kvp_pagefile_opts o;
    kvp_pagefile_opts_init(&o);
    o.bytes_per_page = 1;            /* unused: the sidecar's own slot size counts */
    o.flags = KVP_PAGEFILE_READONLY; /* writes neither the file nor its sidecar */
    struct kvp_pagefile *pf = NULL;
    struct kvp_error err = {0};
    int rc = kvp_pagefile_open(path, &o, &pf, &err);
    if (rc) {
        fprintf(stderr, "kvpage fsck: %s\n", err.msg);
        return rc == -ENOENT || rc == -EINVAL || rc == -EACCES ? 2 : 1;
    }
    struct kvp_pagefile_info in = {.info_size = sizeof in};
    kvp_pagefile_info(pf, &in);
    uint64_t slot_size = in.tags_slot_size;
    struct kvp_pagefile_verify_counts c = {.check_size = sizeof c};
    rc = kvp_pagefile_verify(pf, print_bad, &slot_size, &c, &err);
    int status = 0;
    if (rc == -EBADMSG) {
        printf("FAIL: %" PRIu64 " of %" PRIu64 " pages of %s fail their integrity tag (reads of "
               "them are refused as missing)\n",
               c.bad, c.slots, path);
        status = 1;
    } else if (rc) {
        fprintf(stderr, "kvpage fsck: %s\n", err.msg);
        status = rc == -ENOENT || rc == -EINVAL ? 2 : 1;
    } else {
        printf("ok: %" PRIu64 " pages of %" PRIu64 " bytes: %" PRIu64
               " tagged and verified, %" PRIu64 " untagged (written without a tag), %" PRIu64
               " %s\n",
               c.slots, slot_size, c.tagged, c.untagged, c.none,
               in.tags == 2 ? "never tagged (written before tags: served unverified)"
                            : "never written (zeros)");
    }
    kvp_pagefile_close(pf);
    return status;
}

static int cmd_dir(const char *cmd, int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: kvpage %s DIR\n%s%s\nexample%s:\n  kvpage %s /var/lib/kvpage\n%s", cmd,
               !strcmp(cmd, "inspect") ? "" : "       kvpage fsck --file PATH\n",
               !strcmp(cmd, "inspect")
                   ? "Prints what a data directory of kvpage serve holds (namespaces, ranks,\n"
                     "pages, keys; log and snapshot sizes). Reads it without writing: safe\n"
                     "beside a running server."
                   : "DIR: recovers a data directory of kvpage serve read-only and checks every\n"
                     "invariant; exit status 1 with a report naming the file and offset when\n"
                     "one fails, 0 when all hold, 2 when DIR holds no kvpage state (no log,\n"
                     "no snapshot).\n"
                     "--file PATH: reads every page of the page file PATH and checks it against\n"
                     "its integrity tag in PATH.tags (pages written and never changed since,\n"
                     "never-written pages still zeros); prints one line per bad page (its index,\n"
                     "offset and why) and exits 1 when any is bad, 0 when none is, 2 when PATH\n"
                     "is missing or has no tags (no PATH.tags: written before tags, or with\n"
                     "them off). Writes nothing; safe beside a running store.",
               !strcmp(cmd, "inspect") ? "" : "s", cmd,
               !strcmp(cmd, "inspect") ? "" : "  kvpage fsck --file /mnt/3fs/rank0\n");
        return 0;
    }
    if (!strcmp(cmd, "fsck") && argc >= 2 &&
        (!strcmp(argv[1], "--file") || !strncmp(argv[1], "--file=", 7))) {
        const char *path = argv[1][6] == '=' ? argv[1] + 7 : argc == 3 ? argv[2] : NULL;
        if (!path || !*path || argc != (argv[1][6] == '=' ? 2 : 3)) {
            fprintf(stderr, "usage: kvpage fsck --file PATH\n");
            return 2;
        }
        return cmd_fsck_file(path);
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: kvpage %s DIR%s\n", cmd,
                strcmp(cmd, "fsck") ? "" : "\n       kvpage fsck --file PATH");
        return 2;
    }
    const char *dir = argv[1];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvpage %s: %s is not a directory\n", cmd, dir);
        return 2;
    }
    /* An empty or unrelated directory recovers as an empty state whose every
     * invariant holds: say that it is none, rather than "ok". */
    struct state_files sf;
    count_files(dir, &sf);
    if (!sf.nlog && !sf.nsnap) {
        fprintf(stderr,
                "kvpage %s: %s holds no kvpage state (no log wal-*.log, no snapshot "
                "snap-*.snap): not a data directory of kvpage serve or a store's PATH.meta\n",
                cmd, dir);
        return 2;
    }
    struct logctx lc = {.cmd = cmd};
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.readonly = 1; /* never writes: safe beside a running server */
    o.log = tool_log;
    o.log_arg = &lc;
    struct kvp_meta *m = NULL;
    int rc = kvp_meta_open(&o, &m);
    if (rc) {
        fprintf(stderr, "kvpage %s: cannot recover %s: %s\n", cmd, dir, kvp_strerror(rc));
        return 1;
    }
    int status = 0;
    if (!strcmp(cmd, "inspect")) {
        printf("data directory %s\n", dir);
        printf("log: %d segment(s), %" PRIu64 " bytes; snapshots: %d file(s), %" PRIu64 " bytes\n",
               sf.nlog, sf.log_bytes, sf.nsnap, sf.snap_bytes);
        kvp_meta_stats(m, print_ns, NULL);
    } else {
        struct kvp_error e = {0};
        rc = kvp_meta_check(m, &e);
        if (rc) {
            printf("FAIL: %s\n", e.msg);
            status = 1;
        } else {
            printf("ok: every invariant holds%s\n",
                   lc.warnings ? " (recovery warnings above: a torn log tail is normal after a "
                                 "crash and is dropped at the next start)"
                               : "");
        }
    }
    kvp_meta_close(m);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") && argc >= 3) {
        /* kvpage help COMMAND [SUB]: COMMAND [SUB] --help */
        char *args[5] = {argv[0], argv[2], NULL, NULL, NULL};
        int n = 2;
        if (argc >= 4)
            args[n++] = argv[3];
        args[n++] = "--help";
        if (strcmp(argv[2], "help") != 0)
            return main(n, args);
    }
    if (!strcmp(argv[1], "serve"))
        return kvp__serve_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "put") || !strcmp(argv[1], "get") || !strcmp(argv[1], "exists") ||
        !strcmp(argv[1], "delete"))
        return kvp__cli_store(argc - 1, argv + 1);
    if (!strcmp(argv[1], "clear"))
        return kvp__cli_clear(argc - 1, argv + 1);
    if (!strcmp(argv[1], "backends"))
        return kvp__cli_backends(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) {
        if (argc >= 3 && !strcmp(argv[2], "store"))
            return kvp__cli_bench_store(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "io"))
            return kvp__cli_bench_io(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "meta"))
            return kvp__cli_bench_meta(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "trace"))
            return kvp__cli_bench_trace(argc - 2, argv + 2);
        int help = argc >= 3 && (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help"));
        if (argc >= 3 && !help)
            fprintf(stderr, "kvpage bench: unknown benchmark '%s'\n", argv[2]);
        fprintf(help ? stdout : stderr,
                "usage: kvpage bench io|meta|store|trace [flags]  (kvpage bench BENCHMARK --help)\n"
                "  io --file PATH   page I/O on a file system: kvpage's page file against the\n"
                "                   best plain pread/pwrite\n"
                "  meta URL         requests/s, keys/s and latencies of a metadata server\n"
                "  store            the store's put and get against the page file alone\n"
                "  trace FILE --url URL\n"
                "                   a real workload: replays a Mooncake trace through SGLang's\n"
                "                   routes; prefix hit rate, requests/s, whether it kept time\n"
                "examples:\n"
                "  kvpage bench io --file /mnt/3fs/bench.pages --file-size 8G --page-size 2M\n"
                "  kvpage bench meta http://10.0.0.5:18000/ns/bench --connections 64\n"
                "  kvpage bench store --page-size 2M --batch 128\n"
                "  kvpage bench trace trace.jsonl --url http://127.0.0.1:18000/ns/trace "
                "--capacity 30000\n");
        return help ? 0 : 2;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        if (argc > 2 && strcmp(argv[2], "--help") && strcmp(argv[2], "-h")) {
            fprintf(stderr, "usage: kvpage version\n");
            return 2;
        }
        printf(argc > 2 ? "usage: kvpage version\nPrints the version of kvpage (as GET /v1/stats "
                          "reports it).\nexamples:\n  kvpage version\n  kvpage --version\n"
                        : "kvpage " KVP_VERSION "\n");
        return 0;
    }
    if (!strcmp(argv[1], "inspect") || !strcmp(argv[1], "fsck"))
        return cmd_dir(argv[1], argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvpage: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
