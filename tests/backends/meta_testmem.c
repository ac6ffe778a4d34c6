/*
 * testmem: — a metadata backend of the test builds only (the row in
 * src/meta/backends.h under KVP_TEST_BACKENDS; never in libkvpage.so): the
 * state of a mem: handle, reached through the public interface
 * (kvpage/meta.h), each operation counted. It shows that a backend is this
 * one file and one row of the table, and the existing suites run over it
 * (tests/backends/test_meta_testmem.c: the differential run of meta_diff.h,
 * which wants the same answers as mem: to the byte).
 *
 * The count, of every testmem: handle of the process, is the value
 * testmem.calls of kvp_meta_values: a suite that ran over this backend
 * moved it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "meta/backend.h"

static atomic_ullong calls;

/* A handle's state: the mem: handle, and the namespaces handed out (each
 * wraps one of the mem: handle's, so that its calls come here). */
struct tns {
    struct kvp_ns head; /* head.meta: the testmem: handle */
    struct kvp_ns *in;
    struct tns *next;
};

struct tmeta {
    struct kvp_meta *in;
    pthread_mutex_t lock;
    struct tns *nss;
};

static struct kvp_meta *in_of(struct kvp_meta *m)
{
    atomic_fetch_add(&calls, 1);
    return ((struct tmeta *)m->be)->in;
}

static struct kvp_ns *ns_in(struct kvp_ns *ns)
{
    atomic_fetch_add(&calls, 1);
    return ((struct tns *)ns)->in;
}

static int tm_open(struct kvp_meta *m, const char *where, struct kvp_error *err)
{
    struct tmeta *t = calloc(1, sizeof *t);
    if (!t) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    int rc = kvp_meta_open_at("mem:", &m->opts, &t->in, err);
    if (rc) {
        free(t);
        return rc;
    }
    pthread_mutex_init(&t->lock, NULL);
    m->be = t;
    atomic_fetch_add(&calls, 1);
    return 0;
}

static void tm_close(struct kvp_meta *m)
{
    struct tmeta *t = m->be;
    kvp_meta_close(in_of(m));
    for (struct tns *s = t->nss, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static const char *tm_identity(struct kvp_meta *m)
{
    return kvp_meta_identity(in_of(m));
}

static int tm_ns(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
                 int create, struct kvp_ns **out, uint64_t *ticket, struct kvp_error *err)
{
    struct tmeta *t = m->be;
    struct kvp_ns *in = NULL;
    int rc = kvp_meta_ns(in_of(m), dep, dlen, pool, plen, create, &in, err);
    *out = NULL;
    if (!in)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct tns *s = t->nss;
    while (s && s->in != in)
        s = s->next;
    if (!s && (s = calloc(1, sizeof *s))) {
        *s = (struct tns){{m}, in, t->nss};
        t->nss = s;
    }
    pthread_mutex_unlock(&t->lock);
    if (!s) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    *out = &s->head;
    return rc;
}

static int tm_init_rank(struct kvp_ns *ns, uint32_t rank, uint32_t num_pages, uint64_t *ticket,
                        struct kvp_error *err)
{
    return kvp_meta_init_rank_async(ns_in(ns), rank, num_pages, ticket, err);
}

static int tm_allocate_ordered(struct kvp_ns *ns, uint32_t rank, int order,
                               const struct kvp_str *keys, size_t n, int64_t *pages,
                               uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_allocate_ordered_async(ns_in(ns), rank, order, keys, n, pages, existed, ticket,
                                           err);
}

static int tm_allocate(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys, size_t n,
                       int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_allocate_async(ns_in(ns), rank, keys, n, pages, existed, ticket, err);
}

static int tm_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                      const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                      uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_confirm_async(ns_in(ns), rank, keys, pages, n, release, nrel, ticket, err);
}

static int tm_exists(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                     uint8_t *out, struct kvp_error *err)
{
    return kvp_meta_exists(ns_in(ns), rank, keys, n, out, err);
}

static int tm_lookup(struct kvp_ns *ns, uint32_t rank, int complete_only,
                     const struct kvp_str *keys, size_t n, int64_t *pages, struct kvp_error *err)
{
    return kvp_meta_lookup(ns_in(ns), rank, complete_only, keys, n, pages, err);
}

static int tm_del(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                  uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_delete_async(ns_in(ns), rank, keys, n, ticket, err);
}

static int tm_clear(struct kvp_ns *ns, int64_t rank, uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_clear_async(ns_in(ns), rank, ticket, err);
}

static int tm_drop(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
                   uint64_t *ticket, struct kvp_error *err)
{
    return kvp_meta_drop_async(in_of(m), dep, dlen, pool, plen, ticket, err);
}

static size_t tm_nranks(struct kvp_ns *ns)
{
    return kvp_meta_nranks(ns_in(ns));
}

static int tm_stats(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg)
{
    return kvp_meta_stats(in_of(m), fn, arg);
}

static int tm_check(struct kvp_meta *m, struct kvp_error *err)
{
    return kvp_meta_check(in_of(m), err);
}

static int tm_wait(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err)
{
    return kvp_meta_wait(in_of(m), ticket, err);
}

static int tm_when_durable(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn, void *arg)
{
    return kvp_meta_when_durable(in_of(m), ticket, fn, arg);
}

static int tm_values(struct kvp_meta *m, kvp_meta_value_fn fn, void *arg)
{
    struct kvp_meta *in = in_of(m);
    const struct kvp_meta_value v = {
        .section = "testmem",
        .key = "calls",
        .metric = "kvpage_testmem_calls_total",
        .help = "Operations the test backend passed on to mem:, of every handle of the process.",
        .type = KVP_VALUE_COUNTER,
        .value = atomic_load(&calls),
    };
    int rc = fn(&v, arg);
    return rc ? rc : kvp_meta_values(in, fn, arg);
}

static int tm_health(struct kvp_meta *m, int *scope, char *why, size_t len)
{
    return kvp_meta_health_scope(in_of(m), scope, why, len);
}

static int tm_describe(struct kvp_meta *m, char *buf, size_t len)
{
    char in[256] = "";
    kvp_meta_describe(in_of(m), in, sizeof in);
    return snprintf(buf, len, "test backend over %s", in);
}

/* What mem: promises. */
static void tm_info(struct kvp_meta *m, struct kvp_meta_info *out)
{
    struct kvp_meta_info in = {.info_size = sizeof in};
    if (!m || kvp_meta_info(in_of(m), &in))
        return;
    out->durability = in.durability;
    snprintf(out->durability_text, sizeof out->durability_text, "%s", in.durability_text);
    out->durability_meaning = in.durability_meaning;
    out->durability_loss = in.durability_loss;
}

static const struct kvp__meta_scheme tm_schemes[] = {
    {"testmem", "testmem: the state of a mem: handle, each call counted (test builds only)", 0},
    {NULL, NULL, 0},
};

const struct kvp__meta_ops kvp__meta_testmem_ops = {
    .name = "testmem",
    .schemes = tm_schemes,
    .holder = "this process",
    .info = tm_info,
    .open = tm_open,
    .close = tm_close,
    .identity = tm_identity,
    .ns = tm_ns,
    .init_rank = tm_init_rank,
    .allocate = tm_allocate,
    .allocate_ordered = tm_allocate_ordered,
    .confirm = tm_confirm,
    .exists = tm_exists,
    .lookup = tm_lookup,
    .del = tm_del,
    .clear = tm_clear,
    .drop = tm_drop,
    .nranks = tm_nranks,
    .stats = tm_stats,
    .check = tm_check,
    .wait = tm_wait,
    .when_durable = tm_when_durable,
    .values = tm_values,
    .health = tm_health,
    .describe = tm_describe,
};
