/* The process token of process_token.h: random, because a pid names a
 * process only within its pid namespace, and only while it runs. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "process_token.h"
#include "random.h"

/* Guards token and watching. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char token[DIST_PROCESS_TOKEN_LEN + 1]; /* "" until taken */
static int watching;                           /* the fork handlers are registered */

/* A child of fork starts with its parent's token and must take its own.
 * The lock is held across the fork, so the child's copy of it is free and
 * of token whole. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&lock); }
static void after_fork_in_child(void) {
  token[0] = 0;
  pthread_mutex_unlock(&lock);
}

/* Under lock. */
static int watch_forks(dist_client *c) {
  if (watching) return 0;
  int err = pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  if (err)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory registering libdist's fork "
                            "handler (pthread_atfork: %s)", strerror(err));
  watching = 1;
  return 0;
}

/* Under lock. */
static int take_token(dist_client *c) {
  uint64_t bits = 0;
  int err = dist_random_bytes(&bits, sizeof bits);
  if (err)
    return dist_client_fail(c, DIST_EIO,
                            "cannot take the random token that tells this process's "
                            "tensor names apart: %s", strerror(err));
  snprintf(token, sizeof token, "%016llx", (unsigned long long)bits);
  return 0;
}

int dist_process_token(dist_client *c, char out[DIST_PROCESS_TOKEN_LEN + 1]) {
  pthread_mutex_lock(&lock);
  int rc = watch_forks(c);
  if (rc == 0 && !token[0]) rc = take_token(c);
  if (rc == 0) memcpy(out, token, sizeof token);
  pthread_mutex_unlock(&lock);
  return rc;
}
