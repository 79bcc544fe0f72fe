/* distctl launch: like paddle.distributed.launch or torchrun. Starts N
 * trainers with DIST_RANK, DIST_WORLD_SIZE, DIST_CLUSTER and DIST_JOB_ID;
 * every rank's output goes to LOGDIR/workerlog.<rank>, rank 0's also to
 * the console. Without a cluster it runs one of N local daemons for the
 * job; --endpoint, one daemon for every trainer, is refused. If a rank
 * fails, or cannot be started (fork fails), the others are stopped and
 * the status is non-zero. With --json, rank 0's console copy
 * goes to stderr instead, and stdout holds only one JSON object at the end:
 * each rank's exit status or signal, and the job's. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster.h"
#include "distctl.h"
#include "local_cluster.h"
#include "random.h"

#define MAX_RANKS 64

typedef struct job {
  int n;
  pid_t pids[MAX_RANKS];   /* 0 once reaped, and for a rank never started */
  pid_t groups[MAX_RANKS]; /* each rank's process group, kept after it exits;
                              0 for a rank never started */
  int status[MAX_RANKS];   /* each rank's wait status, once reaped */
  int stopped[MAX_RANKS];  /* still running when a failure stopped the job */
  int console_fd; /* read end of rank 0's output pipe, -1 when closed */
  int log0_fd;
  FILE *console;  /* where rank 0's copy goes: stdout, or stderr with --json */
  int failed_rank; /* the first rank that failed, -1 when none */
  int result;      /* the first failing rank's exit status, 0 while none */
  int start_errno; /* why failed_rank could not be started, 0 when it ran */
  struct timespec stop_at; /* when stopped ranks get SIGKILL; 0 when not due */
} job;

static pid_t start_rank(int rank, int n, const char *cluster, const char *job_id,
                        const char *log_dir, int pipe_w, char **argv) {
  char log[4096], v[32];
  snprintf(log, sizeof log, "%s/workerlog.%d", log_dir, rank);
  pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0); /* a group per rank: stopping it stops what the rank started */
  int fd = pipe_w >= 0 ? pipe_w : open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) { /* else its output would land in launch's own stdout */
    fprintf(stderr, "distctl launch: rank %d: cannot write %s: %s\n", rank, log,
            strerror(errno));
    _exit(127);
  }
  dup2(fd, 1);
  dup2(fd, 2);
  snprintf(v, sizeof v, "%d", rank);
  setenv("DIST_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("DIST_WORLD_SIZE", v, 1);
  setenv("DIST_CLUSTER", cluster, 1);
  setenv("DIST_JOB_ID", job_id, 1);
  execvp(argv[0], argv);
  fprintf(stderr, "distctl launch: cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

/* Copies what rank 0 wrote to the console and its log. */
static void pump_console(job *j, int timeout_ms) {
  if (j->console_fd < 0) return;
  struct pollfd p = {j->console_fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return;
  char buf[65536];
  ssize_t n = read(j->console_fd, buf, sizeof buf);
  if (n <= 0) {
    close(j->console_fd);
    j->console_fd = -1;
    return;
  }
  fwrite(buf, 1, (size_t)n, j->console);
  fflush(j->console);
  if (write(j->log0_fd, buf, (size_t)n) != n) { /* the console copy still went out */ }
}

/* The ranks still running when the job is stopped. */
static void mark_stopped(job *j) {
  for (int r = 0; r < j->n; r++) j->stopped[r] = j->pids[r] > 0;
}

static void signal_ranks(job *j, int sig) {
  for (int r = 0; r < j->n; r++)
    if (j->groups[r] > 0) kill(-j->groups[r], sig);
}

#define STOP_GRACE_MS 5000

/* A rank's exit status as a shell reports it: 128 + N when killed by
 * signal N. */
static int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Stops the job after rank r failed with exit status code: the ranks
 * still running get SIGTERM now, and SIGKILL after STOP_GRACE_MS. */
static void stop_job(job *j, int r, int code) {
  j->result = code;
  j->failed_rank = r;
  mark_stopped(j);
  signal_ranks(j, SIGTERM);
  clock_gettime(CLOCK_MONOTONIC, &j->stop_at);
  j->stop_at.tv_sec += STOP_GRACE_MS / 1000;
}

/* The ranks started and not reaped yet. */
static int count_running(const job *j) {
  int running = 0;
  for (int r = 0; r < j->n; r++) running += j->pids[r] > 0;
  return running;
}

/* Records rank r's wait status; the first failure stops the job. */
static void rank_ended(job *j, int r, int status) {
  j->pids[r] = 0;
  j->status[r] = status;
  int code = exit_code(status);
  if (code == 0 || j->result != 0) return;
  fprintf(stderr, "distctl launch: rank %d failed with status %d; stopping "
          "the other ranks\n", r, code);
  stop_job(j, r, code);
}

/* Waits for every rank started; returns the job's status (0, or the first
 * failure's). A failure stops the other ranks' process groups: SIGTERM,
 * then SIGKILL after STOP_GRACE_MS. */
static int supervise(job *j) {
  struct timespec now;
  while (count_running(j) > 0) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (j->stop_at.tv_sec && (now.tv_sec > j->stop_at.tv_sec ||
                              (now.tv_sec == j->stop_at.tv_sec &&
                               now.tv_nsec > j->stop_at.tv_nsec))) {
      signal_ranks(j, SIGKILL);
      j->stop_at.tv_sec = 0;
    }
    pump_console(j, 50);
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (j->console_fd < 0) { struct timespec ts = {0, 20000000}; nanosleep(&ts, NULL); }
      continue;
    }
    for (int r = 0; r < j->n; r++)
      if (j->pids[r] == pid) rank_ended(j, r, status);
  }
  /* Whatever rank 0 started may still hold the console pipe: drain what is
   * there, but do not wait for it. */
  for (int i = 0; i < 20 && j->console_fd >= 0; i++) pump_console(j, 50);
  if (j->console_fd >= 0) close(j->console_fd);
  if (j->result) signal_ranks(j, SIGKILL); /* strays of failed jobs */
  return j->result;
}

/* One rank of launch --json: {"rank", "started", "stopped" (by launch
 * after another rank failed), "log", "exit_status", "signal" (killed
 * only)}; a rank never started has neither log nor exit status, and the one
 * whose start failed says why in "error". */
static json_t *rank_json(const job *j, int r, const char *log_dir) {
  int started = j->groups[r] > 0;
  json_t *o = json_pack("{s:i, s:b, s:b}", "rank", r, "started", started, "stopped",
                        j->stopped[r]);
  if (!started) {
    if (r == j->failed_rank)
      json_object_set_new(o, "error", json_sprintf("fork: %s", strerror(j->start_errno)));
    return o;
  }
  json_object_set_new(o, "log", json_sprintf("%s/workerlog.%d", log_dir, r));
  json_object_set_new(o, "exit_status", json_integer(exit_code(j->status[r])));
  if (WIFSIGNALED(j->status[r]))
    json_object_set_new(o, "signal", json_integer(WTERMSIG(j->status[r])));
  return o;
}

/* launch --json: {"status", "ok", "failed_rank", "log_dir", "ranks": [...]}. */
static json_t *job_json(const job *j, int status, const char *log_dir) {
  json_t *ranks = json_array();
  for (int r = 0; r < j->n; r++) json_array_append_new(ranks, rank_json(j, r, log_dir));
  return json_pack("{s:i, s:b, s:o, s:s, s:o}", "status", status, "ok", status == 0,
                   "failed_rank", j->failed_rank >= 0 ? json_integer(j->failed_rank) : json_null(),
                   "log_dir", log_dir, "ranks", ranks);
}

/* Starts ranks 0..n-1 in order. A rank that cannot be forked stops the
 * job as a failing rank does (status 1): its pid, -1, could never be
 * reaped, and the ranks already started would wait for it forever. */
static void start_ranks(job *j, const char *cluster, const char *job_id,
                        const char *log_dir, int console_w, char **argv) {
  for (int r = 0; r < j->n; r++) {
    pid_t pid = start_rank(r, j->n, cluster, job_id, log_dir, r == 0 ? console_w : -1, argv);
    if (pid < 0) {
      j->start_errno = errno;
      fprintf(stderr, "distctl launch: cannot start rank %d: fork: %s; stopping the "
              "ranks already started\n", r, strerror(j->start_errno));
      stop_job(j, r, 1);
      return;
    }
    setpgid(pid, pid); /* also here: no race with the child's own */
    j->pids[r] = j->groups[r] = pid;
  }
}

/* The trainers' DIST_JOB_ID, from which their op ids derive: the time and
 * 64 random bits, so that launches against the same daemons differ. Not
 * the pid: distctl in a container is often pid 1 in each, and two such
 * launches in one second shared their op ids. */
static int make_job_id(char *out, size_t len) {
  uint64_t bits;
  int err = dist_random_bytes(&bits, sizeof bits);
  if (err) return distctl_fail("cannot take random bits for the job id: %s", strerror(err));
  snprintf(out, len, "%ld-%016llx", (long)time(NULL), (unsigned long long)bits);
  return 0;
}

static int run_job(int n, const char *cluster, const char *log_dir, char **argv, int json) {
  job j = {.n = n, .console_fd = -1, .console = json ? stderr : stdout, .failed_rank = -1};
  char job_id[64], log0[4096];
  if (make_job_id(job_id, sizeof job_id) != 0) return 1;
  snprintf(log0, sizeof log0, "%s/workerlog.0", log_dir);
  j.log0_fd = open(log0, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int fds[2];
  if (j.log0_fd < 0 || pipe(fds) != 0)
    return distctl_fail("cannot write %s: %s", log0, strerror(errno));
  j.console_fd = fds[0];
  start_ranks(&j, cluster, job_id, log_dir, fds[1], argv);
  close(fds[1]);
  int rc = supervise(&j);
  close(j.log0_fd);
  if (json) distctl_print_json(job_json(&j, rc, log_dir));
  return rc;
}

/* Every trainer refuses a world size other than its cluster's (it would
 * fail at dist_init_from_env, one by one, after launch started them all
 * and made the log directory): so launch refuses it first. 0, 1 when the
 * file cannot be read, 2 when n does not fit it. */
static int check_cluster_size(const char *cluster, long n) {
  dist_member *members = NULL;
  int count = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_cluster_load(cluster, &members, &count, &eb) != 0)
    return distctl_fail("launch: %s", dist_errbuf_msg(&eb));
  free(members);
  if (count == n) return 0;
  return distctl_usage(&distctl_cmd_launch,
                       "-n %ld, but the cluster file %s lists %d daemons (one trainer per "
                       "daemon: -n %d, or no cluster file for a local cluster of %ld)",
                       n, cluster, count, count, n);
}

enum { OPT_COUNT, OPT_LOG_DIR, NOPTIONS };
static const distctl_option options[NOPTIONS + 1] = {
    [OPT_COUNT] = {"-n", "N", "how many trainers to start, 1 to " DISTCTL_NUMBER_TEXT(MAX_RANKS)
                   ": one per daemon of --cluster", NULL, DISTCTL_REQUIRED},
    [OPT_LOG_DIR] = {"--log-dir", "DIR", "where each rank's workerlog.RANK goes (default "
                     "./log)", NULL, DISTCTL_OPTIONAL},
};

static int run_launch(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_launch;
  distctl_args a;
  long n = 0;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  if (distctl_number_opt(cmd, "-n", a.value[OPT_COUNT], 1, MAX_RANKS, &n)) return 2;
  const char *log_dir = a.value[OPT_LOG_DIR] ? a.value[OPT_LOG_DIR] : "./log";
  /* Every trainer needs a daemon of its own: one endpoint cannot serve
   * them, and the local cluster launch would start instead is not it. */
  if (g->endpoint)
    return distctl_usage(cmd, "--endpoint %s names one daemon, and each trainer needs its "
                         "own: give --cluster FILE (or $DIST_CLUSTER) with one daemon per "
                         "rank, or neither for a local cluster of N", g->endpoint);
  const char *cluster = g->cluster;
  if (cluster && cluster[0]) {
    int bad = check_cluster_size(cluster, n);
    if (bad) return bad;
  }
  if (mkdir(log_dir, 0755) != 0 && errno != EEXIST)
    return distctl_fail("cannot create %s: %s", log_dir, strerror(errno));
  char local_dir[4096] = "", local_conf[4200];
  if (!cluster || !cluster[0]) { /* a local cluster just for this job */
    snprintf(local_dir, sizeof local_dir, "%s/cluster", log_dir);
    if (distctl_cluster_up(local_dir, (int)n, 30000, 1, 0, NULL, 0) != 0) return 1;
    snprintf(local_conf, sizeof local_conf, "%s/cluster.conf", local_dir);
    cluster = local_conf;
  }
  char abs_cluster[4300];
  if (!realpath(cluster, abs_cluster)) snprintf(abs_cluster, sizeof abs_cluster, "%s", cluster);
  signal(SIGPIPE, SIG_IGN);
  int rc = run_job((int)n, abs_cluster, log_dir, a.rest, g->json);
  if (local_dir[0]) distctl_cluster_down(local_dir, 1);
  return rc;
}

const distctl_command distctl_cmd_launch = {
    .name = "launch",
    .help = "run N trainer processes (a local cluster of N daemons unless --cluster; not\n"
    "      --endpoint: each trainer needs a daemon of its own), each\n"
    "      one's output in DIR/workerlog.RANK (DIR: ./log unless --log-dir); with\n"
    "      --json rank 0's output goes to stderr and stdout gets one JSON object at the\n"
    "      end: each rank's exit_status (and signal), the job's status",
    .run = run_launch,
    .options = options,
    .after_dashes = {"PROGRAM [ARGS...]", DISTCTL_REQUIRED}};
