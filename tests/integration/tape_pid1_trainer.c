/* A trainer for test_tape_names' pid-namespace test, run as pid 1 of a pid
 * namespace of its own (`unshare -p -f`): a program of its own, because
 * the test process has gRPC threads and a child forked from it could not
 * use libdist.
 *
 *   tape_pid1_trainer CLUSTER_FILE TAG hold|free
 *
 * On the cluster's ranks 0 and 1, a single client puts TAG.x = x (Shard(0),
 * x[i] = scale * (i + 1), scale 1 for TAG "a", else 10), records
 * loss = sum(x * x) on a tape and backpropagates from it, so that x's
 * gradient is 2 * x. It prints "pid P", "grad NAME" (the tape's name of
 * x's gradient) and "values V0 V1 V2 V3" (the gradient read through its
 * handle). hold: then "ready", waits (60 s at most) for a line on stdin,
 * reads the gradient again and prints "values ..." once more. Then it frees
 * the tape (which deletes its gradients) and exits 0; on an error it prints
 * "error WHAT: MESSAGE" and exits 1. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"

#define ELEMS 4
#define HOLD_MS 60000

typedef struct trainer {
  dist_client *c;
  dist_mesh *m;
  dist_program *p;
  dist_tensor *x, *loss, *grad;
  dist_tape *t;
} trainer;

static int failed(const trainer *tr, const char *what) {
  printf("error %s: %s\n", what, dist_errmsg(tr->c));
  return 1;
}

/* loss = sum(x * x) on [0, 1], Partial(sum). */
static int register_sum_sq(trainer *tr, const char *tag) {
  char name[64];
  snprintf(name, sizeof name, "sum_sq_%s", tag);
  dist_placement psum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  if (dist_program_new(name, &tr->p) != 0) return failed(tr, "program");
  int x = dist_input_dtensor(tr->p, "x", DIST_FLOAT32);
  dist_program_output(tr->p, dist_op_sum(tr->p, dist_op_mul(tr->p, x, x), NULL, 0, 0));
  dist_program_out_dist_attr(tr->p, tr->m, &psum, NULL);
  return dist_program_register(tr->c, tr->p) != 0 ? failed(tr, "register") : 0;
}

static int put_x(trainer *tr, const char *tag) {
  float x[ELEMS];
  float scale = strcmp(tag, "a") == 0 ? 1.0f : 10.0f;
  for (int i = 0; i < ELEMS; i++) x[i] = scale * (float)(i + 1);
  char name[64];
  snprintf(name, sizeof name, "%s.x", tag);
  int64_t shape[1] = {ELEMS};
  dist_placement s0 = DIST_SHARD_DIM(0);
  return dist_shard_tensor(tr->c, name, x, DIST_FLOAT32, 1, shape, tr->m, &s0, &tr->x) != 0
             ? failed(tr, "put")
             : 0;
}

static int backward(trainer *tr, const char *tag) {
  char loss[64];
  snprintf(loss, sizeof loss, "%s.loss", tag);
  const char *out_names[1] = {loss};
  dist_call_opts o = DIST_CALL_OPTS_INIT;
  o.out_names = out_names;
  dist_arg arg = {tr->x, NULL};
  if (dist_tape_new(tr->c, &tr->t) != 0) return failed(tr, "tape");
  if (dist_tape_local_layer_call(tr->t, tr->p, &arg, 1, &o, &tr->loss) != 0)
    return failed(tr, "call");
  const dist_tensor *seeds[1] = {tr->loss};
  if (dist_tape_backward(tr->t, seeds, NULL, 1) != 0) return failed(tr, "backward");
  if (dist_tape_grad(tr->t, dist_tensor_name(tr->x), &tr->grad) != 0)
    return failed(tr, "grad");
  printf("grad %s\n", dist_tensor_name(tr->grad));
  return 0;
}

static int print_values(trainer *tr) {
  void *data = NULL;
  size_t nbytes = 0;
  if (dist_full_tensor(tr->c, tr->grad, &data, &nbytes) != 0) return failed(tr, "read");
  printf("values");
  for (size_t i = 0; i < nbytes / sizeof(float); i++) printf(" %g", (double)((float *)data)[i]);
  printf("\n");
  free(data);
  return 0;
}

/* Until a line (or end of file) on stdin, HOLD_MS at most. */
static int wait_for_go(void) {
  printf("ready\n");
  fflush(stdout);
  struct pollfd in = {STDIN_FILENO, POLLIN, 0};
  char line[16];
  if (poll(&in, 1, HOLD_MS) != 1 || read(STDIN_FILENO, line, sizeof line) < 0) {
    printf("error hold: no word from the test within %d ms\n", HOLD_MS);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[3], "hold") != 0 && strcmp(argv[3], "free") != 0)) {
    fprintf(stderr, "usage: %s CLUSTER_FILE TAG hold|free\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("pid %d\n", (int)getpid());
  trainer tr = {0};
  int shape[1] = {2}, ranks[2] = {0, 1};
  int rc = dist_connect_cluster(argv[1], NULL, &tr.c);
  if (rc != 0) printf("error connect: %s\n", dist_last_connect_error());
  if (rc == 0 && dist_mesh_new(1, shape, ranks, NULL, &tr.m) != 0) rc = failed(&tr, "mesh");
  if (rc == 0) rc = register_sum_sq(&tr, argv[2]);
  if (rc == 0) rc = put_x(&tr, argv[2]);
  if (rc == 0) rc = backward(&tr, argv[2]);
  if (rc == 0) rc = print_values(&tr);
  if (rc == 0 && strcmp(argv[3], "hold") == 0) {
    rc = wait_for_go();
    if (rc == 0) rc = print_values(&tr);
  }
  dist_tensor_free(tr.grad);
  dist_tape_free(tr.t);
  dist_tensor_free(tr.loss);
  dist_tensor_free(tr.x);
  dist_program_free(tr.p);
  dist_mesh_free(tr.m);
  dist_close(tr.c);
  return rc ? 1 : 0;
}
