/* ProcessMesh: an n-d array of ranks with one name per dim. Building,
 * parsing and printing meshes, and the groups and sub-meshes collectives run
 * on. Placements and local boxes are in placement.c. */
#include "fileio.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mesh.h"
#include "utf8.h"

static int check_names(const char *const *names, int ndim, dist_errbuf *eb) {
  for (int d = 0; d < ndim; d++) {
    size_t n = strlen(names[d]);
    if (n == 0) return dist_fail(eb, DIST_EINVAL, "mesh: dim %d has an empty name", d);
    /* names go into checkpoint manifests, which are JSON (checked first:
     * the other messages print the name) */
    if (!dist_utf8_valid(names[d], n))
      return dist_fail(eb, DIST_EINVAL, "mesh: the name of dim %d is not valid UTF-8", d);
    if (n >= 32) return dist_fail(eb, DIST_EINVAL, "mesh: dim name '%s' is longer than 31 bytes", names[d]);
    for (int e = 0; e < d; e++)
      if (strcmp(names[d], names[e]) == 0)
        return dist_fail(eb, DIST_EINVAL, "mesh: dim name '%s' appears twice", names[d]);
  }
  return 0;
}

static int check_ranks(const int *ranks, int n, dist_errbuf *eb) {
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0) return dist_fail(eb, DIST_EINVAL, "mesh: rank %d is negative", ranks[i]);
    for (int j = 0; j < i; j++)
      if (ranks[i] == ranks[j])
        return dist_fail(eb, DIST_EINVAL, "mesh: rank %d appears twice", ranks[i]);
  }
  return 0;
}

int dist_mesh_init(dist_mesh_desc *m, int ndim, const int *shape,
                   const int *ranks, const char *const *dim_names,
                   dist_errbuf *eb) {
  if (ndim < 0 || ndim > DIST_MAX_MESH_DIMS)
    return dist_fail(eb, DIST_EINVAL, "mesh: %d dims (at most %d)", ndim, DIST_MAX_MESH_DIMS);
  long long n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] <= 0) return dist_fail(eb, DIST_EINVAL, "mesh: dim %d has size %d", d, shape[d]);
    n *= shape[d];
    if (n > DIST_MAX_MESH_RANKS)
      return dist_fail(eb, DIST_EINVAL, "mesh: more than %d ranks", DIST_MAX_MESH_RANKS);
  }
  int rc = check_ranks(ranks, (int)n, eb);
  if (!rc && dim_names) rc = check_names(dim_names, ndim, eb);
  if (rc) return rc;
  /* Build aside: the arguments may point into *m. */
  dist_mesh_desc t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.nranks = (int)n;
  for (int d = 0; d < ndim; d++) {
    t.shape[d] = shape[d];
    if (dim_names) snprintf(t.dim_names[d], sizeof t.dim_names[d], "%s", dim_names[d]);
    else snprintf(t.dim_names[d], sizeof t.dim_names[d], "d%d", d);
  }
  memcpy(t.ranks, ranks, sizeof(int) * (size_t)n);
  *m = t;
  return 0;
}

/* ---- parsing ----------------------------------------------------------- */

typedef struct mesh_parser {
  const char *p;
  int ndim;         /* depth of the leaves, once a leaf has been seen */
  int shape[DIST_MAX_MESH_DIMS];
  int seen[DIST_MAX_MESH_DIMS]; /* shape[d] is known */
  int nranks;
  int ranks[DIST_MAX_MESH_RANKS];
} mesh_parser;

static void skip_space(mesh_parser *mp) {
  while (*mp->p == ' ' || *mp->p == '\t' || *mp->p == '\n') mp->p++;
}

static int parse_rank(mesh_parser *mp, dist_errbuf *eb) {
  if (*mp->p < '0' || *mp->p > '9')
    return dist_fail(eb, DIST_EINVAL, "mesh: expected a rank or '[' at '%.16s'", mp->p);
  long v = 0;
  while (*mp->p >= '0' && *mp->p <= '9') {
    v = v * 10 + (*mp->p++ - '0');
    if (v > 1000000000) return dist_fail(eb, DIST_EINVAL, "mesh: rank too large");
  }
  if (mp->nranks == DIST_MAX_MESH_RANKS)
    return dist_fail(eb, DIST_EINVAL, "mesh: more than %d ranks", DIST_MAX_MESH_RANKS);
  mp->ranks[mp->nranks++] = (int)v;
  return 0;
}

/* Every leaf must sit at the same depth and every list at depth d must have
 * the same length: anything else is a ragged mesh. */
static int parse_list(mesh_parser *mp, int depth, dist_errbuf *eb) {
  if (depth >= DIST_MAX_MESH_DIMS)
    return dist_fail(eb, DIST_EINVAL, "mesh: nested deeper than %d dims", DIST_MAX_MESH_DIMS);
  mp->p++; /* '[' */
  int count = 0;
  for (;;) {
    skip_space(mp);
    if (*mp->p == ']' && count == 0)
      return dist_fail(eb, DIST_EINVAL, "mesh: empty list");
    int is_list = *mp->p == '[';
    int leaf_depth = is_list ? -1 : depth + 1;
    if (!is_list && mp->ndim && mp->ndim != leaf_depth)
      return dist_fail(eb, DIST_EINVAL, "mesh: ragged lists (a rank at depth %d, others at depth %d)",
                       leaf_depth, mp->ndim);
    if (is_list && mp->ndim && mp->ndim <= depth + 1)
      return dist_fail(eb, DIST_EINVAL, "mesh: ragged lists (a list where a rank was expected)");
    if (!is_list) mp->ndim = leaf_depth;
    int rc = is_list ? parse_list(mp, depth + 1, eb) : parse_rank(mp, eb);
    if (rc) return rc;
    count++;
    skip_space(mp);
    if (*mp->p == ',') {
      mp->p++;
      continue;
    }
    if (*mp->p != ']')
      return dist_fail(eb, DIST_EINVAL, "mesh: expected ',' or ']' at '%.16s'", mp->p);
    mp->p++;
    break;
  }
  if (mp->seen[depth] && mp->shape[depth] != count)
    return dist_fail(eb, DIST_EINVAL, "mesh: ragged lists (%d and %d elements at depth %d)",
                     mp->shape[depth], count, depth);
  mp->seen[depth] = 1;
  mp->shape[depth] = count;
  return 0;
}

/* Splits "dp, mp" into trimmed names, in place in buf (empty names are
 * kept so that init reports them). Returns the count or -1. */
static int split_names(char *buf, const char **names, dist_errbuf *eb) {
  int n = 0;
  for (char *tok = buf; tok; n++) {
    char *comma = strchr(tok, ',');
    if (comma) *comma = 0;
    while (*tok == ' ') tok++;
    char *end = tok + strlen(tok);
    while (end > tok && end[-1] == ' ') *--end = 0;
    if (n == DIST_MAX_MESH_DIMS) {
      dist_fail(eb, DIST_EINVAL, "mesh: more than %d dim names", DIST_MAX_MESH_DIMS);
      return -1;
    }
    names[n] = tok;
    tok = comma ? comma + 1 : NULL;
  }
  return n;
}

int dist_mesh_of_rank(dist_mesh_desc *m, int rank, dist_errbuf *eb) {
  int one = 1;
  return dist_mesh_init(m, 1, &one, &rank, NULL, eb);
}

int dist_mesh_parse(dist_mesh_desc *m, const char *text, const char *names,
                    dist_errbuf *eb) {
  mesh_parser mp = {.p = text};
  skip_space(&mp);
  if (*mp.p != '[') return dist_fail(eb, DIST_EINVAL, "mesh: '%s' is not a list of ranks", text);
  int rc = parse_list(&mp, 0, eb);
  if (rc) return rc;
  skip_space(&mp);
  if (*mp.p) return dist_fail(eb, DIST_EINVAL, "mesh: trailing text '%.16s'", mp.p);
  /* An empty names string (an unset flag) means the default names. */
  if (!names || !*names) return dist_mesh_init(m, mp.ndim, mp.shape, mp.ranks, NULL, eb);
  char buf[DIST_MAX_MESH_DIMS * 40];
  const char *list[DIST_MAX_MESH_DIMS];
  if (strlen(names) >= sizeof buf) return dist_fail(eb, DIST_EINVAL, "mesh: dim names too long");
  memcpy(buf, names, strlen(names) + 1);
  int n = split_names(buf, list, eb);
  if (n < 0) return DIST_EINVAL;
  if (n != mp.ndim)
    return dist_fail(eb, DIST_EINVAL, "mesh: %d dim names given for a %d-d mesh", n, mp.ndim);
  return dist_mesh_init(m, mp.ndim, mp.shape, mp.ranks, list, eb);
}

/* ---- printing and comparing -------------------------------------------- */

static size_t format_level(const dist_mesh_desc *m, int depth, int *next,
                           char *buf, size_t len, size_t pos) {
  if (depth == m->ndim) return dist_appendf(buf, len, pos, "%d", m->ranks[(*next)++]);
  pos = dist_appendf(buf, len, pos, "[");
  for (int i = 0; i < m->shape[depth]; i++) {
    if (i) pos = dist_appendf(buf, len, pos, ", ");
    pos = format_level(m, depth + 1, next, buf, len, pos);
  }
  return dist_appendf(buf, len, pos, "]");
}

void dist_mesh_format(const dist_mesh_desc *m, char *buf, size_t len) {
  if (len == 0) return;
  buf[0] = 0;
  int next = 0;
  format_level(m, 0, &next, buf, len, 0);
}

int dist_mesh_same_shape(const dist_mesh_desc *a, const dist_mesh_desc *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

int dist_mesh_equal(const dist_mesh_desc *a, const dist_mesh_desc *b) {
  if (!dist_mesh_same_shape(a, b) || a->nranks != b->nranks) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (strcmp(a->dim_names[d], b->dim_names[d]) != 0) return 0;
  return memcmp(a->ranks, b->ranks, sizeof(int) * (size_t)a->nranks) == 0;
}

/* ---- indexing ---------------------------------------------------------- */

int dist_mesh_index_of(const dist_mesh_desc *m, int rank) {
  for (int i = 0; i < m->nranks; i++)
    if (m->ranks[i] == rank) return i;
  return -1;
}

int dist_ranks_union_add(int *ranks, int n, int max, const dist_mesh_desc *m) {
  for (int i = 0; i < m->nranks && n < max; i++) {
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = ranks[j] == m->ranks[i];
    if (!seen) ranks[n++] = m->ranks[i];
  }
  return n;
}

void dist_mesh_coords(const dist_mesh_desc *m, int idx, int *coords) {
  for (int d = m->ndim - 1; d >= 0; d--) {
    coords[d] = idx % m->shape[d];
    idx /= m->shape[d];
  }
}

static int flat_index(const dist_mesh_desc *m, const int *coords) {
  int idx = 0;
  for (int d = 0; d < m->ndim; d++) idx = idx * m->shape[d] + coords[d];
  return idx;
}

int dist_mesh_group(const dist_mesh_desc *m, int rank, int dim, int *group) {
  if (dim < 0 || dim >= m->ndim) return -1;
  return dist_mesh_group_dims(m, rank, 1u << dim, group);
}

int dist_mesh_group_dims(const dist_mesh_desc *m, int rank, unsigned dims_mask,
                         int *group) {
  int idx = dist_mesh_index_of(m, rank);
  if (idx < 0) return -1;
  int coords[DIST_MAX_MESH_DIMS], n = 0;
  dist_mesh_coords(m, idx, coords);
  for (int d = 0; d < m->ndim; d++)
    if (dims_mask & (1u << d)) coords[d] = 0;
  for (;;) { /* an odometer over the masked dims, last dim fastest */
    group[n++] = m->ranks[flat_index(m, coords)];
    int d = m->ndim - 1;
    for (; d >= 0; d--) {
      if (!(dims_mask & (1u << d))) continue;
      if (++coords[d] < m->shape[d]) break;
      coords[d] = 0;
    }
    if (d < 0) return n;
  }
}

int dist_mesh_submesh(const dist_mesh_desc *m, const char *name, int index,
                      dist_mesh_desc *out, dist_errbuf *eb) {
  int dim = -1;
  for (int d = 0; d < m->ndim; d++)
    if (strcmp(m->dim_names[d], name) == 0) dim = d;
  if (dim < 0) return dist_fail(eb, DIST_ENOTFOUND, "mesh: no dim named '%s'", name);
  if (index < 0 || index >= m->shape[dim])
    return dist_fail(eb, DIST_EINVAL, "mesh: index %d out of range for dim '%s' of size %d",
                     index, name, m->shape[dim]);
  /* Copy everything out of m first: out may be m itself. */
  int shape[DIST_MAX_MESH_DIMS], ranks[DIST_MAX_MESH_RANKS], n = 0;
  char name_buf[DIST_MAX_MESH_DIMS][32];
  const char *names[DIST_MAX_MESH_DIMS];
  for (int d = 0, k = 0; d < m->ndim; d++)
    if (d != dim) {
      shape[k] = m->shape[d];
      memcpy(name_buf[k], m->dim_names[d], sizeof name_buf[k]);
      names[k] = name_buf[k];
      k++;
    }
  int coords[DIST_MAX_MESH_DIMS];
  for (int i = 0; i < m->nranks; i++) {
    dist_mesh_coords(m, i, coords);
    if (coords[dim] == index) ranks[n++] = m->ranks[i];
  }
  /* Dropping the only dim of a 1-d mesh leaves a 0-d mesh of one rank. */
  return dist_mesh_init(out, m->ndim - 1, shape, ranks, names, eb);
}
