/* The public ProcessMesh and placement helpers, over common/mesh.c. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

int dist_mesh_new(int ndim, const int *shape, const int *ranks,
                  const char *const *dim_names, dist_mesh **out) {
  dist_mesh *m = calloc(1, sizeof *m);
  int rc = dist_mesh_init(&m->d, ndim, shape, ranks, dim_names, NULL);
  if (rc != 0) {
    free(m);
    m = NULL;
  }
  *out = m;
  return rc;
}

int dist_mesh_from_string(const char *text, const char *dim_names,
                          dist_mesh **out) {
  dist_mesh *m = calloc(1, sizeof *m);
  int rc = dist_mesh_parse(&m->d, text, dim_names, NULL);
  if (rc != 0) {
    free(m);
    m = NULL;
  }
  *out = m;
  return rc;
}

void dist_mesh_free(dist_mesh *m) { free(m); }
int dist_mesh_ndim(const dist_mesh *m) { return m->d.ndim; }
int dist_mesh_dim_size(const dist_mesh *m, int dim) {
  return dim >= 0 && dim < m->d.ndim ? m->d.shape[dim] : 0;
}
int dist_mesh_size(const dist_mesh *m) { return m->d.nranks; }
int dist_mesh_rank_at(const dist_mesh *m, int index) {
  return index >= 0 && index < m->d.nranks ? m->d.ranks[index] : -1;
}
const char *dist_mesh_dim_name(const dist_mesh *m, int dim) {
  return dim >= 0 && dim < m->d.ndim ? m->d.dim_names[dim] : NULL;
}

int dist_mesh_get_submesh(const dist_mesh *m, const char *dim_name, int index,
                          dist_mesh **out) {
  dist_mesh *s = calloc(1, sizeof *s);
  int rc = dist_mesh_submesh(&m->d, dim_name, index, &s->d, NULL);
  if (rc != 0) {
    free(s);
    s = NULL;
  }
  *out = s;
  return rc;
}

void dist_mesh_to_string(const dist_mesh *m, char *buf, size_t len) {
  dist_mesh_format(&m->d, buf, len);
}

int dist_parse_placements(const char *text, dist_placement *out, int max) {
  int n = 0;
  int rc = dist_placements_parse(text, out, max, &n, NULL);
  return rc != 0 ? rc : n;
}
