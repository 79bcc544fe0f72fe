/* Table-driven configuration. One table of options (name, type, bounds,
 * default, help) drives the config file, the environment and the command
 * line, and also produces --help and --check-config. Precedence, lowest
 * first: defaults, file, environment, flags.
 *
 *   name "peer_timeout"  <->  file key "peer_timeout = 30s"
 *                        <->  flag "--peer-timeout=30s" or "--peer-timeout 30s"
 *                        <->  env  "DISTD_PEER_TIMEOUT=30s"
 *
 * Every error names its origin ("distd.conf:12", "--rank", "DISTD_RANK") and
 * the offending key or value; callers exit with status 2 on it.
 *
 * File syntax: one "key = value" per line; blank lines are skipped; '#'
 * starts a comment (outside a quoted value); whitespace around key and value
 * is trimmed; a value may be double-quoted ("", "a # b", with \" and \\
 * inside). A later line for the same key wins.
 * Environment: every variable starting with the prefix must name an option,
 * except <PREFIX>CONFIG, which names the config file.
 * Flags: "--name=value" or "--name value" (a value starting with "--" must
 * use the '=' form); a bare boolean flag means true. Names use dashes. */
#ifndef DIST_CONFIG_H
#define DIST_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "errbuf.h"

typedef enum {
  DIST_CFG_STRING,   /* char * (malloc'd; freed by dist_cfg_free) */
  DIST_CFG_INT,      /* int64_t, within [min, max] */
  DIST_CFG_SIZE,     /* uint64_t bytes: "512", "64K", "16M", "2G" (powers of 1024) */
  DIST_CFG_DURATION, /* int64_t milliseconds: "250ms", "30s", "5m", bare = ms */
  DIST_CFG_BOOL,     /* int 0/1: true/false/yes/no/on/off/1/0 */
  DIST_CFG_ENUM      /* int index into choices */
} dist_cfg_type;

typedef struct dist_cfg_option {
  const char *name;  /* snake_case key */
  dist_cfg_type type;
  size_t offset;     /* offsetof() of the field in the target struct */
  const char *def;   /* default, as text ("" for an empty string) */
  int64_t min, max;  /* INT, SIZE, DURATION bounds (min == max == 0: none) */
  const char *const *choices; /* ENUM: NULL-terminated */
  const char *help;
} dist_cfg_option;

typedef struct dist_cfg_table {
  const char *program;    /* "distd" */
  const char *env_prefix; /* "DISTD_" */
  const dist_cfg_option *options;
  size_t count;
} dist_cfg_table;

typedef enum {
  DIST_CFG_RUN = 0,         /* configuration loaded: go on */
  DIST_CFG_EXIT_OK = 1,     /* --help or --check-config printed: exit 0 */
} dist_cfg_action;

/* Loads the whole configuration: defaults, then the file named by --config
 * (or <ENV_PREFIX>CONFIG), then the environment, then the flags. Besides the
 * table's options it understands --config FILE, --help and --check-config
 * (which prints the effective configuration, one "key = value" per line, and
 * exits 0). Positional arguments are an error. Returns 0 and sets *action, or
 * DIST_ECONFIG with eb naming origin and problem. */
int dist_cfg_load(const dist_cfg_table *t, void *target, int argc,
                  char **argv, char **envp, dist_cfg_action *action, FILE *out,
                  dist_errbuf *eb);

/* Notes on dist_cfg_load: envp is a NULL-terminated "NAME=value" array
 * (main's third argument or environ); NULL means an empty environment. out
 * receives --help and --check-config (stdout in distd). --help (or -h)
 * anywhere prints help and nothing else is checked. target need not be
 * initialised. After a return of 0 (either action) target's strings belong
 * to the caller, to be released with dist_cfg_free; after an error they are
 * already freed (dist_cfg_free on it is still harmless). */

/* The individual steps dist_cfg_load is made of, for tests and tools.
 * dist_cfg_defaults writes every field without reading it (strings held
 * before are not freed). dist_cfg_set sets one option by its key name,
 * replacing (and freeing) an earlier string; origin prefixes its messages
 * ("--rank: value 70000 out of range [0, 65535]"; NULL = the key name). */
int dist_cfg_defaults(const dist_cfg_table *t, void *target, dist_errbuf *eb);
int dist_cfg_set(const dist_cfg_table *t, void *target, const char *name,
                 const char *value, const char *origin, dist_errbuf *eb);
int dist_cfg_parse_file_text(const dist_cfg_table *t, void *target,
                             const char *text, const char *path,
                             dist_errbuf *eb);
int dist_cfg_load_file(const dist_cfg_table *t, void *target,
                       const char *path, dist_errbuf *eb);
void dist_cfg_print_help(const dist_cfg_table *t, FILE *out);
void dist_cfg_print(const dist_cfg_table *t, const void *target, FILE *out);
/* Frees the strings the table owns in target. */
void dist_cfg_free(const dist_cfg_table *t, void *target);

#endif
