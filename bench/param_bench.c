/* The parameter service under load: push a gradient, apply the optimizer in
 * the daemons, pull the new value, for one parameter (64 MiB of float32 by
 * default) sharded with Shard(0) over every daemon of a cluster.
 *
 * Two modes, each timed per step (median of >= min_iters steps after 3
 * warm-ups, about target_s in all):
 *  - client: the trainer pushes the whole gradient (each daemon receives its
 *    shard's slice), the daemons apply Adam, the trainer pulls the whole
 *    parameter back: 2 x B bytes through the client per step.
 *  - d2d: the gradient already lives in the daemons as Partial(sum) (each
 *    daemon holds a whole B-byte partial, as data-parallel trainers leave
 *    it); the push reduces it onto the shards (a reduce-scatter between the
 *    daemons) and applies Adam; nothing travels to the client.
 * The MPI anchor is MPI_Allreduce of the same B bytes per rank (bench/anchors
 * mpi_colls, over btl tcp), run in the same invocation with -a.
 *
 *   distctl cluster up -n W --dir D
 *   param_bench -c D/cluster.conf [-b 64M] [-t 2] [-m 10]
 *               [-a build-bench/bench/anchors/mpi_colls]
 *
 * Output: one RESULT line per mode (format of bench/anchors/bench_common.h,
 * pair_bytes = B / W so it lines up with the all-reduce anchor's sizes),
 * the anchor's own RESULT line and one RATIO line per mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "param_bench: %s: %s\n", what, why);
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct opts {
  const char *cluster, *anchor;
  size_t bytes;
  double target;
  int min_iters;
} opts;

typedef struct run {
  dist_client *c;
  int W;
  size_t n; /* elements */
  float *grad;
  uint64_t version;
} run;

static void step_client(run *r) {
  uint64_t v = 0;
  void *data = NULL;
  size_t nbytes = 0;
  if (dist_param_push(r->c, "bench.p", 0, r->grad, r->n * sizeof(float), &v) != 0)
    die("push", dist_errmsg(r->c));
  if (dist_param_pull(r->c, "bench.p", v, &data, &nbytes, &r->version) != 0)
    die("pull", dist_errmsg(r->c));
  free(data);
}

static void step_d2d(run *r) {
  if (dist_param_push_tensor(r->c, "bench.p", 0, "bench.g", &r->version) != 0)
    die("push_tensor", dist_errmsg(r->c));
}

/* Times `step` and prints its RESULT line; returns the median in seconds. */
static double time_steps(run *r, const opts *o, const char *impl,
                         void (*step)(run *)) {
  for (int i = 0; i < 3; i++) step(r);
  double t0 = now_s();
  step(r);
  double one = now_s() - t0;
  int iters = (int)(o->target / (one > 1e-6 ? one : 1e-6));
  if (iters < o->min_iters) iters = o->min_iters;
  if (iters > 1000) iters = 1000;
  double *times = calloc((size_t)iters, sizeof *times);
  for (int i = 0; i < iters; i++) {
    double s = now_s();
    step(r);
    times[i] = now_s() - s;
  }
  qsort(times, (size_t)iters, sizeof *times, cmp_double);
  double med = times[iters / 2], p10 = times[iters / 10], p90 = times[iters * 9 / 10];
  size_t pair = o->bytes / (size_t)r->W;
  printf("RESULT impl=%s transport=grpc W=%d pair_bytes=%zu size=%zuMiB iters=%d "
         "med_us=%.1f p10_us=%.1f p90_us=%.1f param_GBps=%.3f\n", impl, r->W, pair,
         o->bytes >> 20, iters, med * 1e6, p10 * 1e6, p90 * 1e6,
         (double)o->bytes / med / 1e9);
  fflush(stdout);
  free(times);
  return med;
}

static void setup(run *r, const opts *o) {
  r->n = o->bytes / sizeof(float);
  int64_t shape[2] = {(int64_t)(r->n / 1024), 1024};
  r->n = (size_t)shape[0] * 1024;
  int *ranks = calloc((size_t)r->W, sizeof *ranks);
  for (int i = 0; i < r->W; i++) ranks[i] = i;
  dist_mesh *mesh = NULL;
  dist_tensor *t = NULL;
  if (dist_mesh_new(1, &r->W, ranks, NULL, &mesh) != 0) die("mesh", "bad mesh");
  float *p = calloc(r->n, sizeof *p);
  r->grad = calloc(r->n, sizeof *r->grad);
  for (size_t i = 0; i < r->n; i++) p[i] = 0.001f * (float)(i % 1000), r->grad[i] = 0.01f;
  dist_tensor_delete(r->c, "bench.p");
  dist_tensor_delete(r->c, "bench.g");
  dist_placement s0 = DIST_SHARD_DIM(0), part = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  if (dist_shard_tensor(r->c, "bench.p", p, DIST_FLOAT32, 2, shape, mesh, &s0, &t) != 0)
    die("shard parameter", dist_errmsg(r->c));
  dist_tensor_free(t);
  /* Each daemon's piece of a Partial tensor: the whole extent. */
  const void **pieces = calloc((size_t)r->W, sizeof *pieces);
  const int64_t **shapes = calloc((size_t)r->W, sizeof *shapes);
  for (int i = 0; i < r->W; i++) pieces[i] = r->grad, shapes[i] = shape;
  if (dist_dtensor_from_local(r->c, "bench.g", pieces, DIST_FLOAT32, 2, shapes, mesh,
                              &part, &t) != 0)
    die("store gradient", dist_errmsg(r->c));
  dist_tensor_free(t);
  dist_param_opts po = DIST_PARAM_OPTS_INIT;
  po.optimizer = DIST_OPT_ADAM;
  po.lr = 1e-4;
  if (dist_param_configure(r->c, "bench.p", &po) != 0) die("configure", dist_errmsg(r->c));
  free(pieces);
  free(shapes);
  free(p);
  free(ranks);
  dist_mesh_free(mesh);
}

/* MPI_Allreduce of the same bytes per rank, over TCP, via mpirun; relays
 * its RESULT line and returns its median in seconds (0 when unavailable). */
static double run_anchor(const opts *o, int W) {
  char cmd[2048], line[1024];
  snprintf(cmd, sizeof cmd,
           "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "
           "mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d "
           "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "
           "%s -o allreduce -s %zu -t %g -m %d -T tcp 2>&1",
           W, o->anchor, o->bytes / (size_t)W, o->target, o->min_iters);
  FILE *p = popen(cmd, "r");
  double med = 0;
  if (!p) return 0;
  while (fgets(line, sizeof line, p)) {
    const char *m = strstr(line, "med_us=");
    if (strncmp(line, "RESULT", 6) == 0) fputs(line, stdout);
    else fprintf(stderr, "anchor: %s", line);
    if (strncmp(line, "RESULT", 6) == 0 && m) med = atof(m + 7) / 1e6;
  }
  pclose(p);
  return med;
}

int main(int argc, char **argv) {
  opts o = {NULL, NULL, 64u << 20, 2.0, 10};
  int ch;
  while ((ch = getopt(argc, argv, "c:a:b:t:m:")) != -1) {
    switch (ch) {
      case 'c': o.cluster = optarg; break;
      case 'a': o.anchor = optarg; break;
      case 'b': o.bytes = (size_t)strtod(optarg, NULL) << (strchr(optarg, 'M') ? 20 : 0); break;
      case 't': o.target = atof(optarg); break;
      case 'm': o.min_iters = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: param_bench -c CLUSTER_FILE [-b 64M] [-t target_s] "
                        "[-m min_iters] [-a path/to/mpi_colls]\n");
        return 2;
    }
  }
  if (!o.cluster) die("usage", "-c CLUSTER_FILE is required");
  run r;
  memset(&r, 0, sizeof r);
  dist_opts dopts = DIST_OPTS_INIT;
  dopts.timeout_ms = 120000;
  if (dist_connect_cluster(o.cluster, &dopts, &r.c) != 0)
    die("connect", dist_last_connect_error());
  r.W = dist_world_size(r.c);
  setup(&r, &o);
  double client = time_steps(&r, &o, "distd_param_client", step_client);
  double d2d = time_steps(&r, &o, "distd_param_d2d", step_d2d);
  double anchor = o.anchor ? run_anchor(&o, r.W) : 0;
  if (anchor > 0) {
    printf("RATIO W=%d mode=client step/allreduce=%.2f\n", r.W, client / anchor);
    printf("RATIO W=%d mode=d2d step/allreduce=%.2f\n", r.W, d2d / anchor);
  } else {
    printf("NOTE no MPI anchor in this run (give -a path/to/mpi_colls)\n");
  }
  dist_tensor_delete(r.c, "bench.p");
  dist_tensor_delete(r.c, "bench.g");
  free(r.grad);
  dist_close(r.c);
  return 0;
}
