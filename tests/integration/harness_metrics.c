/* A daemon's Prometheus /metrics, read over its HTTP port the way a
 * scraper reads it, and one sample of it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

char *harness_metrics(const harness *h, int r) {
  char cmd[200], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "curl -sf --max-time 10 http://127.0.0.1:%d/metrics",
           h->http_port[r]);
  int rc = harness_run(cmd, &out, &err, 20);
  cr_assert_eq(rc, 0, "curl /metrics of rank %d: %s", r, err ? err : "");
  free(err);
  return out;
}

/* A sample's line starts at the text's start or after a newline, so that
 * "x_total" does not match the end of "y_x_total". */
double harness_metric_sample(const char *metrics, const char *sample) {
  size_t n = strlen(sample);
  for (const char *p = metrics; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (strncmp(p, sample, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

double harness_rpc_count(const char *metrics, const char *method, const char *code) {
  char key[200];
  int n = snprintf(key, sizeof key, "distd_rpc_requests_total{method=\"%s\",code=\"%s", method,
                   code ? code : "");
  double sum = 0;
  for (const char *p = metrics; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
    if (strncmp(p, key, (size_t)n) != 0) continue;
    const char *end = strstr(p, "\"} ");
    if (end && (!code || end == p + n)) sum += strtod(end + 3, NULL);
  }
  return sum;
}
