/* The holds on names: see holds.h. */
#include "holds.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "store.h"

typedef enum { FREE, WAIT, REFUSE } verdict;

/* What a request taking a hold (row) does about one already held (column).
 * Reshards, configures, restores and puts wait for other daemons (their
 * exchanges and votes), so what meets them is refused, except a delete,
 * which waits for nothing but local holds and so may wait; a reshard waits
 * for a configure (whose vote waits for no hold) and for a delete. A
 * restore takes its names all at once, holding none while it waits, and
 * so may wait for every hold but another restore's: two restores that
 * reached two daemons in opposite orders would each hold what the other
 * waits for. A put leaves a reshard's source alone (the reshard holds its
 * own reference) and refuses, or is refused by, what changes the name. */
static const verdict rules[DISTD_HOLD_PUT + 1][DISTD_HOLD_PUT + 1] = {
    /*                       RESHARD  READ    CONFIGURE DELETE RESTORE PUT */
    [DISTD_HOLD_RESHARD] = {REFUSE, REFUSE, WAIT, WAIT, REFUSE, REFUSE},
    [DISTD_HOLD_READ] = {REFUSE, FREE, FREE, WAIT, REFUSE, FREE},
    [DISTD_HOLD_CONFIGURE] = {REFUSE, FREE, REFUSE, REFUSE, REFUSE, REFUSE},
    [DISTD_HOLD_DELETE] = {WAIT, WAIT, WAIT, FREE, WAIT, WAIT},
    [DISTD_HOLD_RESTORE] = {WAIT, WAIT, WAIT, WAIT, REFUSE, WAIT},
    [DISTD_HOLD_PUT] = {REFUSE, FREE, REFUSE, WAIT, REFUSE, REFUSE},
};

/* A LocalLayer call or backward storing its outputs or gradients, and an
 * expert layer's creation storing its parameters, store a voted result as
 * a put does, and follow its rules; they are kinds of their own only for
 * what their messages say. */
static verdict rule(distd_hold_kind taking, distd_hold_kind held) {
  if (taking > DISTD_HOLD_PUT) taking = DISTD_HOLD_PUT;
  if (held > DISTD_HOLD_PUT) held = DISTD_HOLD_PUT;
  return rules[taking][held];
}

/* For messages: what a hold's request is doing, and what to do again. */
static const char *const doing[DISTD_HOLD_KINDS] = {
    [DISTD_HOLD_RESHARD] = "resharded by another request",
    [DISTD_HOLD_READ] = "resharded by another request",
    [DISTD_HOLD_CONFIGURE] = "configured",
    [DISTD_HOLD_DELETE] = "deleted",
    [DISTD_HOLD_RESTORE] = "restored from a checkpoint",
    [DISTD_HOLD_PUT] = "put by another request",
    [DISTD_HOLD_OUTPUT] = "stored by a LocalLayer call",
    [DISTD_HOLD_EXPERTS] = "created as an expert layer's parameter",
};
static const char *const verb[DISTD_HOLD_KINDS] = {
    [DISTD_HOLD_RESHARD] = "reshard",
    [DISTD_HOLD_READ] = "reshard",
    [DISTD_HOLD_CONFIGURE] = "configure",
    [DISTD_HOLD_DELETE] = "delete",
    [DISTD_HOLD_RESTORE] = "restore",
    [DISTD_HOLD_PUT] = "put",
    [DISTD_HOLD_OUTPUT] = "call the layer with",
    [DISTD_HOLD_EXPERTS] = "create the expert layer with",
};

typedef struct hold {
  char name[DISTD_NAME_MAX];
  distd_hold_kind kind;
  uint64_t batch; /* the same for every hold one take made */
  struct hold *next;
} hold;

struct distd_holds {
  pthread_mutex_t mu;
  pthread_cond_t released;
  hold *head;
  uint64_t batches; /* the last batch given out */
  int rank;
};

distd_holds *distd_holds_new(int rank) {
  distd_holds *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  pthread_mutex_init(&h->mu, NULL);
  distd_cond_init_monotonic(&h->released);
  h->rank = rank;
  return h;
}

static void free_list(hold *x) {
  while (x) {
    hold *next = x->next;
    free(x);
    x = next;
  }
}

void distd_holds_free(distd_holds *h) {
  if (!h) return;
  free_list(h->head);
  pthread_cond_destroy(&h->released);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

/* The first hold on one of names that a request of `kind` must act on as
 * `what` (WAIT or REFUSE), or NULL. Called with mu held. */
static const hold *first(const distd_holds *h, const char *const *names, size_t n,
                         distd_hold_kind kind, verdict what) {
  for (const hold *x = h->head; x; x = x->next)
    for (size_t i = 0; i < n; i++)
      if (rule(kind, x->kind) == what && strcmp(x->name, names[i]) == 0) return x;
  return NULL;
}

/* Adds a hold of kind on each of names, as one new batch (*batch); 0 or
 * DIST_ENOMEM (none added). Called with mu held. */
static int add_all(distd_holds *h, const char *const *names, size_t n, distd_hold_kind kind,
                   uint64_t *batch, dist_errbuf *eb) {
  *batch = ++h->batches;
  hold *added = NULL, *last = NULL;
  for (size_t i = 0; i < n; i++) {
    hold *mine = calloc(1, sizeof *mine);
    if (!mine) {
      free_list(added);
      return dist_fail(eb, DIST_ENOMEM, "out of memory holding '%s'", names[i]);
    }
    snprintf(mine->name, sizeof mine->name, "%s", names[i]);
    mine->kind = kind;
    mine->batch = *batch;
    mine->next = added;
    added = mine;
    if (!last) last = mine;
  }
  if (last) { /* the new holds go in front of the others, in one piece */
    last->next = h->head;
    h->head = added;
  }
  return 0;
}

int distd_holds_take_all(distd_holds *h, const char *const *names, size_t n,
                         distd_hold_kind kind, int64_t deadline_ms, uint64_t *batch,
                         dist_errbuf *eb) {
  pthread_mutex_lock(&h->mu);
  const hold *in_way = first(h, names, n, kind, REFUSE);
  while (!in_way && first(h, names, n, kind, WAIT) && distd_now_ms() < deadline_ms) {
    distd_cond_wait_until_ms(&h->released, &h->mu, deadline_ms);
    in_way = first(h, names, n, kind, REFUSE);
  }
  const hold *waited = in_way ? NULL : first(h, names, n, kind, WAIT);
  int rc = 0;
  if (in_way)
    rc = dist_fail(eb, DIST_EUNAVAIL, "'%s' is being %s on rank %d; %s it again once that "
                   "is done (nothing was changed)", in_way->name, doing[in_way->kind],
                   h->rank, verb[kind]);
  else if (waited)
    rc = dist_fail(eb, DIST_EUNAVAIL, "'%s' was still being %s on rank %d at the deadline; "
                   "%s it again (nothing was changed)", waited->name, doing[waited->kind],
                   h->rank, verb[kind]);
  else
    rc = add_all(h, names, n, kind, batch, eb);
  pthread_mutex_unlock(&h->mu);
  return rc;
}

int distd_holds_take(distd_holds *h, const char *name, distd_hold_kind kind,
                     int64_t deadline_ms, dist_errbuf *eb) {
  uint64_t batch;
  return distd_holds_take_all(h, &name, 1, kind, deadline_ms, &batch, eb);
}

/* Unlinks every hold `which` picks (with arg) and frees them, waking the
 * requests that wait. */
static void release_where(distd_holds *h, int (*which)(const hold *, const void *),
                          const void *arg, int just_one) {
  hold *gone = NULL;
  pthread_mutex_lock(&h->mu);
  for (hold **at = &h->head; *at;) {
    hold *x = *at;
    if (!which(x, arg)) {
      at = &x->next;
      continue;
    }
    *at = x->next;
    x->next = gone;
    gone = x;
    if (just_one) break;
  }
  pthread_cond_broadcast(&h->released);
  pthread_mutex_unlock(&h->mu);
  free_list(gone);
}

typedef struct named {
  const char *name;
  distd_hold_kind kind;
} named;

static int is_named(const hold *x, const void *arg) {
  const named *n = arg;
  return x->kind == n->kind && strcmp(x->name, n->name) == 0;
}

static int in_batch(const hold *x, const void *arg) {
  return x->batch == *(const uint64_t *)arg;
}

void distd_holds_release(distd_holds *h, const char *name, distd_hold_kind kind) {
  named n = {name, kind};
  release_where(h, is_named, &n, 1);
}

void distd_holds_release_batch(distd_holds *h, uint64_t batch) {
  release_where(h, in_batch, &batch, 0);
}
