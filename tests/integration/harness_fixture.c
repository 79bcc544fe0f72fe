/* How a test file sets up and tears down its cluster: a cluster id of its
 * own, kept for restarts, and a stop that .fini can call whether or not
 * the test got as far as starting one, and the file's cluster itself
 * (harness_fixture.h). Every file but two uses them: test_daemon and
 * test_security start clusters of their own per test (start-up itself is
 * what they test, and per-rank cluster files). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

/* More extra arguments than any test gives a daemon. */
#define EXTRA_ARGS_MAX 16

/* "--cluster-id", id and then extra_args (NULL-terminated, may be NULL)
 * into out, which holds EXTRA_ARGS_MAX + 3 entries. */
static void args_with_cluster_id(const char *id, const char *const *extra_args,
                                 const char **out) {
  int n = 0;
  out[n++] = "--cluster-id";
  out[n++] = id;
  for (int i = 0; extra_args && extra_args[i]; i++) {
    cr_assert_lt(i, EXTRA_ARGS_MAX, "more than %d extra daemon arguments", EXTRA_ARGS_MAX);
    out[n++] = extra_args[i];
  }
  out[n] = NULL;
}

void harness_start_unique(harness *h, int n, const char *prefix, const char *const *extra_args) {
  /* Daemons left over from other runs on recycled ports can never join a
   * cluster whose id names this process and this moment. */
  char id[sizeof h->cluster_id];
  int len = snprintf(id, sizeof id, "%s-%d-%ld", prefix, (int)getpid(),
                     (long)(harness_now_s() * 1000));
  cr_assert(len > 0 && (size_t)len < sizeof id, "cluster id prefix \"%s\" is too long", prefix);
  const char *args[EXTRA_ARGS_MAX + 3];
  args_with_cluster_id(id, extra_args, args);
  harness_start(h, n, args);
  snprintf(h->cluster_id, sizeof h->cluster_id, "%s", id); /* harness_start cleared it */
}

dist_client *harness_start_with_client(harness *h, int n, const char *const *extra_args) {
  harness_start(h, n, extra_args);
  return harness_client(h);
}

dist_client *harness_start_unique_with_client(harness *h, int n, const char *prefix,
                                              const char *const *extra_args) {
  harness_start_unique(h, n, prefix, extra_args);
  return harness_client(h);
}

void harness_start_rank_again(harness *h, int r, const char *const *extra_args) {
  /* a cluster of plain harness_start has no id to rejoin with */
  cr_assert(h->cluster_id[0], "rank %d restarted in a cluster not started by "
                              "harness_start_unique", r);
  const char *args[EXTRA_ARGS_MAX + 3];
  args_with_cluster_id(h->cluster_id, extra_args, args);
  harness_start_rank(h, r, args);
}

void harness_stop_if_started(harness *h) {
  if (h->n > 0) harness_stop(h);
  h->n = 0;
}

harness cluster;

void stop_cluster(void) { harness_stop_if_started(&cluster); }
