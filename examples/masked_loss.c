/* Seed 000: Paddle's LocalLayer example (a masked loss), on distd, one
 * trainer per rank.
 *
 *   distctl launch -n 2 -- build/examples/masked_loss
 *
 * prints, from rank 0:
 *   [Rank 0] local_loss=1.5
 *   [Rank 1] local_loss=6.0
 *   global_loss (distributed)=7.5
 *
 * Rank r's input is arange(0, 10) + r, a dtensor_from_local Shard(0) on mesh
 * [0, 1]. The LocalLayer's forward, run by each daemon on its local piece,
 * is the seed's:
 *   mask = zeros_like(x); if rank == 0: mask[1:3] = 1 else: mask[4:7] = 1
 *   return sum(x * mask) / sum(mask)
 * with out_dist_attrs [(mesh, [Partial(sum)])], so the global loss is the
 * sum of the local ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist/dist.h"

static int fail(dist_client *c, const char *what) {
  fprintf(stderr, "masked_loss: %s: %s\n", what, c ? dist_errmsg(c) : "");
  return 1;
}

/* Python prints 6.0 where %g prints 6. */
static void print_float(const char *label, double v) {
  if (v == floor(v) && fabs(v) < 1e15) printf("%s%.1f\n", label, v);
  else printf("%s%g\n", label, v);
}

/* The seed's CustomLayer.forward as a program. */
static int build_layer(dist_program *p, const dist_mesh *mesh) {
  int64_t axis0[1] = {0}, s0[1] = {1}, e0[1] = {3}, s1[1] = {4}, e1[1] = {7};
  int x = dist_input_dtensor(p, "x", DIST_FLOAT32);
  int rank = dist_input_rank(p);
  int zeros = dist_op_zeros_like(p, x);
  int mask0 = dist_op_set_slice(p, zeros, -1, 1.0, axis0, s0, e0, NULL, 1);
  int mask1 = dist_op_set_slice(p, zeros, -1, 1.0, axis0, s1, e1, NULL, 1);
  int mask = dist_op_where(p, dist_op_eq_scalar(p, rank, 0), mask0, mask1);
  int masked = dist_op_mul(p, x, mask);
  int loss = dist_op_div(p, dist_op_sum(p, masked, NULL, 0, 0),
                         dist_op_sum(p, mask, NULL, 0, 0));
  dist_placement partial_sum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  dist_program_output(p, loss);
  return dist_program_out_dist_attr(p, mesh, &partial_sum, NULL);
}

static int run(dist_client *c) {
  int rc = 1, rank = dist_rank(c);
  dist_mesh *mesh = NULL;
  dist_program *layer = NULL;
  dist_tensor *input = NULL, *output = NULL;
  dist_invocation *inv = NULL;
  void *global = NULL;
  size_t nbytes = 0;
  float local_input[10], gathered[2];
  for (int i = 0; i < 10; i++) local_input[i] = (float)(i + rank);

  if (dist_mesh_from_string("[0,1]", "x", &mesh) != 0) return fail(c, "mesh");
  const void *pieces[1] = {local_input};
  const int64_t shape[1] = {10}, *shapes[1] = {shape};
  dist_placement shard0 = DIST_SHARD_DIM(0);
  if (dist_dtensor_from_local(c, "masked_loss.input", pieces, DIST_FLOAT32, 1,
                              shapes, mesh, &shard0, &input) != 0) {
    fail(c, "dtensor_from_local");
    goto out;
  }
  dist_program_new("masked_loss", &layer);
  if (build_layer(layer, mesh) != 0 || dist_program_register(c, layer) != 0) {
    fail(c, "LocalLayer");
    goto out;
  }
  dist_arg args[2] = {{input, NULL}, {NULL, NULL}};
  dist_call_opts opts = DIST_CALL_OPTS_INIT;
  opts.keep_local_values = 1; /* self.local_result */
  opts.no_grad = 1;
  if (dist_local_layer_call(c, layer, args, 2, &opts, &inv, &output) != 0) {
    fail(c, "LocalLayer call");
    goto out;
  }
  dist_value local;
  if (dist_invocation_local_output(inv, 0, -1, &local) != 0) {
    fail(c, "local result");
    goto out;
  }
  if (dist_all_gather(c, local.data, 1, gathered, DIST_FLOAT32, NULL, 0) != 0 ||
      dist_full_tensor(c, output, &global, &nbytes) != 0) {
    fail(c, "all_gather / full_tensor");
    goto out;
  }
  if (rank == 0) {
    print_float("[Rank 0] local_loss=", gathered[0]);
    print_float("[Rank 1] local_loss=", gathered[1]);
    print_float("global_loss (distributed)=", *(float *)global);
    fflush(stdout);
  }
  rc = 0;
out:
  free(global);
  dist_invocation_free(inv);
  if (output) dist_tensor_delete(c, dist_tensor_name(output));
  dist_tensor_free(output);
  if (input) dist_tensor_delete(c, "masked_loss.input");
  dist_tensor_free(input);
  if (layer) dist_program_unregister(c, layer);
  dist_program_free(layer);
  dist_mesh_free(mesh);
  return rc;
}

int main(void) {
  dist_client *c = NULL;
  if (dist_init_from_env(&c) != 0) {
    fprintf(stderr, "masked_loss: %s\n", dist_last_connect_error());
    return 1;
  }
  int rc = 1;
  if (dist_world_size(c) != 2 || dist_rank(c) < 0)
    fprintf(stderr, "masked_loss: the seed needs 2 ranks (distctl launch -n 2)\n");
  else
    rc = run(c);
  dist_close(c);
  return rc;
}
