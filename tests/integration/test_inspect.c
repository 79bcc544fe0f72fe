/* Remote inspection end to end: distctl ops / experts / params / metrics /
 * top / status against real daemons, with collectives issued through the raw
 * Collective RPC so that a rank can be made to never (or only later) join. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"

TestSuite(inspect, .fini = stop_cluster);

#define OP_STUCK 0x5eed0001ull
#define OP_SCATTER 0x5eed0002ull

static const float ones[4] = {1, 2, 3, 4};

/* One rank's part of an all-reduce over `group`, sent to that rank's daemon
 * only: what an SPMD trainer's dist_all_reduce sends. */
typedef struct part {
  harness *h;
  int rank;
  uint64_t op_id;
  const uint32_t *group;
  int group_size;
  int rc;
  float result[4];
} part;

static void *run_part(void *arg) {
  part *p = arg;
  dist_client *c = harness_client_rank(p->h, p->rank, 30000);
  Dist__V1__CollectiveRequest rq = DIST__V1__COLLECTIVE_REQUEST__INIT;
  rq.kind = DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE;
  rq.op_id = p->op_id;
  rq.group = (uint32_t *)p->group;
  rq.n_group = (size_t)p->group_size;
  rq.dtype = DIST__V1__DTYPE__FLOAT32;
  rq.reduce = DIST__V1__REDUCE_OP__REDUCE_SUM;
  rq.data.data = (uint8_t *)ones;
  rq.data.len = sizeof ones;
  ProtobufCMessage *rp = NULL;
  p->rc = dist_call_one(c, 0, "/dist.v1.Dist/Collective", &rq.base,
                        &dist__v1__collective_reply__descriptor, &rp);
  if (p->rc == 0 && ((Dist__V1__CollectiveReply *)rp)->data.len == sizeof p->result)
    memcpy(p->result, ((Dist__V1__CollectiveReply *)rp)->data.data, sizeof p->result);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  dist_close(c);
  return NULL;
}

/* Runs distctl with the harness's cluster file; returns its stdout. */
static char *distctl(harness *h, const char *args, int expect_rc) {
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout 10000 %s", harness_distctl(),
           h->cluster_file, args);
  int rc = harness_run(cmd, &out, &err, 60);
  cr_assert_eq(rc, expect_rc, "distctl %s exited %d: %s", args, rc, err ? err : "");
  free(err);
  return out;
}

static json_t *distctl_json(harness *h, const char *args) {
  char *out = distctl(h, args, 0);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_assert(j, "distctl %s --json printed no JSON (%s): %s", args, je.text, out);
  free(out);
  return j;
}

/* The op with op_id in rank r's list ("in_flight" or "recent"), or NULL. */
static json_t *find_op(json_t *ops_json, int r, const char *list, uint64_t op_id) {
  char id[24];
  snprintf(id, sizeof id, "%llu", (unsigned long long)op_id);
  json_t *rank = json_array_get(json_object_get(ops_json, "ranks"), (size_t)r);
  json_t *ops = json_object_get(rank, list), *o;
  size_t i;
  json_array_foreach(ops, i, o) {
    if (strcmp(json_string_value(json_object_get(o, "op_id")), id) == 0) return o;
  }
  return NULL;
}

/* Polls `distctl ops --json` (bounded) until rank r lists op_id in flight. */
static json_t *wait_in_flight(harness *h, int r, uint64_t op_id) {
  double until = harness_now_s() + 15;
  while (harness_now_s() < until) {
    json_t *j = distctl_json(h, "ops --json");
    json_t *o = find_op(j, r, "in_flight", op_id);
    if (o) {
      json_incref(o);
      json_decref(j);
      return o;
    }
    json_decref(j);
    usleep(100 * 1000);
  }
  cr_assert_fail("op %llx never showed in flight on rank %d", (unsigned long long)op_id, r);
  return NULL;
}

Test(inspect, ops_shows_a_stuck_collective_and_the_rank_it_waits_on, .timeout = 120) {
  harness_start(&cluster, 3, NULL);
  static const uint32_t group[2] = {0, 1};
  part p0 = {&cluster, 0, OP_STUCK, group, 2, -1, {0}};
  part p1 = {&cluster, 1, OP_STUCK, group, 2, -1, {0}};
  pthread_t t0, t1;
  pthread_create(&t0, NULL, run_part, &p0);

  /* Rank 1 has not joined: rank 0 shows the op waiting on rank 1 alone. */
  json_t *o = wait_in_flight(&cluster, 0, OP_STUCK);
  cr_assert_str_eq(json_string_value(json_object_get(o, "kind")), "all_reduce");
  cr_assert_str_eq(json_string_value(json_object_get(o, "state")), "running");
  json_t *waiting = json_object_get(o, "waiting_on");
  cr_assert_eq(json_array_size(waiting), 1, "waiting_on: %s", json_dumps(waiting, 0));
  cr_assert_eq(json_integer_value(json_array_get(waiting, 0)), 1);
  cr_assert_eq(json_integer_value(json_object_get(o, "bytes")), (json_int_t)sizeof ones);
  cr_assert_eq(json_array_size(json_object_get(o, "group")), 2);
  json_decref(o);

  /* The text view names the op and the rank, and status counts it. */
  char *text = distctl(&cluster, "ops", 0);
  char id[32];
  snprintf(id, sizeof id, "%llu", (unsigned long long)OP_STUCK);
  cr_assert(strstr(text, id) && strstr(text, "all_reduce") && strstr(text, "running"), "%s",
            text);
  free(text);
  json_t *st = distctl_json(&cluster, "status --json");
  json_t *r0 = json_array_get(json_object_get(st, "ranks"), 0);
  cr_assert_eq(json_integer_value(json_object_get(r0, "ops_in_flight")), 1);
  json_decref(st);

  /* Rank 1 joins late: both finish with the sum, and the op is recent. */
  pthread_create(&t1, NULL, run_part, &p1);
  pthread_join(t0, NULL);
  pthread_join(t1, NULL);
  cr_assert_eq(p0.rc, 0);
  cr_assert_eq(p1.rc, 0);
  for (int i = 0; i < 4; i++) cr_assert_float_eq(p0.result[i], 2 * ones[i], 1e-6);
  json_t *j = distctl_json(&cluster, "ops --json");
  for (int r = 0; r < 2; r++) {
    cr_assert_null(find_op(j, r, "in_flight", OP_STUCK), "rank %d still runs it", r);
    json_t *done = find_op(j, r, "recent", OP_STUCK);
    cr_assert(done, "rank %d does not list the finished op", r);
    cr_assert_str_eq(json_string_value(json_object_get(done, "state")), "done");
    cr_assert(json_real_value(json_object_get(done, "duration_seconds")) > 0);
  }
  cr_assert_null(find_op(j, 2, "recent", OP_STUCK), "rank 2 was never in the group");
  json_decref(j);
  stop_cluster();
}

Test(inspect, metrics_count_collectives_and_pass_promtool, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  static const uint32_t group[2] = {0, 1};
  part p[2] = {{&cluster, 0, 77, group, 2, -1, {0}}, {&cluster, 1, 77, group, 2, -1, {0}}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run_part, &p[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  cr_assert_eq(p[0].rc, 0);

  char *text = distctl(&cluster, "metrics --rank 1", 0);
  cr_assert(strstr(text, "distd_collectives_total{kind=\"all_reduce\",result=\"ok\"} 1"), "%s",
            text);
  cr_assert(strstr(text, "distd_ops_in_flight 0"), "%s", text);
  /* Listed from the start, daemon-wide (a transfer's sends go to several
   * peers), and 0 after a sound all-reduce. */
  cr_expect(strstr(text, "# TYPE distd_peer_reserve_mismatches_total counter\n") &&
                strstr(text, "\ndistd_peer_reserve_mismatches_total 0\n"),
            "no distd_peer_reserve_mismatches_total counter of 0:\n%s", text);
  free(text);

  if (access("/usr/bin/promtool", X_OK) != 0) {
    stop_cluster(); /* cr_skip ends the test at once, .fini not run */
    cr_skip("promtool check skipped: /usr/bin/promtool not installed");
  }
  char cmd[1024], *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s metrics --rank 0 | promtool check metrics",
           harness_distctl(), cluster.cluster_file);
  int rc = harness_run(cmd, NULL, &err, 60);
  cr_assert_eq(rc, 0, "promtool check metrics: %s", err ? err : "");
  free(err);

  json_t *j = distctl_json(&cluster, "metrics --rank 0 --json");
  json_t *samples = json_object_get(j, "samples"), *s;
  size_t i;
  int found = 0;
  json_array_foreach(samples, i, s) {
    if (strcmp(json_string_value(json_object_get(s, "name")), "distd_collectives_total"))
      continue;
    json_t *labels = json_object_get(s, "labels");
    if (!strcmp(json_string_value(json_object_get(labels, "kind")), "all_reduce")) {
      cr_assert_float_eq(json_real_value(json_object_get(s, "value")), 1, 1e-9);
      found = 1;
    }
  }
  cr_assert(found, "no distd_collectives_total sample for all_reduce");
  json_decref(j);
  stop_cluster();
}

/* Rank j sends (i+1)*(j+1) one-element rows to rank i. */
/* The ops of `kind` in rank r's list ("in_flight" or "recent"). */
static size_t count_kind(json_t *ops_json, int r, const char *list, const char *kind) {
  json_t *rank = json_array_get(json_object_get(ops_json, "ranks"), (size_t)r);
  json_t *ops = json_object_get(rank, list), *o;
  size_t i, n = 0;
  json_array_foreach(ops, i, o) {
    n += strcmp(json_string_value(json_object_get(o, "kind")), kind) == 0;
  }
  return n;
}

/* The exchange of verdicts of a put and of a reshard (every daemon applies
 * it or none does) is shown and counted as a "vote", not as an all-gather
 * the user never asked for. */
static void expect_votes(harness *h, int want) {
  json_t *j = distctl_json(h, "ops --json");
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(count_kind(j, r, "recent", "vote"), want, "rank %d", r);
    cr_assert_eq(count_kind(j, r, "recent", "all_gather"), 0, "rank %d", r);
  }
  json_decref(j);
  char *text = distctl(h, "metrics --rank 1", 0), line[96];
  snprintf(line, sizeof line, "distd_collectives_total{kind=\"vote\",result=\"ok\"} %d", want);
  cr_assert(strstr(text, line), "%s", text);
  free(text);
}

Test(inspect, a_put_and_a_reshard_show_their_votes_under_their_own_name, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  float w0[8] = {0};
  int64_t shape[1] = {8};
  dist_tensor *t = harness_put(c, "w", DIST_FLOAT32, w0, 1, shape, "[0,1]", "Shard(0)");
  expect_votes(&cluster, 1);
  dist_placement rep = DIST_REPLICATED;
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  expect_votes(&cluster, 2);
  dist_tensor_free(t);
  dist_close(c);
  stop_cluster();
}

Test(inspect, experts_show_tokens_routed_by_global_scatter, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  enum { W = 3 };
  Dist__V1__CollectiveRequest rq[W];
  uint64_t send[W][W], recv[W][W];
  float data[W][64];
  dist_call calls[W];
  for (int j = 0; j < W; j++) {
    size_t n = 0;
    for (int i = 0; i < W; i++) {
      send[j][i] = (uint64_t)((i + 1) * (j + 1));
      recv[j][i] = (uint64_t)((j + 1) * (i + 1)); /* from rank i to me = j */
      n += send[j][i];
    }
    for (size_t k = 0; k < n; k++) data[j][k] = (float)k;
    dist__v1__collective_request__init(&rq[j]);
    rq[j].kind = DIST__V1__COLLECTIVE_REQUEST__KIND__GLOBAL_SCATTER;
    rq[j].op_id = OP_SCATTER;
    rq[j].dtype = DIST__V1__DTYPE__FLOAT32;
    rq[j].data.data = (uint8_t *)data[j];
    rq[j].data.len = n * sizeof(float);
    rq[j].send_counts = send[j];
    rq[j].n_send_counts = W;
    rq[j].recv_counts = recv[j];
    rq[j].n_recv_counts = W;
    calls[j] = (dist_call){.target = j, .request = &rq[j].base};
  }
  int rc = dist_call_many(c, "/dist.v1.Dist/Collective", &dist__v1__collective_reply__descriptor,
                          calls, W);
  cr_assert_eq(rc, 0, "%s", dist_errmsg(c));
  dist_calls_free(calls, W);
  dist_close(c);

  json_t *j = distctl_json(&cluster, "experts --json");
  for (int r = 0; r < W; r++) {
    json_t *rank = json_array_get(json_object_get(j, "ranks"), (size_t)r);
    json_t *experts = json_object_get(rank, "experts");
    cr_assert_eq(json_array_size(experts), 1, "rank %d: %s", r, json_dumps(rank, 0));
    json_t *e = json_array_get(experts, 0);
    json_int_t want = 6 * (r + 1); /* sum over j of (r+1)(j+1) */
    cr_assert_eq(json_integer_value(json_object_get(e, "expert")), r);
    cr_assert_eq(json_integer_value(json_object_get(e, "tokens_total")), want);
    cr_assert_eq(json_integer_value(json_object_get(e, "tokens_recent")), want);
    cr_assert_eq(json_integer_value(json_object_get(e, "tokens_last")), want);
    cr_assert_eq(json_integer_value(json_object_get(e, "steps")), 1);
  }
  json_decref(j);
  char *text = distctl(&cluster, "metrics --rank 2", 0);
  cr_assert(strstr(text, "distd_expert_tokens_total{expert=\"2\"} 18"), "%s", text);
  free(text);
  if (access("/usr/bin/promtool", X_OK) == 0) { /* the expert family lints too */
    char cmd[1024], *err = NULL;
    snprintf(cmd, sizeof cmd, "%s --cluster %s metrics --rank 2 | promtool check metrics",
             harness_distctl(), cluster.cluster_file);
    int rc = harness_run(cmd, NULL, &err, 60);
    cr_assert_eq(rc, 0, "promtool check metrics: %s", err ? err : "");
    free(err);
  }
  text = distctl(&cluster, "experts", 0);
  cr_assert(strstr(text, "TOKENS_RECENT"), "%s", text);
  free(text);
  stop_cluster();
}

Test(inspect, top_refreshes_and_shows_every_rank, .timeout = 120) {
  harness_start(&cluster, 3, NULL);
  char *text = distctl(&cluster, "top --iterations 2 --interval 0.2", 0);
  int headers = 0;
  for (const char *p = text; (p = strstr(p, "distd top:")); p++) headers++;
  cr_assert_eq(headers, 2, "expected two refreshes: %s", text);
  for (int r = 0; r < 3; r++) {
    char line[16];
    snprintf(line, sizeof line, "\n%d ", r);
    cr_assert(strstr(text, line), "rank %d missing: %s", r, text);
  }
  cr_assert(strstr(text, "healthy"), "%s", text);
  free(text);

  json_t *j = distctl_json(&cluster, "top --json --interval 0.2");
  json_t *ranks = json_object_get(j, "ranks");
  cr_assert_eq(json_array_size(ranks), 3);
  for (int r = 0; r < 3; r++) {
    json_t *x = json_array_get(ranks, (size_t)r);
    cr_assert_eq(json_integer_value(json_object_get(x, "rank")), r);
    cr_assert_str_eq(json_string_value(json_object_get(x, "state")), "healthy");
    cr_assert_eq(json_integer_value(json_object_get(x, "peers_connected")), 2);
    cr_assert(json_is_real(json_object_get(x, "sent_bytes_per_second")));
  }
  json_decref(j);

  /* status shows version, uptime, memory, tensors and in-flight ops. */
  text = distctl(&cluster, "status", 0);
  cr_assert(strstr(text, "VERSION") && strstr(text, "UPTIME") && strstr(text, "MEMORY") &&
                strstr(text, "TENSORS") && strstr(text, "OPS"),
            "%s", text);
  free(text);
  stop_cluster();
}

Test(inspect, ops_of_a_down_rank_is_an_error_not_a_hang, .timeout = 120) {
  harness_start(&cluster, 2, NULL);
  harness_kill(&cluster, 1, 9);
  char cmd[1024], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --timeout 3000 ops --json", harness_distctl(),
           cluster.cluster_file);
  int rc = harness_run(cmd, &out, &err, 30);
  cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_assert(j, "no JSON: %s", out);
  cr_assert_eq(json_integer_value(json_object_get(j, "down")), 1);
  json_t *r1 = json_array_get(json_object_get(j, "ranks"), 1);
  cr_assert(json_string_value(json_object_get(r1, "error")), "%s", out);
  json_decref(j);
  free(out);
  free(err);
  stop_cluster();
}

/* Parameter "name" on rank r in a `distctl params --json` report. */
static json_t *param_on(json_t *report, int r, const char *name) {
  json_t *rank = json_array_get(json_object_get(report, "ranks"), (size_t)r);
  json_t *params = json_object_get(rank, "params"), *p;
  size_t i;
  json_array_foreach(params, i, p) {
    if (strcmp(json_string_value(json_object_get(p, "name")), name) == 0) return p;
  }
  cr_assert_fail("rank %d does not list parameter '%s'", r, name);
  return NULL;
}

static long long field(json_t *o, const char *key) {
  return (long long)json_integer_value(json_object_get(o, key));
}

/* The same figures on /metrics, a free-form name escaped, and promtool
 * (when installed) accepting the exposition. */
static void expect_param_metrics(harness *h, dist_client *c) {
  float z[2] = {0};
  int64_t sz[1] = {2};
  dist_tensor_free(harness_put(c, "odd\"name\\", DIST_FLOAT32, z, 1, sz, "[0,1]", "Shard(0)"));
  cr_assert_eq(dist_param_configure(c, "odd\"name\\", NULL), 0, "%s", dist_errmsg(c));
  char *text = distctl(h, "metrics --rank 0", 0);
  cr_assert(strstr(text, "distd_param_updates_total{param=\"w\"} 1\n"), "%s", text);
  cr_assert(strstr(text, "distd_param_updates_total{param=\"v\"} 3\n"), "%s", text);
  cr_assert(strstr(text, "distd_param_pushes_pending{param=\"w\"} 1\n"), "%s", text);
  cr_assert(strstr(text, "distd_param_updates_total{param=\"odd\\\"name\\\\\"} 0\n"), "%s",
            text);
  /* 72 (w) + 20 (v) + 4 (the sum of odd's one float, synchronous SGD) */
  cr_assert(strstr(text, "distd_param_state_bytes 96\n"), "%s", text);
  free(text);
  if (access("/usr/bin/promtool", X_OK) != 0) return;
  char cmd[1024], *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s metrics --rank 0 | promtool check metrics",
           harness_distctl(), h->cluster_file);
  int rc = harness_run(cmd, NULL, &err, 60);
  cr_assert_eq(rc, 0, "promtool check metrics: %s", err ? err : "");
  free(err);
}

/* w: AdamW, synchronous with two trainers, one update applied and trainer
 * 0's push for the next pending; v: SGD with momentum, asynchronous, three
 * pushes applied. distctl params shows each as configured, with the state
 * each daemon reserves (Adam's m and v plus the pending sum, momentum
 * alone), and names w once its daemons disagree on the updates applied. */
Test(inspect, params_show_optimizer_steps_pending_and_state, .timeout = 120) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  float w0[6 * 2] = {0}, v0[5] = {0}, gw[12], gv[5];
  for (int i = 0; i < 12; i++) gw[i] = 0.5f * (float)i;
  for (int i = 0; i < 5; i++) gv[i] = 1.0f + (float)i;
  int64_t sw[2] = {6, 2}, sv[1] = {5};
  dist_tensor_free(harness_put(c, "w", DIST_FLOAT32, w0, 2, sw, "[0,1]", "Shard(0)"));
  dist_tensor_free(harness_put(c, "v", DIST_FLOAT32, v0, 1, sv, "[0,1]", "Replicate()"));
  dist_param_opts adamw = DIST_PARAM_OPTS_INIT, sgd = DIST_PARAM_OPTS_INIT;
  adamw.optimizer = DIST_OPT_ADAMW;
  adamw.lr = 0.05;
  adamw.trainers = 2;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.consistency = DIST_PARAM_ASYNC;
  cr_assert_eq(dist_param_configure(c, "w", &adamw), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_param_configure(c, "v", &sgd), 0, "%s", dist_errmsg(c));
  for (int t = 0; t < 3; t++)
    cr_assert_eq(dist_param_push(c, "w", t % 2, gw, sizeof gw, NULL), 0, "%s", dist_errmsg(c));
  for (int k = 0; k < 3; k++)
    cr_assert_eq(dist_param_push(c, "v", 0, gv, sizeof gv, NULL), 0, "%s", dist_errmsg(c));
  void *data = NULL;
  size_t nbytes = 0;
  uint64_t w_version = 0;
  cr_assert_eq(dist_param_pull(c, "w", 0, &data, &nbytes, &w_version), 0, "%s", dist_errmsg(c));
  free(data);

  json_t *j = distctl_json(&cluster, "params --json");
  for (int r = 0; r < 2; r++) {
    json_t *w = param_on(j, r, "w"), *v = param_on(j, r, "v");
    cr_assert_str_eq(json_string_value(json_object_get(w, "optimizer")), "adamw");
    cr_assert_float_eq(json_real_value(json_object_get(w, "lr")), 0.05, 1e-12);
    cr_assert_str_eq(json_string_value(json_object_get(w, "consistency")), "sync");
    cr_assert_eq(field(w, "trainers"), 2);
    cr_assert_eq(field(w, "step"), 1);
    cr_assert_eq(field(w, "pending"), 1);
    cr_assert_eq(field(w, "state_bytes"), 3 * 2 * 4 * 3, "m, v and the sum of 3x2 floats");
    cr_assert_eq(field(w, "version"), (long long)w_version);
    cr_assert_str_eq(json_string_value(json_object_get(v, "optimizer")), "sgd");
    cr_assert_float_eq(json_real_value(json_object_get(v, "momentum")), 0.9, 1e-12);
    cr_assert_str_eq(json_string_value(json_object_get(v, "consistency")), "async");
    cr_assert_eq(field(v, "step"), 3);
    cr_assert_eq(field(v, "pending"), 0);
    cr_assert_eq(field(v, "state_bytes"), 5 * 4, "the momentum of 5 floats");
  }
  cr_assert_eq(json_array_size(json_object_get(j, "steps_differ")), 0);
  json_decref(j);
  char *text = distctl(&cluster, "params", 0);
  cr_assert(strstr(text, "OPTIMIZER") && strstr(text, "adamw") && strstr(text, "async"), "%s",
            text);
  free(text);
  expect_param_metrics(&cluster, c);

  /* distctl param tune: v's learning rate, its momentum buffer and
   * updates kept; a change of what shapes the state is refused. */
  j = distctl_json(&cluster, "param tune v --lr 0.2 --json");
  json_t *lr = json_object_get(json_object_get(j, "changed"), "lr");
  cr_assert_float_eq(json_real_value(json_object_get(lr, "before")), 0.1, 1e-12);
  cr_assert_float_eq(json_real_value(json_object_get(lr, "after")), 0.2, 1e-12);
  json_decref(j);
  j = distctl_json(&cluster, "params --json");
  for (int r = 0; r < 2; r++) {
    cr_assert_float_eq(json_real_value(json_object_get(param_on(j, r, "v"), "lr")), 0.2, 1e-12);
    cr_assert_eq(field(param_on(j, r, "v"), "step"), 3);
  }
  json_decref(j);
  char *refused = distctl(&cluster, "param tune v --momentum 0", 1);
  free(refused);

  /* Trainer 1's piece to rank 1 alone completes the update there only. */
  cr_assert_eq(dist_param_push_local(c, "w", 1, 1, gw + 6, 6 * sizeof(float), NULL), 0, "%s",
               dist_errmsg(c));
  char *out = distctl(&cluster, "params --json", 1);
  j = json_loads(out, 0, NULL);
  cr_assert(j, "%s", out);
  cr_assert_eq(field(param_on(j, 0, "w"), "step"), 1);
  cr_assert_eq(field(param_on(j, 1, "w"), "step"), 2);
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "steps_differ"), 0)),
                   "w");
  json_decref(j);
  free(out);
  dist_close(c);
  stop_cluster();
}
