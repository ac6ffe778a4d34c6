/*
 * What the library says of its page-I/O backends and flags, for the callers
 * that ask it instead of copying a table (tools/bench_io_cli.c,
 * python/kvpage/pagefile.py): backend values consecutive from AUTO up to the
 * first "?", and one name per flag.
 */
#include <string.h>

#include "check.h"
#include "kvpage/pagefile.h"

static int is(const char *got, const char *want)
{
    return got && want ? strcmp(got, want) == 0 : got == want;
}

static void test_backend_names(void)
{
    static const char *const want[] = {"auto", "psync", "uring", "usrbio"};
    int n = 0;
    while (!is(kvp_pagefile_backend_name(n), "?") && n < 1000)
        n++;
    CHECK_EQ(n, 4);
    for (int b = 0; b < 4; b++)
        CHECK(is(kvp_pagefile_backend_name(b), want[b]));
    CHECK_EQ(KVP_PAGEFILE_BACKEND_AUTO, 0);
    CHECK(is(kvp_pagefile_backend_name(KVP_PAGEFILE_BACKEND_USRBIO), "usrbio"));
    CHECK(is(kvp_pagefile_backend_name(-1), "?"));
    /* a line for people of each (kvpage backends, bench io --help) */
    for (int b = 0; b < 4; b++) {
        const char *d = kvp_pagefile_backend_description(b);
        CHECK(d && strlen(d) > 20 && !strchr(d, '\n') && !is(d, "?"));
    }
    CHECK(strstr(kvp_pagefile_backend_description(KVP_PAGEFILE_BACKEND_USRBIO), "3FS") != NULL);
    CHECK(is(kvp_pagefile_backend_description(-1), "?"));
    CHECK(is(kvp_pagefile_backend_description(n), "?"));
}

static void test_flag_names(void)
{
    static const struct {
        uint32_t flag;
        const char *name;
    } want[] = {
        {KVP_PAGEFILE_CREATE, "create"},     {KVP_PAGEFILE_DIRECT, "direct"},
        {KVP_PAGEFILE_ALIGNED, "aligned"},   {KVP_PAGEFILE_EXACT_SIZE, "exact_size"},
        {KVP_PAGEFILE_READONLY, "readonly"}, {KVP_PAGEFILE_MMAP_READS, "mmap_reads"},
        {KVP_PAGEFILE_MKDIR, "mkdir"},       {KVP_PAGEFILE_NO_TAGS, "no_tags"},
    };
    uint32_t named = 0;
    for (int b = 0; b < 32; b++)
        if (kvp_pagefile_flag_name(1u << b))
            named |= 1u << b;
    uint32_t all = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(is(kvp_pagefile_flag_name(want[i].flag), want[i].name));
        all |= want[i].flag;
    }
    CHECK_EQ(named, all); /* no other bit has a name */
    CHECK(kvp_pagefile_flag_name(0) == NULL);
    CHECK(kvp_pagefile_flag_name(KVP_PAGEFILE_CREATE | KVP_PAGEFILE_DIRECT) == NULL);
}

int main(void)
{
    test_backend_names();
    test_flag_names();
    return check_report();
}
