/* distctl's help: `distctl VERB --help` and `distctl help VERB` show that
 * verb's synopsis alone and exit 0, an unknown command is refused (exit 2)
 * with or without --help, and --version prints meson's project version.
 * Before, any --help anywhere printed the full usage and exited 0. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

TestSuite(distctl_help, .timeout = 60);

/* Runs `distctl ARGS`; returns its exit status, stdout and stderr in
 * *out and *err (never NULL). */
static int run(const char *args, char **out, char **err) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s", harness_distctl(), args);
  *out = *err = NULL;
  int rc = harness_run(cmd, out, err, 30);
  if (!*out) *out = strdup("");
  if (!*err) *err = strdup("");
  return rc;
}

/* `distctl ARGS` exits 0 with stdout starting with the verb's synopsis,
 * `want`, and no other verb's synopsis (other_verb's, or the full list). */
static void expect_verb_help(const char *args, const char *want, const char *other_verb) {
  char *out, *err, other[256];
  int rc = run(args, &out, &err);
  cr_assert_eq(rc, 0, "distctl %s exited %d: %s", args, rc, err);
  cr_assert(strncmp(out, want, strlen(want)) == 0, "distctl %s printed '%s', not '%s...'",
            args, out, want);
  snprintf(other, sizeof other, "distctl %s", other_verb);
  cr_assert(!strstr(out, other) && !strstr(out, "commands:"),
            "distctl %s printed more than its verb's usage: %s", args, out);
  free(out);
  free(err);
}

Test(distctl_help, a_verbs_help_shows_that_verb_alone) {
  expect_verb_help("top --help", "usage: distctl top [--iterations N] [--interval SECONDS]\n",
                   "status");
  expect_verb_help("tensor put --help", "usage: distctl tensor put NAME (FILE.npy | --local",
                   "tensor get");
  expect_verb_help("checkpoint save --help", "usage: distctl checkpoint save DIR [--tensors",
                   "checkpoint restore");
  expect_verb_help("status -h", "usage: distctl status\n", "peers");
  expect_verb_help("--help ops", "usage: distctl ops [--recent N]\n", "experts");
  expect_verb_help("help launch", "usage: distctl launch -n N [--log-dir DIR] -- PROGRAM",
                   "cluster up");
  expect_verb_help("help param tune", "usage: distctl param tune NAME [--lr X]", "params");
}

/* `distctl help VERB` is `distctl VERB --help`, and `distctl help` is
 * `distctl --help`, word for word. */
Test(distctl_help, help_verb_prints_what_the_option_prints) {
  const char *const pairs[][2] = {
      {"help", "--help"},
      {"help tensor show", "tensor show --help"},
      {"help metrics", "metrics --help"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    char *a, *b, *ea, *eb;
    cr_assert_eq(run(pairs[i][0], &a, &ea), 0, "distctl %s: %s", pairs[i][0], ea);
    cr_assert_eq(run(pairs[i][1], &b, &eb), 0, "distctl %s: %s", pairs[i][1], eb);
    cr_assert(a[0] && strcmp(a, b) == 0, "distctl %s printed '%s'; distctl %s '%s'",
              pairs[i][0], a, pairs[i][1], b);
    free(a), free(b), free(ea), free(eb);
  }
}

/* An unknown command is refused naming it, whether --help comes with it
 * or not; before, `distctl bogus --help` printed the usage and exited 0. */
Test(distctl_help, an_unknown_command_is_refused_also_with_help) {
  const char *const cases[][2] = {
      {"bogus --help", "unknown command 'bogus'"},
      {"--help bogus", "unknown command 'bogus'"},
      {"help bogus", "unknown command 'bogus'"},
      {"tensor bogus --help", "unknown subcommand 'bogus'"},
      {"help checkpoint nope", "unknown subcommand 'nope'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out, *err;
    int rc = run(cases[i][0], &out, &err);
    cr_assert_eq(rc, 2, "distctl %s exited %d: %s%s", cases[i][0], rc, out, err);
    cr_assert(strstr(err, cases[i][1]), "distctl %s said '%s', not '%s'", cases[i][0], err,
              cases[i][1]);
    cr_assert(!strstr(out, "usage:"), "distctl %s printed a usage on stdout: %s",
              cases[i][0], out);
    free(out);
    free(err);
  }
}

/* A verb with subcommands ("tensor") shows every one of its subcommands. */
Test(distctl_help, a_verb_groups_help_shows_its_subcommands) {
  char *out, *err;
  cr_assert_eq(run("tensor --help", &out, &err), 0, "%s", err);
  const char *subs[] = {"tensor put", "tensor get", "tensor show", "tensor reshard",
                        "tensor rm"};
  for (size_t i = 0; i < 5; i++)
    cr_assert(strstr(out, subs[i]), "no '%s' in: %s", subs[i], out);
  cr_assert(!strstr(out, "checkpoint save") && !strstr(out, "distctl status"), "%s", out);
  free(out);
  free(err);
}

/* DIST_VERSION is meson's project version, as distd reports it. */
Test(distctl_help, version_prints_the_project_version) {
  char *out, *err;
  cr_assert_eq(run("--version", &out, &err), 0, "%s", err);
  cr_assert_str_eq(out, "distctl " DIST_VERSION "\n");
  free(out);
  free(err);
}

/* The lines of text that end in a space, or NULL when none does. */
static const char *line_ending_in_space(const char *text) {
  for (const char *p = strchr(text, '\n'); p; p = strchr(p + 1, '\n'))
    if (p > text && (p[-1] == ' ' || p[-1] == '\t')) return p;
  return NULL;
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)); p++) n++;
  return n;
}

/* --json is a global option, said once among them: the usage listed it
 * again after `tensors` and `tensor show` as if theirs alone. No usage
 * line ends in a space (the synopsis of a verb without arguments did). */
Test(distctl_help, json_is_listed_once_and_no_line_ends_in_a_space) {
  char *out, *err;
  cr_assert_eq(run("--help", &out, &err), 0, "%s", err);
  cr_assert_eq(count(out, "[--json]"), 1, "--json listed other than once: %s", out);
  cr_assert(strstr(out, "--json works with every command"), "%s", out);
  const char *at = line_ending_in_space(out);
  cr_assert(!at, "a usage line ends in a space: ...%.60s", at ? at - 60 : "");
  free(out);
  free(err);
  const char *verbs[] = {"status", "tensors", "tensor show", "experts", "launch", "tensor"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char args[64];
    snprintf(args, sizeof args, "help %s", verbs[i]);
    cr_assert_eq(run(args, &out, &err), 0, "distctl %s: %s", args, err);
    cr_assert(!strstr(out, "[--json]"), "distctl %s lists --json as its own: %s", args, out);
    cr_assert(!line_ending_in_space(out), "distctl %s has a line ending in a space: %s", args,
              out);
    free(out);
    free(err);
  }
  /* A usage error prints the verb's synopsis as its help does. */
  cr_assert_eq(run("status extra", &out, &err), 2, "%s", err);
  cr_assert(strstr(err, "usage: distctl status\n"), "%s", err);
  free(out);
  free(err);
}

/* `distctl ARGS` exits want_rc with want in its stdout (or its stderr,
 * on_stderr). */
static void expect_says(const char *args, int want_rc, int on_stderr, const char *want) {
  char *out, *err;
  int rc = run(args, &out, &err);
  cr_assert_eq(rc, want_rc, "distctl %s exited %d: %s", args, rc, err);
  const char *said = on_stderr ? err : out;
  cr_assert(strstr(said, want), "distctl %s does not say '%s':\n%s", args, want, said);
  free(out);
  free(err);
}

/* status, ops and experts (and the other inspection verbs) describe each
 * option under their synopsis, from the table their parsing reads; their
 * help gave the synopsis alone, so what --recent counts or that status
 * takes no options of its own was not said anywhere. */
Test(distctl_help, an_inspection_verbs_help_describes_each_option) {
  expect_says("help ops", 0, 0, "\noptions:\n  --recent N  how many finished operations of "
              "each rank to show, 0 to 256 (default 20)\n");
  expect_says("top --help", 0, 0, "\noptions:\n  --iterations N      refreshes to show "
              "before exiting");
  expect_says("top --help", 0, 0, "\n  --interval SECONDS  time between refreshes, 0.05 to 3600");
  expect_says("help metrics", 0, 0, "\noptions:\n  --rank R  the rank whose metrics to show "
              "(default 0)\n");
  const char *none[] = {"help status", "experts --help", "help peers", "help params"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
    expect_says(none[i], 0, 0, "\noptions: none of its own\n");
}

/* The options the help describes are the ones the verb takes, each once,
 * and nothing else: one table serves both. */
Test(distctl_help, a_verb_takes_the_options_its_help_describes_and_no_other) {
  expect_says("ops --recent 1 --recent 2", 2, 1, "distctl ops: option --recent given twice");
  expect_says("top --interval", 2, 1, "distctl top: option --interval needs a value");
  expect_says("metrics --recent 1", 2, 1, "distctl metrics: unknown argument '--recent'");
  expect_says("status --recent 1", 2, 1, "distctl status: unknown argument '--recent'");
  expect_says("experts extra", 2, 1, "distctl experts: unexpected argument 'extra'");
}

/* Whether help has a line "  OPTION..." under "options:" that goes on
 * to describe it: the label, two spaces, then words. */
static int describes(const char *help, const char *option) {
  const char *section = strstr(help, "\noptions:\n");
  char line_start[64];
  snprintf(line_start, sizeof line_start, "\n  %s", option);
  for (const char *p = section; p && (p = strstr(p, line_start)); p++) {
    const char *after = p + strlen(line_start), *end = strchr(after, '\n');
    if (*after != ' ' && *after != ',') continue; /* "--local" is not "--local-x" */
    const char *gap = strstr(after, "  ");
    if (gap && end && gap < end && gap[strspn(gap, " ")] != '\n') return 1;
  }
  return 0;
}

/* The verbs that listed their options in their usage line alone, each
 * with every option it took: its help now describes each (it said
 * nothing of what --local, --pin or --dampening do), or says it takes
 * none of its own. */
Test(distctl_help, every_verbs_help_describes_each_option_it_takes) {
  static const struct {
    const char *verb, *options[8];
  } verbs[] = {
      {"tensor put", {"--mesh", "--dim-names", "--placements", "--local", "--dtype"}},
      {"tensor get", {"-o", "-o, --output", "--rank", "--local"}},
      {"tensor reshard", {"--placements", "--mesh", "--dim-names"}},
      {"checkpoint save", {"--tensors"}},
      {"checkpoint restore", {"--tensors", "--mesh", "--dim-names", "--placements"}},
      {"cluster up", {"-n", "--dir", "--pin"}},
      {"cluster down", {"--dir"}},
      {"launch", {"-n", "--log-dir"}},
      {"param tune",
       {"--lr", "--momentum", "--dampening", "--beta1", "--beta2", "--eps", "--weight-decay"}},
      {"tensor show", {NULL}},
      {"tensor rm", {NULL}},
      {"tensors", {NULL}},
  };
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    char args[64], *out, *err;
    snprintf(args, sizeof args, "help %s", verbs[i].verb);
    cr_assert_eq(run(args, &out, &err), 0, "distctl %s: %s", args, err);
    if (!verbs[i].options[0])
      cr_assert(strstr(out, "\noptions: none of its own\n"), "distctl %s: %s", args, out);
    for (int k = 0; verbs[i].options[k]; k++)
      cr_assert(describes(out, verbs[i].options[k]), "distctl %s does not describe %s:\n%s",
                args, verbs[i].options[k], out);
    free(out);
    free(err);
  }
}

/* The verbs `distctl --help` lists, each as its synopsis begins ("tensor
 * put"), into verbs (n at most max); returns how many. */
static int listed_verbs(const char *usage, char verbs[][32], int max) {
  int n = 0;
  const char *p = strstr(usage, "commands:\n");
  for (p = p ? strchr(p, '\n') : NULL; p && n < max; p = strchr(p + 1, '\n')) {
    if (strncmp(p, "\n  ", 3) != 0 || p[3] == ' ') continue; /* a description */
    const char *w = p + 3;
    size_t len = strcspn(w, " \n");
    if (w[len] == ' ' && w[len + 1] >= 'a' && w[len + 1] <= 'z') /* a second word */
      len += 1 + strcspn(w + len + 1, " \n");
    snprintf(verbs[n++], 32, "%.*s", (int)len, w);
  }
  return n;
}

/* Every verb distctl lists has an options section in its help: each
 * verb's options come from its table (the one its parsing reads). */
Test(distctl_help, every_listed_verb_has_an_options_section) {
  char *usage, *err, verbs[64][32];
  cr_assert_eq(run("--help", &usage, &err), 0, "%s", err);
  int n = listed_verbs(usage, verbs, 64);
  cr_assert_geq(n, 19, "found %d verbs in: %s", n, usage);
  free(usage);
  free(err);
  for (int i = 0; i < n; i++) {
    char args[64], *out;
    snprintf(args, sizeof args, "help %s", verbs[i]);
    cr_assert_eq(run(args, &out, &err), 0, "distctl %s: %s", args, err);
    cr_assert(strstr(out, "\noptions:"), "distctl %s has no options section:\n%s", args, out);
    free(out);
    free(err);
  }
}

/* The synopsis shows which options go together, from the relations in
 * the verb's table that its parsing enforces: one in place of another as
 * "(A | B)", an option that needs another inside that one's brackets, two
 * that need each other side by side, and whether "--" is required. It
 * showed "NAME [FILE.npy] ... [--local ...]", "[--rank R] [--local]" and
 * restore's "[--mesh MESH] [--dim-names A,B] [--placements P]", each as if
 * taken alone. */
Test(distctl_help, the_synopsis_shows_which_options_go_together) {
  static const char *const synopses[][2] = {
      {"tensor put", "usage: distctl tensor put NAME (FILE.npy | --local R0.npy,R1.npy,...) "
                     "--mesh MESH [--dim-names A,B] --placements P [--dtype DTYPE]\n"},
      {"tensor get", "usage: distctl tensor get NAME -o OUT.npy [--rank R --local]\n"},
      {"tensor reshard", "usage: distctl tensor reshard NAME [--mesh MESH [--dim-names A,B]] "
                         "--placements P\n"},
      {"checkpoint restore", "usage: distctl checkpoint restore DIR [--tensors a,b,...] "
                             "[--placements P [--mesh MESH [--dim-names A,B]]]\n"},
      {"launch", "usage: distctl launch -n N [--log-dir DIR] -- PROGRAM [ARGS...]\n"},
      {"cluster up", "usage: distctl cluster up -n N --dir DIR [--pin] [-- DISTD-ARGS...]\n"},
  };
  for (size_t i = 0; i < sizeof synopses / sizeof synopses[0]; i++) {
    char args[64];
    snprintf(args, sizeof args, "help %s", synopses[i][0]);
    expect_verb_help(args, synopses[i][1], "status");
  }
  /* The usage error prints the same synopsis. */
  expect_says("--endpoint 127.0.0.1:1 tensor get w -o w.npy --local", 2, 1,
              "usage: distctl tensor get NAME -o OUT.npy [--rank R --local]\n");
}

/* Each option's help says what it needs or replaces, from the same
 * relations: the descriptions said it in words of their own ("with
 * --local:", "in place of FILE.npy:"), and restore's --placements none. */
Test(distctl_help, each_options_help_says_what_it_needs_or_replaces) {
  expect_says("help tensor put", 0, 0, "\n  --local R0.npy,R1.npy,...  in place of FILE.npy, "
              "not with it: each mesh rank's own piece");
  expect_says("help tensor put", 0, 0, "\n  --dim-names A,B            needs --mesh: names "
              "of its dims");
  expect_says("help tensor get", 0, 0, "\n  --rank R              needs --local: the rank "
              "whose piece to read\n");
  expect_says("help tensor get", 0, 0, "\n  --local               needs --rank: write rank "
              "R's local piece");
  expect_says("help checkpoint restore", 0, 0, "\n  --mesh MESH        needs --placements: "
              "the mesh to load onto");
  expect_says("help param tune", 0, 0, "\n  (give one or more of them)\n");
}
