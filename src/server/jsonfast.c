/*
 * Request bodies: a fast path in front of jansson.
 *
 * jansson's lexer copies the input a byte at a time into growing buffers;
 * profiles of kvpage serve showed it taking more than half of the CPU for a
 * 64-key request (bench/meta). The engines' requests are plain: objects,
 * arrays, ASCII hex-string keys and small integers. For those, the body is
 * tokenized with jsmn (Debian's libjsmn-dev), checked against the JSON
 * grammar that jsmn does not enforce (separators between tokens, the exact
 * form of numbers and literals, printable ASCII strings without escapes), and
 * jansson values are built straight from the tokens. Anything else — an
 * escape, a non-ASCII byte, a malformed body, an integer jansson would
 * refuse, deep nesting — is handed to json_loadb, so jansson stays the one
 * authority on what is valid and on every error message. fuzz/fuzz_json.c
 * checks that the two paths agree.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS /* closing a bracket is O(1); without it a list of pairs parses in       \
                             O(n^2) */
#include <jsmn.h>

#include "server/jsonfast.h"

#define MAX_DEPTH 32

struct fast {
    const char *js;
    size_t len;
    jsmntok_t *t;
    int ntok, next;
    int depth;
};

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* [from, to) holds only whitespace and, when sep != 0, exactly one sep. */
static int gap_ok(const char *js, int from, int to, char sep)
{
    int seen = 0;
    for (int i = from; i < to; i++) {
        if (is_ws(js[i]))
            continue;
        if (sep && js[i] == sep && !seen) {
            seen = 1;
            continue;
        }
        return 0;
    }
    return !sep || seen;
}

/* Where a token's text starts and ends, quotes included. */
static int tok_begin(const jsmntok_t *t)
{
    return t->type == JSMN_STRING ? t->start - 1 : t->start;
}
static int tok_end(const jsmntok_t *t)
{
    return t->type == JSMN_STRING ? t->end + 1 : t->end;
}

/* A JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; *is_int. */
static int number_ok(const char *s, int n, int *is_int)
{
    int i = 0;
    *is_int = 1;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n)
        return 0;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        *is_int = 0;
        int d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *is_int = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        int d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    return i == n;
}

static json_t *build(struct fast *f);

static json_t *build_primitive(struct fast *f, const jsmntok_t *t)
{
    const char *s = f->js + t->start;
    int n = t->end - t->start;
    if (n == 4 && !memcmp(s, "true", 4))
        return json_true();
    if (n == 5 && !memcmp(s, "false", 5))
        return json_false();
    if (n == 4 && !memcmp(s, "null", 4))
        return json_null();
    int is_int;
    if (!number_ok(s, n, &is_int) || n > 40)
        return NULL;
    char buf[48];
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    errno = 0;
    if (is_int) {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE)
            return NULL; /* jansson's "too big integer" message */
        return json_integer((json_int_t)v);
    }
    double d = strtod(buf, NULL);
    if (errno == ERANGE)
        return NULL; /* jansson decides about overflow and underflow */
    return json_real(d);
}

/*
 * True when s[0..n) is printable ASCII without a backslash: no escape to
 * decode, no control character, nothing for UTF-8 validation. Eight bytes at
 * a time: these strings are the keys, i.e. most of every body.
 */
int kvp__plain_ascii(const char *s, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        if ((x | (x + ones)) & high) /* a byte >= 0x7f */
            return 0;
        if ((x - 0x20 * ones) & ~x & high) /* a byte < 0x20 (all bytes < 0x7f here) */
            return 0;
        uint64_t y = x ^ (0x5c * ones); /* a backslash becomes a zero byte */
        if ((y - ones) & ~y & high)
            return 0;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '\\')
            return 0;
    }
    return 1;
}

static json_t *build_string(struct fast *f, const jsmntok_t *t)
{
    const char *s = f->js + t->start;
    size_t n = (size_t)(t->end - t->start);
    if (!kvp__plain_ascii(s, n))
        return NULL; /* escapes, controls, non-ASCII: jansson */
    return json_stringn_nocheck(s, n);
}

/* Builds the value at token f->next and everything inside it. */
static json_t *build(struct fast *f)
{
    if (f->next >= f->ntok)
        return NULL;
    const jsmntok_t *t = &f->t[f->next++];
    if (t->type == JSMN_STRING)
        return build_string(f, t);
    if (t->type == JSMN_PRIMITIVE)
        return build_primitive(f, t);
    if (++f->depth > MAX_DEPTH)
        return NULL;
    int is_obj = t->type == JSMN_OBJECT;
    json_t *v = is_obj ? json_object() : json_array();
    int pos = t->start + 1; /* after the opening bracket */
    for (int i = 0; v && i < t->size; i++) {
        if (f->next >= f->ntok)
            goto fail;
        const jsmntok_t *c = &f->t[f->next];
        if (!gap_ok(f->js, pos, tok_begin(c), i ? ',' : 0))
            goto fail;
        if (!is_obj) {
            json_t *e = build(f);
            if (!e || json_array_append_new(v, e))
                goto fail;
            pos = tok_end(c);
            continue;
        }
        /* An object member: a string key, ':', a value. */
        if (c->type != JSMN_STRING || c->size != 1)
            goto fail;
        f->next++;
        if (!kvp__plain_ascii(f->js + c->start, (size_t)(c->end - c->start)))
            goto fail;
        if (f->next >= f->ntok)
            goto fail;
        const jsmntok_t *val = &f->t[f->next];
        if (!gap_ok(f->js, tok_end(c), tok_begin(val), ':'))
            goto fail;
        json_t *e = build(f);
        if (!e || json_object_setn_new_nocheck(v, f->js + c->start, (size_t)(c->end - c->start), e))
            goto fail;
        pos = tok_end(val);
    }
    if (!v || !gap_ok(f->js, pos, t->end - 1, 0))
        goto fail;
    f->depth--;
    return v;
fail:
    json_decref(v);
    return NULL;
}

/* One token array per thread, freed when the thread exits (the server's
 * worker threads come and go with the daemon). */
struct toks {
    jsmntok_t *t;
    unsigned cap;
};
static pthread_key_t toks_key;
static pthread_once_t toks_once = PTHREAD_ONCE_INIT;

static void toks_free(void *p)
{
    struct toks *k = p;
    free(k->t);
    free(k);
}

static void toks_init(void)
{
    pthread_key_create(&toks_key, toks_free);
}

static struct toks *thread_toks(void)
{
    pthread_once(&toks_once, toks_init);
    struct toks *k = pthread_getspecific(toks_key);
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k || !(k->t = malloc(256 * sizeof *k->t)) || pthread_setspecific(toks_key, k)) {
            if (k)
                free(k->t);
            free(k);
            return NULL;
        }
        k->cap = 256;
    }
    return k;
}

/* The fast path; NULL when the body needs jansson. */
static json_t *fast_load(const char *js, size_t len)
{
    if (len == 0 || len > (size_t)1 << 30 || memchr(js, '\0', len))
        return NULL;
    struct toks *k = thread_toks();
    if (!k)
        return NULL;
    jsmn_parser p;
    int n;
    for (;;) {
        jsmn_init(&p);
        n = jsmn_parse(&p, js, len, k->t, k->cap);
        if (n != JSMN_ERROR_NOMEM)
            break;
        if (k->cap >= (1u << 26))
            return NULL;
        jsmntok_t *nt = realloc(k->t, 2 * (size_t)k->cap * sizeof *nt);
        if (!nt)
            return NULL;
        k->t = nt;
        k->cap *= 2;
    }
    if (n < 1)
        return NULL;
    struct fast f = {js, len, k->t, n, 0, 0};
    if (!gap_ok(js, 0, tok_begin(&k->t[0]), 0))
        return NULL;
    json_t *root = build(&f);
    /* One value, then only whitespace. */
    if (root && (f.next != n || !gap_ok(js, tok_end(&k->t[0]), (int)len, 0))) {
        json_decref(root);
        root = NULL;
    }
    /* A huge body's token array is not kept around. */
    if (k->cap > (1u << 16)) {
        jsmntok_t *small = realloc(k->t, 256 * sizeof *small);
        if (small) {
            k->t = small;
            k->cap = 256;
        }
    }
    return root;
}

json_t *kvp__json_load(const char *js, size_t len, json_error_t *err)
{
    json_t *v = fast_load(js, len);
    if (v)
        return v;
    return json_loadb(js, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, err);
}

json_t *kvp__json_load_fast_only(const char *js, size_t len)
{
    return fast_load(js, len);
}
