/*
 * kvpage serve over libmicrohttpd: the callbacks that move bytes between
 * the sockets and kvp__server_handle (handle.c), the replies parked until
 * the log is durable, the acceptor, and stopping in order. Everything about
 * the protocol is behind kvp__server_handle.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server/log.h"
#include "server/serve_internal.h"
#include "util/clock.h"

/* Replies parked on the log's flusher; shutdown waits for them to drain. */
static atomic_long g_pending;
static atomic_int g_stopping;

/* The request line of a new request arrived: from now on, the request's
 * bytes must keep coming (--request-timeout), until its reply is sent. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)uri;
    struct serve *S = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *cn = ci ? ci->socket_context : NULL;
    if (cn) {
        cn->in_request = 1;
        cn->last_ms = kvp__mono_ms();
    }
    if (S->request_timeout != S->idle_timeout)
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, S->request_timeout);
    return NULL; /* *con_cls starts NULL: on_request sees its first call */
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct serve *S = cls;
    struct conn *cn = *con_cls;
    if (!cn)
        return;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && !cn->timed_out) {
        cn->timed_out = 1;
        atomic_fetch_add(&S->srv.conns.timeout_request, 1);
    }
    cn->in_request = 0;
    cn->last_ms = kvp__mono_ms();
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && S->request_timeout != S->idle_timeout)
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, S->idle_timeout);
}

/* ---------- libmicrohttpd callbacks ---------- */

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct serve *S = cls;
    struct kvp_conn_stats *cs = &S->srv.conns;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *cn = calloc(1, sizeof *cn);
        if (cn) {
            kvp__buf_init(&cn->in);
            kvp__reply_init(&cn->rep);
            cn->last_ms = kvp__mono_ms();
        }
        /* Counted by on_accept: cn->key says whose count to lower at the end. */
        struct client_key k;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (kvp__client_key_of(ci ? ci->client_addr : NULL, &k) == 0) {
            if (cn)
                cn->key = k;
            else
                kvp__client_drop(S, &k);
        }
        atomic_fetch_add(&cs->accepted, 1);
        *socket_context = cn;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *cn = *socket_context;
        atomic_fetch_sub(&cs->open, 1);
        if (cn) {
            /* MHD does not say why it closes; a connection that made no
             * progress for its whole timeout was closed for it. */
            unsigned t = cn->in_request ? S->request_timeout : S->idle_timeout;
            if (t && !cn->timed_out && !atomic_load(&g_stopping) &&
                kvp__mono_ms() - cn->last_ms + 100 >= (uint64_t)t * 1000)
                atomic_fetch_add(cn->in_request ? &cs->timeout_request : &cs->timeout_idle, 1);
            if (cn->key.len)
                kvp__client_drop(S, &cn->key);
            kvp__body_release(S, cn);
            kvp__buf_free(&cn->in);
            kvp__reply_free(&cn->rep);
            free(cn);
        }
        *socket_context = NULL;
    }
}

static enum MHD_Result queue_reply(struct MHD_Connection *mc, struct kvp_reply *rep)
{
    /* The reply buffer belongs to the connection and is not touched again
     * before MHD has sent this response (no pipelined request is handled
     * while a response is pending), so MHD need not copy it. */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(rep->body.len, rep->body.p, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    if (rep->content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, rep->content_type);
    if (rep->allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, rep->allow);
    if (rep->www_authenticate)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, rep->www_authenticate);
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)rep->status, r);
    MHD_destroy_response(r);
    return ret;
}

void kvp__http_resume(struct conn *cn, int rc)
{
    struct MHD_Connection *mc = cn->mc;
    cn->durable_rc = rc;
    atomic_store(&cn->durable, 1);
    MHD_resume_connection(mc);
    atomic_fetch_sub(&g_pending, 1);
}

/* Runs on the log's flusher thread once the parked reply's records are durable. */
static void on_durable(void *arg, int status)
{
    kvp__http_resume(arg, status);
}

/* Parks cn's reply: the connection is suspended until kvp__http_resume. */
static void park(struct conn *cn, struct MHD_Connection *mc)
{
    cn->mc = mc;
    cn->waiting = 1;
    atomic_store(&cn->durable, 0);
    MHD_suspend_connection(mc);
}

static enum MHD_Result durable_reply(struct serve *S, struct MHD_Connection *mc, struct conn *cn)
{
    cn->waiting = 0;
    if (cn->durable_rc) {
        /* Applied in memory, not durable: 507 / 503, not 500. The log said
         * once that writes are refused; no line per request. */
        char why[sizeof((struct kvp_error *)0)->msg];
        if (kvp_meta_health(S->meta, why, sizeof why) == 0)
            snprintf(why, sizeof why, "cannot make the change durable: %s",
                     kvp_strerror(cn->durable_rc));
        kvp__reply_log_error(&cn->rep, cn->durable_rc, why, 1);
    }
    return queue_reply(mc, &cn->rep);
}

/* Handles the request in cn->req on the calling thread; returns the ticket
 * of its changes (0: nothing to wait for before the reply). */
uint64_t kvp__http_handle(struct serve *S, struct conn *cn)
{
    struct kvp_reply *rep = &cn->rep;
    kvp__arena_begin();
    kvp__server_handle(&S->srv, &cn->req, rep);
    kvp__arena_end();
    uint64_t lsn = rep->ticket;
    if (cn->in.cap > KEEP_BUFFER_MAX)
        kvp__buf_free(&cn->in);
    kvp__body_release(S, cn);
    if (rep->status >= 500 && rep->status != 503 &&
        rep->status != 507) /* said once, not per request */
        KVP_LOGE("%s %.*s -> %d %.*s", cn->req.method, (int)cn->req.path_len, cn->req.path,
                 rep->status, (int)rep->body.len, rep->body.p ? rep->body.p : "");
    else
        KVP_LOGD("%s %.*s -> %d", cn->req.method, (int)cn->req.path_len, cn->req.path, rep->status);
    return lsn;
}

/* Announces a reply that will be given later (parked on the log or on the
 * body worker); 0 when shutdown has begun, and the caller must answer now.
 * Shutdown sets g_stopping before it reads g_pending: one of the two sees
 * the other. */
static int announce_pending(void)
{
    atomic_fetch_add(&g_pending, 1);
    if (!atomic_load(&g_stopping))
        return 1;
    atomic_fetch_sub(&g_pending, 1);
    return 0;
}

static enum MHD_Result respond(struct serve *S, struct MHD_Connection *mc, struct conn *cn,
                               const char *url, const char *method)
{
    cn->req = (struct kvp_request){
        .method = method,
        .path = url,
        .path_len = strlen(url),
        .body = cn->in.p,
        .body_len = cn->in.len,
        .authorization =
            MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .error_fields = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Kvpage-Errors") != NULL,
        .body_too_large = cn->too_large,
        .body_memory_full = cn->memory_full ? S->max_body_memory : 0,
    };
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    cn->req.client = ci ? ci->client_addr : NULL;
    if (S->srv.cfg.nallow && !cn->req.client)
        return MHD_NO; /* cannot check the address: refuse the connection */

    if (cn->req.body_len > WORKER_BODY_MIN && S->worker_running && announce_pending()) {
        /* Everything the request points at (url, headers, body) stays put
         * while the connection is suspended. */
        park(cn, mc);
        kvp__body_worker_push(S, cn);
        return MHD_YES;
    }

    uint64_t lsn = kvp__http_handle(S, cn);
    if (lsn && !S->group_commit) {
        /* always / never: this thread writes (and syncs) the records itself;
         * parking the reply would only add a suspend and a resume. */
        cn->durable_rc = kvp_meta_wait(S->meta, lsn, NULL);
        return durable_reply(S, mc, cn);
    }
    if (lsn) {
        if (!announce_pending()) {
            cn->durable_rc = kvp_meta_wait(S->meta, lsn, NULL);
            return durable_reply(S, mc, cn);
        }
        /* Suspend first, so that a callback running at once finds the
         * connection suspended; MHD calls us again after the resume. */
        park(cn, mc);
        int r = kvp_meta_when_durable(S->meta, lsn, on_durable, cn);
        if (r != 0)
            kvp__http_resume(cn, r < 0 ? r : 0);
        return MHD_YES;
    }
    return queue_reply(mc, &cn->rep);
}

/* Why this thread's callback closed a connection on purpose (MHD then logs
 * "Application reported internal error"), for mhd_log to say instead. */
static _Thread_local char t_close_why[384];

/* The handler decodes the path itself, one segment at a time, so that an
 * encoded '/' or NUL in a deployment name is a bad name (400), not another
 * path (docs/protocol-notes.md). */
static size_t keep_escapes(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    struct serve *S = cls;
    struct conn *cn = *con_cls;
    t_close_why[0] = '\0';
    if (cn && cn->waiting) {
        if (!atomic_load(&cn->durable))
            return MHD_YES; /* not ours to answer yet */
        return durable_reply(S, mc, cn);
    }
    if (!cn) {
        /* First call of a request: headers only. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cn = ci ? ci->socket_context : NULL;
        if (!cn)
            return MHD_NO;
        *con_cls = cn;
        if (kvp__body_start(S, mc, cn))
            return respond(S, mc, cn, url, method);
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return kvp__body_take(S, cn, upload_data, n, method, url, t_close_why, sizeof t_close_why);
    }
    return respond(S, mc, cn, url, method);
}

/* libmicrohttpd's messages, at most a few a second: every client that
 * hangs up mid-request makes one, and a client must not fill the log. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t window_ms, dropped;
    static unsigned in_window;
    uint64_t now = kvp__mono_ms(), was_dropped = 0;
    pthread_mutex_lock(&lock);
    if (now - window_ms >= 1000) {
        was_dropped = dropped;
        window_ms = now;
        in_window = dropped = 0;
    }
    int quiet = ++in_window > 10;
    dropped += quiet;
    pthread_mutex_unlock(&lock);
    if (was_dropped)
        KVP_LOGW("libmicrohttpd: %llu more messages in the last second were not logged",
                 (unsigned long long)was_dropped);
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    int ours = t_close_why[0] && strstr(line, "Application reported internal error");
    if (ours && !quiet)
        KVP_LOGW("%s", t_close_why);
    if (ours)
        t_close_why[0] = '\0';
    if (quiet || ours)
        return;
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = 0;
    KVP_LOGW("libmicrohttpd: %s", line);
}

/*
 * The acceptor. Each of MHD's worker threads accepts up to eleven
 * connections in a row when the listening socket wakes it, so the sixteen
 * connections an engine's client pool opens at once can land on two of eight
 * workers; with a backend whose calls wait for a reply (redis://, http://),
 * such a worker serves its connections one round trip at a time while the
 * others idle (measured: 22,000 against 32,000 batch_exists a second, by
 * where the connections fell). With --meta and more than one worker, this
 * thread accepts instead and gives each connection to MHD_add_connection, which
 * hands it to worker (descriptor mod pool size): new connections go round
 * the workers in turn. The access policy (on_accept) applies as before.
 */
static void *acceptor_main(void *arg)
{
    struct serve *S = arg;
    pthread_setname_np(pthread_self(), "kvp-accept");
    struct pollfd p[2] = {{.fd = S->listen_fd, .events = POLLIN},
                          {.fd = S->accept_stop, .events = POLLIN}};
    int warned = 0;
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            KVP_LOGE("the acceptor stops: poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents)
            break;
        if (p[0].revents & (POLLERR | POLLNVAL)) { /* the listening socket is gone */
            KVP_LOGE("the acceptor stops: the listening socket failed");
            break;
        }
        for (int k = 0; k < 64; k++) {
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            int s =
                accept4(S->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (s < 0) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    /* Out of descriptors: the connection waits in the
                     * backlog; try again shortly instead of spinning. */
                    if (!warned++)
                        KVP_LOGW("cannot accept a connection: %s (retrying)", strerror(errno));
                    usleep(10000);
                }
                break; /* EAGAIN: none left; ECONNABORTED and the like: poll again */
            }
            warned = 0;
            /* MHD closes the socket itself when it refuses it. */
            (void)MHD_add_connection(S->d, s, (struct sockaddr *)&ss, len);
        }
    }
    return NULL;
}

/* Starts the acceptor on fd (made non-blocking); 0, or -1 (said). */
static int acceptor_start(struct serve *S, int fd)
{
    S->listen_fd = fd;
    int fl = fcntl(fd, F_GETFL);
    S->accept_stop = eventfd(0, EFD_CLOEXEC);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || S->accept_stop < 0 ||
        pthread_create(&S->acceptor, NULL, acceptor_main, S) != 0) {
        fprintf(stderr, "kvpage serve: cannot start the acceptor thread: %s\n", strerror(errno));
        if (S->accept_stop >= 0)
            close(S->accept_stop);
        S->accept_stop = -1;
        return -1;
    }
    return 0;
}

static void acceptor_stop(struct serve *S)
{
    if (S->accept_stop < 0)
        return;
    uint64_t one = 1;
    if (write(S->accept_stop, &one, sizeof one) != (ssize_t)sizeof one)
        KVP_LOGW("cannot stop the acceptor: %s", strerror(errno));
    pthread_join(S->acceptor, NULL);
    close(S->accept_stop);
    S->accept_stop = -1;
}

/* ---------- stopping ---------- */

/* In order: the replies parked on the log are answered (their callbacks
 * point at connections that MHD frees when it stops), the acceptor stops,
 * then MHD (every connection closed). */
void kvp__http_stop(struct serve *S, int fd)
{
    atomic_store(&g_stopping, 1);
    for (int i = 0; i < 30000 && atomic_load(&g_pending) > 0; i++)
        usleep(1000);
    if (atomic_load(&g_pending) > 0)
        KVP_LOGW("%ld replies still wait for the log after 30 s", (long)atomic_load(&g_pending));
    acceptor_stop(S);
    MHD_stop_daemon(S->d);
    S->d = NULL;
    close(fd);
}

int kvp__http_start(struct serve *S, const struct serve_cfg *sc, const struct listen_addr *la,
                    int fd)
{
    uint64_t threads = sc->threads;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_TURBO | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    /* acceptor_main: where a call waits on the network (--meta) and
     * there are several workers. In process, a worker never waits, and
     * MHD's own accepting costs a new connection less. */
    int own_accept = threads > 1 && sc->meta_loc;
    if (own_accept)
        flags |= MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    if (la->ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* MHD's own limit stays out of reach: at it, MHD stops accepting
     * (every new client hangs) where the accept policy refuses at once. */
    uint64_t mhd_limit = S->max_conns + 64 + threads;
    const struct MHD_OptionItem common[] = {
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, S},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, S},
        {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, S},
        {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)keep_escapes, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)sc->idle_timeout, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)(mhd_limit > UINT_MAX ? UINT_MAX : mhd_limit),
         NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 16 * 1024, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_OptionItem ops[2 + sizeof common / sizeof common[0]];
    size_t no = 0;
    if (!own_accept) /* else the acceptor accepts on fd */
        ops[no++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, fd, NULL};
    if (threads > 1)
        ops[no++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)threads, NULL};
    memcpy(ops + no, common, sizeof common);
    if (kvp__body_worker_start(S) != 0)
        KVP_LOGW("cannot start the body worker thread: large bodies are handled in line");
    S->d = MHD_start_daemon(flags, 0, kvp__limits_on_accept, S, on_request, S,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_ARRAY, ops,
                            MHD_OPTION_END);
    if (!S->d) {
        fprintf(stderr, "kvpage serve: cannot start the HTTP server on %s\n", sc->listen_text);
        close(fd);
        return -1;
    }
    if (own_accept && acceptor_start(S, fd) != 0) {
        MHD_stop_daemon(S->d);
        S->d = NULL;
        close(fd);
        return -1;
    }
    return 0;
}
