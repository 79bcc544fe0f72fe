/* cpu_affinity: see affinity.h. */
#include "affinity.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int parse_cpu(const char **p, long *cpu) {
  char *end;
  if (**p < '0' || **p > '9') return -1;
  errno = 0;
  *cpu = strtol(*p, &end, 10);
  if (errno || *cpu >= CPU_SETSIZE) return -1;
  *p = end;
  return 0;
}

int distd_cpu_list_parse(const char *text, cpu_set_t *set, dist_errbuf *eb) {
  CPU_ZERO(set);
  const char *p = text;
  do {
    long lo, hi;
    if (parse_cpu(&p, &lo) != 0) break;
    hi = lo;
    if (*p == '-') {
      p++;
      if (parse_cpu(&p, &hi) != 0 || hi < lo) break;
    }
    for (long c = lo; c <= hi; c++) CPU_SET((int)c, set);
    if (*p == 0) return 0;
  } while (*p++ == ',');
  return dist_fail(eb, DIST_EINVAL, "cpu_affinity '%s' is not a CPU list such as "
                   "0, 0-3 or 0,2-3 (CPUs 0 to %d)", text, CPU_SETSIZE - 1);
}

/* Every CPU of want must be allowed now (a container or cgroup may allow
 * fewer than the machine has). */
static int check_allowed(const char *text, const cpu_set_t *want, dist_errbuf *eb) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return dist_fail(eb, DIST_EIO, "sched_getaffinity: %s", strerror(errno));
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, want) && !CPU_ISSET(c, &allowed))
      return dist_fail(eb, DIST_EINVAL, "cpu_affinity '%s': CPU %d is not one this "
                       "process may use (%d CPUs are)", text, c, CPU_COUNT(&allowed));
  return 0;
}

int distd_pin_process(const char *text, dist_errbuf *eb) {
  if (!text || !text[0]) return 0;
  cpu_set_t set;
  if (distd_cpu_list_parse(text, &set, eb) != 0 || check_allowed(text, &set, eb) != 0)
    return eb ? eb->code : DIST_EINVAL;
  DIR *d = opendir("/proc/self/task");
  if (!d) return dist_fail(eb, DIST_EIO, "/proc/self/task: %s", strerror(errno));
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    pid_t tid = (pid_t)atoi(e->d_name);
    /* A thread may have ended since the listing: nothing to pin. */
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH)
      rc = dist_fail(eb, DIST_EIO, "cpu_affinity '%s': thread %d: %s", text, (int)tid,
                     strerror(errno));
  }
  closedir(d);
  return rc;
}
