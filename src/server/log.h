/* Leveled logging to stderr with timestamps (tools and the server only;
 * the library proper never prints). */
#ifndef KVP_SERVER_LOG_H
#define KVP_SERVER_LOG_H

enum kvp_log_level { KVP_LOG_ERROR = 0, KVP_LOG_WARN, KVP_LOG_INFO, KVP_LOG_DEBUG };

/* Sets the most verbose level that is printed (default KVP_LOG_INFO). */
void kvp__log_set_level(int level);
int kvp__log_level(void);
/* Parses "error", "warn", "info", "debug"; returns the level or -1. */
int kvp__log_parse_level(const char *s);
/* 1: lines are JSON objects {"time", "level", "msg"} (--log-format json). */
void kvp__log_set_json(int on);
int kvp__log_json(void);
/* Writes one line "2026-01-01T12:00:00.123Z LEVEL message\n" to stderr. */
void kvp__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kvp__log_enabled(lvl) ((lvl) <= kvp__log_level())
#define KVP_LOGE(...) kvp__log(KVP_LOG_ERROR, __VA_ARGS__)
#define KVP_LOGW(...) kvp__log(KVP_LOG_WARN, __VA_ARGS__)
#define KVP_LOGI(...) kvp__log(KVP_LOG_INFO, __VA_ARGS__)
#define KVP_LOGD(...)                                                                              \
    do {                                                                                           \
        if (kvp__log_enabled(KVP_LOG_DEBUG))                                                       \
            kvp__log(KVP_LOG_DEBUG, __VA_ARGS__);                                                  \
    } while (0)

#endif
