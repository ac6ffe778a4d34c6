/*
 * kvpage put | get | exists | delete: the store (kvpage/store.h) on the
 * command line, one rank's storage file and its metadata (a data directory,
 * PATH.meta by default, or a kvpage serve at http://HOST:PORT[/ns/NAME]).
 *
 * An input of exactly one page is stored as it is (an engine's page, got
 * whole by `kvpage get`, goes back into another store unchanged). A shorter
 * input, at most page size - 16 bytes, ends its page with a 16-byte trailer
 * that records how many bytes were put (magic, length, check), so that
 * `kvpage get` gives back exactly those bytes. `get` gives back a page
 * without a valid trailer whole. A whole-page input whose own last 16 bytes
 * are a valid trailer (a page put by the command line, read whole from the
 * file) is refused: `get` would give back only the trailer's length of it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "util/size.h"

#define TRAILER 16
static const char MAGIC[8] = {'k', 'v', 'p', 'a', 'g', 'e', 'C', '1'};

static uint32_t check_of(const uint8_t *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 over the bytes and the length */
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    for (int i = 0; i < 8; i++)
        h = (h ^ (uint8_t)(n >> (8 * i))) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The payload length of a page of ps bytes: its trailer's, or ps without one. */
static uint64_t payload_len(const uint8_t *page, uint64_t ps)
{
    if (ps < TRAILER)
        return ps;
    const uint8_t *t = page + ps - TRAILER;
    if (memcmp(t, MAGIC, 8))
        return ps;
    uint64_t n = get_le32(t + 8);
    if (n > ps - TRAILER || get_le32(t + 12) != check_of(page, n))
        return ps;
    return n;
}

/* ---------------------------------------------------------------- flags */

static int parse_u32(const char *s, uint32_t max, uint32_t *out)
{
    uint64_t v;
    if (kvp__parse_size(s, 0, &v) || v > max)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* The flags of every store command; put alone also takes PUT_FLAGS_HELP's. */
static const char *const PUT_FLAGS_HELP =
    "  --file-size SIZE   the file's size, e.g. 64G (K, M, G, T: powers of 1024); needed\n"
    "                     when the file is created\n"
    "  --no-durable       do not fdatasync the pages put before confirming them\n"
    "  --mkdir            create the missing directories of a new --file (without\n"
    "                     it a missing directory is refused, naming it)\n";
static const char *const FLAGS_HELP =
    "  --file PATH        the rank's storage file (required)\n"
    "  --page-size SIZE   bytes per page (required), e.g. 2M\n"
    "  --rank R           the rank (default 0)\n"
    "  --meta DIR|URL     the metadata: a data directory (default: PATH.meta), a\n"
    "                     kvpage serve at http://HOST:PORT[/ns/NAME], or Redis at\n"
    "                     redis://HOST:PORT[/DB] (as kvpage serve --meta); a bare\n"
    "                     HOST:PORT is refused unless such a directory exists\n"
    "                     (file:DIR is always a directory)\n"
    "  --deployment NAME  (default: the URL's /ns/NAME, else default)\n"
    "  --pool NAME        (default: kv)\n"
    "  --timeout MS       the metadata server's request timeout (default 10000)\n"
    "  --no-tags          no integrity tags: pages are put untagged and read unverified\n"
    "                     (default: every page carries a tag beside the file, in\n"
    "                     PATH.tags, and a page whose bytes changed since its put is\n"
    "                     reported as an error, never printed, and its key dropped)\n";

/* The known flag k (of known[] in kvp__store_flags_parse), named name, set
 * to value in f: 0, or KVP_EXIT_USAGE after saying why value is no good. */
static int set_flag(const char *cmd, struct kvp__store_flags *f, int k, const char *name,
                    const char *value)
{
    int bad = 0;
    switch (k) {
    case 0:
        f->file = value, bad = !*value;
        break;
    case 1:
        bad = kvp__parse_size(value, 1, &f->file_size) || f->file_size == 0;
        break;
    case 2:
        bad = kvp__parse_size(value, 1, &f->page_size) || f->page_size == 0;
        break;
    case 3:
        bad = parse_u32(value, KVP_MAX_RANK, &f->rank);
        break;
    case 4:
        f->meta = value, bad = !*value;
        break;
    case 5:
        f->deployment = value;
        break;
    case 6:
        f->pool = value;
        break;
    case 7:
        bad = parse_u32(value, 86400000, &f->timeout_ms) || f->timeout_ms == 0;
        break;
    }
    if (bad) {
        if (k == 1 || k == 2)
            fprintf(stderr,
                    "kvpage %s: %s '%s' is not a size (a positive number with an optional "
                    "K, M, G or T suffix)\n",
                    cmd, name, value);
        else if (k == 3)
            fprintf(stderr, "kvpage %s: %s '%s' is not a rank (0 .. 2147483647)\n", cmd, name,
                    value);
        else if (k == 7)
            fprintf(stderr, "kvpage %s: %s '%s' is not a number of milliseconds\n", cmd, name,
                    value);
        else
            fprintf(stderr, "kvpage %s: %s is empty\n", cmd, name);
        return KVP_EXIT_USAGE;
    }
    return 0;
}

int kvp__store_flags_parse(const char *cmd, int argc, char **argv, struct kvp__store_flags *f,
                           char **pos, int *npos,
                           int (*extra)(const char *name, const char *value, void *arg), void *arg)
{
    memset(f, 0, sizeof *f);
    *npos = 0;
    int flags_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (flags_done || a[0] != '-' || !strcmp(a, "-")) {
            pos[(*npos)++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            flags_done = 1;
            continue;
        }
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) {
            fprintf(stderr, "kvpage %s: unknown flag '%.40s...'\n", cmd, a);
            return KVP_EXIT_USAGE;
        }
        memcpy(name, a, nl);
        name[nl] = '\0';
        int has_value = eq || i + 1 < argc;
        value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
        if (extra) {
            int r = extra(name, value, arg);
            if (r < 0)
                return KVP_EXIT_USAGE;
            if (r == 2) {
                if (eq) {
                    fprintf(stderr, "kvpage %s: %s takes no value\n", cmd, name);
                    return KVP_EXIT_USAGE;
                }
                continue;
            }
            if (r == 1) {
                if (!has_value) {
                    fprintf(stderr, "kvpage %s: %s needs a value\n", cmd, name);
                    return KVP_EXIT_USAGE;
                }
                if (!eq)
                    i++;
                continue;
            }
        }
        int *sw = !strcmp(name, "--json")         ? &f->json
                  : !strcmp(name, "--no-durable") ? &f->no_durable
                  : !strcmp(name, "--mkdir")      ? &f->mkdir
                  : !strcmp(name, "--no-tags")    ? &f->no_tags
                                                  : NULL;
        if (sw) {
            if (eq) {
                fprintf(stderr, "kvpage %s: %s takes no value\n", cmd, name);
                return KVP_EXIT_USAGE;
            }
            *sw = 1;
            continue;
        }
        static const char *const known[] = {"--file", "--file-size",  "--page-size", "--rank",
                                            "--meta", "--deployment", "--pool",      "--timeout"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof known / sizeof *known); j++)
            if (!strcmp(name, known[j]))
                k = j;
        if (k < 0) {
            fprintf(stderr, "kvpage %s: unknown flag '%s' (kvpage %s --help)\n", cmd, name, cmd);
            return KVP_EXIT_USAGE;
        }
        if (!has_value) {
            fprintf(stderr, "kvpage %s: %s needs a value\n", cmd, name);
            return KVP_EXIT_USAGE;
        }
        if (!eq)
            i++;
        if (set_flag(cmd, f, k, name, value))
            return KVP_EXIT_USAGE;
    }
    return 0;
}

static void quiet(void *arg, int level, const char *msg)
{
    (void)arg, (void)level, (void)msg;
}

int kvp__store_flags_open(const char *cmd, const struct kvp__store_flags *f, uint32_t entries,
                          int create, struct kvp_store **out)
{
    if (!f->file) {
        fprintf(stderr, "kvpage %s: --file PATH is required (the rank's storage file)\n", cmd);
        return KVP_EXIT_USAGE;
    }
    if (!f->page_size) {
        fprintf(stderr, "kvpage %s: --page-size SIZE is required (e.g. --page-size 2M)\n", cmd);
        return KVP_EXIT_USAGE;
    }
    struct stat st;
    if (stat(f->file, &st) != 0) {
        if (errno != ENOENT) {
            fprintf(stderr, "kvpage %s: --file %s: %s\n", cmd, f->file, strerror(errno));
            return KVP_EXIT_USAGE;
        }
        if (!create) {
            fprintf(stderr, "kvpage %s: --file %s does not exist\n", cmd, f->file);
            return KVP_EXIT_USAGE;
        }
        if (!f->file_size) {
            fprintf(stderr,
                    "kvpage %s: --file %s does not exist; give --file-size SIZE to create it\n",
                    cmd, f->file);
            return KVP_EXIT_USAGE;
        }
    } else if (S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvpage %s: --file %s is a directory\n", cmd, f->file);
        return KVP_EXIT_USAGE;
    }
    struct kvp_meta_opts mo;
    kvp_meta_opts_init(&mo);
    mo.log = quiet; /* the commands say what went wrong themselves (a rejected page: get) */
    if (f->timeout_ms)
        mo.timeout_ms = f->timeout_ms;
    mo.token = getenv("KVPAGE_TOKEN");
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = f->file;
    o.file_size = f->file_size;
    o.bytes_per_page = f->page_size;
    o.entries = entries;
    o.rank = f->rank;
    o.deployment = f->deployment;
    o.pool = f->pool;
    o.meta = f->meta; /* the store's rule: a plain path is a directory, HOST:PORT refused */
    o.meta_opts = &mo;
    o.durable = !f->no_durable;
    o.mkdir = f->mkdir;
    o.no_tags = f->no_tags;
    /* The reads write nothing (no owner record, log or snapshot). */
    o.readonly =
        !f->writable && (!strcmp(cmd, "get") || !strcmp(cmd, "exists") || !strcmp(cmd, "put?"));
    struct kvp_error err = {0};
    int rc = kvp_store_open(&o, out, &err);
    if (rc) {
        /* The library's hint names its option: put's flag, or none. A
         * command name may end in "?" (its read-only look first). */
        int clen = (int)strcspn(cmd, "?");
        char *hint = strstr(err.msg, ", or set mkdir)");
        if (hint)
            snprintf(hint, sizeof err.msg - (size_t)(hint - err.msg), "%s",
                     clen == 3 && !strncmp(cmd, "put", 3) ? ", or give --mkdir)" : ")");
        fprintf(stderr, "kvpage %.*s: cannot open the store of %s: %s\n", clen, cmd, f->file,
                err.msg[0] ? err.msg : kvp_strerror(rc));
        /* What the flags can fix: names, sizes, a mismatched page count. */
        return rc == -EINVAL || rc == -EEXIST || rc == -ENOENT || rc == -EISDIR || rc == -ENOTDIR ||
                       rc == -EACCES || err.rule == KVP_RULE_ARG
                   ? KVP_EXIT_USAGE
                   : KVP_EXIT_FAILED;
    }
    return 0;
}

/* ---------------------------------------------------------------- commands */

static void store_usage(FILE *out, const char *cmd)
{
    if (!strcmp(cmd, "put"))
        fprintf(out, "usage: kvpage put [flags] KEY [INPUT]\n"
                     "Stores the bytes of INPUT (a file; standard input when absent or -) under "
                     "KEY:\nexactly one page, stored as it is, or at most the page size - 16 "
                     "bytes\n(a 16-byte trailer then records the length, so that get gives back "
                     "those\nbytes). A whole page that ends in such a trailer is refused (get "
                     "would give\nback less). A KEY already there is kept as it is.\n");
    else if (!strcmp(cmd, "get"))
        fprintf(out, "usage: kvpage get [flags] KEY [OUTPUT]\n"
                     "Writes the bytes put under KEY to OUTPUT (standard output when absent or "
                     "-).\nChanges no file of the store: it is opened read-only.\n");
    else
        fprintf(out, "usage: kvpage %s [flags] KEY...\n%s", cmd,
                !strcmp(cmd, "exists")
                    ? "Prints KEY<TAB>present or KEY<TAB>missing per key. Changes no file "
                      "of the\nstore: it is opened read-only.\n"
                    : "Forgets the keys on this rank (their pages are freed).\n");
    fprintf(out, "flags:\n%s%s", FLAGS_HELP, strcmp(cmd, "put") ? "" : PUT_FLAGS_HELP);
    fprintf(out, "exit status: 0 done, 1 a key is missing, 2 a bad flag, file or input "
                 "(nothing changed),\n3 the store failed.\n");
    fprintf(out, "examples:\n"
                 "  kvpage put --file /mnt/3fs/rank0 --file-size 64G --page-size 2M KEY data.bin\n"
                 "  kvpage get --file /mnt/3fs/rank0 --page-size 2M KEY out.bin\n"
                 "  kvpage exists --file /mnt/3fs/rank0 --page-size 2M --meta "
                 "http://10.0.0.5:18000 K1 K2\n"
                 "  kvpage delete --file /mnt/3fs/rank0 --page-size 2M --meta "
                 "redis://10.0.0.5:6379/0 K1\n");
}

/* Reads all of fd, at most max bytes; *n the bytes read, 1 when there were more. */
static int read_all(int fd, uint8_t *buf, uint64_t max, uint64_t *n)
{
    *n = 0;
    for (;;) {
        uint8_t extra;
        uint8_t *dst = *n < max ? buf + *n : &extra;
        size_t want = *n < max ? (size_t)(max - *n) : 1;
        ssize_t r = read(fd, dst, want);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return 0;
        if (*n >= max)
            return 1;
        *n += (uint64_t)r;
    }
}

static int write_all(int fd, const uint8_t *p, uint64_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w, n -= (uint64_t)w;
    }
    return 0;
}

static int key_ok(const char *cmd, const char *key)
{
    const char *why = kvp_key_problem(key, strlen(key));
    if (why) {
        fprintf(stderr, "kvpage %s: the key %s (1 .. 1024 bytes)\n", cmd, why);
        return 0;
    }
    return 1;
}

/* A put into an existing store is first opened read-only,
 * so that what refuses it (the page size against the rank's, the owner)
 * refuses it before the metadata is opened for writing, which rewrites its
 * log. Returns 0 or the exit status of the refusal. */
static int put_precheck(const struct kvp__store_flags *f)
{
    struct stat st;
    if (stat(f->file, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    struct kvp_store *s;
    int rc = kvp__store_flags_open("put?", f, 1, 0, &s);
    if (!rc)
        kvp_store_close(s);
    return rc;
}

static int cmd_put(const struct kvp__store_flags *f, char **pos, int npos)
{
    if (npos < 1 || npos > 2) {
        fprintf(stderr, "kvpage put: %s\n", npos < 1 ? "no KEY given" : "too many arguments");
        store_usage(stderr, "put");
        return KVP_EXIT_USAGE;
    }
    const char *key = pos[0], *input = npos == 2 ? pos[1] : "-";
    if (!key_ok("put", key))
        return KVP_EXIT_USAGE;
    if (!f->page_size || !f->file)
        return kvp__store_flags_open("put", f, 1, 1, NULL); /* says which flag */
    /* The input first: anything that does not fit is refused before anything changes. */
    const uint64_t ps = f->page_size;
    const uint64_t cap = ps > TRAILER ? ps - TRAILER : 0;
    const char *what = strcmp(input, "-") ? input : "standard input";
    int fd = 0;
    if (strcmp(input, "-")) {
        fd = open(input, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "kvpage put: %s: %s\n", input, strerror(errno));
            return KVP_EXIT_USAGE;
        }
    }
    uint8_t *page = calloc(1, ps);
    if (!page) {
        fprintf(stderr, "kvpage put: out of memory for a page of %" PRIu64 " bytes\n", ps);
        if (fd)
            close(fd);
        return KVP_EXIT_FAILED;
    }
    uint64_t n;
    int rr = read_all(fd, page, ps, &n);
    if (fd)
        close(fd);
    if (rr < 0) {
        fprintf(stderr, "kvpage put: reading %s: %s\n", what, strerror(-rr));
        free(page);
        return KVP_EXIT_USAGE;
    }
    if (rr == 1 || (n != ps && (ps <= TRAILER || n > cap))) {
        if (rr == 1)
            fprintf(stderr, "kvpage put: %s is larger than a page holds: ", what);
        else
            fprintf(stderr, "kvpage put: %s is %" PRIu64 " bytes: ", what, n);
        if (ps <= TRAILER)
            fprintf(stderr,
                    "--page-size %" PRIu64 " takes exactly %" PRIu64
                    " bytes (no room for the 16-byte length trailer)\n",
                    ps, ps);
        else
            fprintf(stderr,
                    "--page-size %" PRIu64 " takes exactly %" PRIu64
                    " bytes (stored as they are) or at most %" PRIu64
                    " (16 bytes of the page then record the length)\n",
                    ps, ps, cap);
        free(page);
        return KVP_EXIT_USAGE;
    }
    if (n == ps) {
        uint64_t m = payload_len(page, ps);
        if (m != ps) {
            fprintf(stderr,
                    "kvpage put: %s is one whole page whose last 16 bytes are the command "
                    "line's length trailer (a page put by kvpage put, read whole), so kvpage get "
                    "would give back only its first %" PRIu64
                    " bytes; put those instead (head -c %" PRIu64 ")\n",
                    what, m, m);
            free(page);
            return KVP_EXIT_USAGE;
        }
    } else {
        uint8_t *t = page + cap;
        memcpy(t, MAGIC, 8);
        put_le32(t + 8, (uint32_t)n);
        put_le32(t + 12, check_of(page, n));
    }

    struct kvp_store *s;
    int rc = put_precheck(f);
    if (!rc)
        rc = kvp__store_flags_open("put", f, 1, 1, &s);
    if (rc) {
        free(page);
        return rc;
    }
    struct kvp_str k = {key, strlen(key)};
    struct kvp_store_buf b = {page, f->page_size};
    int64_t res = 0;
    struct kvp_error err = {0};
    rc = kvp_store_put(s, &k, &b, 1, &res, &err);
    kvp_store_close(s);
    free(page);
    if (rc) {
        fprintf(stderr, "kvpage put: %s: %s\n", key, err.msg[0] ? err.msg : kvp_strerror(rc));
        return rc == -EINVAL ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    }
    if (res == KVP_STORE_ALREADY)
        fprintf(stderr, "kvpage put: %s is already there; kept as it is\n", key);
    return KVP_EXIT_OK;
}

/* Whether get's lead and res say k's page failed its integrity tag; its
 * message (the page file's first) into note. */
static int get_rejected(struct kvp_store *s, int64_t lead, int64_t res, char *note, size_t len)
{
    struct kvp_store_stats st = {.stats_size = sizeof st};
    struct kvp_pagefile_info inf = {.info_size = sizeof inf};
    if (!(lead == 0 && res == -ENOENT && kvp_store_stats(s, &st, NULL) == 0 && st.rejected > 0 &&
          kvp_pagefile_info(kvp_store_pagefile(s), &inf) == 0))
        return 0;
    snprintf(note, len, "%s",
             inf.tags_note && inf.tags_note[0] ? inf.tags_note
                                               : "its bytes differ from what was written");
    return 1;
}

/*
 * A get of k whose page failed its tag, in the read-only store *s: the key
 * is dropped from the metadata, so that the next lookup is an honest miss.
 * Remote metadata: the library did it already. Embedded: the one write of a
 * get (README, "A read writes nothing"): *s is closed and the store opened
 * writable, and k read again there, which drops it if it is rejected again
 * (a put may have made it whole meanwhile: then *lead and *res say so).
 * Returns 1 when the key was dropped, 0 when it could not be (*s NULL, why
 * printed).
 */
static int get_drop(const struct kvp__store_flags *f, struct kvp_store **s, const struct kvp_str *k,
                    struct kvp_store_buf *b, int64_t *lead, int64_t *res)
{
    struct kvp_meta_info mi = {.info_size = sizeof mi};
    if (kvp_meta_info(kvp_store_meta(*s), &mi) == 0 && mi.remote)
        return 1;
    kvp_store_close(*s);
    *s = NULL;
    struct kvp__store_flags w = *f;
    w.writable = 1;
    if (kvp__store_flags_open("get", &w, 1, 0, s)) {
        *s = NULL;
        return 0;
    }
    struct kvp_error err = {0};
    *lead = kvp_store_get(*s, k, b, 1, res, &err);
    return 1;
}

static int cmd_get(const struct kvp__store_flags *f, char **pos, int npos)
{
    if (npos < 1 || npos > 2) {
        fprintf(stderr, "kvpage get: %s\n", npos < 1 ? "no KEY given" : "too many arguments");
        store_usage(stderr, "get");
        return KVP_EXIT_USAGE;
    }
    const char *key = pos[0], *output = npos == 2 ? pos[1] : "-";
    if (!key_ok("get", key))
        return KVP_EXIT_USAGE;
    struct kvp_store *s;
    int rc = kvp__store_flags_open("get", f, 1, 0, &s);
    if (rc)
        return rc;
    uint8_t *page = malloc(f->page_size);
    if (!page) {
        kvp_store_close(s);
        fprintf(stderr, "kvpage get: out of memory\n");
        return KVP_EXIT_FAILED;
    }
    struct kvp_str k = {key, strlen(key)};
    struct kvp_store_buf b = {page, f->page_size};
    int64_t res = 0;
    struct kvp_error err = {0};
    int64_t lead = kvp_store_get(s, &k, &b, 1, &res, &err);
    char note[1024];
    int rejected = get_rejected(s, lead, res, note, sizeof note), dropped = 0;
    if (rejected && (dropped = get_drop(f, &s, &k, &b, &lead, &res)) && s &&
        !get_rejected(s, lead, res, note, sizeof note) && lead == 1)
        rejected = 0; /* put again meanwhile: read whole now */
    int status = KVP_EXIT_OK;
    if (rejected) {
        /* Its page is there but its bytes are not what was put: an error,
         * never the bytes. */
        fprintf(stderr,
                "kvpage get: %s: its page failed its integrity check, so it is not printed: "
                "%s. The file's bytes changed since the put (another program or a second "
                "store wrote it, a torn write, a disk error); %s\n",
                key, note,
                dropped ? "the key is dropped from the metadata (kvpage exists: missing): put it "
                          "again"
                        : "the key stays in the metadata: delete it and put it again");
        status = KVP_EXIT_FAILED;
    } else if (lead < 0 || (lead == 0 && res != -ENOENT)) {
        int code = lead < 0 ? (int)lead : (int)res;
        fprintf(stderr, "kvpage get: %s: %s\n", key, err.msg[0] ? err.msg : kvp_strerror(code));
        status = code == -EINVAL ? KVP_EXIT_USAGE : KVP_EXIT_FAILED;
    } else if (lead == 0) {
        fprintf(stderr, "kvpage get: %s is not there\n", key);
        status = KVP_EXIT_MISSING;
    } else {
        uint64_t n = payload_len(page, f->page_size);
        int fd = 1;
        if (strcmp(output, "-")) {
            fd = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0) {
                fprintf(stderr, "kvpage get: %s: %s\n", output, strerror(errno));
                kvp_store_close(s);
                free(page);
                return KVP_EXIT_USAGE;
            }
        }
        int wr = write_all(fd, page, n);
        if (fd != 1 && close(fd) && !wr)
            wr = -errno;
        if (wr) {
            fprintf(stderr, "kvpage get: writing %s: %s\n", fd == 1 ? "standard output" : output,
                    strerror(-wr));
            status = KVP_EXIT_FAILED;
        }
    }
    kvp_store_close(s);
    free(page);
    return status;
}

static int cmd_keys(const char *cmd, const struct kvp__store_flags *f, char **pos, int npos)
{
    if (npos < 1) {
        fprintf(stderr, "kvpage %s: no KEY given\n", cmd);
        store_usage(stderr, cmd);
        return KVP_EXIT_USAGE;
    }
    for (int i = 0; i < npos; i++)
        if (!key_ok(cmd, pos[i]))
            return KVP_EXIT_USAGE;
    struct kvp_store *s;
    int rc = kvp__store_flags_open(cmd, f, 8, 0, &s);
    if (rc)
        return rc;
    struct kvp_str *k = calloc((size_t)npos, sizeof *k);
    uint8_t *ex = calloc((size_t)npos, 1);
    if (!k || !ex) {
        free(k), free(ex);
        kvp_store_close(s);
        fprintf(stderr, "kvpage %s: out of memory\n", cmd);
        return KVP_EXIT_FAILED;
    }
    for (int i = 0; i < npos; i++)
        k[i] = (struct kvp_str){pos[i], strlen(pos[i])};
    struct kvp_error err = {0};
    int status = KVP_EXIT_OK;
    int64_t r;
    if (!strcmp(cmd, "exists")) {
        r = kvp_store_exists(s, k, (size_t)npos, ex, &err);
    } else {
        /* delete: which of them this rank holds, then forget them */
        r = kvp_meta_exists(kvp_store_ns(s), kvp_store_rank(s), k, (size_t)npos, ex, &err);
        if (r == 0)
            r = kvp_store_delete(s, k, (size_t)npos, &err);
    }
    if (r < 0) {
        fprintf(stderr, "kvpage %s: %s\n", cmd, err.msg[0] ? err.msg : kvp_strerror((int)r));
        status = KVP_EXIT_FAILED;
    } else {
        for (int i = 0; i < npos; i++) {
            if (!strcmp(cmd, "exists"))
                printf("%s\t%s\n", pos[i], ex[i] ? "present" : "missing");
            else if (!ex[i])
                fprintf(stderr, "kvpage delete: %s is not there\n", pos[i]);
            if (!ex[i])
                status = KVP_EXIT_MISSING;
        }
        if (fflush(stdout)) {
            fprintf(stderr, "kvpage %s: writing standard output: %s\n", cmd, strerror(errno));
            status = KVP_EXIT_FAILED;
        }
    }
    free(k), free(ex);
    kvp_store_close(s);
    return status;
}

int kvp__cli_store(int argc, char **argv)
{
    const char *cmd = argv[0];
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            store_usage(stdout, cmd);
            return KVP_EXIT_OK;
        }
    char **pos = calloc((size_t)argc, sizeof *pos);
    if (!pos)
        return KVP_EXIT_FAILED;
    struct kvp__store_flags f;
    int npos;
    int rc = kvp__store_flags_parse(cmd, argc, argv, &f, pos, &npos, NULL, NULL);
    if (!rc && f.json) {
        fprintf(stderr, "kvpage %s: unknown flag '--json'\n", cmd);
        rc = KVP_EXIT_USAGE;
    }
    if (!rc) {
        if (!strcmp(cmd, "put"))
            rc = cmd_put(&f, pos, npos);
        else if (!strcmp(cmd, "get"))
            rc = cmd_get(&f, pos, npos);
        else
            rc = cmd_keys(cmd, &f, pos, npos);
    }
    free(pos);
    return rc;
}
