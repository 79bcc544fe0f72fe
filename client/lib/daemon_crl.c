/* The daemons' certificates against tls_crl, in gRPC's verify_peer
 * callback (daemon_crl.h). */
#include "daemon_crl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errbuf.h"
#include "fileio.h"

typedef char refusal[400]; /* "" when the last handshake passed */

struct dist_daemon_crl {
  atomic_int refs;    /* the client's, and each channel's credentials' */
  pthread_mutex_t mu; /* handshakes run on gRPC's threads, several at once */
  char *path, *ca_pem;
  struct stat read_as; /* the file when crl was read from it */
  dist_crl *crl;
  int n;
  refusal *refused; /* by rank */
};

/* What a channel's callback is given. */
typedef struct {
  dist_daemon_crl *d;
  int rank;
} channel_check;

/* The CRLs in path, checked against ca_pem, and the file as read. */
static int read_crl(const char *path, const char *ca_pem, dist_crl **crl, struct stat *st,
                    dist_errbuf *eb) {
  char *pem = NULL;
  if (dist_read_pem("tls_crl", path, &pem, st, eb) != 0) return eb->code;
  int rc = dist_crl_parse(pem, ca_pem, path, crl, eb);
  free(pem);
  return rc;
}

int dist_daemon_crl_new(const char *path, const char *ca_pem, int n, dist_daemon_crl **out,
                        dist_errbuf *eb) {
  *out = NULL;
  dist_daemon_crl *d = calloc(1, sizeof *d);
  if (!d) return dist_fail(eb, DIST_ENOMEM, "tls_crl %s: out of memory", path);
  atomic_init(&d->refs, 1);
  pthread_mutex_init(&d->mu, NULL);
  d->n = n;
  if (!(d->refused = calloc((size_t)n, sizeof *d->refused)) || !(d->path = strdup(path)) ||
      !(d->ca_pem = strdup(ca_pem))) {
    dist_daemon_crl_release(d);
    return dist_fail(eb, DIST_ENOMEM, "tls_crl %s: out of memory", path);
  }
  if (read_crl(path, ca_pem, &d->crl, &d->read_as, eb) != 0) {
    dist_daemon_crl_release(d);
    return eb->code;
  }
  *out = d;
  return 0;
}

void dist_daemon_crl_release(dist_daemon_crl *d) {
  if (!d || atomic_fetch_sub(&d->refs, 1) > 1) return;
  pthread_mutex_destroy(&d->mu);
  dist_crl_free(d->crl);
  free(d->refused);
  free(d->path);
  free(d->ca_pem);
  free(d);
}

static int same_file(const struct stat *a, const struct stat *b) {
  return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* The CRL file again when it changed since it was read (a stat per
 * handshake, which are rare); one that does not parse now leaves the
 * CRLs in use. Called with d->mu held. */
static void refresh(dist_daemon_crl *d) {
  struct stat now;
  if (stat(d->path, &now) != 0 || same_file(&now, &d->read_as)) return;
  dist_crl *fresh = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (read_crl(d->path, d->ca_pem, &fresh, &now, &eb) != 0) return;
  dist_crl_free(d->crl);
  d->crl = fresh;
  d->read_as = now;
}

/* Non-zero fails the handshake; gRPC then reports the channel as
 * unavailable without the reason, which is kept for the call's error. */
static int verify_daemon(const char *host, const char *pem, void *user) {
  (void)host; /* the channel says which daemon */
  channel_check *ch = user;
  dist_daemon_crl *d = ch->d;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  pthread_mutex_lock(&d->mu);
  refresh(d);
  int rc = pem ? dist_crl_check_pem(d->crl, pem, strlen(pem), &eb)
               : dist_fail(&eb, DIST_EAUTH, "the daemon sent no certificate");
  snprintf(d->refused[ch->rank], sizeof d->refused[ch->rank], "%s",
           rc ? dist_errbuf_msg(&eb) : "");
  pthread_mutex_unlock(&d->mu);
  return rc != 0;
}

static void channel_check_free(void *user) {
  channel_check *ch = user;
  dist_daemon_crl_release(ch->d);
  free(ch);
}

int dist_daemon_crl_verify_options(dist_daemon_crl *d, int rank,
                                   grpc_ssl_verify_peer_options *o) {
  channel_check *ch = malloc(sizeof *ch);
  if (!ch) return -1;
  atomic_fetch_add(&d->refs, 1);
  *ch = (channel_check){d, rank};
  o->verify_peer_callback = verify_daemon;
  o->verify_peer_callback_userdata = ch;
  o->verify_peer_destruct = channel_check_free;
  return 0;
}

void dist_daemon_crl_verify_options_free(grpc_ssl_verify_peer_options *o) {
  if (o->verify_peer_callback_userdata) channel_check_free(o->verify_peer_callback_userdata);
  o->verify_peer_callback_userdata = NULL;
}

int dist_daemon_crl_refusal(dist_daemon_crl *d, int rank, char *buf, size_t len) {
  pthread_mutex_lock(&d->mu);
  int refused = rank >= 0 && rank < d->n && d->refused[rank][0];
  if (refused) snprintf(buf, len, "%s", d->refused[rank]);
  pthread_mutex_unlock(&d->mu);
  return refused;
}
