/* MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block anchors, with the
 * method of a2a_mpi.c (../shared/docs/performance.md): per size one op
 * checked element by element, 3 warm-ups, then >= min_iters timed ops
 * (about target_s in all), each after a barrier; op time = slowest rank;
 * the median is reported.
 *
 * Sizes are per pair (the bytes one rank owes one other rank), as for the
 * all-to-all: float32 sum, with
 *   allgather:      each rank contributes S bytes, receives W*S;
 *   reduce_scatter: each rank gives W*S bytes, keeps an S-byte block;
 *   allreduce:      a W*S-byte buffer on every rank.
 *
 *   mpirun -np W ./mpi_colls -o allreduce|allgather|reduce_scatter
 *          [-s 1K,64K,1M,16M] [-t target_s] [-m min_iters] [-T label] */
#include <mpi.h>
#include <unistd.h>

#include "bench_common.h"

typedef enum { ALLREDUCE, ALLGATHER, REDUCE_SCATTER } coll_op;

/* Small integers: float sums are exact in any order. */
static float val(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 101)) % 13); }

typedef struct bufs {
  float *in, *out;
  size_t n_in, n_out, block; /* elements */
} bufs;

static void run_op(coll_op op, bufs *b) {
  switch (op) {
    case ALLREDUCE:
      MPI_Allreduce(b->in, b->out, (int)b->n_in, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case ALLGATHER:
      MPI_Allgather(b->in, (int)b->n_in, MPI_FLOAT, b->out, (int)b->n_in, MPI_FLOAT,
                    MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(b->in, b->out, (int)b->block, MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
      break;
  }
}

/* Expected out[i] on rank `rank`, independent of MPI. */
static float expect(coll_op op, int rank, int W, const bufs *b, size_t i) {
  float s = 0;
  switch (op) {
    case ALLREDUCE:
      for (int r = 0; r < W; r++) s += val(r, i);
      return s;
    case ALLGATHER:
      return val((int)(i / b->n_in), i % b->n_in);
    case REDUCE_SCATTER:
      for (int r = 0; r < W; r++) s += val(r, (size_t)rank * b->block + i);
      return s;
  }
  return 0;
}

static void setup(coll_op op, int rank, int W, size_t S, bufs *b) {
  b->block = S / sizeof(float);
  b->n_in = op == ALLGATHER ? b->block : (size_t)W * b->block;
  b->n_out = op == REDUCE_SCATTER ? b->block : (size_t)W * b->block;
  b->in = malloc(b->n_in * sizeof(float) + 1);
  b->out = calloc(b->n_out + 1, sizeof(float));
  for (size_t i = 0; i < b->n_in; i++) b->in[i] = val(rank, i);
}

static const char *op_name(coll_op op) {
  return op == ALLREDUCE ? "mpi_allreduce" : op == ALLGATHER ? "mpi_allgather"
                                                             : "mpi_reduce_scatter";
}

static void bench_size(coll_op op, int rank, int W, size_t S, double target, int min_it,
                       int max_it, const char *label) {
  bufs b;
  setup(op, rank, W, S, &b);
  run_op(op, &b);
  size_t bad = 0, totbad = 0;
  for (size_t i = 0; i < b.n_out; i++) bad += b.out[i] != expect(op, rank, W, &b, i);
  MPI_Allreduce(&bad, &totbad, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (totbad) {
    if (rank == 0) fprintf(stderr, "%s: DATA MISMATCH: %zu elements\n", op_name(op), totbad);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  double t1 = 0;
  for (int i = 0; i < 3; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    run_op(op, &b);
    t1 = MPI_Wtime() - t0;
  }
  MPI_Allreduce(MPI_IN_PLACE, &t1, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int iters = bench_pick_iters(t1, target, min_it, max_it);
  MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
  double *times = malloc(iters * sizeof(double)), *tmax = malloc(iters * sizeof(double));
  for (int i = 0; i < iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    run_op(op, &b);
    times[i] = MPI_Wtime() - t0;
  }
  MPI_Reduce(times, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) bench_report(op_name(op), label, W, S, iters, tmax);
  free(times);
  free(tmax);
  free(b.in);
  free(b.out);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, W;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  size_t sizes[BENCH_MAX_SIZES];
  int nsizes = bench_parse_sizes("1K,64K,1M,16M", sizes, BENCH_MAX_SIZES);
  double target = 0.5;
  int min_it = 20, max_it = 2000, c;
  coll_op op = ALLREDUCE;
  const char *label = "tcp";
  while ((c = getopt(argc, argv, "o:s:t:m:M:T:")) != -1) {
    switch (c) {
      case 'o':
        op = !strcmp(optarg, "allgather") ? ALLGATHER
             : !strcmp(optarg, "reduce_scatter") ? REDUCE_SCATTER : ALLREDUCE;
        break;
      case 's': nsizes = bench_parse_sizes(optarg, sizes, BENCH_MAX_SIZES); break;
      case 't': target = atof(optarg); break;
      case 'm': min_it = atoi(optarg); break;
      case 'M': max_it = atoi(optarg); break;
      case 'T': label = optarg; break;
      default:
        if (rank == 0) fprintf(stderr, "bad option\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  for (int si = 0; si < nsizes; si++)
    bench_size(op, rank, W, sizes[si], target, min_it, max_it, label);
  MPI_Finalize();
  return 0;
}
