/* A collective allocates the send items of each of its rounds before it
 * posts the first (distd_xfer_reserve_sends), so that one cannot fail
 * midway for memory after some peers got its bytes; a wait counts a round
 * whose sends took more or fewer than it reserved, in
 * distd_peer_reserve_mismatches_total. Here three daemons run a varied
 * workload of SPMD trainers (uneven all-to-all and reduce-scatter, both
 * all-reduce algorithms, all-gather, broadcast, count_global,
 * global_scatter and its inverse) and of a single client (reshards across
 * placements and meshes, each with its vote), each result checked, and
 * then every daemon must count 0. Only coll.c's rounds reserve (the
 * collectives, count_global, the votes); global_scatter's rows and a
 * reshard's moves allocate each send as they post it, so they are here
 * as load, not as what the count checks. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h" /* dist_call_one: raw ALL_TO_ALL / REDUCE_SCATTER */
#include "harness_fixture.h"

#define W 3
#define E 2 /* experts per rank in the MoE exchanges */
#define D_MODEL 3
#define BIG (1u << 18) /* float32 elements: the two-round all-reduce */
#define OP_ALL_TO_ALL 0x7e5e0001ull
#define OP_REDUCE_SCATTER 0x7e5e0002ull

TestSuite(reserved_sends, .fini = stop_cluster);

typedef struct trainer {
  dist_client *c;
  int rank;
  char failed[600]; /* the first check that failed, "" when none */
} trainer;

/* Records the first failure of t (threads do not assert). */
static int fail(trainer *t, const char *what, const char *why) {
  if (!t->failed[0]) snprintf(t->failed, sizeof t->failed, "%s: %s", what, why);
  return -1;
}

static int check(trainer *t, int rc, const char *what) {
  return rc ? fail(t, what, dist_errmsg(t->c)) : 0;
}

/* A raw collective of kind over every rank, int32 data; on success *out
 * is the reply's data (malloc'd) and *n its elements. */
static int raw_collective(trainer *t, Dist__V1__CollectiveRequest__Kind kind, uint64_t op_id,
                          const int32_t *data, size_t n_data, uint64_t *send_counts,
                          uint64_t *recv_counts, int32_t **out, size_t *n) {
  static const uint32_t group[W] = {0, 1, 2};
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = kind;
  rq.op_id = op_id;
  rq.group = (uint32_t *)group;
  rq.n_group = W;
  rq.dtype = DIST__V1__DTYPE__INT32;
  rq.reduce = DIST__V1__REDUCE_OP__REDUCE_SUM;
  rq.data.data = (uint8_t *)data;
  rq.data.len = n_data * sizeof *data;
  rq.send_counts = send_counts;
  rq.n_send_counts = W;
  rq.recv_counts = recv_counts;
  rq.n_recv_counts = recv_counts ? W : 0;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(t->c, t->rank, "/dist.v1.Dist/Collective", &rq.base,
                         &dist__v1__collective_reply__descriptor, &rp);
  if (rc == 0) {
    const Dist__V1__CollectiveReply *r = (const void *)rp;
    *n = r->data.len / sizeof **out;
    *out = malloc(r->data.len + 1);
    memcpy(*out, r->data.data, r->data.len);
  }
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  return rc;
}

/* All-to-all, uneven: rank j sends (i+1)*(j+1) elements to rank i, the
 * k-th of them 100*j + 10*i + k. */
static int uneven_all_to_all(trainer *t) {
  int r = t->rank;
  int32_t data[W * W * W];
  uint64_t send[W], recv[W];
  size_t n = 0;
  for (int i = 0; i < W; i++) {
    send[i] = (uint64_t)((i + 1) * (r + 1));
    recv[i] = (uint64_t)((r + 1) * (i + 1));
    for (int k = 0; k < (int)send[i]; k++) data[n++] = 100 * r + 10 * i + k;
  }
  int32_t *got = NULL;
  size_t got_n = 0, at = 0;
  if (check(t, raw_collective(t, DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL,
                              OP_ALL_TO_ALL, data, n, send, recv, &got, &got_n),
            "all_to_all"))
    return -1;
  int bad = got_n != (size_t)((r + 1) * (1 + 2 + 3));
  for (int j = 0; j < W && !bad; j++)
    for (int k = 0; k < (int)recv[j] && !bad; k++) bad = got[at++] != 100 * j + 10 * r + k;
  free(got);
  return bad ? fail(t, "all_to_all", "wrong elements") : 0;
}

/* Reduce-scatter, uneven: every rank sends element p as 1000*rank + p;
 * member i gets i+1 elements, the sums at positions 0, 1..2, 3..5. */
static int uneven_reduce_scatter(trainer *t) {
  int r = t->rank, off = r * (r + 1) / 2;
  int32_t data[6];
  uint64_t counts[W] = {1, 2, 3};
  for (int p = 0; p < 6; p++) data[p] = 1000 * r + p;
  int32_t *got = NULL;
  size_t got_n = 0;
  if (check(t, raw_collective(t, DIST__V1__COLLECTIVE_REQUEST__KIND__REDUCE_SCATTER,
                              OP_REDUCE_SCATTER, data, 6, counts, NULL, &got, &got_n),
            "reduce_scatter"))
    return -1;
  int bad = got_n != (size_t)(r + 1);
  for (int k = 0; k <= r && !bad; k++) bad = got[k] != 3000 + 3 * (off + k);
  free(got);
  return bad ? fail(t, "reduce_scatter", "wrong sums") : 0;
}

/* A small all-reduce (one round) and a big one (reduce-scatter, then
 * all-gather), an all-gather and a broadcast from rank 2. */
static int libdist_collectives(trainer *t) {
  int32_t v[4] = {t->rank + 1, t->rank + 1, t->rank + 1, t->rank + 1}, all[W];
  if (check(t, dist_all_reduce(t->c, v, 4, DIST_INT32, DIST_REDUCE_SUM, NULL, 0), "all_reduce"))
    return -1;
  if (v[0] != 6 || v[3] != 6) return fail(t, "all_reduce", "1 + 2 + 3 is not 6");
  float *big = malloc(BIG * sizeof *big);
  for (size_t i = 0; i < BIG; i++) big[i] = (float)(i % 7);
  int rc = dist_all_reduce(t->c, big, BIG, DIST_FLOAT32, DIST_REDUCE_SUM, NULL, 0);
  int bad = rc == 0 && (big[0] != 0 || big[BIG - 1] != (float)(3 * ((BIG - 1) % 7)));
  free(big);
  if (check(t, rc, "big all_reduce") || (bad && fail(t, "big all_reduce", "wrong sums")))
    return -1;
  int32_t mine = 10 * t->rank;
  if (check(t, dist_all_gather(t->c, &mine, 1, all, DIST_INT32, NULL, 0), "all_gather"))
    return -1;
  if (all[0] != 0 || all[1] != 10 || all[2] != 20) return fail(t, "all_gather", "wrong pieces");
  int32_t root = t->rank;
  if (check(t, dist_broadcast(t->c, &root, 1, DIST_INT32, 2, NULL, 0), "broadcast")) return -1;
  return root == 2 ? 0 : fail(t, "broadcast", "not rank 2's value");
}

/* Rank s's count of rows for expert e of rank i: uneven, some 0. */
static int64_t local_count(int s, int i, int e) { return (s + 2 * i + e) % 4; }

/* count_global (an all-to-all of counts), then global_scatter of rows
 * valued by their position, and global_gather of the result, which must
 * give the rows back. */
static int moe_exchanges(trainer *t) {
  int r = t->rank;
  int64_t lc[W * E], gc[W * E], rows = 0, out_rows = 0, back_rows = 0;
  for (int i = 0; i < W; i++)
    for (int e = 0; e < E; e++) rows += lc[i * E + e] = local_count(r, i, e);
  const int64_t *lcs[1] = {lc}, *gcs[1] = {gc};
  int64_t *gc_out[1] = {gc};
  if (check(t, dist_count_global(t->c, lcs, E, NULL, 0, gc_out), "count_global")) return -1;
  for (int s = 0; s < W; s++)
    for (int e = 0; e < E; e++)
      if (gc[s * E + e] != local_count(s, r, e)) return fail(t, "count_global", "not lc's transpose");
  float *x = malloc((size_t)(rows * D_MODEL) * sizeof *x + 1);
  for (int64_t i = 0; i < rows * D_MODEL; i++) x[i] = (float)(1000 * r + i);
  const void *xs[1] = {x};
  void *out[1] = {NULL}, *back[1] = {NULL};
  int rc = dist_global_scatter(t->c, xs, NULL, DIST_FLOAT32, D_MODEL, lcs, gcs, E, NULL, 0,
                               NULL, out, &out_rows);
  if (rc == 0)
    rc = dist_global_gather(t->c, (const void *const *)out, &out_rows, DIST_FLOAT32, D_MODEL,
                            lcs, gcs, E, NULL, 0, NULL, back, &back_rows);
  int bad = rc == 0 && (back_rows != rows ||
                        memcmp(back[0], x, (size_t)(rows * D_MODEL) * sizeof *x) != 0);
  free(x), free(out[0]), free(back[0]);
  if (check(t, rc, "global_scatter and gather")) return -1;
  return bad ? fail(t, "global_gather", "the scattered rows did not come back") : 0;
}

static void *trainer_main(void *arg) {
  trainer *t = arg;
  if (uneven_all_to_all(t) == 0 && uneven_reduce_scatter(t) == 0 &&
      libdist_collectives(t) == 0)
    moe_exchanges(t);
  return NULL;
}

static void run_trainers(void) {
  trainer tr[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) /* harness_spmd_client: from one thread */
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, "reserved-sends"), .rank = r};
  for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, trainer_main, &tr[r]);
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++) {
    dist_close(tr[r].c);
    cr_expect_str_empty(tr[r].failed, "rank %d: %s", r, tr[r].failed);
  }
}

/* A 7x5 tensor through uneven shards, a replicate, a partial and another
 * mesh order, whole and unchanged after each reshard. */
static void run_reshards(void) {
  static const char *const steps[][2] = {
      {"[0,1,2]", "Shard(1)"}, {"[0,1,2]", "Replicate()"}, {"[2,0,1]", "Shard(0)"},
      {"[2,0,1]", "Partial(sum)"}, {"[1,2,0]", "Shard(1)"}, {"[0,1,2]", "Shard(0)"},
  };
  float v[35];
  for (int i = 0; i < 35; i++) v[i] = (float)(i - 17);
  const int64_t shape[2] = {7, 5};
  dist_client *c = harness_client(&cluster);
  dist_tensor *t = harness_put(c, "w", DIST_FLOAT32, v, 2, shape, "[0,1,2]", "Shard(0)");
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    dist_mesh *m = NULL;
    dist_placement p[1];
    cr_assert_eq(dist_mesh_from_string(steps[s][0], NULL, &m), 0);
    cr_assert_eq(dist_parse_placements(steps[s][1], p, 1), 1);
    cr_assert_eq(dist_reshard(c, t, m, p), 0, "to %s %s: %s", steps[s][0], steps[s][1],
                 dist_errmsg(c));
    dist_mesh_free(m);
    harness_expect_value(c, "w", v, sizeof v);
  }
  dist_tensor_free(t);
  dist_close(c);
}

Test(reserved_sends, a_varied_workload_takes_exactly_the_sends_it_reserved, .timeout = 180) {
  harness_start(&cluster, W, NULL);
  run_trainers();
  run_reshards();
  for (int r = 0; r < W; r++) {
    char *m = harness_metrics(&cluster, r);
    cr_expect_eq(harness_metric_sample(m, "distd_peer_reserve_mismatches_total"), 0,
                 "rank %d counts transfers that took other than they reserved:\n%s", r, m);
    /* the workload ran there: its all-to-all was counted */
    cr_expect_geq(harness_metric_sample(
                      m, "distd_collectives_total{kind=\"all_to_all\",result=\"ok\"}"),
                  1, "rank %d ran no all_to_all:\n%s", r, m);
    free(m);
  }
  stop_cluster();
}
