/* distctl: inspect and drive a distd cluster. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

/* The longest --timeout taken: a day, in ms. */
#define MAX_TIMEOUT_MS 86400000L

/* Global options may come before or after the command words, each once
 * (distctl_opt_once, distctl_flag_once); --timeout's text goes to
 * *timeout, parsed later, and --json's to *json. Returns 1 when argv[*i]
 * was one, 0 when not, 2 after a usage error. */
static int take_global(distctl_global *g, const char **timeout, const char **json, int argc,
                       char **argv, int *i) {
  int flag = distctl_flag_once(NULL, argv[*i], "--json", json);
  if (flag) return flag;
  const struct {
    const char *name, **slot;
  } options[] = {
      {"--cluster", &g->cluster}, {"--endpoint", &g->endpoint}, {"--timeout", timeout},
      {"--tls-ca", &g->tls_ca},   {"--tls-cert", &g->tls_cert}, {"--tls-key", &g->tls_key},
      {"--tls-crl", &g->tls_crl}, {"--token", &g->token},     {"--token-file", &g->token_file},
  };
  for (size_t k = 0; k < sizeof options / sizeof options[0]; k++) {
    int taken = distctl_opt_once(NULL, argc, argv, i, options[k].name, options[k].slot);
    if (taken) return taken;
  }
  return 0;
}

/* --timeout as milliseconds; 0 when not given. 0, or 2 after a bad value. */
static int parse_timeout(distctl_global *g, const char *text) {
  if (!text || distctl_parse_long(text, 1, MAX_TIMEOUT_MS, &g->timeout_ms) == 0) return 0;
  return distctl_usage(NULL, "bad --timeout '%s': milliseconds, an integer from 1 to %ld",
                       text, MAX_TIMEOUT_MS);
}

/* The first word of the token file: the token stays off the command line,
 * where `ps` would show it. */
static int read_token_file(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "distctl: --token-file %s: %s\n", path, strerror(errno));
    return -1;
  }
  int ok = fscanf(f, " %1023s", buf) == 1 && len >= 1024;
  fclose(f);
  if (!ok) fprintf(stderr, "distctl: --token-file %s: no token in it\n", path);
  return ok ? 0 : -1;
}

/* Trainers started by `distctl launch` connect with the same settings. */
static void export_security(const distctl_global *g) {
  if (g->tls_ca) setenv("DIST_TLS_CA", g->tls_ca, 1);
  if (g->tls_cert) setenv("DIST_TLS_CERT", g->tls_cert, 1);
  if (g->tls_key) setenv("DIST_TLS_KEY", g->tls_key, 1);
  if (g->tls_crl) setenv("DIST_TLS_CRL", g->tls_crl, 1);
  if (g->token) setenv("DIST_TOKEN", g->token, 1);
}

/* Every verb prints through stdio, which keeps a failed write to itself
 * (printf's result goes unread): stdout a full disk (or a pipe whose
 * reader left, with SIGPIPE ignored) would lose the output and exit 0.
 * Checked here, where every verb ends, once it is flushed (and by `top`
 * after each refresh, which may never end). */
static int output_written(int rc) {
  if (distctl_output_flushed() == 0) return rc;
  return rc ? rc : 1;
}

int main(int argc, char **argv) {
  distctl_global g = {.cluster = NULL};
  static char token[1024];
  const char *timeout = NULL, *json = NULL;
  char **rest = distctl_calloc((size_t)argc + 1, sizeof *rest, "%d arguments", argc);
  int nrest = 0, rc = 2, help = 0;
  if (!rest) return 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) { /* the rest belongs to the command */
      while (i < argc) rest[nrest++] = argv[i++];
      break;
    }
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      help = 1; /* of the command named, once every word is read */
      continue;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf("distctl %s\n", DIST_VERSION);
      rc = 0;
      goto out;
    }
    int taken = take_global(&g, &timeout, &json, argc, argv, &i);
    if (taken == 2) goto out;
    if (!taken) rest[nrest++] = argv[i];
  }
  g.json = json != NULL;
  int help_verb = nrest > 0 && strcmp(rest[0], "help") == 0;
  if (help || help_verb) { /* `distctl help VERB` is `distctl VERB --help` */
    rc = distctl_help(nrest - help_verb, rest + help_verb);
    goto out;
  }
  if (parse_timeout(&g, timeout) != 0) goto out;
  /* Both given, --endpoint won silently: the verb asked one daemon where
   * the user meant the cluster (or the other way round). */
  if (g.cluster && g.endpoint) {
    distctl_usage(NULL, "--cluster %s and --endpoint %s: give one (every daemon of a "
                  "cluster file, or one daemon)", g.cluster, g.endpoint);
    goto out;
  }
  if (!g.cluster) g.cluster = getenv("DIST_CLUSTER"); /* --cluster wins */
  if (g.token_file) {
    if (read_token_file(g.token_file, token, sizeof token) != 0) goto out;
    g.token = token;
  }
  export_security(&g);
  if (nrest == 0) {
    distctl_print_usage(stderr);
    goto out;
  }
  int words = 0;
  const distctl_command *cmd = distctl_find(nrest, rest, &words);
  if (!cmd) {
    rc = distctl_unknown_command(nrest, rest);
    goto out;
  }
  rc = cmd->run(&g, nrest - words, rest + words);
out:
  free(rest);
  return output_written(rc);
}
