/* The checkpoint saves in progress on one daemon: see ckpt_saves.h. A
 * plain array scanned under a lock: it holds a handful of ids at a time
 * (one per save running), and is looked at once per Save, Commit and
 * Discard and once per rank file a commit considers. */
#include "ckpt_saves.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

typedef struct mark {
  char id[72]; /* distd_ckpt_check_id allows 64 characters */
  int64_t at_ms;
} mark;

struct distd_ckpt_saves {
  pthread_mutex_t mu, commit_mu;
  int64_t keep_ms;
  int n;
  mark marks[DISTD_CKPT_SAVES_MAX];
};

distd_ckpt_saves *distd_ckpt_saves_new(int64_t keep_ms) {
  distd_ckpt_saves *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->commit_mu, NULL);
  s->keep_ms = keep_ms;
  return s;
}

void distd_ckpt_saves_free(distd_ckpt_saves *s) {
  if (!s) return;
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->commit_mu);
  free(s);
}

/* Drops the marks that lapsed; with s->mu held. */
static void forget_lapsed(distd_ckpt_saves *s, int64_t now) {
  for (int i = 0; i < s->n;)
    if (now - s->marks[i].at_ms >= s->keep_ms) s->marks[i] = s->marks[--s->n];
    else i++;
}

/* The index of id's mark, or -1; with s->mu held. */
static int find(const distd_ckpt_saves *s, const char *id) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->marks[i].id, id) == 0) return i;
  return -1;
}

int distd_ckpt_saves_mark(distd_ckpt_saves *s, const char *id, int rank, dist_errbuf *eb) {
  int64_t now = distd_now_ms();
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  forget_lapsed(s, now);
  int i = find(s, id);
  if (i < 0 && s->n < DISTD_CKPT_SAVES_MAX) i = s->n++;
  if (i >= 0) {
    strncpy(s->marks[i].id, id, sizeof s->marks[i].id - 1);
    s->marks[i].at_ms = now;
  } else {
    rc = dist_fail(eb, DIST_EUNAVAIL, "rank %d has %d checkpoint saves in progress, "
                   "committed or discarded by none yet: save again later", rank, s->n);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void distd_ckpt_saves_settle(distd_ckpt_saves *s, const char *id) {
  pthread_mutex_lock(&s->mu);
  int i = find(s, id);
  if (i >= 0) s->marks[i] = s->marks[--s->n];
  pthread_mutex_unlock(&s->mu);
}

int distd_ckpt_saves_in_progress(void *arg, const char *id) {
  distd_ckpt_saves *s = arg;
  pthread_mutex_lock(&s->mu);
  forget_lapsed(s, distd_now_ms());
  int found = find(s, id) >= 0;
  pthread_mutex_unlock(&s->mu);
  return found;
}

void distd_ckpt_saves_commit_begin(distd_ckpt_saves *s) { pthread_mutex_lock(&s->commit_mu); }

void distd_ckpt_saves_commit_end(distd_ckpt_saves *s) { pthread_mutex_unlock(&s->commit_mu); }
