/*
 * kvpage serve and systemd.
 *
 * systemd's readiness protocol (sd_notify(3), Type=notify): one datagram to
 * the socket named by $NOTIFY_SOCKET, a path or '@' for an abstract name.
 * Without the variable (not run by systemd) it does nothing.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "server/log.h"
#include "server/serve_internal.h"

void kvp__notify_systemd(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = path ? strlen(path) : 0;
    if (len < 2 || len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
        return;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
        KVP_LOGW("cannot notify systemd at %s: %s", path, strerror(errno));
    close(fd);
}
