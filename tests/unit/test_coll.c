/* Collectives over 2, 3 and 4 ranks in one process, each rank's call made
 * from its own thread, checked against references computed here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "peer_fixture.h"
#include "peer_internal.h"
#include "tensor.h"

typedef struct rank_ctx rank_ctx;
typedef int (*rank_body)(rank_ctx *);
struct rank_ctx {
  peer_fixture *f;
  int rank, n;
  rank_body body;
  int failed;
  int rc;
  int64_t elapsed_ms;
  char msg[700];
};

static void *rank_main(void *arg) {
  rank_ctx *c = arg;
  int64_t t0 = distd_now_ms();
  c->failed = c->body(c);
  c->elapsed_ms = distd_now_ms() - t0;
  return NULL;
}

/* Runs body on every rank at once; returns after all finished. */
static void run_ranks(peer_fixture *f, rank_body body, rank_ctx *ctx) {
  pthread_t t[FIX_MAX];
  for (int r = 0; r < f->n; r++) {
    ctx[r] = (rank_ctx){.f = f, .rank = r, .n = f->n, .body = body};
    pthread_create(&t[r], NULL, rank_main, &ctx[r]);
  }
  for (int r = 0; r < f->n; r++) pthread_join(t[r], NULL);
}

static void expect_all_ok(peer_fixture *f, rank_body body) {
  rank_ctx ctx[FIX_MAX];
  run_ranks(f, body, ctx);
  for (int r = 0; r < f->n; r++)
    cr_expect_eq(ctx[r].failed, 0, "rank %d of %d: %s", r, f->n, ctx[r].msg);
}

/* Every rank's collectives took exactly the send items they reserved
 * (distd_xfer_reserve_sends): a send past the reservation allocates and
 * may fail after others left; one short holds memory for nothing. */
static void expect_reservations_kept(peer_fixture *f) {
  for (int r = 0; r < f->n; r++) {
    uint64_t mismatches = distd_peers_reserve_mismatches(f->r[r].peers);
    cr_expect_eq(mismatches, 0, "rank %d of %d: %llu transfers took other than they reserved",
                 r, f->n, (unsigned long long)mismatches);
  }
}

static int init_world(rank_ctx *c, distd_coll *coll, uint64_t op, int *group) {
  for (int i = 0; i < c->n; i++) group[i] = i;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_coll_init(coll, c->f->r[c->rank].peers, op, group, c->n,
                           distd_now_ms() + 30000, &eb);
  if (rc) snprintf(c->msg, sizeof c->msg, "init: %s", eb.msg);
  return rc;
}

/* ---- all-reduce ---- */

static const dist_dtype all_dtypes[] = {DIST_BOOL, DIST_INT8, DIST_UINT8, DIST_INT32,
                                        DIST_INT64, DIST_FLOAT16, DIST_BFLOAT16,
                                        DIST_FLOAT32, DIST_FLOAT64};
static const dist_reduce all_ops[] = {DIST_REDUCE_SUM, DIST_REDUCE_MAX, DIST_REDUCE_MIN,
                                      DIST_REDUCE_PROD, DIST_REDUCE_AVG, DIST_REDUCE_ANY,
                                      DIST_REDUCE_ALL};
/* Small, direct exchange; over the threshold, reduce-scatter + all-gather. */
static const size_t counts[] = {0, 1, 37, 150001};

static double value(int rank, size_t i) { return (double)((rank + i) % 4); }

static double reference(dist_dtype dt, dist_reduce op, int n, size_t i) {
  if (dt == DIST_BOOL) {
    int any = 0, all = 1;
    for (int r = 0; r < n; r++) {
      any |= value(r, i) != 0;
      all &= value(r, i) != 0;
    }
    int use_or = op == DIST_REDUCE_SUM || op == DIST_REDUCE_AVG || op == DIST_REDUCE_MAX ||
                 op == DIST_REDUCE_ANY;
    return use_or ? any : all;
  }
  double acc = value(0, i);
  for (int r = 1; r < n; r++) {
    double v = value(r, i);
    switch (op) {
    case DIST_REDUCE_SUM: case DIST_REDUCE_AVG: acc += v; break;
    case DIST_REDUCE_MAX: acc = v > acc ? v : acc; break;
    case DIST_REDUCE_MIN: acc = v < acc ? v : acc; break;
    case DIST_REDUCE_PROD: acc *= v; break;
    case DIST_REDUCE_ANY: acc = (acc != 0) || (v != 0); break;
    case DIST_REDUCE_ALL: acc = (acc != 0) && (v != 0); break;
    }
  }
  if (n == 1 && (op == DIST_REDUCE_ANY || op == DIST_REDUCE_ALL)) acc = acc != 0;
  if (op == DIST_REDUCE_AVG) acc = dist_dtype_is_float(dt) ? acc / n : trunc(acc / n);
  return acc;
}

static int check_elems(rank_ctx *c, const void *buf, size_t count, dist_dtype dt,
                       dist_reduce op, const char *what) {
  for (size_t i = 0; i < count; i++) {
    double want = reference(dt, op, c->n, i), got = dist_elem_get(buf, dt, i);
    if (fabs(got - want) > 1e-2 * fabs(want) + 1e-6) {
      snprintf(c->msg, sizeof c->msg, "%s %s op %d count %zu: element %zu is %g, want %g", what,
               dist_dtype_name(dt), (int)op, count, i, got, want);
      return -1;
    }
  }
  return 0;
}

static int allreduce_body(rank_ctx *c) {
  int group[FIX_MAX];
  uint64_t op_id = 1;
  for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++)
    for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++)
      for (size_t k = 0; k < sizeof counts / sizeof *counts; k++, op_id++) {
        dist_dtype dt = all_dtypes[d];
        size_t n = counts[k];
        distd_coll coll;
        if (init_world(c, &coll, op_id, group)) return -1;
        void *buf = malloc(n * dist_dtype_size(dt) + 1);
        for (size_t i = 0; i < n; i++) dist_elem_set(buf, dt, i, value(c->rank, i));
        dist_errbuf eb = DIST_ERRBUF_INIT;
        int rc = distd_allreduce(&coll, buf, n, dt, all_ops[o], &eb);
        if (rc) snprintf(c->msg, sizeof c->msg, "allreduce %s: %s", dist_dtype_name(dt), eb.msg);
        else rc = check_elems(c, buf, n, dt, all_ops[o], "allreduce");
        free(buf);
        if (rc) return rc;
      }
  return 0;
}

Test(coll, allreduce_every_op_and_dtype_on_2_ranks, .timeout = 120) {
  peer_fixture f;
  fix_setup(&f, 2);
  expect_all_ok(&f, allreduce_body);
  expect_reservations_kept(&f);
  fix_teardown(&f);
}

Test(coll, allreduce_every_op_and_dtype_on_3_ranks, .timeout = 120) {
  peer_fixture f;
  fix_setup(&f, 3);
  expect_all_ok(&f, allreduce_body);
  expect_reservations_kept(&f);
  fix_teardown(&f);
}

Test(coll, allreduce_every_op_and_dtype_on_4_ranks, .timeout = 120) {
  peer_fixture f;
  fix_setup(&f, 4);
  expect_all_ok(&f, allreduce_body);
  expect_reservations_kept(&f);
  fix_teardown(&f);
}

/* Float sums depend on the order they are folded in; whatever order an
 * algorithm takes, every member must end with the same bits, or replicas
 * of one parameter drift apart. Values in [0.5, 2) keep the sum well
 * conditioned, so it is also checked against the exact one. */
enum { SAME_BITS_N = 301 };
static float same_bits_result[FIX_MAX][SAME_BITS_N];

static float same_bits_value(int rank, size_t i) {
  uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u + 7u);
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return 0.5f + 1.5f * (float)(h % 1000003u) / 1000003.0f;
}

static int same_bits_body(rank_ctx *c) {
  int group[FIX_MAX];
  distd_coll coll;
  if (init_world(c, &coll, 40, group)) return -1;
  float *v = same_bits_result[c->rank];
  for (size_t i = 0; i < SAME_BITS_N; i++) v[i] = same_bits_value(c->rank, i);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_allreduce(&coll, v, SAME_BITS_N, DIST_FLOAT32, DIST_REDUCE_SUM, &eb);
  if (rc) snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  return rc;
}

static void expect_same_bits_on(int n) {
  peer_fixture f;
  fix_setup(&f, n);
  expect_all_ok(&f, same_bits_body);
  for (size_t i = 0; i < SAME_BITS_N; i++) {
    double exact = 0;
    for (int r = 0; r < n; r++) exact += same_bits_value(r, i);
    cr_expect(fabs(same_bits_result[0][i] - exact) <= 1e-6 * exact,
              "element %zu: %.9g, exact %.9g", i, same_bits_result[0][i], exact);
  }
  for (int r = 1; r < n; r++)
    cr_expect(memcmp(same_bits_result[r], same_bits_result[0], sizeof same_bits_result[0]) == 0,
              "rank %d's sum differs from rank 0's in some bits", r);
  fix_teardown(&f);
}

Test(coll, a_small_float_sum_has_the_same_bits_on_every_member_of_4, .timeout = 60) {
  expect_same_bits_on(4);
}

Test(coll, a_small_float_sum_has_the_same_bits_on_every_member_of_8, .timeout = 120) {
  expect_same_bits_on(8);
}

/* ---- uneven all-gather, reduce-scatter, all-to-all ---- */

/* Elements member r contributes: uneven, with zeros. */
static size_t uneven(int r, int salt) { return (size_t)((r * 5 + salt) % 4) * 1000 + (r == 1 ? 0 : 3); }

/* An all-gather of count_of(r) int32 elements from each member r, over
 * the group given in member order (group[k] is world rank ranks[k]). */
static int allgather_of(rank_ctx *c, size_t (*count_of)(int), const int *ranks, uint64_t op) {
  int group[FIX_MAX], me = -1;
  for (int k = 0; k < c->n; k++) {
    group[k] = ranks ? ranks[k] : k;
    if (group[k] == c->rank) me = k;
  }
  distd_coll coll;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (distd_coll_init(&coll, c->f->r[c->rank].peers, op, group, c->n, distd_now_ms() + 30000,
                      &eb))
    return snprintf(c->msg, sizeof c->msg, "%s", eb.msg), -1;
  size_t cnt[FIX_MAX], total = 0;
  for (int k = 0; k < c->n; k++) total += cnt[k] = count_of(group[k]);
  int32_t *in = malloc(cnt[me] * 4 + 1), *out = malloc(total * 4 + 1);
  for (size_t i = 0; i < cnt[me]; i++) in[i] = c->rank * 100000 + (int32_t)i;
  int rc = distd_allgather(&coll, in, out, cnt, DIST_INT32, &eb);
  if (rc) snprintf(c->msg, sizeof c->msg, "allgather: %s", eb.msg);
  size_t k = 0;
  for (int m = 0; !rc && m < c->n; m++)
    for (size_t i = 0; i < cnt[m]; i++, k++)
      if (out[k] != group[m] * 100000 + (int32_t)i) {
        snprintf(c->msg, sizeof c->msg, "allgather: element %zu is %d", k, out[k]);
        rc = -1;
        break;
      }
  free(in), free(out);
  return rc;
}

static size_t uneven_1(int r) { return uneven(r, 1); }

static int allgather_body(rank_ctx *c) { return allgather_of(c, uneven_1, NULL, 10); }

/* A few elements, one member none. */
static size_t few(int r) { return (size_t)((r * 5 + 3) % 4) * 7; }

static const int shuffled[4] = {2, 0, 3, 1};

static int small_allgather_body(rank_ctx *c) {
  int rc = allgather_of(c, few, NULL, 30);
  return rc ? rc : allgather_of(c, few, shuffled, 31);
}

Test(coll, a_small_uneven_allgather_over_4_ranks_in_their_own_order) {
  peer_fixture f;
  fix_setup(&f, 4);
  expect_all_ok(&f, small_allgather_body);
  fix_teardown(&f);
}

static float rs_value(int rank, int block, size_t i) {
  return (float)(rank * 3 + block * 7) + (float)(i % 13);
}

/* A reduce-scatter in which member r keeps count_of(r) float32 elements. */
static int reduce_scatter_of(rank_ctx *c, size_t (*count_of)(int), uint64_t op) {
  int group[FIX_MAX];
  distd_coll coll;
  if (init_world(c, &coll, op, group)) return -1;
  size_t cnt[FIX_MAX], total = 0;
  for (int r = 0; r < c->n; r++) total += cnt[r] = count_of(r);
  float *in = malloc(total * 4 + 1), *out = malloc(cnt[c->rank] * 4 + 1);
  size_t k = 0;
  for (int b = 0; b < c->n; b++)
    for (size_t i = 0; i < cnt[b]; i++) in[k++] = rs_value(c->rank, b, i);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_reduce_scatter(&coll, in, out, cnt, DIST_FLOAT32, DIST_REDUCE_SUM, &eb);
  if (rc) snprintf(c->msg, sizeof c->msg, "reduce_scatter: %s", eb.msg);
  for (size_t i = 0; !rc && i < cnt[c->rank]; i++) {
    float want = 0;
    for (int r = 0; r < c->n; r++) want += rs_value(r, c->rank, i);
    if (out[i] != want) {
      snprintf(c->msg, sizeof c->msg, "reduce_scatter: element %zu is %g, want %g", i,
               out[i], want);
      rc = -1;
    }
  }
  free(in), free(out);
  return rc;
}

static size_t uneven_2(int r) { return uneven(r, 2); }

static int reduce_scatter_body(rank_ctx *c) { return reduce_scatter_of(c, uneven_2, 11); }

static size_t a2a_count(int src, int dst) { return (size_t)((src + 2 * dst) % 4) * 777; }

static int64_t a2a_value(int src, int dst, size_t i) {
  return ((int64_t)src << 40) | ((int64_t)dst << 32) | (int64_t)i;
}

/* An all-to-all in which member src sends count_of(src, dst) int64
 * elements to member dst. */
static int alltoallv_of(rank_ctx *c, size_t (*count_of)(int, int), uint64_t op) {
  int group[FIX_MAX];
  distd_coll coll;
  if (init_world(c, &coll, op, group)) return -1;
  size_t sc[FIX_MAX], rcnt[FIX_MAX], st = 0, rt = 0;
  for (int j = 0; j < c->n; j++) {
    st += sc[j] = count_of(c->rank, j);
    rt += rcnt[j] = count_of(j, c->rank);
  }
  int64_t *send = malloc(st * 8 + 1), *recv = malloc(rt * 8 + 1);
  size_t k = 0;
  for (int j = 0; j < c->n; j++)
    for (size_t i = 0; i < sc[j]; i++) send[k++] = a2a_value(c->rank, j, i);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_alltoallv(&coll, send, sc, recv, rcnt, DIST_INT64, &eb);
  if (rc) snprintf(c->msg, sizeof c->msg, "alltoallv: %s", eb.msg);
  k = 0;
  for (int j = 0; !rc && j < c->n; j++)
    for (size_t i = 0; i < rcnt[j]; i++, k++)
      if (recv[k] != a2a_value(j, c->rank, i)) {
        snprintf(c->msg, sizeof c->msg, "alltoallv: block from %d element %zu wrong", j, i);
        rc = -1;
        break;
      }
  free(send), free(recv);
  return rc;
}

static int alltoallv_body(rank_ctx *c) { return alltoallv_of(c, a2a_count, 12); }

static int broadcast_barrier_p2p_body(rank_ctx *c) {
  int group[FIX_MAX];
  distd_coll coll;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (init_world(c, &coll, 13, group)) return -1;
  double buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = c->rank == c->n - 1 ? i * 0.5 : -1;
  int rc = distd_broadcast(&coll, buf, 1000, DIST_FLOAT64, c->n - 1, &eb);
  for (int i = 0; !rc && i < 1000; i++)
    if (buf[i] != i * 0.5) rc = dist_fail(&eb, -1, "broadcast: element %d is %g", i, buf[i]);
  if (!rc && !(rc = init_world(c, &coll, 14, group))) rc = distd_barrier(&coll, &eb);
  /* Point to point around the ring. */
  int next = (c->rank + 1) % c->n, prev = (c->rank + c->n - 1) % c->n;
  int64_t dl = distd_now_ms() + 30000;
  int token = c->rank * 11, got = -1;
  distd_peers *p = c->f->r[c->rank].peers;
  if (!rc && c->rank % 2 == 0) {
    rc = distd_send_to(p, 15, next, &token, sizeof token, DIST_INT32, dl, &eb);
    if (!rc) rc = distd_recv_from(p, 15, prev, &got, sizeof got, DIST_INT32, dl, &eb);
  } else if (!rc) {
    rc = distd_recv_from(p, 15, prev, &got, sizeof got, DIST_INT32, dl, &eb);
    if (!rc) rc = distd_send_to(p, 15, next, &token, sizeof token, DIST_INT32, dl, &eb);
  }
  if (!rc && got != prev * 11) rc = dist_fail(&eb, -1, "p2p: got %d from rank %d", got, prev);
  if (rc) snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  return rc;
}

static void uneven_suite(int n) {
  peer_fixture f;
  fix_setup(&f, n);
  expect_all_ok(&f, allgather_body);
  expect_all_ok(&f, reduce_scatter_body);
  expect_all_ok(&f, alltoallv_body);
  expect_all_ok(&f, broadcast_barrier_p2p_body);
  expect_reservations_kept(&f);
  fix_teardown(&f);
}

Test(coll, uneven_allgather_reduce_scatter_alltoallv_broadcast_on_2_ranks) { uneven_suite(2); }
Test(coll, uneven_allgather_reduce_scatter_alltoallv_broadcast_on_3_ranks) { uneven_suite(3); }
Test(coll, uneven_allgather_reduce_scatter_alltoallv_broadcast_on_4_ranks) { uneven_suite(4); }

/* ---- self parts of hundreds of KiB ----
 * A member's own part, copied next to the peers' parts arriving into the
 * same buffer, over several of their frames. */

static size_t big_uneven(int r) { return (size_t)(r % 3) * 70001 + 16411; }

static size_t big_a2a_count(int src, int dst) {
  return (size_t)((src + 2 * dst) % 4) * 60013 + (src == dst ? 24571 : 5);
}

static int big_self_parts_body(rank_ctx *c) {
  int rc = allgather_of(c, big_uneven, NULL, 40);
  if (!rc) rc = reduce_scatter_of(c, big_uneven, 41);
  if (!rc) rc = alltoallv_of(c, big_a2a_count, 42);
  return rc;
}

Test(coll, self_parts_of_hundreds_of_kib_on_2_and_4_ranks, .timeout = 120) {
  for (int n = 2; n <= 4; n += 2) {
    peer_fixture f;
    fix_setup(&f, n);
    expect_all_ok(&f, big_self_parts_body);
    fix_teardown(&f);
  }
}

/* ---- a sub-group, in its own order ---- */

static int subgroup_body(rank_ctx *c) {
  if (c->rank == 1) return 0; /* not a member */
  int group[2] = {2, 0};
  distd_coll coll;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_coll_init(&coll, c->f->r[c->rank].peers, 20, group, 2,
                           distd_now_ms() + 30000, &eb);
  int64_t v[3] = {c->rank, c->rank * 10, 1};
  if (!rc) rc = distd_allreduce(&coll, v, 3, DIST_INT64, DIST_REDUCE_SUM, &eb);
  if (!rc && (v[0] != 2 || v[1] != 20 || v[2] != 2))
    rc = dist_fail(&eb, -1, "sum over {2, 0} is %lld %lld %lld", (long long)v[0],
                   (long long)v[1], (long long)v[2]);
  if (rc) snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  return rc;
}

Test(coll, allreduce_over_a_subgroup_of_the_world) {
  peer_fixture f;
  fix_setup(&f, 3);
  expect_all_ok(&f, subgroup_body);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_coll coll;
  int not_me[2] = {0, 2};
  cr_assert_eq(distd_coll_init(&coll, f.r[1].peers, 21, not_me, 2, 0, &eb), DIST_EINVAL);
  cr_assert_str_eq(eb.msg, "rank 1 is not in the collective's group");
  int outside[2] = {1, 7};
  cr_assert_eq(distd_coll_init(&coll, f.r[1].peers, 21, outside, 2, 0, &eb), DIST_EINVAL);
  fix_teardown(&f);
}

/* ---- point to point: the receive's dtype must be the send's ---- */

enum { P2P_ELEMS = 1 << 17 }; /* 1 MiB of 8-byte elements: held, then written in parts */

/* Rank 1 posts its receive as int64 first; rank 0 sends float64 later. */
static int p2p_dtype_body(rank_ctx *c) {
  distd_peers *p = c->f->r[c->rank].peers;
  double *buf = calloc(P2P_ELEMS, sizeof *buf);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t dl = distd_now_ms() + 20000;
  if (c->rank == 0) {
    usleep(100 * 1000);
    c->rc = distd_send_to(p, 40, 1, buf, P2P_ELEMS * sizeof *buf, DIST_FLOAT64, dl, &eb);
  } else {
    c->rc = distd_recv_from(p, 40, 0, buf, P2P_ELEMS * sizeof *buf, DIST_INT64, dl, &eb);
  }
  snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  free(buf);
  return 0;
}

Test(coll, a_p2p_receive_of_another_dtype_fails_naming_both) {
  peer_fixture f;
  fix_setup(&f, 2);
  rank_ctx ctx[FIX_MAX];
  run_ranks(&f, p2p_dtype_body, ctx);
  const char *want = "rank 0 runs op 40 as p2p(float64), but rank 1 as p2p(int64)";
  cr_expect_eq(ctx[1].rc, DIST_EMISMATCH, "receiver: %s", ctx[1].msg);
  cr_expect(strstr(ctx[1].msg, want), "receiver: '%s' expected: %s", want, ctx[1].msg);
  cr_expect_lt(ctx[1].elapsed_ms, 10000, "the receiver waited %lld ms",
               (long long)ctx[1].elapsed_ms);
  /* Its bytes may all be written before the receiver reads the header. */
  cr_expect(ctx[0].rc == 0 || (ctx[0].rc == DIST_EMISMATCH && strstr(ctx[0].msg, want)),
            "sender: %s", ctx[0].msg);
  fix_teardown(&f);
}

/* ---- one rank gets it wrong: everybody fails, fast ---- */

static int wrong_count_body(rank_ctx *c) {
  int group[FIX_MAX];
  distd_coll coll;
  for (int i = 0; i < c->n; i++) group[i] = i;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_coll_init(&coll, c->f->r[c->rank].peers, 30, group, c->n, distd_now_ms() + 20000, &eb);
  size_t n = c->rank == 1 ? 100001 : 100000; /* rank 1 is off by one */
  float *buf = calloc(n, sizeof *buf);
  c->rc = distd_allreduce(&coll, buf, n, DIST_FLOAT32, DIST_REDUCE_SUM, &eb);
  snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  free(buf);
  return 0;
}

static int wrong_algorithm_body(rank_ctx *c) {
  int group[FIX_MAX];
  distd_coll coll;
  for (int i = 0; i < c->n; i++) group[i] = i;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  distd_coll_init(&coll, c->f->r[c->rank].peers, 31, group, c->n, distd_now_ms() + 20000, &eb);
  size_t n = c->rank == 2 ? 10 : 1000000; /* direct on rank 2, two rounds elsewhere */
  float *buf = calloc(n, sizeof *buf);
  c->rc = distd_allreduce(&coll, buf, n, DIST_FLOAT32, DIST_REDUCE_SUM, &eb);
  snprintf(c->msg, sizeof c->msg, "%s", eb.msg);
  free(buf);
  return 0;
}

static void expect_all_fail_fast(int n, rank_body body) {
  peer_fixture f;
  fix_setup(&f, n);
  rank_ctx ctx[FIX_MAX];
  run_ranks(&f, body, ctx);
  for (int r = 0; r < n; r++) {
    cr_expect_neq(ctx[r].rc, 0, "rank %d succeeded", r);
    cr_expect_lt(ctx[r].elapsed_ms, 10000, "rank %d waited %lld ms: %s", r,
                 (long long)ctx[r].elapsed_ms, ctx[r].msg);
    cr_expect(strstr(ctx[r].msg, "rank "), "rank %d: message names no rank: %s", r, ctx[r].msg);
    cr_log_info("rank %d: %s (%s)", r, ctx[r].msg, dist_err_name(ctx[r].rc));
  }
  fix_teardown(&f);
}

Test(coll, a_wrong_count_on_one_rank_fails_every_rank) {
  expect_all_fail_fast(3, wrong_count_body);
}

Test(coll, a_count_that_picks_another_algorithm_fails_every_rank) {
  expect_all_fail_fast(4, wrong_algorithm_body);
}

Test(coll, a_lost_member_fails_the_others_naming_it) {
  peer_fixture f;
  fix_setup(&f, 3);
  /* Ranks 0 and 1 start an all-gather that rank 2 never joins; rank 2 goes. */
  rank_ctx ctx[FIX_MAX];
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    ctx[r] = (rank_ctx){.f = &f, .rank = r, .n = 3, .body = allgather_body};
    pthread_create(&t[r], NULL, rank_main, &ctx[r]);
  }
  usleep(100 * 1000);
  fix_stop_rank(&f, 2);
  for (int r = 0; r < 2; r++) {
    pthread_join(t[r], NULL);
    cr_expect_neq(ctx[r].failed, 0);
    cr_expect(strstr(ctx[r].msg, "rank 2"), "rank %d: %s", r, ctx[r].msg);
    cr_expect_lt(ctx[r].elapsed_ms, 10000, "rank %d: %s", r, ctx[r].msg);
  }
  fix_teardown(&f);
}
