/* kvpage backends: the page-I/O and metadata backends this kvpage has, as
 * the library lists them (kvp_pagefile_backend_name, kvp_meta_backend_info):
 * for people, and with --names for scripts and bash completion. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvpage/meta.h"
#include "kvpage/pagefile.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage backends [--names io|meta|remote]\n"
               "Lists the backends of this kvpage: the page-I/O backends (kvpage bench io\n"
               "--backend, kvp_pagefile_opts.backend) and the metadata backends by the scheme\n"
               "of their locations (--meta, kvp_meta_open_at).\n"
               "\n"
               "  --names io|meta|remote\n"
               "                    only the names, one a line: the page-I/O backends', the\n"
               "                    metadata locations' schemes as typed (mem:, redis://), or\n"
               "                    those of the remote ones (what kvpage serve --meta takes)\n"
               "examples:\n"
               "  kvpage backends\n"
               "  kvpage backends --names meta\n");
}

/* The scheme of info as a location starts: "redis://" when its form has
 * the slashes, else "mem:". */
static void typed(const struct kvp_meta_info *i, char *out, size_t len)
{
    size_t n = strlen(i->scheme);
    int slashes = !strncmp(i->description, i->scheme, n) && !strncmp(i->description + n, "://", 3);
    snprintf(out, len, "%s:%s", i->scheme, slashes ? "//" : "");
}

static void list_io(int names)
{
    if (!names)
        printf("page-I/O backends (--backend):\n");
    for (int b = 0; strcmp(kvp_pagefile_backend_name(b), "?"); b++) {
        const char *name = kvp_pagefile_backend_name(b);
        if (names)
            printf("%s\n", name);
        else
            printf("  %-10s %s\n", name, kvp_pagefile_backend_description(b));
    }
}

static void list_meta(int names, int remote_only)
{
    struct kvp_meta_info i = {.info_size = sizeof i};
    char scheme[64];
    if (!names)
        printf("metadata backends (--meta LOCATION):\n");
    for (size_t n = 0; kvp_meta_backend_info(n, &i) == 0; n++) {
        typed(&i, scheme, sizeof scheme);
        if (names && (i.remote || !remote_only))
            printf("%s\n", scheme);
        else if (!names)
            printf("  %-10s (%s%s)\n      %s\n", scheme, i.name, i.remote ? ", remote" : "",
                   i.description);
        i.info_size = sizeof i;
    }
}

int kvp__cli_backends(int argc, char **argv)
{
    const char *names = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return KVP_EXIT_OK;
        }
        if (!strcmp(argv[a], "--names") && a + 1 < argc)
            names = argv[++a];
        else if (!strncmp(argv[a], "--names=", 8))
            names = argv[a] + 8;
        else {
            fprintf(stderr, "kvpage backends: unknown argument '%s'\n", argv[a]);
            usage(stderr);
            return KVP_EXIT_USAGE;
        }
    }
    if (names && strcmp(names, "io") && strcmp(names, "meta") && strcmp(names, "remote")) {
        fprintf(stderr, "kvpage backends: --names takes io, meta or remote, not '%s'\n", names);
        return KVP_EXIT_USAGE;
    }
    if (!names || !strcmp(names, "io"))
        list_io(names != NULL);
    if (!names)
        printf("\n");
    if (!names || strcmp(names, "io"))
        list_meta(names != NULL, names && !strcmp(names, "remote"));
    return KVP_EXIT_OK;
}
