#include "server/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int g_level = KVP_LOG_INFO;

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
