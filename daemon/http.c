/* The HTTP port: a read-only evhttp server for Prometheus and probes. The
 * listening socket is made here rather than by evhttp_bind_socket so that a
 * bind failure can be reported with the exact errno and address. */
#include "http.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_CONTENT_TYPE "text/plain; charset=utf-8"
/* Scrapers and probes send small requests; anything slow or large is not
 * one of them. */
#define REQUEST_TIMEOUT_S 10
#define MAX_HEADERS_SIZE 8192
#define MAX_BODY_SIZE 1024

struct distd_http {
  struct evhttp *http;
  distd_http_hooks hooks;
  char address[INET6_ADDRSTRLEN + 16];
};

/* Splits "host:port" or "[v6]:port" into host and port strings. */
static int split_address(const char *addr, char *host, size_t hostlen,
                         char *port, size_t portlen, dist_errbuf *eb) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon[1] == 0)
    return dist_fail(eb, DIST_ECONFIG, "http: bad address '%s' (want host:port)",
                     addr);
  const char *h = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n >= hostlen || strlen(colon + 1) >= portlen)
    return dist_fail(eb, DIST_ECONFIG, "http: address '%s' too long", addr);
  memcpy(host, h, n);
  host[n] = 0;
  strcpy(port, colon + 1);
  return 0;
}

/* Formats the socket's local address as "host:port" ("[v6]:port"). */
static void format_bound(evutil_socket_t fd, char *out, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char host[INET6_ADDRSTRLEN], port[16];
  out[0] = 0;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return;
  if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port,
                  sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return;
  snprintf(out, len, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host,
           port);
}

static int open_listener(const char *addr, evutil_socket_t *out,
                         dist_errbuf *eb) {
  char host[256], port[16];
  struct addrinfo hints = {0}, *res = NULL;
  evutil_socket_t fd = -1;
  int rc = split_address(addr, host, sizeof host, port, sizeof port, eb);
  if (rc != 0) goto out;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (gai != 0) {
    rc = dist_fail(eb, DIST_ECONFIG, "http: cannot listen on %s: %s", addr,
                   gai_strerror(gai));
    goto out;
  }
  fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0 ||
      evutil_make_socket_nonblocking(fd) != 0) {
    rc = dist_fail(eb, DIST_EUNAVAIL, "http: cannot listen on %s: %s", addr,
                   strerror(errno));
    goto out;
  }
  *out = fd;
  fd = -1;
out:
  if (fd >= 0) close(fd);
  if (res) freeaddrinfo(res);
  return rc;
}

static void reply_text(struct evhttp_request *req, int code,
                       const char *reason, const char *body) {
  struct evbuffer *buf = evbuffer_new();
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", TEXT_CONTENT_TYPE);
  if (buf) evbuffer_add(buf, body, strlen(body));
  evhttp_send_reply(req, code, reason, buf);
  evbuffer_free(buf);
}

static void serve_metrics(distd_http *h, struct evhttp_request *req) {
  struct evbuffer *buf = evbuffer_new();
  if (!buf) {
    evhttp_send_error(req, HTTP_INTERNAL, NULL);
    return;
  }
  if (h->hooks.metrics) h->hooks.metrics(h->hooks.arg, buf);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                    METRICS_CONTENT_TYPE);
  evhttp_send_reply(req, HTTP_OK, "OK", buf);
  evbuffer_free(buf);
}

static void serve_ready(distd_http *h, struct evhttp_request *req) {
  char why[512] = "", body[600];
  if (!h->hooks.ready || h->hooks.ready(h->hooks.arg, why, sizeof why)) {
    reply_text(req, HTTP_OK, "OK", "ready\n");
    return;
  }
  why[sizeof why - 1] = 0;
  snprintf(body, sizeof body, "not ready: %s\n", why[0] ? why : "starting");
  reply_text(req, 503, "Service Unavailable", body);
}

static void handle(struct evhttp_request *req, void *arg) {
  distd_http *h = arg;
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
  const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
  /* GET only: evhttp would send a body with a HEAD reply, and neither
   * Prometheus nor the probes use HEAD. */
  if (cmd != EVHTTP_REQ_GET) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET");
    reply_text(req, HTTP_BADMETHOD, "Method Not Allowed",
               "method not allowed\n");
  } else if (path && strcmp(path, "/metrics") == 0) {
    serve_metrics(h, req);
  } else if (path && strcmp(path, "/healthz") == 0) {
    reply_text(req, HTTP_OK, "OK", "ok\n");
  } else if (path && strcmp(path, "/readyz") == 0) {
    serve_ready(h, req);
  } else {
    reply_text(req, HTTP_NOTFOUND, "Not Found",
               "not found; try /metrics, /healthz or /readyz\n");
  }
}

int distd_http_start(distd_http **out, struct event_base *base,
                     const char *addr, const distd_http_hooks *hooks,
                     dist_errbuf *eb) {
  evutil_socket_t fd = -1;
  distd_http *h = calloc(1, sizeof *h);
  int rc = h ? 0 : dist_fail(eb, DIST_ENOMEM, "http: out of memory");
  if (rc != 0) goto out;
  if (hooks) h->hooks = *hooks;
  rc = open_listener(addr, &fd, eb);
  if (rc != 0) goto out;
  format_bound(fd, h->address, sizeof h->address);
  h->http = evhttp_new(base);
  /* Accept every method so that handle() answers 405 itself, uniformly. */
  if (h->http)
    evhttp_set_allowed_methods(h->http, 0xffff);
  if (!h->http || !evhttp_accept_socket_with_handle(h->http, fd)) {
    rc = dist_fail(eb, DIST_EINTERNAL, "http: cannot serve on %s", addr);
    goto out;
  }
  fd = -1; /* evhttp closes the listener when freed */
  evhttp_set_timeout(h->http, REQUEST_TIMEOUT_S);
  evhttp_set_max_headers_size(h->http, MAX_HEADERS_SIZE);
  evhttp_set_max_body_size(h->http, MAX_BODY_SIZE);
  evhttp_set_gencb(h->http, handle, h);
  *out = h;
  h = NULL;
out:
  if (fd >= 0) evutil_closesocket(fd);
  distd_http_free(h);
  return rc;
}

const char *distd_http_address(const distd_http *h) { return h->address; }

void distd_http_free(distd_http *h) {
  if (!h) return;
  if (h->http) evhttp_free(h->http);
  free(h);
}
