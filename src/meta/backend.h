/*
 * The seam between the metadata interface (src/meta/meta.c, which checks
 * every argument) and the backends that hold the state. Internal: backends
 * and tests include it; callers see only kvpage/meta.h.
 *
 * A backend is a table of operations. The interface calls them only with
 * valid input: keys of 1..KVP_MAX_KEY_LEN bytes without NUL, valid names,
 * ranks <= KVP_MAX_RANK, 1 <= num_pages <= KVP_MAX_PAGES, n <= KVP_MAX_BATCH,
 * non-NULL arrays where n > 0, and -1 for "every rank" where a call takes
 * an int64_t rank (any negative rank a caller passes). What depends on the state (is the rank
 * initialized, is the page inside it, does it hold another key) is the
 * backend's to check, with the rules and messages of kvpage/meta.h.
 *
 * Change operations raise *ticket to the point at which their change is
 * durable (0: nothing to wait for) and return before it is; wait and
 * when_durable redeem tickets.
 */
#ifndef KVP_META_BACKEND_H
#define KVP_META_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "kvpage/meta.h"
#include "util/error.h" /* kvp__set_err, for backends */

/* The most keys (or confirmations, or releases) one call may pass. */
#define KVP_MAX_BATCH ((size_t)UINT32_MAX - 1)

struct kvp__meta_ops;

/* The handle callers hold. */
struct kvp_meta {
    const struct kvp__meta_ops *ops;
    const struct kvp__meta_scheme *scheme; /* the location's, one of ops's */
    void *be;                              /* the backend's state */
    struct kvp_meta_opts opts; /* as given, defaults filled in; data_dir points at dir */
    char *dir;                 /* the data directory of a file: location (owned) */
    char *location;            /* the location, canonical (kvp_meta_location; owned) */
    char *identity;            /* kvp_meta_identity, set by open (owned); NULL: none, or
                                  the backend's identity op gives it */
};

/* The length of an identity: hex digits of 16 random bytes. */
#define KVP_IDENTITY_LEN 32

/* A new identity (KVP_IDENTITY_LEN hex digits and a NUL) in out: 0 or -errno. */
int kvp__identity_new(char out[KVP_IDENTITY_LEN + 1]);

/* Whether s (len bytes) is an identity. */
int kvp__identity_valid(const char *s, size_t len);

/* The identity in the data directory dir's IDENTITY file into out: 0,
 * -ENOENT (none), -EUCLEAN (not an identity) or -errno. Writes nothing. */
int kvp__dir_identity(const char *dir, char out[KVP_IDENTITY_LEN + 1]);

/* The head of every backend's namespace: a backend's own namespace struct
 * starts with it, so that the interface finds the handle (and so the ops). */
struct kvp_ns {
    struct kvp_meta *meta;
};

/* A scheme a backend serves: "redis" for redis://... locations. */
struct kvp__meta_scheme {
    const char *scheme;      /* without ':' */
    const char *description; /* one line: the location's form and what it keeps where
                                (kvp_meta_backend_info, kvpage backends, the man page) */
    int flags;               /* KVP__SCHEME_* */
};

/* The rest of the location is a directory: "file:DIR", "file://DIR"; it
 * must not be empty, becomes opts.data_dir and the canonical "file:" +
 * absolute path. A location that is a path (starting with / or .) and a
 * NULL location with opts.data_dir open the first such scheme. */
#define KVP__SCHEME_DIR 1
/* The location NULL or "" without opts.data_dir opens it; open gets where
 * NULL. */
#define KVP__SCHEME_DEFAULT 2
/* Not served (yet): opening it is -EOPNOTSUPP with the description as the
 * message, and with KVP__SCHEME_KNOWN the schemes there are after it;
 * listed nowhere. */
#define KVP__SCHEME_REFUSED 4
#define KVP__SCHEME_KNOWN 8

struct kvp__meta_ops {
    const char *name; /* for messages: "in-process" */
    /* Its schemes, ended by a row with scheme NULL. */
    const struct kvp__meta_scheme *schemes;
    /* kvp_meta_info's remote and holder (see kvpage/meta.h). */
    int remote;
    const char *holder;
    /* The kvp_meta_values section of its connection's figures, or NULL. */
    const char *values_section;
    /* Fills out's durability fields for the handle m (kvp_meta_info; the
     * interface has set the rest, durability KVP_DURABLE_UNKNOWN). May be
     * NULL: unknown. May ask the state's holder (Redis: CONFIG GET). */
    void (*info)(struct kvp_meta *m, struct kvp_meta_info *out);
    /* Sets m->be. where: the part of the location after the scheme (the
     * directory for file:, NULL for mem:). */
    int (*open)(struct kvp_meta *m, const char *where, struct kvp_error *err);
    void (*close)(struct kvp_meta *m);
    int (*ns)(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
              int create, struct kvp_ns **out, uint64_t *ticket, struct kvp_error *err);
    int (*init_rank)(struct kvp_ns *ns, uint32_t rank, uint32_t num_pages, uint64_t *ticket,
                     struct kvp_error *err);
    int (*allocate)(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys, size_t n,
                    int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err);
    int (*confirm)(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                   const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                   uint64_t *ticket, struct kvp_error *err);
    int (*exists)(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                  uint8_t *out, struct kvp_error *err);
    int (*lookup)(struct kvp_ns *ns, uint32_t rank, int complete_only, const struct kvp_str *keys,
                  size_t n, int64_t *pages, struct kvp_error *err);
    int (*del)(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
               uint64_t *ticket, struct kvp_error *err);
    int (*clear)(struct kvp_ns *ns, int64_t rank, uint64_t *ticket, struct kvp_error *err);
    size_t (*nranks)(struct kvp_ns *ns);
    int (*stats)(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg);
    int (*check)(struct kvp_meta *m, struct kvp_error *err);
    /* Durability: as kvp_meta_wait / kvp_meta_when_durable, ticket != 0. */
    int (*wait)(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err);
    int (*when_durable)(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn, void *arg);
    /* allocate taking FREE pages in an order of enum kvp_page_order
     * (checked). May be NULL: the backend has one order (allocate's). */
    int (*allocate_ordered)(struct kvp_ns *ns, uint32_t rank, int order, const struct kvp_str *keys,
                            size_t n, int64_t *pages, uint8_t *existed, uint64_t *ticket,
                            struct kvp_error *err);
    /* May be NULL: no values, always healthy, no snapshots (-ENOENT), no
     * description but the name. health sets *scope (never NULL) when it
     * fails: KVP_HEALTH_WRITES or KVP_HEALTH_ALL (kvp_meta_health_scope);
     * describe is as kvp_meta_describe. */
    int (*values)(struct kvp_meta *m, kvp_meta_value_fn fn, void *arg);
    int (*health)(struct kvp_meta *m, int *scope, char *why, size_t len);
    int (*snapshot)(struct kvp_meta *m);
    int (*describe)(struct kvp_meta *m, char *buf, size_t len);
    /* kvp_meta_drop, names checked. May be NULL: -EOPNOTSUPP. */
    int (*drop)(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
                uint64_t *ticket, struct kvp_error *err);
    /* May be NULL: m->identity is the identity. Else kvp_meta_identity's
     * answer (a remote server's, asked on the first call). */
    const char *(*identity)(struct kvp_meta *m);
    /* kvp_meta_watch and kvp_meta_inventory. May be NULL: -EOPNOTSUPP. */
    int (*watch)(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg);
    int (*inventory)(struct kvp_meta *m, kvp_meta_change_fn fn, void *arg);
    /* Pins and the query by engine hashes (kvp_meta_pin, kvp_meta_unpin,
     * kvp_meta_pinned, kvp_meta_exists_hashes), arguments checked. May be
     * NULL: -EOPNOTSUPP (the in-process and Redis backends have them). */
    int (*pin)(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
               double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err);
    int (*unpin)(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t *released,
                 struct kvp_error *err);
    int (*pinned)(struct kvp_ns *ns, int64_t rank, uint64_t *keys, uint64_t *refs,
                  struct kvp_error *err);
    int (*exists_hashes)(struct kvp_ns *ns, const uint64_t *hashes, size_t n, int form,
                         const uint32_t *ranks, size_t nranks, uint8_t *out, struct kvp_error *err);
    /* kvp_meta_delete_rejected: del of keys whose pages failed their
     * integrity tag. May be NULL: del (the reason matters only to a remote
     * server, which counts them). */
    int (*del_rejected)(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                        uint64_t *ticket, struct kvp_error *err);
    /* kvp_meta_counter, name checked. May be NULL: -EOPNOTSUPP. */
    int (*counter)(struct kvp_meta *m, const char *name, uint64_t expect, uint64_t value,
                   uint64_t *now, struct kvp_error *err);
    /* kvp_meta_confirm_ex, opts checked and not NULL (opts_size the
     * library's). May be NULL: confirm, the opts passed over. */
    int (*confirm_ex)(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                      const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                      const struct kvp_confirm_opts *opts, uint64_t *ticket, struct kvp_error *err);
};

/* The backends are the rows of src/meta/backends.h; kvp__meta_backends
 * (src/meta/backends.c) lists them, ended by NULL. */
#define KVP__META_BACKEND(ops) extern const struct kvp__meta_ops ops;
#include "meta/backends.h"
#undef KVP__META_BACKEND
extern const struct kvp__meta_ops *const kvp__meta_backends[];

/*
 * Adds a scheme (without ':') served by ops, for tests; not thread-safe,
 * before any kvp_meta_open_at. 0 or -EEXIST / -ENOMEM.
 */
int kvp__meta_register(const char *scheme, const struct kvp__meta_ops *ops);

#endif
