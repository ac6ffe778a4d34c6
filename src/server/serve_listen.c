/*
 * kvpage serve's listening address (--listen): parsing it, the socket, and
 * the banner that says where clients find the server.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/log.h"
#include "server/serve_internal.h"
#include "util/size.h"

int kvp__listen_parse(const char *s, struct listen_addr *la)
{
    char host[256];
    const char *port;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host)
            return -1;
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = 0;
        port = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof host || strchr(s, ':') != colon)
            return -1;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
        port = colon + 1;
    }
    uint64_t p;
    if (!host[0] || kvp__parse_size(port, 0, &p) || p > 65535)
        return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) || !res)
        return -1;
    memcpy(&la->ss, res->ai_addr, res->ai_addrlen);
    la->len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void addr_text(const struct listen_addr *la, char *host, size_t hostlen, unsigned *port)
{
    char tmp[INET6_ADDRSTRLEN];
    if (la->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)&la->ss;
        inet_ntop(AF_INET6, &a->sin6_addr, tmp, sizeof tmp);
        snprintf(host, hostlen, "[%s]", tmp);
        *port = ntohs(a->sin6_port);
    } else {
        const struct sockaddr_in *a = (const void *)&la->ss;
        inet_ntop(AF_INET, &a->sin_addr, tmp, sizeof tmp);
        snprintf(host, hostlen, "%s", tmp);
        *port = ntohs(a->sin_port);
    }
}

int kvp__listen_open(const struct listen_addr *la, const char *text)
{
    int fd = socket(la->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "kvpage serve: socket: %s\n", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (la->ss.ss_family == AF_INET6) {
        /* "[::]" listens on IPv6 only unless told otherwise; keep the
         * system default (usually dual stack) rather than surprise. */
    }
    if (bind(fd, (const struct sockaddr *)&la->ss, la->len) != 0) {
        int e = errno;
        if (e == EADDRINUSE)
            fprintf(stderr,
                    "kvpage serve: cannot listen on %s: the address is already in use "
                    "(another kvpage serve or another program holds the port; choose another "
                    "with --listen)\n",
                    text);
        else
            fprintf(stderr, "kvpage serve: cannot listen on %s: %s\n", text, strerror(e));
        close(fd);
        return -1;
    }
    if (listen(fd, 1024) != 0) {
        fprintf(stderr, "kvpage serve: listen on %s: %s\n", text, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether stock vLLM's metadata client, which ignores its URL and always
 * asks http://localhost:18000, reaches a server listening on host:port
 * (research/vllm_hf3fs.md: hf3fs_metadata_server_url is read, never used). */
static int stock_vllm_reaches(const char *host, unsigned port)
{
    return port == 18000 && (!strncmp(host, "127.", 4) || !strcmp(host, "0.0.0.0") ||
                             !strcmp(host, "[::]") || !strcmp(host, "[::1]"));
}

/* The banner: the limits in the log, then where clients find the server
 * (stdout, or the log with --log-format json), then systemd's READY=1. */
void kvp__listen_banner(const struct serve_cfg *sc, const struct listen_addr *la, int fd,
                        uint64_t max_conns)
{
    char host[INET6_ADDRSTRLEN + 2];
    unsigned port;
    addr_text(la, host, sizeof host, &port);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0) /* the port of :0 */
        port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                 : ((struct sockaddr_in *)&bound)->sin_port);
    KVP_LOGI("lease %" PRIu64 " ms, read grace %" PRIu64 " ms, max body %" PRIu64
             " bytes, max keys %" PRIu64 ", %" PRIu64 " thread(s)%s%s",
             sc->lease_ms, sc->grace_ms, sc->max_body, sc->max_keys, sc->threads,
             sc->token ? ", bearer token required" : "",
             sc->nallow ? ", client addresses restricted by --allow" : "");
    KVP_LOGI("connections: at most %" PRIu64 ", %" PRIu64
             " per client address; idle timeout %" PRIu64 " s, request timeout %" PRIu64 " s",
             max_conns, sc->max_conns_client, sc->idle_timeout, sc->request_timeout);
    if (kvp__log_json())
        /* Every line a JSON object: the banner as a log line. */
        KVP_LOGI("listening on http://%s:%u (vLLM: hf3fs_metadata_server_url%s, SGLang: "
                 "metadata_server_url)",
                 host, port,
                 stock_vllm_reaches(host, port)
                     ? ""
                     : " of kvpage.vllm; stock vLLM talks to localhost:18000 only");
    else {
        printf("kvpage serve: listening on http://%s:%u\n", host, port);
        if (stock_vllm_reaches(host, port))
            printf("  vLLM:   \"hf3fs_metadata_server_url\": \"http://%s:%u\" in "
                   "kv_connector_extra_config\n",
                   host, port);
        else
            printf("  vLLM:   stock vLLM ignores hf3fs_metadata_server_url: it talks to "
                   "localhost:18000 only,\n"
                   "          never to this server. Use kvpage.vllm "
                   "(\"kv_connector_module_path\": \"kvpage.vllm\",\n"
                   "          \"kv_connector\": \"KvpageHF3FSConnector\") with "
                   "\"hf3fs_metadata_server_url\": \"http://%s:%u\"\n",
                   host, port);
        printf("  SGLang: \"metadata_server_url\": \"http://%s:%u\" in the JSON file named by "
               "SGLANG_HICACHE_HF3FS_CONFIG_PATH\n",
               host, port);
    }
    fflush(stdout);
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "[::]"))
        KVP_LOGI("listening on every interface: give clients this machine's address instead "
                 "of %s",
                 host);

    char status_text[160];
    snprintf(status_text, sizeof status_text, "READY=1\nSTATUS=listening on http://%s:%u", host,
             port);
    kvp__notify_systemd(status_text);
}
