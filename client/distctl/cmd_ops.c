/* distctl ops: every daemon's operations in flight (with the ranks each
 * still waits on, so a stuck peer shows at a glance) and its recent ones.
 * A daemon that does not answer is listed with the reason and makes the
 * exit status 1; the others are still shown. */
#include <stdio.h>
#include <stdlib.h>

#include "distctl.h"

#define DEFAULT_RECENT 20

static void format_ranks(const int *r, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? "," : "", r[i]);
  if (n == 0) snprintf(buf, len, "-");
}

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static const char *state_name(dist_op_state s) {
  return s == DIST_OP_RUNNING ? "running" : s == DIST_OP_DONE ? "done" : "failed";
}

/* ---------------------------------------------------------------- ops */

static json_t *op_json(const dist_op_info *o) {
  char id[24];
  snprintf(id, sizeof id, "%llu", (unsigned long long)o->op_id);
  /* op_id is a string: it is a full uint64, beyond what JSON numbers keep. */
  return json_pack("{s:I,s:s,s:s,s:s,s:o,s:i,s:I,s:f,s:f,s:o,s:s}", "serial",
                   (json_int_t)o->serial, "op_id", id, "kind", o->kind, "state",
                   state_name(o->state), "group", int_array(o->group, o->ngroup),
                   "group_size", o->group_size, "bytes", (json_int_t)o->bytes,
                   "age_seconds", o->age_seconds, "duration_seconds", o->duration_seconds,
                   "waiting_on", int_array(o->waiting_on, o->nwaiting), "error", o->error);
}

static void print_op(int rank, const dist_op_info *o) {
  char waiting[128], bytes[32], group[128];
  format_ranks(o->waiting_on, o->nwaiting, waiting, sizeof waiting);
  format_ranks(o->group, o->ngroup, group, sizeof group);
  dist_format_bytes(o->bytes, bytes, sizeof bytes);
  printf("%-5d %-20llu %-15s %-8s %-10s %-12s %10s %8.1fs", rank,
         (unsigned long long)o->op_id, o->kind, state_name(o->state),
         o->state == DIST_OP_RUNNING ? waiting : "", group, bytes, o->age_seconds);
  if (o->state == DIST_OP_FAILED) printf("  %s", o->error);
  else if (o->state == DIST_OP_DONE) printf("  took %.3fs", o->duration_seconds);
  printf("\n");
}

/* ranks: the --json report's, whose entries for the ranks down (a[r].ok
 * 0) say why. */
static void print_ops_table(dist_client *c, const dist_ops_report *rep,
                            const distctl_answer *a, json_t *ranks) {
  int n = (int)json_array_size(ranks);
  printf("%-5s %-20s %-15s %-8s %-10s %-12s %10s %9s\n", "RANK", "OP_ID", "KIND", "STATE",
         "WAITING_ON", "GROUP", "BYTES", "AGE");
  for (int r = 0; r < n; r++) { /* the ranks down first: what a hang waits on */
    json_t *why = json_object_get(json_array_get(ranks, (size_t)r), "error");
    if (!a[r].ok) distctl_print_down_row(dist_daemon_rank(c, r), NULL, json_string_value(why));
  }
  for (int pass = 0; pass < 2; pass++) /* every rank's running ops first */
    for (int r = 0; r < n; r++) {
      if (!a[r].ok) continue;
      int from = pass ? rep[r].n_in_flight : 0;
      int to = pass ? rep[r].n_in_flight + rep[r].n_recent : rep[r].n_in_flight;
      for (int i = from; i < to; i++) print_op(rep[r].rank, &rep[r].ops[i]);
    }
}

static json_t *ops_rank_json(const dist_ops_report *rep) {
  json_t *in = json_array(), *recent = json_array();
  for (int i = 0; i < rep->n_in_flight + rep->n_recent; i++)
    json_array_append_new(i < rep->n_in_flight ? in : recent, op_json(&rep->ops[i]));
  return json_pack("{s:i,s:o,s:o}", "rank", rep->rank, "in_flight", in, "recent", recent);
}

/* arg: --recent, of which 0 asks for none here: the RPC's 0 means "all
 * kept". */
static int ask_ops(dist_client *one, void *slot, void *arg) {
  long recent = *(const long *)arg;
  dist_ops_report *rep = slot;
  int rc = dist_ops(one, 0, recent ? (int)recent : 1, rep);
  if (rc == 0 && !recent) rep->n_recent = 0;
  return rc;
}

enum { OPT_RECENT, NOPTIONS };
static const distctl_option options[NOPTIONS + 1] = {
    [OPT_RECENT] = {"--recent", "N",
                    "how many finished operations of each rank to show, 0 to 256 (default 20)",
                    NULL, DISTCTL_OPTIONAL},
};

static int run_ops(const distctl_global *g, int argc, char **argv) {
  long recent = DEFAULT_RECENT;
  distctl_args args;
  if (distctl_take_options(&distctl_cmd_ops, argc, argv, &args) != 0) return 2;
  if (args.value[OPT_RECENT] &&
      distctl_number_opt(&distctl_cmd_ops, "--recent", args.value[OPT_RECENT], 0, 256,
                         &recent))
    return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  void *slots;
  distctl_answer *a =
      distctl_ask_each(g, c, ask_ops, &recent, sizeof(dist_ops_report), &slots, &down);
  if (!a) return dist_close(c), 1;
  dist_ops_report *rep = slots;
  json_t *ranks = json_array();
  for (int r = 0; r < n; r++)
    json_array_append_new(ranks, a[r].ok ? ops_rank_json(&rep[r])
                                         : distctl_rank_down(c, r, a[r].error));
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down, "ranks", ranks));
  else {
    print_ops_table(c, rep, a, ranks);
    json_decref(ranks);
  }
  for (int r = 0; r < n; r++) dist_ops_report_free(&rep[r]);
  free(rep);
  free(a);
  dist_close(c);
  return down ? 1 : 0;
}

const distctl_command distctl_cmd_ops = {
    .name = "ops",
    .help = "operations in flight on every rank (with the ranks they wait on) and recent ones",
    .run = run_ops,
    .options = options};
