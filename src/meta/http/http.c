/*
 * The http:// backend of kvpage/meta.h: every call is a request to a running
 * `kvpage serve` (protocol.md §2-§4, docs/protocol-notes.md), made with
 * libcurl.
 *
 * Location: http://HOST:PORT[/ns/NAME]. A namespace (deployment D, pool P)
 * maps to the base path /ns/D (none for "default"); with /ns/NAME in the
 * location that path is fixed and D must be NAME. Per-rank calls use the
 * SGLang routes (/{rank}/..., the pool in the body field "namespace");
 * namespace-wide calls (exists and delete on every rank, complete-only
 * lookups, clear of the namespace) use the vLLM routes, with the pool in the
 * body field "namespace" when it is not "kv" (kvpage's extension of those
 * routes, docs/protocol-notes.md).
 *
 * The server answers a change only once it is durable, so no call hands out
 * a ticket: wait returns 0, when_durable 1.
 *
 * Connections: a mutex-protected pool of curl easy handles. A call takes one
 * (or makes one when none is idle), runs its request and puts it back; every
 * easy handle keeps its own connection cache, so the keep-alive connection of
 * a handle goes with it from call to call and thread to thread. At most
 * KVP_HTTP_IDLE handles are kept idle (others are closed when put back), so
 * the connections open track the calls running at once. (A CURLSH sharing
 * connections would need its lock callbacks on every transfer and still one
 * easy handle per concurrent call; a pool of easy handles is simpler and
 * keeps each handle's buffers warm.)
 *
 * Retries: an idempotent request (everything but allocate) is repeated up to
 * opts.retries times after a failed connection, a timeout or a 5xx, with
 * exponential backoff (20 ms doubling, at most 1 s, jittered). An allocation
 * is never repeated, not even by libcurl itself: libcurl re-sends a request
 * whose reused connection died before any byte of the reply came, rewinding
 * the body, and the body's seek callback refuses that rewind for an
 * allocation, so that a server which took it and died is not asked twice.
 *
 * JSON: request bodies are written here (keys escaped: '"', '\\' and control
 * bytes; the server reads JSON strings as UTF-8 and refuses invalid UTF-8, so
 * such keys are refused here with -EINVAL before anything is sent); replies
 * are tokenized with jsmn. libkvpage.so links neither jansson nor
 * libmicrohttpd.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#define JSMN_STATIC
#define JSMN_STRICT
#include <jsmn.h>

#include "meta/backend.h"
#include "meta/rules.h"
#include "util/hex.h"
#include "util/jsonw.h"

#define KVP_HTTP_IDLE 32                     /* idle easy handles kept */
#define KVP_HTTP_MAX_REPLY ((size_t)1 << 30) /* a larger reply is an error */

/* ---------------------------------------------------------------- buffers */

/* A C string into a buffer. */
static void put_lit(struct kvp_buf *b, const char *s)
{
    kvp__buf_put(b, s, strlen(s));
}

/* ---------------------------------------------------------------- JSON replies */

struct jdoc {
    const char *js;
    jsmntok_t *t;
    int n;
};

/* Tokenizes js[0..len). 0, or -1 (not JSON, or out of memory). */
static int jparse(struct jdoc *d, const char *js, size_t len)
{
    jsmn_parser p;
    jsmn_init(&p);
    int n = jsmn_parse(&p, js, len, NULL, 0);
    d->js = js;
    d->t = NULL;
    d->n = 0;
    if (n < 1)
        return -1;
    if (!(d->t = malloc((size_t)n * sizeof *d->t)))
        return -1;
    jsmn_init(&p);
    if (jsmn_parse(&p, js, len, d->t, (unsigned)n) != n) {
        free(d->t);
        d->t = NULL;
        return -1;
    }
    d->n = n;
    return 0;
}

/* The index after the value at i and everything inside it. */
static int jskip(const struct jdoc *d, int i)
{
    int pending = 1;
    while (pending > 0 && i < d->n) {
        pending--;
        if (d->t[i].type == JSMN_OBJECT)
            pending += 2 * d->t[i].size;
        else if (d->t[i].type == JSMN_ARRAY)
            pending += d->t[i].size;
        i++;
    }
    return i;
}

static int jeq(const struct jdoc *d, int i, const char *lit)
{
    size_t n = strlen(lit);
    return d->t[i].type == JSMN_STRING && (size_t)(d->t[i].end - d->t[i].start) == n &&
           !memcmp(d->js + d->t[i].start, lit, n);
}

/* The value of member key of the object at obj, or -1. */
static int jget(const struct jdoc *d, int obj, const char *key)
{
    if (obj < 0 || obj >= d->n || d->t[obj].type != JSMN_OBJECT)
        return -1;
    int i = obj + 1;
    for (int k = 0; k < d->t[obj].size && i + 1 < d->n; k++) {
        if (jeq(d, i, key))
            return i + 1;
        i = jskip(d, i + 1);
    }
    return -1;
}

/* An integer primitive (no fraction, no exponent) into *out; null gives -1
 * when null_ok. 0, or -1 when it is something else. */
static int jint(const struct jdoc *d, int i, int null_ok, int64_t *out)
{
    if (i < 0 || d->t[i].type != JSMN_PRIMITIVE)
        return -1;
    const char *s = d->js + d->t[i].start;
    size_t n = (size_t)(d->t[i].end - d->t[i].start);
    if (null_ok && n == 4 && !memcmp(s, "null", 4)) {
        *out = -1;
        return 0;
    }
    char t[24];
    if (n == 0 || n >= sizeof t)
        return -1;
    memcpy(t, s, n);
    t[n] = '\0';
    if (strpbrk(t, ".eE"))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int jbool(const struct jdoc *d, int i, uint8_t *out)
{
    if (i < 0 || d->t[i].type != JSMN_PRIMITIVE)
        return -1;
    char c = d->js[d->t[i].start];
    if (c != 't' && c != 'f')
        return -1;
    *out = c == 't';
    return 0;
}

static unsigned hex4(const char *s)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = kvp__hex_value(s[k]);
        if (h < 0)
            return 0x110000;
        v = v * 16 + (unsigned)h;
    }
    return v;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The string at i, unescaped, into out (at most cap-1 bytes and a NUL; cut
 * short when longer). Its length, or -1 when it is not a string. */
static ptrdiff_t jstr(const struct jdoc *d, int i, char *out, size_t cap)
{
    if (i < 0 || d->t[i].type != JSMN_STRING || cap == 0)
        return -1;
    const char *s = d->js + d->t[i].start, *e = d->js + d->t[i].end;
    size_t o = 0;
    while (s < e && o + 5 <= cap) {
        if (*s != '\\') {
            out[o++] = *s++;
            continue;
        }
        s++;
        if (s >= e)
            break;
        char c = *s++;
        switch (c) {
        case 'b':
            out[o++] = '\b';
            break;
        case 'f':
            out[o++] = '\f';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'u': {
            if (e - s < 4)
                return -1;
            unsigned cp = hex4(s);
            s += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && e - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                unsigned lo = hex4(s + 2);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    s += 6;
                }
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                cp = 0xfffd;
            o += put_utf8(out + o, cp);
            break;
        }
        default: /* '"', '\\', '/' */
            out[o++] = c;
        }
    }
    out[o] = '\0';
    return (ptrdiff_t)o;
}

/* ---------------------------------------------------------------- the backend */

struct hns {
    struct kvp_ns head; /* first: the interface finds the handle */
    struct hns *next;
    char *dep, *pool;
    size_t dlen, plen;
    char prefix[KVP_MAX_NAME_LEN + 8]; /* "" or "/ns/DEP" */
    int kv;                            /* pool == "kv" */
};

struct hbe {
    char *root;      /* "http://HOST:PORT" */
    char *fixed_dep; /* NAME of /ns/NAME, or NULL */
    struct curl_slist *headers;
    struct kvp_meta *m;
    pthread_mutex_t lock; /* idle and nss */
    CURL *idle[KVP_HTTP_IDLE];
    size_t nidle;
    struct hns *nss;
    atomic_uint_fast64_t requests, retries, connections, transport_errors, error_replies, handles;
    atomic_uint_fast64_t jitter;
    pthread_mutex_t idlock; /* id_asked and m->identity */
    int id_asked;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static struct hbe *be_of(struct kvp_meta *m)
{
    return m->be;
}

/* ---------------------------------------------------------------- one request */

struct upload {
    const char *p;
    size_t len, off;
    int rewind_ok;
};

static size_t read_cb(char *dst, size_t size, size_t nitems, void *arg)
{
    struct upload *u = arg;
    size_t n = size * nitems, left = u->len - u->off;
    if (n > left)
        n = left;
    memcpy(dst, u->p + u->off, n);
    u->off += n;
    return n;
}

/* libcurl rewinds the body to send the request again on a new connection
 * (its reused one died before the reply): allowed only for idempotent
 * requests. */
static int seek_cb(void *arg, curl_off_t off, int origin)
{
    struct upload *u = arg;
    if (!u->rewind_ok || origin != SEEK_SET || off < 0 || (size_t)off > u->len)
        return CURL_SEEKFUNC_FAIL;
    u->off = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

static size_t write_cb(char *src, size_t size, size_t nitems, void *arg)
{
    struct kvp_buf *b = arg;
    size_t n = size * nitems;
    if (b->len + n > KVP_HTTP_MAX_REPLY)
        return 0;
    kvp__buf_put(b, src, n);
    return b->oom ? 0 : n;
}

static CURL *take(struct hbe *b)
{
    CURL *h = NULL;
    pthread_mutex_lock(&b->lock);
    if (b->nidle)
        h = b->idle[--b->nidle];
    pthread_mutex_unlock(&b->lock);
    if (h)
        return h;
    if (!(h = curl_easy_init()))
        return NULL;
    atomic_fetch_add(&b->handles, 1);
    const struct kvp_meta_opts *o = &b->m->opts;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)o->timeout_ms);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, b->headers);
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* never a proxy of the environment */
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    return h;
}

static void give(struct hbe *b, CURL *h)
{
    pthread_mutex_lock(&b->lock);
    if (b->nidle < KVP_HTTP_IDLE) {
        b->idle[b->nidle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&b->lock);
    if (h) {
        curl_easy_cleanup(h);
        atomic_fetch_sub(&b->handles, 1);
    }
}

struct req {
    const char *method; /* "POST", "GET", or "DELETE" with a body (run: NULL, by body) */
    char path[KVP_MAX_NAME_LEN + 96];
    const struct kvp_buf *body; /* POST, DELETE */
    int idempotent;
    int keep;         /* run keeps the reply of an error status (the caller frees it) */
    const char *once; /* not idempotent: what is never sent again (NULL: "an allocation") */
    /* the answer */
    long status;
    struct kvp_buf reply;
};

static int curl_errno(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
        return -EHOSTUNREACH;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_PARTIAL_FILE:
        return -ECONNRESET;
    default:
        return -EIO;
    }
}

/* Runs r once: 0 with r->status, or a negative errno (the transfer failed:
 * err filled). */
static int perform(struct hbe *b, struct req *r, struct kvp_error *err)
{
    CURL *h = take(b);
    if (!h) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_IO, -1, 0, 0, "%s %s: cannot make a curl handle",
                     r->method, r->path);
        return -ENOMEM;
    }
    char url[sizeof r->path + 300];
    snprintf(url, sizeof url, "%s%s", b->root, r->path);
    char ebuf[CURL_ERROR_SIZE];
    ebuf[0] = '\0';
    struct upload up = {0};
    kvp__buf_free(&r->reply);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->reply);
    if (r->body) {
        up.p = r->body->p ? r->body->p : "";
        up.len = r->body->len;
        up.rewind_ok = r->idempotent;
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        /* DELETE /v1/pins carries a body as a POST does */
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, strcmp(r->method, "POST") ? r->method : NULL);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)up.len);
        curl_easy_setopt(h, CURLOPT_READDATA, &up);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, &up);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }
    atomic_fetch_add(&b->requests, 1);
    CURLcode c = curl_easy_perform(h);
    long conns = 0;
    if (curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &conns) == CURLE_OK && conns > 0)
        atomic_fetch_add(&b->connections, (uint64_t)conns);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(h, CURLOPT_READDATA, NULL);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, NULL);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, NULL);
    give(b, h);
    if (c == CURLE_OK && !r->reply.oom)
        return 0;
    int rc = r->reply.oom ? -ENOMEM : curl_errno(c);
    kvp__set_err(err, rc, KVP_RULE_IO, -1, 0, 0, "%s %s: %s: %s%s%s%s", r->method, r->path, b->root,
                 ebuf[0] ? ebuf : curl_easy_strerror(c), r->idempotent ? "" : " (",
                 r->idempotent ? ""
                 : r->once     ? r->once
                               : "an allocation",
                 r->idempotent ? "" : " is never sent again)");
    return rc;
}

static void backoff(struct hbe *b, unsigned attempt)
{
    uint64_t ms = 20u << (attempt < 6 ? attempt : 6);
    if (ms > 1000)
        ms = 1000;
    /* jitter: a value in [ms/2, ms] */
    uint64_t x = atomic_fetch_add(&b->jitter, 0x9e3779b97f4a7c15u) + 0x9e3779b97f4a7c15u;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9u;
    x ^= x >> 29;
    ms = ms / 2 + x % (ms / 2 + 1);
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* Runs r with the retries its kind allows. 0 with r->status (any status:
 * the caller maps it), or the transfer's negative errno. */
static int call(struct hbe *b, struct req *r, struct kvp_error *err)
{
    unsigned max = r->idempotent ? b->m->opts.retries : 0;
    for (unsigned attempt = 0;; attempt++) {
        int rc = perform(b, r, err);
        /* 501: the server has no such operation; asking again will not give it one */
        int again = rc < 0 ? rc != -ENOMEM : r->status >= 500 && r->status != 501;
        if (!again || attempt >= max) {
            if (rc < 0)
                atomic_fetch_add(&b->transport_errors, 1);
            if (rc < 0 && attempt > 0 && err) {
                size_t l = strlen(err->msg);
                snprintf(err->msg + l, sizeof err->msg - l, " (after %u attempts)", attempt + 1);
            }
            return rc;
        }
        atomic_fetch_add(&b->retries, 1);
        backoff(b, attempt);
    }
}

/* The rule an error reply names, with its element, value and bound (struct
 * kvp_error's fields). */
struct rule_fields {
    int rule;
    int64_t index, value, limit;
};

/* What the server's error reply says: its "detail", else its text. Returns 1
 * when it also names the rule it broke ("rule", "index", "value", "limit":
 * a server that writes them for the X-Kvpage-Errors header) into *f. */
static int detail_of(const struct kvp_buf *reply, char *out, size_t cap, struct rule_fields *f)
{
    out[0] = '\0';
    if (!reply->len)
        return 0;
    struct jdoc d;
    if (jparse(&d, reply->p, reply->len) == 0) {
        ptrdiff_t l = jstr(&d, jget(&d, 0, "detail"), out, cap);
        char name[32];
        ptrdiff_t nl = l >= 0 ? jstr(&d, jget(&d, 0, "rule"), name, sizeof name) : -1;
        int named = nl > 0 && (f->rule = kvp_rule_from_name(name, (size_t)nl)) >= 0 &&
                    !jint(&d, jget(&d, 0, "index"), 0, &f->index) &&
                    !jint(&d, jget(&d, 0, "value"), 0, &f->value) &&
                    !jint(&d, jget(&d, 0, "limit"), 0, &f->limit);
        free(d.t);
        if (l >= 0)
            return named;
    }
    size_t n = reply->len < cap - 1 ? reply->len : cap - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (reply->p[i] >= 0x20 && reply->p[i] < 0x7f) ? reply->p[i] : ' ';
    out[n] = '\0';
    while (n && out[n - 1] == ' ') /* "ok\n" of /healthz and the like */
        out[--n] = '\0';
    return 0;
}

enum op { OP_INIT, OP_ALLOC, OP_CONFIRM, OP_PIN, OP_OTHER };

/* The errno of a reply status, and the rule a refusal with that status
 * breaks when the reply does not say. */
static int status_code(long status, int *rule)
{
    switch (status) {
    case 400:
        *rule = KVP_RULE_ARG;
        return -EINVAL;
    case 401:
    case 403:
        *rule = KVP_RULE_NONE;
        return -EACCES;
    case 404:
        *rule = KVP_RULE_NONE;
        return -ENOENT;
    case 409:
        *rule = KVP_RULE_NONE;
        return -EEXIST;
    case 413:
        *rule = KVP_RULE_TOO_MANY;
        return -E2BIG;
    case 507:
        *rule = KVP_RULE_IO;
        return -ENOSPC;
    case 501: /* "Not implemented yet: ..." (a server whose backend lacks the operation) */
        *rule = KVP_RULE_ARG;
        return -EOPNOTSUPP;
    default:
        *rule = status >= 500 ? KVP_RULE_IO : KVP_RULE_NONE;
        return status >= 500 ? -EIO : -EPROTO;
    }
}

/*
 * A server older than the rules' fields names the rule only in its words
 * (docs/protocol.md's error texts): read back from the detail, into f
 * (which holds the status's rule).
 */
static void rule_from_words(long status, const char *detail, enum op op, int64_t rank,
                            const int64_t *pages, size_t n, struct rule_fields *f)
{
    long long x, y, z;
    switch (status) {
    case 400:
        if (sscanf(detail,
                   "Confirmation failed: pages_to_release[%lld] page %lld is outside [0, %lld)", &x,
                   &y, &z) == 3)
            *f = (struct rule_fields){KVP_RULE_RELEASE_PAGE, x, y, z};
        else if (strstr(detail, "Confirmation failed: ") && strstr(detail, "] page ") &&
                 sscanf(strchr(detail, '['), "[%lld] page %lld is outside [0, %lld)", &x, &y, &z) ==
                     3)
            *f = (struct rule_fields){KVP_RULE_CONFIRM_PAGE, x, y, z};
        else if (strstr(detail, "key is ") || strstr(detail, "key contains") ||
                 !strncmp(detail, "Invalid key", 11))
            f->rule = KVP_RULE_KEY;
        else if (!strcmp(detail, "Invalid namespace"))
            f->rule = KVP_RULE_NAMESPACE;
        else if (!strncmp(detail, "Invalid rank", 12))
            f->rule = KVP_RULE_RANK_RANGE, f->value = rank;
        else if (strstr(detail, "num_pages"))
            f->rule = KVP_RULE_NUM_PAGES, f->limit = KVP_MAX_PAGES;
        break;
    case 404:
        if (strstr(detail, "not initialized"))
            f->rule = KVP_RULE_RANK_NOT_INIT, f->value = rank;
        break;
    case 409:
        if (op == OP_CONFIRM) {
            f->rule = KVP_RULE_HELD_BY_OTHER;
            const char *p = strstr(detail, "page ");
            if (p && sscanf(p, "page %lld", &x) == 1) {
                f->value = x;
                for (size_t i = 0; i < n; i++)
                    if (pages[i] == x) {
                        f->index = (long long)i;
                        break;
                    }
            }
        } else if (op == OP_PIN && sscanf(detail,
                                          "Pin refused: pinning %lld more keys would pin %lld "
                                          "keys of the namespace, over the %lld allowed",
                                          &x, &y, &z) == 3) {
            *f = (struct rule_fields){KVP_RULE_TOO_MANY, -1, y, z};
        } else if (op == OP_INIT) {
            f->rule = KVP_RULE_RESIZE_HELD;
            const char *p = strstr(detail, "initialized with ");
            if (p &&
                sscanf(p, "initialized with %lld pages; refusing to change to %lld", &x, &y) == 2)
                f->value = x, f->limit = y;
        }
        break;
    }
}

/* A reply status other than success as the interface's errors, msg naming
 * the route and carrying the server's detail; the rule and its fields as
 * the server sends them, or read back from its words. */
static int status_error(struct hbe *b, const struct req *r, enum op op, int64_t rank,
                        const int64_t *pages, size_t n, struct kvp_error *err)
{
    char detail[256];
    struct rule_fields named, f = {KVP_RULE_NONE, -1, 0, 0};
    int have = detail_of(&r->reply, detail, sizeof detail, &named);
    int code = status_code(r->status, &f.rule);
    atomic_fetch_add(&b->error_replies, 1);
    if (have)
        f = named;
    else
        rule_from_words(r->status, detail, op, rank, pages, n, &f);
    kvp__set_err(err, code, f.rule, f.index, f.value, f.limit, "%s %s: %ld %s", r->method, r->path,
                 r->status, detail);
    return code;
}

static int bad_reply(struct hbe *b, const struct req *r, const char *what, struct kvp_error *err)
{
    atomic_fetch_add(&b->error_replies, 1);
    kvp__set_err(err, -EPROTO, KVP_RULE_IO, -1, 0, 0, "%s %s: %ld reply %s", r->method, r->path,
                 r->status, what);
    return -EPROTO;
}

/* ---------------------------------------------------------------- request bodies */

static struct hns *hns_of(struct kvp_ns *ns)
{
    return (struct hns *)ns;
}

static int keys_utf8(const struct kvp_str *keys, size_t n, struct kvp_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (!kvp__utf8_valid(keys[i].ptr, keys[i].len)) {
            kvp__set_err(err, -EINVAL, KVP_RULE_KEY, (int64_t)i, (int64_t)keys[i].len,
                         KVP_MAX_KEY_LEN,
                         "key %zu is not valid UTF-8: the http:// backend sends keys as JSON "
                         "strings, which kvpage serve reads as UTF-8",
                         i);
            return -EINVAL;
        }
    return 0;
}

static void put_keys(struct kvp_buf *body, const char *field, const struct kvp_str *keys, size_t n)
{
    kvp__buf_reserve(body, n * 8 + 32);
    put_lit(body, "\"");
    put_lit(body, field);
    put_lit(body, "\": [");
    for (size_t i = 0; i < n; i++) {
        if (i)
            put_lit(body, ", ");
        kvp__jw_str(body, keys[i].ptr, keys[i].len);
    }
    put_lit(body, "]");
}

/* , "namespace": POOL — always on SGLang routes, on vLLM routes unless kv. */
static void put_pool(struct kvp_buf *body, const struct hns *s, int vllm)
{
    if (vllm && s->kv)
        return;
    put_lit(body, body->len > 1 ? ", \"namespace\": " : "\"namespace\": ");
    kvp__jw_str(body, s->pool, s->plen);
}

static void rank_path(struct req *r, const struct hns *s, int64_t rank, const char *op)
{
    snprintf(r->path, sizeof r->path, "%s/%lld/%s", s->prefix, (long long)rank, op);
}

static void route_path(struct req *r, const struct hns *s, const char *route)
{
    snprintf(r->path, sizeof r->path, "%s%s", s->prefix, route);
}

/* Sends body (POST) or nothing (GET) to r's path and checks the status is
 * want. 0, or the mapped error. body is freed. */
static int run(struct hbe *b, struct req *r, struct kvp_buf *body, long want, enum op op,
               int64_t rank, const int64_t *pages, size_t n, struct kvp_error *err)
{
    if (body && body->oom) {
        kvp__buf_free(body);
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    r->body = body;
    if (!r->method)
        r->method = body ? "POST" : "GET";
    int rc = call(b, r, err);
    if (body)
        kvp__buf_free(body);
    if (rc)
        return rc;
    if (r->status != want)
        rc = status_error(b, r, op, rank, pages, n, err);
    if (rc && !r->keep)
        kvp__buf_free(&r->reply);
    return rc;
}

/* The reply's list field (n elements) at *arr. 0 or -EPROTO. */
static int reply_list(struct hbe *b, struct req *r, struct jdoc *d, const char *field, size_t n,
                      int *arr, struct kvp_error *err)
{
    if (jparse(d, r->reply.p ? r->reply.p : "", r->reply.len)) {
        int rc = bad_reply(b, r, "is not JSON", err);
        kvp__buf_free(&r->reply);
        return rc;
    }
    int a = jget(d, 0, field);
    if (a < 0 || d->t[a].type != JSMN_ARRAY || (size_t)d->t[a].size != n) {
        char what[96];
        snprintf(what, sizeof what, "has no list \"%s\" of %zu elements", field, n);
        int rc = bad_reply(b, r, what, err);
        free(d->t);
        kvp__buf_free(&r->reply);
        return rc;
    }
    *arr = a;
    return 0;
}

/* ---------------------------------------------------------------- operations */

/* POSTs {["rank": R, ]"keys": [...][, "namespace": P]} to the vLLM route
 * (vllm: rank in the body when >= 0) or to /{rank}/route, and checks the
 * status is want. r->idempotent is the caller's. */
/* field: one more string field of the body ("order" of reserve, "reason"
 * of an integrity delete) with its value, or NULL; extra: more members as
 * written (", " first: a pin's "ttl_s"), or NULL. r->once marks a pin. */
static int keys_call_field(struct kvp_ns *ns, int64_t rank, int vllm, const char *route,
                           const char *field, const char *value, const char *extra,
                           const struct kvp_str *keys, size_t n, long want, struct req *r,
                           struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    int rc = keys_utf8(keys, n, err);
    if (rc)
        return rc;
    struct kvp_buf body = {0};
    put_lit(&body, "{");
    if (vllm && rank >= 0) {
        put_lit(&body, "\"rank\": ");
        kvp__jw_int(&body, rank);
        put_lit(&body, ", ");
    }
    put_keys(&body, "keys", keys, n);
    put_pool(&body, s, vllm);
    if (field && value) {
        put_lit(&body, ", \"");
        kvp__buf_put(&body, field, strlen(field));
        put_lit(&body, "\": \"");
        kvp__buf_put(&body, value, strlen(value));
        put_lit(&body, "\"");
    }
    if (extra)
        put_lit(&body, extra);
    put_lit(&body, "}");
    if (vllm)
        route_path(r, s, route);
    else
        rank_path(r, s, rank, route);
    return run(be_of(ns->meta), r, &body, want,
               r->once         ? OP_PIN
               : r->idempotent ? OP_OTHER
                               : OP_ALLOC,
               rank, NULL, 0, err);
}

static int keys_call(struct kvp_ns *ns, int64_t rank, int vllm, const char *route,
                     const struct kvp_str *keys, size_t n, long want, struct req *r,
                     struct kvp_error *err)
{
    return keys_call_field(ns, rank, vllm, route, NULL, NULL, NULL, keys, n, want, r, err);
}

static int h_init_rank(struct kvp_ns *ns, uint32_t rank, uint32_t num_pages, uint64_t *ticket,
                       struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    struct hbe *b = be_of(ns->meta);
    struct req r = {.idempotent = 1};
    struct kvp_buf body = {0};
    put_lit(&body, "{\"num_pages\": ");
    kvp__jw_int(&body, num_pages);
    put_pool(&body, s, 0);
    put_lit(&body, "}");
    rank_path(&r, s, rank, "initialize");
    int rc = run(b, &r, &body, 204, OP_INIT, rank, NULL, 0, err);
    if (rc == -EEXIST && err && err->limit == 0)
        err->limit = num_pages;
    kvp__buf_free(&r.reply);
    return rc;
}

/* SGLang's reserve route, with the order as the "order" field (protocol-notes,
 * "The order of free pages"); a server before it ignores the field and
 * answers in its own order. */
static int h_allocate_ordered(struct kvp_ns *ns, uint32_t rank, int order,
                              const struct kvp_str *keys, size_t n, int64_t *pages,
                              uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    struct hbe *b = be_of(ns->meta);
    struct req r = {.idempotent = 0}; /* never repeated */
    const char *name = order == KVP_ORDER_VLLM     ? "vllm"
                       : order == KVP_ORDER_SGLANG ? NULL /* the route's own */
                                                   : "default";
    int rc = keys_call_field(ns, rank, 0, "reserve_and_allocate_page_indices", "order", name, NULL,
                             keys, n, 200, &r, err);
    if (rc)
        return rc;
    struct jdoc d;
    int a;
    if ((rc = reply_list(b, &r, &d, "indices", n, &a, err)))
        return rc;
    int i = a + 1;
    for (size_t k = 0; k < n; k++) {
        uint8_t ex;
        int64_t p;
        if (d.t[i].type != JSMN_ARRAY || d.t[i].size != 2 || jbool(&d, i + 1, &ex) ||
            jint(&d, i + 2, 0, &p)) {
            rc = bad_reply(b, &r, "has an indices element that is not [bool, page]", err);
            break;
        }
        pages[k] = p;
        if (existed)
            existed[k] = ex;
        i = jskip(&d, i);
    }
    free(d.t);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_allocate(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys, size_t n,
                      int64_t *pages, uint8_t *existed, uint64_t *ticket, struct kvp_error *err)
{
    return h_allocate_ordered(ns, rank, KVP_ORDER_DEFAULT, keys, n, pages, existed, ticket, err);
}

/* Whether each parent after the first is the key confirmed before it. */
static int is_chain(const struct kvp_str *keys, const struct kvp_str *parents, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (parents[i].len != keys[i - 1].len ||
            memcmp(parents[i].ptr, keys[i - 1].ptr, keys[i - 1].len))
            return 0;
    return 1;
}

/* A parent as JSON: a key, or null (not known; also a parent that is not
 * UTF-8, which a JSON string cannot carry). */
static void put_parent(struct kvp_buf *body, const struct kvp_str *p)
{
    if (p->len && kvp__utf8_valid(p->ptr, p->len))
        kvp__jw_str(body, p->ptr, p->len);
    else
        put_lit(body, "null");
}

/* A confirmation's parents and tokens (protocol.md 14.1), each only when o
 * has them: parents that are a chain as "prefix_key" (which the server
 * reads on its fast path, as kvpage.vllm and kvpage.sglang send them), else
 * "parent_keys"; "token_ids". */
static void put_confirm_opts(struct kvp_buf *body, const struct kvp_str *keys,
                             const struct kvp_confirm_opts *o, size_t n)
{
    if (o->parents && n && is_chain(keys, o->parents, n)) {
        put_lit(body, ", \"prefix_key\": ");
        put_parent(body, &o->parents[0]);
    } else if (o->parents) {
        put_lit(body, ", \"parent_keys\": [");
        for (size_t i = 0; i < n; i++) {
            if (i)
                put_lit(body, ", ");
            put_parent(body, &o->parents[i]);
        }
        put_lit(body, "]");
    }
    if (o->ntokens) {
        put_lit(body, ", \"token_ids\": [");
        for (size_t i = 0; i < n; i++) {
            if (i)
                put_lit(body, ", ");
            if (!o->ntokens[i]) {
                put_lit(body, "null");
                continue;
            }
            put_lit(body, "[");
            for (uint32_t k = 0; k < o->ntokens[i]; k++) {
                if (k)
                    put_lit(body, ", ");
                kvp__jw_int(body, o->token_ids[i][k]);
            }
            put_lit(body, "]");
        }
        put_lit(body, "]");
    }
}

static int h_confirm_ex(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                        const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                        const struct kvp_confirm_opts *opts, uint64_t *ticket,
                        struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    struct hbe *b = be_of(ns->meta);
    int rc = keys_utf8(keys, n, err);
    if (rc)
        return rc;
    struct req r = {.idempotent = 1}; /* a confirmation again changes nothing */
    struct kvp_buf body = {0};
    kvp__buf_reserve(&body, n * 16 + nrel * 8 + 64);
    put_lit(&body, "{\"written_keys_to_confirm\": [");
    for (size_t i = 0; i < n; i++) {
        put_lit(&body, i ? ", [" : "[");
        kvp__jw_str(&body, keys[i].ptr, keys[i].len);
        put_lit(&body, ", ");
        kvp__jw_int(&body, pages[i]);
        put_lit(&body, "]");
    }
    put_lit(&body, "], \"pages_to_release\": [");
    for (size_t i = 0; i < nrel; i++) {
        if (i)
            put_lit(&body, ", ");
        kvp__jw_int(&body, release[i]);
    }
    put_lit(&body, "]");
    if (opts)
        put_confirm_opts(&body, keys, opts, n);
    put_pool(&body, s, 0);
    put_lit(&body, "}");
    rank_path(&r, s, rank, "confirm_write");
    rc = run(b, &r, &body, 204, OP_CONFIRM, rank, pages, n, err);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_confirm(struct kvp_ns *ns, uint32_t rank, const struct kvp_str *keys,
                     const int64_t *pages, size_t n, const int64_t *release, size_t nrel,
                     uint64_t *ticket, struct kvp_error *err)
{
    return h_confirm_ex(ns, rank, keys, pages, n, release, nrel, NULL, ticket, err);
}

static int h_exists(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                    uint8_t *out, struct kvp_error *err)
{
    struct hbe *b = be_of(ns->meta);
    struct req r = {.idempotent = 1};
    int rc = keys_call(ns, rank, rank < 0, rank < 0 ? "/keys/batch_exists" : "exists", keys, n, 200,
                       &r, err);
    if (rc)
        return rc;
    struct jdoc d;
    int a;
    if ((rc = reply_list(b, &r, &d, "exists", n, &a, err)))
        return rc;
    for (size_t k = 0; k < n; k++)
        if (jbool(&d, a + 1 + (int)k, &out[k])) {
            rc = bad_reply(b, &r, "has an exists element that is not a bool", err);
            break;
        }
    free(d.t);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_lookup(struct kvp_ns *ns, uint32_t rank, int complete_only, const struct kvp_str *keys,
                    size_t n, int64_t *pages, struct kvp_error *err)
{
    struct hbe *b = be_of(ns->meta);
    struct req r = {.idempotent = 1};
    const char *field = complete_only ? "locations" : "indices";
    int rc = keys_call(ns, rank, complete_only,
                       complete_only ? "/keys/get_locations" : "get_page_indices", keys, n, 200, &r,
                       err);
    if (rc)
        return rc;
    struct jdoc d;
    int a;
    if ((rc = reply_list(b, &r, &d, field, n, &a, err)))
        return rc;
    for (size_t k = 0; k < n; k++)
        if (jint(&d, a + 1 + (int)k, 1, &pages[k])) {
            rc = bad_reply(b, &r, "has an element that is not a page or null", err);
            break;
        }
    free(d.t);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_delete(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                    uint64_t *ticket, struct kvp_error *err)
{
    struct req r = {.idempotent = 1};
    int rc = keys_call(ns, rank, rank < 0, rank < 0 ? "/keys/delete" : "delete_keys", keys, n, 204,
                       &r, err);
    kvp__buf_free(&r.reply);
    return rc;
}

/* A delete of keys whose pages failed their integrity tag: the delete
 * route with "reason": "integrity", which the server counts per namespace
 * (kvpage_pages_rejected_total); a server before the field ignores it and
 * deletes them all the same. */
static int h_delete_rejected(struct kvp_ns *ns, int64_t rank, const struct kvp_str *keys, size_t n,
                             uint64_t *ticket, struct kvp_error *err)
{
    struct req r = {.idempotent = 1};
    int rc = keys_call_field(ns, rank, rank < 0, rank < 0 ? "/keys/delete" : "delete_keys",
                             "reason", "integrity", NULL, keys, n, 204, &r, err);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_clear(struct kvp_ns *ns, int64_t rank, uint64_t *ticket, struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    struct hbe *b = be_of(ns->meta);
    struct req r = {.idempotent = 1};
    struct kvp_buf body = {0};
    put_lit(&body, "{");
    put_pool(&body, s, rank < 0);
    put_lit(&body, "}");
    if (rank < 0)
        route_path(&r, s, "/clear");
    else
        rank_path(&r, s, rank, "clear");
    int rc = run(b, &r, &body, 204, OP_OTHER, rank, NULL, 0, err);
    kvp__buf_free(&r.reply);
    return rc;
}

/* kvpage's POST [/ns/DEP]/drop. A server older than the route answers 404
 * without "Namespace not found": -EOPNOTSUPP, saying so. */
static int h_drop(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
                  uint64_t *ticket, struct kvp_error *err)
{
    struct kvp_ns *ns;
    int rc = m->ops->ns(m, dep, dlen, pool, plen, 1, &ns, ticket, err);
    if (rc)
        return rc;
    struct hns *s = hns_of(ns);
    struct req r = {.idempotent = 1};
    struct kvp_buf body = {0};
    put_lit(&body, "{");
    put_pool(&body, s, 0);
    put_lit(&body, "}");
    route_path(&r, s, "/drop");
    rc = run(be_of(m), &r, &body, 204, OP_OTHER, -1, NULL, 0, err);
    if (rc == -ENOENT && err && !strstr(err->msg, "Namespace not found")) {
        char was[sizeof err->msg];
        snprintf(was, sizeof was, "%s", err->msg);
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                     "the server cannot drop a namespace (older than the route; %s)", was);
        rc = -EOPNOTSUPP;
    }
    kvp__buf_free(&r.reply);
    return rc;
}

/* ---------------------------------------------------------------- /v1/stats */

/* The server's identity (its backend's, kvp_meta_identity): server.identity
 * of GET /v1/stats, asked once; NULL when it has none (an older server) or
 * did not answer (asked again at the next call). */
static const char *h_identity(struct kvp_meta *m)
{
    struct hbe *b = be_of(m);
    pthread_mutex_lock(&b->idlock);
    if (!b->id_asked) {
        struct req r = {.idempotent = 1};
        struct kvp_error err = {0};
        snprintf(r.path, sizeof r.path, "/v1/stats");
        struct jdoc d = {0};
        char id[KVP_IDENTITY_LEN + 8];
        if (run(b, &r, NULL, 200, OP_OTHER, -1, NULL, 0, &err) == 0) {
            b->id_asked = 1;
            if (!jparse(&d, r.reply.p ? r.reply.p : "", r.reply.len) &&
                jstr(&d, jget(&d, jget(&d, 0, "server"), "identity"), id, sizeof id) ==
                    KVP_IDENTITY_LEN &&
                kvp__identity_valid(id, KVP_IDENTITY_LEN))
                m->identity = strndup(id, KVP_IDENTITY_LEN);
            free(d.t);
        }
        kvp__buf_free(&r.reply);
    }
    pthread_mutex_unlock(&b->idlock);
    return m->identity;
}

/* GET /v1/stats into *r and *d, *a its list "namespaces". 0 (free d->t and
 * r->reply), or the error (nothing to free). */
static int get_stats(struct hbe *b, struct req *r, struct jdoc *d, int *a, struct kvp_error *err)
{
    *r = (struct req){.idempotent = 1};
    snprintf(r->path, sizeof r->path, "/v1/stats");
    int rc = run(b, r, NULL, 200, OP_OTHER, -1, NULL, 0, err);
    if (rc)
        return rc;
    if (jparse(d, r->reply.p ? r->reply.p : "", r->reply.len) ||
        (*a = jget(d, 0, "namespaces")) < 0 || d->t[*a].type != JSMN_ARRAY) {
        free(d->t);
        rc = bad_reply(b, r, "has no list \"namespaces\"", err);
        kvp__buf_free(&r->reply);
        return rc;
    }
    return 0;
}

/* Calls fn for each namespace of the server's /v1/stats (of the fixed
 * deployment only, when the location names one). */
static int walk_stats(struct hbe *b, kvp_meta_stats_fn fn, void *arg, struct kvp_error *err)
{
    struct req r;
    struct jdoc d;
    int a, rc = get_stats(b, &r, &d, &a, err);
    if (rc)
        return rc;
    static const char *const fields[] = {"num_pages",
                                         "free",
                                         "reserved",
                                         "held",
                                         "keys",
                                         "hits",
                                         "misses",
                                         "allocations",
                                         "evictions",
                                         "expired_reservations",
                                         "release_of_held_page"};
    struct kvp_rank_stats *ranks = NULL;
    int i = a + 1;
    for (int k = 0; k < d.t[a].size && !rc; k++, i = jskip(&d, i)) {
        char dep[KVP_MAX_NAME_LEN * 4 + 8], pool[KVP_MAX_NAME_LEN * 4 + 8];
        int ra = jget(&d, i, "ranks");
        if (jstr(&d, jget(&d, i, "deployment"), dep, sizeof dep) < 0 ||
            jstr(&d, jget(&d, i, "pool"), pool, sizeof pool) < 0 || ra < 0 ||
            d.t[ra].type != JSMN_ARRAY) {
            rc = bad_reply(b, &r, "has a namespace without deployment, pool and ranks", err);
            break;
        }
        if (b->fixed_dep && strcmp(dep, b->fixed_dep))
            continue;
        size_t nr = (size_t)d.t[ra].size;
        struct kvp_rank_stats *nrk = realloc(ranks, (nr ? nr : 1) * sizeof *ranks);
        if (!nrk) {
            rc = -ENOMEM;
            break;
        }
        ranks = nrk;
        int j = ra + 1;
        for (size_t q = 0; q < nr; q++, j = jskip(&d, j)) {
            struct kvp_rank_stats *st = &ranks[q];
            int64_t v;
            memset(st, 0, sizeof *st);
            if (jint(&d, jget(&d, j, "rank"), 0, &v)) {
                rc = bad_reply(b, &r, "has a rank without its number", err);
                break;
            }
            st->rank = (uint32_t)v;
            uint64_t *dst[] = {&st->num_pages,
                               &st->free,
                               &st->reserved,
                               &st->held,
                               &st->keys,
                               &st->hits,
                               &st->misses,
                               &st->allocations,
                               &st->evictions,
                               &st->expired_reservations,
                               &st->release_of_held_page};
            for (size_t f = 0; f < sizeof fields / sizeof *fields; f++)
                if (jint(&d, jget(&d, j, fields[f]), 0, &v) == 0)
                    *dst[f] = (uint64_t)v;
        }
        if (!rc)
            rc = fn(dep, pool, ranks, nr, arg);
    }
    free(ranks);
    free(d.t);
    kvp__buf_free(&r.reply);
    return rc;
}

static int h_stats(struct kvp_meta *m, kvp_meta_stats_fn fn, void *arg)
{
    return walk_stats(be_of(m), fn, arg, NULL);
}

struct find_ns {
    const struct hns *s;
    int found;
    size_t nranks;
};

static int find_fn(const char *dep, const char *pool, const struct kvp_rank_stats *ranks,
                   size_t nranks, void *arg)
{
    struct find_ns *f = arg;
    if (strlen(dep) == f->s->dlen && !memcmp(dep, f->s->dep, f->s->dlen) &&
        strlen(pool) == f->s->plen && !memcmp(pool, f->s->pool, f->s->plen)) {
        f->found = 1;
        f->nranks = nranks;
    }
    return 0;
}

static size_t h_nranks(struct kvp_ns *ns)
{
    struct find_ns f = {.s = hns_of(ns)};
    if (walk_stats(be_of(ns->meta), find_fn, &f, NULL))
        return 0;
    return f.nranks;
}

/* ---------------------------------------------------------------- pins, the query by hashes */

/* Whether the object at i names s's namespace: "deployment" (when dep) and
 * pool_field as s has them. */
static int names_ns(const struct jdoc *d, int i, const struct hns *s, int dep,
                    const char *pool_field)
{
    char v[KVP_MAX_NAME_LEN * 4 + 8];
    ptrdiff_t l;
    if (dep && ((l = jstr(d, jget(d, i, "deployment"), v, sizeof v)) < 0 || (size_t)l != s->dlen ||
                memcmp(v, s->dep, s->dlen)))
        return 0;
    l = jstr(d, jget(d, i, pool_field), v, sizeof v);
    return l >= 0 && (size_t)l == s->plen && !memcmp(v, s->pool, s->plen);
}

/* A 404 of /v1/pins: the server knows the route but not the namespace, or
 * it has no rank: -ENOENT (the namespace has no initialized rank, as
 * in-process); any other 404 is a server older than the route. */
static int pins_404(struct kvp_error *err)
{
    if (err && (strstr(err->msg, "Namespace '") || strstr(err->msg, "no initialized rank"))) {
        err->rule = KVP_RULE_RANK_NOT_INIT;
        return -ENOENT;
    }
    if (err) {
        char was[sizeof err->msg];
        snprintf(was, sizeof was, "%s", err->msg);
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                     "the server has no pins (older than the route; %s)", was);
    }
    return -EOPNOTSUPP;
}

/* POST /v1/pins (protocol.md §13.2) with the caller's ratio as
 * "max_pinned_ratio" (the server applies the lower of it and its own
 * --max-pinned-ratio). A pin adds references: never sent again. */
static int h_pin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t ttl_ms,
                 double max_ratio, uint64_t *total, uint64_t *limit, struct kvp_error *err)
{
    struct kvp_error mine; /* the refusal's rule decides the errno */
    if (!err)
        err = &mine;
    struct hbe *b = be_of(ns->meta);
    struct req r = {.keep = 1, .once = "a pin"};
    char extra[96];
    snprintf(extra, sizeof extra, ", \"ttl_s\": %llu.%03u, \"max_pinned_ratio\": %.17g",
             (unsigned long long)(ttl_ms / 1000), (unsigned)(ttl_ms % 1000), max_ratio);
    int rc = keys_call_field(ns, -1, 1, "/v1/pins", NULL, NULL, extra, keys, n, 200, &r, err);
    /* the answer's figures; a refusal over the limit carries them too (to a
     * client that asks for the rule's fields) */
    struct jdoc d = {0};
    int64_t t = -1, l = -1;
    if ((!rc || r.status == 409) && !jparse(&d, r.reply.p ? r.reply.p : "", r.reply.len)) {
        jint(&d, jget(&d, 0, "pinned_keys"), 0, &t);
        jint(&d, jget(&d, 0, "max_pinned_keys"), 0, &l);
        free(d.t);
    }
    if (!rc && (t < 0 || l < 0))
        rc = bad_reply(b, &r, "has no pinned_keys and max_pinned_keys", err);
    else if (rc && r.status == 409 && err && err->rule == KVP_RULE_TOO_MANY) {
        rc = err->code = -ENOSPC;
        l = err->limit;
    } else if (rc && r.status == 409) { /* the server's state is read-only */
        rc = -EROFS;
        if (err)
            err->code = rc;
    } else if (rc && r.status == 404) {
        rc = pins_404(err);
        if (err)
            err->code = rc;
    }
    *total = t >= 0 ? (uint64_t)t : 0;
    *limit = l >= 0 ? (uint64_t)l : 0;
    kvp__buf_free(&r.reply);
    return rc;
}

/* DELETE /v1/pins: one reference taken back from each key. Never sent
 * again (a second would take another). */
static int h_unpin(struct kvp_ns *ns, const struct kvp_str *keys, size_t n, uint64_t *released,
                   struct kvp_error *err)
{
    struct kvp_error mine; /* the refusal's rule decides the errno */
    if (!err)
        err = &mine;
    struct hbe *b = be_of(ns->meta);
    struct req r = {.method = "DELETE", .once = "an unpin"};
    int rc = keys_call_field(ns, -1, 1, "/v1/pins", NULL, NULL, NULL, keys, n, 200, &r, err);
    *released = 0;
    struct jdoc d;
    int64_t v = -1;
    if (!rc && !jparse(&d, r.reply.p ? r.reply.p : "", r.reply.len)) {
        jint(&d, jget(&d, 0, "unpinned"), 0, &v);
        free(d.t);
    }
    if (!rc && v < 0)
        rc = bad_reply(b, &r, "has no unpinned", err);
    else if (!rc)
        *released = (uint64_t)v;
    else if (r.status == 409) { /* read-only */
        rc = -EROFS;
        if (err)
            err->code = rc;
    } else if (r.status == 404 && (rc = pins_404(err)) == -ENOENT) {
        rc = 0; /* no rank: nothing was pinned */
        if (err)
            memset(err, 0, sizeof *err);
    } else if (r.status == 404 && err) {
        err->code = rc;
    }
    kvp__buf_free(&r.reply);
    return rc;
}

/* The pins of GET /v1/stats ("pins": the namespace's keys and refs, and by
 * rank "ranks" and "rank_refs"); -ENOENT for a rank the namespace has not
 * initialized, as in-process. */
static int h_pinned(struct kvp_ns *ns, int64_t rank, uint64_t *keys, uint64_t *refs,
                    struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    struct hbe *b = be_of(ns->meta);
    struct req r;
    struct jdoc d;
    int a, rc = get_stats(b, &r, &d, &a, err);
    if (rc)
        return rc;
    char rk[16];
    snprintf(rk, sizeof rk, "%lld", (long long)rank);
    int found = rank < 0, i = a + 1;
    for (int k = 0; k < d.t[a].size && !found; k++, i = jskip(&d, i)) {
        int ra = jget(&d, i, "ranks"), j = ra + 1;
        if (ra < 0 || d.t[ra].type != JSMN_ARRAY || !names_ns(&d, i, s, 1, "pool"))
            continue;
        for (int q = 0; q < d.t[ra].size && !found; q++, j = jskip(&d, j)) {
            int64_t v;
            found = !jint(&d, jget(&d, j, "rank"), 0, &v) && v == rank;
        }
    }
    int pins = jget(&d, 0, "pins"), list = jget(&d, pins, "namespaces");
    uint8_t yes = 0;
    int64_t nk = 0, nr = 0;
    if (!found) {
        rc = kvp__err_rank_not_init(err, rank);
    } else if (list < 0 || d.t[list].type != JSMN_ARRAY ||
               jbool(&d, jget(&d, pins, "supported"), &yes) || !yes) {
        kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                     "pins are not implemented yet by the server at %s (its /v1/stats lists none)",
                     b->root);
        rc = -EOPNOTSUPP;
    } else {
        i = list + 1;
        for (int k = 0; k < d.t[list].size; k++, i = jskip(&d, i)) {
            if (!names_ns(&d, i, s, 1, "pool"))
                continue;
            if (rank < 0) {
                jint(&d, jget(&d, i, "keys"), 0, &nk);
                jint(&d, jget(&d, i, "refs"), 0, &nr);
            } else {
                jint(&d, jget(&d, jget(&d, i, "ranks"), rk), 0, &nk);
                jint(&d, jget(&d, jget(&d, i, "rank_refs"), rk), 0, &nr);
            }
        }
    }
    free(d.t);
    kvp__buf_free(&r.reply);
    if (keys)
        *keys = rc ? 0 : (uint64_t)nk;
    if (refs)
        *refs = rc ? 0 : (uint64_t)nr;
    return rc;
}

/* POST /v1/query by "block_hashes" with "held": true, which adds to each
 * rank of the answer which of the hashes it holds; "rank" when one is
 * asked. A rank the answer lacks is not initialized. */
static int h_exists_hashes(struct kvp_ns *ns, const uint64_t *hashes, size_t n, int form,
                           const uint32_t *ranks, size_t nranks, uint8_t *out,
                           struct kvp_error *err)
{
    struct hns *s = hns_of(ns);
    struct hbe *b = be_of(ns->meta);
    if (!nranks)
        return 0;
    struct req r = {.idempotent = 1};
    struct kvp_buf body = {0};
    kvp__buf_reserve(&body, n * 22 + 128);
    put_lit(&body, "{\"block_hashes\": [");
    for (size_t i = 0; i < n; i++) {
        if (i)
            put_lit(&body, ", ");
        kvp__jw_int(&body, (int64_t)hashes[i]); /* the server reads an integer's 64 bits */
    }
    put_lit(&body, form == KVP_HASH_VLLM ? "], \"hash_format\": \"vllm\", \"held\": true"
                                         : "], \"hash_format\": \"sglang\", \"held\": true");
    if (nranks == 1)
        kvp__buf_printf(&body, ", \"rank\": %u", ranks[0]);
    put_pool(&body, s, 0);
    put_lit(&body, "}");
    route_path(&r, s, "/v1/query");
    int rc = run(b, &r, &body, 200, OP_OTHER, -1, NULL, 0, err);
    if (rc)
        return rc;
    struct jdoc d;
    int a;
    if (jparse(&d, r.reply.p ? r.reply.p : "", r.reply.len) ||
        (a = jget(&d, 0, "namespaces")) < 0 || d.t[a].type != JSMN_ARRAY) {
        free(d.t);
        rc = bad_reply(b, &r, "has no list \"namespaces\"", err);
        kvp__buf_free(&r.reply);
        return rc;
    }
    int i = a + 1, rk = -1;
    for (int k = 0; k < d.t[a].size && rk < 0; k++, i = jskip(&d, i))
        if (names_ns(&d, i, s, 0, "namespace"))
            rk = jget(&d, i, "ranks");
    for (size_t j = 0; j < nranks && !rc; j++) {
        char name[16];
        snprintf(name, sizeof name, "%u", ranks[j]);
        int e = jget(&d, rk, name), h = jget(&d, e, "held");
        if (e < 0) {
            rc = kvp__err_rank_not_init(err, ranks[j]);
        } else if (h < 0) { /* a server before "held" */
            kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                         "the query by block hashes is not implemented yet by the server at %s "
                         "(its /v1/query answers no \"held\")",
                         b->root);
            rc = -EOPNOTSUPP;
        } else if (d.t[h].type != JSMN_ARRAY || (size_t)d.t[h].size != n) {
            rc = bad_reply(b, &r, "has a \"held\" that is not a list of one bool per hash", err);
        }
        for (size_t q = 0; !rc && q < n; q++)
            if (jbool(&d, h + 1 + (int)q, &out[q * nranks + j]))
                rc = bad_reply(b, &r, "has a \"held\" element that is not a bool", err);
    }
    free(d.t);
    kvp__buf_free(&r.reply);
    return rc;
}

/* ---------------------------------------------------------------- namespaces */

static int h_ns(struct kvp_meta *m, const char *dep, size_t dlen, const char *pool, size_t plen,
                int create, struct kvp_ns **out, uint64_t *ticket, struct kvp_error *err)
{
    struct hbe *b = be_of(m);
    if (b->fixed_dep && (strlen(b->fixed_dep) != dlen || memcmp(b->fixed_dep, dep, dlen))) {
        kvp__set_err(err, -EINVAL, KVP_RULE_NAMESPACE, -1, 0, 0,
                     "deployment '%.*s' is not the location's: %s/ns/%s serves deployment '%s' "
                     "only",
                     (int)dlen, dep, b->root, b->fixed_dep, b->fixed_dep);
        return -EINVAL;
    }
    if (!kvp__utf8_valid(pool, plen)) {
        kvp__set_err(err, -EINVAL, KVP_RULE_NAMESPACE, -1, 0, 0,
                     "pool is not valid UTF-8: the http:// backend sends it as a JSON string");
        return -EINVAL;
    }
    pthread_mutex_lock(&b->lock);
    struct hns *s = b->nss;
    for (; s; s = s->next)
        if (s->dlen == dlen && !memcmp(s->dep, dep, dlen) && s->plen == plen &&
            !memcmp(s->pool, pool, plen))
            break;
    if (!s && (s = calloc(1, sizeof *s)) && (s->dep = malloc(dlen + 1)) &&
        (s->pool = malloc(plen + 1))) {
        memcpy(s->dep, dep, dlen);
        s->dep[dlen] = '\0';
        memcpy(s->pool, pool, plen);
        s->pool[plen] = '\0';
        s->dlen = dlen;
        s->plen = plen;
        s->kv = plen == 2 && !memcmp(pool, "kv", 2);
        s->head.meta = m;
        if (b->fixed_dep || !(dlen == 7 && !memcmp(dep, "default", 7)))
            snprintf(s->prefix, sizeof s->prefix, "/ns/%s", s->dep);
        s->next = b->nss;
        b->nss = s;
    } else if (s && !s->pool) {
        free(s->dep);
        free(s);
        s = NULL;
    }
    pthread_mutex_unlock(&b->lock);
    if (!s) {
        kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
        return -ENOMEM;
    }
    /* Created lazily: the server makes a namespace at its first initialize. */
    if (!create) {
        struct find_ns f = {.s = s};
        int rc = walk_stats(b, find_fn, &f, err);
        if (rc)
            return rc;
        if (!f.found) {
            kvp__set_err(err, -ENOENT, KVP_RULE_NAMESPACE, -1, 0, 0,
                         "namespace (%.*s, %.*s) does not exist on %s", (int)dlen, dep,
                         (int)(plen > 64 ? 64 : plen), pool, b->root);
            return -ENOENT;
        }
    }
    *out = &s->head;
    return 0;
}

/* ---------------------------------------------------------------- the rest */

static int h_check(struct kvp_meta *m, struct kvp_error *err)
{
    kvp__set_err(err, -EOPNOTSUPP, KVP_RULE_ARG, -1, 0, 0,
                 "the invariants of %s are checked on the server: run kvpage fsck on its data "
                 "directory",
                 be_of(m)->root);
    return -EOPNOTSUPP;
}

static int h_wait(struct kvp_meta *m, uint64_t ticket, struct kvp_error *err)
{
    return 0; /* no tickets: every change is durable once answered */
}

static int h_when_durable(struct kvp_meta *m, uint64_t ticket, kvp_meta_durable_fn fn, void *arg)
{
    return 1;
}

static int h_values(struct kvp_meta *m, kvp_meta_value_fn fn, void *arg)
{
    struct hbe *b = be_of(m);
    struct kvp_meta_value v[] = {
        {"http_client", "requests", "kvpage_http_client_requests_total",
         "HTTP requests sent to the server, retries included.", KVP_VALUE_COUNTER, 0,
         atomic_load(&b->requests), NULL, NULL},
        {"http_client", "retries", "kvpage_http_client_retries_total",
         "Idempotent requests sent again after a failed connection, a timeout or a 5xx.",
         KVP_VALUE_COUNTER, 0, atomic_load(&b->retries), NULL, NULL},
        {"http_client", "connections", "kvpage_http_client_connections_total",
         "TCP connections opened to the server (the others were reused).", KVP_VALUE_COUNTER, 0,
         atomic_load(&b->connections), NULL, NULL},
        {"http_client", "transport_errors", "kvpage_http_client_transport_errors_total",
         "Calls that failed without a reply (refused, reset, timed out), after their retries.",
         KVP_VALUE_COUNTER, 0, atomic_load(&b->transport_errors), NULL, NULL},
        {"http_client", "error_replies", "kvpage_http_client_error_replies_total",
         "Replies that were an error status or could not be read.", KVP_VALUE_COUNTER, 0,
         atomic_load(&b->error_replies), NULL, NULL},
        {"http_client", "handles", "kvpage_http_client_handles",
         "curl handles (each with its connection) in use or idle.", KVP_VALUE_GAUGE, 0,
         atomic_load(&b->handles), NULL, NULL},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        int rc = fn(&v[i], arg);
        if (rc)
            return rc;
    }
    return 0;
}

static int h_health(struct kvp_meta *m, int *scope, char *why, size_t len)
{
    struct hbe *b = be_of(m);
    *scope = KVP_HEALTH_ALL;
    struct req r = {.idempotent = 1, .method = "GET"};
    snprintf(r.path, sizeof r.path, "/healthz");
    struct kvp_error err = {0};
    int rc = call(b, &r, &err);
    char text[256];
    if (rc) {
        if (why && len)
            snprintf(why, len, "%s", err.msg);
        kvp__buf_free(&r.reply);
        return rc;
    }
    struct rule_fields unused;
    detail_of(&r.reply, text, sizeof text, &unused);
    kvp__buf_free(&r.reply);
    if (r.status == 200 && !strcmp(text, "ok"))
        return 0;
    if (r.status == 200 && !strncmp(text, "degraded: ", 10))
        *scope = KVP_HEALTH_WRITES; /* "degraded: writes refused: ...": reads are served */
    if (r.status == 200)
        rc = strstr(text, "No space left") ? -ENOSPC
             : strstr(text, "quota")       ? -EDQUOT
                                           : -EIO; /* or "unavailable: ..." */
    else
        rc = r.status == 401 || r.status == 403 ? -EACCES : -ECONNREFUSED;
    if (why && len)
        snprintf(why, len, "GET /healthz of %s: %ld %s", b->root, r.status, text);
    return rc;
}

static int h_describe(struct kvp_meta *m, char *buf, size_t len)
{
    struct hbe *b = be_of(m);
    return snprintf(buf, len, "kvpage serve at %s%s%s", b->root, b->fixed_dep ? "/ns/" : "",
                    b->fixed_dep ? b->fixed_dep : "");
}

static int h_snapshot(struct kvp_meta *m)
{
    return -EOPNOTSUPP; /* the server writes its own snapshots */
}

/* ---------------------------------------------------------------- open, close */

static void h_close(struct kvp_meta *m)
{
    struct hbe *b = be_of(m);
    if (!b)
        return;
    for (size_t i = 0; i < b->nidle; i++)
        curl_easy_cleanup(b->idle[i]);
    for (struct hns *s = b->nss, *next; s; s = next) {
        next = s->next;
        free(s->dep);
        free(s->pool);
        free(s);
    }
    curl_slist_free_all(b->headers);
    pthread_mutex_destroy(&b->lock);
    pthread_mutex_destroy(&b->idlock);
    free((char *)m->opts.token);
    m->opts.token = NULL;
    free(b->root);
    free(b->fixed_dep);
    free(b);
    m->be = NULL;
}

static int bad_location(struct kvp_error *err, const char *where, const char *why)
{
    kvp__set_err(err, -EINVAL, KVP_RULE_ARG, -1, 0, 0,
                 "location 'http:%.96s' %s (http://HOST:PORT or http://HOST:PORT/ns/NAME)",
                 where ? where : "", why);
    return -EINVAL;
}

/* where: "//HOST:PORT[/ns/NAME][/]". */
static int h_open(struct kvp_meta *m, const char *where, struct kvp_error *err)
{
    /* opts strings are the caller's: keep our own token (in the header list,
     * and in m->opts, freed at close). */
    const char *tok = m->opts.token;
    m->opts.token = NULL;
    if (!where || strncmp(where, "//", 2))
        return bad_location(err, where, "does not start with //");
    const char *host = where + 2, *slash = strchr(host, '/');
    size_t hlen = slash ? (size_t)(slash - host) : strlen(host);
    if (hlen == 0 || hlen > 255 || strcspn(host, "?#@ ") < hlen)
        return bad_location(err, where, "names no host (or a bad one)");
    const char *name = NULL;
    size_t nlen = 0;
    if (slash && slash[1]) {
        if (strncmp(slash, "/ns/", 4))
            return bad_location(err, where, "has a path other than /ns/NAME");
        name = slash + 4;
        nlen = strcspn(name, "/");
        if (name[nlen] && strcmp(name + nlen, "/"))
            return bad_location(err, where, "has a path other than /ns/NAME");
        if (!kvp_deployment_valid(name, nlen))
            return bad_location(err, where, "names an invalid deployment");
    }
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        kvp__set_err(err, -EIO, KVP_RULE_IO, -1, 0, 0, "curl_global_init failed: %s",
                     curl_easy_strerror(curl_init_rc));
        return -EIO;
    }
    struct hbe *b = calloc(1, sizeof *b);
    if (!b)
        goto oom;
    pthread_mutex_init(&b->lock, NULL);
    pthread_mutex_init(&b->idlock, NULL);
    b->m = m;
    m->be = b;
    if (!(b->root = malloc(hlen + 8)))
        goto oom;
    snprintf(b->root, hlen + 8, "http://%.*s", (int)hlen, host);
    if (name && !(b->fixed_dep = strndup(name, nlen)))
        goto oom;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (!h)
        goto oom;
    b->headers = h;
    /* no "Expect: 100-continue" round trip for large bodies */
    if (!(h = curl_slist_append(b->headers, "Expect:")))
        goto oom;
    /* error replies with the broken rule's fields (a server that knows them) */
    if (!(h = curl_slist_append(b->headers, "X-Kvpage-Errors: fields")))
        goto oom;
    if (tok) {
        if (!(m->opts.token = strdup(tok)))
            goto oom;
        size_t l = strlen(tok) + 32;
        char *auth = malloc(l);
        if (!auth)
            goto oom;
        snprintf(auth, l, "Authorization: Bearer %s", tok);
        h = curl_slist_append(b->headers, auth);
        free(auth);
        if (!h)
            goto oom;
    }
    return 0;
oom:
    h_close(m);
    kvp__set_err(err, -ENOMEM, KVP_RULE_NONE, -1, 0, 0, "out of memory");
    return -ENOMEM;
}

static const struct kvp__meta_scheme h_schemes[] = {
    {"http",
     "http://HOST:PORT[/ns/NAME]: the state in a remote kvpage serve, through its HTTP routes", 0},
    {"https",
     "metadata location scheme 'https:' is not implemented yet: use http:// (kvpage serve "
     "speaks plain HTTP; put TLS in a proxy beside it)",
     KVP__SCHEME_REFUSED},
    {NULL, NULL, 0},
};

const struct kvp__meta_ops kvp__http_ops = {
    .name = "http",
    .schemes = h_schemes,
    .remote = 1,
    .holder = "kvpage serve",
    .values_section = "http_client",
    .identity = h_identity,
    .open = h_open,
    .close = h_close,
    .ns = h_ns,
    .init_rank = h_init_rank,
    .allocate = h_allocate,
    .allocate_ordered = h_allocate_ordered,
    .confirm = h_confirm,
    .confirm_ex = h_confirm_ex,
    .exists = h_exists,
    .lookup = h_lookup,
    .del = h_delete,
    .del_rejected = h_delete_rejected,
    .pin = h_pin,
    .unpin = h_unpin,
    .pinned = h_pinned,
    .exists_hashes = h_exists_hashes,
    .clear = h_clear,
    .drop = h_drop,
    .nranks = h_nranks,
    .stats = h_stats,
    .check = h_check,
    .wait = h_wait,
    .when_durable = h_when_durable,
    .values = h_values,
    .health = h_health,
    .snapshot = h_snapshot,
    .describe = h_describe,
};
