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
  int held;             /* an in-place reshard runs: pushes are refused */
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
  for (int i = 0; state && i < distd_optim_state_count(&cfg->optim); i++)
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

/* Unlinks name's entry, if any, and returns it. Called with mu held. */
static param *unlink_param(distd_params *p, const char *name) {
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

int distd_param_configure(distd_params *p, distd_store *st, const char *name,
                          const distd_param_cfg *cfg, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  if (distd_store_get(st, name, &t, eb) != 0) return eb ? eb->code : DIST_ENOTFOUND;
  distd_param_entry *e = NULL;
  int rc = distd_param_prepare(st, t, cfg, 0, NULL, &e, eb);
  if (rc == 0) distd_param_install(p, e);
  distd_tensor_unref(t);
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

/* Applies grad to a copy of cur and stores the copy (version + 1). */
static int apply_update(param *q, distd_store *st, distd_tensor *cur,
                        distd_tensor *next, const void *grad,
                        distd_push_result *res) {
  memcpy(next->data, cur->data, cur->nbytes);
  distd_optim_step(&q->cfg.optim, q->dtype, q->nbytes / dist_dtype_size(q->dtype),
                   next->data, grad, q->state, q->step + 1);
  q->step++;
  distd_store_put(st, next, 1, NULL); /* replacing never fails */
  res->version = next->version;
  res->applied = 1;
  return 0;
}

static int new_like(distd_store *st, const distd_tensor *t, int rank,
                    distd_tensor **out, dist_errbuf *eb) {
  return distd_tensor_new(st, t->name, t->dtype, &t->global, &t->mesh,
                          t->placements, rank, out, eb);
}

static int push_locked(distd_params *p, param *q, distd_store *st,
                       distd_tensor *cur, int trainer, const void *grad,
                       distd_push_result *res, dist_errbuf *eb) {
  int completes = q->cfg.async || q->npushed + 1 == q->cfg.trainers;
  distd_tensor *next = NULL;
  /* Allocate before touching the sums, so a failure changes nothing. */
  if (completes && new_like(st, cur, p->rank, &next, eb) != 0) return eb ? eb->code : DIST_ENOMEM;
  size_t n = q->nbytes / dist_dtype_size(q->dtype);
  res->version = cur->version;
  if (q->cfg.async) {
    apply_update(q, st, cur, next, grad, res);
  } else {
    if (q->npushed == 0) memcpy(q->accum, grad, q->nbytes);
    else dist_reduce_into(q->accum, grad, n, q->dtype, DIST_REDUCE_SUM);
    q->pushed[trainer] = 1;
    q->npushed++;
    if (completes) {
      dist_reduce_finish(q->accum, n, q->dtype, q->cfg.reduce, q->cfg.trainers);
      apply_update(q, st, cur, next, q->accum, res);
      memset(q->pushed, 0, (size_t)q->cfg.trainers);
      q->npushed = 0;
    }
  }
  if (next) {
    distd_tensor_unref(next);
    pthread_cond_broadcast(&p->updated);
  }
  res->step = q->step;
  res->pending = q->npushed;
  return 0;
}

int distd_param_push(distd_params *p, distd_store *st, const char *name,
                     int trainer, uint64_t expect_step, const void *grad,
                     size_t nbytes, distd_push_result *res, dist_errbuf *eb) {
  memset(res, 0, sizeof *res);
  distd_tensor *cur = NULL;
  int rc;
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  if (!q) {
    rc = dist_fail(eb, DIST_ENOTFOUND, "'%s' is not a parameter (configure it "
                   "with an optimizer first)", name);
    goto out;
  }
  if (q->held) {
    rc = dist_fail(eb, DIST_EUNAVAIL, "parameter '%s' is being resharded; push again once "
                   "the reshard is done (nothing was changed)", name);
    goto out;
  }
  if ((rc = distd_store_get(st, name, &cur, eb)) != 0) goto out;
  if ((rc = check_layout(q, cur, eb)) != 0) goto out;
  if ((rc = check_push(q, trainer, expect_step, nbytes, p->rank, eb)) != 0) goto out;
  rc = push_locked(p, q, st, cur, trainer, grad, res, eb);
out:
  pthread_mutex_unlock(&p->mu);
  distd_tensor_unref(cur);
  return rc;
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

static int set_held(distd_params *p, const char *name, int held) {
  pthread_mutex_lock(&p->mu);
  param *q = find(p, name);
  if (q) q->held = held;
  pthread_mutex_unlock(&p->mu);
  return q != NULL;
}

int distd_param_hold(distd_params *p, const char *name) { return set_held(p, name, 1); }

void distd_param_release(distd_params *p, const char *name) { set_held(p, name, 0); }

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
