/*
 * test_store_tags — the store's integrity tags (kvpage/store.h, "Integrity"):
 * a page whose bytes another writer changed after its put is a miss for its
 * key alone (the other keys of the call are read, byte for byte), its buffer
 * zeroed, counted (rejected, missing), logged once per store through the
 * metadata's log, and its key dropped from the metadata (the next lookup is
 * an honest miss: exists says no); the same through kvp_store_getv; a page
 * that holds another key's intact page is rejected for this key (the tag is
 * bound to the key); a read-only store drops nothing; no_tags serves the
 * bytes as before tags existed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/store.h"
#include "scratch.h"
#include "store_test.h"

#define BPP 8192u
#define N 4

static char tmpdir[256];
static int logged;
static char last_log[1024];

static void log_fn(void *arg, int level, const char *msg)
{
    (void)arg;
    if (strstr(msg, "integrity")) {
        logged++;
        CHECK_EQ(level, 1);
        snprintf(last_log, sizeof last_log, "%s", msg);
        if (getenv("SHOWLOG"))
            fprintf(stderr, "LOG: %s\n", msg);
    }
}

static void path_of(char *path, size_t len, const char *name)
{
    snprintf(path, len, "%s/%s", tmpdir, name);
}

/* The store, or NULL after a failed check. */
static struct kvp_store *open_store(const char *name, int no_tags, int readonly)
{
    char path[512];
    path_of(path, sizeof path, name);
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = readonly ? 0 : 16 * BPP;
    o.bytes_per_page = BPP;
    o.no_tags = no_tags;
    o.readonly = readonly;
    struct kvp_meta_opts mo;
    kvp_meta_opts_init(&mo);
    mo.log = log_fn;
    o.meta_opts = &mo;
    struct kvp_error err = {0};
    struct kvp_store *s = NULL;
    int rc = kvp_store_open(&o, &s, &err);
    if (rc) {
        fprintf(stderr, "kvp_store_open(%s): %d %s\n", name, rc, err.msg);
        CHECK(0);
        return NULL;
    }
    return s;
}

static const char *const keys[N] = {"k0", "k1", "k2", "k3"};

static void fill(uint8_t *p, int i)
{
    for (size_t j = 0; j < BPP; j++)
        p[j] = (uint8_t)(i * 31 + j * 7 + 1);
}

/* Puts the N keys; returns the page of each (looked up after). */
static void put_all(struct kvp_store *s, int64_t pages[N])
{
    static uint8_t data[N][BPP];
    struct kvp_str k[N];
    struct kvp_store_buf b[N];
    for (int i = 0; i < N; i++) {
        fill(data[i], i);
        k[i] = S(keys[i]);
        b[i] = (struct kvp_store_buf){data[i], BPP};
    }
    int64_t res[N];
    CHECK_EQ(kvp_store_put(s, k, b, N, res, NULL), 0);
    CHECK_EQ(kvp_meta_lookup(kvp_store_ns(s), kvp_store_rank(s), 0, k, N, pages, NULL), 0);
}

/* A new store with the N keys put, or NULL after a failed check. */
static struct kvp_store *open_put(const char *name, int no_tags, int64_t pages[N])
{
    struct kvp_store *s = open_store(name, no_tags, 0);
    if (s)
        put_all(s, pages);
    return s;
}

/* Another writer: overwrites len bytes at the start of page `page`. */
static void scribble(const char *name, int64_t page, size_t len)
{
    char path[512];
    path_of(path, sizeof path, name);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    uint8_t junk[BPP];
    memset(junk, 0x5c, sizeof junk);
    CHECK_EQ(pwrite(fd, junk, len, (off_t)page * BPP), (long long)len);
    close(fd);
}

/* Gets the N keys (vectored: each page in two buffers); returns lead.
 * wrong: pages read whose bytes differ; zeroed: -ENOENT buffers all zeros. */
static int64_t get_all(struct kvp_store *s, int vec, int64_t res[N], int *wrong, int *zeroed)
{
    static uint8_t data[N][BPP], want[BPP];
    struct kvp_str k[N];
    struct kvp_store_buf b[N], segs[N][2];
    struct kvp_store_bufv v[N];
    memset(data, 0xa5, sizeof data);
    for (int i = 0; i < N; i++) {
        k[i] = S(keys[i]);
        b[i] = (struct kvp_store_buf){data[i], BPP};
        segs[i][0] = (struct kvp_store_buf){data[i], 100};
        segs[i][1] = (struct kvp_store_buf){data[i] + 100, BPP - 100};
        v[i] = (struct kvp_store_bufv){segs[i], 2};
    }
    int64_t lead =
        vec ? kvp_store_getv(s, k, v, N, res, NULL) : kvp_store_get(s, k, b, N, res, NULL);
    *wrong = *zeroed = 0;
    for (int i = 0; i < N; i++) {
        if (res[i] == BPP) {
            fill(want, i);
            *wrong += memcmp(want, data[i], BPP) != 0;
        } else if (res[i] == -ENOENT) {
            int z = 1;
            for (size_t j = 0; j < BPP; j++)
                z &= data[i][j] == 0;
            *zeroed += z;
        }
    }
    return lead;
}

static void test_rejected(int vec)
{
    const char *name = vec ? "rej_v" : "rej";
    int64_t pages[N], res[N];
    struct kvp_store *s = open_put(name, 0, pages);
    if (!s)
        return;
    scribble(name, pages[2], 1); /* one byte of k2's page */
    logged = 0;
    int wrong, zeroed;
    CHECK_EQ(get_all(s, vec, res, &wrong, &zeroed), 2);
    CHECK_EQ(res[0], BPP);
    CHECK_EQ(res[1], BPP);
    CHECK_EQ(res[2], -ENOENT); /* a miss, never the bytes */
    CHECK_EQ(res[3], BPP);     /* the others of the call unaffected */
    CHECK_EQ(wrong, 0);
    CHECK_EQ(zeroed, 1);
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.rejected, 1);
    CHECK_EQ(st.missing, 1);
    CHECK_EQ(st.read, 3);
    CHECK_EQ(st.get_failed, 0);
    CHECK_EQ(logged, 1);
    char want[64];
    snprintf(want, sizeof want, "page %lld ", (long long)pages[2]);
    CHECK(strstr(last_log, want) != NULL);
    CHECK(strstr(last_log, "'k2'") != NULL);
    /* dropped: the next lookup is an honest miss */
    uint8_t there[N];
    struct kvp_str k[N] = {S("k0"), S("k1"), S("k2"), S("k3")};
    CHECK_EQ(kvp_store_exists(s, k, N, there, NULL), 2);
    CHECK_EQ(there[2], 0);
    CHECK_EQ(there[3], 1);
    /* a second rejection is counted, not logged */
    scribble(name, pages[3], BPP);
    CHECK_EQ(get_all(s, vec, res, &wrong, &zeroed), 2);
    CHECK_EQ(res[2], -ENOENT);
    CHECK_EQ(res[3], -ENOENT);
    get_stats(s, &st);
    CHECK_EQ(st.rejected, 2); /* k2 is a plain miss now: dropped */
    CHECK_EQ(logged, 1);
    CHECK_EQ(wrong, 0);
    /* put again: stored afresh, read whole */
    struct kvp_str k3 = S("k3");
    uint8_t d[BPP];
    fill(d, 3);
    struct kvp_store_buf b = {d, BPP};
    int64_t r;
    CHECK_EQ(kvp_store_put(s, &k3, &b, 1, &r, NULL), 0);
    CHECK_EQ(r, KVP_STORE_STORED);
    CHECK_EQ(get_all(s, vec, res, &wrong, &zeroed), 2);
    CHECK_EQ(res[3], BPP);
    CHECK_EQ(wrong, 0);
    kvp_store_close(s);
}

/* The tag is bound to the key: a key whose metadata names a page that holds
 * another key's intact page is rejected for it. */
static void test_other_key(void)
{
    int64_t pages[N], res[N];
    struct kvp_store *s = open_put("other", 0, pages);
    if (!s)
        return;
    /* k1's page rewritten, whole and tagged, as k0's page by a keyed writer */
    uint8_t d[BPP];
    fill(d, 1);
    struct kvp_pagefile_op op = {pages[1] * (int64_t)BPP, d, BPP};
    const char *other = "k0";
    int64_t r;
    CHECK_EQ(kvp_pagefile_write_keyed(kvp_store_pagefile(s), &op, &other, 1, &r, NULL), 0);
    int wrong, zeroed;
    CHECK_EQ(get_all(s, 0, res, &wrong, &zeroed), 1);
    CHECK_EQ(res[1], -ENOENT);
    CHECK_EQ(res[2], BPP);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(zeroed, 1);
    kvp_store_close(s);
}

/* A read-only store rejects alike and changes nothing: the key stays. */
static void test_readonly(void)
{
    int64_t pages[N], res[N];
    struct kvp_store *s = open_put("ro", 0, pages);
    if (!s)
        return;
    kvp_store_close(s);
    scribble("ro", pages[0], 7);
    s = open_store("ro", 0, 1);
    if (!s)
        return;
    int wrong, zeroed;
    CHECK_EQ(get_all(s, 0, res, &wrong, &zeroed), 0);
    CHECK_EQ(res[0], -ENOENT);
    CHECK_EQ(res[1], BPP);
    CHECK_EQ(wrong, 0);
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.rejected, 1);
    struct kvp_str k0 = S("k0");
    uint8_t there = 0;
    CHECK_EQ(kvp_store_exists(s, &k0, 1, &there, NULL), 1);
    kvp_store_close(s);
}

/* no_tags: the bytes as they are (what the option is for), no sidecar. */
static void test_no_tags(void)
{
    int64_t pages[N], res[N];
    struct kvp_store *s = open_put("notags", 1, pages);
    if (!s)
        return;
    struct kvp_pagefile_info inf = {.info_size = sizeof inf};
    CHECK_EQ(kvp_pagefile_info(kvp_store_pagefile(s), &inf), 0);
    CHECK_EQ(inf.tags, 0);
    scribble("notags", pages[2], 1);
    int wrong, zeroed;
    CHECK_EQ(get_all(s, 0, res, &wrong, &zeroed), N);
    CHECK_EQ(wrong, 1); /* served unverified */
    struct kvp_store_stats st;
    get_stats(s, &st);
    CHECK_EQ(st.rejected, 0);
    kvp_store_close(s);
    char path[512];
    path_of(path, sizeof path, "notags.tags");
    CHECK(access(path, F_OK) != 0);
}

int main(void)
{
    scratch_make(tmpdir, sizeof tmpdir, "test_store_tags", 0);
    test_rejected(0);
    test_rejected(1);
    test_other_key();
    test_readonly();
    test_no_tags();
    scratch_remove(tmpdir);
    return check_report();
}
