/* How bytes move on one peer connection: plain TCP or TLS, chosen once per
 * data plane, behind a small table of functions (in the manner of Redis's
 * connection.h) so peer_conn.c has no TLS #ifdefs. Every function runs with
 * distd_peers.mu held, on the loop thread or a worker. */
#ifndef DISTD_PEER_TRANSPORT_H
#define DISTD_PEER_TRANSPORT_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "errbuf.h"

struct conn;

/* A connection's certificate has not been looked at (plain TCP). */
#define DISTD_CERT_RANK_UNCHECKED (-2)
/* The certificate names no rank, or more than one. */
#define DISTD_CERT_RANK_NONE (-1)
/* A daemon's certificate names its rank as the subjectAltName DNS entry
 * "distd-rank-N" (one rank per certificate). */
#define DISTD_TLS_RANK_PREFIX "distd-rank-"

/* What a reloaded trust store says of a peer's certificate chain. */
enum { DISTD_TRUST_OK, DISTD_TRUST_REVOKED, DISTD_TRUST_UNTRUSTED };

typedef struct distd_peer_transport {
  const char *name; /* "tcp", "tls" */
  /* Prepares the connection's transport state (c->tls) once its socket
   * exists; ctx is distd_peers.tls_ctx. Returns 0 or -1 (out of memory). */
  int (*attach)(struct conn *c, void *ctx);
  /* Advances the handshake: 1 done (c->cert_rank set), 0 waiting for the
   * socket (c->hs_want is EV_READ or EV_WRITE), -1 failed (c->tp_error
   * says why). NULL when there is no handshake. */
  int (*handshake)(struct conn *c);
  /* Like read(2) and writev(2): -1 with errno EAGAIN when the socket has
   * nothing / no room; other failures set c->tp_error when errno alone
   * does not explain them. read returns 0 at a clean end of stream. */
  ssize_t (*read)(struct conn *c, void *buf, size_t len);
  ssize_t (*writev)(struct conn *c, const struct iovec *iov, int n);
  /* Like readv(2); NULL when the transport cannot scatter a read (TLS
   * decrypts into its own buffers), which turns off reading ahead into a
   * posted receive (peer_read.c). */
  ssize_t (*readv)(struct conn *c, const struct iovec *iov, int n);
  /* Bytes already read from the socket and not yet handed out: readiness
   * on the socket does not announce them. */
  size_t (*pending)(struct conn *c);
  /* Releases what attach made, before the socket is closed. */
  void (*detach)(struct conn *c);
  /* After the handshake: DISTD_TRUST_OK when the certificate chain the
   * peer presented verifies against ctx's trust store now (tls_ca and
   * tls_crl as loaded last, checked as a handshake would); else
   * DISTD_TRUST_REVOKED or DISTD_TRUST_UNTRUSTED, with why saying so from
   * "certificate /CN=x ..." on. NULL where peers present no certificate
   * (plain TCP). */
  int (*distrusted_by)(struct conn *c, void *ctx, char *why, size_t len);
} distd_peer_transport;

extern const distd_peer_transport distd_peer_transport_tcp;
extern const distd_peer_transport distd_peer_transport_tls;

/* The data plane's TLS context: this daemon's certificate and key, peers
 * verified against the CA (mutual TLS, TLS 1.3 only), all from f. */
struct distd_tls_files;
int distd_peer_tls_ctx_new(const struct distd_tls_files *f, void **out, dist_errbuf *eb);
void distd_peer_tls_ctx_free(void *ctx); /* NULL is a no-op */

#endif
