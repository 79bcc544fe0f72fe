/* distctl cluster up / down. */
#include <stdlib.h>
#include <string.h>

#include "distctl.h"
#include "local_cluster.h"

/* With --json, the cluster a script may now use. */
static void print_cluster_json(const char *dir, long n) {
  char conf[4200];
  snprintf(conf, sizeof conf, "%s/cluster.conf", dir);
  distctl_print_json(json_pack("{s:s, s:s, s:i}", "dir", dir, "cluster_file", conf,
                               "world_size", (int)n));
}

static int run_up(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_cluster_up;
  const char *dir = NULL, *count = NULL;
  long n = 0;
  int extra = argc, pin = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      extra = i + 1;
      break;
    }
    int taken = distctl_opt_once(cmd, argc, argv, &i, "-n", &count);
    if (!taken) taken = distctl_opt_once(cmd, argc, argv, &i, "--dir", &dir);
    if (taken == 2) return 2;
    if (taken) continue;
    if (strcmp(argv[i], "--pin") == 0) pin = 1;
    else return distctl_usage(cmd, "unknown argument '%s'", argv[i]);
  }
  if (!count) return distctl_usage(cmd, "-n N (N >= 1) is required");
  if (distctl_number_opt(cmd, "-n", count, 1, DISTCTL_MAX_DAEMONS, &n)) return 2;
  if (!dir) return distctl_usage(cmd, "--dir DIR is required");
  int rc = distctl_cluster_up(dir, (int)n, 30000, 0, pin, argv + extra, argc - extra);
  if (rc == 0 && g->json) print_cluster_json(dir, n);
  return rc;
}

static int run_down(const distctl_global *g, int argc, char **argv) {
  const char *dir = NULL;
  for (int i = 0; i < argc; i++) {
    int taken = distctl_opt_once(&distctl_cmd_cluster_down, argc, argv, &i, "--dir", &dir);
    if (taken == 2) return 2;
    if (!taken)
      return distctl_usage(&distctl_cmd_cluster_down, "unknown argument '%s'", argv[i]);
  }
  if (!dir) return distctl_usage(&distctl_cmd_cluster_down, "--dir DIR is required");
  int rc = distctl_cluster_down(dir, 0);
  if (rc == 0 && g->json) distctl_print_json(json_pack("{s:s, s:b}", "dir", dir, "down", 1));
  return rc;
}

const distctl_command distctl_cmd_cluster_up = {
    "cluster up", "-n N --dir DIR [--pin] [-- DISTD-ARGS...]",
    "start N daemons on free loopback ports; DIR gets cluster.conf, logs, pids; "
    "--pin keeps daemon r on the r-th CPU (round robin)",
    run_up, NULL};
const distctl_command distctl_cmd_cluster_down = {
    "cluster down", "--dir DIR", "stop the daemons started by cluster up in DIR",
    run_down, NULL};
