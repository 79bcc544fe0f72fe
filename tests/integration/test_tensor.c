/* Distributed tensors end to end: real daemons, libdist and distctl.
 *
 * Every check compares against a whole-tensor reference computed here, and
 * slices it with this file's own index arithmetic (split_range, box_of), not
 * with the library's dist_local_box. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "harness.h"
#include "harness_fixture.h"
#include "wire.h"

/* n daemons, each also given `extra` (one argument, or NULL). */
static void start_cluster_with(harness *h, int n, const char *extra) {
  const char *args[] = {extra, NULL};
  harness_start_unique(h, n, "tensor-test", args);
}

static void start_cluster(harness *h, int n) { start_cluster_with(h, n, NULL); }

/* ------------------------------------------------------------ layout model */

/* A mesh and placements as the test understands them. */
typedef struct layout {
  int ndim, shape[DIST_MAX_MESH_DIMS], nranks, ranks[64];
  dist_placement p[DIST_MAX_MESH_DIMS];
} layout;

static void layout_of(const char *mesh, const char *placements, layout *l) {
  dist_mesh *m = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh, NULL, &m), 0, "mesh %s", mesh);
  l->ndim = dist_mesh_ndim(m);
  l->nranks = dist_mesh_size(m);
  for (int d = 0; d < l->ndim; d++) l->shape[d] = dist_mesh_dim_size(m, d);
  for (int i = 0; i < l->nranks; i++) l->ranks[i] = dist_mesh_rank_at(m, i);
  cr_assert_eq(dist_parse_placements(placements, l->p, DIST_MAX_MESH_DIMS), l->ndim,
               "placements %s on mesh %s", placements, mesh);
  dist_mesh_free(m);
}

/* The ceil(N/k) rule: chunk i of n over k is [start, start + size). */
static void split_range(int64_t n, int k, int i, int64_t *start, int64_t *size) {
  int64_t chunk = (n + k - 1) / k;
  int64_t lo = chunk * i < n ? chunk * i : n;
  int64_t hi = lo + chunk < n ? lo + chunk : n;
  *start = lo;
  *size = hi - lo;
}

static void coords_of(const layout *l, int idx, int *coords) {
  for (int d = l->ndim - 1; d >= 0; d--) {
    coords[d] = idx % l->shape[d];
    idx /= l->shape[d];
  }
}

/* The box rank index idx holds: mesh dims in order, each Shard(d) splitting
 * what earlier mesh dims left of tensor dim d. Partial holds whole values. */
static void box_of(const layout *l, int idx, int ndim, const int64_t *global,
                   int64_t *shape, int64_t *off) {
  int coords[DIST_MAX_MESH_DIMS];
  coords_of(l, idx, coords);
  for (int d = 0; d < ndim; d++) shape[d] = global[d], off[d] = 0;
  for (int md = 0; md < l->ndim; md++) {
    if (l->p[md].kind != DIST_SHARD) continue;
    int d = l->p[md].dim;
    int64_t start, size;
    split_range(shape[d], l->shape[md], coords[md], &start, &size);
    off[d] += start;
    shape[d] = size;
  }
}

static int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* Flat index in the global tensor of element i of a box. */
static int64_t global_index(int ndim, const int64_t *global, const int64_t *shape,
                            const int64_t *off, int64_t i) {
  int64_t g = 0, stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t local = i % shape[d];
    i /= shape[d];
    g += (local + off[d]) * stride;
    stride *= global[d];
  }
  return g;
}

/* ------------------------------------------------------------ values */

/* The logical value of a non-partial source: small integers, exact in every
 * dtype used here (bfloat16 holds integers up to 256 exactly). */
static double value_at(int64_t g) { return (double)(g % 97) - 40; }

/* Partial(any) and Partial(all) hold truth values: a logical value meant to
 * become one of them is 0/1 (any(-40, 0, 0, 0) reads back as 1). */
static double truth_at(int64_t g) { return (g % 3) != 0; }

static int holds_truths(const layout *l) {
  for (int d = 0; d < l->ndim; d++)
    if (l->p[d].kind == DIST_PARTIAL &&
        (l->p[d].reduce == DIST_REDUCE_ANY || l->p[d].reduce == DIST_REDUCE_ALL))
      return 1;
  return 0;
}

/* Rank-dependent partial values, chosen so every reduction is exact: p is
 * the rank's position among the partial ranks, k their number. */
static double partial_at(int64_t g, int p, int k, dist_reduce op) {
  switch (op) {
    case DIST_REDUCE_SUM: return (double)(g % 11) - 5 + 3 * p;
    case DIST_REDUCE_AVG: return (double)k * (double)((g + p) % 5 - 2);
    case DIST_REDUCE_MAX:
    case DIST_REDUCE_MIN: return (double)((g * 7 + p * 13) % 23) - 11;
    case DIST_REDUCE_PROD: return ((g + p) % 3) == 0 ? 1 : ((g + p) % 3) == 1 ? 2 : -1;
    case DIST_REDUCE_ANY: return (g * 3 + p) % 5 == 0;
    case DIST_REDUCE_ALL: return (g + p) % 3 != 0 || g % 4 == 0;
  }
  return 0;
}

static double combine(double acc, double v, dist_reduce op) {
  switch (op) {
    case DIST_REDUCE_SUM:
    case DIST_REDUCE_AVG: return acc + v;
    case DIST_REDUCE_MAX: return v > acc ? v : acc;
    case DIST_REDUCE_MIN: return v < acc ? v : acc;
    case DIST_REDUCE_PROD: return acc * v;
    case DIST_REDUCE_ANY: return (acc != 0) || (v != 0);
    case DIST_REDUCE_ALL: return (acc != 0) && (v != 0);
  }
  return 0;
}

static double identity_of(dist_reduce op) {
  switch (op) {
    case DIST_REDUCE_PROD:
    case DIST_REDUCE_ALL: return 1;
    case DIST_REDUCE_MAX: return -INFINITY;
    case DIST_REDUCE_MIN: return INFINITY;
    default: return 0;
  }
}

/* ------------------------------------------------------------ one case */

typedef struct tcase {
  const char *mesh, *from, *to;
  dist_dtype dt;
  int ndim;
  int64_t shape[4];
  const char *to_mesh; /* cross-mesh reshard when set */
} tcase;

static int first_partial(const layout *l, dist_reduce *op) {
  for (int d = 0; d < l->ndim; d++)
    if (l->p[d].kind == DIST_PARTIAL) return *op = l->p[d].reduce, 1;
  return 0;
}

/* Position of a rank among the ranks that differ from it only along the
 * partial mesh dims, and their number. */
static void partial_position(const layout *l, int idx, int *pos, int *k) {
  int coords[DIST_MAX_MESH_DIMS];
  coords_of(l, idx, coords);
  *pos = 0;
  *k = 1;
  for (int d = 0; d < l->ndim; d++)
    if (l->p[d].kind == DIST_PARTIAL) {
      *pos = *pos * l->shape[d] + coords[d];
      *k *= l->shape[d];
    }
}

/* The source's pieces (partial sources) and the logical value. pieces[i] is
 * malloc'd for each mesh rank; V has numel elements of tc->dt. */
typedef struct source {
  void *pieces[64];
  int64_t piece_shape[64][DIST_MAX_DIMS];
  const int64_t *shapes[64];
  void *value;
  size_t value_bytes;
} source;

static void make_source(const tcase *tc, const layout *l, dist_reduce op, int partial,
                        int truths, source *s) {
  size_t elem = dist_dtype_size(tc->dt);
  int64_t n = numel(tc->ndim, tc->shape);
  double *v = calloc((size_t)n + 1, sizeof *v);
  char *seen = calloc((size_t)n + 1, 1);
  int k = 1;
  for (int i = 0; partial && i < l->nranks; i++) {
    int64_t off[DIST_MAX_DIMS];
    box_of(l, i, tc->ndim, tc->shape, s->piece_shape[i], off);
    s->shapes[i] = s->piece_shape[i];
    int pos, coords[DIST_MAX_MESH_DIMS], replica = 0;
    partial_position(l, i, &pos, &k);
    coords_of(l, i, coords);
    for (int d = 0; d < l->ndim; d++) replica |= l->p[d].kind == DIST_REPLICATE && coords[d];
    int64_t m = numel(tc->ndim, s->piece_shape[i]);
    s->pieces[i] = malloc((size_t)m * elem + 1);
    for (int64_t e = 0; e < m; e++) {
      int64_t g = global_index(tc->ndim, tc->shape, s->piece_shape[i], off, e);
      /* Replicas along Replicate dims hold the same partial value. */
      double pv = partial_at(g, pos, k, op);
      dist_elem_set(s->pieces[i], tc->dt, (size_t)e, pv);
      if (replica) continue;
      v[g] = seen[g] ? combine(v[g], pv, op) : pv;
      seen[g] = 1;
    }
  }
  s->value_bytes = (size_t)n * elem;
  s->value = malloc(s->value_bytes + 1);
  for (int64_t g = 0; g < n; g++) {
    double x = partial ? v[g] : truths ? truth_at(g) : value_at(g);
    if (partial && op == DIST_REDUCE_AVG) x /= k;
    dist_elem_set(s->value, tc->dt, (size_t)g, x);
  }
  free(v);
  free(seen);
}

static void source_free(source *s, int n) {
  for (int i = 0; i < n; i++) free(s->pieces[i]);
  free(s->value);
}

/* Element-exact comparison with a readable failure. */
static void expect_bytes(const void *got, size_t got_len, const void *want,
                         size_t want_len, dist_dtype dt, const char *what) {
  cr_assert_eq(got_len, want_len, "%s: %zu bytes, want %zu", what, got_len, want_len);
  if (memcmp(got, want, want_len) == 0) return;
  size_t elem = dist_dtype_size(dt);
  for (size_t i = 0; i < want_len / elem; i++)
    if (memcmp((const char *)got + i * elem, (const char *)want + i * elem, elem))
      cr_assert_fail("%s: element %zu is %g, want %g", what, i,
                     dist_elem_get(got, dt, i), dist_elem_get(want, dt, i));
}

static void check_full(dist_client *c, const dist_tensor *t, const source *s,
                       dist_dtype dt, const char *what) {
  void *data = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &nbytes), 0, "%s: full_tensor: %s",
               what, dist_errmsg(c));
  expect_bytes(data, nbytes, s->value, s->value_bytes, dt, what);
  free(data);
}

/* Every rank of the target layout holds its box of V; mesh dims that became
 * Partial hold V at coordinate 0 and the identity elsewhere (avg: V). */
static void check_pieces(dist_client *c, const dist_tensor *t, const tcase *tc,
                         const layout *from, const layout *to, const source *s,
                         const char *what) {
  size_t elem = dist_dtype_size(tc->dt);
  for (int i = 0; i < to->nranks; i++) {
    int64_t shape[DIST_MAX_DIMS], off[DIST_MAX_DIMS], got_shape[DIST_MAX_DIMS];
    int coords[DIST_MAX_MESH_DIMS], identity = 0;
    dist_reduce op = DIST_REDUCE_SUM;
    box_of(to, i, tc->ndim, tc->shape, shape, off);
    coords_of(to, i, coords);
    for (int d = 0; d < to->ndim; d++)
      if (to->p[d].kind == DIST_PARTIAL && from->p[d].kind != DIST_PARTIAL &&
          coords[d] != 0 && to->p[d].reduce != DIST_REDUCE_AVG)
        identity = 1, op = to->p[d].reduce;
    int64_t m = numel(tc->ndim, shape);
    char *want = malloc((size_t)m * elem + 1);
    for (int64_t e = 0; e < m; e++) {
      int64_t g = global_index(tc->ndim, tc->shape, shape, off, e);
      if (identity) dist_elem_set(want, tc->dt, (size_t)e, identity_of(op));
      else memcpy(want + e * (int64_t)elem, (char *)s->value + g * (int64_t)elem, elem);
    }
    void *data = NULL;
    size_t nbytes = 0;
    char label[256];
    snprintf(label, sizeof label, "%s, rank %d's piece", what, to->ranks[i]);
    cr_assert_eq(dist_dtensor_to_local(c, t, to->ranks[i], &data, &nbytes, got_shape), 0,
                 "%s: %s", label, dist_errmsg(c));
    for (int d = 0; d < tc->ndim; d++)
      cr_assert_eq(got_shape[d], shape[d], "%s: dim %d is %lld, want %lld", label, d,
                   (long long)got_shape[d], (long long)shape[d]);
    expect_bytes(data, nbytes, want, (size_t)m * elem, tc->dt, label);
    free(data);
    free(want);
  }
}

/* Every daemon of t's mesh holds its piece at one version, newer than
 * `than`: a checkpoint refuses a tensor whose versions differ. */
static uint64_t expect_one_version(dist_client *c, const dist_tensor *t, uint64_t than,
                                   const char *what) {
  dist_tensor_piece *pieces = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_pieces(c, t, &pieces, &n), 0, "%s: %s", what, dist_errmsg(c));
  for (int i = 0; i < n; i++) {
    cr_assert_eq(pieces[i].version, pieces[0].version, "%s: rank %d is at version %llu, "
                 "rank %d at %llu", what, pieces[i].rank, (unsigned long long)pieces[i].version,
                 pieces[0].rank, (unsigned long long)pieces[0].version);
    cr_assert_gt(pieces[i].version, than, "%s: rank %d is still at version %llu", what,
                 pieces[i].rank, (unsigned long long)pieces[i].version);
  }
  uint64_t v = pieces[0].version;
  free(pieces);
  return v;
}

/* Creates the source (dtensor_from_local for partial sources, shard_tensor
 * otherwise), checks it, reshards and checks the result. */
static void run_case(dist_client *c, const tcase *tc, int id) {
  layout from, to;
  layout_of(tc->mesh, tc->from, &from);
  layout_of(tc->to_mesh ? tc->to_mesh : tc->mesh, tc->to, &to);
  dist_reduce op = DIST_REDUCE_SUM;
  int partial = first_partial(&from, &op);
  source s;
  memset(&s, 0, sizeof s);
  make_source(tc, &from, op, partial, holds_truths(&to), &s);
  char name[32], what[400];
  snprintf(name, sizeof name, "case%d", id);
  snprintf(what, sizeof what, "case %d: %s %s %s -> %s %s (%s)", id, tc->mesh, tc->from,
           dist_dtype_name(tc->dt), tc->to_mesh ? tc->to_mesh : "", tc->to,
           dist_dtype_name(tc->dt));
  dist_mesh *mesh = NULL, *to_mesh = NULL;
  dist_mesh_from_string(tc->mesh, NULL, &mesh);
  if (tc->to_mesh) dist_mesh_from_string(tc->to_mesh, NULL, &to_mesh);
  dist_tensor *t = NULL;
  int rc = partial ? dist_dtensor_from_local(c, name, (const void *const *)s.pieces, tc->dt,
                                             tc->ndim, s.shapes, mesh, from.p, &t)
                   : dist_shard_tensor(c, name, s.value, tc->dt, tc->ndim, tc->shape,
                                       mesh, from.p, &t);
  cr_assert_eq(rc, 0, "%s: create: %s", what, dist_errmsg(c));
  if (!partial) check_pieces(c, t, tc, &from, &from, &s, what);
  check_full(c, t, &s, tc->dt, what);
  uint64_t v = expect_one_version(c, t, 0, what);
  cr_assert_eq(dist_reshard(c, t, to_mesh, to.p), 0, "%s: reshard: %s", what,
               dist_errmsg(c));
  check_full(c, t, &s, tc->dt, what);
  check_pieces(c, t, tc, &from, &to, &s, what);
  expect_one_version(c, t, v, what);
  cr_assert_eq(dist_tensor_delete(c, name), 0, "%s: delete: %s", what, dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  dist_mesh_free(to_mesh);
  source_free(&s, from.nranks);
}

static void run_cases(int daemons, const tcase *cases, int n) {
  start_cluster(&cluster, daemons);
  dist_client *c = harness_client(&cluster);
  for (int i = 0; i < n; i++) run_case(c, &cases[i], i);
  dist_close(c);
  stop_cluster();
}

#define NCASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ------------------------------------------------------------ transitions */

static const char *const M4 = "[0,1,2,3]", *const M22 = "[[0,1],[2,3]]";

Test(reshard, every_transition_on_a_1d_mesh_of_4, .timeout = 240, .fini = stop_cluster) {
  static const tcase cases[] = {
      {M4, "Shard(0)", "Replicate()", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M4, "Shard(1)", "Replicate()", DIST_INT64, 2, {3, 10}, NULL},
      {M4, "Partial(sum)", "Replicate()", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M4, "Partial(max)", "Replicate()", DIST_INT32, 1, {10}, NULL},
      {M4, "Partial(min)", "Replicate()", DIST_FLOAT64, 2, {10, 3}, NULL},
      {M4, "Partial(prod)", "Replicate()", DIST_INT64, 2, {10, 3}, NULL},
      {M4, "Partial(avg)", "Replicate()", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M4, "Partial(avg)", "Replicate()", DIST_INT32, 1, {10}, NULL},
      {M4, "Partial(any)", "Replicate()", DIST_INT32, 2, {10, 3}, NULL},
      {M4, "Partial(all)", "Replicate()", DIST_FLOAT16, 2, {10, 3}, NULL},
      {M4, "Partial(sum)", "Replicate()", DIST_BFLOAT16, 2, {10, 3}, NULL},
      {M4, "Partial(sum)", "Shard(0)", DIST_FLOAT64, 2, {10, 3}, NULL},
      {M4, "Partial(max)", "Shard(1)", DIST_BFLOAT16, 2, {3, 10}, NULL},
      {M4, "Partial(avg)", "Shard(0)", DIST_INT64, 1, {10}, NULL},
      {M4, "Partial(prod)", "Shard(0)", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M4, "Replicate()", "Shard(0)", DIST_INT32, 2, {10, 3}, NULL},
      {M4, "Replicate()", "Shard(1)", DIST_FLOAT16, 2, {3, 10}, NULL},
      {M4, "Replicate()", "Partial(sum)", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M4, "Replicate()", "Partial(avg)", DIST_FLOAT64, 2, {10, 3}, NULL},
      {M4, "Replicate()", "Partial(max)", DIST_INT32, 1, {10}, NULL},
      {M4, "Replicate()", "Partial(min)", DIST_BFLOAT16, 1, {10}, NULL},
      {M4, "Replicate()", "Partial(prod)", DIST_INT64, 1, {10}, NULL},
      {M4, "Replicate()", "Partial(any)", DIST_FLOAT32, 1, {10}, NULL},
      {M4, "Replicate()", "Partial(all)", DIST_INT32, 1, {10}, NULL},
      {M4, "Shard(0)", "Partial(sum)", DIST_INT64, 2, {10, 3}, NULL},
      {M4, "Shard(1)", "Partial(max)", DIST_FLOAT32, 2, {3, 10}, NULL},
      {M4, "Shard(0)", "Shard(1)", DIST_FLOAT32, 2, {10, 7}, NULL},
      {M4, "Shard(1)", "Shard(0)", DIST_INT64, 2, {5, 10}, NULL},
      {M4, "Shard(0)", "Shard(2)", DIST_BFLOAT16, 3, {10, 2, 6}, NULL},
      /* A dim smaller than the mesh: 3 over 4 is 1,1,1,0. */
      {M4, "Shard(0)", "Replicate()", DIST_FLOAT32, 2, {3, 5}, NULL},
      {M4, "Replicate()", "Shard(0)", DIST_INT32, 2, {3, 5}, NULL},
      {M4, "Shard(0)", "Shard(1)", DIST_FLOAT64, 2, {3, 2}, NULL},
      {M4, "Partial(sum)", "Shard(0)", DIST_FLOAT32, 1, {3}, NULL},
  };
  run_cases(4, cases, NCASES(cases));
}

Test(reshard, every_transition_on_a_2x2_mesh, .timeout = 240, .fini = stop_cluster) {
  static const tcase cases[] = {
      {M22, "Shard(0),Shard(1)", "Replicate(),Replicate()", DIST_FLOAT32, 2, {10, 5}, NULL},
      {M22, "Shard(0),Replicate()", "Replicate(),Shard(0)", DIST_INT32, 2, {10, 3}, NULL},
      {M22, "Replicate(),Replicate()", "Shard(0),Shard(1)", DIST_FLOAT64, 2, {10, 5}, NULL},
      {M22, "Partial(sum),Shard(1)", "Shard(0),Replicate()", DIST_FLOAT32, 2, {10, 5}, NULL},
      {M22, "Partial(max),Replicate()", "Replicate(),Shard(1)", DIST_BFLOAT16, 2, {4, 10}, NULL},
      {M22, "Replicate(),Partial(avg)", "Replicate(),Replicate()", DIST_FLOAT64, 2, {10, 3}, NULL},
      {M22, "Partial(sum),Partial(sum)", "Replicate(),Replicate()", DIST_INT64, 2, {10, 3}, NULL},
      {M22, "Partial(min),Shard(0)", "Shard(0),Shard(1)", DIST_INT32, 2, {10, 3}, NULL},
      {M22, "Replicate(),Replicate()", "Partial(sum),Shard(0)", DIST_INT32, 2, {10, 3}, NULL},
      {M22, "Shard(0),Replicate()", "Replicate(),Partial(min)", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M22, "Shard(0),Shard(1)", "Shard(1),Shard(0)", DIST_INT64, 2, {10, 7}, NULL},
      {M22, "Shard(1),Replicate()", "Shard(0),Partial(all)", DIST_FLOAT16, 2, {10, 3}, NULL},
      {M22, "Replicate(),Shard(0)", "Partial(avg),Partial(avg)", DIST_FLOAT32, 2, {10, 3}, NULL},
  };
  run_cases(4, cases, NCASES(cases));
}

Test(reshard, nested_shards_of_one_tensor_dim, .timeout = 240, .fini = stop_cluster) {
  static const tcase cases[] = {
      {M22, "Shard(0),Shard(0)", "Replicate(),Replicate()", DIST_FLOAT32, 2, {13, 3}, NULL},
      {M22, "Replicate(),Replicate()", "Shard(0),Shard(0)", DIST_INT32, 2, {10, 2}, NULL},
      {M22, "Shard(0),Shard(0)", "Shard(1),Shard(1)", DIST_FLOAT64, 2, {7, 9}, NULL},
      {M22, "Shard(0),Shard(0)", "Shard(0),Replicate()", DIST_INT64, 1, {10}, NULL},
      {M22, "Shard(1),Shard(0)", "Shard(0),Shard(0)", DIST_BFLOAT16, 2, {3, 5}, NULL},
      {M22, "Partial(sum),Shard(0)", "Shard(0),Shard(0)", DIST_FLOAT32, 2, {10, 2}, NULL},
  };
  run_cases(4, cases, NCASES(cases));
}

Test(reshard, uneven_13_over_6, .timeout = 240, .fini = stop_cluster) {
  static const char *const M6 = "[0,1,2,3,4,5]", *const M23 = "[[0,1,2],[3,4,5]]";
  static const tcase cases[] = {
      {M6, "Shard(0)", "Replicate()", DIST_FLOAT32, 2, {13, 2}, NULL},
      {M6, "Replicate()", "Shard(0)", DIST_INT64, 2, {13, 2}, NULL},
      {M6, "Shard(0)", "Shard(1)", DIST_FLOAT64, 2, {13, 8}, NULL},
      {M6, "Partial(sum)", "Shard(0)", DIST_INT32, 1, {13}, NULL},
      {M6, "Partial(max)", "Replicate()", DIST_BFLOAT16, 1, {13}, NULL},
      {M6, "Shard(0)", "Partial(sum)", DIST_FLOAT32, 1, {13}, NULL},
      {M23, "Shard(0),Shard(1)", "Shard(1),Shard(0)", DIST_FLOAT32, 2, {13, 13}, NULL},
      {M23, "Shard(0),Shard(0)", "Replicate(),Shard(0)", DIST_INT32, 1, {13}, NULL},
  };
  run_cases(6, cases, NCASES(cases));
}

Test(reshard, across_meshes_of_the_same_shape, .timeout = 240, .fini = stop_cluster) {
  static const tcase cases[] = {
      {"[0,1]", "Shard(0)", "Shard(0)", DIST_FLOAT32, 2, {10, 3}, "[2,3]"},
      {"[0,1]", "Shard(0)", "Replicate()", DIST_INT64, 2, {7, 3}, "[2,3]"},
      {"[0,1]", "Partial(sum)", "Replicate()", DIST_FLOAT64, 1, {9}, "[2,3]"},
      {"[0,1]", "Replicate()", "Shard(1)", DIST_INT32, 2, {3, 3}, "[3,2]"},
      {"[1,2]", "Shard(0)", "Shard(0)", DIST_FLOAT32, 1, {5}, "[2,3]"},
      {"[0,1]", "Replicate()", "Shard(0)", DIST_FLOAT32, 2, {5, 3}, "[1,2]"},
      {"[0,1]", "Shard(0)", "Shard(1)", DIST_INT64, 2, {4, 4}, "[1,0]"},
      {M22, "Shard(0),Replicate()", "Replicate(),Shard(1)", DIST_FLOAT32, 2, {10, 5},
       "[[2,3],[0,1]]"},
  };
  run_cases(4, cases, NCASES(cases));
}

/* shard_tensor with Partial placements follows Paddle: the logical value is
 * the tensor given, so coordinate 0 keeps it and the others hold the
 * identity (avg: every rank keeps it). */
Test(shard_tensor, partial_placements_keep_the_logical_value, .timeout = 120, .fini = stop_cluster) {
  static const tcase cases[] = {
      {M4, "Replicate()", "Partial(sum)", DIST_FLOAT32, 2, {10, 3}, NULL},
      {M22, "Replicate(),Shard(0)", "Partial(max),Shard(0)", DIST_INT32, 2, {10, 3}, NULL},
      {M4, "Replicate()", "Partial(avg)", DIST_FLOAT64, 1, {10}, NULL},
  };
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  for (int i = 0; i < NCASES(cases); i++) {
    const tcase *tc = &cases[i];
    layout rep, part;
    layout_of(tc->mesh, tc->from, &rep);
    layout_of(tc->mesh, tc->to, &part);
    source s;
    memset(&s, 0, sizeof s);
    make_source(tc, &rep, DIST_REDUCE_SUM, 0, holds_truths(&part), &s);
    dist_mesh *mesh = NULL;
    dist_mesh_from_string(tc->mesh, NULL, &mesh);
    dist_tensor *t = NULL;
    cr_assert_eq(dist_shard_tensor(c, "p", s.value, tc->dt, tc->ndim, tc->shape, mesh,
                                   part.p, &t), 0, "%s", dist_errmsg(c));
    check_full(c, t, &s, tc->dt, tc->to);
    check_pieces(c, t, tc, &rep, &part, &s, tc->to);
    cr_assert_eq(dist_tensor_delete(c, "p"), 0, "%s", dist_errmsg(c));
    dist_tensor_free(t);
    dist_mesh_free(mesh);
    source_free(&s, 0);
  }
  dist_close(c);
  stop_cluster();
}

/* A tensor of dt, Partial(avg) on every dim of mesh, from one piece of n
 * elements per rank: its whole value, read at once and again after a
 * reshard to `to`, must be want. */
static void expect_partial_avg_on(dist_client *c, const char *mesh_str, dist_dtype dt,
                                  const void *const *pieces, int64_t n,
                                  const void *want, const char *to) {
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh_str, NULL, &mesh), 0);
  int nd = dist_mesh_ndim(mesh), nranks = dist_mesh_size(mesh);
  dist_placement avg[DIST_MAX_MESH_DIMS], dst[DIST_MAX_MESH_DIMS];
  for (int d = 0; d < nd; d++) avg[d] = DIST_PARTIAL_OF(DIST_REDUCE_AVG);
  cr_assert_eq(dist_parse_placements(to, dst, nd), nd);
  const int64_t *shapes[DIST_MAX_MESH_RANKS];
  for (int r = 0; r < nranks; r++) shapes[r] = &n;
  dist_tensor *t = NULL;
  cr_assert_eq(dist_dtensor_from_local(c, "avg", pieces, dt, 1, shapes, mesh, avg, &t), 0,
               "%s", dist_errmsg(c));
  size_t bytes = (size_t)n * dist_dtype_size(dt);
  for (int step = 0; step < 2; step++) {
    if (step == 1)
      cr_assert_eq(dist_reshard(c, t, NULL, dst), 0, "%s", dist_errmsg(c));
    void *data = NULL;
    size_t got = 0;
    cr_assert_eq(dist_full_tensor(c, t, &data, &got), 0, "%s", dist_errmsg(c));
    expect_bytes(data, got, want, bytes, dt, step ? to : "Partial(avg)");
    free(data);
  }
  cr_assert_eq(dist_tensor_delete(c, "avg"), 0, "%s", dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(mesh);
}

static void expect_partial_avg(dist_client *c, dist_dtype dt, const void *const *pieces,
                               int64_t n, const void *want, const char *to) {
  expect_partial_avg_on(c, "[0,1,2]", dt, pieces, n, want, to);
}

/* Partial(avg) of integers: the daemons summed in the dtype, which wraps,
 * and divided then (int32 avg(2e9, 2e9, 2e9) read 568344234). The average
 * is exact now, truncated toward zero as C divides; computed here in a
 * wider type. */
Test(reshard, integer_partial_avg_is_exact, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 3);
  dist_client *c = harness_client(&cluster);
  const uint8_t u8[3][1] = {{200}, {100}, {4}}, u8_avg[1] = {101};
  expect_partial_avg(c, DIST_UINT8, (const void *[]){u8[0], u8[1], u8[2]}, 1, u8_avg,
                     "Replicate()");
  const int8_t i8[3][2] = {{-100, 127}, {-100, 127}, {-27, 126}}, i8_avg[2] = {-75, 126};
  expect_partial_avg(c, DIST_INT8, (const void *[]){i8[0], i8[1], i8[2]}, 2, i8_avg,
                     "Replicate()");
  __extension__ typedef __int128 wide;
  const int64_t i64[3][1] = {{INT64_MAX}, {INT64_MAX}, {INT64_MAX - 5}};
  int64_t i64_avg[1] = {(int64_t)(((wide)INT64_MAX * 3 - 5) / 3)};
  expect_partial_avg(c, DIST_INT64, (const void *[]){i64[0], i64[1], i64[2]}, 1, i64_avg,
                     "Shard(0)");
  /* 6000 int32 x 2 peers is past the direct all-reduce: the reduce-scatter
   * path averages too. Signs alternate, so negative sums truncate up. */
  enum { N = 6000 };
  int32_t *p32[3], *want = malloc(N * sizeof *want);
  for (int r = 0; r < 3; r++) p32[r] = malloc(N * sizeof *p32[r]);
  for (int i = 0; i < N; i++) {
    int64_t sum = 0;
    for (int r = 0; r < 3; r++) {
      p32[r][i] = (i % 2 ? -1 : 1) * (2000000000 - (i * 31 + r * 17) % 1000);
      sum += p32[r][i];
    }
    want[i] = (int32_t)(sum / 3);
  }
  const void *pieces[3] = {p32[0], p32[1], p32[2]};
  expect_partial_avg(c, DIST_INT32, pieces, N, want, "Replicate()");
  expect_partial_avg(c, DIST_INT32, pieces, N, want, "Shard(0)");
  for (int r = 0; r < 3; r++) free(p32[r]);
  free(want);
  dist_close(c);
  stop_cluster();
}

/* Partial(avg) on both dims of a 2x2 mesh: the four parts average at once,
 * truncated once, as a checkpoint's rebuild does. Reduced one dim at a time,
 * (1, 2, 0, 1) read 0: avg(avg(1, 0), avg(2, 1)) = avg(0, 1). The second
 * element's parts sum past int32. */
Test(reshard, integer_partial_avg_on_two_dims_truncates_once, .timeout = 120,
     .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  const int32_t parts[4][2] = {{1, 2000000001}, {2, 2000000002},
                               {0, 2000000003}, {1, -2000000000}};
  int32_t want[2] = {1, (int32_t)((2000000001LL + 2000000002 + 2000000003 - 2000000000) / 4)};
  const void *pieces[4] = {parts[0], parts[1], parts[2], parts[3]};
  const char *to[] = {"Replicate(),Replicate()", "Shard(0),Replicate()",
                      "Replicate(),Shard(0)"};
  for (int i = 0; i < 3; i++)
    expect_partial_avg_on(c, "[[0,1],[2,3]]", DIST_INT32, pieces, 2, want, to[i]);
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ dtensor_from_local */

/* Names of the tensors daemon r holds, comma-joined. */
static void names_on_rank(harness *h, int r, char *buf, size_t len) {
  dist_client *c = harness_client_rank(h, r, 10000);
  dist_tensor **list = NULL;
  int n = 0;
  cr_assert_eq(dist_tensor_list(c, &list, &n), 0, "rank %d: %s", r, dist_errmsg(c));
  size_t pos = 0;
  buf[0] = 0;
  for (int i = 0; i < n && pos < len; i++)
    pos += (size_t)snprintf(buf + pos, len - pos, "%s%s", i ? "," : "",
                            dist_tensor_name(list[i]));
  dist_tensor_list_free(list, n);
  dist_close(c);
}

static void expect_store(harness *h, const char *want, const char *after) {
  for (int r = 0; r < h->n; r++) {
    char names[512];
    names_on_rank(h, r, names, sizeof names);
    cr_assert_str_eq(names, want, "after %s, rank %d holds [%s], want [%s]", after, r,
                     names, want);
  }
}

/* Pieces 3,3,3,1 of a [10, 2] float32 tensor over [0,1,2,3]: piece r holds
 * rows of the reference. */
static void uneven_pieces(float *ref, float pieces[4][6], int64_t shapes[4][2]) {
  for (int i = 0; i < 20; i++) ref[i] = (float)(i * 3 - 7);
  for (int r = 0; r < 4; r++) {
    int64_t start, size;
    split_range(10, 4, r, &start, &size);
    shapes[r][0] = size;
    shapes[r][1] = 2;
    memcpy(pieces[r], ref + start * 2, sizeof(float) * (size_t)(size * 2));
  }
}

Test(from_local, single_client_uneven_pieces_follow_the_split_rule, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  float ref[20], pieces[4][6];
  int64_t shapes[4][2];
  uneven_pieces(ref, pieces, shapes);
  const void *ptrs[4] = {pieces[0], pieces[1], pieces[2], pieces[3]};
  const int64_t *sp[4] = {shapes[0], shapes[1], shapes[2], shapes[3]};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_dtensor_from_local(c, "u", ptrs, DIST_FLOAT32, 2, sp, mesh, &p, &t), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_shape(t)[0], 10);
  cr_assert_eq(dist_tensor_shape(t)[1], 2);
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s", dist_errmsg(c));
  expect_bytes(data, n, ref, sizeof ref, DIST_FLOAT32, "full tensor");
  free(data);
  for (int r = 0; r < 4; r++) {
    int64_t shape[2];
    cr_assert_eq(dist_dtensor_to_local(c, t, r, &data, &n, shape), 0, "%s", dist_errmsg(c));
    cr_assert_eq(shape[0], shapes[r][0]);
    expect_bytes(data, n, pieces[r], (size_t)shapes[r][0] * 2 * sizeof(float),
                 DIST_FLOAT32, "piece");
    free(data);
  }
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  dist_close(c);
  stop_cluster();
}

Test(from_local, pieces_that_do_not_fit_leave_every_store_unchanged, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  float ref[20], pieces[4][6];
  int64_t shapes[4][2];
  uneven_pieces(ref, pieces, shapes);
  const void *ptrs[4] = {pieces[0], pieces[1], pieces[2], pieces[3]};
  const int64_t *sp[4] = {shapes[0], shapes[1], shapes[2], shapes[3]};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_dtensor_from_local(c, "keep", ptrs, DIST_FLOAT32, 2, sp, mesh, &p, &t),
               0, "%s", dist_errmsg(c));
  dist_tensor_free(t);
  /* 3,3,2,2 sums to 10 but is not the ceil rule's 3,3,3,1. */
  shapes[2][0] = 2, shapes[3][0] = 2;
  int rc = dist_dtensor_from_local(c, "bad", ptrs, DIST_FLOAT32, 2, sp, mesh, &p, &t);
  cr_assert_eq(rc, DIST_EMISMATCH, "got %s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "do not fit"), "%s", dist_errmsg(c));
  cr_assert_null(t);
  expect_store(&cluster, "keep", "pieces 3,3,2,2");
  /* Replicate needs equal pieces: [2] on one rank and [3] on the others. */
  shapes[0][0] = 3, shapes[1][0] = 3, shapes[2][0] = 2, shapes[3][0] = 3;
  dist_placement rep = DIST_REPLICATED;
  rc = dist_dtensor_from_local(c, "bad", ptrs, DIST_FLOAT32, 2, sp, mesh, &rep, &t);
  cr_assert_eq(rc, DIST_EMISMATCH, "got %s: %s", dist_err_name(rc), dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "rank 2"), "%s", dist_errmsg(c));
  expect_store(&cluster, "keep", "unequal replicated pieces");
  dist_mesh_free(mesh);
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ SPMD */

/* SPMD trainers are threads, each with its own client made by
 * dist_init_from_env (the environment is set before each one is made). */
static dist_client *spmd_client(harness *h, int rank, const char *job) {
  dist_client *c = harness_spmd_client(h, rank, job);
  cr_assert_eq(dist_rank(c), rank);
  return c;
}

typedef struct trainer {
  dist_client *c;
  int rank;
  dist_dtype dt[4]; /* per rank, for the dtype-mismatch case */
  const char *name; /* for spmd_shard_put */
  int64_t rows;
  int local; /* spmd_shard_put: by dtensor_from_local, tr->rows its piece's */
  int reshard; /* spmd_refused_then_reduce: put tr->name, then reshard it */
  int null_handle; /* spmd_reshard: trainer 0 passes a NULL tensor */
  int want;
  int ok, rc;
  char msg[512];
  double failed_at;
} trainer;

/* Rank r's piece of the [10, 3] reference, rows split 3,3,3,1. */
static void spmd_piece(int r, float *piece, int64_t *shape, float *ref) {
  for (int i = 0; i < 30; i++) ref[i] = (float)(i * 5 % 17) - 3;
  int64_t start, size;
  split_range(10, 4, r, &start, &size);
  shape[0] = size;
  shape[1] = 3;
  memcpy(piece, ref + start * 3, sizeof(float) * (size_t)(size * 3));
}

static void *spmd_train(void *arg) {
  trainer *tr = arg;
  float ref[30], piece[9];
  int64_t shape[2];
  const int64_t *sp[1] = {shape};
  const void *pp[1] = {piece};
  spmd_piece(tr->rank, piece, shape, ref);
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0), q = DIST_SHARD_DIM(1);
  dist_tensor *t = NULL;
  void *data = NULL;
  size_t n = 0;
  int64_t ls[2];
  tr->ok = 0;
  if (dist_dtensor_from_local(tr->c, "spmd", pp, DIST_FLOAT32, 2, sp, mesh, &p, &t) != 0 ||
      dist_reshard(tr->c, t, NULL, &q) != 0 || dist_full_tensor(tr->c, t, &data, &n) != 0) {
    snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
    goto out;
  }
  if (n != sizeof ref || memcmp(data, ref, sizeof ref) != 0) {
    snprintf(tr->msg, sizeof tr->msg, "full tensor differs from the reference");
    goto out;
  }
  free(data);
  data = NULL;
  /* Shard(1) of 3 columns over 4: rank r holds column r (none for 3). */
  if (dist_dtensor_to_local(tr->c, t, -1, &data, &n, ls) != 0) {
    snprintf(tr->msg, sizeof tr->msg, "%s", dist_errmsg(tr->c));
    goto out;
  }
  int64_t cols = tr->rank < 3 ? 1 : 0;
  int good = ls[0] == 10 && ls[1] == cols && n == (size_t)(10 * cols) * sizeof(float);
  for (int i = 0; good && i < 10 * cols; i++) good = ((float *)data)[i] == ref[i * 3 + tr->rank];
  if (!good) {
    snprintf(tr->msg, sizeof tr->msg, "local piece [%lld, %lld] differs", (long long)ls[0],
             (long long)ls[1]);
    goto out;
  }
  tr->ok = 1;
out:
  free(data);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return NULL;
}

static void run_trainers(trainer *tr, int n, void *(*fn)(void *)) {
  pthread_t th[8];
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, fn, &tr[i]);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

Test(spmd, trainers_build_reshard_and_read_a_tensor, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  trainer tr[4];
  memset(tr, 0, sizeof tr);
  for (int r = 0; r < 4; r++) tr[r].c = spmd_client(&cluster, r, "spmd-test-1"), tr[r].rank = r;
  run_trainers(tr, 4, spmd_train);
  for (int r = 0; r < 4; r++) {
    cr_expect(tr[r].ok, "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  stop_cluster();
}

/* Records a trainer's put that must fail with `want`. */
static void expect_refusal(trainer *tr, int rc, int want) {
  tr->ok = rc == want;
  snprintf(tr->msg, sizeof tr->msg, "%s: %s", dist_err_name(rc), dist_errmsg(tr->c));
}

/* shard_tensor (tr->local: dtensor_from_local) of tr->name, tr->rows
 * float32 rows, Shard(0) onto [0,1] from one SPMD trainer, which must fail
 * with tr->want. */
static void *spmd_shard_put(void *arg) {
  trainer *tr = arg;
  float whole[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[1] = {tr->rows};
  const int64_t *sp[1] = {shape};
  const void *pp[1] = {whole};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1]", NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  int rc = tr->local
               ? dist_dtensor_from_local(tr->c, tr->name, pp, DIST_FLOAT32, 1, sp, mesh, &p, &t)
               : dist_shard_tensor(tr->c, tr->name, whole, DIST_FLOAT32, 1, shape, mesh, &p, &t);
  expect_refusal(tr, rc, tr->want);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return NULL;
}

/* SPMD trainers each put their own piece; one daemon refuses (it holds
 * the name as a per-rank value), so neither stores it. Before 0.2.3
 * rank 0 stored its piece and its trainer was told the put succeeded. A
 * trainer whose rank is not in the mesh succeeds with an empty piece and
 * stores nothing, as in Paddle (test_outside). */
Test(bad_input, an_spmd_put_one_daemon_refuses_is_stored_by_none, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 3);
  dist_client *c = harness_client(&cluster);
  float mine[1] = {7};
  dist_tensor_free(harness_put(c, "taken", DIST_FLOAT32, mine, 1, (int64_t[]){1}, "[1]",
                               "Replicate()"));
  trainer tr[2];
  memset(tr, 0, sizeof tr);
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = spmd_client(&cluster, r, "spmd-taken"), .rank = r, .name = "taken",
                      .rows = 4, .want = DIST_EEXIST};
  }
  run_trainers(tr, 2, spmd_shard_put);
  for (int r = 0; r < 2; r++) {
    cr_expect(tr[r].ok, "trainer %d: %s", r, tr[r].msg);
    cr_expect(strstr(tr[r].msg, "'taken' already exists"), "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 0, "taken", &t), DIST_ENOTFOUND,
               "rank 0 stored its piece of a put rank 1 refused");
  cr_assert_eq(harness_open_on(&cluster, 1, "taken", &t), 0, "rank 1 lost its own 'taken'");
  cr_assert_eq(dist_mesh_size(dist_tensor_mesh(t)), 1);
  dist_tensor_free(t);
  trainer outside = {.c = spmd_client(&cluster, 2, "spmd-taken-2"), .rank = 2, .name = "taken",
                     .rows = 4, .want = 0};
  spmd_shard_put(&outside);
  cr_expect(outside.ok, "%s", outside.msg);
  cr_expect_eq(harness_open_on(&cluster, 2, "taken", &t), DIST_ENOTFOUND,
               "rank 2's daemon stored a piece of a mesh it is not in");
  dist_close(outside.c);
  dist_close(c);
  stop_cluster();
}

/* SPMD trainers that describe one tensor differently: each daemon could
 * store what its own trainer sent, pieces of two different tensors under
 * one name; the vote compares what each daemon was sent, and neither
 * stores. */
Test(bad_input, spmd_puts_of_different_shapes_are_refused_everywhere, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  trainer tr[2];
  memset(tr, 0, sizeof tr);
  for (int r = 0; r < 2; r++) { /* 4 rows from trainer 0, 6 from trainer 1 */
    tr[r] = (trainer){.c = spmd_client(&cluster, r, "spmd-disagree"), .rank = r, .name = "d",
                      .rows = 4 + 2 * r, .want = DIST_EMISMATCH};
  }
  run_trainers(tr, 2, spmd_shard_put);
  for (int r = 0; r < 2; r++) {
    cr_expect(tr[r].ok, "trainer %d: %s", r, tr[r].msg);
    cr_expect(strstr(tr[r].msg, "ranks 0 and 1 were sent different descriptions"),
              "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  expect_store(&cluster, "", "puts of different shapes");
  stop_cluster();
}

static void *spmd_mixed_dtypes(void *arg) {
  trainer *tr = arg;
  int64_t shape[1] = {2};
  const int64_t *sp[1] = {shape};
  int64_t piece[2] = {1, 2}; /* 16 bytes: enough for any dtype */
  const void *pp[1] = {piece};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  int rc = dist_dtensor_from_local(tr->c, "mixed", pp, tr->dt[tr->rank], 1, sp, mesh, &p, &t);
  expect_refusal(tr, rc, DIST_EMISMATCH);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return NULL;
}

Test(bad_input, spmd_pieces_of_different_dtypes_are_refused_everywhere, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  trainer tr[4];
  memset(tr, 0, sizeof tr);
  for (int r = 0; r < 4; r++) {
    tr[r].c = spmd_client(&cluster, r, "spmd-test-2");
    tr[r].rank = r;
    for (int k = 0; k < 4; k++) tr[r].dt[k] = k == 2 ? DIST_INT32 : DIST_FLOAT32;
  }
  run_trainers(tr, 4, spmd_mixed_dtypes);
  for (int r = 0; r < 4; r++) {
    cr_expect(tr[r].ok, "trainer %d: %s", r, tr[r].msg);
    cr_expect(strstr(tr[r].msg, "dtype"), "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  expect_store(&cluster, "", "pieces of different dtypes");
  stop_cluster();
}

/* Reshards the tensor tr->name to Replicate() (trainer 0: to Shard(1),
 * which libdist refuses for a 1-d tensor, or with tr->null_handle a NULL
 * tensor to Replicate()); it must fail with tr->want. */
static void spmd_reshard(trainer *tr) {
  dist_tensor *t = NULL;
  int rc = dist_tensor_open(tr->c, tr->name, &t);
  int refuse = tr->rank == 0;
  dist_placement p = refuse && !tr->null_handle ? DIST_SHARD_DIM(1) : DIST_REPLICATED;
  if (rc == 0) rc = dist_reshard(tr->c, refuse && tr->null_handle ? NULL : t, NULL, &p);
  expect_refusal(tr, rc, tr->want);
  dist_tensor_free(t);
}

/* A put (tr->reshard: a reshard after a good put) libdist refuses on
 * trainer 0 and sends from trainer 1, timed; then an all-reduce of both
 * trainers, which meets only when both took the refused op's id. */
static void *spmd_refused_then_reduce(void *arg) {
  trainer *tr = arg;
  if (tr->reshard) {
    spmd_shard_put(tr);
    if (!tr->ok) return NULL;
    tr->want = DIST_EINVAL;
  }
  double t0 = harness_now_s();
  tr->reshard ? spmd_reshard(tr) : (void)spmd_shard_put(tr);
  tr->failed_at = harness_now_s() - t0;
  int put_ok = tr->ok;
  int32_t v = tr->rank + 1;
  tr->rc = dist_all_reduce(tr->c, &v, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  if (tr->rc != 0 || v != 3)
    snprintf(tr->msg + strlen(tr->msg), sizeof tr->msg - strlen(tr->msg),
             "; then all_reduce: %s, %d", dist_errmsg(tr->c), (int)v);
  tr->ok = put_ok && tr->rc == 0 && v == 3;
  return NULL;
}

/* Two trainers: trainer 0 names a shard_tensor "__metadata__" (local:
 * gives its dtensor_from_local piece -1 rows), trainer 1 makes a good one
 * and has a deadline of timeout_ms; trainer 0's is three times that, for
 * its all-reduce waits for trainer 1's put to end. */
static void run_refused_put(trainer *tr, const char *job, long timeout_ms, int local) {
  start_cluster(&cluster, 2);
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = spmd_client(&cluster, r, job), .rank = r, .local = local,
                      .name = r || local ? "good" : "__metadata__",
                      .rows = r || !local ? 2 : -1, .want = DIST_EINVAL};
    tr[r].c->timeout_ms = r ? timeout_ms : 3 * timeout_ms;
  }
  run_trainers(tr, 2, spmd_refused_then_reduce);
}

/* Trainer 1 was told at once that rank 0 refused the reshard of "r", and
 * why (`reason`); both trainers' all-reduce met afterwards, and neither
 * daemon resharded "r". */
static void expect_reshard_refusal_told(trainer *tr, const char *reason) {
  cr_expect_lt(tr[1].failed_at, 3.0, "trainer 1 waited %.1f s: %s", tr[1].failed_at, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, reason),
            "trainer 1: %s; trainer 0's reason: %s", tr[1].msg, reason);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "trainer %d's all-reduce after: %s", r, tr[r].msg);
    dist_tensor *t = NULL;
    cr_expect_eq(harness_open_on(&cluster, r, "r", &t), 0, "rank %d lost 'r'", r);
    if (t) cr_expect_eq(dist_tensor_placements(t)[0].kind, DIST_SHARD, "rank %d resharded", r);
    dist_tensor_free(t);
    dist_close(tr[r].c);
  }
  stop_cluster();
}

/* Two trainers put "r", then trainer 0 makes a reshard of it libdist
 * refuses (null_handle: of a NULL tensor), saying `says`, and trainer 1 a
 * good one, which must be told at once (expect_reshard_refusal_told). */
static void expect_refused_reshard_told(const char *job, int null_handle, const char *says) {
  trainer tr[2];
  start_cluster(&cluster, 2);
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = spmd_client(&cluster, r, job), .rank = r, .reshard = 1,
                      .null_handle = null_handle, .name = "r", .rows = 2};
    tr[r].c->timeout_ms = r ? 10000 : 30000; /* trainer 0 waits for trainer 1's reshard */
  }
  run_trainers(tr, 2, spmd_refused_then_reduce);
  cr_expect(strstr(tr[0].msg, says), "trainer 0: %s", tr[0].msg);
  const char *reason = strchr(tr[0].msg, ' ') + 1; /* past "EINVAL: " */
  expect_reshard_refusal_told(tr, reason);
}

/* Before, the refusing trainer took no op id for the reshard, and the
 * other daemon waited for its part until the deadline (5 s of silence). */
Test(spmd, a_reshard_one_trainer_refuses_fails_the_other_at_once, .timeout = 90,
     .fini = stop_cluster) {
  expect_refused_reshard_told("spmd-refused-reshard", 0, "EINVAL: ");
}

/* Before, a trainer giving dist_reshard a NULL tensor took no op id: the
 * other daemon waited for its part until the deadline, and every later
 * operation of the two trainers ran under different ids. */
Test(spmd, a_reshard_of_a_null_tensor_fails_the_other_at_once, .timeout = 90,
     .fini = stop_cluster) {
  expect_refused_reshard_told("spmd-null-reshard", 1, "EINVAL: dist_reshard: t is NULL");
}

/* Before, the refusing trainer did not take the put's op id, so every
 * later operation of the two trainers ran under different ids, and none
 * met again. */
Test(spmd, a_put_one_trainer_refuses_keeps_the_op_ids_in_step, .timeout = 60, .fini = stop_cluster) {
  trainer tr[2];
  run_refused_put(tr, "spmd-refused-step", 3000, 0);
  cr_expect(strstr(tr[0].msg, "EINVAL: shard_tensor: "), "trainer 0: %s", tr[0].msg);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  expect_store(&cluster, "", "a put one trainer refused");
  stop_cluster();
}

/* Trainer 1 was told at once that rank 0 refused, and why (`reason`),
 * both trainers' all-reduce met afterwards, and no daemon stored it. */
static void expect_told_at_once(trainer *tr, const char *reason) {
  cr_expect_lt(tr[1].failed_at, 3.0, "trainer 1 waited %.1f s: %s", tr[1].failed_at, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, reason),
            "trainer 1: %s", tr[1].msg);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "trainer %d: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  expect_store(&cluster, "", "a put one trainer refused");
  stop_cluster();
}

/* Before, the refusing trainer's daemon never heard of the put, and the
 * other daemon waited for its verdict until the deadline. */
Test(spmd, a_put_one_trainer_refuses_fails_the_other_at_once, .timeout = 90, .fini = stop_cluster) {
  trainer tr[2];
  run_refused_put(tr, "spmd-refused-abort", 10000, 0);
  expect_told_at_once(tr, "'__metadata__' is reserved");
}

Test(spmd, a_from_local_one_trainer_refuses_fails_the_other_at_once, .timeout = 90,
     .fini = stop_cluster) {
  trainer tr[2];
  run_refused_put(tr, "spmd-refused-local", 10000, 1);
  cr_expect(strstr(tr[0].msg, "EINVAL: dtensor_from_local 'good': rank 0's piece"),
            "trainer 0: %s", tr[0].msg);
  expect_told_at_once(tr, "rank 0's piece");
}

/* A put of `name` on [0,1] under its own op id, sent to rank 0 alone
 * (raw, as a single client's half put): daemon 0 holds the name while it
 * waits for rank 1's verdict, which never comes, until the test aborts
 * the op (end_half_put) or, at the latest, the 20 s deadline, which the
 * test's bounded waits do not outlast (its daemons' peer timeout is
 * longer still: the harness's 5 s would end the vote first). */
#define HALF_PUT_OP 0x4a1f9e7700000001ull /* no trainer's */
typedef struct blocker {
  harness *h;
  const char *name;
  int rc;
} blocker;

static void *half_put(void *arg) {
  blocker *b = arg;
  dist_client *c = harness_client_rank(b->h, 0, 20000);
  dist_mesh_desc mesh;
  dist_placement p = DIST_SHARD_DIM(0);
  cr_assert_eq(dist_mesh_parse(&mesh, "[0,1]", NULL, NULL), 0);
  dist_shape global = {1, {2}};
  dist_wire_meta *w = calloc(1, sizeof *w);
  dist_meta_to_pb(b->name, DIST_FLOAT32, &global, &mesh, &p, w);
  float piece = 1;
  Dist__V1__TensorPutRequest rq = DIST__V1__TENSOR_PUT_REQUEST__INIT;
  rq.meta = &w->meta;
  rq.op_id = HALF_PUT_OP;
  rq.data.data = (uint8_t *)&piece;
  rq.data.len = sizeof piece;
  ProtobufCMessage *rp = NULL;
  b->rc = dist_call_one(c, 0, "/dist.v1.Dist/TensorPut", &rq.base,
                        &dist__v1__tensor_put_reply__descriptor, &rp);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  free(w);
  dist_close(c);
  return NULL;
}

/* Ends the half put's hold at once: rank 1 aborts its op, so daemon 0's
 * vote fails instead of waiting out the deadline. */
static void end_half_put(harness *h) {
  uint32_t ranks[2] = {0, 1};
  harness_op_abort(h, 1, HALF_PUT_OP, 0, ranks, 2, "the test is done with its hold");
}

/* SPMD trainers put "held" (local: by dtensor_from_local) while daemon 0
 * holds the name for another put: daemon 0 refuses before its vote (or
 * shape exchange), and trainer 1 must hear of it at once, naming rank 0
 * and why; then both trainers' all-reduce meets. Before, daemon 1 waited
 * for rank 0's verdict until trainer 1's deadline (10 s). */
static void expect_daemon_refusal_told(int local) {
  start_cluster_with(&cluster, 2, "--peer-timeout=30s");
  blocker b = {.h = &cluster, .name = "held"};
  pthread_t th;
  pthread_create(&th, NULL, half_put, &b);
  /* Daemon 0 holds the name once it votes on the half put (bounded: a
   * fixed 500 ms was a race on a loaded host). */
  dist_client *watch = harness_client(&cluster);
  cr_assert(harness_wait_running(watch, 0, "vote", 0, 5000), "daemon 0 never voted");
  dist_close(watch);
  trainer tr[2];
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = spmd_client(&cluster, r, local ? "held-local" : "held-put"),
                      .rank = r, .local = local, .name = "held", .rows = 2,
                      .want = DIST_EUNAVAIL};
    tr[r].c->timeout_ms = r ? 10000 : 30000; /* trainer 0 waits for trainer 1's put */
  }
  run_trainers(tr, 2, spmd_refused_then_reduce);
  const char *reason = "being put by another request";
  cr_expect(strstr(tr[0].msg, reason), "trainer 0: %s", tr[0].msg);
  cr_expect_lt(tr[1].failed_at, 3.0, "trainer 1 waited %.1f s: %s", tr[1].failed_at, tr[1].msg);
  cr_expect(strstr(tr[1].msg, "rank 0 aborted op") && strstr(tr[1].msg, "its daemon refused it") &&
                strstr(tr[1].msg, reason),
            "trainer 1: %s", tr[1].msg);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(tr[r].rc, 0, "trainer %d's all-reduce after: %s", r, tr[r].msg);
    dist_close(tr[r].c);
  }
  end_half_put(&cluster);
  pthread_join(th, NULL);
  cr_expect_neq(b.rc, 0, "the half put succeeded");
  expect_store(&cluster, "", "a put daemon 0 refused");
  stop_cluster();
}

Test(spmd, a_put_one_daemon_refuses_before_its_vote_fails_the_other_at_once, .timeout = 90,
     .fini = stop_cluster) {
  expect_daemon_refusal_told(0);
}

Test(spmd, a_from_local_one_daemon_refuses_before_its_exchange_fails_the_other_at_once,
     .timeout = 90, .fini = stop_cluster) {
  expect_daemon_refusal_told(1);
}

/* A Reshard of `name` on [0,1] under this trainer's next op id, sent raw
 * to its own daemon with no placements, which only the daemon checks. */
static int raw_reshard_without_placements(dist_client *c, const char *name) {
  dist_mesh_desc mesh;
  cr_assert_eq(dist_mesh_parse(&mesh, "[0,1]", NULL, NULL), 0);
  dist_wire_meta *w = calloc(1, sizeof *w);
  dist_mesh_to_pb(&mesh, w);
  Dist__V1__ReshardRequest rq = DIST__V1__RESHARD_REQUEST__INIT;
  rq.name = (char *)name;
  rq.op_id = dist_next_op_id(c);
  rq.mesh = rq.src_mesh = &w->mesh;
  ProtobufCMessage *rp = NULL;
  int rc = dist_call_one(c, dist_rank(c), "/dist.v1.Dist/Reshard", &rq.base,
                         &dist__v1__reshard_reply__descriptor, &rp);
  if (rp) protobuf_c_message_free_unpacked(rp, NULL);
  free(w);
  return rc;
}

/* Both trainers put tr->name; trainer 0 then sends its daemon a reshard
 * request the daemon cannot parse, trainer 1 a good one (timed); then
 * both all-reduce. */
static void *reshard_one_daemon_refuses(void *arg) {
  trainer *tr = arg;
  spmd_shard_put(tr);
  if (!tr->ok) return NULL;
  double t0 = harness_now_s();
  int rc;
  if (tr->rank == 0) {
    rc = raw_reshard_without_placements(tr->c, tr->name);
  } else {
    dist_tensor *t = NULL;
    dist_placement p = DIST_REPLICATED;
    rc = dist_tensor_open(tr->c, tr->name, &t);
    if (rc == 0) rc = dist_reshard(tr->c, t, NULL, &p);
    dist_tensor_free(t);
  }
  tr->failed_at = harness_now_s() - t0;
  snprintf(tr->msg, sizeof tr->msg, "%s: %s", dist_err_name(rc), dist_errmsg(tr->c));
  int32_t v = tr->rank + 1;
  tr->rc = dist_all_reduce(tr->c, &v, 1, DIST_INT32, DIST_REDUCE_SUM, NULL, 0);
  if (tr->rc == 0 && v != 3) tr->rc = DIST_EPROTO;
  return NULL;
}

/* Before, daemon 1 waited for rank 0's part of the reshard until the peer
 * timeout (5 s): a single client sends every daemon the same request,
 * which all fail alike, but SPMD trainers each send their own. */
Test(spmd, a_reshard_one_daemon_cannot_parse_fails_the_other_at_once, .timeout = 90,
     .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  trainer tr[2];
  for (int r = 0; r < 2; r++) {
    tr[r] = (trainer){.c = spmd_client(&cluster, r, "reshard-unparsed"), .rank = r,
                      .name = "r", .rows = 2};
    tr[r].c->timeout_ms = r ? 10000 : 30000;
  }
  run_trainers(tr, 2, reshard_one_daemon_refuses);
  const char *reason = "placements: 0 given, the mesh has 1 dims";
  cr_expect(strstr(tr[0].msg, reason), "trainer 0: %s", tr[0].msg);
  expect_reshard_refusal_told(tr, reason);
}

/* ------------------------------------------------------------ concurrency */

typedef struct worker {
  harness *h;
  int id;
  int ok;
  char msg[512];
} worker;

/* Each worker puts, reshards and reads its own tensors, several times. */
static void *concurrent_worker(void *arg) {
  worker *w = arg;
  dist_client *c = NULL;
  w->ok = 0;
  if (dist_connect_cluster(w->h->cluster_file, NULL, &c) != 0) {
    snprintf(w->msg, sizeof w->msg, "%s", dist_last_connect_error());
    return NULL;
  }
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M22, NULL, &mesh);
  int64_t shape[2] = {37 + w->id, 11};
  int64_t n = shape[0] * shape[1];
  double *ref = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) ref[i] = (double)(i * (w->id + 1) % 101);
  dist_placement a[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(1)};
  dist_placement b[2] = {DIST_SHARD_DIM(1), DIST_REPLICATED};
  for (int round = 0; round < 5; round++) {
    char name[64];
    snprintf(name, sizeof name, "w%d.%d", w->id, round);
    dist_tensor *t = NULL;
    void *data = NULL;
    size_t bytes = 0;
    int rc = dist_shard_tensor(c, name, ref, DIST_FLOAT64, 2, shape, mesh, a, &t);
    if (rc == 0) rc = dist_reshard(c, t, NULL, b);
    if (rc == 0) rc = dist_full_tensor(c, t, &data, &bytes);
    if (rc == 0 && (bytes != sizeof(double) * (size_t)n || memcmp(data, ref, bytes) != 0))
      rc = dist_client_fail(c, DIST_EINTERNAL, "%s differs from its reference", name);
    if (rc == 0) rc = dist_tensor_delete(c, name);
    free(data);
    dist_tensor_free(t);
    if (rc != 0) {
      snprintf(w->msg, sizeof w->msg, "%s: %s", name, dist_errmsg(c));
      goto out;
    }
  }
  w->ok = 1;
out:
  free(ref);
  dist_mesh_free(mesh);
  dist_close(c);
  return NULL;
}

Test(concurrency, threads_working_on_different_tensors, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  worker w[6];
  pthread_t th[6];
  for (int i = 0; i < 6; i++) {
    w[i] = (worker){&cluster, i, 0, ""};
    pthread_create(&th[i], NULL, concurrent_worker, &w[i]);
  }
  for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 6; i++) cr_expect(w[i].ok, "worker %d: %s", i, w[i].msg);
  expect_store(&cluster, "", "the workers deleted their tensors");
  stop_cluster();
}

/* Puts data (n float64) as name, Replicate over mesh_text. */
static void put_replicated(dist_client *c, const char *name, const double *data, int64_t n,
                           const char *mesh_text) {
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string(mesh_text, NULL, &mesh), 0);
  dist_placement rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, name, data, DIST_FLOAT64, 1, &n, mesh, &rep, &t), 0,
               "%s", dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(mesh);
}

/* t's logical value is want[0..n) (float64). */
static void expect_full_f64(dist_client *c, const dist_tensor *t, const double *want, size_t n,
                            const char *after) {
  void *full = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &full, &nbytes), 0, "%s", dist_errmsg(c));
  expect_bytes(full, nbytes, want, n * sizeof *want, DIST_FLOAT64, after);
  free(full);
}

/* Whether daemon r holds name, as that daemon alone describes it; *first
 * (may be NULL) gets its placement on the first mesh dim. */
static int held_on_rank(harness *h, int r, const char *name, dist_placement *first) {
  dist_tensor *t = NULL;
  int held = harness_open_on(h, r, name, &t) == 0;
  if (held && first) *first = dist_tensor_placements(t)[0];
  dist_tensor_free(t);
  return held;
}

/* A client resharding "w" back and forth through three layouts, on its
 * own connection, counting what became of each reshard. */
typedef struct resharder {
  harness *h;
  int id, applied, refused, other;
  char msg[300];
} resharder;

static void *reshard_loop(void *arg) {
  resharder *r = arg;
  dist_client *c = harness_client(r->h);
  dist_placement layouts[3] = {DIST_REPLICATED, DIST_SHARD_DIM(0),
                               DIST_PARTIAL_OF(DIST_REDUCE_SUM)};
  for (int i = 0; i < 60 && !r->other; i++) {
    dist_tensor *t = NULL;
    int rc = dist_tensor_open(c, "w", &t);
    if (rc == 0) rc = dist_reshard(c, t, NULL, &layouts[(i + r->id) % 3]);
    if (rc == 0) {
      r->applied++;
    } else if (strstr(dist_errmsg(c), "being resharded by another request")) {
      r->refused++;
    } else {
      r->other = rc;
      snprintf(r->msg, sizeof r->msg, "%s", dist_errmsg(c));
    }
    dist_tensor_free(t);
  }
  dist_close(c);
  return NULL;
}

/* Two clients reshard one tensor at once. The daemons may take two
 * reshards in either order, so each reshard is applied by all of them or
 * refused by all ("being resharded by another request"): afterwards every
 * daemon holds the same layout and version, and the value is the one put. */
Test(concurrency, clients_resharding_one_tensor_agree_on_every_reshard, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  dist_client *c = harness_client(&cluster);
  double p0[8];
  for (int i = 0; i < 8; i++) p0[i] = 1.5 * i - 2;
  put_replicated(c, "w", p0, 8, "[0,1]");
  resharder r[2] = {{&cluster, 0, 0, 0, 0, ""}, {&cluster, 1, 0, 0, 0, ""}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, reshard_loop, &r[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(r[i].other, 0, "client %d: a reshard failed otherwise: %s", i, r[i].msg);
  cr_assert_gt(r[0].applied + r[1].applied, 0);
  dist_placement seen[2];
  for (int rank = 0; rank < 2; rank++)
    cr_assert(held_on_rank(&cluster, rank, "w", &seen[rank]), "rank %d lost 'w'", rank);
  cr_assert(seen[0].kind == seen[1].kind && seen[0].dim == seen[1].dim,
            "the daemons disagree on the layout after %d + %d reshards (%d + %d refused)",
            r[0].applied, r[1].applied, r[0].refused, r[1].refused);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &t), 0, "%s", dist_errmsg(c));
  dist_tensor_piece *pieces = NULL;
  int np = 0;
  cr_assert_eq(dist_tensor_pieces(c, t, &pieces, &np), 0, "%s", dist_errmsg(c));
  cr_assert_eq(pieces[0].version, pieces[1].version);
  free(pieces);
  expect_full_f64(c, t, p0, 8, "the racing reshards");
  dist_tensor_free(t);
  dist_close(c);
  stop_cluster();
}

/* How many daemons of the cluster hold "w". */
static int holders_of_w(harness *h) {
  int n = 0;
  for (int r = 0; r < h->n; r++) n += held_on_rank(h, r, "w", NULL);
  return n;
}

/* A tensor deleted while another client reshards it is gone from every
 * daemon: a reshard that read it before the delete reached one daemon
 * must not put its result back there (the delete waits for the reshard
 * on that daemon, and a reshard that finds it gone fails everywhere). */
Test(concurrency, a_tensor_deleted_mid_reshard_stays_deleted_everywhere, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  dist_client *c = harness_client(&cluster);
  double p0[64];
  for (int i = 0; i < 64; i++) p0[i] = i;
  int reshards = 0;
  for (int round = 0; round < 20; round++) {
    put_replicated(c, "w", p0, 64, "[0,1]");
    harness_churn ch;
    harness_churn_start(&ch, &cluster, "w");
    /* Once it reshards (slowly under ASan), the delete lands while it
     * runs its next reshard or between two. */
    harness_churn_wait_started(&ch, 10000);
    harness_sleep_ms(round % 7);
    int rc = dist_tensor_delete(c, "w");
    int applied = harness_churn_stop(&ch);
    reshards += applied;
    cr_assert_eq(rc, 0, "round %d: %s", round, dist_errmsg(c));
    cr_assert_eq(holders_of_w(&cluster), 0, "round %d: 'w' came back after its delete (%d "
                 "reshards applied)", round, applied);
  }
  cr_assert_gt(reshards, 0);
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ bad input */

/* Puts "keep" ([10, 2] float32, Shard(0) over [0,1,2,3]) and returns the
 * version each rank reports, to show later that nothing changed. */
static void put_keep(dist_client *c, float *ref) {
  for (int i = 0; i < 20; i++) ref[i] = (float)i;
  int64_t shape[2] = {10, 2};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  dist_placement p = DIST_SHARD_DIM(0);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, "keep", ref, DIST_FLOAT32, 2, shape, mesh, &p, &t), 0,
               "%s", dist_errmsg(c));
  dist_tensor_free(t);
  dist_mesh_free(mesh);
}

static void expect_keep_unchanged(harness *h, dist_client *c, const float *ref,
                                  const char *after) {
  expect_store(h, "keep", after);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "keep", &t), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_tensor_placements(t)[0].kind, DIST_SHARD, "after %s", after);
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s", dist_errmsg(c));
  expect_bytes(data, n, ref, 20 * sizeof(float), DIST_FLOAT32, after);
  free(data);
  dist_tensor_piece *pieces = NULL;
  int np = 0;
  cr_assert_eq(dist_tensor_pieces(c, t, &pieces, &np), 0, "%s", dist_errmsg(c));
  cr_assert_eq(np, 4);
  for (int i = 0; i < np; i++) cr_assert_eq(pieces[i].version, pieces[0].version);
  free(pieces);
  dist_tensor_free(t);
}

#define EXPECT_ERR(c, rc, code, needle, what)                                   \
  do {                                                                        \
    cr_assert_eq((rc), (code), "%s: got %s: %s", (what), dist_err_name(rc),   \
                 dist_errmsg(c));                                             \
    cr_assert(strstr(dist_errmsg(c), (needle)), "%s: message '%s' does not name '%s'", \
              (what), dist_errmsg(c), (needle));                              \
  } while (0)

Test(bad_input, each_is_a_clear_error_and_leaves_the_store_unchanged, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  float ref[20];
  put_keep(c, ref);
  int64_t shape[2] = {10, 2};
  dist_mesh *m4 = NULL, *m22 = NULL, *m7 = NULL;
  dist_mesh_from_string(M4, NULL, &m4);
  dist_mesh_from_string(M22, NULL, &m22);
  dist_mesh_from_string("[0,7]", NULL, &m7);
  dist_placement s2 = DIST_SHARD_DIM(2), s0 = DIST_SHARD_DIM(0);
  dist_placement two[2] = {DIST_SHARD_DIM(0), DIST_REPLICATED};
  dist_tensor *t = NULL;

  int rc = dist_shard_tensor(c, "x", ref, DIST_FLOAT32, 2, shape, m4, &s2, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "Shard(2)", "shard dim out of range");
  expect_keep_unchanged(&cluster, c, ref, "shard dim out of range");

  rc = dist_shard_tensor(c, "x", ref, DIST_FLOAT32, 2, shape, m7, two, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "rank 7", "mesh naming an unknown rank");
  expect_keep_unchanged(&cluster, c, ref, "mesh naming an unknown rank");

  /* The C API takes one placement per mesh dim by construction; a wrong
   * count is checked by the daemons (next test) and distctl (last test). */

  /* Shapes the client cannot cut into pieces: it crashed (a negative or
   * overflowing byte count, an unchecked malloc) before. */
  int64_t negative[2] = {10, -2}, huge[1] = {(int64_t)1 << 62}, big[1] = {(int64_t)1 << 44};
  rc = dist_shard_tensor(c, "x", ref, DIST_FLOAT32, 2, negative, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "dim 1 is negative (-2)", "a negative dim");
  rc = dist_shard_tensor(c, "x", ref, DIST_FLOAT32, 1, huge, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "too large", "a dim over 2^48");
  rc = dist_shard_tensor(c, "x", ref, DIST_FLOAT32, 1, big, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_ENOMEM, "no memory for rank 0's piece", "pieces beyond memory");
  int64_t ok_piece[2] = {5, 2}, bad_piece[2] = {-1, 2};
  const int64_t *some_bad[4] = {ok_piece, bad_piece, ok_piece, ok_piece};
  const void *four[4] = {ref, ref, ref, ref};
  rc = dist_dtensor_from_local(c, "x", four, DIST_FLOAT32, 2, some_bad, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "rank 1's piece: dim 0 is negative (-1)",
             "a piece of negative size");
  expect_keep_unchanged(&cluster, c, ref, "bad shapes");

  /* Names the store could not give back: one of 256 bytes was cut to 255
   * (two such names then meant one tensor, and neither could be opened);
   * "__metadata__" made every checkpoint save fail; bytes that are not
   * UTF-8 vanished from distctl's JSON. */
  char long_name[300];
  memset(long_name, 'k', 256);
  long_name[256] = 0;
  rc = dist_shard_tensor(c, long_name, ref, DIST_FLOAT32, 2, shape, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "has 256 bytes, at most 255", "a name of 256 bytes");
  rc = dist_shard_tensor(c, "__metadata__", ref, DIST_FLOAT32, 2, shape, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "reserved", "the name safetensors keeps");
  rc = dist_shard_tensor(c, "bad\xffname", ref, DIST_FLOAT32, 2, shape, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "not valid UTF-8", "a name that is not UTF-8");
  rc = dist_dtensor_from_local(c, "", four, DIST_FLOAT32, 2, some_bad, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EINVAL, "cannot be empty", "an empty name");
  long_name[255] = 0; /* the longest allowed, and UTF-8 of more than one byte */
  memcpy(long_name, "\xc3\xa9t\xc3\xa9", 6);
  cr_assert_eq(dist_shard_tensor(c, long_name, ref, DIST_FLOAT32, 2, shape, m4, &s0, &t), 0,
               "%s", dist_errmsg(c));
  dist_tensor_free(t);
  cr_assert_eq(dist_tensor_delete(c, long_name), 0, "%s", dist_errmsg(c));
  expect_keep_unchanged(&cluster, c, ref, "bad names");

  rc = dist_shard_tensor(c, "keep", ref, DIST_FLOAT32, 2, shape, m4, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EEXIST, "'keep'", "name that exists");
  expect_keep_unchanged(&cluster, c, ref, "put of a name that exists");

  /* A name held on daemons outside the new mesh only: before, the put
   * went through, and the name meant two tensors (an open and a listing
   * saw rank 0's, a delete removed it, and rank 3's came back). */
  dist_mesh *m3 = NULL, *m01 = NULL;
  dist_mesh_from_string("[3]", NULL, &m3);
  dist_mesh_from_string("[0,1]", NULL, &m01);
  dist_placement rep = DIST_REPLICATED;
  cr_assert_eq(dist_shard_tensor(c, "apart", ref, DIST_FLOAT32, 2, shape, m3, &rep, &t), 0,
               "%s", dist_errmsg(c));
  dist_tensor_free(t);
  rc = dist_shard_tensor(c, "apart", ref, DIST_FLOAT32, 2, shape, m01, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EEXIST, "'apart' already exists on rank 3 (mesh [3])",
             "put of a name held outside the mesh");
  int64_t half[2] = {5, 2};
  const int64_t *halves[2] = {half, half};
  const void *pieces[2] = {ref, ref + 10};
  rc = dist_dtensor_from_local(c, "apart", pieces, DIST_FLOAT32, 2, halves, m01, &s0, &t);
  EXPECT_ERR(c, rc, DIST_EEXIST, "rank 3", "from_local of a name held outside the mesh");
  for (int r = 0; r < 3; r++)
    cr_assert_eq(harness_open_on(&cluster, r, "apart", &t), DIST_ENOTFOUND,
                 "rank %d kept a piece of the refused put", r);
  cr_assert_eq(harness_open_on(&cluster, 3, "apart", &t), 0, "rank 3 lost 'apart'");
  cr_assert_eq(dist_mesh_size(dist_tensor_mesh(t)), 1);
  dist_tensor_free(t);
  cr_assert_eq(dist_tensor_delete(c, "apart"), 0, "%s", dist_errmsg(c));
  dist_mesh_free(m3);
  dist_mesh_free(m01);

  rc = dist_tensor_open(c, "nope", &t);
  EXPECT_ERR(c, rc, DIST_ENOTFOUND, "'nope'", "open of a name that does not exist");
  rc = dist_tensor_delete(c, "nope");
  EXPECT_ERR(c, rc, DIST_ENOTFOUND, "'nope'", "delete of a name that does not exist");

  /* Reshard of keep to a bad target: the tensor stays as it was. */
  cr_assert_eq(dist_tensor_open(c, "keep", &t), 0, "%s", dist_errmsg(c));
  rc = dist_reshard(c, t, NULL, &s2);
  EXPECT_ERR(c, rc, DIST_EINVAL, "Shard(2)", "reshard to a shard dim out of range");
  rc = dist_reshard(c, t, m22, two);
  EXPECT_ERR(c, rc, DIST_EINVAL, "mesh", "reshard to a mesh of another shape");
  rc = dist_reshard(c, t, m7, &s0);
  EXPECT_ERR(c, rc, DIST_EINVAL, "rank 7", "reshard to a mesh naming an unknown rank");
  dist_tensor_free(t);
  expect_keep_unchanged(&cluster, c, ref, "bad reshards");

  dist_mesh_free(m4);
  dist_mesh_free(m22);
  dist_mesh_free(m7);
  dist_close(c);
  stop_cluster();
}

/* Each daemon of [0,1] still holds "w" as put: Replicate (as that daemon
 * alone describes it), with p0. */
static void expect_w_as_put(harness *h, dist_client *c, const double *p0, int n,
                            const char *after) {
  for (int r = 0; r < 2; r++) {
    dist_tensor *t = NULL;
    cr_assert_eq(harness_open_on(h, r, "w", &t), 0, "rank %d lost 'w' after %s", r, after);
    cr_assert_eq(dist_tensor_placements(t)[0].kind, DIST_REPLICATE,
                 "rank %d changed 'w' to other placements after %s", r, after);
    void *piece = NULL;
    size_t nbytes = 0;
    int64_t shape[1];
    cr_assert_eq(dist_dtensor_to_local(c, t, r, &piece, &nbytes, shape), 0, "%s",
                 dist_errmsg(c));
    expect_bytes(piece, nbytes, p0, (size_t)n * sizeof *p0, DIST_FLOAT64, after);
    free(piece);
    dist_tensor_free(t);
  }
}

/* A reshard one daemon cannot afford, the others can (it has another
 * tensor of its own), is applied by none of them: a rank holding the new
 * layout while another holds the old would make every later read wrong.
 * Replicate -> Partial exchanges no data, so nothing else would stop the
 * ranks that could; Shard -> Replicate does, and the refusal reaches the
 * other daemon at once. */
/* Every daemon refuses a mesh of no dims; dist_mesh_new used to make one
 * (of one rank), so the mistake only showed at the first use. */
Test(bad_input, a_mesh_of_no_dims_is_refused_when_made) {
  int shape[1] = {2}, ranks[2] = {0, 1};
  dist_mesh *m = (dist_mesh *)&m;
  cr_expect_eq(dist_mesh_new(0, shape, ranks, NULL, &m), DIST_EINVAL);
  cr_expect_null(m);
  cr_expect(strstr(dist_last_mesh_error(), "0 dims") != NULL, "message: '%s'",
            dist_last_mesh_error());
  cr_expect_eq(dist_mesh_new(-1, shape, ranks, NULL, &m), DIST_EINVAL);
  cr_expect_null(m);
  /* The other constructors keep their reasons too. */
  cr_expect_eq(dist_mesh_from_string("[0,0]", NULL, &m), DIST_EINVAL);
  cr_expect(strstr(dist_last_mesh_error(), "rank 0 appears twice") != NULL,
            "message: '%s'", dist_last_mesh_error());
  cr_assert_eq(dist_mesh_new(1, shape, ranks, NULL, &m), 0);
  cr_expect_eq(dist_mesh_ndim(m), 1);
  cr_expect_eq(dist_mesh_size(m), 2);
  dist_mesh_free(m);
}

Test(bad_input, a_reshard_one_daemon_cannot_afford_is_applied_by_none, .timeout = 120, .fini = stop_cluster) {
  start_cluster_with(&cluster, 2, "--memory-limit=400");
  dist_client *c = harness_client(&cluster);
  double fill[25] = {0}, p0[16];
  for (int i = 0; i < 16; i++) p0[i] = i + 0.5;
  put_replicated(c, "fill", fill, 25, "[1]");
  put_replicated(c, "w", p0, 16, "[0,1]");
  dist_tensor *t = NULL;
  cr_assert_eq(dist_tensor_open(c, "w", &t), 0, "%s", dist_errmsg(c));
  dist_placement sum = DIST_PARTIAL_OF(DIST_REDUCE_SUM);
  int rc = dist_reshard(c, t, NULL, &sum);
  EXPECT_ERR(c, rc, DIST_ENOMEM, "rank 1", "a reshard over rank 1's memory limit");
  expect_w_as_put(&cluster, c, p0, 16, "a reshard over rank 1's memory limit");
  /* One that needs an exchange (Shard -> Replicate gathers): the daemon
   * that cannot afford it tells the other, which would otherwise wait for
   * its rows until the peer timeout (5 s here). */
  dist_placement s0 = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  cr_assert_eq(dist_tensor_delete(c, "fill"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &s0), 0, "%s", dist_errmsg(c));
  put_replicated(c, "fill", fill, 25, "[1]");
  double t0 = harness_now_s();
  rc = dist_reshard(c, t, NULL, &rep);
  double took = harness_now_s() - t0;
  EXPECT_ERR(c, rc, DIST_ENOMEM, "rank 1", "a gathering reshard over rank 1's memory limit");
  cr_assert_lt(took, 2.5, "the refusal took %.1f s", took);
  /* Reading the whole value gathers it too: rank 0 waited for rank 1's
   * rows until the peer timeout, and then named no cause. */
  void *whole = NULL;
  size_t nbytes = 0;
  t0 = harness_now_s();
  rc = dist_full_tensor(c, t, &whole, &nbytes);
  took = harness_now_s() - t0;
  EXPECT_ERR(c, rc, DIST_ENOMEM, "memory limit", "a full read over rank 1's memory limit");
  cr_assert_lt(took, 2.5, "the refusal took %.1f s", took);
  /* With room made, the same reshards are applied by both. */
  cr_assert_eq(dist_tensor_delete(c, "fill"), 0, "%s", dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  expect_w_as_put(&cluster, c, p0, 16, "a gathering reshard once room was made");
  cr_assert_eq(dist_reshard(c, t, NULL, &sum), 0, "%s", dist_errmsg(c));
  expect_full_f64(c, t, p0, 16, "the reshard once room was made");
  dist_tensor_free(t);
  dist_close(c);
  stop_cluster();
}

/* A TensorPut straight to every daemon of [0,1,2,3], bypassing libdist's
 * own checks, so the daemons' checks are what answers. */
static int raw_put(dist_client *c, const char *name, dist_dtype dt, const dist_shape *global,
                   const char *mesh_text, const char *placements, const void *data,
                   size_t len) {
  dist_mesh_desc mesh;
  dist_placement p[DIST_MAX_MESH_DIMS];
  int np = 0;
  cr_assert_eq(dist_mesh_parse(&mesh, mesh_text, NULL, NULL), 0);
  cr_assert_eq(dist_placements_parse(placements, p, DIST_MAX_MESH_DIMS, &np, NULL), 0);
  dist_wire_meta *w = calloc(1, sizeof *w);
  dist_meta_to_pb(name, dt, global, &mesh, p, w);
  dist_placements_to_pb(p, np, w); /* np may differ from the mesh's ndim */
  w->meta.n_placements = (size_t)np;
  Dist__V1__TensorPutRequest rq = DIST__V1__TENSOR_PUT_REQUEST__INIT;
  rq.meta = &w->meta;
  rq.data.data = (uint8_t *)data;
  rq.data.len = len;
  dist_call calls[4];
  memset(calls, 0, sizeof calls);
  for (int i = 0; i < 4; i++) calls[i].target = i, calls[i].request = &rq.base;
  int rc = dist_call_many(c, "/dist.v1.Dist/TensorPut", &dist__v1__tensor_put_reply__descriptor,
                          calls, 4);
  dist_calls_free(calls, 4);
  free(w);
  return rc;
}

Test(bad_input, the_daemons_check_what_libdist_would_have_refused, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  dist_client *c = harness_client(&cluster);
  float ref[20], piece[6] = {0};
  put_keep(c, ref);
  dist_shape global = {2, {10, 2}};
  int rc = raw_put(c, "x", DIST_FLOAT32, &global, M4, "Shard(3)", piece, 24);
  EXPECT_ERR(c, rc, DIST_EINVAL, "Shard(3)", "daemon: shard dim out of range");
  rc = raw_put(c, "x", DIST_FLOAT32, &global, "[0,1,2,9]", "Shard(0)", piece, 24);
  EXPECT_ERR(c, rc, DIST_EINVAL, "rank 9", "daemon: mesh naming an unknown rank");
  rc = raw_put(c, "x", DIST_FLOAT32, &global, M4, "Shard(0),Replicate()", piece, 24);
  EXPECT_ERR(c, rc, DIST_EINVAL, "placements", "daemon: placements count");
  /* 3x2 float32 rows are 24 bytes; 3x2 float64 would be 48: a dtype that
   * does not match the bytes sent. */
  rc = raw_put(c, "x", DIST_FLOAT64, &global, M4, "Shard(0)", piece, 24);
  EXPECT_ERR(c, rc, DIST_EMISMATCH, "float64", "daemon: bytes that do not fit the dtype");
  rc = raw_put(c, "keep", DIST_FLOAT32, &global, M4, "Shard(0)", piece, 24);
  cr_assert_neq(rc, 0, "a put over an existing name succeeded");
  rc = raw_put(c, "__metadata__", DIST_FLOAT32, &global, M4, "Shard(0)", piece, 24);
  EXPECT_ERR(c, rc, DIST_EINVAL, "reserved", "daemon: the name safetensors keeps");
  rc = raw_put(c, "\xc3(", DIST_FLOAT32, &global, M4, "Shard(0)", piece, 24);
  EXPECT_ERR(c, rc, DIST_EINVAL, "not valid UTF-8", "daemon: a name that is not UTF-8");
  expect_keep_unchanged(&cluster, c, ref, "raw puts the daemons refused");
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ a peer dies */

typedef struct looper {
  dist_client *c;
  int rank;
  int iterations;
  int rc;
  char msg[512];
  double failed_at;
} looper;

/* Reshards a large tensor back and forth until something fails. */
static void *reshard_until_failure(void *arg) {
  looper *lp = arg;
  dist_mesh *mesh = NULL;
  dist_mesh_from_string(M4, NULL, &mesh);
  /* 2048 x 2048 float32 = 16 MiB, each rank's piece 4 MiB. */
  int64_t rows = 512, shape[2] = {rows, 2048};
  size_t count = (size_t)(rows * 2048);
  float *piece = malloc(count * sizeof *piece);
  for (size_t i = 0; i < count; i++) piece[i] = (float)(i % 1000);
  const void *pp[1] = {piece};
  const int64_t *sp[1] = {shape};
  dist_placement a = DIST_SHARD_DIM(0), b = DIST_SHARD_DIM(1), r = DIST_REPLICATED;
  dist_tensor *t = NULL;
  lp->rc = dist_dtensor_from_local(lp->c, "big", pp, DIST_FLOAT32, 2, sp, mesh, &a, &t);
  /* S(0) -> S(1) all-to-all, -> R all-gather, -> S(0) local slice, ... */
  for (int i = 0; lp->rc == 0 && i < 100000; i++) {
    const dist_placement *to = i % 3 == 0 ? &b : i % 3 == 1 ? &r : &a;
    lp->rc = dist_reshard(lp->c, t, NULL, to);
    if (lp->rc == 0) __atomic_add_fetch(&lp->iterations, 1, __ATOMIC_SEQ_CST);
  }
  lp->failed_at = harness_now_s();
  snprintf(lp->msg, sizeof lp->msg, "%s", dist_errmsg(lp->c));
  dist_tensor_free(t);
  free(piece);
  dist_mesh_free(mesh);
  return NULL;
}

/* A client that dies after sending its shard_tensor to some daemons of
 * the mesh, modelled by sending rank 0's piece of a [0,1] tensor to rank 0
 * alone, leaves no piece behind: rank 0 waits for rank 1's verdict, which
 * never comes, and fails at the deadline, saying so (the daemon gives up
 * a little before its client). Before 0.2.3 rank 0 stored its
 * piece, and the name half-existed with nobody left to remove it. */
Test(failure, a_put_that_reaches_part_of_its_mesh_stores_nothing, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  dist_client *c0 = harness_client_rank(&cluster, 0, 1500);
  float whole[4] = {1, 2, 3, 4};
  dist_shape global = {1, {4}};
  dist_mesh_desc mesh;
  dist_placement s0 = DIST_SHARD_DIM(0);
  cr_assert_eq(dist_mesh_parse(&mesh, "[0,1]", NULL, NULL), 0);
  dist_wire_meta *w = calloc(1, sizeof *w);
  dist_meta_to_pb("half", DIST_FLOAT32, &global, &mesh, &s0, w);
  Dist__V1__TensorPutRequest rq = DIST__V1__TENSOR_PUT_REQUEST__INIT;
  rq.meta = &w->meta;
  rq.op_id = 4242;
  rq.data.data = (uint8_t *)whole; /* rank 0's piece: the first two */
  rq.data.len = 2 * sizeof *whole;
  ProtobufCMessage *reply = NULL;
  double t0 = harness_now_s();
  int rc = dist_call_one(c0, 0, "/dist.v1.Dist/TensorPut", &rq.base,
                         &dist__v1__tensor_put_reply__descriptor, &reply);
  double took = harness_now_s() - t0;
  if (reply) protobuf_c_message_free_unpacked(reply, NULL);
  free(w);
  cr_assert_neq(rc, 0, "a put that rank 1 never received was stored by rank 0");
  cr_assert(strstr(dist_errmsg(c0), "not applied") && strstr(dist_errmsg(c0), "rank 1"),
            "the error does not say what rank 0 waited for: %s", dist_errmsg(c0));
  cr_assert_lt(took, 10, "the put failed only after %.1f s", took);
  dist_tensor *t = NULL;
  cr_assert_eq(harness_open_on(&cluster, 0, "half", &t), DIST_ENOTFOUND,
               "rank 0 kept its piece of a put rank 1 never received");
  dist_close(c0);
  /* Nothing is left held either: the whole put goes through. */
  dist_client *c = harness_client(&cluster);
  t = harness_put(c, "half", DIST_FLOAT32, whole, 1, (int64_t[]){4}, "[0,1]", "Shard(0)");
  void *full = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_full_tensor(c, t, &full, &nbytes), 0, "%s", dist_errmsg(c));
  expect_bytes(full, nbytes, whole, sizeof whole, DIST_FLOAT32, "the put made again");
  free(full);
  dist_tensor_free(t);
  dist_close(c);
  stop_cluster();
}

Test(failure, a_peer_killed_mid_reshard_fails_every_survivor_naming_it, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  looper lp[4];
  pthread_t th[4];
  memset(lp, 0, sizeof lp);
  for (int r = 0; r < 4; r++) {
    lp[r].c = spmd_client(&cluster, r, "kill-test");
    lp[r].rank = r;
  }
  for (int r = 0; r < 4; r++) pthread_create(&th[r], NULL, reshard_until_failure, &lp[r]);
  /* Once every trainer has completed a reshard (a fixed 700 ms was not
   * always enough under ASan on a busy machine), kill rank 2 in the middle
   * of a later one. */
  int *counters[4] = {&lp[0].iterations, &lp[1].iterations, &lp[2].iterations,
                      &lp[3].iterations};
  cr_assert(harness_wait_all_positive(counters, 4, 60000),
            "not every trainer completed a reshard within 60 s");
  harness_sleep_ms(200);
  double killed_at = harness_now_s();
  harness_kill(&cluster, 2, SIGKILL);
  for (int r = 0; r < 4; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 4; r++) {
    cr_assert_neq(lp[r].rc, 0, "trainer %d never failed", r);
    if (r == 2) continue;
    cr_expect(lp[r].iterations > 0, "trainer %d failed before any reshard: %s", r, lp[r].msg);
    cr_expect(strstr(lp[r].msg, "rank 2"),
              "trainer %d (after %d reshards): '%s' does not name rank 2", r,
              lp[r].iterations, lp[r].msg);
    cr_expect(lp[r].failed_at - killed_at < 10.0, "trainer %d failed %.1f s after the kill",
              r, lp[r].failed_at - killed_at);
  }
  for (int r = 0; r < 4; r++) dist_close(lp[r].c);

  /* The survivors keep serving: Info, and a small tensor on [0,1,3]. */
  dist_client *c = harness_client(&cluster);
  for (int r = 0; r < 4; r++) {
    if (r == 2) continue;
    dist_daemon_info info;
    cr_assert_eq(dist_info(c, r, &info), 0, "rank %d: %s", r, dist_errmsg(c));
    dist_info_free(&info);
  }
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0,1,3]", NULL, &mesh);
  float small[7] = {1, 2, 3, 4, 5, 6, 7};
  int64_t shape[1] = {7};
  dist_placement p = DIST_SHARD_DIM(0), rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, "after", small, DIST_FLOAT32, 1, shape, mesh, &p, &t), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &rep), 0, "%s", dist_errmsg(c));
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s", dist_errmsg(c));
  expect_bytes(data, n, small, sizeof small, DIST_FLOAT32, "after the kill");
  free(data);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  dist_close(c);
  stop_cluster();
}

/* ------------------------------------------------------------ distctl */

static int distctl(harness *h, char **out, char **err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int distctl(harness *h, char **out, char **err, const char *fmt, ...) {
  char args[2048], cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s --cluster %s %s", harness_distctl(), h->cluster_file, args);
  return harness_run(cmd, out, err, 60);
}

static json_t *distctl_json(harness *h, const char *fmt, const char *name) {
  char args[512], *out = NULL, *err = NULL;
  snprintf(args, sizeof args, fmt, name);
  int rc = distctl(h, &out, &err, "%s", args);
  cr_assert_eq(rc, 0, "distctl %s: exit %d: %s", args, rc, err ? err : "");
  json_error_t je;
  json_t *j = json_loads(out ? out : "", 0, &je);
  cr_assert(j, "distctl %s printed invalid JSON (%s): %s", args, je.text, out);
  free(out);
  free(err);
  return j;
}

static void expect_pair(json_t *range, int64_t lo, int64_t hi, const char *what) {
  cr_assert_eq(json_integer_value(json_array_get(range, 0)), lo, "%s", what);
  cr_assert_eq(json_integer_value(json_array_get(range, 1)), hi, "%s", what);
}

Test(distctl, put_show_reshard_get_list_rm, .timeout = 180, .fini = stop_cluster) {
  start_cluster(&cluster, 4);
  char in[400], outp[400], piece[400];
  snprintf(in, sizeof in, "%s/in.npy", cluster.dir);
  snprintf(outp, sizeof outp, "%s/out.npy", cluster.dir);
  snprintf(piece, sizeof piece, "%s/piece.npy", cluster.dir);
  float ref[30];
  for (int i = 0; i < 30; i++) ref[i] = (float)i * 0.5f - 3;
  dist_shape shape = {2, {10, 3}};
  cr_assert_eq(dist_npy_write(in, DIST_FLOAT32, &shape, ref, NULL), 0);
  char *out = NULL, *err = NULL;
  int rc = distctl(&cluster, &out, &err, "tensor put w %s --mesh \"[[0,1],[2,3]]\" --dim-names dp,mp "
                   "--placements \"Shard(0),Replicate()\"", in);
  cr_assert_eq(rc, 0, "put: exit %d: %s", rc, err);
  free(out), free(err);

  json_t *j = distctl_json(&cluster, "tensor show %s --json", "w");
  cr_assert_str_eq(json_string_value(json_object_get(j, "dtype")), "float32");
  expect_pair(json_object_get(j, "shape"), 10, 3, "shape");
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(j, "placements"), 0)),
                   "Shard(0)");
  cr_assert_str_eq(json_string_value(json_array_get(
                       json_object_get(json_object_get(j, "mesh"), "dim_names"), 1)), "mp");
  json_t *pieces = json_object_get(j, "pieces");
  cr_assert_eq(json_array_size(pieces), 4);
  for (int i = 0; i < 4; i++) {
    json_t *pc = json_array_get(pieces, (size_t)i);
    int64_t lo = i < 2 ? 0 : 5;
    cr_assert_eq(json_integer_value(json_object_get(pc, "rank")), i);
    json_t *ranges = json_object_get(pc, "ranges");
    expect_pair(json_array_get(ranges, 0), lo, lo + 5, "rows");
    expect_pair(json_array_get(ranges, 1), 0, 3, "cols");
    cr_assert_eq(json_integer_value(json_object_get(pc, "bytes")), 5 * 3 * 4);
  }
  json_decref(j);

  rc = distctl(&cluster, &out, &err, "tensor reshard w --placements \"Replicate(),Shard(1)\"");
  cr_assert_eq(rc, 0, "reshard: exit %d: %s", rc, err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor get w -o %s", outp);
  cr_assert_eq(rc, 0, "get: exit %d: %s", rc, err);
  free(out), free(err);
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape got;
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_npy_read(outp, &dt, &got, &data, &n, NULL), 0);
  cr_assert_eq(dt, DIST_FLOAT32);
  cr_assert(dist_shape_equal(&got, &shape));
  expect_bytes(data, n, ref, sizeof ref, DIST_FLOAT32, "distctl get");
  free(data);

  /* Rank 1 is at mp = 1: columns 2:3 of 3 split 2,1. */
  rc = distctl(&cluster, &out, &err, "tensor get w --rank 1 --local -o %s", piece);
  cr_assert_eq(rc, 0, "get --local: exit %d: %s", rc, err);
  free(out), free(err);
  cr_assert_eq(dist_npy_read(piece, &dt, &got, &data, &n, NULL), 0);
  cr_assert(got.ndim == 2 && got.dims[0] == 10 && got.dims[1] == 1);
  for (int i = 0; i < 10; i++) cr_assert_eq(((float *)data)[i], ref[i * 3 + 2]);
  free(data);

  /* dtensor_from_local from one file per rank (rows 3,3,3,1). */
  char files[1600] = "";
  for (int r = 0; r < 4; r++) {
    char f[400];
    int64_t start, size;
    split_range(10, 4, r, &start, &size);
    snprintf(f, sizeof f, "%s/r%d.npy", cluster.dir, r);
    dist_shape ps = {2, {size, 3}};
    cr_assert_eq(dist_npy_write(f, DIST_FLOAT32, &ps, ref + start * 3, NULL), 0);
    strcat(files, r ? "," : "");
    strcat(files, f);
  }
  rc = distctl(&cluster, &out, &err, "tensor put v --local %s --mesh \"[0,1,2,3]\" "
               "--placements \"Shard(0)\"", files);
  cr_assert_eq(rc, 0, "put --local: exit %d: %s", rc, err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor get v -o %s", outp);
  cr_assert_eq(rc, 0, "get v: exit %d: %s", rc, err);
  free(out), free(err);
  cr_assert_eq(dist_npy_read(outp, &dt, &got, &data, &n, NULL), 0);
  expect_bytes(data, n, ref, sizeof ref, DIST_FLOAT32, "distctl put --local");
  free(data);

  j = distctl_json(&cluster, "%s --json", "tensors");
  cr_assert_eq(json_array_size(j), 2, "tensors: %zu entries", json_array_size(j));
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "name")), "v");
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 1), "name")), "w");
  cr_assert_eq(json_integer_value(json_object_get(json_array_get(j, 1), "bytes")), 4 * 30 * 2);
  json_decref(j);

  /* A bad --placements is a usage error that names the problem. */
  rc = distctl(&cluster, &out, &err, "tensor put x %s --mesh \"[0,1]\" --placements \"Shard(0),Bogus()\"",
               in);
  cr_assert_eq(rc, 2, "bad placements: exit %d", rc);
  cr_assert(err && strstr(err, "Bogus"), "stderr: %s", err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor put x %s --mesh \"[[0,1],[2,3]]\" --placements \"Shard(0)\"",
               in);
  cr_assert_eq(rc, 2, "placements count: exit %d", rc);
  cr_assert(err && strstr(err, "placements"), "stderr: %s", err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor put x %s --mesh \"[0,1]\" --placements \"Shard(5)\"", in);
  cr_assert_eq(rc, 2, "shard dim: exit %d", rc);
  cr_assert(err && strstr(err, "Shard(5)"), "stderr: %s", err);
  free(out), free(err);

  rc = distctl(&cluster, &out, &err, "tensor rm w");
  cr_assert_eq(rc, 0, "rm: exit %d: %s", rc, err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor get w -o %s", outp);
  cr_assert_eq(rc, 1, "get after rm: exit %d", rc);
  cr_assert(err && strstr(err, "not found"), "stderr: %s", err);
  free(out), free(err);
  j = distctl_json(&cluster, "%s --json", "tensors");
  cr_assert_eq(json_array_size(j), 1);
  json_decref(j);
  stop_cluster();
}

/* Per-rank values, one name on several one-rank meshes, are listed once
 * per rank with each rank's own shape and bytes, and removed together;
 * before, the listing showed the name once, as the first daemon to answer
 * held it, and a remove took rank 0's value only. */
Test(distctl, per_rank_values_are_listed_once_per_rank, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 3);
  dist_client *c = harness_client(&cluster);
  float one[1] = {1}, two[2] = {2, 3}, three[3] = {4, 5, 6};
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, two, 1, (int64_t[]){2}, "[2]", "Replicate()"));
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, one, 1, (int64_t[]){1}, "[0]", "Replicate()"));
  dist_tensor_free(harness_put(c, "w", DIST_FLOAT32, three, 1, (int64_t[]){3}, "[0,1,2]",
                               "Replicate()"));
  dist_close(c);
  json_t *j = distctl_json(&cluster, "%s --json", "tensors");
  cr_assert_eq(json_array_size(j), 3, "tensors: %zu entries", json_array_size(j));
  const char *names[3] = {"g", "g", "w"};
  int rank0[3] = {0, 2, 0}, len[3] = {1, 2, 3}, bytes[3] = {4, 8, 36};
  for (size_t i = 0; i < 3; i++) {
    json_t *e = json_array_get(j, i);
    cr_assert_str_eq(json_string_value(json_object_get(e, "name")), names[i], "entry %zu", i);
    json_t *ranks = json_object_get(json_object_get(e, "mesh"), "ranks");
    cr_assert_eq(json_integer_value(json_array_get(ranks, 0)), rank0[i], "entry %zu", i);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(e, "shape"), 0)), len[i],
                 "entry %zu", i);
    cr_assert_eq(json_integer_value(json_object_get(e, "bytes")), bytes[i], "entry %zu", i);
  }
  json_decref(j);
  /* Removing the name removes every rank's value (before, rank 0's only). */
  char *out = NULL, *err = NULL;
  int rc = distctl(&cluster, &out, &err, "tensor rm g");
  cr_assert_eq(rc, 0, "rm g: exit %d: %s", rc, err);
  free(out), free(err);
  j = distctl_json(&cluster, "%s --json", "tensors");
  cr_assert_eq(json_array_size(j), 1, "tensors after rm g: %zu entries", json_array_size(j));
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "name")), "w");
  json_decref(j);
  stop_cluster();
}

/* distctl ARGS must exit 2 with every needle in its stderr. */
static void expect_usage_error(harness *h, const char *args, const char *const *needles) {
  char *out = NULL, *err = NULL;
  int rc = distctl(h, &out, &err, "%s", args);
  cr_assert_eq(rc, 2, "distctl %s: exit %d: %s", args, rc, err);
  for (int i = 0; needles[i]; i++)
    cr_assert(err && strstr(err, needles[i]), "distctl %s: no '%s' in: %s", args,
              needles[i], err);
  free(out), free(err);
}

/* A verb with subcommands names the one missing or unknown and lists the
 * valid ones; before, both said "unknown command 'tensor'". */
Test(distctl, a_missing_or_unknown_subcommand_is_named_with_the_valid_ones, .timeout = 60,
     .fini = stop_cluster) {
  start_cluster(&cluster, 1);
  expect_usage_error(&cluster, "tensor foo",
                     (const char *[]){"unknown subcommand 'foo'", "put, get, show, reshard, rm",
                                      NULL});
  expect_usage_error(&cluster, "tensor", (const char *[]){"tensor: missing subcommand",
                                                          "put, get", NULL});
  expect_usage_error(&cluster, "checkpoint nope",
                     (const char *[]){"unknown subcommand 'nope'", "save, restore", NULL});
  expect_usage_error(&cluster, "cluster", (const char *[]){"missing subcommand", "up, down",
                                                           NULL});
  expect_usage_error(&cluster, "param", (const char *[]){"missing subcommand", "tune", NULL});
  expect_usage_error(&cluster, "bogus", (const char *[]){"unknown command 'bogus'", NULL});
  stop_cluster();
}

/* Writes a 3x4 float32 .npy (0, 1, ... 11) into the cluster's directory;
 * path holds 400 bytes. */
static void write_small_npy(harness *h, char *path) {
  float v[12];
  for (int i = 0; i < 12; i++) v[i] = (float)i;
  dist_shape s = {2, {3, 4}};
  snprintf(path, 400, "%s/small.npy", h->dir);
  cr_assert_eq(dist_npy_write(path, DIST_FLOAT32, &s, v, NULL), 0);
}

static void expect_placements(harness *h, const char *name, const char *want) {
  json_t *j = distctl_json(h, "tensor show %s --json", name);
  char *got = json_dumps(json_object_get(j, "placements"), JSON_COMPACT);
  cr_assert_str_eq(got, want, "%s", name);
  free(got);
  json_decref(j);
}

/* Without --mesh, reshard checked no placement count against the tensor's
 * mesh: too few went to dist_reshard with uninitialised placements, '' was
 * taken, extras were dropped. And placements that cannot fit the tensor
 * are a usage error (2) as for put, not a failed operation (1). */
Test(distctl, reshard_placements_must_fit_the_tensor_and_its_mesh, .timeout = 120,
     .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  char in[400], *out = NULL, *err = NULL;
  write_small_npy(&cluster, in);
  int rc = distctl(&cluster, &out, &err, "tensor put m %s --mesh \"[[0,1]]\" "
                   "--placements \"Replicate(),Shard(1)\"", in);
  cr_assert_eq(rc, 0, "put: exit %d: %s", rc, err);
  free(out), free(err);
  const char *const too_few[] = {"gives 1 placement,", "the tensor's mesh has 2 dims", NULL};
  expect_usage_error(&cluster, "tensor reshard m --placements \"Shard(0)\"", too_few);
  const char *const none[] = {"gives 0 placements", "the tensor's mesh has 2 dims", NULL};
  expect_usage_error(&cluster, "tensor reshard m --placements \"\"", none);
  const char *const too_many[] = {"gives 4 placements", "the tensor's mesh has 2 dims", NULL};
  expect_usage_error(&cluster, "tensor reshard m --placements "
                     "\"Shard(1),Replicate(),Partial(sum),Shard(0)\"", too_many);
  const char *const shard9[] = {"Shard(9)", "2 dims", NULL};
  expect_usage_error(&cluster, "tensor reshard m --placements \"Shard(9),Replicate()\"", shard9);
  expect_usage_error(&cluster, "tensor reshard m --mesh \"[[1,0]]\" --placements "
                     "\"Replicate(),Shard(9)\"", shard9);
  expect_placements(&cluster, "m", "[\"Replicate()\",\"Shard(1)\"]");
  rc = distctl(&cluster, &out, &err, "tensor reshard m --placements \"Shard(0),Replicate()\"");
  cr_assert_eq(rc, 0, "good reshard: exit %d: %s", rc, err);
  free(out), free(err);
  expect_placements(&cluster, "m", "[\"Shard(0)\",\"Replicate()\"]");
  stop_cluster();
}

/* The float32 .npy at path must hold exactly want. */
static void expect_npy_f32(const char *path, const float *want, size_t nbytes,
                           const char *what) {
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape got;
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_npy_read(path, &dt, &got, &data, &n, NULL), 0, "%s", what);
  cr_assert_eq(dt, DIST_FLOAT32, "%s", what);
  expect_bytes(data, n, want, nbytes, DIST_FLOAT32, what);
  free(data);
}

/* A rank outside the tensor's mesh has no piece to give: that used to read
 * "tensor 't' not found", as if there were no t at all. A per-rank value
 * (its own one-rank mesh on each daemon) is still read from the rank
 * asked. */
Test(distctl, get_local_from_a_rank_outside_the_mesh_says_it_holds_no_piece, .timeout = 120,
     .fini = stop_cluster) {
  start_cluster(&cluster, 3);
  char in[400], piece[400], *out = NULL, *err = NULL;
  write_small_npy(&cluster, in);
  snprintf(piece, sizeof piece, "%s/piece.npy", cluster.dir);
  int rc = distctl(&cluster, &out, &err, "tensor put t %s --mesh \"[0,1]\" "
                   "--placements \"Shard(0)\"", in);
  cr_assert_eq(rc, 0, "put: exit %d: %s", rc, err);
  free(out), free(err);
  rc = distctl(&cluster, &out, &err, "tensor get t --rank 2 --local -o %s", piece);
  cr_assert_eq(rc, 1, "get --rank 2: exit %d: %s", rc, err);
  cr_assert(err && strstr(err, "rank 2 holds no piece of 't' (its mesh is [0, 1])"), "%s", err);
  free(out), free(err);
  dist_client *c = harness_client(&cluster);
  float two[2] = {2, 3}, one[1] = {1};
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, one, 1, (int64_t[]){1}, "[0]", "Replicate()"));
  dist_tensor_free(harness_put(c, "g", DIST_FLOAT32, two, 1, (int64_t[]){2}, "[2]", "Replicate()"));
  dist_close(c);
  rc = distctl(&cluster, &out, &err, "tensor get g --rank 2 --local -o %s", piece);
  cr_assert_eq(rc, 0, "get g --rank 2: exit %d: %s", rc, err);
  free(out), free(err);
  expect_npy_f32(piece, two, sizeof two, "rank 2's own g");
  stop_cluster();
}

/* A handle's version follows its own reshards: each stores the tensor one
 * version past the last on every daemon (svc_reshard's vote), and the
 * handle reads it from the reply, as a fresh open does. */
Test(reshard, a_handles_version_follows_its_reshards, .timeout = 120, .fini = stop_cluster) {
  start_cluster(&cluster, 2);
  dist_client *c = harness_client(&cluster);
  float v[4] = {1, 2, 3, 4};
  dist_tensor *t = harness_put(c, "versioned", DIST_FLOAT32, v, 1, (int64_t[]){4}, "[0,1]",
                               "Shard(0)");
  cr_assert_eq(dist_tensor_version(t), 1, "a put stores version 1");
  const char *const to[] = {"Replicate()", "Shard(0)"};
  for (int i = 0; i < 2; i++) {
    dist_placement p[1];
    cr_assert_eq(dist_parse_placements(to[i], p, 1), 1);
    cr_assert_eq(dist_reshard(c, t, NULL, p), 0, "reshard to %s: %s", to[i], dist_errmsg(c));
    dist_tensor *fresh = NULL;
    cr_assert_eq(dist_tensor_open(c, "versioned", &fresh), 0, "%s", dist_errmsg(c));
    cr_expect_eq(dist_tensor_version(fresh), (uint64_t)i + 2, "open after reshard %d", i + 1);
    cr_expect_eq(dist_tensor_version(t), (uint64_t)i + 2, "the handle after reshard %d", i + 1);
    dist_tensor_free(fresh);
  }
  dist_tensor_free(t);
  dist_close(c);
}
