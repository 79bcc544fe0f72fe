/* TLS for the gRPC port (grpc core's ssl credentials) and the helpers the
 * data plane's TLS transport shares with it. Certificates are PEM files
 * named by the config (tls_cert, tls_key, tls_ca), read once per start or
 * reload (distd_tls_files). */
#ifndef DISTD_TLS_H
#define DISTD_TLS_H

#include <stddef.h>

#include "config.h"
#include "crl.h"
#include "errbuf.h"

/* tls.c: the PEM files the TLS settings name, read once. The check, gRPC
 * and the data plane all load these same bytes, so files replaced while a
 * rotation reads them cannot leave one side with the new certificate and
 * the other with the old, nor a certificate with another one's key. */
typedef struct distd_tls_files {
  const char *cert_path, *key_path, *ca_path, *crl_path; /* for messages */
  char *cert, *key, *ca, *crl; /* NUL-terminated; NULL: not set */
  dist_crl *crls; /* crl parsed and checked against ca; NULL: not set */
  int64_t cert_not_after; /* the certificate's, in seconds since the epoch */
} distd_tls_files;
/* Reads the files cfg's tls_cert, tls_key, tls_ca and tls_crl name (each
 * "" = not set; all stay NULL without a cert), and parses the CRLs.
 * Errors name the setting and its file. */
int distd_tls_files_read(const distd_config *cfg, distd_tls_files *out,
                         dist_errbuf *eb);
void distd_tls_files_free(distd_tls_files *f); /* wipes the key */
/* Loads f's certificate (the first in tls_cert, the rest its chain), its
 * key and, with with_ca, the CA that verifies peers and the CRLs they are
 * checked against (tls_crl) into ssl_ctx (an SSL_CTX *), checking that the
 * key is the certificate's. Errors name the
 * setting and its file, after what ("data plane TLS"). */
int distd_tls_ctx_load(void *ssl_ctx, const distd_tls_files *f, int with_ca,
                       const char *what, dist_errbuf *eb);

/* tls_grpc.c: server credentials for the gRPC port: TLS with f's
 * certificate and key when f->cert is set (client certificates per
 * tls_client_auth, verified against f's CA), insecure otherwise. *out is
 * released by the caller. With TLS, *certs is where the credentials find
 * the certificates; it must outlive the server (free it after
 * grpc_server_destroy). */
struct grpc_server_credentials;
typedef struct distd_tls_grpc distd_tls_grpc;
int distd_tls_grpc_server_creds(const distd_config *cfg, const distd_tls_files *f,
                                distd_tls_grpc **certs,
                                struct grpc_server_credentials **out,
                                dist_errbuf *eb);
/* gRPC's next handshakes use f's certificate, key and CA; open connections
 * keep theirs. On failure nothing changes. */
int distd_tls_grpc_reload(distd_tls_grpc *t, const distd_tls_files *f, dist_errbuf *eb);
void distd_tls_grpc_free(distd_tls_grpc *t); /* NULL is a no-op */
/* With tls_crl: refuses (DIST_EAUTH, saying why) a call whose client
 * certificate is revoked or has no current CRL of its issuer. The CRLs of
 * the last load apply to every call, on open connections too. */
struct grpc_call;
int distd_tls_grpc_check_call(distd_tls_grpc *t, struct grpc_call *call,
                              dist_errbuf *eb);
/* Checks the TLS settings hang together (a cert without a key, client auth
 * or peer TLS without a CA, ...), before anything starts. */
int distd_tls_check_config(const distd_config *cfg, dist_errbuf *eb);
/* 1 when HOST:PORT names a loopback host (127.0.0.0/8, ::1, localhost). */
int distd_addr_is_loopback(const char *addr);
/* Logs a warning when addr is reachable from the network without TLS. */
void distd_tls_warn_plain(const char *what, const char *addr, int tls);

#endif
