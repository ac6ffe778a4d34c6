/*
 * watch_cost.c: what a watcher (kvp_meta_watch, kvpage serve's KV events)
 * costs the library's allocate + confirm, in process, at a full rank: each
 * operation allocates 64 new keys (evicting 64 pages) and confirms them,
 * rounds with no watcher and with one whose callback returns at once
 * alternate (A B B A), and the medians of the rounds are printed.
 *
 *   cc -O2 -Iinclude bench/meta/watch_cost.c -Lbuild -lkvpage \
 *      -Wl,-rpath,$PWD/build -o /tmp/watch_cost
 *   taskset -c 1 /tmp/watch_cost [PAGES (4194304)] [ROUNDS (20)] [SECONDS_PER_ROUND (0.25)]
 *
 * Keys are 64 hex digits, as SGLang's and vLLM's; the rank is filled first.
 */
#include <kvpage/meta.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 64, FILL = 1024, MAX_ROUNDS = 1000 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned long calls;
static void noop(const struct kvp_meta_change *c, void *arg)
{
    (void)arg;
    calls += c != NULL;
}

/* n new keys of 64 hex digits: a counter spread by a multiplier. */
static unsigned long long seq;
static void make_keys(char (*buf)[64], struct kvp_str *k, int n)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) {
        unsigned long long x = ++seq * 0x9E3779B97F4A7C15ull;
        for (int j = 0; j < 64; j++) {
            buf[i][j] = hex[x & 15];
            x = (x >> 4) | (x << 60);
            if (j % 16 == 15)
                x *= 0xff51afd7ed558ccdull;
        }
        k[i].ptr = buf[i];
        k[i].len = 64;
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    uint64_t pages = argc > 1 ? strtoull(argv[1], NULL, 0) : 4194304;
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    double secs = argc > 3 ? atof(argv[3]) : 0.25;
    if (rounds < 1 || 2 * rounds > MAX_ROUNDS || !(secs > 0)) {
        fprintf(stderr, "usage: watch_cost [PAGES] [ROUNDS 1..%d] [SECONDS]\n", MAX_ROUNDS / 2);
        return 2;
    }
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    struct kvp_meta *m;
    struct kvp_ns *ns;
    struct kvp_error e = {0};
    if (kvp_meta_open_at("mem:", &o, &m, &e) || kvp_meta_ns(m, "d", 1, "p", 1, 1, &ns, &e) ||
        kvp_meta_init_rank(ns, 0, pages, &e)) {
        fprintf(stderr, "watch_cost: %s\n", e.msg);
        return 1;
    }
    static char buf[FILL][64];
    static struct kvp_str k[FILL];
    static int64_t pg[FILL];
    for (uint64_t i = 0; i < pages; i += FILL) {
        make_keys(buf, k, FILL);
        if (kvp_meta_allocate(ns, 0, k, FILL, pg, NULL, &e) ||
            kvp_meta_confirm(ns, 0, k, pg, FILL, NULL, 0, &e)) {
            fprintf(stderr, "watch_cost: fill: %s\n", e.msg);
            return 1;
        }
    }
    static double us[2][MAX_ROUNDS];
    int nu[2] = {0, 0};
    for (int r = 0; r < 2 * rounds + 4; r++) { /* the first 4 warm up */
        int w = (r & 1) ^ ((r >> 1) & 1);      /* A B B A */
        kvp_meta_watch(m, w ? noop : NULL, NULL);
        double t0 = now(), t;
        long n = 0;
        do {
            for (int j = 0; j < 16; j++, n++) {
                make_keys(buf, k, BATCH);
                if (kvp_meta_allocate(ns, 0, k, BATCH, pg, NULL, &e) ||
                    kvp_meta_confirm(ns, 0, k, pg, BATCH, NULL, 0, &e)) {
                    fprintf(stderr, "watch_cost: %s\n", e.msg);
                    return 1;
                }
            }
        } while ((t = now() - t0) < secs);
        if (r >= 4)
            us[w][nu[w]++] = t / (double)n * 1e6;
    }
    for (int w = 0; w < 2; w++)
        qsort(us[w], (size_t)nu[w], sizeof us[w][0], cmp);
    double a = us[0][nu[0] / 2], b = us[1][nu[1] / 2];
    printf("RESULT pages=%llu allocate+confirm of %d keys: no watcher %.2f us, watcher %.2f us, "
           "off/on %.3f (%lu changes told)\n",
           (unsigned long long)pages, BATCH, a, b, a / b, calls);
    kvp_meta_close(m);
    return 0;
}
