/* The systemd notify protocol, received the way systemd receives it: a
 * datagram socket bound where $NOTIFY_SOCKET points. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

static char dir[64];

/* A datagram socket bound at addr (len bytes), with a 5 s receive timeout
 * so a missing datagram fails the test instead of hanging it. */
static int bind_receiver(const struct sockaddr_un *sa, socklen_t len) {
  int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  cr_assert_geq(fd, 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  cr_assert_eq(bind(fd, (const struct sockaddr *)sa, len), 0, "bind: %m");
  return fd;
}

static void receive_exactly(int fd, const char *want) {
  char buf[512];
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  cr_assert_gt(n, 0, "no datagram within 5 s: %m");
  buf[n] = 0;
  cr_expect_str_eq(buf, want);
}

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/test_notify_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void) {
  char p[128];
  snprintf(p, sizeof p, "%s/notify", dir);
  unlink(p);
  rmdir(dir);
}

Test(notify, sends_one_datagram_to_a_path_socket, .init = make_dir,
     .fini = remove_dir) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", dir);
  int fd = bind_receiver(&sa, sizeof sa);
  setenv("NOTIFY_SOCKET", sa.sun_path, 1);
  cr_assert_eq(distd_notify("READY=1\nSTATUS=serving rank 0"), 0);
  receive_exactly(fd, "READY=1\nSTATUS=serving rank 0");
  cr_assert_eq(distd_notify("WATCHDOG=1"), 0);
  receive_exactly(fd, "WATCHDOG=1");
  close(fd);
}

Test(notify, at_sign_means_the_abstract_namespace) {
  char name[64];
  snprintf(name, sizeof name, "distd-test-notify-%d", (int)getpid());
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path + 1, name, strlen(name)); /* sun_path[0] == 0 */
  int fd = bind_receiver(
      &sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name)));
  char env[80];
  snprintf(env, sizeof env, "@%s", name);
  setenv("NOTIFY_SOCKET", env, 1);
  cr_assert_eq(distd_notify("STOPPING=1"), 0);
  receive_exactly(fd, "STOPPING=1");
  close(fd);
}

Test(notify, without_notify_socket_is_a_successful_no_op) {
  unsetenv("NOTIFY_SOCKET");
  cr_expect_eq(distd_notify("READY=1"), 0);
  setenv("NOTIFY_SOCKET", "", 1);
  cr_expect_eq(distd_notify("READY=1"), 0);
}

Test(notify, unreachable_or_malformed_socket_fails) {
  setenv("NOTIFY_SOCKET", "/nonexistent/dir/notify", 1);
  cr_expect_eq(distd_notify("READY=1"), -1);
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  cr_expect_eq(distd_notify("READY=1"), -1);
  char longpath[300];
  memset(longpath, 'a', sizeof longpath - 1);
  longpath[0] = '/';
  longpath[sizeof longpath - 1] = 0;
  setenv("NOTIFY_SOCKET", longpath, 1);
  cr_expect_eq(distd_notify("READY=1"), -1);
}

Test(notify, watchdog_interval_in_ms_from_watchdog_usec) {
  unsetenv("WATCHDOG_PID");
  unsetenv("WATCHDOG_USEC");
  cr_expect_eq(distd_notify_watchdog_ms(), 0);
  setenv("WATCHDOG_USEC", "30000000", 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 30000);
  setenv("WATCHDOG_USEC", "500", 1); /* below 1 ms still means "on" */
  cr_expect_eq(distd_notify_watchdog_ms(), 1);
  setenv("WATCHDOG_USEC", "0", 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 0);
  setenv("WATCHDOG_USEC", "12s", 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 0);
  setenv("WATCHDOG_USEC", "-5", 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 0);
}

Test(notify, watchdog_only_for_the_process_named_by_watchdog_pid) {
  char pid[32];
  setenv("WATCHDOG_USEC", "2000000", 1);
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  setenv("WATCHDOG_PID", pid, 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 2000);
  snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
  setenv("WATCHDOG_PID", pid, 1);
  cr_expect_eq(distd_notify_watchdog_ms(), 0);
}
