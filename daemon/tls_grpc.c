/* TLS on the gRPC port: grpc core's ssl server credentials, given new
 * certificates on reload. */
#include <grpc/grpc_security.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "crl.h"
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
  if (cfg->tls_crl[0] && (!has_cert || !cfg->tls_ca[0]))
    return dist_fail(eb, DIST_ECONFIG, "tls_crl needs TLS and a CA: set tls_cert, tls_key "
                     "and tls_ca");
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

/* The gRPC port's certificates. gRPC asks fetch_config for them at every
 * handshake and takes a new set when there is one, so a reload (SIGHUP)
 * reaches the connections made after it; open ones keep theirs. */
struct distd_tls_grpc {
  int client_auth;
  pthread_mutex_t mu;
  grpc_ssl_server_certificate_config *next; /* for gRPC's next handshake */
  dist_crl *crl; /* tls_crl, for every call from its load on; NULL: none */
  /* tls_crl is set (read at start only): without it, a call is not
   * checked and takes no lock. With it, every load has CRLs. */
  int checks_crl;
};

/* f's certificate, key and CA as a certificate config for gRPC, after
 * OpenSSL has checked the same bytes: that they load and that the key is
 * the certificate's (gRPC itself would only say so when a handshake
 * fails). */
static int load_config(int client_auth, const distd_tls_files *f,
                       grpc_ssl_server_certificate_config **out, dist_errbuf *eb) {
  *out = NULL;
  SSL_CTX *check = SSL_CTX_new(TLS_method());
  if (!check) return dist_fail(eb, DIST_ENOMEM, "gRPC TLS: cannot create a context");
  int rc = distd_tls_ctx_load(check, f, client_auth, "gRPC TLS", eb);
  SSL_CTX_free(check);
  if (rc != 0) return rc;
  grpc_ssl_pem_key_cert_pair pair = {f->key, f->cert};
  /* gRPC 1.51 asserts that a fetched config has root certificates, even
   * when no client certificate is asked for; then they verify nothing,
   * and the server's own certificate stands in for a CA. */
  *out = grpc_ssl_server_certificate_config_create(client_auth ? f->ca : f->cert, &pair, 1);
  return 0;
}

/* gRPC's fetcher: the new set once after each load, else "unchanged".
 * gRPC destroys the config it is given. */
static grpc_ssl_certificate_config_reload_status fetch_config(
    void *user, grpc_ssl_server_certificate_config **config) {
  distd_tls_grpc *t = user;
  pthread_mutex_lock(&t->mu);
  *config = t->next;
  t->next = NULL;
  pthread_mutex_unlock(&t->mu);
  return *config ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW
                 : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
}

int distd_tls_grpc_reload(distd_tls_grpc *t, const distd_tls_files *f, dist_errbuf *eb) {
  grpc_ssl_server_certificate_config *fresh = NULL;
  if (load_config(t->client_auth, f, &fresh, eb) != 0) return eb->code;
  dist_crl *crl = f->crls ? dist_crl_ref(f->crls) : NULL;
  pthread_mutex_lock(&t->mu);
  grpc_ssl_server_certificate_config *unused = t->next;
  dist_crl *old_crl = t->crl;
  t->next = fresh;
  t->crl = crl;
  pthread_mutex_unlock(&t->mu);
  if (unused) grpc_ssl_server_certificate_config_destroy(unused);
  dist_crl_free(old_crl);
  return 0;
}

/* The client certificate gRPC verified for call, as PEM, into *pem (NULL
 * when the client sent none). -1 when it could not be copied. */
static int client_cert_pem(grpc_call *call, char **pem, size_t *len) {
  *pem = NULL;
  *len = 0;
  grpc_auth_context *ctx = grpc_call_auth_context(call);
  if (!ctx) return 0;
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(
      ctx, GRPC_X509_PEM_CERT_PROPERTY_NAME);
  const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
  int rc = 0;
  if (p && (*pem = malloc(p->value_length + 1)) == NULL) rc = -1;
  else if (p) memcpy(*pem, p->value, p->value_length), *len = p->value_length;
  grpc_auth_context_release(ctx);
  return rc;
}

int distd_tls_grpc_check_call(distd_tls_grpc *t, grpc_call *call, dist_errbuf *eb) {
  if (!t->checks_crl) return 0;
  char *pem = NULL;
  size_t len = 0;
  if (client_cert_pem(call, &pem, &len) != 0) /* refused, not let through unchecked */
    return dist_fail(eb, DIST_ENOMEM, "out of memory checking the client certificate "
                     "against tls_crl");
  if (!pem) return 0; /* no client certificate: tls_client_auth decided */
  pthread_mutex_lock(&t->mu); /* a reload may swap the CRLs meanwhile */
  int rc = t->crl ? dist_crl_check_pem(t->crl, pem, len, eb) : 0;
  pthread_mutex_unlock(&t->mu);
  free(pem);
  return rc;
}

void distd_tls_grpc_free(distd_tls_grpc *t) {
  if (!t) return;
  if (t->next) grpc_ssl_server_certificate_config_destroy(t->next);
  dist_crl_free(t->crl);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

int distd_tls_grpc_server_creds(const distd_config *cfg, const distd_tls_files *f,
                                distd_tls_grpc **certs, grpc_server_credentials **out,
                                dist_errbuf *eb) {
  *out = NULL;
  *certs = NULL;
  if (!f->cert) {
    *out = grpc_insecure_server_credentials_create();
    return 0;
  }
  distd_tls_grpc *t = calloc(1, sizeof *t);
  if (!t) return dist_fail(eb, DIST_ENOMEM, "gRPC TLS: out of memory");
  t->client_auth = cfg->tls_client_auth != DISTD_CLIENT_AUTH_NONE;
  t->checks_crl = cfg->tls_crl[0] != 0;
  pthread_mutex_init(&t->mu, NULL);
  /* gRPC fetches the first set when the port is added. */
  if (distd_tls_grpc_reload(t, f, eb) != 0) {
    distd_tls_grpc_free(t);
    return eb->code;
  }
  grpc_ssl_server_credentials_options *opt =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          request_type(cfg->tls_client_auth), fetch_config, t);
  *out = grpc_ssl_server_credentials_create_with_options(opt); /* takes opt */
  if (!*out) {
    distd_tls_grpc_free(t);
    return dist_fail(eb, DIST_ECONFIG, "tls_cert %s / tls_key %s: gRPC refused them",
                     cfg->tls_cert, cfg->tls_key);
  }
  *certs = t;
  return 0;
}
