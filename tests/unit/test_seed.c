/* util/seed.h: the in-process tables' hash seed is drawn once per process,
 * the same on every call, and another in another process (so a client
 * cannot know which of its keys share a bucket of the key index). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "util/seed.h"

/* The seed printed by another run of this program. */
static int seed_of_child(const char *self, uint64_t *out)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' print", self);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    int n = fscanf(f, "%" SCNx64, out);
    return pclose(f) == 0 && n == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "print")) {
        printf("%" PRIx64 "\n", kvp__hash_seed());
        return 0;
    }
    uint64_t mine = kvp__hash_seed();
    CHECK(mine == kvp__hash_seed());
    uint64_t a = 0, b = 0;
    CHECK(seed_of_child(argv[0], &a) == 0);
    CHECK(seed_of_child(argv[0], &b) == 0);
    /* Three 64-bit draws: equal by chance once in 2^63. */
    CHECK(a != b && a != mine && b != mine);
    return check_report();
}
