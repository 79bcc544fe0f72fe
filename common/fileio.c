#include "fileio.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int dist_read_file(const char *path, char **data, size_t *len,
                   dist_errbuf *eb) {
  int rc = 0;
  char *buf = NULL;
  *data = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return dist_fail(eb, errno == ENOENT ? DIST_ENOTFOUND : DIST_EIO, "%s: %s",
                     path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = dist_fail(eb, DIST_EIO, "%s: not a regular file", path);
    goto out;
  }
  size_t size = (size_t)st.st_size;
  buf = malloc(size + 1);
  if (!buf) {
    rc = dist_fail(eb, DIST_ENOMEM, "%s: cannot allocate %zu bytes", path, size);
    goto out;
  }
  if (fread(buf, 1, size, f) != size) {
    rc = dist_fail(eb, DIST_EIO, "%s: short read", path);
    goto out;
  }
  buf[size] = 0;
  *data = buf;
  *len = size;
  buf = NULL;
out:
  free(buf);
  fclose(f);
  return rc;
}

int dist_read_text_file(const char *path, char **text, dist_errbuf *eb) {
  size_t len = 0;
  int rc = dist_read_file(path, text, &len, eb);
  if (rc == 0 && memchr(*text, 0, len)) {
    free(*text);
    *text = NULL;
    rc = dist_fail(eb, DIST_EIO, "%s: not a text file", path);
  }
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
