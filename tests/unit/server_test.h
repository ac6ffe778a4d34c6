/*
 * server_test.h — the server's request handler without sockets, for its
 * tests (test_server_handle.c, test_error_fields.c): a server over an
 * in-memory metadata handle, and one request through kvp__server_handle.
 */
#ifndef KVP_SERVER_TEST_H
#define KVP_SERVER_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpage/meta.h"
#include "server/server.h"

/* srv with the default configuration over a new mem: handle (returned: the
 * test closes it), and rep ready; a test that cannot have one exits 1. */
static inline struct kvp_meta *server_test_open(struct kvp_server *srv, struct kvp_reply *rep)
{
    struct kvp_meta *meta;
    if (kvp_meta_open(NULL, &meta)) {
        fprintf(stderr, "kvp_meta_open failed\n");
        exit(1);
    }
    struct kvp_server_config cfg = {0};
    kvp__server_init(srv, meta, &cfg);
    kvp__reply_init(rep);
    return meta;
}

/* req (its path and body C strings: their lengths are set here) into rep. */
static inline void server_test_call(struct kvp_server *srv, struct kvp_reply *rep,
                                    struct kvp_request req)
{
    req.path_len = strlen(req.path);
    req.body_len = req.body ? strlen(req.body) : 0;
    kvp__server_handle(srv, &req, rep);
}

#endif
