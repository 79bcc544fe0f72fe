/* Undo put off: what a failed call may have left on a daemon that did not
 * answer it, a name it stored or the invocation it kept for backward
 * (dist_later, client_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* Deletes item's name, or releases its invocation, on its daemon; its
 * code (c->err says why), and in *unanswered whether the daemon said
 * nothing. */
static int send_undo(dist_client *c, const dist_later_item *it, int *unanswered) {
  return it->name[0] ? dist_delete_one(c, it->name, it->rank, unanswered)
                     : dist_invocation_release_one(c, it->invocation, it->rank, unanswered);
}

/* send_undo, 0 also when it is not there (never stored there, or another
 * path undid it). */
static int undo_item(dist_client *c, const dist_later_item *it, int *unanswered) {
  int rc = send_undo(c, it, unanswered);
  return rc == DIST_ENOTFOUND ? 0 : rc;
}

/* Whether an undo that failed with code may still be done by asking
 * again: its daemon did not answer (the request lost on the way, or the
 * daemon not reached: down, restarting, its connection refused), or
 * answered that it did nothing for now (DIST_EUNAVAIL: "'w' is being
 * resharded ... (nothing was changed)"; DIST_ETIMEDOUT of its own: the
 * name was still held at its deadline), or memory ran short on either
 * side (DIST_ENOMEM: a delete is what a daemon short of memory most
 * needs done). Other answers (refused for good: EAUTH, EPERM, EINVAL,
 * ...) are not retried from here. */
static int worth_retrying(int code, int unanswered) {
  return unanswered || code == DIST_EUNAVAIL || code == DIST_ETIMEDOUT || code == DIST_ENOMEM;
}

int dist_later_worth_retrying(const dist_call *call) {
  return call->err.code && worth_retrying(call->err.code, call->unanswered);
}

static int same_item(const dist_later_item *a, const dist_later_item *b) {
  return a->rank == b->rank && a->invocation == b->invocation && strcmp(a->name, b->name) == 0;
}

/* Adds it to l, unless listed already (a release asked twice); -1 without
 * memory for it. */
static int append(dist_later *l, const dist_later_item *it) {
  for (int i = 0; i < l->n; i++)
    if (same_item(&l->items[i], it)) return 0;
  dist_later_item *q = realloc(l->items, sizeof *q * ((size_t)l->n + 1));
  if (!q) return -1;
  l->items = q;
  q[l->n++] = *it;
  return 0;
}

static void note(dist_client *c, dist_later *l, const dist_later_item *it) {
  if (append(l, it) == 0) return;
  /* no room to remember it: undone now, at the cost of a deadline */
  dist_errbuf keep = c->err;
  undo_item(c, it, NULL);
  c->err = keep;
}

void dist_later_note(dist_client *c, dist_later *l, const char *name, int rank) {
  dist_later_item it = {.rank = rank};
  snprintf(it.name, sizeof it.name, "%s", name);
  note(c, l, &it);
}

void dist_later_note_invocation(dist_client *c, dist_later *l, uint64_t invocation, int rank) {
  dist_later_item it = {.invocation = invocation, .rank = rank};
  note(c, l, &it);
}

/* send_undo now, unless *silent; when that is not done but may be later
 * (worth_retrying), it is noted on l (NULL: not noted) for the next undo
 * point; without memory for the note it is dropped, not sent again. When
 * its daemon said nothing (the request may be lost, or gRPC could not
 * reach it), *silent gets the code, so the caller's next undo to that
 * daemon is noted without a deadline of its own; a daemon that answered
 * a failure of its own is asked the rest. */
static int undo_or_note(dist_client *c, dist_later *l, const dist_later_item *it, int *silent) {
  int unanswered = *silent != 0;
  int rc = unanswered ? *silent : send_undo(c, it, &unanswered);
  if (!rc || !worth_retrying(rc, unanswered)) return rc;
  if (unanswered) *silent = rc;
  if (l) append(l, it);
  return rc;
}

int dist_later_release_or_note(dist_client *c, dist_later *l, uint64_t invocation, int rank,
                               int *silent) {
  dist_later_item it = {.invocation = invocation, .rank = rank};
  return undo_or_note(c, l, &it, silent);
}

int dist_later_delete_or_note(dist_client *c, dist_later *l, const char *name, int rank,
                              int *silent) {
  dist_later_item it = {.rank = rank};
  snprintf(it.name, sizeof it.name, "%s", name);
  return undo_or_note(c, l, &it, silent);
}

/* Whether rank is known silent in this pass: one of silent[0..n_silent)
 * (its daemon just did not answer the caller), or one of the items kept
 * so far (items[0..kept)) found it so: its other items would each wait
 * out a deadline too, or fail unreached. */
static int silent_in_pass(const dist_later *l, int kept, int rank, const int *silent,
                          int n_silent) {
  for (int i = 0; i < n_silent; i++)
    if (silent[i] == rank) return 1;
  for (int i = 0; i < kept; i++)
    if (l->items[i].unanswered && l->items[i].rank == rank) return 1;
  return 0;
}

/* dist_later_undo, the items of the daemons silent[0..n_silent) left
 * untried. */
static int undo_pass(dist_client *c, dist_later *l, const int *silent, int n_silent) {
  dist_errbuf first = DIST_ERRBUF_INIT;
  int kept = 0;
  for (int i = 0; i < l->n; i++) {
    dist_later_item *it = &l->items[i];
    int rc = DIST_ETIMEDOUT, unanswered = 1;
    if (!silent_in_pass(l, kept, it->rank, silent, n_silent)) {
      rc = undo_item(c, it, &unanswered);
      dist_note_first_failure(c, rc, &first);
    }
    it->unanswered = rc && unanswered;
    /* still there, and asking again may do it: tried again next time; a
     * refusal for good (EAUTH, EPERM, EINTERNAL) would be asked at every
     * undo point until dist_close, the list only growing */
    if (rc && worth_retrying(rc, unanswered)) l->items[kept++] = *it;
  }
  l->n = kept;
  c->err = first;
  return first.code;
}

int dist_later_undo(dist_client *c, dist_later *l) { return undo_pass(c, l, NULL, 0); }

void dist_later_forget_on(dist_later *l, const char *name, const dist_mesh_desc *m) {
  int kept = 0;
  for (int i = 0; i < l->n; i++) {
    const dist_later_item *it = &l->items[i];
    int stored_there = !m || dist_mesh_index_of(m, it->rank) >= 0;
    if (strcmp(it->name, name) != 0 || !stored_there) l->items[kept++] = *it;
  }
  l->n = kept;
}

void dist_later_forget(dist_later *l, const char *name) { dist_later_forget_on(l, name, NULL); }

void dist_later_forget_stored(dist_client *c, const char *name, const dist_mesh_desc *m) {
  dist_later_forget_on(&c->later, name, m);
}

void dist_client_later_undo_skipping(dist_client *c, const int *silent, int n_silent) {
  if (!c->later.n) return;
  dist_errbuf keep = c->err;
  undo_pass(c, &c->later, silent, n_silent);
  c->err = keep;
}

void dist_client_later_undo(dist_client *c) { dist_client_later_undo_skipping(c, NULL, 0); }

int dist_client_later_takes_made_up_names(const dist_client *c) { return c->spmd_rank < 0; }

dist_later *dist_later_of_made_up(const dist_client *c, dist_later *l) {
  return c && dist_client_later_takes_made_up_names(c) ? l : NULL;
}

/* from's items were each noted, or kept by a pass, as worth retrying. */
void dist_later_hand_over(dist_client *c, dist_later *from, dist_later *to) {
  for (int i = 0; to && i < from->n; i++) note(c, to, &from->items[i]);
  dist_later_free(from);
}

void dist_later_free(dist_later *l) {
  free(l->items);
  l->items = NULL;
  l->n = 0;
}
