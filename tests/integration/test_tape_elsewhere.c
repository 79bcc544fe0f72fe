/* A tape's reshard onto ranks that leave a trainer out, with three SPMD
 * trainers (threads, each with its own client) on three daemons, every
 * trainer running every call: x Shard(0) on [0, 1] is resharded onto
 * [1, 2] (or [2, 1]), then a LocalLayer loss there, or a seed stored there
 * or given as values, and backward. Trainer 0 holds no piece after the
 * reshard, so its part of the steps on the new mesh (the layer's
 * backward, the seed's copy, a LocalLayer call) is a no-op taking their
 * ids; the reshard of the gradient back to [0, 1] brings it in again.
 * x's gradient is checked against the derivative computed here, and every
 * trainer's handle of it must describe the whole. A refusal of trainer
 * 0's must fail the others at once, though their first steps do not
 * involve its daemon, and leave every trainer's op ids in step. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "reply_hold.h"

TestSuite(tape_elsewhere, .fini = stop_cluster);

#define ROWS 4
#define COLS 2
#define NUMEL (ROWS * COLS)

typedef enum { FROM_LOSS, FROM_SEED, FROM_VALUES } seeding;

/* One trainer: what it was given, what it made, what it got. */
typedef struct trainer {
  dist_client *c;
  int rank, bad; /* bad: a NULL output to backward */
  seeding how;
  const int *target; /* the mesh x is resharded onto */
  int ntarget;
  dist_mesh *m01, *mt;
  dist_tape *t;
  dist_program *p;
  dist_tensor *x, *seed, *loss;
  int rc, reduced;
  double took;
  float grad[NUMEL], seed_after[NUMEL];
  size_t grad_bytes, seed_bytes;
  char grad_layout[128]; /* x's gradient handle: shape, placement, mesh */
  char msg[600];
} trainer;

/* x[i] = i + 1; the stored seed s[i] = 0.5 i - 3. */
static float x_at(int i) { return (float)(i + 1); }
static float seed_at(int i) { return 0.5f * (float)i - 3.0f; }

/* d/dx sum(x^3) */
static float cube_grad_at(int i) { return 3.0f * x_at(i) * x_at(i); }

static int fail(trainer *tr, const char *what, int rc) {
  if (rc) snprintf(tr->msg, sizeof tr->msg, "%s: %s", what, dist_errmsg(tr->c));
  return rc;
}

static int put_on(trainer *tr, const char *name, float (*value)(int), const dist_mesh *m,
                  dist_placement pl, dist_tensor **out) {
  float v[NUMEL];
  for (int i = 0; i < NUMEL; i++) v[i] = value(i);
  int64_t shape[2] = {ROWS, COLS};
  return fail(tr, name, dist_shard_tensor(tr->c, name, v, DIST_FLOAT32, 2, shape, m, &pl, out));
}

/* loss = sum(x * x * x) on the target mesh, Partial(sum), on the tape. */
static int cube_sum_on_target(trainer *tr) {
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  if (dist_program_new("cube_sum", &tr->p)) return fail(tr, "program", DIST_ENOMEM);
  int xv = dist_input_dtensor(tr->p, "x", DIST_FLOAT32);
  int cube = dist_op_mul(tr->p, dist_op_mul(tr->p, xv, xv), xv);
  dist_program_output(tr->p, dist_op_sum(tr->p, cube, NULL, 0, 0));
  dist_program_out_dist_attr(tr->p, tr->mt, &psum, NULL);
  int rc = fail(tr, "register", dist_program_register(tr->c, tr->p));
  dist_arg arg = {tr->x, NULL};
  if (rc == 0)
    rc = fail(tr, "call", dist_tape_local_layer_call(tr->t, tr->p, &arg, 1, NULL, &tr->loss));
  return rc;
}

/* x on [0, 1], resharded on the tape onto the target mesh (Shard(1)),
 * then the loss there or the seed stored there (Replicate). */
static int prelude(trainer *tr) {
  int shape[1] = {2}, ranks[2] = {0, 1}, tshape[1] = {tr->ntarget};
  dist_placement s0 = DIST_SHARD_DIM(0), s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  int rc = fail(tr, "mesh", dist_mesh_new(1, shape, ranks, NULL, &tr->m01));
  if (rc == 0) rc = fail(tr, "mesh", dist_mesh_new(1, tshape, tr->target, NULL, &tr->mt));
  if (rc == 0) rc = put_on(tr, "x", x_at, tr->m01, s0, &tr->x);
  if (rc == 0) rc = fail(tr, "tape", dist_tape_new(tr->c, &tr->t));
  if (rc == 0) rc = fail(tr, "reshard", dist_tape_reshard(tr->t, tr->x, tr->mt, &s1));
  if (rc) return rc;
  if (tr->how == FROM_LOSS) return cube_sum_on_target(tr);
  if (tr->how == FROM_VALUES) return 0;
  return put_on(tr, "seed", seed_at, tr->mt, rep, &tr->seed);
}

/* x's gradient after the reshard as values: this trainer's piece of
 * seed_at (Shard(1) on the target mesh, a column each); an outsider's
 * piece is empty, as Paddle's local tensor outside the mesh. */
static dist_value values_seed(trainer *tr, float *piece) {
  int k = -1;
  for (int j = 0; j < tr->ntarget; j++)
    if (tr->target[j] == tr->rank) k = j;
  if (k < 0) return (dist_value){NULL, DIST_FLOAT32, 2, {0, 0}};
  for (int i = 0; i < ROWS; i++) piece[i] = seed_at(i * COLS + k);
  return (dist_value){piece, DIST_FLOAT32, 2, {ROWS, 1}};
}

static int backward(trainer *tr) {
  const dist_tensor *out = tr->how == FROM_LOSS ? tr->loss : tr->x;
  const dist_tensor *outs[1] = {tr->bad ? NULL : out};
  float piece[ROWS];
  dist_value v = values_seed(tr, piece);
  dist_arg g = {tr->seed, NULL};
  if (tr->how == FROM_VALUES) g = (dist_arg){NULL, &v};
  return dist_tape_backward(tr->t, outs, tr->how == FROM_LOSS ? NULL : &g, 1);
}

/* "4x2 Shard(0) on [0, 1]": the whole a 2-d handle on a 1-d mesh describes. */
static void describe(const dist_tensor *t, char *buf, size_t len) {
  const int64_t *sh = dist_tensor_shape(t);
  const dist_placement *pl = dist_tensor_placements(t);
  const dist_mesh *m = dist_tensor_mesh(t);
  snprintf(buf, len, "%lldx%lld %s(%d) on [%d, %d]", (long long)sh[0], (long long)sh[1],
           pl[0].kind == DIST_SHARD ? "Shard" : "other", pl[0].dim, dist_mesh_rank_at(m, 0),
           dist_mesh_rank_at(m, 1));
}

/* Keeps what a read gave (at most NUMEL floats) and its size; a failed
 * read notes why. */
static void take_local(trainer *tr, const char *what, int rc, void *data, size_t nb,
                       float *into, size_t *got) {
  if (rc == 0 && nb <= NUMEL * sizeof(float)) memcpy(into, data, nb);
  *got = nb;
  free(data);
  if (rc && !tr->msg[0]) fail(tr, what, rc);
}

/* x's gradient piece, and the whole seed (every trainer calls
 * full_tensor: it takes an op id). */
static void read_results(trainer *tr) {
  void *data = NULL;
  size_t nb = 0;
  int rc = dist_tape_grad_local(tr->t, "x", -1, &data, &nb, NULL);
  take_local(tr, "x's gradient", rc, data, nb, tr->grad, &tr->grad_bytes);
  dist_tensor *h = NULL;
  if (dist_tape_grad(tr->t, "x", &h) == 0) describe(h, tr->grad_layout, sizeof tr->grad_layout);
  dist_tensor_free(h);
  if (tr->how != FROM_SEED) return;
  data = NULL, nb = 0;
  rc = dist_full_tensor(tr->c, tr->seed, &data, &nb);
  take_local(tr, "the seed", rc, data, nb, tr->seed_after, &tr->seed_bytes);
}

static void *run_trainer(void *arg) {
  trainer *tr = arg;
  if (prelude(tr)) return NULL;
  double t0 = harness_now_s();
  tr->rc = backward(tr);
  tr->took = harness_now_s() - t0;
  if (tr->rc) snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
  else read_results(tr);
  tr->reduced = harness_in_step(tr->c, tr->rank, 3);
  return NULL;
}

static void trainer_free(trainer *tr) {
  dist_tape_free(tr->t);
  dist_tensor_free(tr->x), dist_tensor_free(tr->seed), dist_tensor_free(tr->loss);
  dist_program_free(tr->p);
  dist_mesh_free(tr->m01), dist_mesh_free(tr->mt);
  dist_close(tr->c);
}

/* Frees the trainers; then no daemon holds a gradient of their tapes
 * (named "tape<token>..."), the failed backward's included. */
static void free_all(trainer *tr) {
  for (int r = 0; r < 3; r++) trainer_free(&tr[r]);
  for (int r = 0; r < 3; r++)
    cr_expect_eq(reply_hold_count_on(&cluster, r, "tape", ""), 0,
                 "rank %d's daemon holds a tape's gradient", r);
}

/* Three daemons, a trainer each running the case; trainer 0 gives a NULL
 * output when refusing. Deadlines: 10 s for trainers 1 and 2 (waiting it
 * out shows), 30 s for trainer 0, whose all-reduce waits for their call. */
static void run(trainer *tr, const char *job, seeding how, const int *target, int ntarget,
                int refusing) {
  harness_start(&cluster, 3, NULL);
  pthread_t th[3];
  for (int r = 0; r < 3; r++) {
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, job), .rank = r,
                      .bad = refusing && r == 0, .how = how, .target = target,
                      .ntarget = ntarget};
    tr[r].c->timeout_ms = r ? 10000 : 30000;
  }
  for (int r = 0; r < 3; r++) pthread_create(&th[r], NULL, run_trainer, &tr[r]);
  for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
}

/* Every trainer's handle of x's gradient describes the whole, 4x2
 * Shard(0) on [0, 1]; trainers 0 and 1 hold its rows, trainer 2 none;
 * want(i) at flat index i. */
static void expect_gradient(trainer *tr, float (*want)(int)) {
  for (int r = 0; r < 3; r++) {

    cr_expect_eq(tr[r].rc, 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_eq(tr[r].msg[0], 0, "rank %d: %s", r, tr[r].msg);
    cr_expect_str_eq(tr[r].grad_layout, "4x2 Shard(0) on [0, 1]", "rank %d: x's gradient is %s", r,
                     tr[r].grad_layout);
    size_t want_bytes = r < 2 ? NUMEL / 2 * sizeof(float) : 0;
    cr_expect_eq(tr[r].grad_bytes, want_bytes, "rank %d: a gradient piece of %zu bytes", r,
                 tr[r].grad_bytes);
    for (int i = 0; r < 2 && tr[r].grad_bytes == want_bytes && i < NUMEL / 2; i++) {
      int at = r * NUMEL / 2 + i;
      cr_expect_eq(tr[r].grad[i], want(at), "rank %d: grad x[%d] = %g, want %g", r, at,
                   tr[r].grad[i], want(at));
    }
    cr_expect(tr[r].reduced, "rank %d: the all-reduce after the backward failed", r);
  }
}

static const int one_two[2] = {1, 2}, two_one[2] = {2, 1}, one_zero[2] = {1, 0};

/* A backward seeded as how onto target (2 ranks) that gives x's gradient
 * want. */
static void gradient_case(const char *job, seeding how, const int *target,
                          float (*want)(int)) {
  trainer tr[3];
  run(tr, job, how, target, 2, 0);
  expect_gradient(tr, want);
  free_all(tr);
  stop_cluster();
}

/* Trainer 0's steps on [1, 2]: the layer's backward, x's gradient filed. */
Test(tape_elsewhere, a_loss_on_ranks_without_trainer_0, .timeout = 120) {
  gradient_case("tape-elsewhere-loss", FROM_LOSS, one_two, cube_grad_at);
}

/* The seed's copy is a LocalLayer call on the target mesh, without trainer
 * 0; then the reshard back to [0, 1]. The seed keeps its values. */
static void seed_elsewhere(const char *job, const int *target, int ntarget) {
  trainer tr[3];
  run(tr, job, FROM_SEED, target, ntarget, 0);
  expect_gradient(tr, seed_at);
  for (int r = 0; r < 3; r++) {
    int member = 0; /* outside the seed's mesh, full_tensor gives 0 bytes */
    for (int k = 0; k < ntarget; k++) member |= target[k] == r;
    cr_expect_eq(tr[r].seed_bytes, member ? NUMEL * sizeof(float) : 0,
                 "rank %d: the whole seed has %zu bytes", r, tr[r].seed_bytes);
    for (int i = 0; member && tr[r].seed_bytes == NUMEL * sizeof(float) && i < NUMEL; i++)
      cr_expect_eq(tr[r].seed_after[i], seed_at(i), "rank %d: seed[%d] = %g", r, i,
                   tr[r].seed_after[i]);
  }
  free_all(tr);
  stop_cluster();
}

Test(tape_elsewhere, a_seed_on_ranks_without_trainer_0, .timeout = 120) {
  seed_elsewhere("tape-elsewhere-seed", one_two, 2);
}

/* The same with the new mesh's ranks in the other order. */
Test(tape_elsewhere, a_seed_on_ranks_2_and_1_without_trainer_0, .timeout = 120) {
  seed_elsewhere("tape-elsewhere-seed-21", two_one, 2);
}

/* Trainer 0 refuses (a NULL output): trainers 1 and 2 fail by its abort
 * naming why, though their first step (the layer's backward, the seed's
 * copy) runs on daemons 1 and 2 only; then all three all-reduce. Without
 * the abort they fail when their daemons' wait for daemon 0 passes the
 * harness's 5 s peer timeout, with another message: the message tells
 * the two apart, and the time (which a loaded machine stretches: trainer
 * 0 may start its backward late) is only bounded by the 10 s deadline. */
static void refused_elsewhere(const char *job, seeding how) {
  static const char why[] = "dist_tape_backward: outputs[0] is NULL";
  trainer tr[3];
  run(tr, job, how, one_two, 2, 1);
  cr_expect_eq(tr[0].rc, DIST_EINVAL, "trainer 0: %d %s", tr[0].rc, tr[0].msg);
  cr_expect(strstr(tr[0].msg, why), "trainer 0: %s", tr[0].msg);
  for (int r = 1; r < 3; r++) {
    cr_log_info("trainer %d after %.2f s: %s", r, tr[r].took, tr[r].msg);
    cr_expect_neq(tr[r].rc, 0, "trainer %d succeeded", r);
    cr_expect_lt(tr[r].took, 9.0, "trainer %d waited %.1f s: %s", r, tr[r].took, tr[r].msg);
    cr_expect(strstr(tr[r].msg, "rank 0 aborted op") && strstr(tr[r].msg, why),
              "trainer %d: %s (want rank 0's abort, '%s')", r, tr[r].msg, why);
  }
  for (int r = 0; r < 3; r++)
    cr_expect(tr[r].reduced, "trainer %d: the all-reduce after the refused backward failed", r);
  free_all(tr);
  stop_cluster();
}

Test(tape_elsewhere, a_refusal_before_a_layer_step_without_trainer_0, .timeout = 120) {
  refused_elsewhere("tape-elsewhere-refused-loss", FROM_LOSS);
}

Test(tape_elsewhere, a_refusal_before_a_seed_copy_without_trainer_0, .timeout = 120) {
  refused_elsewhere("tape-elsewhere-refused-seed", FROM_SEED);
}

/* The seed stored from values on [1, 2]: trainer 0's empty piece tells no
 * shape, yet its handles describe the whole (before, its gradient of x,
 * whose rows it holds, said 0x0; the reshard back onto [0, 1] now takes
 * the daemons' shape too, dist_reshard). */
Test(tape_elsewhere, a_seed_given_as_values_without_trainer_0s_piece, .timeout = 120) {
  gradient_case("tape-elsewhere-values", FROM_VALUES, one_two, seed_at);
}

/* The seed stored from values on [1, 0]: trainer 2 is outside both meshes,
 * so no reshard tells it the whole; its handle of x's gradient must still
 * say 4x2 (the seed takes the output's shape, store_seed: before, 0x0). */
Test(tape_elsewhere, a_seed_given_as_values_by_a_trainer_outside_both_meshes, .timeout = 120) {
  gradient_case("tape-elsewhere-values-out", FROM_VALUES, one_zero, seed_at);
}
