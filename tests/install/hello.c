/*
 * tests/install/hello.c — a C program built against an installed kvpage
 * through pkg-config (tests/install/run.sh): the metadata store in memory, a
 * page file in a temporary directory, a page key (libcrypto's SHA-256) and
 * the store (a page put and got by key). Exit 0 and one "ok" line per step,
 * or exit 1 and a "FAIL" line.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvpage/keys.h>
#include <kvpage/pagefile.h>
#include <kvpage/store.h>

#include "meta_check.h"

#define PAGE 4096

static int pagefile_steps(const char *path)
{
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    struct kvp_pagefile_opts opts;
    kvp_pagefile_opts_init(&opts);
    opts.size = 4 * PAGE;
    opts.bytes_per_page = PAGE;
    opts.flags = KVP_PAGEFILE_CREATE;
    struct kvp_pagefile *pf = NULL;
    int rc = kvp_pagefile_open(path, &opts, &pf, &err);
    if (rc)
        return install_fail("kvp_pagefile_open", rc, &err);

    static unsigned char out[PAGE], in[2][PAGE];
    for (size_t i = 0; i < PAGE; i++)
        out[i] = (unsigned char)(i * 7 + 1);
    memset(in, 0xee, sizeof in);
    struct kvp_pagefile_op w = {2 * PAGE, out, PAGE};
    struct kvp_pagefile_op r[2] = {{2 * PAGE, in[0], PAGE}, {0, in[1], PAGE}};
    int64_t res[2] = {0, 0};
    int bad = 0;
    if ((rc = kvp_pagefile_write(pf, &w, 1, res, &err)) != 0) {
        bad = install_fail("kvp_pagefile_write", rc, &err);
    } else if ((rc = kvp_pagefile_flush(pf, &err)) != 0) {
        bad = install_fail("kvp_pagefile_flush", rc, &err);
    } else if ((rc = kvp_pagefile_read(pf, r, 2, res, &err)) != 0) {
        bad = install_fail("kvp_pagefile_read", rc, &err);
    } else if (res[0] != PAGE || res[1] != PAGE) {
        printf("FAIL kvp_pagefile_read: results %lld %lld (want %d %d)\n", (long long)res[0],
               (long long)res[1], PAGE, PAGE);
        bad = 1;
    } else if (memcmp(in[0], out, PAGE) != 0) {
        printf("FAIL kvp_pagefile_read: page 2 does not hold what was written\n");
        bad = 1;
    } else {
        for (size_t i = 0; i < PAGE && !bad; i++)
            if (in[1][i] != 0) {
                printf("FAIL kvp_pagefile_read: page 0 (never written) has byte %zu = %d\n", i,
                       in[1][i]);
                bad = 1;
            }
    }
    if (!bad)
        printf("ok hello pagefile: wrote page 2, read it back, page 0 reads as zeros "
               "(%s writes, %s reads)\n",
               kvp_pagefile_backend_name(kvp_pagefile_backend(pf, 1)),
               kvp_pagefile_backend_name(kvp_pagefile_backend(pf, 0)));
    kvp_pagefile_close(pf);
    return bad;
}

static int store_steps(const char *path)
{
    struct kvp_store_opts o;
    kvp_store_opts_init(&o);
    o.path = path;
    o.file_size = 8 * PAGE;
    o.bytes_per_page = PAGE;
    o.meta = "mem:";
    struct kvp_store *s = NULL;
    struct kvp_error err;
    memset(&err, 0, sizeof err);
    int rc = kvp_store_open(&o, &s, &err);
    if (rc)
        return install_fail("kvp_store_open", rc, &err);
    static char page[PAGE], back[PAGE];
    memset(page, 'k', sizeof page);
    struct kvp_str key = {"hello-key", 9};
    struct kvp_store_buf w = {page, PAGE}, r = {back, PAGE};
    int64_t res = 0;
    int bad = 0;
    if ((rc = kvp_store_put(s, &key, &w, 1, &res, &err)) != 0 || res != KVP_STORE_STORED) {
        bad = install_fail("kvp_store_put", rc, &err);
    } else if (kvp_store_get(s, &key, &r, 1, &res, &err) != 1 || memcmp(page, back, PAGE)) {
        printf("FAIL kvp_store_get: result %lld or bytes differ\n", (long long)res);
        bad = 1;
    } else {
        printf("ok hello store: a page put and got by key (%llu pages)\n",
               (unsigned long long)kvp_store_num_pages(s));
    }
    kvp_store_close(s);
    return bad;
}

int main(void)
{
    if (strcmp(kvp_strerror(0), "success") != 0) {
        printf("FAIL kvp_strerror(0): '%s'\n", kvp_strerror(0));
        return 1;
    }
    if (meta_check("hello"))
        return 1;

    /* Tokens 0..3, one page: SGLang's get_hash_str([0, 1, 2, 3]). */
    const uint32_t tokens[4] = {0, 1, 2, 3};
    char key[1][KVP_PAGE_KEY_LEN + 1];
    size_t nkeys = 0;
    int rc = kvp_page_keys(tokens, 4, 4, NULL, NULL, 0, key, 1, &nkeys, NULL);
    if (rc != 0 || nkeys != 1 ||
        strcmp(key[0], "baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe") != 0) {
        printf("FAIL kvp_page_keys: rc %d, %zu keys, '%s'\n", rc, nkeys, nkeys ? key[0] : "");
        return 1;
    }
    printf("ok hello keys: the SHA-256 page key of tokens 0..3\n");

    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/kvpage-hello.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("FAIL mkdtemp");
        return 1;
    }
    char path[4096 + 16];
    snprintf(path, sizeof path, "%s/pages", dir);
    int bad = pagefile_steps(path);
    unlink(path);
    if (!bad) {
        bad = store_steps(path);
        unlink(path);
    }
    rmdir(dir);
    return bad;
}
