/* A reload's CRLs against the open peer connections. OpenSSL checked
 * each connection's peer certificate at its handshake, against the CRLs
 * of that time; without this a daemon revoked later would keep its place
 * in the cluster until its connections broke. The check runs on the loop
 * thread, which alone closes connections (peer_internal.h), with mu held
 * like every other callback, so no transfer moves bytes meanwhile. */
#include <event2/event.h>
#include <stdio.h>

#include "crl.h"
#include "log.h"
#include "peer_internal.h"

enum { KEEP, REVOKED, REDO };

/* What to do with c: REVOKED when the CRLs refuse its peer's certificate
 * (why says so); REDO when its handshake began with a context from before
 * the reload, whose CRLs OpenSSL would still judge it by. */
static int verdict(conn *c, const dist_crl *crls, char *why, size_t len) {
  if (c->connecting || c->handshaking) {
    if (c->tls_gen == c->p->tls_gen) return KEEP;
    snprintf(why, len, "its TLS handshake began before tls_crl was reloaded");
    return REDO;
  }
  char refused[600];
  if (!c->tp->refused_by(c, crls, "tls_crl reloaded", refused, sizeof refused)) return KEEP;
  snprintf(why, len, "its certificate %s", refused);
  return REVOKED;
}

/* Counted for the rank the connection is greeted as, or else the one its
 * certificate names (read before the close frees c). */
static void count_revoked(conn *c) {
  distd_peers *p = c->p;
  int r = c->rank >= 0 ? c->rank : c->cert_rank;
  if (r >= 0 && r < p->world) p->peers[r].stats.revoked_closures++;
}

static void check_conn(conn *c, const dist_crl *crls) {
  char why[700];
  int v = verdict(c, crls, why, sizeof why);
  if (v == KEEP) return;
  if (v == REVOKED) count_revoked(c);
  /* distd_conn_close logs the greeted ones, naming their rank. */
  if (v == REVOKED && !c->greeted)
    log_warn("a peer connection not greeted yet (certificate for rank %d): closed: %s",
             c->cert_rank, why);
  distd_conn_close(c, why);
}

static void check_all(distd_peers *p, const dist_crl *crls) {
  for (int r = 0; r < p->world; r++) {
    peer *pe = &p->peers[r];
    if (pe->out) check_conn(pe->out, crls);
    if (pe->in) check_conn(pe->in, crls);
  }
  dlist *pos, *tmp;
  dlist_each_safe(pos, tmp, &p->pending_in) check_conn(dlist_entry(pos, conn, link), crls);
}

static void crl_check_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  distd_peers *p = arg;
  pthread_mutex_lock(&p->mu);
  dist_crl *crls = p->crl_check;
  p->crl_check = NULL;
  if (crls && !p->closing) check_all(p, crls);
  pthread_mutex_unlock(&p->mu);
  dist_crl_free(crls);
}

int distd_crl_check_open(distd_peers *p, dist_errbuf *eb) {
  p->crl_ev = event_new(p->base, -1, 0, crl_check_cb, p);
  return p->crl_ev ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory");
}

void distd_crl_check_close(distd_peers *p) {
  if (p->crl_ev) event_free(p->crl_ev);
  dist_crl_free(p->crl_check);
  p->crl_ev = NULL;
  p->crl_check = NULL;
}

void distd_crl_check_post(distd_peers *p, dist_crl *crls) {
  if (!p->crl_ev || !p->tp->refused_by) return;
  /* Two reloads before the loop gets to it: the later CRLs are the ones. */
  dist_crl_free(p->crl_check);
  p->crl_check = dist_crl_ref(crls);
  event_active(p->crl_ev, EV_TIMEOUT, 0);
}
