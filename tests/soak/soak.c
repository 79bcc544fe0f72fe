/* Soak test: mixed operations from several clients against a running
 * cluster, one daemon restarted half-way, RSS of every daemon sampled.
 *
 * The one command (builds if needed, starts a 3-daemon cluster with
 * `distctl cluster up`, runs this, stops the cluster):
 *
 *     tests/soak/run.sh [--seconds N]          (default 300)
 *
 * Run alone: soak --cluster-dir DIR [--seconds N] [--restart-rank R]
 *                 [--restart-signal TERM|KILL] [--sample-ms MS]
 * DIR is a `distctl cluster up` directory (cluster.conf, distd.<r>.pid,
 * distd.<r>.log). The restart re-runs the daemon with the arguments it had
 * (/proc/PID/cmdline, same working directory, log appended) and writes the
 * new pid to distd.<r>.pid so `distctl cluster down` still stops it.
 *
 * Workers (each its own thread and client; a client is made anew after a
 * failure, as a trainer would reconnect):
 *  - 2 tensor workers: put a fresh tensor Shard(0) on [0,1,2], reshard to
 *    Shard(1) then Replicate, read it back and compare, delete it;
 *  - 3 SPMD trainers (ranks 0, 1, 2), in lock-step rounds: all_reduce of
 *    256 Ki float32, or global_scatter of 1 MiB to each rank, results
 *    checked; after a failed round all three reconnect with a new job id;
 *  - 1 parameter worker: SGD (lr 1, async) on a float64 [48, 8] parameter on
 *    [0,1,2]; push a gradient, pull, compare with the value computed here;
 *    after a failure the parameter is made again.
 *
 * Verdict (exit 1 when any fails):
 *  - Every failed operation overlaps the restart window: from 1 s before the
 *    daemon is stopped to 10 s (peer timeout 5 s + 5 s) after the cluster
 *    is whole again. Any other failure is a failure of the soak.
 *  - Every worker kind completes operations after the window.
 *  - RSS is flat, per daemon process: its samples after a warm-up (the
 *    first sixth of its life) are split in thirds; the median of the last
 *    third must be within 10% + 16 MiB of the median of the first third.
 *    The restarted daemon is judged on its new life alone (at least 6
 *    samples), the others on the whole run.
 *  - The stopped daemon exits within 10 s of SIGTERM and the cluster is
 *    whole again within 30 s of the restart. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "dist/dist.h"

#define NRANKS 3
#define WINDOW_BEFORE_S 1.0
#define WINDOW_AFTER_S 10.0
#define MAX_SAMPLES 4096
#define MAX_FAILS 4096

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ shared state */

typedef enum { K_TENSOR, K_ALL_REDUCE, K_SCATTER, K_PARAM, K_COUNT } op_kind;
static const char *kind_name[K_COUNT] = {"tensor", "all_reduce", "global_scatter", "param"};

typedef struct failure {
  op_kind kind;
  double start, end;
  char msg[240];
} failure;

static struct {
  char dir[PATH_MAX], cluster[PATH_MAX + 16];
  double t0, seconds;
  int restart_rank, restart_sig, sample_ms;
  pthread_mutex_t mu;
  volatile int stop;
  /* results */
  uint64_t ok[K_COUNT], failed[K_COUNT], ok_after[K_COUNT];
  failure fails[MAX_FAILS];
  int nfails;
  /* restart: window start/end (0 until known), its problems */
  double kill_at, rejoined_at;
  char restart_problem[300];
  /* RSS samples per rank, with the pid they came from */
  int nsamples[NRANKS];
  double sample_t[NRANKS][MAX_SAMPLES];
  long sample_kb[NRANKS][MAX_SAMPLES];
  pid_t sample_pid[NRANKS][MAX_SAMPLES];
} S = {.restart_rank = 1, .restart_sig = SIGTERM, .sample_ms = 2000, .seconds = 300,
       .mu = PTHREAD_MUTEX_INITIALIZER};

static void record(op_kind k, double start, int rc, const char *msg) {
  double end = now_s();
  pthread_mutex_lock(&S.mu);
  if (rc == 0) {
    S.ok[k]++;
    if (S.rejoined_at > 0 && start > S.rejoined_at + WINDOW_AFTER_S) S.ok_after[k]++;
  } else {
    S.failed[k]++;
    if (S.nfails < MAX_FAILS) {
      failure *f = &S.fails[S.nfails++];
      f->kind = k, f->start = start, f->end = end;
      snprintf(f->msg, sizeof f->msg, "%.*s", (int)sizeof f->msg - 1, msg); /* cut to fit */
    }
  }
  pthread_mutex_unlock(&S.mu);
}

static dist_client *connect_cluster(uint64_t op_base, int spmd_rank) {
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = 20000;
  o.op_id_base = op_base;
  dist_client *c = NULL;
  if (dist_connect_cluster(S.cluster, &o, &c) != 0) return NULL;
  /* An SPMD trainer without touching the environment (other threads read
   * it): what dist_init_from_env would set. */
  c->spmd_rank = spmd_rank;
  return c;
}

static int running(void) { return !S.stop; }

/* ------------------------------------------------------------ tensor workers */

static int tensor_round(dist_client *c, int id, unsigned round, float *ref, char *msg,
                        size_t len) {
  int64_t shape[2] = {61 + (round * 7 + (unsigned)id) % 190, 37 + round % 101};
  int64_t n = shape[0] * shape[1];
  for (int64_t i = 0; i < n; i++) ref[i] = (float)((i * 31 + round + (unsigned)id) % 1009);
  char name[64];
  snprintf(name, sizeof name, "soak.t%d.%u", id, round);
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1,2]", NULL, &mesh);
  dist_placement s0 = DIST_SHARD_DIM(0), s1 = DIST_SHARD_DIM(1), rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  void *data = NULL;
  size_t nb = 0;
  int rc = dist_shard_tensor(c, name, ref, DIST_FLOAT32, 2, shape, mesh, &s0, &t);
  if (rc == 0) rc = dist_reshard(c, t, NULL, &s1);
  if (rc == 0) rc = dist_reshard(c, t, NULL, &rep);
  if (rc == 0) rc = dist_full_tensor(c, t, &data, &nb);
  if (rc == 0 && (nb != (size_t)n * sizeof(float) || memcmp(data, ref, nb) != 0))
    rc = dist_client_fail(c, DIST_EINTERNAL, "%s read back differs from what was put", name);
  snprintf(msg, len, "%s", rc ? dist_errmsg(c) : "");
  /* Deleted even after a failure (it may exist on some ranks); a delete
   * that fails then is expected. */
  int drc = dist_tensor_delete(c, name);
  if (rc == 0 && drc != 0) {
    rc = drc;
    snprintf(msg, len, "delete %s: %s", name, dist_errmsg(c));
  }
  free(data);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return rc;
}

static void *tensor_worker(void *arg) {
  int id = (int)(intptr_t)arg;
  float *ref = malloc(sizeof(float) * 256 * 140);
  dist_client *c = NULL;
  char msg[300];
  for (unsigned round = 0; running(); round++) {
    double start = now_s();
    if (!c) c = connect_cluster(0, -1);
    int rc = c ? tensor_round(c, id, round, ref, msg, sizeof msg) : DIST_EUNAVAIL;
    if (!c) snprintf(msg, sizeof msg, "connect: %s", dist_last_connect_error());
    record(K_TENSOR, start, rc, msg);
    if (rc != 0) {
      dist_close(c);
      c = NULL;
      sleep_ms(200);
    }
  }
  dist_close(c);
  free(ref);
  return NULL;
}

/* ------------------------------------------------------------ SPMD trainers */

enum { AR_COUNT = 256 * 1024, SC_ROWS = 1024, SC_WIDTH = 256 };

static pthread_barrier_t round_barrier;
static int round_failed, trainers_stop;

static int all_reduce_round(dist_client *c, int rank, float *buf) {
  for (size_t i = 0; i < AR_COUNT; i++) buf[i] = (float)((rank + 1) * (int)(i % 13));
  int rc = dist_all_reduce(c, buf, AR_COUNT, DIST_FLOAT32, DIST_REDUCE_SUM, NULL, 0);
  for (size_t i = 0; rc == 0 && i < AR_COUNT; i++)
    if (buf[i] != (float)(6 * (int)(i % 13)))
      rc = dist_client_fail(c, DIST_EINTERNAL, "all_reduce element %zu is %g", i, (double)buf[i]);
  return rc;
}

static int scatter_round(dist_client *c, int rank, float *x) {
  int64_t counts[NRANKS];
  for (int d = 0; d < NRANKS; d++) counts[d] = SC_ROWS;
  size_t per = (size_t)SC_ROWS * SC_WIDTH;
  for (int d = 0; d < NRANKS; d++)
    for (size_t i = 0; i < per; i++) x[d * per + i] = (float)(rank * 10 + d) + (float)(i % 7);
  const void *xs[1] = {x};
  const int64_t *lc[1] = {counts}, *gc[1] = {counts};
  void *out[1] = {NULL};
  int64_t rows[1] = {0};
  int rc = dist_global_scatter(c, xs, NULL, DIST_FLOAT32, SC_WIDTH, lc, gc, 1, NULL, 0, NULL,
                               out, rows);
  if (rc == 0 && rows[0] != NRANKS * SC_ROWS)
    rc = dist_client_fail(c, DIST_EINTERNAL, "scatter gave %lld rows", (long long)rows[0]);
  for (int s = 0; rc == 0 && s < NRANKS; s++)
    for (size_t i = 0; rc == 0 && i < per; i++)
      if (((float *)out[0])[s * per + i] != (float)(s * 10 + rank) + (float)(i % 7))
        rc = dist_client_fail(c, DIST_EINTERNAL, "rows from rank %d differ at %zu", s, i);
  free(out[0]);
  return rc;
}

/* The group's op ids: one base per epoch, the same for all three. */
static uint64_t epoch_base(int epoch) {
  return 0x50a6000000000000ull + ((uint64_t)epoch << 32);
}

static void *trainer(void *arg) {
  int rank = (int)(intptr_t)arg, epoch = 0;
  float *buf = malloc(sizeof(float) * NRANKS * SC_ROWS * SC_WIDTH);
  dist_client *c = connect_cluster(epoch_base(epoch), rank);
  char msg[300];
  for (unsigned round = 0;; round++) {
    /* Rank 0 decides, between rounds, whether the group goes on. */
    if (rank == 0) trainers_stop = !running();
    pthread_barrier_wait(&round_barrier);
    if (trainers_stop) break;
    op_kind k = round % 2 ? K_SCATTER : K_ALL_REDUCE;
    double start = now_s();
    int rc = !c ? DIST_EUNAVAIL
             : k == K_ALL_REDUCE ? all_reduce_round(c, rank, buf)
                                 : scatter_round(c, rank, buf);
    snprintf(msg, sizeof msg, "trainer %d: %s", rank,
             c ? dist_errmsg(c) : dist_last_connect_error());
    record(k, start, rc, msg);
    if (rc != 0) __atomic_store_n(&round_failed, 1, __ATOMIC_SEQ_CST);
    pthread_barrier_wait(&round_barrier);
    int again = __atomic_load_n(&round_failed, __ATOMIC_SEQ_CST);
    pthread_barrier_wait(&round_barrier); /* everyone has read it */
    if (rank == 0) __atomic_store_n(&round_failed, 0, __ATOMIC_SEQ_CST);
    if (again) { /* all three start over on fresh connections, a new epoch */
      dist_close(c);
      sleep_ms(200);
      c = connect_cluster(epoch_base(++epoch), rank);
    }
  }
  dist_close(c);
  free(buf);
  return NULL;
}

/* ------------------------------------------------------------ parameter worker */

enum { P_ROWS = 48, P_COLS = 8, P_N = P_ROWS * P_COLS };

static int make_param(dist_client *c, double *expect) {
  for (int i = 0; i < P_N; i++) expect[i] = (double)(i % 17);
  int64_t shape[2] = {P_ROWS, P_COLS};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1,2]", NULL, &mesh);
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  dist_tensor_delete(c, "soak.param"); /* from before a failure, maybe */
  int rc = dist_shard_tensor(c, "soak.param", expect, DIST_FLOAT64, 2, shape, mesh, &s0, &t);
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  o.lr = 1, o.consistency = DIST_PARAM_ASYNC, o.reduce = DIST_REDUCE_SUM;
  if (rc == 0) rc = dist_param_configure(c, "soak.param", &o);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return rc;
}

/* p -= g with small integer gradients: exact in float64. */
static int param_round(dist_client *c, unsigned step, double *expect) {
  double g[P_N];
  for (int i = 0; i < P_N; i++) g[i] = (double)((int)((i + step) % 5) - 2);
  int rc = dist_param_push(c, "soak.param", 0, g, sizeof g, NULL);
  void *data = NULL;
  size_t nb = 0;
  if (rc == 0) rc = dist_param_pull(c, "soak.param", 0, &data, &nb, NULL);
  if (rc == 0) {
    for (int i = 0; i < P_N; i++) expect[i] -= g[i];
    if (nb != sizeof g || memcmp(data, expect, nb) != 0)
      rc = dist_client_fail(c, DIST_EINTERNAL, "pulled parameter differs at step %u", step);
  }
  free(data);
  return rc;
}

static void *param_worker(void *arg) {
  (void)arg;
  double expect[P_N];
  dist_client *c = NULL;
  char msg[300];
  int fresh = 1;
  for (unsigned step = 0; running(); step++) {
    double start = now_s();
    if (!c) c = connect_cluster(0, -1);
    int rc = c ? 0 : DIST_EUNAVAIL;
    if (rc == 0 && fresh) rc = make_param(c, expect);
    if (rc == 0) rc = param_round(c, step, expect);
    snprintf(msg, sizeof msg, "%s", c ? dist_errmsg(c) : dist_last_connect_error());
    record(K_PARAM, start, rc, msg);
    fresh = rc != 0;
    if (rc != 0) {
      dist_close(c);
      c = NULL;
      sleep_ms(200);
    }
  }
  if (c) dist_tensor_delete(c, "soak.param");
  dist_close(c);
  return NULL;
}

/* ------------------------------------------------------------ daemons: pids, RSS, restart */

static pid_t read_pid(int r) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/distd.%d.pid", S.dir, r);
  FILE *f = fopen(path, "r");
  int pid = 0;
  if (f && fscanf(f, "%d", &pid) != 1) pid = 0;
  if (f) fclose(f);
  return (pid_t)pid;
}

static long rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

static void *sampler(void *arg) {
  (void)arg;
  while (running()) {
    for (int r = 0; r < NRANKS; r++) {
      pid_t pid = read_pid(r);
      long kb = pid > 0 ? rss_kb(pid) : -1;
      pthread_mutex_lock(&S.mu);
      int n = S.nsamples[r];
      if (kb > 0 && n < MAX_SAMPLES) {
        S.sample_t[r][n] = now_s() - S.t0;
        S.sample_kb[r][n] = kb;
        S.sample_pid[r][n] = pid;
        S.nsamples[r]++;
      }
      pthread_mutex_unlock(&S.mu);
    }
    for (int waited = 0; waited < S.sample_ms && running(); waited += 100) sleep_ms(100);
  }
  return NULL;
}

/* The daemon's argv (NUL-separated in /proc/PID/cmdline) and its cwd. */
static int read_cmdline(pid_t pid, char *buf, size_t len, char **argv, int max, char *cwd) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  int argc = 0;
  for (ssize_t i = 0; i < n && argc < max - 1; i += (ssize_t)strlen(buf + i) + 1)
    argv[argc++] = buf + i;
  argv[argc] = NULL;
  snprintf(path, sizeof path, "/proc/%d/cwd", (int)pid);
  ssize_t l = readlink(path, cwd, PATH_MAX - 1);
  cwd[l > 0 ? l : 0] = 0;
  return argc;
}

/* Running, and not a zombie that nobody reaped yet. */
static int alive(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  int up = f != NULL;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "State:", 6)) {
      up = !strchr(line, 'Z') && !strchr(line, 'X');
      break;
    }
  if (f) fclose(f);
  return up;
}

static pid_t spawn_again(char **argv, const char *cwd, int r) {
  char log[PATH_MAX + 32];
  snprintf(log, sizeof log, "%s/distd.%d.log", S.dir, r);
  pid_t pid = fork();
  if (pid != 0) return pid;
  setsid(); /* like distctl cluster up: it outlives us, cluster down stops it */
  if (cwd[0] && chdir(cwd) != 0) _exit(126);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644), null = open("/dev/null", O_RDWR);
  dup2(null, 0), dup2(null, 1), dup2(fd, 2);
  execv(argv[0], argv);
  _exit(127);
}

static int cluster_whole(void) {
  dist_client *c = connect_cluster(0, -1);
  int whole = c != NULL;
  for (int r = 0; whole && r < NRANKS; r++) {
    dist_daemon_info info;
    whole = dist_info(c, r, &info) == 0;
    int up = 0;
    for (int p = 0; whole && p < info.npeers; p++) up += info.peers[p].connected;
    if (whole) dist_info_free(&info);
    whole = whole && up == NRANKS - 1;
  }
  dist_close(c);
  return whole;
}

static void restart_problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void restart_problem(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&S.mu);
  if (!S.restart_problem[0]) vsnprintf(S.restart_problem, sizeof S.restart_problem, fmt, ap);
  pthread_mutex_unlock(&S.mu);
  va_end(ap);
}

static void restart_daemon(int r) {
  pid_t pid = read_pid(r);
  char buf[8192], cwd[PATH_MAX], *argv[128];
  if (pid <= 0 || read_cmdline(pid, buf, sizeof buf, argv, 128, cwd) <= 0) {
    restart_problem("cannot read rank %d's pid or command line", r);
    return;
  }
  pthread_mutex_lock(&S.mu);
  S.kill_at = now_s();
  pthread_mutex_unlock(&S.mu);
  kill(pid, S.restart_sig);
  double until = now_s() + 10;
  while (alive(pid) && now_s() < until) sleep_ms(20);
  if (alive(pid)) {
    restart_problem("rank %d (pid %d) still runs 10 s after signal %d", r, (int)pid,
                    S.restart_sig);
    kill(pid, SIGKILL);
    while (alive(pid)) sleep_ms(20);
  }
  pid_t fresh = spawn_again(argv, cwd, r);
  char path[PATH_MAX + 32], text[32];
  snprintf(path, sizeof path, "%s/distd.%d.pid", S.dir, r);
  snprintf(text, sizeof text, "%d\n", (int)fresh);
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
  printf("soak: rank %d (pid %d) stopped with signal %d, restarted as pid %d\n", r, (int)pid,
         S.restart_sig, (int)fresh);
  fflush(stdout);
  for (until = now_s() + 30; now_s() < until; sleep_ms(200))
    if (cluster_whole()) {
      pthread_mutex_lock(&S.mu);
      S.rejoined_at = now_s();
      pthread_mutex_unlock(&S.mu);
      printf("soak: cluster whole again %.1f s after the stop\n", S.rejoined_at - S.kill_at);
      return;
    }
  restart_problem("the cluster was not whole within 30 s of restarting rank %d", r);
}

/* ------------------------------------------------------------ verdict */

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

static long median(long *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_long);
  return n ? v[n / 2] : 0;
}

/* Flatness of one daemon process (samples of pid only). */
static int rss_flat(int r, pid_t pid, const char *life) {
  long v[MAX_SAMPLES], first[MAX_SAMPLES], last[MAX_SAMPLES], max = 0;
  int n = 0;
  for (int i = 0; i < S.nsamples[r]; i++)
    if (S.sample_pid[r][i] == pid) v[n++] = S.sample_kb[r][i];
  int skip = n / 6, m = n - skip, third = m / 3;
  if (third < 2) {
    printf("  rank %d (%s, pid %d): %d samples, too few to judge\n", r, life, (int)pid, n);
    return 1;
  }
  for (int i = 0; i < n; i++) max = v[i] > max ? v[i] : max;
  memcpy(first, v + skip, sizeof(long) * (size_t)third);
  memcpy(last, v + n - third, sizeof(long) * (size_t)third);
  long a = median(first, third), b = median(last, third);
  long limit = a + a / 10 + 16 * 1024;
  int flat = b <= limit;
  printf("  rank %d (%s, pid %d): %d samples, RSS median %.1f MiB (first third after "
         "warm-up) -> %.1f MiB (last third), max %.1f MiB, limit %.1f MiB: %s\n",
         r, life, (int)pid, n, a / 1024.0, b / 1024.0, max / 1024.0, limit / 1024.0,
         flat ? "flat" : "GROWS");
  return flat;
}

static int verdict(void) {
  int ok = 1;
  double w0 = S.kill_at - WINDOW_BEFORE_S, w1 = S.rejoined_at + WINDOW_AFTER_S;
  printf("soak: %.0f s, restart of rank %d at %.1f s, window [%.1f s, %.1f s]\n",
         now_s() - S.t0, S.restart_rank, S.kill_at - S.t0, w0 - S.t0, w1 - S.t0);
  printf("  %-15s %10s %8s %14s\n", "operation", "ok", "failed", "ok after window");
  for (int k = 0; k < K_COUNT; k++) {
    printf("  %-15s %10llu %8llu %14llu\n", kind_name[k], (unsigned long long)S.ok[k],
           (unsigned long long)S.failed[k], (unsigned long long)S.ok_after[k]);
    if (S.ok_after[k] == 0) {
      printf("FAIL: no %s operation succeeded after the restart window\n", kind_name[k]);
      ok = 0;
    }
  }
  int outside = 0;
  for (int i = 0; i < S.nfails; i++) {
    const failure *f = &S.fails[i];
    int in = S.kill_at > 0 && S.rejoined_at > 0 && f->end >= w0 && f->start <= w1;
    if (in) continue;
    if (outside++ < 10)
      printf("FAIL: %s failed outside the restart window (%.1f s to %.1f s): %s\n",
             kind_name[f->kind], f->start - S.t0, f->end - S.t0, f->msg);
  }
  printf("  failures inside the restart window: %d, outside: %d\n", S.nfails - outside, outside);
  if (outside) ok = 0;
  if (S.restart_problem[0]) {
    printf("FAIL: %s\n", S.restart_problem);
    ok = 0;
  }
  printf("  RSS (flat: last third's median <= first third's * 1.10 + 16 MiB):\n");
  for (int r = 0; r < NRANKS; r++) {
    pid_t first = S.nsamples[r] ? S.sample_pid[r][0] : 0;
    pid_t last = S.nsamples[r] ? S.sample_pid[r][S.nsamples[r] - 1] : 0;
    if (r == S.restart_rank && first != last) {
      ok &= rss_flat(r, last, "after the restart");
      continue;
    }
    if (!rss_flat(r, last, "whole run")) ok = 0;
  }
  printf("soak: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

/* ------------------------------------------------------------ main */

static int usage(void) {
  fprintf(stderr, "usage: soak --cluster-dir DIR [--seconds N] [--restart-rank R] "
                  "[--restart-signal TERM|KILL] [--sample-ms MS]\n");
  return 2;
}

static int parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (!strcmp(a, "--cluster-dir")) {
      if (!realpath(v, S.dir)) return fprintf(stderr, "soak: no directory %s\n", v), 2;
    } else if (!strcmp(a, "--seconds")) {
      S.seconds = atof(v);
    } else if (!strcmp(a, "--restart-rank")) {
      S.restart_rank = atoi(v);
    } else if (!strcmp(a, "--restart-signal")) {
      S.restart_sig = !strcmp(v, "KILL") ? SIGKILL : SIGTERM;
    } else if (!strcmp(a, "--sample-ms")) {
      S.sample_ms = atoi(v);
    } else {
      return usage();
    }
    i++;
  }
  if (!S.dir[0] || S.seconds < 20 || S.restart_rank < 0 || S.restart_rank >= NRANKS ||
      S.sample_ms < 100)
    return usage();
  snprintf(S.cluster, sizeof S.cluster, "%s/cluster.conf", S.dir);
  return 0;
}

int main(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!cluster_whole()) {
    fprintf(stderr, "soak: the cluster in %s is not up (every daemon seeing its %d peers)\n",
            S.dir, NRANKS - 1);
    return 1;
  }
  S.t0 = now_s();
  printf("soak: %.0f s against %s, restarting rank %d half-way\n", S.seconds, S.dir,
         S.restart_rank);
  pthread_barrier_init(&round_barrier, NULL, NRANKS);
  pthread_t th[16];
  int n = 0;
  pthread_create(&th[n++], NULL, sampler, NULL);
  for (int i = 0; i < 2; i++) pthread_create(&th[n++], NULL, tensor_worker, (void *)(intptr_t)i);
  for (int r = 0; r < NRANKS; r++) pthread_create(&th[n++], NULL, trainer, (void *)(intptr_t)r);
  pthread_create(&th[n++], NULL, param_worker, NULL);
  sleep_ms((int)(S.seconds * 500));
  restart_daemon(S.restart_rank);
  for (int tick = 1; now_s() - S.t0 < S.seconds; tick++) {
    sleep_ms(1000);
    if (tick % 10) continue;
    pthread_mutex_lock(&S.mu);
    printf("soak: %.0f s, ok tensor %llu, all_reduce %llu, scatter %llu, param %llu; "
           "failed %d\n", now_s() - S.t0, (unsigned long long)S.ok[0],
           (unsigned long long)S.ok[1], (unsigned long long)S.ok[2],
           (unsigned long long)S.ok[3], S.nfails);
    pthread_mutex_unlock(&S.mu);
  }
  S.stop = 1;
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&round_barrier);
  return verdict() ? 0 : 1;
}
