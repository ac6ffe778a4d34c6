/*
 * Request metrics (lock-free counters updated by every request) and the two
 * renderings of them plus meta's per-rank figures: Prometheus text 0.0.4
 * (GET /metrics) and JSON (GET /v1/stats).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "util/clock.h"

static const int statuses[KVP_METRICS_NSTATUS - 1] = {200, 204, 400, 401, 403,
                                                      404, 405, 409, 413, 500};

/* Upper bounds of the latency buckets, in nanoseconds and as printed. */
static const uint64_t bucket_ns[KVP_METRICS_NBUCKETS - 1] = {
    100000,   250000,   500000,    1000000,   2500000,   5000000,    10000000,
    25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000u};
static const char *const bucket_le[KVP_METRICS_NBUCKETS] = {
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
    "0.05",   "0.1",     "0.25",   "0.5",   "1",      "2.5",   "+Inf"};

static int status_index(int status)
{
    for (int i = 0; i < KVP_METRICS_NSTATUS - 1; i++)
        if (statuses[i] == status)
            return i;
    return KVP_METRICS_NSTATUS - 1;
}

static void status_label(int idx, char out[8])
{
    if (idx == KVP_METRICS_NSTATUS - 1) {
        strcpy(out, "other");
        return;
    }
    int s = statuses[idx];
    out[0] = (char)('0' + s / 100);
    out[1] = (char)('0' + s / 10 % 10);
    out[2] = (char)('0' + s % 10);
    out[3] = 0;
}

void kvp__metrics_record(struct kvp_metrics *m, int route, int status, uint64_t ns)
{
    if (route < 0 || route >= KVP_ROUTE_COUNT)
        route = KVP_ROUTE_NONE;
    struct kvp_metrics_cell *c = &m->cell[route][status_index(status)];
    int b = 0;
    while (b < KVP_METRICS_NBUCKETS - 1 && ns > bucket_ns[b])
        b++;
    atomic_fetch_add_explicit(&c->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bucket[b], 1, memory_order_relaxed);
}

/* ---------- per-rank figures from meta ---------- */

struct ns_row {
    char *dep, *pool;
    struct kvp_rank_stats *ranks;
    size_t nranks;
};

struct collect {
    struct ns_row *rows;
    size_t n, cap;
};

static int collect_fn(const char *dep, const char *pool, const struct kvp_rank_stats *ranks,
                      size_t nranks, void *arg)
{
    struct collect *col = arg;
    if (col->n == col->cap) {
        size_t cap = col->cap ? col->cap * 2 : 8;
        struct ns_row *r = realloc(col->rows, cap * sizeof *r);
        if (!r)
            return -ENOMEM;
        col->rows = r;
        col->cap = cap;
    }
    struct ns_row *row = &col->rows[col->n];
    memset(row, 0, sizeof *row);
    row->dep = strdup(dep);
    row->pool = strdup(pool);
    row->ranks = nranks ? malloc(nranks * sizeof *ranks) : NULL;
    if (!row->dep || !row->pool || (nranks && !row->ranks)) {
        free(row->dep);
        free(row->pool);
        free(row->ranks);
        return -ENOMEM;
    }
    if (nranks)
        memcpy(row->ranks, ranks, nranks * sizeof *ranks);
    row->nranks = nranks;
    col->n++;
    return 0;
}

static void collect_free(struct collect *col)
{
    for (size_t i = 0; i < col->n; i++) {
        free(col->rows[i].dep);
        free(col->rows[i].pool);
        free(col->rows[i].ranks);
    }
    free(col->rows);
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void label_value(struct kvp_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            kvp__jw_lit(b, "\\\\");
        else if (*s == '"')
            kvp__jw_lit(b, "\\\"");
        else if (*s == '\n')
            kvp__jw_lit(b, "\\n");
        else
            kvp__buf_put(b, s, 1);
    }
}

struct rank_field {
    const char *name, *type, *help, *state;
    size_t off;
};

#define F(member) offsetof(struct kvp_rank_stats, member)
static const struct rank_field rank_fields[] = {
    {"kvpage_rank_num_pages", "gauge", "Page slots of the rank.", NULL, F(num_pages)},
    {"kvpage_rank_pages", "gauge", "Page slots by state.", "free", F(free)},
    {"kvpage_rank_pages", "gauge", NULL, "reserved", F(reserved)},
    {"kvpage_rank_pages", "gauge", NULL, "held", F(held)},
    {"kvpage_rank_keys", "gauge", "Keys holding a page on the rank.", NULL, F(keys)},
    {"kvpage_rank_hits_total", "counter", "Allocation hits and lookups that returned a page.", NULL,
     F(hits)},
    {"kvpage_rank_misses_total", "counter", "New allocations and lookups that returned null.", NULL,
     F(misses)},
    {"kvpage_rank_allocations_total", "counter", "Pages reserved by allocations.", NULL,
     F(allocations)},
    {"kvpage_rank_evictions_total", "counter", "Held pages evicted to serve allocations.", NULL,
     F(evictions)},
    {"kvpage_rank_expired_reservations_total", "counter", "Reservations whose lease expired.", NULL,
     F(expired_reservations)},
    {"kvpage_rank_release_of_held_page_total", "counter",
     "pages_to_release entries refused because the page holds confirmed data.", NULL,
     F(release_of_held_page)},
};
#undef F

static uint64_t field_of(const struct kvp_rank_stats *st, size_t off)
{
    uint64_t v;
    memcpy(&v, (const char *)st + off, sizeof v);
    return v;
}

static void prom_requests(struct kvp_server *srv, struct kvp_buf *b)
{
    kvp__jw_lit(b,
                "# HELP kvpage_http_requests_total HTTP requests answered, by route and status.\n"
                "# TYPE kvpage_http_requests_total counter\n");
    char st[8];
    for (int r = 0; r < KVP_ROUTE_COUNT; r++)
        for (int s = 0; s < KVP_METRICS_NSTATUS; s++) {
            uint64_t n = atomic_load_explicit(&srv->metrics.cell[r][s].count, memory_order_relaxed);
            if (!n)
                continue;
            status_label(s, st);
            kvp__buf_printf(b, "kvpage_http_requests_total{route=\"%s\",status=\"%s\"} %llu\n",
                            kvp__route_name(r), st, (unsigned long long)n);
        }
    kvp__jw_lit(b, "# HELP kvpage_http_request_duration_seconds Time spent handling a request, by "
                   "route and status.\n"
                   "# TYPE kvpage_http_request_duration_seconds histogram\n");
    for (int r = 0; r < KVP_ROUTE_COUNT; r++)
        for (int s = 0; s < KVP_METRICS_NSTATUS; s++) {
            struct kvp_metrics_cell *c = &srv->metrics.cell[r][s];
            if (!atomic_load_explicit(&c->count, memory_order_relaxed))
                continue;
            status_label(s, st);
            /* Buckets are read one by one; the count printed is their sum, so
             * the +Inf bucket and _count always agree. */
            uint64_t cum = 0;
            for (int k = 0; k < KVP_METRICS_NBUCKETS; k++) {
                cum += atomic_load_explicit(&c->bucket[k], memory_order_relaxed);
                kvp__buf_printf(
                    b,
                    "kvpage_http_request_duration_seconds_bucket{route=\"%s\",status=\"%s\","
                    "le=\"%s\"} %llu\n",
                    kvp__route_name(r), st, bucket_le[k], (unsigned long long)cum);
            }
            uint64_t sum = atomic_load_explicit(&c->sum_ns, memory_order_relaxed);
            kvp__buf_printf(b,
                            "kvpage_http_request_duration_seconds_sum{route=\"%s\",status=\"%s\"} "
                            "%llu.%09llu\n",
                            kvp__route_name(r), st, (unsigned long long)(sum / 1000000000u),
                            (unsigned long long)(sum % 1000000000u));
            kvp__buf_printf(
                b,
                "kvpage_http_request_duration_seconds_count{route=\"%s\",status=\"%s\"} "
                "%llu\n",
                kvp__route_name(r), st, (unsigned long long)cum);
        }
}

/* A backend value as text: "12", "1.500000000", "true". */
static void put_value(struct kvp_buf *b, const struct kvp_meta_value *v, int json)
{
    if (v->type == KVP_VALUE_BOOL && json) {
        kvp__buf_printf(b, "%s", v->value ? "true" : "false");
    } else if (v->decimals > 0 && v->decimals < 20) {
        uint64_t scale = 1;
        for (int i = 0; i < v->decimals; i++)
            scale *= 10;
        kvp__buf_printf(b, "%llu.%0*llu", (unsigned long long)(v->value / scale), v->decimals,
                        (unsigned long long)(v->value % scale));
    } else {
        kvp__buf_printf(b, "%llu", (unsigned long long)v->value);
    }
}

static int prom_value(const struct kvp_meta_value *v, void *arg)
{
    struct kvp_buf *b = arg;
    kvp__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s", v->metric, v->help, v->metric,
                    v->type == KVP_VALUE_COUNTER ? "counter" : "gauge", v->metric);
    if (v->label) {
        kvp__buf_printf(b, "{%s=\"", v->label);
        label_value(b, v->label_value ? v->label_value : "");
        kvp__jw_lit(b, "\"}");
    }
    kvp__buf_put(b, " ", 1);
    put_value(b, v, 0);
    kvp__buf_put(b, "\n", 1);
    return 0;
}

/* The backend's values in /v1/stats: "section": {"key": value, ...}, ... */
struct json_values {
    struct kvp_buf *b;
    const char *section; /* the section open now, or NULL */
};

static int json_value(const struct kvp_meta_value *v, void *arg)
{
    struct json_values *j = arg;
    if (!j->section || strcmp(j->section, v->section)) {
        kvp__buf_printf(j->b, "%s, ", j->section ? "}" : "");
        kvp__jw_str(j->b, v->section, strlen(v->section));
        kvp__jw_lit(j->b, ": {");
        j->section = v->section;
    } else {
        kvp__jw_lit(j->b, ", ");
    }
    kvp__jw_str(j->b, v->key, strlen(v->key));
    kvp__jw_lit(j->b, ": ");
    put_value(j->b, v, 1);
    if (v->label) {
        kvp__jw_lit(j->b, ", ");
        kvp__jw_str(j->b, v->label, strlen(v->label));
        kvp__jw_lit(j->b, ": ");
        const char *lv = v->label_value ? v->label_value : "";
        kvp__jw_str(j->b, lv, strlen(lv));
    }
    return 0;
}

static uint64_t ld(atomic_uint_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

static void prom_conns(struct kvp_server *srv, struct kvp_buf *b)
{
    struct kvp_conn_stats *c = &srv->conns;
    kvp__buf_printf(
        b,
        "# HELP kvpage_connections_open Client connections open now.\n"
        "# TYPE kvpage_connections_open gauge\nkvpage_connections_open %llu\n"
        "# HELP kvpage_connections_accepted_total Client connections accepted.\n"
        "# TYPE kvpage_connections_accepted_total counter\nkvpage_connections_accepted_total %llu\n"
        "# HELP kvpage_connections_refused_total Client connections closed at once: over "
        "--max-conns-per-client (per_client) or --max-conns (total).\n"
        "# TYPE kvpage_connections_refused_total counter\n"
        "kvpage_connections_refused_total{reason=\"per_client\"} %llu\n"
        "kvpage_connections_refused_total{reason=\"total\"} %llu\n"
        "# HELP kvpage_connections_timed_out_total Connections closed by the server: idle for "
        "--idle-timeout (idle) or a request stalled for --request-timeout (request).\n"
        "# TYPE kvpage_connections_timed_out_total counter\n"
        "kvpage_connections_timed_out_total{phase=\"idle\"} %llu\n"
        "kvpage_connections_timed_out_total{phase=\"request\"} %llu\n",
        (unsigned long long)ld(&c->open), (unsigned long long)ld(&c->accepted),
        (unsigned long long)ld(&c->refused_client), (unsigned long long)ld(&c->refused_total),
        (unsigned long long)ld(&c->timeout_idle), (unsigned long long)ld(&c->timeout_request));
}

int kvp__metrics_prometheus(struct kvp_server *srv, struct kvp_buf *b)
{
    struct collect col = {0};
    int rc = kvp_meta_stats(srv->meta, collect_fn, &col);
    if (rc) {
        collect_free(&col);
        return rc;
    }
    prom_requests(srv, b);
    prom_conns(srv, b);
    kvp_meta_values(srv->meta, prom_value, b);
    for (size_t f = 0; f < sizeof rank_fields / sizeof rank_fields[0]; f++) {
        const struct rank_field *rf = &rank_fields[f];
        if (rf->help)
            kvp__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", rf->name, rf->help, rf->name,
                            rf->type);
        for (size_t i = 0; i < col.n; i++)
            for (size_t k = 0; k < col.rows[i].nranks; k++) {
                const struct kvp_rank_stats *st = &col.rows[i].ranks[k];
                kvp__buf_printf(b, "%s{deployment=\"", rf->name);
                label_value(b, col.rows[i].dep);
                kvp__jw_lit(b, "\",pool=\"");
                label_value(b, col.rows[i].pool);
                kvp__buf_printf(b, "\",rank=\"%u\"", st->rank);
                if (rf->state)
                    kvp__buf_printf(b, ",state=\"%s\"", rf->state);
                kvp__buf_printf(b, "} %llu\n", (unsigned long long)field_of(st, rf->off));
            }
    }
    /* Per namespace: keys its clients dropped because their pages failed
     * the integrity tag (a delete with "reason": "integrity"). */
    kvp__jw_lit(b,
                "# HELP kvpage_pages_rejected_total Keys whose page a client rejected (its bytes "
                "failed the integrity tag) and dropped.\n"
                "# TYPE kvpage_pages_rejected_total counter\n");
    for (size_t i = 0; i < col.n; i++) {
        kvp__jw_lit(b, "kvpage_pages_rejected_total{deployment=\"");
        label_value(b, col.rows[i].dep);
        kvp__jw_lit(b, "\",pool=\"");
        label_value(b, col.rows[i].pool);
        kvp__buf_printf(
            b, "\"} %llu\n",
            (unsigned long long)kvp__rejected_count(srv, col.rows[i].dep, col.rows[i].pool));
    }
    collect_free(&col);
    if ((rc = kvp__pins_prometheus(srv, b)) != 0)
        return rc;
    return b->oom ? -ENOMEM : 0;
}

static int stats_ns_fn(const char *dep, const char *pool, const struct kvp_rank_stats *ranks,
                       size_t nranks, void *arg)
{
    struct kvp_buf *b = arg;
    /* The list's opening bracket is the last byte written before the first namespace. */
    if (b->len && b->p[b->len - 1] != '[')
        kvp__jw_lit(b, ", ");
    kvp__jw_lit(b, "{\"deployment\": ");
    kvp__jw_str(b, dep, strlen(dep));
    kvp__jw_lit(b, ", \"pool\": ");
    kvp__jw_str(b, pool, strlen(pool));
    kvp__jw_lit(b, ", \"ranks\": [");
    for (size_t i = 0; i < nranks; i++) {
        const struct kvp_rank_stats *s = &ranks[i];
        kvp__buf_printf(
            b,
            "%s{\"rank\": %u, \"num_pages\": %llu, \"free\": %llu, \"reserved\": %llu, \"held\": "
            "%llu, "
            "\"keys\": %llu, \"hits\": %llu, \"misses\": %llu, \"allocations\": %llu, "
            "\"evictions\": %llu, \"expired_reservations\": %llu, \"release_of_held_page\": %llu}",
            i ? ", " : "", s->rank, (unsigned long long)s->num_pages, (unsigned long long)s->free,
            (unsigned long long)s->reserved, (unsigned long long)s->held,
            (unsigned long long)s->keys, (unsigned long long)s->hits, (unsigned long long)s->misses,
            (unsigned long long)s->allocations, (unsigned long long)s->evictions,
            (unsigned long long)s->expired_reservations,
            (unsigned long long)s->release_of_held_page);
    }
    kvp__jw_lit(b, "]}");
    return b->oom ? -ENOMEM : 0;
}

int kvp__metrics_stats_json(struct kvp_server *srv, struct kvp_buf *b)
{
    kvp__jw_lit(b, "{\"server\": {\"version\": \"" KVP_VERSION "\", \"uptime_seconds\": ");
    uint64_t up = kvp__mono_ns() - srv->started_ns;
    kvp__buf_printf(b, "%llu.%03llu, \"state\": ", (unsigned long long)(up / 1000000000u),
                    (unsigned long long)(up / 1000000u % 1000u));
    kvp__jw_str(b, srv->cfg.state ? srv->cfg.state : "",
                srv->cfg.state ? strlen(srv->cfg.state) : 0);
    /* The state's identity: what a page file's owner record compares. */
    const char *id = kvp_meta_identity(srv->meta);
    if (id) {
        kvp__jw_lit(b, ", \"identity\": ");
        kvp__jw_str(b, id, strlen(id));
    }
    kvp__jw_lit(b, "}, \"namespaces\": [");
    int rc = kvp_meta_stats(srv->meta, stats_ns_fn, b);
    if (rc)
        return rc;
    uint64_t total = 0;
    kvp__jw_lit(b, "], \"requests\": {\"by_route\": {");
    int first_route = 1;
    char st[8];
    for (int r = 0; r < KVP_ROUTE_COUNT; r++) {
        int first_status = 1;
        for (int s = 0; s < KVP_METRICS_NSTATUS; s++) {
            struct kvp_metrics_cell *c = &srv->metrics.cell[r][s];
            uint64_t n = atomic_load_explicit(&c->count, memory_order_relaxed);
            if (!n)
                continue;
            total += n;
            if (first_status) {
                kvp__buf_printf(b, "%s\"%s\": {", first_route ? "" : ", ", kvp__route_name(r));
                first_route = 0;
            }
            status_label(s, st);
            uint64_t sum = atomic_load_explicit(&c->sum_ns, memory_order_relaxed);
            kvp__buf_printf(b, "%s\"%s\": {\"count\": %llu, \"seconds\": %llu.%09llu}",
                            first_status ? "" : ", ", st, (unsigned long long)n,
                            (unsigned long long)(sum / 1000000000u),
                            (unsigned long long)(sum % 1000000000u));
            first_status = 0;
        }
        if (!first_status)
            kvp__jw_lit(b, "}");
    }
    kvp__buf_printf(b, "}, \"total\": %llu}", (unsigned long long)total);
    struct kvp_conn_stats *c = &srv->conns;
    kvp__buf_printf(
        b,
        ", \"connections\": {\"open\": %llu, \"accepted\": %llu, \"refused_per_client\": "
        "%llu, \"refused_total\": %llu, \"timed_out_idle\": %llu, "
        "\"timed_out_request\": %llu}",
        (unsigned long long)ld(&c->open), (unsigned long long)ld(&c->accepted),
        (unsigned long long)ld(&c->refused_client), (unsigned long long)ld(&c->refused_total),
        (unsigned long long)ld(&c->timeout_idle), (unsigned long long)ld(&c->timeout_request));
    struct json_values jv = {b, NULL};
    kvp_meta_values(srv->meta, json_value, &jv);
    if (jv.section)
        kvp__jw_lit(b, "}");
    if ((rc = kvp__pins_stats_json(srv, b)) != 0)
        return rc;
    kvp__jw_lit(b, "}");
    return b->oom ? -ENOMEM : 0;
}
