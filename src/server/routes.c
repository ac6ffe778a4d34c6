/*
 * The route table: which decoded path names which route, and each route's
 * label. Read by the router (handle.c) and the metrics (metrics.c); reads
 * nothing of theirs.
 */
#include <string.h>

#include "kvpage/meta.h"
#include "server/routes.h"

static const char *const route_names[KVP_ROUTE_COUNT] = {
    [KVP_ROUTE_NONE] = "unmatched",
    [KVP_ROUTE_VLLM_INIT] = "/rank/{rank}/initialize",
    [KVP_ROUTE_VLLM_ALLOCATE] = "/keys/batch_allocate",
    [KVP_ROUTE_VLLM_CONFIRM] = "/keys/confirm_write",
    [KVP_ROUTE_VLLM_EXISTS] = "/keys/batch_exists",
    [KVP_ROUTE_VLLM_LOCATIONS] = "/keys/get_locations",
    [KVP_ROUTE_VLLM_CLEAR] = "/clear",
    [KVP_ROUTE_VLLM_DELETE] = "/keys/delete",
    [KVP_ROUTE_VLLM_DROP] = "/drop",
    [KVP_ROUTE_SGL_INIT] = "/{rank}/initialize",
    [KVP_ROUTE_STATUS] = "/",
    [KVP_ROUTE_SGL_EXISTS] = "/{rank}/exists",
    [KVP_ROUTE_SGL_RESERVE] = "/{rank}/reserve_and_allocate_page_indices",
    [KVP_ROUTE_SGL_CONFIRM] = "/{rank}/confirm_write",
    [KVP_ROUTE_SGL_DELETE] = "/{rank}/delete_keys",
    [KVP_ROUTE_SGL_CLEAR] = "/{rank}/clear",
    [KVP_ROUTE_SGL_GET] = "/{rank}/get_page_indices",
    [KVP_ROUTE_HEALTHZ] = "/healthz",
    [KVP_ROUTE_METRICS] = "/metrics",
    [KVP_ROUTE_STATS] = "/v1/stats",
    [KVP_ROUTE_QUERY] = "/v1/query",
    [KVP_ROUTE_PINS] = "/v1/pins",
};

const char *kvp__route_name(int route)
{
    if (route < 0 || route >= KVP_ROUTE_COUNT)
        return "unmatched";
    return route_names[route];
}

struct seg {
    const char *p;
    size_t n;
};

static int seg_is(struct seg s, const char *lit)
{
    size_t n = strlen(lit);
    return s.n == n && !memcmp(s.p, lit, n);
}

/* A path segment where a rank goes: [+-]?[0-9]+ (anything else is 404). */
static int rank_like(struct seg s)
{
    size_t i = 0;
    if (s.n && (s.p[0] == '-' || s.p[0] == '+'))
        i = 1;
    if (i == s.n)
        return 0;
    for (; i < s.n; i++)
        if (s.p[i] < '0' || s.p[i] > '9')
            return 0;
    return 1;
}

/* Value of a rank_like segment; 0 when outside 0..2^31-1. */
static int rank_value(struct seg s, uint32_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (s.p[0] == '-' || s.p[0] == '+')
        neg = s.p[i++] == '-';
    uint64_t v = 0;
    for (; i < s.n; i++) {
        v = v * 10 + (uint64_t)(s.p[i] - '0');
        if (v > KVP_MAX_RANK)
            return 0;
    }
    if (neg && v != 0)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

void kvp__route_match(const char *p, size_t n, int has_ns, struct kvp_route_match *m)
{
    static const struct {
        const char *op;
        int route;
    } sgl[] = {
        {"initialize", KVP_ROUTE_SGL_INIT},
        {"exists", KVP_ROUTE_SGL_EXISTS},
        {"reserve_and_allocate_page_indices", KVP_ROUTE_SGL_RESERVE},
        {"confirm_write", KVP_ROUTE_SGL_CONFIRM},
        {"delete_keys", KVP_ROUTE_SGL_DELETE},
        {"clear", KVP_ROUTE_SGL_CLEAR},
        {"get_page_indices", KVP_ROUTE_SGL_GET},
    };
    static const struct {
        const char *op;
        int route;
    } keys_ops[] = {
        {"batch_allocate", KVP_ROUTE_VLLM_ALLOCATE}, {"confirm_write", KVP_ROUTE_VLLM_CONFIRM},
        {"batch_exists", KVP_ROUTE_VLLM_EXISTS},     {"get_locations", KVP_ROUTE_VLLM_LOCATIONS},
        {"delete", KVP_ROUTE_VLLM_DELETE},
    };
    struct seg s[4];
    size_t ns = 0;
    memset(m, 0, sizeof *m);
    if (n == 0 || p[0] != '/')
        return;
    if (n == 1) { /* "/" or "/ns/NAME/" */
        m->route = KVP_ROUTE_STATUS, m->get = 1;
        return;
    }
    size_t i = 1;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '/')
            j++;
        if (ns == 4)
            return;
        s[ns].p = p + i;
        s[ns].n = j - i;
        ns++;
        if (j >= n)
            break;
        i = j + 1;
    }
    for (size_t k = 0; k < ns; k++)
        if (s[k].n == 0)
            return;
    if (ns == 1) {
        if (seg_is(s[0], "clear"))
            m->route = KVP_ROUTE_VLLM_CLEAR;
        else if (seg_is(s[0], "drop"))
            m->route = KVP_ROUTE_VLLM_DROP;
        else if (!has_ns && seg_is(s[0], "healthz"))
            m->route = KVP_ROUTE_HEALTHZ, m->get = 1;
        else if (!has_ns && seg_is(s[0], "metrics"))
            m->route = KVP_ROUTE_METRICS, m->get = 1;
    } else if (ns == 2) {
        if (seg_is(s[0], "keys")) {
            for (size_t k = 0; k < sizeof keys_ops / sizeof keys_ops[0]; k++)
                if (seg_is(s[1], keys_ops[k].op))
                    m->route = keys_ops[k].route;
        } else if (!has_ns && seg_is(s[0], "v1") && seg_is(s[1], "stats")) {
            m->route = KVP_ROUTE_STATS, m->get = 1;
        } else if (seg_is(s[0], "v1") && seg_is(s[1], "query")) {
            m->route = KVP_ROUTE_QUERY;
        } else if (seg_is(s[0], "v1") && seg_is(s[1], "pins")) {
            m->route = KVP_ROUTE_PINS;
        } else if (rank_like(s[0])) {
            for (size_t k = 0; k < sizeof sgl / sizeof sgl[0]; k++)
                if (seg_is(s[1], sgl[k].op)) {
                    m->route = sgl[k].route;
                    m->rank = s[0].p, m->rank_len = s[0].n;
                }
        }
    } else if (ns == 3) {
        if (seg_is(s[0], "rank") && rank_like(s[1]) && seg_is(s[2], "initialize")) {
            m->route = KVP_ROUTE_VLLM_INIT;
            m->rank = s[1].p, m->rank_len = s[1].n;
        }
    }
}

int kvp__route_rank(const struct kvp_route_match *m, uint32_t *out)
{
    return m->rank && rank_value((struct seg){m->rank, m->rank_len}, out);
}
