/* Our collectives between the daemons of a running cluster, with the method
 * of ../shared/docs/performance.md (as the anchors in bench/anchors/):
 * per (op, size) one op checked byte by byte, 3 warm-ups, then >= min_iters
 * timed ops (about target_s in all), each after a barrier; op time = the
 * slowest rank; the median is reported as a RESULT line in the anchors'
 * format (bench_common.h).
 *
 *  - d2d (daemon to daemon): one Collective call per daemon in benchmark
 *    mode (repeat > 0). Each daemon times each op itself, after a barrier
 *    of the group, so no client or gRPC time is counted.
 *  - e2e (-e, alltoall and global_scatter): what a trainer sees. W threads,
 *    one per rank, each calls its own daemon (Collective ALL_TO_ALL, or
 *    Moe.GlobalScatter with one expert per rank), after a barrier of the
 *    threads; client -> daemon -> peers -> back.
 *
 * Sizes are per pair (bytes one rank owes one other rank), float32:
 *   alltoall, global_scatter: every rank sends S to every rank (self too);
 *   allgather: each rank contributes S; reduce_scatter: each rank gives
 *   W*S and keeps S; allreduce: a W*S buffer (sum).
 *
 *   coll_bench -c CLUSTER_FILE [-o allreduce,allgather,...] [-s 1K,64K,1M,16M]
 *              [-t target_s] [-m min_iters] [-M max_iters] [-B big_iters]
 *              [-e] [-E e2e_iters_at_16MiB] */
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "anchors/bench_common.h"
#include "client_internal.h"
#include "moe.pb-c.h"

#define MAXW 64 /* ranks this bench drives */

typedef enum { ALLREDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL, GLOBAL_SCATTER, NOPS } bop;

static const struct {
  const char *name;
  Dist__V1__CollectiveRequest__Kind kind;
} ops[NOPS] = {
    [ALLREDUCE] = {"allreduce", DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_REDUCE},
    [ALLGATHER] = {"allgather", DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_GATHER},
    [REDUCE_SCATTER] = {"reduce_scatter", DIST__V1__COLLECTIVE_REQUEST__KIND__REDUCE_SCATTER},
    [ALLTOALL] = {"alltoall", DIST__V1__COLLECTIVE_REQUEST__KIND__ALL_TO_ALL},
    [GLOBAL_SCATTER] = {"global_scatter", DIST__V1__COLLECTIVE_REQUEST__KIND__GLOBAL_SCATTER},
};

typedef struct opts {
  const char *cluster;
  size_t sizes[BENCH_MAX_SIZES];
  int nsizes;
  double target;
  int min_it, max_it, big_it; /* big_it: iterations at >= 16 MiB (0 = as others) */
  int e2e_big;                /* e2e timed ops at >= 16 MiB (0 = as others) */
  bool e2e, run[NOPS];
} opts;

/* One rank's input, expected output and counts for one (op, size). */
typedef struct rank_case {
  uint8_t *in, *expect;
  size_t in_len, out_len;
  uint64_t counts[MAXW]; /* elements per member */
  int64_t rows[MAXW];    /* the same, for the MoE request */
} rank_case;

static int W;

static void die(const char *what, const char *why) {
  fprintf(stderr, "coll_bench: %s: %s\n", what, why);
  exit(1);
}

/* Small integers: float sums are exact in any order. */
static float val(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 101)) % 13); }

static void fill_floats(uint8_t *buf, size_t n, int rank, size_t first) {
  for (size_t i = 0; i < n; i++) {
    float v = val(rank, first + i);
    memcpy(buf + i * 4, &v, 4);
  }
}

static void sum_floats(uint8_t *buf, size_t n, size_t first) {
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int r = 0; r < W; r++) s += val(r, first + i);
    memcpy(buf + i * 4, &s, 4);
  }
}

static void make_case(bop op, int r, size_t S, rank_case *k) {
  size_t block = S / 4;
  memset(k, 0, sizeof *k);
  k->in_len = op == ALLGATHER ? S : (size_t)W * S;
  k->out_len = op == REDUCE_SCATTER ? S : (size_t)W * S;
  k->in = malloc(k->in_len + 1);
  k->expect = malloc(k->out_len + 1);
  for (int j = 0; j < W; j++) k->counts[j] = block, k->rows[j] = (int64_t)block;
  switch (op) {
    case ALLREDUCE:
      fill_floats(k->in, (size_t)W * block, r, 0);
      sum_floats(k->expect, (size_t)W * block, 0);
      break;
    case ALLGATHER:
      fill_floats(k->in, block, r, 0);
      for (int j = 0; j < W; j++) fill_floats(k->expect + (size_t)j * S, block, j, 0);
      break;
    case REDUCE_SCATTER:
      fill_floats(k->in, (size_t)W * block, r, 0);
      sum_floats(k->expect, block, (size_t)r * block);
      break;
    default: /* all-to-all: the anchors' byte pattern */
      bench_fill(k->in, r, W, S);
      for (int s = 0; s < W; s++)
        for (size_t o = 0; o < S; o++) k->expect[(size_t)s * S + o] = bench_pat(s, r, o);
  }
}

static void free_case(rank_case *k) {
  free(k->in);
  free(k->expect);
}

static void check(const char *what, int r, const rank_case *k, const void *got, size_t len) {
  if (len != k->out_len) {
    fprintf(stderr, "coll_bench: %s: rank %d returned %zu bytes, expected %zu\n", what, r,
            len, k->out_len);
    exit(3);
  }
  size_t bad = 0;
  for (size_t i = 0; i < len; i++) bad += ((const uint8_t *)got)[i] != k->expect[i];
  if (bad) {
    fprintf(stderr, "coll_bench: %s: DATA MISMATCH on rank %d: %zu bytes\n", what, r, bad);
    exit(3);
  }
}

static void init_request(Dist__V1__CollectiveRequest *rq, bop op, rank_case *k) {
  dist__v1__collective_request__init(rq);
  rq->kind = ops[op].kind;
  rq->dtype = (Dist__V1__DType)DIST_FLOAT32;
  rq->reduce = (Dist__V1__ReduceOp)DIST_REDUCE_SUM;
  rq->data.data = k->in;
  rq->data.len = k->in_len;
  if (op == REDUCE_SCATTER || op == ALLTOALL || op == GLOBAL_SCATTER)
    rq->send_counts = k->counts, rq->n_send_counts = (size_t)W;
  if (op == ALLTOALL || op == GLOBAL_SCATTER)
    rq->recv_counts = k->counts, rq->n_recv_counts = (size_t)W;
}

/* ---- daemon to daemon ---- */

/* One benchmark-mode call on every daemon (repeat 0: one plain op, checked).
 * tmax[i] = op i's time on the slowest rank. */
static void d2d_call(dist_client *c, bop op, rank_case *cases, uint32_t warmup,
                     uint32_t repeat, double *tmax) {
  Dist__V1__CollectiveRequest rq[MAXW];
  dist_call calls[MAXW];
  uint64_t op_id = dist_next_op_id(c);
  for (int r = 0; r < W; r++) {
    init_request(&rq[r], op, &cases[r]);
    rq[r].op_id = op_id, rq[r].repeat = repeat, rq[r].warmup = warmup;
    calls[r] = (dist_call){.target = r, .request = &rq[r].base};
  }
  if (dist_call_many(c, "/dist.v1.Dist/Collective", &dist__v1__collective_reply__descriptor,
                     calls, W))
    die(ops[op].name, dist_errmsg(c));
  for (uint32_t i = 0; i < repeat; i++) tmax[i] = 0;
  for (int r = 0; r < W; r++) {
    const Dist__V1__CollectiveReply *rp = (const void *)calls[r].reply;
    if (!repeat) check(ops[op].name, r, &cases[r], rp->data.data, rp->data.len);
    if (rp->n_op_seconds != repeat) die(ops[op].name, "daemon has no benchmark mode");
    for (uint32_t i = 0; i < repeat; i++)
      if (rp->op_seconds[i] > tmax[i]) tmax[i] = rp->op_seconds[i];
  }
  dist_calls_free(calls, W);
}

static int iterations(const opts *o, size_t S, double t_one) {
  if (o->big_it && S >= (16u << 20)) return o->big_it;
  return bench_pick_iters(t_one, o->target, o->min_it, o->max_it);
}

static void d2d(dist_client *c, const opts *o, bop op, size_t S, rank_case *cases) {
  double cal[3];
  d2d_call(c, op, cases, 0, 0, NULL);
  d2d_call(c, op, cases, 1, 3, cal); /* calibration, on top of the warm-ups */
  int iters = iterations(o, S, bench_pct(cal, 3, 50));
  double *tmax = malloc(sizeof *tmax * (size_t)iters);
  d2d_call(c, op, cases, 3, (uint32_t)iters, tmax);
  char impl[64];
  snprintf(impl, sizeof impl, "distd_%s", ops[op].name);
  bench_report(impl, "d2d", W, S, iters, tmax);
  free(tmax);
}

/* ---- end to end: one thread per rank, each calling its own daemon ---- */

typedef struct e2e_rank {
  int rank, count, verify_first;
  bop op;
  uint64_t op_base;
  rank_case *k;
  dist_client *c;
  pthread_barrier_t *bar;
  double *times; /* count entries */
} e2e_rank;

static void e2e_once(e2e_rank *t, uint64_t op_id, bool verify) {
  ProtobufCMessage *rp = NULL;
  const void *data = NULL;
  size_t len = 0;
  int rc;
  if (t->op == GLOBAL_SCATTER) {
    Dist__V1__GlobalExchangeRequest rq = DIST__V1__GLOBAL_EXCHANGE_REQUEST__INIT;
    rq.op_id = op_id;
    rq.dtype = (Dist__V1__DType)DIST_FLOAT32;
    rq.row_width = 1;
    rq.x.data = t->k->in, rq.x.len = t->k->in_len;
    rq.local_count = t->k->rows, rq.n_local_count = (size_t)W;
    rq.global_count = t->k->rows, rq.n_global_count = (size_t)W;
    rc = dist_call_one(t->c, t->rank, "/dist.v1.Moe/GlobalScatter", &rq.base,
                       &dist__v1__global_exchange_reply__descriptor, &rp);
    if (rc == 0) {
      const Dist__V1__GlobalExchangeReply *r = (const void *)rp;
      data = r->data.data, len = r->data.len;
    }
  } else {
    Dist__V1__CollectiveRequest rq;
    init_request(&rq, t->op, t->k);
    rq.op_id = op_id;
    rc = dist_call_one(t->c, t->rank, "/dist.v1.Dist/Collective", &rq.base,
                       &dist__v1__collective_reply__descriptor, &rp);
    if (rc == 0) {
      const Dist__V1__CollectiveReply *r = (const void *)rp;
      data = r->data.data, len = r->data.len;
    }
  }
  if (rc) die(ops[t->op].name, dist_errmsg(t->c));
  if (verify) check(ops[t->op].name, t->rank, t->k, data, len);
  protobuf_c_message_free_unpacked(rp, NULL);
}

static void *e2e_main(void *arg) {
  e2e_rank *t = arg;
  for (int i = 0; i < t->count; i++) {
    pthread_barrier_wait(t->bar);
    double t0 = bench_now();
    e2e_once(t, t->op_base + (uint64_t)i, t->verify_first && i == 0);
    t->times[i] = bench_now() - t0;
  }
  return NULL;
}

/* count ops on every rank at once; tmax[i] = op i on the slowest rank. */
static void e2e_phase(e2e_rank *t, int count, int verify_first, double *tmax) {
  pthread_t th[MAXW];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)W);
  for (int r = 0; r < W; r++) {
    t[r].count = count, t[r].verify_first = verify_first, t[r].bar = &bar;
    t[r].times = malloc(sizeof(double) * (size_t)count);
    pthread_create(&th[r], NULL, e2e_main, &t[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int i = 0; i < count; i++) tmax[i] = 0;
  for (int r = 0; r < W; r++) {
    for (int i = 0; i < count; i++)
      if (t[r].times[i] > tmax[i]) tmax[i] = t[r].times[i];
    free(t[r].times);
    t[r].op_base += (uint64_t)count;
  }
  pthread_barrier_destroy(&bar);
}

/* 1 checked op, 3 warm-ups (the last one calibrates), then the timed ops. */
static void e2e(const opts *o, bop op, size_t S, rank_case *cases) {
  e2e_rank t[MAXW];
  /* Op ids far from the clients' own sequences, the same for every rank. */
  uint64_t base = ((uint64_t)getpid() << 40) ^ ((uint64_t)(bench_now() * 1e6) << 8);
  dist_opts dopts = {.timeout_ms = 300000};
  for (int r = 0; r < W; r++) {
    t[r] = (e2e_rank){.rank = r, .op = op, .op_base = base, .k = &cases[r]};
    if (dist_connect_cluster(o->cluster, &dopts, &t[r].c))
      die("connect", dist_last_connect_error());
  }
  double first[4];
  e2e_phase(t, 4, 1, first);
  int iters = o->e2e_big && S >= (16u << 20) ? o->e2e_big : iterations(o, S, first[3]);
  double *tmax = malloc(sizeof *tmax * (size_t)iters);
  e2e_phase(t, iters, 0, tmax);
  char impl[64];
  snprintf(impl, sizeof impl, "distd_%s", ops[op].name);
  bench_report(impl, "e2e", W, S, iters, tmax);
  free(tmax);
  for (int r = 0; r < W; r++) dist_close(t[r].c);
}

static void parse_ops(const char *s, opts *o) {
  char *dup = strdup(s), *save = NULL;
  for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < NOPS; i++)
      if (!strcmp(tok, ops[i].name)) {
        o->run[i] = true;
        found = 1;
      }
    if (!found) die("unknown op", tok);
  }
  free(dup);
}

int main(int argc, char **argv) {
  opts o = {.target = 0.5, .min_it = 20, .max_it = 2000};
  o.nsizes = bench_parse_sizes("1K,64K,1M,16M", o.sizes, BENCH_MAX_SIZES);
  parse_ops("allreduce,allgather,reduce_scatter,alltoall,global_scatter", &o);
  int ch;
  while ((ch = getopt(argc, argv, "c:o:s:t:m:M:B:E:e")) != -1) {
    switch (ch) {
      case 'c': o.cluster = optarg; break;
      case 'o': memset(o.run, 0, sizeof o.run), parse_ops(optarg, &o); break;
      case 's': o.nsizes = bench_parse_sizes(optarg, o.sizes, BENCH_MAX_SIZES); break;
      case 't': o.target = atof(optarg); break;
      case 'm': o.min_it = atoi(optarg); break;
      case 'M': o.max_it = atoi(optarg); break;
      case 'B': o.big_it = atoi(optarg); break;
      case 'E': o.e2e_big = atoi(optarg); break;
      case 'e': o.e2e = true; break;
      default: fprintf(stderr, "usage: coll_bench -c CLUSTER_FILE [-o ops] [-s sizes] "
                               "[-t s] [-m n] [-M n] [-B n] [-E n] [-e]\n"); return 2;
    }
  }
  if (!o.cluster) die("usage", "-c CLUSTER_FILE is required");
  dist_opts dopts = {.timeout_ms = 300000};
  dist_client *c;
  if (dist_connect_cluster(o.cluster, &dopts, &c)) die("connect", dist_last_connect_error());
  W = dist_world_size(c);
  if (W < 1 || W > MAXW) die("cluster", "bad world size");
  for (int op = 0; op < NOPS; op++) {
    if (!o.run[op]) continue;
    for (int si = 0; si < o.nsizes; si++) {
      size_t S = o.sizes[si];
      rank_case cases[MAXW];
      for (int r = 0; r < W; r++) make_case((bop)op, r, S, &cases[r]);
      d2d(c, &o, (bop)op, S, cases);
      if (o.e2e && (op == ALLTOALL || op == GLOBAL_SCATTER)) e2e(&o, (bop)op, S, cases);
      for (int r = 0; r < W; r++) free_case(&cases[r]);
    }
  }
  dist_close(c);
  return 0;
}
