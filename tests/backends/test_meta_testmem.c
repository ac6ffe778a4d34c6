/*
 * The test backend testmem: (tests/backends/meta_testmem.c, one row of
 * src/meta/backends.h in test builds) under the differential run every
 * backend meets (meta_diff.h: the same answers as mem:, to the byte), and
 * the proof that the run went through it: its count of calls moved.
 *
 *   test_meta_testmem [steps] [seed]     (defaults: 3000 steps, seed 1)
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvpage/meta.h"
#include "meta_diff.h"

static int calls_fn(const struct kvp_meta_value *v, void *arg)
{
    if (strcmp(v->section, "testmem") || strcmp(v->key, "calls"))
        return 0;
    *(uint64_t *)arg = v->value;
    return 1;
}

/* The backend's count of calls, of every handle (0: no testmem: here). */
static uint64_t calls(void)
{
    uint64_t n = 0;
    struct kvp_meta *m = NULL;
    if (kvp_meta_open_at("testmem:", NULL, &m, NULL) == 0)
        kvp_meta_values(m, calls_fn, &n);
    kvp_meta_close(m);
    return n;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 3000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    /* Listed as the table's other backends are. */
    struct kvp_meta_info i = {.info_size = sizeof i};
    size_t n = 0;
    while (kvp_meta_backend_info(n, &i) == 0 && strcmp(i.scheme, "testmem"))
        n++;
    CHECK(kvp_meta_backend_info(n, &i) == 0 && !strcmp(i.name, "testmem") && !i.remote);

    uint64_t before = calls();
    meta_differential("testmem:", steps, seed);
    uint64_t after = calls();
    printf("differential over testmem: %d steps, %llu calls\n", steps,
           (unsigned long long)(after - before));
    CHECK(after > before + (uint64_t)steps);
    return check_report();
}
