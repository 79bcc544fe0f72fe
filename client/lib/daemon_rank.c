/* The rank of the daemon a client reaches at a position. A client of a
 * cluster file reaches rank r's daemon at position r; a client of one
 * endpoint reaches its daemon at position 0 whatever its rank, and learns
 * that rank from the daemon's Info reply when a message or an output
 * first names it. Not at connect: that call would cost a connection's set
 * up (1.7-3.1 ms, against 60-130 us for a dist_connect and dist_close
 * that never call), and a daemon frozen at connect would hold
 * dist_connect up, which never waits for its daemon. */
#include <stdio.h>
#include <time.h>

#include "client_internal.h"

/* Asking is on the side of a message or an output: a daemon that does
 * not answer within a second is named by its address instead, rather
 * than holding the caller up for a second deadline. */
#define RANK_ASK_MS 1000
/* Nor is a daemon asked within this long of a call to it that went
 * unanswered: the question would only wait out its own second after the
 * call's deadline (distctl --endpoint against a frozen daemon took a
 * second more per table naming its rank). Later it is asked again, as it
 * may have come back. */
#define UNANSWERED_FRESH_MS RANK_ASK_MS

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void dist_client_note_answer(dist_client *c, int target, int answered) {
  (void)target; /* a client of one endpoint has one daemon, at 0 */
  if (c->one_endpoint) atomic_store(&c->unanswered_ms, answered ? 0 : now_ms());
}

/* Whether a call to the daemon went unanswered just now. */
static int just_unanswered(dist_client *c) {
  int64_t at = atomic_load(&c->unanswered_ms);
  return at != 0 && now_ms() - at < UNANSWERED_FRESH_MS;
}

/* The Info reply of the daemon at target, asked aside (c->err kept), or
 * NULL. Free with protobuf_c_message_free_unpacked. */
static Dist__V1__InfoReply *ask_info(dist_client *c, int target) {
  Dist__V1__InfoRequest rq = DIST__V1__INFO_REQUEST__INIT;
  int64_t ms = c->timeout_ms < RANK_ASK_MS ? c->timeout_ms : RANK_ASK_MS;
  return (Dist__V1__InfoReply *)dist_call_aside(c, target, "/dist.v1.Dist/Info", &rq.base,
                                                &dist__v1__info_reply__descriptor, ms);
}

void dist_client_learn_rank(dist_client *c, int rank) {
  if (c->one_endpoint && rank >= 0) atomic_store(&c->daemon_rank, rank);
}

int dist_known_daemon_rank(dist_client *c, int rank) {
  if (rank < 0 || rank >= c->n) return -1;
  return c->one_endpoint ? atomic_load(&c->daemon_rank) : rank;
}

/* The rank, asked at need; not right after an unanswered call when only
 * for a label (label 1), as the question would wait for nothing. */
static int daemon_rank(dist_client *c, int rank, int label) {
  int known = dist_known_daemon_rank(c, rank);
  if (known >= 0 || rank < 0 || rank >= c->n || (label && just_unanswered(c))) return known;
  Dist__V1__InfoReply *rp = ask_info(c, rank);
  if (!rp) return -1; /* asked again at the next need */
  dist_client_learn_rank(c, (int)rp->rank);
  protobuf_c_message_free_unpacked(&rp->base, NULL);
  return atomic_load(&c->daemon_rank);
}

int dist_daemon_rank(dist_client *c, int rank) {
  if (!c) return dist_no_client(__func__), -1;
  return daemon_rank(c, rank, 1);
}

int dist_daemon_rank_needed(dist_client *c, int rank) { return daemon_rank(c, rank, 0); }

const char *dist_rank_label(dist_client *c, int target, char *buf, size_t len) {
  int rank = dist_daemon_rank(c, target);
  if (rank >= 0)
    snprintf(buf, len, "rank %d", rank);
  else
    snprintf(buf, len, "distd at %s", c->endpoints[target]);
  return buf;
}

/* Asked on a channel of its own, closed after: a question nobody answers
 * leaves its channel in gRPC's reconnect backoff (about a second), in
 * which a call fails at once even with the daemon up, so asking on the
 * trainer's channel would fail its first call when the daemon came up
 * just after dist_init_from_env. */
int dist_check_own_daemon(const dist_client *c, const dist_opts *o, int rank, int world,
                          char *why, size_t len) {
  dist_client *probe = NULL;
  if (dist_connect(c->endpoints[rank], o, &probe) != 0) return 0; /* its first call says */
  Dist__V1__InfoReply *rp = ask_info(probe, 0);
  dist_close(probe);
  if (!rp) return 0; /* not up yet: as before, its first call will say */
  int agree = (int)rp->rank == rank && (int)rp->world_size == world;
  if (!agree)
    snprintf(why, len, "DIST_RANK=%d / DIST_WORLD_SIZE=%d, but distd at %s, rank %d's "
             "address in the cluster file, says it is rank %u of %u: the trainers' cluster "
             "file does not list the daemons as theirs does", rank, world, c->endpoints[rank],
             rank, rp->rank, rp->world_size);
  protobuf_c_message_free_unpacked(&rp->base, NULL);
  return agree ? 0 : -1;
}
