/* Which daemons a client reaches, by their ranks. Calls address daemons
 * by rank (a mesh's ranks, a dist_call's target); the client holds one
 * channel per daemon it knows. A client of a cluster file holds rank r's
 * channel at position r. A client of one endpoint holds one channel,
 * to a daemon of any rank: it addresses that daemon by its own rank, as
 * its meshes name it, so that through rank 1's daemon alone a tensor on
 * mesh [1] can be put and read; a daemon that never said its rank is
 * addressed as rank 0, as before session 28. Its calls go to its one
 * channel whatever their target (call.c): reach is checked here, where a
 * mesh or a rank enters libdist. */
#include <stdarg.h>
#include <stdio.h>

#include "client_internal.h"

/* The rank a client of one endpoint addresses its daemon by: its own,
 * asked at the first need, or 0 when it did not say. Asked even right
 * after a call went unanswered (dist_daemon_rank_needed): a daemon back
 * within that second was taken as rank 0, and a mesh naming its own rank
 * refused. */
static int own_rank(dist_client *c) {
  int rank = dist_daemon_rank_needed(c, 0);
  return rank >= 0 ? rank : 0;
}

int dist_reached_rank(dist_client *c, int position) {
  return c->one_endpoint ? own_rank(c) : position;
}

int dist_rank_at(dist_client *c, int position) {
  if (!c->one_endpoint) return position;
  int known = dist_known_daemon_rank(c, position);
  return known >= 0 ? known : 0;
}

int dist_client_reaches(dist_client *c, int rank) {
  if (!c->one_endpoint) return rank >= 0 && rank < c->n;
  return rank >= 0 && rank == own_rank(c);
}

/* What a client of one endpoint reaches, for a message: "the daemon of
 * rank R at HOST:PORT", or "distd at HOST:PORT" when it did not say its
 * rank. Returns buf. */
static const char *reached(dist_client *c, char *buf, size_t len) {
  int rank = dist_known_daemon_rank(c, 0);
  if (rank >= 0)
    snprintf(buf, len, "the daemon of rank %d at %s", rank, c->endpoints[0]);
  else
    snprintf(buf, len, "distd at %s, which did not say its rank (taken as 0)",
             c->endpoints[0]);
  return buf;
}

/* The one refusal of a rank a client of one endpoint does not reach:
 * "WHAT names rank R, but this client only reaches the daemon of rank S
 * at HOST:PORT". DIST_EINVAL. */
static int refuse_beyond_endpoint(dist_client *c, const char *what, int rank) {
  char only[400];
  return dist_client_fail(c, DIST_EINVAL, "%s names rank %d, but this client only reaches %s",
                          what, rank, reached(c, only, sizeof only));
}

int dist_refuse_unreached(dist_client *c, const char *what, int rank, const char *cluster_fmt,
                          ...) {
  if (c->one_endpoint) return refuse_beyond_endpoint(c, what, rank);
  va_list ap;
  va_start(ap, cluster_fmt);
  dist_client_vfail(c, DIST_EINVAL, cluster_fmt, ap);
  va_end(ap);
  return DIST_EINVAL;
}

int dist_check_mesh_reach(dist_client *c, const dist_mesh_desc *m) {
  for (int i = 0; i < m->nranks; i++) {
    int rank = m->ranks[i];
    if (!dist_client_reaches(c, rank))
      return dist_refuse_unreached(c, "mesh", rank, "mesh names rank %d, but the cluster "
                                   "has %d daemon%s", rank, c->n, c->n == 1 ? "" : "s");
  }
  return 0;
}

int dist_client_check_reach(dist_client *c, const char *func, int rank) {
  if (dist_client_reaches(c, rank)) return 0;
  if (!c->one_endpoint) return dist_client_check_rank(c, func, rank);
  return refuse_beyond_endpoint(c, func, rank);
}
