/* A tape's names between trainers of different pid namespaces: two
 * trainers (tape_pid1_trainer.c), each pid 1 of a pid namespace of its
 * own as in containers, each with a tape on the same two daemons. A tape
 * named by its pid alone made the same gradient names in both, so one
 * trainer's backward met the other's gradient and its free deleted it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "harness_fixture.h"

#define WAIT_MS 40000

TestSuite(tape_names, .fini = stop_cluster);

static const char *trainer_path(char *buf, size_t len) {
  const char *root = getenv("DIST_BUILD_ROOT");
  snprintf(buf, len, "%s/tests/integration/tape_pid1_trainer", root ? root : "build");
  return buf;
}

/* A trainer run as pid 1 of a new pid namespace, its stdin and stdout
 * pipes to this process. Between fork and exec only async-signal-safe
 * calls (the test process has gRPC threads). */
typedef struct held_trainer {
  pid_t pid;
  int to, from;
} held_trainer;

static void spawn_held(held_trainer *h, const char *const *argv) {
  int in[2], out[2];
  cr_assert(pipe(in) == 0 && pipe(out) == 0, "pipe: %s", strerror(errno));
  pid_t parent = getpid();
  h->pid = fork();
  cr_assert(h->pid >= 0, "fork: %s", strerror(errno));
  if (h->pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent) _exit(127);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(127);
    close(in[1]), close(out[0]);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(in[0]), close(out[1]);
  h->to = in[1];
  h->from = out[0];
}

/* Reads the trainer's output into buf until it holds `until` (NULL: until
 * the trainer closes it), WAIT_MS at most; 1 when `until` came. */
static int read_until(held_trainer *h, char *buf, size_t len, const char *until) {
  size_t have = strlen(buf);
  double end = harness_now_s() + WAIT_MS / 1000.0;
  while ((!until || !strstr(buf, until)) && have + 1 < len && harness_now_s() < end) {
    struct pollfd p = {h->from, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(h->from, buf + have, len - have - 1);
    if (n <= 0) break;
    have += (size_t)n;
    buf[have] = 0;
  }
  return until && strstr(buf, until) != NULL;
}

/* Its exit status once it exits, WAIT_MS at most; SIGKILL after. */
static int reap(held_trainer *h) {
  close(h->to), close(h->from);
  int status = 0;
  double end = harness_now_s() + WAIT_MS / 1000.0;
  while (waitpid(h->pid, &status, WNOHANG) == 0) {
    if (harness_now_s() > end) {
      kill(h->pid, SIGKILL);
      waitpid(h->pid, &status, 0);
      return -1;
    }
    harness_sleep_ms(20);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The text after "key " on the n-th line (from 0) that starts with it. */
static void field(const char *out, const char *key, int nth, char *buf, size_t len) {
  buf[0] = 0;
  size_t k = strlen(key);
  for (const char *line = out; line && *line; line = strchr(line, '\n'), line += line != NULL) {
    if (strncmp(line, key, k) != 0 || line[k] != ' ' || nth-- > 0) continue;
    const char *end = strchr(line, '\n');
    size_t n = end ? (size_t)(end - line - k - 1) : strlen(line + k + 1);
    snprintf(buf, len, "%.*s", (int)n, line + k + 1);
    return;
  }
}

static void expect_pid_1(const char *who, const char *out) {
  char pid[16];
  field(out, "pid", 0, pid, sizeof pid);
  cr_assert_str_eq(pid, "1", "%s did not run as pid 1 of its namespace:\n%s", who, out);
}

/* Trainer a holds its tape's gradient of a.x (x = 1 2 3 4: 2 4 6 8) while
 * trainer b, also pid 1, makes and frees a tape of its own on the same
 * daemons; a's gradient must have a name b's tape did not make, and read
 * as before after b's free. */
Test(tape_names, trainers_of_pid_1_in_two_pid_namespaces_keep_their_tapes_apart,
     .timeout = 240) {
  char *err = NULL;
  if (harness_run("unshare -p -f --kill-child true", NULL, &err, 30) != 0)
    cr_skip_test("this machine refuses a pid namespace (unshare -p -f --kill-child: %s)",
                 err ? err : "");
  free(err);
  harness_start(&cluster, 2, NULL);
  char path[512], a_out[4096] = "", cmd[2048], *b_out = NULL, *b_err = NULL;
  trainer_path(path, sizeof path);
  const char *argv[] = {"unshare",  "-p", "-f", "--kill-child", path, cluster.cluster_file,
                        "a", "hold", NULL};
  held_trainer a;
  spawn_held(&a, argv);
  int ready = read_until(&a, a_out, sizeof a_out, "ready\n");
  if (ready) {
    snprintf(cmd, sizeof cmd, "unshare -p -f --kill-child %s %s b free", path,
             cluster.cluster_file);
    int b_rc = harness_run(cmd, &b_out, &b_err, WAIT_MS / 1000);
    cr_expect_eq(b_rc, 0, "trainer b failed (%d):\n%s%s", b_rc, b_out ? b_out : "",
                 b_err ? b_err : "");
    cr_expect_eq(write(a.to, "go\n", 3), 3, "telling a to go on: %s", strerror(errno));
    read_until(&a, a_out, sizeof a_out, NULL);
  }
  int a_rc = reap(&a);
  cr_assert(ready, "trainer a never got ready:\n%s", a_out);
  expect_pid_1("trainer a", a_out);
  expect_pid_1("trainer b", b_out ? b_out : "");
  char a_grad[256], b_grad[256], before[64], after[64];
  field(a_out, "grad", 0, a_grad, sizeof a_grad);
  field(b_out, "grad", 0, b_grad, sizeof b_grad);
  cr_assert(a_grad[0] && b_grad[0], "no gradient name:\na:\n%s\nb:\n%s", a_out, b_out);
  cr_expect_str_neq(a_grad, b_grad, "both tapes named x's gradient '%s'", a_grad);
  field(b_out, "values", 0, before, sizeof before);
  cr_assert_str_eq(before, "20 40 60 80", "b's gradient of x = 10 20 30 40:\n%s", b_out);
  field(a_out, "values", 0, before, sizeof before);
  field(a_out, "values", 1, after, sizeof after);
  cr_assert_str_eq(before, "2 4 6 8", "a's gradient of x = 1 2 3 4:\n%s", a_out);
  cr_assert_str_eq(after, "2 4 6 8", "a's gradient after b's tape was freed:\n%s", a_out);
  cr_assert_eq(a_rc, 0, "trainer a failed (%d):\n%s", a_rc, a_out);
  free(b_out);
  free(b_err);
  stop_cluster();
}
