/* The TLS transport of the data plane: OpenSSL on the non-blocking socket,
 * SSL_read straight into the destination buffer and SSL_write from the
 * caller's, driven by libevent readiness. Mutual TLS 1.3: both ends present
 * a certificate signed by the cluster CA, and the rank a certificate names
 * (subjectAltName DNS:distd-rank-N) is checked against the HELLO by
 * peer_control.c. */
#include <errno.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer_internal.h"
#include "peer_transport.h"
#include "tls.h"

/* Fills c->tp_error from OpenSSL's error queue (or errno) and returns -1
 * with errno set for the caller. */
static ssize_t tls_fail(conn *c, int ssl_error, const char *during) {
  unsigned long e = ERR_get_error();
  int saved = errno;
  if (e) {
    char buf[160];
    ERR_error_string_n(e, buf, sizeof buf);
    long v = SSL_get_verify_result(c->tls);
    if (v != X509_V_OK)
      snprintf(c->tp_error, sizeof c->tp_error, "TLS %s failed: %s (certificate: %s)",
               during, buf, X509_verify_cert_error_string(v));
    else
      snprintf(c->tp_error, sizeof c->tp_error, "TLS %s failed: %s", during, buf);
  } else if (ssl_error == SSL_ERROR_SYSCALL && saved) {
    ERR_clear_error();
    errno = saved; /* a plain socket error: errno says it */
    return -1;
  } else {
    snprintf(c->tp_error, sizeof c->tp_error, "TLS %s failed: connection closed", during);
  }
  ERR_clear_error();
  c->tls_failed = 1;
  errno = EPROTO;
  return -1;
}

/* "distd-rank-12" -> 12; -1 for anything else. */
static int parse_rank_name(const unsigned char *s, int len) {
  size_t pl = sizeof DISTD_TLS_RANK_PREFIX - 1;
  if (len <= (int)pl || len > (int)pl + 5 || memcmp(s, DISTD_TLS_RANK_PREFIX, pl) != 0)
    return -1;
  int r = 0;
  for (int i = (int)pl; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    r = r * 10 + (s[i] - '0');
  }
  return r;
}

/* The one rank the peer's certificate names; DISTD_CERT_RANK_NONE when it
 * names none or several. */
static int cert_rank(SSL *ssl) {
  X509 *cert = SSL_get0_peer_certificate(ssl);
  if (!cert) return DISTD_CERT_RANK_NONE;
  GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
  int rank = DISTD_CERT_RANK_NONE;
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names); i++) {
    const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
    if (g->type != GEN_DNS) continue;
    int r = parse_rank_name(ASN1_STRING_get0_data(g->d.dNSName),
                            ASN1_STRING_length(g->d.dNSName));
    if (r < 0) continue;
    if (rank >= 0 && rank != r) {
      rank = DISTD_CERT_RANK_NONE;
      break;
    }
    rank = r;
  }
  GENERAL_NAMES_free(names);
  return rank;
}

static int tls_attach(conn *c, void *ctx) {
  c->cert_rank = DISTD_CERT_RANK_NONE;
  SSL *ssl = SSL_new(ctx);
  if (!ssl || SSL_set_fd(ssl, c->fd) != 1) {
    SSL_free(ssl);
    return -1;
  }
  if (c->outbound)
    SSL_set_connect_state(ssl);
  else
    SSL_set_accept_state(ssl);
  c->tls = ssl;
  return 0;
}

static int tls_handshake(conn *c) {
  ERR_clear_error();
  int r = SSL_do_handshake(c->tls);
  if (r == 1) {
    c->cert_rank = cert_rank(c->tls);
    return 1;
  }
  int e = SSL_get_error(c->tls, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    c->hs_want = e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE;
    return 0;
  }
  tls_fail(c, e, "handshake");
  if (!c->tp_error[0])
    snprintf(c->tp_error, sizeof c->tp_error, "TLS handshake failed: %s",
             distd_peer_errno_reason(errno));
  return -1;
}

static ssize_t tls_read(conn *c, void *buf, size_t len) {
  size_t n = 0;
  ERR_clear_error();
  if (SSL_read_ex(c->tls, buf, len, &n) == 1) return (ssize_t)n;
  int e = SSL_get_error(c->tls, 0);
  switch (e) {
  case SSL_ERROR_WANT_WRITE:
    /* TLS wants to send something (a key update) before reading on: the
     * write callback comes back to reading (peer_read.c). */
    c->read_wants_write = 1;
    distd_conn_want_write(c);
    /* fall through */
  case SSL_ERROR_WANT_READ:
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    return 0;
  default:
    return tls_fail(c, e, "read");
  }
}

/* One SSL_write per buffer: TLS has no writev. With partial writes on, a
 * retry after WANT_WRITE presents the same bytes at the same offset, as
 * OpenSSL requires, because the send queue restarts where it stopped. */
static ssize_t tls_writev(conn *c, const struct iovec *iov, int n) {
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    size_t off = 0;
    while (off < iov[i].iov_len) {
      size_t w = 0;
      ERR_clear_error();
      if (SSL_write_ex(c->tls, (const char *)iov[i].iov_base + off,
                       iov[i].iov_len - off, &w) == 1) {
        off += w;
        total += w;
        continue;
      }
      int e = SSL_get_error(c->tls, 0);
      if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
        if (total) return (ssize_t)total;
        errno = EAGAIN;
        return -1;
      }
      return tls_fail(c, e, "write");
    }
  }
  return (ssize_t)total;
}

static size_t tls_pending(conn *c) {
  /* Decrypted bytes only: SSL_has_pending also counts half a record,
   * which cannot be read until the socket brings the rest. */
  return c->tls ? (size_t)SSL_pending(c->tls) : 0;
}

static void tls_detach(conn *c) {
  if (!c->tls) return;
  /* A best-effort close_notify; never after a fatal error. */
  if (!c->tls_failed && SSL_is_init_finished(c->tls)) {
    ERR_clear_error();
    SSL_shutdown(c->tls);
  }
  ERR_clear_error();
  SSL_free(c->tls);
  c->tls = NULL;
}

/* The peer's chain against ctx's store, as OpenSSL's handshake checks it
 * (ssl_verify_cert_chain): with the purpose of the peer's side, so what a
 * handshake would refuse now is refused here, and nothing else. */
static int verify_error(conn *c, SSL_CTX *ctx, X509 *cert) {
  X509_STORE_CTX *sc = X509_STORE_CTX_new();
  /* Out of memory: the handshake's verdict stands until the next check. */
  int err = X509_V_OK;
  if (sc && X509_STORE_CTX_init(sc, SSL_CTX_get_cert_store(ctx), cert,
                                SSL_get_peer_cert_chain(c->tls)) == 1) {
    X509_STORE_CTX_set_default(sc, c->outbound ? "ssl_server" : "ssl_client");
    if (X509_verify_cert(sc) != 1) err = X509_STORE_CTX_get_error(sc);
  }
  X509_STORE_CTX_free(sc);
  ERR_clear_error();
  return err;
}

static int tls_distrusted_by(conn *c, void *ctx, char *why, size_t len) {
  X509 *cert = c->tls ? SSL_get0_peer_certificate(c->tls) : NULL;
  int err = cert ? verify_error(c, ctx, cert) : X509_V_OK;
  if (err == X509_V_OK) return DISTD_TRUST_OK;
  char subject[256];
  if (!X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof subject))
    snprintf(subject, sizeof subject, "?");
  if (err == X509_V_ERR_CERT_REVOKED) {
    snprintf(why, len, "certificate %s is revoked", subject);
    return DISTD_TRUST_REVOKED;
  }
  snprintf(why, len, "certificate %s is no longer trusted: %s", subject,
           X509_verify_cert_error_string(err));
  return DISTD_TRUST_UNTRUSTED;
}

const distd_peer_transport distd_peer_transport_tls = {
    "tls", tls_attach, tls_handshake, tls_read, tls_writev, NULL, tls_pending, tls_detach,
    tls_distrusted_by,
};

int distd_peer_tls_ctx_new(const distd_tls_files *f, void **out, dist_errbuf *eb) {
  *out = NULL;
  ERR_clear_error();
  SSL_CTX *ctx = SSL_CTX_new(TLS_method());
  if (!ctx) return dist_fail(eb, DIST_ENOMEM, "data plane TLS: cannot create a context");
  /* Both ends are distd: TLS 1.3 only, no renegotiation, no tickets (no
   * session resumption, and no surprise writes from SSL_read). */
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  if (distd_tls_ctx_load(ctx, f, 1, "data plane TLS", eb) != 0) {
    SSL_CTX_free(ctx);
    return eb->code;
  }
  *out = ctx;
  return 0;
}

void distd_peer_tls_ctx_free(void *ctx) { SSL_CTX_free(ctx); }
