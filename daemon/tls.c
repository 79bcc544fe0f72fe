/* TLS helpers shared by the gRPC port and the data plane: PEM files and
 * the warning about plain TCP on the network. No gRPC here: the peer
 * tests link this file. */
#include "tls.h"

#include <errno.h>
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
