/* The peer data plane: persistent TCP connections between daemons, driven by
 * a libevent loop, carrying framed payloads that are read straight into
 * their destination buffers.
 *
 * Every ordered pair (i, j) has its own connection: i dials j and sends on
 * it; j reads from it. The dialer greets with HELLO (magic, version, cluster
 * id, rank); the acceptor checks it and answers HELLO_ACK or HELLO_REJECT
 * with the reason. A lost outbound connection is redialled with exponential
 * backoff. A peer is "connected" when both directions are greeted.
 *
 * Transfers are grouped by operation. A worker thread creates a distd_xfer
 * for an op id, posts sends and receives, then waits. Receives are matched by
 * (op_id, src_rank, tag). Data that arrives before its receive is posted is
 * kept aside (bounded; past the bound the connection stops being read, which
 * pushes back on the sender) and copied when the receive is posted. */
#ifndef DISTD_PEER_H
#define DISTD_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "cluster.h"
#include "errbuf.h"
#include "frame.h"

struct event_base;
typedef struct distd_peers distd_peers;
typedef struct distd_xfer distd_xfer;

struct distd_tls_files; /* tls.h */

typedef struct distd_peers_opts {
  int rank;
  int world_size;
  const dist_member *members; /* world_size entries; peer_addr is used */
  const char *cluster_id;
  int64_t backoff_min_ms;
  int64_t backoff_max_ms;
  size_t unexpected_limit; /* bytes kept for not-yet-posted receives */
  /* A whole frame kept aside this long without its receive is dropped
   * (counted in distd_peer_stats, logged): its receive will most likely
   * never come (the receiving trainer died before calling), and kept, it
   * would count against unexpected_limit until the daemon stops. 0 keeps
   * frames for good. */
  int64_t unexpected_max_age_ms;
  /* Mutual TLS (docs/security.md) with these files; NULL (or no cert in
   * them) means plain TCP. Each daemon's certificate names its rank as
   * DNS:distd-rank-N. */
  const struct distd_tls_files *tls;
  size_t max_frame_size; /* longest DATA frame accepted; 0 = 1 GiB */
  /* A wait fails once no byte has moved to or from the ranks it needs for
   * this long (0: only its deadline bounds it). Bounding silence rather
   * than the whole wait lets a large transfer take as long as it takes
   * while a dead or stuck peer is still named quickly. */
  int64_t silence_timeout_ms;
  /* How long a waiting thread polls with sched_yield() before it sleeps in
   * poll(): a sleeping receiver costs a wake-up (tens of microseconds on a
   * busy machine) per small transfer. 0 sleeps at once. */
  int64_t spin_us;
  /* TCP congestion control of the peer sockets (TCP_CONGESTION); NULL or
   * "" keeps the system default. distd_peers_start refuses one the kernel
   * does not let this process use. */
  const char *congestion;
  /* SO_SNDBUF and SO_RCVBUF of the peer sockets; 0 keeps the kernel's
   * autotuning. */
  size_t socket_buffer;
  /* 1: a waiting thread makes its reads and writes one system call each,
   * never through io_uring (peer_batch.h). */
  int no_io_uring;
} distd_peers_opts;

typedef struct distd_peer_stats {
  int connected;       /* both directions up and greeted */
  int out_up, in_up;
  uint64_t bytes_sent, bytes_received;
  /* frames written to the peer from its send queue, by kind (DATA, ABORT,
   * PING, ABORT_RANGE: the handshake's, PONG and CLOSE are not queued) */
  uint64_t frames_sent[DIST_FRAME_KIND_LAST + 1];
  double rtt_seconds;  /* last PING round trip; 0 when unknown */
  uint32_t reconnects;
  /* frames from the peer dropped after unexpected_max_age_ms kept aside */
  uint64_t unexpected_expired, unexpected_expired_bytes;
  /* its connections closed because a reloaded tls_crl revoked its
   * certificate, or because a reloaded tls_ca/tls_crl no longer verifies
   * its chain for another reason (its CA dropped, say) */
  uint64_t revoked_closures, untrusted_closures;
  /* ABORT and ABORT_RANGE frames to the peer dropped: no memory for a new
   * one and every spare control frame queued (peer_ctl.c) */
  uint64_t ctl_dropped;
  char congestion[16]; /* of the outbound connection, read from its socket */
  int send_buffer;     /* SO_SNDBUF of the outbound socket, SO_RCVBUF of the */
  int receive_buffer;  /* inbound one, as the kernel reports them; 0 if down */
  char last_error[160];
} distd_peer_stats;

/* Binds the listener at members[rank].peer_addr (fails with a clear message
 * when the port is taken) and starts dialling every other rank. All I/O runs
 * on base, which the caller runs in its own thread; base must have been
 * created after evthread_use_pthreads(). */
int distd_peers_start(distd_peers **out, struct event_base *base,
                      const distd_peers_opts *opts, dist_errbuf *eb);
/* Closes every connection and fails every pending transfer with
 * DIST_ECANCELED. Call from any thread after the loop has stopped, or from
 * the loop thread. NULL is a no-op. */
void distd_peers_free(distd_peers *p);
/* Fails every pending transfer with DIST_ECANCELED ("daemon shutting
 * down") and makes later waits fail at once; used at shutdown so workers
 * blocked in collectives return before distd_peers_free. Any thread. */
void distd_peers_cancel_all(distd_peers *p);
void distd_peers_get_stats(distd_peers *p, int rank, distd_peer_stats *out);
int distd_peers_rank(const distd_peers *p);
int distd_peers_world_size(const distd_peers *p);
/* The port the listener is bound to: members[rank].peer_addr may name port
 * 0, and the kernel's choice is read back here. */
int distd_peers_listen_port(const distd_peers *p);
/* How a waiting worker moves bytes (InfoReply.peer_io): "io_uring",
 * "system calls (why)" or "tls (the loop thread)". */
const char *distd_peers_io(const distd_peers *p);
/* A new TLS context for the data plane, in two steps so that a reload of
 * several things changes nothing when one of them fails: tls_load loads
 * f's certificate, key, CA and CRLs into *ctx (NULL when the data plane is
 * plain TCP); tls_use swaps it in for the connections made from then on
 * (open ones keep their own certificates) and frees the old one; tls_drop
 * frees one not used. tls_use also has the loop thread close, soon after,
 * the open connections whose peer certificate chain the new tls_ca and
 * tls_crl no longer verify, telling the peer why: transfers that need such
 * a peer fail naming it and why. */
int distd_peers_tls_load(const distd_peers *p, const struct distd_tls_files *f,
                         void **ctx, dist_errbuf *eb);
void distd_peers_tls_use(distd_peers *p, void *ctx);
void distd_peers_tls_drop(void *ctx);
/* Number of peers (not counting self) with both directions greeted. */
int distd_peers_connected_count(distd_peers *p);
/* Transfers whose sends took more or fewer send items than were reserved
 * for them (distd_xfer_reserve_sends) since start: a bug in a caller's
 * count, as a send past its reservation allocates and can fail midway. */
uint64_t distd_peers_reserve_mismatches(distd_peers *p);

/* A set of transfers belonging to one operation. Thread-safe with respect to
 * the loop; one xfer is used by one thread. */
distd_xfer *distd_xfer_new(distd_peers *p, uint64_t op_id);
/* Names a signature for error messages ("all_reduce(float32, sum)"). */
typedef void (*distd_signature_namer)(uint64_t signature, char *out, size_t n);
/* Signs x's frames with what its members must agree on beyond byte counts
 * (an SPMD collective's kind, dtype, reduce op): sends carry signature in
 * the DATA header's aux, and a frame for one of x's receives whose
 * signature differs fails x with DIST_EMISMATCH naming both ranks and,
 * through name, both signatures. 0 (the default, and what daemons before
 * 0.2.5 send) is never compared: those frames are only checked for length.
 * Call before the first send or receive. */
void distd_xfer_sign(distd_xfer *x, uint64_t signature, distd_signature_namer name);
/* Allocates the items of x's next n sends now, so that posting them
 * cannot fail for want of memory midway: an exchange whose outcome each
 * receiver decides alone (a vote, vote.h) must reach every peer or none,
 * and a send that fails after another left lets the peer that got it go
 * on without this rank. Call once, before the first send, with the
 * number of sends to other ranks (and to this one before its receive)
 * that x will post: a wait counts any difference as a bug. 0, or -1 with
 * nothing reserved. */
int distd_xfer_reserve_sends(distd_xfer *x, int n);
/* Queues len bytes of buf to dst under tag. buf stays owned by the caller
 * and must stay valid until distd_xfer_wait returns. dst may be this rank
 * (a local copy into the matching receive of the same xfer). */
void distd_xfer_send(distd_xfer *x, int dst, uint32_t tag, const void *buf,
                     size_t len);
/* Like distd_xfer_send, but the frame is not written yet: it leaves with
 * the next distd_xfer_send to the same peer (one writev for both) or when a
 * thread waits on or frees an xfer, whichever comes first. */
void distd_xfer_send_deferred(distd_xfer *x, int dst, uint32_t tag,
                              const void *buf, size_t len);
/* Posts a receive of exactly len bytes from src under tag into buf. A frame
 * of another length fails the xfer with DIST_EPROTO naming both ranks. */
void distd_xfer_recv(distd_xfer *x, int src, uint32_t tag, void *buf,
                     size_t len);
/* Posts a receive of whatever length src sends; after a successful wait
 * *buf is a malloc'd copy (caller frees) and *len its length. likely_len
 * is the length the caller expects (0: no idea): a guess that lets the
 * driver read the frame after it ahead (distd_xfer_then); any length is
 * still taken. */
void distd_xfer_recv_any(distd_xfer *x, int src, uint32_t tag, void **buf,
                         size_t *len, size_t likely_len);
/* Waits until every posted transfer completed, the deadline (CLOCK_MONOTONIC
 * milliseconds, see distd_now_ms) passed, no byte moved for it for
 * silence_timeout_ms, a needed peer was lost, or a peer aborted the op. On
 * failure the message names the peer(s) involved and the remaining
 * transfers are cancelled. Returns 0 or a dist_err. */
int distd_xfer_wait(distd_xfer *x, int64_t deadline_ms, dist_errbuf *eb);
/* Says that the thread waiting on x waits on next right after, and that
 * on every stream next's frames follow x's. When x's wait ends while it
 * drives the sockets, frames still queued (next's rows) stay for next's
 * wait to write, instead of going to the loop thread, which would write
 * them from another CPU and contend for the lock with next's reads; and
 * while it waits for a short frame of x, the driver may read the frame
 * after it straight into next's receive. next must outlive x's wait. */
void distd_xfer_then(distd_xfer *x, distd_xfer *next);
/* Tells every rank in ranks[] (except self) that this op failed, so their
 * waits fail at once with reason instead of timing out. Does nothing when
 * x failed because a peer aborted the op: that peer told its group. */
void distd_xfer_abort(distd_xfer *x, const int *ranks, int n,
                      const char *reason);
/* Tells every rank in ranks[] (except self) that op op_id failed here
 * before this rank took part in it, so none waits for it. */
void distd_abort_op(distd_peers *p, uint64_t op_id, const int *ranks, int n,
                    const char *reason);
/* This rank cannot take its part in op_id for want of memory for `what`:
 * eb says so (DIST_ENOMEM), and every rank in ranks[] (except self) is
 * told (distd_abort_op), instead of waiting for the part until its
 * deadline. Returns DIST_ENOMEM. */
int distd_abort_no_memory(distd_peers *p, uint64_t op_id, const int *ranks, int n,
                          const char *what, dist_errbuf *eb);
/* Tells every rank in ranks[] (except self) that ops first .. first +
 * count - 1, each with its refusal steps (subop.h distd_refused_steps),
 * failed here before this rank took part in them, with reason: one
 * ABORT_RANGE frame to a peer whose HELLO_ACK said it reads them, an
 * ABORT per step per id to any other (peer_abort.c). count is at most
 * DIST_ABORT_RANGE_COUNT_MAX (an OpAbort's 1 + more_ids). */
void distd_abort_range(distd_peers *p, uint64_t first, uint64_t count, const int *ranks, int n,
                       const char *reason);
/* distd_xfer_wait, then on failure distd_xfer_abort to group[0..n): every
 * rank of an op that fails here learns why at once, and so can name the
 * cause (a lost rank it never talked to) instead of timing out on ranks
 * that gave up. eb may be NULL. */
int distd_xfer_finish(distd_xfer *x, int64_t deadline_ms, const int *group,
                      int n, dist_errbuf *eb);
void distd_xfer_free(distd_xfer *x);

/* ---- inspection (distctl ops; added for the operations registry) ---- */

struct distd_ops;
/* The daemon's operations registry (ops.h), carried here so that code
 * which runs operations and holds only the peers (coll.c, moe_scatter.c)
 * can register them. Set once after distd_peers_start, before any
 * operation; NULL (the default) means nothing is registered. */
void distd_peers_set_ops(distd_peers *p, struct distd_ops *ops);
struct distd_ops *distd_peers_ops(const distd_peers *p);
/* The ranks (other than this one) that transfers of any of the op ids still
 * wait on: a receive not yet complete, or a send not yet fully written.
 * Writes up to max of them to ranks in ascending order and returns how many
 * there are. Reads the data plane under its mutex; any thread. */
int distd_peers_waiting_on(distd_peers *p, const uint64_t *op_ids, int n_ids,
                           int *ranks, int max);

#endif
