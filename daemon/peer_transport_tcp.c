/* The plain TCP transport: read(2) and sendmsg(2) straight on the socket. */
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "peer_internal.h"
#include "peer_transport.h"

static int tcp_attach(conn *c, void *ctx) {
  (void)ctx;
  c->cert_rank = DISTD_CERT_RANK_UNCHECKED;
  return 0;
}

static ssize_t tcp_read(conn *c, void *buf, size_t len) {
  ssize_t n;
  do n = read(c->fd, buf, len);
  while (n < 0 && errno == EINTR);
  return n;
}

static ssize_t tcp_writev(conn *c, const struct iovec *iov, int n) {
  struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
  ssize_t w;
  do w = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  return w;
}

static ssize_t tcp_readv(conn *c, const struct iovec *iov, int n) {
  ssize_t r;
  do r = readv(c->fd, iov, n);
  while (r < 0 && errno == EINTR);
  return r;
}

static size_t tcp_pending(conn *c) {
  (void)c;
  return 0;
}

static void tcp_detach(conn *c) { (void)c; }

const distd_peer_transport distd_peer_transport_tcp = {
    "tcp", tcp_attach, NULL, tcp_read, tcp_writev, tcp_readv, tcp_pending, tcp_detach, NULL,
};
