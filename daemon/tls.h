/* TLS for the gRPC port (grpc core's ssl credentials) and the helpers the
 * data plane's TLS transport shares with it. Certificates are PEM files
 * named by the config (tls_cert, tls_key, tls_ca). */
#ifndef DISTD_TLS_H
#define DISTD_TLS_H

#include <stddef.h>

#include "config.h"
#include "errbuf.h"

/* tls_grpc.c: server credentials for the gRPC port: TLS with tls_cert/tls_key when
 * tls_cert is set (client certificates per tls_client_auth, verified
 * against tls_ca), insecure otherwise. *out is released by the caller.
 * With TLS, *certs is where the credentials find the certificates; it
 * must outlive the server (free it after grpc_server_destroy). */
struct grpc_server_credentials;
typedef struct distd_tls_grpc distd_tls_grpc;
int distd_tls_grpc_server_creds(const distd_config *cfg, distd_tls_grpc **certs,
                                struct grpc_server_credentials **out,
                                dist_errbuf *eb);
/* Reads tls_cert, tls_key and tls_ca again; gRPC's next handshakes use
 * them, open connections keep theirs. On failure nothing changes. */
int distd_tls_grpc_reload(distd_tls_grpc *t, dist_errbuf *eb);
void distd_tls_grpc_free(distd_tls_grpc *t); /* NULL is a no-op */
/* Checks the TLS settings hang together (a cert without a key, client auth
 * or peer TLS without a CA, ...), before anything starts. */
int distd_tls_check_config(const distd_config *cfg, dist_errbuf *eb);
/* tls.c: reads a whole PEM file (what names the setting in errors). *out is
 * malloc'd and NUL-terminated. */
int distd_tls_read_pem(const char *path, const char *what, char **out,
                       dist_errbuf *eb);
/* Loads the certificate chain cert, its key and, when ca is not NULL, the
 * CA that verifies peers into ssl_ctx (an SSL_CTX *), checking that the
 * key is the certificate's. Errors name the setting and its file, after
 * what ("data plane TLS"). */
int distd_tls_ctx_load(void *ssl_ctx, const char *cert, const char *key,
                       const char *ca, const char *what, dist_errbuf *eb);
/* 1 when HOST:PORT names a loopback host (127.0.0.0/8, ::1, localhost). */
int distd_addr_is_loopback(const char *addr);
/* Logs a warning when addr is reachable from the network without TLS. */
void distd_tls_warn_plain(const char *what, const char *addr, int tls);

#endif
