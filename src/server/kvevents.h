/*
 * kvpage serve --kv-events: what the state holds, published as vLLM's KV
 * events (protocol.md, "KV events"). Nothing here runs unless the option is
 * given.
 */
#ifndef KVP_SERVER_KVEVENTS_H
#define KVP_SERVER_KVEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/meta.h"

enum { KVP_KVEV_HASH_AUTO, KVP_KVEV_HASH_SGLANG, KVP_KVEV_HASH_VLLM, KVP_KVEV_HASH_XXH3 };

/* The option's fields, named as vLLM's KVEventsConfig where it has them. */
struct kvp_kvev_cfg {
    char *spec; /* a copy of the option's value, cut up in place: the strings point into it */
    const char *endpoint, *replay_endpoint, *topic, *medium;
    uint64_t buffer_steps, hwm, max_queue_size, block_size;
    int array; /* format=array: the positional arrays of vLLM before its PR #42892 */
    int hash;  /* KVP_KVEV_HASH_* */
};

/* Parses "name=value,..." into cfg (defaults first): 0, or -EINVAL with a
 * sentence in why. */
int kvp__kvev_parse(const char *spec, struct kvp_kvev_cfg *cfg, char *why, size_t len);
void kvp__kvev_cfg_free(struct kvp_kvev_cfg *cfg);

struct kvp_kvev;
/* Opens the sockets, starts the publisher thread and watches meta (an
 * in-process state). data_dir (NULL: none) keeps the next sequence number.
 * 0, or -errno with a sentence in why. */
int kvp__kvev_start(const struct kvp_kvev_cfg *cfg, struct kvp_meta *meta, const char *data_dir,
                    struct kvp_kvev **out, char *why, size_t len);
/* Stops watching, publishes what is queued, stops the thread, closes. NULL: nothing. */
void kvp__kvev_stop(struct kvp_kvev *ev);

/* The block hash of a key, as the engines' own events carry it
 * (mode: KVP_KVEV_HASH_*); *is_signed: encode as int64. */
uint64_t kvp__kvev_block_hash(const char *key, size_t len, int mode, int *is_signed);

#endif
