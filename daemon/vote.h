/* A request that several daemons received under one op id is applied by
 * all of them or by none: a parameter's push or configure (param.proto),
 * a reshard. Each daemon prepares it, making every check and allocation
 * applying needs; the daemons exchange their verdicts over the data plane;
 * each applies it only when every verdict is yes. A daemon that said no
 * keeps its own error; the others fail with the same code and a message
 * naming the rank that refused and its reason, so the client learns why
 * whichever reply it reads.
 *
 * Without a coordinator that outlives failures, one window stays open, as
 * in any two-phase commit: a daemon lost after every verdict was exchanged
 * may not have applied what the others did (its state is gone with it). */
#ifndef DISTD_VOTE_H
#define DISTD_VOTE_H

#include <stdint.h>

#include "server.h"
#include "store.h"

/* The daemons' versions of the tensor a request reads or replaces. With
 * the highest, every daemon can store the result under one version even
 * when some held the tensor and others did not (a reshard onto a mesh that
 * shares some ranks with the old one); with the lowest, a request can see
 * that its daemons did not start from one state (a restore reached some
 * of them first). */
typedef struct distd_vote_versions {
  uint64_t mine;    /* in: this daemon's version (0: it holds none) */
  uint64_t highest; /* out: the highest of every daemon's */
  uint64_t lowest;  /* out: the lowest of the daemons that hold one (0: none
                       does) */
  uint64_t digest;  /* in: a digest of the request as this daemon read it
                       (0: none); daemons that were sent the request by
                       several SPMD trainers vote no when two digests
                       differ */
} distd_vote_versions;

/* Run by every daemon of ranks[0..n) (the same list on each) for the
 * request of op id op_id; the verdicts travel under its vote step
 * (DISTD_STEP_VOTE, subop.h). verdict is 0 when this daemon prepared `what`
 * ("push", "reshard"), else its error code (its message in eb). Returns 0
 * when every daemon said yes; otherwise an error, described in eb.
 * versions may be NULL. */
int distd_vote(distd_server *s, const int *ranks, int n, uint64_t op_id, int64_t deadline_ms,
               const char *what, int verdict, distd_vote_versions *versions, dist_errbuf *eb);

/* distd_vote on storing `staged` (store.h): each daemon's staged version
 * goes with its verdict, and on yes staged->version becomes the highest,
 * so that every daemon stores the tensors at one version. digest as in
 * distd_vote_versions. One daemon alone (n <= 1) has nobody to ask: it
 * returns verdict. */
int distd_vote_staged(distd_server *s, const int *ranks, int n, uint64_t op_id,
                      int64_t deadline_ms, const char *what, int verdict, distd_staged *staged,
                      uint64_t digest, dist_errbuf *eb);

/* A shape exchange (dtensor_from_local, a LocalLayer output) carries each
 * rank's verdict and then its local shape in int64 words; a rank that
 * said no has no shape to send, and puts the start of its reason in those
 * nwords words instead, so that the others can say why and not only which
 * code. A daemon before 0.2.4 sends zeros there: an empty reason. */
void distd_reason_pack(int64_t *words, size_t nwords, const char *why);
/* "rank R <did>: <reason>" (or "(CODE)" without one) as eb's error, with
 * the code R sent; words are R's nwords reason words. */
int distd_reason_fail(dist_errbuf *eb, int code, int rank, const char *did,
                      const int64_t *words, size_t nwords);

/* The daemons a request names to vote on what it changes (its
 * `ranks`), when this daemon is one of them, each is a rank of the world
 * and none is named twice; else 0: no vote (a client before 0.2.1 sends
 * none). */
int distd_vote_ranks(const distd_server *s, const uint32_t *named, size_t n, int *ranks);

#endif
