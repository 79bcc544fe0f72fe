/* distctl experts: the experts each daemon hosts and the tokens routed to
 * them. A daemon that does not answer is listed with the reason and makes
 * the exit status 1; the others are still shown. */
#include <stdio.h>
#include <stdlib.h>

#include "distctl.h"

static json_t *experts_rank_json(const dist_experts_report *rep) {
  json_t *a = json_array();
  for (int i = 0; i < rep->n; i++) {
    const dist_expert_info *e = &rep->experts[i];
    json_array_append_new(a, json_pack("{s:i,s:I,s:I,s:I,s:I}", "expert", e->expert_id,
                                       "steps", (json_int_t)e->steps, "tokens_last",
                                       (json_int_t)e->tokens_last, "tokens_recent",
                                       (json_int_t)e->tokens_recent, "tokens_total",
                                       (json_int_t)e->tokens_total));
  }
  return json_pack("{s:i,s:i,s:o}", "rank", rep->rank, "window_steps", rep->window_steps,
                   "experts", a);
}

static void print_experts(int r, const dist_experts_report *rep) {
  if (rep->n == 0) printf("%-5d %-7s (no expert has received tokens)\n", r, "-");
  for (int i = 0; i < rep->n; i++) {
    const dist_expert_info *e = &rep->experts[i];
    printf("%-5d %-7d %8llu %12llu %14llu %14llu\n", r, e->expert_id,
           (unsigned long long)e->steps, (unsigned long long)e->tokens_last,
           (unsigned long long)e->tokens_recent, (unsigned long long)e->tokens_total);
  }
}

static int ask_experts(dist_client *one, void *slot, void *arg) {
  (void)arg;
  return dist_experts(one, 0, slot);
}

static int run_experts(const distctl_global *g, int argc, char **argv) {
  if (distctl_take_options(&distctl_cmd_experts, argc, argv, NULL) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  void *slots;
  distctl_answer *a =
      distctl_ask_each(g, c, ask_experts, NULL, sizeof(dist_experts_report), &slots, &down);
  if (!a) return dist_close(c), 1;
  dist_experts_report *rep = slots;
  json_t *ranks = json_array();
  if (!g->json)
    printf("%-5s %-7s %8s %12s %14s %14s\n", "RANK", "EXPERT", "STEPS", "TOKENS_LAST",
           "TOKENS_RECENT", "TOKENS_TOTAL");
  for (int r = 0; r < n; r++) {
    if (!a[r].ok) {
      distctl_table_down(g, c, r, a[r].error, ranks);
      continue;
    }
    json_array_append_new(ranks, experts_rank_json(&rep[r]));
    if (!g->json) print_experts(rep[r].rank, &rep[r]);
    dist_experts_report_free(&rep[r]);
  }
  free(a);
  free(rep);
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down, "ranks", ranks));
  else
    json_decref(ranks);
  dist_close(c);
  return down ? 1 : 0;
}

const distctl_command distctl_cmd_experts = {
    .name = "experts",
    .help = "the experts each rank hosts and the tokens routed to them",
    .run = run_experts,
    .options = distctl_no_options};
