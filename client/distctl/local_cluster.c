#include "local_cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist.h"
#include "distctl.h"
#include "random.h"

#define MAX_DAEMONS DISTCTL_MAX_DAEMONS

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Listener ports come from below the kernel's ephemeral range (32768 and
 * up): a port picked there could be taken by an outgoing connection (the
 * daemons dial each other) before its daemon binds it. All sockets stay
 * bound until every port is picked, so the ports differ. The search
 * starts at a random port: two distctl started in one second (as pid 1 of
 * their containers, sharing the host's network) started at the same one
 * when it came from the pid and the time, and their daemons raced for it
 * once the probes closed. */
static void pick_ports(int *ports, int count) {
  int fds[3 * MAX_DAEMONS];
  unsigned start = 0;
  if (dist_random_bytes(&start, sizeof start) != 0)
    start = (unsigned)getpid() * 7919u + (unsigned)time(NULL);
  int port = 20000 + (int)(start % 12000u);
  for (int i = 0; i < count; i++) {
    for (int tries = 0; tries < 12000; tries++) {
      port = port + 1 >= 32000 ? 20000 : port + 1;
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      fds[i] = socket(AF_INET, SOCK_STREAM, 0);
      if (bind(fds[i], (struct sockaddr *)&a, sizeof a) == 0) break;
      close(fds[i]);
      fds[i] = -1;
    }
    ports[i] = port;
  }
  for (int i = 0; i < count; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* $DIST_DISTD_BIN, else distd beside distctl (installed), else the build tree's
 * daemon/distd, else distd on $PATH. */
static void find_distd(char *out, size_t len) {
  const char *env = getenv("DIST_DISTD_BIN");
  if (env && env[0]) {
    snprintf(out, len, "%s", env);
    return;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    char *dir = dirname(self);
    snprintf(out, len, "%s/distd", dir);
    if (access(out, X_OK) == 0) return;
    snprintf(out, len, "%s/../../daemon/distd", dir);
    if (access(out, X_OK) == 0) return;
  }
  snprintf(out, len, "distd");
}

static pid_t spawn_daemon(const char *distd, const char *dir, int rank,
                          int http_port, const char *cpu, char **extra, int nextra) {
  char cluster[PATH_MAX], rank_s[16], http[64], log[PATH_MAX];
  snprintf(cluster, sizeof cluster, "%s/cluster.conf", dir);
  snprintf(rank_s, sizeof rank_s, "%d", rank);
  snprintf(http, sizeof http, "127.0.0.1:%d", http_port);
  snprintf(log, sizeof log, "%s/distd.%d.log", dir, rank);
  pid_t pid = fork();
  if (pid != 0) return pid;
  setsid(); /* outlive distctl; cluster down stops it by pid */
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  int null = open("/dev/null", O_RDWR);
  dup2(null, 0);
  dup2(null, 1);
  dup2(fd, 2);
  char *argv[80] = {(char *)distd, "--cluster-file", cluster, "--rank", rank_s,
                    "--http-listen", http};
  int argc = 7;
  if (cpu) argv[argc++] = "--cpu-affinity", argv[argc++] = (char *)cpu;
  for (int i = 0; i < nextra && argc < 78; i++) argv[argc++] = extra[i];
  argv[argc] = NULL;
  execvp(distd, argv);
  fprintf(stderr, "distctl: cannot run %s: %s\n", distd, strerror(errno));
  _exit(127);
}

static int write_text(const char *path, const char *text) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fputs(text, f);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

static int all_connected(dist_client *c, int n) {
  for (int r = 0; r < n; r++) {
    dist_daemon_info info;
    if (dist_info(c, r, &info) != 0) return 0;
    int up = 0;
    for (int p = 0; p < info.npeers; p++) up += info.peers[p].connected;
    dist_info_free(&info);
    if (up != n - 1) return 0;
  }
  return 1;
}

/* A daemon that exited during start-up: its status, or -1 while all run. */
static int find_dead(const pid_t *pids, int n, int *rank) {
  for (int r = 0; r < n; r++) {
    int status;
    if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
      *rank = r;
      return status;
    }
  }
  return -1;
}

/* Polls with a fresh client each time: a channel that tried too early
 * would sit in gRPC's reconnect backoff for seconds. */
static int poll_ready(const char *cluster, int n) {
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = 1000;
  dist_client *c = NULL;
  if (dist_connect_cluster(cluster, &o, &c) != 0) return 0;
  int ready = all_connected(c, n);
  dist_close(c);
  return ready;
}

static int wait_ready(const char *dir, const pid_t *pids, int n, int timeout_ms,
                      int quiet) {
  char cluster[PATH_MAX];
  snprintf(cluster, sizeof cluster, "%s/cluster.conf", dir);
  int ready = 0, dead_rank = -1;
  for (int waited = 0; waited < timeout_ms && !ready; waited += 100) {
    if (find_dead(pids, n, &dead_rank) >= 0) break;
    ready = poll_ready(cluster, n);
    if (!ready) sleep_ms(100);
    if (!quiet && !ready && waited % 3000 == 2900)
      fprintf(stderr, "distctl: still waiting for %d daemons to connect...\n", n);
  }
  if (ready) return 0;
  if (dead_rank >= 0)
    return distctl_fail("distd rank %d exited during start-up; see %s/distd.%d.log",
                        dead_rank, dir, dead_rank);
  return distctl_fail("the daemons did not all connect within %d ms; see %s/distd.*.log",
                      timeout_ms, dir);
}

/* The CPU of daemon `rank` when pinning: round robin over the CPUs this
 * process may use, so that a cluster in a cgroup stays inside it. */
static void cpu_of(int rank, char *out, size_t len) {
  cpu_set_t allowed;
  int cpus[CPU_SETSIZE], n = 0;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
  snprintf(out, len, "%d", n ? cpus[rank % n] : 0);
}

/* Whether file, an argument of process pid (relative to its working
 * directory), is dir's cluster.conf: named so, in dir however either is
 * spelled (the directory, not the file, whose replacement by a rename
 * would make it another file); as spelled when either is gone. */
static int is_cluster_file_of(pid_t pid, const char *file, const char *dir) {
  char ours[PATH_MAX], theirs[PATH_MAX + 64];
  snprintf(ours, sizeof ours, "%s/cluster.conf", dir);
  if (file[0] == '/')
    snprintf(theirs, sizeof theirs, "%s", file);
  else
    snprintf(theirs, sizeof theirs, "/proc/%d/cwd/%s", (int)pid, file);
  const char *base = strrchr(theirs, '/');
  if (strcmp(base + 1, "cluster.conf") != 0) return 0;
  theirs[base - theirs] = 0; /* its directory */
  struct stat a, b;
  if (stat(dir, &a) == 0 && stat(theirs[0] ? theirs : "/", &b) == 0)
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  return strcmp(file, ours) == 0;
}

/* Only signal a pid that is still one of dir's daemons: a distd run with
 * --cluster-file dir/cluster.conf. A pid file can outlive its daemon, and
 * its pid be reused, by another program or by another cluster's distd. */
static int is_daemon_of(pid_t pid, const char *dir) {
  char path[64], cmd[2 * PATH_MAX];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(cmd, 1, sizeof cmd - 1, f);
  fclose(f);
  cmd[n] = 0; /* the arguments are NUL-separated */
  const char *base = strrchr(cmd, '/');
  if (strcmp(base ? base + 1 : cmd, "distd") != 0) return 0;
  for (size_t at = strlen(cmd) + 1; at < n; at += strlen(cmd + at) + 1)
    if (strcmp(cmd + at, "--cluster-file") == 0 && at + strlen(cmd + at) + 1 < n)
      return is_cluster_file_of(pid, cmd + at + strlen(cmd + at) + 1, dir);
  return 0;
}

/* The pid daemon `rank` of dir was started as, or 0 without a pid file. */
static pid_t recorded_pid(const char *dir, int rank) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/distd.%d.pid", dir, rank);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int pid = 0;
  if (fscanf(f, "%d", &pid) != 1 || pid < 0) pid = 0;
  fclose(f);
  return (pid_t)pid;
}

/* Whether pid runs and is still one of dir's daemons (not a reused pid). */
static int daemon_alive(pid_t pid, const char *dir) {
  return pid > 0 && kill(pid, 0) == 0 && is_daemon_of(pid, dir);
}

/* A cluster up over a cluster that still runs would overwrite its
 * cluster.conf and pid files, and cluster down could no longer stop it.
 * Stale pid files (daemons gone) do not count. Returns 0 or 1. */
static int refuse_running(const char *dir) {
  char pids[16 * MAX_DAEMONS] = "";
  size_t used = 0;
  for (int r = 0; r < MAX_DAEMONS; r++) {
    pid_t pid = recorded_pid(dir, r);
    if (daemon_alive(pid, dir) && used < sizeof pids)
      used += (size_t)snprintf(pids + used, sizeof pids - used, "%s%d", used ? ", " : "",
                               (int)pid);
  }
  if (!used) return 0;
  return distctl_fail("a cluster is already running in %s (pids %s): distctl cluster down "
                      "--dir %s first", dir, pids, dir);
}

int distctl_cluster_up(const char *dir, int n, int timeout_ms, int quiet, int pin,
                       char **extra_args, int nextra) {
  if (n < 1 || n > MAX_DAEMONS)
    return distctl_fail("-n %d: between 1 and %d daemons", n, MAX_DAEMONS);
  if (refuse_running(dir) != 0) return 1;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return distctl_fail("cannot create %s: %s", dir, strerror(errno));
  int ports[3 * MAX_DAEMONS];
  pick_ports(ports, 3 * n);
  char text[64 * MAX_DAEMONS + 64], path[PATH_MAX], distd[PATH_MAX];
  size_t used = (size_t)snprintf(text, sizeof text, "# distctl cluster up -n %d%s\n", n,
                                 pin ? " --pin" : "");
  for (int r = 0; r < n; r++)
    used += (size_t)snprintf(text + used, sizeof text - used,
                             "127.0.0.1:%d 127.0.0.1:%d\n", ports[3 * r], ports[3 * r + 1]);
  snprintf(path, sizeof path, "%s/cluster.conf", dir);
  if (write_text(path, text) != 0)
    return distctl_fail("cannot write %s: %s", path, strerror(errno));
  find_distd(distd, sizeof distd);
  pid_t pids[MAX_DAEMONS];
  for (int r = 0; r < n; r++) {
    char cpu[16];
    cpu_of(r, cpu, sizeof cpu);
    pids[r] = spawn_daemon(distd, dir, r, ports[3 * r + 2], pin ? cpu : NULL, extra_args,
                           nextra);
    char pidtext[32];
    snprintf(pidtext, sizeof pidtext, "%d\n", (int)pids[r]);
    snprintf(path, sizeof path, "%s/distd.%d.pid", dir, r);
    write_text(path, pidtext);
  }
  if (!quiet) fprintf(stderr, "distctl: started %d daemons, waiting until they are connected\n", n);
  if (wait_ready(dir, pids, n, timeout_ms, quiet) != 0) {
    distctl_cluster_down(dir, 1);
    return 1;
  }
  if (!quiet) fprintf(stderr, "distctl: cluster of %d ready; DIST_CLUSTER=%s/cluster.conf\n", n, dir);
  return 0;
}

static void stop_pid(pid_t pid) {
  kill(pid, SIGTERM);
  for (int waited = 0; waited < 10000; waited += 50) {
    if (waitpid(pid, NULL, WNOHANG) == pid || kill(pid, 0) != 0) return;
    sleep_ms(50);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

int distctl_cluster_down(const char *dir, int quiet) {
  struct stat sb;
  if (stat(dir, &sb) != 0)
    return distctl_fail("no cluster in %s: %s", dir,
                        errno == ENOENT ? "no such directory" : strerror(errno));
  if (!S_ISDIR(sb.st_mode)) return distctl_fail("no cluster in %s: not a directory", dir);
  int stopped = 0, recorded = 0;
  for (int r = 0; r < MAX_DAEMONS; r++) {
    pid_t pid = recorded_pid(dir, r);
    if (!pid) continue;
    recorded++;
    if (daemon_alive(pid, dir)) {
      stop_pid(pid);
      stopped++;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/distd.%d.pid", dir, r);
    unlink(path);
  }
  if (!recorded)
    return distctl_fail("no cluster in %s: no distd.<rank>.pid file (not a cluster up "
                        "directory, or already down)", dir);
  if (!quiet) fprintf(stderr, "distctl: stopped %d daemon%s in %s\n", stopped,
                      stopped == 1 ? "" : "s", dir);
  return 0;
}
