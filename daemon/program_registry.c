/* Registered programs and kept invocations: two small linked lists under one
 * mutex. Lists are short (programs a trainer registered, invocations not yet
 * backpropagated, at most DISTD_MAX_INVOCATIONS), so a linear scan is
 * cheaper than a hash table would be worth. Expired invocations are swept
 * on every keep and take. */
#include "program_registry.h"

#include <pthread.h>
#include <stdlib.h>

#include "clock.h"

typedef struct registered {
  uint64_t handle;
  double ttl;
  distd_program *prog;
  struct registered *next;
} registered;

struct distd_program_registry {
  pthread_mutex_t mu;
  uint64_t next_handle;
  double default_ttl;
  registered *programs;
  distd_kept_invocation *kept;
  int live;
};

distd_program_registry *distd_registry_new(double default_ttl) {
  distd_program_registry *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  pthread_mutex_init(&r->mu, NULL);
  r->next_handle = 1;
  r->default_ttl = default_ttl > 0 ? default_ttl : DISTD_DEFAULT_INVOCATION_TTL;
  return r;
}

void distd_kept_invocation_free(distd_kept_invocation *k) {
  if (!k) return;
  distd_invocation_release(k->inv);
  free(k->origins);
  free(k);
}

/* Unlinks and frees every kept invocation that matches (caller holds mu). */
static void drop_kept_where(distd_program_registry *r, uint64_t handle,
                            double now) {
  distd_kept_invocation **pp = &r->kept;
  while (*pp) {
    distd_kept_invocation *k = *pp;
    if ((handle && k->handle == handle) || (now > 0 && k->expires < now)) {
      *pp = k->next;
      distd_kept_invocation_free(k);
      r->live--;
    } else {
      pp = &k->next;
    }
  }
}

void distd_registry_free(distd_program_registry *r) {
  if (!r) return;
  while (r->kept) {
    distd_kept_invocation *k = r->kept;
    r->kept = k->next;
    distd_kept_invocation_free(k);
  }
  while (r->programs) {
    registered *g = r->programs;
    r->programs = g->next;
    distd_program_free(g->prog);
    free(g);
  }
  pthread_mutex_destroy(&r->mu);
  free(r);
}

int distd_registry_add(distd_program_registry *r, distd_program *p,
                       double ttl, uint64_t *handle, dist_errbuf *eb) {
  registered *g = calloc(1, sizeof *g);
  if (!g) {
    distd_program_free(p);
    return dist_fail(eb, DIST_ENOMEM, "out of memory registering a program");
  }
  g->prog = p;
  pthread_mutex_lock(&r->mu);
  g->ttl = ttl > 0 ? ttl : r->default_ttl;
  g->handle = r->next_handle++;
  g->next = r->programs;
  r->programs = g;
  *handle = g->handle;
  pthread_mutex_unlock(&r->mu);
  return 0;
}

static registered *find_program(distd_program_registry *r, uint64_t handle) {
  for (registered *g = r->programs; g; g = g->next)
    if (g->handle == handle) return g;
  return NULL;
}

int distd_registry_get(distd_program_registry *r, uint64_t handle,
                       distd_program **out, dist_errbuf *eb) {
  pthread_mutex_lock(&r->mu);
  registered *g = find_program(r, handle);
  *out = g ? distd_program_ref(g->prog) : NULL;
  pthread_mutex_unlock(&r->mu);
  if (!g)
    return dist_fail(eb, DIST_ENOTFOUND,
                     "unknown program handle %llu (never registered on this "
                     "daemon, or released)", (unsigned long long)handle);
  return 0;
}

int distd_registry_remove(distd_program_registry *r, uint64_t handle,
                          dist_errbuf *eb) {
  pthread_mutex_lock(&r->mu);
  registered **pp = &r->programs, *g = NULL;
  while (*pp && (*pp)->handle != handle) pp = &(*pp)->next;
  if (*pp) {
    g = *pp;
    *pp = g->next;
    drop_kept_where(r, handle, 0);
  }
  pthread_mutex_unlock(&r->mu);
  if (!g)
    return dist_fail(eb, DIST_ENOTFOUND, "unknown program handle %llu",
                     (unsigned long long)handle);
  distd_program_free(g->prog);
  free(g);
  return 0;
}

static distd_kept_invocation *find_kept(distd_program_registry *r,
                                        uint64_t id) {
  for (distd_kept_invocation *k = r->kept; k; k = k->next)
    if (k->id == id) return k;
  return NULL;
}

int distd_registry_keep(distd_program_registry *r, distd_kept_invocation *k,
                        dist_errbuf *eb) {
  int rc = 0;
  double now = distd_now_s();
  pthread_mutex_lock(&r->mu);
  drop_kept_where(r, 0, now);
  registered *g = find_program(r, k->handle);
  if (!g)
    rc = dist_fail(eb, DIST_ENOTFOUND, "program handle %llu was released "
                   "during invocation %llu", (unsigned long long)k->handle,
                   (unsigned long long)k->id);
  else if (find_kept(r, k->id))
    rc = dist_fail(eb, DIST_EEXIST, "invocation id %llu is already in use "
                   "on this daemon", (unsigned long long)k->id);
  else if (r->live >= DISTD_MAX_INVOCATIONS)
    rc = dist_fail(eb, DIST_ENOMEM, "%d invocations are waiting for "
                   "backward on this daemon (the limit): release some",
                   r->live);
  if (rc == 0) {
    k->expires = now + g->ttl;
    k->next = r->kept;
    r->kept = k;
    r->live++;
  }
  pthread_mutex_unlock(&r->mu);
  if (rc != 0) distd_kept_invocation_free(k);
  return rc;
}

void distd_registry_fill(distd_program_registry *r, uint64_t id, distd_invocation *inv,
                         distd_input_origin *origins) {
  pthread_mutex_lock(&r->mu);
  distd_kept_invocation *k = find_kept(r, id);
  if (k && !k->inv) {
    k->inv = inv;
    k->origins = origins;
    inv = NULL;
    origins = NULL;
  }
  pthread_mutex_unlock(&r->mu);
  distd_invocation_release(inv);
  free(origins);
}

/* Unlinks invocation id (a reserved place too, when `reserved`); NULL when
 * there is none. */
static distd_kept_invocation *unlink_kept(distd_program_registry *r, uint64_t id,
                                          int reserved) {
  pthread_mutex_lock(&r->mu);
  drop_kept_where(r, 0, distd_now_s());
  distd_kept_invocation **pp = &r->kept;
  while (*pp && ((*pp)->id != id || (!reserved && !(*pp)->inv))) pp = &(*pp)->next;
  distd_kept_invocation *k = *pp;
  if (k) {
    *pp = k->next;
    k->next = NULL;
    r->live--;
  }
  pthread_mutex_unlock(&r->mu);
  return k;
}

static int not_kept(uint64_t id, dist_errbuf *eb) {
  return dist_fail(eb, DIST_ENOTFOUND, "invocation %llu is not kept on this daemon: it was "
                   "never made, already backpropagated, released, its program released, "
                   "or it expired", (unsigned long long)id);
}

int distd_registry_take(distd_program_registry *r, uint64_t id,
                        distd_kept_invocation **out, dist_errbuf *eb) {
  *out = unlink_kept(r, id, 0);
  return *out ? 0 : not_kept(id, eb);
}

int distd_registry_release(distd_program_registry *r, uint64_t id,
                           dist_errbuf *eb) {
  distd_kept_invocation *k = unlink_kept(r, id, 1);
  distd_kept_invocation_free(k);
  return k ? 0 : not_kept(id, eb);
}

int distd_registry_live(distd_program_registry *r) {
  pthread_mutex_lock(&r->mu);
  /* expired ones go at the next keep, take or release: not counted */
  drop_kept_where(r, 0, distd_now_s());
  int n = r->live;
  pthread_mutex_unlock(&r->mu);
  return n;
}
