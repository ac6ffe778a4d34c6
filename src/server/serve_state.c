/*
 * kvpage serve's state: the metadata store it opens (--data-dir, --meta,
 * or memory only), with the options the server wants, retried while a
 * remote store is not reachable yet; what the store promises against
 * --fsync; where the state is, for the log, the banner and /v1/stats.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kvpage/error.h"
#include "kvpage/meta.h"
#include "server/log.h"
#include "server/serve_internal.h"
#include "util/clock.h"

/* loc as messages show it: a password in it ("redis://USER:PASS@...")
 * becomes "***". */
static void show_location(const char *loc, char *out, size_t len)
{
    const char *auth = strstr(loc, "://");
    auth = auth ? auth + 3 : loc;
    size_t end = strcspn(auth, "/?");
    const char *at = NULL;
    for (const char *p = auth; p < auth + end; p++)
        if (*p == '@')
            at = p;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon)
        snprintf(out, len, "%s", loc);
    else
        snprintf(out, len, "%.*s:***%s", (int)(colon - loc), loc, at);
}

/*
 * Opens the state. A remote store (redis://, http://: kvp_meta_info's
 * remote) that cannot be reached yet (Redis starting with the server, a
 * failover) is retried for up to 30 s before the server gives up; once
 * running, the backend reconnects by itself.
 */
static int open_meta(const char *loc, const char *shown, const struct kvp_meta_opts *mo,
                     struct kvp_meta **meta, struct kvp_error *err)
{
    struct kvp_meta_info in = {.info_size = sizeof in};
    int remote = kvp_meta_location_info(loc, mo->data_dir != NULL, &in, NULL) == 0 && in.remote;
    uint64_t give_up = kvp__mono_ns() + UINT64_C(30000000000), said = 0;
    for (;;) {
        memset(err, 0, sizeof *err);
        int rc = kvp_meta_open_at(loc, mo, meta, err);
        if (rc == 0 || !remote || err->rule != KVP_RULE_UNAVAILABLE || kvp__mono_ns() > give_up)
            return rc;
        if (kvp__mono_ns() >= said) {
            KVP_LOGW("cannot reach %s yet (%s); retrying for up to 30 s", shown, err->msg);
            said = kvp__mono_ns() + UINT64_C(5000000000);
        }
        struct timespec nap = {0, 250 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* Says what the store promises against what --fsync asks, where the
 * backend leaves it to the store's holder (kvp_meta_info's
 * durability_wanted; protocol-notes: "Durability with Redis"). */
static void durability_warning(struct kvp_meta *meta, const char *loc, int fsync_mode)
{
    struct kvp_meta_info in = {.info_size = sizeof in};
    if (fsync_mode == KVP_FSYNC_NEVER || kvp_meta_info(meta, &in) != 0 || !in.durability_wanted)
        return; /* nothing asked, or the backend keeps --fsync itself */
    const char *asked = fsync_mode == KVP_FSYNC_ALWAYS ? "always" : "batch";
    if (in.durability == KVP_DURABLE_UNKNOWN)
        KVP_LOGW("cannot read the persistence settings of %s (%s refused): whether an "
                 "acknowledged change survives a restart of %s is unknown; --fsync %s asks "
                 "for %s",
                 loc, in.durability_source ? in.durability_source : "asking", in.holder, asked,
                 in.durability_wanted);
    else if (in.durability < KVP_DURABLE_MACHINE)
        KVP_LOGW("%s has %s: an acknowledged change can be lost when %s restarts (%s); "
                 "--fsync %s asks for %s",
                 loc, in.durability_text, in.holder,
                 in.durability_loss ? in.durability_loss : "unknown", asked, in.durability_wanted);
}

/* Recovery and background persistence messages of meta (levels match). */
static void meta_log(void *arg, int level, const char *msg)
{
    (void)arg;
    kvp__log(level, "%s", msg);
}

/* The metadata options of the server's state (sc: the flags). */
static void state_opts(const struct serve_cfg *sc, int persistent, struct kvp_meta_opts *mo)
{
    kvp_meta_opts_init(mo);
    mo->lease_ms = sc->lease_ms;
    mo->read_grace_ms = sc->grace_ms;
    mo->data_dir = persistent ? sc->data_dir : NULL;
    if (sc->meta_loc) {
        /* A request waits for the remote store (--meta) at most this long
         * before it gets 503. */
        mo->connect_timeout_ms = 1000;
        mo->timeout_ms = 2000;
    }
    mo->fsync = sc->fsync_mode;
    mo->snapshot_bytes = sc->snapshot_bytes; /* 0: the library's default */
    /* Not the library's default (a thread): this process holds little but
     * the metadata, so its fork costs about what the thread's copy does
     * (1-4 ms for 1,000,000 keys), and the child writes at idle priority,
     * leaving the CPUs to requests (bench/persist/README.md, "pause"). */
    mo->snapshot_mode = KVP_SNAPSHOT_FORK;
    mo->log = meta_log;
}

/* Says why the state did not open (rc, merr): the exit status. */
static int state_failed(const struct serve_cfg *sc, const struct serve_state *st, int rc,
                        const struct kvp_error *merr)
{
    int status = 1;
    if (sc->meta_loc) {
        fprintf(stderr, "kvpage serve: cannot open the state in %s: %s\n", st->shown_loc,
                merr->msg[0] ? merr->msg : kvp_strerror(rc));
        if (merr->rule == KVP_RULE_ARG) /* a bad location, as a bad flag: 2 */
            status = 2;
        return status;
    }
    /* A data directory that cannot be one (a missing parent, a file): 2. */
    if (st->persistent && (rc == -ENOENT || rc == -ENOTDIR))
        status = 2;
    /* meta has logged the details (file, offset, what is wrong); "data
     * directory D is busy: in use by another kvpage process" among them, in
     * the words the embedded store's callers print. */
    if (rc == -EBUSY)
        return status;
    if (st->persistent && merr->msg[0])
        fprintf(stderr, "kvpage serve: %s\n", merr->msg); /* names the directory */
    else if (st->persistent)
        fprintf(stderr, "kvpage serve: cannot open the state in %s: %s\n", sc->data_dir,
                kvp_strerror(rc));
    else
        fprintf(stderr, "kvpage serve: cannot create the metadata store: %s\n",
                merr->msg[0] ? merr->msg : kvp_strerror(rc));
    return status;
}

int kvp__serve_open_state(const struct serve_cfg *sc, struct serve_state *st)
{
    const char *meta_loc = sc->meta_loc, *data_dir = sc->data_dir;
    struct stat dst;
    st->meta = NULL;
    st->persistent = !meta_loc && strcmp(data_dir, "none") != 0;
    st->made_dir = st->persistent && stat(data_dir, &dst) != 0 && errno == ENOENT;
    struct kvp_meta_opts mo;
    state_opts(sc, st->persistent, &mo);
    struct kvp_error merr = {0};
    /* Messages name the location without its password. */
    show_location(meta_loc ? meta_loc : "", st->shown_loc, sizeof st->shown_loc);
    int rc = open_meta(meta_loc         ? meta_loc
                       : st->persistent ? NULL
                                        : "mem:",
                       st->shown_loc, &mo, &st->meta, &merr);
    if (rc)
        return state_failed(sc, st, rc, &merr);
    /* Before the listener: by the time a client is answered, the log says it. */
    durability_warning(st->meta, st->shown_loc, sc->fsync_mode);
    /* Where the state is, as the backend says (never a password): the
     * banner and /v1/stats's server.state. */
    if (!st->persistent && !meta_loc)
        snprintf(st->text, sizeof st->text, "memory only (--data-dir none)");
    else if (kvp_meta_describe(st->meta, st->text, sizeof st->text) < 0)
        snprintf(st->text, sizeof st->text, "%s", st->shown_loc);
    /* Before the listener, as the durability warning: a client that is
     * answered finds it in the log. */
    if (!st->persistent && !meta_loc)
        KVP_LOGI("--data-dir none: state is in memory only");
    else
        KVP_LOGI("state in %s", st->text);
    return 0;
}
