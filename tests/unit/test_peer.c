/* The peer data plane with real sockets on loopback: several distd_peers
 * instances in this process, each with its own event loop thread. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "peer_fixture.h"
#include "peer_internal.h" /* planting a kept-aside frame */
#include "subop.h"

static uint8_t *pattern(size_t n, unsigned seed) {
  uint8_t *b = malloc(n ? n : 1);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    b[i] = (uint8_t)(s >> 16);
  }
  return b;
}

static int64_t in_ms(int64_t ms) { return distd_now_ms() + ms; }

/* Rank a sends n bytes to rank b and b to a, under one op id. */
static void exchange(peer_fixture *f, uint64_t op, size_t n) {
  uint8_t *s0 = pattern(n, 1), *s1 = pattern(n, 2);
  uint8_t *r0 = calloc(1, n ? n : 1), *r1 = calloc(1, n ? n : 1);
  distd_xfer *x0 = distd_xfer_new(f->r[0].peers, op);
  distd_xfer *x1 = distd_xfer_new(f->r[1].peers, op);
  distd_xfer_recv(x0, 1, 5, r0, n);
  distd_xfer_recv(x1, 0, 5, r1, n);
  distd_xfer_send(x0, 1, 5, s0, n);
  distd_xfer_send(x1, 0, 5, s1, n);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(x0, in_ms(30000), &eb), 0, "%zu bytes: %s", n, eb.msg);
  cr_assert_eq(distd_xfer_wait(x1, in_ms(30000), &eb), 0, "%zu bytes: %s", n, eb.msg);
  cr_assert_eq(memcmp(r0, s1, n), 0, "rank 0 got rank 1's %zu bytes", n);
  cr_assert_eq(memcmp(r1, s0, n), 0, "rank 1 got rank 0's %zu bytes", n);
  distd_xfer_free(x0);
  distd_xfer_free(x1);
  free(s0), free(s1), free(r0), free(r1);
}

/* Throughput for the log only (tests never assert a time): one way, rank 0
 * to rank 1, buffers prepared outside the timed part. */
static void fix_timed_exchange(peer_fixture *f, size_t n, int reps) {
  uint8_t *src = pattern(n, 9), *dst = malloc(n);
  int64_t t0 = distd_now_ms();
  for (int i = 0; i < reps; i++) {
    uint64_t op = 5000 + (uint64_t)i;
    distd_xfer *s = distd_xfer_new(f->r[0].peers, op), *r = distd_xfer_new(f->r[1].peers, op);
    distd_xfer_recv(r, 0, 0, dst, n);
    distd_xfer_send(s, 1, 0, src, n);
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_assert_eq(distd_xfer_wait(s, in_ms(30000), &eb), 0, "%s", eb.msg);
    cr_assert_eq(distd_xfer_wait(r, in_ms(30000), &eb), 0, "%s", eb.msg);
    distd_xfer_free(s), distd_xfer_free(r);
  }
  double sec = (double)(distd_now_ms() - t0) / 1000.0;
  cr_assert_eq(memcmp(src, dst, n), 0);
  cr_log_info("%zu bytes x %d one way: %.3f s, %.2f GiB/s", n, reps, sec,
              (double)n * reps / (1 << 30) / (sec > 0 ? sec : 1e-9));
  free(src), free(dst);
}

Test(peer, two_ranks_connect_both_ways) {
  peer_fixture f;
  fix_setup(&f, 2);
  distd_peer_stats st;
  distd_peers_get_stats(f.r[0].peers, 1, &st);
  cr_assert(st.connected && st.out_up && st.in_up);
  cr_assert_eq(distd_peers_rank(f.r[1].peers), 1);
  cr_assert_eq(distd_peers_world_size(f.r[1].peers), 2);
  fix_teardown(&f);
}

Test(peer, four_ranks_connect_and_report_rtt) {
  peer_fixture f;
  fix_setup(&f, 4);
  /* Until the first PONG (a PING each PING_MS; bounded, where a fixed
   * 1.3 s sleep was a race on a loaded host). */
  distd_peer_stats st;
  for (int64_t end = in_ms(10000); distd_now_ms() < end; usleep(20000)) {
    distd_peers_get_stats(f.r[2].peers, 3, &st);
    if (st.rtt_seconds > 0) break;
  }
  cr_assert(st.rtt_seconds > 0 && st.rtt_seconds < 1.0, "rtt %g", st.rtt_seconds);
  fix_teardown(&f);
}

/* What the kernel reports for the outbound socket of rank 0 to rank 1. */
static void expect_congestion(peer_fixture *f, const char *want) {
  distd_peer_stats st;
  distd_peers_get_stats(f->r[0].peers, 1, &st);
  cr_assert_str_eq(st.congestion, want);
}

Test(peer, sockets_use_the_configured_congestion_control) {
  peer_fixture f;
  fix_prepare(&f, 2);
  f.congestion = "reno";
  fix_start_all(&f);
  cr_assert(fix_wait_connected(&f, 10000), "ranks did not connect");
  expect_congestion(&f, "reno");
  exchange(&f, 1, 1 << 20);
  fix_teardown(&f);
}

Test(peer, no_congestion_control_keeps_the_system_default) {
  char sys[32] = "";
  FILE *fp = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
  cr_assert(fp && fgets(sys, sizeof sys, fp));
  fclose(fp);
  sys[strcspn(sys, "\n")] = 0;
  peer_fixture f;
  fix_setup(&f, 2);
  expect_congestion(&f, sys);
  fix_teardown(&f);
}

static long read_core_sysctl(const char *name) {
  char path[96];
  long v = -1;
  snprintf(path, sizeof path, "/proc/sys/net/core/%s", name);
  FILE *fp = fopen(path, "r");
  cr_assert(fp, "%s", path);
  cr_assert_eq(fscanf(fp, "%ld", &v), 1);
  fclose(fp);
  return v;
}

/* The third value of net.ipv4.tcp_wmem or tcp_rmem: autotuning's ceiling. */
static long tcp_mem_max(const char *name) {
  char path[96];
  long lo, mid, hi = -1;
  snprintf(path, sizeof path, "/proc/sys/net/ipv4/%s", name);
  FILE *fp = fopen(path, "r");
  cr_assert(fp, "%s", path);
  cr_assert_eq(fscanf(fp, "%ld %ld %ld", &lo, &mid, &hi), 3);
  fclose(fp);
  return hi;
}

/* Linux doubles what is asked (for its bookkeeping), after capping it at
 * net.core.wmem_max / rmem_max. */
static int kernel_buffer(long asked, long max) { return (int)(2 * (asked < max ? asked : max)); }

Test(peer, sockets_get_the_configured_buffer_sizes) {
  peer_fixture f;
  fix_prepare(&f, 2);
  f.socket_buffer = 1 << 20;
  fix_start_all(&f);
  cr_assert(fix_wait_connected(&f, 10000), "ranks did not connect");
  distd_peer_stats st;
  distd_peers_get_stats(f.r[0].peers, 1, &st);
  cr_assert_eq(st.send_buffer, kernel_buffer(1 << 20, read_core_sysctl("wmem_max")));
  cr_assert_eq(st.receive_buffer, kernel_buffer(1 << 20, read_core_sysctl("rmem_max")));
  exchange(&f, 1, 4 << 20);
  fix_teardown(&f);
}

Test(peer, no_buffer_size_leaves_the_kernel_autotuning) {
  peer_fixture f;
  fix_setup(&f, 2);
  distd_peer_stats st;
  distd_peers_get_stats(f.r[0].peers, 1, &st);
  exchange(&f, 1, 16 << 20);
  distd_peers_get_stats(f.r[0].peers, 1, &st);
  /* Autotuning keeps each socket within net.ipv4.tcp_wmem / tcp_rmem. */
  cr_assert(st.send_buffer > 0 && st.send_buffer <= tcp_mem_max("tcp_wmem"), "%d",
            st.send_buffer);
  cr_assert(st.receive_buffer > 0 && st.receive_buffer <= tcp_mem_max("tcp_rmem"), "%d",
            st.receive_buffer);
  fix_teardown(&f);
}

Test(peer, unknown_congestion_control_is_refused_at_start) {
  peer_fixture f;
  fix_prepare(&f, 1);
  distd_peers_opts o = {.rank = 0, .world_size = 1, .members = f.members,
                        .cluster_id = "test", .congestion = "no-such-cc"};
  struct event_base *base = event_base_new();
  distd_peers *p = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_neq(distd_peers_start(&p, base, &o, &eb), 0);
  cr_assert_null(p);
  cr_assert(strstr(eb.msg, "peer_congestion 'no-such-cc'") && strstr(eb.msg, "reno"),
            "%s", eb.msg);
  event_base_free(base);
}

Test(peer, exchanges_0_1_1MiB_and_64MiB_intact) {
  peer_fixture f;
  fix_setup(&f, 2);
  size_t sizes[] = {0, 1, 1000, 1 << 20, 64 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) exchange(&f, 100 + i, sizes[i]);
  fix_timed_exchange(&f, 64 << 20, 4);
  fix_timed_exchange(&f, 1 << 20, 64);
  distd_peer_stats st;
  distd_peers_get_stats(f.r[0].peers, 1, &st);
  cr_assert_geq(st.bytes_sent, 5ull * (64 << 20));
  cr_assert_geq(st.bytes_received, 1ull * (64 << 20));
  fix_teardown(&f);
}

Test(peer, send_to_self_is_a_copy) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t *src = pattern(4096, 3), dst[4096];
  distd_xfer *x = distd_xfer_new(f.r[1].peers, 9);
  distd_xfer_send(x, 1, 0, src, 4096);
  distd_xfer_recv(x, 1, 0, dst, 4096);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(x, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(src, dst, 4096), 0);
  distd_xfer_free(x);
  x = distd_xfer_new(f.r[1].peers, 10);
  distd_xfer_send(x, 1, 0, src, 16);
  eb = (dist_errbuf)DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(x, in_ms(5000), &eb), DIST_EINVAL);
  cr_assert(strstr(eb.msg, "no matching receive"), "%s", eb.msg);
  distd_xfer_free(x);
  free(src);
  fix_teardown(&f);
}

Test(peer, recv_any_returns_a_malloced_copy) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t *src = pattern(777, 4);
  void *got = NULL, *early = NULL;
  size_t got_len = 0, early_len = 0;
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 11), *r = distd_xfer_new(f.r[1].peers, 11);
  distd_xfer_send(s, 1, 1, src, 777);
  distd_xfer_send(s, 1, 2, src, 5);
  distd_xfer_recv_any(r, 0, 1, &got, &got_len, 0);
  usleep(100 * 1000); /* tag 2 arrives before its receive */
  distd_xfer_recv_any(r, 0, 2, &early, &early_len, 0);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(got_len, 777);
  cr_assert_eq(memcmp(got, src, 777), 0);
  cr_assert_eq(early_len, 5);
  cr_assert_eq(memcmp(early, src, 5), 0);
  free(got), free(early), free(src);
  distd_xfer_free(s), distd_xfer_free(r);
  fix_teardown(&f);
}

/* ---- many transfers at once ---- */

typedef struct worker {
  peer_fixture *f;
  int rank, thread, ops;
  int failures;
  char msg[512];
} worker;

/* Each op: every rank sends a distinct 64 KiB + op-dependent block to every
 * other rank and checks what it gets back. */
static void *worker_main(void *arg) {
  worker *w = arg;
  peer_fixture *f = w->f;
  int n = f->n;
  for (int k = 0; k < w->ops; k++) {
    uint64_t op = 1000000u * (uint64_t)(w->thread + 1) + (uint64_t)k;
    size_t len = 65536 + (size_t)k * 13;
    uint8_t *out[FIX_MAX], *in[FIX_MAX];
    distd_xfer *x = distd_xfer_new(f->r[w->rank].peers, op);
    for (int j = 0; j < n; j++) {
      out[j] = pattern(len, (unsigned)(op * 31 + (uint64_t)w->rank * 7 + (uint64_t)j));
      in[j] = malloc(len);
      if (j == w->rank) continue;
      distd_xfer_recv(x, j, 3, in[j], len);
      distd_xfer_send(x, j, 3, out[j], len);
    }
    dist_errbuf eb = DIST_ERRBUF_INIT;
    if (distd_xfer_wait(x, in_ms(60000), &eb) != 0) {
      w->failures++;
      snprintf(w->msg, sizeof w->msg, "%s", eb.msg);
    }
    for (int j = 0; j < n; j++) {
      if (j != w->rank && !w->failures) {
        uint8_t *want = pattern(len, (unsigned)(op * 31 + (uint64_t)j * 7 + (uint64_t)w->rank));
        if (memcmp(want, in[j], len) != 0) {
          w->failures++;
          snprintf(w->msg, sizeof w->msg, "op %llu: bytes from rank %d differ",
                   (unsigned long long)op, j);
        }
        free(want);
      }
      free(out[j]), free(in[j]);
    }
    distd_xfer_free(x);
  }
  return NULL;
}

Test(peer, many_concurrent_xfers_from_several_threads) {
  peer_fixture f;
  fix_setup(&f, 4);
  enum { THREADS = 3, OPS = 20 };
  worker w[4][THREADS];
  pthread_t t[4][THREADS];
  for (int r = 0; r < 4; r++)
    for (int k = 0; k < THREADS; k++) {
      w[r][k] = (worker){.f = &f, .rank = r, .thread = k, .ops = OPS};
      pthread_create(&t[r][k], NULL, worker_main, &w[r][k]);
    }
  for (int r = 0; r < 4; r++)
    for (int k = 0; k < THREADS; k++) {
      pthread_join(t[r][k], NULL);
      cr_assert_eq(w[r][k].failures, 0, "rank %d thread %d: %s", r, k, w[r][k].msg);
    }
  fix_teardown(&f);
}

/* ---- data before its receive, and backpressure ---- */

Test(peer, data_sent_before_recv_is_kept_and_copied) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t *src = pattern(300000, 5), *dst = malloc(300000);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 20);
  distd_xfer_send(s, 1, 0, src, 300000);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  usleep(50 * 1000);
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 20);
  distd_xfer_recv(r, 0, 0, dst, 300000);
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(src, dst, 300000), 0);
  distd_xfer_free(s), distd_xfer_free(r);
  free(src), free(dst);
  fix_teardown(&f);
}

/* A large frame whose receive is not posted waits in the socket for a
 * while (HOLD_MS) rather than being copied aside at once; a frame behind
 * it on the same connection, for an op posted first, must still arrive
 * soon: the held one is kept aside once its time is up. */
Test(peer, an_early_large_frame_holds_up_the_frames_behind_it_only_briefly) {
  peer_fixture f;
  fix_setup(&f, 2);
  size_t big = 1 << 20, small = 1000;
  uint8_t *a = pattern(big, 11), *b = pattern(small, 12);
  uint8_t *ra = malloc(big), rb[1000];
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 21);
  distd_xfer_send(s, 1, 0, a, big);
  distd_xfer *s2 = distd_xfer_new(f.r[0].peers, 22);
  distd_xfer_send(s2, 1, 0, b, small);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(s2, in_ms(5000), &eb), 0, "%s", eb.msg);
  int64_t t0 = distd_now_ms();
  distd_xfer *r2 = distd_xfer_new(f.r[1].peers, 22);
  distd_xfer_recv(r2, 0, 0, rb, small);
  cr_assert_eq(distd_xfer_wait(r2, in_ms(5000), &eb), 0, "the frame behind: %s", eb.msg);
  int64_t waited = distd_now_ms() - t0;
  cr_expect_lt(waited, 1000, "the frame behind a held one waited %lld ms", (long long)waited);
  cr_assert_eq(memcmp(rb, b, small), 0);
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 21);
  distd_xfer_recv(r, 0, 0, ra, big);
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), 0, "the held frame: %s", eb.msg);
  cr_assert_eq(memcmp(ra, a, big), 0, "the held frame arrived changed");
  distd_xfer_free(s), distd_xfer_free(s2), distd_xfer_free(r), distd_xfer_free(r2);
  free(a), free(b), free(ra);
  fix_teardown(&f);
}

typedef struct sender_args {
  distd_peers *p;
  int count;
  size_t len;
  uint8_t *buf;
  int rc;
} sender_args;

static void *sender_main(void *arg) {
  sender_args *a = arg;
  for (int k = 0; k < a->count; k++) {
    distd_xfer *x = distd_xfer_new(a->p, 300 + (uint64_t)k);
    distd_xfer_send(x, 1, 0, a->buf + (size_t)k * a->len, a->len);
    dist_errbuf eb = DIST_ERRBUF_INIT;
    if (distd_xfer_wait(x, in_ms(20000), &eb) != 0) a->rc = -1;
    distd_xfer_free(x);
  }
  return NULL;
}

Test(peer, past_the_unexpected_limit_the_sender_is_held_back) {
  peer_fixture f;
  fix_prepare(&f, 2);
  f.unexpected_limit = 256 * 1024;
  fix_start_all(&f);
  cr_assert(fix_wait_connected(&f, 10000));
  enum { COUNT = 16 };
  size_t len = 200 * 1024; /* only one fits aside at a time */
  sender_args a = {.p = f.r[0].peers, .count = COUNT, .len = len,
                   .buf = pattern(COUNT * len, 6)};
  pthread_t t;
  pthread_create(&t, NULL, sender_main, &a);
  usleep(300 * 1000);
  distd_peer_stats st;
  distd_peers_get_stats(f.r[1].peers, 0, &st);
  cr_assert_lt(st.bytes_received, (uint64_t)COUNT * len, "receiver read everything");
  uint8_t *dst = malloc(COUNT * len);
  for (int k = 0; k < COUNT; k++) {
    distd_xfer *x = distd_xfer_new(f.r[1].peers, 300 + (uint64_t)k);
    distd_xfer_recv(x, 0, 0, dst + (size_t)k * len, len);
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_assert_eq(distd_xfer_wait(x, in_ms(20000), &eb), 0, "op %d: %s", k, eb.msg);
    distd_xfer_free(x);
  }
  pthread_join(t, NULL);
  cr_assert_eq(a.rc, 0);
  cr_assert_eq(memcmp(dst, a.buf, COUNT * len), 0);
  free(dst), free(a.buf);
  fix_teardown(&f);
}

Test(peer, kept_aside_data_is_freed_with_the_peers) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t *src = pattern(100000, 7);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 30);
  distd_xfer_send(s, 1, 0, src, 100000);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  distd_xfer_free(s);
  usleep(100 * 1000);
  free(src);
  fix_teardown(&f); /* ASan checks nothing leaked */
}

/* A frame still arriving when its op fails (here: a receive of another
 * length) is dropped once whole, instead of holding its bytes against the
 * kept-aside limit for good. The frame is planted as the reader would
 * have left it halfway, so that the order of events is certain. */
Test(peer, a_kept_aside_frame_of_a_failed_op_is_dropped_once_whole) {
  peer_fixture f;
  fix_setup(&f, 2);
  distd_peers *p = f.r[1].peers;
  unexpected *u = calloc(1, sizeof *u);
  *u = (unexpected){.op_id = 45, .src = 0, .tag = 0, .data = malloc(100), .len = 100};
  pthread_mutex_lock(&p->mu);
  dlist_push(&p->unexpected, &u->link);
  p->unexpected_bytes += u->len;
  pthread_mutex_unlock(&p->mu);
  uint8_t dst[50];
  distd_xfer *r = distd_xfer_new(p, 45);
  distd_xfer_recv(r, 0, 0, dst, sizeof dst);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), DIST_EPROTO, "%s", eb.msg);
  distd_xfer_free(r);
  pthread_mutex_lock(&p->mu);
  u->complete = 1; /* what finish_payload does with the last byte */
  distd_unexpected_finished(p, u);
  size_t kept = p->unexpected_bytes;
  pthread_mutex_unlock(&p->mu);
  cr_assert_eq(kept, 0, "%zu bytes of a failed op still kept aside", kept);
  fix_teardown(&f);
}

/* Plants a whole frame of len bytes from src for op, kept aside since
 * kept_ms, as the reader leaves one. */
static unexpected *plant_kept(distd_peers *p, uint64_t op, int src, size_t len, int64_t kept_ms,
                              int complete) {
  unexpected *u = calloc(1, sizeof *u);
  *u = (unexpected){.op_id = op, .src = src, .data = calloc(1, len), .len = len,
                    .kept_ms = kept_ms, .complete = complete};
  pthread_mutex_lock(&p->mu);
  dlist_push(&p->unexpected, &u->link);
  p->unexpected_bytes += len;
  pthread_mutex_unlock(&p->mu);
  return u;
}

static size_t kept_bytes(distd_peers *p) {
  pthread_mutex_lock(&p->mu);
  size_t n = p->unexpected_bytes;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* n connected ranks whose kept-aside frames expire after age_ms. */
static void setup_with_max_age(peer_fixture *f, int n, int64_t age_ms) {
  fix_prepare(f, n);
  f->unexpected_max_age_ms = age_ms;
  fix_start_all(f);
  cr_assert(fix_wait_connected(f, 10000), "%d ranks did not connect within 10 s", n);
}

/* One sweep at now_ms, as the loop's timer makes it. */
static void sweep(distd_peers *p, int64_t now_ms) {
  pthread_mutex_lock(&p->mu);
  distd_unexpected_expire(p, now_ms);
  pthread_mutex_unlock(&p->mu);
}

/* The frames from src dropped so far, counted and in bytes. */
static void expect_dropped(distd_peers *p, int src, uint64_t frames, uint64_t bytes) {
  distd_peer_stats st;
  distd_peers_get_stats(p, src, &st);
  /* cr_expect: a wrong count on one rank still shows the others' */
  cr_expect_eq(st.unexpected_expired, frames, "from rank %d: %llu frames dropped", src,
               (unsigned long long)st.unexpected_expired);
  cr_expect_eq(st.unexpected_expired_bytes, bytes, "from rank %d: %llu bytes dropped", src,
               (unsigned long long)st.unexpected_expired_bytes);
}

/* The sweep drops whole frames past the age only: a young one, and an
 * old one still arriving (a reader writes into it), stay. */
Test(peer, the_sweep_drops_whole_frames_older_than_the_age_only) {
  peer_fixture f;
  setup_with_max_age(&f, 2, 60000); /* the loop's own sweeps, if one comes, do the same */
  distd_peers *p = f.r[1].peers;
  int64_t now = distd_now_ms();
  plant_kept(p, 60, 0, 100, now - 120000, 1);
  unexpected *arriving = plant_kept(p, 61, 0, 200, now - 120000, 0);
  plant_kept(p, 62, 0, 400, now - 1000, 1);
  sweep(p, now);
  cr_assert_eq(kept_bytes(p), 600, "kept %zu bytes, expected the 200 + 400 not dropped",
               kept_bytes(p));
  expect_dropped(p, 0, 1, 100);
  pthread_mutex_lock(&p->mu);
  arriving->complete = 1; /* whole now: the next sweep takes it */
  pthread_mutex_unlock(&p->mu);
  sweep(p, now);
  cr_assert_eq(kept_bytes(p), 400);
  expect_dropped(p, 0, 2, 300);
  fix_teardown(&f);
}

/* More frames past the age than the log names one by one: every one is
 * still dropped and counted, by the peer that sent it. */
Test(peer, a_sweep_drops_every_old_frame_however_many) {
  peer_fixture f;
  setup_with_max_age(&f, 3, 60000);
  distd_peers *p = f.r[2].peers;
  int64_t now = distd_now_ms();
  enum { FRAMES = 30 };
  for (int k = 0; k < FRAMES; k++) plant_kept(p, 80 + (uint64_t)k, k % 2, 10, now - 90000, 1);
  sweep(p, now);
  cr_assert_eq(kept_bytes(p), 0, "%zu bytes still kept aside", kept_bytes(p));
  for (int src = 0; src < 2; src++) expect_dropped(p, src, FRAMES / 2, FRAMES / 2 * 10);
  fix_teardown(&f);
}

/* A receive posted after its frame was dropped fails at once, naming the
 * sender, the op and how long the frame waited, not after the deadline;
 * a receive of another tag of that op is not failed by it. */
Test(peer, a_receive_posted_after_its_frame_was_dropped_fails_at_once) {
  peer_fixture f;
  setup_with_max_age(&f, 2, 60000);
  distd_peers *p = f.r[1].peers;
  int64_t now = distd_now_ms();
  plant_kept(p, 90, 0, 16, now - 70000, 1);
  sweep(p, now);
  cr_assert_eq(kept_bytes(p), 0, "the planted frame was not dropped");
  uint8_t got[16];
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_xfer *other = distd_xfer_new(p, 90);
  distd_xfer_recv(other, 0, 1, got, sizeof got);
  cr_expect_eq(distd_xfer_wait(other, in_ms(300), &eb), DIST_ETIMEDOUT);
  cr_expect(strstr(eb.msg, "timed out waiting for rank 0"), "tag 1 was never sent: %s", eb.msg);
  distd_xfer_free(other);
  int64_t t0 = distd_now_ms();
  distd_xfer *r = distd_xfer_new(p, 90);
  distd_xfer_recv(r, 0, 0, got, sizeof got);
  eb = (dist_errbuf)DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(10000), &eb), DIST_ETIMEDOUT, "%s", eb.msg);
  int64_t took = distd_now_ms() - t0;
  cr_expect(strstr(eb.msg, "the frame rank 0 sent for op 90 (tag 0) was dropped after waiting "
                           "70.0 s for this receive (peer_unexpected_max_age)"), "%s", eb.msg);
  cr_expect_lt(took, 1000, "failed after %lld ms of a 10 s deadline", (long long)took);
  distd_xfer_free(r);
  fix_teardown(&f);
}

/* Through the loop's timer: a frame whose receive never comes is dropped
 * once it is older than the age, not before; one whose receive comes in
 * time is delivered intact. */
Test(peer, a_kept_aside_frame_without_its_receive_is_dropped_after_the_age) {
  peer_fixture f;
  setup_with_max_age(&f, 2, 1500);
  uint8_t *orphan = pattern(1000, 21), *kept = pattern(3000, 22), got[3000];
  int64_t sent_ms = distd_now_ms();
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 70);
  distd_xfer_send(s, 1, 0, orphan, 1000);
  distd_xfer_send(s, 1, 1, kept, 3000);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  distd_xfer_free(s);
  distd_peers *p = f.r[1].peers;
  for (int64_t end = in_ms(1000); kept_bytes(p) < 4000 && distd_now_ms() < end;) usleep(5000);
  cr_assert_eq(kept_bytes(p), 4000, "both frames kept aside");
  distd_xfer *r = distd_xfer_new(p, 70);
  distd_xfer_recv(r, 0, 1, got, sizeof got);
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(got, kept, sizeof got), 0, "the frame received in time is intact");
  distd_xfer_free(r);
  distd_peer_stats st = {0};
  for (int64_t end = in_ms(5000); distd_now_ms() < end; usleep(20000)) {
    distd_peers_get_stats(p, 0, &st);
    if (st.unexpected_expired) break;
  }
  int64_t after_ms = distd_now_ms() - sent_ms;
  cr_assert_eq(st.unexpected_expired, 1, "the frame without a receive was not dropped in 5 s");
  cr_assert_eq(st.unexpected_expired_bytes, 1000);
  cr_assert_geq(after_ms, 1500, "dropped %lld ms after it was sent", (long long)after_ms);
  cr_assert_eq(kept_bytes(p), 0, "%zu bytes still kept aside", kept_bytes(p));
  free(orphan), free(kept);
  fix_teardown(&f);
}

/* ---- errors ---- */

Test(peer, wrong_length_fails_with_eproto_naming_both_ranks) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t src[100] = {0}, dst[200];
  /* Receive posted first. */
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 40);
  distd_xfer_recv(r, 0, 0, dst, 200);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 40);
  distd_xfer_send(s, 1, 0, src, 100);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), DIST_EPROTO);
  cr_assert(strstr(eb.msg, "rank 0 sent 100 bytes") && strstr(eb.msg, "rank 1 expects 200"),
            "%s", eb.msg);
  distd_xfer_free(r), distd_xfer_free(s);
  /* Data kept aside first. */
  s = distd_xfer_new(f.r[0].peers, 41);
  distd_xfer_send(s, 1, 0, src, 100);
  usleep(100 * 1000);
  r = distd_xfer_new(f.r[1].peers, 41);
  distd_xfer_recv(r, 0, 0, dst, 50);
  eb = (dist_errbuf)DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), DIST_EPROTO);
  cr_assert(strstr(eb.msg, "rank 0 sent 100 bytes") && strstr(eb.msg, "rank 1 expects 50"),
            "%s", eb.msg);
  distd_xfer_free(r), distd_xfer_free(s);
  fix_teardown(&f);
}

Test(peer, timeout_names_the_rank_waited_on) {
  peer_fixture f;
  fix_setup(&f, 3);
  uint8_t dst[10];
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 50);
  distd_xfer_recv(r, 2, 0, dst, 10);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t t0 = distd_now_ms();
  cr_assert_eq(distd_xfer_wait(r, in_ms(300), &eb), DIST_ETIMEDOUT);
  cr_assert_geq(distd_now_ms() - t0, 290);
  cr_assert_str_eq(eb.msg, "timed out waiting for rank 2");
  distd_xfer_free(r);
  fix_teardown(&f);
}

Test(peer, send_to_a_peer_that_is_down_times_out_naming_it) {
  peer_fixture f;
  fix_prepare(&f, 2);
  fix_start_rank(&f, 0);
  uint8_t src[10] = {0};
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 51);
  distd_xfer_send(s, 1, 0, src, 10);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(300), &eb), DIST_ETIMEDOUT);
  cr_assert(strstr(eb.msg, "timed out waiting for rank 1 (rank 1 at 127.0.0.1:"), "%s", eb.msg);
  cr_assert(strstr(eb.msg, "not connected"), "%s", eb.msg);
  distd_xfer_free(s);
  /* The first dial's refusal (bounded: the loop may not have dialled
   * within the send's 300 ms on a loaded host). */
  distd_peer_stats st;
  for (int64_t end = in_ms(10000); distd_now_ms() < end; usleep(10000)) {
    distd_peers_get_stats(f.r[0].peers, 1, &st);
    if (st.last_error[0]) break;
  }
  cr_assert(strstr(st.last_error, "connection refused"), "%s", st.last_error);
  fix_teardown(&f);
}

Test(peer, send_waits_for_a_peer_that_comes_up) {
  peer_fixture f;
  fix_prepare(&f, 2);
  fix_start_rank(&f, 0);
  uint8_t *src = pattern(5000, 8), dst[5000];
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 52);
  distd_xfer_send(s, 1, 0, src, 5000);
  usleep(150 * 1000);
  fix_start_rank(&f, 1);
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 52);
  distd_xfer_recv(r, 0, 0, dst, 5000);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(r, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(src, dst, 5000), 0);
  distd_xfer_free(s), distd_xfer_free(r);
  free(src);
  fix_teardown(&f);
}

Test(peer, hello_from_another_cluster_is_rejected_with_the_reason) {
  peer_fixture f;
  fix_prepare(&f, 2);
  snprintf(f.cluster_id[1], sizeof f.cluster_id[1], "other");
  fix_start_all(&f);
  /* Until both sides have refused once (bounded: a loaded host is slow). */
  distd_peer_stats st, acceptor;
  for (int64_t end = in_ms(10000); distd_now_ms() < end; usleep(10000)) {
    distd_peers_get_stats(f.r[0].peers, 1, &st);
    distd_peers_get_stats(f.r[1].peers, 0, &acceptor);
    if (strstr(st.last_error, "cluster id") && strstr(acceptor.last_error, "cluster id")) break;
  }
  cr_assert_not(st.connected);
  /* Rank 0 both dials rank 1 (and is rejected) and rejects rank 1's dial:
   * either way the reason names both cluster ids. */
  cr_assert(strstr(st.last_error, "cluster id 'test' differs from this daemon's 'other'") ||
                strstr(st.last_error, "cluster id 'other' differs from this daemon's 'test'"),
            "%s", st.last_error);
  cr_assert(strstr(acceptor.last_error, "cluster id"), "acceptor side: %s", acceptor.last_error);
  cr_assert_eq(distd_peers_connected_count(f.r[0].peers), 0);
  fix_teardown(&f);
}

Test(peer, abort_fails_the_op_on_the_receiver_posted_before_or_after) {
  peer_fixture f;
  fix_setup(&f, 3);
  uint8_t dst[8];
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 60);
  distd_xfer_recv(r, 2, 0, dst, 8);
  distd_xfer *a = distd_xfer_new(f.r[0].peers, 60);
  int ranks[] = {0, 1, 2};
  distd_xfer_abort(a, ranks, 3, "count differs");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t t0 = distd_now_ms();
  cr_assert_eq(distd_xfer_wait(r, in_ms(10000), &eb), DIST_ECANCELED);
  cr_assert_lt(distd_now_ms() - t0, 5000);
  cr_assert_str_eq(eb.msg, "rank 0 aborted op 60: count differs");
  usleep(100 * 1000);
  distd_xfer *late = distd_xfer_new(f.r[2].peers, 60);
  distd_xfer_recv(late, 1, 0, dst, 8);
  eb = (dist_errbuf)DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(late, in_ms(10000), &eb), DIST_ECANCELED);
  cr_assert_str_eq(eb.msg, "rank 0 aborted op 60: count differs");
  distd_xfer_free(r), distd_xfer_free(a), distd_xfer_free(late);
  fix_teardown(&f);
}

/* A receive on rank 1 of op_id, from rank 0: its code within wait_ms. */
static int recv_code(peer_fixture *f, uint64_t op_id, int64_t wait_ms, dist_errbuf *eb) {
  uint8_t dst[8];
  distd_xfer *r = distd_xfer_new(f->r[1].peers, op_id);
  distd_xfer_recv(r, 0, 0, dst, 8);
  int rc = distd_xfer_wait(r, in_ms(wait_ms), eb);
  distd_xfer_free(r);
  return rc;
}

/* Rank 0 aborts 300 ids newest first, each with its vote (as a trainer's
 * refused tape backward did, one OpAbort per id): rank 1 remembers them as
 * one range, steps included, so the oldest and the middle ones are not
 * pushed out of its ring of 256 by the newer; an id past the range, or a
 * step the range does not cover, is not aborted. */
Test(peer, aborts_of_consecutive_ids_are_remembered_as_one_range_with_their_steps) {
  peer_fixture f;
  fix_setup(&f, 2);
  int ranks[] = {0, 1};
  const uint64_t first = 7000, n = 300;
  for (uint64_t id = first + n; id-- > first;) {
    distd_abort_op(f.r[0].peers, id, ranks, 2, "plan refused");
    distd_abort_op(f.r[0].peers, distd_subop(id, DISTD_STEP_VOTE), ranks, 2, "plan refused");
  }
  usleep(500 * 1000); /* every ABORT frame is on rank 1 */
  const uint64_t told[] = {first, first + n / 2, distd_subop(first + 1, DISTD_STEP_VOTE),
                           distd_subop(first + n / 2, DISTD_STEP_RESHARD_LAYOUT)};
  for (size_t i = 0; i < sizeof told / sizeof told[0]; i++) {
    dist_errbuf eb = DIST_ERRBUF_INIT;
    int64_t t0 = distd_now_ms();
    cr_expect_eq(recv_code(&f, told[i], 10000, &eb), DIST_ECANCELED, "op %llu: %s",
                 (unsigned long long)told[i], eb.msg);
    cr_expect_lt(distd_now_ms() - t0, 2000, "op %llu waited", (unsigned long long)told[i]);
    cr_expect(strstr(eb.msg, "rank 0 aborted op") && strstr(eb.msg, "plan refused"), "%s",
              eb.msg);
  }
  const uint64_t untold[] = {first + n, first - 1, distd_subop(first + 2, DISTD_STEP_PUSH_BATCH)};
  for (size_t i = 0; i < sizeof untold / sizeof untold[0]; i++) {
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_expect_eq(recv_code(&f, untold[i], 200, &eb), DIST_ETIMEDOUT, "op %llu: %s",
                 (unsigned long long)untold[i], eb.msg);
  }
  fix_teardown(&f);
}

Test(peer, freed_peer_fails_waits_with_epeer_then_reconnects) {
  peer_fixture f;
  fix_setup(&f, 3);
  uint8_t *dst = malloc(64 << 20);
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 70);
  distd_xfer_recv(r, 0, 0, dst, 64 << 20);
  distd_xfer *other = distd_xfer_new(f.r[1].peers, 71);
  uint8_t small[4] = {1, 2, 3, 4}, got[4];
  distd_xfer_recv(other, 2, 0, got, 4); /* rank 2 is fine: must not fail */
  usleep(50 * 1000);
  int64_t t0 = distd_now_ms();
  fix_stop_rank(&f, 0);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(20000), &eb), DIST_EPEER);
  cr_assert_lt(distd_now_ms() - t0, 5000, "failure came after the loss, not the deadline");
  cr_assert(strstr(eb.msg, "peer rank 0 (127.0.0.1:") && strstr(eb.msg, ") lost: "), "%s", eb.msg);
  distd_xfer *s = distd_xfer_new(f.r[2].peers, 71);
  distd_xfer_send(s, 1, 0, small, 4);
  cr_assert_eq(distd_xfer_wait(other, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  distd_xfer_free(r), distd_xfer_free(other), distd_xfer_free(s);
  distd_peer_stats st;
  distd_peers_get_stats(f.r[1].peers, 0, &st);
  cr_assert_not(st.connected);
  /* The peer comes back on the same address. */
  fix_start_rank(&f, 0);
  cr_assert(fix_wait_connected(&f, 10000), "rank 0 was not reconnected");
  distd_peers_get_stats(f.r[1].peers, 0, &st);
  cr_assert_geq(st.reconnects, 1);
  free(dst);
  exchange(&f, 72, 4096);
  fix_teardown(&f);
}

Test(peer, sender_mid_transfer_fails_when_the_receiver_goes) {
  peer_fixture f;
  fix_setup(&f, 2);
  size_t len = 256u << 20; /* larger than the socket buffers: still in flight */
  uint8_t *src = calloc(1, len);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 80);
  distd_xfer_send(s, 1, 0, src, len);
  usleep(50 * 1000);
  fix_stop_rank(&f, 1);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(20000), &eb), DIST_EPEER);
  cr_assert(strstr(eb.msg, "peer rank 1"), "%s", eb.msg);
  distd_xfer_free(s);
  free(src);
  fix_teardown(&f);
}

Test(peer, wait_after_the_peers_are_freed_is_cancelled) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t dst[4];
  distd_xfer *r = distd_xfer_new(f.r[0].peers, 90);
  distd_xfer_recv(r, 1, 0, dst, 4);
  fix_stop_rank(&f, 0);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(r, in_ms(1000), &eb), DIST_ECANCELED);
  distd_xfer_free(r);
  fix_teardown(&f);
}

/* ---- the waiting thread drives the sockets (peer_internal.h) ---- */

typedef struct waiter {
  distd_xfer *x;
  int64_t deadline;
  int rc;
  int64_t took_ms;
  char msg[sizeof(dist_errbuf){0}.msg];
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t t0 = distd_now_ms();
  w->rc = distd_xfer_wait(w->x, w->deadline, &eb);
  w->took_ms = distd_now_ms() - t0;
  snprintf(w->msg, sizeof w->msg, "%s", eb.msg);
  return NULL;
}

/* Rank 1 has 8 threads waiting at once (one drives, the rest sleep): the
 * even ones on rank 0 and 2, the odd ones on rank 2 only. Rank 0 dies: the
 * even ones fail with EPEER at once, the odd ones still get rank 2's data,
 * which arrives only after the death. */
Test(peer, many_waiters_while_a_peer_dies) {
  peer_fixture f;
  fix_setup(&f, 3);
  enum { N = 8, LEN = 100000 };
  waiter w[N];
  pthread_t t[N];
  uint8_t *got0[N], *got2[N], *src[N];
  for (int i = 0; i < N; i++) {
    got0[i] = malloc(LEN), got2[i] = malloc(LEN), src[i] = pattern(LEN, 50 + (unsigned)i);
    w[i] = (waiter){.x = distd_xfer_new(f.r[1].peers, 600 + (uint64_t)i),
                    .deadline = in_ms(20000)};
    if (i % 2 == 0) distd_xfer_recv(w[i].x, 0, 0, got0[i], LEN);
    distd_xfer_recv(w[i].x, 2, 0, got2[i], LEN);
    pthread_create(&t[i], NULL, waiter_main, &w[i]);
  }
  usleep(100 * 1000);
  fix_stop_rank(&f, 0);
  usleep(200 * 1000);
  distd_xfer *s[N];
  for (int i = 0; i < N; i++) {
    s[i] = distd_xfer_new(f.r[2].peers, 600 + (uint64_t)i);
    distd_xfer_send(s[i], 1, 0, src[i], LEN);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    if (i % 2 == 0) {
      cr_assert_eq(w[i].rc, DIST_EPEER, "waiter %d: %d %s", i, w[i].rc, w[i].msg);
      cr_assert(strstr(w[i].msg, "peer rank 0"), "waiter %d: %s", i, w[i].msg);
      cr_assert_lt(w[i].took_ms, 5000, "waiter %d failed at the deadline", i);
    } else {
      cr_assert_eq(w[i].rc, 0, "waiter %d: %s", i, w[i].msg);
      cr_assert_eq(memcmp(got2[i], src[i], LEN), 0, "waiter %d's bytes", i);
    }
  }
  dist_errbuf eb = DIST_ERRBUF_INIT;
  for (int i = 0; i < N; i++) {
    cr_assert_eq(distd_xfer_wait(s[i], in_ms(5000), &eb), 0, "%s", eb.msg);
    distd_xfer_free(s[i]), distd_xfer_free(w[i].x);
    free(got0[i]), free(got2[i]), free(src[i]);
  }
  fix_teardown(&f);
}

/* The driver leaves once its own op is done; an op another thread still
 * waits on is then finished by the loop thread (or the next driver). */
Test(peer, a_waiter_is_served_after_the_driver_left) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t a_src[64] = {1}, b_src[70000], a_dst[64], b_dst[70000];
  memset(b_src, 7, sizeof b_src);
  distd_xfer *a = distd_xfer_new(f.r[1].peers, 700), *b = distd_xfer_new(f.r[1].peers, 701);
  distd_xfer_recv(a, 0, 0, a_dst, sizeof a_dst);
  distd_xfer_recv(b, 0, 0, b_dst, sizeof b_dst);
  waiter wa = {.x = a, .deadline = in_ms(10000)}, wb = {.x = b, .deadline = in_ms(10000)};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, waiter_main, &wa);
  pthread_create(&tb, NULL, waiter_main, &wb);
  usleep(50 * 1000);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 700);
  distd_xfer_send(s, 1, 0, a_src, sizeof a_src);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  pthread_join(ta, NULL);
  cr_assert_eq(wa.rc, 0, "%s", wa.msg);
  usleep(50 * 1000); /* b's bytes come once nobody may be driving */
  distd_xfer *s2 = distd_xfer_new(f.r[0].peers, 701);
  distd_xfer_send(s2, 1, 0, b_src, sizeof b_src);
  cr_assert_eq(distd_xfer_wait(s2, in_ms(5000), &eb), 0, "%s", eb.msg);
  pthread_join(tb, NULL);
  cr_assert_eq(wb.rc, 0, "%s", wb.msg);
  cr_assert_lt(wb.took_ms, 5000, "served by the deadline only");
  cr_assert_eq(memcmp(a_dst, a_src, sizeof a_src), 0);
  cr_assert_eq(memcmp(b_dst, b_src, sizeof b_src), 0);
  distd_xfer_free(s), distd_xfer_free(s2), distd_xfer_free(a), distd_xfer_free(b);
  fix_teardown(&f);
}

/* A deferred frame leaves with the next send to the same peer, or when its
 * sender waits: the receiver gets both, intact, in order of tags. */
Test(peer, deferred_sends_leave_with_the_next_send_or_the_wait) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint8_t *h = pattern(300, 61), *rows = pattern(50000, 62), *lone = pattern(10, 63);
  uint8_t h_dst[300], rows_dst[50000], lone_dst[10];
  distd_xfer *r = distd_xfer_new(f.r[1].peers, 800);
  distd_xfer_recv(r, 0, 0, h_dst, sizeof h_dst);
  distd_xfer_recv(r, 0, 1, rows_dst, sizeof rows_dst);
  distd_xfer_recv(r, 0, 2, lone_dst, sizeof lone_dst);
  distd_xfer *s = distd_xfer_new(f.r[0].peers, 800);
  distd_xfer_send_deferred(s, 1, 0, h, 300);
  distd_xfer_send(s, 1, 1, rows, 50000); /* takes the header along */
  distd_xfer_send_deferred(s, 1, 2, lone, 10); /* leaves at the wait */
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(s, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(r, in_ms(5000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(h_dst, h, 300), 0);
  cr_assert_eq(memcmp(rows_dst, rows, 50000), 0);
  cr_assert_eq(memcmp(lone_dst, lone, 10), 0);
  distd_xfer_free(s), distd_xfer_free(r);
  free(h), free(rows), free(lone);
  fix_teardown(&f);
}

/* Rank 0 announces a header (xfer k, as moe_scatter.c's hx) and sends 6 MiB
 * of rows (xfer d); only the first part leaves at once. With k marked
 * distd_xfer_then(k, d), the rest stays queued when k's wait ends: the
 * next wait on d writes it, and freeing d unwaited (the error path) still
 * lets the frame already started reach rank 1 whole. */
static void kept_writer_round(peer_fixture *f, uint64_t op, int wait_rows) {
  size_t n = 6u << 20;
  uint8_t *rows = pattern(n, 71), *got = calloc(1, n);
  uint8_t h0[16] = {1, 2, 3}, h1[16] = {4, 5, 6}, h0_at_1[16], h1_at_0[16];
  distd_xfer *r = distd_xfer_new(f->r[1].peers, op);
  distd_xfer_recv(r, 0, 0, h0_at_1, sizeof h0_at_1);
  distd_xfer_recv(r, 0, 1, got, n);
  distd_xfer_send(r, 0, 0, h1, sizeof h1);
  waiter w = {.x = r, .deadline = in_ms(20000)};
  pthread_t t;
  pthread_create(&t, NULL, waiter_main, &w);
  distd_xfer *k = distd_xfer_new(f->r[0].peers, op), *d = distd_xfer_new(f->r[0].peers, op);
  distd_xfer_send_deferred(k, 1, 0, h0, sizeof h0);
  distd_xfer_recv(k, 1, 0, h1_at_0, sizeof h1_at_0);
  distd_xfer_send(d, 1, 1, rows, n);
  distd_xfer_then(k, d);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(k, in_ms(20000), &eb), 0, "%s", eb.msg);
  if (wait_rows) cr_assert_eq(distd_xfer_wait(d, in_ms(20000), &eb), 0, "%s", eb.msg);
  distd_xfer_free(d);
  pthread_join(t, NULL);
  cr_assert_eq(w.rc, 0, "rank 1 (rows %s): %s", wait_rows ? "waited" : "freed", w.msg);
  cr_assert_eq(memcmp(h0_at_1, h0, sizeof h0), 0);
  cr_assert_eq(memcmp(h1_at_0, h1, sizeof h1), 0);
  cr_assert_eq(memcmp(got, rows, n), 0, "rows intact (%s)", wait_rows ? "waited" : "freed");
  distd_xfer_free(k), distd_xfer_free(r);
  free(rows), free(got);
}

Test(peer, a_kept_writer_sends_the_rest_with_its_next_wait_or_at_free) {
  peer_fixture f;
  fix_setup(&f, 2);
  kept_writer_round(&f, 900, 1);
  kept_writer_round(&f, 901, 0);
  fix_teardown(&f);
}

/* ---- reading ahead into the receive a driver most likely gets next ---- */

/* One frame for rank 1 to receive, posted by rank 0 in this order. */
typedef struct frame_out {
  distd_xfer *x;
  uint32_t tag;
  const uint8_t *buf;
  size_t len;
} frame_out;

/* Rank 1 waits on rx (and so drives its sockets) before rank 0 sends, so
 * each frame's header is read together with a guess at its receive. */
static void send_while_driving(distd_xfer *rx, const frame_out *out, int n) {
  waiter w = {.x = rx, .deadline = in_ms(10000)};
  pthread_t t;
  pthread_create(&t, NULL, waiter_main, &w);
  usleep(50 * 1000);
  for (int i = 0; i < n; i++) distd_xfer_send(out[i].x, 1, out[i].tag, out[i].buf, out[i].len);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  for (int i = 0; i < n; i++)
    if (i == 0 || out[i].x != out[i - 1].x)
      cr_assert_eq(distd_xfer_wait(out[i].x, in_ms(10000), &eb), 0, "%s", eb.msg);
  pthread_join(t, NULL);
  cr_assert_eq(w.rc, 0, "%s", w.msg);
}

/* The guess is the first receive posted from the sender; here the frames
 * come in the other order, so the first guess is wrong and its bytes must
 * still reach the right receive, and the second guess right. */
Test(peer, frames_in_another_order_than_posted_arrive_intact) {
  peer_fixture f;
  fix_setup(&f, 2);
  size_t n1 = 200000, n2 = 300000;
  uint8_t *a = pattern(n1, 31), *b = pattern(n2, 32), *ra = malloc(n1), *rb = malloc(n2);
  distd_xfer *rx = distd_xfer_new(f.r[1].peers, 40), *sx = distd_xfer_new(f.r[0].peers, 40);
  distd_xfer_recv(rx, 0, 1, ra, n1);
  distd_xfer_recv(rx, 0, 2, rb, n2);
  frame_out out[] = {{sx, 2, b, n2}, {sx, 1, a, n1}};
  send_while_driving(rx, out, 2);
  cr_assert_eq(memcmp(ra, a, n1), 0, "the receive guessed first arrived changed");
  cr_assert_eq(memcmp(rb, b, n2), 0, "the frame that came first arrived changed");
  distd_xfer_free(rx), distd_xfer_free(sx);
  free(a), free(b), free(ra), free(rb);
  fix_teardown(&f);
}

/* A frame of an op not posted yet comes before the one guessed: it is held
 * (HOLD_MS), then kept aside, from the spill buffer the wrong guess left,
 * and the guessed frame behind it still arrives. */
Test(peer, a_frame_of_another_op_before_the_guessed_one_is_kept_intact) {
  peer_fixture f;
  fix_setup(&f, 2);
  size_t n1 = 100000, n2 = 150000;
  uint8_t *a = pattern(n1, 41), *b = pattern(n2, 42), *ra = malloc(n1), *rb = malloc(n2);
  distd_xfer *rx = distd_xfer_new(f.r[1].peers, 50);
  distd_xfer *sx = distd_xfer_new(f.r[0].peers, 51);
  distd_xfer *sx2 = distd_xfer_new(f.r[0].peers, 50);
  distd_xfer_recv(rx, 0, 0, ra, n1);
  frame_out out[] = {{sx, 0, b, n2} /* op 51, not posted on rank 1 */, {sx2, 0, a, n1}};
  send_while_driving(rx, out, 2);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(memcmp(ra, a, n1), 0, "the guessed frame arrived changed");
  distd_xfer *rx2 = distd_xfer_new(f.r[1].peers, 51);
  distd_xfer_recv(rx2, 0, 0, rb, n2);
  cr_assert_eq(distd_xfer_wait(rx2, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(rb, b, n2), 0, "the frame kept aside arrived changed");
  distd_xfer_free(rx), distd_xfer_free(rx2), distd_xfer_free(sx), distd_xfer_free(sx2);
  free(a), free(b), free(ra), free(rb);
  fix_teardown(&f);
}

/* One case for the read-ahead past a short frame: rank 1 waits on a short
 * any-length frame (hx, expecting `likely` bytes) and then on a large
 * frame of `big` bytes in dx, hx's next xfer (as moe_scatter.c's counts
 * and rows); rank 0 sends a short frame of short_len bytes, then the large
 * one, in one writev. With other_len > 0 a frame of that length for an op
 * rank 1 has not posted goes between them. While driving hx the guess
 * reads past the short frame into dx's receive: right when short_len ==
 * likely and nothing comes between, wrong otherwise; either way every
 * frame arrives intact, the unposted one kept aside. */
typedef struct lead_case {
  size_t likely, short_len, big, other_len;
} lead_case;

static void expect_kept_aside(peer_fixture *f, uint64_t op, distd_xfer *sent,
                              const uint8_t *want, size_t len) {
  uint8_t *kept = calloc(1, len ? len : 1);
  distd_xfer *ox = distd_xfer_new(f->r[1].peers, op);
  distd_xfer_recv(ox, 0, 1, kept, len);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(sent, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(ox, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(memcmp(kept, want, len), 0, "op %llu: frame kept aside changed",
               (unsigned long long)op);
  distd_xfer_free(ox);
  free(kept);
}

static void lead_round(peer_fixture *f, uint64_t op, lead_case k) {
  uint8_t *small = pattern(k.short_len, (unsigned)op), *big = pattern(k.big, (unsigned)op + 1);
  uint8_t *other = pattern(k.other_len, (unsigned)op + 2), *got_big = calloc(1, k.big);
  void *got_small = NULL;
  size_t got_small_len = 0;
  distd_xfer *hx = distd_xfer_new(f->r[1].peers, op), *dx = distd_xfer_new(f->r[1].peers, op);
  distd_xfer_recv_any(hx, 0, 0, &got_small, &got_small_len, k.likely);
  distd_xfer_recv(dx, 0, 1, got_big, k.big);
  distd_xfer_then(hx, dx);
  waiter w = {.x = hx, .deadline = in_ms(10000)};
  pthread_t t;
  pthread_create(&t, NULL, waiter_main, &w);
  usleep(50 * 1000); /* rank 1 drives its sockets before the bytes come */
  distd_xfer *sk = distd_xfer_new(f->r[0].peers, op), *sd = distd_xfer_new(f->r[0].peers, op);
  distd_xfer *sx = distd_xfer_new(f->r[0].peers, op + 1000);
  distd_xfer_send_deferred(sk, 1, 0, small, k.short_len);
  if (k.other_len) distd_xfer_send(sx, 1, 1, other, k.other_len);
  distd_xfer_send(sd, 1, 1, big, k.big);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_xfer_wait(sk, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_xfer_wait(sd, in_ms(10000), &eb), 0, "%s", eb.msg);
  pthread_join(t, NULL);
  cr_assert_eq(w.rc, 0, "op %llu: %s", (unsigned long long)op, w.msg);
  cr_assert_eq(distd_xfer_wait(dx, in_ms(10000), &eb), 0, "%s", eb.msg);
  cr_assert_eq(got_small_len, k.short_len, "op %llu", (unsigned long long)op);
  cr_assert_eq(memcmp(got_small, small, k.short_len), 0, "op %llu: short frame changed",
               (unsigned long long)op);
  cr_assert_eq(memcmp(got_big, big, k.big), 0, "op %llu: large frame changed",
               (unsigned long long)op);
  if (k.other_len) expect_kept_aside(f, op + 1000, sx, other, k.other_len);
  distd_xfer_free(hx), distd_xfer_free(dx), distd_xfer_free(sk), distd_xfer_free(sd);
  distd_xfer_free(sx);
  free(small), free(big), free(other), free(got_big), free(got_small);
}

Test(peer, the_read_ahead_looks_past_a_short_frame_into_the_next_xfer) {
  peer_fixture f;
  fix_setup(&f, 2);
  lead_round(&f, 60, (lead_case){56, 56, 200000, 0});       /* the guess is right */
  lead_round(&f, 61, (lead_case){56, 80, 200000, 0});       /* the short frame is longer */
  lead_round(&f, 62, (lead_case){56, 0, 200000, 0});        /* ... or empty */
  lead_round(&f, 63, (lead_case){56, 56, 200000, 200000});  /* another op's frame between */
  lead_round(&f, 64, (lead_case){9000, 9000, 200000, 0});   /* too long to look past */
  fix_teardown(&f);
}

/* The same with sizes drawn at random (fixed seed): short frames around
 * the expected length, large frames around the stage and read sizes,
 * sometimes another op's frame, short or large, in between. */
Test(peer, the_read_ahead_past_a_short_frame_keeps_every_byte_in_random_cases) {
  peer_fixture f;
  fix_setup(&f, 2);
  uint32_t seed = 12345;
  for (uint64_t i = 0; i < 24; i++) {
    seed = seed * 1103515245u + 12345u;
    size_t likely = 8 + (seed >> 8) % 8000;
    size_t short_len = (seed >> 4) % 3 == 0 ? likely : (seed >> 12) % 9000;
    size_t big = 16384 + (seed >> 6) % 400000;
    size_t other_len = (seed >> 3) % 3 == 0 ? 1 + (seed >> 10) % 100000 : 0;
    lead_round(&f, 100 + i, (lead_case){likely, short_len, big, other_len});
  }
  fix_teardown(&f);
}

/* The fixture's ports are free when picked, and may be taken before a
 * rank listens (another test's connection is given one by the kernel):
 * it picks them all again instead of failing the test. */
Test(peer, the_fixture_starts_ranks_whose_port_was_taken_after_it_was_picked) {
  peer_fixture f;
  fix_prepare(&f, 2);
  int taken = atoi(strchr(f.members[1].peer_addr, ':') + 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)taken),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0,
            "cannot take port %d", taken);
  fix_start_all(&f);
  cr_expect(fix_wait_connected(&f, 10000), "the ranks did not connect");
  cr_expect_neq(atoi(strchr(f.members[1].peer_addr, ':') + 1), taken);
  fix_teardown(&f);
  close(fd);
}
