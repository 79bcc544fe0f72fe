/* One driver pass's reads and writes in one io_uring_enter, or one by one
 * without io_uring (peer_batch.h). */
#include "peer_batch.h"

#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

typedef struct call {
  distd_batch_dir dir;
  int fd;
  struct msghdr msg; /* msg_iov points into distd_batch.iovs */
} call;

struct distd_batch {
  struct io_uring ring;
  int uring; /* ring is set up and working */
  int cap, max_iov, n;
  call *calls;
  struct iovec *iovs; /* cap * max_iov */
};

static int supports_socket_calls(struct io_uring *ring) {
  struct io_uring_probe *probe = io_uring_get_probe_ring(ring);
  int ok = probe && io_uring_opcode_supported(probe, IORING_OP_SEND) &&
           io_uring_opcode_supported(probe, IORING_OP_RECV) &&
           io_uring_opcode_supported(probe, IORING_OP_SENDMSG) &&
           io_uring_opcode_supported(probe, IORING_OP_RECVMSG);
  io_uring_free_probe(probe);
  return ok;
}

/* SUBMIT_ALL (Linux 5.18) keeps submitting past a call that fails at
 * submission (a closed fd); without it the rest are submitted again. */
static int setup_ring(distd_batch *b, const char **why) {
  unsigned entries = 1;
  while (entries < (unsigned)b->cap) entries <<= 1;
  struct io_uring_params prm;
  memset(&prm, 0, sizeof prm);
  prm.flags = IORING_SETUP_SUBMIT_ALL;
  int rc = io_uring_queue_init_params(entries, &b->ring, &prm);
  if (rc == -EINVAL) {
    memset(&prm, 0, sizeof prm);
    rc = io_uring_queue_init_params(entries, &b->ring, &prm);
  }
  if (rc < 0) {
    *why = strerror(-rc);
    return -1;
  }
  if (!supports_socket_calls(&b->ring)) {
    *why = "the kernel's io_uring has no send/recv (Linux 5.6)";
    io_uring_queue_exit(&b->ring);
    return -1;
  }
  b->uring = 1;
  return 0;
}

distd_batch *distd_batch_new(int calls, int max_iov, int use_uring, const char **why) {
  const char *none = "";
  if (!why) why = &none;
  *why = use_uring ? "" : "turned off";
  distd_batch *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->cap = calls > 0 ? calls : 1;
  b->max_iov = max_iov > 0 ? max_iov : 1;
  b->calls = calloc((size_t)b->cap, sizeof *b->calls);
  b->iovs = calloc((size_t)b->cap * (size_t)b->max_iov, sizeof *b->iovs);
  if (!b->calls || !b->iovs) {
    distd_batch_free(b);
    return NULL;
  }
  if (use_uring) setup_ring(b, why);
  return b;
}

void distd_batch_free(distd_batch *b) {
  if (!b) return;
  if (b->uring) io_uring_queue_exit(&b->ring);
  free(b->calls);
  free(b->iovs);
  free(b);
}

int distd_batch_cheap(const distd_batch *b) { return b->uring; }

int distd_batch_add(distd_batch *b, distd_batch_dir dir, int fd, const struct iovec *iov,
                    int iovcnt) {
  if (b->n == b->cap || iovcnt < 1 || iovcnt > b->max_iov) return -1;
  call *c = &b->calls[b->n];
  struct iovec *mine = b->iovs + (size_t)b->n * (size_t)b->max_iov;
  memcpy(mine, iov, sizeof *iov * (size_t)iovcnt);
  memset(c, 0, sizeof *c);
  c->dir = dir;
  c->fd = fd;
  c->msg.msg_iov = mine;
  c->msg.msg_iovlen = (size_t)iovcnt;
  return b->n++;
}

/* One piece goes through read/send, which copy in no iovec. */
static ssize_t call_now(const call *c) {
  const struct iovec *v = c->msg.msg_iov;
  int one = c->msg.msg_iovlen == 1;
  ssize_t r;
  do {
    if (c->dir == DISTD_BATCH_WRITE)
      r = one ? send(c->fd, v->iov_base, v->iov_len, MSG_NOSIGNAL | MSG_DONTWAIT)
              : sendmsg(c->fd, &c->msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    else
      r = one ? read(c->fd, v->iov_base, v->iov_len) : readv(c->fd, v, (int)c->msg.msg_iovlen);
  } while (r < 0 && errno == EINTR);
  return r < 0 ? -errno : r;
}

/* Submits calls [0, n); returns how many the kernel took before an error
 * it gave (all of them when none). */
static int submit(distd_batch *b, int n, int *err) {
  for (int i = 0; i < n; i++) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring); /* entries >= cap */
    call *c = &b->calls[i];
    const struct iovec *v = c->msg.msg_iov;
    int write = c->dir == DISTD_BATCH_WRITE;
    /* send/recv copy in no msghdr; their length is 32 bits */
    int one = c->msg.msg_iovlen == 1 && v->iov_len <= INT_MAX;
    if (one && write)
      io_uring_prep_send(sqe, c->fd, v->iov_base, v->iov_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    else if (one)
      io_uring_prep_recv(sqe, c->fd, v->iov_base, v->iov_len, MSG_DONTWAIT);
    else if (write)
      io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    else
      io_uring_prep_recvmsg(sqe, c->fd, &c->msg, MSG_DONTWAIT);
    io_uring_sqe_set_data64(sqe, (uint64_t)i);
  }
  int taken = 0;
  *err = 0;
  while (taken < n) {
    int r = io_uring_submit(&b->ring);
    if (r == -EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? -r : EIO;
      break;
    }
    taken += r;
  }
  return taken;
}

/* The ring failed in a way a retry would not mend: from now on the calls
 * are made one by one. Calls not yet submitted go with the ring. */
static void give_up_ring(distd_batch *b, int err) {
  log_warn("peer data plane: io_uring failed (%s); making system calls one by one",
           strerror(err));
  io_uring_queue_exit(&b->ring);
  b->uring = 0;
}

static void run_uring(distd_batch *b, ssize_t *res) {
  int err, taken = submit(b, b->n, &err);
  /* A call whose completion cannot be read moved an unknown number of
   * bytes, so its connection must go (-EIO). A ring that took the calls
   * always has their completions. */
  for (int i = 0; i < taken; i++) res[i] = -EIO;
  /* The sockets are non-blocking: every call completed inside the submit,
   * so this only reads the completion ring. */
  for (int done = 0; done < taken;) {
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&b->ring, &cqe);
    if (r == -EINTR) continue;
    if (r < 0) {
      err = -r;
      break;
    }
    uint64_t i = io_uring_cqe_get_data64(cqe);
    if (i < (uint64_t)taken) res[i] = cqe->res;
    io_uring_cqe_seen(&b->ring, cqe);
    done++;
  }
  if (err) {
    give_up_ring(b, err);
    for (int i = taken; i < b->n; i++) res[i] = call_now(&b->calls[i]);
  }
}

int distd_batch_run(distd_batch *b, ssize_t *res) {
  int n = b->n;
  if (n == 0) return 0;
  /* One call alone costs less made directly: io_uring_enter and the
   * completion it posts are dearer than the system call they replace. */
  if (b->uring && n > 1) {
    run_uring(b, res);
  } else {
    for (int i = 0; i < n; i++) res[i] = call_now(&b->calls[i]);
  }
  b->n = 0;
  return n;
}
