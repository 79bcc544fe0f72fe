/* Per-expert token counters: a small array kept sorted by expert id (a
 * daemon hosts a handful of experts), each with a ring of its last steps. */
#include "expert_stats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dist/error.h"

typedef struct expert {
  int id;
  uint64_t steps, total;
  uint64_t window[DISTD_EXPERT_WINDOW]; /* rows of step k at k % WINDOW */
} expert;

struct distd_expert_stats {
  pthread_mutex_t mu;
  expert *e;
  int n, cap;
};

distd_expert_stats *distd_expert_stats_new(void) {
  distd_expert_stats *s = calloc(1, sizeof *s);
  if (s) pthread_mutex_init(&s->mu, NULL);
  return s;
}

void distd_expert_stats_free(distd_expert_stats *s) {
  if (!s) return;
  pthread_mutex_destroy(&s->mu);
  free(s->e);
  free(s);
}

/* The expert's slot, inserted in id order when new; NULL when full. */
static expert *find_or_add(distd_expert_stats *s, int id) {
  int lo = 0, hi = s->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (s->e[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  if (lo < s->n && s->e[lo].id == id) return &s->e[lo];
  if (s->n >= DISTD_EXPERTS_MAX) return NULL;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    expert *e = realloc(s->e, sizeof *e * (size_t)cap);
    if (!e) return NULL;
    s->e = e, s->cap = cap;
  }
  memmove(&s->e[lo + 1], &s->e[lo], sizeof *s->e * (size_t)(s->n - lo));
  s->n++;
  memset(&s->e[lo], 0, sizeof s->e[lo]);
  s->e[lo].id = id;
  return &s->e[lo];
}

void distd_expert_stats_record(distd_expert_stats *s, int expert_id, uint64_t rows) {
  if (!s || expert_id < 0) return;
  pthread_mutex_lock(&s->mu);
  expert *e = find_or_add(s, expert_id);
  if (e) {
    e->window[e->steps % DISTD_EXPERT_WINDOW] = rows;
    e->steps++;
    e->total += rows;
  }
  pthread_mutex_unlock(&s->mu);
}

static void count_of(const expert *e, distd_expert_count *c) {
  uint64_t recent = 0;
  for (int k = 0; k < DISTD_EXPERT_WINDOW; k++) recent += e->window[k];
  *c = (distd_expert_count){
      .expert_id = e->id,
      .steps = e->steps,
      .tokens_total = e->total,
      .tokens_recent = recent,
      .tokens_last = e->steps ? e->window[(e->steps - 1) % DISTD_EXPERT_WINDOW] : 0,
  };
}

int distd_expert_stats_snapshot(distd_expert_stats *s, distd_expert_count **out, int *n) {
  int rc = 0;
  *out = NULL;
  *n = 0;
  if (!s) return 0;
  pthread_mutex_lock(&s->mu);
  if (s->n == 0) goto out;
  if (!(*out = malloc(sizeof **out * (size_t)s->n))) {
    rc = DIST_ENOMEM;
    goto out;
  }
  for (int i = 0; i < s->n; i++) count_of(&s->e[i], &(*out)[i]);
  *n = s->n;
out:
  pthread_mutex_unlock(&s->mu);
  return rc;
}
