/* Deletes put off: names a failed call of libdist's own may have stored on
 * a daemon that did not answer it (dist_later, client_internal.h). */
#include <stdio.h>
#include <stdlib.h>

#include "client_internal.h"

void dist_later_note(dist_client *c, dist_later *l, const char *name, int rank) {
  dist_later_name *q = realloc(l->items, sizeof *q * ((size_t)l->n + 1));
  if (!q) { /* no room to remember it: asked now, at the cost of a deadline */
    dist_delete_on(c, name, &rank, 1);
    return;
  }
  l->items = q;
  snprintf(q[l->n].name, sizeof q[l->n].name, "%s", name);
  q[l->n++].rank = rank;
}

int dist_later_delete(dist_client *c, dist_later *l) {
  dist_errbuf first = DIST_ERRBUF_INIT;
  int kept = 0;
  for (int i = 0; i < l->n; i++) {
    /* not found: never stored there, or another path deleted it */
    int rc = dist_delete_one(c, l->items[i].name, l->items[i].rank);
    if (rc == DIST_ENOTFOUND) rc = 0;
    dist_note_first_failure(c, rc, &first);
    if (rc) l->items[kept++] = l->items[i]; /* still there: tried again next time */
  }
  l->n = kept;
  c->err = first;
  return first.code;
}

void dist_later_free(dist_later *l) {
  free(l->items);
  l->items = NULL;
  l->n = 0;
}
