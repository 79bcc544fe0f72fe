/* A stand-in for a daemon built before ABORT_RANGE frames (0.2.9 or
 * older), for tests of a mixed cluster: it listens at
 * one rank's peer address, accepts the others' dials, answers each HELLO
 * with a HELLO_ACK whose aux is 0 (what such a daemon sends: it announces
 * nothing), and counts the frames it is then sent, by kind and sender. It
 * never dials, so the real daemons see it connected one way (outbound);
 * that is all a sender needs. A kind it does not know is counted as
 * unknown, where the real old daemon would fail the connection. */
#ifndef TEST_OLD_PEER_H
#define TEST_OLD_PEER_H

#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "peer_fixture.h"

#define OLD_PEER_CONNS 8
#define OLD_PEER_KIND_UNKNOWN 0
#define OLD_PEER_OLD_LAST DIST_FRAME_CLOSE /* the last kind such a build reads */

typedef struct old_peer_conn {
  int fd;
  uint8_t buf[64 * 1024];
  size_t used;
} old_peer_conn;

typedef struct old_peer {
  int rank, listen_fd;
  pthread_t thread;
  pthread_mutex_t mu;
  volatile int stop;
  old_peer_conn conns[OLD_PEER_CONNS];
  int nconns;
  /* frames[src][kind], kind OLD_PEER_KIND_UNKNOWN for one past CLOSE */
  uint64_t frames[FIX_MAX][OLD_PEER_OLD_LAST + 1];
} old_peer;

static inline void old_peer_ack(old_peer *o, int fd) {
  dist_frame_header ack = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_HELLO_ACK,
                           0, (uint32_t)o->rank, 0, 0, 0};
  uint8_t out[DIST_FRAME_HEADER_SIZE];
  dist_frame_encode(&ack, out);
  cr_assert_eq(write(fd, out, sizeof out), (ssize_t)sizeof out);
}

/* Takes the whole frames c holds. */
static inline void old_peer_take(old_peer *o, old_peer_conn *c) {
  size_t off = 0;
  while (c->used - off >= DIST_FRAME_HEADER_SIZE) {
    const uint8_t *b = c->buf + off;
    uint16_t kind = (uint16_t)(b[6] | b[7] << 8);
    uint32_t src = (uint32_t)b[16] | (uint32_t)b[17] << 8;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = len << 8 | b[24 + i];
    cr_assert_lt(len, sizeof c->buf - DIST_FRAME_HEADER_SIZE, "a frame of %llu bytes",
                 (unsigned long long)len);
    if (c->used - off < DIST_FRAME_HEADER_SIZE + len) break;
    if (kind == DIST_FRAME_HELLO) old_peer_ack(o, c->fd);
    pthread_mutex_lock(&o->mu);
    if (src < FIX_MAX) o->frames[src][kind <= OLD_PEER_OLD_LAST ? kind : OLD_PEER_KIND_UNKNOWN]++;
    pthread_mutex_unlock(&o->mu);
    off += DIST_FRAME_HEADER_SIZE + len;
  }
  memmove(c->buf, c->buf + off, c->used - off);
  c->used -= off;
}

static inline void *old_peer_main(void *arg) {
  old_peer *o = arg;
  while (!o->stop) {
    struct pollfd pf[OLD_PEER_CONNS + 1] = {{.fd = o->listen_fd, .events = POLLIN}};
    for (int i = 0; i < o->nconns; i++)
      pf[i + 1] = (struct pollfd){.fd = o->conns[i].fd, .events = POLLIN};
    if (poll(pf, (nfds_t)o->nconns + 1, 50) <= 0) continue;
    if ((pf[0].revents & POLLIN) && o->nconns < OLD_PEER_CONNS)
      o->conns[o->nconns++].fd = accept(o->listen_fd, NULL, NULL);
    for (int i = 0; i < o->nconns; i++) {
      old_peer_conn *c = &o->conns[i];
      if (!(pf[i + 1].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(c->fd, c->buf + c->used, sizeof c->buf - c->used);
      if (n <= 0) { /* closed by its dialler: poll skips a negative fd */
        close(c->fd);
        c->fd = -1;
        continue;
      }
      c->used += (size_t)n;
      old_peer_take(o, c);
    }
  }
  return NULL;
}

/* Listens at f's address for rank and starts answering. */
static inline void old_peer_start(old_peer *o, peer_fixture *f, int rank) {
  memset(o, 0, sizeof *o);
  o->rank = rank;
  pthread_mutex_init(&o->mu, NULL);
  int port = atoi(strrchr(f->members[rank].peer_addr, ':') + 1);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  o->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(o->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  cr_assert_eq(bind(o->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(o->listen_fd, 8), 0);
  cr_assert_eq(pthread_create(&o->thread, NULL, old_peer_main, o), 0);
}

static inline uint64_t old_peer_frames(old_peer *o, int src, int kind) {
  pthread_mutex_lock(&o->mu);
  uint64_t n = o->frames[src][kind];
  pthread_mutex_unlock(&o->mu);
  return n;
}

static inline void old_peer_stop(old_peer *o) {
  o->stop = 1;
  pthread_join(o->thread, NULL);
  for (int i = 0; i < o->nconns; i++)
    if (o->conns[i].fd >= 0) close(o->conns[i].fd);
  close(o->listen_fd);
  pthread_mutex_destroy(&o->mu);
}

#endif
