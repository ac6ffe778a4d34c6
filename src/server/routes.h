/*
 * The routes of kvpage serve: their ids, their names (the labels of
 * /metrics and /v1/stats) and which path names which. One place that the
 * router (handle.c), the native routes (native.c) and the metrics
 * (metrics.c) all read, and that reads none of them.
 */
#ifndef KVP_SERVER_ROUTES_H
#define KVP_SERVER_ROUTES_H

#include <stddef.h>
#include <stdint.h>

/* Routes, for dispatch and metrics. */
enum kvp_route {
    KVP_ROUTE_NONE = 0, /* unmatched path (404) */
    KVP_ROUTE_VLLM_INIT,
    KVP_ROUTE_VLLM_ALLOCATE,
    KVP_ROUTE_VLLM_CONFIRM,
    KVP_ROUTE_VLLM_EXISTS,
    KVP_ROUTE_VLLM_LOCATIONS,
    KVP_ROUTE_VLLM_CLEAR,
    KVP_ROUTE_VLLM_DELETE,
    KVP_ROUTE_VLLM_DROP, /* kvpage's own: POST [/ns/NAME]/drop */
    KVP_ROUTE_SGL_INIT,
    KVP_ROUTE_SGL_EXISTS,
    KVP_ROUTE_SGL_RESERVE,
    KVP_ROUTE_SGL_CONFIRM,
    KVP_ROUTE_SGL_DELETE,
    KVP_ROUTE_SGL_CLEAR,
    KVP_ROUTE_SGL_GET,
    KVP_ROUTE_HEALTHZ,
    KVP_ROUTE_METRICS,
    KVP_ROUTE_STATS,
    KVP_ROUTE_STATUS, /* GET / and /ns/NAME/: the status page */
    KVP_ROUTE_QUERY,  /* POST [/ns/NAME]/v1/query (query.c) */
    KVP_ROUTE_PINS,   /* POST and DELETE [/ns/NAME]/v1/pins (query.c) */
    KVP_ROUTE_COUNT
};

/* The label of a route in metrics and /v1/stats, e.g. "/keys/batch_exists". */
const char *kvp__route_name(int route);

/* What a path names. */
struct kvp_route_match {
    int route;        /* enum kvp_route; KVP_ROUTE_NONE: no route */
    int get;          /* a GET route (else POST) */
    const char *rank; /* the rank's segment of a /{rank}/... route, else NULL */
    size_t rank_len;
};

/* The route of the decoded path p[0..n) (after a /ns/NAME prefix when
 * has_ns: the native GET routes other than the status page are then not
 * there). Never fails: an unknown path is KVP_ROUTE_NONE. */
void kvp__route_match(const char *p, size_t n, int has_ns, struct kvp_route_match *m);

/* The rank in m->rank: 1 (set) when it is 0..KVP_MAX_RANK, else 0. */
int kvp__route_rank(const struct kvp_route_match *m, uint32_t *out);

#endif
