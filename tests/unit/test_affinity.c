/* cpu_affinity (daemon/affinity.c): the CPU list syntax, and pinning a
 * process whose threads already run. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "affinity.h"

static int parses_to(const char *text, const int *cpus, int n) {
  cpu_set_t set, want;
  if (distd_cpu_list_parse(text, &set, NULL) != 0) return 0;
  CPU_ZERO(&want);
  for (int i = 0; i < n; i++) CPU_SET(cpus[i], &want);
  return CPU_EQUAL(&set, &want);
}

Test(affinity, lists_ranges_and_both) {
  cr_assert(parses_to("0", (int[]){0}, 1));
  cr_assert(parses_to("3", (int[]){3}, 1));
  cr_assert(parses_to("0-3", (int[]){0, 1, 2, 3}, 4));
  cr_assert(parses_to("0,2-3,7", (int[]){0, 2, 3, 7}, 4));
  cr_assert(parses_to("5-5", (int[]){5}, 1));
}

Test(affinity, junk_is_refused_naming_the_list) {
  const char *bad[] = {"", "x", "-1", "1-", "3-1", "0,", ",0", "0,,1", "0;1", "0 1",
                       "99999", "0-99999", "1.5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cpu_set_t set;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_assert_eq(distd_cpu_list_parse(bad[i], &set, &eb), DIST_EINVAL, "'%s'", bad[i]);
    char want[64];
    snprintf(want, sizeof want, "'%s' is not a CPU list", bad[i]);
    cr_assert(strstr(dist_errbuf_msg(&eb), want), "%s", dist_errbuf_msg(&eb));
  }
}

static pid_t early_tid;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int pinned;

static void *early_thread(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  early_tid = (pid_t)syscall(SYS_gettid);
  pthread_cond_broadcast(&cond);
  while (!pinned) pthread_cond_wait(&cond, &mu);
  pthread_mutex_unlock(&mu);
  return NULL;
}

static void *later_thread(void *arg) {
  cpu_set_t *out = arg;
  sched_getaffinity(0, sizeof *out, out);
  return NULL;
}

Test(affinity, threads_running_before_and_started_after_are_pinned) {
  cpu_set_t allowed;
  cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &allowed)) last = c;
  char list[16];
  snprintf(list, sizeof list, "%d", last);
  pthread_t early, later;
  pthread_mutex_lock(&mu);
  pthread_create(&early, NULL, early_thread, NULL);
  while (!early_tid) pthread_cond_wait(&cond, &mu);
  pthread_mutex_unlock(&mu);

  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_pin_process(list, &eb), 0, "%s", dist_errbuf_msg(&eb));
  cpu_set_t one, got_early, got_later;
  CPU_ZERO(&one);
  CPU_SET(last, &one);
  cr_assert_eq(sched_getaffinity(early_tid, sizeof got_early, &got_early), 0);
  cr_assert(CPU_EQUAL(&got_early, &one), "the thread already running was not pinned");
  pthread_create(&later, NULL, later_thread, &got_later);
  pthread_join(later, NULL);
  cr_assert(CPU_EQUAL(&got_later, &one), "a thread started afterwards was not pinned");

  pthread_mutex_lock(&mu);
  pinned = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&mu);
  pthread_join(early, NULL);
}

Test(affinity, empty_leaves_the_affinity_alone_and_unusable_cpus_are_named) {
  cpu_set_t before, after;
  sched_getaffinity(0, sizeof before, &before);
  cr_assert_eq(distd_pin_process("", NULL), 0);
  sched_getaffinity(0, sizeof after, &after);
  cr_assert(CPU_EQUAL(&before, &after));
  dist_errbuf eb = DIST_ERRBUF_INIT;
  char list[32], want[64];
  snprintf(list, sizeof list, "0-%d", CPU_SETSIZE - 1);
  cr_assert_eq(distd_pin_process(list, &eb), DIST_EINVAL);
  int first_missing = 0;
  while (CPU_ISSET(first_missing, &before)) first_missing++;
  snprintf(want, sizeof want, "CPU %d is not one this process may use", first_missing);
  cr_assert(strstr(dist_errbuf_msg(&eb), want), "%s", dist_errbuf_msg(&eb));
  sched_getaffinity(0, sizeof after, &after);
  cr_assert(CPU_EQUAL(&before, &after), "a refused list changed the affinity");
}
