/* kvpage — the command line: serve (and later inspect, fsck, bench). */
#include <stdio.h>
#include <string.h>
#include "server/serve.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage <command> [options]\n"
               "commands:\n"
               "  serve     run the metadata server (kvpage serve --help)\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "serve"))
        return kvp__serve_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvpage: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
