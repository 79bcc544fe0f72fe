/* Bearer-token authentication of gRPC clients. The tokens file has one
 * "TOKEN ROLE" per line, ROLE being read-only or read-write; blank lines and
 * '#' comments are ignored. Tokens are compared in constant time. */
#ifndef DISTD_AUTH_H
#define DISTD_AUTH_H

#include <stddef.h>

#include "errbuf.h"

typedef enum {
  DISTD_ROLE_NONE = 0, /* unknown or missing token */
  DISTD_ROLE_READ_ONLY,
  DISTD_ROLE_READ_WRITE,
} distd_role;

typedef struct distd_auth distd_auth;

/* Parses text (the file's contents); origin names it in errors
 * ("tokens.txt:3: unknown role 'admin'"). An empty set of tokens is an
 * error: it would lock every client out. */
int distd_auth_parse(const char *text, const char *origin, distd_auth **out,
                     dist_errbuf *eb);
/* Reads and parses path. Refuses a file others can read (mode & 077). */
int distd_auth_load(const char *path, distd_auth **out, dist_errbuf *eb);
void distd_auth_free(distd_auth *a); /* NULL is a no-op */
int distd_auth_count(const distd_auth *a);

/* The role of token (len bytes), DISTD_ROLE_NONE when unknown. */
distd_role distd_auth_lookup(const distd_auth *a, const char *token, size_t len);
/* Takes the token out of an "authorization" header value ("Bearer TOKEN",
 * scheme case-insensitive). Returns its length and sets *token, or 0 when
 * the value is not a bearer token. */
size_t distd_auth_bearer(const char *value, size_t len, const char **token);

#endif
