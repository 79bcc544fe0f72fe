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

enum { OPT_COUNT, OPT_DIR, OPT_PIN, NUP_OPTIONS };
static const distctl_option up_options[NUP_OPTIONS + 1] = {
    [OPT_COUNT] = {"-n", "N", "how many daemons to start, 1 to " DISTCTL_NUMBER_TEXT(DISTCTL_MAX_DAEMONS), NULL,
                   DISTCTL_REQUIRED},
    [OPT_DIR] = {"--dir", "DIR", "where cluster.conf, the daemons' logs and pid files go",
                 NULL, DISTCTL_REQUIRED},
    [OPT_PIN] = {"--pin", NULL, "keep daemon r on the r-th CPU (round robin)", NULL,
                 DISTCTL_OPTIONAL},
};
/* down takes up's --dir alone. */
static const distctl_option down_options[2] = {
    {"--dir", "DIR", "the directory of the cluster up to stop", NULL, DISTCTL_REQUIRED},
};

static int run_up(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_cluster_up;
  distctl_args a;
  long n = 0;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  if (distctl_number_opt(cmd, "-n", a.value[OPT_COUNT], 1, DISTCTL_MAX_DAEMONS, &n)) return 2;
  const char *dir = a.value[OPT_DIR];
  int rc = distctl_cluster_up(dir, (int)n, 30000, 0, a.value[OPT_PIN] != NULL, a.rest, a.nrest);
  if (rc == 0 && g->json) print_cluster_json(dir, n);
  return rc;
}

static int run_down(const distctl_global *g, int argc, char **argv) {
  distctl_args a;
  if (distctl_take_options(&distctl_cmd_cluster_down, argc, argv, &a) != 0) return 2;
  const char *dir = a.value[0];
  int rc = distctl_cluster_down(dir, 0);
  if (rc == 0 && g->json) distctl_print_json(json_pack("{s:s, s:b}", "dir", dir, "down", 1));
  return rc;
}

const distctl_command distctl_cmd_cluster_up = {
    .name = "cluster up",
    .help = "start N daemons on free loopback ports; DIR gets cluster.conf, logs, pids; "
    "DISTD-ARGS go to every daemon",
    .run = run_up,
    .options = up_options,
    .after_dashes = {"DISTD-ARGS...", DISTCTL_OPTIONAL}};
const distctl_command distctl_cmd_cluster_down = {
    .name = "cluster down",
    .help = "stop the daemons started by cluster up in DIR",
    .run = run_down,
    .options = down_options};
