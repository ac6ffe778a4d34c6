/*
 * kvpage serve's parts, shared by the files that make it (not by the
 * protocol core, server.h, which knows no sockets):
 *   serve.c          start-up and shutdown in order (kvp__serve_main)
 *   serve_flags.c    the flags and --help
 *   serve_listen.c   the listening address, its socket and the banner
 *   serve_state.c    opening the state (meta), what its backend promises
 *   serve_http.c     the libmicrohttpd callbacks, parked replies, the acceptor
 *   serve_limits.c   connections: per client, in all, the open-file limit
 *   serve_body.c     request bodies: their memory, the refused ones dropped,
 *                    the large ones handled by the body worker
 *   serve_arena.c    the per-request arena of jansson's blocks
 *   serve_systemd.c  systemd's readiness notifications
 */
#ifndef KVP_SERVER_SERVE_INTERNAL_H
#define KVP_SERVER_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "server/kvevents.h"
#include "server/server.h"

/* A client address as the per-client connection limit counts it (an
 * IPv4-mapped IPv6 address counts as its IPv4 address). */
struct client_key {
    uint8_t addr[16];
    uint8_t len; /* 4 or 16; 0: not counted (no address) */
};

/* Per-connection state: the request body being received and the reply with
 * its scratch space, both reused by every request of the connection. */
struct conn {
    struct kvp_buf in;
    struct kvp_reply rep;
    int too_large;
    int memory_full; /* the body was dropped: over --max-body-memory */
    size_t held;     /* bytes of --max-body-memory this request's body holds */
    /* A refused body is read and dropped, up to discard_max bytes in all and
     * until drop_until_ms, so that the client reads the reply. */
    uint64_t body_seen;     /* bytes of this request's body received */
    uint64_t drop_until_ms; /* 0: no body being dropped */
    /* Group commit: a reply that changed state waits, with the connection
     * suspended, until the log is durable up to the request's records. */
    struct MHD_Connection *mc;
    atomic_int durable; /* 1 once the log callback ran for the pending reply */
    int durable_rc;     /* its status: 0, or -EIO (the change is not acknowledged) */
    int waiting;        /* a reply is parked until durable (or until the body worker is done) */
    /* Limits and timeouts. */
    struct client_key key; /* the client's address, counted in the per-client table */
    int in_request;        /* the request line came and its reply is not sent yet */
    int timed_out;         /* MHD reported the request's timeout (counted) */
    uint64_t last_ms;      /* last progress the callbacks saw */
    /* A large body is handled by the body worker, off the event loop. */
    struct kvp_request req;
    struct conn *job_next;
};

/* Buffers above this are released after a request instead of being kept. */
#define KEEP_BUFFER_MAX ((size_t)4 << 20)

/* Bodies larger than this are parsed and handled by the body worker, so that
 * the event loop goes on serving everyone else meanwhile (a 64 MiB body
 * takes the guard about 0.1 s, a valid 1,000,000-key request longer). */
#define WORKER_BODY_MIN ((size_t)1 << 20)

/*
 * A body that is refused (over --max-body or --max-body-memory) is still
 * read, and dropped, before the reply: a client such as Python's
 * http.client sends its whole body before it reads, and a reply sent (and
 * the connection closed) while it sends makes its kernel reset the
 * connection before it reads the reply. The reading is bounded as nginx's
 * lingering close is: at most DROP_SECONDS, and at most --max-body plus the
 * larger of --max-body and DROP_EXTRA_MIN in all (discard_max). Past
 * either, or for a Content-Length past the bytes, the server answers at once
 * and closes the connection, and the client may see a reset.
 */
#define DROP_SECONDS 10
#define DROP_EXTRA_MIN ((uint64_t)64 << 20)

/* The per-client connection counts: a chained hash table under one lock
 * (taken once per accept and once per close). */
#define CLIENT_BUCKETS 1024
struct client_count {
    struct client_key key;
    unsigned n;
    struct client_count *next;
};

struct serve {
    struct kvp_server srv;
    struct kvp_meta *meta;
    size_t max_body;
    uint64_t discard_max; /* the most bytes of a refused body read (see DROP_SECONDS) */
    int group_commit;     /* --fsync batch: replies wait for the flusher, parked */
    unsigned idle_timeout, request_timeout; /* seconds; 0: none */
    uint64_t max_conns, max_conns_per_client;
    size_t max_body_memory;
    atomic_size_t body_memory; /* held by the bodies over 1 MiB in flight */
    pthread_mutex_t clients_lock;
    struct client_count *clients[CLIENT_BUCKETS];
    /* The body worker's queue of suspended connections. */
    pthread_t worker;
    int worker_running, worker_stop;
    pthread_mutex_t jobs_lock;
    pthread_cond_t jobs_cond;
    struct conn *jobs_head, *jobs_tail;
    /* The daemon, and the acceptor (with more than one MHD thread, see
     * acceptor_main). */
    struct MHD_Daemon *d;
    int listen_fd, accept_stop; /* accept_stop: an eventfd, -1 without an acceptor */
    pthread_t acceptor;
};

/* What the flags ask for: parse fills it, run acts on it. */
struct serve_cfg {
    const char *listen_text, *token, *data_dir, *meta_loc;
    int data_dir_given, threads_given, fsync_mode;
    uint64_t lease_ms, grace_ms, max_body, max_keys, threads, snapshot_bytes;
    uint64_t idle_timeout, request_timeout, max_conns_client, max_conns, max_body_memory;
    struct kvp_cidr *allow;
    size_t nallow;
    struct kvp_kvev_cfg kvev; /* --kv-events: kvev.spec set when given */
    double max_pinned_ratio;
};

/* ---- serve_flags.c ---- */

/* Fills cfg from the command line (defaults first): -1 to go on and run,
 * else the exit status (0 after --help, 2 for a usage error). */
int kvp__serve_parse(int argc, char **argv, struct serve_cfg *cfg);
/* Says that value is no good for flag, and why: the exit status (2). */
int kvp__serve_bad_value(const char *flag, const char *value, const char *why);

/* ---- serve_listen.c ---- */

struct listen_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* --listen's ADDR:PORT or [V6]:PORT: 0, or -1 (not an address). */
int kvp__listen_parse(const char *s, struct listen_addr *la);
/* A socket bound to la and listening; -1 (said on stderr) when it cannot be. */
int kvp__listen_open(const struct listen_addr *la, const char *text);
/* Says where the server listens on fd (stdout, or the log in JSON) and tells
 * systemd it is ready. */
void kvp__listen_banner(const struct serve_cfg *sc, const struct listen_addr *la, int fd,
                        uint64_t max_conns);

/* ---- serve_state.c ---- */

/* The state the server runs on, opened by kvp__serve_open_state. */
struct serve_state {
    struct kvp_meta *meta;
    int persistent;       /* in a data directory */
    int made_dir;         /* the data directory did not exist before */
    char shown_loc[1024]; /* --meta's location without its password */
    char text[4200];      /* where the state is: the banner and /v1/stats's server.state */
};

/* Opens the state sc asks for and says where it is (the log): 0, or the
 * exit status after saying why (2 for a bad location or directory). */
int kvp__serve_open_state(const struct serve_cfg *sc, struct serve_state *st);

/* ---- serve_http.c ---- */

/* Starts libmicrohttpd (and the acceptor where it has one) on the listening
 * fd: 0, or -1 (said on stderr; fd closed). */
int kvp__http_start(struct serve *S, const struct serve_cfg *sc, const struct listen_addr *la,
                    int fd);
/* Stops what kvp__http_start started, in order: the replies parked on the
 * log are answered, the acceptor stops, then MHD; fd closed. */
void kvp__http_stop(struct serve *S, int fd);
/* Handles the request in cn->req on the calling thread; returns the ticket
 * of its changes (0: nothing to wait for before the reply). */
uint64_t kvp__http_handle(struct serve *S, struct conn *cn);
/* Gives a parked reply back to MHD with rc as its log's status (0 or a
 * negative errno): the next call of its request answers it. */
void kvp__http_resume(struct conn *cn, int rc);

/* ---- serve_limits.c ---- */

/* Room for connections in the open-file limit (raised to its hard limit):
 * max_conns when 0, else max_conns (with a warning past the room). */
uint64_t kvp__limits_max_conns(uint64_t max_conns);
/* A client address as the per-client limit counts it: 0, or -1 (none). */
int kvp__client_key_of(const struct sockaddr *sa, struct client_key *k);
/* Counts one connection fewer from k (counted by kvp__limits_on_accept). */
void kvp__client_drop(struct serve *S, const struct client_key *k);
/* MHD's accept policy callback: --max-conns and --max-conns-per-client. */
enum MHD_Result kvp__limits_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);
/* Frees the per-client counts. */
void kvp__limits_free(struct serve *S);

/* ---- serve_body.c ---- */

/* The first call of a request (headers only): makes cn ready for its body,
 * and refuses a declared body that is too large or does not fit in
 * --max-body-memory. 0: go on (read the body); 1: answer at once, before
 * any of the body is read. */
int kvp__body_start(struct serve *S, struct MHD_Connection *mc, struct conn *cn);
/* Takes n bytes of the body (or drops them, for a refused body). MHD_NO
 * closes the connection: why (a log line, for mhd_log) then says why when
 * it is not for want of memory. */
enum MHD_Result kvp__body_take(struct serve *S, struct conn *cn, const char *data, size_t n,
                               const char *method, const char *url, char *why, size_t whylen);
/* Gives back the --max-body-memory that cn's body holds. */
void kvp__body_release(struct serve *S, struct conn *cn);
/* The body worker: started (0) or not (-1, and large bodies are handled in
 * line); a job is a suspended connection whose request it handles. */
int kvp__body_worker_start(struct serve *S);
void kvp__body_worker_push(struct serve *S, struct conn *cn);
void kvp__body_worker_stop(struct serve *S);

/* ---- serve_arena.c ---- */

/* Makes jansson allocate from the per-request arena (not under
 * AddressSanitizer): 1 when it does, else 0. */
int kvp__arena_install(void);
/* Around one request's handling, on the thread that handles it. */
void kvp__arena_begin(void);
void kvp__arena_end(void);
/* Every JSON block of the request in progress is in the arena (the
 * server's cfg.json_is_scratch). */
int kvp__arena_holds_all(void);

/* ---- serve_systemd.c ---- */

/* Tells systemd msg ("READY=1", "STOPPING=1"); nothing without $NOTIFY_SOCKET. */
void kvp__notify_systemd(const char *msg);

#endif
