/*
 * Metadata locations in one place (src/meta/location.c): the canonical form
 * kvp_meta_location_canonical gives without opening anything is the one an
 * opened handle reports (kvp_meta_location), and a scheme-less HOST:PORT is
 * refused as kvp_meta_open_at and the store refuse it.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kvpage/meta.h"

static void canon_is(const char *in, const char *want)
{
    char out[512];
    struct kvp_error err = {0};
    int rc = kvp_meta_location_canonical(in, out, sizeof out, &err);
    CHECK_EQ(rc, 0);
    if (rc == 0 && strcmp(out, want) != 0) {
        fprintf(stderr, "canonical '%s': '%s', expected '%s'\n", in ? in : "(null)", out, want);
        CHECK(0);
    }
}

/* The canonical form is the one a handle reports for the same location. */
static void same_as_open(const char *loc)
{
    char out[512];
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_location_canonical(loc, out, sizeof out, &err), 0);
    struct kvp_meta *m = NULL;
    CHECK_EQ(kvp_meta_open_at(loc, NULL, &m, &err), 0);
    if (m) {
        CHECK(strcmp(kvp_meta_location(m), out) == 0);
        kvp_meta_close(m);
    }
}

int main(void)
{
    canon_is(NULL, "mem:");
    canon_is("", "mem:");
    canon_is("mem:", "mem:");
    canon_is("HTTP://User:Secret@LocalHost:18000/ns/d1/?password=x&prefix=p#frag",
             "http://localhost:18000/ns/d1?prefix=p");
    canon_is("redis://:pw@10.0.0.5:6379/0?prefix=k&token=t", "redis://10.0.0.5:6379/0?prefix=k");

    const char *t = getenv("TMPDIR");
    char dir[PATH_MAX], real[PATH_MAX], want[PATH_MAX + 8], in[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/kvp-loc-%d", t ? t : "/var/tmp", (int)getpid());
    CHECK_EQ(mkdir(dir, 0755), 0);
    CHECK(realpath(dir, real) != NULL);
    snprintf(want, sizeof want, "file:%s", real);
    canon_is(dir, want); /* a plain path is a directory */
    snprintf(in, sizeof in, "file:%s/", dir);
    canon_is(in, want); /* file:DIR, its trailing slash gone */
    snprintf(in, sizeof in, "file:%s/.", dir);
    canon_is(in, want);
    snprintf(in, sizeof in, "file:%s", dir);
    same_as_open(in);
    same_as_open("mem:");

    /* HOST:PORT that is no directory: refused, naming the URL it meant. */
    char out[64];
    struct kvp_error err = {0};
    CHECK_EQ(kvp_meta_location_canonical("127.0.0.1:18501", out, sizeof out, &err), -EINVAL);
    CHECK_EQ(err.rule, KVP_RULE_ARG);
    CHECK(strstr(err.msg, "did you mean http://127.0.0.1:18501?") != NULL);

    /* A buffer too small for it: -ERANGE, saying how many bytes it takes. */
    memset(&err, 0, sizeof err);
    CHECK_EQ(kvp_meta_location_canonical("http://localhost:18000", out, 8, &err), -ERANGE);
    CHECK_EQ(err.value, (long long)strlen("http://localhost:18000") + 1);
    CHECK_EQ(err.limit, 8);

    rmdir(dir);
    return check_report();
}
