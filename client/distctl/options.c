/* The one way a verb reads its command line: from its options table
 * (distctl_command.options), which its synopsis and help print as well,
 * so that what the help describes and what the verb takes cannot differ. */
#include <string.h>

#include "distctl.h"

const distctl_option distctl_no_options[] = {{NULL, NULL, NULL, NULL, 0}};

const char *distctl_opt(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) return NULL;
  return argv[++*i];
}

/* Whether arg is option `name`, alone or as "name=value". */
static int is_option(const char *arg, const char *name) {
  size_t n = strlen(name);
  return strncmp(arg, name, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

int distctl_opt_once(const distctl_command *cmd, int argc, char **argv, int *i,
                     const char *name, const char **slot) {
  if (!is_option(argv[*i], name)) return 0;
  const char *v = distctl_opt(argc, argv, i, name);
  if (!v) return distctl_usage(cmd, "option %s needs a value", name);
  if (*slot) return distctl_usage(cmd, "option %s given twice ('%s', then '%s')", name, *slot, v);
  *slot = v;
  return 1;
}

/* A flag given takes its name as its value. Given twice it is refused
 * as an option with a value is (it was taken until session 29): every
 * option is taken once, and a repeat is told in one wording. */
int distctl_flag_once(const distctl_command *cmd, const char *arg, const char *name,
                      const char **slot) {
  if (!is_option(arg, name)) return 0;
  if (arg[strlen(name)] == '=') return distctl_usage(cmd, "option %s takes no value", name);
  if (*slot) return distctl_usage(cmd, "option %s given twice", name);
  *slot = name;
  return 1;
}

/* argv[*i] as option o (by its name or its alias): 1 taken, 0 not it, 2
 * usage error. */
static int take_one(const distctl_command *cmd, const distctl_option *o, int argc, char **argv,
                    int *i, const char **slot) {
  const char *spellings[] = {o->name, o->alias};
  for (int s = 0; s < 2 && spellings[s]; s++) {
    int taken = o->value ? distctl_opt_once(cmd, argc, argv, i, spellings[s], slot)
                         : distctl_flag_once(cmd, argv[*i], spellings[s], slot);
    if (taken) return taken;
  }
  return 0;
}

/* argv[*i] as one of cmd's options: 1 taken, 0 not one, 2 usage error. */
static int take_table_option(const distctl_command *cmd, int argc, char **argv, int *i,
                             distctl_args *a) {
  for (int k = 0; k < DISTCTL_MAX_OPTIONS && cmd->options[k].name; k++) {
    int taken = take_one(cmd, &cmd->options[k], argc, argv, i, &a->value[k]);
    if (taken) return taken;
  }
  return 0;
}

/* How many words cmd takes: as many as it names. */
static int words_taken(const distctl_command *cmd) {
  int n = 0;
  while (n < DISTCTL_MAX_WORDS && cmd->words[n].name) n++;
  return n;
}

/* argv[i], not an option of the table: a word while cmd takes more. */
static int take_word(const distctl_command *cmd, const char *arg, distctl_args *a) {
  if (arg[0] == '-' && arg[1]) return distctl_usage(cmd, "unknown argument '%s'", arg);
  if (a->nwords >= words_taken(cmd)) return distctl_usage(cmd, "unexpected argument '%s'", arg);
  a->word[a->nwords++] = arg;
  return 0;
}

int distctl_take_options(const distctl_command *cmd, int argc, char **argv, distctl_args *a) {
  distctl_args unused;
  if (!a) a = &unused;
  memset(a, 0, sizeof *a);
  for (int i = 0; i < argc; i++) {
    if (cmd->after_dashes.name && strcmp(argv[i], "--") == 0) {
      a->rest = argv + i + 1;
      a->nrest = argc - i - 1;
      break;
    }
    int taken = take_table_option(cmd, argc, argv, &i, a);
    if (taken == 2) return 2;
    if (!taken && take_word(cmd, argv[i], a) != 0) return 2;
  }
  return distctl_check_presence(cmd, a);
}
