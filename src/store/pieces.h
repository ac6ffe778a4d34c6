/*
 * A small parallel-for for the store: kvp__pieces_run(p, n, fn, arg) calls
 * fn(arg, i) once for each i < n, on the pool's workers and the calling
 * thread, and returns when every call has returned. Any number of threads
 * may run at once on one pool; each call's pieces go to whoever is free.
 * Internal.
 */
#ifndef KVP_STORE_PIECES_H
#define KVP_STORE_PIECES_H

#include <stddef.h>

struct kvp__pieces;

/* threads: the most calls of fn at once for one run, the caller included
 * (threads - 1 workers are started). 0 or a negative errno. */
int kvp__pieces_open(unsigned threads, struct kvp__pieces **out);
void kvp__pieces_close(struct kvp__pieces *p);
void kvp__pieces_run(struct kvp__pieces *p, size_t n, void (*fn)(void *arg, size_t i), void *arg);

#endif
