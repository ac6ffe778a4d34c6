/*
 * The connection layer of the redis:// backend (src/meta/redis/redis.c): a small
 * pool of hiredis contexts per Redis node, the slot map of a Redis Cluster
 * with its MOVED and ASK redirections, scripts run by SHA, and the mapping of
 * every failure to a negative errno with KVP_RULE_UNAVAILABLE. Internal.
 */
#ifndef KVP_META_REDIS_CONN_H
#define KVP_META_REDIS_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>
#include "kvpage/error.h"

#define KVP_REDIS_MAX_SEEDS 16

struct kvp__rcfg {
    char *user, *pass; /* NULL: no AUTH */
    int db;
    uint32_t connect_timeout_ms, timeout_ms;
    size_t nseeds;
    char *host[KVP_REDIS_MAX_SEEDS];
    int port[KVP_REDIS_MAX_SEEDS];
    /* redis-sentinel://: the seeds are sentinels, asked for the address of
     * the master of this name (at open, and again after a call found the
     * master gone or demoted). NULL: the seeds are Redis nodes. */
    char *master_name;
    /* ?wait=N&wait_ms=T: after every command that may write, WAIT N T on
     * its connection; fewer replicas than N fail the call (0: no WAIT). */
    int wait_replicas;
    uint32_t wait_ms;
    /* Where an outage of a node and its end are said, once each (may be
     * NULL): level 1 (warning) when a call first fails for want of the node,
     * 2 (information) when it answers again. */
    void (*log)(void *arg, int level, const char *msg);
    void *log_arg;
};

/* A Lua script, run with EVALSHA; its SHA is learnt from SCRIPT LOAD. */
struct kvp__rscript {
    const char *body;
    int change;   /* a change acknowledged to the caller: ?wait= waits for it (not for an
                     LRU touch of a lookup, nor a read) */
    char sha[41]; /* "" until loaded once (guarded by the connection's lock) */
};

struct kvp__rconn;

/* Frees a reply of this layer (every reply it hands out: its contexts build
 * them with their own functions, so freeReplyObject must not be used). */
void kvp__rreply_free(redisReply *r);

/* Connects to a seed (with several seeds, or when a seed is a cluster node,
 * also reads the slot map; with master_name, asks the sentinels first). Takes over cfg's strings.
 * 0, or a negative errno with err (KVP_RULE_UNAVAILABLE). */
int kvp__rconn_open(struct kvp__rconn **out, struct kvp__rcfg *cfg, struct kvp_error *err);
void kvp__rconn_close(struct kvp__rconn *c);

/* The cluster slot of a hash tag's contents (CRC16 mod 16384). */
unsigned kvp__redis_slot(const char *tag, size_t len);

/*
 * Runs one command on the node that serves slot (-1: any node), following
 * redirections. With script, argv is EVALSHA with argv[1] a placeholder for
 * the SHA, which is filled in (and the script loaded on NOSCRIPT).
 * idempotent: the command may be repeated on a fresh connection after a
 * pooled one turned out to be dead. *out: the reply (free with
 * kvp__rreply_free), never an error reply. 0, or a negative errno with err
 * (KVP_RULE_UNAVAILABLE, msg naming the node and the cause).
 */
int kvp__rconn_cmd(struct kvp__rconn *c, int slot, struct kvp__rscript *script, int idempotent,
                   int argc, const char **argv, const size_t *lens, redisReply **out,
                   struct kvp_error *err);

/* One command of kvp__rconn_multi: as kvp__rconn_cmd's arguments, and its
 * result (reply or rc with err). */
struct kvp__rcmd {
    int slot;
    struct kvp__rscript *script;
    int argc;
    const char **argv;
    size_t *lens;
    redisReply *reply;
    int rc;
    struct kvp_error err;
};

/*
 * Runs n idempotent commands, pipelined: those for one node go out on one
 * connection together and their replies are read after. A command that
 * meets a redirection, an unloaded script or a failed connection is run
 * again alone by kvp__rconn_cmd. Returns the first command's failure (its
 * err copied to err), or 0; every reply is the caller's to free.
 */
int kvp__rconn_multi(struct kvp__rconn *c, struct kvp__rcmd *cmds, size_t n, struct kvp_error *err);

/* Calls fn for each node that serves slots (the single node outside a
 * cluster) with a reply of the command, or the error. Stops at fn's non-zero
 * return, which it returns. */
typedef int (*kvp__rnode_fn)(void *arg, const char *node, redisReply *reply, int rc,
                             const struct kvp_error *err);
int kvp__rconn_each_master(struct kvp__rconn *c, int argc, const char **argv, kvp__rnode_fn fn,
                           void *arg);

/* Pings every master: 0, or the first failure with why (may be NULL). */
int kvp__rconn_ping(struct kvp__rconn *c, char *why, size_t len);

/* Figures of the connection layer for kvp_meta_values. */
struct kvp__rconn_stats {
    uint64_t connects, failures, redirects, script_loads;
    uint64_t nodes;
    uint64_t waits, wait_short;     /* WAITs sent; those that saw fewer replicas than asked */
    uint64_t master_asks, switches; /* questions to the sentinels; master changes followed */
    uint64_t batches, batched;      /* combined round trips; the commands they carried */
    char master[80];                /* with sentinels: the master now ("" unknown) */
};
void kvp__rconn_stats(struct kvp__rconn *c, struct kvp__rconn_stats *s);

struct kvp_meta;

/*
 * What the Redis behind a redis:// handle promises for changes it has
 * acknowledged, from CONFIG GET on each master (the weakest wins): 2
 * (appendonly yes, appendfsync always: nothing acknowledged is lost when
 * Redis restarts), 1 (appendfsync everysec: up to about a second), 0 (no AOF,
 * or appendfsync no: everything since the last RDB save), -1 unknown (CONFIG
 * disabled or renamed, or Redis unreachable): the levels KVP_DURABLE_* of
 * kvp_meta_info, which is how the rest of kvpage asks it. buf (may be NULL)
 * gets a text such as "appendonly yes, appendfsync everysec". -EINVAL for a
 * handle of another backend. (src/meta/redis/redis.c)
 */
int kvp__redis_durability(struct kvp_meta *m, char *buf, size_t len);

#endif
