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
        /* 200 either way: a liveness probe must not restart a server that
         * serves reads and resumes writes by itself (protocol-notes). */
        char why[256];
        r->status = 200;
        r->content_type = "text/plain; charset=utf-8";
        kvp__buf_reset(&r->body);
        if (kvp_meta_health(c->srv->meta, why, sizeof why) != 0) {
            kvp__jw_lit(&r->body, "degraded: writes refused: ");
            kvp__buf_put(&r->body, why, strlen(why));
        } else {
            kvp__jw_lit(&r->body, "ok");
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
        /* The figures come from a remote store (redis://) that did not answer. */
        struct kvp_error err = {.code = rc, .rule = KVP_RULE_UNAVAILABLE};
        snprintf(err.msg, sizeof err.msg, "cannot read the statistics: %s", kvp_strerror(rc));
        kvp__reply_unavailable(c, &err);
    } else if (rc) {
        kvp__reply_internal(c, rc, "statistics");
    }
}
