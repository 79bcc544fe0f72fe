/* Small file and string helpers every part uses: reading a whole file, and
 * appending formatted text to a fixed buffer. */
#ifndef DIST_FILEIO_H
#define DIST_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "errbuf.h"

/* Reads the whole regular file. *data is malloc'd with a NUL after the last
 * byte (so text can be parsed in place); *len excludes it. Errors:
 * DIST_ENOTFOUND, DIST_EIO, DIST_ENOMEM, with "PATH: reason" in eb. */
int dist_read_file(const char *path, char **data, size_t *len,
                   dist_errbuf *eb);

/* dist_read_file for text: a NUL byte in the file is an error (DIST_EIO,
 * "PATH: not a text file"). */
int dist_read_text_file(const char *path, char **text, dist_errbuf *eb);

/* Certificates, keys, CAs and CRLs are small: a bigger file named as one
 * is a mistake (a directory of them, a log), not something to load. */
#define DIST_PEM_MAX ((size_t)1 << 20)
/* except CRLs, which list every certificate their CA revoked */
#define DIST_CRL_MAX ((size_t)64 << 20)

/* Reads the PEM file a TLS setting names (tls_cert, tls_key, tls_ca,
 * tls_crl): text of at most DIST_PEM_MAX bytes (a CRL DIST_CRL_MAX) with a
 * "-----BEGIN " line, from a regular file, a pipe or a device (/dev/fd/N),
 * NUL-terminated in *pem (malloc'd). Errors are DIST_ECONFIG (DIST_ENOMEM
 * when memory runs out) and name both: "tls_ca /etc/ca.crt: No such file
 * or directory". st, when not NULL, gets the file as it was read, for
 * telling later whether it has changed. */
int dist_read_pem(const char *setting, const char *path, char **pem, struct stat *st,
                  dist_errbuf *eb);

/* snprintf at buf + pos that keeps pos meaningful once the buffer is full:
 * returns the position after the text (which may exceed len). */
size_t dist_appendf(char *buf, size_t len, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes n bytes for people: "512 B", "1.5 MiB" (powers of 1024). */
void dist_format_bytes(uint64_t n, char *buf, size_t len);

#endif
