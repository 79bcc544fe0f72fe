/* libdist's public calls given bad arguments: NULL pointers, negative or
 * out-of-range counts and ranks, over-long names. Each must fail with
 * DIST_EINVAL and a message naming the call and the argument, and change
 * nothing; before, several of them crashed the trainer (a NULL gradient
 * given to dist_param_push was copied from). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static harness cluster;

static void stop_cluster(void) {
  if (cluster.n > 0) harness_stop(&cluster);
  cluster.n = 0;
}

TestSuite(api_args, .fini = stop_cluster, .timeout = 120);

/* Two daemons holding "w", float64 [4] Shard(0), an SGD parameter of one
 * trainer. */
static dist_client *start_with_param(void) {
  char id[64];
  snprintf(id, sizeof id, "api-args-%d-%ld", (int)getpid(), (long)time(NULL));
  const char *args[] = {"--cluster-id", id, NULL};
  harness_start(&cluster, 2, args);
  dist_client *c = harness_client(&cluster);
  double w[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  dist_tensor_free(harness_put(c, "w", DIST_FLOAT64, w, 1, shape, "[0,1]", "Shard(0)"));
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1;
  cr_assert_eq(dist_param_configure(c, "w", &o), 0, "%s", dist_errmsg(c));
  return c;
}

/* rc is DIST_EINVAL and c's message contains want. */
static void expect_einval(dist_client *c, int rc, const char *want) {
  cr_assert_eq(rc, DIST_EINVAL, "rc %d (%s), wanted EINVAL with '%s'", rc, dist_errmsg(c),
               want);
  cr_assert(strstr(dist_errmsg(c), want), "'%s' does not say '%s'", dist_errmsg(c), want);
}

/* A name one byte over the limit. */
static const char *long_name(void) {
  static char name[257];
  memset(name, 'n', 256);
  name[256] = 0;
  return name;
}

Test(api_args, param_pushes_refuse_null_buffers_names_and_negative_trainers) {
  dist_client *c = start_with_param();
  double g[4] = {1, 1, 1, 1};
  uint64_t v0 = 0, v = 0;
  expect_einval(c, dist_param_push(c, "w", 0, NULL, sizeof g, &v),
                "dist_param_push: grad is NULL");
  expect_einval(c, dist_param_push(c, NULL, 0, g, sizeof g, &v),
                "dist_param_push: name is NULL");
  expect_einval(c, dist_param_push(c, long_name(), 0, g, sizeof g, &v),
                "dist_param_push: tensor name of 256 bytes (1 to 255 allowed)");
  expect_einval(c, dist_param_push(c, "w", -1, g, sizeof g, &v),
                "dist_param_push: trainer -1 is negative");
  expect_einval(c, dist_param_push_local(c, "w", 0, 1, NULL, 16, &v),
                "dist_param_push_local: piece is NULL");
  expect_einval(c, dist_param_push_local(c, "w", 0, 7, g, 16, &v),
                "dist_param_push_local: no daemon of rank 7 (cluster of 2)");
  expect_einval(c, dist_param_push_tensor(c, "w", 0, NULL, &v),
                "dist_param_push_tensor: grad_name is NULL");
  /* Nothing was counted: the next whole push completes the update. */
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_param_pull(c, "w", 0, &data, &nbytes, &v0), 0, "%s", dist_errmsg(c));
  free(data);
  cr_assert_eq(dist_param_push(c, "w", 0, g, sizeof g, &v), 0, "%s", dist_errmsg(c));
  cr_assert_eq(v, v0 + 1);
  dist_close(c);
}

Test(api_args, param_configure_tune_and_pull_refuse_null_arguments) {
  dist_client *c = start_with_param();
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  void *data = NULL;
  size_t nbytes = 0;
  expect_einval(c, dist_param_configure(c, NULL, &o), "dist_param_configure: name is NULL");
  expect_einval(c, dist_param_tune(c, NULL, &o), "dist_param_tune: name is NULL");
  expect_einval(c, dist_param_tune(c, "w", NULL), "dist_param_tune: opts");
  expect_einval(c, dist_param_pull(c, "w", 0, NULL, &nbytes, NULL),
                "dist_param_pull: data is NULL");
  expect_einval(c, dist_param_pull(c, "w", 0, &data, NULL, NULL),
                "dist_param_pull: nbytes is NULL");
  expect_einval(c, dist_param_pull(c, NULL, 0, &data, &nbytes, NULL),
                "dist_param_pull: name is NULL");
  dist_close(c);
}
