/*
 * kvpage serve --kv-events: every page a key gets or loses, in every
 * namespace, published the way vLLM's engines publish their KV events, so
 * that a KV-aware router sees the storage tier with no glue of its own.
 *
 * The wire format follows the code read at these commits (read, not copied):
 * vLLM vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34
 * (ZmqEventPublisher: a PUB socket sending topic, the sequence number as 8
 * bytes big-endian from 0 and the payload; a ROUTER replay socket answering
 * an 8-byte start with (seq, payload) pairs and (-1, "")); the batch as
 * NVIDIA Dynamo's vLLM wire types decode it (an array [ts, [events],
 * data_parallel_rank]; events maps tagged "type", or tagged arrays).
 * parent_block_hash and token_ids as vLLM's engine fills them
 * (vllm/v1/core/block_pool.py @ c59cb7941357443da7c5eef75cfa8697d683d228,
 * BlockPool.cache_full_blocks: one BlockStored per run of new full blocks
 * of a request, parent_block_hash the block before the first, token_ids
 * the run's tokens one after the other, block_size tokens a block): the
 * parents and tokens a confirmation names (kvp_meta_confirm_ex).
 *
 * The metadata layer tells on_change (with a namespace's lock held) of each
 * change; on_change turns it into a small record on a bounded queue and
 * returns: no socket, no allocation. The publisher thread drains the queue,
 * groups records into batches, sends them and keeps the last buffer_steps
 * for replay. A subscriber that is slow or absent costs the server nothing:
 * the publisher never waits for the network (the PUB socket drops past its
 * high-water mark; the subscriber sees the gap in the sequence numbers and
 * the replay socket fills it). A full queue (max_queue_size changes the
 * publisher has not encoded yet: a clear of many keys) makes the change wait
 * for room, as vLLM's publish() does, rather than lose it: a lost change
 * would leave a router believing in a page that is gone.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <xxhash.h>
#include <zmq.h>

#include "server/kvevents.h"
#include "server/log.h"
#include "util/size.h"

/* The next sequence number is kept in the data directory this far ahead of
 * the one in use, so that a crash never lets a restart reuse a number. */
#define SEQ_STEP ((uint64_t)1 << 16)
#define SEQ_FILE "kv-events.seq"
/* The inventory's first room (records); records per batch (a batch is one
 * message: ZeroMQ and each subscriber pay per message, and 1024 made a
 * Python subscriber take 6% of a core at 3 million changes a second;
 * 4096 took a third off it, and off ZeroMQ's thread). */
#define INV_FIRST 4096
#define BATCH_MAX 4096
/* How long the publisher lets changes gather once woken (5 ms; vLLM
 * publishes once per engine step, tens of ms), cut short when the queue is
 * half full. Fewer, larger batches cost the publisher, ZeroMQ and every
 * subscriber less per change, and wake them less often; but the queue a
 * request thread writes into grows with the tick, and past the core's cache
 * (20 ms at 3 million changes a second: 4 MB) each record is a miss. */
#define TICK_MS 5
/* The replay ring keeps the last buffer_steps batches, and at most this many
 * bytes of them (buffer_steps of vLLM's default 10000 full batches would be
 * 370 MB): a replay from before the oldest kept gets the inventory. */
#define RING_BYTES ((size_t)64 << 20)

#ifdef __SANITIZE_THREAD__
/* Debian's libzmq is not built with ThreadSanitizer: the lock-free pipes that
 * carry a message from the thread that sends it to ZeroMQ's I/O thread are
 * invisible to it, and every message sent reads as a race inside libzmq.
 * (Our buffers never cross: zmq_send copies them.) */
const char *__tsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__tsan_default_suppressions(void)
{
    return "race:libzmq.so\n";
}
#endif

/* ---------------------------------------------------------------- the option */

static int set_u64(const char *name, const char *v, uint64_t lo, uint64_t *out, char *why,
                   size_t len)
{
    uint64_t n;
    if (kvp__parse_size(v, 0, &n) || n < lo || n > (UINT64_C(1) << 40)) {
        snprintf(why, len, "%s=%s: expected an integer from %" PRIu64, name, v, lo);
        return -EINVAL;
    }
    *out = n;
    return 0;
}

int kvp__kvev_parse(const char *spec, struct kvp_kvev_cfg *cfg, char *why, size_t len)
{
    /* vLLM's defaults (vllm/config/kv_events.py) but the medium. */
    *cfg = (struct kvp_kvev_cfg){.endpoint = "tcp://*:5557",
                                 .topic = "",
                                 .medium = "STORAGE",
                                 .buffer_steps = 10000,
                                 .hwm = 100000,
                                 .max_queue_size = 100000,
                                 .block_size = 16};
    if (!(cfg->spec = strdup(spec))) {
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    for (char *p = cfg->spec, *next; p && *p; p = next) {
        next = strchr(p, ',');
        if (next)
            *next++ = 0;
        char *v = strchr(p, '=');
        if (!v) {
            snprintf(why, len, "'%s': expected name=value", p);
            goto bad;
        }
        *v++ = 0;
        int rc = 0;
        if (!strcmp(p, "endpoint"))
            cfg->endpoint = v;
        else if (!strcmp(p, "replay_endpoint"))
            cfg->replay_endpoint = *v ? v : NULL;
        else if (!strcmp(p, "topic"))
            cfg->topic = v;
        else if (!strcmp(p, "buffer_steps"))
            rc = set_u64(p, v, 1, &cfg->buffer_steps, why, len);
        else if (!strcmp(p, "hwm"))
            rc = set_u64(p, v, 0, &cfg->hwm, why, len);
        else if (!strcmp(p, "max_queue_size"))
            rc = set_u64(p, v, 1, &cfg->max_queue_size, why, len);
        else if (!strcmp(p, "block_size"))
            rc = set_u64(p, v, 1, &cfg->block_size, why, len);
        else if (!strcmp(p, "medium")) {
            if (strcmp(v, "STORAGE") && strcmp(v, "EXTERNAL") && strcmp(v, "DISK")) {
                snprintf(why, len, "medium=%s: expected STORAGE, EXTERNAL or DISK", v);
                rc = -EINVAL;
            }
            cfg->medium = v;
        } else if (!strcmp(p, "format")) {
            if (strcmp(v, "map") && strcmp(v, "array")) {
                snprintf(why, len, "format=%s: expected map or array", v);
                rc = -EINVAL;
            }
            cfg->array = !strcmp(v, "array");
        } else if (!strcmp(p, "hash")) {
            static const char *const names[] = {"auto", "sglang", "vllm", "xxh3"};
            rc = -EINVAL;
            for (int i = 0; i < 4; i++)
                if (!strcmp(v, names[i])) {
                    cfg->hash = i;
                    rc = 0;
                }
            if (rc)
                snprintf(why, len, "hash=%s: expected auto, sglang, vllm or xxh3", v);
        } else {
            snprintf(why, len,
                     "unknown field '%s' (endpoint, replay_endpoint, topic, buffer_steps, hwm, "
                     "max_queue_size, medium, format, block_size, hash)",
                     p);
            rc = -EINVAL;
        }
        if (rc)
            goto bad;
    }
    if (!*cfg->endpoint) {
        snprintf(why, len, "endpoint must not be empty");
        goto bad;
    }
    for (const char *b = strchr(cfg->topic, '{'); b; b = strchr(b + 1, '{'))
        if (strncmp(b, "{deployment}", 12) && strncmp(b, "{pool}", 6)) {
            snprintf(why, len, "topic=%s: expected {deployment} or {pool} at '{'", cfg->topic);
            goto bad;
        }
    return 0;
bad:
    kvp__kvev_cfg_free(cfg);
    return -EINVAL;
}

void kvp__kvev_cfg_free(struct kvp_kvev_cfg *cfg)
{
    free(cfg->spec);
    cfg->spec = NULL;
}

/* ---------------------------------------------------------------- block hashes */

/* 16 + a byte's hex value, 0 for a byte that is not a hex digit: one table
 * for both the scan and the value (the publisher hashes every change's key). */
#define D(c, v) [c] = 16 + (v)
static const uint8_t hexval[256] = {
    D('0', 0),  D('1', 1),  D('2', 2),  D('3', 3),  D('4', 4),  D('5', 5),  D('6', 6),  D('7', 7),
    D('8', 8),  D('9', 9),  D('a', 10), D('b', 11), D('c', 12), D('d', 13), D('e', 14), D('f', 15),
    D('A', 10), D('B', 11), D('C', 12), D('D', 13), D('E', 14), D('F', 15)};
#undef D

/* The first n hex digits of s as a number (n <= 16, all hex). */
/* The number the 16 hex digits at s spell (the caller has checked them):
 * all at once where SSE2 is (a chain of 16 shifts was half of a change's
 * cost on the request's thread, bench/README.md). */
static uint64_t hex_u64_16(const char *s)
{
#ifdef __SSE2__
    __m128i x = _mm_loadu_si128((const __m128i *)s);
    __m128i l = _mm_or_si128(x, _mm_set1_epi8(0x20)); /* 'A'..'F' to 'a'..'f'; digits keep */
    __m128i letter = _mm_cmpgt_epi8(l, _mm_set1_epi8('9'));
    __m128i nib = _mm_sub_epi8(_mm_sub_epi8(l, _mm_set1_epi8('0')),
                               _mm_and_si128(letter, _mm_set1_epi8('a' - '0' - 10)));
    /* Each 16-bit lane holds two digits, the first in its low byte. */
    __m128i pair = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(nib, _mm_set1_epi16(0xff)), 4),
                                _mm_srli_epi16(nib, 8));
    uint64_t v = (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(pair, pair));
    return __builtin_bswap64(v); /* the first digits are the most significant */
#else
    uint64_t v = 0;
    for (size_t i = 0; i < 16; i++)
        v = v << 4 | (hexval[(unsigned char)s[i]] & 15);
    return v;
#endif
}

/* How many of s's n bytes are hex digits before the first that is not:
 * sixteen at a time while they all are (a key is 32 or 64 digits; the scan
 * was a third of the publisher's time with a table lookup per byte). */
static size_t hex_run(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
#ifdef __SSE2__
    /* Signed byte compares: a byte of 0x80 or more is below '0' and 'a'. */
    const __m128i lo_d = _mm_set1_epi8('0' - 1), hi_d = _mm_set1_epi8('9' + 1);
    const __m128i lo_a = _mm_set1_epi8('a' - 1), hi_a = _mm_set1_epi8('f' + 1);
    const __m128i case_bit = _mm_set1_epi8(0x20);
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(u + i));
        __m128i l = _mm_or_si128(x, case_bit); /* 'A'..'F' to 'a'..'f' */
        __m128i dig = _mm_and_si128(_mm_cmpgt_epi8(x, lo_d), _mm_cmplt_epi8(x, hi_d));
        __m128i alp = _mm_and_si128(_mm_cmpgt_epi8(l, lo_a), _mm_cmplt_epi8(l, hi_a));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(dig, alp));
        if (m != 0xffff)
            return i + (size_t)__builtin_ctz(~m);
    }
#else
    for (; i + 8 <= n; i += 8)
        if (!(hexval[u[i]] & hexval[u[i + 1]] & hexval[u[i + 2]] & hexval[u[i + 3]] &
              hexval[u[i + 4]] & hexval[u[i + 5]] & hexval[u[i + 6]] & hexval[u[i + 7]] & 16))
            break;
#endif
    while (i < n && hexval[u[i]])
        i++;
    return i;
}

/*
 * SGLang's page hash is a SHA-256 hex string, its events carry the first 16
 * hex digits as a signed int64 (hash_str_to_int64); vLLM's connector keys are
 * hex block hashes, its events the last 8 bytes as a uint64
 * (maybe_convert_block_hash). auto: 64 hex digits, alone or followed by a
 * suffix that is not hex (SGLang's "-k", "-v", "_pool"), are SGLang's; any
 * other key of 16 or more hex digits only, or ending in ':' and 16 or more
 * hex digits only (kvpage's vLLM tier), is vLLM's; anything else (and a key
 * the chosen rule cannot read) is the XXH3-64 of its bytes.
 */
uint64_t kvp__kvev_block_hash(const char *key, size_t len, int mode, int *is_signed)
{
    size_t h = hex_run(key, len);
    /* kvpage's vLLM tier names a block IDENTITY:HEX (the block's key bytes):
     * the part after the last ':' is the block's (a key all hex has none). */
    const char *colon = h < len ? memrchr(key + h, ':', len - h) : NULL;
    if (colon && mode != KVP_KVEV_HASH_XXH3 && mode != KVP_KVEV_HASH_SGLANG) {
        size_t tail = len - (size_t)(colon + 1 - key);
        if (tail >= 16 && hex_run(colon + 1, tail) == tail) {
            *is_signed = 0;
            return hex_u64_16(colon + 1 + tail - 16);
        }
    }
    *is_signed = 0;
    if (mode == KVP_KVEV_HASH_AUTO)
        mode = h == 64                 ? KVP_KVEV_HASH_SGLANG
               : h == len && len >= 16 ? KVP_KVEV_HASH_VLLM
                                       : KVP_KVEV_HASH_XXH3;
    if (mode == KVP_KVEV_HASH_SGLANG && h >= 16) {
        *is_signed = 1;
        return hex_u64_16(key);
    }
    if (mode == KVP_KVEV_HASH_VLLM && h == len && len >= 16)
        return hex_u64_16(key + len - 16);
    return XXH3_64bits(key, len);
}

/* ---------------------------------------------------------------- the publisher */

/* A change: 32 bytes. A key of more than KEY_INLINE bytes (every engine's)
 * is hashed at once, on the request's thread (len KEY_HASHED: 16 hex digits
 * read, or XXH3); a shorter one travels in the record (len) and the
 * publisher hashes it. The queue's records are the request thread's biggest
 * cost: records of 88 bytes, each key's bytes carried for the publisher to
 * hash, filled a megabyte of the core's cache every tick and slowed the
 * key index's lookups by 40%; hashed here, a record is a third of that
 * (bench/README.md, issue 38).
 *
 * A stored page whose confirmation named its parent key or its tokens
 * (kvp_meta_confirm_ex) is followed by records of its own: REC_PARENT (the
 * parent key, as a change's key) and REC_TOKENS (up to TOK_INLINE tokens
 * each, len of them). The records of one change are never parted: staged,
 * queued and batched together. A change without them stays one record. */
#define KEY_INLINE 16
#define KEY_HASHED UINT16_MAX
#define REC_PARENT 3
#define REC_TOKENS 4
#define TOK_INLINE (KEY_INLINE / 4)
struct rec {
    const struct kvp_ns *ns; /* namespaces live as long as the handle */
    uint32_t rank;
    uint8_t kind; /* KVP_CHANGE_*, REC_PARENT, REC_TOKENS */
    uint8_t is_signed;
    uint16_t len;
    union {
        uint64_t hash; /* len KEY_HASHED: its block hash */
        char key[KEY_INLINE];
        uint32_t tok[TOK_INLINE];
    } u;
};
_Static_assert(sizeof(struct rec) == 32, "a queued change stays 32 bytes");

/* Whether r continues the change before it. */
static inline int rec_more(const struct rec *r)
{
    return r->kind >= REC_PARENT;
}

struct recs {
    struct rec *v;
    size_t n, cap;
};

/* A page of the inventory: its block hash computed (a third of a struct rec:
 * an inventory may hold millions). A page whose lineage is kept (its parent,
 * its tokens) points at it in lins, its tokens in tok: a page with none
 * costs nothing more. */
struct inv_rec {
    const struct kvp_ns *ns;
    uint64_t hash;
    uint32_t rank;
    uint32_t is_signed : 1;
    uint32_t lin : 31; /* 0: none; else its index in lins, plus 1 */
};
_Static_assert(sizeof(struct inv_rec) == 24, "an inventory page stays 24 bytes");
/* 24 bytes and 4 a token, per page that has a lineage. */
struct inv_lin {
    uint64_t parent; /* the parent's block hash */
    size_t tok;      /* its tokens: tok[tok, tok + ntok) */
    uint32_t ntok;
    uint8_t has_parent, parent_signed;
};
struct inv_recs {
    struct inv_rec *v;
    size_t n, cap;
    struct inv_lin *lins;
    size_t nlins, caplins;
    uint32_t *tok;
    size_t ntok, captok;
};

struct sent {
    uint64_t seq;
    char *payload;
    size_t len, cap; /* cap: payload's room, reused when the slot is */
};

/* A namespace's topic (the option's topic naming {deployment} or {pool}). */
struct ns_topic {
    const struct kvp_ns *ns;
    char *topic;
    size_t len;
    struct ns_topic *next;
};

struct kvp_kvev {
    struct kvp_kvev_cfg cfg;
    struct kvp_meta *meta;
    unsigned gen;   /* this publisher's number in the process (a thread's stage notes it) */
    char *seq_path; /* NULL: --data-dir none */
    char *seq_name; /* the state's counter of the number, with no data directory (Redis) */
    void *zctx, *pub, *replay;
    const char *topic; /* the topic, or its template when per_ns */
    size_t topic_len;
    int per_ns;            /* a topic per namespace: a request thread adds a namespace's to
                            * topics when it first sees its changes; the publisher reads it */
    pthread_mutex_t tlock; /* guards topics */
    struct ns_topic *topics;
    int efd; /* wakes the thread: records queued, or stop */
    pthread_t thread;
    atomic_int stop;
    /* The state lost changes before telling them (KVP_CHANGE_LOST): the
     * publisher skips a sequence number and forgets its batches, so that
     * each subscriber sees a gap, asks for a replay and gets the inventory. */
    atomic_int lost;

    pthread_mutex_t qlock; /* guards q, qlen, waiting */
    pthread_cond_t room;   /* the queue has room again */
    struct rec *q;         /* qcap records, the first qlen queued */
    size_t qcap, qlen, waiting;

    /* The inventory, collected by a thread of its own (inventory_main) while
     * the publisher goes on draining: a change waiting for room in the queue
     * holds its namespace's lock, which the inventory needs. */
    pthread_t inv_thread;
    atomic_int inv_done;
    struct inv_recs inv;
    int inv_short; /* out of memory for it: some pages left out */

    /* The publisher thread's own. */
    const struct kvp_ns *cur_ns; /* the batch's namespace (NULL: none) and its topic */
    const char *cur_topic;
    size_t cur_topic_len;
    uint64_t next_seq, seq_limit;
    struct sent *ring; /* the last buffer_steps batches, oldest at ring_head */
    size_t ring_head, ring_n;
    size_t ring_mem; /* bytes of every slot's buffer, at most RING_BYTES past the newest */
    struct recs work;
    struct run *runs; /* a batch's events (pack_batch): BATCH_MAX + STAGE records at most */
    msgpack_sbuffer sb;
};

/* Records the next sequence number (or the limit) in the data directory,
 * durably: written aside, synced, renamed; or in the state's counter, when
 * it is at most expect (the limit this process recorded: a server sharing
 * the name may have raised it). 0 or -errno. */
static int seq_write(const struct kvp_kvev *ev, uint64_t expect, uint64_t v)
{
    if (ev->seq_name)
        return kvp_meta_counter(ev->meta, ev->seq_name, expect, v, NULL, NULL);
    if (!ev->seq_path)
        return 0;
    char tmp[4200], text[32];
    snprintf(tmp, sizeof tmp, "%s.tmp", ev->seq_path);
    int n = snprintf(text, sizeof text, "%" PRIu64 "\n", v);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = write(fd, text, (size_t)n) == n && fsync(fd) == 0 ? 0 : -EIO;
    close(fd);
    if (!rc && rename(tmp, ev->seq_path) != 0)
        rc = -errno;
    return rc;
}

/* The changes of the operation in progress on this thread, queued in one
 * piece at its end (or when full): one lock of the queue per operation, not
 * per page. The operation holds its namespace's lock meanwhile, so the
 * order of each namespace's changes is kept. */
#define STAGE 640 /* room for a page of 2,552 tokens (told_extra) */
/* initial-exec: the executable's own, reached without a call. */
static _Thread_local __attribute__((tls_model("initial-exec"))) struct {
    size_t n;
    unsigned seen_gen; /* the namespace whose topic this thread saw added last */
    const struct kvp_ns *seen_ns;
    struct rec r[STAGE];
} stage;

static atomic_uint kvev_gens;

/* The topic's template with the namespace's names, into out (NULL: only the
 * length); returns the length. */
static size_t topic_fill(const char *t, const char *deployment, const char *pool, char *out)
{
    size_t n = 0;
    while (*t) {
        const char *v = NULL;
        size_t skip = 0;
        if (!strncmp(t, "{deployment}", 12))
            v = deployment, skip = 12;
        else if (!strncmp(t, "{pool}", 6))
            v = pool, skip = 6;
        if (v) {
            size_t k = strlen(v);
            if (out)
                memcpy(out + n, v, k);
            n += k;
            t += skip;
        } else {
            if (out)
                out[n] = *t;
            n++;
            t++;
        }
    }
    return n;
}

/* Adds c's namespace's topic if it has none yet: once per namespace and
 * request thread, the lock and the allocation (a namespace's first change). */
static void topic_note(struct kvp_kvev *ev, const struct kvp_meta_change *c)
{
    pthread_mutex_lock(&ev->tlock);
    struct ns_topic *t = ev->topics;
    while (t && t->ns != c->ns)
        t = t->next;
    if (!t && (t = malloc(sizeof *t))) {
        t->len = topic_fill(ev->topic, c->deployment, c->pool, NULL);
        if ((t->topic = malloc(t->len + 1))) {
            topic_fill(ev->topic, c->deployment, c->pool, t->topic);
            t->topic[t->len] = 0;
            t->ns = c->ns;
            t->next = ev->topics;
            ev->topics = t;
        } else {
            free(t);
            t = NULL; /* the publisher then sends the template itself */
        }
    }
    pthread_mutex_unlock(&ev->tlock);
    if (t) {
        stage.seen_gen = ev->gen;
        stage.seen_ns = c->ns;
    }
}

/* The publisher's: ns's topic into ev->cur_topic (NULL: the batch has no
 * namespace). */
static void topic_set(struct kvp_kvev *ev, const struct kvp_ns *ns)
{
    if (!ev->per_ns || (ns && ns == ev->cur_ns))
        return;
    ev->cur_ns = ns;
    ev->cur_topic = ev->topic;
    ev->cur_topic_len = ev->topic_len;
    if (!ns)
        return;
    pthread_mutex_lock(&ev->tlock);
    for (const struct ns_topic *t = ev->topics; t; t = t->next)
        if (t->ns == ns) {
            ev->cur_topic = t->topic;
            ev->cur_topic_len = t->len;
            break;
        }
    pthread_mutex_unlock(&ev->tlock);
}

static void poke(struct kvp_kvev *ev)
{
    uint64_t one = 1;
    ssize_t w = write(ev->efd, &one, sizeof one);
    (void)w; /* a full counter still wakes the thread */
}

static void stage_flush(struct kvp_kvev *ev)
{
    if (!stage.n)
        return;
    pthread_mutex_lock(&ev->qlock);
    /* The publisher is woken by the first change after it drained (it
     * then lets more gather for TICK_MS), and again when the queue gets
     * half full or full (to cut that short): a few wakes per tick, not
     * one per operation. */
    size_t before = ev->qlen, half = ev->qcap / 2 + 1;
    int wake = before == 0;
    for (size_t i = 0; i < stage.n;) {
        /* Whole changes only (on_change keeps each within the queue). */
        size_t room = ev->qcap - ev->qlen, k = stage.n - i < room ? stage.n - i : room;
        while (k && i + k < stage.n && rec_more(&stage.r[i + k]))
            k--;
        if (!k) {
            poke(ev);
            ev->waiting++;
            pthread_cond_wait(&ev->room, &ev->qlock);
            ev->waiting--;
            continue;
        }
        memcpy(&ev->q[ev->qlen], &stage.r[i], k * sizeof *ev->q);
        ev->qlen += k;
        i += k;
    }
    wake |= before < half && ev->qlen >= half;
    pthread_mutex_unlock(&ev->qlock);
    stage.n = 0;
    if (wake)
        poke(ev);
}

/* A record of c's namespace and rank carrying key (the change's or its
 * parent's). */
static void rec_key(const struct kvp_kvev *ev, struct rec *r, const struct kvp_meta_change *c,
                    int kind, const char *key, size_t len)
{
    r->ns = c->ns;
    r->rank = c->rank;
    r->kind = (uint8_t)kind;
    if (len <= KEY_INLINE) {
        r->len = (uint16_t)len;
        memcpy(r->u.key, key, len);
    } else {
        int sg;
        r->len = KEY_HASHED;
        r->u.hash = kvp__kvev_block_hash(key, len, ev->cfg.hash, &sg);
        r->is_signed = (uint8_t)sg;
    }
}

/* The records a stored page with a parent (or not) and ntok tokens takes,
 * at most most of them: the tokens of a huge page are not told (*ntok 0),
 * nor, past that, its parent (1). */
static size_t told_extra(int parent, size_t *ntok, size_t most)
{
    size_t need = 1 + !!parent + (*ntok + TOK_INLINE - 1) / TOK_INLINE;
    if (need > most) {
        *ntok = 0;
        need = 1 + !!parent;
    }
    return need > most ? 1 : need;
}

/* The parent and tokens of a stored page, in records after its own (within
 * the stage and the queue: else they are left out). */
static void rec_extra(struct kvp_kvev *ev, const struct kvp_meta_change *c)
{
    size_t ntok = c->ntokens;
    size_t need = told_extra(!!c->parent, &ntok, STAGE < ev->qcap ? STAGE : ev->qcap);
    if (stage.n + need > STAGE)
        stage_flush(ev);
    rec_key(ev, &stage.r[stage.n++], c, KVP_CHANGE_STORED, c->key, c->len);
    if (need > 1 && c->parent)
        rec_key(ev, &stage.r[stage.n++], c, REC_PARENT, c->parent, c->parent_len);
    for (size_t i = 0; need > 1 && i < ntok; i += TOK_INLINE) {
        struct rec *r = &stage.r[stage.n++];
        size_t k = ntok - i < TOK_INLINE ? ntok - i : TOK_INLINE;
        r->ns = c->ns;
        r->rank = c->rank;
        r->kind = REC_TOKENS;
        r->len = (uint16_t)k;
        memcpy(r->u.tok, c->token_ids + i, k * sizeof *c->token_ids);
    }
}

static void on_change(const struct kvp_meta_change *c, void *arg)
{
    struct kvp_kvev *ev = arg;
    if (!c || stage.n == STAGE || c->kind == KVP_CHANGE_LOST) {
        stage_flush(ev);
        if (!c)
            return;
    }
    if (c->kind == KVP_CHANGE_LOST) {
        atomic_store(&ev->lost, 1);
        poke(ev);
        return;
    }
    if (c->kind != KVP_CHANGE_STORED && c->kind != KVP_CHANGE_REMOVED)
        return; /* a kind of a later library */
    if (ev->per_ns && (c->ns != stage.seen_ns || stage.seen_gen != ev->gen))
        topic_note(ev, c);
    if (c->parent || c->ntokens)
        rec_extra(ev, c);
    else
        rec_key(ev, &stage.r[stage.n++], c, c->kind, c->key, c->len);
}

/* The block hashes of records that still carry their keys. */
static void hash_recs(const struct kvp_kvev *ev, struct rec *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].len == KEY_HASHED || v[i].kind == REC_TOKENS)
            continue;
        int sg;
        v[i].u.hash = kvp__kvev_block_hash(v[i].u.key, v[i].len, ev->cfg.hash, &sg);
        v[i].is_signed = (uint8_t)sg;
        v[i].len = KEY_HASHED;
    }
}

/* The batch's ts: seconds since the epoch, as Python's time.time(). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* An event of n fields (the tag first): a map tagged "type" (vLLM since its
 * PR #42892) or, with format=array, the positional array before it. */
static void event_head(msgpack_packer *pk, int arr, size_t n, const char *type)
{
    if (arr) {
        msgpack_pack_array(pk, n);
    } else {
        msgpack_pack_map(pk, n);
        pack_str(pk, "type");
    }
    pack_str(pk, type);
}

/* A field's name, in a map only. */
static void field(msgpack_packer *pk, int arr, const char *name)
{
    if (!arr)
        pack_str(pk, name);
}

static void pack_hash(msgpack_packer *pk, const struct rec *r)
{
    if (r->is_signed)
        msgpack_pack_int64(pk, (int64_t)r->u.hash);
    else
        msgpack_pack_uint64(pk, r->u.hash);
}

/* The change whose first record is v[k] (of records before j): where it
 * ends, its parent's record (NULL: none told) and its tokens' count. */
struct chg {
    size_t end, ntok;
    const struct rec *parent;
};
static struct chg chg_at(const struct rec *v, size_t k, size_t j)
{
    struct chg c = {k + 1, 0, NULL};
    for (; c.end < j && rec_more(&v[c.end]); c.end++) {
        if (v[c.end].kind == REC_PARENT)
            c.parent = &v[c.end];
        else
            c.ntok += v[c.end].len;
    }
    return c;
}

/* A run of changes that makes one event: records [k, end), n changes. */
struct run {
    size_t end, n;
};

/* The run of changes from v[k] (of records before j) that makes one event:
 * changes of one kind. A run of stored pages is one BlockStored, as an
 * engine sends the pages of one request: a confirmation's pages are a
 * request's, in its order (one event per page cost the publisher and a
 * Python subscriber twice the server's CPU: bench/README.md, "KV events").
 * Where parents were told, the run must be a chain, as the consumers read
 * it: each page's parent is the page before it (the first's is the event's
 * parent_block_hash); a page without a parent joins only a run that has
 * none. Where tokens were told, every page of the run has as many (the
 * event's block_size). */
static struct run run_at(const struct rec *v, size_t k, size_t j)
{
    struct chg a = chg_at(v, k, j);
    struct run r = {a.end, 1};
    if (v[k].kind != KVP_CHANGE_STORED) { /* removals have no records of their own */
        while (r.end < j && v[r.end].kind == v[k].kind)
            r.end++, r.n++;
        return r;
    }
    int plain = !a.parent;
    size_t prev = k;
    while (r.end < j && v[r.end].kind == KVP_CHANGE_STORED) {
        struct chg b = chg_at(v, r.end, j);
        if (b.ntok != a.ntok)
            break;
        if (b.parent
                ? b.parent->u.hash != v[prev].u.hash || b.parent->is_signed != v[prev].is_signed
                : !plain)
            break;
        plain &= !b.parent;
        prev = r.end;
        r.end = b.end;
        r.n++;
    }
    return r;
}

/* The hashes of the n changes in v[k, e) (their own records, not those
 * after them). Inlined into pack_batch, where the packer's writer is known
 * (a call through it per hash cost the publisher 7% more). */
static inline __attribute__((always_inline)) void
pack_hashes(msgpack_packer *pk, const struct rec *v, size_t k, size_t e, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t x = k; x < e; x++)
        if (!rec_more(&v[x]))
            pack_hash(pk, &v[x]);
}

static void pack_batch(struct kvp_kvev *ev, const struct rec *v, size_t i, size_t j)
{
    /* The events' runs first: the batch's array says how many. */
    size_t nev = 0;
    for (size_t k = i; k < j; k = ev->runs[nev++].end)
        ev->runs[nev] = run_at(v, k, j);
    msgpack_packer pk;
    msgpack_sbuffer_clear(&ev->sb);
    msgpack_packer_init(&pk, &ev->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, now_s());
    msgpack_pack_array(&pk, nev);
    int arr = ev->cfg.array;
    for (size_t r = 0, k = i; r < nev; k = ev->runs[r++].end) {
        size_t e = ev->runs[r].end;
        if (v[k].kind == KVP_CHANGE_STORED) {
            struct chg a = chg_at(v, k, j);
            event_head(&pk, arr, 8, "BlockStored");
            field(&pk, arr, "block_hashes");
            pack_hashes(&pk, v, k, e, ev->runs[r].n);
            field(&pk, arr, "parent_block_hash");
            if (a.parent)
                pack_hash(&pk, a.parent);
            else
                msgpack_pack_nil(&pk);
            /* The pages' tokens one after the other, as vLLM sends them. */
            field(&pk, arr, "token_ids");
            msgpack_pack_array(&pk, a.ntok * ev->runs[r].n);
            for (size_t x = k; a.ntok && x < e; x++)
                for (size_t t = 0; v[x].kind == REC_TOKENS && t < v[x].len; t++)
                    msgpack_pack_uint32(&pk, v[x].u.tok[t]);
            field(&pk, arr, "block_size");
            msgpack_pack_uint64(&pk, a.ntok ? a.ntok : ev->cfg.block_size);
            field(&pk, arr, "lora_id");
            msgpack_pack_nil(&pk);
            field(&pk, arr, "medium");
            pack_str(&pk, ev->cfg.medium);
            field(&pk, arr, "lora_name");
            msgpack_pack_nil(&pk);
        } else {
            event_head(&pk, arr, 3, "BlockRemoved");
            field(&pk, arr, "block_hashes");
            pack_hashes(&pk, v, k, e, ev->runs[r].n);
            field(&pk, arr, "medium");
            pack_str(&pk, ev->cfg.medium);
        }
    }
    msgpack_pack_uint32(&pk, v[i].rank); /* data_parallel_rank: kvpage's rank */
}

static void be64(uint64_t v, unsigned char out[8])
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        out[i] = (unsigned char)v;
}

/* The batches of recs v[0..n), each handed to fn. */
static void batches(struct kvp_kvev *ev, const struct rec *v, size_t n,
                    void (*fn)(struct kvp_kvev *ev, void *arg), void *arg)
{
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && j - i < BATCH_MAX && v[j].ns == v[i].ns && v[j].rank == v[i].rank)
            j++;
        while (j < n && rec_more(&v[j])) /* a change's records stay together */
            j++;
        pack_batch(ev, v, i, j);
        topic_set(ev, v[i].ns);
        fn(ev, arg);
        i = j;
    }
}

/* Empties the replay ring and frees its buffers. */
static void ring_free(struct kvp_kvev *ev)
{
    for (size_t i = 0; ev->ring && i < ev->cfg.buffer_steps; i++) {
        free(ev->ring[i].payload);
        ev->ring[i] = (struct sent){0};
    }
    ev->ring_head = ev->ring_n = ev->ring_mem = 0;
}

/* The next sequence number, taken: recorded ahead in steps of SEQ_STEP. */
static uint64_t seq_take(struct kvp_kvev *ev)
{
    uint64_t seq = ev->next_seq++;
    if (ev->next_seq > ev->seq_limit) {
        ev->seq_limit = ev->next_seq + SEQ_STEP;
        int rc = seq_write(ev, ev->seq_limit, ev->seq_limit);
        if (rc)
            KVP_LOGW("--kv-events: cannot record the sequence number in %s: %s",
                     ev->seq_path ? ev->seq_path : ev->seq_name, strerror(-rc));
    }
    return seq;
}

/* Publishes the batch in ev->sb with the next sequence number and keeps it. */
static void publish(struct kvp_kvev *ev, void *arg)
{
    (void)arg;
    uint64_t seq = seq_take(ev);
    unsigned char sq[8];
    be64(seq, sq);
    /* Never waits: past the high-water mark PUB drops (the replay fills in). */
    zmq_send(ev->pub, ev->cur_topic, ev->cur_topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->pub, sq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->pub, ev->sb.data, ev->sb.size, ZMQ_DONTWAIT);
    /* Kept for replay in the oldest slot's buffer once the ring is full: no
     * allocation per batch then (a slot's buffer grows, never shrinks). */
    size_t cap = ev->cfg.buffer_steps;
    struct sent *s;
    if (ev->ring_n == cap) {
        s = &ev->ring[ev->ring_head];
        ev->ring_head = (ev->ring_head + 1) % cap;
        ev->ring_n--;
    } else {
        s = &ev->ring[(ev->ring_head + ev->ring_n) % cap];
    }
    size_t need = ev->sb.size ? ev->sb.size : 1, grown = s->cap > need ? s->cap : need;
    /* Past RING_BYTES the oldest batches go (s is out of the ring by now). */
    while (ev->ring_n && ev->ring_mem - s->cap + grown > RING_BYTES) {
        struct sent *o = &ev->ring[ev->ring_head];
        ev->ring_mem -= o->cap;
        free(o->payload);
        *o = (struct sent){0};
        ev->ring_head = (ev->ring_head + 1) % cap;
        ev->ring_n--;
    }
    if (s->cap < need || !s->payload) {
        char *p = realloc(s->payload, need);
        if (!p) {
            /* Out of memory: nothing is kept (a ring with a hole would
             * answer a replay without this batch); a replay from before
             * the next batch answers from the inventory. */
            ring_free(ev);
            return;
        }
        ev->ring_mem += need - s->cap;
        s->payload = p;
        s->cap = need;
    }
    memcpy(s->payload, ev->sb.data, ev->sb.size);
    s->seq = seq;
    s->len = ev->sb.size;
    ev->ring_n++;
}

/* Publishes a batch of no events. */
static void publish_empty(struct kvp_kvev *ev)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(&ev->sb);
    msgpack_packer_init(&pk, &ev->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, now_s());
    msgpack_pack_array(&pk, 0);
    msgpack_pack_uint32(&pk, 0);
    topic_set(ev, NULL);
    publish(ev, NULL);
}

/* Publishes everything queued. The queue is taken whole by swapping it with
 * the thread's own array of the same size: the lock is held for that swap
 * only, not for a copy (a copy under it made the request threads wait). */
static void drain(struct kvp_kvev *ev)
{
    for (;;) {
        pthread_mutex_lock(&ev->qlock);
        size_t n = ev->qlen;
        struct rec *full = ev->q;
        ev->q = ev->work.v;
        ev->work.v = full;
        ev->qlen = 0;
        if (n && ev->waiting)
            pthread_cond_broadcast(&ev->room);
        pthread_mutex_unlock(&ev->qlock);
        if (!n && atomic_exchange(&ev->lost, 0)) {
            /* The state lost changes it never told: a number no batch
             * will have, then an empty batch, so that every subscriber sees
             * the gap at once and asks for a replay; and no batch kept
             * before it, so that the replay answers from the inventory,
             * the state again (removals lost meanwhile are not in it: a
             * router's view may keep those pages until it forgets them). */
            ring_free(ev);
            uint64_t skipped = seq_take(ev);
            KVP_LOGW("--kv-events: the state lost changes before telling them: sequence "
                     "number %" PRIu64 " skipped, a replay gives the inventory",
                     skipped);
            publish_empty(ev);
        }
        if (!n)
            return;
        hash_recs(ev, full, n);
        batches(ev, full, n, publish, NULL);
    }
}

/* Grows *v (of *cap elements of size sz) to hold need; 0 or -ENOMEM. */
static int grow(void **v, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *p = realloc(*v, c * sz);
    if (!p)
        return -ENOMEM;
    *v = p;
    *cap = c;
    return 0;
}

/* The lineage of inventory page x, as its replay tells it (told_extra). */
static void inv_add_lin(struct kvp_kvev *ev, struct inv_rec *x, const struct kvp_meta_change *c)
{
    struct inv_recs *r = &ev->inv;
    size_t ntok = c->ntokens;
    if (told_extra(!!c->parent, &ntok, STAGE) == 1)
        return;
    if (r->nlins >= ((size_t)1 << 31) - 1 ||
        grow((void **)&r->lins, &r->caplins, r->nlins + 1, sizeof *r->lins) ||
        grow((void **)&r->tok, &r->captok, r->ntok + ntok, sizeof *r->tok)) {
        ev->inv_short = 1; /* told without it: logged by the publisher */
        return;
    }
    struct inv_lin *l = &r->lins[r->nlins++];
    int sg = 0;
    l->has_parent = c->parent != NULL;
    l->parent = c->parent ? kvp__kvev_block_hash(c->parent, c->parent_len, ev->cfg.hash, &sg) : 0;
    l->parent_signed = (uint8_t)sg;
    l->tok = r->ntok;
    l->ntok = (uint32_t)ntok;
    if (ntok) {
        memcpy(r->tok + r->ntok, c->token_ids, ntok * sizeof *r->tok);
        r->ntok += ntok;
    }
    x->lin = (uint32_t)r->nlins;
}

static void inv_add(const struct kvp_meta_change *c, void *arg)
{
    struct kvp_kvev *ev = arg;
    struct inv_recs *r = &ev->inv;
    if (grow((void **)&r->v, &r->cap, r->n + 1, sizeof *r->v)) {
        ev->inv_short = 1; /* a partial inventory: logged by the publisher */
        return;
    }
    int sg;
    struct inv_rec *x = &r->v[r->n++];
    x->ns = c->ns;
    x->rank = c->rank;
    x->hash = kvp__kvev_block_hash(c->key, c->len, ev->cfg.hash, &sg);
    x->is_signed = sg != 0;
    x->lin = 0;
    if (c->parent || c->ntokens)
        inv_add_lin(ev, x, c);
}

static void *inventory_main(void *arg)
{
    struct kvp_kvev *ev = arg;
    kvp_meta_inventory(ev->meta, inv_add, ev);
    uint64_t one = 1;
    atomic_store(&ev->inv_done, 1);
    ssize_t w = write(ev->efd, &one, sizeof one); /* wakes the publisher */
    (void)w;
    return NULL;
}

/* The inventory into ev->inv, the queue drained (and published) meanwhile;
 * 0 or -errno. */
static int take_inventory(struct kvp_kvev *ev)
{
    ev->inv.n = ev->inv.nlins = ev->inv.ntok = 0;
    if (!ev->inv.v) {
        ev->inv.cap = INV_FIRST;
        if (!(ev->inv.v = malloc(ev->inv.cap * sizeof *ev->inv.v)))
            return -ENOMEM;
    }
    atomic_store(&ev->inv_done, 0);
    int rc = pthread_create(&ev->inv_thread, NULL, inventory_main, ev);
    if (rc)
        return -rc;
    while (!atomic_load(&ev->inv_done)) {
        zmq_pollitem_t it = {NULL, ev->efd, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) > 0) {
            uint64_t cnt;
            ssize_t r = read(ev->efd, &cnt, sizeof cnt);
            (void)r;
        }
        drain(ev);
    }
    pthread_join(ev->inv_thread, NULL);
    return 0;
}

struct reply_to {
    zmq_msg_t *id;
    unsigned char seq[8];
};

static void send_reply(struct kvp_kvev *ev, const zmq_msg_t *id, const unsigned char seq[8],
                       const void *payload, size_t len)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_copy(&m, (zmq_msg_t *)id);
    zmq_msg_send(&m, ev->replay, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_msg_close(&m);
    zmq_send(ev->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->replay, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->replay, payload, len, ZMQ_DONTWAIT);
}

static void send_inventory_batch(struct kvp_kvev *ev, void *arg)
{
    struct reply_to *to = arg;
    send_reply(ev, to->id, to->seq, ev->sb.data, ev->sb.size);
}

/* Appends inventory page x's records to v: its own, then its parent's and
 * its tokens' as on_change stages them (at most STAGE: told_extra). */
static size_t inv_recs_of(const struct inv_recs *inv, const struct inv_rec *x, struct rec *v)
{
    size_t n = 0;
    v[n++] = (struct rec){.ns = x->ns,
                          .rank = x->rank,
                          .kind = KVP_CHANGE_STORED,
                          .is_signed = x->is_signed,
                          .len = KEY_HASHED,
                          .u.hash = x->hash};
    if (!x->lin)
        return n;
    const struct inv_lin *l = &inv->lins[x->lin - 1];
    if (l->has_parent) { /* as its page's record, of the parent's hash */
        v[n] = v[0];
        v[n].kind = REC_PARENT;
        v[n].is_signed = l->parent_signed;
        v[n++].u.hash = l->parent;
    }
    for (size_t i = 0; i < l->ntok; i += TOK_INLINE) {
        size_t k = l->ntok - i < TOK_INLINE ? l->ntok - i : TOK_INLINE;
        v[n] = (struct rec){.ns = x->ns, .rank = x->rank, .kind = REC_TOKENS, .len = (uint16_t)k};
        memcpy(v[n++].u.tok, inv->tok + l->tok + i, k * sizeof *inv->tok);
    }
    return n;
}

/* The inventory's batches to a replay, about BATCH_MAX records at a time
 * (a page's records never parted: at most STAGE more). */
static void send_inventory(struct kvp_kvev *ev, struct reply_to *to)
{
    struct rec *chunk = malloc((BATCH_MAX + STAGE) * sizeof *chunk);
    if (!chunk) {
        ev->inv_short = 1;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < ev->inv.n; i++) {
        n += inv_recs_of(&ev->inv, &ev->inv.v[i], chunk + n);
        if (n >= BATCH_MAX || i + 1 == ev->inv.n) {
            batches(ev, chunk, n, send_inventory_batch, to);
            n = 0;
        }
    }
    free(chunk);
}

/*
 * One replay request: [identity, "", start as 8 bytes big-endian]. Answered
 * as vLLM does from the batches kept; from the inventory instead when they
 * cannot answer: a start of 0 (a subscriber that knows nothing: llm-d's
 * indexer asks for 0 when it connects) or one older than the oldest kept
 * (before this process, or past buffer_steps). The inventory's batches carry
 * the number of the last batch published before it was begun (an empty
 * batch takes number 0 when none was):
 * each namespace in it is as it was at one moment, every change after that
 * moment has a later number, and the changes are idempotent (a page stored
 * or removed again is stored or removed), so the batches after that number
 * applied on top give the state.
 */
static void serve_replay(struct kvp_kvev *ev)
{
    zmq_msg_t parts[3];
    int np = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (np < 3)
            parts[np++] = m;
        else {
            zmq_msg_close(&m);
            np = 4;
        }
    }
    if (np != 3 || zmq_msg_size(&parts[2]) != 8) {
        KVP_LOGW("--kv-events: a replay request that is not [identity, \"\", 8-byte start]");
    } else {
        const unsigned char *b = zmq_msg_data(&parts[2]);
        uint64_t start = 0;
        for (int i = 0; i < 8; i++)
            start = start << 8 | b[i];
        uint64_t oldest = ev->ring_n ? ev->ring[ev->ring_head].seq : ev->next_seq;
        struct reply_to to = {.id = &parts[0]};
        if (start == 0 || start < oldest) {
            if (ev->next_seq == 0) /* the inventory's number must be below */
                publish_empty(ev); /* every later batch's: 0 goes to an empty batch */
            be64(ev->next_seq - 1, to.seq);
            int rc = take_inventory(ev);
            if (rc)
                KVP_LOGW("--kv-events: cannot take the inventory for a replay: %s", strerror(-rc));
            else
                send_inventory(ev, &to);
            if (!rc && ev->inv_short)
                KVP_LOGW("--kv-events: out of memory: a replay's inventory lacks pages");
            ev->inv_short = 0;
            free(ev->inv.v); /* a big inventory's memory goes back */
            free(ev->inv.lins);
            free(ev->inv.tok);
            ev->inv = (struct inv_recs){0};
        } else {
            for (size_t i = 0; i < ev->ring_n; i++) {
                const struct sent *s = &ev->ring[(ev->ring_head + i) % ev->cfg.buffer_steps];
                if (s->seq < start)
                    continue;
                be64(s->seq, to.seq);
                send_reply(ev, to.id, to.seq, s->payload, s->len);
            }
        }
        memset(to.seq, 0xff, 8); /* -1: the end */
        send_reply(ev, to.id, to.seq, "", 0);
    }
    for (int i = 0; i < np && i < 3; i++)
        zmq_msg_close(&parts[i]);
}

static void *publisher_main(void *arg)
{
    struct kvp_kvev *ev = arg;
    for (;;) {
        zmq_pollitem_t items[2] = {{NULL, ev->efd, ZMQ_POLLIN, 0}, {ev->replay, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, ev->replay ? 2 : 1, 1000);
        if (rc < 0 && zmq_errno() != EINTR)
            KVP_LOGW("--kv-events: zmq_poll: %s", zmq_strerror(zmq_errno()));
        uint64_t cnt;
        if (items[0].revents & ZMQ_POLLIN) {
            ssize_t r = read(ev->efd, &cnt, sizeof cnt);
            (void)r;
            /* Let the changes of the next TICK_MS join these, unless the
             * queue fills up (or the server stops) meanwhile. */
            zmq_pollitem_t it = {NULL, ev->efd, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, TICK_MS) > 0) {
                r = read(ev->efd, &cnt, sizeof cnt);
                (void)r;
            }
        }
        drain(ev);
        if (ev->replay) {
            int events = 0;
            size_t sz = sizeof events;
            while (zmq_getsockopt(ev->replay, ZMQ_EVENTS, &events, &sz) == 0 &&
                   (events & ZMQ_POLLIN))
                serve_replay(ev);
        }
        if (atomic_load(&ev->stop)) {
            drain(ev);
            return NULL;
        }
    }
}

/* vLLM's rule: bind where the endpoint has a wildcard or is local (ipc,
 * inproc), else connect (the subscriber binds: "bind stable, connect
 * volatile"). */
static int wants_bind(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

static void kvev_free(struct kvp_kvev *ev)
{
    if (ev->pub)
        zmq_close(ev->pub);
    if (ev->replay)
        zmq_close(ev->replay);
    if (ev->zctx)
        zmq_ctx_term(ev->zctx);
    if (ev->efd >= 0)
        close(ev->efd);
    ring_free(ev);
    free(ev->ring);
    free(ev->q);
    free(ev->work.v);
    free(ev->runs);
    free(ev->seq_path);
    free(ev->seq_name);
    while (ev->topics) {
        struct ns_topic *t = ev->topics;
        ev->topics = t->next;
        free(t->topic);
        free(t);
    }
    pthread_mutex_destroy(&ev->tlock);
    msgpack_sbuffer_destroy(&ev->sb);
    pthread_cond_destroy(&ev->room);
    pthread_mutex_destroy(&ev->qlock);
    free(ev);
}

/* Sets one socket option, or says which failed. */
static int sockopt(void *s, int opt, int v, const char *name, char *why, size_t len)
{
    if (zmq_setsockopt(s, opt, &v, sizeof v) == 0)
        return 0;
    snprintf(why, len, "cannot set %s: %s", name, zmq_strerror(zmq_errno()));
    return -EINVAL;
}

int kvp__kvev_start(const struct kvp_kvev_cfg *cfg, struct kvp_meta *meta, const char *data_dir,
                    struct kvp_kvev **out, char *why, size_t len)
{
    struct kvp_kvev *ev = calloc(1, sizeof *ev);
    if (!ev) {
        snprintf(why, len, "out of memory");
        return -ENOMEM;
    }
    ev->cfg = *cfg;
    ev->meta = meta;
    ev->efd = -1;
    ev->topic = cfg->topic;
    ev->topic_len = strlen(cfg->topic);
    ev->cur_topic = ev->topic;
    ev->cur_topic_len = ev->topic_len;
    ev->per_ns = strchr(cfg->topic, '{') != NULL;
    ev->gen = atomic_fetch_add(&kvev_gens, 1) + 1; /* 0: a thread that saw none */
    pthread_mutex_init(&ev->tlock, NULL);
    pthread_mutex_init(&ev->qlock, NULL);
    pthread_cond_init(&ev->room, NULL);
    msgpack_sbuffer_init(&ev->sb);
    ev->qcap = cfg->max_queue_size;
    ev->q = malloc(ev->qcap * sizeof *ev->q);
    ev->ring = calloc(cfg->buffer_steps, sizeof *ev->ring);
    ev->work.cap = ev->qcap; /* drain swaps it with q */
    ev->work.v = malloc(ev->qcap * sizeof *ev->work.v);
    ev->runs = malloc((BATCH_MAX + STAGE) * sizeof *ev->runs);
    int rc = -ENOMEM;
    if (!ev->q || !ev->ring || !ev->work.v || !ev->runs) {
        snprintf(why, len, "out of memory");
        goto fail;
    }
    if (data_dir) {
        size_t n = strlen(data_dir) + sizeof SEQ_FILE + 2;
        if (!(ev->seq_path = malloc(n))) {
            snprintf(why, len, "out of memory");
            goto fail;
        }
        snprintf(ev->seq_path, n, "%s/%s", data_dir, SEQ_FILE);
        FILE *f = fopen(ev->seq_path, "re");
        if (f) {
            char line[64] = "";
            uint64_t v;
            int ok = fgets(line, sizeof line, f) && (line[strcspn(line, "\n")] = 0, 1) &&
                     kvp__parse_size(line, 0, &v) == 0;
            fclose(f);
            if (!ok) {
                snprintf(why, len, "%s does not hold a sequence number", ev->seq_path);
                rc = -EINVAL;
                goto fail;
            }
            ev->next_seq = v;
        } else if (errno != ENOENT) {
            rc = -errno;
            snprintf(why, len, "cannot read %s: %s", ev->seq_path, strerror(errno));
            goto fail;
        }
    } else {
        /* No data directory: the state keeps the number when it can (Redis),
         * one per endpoint (a server sharing it only raises it). */
        struct kvp_error e = {0};
        size_t n = strlen(cfg->endpoint) + 16;
        if (!(ev->seq_name = malloc(n))) {
            snprintf(why, len, "out of memory");
            goto fail;
        }
        snprintf(ev->seq_name, n, "kv-events.seq:%s", cfg->endpoint);
        rc = kvp_meta_counter(meta, ev->seq_name, 0, 0, &ev->next_seq, &e);
        if (rc == -EOPNOTSUPP) {
            free(ev->seq_name); /* mem: and --data-dir none: from 0 each time */
            ev->seq_name = NULL;
        } else if (rc) {
            snprintf(why, len, "cannot read the sequence number: %s", e.msg);
            goto fail;
        }
    }
    ev->seq_limit = ev->next_seq; /* the first batch records the next limit */
    if ((ev->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = -errno;
        snprintf(why, len, "eventfd: %s", strerror(errno));
        goto fail;
    }
    rc = -EINVAL;
    if (!(ev->zctx = zmq_ctx_new()) || !(ev->pub = zmq_socket(ev->zctx, ZMQ_PUB))) {
        snprintf(why, len, "cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    int ipv6 = strchr(cfg->endpoint, '[') != NULL;
    if (sockopt(ev->pub, ZMQ_SNDHWM, (int)(cfg->hwm > INT32_MAX ? INT32_MAX : cfg->hwm), "hwm", why,
                len) ||
        sockopt(ev->pub, ZMQ_LINGER, 0, "linger", why, len) ||
        (ipv6 && sockopt(ev->pub, ZMQ_IPV6, 1, "ipv6", why, len)))
        goto fail;
    int bind = wants_bind(cfg->endpoint);
    if ((bind ? zmq_bind : zmq_connect)(ev->pub, cfg->endpoint) != 0) {
        snprintf(why, len, "cannot %s endpoint %s: %s", bind ? "bind" : "connect", cfg->endpoint,
                 zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (cfg->replay_endpoint) {
        /* No high-water mark on replies: a replay is sent whole, or a
         * subscriber would take a cut answer for a complete one. */
        if (!(ev->replay = zmq_socket(ev->zctx, ZMQ_ROUTER)) ||
            sockopt(ev->replay, ZMQ_SNDHWM, 0, "the replay socket's hwm", why, len) ||
            sockopt(ev->replay, ZMQ_LINGER, 0, "linger", why, len) ||
            (strchr(cfg->replay_endpoint, '[') &&
             sockopt(ev->replay, ZMQ_IPV6, 1, "ipv6", why, len)))
            goto fail;
        if (zmq_bind(ev->replay, cfg->replay_endpoint) != 0) {
            snprintf(why, len, "cannot bind replay_endpoint %s: %s", cfg->replay_endpoint,
                     zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    if ((rc = kvp_meta_watch(meta, on_change, ev)) != 0) {
        snprintf(why, len, "this state cannot be watched: %s", strerror(-rc));
        goto fail;
    }
    if ((rc = pthread_create(&ev->thread, NULL, publisher_main, ev)) != 0) {
        kvp_meta_watch(meta, NULL, NULL);
        snprintf(why, len, "cannot start the publisher thread: %s", strerror(rc));
        rc = -rc;
        goto fail;
    }
    *out = ev;
    return 0;
fail:
    kvev_free(ev);
    return rc;
}

void kvp__kvev_stop(struct kvp_kvev *ev)
{
    if (!ev)
        return;
    kvp_meta_watch(ev->meta, NULL, NULL);
    atomic_store(&ev->stop, 1);
    poke(ev);
    pthread_join(ev->thread, NULL);
    /* A clean stop records the exact next number: no gap after a restart. */
    int rc = seq_write(ev, ev->seq_limit, ev->next_seq);
    if (rc)
        KVP_LOGW("--kv-events: cannot record the sequence number in %s: %s",
                 ev->seq_path ? ev->seq_path : ev->seq_name, strerror(-rc));
    kvev_free(ev);
}
