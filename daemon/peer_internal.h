/* The peer data plane's insides, shared by peer.c (lifetime, listener,
 * dialling, timers), peer_conn.c (one socket: lifetime, writing, failure),
 * peer_read.c (reading its frames), peer_control.c (HELLO and control
 * frames), peer_xfer.c (transfers, matching, aborts, waiting),
 * peer_unexpected.c (kept-aside data), peer_drive.c (the waiting thread
 * moving the bytes), peer_read_ahead.c (its guess of the next receive),
 * peer_remember.c (the op ids aborted or failed, remembered a while),
 * peer_abort.c (telling peers of a range of aborted op ids)
 * and peer_trust.c (a reloaded trust store against the open connections).
 *
 * Locking: one mutex (distd_peers.mu) guards everything below, including the
 * read() and writev() calls that move bytes into or out of callers' buffers:
 * a buffer can then never be touched after distd_xfer_wait has detached it.
 * The loop thread takes the mutex in every callback. Worker threads take it
 * in distd_xfer_*; they may write to a socket and call event_add,
 * event_del_noblock or event_active, but never event_del/event_free or
 * close(): those belong to the loop thread (event_del from another thread
 * can wait on a callback that is itself waiting for our mutex).
 *
 * Who reads (plain TCP): a thread waiting in distd_xfer_wait becomes the
 * "driver" when no other thread is: it takes the greeted inbound sockets
 * from the loop (conn.owned; out of the epoll set of peer_inbound.c, which
 * wakes nobody), polls them itself with the mutex released, and reads and
 * writes every connection's frames until its transfer is done. It then
 * parks the sockets for the next driver (back-to-back operations never
 * wake the loop), which the loop takes back after PARK_MS without one, and
 * lets a waiter that sleeps meanwhile take over. The loop thread skips
 * owned ones; everything else (dialling, handshakes, PING, other waiters'
 * progress once the driver left) stays with it. One wake-up per arriving
 * frame instead of two (loop thread, then the waiter). A failure the driver
 * finds is left to the loop thread (conn.failed), which alone frees
 * connections. Other waiters sleep on their xfer's condvar and are served
 * by the driver or the loop.
 *
 * A driver pass plans one read per socket that may have bytes and one
 * write per socket with frames queued, makes them all in one io_uring
 * system call (peer_batch.h), then takes their results.
 *
 * distd_xfer_send writes what the socket takes at once, from the caller's
 * thread, together with frames queued before it by
 * distd_xfer_send_deferred (one writev); the driver or the loop writes the
 * rest. With io_uring, a frame under SEND_DEFER_MAX waits for the
 * poster's own first driver pass instead. */
#ifndef DISTD_PEER_INTERNAL_H
#define DISTD_PEER_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "frame.h"
#include "peer.h"
#include "peer_dropped.h"
#include "peer_transport.h"

/* Per-socket buffer for headers and small frames. A header read fills it,
 * so the start of a large payload lands here and is copied once more: at
 * 64 KiB, a 64 KiB frame came almost whole through it. 16 KiB against 64,
 * alternating launches of the two builds: W=2 all-to-all 64 KiB 24.0 ->
 * 21 us and global_scatter 25.4 -> 23 us (medians of the launches in the
 * VM's fast mode, out of ten), W=4 all-to-all 64 KiB 237 -> 201 us (eight
 * launches); 1 KiB and 1 MiB unchanged within the spread. */
#define STAGE_SIZE (16 * 1024)
#define HANDSHAKE_MS 10000        /* handshake limit without a silence timeout */
/* Inbound sockets stay with drivers this long. Four daemons on two cores
 * are often off the CPU for more than 2 ms between two operations; with
 * 2 ms the loop took the sockets back (and woke, and fought the next
 * driver for mu) about once per op. A rank that waits for nothing answers
 * pings (PING_MS apart) and sees a closed socket this much later. */
#define PARK_MS 50
#define DIRECT_READ_MIN (16 * 1024) /* smaller payload rests go through stage */
/* Longest short frame (header and payload) the read-ahead looks past:
 * half the stage, so what follows the guessed payload still has room. */
#define LEAD_MAX (STAGE_SIZE / 2)
#define CTL_MAX 1024              /* largest control payload (reasons, hello) */
#define CTL_SPARES 4              /* control frames kept per peer (peer_ctl.c) */
#define READ_BUDGET (8u << 20)    /* bytes per callback, for fairness */
/* A send writes this much of its frame at once; the rest is written by
 * the driver between its reads, when the receivers are reading too. A
 * whole 1 MiB frame written at once sat in the socket until its receiver
 * got to it, and was read from colder caches: W=4 all-to-all 1 MiB, six
 * alternating launches, median 4204 -> 3295 us, p10 3550 -> 2462 us. */
#define SEND_NOW_MAX (256 * 1024)
/* Frames shorter than this are written by the driver's first pass, with
 * its reads, rather than when posted (peer_xfer.c, write_now_some). 32
 * KiB against 128 KiB, alternating launches: W=2 64 KiB all-to-all 17.0
 * -> 15.8 us (eight rounds), W=4 98-102 against 111-118 us in the
 * machine's fast minutes. Longer frames still start at once: an
 * all-to-all copies its self chunk after posting its sends, 1 ms at 16
 * MiB, which the peers would wait through. */
#define SEND_DEFER_MAX (128 * 1024)
#define HOLD_MIN (64 * 1024)      /* early frames this long wait for their receive */
#define HOLD_MS 20                /* ... this long, then are kept aside */
#define IOV_BATCH 64
#define REMEMBERED_OPS 256        /* aborted/failed op ids kept */
#define REMEMBERED_RANGES 32      /* ranges of a peer's aborted op ids kept */
#define REMEMBER_MS 60000
#define PING_MS 1000
#define DEFAULT_UNEXPECTED_LIMIT (32u << 20)
#define DEFAULT_MAX_FRAME ((size_t)1 << 30)

/* Intrusive circular doubly linked list. */
typedef struct dlist {
  struct dlist *prev, *next;
} dlist;

static inline void dlist_init(dlist *l) { l->prev = l->next = l; }
static inline int dlist_empty(const dlist *l) { return l->next == l; }
static inline void dlist_push(dlist *l, dlist *n) {
  n->prev = l->prev;
  n->next = l;
  l->prev->next = n;
  l->prev = n;
}
static inline void dlist_remove(dlist *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = n;
}
#define dlist_entry(ptr, type, member) \
  ((type *)((char *)(ptr) - offsetof(type, member)))
#define dlist_each_safe(pos, tmp, head) \
  for (pos = (head)->next, tmp = pos->next; pos != (head); pos = tmp, tmp = pos->next)

typedef struct conn conn;

/* One frame queued for a peer's outbound connection. */
typedef struct send_item {
  dlist link;  /* peer.outq, xfer.self_sends for sends to self, or xfer.spare_sends */
  dlist xlink; /* xfer.sends while queued for a peer */
  uint8_t hdr[DIST_FRAME_HEADER_SIZE];
  const uint8_t *payload;
  size_t len;
  size_t done;      /* bytes of header + payload written */
  distd_xfer *x;    /* NULL for control frames and orphaned rests */
  uint8_t *owned;   /* payload we free (copied rests) */
  int spare;        /* one of its peer's ctl_spares: given back, not freed */
  int dst;
  uint32_t tag;
} send_item;

/* A posted receive. */
typedef struct recv_slot {
  dlist link; /* xfer.recvs */
  distd_xfer *x;
  int src;
  uint32_t tag;
  uint8_t *buf; /* fixed-size receive */
  size_t len;
  void **any_buf; /* receive of any length */
  size_t *any_len;
  uint8_t *any_tmp; /* malloc'd while an any-receive is being filled */
  size_t any_likely; /* the length an any-receive expects (0: unknown) */
  conn *reader;     /* connection currently reading into this slot */
  struct unexpected *claimed; /* kept-aside frame still arriving */
  int done;
} recv_slot;

/* A DATA frame that arrived before its receive was posted. */
typedef struct unexpected {
  dlist link; /* distd_peers.unexpected, in arrival order */
  uint64_t op_id;
  int src;
  uint32_t tag;
  uint8_t *data;
  size_t len;
  uint64_t signature; /* the header's aux */
  int64_t kept_ms;    /* when it began to arrive (its age, distd_unexpected_expire) */
  int complete;
  recv_slot *claim; /* posted while the frame was still arriving */
} unexpected;

enum { R_HEADER, R_PAYLOAD };
enum { M_RECV, M_UNEXP, M_CTL, M_DISCARD };

/* A read the read state machine needs next (peer_read.c), made by its
 * caller: at once on the loop thread, in the driver's batch
 * (peer_batch.h) on the driver. */
enum { READ_STAGE, READ_DIRECT, READ_AHEAD };
typedef struct distd_read_plan {
  int kind;
  struct iovec iov[3];
  int niov;
  size_t asked;     /* bytes the iovecs hold */
  recv_slot *guess; /* READ_AHEAD: the receive the payload likely is for */
  size_t lead;      /* READ_AHEAD: the short frame read before it, or 0 */
} distd_read_plan;
#define STEP_READ 2 /* distd_conn_drive_plan: *rp is the read to make */

struct conn {
  distd_peers *p;
  int fd;
  struct event *rev, *wev;
  /* transport (peer_transport.h) */
  const distd_peer_transport *tp;
  void *tls;          /* SSL * of the TLS transport */
  int handshaking;    /* transport handshake not finished */
  short hs_want;      /* EV_READ or EV_WRITE the handshake waits for */
  int tls_failed;     /* a fatal TLS error: no close_notify */
  int read_wants_write; /* reading waits for the socket to take a write */
  int cert_rank;      /* rank the peer's certificate names (DISTD_CERT_RANK_*) */
  unsigned tls_gen;   /* distd_peers.tls_gen when made: its handshake's context */
  char tp_error[320]; /* why the transport failed, when errno does not say */
  int outbound;
  int64_t opened_ms; /* greeted by then + the handshake limit, or closed */
  int rank;       /* peer rank; -1 until an inbound HELLO was accepted */
  int greeted;
  /* outbound: the peer's HELLO_ACK said it reads ABORT_RANGE frames
   * (DIST_ACK_READS_ABORT_RANGE); a daemon built before them does not */
  int reads_abort_range;
  int connecting; /* outbound connect() in progress */
  int close_after_flush;
  int read_blocked; /* backpressure: a frame waits for a receive */
  int64_t held_since_ms; /* the staged header waits for its receive (HOLD_MS) */
  int closed;
  dlist link; /* distd_peers.pending_in while an inbound is not greeted */
  /* reading */
  uint8_t *stage;
  size_t st_off, st_end;
  /* While not NULL, stage is a spill buffer (a wrong read-ahead guess put
   * back in stream order, peer_read.c) and own_stage the usual one. */
  uint8_t *own_stage;
  int rstate;
  dist_frame_header cur;
  int rmode;
  uint8_t *dst;
  size_t remaining;
  recv_slot *slot;
  unexpected *unexp;
  uint8_t ctl[CTL_MAX + 1];
  size_t ctl_len;
  /* the driver (see the top) */
  int owned;  /* read by the driving worker; the loop leaves it alone */
  int drive_ready; /* the driver should read it: poll() said so, or unknown */
  int short_read;  /* the last read() returned less than it asked for */
  int in_epoll; /* greeted inbound TCP: watched through in_epfd, not rev */
  int in_set;   /* in in_epfd now (the loop may read it) */
  int failed; /* the driver found it broken: the loop closes it */
  char lost_reason[300];
  /* writing: handshake and PONG bytes, sent before any queued item */
  uint8_t *wbuf;
  size_t wlen, woff, wcap;
};

typedef struct peer {
  distd_peers *p;
  int rank;
  conn *out, *in;
  dlist outq; /* send_items for this peer, in order */
  dlist ctl_spares; /* control frames ready for want of memory (peer_ctl.c) */
  uint64_t ctl_dropped_unlogged; /* of stats.ctl_dropped, not yet in a log line */
  struct event *redial_ev;
  int64_t backoff_ms;
  int ever_greeted;
  /* A greeted connection was lost and the peer is not connected again:
   * new transfers to or from it fail at once with lost_reason, since an
   * op it was part of cannot complete and one it has not seen would wait
   * out the silence timeout. (stats.last_error moves on to redial errors,
   * which do not name the rank.) */
  int lost;
  char lost_reason[400];
  distd_peer_stats stats;
} peer;

/* remembered_op.aborted_by of an op whose data from a peer was dropped
 * here before any transfer of it was posted (no memory to keep it): the
 * op's next transfer fails at once, where one posted after an ordinary
 * failure here starts afresh (the id used again), and would wait for the
 * dropped data until its deadline. */
#define DISTD_DROPPED_HERE (-2)

typedef struct remembered_op {
  uint64_t op_id;
  int64_t at_ms;
  int aborted_by; /* rank that sent ABORT, -1 for an op that failed here,
                   * or DISTD_DROPPED_HERE */
  int code;
  char reason[200];
} remembered_op;

/* A peer's aborts of op.op_id .. op.op_id + count - 1 and of their refusal
 * steps (peer_remember.c). */
typedef struct remembered_range {
  remembered_op op;
  uint64_t count;
} remembered_range;

struct distd_xfer {
  distd_peers *p; /* NULL once distd_peers_free orphaned it */
  uint64_t op_id;
  dlist link; /* distd_peers.xfers */
  dlist recvs;
  dlist sends;
  dlist self_sends;
  dlist spare_sends; /* distd_xfer_reserve_sends: items its sends take first */
  /* How many items distd_xfer_reserve_sends made (-1: none) and how many
   * its sends took: a wait checks that they agree (reserve_mismatches). */
  int sends_reserved, sends_taken;
  pthread_cond_t cond;
  int pending;
  int waiting; /* a thread is in distd_xfer_wait */
  int64_t moved_ms; /* when bytes last moved for it (distd_xfer_moved) */
  int aborted_by;   /* rank whose ABORT failed it, or -1 */
  distd_xfer *then; /* distd_xfer_then: waited on next, frames follow */
  uint64_t signature; /* distd_xfer_sign; 0: unsigned */
  distd_signature_namer name_signature;
  dist_errbuf err; /* err.code != 0 once failed */
};

struct distd_peers {
  struct event_base *base;
  pthread_mutex_t mu;
  pthread_cond_t idle;
  int rank, world;
  char cluster_id[64];
  uint64_t boot_id;
  int64_t backoff_min, backoff_max;
  size_t unexpected_limit, unexpected_bytes;
  int64_t unexpected_max_age_ms;   /* 0: kept-aside frames never expire */
  size_t max_frame;                /* longest DATA payload accepted */
  int64_t silence_ms;              /* longest a wait may see no bytes move */
  int64_t spin_us;                 /* the driver polls this long before sleeping */
  char congestion[16];             /* TCP_CONGESTION of peer sockets; "" = default */
  int socket_buffer;               /* SO_SNDBUF/SO_RCVBUF asked for; 0 = autotuning */
  const distd_peer_transport *tp;  /* tcp or tls */
  void *tls_ctx;                   /* SSL_CTX * when tp is tls */
  unsigned tls_gen;                /* counts the contexts swapped in by reloads */
  struct event *trust_ev;          /* the loop checks the open connections (peer_trust.c) */
  dist_member *members;
  peer *peers;
  int listen_fd, listen_port;
  struct event *listen_ev, *ping_ev;
  /* Ends the HOLD_MS of frames waiting for receives (peer_read.c). A
   * timerfd the loop watches, not a libevent timer: the driver arms it,
   * and a libevent timer added from a worker wakes the loop thread just to
   * note it (a third of the loop's wake-ups in a W=4 1 MiB all-to-all). */
  int hold_tfd;
  int hold_armed; /* hold_tfd is counting down */
  struct event *hold_ev;
  dlist pending_in;
  dlist xfers;
  dlist unexpected;
  /* kept-aside frames dropped unreceived, kept another
   * unexpected_max_age so a late receive is told (peer_dropped.h) */
  distd_dropped_frames dropped;
  remembered_op remembered[REMEMBERED_OPS];
  int remembered_used; /* slots ever written */
  remembered_range ranges[REMEMBERED_RANGES];
  int ranges_used; /* slots ever written */
  /* the worker driving the sockets (see the top); NULL when none */
  distd_xfer *driver_x;
  pthread_t driver_tid;
  int wake_fd;     /* eventfd that interrupts the driver's poll() */
  int in_epfd;     /* greeted inbound TCP sockets (peer_inbound.c); -1 with TLS */
  int park_tfd;    /* timerfd in in_epfd: parked sockets go back to the loop */
  int park_armed;  /* park_tfd is counting down */
  int64_t parked_ms; /* when the last driver stopped */
  struct event *in_ev; /* the loop's event on in_epfd */
  int drive_again; /* the driver must look again before sleeping */
  struct pollfd *pollfds; /* 2 * world + 1, the driver's */
  int *pollranks;          /* rank of each inbound pollfd, -1 for others */
  /* The driver's system calls of one pass (peer_batch.h), and per call
   * the rank (reads: r, writes: -1 - r) and result; per rank its read. */
  struct distd_batch *batch;
  char io_mode[128]; /* distd_peers_io */
  int *call_ranks;
  ssize_t *call_results;
  distd_read_plan *read_plans;
  unsigned spin_passes;     /* the driver's spinning passes (read_instead_of_poll) */
  int waiters;
  int closing;
  struct distd_ops *ops; /* registry for inspection (peer.h); not owned */
  /* Waits of an xfer whose sends took more or fewer items than were
   * reserved for it: a bug in the caller's count (test_coll and
   * test_reserved_sends check 0; /metrics distd_peer_reserve_mismatches_total). */
  uint64_t reserve_mismatches;
};

/* peer.c */
void distd_peer_schedule_redial(peer *pe, distd_peers *p);
int distd_peer_sock_setup(const distd_peers *p, int fd);
const char *distd_peer_addr(const distd_peers *p, int rank);
void distd_peer_pong(distd_peers *p, int rank, uint64_t sent_ns);
/* Records why the peer is not (fully) connected, for stats and Status. */
void distd_peer_set_error(peer *pe, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* peer_conn.c (all with mu held) */
/* "connection reset", "connection refused", ... or strerror. */
const char *distd_peer_errno_reason(int e);
/* Why the transport failed: its own words, or errno's. */
const char *distd_conn_io_reason(const conn *c, int e);
/* The peer of a connection whose rank is known, else NULL. */
peer *distd_conn_peer(conn *c);
/* Recomputes pe's connected flags from its two connections. */
void distd_peer_update_connected(peer *pe);
/* Ends c for reason: at once on the loop thread; from the driver, marked
 * failed for the loop thread to close (only it frees connections). */
void distd_conn_fail(conn *c, const char *reason);
void distd_conn_failf(conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* NULL when out of memory (the caller closes fd). */
conn *distd_conn_new(distd_peers *p, int fd, int outbound, int rank);
void distd_conn_free(conn *c);
/* The connection failed: logs, records, fails what needed it, closes it,
 * schedules a redial for outbound ones. Loop thread only. */
void distd_conn_lost(conn *c, const char *reason);
/* The same for a connection this daemon ends on purpose (its peer is no
 * longer trusted): "peer rank R (ADDR): closed: reason". */
void distd_conn_close(conn *c, const char *reason);
void distd_conn_queue_ctl(conn *c, const dist_frame_header *h,
                          const void *payload, size_t len);
/* Before closing greeted c: tells the peer why in a CLOSE frame, once and
 * without waiting for room, when c is between frames (best effort: the
 * peer of a connection cut mid-frame sees it closed). Loop thread. */
void distd_conn_say_goodbye(conn *c, const char *why);
/* Writes what it can. in_loop = 0 from worker threads: then errors are left
 * for the loop thread to find. Returns -1 when the connection was closed. */
int distd_conn_flush(conn *c, int in_loop);
/* For a worker about to wait: writes at most cap bytes of what an
 * outbound connection has queued, without arming its write event; returns
 * 1 when bytes are left. */
int distd_conn_driver_flush(conn *c, size_t cap);
/* For the driver's batch: the next write of what c has queued, as iov
 * (IOV_BATCH entries at most); returns their count, 0 when there is
 * nothing a driver may write now. */
int distd_conn_plan_write(conn *c, struct iovec *iov);
/* The planned write returned w (bytes, or -errno). */
void distd_conn_write_done(conn *c, ssize_t w);
/* Bytes queued on c that a driver would write (it waits for POLLOUT). */
int distd_conn_driver_has_queued(const conn *c);
/* For the driver, one pass over an owned inbound connection: takes the
 * frames already staged, up to the next read, which it returns as *rp
 * (STEP_READ); or 1 when the driver's transfer is complete, 0 when a
 * frame waits for its receive, -1 when the connection failed. */
int distd_conn_drive_plan(conn *c, distd_read_plan *rp);
/* The read *rp planned returned n (bytes, or -errno): takes what it
 * brought, as far as it goes without another read. 1 when c should be
 * read again at once (the read filled all it asked for, or the driver's
 * transfer is complete), 0 when the socket is empty or a frame waits for
 * its receive, -1 when the connection failed. */
int distd_conn_drive_done(conn *c, const distd_read_plan *rp, ssize_t n);
/* 1 when reading c can advance without read(): bytes already staged, or a
 * finished payload to hand over. poll() cannot see those. */
int distd_conn_has_staged(const conn *c);
void distd_conn_want_write(conn *c);
/* Advances the transport handshake from the loop thread; once done,
 * checks an outbound peer's certificate rank and starts the HELLO. */
void distd_conn_handshake(conn *c);
/* peer_read.c: the loop thread's read callback. */
void distd_conn_read_cb(int fd, short what, void *arg);
void distd_conn_write_cb(int fd, short what, void *arg);
void distd_peer_queue_frame(distd_peers *p, int dst, send_item *it);
/* peer_ctl.c. Queues a control frame (h, a copy of payload[0..len), len
 * at most CTL_MAX) to dst after the frames before it, and writes what the
 * connection takes if it is up; without memory for it, in one of dst's
 * spares (dropped only when all CTL_SPARES are queued, and counted in
 * dst's stats.ctl_dropped). */
void distd_peer_queue_ctl(distd_peers *p, int dst, const dist_frame_header *h,
                          const void *payload, size_t len);
/* pe's spare control frames: made at start-up (-1: out of memory; what
 * was made is freed by distd_ctl_spares_free), freed at shutdown. */
int distd_ctl_spares_init(peer *pe);
void distd_ctl_spares_free(peer *pe);
/* Logs how many control frames to pe were dropped since its last such
 * line, if any (the loop's tick). */
void distd_ctl_report_dropped(distd_peers *p, peer *pe);
/* Frees a frame taken off pe's queue, or gives a spare back to pe. */
void distd_send_item_free(peer *pe, send_item *it);
/* Frees the send items linked through their link in list (a transfer's
 * own, or spares: none has a payload of its own). */
void distd_send_items_free(dlist *list);
void distd_peers_unblock_readers(distd_peers *p);

/* peer_control.c (with mu held): the HELLO handshake and control frames. */
/* Answers HELLO_REJECT with reason and closes c once it is written. */
void distd_conn_reject(conn *c, int rank, const char *reason);
int distd_conn_on_ack(conn *c, const dist_frame_header *h);
/* A control frame's payload (c->ctl) is complete: acts on it; -1 when the
 * connection failed. */
int distd_conn_on_control(conn *c);
/* Whether a frame of this kind may arrive on c now. */
int distd_conn_kind_allowed(const conn *c, unsigned kind);

/* peer_inbound.c (with mu held, except open/close) */
/* The epoll set of greeted inbound TCP sockets, and the loop's event on it. */
int distd_inbound_open(distd_peers *p, dist_errbuf *eb);
void distd_inbound_close(distd_peers *p);
/* The driver stopped: its sockets stay taken (conn.owned) for the next
 * driver, and go back to the loop PARK_MS later if none came. */
void distd_inbound_park(distd_peers *p);
/* Frames are queued that no driver may come for: the loop writes them
 * PARK_MS from now if none did. */
void distd_inbound_look_later(distd_peers *p);
/* An inbound connection was greeted: with TCP it moves into the set. */
void distd_conn_greeted_inbound(conn *c);
/* Lets the loop read c (on) or not: through the set for greeted inbound
 * TCP connections, through c->rev otherwise. Loop thread, or a worker for
 * connections in the set. */
void distd_conn_watch_read(conn *c, int on);

/* peer_trust.c: a reload's trust store against the open connections. */
int distd_trust_check_open(distd_peers *p, dist_errbuf *eb);
void distd_trust_check_close(distd_peers *p); /* after the loop stopped */
/* With mu held, any thread, after a reload swapped in p->tls_ctx: the
 * loop thread soon closes every connection whose peer certificate chain its
 * store no longer verifies (the peer told why, logged, counted, failing
 * what needed the peer), and those still in a handshake begun before. */
void distd_trust_check_post(distd_peers *p);

/* peer_xfer.c (all with mu held) */
void distd_xfer_fail(distd_xfer *x, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails x for want of memory while doing what `doing` says, and the op's
 * other live transfers with it (distd_fail_op_xfers). */
void distd_xfer_out_of_memory(distd_xfer *x, const char *doing);
/* Fails every live transfer of op_id but except (NULL: none) with err:
 * the op's frames are dropped here from now on. */
void distd_fail_op_xfers(distd_peers *p, uint64_t op_id, const distd_xfer *except,
                         const dist_errbuf *err);
void distd_xfer_send_done(send_item *it);
/* 1 when a frame from src signed `signature` cannot be for x (both signed,
 * differently): x has then failed with DIST_EMISMATCH. */
int distd_xfer_signature_clash(distd_xfer *x, int src, uint64_t signature);
/* The same for a frame no receive was posted for yet, against every live
 * transfer of its op: a member that will never post the receive (it runs
 * another collective, with other tags) still fails at once. */
int distd_signature_clash_live(distd_peers *p, uint64_t op_id, int src, uint64_t signature);
recv_slot *distd_find_posted_recv(distd_peers *p, uint64_t op_id, int src,
                                  uint32_t tag);
void distd_recv_finished(recv_slot *s);
/* One of x's sends or receives is done: wakes x's waiter when it was the
 * last, else restarts x's silence timeout. */
void distd_xfer_one_done(distd_xfer *x);
const remembered_op *distd_remembered_find(distd_peers *p, uint64_t op_id);
void distd_remember_op(distd_peers *p, uint64_t op_id, int aborted_by,
                       int code, const char *reason);
/* A peer's abort of first .. first + count - 1 and of their refusal
 * steps (subop.h), remembered as one range. */
void distd_remember_range(distd_peers *p, uint64_t first, uint64_t count, int aborted_by,
                          int code, const char *reason);
/* op_id, remembered as failed here, is used again: forgotten. */
void distd_forget_op(distd_peers *p, uint64_t op_id);
void distd_handle_abort(distd_peers *p, int from, uint64_t op_id, int code,
                        const char *reason);
/* Rank from aborted first .. first + count - 1, each with its refusal
 * steps (an ABORT_RANGE frame): remembered as one range, and the
 * transfers and kept-aside frames of those ids fail or go as an ABORT of
 * each would make them. */
void distd_handle_abort_range(distd_peers *p, int from, uint64_t first, uint64_t count,
                              int code, const char *reason);
void distd_fail_xfers_of_peer(distd_peers *p, int rank, const char *msg);
void distd_xfer_orphan_all(distd_peers *p);
/* Bytes moved for x: restarts its silence timeout (silence_timeout_ms). */
void distd_xfer_moved(distd_xfer *x);

/* peer_unexpected.c (all with mu held): frames that came before their
 * receive was posted, kept aside. */
void distd_unexpected_finished(distd_peers *p, unexpected *u);
void distd_unexpected_free(distd_peers *p, unexpected *u);
/* Drops the whole kept-aside frames older than unexpected_max_age_ms at
 * now_ms; called by the loop's PING timer. */
void distd_unexpected_expire(distd_peers *p, int64_t now_ms);
/* Drops the whole kept-aside frames of op_id: its op failed. */
void distd_drop_unexpected_of(distd_peers *p, uint64_t op_id);
/* The oldest frame kept aside for (op_id, src, tag) that no receive has
 * claimed yet, else NULL. */
unexpected *distd_find_unexpected(distd_peers *p, uint64_t op_id, int src, uint32_t tag);
/* Gives s the whole frame u: hands an any-receive u's buffer, copies into
 * a sized one; marks s done (the caller counts it, and frees u). */
void distd_deliver_unexpected(recv_slot *s, unexpected *u);

/* peer_read_ahead.c (mu held) */
/* The receive the driver's transfer most likely gets next from src, for
 * reading its payload ahead (peer_read.c); NULL when there is no good
 * guess. *lead: the bytes of one short frame (header and payload) that
 * likely come first, 0 if none. Driver thread only. */
recv_slot *distd_guess_next_recv(distd_peers *p, int src, size_t *lead);

/* peer_drive.c (all with mu held): the waiting thread drives the sockets. */
/* 1 on the thread currently driving the sockets. */
int distd_on_driver(const distd_peers *p);
/* 1 where waiting threads drive the sockets (plain TCP; not TLS). */
int distd_drivers_run(const distd_peers *p);
/* Writes the frames queued for every peer (deferred sends, rests of
 * sends). in_loop as distd_conn_flush: from a worker, the loop thread
 * writes what the sockets cannot take now. */
void distd_peers_flush_queued(distd_peers *p, int in_loop);
/* Makes the driver look at its sockets and transfers again: from another
 * thread through wake_fd, on the driver itself through drive_again. */
void distd_driver_wake(distd_peers *p);
/* 1 when a waiting thread may become the driver now. */
int distd_can_drive(const distd_peers *p);
/* When x's wait must give up (distd_now_ms clock): its deadline, or
 * silence_ms after bytes last moved for it, whichever comes first. */
int64_t distd_xfer_wait_limit(const distd_xfer *x, int64_t deadline_ms);
/* Drives until x is done or failed, its wait limit passed, or the data
 * plane closes; then parks the sockets for the next driver. Only when
 * distd_can_drive; returns with mu held (released while it polls). */
void distd_drive(distd_xfer *x, int64_t deadline_ms);

#endif
