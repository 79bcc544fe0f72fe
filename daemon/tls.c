/* TLS helpers shared by the gRPC port and the data plane: PEM files,
 * loading and checking a certificate and its key, and the warning about
 * plain TCP on the network. No gRPC here: the peer tests link this file. */
#include "tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "log.h"

#define MAX_PEM (1 << 20)

int distd_tls_read_pem(const char *path, const char *what, char **out,
                       dist_errbuf *eb) {
  *out = NULL;
  FILE *f = fopen(path, "r");
  if (!f) return dist_fail(eb, DIST_ECONFIG, "%s %s: %s", what, path, strerror(errno));
  int rc = 0;
  char *buf = malloc(MAX_PEM + 1);
  size_t n = buf ? fread(buf, 1, MAX_PEM + 1, f) : 0;
  if (!buf) {
    rc = dist_fail(eb, DIST_ENOMEM, "%s %s: out of memory", what, path);
  } else if (n == 0 || n > MAX_PEM || ferror(f)) {
    rc = dist_fail(eb, DIST_ECONFIG, "%s %s: %s", what, path,
                   n == 0 ? "empty or unreadable" : "larger than 1 MiB");
  } else if (!strstr(buf, "-----BEGIN ")) {
    rc = dist_fail(eb, DIST_ECONFIG, "%s %s: not a PEM file", what, path);
  }
  fclose(f);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  buf[n] = 0;
  *out = buf;
  return 0;
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

int distd_tls_ctx_load(void *ssl_ctx, const char *cert, const char *key,
                       const char *ca, const char *what, dist_errbuf *eb) {
  SSL_CTX *ctx = ssl_ctx;
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
    return load_fail(eb, what, "tls_cert", cert);
  /* OpenSSL 3 refuses a key that is not the certificate's here already. */
  if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
    return load_fail(eb, what,
                     ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH
                         ? "tls_key does not match tls_cert:" : "tls_key", key);
  if (SSL_CTX_check_private_key(ctx) != 1)
    return load_fail(eb, what, "tls_key does not match tls_cert:", key);
  if (ca && SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
    return load_fail(eb, what, "tls_ca", ca);
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
