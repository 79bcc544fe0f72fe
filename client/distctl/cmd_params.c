/* distctl params: the parameters every daemon holds (the parameter
 * service), with their optimizer, updates applied, pending pushes and the
 * memory their state takes. A parameter whose daemons disagree on the
 * updates applied is named: its shards are no longer one model.
 * distctl param tune: new hyper-parameters, the state kept. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"
#include "mesh.h" /* dist_reduce_name */

static const char *optimizer_name(dist_optimizer o) {
  switch (o) {
  case DIST_OPT_SGD: return "sgd";
  case DIST_OPT_ADAM: return "adam";
  case DIST_OPT_ADAMW: return "adamw";
  }
  return "?";
}

static const char *mode_name(dist_consistency m) {
  return m == DIST_PARAM_ASYNC ? "async" : "sync";
}

static json_t *param_json(const dist_param_info *p) {
  const dist_param_opts *o = &p->opts;
  json_t *j = json_pack(
      "{s:s, s:s, s:f, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:s, s:s, s:i, s:I, s:i, s:I, s:I}",
      "name", p->name, "optimizer", optimizer_name(o->optimizer), "lr", o->lr, "momentum",
      o->momentum, "dampening", o->dampening, "nesterov", o->nesterov, "beta1", o->beta1,
      "beta2", o->beta2, "eps", o->eps, "weight_decay", o->weight_decay, "reduce",
      dist_reduce_name(o->reduce), "consistency", mode_name(o->consistency), "trainers",
      o->trainers, "step", (json_int_t)p->step, "pending", p->pending, "state_bytes",
      (json_int_t)p->state_bytes, "version", (json_int_t)p->version);
  if (p->held_for[0]) json_object_set_new(j, "held_for", json_string(p->held_for));
  return j;
}

static json_t *rank_json(const dist_params_report *rep) {
  json_t *a = json_array();
  for (int i = 0; i < rep->n; i++) json_array_append_new(a, param_json(&rep->params[i]));
  return json_pack("{s:i, s:o}", "rank", rep->rank, "params", a);
}

static void print_rank(const dist_params_report *rep) {
  if (rep->n == 0) printf("%-5d %-20s (no parameter)\n", rep->rank, "-");
  for (int i = 0; i < rep->n; i++) {
    const dist_param_info *p = &rep->params[i];
    char state[32];
    dist_format_bytes(p->state_bytes, state, sizeof state);
    printf("%-5d %-20s %-9s %-10g %-6s %8d %8llu %8d %10s %8llu%s%s\n", rep->rank, p->name,
           optimizer_name(p->opts.optimizer), p->opts.lr, mode_name(p->opts.consistency),
           p->opts.trainers, (unsigned long long)p->step, p->pending, state,
           (unsigned long long)p->version, p->held_for[0] ? "  being " : "", p->held_for);
  }
}

/* The step rank r reports for name, or -1 when it holds no such parameter. */
static int64_t step_of(const dist_params_report *rep, const char *name) {
  for (int i = 0; i < rep->n; i++)
    if (strcmp(rep->params[i].name, name) == 0) return (int64_t)rep->params[i].step;
  return -1;
}

/* Names every parameter whose daemons report different steps; returns
 * them as a JSON array. */
static json_t *disagreements(const dist_params_report *rep, const distctl_answer *a, int n) {
  json_t *names = json_array();
  for (int r = 0; r < n; r++)
    for (int i = 0; a[r].ok && i < rep[r].n; i++) {
      const char *name = rep[r].params[i].name;
      int64_t step = (int64_t)rep[r].params[i].step, seen_before = 0, differs = 0;
      for (int q = 0; q < n; q++) {
        int64_t other = a[q].ok ? step_of(&rep[q], name) : -1;
        if (q < r && other >= 0) seen_before = 1;
        if (other >= 0 && other != step) differs = 1;
      }
      if (!differs || seen_before) continue;
      json_array_append_new(names, json_string(name));
      distctl_fail("parameter '%s': its daemons report different numbers of updates "
                   "applied (rank %d: %lld); its pieces are not one model", name,
                   rep[r].rank, (long long)step);
    }
  return names;
}

static int ask_params(dist_client *one, void *slot, void *arg) {
  (void)arg;
  return dist_params(one, 0, slot);
}

static int run_params(const distctl_global *g, int argc, char **argv) {
  if (distctl_take_options(&distctl_cmd_params, argc, argv, NULL) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  void *slots;
  distctl_answer *a =
      distctl_ask_each(g, c, ask_params, NULL, sizeof(dist_params_report), &slots, &down);
  if (!a) return dist_close(c), 1;
  dist_params_report *rep = slots;
  json_t *ranks = json_array();
  if (!g->json)
    printf("%-5s %-20s %-9s %-10s %-6s %8s %8s %8s %10s %8s\n", "RANK", "NAME", "OPTIMIZER",
           "LR", "MODE", "TRAINERS", "STEP", "PENDING", "STATE", "VERSION");
  for (int r = 0; r < n; r++) {
    if (!a[r].ok) {
      distctl_table_down(g, c, r, a[r].error, ranks);
      continue;
    }
    json_array_append_new(ranks, rank_json(&rep[r]));
    if (!g->json) print_rank(&rep[r]);
  }
  json_t *differ = disagreements(rep, a, n);
  int bad = down || json_array_size(differ) > 0;
  if (g->json)
    distctl_print_json(json_pack("{s:i, s:i, s:o, s:o}", "world_size", n, "down", down,
                                 "ranks", ranks, "steps_differ", differ));
  else
    json_decref(ranks), json_decref(differ);
  for (int r = 0; r < n; r++) dist_params_report_free(&rep[r]);
  free(rep);
  free(a);
  dist_close(c);
  return bad ? 1 : 0;
}

/* ---------------------------------------------------------------- param tune */

/* The hyper-parameters `param tune` takes, by where they sit in its
 * table, and where each goes in dist_param_opts. */
enum { TUNE_LR, TUNE_MOMENTUM, TUNE_DAMPENING, TUNE_BETA1, TUNE_BETA2, TUNE_EPS,
       TUNE_WEIGHT_DECAY, NTUNABLES };
static const distctl_option tune_options[NTUNABLES + 1] = {
    [TUNE_LR] = {"--lr", "X", "the learning rate", NULL, DISTCTL_OPTIONAL},
    [TUNE_MOMENTUM] = {"--momentum", "X", "SGD's momentum factor (not to or from 0: the "
                       "momentum buffer is state)", NULL, DISTCTL_OPTIONAL},
    [TUNE_DAMPENING] = {"--dampening", "X", "SGD's dampening of the momentum", NULL,
                        DISTCTL_OPTIONAL},
    [TUNE_BETA1] = {"--beta1", "X", "Adam's and AdamW's first-moment decay", NULL,
                    DISTCTL_OPTIONAL},
    [TUNE_BETA2] = {"--beta2", "X", "Adam's and AdamW's second-moment decay", NULL,
                    DISTCTL_OPTIONAL},
    [TUNE_EPS] = {"--eps", "X", "Adam's and AdamW's term added to the denominator", NULL,
                  DISTCTL_OPTIONAL},
    [TUNE_WEIGHT_DECAY] = {"--weight-decay", "X", "the weight decay (Adam: L2; AdamW: "
                           "decoupled)", NULL, DISTCTL_OPTIONAL},
};
static const size_t tune_offsets[NTUNABLES] = {
    [TUNE_LR] = offsetof(dist_param_opts, lr),
    [TUNE_MOMENTUM] = offsetof(dist_param_opts, momentum),
    [TUNE_DAMPENING] = offsetof(dist_param_opts, dampening),
    [TUNE_BETA1] = offsetof(dist_param_opts, beta1),
    [TUNE_BETA2] = offsetof(dist_param_opts, beta2),
    [TUNE_EPS] = offsetof(dist_param_opts, eps),
    [TUNE_WEIGHT_DECAY] = offsetof(dist_param_opts, weight_decay),
};

static double *field_of(dist_param_opts *o, int k) {
  return (double *)((char *)o + tune_offsets[k]);
}

/* The options in force for `name`, from the first daemon of its mesh. */
static int current_opts(dist_client *c, const char *name, dist_param_opts *out) {
  dist_tensor *t = NULL;
  if (dist_tensor_open(c, name, &t) != 0) return distctl_fail("%s", dist_errmsg(c));
  int rank = dist_mesh_rank_at(dist_tensor_mesh(t), 0), found = 0;
  dist_tensor_free(t);
  dist_params_report rep;
  if (dist_params(c, rank, &rep) != 0) return distctl_rank_fail(c, rank);
  for (int i = 0; i < rep.n && !found; i++)
    if (strcmp(rep.params[i].name, name) == 0) *out = rep.params[i].opts, found = 1;
  dist_params_report_free(&rep);
  return found ? 0 : distctl_fail("'%s' is not a parameter (configure it first)", name);
}

/* NAME and the values to change (set[k] when given, each a finite number);
 * 0, or 2 on bad usage. */
static int parse_tune(int argc, char **argv, const char **name, double *values, int *set) {
  const distctl_command *cmd = &distctl_cmd_param_tune;
  distctl_args a;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  *name = a.word[0];
  for (int k = 0; k < NTUNABLES; k++) {
    const char *text = a.value[k];
    if (!text) continue;
    char *end = NULL;
    values[k] = strtod(text, &end);
    if (end == text || *end || !isfinite(values[k]))
      return distctl_usage(cmd, "%s takes a finite number, not '%s'", tune_options[k].name,
                           text);
    set[k] = 1;
  }
  return 0;
}

static int run_param_tune(const distctl_global *g, int argc, char **argv) {
  const char *name = NULL;
  double values[NTUNABLES];
  int set[NTUNABLES] = {0}, rc = parse_tune(argc, argv, &name, values, set);
  if (rc) return rc;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  dist_param_opts before, after;
  if (current_opts(c, name, &before) != 0) {
    dist_close(c);
    return 1;
  }
  after = before;
  for (int k = 0; k < NTUNABLES; k++)
    if (set[k]) *field_of(&after, k) = values[k];
  rc = dist_param_tune(c, name, &after) == 0 ? 0 : distctl_fail("%s", dist_errmsg(c));
  dist_close(c);
  if (rc) return rc;
  json_t *changed = json_object();
  for (int k = 0; k < NTUNABLES; k++) {
    if (!set[k]) continue;
    const char *key = tune_options[k].name + 2;
    json_object_set_new(changed, key, json_pack("{s:f, s:f}", "before", *field_of(&before, k),
                                                "after", values[k]));
    if (!g->json) printf("%s: %s %g -> %g\n", name, key, *field_of(&before, k), values[k]);
  }
  if (g->json) distctl_print_json(json_pack("{s:s, s:o}", "name", name, "changed", changed));
  else json_decref(changed);
  return 0;
}

const distctl_command distctl_cmd_param_tune = {
    .name = "param tune",
    .words = {{"NAME", DISTCTL_REQUIRED}},
    .help = "change a parameter's hyper-parameters on every daemon, keeping its optimizer state",
    .run = run_param_tune,
    .options = tune_options,
    .wants_an_option = 1};

const distctl_command distctl_cmd_params = {
    .name = "params",
    .help = "the parameters each rank holds: optimizer, updates applied, pending pushes, state size",
    .run = run_params,
    .options = distctl_no_options};
