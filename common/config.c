/* Table-driven configuration (see config.h). Every source of a value, the
 * defaults, the file, the environment and the flags, ends in one function,
 * set_value(), so a value means the same thing wherever it comes from and
 * every error is worded the same way, prefixed with where the value came from.
 * Every error is DIST_ECONFIG. */
#include "config.h"
#include "fileio.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FIELD(target, opt) ((char *)(target) + (opt)->offset)

/* ---- Looking options up ------------------------------------------------ */

static const dist_cfg_option *find_option(const dist_cfg_table *t,
                                          const char *name, size_t len) {
  for (size_t i = 0; i < t->count; i++) {
    const char *n = t->options[i].name;
    if (strlen(n) == len && memcmp(n, name, len) == 0) return &t->options[i];
  }
  return NULL;
}

/* Edit distance, for "did you mean" hints on misspelt keys. Names are short,
 * so a quadratic table on the stack is fine; longer inputs get no hint. */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63) return SIZE_MAX;
  size_t d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[la][lb];
}

/* The option whose name is at most two edits from name, or NULL. */
static const dist_cfg_option *closest(const dist_cfg_table *t,
                                      const char *name) {
  const dist_cfg_option *best = NULL;
  /* More than two edits away, or as many edits as letters, is not a typo. */
  size_t best_d = strlen(name) < 3 ? strlen(name) : 3;
  for (size_t i = 0; i < t->count; i++) {
    size_t d = edit_distance(name, t->options[i].name);
    if (d < best_d) best_d = d, best = &t->options[i];
  }
  return best;
}

/* "peer_timeout" -> "--peer-timeout" or "DISTD_PEER_TIMEOUT". */
static void flag_name(const dist_cfg_option *o, char *buf, size_t len) {
  snprintf(buf, len, "--%s", o->name);
  for (char *p = buf + 2; *p; p++)
    if (*p == '_') *p = '-';
}

static void env_name(const dist_cfg_table *t, const dist_cfg_option *o,
                     char *buf, size_t len) {
  snprintf(buf, len, "%s%s", t->env_prefix, o->name);
  for (char *p = buf + strlen(t->env_prefix); *p; p++)
    *p = (char)toupper((unsigned char)*p);
}

typedef enum { AS_KEY, AS_FLAG, AS_ENV } spelling;

/* Writes " (did you mean '--rank'?)" for a misspelt name, spelt the way the
 * user wrote it, or "" when no option is close. */
static void hint(const dist_cfg_table *t, const char *name, spelling how,
                 char *buf, size_t len) {
  const dist_cfg_option *o = closest(t, name);
  char spelt[160];
  buf[0] = 0;
  if (!o) return;
  if (how == AS_FLAG)
    flag_name(o, spelt, sizeof spelt);
  else if (how == AS_ENV)
    env_name(t, o, spelt, sizeof spelt);
  else
    snprintf(spelt, sizeof spelt, "%s", o->name);
  snprintf(buf, len, " (did you mean '%s'?)", spelt);
}

/* "--peer-timeout" or "DISTD_PEER_TIMEOUT" back to "peer_timeout", for
 * hints. */
static void to_key(const char *s, char *buf, size_t len) {
  snprintf(buf, len, "%s", s);
  for (char *p = buf; *p; p++)
    *p = *p == '-' ? '_' : (char)tolower((unsigned char)*p);
}

/* ---- Parsing and formatting values -------------------------------------- */

/* The value range an option accepts; min == max == 0 means the type's own. */
static void bounds(const dist_cfg_option *o, int64_t *lo, uint64_t *hi) {
  if (o->min != 0 || o->max != 0) {
    *lo = o->min;
    *hi = (uint64_t)o->max;
  } else if (o->type == DIST_CFG_INT) {
    *lo = INT64_MIN;
    *hi = INT64_MAX;
  } else {
    *lo = 0;
    *hi = o->type == DIST_CFG_SIZE ? UINT64_MAX : (uint64_t)INT64_MAX;
  }
}

/* How parsing a number went: a number too big for its type is a range
 * error, not a syntax error. */
typedef enum { PARSED, MALFORMED, TOO_BIG } parse_result;

/* Splits "30s" into its number and suffix; a sign is MALFORMED. */
static parse_result parse_unsigned(const char *s, uint64_t *num,
                                   const char **suffix) {
  if (!isdigit((unsigned char)s[0])) return MALFORMED;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  *num = v;
  *suffix = end;
  return errno == ERANGE ? TOO_BIG : PARSED;
}

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
  if (b != 0 && a > UINT64_MAX / b) return true;
  *out = a * b;
  return false;
}

/* "64K", "16M", "2G", "1T" (powers of 1024; case and a trailing "B" or "iB"
 * are ignored), or a bare number of bytes. */
static parse_result parse_size(const char *s, uint64_t *out) {
  static const char units[] = "KMGT";
  uint64_t n;
  const char *suf;
  parse_result r = parse_unsigned(s, &n, &suf);
  if (r == MALFORMED) return r;
  uint64_t mult = 1;
  const char *u = *suf ? strchr(units, toupper((unsigned char)*suf)) : NULL;
  if (u) {
    mult = (uint64_t)1 << (10 * (u - units + 1));
    suf++;
    if (*suf == 'i' && (suf[1] == 'B' || suf[1] == 'b')) suf++;
  }
  if (*suf == 'B' || *suf == 'b') suf++;
  if (*suf) return MALFORMED;
  return r == TOO_BIG || mul_overflows(n, mult, out) ? TOO_BIG : PARSED;
}

/* "250ms", "30s", "5m", "1h", or a bare number of milliseconds. */
static parse_result parse_duration(const char *s, int64_t *out_ms) {
  static const struct { const char *suffix; uint64_t ms; } units[] = {
      {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
  uint64_t n, ms;
  const char *suf;
  parse_result r = parse_unsigned(s, &n, &suf);
  if (r == MALFORMED) return r;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(suf, units[i].suffix) != 0) continue;
    if (r == TOO_BIG || mul_overflows(n, units[i].ms, &ms) || ms > INT64_MAX)
      return TOO_BIG;
    *out_ms = (int64_t)ms;
    return PARSED;
  }
  return MALFORMED;
}

static bool parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, true;
    if (strcasecmp(s, no[i]) == 0) return *out = 0, true;
  }
  return false;
}

/* Formats v as the largest unit that divides it exactly: 1073741824 -> "1G",
 * 1536 -> "1536". */
static void format_size(uint64_t v, char *buf, size_t len) {
  static const char units[] = "TGMK";
  for (int i = 0; i < 4; i++) {
    uint64_t mult = (uint64_t)1 << (10 * (4 - i));
    if (v != 0 && v % mult == 0) {
      snprintf(buf, len, "%" PRIu64 "%c", v / mult, units[i]);
      return;
    }
  }
  snprintf(buf, len, "%" PRIu64, v);
}

static void format_duration(int64_t ms, char *buf, size_t len) {
  static const struct { const char *suffix; int64_t ms; } units[] = {
      {"h", 3600000}, {"m", 60000}, {"s", 1000}};
  for (size_t i = 0; i < 3; i++)
    if (ms != 0 && ms % units[i].ms == 0) {
      snprintf(buf, len, "%" PRId64 "%s", ms / units[i].ms, units[i].suffix);
      return;
    }
  snprintf(buf, len, "%" PRId64 "ms", ms);
}

/* A bound of o in o's own notation, for "out of range [100ms, 1h]". */
static void format_bound(const dist_cfg_option *o, int64_t lo, uint64_t hi,
                         bool upper, char *buf, size_t len) {
  if (o->type == DIST_CFG_SIZE)
    format_size(upper ? hi : (uint64_t)lo, buf, len);
  else if (o->type == DIST_CFG_DURATION)
    format_duration(upper ? (int64_t)hi : lo, buf, len);
  else if (upper)
    snprintf(buf, len, "%" PRIu64, hi);
  else
    snprintf(buf, len, "%" PRId64, lo);
}

static int out_of_range(const dist_cfg_option *o, const char *where,
                        const char *value, dist_errbuf *eb) {
  int64_t lo;
  uint64_t hi;
  char a[32], b[32];
  bounds(o, &lo, &hi);
  format_bound(o, lo, hi, false, a, sizeof a);
  format_bound(o, lo, hi, true, b, sizeof b);
  return dist_fail(eb, DIST_ECONFIG, "%s: value %s out of range [%s, %s]",
                   where, value, a, b);
}

/* Appends "error, warn, info, debug" to buf. */
static void list_choices(const dist_cfg_option *o, const char *sep, char *buf,
                         size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; o->choices[i] && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? sep : "",
                             o->choices[i]);
}

static int set_string(char **field, const char *value, const char *where,
                      dist_errbuf *eb) {
  char *copy = strdup(value);
  if (!copy) return dist_fail(eb, DIST_ECONFIG, "%s: out of memory", where);
  free(*field);
  *field = copy;
  return 0;
}

static int set_enum(const dist_cfg_option *o, int *field, const char *value,
                    const char *where, dist_errbuf *eb) {
  for (int i = 0; o->choices[i]; i++)
    if (strcasecmp(value, o->choices[i]) == 0) return *field = i, 0;
  char list[256];
  list_choices(o, ", ", list, sizeof list);
  return dist_fail(eb, DIST_ECONFIG, "%s: '%s' is not one of %s", where,
                   value, list);
}

static int set_int(const dist_cfg_option *o, int64_t *field, const char *value,
                   const char *where, dist_errbuf *eb) {
  const char *digits = value + (value[0] == '-' || value[0] == '+');
  if (!isdigit((unsigned char)*digits))
    return dist_fail(eb, DIST_ECONFIG, "%s: bad integer '%s'", where, value);
  char *end;
  errno = 0;
  long long v = strtoll(value, &end, 10);
  if (*end)
    return dist_fail(eb, DIST_ECONFIG, "%s: bad integer '%s'", where, value);
  int64_t lo;
  uint64_t hi;
  bounds(o, &lo, &hi);
  if (errno == ERANGE || v < lo || (v >= 0 && (uint64_t)v > hi))
    return out_of_range(o, where, value, eb);
  *field = v;
  return 0;
}

static int set_size(const dist_cfg_option *o, uint64_t *field,
                    const char *value, const char *where, dist_errbuf *eb) {
  uint64_t v = 0;
  parse_result r = parse_size(value, &v);
  if (r == MALFORMED)
    return dist_fail(eb, DIST_ECONFIG,
                     "%s: bad size '%s' (expected e.g. 512, 64K, 16M, 2G)",
                     where, value);
  int64_t lo;
  uint64_t hi;
  bounds(o, &lo, &hi);
  if (r == TOO_BIG || v < (uint64_t)lo || v > hi)
    return out_of_range(o, where, value, eb);
  *field = v;
  return 0;
}

static int set_duration(const dist_cfg_option *o, int64_t *field,
                        const char *value, const char *where,
                        dist_errbuf *eb) {
  int64_t v = 0;
  parse_result r = parse_duration(value, &v);
  if (r == MALFORMED)
    return dist_fail(eb, DIST_ECONFIG,
                     "%s: bad duration '%s' (expected e.g. 250ms, 30s, 5m)",
                     where, value);
  int64_t lo;
  uint64_t hi;
  bounds(o, &lo, &hi);
  if (r == TOO_BIG || v < lo || (uint64_t)v > hi)
    return out_of_range(o, where, value, eb);
  *field = v;
  return 0;
}

/* The one place a value becomes a field. where prefixes every message. */
static int set_value(const dist_cfg_option *o, void *target, const char *value,
                     const char *where, dist_errbuf *eb) {
  void *field = FIELD(target, o);
  if (o->type == DIST_CFG_STRING) return set_string(field, value, where, eb);
  if (!value[0]) return dist_fail(eb, DIST_ECONFIG, "%s: missing value", where);
  switch (o->type) {
  case DIST_CFG_INT:
    return set_int(o, field, value, where, eb);
  case DIST_CFG_SIZE:
    return set_size(o, field, value, where, eb);
  case DIST_CFG_DURATION:
    return set_duration(o, field, value, where, eb);
  case DIST_CFG_BOOL:
    if (parse_bool(value, field)) return 0;
    return dist_fail(eb, DIST_ECONFIG,
                     "%s: bad boolean '%s' (expected true or false)", where,
                     value);
  case DIST_CFG_ENUM:
    return set_enum(o, field, value, where, eb);
  default:
    return dist_fail(eb, DIST_ECONFIG, "%s: option has an unknown type", where);
  }
}

/* ---- Public single steps ------------------------------------------------ */

int dist_cfg_defaults(const dist_cfg_table *t, void *target, dist_errbuf *eb) {
  /* Clear every string first, so that dist_cfg_free is safe whatever
   * happens below, even on a target that was never initialised. */
  for (size_t i = 0; i < t->count; i++)
    if (t->options[i].type == DIST_CFG_STRING)
      *(char **)FIELD(target, &t->options[i]) = NULL;
  for (size_t i = 0; i < t->count; i++) {
    const dist_cfg_option *o = &t->options[i];
    char where[128];
    snprintf(where, sizeof where, "default of %s", o->name);
    int rc = set_value(o, target, o->def ? o->def : "", where, eb);
    if (rc < 0) return rc;
  }
  return 0;
}

int dist_cfg_set(const dist_cfg_table *t, void *target, const char *name,
                 const char *value, const char *origin, dist_errbuf *eb) {
  const dist_cfg_option *o = find_option(t, name, strlen(name));
  if (!origin) origin = name;
  if (!o) {
    char why[200];
    hint(t, name, AS_KEY, why, sizeof why);
    return dist_fail(eb, DIST_ECONFIG, "%s: unknown key '%s'%s", origin, name,
                     why);
  }
  return set_value(o, target, value, origin, eb);
}

void dist_cfg_free(const dist_cfg_table *t, void *target) {
  if (!t || !target) return;
  for (size_t i = 0; i < t->count; i++) {
    if (t->options[i].type != DIST_CFG_STRING) continue;
    char **field = (char **)FIELD(target, &t->options[i]);
    free(*field);
    *field = NULL;
  }
}

/* ---- The config file ---------------------------------------------------- */

/* Takes the value part of a "key = value" line in place: trims it, ends it
 * at a '#' outside quotes, and removes the quotes (inside them, \" and \\
 * stand for " and \). Returns false on an unterminated quote or text after
 * the closing quote. */
static bool unquote_value(char *v) {
  if (*v != '"') {
    char *hash = strchr(v, '#');
    if (hash) *hash = 0;
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1])) v[--n] = 0;
    return true;
  }
  char *in = v + 1, *out = v;
  while (*in && *in != '"') {
    if (*in == '\\' && (in[1] == '"' || in[1] == '\\')) in++;
    *out++ = *in++;
  }
  if (*in != '"') return false;
  in++;
  in += strspn(in, " \t\r");
  if (*in && *in != '#') return false;
  *out = 0;
  return true;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

/* Applies one line (already cut out of the text and writable). */
static int parse_line(const dist_cfg_table *t, void *target, char *line,
                      const char *path, int lineno, dist_errbuf *eb) {
  char *s = trim(line);
  if (!*s || *s == '#') return 0;
  char *eq = strchr(s, '=');
  char *key_end = eq ? eq : s + strcspn(s, " \t#");
  while (key_end > s && isspace((unsigned char)key_end[-1])) key_end--;
  size_t keylen = (size_t)(key_end - s);
  const dist_cfg_option *o = find_option(t, s, keylen);
  if (keylen == 0)
    return dist_fail(eb, DIST_ECONFIG, "%s:%d: missing key before '='", path,
                     lineno);
  if (!o) {
    char key[128], why[200];
    snprintf(key, sizeof key, "%.*s", (int)keylen, s);
    hint(t, key, AS_KEY, why, sizeof why);
    return dist_fail(eb, DIST_ECONFIG, "%s:%d: unknown key '%s'%s", path,
                     lineno, key, why);
  }
  char where[512];
  snprintf(where, sizeof where, "%s:%d: %s", path, lineno, o->name);
  if (!eq)
    return dist_fail(eb, DIST_ECONFIG,
                     "%s: missing value (expected '%s = VALUE')", where,
                     o->name);
  char *value = eq + 1;
  value += strspn(value, " \t");
  if (!unquote_value(value))
    return dist_fail(eb, DIST_ECONFIG,
                     "%s: unterminated or malformed quoted value", where);
  return set_value(o, target, value, where, eb);
}

int dist_cfg_parse_file_text(const dist_cfg_table *t, void *target,
                             const char *text, const char *path,
                             dist_errbuf *eb) {
  int rc = 0;
  char *copy = strdup(text);
  if (!copy) return dist_fail(eb, DIST_ECONFIG, "%s: out of memory", path);
  char *line = copy;
  for (int lineno = 1; line && rc == 0; lineno++) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    rc = parse_line(t, target, line, path, lineno, eb);
    line = nl ? nl + 1 : NULL;
  }
  free(copy);
  return rc;
}

/* The whole file as a NUL-terminated string, or NULL with eb filled. */
static char *read_whole_file(const char *path, dist_errbuf *eb) {
  char *text = NULL;
  dist_errbuf why = DIST_ERRBUF_INIT;
  if (dist_read_text_file(path, &text, &why) == 0) return text;
  /* why says "PATH: reason"; the config message names the file once. */
  const char *reason = why.msg + strlen(path) + 2;
  dist_fail(eb, DIST_ECONFIG, "cannot read config file '%s': %s", path, reason);
  return NULL;
}

int dist_cfg_load_file(const dist_cfg_table *t, void *target,
                       const char *path, dist_errbuf *eb) {
  char *text = read_whole_file(path, eb);
  if (!text) return DIST_ECONFIG;
  int rc = dist_cfg_parse_file_text(t, target, text, path, eb);
  free(text);
  return rc;
}

/* ---- --help and --check-config ----------------------------------------- */

static const char *metavar(const dist_cfg_option *o, char *buf, size_t len) {
  static const char *const names[] = {"STRING", "INT", "SIZE", "DURATION",
                                      "BOOL"};
  if (o->type == DIST_CFG_ENUM) {
    list_choices(o, "|", buf, len);
    return buf;
  }
  return o->type <= DIST_CFG_BOOL ? names[o->type] : "VALUE";
}

/* The value of o in target, as the file syntax would spell it. */
static void format_value(const dist_cfg_option *o, const void *target,
                         char *buf, size_t len) {
  const char *field = (const char *)target + o->offset;
  switch (o->type) {
  case DIST_CFG_STRING: {
    const char *s = *(char *const *)field;
    s = s ? s : "";
    bool quote = !*s || strpbrk(s, "#\"\\") || isspace((unsigned char)s[0]) ||
                 isspace((unsigned char)s[strlen(s) - 1]);
    if (!quote) {
      snprintf(buf, len, "%s", s);
      break;
    }
    size_t used = 0;
    if (len < 3) break;
    buf[used++] = '"';
    for (; *s && used + 3 < len; s++) {
      if (*s == '"' || *s == '\\') buf[used++] = '\\';
      buf[used++] = *s;
    }
    buf[used++] = '"';
    buf[used] = 0;
    break;
  }
  case DIST_CFG_INT:
    snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
    break;
  case DIST_CFG_SIZE:
    format_size(*(const uint64_t *)field, buf, len);
    break;
  case DIST_CFG_DURATION:
    format_duration(*(const int64_t *)field, buf, len);
    break;
  case DIST_CFG_BOOL:
    snprintf(buf, len, "%s", *(const int *)field ? "true" : "false");
    break;
  case DIST_CFG_ENUM: {
    int i = *(const int *)field, n = 0;
    while (o->choices[n]) n++;
    snprintf(buf, len, "%s", i >= 0 && i < n ? o->choices[i] : "?");
    break;
  }
  }
}

/* Prints text indented by six columns, broken at spaces before column 78. */
static void print_wrapped(const char *text, FILE *out) {
  const int width = 72;
  while (*text) {
    int n = (int)strlen(text);
    if (n > width) {
      n = width;
      while (n > 0 && text[n] != ' ') n--;
      if (n == 0) n = (int)strcspn(text, " "); /* one long word */
    }
    fprintf(out, "      %.*s\n", n, text);
    text += n;
    text += strspn(text, " ");
  }
}

static void print_option_help(const dist_cfg_table *t,
                              const dist_cfg_option *o, FILE *out) {
  char flag[128], env[160], meta[256], range[80] = "";
  flag_name(o, flag, sizeof flag);
  env_name(t, o, env, sizeof env);
  if ((o->min != 0 || o->max != 0) && o->type != DIST_CFG_STRING &&
      o->type != DIST_CFG_BOOL && o->type != DIST_CFG_ENUM) {
    char a[32], b[32];
    int64_t lo;
    uint64_t hi;
    bounds(o, &lo, &hi);
    format_bound(o, lo, hi, false, a, sizeof a);
    format_bound(o, lo, hi, true, b, sizeof b);
    snprintf(range, sizeof range, ", range [%s, %s]", a, b);
  }
  fprintf(out, "  %s=%s\n", flag, metavar(o, meta, sizeof meta));
  print_wrapped(o->help ? o->help : "", out);
  fprintf(out, "      (env %s, default %s%s%s%s)\n", env,
          o->type == DIST_CFG_STRING ? "\"" : "", o->def ? o->def : "",
          o->type == DIST_CFG_STRING ? "\"" : "", range);
}

void dist_cfg_print_help(const dist_cfg_table *t, FILE *out) {
  fprintf(out,
          "usage: %s [--config FILE] [--check-config] [--help] "
          "[--OPTION=VALUE ...]\n\n"
          "Every option can be set, lowest precedence first, by its default,\n"
          "a line \"name = value\" in the config file, the environment\n"
          "variable shown, or the flag. Sizes take K, M, G, T (powers of\n"
          "1024); durations take ms, s, m, h (a bare number is ms).\n\n"
          "  --config=FILE\n      Read options from FILE.\n"
          "      (env %sCONFIG, default none)\n"
          "  --check-config\n"
          "      Print the effective configuration and exit; a bad one "
          "fails.\n"
          "  --help\n      Print this help and exit.\n\n",
          t->program, t->env_prefix);
  for (size_t i = 0; i < t->count; i++) print_option_help(t, &t->options[i], out);
}

void dist_cfg_print(const dist_cfg_table *t, const void *target, FILE *out) {
  char value[1024];
  for (size_t i = 0; i < t->count; i++) {
    format_value(&t->options[i], target, value, sizeof value);
    fprintf(out, "%s = %s\n", t->options[i].name, value);
  }
}

/* ---- Environment and flags ---------------------------------------------- */

static bool is_config_var(const dist_cfg_table *t, const char *entry) {
  size_t n = strlen(t->env_prefix);
  return strncmp(entry, t->env_prefix, n) == 0 &&
         strncmp(entry + n, "CONFIG=", 7) == 0;
}

static int apply_env(const dist_cfg_table *t, void *target, char **envp,
                     dist_errbuf *eb) {
  size_t plen = strlen(t->env_prefix);
  for (char **e = envp; e && *e; e++) {
    if (strncmp(*e, t->env_prefix, plen) != 0 || is_config_var(t, *e))
      continue;
    const char *eq = strchr(*e, '=');
    size_t namelen = eq ? (size_t)(eq - *e) : strlen(*e);
    char var[160];
    snprintf(var, sizeof var, "%.*s", (int)namelen, *e);
    const dist_cfg_option *o = NULL;
    for (size_t i = 0; i < t->count && !o; i++) {
      char want[160];
      env_name(t, &t->options[i], want, sizeof want);
      if (strcmp(want, var) == 0) o = &t->options[i];
    }
    if (!o) {
      char key[160], why[200];
      to_key(var + plen, key, sizeof key);
      hint(t, key, AS_ENV, why, sizeof why);
      return dist_fail(eb, DIST_ECONFIG,
                       "%s: unknown environment variable: no %s option has "
                       "that name%s",
                       var, t->program, why);
    }
    int rc = set_value(o, target, eq ? eq + 1 : "", var, eb);
    if (rc < 0) return rc;
  }
  return 0;
}

/* One parsed command-line flag. */
typedef struct {
  const dist_cfg_option *opt; /* NULL for --config and --check-config */
  char name[128];             /* as written, without "=value" */
  const char *value;
} flag_arg;

typedef struct {
  const char *config_path;
  bool check_config;
} load_request;

static bool takes_value(const dist_cfg_option *o, const char *name) {
  return o ? o->type != DIST_CFG_BOOL : strcmp(name, "--config") == 0;
}

/* Reads the flag at argv[*i] into f, advancing *i past its value. */
static int parse_flag(const dist_cfg_table *t, int argc, char **argv, int *i,
                      flag_arg *f, dist_errbuf *eb) {
  const char *arg = argv[*i];
  if (arg[0] != '-' || !strcmp(arg, "-") || !strcmp(arg, "--"))
    return dist_fail(eb, DIST_ECONFIG,
                     "unexpected argument '%s' (%s takes no positional "
                     "arguments)",
                     arg, t->program);
  const char *eq = strchr(arg, '=');
  size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
  snprintf(f->name, sizeof f->name, "%.*s", (int)n, arg);
  f->opt = NULL;
  for (size_t k = 0; k < t->count && !f->opt; k++) {
    char want[128];
    flag_name(&t->options[k], want, sizeof want);
    if (strcmp(want, f->name) == 0) f->opt = &t->options[k];
  }
  bool builtin = !strcmp(f->name, "--config") || !strcmp(f->name, "--check-config");
  if (!f->opt && !builtin) {
    char key[128], why[200];
    to_key(f->name + strspn(f->name, "-"), key, sizeof key);
    hint(t, key, AS_FLAG, why, sizeof why);
    return dist_fail(eb, DIST_ECONFIG, "unknown flag '%s'%s", f->name, why);
  }
  if (eq) {
    if (!strcmp(f->name, "--check-config"))
      return dist_fail(eb, DIST_ECONFIG, "%s: takes no value", f->name);
    f->value = eq + 1;
  } else if (!takes_value(f->opt, f->name)) {
    f->value = "true"; /* a bare boolean flag switches it on */
  } else if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0) {
    return dist_fail(eb, DIST_ECONFIG, "%s: missing value", f->name);
  } else {
    f->value = argv[++*i];
  }
  return 0;
}

/* Checks every argument and notes --config and --check-config; applies
 * nothing (when apply is false) or only the table's options (when true). */
static int walk_flags(const dist_cfg_table *t, void *target, int argc,
                      char **argv, bool apply, load_request *req,
                      dist_errbuf *eb) {
  for (int i = 1; i < argc; i++) {
    flag_arg f;
    int rc = parse_flag(t, argc, argv, &i, &f, eb);
    if (rc < 0) return rc;
    if (!strcmp(f.name, "--config")) {
      req->config_path = f.value;
    } else if (!strcmp(f.name, "--check-config")) {
      req->check_config = true;
    } else if (apply) {
      rc = set_value(f.opt, target, f.value, f.name, eb);
      if (rc < 0) return rc;
    }
  }
  return 0;
}

static bool wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

static const char *env_config_path(const dist_cfg_table *t, char **envp) {
  for (char **e = envp; e && *e; e++)
    if (is_config_var(t, *e)) return *e + strlen(t->env_prefix) + 7;
  return NULL;
}

int dist_cfg_load(const dist_cfg_table *t, void *target, int argc,
                  char **argv, char **envp, dist_cfg_action *action, FILE *out,
                  dist_errbuf *eb) {
  load_request req = {NULL, false};
  *action = DIST_CFG_RUN;
  int rc = dist_cfg_defaults(t, target, eb);
  if (rc < 0) goto out;
  if (wants_help(argc, argv)) {
    dist_cfg_print_help(t, out);
    *action = DIST_CFG_EXIT_OK;
    return 0;
  }
  /* A first pass over the flags only finds --config and rejects bad
   * arguments, so that a typo is reported before the file is read. */
  rc = walk_flags(t, target, argc, argv, false, &req, eb);
  if (rc < 0) goto out;
  if (!req.config_path) req.config_path = env_config_path(t, envp);
  if (req.config_path && *req.config_path)
    rc = dist_cfg_load_file(t, target, req.config_path, eb);
  if (rc == 0) rc = apply_env(t, target, envp, eb);
  if (rc == 0) rc = walk_flags(t, target, argc, argv, true, &req, eb);
  if (rc == 0 && req.check_config) {
    dist_cfg_print(t, target, out);
    *action = DIST_CFG_EXIT_OK;
  }
out:
  if (rc < 0) dist_cfg_free(t, target);
  return rc;
}
