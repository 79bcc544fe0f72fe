/* distctl cluster up / down. */
#include <stdlib.h>
#include <string.h>

#include "distctl.h"
#include "local_cluster.h"

static int run_up(const distctl_global *g, int argc, char **argv) {
  (void)g;
  const char *dir = NULL, *v;
  long n = 0;
  int extra = argc, pin = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      extra = i + 1;
      break;
    }
    if (strcmp(argv[i], "--pin") == 0) pin = 1;
    else if ((v = distctl_opt(argc, argv, &i, "-n"))) {
      if (distctl_number_opt(&distctl_cmd_cluster_up, "-n", v, 1, DISTCTL_MAX_DAEMONS, &n))
        return 2;
    } else if ((v = distctl_opt(argc, argv, &i, "--dir"))) dir = v;
    else return distctl_usage(&distctl_cmd_cluster_up, "unknown argument '%s'", argv[i]);
  }
  if (n <= 0) return distctl_usage(&distctl_cmd_cluster_up, "-n N (N >= 1) is required");
  if (!dir) return distctl_usage(&distctl_cmd_cluster_up, "--dir DIR is required");
  return distctl_cluster_up(dir, (int)n, 30000, 0, pin, argv + extra, argc - extra);
}

static int run_down(const distctl_global *g, int argc, char **argv) {
  (void)g;
  const char *dir = NULL, *v;
  for (int i = 0; i < argc; i++) {
    if ((v = distctl_opt(argc, argv, &i, "--dir"))) dir = v;
    else return distctl_usage(&distctl_cmd_cluster_down, "unknown argument '%s'", argv[i]);
  }
  if (!dir) return distctl_usage(&distctl_cmd_cluster_down, "--dir DIR is required");
  return distctl_cluster_down(dir, 0);
}

const distctl_command distctl_cmd_cluster_up = {
    "cluster up", "-n N --dir DIR [--pin] [-- DISTD-ARGS...]",
    "start N daemons on free loopback ports; DIR gets cluster.conf, logs, pids; "
    "--pin keeps daemon r on the r-th CPU (round robin)",
    run_up};
const distctl_command distctl_cmd_cluster_down = {
    "cluster down", "--dir DIR", "stop the daemons started by cluster up in DIR",
    run_down};
