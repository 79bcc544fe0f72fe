/* Verdicts on a request, exchanged between the daemons it was sent to:
 * see vote.h. */
#include "vote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "op_refuse.h"
#include "subop.h"

/* One daemon's verdict: 0 or its error code, with the error's message, and
 * the version of what the request reads or replaces there. The version came in
 * 0.2.1, at the end, so that 0.2.0 daemons (which read those bytes as the
 * end of the reason, always NUL) and newer ones still understand each
 * other's verdicts. A yes has no message: since 0.2.3 its first 8 bytes
 * carry the request's digest (distd_vote_versions), which older daemons
 * never read. */
typedef struct ballot {
  int64_t code;
  char reason[sizeof(((dist_errbuf *)0)->msg) - 2 * sizeof(int64_t)];
  uint64_t version;
} ballot;

/* The ballot whose reason to report: the first refusal that is not a
 * cancellation (a rank that aborted the request's exchanges refused it for
 * a reason; the ranks it aborted only echo it), else the first refusal;
 * -1 when every daemon said yes. */
static int cause_of(const ballot *all, int n) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (all[i].code == 0) continue;
    if (all[i].code != DIST_ECANCELED) return i;
    if (first < 0) first = i;
  }
  return first;
}

static uint64_t digest_of(const ballot *b) {
  uint64_t d;
  memcpy(&d, b->reason, sizeof d);
  return d;
}

/* The first daemon whose yes came with a digest other than the first
 * digest's (from daemon *first), or -1: SPMD trainers that described one
 * request differently. */
static int differing_digest(const ballot *all, int n, int *first) {
  *first = -1;
  for (int i = 0; i < n; i++) {
    if (!digest_of(&all[i])) continue;
    if (*first < 0) *first = i;
    else if (digest_of(&all[i]) != digest_of(&all[*first])) return i;
  }
  return -1;
}

static void count_versions(const ballot *all, int n, distd_vote_versions *v) {
  v->highest = v->lowest = 0;
  for (int i = 0; i < n; i++) {
    if (all[i].version > v->highest) v->highest = all[i].version;
    if (all[i].version && (!v->lowest || all[i].version < v->lowest)) v->lowest = all[i].version;
  }
}

int distd_vote(distd_server *s, const int *ranks, int n, uint64_t op_id, int64_t deadline_ms,
               const char *what, int verdict, distd_vote_versions *versions, dist_errbuf *eb) {
  ballot mine = {.code = verdict, .version = versions ? versions->mine : 0};
  ballot *all = calloc((size_t)n, sizeof *all);
  size_t *counts = calloc((size_t)n, sizeof *counts);
  if (!all || !counts) {
    free(all);
    free(counts);
    if (!verdict) dist_fail(eb, DIST_ENOMEM, "out of memory voting on a %s", what);
    /* the others wait for this ballot: tell them it will not come */
    distd_refuse_op(s, op_id, 0, ranks, n, "its daemon", dist_errbuf_msg(eb));
    return verdict ? verdict : DIST_ENOMEM;
  }
  if (verdict) snprintf(mine.reason, sizeof mine.reason, "%s", dist_errbuf_msg(eb));
  else if (versions) memcpy(mine.reason, &versions->digest, sizeof versions->digest);
  for (int i = 0; i < n; i++) counts[i] = sizeof(ballot);
  /* A refusal stands whatever the exchange does: its own message is kept. */
  dist_errbuf scratch = DIST_ERRBUF_INIT, *xeb = verdict ? &scratch : eb;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, distd_subop(op_id, DISTD_STEP_VOTE), ranks, n,
                           deadline_ms, xeb);
  c.kind = "vote";
  if (rc == 0) rc = distd_allgather(&c, &mine, all, counts, DIST_UINT8, xeb);
  int cause = rc == 0 ? cause_of(all, n) : -1;
  /* This daemon's own error stands, unless it only echoes another's. */
  int adopt = cause >= 0 && (!verdict || (verdict == DIST_ECANCELED &&
                                          all[cause].code != DIST_ECANCELED));
  if (rc != 0 && !verdict)
    dist_errbuf_prefix(eb, "%s not applied here: the daemons could not exchange "
                       "their verdicts: ", what);
  else if (adopt)
    rc = dist_fail(eb, (int)all[cause].code, "rank %d refused this %s, so no daemon "
                   "applied it: %.*s", ranks[cause], what, (int)sizeof all[cause].reason,
                   all[cause].reason);
  else
    rc = verdict;
  int first = -1, differs = rc == 0 ? differing_digest(all, n, &first) : -1;
  if (differs >= 0)
    rc = dist_fail(eb, DIST_EMISMATCH, "ranks %d and %d were sent different descriptions "
                   "of this %s (dtype, shape, mesh or placements), so no daemon applied it",
                   ranks[first], ranks[differs], what);
  if (rc == 0 && versions) count_versions(all, n, versions);
  free(all);
  free(counts);
  return rc;
}

int distd_vote_staged(distd_server *s, const int *ranks, int n, uint64_t op_id,
                      int64_t deadline_ms, const char *what, int verdict, distd_staged *staged,
                      uint64_t digest, dist_errbuf *eb) {
  if (n <= 1) return verdict;
  distd_vote_versions v = {.mine = staged->version, .digest = digest};
  int rc = distd_vote(s, ranks, n, op_id, deadline_ms, what, verdict, &v, eb);
  if (rc == 0) staged->version = v.highest;
  return rc;
}

void distd_reason_pack(int64_t *words, size_t nwords, const char *why) {
  char text[8 * 16] = {0}; /* words hold bytes; built here, then copied */
  size_t room = nwords * sizeof *words < sizeof text ? nwords * sizeof *words : sizeof text;
  if (room) snprintf(text, room, "%s", why ? why : "");
  memcpy(words, text, room);
}

int distd_reason_fail(dist_errbuf *eb, int code, int rank, const char *did,
                      const int64_t *words, size_t nwords) {
  char why[8 * 16 + 1] = {0};
  size_t bytes = nwords * sizeof *words < sizeof why - 1 ? nwords * sizeof *words
                                                         : sizeof why - 1;
  memcpy(why, words, bytes); /* a peer's bytes: ended here whatever they hold */
  if (!why[0]) return dist_fail(eb, code, "rank %d %s (%s)", rank, did, dist_err_name(code));
  return dist_fail(eb, code, "rank %d %s: %s", rank, did, why);
}

int distd_vote_ranks(const distd_server *s, const uint32_t *named, size_t n, int *ranks) {
  int me = 0;
  if (n > DIST_MAX_MESH_RANKS) return 0;
  for (size_t i = 0; i < n; i++) {
    if (named[i] >= (uint32_t)s->world_size) return 0;
    for (size_t j = 0; j < i; j++)
      if (named[j] == named[i]) return 0;
    ranks[i] = (int)named[i];
    me |= ranks[i] == s->rank;
  }
  return me ? (int)n : 0;
}
