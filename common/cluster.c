/* Cluster files: one daemon per line in rank order, "HOST:PORT
 * [PEER_HOST:PEER_PORT]", '#' comments and blank lines ignored. */
#include "cluster.h"
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dist_split_hostport(const char *addr, char *host, size_t hostlen,
                        int *port, dist_errbuf *eb) {
  const char *colon, *hs = addr, *he;
  if (addr[0] == '[') {
    /* "[v6]:port": the host is what the brackets enclose. */
    const char *close = strchr(addr, ']');
    if (!close || close[1] != ':')
      return dist_fail(eb, DIST_EINVAL, "address '%s': expected [IPV6]:PORT", addr);
    hs = addr + 1;
    he = close;
    colon = close + 1;
  } else {
    colon = strrchr(addr, ':');
    if (!colon) return dist_fail(eb, DIST_EINVAL, "address '%s': missing ':PORT'", addr);
    if (memchr(addr, ':', (size_t)(colon - addr)))
      return dist_fail(eb, DIST_EINVAL, "address '%s': an IPv6 host needs brackets ([::1]:PORT)", addr);
    he = colon;
  }
  size_t n = (size_t)(he - hs);
  if (n == 0) return dist_fail(eb, DIST_EINVAL, "address '%s': missing host", addr);
  if (n >= hostlen) return dist_fail(eb, DIST_EINVAL, "address '%s': host too long", addr);
  /* Brackets only enclose an IPv6 host: "[[]:1" would give host "[", and
   * the peer address derived from it ("[:2") could not be split again. */
  if (memchr(hs, '[', n) || memchr(hs, ']', n))
    return dist_fail(eb, DIST_EINVAL, "address '%s': stray bracket in the host", addr);
  const char *ps = colon + 1;
  long v = 0;
  if (!*ps) return dist_fail(eb, DIST_EINVAL, "address '%s': missing port", addr);
  for (const char *c = ps; *c; c++) {
    if (*c < '0' || *c > '9' || v > 65535)
      return dist_fail(eb, DIST_EINVAL, "address '%s': bad port '%s'", addr, ps);
    v = v * 10 + (*c - '0');
  }
  if (v > 65535) return dist_fail(eb, DIST_EINVAL, "address '%s': bad port '%s'", addr, ps);
  memcpy(host, hs, n);
  host[n] = 0;
  *port = (int)v;
  return 0;
}

/* Checks one address field and copies it to out. */
static int check_addr(const char *field, char *out, size_t outlen, int *port,
                      char *host, size_t hostlen, dist_errbuf *eb) {
  int rc = dist_split_hostport(field, host, hostlen, port, eb);
  if (rc) return rc;
  if (*port == 0) return dist_fail(eb, DIST_EINVAL, "address '%s': port 0 cannot be dialled", field);
  if (strlen(field) >= outlen) return dist_fail(eb, DIST_EINVAL, "address '%s' too long", field);
  memcpy(out, field, strlen(field) + 1);
  return 0;
}

/* Fills m from the fields of one line (1 or 2 of them). */
static int parse_member(char **fields, int nf, dist_member *m, dist_errbuf *eb) {
  char host[256];
  int port;
  int rc = check_addr(fields[0], m->grpc_addr, sizeof m->grpc_addr, &port, host, sizeof host, eb);
  if (rc) return rc;
  if (nf == 2) {
    int peer_port;
    return check_addr(fields[1], m->peer_addr, sizeof m->peer_addr, &peer_port, host,
                      sizeof host, eb);
  }
  if (port == 65535)
    return dist_fail(eb, DIST_EINVAL, "'%s': the peer port would be %d; give PEER_HOST:PORT",
                     fields[0], port + 1);
  const char *fmt = strchr(host, ':') ? "[%s]:%d" : "%s:%d";
  if (snprintf(m->peer_addr, sizeof m->peer_addr, fmt, host, port + 1) >= (int)sizeof m->peer_addr)
    return dist_fail(eb, DIST_EINVAL, "'%s': peer address too long", fields[0]);
  return 0;
}

/* Splits a line into at most 3 whitespace-separated fields (3 means too
 * many), after dropping a '#' comment. Modifies line. */
static int split_fields(char *line, char **fields) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  int n = 0;
  char *save = NULL;
  for (char *t = strtok_r(line, " \t\r", &save); t && n < 3; t = strtok_r(NULL, " \t\r", &save))
    fields[n++] = t;
  return n;
}

static int add_member(dist_member **members, int *count, int *cap,
                      const dist_member *m, dist_errbuf *eb) {
  if (*count == *cap) {
    int ncap = *cap ? *cap * 2 : 8;
    dist_member *grown = realloc(*members, sizeof **members * (size_t)ncap);
    if (!grown) return dist_fail(eb, DIST_ENOMEM, "cluster: out of memory");
    *members = grown;
    *cap = ncap;
  }
  (*members)[(*count)++] = *m;
  return 0;
}

int dist_cluster_parse(const char *text, const char *path,
                       dist_member **members, int *count, dist_errbuf *eb) {
  dist_member *list = NULL;
  int n = 0, cap = 0, rc = 0, lineno = 0;
  char *copy = strdup(text);
  if (!copy) return dist_fail(eb, DIST_ENOMEM, "cluster: out of memory");
  for (char *line = copy, *next; line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    lineno++;
    char *fields[3];
    dist_member m;
    int nf = split_fields(line, fields);
    if (nf == 0) continue;
    if (nf > 2) {
      rc = dist_fail(eb, DIST_ECONFIG, "%s:%d: expected HOST:PORT [PEER_HOST:PEER_PORT], got more fields",
                     path, lineno);
      goto out;
    }
    memset(&m, 0, sizeof m);
    rc = parse_member(fields, nf, &m, eb);
    if (rc) {
      dist_errbuf_prefix(eb, "%s:%d: ", path, lineno);
      rc = DIST_ECONFIG;
      if (eb) eb->code = rc;
      goto out;
    }
    if ((rc = add_member(&list, &n, &cap, &m, eb))) goto out;
  }
  if (n == 0) {
    rc = dist_fail(eb, DIST_ECONFIG, "%s: no members (the cluster is empty)", path);
    goto out;
  }
  *members = list;
  *count = n;
  list = NULL;
out:
  free(list);
  free(copy);
  return rc;
}

int dist_cluster_load(const char *path, dist_member **members, int *count,
                      dist_errbuf *eb) {
  char *text = NULL;
  dist_errbuf why = DIST_ERRBUF_INIT;
  int rc = dist_read_text_file(path, &text, &why);
  if (rc == DIST_EIO && strstr(why.msg, "not a text file"))
    rc = dist_fail(eb, DIST_ECONFIG, "%s: contains a NUL byte", path);
  else if (rc != 0)
    dist_fail(eb, rc, "%s", why.msg);
  if (rc == 0) rc = dist_cluster_parse(text, path, members, count, eb);
  free(text);
  return rc;
}
