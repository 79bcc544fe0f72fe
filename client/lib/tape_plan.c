/* The op ids an SPMD trainer's tape backward takes: its plan.
 *
 * A trainer that refuses a backward, or fails one mid-way, must abort
 * whatever the other trainers will wait on and take as many op ids as they
 * do, or every later operation of the job runs one id apart. What a
 * backward's steps take depends on its seeds: which outputs have one, and
 * whether each is a stored tensor or values (only the latter are stored
 * first). A trainer that refuses its arguments (a NULL output, say) cannot
 * know the others', so the plan does not read them: it walks the tape as
 * if every tensor the tape produced were seeded, each step taking the most
 * any seed would make it take. That bounds every trainer's backward, and
 * since every trainer recorded the same tape, every trainer plans the same
 * ids: each takes exactly that many, refused, failed or done
 * (tape_backward.c). */
#include <stdlib.h>
#include <string.h>

#include "tape_internal.h"

/* dist_dtensor_from_local (a seed stored), a global_scatter or gather, and
 * dist_reshard each take one op id. */
#define STORE_IDS 1
#define EXCHANGE_IDS 1
#define RESHARD_IDS 1

/* A name's gradient, as far as its ids go: none, a seed the caller gave
 * (values, the loss's 1 or a tensor of the caller's), or one the tape made. */
typedef enum { P_EMPTY, P_SEED, P_MADE } plan_grad;

struct plan_slot {
  const char *name;
  plan_grad g;
};
typedef struct plan_slot plan_slot;

typedef struct plan {
  dist_tape *t;
  plan_slot *slots; /* room for every name on the tape (t->plan_room) */
  int n;
  int ids;
} plan;

static plan_slot *plan_slot_of(plan *p, const char *name) {
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->slots[i].name, name) == 0) return &p->slots[i];
  p->slots[p->n] = (plan_slot){name, P_EMPTY};
  return &p->slots[p->n++];
}

/* A gradient added into name's slot (accumulate): nothing when the slot is
 * empty; else its seed stored, then the add (per rank, or a sum that may
 * reshard first). */
static void plan_merge(plan *p, const char *name) {
  plan_slot *s = plan_slot_of(p, name);
  if (s->g != P_EMPTY) {
    int per_rank = dist_tape_find(p->t->locals, p->t->n_locals, name) != NULL;
    p->ids += (s->g == P_SEED ? STORE_IDS : 0) +
              (per_rank ? dist_grad_add_ids() : dist_grad_sum_ids_max());
  }
  s->g = P_MADE;
}

/* layer_back: no id of its own (it runs under its invocation's) when any
 * output has a gradient; then each tensor input's gradient added. */
static void plan_layer(plan *p, const entry *e) {
  int any = 0;
  for (int k = 0; k < e->n_out; k++) {
    plan_slot *s = plan_slot_of(p, e->outs[k].name);
    any |= s->g != P_EMPTY;
    s->g = P_EMPTY;
  }
  for (int j = 0; any && j < e->n_in; j++)
    if (e->in[j][0]) plan_merge(p, e->in[j]);
}

/* reshard_back: a seed stored or the caller's copied (a grad add), then the
 * reshard; the slot, emptied, takes the result. exchange_back: the other
 * exchange, then its result added into x's slot. */
static void plan_entry(plan *p, const entry *e) {
  if (e->kind == LAYER) {
    plan_layer(p, e);
    return;
  }
  plan_slot *s = plan_slot_of(p, e->y);
  if (s->g == P_EMPTY) return;
  if (e->kind == RESHARD) {
    int copy = dist_grad_add_ids() > STORE_IDS ? dist_grad_add_ids() : STORE_IDS;
    p->ids += (s->g == P_SEED ? copy : 0) + RESHARD_IDS;
    s->g = P_MADE;
    return;
  }
  p->ids += EXCHANGE_IDS;
  s->g = P_EMPTY;
  plan_merge(p, e->x);
}

int dist_tape_plan_reserve(dist_tape *t, int names) {
  while (t->plan_cap <= t->plan_names + names) /* each call doubles it */
    if (dist_tape_reserve((void **)&t->plan_room, &t->plan_cap, t->plan_cap,
                          sizeof *t->plan_room))
      return DIST_ENOMEM;
  t->plan_names += names;
  return 0;
}

/* Every entry reserved its names (2 + inputs + outputs) when recorded, and
 * the room holds one more than all of them. */
int dist_tape_plan_ids(dist_tape *t) {
  plan p = {t, t->plan_room, 0, 0};
  if (!p.slots) return 0; /* nothing recorded */
  for (int i = 0; i < t->n_entries; i++) { /* every tensor it produced, seeded */
    const entry *e = &t->entries[i];
    if (e->kind != LAYER) plan_slot_of(&p, e->y)->g = P_SEED;
    for (int k = 0; e->kind == LAYER && k < e->n_out; k++)
      plan_slot_of(&p, e->outs[k].name)->g = P_SEED;
  }
  for (int i = t->n_entries - 1; i >= 0; i--) plan_entry(&p, &t->entries[i]);
  return p.ids;
}
