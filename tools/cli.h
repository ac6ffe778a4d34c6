/* The kvpage command line's parts (tools/): each subcommand is a function
 * taking its own argv (argv[0] is the subcommand) and returning the exit
 * status. */
#ifndef KVP_TOOLS_CLI_H
#define KVP_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "kvpage/store.h"

/* Exit statuses of the store's commands. */
#define KVP_EXIT_OK 0
#define KVP_EXIT_MISSING 1 /* a key is not there */
#define KVP_EXIT_USAGE 2   /* a bad flag, value, file or input: nothing changed */
#define KVP_EXIT_FAILED 3  /* the store failed (I/O, the metadata server, ...) */

/* kvpage put | get | exists | delete */
int kvp__cli_store(int argc, char **argv);
/* kvpage clear (tools/clear_cli.c) */
int kvp__cli_clear(int argc, char **argv);
/* kvpage bench store */
int kvp__cli_bench_store(int argc, char **argv);
/* kvpage bench io */
int kvp__cli_bench_io(int argc, char **argv);
/* kvpage bench meta */
int kvp__cli_bench_meta(int argc, char **argv);
/* kvpage bench trace */
int kvp__cli_bench_trace(int argc, char **argv);
/* kvpage backends (tools/backends_cli.c) */
int kvp__cli_backends(int argc, char **argv);

/*
 * What a benchmark created, removed if SIGINT, SIGTERM or SIGHUP ends the
 * command (tools/cleanup.c): register a file (or a flat directory: files
 * only, such as a data directory) before creating it, and only when it does
 * not exist yet. kvp__cleanup_done forgets them all (the command removes or
 * keeps them itself from then on). At most 8 paths.
 */
void kvp__cleanup_file(const char *path);
void kvp__cleanup_dir(const char *path);
void kvp__cleanup_done(void);
/* Removes the files of a flat directory, then the directory
 * (async-signal-safe). */
void kvp__remove_flat_dir(const char *dir);

/* The flags every store command takes (tools/store_cli.c). */
struct kvp__store_flags {
    const char *file, *meta, *deployment, *pool;
    uint64_t file_size, page_size;
    uint32_t rank, timeout_ms;
    int no_durable; /* --no-durable: puts do not fdatasync before they confirm */
    int mkdir;      /* --mkdir: create the missing directories of a new --file */
    int json;       /* bench: --json */
    int no_tags;    /* --no-tags: no integrity tags (kvp_store_opts.no_tags) */
    int writable;   /* not a flag: open get's store writable (to drop a rejected key) */
};

/*
 * Parses argv[1..argc) of command cmd: the store flags (--flag VALUE or
 * --flag=VALUE, anywhere; "--" ends them) into f and the rest into pos
 * (*npos of them, in order). extra(name, value, arg) is asked first about
 * each flag (NULL: none); it returns 1 (taken, value used), 2 (taken, a
 * switch without value), 0 (not its flag) or -1 (bad value, it has printed
 * why). Returns 0, or KVP_EXIT_USAGE after printing why on stderr.
 */
int kvp__store_flags_parse(const char *cmd, int argc, char **argv, struct kvp__store_flags *f,
                           char **pos, int *npos,
                           int (*extra)(const char *name, const char *value, void *arg), void *arg);

/* Opens the store the flags name; prints why on failure and returns the
 * exit status (KVP_EXIT_USAGE for what the user can fix in the flags). */
int kvp__store_flags_open(const char *cmd, const struct kvp__store_flags *f, uint32_t entries,
                          int create, struct kvp_store **out);

/*
 * A latency histogram for the benchmarks: buckets of 1/32 of a power of two
 * of nanoseconds (about 2 % wide), so that every thread can record each
 * operation in constant memory however many there are, and the threads'
 * histograms add up. Percentiles are a bucket's upper edge; max is exact.
 */
#define KVP__LAT_BUCKETS (64 * 32)
struct kvp__lat {
    uint64_t n[KVP__LAT_BUCKETS];
    uint64_t count, max_ns;
};

static inline void kvp__lat_add(struct kvp__lat *l, uint64_t ns)
{
    unsigned b = 0;
    if (ns >= 2) {
        unsigned e = 63u - (unsigned)__builtin_clzll(ns); /* 2^e <= ns */
        /* the 5 bits below the top one are the step within the power */
        unsigned frac = e >= 5 ? (unsigned)(ns >> (e - 5)) & 31u : (unsigned)(ns << (5 - e)) & 31u;
        b = e * 32u + frac;
    }
    l->n[b < KVP__LAT_BUCKETS ? b : KVP__LAT_BUCKETS - 1]++;
    l->count++;
    if (ns > l->max_ns)
        l->max_ns = ns;
}

static inline void kvp__lat_merge(struct kvp__lat *into, const struct kvp__lat *l)
{
    for (unsigned i = 0; i < KVP__LAT_BUCKETS; i++)
        into->n[i] += l->n[i];
    into->count += l->count;
    if (l->max_ns > into->max_ns)
        into->max_ns = l->max_ns;
}

/* The q-quantile (0 < q <= 1) in nanoseconds: the upper edge of its bucket,
 * never above the maximum seen. 0 when nothing was recorded. */
static inline double kvp__lat_quantile(const struct kvp__lat *l, double q)
{
    if (!l->count)
        return 0;
    uint64_t want = (uint64_t)(q * (double)l->count + 0.999999), seen = 0;
    if (want < 1)
        want = 1;
    for (unsigned i = 0; i < KVP__LAT_BUCKETS; i++) {
        seen += l->n[i];
        if (seen >= want) {
            unsigned e = i / 32, frac = i % 32;
            double edge = (double)(1ull << e) * (1.0 + (frac + 1) / 32.0);
            return edge < (double)l->max_ns ? edge : (double)l->max_ns;
        }
    }
    return (double)l->max_ns;
}

/* The progress bar of the benchmarks on a terminal: done of total (0..1), a
 * label and a figure. Ends the line when done reaches 1. */
static inline void kvp__progress_bar(double done, const char *label)
{
    int width = 30, fill = (int)(done * width + 0.5);
    if (fill > width)
        fill = width;
    if (fill < 0)
        fill = 0;
    fprintf(stderr, "\r[%.*s%*s] %3d%%  %-60.60s", fill, "##############################",
            width - fill, "", (int)(done * 100 + 0.5), label);
    if (done >= 1)
        fputc('\n', stderr);
    fflush(stderr);
}

#endif
