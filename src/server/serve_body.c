/*
 * kvpage serve's request bodies: the memory that large ones hold
 * (--max-body-memory), the refused ones read and dropped before the reply,
 * and the body worker that handles the large ones off the event loop.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/log.h"
#include "server/serve_internal.h"
#include "util/clock.h"
#include "util/size.h"

/*
 * Bodies over 1 MiB share --max-body-memory, so that many slow uploads of
 * large bodies cannot take all the memory: a body that would pass it is
 * dropped and answered 503. Smaller bodies do not count (each connection's
 * memory is bounded by them, and engines' requests always get through).
 */
static int body_hold(struct serve *S, struct conn *cn, size_t want)
{
    if (want <= WORKER_BODY_MIN || want <= cn->held)
        return 0;
    size_t add = want - cn->held, cur = atomic_load(&S->body_memory);
    do {
        if (add > S->max_body_memory || cur > S->max_body_memory - add)
            return -1;
    } while (!atomic_compare_exchange_weak(&S->body_memory, &cur, cur + add));
    cn->held = want;
    return 0;
}

void kvp__body_release(struct serve *S, struct conn *cn)
{
    if (cn->held)
        atomic_fetch_sub(&S->body_memory, cn->held);
    cn->held = 0;
}

/* The body of this request will be refused: from now on it is read and
 * dropped, for DROP_SECONDS at most. */
static void start_dropping(struct conn *cn)
{
    cn->drop_until_ms = kvp__mono_ms() + DROP_SECONDS * 1000;
}

/* The client waits for "100 Continue" before it sends its body. */
static int expects_continue(struct MHD_Connection *mc)
{
    const char *e = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return e && strcasecmp(e, "100-continue") == 0;
}

int kvp__body_start(struct serve *S, struct MHD_Connection *mc, struct conn *cn)
{
    cn->last_ms = kvp__mono_ms();
    kvp__buf_reset(&cn->in);
    cn->too_large = 0;
    cn->memory_full = 0;
    cn->body_seen = 0;
    cn->drop_until_ms = 0;
    kvp__body_release(S, cn);
    if (cn->rep.body.cap > KEEP_BUFFER_MAX || cn->rep.scratch_cap > KEEP_BUFFER_MAX / 8) {
        kvp__reply_free(&cn->rep);
        kvp__reply_init(&cn->rep);
    }
    const char *cl =
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    uint64_t n;
    if (!cl || kvp__parse_size(cl, 0, &n))
        return 0;
    if (n > S->max_body) {
        cn->too_large = 1;
        /* A client waiting for 100 Continue sends no body after the
         * reply; a body past what is dropped is not read at all:
         * answer before reading any of it (MHD then closes the
         * connection instead of reading it). */
        if (n > S->discard_max || expects_continue(mc))
            return 1;
        start_dropping(cn);
        return 0;
    }
    if (body_hold(S, cn, (size_t)n)) {
        cn->memory_full = 1;
        start_dropping(cn);
        return 0;
    }
    if (n <= KEEP_BUFFER_MAX)
        kvp__buf_reserve(&cn->in, (size_t)n);
    return 0;
}

/* The body grew past --max-body or --max-body-memory: what came is
 * dropped, and so is the rest, within DROP_SECONDS. */
static void refuse(struct serve *S, struct conn *cn)
{
    kvp__buf_free(&cn->in);
    kvp__body_release(S, cn);
    start_dropping(cn);
}

enum MHD_Result kvp__body_take(struct serve *S, struct conn *cn, const char *data, size_t n,
                               const char *method, const char *url, char *why, size_t whylen)
{
    cn->last_ms = kvp__mono_ms();
    cn->body_seen += n;
    if (cn->drop_until_ms) {
        /* The body will be refused: drop it, within the bounds. */
        if (cn->body_seen <= S->discard_max && cn->last_ms <= cn->drop_until_ms)
            return MHD_YES;
        /* MHD 0.9.75 cannot answer in the middle of a body: close. */
        snprintf(why, whylen,
                 "%s %.200s: closed the connection after %" PRIu64 " bytes of a body that "
                 "is refused (%s): more than is read and dropped (%" PRIu64 " bytes, %d s)",
                 method, url, cn->body_seen,
                 cn->too_large ? "over --max-body" : "over --max-body-memory", S->discard_max,
                 DROP_SECONDS);
        return MHD_NO;
    }
    if (n > S->max_body - cn->in.len) {
        cn->too_large = 1;
        refuse(S, cn);
        return MHD_YES;
    }
    /* A body without Content-Length holds memory as it grows, in doublings. */
    size_t want = cn->in.len + n;
    if (want > cn->held && want > WORKER_BODY_MIN) {
        size_t step = cn->held ? 2 * cn->held : 2 * WORKER_BODY_MIN;
        if (step > S->max_body)
            step = S->max_body;
        if (step < want)
            step = want;
        if (body_hold(S, cn, step) && body_hold(S, cn, want)) {
            cn->memory_full = 1;
            refuse(S, cn);
            return MHD_YES;
        }
    }
    kvp__buf_put(&cn->in, data, n);
    if (cn->in.oom)
        return MHD_NO;
    return MHD_YES;
}

/* ---------- the body worker ---------- */

/* The body worker: handles the requests with large bodies, one at a time,
 * waits for their log records, and gives each connection back to MHD. */
static void *body_worker(void *arg)
{
    struct serve *S = arg;
    pthread_setname_np(pthread_self(), "kvp-body");
    pthread_mutex_lock(&S->jobs_lock);
    for (;;) {
        while (!S->jobs_head && !S->worker_stop)
            pthread_cond_wait(&S->jobs_cond, &S->jobs_lock);
        struct conn *cn = S->jobs_head;
        if (!cn)
            break;
        S->jobs_head = cn->job_next;
        if (!S->jobs_head)
            S->jobs_tail = NULL;
        pthread_mutex_unlock(&S->jobs_lock);
        uint64_t lsn = kvp__http_handle(S, cn);
        kvp__http_resume(cn, lsn ? kvp_meta_wait(S->meta, lsn, NULL) : 0);
        pthread_mutex_lock(&S->jobs_lock);
    }
    pthread_mutex_unlock(&S->jobs_lock);
    return NULL;
}

void kvp__body_worker_push(struct serve *S, struct conn *cn)
{
    cn->job_next = NULL;
    pthread_mutex_lock(&S->jobs_lock);
    if (S->jobs_tail)
        S->jobs_tail->job_next = cn;
    else
        S->jobs_head = cn;
    S->jobs_tail = cn;
    pthread_cond_signal(&S->jobs_cond);
    pthread_mutex_unlock(&S->jobs_lock);
}

int kvp__body_worker_start(struct serve *S)
{
    if (pthread_create(&S->worker, NULL, body_worker, S) != 0)
        return -1;
    S->worker_running = 1;
    return 0;
}

void kvp__body_worker_stop(struct serve *S)
{
    if (!S->worker_running)
        return;
    pthread_mutex_lock(&S->jobs_lock);
    S->worker_stop = 1;
    pthread_cond_signal(&S->jobs_cond);
    pthread_mutex_unlock(&S->jobs_lock);
    pthread_join(S->worker, NULL);
    S->worker_running = 0;
}
