/* The operations registry: an array of running operations in start order
 * and a ring of finished ones, behind one mutex. Lookups are linear: a
 * daemon runs a few operations at a time. */
#include "ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "dist/error.h"

struct distd_ops {
  pthread_mutex_t mu;
  distd_ops_finish_fn on_finish;
  void *arg;
  uint64_t next_serial;
  distd_op_info *running; /* in start order */
  int nrunning, cap;
  distd_op_info recent[DISTD_OPS_RECENT];
  int recent_next, nrecent; /* ring: next slot to write, entries held */
  distd_expert_stats *experts;
};

distd_ops *distd_ops_new(distd_ops_finish_fn on_finish, void *arg) {
  distd_ops *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  if (!(r->experts = distd_expert_stats_new())) {
    free(r);
    return NULL;
  }
  pthread_mutex_init(&r->mu, NULL);
  r->on_finish = on_finish;
  r->arg = arg;
  r->next_serial = 1;
  return r;
}

void distd_ops_free(distd_ops *r) {
  if (!r) return;
  pthread_mutex_destroy(&r->mu);
  distd_expert_stats_free(r->experts);
  free(r->running);
  free(r);
}

distd_expert_stats *distd_ops_experts(distd_ops *r) { return r ? r->experts : NULL; }

static int grow(distd_ops *r) {
  if (r->nrunning < r->cap) return 0;
  int cap = r->cap ? 2 * r->cap : 16;
  distd_op_info *a = realloc(r->running, sizeof *a * (size_t)cap);
  if (!a) return -1;
  r->running = a, r->cap = cap;
  return 0;
}

uint64_t distd_ops_begin(distd_ops *r, const char *kind, uint64_t op_id, const int *group,
                         int size, uint64_t bytes) {
  if (!r) return 0;
  uint64_t serial = 0;
  pthread_mutex_lock(&r->mu);
  if (grow(r) != 0) goto out;
  distd_op_info *o = &r->running[r->nrunning++];
  memset(o, 0, sizeof *o);
  serial = o->serial = r->next_serial++;
  o->op_id = op_id;
  /* A copy, not snprintf: parsing a format took a tenth of a daemon's
   * user time in a loop of small collectives. o is zeroed above. */
  memcpy(o->kind, kind, strnlen(kind, sizeof o->kind - 1));
  o->group_size = size > 0 ? size : 0;
  for (int i = 0; i < o->group_size && i < DISTD_OPS_GROUP_MAX; i++) o->group[i] = group[i];
  o->bytes = bytes;
  o->start = distd_now_s();
  o->state = DISTD_OP_RUNNING;
  o->watch[o->nwatch++] = op_id;
out:
  pthread_mutex_unlock(&r->mu);
  return serial;
}

static int find_running(distd_ops *r, uint64_t serial) {
  for (int i = 0; i < r->nrunning; i++)
    if (r->running[i].serial == serial) return i;
  return -1;
}

void distd_ops_watch(distd_ops *r, uint64_t serial, uint64_t xfer_op_id) {
  if (!r || !serial) return;
  pthread_mutex_lock(&r->mu);
  int i = find_running(r, serial);
  if (i >= 0 && r->running[i].nwatch < DISTD_OPS_WATCH_MAX)
    r->running[i].watch[r->running[i].nwatch++] = xfer_op_id;
  pthread_mutex_unlock(&r->mu);
}

void distd_ops_end(distd_ops *r, uint64_t serial, int rc, const char *error) {
  if (!r || !serial) return;
  distd_op_info done;
  pthread_mutex_lock(&r->mu);
  int i = find_running(r, serial);
  if (i < 0) {
    pthread_mutex_unlock(&r->mu);
    return;
  }
  done = r->running[i];
  memmove(&r->running[i], &r->running[i + 1],
          sizeof *r->running * (size_t)(r->nrunning - i - 1));
  r->nrunning--;
  done.seconds = distd_now_s() - done.start;
  done.state = rc ? DISTD_OP_FAILED : DISTD_OP_DONE;
  if (rc)
    snprintf(done.error, sizeof done.error, "%s", error && error[0] ? error : dist_strerror(rc));
  r->recent[r->recent_next] = done;
  r->recent_next = (r->recent_next + 1) % DISTD_OPS_RECENT;
  if (r->nrecent < DISTD_OPS_RECENT) r->nrecent++;
  pthread_mutex_unlock(&r->mu);
  if (r->on_finish) r->on_finish(r->arg, done.kind, rc == 0, done.bytes, done.seconds);
}

int distd_ops_snapshot(distd_ops *r, distd_op_info **out, int *n_in_flight, int *n_recent) {
  int rc = 0;
  *out = NULL;
  *n_in_flight = *n_recent = 0;
  if (!r) return 0;
  pthread_mutex_lock(&r->mu);
  int n = r->nrunning + r->nrecent;
  if (n == 0) goto out;
  if (!(*out = malloc(sizeof **out * (size_t)n))) {
    rc = DIST_ENOMEM;
    goto out;
  }
  memcpy(*out, r->running, sizeof **out * (size_t)r->nrunning);
  for (int k = 0; k < r->nrecent; k++) /* newest first */
    (*out)[r->nrunning + k] =
        r->recent[(r->recent_next - 1 - k + 2 * DISTD_OPS_RECENT) % DISTD_OPS_RECENT];
  *n_in_flight = r->nrunning;
  *n_recent = r->nrecent;
out:
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int distd_ops_in_flight(distd_ops *r) {
  if (!r) return 0;
  pthread_mutex_lock(&r->mu);
  int n = r->nrunning;
  pthread_mutex_unlock(&r->mu);
  return n;
}
