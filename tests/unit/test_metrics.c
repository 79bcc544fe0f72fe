/* The Prometheus registry: what each recording produces in the text
 * exposition, checked against counts computed here, and lint-cleanliness
 * under `promtool check metrics`. */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"

/* The exposition as a NUL-terminated string (caller frees). */
static char *render(distd_metrics *m) {
  struct evbuffer *b = evbuffer_new();
  distd_metrics_write(m, b);
  size_t n = evbuffer_get_length(b);
  char *s = malloc(n + 1);
  evbuffer_remove(b, s, n);
  s[n] = 0;
  evbuffer_free(b);
  return s;
}

/* The value of the sample whose name and labels are exactly `series`
 * (e.g. `x_total{a="b"}`), or NAN when there is no such line. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  }
  return NAN;
}

static int count_lines_starting(const char *text, const char *prefix) {
  int c = 0;
  size_t n = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (strncmp(p, prefix, n) == 0) c++;
  return c;
}

Test(metrics, build_info_is_one_with_version_label) {
  distd_metrics *m = distd_metrics_new("1.2.3");
  char *t = render(m);
  cr_expect_eq(sample(t, "distd_build_info{version=\"1.2.3\"}"), 1.0, "%s", t);
  cr_expect(strstr(t, "# TYPE distd_build_info gauge\n"));
  free(t);
  distd_metrics_free(m);
}

Test(metrics, every_family_has_help_and_type_once_even_when_empty) {
  static const char *fams[][2] = {
      {"distd_build_info", "gauge"},
      {"distd_rpc_requests_total", "counter"},
      {"distd_rpc_duration_seconds", "histogram"},
      {"distd_collectives_total", "counter"},
      {"distd_collective_bytes_total", "counter"},
      {"distd_collective_duration_seconds", "histogram"},
      {"distd_auth_rejected_total", "counter"},
  };
  distd_metrics *m = distd_metrics_new("0");
  char *t = render(m);
  for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
    char help[128], type[128];
    snprintf(help, sizeof help, "# HELP %s ", fams[i][0]);
    snprintf(type, sizeof type, "# TYPE %s %s", fams[i][0], fams[i][1]);
    cr_expect_eq(count_lines_starting(t, help), 1, "%s", help);
    cr_expect_eq(count_lines_starting(t, type), 1, "%s", type);
  }
  free(t);
  distd_metrics_free(m);
}

Test(metrics, rpc_counts_by_method_and_canonical_code_name) {
  distd_metrics *m = distd_metrics_new("0");
  distd_metrics_rpc(m, "Info", 0, 0.001);
  distd_metrics_rpc(m, "Info", 0, 0.002);
  distd_metrics_rpc(m, "TensorGet", 5, 0.003);
  distd_metrics_rpc(m, "TensorGet", 16, 0.003);
  distd_metrics_rpc(m, "x", 4, 0.5);
  distd_metrics_rpc(m, "x", 12, 0.5);
  distd_metrics_rpc(m, "x", 99, 0.5); /* not a gRPC code */
  char *t = render(m);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"Info\",code=\"OK\"}"), 2);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"TensorGet\",code=\"NOT_FOUND\"}"), 1);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"TensorGet\",code=\"UNAUTHENTICATED\"}"), 1);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"x\",code=\"DEADLINE_EXCEEDED\"}"), 1);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"x\",code=\"UNIMPLEMENTED\"}"), 1);
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"x\",code=\"UNKNOWN\"}"), 1);
  cr_expect_eq(sample(t, "distd_rpc_duration_seconds_count{method=\"Info\"}"), 2);
  cr_expect_eq(sample(t, "distd_rpc_duration_seconds_count{method=\"TensorGet\"}"), 2);
  free(t);
  distd_metrics_free(m);
}

/* Checks every bucket of one histogram series against a count done here:
 * bucket le=X holds the samples <= X; buckets only grow; +Inf == _count. */
static void check_histogram(const char *t, const char *name, const char *lab,
                            const double *samples, int n, double lo, double hi) {
  char prefix[256], key[256];
  snprintf(prefix, sizeof prefix, "%s_bucket{%s,le=\"", name, lab);
  size_t plen = strlen(prefix);
  double prev = 0, sum = 0;
  int buckets = 0, saw_lo = 0, saw_hi = 0;
  for (int i = 0; i < n; i++) sum += samples[i];
  for (const char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
    if (strncmp(p, prefix, plen) != 0) continue;
    const char *le = p + plen;
    double v = strtod(strstr(le, "} ") + 2, NULL);
    cr_assert_geq(v, prev, "buckets must be cumulative at %.40s", p);
    prev = v;
    buckets++;
    if (strncmp(le, "+Inf\"", 5) == 0) {
      snprintf(key, sizeof key, "%s_count{%s}", name, lab);
      cr_expect_eq(v, sample(t, key), "+Inf bucket != _count");
      cr_expect_eq(v, n);
      continue;
    }
    double bound = strtod(le, NULL);
    int expect = 0;
    for (int i = 0; i < n; i++) expect += samples[i] <= bound;
    cr_expect_eq(v, expect, "bucket le=%g: %g, want %d", bound, v, expect);
    saw_lo |= fabs(bound - lo) < 1e-12;
    saw_hi |= fabs(bound - hi) < 1e-12;
  }
  cr_expect_gt(buckets, 10, "too few buckets for %s{%s}", name, lab);
  cr_expect(saw_lo && saw_hi, "bounds should span %g..%g", lo, hi);
  snprintf(key, sizeof key, "%s_sum{%s}", name, lab);
  cr_expect_float_eq(sample(t, key), sum, 1e-9);
}

Test(metrics, rpc_histogram_buckets_are_cumulative_from_50us_to_10s) {
  static const double s[] = {0.00001, 0.00005, 0.0002, 0.0002, 0.003,
                             0.04,    0.7,     0.7,    9.9,    10,
                             12.5,    3600};
  int n = (int)(sizeof s / sizeof s[0]);
  distd_metrics *m = distd_metrics_new("0");
  for (int i = 0; i < n; i++) distd_metrics_rpc(m, "Put", 0, s[i]);
  char *t = render(m);
  check_histogram(t, "distd_rpc_duration_seconds", "method=\"Put\"", s, n,
                  0.00005, 10);
  free(t);
  distd_metrics_free(m);
}

Test(metrics, collectives_by_kind_and_result_with_bytes_and_durations) {
  static const double ar[] = {0.001, 0.02, 45};
  distd_metrics *m = distd_metrics_new("0");
  distd_metrics_collective(m, "allreduce", 1, 1000, ar[0]);
  distd_metrics_collective(m, "allreduce", 1, 24, ar[1]);
  distd_metrics_collective(m, "allreduce", 0, 0, ar[2]);
  distd_metrics_collective(m, "broadcast", 1, 4096, 0.5);
  char *t = render(m);
  cr_expect_eq(sample(t, "distd_collectives_total{kind=\"allreduce\",result=\"ok\"}"), 2);
  cr_expect_eq(sample(t, "distd_collectives_total{kind=\"allreduce\",result=\"error\"}"), 1);
  cr_expect_eq(sample(t, "distd_collectives_total{kind=\"broadcast\",result=\"ok\"}"), 1);
  cr_expect_eq(sample(t, "distd_collective_bytes_total{kind=\"allreduce\"}"), 1024);
  cr_expect_eq(sample(t, "distd_collective_bytes_total{kind=\"broadcast\"}"), 4096);
  check_histogram(t, "distd_collective_duration_seconds", "kind=\"allreduce\"",
                  ar, 3, 0.0001, 60);
  free(t);
  distd_metrics_free(m);
}

Test(metrics, auth_rejections_by_reason) {
  distd_metrics *m = distd_metrics_new("0");
  distd_metrics_auth_rejected(m, "bad_token");
  distd_metrics_auth_rejected(m, "bad_token");
  distd_metrics_auth_rejected(m, "cluster_id");
  char *t = render(m);
  cr_expect_eq(sample(t, "distd_auth_rejected_total{reason=\"bad_token\"}"), 2);
  cr_expect_eq(sample(t, "distd_auth_rejected_total{reason=\"cluster_id\"}"), 1);
  free(t);
  distd_metrics_free(m);
}

Test(metrics, label_values_escape_quote_backslash_newline) {
  distd_metrics *m = distd_metrics_new("v\"1\\\n");
  distd_metrics_auth_rejected(m, "a\"b\\c\nd");
  char *t = render(m);
  cr_expect_eq(sample(t, "distd_auth_rejected_total{reason=\"a\\\"b\\\\c\\nd\"}"), 1, "%s", t);
  cr_expect_eq(sample(t, "distd_build_info{version=\"v\\\"1\\\\\\n\"}"), 1, "%s", t);
  free(t);
  distd_metrics_free(m);
}

Test(metrics, gauge_header_writes_help_and_type_with_escaped_help) {
  struct evbuffer *b = evbuffer_new();
  distd_metrics_gauge_header(b, "distd_peers_connected", "gauge",
                             "Peers connected.\nOne line \\ only.");
  size_t n = evbuffer_get_length(b);
  char s[256] = {0};
  evbuffer_remove(b, s, n < sizeof s - 1 ? n : sizeof s - 1);
  cr_expect_str_eq(s, "# HELP distd_peers_connected Peers connected.\\nOne line "
                      "\\\\ only.\n# TYPE distd_peers_connected gauge\n");
  evbuffer_free(b);
}

Test(metrics, null_registry_is_a_no_op) {
  distd_metrics_rpc(NULL, "Info", 0, 1);
  distd_metrics_collective(NULL, "allreduce", 1, 1, 1);
  distd_metrics_auth_rejected(NULL, "x");
  distd_metrics_free(NULL);
}

Test(metrics, label_sets_are_capped_so_clients_cannot_grow_memory) {
  distd_metrics *m = distd_metrics_new("0");
  char name[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "/junk.Svc/M%d", i);
    distd_metrics_rpc(m, name, 12, 0.001);
  }
  char *t = render(m);
  int series = count_lines_starting(t, "distd_rpc_requests_total{");
  cr_expect_leq(series, 257, "%d series", series);
  double other = sample(t, "distd_rpc_requests_total{method=\"other\",code=\"UNIMPLEMENTED\"}");
  double total = other;
  for (const char *p = strstr(t, "distd_rpc_requests_total{method=\"/junk"); p;
       p = strstr(p + 1, "distd_rpc_requests_total{method=\"/junk"))
    total += strtod(strstr(p, "} ") + 2, NULL);
  cr_expect_eq(total, 1000, "no sample is lost, %g counted", total);
  free(t);
  distd_metrics_free(m);
}

#define THREADS 8
#define PER_THREAD 20000

static void *hammer(void *arg) {
  distd_metrics *m = arg;
  for (int i = 0; i < PER_THREAD; i++) {
    distd_metrics_rpc(m, i % 2 ? "Info" : "Put", 0, 0.001);
    distd_metrics_collective(m, "allreduce", 1, 3, 0.01);
  }
  return NULL;
}

Test(metrics, concurrent_recording_loses_no_samples) {
  distd_metrics *m = distd_metrics_new("0");
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, hammer, m);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  char *t = render(m);
  double half = THREADS * PER_THREAD / 2;
  cr_expect_eq(sample(t, "distd_rpc_requests_total{method=\"Info\",code=\"OK\"}"), half);
  cr_expect_eq(sample(t, "distd_rpc_duration_seconds_count{method=\"Put\"}"), half);
  cr_expect_eq(sample(t, "distd_collective_bytes_total{kind=\"allreduce\"}"),
               3.0 * THREADS * PER_THREAD);
  free(t);
  distd_metrics_free(m);
}

/* promtool is a test dependency (Debian package `prometheus`); CI installs
 * it, so its absence is a failure, not a skip. */
Test(metrics, exposition_is_lint_clean_under_promtool) {
  if (system("command -v promtool >/dev/null 2>&1") != 0)
    cr_assert_fail("promtool not found: install Debian package 'prometheus' "
                   "(apt-get install -y prometheus) to lint the exposition");
  distd_metrics *m = distd_metrics_new("0.1.0");
  distd_metrics_rpc(m, "Info", 0, 0.0003);
  distd_metrics_rpc(m, "grpc.health.v1.Health/Check", 0, 0.0001);
  distd_metrics_rpc(m, "TensorGet", 5, 0.02);
  distd_metrics_collective(m, "allreduce", 1, 1 << 20, 0.3);
  distd_metrics_collective(m, "allgather", 0, 0, 12);
  distd_metrics_auth_rejected(m, "bad \"token\"\n");
  struct evbuffer *b = evbuffer_new();
  distd_metrics_write(m, b);
  distd_metrics_gauge_header(b, "distd_peers_connected", "gauge",
                             "Peers with an open data-plane connection.");
  evbuffer_add_printf(b, "distd_peers_connected 3\n");
  char path[] = "/tmp/test_metrics_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(evbuffer_write(b, fd) >= 0, 1);
  close(fd);
  char cmd[512], out[4096] = {0};
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1; echo \"rc=$?\"", path);
  FILE *p = popen(cmd, "r");
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  pclose(p);
  unlink(path);
  cr_expect_str_eq(out, "rc=0\n", "promtool: %s", out);
  evbuffer_free(b);
  distd_metrics_free(m);
}
