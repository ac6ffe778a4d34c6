/*
 * Issue 12, deliverable 6: the pause a snapshot causes the other threads of
 * the process that holds the metadata, per snapshot mode (kvpage/meta.h).
 *
 *   pause DIR [options]
 *     --keys N          keys loaded (64 hex characters, one rank; 1000000)
 *     --other-gib G     other resident memory, allocated and touched (4)
 *     --huge            that memory in transparent huge pages (default 4 KiB pages)
 *     --modes LIST      thread,manual,fork (all three, in that order)
 *     --reps R          snapshots per mode (3)
 *     --meta-threads T  threads calling kvp_meta_exists / kvp_meta_lookup (2)
 *     --on-ms A --period-ms B
 *                       each application thread runs in a tight loop for A ms
 *                       of every B ms (1 of 3); --period-ms 0: all the time
 *
 * The store is opened in DIR with fsync batch and no automatic snapshots;
 * the first mode loads the keys, each later mode reopens (recovers) them.
 * Application threads: T metadata threads, alternately kvp_meta_exists and
 * kvp_meta_lookup (which touches the LRU) of one key drawn from 4096 random
 * loaded keys per call, and one thread that writes one byte into each 4 KiB
 * page of the other memory in turn (a "toucher"), 64 pages an iteration.
 * Each records per window (before the first snapshot; during each
 * snapshot; the 1.5 s after it) the latency of each iteration (histogram),
 * the longest gap between one iteration's end and the next one's start (or
 * from a wake-up that was due), and the toucher its pages written per second
 * of writing and its page faults; a sampler thread the lowest MemAvailable.
 * The main thread calls kvp_meta_snapshot R times per mode, with a few new
 * keys before each (so that there is something to snapshot) and 1.5 s of
 * rest after, and prints what the library logged about each.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kvpage/meta.h"
#include "keys.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000u), (long)(t % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static long status_kb_of(const char *file, const char *field)
{
    FILE *f = fopen(file, "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static long status_kb(const char *field)
{
    return status_kb_of("/proc/self/status", field);
}

/* ---------------------------------------------------------------- figures per window */

/* Log-linear buckets: 8 per power of two (12% wide) from 16 ns on. */
#define NBUCKETS (16 + 8 * 40)
static int bucket_of(uint64_t v)
{
    if (v < 16)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int b = 16 + (e - 4) * 8 + (int)((v >> (e - 3)) & 7);
    return b < NBUCKETS ? b : NBUCKETS - 1;
}
static uint64_t bucket_top(int b)
{
    if (b < 16)
        return (uint64_t)b;
    int e = (b - 16) / 8 + 4, s = (b - 16) % 8;
    return ((uint64_t)(8 + s + 1) << (e - 3)) - 1;
}

struct fig {
    uint64_t n, max_lat, max_gap;
    uint64_t hist[NBUCKETS];
    uint64_t pages, busy_ns, faults; /* the toucher: pages written, time writing them, faults */
};

static void fig_add(struct fig *f, const struct fig *g)
{
    f->n += g->n;
    f->max_lat = f->max_lat > g->max_lat ? f->max_lat : g->max_lat;
    f->max_gap = f->max_gap > g->max_gap ? f->max_gap : g->max_gap;
    for (int i = 0; i < NBUCKETS; i++)
        f->hist[i] += g->hist[i];
    f->pages += g->pages;
    f->busy_ns += g->busy_ns;
    f->faults += g->faults;
}

static double pct_us(const struct fig *f, double q)
{
    uint64_t want = (uint64_t)(q * (double)f->n), c = 0;
    for (int i = 0; i < NBUCKETS; i++)
        if ((c += f->hist[i]) > want)
            return (double)bucket_top(i) / 1e3;
    return (double)f->max_lat / 1e3;
}

/* Windows: 0 before the first snapshot, 1 + 2k during snapshot k, 2 + 2k after it. */
#define MAX_REPS 16
#define NWIN (1 + 2 * MAX_REPS)
#define MAX_THREADS 8

static atomic_int window;
static atomic_int stop;
static uint64_t on_ns, period_ns;
static uint64_t t_start; /* the application threads' first wake-ups are spread from here */
static int napps;

/* The lowest MemAvailable seen in each window: a fork's copied pages are
 * the child's or the parent's, so the machine's memory shows them where the
 * parent's VmRSS does not. */
static long min_avail[64];
static void *mem_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        long a = status_kb_of("/proc/meminfo", "MemAvailable");
        int w = atomic_load(&window);
        if (min_avail[w] == 0 || a < min_avail[w])
            min_avail[w] = a;
        usleep(20000);
    }
    return NULL;
}

struct app {
    pthread_t t;
    int id, toucher;
    struct kvp_ns *ns;
    char (*keys)[64];
    char *mem;
    size_t mem_len;
    size_t pos; /* the toucher's next page (kept across modes) */
    struct fig fig[NWIN];
};

static void record(struct fig *f, uint64_t lat, uint64_t gap)
{
    f->n++;
    f->hist[bucket_of(lat)]++;
    if (lat > f->max_lat)
        f->max_lat = lat;
    if (gap > f->max_gap)
        f->max_gap = gap;
}

static uint64_t thread_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (uint64_t)ru.ru_minflt + (uint64_t)ru.ru_majflt;
}

static void *app_main(void *arg)
{
    struct app *a = arg;
    uint64_t rng = 0x1234567 + (uint64_t)a->id * 0x9E3779B97F4A7C15ull;
    /* Each thread's bursts start at its own phase of the period: in phase,
     * three threads on two cores would take turns waiting for each other. */
    uint64_t wake = t_start + (period_ns ? period_ns * (uint64_t)a->id / (uint64_t)napps : 0),
             prev = 0;
    sleep_until(wake);
    uint64_t faults0 = thread_faults();
    while (!atomic_load(&stop)) {
        uint64_t end = period_ns ? wake + on_ns : UINT64_MAX;
        uint64_t burst0 = now_ns();
        /* A gap runs from the end of one iteration to the start of the
         * next; the first of a burst counts from the wake-up that was due,
         * so that a thread not let run when it should shows. */
        prev = period_ns ? wake : burst0;
        int w = atomic_load(&window), iters = 0;
        for (uint64_t t = burst0; t < end && !atomic_load(&stop);) {
            w = atomic_load(&window);
            uint64_t t0 = now_ns();
            if (a->toucher) {
                for (int i = 0; i < 64; i++) { /* 256 KiB a sample */
                    a->mem[a->pos] += 1;
                    a->pos = (a->pos + 4096) % a->mem_len;
                }
            } else {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                struct kvp_str k = {a->keys[rng % 4096], 64};
                if ((rng >> 32) & 1) {
                    uint8_t ex;
                    kvp_meta_exists(a->ns, 0, &k, 1, &ex, NULL);
                } else {
                    int64_t p;
                    kvp_meta_lookup(a->ns, 0, 0, &k, 1, &p, NULL);
                }
            }
            t = now_ns();
            record(&a->fig[w], t - t0, t0 > prev ? t0 - prev : 0);
            prev = t;
            if (a->toucher) { /* its rate: pages per second spent writing them */
                a->fig[w].pages += 64;
                a->fig[w].busy_ns += t - t0;
                if (++iters % 256 == 0) { /* and its faults, now and then */
                    uint64_t f = thread_faults();
                    a->fig[w].faults += f - faults0;
                    faults0 = f;
                }
            }
        }
        if (a->toucher) {
            uint64_t f = thread_faults();
            a->fig[w].faults += f - faults0;
            faults0 = f;
        }
        if (period_ns) {
            wake += period_ns;
            uint64_t n = now_ns();
            if (wake < n)
                wake = n; /* late: no catching up */
            sleep_until(wake);
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- the library's words */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_log[1024];
static void on_log(void *arg, int level, const char *msg)
{
    (void)arg;
    pthread_mutex_lock(&log_mu);
    if (level <= 1)
        fprintf(stderr, "library: %s\n", msg);
    if (strstr(msg, "snapshot at log position"))
        snprintf(last_log, sizeof last_log, "%s", msg);
    pthread_mutex_unlock(&log_mu);
}

static int open_mode(const char *dir, int mode, struct kvp_meta **m)
{
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.fsync = KVP_FSYNC_BATCH;
    o.snapshot_bytes = UINT64_MAX; /* only the ones asked for */
    o.snapshot_mode = mode;
    o.log = on_log;
    return kvp_meta_open(&o, m);
}

static void put_keys(struct kvp_ns *ns, uint64_t from, uint64_t n)
{
    enum { B = 1024 };
    static char kb[B][64];
    struct kvp_str keys[B];
    int64_t pages[B];
    for (uint64_t i = from; i < from + n; i += B) {
        size_t c = from + n - i < B ? (size_t)(from + n - i) : B;
        for (size_t j = 0; j < c; j++) {
            key_of(i + j, kb[j]);
            keys[j] = (struct kvp_str){kb[j], 64};
        }
        if (kvp_meta_allocate(ns, 0, keys, c, pages, NULL, NULL) != 0 ||
            kvp_meta_confirm(ns, 0, keys, pages, c, NULL, 0, NULL) != 0) {
            fprintf(stderr, "load failed at key %" PRIu64 "\n", i);
            exit(1);
        }
    }
}

static void print_fig(const char *what, const struct fig *f, const struct fig *base)
{
    if (base) { /* the toucher: its rate against the window before the snapshots */
        double rate = f->busy_ns ? (double)f->pages / ((double)f->busy_ns / 1e9) : 0;
        double brate = base->busy_ns ? (double)base->pages / ((double)base->busy_ns / 1e9) : 0;
        printf("    %-8s %6.2f M page writes/s of writing (%.3fx before), %" PRIu64
               " page faults; 64 pages: p50 %.1f us p99 %.1f us max %.2f ms; max gap %.2f ms\n",
               what, rate / 1e6, brate > 0 ? rate / brate : 0, f->faults, pct_us(f, 0.5),
               pct_us(f, 0.99), f->max_lat / 1e6, f->max_gap / 1e6);
        return;
    }
    printf("    %-8s %9" PRIu64 " calls, p50 %.2f us p99 %.2f us p99.9 %.2f us max %.2f ms, "
           "max gap %.2f ms\n",
           what, f->n, pct_us(f, 0.5), pct_us(f, 0.99), pct_us(f, 0.999), f->max_lat / 1e6,
           f->max_gap / 1e6);
}

static void print_window(const char *title, struct app *apps, int w, int base_w)
{
    printf("  %s\n", title);
    if (w != base_w)
        printf("    memory   MemAvailable at its lowest %ld MiB below its lowest before\n",
               (min_avail[base_w] - min_avail[w]) / 1024);
    struct fig meta = {0};
    for (int i = 0; i < napps; i++)
        if (!apps[i].toucher)
            fig_add(&meta, &apps[i].fig[w]);
    print_fig("metadata", &meta, NULL);
    for (int i = 0; i < napps; i++)
        if (apps[i].toucher)
            print_fig("toucher", &apps[i].fig[w], &apps[i].fig[base_w]);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: pause DIR [--keys N] [--other-gib G] [--huge] [--modes LIST] "
                        "[--reps R] [--meta-threads T] [--on-ms A] [--period-ms B]\n");
        return 2;
    }
    const char *dir = argv[1];
    uint64_t nkeys = 1000000, gib = 4;
    int reps = 3, nmeta = 2, huge = 0;
    double on_ms = 1, period_ms = 3;
    const char *modes = "thread,manual,fork"; /* fork last: its write-protected pages outlive it */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--huge")) {
            huge = 1;
            continue;
        }
        i++;
        if (!strcmp(a, "--keys"))
            nkeys = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--other-gib"))
            gib = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--modes"))
            modes = v;
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--meta-threads"))
            nmeta = atoi(v);
        else if (!strcmp(a, "--on-ms"))
            on_ms = atof(v);
        else if (!strcmp(a, "--period-ms"))
            period_ms = atof(v);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS || nmeta < 0 || nmeta + 1 > MAX_THREADS) {
        fprintf(stderr, "--reps 1..%d, --meta-threads 0..%d\n", MAX_REPS, MAX_THREADS - 1);
        return 2;
    }
    on_ns = (uint64_t)(on_ms * 1e6);
    period_ns = (uint64_t)(period_ms * 1e6);
    printf("keys %" PRIu64 ", other memory %" PRIu64 " GiB (%s pages), %d metadata threads + %d "
           "toucher, %d snapshots per mode\n",
           nkeys, gib, huge ? "huge" : "4 KiB", nmeta, gib ? 1 : 0, reps);
    if (period_ns)
        printf("application threads run %.1f ms of every %.1f ms\n", on_ms, period_ms);
    else
        printf("application threads run all the time\n");

    /* The other memory: allocated and touched, as an engine's would be. */
    size_t mem_len = (size_t)gib << 30;
    uint64_t t0 = now_ns();
    char *mem =
        mem_len ? mmap(NULL, mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                : NULL; /* none: no toucher either */
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (mem)
        (void)madvise(mem, mem_len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t i = 0; i < mem_len; i += 4096)
        mem[i] = 1;
    printf("other memory touched in %.1f s; VmRSS %ld MiB\n", (now_ns() - t0) / 1e9,
           status_kb("VmRSS") / 1024);

    static char sample[4096][64];
    struct app apps[MAX_THREADS];
    memset(apps, 0, sizeof apps);
    napps = nmeta + (mem != NULL);
    for (int i = 0; i < napps; i++) {
        apps[i].id = i;
        apps[i].toucher = i == nmeta;
        apps[i].keys = sample;
        apps[i].mem = mem;
        apps[i].mem_len = mem_len;
    }
    uint64_t extra = 0; /* keys added before each snapshot */
    int first = 1;
    char list[64];
    snprintf(list, sizeof list, "%s", modes);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        int mode = !strcmp(name, "fork")     ? KVP_SNAPSHOT_FORK
                   : !strcmp(name, "thread") ? KVP_SNAPSHOT_THREAD
                   : !strcmp(name, "manual") ? KVP_SNAPSHOT_MANUAL
                                             : 0;
        if (!mode) {
            fprintf(stderr, "unknown mode %s\n", name);
            return 2;
        }
        struct kvp_meta *m;
        t0 = now_ns();
        if (open_mode(dir, mode, &m) != 0) {
            fprintf(stderr, "cannot open %s\n", dir);
            return 1;
        }
        struct kvp_ns *ns;
        kvp_meta_ns(m, "default", 7, "kv", 2, 1, &ns, NULL);
        printf("\n== mode %s\n", name);
        if (first) {
            kvp_meta_init_rank(ns, 0, nkeys + 65536, NULL);
            put_keys(ns, 0, nkeys);
            printf("loaded %" PRIu64 " keys in %.2f s; VmRSS %ld MiB\n", nkeys,
                   (now_ns() - t0) / 1e9, status_kb("VmRSS") / 1024);
            first = 0;
        } else {
            printf("reopened (recovered) in %.2f s; VmRSS %ld MiB\n", (now_ns() - t0) / 1e9,
                   status_kb("VmRSS") / 1024);
        }
        uint64_t rng = 42;
        for (int i = 0; i < 4096; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            key_of(rng % nkeys, sample[i]);
        }
        /* Every page of the other memory written once, so that the window
         * before the first snapshot starts without faults (a fork's
         * write-protected pages outlive it). */
        t0 = now_ns();
        for (size_t i = 0; i < mem_len; i += 4096)
            mem[i] += 1;
        printf("other memory written once in %.2f s\n", (now_ns() - t0) / 1e9);
        atomic_store(&window, 0);
        atomic_store(&stop, 0);
        memset(min_avail, 0, sizeof min_avail);
        pthread_t mem_t;
        pthread_create(&mem_t, NULL, mem_main, NULL);
        t_start = now_ns() + 1000000;
        for (int i = 0; i < napps; i++) {
            apps[i].ns = ns;
            memset(apps[i].fig, 0, sizeof apps[i].fig);
            pthread_create(&apps[i].t, NULL, app_main, &apps[i]);
        }
        usleep(2000000);
        double snap_ms[MAX_REPS];
        char logs[MAX_REPS][1024];
        long rss_after[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            put_keys(ns, nkeys + extra, 64); /* something new to snapshot */
            extra += 64;
            last_log[0] = 0;
            atomic_store(&window, 1 + 2 * r);
            uint64_t s0 = now_ns();
            int rc = kvp_meta_snapshot(m);
            uint64_t s1 = now_ns();
            atomic_store(&window, 2 + 2 * r);
            snap_ms[r] = (s1 - s0) / 1e6;
            rss_after[r] = status_kb("VmRSS") / 1024;
            pthread_mutex_lock(&log_mu);
            snprintf(logs[r], sizeof logs[r], "%s", rc ? "FAILED" : last_log);
            pthread_mutex_unlock(&log_mu);
            usleep(1500000);
        }
        atomic_store(&stop, 1);
        for (int i = 0; i < napps; i++)
            pthread_join(apps[i].t, NULL);
        pthread_join(mem_t, NULL);
        print_window("before the first snapshot (2 s)", apps, 0, 0);
        for (int r = 0; r < reps; r++) {
            char title[1400];
            snprintf(title, sizeof title,
                     "snapshot %d: kvp_meta_snapshot took %.0f ms end to end; VmRSS after %ld MiB"
                     "\n  library: %s",
                     r + 1, snap_ms[r], rss_after[r], logs[r]);
            print_window(title, apps, 1 + 2 * r, 0);
            print_window("the 1.5 s after it", apps, 2 + 2 * r, 0);
        }
        struct fig all_meta = {0}, all_touch = {0};
        double snap_max = 0;
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < napps; i++)
                fig_add(apps[i].toucher ? &all_touch : &all_meta, &apps[i].fig[1 + 2 * r]);
            snap_max = snap_ms[r] > snap_max ? snap_ms[r] : snap_max;
        }
        printf("  summary %s: during the %d snapshots (longest %.0f ms): metadata calls max %.2f "
               "ms, p99.9 %.2f us, max gap %.2f ms; toucher max gap %.2f ms, %" PRIu64
               " page faults; VmHWM %ld MiB\n",
               name, reps, snap_max, all_meta.max_lat / 1e6, pct_us(&all_meta, 0.999),
               all_meta.max_gap / 1e6, all_touch.max_gap / 1e6, all_touch.faults,
               status_kb("VmHWM") / 1024);
        t0 = now_ns();
        kvp_meta_close(m);
        printf("  closed (final snapshot) in %.2f s\n", (now_ns() - t0) / 1e9);
        fflush(stdout);
    }
    return 0;
}
