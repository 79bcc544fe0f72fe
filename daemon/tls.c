/* TLS helpers shared by the gRPC port and the data plane: PEM files read
 * once, loading and checking a certificate and its key from them, and the
 * warning about plain TCP on the network. No gRPC here: the peer tests
 * link this file. */
#include "tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "crl.h"
#include "fileio.h"
#include "log.h"

/* The notAfter of the first certificate in pem (seconds since the
 * epoch), 0 when it cannot be read; whether it loads is checked later. */
static int64_t not_after(const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  int64_t t = x ? dist_asn1_time_unix(X509_get0_notAfter(x)) : 0;
  X509_free(x);
  BIO_free(b);
  ERR_clear_error();
  return t;
}

int distd_tls_files_read(const distd_config *cfg, distd_tls_files *out,
                         dist_errbuf *eb) {
  memset(out, 0, sizeof *out);
  out->cert_path = cfg->tls_cert, out->key_path = cfg->tls_key;
  out->ca_path = cfg->tls_ca, out->crl_path = cfg->tls_crl;
  if (!cfg->tls_cert[0]) return 0;
  int rc = dist_read_pem("tls_cert", cfg->tls_cert, &out->cert, NULL, eb);
  if (rc == 0) rc = dist_read_pem("tls_key", cfg->tls_key, &out->key, NULL, eb);
  if (rc == 0 && cfg->tls_ca[0]) rc = dist_read_pem("tls_ca", cfg->tls_ca, &out->ca, NULL, eb);
  if (rc == 0 && cfg->tls_crl[0])
    rc = dist_read_pem("tls_crl", cfg->tls_crl, &out->crl, NULL, eb);
  /* Parsed once here, for the gRPC port and the data plane: OpenSSL
   * takes its time over each signature check. */
  if (rc == 0 && out->crl)
    rc = dist_crl_parse(out->crl, out->ca, cfg->tls_crl, &out->crls, eb);
  if (rc == 0) out->cert_not_after = not_after(out->cert);
  if (rc != 0) distd_tls_files_free(out);
  return rc;
}

void distd_tls_files_free(distd_tls_files *f) {
  if (f->key) OPENSSL_cleanse(f->key, strlen(f->key));
  free(f->cert);
  free(f->key);
  free(f->ca);
  free(f->crl);
  dist_crl_free(f->crls);
  f->cert = f->key = f->ca = f->crl = NULL;
  f->crls = NULL;
}

/* Fails with OpenSSL's first queued error, naming the setting and file. */
static int load_fail(dist_errbuf *eb, const char *what, const char *setting,
                     const char *path) {
  char buf[200] = "";
  unsigned long e = ERR_get_error();
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return dist_fail(eb, DIST_ECONFIG, "%s: %s %s: %s", what, setting, path,
                   buf[0] ? buf : "cannot be used");
}

/* Each certificate in pem, in order, to use(ctx, cert, index); 1 when there
 * was at least one and every use returned 1. */
static int each_cert(SSL_CTX *ctx, const char *pem,
                     int (*use)(SSL_CTX *, X509 *, int)) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  int n = 0, ok = b != NULL;
  X509 *x;
  while (ok && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
    ok = use(ctx, x, n++) == 1;
    X509_free(x);
  }
  BIO_free(b);
  /* The loop ends at the end of the text, which OpenSSL queues as "no
   * start line": not an error once a certificate was read. */
  unsigned long e = ERR_peek_last_error();
  if (ok && n > 0 && ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE)
    ERR_clear_error();
  return ok && n > 0 && ERR_peek_error() == 0;
}

/* The first certificate is this daemon's, the others its chain. */
static int use_own(SSL_CTX *ctx, X509 *x, int i) {
  return i == 0 ? SSL_CTX_use_certificate(ctx, x) : (int)SSL_CTX_add1_chain_cert(ctx, x);
}

static int use_ca(SSL_CTX *ctx, X509 *x, int i) {
  (void)i;
  return X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), x);
}

/* A key file is never encrypted here: no password, and never a prompt. */
static int no_password(char *buf, int size, int rwflag, void *u) {
  (void)buf, (void)size, (void)rwflag, (void)u;
  return 0;
}

static int use_key(SSL_CTX *ctx, const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, no_password, NULL) : NULL;
  int ok = k && SSL_CTX_use_PrivateKey(ctx, k) == 1;
  EVP_PKEY_free(k);
  BIO_free(b);
  return ok;
}

int distd_tls_ctx_load(void *ssl_ctx, const distd_tls_files *f, int with_ca,
                       const char *what, dist_errbuf *eb) {
  SSL_CTX *ctx = ssl_ctx;
  ERR_clear_error();
  if (!each_cert(ctx, f->cert, use_own)) return load_fail(eb, what, "tls_cert", f->cert_path);
  /* OpenSSL 3 refuses a key that is not the certificate's here already. */
  if (!use_key(ctx, f->key))
    return load_fail(eb, what,
                     ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH
                         ? "tls_key does not match tls_cert:" : "tls_key", f->key_path);
  if (SSL_CTX_check_private_key(ctx) != 1)
    return load_fail(eb, what, "tls_key does not match tls_cert:", f->key_path);
  if (with_ca && (!f->ca || !each_cert(ctx, f->ca, use_ca)))
    return load_fail(eb, what, "tls_ca", f->ca_path);
  /* the store takes references of its own */
  if (with_ca && f->crls && dist_crl_add_to_store(f->crls, SSL_CTX_get_cert_store(ctx)) != 0)
    return load_fail(eb, what, "tls_crl", f->crl_path);
  return 0;
}

int distd_addr_is_loopback(const char *addr) {
  char host[256];
  int port = 0;
  if (dist_split_hostport(addr, host, sizeof host, &port, NULL) != 0) return 0;
  return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
         strcmp(host, "localhost") == 0;
}

void distd_tls_warn_plain(const char *what, const char *addr, int tls) {
  if (tls || distd_addr_is_loopback(addr)) return;
  log_warn("%s listens on %s without TLS: anyone who can reach it can read and "
           "change tensors; set tls_cert, tls_key and tls_ca (docs/security.md)",
           what, addr);
}
