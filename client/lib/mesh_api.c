/* The public ProcessMesh and placement helpers, over common/mesh.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* The mesh constructors have no client to keep a message in: the last
 * failure's is kept per thread, as connect's is. */
static __thread char mesh_error[512];

const char *dist_last_mesh_error(void) { return mesh_error; }

/* DIST_EINVAL kept as the thread's mesh error, "FUNC: ARG is NULL", and
 * as dist_errmsg(NULL), where every other call given a NULL handle says so. */
static int mesh_null_arg(const char *func, const char *arg) {
  int rc = dist_null_handle(func, arg);
  snprintf(mesh_error, sizeof mesh_error, "%s", dist_errmsg(NULL));
  return rc;
}

/* Hands out m when rc is 0, else frees it and keeps eb's message. */
static int mesh_result(int rc, const dist_errbuf *eb, dist_mesh *m,
                       dist_mesh **out) {
  if (rc != 0) {
    snprintf(mesh_error, sizeof mesh_error, "%s", dist_errbuf_msg(eb));
    free(m);
    m = NULL;
  }
  *out = m;
  return rc;
}

int dist_mesh_new(int ndim, const int *shape, const int *ranks,
                  const char *const *dim_names, dist_mesh **out) {
  if (!out) return mesh_null_arg(__func__, "out");
  if (!shape) return mesh_null_arg(__func__, "shape");
  if (!ranks) return mesh_null_arg(__func__, "ranks");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_mesh *m = calloc(1, sizeof *m);
  int rc = 0;
  /* dist_mesh_init takes 0 dims for the sub-mesh of a 1-d mesh, but the
   * daemons take meshes of 1 dim or more: one made here could not be used. */
  if (ndim < 1)
    rc = dist_fail(&eb, DIST_EINVAL, "mesh: %d dims (1 to %d allowed)", ndim,
                   DIST_MAX_MESH_DIMS);
  else if (!m)
    rc = dist_fail(&eb, DIST_ENOMEM, "out of memory");
  else
    rc = dist_mesh_init(&m->d, ndim, shape, ranks, dim_names, &eb);
  return mesh_result(rc, &eb, m, out);
}

int dist_mesh_from_string(const char *text, const char *dim_names,
                          dist_mesh **out) {
  if (!out) return mesh_null_arg(__func__, "out");
  if (!text) return mesh_null_arg(__func__, "text");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_mesh *m = calloc(1, sizeof *m);
  int rc = m ? dist_mesh_parse(&m->d, text, dim_names, &eb)
             : dist_fail(&eb, DIST_ENOMEM, "out of memory");
  return mesh_result(rc, &eb, m, out);
}

void dist_mesh_free(dist_mesh *m) { free(m); }
/* The accessors given no mesh return -1 (NULL for a name), which no mesh
 * gives, and say why in dist_errmsg(NULL). */
int dist_mesh_ndim(const dist_mesh *m) {
  if (!m) return mesh_null_arg(__func__, "m"), -1;
  return m->d.ndim;
}
int dist_mesh_dim_size(const dist_mesh *m, int dim) {
  if (!m) return mesh_null_arg(__func__, "m"), -1;
  return dim >= 0 && dim < m->d.ndim ? m->d.shape[dim] : 0;
}
int dist_mesh_size(const dist_mesh *m) {
  if (!m) return mesh_null_arg(__func__, "m"), -1;
  return m->d.nranks;
}
int dist_mesh_rank_at(const dist_mesh *m, int index) {
  if (!m) return mesh_null_arg(__func__, "m"), -1;
  return index >= 0 && index < m->d.nranks ? m->d.ranks[index] : -1;
}
const char *dist_mesh_dim_name(const dist_mesh *m, int dim) {
  if (!m) return mesh_null_arg(__func__, "m"), NULL;
  return dim >= 0 && dim < m->d.ndim ? m->d.dim_names[dim] : NULL;
}

int dist_mesh_get_submesh(const dist_mesh *m, const char *dim_name, int index,
                          dist_mesh **out) {
  if (!out) return mesh_null_arg(__func__, "out");
  if (!m) return mesh_null_arg(__func__, "m");
  if (!dim_name) return mesh_null_arg(__func__, "dim_name");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_mesh *s = calloc(1, sizeof *s);
  int rc = s ? dist_mesh_submesh(&m->d, dim_name, index, &s->d, &eb)
             : dist_fail(&eb, DIST_ENOMEM, "out of memory");
  return mesh_result(rc, &eb, s, out);
}

void dist_mesh_to_string(const dist_mesh *m, char *buf, size_t len) {
  if (!buf || !len) return; /* nowhere to write */
  buf[0] = '\0';
  if (!m) {
    mesh_null_arg(__func__, "m");
    return;
  }
  dist_mesh_format(&m->d, buf, len);
}

int dist_parse_placements(const char *text, dist_placement *out, int max) {
  if (!text) return mesh_null_arg(__func__, "text");
  if (!out) return mesh_null_arg(__func__, "out");
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_placements_parse(text, out, max, &n, &eb);
  if (rc != 0) snprintf(mesh_error, sizeof mesh_error, "%s", dist_errbuf_msg(&eb));
  return rc != 0 ? rc : n;
}

void dist_placements_format(const dist_placement *p, int n, char *buf, size_t len) {
  if (!buf || !len) return; /* nowhere to write */
  buf[0] = '\0';
  if (!p && n > 0) {
    mesh_null_arg(__func__, "p");
    return;
  }
  dist_placements_text(p, n, buf, len);
}
