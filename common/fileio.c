#include "fileio.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int too_big(const char *path, size_t max, dist_errbuf *eb) {
  char limit[32];
  dist_format_bytes(max, limit, sizeof limit);
  return dist_fail(eb, DIST_ETOOBIG, "%s: larger than %s", path, limit);
}

/* What a reader ends with: on success buf (n bytes, and room for one
 * more) becomes the caller's, NUL-terminated; else it is freed. */
static int hand_over(int rc, char *buf, size_t n, char **data, size_t *len) {
  if (rc != 0) {
    free(buf);
    return rc;
  }
  buf[n] = 0;
  *data = buf;
  *len = n;
  return 0;
}

/* A pipe or a character device (a secret handed over as /dev/fd/N or
 * through process substitution) has no size to go by: read until its end,
 * at most max bytes. */
static int read_stream(FILE *f, const char *path, size_t max, char **data, size_t *len,
                       dist_errbuf *eb) {
  size_t cap = 0, n = 0;
  char *buf = NULL;
  for (;;) {
    if (n == cap) { /* full: grow, up to one byte past max (which is too big) */
      size_t want = cap ? 2 * cap : 4096;
      if (want > max + 1) want = max + 1;
      if (want == cap) break;
      char *grown = realloc(buf, want + 1);
      if (!grown) {
        free(buf);
        return dist_fail(eb, DIST_ENOMEM, "%s: cannot allocate %zu bytes", path, want);
      }
      buf = grown, cap = want;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break; /* its end, or an error */
    n += got;
  }
  int rc = ferror(f) ? dist_fail(eb, DIST_EIO, "%s: read error", path)
           : n > max ? too_big(path, max, eb)
                     : 0;
  return hand_over(rc, buf, n, data, len);
}

/* A regular file of st->st_size bytes, at most max. */
static int read_regular(FILE *f, const char *path, size_t max, const struct stat *st,
                        char **data, size_t *len, dist_errbuf *eb) {
  size_t size = (size_t)st->st_size;
  char *buf = NULL;
  int rc = 0;
  if (size > max)
    rc = too_big(path, max, eb);
  else if (!(buf = malloc(size + 1)))
    rc = dist_fail(eb, DIST_ENOMEM, "%s: cannot allocate %zu bytes", path, size);
  else if (fread(buf, 1, size, f) != size)
    rc = dist_fail(eb, DIST_EIO, "%s: short read", path);
  return hand_over(rc, buf, size, data, len);
}

/* The whole file at path, at most max bytes, with a NUL after them; *st
 * is the file as it was read (fstat of the open file, so a caller
 * comparing it later sees the file these bytes came from). Only a regular
 * file, unless streams_too (then a pipe or device is read to its end). */
static int read_bounded(const char *path, size_t max, int streams_too, char **data,
                        size_t *len, struct stat *st, dist_errbuf *eb) {
  *data = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return dist_fail(eb, errno == ENOENT ? DIST_ENOTFOUND : DIST_EIO, "%s: %s", path,
                     strerror(errno));
  int rc, stat_ok = fstat(fileno(f), st) == 0;
  if (stat_ok && streams_too && (S_ISFIFO(st->st_mode) || S_ISCHR(st->st_mode)))
    rc = read_stream(f, path, max, data, len, eb);
  else if (stat_ok && S_ISREG(st->st_mode))
    rc = read_regular(f, path, max, st, data, len, eb);
  else
    rc = dist_fail(eb, DIST_EIO, "%s: not a regular file", path);
  fclose(f);
  return rc;
}

int dist_read_file(const char *path, char **data, size_t *len,
                   dist_errbuf *eb) {
  struct stat st;
  return read_bounded(path, SIZE_MAX - 1, 0, data, len, &st, eb);
}

/* A NUL in text would end it early where it is parsed in place. */
static int check_text(const char *path, char **text, size_t len, dist_errbuf *eb) {
  if (!memchr(*text, 0, len)) return 0;
  free(*text);
  *text = NULL;
  return dist_fail(eb, DIST_EIO, "%s: not a text file", path);
}

int dist_read_text_file(const char *path, char **text, dist_errbuf *eb) {
  size_t len = 0;
  int rc = dist_read_file(path, text, &len, eb);
  return rc == 0 ? check_text(path, text, len, eb) : rc;
}

int dist_read_pem(const char *setting, const char *path, char **pem, struct stat *st,
                  dist_errbuf *eb) {
  struct stat own;
  size_t len = 0;
  /* A CRL lists every certificate its CA revoked: a big CA's runs to
   * megabytes, where a certificate or key over 1 MiB is a mistake. */
  size_t max = strcmp(setting, "tls_crl") == 0 ? DIST_CRL_MAX : DIST_PEM_MAX;
  int rc = read_bounded(path, max, 1, pem, &len, st ? st : &own, eb);
  if (rc == 0) rc = check_text(path, pem, len, eb);
  if (rc == 0 && !strstr(*pem, "-----BEGIN ")) {
    free(*pem);
    *pem = NULL;
    rc = dist_fail(eb, DIST_ECONFIG, "%s: not a PEM file (no \"-----BEGIN\" line)", path);
  }
  if (rc == 0) return 0;
  /* A bad file a setting names is a configuration error, whatever the
   * reason (missing, too large, binary). */
  if (rc != DIST_ENOMEM) rc = DIST_ECONFIG;
  if (eb) eb->code = rc;
  dist_errbuf_prefix(eb, "%s ", setting);
  return rc;
}

size_t dist_appendf(char *buf, size_t len, size_t pos, const char *fmt, ...) {
  if (pos >= len) return pos;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + pos, len - pos, fmt, ap);
  va_end(ap);
  return n < 0 ? pos : pos + (size_t)n;
}

void dist_format_bytes(uint64_t n, char *buf, size_t len) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}
