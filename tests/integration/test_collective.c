/* SPMD collectives whose trainers disagree on what the bytes mean: the
 * same byte count, but another dtype, reduce op, root or collective. Each
 * must fail on every trainer, naming both ranks and both descriptions,
 * well before the deadline; and the daemons must then serve the next
 * collective. Two daemons, one trainer thread per rank. Point-to-point
 * send and receive (raw Collective requests: libdist has no call for
 * them) likewise, and a sent frame whose receive never comes is dropped
 * after peer_unexpected_max_age, a receive posted after that failing at
 * once. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h" /* dist_call_one: raw SEND / RECV requests */
#include "harness.h"
#include "harness_fixture.h"

/* What one trainer calls; `count` elements of `dt` (16 bytes per rank
 * unless big). */
typedef enum { ALL_REDUCE, ALL_GATHER, BROADCAST, GLOBAL_SCATTER } call_kind;

typedef struct call {
  call_kind kind;
  dist_dtype dt;
  dist_reduce op; /* ALL_REDUCE */
  int root;       /* BROADCAST */
  int group_size; /* ALL_REDUCE: 0 for every rank, else ranks 0,1,0,1... */
  const int64_t *counts; /* GLOBAL_SCATTER: rows to each rank (NULL: 2, 2) */
} call;

typedef struct trainer {
  dist_client *c;
  int rank;
  call what;
  size_t bytes;
  int rc;
  int32_t first; /* an int32 call's first element afterwards */
  double seconds;
  char msg[600];
} trainer;

static int run_global_scatter(trainer *t, void *buf) {
  /* One expert per rank, rows of 8 bytes: 2 rows to each rank. */
  static const int64_t two_each[2] = {2, 2};
  int64_t d_model = 8 / (int64_t)dist_dtype_size(t->what.dt);
  const int64_t *counts = t->what.counts ? t->what.counts : two_each;
  const int64_t *lc[1] = {counts}, *gc[1] = {two_each};
  const void *x[1] = {buf};
  void *out[1] = {NULL};
  int64_t out_rows[1] = {0};
  int rc = dist_global_scatter(t->c, x, NULL, t->what.dt, d_model, lc, gc, 1, NULL, 0, NULL,
                               out, out_rows);
  free(out[0]);
  return rc;
}

/* Ranks 0,1,0,1... for a group larger than any allowed. */
static const int *alternating_group(void) {
  static int g[2 * 1024];
  for (int i = 0; i < 2 * 1024; i++) g[i] = i % 2;
  return g;
}

static void *trainer_main(void *arg) {
  trainer *t = arg;
  size_t count = t->bytes / dist_dtype_size(t->what.dt);
  void *buf = calloc(1, t->bytes), *gathered = calloc(2, t->bytes);
  for (size_t i = 0; t->what.dt == DIST_INT32 && i < count; i++)
    ((int32_t *)buf)[i] = t->rank + 1;
  double t0 = harness_now_s();
  switch (t->what.kind) {
  case ALL_REDUCE:
    t->rc = dist_all_reduce(t->c, buf, count, t->what.dt, t->what.op,
                            t->what.group_size ? alternating_group() : NULL,
                            t->what.group_size);
    break;
  case ALL_GATHER:
    t->rc = dist_all_gather(t->c, buf, count, gathered, t->what.dt, NULL, 0);
    break;
  case BROADCAST:
    t->rc = dist_broadcast(t->c, buf, count, t->what.dt, t->what.root, NULL, 0);
    break;
  case GLOBAL_SCATTER:
    t->rc = run_global_scatter(t, buf);
    break;
  }
  t->seconds = harness_now_s() - t0;
  if (t->what.dt == DIST_INT32 && count) t->first = ((int32_t *)buf)[0];
  snprintf(t->msg, sizeof t->msg, "%s", dist_errmsg(t->c));
  free(buf);
  free(gathered);
  return NULL;
}

static void run_pair(const char *job, call a, call b, size_t bytes, trainer tr[2]) {
  pthread_t th[2];
  const call what[2] = {a, b};
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, job), .rank = r, .what = what[r],
                      .bytes = bytes};
    pthread_create(&th[r], NULL, trainer_main, &tr[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
}

/* Every trainer fails with EMISMATCH within 4 s (a peer silent for 5 s
 * would fail it too, but as a timeout),
 * and its message names both ranks and both descriptions. */
static void expect_clash(call a, call b, size_t bytes, const char *desc_a, const char *desc_b) {
  static int serial;
  char job[64];
  snprintf(job, sizeof job, "clash-%d", ++serial);
  trainer tr[2];
  run_pair(job, a, b, bytes, tr);
  for (int r = 0; r < 2; r++) {
    cr_log_info("rank %d: %s: %s", r, dist_err_name(tr[r].rc), tr[r].msg);
    cr_expect_eq(tr[r].rc, DIST_EMISMATCH, "%s vs %s, rank %d: %s: %s", desc_a, desc_b, r,
                 dist_err_name(tr[r].rc), tr[r].msg);
    cr_expect(strstr(tr[r].msg, desc_a) && strstr(tr[r].msg, desc_b),
              "rank %d does not name both %s and %s: %s", r, desc_a, desc_b, tr[r].msg);
    cr_expect(strstr(tr[r].msg, "rank 0") && strstr(tr[r].msg, "rank 1"),
              "rank %d does not name both ranks: %s", r, tr[r].msg);
    cr_expect_lt(tr[r].seconds, 4.0, "rank %d took %.1f s", r, tr[r].seconds);
  }
}

/* The next collective after a clash is served, with the right sum. */
static void expect_served(void) {
  static int serial;
  char job[64];
  snprintf(job, sizeof job, "after-%d", ++serial);
  const call sum = {ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL};
  trainer tr[2];
  run_pair(job, sum, sum, 16, tr);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].first, 3, "rank %d: 1 + 2 is %d", r, tr[r].first);
  }
}

typedef struct clash_case {
  call a, b;
  size_t bytes;
  const char *desc_a, *desc_b;
} clash_case;

#define F32_SUM {ALL_REDUCE, DIST_FLOAT32, DIST_REDUCE_SUM, 0, 0, NULL}
static const clash_case clashes[] = {
    {F32_SUM, {ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, 16, "all_reduce(float32, sum)",
     "all_reduce(int32, sum)"},
    /* 16 MiB: frames that arrive before or while their receive is posted */
    {F32_SUM, {ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, 16u << 20,
     "all_reduce(float32, sum)", "all_reduce(int32, sum)"},
    {F32_SUM, {ALL_REDUCE, DIST_FLOAT32, DIST_REDUCE_MAX, 0, 0, NULL}, 16, "all_reduce(float32, sum)",
     "all_reduce(float32, max)"},
    /* 1 MiB takes the two-round algorithm: reduce-scatter, then all-gather */
    {F32_SUM, {ALL_REDUCE, DIST_FLOAT32, DIST_REDUCE_MAX, 0, 0, NULL}, 1u << 20,
     "all_reduce(float32, sum)", "all_reduce(float32, max)"},
    /* each takes itself for the root: only senders, unless checked */
    {{BROADCAST, DIST_INT64, DIST_REDUCE_SUM, 0, 0, NULL}, {BROADCAST, DIST_INT64, DIST_REDUCE_SUM, 1, 0, NULL},
     16, "broadcast(int64, root 0)", "broadcast(int64, root 1)"},
    {{ALL_GATHER, DIST_FLOAT64, DIST_REDUCE_SUM, 0, 0, NULL}, {ALL_GATHER, DIST_INT64, DIST_REDUCE_SUM, 0, 0, NULL},
     16, "all_gather(float64)", "all_gather(int64)"},
    /* another collective, whose frames have other tags and lengths */
    {{ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, {ALL_GATHER, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL},
     16, "all_reduce(int32, sum)", "all_gather(int32)"},
    {{GLOBAL_SCATTER, DIST_FLOAT32, DIST_REDUCE_SUM, 0, 0, NULL},
     {GLOBAL_SCATTER, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, 32, "global_scatter(float32)",
     "global_scatter(int32)"},
};

Test(disagree, on_dtype_reduce_op_root_or_collective, .timeout = 240, .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  for (size_t i = 0; i < sizeof clashes / sizeof clashes[0]; i++) {
    const clash_case *k = &clashes[i];
    expect_clash(k->a, k->b, k->bytes, k->desc_a, k->desc_b);
    expect_served();
  }
}

/* ---- point to point ---- */

enum { P2P_BYTES = 16 };

/* One side of a send/recv between ranks 0 and 1, made as a trainer's
 * request to its own daemon, after delay_ms. */
typedef struct p2p_side {
  int rank, send, delay_ms;
  uint32_t repeat; /* benchmark mode, which send/recv do not have */
  uint64_t op_id;
  dist_dtype dt;
  int rc;
  double seconds;
  uint8_t got[P2P_BYTES];
  char msg[600];
} p2p_side;

static const uint8_t p2p_payload[P2P_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* What a raw Collective request (libdist sends no point-to-point or
 * benchmark-mode ones) of rank's trainer to its own daemon came to. */
typedef struct raw_result {
  int rc;
  double seconds;
  char msg[600];
  Dist__V1__CollectiveReply *reply; /* NULL unless rc is 0; the caller frees it */
} raw_result;

static void raw_collective(int rank, const Dist__V1__CollectiveRequest *rq, raw_result *out) {
  dist_client *c = harness_client_rank(&cluster, rank, 10000);
  ProtobufCMessage *rp = NULL;
  double t0 = harness_now_s();
  out->rc = dist_call_one(c, 0, "/dist.v1.Dist/Collective", &rq->base,
                          &dist__v1__collective_reply__descriptor, &rp);
  out->seconds = harness_now_s() - t0;
  out->reply = (Dist__V1__CollectiveReply *)rp;
  snprintf(out->msg, sizeof out->msg, "%s", dist_errmsg(c));
  dist_close(c);
}

static void *p2p_main(void *arg) {
  p2p_side *sd = arg;
  harness_sleep_ms(sd->delay_ms);
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = sd->send ? DIST__V1__COLLECTIVE_REQUEST__KIND__SEND
                     : DIST__V1__COLLECTIVE_REQUEST__KIND__RECV;
  rq.op_id = sd->op_id;
  rq.root = (uint32_t)(1 - sd->rank);
  rq.repeat = sd->repeat;
  rq.dtype = (Dist__V1__DType)sd->dt; /* the wire numbers dtypes as dist_dtype */
  if (sd->send) rq.data = (ProtobufCBinaryData){P2P_BYTES, (uint8_t *)p2p_payload};
  else rq.count = P2P_BYTES / dist_dtype_size(sd->dt);
  raw_result res;
  raw_collective(sd->rank, &rq, &res);
  sd->rc = res.rc;
  sd->seconds = res.seconds;
  const ProtobufCBinaryData *data = res.reply ? &res.reply->data : NULL;
  if (sd->rc == 0 && data && data->len == P2P_BYTES) memcpy(sd->got, data->data, P2P_BYTES);
  snprintf(sd->msg, sizeof sd->msg, "%s", res.msg);
  if (res.reply) protobuf_c_message_free_unpacked(&res.reply->base, NULL);
  return NULL;
}

/* Rank 0 sends P2P_BYTES as send_dt, rank 1 receives them as recv_dt;
 * the side posted second waits first_ms. */
static void run_p2p(uint64_t op_id, dist_dtype send_dt, dist_dtype recv_dt, int recv_first,
                    p2p_side sd[2]) {
  const int first_ms = 300;
  sd[0] = (p2p_side){.rank = 0, .send = 1, .op_id = op_id, .dt = send_dt,
                     .delay_ms = recv_first ? first_ms : 0};
  sd[1] = (p2p_side){.rank = 1, .send = 0, .op_id = op_id, .dt = recv_dt,
                     .delay_ms = recv_first ? 0 : first_ms};
  pthread_t th[2];
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, p2p_main, &sd[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) cr_log_info("p2p rank %d: %s: %s", r, dist_err_name(sd[r].rc), sd[r].msg);
}

/* The receiver fails with EMISMATCH naming both ranks and both dtypes,
 * long before its deadline. The sender may have finished before the
 * receiver saw its frame (success); if not, it fails the same way. */
static void expect_p2p_clash(uint64_t op_id, int recv_first) {
  p2p_side sd[2];
  run_p2p(op_id, DIST_FLOAT32, DIST_INT32, recv_first, sd);
  char want[200];
  snprintf(want, sizeof want, "rank 0 runs op %llu as p2p(float32), but rank 1 as p2p(int32)",
           (unsigned long long)op_id);
  cr_expect_eq(sd[1].rc, DIST_EMISMATCH, "receiver: %s: %s", dist_err_name(sd[1].rc), sd[1].msg);
  cr_expect(strstr(sd[1].msg, want), "the receiver's error does not say '%s': %s", want,
            sd[1].msg);
  cr_expect_lt(sd[1].seconds, 4.0, "the receiver took %.1f s", sd[1].seconds);
  cr_expect(sd[0].rc == 0 || (sd[0].rc == DIST_EMISMATCH && strstr(sd[0].msg, want)),
            "sender: %s: %s", dist_err_name(sd[0].rc), sd[0].msg);
}

Test(disagree, p2p_send_and_recv_on_dtype, .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  expect_p2p_clash(0x7001, 1); /* the frame meets its posted receive */
  expect_p2p_clash(0x7002, 0); /* the frame was kept aside, the sender done */
  p2p_side sd[2];
  run_p2p(0x7003, DIST_FLOAT32, DIST_FLOAT32, 1, sd);
  for (int r = 0; r < 2; r++) cr_expect_eq(sd[r].rc, 0, "agreeing p2p, rank %d: %s", r, sd[r].msg);
  cr_expect_eq(memcmp(sd[1].got, p2p_payload, P2P_BYTES), 0, "the receiver got other bytes");
}

/* Starts two daemons whose kept-aside frames expire after 1 s, sends
 * P2P_BYTES from rank 0 to rank 1 for op_id, and waits for rank 1 to log
 * dropping them unreceived; op gets "op <op_id>". */
static int send_until_dropped(uint64_t op_id, char *op, size_t op_len) {
  const char *const args[] = {"--peer-unexpected-max-age=1s", NULL};
  harness_start(&cluster, 2, args);
  long from = harness_log_size(&cluster, 1);
  p2p_side sender = {.rank = 0, .send = 1, .op_id = op_id, .dt = DIST_FLOAT32};
  p2p_main(&sender);
  cr_assert_eq(sender.rc, 0, "%s", sender.msg);
  snprintf(op, op_len, "op %llu", (unsigned long long)op_id);
  const char *const needles[] = {"dropped 16 bytes rank 0 sent for", op, NULL};
  return harness_log_wait(&cluster, 1, from, needles, 10000);
}

/* A frame whose receive never comes (the receiving trainer died before
 * calling) is dropped after peer_unexpected_max_age, logged once with
 * its op id and sender, and counted in /metrics. */
Test(kept_aside, a_send_never_received_is_dropped_after_the_age, .timeout = 120,
     .fini = stop_cluster) {
  char op[64];
  cr_expect(send_until_dropped(0x7100, op, sizeof op),
            "rank 1 did not log dropping the frame of %s", op);
  char cmd[600], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout 10000 metrics --rank 1",
           harness_distctl(), cluster.cluster_file);
  cr_assert_eq(harness_run(cmd, &out, &err, 60), 0, "distctl metrics: %s", err ? err : "");
  cr_expect(strstr(out, "distd_peer_unexpected_expired_total{peer=\"0\"} 1\n") &&
                strstr(out, "distd_peer_unexpected_expired_bytes_total{peer=\"0\"} 16\n"),
            "rank 1's metrics do not count the dropped frame:\n%s", out);
  /* the control frames' drops (peer_ctl.c) are listed from the start */
  cr_expect(strstr(out, "distd_peer_ctl_dropped_total{peer=\"0\"} 0\n"), "%s", out);
  free(out), free(err);
}

/* A receive that comes after its frame was dropped fails at once, naming
 * the sender, the op and the frame's wait, well before peer_timeout (5 s
 * in the harness); before, it waited that out for a frame gone. */
Test(kept_aside, a_receive_after_its_frame_was_dropped_fails_at_once, .timeout = 120,
     .fini = stop_cluster) {
  char op[64], want[160];
  cr_assert(send_until_dropped(0x7200, op, sizeof op), "rank 1 did not drop the frame of %s", op);
  p2p_side late = {.rank = 1, .send = 0, .op_id = 0x7200, .dt = DIST_FLOAT32};
  p2p_main(&late);
  snprintf(want, sizeof want, "the frame rank 0 sent for %s (tag ", op);
  cr_expect_eq(late.rc, DIST_ETIMEDOUT, "%s: %s", dist_err_name(late.rc), late.msg);
  cr_expect(strstr(late.msg, want) && strstr(late.msg, "was dropped after waiting") &&
                strstr(late.msg, "for this receive (peer_unexpected_max_age)"),
            "%s", late.msg);
  cr_expect_lt(late.seconds, 2.0, "the late receive took %.1f s: %s", late.seconds, late.msg);
}

/* Trainer 0's request is refused before its part, by its daemon (root,
 * reduce op, counts) or by its libdist (a group over 1024 ranks): trainer
 * 1 must fail at once, naming rank 0 and the reason, not after the peer
 * timeout (5 s), and the next collective of both must be served. */
typedef struct refusal_case {
  call refused, good;
  const char *reason;
} refusal_case;

static const int64_t negative_rows[2] = {-1, 5}; /* 4 rows in all, as x holds */

#define I32_SUM {ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}
static const refusal_case refusals[] = {
    {{BROADCAST, DIST_INT32, DIST_REDUCE_SUM, 5, 0, NULL},
     {BROADCAST, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, "broadcast root 5 is not in the group"},
    {{ALL_REDUCE, DIST_INT32, (dist_reduce)99, 0, 0, NULL}, I32_SUM, "invalid reduce op 99"},
    {{GLOBAL_SCATTER, DIST_INT32, DIST_REDUCE_SUM, 0, 0, negative_rows},
     {GLOBAL_SCATTER, DIST_INT32, DIST_REDUCE_SUM, 0, 0, NULL}, "local_count[0] = -1 is negative"},
    {{ALL_REDUCE, DIST_INT32, DIST_REDUCE_SUM, 0, 1025, NULL}, I32_SUM, "group_size 1025"},
};

static void expect_refusal_told(const refusal_case *k) {
  static int serial;
  char job[64];
  snprintf(job, sizeof job, "refused-%d", ++serial);
  trainer tr[2];
  run_pair(job, k->refused, k->good, 32, tr); /* 4 rows of a global_scatter */
  for (int r = 0; r < 2; r++) cr_log_info("rank %d: %s: %s", r, dist_err_name(tr[r].rc), tr[r].msg);
  cr_expect(tr[0].rc != 0 && strstr(tr[0].msg, k->reason), "rank 0 (%s): %s", k->reason,
            tr[0].msg);
  cr_expect(tr[1].rc != 0 && strstr(tr[1].msg, "rank 0 aborted op") &&
                strstr(tr[1].msg, k->reason),
            "rank 1 is not told of rank 0's refusal (%s): %s", k->reason, tr[1].msg);
  cr_expect_lt(tr[1].seconds, 2.0, "rank 1 waited %.1f s for %s: %s", tr[1].seconds, k->reason,
               tr[1].msg);
}

Test(refused, before_its_part_fails_the_others_at_once, .timeout = 240, .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
    expect_refusal_told(&refusals[i]);
    expect_served();
  }
}

/* ---- benchmark mode (repeat > 0), as bench/coll_bench.c asks for it ---- */

enum { BENCH_REPEAT = 3 };

typedef struct bench_side {
  int rank;
  uint64_t op_id;
  uint32_t reduce;
  raw_result res;
} bench_side;

/* A raw all-reduce of four int32 by rank's trainer under op_id; repeat >
 * 0 asks for benchmark mode (one warm-up). */
static void raw_all_reduce(int rank, uint64_t op_id, uint32_t reduce, uint32_t repeat,
                           raw_result *out) {
  static const int32_t four[4] = {1, 2, 3, 4};
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE;
  rq.op_id = op_id;
  rq.dtype = (Dist__V1__DType)DIST_INT32;
  rq.reduce = reduce;
  rq.data = (ProtobufCBinaryData){sizeof four, (uint8_t *)four};
  rq.warmup = repeat ? 1 : 0;
  rq.repeat = repeat;
  raw_collective(rank, &rq, out);
}

static void *bench_main(void *arg) {
  bench_side *b = arg;
  raw_all_reduce(b->rank, b->op_id, b->reduce, BENCH_REPEAT, &b->res);
  cr_log_info("bench rank %d: %s: %s", b->rank, dist_err_name(b->res.rc), b->res.msg);
  return NULL;
}

/* A benchmark-mode all-reduce of ranks 0 and 1 under op_id, rank 0 asking
 * for reduce op reduce0. */
static void run_bench(uint64_t op_id, uint32_t reduce0, bench_side b[2]) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    b[r] = (bench_side){.rank = r, .op_id = op_id,
                        .reduce = r == 0 ? reduce0 : (uint32_t)DIST_REDUCE_SUM};
    pthread_create(&th[r], NULL, bench_main, &b[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* Rank 0's daemon refuses its part of a benchmark run (reduce op 99): rank
 * 1 must fail at once, told so under the request's op id. Before, rank 1
 * ran its steps under derived ids, which the refusal did not reach, and
 * waited for rank 0 until the peer timeout (5 s). The next benchmark run of
 * both is served, with a time per repeat. */
Test(refused, a_benchmark_run_fails_the_others_at_once, .timeout = 120, .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  bench_side b[2];
  run_bench(0x7200, 99, b);
  char told[200];
  snprintf(told, sizeof told, "rank 0 aborted op %llu: its daemon refused it: invalid reduce op 99",
           0x7200ull);
  cr_expect(b[0].res.rc != 0 && strstr(b[0].res.msg, "invalid reduce op 99"), "rank 0: %s",
            b[0].res.msg);
  cr_expect(b[1].res.rc != 0 && strstr(b[1].res.msg, told), "rank 1 is not told '%s': %s", told,
            b[1].res.msg);
  cr_expect_lt(b[1].res.seconds, 2.0, "rank 1 waited %.1f s: %s", b[1].res.seconds, b[1].res.msg);
  run_bench(0x7201, DIST_REDUCE_SUM, b);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(b[r].res.rc, 0, "then, rank %d: %s", r, b[r].res.msg);
    cr_expect(b[r].res.reply && b[r].res.reply->n_op_seconds == BENCH_REPEAT,
              "then, rank %d has no time per repeat", r);
    if (b[r].res.reply) protobuf_c_message_free_unpacked(&b[r].res.reply->base, NULL);
  }
}

/* A send asking for benchmark mode, which send/recv do not have, is
 * refused by its daemon: the receiver must fail at once, told why, not
 * after the peer timeout (5 s). */
Test(refused, a_send_in_benchmark_mode_fails_its_receiver_at_once, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  p2p_side sd[2] = {{.rank = 0, .send = 1, .op_id = 0x7300, .dt = DIST_FLOAT32, .repeat = 2},
                    {.rank = 1, .send = 0, .op_id = 0x7300, .dt = DIST_FLOAT32}};
  pthread_t th[2];
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, p2p_main, &sd[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  const char *why = "send/recv have no benchmark mode";
  cr_expect(sd[0].rc == DIST_EINVAL && strstr(sd[0].msg, why), "sender: %s", sd[0].msg);
  cr_expect(sd[1].rc != 0 && strstr(sd[1].msg, "rank 0 aborted op") && strstr(sd[1].msg, why),
            "the receiver is not told of the refusal: %s", sd[1].msg);
  cr_expect_lt(sd[1].seconds, 2.0, "the receiver waited %.1f s: %s", sd[1].seconds, sd[1].msg);
}

/* Rank 0's trainer aborts first and the 1000 ids after it ("a plan
 * refused") for ranks 0 .. n - 1, as a refused tape backward's plan does:
 * the ids the daemon says it aborted. */
static uint32_t abort_plan_on_rank_0(uint64_t first, uint32_t n) {
  uint32_t ranks[HARNESS_MAX];
  for (uint32_t r = 0; r < n; r++) ranks[r] = r;
  return harness_op_abort(&cluster, 0, first, 1000, ranks, n, "a plan refused");
}

/* rank's all-reduce under id, of abort_plan_on_rank_0's plan, fails at
 * once, naming rank 0 and the reason. */
static void expect_told_of_plan(int rank, uint64_t id) {
  raw_result res;
  raw_all_reduce(rank, id, DIST_REDUCE_SUM, 0, &res);
  char told[200];
  snprintf(told, sizeof told, "rank 0 aborted op %llu: its trainer refused it: a plan refused",
           (unsigned long long)id);
  cr_expect(res.rc != 0 && strstr(res.msg, told), "rank %d is not told '%s': %s", rank, told,
            res.msg);
  cr_expect_lt(res.seconds, 2.0, "rank %d waited %.1f s: %s", rank, res.seconds, res.msg);
  if (res.reply) protobuf_c_message_free_unpacked(&res.reply->base, NULL);
}

/* A trainer's OpAbort of more ids than the daemons' ring of 256 remembered
 * exchanges holds (a refused tape backward's plan, each id with ~13
 * steps): rank 1, reaching an id in the middle of the range afterwards,
 * must fail at once, told of the refusal. Before 0.2.9 each id took a ring
 * slot, and the middle was forgotten: rank 1 waited for rank 0. */
Test(refused, an_abort_of_many_ids_reaches_the_middle_of_its_range, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 2, NULL);
  const uint64_t first = 0x7400;
  cr_expect_eq(abort_plan_on_rank_0(first, 2), 1001);
  harness_sleep_ms(500); /* rank 1 has every ABORT frame: it must remember them */
  expect_told_of_plan(1, first + 500);
}

/* A sum of four int32 by rank's trainer under op_id, in a thread. */
typedef struct reduce_side {
  int rank;
  uint64_t op_id;
  raw_result res;
} reduce_side;

static void *reduce_main(void *arg) {
  reduce_side *sd = arg;
  raw_all_reduce(sd->rank, sd->op_id, DIST_REDUCE_SUM, 0, &sd->res);
  return NULL;
}

/* Rank 0's /metrics once they count an ABORT_RANGE frame written to each
 * of ranks 1 .. n - 1, or after 10 s (a fixed 500 ms was a race on a
 * loaded host: the loop writes the frames after OpAbort is answered). */
static char *metrics_once_ranges_written(int n) {
  for (double until = harness_now_s() + 10;; harness_sleep_ms(100)) {
    char *m = harness_metrics(&cluster, 0), sample[120];
    int written = 1;
    for (int r = 1; r < n; r++) {
      snprintf(sample, sizeof sample,
               "distd_peer_frames_sent_total{peer=\"%d\",kind=\"abort_range\"}", r);
      written &= harness_metric_sample(m, sample) >= 1;
    }
    if (written || harness_now_s() >= until) return m;
    free(m);
  }
}

/* A trainer's OpAbort of 1001 ids on rank 0 of three daemons: rank 0's
 * /metrics show one ABORT_RANGE frame and no ABORT frame written to each
 * peer (before: 13 ABORT frames per id, 13013 to each); on ranks 1 and 2
 * the ids at both ends and in the middle fail at once, naming rank 0 and
 * the reason; the next id is served on all three. */
Test(refused, an_abort_of_many_ids_is_one_frame_to_each_peer, .timeout = 120,
     .fini = stop_cluster) {
  harness_start(&cluster, 3, NULL);
  const uint64_t first = 0x7800;
  abort_plan_on_rank_0(first, 3);
  char *m = metrics_once_ranges_written(3);
  for (int r = 1; r < 3; r++) {
    char one[120], none[120];
    snprintf(one, sizeof one, "distd_peer_frames_sent_total{peer=\"%d\",kind=\"abort_range\"} 1\n", r);
    snprintf(none, sizeof none, "distd_peer_frames_sent_total{peer=\"%d\",kind=\"abort\"} 0\n", r);
    cr_expect(strstr(m, one) && strstr(m, none), "rank 0 wrote rank %d other frames:\n%s", r, m);
  }
  free(m);
  const uint64_t told[] = {first, first + 500, first + 1000};
  for (int r = 1; r < 3; r++)
    for (size_t i = 0; i < sizeof told / sizeof told[0]; i++) expect_told_of_plan(r, told[i]);
  reduce_side next[3];
  pthread_t th[3];
  for (int r = 0; r < 3; r++) {
    next[r] = (reduce_side){.rank = r, .op_id = first + 1001};
    pthread_create(&th[r], NULL, reduce_main, &next[r]);
  }
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 3; r++) {
    cr_expect_eq(next[r].res.rc, 0, "the next id, rank %d: %s", r, next[r].res.msg);
    if (next[r].res.reply) protobuf_c_message_free_unpacked(&next[r].res.reply->base, NULL);
  }
}
