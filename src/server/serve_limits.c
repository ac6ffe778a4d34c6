/*
 * kvpage serve's connection limits: --max-conns (by default what the
 * open-file limit leaves) and --max-conns-per-client, checked for each
 * accepted socket before libmicrohttpd takes it.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "server/log.h"
#include "server/serve_internal.h"

uint64_t kvp__limits_max_conns(uint64_t max_conns)
{
    /* Every connection is a file descriptor: take all the kernel allows, and
     * keep some for the log, snapshots and the listener. */
    struct rlimit rl;
    uint64_t fd_room = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
            struct rlimit up = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                rl.rlim_cur = want;
        }
        fd_room = rl.rlim_cur == RLIM_INFINITY ? (uint64_t)1 << 20 : (uint64_t)rl.rlim_cur;
    }
    uint64_t conn_room = fd_room > 128 ? fd_room - 64 : fd_room / 2;
    if (!max_conns)
        max_conns = conn_room;
    else if (max_conns > conn_room)
        KVP_LOGW("--max-conns %" PRIu64 " is above what the open-file limit (%" PRIu64
                 ") leaves for connections (%" PRIu64 "); accepts may fail past that",
                 max_conns, fd_room, conn_room);
    return max_conns;
}

int kvp__client_key_of(const struct sockaddr *sa, struct client_key *k)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(k, 0, sizeof *k);
    if (!sa)
        return -1;
    if (sa->sa_family == AF_INET) {
        memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        k->len = 4;
    } else if (sa->sa_family == AF_INET6) {
        const uint8_t *a = (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (!memcmp(a, v4mapped, 12)) {
            memcpy(k->addr, a + 12, 4);
            k->len = 4;
        } else {
            memcpy(k->addr, a, 16);
            k->len = 16;
        }
    } else {
        return -1;
    }
    return 0;
}

static struct client_count **client_slot(struct serve *S, const struct client_key *k)
{
    uint32_t h = 2166136261u;
    for (unsigned i = 0; i < k->len; i++)
        h = (h ^ k->addr[i]) * 16777619u;
    struct client_count **pp = &S->clients[h % CLIENT_BUCKETS];
    while (*pp && ((*pp)->key.len != k->len || memcmp((*pp)->key.addr, k->addr, k->len)))
        pp = &(*pp)->next;
    return pp;
}

void kvp__client_drop(struct serve *S, const struct client_key *k)
{
    pthread_mutex_lock(&S->clients_lock);
    struct client_count **pp = client_slot(S, k), *c = *pp;
    if (c && --c->n == 0) {
        *pp = c->next;
        free(c);
    }
    pthread_mutex_unlock(&S->clients_lock);
}

/* Counts one more connection from k unless k has max already: 1 counted, 0
 * at the limit, -1 out of memory (not counted). */
static int client_take(struct serve *S, const struct client_key *k, uint64_t max)
{
    pthread_mutex_lock(&S->clients_lock);
    struct client_count **pp = client_slot(S, k), *c = *pp;
    int rc = 1;
    if (c && c->n >= max)
        rc = 0;
    else if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        c->key = *k;
        *pp = c;
    }
    if (rc == 1 && c)
        c->n++;
    else if (rc == 1)
        rc = -1;
    pthread_mutex_unlock(&S->clients_lock);
    return rc;
}

/* Runs for each accepted socket before MHD takes it: over a limit, MHD
 * closes it at once (the client sees the connection closed, not a hang).
 * A connection let in is counted here, open and against its address, not
 * when MHD starts it: with the acceptor, MHD starts connections on its
 * workers later, and a burst from one address would otherwise all pass the
 * check before the first of them was counted. (Should MHD fail to start one
 * it let in, for want of memory, that count stays one too high.) */
enum MHD_Result kvp__limits_on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    struct serve *S = cls;
    struct kvp_conn_stats *cs = &S->srv.conns;
    if (atomic_fetch_add(&cs->open, 1) >= S->max_conns) {
        atomic_fetch_sub(&cs->open, 1);
        atomic_fetch_add(&cs->refused_total, 1);
        return MHD_NO;
    }
    struct client_key k;
    int taken = kvp__client_key_of(addr, &k) ? 1 : client_take(S, &k, S->max_conns_per_client);
    if (taken != 1) { /* at the limit, or no memory to count it */
        atomic_fetch_sub(&cs->open, 1);
        atomic_fetch_add(taken == 0 ? &cs->refused_client : &cs->refused_total, 1);
        return MHD_NO;
    }
    return MHD_YES;
}

void kvp__limits_free(struct serve *S)
{
    for (size_t i = 0; i < CLIENT_BUCKETS; i++)
        while (S->clients[i]) {
            struct client_count *c = S->clients[i];
            S->clients[i] = c->next;
            free(c);
        }
}
