#include "json_memory.h"
#include "log.h"
#include "utf8.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

dist_log_level dist_log_current_level = DIST_LOG_INFO;
static dist_log_format log_format = DIST_LOG_PLAIN;
static const char *log_program = "distd";
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void dist_log_setup(const char *program, dist_log_level level,
                    dist_log_format format) {
  log_program = program;
  dist_log_current_level = level;
  log_format = format;
}

int dist_log_level_parse(const char *s, dist_log_level *out) {
  static const struct {
    const char *name;
    dist_log_level level;
  } names[] = {{"error", DIST_LOG_ERROR},
               {"warn", DIST_LOG_WARN},
               {"info", DIST_LOG_INFO},
               {"debug", DIST_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) {
      *out = names[i].level;
      return 0;
    }
  return -1;
}

static const char *level_name(dist_log_level level) {
  switch (level) {
    case DIST_LOG_ERROR: return "error";
    case DIST_LOG_WARN: return "warn";
    case DIST_LOG_INFO: return "info";
    default: return "debug";
  }
}

static void write_json(dist_log_level level, const char *text) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  json_t *o = json_pack("{s:f,s:s,s:s,s:s}", "ts",
                        ts.tv_sec + ts.tv_nsec / 1e9, "level",
                        level_name(level), "program", log_program, "msg", text);
  char *line = o ? dist_json_dumps(o, JSON_COMPACT) : NULL;
  if (line) fprintf(stderr, "%s\n", line);
  else /* jansson could not allocate, or text is not UTF-8: say a line was lost */
    fprintf(stderr, "{\"ts\":%.6f,\"level\":\"%s\",\"program\":\"%s\",\"msg\":\"a log "
            "line could not be written as JSON (%s)\"}\n", ts.tv_sec + ts.tv_nsec / 1e9,
            level_name(level), log_program,
            dist_utf8_valid(text, strlen(text)) ? "out of memory" : "not UTF-8");
  free(line);
  json_decref(o);
}

void dist_log_write(dist_log_level level, const char *fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_lock);
  if (log_format == DIST_LOG_JSON)
    write_json(level, text);
  else if (getenv("JOURNAL_STREAM"))
    fprintf(stderr, "<%d>%s\n", (int)level, text);
  else
    fprintf(stderr, "%s[%s]: %s\n", log_program, level_name(level), text);
  pthread_mutex_unlock(&log_lock);
}
