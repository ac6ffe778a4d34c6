/*
 * Fuzz target: log and snapshot decoding. The input is used as the single
 * log segment of a data directory, which is then recovered read-only into a
 * fresh metadata store. Recovery must never crash, and whatever it accepts
 * must satisfy every invariant.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpage/meta.h"

static char dir[64], seg[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvp-fuzz-wal-XXXXXX");
        if (!mkdtemp(dir))
            abort();
        snprintf(seg, sizeof seg, "%s/wal-0000000000000000.log", dir);
    }
    int fd = open(seg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);
    struct kvp_meta_opts o;
    kvp_meta_opts_init(&o);
    o.data_dir = dir;
    o.readonly = 1;
    struct kvp_meta *m = NULL;
    if (kvp_meta_open(&o, &m) == 0) {
        struct kvp_error e = {0};
        if (kvp_meta_check(m, &e) != 0) {
            fprintf(stderr, "invariant broken after recovery: %s\n", e.msg);
            abort();
        }
        kvp_meta_close(m);
    }
    return 0;
}
