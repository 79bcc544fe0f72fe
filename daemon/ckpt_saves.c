/* The checkpoint saves in progress on one daemon, and those it saw
 * committed while a crossing commit may still come: see ckpt_saves.h. A
 * plain array scanned under a lock: it holds a handful of ids at a time
 * (one per save running or just committed), and is looked at once per
 * Save, Commit and Discard and once per rank file a commit considers. */
#include "ckpt_saves.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

typedef struct mark {
  char id[72];  /* distd_ckpt_check_id allows 64 characters */
  int64_t at_ms; /* when last marked in progress; lapses keep_ms after */
  uint64_t seq;  /* in progress: when its Save began here; committed: when committed */
  int committed;
} mark;

/* At most this many files from before the record began are remembered as
 * committed; past it the one noted longest ago is forgotten (it then
 * waits out its time, as an unknown one does). */
#define SEEN_COMMITTED_MAX 256

struct distd_ckpt_saves {
  pthread_mutex_t mu, commit_mu;
  int64_t keep_ms;
  int64_t since_wall_ms; /* when this record began, on the clock of file times */
  uint64_t seq; /* orders Saves beginning and commits on this daemon */
  int n;
  /* At most DISTD_CKPT_SAVES_MAX of each kind */
  mark marks[2 * DISTD_CKPT_SAVES_MAX];
  int nseen; /* how many files from before were noted, ever: a ring */
  char seen_committed[SEEN_COMMITTED_MAX][96];
};

/* Now on the wall clock, the one file modification times are on. */
static int64_t wall_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

distd_ckpt_saves *distd_ckpt_saves_new(int64_t keep_ms) {
  distd_ckpt_saves *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->commit_mu, NULL);
  s->keep_ms = keep_ms;
  s->since_wall_ms = wall_now_ms();
  return s;
}

void distd_ckpt_saves_free(distd_ckpt_saves *s) {
  if (!s) return;
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->commit_mu);
  free(s);
}

static void drop(distd_ckpt_saves *s, int i) { s->marks[i] = s->marks[--s->n]; }

/* When the oldest save in progress began (UINT64_MAX when none is); with
 * s->mu held. */
static uint64_t oldest_in_progress(const distd_ckpt_saves *s) {
  uint64_t oldest = UINT64_MAX;
  for (int i = 0; i < s->n; i++)
    if (!s->marks[i].committed && s->marks[i].seq < oldest) oldest = s->marks[i].seq;
  return oldest;
}

/* Drops the saves in progress that lapsed, then the committed ones no
 * crossing commit can follow any more: no save that began before their
 * commit is still in progress (ckpt_saves.h). With s->mu held. */
static void forget_lapsed(distd_ckpt_saves *s, int64_t now) {
  for (int i = 0; i < s->n;)
    if (!s->marks[i].committed && now - s->marks[i].at_ms >= s->keep_ms) drop(s, i);
    else i++;
  uint64_t oldest = oldest_in_progress(s);
  for (int i = 0; i < s->n;)
    if (s->marks[i].committed && s->marks[i].seq < oldest) drop(s, i);
    else i++;
}

/* The index of id's mark, or -1; with s->mu held. */
static int find(const distd_ckpt_saves *s, const char *id) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->marks[i].id, id) == 0) return i;
  return -1;
}

/* How many marks of this kind there are; with s->mu held. */
static int count(const distd_ckpt_saves *s, int committed) {
  int k = 0;
  for (int i = 0; i < s->n; i++) k += s->marks[i].committed == committed;
  return k;
}

/* A new mark for id, not yet filled in past its id; with s->mu held and
 * room in s->marks. */
static int new_mark(distd_ckpt_saves *s, const char *id) {
  int i = s->n++;
  memset(&s->marks[i], 0, sizeof s->marks[i]);
  strncpy(s->marks[i].id, id, sizeof s->marks[i].id - 1);
  return i;
}

/* A new mark of id's save in progress, or -1 when DISTD_CKPT_SAVES_MAX
 * saves are; with s->mu held. */
static int add_in_progress(distd_ckpt_saves *s, const char *id) {
  if (count(s, 0) >= DISTD_CKPT_SAVES_MAX) return -1;
  int i = new_mark(s, id);
  s->marks[i].seq = ++s->seq;
  return i;
}

int distd_ckpt_saves_mark(distd_ckpt_saves *s, const char *id, int rank, dist_errbuf *eb) {
  int64_t now = distd_now_ms();
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  forget_lapsed(s, now);
  int i = find(s, id);
  if (i >= 0 && s->marks[i].committed) drop(s, i), i = -1; /* saved again */
  if (i < 0) i = add_in_progress(s, id);
  if (i >= 0) s->marks[i].at_ms = now;
  else
    rc = dist_fail(eb, DIST_EUNAVAIL, "rank %d has %d checkpoint saves in progress, "
                   "committed or discarded by none yet: save again later", rank, count(s, 0));
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void distd_ckpt_saves_settle(distd_ckpt_saves *s, const char *id) {
  pthread_mutex_lock(&s->mu);
  int i = find(s, id);
  if (i >= 0) drop(s, i);
  pthread_mutex_unlock(&s->mu);
}

/* Makes room for one more committed save by forgetting the one committed
 * longest ago; with s->mu held. */
static void forget_oldest_committed(distd_ckpt_saves *s) {
  int oldest = -1;
  for (int i = 0; i < s->n; i++)
    if (s->marks[i].committed && (oldest < 0 || s->marks[i].seq < s->marks[oldest].seq))
      oldest = i;
  if (oldest >= 0) drop(s, oldest);
}

void distd_ckpt_saves_committed(distd_ckpt_saves *s, const char *id) {
  pthread_mutex_lock(&s->mu);
  forget_lapsed(s, distd_now_ms());
  if (count(s, 1) >= DISTD_CKPT_SAVES_MAX) forget_oldest_committed(s);
  int i = find(s, id);
  if (i < 0) i = new_mark(s, id);
  s->marks[i].committed = 1;
  s->marks[i].seq = ++s->seq;
  pthread_mutex_unlock(&s->mu);
}

/* id's mark as it stands now: its index, or -1; with s->mu held. */
static int current(distd_ckpt_saves *s, const char *id) {
  forget_lapsed(s, distd_now_ms());
  return find(s, id);
}

int distd_ckpt_saves_in_progress(void *arg, const char *id) {
  distd_ckpt_saves *s = arg;
  pthread_mutex_lock(&s->mu);
  int i = current(s, id);
  int found = i >= 0 && !s->marks[i].committed;
  pthread_mutex_unlock(&s->mu);
  return found;
}

int distd_ckpt_saves_keeps(void *arg, const char *id) {
  distd_ckpt_saves *s = arg;
  pthread_mutex_lock(&s->mu);
  int found = current(s, id) >= 0;
  pthread_mutex_unlock(&s->mu);
  return found;
}

/* Twice keep_ms: a crossing commit may come keep_ms after the Save of the
 * save crossing it was answered, which may itself come keep_ms after the
 * crossed save's file was written (ckpt_saves.h). */
int distd_ckpt_saves_began_lately(distd_ckpt_saves *s) {
  return wall_now_ms() - s->since_wall_ms < 2 * s->keep_ms;
}

/* Whether file was noted committed; with s->mu held. */
static int seen_committed(const distd_ckpt_saves *s, const char *file) {
  int n = s->nseen < SEEN_COMMITTED_MAX ? s->nseen : SEEN_COMMITTED_MAX;
  for (int i = 0; i < n; i++)
    if (!strcmp(s->seen_committed[i], file)) return 1;
  return 0;
}

void distd_ckpt_saves_saw_in_manifest(distd_ckpt_saves *s, const char *file, int64_t mtime_ms) {
  if (mtime_ms < 0 || mtime_ms >= s->since_wall_ms ||
      strlen(file) >= sizeof s->seen_committed[0])
    return;
  pthread_mutex_lock(&s->mu);
  if (!seen_committed(s, file))
    strcpy(s->seen_committed[s->nseen++ % SEEN_COMMITTED_MAX], file);
  pthread_mutex_unlock(&s->mu);
}

int distd_ckpt_saves_may_be_from_before_restart(void *arg, const char *file, int64_t mtime_ms) {
  distd_ckpt_saves *s = arg;
  if (mtime_ms >= s->since_wall_ms || wall_now_ms() - mtime_ms >= 2 * s->keep_ms) return 0;
  pthread_mutex_lock(&s->mu);
  int committed = seen_committed(s, file);
  pthread_mutex_unlock(&s->mu);
  return !committed;
}

void distd_ckpt_saves_commit_begin(distd_ckpt_saves *s) { pthread_mutex_lock(&s->commit_mu); }

void distd_ckpt_saves_commit_end(distd_ckpt_saves *s) { pthread_mutex_unlock(&s->commit_mu); }
