/* A reload's trust store (tls_ca and tls_crl) against the open peer
 * connections. OpenSSL verified each connection's peer certificate chain at
 * its handshake, against the CAs and CRLs of that time; without this a
 * daemon revoked later, or signed by a CA dropped since, would keep its
 * place in the cluster until its connections broke. The check runs on the
 * loop thread, which alone closes connections (peer_internal.h), with mu
 * held like every other callback, so no transfer moves bytes meanwhile. */
#include <event2/event.h>
#include <stdio.h>

#include "log.h"
#include "peer_internal.h"

enum { KEEP, DISTRUSTED, REDO };

/* The files a verdict names: a revocation is tls_crl's; any other failure
 * may be either's (a CA dropped, a CRL of its issuer missing). */
static const char *reloaded_files(int trust) {
  return trust == DISTD_TRUST_REVOKED ? "tls_crl" : "tls_ca/tls_crl";
}

/* What to do with c: DISTRUSTED when the current context's store refuses
 * its peer's chain (*trust says how, why says so here and there says so to
 * the peer); REDO when its handshake began with a context from before the
 * reload, which OpenSSL would still judge it by. */
static int verdict(conn *c, int *trust, char *why, char *there, size_t len) {
  if (c->connecting || c->handshaking) {
    if (c->tls_gen == c->p->tls_gen) return KEEP;
    snprintf(why, len, "its TLS handshake began before tls_ca/tls_crl was reloaded");
    return REDO;
  }
  char what[500];
  *trust = c->tp->distrusted_by(c, c->p->tls_ctx, what, sizeof what);
  if (*trust == DISTD_TRUST_OK) return KEEP;
  const char *files = reloaded_files(*trust);
  snprintf(why, len, "its %s (%s reloaded)", what, files);
  snprintf(there, len, "our %s (its %s reloaded)", what, files);
  return DISTRUSTED;
}

/* Counted for the rank the connection is greeted as, or else the one its
 * certificate names (read before the close frees c). */
static void count_closure(conn *c, int trust) {
  distd_peers *p = c->p;
  int r = c->rank >= 0 ? c->rank : c->cert_rank;
  if (r < 0 || r >= p->world) return;
  distd_peer_stats *st = &p->peers[r].stats;
  if (trust == DISTD_TRUST_REVOKED) st->revoked_closures++;
  else st->untrusted_closures++;
}

static void check_conn(conn *c) {
  char why[700], there[700];
  int trust = DISTD_TRUST_OK;
  int v = verdict(c, &trust, why, there, sizeof why);
  if (v == KEEP) return;
  if (v == DISTRUSTED) {
    count_closure(c, trust);
    distd_conn_say_goodbye(c, there);
  }
  /* distd_conn_close logs the greeted ones, naming their rank. */
  if (v == DISTRUSTED && !c->greeted)
    log_warn("a peer connection not greeted yet (certificate for rank %d): closed: %s",
             c->cert_rank, why);
  distd_conn_close(c, why);
}

static void check_all(distd_peers *p) {
  for (int r = 0; r < p->world; r++) {
    peer *pe = &p->peers[r];
    if (pe->out) check_conn(pe->out);
    if (pe->in) check_conn(pe->in);
  }
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->pending_in) check_conn(dlist_entry(pos, conn, link));
}

static void trust_check_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  distd_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  if (!p->closing) check_all(p);
  pthread_mutex_unlock(&p->mu);
}

int distd_trust_check_open(distd_peers *p, dist_errbuf *eb) {
  p->trust_ev = event_new(p->base, -1, 0, trust_check_cb, p);
  return p->trust_ev ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory");
}

void distd_trust_check_close(distd_peers *p) {
  if (p->trust_ev) event_free(p->trust_ev);
  p->trust_ev = NULL;
}

void distd_trust_check_post(distd_peers *p) {
  /* Two reloads before the loop gets to it: one check, with the later
   * context, which is the one in p->tls_ctx by then. */
  if (p->trust_ev && p->tp->distrusted_by) event_active(p->trust_ev, EV_TIMEOUT, 0);
}
