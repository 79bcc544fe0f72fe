#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

int distctl_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "distctl: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 1;
}

int distctl_usage(const distctl_command *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "distctl %s: ", cmd->name);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nusage: distctl %s %s\n", cmd->name, cmd->usage);
  va_end(ap);
  return 2;
}

dist_client *distctl_connect(const distctl_global *g) {
  dist_client *c = NULL;
  dist_opts o = DIST_OPTS_INIT;
  if (g->timeout_ms > 0) o.timeout_ms = g->timeout_ms;
  o.tls_ca = g->tls_ca; /* NULL: the environment's DIST_TLS_* / DIST_TOKEN */
  o.tls_cert = g->tls_cert;
  o.tls_key = g->tls_key;
  o.token = g->token;
  int rc;
  if (g->endpoint || !g->cluster || !g->cluster[0])
    rc = dist_connect(g->endpoint, &o, &c);
  else
    rc = dist_connect_cluster(g->cluster, &o, &c);
  if (rc != 0) {
    distctl_fail("%s", dist_last_connect_error());
    return NULL;
  }
  return c;
}

void distctl_print_json(json_t *j) {
  char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  if (s) printf("%s\n", s);
  free(s);
  json_decref(j);
}

int distctl_parse_long(const char *text, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (!text[0] || *end || errno == ERANGE || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int distctl_number_opt(const distctl_command *cmd, const char *option,
                       const char *text, long lo, long hi, long *out) {
  if (distctl_parse_long(text, lo, hi, out) == 0) return 0;
  return distctl_usage(cmd, "bad %s '%s': an integer from %ld to %ld", option, text,
                       lo, hi);
}

const char *distctl_opt(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) return NULL;
  return argv[++*i];
}

json_t *distctl_down_json(dist_client *c, int rank, const char *error) {
  return json_pack("{s:i,s:s,s:s}", "rank", rank, "endpoint", dist_endpoint(c, rank),
                   "error", error);
}
