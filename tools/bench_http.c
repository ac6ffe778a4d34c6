/* The benchmarks' HTTP client (bench_http.h). */
#include "bench_http.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
    struct kvp__conn *c = arg;
    size_t add = sz * n;
    if (c->len + add + 1 > c->cap) {
        size_t cap = (c->len + add + 1) * 2;
        char *r = realloc(c->resp, cap);
        if (!r) {
            c->oom = 1;
            return 0;
        }
        c->resp = r, c->cap = cap;
    }
    memcpy(c->resp + c->len, p, add);
    c->len += add;
    c->resp[c->len] = 0;
    return add;
}

int kvp__conn_init(struct kvp__conn *c, const char *token)
{
    memset(c, 0, sizeof *c);
    c->h = curl_easy_init();
    if (!c->h)
        return -1;
    /* No "Expect: 100-continue": it costs a round trip per large batch. */
    c->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    c->hdrs = curl_slist_append(c->hdrs, "Expect:");
    if (token) {
        char h[600];
        snprintf(h, sizeof h, "Authorization: Bearer %.500s", token);
        c->hdrs = curl_slist_append(c->hdrs, h);
    }
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->cerr);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 60000L);
    return 0;
}

void kvp__conn_free(struct kvp__conn *c)
{
    if (c->h)
        curl_easy_cleanup(c->h);
    curl_slist_free_all(c->hdrs);
    free(c->resp), free(c->body);
}

void kvp__body_put(struct kvp__conn *c, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(c->body + c->blen, c->bcap - c->blen, fmt, ap);
        va_end(ap);
        if (n < 0) {
            c->oom = 1;
            return;
        }
        if ((size_t)n < c->bcap - c->blen) {
            c->blen += (size_t)n;
            return;
        }
        size_t cap = (c->bcap + (size_t)n + 1) * 2;
        char *r = realloc(c->body, cap);
        if (!r) {
            c->oom = 1;
            return;
        }
        c->body = r, c->bcap = cap;
    }
}

void kvp__body_reset(struct kvp__conn *c)
{
    c->blen = 0;
    kvp__body_put(c, "%s", "");
}

int kvp__post(struct kvp__conn *c, const char *url)
{
    c->len = 0;
    if (c->resp)
        c->resp[0] = 0;
    if (c->oom) {
        snprintf(c->cerr, sizeof c->cerr, "out of memory");
        return -1;
    }
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE, (long)c->blen);
    c->cerr[0] = 0;
    CURLcode rc = curl_easy_perform(c->h);
    if (rc != CURLE_OK) {
        if (!c->cerr[0])
            snprintf(c->cerr, sizeof c->cerr, "%s", curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &c->status);
    return c->status >= 200 && c->status < 300 ? 0 : (int)c->status;
}

void kvp__describe(struct kvp__conn *c, int rc, const char *url, char *out, size_t n)
{
    if (rc < 0)
        snprintf(out, n, "POST %.150s: no answer: %.200s", url, c->cerr);
    else
        snprintf(out, n, "POST %.150s: HTTP %d: %.200s", url, rc, c->resp ? c->resp : "");
}

void kvp__json_str(const char *s)
{
    putchar('"');
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    putchar('"');
}

int64_t kvp__rank_stat(struct kvp__conn *c, const char *url, uint32_t rank, const char *field)
{
    char root[1024], dep[512] = "default";
    snprintf(root, sizeof root, "%s", url);
    char *path = strchr(root + 7, '/');
    if (path) {
        if (!strncmp(path, "/ns/", 4))
            snprintf(dep, sizeof dep, "%.*s", (int)strcspn(path + 4, "/"), path + 4);
        *path = 0;
    }
    strncat(root, "/v1/stats", sizeof root - strlen(root) - 1);
    c->len = 0;
    curl_easy_setopt(c->h, CURLOPT_URL, root);
    curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
    long status = 0;
    if (curl_easy_perform(c->h) != CURLE_OK || c->oom || !c->resp)
        return -1;
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200)
        return -1;
    json_t *doc = json_loadb(c->resp, c->len, 0, NULL), *ns;
    int64_t v = -1;
    size_t i, j;
    json_array_foreach(json_object_get(doc, "namespaces"), i, ns)
    {
        const char *d = json_string_value(json_object_get(ns, "deployment")),
                   *pool = json_string_value(json_object_get(ns, "pool"));
        if (!d || !pool || strcmp(d, dep) || strcmp(pool, "kv"))
            continue;
        json_t *r;
        json_array_foreach(json_object_get(ns, "ranks"), j, r)
        {
            json_t *f = json_object_get(r, field);
            if (json_integer_value(json_object_get(r, "rank")) == (json_int_t)rank &&
                json_is_integer(f))
                v = (int64_t)json_integer_value(f);
        }
    }
    json_decref(doc);
    return v;
}

int kvp__flag_next(int argc, char **argv, int *i, char *name, size_t n, const char **word)
{
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "--")) {
        if (!strcmp(arg, "--") && *i + 1 < argc)
            arg = argv[++*i];
        *word = arg;
        return 0;
    }
    const char *eq = strchr(arg, '=');
    size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
    if (nl >= n) {
        *word = arg;
        return -1;
    }
    memcpy(name, arg, nl);
    name[nl] = 0;
    *word = eq ? eq + 1 : NULL;
    return 1;
}

int kvp__server_url_ok(const char *u)
{
    if (strncmp(u, "http://", 7) != 0 || !u[7] || u[7] == '/' || u[7] == ':')
        return 0;
    const char *path = strchr(u + 7, '/');
    if (path && strcmp(path, "/")) {
        const char *name = path + 4;
        size_t l = strlen(name);
        if (l && name[l - 1] == '/')
            l--;
        if (strncmp(path, "/ns/", 4) != 0 || l == 0 || memchr(name, '/', l) || strlen(u) > 900)
            return 0;
    }
    return 1;
}

const char *kvp__bench_token(const char *given)
{
    const char *t = given ? given : getenv("KVPAGE_TOKEN");
    return t && *t ? t : NULL;
}

int kvp__wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return 1;
    return 0;
}
