/* dist_shard_layer, Paddle's shard_layer: shard_fn over every sublayer,
 * every placement checked before anything is stored, then each parameter
 * and buffer stored in the daemons as "<root>.<path>" and the custom
 * programs registered. A failure part-way removes what was stored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_internal.h"

/* Runs shard_fn on l and its subtree, depth first, parents before
 * children. */
static int run_shard_fn(dist_client *c, dist_layer *l, const char *path,
                        const dist_mesh *mesh, dist_layer_shard_fn fn,
                        void *user) {
  int rc = fn(path, l, mesh, user);
  const dist_layer *root = l;
  while (root->parent) root = root->parent;
  if (rc && root->place_err.code) /* it passed on a dist_layer_place_param error */
    return dist_client_fail(c, root->place_err.code, "%s",
                            dist_errbuf_msg(&root->place_err));
  if (rc)
    return dist_client_fail(c, rc < 0 ? rc : DIST_EINVAL, "shard_fn failed for "
                            "'%s' (%d)", path, rc);
  for (int i = 0; i < l->n_children; i++) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "",
             l->children[i]->child_name);
    if ((rc = run_shard_fn(c, l->children[i], sub, mesh, fn, user))) return rc;
  }
  return 0;
}

static void clear_placements(dist_layer *l) {
  for (int i = 0; i < l->n_params; i++) l->params[i].nplacements = 0;
  for (int i = 0; i < l->n_children; i++) clear_placements(l->children[i]);
}

/* A parameter's placements: what shard_fn gave (checked) or Replicate. */
static int check_param(const layer_param *p, const char *full,
                       const dist_mesh *mesh, dist_errbuf *eb) {
  int nd = mesh->d.ndim;
  if (p->nplacements == 0) return 0;
  if (p->nplacements != nd)
    return dist_fail(eb, DIST_EINVAL, "shard_fn gave %s %d placements, but the "
                     "mesh has %d dims", full, p->nplacements, nd);
  for (int m = 0; m < nd; m++) {
    const dist_placement *q = &p->placements[m];
    char s[96];
    dist_shape_format(&p->shape, s, sizeof s);
    if (q->kind == DIST_SHARD && (q->dim < 0 || q->dim >= p->shape.ndim))
      return dist_fail(eb, DIST_EINVAL, "shard_fn placed %s on Shard(%d) (mesh "
                       "dim %d), but %s has %d dim%s %s: no dim %d", full, q->dim,
                       m, full, p->shape.ndim, p->shape.ndim == 1 ? "" : "s", s,
                       q->dim);
    if (q->kind != DIST_SHARD && q->kind != DIST_REPLICATE)
      return dist_fail(eb, DIST_EINVAL, "shard_fn placed %s on mesh dim %d as "
                       "%s: a parameter is Shard or Replicate", full, m,
                       q->kind == DIST_PARTIAL ? "Partial" : "an unknown kind");
  }
  return 0;
}

static int check_tree(dist_client *c, const dist_layer *l, const char *path,
                      const dist_mesh *mesh, size_t prefix_len) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  for (int i = 0; i < l->n_params; i++) {
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", path, path[0] ? "." : "",
             l->params[i].name);
    if (prefix_len + 1 + strlen(full) + 5 >= sizeof l->params[i].tensor->name)
      return dist_client_fail(c, DIST_EINVAL, "stored name of %s is too long", full);
    if (check_param(&l->params[i], full, mesh, &eb))
      return dist_client_fail(c, eb.code, "%s", dist_errbuf_msg(&eb));
  }
  if (dist_layer_check_builtin(l, path, mesh, &eb))
    return dist_client_fail(c, eb.code, "%s", dist_errbuf_msg(&eb));
  for (int i = 0; i < l->n_children; i++) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "",
             l->children[i]->child_name);
    int rc = check_tree(c, l->children[i], sub, mesh, prefix_len);
    if (rc) return rc;
  }
  return 0;
}

/* The mesh must name daemons the client reaches, and an SPMD trainer's
 * own. */
static int check_mesh(dist_client *c, const dist_mesh *mesh) {
  char ms[256], what[270];
  dist_mesh_to_string(mesh, ms, sizeof ms);
  snprintf(what, sizeof what, "mesh %s", ms);
  for (int i = 0; i < mesh->d.nranks; i++)
    if (!dist_client_reaches(c, mesh->d.ranks[i]))
      return dist_refuse_unreached(c, what, mesh->d.ranks[i], "mesh %s names rank %d, but the "
                                   "cluster has %d daemon%s (ranks 0..%d)", ms,
                                   mesh->d.ranks[i], c->n, c->n == 1 ? "" : "s", c->n - 1);
  if (c->spmd_rank >= 0 && dist_mesh_index_of(&mesh->d, c->spmd_rank) < 0)
    return dist_client_fail(c, DIST_EINVAL, "mesh %s does not include this "
                            "trainer's rank %d", ms, c->spmd_rank);
  return 0;
}

/* Stores every parameter and buffer of the tree; registers programs. */
static int store_tree(dist_client *c, dist_layer *l, const char *prefix,
                      const char *path, const dist_mesh *mesh) {
  for (int i = 0; i < l->n_params; i++) {
    layer_param *p = &l->params[i];
    char name[256];
    dist_placement pl[DIST_MAX_MESH_DIMS];
    for (int m = 0; m < mesh->d.ndim; m++)
      pl[m] = p->nplacements ? p->placements[m] : DIST_REPLICATED;
    snprintf(name, sizeof name, "%s.%s%s%s", prefix, path, path[0] ? "." : "",
             p->name);
    int rc = dist_shard_tensor(c, name, p->init, DIST_FLOAT32, p->shape.ndim,
                               p->shape.dims, mesh, pl, &p->tensor);
    if (rc) {
      dist_errbuf_prefix(&c->err, "storing %s: ", name);
      return rc;
    }
  }
  if (l->program && dist_program_register(c, l->program)) {
    dist_errbuf_prefix(&c->err, "registering the program of '%s': ",
                       path[0] ? path : prefix);
    return c->err.code;
  }
  for (int i = 0; i < l->n_children; i++) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "",
             l->children[i]->child_name);
    int rc = store_tree(c, l->children[i], prefix, sub, mesh);
    if (rc) return rc;
  }
  return 0;
}

/* Undoes store_tree as far as it went. */
static void unstore_tree(dist_client *c, dist_layer *l) {
  dist_errbuf keep = c->err;
  for (int i = 0; i < l->n_params; i++) {
    if (!l->params[i].tensor) continue;
    dist_tensor_delete(c, l->params[i].tensor->name);
    dist_tensor_free(l->params[i].tensor);
    l->params[i].tensor = NULL;
  }
  if (l->program) dist_program_unregister(c, l->program);
  for (int i = 0; i < l->n_children; i++) unstore_tree(c, l->children[i]);
  c->err = keep;
}

static void mark_sharded(dist_layer *l) {
  l->sharded = 1;
  for (int i = 0; i < l->n_children; i++) mark_sharded(l->children[i]);
}

int dist_shard_layer(dist_client *c, dist_layer *l, const dist_mesh *mesh,
                     dist_layer_shard_fn shard_fn, dist_layer_io_fn input_fn,
                     dist_layer_io_fn output_fn, void *user) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  if (!l || !mesh)
    return dist_client_fail(c, DIST_EINVAL, "dist_shard_layer needs a layer "
                            "and a mesh");
  if (l->parent)
    return dist_client_fail(c, DIST_EINVAL, "layer '%s' is a sublayer: shard "
                            "its root", l->child_name);
  if (l->sharded)
    return dist_client_fail(c, DIST_EINVAL, "layer '%s' is sharded already",
                            l->name);
  if (check_mesh(c, mesh)) return c->err.code;
  clear_placements(l);
  l->place_err = (dist_errbuf)DIST_ERRBUF_INIT;
  if (shard_fn && run_shard_fn(c, l, "", mesh, shard_fn, user))
    return c->err.code;
  if (l->place_err.code)
    return dist_client_fail(c, l->place_err.code, "%s",
                            dist_errbuf_msg(&l->place_err));
  if (check_tree(c, l, "", mesh, strlen(l->name))) return c->err.code;
  int rc = store_tree(c, l, l->name, "", mesh);
  if (rc) {
    unstore_tree(c, l);
    return rc;
  }
  l->mesh = *mesh;
  l->input_fn = input_fn;
  l->output_fn = output_fn;
  l->user = user;
  mark_sharded(l);
  return 0;
}
