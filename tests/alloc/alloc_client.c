/* A single client of a 2-daemon cluster running one of each kind of
 * libdist operation, checking each result against a value computed here,
 * for the allocation sweep (tests/alloc/run.sh): run under failalloc.so,
 * each of its allocations fails in turn.
 *
 *   alloc_client CLUSTER_FILE PREFIX CHECKPOINT_DIR [held|three]
 *
 * With "held" it runs only the put of a name held outside the put's mesh,
 * which takes a third daemon. With "three", on a 3-daemon cluster, it runs
 * everything, then puts and reshards on mesh [0,1,2] (votes and moves
 * among three daemons).
 *
 * Every tensor, program and layer it makes is named PREFIX.*, so runs with
 * different prefixes never meet, and it deletes them on every path.
 * Exit 0: every step succeeded with the expected values; 3: a call
 * returned DIST_ENOMEM, 4: a call failed with another error (its message
 * printed, and not empty); 1: a wrong value or a failure without a
 * message. The client's own sweep takes only 0 and 3; the daemon's
 * (tests/alloc/daemon_run.sh) also 4, since a daemon that cannot allocate
 * may make its peers fail the operation for it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

enum { ROWS = 4, COLS = 2, NELEM = ROWS * COLS };

typedef struct run {
  dist_client *c;
  const char *prefix, *ckpt_dir;
  dist_mesh *mesh;
  int world;       /* the cluster's daemons: 2, or 3 in mode "three" */
  int rc;          /* the first failure's code; 0 while all went well */
  int wrong_value; /* a call succeeded with a result other than expected */
  char names[48][200];
  int nnames;      /* tensors this run may have made, deleted at the end */
  int puts[16];    /* of those, the puts that succeeded (indices into names) */
  const float *put_values[16]; /* what each holds at the end, NULL: a value
                                  a call replaced (checked by that call) */
  int nputs;
  int cleanup_failed; /* a clean-up call ran out of memory (cleaned_up) */
} run;

static const float data_x[NELEM] = {1, 2, 3, 4, 5, 6, 7, 8};

static int wrong(run *r, const char *what) {
  fprintf(stderr, "alloc_client: %s: wrong value\n", what);
  r->wrong_value = 1;
  if (r->rc == 0) r->rc = DIST_EINTERNAL;
  return 1;
}

/* Records the first failure, saying msg; returns 1 when rc is one. A
 * failure must say why: one without a message is a wrong result. */
static int failed_saying(run *r, int rc, const char *what, const char *msg) {
  if (rc == 0) return 0;
  if (r->rc == 0) {
    fprintf(stderr, "alloc_client: %s: %s (%s)\n", what, msg, dist_err_name(rc));
    r->rc = rc;
    if (!msg[0]) wrong(r, "the failure's message");
  }
  return 1;
}

/* failed_saying the client's message, or the thread's for calls that
 * take no client. */
static int failed(run *r, int rc, const char *what) {
  const char *msg = dist_errmsg(r->c);
  return failed_saying(r, rc, what, msg[0] ? msg : dist_errmsg(NULL));
}

/* failed() of a call that deletes or releases what the run made. The
 * shim fails one allocation: when a clean-up ran out of memory, every
 * other call had what it needed, so what that clean-up was to delete is
 * all the run can have left (delete_leftovers, at the end); any other
 * tensor a run leaves fails the sweep (tests/alloc/run.sh). */
static int cleaned_up(run *r, int rc, const char *what) {
  if (rc == DIST_ENOMEM) r->cleanup_failed = 1;
  return failed(r, rc, what);
}

/* PREFIX.suffix, remembered for deletion at the end. */
static const char *name_of(run *r, const char *suffix) {
  char *n = r->names[r->nnames++];
  snprintf(n, sizeof r->names[0], "%s.%s", r->prefix, suffix);
  return n;
}

static int same_floats(const void *got, size_t nbytes, const float *want, size_t n) {
  if (nbytes != n * sizeof(float)) return 0;
  for (size_t i = 0; i < n; i++)
    if (fabsf(((const float *)got)[i] - want[i]) > 1e-5f) return 0;
  return 1;
}

/* The whole value of t equals want (n floats). */
static int check_full(run *r, const dist_tensor *t, const float *want, size_t n,
                      const char *what) {
  void *got = NULL;
  size_t nbytes = 0;
  if (failed(r, dist_full_tensor(r->c, t, &got, &nbytes), what)) return 1;
  int bad = !same_floats(got, nbytes, want, n);
  free(got);
  return bad ? wrong(r, what) : 0;
}

/* A put of the caller's tensor PREFIX.suffix. One that failed is not
 * deleted at the end: its undo must leave nothing (the sweep's listing
 * shows a piece it left); one that succeeded must be there at the end
 * (puts_kept). */
static int put(run *r, const char *suffix, const float *x, dist_placement pl,
               dist_tensor **out) {
  int64_t shape[2] = {ROWS, COLS};
  if (r->nputs == (int)(sizeof r->puts / sizeof r->puts[0]))
    return wrong(r, "a put beyond the run's room for puts");
  if (failed(r, dist_shard_tensor(r->c, name_of(r, suffix), x, DIST_FLOAT32, 2, shape,
                                  r->mesh, &pl, out),
             "shard_tensor")) {
    r->nnames--;
    return 1;
  }
  r->put_values[r->nputs] = x;
  r->puts[r->nputs++] = r->nnames - 1;
  return 0;
}

/* The last put's value may be replaced by a call (which checks it). */
static void last_put_replaced(run *r) { r->put_values[r->nputs - 1] = NULL; }

/* The caller's tensors the run put are all still there, whole, whatever
 * failed on the way: no undo deleted a tensor, or a piece of one on some
 * daemons, that it did not store (the clean-up by name at the end would
 * hide it). Opening finds a tensor any daemon holds, so each is read
 * whole, from every daemon of its mesh, and compared with what was put. */
static void puts_kept(run *r) {
  for (int i = 0; i < r->nputs; i++) {
    const char *name = r->names[r->puts[i]];
    dist_tensor *t = NULL;
    void *got = NULL;
    size_t nbytes = 0;
    int rc = dist_tensor_open(r->c, name, &t);
    if (rc == 0) rc = dist_full_tensor(r->c, t, &got, &nbytes);
    dist_tensor_free(t);
    if (rc == 0 && r->put_values[i] && !same_floats(got, nbytes, r->put_values[i], NELEM))
      wrong(r, "a tensor the run put, at the end");
    free(got);
    if (rc != DIST_ENOTFOUND) {
      failed(r, rc, "read a put tensor at the end");
      continue;
    }
    fprintf(stderr, "alloc_client: the caller's tensor '%s' is gone, or a piece of it\n", name);
    wrong(r, "a tensor the run put");
  }
}

/* ---------------------------------------------------------------- tensors */

/* Shard and Replicate puts, reshards on the mesh and onto another,
 * to_local and full_tensor. */
static int tensors(run *r) {
  dist_tensor *a = NULL, *b = NULL;
  dist_mesh *swapped = NULL;
  dist_placement rep = DIST_REPLICATED, shard0 = DIST_SHARD_DIM(0);
  void *piece = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  if (put(r, "a", data_x, shard0, &a) || put(r, "b", data_x, rep, &b)) goto out;
  if (failed(r, dist_dtensor_to_local(r->c, a, 1, &piece, &nbytes, shape), "to_local")) goto out;
  if (!same_floats(piece, nbytes, data_x + NELEM / 2, NELEM / 2) || shape[0] != ROWS / 2) {
    wrong(r, "rank 1's piece of Shard(0)");
    goto out;
  }
  if (failed(r, dist_reshard(r->c, a, NULL, &rep), "reshard")) goto out;
  if (check_full(r, a, data_x, NELEM, "full_tensor after reshard")) goto out;
  if (check_full(r, b, data_x, NELEM, "full_tensor of Replicate")) goto out;
  /* Onto another mesh of the same shape: rank k of one hands its piece to
   * rank k of the other (reshard.c's move), here rank 0 to 1 and 1 to 0. */
  int rc = dist_mesh_from_string("[1,0]", "x", &swapped);
  if (failed_saying(r, rc, "mesh [1,0]", rc ? dist_last_mesh_error() : "")) goto out;
  if (failed(r, dist_reshard(r->c, b, swapped, &rep), "reshard onto [1,0]")) goto out;
  check_full(r, b, data_x, NELEM, "full_tensor after the reshard onto [1,0]");
out:
  free(piece);
  dist_tensor_free(a);
  dist_tensor_free(b);
  dist_mesh_free(swapped);
  return r->rc;
}

/* ---------------------------------------------------------------- three ranks */

/* Mode "three": a 6x2 tensor on mesh [0,1,2], Shard(0) then Replicate
 * (each rank's vote and its all-gather among three), then moved onto
 * [2,0,1] (each rank hands its piece to another). */
static int three_ranks(run *r) {
  static const float data_6x2[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  int64_t shape[2] = {6, 2};
  dist_mesh *mesh = NULL, *rotated = NULL;
  dist_tensor *t = NULL;
  dist_placement rep = DIST_REPLICATED, shard0 = DIST_SHARD_DIM(0);
  int rc = dist_mesh_from_string("[0,1,2]", "x", &mesh);
  if (!rc) rc = dist_mesh_from_string("[2,0,1]", "x", &rotated);
  if (failed_saying(r, rc, "meshes of three", rc ? dist_last_mesh_error() : "")) goto out;
  if (failed(r, dist_shard_tensor(r->c, name_of(r, "three"), data_6x2, DIST_FLOAT32, 2, shape,
                                  mesh, &shard0, &t),
             "shard_tensor on [0,1,2]") ||
      failed(r, dist_reshard(r->c, t, NULL, &rep), "reshard on [0,1,2]") ||
      check_full(r, t, data_6x2, 12, "full_tensor on [0,1,2]") ||
      failed(r, dist_reshard(r->c, t, rotated, &rep), "reshard onto [2,0,1]"))
    goto out;
  check_full(r, t, data_6x2, 12, "full_tensor after the reshard onto [2,0,1]");
out:
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  dist_mesh_free(rotated);
  return r->rc;
}

/* ---------------------------------------------------------------- held elsewhere */

/* After the refused put: the cluster lists name once, on [2]; the pieces
 * the put stored on ranks 0 and 1 were deleted (a listing is once per
 * name and mesh, so a piece left there is a second entry). */
static void held_only_on_2(run *r, const char *name) {
  dist_tensor **list = NULL;
  int n = 0, entries = 0;
  if (failed(r, dist_tensor_list(r->c, &list, &n), "list after the refused put")) return;
  for (int i = 0; i < n; i++)
    entries += strcmp(dist_tensor_name(list[i]), name) == 0;
  dist_tensor_list_free(list, n);
  if (entries != 1) wrong(r, "the refused put's pieces on [0,1] (left, or the held one lost)");
}

/* Mode "held", on a 3-daemon cluster: a name rank 2 holds on mesh [2] put
 * onto mesh [0,1]. Ranks 0 and 1 store it, then the put asks rank 2 and
 * must be refused, also when it cannot allocate what the asking takes
 * (it let the put through); the pieces it stored are then deleted
 * (the sweep's listing of what a run left). One-rank meshes would not do: pieces under
 * one name on one-rank meshes are per-rank values, no clash. */
static void held_elsewhere(run *r) {
  dist_mesh *only2 = NULL;
  dist_tensor *held = NULL, *put_over = NULL;
  dist_placement rep = DIST_REPLICATED;
  int64_t shape[2] = {ROWS, COLS};
  const char *name = name_of(r, "held");
  int rc = dist_mesh_from_string("[2]", "x", &only2);
  if (failed_saying(r, rc, "mesh [2]", rc ? dist_last_mesh_error() : "")) return;
  rc = dist_shard_tensor(r->c, name, data_x, DIST_FLOAT32, 2, shape, only2, &rep, &held);
  if (failed(r, rc, "put onto [2]")) goto out;
  rc = dist_shard_tensor(r->c, name, data_x, DIST_FLOAT32, 2, shape, r->mesh, &rep, &put_over);
  if (rc == 0) wrong(r, "a put onto [0,1] of a name rank 2 holds on [2]");
  else if (rc != DIST_EEXIST) failed(r, rc, "put onto [0,1] of a name held on [2]");
  else if (!strstr(dist_errmsg(r->c), "already exists on rank 2")) wrong(r, "the refusal");
  else held_only_on_2(r, name);
out:
  dist_tensor_free(put_over);
  dist_tensor_free(held);
  dist_mesh_free(only2);
}

/* ---------------------------------------------------------------- exchanges */

/* Seed 003: 5 rows of 2 on each of 2 ranks, 2 experts per rank. */
static const float seed_x[5][2] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}};
static const int64_t seed_counts[2][4] = {{2, 1, 1, 1}, {1, 1, 2, 1}};
static const float seed_y[2][10] = {{1, 2, 3, 4, 1, 2, 5, 6, 3, 4},
                                    {7, 8, 5, 6, 7, 8, 9, 10, 9, 10}};

/* global_scatter to the client, then global_gather of that back: x again. */
static int exchanges(run *r) {
  const void *xs[2] = {seed_x, seed_x};
  const int64_t *lcs[2] = {seed_counts[0], seed_counts[1]};
  void *y[2] = {NULL, NULL}, *back[2] = {NULL, NULL};
  int64_t y_rows[2] = {0, 0}, back_rows[2] = {0, 0};
  if (failed(r, dist_global_scatter(r->c, xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                    NULL, y, y_rows),
             "global_scatter"))
    goto out;
  for (int k = 0; k < 2; k++)
    if (!same_floats(y[k], (size_t)y_rows[k] * 2 * sizeof(float), seed_y[k], 10)) {
      wrong(r, "global_scatter");
      goto out;
    }
  const void *ys[2] = {y[0], y[1]};
  if (failed(r, dist_global_gather(r->c, ys, y_rows, DIST_FLOAT32, 2, lcs, lcs, 2, NULL, 0,
                                   NULL, back, back_rows),
             "global_gather"))
    goto out;
  for (int k = 0; k < 2; k++)
    if (!same_floats(back[k], (size_t)back_rows[k] * 2 * sizeof(float), &seed_x[0][0], 10)) {
      wrong(r, "global_gather");
      break;
    }
out:
  for (int k = 0; k < 2; k++) free(y[k]), free(back[k]);
  return r->rc;
}

/* ---------------------------------------------------------------- MoE layer */

enum { DM = 4, DH = 4, NE = 2, TOK = 2 };

/* Two experts (one per rank), top-1, with w1 = w2 = 0: expert e's output
 * is its b2 (e + 1 everywhere), and x's gradient is 0. The gate sends a
 * token with a positive first element to expert 0, else to expert 1. */
static int moe(run *r) {
  static const float zeros[DM * DH], b1[DH];
  static const float b2[NE][DM] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  static const float gate[DM * NE] = {1, -1, 0, 0, 0, 0, 0, 0};
  static const float x[NE][TOK * DM] = {{1, 0, 0, 0, -1, 0, 0, 0}, {-2, 0, 0, 0, 3, 0, 0, 0}};
  static const float want_y[NE][TOK * DM] = {{1, 1, 1, 1, 2, 2, 2, 2}, {2, 2, 2, 2, 1, 1, 1, 1}};
  dist_expert_weights w[NE] = {{zeros, b1, zeros, b2[0]}, {zeros, b1, zeros, b2[1]}};
  dist_moe_layer_opts o = DIST_MOE_LAYER_OPTS_INIT;
  o.d_model = DM, o.d_hidden = DH, o.bias = 1, o.top_k = 1, o.weights = w;
  dist_moe_layer *l = NULL;
  void *y[NE] = {NULL, NULL}, *gx[NE] = {NULL, NULL};
  const void *xs[NE] = {x[0], x[1]};
  int64_t tokens[NE] = {TOK, TOK};
  const char *name = name_of(r, "moe");
  /* What the layer keeps between its passes, per rank. */
  static const char *const kept[4] = {"moe.moe_x", "moe.moe_y", "moe.moe_dy", "moe.moe_dx"};
  for (int i = 0; i < 4; i++) name_of(r, kept[i]);
  if (failed(r, dist_moe_layer_create(r->c, name, &o, &l), "moe_layer_create")) return r->rc;
  if (failed(r, dist_moe_layer_forward(r->c, l, xs, tokens, gate, y), "moe forward")) goto out;
  for (int k = 0; k < NE; k++)
    if (!same_floats(y[k], TOK * DM * sizeof(float), want_y[k], TOK * DM)) {
      wrong(r, "moe forward");
      goto out;
    }
  const void *gy[NE] = {y[0], y[1]};
  if (failed(r, dist_moe_layer_backward(r->c, l, gy, gx, NULL), "moe backward")) goto out;
  for (int k = 0; k < NE; k++)
    if (!same_floats(gx[k], TOK * DM * sizeof(float), zeros, TOK * DM)) {
      wrong(r, "moe backward");
      break;
    }
out:
  for (int k = 0; k < NE; k++) free(y[k]), free(gx[k]);
  for (int e = 0; l && e < NE; e++)
    for (int p = 0; p < 4; p++) {
      static const char *const which[4] = {"w1", "b1", "w2", "b2"};
      char param[200];
      if (dist_moe_layer_param_name(l, e, which[p], param, sizeof param) < 0) continue;
      if (r->nnames + 2 > 48) continue;
      snprintf(r->names[r->nnames++], sizeof r->names[0], "%s", param);
      snprintf(r->names[r->nnames++], sizeof r->names[0], "%.190s.grad", param);
    }
  dist_moe_layer_free(l);
  return r->rc;
}

/* ---------------------------------------------------------------- LocalLayer */

/* loss = sum(y * y) on each rank's piece, Partial(sum) over the mesh. */
static int sum_sq_program(run *r, dist_program **out) {
  char name[200];
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  snprintf(name, sizeof name, "%s.sum_sq", r->prefix);
  if (failed(r, dist_program_new(name, out), "program_new")) return r->rc;
  int y = dist_input_dtensor(*out, "y", DIST_FLOAT32);
  dist_program_output(*out, dist_op_sum(*out, dist_op_mul(*out, y, y), NULL, 0, 0));
  dist_program_out_dist_attr(*out, r->mesh, &psum, NULL);
  return failed(r, dist_program_register(r->c, *out), "program_register");
}

/* The program on a Shard(0) tensor: the sum of squares, and 2x back. */
static int local_layer(run *r, dist_program *p) {
  float want_grad[NELEM], sum = 0;
  for (int i = 0; i < NELEM; i++) want_grad[i] = 2 * data_x[i], sum += data_x[i] * data_x[i];
  dist_tensor *x = NULL, *loss = NULL, *grad = NULL;
  dist_invocation *inv = NULL;
  if (put(r, "c", data_x, DIST_SHARD_DIM(0), &x)) return r->rc;
  dist_arg arg = {x, NULL};
  if (failed(r, dist_local_layer_call(r->c, p, &arg, 1, NULL, &inv, &loss), "local_layer_call"))
    goto out;
  if (check_full(r, loss, &sum, 1, "local_layer_call's loss")) goto out;
  if (failed(r, dist_backward(r->c, inv, NULL, NULL, &grad), "backward")) goto out;
  check_full(r, grad, want_grad, NELEM, "backward's gradient");
out:
  if (loss) cleaned_up(r, dist_tensor_delete_handle(r->c, loss), "delete the loss");
  if (grad) cleaned_up(r, dist_tensor_delete_handle(r->c, grad), "delete the gradient");
  if (inv) dist_invocation_release(r->c, inv); /* fails after a backward: nothing kept */
  dist_invocation_free(inv);
  dist_tensor_free(x), dist_tensor_free(loss), dist_tensor_free(grad);
  return r->rc;
}

/* After a replacing call on x: the sum of its squares when the call
 * succeeded; x itself or that sum when it failed (a failure after the
 * daemons stored the output keeps it). */
static void expect_x_or_its_sum(run *r, const dist_tensor *t, int called) {
  float sum = 0;
  for (int i = 0; i < NELEM; i++) sum += data_x[i] * data_x[i];
  void *got = NULL;
  size_t nbytes = 0;
  if (failed(r, dist_full_tensor(r->c, t, &got, &nbytes), "the replaced tensor's value")) return;
  int is_sum = same_floats(got, nbytes, &sum, 1), is_x = same_floats(got, nbytes, data_x, NELEM);
  free(got);
  if (!is_sum && (called == 0 || !is_x)) wrong(r, "the replaced tensor's value");
}

/* A call whose output replaces a tensor of the caller's: failed or not,
 * the name still holds a tensor afterwards (its old value or the
 * output). Deleting a replacing call's outputs to undo it would lose the
 * caller's tensor for good. */
static int replacing_call(run *r, dist_program *p) {
  dist_tensor *x = NULL, *loss = NULL, *after = NULL;
  dist_invocation *inv = NULL;
  if (put(r, "rp", data_x, DIST_SHARD_DIM(0), &x)) return r->rc;
  last_put_replaced(r);
  const char *names[] = {r->names[r->nnames - 1]}; /* x's own name */
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = names, o.replace = 1, o.no_grad = 1;
  dist_arg arg = {x, NULL};
  int called = dist_local_layer_call(r->c, p, &arg, 1, &o, &inv, &loss);
  failed(r, called, "replacing call");
  int rc = dist_tensor_open(r->c, names[0], &after);
  if (rc == DIST_ENOTFOUND) wrong(r, "the replaced tensor is gone after the call");
  else if (!failed(r, rc, "open the replaced tensor")) expect_x_or_its_sum(r, after, called);
  if (inv) dist_invocation_release(r->c, inv); /* no_grad: nothing kept */
  dist_invocation_free(inv);
  dist_tensor_free(x), dist_tensor_free(loss), dist_tensor_free(after);
  return r->rc;
}

/* A replacing backward without gradient names, of a call whose output the
 * caller named: "<out0>.grad0" may be the caller's (here a tensor put
 * there first, as an earlier step's gradient stands), so failed or not
 * the name still holds its old value or the new gradient (2x). */
static int replacing_backward(run *r, dist_program *p) {
  float twice[NELEM];
  for (int i = 0; i < NELEM; i++) twice[i] = 2 * data_x[i];
  dist_tensor *x = NULL, *old = NULL, *loss = NULL, *grad = NULL, *after = NULL;
  dist_invocation *inv = NULL;
  const char *out[] = {name_of(r, "rb")};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = out, o.replace = 1;
  dist_backward_opts bo = DIST_BACKWARD_OPTS_INIT;
  bo.replace = 1;
  dist_arg arg = {NULL, NULL};
  if (put(r, "rbx", data_x, DIST_SHARD_DIM(0), &x) ||
      put(r, "rb.grad0", data_x, DIST_SHARD_DIM(0), &old))
    goto out;
  last_put_replaced(r);
  arg.tensor = x;
  if (failed(r, dist_local_layer_call(r->c, p, &arg, 1, &o, &inv, &loss), "call to back"))
    goto out;
  int backed = dist_backward(r->c, inv, NULL, &bo, &grad);
  failed(r, backed, "replacing backward");
  int rc = dist_tensor_open(r->c, r->names[r->nnames - 1], &after);
  if (rc == DIST_ENOTFOUND) wrong(r, "the replaced gradient is gone after the backward");
  else if (!failed(r, rc, "open the replaced gradient")) {
    void *got = NULL;
    size_t nbytes = 0;
    if (!failed(r, dist_full_tensor(r->c, after, &got, &nbytes), "the gradient's value") &&
        !same_floats(got, nbytes, twice, NELEM) &&
        (backed == 0 || !same_floats(got, nbytes, data_x, NELEM)))
      wrong(r, "the replaced gradient's value");
    free(got);
  }
out:
  if (inv) dist_invocation_release(r->c, inv); /* fails after a backward: nothing kept */
  dist_invocation_free(inv);
  dist_tensor_free(x), dist_tensor_free(old), dist_tensor_free(loss);
  dist_tensor_free(grad), dist_tensor_free(after);
  return r->rc;
}

/* ---------------------------------------------------------------- shard_layer */

static int column_parallel(const char *name, dist_layer *l, const dist_mesh *m, void *user) {
  (void)name, (void)m, (void)user;
  dist_placement shard1 = DIST_SHARD_DIM(1);
  return dist_layer_place_param(l, "weight", &shard1, 1);
}

/* y = x @ W + b on x = data_x [4, 2]; gradient dy of ones: dW = x^T @ 1,
 * db = 4 per column. SGD with lr 1 steps W by -dW and b by -db, then a
 * client push of b's gradient 1 steps b by -1 more. */
static int linear_expectations(const dist_layer *l, float *y, float *w_after, float *b_after) {
  void *w = NULL, *b = NULL;
  size_t nw = 0, nb = 0;
  int rc = dist_layer_read_param(NULL, l, "weight", &w, &nw);
  if (rc == 0) rc = dist_layer_read_param(NULL, l, "bias", &b, &nb);
  if (rc) return free(w), free(b), rc;
  const float *W = w, *B = b;
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++)
      y[i * COLS + j] = B[j] + data_x[i * COLS] * W[j] + data_x[i * COLS + 1] * W[COLS + j];
  for (int k = 0; k < COLS; k++)
    for (int j = 0; j < COLS; j++) {
      float dw = 0;
      for (int i = 0; i < ROWS; i++) dw += data_x[i * COLS + k];
      w_after[k * COLS + j] = W[k * COLS + j] - dw;
    }
  for (int j = 0; j < COLS; j++) b_after[j] = B[j] - ROWS - 1;
  free(w), free(b);
  return 0;
}

static int check_param(run *r, dist_layer *l, const char *path, const float *want, size_t n) {
  void *got = NULL;
  size_t nbytes = 0;
  if (failed(r, dist_layer_read_param(r->c, l, path, &got, &nbytes), "layer_read_param"))
    return r->rc;
  int bad = !same_floats(got, nbytes, want, n);
  free(got);
  return bad ? wrong(r, path) : 0;
}

static int layer_train(run *r, dist_layer *l, dist_tensor *x, dist_tensor *dy) {
  float want_y[NELEM], w_after[COLS * COLS], b_after[COLS], ones[COLS] = {1, 1};
  dist_tensor *y = NULL;
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1;
  if (failed(r, linear_expectations(l, want_y, w_after, b_after), "layer expectations"))
    return r->rc;
  if (failed(r, dist_shard_layer(r->c, l, r->mesh, column_parallel, NULL, NULL, NULL),
             "shard_layer"))
    return r->rc;
  int n = dist_layer_forward(r->c, l, &x, 1, &y, 1);
  if (failed(r, n < 0 ? n : 0, "layer_forward")) return r->rc;
  if (check_full(r, y, want_y, NELEM, "layer_forward")) goto out;
  if (failed(r, dist_layer_backward(r->c, l, &dy, NULL), "layer_backward") ||
      failed(r, dist_layer_configure_optimizer(r->c, l, &o), "configure_optimizer") ||
      failed(r, dist_layer_step(r->c, l, 0), "layer_step") ||
      failed(r, dist_layer_push_grad(r->c, l, "bias", 0, ones, sizeof ones), "push_grad"))
    goto out;
  if (!check_param(r, l, "weight", w_after, COLS * COLS))
    check_param(r, l, "bias", b_after, COLS);
out:
  dist_tensor_free(y);
  return r->rc;
}

static int shard_layer(run *r) {
  static const float ones[NELEM] = {1, 1, 1, 1, 1, 1, 1, 1};
  dist_tensor *x = NULL, *dy = NULL;
  dist_layer *l = NULL;
  char name[200];
  snprintf(name, sizeof name, "%s.linear", r->prefix);
  if (put(r, "lx", data_x, DIST_REPLICATED, &x) ||
      put(r, "ldy", ones, DIST_REPLICATED, &dy))
    goto out;
  if (failed(r, dist_layer_linear(COLS, COLS, 1, 3, &l), "layer_linear") ||
      failed(r, dist_layer_set_name(l, name), "layer_set_name"))
    goto out;
  layer_train(r, l, x, dy);
out:
  if (l) cleaned_up(r, dist_layer_destroy(r->c, l), "layer_destroy");
  dist_tensor_free(x), dist_tensor_free(dy);
  return r->rc;
}

/* ---------------------------------------------------------------- tape */

/* Seed 003 on a tape: y = scatter(x), loss = sum(y * y) over both ranks
 * (770), and x's gradient, 2 * x's rows as they went out. */
static int tape(run *r, dist_program *p) {
  const void *xs[2] = {seed_x, seed_x};
  const int64_t *lcs[2] = {seed_counts[0], seed_counts[1]};
  float want_loss = 770, want_grad[10];
  for (int i = 0; i < 10; i++) want_grad[i] = 2 * (float)(i + 1);
  dist_tape_exchange a = {name_of(r, "tape_x"), xs, NULL, DIST_FLOAT32, 2, lcs, lcs, 2,
                          NULL, 0, name_of(r, "tape_y"), 0};
  dist_tape *t = NULL;
  dist_tensor *y = NULL, *loss = NULL;
  void *g = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  if (failed(r, dist_tape_new(r->c, &t), "tape_new")) return r->rc;
  if (failed(r, dist_tape_global_scatter(t, &a, &y, NULL), "tape_global_scatter")) goto out;
  dist_arg arg = {y, NULL};
  if (failed(r, dist_tape_local_layer_call(t, p, &arg, 1, NULL, &loss), "tape_local_layer_call"))
    goto out;
  if (check_full(r, loss, &want_loss, 1, "tape's loss")) goto out;
  const dist_tensor *seeds[1] = {loss};
  if (failed(r, dist_tape_backward(t, seeds, NULL, 1), "tape_backward")) goto out;
  for (int rank = 0; rank < 2; rank++) {
    if (failed(r, dist_tape_grad_local(t, a.x_name, rank, &g, &nbytes, shape), "tape_grad_local"))
      break;
    int bad = !same_floats(g, nbytes, want_grad, 10);
    free(g), g = NULL;
    if (bad && wrong(r, "tape's gradient")) break;
  }
out:
  if (loss) cleaned_up(r, dist_tensor_delete_handle(r->c, loss), "delete the tape's loss");
  dist_tape_free(t);
  dist_tensor_free(y), dist_tensor_free(loss);
  return r->rc;
}

/* ---------------------------------------------------------------- checkpoint */

/* Saves PREFIX.ck, deletes it, restores it: the same value. */
static int checkpoint(run *r) {
  const char *name = name_of(r, "ck");
  dist_tensor *t = NULL, *back = NULL;
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  o.tensors = &name, o.ntensors = 1;
  dist_placement shard0 = DIST_SHARD_DIM(0);
  int64_t shape[2] = {ROWS, COLS};
  if (failed(r, dist_shard_tensor(r->c, name, data_x, DIST_FLOAT32, 2, shape, r->mesh, &shard0,
                                  &t),
             "shard_tensor") ||
      failed(r, dist_checkpoint_save(r->c, r->ckpt_dir, &o, NULL), "checkpoint_save") ||
      failed(r, dist_tensor_delete(r->c, name), "delete before restore") ||
      failed(r, dist_checkpoint_restore(r->c, r->ckpt_dir, &o, NULL), "checkpoint_restore") ||
      failed(r, dist_tensor_open(r->c, name, &back), "tensor_open"))
    goto out;
  check_full(r, back, data_x, NELEM, "restored tensor");
out:
  dist_tensor_free(t), dist_tensor_free(back);
  return r->rc;
}

/* ---------------------------------------------------------------- inspection */

static int inspect(run *r) {
  dist_daemon_info info;
  dist_ops_report ops;
  memset(&info, 0, sizeof info), memset(&ops, 0, sizeof ops);
  if (failed(r, dist_info(r->c, 1, &info), "info")) return r->rc;
  if (info.rank != 1 || (int)info.world_size != r->world || (int)info.npeers != r->world - 1)
    wrong(r, "info");
  dist_info_free(&info);
  if (failed(r, dist_ops(r->c, 0, 8, &ops), "ops")) return r->rc;
  if (ops.n_in_flight + ops.n_recent < 1) wrong(r, "ops");
  dist_ops_report_free(&ops);
  return r->rc;
}

/* ---------------------------------------------------------------- main */

static void run_all(run *r) {
  dist_program *p = NULL;
  /* The exchanges, the MoE layer and the tape give each of the world's
   * ranks its rows: written for two. */
  int two = r->world == 2;
  if (tensors(r) || (two && (exchanges(r) || moe(r))) || sum_sq_program(r, &p) ||
      local_layer(r, p) || replacing_call(r, p) || replacing_backward(r, p) ||
      shard_layer(r) || (two && tape(r, p)) || checkpoint(r) || (!two && three_ranks(r)))
    goto out;
  inspect(r);
out:
  if (p) dist_program_unregister(r->c, p); /* fails when it never registered */
  dist_program_free(p);
}

/* Deletes what the run may have made; a name it never made is not found. */
static void delete_all(run *r) {
  for (int i = 0; i < r->nnames; i++) {
    int rc = dist_tensor_delete(r->c, r->names[i]);
    if (rc != DIST_ENOTFOUND) cleaned_up(r, rc, r->names[i]);
  }
}

/* After a clean-up that ran out of memory: every tensor named PREFIX.*
 * the daemons hold, deleted (a layer's step and parameters have names
 * the run does not keep). */
static void delete_leftovers(run *r) {
  dist_tensor **list = NULL;
  int n = 0;
  size_t len = strlen(r->prefix);
  if (dist_tensor_list(r->c, &list, &n) != 0) return; /* the sweep then names them */
  for (int i = 0; i < n; i++) {
    const char *name = dist_tensor_name(list[i]);
    if (strncmp(name, r->prefix, len) == 0 && name[len] == '.') dist_tensor_delete(r->c, name);
  }
  dist_tensor_list_free(list, n);
}

int main(int argc, char **argv) {
  int held = argc == 5 && strcmp(argv[4], "held") == 0;
  int three = argc == 5 && strcmp(argv[4], "three") == 0;
  if (argc != 4 && !held && !three) {
    fprintf(stderr, "usage: alloc_client CLUSTER_FILE PREFIX CHECKPOINT_DIR [held|three]\n");
    return 2;
  }
  run r;
  memset(&r, 0, sizeof r);
  r.prefix = argv[2], r.ckpt_dir = argv[3];
  r.world = three ? 3 : 2;
  int rc = dist_connect_cluster(argv[1], NULL, &r.c);
  if (rc) {
    const char *why = dist_last_connect_error();
    fprintf(stderr, "alloc_client: connect: %s (%s)\n", why, dist_err_name(rc));
    return !why[0] ? 1 : rc == DIST_ENOMEM ? 3 : 4;
  }
  rc = dist_mesh_from_string("[0,1]", "x", &r.mesh);
  if (!failed_saying(&r, rc, "mesh", rc ? dist_last_mesh_error() : "")) {
    if (held) held_elsewhere(&r);
    else run_all(&r);
  }
  puts_kept(&r);
  delete_all(&r);
  if (r.cleanup_failed) delete_leftovers(&r);
  dist_mesh_free(r.mesh);
  dist_close(r.c);
  if (r.wrong_value) return 1;
  return r.rc == 0 ? 0 : r.rc == DIST_ENOMEM ? 3 : 4;
}
