/* The HTTP port, served by evhttp on its own loop thread and asked over a
 * real TCP connection by a plain-socket HTTP/1.0 client. */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "http.h"
#include "metrics.h"

static struct event_base *base;
static distd_http *http;
static distd_metrics *metrics;
static pthread_t loop_thread;
static atomic_int ready_flag;

static void metrics_hook(void *arg, struct evbuffer *out) {
  distd_metrics_write(arg, out);
}

static int ready_hook(void *arg, char *why, size_t len) {
  (void)arg;
  if (atomic_load(&ready_flag)) return 1;
  snprintf(why, len, "waiting for ranks 1, 3");
  return 0;
}

static void *run_loop(void *arg) {
  event_base_dispatch(arg);
  return NULL;
}

static void start_server(void) {
  cr_assert_eq(evthread_use_pthreads(), 0);
  base = event_base_new();
  metrics = distd_metrics_new("9.9.9");
  distd_metrics_rpc(metrics, "Info", 0, 0.001);
  distd_http_hooks hooks = {metrics, metrics_hook, ready_hook};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_http_start(&http, base, "127.0.0.1:0", &hooks, &eb), 0,
               "%s", eb.msg);
  pthread_create(&loop_thread, NULL, run_loop, base);
}

static void stop_server(void) {
  event_base_loopexit(base, NULL);
  pthread_join(loop_thread, NULL);
  distd_http_free(http);
  distd_metrics_free(metrics);
  event_base_free(base);
}

static int bound_port(void) {
  const char *colon = strrchr(distd_http_address(http), ':');
  cr_assert_not_null(colon);
  return atoi(colon + 1);
}

typedef struct response {
  int status;
  char headers[2048];
  char body[65536];
} response;

/* Sends `method path` as HTTP/1.0 and reads until the server closes. Every
 * read has a 5 s timeout so a silent server fails the test. */
static void request(const char *method, const char *path, response *r) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)bound_port())};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%m");
  char req[256];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: t\r\n\r\n", method,
                   path);
  cr_assert_eq(write(fd, req, (size_t)n), n);
  static char raw[70000];
  size_t got = 0;
  ssize_t k;
  while ((k = read(fd, raw + got, sizeof raw - 1 - got)) > 0) got += (size_t)k;
  cr_assert_geq(k, 0, "read timed out or failed: %m");
  close(fd);
  raw[got] = 0;
  cr_assert_eq(sscanf(raw, "HTTP/1.%*d %d", &r->status), 1, "reply: %s", raw);
  char *end = strstr(raw, "\r\n\r\n");
  cr_assert_not_null(end, "no end of headers: %s", raw);
  *end = 0;
  cr_assert_lt(strlen(raw), sizeof r->headers);
  cr_assert_lt(strlen(end + 4), sizeof r->body);
  memcpy(r->headers, raw, strlen(raw) + 1);
  memcpy(r->body, end + 4, strlen(end + 4) + 1);
}

TestSuite(http, .init = start_server, .fini = stop_server, .timeout = 30);

Test(http, metrics_are_prometheus_text_with_its_content_type) {
  response r;
  request("GET", "/metrics", &r);
  cr_assert_eq(r.status, 200);
  cr_expect(strstr(r.headers,
                   "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "%s", r.headers);
  cr_expect(strstr(r.body, "distd_build_info{version=\"9.9.9\"} 1\n"), "%s", r.body);
  cr_expect(strstr(r.body, "distd_rpc_requests_total{method=\"Info\",code=\"OK\"} 1\n"));
}

Test(http, metrics_ignore_the_query_string) {
  response r;
  request("GET", "/metrics?name[]=x", &r);
  cr_expect_eq(r.status, 200);
}

Test(http, healthz_is_ok_while_serving) {
  response r;
  request("GET", "/healthz", &r);
  cr_expect_eq(r.status, 200);
  cr_expect_str_eq(r.body, "ok\n");
}

Test(http, readyz_is_503_with_the_reason_until_ready_then_200) {
  response r;
  atomic_store(&ready_flag, 0);
  request("GET", "/readyz", &r);
  cr_expect_eq(r.status, 503);
  cr_expect_str_eq(r.body, "not ready: waiting for ranks 1, 3\n");
  atomic_store(&ready_flag, 1);
  request("GET", "/readyz", &r);
  cr_expect_eq(r.status, 200);
  cr_expect_str_eq(r.body, "ready\n");
}

Test(http, unknown_path_is_404) {
  response r;
  request("GET", "/admin", &r);
  cr_expect_eq(r.status, 404);
  request("GET", "/metricsx", &r);
  cr_expect_eq(r.status, 404);
}

Test(http, non_get_is_405_with_allow_header) {
  response r;
  request("POST", "/metrics", &r);
  cr_expect_eq(r.status, 405);
  const char *allow = strstr(r.headers, "\r\nAllow: GET");
  cr_assert_not_null(allow, "%s", r.headers);
  cr_expect(allow[12] == '\r' || allow[12] == 0, "%s", r.headers);
  request("DELETE", "/healthz", &r);
  cr_expect_eq(r.status, 405);
}

Test(http, head_is_405_too) {
  response r;
  request("HEAD", "/healthz", &r);
  cr_expect_eq(r.status, 405);
}

Test(http, port_zero_reports_the_bound_port) {
  const char *a = distd_http_address(http);
  cr_expect_eq(strncmp(a, "127.0.0.1:", 10), 0, "%s", a);
  cr_expect_gt(bound_port(), 0);
}

/* No server for these: they exercise start-up failures. */
Test(http_start, taken_port_names_the_address_and_errno) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof sa;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(fd, 1), 0);
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  char addr[64], want[160];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
  snprintf(want, sizeof want, "http: cannot listen on %s: Address already in use",
           addr);
  struct event_base *b = event_base_new();
  distd_http *h = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_neq(distd_http_start(&h, b, addr, NULL, &eb), 0);
  cr_expect_null(h);
  cr_expect_str_eq(eb.msg, want);
  event_base_free(b);
  close(fd);
}

Test(http_start, malformed_address_is_a_config_error) {
  struct event_base *b = event_base_new();
  distd_http *h = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(distd_http_start(&h, b, "localhost", NULL, &eb), DIST_ECONFIG);
  cr_expect(strstr(eb.msg, "'localhost'"), "%s", eb.msg);
  cr_expect_eq(distd_http_start(&h, b, "127.0.0.1:http", NULL, &eb), DIST_ECONFIG);
  cr_expect(strstr(eb.msg, "127.0.0.1:http"), "%s", eb.msg);
  cr_expect_null(h);
  distd_http_free(NULL);
  event_base_free(b);
}

Test(http_start, ipv6_loopback_address_is_bracketed) {
  struct event_base *b = event_base_new();
  distd_http *h = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_http_start(&h, b, "[::1]:0", NULL, &eb);
  if (rc != 0 && strstr(eb.msg, "Cannot assign requested address")) {
    event_base_free(b);
    cr_skip_test("no IPv6 loopback here: %s", eb.msg);
  }
  cr_assert_eq(rc, 0, "%s", eb.msg);
  cr_expect_eq(strncmp(distd_http_address(h), "[::1]:", 6), 0, "%s",
               distd_http_address(h));
  distd_http_free(h);
  event_base_free(b);
}
