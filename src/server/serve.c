/*
 * kvpage serve: start-up and shutdown, in order. The parts are in
 * serve_*.c (serve_internal.h lists them); everything about the protocol is
 * in kvp__server_handle (handle.c).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "server/log.h"
#include "server/serve.h"
#include "server/serve_internal.h"
#include "util/dirs.h"

/* The server over an open state (st) as sc asks; NULL for want of memory. */
static struct serve *serve_new(const struct serve_cfg *sc, struct serve_state *st, int arena)
{
    struct serve *S = calloc(1, sizeof *S);
    if (!S)
        return NULL;
    uint64_t max_body = sc->max_body;
    struct kvp_server_config cfg = {
        .token = sc->token,
        .allow = sc->allow,
        .nallow = sc->nallow,
        .max_body = (size_t)max_body,
        .max_keys = (size_t)sc->max_keys,
        .data_dir = sc->meta_loc ? st->shown_loc : sc->data_dir,
        .state = st->text,
        .json_is_scratch = arena ? kvp__arena_holds_all : NULL,
        .max_pinned_ratio = sc->max_pinned_ratio,
    };
    kvp__server_init(&S->srv, st->meta, &cfg);
    S->meta = st->meta;
    S->group_commit = sc->fsync_mode == KVP_FSYNC_BATCH;
    S->max_body = (size_t)max_body;
    S->discard_max = max_body + (max_body > DROP_EXTRA_MIN ? max_body : DROP_EXTRA_MIN);
    S->idle_timeout = (unsigned)sc->idle_timeout;
    S->request_timeout = (unsigned)sc->request_timeout;
    S->max_conns_per_client = sc->max_conns_client;
    /* One body of --max-body always fits. */
    S->max_body_memory = (size_t)(sc->max_body_memory > max_body ? sc->max_body_memory : max_body);
    S->accept_stop = -1;
    pthread_mutex_init(&S->clients_lock, NULL);
    pthread_mutex_init(&S->jobs_lock, NULL);
    pthread_cond_init(&S->jobs_cond, NULL);
    return S;
}

/* Frees what serve_new made and the state, started or not: the body worker
 * ends, then the connection counts, the locks and the metadata handle go. */
static void serve_free(struct serve *S)
{
    kvp__body_worker_stop(S);
    kvp__limits_free(S);
    pthread_mutex_destroy(&S->clients_lock);
    pthread_mutex_destroy(&S->jobs_lock);
    pthread_cond_destroy(&S->jobs_cond);
    kvp__server_fini(&S->srv);
    kvp_meta_close(S->meta);
    free(S);
}

/* KV events (--kv-events), before the listener: no change goes
 * unpublished. 0 (*kvev NULL without the flag), or -1 (said). */
static int kv_events_start(const struct serve_cfg *sc, const struct serve_state *st,
                           struct kvp_kvev **kvev)
{
    *kvev = NULL;
    if (!sc->kvev.spec)
        return 0;
    char why[600];
    if (kvp__kvev_start(&sc->kvev, st->meta, st->persistent ? sc->data_dir : NULL, kvev, why,
                        sizeof why) != 0) {
        fprintf(stderr, "kvpage serve: --kv-events: %s\n", why);
        return -1;
    }
    KVP_LOGI("KV events on %s%s%s (topic \"%s\", medium %s)", sc->kvev.endpoint,
             sc->kvev.replay_endpoint ? ", replay on " : "",
             sc->kvev.replay_endpoint ? sc->kvev.replay_endpoint : "", sc->kvev.topic,
             sc->kvev.medium);
    return 0;
}

/* Serves on the listening fd until SIGTERM or SIGINT (sigs): the exit
 * status. fd is closed, the state (in st) too. */
static int serve_on(const struct serve_cfg *sc, const struct listen_addr *la, int fd,
                    uint64_t max_conns, struct serve_state *st, int arena, const sigset_t *sigs)
{
    struct serve *S = serve_new(sc, st, arena);
    if (!S) {
        fprintf(stderr, "kvpage serve: out of memory\n");
        kvp_meta_close(st->meta);
        close(fd);
        return 1;
    }
    S->max_conns = max_conns;
    struct kvp_kvev *kvev = NULL;
    int status = 1;
    if (kv_events_start(sc, st, &kvev) != 0)
        close(fd);
    else if (kvp__http_start(S, sc, la, fd) == 0) {
        kvp__listen_banner(sc, la, fd, S->max_conns);
        int sig = 0;
        sigwait(sigs, &sig);
        KVP_LOGI("%s received, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
        kvp__notify_systemd("STOPPING=1");
        kvp__http_stop(S, fd);
        status = 0;
    }
    kvp__kvev_stop(kvev); /* after the last request, before the state closes */
    serve_free(S);
    return status;
}

/* Runs the server that sc describes until SIGTERM or SIGINT: the exit
 * status. */
static int serve_run(const struct serve_cfg *sc)
{
    int arena = kvp__arena_install();
    struct listen_addr la;
    if (kvp__listen_parse(sc->listen_text, &la))
        return kvp__serve_bad_value(
            "--listen", sc->listen_text,
            "expected ADDR:PORT, e.g. 127.0.0.1:18000, 0.0.0.0:18000 or [::1]:18000");
    /* From here on failures are not usage errors (status 1). SIGINT and
     * SIGTERM are taken synchronously by this thread only (the sigwait in
     * serve_on), blocked before any thread exists: the log's and the
     * snapshot's threads, started while the state opens, and MHD's inherit
     * the mask. A signal during start-up then waits for the sigwait (a clean
     * stop, exit 0) instead of killing the process in another thread. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The port before the state: a port in use is refused before a data
     * directory, its LOCK and its log are created. */
    int fd = kvp__listen_open(&la, sc->listen_text);
    if (fd < 0)
        return 1;
    uint64_t max_conns = kvp__limits_max_conns(sc->max_conns);
    struct serve_state st;
    int status = kvp__serve_open_state(sc, &st);
    if (status)
        close(fd);
    else
        status = serve_on(sc, &la, fd, max_conns, &st, arena, &sigs);
    if (status && st.made_dir)
        kvp__remove_data_dir(sc->data_dir); /* started nothing: leave no state behind */
    return status;
}

int kvp__serve_main(int argc, char **argv)
{
    struct serve_cfg cfg;
    int status = kvp__serve_parse(argc, argv, &cfg);
    if (status < 0)
        status = serve_run(&cfg);
    free(cfg.allow);
    kvp__kvev_cfg_free(&cfg.kvev);
    return status;
}
