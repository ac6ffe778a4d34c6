/*
 * bench/meta/nodisk.c — a control for the `--fsync batch` row, never for use
 * in production: preloaded into `kvpage serve`, it makes fsync and fdatasync
 * return at once, so the group-commit path (append, hand-off to the flusher,
 * parked reply, resume) runs in full but the disk costs nothing. The gap
 * between this row and in-memory is the software path; the gap between it
 * and the real `batch` row is the disk.
 */
int fsync(int fd);
int fdatasync(int fd);

int fsync(int fd)
{
    (void)fd;
    return 0;
}

int fdatasync(int fd)
{
    (void)fd;
    return 0;
}
