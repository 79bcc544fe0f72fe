/* The parameter service: stored tensors trained in place (semantics.md,
 * "Parameter service"). A parameter is a stored float tensor with an
 * optimizer, a reduction over trainers and a consistency mode. Its optimizer
 * state (momentum, Adam's m and v) lives here, next to this daemon's shard,
 * reserved against the store's memory limit.
 *
 * Every update inserts a new tensor under the parameter's name, so its
 * version increases by one and readers never see a half-applied step.
 *  - synchronous: pushes for a step are accumulated (summed, or averaged
 *    over the configured number of trainers); the update happens when every
 *    trainer 0..N-1 has pushed once. A second push from the same trainer
 *    before the update is refused.
 *  - asynchronous: each push is applied at once, as given (no reduction).
 *
 * The registry is per daemon. Every entry point is thread-safe. */
#ifndef DISTD_PARAM_SERVICE_H
#define DISTD_PARAM_SERVICE_H

#include <stdint.h>

#include "optimizer.h"
#include "store.h"

typedef struct distd_params distd_params;
/* One parameter ready to be installed, its state allocated and reserved. */
typedef struct distd_param_entry distd_param_entry;

typedef struct distd_param_cfg {
  distd_optim_cfg optim;
  dist_reduce reduce; /* DIST_REDUCE_SUM or DIST_REDUCE_AVG */
  int async;
  int trainers;       /* >= 1 */
} distd_param_cfg;

/* A daemon's empty registry (distd_server.params) for the daemon of rank
 * `rank`; NULL when out of memory. */
distd_params *distd_params_new(int rank);
/* Drops every parameter and its optimizer state, releasing the state's
 * reservations in the store: call it before the store is freed. NULL is a
 * no-op. */
void distd_params_free(distd_params *p);

/* The entry that makes the stored tensor `name` a parameter, or
 * reconfigures it (state and pending pushes reset) once the caller
 * installs it (distd_param_install): distd_param_prepare for name's
 * tensor. Fails, with nothing changed, for a missing tensor, a non-float
 * dtype, Partial placements, bad hyper-parameters, restored state that
 * does not fit, or when the state does not fit the memory limit. */
/* Restoring a parameter onto another layout: this daemon's pieces of the
 * state buffers (nbytes[k] each, which must be the shard's size; as many
 * as the optimizer keeps) and the updates applied so far. */
typedef struct distd_param_restore {
  uint64_t step;
  int nstate;
  const void *state[DISTD_OPTIM_STATE_MAX];
  size_t nbytes[DISTD_OPTIM_STATE_MAX];
} distd_param_restore;
/* restore NULL: the state starts afresh. */
int distd_param_configure(distd_store *st, const char *name, const distd_param_cfg *cfg,
                          const distd_param_restore *restore, distd_param_entry **out,
                          dist_errbuf *eb);

/* A parameter's hyper-parameters from cfg, keeping its state (a
 * learning-rate schedule): cfg's optimizer kind, reduce, consistency,
 * trainers and state buffer count must be those configured, else it
 * fails naming the one that differs. apply 0 checks only. */
int distd_param_tune(distd_params *p, const char *name, const distd_param_cfg *cfg,
                     int apply, dist_errbuf *eb);

/* What a push did. */
typedef struct distd_push_result {
  uint64_t version; /* the parameter's version afterwards */
  uint64_t step;    /* updates applied so far */
  int pending;      /* synchronous: pushes waiting for the next update */
  int applied;      /* this push completed an update */
} distd_push_result;

/* One trainer's gradient for this daemon's shard, in two steps, so that
 * the daemons of a mesh can apply a push all together or not at all
 * (vote.h). distd_param_stage makes every check and allocates what
 * applying needs, so that distd_param_commit cannot fail for want of
 * memory; distd_param_abort undoes it. Meanwhile the trainer counts as
 * having pushed (a second push of it is refused), and a reshard,
 * configure, restore or delete of the parameter waits for the push to be
 * committed or aborted. */
typedef struct distd_push_spec {
  const char *name;
  int trainer;
  uint64_t expect_step;  /* the update the push belongs to (1-based); 0 = any */
  size_t nbytes;         /* the gradient: nbytes laid out as the shard */
  /* The layout the gradient was made for (NULL: not checked); a push made
   * before a reshard is refused (DIST_EUNAVAIL). */
  const dist_mesh_desc *mesh;
  const dist_placement *placements; /* mesh->ndim of them; NULL: not checked */
} distd_push_spec;

/* A staged push. */
typedef struct distd_push_ticket {
  struct distd_param_entry *entry; /* NULL: nothing staged */
  int trainer;
  distd_tensor *next; /* asynchronous: the version the push makes */
} distd_push_ticket;
/* Fails with nothing changed for a wrong size, trainer, step or layout,
 * or while the parameter is held (DIST_EUNAVAIL). */
int distd_param_stage(distd_params *p, distd_store *st, const distd_push_spec *spec,
                      distd_push_ticket *tk, dist_errbuf *eb);
/* Applies the staged push (grad: nbytes as staged). Fails, undoing the
 * stage, only when the parameter's tensor was deleted or put over with
 * another layout since. */
int distd_param_commit(distd_params *p, distd_store *st, distd_push_ticket *tk,
                       const void *grad, distd_push_result *res, dist_errbuf *eb);
/* A no-op for a ticket already committed or aborted. */
void distd_param_abort(distd_params *p, distd_push_ticket *tk);

/* The parameter (or any stored tensor) once its version is >= min_version,
 * waiting until deadline_ms (distd_now_ms clock). *out is a new reference;
 * *step the updates applied (0 for a plain tensor). */
int distd_param_pull(distd_params *p, distd_store *st, const char *name,
                     uint64_t min_version, int64_t deadline_ms,
                     distd_tensor **out, uint64_t *step, dist_errbuf *eb);

/* Pushes waiting for name's next synchronous update on this daemon (0 for
 * an asynchronous parameter); -1 when name is not a parameter. */
int distd_param_pending(distd_params *p, const char *name);

/* While an in-place reshard of name runs, its pushes are refused
 * (DIST_EUNAVAIL): one applied meanwhile would be lost under the resharded
 * values. Pushes already staged are waited for, until deadline_ms; then it
 * fails, pausing nothing. *is_param says whether name is a parameter. The
 * caller holds the name (holds.h) and calls distd_param_resume_pushes when
 * the reshard is over (a no-op once it installed a new entry or dropped
 * the parameter). */
int distd_param_pause_pushes(distd_params *p, const char *name, int64_t deadline_ms,
                             int *is_param, dist_errbuf *eb);
void distd_param_resume_pushes(distd_params *p, const char *name);

/* One parameter as this daemon holds it, for inspection. */
typedef struct distd_param_info {
  char name[DISTD_NAME_MAX];
  distd_param_cfg cfg;
  uint64_t step;        /* updates applied */
  int pending;          /* synchronous: pushes waiting for the next update */
  size_t state_bytes;   /* reserved for the optimizer state and the sums */
  uint64_t version;     /* the tensor's here (0 when it is gone) */
  const char *held_for; /* NULL, or why pushes are refused ("resharded") */
} distd_param_info;
/* Every parameter, by name: *out malloc'd (free()), *n of them. */
int distd_param_list(distd_params *p, distd_store *st, distd_param_info **out, int *n,
                     dist_errbuf *eb);

/* Whether name is a parameter; its dtype, mesh and placements when it is. */
int distd_param_layout(distd_params *p, const char *name, dist_dtype *dt,
                       dist_mesh_desc *mesh, dist_placement *placements);

/* ---- parameters in checkpoints (param_ckpt.c) ---- */

/* Builds the entry of parameter t->name for stored tensor t's layout, with
 * `step` updates applied so far and state[i] (t->nbytes each, as many as
 * distd_optim_state_count says; NULL = zeroed) copied in. Fails, reserving
 * nothing, as distd_param_configure does. */
int distd_param_prepare(distd_store *st, const distd_tensor *t,
                        const distd_param_cfg *cfg, uint64_t step,
                        const void *const *state, distd_param_entry **out,
                        dist_errbuf *eb);
/* Makes e the parameter of its name, replacing (and freeing) any before
 * once its staged pushes settled: cannot fail. p owns e afterwards. */
void distd_param_install(distd_params *p, distd_param_entry *e);
void distd_param_entry_free(distd_param_entry *e); /* NULL is a no-op */
/* name is no longer a parameter (no-op when it was not), once its staged
 * pushes settled. */
void distd_param_forget(distd_params *p, const char *name);

/* A parameter's optimizer state, copied together with the stored tensor it
 * belongs to (no update can fall between the two). */
typedef struct distd_param_snapshot {
  distd_tensor *tensor;  /* NULL: name is not a parameter with live state */
  distd_param_cfg cfg;
  uint64_t step;
  int nstate;
  void *state[DISTD_OPTIM_STATE_MAX]; /* tensor->nbytes each */
  distd_store *store;
  size_t reserved;       /* the copies, reserved against the memory limit */
} distd_param_snapshot;

/* Fills s when `name` is a parameter whose layout is the one it was
 * configured for; leaves s->tensor NULL otherwise (not an error). Pending
 * pushes of an unfinished synchronous update are not part of it. */
int distd_param_snapshot_take(distd_params *p, distd_store *st, const char *name,
                              distd_param_snapshot *s, dist_errbuf *eb);
void distd_param_snapshot_free(distd_param_snapshot *s);

#endif
