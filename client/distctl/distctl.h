/* distctl: one file per command, each exporting one distctl_command, in the
 * manner of tmux's cmd_entry tables. */
#ifndef DISTCTL_H
#define DISTCTL_H

#include <jansson.h>
#include <stdio.h>

#include "dist/dist.h"
#include "fileio.h" /* dist_format_bytes */

/* Options every command understands. */
typedef struct distctl_global {
  const char *cluster;  /* --cluster FILE, or $DIST_CLUSTER */
  const char *endpoint; /* --endpoint HOST:PORT */
  int json;             /* --json */
  long timeout_ms;      /* --timeout MS */
  /* --tls-ca/--tls-cert/--tls-key FILE, --token T / --token-file FILE; also
   * exported as DIST_TLS_CA, ... DIST_TOKEN for `distctl launch`. */
  const char *tls_ca, *tls_cert, *tls_key, *tls_crl, *token, *token_file;
} distctl_global;

/* An option of a verb, as its help describes it and distctl_take_options
 * parses it: "--recent", its value "N", and what it does. A flag (--pin)
 * has no value (NULL). alias is another spelling of the same option
 * ("--output" of "-o"), or NULL. A required option is shown without
 * brackets in the synopsis, and the verb is refused without it; how it
 * goes with the verb's other options is in its command's relations. */
typedef struct distctl_option {
  const char *name, *value, *help;
  const char *alias;
  int required; /* DISTCTL_REQUIRED or DISTCTL_OPTIONAL */
} distctl_option;
enum { DISTCTL_OPTIONAL = 0, DISTCTL_REQUIRED = 1 };

/* The most options a verb's table may hold, and the most words a verb
 * takes. */
enum { DISTCTL_MAX_OPTIONS = 16, DISTCTL_MAX_WORDS = 2 };

/* An argument of a verb that is not an option ("NAME"), or what follows
 * "--" ("PROGRAM [ARGS...]"), by the name its synopsis shows; a required
 * one is shown without brackets, and the verb is refused without it (an
 * empty word, "", counts as not given). */
typedef struct distctl_word {
  const char *name;
  int required; /* DISTCTL_REQUIRED or DISTCTL_OPTIONAL */
} distctl_word;

/* How two of a verb's options or words, named as its synopsis names them,
 * go together:
 * - DISTCTL_NEEDS: `which` is taken only with `other` ("--dim-names" needs
 *   "--mesh"); the synopsis shows it inside other's part, the two of a
 *   pair that need each other side by side;
 * - DISTCTL_INSTEAD_OF: `which` replaces `other` ("--local" for
 *   "FILE.npy"): exactly one of the two is given; the synopsis shows
 *   "(FILE.npy | --local R0.npy,...)".
 * The help says each at its option, and distctl_take_options refuses a
 * command line that breaks one, in one wording for every verb. */
enum { DISTCTL_NEEDS = 1, DISTCTL_INSTEAD_OF = 2 };
typedef struct distctl_relation {
  const char *which;
  int kind;
  const char *other;
} distctl_relation;

typedef struct distctl_command {
  const char *name;  /* "status", "tensor put" */
  /* The arguments that are not options, in order, before the options in
   * the synopsis; {NULL} after the last (none: all {NULL}). */
  distctl_word words[DISTCTL_MAX_WORDS];
  const char *help;  /* one line */
  /* argv[0] is the first argument after the command name. Returns the
   * process exit status: 0, 1 (operation failed), 2 (bad usage). */
  int (*run)(const distctl_global *g, int argc, char **argv);
  /* The verb's options, ended by {NULL} (distctl_no_options for none):
   * its synopsis lists them after the words, its help describes each, and
   * distctl_take_options parses them. */
  const distctl_option *options;
  /* How its options and words go together, ended by {NULL}; NULL for no
   * relation. */
  const distctl_relation *relations;
  /* 1: one or more of its options must be given (param tune: something
   * to change). */
  int wants_an_option;
  /* What follows "--", ending the synopsis ("-- PROGRAM [ARGS...]"); .name
   * NULL for a verb that takes no "--". */
  distctl_word after_dashes;
} distctl_command;

/* A number macro's digits as a string literal, for a help text. */
#define DISTCTL_TEXT_OF(x) #x
#define DISTCTL_NUMBER_TEXT(x) DISTCTL_TEXT_OF(x)

/* A verb's command line, as distctl_take_options read it. */
typedef struct distctl_args {
  /* value[k]: the value of cmd->options[k] (a flag's: its name), or NULL
   * when not given. */
  const char *value[DISTCTL_MAX_OPTIONS];
  const char *word[DISTCTL_MAX_WORDS]; /* the arguments that are not options */
  int nwords;
  char **rest; /* what follows "--" (after_dashes), nrest of them */
  int nrest;
} distctl_args;

/* The options table of a verb that takes none of its own. */
extern const distctl_option distctl_no_options[];

/* commands.c: the table of verbs. The one argv[0..] names (*words: 1 or
 * 2 words), or NULL. */
const distctl_command *distctl_find(int argc, char **argv, int *words);
/* No verb matched argv: names the unknown command or subcommand (or the
 * missing subcommand, with the valid ones) on stderr; returns 2. */
int distctl_unknown_command(int argc, char **argv);
/* The full usage: the global options and every verb's synopsis. */
void distctl_print_usage(FILE *out);
/* synopsis.c: "LEAD NAME ARGS", cmd's synopsis, and with describe its
 * description under it: the one way a verb's usage is printed. The words
 * and options show how they go together: "(FILE.npy | --local R0.npy,...)"
 * for one in place of the other, an option that needs another inside the
 * other's part ("[--placements P [--mesh MESH]]"), and two that need each
 * other side by side ("[--rank R --local]"). */
void distctl_print_synopsis(FILE *out, const char *lead, const distctl_command *cmd,
                            int describe);
/* synopsis.c: each option of cmd's table and what it does (and what it
 * needs or replaces), under the synopsis of its help, on stdout. */
void distctl_print_options(const distctl_command *cmd);
/* `distctl help [WORDS]`: the full usage without words, else the help of
 * the verb (or verb group, "tensor") they name on stdout and 0; 2 and
 * the unknown command named on stderr when they name none. */
int distctl_help(int argc, char **argv);

/* Connects as the global options say: --endpoint, else --cluster or
 * $DIST_CLUSTER, else the embedded default endpoint. Prints the error and
 * returns NULL on failure. */
dist_client *distctl_connect(const distctl_global *g);
/* Prints "distctl: <message>" to stderr; returns 1. */
int distctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "distctl <cmd>: <message>" and the usage line; returns 2. cmd
 * NULL (the global options): "distctl: <message>" and where help is. */
int distctl_usage(const distctl_command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* calloc(n, size), or NULL after "distctl: out of memory for WHAT" on
 * stderr, WHAT formatted from fmt ("the answers of 4 ranks"). */
void *distctl_calloc(size_t n, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prints j (compact = 0: indented) to stdout and drops the reference. */
void distctl_print_json(json_t *j);
/* Flushes stdout: 0, or -1 when its output could not all be written,
 * said once on stderr naming why ("distctl: cannot write the output: ..."). */
int distctl_output_flushed(void);

/* A rank that did not answer, as every table shows it: the daemon's
 * rank (-1: "?"), its endpoint when the table has that column (status;
 * else NULL), "down" and why. */
void distctl_print_down_row(int rank, const char *endpoint, const char *error);
/* The rank at position `rank` did not answer (error: its distctl_answer's):
 * says so on stderr (distctl_rank_fail) and returns its entry in the
 * --json reports' "ranks". */
json_t *distctl_rank_down(dist_client *c, int rank, const char *error);
/* The same, in a table without an endpoint column: its entry appended to
 * ranks, and its down row printed unless --json. */
void distctl_table_down(const distctl_global *g, dist_client *c, int rank, const char *error,
                        json_t *ranks);
/* The rank of the daemon at position pos, as distctl shows it: the
 * daemon's own (dist_daemon_rank: with --endpoint, not the position 0),
 * or, for a daemon of --endpoint that did not say, null in JSON and "?"
 * in a table. */
json_t *distctl_rank_json(dist_client *c, int pos);
/* A rank in JSON: null when -1 (not known); in a table, "?" then. */
json_t *distctl_rank_value(int rank);
const char *distctl_rank_format(int rank, char *buf, size_t len);
const char *distctl_rank_text(dist_client *c, int pos, char *buf, size_t len);

/* Takes "--name value" or "--name=value" at argv[*i]; returns the value or
 * NULL when argv[*i] is not that option. Advances *i past a separate value. */
const char *distctl_opt(int argc, char **argv, int *i, const char *name);

/* The one way commands take an option with a value: when argv[*i] is
 * `name` ("--name value" or "--name=value") stores the value in *slot and
 * returns 1; 0 when argv[*i] is not that option; 2 after a usage error: the
 * value is missing, or the option was given before (*slot set), which is
 * refused naming it rather than the last one silently winning. */
int distctl_opt_once(const distctl_command *cmd, int argc, char **argv, int *i,
                     const char *name, const char **slot);
/* The one way commands take a flag (an option without a value): when arg
 * is `name` stores name in *slot and returns 1; 0 when arg is not that
 * flag; 2 after a usage error: "name=value", or the flag given before
 * (*slot set), refused as distctl_opt_once refuses a repeated option. */
int distctl_flag_once(const distctl_command *cmd, const char *arg, const char *name,
                      const char **slot);
/* The one way a verb reads its arguments (options.c): the options of
 * cmd's table, each once (distctl_opt_once, distctl_flag_once); as many
 * words as cmd names ("-" is one, "-x" an unknown option); and, when cmd
 * takes "--", everything after it. Then what must be present is
 * (distctl_check_presence). Fills *a (NULL for a verb that needs nothing
 * of it). 0, or 2 after a usage error naming the argument. */
int distctl_take_options(const distctl_command *cmd, int argc, char **argv, distctl_args *a);
/* presence.c: what a verb's table says must be present, checked against
 * what a command line gave: its required options, words and "--" part,
 * its relations and wants_an_option. 0, or 2 after a usage error saying
 * what is missing or too much, in one wording for every verb. */
int distctl_check_presence(const distctl_command *cmd, const distctl_args *a);
/* The position of cmd's option called name in its table, or -1. */
int distctl_option_named(const distctl_command *cmd, const char *name);
/* The other of cmd's relation of this kind whose `which` is name, or
 * NULL when there is none. */
const char *distctl_related(const distctl_command *cmd, const char *name, int kind);
/* "distctl: <message>" for a call that failed on daemon `rank`, naming the
 * rank once: libdist's per-daemon errors already start with it (or, with
 * --endpoint, name the daemon by its address). Returns 1. */
int distctl_rank_fail(dist_client *c, long rank);

/* A --rank past the cluster is a usage error naming the ranks there are
 * (cmd's usage line, returns 2); 0 when rank is one of them. */
int distctl_rank_in_cluster(const distctl_command *cmd, dist_client *c, long rank);

/* Parses text as a whole decimal integer in [lo, hi]: 0, or -1 for
 * anything else ("2x", "", out of range); atoi would take "2x" as 2. */
int distctl_parse_long(const char *text, long lo, long hi, long *out);
/* distctl_parse_long for the value of `option`; on a bad value prints
 * which option and value, with cmd's usage line, and returns 2. */
int distctl_number_opt(const distctl_command *cmd, const char *option,
                       const char *text, long lo, long hi, long *out);

/* --dim-names, as every verb that takes --mesh describes it. */
#define DISTCTL_DIM_NAMES_OPTION                                              \
  {"--dim-names", "A,B", "names of its dims (default d0,d1,...)", NULL, DISTCTL_OPTIONAL}
/* ... which needs --mesh, in the relations of every verb that takes it. */
#define DISTCTL_DIM_NAMES_NEEDS_MESH {"--dim-names", DISTCTL_NEEDS, "--mesh"}

/* --mesh, --dim-names and --placements as given (mesh, dim_names NULL
 * when not). */
typedef struct distctl_layout_text {
  const char *mesh, *dim_names, *placements;
} distctl_layout_text;
/* Parses a layout: *mesh (NULL without --mesh: the tensor keeps its own),
 * p[DIST_MAX_MESH_DIMS] and *np, the placements given. With --mesh the
 * count must match its dims. Returns 0, or 2 after a usage error (*mesh
 * NULL then). */
int distctl_parse_layout(const distctl_command *cmd, const distctl_layout_text *text,
                         dist_mesh **mesh, dist_placement *p, int *np);
/* Placements that cannot fit are usage errors (0 or 2): np must be the
 * mesh's ndim (mesh_whose names the mesh in the message: "the mesh",
 * "the tensor's mesh"), and every Shard(d) must name a dim of a tensor of
 * tensor_ndim dims (tensor_what: "the tensor", "'w'"). */
int distctl_check_count(const distctl_command *cmd, int np, int mesh_ndim,
                        const char *mesh_whose);
int distctl_check_shard_dims(const distctl_command *cmd, const dist_placement *p, int np,
                             int tensor_ndim, const char *tensor_what);

extern const distctl_command distctl_cmd_status, distctl_cmd_peers,
    distctl_cmd_cluster_up, distctl_cmd_cluster_down, distctl_cmd_launch,
    distctl_cmd_tensor_put, distctl_cmd_tensor_get, distctl_cmd_tensor_show,
    distctl_cmd_tensor_rm, distctl_cmd_tensor_reshard, distctl_cmd_tensors;

/* cmd_checkpoint.c */
extern const distctl_command distctl_cmd_checkpoint_save,
    distctl_cmd_checkpoint_restore;

/* cmd_ops.c, cmd_experts.c, cmd_metrics.c, cmd_top.c */
extern const distctl_command distctl_cmd_ops, distctl_cmd_experts, distctl_cmd_metrics,
    distctl_cmd_top;

/* ask_each.c: the one way an inspection verb asks every rank of a cluster:
 * all at once, each within the client's timeout, so ranks that do not
 * answer cost one timeout together rather than one each. */
/* What one rank is asked: its daemon is at position 0 of `one`, a client
 * of its own; fills *slot and returns 0, or libdist's error (with
 * dist_errmsg(one) saying why). */
typedef int (*distctl_ask_fn)(dist_client *one, void *slot, void *arg);
typedef struct distctl_answer {
  int ok;
  char error[512]; /* why not, naming the rank as the cluster's client does */
} distctl_answer;
/* A client of each daemon of c, for asking them again and again (top). */
typedef struct distctl_ranks distctl_ranks;
/* NULL when out of memory (said on stderr). A rank whose client cannot
 * be made is asked nothing: its answer says it cannot connect. */
distctl_ranks *distctl_ranks_open(const distctl_global *g, dist_client *c);
void distctl_ranks_close(distctl_ranks *rk); /* NULL is a no-op */
/* ask(rank r's client, slots + r * slot_size, arg) for every rank at
 * once; answers[r] says how rank r did. Returns how many did not answer,
 * or -1 when out of memory (said on stderr; nobody was asked). */
int distctl_ranks_ask(const distctl_ranks *rk, distctl_ask_fn ask, void *arg, void *slots,
                      size_t slot_size, distctl_answer *answers);
/* Opens, asks once into slots of its own and closes: the answers and
 * *slots (one of slot_size bytes per rank, zeroed before asking), both to
 * free, and *down set. NULL (*slots NULL, *down -1) when out of memory,
 * said on stderr: nobody was asked then. */
distctl_answer *distctl_ask_each(const distctl_global *g, dist_client *c, distctl_ask_fn ask,
                                 void *arg, size_t slot_size, void **slots, int *down);

/* http_get.c: the daemon's HTTP address (Info's http_address) as host and
 * port, with a wildcard host replaced by the host its gRPC endpoint was
 * reached at; 0, or -1 when it is not HOST:PORT. */
int distctl_http_target(dist_client *c, int rank, const char *http, char *host, size_t hlen,
                        char *port, size_t plen);
/* GET path over HTTP/1.0, each step within timeout_ms; *body is the
 * malloc'd body of a 200 reply. 0, or -1 with why said in why. */
int distctl_http_get(const char *host, const char *port, const char *path, long timeout_ms,
                     char **body, char *why, size_t wlen);

/* cmd_params.c */
extern const distctl_command distctl_cmd_params, distctl_cmd_param_tune;

#endif
