/*
 * What a benchmark created, removed when SIGINT, SIGTERM or SIGHUP ends it
 * (tools/cli.h): a page file of 512 MiB or 4 GiB left behind by a Ctrl-C
 * fills the disk it was measuring. The handler only makes async-signal-safe
 * calls (unlink, open, getdents64, unlinkat, rmdir), then dies of the signal
 * as it would have without one, so the shell sees the same status.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli.h"

#define MAX_PATHS 8

static char paths[MAX_PATHS][PATH_MAX];
static int is_dir[MAX_PATHS];
static atomic_int npaths;

void kvp__remove_flat_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096];
    for (;;) {
        long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long off = 0; off < n;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(fd, e->d_name, 0);
            off += e->d_reclen;
        }
    }
    close(fd);
    rmdir(dir);
}

static void on_signal(int sig)
{
    int n = atomic_exchange(&npaths, 0);
    for (int i = n - 1; i >= 0; i--) /* the newest first: a directory after its files */
        is_dir[i] ? kvp__remove_flat_dir(paths[i]) : (void)unlink(paths[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void remember(const char *path, int dir)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    int i = atomic_load(&npaths);
    if (i >= MAX_PATHS || strlen(path) >= PATH_MAX)
        return;
    strcpy(paths[i], path);
    is_dir[i] = dir;
    atomic_store(&npaths, i + 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t s = 0; s < sizeof sigs / sizeof *sigs; s++)
        sigaddset(&sa.sa_mask, sigs[s]);
    for (size_t s = 0; s < sizeof sigs / sizeof *sigs; s++)
        sigaction(sigs[s], &sa, NULL);
}

void kvp__cleanup_file(const char *path)
{
    remember(path, 0);
}

void kvp__cleanup_dir(const char *path)
{
    remember(path, 1);
}

void kvp__cleanup_done(void)
{
    atomic_store(&npaths, 0);
}
