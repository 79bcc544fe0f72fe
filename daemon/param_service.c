/* The parameter registry: optimizer state and pending pushes per parameter.
 * See param_service.h. */
#include "param_service.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "peer.h"
#include "tensor.h"

struct distd_param_entry {
  char name[DISTD_NAME_MAX];
  distd_param_cfg cfg;
  /* The layout the state was sized for. A reshard moves the state along or
   * drops the parameter (param_reshard.h); a tensor put over it with
   * another layout makes its pushes fail until it is configured again. */
  dist_dtype dtype;
  dist_shape local;
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
  size_t nbytes;
  void *state[DISTD_OPTIM_STATE_MAX];
  void *accum;          /* synchronous: the sum of this step's pushes */
  unsigned char *pushed; /* synchronous: trainer t pushed for this step */
  int npushed;
  int staged;           /* pushes checked and reserved, not yet applied */
  distd_tensor *spare;  /* synchronous: the next version, allocated when
                         * the staged pushes would complete the update */
  const char *held_for; /* non-NULL: pushes are refused ("resharded") */
  uint64_t step;        /* updates applied */
  size_t reserved;      /* bytes reserved in the store for the above */
  distd_store *store;
  struct distd_param_entry *next;
};
typedef struct distd_param_entry param;

struct distd_params {
  pthread_mutex_t mu;   /* the list and every parameter's state */
  pthread_cond_t updated;
  param *head;
  int rank;             /* this daemon's rank */
};

distd_params *distd_params_new(int rank) {
  distd_params *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  distd_cond_init_monotonic(&p->updated);
  p->rank = rank;
  return p;
}

static param *find(distd_params *p, const char *name) {
  for (param *q = p->head; q; q = q->next)
    if (strcmp(q->name, name) == 0) return q;
  return NULL;
}

static void release_state(param *q) {
  for (int i = 0; i < DISTD_OPTIM_STATE_MAX; i++) free(q->state[i]), q->state[i] = NULL;
  free(q->accum);
  free(q->pushed);
  distd_tensor_unref(q->spare);
  q->spare = NULL;
  q->accum = NULL;
  q->pushed = NULL;
  if (q->reserved) distd_store_release(q->store, q->reserved);
  q->reserved = 0;
}

void distd_params_free(distd_params *p) {
  if (!p) return;
  while (p->head) {
    param *q = p->head;
    p->head = q->next;
    release_state(q);
    free(q);
  }
  pthread_cond_destroy(&p->updated);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

static int check_config(const distd_tensor *t, const distd_param_cfg *cfg,
                        dist_errbuf *eb) {
  if (distd_optim_check_dtype(t->dtype, eb) != 0) return eb ? eb->code : DIST_ENOTSUP;
  int partial = dist_placements_partial_dim(t->placements, t->nplacements);
  if (partial >= 0)
    return dist_fail(eb, DIST_ENOTSUP, "parameter '%s' has a Partial placement "
                     "on mesh dim %d: reshard it to Shard or Replicate first",
                     t->name, partial);
  /* An unknown one by its value: it read "by sum or avg, not invalid". */
  if (cfg->reduce < DIST_REDUCE_SUM || cfg->reduce > DIST_REDUCE_ALL)
    return dist_fail(eb, DIST_EINVAL, "gradients are reduced over trainers by "
                     "sum or avg, not by unknown reduction %d", (int)cfg->reduce);
  if (cfg->reduce != DIST_REDUCE_SUM && cfg->reduce != DIST_REDUCE_AVG)
    return dist_fail(eb, DIST_EINVAL, "gradients are reduced over trainers by "
                     "sum or avg, not %s", dist_reduce_name(cfg->reduce));
  if (cfg->trainers < 1 || cfg->trainers > 65536)
    return dist_fail(eb, DIST_EINVAL, "trainers = %d: must be 1 to 65536",
                     cfg->trainers);
  return distd_optim_check(&cfg->optim, eb);
}

/* Allocates state for t's shard into q (zeroed), reserving the memory. */
static int alloc_state(param *q, distd_store *st, const distd_tensor *t,
                       dist_errbuf *eb) {
  int nstate = distd_optim_state_count(&q->cfg.optim);
  size_t need = t->nbytes * (size_t)(nstate + !q->cfg.async);
  if (distd_store_reserve(st, need, eb) != 0) {
    dist_errbuf_prefix(eb, "optimizer state of '%s': ", t->name);
    return eb ? eb->code : DIST_ENOMEM;
  }
  q->store = st;
  q->reserved = need;
  for (int i = 0; i < nstate; i++) q->state[i] = calloc(1, t->nbytes + 1);
  if (!q->cfg.async) q->accum = calloc(1, t->nbytes + 1);
  q->pushed = calloc((size_t)q->cfg.trainers, 1);
  if ((nstate > 0 && !q->state[0]) || (nstate > 1 && !q->state[1]) ||
      (!q->cfg.async && !q->accum) || !q->pushed) {
    release_state(q);
    return dist_fail(eb, DIST_ENOMEM, "cannot allocate the optimizer state of '%s'",
                     t->name);
  }
  return 0;
}

static void take_layout(param *q, const distd_tensor *t) {
  q->dtype = t->dtype;
  q->local = t->local;
  q->mesh = t->mesh;
  memcpy(q->placements, t->placements, sizeof q->placements);
  q->nbytes = t->nbytes;
}

int distd_param_prepare(distd_store *st, const distd_tensor *t,
                        const distd_param_cfg *cfg, uint64_t step,
                        const void *const *state, distd_param_entry **out,
                        dist_errbuf *eb) {
  *out = NULL;
  int rc = check_config(t, cfg, eb);
  if (rc != 0) return rc;
  param *q = calloc(1, sizeof *q);
  if (!q) return dist_fail(eb, DIST_ENOMEM, "out of memory configuring '%s'", t->name);
  snprintf(q->name, sizeof q->name, "%s", t->name);
  q->cfg = *cfg;
  if ((rc = alloc_state(q, st, t, eb)) != 0) {
    free(q);
    return rc;
  }
  take_layout(q, t);
  /* An empty shard's state arrives as NULL (protobuf's empty bytes), and
   * memcpy from NULL is undefined even for 0 bytes. */
  for (int i = 0; state && t->nbytes && i < distd_optim_state_count(&cfg->optim); i++)
    memcpy(q->state[i], state[i], t->nbytes);
  q->step = step;
  *out = q;
  return 0;
}

void distd_param_entry_free(distd_param_entry *e) {
  if (!e) return;
  release_state(e);
  free(e);
}

/* With mu held: marks name's entry so that new pushes are refused (they
 * are told it is being `why`), then waits until none of its pushes is
 * staged any more. A staged push settles within its call's deadline (the
 * verdict exchange is bounded by it), so the wait ends; until_ms >= 0 bounds
 * it further, and *timed_out (may be NULL then) says it ran out. Returns
 * the entry, NULL when name is not a parameter. */
static param *quiesce(distd_params *p, const char *name, const char *why,
                      int64_t until_ms, int *timed_out) {
  for (;;) {
    param *q = find(p, name); /* found again after each wait: it may change */
    if (!q) return NULL;
    q->held_for = why;
    if (q->staged == 0) return q;
    int64_t now = distd_now_ms();
    if (until_ms >= 0 && now >= until_ms) {
      *timed_out = 1;
      return q;
    }
    distd_cond_wait_until_ms(&p->updated, &p->mu, until_ms >= 0 ? until_ms : now + 1000);
  }
}

/* Unlinks name's entry, if any, once no push is staged on it, and returns
 * it. Called with mu held. */
static param *unlink_param(distd_params *p, const char *name) {
  quiesce(p, name, "replaced", -1, NULL);
  for (param **at = &p->head; *at; at = &(*at)->next)
    if (strcmp((*at)->name, name) == 0) {
      param *q = *at;
      *at = q->next;
      return q;
    }
  return NULL;
}

void distd_param_install(distd_params *p, distd_param_entry *e) {
  pthread_mutex_lock(&p->mu);
  param *old = unlink_param(p, e->name);
  e->next = p->head;
  p->head = e;
  pthread_mutex_unlock(&p->mu);
  distd_param_entry_free(old);
}

void distd_param_forget(distd_params *p, const char *name) {
  pthread_mutex_lock(&p->mu);
  param *old = unlink_param(p, name);
  pthread_mutex_unlock(&p->mu);
  distd_param_entry_free(old);
}

/* The restored state must be what cfg's optimizer keeps for t's piece. */
static int check_restore(const distd_tensor *t, const distd_param_cfg *cfg,
                         const distd_param_restore *r, dist_errbuf *eb) {
  int want = distd_optim_state_count(&cfg->optim);
  if (r->nstate != want)
    return dist_fail(eb, DIST_EINVAL, "restoring parameter '%s': %d state buffers given, "
                     "%s keeps %d", t->name, r->nstate, distd_optim_name(cfg->optim.kind),
                     want);
  for (int k = 0; k < want; k++)
    if (r->nbytes[k] != t->nbytes)
      return dist_fail(eb, DIST_EMISMATCH, "restoring parameter '%s': state buffer %d "
                       "has %zu bytes, this daemon's piece %zu", t->name, k, r->nbytes[k],
                       t->nbytes);
  return 0;
}

int distd_param_configure(distd_store *st, const char *name, const distd_param_cfg *cfg,
                          const distd_param_restore *restore, distd_param_entry **out,
                          dist_errbuf *eb) {
  *out = NULL;
  distd_tensor *t = NULL;
  if (distd_store_get(st, name, &t, eb) != 0) return eb ? eb->code : DIST_ENOTFOUND;
  int rc = restore ? check_restore(t, cfg, restore, eb) : 0;
  if (rc == 0)
    rc = distd_param_prepare(st, t, cfg, restore ? restore->step : 0,
                             restore ? restore->state : NULL, out, eb);
  distd_tensor_unref(t);
  return rc;
}

/* What a tune may not change: all that shapes the state and the sums. */
static int check_tune(const param *q, const distd_param_cfg *cfg, dist_errbuf *eb) {
  const char *what = cfg->optim.kind != q->cfg.optim.kind ? "the optimizer"
                     : cfg->reduce != q->cfg.reduce       ? "the reduction over trainers"
                     : cfg->async != q->cfg.async         ? "the consistency mode"
                     : cfg->trainers != q->cfg.trainers   ? "the number of trainers"
                     : distd_optim_state_count(&cfg->optim) !=
                             distd_optim_state_count(&q->cfg.optim)
                         ? "whether SGD keeps a momentum buffer"
                         : NULL;
  if (what)
    return dist_fail(eb, DIST_EINVAL, "tuning parameter '%s' keeps its optimizer state, "
                     "so %s cannot change: configure it again instead (the state starts "
                     "afresh)", q->name, what);
  return distd_optim_check(&cfg->optim, eb);
}

int distd_param_tune(distd_params *p, const char *name, const distd_param_cfg *cfg,
                     int apply, dist_errbuf *eb) {
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  int rc = q ? check_tune(q, cfg, eb)
             : dist_fail(eb, DIST_ENOTFOUND, "'%s' is not a parameter (configure it "
                         "with an optimizer first)", name);
  if (rc == 0 && apply) q->cfg.optim = cfg->optim;
  pthread_mutex_unlock(&p->mu);
  return rc;
}

/* The stored tensor must still have the layout the state was made for. */
static int check_layout(const param *q, const distd_tensor *t, dist_errbuf *eb) {
  if (t->dtype == q->dtype && dist_shape_equal(&t->local, &q->local) &&
      dist_mesh_equal(&t->mesh, &q->mesh) &&
      memcmp(t->placements, q->placements,
             sizeof(dist_placement) * (size_t)q->mesh.ndim) == 0)
    return 0;
  return dist_fail(eb, DIST_EMISMATCH, "parameter '%s' changed layout since it "
                   "was configured (resharded or replaced): configure it again",
                   q->name);
}

static int check_push(const param *q, int trainer, uint64_t expect_step,
                      size_t nbytes, int rank, dist_errbuf *eb) {
  if (nbytes != q->nbytes) {
    char ls[96];
    dist_shape_format(&q->local, ls, sizeof ls);
    return dist_fail(eb, DIST_EMISMATCH, "gradient for '%s' has %zu bytes, but "
                     "rank %d's shard is %s %s = %zu bytes", q->name, nbytes,
                     rank, ls, dist_dtype_name(q->dtype), q->nbytes);
  }
  if (trainer < 0 || trainer >= q->cfg.trainers)
    return dist_fail(eb, DIST_EINVAL, "trainer %d out of range: '%s' expects "
                     "trainers 0 to %d", trainer, q->name, q->cfg.trainers - 1);
  if (expect_step && expect_step != q->step + 1)
    return dist_fail(eb, DIST_EINVAL, "push for update %llu of '%s', but the "
                     "next update is %llu", (unsigned long long)expect_step,
                     q->name, (unsigned long long)(q->step + 1));
  if (!q->cfg.async && q->pushed[trainer])
    return dist_fail(eb, DIST_EEXIST, "trainer %d already pushed its gradient "
                     "for update %llu of '%s' (%d of %d trainers pushed)",
                     trainer, (unsigned long long)(q->step + 1), q->name,
                     q->npushed, q->cfg.trainers);
  return 0;
}

/* Applies grad to a copy of cur, stores the copy (version + 1) and drops
 * the caller's reference to it. */
static void apply_update(param *q, distd_store *st, distd_tensor *cur,
                         distd_tensor *next, const void *grad,
                         distd_push_result *res) {
  memcpy(next->data, cur->data, cur->nbytes);
  distd_optim_step(&q->cfg.optim, q->dtype, q->nbytes / dist_dtype_size(q->dtype),
                   next->data, grad, q->state, q->step + 1);
  q->step++;
  distd_store_put(st, next, 1, NULL); /* replacing never fails */
  res->version = next->version;
  res->applied = 1;
  distd_tensor_unref(next);
}

static int new_like(distd_store *st, const distd_tensor *t, int rank,
                    distd_tensor **out, dist_errbuf *eb) {
  return distd_tensor_new(st, t->name, t->dtype, &t->global, &t->mesh,
                          t->placements, rank, out, eb);
}

/* Allocates what applying the push needs, so that distd_param_commit cannot
 * run out of memory: the new version for an asynchronous push; for a
 * synchronous one, once the pushes made and staged would complete the
 * update, the new version that update stores (q->spare). */
static int reserve_push(distd_params *p, param *q, distd_store *st,
                        const distd_tensor *cur, int trainer,
                        distd_push_ticket *tk, dist_errbuf *eb) {
  if (q->cfg.async) {
    if (new_like(st, cur, p->rank, &tk->next, eb) != 0) return eb ? eb->code : DIST_ENOMEM;
  } else {
    if (q->npushed + q->staged + 1 == q->cfg.trainers && !q->spare &&
        new_like(st, cur, p->rank, &q->spare, eb) != 0)
      return eb ? eb->code : DIST_ENOMEM;
    q->pushed[trainer] = 1; /* the same trainer again is refused meanwhile */
  }
  q->staged++;
  tk->entry = q;
  tk->trainer = trainer;
  return 0;
}

/* The push was made for the layout in spec (when it names one): a reshard
 * since then moved the boxes its bytes belong to. */
static int check_made_for(const param *q, const distd_push_spec *spec, dist_errbuf *eb) {
  if (!spec->mesh) return 0;
  if (dist_mesh_equal(spec->mesh, &q->mesh) &&
      (!spec->placements || memcmp(spec->placements, q->placements,
                                   sizeof(dist_placement) * (size_t)q->mesh.ndim) == 0))
    return 0;
  char now_p[128], now_m[256];
  dist_placements_text(q->placements, q->mesh.ndim, now_p, sizeof now_p);
  dist_mesh_format(&q->mesh, now_m, sizeof now_m);
  return dist_fail(eb, DIST_EUNAVAIL, "parameter '%s' was resharded since this push "
                   "was made for it (it is %s on mesh %s now): push again (nothing "
                   "was changed)", q->name, now_p, now_m);
}

/* A push to a daemon outside the parameter's mesh was told "not a
 * parameter (configure it ...)" of a parameter configured on its mesh. */
static int not_a_param(distd_store *st, const char *name, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  if (distd_store_get(st, name, &t, NULL) != 0)
    return dist_fail(eb, DIST_ENOTFOUND, "this daemon holds no piece of '%s': push to "
                     "the daemons of its mesh", name);
  distd_tensor_unref(t);
  return dist_fail(eb, DIST_ENOTFOUND, "'%s' is not a parameter (configure it with an "
                   "optimizer first)", name);
}

int distd_param_stage(distd_params *p, distd_store *st, const distd_push_spec *spec,
                      distd_push_ticket *tk, dist_errbuf *eb) {
  memset(tk, 0, sizeof *tk);
  distd_tensor *cur = NULL;
  int rc;
  pthread_mutex_lock(&p->mu);
  param *q = find(p, spec->name);
  if (!q) {
    rc = not_a_param(st, spec->name, eb);
    goto out;
  }
  if (q->held_for) {
    rc = dist_fail(eb, DIST_EUNAVAIL, "parameter '%s' is being %s; push again once "
                   "that is done (nothing was changed)", q->name, q->held_for);
    goto out;
  }
  if ((rc = distd_store_get(st, q->name, &cur, eb)) != 0) goto out;
  if ((rc = check_layout(q, cur, eb)) != 0) goto out;
  if ((rc = check_made_for(q, spec, eb)) != 0) goto out;
  if ((rc = check_push(q, spec->trainer, spec->expect_step, spec->nbytes, p->rank, eb)) != 0)
    goto out;
  rc = reserve_push(p, q, st, cur, spec->trainer, tk, eb);
out:
  pthread_mutex_unlock(&p->mu);
  distd_tensor_unref(cur);
  return rc;
}

/* Undoes reserve_push. Called with mu held. */
static void unreserve_push(param *q, distd_push_ticket *tk) {
  q->staged--;
  if (!q->cfg.async) {
    q->pushed[tk->trainer] = 0;
    if (q->spare && q->npushed + q->staged < q->cfg.trainers) {
      distd_tensor_unref(q->spare);
      q->spare = NULL;
    }
  }
}

/* Adds a staged push to the update; applies the update when it completes
 * it. Called with mu held. */
static void apply_push(param *q, distd_store *st, distd_tensor *cur,
                       distd_push_ticket *tk, const void *grad, distd_push_result *res) {
  size_t n = q->nbytes / dist_dtype_size(q->dtype);
  q->staged--;
  res->version = cur->version;
  if (q->cfg.async) {
    apply_update(q, st, cur, tk->next, grad, res);
    tk->next = NULL;
  } else {
    if (q->npushed == 0 && q->nbytes) /* an empty shard's gradient may be NULL */
      memcpy(q->accum, grad, q->nbytes);
    else if (q->npushed)
      dist_reduce_into(q->accum, grad, n, q->dtype, DIST_REDUCE_SUM);
    if (++q->npushed == q->cfg.trainers) {
      dist_reduce_finish(q->accum, n, q->dtype, q->cfg.reduce, q->cfg.trainers);
      apply_update(q, st, cur, q->spare, q->accum, res);
      q->spare = NULL;
      memset(q->pushed, 0, (size_t)q->cfg.trainers);
      q->npushed = 0;
    }
  }
  res->step = q->step;
  res->pending = q->npushed;
}

int distd_param_commit(distd_params *p, distd_store *st, distd_push_ticket *tk,
                       const void *grad, distd_push_result *res, dist_errbuf *eb) {
  memset(res, 0, sizeof *res);
  distd_tensor *cur = NULL;
  pthread_mutex_lock(&p->mu);
  param *q = tk->entry;
  /* The entry stays while the push is staged (quiesce); its tensor may
   * have been deleted or put over with another layout meanwhile. */
  int rc = distd_store_get(st, q->name, &cur, eb);
  if (rc == 0) rc = check_layout(q, cur, eb);
  if (rc == 0) apply_push(q, st, cur, tk, grad, res);
  else unreserve_push(q, tk);
  pthread_cond_broadcast(&p->updated);
  pthread_mutex_unlock(&p->mu);
  distd_tensor_unref(cur);
  distd_tensor_unref(tk->next);
  memset(tk, 0, sizeof *tk);
  return rc;
}

void distd_param_abort(distd_params *p, distd_push_ticket *tk) {
  if (!tk->entry) return;
  pthread_mutex_lock(&p->mu);
  unreserve_push(tk->entry, tk);
  pthread_cond_broadcast(&p->updated);
  pthread_mutex_unlock(&p->mu);
  distd_tensor_unref(tk->next);
  memset(tk, 0, sizeof *tk);
}

int distd_param_pull(distd_params *p, distd_store *st, const char *name,
                     uint64_t min_version, int64_t deadline_ms,
                     distd_tensor **out, uint64_t *step, dist_errbuf *eb) {
  *out = NULL;
  *step = 0;
  pthread_mutex_lock(&p->mu);
  int rc = 0;
  for (;;) {
    distd_tensor *t = NULL;
    if ((rc = distd_store_get(st, name, &t, eb)) != 0) break;
    if (t->version >= min_version) {
      param *q = find(p, name);
      *step = q ? q->step : 0;
      *out = t;
      break;
    }
    uint64_t have = t->version;
    distd_tensor_unref(t);
    int64_t now = distd_now_ms();
    if (now >= deadline_ms) {
      rc = dist_fail(eb, DIST_ETIMEDOUT, "'%s' is at version %llu; version %llu "
                     "did not come before the deadline", name,
                     (unsigned long long)have, (unsigned long long)min_version);
      break;
    }
    /* Updates by this module signal at once; other writers (TensorPut with
     * replace, reshard) are seen within the poll interval. */
    int64_t wake = deadline_ms < now + 50 ? deadline_ms : now + 50;
    distd_cond_wait_until_ms(&p->updated, &p->mu, wake);
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

int distd_param_pending(distd_params *p, const char *name) {
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  int n = q ? q->npushed : -1;
  pthread_mutex_unlock(&p->mu);
  return n;
}

int distd_param_pause_pushes(distd_params *p, const char *name, int64_t deadline_ms,
                             int *is_param, dist_errbuf *eb) {
  int timed_out = 0;
  pthread_mutex_lock(&p->mu);
  param *q = quiesce(p, name, "resharded", deadline_ms, &timed_out);
  if (timed_out) q->held_for = NULL;
  pthread_mutex_unlock(&p->mu);
  *is_param = q != NULL;
  if (!timed_out) return 0;
  return dist_fail(eb, DIST_EUNAVAIL, "a push to parameter '%s' was still being applied at "
                   "the deadline; reshard again (nothing was changed)", name);
}

void distd_param_resume_pushes(distd_params *p, const char *name) {
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  if (q) q->held_for = NULL;
  pthread_mutex_unlock(&p->mu);
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const distd_param_info *)a)->name, ((const distd_param_info *)b)->name);
}

int distd_param_list(distd_params *p, distd_store *st, distd_param_info **out, int *n,
                     dist_errbuf *eb) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&p->mu);
  int count = 0;
  for (param *q = p->head; q; q = q->next) count++;
  distd_param_info *list = calloc((size_t)count + 1, sizeof *list);
  for (param *q = p->head; list && q; q = q->next) {
    distd_param_info *i = &list[(*n)++];
    snprintf(i->name, sizeof i->name, "%s", q->name);
    i->cfg = q->cfg;
    i->step = q->step;
    i->pending = q->npushed;
    i->state_bytes = q->reserved;
    i->held_for = q->held_for;
    distd_tensor *t = NULL;
    if (distd_store_get(st, q->name, &t, NULL) == 0) i->version = t->version;
    distd_tensor_unref(t);
  }
  pthread_mutex_unlock(&p->mu);
  if (!list) return dist_fail(eb, DIST_ENOMEM, "out of memory listing parameters");
  qsort(list, (size_t)*n, sizeof *list, by_name);
  *out = list;
  return 0;
}

int distd_param_layout(distd_params *p, const char *name, dist_dtype *dt,
                       dist_mesh_desc *mesh, dist_placement *placements) {
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  if (q) {
    *dt = q->dtype;
    *mesh = q->mesh;
    memcpy(placements, q->placements, sizeof q->placements);
  }
  pthread_mutex_unlock(&p->mu);
  return q != NULL;
}

int distd_param_snapshot_take(distd_params *p, distd_store *st, const char *name,
                              distd_param_snapshot *s, dist_errbuf *eb) {
  memset(s, 0, sizeof *s);
  distd_tensor *t = NULL;
  int rc = 0;
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  /* A parameter resharded or replaced since it was configured has no
   * state that goes with its values (its next push is refused). */
  if (!q || distd_store_get(st, name, &t, NULL) != 0 || check_layout(q, t, NULL) != 0)
    goto out;
  int n = distd_optim_state_count(&q->cfg.optim);
  if ((rc = distd_store_reserve(st, q->nbytes * (size_t)n, eb)) != 0) {
    dist_errbuf_prefix(eb, "copying the optimizer state of '%s': ", name);
    goto out;
  }
  s->store = st;
  s->reserved = q->nbytes * (size_t)n;
  for (int i = 0; i < n && rc == 0; i++) {
    if (!(s->state[i] = malloc(q->nbytes + 1)))
      rc = dist_fail(eb, DIST_ENOMEM, "cannot copy the optimizer state of '%s'", name);
    else
      memcpy(s->state[i], q->state[i], q->nbytes);
  }
  s->cfg = q->cfg;
  s->step = q->step;
  s->nstate = n;
  s->tensor = t; /* taken under mu: the values this state belongs to */
  t = NULL;
out:
  pthread_mutex_unlock(&p->mu);
  distd_tensor_unref(t);
  if (rc != 0) distd_param_snapshot_free(s);
  return rc;
}

void distd_param_snapshot_free(distd_param_snapshot *s) {
  for (int i = 0; i < DISTD_OPTIM_STATE_MAX; i++) free(s->state[i]);
  if (s->reserved) distd_store_release(s->store, s->reserved);
  distd_tensor_unref(s->tensor);
  memset(s, 0, sizeof *s);
}
