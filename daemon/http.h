/* The daemon's HTTP port (libevent evhttp): /metrics in Prometheus text
 * format, /healthz (200 while the process serves) and /readyz (200 once
 * every peer is connected, 503 with the missing ranks otherwise). */
#ifndef DISTD_HTTP_H
#define DISTD_HTTP_H

#include <stddef.h>

#include "errbuf.h"

struct event_base;
struct evbuffer;
typedef struct distd_http distd_http;

typedef struct distd_http_hooks {
  void *arg;
  /* Appends the full metrics exposition to out. Runs on the loop thread. */
  void (*metrics)(void *arg, struct evbuffer *out);
  /* Returns 1 when ready; otherwise 0 and a reason in why. */
  int (*ready)(void *arg, char *why, size_t len);
} distd_http_hooks;

/* Binds addr ("host:port"; port 0 picks one) on base. Fails with a message
 * naming the address when it cannot bind. */
int distd_http_start(distd_http **out, struct event_base *base,
                     const char *addr, const distd_http_hooks *hooks,
                     dist_errbuf *eb);
/* The bound "host:port". */
const char *distd_http_address(const distd_http *h);
void distd_http_free(distd_http *h); /* NULL is a no-op */

#endif
