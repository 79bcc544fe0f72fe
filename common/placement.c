/* Placements (Shard / Replicate / Partial), the ceil(N/k) split rule and the
 * box of the global tensor each rank holds. */
#include "fileio.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mesh.h"

static const char *const reduce_names[] = {
    [DIST_REDUCE_SUM] = "sum", [DIST_REDUCE_MAX] = "max",
    [DIST_REDUCE_MIN] = "min", [DIST_REDUCE_PROD] = "prod",
    [DIST_REDUCE_AVG] = "avg", [DIST_REDUCE_ANY] = "any",
    [DIST_REDUCE_ALL] = "all",
};
#define REDUCE_COUNT ((int)(sizeof reduce_names / sizeof reduce_names[0]))

const char *dist_reduce_name(dist_reduce r) {
  return (int)r >= 0 && (int)r < REDUCE_COUNT ? reduce_names[r] : "invalid";
}

int dist_reduce_parse(const char *name, dist_reduce *out) {
  for (int i = 0; i < REDUCE_COUNT; i++)
    if (strcmp(name, reduce_names[i]) == 0) {
      *out = (dist_reduce)i;
      return 0;
    }
  return DIST_EINVAL;
}

/* ---- the split rule ---------------------------------------------------- */

/* Chunks are ceil(n/k) long; the trailing ones are short or empty. */
int64_t dist_split_start(int64_t n, int k, int i) {
  if (k <= 0 || i < 0 || n <= 0) return 0;
  int64_t chunk = (n + k - 1) / k;
  int64_t start = chunk * i;
  return start < n ? start : n;
}

int64_t dist_split_size(int64_t n, int k, int i) {
  if (k <= 0 || i < 0 || i >= k || n <= 0) return 0;
  int64_t chunk = (n + k - 1) / k;
  int64_t start = dist_split_start(n, k, i);
  return n - start < chunk ? n - start : chunk;
}

void dist_local_box(const dist_mesh_desc *m, const dist_placement *p,
                    const dist_shape *global, const int *coords,
                    dist_shape *local, int64_t *offset) {
  *local = *global;
  for (int d = 0; d < global->ndim; d++) offset[d] = 0;
  /* Mesh dims in order: each Shard(d) splits what the earlier ones left of
   * tensor dim d, so several mesh dims on one tensor dim nest. */
  for (int md = 0; md < m->ndim; md++) {
    if (p[md].kind != DIST_SHARD) continue;
    int d = p[md].dim;
    if (d < 0 || d >= global->ndim) continue; /* dist_placements_check's job */
    int64_t n = local->dims[d];
    offset[d] += dist_split_start(n, m->shape[md], coords[md]);
    local->dims[d] = dist_split_size(n, m->shape[md], coords[md]);
  }
}

/* ---- dtensor_from_local ------------------------------------------------- */

void dist_global_of_pieces(const dist_mesh_desc *m, const dist_placement *p,
                           const dist_shape *pieces, dist_shape *global) {
  *global = pieces[0];
  for (int d = 0; d < global->ndim; d++) {
    int64_t sum = 0;
    int sharded = 0;
    for (int i = 0; i < m->nranks; i++) {
      int coords[DIST_MAX_MESH_DIMS], on_axis = 1;
      dist_mesh_coords(m, i, coords);
      for (int md = 0; md < m->ndim; md++) {
        int shards_d = p[md].kind == DIST_SHARD && p[md].dim == d;
        sharded |= shards_d;
        if (!shards_d && coords[md] != 0) on_axis = 0;
      }
      if (on_axis && d < pieces[i].ndim) sum += pieces[i].dims[d];
    }
    if (sharded) global->dims[d] = sum;
  }
}

int dist_first_misfit(const dist_mesh_desc *m, const dist_placement *p,
                      const dist_shape *global, const dist_shape *pieces,
                      dist_shape *want) {
  for (int i = 0; i < m->nranks; i++) {
    int coords[DIST_MAX_MESH_DIMS];
    int64_t offset[DIST_MAX_DIMS];
    dist_mesh_coords(m, i, coords);
    dist_local_box(m, p, global, coords, want, offset);
    if (!dist_shape_equal(want, &pieces[i])) return i;
  }
  return -1;
}

/* ---- checking ---------------------------------------------------------- */

int dist_placements_check(const dist_mesh_desc *m, const dist_placement *p,
                          int np, int tensor_ndim, dist_errbuf *eb) {
  if (np != m->ndim)
    return dist_fail(eb, DIST_EINVAL, "placements: %d given, mesh has %d dims", np, m->ndim);
  for (int i = 0; i < np; i++) {
    switch (p[i].kind) {
      case DIST_REPLICATE: break;
      case DIST_SHARD:
        if (p[i].dim < 0 || p[i].dim >= tensor_ndim)
          return dist_fail(eb, DIST_EINVAL, "Shard(%d): tensor has %d dims", p[i].dim, tensor_ndim);
        break;
      case DIST_PARTIAL:
        if ((int)p[i].reduce < 0 || (int)p[i].reduce >= REDUCE_COUNT)
          return dist_fail(eb, DIST_EINVAL, "placement %d: Partial with unknown reduce %d", i,
                           (int)p[i].reduce);
        break;
      default:
        return dist_fail(eb, DIST_EINVAL, "placement %d: unknown kind %d", i, (int)p[i].kind);
    }
  }
  return 0;
}

int dist_placements_partial_dim(const dist_placement *p, int np) {
  for (int i = 0; i < np; i++)
    if (p[i].kind == DIST_PARTIAL) return i;
  return -1;
}

/* ---- parsing ----------------------------------------------------------- */

static void skip_space(const char **s) {
  while (**s == ' ' || **s == '\t') (*s)++;
}

/* Copies an identifier ([A-Za-z_][A-Za-z0-9_]*, possibly empty). */
static void read_word(const char **s, char *out, size_t len) {
  size_t n = 0;
  skip_space(s);
  while ((**s >= 'a' && **s <= 'z') || (**s >= 'A' && **s <= 'Z') || **s == '_' ||
         (n > 0 && **s >= '0' && **s <= '9')) {
    if (n + 1 < len) out[n++] = **s;
    (*s)++;
  }
  out[n] = 0;
  skip_space(s);
}

/* Skips "key =" when present (Paddle prints Shard(dim=0)). */
static void skip_keyword(const char **s, const char *key) {
  const char *t = *s;
  char word[32];
  read_word(&t, word, sizeof word);
  if (strcmp(word, key) == 0 && *t == '=') {
    t++;
    skip_space(&t);
    *s = t;
  }
}

static int parse_shard(const char **s, dist_placement *p, dist_errbuf *eb) {
  skip_keyword(s, "dim");
  if (**s < '0' || **s > '9')
    return dist_fail(eb, DIST_EINVAL, "placements: Shard needs a non-negative dim at '%.16s'", *s);
  int v = 0;
  while (**s >= '0' && **s <= '9') {
    v = v * 10 + (*(*s)++ - '0');
    if (v > DIST_MAX_DIMS * 1000) return dist_fail(eb, DIST_EINVAL, "placements: Shard dim too large");
  }
  *p = DIST_SHARD_DIM(v);
  return 0;
}

static int parse_partial(const char **s, dist_placement *p, dist_errbuf *eb) {
  char word[32];
  skip_keyword(s, "reduce_type");
  read_word(s, word, sizeof word);
  dist_reduce r = DIST_REDUCE_SUM;
  if (word[0] && dist_reduce_parse(word, &r) != 0)
    return dist_fail(eb, DIST_EINVAL,
                     "placements: Partial(%s): unknown reduce (sum, max, min, prod, avg, any, all)", word);
  *p = DIST_PARTIAL_OF(r);
  return 0;
}

/* One "Name(args)" item. */
static int parse_item(const char **s, dist_placement *p, dist_errbuf *eb) {
  char name[32];
  int rc = 0;
  read_word(s, name, sizeof name);
  if (**s != '(')
    return dist_fail(eb, DIST_EINVAL, "placements: expected Shard(d), Replicate() or Partial(r) at '%.16s'",
                     *s);
  (*s)++;
  skip_space(s);
  if (strcmp(name, "Shard") == 0) rc = parse_shard(s, p, eb);
  else if (strcmp(name, "Partial") == 0) rc = parse_partial(s, p, eb);
  else if (strcmp(name, "Replicate") == 0) *p = DIST_REPLICATED;
  else return dist_fail(eb, DIST_EINVAL, "placements: unknown placement '%s'", name);
  if (rc) return rc;
  skip_space(s);
  if (**s != ')') return dist_fail(eb, DIST_EINVAL, "placements: %s: expected ')' at '%.16s'", name, *s);
  (*s)++;
  skip_space(s);
  return 0;
}

int dist_placements_parse(const char *text, dist_placement *p, int max,
                          int *np, dist_errbuf *eb) {
  const char *s = text;
  int n = 0;
  skip_space(&s);
  int bracket = *s == '[';
  if (bracket) s++;
  skip_space(&s);
  while (*s && *s != ']') {
    if (n == max) return dist_fail(eb, DIST_EINVAL, "placements: more than %d given", max);
    int rc = parse_item(&s, &p[n], eb);
    if (rc) return rc;
    n++;
    if (*s != ',') break;
    s++;
    skip_space(&s);
  }
  if (bracket && *s++ != ']') return dist_fail(eb, DIST_EINVAL, "placements: missing ']'");
  skip_space(&s);
  if (*s) return dist_fail(eb, DIST_EINVAL, "placements: unexpected '%.16s'", s);
  *np = n;
  return 0;
}

/* ---- printing ---------------------------------------------------------- */

void dist_placements_text(const dist_placement *p, int np, char *buf,
                          size_t len) {
  if (len == 0) return;
  size_t pos = dist_appendf(buf, len, 0, "[");
  for (int i = 0; i < np; i++) {
    const char *sep = i ? ", " : "";
    if (p[i].kind == DIST_SHARD) pos = dist_appendf(buf, len, pos, "%sShard(%d)", sep, p[i].dim);
    else if (p[i].kind == DIST_REPLICATE) pos = dist_appendf(buf, len, pos, "%sReplicate()", sep);
    else if (p[i].kind == DIST_PARTIAL)
      pos = dist_appendf(buf, len, pos, "%sPartial(%s)", sep, dist_reduce_name(p[i].reduce));
    else pos = dist_appendf(buf, len, pos, "%sInvalid(%d)", sep, (int)p[i].kind);
  }
  dist_appendf(buf, len, pos, "]");
}
