/* distctl tensor put|get|show|reshard|rm and distctl tensors: distributed
 * tensors from the command line, exchanged as .npy files.
 *
 * Exit status: 2 for a bad command line (including a mesh or placements
 * that cannot fit the tensor), 1 when reading a file or the operation in
 * the cluster failed. */
#include <stdlib.h>
#include <string.h>

#include "distctl.h"
#include "mesh.h"
#include "tensor.h"

enum { BIG_TRANSFER = 64 << 20 }; /* report progress above this */

/* A tensor verb's options, by where they sit in its table. */
enum { OPT_MESH, OPT_DIM_NAMES, OPT_PLACEMENTS, OPT_LOCAL, OPT_DTYPE, NLAYOUT_OPTIONS };
enum { OPT_OUTPUT, OPT_RANK, OPT_LOCAL_PIECE, NGET_OPTIONS };

/* The layout options of a put or reshard, parsed (distctl_parse_layout). */
static int parse_layout(const distctl_command *cmd, const distctl_args *a,
                        dist_mesh **mesh, dist_placement *p, int *np) {
  distctl_layout_text text = {a->value[OPT_MESH], a->value[OPT_DIM_NAMES],
                              a->value[OPT_PLACEMENTS]};
  return distctl_parse_layout(cmd, &text, mesh, p, np);
}

/* The dtype the user asked for with --dtype (bfloat16 is stored as '<u2'
 * in .npy), or DIST_DTYPE_INVALID to take the file's. */
static int parse_dtype(const distctl_command *cmd, const char *text,
                       dist_dtype *dt) {
  *dt = DIST_DTYPE_INVALID;
  if (!text) return 0;
  *dt = dist_dtype_parse(text);
  if (*dt == DIST_DTYPE_INVALID)
    return distctl_usage(cmd, "unknown --dtype '%s' (bool, int8, uint8, int32, "
                         "int64, float16, bfloat16, float32, float64)", text);
  return 0;
}

/* Reads a .npy; with a wanted dtype the file must hold it. */
static int read_npy(const char *path, dist_dtype want, dist_dtype *dt,
                    dist_shape *shape, void **data, size_t *nbytes) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  *dt = want == DIST_BFLOAT16 ? DIST_BFLOAT16 : DIST_DTYPE_INVALID;
  if (dist_npy_read(path, dt, shape, data, nbytes, &eb) != 0)
    return distctl_fail("cannot read %s", dist_errbuf_msg(&eb)); /* names path */
  if (want != DIST_DTYPE_INVALID && *dt != want) {
    free(*data);
    *data = NULL;
    return distctl_fail("%s holds %s, not the --dtype %s", path,
                        dist_dtype_name(*dt), dist_dtype_name(want));
  }
  if (*nbytes > BIG_TRANSFER)
    fprintf(stderr, "distctl: read %s (%zu MiB)\n", path, *nbytes >> 20);
  return 0;
}

/* The description `tensor show --json` prints, without the pieces. */
static json_t *json_tensor(const dist_tensor *t);

/* With --json, what a command that changed tensor `name` left behind, as
 * the daemons now describe it (scripts read it rather than a silence).
 * Returns rc. */
static int print_changed(const distctl_global *g, dist_client *c, const char *name, int rc) {
  if (rc != 0 || !g->json) return rc;
  dist_tensor *t = NULL;
  if (dist_tensor_open(c, name, &t) != 0) return distctl_fail("%s: %s", name, dist_errmsg(c));
  distctl_print_json(json_tensor(t));
  dist_tensor_free(t);
  return 0;
}

/* ---------------------------------------------------------------- put */

/* shard_tensor: the whole tensor from one file. */
static int put_whole(dist_client *c, const distctl_args *a, dist_dtype want) {
  const distctl_command *cmd = &distctl_cmd_tensor_put;
  dist_dtype dt;
  dist_shape shape;
  void *data = NULL;
  size_t nbytes = 0;
  dist_mesh *mesh = NULL;
  dist_tensor *t = NULL;
  dist_placement p[DIST_MAX_MESH_DIMS];
  int np;
  int rc = parse_layout(cmd, a, &mesh, p, &np);
  if (rc == 0) rc = read_npy(a->word[1], want, &dt, &shape, &data, &nbytes);
  if (rc == 0) rc = distctl_check_shard_dims(cmd, p, np, shape.ndim, "the tensor");
  if (rc != 0) goto out;
  if (dist_shard_tensor(c, a->word[0], data, dt, shape.ndim, shape.dims, mesh, p, &t) != 0)
    rc = distctl_fail("tensor put %s: %s", a->word[0], dist_errmsg(c));
out:
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  free(data);
  return rc;
}

/* Splits "a.npy,b.npy" in place; returns the count. */
static int split_files(char *list, char **files, int max) {
  int n = 0;
  for (char *save = NULL, *f = strtok_r(list, ",", &save); f;
       f = strtok_r(NULL, ",", &save))
    if (n < max + 1) files[n++] = f;
  return n;
}

/* The pieces of dtensor_from_local, one file per mesh rank in mesh order;
 * they must agree on dtype and rank. */
typedef struct local_pieces {
  int n;
  void *data[DIST_MAX_MESH_RANKS];
  int64_t shape[DIST_MAX_MESH_RANKS][DIST_MAX_DIMS];
  const int64_t *shapes[DIST_MAX_MESH_RANKS];
  dist_dtype dt;
  int ndim;
} local_pieces;

static int read_pieces(char **files, int n, dist_dtype want, local_pieces *lp) {
  lp->n = 0;
  for (int i = 0; i < n; i++) {
    dist_dtype dt;
    dist_shape s;
    size_t nbytes;
    if (read_npy(files[i], want, &dt, &s, &lp->data[i], &nbytes) != 0) return 1;
    lp->n = i + 1;
    if (i == 0) lp->dt = dt, lp->ndim = s.ndim;
    if (dt != lp->dt)
      return distctl_fail("%s holds %s, but %s holds %s: pieces must share a dtype",
                          files[i], dist_dtype_name(dt), files[0], dist_dtype_name(lp->dt));
    if (s.ndim != lp->ndim)
      return distctl_fail("%s has %d dims, but %s has %d: pieces must share a rank",
                          files[i], s.ndim, files[0], lp->ndim);
    memcpy(lp->shape[i], s.dims, sizeof s.dims);
    lp->shapes[i] = lp->shape[i];
  }
  return 0;
}

/* dtensor_from_local: one file per rank of the mesh. */
static int put_local(dist_client *c, const distctl_args *a, dist_dtype want) {
  const distctl_command *cmd = &distctl_cmd_tensor_put;
  dist_mesh *mesh = NULL;
  dist_tensor *t = NULL;
  dist_placement p[DIST_MAX_MESH_DIMS];
  local_pieces *lp = calloc(1, sizeof *lp);
  char *list = strdup(a->value[OPT_LOCAL]);
  char **files = calloc(DIST_MAX_MESH_RANKS + 2, sizeof *files);
  int np;
  int rc = parse_layout(cmd, a, &mesh, p, &np);
  if (rc != 0) goto out;
  int n = split_files(list, files, DIST_MAX_MESH_RANKS);
  if (n != dist_mesh_size(mesh)) {
    rc = distctl_usage(cmd, "--local names %d file%s, but the mesh has %d rank%s "
                       "(one file per rank, in mesh order)", n, n == 1 ? "" : "s",
                       dist_mesh_size(mesh), dist_mesh_size(mesh) == 1 ? "" : "s");
    goto out;
  }
  rc = read_pieces(files, n, want, lp);
  if (rc == 0) rc = distctl_check_shard_dims(cmd, p, np, lp->ndim, "the tensor");
  if (rc != 0) goto out;
  if (dist_dtensor_from_local(c, a->word[0], (const void *const *)lp->data, lp->dt,
                              lp->ndim, lp->shapes, mesh, p, &t) != 0)
    rc = distctl_fail("tensor put %s: %s", a->word[0], dist_errmsg(c));
out:
  for (int i = 0; i < lp->n; i++) free(lp->data[i]);
  free(lp);
  free(files);
  free(list);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return rc;
}

static const distctl_option put_options[NLAYOUT_OPTIONS + 1] = {
    [OPT_MESH] = {"--mesh", "MESH", "the ranks to store it on, as a nested list: \"[0,1]\", "
                  "\"[[0,1],[2,3]]\"", NULL, DISTCTL_REQUIRED},
    [OPT_DIM_NAMES] = DISTCTL_DIM_NAMES_OPTION,
    [OPT_PLACEMENTS] = {"--placements", "P", "one placement per mesh dim: Shard(D), "
                        "Replicate() or Partial(REDUCE), comma-separated", NULL, DISTCTL_REQUIRED},
    [OPT_LOCAL] = {"--local", "R0.npy,R1.npy,...", "each mesh rank's own piece, one file per rank in mesh order (dtensor_from_local)", NULL,
                   DISTCTL_OPTIONAL},
    [OPT_DTYPE] = {"--dtype", "DTYPE", "the dtype the files must hold (bool, int8, uint8, "
                   "int32, int64, float16, bfloat16, float32, float64); bfloat16 reads "
                   "uint16 ('<u2') files as bfloat16", NULL, DISTCTL_OPTIONAL},
};

static const distctl_relation put_relations[] = {
    {"--local", DISTCTL_INSTEAD_OF, "FILE.npy"},
    DISTCTL_DIM_NAMES_NEEDS_MESH,
    {NULL, 0, NULL},
};

static int run_put(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_tensor_put;
  distctl_args a;
  dist_dtype want;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  if (parse_dtype(cmd, a.value[OPT_DTYPE], &want) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  /* FILE.npy or --local, one of them (put_relations) */
  int rc = a.value[OPT_LOCAL] ? put_local(c, &a, want) : put_whole(c, &a, want);
  rc = print_changed(g, c, a.word[0], rc);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_tensor_put = {
    .name = "tensor put",
    .words = {{"NAME", DISTCTL_REQUIRED}, {"FILE.npy", DISTCTL_OPTIONAL}},
    .help = "store a tensor: shard_tensor from one file, or dtensor_from_local from "
    "one file per mesh rank",
    .run = run_put,
    .options = put_options,
    .relations = put_relations};

/* ---------------------------------------------------------------- get */

static int write_npy(const char *path, dist_dtype dt, int ndim,
                     const int64_t *dims, const void *data) {
  dist_shape s = {ndim, {0}};
  memcpy(s.dims, dims, sizeof *dims * (size_t)ndim);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_npy_write(path, dt, &s, data, &eb) != 0)
    return distctl_fail("cannot write %s", dist_errbuf_msg(&eb)); /* names path */
  return 0;
}

static int mesh_has_rank(const dist_mesh *m, int rank) {
  for (int i = 0; i < dist_mesh_size(m); i++)
    if (dist_mesh_rank_at(m, i) == rank) return 1;
  return 0;
}

/* Reading rank's piece failed with code: a rank outside the tensor's mesh
 * answers "not found", which reads as if the tensor did not exist; say
 * that rank holds no piece instead. (A per-rank value is asked of the rank
 * whatever mesh the handle shows, so only a failed read gets here.) */
static int local_read_failed(dist_client *c, const dist_tensor *t, int rank, int code) {
  const dist_mesh *m = dist_tensor_mesh(t);
  if (code != DIST_ENOTFOUND || mesh_has_rank(m, rank))
    return distctl_fail("tensor get %s: %s", dist_tensor_name(t), dist_errmsg(c));
  char mesh[512];
  dist_mesh_to_string(m, mesh, sizeof mesh);
  return distctl_fail("tensor get: rank %d holds no piece of '%s' (its mesh is %s)", rank,
                      dist_tensor_name(t), mesh);
}

/* A piece is read by its daemon's rank: through --endpoint, the rank of
 * the daemon reached, not its position 0 (libdist refuses a rank the
 * client does not reach, naming the one it does). */
static int piece_rank_reached(const distctl_command *cmd, dist_client *c, long rank) {
  if (rank >= 0 && dist_world_size(c) == 1 && dist_daemon_rank(c, 0) == rank) return 0;
  return distctl_rank_in_cluster(cmd, c, rank);
}

static int get_value(dist_client *c, const char *name, const char *output, int rank) {
  dist_tensor *t = NULL;
  void *data = NULL;
  size_t nbytes = 0;
  int64_t shape[DIST_MAX_DIMS];
  int rc = 0;
  if (dist_tensor_open(c, name, &t) != 0) {
    rc = distctl_fail("tensor get %s: %s", name, dist_errmsg(c));
    goto out;
  }
  int ndim = dist_tensor_ndim(t), code;
  if (rank >= 0 && (code = dist_dtensor_to_local(c, t, rank, &data, &nbytes, shape)) != 0) {
    rc = local_read_failed(c, t, rank, code);
    goto out;
  }
  if (rank < 0 && dist_full_tensor(c, t, &data, &nbytes) != 0) {
    rc = distctl_fail("tensor get %s: %s", name, dist_errmsg(c));
    goto out;
  }
  if (rank < 0) memcpy(shape, dist_tensor_shape(t), sizeof *shape * (size_t)ndim);
  if (nbytes > BIG_TRANSFER)
    fprintf(stderr, "distctl: writing %s (%zu MiB)\n", output, nbytes >> 20);
  rc = write_npy(output, dist_tensor_dtype(t), ndim, shape, data);
out:
  free(data);
  dist_tensor_free(t);
  return rc;
}

static const distctl_option get_options[NGET_OPTIONS + 1] = {
    [OPT_OUTPUT] = {"-o", "OUT.npy", "the .npy file to write", "--output", DISTCTL_REQUIRED},
    [OPT_RANK] = {"--rank", "R", "the rank whose piece to read", NULL, DISTCTL_OPTIONAL},
    [OPT_LOCAL_PIECE] = {"--local", NULL, "write rank R's local piece (dtensor_to_local), not "
                         "the logical value", NULL, DISTCTL_OPTIONAL},
};
static const distctl_relation get_relations[] = {
    {"--rank", DISTCTL_NEEDS, "--local"},
    {"--local", DISTCTL_NEEDS, "--rank"},
    {NULL, 0, NULL},
};

/* The rank whose piece to read (--rank, given with --local: get_relations),
 * or -1 (the logical value). 0, or 2 after a usage error. */
static int piece_rank(const distctl_command *cmd, const distctl_args *a, long *rank) {
  const char *text = a->value[OPT_RANK];
  *rank = -1;
  if (text && distctl_number_opt(cmd, "--rank", text, 0, DIST_MAX_MESH_RANKS - 1, rank) != 0)
    return 2;
  return 0;
}

static int run_get(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_tensor_get;
  distctl_args a;
  long rank;
  if (distctl_take_options(cmd, argc, argv, &a) != 0 || piece_rank(cmd, &a, &rank) != 0) return 2;
  const char *name = a.word[0], *output = a.value[OPT_OUTPUT];
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int rc = piece_rank_reached(cmd, c, rank);
  if (rc == 0) rc = get_value(c, name, output, (int)rank);
  if (rc == 0 && g->json) /* what was written where, for scripts */
    distctl_print_json(json_pack("{s:s, s:s, s:o}", "name", name, "output", output,
                                 "rank", rank >= 0 ? json_integer(rank) : json_null()));
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_tensor_get = {
    .name = "tensor get",
    .words = {{"NAME", DISTCTL_REQUIRED}},
    .help = "write a tensor's logical value (or rank R's local piece) to a .npy file",
    .run = run_get,
    .options = get_options,
    .relations = get_relations};

/* ---------------------------------------------------------------- reshard */

/* The placements must fit the tensor: one per dim of its mesh (the one
 * given, else its own) and Shard(d) of its dims, checked here so that a
 * misfit is a usage error as for put. */
static int check_reshard_fits(const dist_tensor *t, const dist_mesh *mesh,
                              const dist_placement *p, int np) {
  const distctl_command *cmd = &distctl_cmd_tensor_reshard;
  if (!mesh &&
      distctl_check_count(cmd, np, dist_mesh_ndim(dist_tensor_mesh(t)), "the tensor's mesh"))
    return 2;
  return distctl_check_shard_dims(cmd, p, np, dist_tensor_ndim(t), "the tensor");
}

/* put's first three options, described for a reshard. */
static const distctl_option reshard_options[OPT_PLACEMENTS + 2] = {
    [OPT_MESH] = {"--mesh", "MESH", "another mesh of the same shape to move it to, as a "
                  "nested list (default: its own)", NULL, DISTCTL_OPTIONAL},
    [OPT_DIM_NAMES] = DISTCTL_DIM_NAMES_OPTION,
    [OPT_PLACEMENTS] = {"--placements", "P", "the new placements, one per mesh dim: "
                        "Shard(D), Replicate() or Partial(REDUCE)", NULL, DISTCTL_REQUIRED},
};
static const distctl_relation reshard_relations[] = {DISTCTL_DIM_NAMES_NEEDS_MESH,
                                                     {NULL, 0, NULL}};

static int run_reshard(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_tensor_reshard;
  distctl_args a;
  dist_mesh *mesh = NULL;
  dist_tensor *t = NULL;
  dist_placement p[DIST_MAX_MESH_DIMS];
  int np;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  int rc = parse_layout(cmd, &a, &mesh, p, &np);
  if (rc != 0) return rc;
  const char *name = a.word[0];
  dist_client *c = distctl_connect(g);
  if (!c) {
    rc = 1;
    goto out;
  }
  if (dist_tensor_open(c, name, &t) != 0)
    rc = distctl_fail("tensor reshard %s: %s", name, dist_errmsg(c));
  else if ((rc = check_reshard_fits(t, mesh, p, np)) == 0 && dist_reshard(c, t, mesh, p) != 0)
    rc = distctl_fail("tensor reshard %s: %s", name, dist_errmsg(c));
  rc = print_changed(g, c, name, rc);
  dist_close(c);
out:
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return rc;
}

const distctl_command distctl_cmd_tensor_reshard = {
    .name = "tensor reshard",
    .words = {{"NAME", DISTCTL_REQUIRED}},
    .help = "convert a tensor to other placements (and another mesh of the same shape)",
    .run = run_reshard,
    .options = reshard_options,
    .relations = reshard_relations};

/* ---------------------------------------------------------------- rm */

static int run_rm(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_tensor_rm;
  distctl_args a;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int rc = 0;
  if (dist_tensor_delete(c, a.word[0]) != 0)
    rc = distctl_fail("tensor rm %s: %s", a.word[0], dist_errmsg(c));
  else if (g->json)
    distctl_print_json(json_pack("{s:s, s:b}", "name", a.word[0], "deleted", 1));
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_tensor_rm = {
    .name = "tensor rm",
    .words = {{"NAME", DISTCTL_REQUIRED}},
    .help = "delete a tensor on every daemon of its mesh",
    .run = run_rm,
    .options = distctl_no_options};
/* ---------------------------------------------------------------- show */

static json_t *json_dims(const int64_t *dims, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(dims[i]));
  return a;
}

static json_t *json_mesh(const dist_mesh *m) {
  json_t *shape = json_array(), *ranks = json_array(), *names = json_array();
  for (int i = 0; i < dist_mesh_ndim(m); i++) {
    json_array_append_new(shape, json_integer(dist_mesh_dim_size(m, i)));
    json_array_append_new(names, json_string(dist_mesh_dim_name(m, i)));
  }
  for (int i = 0; i < dist_mesh_size(m); i++)
    json_array_append_new(ranks, json_integer(dist_mesh_rank_at(m, i)));
  return json_pack("{s:o, s:o, s:o}", "shape", shape, "ranks", ranks, "dim_names", names);
}

/* One placement as distctl accepts it: "Shard(0)". */
static void placement_text(const dist_placement *p, char *buf, size_t len) {
  char tmp[64];
  dist_placements_format(p, 1, tmp, sizeof tmp);
  size_t n = strlen(tmp);
  snprintf(buf, len, "%.*s", n >= 2 ? (int)n - 2 : 0, tmp + 1);
}

static json_t *json_placements(const dist_tensor *t) {
  json_t *a = json_array();
  const dist_placement *p = dist_tensor_placements(t);
  for (int i = 0; i < dist_mesh_ndim(dist_tensor_mesh(t)); i++) {
    char buf[64];
    placement_text(&p[i], buf, sizeof buf);
    json_array_append_new(a, json_string(buf));
  }
  return a;
}

static json_t *json_tensor(const dist_tensor *t) {
  return json_pack("{s:s, s:s, s:o, s:o, s:o}", "name", dist_tensor_name(t),
                   "dtype", dist_dtype_name(dist_tensor_dtype(t)), "shape",
                   json_dims(dist_tensor_shape(t), dist_tensor_ndim(t)), "mesh",
                   json_mesh(dist_tensor_mesh(t)), "placements", json_placements(t));
}

/* "[0:3, 0:4]": the index ranges of a piece (empty ranges show as 3:3). */
static void ranges_text(const dist_tensor_piece *p, char *buf, size_t len) {
  size_t pos = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < p->ndim && pos < len; d++)
    pos += (size_t)snprintf(buf + pos, len - pos, "%s%lld:%lld", d ? ", " : "",
                            (long long)p->offset[d],
                            (long long)(p->offset[d] + p->shape[d]));
  if (pos < len) snprintf(buf + pos, len - pos, "]");
}

static json_t *json_pieces(const dist_tensor_piece *p, int n, uint64_t *total) {
  json_t *a = json_array();
  *total = 0;
  for (int i = 0; i < n; i++) {
    json_t *ranges = json_array();
    for (int d = 0; d < p[i].ndim; d++)
      json_array_append_new(ranges, json_pack("[I, I]", (json_int_t)p[i].offset[d],
                                              (json_int_t)(p[i].offset[d] + p[i].shape[d])));
    json_array_append_new(
        a, json_pack("{s:i, s:o, s:o, s:o, s:I, s:I}", "rank", p[i].rank, "shape",
                     json_dims(p[i].shape, p[i].ndim), "offset",
                     json_dims(p[i].offset, p[i].ndim), "ranges", ranges, "bytes",
                     (json_int_t)p[i].nbytes, "version", (json_int_t)p[i].version));
    *total += p[i].nbytes;
  }
  return a;
}

static void print_show(const dist_tensor *t, const dist_tensor_piece *p, int n) {
  char shape[160], mesh[512], pl[256];
  dist_shape s = {dist_tensor_ndim(t), {0}};
  memcpy(s.dims, dist_tensor_shape(t), sizeof(int64_t) * (size_t)s.ndim);
  dist_shape_format(&s, shape, sizeof shape);
  dist_mesh_to_string(dist_tensor_mesh(t), mesh, sizeof mesh);
  dist_placements_format(dist_tensor_placements(t), dist_mesh_ndim(dist_tensor_mesh(t)),
                         pl, sizeof pl);
  const dist_mesh *m = dist_tensor_mesh(t);
  printf("name:       %s\ndtype:      %s\nshape:      %s\nmesh:       %s (",
         dist_tensor_name(t), dist_dtype_name(dist_tensor_dtype(t)), shape, mesh);
  for (int i = 0; i < dist_mesh_ndim(m); i++)
    printf("%s%s", i ? ", " : "", dist_mesh_dim_name(m, i));
  printf(")\nplacements: %s\n\n%-6s %-32s %s\n", pl, "RANK", "INDEX RANGES", "BYTES");
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    char ranges[256], bytes[32];
    ranges_text(&p[i], ranges, sizeof ranges);
    dist_format_bytes(p[i].nbytes, bytes, sizeof bytes);
    printf("%-6d %-32s %s\n", p[i].rank, ranges, bytes);
    total += p[i].nbytes;
  }
  char tb[32];
  dist_format_bytes(total, tb, sizeof tb);
  printf("total: %s on %d rank%s\n", tb, n, n == 1 ? "" : "s");
}

static int run_show(const distctl_global *g, int argc, char **argv) {
  const distctl_command *cmd = &distctl_cmd_tensor_show;
  distctl_args a;
  dist_tensor *t = NULL;
  dist_tensor_piece *pieces = NULL;
  int n = 0;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int rc = 0;
  if (dist_tensor_open(c, a.word[0], &t) != 0 || dist_tensor_pieces(c, t, &pieces, &n) != 0) {
    rc = distctl_fail("tensor show %s: %s", a.word[0], dist_errmsg(c));
    goto out;
  }
  if (g->json) {
    uint64_t total;
    json_t *j = json_tensor(t);
    json_object_set_new(j, "pieces", json_pieces(pieces, n, &total));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)total));
    distctl_print_json(j);
  } else {
    print_show(t, pieces, n);
  }
out:
  free(pieces);
  dist_tensor_free(t);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_tensor_show = {
    .name = "tensor show",
    .words = {{"NAME", DISTCTL_REQUIRED}},
    .help = "a tensor's shape, dtype, mesh, placements and every rank's piece",
    .run = run_show,
    .options = distctl_no_options};

/* ---------------------------------------------------------------- tensors */

/* Total bytes over the tensor's ranks; -1 when a daemon cannot say. */
static int64_t tensor_bytes(dist_client *c, const dist_tensor *t) {
  dist_tensor_piece *p = NULL;
  int n = 0;
  if (dist_tensor_pieces(c, t, &p, &n) != 0) return -1;
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += (int64_t)p[i].nbytes;
  free(p);
  return total;
}

static void print_list(dist_client *c, dist_tensor **list, int n) {
  printf("%-24s %-9s %-16s %-20s %-28s %s\n", "NAME", "DTYPE", "SHAPE", "MESH",
         "PLACEMENTS", "BYTES");
  for (int i = 0; i < n; i++) {
    char shape[160], mesh[256], pl[256], bytes[32] = "?";
    dist_shape s = {dist_tensor_ndim(list[i]), {0}};
    memcpy(s.dims, dist_tensor_shape(list[i]), sizeof(int64_t) * (size_t)s.ndim);
    dist_shape_format(&s, shape, sizeof shape);
    dist_mesh_to_string(dist_tensor_mesh(list[i]), mesh, sizeof mesh);
    dist_placements_format(dist_tensor_placements(list[i]),
                           dist_mesh_ndim(dist_tensor_mesh(list[i])), pl, sizeof pl);
    int64_t b = tensor_bytes(c, list[i]);
    if (b >= 0) dist_format_bytes((uint64_t)b, bytes, sizeof bytes);
    printf("%-24s %-9s %-16s %-20s %-28s %s\n", dist_tensor_name(list[i]),
           dist_dtype_name(dist_tensor_dtype(list[i])), shape, mesh, pl, bytes);
  }
}

static int run_tensors(const distctl_global *g, int argc, char **argv) {
  if (distctl_take_options(&distctl_cmd_tensors, argc, argv, NULL) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  dist_tensor **list = NULL;
  int n = 0, rc = 0;
  if (dist_tensor_list(c, &list, &n) != 0) {
    rc = distctl_fail("tensors: %s", dist_errmsg(c));
  } else if (g->json) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
      json_t *j = json_tensor(list[i]);
      int64_t b = tensor_bytes(c, list[i]);
      json_object_set_new(j, "bytes", b >= 0 ? json_integer(b) : json_null());
      /* null: its daemons listed different versions */
      uint64_t v = dist_tensor_version(list[i]);
      json_object_set_new(j, "version", v ? json_integer((json_int_t)v) : json_null());
      json_array_append_new(a, j);
    }
    distctl_print_json(a);
  } else {
    print_list(c, list, n);
  }
  dist_tensor_list_free(list, n);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_tensors = {
    .name = "tensors",
    .help = "list the tensors held across the cluster",
    .run = run_tensors,
    .options = distctl_no_options};
