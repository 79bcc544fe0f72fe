/* distctl metrics: one daemon's Prometheus text, fetched from its HTTP
 * port (Info names it); --json reads it into samples. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

/* One exposition line "name{a="x",b="y"} value" as JSON; NULL for comments
 * and lines it cannot read. */
static json_t *sample_json(const char *line) {
  size_t nl = strcspn(line, "{ ");
  if (!nl || line[0] == '#') return NULL;
  json_t *labels = json_object();
  const char *p = line + nl;
  if (*p == '{') {
    p++;
    while (*p && *p != '}') {
      size_t kl = strcspn(p, "=");
      if (p[kl] != '=' || p[kl + 1] != '"') break;
      char key[128], val[512];
      size_t vi = 0;
      const char *q = p + kl + 2;
      for (; *q && *q != '"'; q++) {
        if (*q == '\\' && q[1]) q++;
        if (vi < sizeof val - 1) val[vi++] = *q;
      }
      val[vi] = 0;
      snprintf(key, sizeof key, "%.*s", (int)kl, p);
      json_object_set_new(labels, key, json_string(val));
      p = *q ? q + 1 : q;
      if (*p == ',') p++;
    }
    if (*p == '}') p++;
  }
  double v = strtod(p, NULL);
  char name[256];
  snprintf(name, sizeof name, "%.*s", (int)nl, line);
  /* JSON has no Inf or NaN: those stay strings, as Prometheus writes them. */
  json_t *value = isfinite(v) ? json_real(v) : json_string(p + strspn(p, " "));
  return json_pack("{s:s,s:o,s:o}", "name", name, "labels", labels, "value", value);
}

static json_t *samples_json(char *text) {
  json_t *a = json_array();
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    json_t *s = sample_json(line);
    if (s) json_array_append_new(a, s);
  }
  return a;
}

enum { OPT_RANK, NOPTIONS };
static const distctl_option options[NOPTIONS + 1] = {
    [OPT_RANK] = {"--rank", "R", "the rank whose metrics to show (default 0)", NULL,
                  DISTCTL_OPTIONAL},
};

static int run_metrics(const distctl_global *g, int argc, char **argv) {
  long rank = 0;
  distctl_args args;
  if (distctl_take_options(&distctl_cmd_metrics, argc, argv, &args) != 0) return 2;
  if (args.value[OPT_RANK] &&
      distctl_number_opt(&distctl_cmd_metrics, "--rank", args.value[OPT_RANK], 0, 1 << 20,
                         &rank))
    return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  dist_daemon_info info;
  char host[256], port[16], why[512], *body = NULL;
  long timeout = g->timeout_ms > 0 ? g->timeout_ms : 10000;
  int rc = distctl_rank_in_cluster(&distctl_cmd_metrics, c, rank);
  if (rc != 0) {
    dist_close(c);
    return rc;
  }
  rc = 1;
  if (dist_info(c, (int)rank, &info) != 0) {
    distctl_rank_fail(c, rank);
    goto out;
  }
  if (!info.http_address[0]) {
    distctl_fail("rank %d serves no HTTP port (http_listen = off)", info.rank);
    goto out;
  }
  if (distctl_http_target(c, (int)rank, info.http_address, host, sizeof host, port,
                          sizeof port) != 0 ||
      distctl_http_get(host, port, "/metrics", timeout, &body, why, sizeof why) != 0) {
    distctl_fail("rank %d metrics at %s: %s", info.rank, info.http_address, why);
    goto out;
  }
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:s,s:o}", "rank", info.rank, "http_address",
                                 info.http_address, "samples", samples_json(body)));
  else
    fputs(body, stdout);
  rc = 0;
out:
  free(body);
  dist_info_free(&info);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_metrics = {
    .name = "metrics",
    .help = "one rank's Prometheus metrics, from its HTTP port",
    .run = run_metrics,
    .options = options};
