#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"
#include "json_memory.h"
#include "mesh.h"

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
  fprintf(stderr, "distctl%s%s: ", cmd ? " " : "", cmd ? cmd->name : "");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, cmd ? "\n" : " (see distctl --help)\n");
  if (cmd) distctl_print_synopsis(stderr, "usage: distctl ", cmd, 0);
  va_end(ap);
  return 2;
}

/* distctl_rank_fail for the error msg of the call to `rank`. */
static int rank_fail_with(dist_client *c, long rank, const char *msg) {
  const char *at = dist_endpoint(c, (int)rank);
  char named[32];
  int n = snprintf(named, sizeof named, "rank %ld", rank);
  if (strncmp(msg, named, (size_t)n) == 0 && (msg[n] == ':' || msg[n] == ' '))
    return distctl_fail("%s", msg);
  /* A client of one endpoint (--endpoint) names its daemon by address
   * ("distd at HOST:PORT"): its position, 0, is not the daemon's rank. */
  if (at && dist_world_size(c) == 1 && strstr(msg, at)) return distctl_fail("%s", msg);
  return distctl_fail("%s: %s", named, msg);
}

int distctl_rank_fail(dist_client *c, long rank) {
  return rank_fail_with(c, rank, dist_errmsg(c));
}

int distctl_rank_in_cluster(const distctl_command *cmd, dist_client *c, long rank) {
  int n = dist_world_size(c);
  if (rank < n) return 0;
  return distctl_usage(cmd, "--rank %ld: the cluster has %s %d", rank,
                       n == 1 ? "one rank," : "ranks 0 to", n - 1);
}

dist_client *distctl_connect(const distctl_global *g) {
  dist_client *c = NULL;
  dist_opts o = DIST_OPTS_INIT;
  if (g->timeout_ms > 0) o.timeout_ms = g->timeout_ms;
  o.tls_ca = g->tls_ca; /* NULL: the environment's DIST_TLS_* / DIST_TOKEN */
  o.tls_cert = g->tls_cert;
  o.tls_key = g->tls_key;
  o.tls_crl = g->tls_crl;
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

void *distctl_calloc(size_t n, size_t size, const char *fmt, ...) {
  void *p = calloc(n, size);
  if (p) return p;
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  distctl_fail("out of memory for %s", what);
  return NULL;
}

/* A JSON document jansson could not write (distctl_print_json said so):
 * the output is lost as a failed write's is, and distctl exits 1 alike. */
static int json_lost;

int distctl_output_flushed(void) {
  static int told; /* top's refresh, then main's exit: one message */
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return json_lost ? -1 : 0;
  if (!told)
    fprintf(stderr, "distctl: cannot write the output: %s\n",
            errno ? strerror(errno) : "an earlier write failed");
  told = 1;
  return -1;
}

void distctl_print_json(json_t *j) {
  char *s = j ? dist_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (s) printf("%s\n", s);
  else {
    distctl_fail("cannot write the JSON output (out of memory, or a value not UTF-8)");
    json_lost = 1;
  }
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

json_t *distctl_rank_value(int rank) { return rank >= 0 ? json_integer(rank) : json_null(); }

json_t *distctl_rank_json(dist_client *c, int pos) {
  return distctl_rank_value(dist_daemon_rank(c, pos));
}

const char *distctl_rank_format(int rank, char *buf, size_t len) {
  if (rank >= 0) snprintf(buf, len, "%d", rank);
  else snprintf(buf, len, "?");
  return buf;
}

const char *distctl_rank_text(dist_client *c, int pos, char *buf, size_t len) {
  return distctl_rank_format(dist_daemon_rank(c, pos), buf, len);
}

void distctl_print_down_row(int rank, const char *endpoint, const char *error) {
  char text[16];
  printf("%-5s ", distctl_rank_format(rank, text, sizeof text));
  if (endpoint) printf("%-22s ", endpoint);
  printf("%-8s %s\n", "down", error);
}

static json_t *down_json(dist_client *c, int rank, const char *error) {
  return json_pack("{s:o,s:s,s:s}", "rank", distctl_rank_json(c, rank), "endpoint",
                   dist_endpoint(c, rank), "error", error);
}

json_t *distctl_rank_down(dist_client *c, int rank, const char *error) {
  rank_fail_with(c, rank, error);
  return down_json(c, rank, error);
}

void distctl_table_down(const distctl_global *g, dist_client *c, int rank, const char *error,
                        json_t *ranks) {
  json_array_append_new(ranks, distctl_rank_down(c, rank, error));
  if (!g->json) distctl_print_down_row(dist_daemon_rank(c, rank), NULL, error);
}

static const char *plural(int n) { return n == 1 ? "" : "s"; }

/* --mesh with its --dim-names as a mesh. Returns 0 or 2 (usage). */
static int parse_mesh(const distctl_command *cmd, const char *text, const char *dim_names,
                      dist_mesh **mesh) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_mesh_desc d;
  if (dist_mesh_parse(&d, text, dim_names, &eb) != 0)
    return distctl_usage(cmd, "bad --mesh '%s': %s", text, dist_errbuf_msg(&eb));
  const char *names[DIST_MAX_MESH_DIMS];
  for (int i = 0; i < d.ndim; i++) names[i] = d.dim_names[i];
  if (dist_mesh_new(d.ndim, d.shape, d.ranks, names, mesh) != 0)
    return distctl_usage(cmd, "bad --mesh '%s'", text);
  return 0;
}

int distctl_parse_layout(const distctl_command *cmd, const distctl_layout_text *text,
                         dist_mesh **mesh, dist_placement *p, int *np) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  *mesh = NULL;
  *np = 0;
  /* Slots past the count hold no placement any check accepts: a reader
   * that trusts a mesh's ndim over *np fails instead of reading garbage. */
  for (int i = 0; i < DIST_MAX_MESH_DIMS; i++)
    p[i] = (dist_placement){(dist_placement_kind)-1, -1, DIST_REDUCE_SUM};
  if (text->mesh && parse_mesh(cmd, text->mesh, text->dim_names, mesh) != 0) return 2;
  int rc = 0;
  if (dist_placements_parse(text->placements, p, DIST_MAX_MESH_DIMS, np, &eb) != 0)
    rc = distctl_usage(cmd, "bad --placements '%s': %s", text->placements,
                       dist_errbuf_msg(&eb));
  else if (*mesh)
    rc = distctl_check_count(cmd, *np, dist_mesh_ndim(*mesh), "the mesh");
  if (rc != 0) {
    dist_mesh_free(*mesh);
    *mesh = NULL;
  }
  return rc;
}

int distctl_check_count(const distctl_command *cmd, int np, int mesh_ndim,
                        const char *mesh_whose) {
  if (np == mesh_ndim) return 0;
  return distctl_usage(cmd, "--placements gives %d placement%s, but %s has %d dim%s", np,
                       plural(np), mesh_whose, mesh_ndim, plural(mesh_ndim));
}

int distctl_check_shard_dims(const distctl_command *cmd, const dist_placement *p, int np,
                             int tensor_ndim, const char *tensor_what) {
  for (int i = 0; i < np; i++)
    if (p[i].kind == DIST_SHARD && (p[i].dim < 0 || p[i].dim >= tensor_ndim))
      return distctl_usage(cmd, "--placements: Shard(%d) on mesh dim %d is out of range for "
                           "%s of %d dim%s", p[i].dim, i, tensor_what, tensor_ndim,
                           plural(tensor_ndim));
  return 0;
}
