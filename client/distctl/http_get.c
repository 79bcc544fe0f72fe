/* A bounded HTTP/1.0 GET, for the daemons' HTTP port (distctl metrics). */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "distctl.h"

#define HTTP_MAX (64u << 20) /* largest /metrics body accepted */

/* "host:port" or "[v6]:port" into its parts. */
static int split_hostport(const char *addr, char *host, size_t hlen, char *port, size_t plen) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1]) return -1;
  const char *h = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
  if (n >= hlen || strlen(colon + 1) >= plen) return -1;
  memcpy(host, h, n);
  host[n] = 0;
  snprintf(port, plen, "%s", colon + 1);
  return 0;
}

/* The daemon's HTTP address, with a wildcard host replaced by the host its
 * gRPC endpoint was reached at. */
int distctl_http_target(dist_client *c, int rank, const char *http, char *host, size_t hlen,
                        char *port, size_t plen) {
  char ghost[256], gport[16];
  if (split_hostport(http, host, hlen, port, plen) != 0) return -1;
  int wildcard = !host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
  if (wildcard && split_hostport(dist_endpoint(c, rank), ghost, sizeof ghost, gport,
                                 sizeof gport) == 0)
    snprintf(host, hlen, "%s", ghost);
  return 0;
}

static int dial(const char *host, const char *port, long timeout_ms) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, port, &hints, &ai) != 0) return -1;
  int fd = -1;
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect too */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) close(fd), fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

/* GET path over HTTP/1.0; *body is the malloc'd body of a 200 reply. */
int distctl_http_get(const char *host, const char *port, const char *path, long timeout_ms,
                     char **body, char *why, size_t wlen) {
  char req[512], *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = -1, fd = dial(host, port, timeout_ms);
  *body = NULL;
  if (fd < 0) {
    snprintf(why, wlen, "cannot connect to %s:%s", host, port);
    return -1;
  }
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
  if (write(fd, req, (size_t)n) != n) {
    snprintf(why, wlen, "cannot send the request to %s:%s", host, port);
    goto out;
  }
  for (;;) {
    if (len + 4096 + 1 > cap) {
      char *b = cap < HTTP_MAX ? realloc(buf, cap = cap ? 2 * cap : 65536) : NULL;
      if (!b) {
        snprintf(why, wlen, "reply from %s:%s too large", host, port);
        goto out;
      }
      buf = b;
    }
    ssize_t got = read(fd, buf + len, cap - len - 1);
    if (got == 0) break;
    if (got < 0) {
      snprintf(why, wlen, "no complete reply from %s:%s within %ld ms", host, port, timeout_ms);
      goto out;
    }
    len += (size_t)got;
  }
  buf[len] = 0;
  char *sep = strstr(buf, "\r\n\r\n");
  int status = 0;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || status != 200 || !sep) {
    char first[160];
    size_t n = strcspn(buf, "\r\n");
    if (n >= sizeof first) n = sizeof first - 1;
    memcpy(first, buf, n);
    first[n] = 0;
    snprintf(why, wlen, "%s:%s answered: %s", host, port, first);
    goto out;
  }
  *body = strdup(sep + 4);
  rc = 0;
out:
  free(buf);
  close(fd);
  return rc;
}
