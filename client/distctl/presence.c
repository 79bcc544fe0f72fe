/* What must be present on a verb's command line, from its table alone:
 * required options, words and "--" part, and how options and words go
 * together (distctl_relation). The verbs check none of it themselves, so
 * that what their help says and what they refuse cannot differ, and each
 * refusal reads the same in every verb. */
#include <string.h>

#include "distctl.h"

int distctl_option_named(const distctl_command *cmd, const char *name) {
  for (int k = 0; k < DISTCTL_MAX_OPTIONS && cmd->options[k].name; k++)
    if (strcmp(cmd->options[k].name, name) == 0) return k;
  return -1;
}

const char *distctl_related(const distctl_command *cmd, const char *name, int kind) {
  for (const distctl_relation *r = cmd->relations; r && r->which; r++)
    if (r->kind == kind && strcmp(r->which, name) == 0) return r->other;
  return NULL;
}

/* Whether cmd's option or word called name was given: a word given as ""
 * was not (NAME "" names no tensor). */
static int given(const distctl_command *cmd, const distctl_args *a, const char *name) {
  int k = distctl_option_named(cmd, name);
  if (k >= 0) return a->value[k] != NULL;
  for (k = 0; k < a->nwords; k++)
    if (strcmp(cmd->words[k].name, name) == 0) return a->word[k][0] != 0;
  return 0;
}

static int required_options(const distctl_command *cmd, const distctl_args *a) {
  for (int k = 0; k < DISTCTL_MAX_OPTIONS && cmd->options[k].name; k++) {
    const distctl_option *o = &cmd->options[k];
    if (o->required && !a->value[k])
      return distctl_usage(cmd, "%s%s%s is required", o->name, o->value ? " " : "",
                           o->value ? o->value : "");
  }
  return 0;
}

static int required_words(const distctl_command *cmd, const distctl_args *a) {
  for (int k = 0; k < DISTCTL_MAX_WORDS && cmd->words[k].name; k++)
    if (cmd->words[k].required && !given(cmd, a, cmd->words[k].name))
      return distctl_usage(cmd, "%s is required", cmd->words[k].name);
  if (cmd->after_dashes.required && a->nrest == 0)
    return distctl_usage(cmd, "-- %s is required", cmd->after_dashes.name);
  return 0;
}

static int relation_kept(const distctl_command *cmd, const distctl_args *a,
                         const distctl_relation *r) {
  int which = given(cmd, a, r->which), other = given(cmd, a, r->other);
  if (r->kind == DISTCTL_NEEDS && which && !other)
    return distctl_usage(cmd, "%s needs %s", r->which, r->other);
  if (r->kind == DISTCTL_INSTEAD_OF && which && other)
    return distctl_usage(cmd, "%s and %s exclude each other", r->other, r->which);
  if (r->kind == DISTCTL_INSTEAD_OF && !which && !other)
    return distctl_usage(cmd, "give %s or %s", r->other, r->which);
  return 0;
}

/* wants_an_option: "give one or more of --lr, --momentum, ...". */
static int some_option(const distctl_command *cmd, const distctl_args *a) {
  char names[512];
  size_t used = 0;
  names[0] = 0;
  for (int k = 0; k < DISTCTL_MAX_OPTIONS && cmd->options[k].name; k++) {
    if (a->value[k]) return 0;
    if (used < sizeof names)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "",
                               cmd->options[k].name);
  }
  return distctl_usage(cmd, "give one or more of %s", names);
}

int distctl_check_presence(const distctl_command *cmd, const distctl_args *a) {
  if (required_options(cmd, a) || required_words(cmd, a)) return 2;
  for (const distctl_relation *r = cmd->relations; r && r->which; r++)
    if (relation_kept(cmd, a, r)) return 2;
  return cmd->wants_an_option ? some_option(cmd, a) : 0;
}
