/* The process token libdist names its tensors with (process_token.h):
 * kept by a process, and another in a child after fork, whose names would
 * otherwise be its parent's. No daemon is needed: a client connects
 * lazily. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "process_token.h"

static dist_client *lazy_client(void) {
  dist_client *c = NULL;
  cr_assert_eq(dist_connect("127.0.0.1:1", NULL, &c), 0);
  return c;
}

static void expect_hex_token(const char *t) {
  cr_assert_eq(strlen(t), DIST_PROCESS_TOKEN_LEN, "'%s'", t);
  cr_assert_eq(strspn(t, "0123456789abcdef"), DIST_PROCESS_TOKEN_LEN, "'%s'", t);
}

Test(process_token, a_child_of_fork_takes_a_token_of_its_own) {
  dist_client *c = lazy_client();
  char parent[DIST_PROCESS_TOKEN_LEN + 1], again[DIST_PROCESS_TOKEN_LEN + 1];
  char child[DIST_PROCESS_TOKEN_LEN + 1] = "";
  cr_assert_eq(dist_process_token(c, parent), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_process_token(c, again), 0, "%s", dist_errmsg(c));
  cr_assert_str_eq(again, parent, "a process keeps its token");
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    char mine[DIST_PROCESS_TOKEN_LEN + 1] = "";
    int ok = dist_process_token(c, mine) == 0;
    _exit(ok && write(fds[1], mine, sizeof mine) == (ssize_t)sizeof mine ? 0 : 1);
  }
  close(fds[1]);
  ssize_t n = read(fds[0], child, sizeof child);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0 && n == (ssize_t)sizeof child,
            "the child took no token (status %d, %zd bytes)", status, n);
  expect_hex_token(child);
  cr_assert_str_neq(child, parent, "the child kept its parent's token");
  cr_assert_eq(dist_process_token(c, again), 0, "%s", dist_errmsg(c));
  cr_assert_str_eq(again, parent, "the parent keeps its token after the fork");
  dist_close(c);
}
