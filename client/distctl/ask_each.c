/* The inspection verbs' one way to ask every rank: all at once, each
 * bounded by the client's timeout, the answers in rank order. Asked one
 * after the other, N daemons that do not answer (frozen, or a host gone)
 * would cost N timeouts.
 *
 * libdist's dist_call_many asks several daemons on one completion queue,
 * but it is internal to the library and takes raw protobuf: the public
 * calls (dist_info, dist_ops, ...) ask one daemon and keep one error per
 * client. So each rank gets a client of its own (one endpoint) and is
 * asked in a thread of its own. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distctl.h"

struct distctl_ranks {
  dist_client *c; /* the cluster's */
  int n;
  dist_client **one; /* rank r's own client; NULL if it could not be made */
};

distctl_ranks *distctl_ranks_open(const distctl_global *g, dist_client *c) {
  int n = dist_world_size(c);
  distctl_ranks *rk = distctl_calloc(1, sizeof *rk, "asking %d ranks", n);
  if (!rk) return NULL;
  rk->c = c;
  rk->n = n;
  rk->one = distctl_calloc((size_t)n + 1, sizeof *rk->one, "the clients of %d ranks", n);
  if (!rk->one) {
    free(rk);
    return NULL;
  }
  /* A client of one daemon (--endpoint, or a cluster of one) is its own. */
  if (rk->n == 1) rk->one[0] = c;
  for (int r = 0; r < rk->n && rk->n > 1; r++) {
    distctl_global each = *g;
    each.cluster = NULL, each.endpoint = dist_endpoint(c, r);
    rk->one[r] = distctl_connect(&each);
  }
  return rk;
}

void distctl_ranks_close(distctl_ranks *rk) {
  if (!rk) return;
  for (int r = 0; r < rk->n && rk->n > 1; r++) dist_close(rk->one[r]);
  free(rk->one);
  free(rk);
}

/* A rank's own client names its daemon by address ("distd at HOST:PORT:
 * ..."); say it as a call of the cluster's client would ("rank R
 * (HOST:PORT): ..." or "rank R: ..."), so the tables read as before. */
static void name_rank(const distctl_ranks *rk, int r, const char *msg, char *out, size_t len) {
  if (rk->one[r] == rk->c) {
    snprintf(out, len, "%s", msg);
    return;
  }
  const char *at = dist_endpoint(rk->c, r);
  char label[300];
  int n = snprintf(label, sizeof label, "distd at %s: ", at);
  if (strncmp(msg, label, (size_t)n) == 0)
    snprintf(out, len, "rank %d (%s): %s", r, at, msg + n);
  else
    snprintf(out, len, "rank %d: %s", r, msg);
}

typedef struct asking {
  const distctl_ranks *rk;
  int rank;
  distctl_ask_fn ask;
  void *slot, *arg;
  distctl_answer *answer;
  pthread_t thread;
  int started; /* thread runs it; else it was asked in turn */
} asking;

static void *ask_one(void *arg) {
  asking *a = arg;
  dist_client *one = a->rk->one[a->rank];
  a->answer->ok = one && a->ask(one, a->slot, a->arg) == 0;
  if (!a->answer->ok)
    name_rank(a->rk, a->rank, one ? dist_errmsg(one) : "cannot connect", a->answer->error,
              sizeof a->answer->error);
  return NULL;
}

int distctl_ranks_ask(const distctl_ranks *rk, distctl_ask_fn ask, void *arg, void *slots,
                      size_t slot_size, distctl_answer *answers) {
  int n = rk->n, down = 0;
  asking *each = distctl_calloc((size_t)n + 1, sizeof *each, "asking %d ranks", n);
  if (!each) return -1;
  for (int r = 0; r < n; r++) {
    memset(&answers[r], 0, sizeof answers[r]);
    each[r] = (asking){.rk = rk, .rank = r, .ask = ask, .arg = arg, .answer = &answers[r],
                       .slot = (char *)slots + (size_t)r * slot_size};
    each[r].started = pthread_create(&each[r].thread, NULL, ask_one, &each[r]) == 0;
    if (!each[r].started) ask_one(&each[r]); /* out of threads: asked in turn */
  }
  for (int r = 0; r < n; r++) {
    if (each[r].started) pthread_join(each[r].thread, NULL);
    down += !answers[r].ok;
  }
  free(each);
  return down;
}

distctl_answer *distctl_ask_each(const distctl_global *g, dist_client *c, distctl_ask_fn ask,
                                 void *arg, size_t slot_size, void **slots, int *down) {
  int n = dist_world_size(c);
  distctl_answer *answers = distctl_calloc((size_t)n + 1, sizeof *answers,
                                           "the answers of %d ranks", n);
  *slots = answers ? distctl_calloc((size_t)n + 1, slot_size, "what %d ranks say", n) : NULL;
  distctl_ranks *rk = *slots ? distctl_ranks_open(g, c) : NULL;
  *down = rk ? distctl_ranks_ask(rk, ask, arg, *slots, slot_size, answers) : -1;
  distctl_ranks_close(rk);
  if (*down < 0) {
    free(answers);
    free(*slots);
    *slots = NULL;
    return NULL;
  }
  return answers;
}
