/* The table of distctl's verbs: finding the one a command line names, and
 * the help, printed from each verb's own synopsis and description (the
 * full usage and `distctl VERB --help` alike). */
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

static const distctl_command *const commands[] = {
    &distctl_cmd_status,        &distctl_cmd_peers,
    &distctl_cmd_top,           &distctl_cmd_ops,
    &distctl_cmd_experts,       &distctl_cmd_params,        &distctl_cmd_param_tune,
    &distctl_cmd_metrics,
    &distctl_cmd_tensors,       &distctl_cmd_tensor_put,
    &distctl_cmd_tensor_get,    &distctl_cmd_tensor_show,
    &distctl_cmd_tensor_reshard, &distctl_cmd_tensor_rm,
    &distctl_cmd_cluster_up,    &distctl_cmd_cluster_down,
    &distctl_cmd_launch,
    &distctl_cmd_checkpoint_save, &distctl_cmd_checkpoint_restore,
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

void distctl_print_usage(FILE *out) {
  fprintf(out, "usage: distctl [--cluster FILE | --endpoint HOST:PORT] [--json] "
               "[--timeout MS]\n               [--tls-ca FILE [--tls-cert FILE --tls-key FILE] "
               "[--tls-crl FILE]]\n               "
               "[--token-file FILE | --token TOKEN] COMMAND [ARGS]\n"
               "       distctl help [COMMAND]   (or distctl COMMAND --help)\n"
               "       distctl --version\n\n"
               "The global options go before or after the command. --json works with every "
               "command:\nits result as JSON on stdout. Without --cluster or --endpoint, "
               "$DIST_CLUSTER names\nthe cluster file, else %s is used.\n\ncommands:\n",
          DIST_DEFAULT_ENDPOINT);
  for (int i = 0; i < NCOMMANDS; i++) distctl_print_synopsis(out, "  ", commands[i], 1);
}

const distctl_command *distctl_find(int argc, char **argv, int *words) {
  for (int i = 0; i < NCOMMANDS; i++) {
    const char *name = commands[i]->name, *space = strchr(name, ' ');
    size_t len = space ? (size_t)(space - name) : strlen(name);
    if (strncmp(argv[0], name, len) != 0 || argv[0][len]) continue;
    if (!space) return *words = 1, commands[i];
    if (argc > 1 && strcmp(argv[1], space + 1) == 0) return *words = 2, commands[i];
  }
  return NULL;
}

/* The second word of name when its first is verb ("put" of "tensor put"
 * for "tensor"), else NULL. */
static const char *subcommand_of(const char *name, const char *verb) {
  size_t vlen = strlen(verb);
  return strncmp(name, verb, vlen) == 0 && name[vlen] == ' ' ? name + vlen + 1 : NULL;
}

/* The second words of the commands whose first word is verb, as
 * "put, get, ...". Returns how many there are (0: verb takes none). */
static int subcommands_of(const char *verb, char *buf, size_t len) {
  size_t used = 0;
  int n = 0;
  buf[0] = 0;
  for (int i = 0; i < NCOMMANDS; i++) {
    const char *sub = subcommand_of(commands[i]->name, verb);
    if (!sub) continue;
    if (used < len) used += (size_t)snprintf(buf + used, len - used, "%s%s", n ? ", " : "", sub);
    n++;
  }
  return n;
}

int distctl_unknown_command(int argc, char **argv) {
  char subs[256];
  if (subcommands_of(argv[0], subs, sizeof subs) == 0)
    fprintf(stderr, "distctl: unknown command '%s' (see distctl --help)\n", argv[0]);
  else if (argc < 2)
    fprintf(stderr, "distctl %s: missing subcommand (one of: %s)\n", argv[0], subs);
  else
    fprintf(stderr, "distctl %s: unknown subcommand '%s' (one of: %s)\n", argv[0],
            argv[1], subs);
  return 2;
}

/* The help of every subcommand of verb ("tensor"); 0 when it has none. */
static int print_group_help(const char *verb) {
  int n = 0;
  for (int i = 0; i < NCOMMANDS; i++) {
    if (!subcommand_of(commands[i]->name, verb)) continue;
    distctl_print_synopsis(stdout, n++ ? "       distctl " : "usage: distctl ", commands[i], 1);
  }
  return n;
}

int distctl_help(int argc, char **argv) {
  if (argc == 0) {
    distctl_print_usage(stdout);
    return 0;
  }
  int words = 0;
  const distctl_command *cmd = distctl_find(argc, argv, &words);
  if (cmd) {
    distctl_print_synopsis(stdout, "usage: distctl ", cmd, 1);
    distctl_print_options(cmd);
  } else if (argc > 1 || print_group_help(argv[0]) == 0)
    return distctl_unknown_command(argc, argv);
  printf("\nThe global options (--cluster, --endpoint, --json, --timeout, TLS and token) "
         "go before or after\nthe command: see distctl --help.\n");
  return 0;
}
