/* TLS on the gRPC port: grpc core's ssl server credentials. */
#include <grpc/grpc_security.h>
#include <stdlib.h>
#include <string.h>

#include "tls.h"

int distd_tls_check_config(const distd_config *cfg, dist_errbuf *eb) {
  int has_cert = cfg->tls_cert[0] != 0, has_key = cfg->tls_key[0] != 0;
  if (has_cert != has_key)
    return dist_fail(eb, DIST_ECONFIG, "tls_cert and tls_key go together: only %s is set",
                     has_cert ? "tls_cert" : "tls_key");
  if (cfg->tls_client_auth != DISTD_CLIENT_AUTH_NONE && !has_cert)
    return dist_fail(eb, DIST_ECONFIG, "tls_client_auth needs TLS: set tls_cert and tls_key");
  if (cfg->tls_client_auth != DISTD_CLIENT_AUTH_NONE && !cfg->tls_ca[0])
    return dist_fail(eb, DIST_ECONFIG, "tls_client_auth needs tls_ca to verify client "
                     "certificates");
  if (distd_config_peer_tls(cfg) && (!has_cert || !cfg->tls_ca[0]))
    return dist_fail(eb, DIST_ECONFIG, "peer_tls needs tls_cert, tls_key and tls_ca "
                     "(mutual TLS between daemons)");
  return 0;
}

static grpc_ssl_client_certificate_request_type request_type(int mode) {
  switch (mode) {
  case DISTD_CLIENT_AUTH_REQUIRE:
    return GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  case DISTD_CLIENT_AUTH_OPTIONAL:
    return GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  default:
    return GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
}

int distd_tls_grpc_server_creds(const distd_config *cfg,
                                grpc_server_credentials **out, dist_errbuf *eb) {
  *out = NULL;
  if (!cfg->tls_cert[0]) {
    *out = grpc_insecure_server_credentials_create();
    return 0;
  }
  char *cert = NULL, *key = NULL, *ca = NULL;
  int rc = distd_tls_read_pem(cfg->tls_cert, "tls_cert", &cert, eb);
  if (rc == 0) rc = distd_tls_read_pem(cfg->tls_key, "tls_key", &key, eb);
  if (rc == 0 && cfg->tls_ca[0]) rc = distd_tls_read_pem(cfg->tls_ca, "tls_ca", &ca, eb);
  if (rc != 0) goto out;
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  /* Ownership passes config -> options -> credentials: none of the three
   * is destroyed here except through the credentials. grpc copies the
   * strings. */
  grpc_ssl_server_certificate_config *sc = grpc_ssl_server_certificate_config_create(
      cfg->tls_client_auth != DISTD_CLIENT_AUTH_NONE ? ca : NULL, &pair, 1);
  grpc_ssl_server_credentials_options *opt =
      grpc_ssl_server_credentials_create_options_using_config(
          request_type(cfg->tls_client_auth), sc);
  *out = grpc_ssl_server_credentials_create_with_options(opt);
  if (!*out)
    rc = dist_fail(eb, DIST_ECONFIG, "tls_cert %s / tls_key %s: gRPC refused them "
                   "(is the key the certificate's?)", cfg->tls_cert, cfg->tls_key);
out:
  if (key) memset(key, 0, strlen(key));
  free(cert);
  free(key);
  free(ca);
  return rc;
}

