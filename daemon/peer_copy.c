/* Local copies that are part of a transfer: the self part of an exchange
 * (a send to this rank, global_scatter's own rows, a reduction's own
 * block). Copied at once, a 1 MiB self part held the exchange's network
 * part up: its rows beyond what the sockets took at once were not written,
 * and the peer's were not read, until the copy ended (at W=2 1 MiB
 * global_scatter, skipping the self copy took 618 -> 453 us). A long one is
 * therefore copied in chunks by the thread waiting on the transfer, in the
 * passes where it would otherwise yield the CPU or sleep in poll()
 * (peer_xfer.c's drive), or all at once before it waits on a condvar.
 *
 * Only the thread that owns the xfer touches its copies (it posts them and
 * waits), so a chunk is copied with mu released; the xfer's pending count,
 * which the copies hold one of each, is changed under mu. */
#include <stdlib.h>
#include <string.h>

#include "peer_internal.h"

/* What one idle pass copies: about as long as a pass's system call, so that
 * bytes arriving meanwhile wait little. Shorter copies are made at once. */
#define COPY_CHUNK (64 * 1024)

static int add_copy(distd_xfer *x, void *dst, const void *src, size_t len) {
  if (x->n_copies == x->cap_copies) {
    int cap = x->cap_copies ? 2 * x->cap_copies : 4;
    distd_local_copy *c = realloc(x->copies, sizeof *c * (size_t)cap);
    if (!c) return -1;
    x->copies = c, x->cap_copies = cap;
  }
  x->copies[x->n_copies++] = (distd_local_copy){dst, src, len, 0};
  x->pending++;
  return 0;
}

void distd_copy_later(distd_xfer *x, void *dst, const void *src, size_t len) {
  /* Out of memory for the record: copied at once, as before. */
  if (len <= COPY_CHUNK || x->err.code || add_copy(x, dst, src, len) != 0) {
    if (len && !x->err.code) memcpy(dst, src, len);
  }
}

void distd_xfer_copy(distd_xfer *x, void *dst, const void *src, size_t len) {
  distd_peers *p = x->p;
  if (!p) return; /* orphaned: its wait fails */
  pthread_mutex_lock(&p->mu);
  distd_copy_later(x, dst, src, len);
  pthread_mutex_unlock(&p->mu);
}

/* The xfer whose copies are due while x is waited on: x's own, else those
 * of the xfer waited on next (its rows arrive during x's wait too). */
static distd_xfer *copies_of(distd_xfer *x) {
  if (x->next_copy < x->n_copies) return x;
  distd_xfer *n = x->then;
  return n && n->next_copy < n->n_copies && !n->err.code ? n : NULL;
}

int distd_copies_due(distd_xfer *x) { return !x->err.code && copies_of(x) != NULL; }

/* Copies up to budget bytes of the next copy, mu released meanwhile. */
static void copy_chunk(distd_peers *p, distd_xfer *x, size_t budget) {
  distd_local_copy *c = &x->copies[x->next_copy];
  size_t n = c->len - c->done < budget ? c->len - c->done : budget;
  pthread_mutex_unlock(&p->mu);
  memcpy(c->dst + c->done, c->src + c->done, n);
  pthread_mutex_lock(&p->mu);
  c->done += n;
  if (c->done < c->len) return;
  x->next_copy++;
  /* A failure while mu was released already zeroed pending (detach). */
  if (!x->err.code) x->pending--;
}

int distd_copies_some(distd_peers *p, distd_xfer *x) {
  distd_xfer *owner = x->err.code ? NULL : copies_of(x);
  if (!owner) return 0;
  copy_chunk(p, owner, COPY_CHUNK);
  return 1;
}

void distd_copies_all(distd_peers *p, distd_xfer *x) {
  distd_xfer *owner;
  while (!x->err.code && (owner = copies_of(x))) copy_chunk(p, owner, SIZE_MAX);
}

void distd_copies_free(distd_xfer *x) {
  free(x->copies);
  x->copies = NULL;
  x->n_copies = x->cap_copies = x->next_copy = 0;
}
