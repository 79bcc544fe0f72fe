/* The tape's own refusals in SPMD mode, between two trainers (threads)
 * on two real daemons: trainer 0 gives one bad argument, trainer 1 makes
 * the same call with good ones. Trainer 0 is told DIST_EINVAL naming it;
 * trainer 1 fails at once, told that rank 0 aborted its op and why (not
 * at its deadline); and an all-reduce of both afterwards meets with the
 * right sum, which it does only when both took the same op ids. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "reply_hold.h"

static const float seed_x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
static const int64_t seed_counts[2][4] = {{2, 1, 1, 1}, {1, 1, 2, 1}};
static const float ones[16][2] = {{1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1},
                                  {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1},
                                  {1, 1}, {1, 1}, {1, 1}, {1, 1}};

/* LocalLayer calls on the tape of scattered_with_layers_and_gathered: a
 * refused backward aborts each one's backward after its plan's ids, 13
 * exchanges apiece, more than the daemons' ring of 256 once held. */
#define MANY_LAYERS 20

/* Before the call: 0 or why it failed (in tr->msg). */
typedef struct trainer trainer;
typedef int (*prelude_fn)(trainer *tr);
/* The call, bad on trainer 0 (tr->bad); its code. */
typedef int (*call_fn)(trainer *tr);

/* What one trainer holds: its tape and what the case made before its call. */
struct trainer {
  prelude_fn prelude;
  call_fn call;
  dist_client *c;
  int rank, bad;
  dist_tape *t;
  dist_mesh *m;
  dist_program *p;
  dist_tensor *y, *z, *loss, *r, *g;
  dist_tensor *losses[MANY_LAYERS];
  int64_t y_rows, z_rows;
  const void *xs[1];
  const int64_t *lcs[1];
  int rc, reduced;
  double took;
  char msg[512];
};

TestSuite(recording, .fini = stop_cluster);
TestSuite(backward, .fini = stop_cluster);
TestSuite(undo, .fini = stop_cluster);

/* ---------------------------------------------------------------- preludes */

static dist_tape_exchange seed_exchange(trainer *tr) {
  tr->xs[0] = seed_x;
  tr->lcs[0] = seed_counts[tr->rank];
  return (dist_tape_exchange){"x", tr->xs, NULL, DIST_FLOAT32, 2, tr->lcs, tr->lcs, 2,
                              NULL, 0, "y", 0};
}

static int fail(trainer *tr, const char *what, int rc) {
  if (rc) snprintf(tr->msg, sizeof tr->msg, "%s: %s", what, dist_errmsg(tr->c));
  return rc;
}

static int new_tape(trainer *tr) { return fail(tr, "tape", dist_tape_new(tr->c, &tr->t)); }

/* y = global_scatter(x) on the tape. */
static int scattered(trainer *tr) {
  int rc = new_tape(tr);
  dist_tape_exchange a = seed_exchange(tr);
  if (rc == 0) rc = dist_tape_global_scatter(tr->t, &a, &tr->y, &tr->y_rows);
  return fail(tr, "scatter", rc);
}

/* y as above, and sum_sq registered (loss = sum(y * y), Partial(sum)). */
static int scattered_with_program(trainer *tr) {
  int rc = scattered(tr);
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  if (rc == 0) rc = dist_mesh_new(1, shape, ranks, NULL, &tr->m);
  if (rc == 0) rc = dist_program_new("sum_sq", &tr->p);
  if (rc) return fail(tr, "program", rc);
  int yv = dist_input_dtensor(tr->p, "y", DIST_FLOAT32);
  dist_program_output(tr->p, dist_op_sum(tr->p, dist_op_mul(tr->p, yv, yv), NULL, 0, 0));
  dist_program_out_dist_attr(tr->p, tr->m, &psum, NULL);
  return fail(tr, "register", dist_program_register(tr->c, tr->p));
}

/* y as above, and loss = sum_sq(y) on the tape. */
static int chain(trainer *tr) {
  int rc = scattered_with_program(tr);
  dist_arg arg = {tr->y, NULL};
  if (rc == 0) rc = fail(tr, "call", dist_tape_local_layer_call(tr->t, tr->p, &arg, 1, NULL,
                                                                &tr->loss));
  return rc;
}

/* y as above, and z = global_gather(y) on the tape. */
static int scattered_and_gathered(trainer *tr) {
  int rc = scattered(tr);
  dist_tape_exchange a = seed_exchange(tr);
  a.x_name = "y";
  a.x = NULL; /* y, as the daemons hold it */
  a.out_name = "z";
  if (rc == 0) rc = dist_tape_global_gather(tr->t, &a, &tr->z, &tr->z_rows);
  return fail(tr, "gather", rc);
}

/* y as above, MANY_LAYERS losses sum_sq(y), then z = global_gather(y):
 * a plan of ~40 ids. */
static int scattered_with_layers_and_gathered(trainer *tr) {
  int rc = scattered_with_program(tr);
  dist_arg arg = {tr->y, NULL};
  for (int k = 0; rc == 0 && k < MANY_LAYERS; k++)
    rc = fail(tr, "call", dist_tape_local_layer_call(tr->t, tr->p, &arg, 1, NULL,
                                                     &tr->losses[k]));
  dist_tape_exchange a = seed_exchange(tr);
  a.x_name = "y";
  a.x = NULL;
  a.out_name = "z";
  if (rc == 0) rc = fail(tr, "gather", dist_tape_global_gather(tr->t, &a, &tr->z, &tr->z_rows));
  return rc;
}

/* name = [[1, 2], [3, 4]] on [0, 1] with placement pl, put by both trainers. */
static int put(trainer *tr, const char *name, dist_placement pl, dist_tensor **out) {
  static const float v[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2};
  int sh[1] = {2}, ranks[2] = {0, 1};
  int rc = tr->m ? 0 : dist_mesh_new(1, sh, ranks, NULL, &tr->m);
  if (rc == 0) rc = dist_shard_tensor(tr->c, name, v, DIST_FLOAT32, 2, shape, tr->m, &pl, out);
  return fail(tr, name, rc);
}

/* r on [0, 1], Shard(0), and an empty tape. */
static int put_r(trainer *tr) {
  int rc = put(tr, "r", DIST_SHARD_DIM(0), &tr->r);
  return rc ? rc : new_tape(tr);
}

/* r resharded to Replicate on the tape, and g (its gradient's seed) stored
 * Replicate. */
static int resharded_r(trainer *tr) {
  dist_placement rep = DIST_REPLICATED;
  int rc = put_r(tr);
  if (rc == 0) rc = fail(tr, "reshard", dist_tape_reshard(tr->t, tr->r, NULL, &rep));
  if (rc == 0) rc = put(tr, "g", rep, &tr->g);
  return rc;
}

/* ---------------------------------------------------------------- calls */

static int scatter_without_a(trainer *tr) {
  dist_tape_exchange a = seed_exchange(tr);
  return dist_tape_global_scatter(tr->t, tr->bad ? NULL : &a, &tr->y, NULL);
}

static int scatter_without_a_count(trainer *tr) {
  dist_tape_exchange a = seed_exchange(tr);
  const int64_t *none[1] = {NULL};
  if (tr->bad) a.local_count = none;
  return dist_tape_global_scatter(tr->t, &a, &tr->y, NULL);
}

static int gather_without_out_name(trainer *tr) {
  dist_tape_exchange a = seed_exchange(tr);
  if (tr->bad) a.out_name = NULL;
  return dist_tape_global_gather(tr->t, &a, &tr->y, NULL);
}

static int layer_call_without_outs(trainer *tr) {
  dist_arg arg = {tr->y, NULL};
  return dist_tape_local_layer_call(tr->t, tr->p, &arg, 1, NULL, tr->bad ? NULL : &tr->loss);
}

static int reshard_on_a_released_tape(trainer *tr) {
  dist_placement rep = DIST_REPLICATED;
  if (tr->bad) dist_tape_release(tr->t);
  return dist_tape_reshard(tr->t, tr->r, NULL, &rep);
}

/* Backward from out, given grads (NULL: the loss's 1); trainer 0's
 * output is NULL. */
static int backward_from(trainer *tr, const dist_tensor *out, const dist_arg *grads) {
  const dist_tensor *outs[1] = {tr->bad ? NULL : out};
  return dist_tape_backward(tr->t, outs, grads, 1);
}

static int backward_from_loss_with_a_null_output(trainer *tr) {
  return backward_from(tr, tr->loss, NULL);
}

/* y's gradient: ones, this trainer's rows. */
static dist_arg y_grad(trainer *tr, dist_value *v) {
  *v = (dist_value){ones, DIST_FLOAT32, 2, {tr->y_rows, 2}};
  return (dist_arg){NULL, v};
}

static int backward_from_y_with_a_null_output(trainer *tr) {
  dist_value v;
  dist_arg g = y_grad(tr, &v);
  return backward_from(tr, tr->y, &g);
}

static int backward_from_r_with_a_null_output(trainer *tr) {
  dist_arg g = {tr->g, NULL};
  return backward_from(tr, tr->r, &g);
}

/* Gradients for z and y, ones of this trainer's rows; trainer 0's for y
 * are float64. Refused where y's seed is stored, to be added to the
 * gradient the gather's backward gave y: one per-rank store, which nobody
 * waits for, after the first exchange; the others then add (two ids more)
 * and wait at the scatter's backward, which needs rank 0. */
static int backward_from_z_and_y_with_y_of_another_dtype(trainer *tr) {
  static const double ones64[16][2];
  dist_value vz = {ones, DIST_FLOAT32, 2, {tr->z_rows, 2}};
  dist_value vy = {tr->bad ? (const void *)ones64 : ones, tr->bad ? DIST_FLOAT64 : DIST_FLOAT32,
                   2, {tr->y_rows, 2}};
  dist_arg g[2] = {{NULL, &vz}, {NULL, &vy}};
  const dist_tensor *outs[2] = {tr->z, tr->y};
  return dist_tape_backward(tr->t, outs, g, 2);
}

/* Backward from z, given ones, the other trainer late: it reaches the
 * gather's backward, the plan's first id, after every abort of trainer
 * 0's refusal came, the LocalLayer backwards' last; trainer 0's output
 * is NULL. */
static int backward_from_z_late_with_a_null_output(trainer *tr) {
  if (!tr->bad) harness_sleep_ms(1500);
  dist_value v = {ones, DIST_FLOAT32, 2, {tr->z_rows, 2}};
  dist_arg g = {NULL, &v};
  return backward_from(tr, tr->z, &g);
}

/* Trainer 0 seeds r, which is not a scalar, with the loss's 1; the others
 * give g. */
static int backward_from_r_given_the_loss_1(trainer *tr) {
  dist_arg g = {tr->g, NULL};
  const dist_tensor *outs[1] = {tr->r};
  return dist_tape_backward(tr->t, outs, tr->bad ? NULL : &g, 1);
}

/* The loss's gradient as a value, 1; trainer 0's without data. */
static int backward_from_loss_given_a_value_without_data(trainer *tr) {
  static const float one = 1;
  dist_value v = {tr->bad ? NULL : &one, DIST_FLOAT32, tr->loss->shape.ndim, {0}};
  for (int d = 0; d < v.ndim; d++) v.shape[d] = tr->loss->shape.dims[d];
  dist_arg g = {NULL, &v};
  const dist_tensor *outs[1] = {tr->loss};
  return dist_tape_backward(tr->t, outs, &g, 1);
}

/* Trainer 0 gives no gradient for an exchange result (the loss's 1 is for
 * LocalLayer outputs), refused at the exchange's step. */
static int backward_from_y_without_its_gradient(trainer *tr) {
  dist_value v;
  dist_arg g = y_grad(tr, &v);
  const dist_tensor *outs[1] = {tr->y};
  return dist_tape_backward(tr->t, outs, tr->bad ? NULL : &g, 1);
}

/* ---------------------------------------------------------------- the run */

static void *run_trainer(void *arg) {
  trainer *tr = arg;
  if (tr->prelude(tr)) return NULL;
  double t0 = harness_now_s();
  tr->rc = tr->call(tr);
  tr->took = harness_now_s() - t0;
  snprintf(tr->msg, sizeof tr->msg, "%s", tr->rc ? dist_errmsg(tr->c) : "");
  tr->reduced = harness_in_step(tr->c, tr->rank, 2);
  return NULL;
}

static void trainer_free(trainer *tr) {
  dist_tape_free(tr->t);
  dist_tensor_free(tr->y), dist_tensor_free(tr->z), dist_tensor_free(tr->loss);
  dist_tensor_free(tr->r), dist_tensor_free(tr->g);
  for (int k = 0; k < MANY_LAYERS; k++) dist_tensor_free(tr->losses[k]);
  dist_program_free(tr->p);
  dist_mesh_free(tr->m);
  dist_close(tr->c);
}

/* Trainer 0's call, refused with code and a message holding why;
 * trainer 1's, failed within 5 s (half its deadline, as two shared cores
 * are slow at times) by rank 0's abort naming why; then both trainers'
 * all-reduce. Trainer 1's deadline is 10 s (waiting it out
 * shows), trainer 0's 30 s: its all-reduce waits for trainer 1's call. */
static void run_case(const char *job, prelude_fn prelude, call_fn call, int code,
                     const char *why) {
  harness_start(&cluster, 2, NULL);
  trainer tr[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.prelude = prelude, .call = call, .rank = r, .bad = r == 0,
                      .c = harness_spmd_client(&cluster, r, job)};
    tr[r].c->timeout_ms = r ? 10000 : 30000;
  }
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, run_trainer, &tr[r]);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  cr_expect_eq(tr[0].rc, code, "trainer 0: %d %s", tr[0].rc, tr[0].msg);
  cr_expect(strstr(tr[0].msg, why), "trainer 0: %s (want '%s')", tr[0].msg, why);
  cr_expect_neq(tr[1].rc, 0, "trainer 1 succeeded");
  cr_expect_lt(tr[1].took, 5.0, "trainer 1 waited %.1f s: %s", tr[1].took, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, why),
            "trainer 1: %s (want rank 0's abort, '%s')", tr[1].msg, why);
  for (int r = 0; r < 2; r++) {
    cr_expect(tr[r].reduced, "trainer %d: the all-reduce after the refused call failed", r);
    trainer_free(&tr[r]);
  }
  stop_cluster();
}

/* One test per case: its suite and name, its job id (the op ids' base),
 * what both trainers do before the call, the call, and why trainer 0
 * refuses it (DIST_EINVAL, or code). */
#define TAPE_CASE_CODE(suite, name, job, prelude, call, code, why) \
  Test(suite, name, .timeout = 90) { run_case(job, prelude, call, code, why); }
#define TAPE_CASE(suite, name, job, prelude, call, why) \
  TAPE_CASE_CODE(suite, name, job, prelude, call, DIST_EINVAL, why)

static const char null_output[] = "dist_tape_backward: outputs[0] is NULL";

TAPE_CASE(recording, a_scatter_without_a, "tape-no-a", new_tape, scatter_without_a,
          "dist_tape_global_scatter: a is NULL")
TAPE_CASE(recording, a_scatter_without_a_count_entry, "tape-no-count", new_tape,
          scatter_without_a_count, "dist_tape_global_scatter: local_count[0] is NULL")
TAPE_CASE(recording, a_gather_without_its_result_name, "tape-no-name", new_tape,
          gather_without_out_name, "the tape needs a name for the result (out_name)")
TAPE_CASE(recording, a_layer_call_without_outs, "tape-no-outs", scattered_with_program,
          layer_call_without_outs, "dist_tape_local_layer_call: outs is NULL")
TAPE_CASE(recording, a_reshard_on_a_released_tape, "tape-released", put_r,
          reshard_on_a_released_tape, "reshard: the tape was released")
/* The other trainer's first step: the LocalLayer call's backward. */
TAPE_CASE(backward, a_null_output_before_a_layer_step, "tape-null-loss", chain,
          backward_from_loss_with_a_null_output, null_output)
/* The other trainer's first step: the scatter's backward (a gather). */
TAPE_CASE(backward, a_null_output_before_an_exchange_step, "tape-null-y", scattered,
          backward_from_y_with_a_null_output, null_output)
/* The other trainer's first step: the reshard's backward from a stored
 * seed (its copy, then the reshard back). */
TAPE_CASE(backward, a_null_output_before_a_reshard_step, "tape-null-r", resharded_r,
          backward_from_r_with_a_null_output, null_output)
TAPE_CASE(backward, an_exchange_result_without_its_gradient, "tape-no-grad", scattered,
          backward_from_y_without_its_gradient,
          "'y' is an exchange result: its gradient must be given")
/* The other trainer's steps: the gather's backward, y's seed stored, the
 * add, then the scatter's backward: five ids, past the three a refused
 * backward once aborted and took. */
TAPE_CASE_CODE(backward, a_per_rank_seed_of_another_dtype_after_an_exchange_step,
               "tape-y-dtype", scattered_and_gathered,
               backward_from_z_and_y_with_y_of_another_dtype, DIST_EMISMATCH,
               "the gradient given for 'y': piece 0 is float64")
/* The other trainer waits at the plan's first id, whose abort once went
 * out of the daemons' ring of 256 remembered exchanges, pushed by the
 * aborts of the LocalLayer backwards sent after it. */
TAPE_CASE(backward, a_null_output_of_a_plan_before_many_layer_steps, "tape-many-layers",
          scattered_with_layers_and_gathered, backward_from_z_late_with_a_null_output,
          null_output)
TAPE_CASE(backward, a_non_scalar_output_given_the_loss_1, "tape-r-one", resharded_r,
          backward_from_r_given_the_loss_1, "'r' is not a float scalar: give its gradient")
TAPE_CASE(backward, a_seed_value_without_data, "tape-loss-nodata", chain,
          backward_from_loss_given_a_value_without_data,
          "dist_backward: out_grads[0].values[0].data is NULL")

/* ---------------------------------------------------------------- undo */

static void *run_prelude(void *arg) {
  trainer *tr = arg;
  tr->rc = tr->prelude(tr);
  return NULL;
}

static void *run_call(void *arg) {
  trainer *tr = arg;
  tr->rc = tr->call(tr);
  snprintf(tr->msg, sizeof tr->msg, "%s", tr->rc ? dist_errmsg(tr->c) : "");
  return NULL;
}

/* Runs fn for both trainers, each in a thread, and waits for both. */
static void both(trainer *tr, void *(*fn)(void *)) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, fn, &tr[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

static int backward_from_y(trainer *tr) {
  dist_value v;
  dist_arg g = y_grad(tr, &v);
  const dist_tensor *outs[1] = {tr->y};
  return dist_tape_backward(tr->t, outs, &g, 1);
}

static int backward_from_loss(trainer *tr) {
  const dist_tensor *outs[1] = {tr->loss};
  return dist_tape_backward(tr->t, outs, NULL, 1);
}

/* Two SPMD trainers on a cluster of 2 whose rank 1 is behind a relay (c:
 * the relay's own client). */
typedef struct relayed_pair {
  trainer tr[2];
  reply_hold *relay;
  dist_client *c;
} relayed_pair;

/* p's trainers of a job each run prelude, then call, with rank 1's reply
 * to trainer 1's first call of it held past trainer 1's deadline: trainer
 * 1 fails, rank 1 having carried out that call and kept one name of
 * trainer 1's tape (asserted). */
static void trainer_1s_reply_lost(relayed_pair *p, prelude_fn prelude, call_fn call,
                                  const char *job) {
  trainer *tr = p->tr;
  reply_hold *relay = p->relay =
      reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &p->c);
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.prelude = prelude, .call = call, .rank = r,
                      .c = harness_spmd_client_of(reply_hold_cluster_file(relay), 2, r, job)};
    tr[r].c->timeout_ms = 30000;
  }
  both(tr, run_prelude);
  for (int r = 0; r < 2; r++) cr_assert_eq(tr[r].rc, 0, "trainer %d: %s", r, tr[r].msg);
  /* Only trainer 1's call whose reply is held has the short deadline: the
   * prelude's exchange waits for trainer 0's thread, which a loaded
   * machine can start late. */
  tr[1].c->timeout_ms = REPLY_HOLD_DEADLINE_MS;
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "tape", ""), 0, "rank 1 holds a gradient");
  reply_hold_calls(relay, 1, 2); /* trainer 1's first call: its reply is lost */
  both(tr, run_call);
  int held = reply_hold_calls_seen(relay);
  reply_hold_release(relay);
  cr_assert_geq(held, 1, "trainer 1 sent rank 1 no call");
  cr_assert_neq(tr[1].rc, 0, "trainer 1, its reply lost, succeeded");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "tape", ""), 1,
               "rank 1 did not keep what trainer 1's call stored");
}

static void relayed_pair_stop(relayed_pair *p) {
  for (int r = 0; r < 2; r++) trainer_free(&p->tr[r]);
  reply_hold_cluster_stop(&cluster, p->relay, p->c);
}

/* Frees trainer 1's tape while rank 1 cannot be reached (the relay
 * refusing its connections; rank 1 stays up with its store), so that its
 * delete there fails unanswered: rank 1 still holds that one name (what,
 * in messages). Then trainer 1's client's next undo point, rank 1 back,
 * must delete it. */
static void free_unreached_then_undo(relayed_pair *p, const char *what) {
  trainer *tr = p->tr;
  reply_hold_refuse(p->relay);
  dist_tape_free(tr[1].t);
  tr[1].t = NULL;
  reply_hold_release(p->relay);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "tape", ""), 1,
               "rank 1, not reached, lost %s at trainer 1's tape free", what);
  cr_assert_eq(dist_invocation_release(tr[1].c, NULL), 0, "%s", dist_errmsg(tr[1].c));
  cr_expect_eq(reply_hold_count_on(&cluster, 1, "tape", ""), 0,
               "rank 1 kept %s after trainer 1's next undo point", what);
}

/* Trainer 0's gradient of x, read from its daemon: all ones, x's shape (a
 * scatter only moves rows, and y's gradient is ones). */
static void expect_ones_as_x_grad(trainer *tr, const char *when) {
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[2] = {0};
  int rc = dist_tape_grad_local(tr->t, "x", -1, &data, &nbytes, shape);
  cr_expect_eq(rc, 0, "trainer %d %s: its gradient of x: %s", tr->rank, when,
               dist_errmsg(tr->c));
  cr_expect(rc == 0 && shape[0] == 5 && shape[1] == 2 && nbytes == sizeof ones[0] * 5 &&
                memcmp(data, ones, nbytes) == 0,
            "trainer %d %s: its gradient of x is not ones of 5x2 (%lldx%lld, %zu bytes)",
            tr->rank, when, (long long)shape[0], (long long)shape[1], nbytes);
  free(data);
}

/* Two SPMD trainers, y = scatter(x) on their tapes, rank 1 behind a relay;
 * the backward's exchange (a gather of y's gradient, kept by each daemon
 * under its trainer's tape name) goes through on both daemons, but rank 1's
 * reply to trainer 1 is lost: trainer 1 fails, its daemon keeping the
 * result, trainer 0 succeeds. The result's name is trainer 1's tape's
 * alone ("tape<token>.<serial>.g<k>"), on its own daemon, to which only
 * trainer 1 sends: it is noted on the tape's list, which trainer 1's free,
 * rank 1 not reached, hands to its client's list, whose next undo point
 * deletes it on rank 1, while trainer 0's tape keeps its gradient of x on
 * rank 0 with its values. Before (dist_later_of_made_up noting no name
 * for an SPMD trainer), rank 1 kept the result for good; with the note
 * and no hand-over, or the hand-over and no note, it kept it too. */
Test(undo, an_spmd_exchange_whose_reply_was_lost_is_deleted_at_the_next_undo_point,
     .timeout = 120) {
  relayed_pair p;
  trainer_1s_reply_lost(&p, scattered, backward_from_y, "undo-spmd-exchange");
  cr_assert_eq(p.tr[0].rc, 0, "trainer 0: %s", p.tr[0].msg);
  int on_rank_0 = reply_hold_count_on(&cluster, 0, "tape", "");
  cr_assert_geq(on_rank_0, 1, "rank 0 holds no gradient of trainer 0's tape");
  expect_ones_as_x_grad(&p.tr[0], "after its backward");
  free_unreached_then_undo(&p, "the result");
  cr_expect_eq(reply_hold_count_on(&cluster, 0, "tape", ""), on_rank_0,
               "trainer 1's undo changed what trainer 0's tape holds on rank 0");
  expect_ones_as_x_grad(&p.tr[0], "after trainer 1's undo point");
  relayed_pair_stop(&p);
}

/* The same for the gradient a LocalLayer backward on the tape stores (y's,
 * of loss = sum(y * y)), noted by dist_backward_undoing on the tape's
 * list: rank 1's reply to trainer 1's backward is lost, so trainer 1
 * fails and aborts the rest of its plan, trainer 0 failing at the
 * scatter's backward; trainer 1's free, rank 1 not reached, hands the
 * note to its client's list, whose next undo point deletes y's gradient
 * on rank 1. Before, the free dropped that note, and rank 1 kept it. */
Test(undo, an_spmd_layer_backward_whose_reply_was_lost_is_deleted_at_the_next_undo_point,
     .timeout = 120) {
  relayed_pair p;
  trainer_1s_reply_lost(&p, chain, backward_from_loss, "undo-spmd-layer");
  free_unreached_then_undo(&p, "y's gradient");
  relayed_pair_stop(&p);
}
