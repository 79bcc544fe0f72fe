/* The tape's entries, gradient slots and the pieces its files share:
 * recording (tape.c) and backward (tape_backward.c). Not installed. */
#ifndef DIST_TAPE_INTERNAL_H
#define DIST_TAPE_INTERNAL_H

#include "client_internal.h"

#define NAME_MAX_LEN 256

typedef enum { SCATTER, GATHER, LAYER, RESHARD } entry_kind;

/* Ranks whose daemons each hold their own piece under one name. */
typedef struct rank_set {
  int n;
  int ranks[DIST_MAX_MESH_RANKS];
} rank_set;

typedef struct entry {
  entry_kind kind;
  /* exchanges: x -> y; a reshard: x = y, the tensor it changed */
  char x[NAME_MAX_LEN], y[NAME_MAX_LEN];
  dist_tensor before; /* a reshard: the tensor's handle before it */
  dist_dtype dt;
  int64_t d_model;
  int experts, group_size;
  int group[DIST_MAX_MESH_RANKS];
  rank_set parts;      /* the daemons this client drove, in group order */
  int64_t *lc, *gc;    /* parts.n arrays of group_size * experts counts */
  /* LocalLayer */
  dist_invocation *inv;
  int nranks;                /* daemons of the call (VALUE order) */
  int n_in, n_out;
  char (*in)[NAME_MAX_LEN];  /* "" for non-tensor arguments */
  dist_tensor *outs;         /* copies of the output handles */
} entry;

typedef enum { G_NONE, G_ONES, G_VALUES, G_TENSOR } grad_kind;

/* The gradient of one tensor name. */
typedef struct slot {
  char name[NAME_MAX_LEN];
  grad_kind kind;
  const dist_value *values; /* G_VALUES: the caller's, during backward */
  dist_tensor t;            /* G_TENSOR: its name, and mesh when not per rank */
  int per_rank;             /* G_TENSOR: one piece per daemon of ranks */
  rank_set ranks;
  int owned;                /* G_TENSOR made by the tape: delete when done */
} slot;

struct dist_tape {
  dist_client *c;
  char prefix[64];
  uint64_t next_grad;
  entry *entries;
  int n_entries, cap_entries;
  slot *slots;
  int n_slots, cap_slots;
  /* Names the tape's exchanges read or wrote: their pieces are per rank. */
  slot *locals;
  int n_locals, cap_locals;
  /* Room for the plan's slots (tape_plan.c), reserved as entries are
   * recorded: a backward's plan then never fails for memory, which would
   * leave this trainer one op id apart from the others. */
  struct plan_slot *plan_room;
  int plan_names, plan_cap;
  /* Gradient names a failed backward may have left on daemons that did
   * not answer it: deleted by dist_tape_free, which hands what stays to
   * the client's list, an SPMD trainer's too: a tape's names are this
   * process's alone (dist_later_of_made_up says why). */
  dist_later later;
  int done;     /* backpropagated (or tried to) */
  int released;
};

/* ---------------------------------------------------------------- tape.c */

/* Makes room for element n of *arr (capacity *cap, doubled; new room zeroed). */
int dist_tape_reserve(void **arr, int *cap, int n, size_t elem);
/* 0, or the client's error when t was released or already backpropagated. */
int dist_tape_usable(dist_tape *t, const char *what);
/* The slot named name among s[0..n), or NULL. */
slot *dist_tape_find(slot *s, int n, const char *name);
void dist_tape_slot_clear(dist_tape *t, slot *s);
int dist_tape_exchange_refused(dist_client *c, const int *group, int size);

/* ----------------------------------------------------------- tape_plan.c */

/* Room in the plan for `names` more tensor names of an entry being
 * recorded; DIST_ENOMEM when there is none. */
int dist_tape_plan_reserve(dist_tape *t, int names);
/* The op ids an SPMD trainer's backward of t takes, the same on every
 * trainer (from the tape alone, not the seeds), in the room reserved. */
int dist_tape_plan_ids(dist_tape *t);

#endif
