#include "util/seed.h"

#include <errno.h>
#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void seed_draw(void)
{
    uint64_t v = 0;
    size_t got = 0;
    unsigned char *p = (unsigned char *)&v;
    while (got < sizeof v) {
        /* GRND_NONBLOCK: early at boot, a weaker seed beats a hang. */
        ssize_t n = getrandom(p + got, sizeof v - got, GRND_NONBLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^
             (uint64_t)(uintptr_t)&seed;
    }
    seed = v;
}

uint64_t kvp__hash_seed(void)
{
    pthread_once(&seed_once, seed_draw);
    return seed;
}
