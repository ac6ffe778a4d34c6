/* The seed of the in-process tables' hashes: random, one per process. */
#ifndef KVP_UTIL_SEED_H
#define KVP_UTIL_SEED_H

#include <stdint.h>

/*
 * The keys of the in-process key index, the pins' table and the block-hash
 * index come from clients. Unseeded, their buckets can be predicted: a
 * client that sends keys of one bucket makes every lookup of the namespace
 * walk one long chain (the others wait on its lock). Seeded with a number
 * drawn once per process, they cannot. Nothing that is kept on disk or sent
 * depends on it.
 */
uint64_t kvp__hash_seed(void);

#endif
