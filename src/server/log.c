#include "server/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int g_level = KVP_LOG_INFO;
static atomic_int g_json = 0;

void kvp__log_set_json(int on)
{
    atomic_store_explicit(&g_json, on, memory_order_relaxed);
}

int kvp__log_json(void)
{
    return atomic_load_explicit(&g_json, memory_order_relaxed);
}

/* Appends s to out[*n..cap) as the inside of a JSON string; stops short of
 * cap (a cut line is still valid JSON). */
static void json_escape(char *out, size_t *n, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (; *s && *n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)c;
        } else if (c < 0x20) {
            memcpy(out + *n, "\\u00", 4);
            out[*n + 4] = hex[c >> 4];
            out[*n + 5] = hex[c & 15];
            *n += 6;
        } else {
            out[(*n)++] = (char)c;
        }
    }
}

void kvp__log_set_level(int level)
{
    atomic_store_explicit(&g_level, level, memory_order_relaxed);
}

int kvp__log_level(void)
{
    return atomic_load_explicit(&g_level, memory_order_relaxed);
}

int kvp__log_parse_level(const char *s)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

void kvp__log(int level, const char *fmt, ...)
{
    static const char *const tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    if (level > kvp__log_level() || level < 0)
        return;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    /* One buffer and one write, so lines of concurrent threads do not interleave. */
    char line[2048];
    if (atomic_load_explicit(&g_json, memory_order_relaxed)) {
        /* --log-format json: one object per line, for log shippers. Bytes
         * that are not valid UTF-8 (a client's key) pass as they are. */
        static const char *const names[] = {"error", "warn", "info", "debug"};
        char msg[1536];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        size_t n = (size_t)snprintf(line, sizeof line,
                                    "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\","
                                    "\"level\":\"%s\",\"msg\":\"",
                                    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                                    tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
        json_escape(line, &n, sizeof line - 3, msg);
        memcpy(line + n, "\"}\n", 3);
        fwrite(line, 1, n + 3, stderr);
        fflush(stderr);
        return;
    }
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    fwrite(line, 1, len, stderr);
    fflush(stderr);
}
