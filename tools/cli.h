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
/* kvpage bench store */
int kvp__cli_bench_store(int argc, char **argv);

/* The flags every store command takes (tools/store_cli.c). */
struct kvp__store_flags {
    const char *file, *meta, *deployment, *pool;
    uint64_t file_size, page_size;
    uint32_t rank, timeout_ms;
    int no_durable; /* --no-durable: puts do not fdatasync before they confirm */
    int json;       /* bench: --json */
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

#endif
