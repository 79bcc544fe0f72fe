/* The relay of reply_hold.h: one thread polls the listening socket and
 * each client/daemon pair, copying bytes both ways; the client's are
 * parsed as HTTP/2 frames only to count the streams it opens (one
 * HEADERS frame per gRPC call). Once the chosen call has gone through,
 * the daemon's sockets are not read until the hold ends; or, holding
 * requests, the client's bytes from that call's HEADERS frame on are read
 * and dropped, and the hold ends by closing that connection, as an HTTP/2
 * connection missing bytes cannot go on. */
#include "reply_hold.h"

#include "client_internal.h" /* dist_call_aside: a probe that leaves c->err */
#include "health.pb-c.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_PAIRS = 8, PREFACE_LEN = 24, FRAME_HEADER_LEN = 9, HTTP2_HEADERS = 1 };

/* Where the parse of the client's bytes stands. */
typedef struct frame_reader {
  size_t preface_left; /* of the connection preface */
  unsigned char head[FRAME_HEADER_LEN];
  size_t head_len;     /* bytes of the current frame header read */
  size_t body_left;    /* bytes of the current frame's payload to skip */
} frame_reader;

typedef struct pair {
  int client, daemon;
  frame_reader rd;
  int dropping; /* the client's bytes go nowhere: requests held */
} pair;

struct reply_hold {
  int listen_fd, daemon_port, rank;
  dist_client *client; /* reply_hold_cluster's, which the release probes */
  char cluster_file[320];
  pthread_t thread;
  atomic_int stop;
  /* A hold set (armed): calls are counted from it (seen), and held from
   * call `from` until call `until` is sent (0: until reply_hold_release);
   * the client's bytes (requests) or the daemon's. */
  atomic_int armed, seen, from, until, requests;
  atomic_int holding;
  atomic_int close_dropping; /* asked by the release: the relay closes such pairs */
  atomic_int refusing;       /* every connection closed, new ones at once */
  atomic_int refused;        /* the relay has closed those it had */
  pair pairs[MAX_PAIRS];
  int n_pairs;
};

/* Parses b[0..n) from *at on up to the end of the next HEADERS frame's
 * header: 1 with *at just past it, or 0 with *at = n when none ends there. */
static int next_headers(frame_reader *rd, const unsigned char *b, size_t n, size_t *at) {
  while (*at < n) {
    size_t i = *at;
    if (rd->preface_left) {
      size_t k = n - i < rd->preface_left ? n - i : rd->preface_left;
      rd->preface_left -= k, *at += k;
    } else if (rd->body_left) {
      size_t k = n - i < rd->body_left ? n - i : rd->body_left;
      rd->body_left -= k, *at += k;
    } else {
      rd->head[rd->head_len++] = b[(*at)++];
      if (rd->head_len < FRAME_HEADER_LEN) continue;
      rd->head_len = 0;
      rd->body_left = (size_t)rd->head[0] << 16 | (size_t)rd->head[1] << 8 | rd->head[2];
      if (rd->head[3] == HTTP2_HEADERS) return 1;
    }
  }
  return 0;
}

/* Counts the calls in a chunk of the client's bytes and sets the hold by
 * them: how many of the bytes go on to the daemon. Holding requests, none
 * from the frame that opens the held call on (none at all when its
 * header began in an earlier chunk: the daemon sees no whole frame). */
static size_t to_daemon(reply_hold *p, pair *pr, const unsigned char *b, size_t n) {
  size_t at = 0;
  while (!pr->dropping && next_headers(&pr->rd, b, n, &at)) {
    if (!atomic_load(&p->armed)) continue;
    int seen = atomic_fetch_add(&p->seen, 1) + 1;
    int hold = seen >= p->from && (!p->until || seen < p->until);
    atomic_store(&p->holding, hold);
    if (hold && p->requests) {
      pr->dropping = 1;
      size_t passed = at >= FRAME_HEADER_LEN ? at - FRAME_HEADER_LEN : 0;
      while (next_headers(&pr->rd, b, n, &at)) atomic_fetch_add(&p->seen, 1);
      return passed;
    }
  }
  if (!pr->dropping) return n;
  /* Dropped, but still counted: the calls the client sent in vain. */
  while (next_headers(&pr->rd, b, n, &at)) atomic_fetch_add(&p->seen, 1);
  return 0;
}

static int connect_daemon(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

static void accept_pair(reply_hold *p) {
  int cfd = accept(p->listen_fd, NULL, NULL);
  if (cfd < 0) return;
  int dfd = p->n_pairs < MAX_PAIRS && !atomic_load(&p->refusing)
                ? connect_daemon(p->daemon_port) : -1;
  if (dfd < 0) {
    close(cfd);
    return;
  }
  p->pairs[p->n_pairs++] = (pair){cfd, dfd, {PREFACE_LEN, {0}, 0, 0}, 0};
}

/* Copies what is readable on from to to; 0 when from closed. */
static int copy(reply_hold *p, pair *pr, int from, int to) {
  unsigned char buf[16384];
  ssize_t n = read(from, buf, sizeof buf);
  if (n <= 0) return 0;
  if (from == pr->client) n = (ssize_t)to_daemon(p, pr, buf, (size_t)n);
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(to, buf + off, (size_t)(n - off));
    if (w <= 0) return 0;
    off += w;
  }
  return 1;
}

static void close_pair(reply_hold *p, int i) {
  close(p->pairs[i].client);
  close(p->pairs[i].daemon);
  p->pairs[i] = p->pairs[--p->n_pairs];
}

/* Closes the connections whose requests were held, when the release asks. */
static void close_dropping(reply_hold *p) {
  if (!atomic_load(&p->close_dropping)) return;
  for (int i = p->n_pairs - 1; i >= 0; i--)
    if (p->pairs[i].dropping) close_pair(p, i);
  atomic_store(&p->close_dropping, 0);
}

/* One round: waits up to 50 ms for a connection or bytes, copies them. */
static void relay_once(reply_hold *p) {
  struct pollfd fds[1 + 2 * MAX_PAIRS];
  close_dropping(p);
  if (atomic_load(&p->refusing)) {
    while (p->n_pairs) close_pair(p, p->n_pairs - 1);
    atomic_store(&p->refused, 1);
  }
  int holding = atomic_load(&p->holding) && !p->requests, n = 1;
  fds[0] = (struct pollfd){p->listen_fd, POLLIN, 0};
  for (int i = 0; i < p->n_pairs; i++) {
    fds[n++] = (struct pollfd){p->pairs[i].client, POLLIN, 0};
    fds[n++] = (struct pollfd){p->pairs[i].daemon, holding ? 0 : POLLIN, 0};
  }
  if (poll(fds, (nfds_t)n, 50) <= 0) return;
  for (int i = p->n_pairs - 1; i >= 0; i--) {
    pair *pr = &p->pairs[i];
    short from_client = fds[1 + 2 * i].revents, from_daemon = fds[2 + 2 * i].revents;
    int open = 1;
    if (from_client & (POLLIN | POLLHUP)) open = copy(p, pr, pr->client, pr->daemon);
    if (open && (from_daemon & (POLLIN | POLLHUP))) open = copy(p, pr, pr->daemon, pr->client);
    if (!open) close_pair(p, i);
  }
  /* Last: a pair accepted before the loop would have no fds polled. */
  if (fds[0].revents & POLLIN) accept_pair(p);
}

static void *relay(void *arg) {
  reply_hold *p = arg;
  while (!atomic_load(&p->stop)) relay_once(p);
  while (p->n_pairs) close_pair(p, p->n_pairs - 1);
  return NULL;
}

static int listen_loopback(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 8) ||
      getsockname(fd, (struct sockaddr *)&a, &len)) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

static void write_cluster_file(const reply_hold *p, const harness *h, int r, int port) {
  FILE *f = fopen(p->cluster_file, "w");
  cr_assert(f, "cannot write %s", p->cluster_file);
  fprintf(f, "# test cluster, rank %d through a relay\n", r);
  for (int i = 0; i < h->n; i++)
    fprintf(f, "127.0.0.1:%d 127.0.0.1:%d\n", i == r ? port : h->grpc_port[i], h->peer_port[i]);
  fclose(f);
}

static reply_hold *start_relay(harness *h, int r) {
  reply_hold *p = calloc(1, sizeof *p);
  cr_assert(p, "out of memory");
  int port = 0;
  p->listen_fd = listen_loopback(&port);
  cr_assert(p->listen_fd >= 0, "relay: cannot listen on loopback");
  p->daemon_port = h->grpc_port[r];
  p->rank = r;
  snprintf(p->cluster_file, sizeof p->cluster_file, "%s/cluster_relay%d.conf", h->dir, r);
  write_cluster_file(p, h, r, port);
  cr_assert_eq(pthread_create(&p->thread, NULL, relay, p), 0, "relay: no thread");
  return p;
}

/* Sets a hold of the daemon's bytes, or the client's, from call `from`
 * until call `until` (0: until released), counted from the next. */
static void arm(reply_hold *p, int from, int until, int requests) {
  atomic_store(&p->armed, 0);
  atomic_store(&p->holding, 0);
  atomic_store(&p->seen, 0);
  atomic_store(&p->from, from);
  atomic_store(&p->until, until);
  atomic_store(&p->requests, requests);
  atomic_store(&p->armed, 1);
}

void reply_hold_from_call(reply_hold *p, int n) { arm(p, n, 0, 0); }

void reply_hold_calls(reply_hold *p, int from, int until) { arm(p, from, until, 0); }

void reply_hold_requests_from_call(reply_hold *p, int n) { arm(p, n, 0, 1); }

void reply_hold_refuse(reply_hold *p) {
  atomic_store(&p->armed, 0);
  atomic_store(&p->refused, 0);
  atomic_store(&p->refusing, 1);
  /* a call sent before the relay closed its connections would reach the daemon */
  for (int waited = 0; !atomic_load(&p->refused) && waited < 5000; waited += 10)
    usleep(10 * 1000);
  cr_assert(atomic_load(&p->refused), "relay: the connections were not closed in 5 s");
}

/* Whether the client's channel to the relayed rank answers a health check
 * within 10 s. The client's gRPC learns of a closed connection on its own
 * threads: a call sent before it has goes out on the dead connection and
 * fails, and only a call after it connects again. */
static int client_reconnected(reply_hold *p) {
  Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  double until = harness_now_s() + 10;
  while (harness_now_s() < until) {
    ProtobufCMessage *rp =
        dist_call_aside(p->client, p->rank, "/grpc.health.v1.Health/Check", &rq.base,
                        &grpc__health__v1__health_check_response__descriptor, 1000);
    if (rp) {
      protobuf_c_message_free_unpacked(rp, NULL);
      return 1;
    }
    harness_sleep_ms(50);
  }
  return 0;
}

void reply_hold_release(reply_hold *p) {
  atomic_store(&p->armed, 0);
  atomic_store(&p->holding, 0);
  if (atomic_exchange(&p->refusing, 0)) {
    cr_assert(client_reconnected(p), "relay: the client did not connect again in 10 s");
    return;
  }
  if (!p->requests) return;
  atomic_store(&p->close_dropping, 1);
  for (int waited = 0; atomic_load(&p->close_dropping) && waited < 5000; waited += 10)
    usleep(10 * 1000);
  cr_assert(!atomic_load(&p->close_dropping), "relay: the held connection was not closed in 5 s");
  cr_assert(client_reconnected(p), "relay: the client did not connect again in 10 s");
}

int reply_hold_holding(reply_hold *p) { return atomic_load(&p->holding); }

/* Stops the relay (its connections closed) and frees it. */
static void stop_relay(reply_hold *p) {
  atomic_store(&p->stop, 1);
  pthread_join(p->thread, NULL);
  close(p->listen_fd);
  free(p);
}

int reply_hold_count_on(harness *h, int r, const char *prefix, const char *suffix) {
  dist_client *c = harness_client_rank(h, r, 5000);
  dist_tensor **list = NULL;
  int n = 0, found = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0, "listing rank %d: %s", r, dist_errmsg(c));
  for (int i = 0; i < n; i++) {
    const char *name = dist_tensor_name(list[i]);
    size_t len = strlen(name), sl = strlen(suffix);
    found += strncmp(name, prefix, strlen(prefix)) == 0 && len >= sl &&
             strcmp(name + len - sl, suffix) == 0;
  }
  dist_tensor_list_free(list, n);
  dist_close(c);
  return found;
}

int reply_hold_invocations_on(harness *h, int r) {
  char *m = harness_metrics(h, r);
  double n = harness_metric_sample(m, "distd_invocations_kept");
  free(m);
  cr_assert_geq(n, 0, "rank %d's /metrics has no distd_invocations_kept", r);
  return (int)n;
}

reply_hold *reply_hold_cluster(harness *h, int n, int r, long timeout_ms, dist_client **c) {
  return reply_hold_cluster_with(h, n, r, timeout_ms, NULL, c);
}

reply_hold *reply_hold_cluster_with(harness *h, int n, int r, long timeout_ms,
                                    const char *const *extra_args, dist_client **c) {
  harness_start(h, n, extra_args);
  reply_hold *p = start_relay(h, r);
  *c = p->client = harness_client_of(p->cluster_file, timeout_ms);
  return p;
}

const char *reply_hold_cluster_file(const reply_hold *p) { return p->cluster_file; }

int reply_hold_calls_seen(reply_hold *p) { return atomic_load(&p->seen); }

void reply_hold_cluster_stop(harness *h, reply_hold *p, dist_client *c) {
  dist_close(c);
  stop_relay(p);
  harness_stop_if_started(h);
}
