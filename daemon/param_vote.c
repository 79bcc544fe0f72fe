/* Verdicts on a push, exchanged between the daemons of its mesh: see
 * param_vote.h. */
#include "param_vote.h"

#include <stdio.h>
#include <stdlib.h>

#include "coll.h"
#include "subop.h"
#include "wire.h"

/* One daemon's verdict: 0 or its error code, with the error's message. */
typedef struct ballot {
  int64_t code;
  char reason[sizeof(((dist_errbuf *)0)->msg) - sizeof(int64_t)];
} ballot;

int distd_param_vote(distd_server *s, const dist_mesh_desc *mesh, uint64_t op_id,
                     int64_t deadline_ms, const char *what, int verdict, dist_errbuf *eb) {
  int n = mesh->nranks;
  ballot mine = {.code = verdict};
  ballot *all = calloc((size_t)n, sizeof *all);
  size_t counts[DIST_MAX_MESH_RANKS];
  if (!all) return verdict ? verdict : dist_fail(eb, DIST_ENOMEM, "out of memory voting on a %s", what);
  if (verdict) snprintf(mine.reason, sizeof mine.reason, "%s", dist_errbuf_msg(eb));
  for (int i = 0; i < n; i++) counts[i] = sizeof(ballot);
  /* A refusal stands whatever the exchange does: its own message is kept. */
  dist_errbuf scratch = DIST_ERRBUF_INIT, *xeb = verdict ? &scratch : eb;
  distd_coll c;
  int rc = distd_coll_init(&c, s->peers, distd_subop(op_id, DISTD_STEP_PARAM_VOTE), mesh->ranks, n,
                           deadline_ms, xeb);
  if (rc == 0) rc = distd_allgather(&c, &mine, all, counts, DIST_UINT8, xeb);
  if (verdict) {
    rc = verdict;
  } else if (rc != 0) {
    dist_errbuf_prefix(eb, "%s not applied here: the daemons could not exchange "
                       "their verdicts: ", what);
  } else {
    for (int i = 0; i < n && rc == 0; i++)
      if (all[i].code != 0) {
        all[i].reason[sizeof all[i].reason - 1] = '\0';
        rc = dist_fail(eb, (int)all[i].code, "rank %d refused this %s, so no "
                       "daemon applied it: %s", mesh->ranks[i], what, all[i].reason);
      }
  }
  free(all);
  return rc;
}

int distd_param_vote_mesh(distd_server *s, const Dist__V1__Mesh *pb, const char *name,
                          dist_mesh_desc *mesh, dist_errbuf *eb) {
  if (!pb) return 0;
  if (dist_mesh_from_pb(pb, mesh, eb) != 0) return -1;
  if (dist_mesh_index_of(mesh, s->rank) >= 0) return 1;
  dist_fail(eb, DIST_EINVAL, "a request for '%s' names a mesh without rank %d", name, s->rank);
  return -1;
}
