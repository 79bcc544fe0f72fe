/* Reading the files TLS settings name (dist_read_pem): from a pipe as from
 * a regular file, and with a CRL's larger bound. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"

static const char pem_head[] = "-----BEGIN X509 CRL-----\n";

/* A PEM-looking text of n bytes (the head, then lines of 'A'). */
static char *pem_text(size_t n) {
  char *t = malloc(n + 1);
  cr_assert(t && n > sizeof pem_head);
  memcpy(t, pem_head, sizeof pem_head - 1);
  for (size_t i = sizeof pem_head - 1; i < n; i++) t[i] = i % 65 == 64 ? '\n' : 'A';
  t[n] = 0;
  return t;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "cannot write %s", path);
  cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

typedef struct fifo_writer {
  char path[128];
  const char *text;
} fifo_writer;

static void *write_fifo(void *arg) {
  fifo_writer *w = arg;
  int fd = open(w->path, O_WRONLY); /* blocks until the reader opens it */
  if (fd >= 0) {
    size_t left = strlen(w->text);
    for (const char *p = w->text; left > 0;) {
      ssize_t k = write(fd, p, left);
      if (k <= 0) break;
      p += k, left -= (size_t)k;
    }
    close(fd);
  }
  return NULL;
}

/* dist_read_pem(setting) of a pipe a thread writes text into. */
static int read_pem_from_pipe(const char *setting, const char *text, char **pem,
                              dist_errbuf *eb) {
  fifo_writer w = {.text = text};
  snprintf(w.path, sizeof w.path, "/tmp/test_fileio_fifo_%d", (int)getpid());
  unlink(w.path);
  cr_assert_eq(mkfifo(w.path, 0600), 0);
  pthread_t t;
  pthread_create(&t, NULL, write_fifo, &w);
  int rc = dist_read_pem(setting, w.path, pem, NULL, eb);
  pthread_join(t, NULL); /* a write past a reader that stopped fails: EPIPE */
  unlink(w.path);
  return rc;
}

/* A secret handed over through a pipe (process substitution, /dev/fd/N)
 * is read to its end; the reader refused it as "not a regular file". */
Test(fileio, a_pem_file_is_read_from_a_pipe) {
  char *text = pem_text(100000); /* more than a pipe holds at once */
  char *pem = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = read_pem_from_pipe("tls_ca", text, &pem, &eb);
  cr_assert_eq(rc, 0, "%s", eb.msg);
  cr_expect_str_eq(pem, text);
  free(pem);
  free(text);
}

/* A CRL may run to megabytes; a certificate that big is a mistake. */
Test(fileio, a_crl_over_one_mib_is_read_where_a_certificate_is_refused) {
  char path[128];
  snprintf(path, sizeof path, "/tmp/test_fileio_big_%d.pem", (int)getpid());
  char *text = pem_text(3u << 20);
  write_file(path, text);
  char *pem = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(dist_read_pem("tls_crl", path, &pem, NULL, &eb), 0, "%s", eb.msg);
  cr_expect(pem && strlen(pem) == strlen(text));
  free(pem);
  pem = NULL;
  dist_errbuf eb2 = DIST_ERRBUF_INIT;
  cr_expect_eq(dist_read_pem("tls_cert", path, &pem, NULL, &eb2), DIST_ECONFIG);
  cr_expect(strstr(eb2.msg, "tls_cert") && strstr(eb2.msg, "larger than 1.0 MiB"), "%s",
            eb2.msg);
  cr_expect_null(pem);
  unlink(path);
  free(text);
}

/* A pipe longer than the bound is refused, naming the bound. */
Test(fileio, a_pipe_longer_than_the_bound_is_refused) {
  signal(SIGPIPE, SIG_IGN); /* the reader stops at the bound and closes */
  char *text = pem_text((1u << 20) + 1);
  char *pem = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = read_pem_from_pipe("tls_key", text, &pem, &eb);
  cr_expect_eq(rc, DIST_ECONFIG, "%s", eb.msg);
  cr_expect(strstr(eb.msg, "larger than 1.0 MiB"), "%s", eb.msg);
  free(text);
}
