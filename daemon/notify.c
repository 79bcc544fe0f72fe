/* sd_notify without libsystemd: the protocol is one datagram of
 * newline-separated KEY=VALUE pairs sent to the AF_UNIX socket in
 * $NOTIFY_SOCKET. A leading '@' names the Linux abstract namespace. */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Fills sa from $NOTIFY_SOCKET's value; returns the address length or -1
 * for a value that is neither a path nor an abstract name (systemd also
 * knows "vsock:", which a daemon under systemd on the host never gets). */
static socklen_t notify_address(const char *path, struct sockaddr_un *sa) {
  size_t n = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || n < 2 || n >= sizeof sa->sun_path)
    return (socklen_t)-1;
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, path, n);
  if (path[0] == '@') {
    sa->sun_path[0] = 0;
    /* Abstract names are not NUL-terminated: the length says where they end. */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  }
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
}

int distd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa;
  int fd = -1, rc = -1;
  if (!path || !path[0]) return 0;
  socklen_t len = notify_address(path, &sa);
  if (len == (socklen_t)-1) goto out;
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) goto out;
  size_t n = strlen(state);
  ssize_t sent;
  do {
    sent = sendto(fd, state, n, MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
  } while (sent < 0 && errno == EINTR);
  rc = sent == (ssize_t)n ? 0 : -1;
out:
  if (fd >= 0) close(fd);
  return rc;
}

/* Like sd_watchdog_enabled(): the interval applies only to the process named
 * by $WATCHDOG_PID when that is set (a forked child must not ping). The
 * caller should send WATCHDOG=1 at half this interval. */
int64_t distd_notify_watchdog_ms(void) {
  const char *usec = getenv("WATCHDOG_USEC");
  const char *pid = getenv("WATCHDOG_PID");
  char *end;
  if (!usec || !usec[0]) return 0;
  if (pid && pid[0]) {
    errno = 0;
    long long p = strtoll(pid, &end, 10);
    if (errno || *end || p != (long long)getpid()) return 0;
  }
  errno = 0;
  unsigned long long us = strtoull(usec, &end, 10);
  if (errno || *end || us == 0 || usec[0] == '-') return 0;
  if (us > (unsigned long long)INT64_MAX) us = (unsigned long long)INT64_MAX;
  return (int64_t)((us + 999) / 1000); /* never round a real interval to 0 */
}
