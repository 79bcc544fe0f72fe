/* A verb's synopsis and its options' help, both from its table: the
 * words, options and relations its parsing reads (options.c, presence.c),
 * so that what the help says goes together is what the verb takes. */
#include <string.h>

#include "distctl.h"

/* "--rank R", "--local": option o as the synopsis names it. */
static void print_option_text(FILE *out, const distctl_option *o) {
  fprintf(out, "%s%s%s", o->name, o->value ? " " : "", o->value ? o->value : "");
}

/* Whether the options called a and b need each other (--rank, --local). */
static int need_each_other(const distctl_command *cmd, const char *a, const char *b) {
  const char *of_a = distctl_related(cmd, a, DISTCTL_NEEDS),
             *of_b = distctl_related(cmd, b, DISTCTL_NEEDS);
  return of_a && of_b && strcmp(of_a, b) == 0 && strcmp(of_b, a) == 0;
}

/* Option k's part: " --mesh MESH", " [--rank R --local]", " [--placements
 * P [--mesh MESH]]": the option, one that needs it and that it needs
 * beside it, and inside it each option that needs it alone. */
static void print_option_part(FILE *out, const distctl_command *cmd, int k) {
  const distctl_option *o = &cmd->options[k];
  fprintf(out, " %s", o->required ? "" : "[");
  print_option_text(out, o);
  for (int j = 0; cmd->options[j].name; j++) {
    const char *needs = distctl_related(cmd, cmd->options[j].name, DISTCTL_NEEDS);
    if (j == k || !needs || strcmp(needs, o->name) != 0) continue;
    if (need_each_other(cmd, o->name, cmd->options[j].name)) {
      fputc(' ', out);
      print_option_text(out, &cmd->options[j]);
    } else {
      print_option_part(out, cmd, j);
    }
  }
  fprintf(out, "%s", o->required ? "" : "]");
}

/* The option of cmd in place of the word or option called name, or -1. */
static int replaced_by(const distctl_command *cmd, const char *name) {
  for (const distctl_relation *r = cmd->relations; r && r->which; r++)
    if (r->kind == DISTCTL_INSTEAD_OF && strcmp(r->other, name) == 0)
      return distctl_option_named(cmd, r->which);
  return -1;
}

/* Whether option k is shown within another's part or an alternative,
 * rather than in a part of its own. */
static int shown_elsewhere(const distctl_command *cmd, int k) {
  const char *name = cmd->options[k].name;
  if (distctl_related(cmd, name, DISTCTL_INSTEAD_OF)) return 1;
  const char *needs = distctl_related(cmd, name, DISTCTL_NEEDS);
  int at = needs ? distctl_option_named(cmd, needs) : -1;
  if (at < 0) return 0; /* it needs a word, or nothing */
  return !need_each_other(cmd, name, needs) || at < k;
}

/* " (FILE.npy | --local R0.npy,...)": the word called word (NULL: option
 * `option`) and the option `by` in its place. */
static void print_alternatives(FILE *out, const distctl_command *cmd, const char *word,
                               int option, int by) {
  fprintf(out, " (");
  if (word)
    fprintf(out, "%s", word);
  else
    print_option_text(out, &cmd->options[option]);
  fprintf(out, " | ");
  print_option_text(out, &cmd->options[by]);
  fprintf(out, ")");
}

static void print_word(FILE *out, const distctl_command *cmd, const distctl_word *w) {
  int by = replaced_by(cmd, w->name);
  if (by >= 0)
    print_alternatives(out, cmd, w->name, -1, by);
  else
    fprintf(out, w->required ? " %s" : " [%s]", w->name);
}

static void print_top_option(FILE *out, const distctl_command *cmd, int k) {
  int by = replaced_by(cmd, cmd->options[k].name);
  if (by < 0)
    print_option_part(out, cmd, k);
  else
    print_alternatives(out, cmd, NULL, k, by);
}

void distctl_print_synopsis(FILE *out, const char *lead, const distctl_command *cmd,
                            int describe) {
  fprintf(out, "%s%s", lead, cmd->name);
  for (int k = 0; k < DISTCTL_MAX_WORDS && cmd->words[k].name; k++)
    print_word(out, cmd, &cmd->words[k]);
  for (int k = 0; cmd->options[k].name; k++)
    if (!shown_elsewhere(cmd, k)) print_top_option(out, cmd, k);
  if (cmd->after_dashes.name)
    fprintf(out, cmd->after_dashes.required ? " -- %s" : " [-- %s]", cmd->after_dashes.name);
  fprintf(out, "\n");
  if (describe) fprintf(out, "      %s\n", cmd->help);
}

/* "-o, --output OUT.npy": option o as its help names it. */
static void option_label(const distctl_option *o, char *buf, size_t len) {
  snprintf(buf, len, "%s%s%s%s%s", o->name, o->alias ? ", " : "", o->alias ? o->alias : "",
           o->value ? " " : "", o->value ? o->value : "");
}

/* What option o does, led by how it goes with the others: "needs
 * --mesh: names of its dims ...", "in place of FILE.npy, not with it: ...". */
static void option_help(const distctl_command *cmd, const distctl_option *o, char *buf,
                        size_t len) {
  const char *needs = distctl_related(cmd, o->name, DISTCTL_NEEDS),
             *instead_of = distctl_related(cmd, o->name, DISTCTL_INSTEAD_OF);
  if (needs)
    snprintf(buf, len, "needs %s: %s", needs, o->help);
  else if (instead_of)
    snprintf(buf, len, "in place of %s, not with it: %s", instead_of, o->help);
  else
    snprintf(buf, len, "%s", o->help);
}

/* The width of the help's lines: that of the lines written by hand. */
#define HELP_COLUMNS 100

/* text from column indent of a line, its words carried to lines of their
 * own indented as much once a line would pass HELP_COLUMNS (a word longer
 * than a line stays whole). */
static void print_wrapped(const char *text, int indent) {
  int room = HELP_COLUMNS - indent, used = 0;
  if (room < 20) room = 20;
  while (*text) {
    int len = (int)strcspn(text, " ");
    if (used > 0 && used + 1 + len > room) {
      printf("\n%*s", indent, "");
      used = 0;
    } else if (used > 0) {
      printf(" ");
      used++;
    }
    printf("%.*s", len, text);
    used += len;
    text += len;
    while (*text == ' ') text++;
  }
  printf("\n");
}

void distctl_print_options(const distctl_command *cmd) {
  if (!cmd->options[0].name) {
    printf("\noptions: none of its own\n");
    return;
  }
  char label[128], help[1024];
  int width = 0; /* of the longest label: the descriptions line up */
  for (int k = 0; cmd->options[k].name; k++) {
    option_label(&cmd->options[k], label, sizeof label);
    if ((int)strlen(label) > width) width = (int)strlen(label);
  }
  printf("\noptions:\n");
  for (int k = 0; cmd->options[k].name; k++) {
    option_label(&cmd->options[k], label, sizeof label);
    printf("  %-*s  ", width, label);
    option_help(cmd, &cmd->options[k], help, sizeof help);
    print_wrapped(help, 2 + width + 2);
  }
  if (cmd->wants_an_option) printf("  (give one or more of them)\n");
}

