/* A LocalLayer call stores its outputs on every daemon it ran on or on
 * none (the daemons vote, program.proto): a name taken on one daemon, one
 * daemon over its memory limit, one daemon that lost the program. Each test
 * fails against a daemon that stored its outputs alone. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "program.pb-c.h" /* raw Invoke requests */
#include "reply_hold.h"

TestSuite(local_layer_store, .fini = stop_cluster, .timeout = 120);

static const double x0[4] = {1.5, -2, 0.25, 8};

/* Calls p on "x" (nargs arguments: "x" twice for 2) with outputs named
 * `out` (NULL: the default name). */
static int call_n(dist_client *c, dist_program *p, const char *out, int replace, int nargs) {
  dist_tensor *x = NULL, *y = NULL;
  int rc = dist_tensor_open(c, "x", &x);
  dist_arg args[2] = {{x, NULL}, {x, NULL}};
  const char *names[1] = {out};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = out ? names : NULL;
  o.replace = replace;
  o.no_grad = 1;
  dist_invocation *inv = NULL;
  if (rc == 0) rc = dist_local_layer_call(c, p, args, nargs, &o, &inv, &y);
  dist_invocation_free(inv);
  dist_tensor_free(y);
  dist_tensor_free(x);
  return rc;
}

static int call(dist_client *c, dist_program *p, const char *out, int replace) {
  return call_n(c, p, out, replace, 1);
}

/* Daemon r's own view of name: 0 with its mesh's size and its piece there
 * (read through the cluster's client c; Replicate, so the whole value:
 * float64, n of them, want) checked, or the error code opening it. */
static int held_on(dist_client *c, int r, const char *name, int mesh_size,
                   const double *want, int n) {
  dist_tensor *t = NULL;
  int rc = harness_open_on(&cluster, r, name, &t);
  if (rc == 0) {
    cr_assert_eq(dist_mesh_size(dist_tensor_mesh(t)), mesh_size, "rank %d: '%s'", r, name);
    void *data = NULL;
    size_t nbytes = 0;
    int64_t shape[DIST_MAX_DIMS];
    cr_assert_eq(dist_dtensor_to_local(c, t, r, &data, &nbytes, shape), 0, "%s",
                 dist_errmsg(c));
    cr_assert_eq(nbytes, sizeof *want * (size_t)n, "rank %d: '%s'", r, name);
    cr_assert_eq(memcmp(data, want, nbytes), 0, "rank %d: '%s' changed", r, name);
    free(data);
  }
  dist_tensor_free(t);
  return rc;
}

/* Every piece of name at one version, above `than`. */
static void expect_one_version(dist_client *c, const char *name, uint64_t than) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, name, &t), 0, "%s", dist_errmsg(c));
  dist_tensor_piece *pieces = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_pieces(c, t, &pieces, &n), 0, "%s", dist_errmsg(c));
  for (int i = 0; i < n; i++)
    cr_assert(pieces[i].version == pieces[0].version && pieces[i].version > than,
              "'%s': rank %d at version %llu, rank %d at %llu", name, pieces[i].rank,
              (unsigned long long)pieces[i].version, pieces[0].rank,
              (unsigned long long)pieces[0].version);
  free(pieces);
  dist_tensor_free(t);
}

typedef struct trainer {
  dist_client *c;
  int replace;
  const char *out; /* the output's name; NULL: "taken" */
  int sharded;     /* the doubler's output Shard(0) */
  int nargs;       /* arguments given to the call; 0: 1 */
  int rc;
  char msg[512];
  double took; /* seconds the call took */
} trainer;

static void *spmd_call(void *arg) {
  trainer *tr = arg;
  dist_program *p = harness_doubler(tr->sharded);
  tr->rc = dist_program_register(tr->c, p);
  double t0 = harness_now_s();
  if (tr->rc == 0)
    tr->rc = call_n(tr->c, p, tr->out ? tr->out : "taken", tr->replace,
                    tr->nargs ? tr->nargs : 1);
  tr->took = harness_now_s() - t0;
  snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
  dist_program_free(p);
  return NULL;
}

static void run_trainers(trainer *tr, int replace) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    tr[r].replace = replace;
    pthread_create(&th[r], NULL, spmd_call, &tr[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* SPMD: each trainer hears only from its own daemon, so rank 0's trainer
 * went on with an output that rank 1 never stored. */
Test(local_layer_store, an_output_name_taken_on_one_daemon_is_stored_by_none) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4, n3 = 3;
  static const double taken[3] = {7, 7, 7}, twice[4] = {3, -4, 0.5, 16};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  dist_tensor_free(harness_put(c, "taken", DIST_FLOAT64, taken, 1, &n3, "[1]",
                               "Replicate()"));
  trainer tr[2] = {{.c = harness_spmd_client(&cluster, 0, "store-job")},
                   {.c = harness_spmd_client(&cluster, 1, "store-job")}};
  run_trainers(tr, 0);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(tr[r].rc, DIST_EEXIST, "trainer %d: %s", r, tr[r].msg);
    cr_assert(strstr(tr[r].msg, "'taken' already exists"), "trainer %d: %s", r, tr[r].msg);
  }
  cr_assert(strstr(tr[0].msg, "rank 1 refused this invocation"), "%s", tr[0].msg);
  cr_assert_eq(held_on(c, 0, "taken", 0, NULL, 0), DIST_ENOTFOUND, "rank 0 stored the output");
  cr_assert_eq(held_on(c, 1, "taken", 1, taken, 3), 0, "rank 1 lost its own 'taken'");
  /* Replacing it, both store it, at one version past rank 1's. */
  run_trainers(tr, 1);
  for (int r = 0; r < 2; r++) cr_assert_eq(tr[r].rc, 0, "trainer %d: %s", r, tr[r].msg);
  cr_assert_eq(held_on(c, 0, "taken", 2, twice, 4), 0);
  cr_assert_eq(held_on(c, 1, "taken", 2, twice, 4), 0);
  expect_one_version(c, "taken", 1);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
  dist_close(c);
}

/* Two daemons holding "x", and two SPMD trainers of job: trainer 0 names
 * what it stores "__metadata__", which libdist refuses, trainer 1 `name`
 * (with a deadline of 10 s). Returns a single client of both daemons. */
static dist_client *start_refusing_pair(trainer *tr, const char *job, const char *name) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  for (int r = 0; r < 2; r++)
    tr[r] = (trainer){.c = harness_spmd_client(&cluster, r, job),
                      .out = r ? name : "__metadata__"};
  tr[1].c->timeout_ms = 10000;
  return c;
}

/* Trainer 0's libdist refuses its output name. Before, trainer 1's
 * daemon waited for rank 0's part until the deadline (5 s of silence):
 * its verdict, or first (sharded) the output's shape, under the output's
 * own op id. */
Test(local_layer_store, a_call_one_spmd_trainer_refuses_fails_the_other_at_once) {
  trainer tr[2];
  dist_client *c = start_refusing_pair(tr, "refuse-job", "y");
  for (int sharded = 0; sharded < 2; sharded++) {
    tr[0].sharded = tr[1].sharded = sharded;
    run_trainers(tr, 0);
    cr_expect_eq(tr[0].rc, DIST_EINVAL, "trainer 0: %s", tr[0].msg);
    cr_expect_lt(tr[1].took, 3.0, "sharded %d: trainer 1 waited %.1f s: %s", sharded,
                 tr[1].took, tr[1].msg);
    cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, "is reserved"),
              "sharded %d: trainer 1: %s", sharded, tr[1].msg);
    for (int r = 0; r < 2; r++)
      cr_expect_eq(held_on(c, r, "y", 0, NULL, 0), DIST_ENOTFOUND, "rank %d stored 'y'", r);
  }
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
  dist_close(c);
}

/* An output may replace a tensor only within its own mesh: y on [0,1,2]
 * replaced by an output on [0,1] left rank 2's piece of the old y, a
 * second layout of the name. Now every daemon refuses, naming rank 2, and y
 * stays whole; onto a mesh that covers it, the replacement goes through.
 * A name held only outside the output's mesh is refused too. */
Test(local_layer_store, an_output_replacing_a_tensor_beyond_its_mesh_is_refused) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  int64_t n4 = 4;
  static const double y0[4] = {-1, -2, -3, -4}, twice[4] = {3, -4, 0.5, 16};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  dist_tensor_free(harness_put(c, "y", DIST_FLOAT64, y0, 1, &n4, "[0,1,2]", "Replicate()"));
  dist_program *p = harness_doubler(0);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  int rc = call(c, p, "y", 1);
  cr_assert_eq(rc, DIST_EEXIST, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "without rank 2, whose piece would stay"), "%s",
            dist_errmsg(c));
  for (int r = 0; r < 3; r++)
    cr_assert_eq(held_on(c, r, "y", 3, y0, 4), 0, "rank %d: 'y' changed", r);
  expect_one_version(c, "y", 0);
  cr_assert_eq(dist_tensor_delete(c, "y"), 0, "%s", dist_errmsg(c));
  dist_tensor_free(harness_put(c, "y", DIST_FLOAT64, y0, 1, &n4, "[1]", "Replicate()"));
  cr_assert_eq(call(c, p, "y", 1), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) cr_assert_eq(held_on(c, r, "y", 2, twice, 4), 0);
  cr_assert_eq(held_on(c, 2, "y", 0, NULL, 0), DIST_ENOTFOUND);
  expect_one_version(c, "y", 1);
  /* A name held only outside the output's mesh: no daemon of the call
   * holds it, and before, the output went through, one name then meaning
   * two tensors. */
  dist_tensor_free(harness_put(c, "z", DIST_FLOAT64, y0, 1, &n4, "[2]", "Replicate()"));
  rc = call(c, p, "z", 1);
  cr_assert_eq(rc, DIST_EEXIST, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "'z' already exists on rank 2 (mesh [2])"), "%s",
            dist_errmsg(c));
  for (int r = 0; r < 2; r++)
    cr_assert_eq(held_on(c, r, "z", 0, NULL, 0), DIST_ENOTFOUND, "rank %d stored 'z'", r);
  cr_assert_eq(held_on(c, 2, "z", 1, y0, 4), 0, "rank 2's 'z' changed");
  dist_program_free(p);
  dist_close(c);
}

/* Single client: libdist undid the call on the daemons that had stored,
 * deleting what the output replaced there, so "y" was gone from rank 0
 * and kept on rank 1. */
Test(local_layer_store, an_output_one_daemon_cannot_afford_keeps_the_old_value_everywhere) {
  const char *args[] = {"--memory-limit=400", NULL};
  dist_client *c = harness_start_with_client(&cluster, 2, args);
  int64_t n4 = 4, n40 = 40;
  static const double y0[4] = {-1, -2, -3, -4};
  double fill[40] = {0};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  dist_tensor_free(harness_put(c, "y", DIST_FLOAT64, y0, 1, &n4, "[0,1]", "Replicate()"));
  /* Rank 1 holds 32 + 32 + 320 of its 400 bytes: the new y (32 more
   * while the old one is held) does not fit there, and does on rank 0. */
  dist_tensor_free(harness_put(c, "fill", DIST_FLOAT64, fill, 1, &n40, "[1]", "Replicate()"));
  dist_program *p = harness_doubler(0);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  int rc = call(c, p, "y", 1);
  cr_assert_eq(rc, DIST_ENOMEM, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "rank 1"), "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++)
    cr_assert_eq(held_on(c, r, "y", 2, y0, 4), 0, "rank %d lost 'y'", r);
  expect_one_version(c, "y", 0);
  /* With room on rank 1, the same call replaces y on both. */
  static const double twice[4] = {3, -4, 0.5, 16};
  cr_assert_eq(dist_tensor_delete(c, "fill"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(call(c, p, "y", 1), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++) cr_assert_eq(held_on(c, r, "y", 2, twice, 4), 0);
  expect_one_version(c, "y", 1);
  dist_program_free(p);
  dist_close(c);
}

/* Two daemons holding "x", and the sharded doubler registered on both
 * (*p) through the single client returned. */
static dist_client *start_with_sharded_doubler(dist_program **p) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  *p = harness_doubler(1);
  cr_assert_eq(dist_program_register(c, *p), 0, "%s", dist_errmsg(c));
  return c;
}

/* A daemon restarted since the program was registered does not know it.
 * With a sharded output, rank 0 used to wait for rank 1's local shape
 * until the client's deadline (30 s); now rank 1 ends that exchange and
 * votes no, and rank 0 fails at once, naming why. */
Test(local_layer_store, a_daemon_that_lost_the_program_fails_the_others_at_once) {
  dist_program *p = NULL;
  dist_client *c = start_with_sharded_doubler(&p);
  int64_t n4 = 4;
  cr_assert_eq(call(c, p, "y", 0), 0, "%s", dist_errmsg(c));
  harness_kill(&cluster, 1, SIGKILL);
  harness_start_rank(&cluster, 1, NULL);
  harness_assert_all_connected(&cluster, "after rank 1 restarted");
  /* The restarted daemon lost x too: put it back, as a whole. */
  dist_tensor_delete(c, "x"); /* rank 1 answers "not found" */
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  double t0 = harness_now_s();
  int rc = call(c, p, "z", 0);
  double took = harness_now_s() - t0;
  cr_assert_eq(rc, DIST_ENOTFOUND, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "unknown program handle"), "%s", dist_errmsg(c));
  cr_assert_lt(took, 3.0, "the call took %.1f s", took);
  cr_assert_eq(held_on(c, 0, "z", 0, NULL, 0), DIST_ENOTFOUND, "rank 0 stored 'z'");
  dist_program_free(p);
  dist_close(c);
}

/* Backward stores the input gradients the same way: a gradient name taken
 * on rank 1 only is stored by neither daemon (rank 0 used to keep its
 * piece), and with replace by both, at one version. */
Test(local_layer_store, a_gradient_name_taken_on_one_daemon_is_stored_by_none) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4, n3 = 3;
  static const double taken[3] = {7, 7, 7}, twos[4] = {2, 2, 2, 2};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  dist_tensor_free(harness_put(c, "gx", DIST_FLOAT64, taken, 1, &n3, "[1]", "Replicate()"));
  dist_program *p = harness_doubler(0);
  cr_assert_eq(dist_program_register(c, p), 0, "%s", dist_errmsg(c));
  const char *names[1] = {"gx"};
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.grad_names = names;
  for (int replace = 0; replace < 2; replace++) {
    dist_tensor *x = NULL, *y = NULL, *g = NULL;
    cr_assert_eq(dist_tensor_open(c, "x", &x), 0, "%s", dist_errmsg(c));
    dist_arg args[1] = {{x, NULL}};
    dist_invocation *inv = NULL;
    cr_assert_eq(dist_local_layer_call(c, p, args, 1, NULL, &inv, &y), 0, "%s",
                 dist_errmsg(c));
    /* d(sum of y = x + x)/dx = 2, given y's gradient of ones. */
    static const double ones[4] = {1, 1, 1, 1};
    dist_value v[2] = {{ones, DIST_FLOAT64, 1, {4}}, {ones, DIST_FLOAT64, 1, {4}}};
    dist_arg og[1] = {{NULL, v}};
    bo.replace = replace;
    int rc = dist_backward(c, inv, og, &bo, &g);
    if (!replace) {
      cr_assert_eq(rc, DIST_EEXIST, "%s: %s", dist_err_name(rc), dist_errmsg(c));
      cr_assert(strstr(dist_errmsg(c), "'gx' already exists"), "%s", dist_errmsg(c));
      cr_assert_eq(held_on(c, 0, "gx", 0, NULL, 0), DIST_ENOTFOUND, "rank 0 stored 'gx'");
      cr_assert_eq(held_on(c, 1, "gx", 1, taken, 3), 0, "rank 1 lost its own 'gx'");
    } else {
      cr_assert_eq(rc, 0, "%s", dist_errmsg(c));
      for (int r = 0; r < 2; r++) cr_assert_eq(held_on(c, r, "gx", 2, twos, 4), 0);
      expect_one_version(c, "gx", 1);
    }
    dist_tensor_free(g);
    dist_invocation_free(inv);
    dist_tensor_free(y);
    dist_tensor_free(x);
  }
  dist_program_free(p);
  dist_close(c);
}

/* A put of name onto [0] is refused: rank 0 holds it for a LocalLayer
 * call or backward waiting for rank 1's verdict. */
static void expect_put_refused_while_held(dist_client *c, const char *name) {
  static const double seven[1] = {7};
  int64_t n1 = 1;
  dist_tensor *t = NULL;
  int rc = harness_try_put(c, name, DIST_FLOAT64, seven, 1, &n1, "[0]", "Replicate()", &t);
  cr_assert_eq(rc, DIST_EUNAVAIL, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  char want[128];
  snprintf(want, sizeof want, "'%s' is being stored by a LocalLayer call on rank 0", name);
  cr_assert(strstr(dist_errmsg(c), want), "%s", dist_errmsg(c));
  /* The daemon answered: its refusal is no unreachable daemon. */
  cr_assert(!strstr(dist_errmsg(c), "cannot reach"), "%s", dist_errmsg(c));
}

/* A put of an output's name that reaches a daemon while the call waits for
 * the others' verdicts is refused there: the call holds its output names.
 * Before, the put went through between the call's checks and its store,
 * and the call then replaced it. */
Test(local_layer_store, a_put_of_an_output_name_while_the_call_votes_is_refused) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4;
  static const double twice[4] = {3, -4, 0.5, 16};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  trainer tr[2] = {{.c = harness_spmd_client(&cluster, 0, "hold-job")},
                   {.c = harness_spmd_client(&cluster, 1, "hold-job")}};
  pthread_t first;
  cr_assert_eq(pthread_create(&first, NULL, spmd_call, &tr[0]), 0);
  /* Trainer 0's call runs on rank 0 and waits there for rank 1's verdict
   * (bounded: a fixed 500 ms was a race on a loaded host). */
  cr_assert(harness_wait_running(c, 0, "vote", 0, 10000), "rank 0 never voted");
  expect_put_refused_while_held(c, "taken");
  spmd_call(&tr[1]);
  pthread_join(first, NULL);
  for (int r = 0; r < 2; r++) cr_assert_eq(tr[r].rc, 0, "trainer %d: %s", r, tr[r].msg);
  for (int r = 0; r < 2; r++) cr_assert_eq(held_on(c, r, "taken", 2, twice, 4), 0);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
  dist_close(c);
}

/* The calls of method ("TensorShow") daemon r served, whatever it
 * answered. */
static double served_on(int r, const char *method) {
  char *m = harness_metrics(&cluster, r);
  double n = harness_rpc_count(m, method, NULL);
  free(m);
  return n;
}

/* Waits, bounded by timeout_ms, until daemon r served at least count
 * calls of method; 1 if it did. */
static int wait_served(int r, const char *method, double count, int timeout_ms) {
  for (double until = harness_now_s() + timeout_ms / 1e3; harness_now_s() < until;
       harness_sleep_ms(20))
    if (served_on(r, method) >= count) return 1;
  return 0;
}

/* One trainer's call of a doubler on x, both made before, its output
 * named tr.out (NULL: "taken"), or by libdist when names_made_up (its
 * name then in out_name on success), no_grad unless kept for backward. */
typedef struct registered {
  trainer tr;
  dist_program *p;
  dist_tensor *x;
  int kept_for_backward;
  int names_made_up;
  char out_name[256];
} registered;

static void *call_registered(void *arg) {
  registered *g = arg;
  dist_arg args[1] = {{g->x, NULL}};
  const char *names[1] = {g->tr.out ? g->tr.out : "taken"};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = g->names_made_up ? NULL : names;
  o.no_grad = !g->kept_for_backward;
  dist_invocation *inv = NULL;
  dist_tensor *y = NULL;
  g->tr.rc = dist_local_layer_call(g->tr.c, g->p, args, 1, &o, &inv, &y);
  if (g->tr.rc == 0) snprintf(g->out_name, sizeof g->out_name, "%s", dist_tensor_name(y));
  snprintf(g->tr.msg, sizeof g->tr.msg, "%s", dist_errmsg(g->tr.c));
  dist_invocation_free(inv);
  dist_tensor_free(y);
  return NULL;
}

/* A put of an output's name onto a mesh disjoint from the call's, landing
 * after the call checked the name and before it stored: the put then sees
 * no output, so the call, asking again once stored, sees the put and
 * undoes itself. Before, both went through and the name meant two
 * tensors. Rank 1's daemon is stopped meanwhile, so that both trainers'
 * calls wait after their checks. */
Test(local_layer_store, a_put_onto_another_mesh_racing_the_call_leaves_one_tensor) {
  dist_client *c = harness_start_with_client(&cluster, 3, NULL);
  int64_t n4 = 4;
  static const double y0[4] = {-1, -2, -3, -4};
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  registered g[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    g[r] = (registered){.tr.c = harness_spmd_client(&cluster, r, "race-job"),
                        .p = harness_doubler(0)};
    cr_assert_eq(dist_program_register(g[r].tr.c, g[r].p), 0, "%s", dist_errmsg(g[r].tr.c));
    cr_assert_eq(dist_tensor_open(g[r].tr.c, "x", &g[r].x), 0, "%s", dist_errmsg(g[r].tr.c));
  }
  cr_assert(harness_freeze(&cluster, 1, 5000), "rank 1 did not stop");
  /* Each trainer's check asks rank 2, the one daemon outside [0,1], with
   * a TensorShow; the counter moves once rank 2 has its answer. */
  double checked = served_on(2, "TensorShow") + 2;
  for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, call_registered, &g[r]), 0);
  /* Trainer 0 is past its check once rank 0 votes; trainer 1 once rank 2
   * answered both (bounded: a fixed 200 ms was a race on a loaded host,
   * where trainer 1's check could see the put and refuse before its call,
   * leaving the race untried). Both then wait on stopped rank 1. */
  cr_assert(harness_wait_running(c, 0, "vote", 0, 10000), "rank 0 never voted");
  cr_assert(wait_served(2, "TensorShow", checked, 10000),
            "rank 2 did not answer both trainers' checks");
  cr_assert_eq(served_on(2, "TensorShow"), checked, "rank 2 was asked more than the checks");
  /* The put's own check cannot reach rank 1 within its 1.5 s, and counts
   * only rank 0, which holds nothing yet. */
  dist_opts quick = DIST_OPTS_INIT;
  quick.timeout_ms = 1500;
  dist_client *putter = NULL;
  cr_assert_eq(dist_connect_cluster(cluster.cluster_file, &quick, &putter), 0);
  dist_tensor_free(harness_put(putter, "taken", DIST_FLOAT64, y0, 1, &n4, "[2]",
                               "Replicate()"));
  cr_assert_eq(kill(cluster.pids[1], SIGCONT), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(g[r].tr.rc, DIST_EEXIST, "trainer %d: %s", r, g[r].tr.msg);
    cr_assert(strstr(g[r].tr.msg, "'taken' already exists on rank 2 (mesh [2])"), "%s",
              g[r].tr.msg);
    cr_assert_eq(held_on(c, r, "taken", 0, NULL, 0), DIST_ENOTFOUND, "rank %d kept it", r);
  }
  cr_assert_eq(held_on(c, 2, "taken", 1, y0, 4), 0, "rank 2's 'taken' changed");
  for (int r = 0; r < 2; r++) {
    dist_tensor_free(g[r].x);
    dist_program_free(g[r].p);
    dist_close(g[r].tr.c);
  }
  dist_close(putter);
  dist_close(c);
}

/* loss = sum(x * x), Partial(sum) on [0,1]. */
static dist_program *square_sum(void) {
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("square_sum", &p), 0);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT64);
  dist_program_output(p, dist_op_sum(p, dist_op_mul(p, x, x), NULL, 0, 0));
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m), 0);
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  cr_assert_eq(dist_program_out_dist_attr(p, m, &psum, NULL), 0);
  dist_mesh_free(m);
  return p;
}

/* One SPMD trainer: square_sum on "x", then its backward storing "gx"
 * (tr->out when set), timed. */
static void *spmd_backward(void *arg) {
  trainer *tr = arg;
  dist_program *p = square_sum();
  dist_tensor *x = NULL, *loss = NULL, *gx = NULL;
  dist_invocation *inv = NULL;
  tr->rc = dist_program_register(tr->c, p);
  if (tr->rc == 0) tr->rc = dist_tensor_open(tr->c, "x", &x);
  dist_arg args[1] = {{x, NULL}};
  if (tr->rc == 0) tr->rc = dist_local_layer_call(tr->c, p, args, 1, NULL, &inv, &loss);
  const char *names[1] = {tr->out ? tr->out : "gx"};
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.grad_names = names;
  double t0 = harness_now_s();
  if (tr->rc == 0) tr->rc = dist_backward(tr->c, inv, NULL, &bo, &gx);
  tr->took = harness_now_s() - t0;
  snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
  dist_tensor_free(gx), dist_tensor_free(loss), dist_tensor_free(x);
  dist_invocation_free(inv);
  dist_program_free(p);
  return NULL;
}

/* Trainer 0 gives the doubler two arguments, which libdist refuses
 * before it took the call's op ids: trainer 1 waited for it until the
 * deadline, and every later call of the two trainers ran under different
 * op ids. */
Test(local_layer_store, a_call_with_too_many_arguments_keeps_the_trainers_in_step) {
  trainer tr[2];
  dist_client *c = start_refusing_pair(tr, "nargs-job", "y");
  tr[0] = (trainer){.c = tr[0].c, .out = "y", .nargs = 2};
  run_trainers(tr, 0);
  cr_expect(tr[0].rc == DIST_EINVAL && strstr(tr[0].msg, "takes 1 inputs, 2 arguments"),
            "trainer 0: %s", tr[0].msg);
  cr_expect_lt(tr[1].took, 3.0, "trainer 1 waited %.1f s: %s", tr[1].took, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, "2 arguments"),
            "trainer 1: %s", tr[1].msg);
  tr[0].nargs = 0;
  run_trainers(tr, 0);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "the next call: trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  dist_close(c);
}

/* Trainer 0's libdist refuses its gradient's name. Before, trainer 1's
 * daemon waited for rank 0's verdict until the deadline (5 s of silence). */
Test(local_layer_store, a_backward_one_spmd_trainer_refuses_fails_the_other_at_once) {
  trainer tr[2];
  dist_client *c = start_refusing_pair(tr, "grad-refuse", "g");
  pthread_t th[2];
  for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, spmd_backward, &tr[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  cr_expect_eq(tr[0].rc, DIST_EINVAL, "trainer 0: %s", tr[0].msg);
  cr_expect_lt(tr[1].took, 3.0, "trainer 1 waited %.1f s: %s", tr[1].took, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, "is reserved"),
            "trainer 1: %s", tr[1].msg);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(held_on(c, r, "g", 0, NULL, 0), DIST_ENOTFOUND, "rank %d stored 'g'", r);
    dist_close(tr[r].c);
  }
  dist_close(c);
}

/* The same for a backward's stored gradients: a put of "gx" while the
 * backward votes is refused. */
Test(local_layer_store, a_put_of_a_gradient_name_while_the_backward_votes_is_refused) {
  dist_client *c = harness_start_with_client(&cluster, 2, NULL);
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  trainer tr[2] = {{.c = harness_spmd_client(&cluster, 0, "grad-hold-job")},
                   {.c = harness_spmd_client(&cluster, 1, "grad-hold-job")}};
  pthread_t first;
  cr_assert_eq(pthread_create(&first, NULL, spmd_backward, &tr[0]), 0);
  /* Trainer 0's call votes with rank 1 first: rank 1's call goes in a
   * thread too, and trainer 1 stops before its backward. */
  harness_sleep_ms(300);
  dist_program *p = square_sum();
  dist_tensor *x = NULL, *loss = NULL;
  dist_invocation *inv = NULL;
  cr_assert_eq(dist_program_register(tr[1].c, p), 0, "%s", dist_errmsg(tr[1].c));
  cr_assert_eq(dist_tensor_open(tr[1].c, "x", &x), 0, "%s", dist_errmsg(tr[1].c));
  dist_arg args[1] = {{x, NULL}};
  cr_assert_eq(dist_local_layer_call(tr[1].c, p, args, 1, NULL, &inv, &loss), 0, "%s",
               dist_errmsg(tr[1].c));
  /* Trainer 0's backward now waits on rank 0 for rank 1's verdict: a vote
   * other than the call's, which rank 0 may still be finishing (bounded:
   * a fixed 500 ms was a race on a loaded host). */
  uint64_t call_vote = harness_last_finished(c, 1, "vote");
  cr_assert(harness_wait_running(c, 0, "vote", call_vote, 10000),
            "rank 0 never voted on the backward");
  expect_put_refused_while_held(c, "gx");
  const char *names[1] = {"gx"};
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.grad_names = names;
  dist_tensor *gx = NULL;
  cr_assert_eq(dist_backward(tr[1].c, inv, NULL, &bo, &gx), 0, "%s", dist_errmsg(tr[1].c));
  pthread_join(first, NULL);
  cr_assert_eq(tr[0].rc, 0, "trainer 0: %s", tr[0].msg);
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_assert_eq(harness_open_on(&cluster, r, "gx", &t), 0, "rank %d has no 'gx'", r);
    cr_assert_eq(dist_mesh_size(dist_tensor_mesh(t)), 2, "rank %d: the put's 'gx'", r);
    dist_tensor_free(t);
  }
  dist_tensor_free(gx), dist_tensor_free(loss), dist_tensor_free(x);
  dist_invocation_free(inv);
  dist_program_free(p);
  for (int r = 0; r < 2; r++) dist_close(tr[r].c);
  dist_close(c);
}

/* One daemon's part of a LocalLayer call as a raw Invoke request, for
 * ranks libdist would never send. */
typedef struct raw_invoke {
  int rank;
  uint64_t op_id;
  uint32_t ranks[2]; /* the daemons the request says store the outputs */
  int rc;
  double took;
  char msg[512];
} raw_invoke;

static void *raw_invoke_main(void *arg) {
  raw_invoke *ri = arg;
  dist_client *c = harness_client_rank(&cluster, ri->rank, 10000);
  Dist__V1__ProgramArg x = DIST__V1__PROGRAM_ARG__INIT, *args[1] = {&x};
  x.tensor = "x";
  char *out_names[1] = {"y"};
  Dist__V1__ProgramInvokeRequest rq = DIST__V1__PROGRAM_INVOKE_REQUEST__INIT;
  rq.handle = 1; /* a fresh daemon numbers the programs it registers from 1 */
  rq.op_id = ri->op_id;
  rq.n_args = 1, rq.args = args;
  rq.n_out_names = 1, rq.out_names = out_names;
  rq.no_grad = 1, rq.replace = 1;
  rq.n_ranks = 2, rq.ranks = ri->ranks;
  ProtobufCMessage *rp = NULL;
  double t0 = harness_now_s();
  ri->rc = dist_call_one(c, 0, "/dist.v1.LocalLayer/Invoke", &rq.base,
                         &dist__v1__program_invoke_reply__descriptor, &rp);
  ri->took = harness_now_s() - t0;
  snprintf(ri->msg, sizeof ri->msg, "%s", dist_errmsg(c));
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  dist_close(c);
  return NULL;
}

/* Both daemons' parts of one call under op_id; rank 0's request names the
 * ranks rank0_ranks, rank 1's the right ones, [0, 1]. */
static void run_raw_invokes(uint64_t op_id, const uint32_t rank0_ranks[2], raw_invoke ri[2]) {
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    ri[r] = (raw_invoke){.rank = r, .op_id = op_id, .ranks = {0, 1}};
    if (r == 0) memcpy(ri[r].ranks, rank0_ranks, sizeof ri[r].ranks);
    pthread_create(&th[r], NULL, raw_invoke_main, &ri[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
}

/* Rank 0's daemon is asked to store the output with ranks [1, 0], not
 * the output mesh's order, and refuses before its part: rank 1, waiting
 * for rank 0's local shape of the sharded output, must fail at once,
 * naming rank 0 and why, not after the peer timeout (5 s). The same call
 * with the right ranks then goes through on both (which also shows
 * handle 1 is the program's). */
Test(local_layer_store, ranks_that_do_not_fit_the_program_fail_the_others_at_once) {
  dist_program *p = NULL;
  dist_client *c = start_with_sharded_doubler(&p);
  static const uint32_t reversed[2] = {1, 0}, in_order[2] = {0, 1};
  raw_invoke ri[2];
  run_raw_invokes(0x8100, reversed, ri);
  const char *why = "ranks: the request names 2 daemons to store the outputs";
  cr_expect(ri[0].rc == DIST_EINVAL && strstr(ri[0].msg, why), "rank 0: %s", ri[0].msg);
  cr_expect(ri[1].rc != 0 && strstr(ri[1].msg, "rank 0 aborted op") &&
                strstr(ri[1].msg, "its daemon refused it") && strstr(ri[1].msg, why),
            "rank 1 is not told of rank 0's refusal: %s", ri[1].msg);
  cr_expect_lt(ri[1].took, 2.0, "rank 1 waited %.1f s: %s", ri[1].took, ri[1].msg);
  for (int r = 0; r < 2; r++)
    cr_expect_eq(held_on(c, r, "y", 0, NULL, 0), DIST_ENOTFOUND, "rank %d stored 'y'", r);
  run_raw_invokes(0x8200, in_order, ri);
  for (int r = 0; r < 2; r++) cr_expect_eq(ri[r].rc, 0, "then, rank %d: %s", r, ri[r].msg);
  dist_program_free(p);
  dist_close(c);
}

/* The Release calls daemon r served, whatever it answered. */
static double releases_on(int r) { return served_on(r, "LocalLayer/Release"); }

/* Two daemons, rank 1 behind a relay (reply_hold_cluster): in *c the
 * client, in *x "x" put on [0,1] (x0, Replicate) and in *p the doubler,
 * sharded or not, registered. */
static reply_hold *relayed_doubler(int sharded, dist_client **c, dist_tensor **x,
                                   dist_program **p) {
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, c);
  int64_t n4 = 4;
  *x = harness_put(*c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()");
  *p = harness_doubler(sharded);
  cr_assert_eq(dist_program_register(*c, *p), 0, "%s", dist_errmsg(*c));
  return relay;
}

/* The doubler called on x, no_grad or not, its output named out (NULL:
 * by libdist), while rank 1's replies are held from its Invoke on: rank 1
 * stores, rank 0 answers, and the call fails at its deadline; returns its
 * result. */
static int call_whose_reply_from_rank_1_is_lost(dist_client *c, reply_hold *relay,
                                                dist_program *p, dist_tensor *x, int no_grad,
                                                const char *out) {
  dist_arg args[1] = {{x, NULL}};
  const char *names[1] = {out};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.no_grad = no_grad;
  o.out_names = out ? names : NULL;
  dist_invocation *inv = NULL;
  dist_tensor *y = NULL;
  /* An earlier pass's notes would make the call's first call to rank 1
   * their undo's Delete, not its Invoke. */
  dist_client_later_undo(c);
  cr_assert_eq(c->later.n, 0, "the client's later list kept %d notes", c->later.n);
  reply_hold_from_call(relay, 1);
  int rc = dist_local_layer_call(c, p, args, 1, &o, &inv, &y);
  cr_assert(reply_hold_holding(relay), "the call sent rank 1 no Invoke");
  reply_hold_release(relay);
  dist_invocation_free(inv);
  dist_tensor_free(y);
  return rc;
}

/* A no_grad call keeps no invocation for backward on any daemon, so its
 * undo on the daemons that stored its outputs (here rank 0, which
 * answered while rank 1's reply was lost) deletes them and releases
 * nothing. Before, it sent each of them a Release that found nothing: a
 * round trip per daemon, and a deadline to one gone silent. The same call
 * with gradient does release its invocation on rank 0, one Release, which
 * shows the count sees one. */
Test(local_layer_store, a_failed_no_grad_call_sends_no_release) {
  dist_client *c = NULL;
  dist_tensor *x = NULL;
  dist_program *p = NULL;
  reply_hold *relay = relayed_doubler(0, &c, &x, &p);
  for (int no_grad = 1; no_grad >= 0; no_grad--) {
    double before = releases_on(0);
    int rc = call_whose_reply_from_rank_1_is_lost(c, relay, p, x, no_grad, NULL);
    cr_assert_eq(rc, DIST_ETIMEDOUT, "no_grad %d: %s: %s", no_grad, dist_err_name(rc),
                 dist_errmsg(c));
    cr_expect_eq(releases_on(0) - before, !no_grad, "no_grad %d: rank 0 served %.0f Release "
                 "calls for the failed call's undo", no_grad, releases_on(0) - before);
    cr_expect_eq(reply_hold_invocations_on(&cluster, 0), 0, "no_grad %d: rank 0 kept the "
                 "invocation", no_grad);
  }
  dist_tensor_free(x);
  dist_program_free(p);
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* What a failed call stored on rank 1 under a name the caller gave (an
 * output, a gradient) before its reply was lost: `stored` there (4
 * float64, Replicate on [0,1]), and nothing on rank 0, which answered and
 * was undone. The caller deletes the leftover and puts a new value; the
 * client's next call, its undo point, must leave that value on both. */
static void callers_name_outlives_the_next_call(dist_client *c, dist_program *p,
                                                const char *name, const double *stored) {
  static const double fresh[4] = {10, 20, 30, 40};
  cr_assert_eq(held_on(c, 1, name, 2, stored, 4), 0, "rank 1 did not store '%s'", name);
  cr_assert_eq(held_on(c, 0, name, 0, NULL, 0), DIST_ENOTFOUND, "rank 0 answered: deleted");
  dist_tensor_delete(c, name); /* rank 0 holds no piece: its part may fail */
  cr_assert_eq(held_on(c, 1, name, 0, NULL, 0), DIST_ENOTFOUND, "rank 1 kept the leftover");
  int64_t n4 = 4;
  dist_tensor *t = harness_put(c, name, DIST_FLOAT64, fresh, 1, &n4, "[0,1]", "Replicate()");
  cr_assert_eq(call(c, p, "x2", 0), 0, "%s", dist_errmsg(c));
  for (int r = 0; r < 2; r++)
    cr_assert_eq(held_on(c, r, name, 2, fresh, 4), 0, "the undo deleted rank %d's new '%s'", r,
                 name);
  dist_tensor_free(t);
}

/* A call whose output the caller named "u", whose reply from rank 1 is
 * lost after rank 1 stored "u": the name is the caller's to use again, so
 * the failed call notes for a later undo on rank 1 only its invocation,
 * not "u". The client's next call undoes the note (the invocation goes)
 * and must leave the caller's new "u". */
Test(local_layer_store, a_lost_reply_leaves_an_output_the_caller_named_to_the_caller) {
  dist_client *c = NULL;
  dist_tensor *x = NULL;
  dist_program *p = NULL;
  reply_hold *relay = relayed_doubler(0, &c, &x, &p);
  int rc = call_whose_reply_from_rank_1_is_lost(c, relay, p, x, 0, "u");
  cr_assert_eq(rc, DIST_ETIMEDOUT, "%s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1, "rank 1 kept no invocation");
  static const double doubled[4] = {3, -4, 0.5, 16};
  callers_name_outlives_the_next_call(c, p, "u", doubled);
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 0, "the next call undid no note");
  dist_tensor_free(x);
  dist_program_free(p);
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* What ends the leftovers of lost_reply_call's failed call. */
typedef enum { BY_CALL, BY_RELEASE, BY_CLOSE } ended_by;

/* A call (the doubler on [0,1], its output named by libdist, kept for
 * backward) whose reply from rank 1 a relay holds past the deadline,
 * after rank 1 stored the output and kept the invocation: the call does
 * not ask rank 1 to undo them (it did not answer: a deadline each), but
 * the client's next LocalLayer call, invocation release or close does.
 * Before, the invocation stayed on rank 1 until its time-to-live (10
 * minutes), and the output for good. */
static void lost_reply_call(ended_by how) {
  dist_client *c = NULL;
  dist_tensor *x = NULL;
  dist_program *p = NULL;
  reply_hold *relay = relayed_doubler(1, &c, &x, &p);
  dist_arg arg = {x, NULL};
  dist_invocation *kept = NULL, *lost = NULL;
  dist_tensor *y = NULL, *z = NULL;
  if (how == BY_RELEASE) /* one to release: the client's, answered */
    cr_assert_eq(dist_local_layer_call(c, p, &arg, 1, NULL, &kept, &y), 0, "%s",
                 dist_errmsg(c));
  int outs = reply_hold_count_on(&cluster, 1, "doubler.", "");
  reply_hold_from_call(relay, 1);
  int rc = dist_local_layer_call(c, p, &arg, 1, NULL, &lost, &z);
  cr_assert(reply_hold_holding(relay), "the call sent rank 1 nothing");
  reply_hold_release(relay);
  cr_assert(rc < 0, "the call whose reply from rank 1 was lost succeeded");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "doubler.", ""), outs + 1,
               "rank 1 stored the output");
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1 + (kept != NULL),
               "rank 1 kept the invocation");
  cr_assert_eq(reply_hold_invocations_on(&cluster, 0), kept != NULL, "rank 0 answered: released");
  if (how == BY_CALL) cr_assert_eq(call(c, p, "x2", 0), 0, "%s", dist_errmsg(c)); /* no_grad */
  if (how == BY_RELEASE) cr_assert_eq(dist_invocation_release(c, kept), 0, "%s", dist_errmsg(c));
  if (how == BY_CLOSE) dist_close(c), c = NULL;
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 0, "rank 1 kept an invocation");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "doubler.", ""), outs,
               "rank 1 kept the failed call's output");
  dist_invocation_free(kept);
  dist_tensor_free(x), dist_tensor_free(y);
  dist_program_free(p);
  reply_hold_cluster_stop(&cluster, relay, c);
}

Test(local_layer_store, a_call_whose_reply_was_lost_leaves_nothing_after_the_next_call) {
  lost_reply_call(BY_CALL);
}

Test(local_layer_store, a_call_whose_reply_was_lost_leaves_nothing_after_a_release) {
  lost_reply_call(BY_RELEASE);
}

Test(local_layer_store, a_call_whose_reply_was_lost_leaves_nothing_after_the_close) {
  lost_reply_call(BY_CLOSE);
}

/* How rank 1 is held from the backward's first call on: its reply lost
 * (it runs the backward and stores) or its request (it never runs it). */
typedef enum { REPLY_LOST, REQUEST_LOST } held_part;

/* relayed_doubler's cluster, and the invocation of a call of the doubler
 * on x whose backward failed. */
typedef struct failed_backward {
  dist_client *c;
  dist_tensor *x;
  dist_program *p;
  reply_hold *relay;
  dist_invocation *inv;
} failed_backward;

/* relayed_doubler, the doubler called on x (kept for backward), and its
 * public backward from gradients of ones, storing x's gradient under
 * grad_name (NULL: libdist's "<out0>.grad0"), while rank 1's part is held
 * (`held`) past the deadline, which fails the backward. */
static void backward_held_on_rank_1(failed_backward *s, const char *grad_name, held_part held) {
  s->relay = relayed_doubler(0, &s->c, &s->x, &s->p);
  dist_arg args[1] = {{s->x, NULL}};
  dist_tensor *y = NULL, *g = NULL;
  cr_assert_eq(dist_local_layer_call(s->c, s->p, args, 1, NULL, &s->inv, &y), 0, "%s",
               dist_errmsg(s->c));
  static const double ones[4] = {1, 1, 1, 1};
  dist_value v[2] = {{ones, DIST_FLOAT64, 1, {4}}, {ones, DIST_FLOAT64, 1, {4}}};
  dist_arg og[1] = {{NULL, v}};
  const char *names[1] = {grad_name};
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.grad_names = grad_name ? names : NULL;
  if (held == REQUEST_LOST) reply_hold_requests_from_call(s->relay, 1);
  else reply_hold_from_call(s->relay, 1);
  int rc = dist_backward(s->c, s->inv, og, &bo, &g);
  cr_assert(reply_hold_holding(s->relay), "the backward sent rank 1 no call");
  reply_hold_release(s->relay);
  cr_assert(rc < 0, "the backward held on rank 1 succeeded");
  dist_tensor_free(g), dist_tensor_free(y);
}

static void failed_backward_stop(failed_backward *s) {
  dist_invocation_free(s->inv);
  dist_tensor_free(s->x);
  dist_program_free(s->p);
  reply_hold_cluster_stop(&cluster, s->relay, s->c);
}

/* A public backward, its gradient named by libdist, whose reply from
 * rank 1 is lost after rank 1 stored the gradient: the backward does not
 * ask rank 1 to delete it then (a deadline), but the client's next
 * LocalLayer call does. Before, it stayed on rank 1 for good. */
Test(local_layer_store, a_backward_whose_reply_was_lost_leaves_no_gradient_after_the_next_call) {
  failed_backward s;
  backward_held_on_rank_1(&s, NULL, REPLY_LOST);
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "doubler.", ".grad0"), 1,
               "rank 1 stored no gradient");
  cr_assert_eq(reply_hold_count_on(&cluster, 0, "doubler.", ".grad0"), 0,
               "rank 0 answered: deleted");
  cr_assert_eq(call(s.c, s.p, "x2", 0), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "doubler.", ".grad0"), 0,
               "rank 1 kept the failed backward's gradient");
  failed_backward_stop(&s);
}

/* A public backward whose request never reaches rank 1 (the relay drops
 * it, then the connection): rank 1 keeps the call's invocation, which no
 * backward used up. The client's next undo point, a release of any
 * invocation (this one's backward is done), releases it there. Before,
 * it stayed until its time-to-live (10 minutes). */
Test(local_layer_store,
     a_backward_request_rank_1_never_received_leaves_no_invocation_after_a_release) {
  failed_backward s;
  backward_held_on_rank_1(&s, NULL, REQUEST_LOST);
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1, "rank 1 used its invocation up");
  cr_assert_eq(reply_hold_count_on(&cluster, 1, "doubler.", ".grad0"), 0,
               "rank 1 stored a gradient");
  cr_assert_eq(dist_invocation_release(s.c, s.inv), 0, "%s", dist_errmsg(s.c));
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 0, "rank 1 kept the invocation");
  failed_backward_stop(&s);
}

/* A public backward storing x's gradient as "gx" (the caller's name),
 * whose reply from rank 1 is lost after rank 1 stored it: the name is
 * the caller's to use again, so only the invocation is noted for rank 1
 * (the client cannot tell whether rank 1 used it up), and the next call
 * asks rank 1 to release it (one Release served; none before, when
 * nothing was noted) and must leave the caller's new "gx" (it deleted it
 * when every gradient name was noted). */
Test(local_layer_store, a_lost_backward_reply_leaves_a_gradient_the_caller_named_to_the_caller) {
  failed_backward s;
  backward_held_on_rank_1(&s, "gx", REPLY_LOST);
  double before = releases_on(1);
  static const double twos[4] = {2, 2, 2, 2}; /* d(x + x)/dx */
  callers_name_outlives_the_next_call(s.c, s.p, "gx", twos);
  cr_assert_eq(releases_on(1) - before, 1, "the next call sent rank 1 %.0f Release calls",
               releases_on(1) - before);
  failed_backward_stop(&s);
}

/* Two SPMD trainers call the doubler; trainer 1's reply is lost after its
 * daemon stored (its relay holds it), and trainer 0's call succeeds. The
 * output's made-up name is both trainers' (one op id sequence), so trainer
 * 1 notes only the invocation, and its close leaves rank 1's piece of the
 * output trainer 0 holds. Before, it noted the name too and its close
 * deleted that piece (a reviewer's find). */
Test(local_layer_store, an_spmd_trainers_lost_reply_leaves_the_shared_output_to_the_others) {
  dist_client *c = NULL;
  reply_hold *relay = reply_hold_cluster(&cluster, 2, 1, REPLY_HOLD_DEADLINE_MS, &c);
  int64_t n4 = 4;
  dist_tensor_free(harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()"));
  registered d[2] = {
      {.tr.c = harness_spmd_client(&cluster, 0, "lost-spmd")},
      {.tr.c = harness_spmd_client_of(reply_hold_cluster_file(relay), 2, 1, "lost-spmd")}};
  for (int r = 0; r < 2; r++) {
    d[r].tr.c->timeout_ms = REPLY_HOLD_DEADLINE_MS;
    d[r].p = harness_doubler(0);
    d[r].kept_for_backward = d[r].names_made_up = 1;
    cr_assert_eq(dist_program_register(d[r].tr.c, d[r].p), 0, "%s", dist_errmsg(d[r].tr.c));
    /* opened before the hold, which the call's Invoke must be first under */
    cr_assert_eq(dist_tensor_open(d[r].tr.c, "x", &d[r].x), 0, "%s", dist_errmsg(d[r].tr.c));
  }
  reply_hold_from_call(relay, 1); /* trainer 1's Invoke: nothing else goes through it now */
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, call_registered, &d[0]), 0);
  call_registered(&d[1]);
  pthread_join(th, NULL);
  reply_hold_release(relay);
  cr_assert_eq(d[0].tr.rc, 0, "trainer 0: %s", d[0].tr.msg);
  cr_assert_neq(d[1].tr.rc, 0, "trainer 1's call succeeded with its reply held");
  cr_expect_eq(d[1].tr.c->later.n, 1, "trainer 1 noted %d items, not its invocation alone",
               d[1].tr.c->later.n);
  for (int r = 1; r >= 0; r--) {
    dist_tensor_free(d[r].x);
    dist_close(d[r].tr.c);
    dist_program_free(d[r].p);
  }
  static const double doubled[4] = {3, -4, 0.5, 16};
  for (int r = 0; r < 2; r++)
    cr_expect_eq(held_on(c, r, d[0].out_name, 2, doubled, 4), 0,
                 "rank %d lost its piece of '%s', trainer 0's output", r, d[0].out_name);
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* After an undo whose request rank 1 never received: rank 0 released its
 * invocation, rank 1 kept it, and the client's next call (p, no_grad)
 * releases it there. */
static void rank_1_invocation_undone_by_the_next_call(dist_client *c, dist_program *p) {
  cr_assert_eq(reply_hold_invocations_on(&cluster, 0), 0, "rank 0 answered: released");
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 1, "rank 1 kept no invocation");
  cr_assert_eq(call(c, p, "x2", 0), 0, "%s", dist_errmsg(c));
  cr_assert_eq(reply_hold_invocations_on(&cluster, 1), 0, "the next call left rank 1's "
               "invocation");
}

/* relayed_doubler's cluster (not sharded), and a call of the doubler on
 * x that succeeded, its invocation kept for backward on both daemons. */
typedef struct kept_call {
  dist_client *c;
  reply_hold *relay;
  dist_tensor *x, *y;
  dist_program *p;
  dist_invocation *inv;
} kept_call;

static void kept_call_start(kept_call *k) {
  *k = (kept_call){0};
  k->relay = relayed_doubler(0, &k->c, &k->x, &k->p);
  dist_arg arg = {k->x, NULL};
  cr_assert_eq(dist_local_layer_call(k->c, k->p, &arg, 1, NULL, &k->inv, &k->y), 0, "%s",
               dist_errmsg(k->c));
}

static void kept_call_stop(kept_call *k) {
  dist_invocation_free(k->inv);
  dist_tensor_free(k->x), dist_tensor_free(k->y);
  dist_program_free(k->p);
  reply_hold_cluster_stop(&cluster, k->relay, k->c);
}

/* A public release whose request rank 1 never receives (the relay drops
 * it, then the connection): rank 1 keeps the invocation, the release
 * fails at its deadline and notes it, and the client's next undo point
 * (its next call) releases it there. The release waits out one deadline:
 * the undo pass it runs after leaves its own note, on the daemon that
 * just went silent, for the next time (two deadlines when the pass tried
 * it). Before, the invocation stayed on rank 1 until its time-to-live
 * (10 minutes). */
Test(local_layer_store, a_release_rank_1_never_received_is_retried_at_the_next_call) {
  kept_call k;
  kept_call_start(&k);
  reply_hold_requests_from_call(k.relay, 1);
  double t0 = harness_now_s();
  int rc = dist_invocation_release(k.c, k.inv);
  double took = harness_now_s() - t0;
  cr_assert(reply_hold_holding(k.relay), "the release sent rank 1 nothing");
  /* Counted, not timed alone: the pass sent rank 1 nothing more. */
  int sent = reply_hold_calls_seen(k.relay);
  reply_hold_release(k.relay);
  cr_assert_eq(rc, DIST_ETIMEDOUT, "%s: %s", dist_err_name(rc), dist_errmsg(k.c));
  cr_expect_eq(sent, 1, "the release sent rank 1 %d calls, not its Release alone", sent);
  cr_expect_lt(took, 1.9 * REPLY_HOLD_DEADLINE_MS / 1000.0,
               "the release took %.1f s against a deadline of %.1f s", took,
               REPLY_HOLD_DEADLINE_MS / 1000.0);
  rank_1_invocation_undone_by_the_next_call(k.c, k.p);
  kept_call_stop(&k);
}

/* A call that rank 1 answered but that fails, and whose own undo's
 * Release never reaches rank 1: the call (the doubler on [0,1], its
 * output named "u") is let through by its first check of "u" outside
 * its mesh, rank 2 being frozen (a daemon that does not answer does not
 * stop it), and refused by its second, once stored, rank 2 resumed and
 * holding "u"; meanwhile the relay holds rank 1's Invoke reply, then
 * drops every request from the undo's Release on (and then the
 * connection). Rank 1 keeps the invocation; the call notes it, and the
 * client's next call releases it there. Before, it stayed until its
 * time-to-live (10 minutes). */
Test(local_layer_store, a_failed_calls_own_release_rank_1_never_received_is_retried) {
  registered g = {.tr.out = "u", .p = harness_doubler(0), .kept_for_backward = 1};
  reply_hold *relay = reply_hold_cluster(&cluster, 3, 1, REPLY_HOLD_DEADLINE_MS, &g.tr.c);
  dist_client *c = g.tr.c;
  int64_t n4 = 4;
  g.x = harness_put(c, "x", DIST_FLOAT64, x0, 1, &n4, "[0,1]", "Replicate()");
  dist_tensor_free(harness_put(c, "u", DIST_FLOAT64, x0, 1, &n4, "[2]", "Replicate()"));
  cr_assert_eq(dist_program_register(c, g.p), 0, "%s", dist_errmsg(c));
  cr_assert(harness_freeze(&cluster, 2, 5000), "rank 2 did not stop");
  reply_hold_from_call(relay, 1);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, call_registered, &g), 0);
  for (double t0 = harness_now_s(); !reply_hold_holding(relay) && harness_now_s() - t0 < 20;)
    harness_sleep_ms(20);
  int held = reply_hold_holding(relay);
  cr_assert_eq(kill(cluster.pids[2], SIGCONT), 0);
  reply_hold_requests_from_call(relay, 1); /* lets the Invoke's reply through */
  pthread_join(th, NULL);
  cr_assert(held, "the call sent rank 1 no Invoke");
  cr_assert(reply_hold_holding(relay), "the undo sent rank 1 nothing");
  /* The Release alone: once it waited out its deadline, the delete of the
   * caller's "u" there is not sent (a second deadline before). */
  cr_expect_eq(reply_hold_calls_seen(relay), 1, "the undo sent rank 1 %d calls",
               reply_hold_calls_seen(relay));
  reply_hold_release(relay);
  cr_assert_eq(g.tr.rc, DIST_EEXIST, "%s: %s", dist_err_name(g.tr.rc), g.tr.msg);
  rank_1_invocation_undone_by_the_next_call(c, g.p);
  dist_tensor_free(g.x);
  dist_program_free(g.p);
  reply_hold_cluster_stop(&cluster, relay, c);
}

/* A public release while rank 1 cannot be reached (the relay refuses its
 * connections, as a daemon that is down would; rank 1 stays up and keeps
 * the invocation): the release fails at once, rank 1 unanswered
 * (DIST_EUNAVAIL), and notes the invocation as one whose release waited
 * out its deadline is, so the client's next undo point (its next call,
 * rank 1 reachable again) releases it there. Before, only a deadline
 * waited out was noted: the invocation stayed on rank 1 until its
 * time-to-live (10 minutes). */
Test(local_layer_store, a_release_rank_1_could_not_be_reached_for_is_retried_at_the_next_call) {
  kept_call k;
  kept_call_start(&k);
  reply_hold_refuse(k.relay);
  int rc = dist_invocation_release(k.c, k.inv);
  char msg[600];
  snprintf(msg, sizeof msg, "%s", dist_errmsg(k.c));
  reply_hold_release(k.relay);
  cr_assert_eq(rc, DIST_EUNAVAIL, "%s: %s", dist_err_name(rc), msg);
  rank_1_invocation_undone_by_the_next_call(k.c, k.p);
  kept_call_stop(&k);
}
