#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char *slurp(const char *path);

const char *harness_distd(void) {
  const char *p = getenv("DIST_DISTD_BIN");
  return p ? p : "build/daemon/distd";
}

const char *harness_distctl(void) {
  const char *p = getenv("DIST_DISTCTL_BIN");
  return p ? p : "build/client/distctl/distctl";
}

const char *harness_reference_script(void) {
  static char path[1024];
  const char *src = getenv("DIST_SOURCE_ROOT");
  snprintf(path, sizeof path, "%s/tests/reference/global_scatter_ref.py", src ? src : ".");
  return path;
}

/* Listener ports come from below the kernel's ephemeral range (32768 and
 * up by default): a port picked there and released could be taken by any
 * outgoing connection (the daemons dial each other constantly) before the
 * daemon binds it. Each pick is checked by binding, and never handed out
 * twice by this process. */
int harness_free_port(void) {
  static int next = 0;
  if (!next) next = 20000 + (int)((getpid() * 7919u + (unsigned)time(NULL)) % 12000u);
  for (int tries = 0; tries < 12000; tries++) {
    int port = next;
    next = next + 1 >= 32000 ? 20000 : next + 1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  cr_assert_fail("no free loopback port between 20000 and 32000");
  return -1;
}

double harness_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void harness_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int harness_wait_all_positive(int *const *counters, int n, int timeout_ms) {
  double until = harness_now_s() + timeout_ms / 1000.0;
  for (int i = 0; i < n; i++)
    while (__atomic_load_n(counters[i], __ATOMIC_SEQ_CST) <= 0) {
      if (harness_now_s() >= until) return 0;
      harness_sleep_ms(10);
    }
  return 1;
}

static void write_cluster_file(harness *h) {
  FILE *f = fopen(h->cluster_file, "w");
  cr_assert(f, "cannot write %s", h->cluster_file);
  fprintf(f, "# test cluster\n");
  for (int r = 0; r < h->n; r++)
    fprintf(f, "127.0.0.1:%d 127.0.0.1:%d\n", h->grpc_port[r], h->peer_port[r]);
  fclose(f);
}

/* A directory of a daemon's own, mounted over the path every daemon is
 * given (harness_start_own_dirs); the strings are made before fork. */
typedef struct own_mount {
  char own[320], at[320], uid_map[64], gid_map[64];
} own_mount;

static void own_mount_make(const harness *h, int r, own_mount *m) {
  harness_own_dir(h, r, m->own, sizeof m->own);
  snprintf(m->at, sizeof m->at, "%s/ckpt", h->dir);
  snprintf(m->uid_map, sizeof m->uid_map, "%u %u 1", (unsigned)getuid(), (unsigned)getuid());
  snprintf(m->gid_map, sizeof m->gid_map, "%u %u 1", (unsigned)getgid(), (unsigned)getgid());
}

/* Async-signal-safe, for a child between fork and exec. */
static int write_text(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = (ssize_t)strlen(text);
  int ok = write(fd, text, (size_t)n) == n;
  close(fd);
  return ok ? 0 : -1;
}

/* Enters a mount namespace of its own (in a user namespace of its own
 * where only that allows it) and mounts m->own over m->at there. For a
 * child between fork and exec: async-signal-safe calls only. */
static int enter_own_dir(const own_mount *m) {
  if (unshare(CLONE_NEWNS) != 0 &&
      (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0 ||
       write_text("/proc/self/setgroups", "deny") != 0 ||
       write_text("/proc/self/uid_map", m->uid_map) != 0 ||
       write_text("/proc/self/gid_map", m->gid_map) != 0))
    return -1;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return -1;
  return mount(m->own, m->at, NULL, MS_BIND, NULL);
}

/* Starts a daemon with stderr to log, in its own directory when m is set.
 * It gets SIGKILL when the test
 * process dies: a failed cr_assert ends the test without harness_stop, and
 * its daemons must not outlive it. Between fork and exec only
 * async-signal-safe calls (the test process has gRPC threads). */
static pid_t spawn_daemon(const char *const *argv, const char *log, const own_mount *m) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent) _exit(127);
  int err = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  int out = open("/dev/null", O_WRONLY);
  if (err < 0 || out < 0 || dup2(err, 2) < 0 || dup2(out, 1) < 0) _exit(127);
  if (m && enter_own_dir(m) != 0) _exit(126);
  execve(argv[0], (char *const *)argv, environ);
  _exit(127);
}

void harness_start_rank(harness *h, int r, const char *const *extra_args) {
  char rank[16], http[64], log[320];
  snprintf(rank, sizeof rank, "%d", r);
  snprintf(http, sizeof http, "127.0.0.1:%d", h->http_port[r]);
  snprintf(log, sizeof log, "%s/distd.%d.log", h->dir, r);
  const char *argv[64] = {harness_distd(), "--cluster-file", h->cluster_file,
                          "--rank", rank, "--http-listen", http,
                          "--peer-timeout", "5s", "--connect-backoff-max", "500ms"};
  int argc = 11;
  for (int i = 0; extra_args && extra_args[i] && argc < 62; i++)
    argv[argc++] = extra_args[i];
  argv[argc] = NULL;
  cr_assert(access(argv[0], X_OK) == 0, "%s is not executable: %s", argv[0], strerror(errno));
  own_mount m;
  if (h->own_dirs) own_mount_make(h, r, &m);
  h->pids[r] = spawn_daemon(argv, log, h->own_dirs ? &m : NULL);
  cr_assert(h->pids[r] > 0, "cannot start %s: %s", argv[0], strerror(errno));
}

dist_client *harness_client_rank(harness *h, int r, long timeout_ms) {
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", h->grpc_port[r]);
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = timeout_ms;
  dist_client *c = NULL;
  cr_assert_eq(dist_connect(ep, &o, &c), 0);
  return c;
}

dist_client *harness_client_whose_call_went_unanswered(harness *h, int r, long timeout_ms) {
  dist_client *c = harness_client_rank(h, r, timeout_ms);
  cr_assert(harness_freeze(h, r, 5000), "rank %d did not stop", r);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), DIST_ETIMEDOUT, "Info to frozen rank %d: %s", r,
               dist_errmsg(c));
  return c;
}

/* A fresh client per poll: a channel that tried before the daemon listened
 * would wait out gRPC's reconnect backoff. */
static int connected_now(harness *h, int r, int connected) {
  dist_client *c = harness_client_rank(h, r, 1000);
  dist_daemon_info info;
  int ok = 0;
  if (dist_info(c, 0, &info) == 0) {
    int up = 0;
    for (int i = 0; i < info.npeers; i++) up += info.peers[i].connected;
    ok = up == connected;
    dist_info_free(&info);
  }
  dist_close(c);
  return ok;
}

int harness_wait_connected(harness *h, int r, int connected, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    if (connected_now(h, r, connected)) return 1;
    harness_sleep_ms(50);
  }
  return 0;
}

void harness_assert_all_connected(harness *h, const char *when) {
  for (int r = 0; r < h->n; r++)
    cr_assert(harness_wait_connected(h, r, h->n - 1, 20000),
              "rank %d did not connect to its %d peers within 20 s %s (log in %s)", r,
              h->n - 1, when, h->dir);
}

void harness_prepare(harness *h, int n) {
  memset(h, 0, sizeof *h);
  cr_assert(n > 0 && n <= HARNESS_MAX);
  h->n = n;
  snprintf(h->dir, sizeof h->dir, "/tmp/distd-test-XXXXXX");
  cr_assert(mkdtemp(h->dir), "mkdtemp failed");
  snprintf(h->cluster_file, sizeof h->cluster_file, "%s/cluster.conf", h->dir);
  for (int r = 0; r < n; r++) {
    h->grpc_port[r] = harness_free_port();
    h->peer_port[r] = harness_free_port();
    h->http_port[r] = harness_free_port();
  }
  write_cluster_file(h);
}

static void start_all(harness *h, const char *const *extra_args) {
  for (int r = 0; r < h->n; r++) harness_start_rank(h, r, extra_args);
  harness_assert_all_connected(h, "of its start");
}

void harness_start(harness *h, int n, const char *const *extra_args) {
  harness_prepare(h, n);
  start_all(h, extra_args);
}

void harness_own_dir(const harness *h, int r, char *out, size_t len) {
  snprintf(out, len, "%s/own%d", h->dir, r);
}

/* Whether a child can mount its own directory as daemon 0 would. */
static int own_dirs_allowed(const harness *h) {
  own_mount m;
  own_mount_make(h, 0, &m);
  pid_t pid = fork();
  if (pid == 0) _exit(enter_own_dir(&m) == 0 ? 0 : 1);
  int status = -1;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int harness_start_own_dirs(harness *h, int n, const char *const *extra_args) {
  harness_prepare(h, n);
  char path[320];
  snprintf(path, sizeof path, "%s/ckpt", h->dir);
  cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s: %s", path, strerror(errno));
  for (int r = 0; r < n; r++) {
    harness_own_dir(h, r, path, sizeof path);
    cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s: %s", path, strerror(errno));
  }
  if (!own_dirs_allowed(h)) {
    harness_remove_dir(h->dir);
    h->n = 0;
    return 0;
  }
  h->own_dirs = 1;
  start_all(h, extra_args);
  return 1;
}

int harness_kill(harness *h, int r, int sig) {
  int status = -1;
  if (h->pids[r] <= 0) return -1;
  kill(h->pids[r], sig);
  for (int waited = 0; waited < 10000; waited += 10) {
    if (waitpid(h->pids[r], &status, WNOHANG) == h->pids[r]) {
      h->pids[r] = 0;
      return status;
    }
    harness_sleep_ms(10);
  }
  kill(h->pids[r], SIGKILL);
  waitpid(h->pids[r], &status, 0);
  h->pids[r] = 0;
  return status;
}

int harness_freeze(harness *h, int r, int timeout_ms) {
  int status;
  if (h->pids[r] <= 0 || kill(h->pids[r], SIGSTOP) != 0) return 0;
  /* kill returns before the daemon's threads have all stopped; waitpid
   * reports the stop once the last one has. */
  for (double until = harness_now_s() + timeout_ms / 1e3; harness_now_s() < until;
       harness_sleep_ms(1))
    if (waitpid(h->pids[r], &status, WUNTRACED | WNOHANG) == h->pids[r] && WIFSTOPPED(status))
      return 1;
  return 0;
}

dist_client *harness_client(harness *h) {
  dist_client *c = NULL;
  cr_assert_eq(dist_connect_cluster(h->cluster_file, NULL, &c), 0, "%s",
               dist_last_connect_error());
  return c;
}

dist_client *harness_client_of(const char *cluster_file, long timeout_ms) {
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = timeout_ms;
  dist_client *c = NULL;
  cr_assert_eq(dist_connect_cluster(cluster_file, &o, &c), 0, "%s",
               dist_last_connect_error());
  return c;
}

dist_client *harness_client_deadline(harness *h, long timeout_ms) {
  return harness_client_of(h->cluster_file, timeout_ms);
}

double harness_freeze_timed(harness *h, int r) {
  cr_assert(harness_freeze(h, r, 5000), "rank %d did not stop", r);
  return harness_now_s();
}

void harness_resume_within(harness *h, int r, double t0, int rc, double most,
                           long deadline_ms) {
  double took = harness_now_s() - t0;
  kill(h->pids[r], SIGCONT);
  cr_assert(rc < 0, "the call with rank %d frozen succeeded", r);
  cr_assert_lt(took, most * (double)deadline_ms / 1000.0, "it took %.1f s, %.1f deadlines",
               took, took * 1000 / (double)deadline_ms);
}

/* Prints the last lines of rank r's log, to explain a failure. */
static void show_log(const harness *h, int r) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "tail -n 30 '%s/distd.%d.log' >&2", h->dir, r);
  if (system(cmd) != 0) fprintf(stderr, "(no log for rank %d)\n", r);
}

/* A daemon must exit 0 on SIGTERM: under AddressSanitizer a leak makes it
 * exit non-zero, so every integration test also checks the daemons for
 * leaks and crashes. */
void harness_stop(harness *h) {
  /* A test that stopped a daemon (SIGSTOP) and failed before resuming it. */
  for (int r = 0; r < h->n; r++)
    if (h->pids[r] > 0) kill(h->pids[r], SIGCONT);
  for (int r = 0; r < h->n; r++)
    if (h->pids[r] > 0) kill(h->pids[r], SIGTERM);
  for (int r = 0; r < h->n; r++) {
    if (h->pids[r] <= 0) continue;
    int status = harness_kill(h, r, SIGTERM);
    int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!clean) show_log(h, r);
    cr_expect(clean, "distd rank %d did not exit cleanly on SIGTERM (%s %d)", r,
              WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  if (harness_remove_dir(h->dir) != 0) fprintf(stderr, "cannot remove %s\n", h->dir);
}

int harness_count_files(const char *dir, const char *infix, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  size_t sl = strlen(suffix);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    n += l >= sl && !strcmp(e->d_name + l - sl, suffix) && strstr(e->d_name, infix);
  }
  closedir(d);
  return n;
}

int harness_remove_dir(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return harness_run(cmd, NULL, NULL, 30);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = calloc(1, (size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
  fclose(f);
  return s;
}

void harness_cluster_down_at_exit(const char *dir) {
  /* `read` returns at end of file: once the pipe's one writer, this
   * process, is gone. O_CLOEXEC keeps the write end out of every program
   * the test runs, the daemons included, which would hold it open. */
  char script[1200];
  snprintf(script, sizeof script, "read _; exec '%s' cluster down --dir '%s'",
           harness_distctl(), dir);
  char *const argv[] = {"sh", "-c", script, NULL};
  int fds[2];
  cr_assert_eq(pipe2(fds, O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
  pid_t pid = fork();
  cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
  if (pid == 0) { /* async-signal-safe calls only: the test has threads */
    /* a session of its own: meson's timeout kills the test's process group */
    int null = open("/dev/null", O_WRONLY);
    if (setsid() < 0 || null < 0 || dup2(fds[0], 0) < 0 || dup2(null, 1) < 0 ||
        dup2(null, 2) < 0)
      _exit(127);
    close_range(3, ~0U, 0); /* the test's own sockets and pipes are not its to hold */
    execve("/bin/sh", argv, environ);
    _exit(127);
  }
  close(fds[0]);
}

int harness_run(const char *cmd, char **out, char **err, int timeout_s) {
  char dir[] = "/tmp/distd-run-XXXXXX", full[8192], o[64], e[64];
  if (!mkdtemp(dir)) return -1;
  snprintf(o, sizeof o, "%s/out", dir);
  snprintf(e, sizeof e, "%s/err", dir);
  snprintf(full, sizeof full, "timeout -k 5 %d sh -c '%s' >%s 2>%s", timeout_s, cmd, o, e);
  int status = system(full);
  if (out) *out = slurp(o);
  if (err) *err = slurp(e);
  unlink(o);
  unlink(e);
  rmdir(dir);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

dist_client *harness_spmd_client(harness *h, int rank, const char *job) {
  return harness_spmd_client_of(h->cluster_file, h->n, rank, job);
}

dist_client *harness_spmd_client_of(const char *cluster_file, int n, int rank, const char *job) {
  char r[16], w[16];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(w, sizeof w, "%d", n);
  setenv("DIST_RANK", r, 1);
  setenv("DIST_WORLD_SIZE", w, 1);
  setenv("DIST_CLUSTER", cluster_file, 1);
  setenv("DIST_JOB_ID", job, 1);
  dist_client *c = NULL;
  cr_assert_eq(dist_init_from_env(&c), 0, "%s", dist_last_connect_error());
  return c;
}

long harness_log_size(const harness *h, int r) {
  char path[320];
  struct stat sb;
  snprintf(path, sizeof path, "%s/distd.%d.log", h->dir, r);
  return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

static int line_has_all(const char *line, size_t len, const char *const *needles) {
  char buf[2048];
  snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
  for (int i = 0; needles[i]; i++)
    if (!strstr(buf, needles[i])) return 0;
  return 1;
}

static int log_has(const harness *h, int r, long from, const char *const *needles) {
  char path[320];
  snprintf(path, sizeof path, "%s/distd.%d.log", h->dir, r);
  char *text = slurp(path);
  int found = 0;
  if (text && (long)strlen(text) >= from) {
    for (char *line = text + from; *line && !found;) {
      char *end = strchr(line, '\n');
      size_t len = end ? (size_t)(end - line) : strlen(line);
      found = line_has_all(line, len, needles);
      line += len + (end != NULL);
    }
  }
  free(text);
  return found;
}

int harness_log_wait(const harness *h, int r, long from, const char *const *needles,
                     int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    if (log_has(h, r, from, needles)) return 1;
    harness_sleep_ms(50);
  }
  return log_has(h, r, from, needles);
}

int harness_try_put(dist_client *c, const char *name, dist_dtype dt, const void *data, int ndim,
                    const int64_t *shape, const char *mesh_text, const char *placements,
                    dist_tensor **t) {
  dist_mesh *mesh = NULL;
  dist_placement p[DIST_MAX_MESH_DIMS];
  *t = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &mesh), 0, "mesh %s", mesh_text);
  cr_assert_gt(dist_parse_placements(placements, p, DIST_MAX_MESH_DIMS), 0, "placements %s",
               placements);
  int rc = dist_shard_tensor(c, name, data, dt, ndim, shape, mesh, p, t);
  dist_mesh_free(mesh);
  return rc;
}

dist_tensor *harness_put(dist_client *c, const char *name, dist_dtype dt, const void *data,
                         int ndim, const int64_t *shape, const char *mesh_text,
                         const char *placements) {
  dist_tensor *t = NULL;
  cr_assert_eq(harness_try_put(c, name, dt, data, ndim, shape, mesh_text, placements, &t), 0,
               "%s", dist_errmsg(c));
  return t;
}

dist_mesh *harness_line_mesh(int n) {
  cr_assert(n > 0 && n <= HARNESS_MAX, "a line mesh of %d ranks", n);
  int shape[1] = {n}, ranks[HARNESS_MAX];
  for (int r = 0; r < n; r++) ranks[r] = r;
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_new(1, shape, ranks, NULL, &m), 0);
  return m;
}

void harness_expect_value(dist_client *c, const char *name, const void *want,
                          size_t nbytes) {
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, name, &t), 0, "%s: %s", name, dist_errmsg(c));
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s", dist_errmsg(c));
  cr_assert_eq(n, nbytes, "%s: %zu bytes", name, n);
  cr_assert_eq(memcmp(data, want, nbytes), 0, "%s differs", name);
  free(data);
  dist_tensor_free(t);
}

static void *reduce_main(void *arg) {
  harness_reduce *r = arg;
  int64_t v[3] = {r->rank, 10 * r->rank, 1}, sum = 0;
  for (int i = 0; i < r->n; i++) sum += r->group[i];
  r->rc = dist_all_reduce(r->c, v, 3, DIST_INT64, DIST_REDUCE_SUM, r->group, r->n);
  snprintf(r->msg, sizeof r->msg, "%s", dist_errmsg(r->c));
  if (r->rc == 0 && (v[0] != sum || v[1] != 10 * sum || v[2] != r->n)) {
    r->rc = DIST_EINTERNAL;
    snprintf(r->msg, sizeof r->msg, "sum %lld, want %lld", (long long)v[0], (long long)sum);
  }
  __atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* The trainer's client, made before any thread runs a call: it sets the
 * environment, which another thread's gRPC may be reading. */
static void reduce_prepare(harness_reduce *r, harness *h, int rank, const int *group, int n,
                           const char *job) {
  *r = (harness_reduce){.c = harness_spmd_client(h, rank, job), .group = group, .n = n,
                        .rank = rank};
}

static void reduce_run(harness_reduce *r) {
  cr_assert_eq(pthread_create(&r->thread, NULL, reduce_main, r), 0);
}

void harness_reduce_start(harness_reduce *r, harness *h, int rank, const int *group, int n,
                          const char *job) {
  reduce_prepare(r, h, rank, group, n, job);
  reduce_run(r);
}

int harness_reduce_join(harness_reduce *r) {
  pthread_join(r->thread, NULL);
  dist_close(r->c);
  r->c = NULL;
  return r->rc;
}

void harness_expect_all_reduce(harness *h, const int *group, int n, const char *job,
                               const char *when) {
  harness_reduce r[HARNESS_MAX];
  for (int i = 0; i < n; i++) reduce_prepare(&r[i], h, group[i], group, n, job);
  for (int i = 0; i < n; i++) reduce_run(&r[i]);
  for (int i = 0; i < n; i++)
    cr_expect_eq(harness_reduce_join(&r[i]), 0, "%s: all_reduce on rank %d: %s", when,
                 group[i], r[i].msg);
}

int harness_in_step(dist_client *c, int rank, int n) {
  int32_t v = rank + 1;
  return dist_all_reduce(c, &v, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0) == 0 &&
         v == n * (n + 1) / 2;
}

static void *churn_loop(void *arg) {
  harness_churn *ch = arg;
  dist_client *c = harness_client(ch->h);
  dist_placement layouts[2] = {DIST_SHARD_DIM(0), DIST_REPLICATED};
  for (int i = 0; !ch->stop; i++) {
    dist_tensor *t = NULL;
    if (dist_tensor_open(c, ch->name, &t) == 0 &&
        dist_reshard(c, t, NULL, &layouts[i % 2]) == 0)
      __atomic_add_fetch(&ch->applied, 1, __ATOMIC_RELAXED);
    dist_tensor_free(t);
  }
  dist_close(c);
  return NULL;
}

void harness_churn_start(harness_churn *ch, harness *h, const char *name) {
  memset(ch, 0, sizeof *ch);
  ch->h = h;
  snprintf(ch->name, sizeof ch->name, "%s", name);
  cr_assert_eq(pthread_create(&ch->thread, NULL, churn_loop, ch), 0);
}

int harness_churn_wait_started(harness_churn *ch, int timeout_ms) {
  double until = harness_now_s() + timeout_ms / 1000.0;
  while (__atomic_load_n(&ch->applied, __ATOMIC_RELAXED) == 0 && harness_now_s() < until)
    harness_sleep_ms(1);
  return __atomic_load_n(&ch->applied, __ATOMIC_RELAXED) > 0;
}

int harness_churn_stop(harness_churn *ch) {
  ch->stop = 1;
  pthread_join(ch->thread, NULL);
  return ch->applied;
}

int harness_open_on(harness *h, int r, const char *name, dist_tensor **t) {
  dist_client *one = harness_client_rank(h, r, 5000);
  *t = NULL;
  int rc = dist_tensor_open(one, name, t);
  dist_close(one);
  return rc;
}

dist_program *harness_doubler(int sharded) {
  dist_program *p = NULL;
  cr_assert_eq(dist_program_new("doubler", &p), 0);
  int x = dist_input_dtensor(p, "x", DIST_FLOAT64);
  dist_program_output(p, dist_op_add(p, x, x));
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &m), 0);
  dist_placement pl = sharded ? (dist_placement)DIST_SHARD_DIM(0) : DIST_REPLICATED;
  cr_assert_eq(dist_program_out_dist_attr(p, m, &pl, NULL), 0);
  dist_mesh_free(m);
  return p;
}
