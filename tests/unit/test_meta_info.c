/*
 * What the library says about its metadata backends (kvpage/meta.h
 * kvp_meta_info, kvp_meta_backend_info, kvp_meta_location_info):
 *
 *   - the listing: every scheme of mem:, file:, http://, redis:// and
 *     redis-sentinel://, in the order errors name them, each with its
 *     backend's name, a description and whether it is remote; -ENOENT past
 *     the end; a short info_size gets only what it has room for;
 *   - a location's backend without opening it, with open's errors;
 *   - a handle's promise: mem: nothing, a data directory its fsync, read
 *     only nothing (Redis's: tests/integration/test_meta_info.py).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "meta_test.h"
#include "kvpage/meta.h"

static struct kvp_meta_info info_init(void)
{
    struct kvp_meta_info i;
    memset(&i, 0xa5, sizeof i); /* what is not filled shows */
    i.info_size = sizeof i;
    return i;
}

static void test_listing(void)
{
    static const char *const want[][3] = {
        {"mem", "in-process", "0"},
        {"file", "in-process", "0"},
        {"http", "http", "1"},
        {"redis", "redis", "1"},
        {"redis-sentinel", "redis-sentinel", "1"},
    };
    size_t n = 0;
    struct kvp_meta_info i = info_init();
    for (; kvp_meta_backend_info(n, &i) == 0; n++) {
        CHECK_EQ(i.info_size, sizeof i);
        CHECK(i.name && *i.name && i.scheme && *i.scheme);
        CHECK(i.description && strlen(i.description) > 10);
        CHECK(i.holder && *i.holder);
        CHECK_EQ(i.durability, KVP_DURABLE_UNKNOWN);                    /* no handle, no state */
        CHECK(strcmp(i.scheme, "https") && strcmp(i.scheme, "rediss")); /* refused, unlisted */
        if (n < sizeof want / sizeof *want) {
            CHECK(!strcmp(i.scheme, want[n][0]));
            CHECK(!strcmp(i.name, want[n][1]));
            CHECK_EQ(i.remote, want[n][2][0] - '0');
        }
        i = info_init();
    }
    CHECK(n >= sizeof want / sizeof *want);
    CHECK_EQ(kvp_meta_backend_info(n, &i), -ENOENT);
    CHECK_EQ(i.info_size, sizeof i); /* unchanged */
    CHECK_EQ(kvp_meta_backend_info(0, NULL), -EINVAL);
    i.info_size = 0;
    CHECK_EQ(kvp_meta_backend_info(0, &i), -EINVAL);
    /* A caller built against an older header: only its fields. */
    i = info_init();
    i.info_size = offsetof(struct kvp_meta_info, description);
    CHECK_EQ(kvp_meta_backend_info(3, &i), 0);
    CHECK_EQ(i.info_size, offsetof(struct kvp_meta_info, description));
    CHECK(!strcmp(i.scheme, "redis"));
    struct kvp_meta_info untouched = info_init();
    CHECK(!memcmp(&i.description, &untouched.description, sizeof i.description));
    /* A newer one: ours, and info_size says how much. */
    struct {
        struct kvp_meta_info i;
        char more[64];
    } big;
    memset(&big, 0, sizeof big);
    big.i.info_size = sizeof big;
    CHECK_EQ(kvp_meta_backend_info(0, &big.i), 0);
    CHECK_EQ(big.i.info_size, sizeof big.i);
    CHECK(!strcmp(big.i.scheme, "mem"));
}

static void test_location(void)
{
    struct kvp_meta_info i = info_init();
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_location_info("redis://127.0.0.1:1/0?prefix=x", 0, &i, &err), 0);
    CHECK(!strcmp(i.name, "redis") && i.remote == 1 && !strcmp(i.holder, "Redis"));
    CHECK(!strcmp(i.values_section, "redis"));
    CHECK(!strcmp(i.durability_wanted, "appendonly yes and appendfsync always"));
    CHECK(!strcmp(i.durability_source, "CONFIG GET"));
    CHECK_EQ(kvp_meta_location_info("redis-sentinel://h:1/m", 0, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "redis-sentinel") && i.remote == 1);
    CHECK_EQ(kvp_meta_location_info("http://127.0.0.1:1", 0, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "http") && i.remote == 1 && i.durability_wanted == NULL);
    CHECK_EQ(kvp_meta_location_info(NULL, 0, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "mem") && i.remote == 0);
    CHECK_EQ(kvp_meta_location_info("", 1, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "file"));
    CHECK_EQ(kvp_meta_location_info("./dir", 0, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "file") && !strcmp(i.name, "in-process"));
    CHECK_EQ(kvp_meta_location_info("file:///d", 0, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "file") && i.durability_wanted == NULL);
    CHECK_EQ(kvp_meta_location_info("mem:", 1, &i, &err), 0);
    CHECK(!strcmp(i.scheme, "mem"));
    /* open's errors, without opening. */
    CHECK_EQ(kvp_meta_location_info("nope:x", 0, &i, &err), -EINVAL);
    CHECK(strstr(err.msg, "unknown metadata location scheme 'nope:'") &&
          strstr(err.msg, "redis-sentinel:"));
    CHECK_EQ(kvp_meta_location_info("https://h:1", 0, &i, &err), -EOPNOTSUPP);
    CHECK(!strcmp(err.msg, "metadata location scheme 'https:' is not implemented yet: use "
                           "http:// (kvpage serve speaks plain HTTP; put TLS in a proxy beside "
                           "it)"));
    CHECK_EQ(kvp_meta_location_info("rediss://h:1", 0, &i, &err), -EOPNOTSUPP);
    /* the schemes there are follow (testmem: too in a test build) */
    CHECK(strstr(err.msg,
                 "metadata location scheme 'rediss:' (Redis over TLS) is not "
                 "implemented yet (known: mem:, file:, http:, redis:, redis-sentinel:") == err.msg);
    CHECK_EQ(kvp_meta_location_info("file:", 0, &i, &err), -EINVAL);
    CHECK(strstr(err.msg, "names no directory") != NULL);
    CHECK_EQ(kvp_meta_location_info("127.0.0.1:6379", 0, &i, &err), -EINVAL);
    CHECK_EQ(kvp_meta_location_info("mem:", 0, NULL, &err), -EINVAL);
    /* An empty data directory is no directory, as "file:" is. */
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = "";
    struct kvp_meta *m = NULL;
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_open_at(NULL, &o, &m, &err), -EINVAL);
    CHECK(strstr(err.msg, "location 'file:' names no directory (file:DIR)") != NULL);
    CHECK(m == NULL);
}

static void test_handles(void)
{
    struct kvp_meta_info i = info_init();
    struct kvp_meta *m = NULL;
    CHECK_EQ(kvp_meta_open_at("mem:", NULL, &m, NULL), 0);
    CHECK_EQ(kvp_meta_info(m, &i), 0);
    CHECK(!strcmp(i.scheme, "mem") && !strcmp(i.name, "in-process") && i.remote == 0);
    CHECK(!strcmp(i.holder, "this process") && i.values_section == NULL);
    CHECK_EQ(i.durability, KVP_DURABLE_NONE);
    CHECK(!strcmp(i.durability_text, "memory only"));
    CHECK(i.durability_wanted == NULL && i.durability_meaning != NULL);
    CHECK_EQ(kvp_meta_info(m, NULL), -EINVAL);
    CHECK_EQ(kvp_meta_info(NULL, &i), -EINVAL);
    kvp_meta_close(m);

    char dir[] = "/tmp/kvp_meta_info_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    static const struct {
        int fsync, readonly, level;
        const char *text;
    } cases[] = {
        {KVP_FSYNC_BATCH, 0, KVP_DURABLE_MACHINE, "write-ahead log, fsync batch"},
        {KVP_FSYNC_ALWAYS, 0, KVP_DURABLE_MACHINE, "write-ahead log, fsync always"},
        {KVP_FSYNC_NEVER, 0, KVP_DURABLE_PROCESS, "write-ahead log, fsync never"},
        {KVP_FSYNC_BATCH, 1, KVP_DURABLE_NONE, "read only: changes live in memory"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct kvp_meta_opts o;
        kvp_meta_opts_init(&o);
        o.fsync = cases[c].fsync;
        o.readonly = cases[c].readonly;
        o.snapshot_mode = KVP_SNAPSHOT_MANUAL;
        m = NULL;
        CHECK_EQ(kvp_meta_open_at(dir, &o, &m, NULL), 0);
        i = info_init();
        CHECK_EQ(kvp_meta_info(m, &i), 0);
        CHECK(!strcmp(i.scheme, "file") && i.remote == 0);
        CHECK_EQ(i.durability, cases[c].level);
        CHECK(!strcmp(i.durability_text, cases[c].text));
        kvp_meta_close(m);
    }
    rmrf(dir);
}

int main(void)
{
    test_listing();
    test_location();
    test_handles();
    return check_report();
}
