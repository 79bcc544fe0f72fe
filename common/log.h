/* Logging for the daemon and distctl (libdist never prints). Plain lines on
 * stderr, with sd-daemon "<N>" priority prefixes when journald reads stderr
 * ($JOURNAL_STREAM set), or one JSON object per line. The level is checked
 * before anything is formatted. */
#ifndef DIST_LOG_H
#define DIST_LOG_H

typedef enum {
  DIST_LOG_ERROR = 3,
  DIST_LOG_WARN = 4,
  DIST_LOG_INFO = 6,
  DIST_LOG_DEBUG = 7
} dist_log_level;

typedef enum { DIST_LOG_PLAIN = 0, DIST_LOG_JSON = 1 } dist_log_format;

/* Sets the process-wide level, format and program name ("distd"). */
void dist_log_setup(const char *program, dist_log_level level,
                    dist_log_format format);

/* Parses "error|warn|info|debug"; returns 0 or -1. */
int dist_log_level_parse(const char *s, dist_log_level *out);

extern dist_log_level dist_log_current_level;

void dist_log_write(dist_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define DIST_LOG(level, ...)                                     \
  do {                                                           \
    if ((level) <= dist_log_current_level) dist_log_write(level, __VA_ARGS__); \
  } while (0)
#define log_error(...) DIST_LOG(DIST_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) DIST_LOG(DIST_LOG_WARN, __VA_ARGS__)
#define log_info(...) DIST_LOG(DIST_LOG_INFO, __VA_ARGS__)
#define log_debug(...) DIST_LOG(DIST_LOG_DEBUG, __VA_ARGS__)

#endif
