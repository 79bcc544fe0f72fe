/* The daemons' certificates against tls_crl, in gRPC's verify_peer
 * callback (daemon_crl.h). */
#include "daemon_crl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"

typedef char refusal[400]; /* "" when the last handshake passed */

struct dist_daemon_crl {
  atomic_int refs;    /* the client's, and each channel's credentials' */
  pthread_mutex_t mu; /* handshakes run on gRPC's threads, several at once */
  dist_crl *crl;
  int n;
  refusal *refused; /* by rank */
};

/* What a channel's callback is given. */
typedef struct {
  dist_daemon_crl *d;
  int rank;
} channel_check;

dist_daemon_crl *dist_daemon_crl_new(dist_crl *crl, int n) {
  dist_daemon_crl *d = calloc(1, sizeof *d);
  refusal *refused = d ? calloc((size_t)n, sizeof *refused) : NULL;
  if (!refused) {
    free(d);
    dist_crl_free(crl);
    return NULL;
  }
  atomic_init(&d->refs, 1);
  pthread_mutex_init(&d->mu, NULL);
  d->crl = crl, d->n = n, d->refused = refused;
  return d;
}

void dist_daemon_crl_release(dist_daemon_crl *d) {
  if (!d || atomic_fetch_sub(&d->refs, 1) > 1) return;
  dist_crl_free(d->crl);
  pthread_mutex_destroy(&d->mu);
  free(d->refused);
  free(d);
}

/* Non-zero fails the handshake; gRPC then reports the channel as
 * unavailable without the reason, which is kept for the call's error. */
static int verify_daemon(const char *host, const char *pem, void *user) {
  (void)host; /* the channel says which daemon */
  channel_check *ch = user;
  dist_daemon_crl *d = ch->d;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  pthread_mutex_lock(&d->mu);
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
