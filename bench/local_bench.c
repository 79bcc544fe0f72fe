/* LocalLayer engine and RPC benchmark (issue 5's targets), each measured
 * against its anchor in the same run:
 *
 *  - elementwise (add, relu, x*2) and reductions (sum over all, sum over the
 *    last axis) on 16M float32 elements, through the engine's kernels with
 *    their output allocation, as a fraction of memcpy bandwidth (bytes read
 *    + written per second; memcpy moves 2 x 64 MiB). Target >= 0.5.
 *  - matmul through the engine, as a fraction of a direct cblas_sgemm of
 *    the same shape into a preallocated buffer. Target >= 0.8.
 *  - one LocalLayer invocation of a tiny program (a 4-element VALUE input,
 *    sum(x * 2), no_grad) against a bare Info RPC, on a one-rank daemon
 *    this bench starts (fork/exec, free loopback ports, killed by PID at
 *    the end). Target: ratio <= 1.5.
 *
 * Every figure is the median of repeated runs after warm-ups. Output: one
 * `RESULT local <case> ... ratio=R target=T pass=0|1` line per case.
 *
 *   local_bench [-d PATH_TO_DISTD] [-n ELEMENTS] [-r REPS] [-m MATMUL_N]
 * distd defaults to $DIST_DISTD_BIN, else daemon/distd beside bench/. */
#include <arpa/inet.h>
#include <cblas.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "kernels.h"
#include "tensor_val.h"

typedef struct opts {
  const char *distd;
  int64_t n;    /* elements of the elementwise/reduction cases */
  int reps;     /* timed repetitions per case */
  int64_t mm;   /* matmul: mm x mm times mm x mm */
  int rpc_reps; /* timed RPCs per case */
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static void result(const char *name, const char *what, double value,
                   double anchor, double ratio, double target, int higher_ok) {
  int pass = higher_ok ? ratio >= target : ratio <= target;
  printf("RESULT local %-18s %s=%.4g anchor=%.4g ratio=%.3f target=%s%.2f "
         "pass=%d\n", name, what, value, anchor, ratio, higher_ok ? ">=" : "<=",
         target, pass);
  fflush(stdout);
}

/* ---------------------------------------------------------------- kernels */

typedef int (*kernel_fn)(distd_tval *a, distd_tval *b, distd_tval **out);

static int k_add(distd_tval *a, distd_tval *b, distd_tval **out) {
  return distd_k_binary(DIST__V1__OP_KIND__OP_ADD, a, b, out, NULL);
}
static int k_mul_scalar(distd_tval *a, distd_tval *b, distd_tval **out) {
  return distd_k_binary(DIST__V1__OP_KIND__OP_MUL, a, b, out, NULL);
}
static int k_relu(distd_tval *a, distd_tval *b, distd_tval **out) {
  (void)b;
  return distd_k_unary(DIST__V1__OP_KIND__OP_RELU, 0, a, out, NULL);
}
static int k_sum_all(distd_tval *a, distd_tval *b, distd_tval **out) {
  (void)b;
  return distd_k_reduce(DIST__V1__OP_KIND__OP_SUM, a, NULL, 0, 0, out, NULL);
}
static int k_sum_last(distd_tval *a, distd_tval *b, distd_tval **out) {
  (void)b;
  int64_t ax[1] = {-1};
  return distd_k_reduce(DIST__V1__OP_KIND__OP_SUM, a, ax, 1, 0, out, NULL);
}

/* Median seconds of fn over reps runs (2 warm-ups), output freed each time
 * as a program frees its intermediates. */
static double time_kernel(kernel_fn fn, distd_tval *a, distd_tval *b, int reps) {
  double *t = calloc((size_t)reps, sizeof *t);
  for (int i = -2; i < reps; i++) {
    distd_tval *out = NULL;
    double t0 = now_s();
    if (fn(a, b, &out) != 0) {
      fprintf(stderr, "local_bench: kernel failed\n");
      exit(1);
    }
    double dt = now_s() - t0;
    distd_tval_unref(out);
    if (i >= 0) t[i] = dt;
  }
  double m = median(t, reps);
  free(t);
  return m;
}

static double memcpy_bandwidth(size_t bytes, int reps) {
  char *src = malloc(bytes), *dst = malloc(bytes);
  memset(src, 1, bytes);
  memset(dst, 2, bytes);
  double *t = calloc((size_t)reps, sizeof *t);
  for (int i = -2; i < reps; i++) {
    double t0 = now_s();
    memcpy(dst, src, bytes);
    double dt = now_s() - t0;
    if (i >= 0) t[i] = dt;
  }
  double m = median(t, reps);
  free(t);
  free(src);
  free(dst);
  return 2.0 * (double)bytes / m; /* read + write */
}

static distd_tval *random_val(const dist_shape *s) {
  distd_tval *v = NULL;
  distd_tval_new_uninit(DIST_FLOAT32, s, &v, NULL);
  float *d = v->data;
  unsigned x = 12345;
  for (int64_t i = 0; i < v->numel; i++) {
    x = x * 1103515245u + 12345u;
    d[i] = (float)((x >> 8) % 2048) / 1024.0f - 1.0f;
  }
  return v;
}

static void bench_kernels(const opts *o) {
  size_t bytes = (size_t)o->n * sizeof(float);
  double bw = memcpy_bandwidth(bytes, o->reps);
  printf("memcpy: %.2f GB/s (read + write) on %zu MiB\n", bw / 1e9, bytes >> 20);
  int64_t cols = 4096, rows = o->n / cols;
  dist_shape flat = {1, {o->n}}, mat = {2, {rows, cols}}, scalar = {0, {0}};
  distd_tval *a = random_val(&flat), *b = random_val(&flat), *two = NULL;
  distd_tval *am = NULL;
  distd_tval_scalar(DIST_FLOAT32, 2.0, &two, NULL);
  distd_tval_view(a, &mat, &am, NULL);
  (void)scalar;
  struct {
    const char *name;
    kernel_fn fn;
    distd_tval *a, *b;
    double moved; /* bytes read + written, in units of `bytes` */
  } cases[] = {
      {"add", k_add, a, b, 3},
      {"mul_scalar", k_mul_scalar, a, two, 2},
      {"relu", k_relu, a, NULL, 2},
      {"sum_all", k_sum_all, a, NULL, 1},
      {"sum_last_axis", k_sum_last, am, NULL, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double t = time_kernel(cases[i].fn, cases[i].a, cases[i].b, o->reps);
    double kbw = cases[i].moved * (double)bytes / t;
    result(cases[i].name, "GBps", kbw / 1e9, bw / 1e9, kbw / bw, 0.5, 1);
  }
  distd_tval_unref(am);
  distd_tval_unref(two);
  distd_tval_unref(a);
  distd_tval_unref(b);
}

static void bench_matmul(const opts *o) {
  int64_t n = o->mm;
  dist_shape s = {2, {n, n}};
  distd_tval *a = random_val(&s), *b = random_val(&s);
  float *c = aligned_alloc(64, (size_t)(n * n) * sizeof(float));
  int reps = o->reps;
  double *td = calloc((size_t)reps, sizeof *td), *te = calloc((size_t)reps, sizeof *te);
  /* Interleaved, so drift in machine load hits both alike. */
  for (int i = -2; i < reps; i++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n,
                (int)n, 1.0f, a->data, (int)n, b->data, (int)n, 0.0f, c, (int)n);
    double t1 = now_s();
    distd_tval *out = NULL;
    distd_k_matmul(a, b, 0, 0, &out, NULL);
    double t2 = now_s();
    distd_tval_unref(out);
    if (i >= 0) td[i] = t1 - t0, te[i] = t2 - t1;
  }
  double direct = median(td, reps), engine = median(te, reps);
  double flops = 2.0 * (double)n * (double)n * (double)n;
  char name[32];
  snprintf(name, sizeof name, "matmul_%lld", (long long)n);
  result(name, "GFLOPs", flops / engine / 1e9, flops / direct / 1e9,
         direct / engine, 0.8, 1);
  free(td);
  free(te);
  free(c);
  distd_tval_unref(a);
  distd_tval_unref(b);
}

/* ---------------------------------------------------------------- RPCs */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

/* A one-rank daemon on free loopback ports; returns its pid. */
static pid_t start_daemon(const char *distd, char *endpoint, size_t len,
                          char *dir, size_t dlen) {
  snprintf(dir, dlen, "/tmp/local_bench-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  char conf[512], http[64], log[512];
  snprintf(conf, sizeof conf, "%s/cluster.conf", dir);
  snprintf(log, sizeof log, "%s/distd.log", dir);
  int gp = free_port(), pp = free_port(), hp = free_port();
  FILE *f = fopen(conf, "w");
  if (!f) return -1;
  fprintf(f, "127.0.0.1:%d 127.0.0.1:%d\n", gp, pp);
  fclose(f);
  snprintf(endpoint, len, "127.0.0.1:%d", gp);
  snprintf(http, sizeof http, "127.0.0.1:%d", hp);
  pid_t pid = fork();
  if (pid == 0) {
    FILE *lf = freopen(log, "a", stderr);
    (void)lf;
    execl(distd, distd, "--cluster-file", conf, "--rank", "0", "--http-listen",
          http, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int wait_ready(dist_client *c, double timeout_s) {
  for (double t0 = now_s(); now_s() - t0 < timeout_s;) {
    if (dist_health(c, 0) == 0) return 0;
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

static double time_info(dist_client *c, int reps) {
  double *t = calloc((size_t)reps, sizeof *t);
  Dist__V1__InfoRequest rq = DIST__V1__INFO_REQUEST__INIT;
  for (int i = -20; i < reps; i++) {
    ProtobufCMessage *rp = NULL;
    double t0 = now_s();
    int rc = dist_call_one(c, 0, "/dist.v1.Dist/Info", &rq.base,
                           &dist__v1__info_reply__descriptor, &rp);
    double dt = now_s() - t0;
    if (rp) protobuf_c_message_free_unpacked(rp, NULL);
    if (rc) fprintf(stderr, "local_bench: Info: %s\n", dist_errmsg(c));
    if (i >= 0) t[i] = dt;
  }
  double m = median(t, reps);
  free(t);
  return m;
}

static double time_invoke(dist_client *c, dist_program *p, int reps) {
  float x[4] = {1, 2, 3, 4};
  dist_value v = {x, DIST_FLOAT32, 1, {4}};
  dist_arg args[1] = {{NULL, &v}};
  const char *names[1] = {"local_bench.out"};
  dist_call_opts co = DIST_CALL_OPTS_INIT;
  co.out_names = names;
  co.replace = 1;
  co.no_grad = 1;
  double *t = calloc((size_t)reps, sizeof *t);
  for (int i = -20; i < reps; i++) {
    dist_invocation *inv = NULL;
    dist_tensor *out = NULL;
    double t0 = now_s();
    int rc = dist_local_layer_call(c, p, args, 1, &co, &inv, &out);
    dist_invocation_free(inv);
    dist_tensor_free(out);
    double dt = now_s() - t0;
    if (rc) fprintf(stderr, "local_bench: invoke: %s\n", dist_errmsg(c));
    if (i >= 0) t[i] = dt;
  }
  double m = median(t, reps);
  free(t);
  return m;
}

static void bench_invoke(const opts *o) {
  char ep[64], dir[64];
  pid_t pid = start_daemon(o->distd, ep, sizeof ep, dir, sizeof dir);
  if (pid <= 0) {
    fprintf(stderr, "local_bench: cannot start %s\n", o->distd);
    return;
  }
  dist_client *c = NULL;
  dist_mesh *m = NULL;
  dist_program *p = NULL;
  dist_connect(ep, NULL, &c);
  if (wait_ready(c, 20) != 0) {
    fprintf(stderr, "local_bench: %s did not come up (log in %s)\n", o->distd, dir);
    goto out;
  }
  dist_mesh_from_string("[0]", NULL, &m);
  dist_program_new("tiny", &p);
  int x = dist_input_value(p, "x", DIST_FLOAT32);
  dist_placement rep = DIST_REPLICATED;
  dist_program_output(p, dist_op_sum(p, dist_op_mul_scalar(p, x, 2), NULL, 0, 0));
  dist_program_out_dist_attr(p, m, &rep, NULL);
  if (dist_program_register(c, p) != 0) {
    fprintf(stderr, "local_bench: register: %s\n", dist_errmsg(c));
    goto out;
  }
  /* Interleave the two so drift in machine load hits both alike. */
  double ti = 0, tv = 0;
  for (int round = 0; round < 3; round++) {
    ti += time_info(c, o->rpc_reps);
    tv += time_invoke(c, p, o->rpc_reps);
  }
  result("invoke_tiny", "us", tv / 3 * 1e6, ti / 3 * 1e6, tv / ti, 1.5, 0);
out:
  dist_program_free(p);
  dist_mesh_free(m);
  dist_close(c);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "local_bench: could not remove %s\n", dir);
}

static const char *default_distd(const char *argv0) {
  static char path[1024];
  const char *env = getenv("DIST_DISTD_BIN");
  if (env) return env;
  const char *slash = strrchr(argv0, '/');
  int dirlen = slash ? (int)(slash - argv0) : 1;
  snprintf(path, sizeof path, "%.*s/../daemon/distd", dirlen, slash ? argv0 : ".");
  return path;
}

int main(int argc, char **argv) {
  opts o = {default_distd(argv[0]), 16 << 20, 15, 1024, 500};
  int c;
  while ((c = getopt(argc, argv, "d:n:r:m:R:")) != -1) {
    switch (c) {
    case 'd': o.distd = optarg; break;
    case 'n': o.n = strtoll(optarg, NULL, 0); break;
    case 'r': o.reps = atoi(optarg); break;
    case 'm': o.mm = strtoll(optarg, NULL, 0); break;
    case 'R': o.rpc_reps = atoi(optarg); break;
    default:
      fprintf(stderr, "usage: local_bench [-d distd] [-n elements] [-r reps] "
                      "[-m matmul_n] [-R rpc_reps]\n");
      return 2;
    }
  }
  if (o.n < 4096 || o.reps < 1 || o.mm < 1 || o.rpc_reps < 1) {
    fprintf(stderr, "local_bench: bad sizes\n");
    return 2;
  }
  bench_kernels(&o);
  bench_matmul(&o);
  bench_invoke(&o);
  return 0;
}
