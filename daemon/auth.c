/* Bearer tokens: the file parser and the lookup. */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define MAX_TOKEN 512
#define MAX_FILE (1 << 20)

typedef struct token_entry {
  char *token;
  size_t len;
  distd_role role;
} token_entry;

struct distd_auth {
  token_entry *tokens;
  int n, cap;
};

void distd_auth_free(distd_auth *a) {
  if (!a) return;
  for (int i = 0; i < a->n; i++) {
    /* Do not leave secrets in freed memory. */
    memset(a->tokens[i].token, 0, a->tokens[i].len);
    free(a->tokens[i].token);
  }
  free(a->tokens);
  free(a);
}

int distd_auth_count(const distd_auth *a) { return a ? a->n : 0; }

static int parse_role(const char *s, size_t len, distd_role *role) {
  if (len == 9 && strncmp(s, "read-only", len) == 0) *role = DISTD_ROLE_READ_ONLY;
  else if (len == 10 && strncmp(s, "read-write", len) == 0) *role = DISTD_ROLE_READ_WRITE;
  else return -1;
  return 0;
}

static int add_token(distd_auth *a, const char *tok, size_t len, distd_role role) {
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 8;
    token_entry *t = realloc(a->tokens, sizeof *t * (size_t)cap);
    if (!t) return -1;
    a->tokens = t;
    a->cap = cap;
  }
  char *copy = malloc(len + 1);
  if (!copy) return -1;
  memcpy(copy, tok, len);
  copy[len] = 0;
  a->tokens[a->n++] = (token_entry){copy, len, role};
  return 0;
}

/* Splits a line into whitespace-separated words; returns how many (at most
 * max, one more means "too many"). */
static int split_words(const char *line, size_t len, const char **w, size_t *wl,
                       int max) {
  int n = 0;
  size_t i = 0;
  while (i < len) {
    while (i < len && isspace((unsigned char)line[i])) i++;
    if (i >= len || line[i] == '#') break;
    size_t start = i;
    while (i < len && !isspace((unsigned char)line[i])) i++;
    if (n == max) return max + 1;
    w[n] = line + start;
    wl[n++] = i - start;
  }
  return n;
}

static int parse_line(distd_auth *a, const char *line, size_t len,
                      const char *origin, int lineno, dist_errbuf *eb) {
  const char *w[2];
  size_t wl[2];
  distd_role role;
  int n = split_words(line, len, w, wl, 2);
  if (n == 0) return 0;
  if (n != 2)
    return dist_fail(eb, DIST_ECONFIG, "%s:%d: expected \"TOKEN ROLE\", found %s",
                     origin, lineno, n == 1 ? "a token without a role" : "more than two words");
  if (wl[0] < 16 || wl[0] > MAX_TOKEN)
    return dist_fail(eb, DIST_ECONFIG, "%s:%d: token of %zu characters; use 16 to %d",
                     origin, lineno, wl[0], MAX_TOKEN);
  if (parse_role(w[1], wl[1], &role) < 0)
    return dist_fail(eb, DIST_ECONFIG, "%s:%d: unknown role '%.*s' (read-only or read-write)",
                     origin, lineno, (int)(wl[1] > 40 ? 40 : wl[1]), w[1]);
  for (int i = 0; i < a->n; i++)
    if (a->tokens[i].len == wl[0] && memcmp(a->tokens[i].token, w[0], wl[0]) == 0)
      return dist_fail(eb, DIST_ECONFIG, "%s:%d: token listed twice", origin, lineno);
  if (add_token(a, w[0], wl[0], role) < 0)
    return dist_fail(eb, DIST_ENOMEM, "%s: out of memory", origin);
  return 0;
}

int distd_auth_parse(const char *text, const char *origin, distd_auth **out,
                     dist_errbuf *eb) {
  *out = NULL;
  distd_auth *a = calloc(1, sizeof *a);
  if (!a) return dist_fail(eb, DIST_ENOMEM, "%s: out of memory", origin);
  int rc = 0, lineno = 0;
  for (const char *p = text; *p && rc == 0;) {
    size_t len = strcspn(p, "\n");
    rc = parse_line(a, p, len, origin, ++lineno, eb);
    p += len + (p[len] == '\n');
  }
  if (rc == 0 && a->n == 0)
    rc = dist_fail(eb, DIST_ECONFIG, "%s: no tokens (every client would be "
                   "refused); add \"TOKEN ROLE\" lines or unset auth_tokens_file",
                   origin);
  if (rc != 0) {
    distd_auth_free(a);
    return rc;
  }
  *out = a;
  return 0;
}

static int read_file(const char *path, char **text, dist_errbuf *eb) {
  int rc = 0;
  char *buf = NULL;
  struct stat st;
  FILE *f = fopen(path, "r");
  if (!f) return dist_fail(eb, DIST_ECONFIG, "auth_tokens_file %s: %s", path, strerror(errno));
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = dist_fail(eb, DIST_ECONFIG, "auth_tokens_file %s: not a regular file", path);
    goto out;
  }
  if (st.st_mode & 077) {
    rc = dist_fail(eb, DIST_ECONFIG, "auth_tokens_file %s: readable by others "
                   "(mode %03o); chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    goto out;
  }
  if (st.st_size > MAX_FILE) {
    rc = dist_fail(eb, DIST_ECONFIG, "auth_tokens_file %s: larger than %d bytes", path, MAX_FILE);
    goto out;
  }
  buf = calloc(1, (size_t)st.st_size + 1);
  if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
    rc = dist_fail(eb, DIST_ECONFIG, "auth_tokens_file %s: cannot read it", path);
    goto out;
  }
  *text = buf;
  buf = NULL;
out:
  free(buf);
  fclose(f);
  return rc;
}

int distd_auth_load(const char *path, distd_auth **out, dist_errbuf *eb) {
  char *text = NULL;
  *out = NULL;
  int rc = read_file(path, &text, eb);
  if (rc == 0) rc = distd_auth_parse(text, path, out, eb);
  if (text) memset(text, 0, strlen(text));
  free(text);
  return rc;
}

/* Compares without stopping at the first difference, so the time taken
 * does not tell an attacker how much of a guess was right. */
static int equal_ct(const char *a, size_t alen, const char *b, size_t blen) {
  unsigned char diff = (unsigned char)(alen != blen);
  size_t n = alen < blen ? alen : blen;
  for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
  return diff == 0;
}

distd_role distd_auth_lookup(const distd_auth *a, const char *token, size_t len) {
  distd_role found = DISTD_ROLE_NONE;
  if (!a || !token || len == 0) return found;
  for (int i = 0; i < a->n; i++)
    if (equal_ct(a->tokens[i].token, a->tokens[i].len, token, len))
      found = a->tokens[i].role;
  return found;
}

size_t distd_auth_bearer(const char *value, size_t len, const char **token) {
  static const char scheme[] = "bearer ";
  size_t sl = sizeof scheme - 1;
  if (len <= sl || strncasecmp(value, scheme, sl) != 0) return 0;
  size_t i = sl;
  while (i < len && value[i] == ' ') i++;
  size_t end = len;
  while (end > i && isspace((unsigned char)value[end - 1])) end--;
  if (end == i) return 0;
  *token = value + i;
  return end - i;
}
