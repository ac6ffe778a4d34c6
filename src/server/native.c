/* Native routes (protocol.md §4): GET /healthz, /metrics, /v1/stats. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "server/server.h"
#include "server/status_page.h"

void kvp__native_handle(struct kvp_ctx *c, int route)
{
    struct kvp_reply *r = c->rep;
    int rc = 0;
    switch (route) {
    case KVP_ROUTE_HEALTHZ: {
        /* 200 whatever the state says: a liveness probe must not restart a
         * server that resumes by itself once its disk or its Redis does
         * (a restart would not help either; protocol-notes). */
        char why[256];
        int scope;
        r->status = 200;
        r->content_type = "text/plain; charset=utf-8";
        kvp__buf_reset(&r->body);
        if (kvp_meta_health_scope(c->srv->meta, &scope, why, sizeof why) == 0) {
            kvp__jw_lit(&r->body, "ok");
        } else if (scope == KVP_HEALTH_ALL) {
            kvp__jw_lit(&r->body, "unavailable: ");
            kvp__buf_put(&r->body, why, strlen(why));
            kvp__jw_lit(&r->body, "; reads and writes fail with 503 until it answers");
        } else {
            kvp__jw_lit(&r->body, "degraded: writes refused: ");
            kvp__buf_put(&r->body, why, strlen(why));
        }
        return;
    }
    case KVP_ROUTE_STATUS:
        r->status = 200;
        r->content_type = "text/html; charset=utf-8";
        kvp__buf_reset(&r->body);
        kvp__buf_put(&r->body, kvp__status_html, sizeof kvp__status_html - 1);
        return;
    case KVP_ROUTE_METRICS:
        r->status = 200;
        r->content_type = "text/plain; version=0.0.4; charset=utf-8";
        kvp__buf_reset(&r->body);
        rc = kvp__metrics_prometheus(c->srv, &r->body);
        break;
    case KVP_ROUTE_STATS:
        kvp__reply_json(c);
        rc = kvp__metrics_stats_json(c->srv, &r->body);
        break;
    default:
        kvp__reply_error(c, 404, "Not Found");
        return;
    }
    if (rc == -ECONNREFUSED || rc == -ETIMEDOUT || rc == -ECONNRESET || rc == -EHOSTUNREACH ||
        rc == -ENOTCONN || rc == -EPIPE || rc == -EIO) {
        /* The figures come from a remote store (redis://) that did not
         * answer: its health names the node and the cause. */
        struct kvp_error err = {.code = rc, .rule = KVP_RULE_UNAVAILABLE};
        char why[200];
        if (kvp_meta_health(c->srv->meta, why, sizeof why) == 0 || !why[0])
            snprintf(why, sizeof why, "%s", kvp_strerror(rc));
        snprintf(err.msg, sizeof err.msg, "cannot read the statistics: %s", why);
        kvp__reply_unavailable(c, &err);
    } else if (rc) {
        kvp__reply_internal(c, rc, "statistics");
    }
}
